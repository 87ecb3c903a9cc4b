"""What a command could not do is an error line, not a traceback: `OutputErrors` wraps a click
command's `invoke` so that output that cannot be written (stdout on a full disk, a vanished
terminal) and any of the package's own errors (`ShockslurmError`: an output file that could not
be written, a store that cannot be used, ...) that a command did not turn into its own message
end as `Error: ...` with exit 1. Click itself already ends quietly on a closed pipe (`| head`)."""

from __future__ import annotations

import errno
from typing import Any

import click

from ..errors import ShockslurmError

# what a write to stdout or stderr fails with when the file behind it cannot take more
OUTPUT_ERRNOS = frozenset({errno.ENOSPC, errno.EIO, errno.EFBIG, errno.EDQUOT})


class OutputErrors:
    """Mixin for a click command or group (first among the bases)."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)  # type: ignore[misc]
        except ShockslurmError as exc:
            raise click.ClickException(str(exc)) from None
        except OSError as exc:
            if exc.filename is None and exc.errno in OUTPUT_ERRNOS:
                raise click.ClickException(f"cannot write the output: {exc.strerror}") from None
            raise


class OutputCommand(OutputErrors, click.Command):
    """A click command whose failed output is an error line."""

"""What a command could not do is an error line, not a traceback: `OutputErrors` wraps a click
command's `invoke` so that output that cannot be written (stdout on a full disk, a vanished
terminal) and any of the package's own errors (`ShockslurmError`: an output file that could not
be written, a store that cannot be used, ...) that a command did not turn into its own message
end as `Error: ...` with exit 1, and so does a database error met in a damaged store or one
whose tables were changed by hand (naming the store; the traceback at --log-level DEBUG). Click itself already ends quietly on a closed pipe (`| head`)."""

from __future__ import annotations

import errno
import logging
import sys
from typing import Any

import click

from ..errors import ShockslurmError

# what a write to stdout or stderr fails with when the file behind it cannot take more
OUTPUT_ERRNOS = frozenset({errno.ENOSPC, errno.EIO, errno.EFBIG, errno.EDQUOT})

log = logging.getLogger(__name__)


def _store_failure(exc: Exception) -> str | None:
    """The message for a database error (a damaged store, a table missing), else None. Only
    when SQLAlchemy is imported: a command that never opened a store does not import it."""
    sa_exc = sys.modules.get("sqlalchemy.exc")
    if sa_exc is None or not isinstance(exc, sa_exc.SQLAlchemyError):
        return None
    from ..store.database import store_failure
    log.debug("the store failed", exc_info=exc)
    return store_failure(exc)


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
        except Exception as exc:
            message = _store_failure(exc)
            if message is None:
                raise
            raise click.ClickException(message) from None


class OutputCommand(OutputErrors, click.Command):
    """A click command whose failed output is an error line."""

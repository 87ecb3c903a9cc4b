"""Output options (`--json FILE`, `--out FILE`, `--plot DIR`, ...) checked when the command line
is read, before any work: a place the command could not write stops it at once with an error
naming the option, instead of a traceback after a long run. The path a command receives is a
`NamedPath` that remembers its option, so a later failure to write it (disk full, a file size
limit, a race with this check) names the option too; outputs are written atomically
(`shockslurm.atomic`): a failed write leaves the file already there untouched."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable, Mapping

import click

from ..atomic import NamedPath, write_file


def file_problem(path: Path) -> str | None:
    """Why the file `path` could not be written (created or replaced), or None."""
    if path.exists():
        if path.is_dir():
            return "is a directory"
        if not os.access(path, os.W_OK):
            return "is not writable"
        real = Path(os.path.realpath(path))
        if real.is_file() and not os.access(real.parent, os.W_OK | os.X_OK):
            # a file is replaced by a new one written beside it (`shockslurm.atomic`)
            return f"cannot replace it: its directory {real.parent} is not writable"
        return None
    parent = path.parent
    if not parent.exists():
        return f"directory {parent} does not exist"
    if not parent.is_dir():
        return f"{parent} is not a directory"
    if not os.access(parent, os.W_OK | os.X_OK):
        return f"cannot create a file in {parent} (not writable)"
    return None


def dir_problem(path: Path) -> str | None:
    """Why the directory `path` could not be written into (created first when missing), or
    None."""
    if path.exists():
        if not path.is_dir():
            return "exists and is not a directory"
        return None if os.access(path, os.W_OK | os.X_OK) else "is not writable"
    ancestor = path.parent
    while not ancestor.exists():
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        return f"cannot create it: {ancestor} is not a directory"
    if not os.access(ancestor, os.W_OK | os.X_OK):
        return f"cannot create it: {ancestor} is not writable"
    return None


def _option_name(param: click.Parameter | None) -> str | None:
    """`--out` for an option declared `--out`/`-o`; None outside a command line."""
    opts = list(getattr(param, "opts", None) or ())
    return next((o for o in opts if o.startswith("--")), opts[0] if opts else None)


class _Output(click.Path):
    """A path the command writes; refused at parse time when `problem` finds a reason."""

    problem: Callable[[Path], str | None]

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> Any:
        path = Path(os.fsdecode(super().convert(value, param, ctx)))
        problem = type(self).problem(path)
        if problem:
            self.fail(f"{path}: {problem}", param, ctx)
        return NamedPath.given(path, _option_name(param))


class OutputFile(_Output):
    """A file the command writes; refused at parse time when it could not be written."""

    problem = staticmethod(file_problem)

    def __init__(self) -> None:
        super().__init__(dir_okay=False, path_type=Path)


class OutputDir(_Output):
    """A directory the command writes files into (created when missing); refused at parse time
    when it could not be."""

    problem = staticmethod(dir_problem)

    def __init__(self) -> None:
        super().__init__(file_okay=False, path_type=Path)


def refuse_inputs_as_outputs(outputs: Mapping[str, Path | None],
                             inputs: Mapping[str, Path | str | None]) -> None:
    """A usage error when an output option names the file of an input option (the same file
    by another name too): writing it would replace the input (`simulate --json X --db X` left
    JSON where the store of every recorded run had been). `outputs` and `inputs` map each
    option to its path (None: not given)."""
    for out_option, out in outputs.items():
        if out is None or not os.path.exists(out):
            continue
        for in_option, given in inputs.items():
            if given is not None and os.path.exists(given) and os.path.samefile(out, given):
                raise click.UsageError(f"{out_option} {out} is the file of {in_option}: "
                                       "writing it would replace it; name another file")


def write_output(path: Path, text: str, option: str) -> None:
    """Write `text` to `path` atomically (UTF-8): a failure (disk full, a file size limit, a race
    with the parse-time check) is a clear error naming `option` and `path`
    (`atomic.OutputWriteError`, an `Error:` line), and leaves the file already there
    untouched."""
    write_file(path, text.encode("utf-8"), option=option)

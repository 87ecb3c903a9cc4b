"""Output options (`--json FILE`, `--out FILE`, `--plot DIR`, ...) checked when the command line
is read, before any work: a place the command could not write stops it at once with an error
naming the option, instead of a traceback after a long run."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable

import click


def file_problem(path: Path) -> str | None:
    """Why the file `path` could not be written (created or replaced), or None."""
    if path.exists():
        if path.is_dir():
            return "is a directory"
        return None if os.access(path, os.W_OK) else "is not writable"
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


class _Output(click.Path):
    """A path the command writes; refused at parse time when `problem` finds a reason."""

    problem: Callable[[Path], str | None]

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> Any:
        path = Path(os.fsdecode(super().convert(value, param, ctx)))
        problem = type(self).problem(path)
        if problem:
            self.fail(f"{path}: {problem}", param, ctx)
        return path


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


def write_output(path: Path, text: str, option: str) -> None:
    """Write `text` to `path`; a failure (disk full, a race with the parse-time check) is a
    clear error naming `option`."""
    try:
        path.write_text(text)
    except OSError as exc:
        raise click.ClickException(f"{option} {path}: cannot write: "
                                   f"{exc.strerror or exc}") from None

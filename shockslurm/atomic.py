"""Output files written whole or not at all: a failed write (disk full, a file size limit, a
directory where the file should go) leaves what was there untouched.

`atomic_write(path, data)` writes into a temporary file in the same directory (`.NAME.XXXX.tmp`,
created with the mode a new file would get, or the replaced file's own mode), flushes and
fsyncs it, `os.replace`s it onto the name, then fsyncs the directory; on any failure the
temporary file is removed and the exception propagates. Two cases are written in place instead,
because replacing them would be wrong: a name under /dev/ or /proc/ (`--json /dev/stdout`) or
that is a device or a FIFO is opened and written as it is, and a symbolic link is followed (its
target is replaced, the link stays). Torch-free, solver-free and click-free: the command line
and the training helper's checkpoints (`train.checkpoint`) both write through it.

`write_file(path, data)` is `atomic_write` whose failure is an `OutputWriteError` naming the file
and the command-line option it came from: a `NamedPath` (what `cli.paths.OutputFile` and
`OutputDir` return) remembers that option, so code below the command line (`workload.jsonl`,
`ops.plots`) names it without knowing the command line.
"""

from __future__ import annotations

import os
import re
import secrets
import stat
import sys
from pathlib import Path, PosixPath
from typing import IO, Callable

from .errors import ShockslurmError

Payload = bytes | Callable[[IO[bytes]], None]   # the bytes, or a function writing them
# names that stand for a stream (`--json /dev/stdout`), written in place: resolved, /dev/stdout
# is whatever file the shell redirected to, which must not be replaced behind its back
IN_PLACE = ("/dev/", "/proc/")
_FD_NAME = re.compile(r"/dev/std(out|err)|/dev/fd/(\d+)|/proc/self/fd/(\d+)")


class OutputWriteError(ShockslurmError):
    """An output file that could not be written; the file already there is untouched (a
    command shows it as one `Error:` line: `cli.output_errors`)."""


class NamedPath(PosixPath):
    """A path given on the command line, with the option that gave it (`--out`), so that an
    error writing it can name both. Paths derived from it (`/`, `.parent`) have no option."""

    option: str | None = None

    @classmethod
    def given(cls, path: str | os.PathLike[str], option: str | None) -> NamedPath:
        named = cls(path)
        named.option = option
        return named


def option_of(path: object) -> str | None:
    """The command-line option that gave `path`, when it is a `NamedPath`."""
    return getattr(path, "option", None)


def describe(path: Path, option: str | None = None) -> str:
    """`--out FILE`, or `FILE` when no option is known."""
    option = option or option_of(path)
    return f"{option} {path}" if option else str(path)


def fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:  # pragma: no cover - platforms without directory fds
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover - some filesystems refuse fsync on directories
        pass
    finally:
        os.close(fd)


def _write_into(fh: IO[bytes], data: Payload) -> None:
    if callable(data):
        data(fh)
    else:
        fh.write(data)
    fh.flush()


def _descriptor(name: str) -> int | None:
    """The file descriptor a name such as /dev/stdout or /proc/self/fd/1 stands for, if any:
    written through it, the output lands where the stream is now (opening the name anew would
    write from the start of a redirected file, over what the stream wrote)."""
    m = _FD_NAME.fullmatch(name)
    if m is None:
        return None
    std, dev_fd, proc_fd = m.groups()
    if std is not None:
        return 1 if std == "out" else 2
    return int(dev_fd if dev_fd is not None else proc_fd)


def _temporary(target: Path, mode: int | None) -> tuple[int, Path]:
    """A new, empty temporary file beside `target` (open for writing) and its path."""
    while True:
        tmp = target.with_name(f".{target.name[:120]}.{secrets.token_hex(4)}.tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0),
                         0o666)           # the mode a new file gets (the umask applies)
        except FileExistsError:  # pragma: no cover - 32 random bits already taken
            continue
        if mode is not None:
            try:
                os.fchmod(fd, mode)   # replacing a file keeps its permissions
            except OSError:  # pragma: no cover - a filesystem without modes
                pass
        return fd, tmp


def atomic_write(path: str | os.PathLike[str], data: Payload, *,
                 before_replace: Callable[[], None] | None = None,
                 new_mode: int | None = None) -> None:
    """Write `data` to `path` so that a failure or a crash leaves either the old file or the
    whole new one (module docstring); `before_replace` runs once the new file is on disk,
    before it takes its name; `new_mode`: a new file's permissions (else the umask's). OSError
    (and whatever `data` raises) propagates."""
    name = os.fspath(path)
    if (fd := _descriptor(name)) is not None:     # /dev/stdout: this process's own stream
        sys.stdout.flush()
        sys.stderr.flush()
        with os.fdopen(os.dup(fd), "wb") as fh:   # where fd 1 is now, fd 1 left open
            _write_into(fh, data)
        return
    if name.startswith(IN_PLACE):                 # another device or /proc file
        with open(path, "wb") as fh:
            _write_into(fh, data)
        return
    target = Path(os.path.realpath(path)) if os.path.islink(path) else Path(path)
    try:
        st = os.stat(target)
    except FileNotFoundError:
        st = None
    if st is not None and not stat.S_ISREG(st.st_mode) and not stat.S_ISDIR(st.st_mode):
        with open(target, "wb") as fh:    # a device or a FIFO: nothing to replace
            _write_into(fh, data)
        return
    fd, tmp = _temporary(target, stat.S_IMODE(st.st_mode) if st is not None
                         and stat.S_ISREG(st.st_mode) else new_mode)
    try:
        with os.fdopen(fd, "wb") as fh:
            _write_into(fh, data)
            os.fsync(fh.fileno())
        if before_replace is not None:
            before_replace()
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    fsync_dir(target.parent)


def write_file(path: Path, data: Payload, *, option: str | None = None,
               within: Path | None = None) -> None:
    """`atomic_write`, with a failure as an `OutputWriteError`: `--out FILE: cannot write:
    REASON`, or `--plot DIR: cannot write FILE: REASON` for a file written into `within`, the
    directory an option named. `option` defaults to the one remembered by the `NamedPath`."""
    try:
        atomic_write(path, data)
    except OSError as exc:
        reason = exc.strerror or str(exc)
        if within is not None:
            raise OutputWriteError(f"{describe(within, option)}: cannot write {path}: "
                                   f"{reason}") from None
        raise OutputWriteError(f"{describe(path, option)}: cannot write: {reason}") from None

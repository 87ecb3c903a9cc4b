"""The daemon-owned area where refused report files are kept, with a `.reason` beside each.

It is `[daemon] rejected_dir`, by default the spool's sibling `<spool_dir>.rejected` (outside
the user-writable spool, on the same file system). The daemon creates it with mode 0700 and,
before each use, opens it with `O_NOFOLLOW` and checks the descriptor: a directory owned by the
daemon's effective uid, not writable by group or others. Anything else (a symlink or a
directory a user created first) is refused, said once in the log, and refused reports are then
deleted without a copy (their reason is still logged). Files in it are created exclusively
(`O_CREAT | O_EXCL | O_NOFOLLOW`, mode 0600) under names the daemon chooses: the original name
when it is tame (`spool_read.SAFE_NAME`), else `unnamed`, with `.1`, `.2`... when taken. The
copy holds the bytes the daemon read (at most the size cap; none for a file refused unread).
"""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

from .spool_read import SAFE_NAME

log = logging.getLogger("shockslurm.reports")

MAX_SUFFIX = 1000
_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def default_rejected_dir(spool_dir: str | os.PathLike[str]) -> str:
    """`<spool_dir>.rejected`: beside the spool, not in it."""
    return str(Path(spool_dir)) + ".rejected"


def unsafe(st: os.stat_result) -> str | None:
    """Why a directory with this fstat cannot hold the daemon's files, or None."""
    if not stat.S_ISDIR(st.st_mode):
        return "not a directory"
    if st.st_uid != os.geteuid():
        return f"owned by uid {st.st_uid}, not by the daemon (uid {os.geteuid()})"
    if st.st_mode & 0o022:
        return f"writable by group or others (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


def _write_new(dir_fd: int, name: str, data: bytes) -> None:
    fd = os.open(name, _CREATE, 0o600, dir_fd=dir_fd)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    finally:
        os.close(fd)


class RejectedArea:
    """Opens, verifies and writes into the rejected-reports directory."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = str(path)
        self._complained: str | None = None

    def _complain(self, why: str) -> None:
        if why != self._complained:     # once per distinct problem
            log.warning("rejected-reports directory %s cannot be used (%s): refused reports "
                        "are deleted without a copy until it is fixed", self.path, why)
            self._complained = why

    def open(self) -> int | None:
        """A verified descriptor of the directory (created 0700 if missing), or None."""
        try:
            os.mkdir(self.path, 0o700)
        except FileExistsError:
            pass
        except OSError as exc:
            self._complain(f"cannot create it: {exc.strerror}")
            return None
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as exc:
            self._complain("a symbolic link" if os.path.islink(self.path)
                           else f"cannot open it: {exc.strerror}")
            return None
        why = unsafe(os.fstat(fd))
        if why is not None:
            os.close(fd)
            self._complain(why)
            return None
        if self._complained is not None:
            log.info("rejected-reports directory %s is usable again", self.path)
            self._complained = None
        return fd

    @staticmethod
    def keep(dir_fd: int, original: str, shown_name: str, data: bytes | None,
             reason: str) -> str | None:
        """Write `<name>.reason` (and the copy `<name>` when `data`) under a fresh name;
        returns the name, or None when none could be created."""
        stem = original[:-len(".json")] if SAFE_NAME.fullmatch(original) else "unnamed"
        text = f"{shown_name}: {reason}\n".encode()
        for i in range(MAX_SUFFIX):
            name = f"{stem}.json" if i == 0 else f"{stem}.{i}.json"
            try:
                _write_new(dir_fd, f"{name}.reason", text)
            except FileExistsError:
                continue
            if data is not None:
                try:
                    _write_new(dir_fd, name, data)
                except FileExistsError:   # a copy without its reason (a crash in between)
                    pass
            return name
        return None

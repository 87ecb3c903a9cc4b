"""Reading report files from a user-writable spool without lending root's rights to a user.

Every entry is examined relative to one directory descriptor of the spool (opened with
`O_NOFOLLOW`, so the spool itself is never a symlink) and:
- is `lstat`ed first: a symlink, anything but a regular file, a file with more than one name
  (a hard link to someone else's file) or a file over `MAX_REPORT_BYTES` is refused unopened;
- is opened with `O_NOFOLLOW | O_NONBLOCK` (a symlink swapped in after the `lstat` fails, a FIFO
  swapped in does not block), then checked again on the descriptor (`fstat`: regular file, one
  name, the same owner, size under the cap) and read for at most cap + 1 bytes;
- when the daemon runs as root, is opened *as the file's owner*: the effective uid becomes the
  owner's, the effective gid the owner's primary group (from the passwd database; `nogroup`
  65534 for an unknown uid) and the supplementary groups none, for the open and the read only.
  A user can therefore make the daemon read only what that user could read anyway. A file owned
  by root is read as root: a user can place one only by renaming it out of a directory that user
  may write (hard links are refused, symlinks never followed), and its content still reaches no
  log and no reason file, only the root-only rejected area. `seteuid` applies to every thread
  of the process (glibc), so the caller must do nothing else in that window: the ingest reads
  all files first and opens the store afterwards.

No file content and no exception text ever leaves this module: a refusal is one of a few fixed
phrases (`Read.problem`).
"""

from __future__ import annotations

import errno
import heapq
import os
import pwd
import re
import stat
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

MAX_REPORT_BYTES = 64 * 1024     # a real report is under 1 KiB
NOGROUP = 65534
# Names the job-side writer makes (`<time_ns>-<pid>-<seq>.json`) and any tame variant: only
# these are written into logs and reason files as they are.
SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]{0,199}")


@dataclass(frozen=True)
class Read:
    """One spool entry: its content (at most the cap) or why it was refused unread."""

    name: str
    data: bytes | None = None
    problem: str | None = None
    owner: int | None = None
    leave: bool = False     # the daemon's problem, not the file's: leave it in the spool


def shown(name: str) -> str:
    """The entry's name as logs and reason files may show it (a user chose it)."""
    return name if SAFE_NAME.fullmatch(name) else "(a file with an unusual name)"


def open_spool(path: str | os.PathLike[str]) -> int:
    """A descriptor of the spool directory itself, never through a symlink; raises OSError
    (FileNotFoundError when there is no spool yet)."""
    return os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)


def report_names(dir_fd: int, limit: int) -> list[str]:
    """The `limit` first entries named `*.json`, not dot-named (a writer's temporary), oldest
    name first; memory bounded by `limit` however many entries a user created."""
    with os.scandir(dir_fd) as entries:
        return heapq.nsmallest(limit, (e.name for e in entries
                                       if e.name.endswith(".json") and not e.name.startswith(".")))


def _primary_gid(uid: int) -> int:
    try:
        return pwd.getpwuid(uid).pw_gid
    except KeyError:
        return NOGROUP


class OwnerSwitchError(OSError):
    """The daemon (root) could not take a file owner's identity (no CAP_SETUID/CAP_SETGID?)."""


def _restore(groups: list[int], egid: int) -> None:
    os.seteuid(0)        # first: the rights to set the rest back
    os.setegid(egid)
    os.setgroups(groups)


@contextmanager
def as_owner(uid: int) -> Iterator[None]:
    """Run the block with the effective uid `uid`, its primary group and no supplementary
    groups, when this process is root and `uid` is not; otherwise unchanged. Raises
    OwnerSwitchError (identity unchanged) when the switch is not allowed."""
    if os.geteuid() != 0 or uid == 0:
        yield
        return
    groups, egid = os.getgroups(), os.getegid()
    try:
        os.setgroups([])
        os.setegid(_primary_gid(uid))
        os.seteuid(uid)
    except OSError as exc:
        _restore(groups, egid)
        raise OwnerSwitchError(exc.errno, "cannot take the file owner's identity") from exc
    try:
        yield
    finally:
        _restore(groups, egid)   # an error here propagates: never go on as another user


def _refusal(st: os.stat_result, cap: int) -> str | None:
    """Why an entry with this (l)stat is no report file, or None."""
    if stat.S_ISLNK(st.st_mode):
        return "a symbolic link (never followed)"
    if not stat.S_ISREG(st.st_mode):
        return "not a regular file"
    if st.st_nlink != 1:
        return f"a file with {st.st_nlink} names (hard links are refused)"
    if st.st_size > cap:
        return f"too large ({st.st_size} bytes; the limit is {cap})"
    return None


def _read_capped(fd: int, cap: int) -> bytes:
    """At most cap + 1 bytes: one more than allowed is enough to know it is too large."""
    chunks: list[bytes] = []
    got = 0
    while got <= cap:
        chunk = os.read(fd, cap + 1 - got)
        if not chunk:
            break
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def _errno_name(exc: OSError) -> str:
    return errno.errorcode.get(exc.errno or 0, "error")


def _open_problem(exc: OSError, owner: int) -> str:
    if exc.errno == errno.ELOOP:
        return "a symbolic link (never followed)"
    if exc.errno in (errno.EACCES, errno.EPERM):   # read as its owner, or by a non-root daemon
        return f"not readable by {'its owner' if os.geteuid() == owner else 'the daemon'}"
    return f"cannot be opened ({_errno_name(exc)})"


def read_opened(dir_fd: int, name: str, owner: int, cap: int) -> Read | None:
    """Open `name` (no symlink, no blocking), check the descriptor, read at most cap + 1 bytes;
    None when the entry vanished meanwhile (another ingester took it)."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
    try:
        fd = os.open(name, flags, dir_fd=dir_fd)
    except FileNotFoundError:
        return None
    except OSError as exc:
        return Read(name, problem=_open_problem(exc, owner), owner=owner)
    try:
        st = os.fstat(fd)
        problem = _refusal(st, cap)
        if problem is None and st.st_uid != owner:
            problem = "replaced while being read"
        if problem is not None:
            return Read(name, problem=problem, owner=owner)
        data = _read_capped(fd, cap)
    except OSError as exc:
        return Read(name, problem=f"cannot be read ({_errno_name(exc)})", owner=owner)
    finally:
        os.close(fd)
    if len(data) > cap:
        return Read(name, problem=f"too large (over {cap} bytes)", owner=owner)
    return Read(name, data=data, owner=owner)


def read_entry(dir_fd: int, name: str, cap: int = MAX_REPORT_BYTES) -> Read | None:
    """The checked content of spool entry `name`, or why it is refused; None if it vanished."""
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None
    problem = _refusal(st, cap)
    if problem is not None:
        return Read(name, problem=problem, owner=st.st_uid)
    try:
        with as_owner(st.st_uid):
            return read_opened(dir_fd, name, st.st_uid, cap)
    except OwnerSwitchError:
        return Read(name, problem="not read: the daemon cannot take its owner's identity",
                    owner=st.st_uid, leave=True)

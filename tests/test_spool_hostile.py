"""The spool against a hostile user (issue 15, item 2): the daemon ingests as root, a user
controls what lies in the spool.

Each attack runs against a temporary spool beside a "root-only" file and directory (root,
0600 / 0700) and shows that the target is not read, written or changed, nothing from it (or
from a bad report) reaches the log or a reason file, and the good reports next to the bad ones
are still ingested. The last test runs the attacks as a real unprivileged user (created with
`useradd` and removed after), with the spool in its documented mode 1733.
"""

from __future__ import annotations

import json
import logging
import os
import pwd
import shutil
import signal
import stat
import subprocess
import tempfile
import tracemalloc
import uuid
from pathlib import Path

import pytest
from sqlalchemy.orm import Session

from shockslurm.reports.ingest import SpoolIngest, ingest_spool
from shockslurm.reports.spool_read import MAX_REPORT_BYTES, read_opened
from shockslurm.store import repository as repo
from shockslurm.store.database import open_store
from shockslurm.store.models import ThroughputSample
from shockslurm.train.records import derive_key, sign

from .conftest import REQUIRE_ALL

# CI runs as root: there (SHOCKSLURM_REQUIRE_ALL=1) these tests run, and fail rather than skip.
pytestmark = pytest.mark.skipif(os.geteuid() != 0 and not REQUIRE_ALL,
                                reason="the daemon's side runs as root")

SECRET = "c4" * 16
SECRET_TEXT = f"root-only-{uuid.uuid4().hex}"      # what must never leak
LOGGER = "shockslurm.reports"


@pytest.fixture
def engine(tmp_path):
    engine = open_store(f"sqlite:///{tmp_path / 'store.db'}", create=True)
    with Session(engine) as s, s.begin():
        repo.register_submitted_job(s, "slurm", job_id=7, submit_s=1e9, model="m", epochs=2,
                                    samples_per_epoch=100, batch_sizes=[32], gang_size=1,
                                    report_key=derive_key(SECRET))
    yield engine
    engine.dispose()


@pytest.fixture
def root_only(tmp_path):
    """A root-only directory (0700) holding a root-only file (0600)."""
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    secret = private / "secret"
    secret.write_text(SECRET_TEXT + "\n")
    secret.chmod(0o600)
    return private, secret


def _good(samples_per_s: float, time_s: float = 1.7e9) -> bytes:
    report = {"v": 1, "kind": "throughput", "cluster": "slurm", "job_id": 7, "time_s": time_s,
              "samples_per_s": samples_per_s, "batch_size": 32, "gpus": 1}
    return json.dumps(sign(report, derive_key(SECRET))).encode()


def _samples(engine) -> list[float]:
    with Session(engine) as s:
        return sorted(x.samples_per_s for x in s.query(ThroughputSample))


def _fingerprint(path: Path) -> tuple:
    st = os.lstat(path)
    return (st.st_mode, st.st_uid, st.st_nlink, st.st_size, st.st_mtime_ns,
            sorted(os.listdir(path)) if stat.S_ISDIR(st.st_mode) else path.read_bytes())


def _rejected_text(spool: Path, pattern: str = "*") -> str:
    rejected = Path(f"{spool}.rejected")
    if not rejected.is_dir() or rejected.is_symlink():
        return ""
    return "".join(p.read_text(errors="replace") for p in rejected.glob(pattern))


def _reason(spool: Path, name: str) -> str:
    return (Path(f"{spool}.rejected") / f"{name}.reason").read_text()


def _assert_no_leak(spool: Path, caplog, *words: str) -> None:
    """The root-only text nowhere (log, reasons, kept copies); `words` of a refused report in
    no log line or reason (its kept copy holds them, of course)."""
    assert SECRET_TEXT not in caplog.text and SECRET_TEXT not in _rejected_text(spool)
    for word in words:
        assert word not in caplog.text and word not in _rejected_text(spool, "*.reason")


def test_a_symlink_to_a_root_only_file_is_never_followed(tmp_path, engine, root_only, caplog):
    _private, secret = root_only
    before = _fingerprint(secret)
    spool = tmp_path / "spool"
    spool.mkdir()
    (spool / "a-link.json").symlink_to(secret)
    (spool / "b-good.json").write_bytes(_good(100.0))
    with caplog.at_level(logging.INFO, logger=LOGGER):
        assert ingest_spool(spool, engine) == 1
    assert _samples(engine) == [100.0]
    assert _fingerprint(secret) == before
    assert sorted(os.listdir(spool)) == []                  # the link (only) is gone
    assert "symbolic link" in _reason(spool, "a-link.json")
    assert not (Path(f"{spool}.rejected") / "a-link.json").exists()   # nothing read to copy
    _assert_no_leak(spool, caplog)


def test_a_symlink_swapped_in_after_the_lstat_is_not_followed(root_only, tmp_path):
    """The window between `lstat` and `open`: the open itself refuses the link."""
    _private, secret = root_only
    spool = tmp_path / "spool"
    spool.mkdir()
    (spool / "x.json").symlink_to(secret)
    fd = os.open(spool, os.O_RDONLY | os.O_DIRECTORY)
    try:
        read = read_opened(fd, "x.json", owner=0, cap=MAX_REPORT_BYTES)
    finally:
        os.close(fd)
    assert read is not None and read.data is None and "symbolic link" in read.problem


def test_the_old_bad_dir_and_reason_links_are_harmless(tmp_path, engine, root_only, caplog):
    """The attacks on the old `spool/bad/`: a planted `bad/<name>.reason` link to a root-only
    file, and `bad` itself a link to a root-only directory. Nothing is written through them."""
    private, secret = root_only
    spool = tmp_path / "spool"
    spool.mkdir()
    (spool / "bad").mkdir()
    (spool / "bad" / "m.json.reason").symlink_to(secret)
    (spool / "bad" / "m.json").symlink_to(secret)
    other = tmp_path / "spool2"
    other.mkdir()
    (other / "bad").symlink_to(private)
    before = (_fingerprint(secret), _fingerprint(private))
    for s in (spool, other):
        (s / "m.json").write_text("{oops")
        (s / "g.json").write_bytes(_good(1.0 if s == spool else 2.0))
    with caplog.at_level(logging.INFO, logger=LOGGER):
        assert ingest_spool(spool, engine) == 1
        assert ingest_spool(other, engine) == 1
    assert (_fingerprint(secret), _fingerprint(private)) == before
    assert "not JSON" in _reason(spool, "m.json") and "not JSON" in _reason(other, "m.json")
    _assert_no_leak(spool, caplog, "oops")


@pytest.mark.parametrize("plant", ["symlink", "foreign owner", "group writable", "a file"])
def test_an_unsafe_rejected_dir_is_refused_once(tmp_path, engine, root_only, caplog, plant):
    private, secret = root_only
    before = (_fingerprint(secret), _fingerprint(private))
    spool = tmp_path / "spool"
    spool.mkdir()
    rejected = Path(f"{spool}.rejected")
    if plant == "symlink":
        rejected.symlink_to(private)
    elif plant == "a file":
        rejected.write_text("")
    else:
        rejected.mkdir(mode=0o700)
        if plant == "foreign owner":
            os.chown(rejected, 12345, 12345)
        else:
            rejected.chmod(0o770)
    ingest = SpoolIngest(str(spool))
    with caplog.at_level(logging.INFO, logger=LOGGER):
        for i in range(2):
            (spool / f"bad-{i}.json").write_text('{"v": 1}')
            (spool / f"good-{i}.json").write_bytes(_good(float(i + 1)))
            assert ingest.run(engine) == 1
    assert _samples(engine) == [1.0, 2.0]
    assert os.listdir(spool) == []                     # refused ones deleted without a copy
    assert sum("cannot be used" in m for m in caplog.messages) == 1
    assert (_fingerprint(secret), _fingerprint(private)) == before
    if plant != "symlink":
        assert not rejected.is_dir() or os.listdir(rejected) == []


def test_a_hard_link_to_a_root_only_file_is_refused_unread(tmp_path, engine, root_only, caplog):
    _private, secret = root_only
    spool = tmp_path / "spool"
    spool.mkdir()
    os.link(secret, spool / "h.json")       # root can; fs.protected_hardlinks stops users
    (spool / "g.json").write_bytes(_good(5.0))
    with caplog.at_level(logging.INFO, logger=LOGGER):
        assert ingest_spool(spool, engine) == 1
    assert secret.read_text() == SECRET_TEXT + "\n" and os.stat(secret).st_nlink == 1
    assert "2 names" in _reason(spool, "h.json")
    _assert_no_leak(spool, caplog)


def test_a_fifo_does_not_hang_the_ingest(tmp_path, engine):
    spool = tmp_path / "spool"
    spool.mkdir()
    os.mkfifo(spool / "f.json")
    (spool / "g.json").write_bytes(_good(3.0))
    old = signal.signal(signal.SIGALRM, lambda *_: pytest.fail("the ingest blocked on a FIFO"))
    signal.alarm(10)
    try:
        assert ingest_spool(spool, engine) == 1
        os.mkfifo(spool / "late.json")     # one swapped in after the lstat: opened, not blocked
        fd = os.open(spool, os.O_RDONLY | os.O_DIRECTORY)
        try:
            read = read_opened(fd, "late.json", owner=0, cap=MAX_REPORT_BYTES)
        finally:
            os.close(fd)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    assert "not a regular file" in _reason(spool, "f.json")
    assert read is not None and read.problem == "not a regular file"


def test_a_400_mb_file_is_refused_without_reading_it(tmp_path, engine, caplog):
    spool = tmp_path / "spool"
    spool.mkdir()
    with open(spool / "big.json", "wb") as fh:
        fh.truncate(400 * 2**20)                  # sparse: no disk used
    (spool / "g.json").write_bytes(_good(4.0))
    tracemalloc.start()
    try:
        with caplog.at_level(logging.INFO, logger=LOGGER):
            assert ingest_spool(spool, engine) == 1
        _now, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 8 * 2**20, peak                 # the 400 MB were never read
    assert "too large (419430400 bytes" in _reason(spool, "big.json")
    assert not (Path(f"{spool}.rejected") / "big.json").exists()
    # a file that grows after the lstat is caught on the descriptor, and read at most cap + 1
    (spool / "grown.json").write_bytes(b"{" + b" " * MAX_REPORT_BYTES + b"}")
    fd = os.open(spool, os.O_RDONLY | os.O_DIRECTORY)
    try:
        read = read_opened(fd, "grown.json", owner=0, cap=MAX_REPORT_BYTES)
    finally:
        os.close(fd)
    assert read is not None and read.data is None and read.problem.startswith("too large")


def test_a_flood_of_files_is_read_a_bounded_amount_per_round(tmp_path, engine):
    spool = tmp_path / "spool"
    spool.mkdir()
    for i in range(3):
        (spool / f"{i}.json").write_bytes(_good(float(i), 1.7e9 + i))
    ingest = SpoolIngest(str(spool), max_round_bytes=1)      # one file held per round
    assert [ingest.run(engine) for _ in range(4)] == [1, 1, 1, 0]
    assert _samples(engine) == [0.0, 1.0, 2.0]
    for i in range(3, 6):
        (spool / f"{i}.json").write_bytes(_good(float(i), 1.7e9 + i))
    assert [ingest_spool(spool, engine, limit=2) for _ in range(3)] == [2, 1, 0]  # oldest first
    assert _samples(engine) == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]


def test_reasons_and_logs_never_quote_the_file(tmp_path, engine, caplog):
    spool = tmp_path / "spool"
    spool.mkdir()
    leaks = {
        "a.json": {"v": "LEAK-version", "kind": "throughput"},
        "b.json": {"v": 1, "kind": "LEAK-kind", "job_id": 7, "time_s": 1.0},
        "c.json": {"v": 1, "kind": "throughput", "job_id": 7, "time_s": 1.0,
                   "samples_per_s": "LEAK-field", "batch_size": 32, "gpus": 1},
        "d.json": {"v": 1, "kind": "throughput", "job_id": 7, "time_s": 987654321.5,
                   "samples_per_s": 1.0, "batch_size": 32, "gpus": 1},   # unsigned
        "e.json": {"v": 1, "kind": "throughput", "cluster": "LEAK-cluster", "job_id": 7,
                   "time_s": 1.0, "samples_per_s": 1.0, "batch_size": 32, "gpus": 1},
        "f.json": {"LEAK-key": 2**70},
    }
    for name, report in leaks.items():
        (spool / name).write_text(json.dumps(report))
    (spool / "g.json").write_text("LEAK-text is not JSON")
    (spool / "h.json").write_bytes(b"\xffLEAK-bytes")
    (spool / "evil\nLEAK-name\x1b[2J.json").write_text("{")
    (spool / "ok.json").write_bytes(_good(6.0))
    with caplog.at_level(logging.INFO, logger=LOGGER):
        assert ingest_spool(spool, engine) == 1
    reasons = {p.name: p.read_text() for p in Path(f"{spool}.rejected").glob("*.reason")}
    assert "unsigned" in reasons["d.json.reason"] and "claimed job_id 7" in reasons[
        "d.json.reason"]
    assert "'samples_per_s'" in reasons["c.json.reason"]      # the schema's field is named
    assert "not JSON" in reasons["g.json.reason"] and "UTF-8" in reasons["h.json.reason"]
    assert "unusual name" in reasons["unnamed.json.reason"]
    text = caplog.text + "".join(reasons.values())
    assert "LEAK" not in text and "987654321" not in text and "\x1b" not in text, text


def test_the_job_side_writer_works_in_a_1733_spool(tmp_path, engine):
    from shockslurm.train.reports import Reporter, SpoolSink

    spool = tmp_path / "spool"
    spool.mkdir(mode=0o1733)
    spool.chmod(0o1733)
    rep = Reporter(SpoolSink(spool), cluster="slurm", job_id=7, min_interval_s=0.0,
                   secret=SECRET)
    rep.throughput(9.0, 32, gpus=1)
    rep.close()
    (written,) = spool.glob("*.json")
    assert written.stat().st_nlink == 1 and not list(spool.glob(".*"))
    assert ingest_spool(spool, engine) == 1 and _samples(engine) == [9.0]


# --------------------------------------------------------------------------- a real user
USER = "shockspooltest"


@pytest.fixture
def hostile_user():
    subprocess.run(["userdel", USER], capture_output=True)     # a leftover of a killed run
    subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/bin/sh", USER],
                   check=True, capture_output=True)
    try:
        yield pwd.getpwnam(USER)
    finally:
        subprocess.run(["userdel", USER], check=True, capture_output=True)


def _as(user: pwd.struct_passwd, script: str, **env: str) -> subprocess.CompletedProcess:
    def drop() -> None:
        os.setgroups([])
        os.setgid(user.pw_gid)
        os.setuid(user.pw_uid)

    return subprocess.run(["/bin/sh", "-c", script], preexec_fn=drop, capture_output=True,
                          text=True, env={"PATH": "/usr/bin:/bin", **env}, cwd="/")


def test_attacks_as_an_unprivileged_user(hostile_user, engine, caplog):
    # a shared /tmp-like base (1777): the user can plant `<spool>.rejected` before the daemon
    base = Path(tempfile.mkdtemp(prefix="shockspool-"))
    try:
        base.chmod(0o1777)
        private = base / "private"
        private.mkdir(mode=0o700)
        secret = private / "secret"
        secret.write_text(SECRET_TEXT + "\n")
        secret.chmod(0o600)
        spool = base / "spool"
        spool.mkdir()
        spool.chmod(0o1733)                                  # the documented mode
        fd = os.open(spool / "root-job.json", os.O_WRONLY | os.O_CREAT, 0o600)  # as SpoolSink
        os.write(fd, _good(10.0, 1.7e9))                     # someone else's report
        os.close(fd)
        before = (_fingerprint(secret), _fingerprint(private))
        script = """
            set -e
            ls "$S" >/dev/null 2>&1 && echo LISTED
            cat "$S/root-job.json" >/dev/null 2>&1 && echo READ-OTHERS
            ln -s "$P" "$S.rejected"                       # the rejected area -> root-only dir
            ln -s "$P/secret" "$S/a-shadow.json"           # a report -> root-only file
            ln "$P/secret" "$S/b-hard.json" 2>/dev/null && echo HARDLINKED
            printf '{oops' > "$S/c-bad.json"
            printf '%s' "$GOOD" > "$S/.d.tmp" && chmod 000 "$S/.d.tmp"
            mv "$S/.d.tmp" "$S/d-unreadable-by-owner.json"
            umask 077; printf '%s' "$GOOD2" > "$S/.e.tmp" && mv "$S/.e.tmp" "$S/e-mine.json"
            mkfifo "$S/f-fifo.json"
            truncate -s 400M "$S/g-huge.json"
            echo DONE
        """
        out = _as(hostile_user, script, S=str(spool), P=str(private),
                  GOOD=_good(20.0, 1.7e9 + 1).decode(), GOOD2=_good(30.0, 1.7e9 + 2).decode())
        assert out.stdout.split() == ["DONE"], (out.stdout, out.stderr)   # no list/read/link
        with caplog.at_level(logging.INFO, logger=LOGGER):
            assert ingest_spool(spool, engine) == 2
        # the root job's and the user's own 0600 report (read as the user); not the mode 000
        # one: read as its owner, who cannot read it (root could: privileges were dropped)
        assert _samples(engine) == [10.0, 30.0]
        assert (_fingerprint(secret), _fingerprint(private)) == before
        assert os.listdir(spool) == []
        assert sum("cannot be used" in m for m in caplog.messages) == 1
        assert any("d-unreadable-by-owner.json" in m and "not readable by its owner" in m
                   for m in caplog.messages)
        _assert_no_leak(spool, caplog, "oops")
    finally:
        shutil.rmtree(base)


def test_a_missing_spool_is_said_once_until_it_exists(tmp_path, engine, caplog):
    """A typo in spool_dir (or a spool not created yet) is one warning, not silence; once the
    directory exists its reports are ingested."""
    spool = tmp_path / "spool"
    ingest = SpoolIngest(str(spool))
    with caplog.at_level(logging.INFO, logger=LOGGER):
        for _ in range(3):
            assert ingest.run(engine) == 0
        spool.mkdir()
        (spool / "g.json").write_bytes(_good(7.0))
        assert ingest.run(engine) == 1
    assert sum(f"spool {spool} cannot be read (it does not exist)" in m
               for m in caplog.messages) == 1
    assert _samples(engine) == [7.0]


def test_a_stored_report_swapped_for_a_directory_before_its_delete(tmp_path, engine, monkeypatch):
    """A writer replaces its stored report with a directory between the commit and the
    delete (`rm a.json; mkdir a.json`): the delete fails with IsADirectoryError, and the round
    still refuses the bad file beside it (that error ended the round's clean-up)."""
    spool = tmp_path / "spool"
    spool.mkdir()
    (spool / "a-good.json").write_bytes(_good(100.0))
    (spool / "b-bad.json").write_bytes(b"not json")
    real = os.unlink

    def racing(name, *, dir_fd=None):
        if name == "a-good.json":
            real(name, dir_fd=dir_fd)
            os.mkdir(name, dir_fd=dir_fd)
        return real(name, dir_fd=dir_fd)
    monkeypatch.setattr(os, "unlink", racing)
    assert ingest_spool(spool, engine) == 1
    assert _samples(engine) == [100.0]
    assert "b-bad.json" not in os.listdir(spool) and _reason(spool, "b-bad.json")

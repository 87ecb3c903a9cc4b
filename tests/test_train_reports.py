"""shockslurm.train.reports and spool: rate limit, never blocking, spool ingest into SQLite."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import logging
import threading
import time
from pathlib import Path

import pytest
from sqlalchemy.orm import Session

from shockslurm.reports.ingest import ingest_spool
from shockslurm.store import repository as repo
from shockslurm.store.database import open_store
from shockslurm.store.models import BatchSizeChange, Checkpoint, JobEvent, ThroughputSample
from shockslurm.train.records import derive_key
from shockslurm.train import reports
from shockslurm.train.reports import Reporter, SpoolSink, StoreSink, reporter_from_env

SECRET = "0123456789abcdef0123456789abcdef"      # job 42's report secret (tests only)


class ListSink:
    def __init__(self):
        self.got = []

    def send(self, report):
        self.got.append(report)

    def close(self):
        pass


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


def test_throughput_rate_limited_changes_always():
    sink, clock = ListSink(), Clock()
    rep = Reporter(sink, job_id=1, min_interval_s=10.0, clock=clock)
    assert rep.throughput(100.0, 32, gpus=1)
    for dt in (1, 5, 9.9):
        clock.t = 1000.0 + dt
        assert not rep.throughput(100.0, 32, gpus=1)
        assert rep.batch_size_change(32, 64, epoch=1, step=5)
    clock.t = 1010.0
    assert rep.throughput(120.0, 64, gpus=1)
    rep.close()
    kinds = [r["kind"] for r in sink.got]
    assert kinds.count("throughput") == 2 and kinds.count("batch_size_change") == 3
    assert rep.rate_limited == 3 and rep.sent == 5 and rep.dropped == 0


class HangingSink:
    """A store that never answers."""

    def __init__(self):
        self.release = threading.Event()

    def send(self, report):
        self.release.wait(30)

    def close(self):
        pass


def test_never_blocks_when_the_sink_hangs():
    sink = HangingSink()
    rep = Reporter(sink, job_id=1, min_interval_s=0.0, queue_size=8)
    t0 = time.perf_counter()
    for i in range(2000):
        rep.batch_size_change(i, i + 1)
        rep.throughput(1.0, 1, gpus=1)
    assert time.perf_counter() - t0 < 1.0
    assert rep.dropped >= 4000 - 9
    t0 = time.perf_counter()
    rep.close(timeout=0.3)
    assert time.perf_counter() - t0 < 1.5
    sink.release.set()


@pytest.mark.parametrize("url", ["sqlite:////nonexistent-dir-xyz/sub/store.db",
                                 "postgresql+psycopg://nobody@127.0.0.1:1/none"])
def test_unreachable_store_is_logged_once_and_training_goes_on(url, caplog):
    rep = Reporter(StoreSink(url), job_id=1, min_interval_s=0.0)
    with caplog.at_level(logging.WARNING, logger="shockslurm.reports"):
        t0 = time.perf_counter()
        for i in range(20):
            rep.batch_size_change(i, i + 1)
        assert time.perf_counter() - t0 < 2.0      # queued: no call waits for the store
        rep.close(timeout=20)
    assert rep.failed == 20 and rep.sent == 0
    msgs = [r.getMessage() for r in caplog.records if "could not send a report" in r.getMessage()]
    assert len(msgs) == 1


def _store(tmp_path):
    url = f"sqlite:///{tmp_path / 'store.db'}"
    engine = open_store(url, create=True)
    with Session(engine) as s:
        job = repo.register_submitted_job(s, "slurm", job_id=42, submit_s=1.0e9, model="MLP",
                                          epochs=4, samples_per_epoch=2048,
                                          batch_sizes=[32, 64, 128], gang_size=1,
                                          report_key=derive_key(SECRET))
        s.commit()
        job_pk = job.id
    return url, engine, job_pk


def _rows(engine):
    with Session(engine) as s:
        return {m.__tablename__: repo.count(s, m)
                for m in (ThroughputSample, BatchSizeChange, Checkpoint, JobEvent)}


def test_spool_ingest_and_malformed_files_moved_aside(tmp_path, caplog):
    url, engine, job_pk = _store(tmp_path)
    spool = tmp_path / "spool"
    rep = Reporter(SpoolSink(spool), cluster="slurm", job_id=42, min_interval_s=0.0,
                   secret=SECRET)
    rep.throughput(512.0, 32, gpus=2, epoch=0, epochs=4, step=10, step_in_epoch=10,
                   steps_per_epoch=64, epoch_progress=10 / 64)
    rep.batch_size_change(32, 64, epoch=2, step=128)
    rep.checkpoint("/ck/ckpt-000000000050.pt", 50)
    rep.epoch_done(0, 64, batch_size=32, epochs=4)
    rep.close()
    assert len(list(spool.glob("*.json"))) == 4
    # malformed: not JSON, not an object, unknown kind, a missing field, an unknown job
    bad = {"a-notjson.json": "{oops", "b-list.json": "[1, 2]",
           "c-kind.json": json.dumps({"v": 1, "kind": "nope", "job_id": 42, "time_s": 1.0}),
           "d-field.json": json.dumps({"v": 1, "kind": "throughput", "job_id": 42,
                                       "time_s": 1.0, "batch_size": 32, "gpus": 1}),
           "e-unknown.json": json.dumps({"v": 1, "kind": "checkpoint", "job_id": 999,
                                         "cluster": "slurm", "time_s": 1.0, "path": "p",
                                         "step": 1, "ok": True}),
           "f-binary.json": b"\xff\xfe\x00"}
    for name, text in bad.items():
        (spool / name).write_bytes(text if isinstance(text, bytes) else text.encode())
    (spool / ".half-written.json.tmp").write_text("{")       # a writer mid-write: ignored
    with caplog.at_level(logging.WARNING, logger="shockslurm.reports"):
        assert ingest_spool(spool, engine) == 4
    # job_events: the epoch end, and the throughput report's position (kind "progress")
    assert _rows(engine) == {"throughput_samples": 1, "batch_size_changes": 1, "checkpoints": 1,
                             "job_events": 2}
    with Session(engine) as s:
        sample = s.query(ThroughputSample).one()
        assert (sample.job_pk, sample.samples_per_s, sample.batch_size, sample.gpus) == (
            job_pk, 512.0, 32, 2)
        change = s.query(BatchSizeChange).one()
        assert (change.old_batch_size, change.new_batch_size) == (32, 64)
        ck = s.query(Checkpoint).one()
        assert (ck.step, ck.ok, ck.path) == (50, True, "/ck/ckpt-000000000050.pt")
        ev = s.query(JobEvent).filter_by(kind="epoch_done").one()
        assert json.loads(ev.detail)["epoch"] == 0
        pos = json.loads(s.query(JobEvent).filter_by(kind="progress").one().detail)
        assert pos["epoch_progress"] == 10 / 64 and pos["step"] == 10 and pos["batch_size"] == 32
    left = sorted(p.name for p in spool.iterdir() if p.is_file())
    assert left == [".half-written.json.tmp"]
    moved = sorted(p.name for p in Path(f"{spool}.rejected").glob("*.json"))
    assert moved == sorted(bad)
    for name in bad:
        assert (Path(f"{spool}.rejected") / f"{name}.reason").read_text().strip()
    assert "no registered job" in (Path(f"{spool}.rejected") / "e-unknown.json.reason").read_text()
    warned = " ".join(r.getMessage() for r in caplog.records)
    assert all(name in warned for name in bad)
    assert ingest_spool(spool, engine) == 0
    assert ingest_spool(tmp_path / "no-such-spool", engine) == 0


def test_files_stay_when_the_commit_fails(tmp_path, monkeypatch):
    url, engine, _ = _store(tmp_path)
    spool = tmp_path / "spool"
    rep = Reporter(SpoolSink(spool), job_id=42, secret=SECRET)
    rep.batch_size_change(32, 64)
    rep.close()

    def boom(self):
        raise RuntimeError("disk full")

    with monkeypatch.context() as m:
        m.setattr(Session, "commit", boom)
        with pytest.raises(RuntimeError):
            ingest_spool(spool, engine)
    assert len(list(spool.glob("*.json"))) == 1       # not deleted: its rows never committed
    assert ingest_spool(spool, engine) == 1
    assert _rows(engine)["batch_size_changes"] == 1


def test_store_sink_writes_rows(tmp_path):
    url, engine, job_pk = _store(tmp_path)
    rep = Reporter(StoreSink(url), cluster="slurm", job_id=42, min_interval_s=0.0,
                   secret=SECRET)
    rep.throughput(100.0, 64, gpus=1)
    rep.batch_size_change(64, 128)
    rep.close()
    assert rep.failed == 0 and rep.sent == 2
    assert _rows(engine)["throughput_samples"] == 1
    assert _rows(engine)["batch_size_changes"] == 1


def _job_env(monkeypatch, tmp_path):
    """A Slurm job's environment with no report setting and no site configuration."""
    for v in ("SHOCKSLURM_DB", "SHOCKSLURM_SPOOL", "RANK", "SLURM_PROCID",
              "SHOCKSLURM_REPORT_SECRET", "SHOCKSLURM_JOB_PK"):
        monkeypatch.delenv(v, raising=False)
    monkeypatch.setenv("SHOCKSLURM_CONFIG", str(tmp_path / "no-site-config.toml"))
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    monkeypatch.setattr(reports, "_said", set())       # a fresh process: nothing said yet


def test_reporter_from_env(monkeypatch, tmp_path):
    _job_env(monkeypatch, tmp_path)
    assert reporter_from_env().sink is None
    monkeypatch.setenv("SHOCKSLURM_SPOOL", str(tmp_path / "sp"))
    rep = reporter_from_env()
    assert isinstance(rep.sink, SpoolSink) and rep.job_id == 42
    rep.close()
    monkeypatch.setenv("RANK", "3")
    assert reporter_from_env().sink is None          # only rank 0 reports


def _site_config(tmp_path, monkeypatch, spool) -> None:
    config = tmp_path / "site.toml"
    config.write_text(f"[daemon]\nspool_dir = {json.dumps(str(spool))}\n")
    monkeypatch.setenv("SHOCKSLURM_CONFIG", str(config))


def _warnings(caplog):
    return [r.getMessage() for r in caplog.records
            if r.name == "shockslurm.train" and r.levelno >= logging.WARNING]


def test_plain_job_falls_back_to_the_site_spool(monkeypatch, tmp_path, caplog):
    """No $SHOCKSLURM_SPOOL (a plain sbatch job): the reports go to the site's spool."""
    _job_env(monkeypatch, tmp_path)
    spool = tmp_path / "spool"
    spool.mkdir(mode=0o1733)
    _site_config(tmp_path, monkeypatch, spool)
    monkeypatch.setenv("SHOCKSLURM_REPORT_SECRET", SECRET)
    rep = reporter_from_env()
    assert isinstance(rep.sink, SpoolSink) and rep.sink.directory == spool
    assert rep.batch_size_change(32, 64, epoch=1, step=10)
    rep.close()
    [name] = [p.name for p in spool.iterdir()]
    assert json.loads((spool / name).read_text())["new_batch_size"] == 64
    assert _warnings(caplog) == []
    # $SHOCKSLURM_SPOOL (what the shocksub job script sets) wins over the site's
    monkeypatch.setenv("SHOCKSLURM_SPOOL", str(tmp_path / "mine"))
    rep = reporter_from_env()
    assert rep.sink.directory == tmp_path / "mine"
    rep.close()


def test_unsigned_reports_are_said_once(monkeypatch, tmp_path, caplog):
    _job_env(monkeypatch, tmp_path)
    spool = tmp_path / "spool"
    spool.mkdir()
    _site_config(tmp_path, monkeypatch, spool)
    for _ in range(3):
        reporter_from_env().close()
    [said] = _warnings(caplog)
    assert "go unsigned" in said and "SHOCKSLURM_REPORT_SECRET" in said


@pytest.mark.parametrize("setup, why", [
    ("none", "no spool configured ($SHOCKSLURM_SPOOL and $SHOCKSLURM_DB are unset; no site "
             "configuration at"),
    ("no-key", "no spool configured ($SHOCKSLURM_SPOOL and $SHOCKSLURM_DB are unset; "),
    ("missing", "does not exist or is not a directory"),
    ("relative", "the site configuration cannot be used ("),
    ("file", "cannot be created"),
])
def test_a_job_that_cannot_report_says_why_once(monkeypatch, tmp_path, caplog, setup, why):
    _job_env(monkeypatch, tmp_path)
    monkeypatch.setenv("SHOCKSLURM_REPORT_SECRET", SECRET)
    if setup == "no-key":
        (tmp_path / "site.toml").write_text("[daemon]\nround_seconds = 60\n")
        monkeypatch.setenv("SHOCKSLURM_CONFIG", str(tmp_path / "site.toml"))
    elif setup == "missing":
        _site_config(tmp_path, monkeypatch, tmp_path / "not-made-by-the-admin")
    elif setup == "relative":
        _site_config(tmp_path, monkeypatch, "spool")
    elif setup == "file":                        # $SHOCKSLURM_SPOOL under a regular file
        (tmp_path / "f").write_text("")
        monkeypatch.setenv("SHOCKSLURM_SPOOL", str(tmp_path / "f" / "spool"))
    reps = [reporter_from_env() for _ in range(3)]
    assert all(r.sink is None for r in reps)
    assert all(r.batch_size_change(32, 64) is False for r in reps)   # training goes on
    [said] = _warnings(caplog)
    assert "progress reports go nowhere" in said and why in said, said
    assert not (tmp_path / "not-made-by-the-admin").exists()       # never created by a job


def _as_nobody(fn):
    """`fn()`'s string result, computed by a forked child that runs as `nobody` when we are
    root (who may write anywhere), else in this process."""
    if os.geteuid() != 0:
        return fn()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:                                  # the child: drop root for good, answer, exit
        try:
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
            os.write(write, fn().encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as fh:
        answer = fh.read()
    os.waitpid(pid, 0)
    return answer


def test_an_unwritable_spool_is_said(monkeypatch):
    """A job whose user may not write the site's spool: no sink, and the reason."""
    base = Path(tempfile.mkdtemp(prefix="shock-spool-"))   # reachable by nobody (tmp_path is not)
    try:
        base.chmod(0o755)
        spool = base / "spool"
        spool.mkdir(mode=0o755)
        config = base / "site.toml"
        config.write_text(f"[daemon]\nspool_dir = {json.dumps(str(spool))}\n")
        config.chmod(0o644)
        env = {"SLURM_JOB_ID": "42", "SHOCKSLURM_CONFIG": str(config)}

        def why() -> str:
            sink, reason = reports.sink_from_env(env)
            return f"{sink} {reason}"

        assert _as_nobody(why) == (f"None the spool {spool} (from {config} [daemon] spool_dir) "
                                   "is not writable by this job's user")
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_outside_a_job_nothing_is_said(monkeypatch, tmp_path, caplog):
    _job_env(monkeypatch, tmp_path)
    monkeypatch.delenv("SLURM_JOB_ID")
    monkeypatch.delenv("SLURM_JOBID", raising=False)
    assert reporter_from_env().sink is None
    assert _warnings(caplog) == []


def test_a_plain_loop_and_an_iterable_dataset_report_what_the_store_takes(tmp_path):
    """`step(samples=N)` without `epochs()`: the batch size was reported as 0 and every sample
    refused; an IterableDataset (no epoch length): its steps were reported as epochs done
    (3,000 steps of epoch 0 as epoch_progress 3000)."""
    torch = pytest.importorskip("torch")
    from torch.utils.data import DataLoader, IterableDataset

    from shockslurm.train import ShockTrainer
    from shockslurm.train.lease import Lease
    from shockslurm.train.records import validate

    sink = ListSink()
    model = torch.nn.Linear(1, 1)
    with ShockTrainer(model, None, ckpt_dir=tmp_path / "a", every_seconds=None,
                      report_interval_s=0.0, lease=Lease(stop_file=False),
                      reporter=Reporter(sink, job_id=1, min_interval_s=0.0)) as st:
        for _ in range(3):
            st.step(samples=64)
    plain = [r for r in sink.got if r["kind"] == "throughput"]
    assert plain and all(r["batch_size"] == 64 and "epoch_progress" not in r for r in plain)
    for r in plain:
        validate(r)

    class Stream(IterableDataset):
        def __iter__(self):
            return iter(range(300 * 8))

    sink = ListSink()
    with ShockTrainer(model, None, ckpt_dir=tmp_path / "b", every_seconds=None,
                      report_interval_s=0.0, lease=Lease(stop_file=False),
                      reporter=Reporter(sink, job_id=1, min_interval_s=0.0)) as st:
        for _ in st.epoch_range(1):
            for _k, _batch in st.batches(DataLoader(Stream(), batch_size=8)):
                st.step()
    stream = [r for r in sink.got if r["kind"] == "throughput"]
    assert stream and all(r["batch_size"] == 8 and "epoch_progress" not in r for r in stream)
    for r in stream:
        validate(r)

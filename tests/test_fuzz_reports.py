"""Fuzz `shockslurm.reports.ingest.ingest_spool` with spool directories of random report files.

Contract: it never raises; every malformed file leaves the spool for `<spool>.rejected/` (a
`.reason`, and a copy when it was not too large to read);
every good one is ingested and deleted.
"""

from __future__ import annotations

import json
import logging
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from sqlalchemy import select
from sqlalchemy.orm import Session

from shockslurm.reports.ingest import ingest_spool
from shockslurm.reports.spool_read import MAX_REPORT_BYTES
from shockslurm.store import repository as repo
from shockslurm.store.database import open_store
from shockslurm.store.models import BatchSizeChange, Checkpoint, JobEvent, ThroughputSample
from shockslurm.train.records import derive_key, sign, signature, validate

FUZZ = settings(deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much,
                                       HealthCheck.function_scoped_fixture])
JOB_ID = 42
KEY = derive_key("00112233445566778899aabbccddeeff")   # the job's registered report key


@pytest.fixture(scope="module")
def store():
    """One SQLite store for the module (creating one per example would dominate the run time)."""
    with tempfile.TemporaryDirectory(prefix="shockfuzz-store-") as tmp:
        engine = open_store(f"sqlite:///{Path(tmp) / 'store.db'}", create=True)
        with Session(engine) as s:
            job = repo.register_submitted_job(s, "slurm", job_id=JOB_ID, submit_s=1.0e9,
                                              model="MLP", epochs=4, samples_per_epoch=2048,
                                              batch_sizes=[32, 64], gang_size=1,
                                              report_key=KEY)
            s.commit()
            job_pk = job.id
        yield engine, job_pk
        engine.dispose()


def _rows(engine) -> int:
    with Session(engine) as s:
        return sum(repo.count(s, m) for m in (ThroughputSample, BatchSizeChange, Checkpoint,
                                              JobEvent))


EPOCH_KEYS = ("epoch", "step", "batch_size", "epochs")


def _key(r: dict) -> tuple:
    """What identifies a report's row: kind, time and content (a second copy is a replay)."""
    content = {"throughput": ("samples_per_s", "batch_size"),
               "batch_size_change": ("old_batch_size", "new_batch_size"),
               "checkpoint": ("step", "path")}.get(r["kind"])
    if content is None:
        return ("epoch_done", float(r["time_s"]),
                json.dumps({k: r[k] for k in EPOCH_KEYS if k in r}, sort_keys=True))
    return (r["kind"], float(r["time_s"])) + tuple(
        float(r[k]) if k == "samples_per_s" else r[k] for k in content)


def _stored(engine) -> set[tuple]:
    """The `_key` of every row a report made."""
    with Session(engine) as s:
        out = {("throughput", x.time_s, x.samples_per_s, x.batch_size)
               for x in s.scalars(select(ThroughputSample))}
        out |= {("batch_size_change", x.time_s, x.old_batch_size, x.new_batch_size)
                for x in s.scalars(select(BatchSizeChange))}
        out |= {("checkpoint", x.time_s, x.step, x.path) for x in s.scalars(select(Checkpoint))}
        out |= {("epoch_done", x.time_s, json.dumps(json.loads(x.detail), sort_keys=True))
                for x in s.scalars(select(JobEvent).where(JobEvent.kind == "epoch_done"))}
    return out


GOOD = {
    "throughput": {"samples_per_s": 512.0, "batch_size": 32, "gpus": 1, "epoch": 0, "step": 10,
                   "epoch_progress": 0.25},
    "batch_size_change": {"old_batch_size": 32, "new_batch_size": 64, "epoch": 1, "step": 64},
    "checkpoint": {"path": "/ck/ckpt-000000000050.pt", "step": 50, "ok": True},
    "epoch_done": {"epoch": 0, "step": 64, "batch_size": 32, "epochs": 4},
}
ANY = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True),
              st.text(max_size=8), st.sampled_from([2**63, -(2**63) - 1, 2**70, 10**400, "\ud800",
                                                    "a\x00b", 1e308, -0.0])),
    lambda inner: st.one_of(st.lists(inner, max_size=3),
                            st.dictionaries(st.text(max_size=4), inner, max_size=3)),
    max_leaves=6)


@st.composite
def reports(draw) -> dict:
    kind = draw(st.sampled_from(sorted(GOOD)))
    report = {"v": 1, "kind": kind, "cluster": "slurm", "job_id": JOB_ID,
              "time_s": draw(st.floats(min_value=0, max_value=2e9)), **GOOD[kind]}
    hostile = draw(st.booleans())
    if hostile and draw(st.booleans()):          # a hostile field, then signed
        key = draw(st.sampled_from(sorted(report) + ["job_pk", "extra"]))
        report[key] = draw(ANY)
        hostile = False
    sign(report, KEY)
    if hostile:                                  # a field changed after signing (or the sig)
        key = draw(st.sampled_from(sorted(report) + ["job_pk", "extra"]))
        report[key] = draw(ANY)
    return report


FILES = st.one_of(
    reports().map(lambda r: json.dumps(r).encode("utf-8")),          # good or hostile field
    reports().map(lambda r: json.dumps(r).encode("utf-8")[:-3]),     # truncated
    st.binary(max_size=40),
    ANY.map(lambda v: json.dumps(v).encode("utf-8")),
    st.sampled_from([b"", b"{", b"[" * 100_000, b"1" * 5000, b'{"v": 1, "time_s": ' + b"9" * 5000
                     + b"}", b"\xff\xfe\x00", b"NaN", b'{"v": 1e999}']))


def _good(content: bytes, job_pk: int) -> bool:
    """Whether the file should be ingested: valid by `validate`, storable, and our job."""
    try:
        report = validate(json.loads(content.decode("utf-8")))
    except (ValueError, RecursionError):
        return False
    try:
        if report.get("sig") != signature(report, KEY):
            return False                         # unsigned, or changed after signing
    except (ValueError, RecursionError):
        return False
    if isinstance(report.get("job_pk"), int) and not isinstance(report["job_pk"], bool):
        return report["job_pk"] == job_pk        # job_pk wins over job_id when given
    return report.get("job_id") == JOB_ID and report.get("cluster", "slurm") in ("slurm", "")


@settings(FUZZ, max_examples=80)
@given(files=st.lists(FILES, min_size=1, max_size=5))
@example(files=[json.dumps({"v": 1, "kind": "checkpoint", "job_id": JOB_ID, "time_s": 1.0,
                            "path": "p", "step": 2**70, "ok": True}).encode()])   # OverflowError
@example(files=[json.dumps({"v": 1, "kind": "checkpoint", "job_id": 2**70, "time_s": 1.0,
                            "path": "p", "step": 1, "ok": True}).encode()])
@example(files=[json.dumps({"v": 1, "kind": "checkpoint", "job_id": JOB_ID, "time_s": 10**400,
                            "path": "p", "step": 1, "ok": True}).encode()])
@example(files=[json.dumps({"v": 1, "kind": "checkpoint", "job_id": JOB_ID, "time_s": 1.0,
                            "path": "\ud800", "step": 1, "ok": True}).encode()])  # UnicodeEncode
@example(files=[b"[" * 100_000, b"1" * 5000])          # RecursionError, ValueError (digits)
@example(files=[b'{"v": 1, "kind": [], "job_id": 42, "time_s": 0.0}'])  # TypeError: unhashable
def test_ingest_random_spools(store, files):
    engine, job_pk = store
    spool = Path(tempfile.mkdtemp(prefix="shockfuzz-spool-"))
    names = [f"{i:04d}-r.json" for i in range(len(files))]
    for name, content in zip(names, files):
        (spool / name).write_bytes(content)
    before, _stored_before = _rows(engine), _stored(engine)
    logging.getLogger("shockslurm.reports").disabled = True
    try:
        n = ingest_spool(spool, engine)
    finally:
        logging.getLogger("shockslurm.reports").disabled = False
    good, seen = set(), _stored_before
    for name, content in zip(names, files):     # in ingest order: a later copy is a replay
        if _good(content, job_pk):
            key = _key(json.loads(content))
            if key not in seen:
                good.add(name)
                seen.add(key)
    assert n == len(good)
    assert _rows(engine) >= before + n
    left = {p.name for p in spool.iterdir() if p.is_file()}
    assert left == set(), left                     # good ones deleted, bad ones moved
    rejected = Path(f"{spool}.rejected")
    reasons = {p.name[:-len(".reason")]: p for p in rejected.glob("*.json.reason")}
    assert set(reasons) == set(names) - good
    for name, content in zip(names, files):
        if name in reasons:
            assert reasons[name].read_text().strip()
            copy = rejected / name          # a copy of what was read; none when too large
            assert (copy.read_bytes() == content if len(content) <= MAX_REPORT_BYTES
                    else not copy.exists())
    assert ingest_spool(spool, engine) == 0

"""Plain `sbatch` jobs' reports (`reports/owned.py`): an unsigned report of an unregistered job is
accepted when the spool file's owner uid is the uid Slurm gives the job's user, and only then;
a shocksub job (report key registered) still needs its signature. Files are really chowned
(the tests run as root, as the daemon does)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session

from shockslurm.reports.ingest import SpoolIngest
from shockslurm.reports.owned import SlurmOwner
from shockslurm.store import open_store
from shockslurm.store import repository as repo
from shockslurm.store.models import Job, ThroughputSample
from shockslurm.train.records import derive_key

from .conftest import REQUIRE_ALL

# CI runs as root: there (SHOCKSLURM_REQUIRE_ALL=1) these tests run, and fail rather than skip.
if os.geteuid() != 0 and not REQUIRE_ALL:
    pytest.skip("needs root to chown spool files to other users (CI runs as root)",
                allow_module_level=True)

ALICE, BOB = 12345, 23456
OWNERS = {50: SlurmOwner(ALICE, "alice", 1e9 + 50, "shock:managed", 2),
          10: SlurmOwner(ALICE, "alice", 1e9 + 10, "shock:managed", 1)}


@pytest.fixture
def engine(tmp_path):
    engine = open_store(f"sqlite:///{tmp_path / 'store.db'}", create=True)
    with Session(engine) as s, s.begin():       # job 10 was submitted with shocksub (signed)
        repo.register_submitted_job(s, "slurm", job_id=10, submit_s=1e9 + 10, model="m",
                                    epochs=2, samples_per_epoch=100, batch_sizes=[32],
                                    gang_size=1, owner="alice", report_key=derive_key("a1" * 16))
    yield engine
    engine.dispose()


def _report(job_id: int, t: float = 1.7e9, **more) -> dict:
    r = {"v": 1, "kind": "throughput", "cluster": "slurm", "job_id": job_id, "job_pk": None,
         "time_s": t,
         "samples_per_s": 100.0, "batch_size": 32, "gpus": 1}
    r.update(more)
    return r


def _put(spool: Path, name: str, report: dict, uid: int) -> None:
    path = spool / f"{name}.json"
    path.write_text(json.dumps(report))
    os.chown(path, uid, uid)


def _ingest(tmp_path: Path, engine, files: dict[str, tuple[dict, int]]) -> tuple[int, list]:
    spool = tmp_path / "spool"
    spool.mkdir(exist_ok=True)
    spool.chmod(0o1733)
    for name, (report, uid) in files.items():
        _put(spool, name, report, uid)
    n = SpoolIngest(str(spool), owners=dict(OWNERS)).run(engine)
    reasons = sorted(p.read_text() for p in (tmp_path / "spool.rejected").glob("*.reason"))
    return n, reasons


def test_the_jobs_user_reports_for_it_and_the_job_is_registered(tmp_path, engine):
    n, reasons = _ingest(tmp_path, engine, {"a": (_report(50), ALICE)})
    assert (n, reasons) == (1, [])
    with Session(engine) as s:
        job = s.scalar(select(Job).where(Job.job_id == 50))
        assert (job.owner, job.report_key, job.submit_s, job.gang_size) == ("alice", None,
                                                                            1e9 + 50, 2)
        assert [x.samples_per_s for x in s.scalars(select(ThroughputSample))] == [100.0]
    # a copy of the same report (a replay) is refused; a later one is kept
    n, reasons = _ingest(tmp_path, engine, {"b": (_report(50), ALICE),
                                            "c": (_report(50, t=1.7e9 + 5), ALICE)})
    assert n == 1 and len(reasons) == 1 and "replayed" in reasons[0], reasons


def test_no_one_else_reports_for_the_job(tmp_path, engine):
    n, reasons = _ingest(tmp_path, engine, {
        "bob": (_report(50), BOB),                              # another user's file
        "gone": (_report(77), ALICE),                           # no such active job
        "signed": (_report(50, sig="x" * 88), ALICE),           # signed: the key rule judges
        "other-cluster": (_report(50, cluster="elsewhere"), ALICE),
        "shocksub": (_report(10), ALICE),                       # registered with a key
        "by-pk": (_report(50, job_pk=1), ALICE),                # names a store key instead
    })
    assert n == 0 and len(reasons) == 6, reasons
    assert all("no registered job" in r or "unsigned report" in r for r in reasons), reasons
    with Session(engine) as s:
        assert s.scalar(select(Job).where(Job.job_id == 50)) is None
        assert list(s.scalars(select(ThroughputSample))) == []


def test_a_jobs_last_reports_after_it_ended_are_still_its_owners():
    from shockslurm.reports.owned import RecentOwners

    recent = RecentOwners(memory_s=600)
    assert recent.update({50: OWNERS[50]}, now=1000.0) == {50: OWNERS[50]}
    assert recent.update({}, now=1500.0) == {50: OWNERS[50]}     # ended: still known
    assert recent.update({}, now=1601.0) == {}                   # forgotten after 10 minutes

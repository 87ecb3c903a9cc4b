"""Signed training reports: a job's reports are accepted only with the signature of the key
registered for THAT job; another job's id, a wrong or missing secret, or a field changed after
signing is refused (kept in `<spool>.rejected/` with the reason, a warning naming the claimed
job), and the secret never reaches a log, a spool file or the store in clear."""

from __future__ import annotations

import json
import logging
import os
import re
import stat
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from sqlalchemy import select, text
from sqlalchemy.orm import Session

from shockslurm.cli import shocksub
from shockslurm.reports.ingest import ingest_spool
from shockslurm.store import open_store
from shockslurm.store import repository as repo
from shockslurm.store.models import Checkpoint, Job, ThroughputSample
from shockslurm.train.records import BadReport, check_report, derive_key, sign
from shockslurm.train.reports import Reporter, SpoolSink, StoreSink

ALICE, BOB = "a1" * 16, "b2" * 16          # the secrets shocksub gave jobs 10 and 20


@pytest.fixture
def store(tmp_path):
    url = f"sqlite:///{tmp_path / 'store.db'}"
    engine = open_store(url, create=True)
    with Session(engine) as s, s.begin():
        for job_id, secret in ((10, ALICE), (20, BOB), (30, None)):
            repo.register_submitted_job(s, "slurm", job_id=job_id, submit_s=1e9 + job_id,
                                        model="m", epochs=2, samples_per_epoch=100,
                                        batch_sizes=[32], gang_size=1,
                                        report_key=derive_key(secret) if secret else None)
    yield url, engine
    engine.dispose()


def _report(job_id=10, **more):
    r = {"v": 1, "kind": "throughput", "cluster": "slurm", "job_id": job_id, "job_pk": None,
         "time_s": 1.7e9, "samples_per_s": 100.0, "batch_size": 32, "gpus": 1}
    r.update(more)
    return r


def _spool(tmp_path, reports):
    spool = tmp_path / "spool"
    spool.mkdir(exist_ok=True)
    for name, r in reports.items():
        (spool / f"{name}.json").write_text(json.dumps(r))
    return spool


def _samples(engine):
    with Session(engine) as s:
        return [(s.get(Job, x.job_pk).job_id, x.samples_per_s)
                for x in s.scalars(select(ThroughputSample))]


def test_good_signed_report_accepted_through_the_reporter(store, tmp_path):
    url, engine = store
    spool = tmp_path / "spool"
    rep = Reporter(SpoolSink(spool), job_id=10, min_interval_s=0.0, secret=ALICE)
    rep.throughput(321.0, 32, gpus=1)
    rep.checkpoint("/ck/a.pt", 5)
    rep.close()
    files = list(spool.glob("*.json"))
    assert files and all("sig" in json.loads(f.read_text()) for f in files)
    assert all(ALICE not in f.read_text() for f in files)
    assert ingest_spool(spool, engine) == 2
    assert _samples(engine) == [(10, 321.0)]


def test_spoofed_reports_are_refused_moved_aside_and_logged(store, tmp_path, caplog):
    url, engine = store
    bob_key = derive_key(BOB)
    tampered = sign(_report(10), derive_key(ALICE))
    tampered["samples_per_s"] = 1e9                      # inflate after signing
    reports = {
        "a-wrong-secret": sign(_report(10), derive_key("c3" * 16)),
        "b-other-jobs-id": sign(_report(10), bob_key),    # Bob claims Alice's job
        "c-other-jobs-pk": sign(_report(None, job_pk=1), bob_key),
        "d-missing-sig": _report(10),
        "e-tampered": tampered,
        "f-sig-not-a-string": {**_report(10), "sig": 12345},
        "g-unregistered": sign(_report(99), bob_key),
        "h-legacy-unsigned": _report(30),                 # registered without a key
        "i-good-bob": sign(_report(20, samples_per_s=7.0), bob_key),
    }
    spool = _spool(tmp_path, reports)
    with caplog.at_level(logging.WARNING, logger="shockslurm.reports"):
        assert ingest_spool(spool, engine) == 1
    assert _samples(engine) == [(20, 7.0)]
    rejected = Path(f"{spool}.rejected")
    moved = {p.stem for p in rejected.glob("*.json")}
    assert moved == set(reports) - {"i-good-bob"}
    reasons = {name: (rejected / f"{name}.json.reason").read_text() for name in moved}
    assert "bad signature" in reasons["a-wrong-secret"]
    assert "bad signature" in reasons["b-other-jobs-id"] and "job_id 10" in reasons[
        "b-other-jobs-id"]
    assert "bad signature" in reasons["c-other-jobs-pk"]
    assert "unsigned" in reasons["d-missing-sig"] and "unsigned" in reasons["f-sig-not-a-string"]
    assert "bad signature" in reasons["e-tampered"]
    assert "no registered job" in reasons["g-unregistered"]
    assert "allow_unsigned_reports" in reasons["h-legacy-unsigned"]
    for name in moved:                                   # logged, naming the claimed job
        assert any(name in m and "job_id" in m for m in caplog.messages), name
    for secret in (ALICE, BOB):
        assert secret not in caplog.text
        assert all(secret not in r for r in reasons.values())


def test_a_copy_of_an_ingested_report_is_refused_as_a_replay(store, tmp_path, caplog):
    """A signed report stays valid; a copy delivered again (taken from a shared spool, or a
    re-ingest after a crash between commit and unlink) adds no row and is moved aside."""
    url, engine = store
    key = derive_key(ALICE)
    old = sign(_report(10, time_s=1.7e9, samples_per_s=50.0), key)
    assert ingest_spool(_spool(tmp_path, {"1-old": old}), engine) == 1
    newer = sign(_report(10, time_s=1.7e9 + 60, samples_per_s=400.0), key)
    same_time_other = sign(_report(10, time_s=1.7e9, samples_per_s=51.0), key)  # not a copy
    spool = _spool(tmp_path, {"2-newer": newer, "3-replayed": old, "4-other": same_time_other,
                              "5-twice": newer})
    with caplog.at_level(logging.WARNING, logger="shockslurm.reports"):
        assert ingest_spool(spool, engine) == 2
    assert sorted(_samples(engine)) == [(10, 50.0), (10, 51.0), (10, 400.0)]
    moved = {p.stem for p in Path(f"{spool}.rejected").glob("*.json")}
    assert moved == {"3-replayed", "5-twice"}
    for name in moved:
        reason = (Path(f"{spool}.rejected") / f"{name}.json.reason").read_text()
        assert "replayed report" in reason and "job_id 10" in reason
    assert ALICE not in caplog.text
    # the direct store path goes through the same gate
    with Session(engine) as s:
        with pytest.raises(BadReport, match="replayed"):
            check_report(s, old)


def test_unsigned_reports_of_keyless_jobs_only_with_the_switch(store, tmp_path):
    url, engine = store
    spool = _spool(tmp_path, {"legacy": _report(30), "alice-unsigned": _report(10)})
    assert ingest_spool(spool, engine, allow_unsigned=True) == 1      # only the keyless job
    assert _samples(engine) == [(30, 100.0)]
    assert {p.stem for p in Path(f"{spool}.rejected").glob("*.json")} == {"alice-unsigned"}


def test_direct_store_reports_go_through_the_same_check(store):
    url, engine = store
    good = Reporter(StoreSink(url), job_id=10, min_interval_s=0.0, secret=ALICE)
    good.throughput(5.0, 32, gpus=1)
    good.close()
    spoof = Reporter(StoreSink(url), job_id=10, min_interval_s=0.0, secret=BOB)
    spoof.throughput(9e9, 32, gpus=1)
    spoof.close()
    unsigned = Reporter(StoreSink(url), job_id=10, min_interval_s=0.0, secret="")
    unsigned.throughput(9e9, 32, gpus=1)
    unsigned.close()
    assert (good.sent, spoof.failed, unsigned.failed) == (1, 1, 1)
    assert _samples(engine) == [(10, 5.0)]
    with Session(engine) as s, pytest.raises(BadReport, match="bad signature"):
        check_report(s, sign(_report(10), derive_key(BOB)))


def test_the_secret_is_never_stored_in_clear(store, tmp_path, monkeypatch):
    url, engine = store
    rep = Reporter(StoreSink(url), job_id=20, min_interval_s=0.0, secret=BOB)
    rep.checkpoint("/ck/b.pt", 1)
    rep.close()
    with engine.connect() as conn:
        dump = "\n".join(str(row) for t in ("jobs", "checkpoints", "job_events",
                                            "throughput_samples")
                         for row in conn.execute(text(f"SELECT * FROM {t}")))
    assert BOB not in dump and ALICE not in dump and derive_key(BOB) in dump
    with Session(engine) as s:
        assert s.scalars(select(Checkpoint)).one().path == "/ck/b.pt"


def test_shocksub_puts_the_secret_in_the_0600_script_and_only_its_key_in_the_store(
        tmp_path, monkeypatch):
    """A fake sbatch (prints a job id) stands in for Slurm."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    argv_log = tmp_path / "argv"
    fake = bindir / "sbatch"
    fake.write_text(f"#!/bin/sh\necho \"$@\" > {argv_log}\necho 4242\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    db = f"sqlite:///{tmp_path / 'reg.db'}"
    scripts = tmp_path / "scripts"
    result = CliRunner().invoke(shocksub.main, [
        "--model", "ResNet-18", "--epochs", "2", "--db", db, "--script-dir", str(scripts),
        "--", sys.executable, "train.py"])
    assert result.exit_code == 0, result.output
    (script,) = scripts.glob("*.sbatch")
    assert stat.S_IMODE(script.stat().st_mode) == 0o600
    line = next(ln for ln in script.read_text().splitlines()
                if ln.startswith("export SHOCKSLURM_REPORT_SECRET="))
    secret = line.split("=", 1)[1]
    assert re.fullmatch(r"ed25519:[A-Za-z0-9_-]{43}", secret), secret
    assert secret not in argv_log.read_text() and secret not in result.output
    engine = open_store(db)
    try:
        with Session(engine) as s:
            job = s.scalars(select(Job).where(Job.job_id == 4242)).one()
            assert job.report_key == derive_key(secret) and job.report_key != secret
            assert job.report_key.startswith("ed25519:")        # the public key only
    finally:
        engine.dispose()
    # a dry run shows no secret at all
    dry = CliRunner().invoke(shocksub.main, ["--dry-run", "--model", "ResNet-18", "--epochs",
                                             "2", "--", "python", "t.py"])
    assert "export SHOCKSLURM_REPORT_SECRET=dry-run-no-secret" in dry.output


def test_ed25519_reports_cannot_be_forged_from_what_the_store_holds(tmp_path):
    """shocksub's secrets are Ed25519 private keys and the store keeps only the public key: a
    report signed with what the store holds (the registered key, read from the database or a
    backup) is refused, unlike with the legacy HMAC keys, while the job's own reports pass."""
    from shockslurm.slurm.job_script import new_report_secret as new_secret
    from shockslurm.train.records import signing_key

    carol = new_secret()
    engine = open_store(f"sqlite:///{tmp_path / 'ed.db'}", create=True)
    try:
        with Session(engine) as s, s.begin():
            repo.register_submitted_job(s, "slurm", job_id=40, submit_s=1e9, model="m",
                                        epochs=2, samples_per_epoch=100, batch_sizes=[32],
                                        gang_size=1, report_key=derive_key(carol))
        with Session(engine) as s:
            stored = s.scalar(select(Job.report_key).where(Job.job_id == 40))
            assert stored.startswith("ed25519:") and carol not in stored
            assert check_report(s, sign(_report(40), signing_key(carol)))
            with pytest.raises(BadReport, match="bad signature"):
                check_report(s, sign(_report(40, samples_per_s=9e9), stored))   # a store reader
            with pytest.raises(BadReport, match="bad signature"):
                check_report(s, sign(_report(40), signing_key(new_secret())))  # another job's
            tampered = sign(_report(40), signing_key(carol))
            tampered["batch_size"] = 64
            with pytest.raises(BadReport, match="bad signature"):
                check_report(s, tampered)
            for junk in ("zz", "00" * 64, ""):
                with pytest.raises(BadReport):
                    check_report(s, {**_report(40), "sig": junk})
        # through the helper and the spool, as a job sends them
        spool = tmp_path / "spool"
        rep = Reporter(SpoolSink(spool), job_id=40, min_interval_s=0.0, secret=carol)
        rep.throughput(123.0, 32, gpus=1)
        rep.close()
        assert all(carol not in f.read_text() for f in spool.glob("*.json"))
        assert ingest_spool(spool, engine) == 1
    finally:
        engine.dispose()

"""Every value a job supplies is validated and bounded (`shockslurm.limits`).

Property tests fuzz job specs (in the comment, and registered in the store) and training reports
with extreme values (inf, NaN, 1e300, 1e400, negatives, 2**63, huge lists and strings, wrong
types, bools, nested junk). Contract: the validation raises nothing but its own error
(`BadSpec`, `BadReport`); what it accepts is within the caps; and the journal (a real SQLite
store and a real PostgreSQL) stores every job row and report row that results. Then one daemon
round beside the issue's hostile jobs: the normal job starts, each hostile one is flagged once
and stays held, no outage, no exception.
"""

from __future__ import annotations

import itertools
import json
import logging
import math
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st
from sqlalchemy import select, text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session

from shockslurm import limits
from shockslurm.daemon import DaemonRunner
from shockslurm.daemon.journal import StoreJournal
from shockslurm.model import ADAPTATION_MODES, RoundPlan, Snapshot
from shockslurm.live.journaling import LiveJob
from shockslurm.live.specs import (DEFAULT_SPEC, BadSpec, LiveSpec, job_spec, spec_from_comment,
                                    spec_from_mapping)
from shockslurm.slurm.submit import JobRequest
from shockslurm.slurm.types import JobState, has_managed_tag
from shockslurm.store import repository as repo
from shockslurm.store.database import open_store
from shockslurm.store.models import Job, JobEvent
from shockslurm.train.records import BOUNDS, BadReport, add_rows, validate

from .test_crash_safety import Backend, daemon
from .test_enact import job
from .test_store import store_url  # noqa: F401  (the fixture: SQLite, and PostgreSQL)

FUZZ = settings(deadline=None, derandomize=True, database=None, max_examples=200,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much,
                                       HealthCheck.function_scoped_fixture])

EXTREME = st.sampled_from([
    math.inf, -math.inf, math.nan, 1e300, -1e300, 1e308, 5e-324, 1e9, 1e6, 1e6 + 1, 1e12 + 1,
    2 ** 24 + 1, 2 ** 31, 2 ** 63, 2 ** 63 - 1, -(2 ** 63) - 1, 2 ** 64, 10 ** 30, -1, 0, -0.0,
    0.5, 10.0, True, False, None, "", "10", "x" * 5000, "\ud800", "a\x00b", "a\nb", "Résumé",
    [], {}, [[[]]], {"a": {"b": [1]}}, list(range(1, 200)), [math.nan], [1e400],
    [True, 2], [-4, 8], ["32"], [2 ** 63]])
JUNK = st.recursive(st.one_of(EXTREME, st.integers(), st.floats(), st.text(max_size=12)),
                    lambda inner: st.one_of(st.lists(inner, max_size=4),
                                            st.dictionaries(st.text(max_size=4), inner,
                                                            max_size=3)),
                    max_leaves=8)
VALID = {
    "model": st.sampled_from(["ResNet-18", "LM", "my-model_2.0", "unknown"]),
    "epochs": st.integers(1, limits.MAX_EPOCHS),
    "samples_per_epoch": st.integers(1, limits.MAX_SAMPLES_PER_EPOCH),
    "batch_sizes": st.lists(st.integers(1, limits.MAX_BATCH_SIZE), min_size=1, max_size=8),
    "batch_size": st.integers(1, limits.MAX_BATCH_SIZE),
    "mode": st.sampled_from(ADAPTATION_MODES),
    "epoch_seconds": st.floats(limits.MIN_EPOCH_SECONDS, limits.MAX_EPOCH_SECONDS),
}


@st.composite
def raw_specs(draw) -> dict:
    """A spec mapping: a few keys extreme or junk, the others valid or absent; sometimes an
    unknown key."""
    hostile = draw(st.sets(st.sampled_from(sorted(VALID)), max_size=3))
    out = {}
    for key, valid in VALID.items():
        if key in hostile:
            out[key] = draw(st.one_of(EXTREME, JUNK))
        elif draw(st.booleans()):
            out[key] = draw(valid)
    if draw(st.booleans()):
        out[draw(st.text(max_size=6))] = draw(JUNK)
    return out


def assert_within_caps(spec: LiveSpec) -> None:
    assert limits.NAME_RE.fullmatch(spec.model)
    assert type(spec.epochs) is int and 1 <= spec.epochs <= limits.MAX_EPOCHS
    assert type(spec.samples_per_epoch) is int
    assert 1 <= spec.samples_per_epoch <= limits.MAX_SAMPLES_PER_EPOCH
    assert 1 <= len(spec.batch_sizes) <= limits.MAX_LADDER
    assert list(spec.batch_sizes) == sorted(set(spec.batch_sizes))
    for b in spec.batch_sizes + (spec.batch_size,):
        assert type(b) is int and 1 <= b <= limits.MAX_BATCH_SIZE
    assert spec.mode in ADAPTATION_MODES
    assert spec.epoch_seconds is None or (
        limits.MIN_EPOCH_SECONDS <= spec.epoch_seconds <= limits.MAX_EPOCH_SECONDS)


def checked(make) -> LiveSpec | None:
    """The spec, None for a `BadSpec` (with a message naming where); any other error fails."""
    try:
        spec = make()
    except BadSpec as exc:
        assert exc.source in ("comment", "store") and str(exc) and len(str(exc)) < 200
        event("BadSpec")
        return None
    assert_within_caps(spec)
    event("valid")
    return spec


# ------------------------------------------------------------------ specs: pure validation
@FUZZ
@given(raw=raw_specs(), source=st.sampled_from(["comment", "store"]))
@example(raw={"epochs": math.inf}, source="comment")
@example(raw={"epochs": math.nan}, source="comment")
@example(raw={"epochs": 1e9}, source="comment")
@example(raw={"samples_per_epoch": 1e300}, source="store")
@example(raw={"batch_sizes": list(range(1, 100_000))}, source="store")
def test_spec_mappings_are_valid_within_caps_or_refused(raw, source):
    checked(lambda: spec_from_mapping(raw, source))


def _comment_part(draw) -> str:
    kind = draw(st.sampled_from(["spec", "spec", "raw", "tag", "text"]))
    if kind == "spec":
        return "shock:spec=" + json.dumps(draw(raw_specs()))       # NaN, Infinity as JSON
    if kind == "raw":
        return "shock:spec=" + draw(st.sampled_from([
            '{"epochs":1e400}', '{"epochs":NaN}', '{"samples_per_epoch":1e300}',
            '{"epochs":-Infinity}', '{"epochs":' + "9" * 5000 + "}", "[" * 100_000, "{",
            '"just a string"', "null", "[1,2]", '{"batch_sizes":[' + "1," * 3000 + "1]}",
            "{}" + " " * 5000, '{"model":"a\\u0000b"}', '{"mode":["static"]}']))
    if kind == "tag":
        return draw(st.sampled_from(["shock:managed", " shock:managed\t", "xshock:managed"]))
    return draw(st.text(max_size=30))


@FUZZ
@given(data=st.data())
def test_comment_specs_are_valid_within_caps_or_refused(data):
    parts = [_comment_part(data.draw) for _ in range(data.draw(st.integers(0, 4)))]
    comment = ";".join(parts)
    checked(lambda: job_spec(comment, None))
    has_managed_tag(comment)          # a pure function of any text: never raises


def test_the_issues_comment_attacks_are_refused_naming_the_field():
    for text, field in (('{"epochs":1e400,"model":"LM"}', "epochs"),
                        ('{"epochs":NaN}', "epochs"), ('{"epochs":1e9}', "epochs"),
                        ('{"samples_per_epoch":1e300}', "samples_per_epoch"),
                        ("[" * 100_000, "shock:spec")):
        with pytest.raises(BadSpec) as err:
            job_spec(f"shock:spec={text};shock:managed", None)
        assert err.value.field == field and err.value.source == "comment"
        assert len(str(err.value)) < 200          # never echoes a huge value
    assert spec_from_comment("a;b") is None and job_spec("a", None) is DEFAULT_SPEC


@pytest.mark.parametrize("comment, managed", [
    ("shock:managed", True), ("a;shock:managed", True), (" shock:managed\t;x", True),
    ("x;\r\nshock:managed\n", True), ("x shock:managed", False), ("x\nshock:managed", False),
    ("shock:managedx", False), ("shock:managed\u00a0", False), ("shock:managed,x", False),
    ("", False), ("shock:spec={};shock:managed2", False)])
def test_the_managed_tag_rule(comment, managed):
    """One `;`-separated part equal to the tag once ASCII blanks (Lua's %s) are trimmed."""
    assert has_managed_tag(comment) is managed
    assert replace(job(1), comment=comment).managed is managed


@settings(FUZZ, max_examples=100)
@given(epochs=st.integers(1, limits.MAX_EPOCHS),
       samples=st.integers(1, limits.MAX_SAMPLES_PER_EPOCH),
       ladder=st.lists(st.integers(1, limits.MAX_BATCH_SIZE), min_size=1,
                       max_size=limits.MAX_LADDER, unique=True).map(lambda x: tuple(sorted(x))),
       epoch_seconds=st.one_of(st.none(), st.floats(limits.MIN_EPOCH_SECONDS,
                                                    limits.MAX_EPOCH_SECONDS)))
def test_every_spec_shocksub_accepts_the_daemon_accepts(epochs, samples, ladder, epoch_seconds):
    req = JobRequest(job_name="j", gpus=1, model="ResNet-18", epochs=epochs,
                     samples_per_epoch=samples, batch_sizes=ladder, batch_size=ladder[0],
                     command=("python", "t.py"), epoch_seconds=epoch_seconds)
    spec = job_spec(f"shock:spec={req.spec_json()};shock:managed", None)
    assert (spec.epochs, spec.samples_per_epoch, spec.batch_sizes) == (epochs, samples, ladder)


# ------------------------------------------------------------------ specs: into the journal
_ids = itertools.count(1)


def register_raw(engine, cluster: str, job_id: int, **values) -> None:
    """A registration with any values the store's columns take, as a client holding the
    store's password could write it (shocksub's `register_submitted_job` coerces the ladder)."""
    with Session(engine) as s, s.begin():
        row = repo.register_submitted_job(s, cluster, job_id=job_id, submit_s=1000.0 + job_id,
                                          model="LM", epochs=1, samples_per_epoch=1,
                                          batch_sizes=[1], gang_size=1)
        for key, value in values.items():
            setattr(row, key, value)


@pytest.fixture
def store(store_url):  # noqa: F811
    engine = open_store(store_url, create=True)
    yield engine
    engine.dispose()


@pytest.fixture
def journal(store):
    return StoreJournal(store, cluster="fuzz", policy="fifo")


def _slurm_job(job_id: int, comment: str = "shock:managed"):
    return replace(job(job_id), comment=comment)


@FUZZ
@given(raw=raw_specs())
@example(raw={"samples_per_epoch": 1e300})
@example(raw={"model": "x" * 200})
def test_the_journal_stores_the_job_row_of_any_spec(store, journal, raw):
    """Whatever the spec, the job row the daemon writes (the spec, or the defaults for a bad
    one, as `SlurmCluster._spec`) is stored and reads back unchanged."""
    spec = checked(lambda: spec_from_mapping(raw, "comment")) or DEFAULT_SPEC
    job_id = next(_ids)
    sj = _slurm_job(job_id)
    snap = Snapshot(now=1e9, round_index=job_id, round_s=60.0, gpus=32, jobs=())
    journal.begin_round(snap, RoundPlan(frozenset({job_id})), {job_id: LiveJob(sj, spec)})
    with Session(store) as s:
        row = s.scalars(select(Job).where(Job.run_id == journal.run_id,
                                          Job.job_id == job_id)).one()
        assert (row.model, row.epochs, row.samples_per_epoch, list(row.batch_sizes)) == (
            spec.model, spec.epochs, spec.samples_per_epoch, list(spec.batch_sizes))


@FUZZ
@given(epochs=st.one_of(VALID["epochs"], st.integers(-(2 ** 31), 2 ** 31 - 1),
                       st.sampled_from([0, -1])),
       samples=st.one_of(VALID["samples_per_epoch"], st.integers(-(2 ** 63), 2 ** 63 - 1)),
       ladder=st.one_of(VALID["batch_sizes"], JUNK),
       model=st.one_of(VALID["model"], st.text(max_size=100)))
def test_registered_specs_read_back_are_valid_within_caps_or_refused(store, journal, epochs,
                                                                     samples, ladder, model):
    """A registration `shocksub --db` (or anyone with the store's password) wrote, with any
    values the store holds: looked up and validated, never an exception out of the lookup."""
    if "\x00" in model or any("\ud800" <= c <= "\udfff" for c in model):
        model = "nul"                       # text the store cannot hold is not a registration
    job_id = next(_ids)
    try:
        register_raw(store, "fuzz", job_id, model=model, epochs=epochs,
                     samples_per_epoch=samples, batch_sizes=ladder)
    except DBAPIError:                      # the store refused it (PostgreSQL's JSON: NaN)
        event("refused by the store")
        return
    sj = _slurm_job(job_id)
    found = journal.lookup([sj])
    assert set(found) == {job_id}
    checked(lambda: job_spec(sj.comment, found[job_id]))


# ------------------------------------------------------------------ reports
GOOD_REPORTS = {
    "throughput": {"samples_per_s": 512.0, "batch_size": 32, "gpus": 1, "epoch": 0, "step": 10,
                   "epochs": 4, "step_in_epoch": 3, "steps_per_epoch": 64,
                   "epoch_progress": 0.25},
    "batch_size_change": {"old_batch_size": 32, "new_batch_size": 64, "epoch": 1, "step": 64},
    "checkpoint": {"path": "/ck/ckpt-000000000050.pt", "step": 50, "ok": True},
    "epoch_done": {"epoch": 0, "step": 64, "batch_size": 32, "epochs": 4},
}


@st.composite
def hostile_reports(draw) -> dict:
    kind = draw(st.sampled_from(sorted(GOOD_REPORTS)))
    report = {"v": 1, "kind": kind, "cluster": "fuzz", "job_id": 1,
              "time_s": draw(st.floats(0, 2e9)), **GOOD_REPORTS[kind]}
    for key in draw(st.lists(st.sampled_from(sorted(report) + ["extra"]), max_size=3)):
        report[key] = draw(st.one_of(EXTREME, JUNK))
    return report


@FUZZ
@given(report=hostile_reports())
@example(report={"v": 1, "kind": "throughput", "job_id": 1, "time_s": 1.0,
                 "samples_per_s": 1e300, "batch_size": 32, "gpus": 1})
@example(report={"v": 1, "kind": "throughput", "job_id": 1, "time_s": 1.0,
                 "samples_per_s": 10.0, "batch_size": 2 ** 40, "gpus": 1})
@example(report={"v": 1, "kind": "checkpoint", "job_id": 1, "time_s": 1.0,
                 "path": "a\x00b", "step": 1, "ok": True})
@example(report={"v": 1, "kind": "epoch_done", "job_id": 1, "time_s": 1.0,
                 "epoch": 10 ** 9, "step": 1})
def test_reports_are_bounded_or_refused_and_stored(store, report):
    """`validate` raises only `BadReport`; an accepted report has every bounded field within
    bounds, and its rows store (32-bit columns and text included, on PostgreSQL too)."""
    try:
        validate(report)
    except BadReport as exc:
        assert str(exc) and len(str(exc)) < 300
        event("BadReport")
        return
    event("stored")
    for field, check in BOUNDS.items():
        if field in report:
            check(report[field], field)      # raises if out of bounds
    with Session(store) as s, s.begin():
        pk = repo.register_submitted_job(s, "fuzz", job_id=next(_ids), submit_s=1.0,
                                         model="MLP", epochs=1, samples_per_epoch=1,
                                         batch_sizes=[1], gang_size=1).id
        add_rows(s, report, pk)


# ------------------------------------------------------------------ one round, hostile jobs
HOSTILE_COMMENTS = {
    11: 'shock:spec={"epochs":1e400,"model":"LM"};shock:managed',
    12: 'shock:spec={"epochs":NaN};shock:managed',
    13: 'shock:spec={"epochs":1e9};shock:managed',
    14: 'shock:spec={"samples_per_epoch":1e300};shock:managed',
    15: "shock:spec=" + "[" * 100_000 + ";shock:managed",
}


def test_hostile_specs_leave_other_jobs_scheduled_and_are_flagged_once(tmp_path, caplog):
    engine = open_store(f"sqlite:///{tmp_path / 's.db'}", create=True)
    # job 16: a registration no spec can come from
    register_raw(engine, "slurm", 16, batch_sizes={"x": [1e300]})
    hostile = [replace(job(i), comment=c) for i, c in HOSTILE_COMMENTS.items()]
    hostile.append(replace(job(16), comment="shock:managed"))
    released = replace(job(17), priority=1, reason="Resources",
                       comment='shock:spec={"epochs":-3};shock:managed')
    b = Backend([job(1, gpus=8)] + hostile + [released])
    runner = DaemonRunner(daemon(engine, b))
    caplog.set_level(logging.WARNING)
    for _ in range(2):
        assert runner.attempt() is None                # a round, not an outage
    assert runner.outages == {"slurm": 0, "store": 0}
    assert ("scontrol", "release", "1") in b.log       # the normal job started
    assert not any(a[1] == "release" and set(a[2].split(",")) - {"1"} for a in b.log)
    assert ("scontrol", "uhold", "17") in b.log         # a released bad one is held again
    hostile_ids = set(HOSTILE_COMMENTS) | {16, 17}
    warned = [r.getMessage() for r in caplog.records if "never scheduled" in r.getMessage()]
    assert len(warned) == len(hostile_ids)             # logged once each, over two rounds
    assert all("bad spec" in w and len(w) < 300 for w in warned)
    with Session(engine) as s:
        flagged = s.execute(select(Job.job_id, JobEvent.detail).join(
            JobEvent, JobEvent.job_pk == Job.id).where(JobEvent.kind == "flagged")).all()
    assert sorted(j for j, _ in flagged) == sorted(hostile_ids)    # once each
    reasons = {j: json.loads(d)["reason"] for j, d in flagged}
    assert "field 'epochs'" in reasons[13] and "1..1000000" in reasons[13]
    assert "field 'samples_per_epoch'" in reasons[14]
    assert "store, field 'batch_sizes'" in reasons[16]
    # a bad job that leaves the queue is forgotten (the memory of bad specs stays bounded)
    b._jobs = [replace(j, state=JobState.CANCELLED) if j.job_id == 13 else j for j in b._jobs]
    assert runner.attempt() is None
    bad = runner.daemon.cluster.bad_specs
    assert sorted(k[0] for k in bad) == sorted(hostile_ids - {13})
    engine.dispose()


@pytest.mark.parametrize("value, expected", [
    (3, 3.0), (2.5, 2.5), (-1e308, -1e308), (10 ** 308, 1e308),
    (math.nan, None), (math.inf, None), (-math.inf, None), (10 ** 400, None),
    (True, None), ("1", None), (None, None), ([1], None),
])
def test_one_finite_number_rule(value, expected):
    """`limits.finite`: the rule every finite-number check of the package takes (the config's
    keys, the store's runs, the Shockwave options, the trainer's seconds, the readers)."""
    assert limits.finite(value) == expected
    if expected is None and limits.is_real(value):
        with pytest.raises(limits.BadValue, match="finite"):
            limits.number(value, "x", -math.inf, math.inf)


def test_numpy_numbers_are_numbers():
    import numpy as np
    assert limits.finite(np.float32(1.5)) == 1.5 and limits.finite(np.int64(7)) == 7.0
    assert limits.finite(np.float64("nan")) is None


def test_a_registration_whose_json_is_no_json_is_that_jobs_problem(tmp_path):
    """A hand-edited SQLite store whose batch_sizes (or an intent's argv) holds text that is
    no JSON: the lookup hands the text back and the spec check refuses that job alone (it was
    a JSONDecodeError out of the lookup: a store outage, no rounds while the row existed)."""
    engine = open_store(f"sqlite:///{tmp_path / 'hand-edited.db'}", create=True)
    journal = StoreJournal(engine, cluster="fuzz", policy="fifo")
    bad, good = next(_ids), next(_ids)
    register_raw(engine, "fuzz", bad)
    register_raw(engine, "fuzz", good)
    with engine.begin() as conn:
        conn.execute(text("UPDATE jobs SET batch_sizes = '[32, 64' WHERE job_id = :j"),
                     {"j": bad})
    found = journal.lookup([_slurm_job(bad), _slurm_job(good)])
    assert found[bad]["batch_sizes"] == "[32, 64"
    assert found[good]["batch_sizes"] == [1]
    with pytest.raises(BadSpec, match="batch_sizes"):
        job_spec("shock:managed", found[bad])
    engine.dispose()

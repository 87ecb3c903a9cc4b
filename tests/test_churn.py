"""Churn bounds (`enact.ChurnLimits`): minimum run time, preemptions per day, jobs whose
checkpoints keep failing are flagged and left running; the starts that no longer fit are dropped,
never more GPUs than the cluster has; the state comes back after a daemon restart (Slurm's
start time and restart count, the store's intents and checkpoint reports)."""

from __future__ import annotations

import json
import logging
import random
from dataclasses import replace

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session

from shockslurm.model import RoundPlan
from shockslurm.reports.reported_progress import ReportedProgress
from shockslurm.live import enact as en
from shockslurm.live.enact import ChurnLimits, StopHistory, bound_plan, keep_reason
from shockslurm.live.cluster import SlurmCluster
from shockslurm.slurm.types import JobState
from shockslurm.store import open_store
from shockslurm.store import repository as repo
from shockslurm.store.models import JobEvent

from .test_enact import job
from .test_live import FakeBackend

NOW = 1.7e9
LIMITS = ChurnLimits(min_run_seconds=180.0, max_preemptions_per_day=24,
                     max_stops_without_checkpoint=3)


def running(job_id: int, *, ran: float = 900.0, restarts: int = 0, gpus: int = 8):
    return replace(job(job_id, JobState.RUNNING, restarts=restarts, gpus=gpus),
                   start_time=NOW - ran, submit_time=NOW - 10_000 + job_id)


def pending(job_id: int, *, gpus: int = 8, held: bool = True):
    j = job(job_id, JobState.PENDING, gpus=gpus, priority=None if held else 1000)
    return replace(j, submit_time=NOW - 10_000 + job_id)


# ------------------------------------------------------------------ the pure rules
def test_min_run_time_from_slurm_start_time():
    assert keep_reason(running(1, ran=100), StopHistory(), LIMITS, NOW)[0] == "min_run"
    assert keep_reason(running(1, ran=180), StopHistory(), LIMITS, NOW) is None
    assert keep_reason(replace(running(1), start_time=None), StopHistory(), LIMITS, NOW) is None
    off = replace(LIMITS, min_run_seconds=0)
    assert keep_reason(running(1, ran=1), StopHistory(), off, NOW) is None


def test_default_min_run_is_one_and_a_half_rounds_and_finish_window_two_rounds():
    assert ChurnLimits.for_round(120).min_run_seconds == 180
    assert ChurnLimits.for_round(120).finish_window_seconds == 240
    assert ChurnLimits.for_round(6, max_preemptions_per_day=5) == ChurnLimits(9.0, 5, 3, 12.0)
    assert ChurnLimits.for_round(6, finish_window_seconds=0).finish_window_seconds == 0


def test_preemptions_per_day_counted_in_24_h_and_capped_by_restart_count():
    day = [NOW - 3600 * k - 1 for k in range(24)]          # 24 in the last day
    h = StopHistory(preemptions=tuple(sorted(day)))
    assert keep_reason(running(1, restarts=30), h, LIMITS, NOW)[0] == "max_per_day"
    # Slurm says it was requeued only 5 times: the extra intents did not preempt it
    assert keep_reason(running(1, restarts=5), h, LIMITS, NOW) is None
    # older than a day: not counted
    old = StopHistory(preemptions=tuple(t - 86_400 for t in day))
    assert keep_reason(running(1, restarts=48), old, LIMITS, NOW) is None
    h23 = StopHistory(preemptions=tuple(sorted(day[:23])))
    assert keep_reason(running(1, restarts=23), h23, LIMITS, NOW) is None


def test_stop_cycles_without_checkpoint():
    p = (100.0, 200.0, 300.0)
    assert en.stops_without_checkpoint(StopHistory(p, True, None)) == 3
    assert en.stops_without_checkpoint(StopHistory(p, True, 295.0)) == 0   # last stop's ckpt ok
    assert en.stops_without_checkpoint(StopHistory(p, True, 195.0)) == 1
    assert en.stops_without_checkpoint(StopHistory(p, True, 95.0)) == 2
    assert en.stops_without_checkpoint(StopHistory(p, True, 50.0)) == 2   # in the first run
    assert en.stops_without_checkpoint(StopHistory((), True, None)) == 0


def test_flagged_when_checkpoints_keep_failing_only_for_reporting_jobs():
    j = running(1, restarts=3)
    three = (NOW - 3000, NOW - 2000, NOW - 1000)
    assert keep_reason(j, StopHistory(three, True, None), LIMITS, NOW)[0] == "flagged"
    assert keep_reason(j, StopHistory(three, True, NOW - 1010), LIMITS, NOW) is None
    assert keep_reason(j, StopHistory(three[1:], True, None), LIMITS, NOW) is None
    # ok=false three times in a row: flagged even before three stops
    assert keep_reason(j, StopHistory((), True, NOW - 5000, failed_checkpoints=3), LIMITS,
                       NOW)[0] == "flagged"
    # a job that sends no reports is never flagged (the daemon cannot tell)
    assert keep_reason(j, StopHistory(three * 3, False, None), LIMITS, NOW) is None
    # flagging wins over the other rules, so it is recorded even for a young run
    young = running(1, ran=5, restarts=3)
    assert keep_reason(young, StopHistory(three, True, None), LIMITS, NOW)[0] == "flagged"


def test_bound_plan_drops_lowest_priority_starts_that_no_longer_fit():
    jobs = [running(1, gpus=16), running(2, gpus=8), pending(3, gpus=8), pending(4, gpus=8),
            pending(5, gpus=4)]
    # the plan stops 1 (16 GPUs) to start 3, 4 and 5 (20 GPUs) beside 2: capacity 32
    run, dropped = bound_plan({2, 3, 4, 5}, jobs, keep={1}, capacity=32)
    # kept 1 (16) + 2 (8) = 24: 3 (oldest) fits, 4 does not, 5 (4 GPUs) does not either
    assert run == frozenset({1, 2, 3}) and dropped == (4, 5)
    run, dropped = bound_plan({2, 5}, jobs, keep={1}, capacity=32)
    assert run == frozenset({1, 2, 5}) and dropped == ()
    assert bound_plan({2, 3}, jobs, keep=set(), capacity=32) == (frozenset({2, 3}), ())


def test_bounded_plan_never_exceeds_the_gpus_random():
    rng = random.Random(5)
    for _ in range(300):
        jobs, run = [], set()
        for i in range(1, rng.randint(2, 12)):
            g = rng.choice([1, 2, 4, 8])
            if rng.random() < 0.5:
                jobs.append(running(i, gpus=g))
            else:
                jobs.append(pending(i, gpus=g, held=rng.random() < 0.7))
        capacity = 32
        # a plan that fits by itself, plus running jobs the bounds keep
        used = 0
        for j in sorted(jobs, key=lambda _: rng.random()):
            if used + j.gpus <= capacity and rng.random() < 0.6:
                run.add(j.job_id)
                used += j.gpus
        holders = [j for j in jobs if j.state is JobState.RUNNING]
        if sum(j.gpus for j in holders) > capacity:
            continue
        keep = {j.job_id for j in holders if j.job_id not in run and rng.random() < 0.5}
        new_run, dropped = bound_plan(run, jobs, keep, capacity)
        e = en.diff(RoundPlan(run=new_run), jobs)
        after = {j.job_id: j for j in jobs}
        holding = (set(e.keep) | set(e.start)) - set(e.stop)
        assert sum(after[i].gpus for i in holding) <= capacity
        assert keep <= set(e.keep) and not keep & set(e.stop)
        assert not set(dropped) & set(e.start)
        assert all(after[i].state is JobState.PENDING for i in dropped)


# ------------------------------------------------------------------ on the cluster
class Backend(FakeBackend):
    """FakeBackend whose release starts the released jobs (start_time = the clock)."""

    def __init__(self, jobs, clock):
        super().__init__(jobs)
        self.clock = clock

    def run(self, argv):
        result = super().run(argv)
        if argv[1] == "release":
            ids = {int(i) for i in argv[2].split(",")}
            self._jobs = [replace(j, state=JobState.RUNNING, priority=1, start_time=self.clock[0])
                          if j.job_id in ids else j for j in self._jobs]
        return result


def _cluster(backend, **kw):
    return SlurmCluster(backend, grace_seconds=0, stop_timeout_s=0.01, round_s=60.0,
                        sleep=lambda s: None, **kw)


def test_time_slicing_is_slowed_to_the_min_run_time_and_never_exceeds_the_gpus():
    clock = [NOW]
    # two 32-GPU jobs on a 32-GPU cluster; the plan alternates them every 60 s round
    backend = Backend([pending(1, gpus=32), pending(2, gpus=32)], clock)
    cluster = _cluster(backend, churn=ChurnLimits(min_run_seconds=150, max_preemptions_per_day=0,
                                                  max_stops_without_checkpoint=0))
    starts = []
    for k in range(12):
        snap = cluster.observe(clock[0])
        cluster.enact(RoundPlan(run=frozenset({1 + k % 2})), snap)
        now_running = [j for j in backend._jobs if j.state is JobState.RUNNING]
        assert sum(j.gpus for j in now_running) <= 32
        starts += [(k, j.job_id) for j in now_running if j.start_time == clock[0]]
        clock[0] += 60
    # a job runs at least 150 s (3 rounds of 60 s) before it is stopped: starts every 3 rounds
    assert [k for k, _ in starts] == [0, 3, 6, 9], starts
    assert [j for _, j in starts] == [1, 2, 1, 2]


def test_memory_counts_preemptions_per_day():
    clock = [NOW]
    backend = Backend([pending(1, gpus=32), pending(2, gpus=32)], clock)
    cluster = _cluster(backend, churn=ChurnLimits(0, 2, 0, 0))
    for k in range(8):
        snap = cluster.observe(clock[0])
        cluster.enact(RoundPlan(run=frozenset({1 + k % 2})), snap)
        clock[0] += 60
    requeues = [a for a in backend.log if a[1] == "requeuehold"]
    # each job is preempted twice, then kept running: 4 requeues, then the plan is refused
    assert len(requeues) == 4
    assert cluster.last_stats.kept and set(cluster.last_stats.kept.values()) == {"max_per_day"}


class History:
    def __init__(self, histories):
        self.histories, self.flags = histories, []

    def stop_history(self, jobs):
        return {j.job_id: self.histories[j.job_id] for j in jobs if j.job_id in self.histories}

    def flag(self, job, reason, now):
        self.flags.append((job.job_id, reason))


def test_a_restarted_daemon_recovers_the_counts_from_the_history_source(caplog):
    j1 = running(1, gpus=16, restarts=24)
    j2 = pending(2, gpus=32)
    day = tuple(NOW - 3000 * k for k in range(24, 0, -1))
    hist = History({1: StopHistory(day, True, NOW - 100)})     # checkpoints fine
    backend = FakeBackend([j1, j2])
    cluster = _cluster(backend, churn=LIMITS, stop_history=hist)     # a fresh daemon
    snap = cluster.observe(NOW)
    cluster.enact(RoundPlan(run=frozenset({2})), snap)
    assert all("1" not in a[-1].split(",") for a in backend.log if a[1] != "release")
    assert backend.log == []        # job 2 (32 GPUs) does not fit beside the kept job 1
    assert cluster.last_stats.kept == {1: "max_per_day"} and cluster.last_stats.dropped == (2,)


def test_flagged_job_is_left_running_logged_once_and_recorded(caplog):
    j1 = running(1, gpus=8, restarts=3)
    hist = History({1: StopHistory((NOW - 900, NOW - 600, NOW - 300), True, None)})
    backend = FakeBackend([j1, pending(2, gpus=8)])
    cluster = _cluster(backend, churn=LIMITS, stop_history=hist)
    with caplog.at_level(logging.WARNING, logger="shockslurm"):
        for k in range(3):
            snap = cluster.observe(NOW + k)
            cluster.enact(RoundPlan(run=frozenset({2})), snap)
    assert not any(a[1] in ("requeuehold",) or a[0] == "scancel" for a in backend.log)
    assert ("scontrol", "release", "2") in backend.log      # 8 + 8 GPUs fit: 2 still starts
    assert [m for m in caplog.messages if "flagged" in m].__len__() == 1
    assert len(hist.flags) == 1 and hist.flags[0][0] == 1


# ------------------------------------------------------------------ from the store
@pytest.fixture
def store(tmp_path):
    engine = open_store(f"sqlite:///{tmp_path / 's.db'}", create=True)
    yield engine
    engine.dispose()


def test_store_history_survives_a_restart_and_flag_is_recorded_once(store):
    j1 = running(1, gpus=8, restarts=3)
    with Session(store) as s, s.begin():
        reg = repo.register_submitted_job(s, "slurm", job_id=1, submit_s=j1.submit_time + 0.5,
                                          model="m", epochs=3, samples_per_epoch=10,
                                          batch_sizes=[32], gang_size=8)
        for t in (NOW - 3000, NOW - 2000, NOW - 1000):
            repo.add_checkpoint(s, reg.id, time_s=t - 5, path="p", step=1, ok=False)
        # an earlier daemon incarnation's intents: three successful requeues, one failed
        for incarnation in range(2):
            run = repo.add_run(s, policy="fifo", kind="live", cluster="slurm")
            rnd = repo.record_round(s, run, index=0, time_s=NOW, policy="fifo", solve_s=0,
                                    plan={})
            live = repo.add_job(s, run, job_id=1, submit_s=j1.submit_time, model="m", epochs=3,
                                samples_per_epoch=10, batch_sizes=[32], gang_size=8)
            for rc in ((0, 0) if incarnation == 0 else (0, 1)):
                i = repo.add_enactment_intent(s, rnd, live, action="requeuehold",
                                              argv=["scontrol", "requeuehold", "1"])
                repo.finish_enactment_intent(s, i, return_code=rc)
        other = repo.add_job(s, run, job_id=1, submit_s=j1.submit_time - 1e6, model="m",
                             epochs=3, samples_per_epoch=10, batch_sizes=[32], gang_size=8)
        i = repo.add_enactment_intent(s, rnd, other, action="requeuehold", argv=["x"])
        repo.finish_enactment_intent(s, i, return_code=0)          # an older job, same id
        reg_pk = reg.id
    source = ReportedProgress(store, cluster="slurm")
    source.refresh([j1])
    h = source.stop_history([j1])[1]
    assert len(h.preemptions) == 3 and h.reports and h.failed_checkpoints == 3
    assert h.last_ok_checkpoint is None
    for _ in range(2):                                 # two daemon incarnations
        backend = FakeBackend([j1])
        cluster = _cluster(backend, churn=LIMITS, progress_source=ReportedProgress(
            store, cluster="slurm"))
        snap = cluster.observe(NOW)
        cluster.enact(RoundPlan(run=frozenset()), snap)
        assert backend.log == [] and cluster.last_stats.kept == {1: "flagged"}
    with Session(store) as s:
        events = s.scalars(select(JobEvent).where(JobEvent.job_pk == reg_pk,
                                                  JobEvent.kind == "flagged")).all()
        assert len(events) == 1 and "ok=false" in json.loads(events[0].detail)["reason"]


def test_a_job_about_to_finish_is_not_stopped():
    """Expected to end within the finish window: kept (a stop would race its own end); with
    more work left, or with the window off, the other rules decide."""
    limits = ChurnLimits(min_run_seconds=0, max_preemptions_per_day=0,
                         max_stops_without_checkpoint=0, finish_window_seconds=60)
    job = running(1, ran=1000)
    assert keep_reason(job, StopHistory(), limits, NOW, remaining_s=20.0)[0] == "nearly_done"
    assert keep_reason(job, StopHistory(), limits, NOW, remaining_s=300.0) is None
    assert keep_reason(job, StopHistory(), limits, NOW, remaining_s=None) is None
    off = replace(limits, finish_window_seconds=0)
    assert keep_reason(job, StopHistory(), off, NOW, remaining_s=1.0) is None


def test_idle_stops_keep_what_fits_in_order_and_only_where_it_runs():
    from shockslurm.churn_rules import idle_stops
    where = {1: (("a", 4),), 2: (("a", 4),), 3: (("b", 8),), 4: (("a", 2), ("b", 2))}
    # 6 GPUs free on a: job 1 keeps its 4, then job 2 no longer fits; b has room for none
    assert idle_stops([1, 2, 3], where, {"a": 6, "b": 2}) == (1,)
    assert idle_stops([2, 1, 3], where, {"a": 8, "b": 8}) == (2, 1, 3)
    assert idle_stops([4], where, {"a": 2, "b": 1}) == ()            # a gang needs every node
    assert idle_stops([5], where, {"a": 8}) == ()                     # nowhere known: stopped

"""Event-driven rounds of the daemon, on a fake Slurm backend, a real SQLite store and a fake
clock: a completion between rounds starts the next round early (it releases the waiting job), no
event means no early round, a standby never polls, a failed poll read is "no event"."""

from __future__ import annotations

from dataclasses import replace

from shockslurm.daemon import DaemonRunner
from shockslurm.slurm.dryrun import DryRunBackend
from shockslurm.slurm.types import JobState, SlurmNode
from shockslurm.store.leader import FileLeaderLock

from . import test_crash_safety as cs
from .test_crash_safety import Backend, daemon, engine, running  # noqa: F401 (a fixture)
from .test_enact import job

ROUND_S = 30.0
POLL_S = 2.0


class FakeWake:
    """The runner's `Wakeup` on a fake clock: a wait passes its whole timeout at once
    (nothing sets it) and calls `at(t)` with the new time, where the test makes things happen."""

    def __init__(self, clock: list[float], at=lambda t: None) -> None:
        self.clock, self.at = clock, at
        self.waits: list[float] = []

    def wait(self, timeout: float) -> bool:
        self.waits.append(timeout)
        self.clock[0] += timeout
        self.at(self.clock[0])
        return False

    def set(self) -> None:
        pass

    def clear(self) -> None:
        pass


class Clock:
    def __init__(self, t: list[float]) -> None:
        self.t = t

    def now(self) -> float:
        return self.t[0]

    def sleep_until(self, t: float) -> None:
        self.t[0] = max(self.t[0], t)


def _runner(engine, b: Backend, at=lambda t: None, leader=None, **keys):
    keys = {"round_seconds": ROUND_S, "event_poll_seconds": POLL_S, "stop_lead_seconds": 0,
            **keys}
    d = daemon(engine, b, **keys)
    runner = DaemonRunner(d, leader=leader)
    t = [cs.NOW]
    d.loop.clock = Clock(t)
    runner.monotonic = lambda: t[0]          # no wall-clock step: both clocks move together
    runner._wake = FakeWake(t, at)           # type: ignore[assignment]
    polls: list[float] = []
    real = d.cluster.wants_early_round

    def counted() -> bool:
        polls.append(t[0])
        return real()
    d.cluster.wants_early_round = counted     # type: ignore[method-assign]
    return runner, t, polls


def _full_cluster() -> Backend:
    """Four running 8-GPU jobs fill the 32 GPUs; job 5 waits (FIFO keeps the earlier ones)."""
    return Backend([running(1), running(2), running(3), running(4), job(5, gpus=8)])


def _finish(b: Backend, job_id: int, state: JobState = JobState.COMPLETED) -> None:
    b._jobs = [replace(j, state=state) if j.job_id == job_id else j for j in b._jobs]


def _released(b: Backend) -> set[int]:
    return {int(i) for a in b.log if a[1] == "release" for i in a[2].split(",")}


def test_a_completion_starts_the_next_round_early_and_it_releases_the_waiting_job(engine):
    b = _full_cluster()
    done_at = cs.NOW + 5.0

    def at(now: float) -> None:
        if now >= done_at:
            _finish(b, 1)
    runner, t, polls = _runner(engine, b, at)
    assert runner.run(max_rounds=2) == 2
    assert 5 in _released(b)                         # the second round filled the freed GPUs
    assert t[0] == cs.NOW + 6.0                         # the first poll after the completion
    assert t[0] - done_at <= POLL_S < ROUND_S
    assert polls == [cs.NOW + 2.0, cs.NOW + 4.0, cs.NOW + 6.0] and runner.early_rounds == 1
    assert all(w <= POLL_S for w in runner._wake.waits)


def test_no_event_no_early_round(engine):
    b = _full_cluster()
    runner, t, polls = _runner(engine, b)
    runner.run(max_rounds=2)
    assert t[0] == cs.NOW + ROUND_S and runner.early_rounds == 0
    assert len(polls) == ROUND_S / POLL_S - 1          # every 2 s, none at the boundary
    assert 5 not in _released(b)


def test_a_slow_poll_read_backs_the_poll_off(engine):
    """A read that takes 0.25 s (a large queue) makes the next poll wait 20 times that (5 s),
    not the configured 2 s: the daemon spends at most 1/20 of its time reading Slurm."""
    b = _full_cluster()
    runner, t, polls = _runner(engine, b)
    real = runner.daemon.cluster.wants_early_round

    def slow() -> bool:
        t[0] += 0.25
        return real()
    runner.daemon.cluster.wants_early_round = slow      # type: ignore[method-assign]
    runner.run(max_rounds=2)
    waits = runner._wake.waits
    assert waits[0] == POLL_S and set(waits[1:-1]) == {20 * 0.25} and runner.early_rounds == 0
    assert t[0] == cs.NOW + ROUND_S


def test_a_completion_with_nothing_waiting_or_still_completing_is_no_event(engine):
    b = Backend([running(1), running(2), job(5, gpus=8)])     # job 5 is released at once
    runner, t, polls = _runner(engine, b, lambda now: _finish(b, 1, JobState.COMPLETED))
    runner.run(max_rounds=2)
    assert t[0] == cs.NOW + ROUND_S and polls and runner.early_rounds == 0
    b = _full_cluster()
    runner, t, polls = _runner(engine, b, lambda now: _finish(b, 1, JobState.COMPLETING))
    runner.run(max_rounds=2)                          # COMPLETING still holds its GPUs
    assert t[0] == cs.NOW + ROUND_S and polls and runner.early_rounds == 0


def test_polling_off_waits_for_the_boundary(engine):
    b = _full_cluster()
    runner, t, polls = _runner(engine, b, lambda now: _finish(b, 1), event_poll_seconds=0)
    runner.run(max_rounds=2)
    assert polls == [] and runner._wake.waits == [ROUND_S] and t[0] == cs.NOW + ROUND_S
    assert 5 in _released(b)                          # a round later


def test_a_failed_poll_read_is_no_event(engine):
    b = _full_cluster()

    def at(now: float) -> None:
        _finish(b, 1)
        b.down = True                                 # slurmctld does not answer
    runner, t, polls = _runner(engine, b, at)
    runner.run(max_rounds=2)
    assert polls and runner.early_rounds == 0 and t[0] == cs.NOW + ROUND_S


def test_a_standby_never_polls(engine, tmp_path):
    b = _full_cluster()
    path = str(tmp_path / "leader")
    holder = FileLeaderLock(path)
    assert holder.acquire()
    runner, t, polls = _runner(engine, b, lambda now: _finish(b, 1),
                               leader=FileLeaderLock(path), standby_retry_seconds=5)
    reads = b.calls["jobs"]
    assert runner.run(max_rounds=3) == 3
    assert runner.leading is False and polls == [] and b.calls["jobs"] == reads
    assert runner._wake.waits == [5.0, 5.0]           # the standby's retries, nothing between
    holder.release()


def _arrive(b: Backend, job_id: int, gpus: int) -> None:
    if all(j.job_id != job_id for j in b._jobs):
        b._jobs = [*b._jobs, job(job_id, gpus=gpus)]


def test_an_arrival_that_fits_the_idle_gpus_starts_the_next_round_early(engine):
    b = Backend([running(1), running(2), running(3)])       # 24 of 32 GPUs busy, one node idle
    runner, t, polls = _runner(engine, b, lambda now: now >= cs.NOW + 5.0 and _arrive(b, 6, 8))
    assert runner.run(max_rounds=2) == 2
    assert t[0] == cs.NOW + 6.0 and runner.early_rounds == 1
    assert 6 in _released(b)


def test_an_arrival_that_does_not_fit_waits_for_the_boundary(engine):
    b = _full_cluster()                                     # 32 of 32 GPUs busy, job 5 waits
    runner, t, polls = _runner(engine, b, lambda now: now >= cs.NOW + 5.0 and _arrive(b, 6, 1))
    runner.run(max_rounds=2)
    assert t[0] == cs.NOW + ROUND_S and runner.early_rounds == 0


def test_stop_lead_starts_each_round_ahead_of_its_boundary(engine):
    """With `stop_lead_seconds`, a round after a round that ran starts that long before its
    boundary; the boundaries keep their period (one round apart); the first round is its own
    boundary; the lead is at most half a round."""
    b = _full_cluster()
    runner, t, polls = _runner(engine, b, event_poll_seconds=0, stop_lead_seconds=3)
    starts, boundaries = [], []
    real = runner.attempt

    def attempt():
        starts.append(t[0])
        boundaries.append(runner.boundary)
        return real()

    runner.attempt = attempt                  # type: ignore[method-assign]
    runner.run(max_rounds=3)
    assert boundaries == [cs.NOW, cs.NOW + ROUND_S, cs.NOW + 2 * ROUND_S]
    assert starts == [cs.NOW, cs.NOW + ROUND_S - 3, cs.NOW + 2 * ROUND_S - 3]
    b = _full_cluster()
    runner, t, polls = _runner(engine, b, event_poll_seconds=0, stop_lead_seconds=100)
    runner.run(max_rounds=2)
    assert t[0] == cs.NOW + ROUND_S / 2 and runner.boundary == cs.NOW + ROUND_S


class CheapCheckBackend(Backend):
    """A backend with the CLI's cheap change check (`active_job_states`), derived here from
    the fake queue as `squeue -h -p gpu -o '%i %T'` would print it."""

    def active_job_states(self, partitions):
        self.calls["active_job_states"] += 1
        if self.down:
            raise cs.SlurmError("squeue failed", returncode=1)
        return frozenset((str(j.job_id), j.state.value) for j in self._jobs
                         if j.partition in partitions and not j.state.finished)


def test_with_a_cheap_change_check_an_unchanged_queue_costs_no_full_read(engine):
    plain = _full_cluster()
    _runner(engine, plain)[0].run(max_rounds=2)
    b = CheapCheckBackend(_full_cluster()._jobs)
    runner, t, polls = _runner(engine, b)
    runner.run(max_rounds=2)
    checks = ROUND_S / POLL_S - 1
    assert len(polls) == checks and b.calls["active_job_states"] == checks
    # only the first poll after the round reads in full; the other 13 see the same queue
    assert b.calls["jobs"] == plain.calls["jobs"] - (checks - 1) and runner.early_rounds == 0


def test_with_a_cheap_change_check_a_completion_still_starts_the_next_round_early(engine):
    b = CheapCheckBackend(_full_cluster()._jobs)
    runner, t, polls = _runner(engine, b, lambda now: now >= cs.NOW + 5.0 and _finish(b, 1))
    assert runner.run(max_rounds=2) == 2
    assert t[0] == cs.NOW + 6.0 and runner.early_rounds == 1 and 5 in _released(b)


def test_a_dry_run_over_a_backend_without_the_cheap_check_reads_the_queue_once_per_poll(engine):
    """A dry run over a backend with no cheap change check (pyslurm) has none either: each
    poll reads the queue in full once, as the wrapped backend alone would (the dry run's
    earlier stand-in check read it a second time)."""
    plain = _full_cluster()
    _runner(engine, plain)[0].run(max_rounds=2)
    inner = _full_cluster()
    dry = DryRunBackend(inner, echo=None)
    assert dry.active_job_states(["gpu"]) is None and inner.calls["jobs"] == 0
    runner, t, polls = _runner(engine, dry)          # type: ignore[arg-type]
    runner.run(max_rounds=2)
    assert len(polls) == ROUND_S / POLL_S - 1
    assert inner.calls["jobs"] == plain.calls["jobs"]


class SharedNodesBackend(CheapCheckBackend):
    """The cheap-check backend whose nodes are also in partition `urgent` (as on the test
    cluster), where a job the daemon does not schedule holds 8 of the 32 GPUs."""

    def nodes(self):
        self.calls["nodes"] += 1
        return [SlurmNode(f"gpu0{i}", "idle", 8, 0, ("gpu", "urgent")) for i in range(1, 5)]


def _shared_cluster() -> SharedNodesBackend:
    """Three of our 8-GPU jobs and another partition's 8-GPU job fill the 32 GPUs; our job 5
    waits."""
    foreign = replace(running(9), partition="urgent", comment="plain user job")
    return SharedNodesBackend([running(1), running(2), running(3), foreign, job(5, gpus=8)])


def test_gpus_freed_by_a_job_we_do_not_schedule_start_the_next_round_early(engine):
    b = _shared_cluster()
    runner, t, polls = _runner(engine, b, lambda now: now >= cs.NOW + 5.0 and _finish(b, 9))
    assert runner.run(max_rounds=2) == 2
    assert t[0] == cs.NOW + 6.0 and runner.early_rounds == 1 and 5 in _released(b)
    assert b.calls["active_job_states"] == 3


def test_the_light_poll_reads_every_partition_on_our_nodes(engine):
    b = _shared_cluster()
    seen: list[tuple[str, ...]] = []
    real = b.active_job_states

    def spy(partitions):
        seen.append(tuple(partitions))
        return real(partitions)
    b.active_job_states = spy                        # type: ignore[method-assign]
    runner, t, polls = _runner(engine, b)
    runner.run(max_rounds=2)
    assert seen and set(seen) == {("gpu", "urgent")}
    assert runner.early_rounds == 0 and 5 not in _released(b)


def test_a_departure_with_nothing_of_ours_waiting_or_still_completing_is_no_event(engine):
    b = _shared_cluster()
    b._jobs = [j for j in b._jobs if j.job_id != 5]            # nothing of ours waits
    runner, t, polls = _runner(engine, b, lambda now: now >= cs.NOW + 5.0 and _finish(b, 9))
    runner.run(max_rounds=2)
    assert t[0] == cs.NOW + ROUND_S and runner.early_rounds == 0
    b = _shared_cluster()
    runner, t, polls = _runner(engine, b, lambda now: now >= cs.NOW + 5.0
                               and _finish(b, 9, JobState.COMPLETING))
    runner.run(max_rounds=2)                          # COMPLETING still holds its GPUs
    assert t[0] == cs.NOW + ROUND_S and runner.early_rounds == 0 and 5 not in _released(b)


def test_a_departure_whose_gpus_fit_no_waiting_job_of_ours_is_no_event(engine):
    """A busy foreign partition freeing GPUs here and there starts no round for a gang that
    does not fit them: job 5 asks 16 GPUs, the departure frees 8."""
    b = _shared_cluster()
    b._jobs = [j if j.job_id != 5 else job(5, gpus=16) for j in b._jobs]
    runner, t, polls = _runner(engine, b, lambda now: now >= cs.NOW + 5.0 and _finish(b, 9))
    runner.run(max_rounds=2)
    assert t[0] == cs.NOW + ROUND_S and runner.early_rounds == 0


def test_the_runners_handlers_ring_a_lock_free_wakeup(engine):
    """SIGTERM and SIGHUP handlers set their flag and ring the runner's `Wakeup` (no
    `threading.Event`: its `set` in a handler can wait forever for a lock the interrupted main
    thread holds); a wait between rounds ends at once."""
    import signal
    import time

    from shockslurm.daemon.wakeup import Wakeup

    runner = DaemonRunner(daemon(engine, Backend([]), round_seconds=ROUND_S))
    assert isinstance(runner._wake, Wakeup)
    old = signal.getsignal(signal.SIGALRM)
    try:
        for handler, flag in ((runner.request_reload, "reload_requested"),
                              (runner.request_stop, "stop_requested")):
            runner._wake.clear()
            signal.signal(signal.SIGALRM, handler)
            signal.setitimer(signal.ITIMER_REAL, 0.1)
            start = time.monotonic()
            assert runner._wake.wait(ROUND_S)
            assert time.monotonic() - start < 5.0 and getattr(runner, flag)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)

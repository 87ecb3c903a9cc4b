"""Idle GPU-seconds by cause (`live.idle`): switch and waiting, from the daemon's reads."""

from __future__ import annotations

from dataclasses import replace

from shockslurm.live.idle import SwitchClock, waiting_gpus
from shockslurm.slurm.types import JobState

from .test_enact import job


def test_waiting_counts_free_gpus_held_jobs_could_use():
    held = [job(1, gpus=4), job(2, gpus=8), job(3, gpus=2)]
    assert waiting_gpus(held, 6, {1, 2, 3}, set()) == 6           # 4 + 2 fit, capped at 6 free
    assert waiting_gpus(held, 6, {1, 2, 3}, {1}) == 2             # never planned: not waiting
    assert waiting_gpus(held, 6, {2}, set()) == 0                 # 8 GPUs do not fit in 6
    released = job(4, priority=100, reason="Resources", gpus=4)   # counted as unplaceable
    assert waiting_gpus([*held, released], 6, {1, 3, 4}, set()) == 2


def test_switch_runs_from_the_freed_gpus_to_the_successors_start():
    clock = SwitchClock()
    clock.read(100.0, [], 0)
    clock.begin(101.5, 8, {7: 8}, free_before=0)
    started = replace(job(7, JobState.RUNNING, gpus=8), start_time=103.0)
    clock.read(110.0, [started], 0)
    assert clock.take_switch() == 8 * 1.5 and clock.take_switch() == 0.0
    # a successor still pending at the next read counts until then, and no longer
    clock.begin(200.0, 8, {7: 8})
    clock.read(202.0, [job(7, gpus=8)], 0)
    clock.read(230.0, [job(7, gpus=8)], 0)
    assert clock.take_switch() == 8 * 2.0
    # GPUs already free at the round's observe are not the switch's; no successor, no switch
    clock.begin(300.0, 8, {7: 8}, free_before=6)
    clock.begin(300.0, 8, {})
    clock.read(305.0, [replace(started, start_time=301.0)], 0)
    assert clock.take_switch() == 2 * 1.0


def test_waiting_is_counted_from_each_read_to_the_next():
    clock = SwitchClock()
    clock.read(0.0, [], 4)
    clock.read(2.0, [], 0)
    clock.read(5.0, [], 8)
    assert clock.take_waiting() == 8.0 and clock.totals["waiting"] == 8.0


def test_a_round_with_a_stop_and_its_successor_measures_the_switch():
    """End to end on a fake Slurm: job 2 runs, job 1 (held) is planned instead; the stop frees
    job 2's GPUs at the round's time, job 1 runs 3 s later: 2 GPUs x 3 s of switch, reported by
    the next round."""
    from shockslurm.live.cluster import SlurmCluster
    from shockslurm.live.enact import ChurnLimits
    from shockslurm.model import RoundPlan

    from .test_live import FakeBackend

    b = FakeBackend([job(1), job(2, JobState.RUNNING)])
    c = SlurmCluster(b, grace_seconds=0, sleep=lambda s: None, monotonic=lambda: 0.0,
                     churn=ChurnLimits(0, 0, 0, 0))
    c.enact(RoundPlan(run=frozenset({1})), c.observe(100.0))
    assert c.last_stats.stopped == 1 and c.last_stats.started == 1
    b._jobs = [replace(j, state=JobState.RUNNING, start_time=103.0) if j.job_id == 1 else j
               for j in b._jobs]
    c.enact(RoundPlan(run=frozenset({1})), c.observe(110.0))
    assert c.last_stats.idle_switch_gpu_s == 2 * 3.0
    assert c.idle_gpu_s["switch"] == 6.0


def test_a_round_that_releases_the_waiting_jobs_ends_their_wait():
    clock = SwitchClock()
    clock.read(0.0, [], 32)           # the round's read: 32 GPUs free, held jobs wait
    clock.round_done(0.5, 24)          # the round released 24 GPUs' worth of them
    clock.read(20.5, [], 0)
    assert clock.take_waiting() == 32 * 0.5 + 8 * 20.0

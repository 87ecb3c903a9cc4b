from __future__ import annotations

from shockslurm.model import Snapshot
from shockslurm.policies.fifo import Fifo

from .conftest import make_view


def _snap(views, gpus=8):
    return Snapshot(now=0, round_index=0, round_s=120.0, gpus=gpus, jobs=tuple(views))


def test_fifo_is_non_preemptive_and_in_order() -> None:
    views = [make_view(0, gang=4, ran_last_round=True, arrival=5),
             make_view(1, gang=4, arrival=1), make_view(2, gang=2, arrival=2)]
    assert Fifo().allocate(_snap(views)).run == {0, 1}


def test_easy_backfill_respects_the_heads_reservation() -> None:
    # running: job 0 (4 GPUs) ends in 100 s. Head job 1 needs 8 -> reserved at t=100.
    # job 2 (2 GPUs, 50 s) ends before that: backfilled. job 3 (2 GPUs, 500 s) would delay it.
    views = [make_view(0, gang=4, ran_last_round=True, remaining=100),
             make_view(1, gang=8, arrival=1), make_view(2, gang=2, arrival=2, remaining=50),
             make_view(3, gang=2, arrival=3, remaining=500)]
    assert Fifo().allocate(_snap(views)).run == {0, 2}

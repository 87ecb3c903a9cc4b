"""Several CPU ranks over gloo in spawned processes, for the training helper's collective tests
(tests/test_train_sharded.py, tests/test_train_multirank.py).

gloo can abort a rank at exit ("terminate called without an active exception", SIGABRT): a
core dump of one (torch 2.13, 2026-12-01) shows gloo's worker thread destroying the last
collective's work (an all_gather of tensors Python made, as `all_gather_object`'s) and taking
the GIL for their Python objects while the main thread was already finalizing the interpreter.
A barrier after it closes that window (its wait lets the worker take the GIL and finish), so
ranks leave together (`leave_together`, as `examples/train_ddp.py` does), and a run whose rank
was still killed by a signal is tried once more on fresh ranks, with a warning; a rank that
raises fails at once. Seen: once in a CI run of 1,577 tests (2026-11-30) and in 3 of 71 runs of
that test's ranks alone (no barrier), none in 90 runs with the barrier.
"""

from __future__ import annotations

import warnings
from typing import Any, Callable

import torch.distributed as dist
import torch.multiprocessing as mp
from torch.multiprocessing.spawn import ProcessExitedException


def leave_together() -> None:
    """Every rank reaches this point before any tears its group down."""
    dist.barrier()
    dist.destroy_process_group()


def spawn_ranks(rank_main: Callable[..., None], args_for: Callable[[int], tuple[Any, ...]],
                nprocs: int = 2) -> None:
    """`mp.spawn(rank_main, args_for(attempt), nprocs)`; attempt 1 only after attempt 0's rank
    died of a signal. `args_for` gives each attempt its own directories."""
    try:
        mp.spawn(rank_main, args=args_for(0), nprocs=nprocs)
    except ProcessExitedException as exc:
        if exc.signal_name is None:
            raise
        warnings.warn(f"{rank_main.__name__}: {exc}; tried again on fresh ranks", stacklevel=2)
        mp.spawn(rank_main, args=args_for(1), nprocs=nprocs)

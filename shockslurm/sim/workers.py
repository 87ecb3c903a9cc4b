"""Independent simulations, one after another or in a process pool: the results come in the
order of the inputs either way, and are the same (each simulation is deterministic and reads
nothing the others write). `bench quality` and `bench live-family` run their cases so."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from typing import TypeVar

In = TypeVar("In")
Out = TypeVar("Out")


def map_ordered(run: Callable[[In], Out], inputs: Sequence[In], workers: int = 1,
                note: Callable[[int], None] | None = None) -> list[Out]:
    """`run` of every input, in `inputs` order; `workers` > 1 runs them in a process pool
    (`run` and the inputs must pickle) of at most one process per input. `note(i)` is called
    for input i: before it runs when sequential, as its result arrives from a pool."""
    results: list[Out] = []
    workers = min(workers, len(inputs))
    if workers <= 1:
        for i, item in enumerate(inputs):
            if note is not None:
                note(i)
            results.append(run(item))
        return results
    with ProcessPoolExecutor(workers) as pool:
        for i, result in enumerate(pool.map(run, inputs)):
            if note is not None:
                note(i)
            results.append(result)
    return results

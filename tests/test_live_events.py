"""`live.events.arrivals_that_fit`: new pending jobs that the idle GPUs can hold, node by node."""

from __future__ import annotations

from dataclasses import replace

from shockslurm.live.events import arrivals_that_fit
from shockslurm.live.layout import Layout
from shockslurm.model import Node

from .test_enact import job

NODES = tuple(Node(f"gpu{i:02d}", 8) for i in range(1, 5))


def _fragmented() -> Layout:
    """Every node has 6 of its 8 GPUs taken: 8 GPUs idle in all, 2 per node."""
    return Layout(NODES, placements={k: ((n.name, 6),) for k, n in enumerate(NODES, start=1)})


def test_a_gang_that_fits_a_node_counts_one_that_only_fits_the_sum_does_not() -> None:
    pending = [job(10, gpus=2), job(11, gpus=4)]
    assert arrivals_that_fit(_fragmented(), pending, known=()) == [10]


def test_known_jobs_never_count() -> None:
    assert arrivals_that_fit(_fragmented(), [job(10, gpus=2)], known={10}) == []


def test_a_multi_node_gang_needs_whole_free_nodes() -> None:
    two_free = Layout(NODES, placements={1: (("gpu01", 8),), 2: (("gpu02", 1),)})
    wide = replace(job(12, gpus=8), nodes=2, gpus_per_node=8)
    assert wide.gpus == 16
    assert arrivals_that_fit(two_free, [wide], known=()) == [12]
    three_busy = Layout(NODES, reserved={"gpu03": 1}, placements=two_free.placements)
    assert arrivals_that_fit(three_busy, [wide], known=()) == []


def test_no_nodes_nothing_fits() -> None:
    assert arrivals_that_fit(Layout(()), [job(10, gpus=1)], known=()) == []

"""Laying the market's rounds per job out in the window's rounds.

The market chooses how many rounds each job runs in the window under an aggregated capacity
(`sum_j gang_j n_j <= G T`); these functions say which rounds. Two rules, each deterministic:

- **In priority order** (`order`): each job takes the earliest block of consecutive rounds with
  room for its gang, else the earliest rounds with room. The round about to run then holds the
  jobs that need it most, and a job keeps running without switches. But it front-loads: the
  first rounds fill, and the last jobs in the order may find fewer rounds with room than they
  were given, while the free GPUs sit in later rounds that already hold them.
  `priority_layout` says what each job gets this way; the planner re-solves the market with
  those as caps, so that its plan fits this layout.
- **Roomiest first**: the jobs by decreasing gang, then decreasing rounds, each on the rounds
  with the most free GPUs (ties: the earliest) that can take its gang. This spreads the load
  evenly over the rounds, so it lays out what the aggregated capacity allows far more often
  (with 1-GPU gangs always: the Gale-Ryser construction).

`pack` keeps the priority rule for as long a head of `order` as it can while the rest of the
jobs, laid roomiest first, still lose nothing: the whole order when the priority rule alone loses
nothing, the longest such head (found by bisection) otherwise, and the priority rule alone (losing
rounds) when even the roomiest rule loses some. Room is what `placement` can still place in a
round on the nodes (one pool of `gpus` without them) around the GPUs others hold there
(`reserved`), each job on the nodes it may run on (`allowed`), so no round holds more than can be
placed.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from ...model import Node, pool
from ...node_book import NodeBook, NodeSets


def pack(order: list[int], rounds: Mapping[int, int], gang: Mapping[int, int], gpus: int,
         horizon: int, nodes: Sequence[Node] = (), reserved: Mapping[str, int] | None = None,
         allowed: Mapping[int, frozenset[str]] | None = None,
         node_counts: Mapping[int, int] | None = None) -> list[list[int]]:
    """The window's rounds, each the jobs it holds (module docstring)."""
    layout = _Layout.of(order, rounds, gang,
                        _Room.of(nodes, gpus, reserved, allowed, node_counts), horizon)
    whole = layout.lay(len(layout.jobs))
    if not whole.lost or layout.lay(0).lost:
        return whole.plan
    ok, bad = 0, len(layout.jobs)           # a head of `ok` jobs works, one of `bad` does not
    while bad - ok > 1:
        mid = (ok + bad) // 2
        if not layout.lay(mid).lost:
            ok = mid
        else:
            bad = mid
    return layout.lay(ok).plan


def priority_layout(order: list[int], rounds: Mapping[int, int], gang: Mapping[int, int],
                    gpus: int, horizon: int, nodes: Sequence[Node] = (),
                    reserved: Mapping[str, int] | None = None,
                    allowed: Mapping[int, frozenset[str]] | None = None,
                    node_counts: Mapping[int, int] | None = None
                    ) -> tuple[list[list[int]], dict[int, int]]:
    """The window laid out by the priority rule alone, and the rounds each job of `order` gets
    there (at most `rounds[j]`; fewer where its gang finds too few rounds with room). Where
    every job gets all its rounds, this is the plan `pack` returns."""
    layout = _Layout.of(order, rounds, gang,
                        _Room.of(nodes, gpus, reserved, allowed, node_counts), horizon)
    plan = layout.lay(len(layout.jobs)).plan
    got = Counter(j for r in plan for j in r)
    return plan, {j: got[j] for j in order}


@dataclass(frozen=True)
class _Room:
    """A round's room: its nodes, the GPUs others hold there, the nodes each job may run on and
    the nodes it asks for (`node_counts`)."""

    nodes: Sequence[Node]
    reserved: Mapping[str, int]
    allowed: Mapping[int, frozenset[str]]
    node_counts: Mapping[int, int] = field(default_factory=dict)
    sets: NodeSets = field(default_factory=dict)     # each job's node set, read once

    @classmethod
    def of(cls, nodes: Sequence[Node], gpus: int, reserved: Mapping[str, int] | None,
           allowed: Mapping[int, frozenset[str]] | None,
           node_counts: Mapping[int, int] | None = None) -> _Room:
        """The nodes with what others hold; one pool of `gpus` (all of them free) without."""
        if not nodes:
            return cls(pool(gpus), {}, {})
        return cls(nodes, dict(reserved or {}), dict(allowed or {}), dict(node_counts or {}))

    def book(self) -> NodeBook:
        return NodeBook(self.nodes, self.reserved, self.sets)

    def fits(self, book: NodeBook, j: int, gang: int) -> bool:
        """Whether job `j`'s gang can still be placed in the round of `book`."""
        return book.can_take(gang, self.allowed.get(j), self.node_counts.get(j, 1))

    def take(self, book: NodeBook, j: int, gang: int) -> None:
        book.take(gang, within=self.allowed.get(j), spread=self.node_counts.get(j, 1))


@dataclass(frozen=True)
class _Trial:
    """One layout: the rounds' jobs and the GPU-rounds it could not lay out."""

    plan: list[list[int]]
    lost: int


class _Layout:
    """The jobs, their rounds and gangs, and the nodes of a round: `lay(head)` lays the first
    `head` jobs by the priority rule and the rest roomiest first, on fresh rounds."""

    def __init__(self, jobs: list[int], want: Mapping[int, int], gang: Mapping[int, int],
                 room: _Room, horizon: int) -> None:
        self.jobs, self.want, self.gang = jobs, want, gang
        self.room, self.horizon = room, horizon

    @classmethod
    def of(cls, order: list[int], rounds: Mapping[int, int], gang: Mapping[int, int],
           room: _Room, horizon: int) -> _Layout:
        """The jobs of `order` with rounds, each wanting at most the window."""
        jobs = [j for j in order if int(rounds.get(j, 0)) > 0]
        return cls(jobs, {j: min(int(rounds[j]), horizon) for j in jobs}, gang, room, horizon)

    def lay(self, head: int) -> _Trial:
        books = [self.room.book() for _ in range(self.horizon)]
        plan: list[list[int]] = [[] for _ in range(self.horizon)]
        lost = 0
        for j in self.jobs[:head]:
            lost += self._take(j, _in_order(self._fitting(books, j), self.want[j]), books, plan)
        rest = sorted(range(head, len(self.jobs)),
                      key=lambda i: (-self.gang[self.jobs[i]], -self.want[self.jobs[i]], i))
        for i in rest:
            j = self.jobs[i]
            lost += self._take(j, _roomiest(books, self._fitting(books, j), self.want[j]),
                               books, plan)
        return _Trial(plan, lost)

    def _fitting(self, books: Sequence[NodeBook], j: int) -> np.ndarray:
        """Which rounds can still take job `j`'s gang (a bool per round)."""
        return np.fromiter((self.room.fits(b, j, self.gang[j]) for b in books), dtype=bool,
                           count=len(books))

    def _take(self, j: int, slots: Sequence[int], books: list[NodeBook],
              plan: list[list[int]]) -> int:
        """Lay job `j` on `slots`; the GPU-rounds it lost."""
        for t in slots:
            self.room.take(books[t], j, self.gang[j])
            plan[t].append(j)
        return (self.want[j] - len(slots)) * self.gang[j]


def _in_order(ok: np.ndarray, n: int) -> list[int]:
    """The earliest block of `n` consecutive rounds that can take the gang (`ok`: per round),
    else the earliest rounds that can (fewer than `n` when fewer have room)."""
    horizon = len(ok)
    if n < horizon:
        c = np.concatenate([[0], np.cumsum(ok)])
        full = np.flatnonzero(c[n:] - c[:-n] == n)
        if len(full):
            return list(range(int(full[0]), int(full[0]) + n))
    return [int(t) for t in np.flatnonzero(ok)[:n]]


def _roomiest(books: Sequence[NodeBook], ok: np.ndarray, n: int) -> list[int]:
    """The `n` rounds with the most free GPUs that can take the gang (`ok`: per round; ties:
    the earliest), in round order; fewer when fewer have room."""
    fits = [int(t) for t in np.flatnonzero(ok)]
    return sorted(sorted(fits, key=lambda t: (-books[t].free_gpus, t))[:n])

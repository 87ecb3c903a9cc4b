"""Placing a plan on nodes: which node or nodes each planned gang holds for the round.

A policy plans in GPUs (a set of jobs, each a gang of whole GPUs that fits the cluster's total).
Nodes make some of those plans impossible: two gangs of 3 do not fit one node of 4. `place` turns
the plan into gangs on nodes by these rules, each tie broken by node order, then job id, so that
the result depends only on its input:

1. A gang is *single-node* when some node of the cluster has at least its GPUs: it then sits on
   one node. A larger gang is *multi-node*: it takes whole free nodes (the largest first, as few
   as cover it) and no other gang shares them; the GPUs of its last node beyond the gang idle.
2. Planned jobs that hold GPUs now stay where they are when their nodes still have room
   (multi-node gangs first, then by job id).
3. The other planned jobs are placed: multi-node gangs first, then single-node gangs, largest
   first, each on the node with the fewest free GPUs that still fits it (best fit).
4. If jobs are left over, two rearrangements are tried: (a) each left-over single-node gang
   takes the node where it displaces the fewest running jobs (then GPUs), the displaced ones
   placed again by best fit; (b) the whole plan is placed again from scratch by rule 3 (a
   running job takes its own node when it has room; among equally good nodes a job takes the
   one where the fewest running jobs not yet placed sit). Of rules 2-3, (a) and (b), the one
   that places the most planned GPUs wins, then the one that moves the fewest running jobs
   (then that order). A running job placed elsewhere than it runs is `moved` (a restart).
   A non-preemptive policy's plan skips this rule (`moves=False`): its running jobs never move.
5. Planned jobs still left over are `unplaced` and leave the plan. The GPUs they would have
   taken are not left to a stop they caused: jobs that hold GPUs now but are not in the plan
   keep running where they are (`kept`, by job id) while their nodes have room, up to the
   unplaced jobs' GPUs.

`--gpus N` (and a snapshot without nodes) is one node of N GPUs: every plan that fits N GPUs is
placed whole and unchanged, so pool numbers are those of a plain GPU count.

The functions are pure (nodes, gang sizes, current placements and the GPUs that unmanaged jobs
hold in, a `Placement` out) and fast (about 0.1 s for 5,000 gangs on 1,000 nodes): the live side
can call `place` on what it reads from Slurm.
`NodeBook` is the incremental form (can a gang still fit, take it) that planners use to keep
their own packing within what can be placed.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from dataclasses import dataclass, field
from typing import Collection, Iterable, Mapping, Sequence

from .model import Node, NodeShares


class NodeBook:
    """Free GPUs per node while gangs are placed one by one (a mutable scratch pad)."""

    def __init__(self, nodes: Sequence[Node], reserved: Mapping[str, int] | None = None) -> None:
        """`reserved`: GPUs per node name held by jobs placement does not manage (taken from
        the start; a node with any is not whole)."""
        if not nodes:
            raise ValueError("placement needs at least one node")
        names = [n.name for n in nodes]
        if len(set(names)) != len(names):
            raise ValueError("node names must be unique")
        self.nodes = tuple(nodes)
        self._index = {n.name: i for i, n in enumerate(self.nodes)}
        self._cap = [n.gpus for n in self.nodes]
        self._free = list(self._cap)
        self.largest = max(self._cap)
        # node indices by free GPUs (best fit without scanning every node) and the wholly free ones
        self._by_free: list[set[int]] = [set() for _ in range(self.largest + 1)]
        self._levels: list[int] = []        # the free-GPU counts some node has, ascending
        for i, c in enumerate(self._cap):
            self._file(i, c)
        self._whole: set[int] = set(range(len(self.nodes)))
        self._whole_gpus = sum(self._cap)
        self._free_total = sum(self._cap)
        for name, gpus in (reserved or {}).items():
            if name not in self._index:
                raise ValueError(f"reserved GPUs on unknown node {name!r}")
            i = self._index[name]
            if gpus > 0:
                self._use(i, min(int(gpus), self._free[i]))

    # ------------------------------------------------------------------ queries
    @property
    def free_gpus(self) -> int:
        return self._free_total

    def free_on(self, name: str) -> int:
        return self._free[self._index[name]]

    def multi_node(self, gang: int) -> bool:
        """True for a gang larger than every node (rule 1: it takes whole nodes)."""
        return gang > self.largest

    def can_take(self, gang: int) -> bool:
        """Whether a gang of `gang` GPUs can still be placed."""
        if gang <= 0:
            return False
        if self.multi_node(gang):
            return self._whole_gpus >= gang
        return bool(self._levels) and self._levels[-1] >= gang

    # ------------------------------------------------------------------ placing
    def take(self, gang: int, prefer: NodeShares | None = None,
             avoid: Mapping[str, int] | None = None) -> NodeShares | None:
        """Place a gang by rules 1 and 3 (on `prefer`, a single node, when it has room; among
        equally good nodes, the one with the fewest GPUs in `avoid`); None when it cannot be
        placed."""
        if not self.can_take(gang):
            return None
        if self.multi_node(gang):
            return self._take_whole(gang)
        if prefer is not None and len(prefer) == 1 and prefer[0][0] in self._index:
            i = self._index[prefer[0][0]]
            if self._free[i] >= gang:
                self._use(i, gang)
                return ((self.nodes[i].name, gang),)
        f = self._levels[bisect_left(self._levels, gang)]     # best fit: the fewest free
        i = (min(self._by_free[f]) if not avoid else
             min(self._by_free[f], key=lambda i: (avoid.get(self.nodes[i].name, 0), i)))
        self._use(i, gang)
        return ((self.nodes[i].name, gang),)

    def take_at(self, shares: NodeShares) -> bool:
        """Place a gang exactly where `shares` says (rule 2); False, and nothing taken, when a
        node is unknown or lacks room. A multi-node gang needs its nodes wholly free."""
        gang = sum(g for _, g in shares)
        if not shares or any(n not in self._index or g <= 0 for n, g in shares):
            return False
        if len({n for n, _ in shares}) != len(shares):
            return False
        idx = [self._index[n] for n, _ in shares]
        whole = self.multi_node(gang)
        for i, (_, g) in zip(idx, shares):
            if (self._free[i] != self._cap[i]) if whole else (self._free[i] < g):
                return False
        for i, (_, g) in zip(idx, shares):
            self._use(i, self._cap[i] if whole else g)
        return True

    def release(self, shares: NodeShares) -> None:
        """Give back what `take` or `take_at` took for `shares`."""
        whole = self.multi_node(sum(g for _, g in shares))
        for name, g in shares:
            i = self._index[name]
            self._give(i, self._cap[i] if whole else g)

    def take_within(self, gang: int, names: Collection[str]) -> NodeShares | None:
        """`take` (rules 1 and 3) on the nodes named in `names` only; None when the gang does
        not fit there."""
        if self.multi_node(gang):
            return self._take_whole(gang, names)
        for f in self._levels[bisect_left(self._levels, gang):]:    # best fit: the fewest free
            allowed = [i for i in self._by_free[f] if self.nodes[i].name in names]
            if allowed:
                i = min(allowed)
                self._use(i, gang)
                return ((self.nodes[i].name, gang),)
        return None

    def _take_whole(self, gang: int, names: Collection[str] | None = None) -> NodeShares | None:
        """Whole free nodes for a multi-node gang (of `names` only, when given), the largest
        first; None, and nothing taken, when they do not cover it."""
        shares: list[tuple[str, int]] = []
        left = gang
        for i in sorted(self._whole, key=lambda i: (-self._cap[i], i)):
            if left <= 0:
                break
            if names is not None and self.nodes[i].name not in names:
                continue
            shares.append((self.nodes[i].name, min(left, self._cap[i])))
            left -= self._cap[i]
        if left > 0:
            return None
        for name, _ in shares:
            i = self._index[name]
            self._use(i, self._cap[i])
        return tuple(sorted(shares, key=lambda s: self._index[s[0]]))

    def _use(self, i: int, gpus: int) -> None:
        before = self._free[i]
        if before == self._cap[i]:
            self._whole.discard(i)
            self._whole_gpus -= self._cap[i]
        self._unfile(i, before)
        self._free[i] = before - gpus
        self._file(i, self._free[i])
        self._free_total -= gpus

    def _give(self, i: int, gpus: int) -> None:
        before = self._free[i]
        self._unfile(i, before)
        self._free[i] = before + gpus
        self._file(i, self._free[i])
        self._free_total += gpus
        if self._free[i] == self._cap[i]:
            self._whole.add(i)
            self._whole_gpus += self._cap[i]

    def _file(self, i: int, free: int) -> None:
        if not self._by_free[free]:
            insort(self._levels, free)
        self._by_free[free].add(i)

    def _unfile(self, i: int, free: int) -> None:
        self._by_free[free].discard(i)
        if not self._by_free[free]:
            del self._levels[bisect_left(self._levels, free)]


@dataclass(frozen=True)
class Placement:
    """Where the placed jobs sit, and what placement changed in the plan (rules 4 and 5)."""

    shares: Mapping[int, NodeShares] = field(default_factory=dict)
    unplaced: tuple[int, ...] = ()   # planned jobs that could not be placed (dropped)
    kept: tuple[int, ...] = ()       # running jobs outside the plan kept in place for those
    moved: tuple[int, ...] = ()      # running planned jobs placed elsewhere than they ran

    @property
    def jobs(self) -> frozenset[int]:
        return frozenset(self.shares)


def stay_order(book: NodeBook, gangs: Mapping[int, int], jobs: Iterable[int]) -> list[int]:
    """Rule 2's order, for gangs taken where they are: multi-node gangs first, then job id."""
    return sorted(jobs, key=lambda j: (not book.multi_node(gangs[j]), j))


def _new_order(book: NodeBook, gangs: Mapping[int, int], jobs: Iterable[int]) -> list[int]:
    """Rule 3's order: multi-node gangs first, then largest first, then job id."""
    return sorted(jobs, key=lambda j: (not book.multi_node(gangs[j]), -gangs[j], j))


def _place_keeping(nodes: Sequence[Node], gangs: Mapping[int, int],
                   running: Mapping[int, NodeShares], reserved: Mapping[str, int] | None = None
                   ) -> tuple[NodeBook, dict[int, NodeShares]]:
    """Rules 2 and 3: running planned jobs stay, the others fill in."""
    book = NodeBook(nodes, reserved)
    shares: dict[int, NodeShares] = {}
    stay = [j for j in gangs if j in running and sum(g for _, g in running[j]) == gangs[j]]
    for j in stay_order(book, gangs, stay):
        if book.take_at(running[j]):
            shares[j] = tuple(running[j])
    for j in _new_order(book, gangs, (j for j in gangs if j not in shares)):
        got = book.take(gangs[j])
        if got is not None:
            shares[j] = got
    return book, shares


def _displace(nodes: Sequence[Node], gangs: Mapping[int, int],
              running: Mapping[int, NodeShares], placed: Mapping[int, NodeShares],
              reserved: Mapping[str, int] | None = None) -> tuple[NodeBook, dict[int, NodeShares]]:
    """Rule 4, first try: each left-over single-node gang takes the node where it displaces the
    fewest running jobs (then the fewest GPUs), and the displaced gangs are placed again by best
    fit. Only tried while the cluster has as many free GPUs as the gang."""
    book = NodeBook(nodes, reserved)
    shares: dict[int, NodeShares] = {}
    on_node: dict[str, list[int]] = {}
    for j, where in placed.items():
        book.take_at(where)
        shares[j] = where
        if len(where) == 1 and not book.multi_node(gangs[j]):
            on_node.setdefault(where[0][0], []).append(j)
    for j in _new_order(book, gangs, (j for j in gangs if j not in shares)):
        g = gangs[j]
        if book.multi_node(g) or book.free_gpus < g:
            continue
        best: tuple[tuple[int, int, int], str, list[int]] | None = None
        for index, node in enumerate(book.nodes):
            free = book.free_on(node.name)
            if node.gpus < g or free == 0:
                continue
            evict: list[int] = []
            for k in sorted(on_node.get(node.name, ()), key=lambda k: (k in running, -gangs[k], k)):
                if free >= g:
                    break
                evict.append(k)
                free += gangs[k]
            cost = (sum(k in running for k in evict), sum(gangs[k] for k in evict), index)
            if free >= g and (best is None or cost < best[0]):
                best = (cost, node.name, evict)
        if best is None:
            continue
        _, name, evict = best
        for k in evict:
            book.release(shares.pop(k))
            on_node[name].remove(k)
        book.take_at(((name, g),))
        shares[j] = ((name, g),)
        on_node.setdefault(name, []).append(j)
        for k in _new_order(book, gangs, evict):
            got = book.take(gangs[k])
            if got is not None:
                shares[k] = got
                on_node.setdefault(got[0][0], []).append(k)
    return book, shares


def _repack(nodes: Sequence[Node], gangs: Mapping[int, int], running: Mapping[int, NodeShares],
            reserved: Mapping[str, int] | None = None) -> tuple[NodeBook, dict[int, NodeShares]]:
    """Rule 4: the whole plan by rule 3, running jobs preferring their own node, other jobs
    preferring nodes that fewer running jobs still to be placed call home."""
    book = NodeBook(nodes, reserved)
    shares: dict[int, NodeShares] = {}
    homes: dict[str, int] = {}
    for j in gangs:
        for node, g in running.get(j, ()):
            homes[node] = homes.get(node, 0) + g
    for j in _new_order(book, gangs, gangs):
        got = book.take(gangs[j], prefer=running.get(j), avoid=homes)
        if got is not None:
            shares[j] = got
        for node, g in running.get(j, ()):
            homes[node] -= g
    return book, shares


def place(nodes: Sequence[Node], gangs: Mapping[int, int],
          running: Mapping[int, NodeShares] | None = None,
          reserved: Mapping[str, int] | None = None, *, moves: bool = True) -> Placement:
    """Place the planned gangs (`gangs`: job id -> GPUs) on `nodes`, given where jobs hold GPUs
    now (`running`: job id -> shares, planned or not) and the GPUs per node that jobs outside
    the scheduler hold (`reserved`). See the module's rules; `moves=False` skips rule 4 (no
    running job is moved: what does not fit around them is unplaced)."""
    running = dict(running or {})
    bad = sorted(j for j, g in gangs.items() if g <= 0)
    if bad:
        raise ValueError(f"jobs {bad} have no GPUs to place")
    book, shares = _place_keeping(nodes, gangs, running, reserved)
    if moves and len(shares) < len(gangs):
        tries = [(book, shares), _displace(nodes, gangs, running, shares, reserved),
                 _repack(nodes, gangs, running, reserved)]
        book, shares = min(tries, key=lambda t: (-sum(gangs[j] for j in t[1]),
                                                 len(moved_jobs(t[1], running))))
    unplaced = tuple(sorted(set(gangs) - set(shares)))
    kept = _keep_running(book, shares, running, gangs, sum(gangs[j] for j in unplaced))
    moved = moved_jobs(shares, running)
    return Placement(shares, unplaced, kept, moved)


def moved_jobs(shares: Mapping[int, NodeShares], running: Mapping[int, NodeShares]
               ) -> tuple[int, ...]:
    """The jobs of `shares` that run now (`running`) on other nodes: moves, each a restart."""
    return tuple(sorted(j for j in shares if j in running and tuple(running[j]) != shares[j]))


def _keep_running(book: NodeBook, shares: dict[int, NodeShares],
                  running: Mapping[int, NodeShares], gangs: Mapping[int, int],
                  budget: int) -> tuple[int, ...]:
    """Rule 5: running jobs outside the plan stay in place, up to `budget` GPUs."""
    kept: list[int] = []
    for j in sorted(j for j in running if j not in gangs):
        gpus = sum(g for _, g in running[j])
        if gpus <= budget and book.take_at(tuple(running[j])):
            shares[j] = tuple(running[j])
            kept.append(j)
            budget -= gpus
    return tuple(kept)

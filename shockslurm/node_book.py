"""`NodeBook`: free GPUs per node while gangs are placed one by one, the scratch pad of
`placement` and of the planners that keep their own packing within what can be placed
(Shockwave's window layout, fifo's backfill); and the two orders placement takes gangs in.

Rule 1 of `placement` lives here: a gang that some node can hold sits on one node (best fit:
the node with the fewest free GPUs that still fits it, then node order); a larger gang takes
whole free nodes, the largest first, as few as cover it. For a job limited to some nodes
(`within`) the same holds among those nodes: a gang larger than each of them takes whole free
ones of them, but only its GPUs there (the node can still hold it alone on a larger node of
another job's, so it is not a multi-node gang of the cluster's, which owns its nodes).
A job that asks for several nodes itself (`spread` N > 1: Slurm's `-N N --gres=gpu:K`) runs as N
equal parts on N distinct nodes, each the best fit for its part (`Snapshot.node_counts`).
"""

from __future__ import annotations

from bisect import bisect_left, insort
from dataclasses import dataclass
from typing import Collection, Iterable, Mapping, Sequence

from .model import Node, NodeShares, Snapshot


@dataclass(frozen=True)
class _NodeSet:
    """Some nodes of a book (a job's `within`): their indices and the most GPUs one has."""

    indices: frozenset[int]
    largest: int


NodeSets = dict[frozenset[str], _NodeSet]


class NodeBook:
    """Free GPUs per node while gangs are placed one by one (a mutable scratch pad)."""

    def __init__(self, nodes: Sequence[Node], reserved: Mapping[str, int] | None = None,
                 node_sets: NodeSets | None = None) -> None:
        """`reserved`: GPUs per node name held by jobs placement does not manage (taken from
        the start; a node with any is not whole). `node_sets`: the `within` sets already read,
        shared by the books of one set of nodes (a job's set is read once, not per call)."""
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
        # node indices by free GPUs (best fit without scanning every node) and the wholly free
        # ones; only the counts some node has (one pool of 10,000 GPUs is one entry, not 10,001)
        self._by_free: dict[int, set[int]] = {}
        self._levels: list[int] = []        # the free-GPU counts some node has, ascending
        for i, c in enumerate(self._cap):
            self._file(i, c)
        self._whole: set[int] = set(range(len(self.nodes)))
        self._whole_gpus = sum(self._cap)
        self._free_total = sum(self._cap)
        self._sets: NodeSets = {} if node_sets is None else node_sets
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

    def spans(self, gang: int, within: Collection[str] | None = None, spread: int = 1) -> bool:
        """Whether the gang takes several nodes: it asks for several (`spread`) or is larger
        than every node (of `within`, the nodes the job may run on, when given)."""
        return spread > 1 or gang > (self.largest if within is None
                                     else self.node_set(within).largest)

    def node_set(self, within: Collection[str]) -> _NodeSet:
        """The book's nodes among `within` (names of other nodes are ignored)."""
        key = within if isinstance(within, frozenset) else frozenset(within)
        found = self._sets.get(key)
        if found is None:
            indices = frozenset(self._index[n] for n in key if n in self._index)
            found = self._sets[key] = _NodeSet(indices,
                                                max((self._cap[i] for i in indices), default=0))
        return found

    def can_take(self, gang: int, within: Collection[str] | None = None, spread: int = 1) -> bool:
        """Whether a gang of `gang` GPUs can still be placed (on the nodes named in `within`
        only, when given: the nodes a job may run on; as `spread` equal parts on as many
        nodes, when above 1)."""
        if gang <= 0:
            return False
        if spread > 1:
            return self._spread_shares(gang, spread, within) is not None
        if within is not None:
            return self._fits_within(gang, self.node_set(within))
        if self.multi_node(gang):
            return self._whole_gpus >= gang
        return bool(self._levels) and self._levels[-1] >= gang

    def _fits_within(self, gang: int, nodes: _NodeSet) -> bool:
        if gang > nodes.largest:
            return sum(self._cap[i] for i in self._whole & nodes.indices) >= gang
        return any(not self._by_free[f].isdisjoint(nodes.indices)
                   for f in self._levels[bisect_left(self._levels, gang):])

    # ------------------------------------------------------------------ placing
    def take(self, gang: int, prefer: NodeShares | None = None,
             avoid: Mapping[str, int] | None = None,
             within: Collection[str] | None = None, spread: int = 1) -> NodeShares | None:
        """Place a gang by rules 1 and 3 (on `prefer`, a single node, when it has room; among
        equally good nodes, the one with the fewest GPUs in `avoid`), on the nodes named in
        `within` only when given (the nodes the job may run on), as `spread` equal parts on
        as many nodes when above 1 (on `prefer` when it is such a shape with room); None when
        it cannot be placed."""
        if spread > 1:
            shares = self._spread_shares(gang, spread, within, prefer, avoid)
            return shares if shares is not None and self.take_at(shares) else None
        if not self.can_take(gang, within):
            return None
        nodes = None if within is None else self.node_set(within)
        if self.spans(gang, within):
            return self._take_whole(gang, None if nodes is None else nodes.indices)
        if prefer is not None and len(prefer) == 1 and prefer[0][0] in self._index:
            i = self._index[prefer[0][0]]
            if self._free[i] >= gang and (nodes is None or i in nodes.indices):
                self._use(i, gang)
                return ((self.nodes[i].name, gang),)
        for f in self._levels[bisect_left(self._levels, gang):]:    # best fit: the fewest free
            bucket = self._by_free[f] if nodes is None else self._by_free[f] & nodes.indices
            if bucket:
                i = (min(bucket) if not avoid else
                     min(bucket, key=lambda i: (avoid.get(self.nodes[i].name, 0), i)))
                self._use(i, gang)
                return ((self.nodes[i].name, gang),)
        return None

    def holds_whole(self, gang: int, parts: int = 1, running: bool = False) -> bool:
        """Whether a gang holds its nodes whole: a multi-node gang of the cluster's (rule 1)
        that does not run yet, placed new or released to start there, since Slurm, not the
        plan, chooses how its GPUs split over those nodes (`--gpus=12` on nodes of 8: 8 and 4,
        or 7 and 5). A running gang holds the GPUs Slurm gave it, one that asks for several
        nodes itself (`parts`) its equal parts, one limited to smaller nodes its GPUs."""
        return not running and parts == 1 and self.multi_node(gang)

    def take_at(self, shares: NodeShares, whole: bool = False) -> bool:
        """Place a gang exactly where `shares` says (rule 2); False, and nothing taken, when a
        node is unknown or lacks room. A gang that holds its nodes `whole` (`holds_whole`)
        needs them wholly free."""
        if not shares or any(n not in self._index or g <= 0 for n, g in shares):
            return False
        if len({n for n, _ in shares}) != len(shares):
            return False
        idx = [self._index[n] for n, _ in shares]
        for i, (_, g) in zip(idx, shares):
            if (self._free[i] != self._cap[i]) if whole else (self._free[i] < g):
                return False
        for i, (_, g) in zip(idx, shares):
            self._use(i, self._cap[i] if whole else g)
        return True

    def release(self, shares: NodeShares, whole: bool = False) -> None:
        """Give back what `take` or `take_at` took for `shares` (`whole`: as `take_at` was
        told, or as `holds_whole` says of a gang `take` placed)."""
        for name, g in shares:
            i = self._index[name]
            self._give(i, self._cap[i] if whole else g)

    def _spread_shares(self, gang: int, count: int, within: Collection[str] | None = None,
                       prefer: NodeShares | None = None,
                       avoid: Mapping[str, int] | None = None) -> NodeShares | None:
        """Where `take` puts a gang that runs as `count` equal parts on as many nodes (of
        `within`, when given), taking nothing: `prefer` when it is that shape and has room, else
        each part on the best fit (the fewest free GPUs that hold it; then the fewest GPUs in
        `avoid`, then node order). None when too few nodes have room, or the gang does not
        split evenly."""
        if count <= 0 or gang % count:
            return None
        part = gang // count
        nodes = None if within is None else self.node_set(within).indices
        if prefer is not None and len(prefer) == count and self._holds(prefer, part, nodes):
            return tuple(prefer)
        fits = [i for f in self._levels[bisect_left(self._levels, part):]
                for i in self._by_free[f] if nodes is None or i in nodes]
        key = (lambda i: (self._free[i], i)) if not avoid else \
            (lambda i: (self._free[i], avoid.get(self.nodes[i].name, 0), i))
        chosen = sorted(sorted(fits, key=key)[:count])
        if len(chosen) < count:
            return None
        return tuple((self.nodes[i].name, part) for i in chosen)

    def _holds(self, shares: NodeShares, part: int, nodes: Collection[int] | None) -> bool:
        """Whether `shares` are `part` GPUs on distinct known nodes (of `nodes` when given),
        each with room for its part."""
        if any(n not in self._index or g != part for n, g in shares):
            return False
        idx = {self._index[n] for n, _ in shares}
        return len(idx) == len(shares) and all(
            self._free[i] >= part and (nodes is None or i in nodes) for i in idx)

    def _take_whole(self, gang: int, indices: Collection[int] | None = None
                    ) -> NodeShares | None:
        """Whole free nodes for a gang no single node (of `indices`, when given) holds, the
        largest first; None, and nothing taken, when they do not cover it. A multi-node gang of
        the cluster's takes its nodes whole; one only limited to smaller nodes, its GPUs."""
        shares: list[tuple[str, int]] = []
        left = gang
        free = self._whole if indices is None else self._whole & set(indices)
        for i in sorted(free, key=lambda i: (-self._cap[i], i)):
            if left <= 0:
                break
            shares.append((self.nodes[i].name, min(left, self._cap[i])))
            left -= self._cap[i]
        if left > 0:
            return None
        whole = self.multi_node(gang)
        for name, g in shares:
            i = self._index[name]
            self._use(i, self._cap[i] if whole else g)
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
        bucket = self._by_free.get(free)
        if bucket is None:
            bucket = self._by_free[free] = set()
            insort(self._levels, free)
        bucket.add(i)

    def _unfile(self, i: int, free: int) -> None:
        bucket = self._by_free[free]
        bucket.discard(i)
        if not bucket:
            del self._by_free[free]
            del self._levels[bisect_left(self._levels, free)]


def holds_whole_in(book: NodeBook, snapshot: Snapshot, job_id: int, shares: NodeShares) -> bool:
    """`book.holds_whole` for a job of `snapshot` on `shares`: its gang, the parts it asks for,
    and whether `shares` are where it runs now."""
    return book.holds_whole(sum(g for _, g in shares), snapshot.parts(job_id),
                            snapshot.runs_at(job_id, shares))


def stay_order(book: NodeBook, gangs: Mapping[int, int], jobs: Iterable[int]) -> list[int]:
    """Rule 2's order, for gangs taken where they are: multi-node gangs first, then job id."""
    return sorted(jobs, key=lambda j: (not book.multi_node(gangs[j]), j))


def new_order(book: NodeBook, gangs: Mapping[int, int], jobs: Iterable[int],
              limited: Mapping[int, Collection[str]] | None = None,
              spread: Collection[int] = ()) -> list[int]:
    """Rule 3's order: multi-node gangs first (those larger than every node, and the jobs
    that ask for several nodes, `spread`), then largest first, then (of one size) the jobs
    `limited` to some nodes, those with the fewest first (they have fewer to go to), then job
    id."""
    few = limited or {}
    return sorted(jobs, key=lambda j: (not (book.multi_node(gangs[j]) or j in spread), -gangs[j],
                                       len(few[j]) if j in few else len(book.nodes) + 1, j))

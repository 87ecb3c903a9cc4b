"""Placing a plan on nodes: which node or nodes each planned gang holds for the round.

A policy plans in GPUs (a set of jobs, each a gang of whole GPUs that fits the cluster's total).
Nodes make some of those plans impossible: two gangs of 3 do not fit one node of 4. `place` turns
the plan into gangs on nodes by these rules, each tie broken by node order, then job id, so that
the result depends only on its input:

1. A gang is *single-node* when some node of the cluster has at least its GPUs: it then sits on
   one node. A larger gang is *multi-node*: it takes whole free nodes (the largest first, as few
   as cover it) and no other gang shares them; the GPUs of its last node beyond the gang idle.
   So does one released to start on nodes it does not hold yet (Slurm chooses how its GPUs
   split over them). Once it runs it holds what Slurm gave it, GPUs on each node, and other
   gangs may use the rest (`NodeBook.holds_whole`).
   A job limited to some nodes (`allowed`: on the live cluster its partition's, of its GPU
   type, those its user's own limits leave it) is placed on those only, by the same rules
   among them: a gang larger than each of them takes whole free ones of them, but only its
   GPUs there (`node_book`). A released job pinned outside them is not kept there (rule 2).
   A job that asks for several nodes itself (`node_counts`, Slurm's `-N 2 --gres=gpu:4`) runs
   as that many equal parts, each on its own node by best fit, and is placed with the
   multi-node gangs.
2. Planned jobs that hold GPUs now stay where they are when their nodes still have room
   (multi-node gangs first, then by job id; each holds its GPUs there, as `-N3 --gres=gpu:4`
   on nodes of 8 or `--gpus=10` as 8 and 2, not its nodes whole); so
   do planned jobs released to start on nodes
   they do not hold yet (`pinned`: Slurm may be starting them there as the round reads, and
   a job sent elsewhere then starts where it was pinned, on GPUs the plan gave another).
3. The other planned jobs are placed: multi-node gangs first, then single-node gangs, largest
   first (of one size, the jobs limited to the fewest nodes first), each on the node with the
   fewest free GPUs that still fits it (best fit; among those, the node the fewest limited
   jobs may use).
4. If jobs are left over, three rearrangements are tried: (a) each left-over single-node gang
   takes the node where it displaces the fewest running jobs (then GPUs), the displaced ones
   placed again by best fit (a limited gang may empty a full node of its own); (b) the whole plan is placed again from scratch by rule 3 (a
   running job takes its own node when it has room; among equally good nodes a job takes the
   one where the fewest running jobs not yet placed sit); (c) rules 2-3 for the running and
   multi-node gangs, then each node, the fullest first, filled with the single-node gangs
   whose sizes come closest to its free GPUs (a small knapsack: best fit largest first misses
   fits such as 4, 3, 3, 2, 2, 2 on two nodes of 8). Of rules 2-3, (a), (b) and (c), the one
   that places the most planned GPUs wins, then the one that moves the fewest running jobs,
   then the one that sends the fewest pinned jobs elsewhere (then that order). A running job
   placed elsewhere than it runs is `moved` (a restart); a pinned one is not.
   A non-preemptive policy's plan tries only (c): its running jobs never move.
5. Planned jobs still left over are `unplaced` and leave the plan. The GPUs they would have
   taken are not left to a stop they caused: jobs that hold GPUs now but are not in the plan
   keep running where they are (`kept`, by job id) while their nodes have room, up to the
   unplaced jobs' GPUs.

`--gpus N` (and a snapshot without nodes) is one node of N GPUs: every plan that fits N GPUs is
placed whole and unchanged, so pool numbers are those of a plain GPU count.

The functions are pure (nodes, gang sizes, current placements and the GPUs that unmanaged jobs
hold in, a `Placement` out) and fast (about 0.1 s for 5,000 gangs on 1,000 nodes; about
0.3 s when half of them are limited to 100, 900 or 999 of the nodes): the live side can call
`place` on what it reads from Slurm.
`node_book.NodeBook` is the incremental form (can a gang still fit, take it; rules 1 and 3)
that this module and the planners use to keep their own packing within what can be placed.
"""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Collection, Iterable, Mapping, Sequence

from .model import Node, NodeShares
from .node_book import NodeBook, NodeSets, new_order, stay_order


@dataclass(frozen=True)
class Allowed:
    """The nodes each job limited to some may run on (job id -> node names), the node count of
    each job that asks for several nodes (`spread`: job id -> N, its gang in N equal parts), the
    jobs that hold GPUs now and where (`running`: what they hold is what Slurm gave them), and
    the node sets the books of one placement share (each job's set read once)."""

    nodes: Mapping[int, frozenset[str]]
    spread: Mapping[int, int] = field(default_factory=dict)
    running: Mapping[int, NodeShares] = field(default_factory=dict)
    sets: NodeSets = field(default_factory=dict)

    def whole(self, book: NodeBook, job_id: int, shares: NodeShares) -> bool:
        """Whether the job's gang on `shares` holds its nodes whole (`NodeBook.holds_whole`:
        not where it runs now)."""
        return book.holds_whole(sum(g for _, g in shares), self.parts(job_id),
                                tuple(self.running.get(job_id, ())) == tuple(shares))

    def get(self, job_id: int) -> frozenset[str] | None:
        return self.nodes.get(job_id)

    def parts(self, job_id: int) -> int:
        """The nodes the job asks for (1: as many as rule 1 gives its gang)."""
        return self.spread.get(job_id, 1)

    def take(self, book: NodeBook, job_id: int, gang: int, prefer: NodeShares | None = None,
             avoid: Mapping[str, int] | None = None) -> NodeShares | None:
        """`book.take` for one job, on the nodes it may run on, in the parts it asks for."""
        return book.take(gang, prefer=prefer, avoid=avoid, within=self.nodes.get(job_id),
                         spread=self.parts(job_id))

    def order(self, book: NodeBook, gangs: Mapping[int, int], jobs: Iterable[int]) -> list[int]:
        """Rule 3's order (`node_book.new_order`) with these limits."""
        return new_order(book, gangs, jobs, self.nodes, self.spread)

    def __contains__(self, job_id: object) -> bool:
        return job_id in self.nodes

    def __bool__(self) -> bool:
        return bool(self.nodes)

    def book(self, nodes: Sequence[Node], reserved: Mapping[str, int] | None) -> NodeBook:
        return NodeBook(nodes, reserved, self.sets)

    def demand(self, jobs: Collection[int]) -> dict[str, int]:
        """How many of `jobs` are limited to each node (gangs avoid those nodes)."""
        count: dict[str, int] = {}
        for names, jobs_there in Counter(self.nodes[j] for j in jobs if j in self.nodes).items():
            for name in names:
                count[name] = count.get(name, 0) + jobs_there
        return count


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


def _stay(book: NodeBook, gangs: Mapping[int, int], running: Mapping[int, NodeShares],
          allowed: Allowed) -> dict[int, NodeShares]:
    """Rule 2: the planned jobs that hold their whole gang now stay where they are, when their
    nodes still have room (taken in `book`)."""
    shares: dict[int, NodeShares] = {}
    stay = [j for j in gangs if j in running and sum(g for _, g in running[j]) == gangs[j]]
    for j in stay_order(book, gangs, stay):
        if book.take_at(running[j], allowed.whole(book, j, running[j])):
            shares[j] = tuple(running[j])
    return shares


def _place_keeping(nodes: Sequence[Node], gangs: Mapping[int, int],
                   running: Mapping[int, NodeShares], reserved: Mapping[str, int] | None,
                   allowed: Allowed) -> tuple[NodeBook, dict[int, NodeShares]]:
    """Rules 2 and 3: running planned jobs stay, the others fill in."""
    book = allowed.book(nodes, reserved)
    shares = _stay(book, gangs, running, allowed)
    left = [j for j in gangs if j not in shares]
    avoid = allowed.demand(left) or None       # gangs leave limited ones their nodes
    for j in allowed.order(book, gangs, left):
        got = allowed.take(book, j, gangs[j], avoid=avoid)
        if got is not None:
            shares[j] = got
    return book, shares


def _displace(nodes: Sequence[Node], gangs: Mapping[int, int],
              running: Mapping[int, NodeShares], placed: Mapping[int, NodeShares],
              reserved: Mapping[str, int] | None, allowed: Allowed
              ) -> tuple[NodeBook, dict[int, NodeShares]]:
    """Rule 4, first try: each left-over single-node gang takes the node where it displaces the
    fewest running jobs (then the fewest GPUs), and the displaced gangs are placed again by best
    fit. Only tried while the cluster has as many free GPUs as the gang."""
    book = allowed.book(nodes, reserved)
    shares: dict[int, NodeShares] = {}
    on_node: dict[str, list[int]] = {}
    for j, where in placed.items():
        book.take_at(where, allowed.whole(book, j, where))
        shares[j] = where
        if len(where) == 1 and not book.multi_node(gangs[j]):
            on_node.setdefault(where[0][0], []).append(j)
    for j in allowed.order(book, gangs, (j for j in gangs if j not in shares)):
        g, within = gangs[j], allowed.get(j)
        if book.spans(g, spread=allowed.parts(j)) or book.free_gpus < g:
            continue
        best: tuple[tuple[int, int, int], str, list[int]] | None = None
        for index, node in enumerate(book.nodes):
            free = book.free_on(node.name)
            if node.gpus < g or (within is not None and node.name not in within):
                continue
            if free == 0 and (within is None or not on_node.get(node.name)):
                continue                   # a limited gang may empty a full node of its own
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
        for k in allowed.order(book, gangs, evict):
            got = allowed.take(book, k, gangs[k])
            if got is not None:
                shares[k] = got
                on_node.setdefault(got[0][0], []).append(k)
    return book, shares


def _repack(nodes: Sequence[Node], gangs: Mapping[int, int], running: Mapping[int, NodeShares],
            reserved: Mapping[str, int] | None, allowed: Allowed
            ) -> tuple[NodeBook, dict[int, NodeShares]]:
    """Rule 4: the whole plan by rule 3, running jobs preferring their own node, other jobs
    preferring nodes that fewer running jobs still to be placed call home."""
    book = allowed.book(nodes, reserved)
    shares: dict[int, NodeShares] = {}
    homes: dict[str, int] = {}
    for j in gangs:
        for node, g in running.get(j, ()):
            homes[node] = homes.get(node, 0) + g
    for j in allowed.order(book, gangs, gangs):
        got = allowed.take(book, j, gangs[j], prefer=running.get(j), avoid=homes)
        if got is not None:
            shares[j] = got
        for node, g in running.get(j, ()):
            homes[node] -= g
    return book, shares


def _fill(nodes: Sequence[Node], gangs: Mapping[int, int], running: Mapping[int, NodeShares],
          reserved: Mapping[str, int] | None, allowed: Allowed
          ) -> tuple[NodeBook, dict[int, NodeShares]]:
    """Rule 4, last try (moves no running job): rules 2 and 3 for the running and multi-node
    gangs, then each node in turn, the fullest first, filled with the single-node gangs whose
    sizes add up closest to its free GPUs (largest sizes first; of one size, the jobs limited
    to the fewest nodes first, they have fewer to go to, then rule 3's order). Best fit largest
    first misses fits such as gangs 4, 3, 3, 2, 2, 2 on two free nodes of 8 (4+2+2, 3+3+2)."""
    book = allowed.book(nodes, reserved)
    shares = _stay(book, gangs, running, allowed)
    anywhere: dict[int, deque[int]] = {}     # single-node gangs by size, in rule 3's order
    limited: dict[frozenset[str], dict[int, deque[int]]] = {}   # the same by the nodes allowed
    seen: dict[frozenset[str], int] = {}     # each node set's first job in that order
    for j in allowed.order(book, gangs, (j for j in gangs if j not in shares)):
        if book.spans(gangs[j], allowed.get(j), allowed.parts(j)):
            got = allowed.take(book, j, gangs[j])
            if got is not None:
                shares[j] = got
        elif j in allowed:
            key = allowed.nodes[j]
            seen.setdefault(key, len(seen))
            limited.setdefault(key, {}).setdefault(gangs[j], deque()).append(j)
        else:
            anywhere.setdefault(gangs[j], deque()).append(j)
    # of one size, the jobs limited to the fewest nodes take a node's room first
    groups = sorted(limited.items(), key=lambda item: (len(item[0]), seen[item[0]]))
    for i in sorted(range(len(book.nodes)), key=lambda i: (book.free_on(book.nodes[i].name), i)):
        name = book.nodes[i].name
        here = [sizes for key, sizes in groups if name in key]
        counts = {g: len(js) for g, js in anywhere.items()}
        for sizes in here:
            for g, js in sizes.items():
                counts[g] = counts.get(g, 0) + len(js)
        for size in _closest_sum(book.free_on(name), counts):
            queue = next((sizes[size] for sizes in here if sizes.get(size)), None) \
                or anywhere[size]
            j = queue.popleft()
            book.take_at(((name, size),))
            shares[j] = ((name, size),)
    return book, shares


def _closest_sum(room: int, counts: Mapping[int, int]) -> list[int]:
    """Sizes (as many of each as `counts` has) adding up to the most GPUs within `room`, the
    largest sizes first (a bounded knapsack over at most `room` GPUs)."""
    best: dict[int, list[int]] = {0: []}
    for size in sorted((g for g, n in counts.items() if n and g <= room), reverse=True):
        for total, picked in sorted(best.items(), reverse=True):
            for k in range(1, counts[size] + 1):
                t = total + k * size
                if t > room:
                    break
                if t not in best:
                    best[t] = picked + [size] * k
    return best[max(best)]


def place(nodes: Sequence[Node], gangs: Mapping[int, int],
          running: Mapping[int, NodeShares] | None = None,
          reserved: Mapping[str, int] | None = None, *, moves: bool = True,
          pinned: Mapping[int, NodeShares] | None = None,
          allowed: Mapping[int, Collection[str]] | None = None,
          node_counts: Mapping[int, int] | None = None) -> Placement:
    """Place the planned gangs (`gangs`: job id -> GPUs) on `nodes`, given where jobs hold GPUs
    now (`running`: job id -> shares, planned or not), the GPUs per node that jobs outside
    the scheduler hold (`reserved`), the nodes released jobs that hold none yet are to start
    on (`pinned`), the nodes some jobs may run on (`allowed`: job id -> node names; a job
    not in it may run on any node) and the jobs that ask for several nodes (`node_counts`: job
    id -> N > 1, its gang in N equal parts on N nodes). See the module's rules; `moves=False`
    skips rule 4 (no running job is moved: what does not fit around them is unplaced)."""
    running = dict(running or {})
    allow = Allowed({j: frozenset(names) for j, names in (allowed or {}).items() if j in gangs},
                    {j: n for j, n in (node_counts or {}).items() if j in gangs and n > 1},
                    running)
    waiting = {j: tuple(s) for j, s in (pinned or {}).items() if j not in running
               and (j not in allow or all(n in allow.nodes[j] for n, _ in s))}
    homes = {**waiting, **running}
    bad = sorted(j for j, g in gangs.items() if g <= 0)
    if bad:
        raise ValueError(f"jobs {bad} have no GPUs to place")
    book, shares = _place_keeping(nodes, gangs, homes, reserved, allow)
    if len(shares) < len(gangs):
        tries = [(book, shares)]
        if moves:
            tries += [_displace(nodes, gangs, running, shares, reserved, allow),
                      _repack(nodes, gangs, homes, reserved, allow)]
        tries.append(_fill(nodes, gangs, homes, reserved, allow))
        book, shares = min(tries, key=lambda t: (-sum(gangs[j] for j in t[1]),
                                                 len(moved_jobs(t[1], running)),
                                                 len(moved_jobs(t[1], waiting))))
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

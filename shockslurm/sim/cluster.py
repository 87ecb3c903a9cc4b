"""The simulated cluster: the `Cluster` the round loop drives in simulation.

Semantics follow the reference simulator (SHOCKWAVE.md, "Workload model"), so that numbers are
comparable:
- A dispatched job holds its whole gang for the round and runs `int(throughput * round_s)`
  iterations (or what remains; in `profile` adaptation mode at each batch size of its schedule
  in turn, switching at the epoch boundary: `SimJob.plan_run`); it finishes at the exact moment
  its iterations run out, which is its completion time if it has no work left.
- The next round starts when the last job dispatched in this one has finished (slightly under
  `round_s` for full rounds), or at the next arrival when nothing runs.
- Restart overhead: a job that runs in a round after not running in the previous one (its first
  round counts, except in the very first round of the run) loses `restart_overhead_s` of that
  round; the reference charges it only when the run is a (nearly) full round, i.e. longer than
  `round_s - 5`, by cutting iterations in proportion.
- Jobs that arrive during a round join at the next round boundary.
- Nodes: the cluster is `nodes` (one pool of `gpus` GPUs when none are given); a round runs only
  the jobs the plan placed (`plan_on_nodes.place_plan`, done by the round loop, or here for a plan
  that comes unplaced), so fragmentation costs simulated time. A job placed on other nodes than
  it ran on in the previous round restarts: it pays the restart overhead like a resumed job.

`fill_on_completion` (off by default; the reference's rounds above are what its numbers assume):
the live daemon's event-driven rounds (`event_poll_seconds`). A round ends early, at the moment
a dispatched job finishes while other jobs wait (active and not dispatched, or arrived by then),
or a job arrives whose gang the GPUs idle at that moment can place (no running job is in the
way), and the next round is a normal round from that moment: the jobs still running are cut there
(their progress so far is kept, whole iterations unless `keep_partial_iterations`, and they are
not restarted if the next plan keeps them).
The daemon's churn bounds apply as they do live (`churn`, `churn_rules`: a running job the plan
would stop or move keeps running where it runs while its current run is younger than 1.5 rounds
or it is expected to end within two rounds; planned starts that no longer fit wait, latest
arrival first; the plan is placed again around the jobs kept, and a start whose nodes they still
hold waits), and so does its rule for the stops that follow (`churn_rules.idle_stops`: a running
job whose GPUs no job of the round takes keeps running where it is).
Restarts are charged as they happen live: a restarted run spends its first
`restart_overhead_s` without progress whatever its length (a run cut during it owes the rest in
the next round), instead of the reference's full-round-only rule.

`keep_partial_iterations` (off by default; the reference counts whole iterations per round): a
job that runs on into the next round, on the same nodes, keeps the part of an iteration it had
done when the round ended, as a live job, which never notices a round boundary, does; a run that
does not end holds its GPUs for the whole round. A stopped or moved job loses that part. Whole
iterations per round cost a job up to one iteration a round: nothing while iterations are short
next to the rounds, but a job slower than one iteration a round would never end (the simulator
refuses such a workload unless this is on).

`declared_profile` (off by default): the policy sees each job as the live daemon does, from
what `shocksub` declares (`JobSpec.declared_profile`: every epoch at the initial batch size and
the first epoch's duration), not its per-epoch profile; the job still runs by its profile, and
its measured rate at the current batch size is in the view, as the training helper reports it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Sequence

from ..churn_rules import ChurnLimits, bound_run, early_stop_reason, idle_stops
from ..model import EpochProfile, JobSpec, JobView, Node, NodeShares, RoundPlan, Snapshot, pool
from ..node_book import NodeBook
from ..placement import moved_jobs
from ..plan_on_nodes import fit_on_nodes, free_after, place_around, place_plan
from ..policies import PolicySettings
from .jobs import Run, SimJob
from .job_nodes import limited_jobs, node_counts

FULL_ROUND_SLACK_S = 5.0
RESTART_OVERHEAD_S = 20.0       # the default time a job loses when it is restarted


@dataclass
class Dispatch:
    job_id: int
    run: Run                      # the work planned for the round (`SimJob.plan_run`)
    finish_s: float
    overhead_s: float = 0.0       # fill_on_completion: restart time at the start of the run
    carry_s: float = 0.0          # keep_partial_iterations: the iteration's part done before it


@dataclass
class SimulatedCluster:
    gpus: int
    jobs: Sequence[JobSpec]
    round_s: float = PolicySettings.round_s
    restart_overhead_s: float = RESTART_OVERHEAD_S
    adaptation: str = "profile"
    nodes: tuple[Node, ...] = ()
    fill_on_completion: bool = False
    churn: ChurnLimits | None = None      # the daemon's churn bounds (live-like rounds)
    declared_profile: bool = False        # views carry the declared spec, not the profile
    keep_partial_iterations: bool = False # a run going on keeps its iteration in progress
    sim_jobs: dict[int, SimJob] = field(init=False)
    gpu_seconds_used: float = field(init=False, default=0.0)
    demand_timeline: list[tuple[float, int]] = field(init=False, default_factory=list)

    def __post_init__(self) -> None:
        if self.gpus <= 0:
            raise ValueError("the cluster needs at least one GPU")
        if not self.nodes:
            self.nodes = pool(self.gpus)
        if sum(n.gpus for n in self.nodes) != self.gpus:
            raise ValueError(f"the nodes hold {sum(n.gpus for n in self.nodes)} GPUs, "
                             f"not {self.gpus}")
        too_big = [j for j in self.jobs if j.gang_size > self.gpus]
        if too_big:
            asked = ", ".join(f"{j.job_id} ({j.gang_size} GPUs)" for j in too_big[:10])
            more = f" and {len(too_big) - 10} more" if len(too_big) > 10 else ""
            raise ValueError(f"the workload's jobs {asked}{more} ask for more GPUs than the "
                             f"cluster has ({self.gpus}): give a larger cluster (--gpus, "
                             "--cluster) or leave them out")
        self._allowed = limited_jobs(self.jobs, self.nodes)
        self._node_counts = node_counts(self.jobs, self.nodes, self._allowed)
        self.sim_jobs = {j.job_id: SimJob(j, adaptation=self.adaptation) for j in self.jobs}
        self._pending = sorted(self.jobs, key=lambda j: (j.arrival_s, j.job_id))
        self._active: dict[int, SimJob] = {}
        self._running: list[Dispatch] = []
        self._round_start = 0.0
        self._previous: frozenset[int] = frozenset()   # jobs dispatched in the previous round
        self._where: dict[int, NodeShares] = {}         # their nodes
        self._moved: frozenset[int] = frozenset()       # dispatched now on other nodes than then
        self._rounds_dispatched = 0
        self._overhead_left: dict[int, float] = {}      # fill: restart time a cut run still owes
        self._run_start: dict[int, float] = {}          # churn: when each current run began
        self._carry: dict[int, float] = {}              # keep_partial_iterations: each run's
                                                        # part-done iteration at the round's end

    # ------------------------------------------------------------------ Cluster protocol
    def observe(self, now: float) -> Snapshot:
        if self.fill_on_completion:
            self._cut_round(now)
        else:
            self._complete_round()
        for job in self._active.values():
            job.update_flags()
        while self._pending and self._pending[0].arrival_s <= now:
            spec = self._pending.pop(0)
            self._active[spec.job_id] = self.sim_jobs[spec.job_id]
        self.demand_timeline.append((now, sum(j.spec.gang_size for j in self._active.values())))
        views = tuple(self._view(j) for j in self._active.values())
        placements = {j: s for j, s in self._where.items() if j in self._active}
        allowed = {j: self._allowed[j] for j in self._active if j in self._allowed}
        counts = {j: self._node_counts[j] for j in self._active if j in self._node_counts}
        return Snapshot(now=now, round_index=self._rounds_dispatched, round_s=self.round_s,
                        gpus=self.gpus, jobs=views, nodes=self.nodes, placements=placements,
                        allowed_nodes=allowed, node_counts=counts)

    def enact(self, plan: RoundPlan, snapshot: Snapshot) -> None:
        now = snapshot.now
        if not set(plan.run) <= set(plan.placement):      # a plan that comes unplaced
            plan = place_plan(plan, snapshot)
        if self.churn is not None:
            plan = self._bounded(plan, snapshot, self.churn)
            plan = self._keep_idle_stops(plan, snapshot)
        self._moved = frozenset(j for j in plan.run if j in self._previous
                                and self._where.get(j) != plan.placement[j])
        for j in plan.run:
            if not self._runs_on(j):
                self._run_start[j] = now
        self._where = {j: tuple(plan.placement[j]) for j in plan.run}
        self._round_start = now
        self._running = []
        for job_id in sorted(plan.run):
            job = self._active[job_id]
            overhead = self._restart_s(job_id) if self.fill_on_completion else 0.0
            self._running.append(self._dispatch(job, now, overhead))
        self._carry = {}
        self._rounds_dispatched += 1

    def _dispatch(self, job: SimJob, now: float, overhead_s: float) -> Dispatch:
        """The job's run in the round starting `now` after `overhead_s` of restart: whole
        iterations in what is left of the round, or (`keep_partial_iterations`) counted from
        the part of an iteration a run going on brings with it, the GPUs held to the round's
        end unless the job ends first."""
        span = max(0.0, self.round_s - overhead_s)
        carry = self._carry.get(job.spec.job_id, 0.0) if self._runs_on(job.spec.job_id) else 0.0
        run = job.plan_run(span + carry)
        held = (run.seconds - carry if run.completes or not self.keep_partial_iterations
                else span)
        return Dispatch(job.spec.job_id, run, now + overhead_s + max(0.0, held), overhead_s,
                        carry)

    def _keep_carry(self, d: Dispatch, exec_s: float, done: Run) -> None:
        """keep_partial_iterations: the part of an iteration `d`'s job had done when its run
        of `exec_s` useful seconds, whose whole iterations are `done`, was accounted."""
        if self.keep_partial_iterations and not done.completes:
            self._carry[d.job_id] = max(0.0, exec_s + d.carry_s - done.seconds)

    def next_round_start(self, now: float, round_s: float) -> float:
        if self._running:
            end = max(now, max(d.finish_s for d in self._running))
            early = self._first_event(end) if self.fill_on_completion else None
            return end if early is None else max(now, early)
        arrival = self.next_arrival(now)
        return arrival if arrival is not None else now + round_s

    def finished(self) -> bool:
        return not self._pending and not self._active and not self._running

    def next_arrival(self, now: float) -> float | None:
        return self._pending[0].arrival_s if self._pending else None

    # ------------------------------------------------------------------ internals
    def _bounded(self, plan: RoundPlan, snapshot: Snapshot, churn: ChurnLimits) -> RoundPlan:
        """The daemon's churn bounds (`churn_rules`, as `live.phases` applies them): running
        jobs the plan would stop or move (a move is a stop and a restart) but the daemon would
        keep keep running where they run; planned starts that no longer fit wait; the plan is
        placed again around the jobs that keep their GPUs (`plan_on_nodes.place_around`; the
        running jobs the bounds let move may move), and a start whose planned nodes they still
        hold waits (`fit_on_nodes`)."""
        now = snapshot.now
        running = [j for j in self._previous if j in self._active]
        moved = plan.info_ids("moved") & set(running)
        protected = {j for j in running if early_stop_reason(
            churn, now - self._run_start.get(j, now),
            self._active[j].remaining_iterations / self._active[j].throughput) is not None}
        keep = [j for j in running if (j not in plan.run or j in moved) and j in protected]
        if not keep:
            return plan
        order = sorted((j for j in plan.run if j not in running),
                       key=lambda j: (self._active[j].spec.arrival_s, j))
        gpus = {j: self._active[j].spec.gang_size for j in (*plan.run, *keep)}
        run, dropped = bound_run(plan.run, running, keep, gpus, order, self.gpus)
        info = {**plan.info, "kept": sorted(keep)}
        if dropped:
            info["dropped"] = list(dropped)
        placed = place_around(RoundPlan(run, info, {j: s for j, s in plan.placement.items()
                                                    if j in run}),
                              snapshot, {j for j in run if j in running and j not in protected})
        return self._fit_starts(placed, snapshot, set(moved_jobs(placed.placement, self._where)))

    def _fit_starts(self, plan: RoundPlan, snapshot: Snapshot, moved: set[int]) -> RoundPlan:
        """`plan` with every running job it keeps (all but the `moved` ones) where it runs, and
        without the starts whose planned nodes they still hold (the daemon's `fit_nodes`)."""
        holding = {j: self._where[j] for j in plan.run if j in self._where and j not in moved}
        free = free_after(snapshot.cluster_nodes, snapshot.reserved, holding)
        starts = sorted((j for j in plan.run if j not in holding),
                        key=lambda j: (self._active[j].spec.arrival_s, j))
        dropped = fit_on_nodes(starts, plan.placement, free)
        placement = {**{j: s for j, s in plan.placement.items() if j not in dropped}, **holding}
        info = dict(plan.info)
        if dropped:
            info["dropped"] = sorted(set(plan.info_ids("dropped")) | set(dropped))
        return RoundPlan(plan.run - frozenset(dropped), info, placement)

    def _keep_idle_stops(self, plan: RoundPlan, snapshot: Snapshot) -> RoundPlan:
        """The daemon's rule (`churn_rules.idle_stops`): a running job the placed plan stops
        keeps running where it runs when no job of the round takes its GPUs, the job nearest to
        its end first."""
        stopping = sorted((j for j in self._previous if j in self._active
                           and j not in plan.run and j in self._where),
                          key=lambda j: (self._active[j].remaining_iterations
                                         / self._active[j].throughput, j))
        if not stopping:
            return plan
        free = free_after(snapshot.cluster_nodes, snapshot.reserved, plan.placement)
        kept = idle_stops(stopping, self._where, free)
        if not kept:
            return plan
        return RoundPlan(plan.run | frozenset(kept), {**plan.info, "idle_kept": list(kept)},
                         {**plan.placement, **{j: self._where[j] for j in kept}})

    def _runs_on(self, job_id: int) -> bool:
        """The job ran in the previous round and this round keeps it on the same nodes: it
        goes on without a restart."""
        return job_id in self._previous and job_id not in self._moved

    def _restart_s(self, job_id: int) -> float:
        """fill_on_completion: the restart time a run of `job_id` starting now spends first."""
        if self._runs_on(job_id):
            return self._overhead_left.get(job_id, 0.0)
        first_round = self._rounds_dispatched == 0
        return 0.0 if first_round else self.restart_overhead_s

    def _first_event(self, end: float) -> float | None:
        """fill_on_completion: the first moment before `end` that starts a round early: a
        completion that frees GPUs while a job waits, or an arrival that fits the idle GPUs."""
        fill = self._first_fill(end)
        arrival = self._first_arrival_fit(end if fill is None else fill)
        return fill if arrival is None else arrival

    def _first_arrival_fit(self, end: float) -> float | None:
        """The first arrival before `end` whose gang the GPUs idle at that moment can place."""
        for spec in self._pending:
            if spec.arrival_s >= end:
                return None
            held: dict[str, int] = {}
            for d in self._running:
                if d.finish_s > spec.arrival_s:
                    for name, gpus in self._where.get(d.job_id, ()):
                        held[name] = held.get(name, 0) + gpus
            if NodeBook(self.nodes, held).can_take(spec.gang_size, self._allowed.get(spec.job_id),
                                                   spec.node_count):
                return spec.arrival_s
        return None

    def _first_fill(self, end: float) -> float | None:
        """The first moment before `end` a dispatched job finishes while another job waits."""
        waiting = len(self._running) < len(self._active)
        for d in sorted(self._running, key=lambda d: d.finish_s):
            if d.finish_s >= end:
                return None
            if not d.run.completes:
                continue              # runs until the round's end: no GPUs freed
            if waiting or (self._pending and self._pending[0].arrival_s <= d.finish_s):
                return d.finish_s
        return None

    def _cut_round(self, now: float) -> None:
        """fill_on_completion: account the round up to `now`; runs not over are cut there."""
        self._overhead_left = {}
        for d in self._running:
            job = self._active[d.job_id]
            end = min(d.finish_s, now)
            exec_s = max(0.0, end - self._round_start - d.overhead_s)
            done = (d.run if d.finish_s <= now
                    else d.run.within(exec_s + d.carry_s, job.spec.throughput))
            if end - self._round_start < d.overhead_s:
                self._overhead_left[d.job_id] = d.overhead_s - (end - self._round_start)
            self._keep_carry(d, exec_s, done)
            job.record_run(done, exec_s, end)
            self.gpu_seconds_used += exec_s * job.spec.gang_size
            if job.done:
                del self._active[d.job_id]
        self._close_round()

    def _complete_round(self) -> None:
        first_round = self._rounds_dispatched <= 1
        for d in self._running:
            job = self._active[d.job_id]
            exec_s = d.finish_s - self._round_start
            done = d.run
            restarted = not self._runs_on(d.job_id) and not first_round
            if restarted and exec_s > self.round_s - FULL_ROUND_SLACK_S and self.restart_overhead_s:
                lost = min(self.restart_overhead_s, exec_s)   # an overhead >= the round: no work
                done = _less(done, exec_s, lost, job.spec.throughput)
                exec_s -= lost
            self._keep_carry(d, exec_s, done)
            job.record_run(done, exec_s, d.finish_s)
            self.gpu_seconds_used += exec_s * job.spec.gang_size
            if job.done:
                del self._active[d.job_id]
        self._close_round()

    def _close_round(self) -> None:
        """After a round is accounted (cut or complete): its dispatched jobs are the previous
        round's, only their nodes are remembered, and nothing runs until the next dispatch."""
        self._previous = frozenset(d.job_id for d in self._running)
        self._where = {j: s for j, s in self._where.items() if j in self._previous}
        self._running = []

    def _view(self, job: SimJob) -> JobView:
        s = job.spec
        profile = (s.declared_profile() if self.declared_profile
                   else EpochProfile(s.batch_sizes, s.epoch_durations, job.exclusive_runtime_s))
        return JobView(
            job_id=s.job_id, gang_size=s.gang_size, arrival_s=s.arrival_s,
            num_epochs=s.num_epochs, epochs_done=job.epochs_done, batch_size=job.batch_size,
            iterations_per_s=job.throughput, remaining_iterations=float(job.remaining_iterations),
            iterations_per_epoch=job.iterations_per_epoch,
            observed_batch_sizes=job.observed_batch_sizes,
            profile_batch_sizes=profile.batch_sizes,
            profile_epoch_durations=profile.epoch_durations,
            exclusive_runtime_s=profile.exclusive_runtime_s, run_time_s=job.run_time_s,
            ran_last_round=s.job_id in self._previous, priority_weight=s.priority_weight)


def _less(run: Run, exec_s: float, lost_s: float, throughput: Mapping[int, float]) -> Run:
    """`run` (of `exec_s` seconds) less a restart's `lost_s`: one batch size's iterations cut
    in proportion (the reference's rule), a run across batch sizes its first `exec_s - lost_s`
    seconds of work."""
    if len(run.segments) == 1:
        (bs, n), = run.segments
        kept = int(n * (exec_s - lost_s) / exec_s)
        return Run(((bs, kept),), kept / throughput[bs], run.completes and kept == n)
    return run.within(exec_s - lost_s, throughput)

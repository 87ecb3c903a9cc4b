"""Turn a round's plan into Slurm actions: a pure diff of the plan against what Slurm reports.

Why pure: the daemon recomputes the diff from Slurm's own state every round, so a call that
failed last round is simply diffed again (no retry bookkeeping), and the exact argv lists can be
tested without a cluster and printed by `--dry-run`.

Rules (Slurm 22.05.8, see /work/shared/slurm/NOTES.md section 3):
- Only jobs tagged `shock:managed` (by job_submit.lua) are ever named in a command, and never a
  finished one: unmanaged jobs belong to Slurm alone.
- Stop = `scancel --signal=USR1 --batch` (the batch shell forwards it to the trainer so it can
  checkpoint), then after the grace period `scontrol requeuehold` (back to PENDING, held, restart
  count + 1; SIGTERM then SIGKILL after KillWait).
- A managed job that was released but has not started (pending, priority > 0) and is no longer in
  the plan is put back on hold (`scontrol hold`), or Slurm would start it outside the plan.
- Start = optional `scontrol update JobId=X [Gres=gpu:K] [StartTime=now]` per job, then ONE
  `scontrol release` with every job id. A held job cannot be started with `Priority=`.
  `StartTime=now` clears the ~2-minute BeginTime wait that every requeue adds (`release` alone
  does not), so it is sent when the job was requeued (restart_count > 0) or waits on BeginTime.
- Gres is always written `Gres=gpu:K`: `TresPerNode=gres/gpu:K` is accepted and silently ignored.
- Pinning: a job the plan places on nodes is released with `ReqNodeList=<its nodes>` in its
  update (`pins`), so Slurm starts it there on the scheduling pass the release triggers (0.2 s
  measured) instead of wherever it likes, or nowhere (Reason=Resources) while the plan's node
  is free. Verified on 22.05.8 for a held pending job: `scontrol update JobId=X
  ReqNodeList=gpu03` (one node), `ReqNodeList=gpu02,gpu04` for a `-N2` gang, and for a
  `--gpus=16` job Slurm raises the node count to the two listed nodes (8 GPUs each); the list
  survives a requeuehold and is replaced by the next update; `ReqNodeList=` clears it. The
  field and its text are the same in 22.05's man page and the current one on slurm.schedmd.com
  (25.x): "ReqNodeList=<nodes> Set the job's list of required node". A job is pinned only when the placement's shape is the job's
  own (as many nodes as it asks; any for a `--gpus` job): a `-N2 --gres=gpu:4` job placed on one
  node of 8 is released unpinned. A released job that still waits is re-pinned when the plan
  places it elsewhere.
- Moves: a running job the plan places elsewhere (`moved`) is stopped like any other and
  started again, pinned, in the same round (`StartTime=now` clears its requeue's BeginTime).
- Jobs to start whose planned nodes lack the GPUs left by the jobs that keep running (churn
  bounds, failed signals) are not started this round (`fit_on_nodes`).

Churn bounds (`ChurnLimits`, `keep_reasons`, `bound_plan`): a running job the plan would stop is
kept running instead when
- its current run is younger than `min_run_seconds` (now - Slurm's start_time, so a restarted
  daemon knows it). Default 1.5 rounds: a job started in round k is not stopped in round k+1
  (it ran less than a round) and may be from round k+2 on (it ran about 2 rounds minus the
  start-up slack of the round, which must stay under half a round);
- it was preempted `max_preemptions_per_day` times (default 24) in the last 24 h: the
  daemon's successful `requeuehold` intents in the store (every incarnation), else its memory,
  counted at most Slurm's restart_count (every requeue raises it);
- it is expected to finish within `finish_window_seconds` (default half a round; its remaining
  exclusive run time from its reports or declared spec): a stop would free its GPUs barely
  sooner, cost it a restart, and race its own end;
- its checkpoints keep failing (the job is then *flagged*: logged once, a `flagged` job event,
  and never stopped by the daemon again; it runs to its end). A job that sends training
  reports is flagged when its last `max_stops_without_checkpoint` (default 3) stop cycles
  brought no successful checkpoint report (cycle i is the run that ended with preemption i;
  it succeeded when an ok=true checkpoint was reported after preemption i-1), or when its
  latest that many checkpoint reports all say ok=false. Jobs that send no reports are never
  flagged (the daemon cannot tell).
Keeping a job running leaves fewer GPUs for the plan's starts: `bound_plan` removes planned
pending jobs, lowest priority first (latest submitted, then highest id), until what runs fits
the cluster's capacity; the diff of the bounded plan holds released ones and does not start
held ones. Never more GPUs than the cluster has.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any, Collection, Iterable, Mapping, Sequence

from ..errors import InputError
from ..model import NodeShares, RoundPlan
from ..slurm.parse import expand_hostlist
from ..slurm.types import JobState, SlurmJob

BEGIN_TIME_REASON = "BeginTime"
# scancel (22.05) names each job it could not signal on stderr, one line each:
#   "scancel: error: Kill job error on job id 2131: Invalid job id specified"
SCANCEL_FAILED_RE = re.compile(r"error on job id (\d+)")


@dataclass(frozen=True)
class JobUpdate:
    """A `scontrol update` to send before releasing a job."""

    job_id: int
    gpus_per_node: int | None   # new Gres=gpu:K, or None to keep the request
    start_now: bool             # StartTime=now (clears the post-requeue BeginTime wait)
    nodes: tuple[str, ...] = ()  # ReqNodeList=a,b: the plan's nodes (pin), () to keep

    def argv(self) -> list[str]:
        argv = ["scontrol", "update", f"JobId={self.job_id}"]
        if self.gpus_per_node is not None:
            argv.append(f"Gres=gpu:{self.gpus_per_node}")
        if self.nodes:
            argv.append(f"ReqNodeList={','.join(self.nodes)}")
        if self.start_now:
            argv.append("StartTime=now")
        return argv


@dataclass(frozen=True)
class Enactment:
    """What must change in Slurm for the plan to hold (job ids sorted, for stable argv)."""

    stop: tuple[int, ...]          # running/suspended managed jobs not in the plan
    signal: tuple[int, ...]        # the subset of `stop` that is RUNNING (gets USR1 first)
    hold: tuple[int, ...]          # released-but-pending managed jobs not in the plan
    start: tuple[int, ...]         # held pending managed jobs in the plan (released)
    updates: tuple[JobUpdate, ...]  # planned pending jobs that need an update first
    keep: tuple[int, ...]          # planned jobs already running or about to start
    missing: tuple[int, ...]       # planned ids Slurm does not show as active managed jobs
    moved: tuple[int, ...] = ()    # running planned jobs stopped, then started on new nodes

    def without_starts(self, job_ids: Collection[int]) -> "Enactment":
        """The same enactment that does not start (nor update) `job_ids`."""
        drop = set(job_ids)
        return replace(self, start=tuple(j for j in self.start if j not in drop),
                       updates=tuple(u for u in self.updates if u.job_id not in drop),
                       moved=tuple(j for j in self.moved if j not in drop))

    @property
    def empty(self) -> bool:
        return not (self.stop or self.hold or self.start or self.updates)


@dataclass(frozen=True)
class Step:
    """One Slurm command and the jobs it acts on; `phase` is "stop" or "start"."""

    phase: str
    action: str                    # signal | requeuehold | hold | update | release
    argv: tuple[str, ...]
    job_ids: tuple[int, ...]


def _active_managed(jobs: Iterable[SlurmJob]) -> dict[int, SlurmJob]:
    return {j.job_id: j for j in jobs if j.managed and not j.state.finished}


def diff(plan: RoundPlan, jobs: Sequence[SlurmJob],
         gpus_per_node: Mapping[int, int] | None = None,
         pins: Mapping[int, tuple[str, ...]] | None = None,
         moved: Collection[int] = ()) -> Enactment:
    """Compare the plan with Slurm's jobs.

    `gpus_per_node` optionally gives a new per-node GPU count for planned jobs (resizing); a
    pending job whose request differs gets `Gres=gpu:K`. `pins` gives the nodes a planned job
    is to start on (`ReqNodeList=`, see `pin_nodes`); `moved` the running planned jobs to stop and
    start again there. Jobs that are neither managed nor active are ignored whatever the plan
    says.
    """
    managed = _active_managed(jobs)
    want = set(plan.run)
    pins = pins or {}
    stop, signal, hold, start, updates, keep, restart = [], [], [], [], [], [], []
    for job_id in sorted(managed):
        job = managed[job_id]
        planned = job_id in want
        if job.state in (JobState.RUNNING, JobState.SUSPENDED):
            if planned and not (job_id in moved and job_id in pins):
                keep.append(job_id)
                continue
            stop.append(job_id)
            if job.state is JobState.RUNNING:
                signal.append(job_id)
            if planned:      # moved: back to held pending with a BeginTime after its requeue
                restart.append(job_id)
                start.append(job_id)
                updates.append(JobUpdate(job_id, None, True, pins[job_id]))
        elif job.state is JobState.PENDING:
            if not planned:
                if not job.held:
                    hold.append(job_id)
                continue
            new_gres = None
            if gpus_per_node and job_id in gpus_per_node and \
                    gpus_per_node[job_id] != job.gpus_per_node:
                new_gres = int(gpus_per_node[job_id])
            start_now = job.restart_count > 0 or job.reason == BEGIN_TIME_REASON
            nodes = pins.get(job_id, ())
            if job.held:
                start.append(job_id)
            else:
                keep.append(job_id)
                # Released earlier but still waiting: only BeginTime, a resize or a new node
                # needs help.
                start_now = job.reason == BEGIN_TIME_REASON
                if nodes and _pinned_to(job) == nodes:
                    nodes = ()
            if new_gres is not None or start_now or nodes:
                updates.append(JobUpdate(job_id, new_gres, start_now, nodes))
        else:  # COMPLETING and other transient states: leave them to Slurm
            if planned:
                keep.append(job_id)
    missing = sorted(want - set(managed))
    return Enactment(stop=tuple(stop), signal=tuple(signal), hold=tuple(hold),
                     start=tuple(sorted(start)), updates=tuple(updates), keep=tuple(keep),
                     missing=tuple(missing), moved=tuple(restart))


def _pinned_to(job: SlurmJob) -> tuple[str, ...]:
    try:
        return expand_hostlist(job.required_nodes)
    except InputError:
        return ()


def pin_nodes(placement: Mapping[int, NodeShares], jobs: Sequence[SlurmJob]) -> dict[int, tuple[str, ...]]:
    """The nodes each placed managed job is to be pinned to (`ReqNodeList=`): only where the
    placement's shape is the job's own, i.e. as many nodes as the job asks (`nodes`), or at
    least as many for a `--gpus` job (Slurm raises its node count to the list, verified on
    22.05); any other job is released unpinned, as before placement."""
    managed = _active_managed(jobs)
    out: dict[int, tuple[str, ...]] = {}
    for job_id, shares in placement.items():
        job = managed.get(job_id)
        if job is None or not shares:
            continue
        names = tuple(n for n, _ in shares)
        asked = max(1, job.nodes)
        if len(names) == asked or (job.gpus_per_job > 0 and len(names) > asked):
            out[job_id] = names
    return out


def fit_on_nodes(starts: Sequence[int], placement: Mapping[int, NodeShares],
                 free: Mapping[str, int]) -> tuple[int, ...]:
    """The jobs of `starts` (in that order) whose planned nodes no longer have their GPUs,
    given `free` GPUs per node once the jobs that keep running are counted; a job that fits
    takes its GPUs before the next is tried. Jobs without a placement are not judged."""
    left = dict(free)
    dropped = []
    for job_id in starts:
        shares = placement.get(job_id)
        if not shares:
            continue
        if all(left.get(n, 0) >= g for n, g in shares):
            for n, g in shares:
                left[n] -= g
        else:
            dropped.append(job_id)
    return tuple(dropped)


def stop_steps(e: Enactment) -> list[Step]:
    """Hold released-but-waiting jobs (one call), signal running ones (one call per job: a
    failed scancel names no job reliably, e.g. rc 229 with nothing on stderr, and a job whose
    signal failed must not be requeued without its checkpoint). The requeuehold comes after the
    grace period (see `requeue_step`)."""
    steps = []
    if e.hold:
        steps.append(Step("stop", "hold", ("scontrol", "hold", _ids(e.hold)), e.hold))
    for job_id in e.signal:
        steps.append(Step("stop", "signal", ("scancel", "--signal=USR1", "--batch",
                                             str(job_id)), (job_id,)))
    return steps


def requeue_step(job_ids: Sequence[int]) -> Step | None:
    ids = tuple(sorted(set(job_ids)))
    if not ids:
        return None
    return Step("stop", "requeuehold", ("scontrol", "requeuehold", _ids(ids)), ids)


def start_steps(e: Enactment) -> list[Step]:
    steps = [Step("start", "update", tuple(u.argv()), (u.job_id,)) for u in e.updates]
    if e.start:
        steps.append(Step("start", "release", ("scontrol", "release", _ids(e.start)), e.start))
    return steps


def commands(e: Enactment) -> list[Step]:
    """Every step in order: hold, signal, requeuehold, updates, one release."""
    steps = stop_steps(e)
    requeue = requeue_step(e.stop)
    if requeue is not None:
        steps.append(requeue)
    return steps + start_steps(e)


def unsignalled(stderr: str) -> set[int]:
    """Jobs a `scancel --signal` could not reach (e.g. they finished on their own meanwhile).

    They must not be requeued: `requeuehold` also requeues a COMPLETED job, which would rerun a
    job that had just finished its training.
    """
    return {int(m) for m in SCANCEL_FAILED_RE.findall(stderr)}


def _ids(job_ids: Sequence[int]) -> str:
    """scontrol takes a comma-separated job list in one argument."""
    return ",".join(str(j) for j in job_ids)


# --------------------------------------------------------------------------- churn bounds
DAY_S = 86_400.0
MIN_RUN_ROUNDS = 1.5
FINISH_WINDOW_ROUNDS = 0.5


@dataclass(frozen=True)
class ChurnLimits:
    """How often the daemon may stop one job (0 disables a bound).

    `finish_window_seconds`: a running job expected to finish within this many seconds (its
    remaining exclusive run time, from its reports or its declared spec) is not stopped: the
    stop would free its GPUs barely sooner, cost it a restart, and race its own end (a job that
    ends in the same second as its USR1 cannot be told apart from one that checkpointed and
    exited on it, so it would be requeued and run again)."""

    min_run_seconds: float = MIN_RUN_ROUNDS * 120.0
    max_preemptions_per_day: int = 24
    max_stops_without_checkpoint: int = 3
    finish_window_seconds: float = FINISH_WINDOW_ROUNDS * 120.0

    @classmethod
    def for_round(cls, round_s: float, **overrides: float | None) -> "ChurnLimits":
        """The defaults for rounds of `round_s` (min run 1.5 rounds, finish window half a
        round), with overrides (None: the default)."""
        values: dict[str, Any] = {"min_run_seconds": MIN_RUN_ROUNDS * round_s,
                        "finish_window_seconds": FINISH_WINDOW_ROUNDS * round_s}
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)


@dataclass(frozen=True)
class StopHistory:
    """What is known of a job's past stops and checkpoints (store, else memory)."""

    preemptions: tuple[float, ...] = ()     # Unix times the daemon requeued it, oldest first
    reports: bool = False                   # it sends training reports (runs the helper)
    last_ok_checkpoint: float | None = None  # time of its latest ok=true checkpoint report
    failed_checkpoints: int = 0             # ok=false checkpoint reports after that one


def stops_without_checkpoint(h: StopHistory) -> int:
    """Consecutive latest stop cycles with no successful checkpoint report (see the module)."""
    if h.last_ok_checkpoint is None:
        return len(h.preemptions)
    after = sum(1 for t in h.preemptions if t > h.last_ok_checkpoint)
    return max(0, after - 1)


def preemptions_today(job: SlurmJob, h: StopHistory, now: float) -> int:
    recent = sum(1 for t in h.preemptions if t >= now - DAY_S)
    return min(recent, max(0, job.restart_count))


def checkpoint_failing(h: StopHistory, limits: ChurnLimits) -> str | None:
    """Why the job's checkpoints are failing (it is to be flagged), or None."""
    n = limits.max_stops_without_checkpoint
    if n <= 0 or not h.reports:
        return None
    if h.failed_checkpoints >= n:
        return f"its last {h.failed_checkpoints} checkpoint reports say ok=false"
    cycles = stops_without_checkpoint(h)
    if cycles >= n:
        return f"its last {cycles} stops brought no successful checkpoint"
    return None


def keep_reason(job: SlurmJob, h: StopHistory, limits: ChurnLimits, now: float,
                remaining_s: float | None = None) -> tuple[str, str] | None:
    """(rule, explanation) when a running job must not be stopped now, else None. Rules:
    "flagged" (checkpoints failing), "nearly_done" (expected to finish within the finish
    window: `remaining_s`), "min_run", "max_per_day"."""
    why = checkpoint_failing(h, limits)
    if why is not None:
        return "flagged", why
    if limits.finish_window_seconds > 0 and remaining_s is not None \
            and remaining_s < limits.finish_window_seconds:
        return "nearly_done", (f"expected to finish in {remaining_s:.0f} s < finish window "
                               f"{limits.finish_window_seconds:g} s")
    if limits.min_run_seconds > 0 and job.start_time is not None:
        ran = now - job.start_time
        if ran < limits.min_run_seconds:
            return "min_run", f"running {ran:.0f} s < min_run_seconds {limits.min_run_seconds:g}"
    if limits.max_preemptions_per_day > 0:
        n = preemptions_today(job, h, now)
        if n >= limits.max_preemptions_per_day:
            return "max_per_day", (f"preempted {n} times in 24 h (max_preemptions_per_day "
                                   f"{limits.max_preemptions_per_day})")
    return None


def bound_plan(run: Collection[int], jobs: Sequence[SlurmJob], keep: Collection[int],
               capacity: int) -> tuple[frozenset[int], tuple[int, ...]]:
    """The plan's run set with the running jobs `keep` added and, if they no longer fit in
    `capacity` GPUs, planned pending jobs dropped (lowest priority first: latest submitted,
    then highest id). Returns (run set, dropped ids). Running planned jobs are never dropped."""
    managed = _active_managed(jobs)
    keep = {j for j in keep if j in managed}
    out = set(run) | keep
    if not keep:
        return frozenset(out), ()
    running = {j for j in out if j in managed
               and managed[j].state in (JobState.RUNNING, JobState.SUSPENDED)}
    used = sum(managed[j].gpus for j in running)
    pending = sorted((j for j in out if j in managed and managed[j].state is JobState.PENDING),
                     key=lambda j: (managed[j].submit_time, j))
    dropped = []
    for j in pending:
        if used + managed[j].gpus <= capacity:
            used += managed[j].gpus
        else:
            dropped.append(j)
    return frozenset(out - set(dropped)), tuple(sorted(dropped))

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
  the plan is put back on hold, or Slurm would start it outside the plan. The hold is a user
  hold (`scontrol uhold`: JobHeldUser, like the plugin's submit hold and `requeuehold`), so an
  administrator's `scontrol hold` (JobHeldAdmin) is never the daemon's: such a job, and the
  others the daemon leaves alone (`bounds.hands_off`: special-exit holds, SUSPENDED jobs, job
  arrays, heterogeneous jobs, unreadable GPU requests), are never named in a command.
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
  places it elsewhere, which placement does only when its nodes lack room in the plan
  (`Snapshot.pinned`): Slurm may be starting it as the round reads, and a re-pin then fails
  (22.05: "Invalid node name specified for job N").
- Moves: a running job the plan places elsewhere (`moved`) is stopped like any other and
  started again, pinned, in the same round (`StartTime=now` clears its requeue's BeginTime).
- Jobs to start whose planned nodes lack the GPUs left by the jobs that keep running (churn
  bounds, failed signals) are not started this round (`fit_on_nodes`).

Churn bounds (`ChurnLimits`, `keep_reason`, `bound_plan`) are in `bounds.py` (re-exported here).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Collection, Mapping, Sequence

from ..model import NodeShares, RoundPlan
from ..plan_on_nodes import fit_on_nodes  # noqa: F401 (re-exported)
from ..slurm.gres import required_node_names
from ..slurm.types import JobState, SlurmJob
from .bounds import (DAY_S, FINISH_WINDOW_ROUNDS, MIN_RUN_ROUNDS, ChurnLimits,  # noqa: F401
                     StopHistory, active_managed, bound_plan, checkpoint_failing, hands_off,
                     keep_reason, preemptions_today, stops_without_checkpoint)
from .job_nodes import pins_allowed

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
    node_count: int | None = None  # NumNodes=N-N: a node range fixed at its minimum

    def argv(self) -> list[str]:
        argv = ["scontrol", "update", f"JobId={self.job_id}"]
        if self.gpus_per_node is not None:
            argv.append(f"Gres=gpu:{self.gpus_per_node}")
        if self.node_count is not None:
            argv.append(f"NumNodes={self.node_count}-{self.node_count}")
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
    managed = active_managed(jobs)
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
            if job.held:
                start.append(job_id)
            else:
                keep.append(job_id)
            update = _pending_update(job, gpus_per_node, pins.get(job_id, ()))
            if update is not None:
                updates.append(update)
        else:  # COMPLETING and other transient states: leave them to Slurm
            if planned:
                keep.append(job_id)
    missing = sorted(want - set(managed))
    return Enactment(stop=tuple(stop), signal=tuple(signal), hold=tuple(hold),
                     start=tuple(sorted(start)), updates=tuple(updates), keep=tuple(keep),
                     missing=tuple(missing), moved=tuple(restart))


def _pending_update(job: SlurmJob, gpus_per_node: Mapping[int, int] | None,
                    nodes: tuple[str, ...]) -> JobUpdate | None:
    """The update a planned pending job needs before it can start, or None: a resize, a pin,
    a node range of a job asking GPUs per node fixed at its minimum (the plan counted that many
    nodes' GPUs; left a range, Slurm would take more), and `StartTime=now` after a requeue or
    while it waits on BeginTime."""
    new_gres = None
    if gpus_per_node and job.job_id in gpus_per_node and \
            gpus_per_node[job.job_id] != job.gpus_per_node:
        new_gres = int(gpus_per_node[job.job_id])
    start_now = job.restart_count > 0 or job.reason == BEGIN_TIME_REASON
    if not job.held:
        # Released earlier but still waiting: only BeginTime, a resize or a new node needs help.
        start_now = job.reason == BEGIN_TIME_REASON
        if nodes and required_node_names(job) == nodes:
            nodes = ()
    # (a `--gpus` job's GPUs do not grow with its nodes: its range is left to Slurm and its pin)
    fixed = max(1, job.nodes) if job.node_range and not job.gpus_per_job else None
    if new_gres is not None or start_now or nodes or fixed is not None:
        return JobUpdate(job.job_id, new_gres, start_now, nodes, fixed)
    return None


def pin_nodes(placement: Mapping[int, NodeShares], jobs: Sequence[SlurmJob]) -> dict[int, tuple[str, ...]]:
    """The nodes each placed managed job is to be pinned to (`ReqNodeList=`): only where the
    placement's shape is the job's own, i.e. as many nodes as the job asks (`nodes`), or at
    least as many for a `--gpus` job (Slurm raises its node count to the list, verified on
    22.05); any other job is released unpinned, as before placement, and so is a job whose
    user's own limits a pin would replace or might contradict (`job_nodes.pins_allowed`: `-w`,
    an `--exclude` or `--constraint` the daemon cannot read). Placement put every job on nodes
    it may run on (`Snapshot.allowed_nodes`), so a pin keeps the limits it can read."""
    managed = active_managed(jobs)
    out: dict[int, tuple[str, ...]] = {}
    for job_id, shares in placement.items():
        job = managed.get(job_id)
        if job is None or not shares or not pins_allowed(job):
            continue
        names = tuple(n for n, _ in shares)
        asked = max(1, job.nodes)
        if len(names) == asked or (job.gpus_per_job > 0 and len(names) > asked):
            out[job_id] = names
    return out


def stop_steps(e: Enactment) -> list[Step]:
    """Hold released-but-waiting jobs (one call), signal running ones (one call per job: a
    failed scancel names no job reliably, e.g. rc 229 with nothing on stderr, and a job whose
    signal failed must not be requeued without its checkpoint). The requeuehold comes after the
    grace period (see `requeue_step`)."""
    steps = []
    if e.hold:
        steps.append(hold_step(e.hold))
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


def hold_step(job_ids: Sequence[int]) -> Step:
    """The daemon's hold: a user hold (`scontrol uhold`, JobHeldUser), never an administrator's
    (`scontrol hold`, JobHeldAdmin, which the daemon leaves alone: `bounds.hands_off`)."""
    return Step("stop", "hold", ("scontrol", "uhold", _ids(job_ids)), tuple(job_ids))


def _ids(job_ids: Sequence[int]) -> str:
    """scontrol takes a comma-separated job list in one argument."""
    return ",".join(str(j) for j in job_ids)

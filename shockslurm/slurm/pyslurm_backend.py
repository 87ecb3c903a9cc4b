"""Optional backend over pyslurm (only when pyslurm matches the running Slurm's major.minor).

pyslurm builds against exactly one Slurm major.minor (25.11.x needs Slurm 25.11; there is no
22.05 build and Debian ships no 25.11), so this class cannot be exercised on the 22.05 test
cluster. It is written against pyslurm 25.11's documented API (`Jobs.load`, `Nodes.load`,
`Job.hold/release/requeue/modify/send_signal`, `JobSubmitDescription`) and kept minimal:
reads, and `run` mapping the scontrol/scancel argv the daemon uses onto pyslurm calls. Only
its enabling logic (`backend.make_backend`) is tested here.
"""

from __future__ import annotations

import time
from collections import Counter
from types import ModuleType
from typing import Any, Iterable, Sequence

from .gres import gpu_count
from .states import parse_job_state
from .types import CommandResult, JobState, SlurmJob, SlurmNode, SlurmVersion


def _attr(obj: Any, *names: str, default: Any = None) -> Any:
    for n in names:
        v = getattr(obj, n, None)
        if v is not None:
            return v
    return default


def _gres_dict_gpus(value: Any) -> int:
    """pyslurm reports gres as a dict such as {"gpu": 2} or {"gpu:a100": 2}; or a string."""
    if isinstance(value, dict):
        return sum(int(v) for k, v in value.items() if str(k).split(":")[0] == "gpu")
    if isinstance(value, str):
        return gpu_count(value)
    return 0


def _ts(value: Any) -> float | None:
    if value in (None, 0):
        return None
    if hasattr(value, "timestamp"):
        return float(value.timestamp())
    return float(value)


class PyslurmBackend:
    name = "pyslurm"

    def __init__(self, module: ModuleType, version: SlurmVersion) -> None:
        self.pyslurm = module
        self._version = version
        self.calls: Counter[str] = Counter()

    def version(self) -> SlurmVersion:
        return self._version

    def jobs(self) -> list[SlurmJob]:
        self.calls["Jobs.load"] += 1
        out = []
        for job in self.pyslurm.Jobs.load().values():
            state, flags = parse_job_state(str(_attr(job, "state", default="UNKNOWN")),
                                           job_id=job.id)
            out.append(SlurmJob(
                job_id=int(job.id), name=_attr(job, "name", default=""),
                user=_attr(job, "user_name", default=""),
                partition=_attr(job, "partition", default=""), state=state, state_flags=flags,
                reason=_attr(job, "state_reason", default="None"),
                priority=int(_attr(job, "priority", default=0)),
                gpus_per_node=_gres_dict_gpus(_attr(job, "gres_per_node", default={})),
                gpus_per_job=int(_attr(job, "gpus", "gpus_per_job", default=0) or 0),
                nodes=int(_attr(job, "num_nodes", default=0) or 0),
                max_nodes=int(_attr(job, "max_nodes", default=0) or 0),
                node_list=_attr(job, "nodes", "allocated_nodes", default="") or "",
                submit_time=_ts(_attr(job, "submit_time")) or 0.0,
                start_time=None if state is JobState.PENDING else _ts(_attr(job, "start_time")),
                restart_count=int(_attr(job, "restart_cnt", "requeue_count", default=0) or 0),
                comment=_attr(job, "comment", default="") or "",
                admin_comment=_attr(job, "admin_comment", default="") or "",
                array_job_id=int(_attr(job, "array_id", "array_job_id", default=0) or 0),
                het_job_id=int(_attr(job, "het_job_id", default=0) or 0),
            ))
        return out

    def nodes(self) -> list[SlurmNode]:
        self.calls["Nodes.load"] += 1
        out = []
        for node in self.pyslurm.Nodes.load().values():
            out.append(SlurmNode(
                name=node.name, state=str(_attr(node, "state", default="unknown")).lower(),
                gpus=_gres_dict_gpus(_attr(node, "configured_gres", default={})),
                gpus_used=_gres_dict_gpus(_attr(node, "allocated_gres", default={})),
                partitions=tuple(_attr(node, "partitions", default=()) or ())))
        return out

    # --- actions: the daemon's scontrol/scancel argv mapped onto pyslurm calls ---------------
    def run(self, argv: Sequence[str]) -> CommandResult:
        argv = tuple(argv)
        start = time.monotonic()
        self.calls[argv[0] if argv else ""] += 1
        try:
            self._dispatch(argv)
        except NotImplementedError as exc:
            return CommandResult(argv, 2, "", f"pyslurm backend: {exc}",
                                 time.monotonic() - start)
        except Exception as exc:  # pyslurm.RPCError and friends: report like a CLI failure
            return CommandResult(argv, 1, "", str(exc), time.monotonic() - start)
        return CommandResult(argv, 0, "", "", time.monotonic() - start)

    def _dispatch(self, argv: Sequence[str]) -> None:
        ps = self.pyslurm
        if len(argv) >= 3 and argv[0] == "scontrol":
            verb, rest = argv[1], argv[2:]
            if verb in ("hold", "uhold", "release", "requeue", "requeuehold"):
                for jid in _ids(rest):
                    job = ps.Job(jid)
                    if verb == "hold":
                        job.hold()
                    elif verb == "uhold":       # a user hold (JobHeldUser), as scontrol uhold
                        job.hold(mode="user")
                    elif verb == "release":
                        job.release()
                    else:
                        job.requeue(hold=(verb == "requeuehold"))
                return
            if verb == "update":
                kv = dict(a.split("=", 1) for a in rest if "=" in a)
                jid = int(kv.pop("JobId", kv.pop("jobid", "0")))
                desc: dict[str, Any] = {}
                for key, val in kv.items():
                    if key in ("Gres", "TresPerNode"):
                        desc["gres_per_node"] = val.replace("gres:", "")
                    elif key == "StartTime":
                        desc["begin_time"] = val
                    elif key == "Priority":
                        desc["priority"] = int(val)
                    elif key == "NumNodes":
                        desc["nodes"] = val
                    else:
                        raise NotImplementedError(f"scontrol update {key}= is not mapped")
                ps.Job(jid).modify(ps.JobSubmitDescription(**desc))
                return
        if argv and argv[0] == "scancel":
            sig = next((a.split("=", 1)[1] for a in argv if a.startswith("--signal=")), None)
            steps = "batch" if "--batch" in argv else "all" if "--full" in argv else "children"
            for jid in _ids(a for a in argv[1:] if not a.startswith("-")):
                job = ps.Job(jid)
                job.send_signal(sig, steps=steps) if sig else job.cancel()
            return
        raise NotImplementedError(f"{' '.join(argv)} is not mapped")


def _ids(args: Iterable[str]) -> list[int]:
    return [int(x) for a in args for x in str(a).split(",") if x]

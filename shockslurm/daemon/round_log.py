"""One log line per round (text, or JSON fields with `log_format = "json"`)."""

from __future__ import annotations

import logging
import time
from collections import deque
from typing import Callable

from ..live.cluster import SlurmCluster
from ..model import RoundPlan, Snapshot

round_log = logging.getLogger("shockslurm.daemon.round")

LINES_KEPT = 100      # the latest round lines kept in memory (the log has them all)


class RoundLogger:
    """One log line per round with the essentials; `fields` carries them structured (the JSON
    log format emits them as keys): round, active, running, started, stopped, held,
    failed_calls, gpus_used, gpus_total, solve_s, round_s, status, moved (running jobs restarted
    on other nodes), pinned (starts with ReqNodeList=), and the idle GPU-seconds since the last
    round by cause (`live.idle`): idle_switch_gpu_s (GPUs a round's stops freed, until their
    successors ran), idle_unplaceable_gpu_s (released jobs waited in Reason=Resources while GPUs
    were free), idle_waiting_gpu_s (held jobs could have used free GPUs)."""

    def __init__(self, cluster: SlurmCluster, emit: Callable[[str], None] | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.cluster = cluster
        self.emit = emit
        self.clock = clock
        # the latest lines only: a daemon runs for months, 720 rounds a day at 120 s
        self.lines: deque[str] = deque(maxlen=LINES_KEPT)

    def on_round(self, snapshot: Snapshot, plan: RoundPlan, solve_s: float) -> None:
        st = self.cluster.last_stats
        status = plan.info.get("status")
        fields = {"round": snapshot.round_index, "active": len(snapshot.jobs),
                  "running": len(plan.run), "started": st.started, "stopped": st.stopped,
                  "held": st.held, "failed_calls": st.failed_calls,
                  "gpus_used": plan.gpus_used(snapshot), "gpus_total": snapshot.gpus,
                  "solve_s": round(solve_s, 3),
                  "round_s": round(max(0.0, self.clock() - snapshot.now), 3),
                  "status": "ok" if status is None else str(status),
                  "kept": len(st.kept), "dropped": len(st.dropped),
                  "grace_wait_s": round(st.grace_wait_s, 3),
                  "stop_wait_s": round(st.stop_wait_s, 3),
                  "moved": st.moved, "pinned": st.pinned,
                  "idle_switch_gpu_s": round(st.idle_switch_gpu_s, 1),
                  "idle_unplaceable_gpu_s": round(st.idle_unplaceable_gpu_s, 1),
                  "idle_waiting_gpu_s": round(st.idle_waiting_gpu_s, 1)}
        line = (f"round {fields['round']}: active={fields['active']} "
                f"running={fields['running']} started={fields['started']} "
                f"stopped={fields['stopped']} held={fields['held']} "
                f"gpus={fields['gpus_used']}/{fields['gpus_total']} "
                f"failed_calls={fields['failed_calls']} kept={fields['kept']} "
                f"dropped={fields['dropped']} moved={st.moved} pinned={st.pinned} "
                f"idle_switch_gpu_s={st.idle_switch_gpu_s:.1f} "
                f"idle_unplaceable_gpu_s={st.idle_unplaceable_gpu_s:.1f} "
                f"idle_waiting_gpu_s={st.idle_waiting_gpu_s:.1f} "
                f"grace_wait_s={st.grace_wait_s:.1f} "
                f"stop_wait_s={st.stop_wait_s:.1f} solve_s={solve_s:.3f} "
                f"round_s={fields['round_s']:.3f} status={fields['status']}")
        self.lines.append(line)
        if self.emit is not None:
            self.emit(line)
        else:
            round_log.info(line, extra={"fields": {"event": "round", **fields}})

"""Version-aware, shape-tolerant parsing of `squeue --json` / `sinfo --json` into our records.

One small function per field (`fields.py`; GPUs and host lists in `gres.py`) understands every
shape the supported Slurm versions write:

| field          | 22.05 (openapi v0.0.38)  | 23.02 .. 25.11 (data_parser v0.0.39 .. v0.0.44)        |
|----------------|--------------------------|--------------------------------------------------------|
| job_state      | "RUNNING" (flag may      | ["RUNNING"], ["PENDING", "REQUEUED"]                   |
|                | replace base: "COMPLETING")                                                       |
| numbers        | plain int (or null)      | {"set": true, "infinite": false, "number": 5}          |
| times          | Unix int, 0 = unset      | {"set": .., "number": unix}                            |
| tres_per_node  | "gres:gpu:3"             | "gres:gpu:3" (23.02) / "gres/gpu:3" (23.11+)            |
| sinfo          | {"nodes": [...]}         | {"sinfo": [{"nodes": {"nodes": [..]}, "node":          |
|                |                          |   {"state": [..]}, "gres": {"total", "used"}, ..}]}     |

Filters are never trusted: 22.05's `squeue --json` ignores -j/-t/-u/-n and returns every job
slurmctld knows (finished ones too, until MinJobAge), so callers filter the records in Python.
Truly malformed input raises `InputError` naming the job id and the field.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import replace
from typing import Any, Mapping

from ..errors import InputError
from .fields import Ctx, number, strings, text, timestamp
from .gres import gpu_count, gpu_types
from .states import parse_job_state
from .types import JobState, SlurmJob, SlurmNode, SlurmVersion
from .version import version_from_meta

log = logging.getLogger(__name__)

SQUEUE = "squeue --json"
SINFO = "sinfo --json"
# 22.05 reports state_reason "JobHeldUser" for a requeuehold'ed job and puts this text in
# state_description (scontrol shows Reason=job_requeued_in_held_state); no REQUEUE_HOLD flag
# reaches the JSON. We derive the flag from the description so all versions agree.
REQUEUE_HOLD_DESC = "job requeued in held state"


# --- documents ------------------------------------------------------------------------------

def load_document(data: str | bytes | Mapping[str, Any], source: str) -> Mapping[str, Any]:
    """Decode JSON text (or pass a decoded mapping through), checking it is an object."""
    if isinstance(data, (str, bytes)):
        try:
            data = json.loads(data)
        except json.JSONDecodeError as exc:
            raise InputError(f"not JSON: {exc}", source=source) from exc
        except (ValueError, RecursionError) as exc:  # bad UTF-8/16 bytes, >4300 digits, deep nesting
            raise InputError(f"not JSON: {str(exc)[:200]}", source=source) from None
    if not isinstance(data, Mapping):
        raise InputError("top level is not a JSON object", source=source)
    errors = data.get("errors") or []
    if errors:
        log.warning("%s reported errors: %s", source, errors)
    return data


def document_version(doc: Mapping[str, Any]) -> SlurmVersion | None:
    meta = doc.get("meta")
    if isinstance(meta, Mapping):
        try:
            return version_from_meta(meta)
        except InputError:
            return None
    return None


# --- squeue ---------------------------------------------------------------------------------

def parse_job(rec: Mapping[str, Any], source: str = SQUEUE) -> SlurmJob:
    """One job record of any supported version."""
    if not isinstance(rec, Mapping):
        raise InputError(f"job record is not an object: {rec!r}", source=source, field="jobs")
    ctx = Ctx(source, rec.get("job_id", "?"))
    job_id = number(rec.get("job_id"), ctx, "job_id", default=None)
    if job_id is None or job_id <= 0:
        raise ctx.fail("job_id", f"missing or invalid job id {rec.get('job_id')!r}")
    ctx.ident = job_id
    raw_state = rec.get("job_state")
    if isinstance(raw_state, str) or (isinstance(raw_state, list)
                                      and all(isinstance(s, str) for s in raw_state)):
        state, flags = parse_job_state(raw_state, job_id=job_id)
    else:
        raise ctx.fail("job_state", f"expected a string or list of strings, got {raw_state!r}")
    description = text(rec.get("state_description"), ctx, "state_description")
    if description == REQUEUE_HOLD_DESC:
        flags = flags | {"REQUEUE_HOLD"}
    tres_node = text(rec.get("tres_per_node"), ctx, "tres_per_node")
    tres_job = text(rec.get("tres_per_job"), ctx, "tres_per_job")
    start = timestamp(rec.get("start_time"), ctx, "start_time")
    if state is JobState.PENDING:
        start = None                       # for pending jobs this is only the expected start
    end = timestamp(rec.get("end_time"), ctx, "end_time") if (
        state.finished or state is JobState.COMPLETING) else None
    return SlurmJob(
        job_id=job_id,
        name=text(rec.get("name"), ctx, "name"),
        user=text(rec.get("user_name"), ctx, "user_name"),
        partition=text(rec.get("partition"), ctx, "partition"),
        state=state,
        state_flags=flags,
        reason=text(rec.get("state_reason"), ctx, "state_reason") or "None",
        priority=number(rec.get("priority"), ctx, "priority") or 0,
        gpus_per_node=gpu_count(tres_node, ctx, "tres_per_node"),
        gpus_per_job=gpu_count(tres_job, ctx, "tres_per_job"),
        nodes=number(rec.get("node_count"), ctx, "node_count") or 0,
        max_nodes=number(rec.get("max_nodes"), ctx, "max_nodes") or 0,
        node_list=text(rec.get("nodes"), ctx, "nodes"),
        submit_time=timestamp(rec.get("submit_time"), ctx, "submit_time") or 0.0,
        start_time=start,
        restart_count=number(rec.get("restart_cnt"), ctx, "restart_cnt") or 0,
        comment=text(rec.get("comment"), ctx, "comment"),
        admin_comment=text(rec.get("admin_comment"), ctx, "admin_comment"),
        gres_detail=strings(rec.get("gres_detail"), ctx, "gres_detail"),
        end_time=end,
        required_nodes=text(rec.get("required_nodes"), ctx, "required_nodes"),
        array_job_id=number(rec.get("array_job_id"), ctx, "array_job_id") or 0,
        het_job_id=number(rec.get("het_job_id"), ctx, "het_job_id") or 0,
        excluded_nodes=text(rec.get("excluded_nodes"), ctx, "excluded_nodes"),
        features=text(rec.get("features"), ctx, "features"),
        gpu_types=(gpu_types(tres_node, ctx, "tres_per_node")
                   | gpu_types(tres_job, ctx, "tres_per_job")),
        raw=rec,
    )


def parse_squeue(data: str | bytes | Mapping[str, Any]) -> list[SlurmJob]:
    """Every job in one `squeue --json` document (any version). Callers filter in Python."""
    doc = load_document(data, SQUEUE)
    jobs = doc.get("jobs")
    if not isinstance(jobs, list):
        raise InputError("no 'jobs' list", source=SQUEUE, field="jobs")
    return [_job_or_unreadable_gpus(rec) for rec in jobs]


GPU_FIELDS = ("tres_per_node", "tres_per_job")


def _job_or_unreadable_gpus(rec: Any) -> SlurmJob:
    """`parse_job`, except that a GPU request in a form we cannot read (any user's job, in any
    partition, can carry one) does not fail the whole read: the job comes back with no GPUs and
    `unreadable` naming the field, so the daemon never schedules it and every other job goes on."""
    try:
        return parse_job(rec)
    except InputError as exc:
        if exc.field not in GPU_FIELDS or not isinstance(rec, Mapping):
            raise
        job = parse_job({**rec, **dict.fromkeys(GPU_FIELDS, "")})
        log.debug("job %s: unreadable GPU request (%s)", job.job_id, exc)
        return replace(job, unreadable=f"{exc.field}={str(rec.get(exc.field))[:80]!r}")


# --- sinfo ----------------------------------------------------------------------------------

def node_state(value: Any, flags: Any, ctx: Ctx) -> str:
    """Lower-case state joined with its flags: "mixed", "idle+drain"."""
    parts = list(strings(value, ctx, "state")) if not isinstance(value, str) else [value]
    parts += [f for f in strings(flags, ctx, "state_flags") if f not in parts]
    return "+".join(p.lower() for p in parts if p) or "unknown"


def _node_from_record(rec: Mapping[str, Any]) -> SlurmNode:
    """22.05 `nodes` entry (also the 23.02+ `scontrol show nodes --json` entry)."""
    ctx = Ctx(SINFO, rec.get("name", "?"))
    name = text(rec.get("name"), ctx, "name")
    if not name:
        raise ctx.fail("name", "node without a name")
    return SlurmNode(
        name=name,
        state=node_state(rec.get("state"), rec.get("state_flags"), ctx),
        gpus=gpu_count(text(rec.get("gres"), ctx, "gres"), ctx, "gres"),
        gpu_types=gpu_types(text(rec.get("gres"), ctx, "gres"), ctx, "gres"),
        gpus_used=gpu_count(text(rec.get("gres_used"), ctx, "gres_used"), ctx, "gres_used"),
        partitions=strings(rec.get("partitions"), ctx, "partitions"),
        features=_features(rec.get("active_features")) | _features(rec.get("features")),
    )


def _nodes_from_sinfo_record(rec: Mapping[str, Any]) -> list[SlurmNode]:
    """23.02+ `sinfo` entry: a group of nodes sharing one partition, state and gres."""
    ctx = Ctx(SINFO, "?")
    names_block = rec.get("nodes")
    if not isinstance(names_block, Mapping):
        raise ctx.fail("nodes", f"expected an object with 'nodes', got {names_block!r}")
    names = strings(names_block.get("nodes"), ctx, "nodes.nodes")
    node_block = rec.get("node") or {}
    if not isinstance(node_block, Mapping):
        raise ctx.fail("node", f"expected an object, got {node_block!r}")
    gres = rec.get("gres") or {}
    if not isinstance(gres, Mapping):
        raise ctx.fail("gres", f"expected an object, got {gres!r}")
    part = rec.get("partition") or {}
    part_name = text(part.get("name"), ctx, "partition.name") if isinstance(part, Mapping) else ""
    feats = rec.get("features")
    features = (_features(feats.get("active")) | _features(feats.get("total"))
                if isinstance(feats, Mapping) else _features(feats))
    state = node_state(node_block.get("state"), None, ctx)
    total = gpu_count(text(gres.get("total"), ctx, "gres.total"), ctx, "gres.total")
    types = gpu_types(text(gres.get("total"), ctx, "gres.total"), ctx, "gres.total")
    used = gpu_count(text(gres.get("used"), ctx, "gres.used"), ctx, "gres.used")
    return [SlurmNode(name=n, state=state, gpus=total, gpus_used=used,
                      partitions=(part_name,) if part_name else (), features=features,
                      gpu_types=types)
            for n in names]


def _features(listed: Any) -> frozenset[str]:
    """A node's features from Slurm's comma-separated list ("a100,ib" -> {"a100", "ib"}; 22.05
    `sinfo`) or a list of them (23.02+ `scontrol show nodes`); none from anything else (a node
    whose features cannot be read takes no job that asks for one). A node's features for the
    node rules are its available and active ones together: with changeable features (a
    node_features plugin) Slurm reboots a node into an available one a job asks for."""
    if isinstance(listed, str):
        listed = listed.split(",")
    if not isinstance(listed, (list, tuple)):
        return frozenset()
    return frozenset(f.strip() for f in listed if isinstance(f, str) and f.strip())


def parse_sinfo(data: str | bytes | Mapping[str, Any]) -> list[SlurmNode]:
    """Every node in one `sinfo --json` document, one record per node (partitions merged)."""
    doc = load_document(data, SINFO)
    if isinstance(doc.get("nodes"), list):                 # 22.05 (and scontrol show nodes)
        found = [_node_from_record(r) if isinstance(r, Mapping) else
                 _bad(r) for r in doc["nodes"]]
    elif isinstance(doc.get("sinfo"), list):               # 23.02+
        found = []
        for r in doc["sinfo"]:
            found.extend(_nodes_from_sinfo_record(r) if isinstance(r, Mapping) else [_bad(r)])
    else:
        raise InputError("neither a 'nodes' nor a 'sinfo' list", source=SINFO, field="nodes")
    merged: dict[str, SlurmNode] = {}
    for node in found:
        prev = merged.get(node.name)
        if prev is None:
            merged[node.name] = node
        else:                                              # same node listed per partition
            parts = prev.partitions + tuple(p for p in node.partitions
                                            if p not in prev.partitions)
            merged[node.name] = SlurmNode(prev.name, prev.state, prev.gpus,
                                          max(prev.gpus_used, node.gpus_used), parts,
                                          prev.features | node.features,
                                          prev.gpu_types | node.gpu_types)
    return list(merged.values())


def _bad(rec: Any) -> SlurmNode:
    raise InputError(f"node record is not an object: {rec!r}", source=SINFO, field="nodes")


# --- scontrol -o show job -------------------------------------------------------------------

_KEY_RE = re.compile(r"(?:^|\s)([A-Za-z][A-Za-z0-9_:/]*)=")


def parse_scontrol_line(line: str) -> dict[str, str]:
    """One `scontrol -o [-d] show job` line -> {key: value}.

    22.05 has no `scontrol --json`. Values may contain blanks (Comment, Command), so a value
    runs until the next ` Key=`. The first occurrence of a repeated key wins, except that the
    per-node detail keys of `-d` (`Nodes=… GRES=gpu:2(IDX:0-1)`) are kept under their own
    names (GRES, JOB_GRES, CPU_IDs, Mem).
    """
    out: dict[str, str] = {}
    matches = list(_KEY_RE.finditer(line))
    for i, m in enumerate(matches):
        end = matches[i + 1].start() if i + 1 < len(matches) else len(line)
        key, value = m.group(1), line[m.end():end].strip()
        out.setdefault(key, value)
    return out

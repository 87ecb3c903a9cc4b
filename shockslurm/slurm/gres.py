"""GPUs and nodes in Slurm's strings: gres and TRES specs (`gpu_count`), `gres_detail` GPU
indices, host lists (`expand_hostlist`), and where a job holds its GPUs
(`gpus_per_allocated_node`). Garbled or implausible input is an `InputError`, never a huge range
expanded in memory."""

from __future__ import annotations

import re
from typing import Iterable

from ..errors import InputError
from .fields import Ctx, whole
from .types import SlurmJob

MAX_GPU_INDEX = 4096               # more GPU indices than any node has: gres_detail is garbled


# --- gres -----------------------------------------------------------------------------------

def _split_outside(s: str, open_: str = "(", close: str = ")") -> list[str]:
    """`s` split on the commas outside `open_`...`close` (`gpu:2(IDX:0,2),shard:1` or
    `gpu[01,03],gpu05`), each part stripped, empty parts dropped."""
    out: list[str] = []
    cur: list[str] = []
    depth = 0
    for ch in s:
        if ch == open_:
            depth += 1
        elif ch == close:
            depth = max(0, depth - 1)
        if ch == "," and depth == 0:
            out.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    out.append("".join(cur))
    return [p.strip() for p in out if p.strip()]


def gpu_count(spec: str, ctx: Ctx | None = None, field: str = "gres") -> int:
    """GPUs in a gres/TRES string, summed over entries; other gres (shard, mps, tmpsize) skipped.

    Understands "gres:gpu:3", "gres:gpu:a100:2", "gres/gpu:2", "gres/gpu:a100:2",
    "gres/gpu=2" (TRES form), node gres "gpu:8", "gpu:h100:8(S:0-1)", used gres
    "gpu:2(IDX:0-1)", and "N/A" / "(null)" / "" (no GPUs).
    """
    return sum(count for _, count in _gpu_entries(spec, ctx, field))


def gpu_types(spec: str, ctx: Ctx | None = None, field: str = "gres") -> frozenset[str]:
    """The GPU types a gres/TRES string names ("gres:gpu:a100:2" -> {"a100"}; "gpu:8" and
    "gres/gpu=2" name none), read as `gpu_count` reads counts."""
    return frozenset(kind for kind, _ in _gpu_entries(spec, ctx, field) if kind)


def _gpu_entries(spec: str, ctx: Ctx | None, field: str) -> list[tuple[str, int]]:
    """(type or "", count) of each GPU entry of a gres/TRES string (see `gpu_count`)."""
    out: list[tuple[str, int]] = []
    for entry in _split_outside(spec or ""):
        if entry in ("N/A", "(null)", "none"):
            continue
        entry = entry.split("(", 1)[0]
        for prefix in ("gres:", "gres/"):
            if entry.startswith(prefix):
                entry = entry[len(prefix):]
        if "=" in entry:                               # TRES form: gpu=2 / gpu:a100=2
            name, _, count = entry.partition("=")
            parts = name.split(":") + [count]
        else:
            parts = entry.split(":")
        if parts[0] != "gpu":
            continue
        tail = parts[-1] if len(parts) > 1 else "1"
        if re.fullmatch(r"\d+", tail):
            out.append((":".join(parts[1:-1]), whole(tail, ctx, field)))
        elif len(parts) == 2:                          # "gpu:a100" (type, no count) = 1
            out.append((parts[1], 1))
        elif ctx is not None:
            raise ctx.fail(field, f"unreadable GPU count in {spec!r}")
        else:
            raise InputError(f"unreadable GPU count in {spec!r}", field=field)
    return out


def gpu_indices(detail: Iterable[str]) -> tuple[int, ...]:
    """GPU indices from gres_detail entries such as "gpu:3(IDX:0-2)" or "gpu:a100:2(IDX:1,5)".

    A malformed list ("IDX:-", "IDX:1-2-3") or one naming more than `MAX_GPU_INDEX` GPUs is an
    `InputError` (never a huge range expanded in memory).
    """
    out: list[int] = []
    for entry in detail:
        m = re.search(r"IDX:([0-9,\-]+)", entry)
        if not m or not entry.startswith("gpu"):
            continue
        for part in m.group(1).split(","):
            if not part:
                continue
            r = re.fullmatch(r"([0-9]{1,6})(?:-([0-9]{1,6}))?", part)
            if r is None:
                raise InputError(f"unreadable GPU index list in {entry!r}", field="gres_detail")
            lo = int(r.group(1))
            hi = int(r.group(2)) if r.group(2) is not None else lo
            if hi < lo or hi > MAX_GPU_INDEX or len(out) + hi - lo + 1 > MAX_GPU_INDEX:
                raise InputError(f"implausible GPU index list in {entry!r}", field="gres_detail")
            out.extend(range(lo, hi + 1))
    return tuple(out)


# --- node lists -----------------------------------------------------------------------------

MAX_HOSTLIST = 100_000             # more hosts than any cluster has: the node list is garbled
_HOST_RANGE = re.compile(r"^([^\[\],]*)\[([0-9,\-]+)\]([^\[\],]*)$")


def host_set(text: str) -> frozenset[str] | None:
    """The nodes of a host list as a set, or None when it cannot be read (`expand_hostlist`)."""
    try:
        return frozenset(expand_hostlist(text))
    except InputError:
        return None


def expand_hostlist(text: str) -> tuple[str, ...]:
    """Node names of a Slurm host list: "gpu[01-03,07],cpu1" -> gpu01, gpu02, gpu03, gpu07,
    cpu1 (zero padding kept, as Slurm writes it). One bracket per name, as Slurm's compact
    form of `squeue`'s `nodes` and `required_nodes` (22.05 .. 25.11) has it; anything else is
    an `InputError` (never a huge range expanded in memory)."""
    out: list[str] = []
    for entry in _split_outside(text or "", "[", "]"):
        m = _HOST_RANGE.match(entry)
        if m is None:
            if "[" in entry or "]" in entry:
                raise InputError(f"unreadable host list {text!r}", field="nodes")
            out.append(entry)
            continue
        prefix, ranges, suffix = m.groups()
        for part in ranges.split(","):
            r = re.fullmatch(r"([0-9]{1,9})(?:-([0-9]{1,9}))?", part)
            if r is None:
                raise InputError(f"unreadable host list {text!r}", field="nodes")
            lo, hi = r.group(1), r.group(2) or r.group(1)
            if int(hi) < int(lo) or len(out) + int(hi) - int(lo) + 1 > MAX_HOSTLIST:
                raise InputError(f"implausible host list {text!r}", field="nodes")
            width = len(lo)
            out.extend(f"{prefix}{i:0{width}d}{suffix}" for i in range(int(lo), int(hi) + 1))
    return tuple(out)


def required_node_names(job: SlurmJob) -> tuple[str, ...]:
    """The nodes of a job's required node list (`ReqNodeList=`, squeue's `required_nodes`);
    () when it names none or cannot be read."""
    try:
        return expand_hostlist(job.required_nodes)
    except InputError:
        return ()


def gpus_per_allocated_node(job: SlurmJob) -> tuple[tuple[str, int], ...] | None:
    """Where a job that holds GPUs holds them: (node, GPUs) per allocated node, in node order;
    None when Slurm's answer does not say (no node list, or GPUs per node unknown).

    Slurm 22.05 (and 23.02+) write `gres_detail` as one entry per allocated node in the order
    of the expanded `nodes` list ("gpu:2(IDX:0-1)"), also for `--gpus` jobs, whose GPUs per
    node may differ; when the entries do not match the nodes one to one, every node holds the
    request's GPUs per node (a multi-node gres job has the same count on each)."""
    try:
        names = expand_hostlist(job.node_list)
        counts = [gpu_count(d.split("(", 1)[0]) for d in job.gres_detail]
    except InputError:
        return None
    if not names:
        return None
    if len(counts) == len(names):
        if all(c > 0 for c in counts):
            return tuple(zip(names, counts))
    if job.gpus_per_node > 0:
        return tuple((n, job.gpus_per_node) for n in names)
    if job.gpus_per_job > 0 and job.gpus_per_job % len(names) == 0:
        return tuple((n, job.gpus_per_job // len(names)) for n in names)
    return None

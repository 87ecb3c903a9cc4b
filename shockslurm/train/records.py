"""The report records a training job sends, their validation, and the store rows they become.

No torch here: the daemon imports this (through `shockslurm.reports.ingest`) to ingest a spool.

A report is a small JSON object, version 1:

    {"v": 1, "kind": K, "cluster": "slurm", "job_id": 123, "job_pk": null, "time_s": 1.7e9, ...}

    kind "throughput":        samples_per_s, batch_size, gpus, epoch, step, step_in_epoch,
                              steps_per_epoch, epoch_progress   -> throughput_samples, and
                              when epoch_progress is there a job_events row (kind "progress",
                              the position as JSON) that the daemon reads as the job's progress
    kind "batch_size_change": old_batch_size, new_batch_size, epoch, step -> batch_size_changes
    kind "checkpoint":        path, step, ok                    -> checkpoints
    kind "epoch_done":        epoch, step, batch_size           -> job_events (kind "epoch_done")

Every value is bounded (`shockslurm.limits`, `BOUNDS` below): numbers finite, integers within
the store's columns, sizes under the same caps as a job's spec; an optional field is checked when
present. A report with a value out of bounds is refused as a whole, with the field named.

The job is found by `job_pk` when given, else by the newest registration of (cluster, job_id) in
the cluster's registry run (`shocksub --db` writes it at submission).

Signed reports (why: one user must not inflate or deflate another's share). `shocksub` gives
each job a fresh Ed25519 private key as its secret, `$SHOCKSLURM_REPORT_SECRET`
(`ed25519:<base64url>`), in its environment only (the job script is the user's, mode 0600), and
registers only the public key, `derive_key(secret)` (`ed25519:<base64url>`), in the job's
registration. The helper adds

    "sig": Ed25519 signature of the canonical JSON of the report without "sig", as hex

and `check_report` (the one gate of every write path: the spool ingest and the helper's direct
store writes) accepts a report only when its job is registered and the signature verifies with
THAT registration's key. A report naming another job, signed with another key, unsigned, or
edited after signing is refused with a reason that names the claimed job, never a key or secret.
What the store holds verifies reports but cannot sign them, so reading the store (or its
backups) does not let anyone forge a job's reports.

Jobs registered by shockslurm before Ed25519 keys have a hex secret and an HMAC key:
`derive_key` = HMAC-SHA256 of a fixed label under the secret, `sig` = HMAC-SHA256 under that
key. They are still checked, but anyone who can read such a key in the store can forge that
job's reports. Jobs registered without a key (before schema 0003, or plain `sbatch`) have
unsigned reports; they are refused unless the daemon runs with `allow_unsigned_reports` (default
false). A copy of a report already ingested (same job, kind, signed time and content) is refused
as a replay.
"""


from __future__ import annotations

import base64
import hashlib
import hmac
import json
import math
from typing import TYPE_CHECKING, Any, Callable

from .. import limits
from ..siteconfig import DEFAULT_CLUSTER

if TYPE_CHECKING:  # the store is the daemon's side (shockslurm[store]); the helper signs only
    from sqlalchemy.orm import Session

VERSION = 1
SIG_FIELD = "sig"
SECRET_ENV = "SHOCKSLURM_REPORT_SECRET"
ED25519 = "ed25519:"       # prefix of Ed25519 secrets and keys (legacy HMAC ones are bare hex)
_KEY_LABEL = b"shockslurm report key v1"

_FIELDS: dict[str, dict[str, type | tuple[type, ...]]] = {
    "throughput": {"samples_per_s": (int, float), "batch_size": int, "gpus": int},
    "batch_size_change": {"old_batch_size": int, "new_batch_size": int},
    "checkpoint": {"path": str, "step": int, "ok": bool},
    "epoch_done": {"epoch": int, "step": int},
}
KINDS = tuple(_FIELDS)
# What a throughput report's "progress" event keeps of the job's position.
PROGRESS_KEYS = ("epoch_progress", "epoch", "epochs", "step", "step_in_epoch", "steps_per_epoch",
                 "batch_size")


# What the store's columns can hold: SQL BIGINT, and text that encodes as UTF-8.
INT_MIN, INT_MAX = -(2 ** 63), 2 ** 63 - 1
MAX_TIME_S = 1e11        # a Unix time before the year 5000 (and the virtual times of tests)


def _int(low: int, high: int) -> Callable[[Any, str], object]:
    return lambda value, field: limits.integer(value, field, low, high)


def _num(low: float, high: float) -> Callable[[Any, str], object]:
    return lambda value, field: limits.number(value, field, low, high)


# The bounds of every value a report may carry (`limits.BadValue` when out of them).
BOUNDS: dict[str, Callable[[Any, str], object]] = {
    "time_s": _num(0.0, MAX_TIME_S),
    "samples_per_s": _num(0.0, limits.MAX_SAMPLES_PER_S),
    "batch_size": _int(1, limits.MAX_BATCH_SIZE),
    "old_batch_size": _int(1, limits.MAX_BATCH_SIZE),
    "new_batch_size": _int(1, limits.MAX_BATCH_SIZE),
    "gpus": _int(0, limits.MAX_GPUS),              # 0: a CPU run of the helper
    "epoch": _int(0, limits.MAX_EPOCHS),
    "epochs": _int(0, limits.MAX_EPOCHS),
    "epoch_progress": _num(0.0, limits.MAX_EPOCHS),
    "step": _int(0, INT_MAX),
    "step_in_epoch": _int(0, INT_MAX),
    "steps_per_epoch": _int(0, INT_MAX),
    "path": lambda value, field: limits.text(value, field, limits.MAX_PATH_CHARS),
}


class BadReport(ValueError):
    """A report that cannot be ingested (the message says why)."""


def _unstorable(key: str, value: Any) -> str | None:
    """Why a top-level value cannot reach the store (a 2**70 int, a lone surrogate), or None."""
    if isinstance(value, int) and not isinstance(value, bool) and not INT_MIN <= value <= INT_MAX:
        return f"field {limits.shown(key)} is out of the 64-bit integer range"
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return f"field {limits.shown(key)} is not valid Unicode text"
    return None


def _is(value: Any, kind: type | tuple[type, ...]) -> bool:
    if isinstance(value, bool) and kind is not bool:
        return False
    return isinstance(value, kind)


def validate(report: Any) -> dict[str, Any]:
    """The report if it is well formed; raises BadReport naming the problem otherwise."""
    if not isinstance(report, dict):
        raise BadReport(f"a report must be a JSON object, got {type(report).__name__}")
    for key, value in report.items():
        why = _unstorable(str(key), value)
        if why is not None:
            raise BadReport(why)
    if report.get("v") != VERSION:
        raise BadReport(f"unknown report version {limits.shown(report.get('v'))}")
    kind = report.get("kind")
    if not isinstance(kind, str) or kind not in _FIELDS:   # a list/dict kind is unhashable
        raise BadReport(f"unknown report kind {limits.shown(kind)}")
    if not _is(report.get("job_id"), int) and not _is(report.get("job_pk"), int):
        raise BadReport("neither job_id nor job_pk is an integer")
    if not _is(report.get("cluster", DEFAULT_CLUSTER), str):
        raise BadReport("cluster must be a string")
    time_s: Any = report.get("time_s")
    if not _is(time_s, (int, float)) or not math.isfinite(time_s):
        raise BadReport(f"time_s must be a finite number, got {limits.shown(time_s)}")
    for field, ftype in _FIELDS[kind].items():
        value = report.get(field)
        if not _is(value, ftype):
            raise BadReport(f"{kind}: field {field!r} is missing or not "
                            f"{getattr(ftype, '__name__', ftype)}: {limits.shown(value)}")
        if isinstance(value, float) and not math.isfinite(value):
            raise BadReport(f"{kind}: field {field!r} is not finite")
    for field, check in BOUNDS.items():
        if field in report:
            try:
                check(report[field], field)
            except limits.BadValue as exc:
                raise BadReport(f"{kind}: {exc}") from None
    return report


def derive_key(secret: str) -> str:
    """The key registered in the store for a job whose secret is `secret`: the Ed25519 public
    key (`ed25519:<base64url>`), or for a legacy hex secret its HMAC key (hex)."""
    if secret.startswith(ED25519):
        return ED25519 + _b64(_private(secret).public_key().public_bytes_raw())
    return hmac.new(secret.encode("utf-8"), _KEY_LABEL, hashlib.sha256).hexdigest()


def signing_key(secret: str) -> str:
    """What the job signs its reports with: the Ed25519 secret itself, or for a legacy hex
    secret its HMAC key."""
    return secret if secret.startswith(ED25519) else derive_key(secret)


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=")


def _raw(text: str, what: str) -> bytes:
    body = text[len(ED25519):]
    try:
        raw = base64.urlsafe_b64decode(body + "=" * (-len(body) % 4))
    except (ValueError, TypeError) as exc:
        raise ValueError(f"malformed Ed25519 {what}") from exc
    if len(raw) != 32:
        raise ValueError(f"malformed Ed25519 {what} ({len(raw)} bytes, expected 32)")
    return raw


def _private(secret: str) -> Any:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    return Ed25519PrivateKey.from_private_bytes(_raw(secret, "secret"))


def canonical(report: dict[str, Any]) -> bytes:
    """The bytes a signature covers: the report without `sig`, key-sorted compact JSON."""
    body = {k: v for k, v in report.items() if k != SIG_FIELD}
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True,
                      allow_nan=True).encode("ascii")


def signature(report: dict[str, Any], key: str) -> str:
    """The report's signature (hex) under a signing key (`signing_key`)."""
    if key.startswith(ED25519):
        return _private(key).sign(canonical(report)).hex()
    return hmac.new(bytes.fromhex(key), canonical(report), hashlib.sha256).hexdigest()


def sign(report: dict[str, Any], key: str) -> dict[str, Any]:
    """Add `sig` to `report` (in place) with the job's signing key; returns the report."""
    report[SIG_FIELD] = signature(report, key)
    return report


def verify(report: dict[str, Any], sig: str, key: str) -> bool:
    """Whether `sig` signs `report` for the registered `key` (`derive_key`)."""
    try:
        if key.startswith(ED25519):
            from cryptography.exceptions import InvalidSignature
            from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

            public = Ed25519PublicKey.from_public_bytes(_raw(key, "public key"))
            try:
                public.verify(bytes.fromhex(sig), canonical(report))
            except InvalidSignature:
                return False
            return True
        return hmac.compare_digest(sig.encode("ascii"), signature(report, key).encode("ascii"))
    except (UnicodeEncodeError, ValueError):
        return False


def check_report(session: Session, report: dict[str, Any], *,
                 allow_unsigned: bool = False) -> int:
    """The gate of every write path: the store key of the report's job when the report is well
    formed, its job is registered and its signature matches that job's key; raises BadReport
    with the reason (naming the claimed job, never a key) otherwise."""
    from sqlalchemy import select

    from ..store.models import Job

    validate(report)
    claimed = (f"cluster {limits.shown(report.get('cluster'))} job_id "
               f"{limits.shown(report.get('job_id'))} job_pk {limits.shown(report.get('job_pk'))}")
    job_pk = resolve_job_pk(session, report)
    if job_pk is None:
        raise BadReport(f"no registered job for {claimed}")
    key = session.scalar(select(Job.report_key).where(Job.id == job_pk))
    sig = report.get(SIG_FIELD)
    if key is None:
        if allow_unsigned:
            return job_pk
        raise BadReport(f"the job for {claimed} has no report key registered and unsigned "
                        "reports are not allowed (allow_unsigned_reports)")
    if not isinstance(sig, str):
        raise BadReport(f"unsigned report for {claimed}, whose job requires signed reports")
    if not verify(report, sig, key):
        raise BadReport(f"bad signature for {claimed} (another job's secret, or the report was "
                        "changed after signing)")
    if _already_stored(session, report, job_pk):
        raise BadReport(f"replayed report for {claimed}: the same {report['kind']} report "
                        f"(time_s {report['time_s']!r}) is stored already (a copy of an "
                        "ingested report, or a re-ingest after a crash)")
    return job_pk


def _already_stored(session: Session, report: dict[str, Any], job_pk: int) -> bool:
    """Whether the row this report makes is in the store already: same job, kind, signed time
    and content (`_identity`).

    Why: a signed report stays valid forever, so a copy of an old one (taken from a shared
    spool) could be delivered again, e.g. to move the job's reported position back. Its time
    is signed and stored with its row, so the copy is recognised without a nonce column."""
    from sqlalchemy import select

    model, conditions = _identity(report)
    found = select(model.id).where(model.job_pk == job_pk, *conditions).limit(1)
    return session.scalar(found) is not None


already_stored = _already_stored   # the spool's owner rule (reports/owned.py) asks it too


def _identity(report: dict[str, Any]) -> tuple[Any, list[Any]]:
    """The model of the row a validated report makes and the conditions that identify it."""
    from ..store.models import BatchSizeChange, Checkpoint, JobEvent, ThroughputSample

    kind, t = report["kind"], float(report["time_s"])
    if kind == "throughput":
        return ThroughputSample, [ThroughputSample.time_s == t,
                                  ThroughputSample.samples_per_s == float(report["samples_per_s"]),
                                  ThroughputSample.batch_size == report["batch_size"]]
    if kind == "batch_size_change":
        return BatchSizeChange, [BatchSizeChange.time_s == t,
                                 BatchSizeChange.old_batch_size == report["old_batch_size"],
                                 BatchSizeChange.new_batch_size == report["new_batch_size"]]
    if kind == "checkpoint":
        return Checkpoint, [Checkpoint.time_s == t, Checkpoint.step == report["step"],
                            Checkpoint.path == report["path"]]
    return JobEvent, [JobEvent.kind == "epoch_done", JobEvent.time_s == t,
                      JobEvent.detail == _epoch_detail(report)]


def _epoch_detail(report: dict[str, Any]) -> str:
    """The job event detail of an epoch_done report."""
    return json.dumps({k: report[k] for k in ("epoch", "step", "batch_size", "epochs")
                       if k in report}, sort_keys=True)


def resolve_job_pk(session: Session, report: dict[str, Any]) -> int | None:
    """The store key of the report's job, or None when the store does not know it."""
    from sqlalchemy import select

    from ..store.models import Job, Run
    from ..store.repository import REGISTRY_KIND

    job_pk = report.get("job_pk")
    if _is(job_pk, int):
        return job_pk if session.get(Job, job_pk) is not None else None
    cluster = report.get("cluster") or DEFAULT_CLUSTER
    return session.scalar(select(Job.id).join(Run, Job.run_id == Run.id)
                          .where(Run.kind == REGISTRY_KIND, Run.cluster == cluster,
                                 Job.job_id == report["job_id"])
                          .order_by(Job.submit_s.desc(), Job.id.desc()).limit(1))


def add_rows(session: Session, report: dict[str, Any], job_pk: int) -> None:
    """The rows of one validated report (the caller commits)."""
    from ..store import repository as repo
    from ..store.models import JobEvent

    kind, t = report["kind"], float(report["time_s"])
    if kind == "throughput":
        repo.add_throughput_sample(session, job_pk, time_s=t,
                                   samples_per_s=float(report["samples_per_s"]),
                                   batch_size=report["batch_size"], gpus=report["gpus"])
        progress: Any = report.get("epoch_progress")
        if _is(progress, (int, float)) and math.isfinite(progress) and progress >= 0:
            detail = {k: report[k] for k in PROGRESS_KEYS if _is(report.get(k), (int, float))}
            session.add(JobEvent(job_pk=job_pk, time_s=t, kind="progress",
                                 detail=json.dumps(detail, sort_keys=True)))
    elif kind == "batch_size_change":
        repo.add_batch_size_change(session, job_pk, time_s=t, old=report["old_batch_size"],
                                   new=report["new_batch_size"])
    elif kind == "checkpoint":
        repo.add_checkpoint(session, job_pk, time_s=t, path=report["path"],
                            step=report["step"], ok=report["ok"])
    elif kind == "epoch_done":
        session.add(JobEvent(job_pk=job_pk, time_s=t, kind="epoch_done",
                             detail=_epoch_detail(report)))
    else:  # pragma: no cover - validate() rejects it first
        raise BadReport(f"unknown report kind {kind!r}")

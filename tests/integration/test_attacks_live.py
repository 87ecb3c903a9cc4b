"""Every attack of the security issue, run as an unprivileged user against the real daemon.

The daemon runs as root (a subprocess, 3 s rounds, SQLite store, a spool) on the real Slurm test
cluster with our job_submit.lua. A user created for this test (removed afterwards) then:
- submits managed jobs whose comment spec is hostile: epochs 1e400 (inf), NaN, 1e9, negative,
  samples_per_epoch 1e300, a 1000-element batch-size ladder, a 64 KiB model name;
- submits a job whose comment hides the tag behind a newline (`x...\\nshock:managed`);
- turns a held CPU job of the managed partition into an 8-GPU job (`update Gres=gpu:8`,
  `TresPerNode=gres:gpu:8`) and releases it, and moves a GPU job of an unmanaged partition into
  the managed one (`update Partition=gpu`) and releases it;
- turns the spool against root: `bad` as a symlink to a root-only directory, a reason file
  pre-created as a symlink to a root-only file, a report that is a symlink to that file, a
  400 MB file, a FIFO, and malformed reports.
Beside them, ordinary managed jobs of the same user must all run to completion.

What must hold: the daemon never exits and keeps scheduling (every ordinary job COMPLETED); no
root-only file or directory is read (its atime, kept older than its mtime, would move under
relatime), written or listed into; nothing of the foreign file's content appears in the daemon's
log or any file it wrote; no job of the user ever runs with GPUs in the managed partition
without the exact managed tag (the watcher), and each plugin bypass ends refused or tagged and
held; each hostile spec is flagged once in the store.
"""

from __future__ import annotations

import json
import os
import pwd
import secrets
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session

from shockslurm.slurm.cli_backend import CliBackend
from shockslurm.slurm.types import JobState
from shockslurm.store import open_store
from shockslurm.store.models import Job, JobEvent

from .helpers import end_daemon

pytestmark = pytest.mark.slurm

WORKER = Path(__file__).resolve().parent / "worker.py"
ROUND_S, GRACE_S = 3.0, 1.0
DEADLINE_S = 240
CANARY = "CANARY-" + secrets.token_hex(8)

HOSTILE_SPECS = {
    "inf": '{"model":"ResNet-18","epochs":1e400,"epoch_seconds":2}',
    "nan": '{"model":"ResNet-18","epochs":NaN,"epoch_seconds":2}',
    "huge-epochs": '{"model":"ResNet-18","epochs":1e9,"epoch_seconds":2}',
    "negative": '{"model":"ResNet-18","epochs":-5,"epoch_seconds":-1,"batch_size":-3}',
    "huge-samples": '{"model":"ResNet-18","epochs":2,"samples_per_epoch":1e300}',
    "long-ladder": json.dumps({"model": "ResNet-18", "epochs": 2, "epoch_seconds": 2,
                               "batch_sizes": list(range(1, 1001))}, separators=(",", ":")),
    "long-name": json.dumps({"model": "M" * 65536, "epochs": 2, "epoch_seconds": 2}),
}


def _as_user(user: str, argv: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["setpriv", f"--reuid={user}", "--regid=nogroup", "--clear-groups",
                           *argv], capture_output=True, text=True, timeout=60, cwd=cwd)


@pytest.fixture
def attacker():
    name = f"shockatk{os.getpid() % 100000}"
    subprocess.run(["useradd", "-M", "-N", "-g", "nogroup", "-s", "/usr/sbin/nologin", name],
                   check=True, capture_output=True, timeout=30)
    try:
        yield name
    finally:
        subprocess.run(["scancel", "-u", name], capture_output=True, timeout=30)
        subprocess.run(["userdel", name], capture_output=True, timeout=30)


@pytest.fixture
def arena():
    """A directory every user can reach (pytest's tmp_path is root-only)."""
    path = Path(f"/tmp/shockattack-{os.getpid()}")
    path.mkdir(mode=0o755)
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _root_only(arena: Path) -> tuple[Path, Path]:
    """A root-only file and directory holding the canary, their atime older than their mtime."""
    secret_dir = arena / "rootonly"
    secret_dir.mkdir(mode=0o700)
    secret = arena / "secret.json"
    secret.write_text(json.dumps({"kind": CANARY, "job_id": CANARY, "sig": CANARY}))
    secret.chmod(0o600)
    (secret_dir / "inside.json").write_text(CANARY)
    for p in (secret, secret_dir / "inside.json", secret_dir):
        st = p.stat()
        os.utime(p, ns=(st.st_mtime_ns - 10**11, st.st_mtime_ns))
    return secret, secret_dir


def _fingerprint(path: Path) -> tuple:
    """Times and size from stat alone: listing or reading here would itself move the atime."""
    st = os.stat(path, follow_symlinks=False)
    return (st.st_atime_ns, st.st_mtime_ns, st.st_ctime_ns, st.st_size)


def _submit(user: str, arena: Path, name: str, *args: str) -> tuple[int | None, str]:
    out = _as_user(user, ["sbatch", "--parsable", f"--job-name={name}",
                          "-o", str(arena / "out" / "%x-%j.out"), *args], arena)
    if out.returncode != 0:
        return None, out.stderr
    return int(out.stdout.strip().split(";")[0]), out.stderr


def _worker(arena: Path, target: int) -> str:
    return f"exec /usr/bin/python3 {arena / 'worker.py'} --target {target} --state {arena / 'state'}"


def test_every_attack_as_an_unprivileged_user(slurm_cluster, attacker, arena):
    user = attacker
    uid = pwd.getpwnam(user).pw_uid
    prefix = f"shockatk{os.getpid()}-"
    for d in ("out", "state"):
        (arena / d).mkdir()
        os.chown(arena / d, uid, -1)
    shutil.copy(WORKER, arena / "worker.py")
    (arena / "worker.py").chmod(0o644)
    secret, secret_dir = _root_only(arena)
    spool = arena / "spool"             # as the README documents: root's, sticky, 1733
    spool.mkdir()
    spool.chmod(0o1733)
    state = arena / "daemon"            # the daemon's own state (store, rejected reports)
    state.mkdir(mode=0o700)
    db = state / "store.db"
    config = state / "daemon.toml"
    config.write_text(
        "[daemon]\n"
        f"round_seconds = {ROUND_S}\ngrace_seconds = {GRACE_S}\n"
        "stop_timeout_seconds = 10\npolicy = \"max_min_fairness\"\npartitions = [\"gpu\"]\n"
        f"db = \"{db}\"\nbackend = \"cli\"\njob_name_prefix = \"{prefix}\"\n"
        f"spool_dir = \"{spool}\"\n"
        "metrics_port = 0\nmin_run_seconds = 2\n"
        "[policy]\nmin_resolve_interval_s = 0\nidle_unallocated = false\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SHOCKSLURM_", "SLURM_"))}
    log_path = state / "daemon.log"
    before = {p: _fingerprint(p) for p in (secret, secret_dir, secret_dir / "inside.json")}
    violations: list[str] = []
    stop = threading.Event()
    ordinary: dict[int, str] = {}
    hostile: dict[int, str] = {}
    bypass: dict[int, str] = {}

    def watch() -> None:
        backend = CliBackend(timeout=10)
        while not stop.is_set():
            try:
                jobs = backend.jobs()
            except Exception:
                stop.wait(0.5)
                continue
            for j in jobs:
                if j.user == user and j.state is JobState.RUNNING and j.gpus > 0 and \
                        "gpu" in j.partition.split(",") and not j.managed:
                    violations.append(f"job {j.job_id} runs {j.gpus} GPUs untagged "
                                      f"(comment {j.comment!r})")
            stop.wait(0.5)

    daemon = None
    log = open(log_path, "ab")
    watcher = threading.Thread(target=watch, daemon=True)
    try:
        # ordinary jobs of the same user: the daemon must keep scheduling them
        for k, gpus in enumerate([1, 2, 4, 8, 2, 1]):
            spec = json.dumps({"model": "ResNet-18", "epochs": 2, "epoch_seconds": 3},
                              separators=(",", ":"))
            job, err = _submit(user, arena, f"{prefix}ok{k}", "-p", "gpu", f"--gres=gpu:{gpus}",
                               "--requeue", f"--comment=shock:spec={spec}",
                               "--wrap", _worker(arena, 30))
            assert job is not None, err
            ordinary[job] = f"ok{k}"
        # hostile specs
        for what, spec in HOSTILE_SPECS.items():
            job, err = _submit(user, arena, f"{prefix}{what}", "-p", "gpu", "--gres=gpu:1",
                               "--requeue", f"--comment=shock:spec={spec}",
                               "--wrap", _worker(arena, 10))
            if job is not None:      # sbatch may refuse a huge comment itself: fine
                hostile[job] = what
        # the tag hidden behind a newline: plugin and daemon must agree
        newline, err = _submit(user, arena, f"{prefix}newline", "-p", "gpu", "--gres=gpu:1",
                               "--comment=x" + "." * 40 + "\nshock:managed",
                               "--wrap", _worker(arena, 10))
        assert newline is not None, err
        ordinary[newline] = "newline"

        daemon = subprocess.Popen([sys.executable, "-m", "shockslurm.cli.main", "daemon",
                                   "--config", str(config)], stdout=log,
                                  stderr=subprocess.STDOUT, env=env, cwd=state)
        watcher.start()

        # plugin bypasses: a held CPU job of the managed partition given GPUs, then released
        for field in ("Gres=gpu:8", "TresPerNode=gres:gpu:8"):
            job, err = _submit(user, arena, f"{prefix}cpu2gpu", "-p", "gpu", "--hold",
                               "--wrap", "sleep 20")
            assert job is not None, err
            bypass[job] = field
            _as_user(user, ["scontrol", "update", f"JobId={job}", field], arena)
            _as_user(user, ["scontrol", "release", str(job)], arena)
        # ... and a GPU job of an unmanaged partition moved into the managed one
        job, err = _submit(user, arena, f"{prefix}move", "-p", "urgent", "--hold",
                           "--gres=gpu:8", "--wrap", "sleep 20")
        assert job is not None, err
        bypass[job] = "Partition=gpu"
        _as_user(user, ["scontrol", "update", f"JobId={job}", "Partition=gpu"], arena)
        _as_user(user, ["scontrol", "release", str(job)], arena)

        # the spool turned against root (each step as the user; failures are the defence)
        def sh(cmd: str) -> None:
            _as_user(user, ["sh", "-c", cmd], spool)

        sh(f"ln -s {secret_dir} bad")
        sh("printf 'not json' > evil1.json")
        time.sleep(2 * ROUND_S)
        sh("rm -f bad; mkdir bad && chmod 777 bad")
        sh(f"ln -s {secret} bad/evil2.json.reason; ln -s {secret} bad/evil2.json")
        sh("printf '{\"job_id\": 1, \"kind\": 7}' > evil2.json")
        sh(f"ln -s {secret} x.json")
        sh(f"ln -s {secret_dir / 'inside.json'} y.json")
        sh("truncate -s 400M big.json")
        sh("mkfifo fifo.json")
        sh(f"ln -s {secret_dir} dir.json")
        time.sleep(3 * ROUND_S)        # rounds that ingest the spool as it stands now

        # every ordinary job completes, the daemon stays up throughout
        backend = CliBackend(timeout=10)
        t0 = time.monotonic()
        final: dict[int, JobState] = {}
        while time.monotonic() - t0 < DEADLINE_S:
            assert daemon.poll() is None, "the daemon exited: " + log_path.read_text()[-3000:]
            final = {j.job_id: j.state for j in backend.jobs() if j.job_id in ordinary}
            if len(final) == len(ordinary) and all(s.finished for s in final.values()):
                break
            time.sleep(1.0)
        stop.set()
        watcher.join(timeout=15)
        assert daemon.poll() is None, "the daemon exited: " + log_path.read_text()[-3000:]
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(timeout=60)
        daemon_log = log_path.read_text(errors="replace")

        assert all(s is JobState.COMPLETED for s in final.values()) and \
            len(final) == len(ordinary), (
                {ordinary[j]: s.value for j, s in final.items()}, daemon_log[-4000:])
        assert "Traceback" not in daemon_log, daemon_log[-4000:]
        assert violations == [], violations[:10]

        # the malformed reports were taken out of the spool and refused with a reason, in the
        # daemon's own area beside it (the user's `bad` directory got nothing)
        rejected = Path(f"{spool}.rejected")
        reasons = sorted(p.name for p in rejected.iterdir() if p.name.endswith(".reason"))
        assert {"evil1.json.reason", "evil2.json.reason"} <= set(reasons), reasons
        assert not (spool / "evil1.json").exists() and not (spool / "evil2.json").exists()
        assert os.stat(rejected).st_uid == 0 and os.stat(rejected).st_mode & 0o077 == 0
        print(f"\nrejected: {reasons}; left in the spool: {sorted(os.listdir(spool))}")

        # no root-only file or directory read, written or listed into
        for path, print_before in before.items():
            assert _fingerprint(path) == print_before, f"{path} was read or written"
        assert os.listdir(secret_dir) == ["inside.json"]
        assert (secret_dir / "inside.json").read_text() == CANARY
        # nothing of the foreign content in the log or anything the daemon wrote
        assert CANARY not in daemon_log
        for root, _dirs, files in os.walk(arena):
            if Path(root) == secret_dir:
                continue
            for f in files:
                p = Path(root) / f
                if p == secret or p.is_symlink() or not p.is_file() or p.stat().st_size > 10**6:
                    continue
                assert CANARY not in p.read_text(errors="replace"), f"canary leaked into {p}"

        # each plugin bypass ended refused or tagged and held, never running untagged
        jobs = {j.job_id: j for j in backend.jobs()}
        for job_id, field in bypass.items():
            j = jobs.get(job_id)
            assert j is not None, f"{field}: job {job_id} vanished"
            if j.gpus > 0 and "gpu" in j.partition.split(","):
                assert j.managed, f"{field}: job {job_id} is a GPU job of gpu, untagged"

        # each hostile spec flagged exactly once in the store
        engine = open_store(str(db))
        with Session(engine) as s:
            flagged = s.execute(select(Job.job_id, JobEvent.kind)
                                .join(Job, JobEvent.job_pk == Job.id)
                                .where(JobEvent.kind == "flagged")).all()
        engine.dispose()
        counts: dict[int, int] = {}
        for job_id, _kind in flagged:
            counts[job_id] = counts.get(job_id, 0) + 1
        for job_id, what in hostile.items():
            if what in ("long-ladder", "long-name"):
                continue     # within caps after clipping: may be scheduled without a flag
            assert counts.get(job_id) == 1, (what, counts, daemon_log[-3000:])
        print(f"\nattacks: ordinary={len(ordinary)} completed; hostile specs={len(hostile)} "
              f"flagged={sum(1 for j in hostile if counts.get(j))}; bypasses="
              f"{ {f: (jobs[j].managed, jobs[j].state.value) for j, f in bypass.items()} }")
    finally:
        end_daemon(daemon, stop, log)
        subprocess.run(["scancel", "-u", user], capture_output=True, timeout=30)

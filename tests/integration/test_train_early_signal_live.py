"""Issue 13, item 4 on the real Slurm test cluster: a job submitted with `shocksub` gets the
daemon's stop (`scancel --signal=USR1 --batch`, forwarded by the job script through srun) while
its Python process has not imported torch yet (within its first second on an idle machine;
the script waits for the signal before `import torch`, so a loaded machine changes only how long
that takes). It exits 0 with a
checkpoint of its first step; requeued (as the daemon does it), it resumes there and ends
bit-identical to an uninterrupted local run.

Timing: the training script touches a file right after `import shockslurm.train`, before
`import torch`; the test sends the signal as soon as it sees that file, and the script records
that torch was not loaded yet when the signal came (the first step's log says so).
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")  # CI installs CPU torch (tests/run.sh); never skipped there

from ..train_job import TRAIN_LOOP, job_env

pytestmark = pytest.mark.slurm

REPO = Path(__file__).resolve().parents[2]

TRAIN = r"""
import os, signal, sys, time
t0 = time.monotonic()
sys.path.insert(0, {repo!r})
import shockslurm.train
from shockslurm.train import lease
open({imported!r}, "w").write(str(os.getpid()))
wait_s = 0 if os.environ.get("SLURM_RESTART_COUNT") else {wait_s}
while not lease._early_received and time.monotonic() - t0 < wait_s:
    time.sleep(0.005)       # the first run: torch's import (~3 s) begins when the signal came
early = list(lease._early_received)
print("signal before torch:", [signal.Signals(s).name for s in early],
      "torch" in sys.modules, f"{{time.monotonic() - t0:.2f}} s in", flush=True)
"""


def _script(**values: str | int) -> str:
    return TRAIN.format(**values) + TRAIN_LOOP


def _state(job: int) -> tuple[str, str]:
    out = subprocess.run(["scontrol", "show", "job", str(job)], capture_output=True, text=True,
                         timeout=30).stdout
    state = re.search(r"JobState=(\S+)", out)
    code = re.search(r"ExitCode=(\S+)", out)
    return (state.group(1) if state else "?"), (code.group(1) if code else "?")


def _wait_done(job: int, timeout_s: float = 120.0) -> tuple[str, str]:
    deadline = time.monotonic() + timeout_s
    while True:
        state, code = _state(job)
        if state in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL"):
            return state, code
        assert time.monotonic() < deadline, f"job {job} still {state} after {timeout_s:.0f} s"
        time.sleep(0.5)


def test_usr1_while_torch_loads_exits_0_then_resumes_bit_identical(tmp_path: Path,
                                                                   slurm_cluster):
    imported = tmp_path / "imported"
    script = tmp_path / "train.py"
    script.write_text(_script(repo=str(REPO), imported=str(imported), wait_s=20))
    reference = tmp_path / "reference.py"          # no signal coming: do not wait for one
    reference.write_text(_script(repo=str(REPO), imported=str(tmp_path / "ref-imp"),
                                      wait_s=0))
    ref = subprocess.run([sys.executable, str(reference), str(tmp_path / "ref-ck"),
                          str(tmp_path / "ref.pt")], capture_output=True, text=True,
                         timeout=120, env=job_env())
    assert ref.returncode == 0 and "finished 24" in ref.stdout, ref.stdout + ref.stderr

    argv = [sys.executable, "-m", "shockslurm.cli.shocksub", "--gpus", "1", "--partition", "gpu",
            "--job-name", "shockit-early", "--model", "tiny", "--epochs", "3",
            "--samples-per-epoch", "64", "--batch-sizes", "8", "--batch-size", "8",
            "--epoch-seconds", "5", "--output", str(tmp_path / "%x-%j.out"),
            "--script-dir", str(tmp_path / "scripts"),
            "--db", f"sqlite:///{tmp_path / 'store.db'}", "--",
            sys.executable, str(script), str(tmp_path / "ck"), str(tmp_path / "out.pt")]
    sub = subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=tmp_path,
                         env=job_env())
    assert sub.returncode == 0, sub.stderr
    job = int(sub.stdout.strip().splitlines()[-1])
    try:
        # the job_submit plugin holds managed jobs for the daemon; start it as the daemon would
        subprocess.run(["scontrol", "release", str(job)], check=True, timeout=30)
        deadline = time.monotonic() + 90
        while not imported.exists():
            assert time.monotonic() < deadline, f"job {job} never started: {_state(job)}"
            time.sleep(0.02)
        # the daemon's stop, as slurm/enact.py sends it
        subprocess.run(["scancel", "--signal=USR1", "--batch", str(job)], check=True,
                       timeout=30)
        state, code = _wait_done(job)
        output = (tmp_path / f"shockit-early-{job}.out").read_text()
        assert (state, code) == ("COMPLETED", "0:0"), output
        started = re.search(r"signal before torch: \['SIGUSR1'\] False ([\d.]+) s in", output)
        assert started, output
        # before torch's import, which waits up to wait_s for it (well under a second idle)
        assert float(started.group(1)) < 20.0, output
        assert "stopped at 1 signal SIGUSR1" in output and "finished" not in output, output
        assert (tmp_path / "ck" / "ckpt-000000000001.pt").exists()

        # requeued as the daemon does it (requeue, then clear the ~2 min BeginTime wait). Slurm
        # 22.05: a relaunch in the same second as the job's end fails ("Killing non-startable
        # batch JobId: Job credential revoked", exit 1:0): slurmd revoked the credentials of
        # that job up to its end time, at one second's granularity.
        time.sleep(2)
        subprocess.run(["scontrol", "requeue", str(job)], check=True, timeout=30)
        subprocess.run(["scontrol", "update", f"JobId={job}", "StartTime=now"], check=True,
                       timeout=30)
        deadline = time.monotonic() + 120
        while "finished" not in (tmp_path / f"shockit-early-{job}.out").read_text():
            assert time.monotonic() < deadline, _state(job)
            time.sleep(0.5)
        state, code = _wait_done(job)
        output = (tmp_path / f"shockit-early-{job}.out").read_text()
        assert (state, code) == ("COMPLETED", "0:0"), output
        assert "run 1 on" in output and "resumed at 1" in output and "finished 24" in output
    finally:
        subprocess.run(["scancel", str(job)], capture_output=True, timeout=30)
    ref_w, out_w = torch.load(tmp_path / "ref.pt"), torch.load(tmp_path / "out.pt")
    assert all(torch.equal(ref_w[k], out_w[k]) for k in ref_w)

"""The researcher's surface of shockslurm.train: the public names, the explicit stop outcome (with
and without `with`), and stop signals kept from `import shockslurm.train` on, before torch loads."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")  # CI installs torch (tests/run.sh); never skipped there

import shockslurm.train  # noqa: E402
from shockslurm.train import Lease, ShockTrainer, lease  # noqa: E402
from shockslurm.train.reports import Reporter  # noqa: E402

from .train_job import TRAIN_LOOP, job_env  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
API = ["CheckpointManager", "CheckpointMismatch", "CorruptCheckpoint", "Lease", "Reporter",
       "ResumableSampler", "SeededDataset", "ShardedCheckpointManager",
       "ShockTrainer", "install_signal_handlers", "load_checkpoint"]

# A job's script: the helper first, then (once the test has signalled it) torch and the loop.
JOB = r"""
import sys
import shockslurm.train
print("imported", "torch" in sys.modules, flush=True)
sys.stdin.readline()                    # the test signals here, before torch is imported
""" + TRAIN_LOOP


def _job_env(**more: str) -> dict[str, str]:
    return job_env(PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
                   **more)


def _run_job(ckpt: Path, out: Path, env: dict[str, str],
             signum: int | None = None) -> tuple[int, str, float]:
    """Run JOB; with `signum`, send it as soon as the helper is imported. (rc, output, seconds
    from the start of the process to the signal)."""
    t0 = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-c", JOB, str(ckpt), str(out)], env=env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    assert proc.stdin is not None and proc.stdout is not None
    first = proc.stdout.readline()
    sent_after = time.monotonic() - t0
    assert first == "imported False\n", first           # torch is not loaded yet
    if signum is not None:
        proc.send_signal(signum)
    try:
        proc.stdin.write("go\n")
        proc.stdin.close()
    except BrokenPipeError:                              # it died of the signal
        pass
    output = proc.stdout.read()
    return proc.wait(timeout=120), first + output, sent_after


def test_sigusr1_in_the_first_second_stops_at_the_first_step_then_resumes(tmp_path):
    env = _job_env(SLURM_JOB_ID="4242")                  # what srun gives the job's process
    ref_rc, ref_out, _ = _run_job(tmp_path / "ref-ck", tmp_path / "ref.pt", env)
    assert ref_rc == 0 and "finished 24" in ref_out, ref_out

    rc, out, sent_after = _run_job(tmp_path / "ck", tmp_path / "out.pt", env, signal.SIGUSR1)
    # the helper imports without torch: a fraction of a second idle (a few on a loaded machine)
    assert sent_after < 5.0, f"the helper was imported only {sent_after:.2f} s in"
    assert rc == 0, out
    assert "stopped at 1 signal SIGUSR1" in out and "finished" not in out, out
    assert (tmp_path / "ck" / "ckpt-000000000001.pt").exists()

    rc, out, _ = _run_job(tmp_path / "ck", tmp_path / "out.pt", env)   # the requeued run
    assert rc == 0 and "resumed at 1" in out and "finished 24" in out, out
    ref, final = torch.load(tmp_path / "ref.pt"), torch.load(tmp_path / "out.pt")
    assert all(torch.equal(ref[k], final[k]) for k in ref)


@pytest.mark.parametrize("env", [{"SLURM_JOB_ID": "4242", "SHOCKSLURM_EARLY_SIGNALS": "0"}, {}],
                         ids=["turned-off", "outside-a-job"])
def test_no_early_handlers_where_not_wanted(tmp_path, env):
    """Outside a Slurm job / torchrun (or turned off) the import changes no signal disposition:
    SIGUSR1 still kills the process as it would any other."""
    rc, out, _ = _run_job(tmp_path / "ck", tmp_path / "out.pt", _job_env(**env), signal.SIGUSR1)
    assert rc == -signal.SIGUSR1, out


def test_early_signal_is_taken_over_by_the_first_lease():
    previous = signal.getsignal(signal.SIGUSR1)
    signal.signal(signal.SIGUSR1, signal.SIG_DFL)
    try:
        assert shockslurm.train.install_signal_handlers()
        os.kill(os.getpid(), signal.SIGUSR1)             # recorded, not fatal
        first = Lease(stop_file=False).install()
        assert first.should_stop() and first.reason == "signal SIGUSR1"
        first.close()
        second = Lease(stop_file=False).install()        # taken over once, by the first only
        assert not second.should_stop()
        second.close()
        assert signal.getsignal(signal.SIGUSR1) is lease._early_handler
        lease.uninstall_signal_handlers()
        assert signal.getsignal(signal.SIGUSR1) is signal.SIG_DFL
    finally:
        lease.uninstall_signal_handlers()
        signal.signal(signal.SIGUSR1, previous)


def test_early_handlers_leave_someone_elses_handler_alone():
    seen: list[int] = []
    previous = signal.signal(signal.SIGUSR1, lambda s, f: seen.append(s))
    try:
        shockslurm.train.install_signal_handlers(signals=[signal.SIGUSR1])
        os.kill(os.getpid(), signal.SIGUSR1)
        assert seen == [signal.SIGUSR1]
    finally:
        lease.uninstall_signal_handlers()
        signal.signal(signal.SIGUSR1, previous)


def _loop(st: ShockTrainer, x, y, model, opt) -> list[bool]:
    outcomes = []
    for _, _, batches in st.epochs((x, y), 8, 2):
        for _, (xb, yb) in batches:
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(xb), yb).backward()
            opt.step()
            outcomes.append(st.step())
    return outcomes


def test_stop_outcome_without_with(tmp_path):
    torch.manual_seed(0)
    x, y = torch.randn(64, 4), torch.randint(0, 2, (64,))
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    before = signal.getsignal(signal.SIGUSR1)
    st = ShockTrainer(model, opt, ckpt_dir=tmp_path, every_steps=None, every_seconds=None,
                      reporter=Reporter(None), lease=Lease(stop_file=False))
    assert signal.getsignal(signal.SIGUSR1) == st.lease._handler   # installed when built
    os.kill(os.getpid(), signal.SIGUSR1)
    assert _loop(st, x, y, model, opt) == [True]          # no exception, no further batch
    assert st.should_stop and st.stop_reason == "signal SIGUSR1" and st.global_step == 1
    assert (tmp_path / "ckpt-000000000001.pt").exists()
    with pytest.raises(SystemExit) as exited:
        st.save_and_exit()
    assert exited.value.code == 0
    assert signal.getsignal(signal.SIGUSR1) == before     # handlers put back

    again = ShockTrainer(model, opt, ckpt_dir=tmp_path, every_steps=None, every_seconds=None,
                         reporter=Reporter(None), lease=Lease(stop_file=False))
    assert again.resumed_from is None                     # resumes at the first epochs()
    assert _loop(again, x, y, model, opt) == [False] * 15
    assert again.resumed_from is not None and again.global_step == 16 and not again.should_stop
    again.close()


def test_exit_on_stop_still_exits(tmp_path):
    x, y = torch.randn(32, 4), torch.randint(0, 2, (32,))
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with ShockTrainer(model, opt, ckpt_dir=tmp_path, exit_on_stop=True, check_every=5,
                      reporter=Reporter(None), lease=Lease(stop_file=False)) as st:
        st.request_stop("test")
        with pytest.raises(SystemExit) as exited:
            _loop(st, x, y, model, opt)
    assert exited.value.code == 0 and st.global_step == 1   # check_every: the first step polls


def test_public_names():
    code = ("import sys, shockslurm.train as t; print(dir(t)); print(sorted(t.__all__)); "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, env=_job_env()).stdout.splitlines()
    assert out == [repr(API), repr(API), "False"]
    for name in API:
        assert getattr(shockslurm.train, name).__doc__, name
    assert not hasattr(shockslurm.train, "ingest_spool")       # the daemon's side
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        shockslurm.train.nope  # noqa: B018

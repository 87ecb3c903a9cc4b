"""Exact resume: a run stopped twice by SIGUSR1 and restarted ends bit-identical to one that never
stopped, with the batch-size changes at the same steps."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")  # CI installs torch (tests/run.sh); never skipped there

from shockslurm.train import ShockTrainer  # noqa: E402
from shockslurm.train.lease import Lease  # noqa: E402
from shockslurm.train.reports import Reporter  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "train_mnist_like.py"
STEPS = 200          # epochs of 64, 64, 32, 16, 16, ... steps: changes at steps 128 and 160


def _env(spool: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SLURM_", "SHOCKSLURM_", "RANK", "WORLD_SIZE"))}
    env["SHOCKSLURM_SPOOL"] = str(spool)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def _cmd(ckpt: Path, out: Path, sleep: float = 0.0) -> list[str]:
    return [sys.executable, str(EXAMPLE), "--ckpt-dir", str(ckpt), "--steps", str(STEPS),
            "--out", str(out), "--every-steps", "50", "--sleep", str(sleep)]


def _run_and_signal(cmd: list[str], env: dict[str, str], at_step: int) -> int:
    """Start the example, send SIGUSR1 once it printed step `at_step`; the step it stopped at."""
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    last = 0
    sent = False
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("step "):
            last = int(line.split()[1])
            if last >= at_step and not sent:
                proc.send_signal(signal.SIGUSR1)
                sent = True
    rc = proc.wait(timeout=120)
    err = proc.stderr.read() if proc.stderr else ""
    assert rc == 0, err
    assert sent and last < STEPS, f"the run ended (step {last}) before it could be stopped"
    assert "stopping at step" in err and "signal SIGUSR1" in err
    return last


def _changes(spool: Path) -> list[tuple[int, int, int]]:
    out = []
    for f in sorted(spool.glob("*.json")):
        r = json.loads(f.read_text())
        if r["kind"] == "batch_size_change":
            out.append((r["step"], r["old_batch_size"], r["new_batch_size"]))
    return out


def _assert_bit_identical(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), f"tensor {k} differs"


def test_interrupted_twice_by_sigusr1_is_bit_identical(tmp_path):
    spool_a, spool_b = tmp_path / "spool-a", tmp_path / "spool-b"
    ref_out, out = tmp_path / "ref.pt", tmp_path / "out.pt"
    subprocess.run(_cmd(tmp_path / "ck-a", ref_out) + ["--quiet"], env=_env(spool_a),
                   check=True, timeout=120)

    ckpt, env = tmp_path / "ck-b", _env(spool_b)
    stop1 = _run_and_signal(_cmd(ckpt, out, sleep=0.02), env, at_step=70)    # mid epoch 1
    stop2 = _run_and_signal(_cmd(ckpt, out, sleep=0.02), env, at_step=140)   # after a change
    assert stop1 < stop2 < STEPS
    assert not out.exists()
    res = subprocess.run(_cmd(ckpt, out), env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert f"resumed {ckpt}" in res.stdout and f"finished step {STEPS}" in res.stdout

    _assert_bit_identical(torch.load(ref_out), torch.load(out))
    expected = [(128, 32, 64), (160, 64, 128)]
    assert _changes(spool_a) == expected
    assert _changes(spool_b) == expected


# ---------------------------------------------------------------- in process (fast, exhaustive)

def _example():
    spec = importlib.util.spec_from_file_location("train_mnist_like", EXAMPLE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _train(ckpt: Path, stop_at: int | None, total: int, *, schedule=(8, 8, 16, 32),
           epochs: int = 5, checkpoint_epochs: bool = False):
    """Train in process; `stop_at` asks for a stop after that step (as a signal would)."""
    import random
    ex = _example()
    torch.manual_seed(0)
    random.seed(0)
    x, y = ex.make_data(256)
    model = ex.make_model(32)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.9)
    st = ShockTrainer(model, opt, scheduler=sched, ckpt_dir=ckpt, every_steps=7,
                      exit_on_stop=False, checkpoint_epochs=checkpoint_epochs,
                      reporter=Reporter(None), lease=Lease(stop_file=False))
    with st:
        for epoch, bs, batches in st.epochs((x, y), list(schedule), epochs):
            for _, (xb, yb) in batches:
                if random.random() < 0.5:
                    xb = xb + 0.1 * torch.randn_like(xb)
                opt.zero_grad()
                torch.nn.functional.cross_entropy(model(xb), yb).backward()
                opt.step()
                if stop_at is not None and st.global_step + 1 == stop_at:
                    st.request_stop("test")
                if st.step() or st.global_step >= total:
                    break
            if st.stopped or st.global_step >= total:
                break
            sched.step()
    return model.state_dict(), st


@pytest.mark.parametrize("checkpoint_epochs", [False, True])
def test_stops_at_every_kind_of_position_resume_exactly(tmp_path, checkpoint_epochs):
    # 256 samples: epochs of 32, 32, 16, 8, 8 steps; stops mid-epoch, at the last step of an
    # epoch (32, 64), at the first step of one (33, 65) and just after a change (81).
    total = 96
    ref, ref_st = _train(tmp_path / "ref", None, total, checkpoint_epochs=checkpoint_epochs)
    assert [(c["step"], c["old"], c["new"]) for c in ref_st.batch_size_changes] == [
        (64, 8, 16), (80, 16, 32)]
    for stop_at in (5, 32, 33, 64, 65, 81, 95):
        ckpt = tmp_path / f"ck-{stop_at}"
        _, st = _train(ckpt, stop_at, total, checkpoint_epochs=checkpoint_epochs)
        assert st.stopped and st.global_step == stop_at
        final, st2 = _train(ckpt, None, total, checkpoint_epochs=checkpoint_epochs)
        assert st2.resumed_from is not None and st2.global_step == total
        _assert_bit_identical(ref, final)
        seen = [(c["step"], c["old"], c["new"]) for c in st.batch_size_changes
                + st2.batch_size_changes]
        assert seen == [(64, 8, 16), (80, 16, 32)], stop_at


def test_restart_after_completion_does_nothing(tmp_path):
    ref, st = _train(tmp_path / "ck", None, 10_000, epochs=2)
    again, st2 = _train(tmp_path / "ck", None, 10_000, epochs=2)
    assert st2.global_step == st.global_step == 64
    _assert_bit_identical(ref, again)


def _accumulating(ckpt: Path, stop_at_step: int | None, seen: list[int], reports: list[dict],
                  accumulate: int = 4):
    """One epoch of 32 samples in batches of 2, an optimizer step every `accumulate` batches
    (`st.step()` after each optimizer step, as the helper's docs say)."""
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(5)
    x = torch.randn(32, 3, generator=g)

    class Sink:
        def send(self, r):
            reports.append(r)

        def close(self):
            pass

    with ShockTrainer(model, opt, ckpt_dir=ckpt, every_seconds=None, report_interval_s=0.0,
                      lease=Lease(stop_file=False),
                      reporter=Reporter(Sink(), job_id=1, min_interval_s=0.0)) as st:
        for _epoch, _size, batches in st.epochs((x, x.sum(1, keepdim=True)), [2], num_epochs=1):
            for k, (xb, yb) in batches:
                seen.append(k)
                torch.nn.functional.mse_loss(model(xb), yb).div(accumulate).backward()
                if (k + 1) % accumulate == 0:
                    opt.step()
                    opt.zero_grad()
                    if st.global_step + 1 == stop_at_step:
                        st.request_stop("test")
                    if st.step():
                        return None
    return model.weight.detach().clone()


def test_gradient_accumulation_resumes_after_the_last_batch_trained_on(tmp_path):
    """With four batches to an optimizer step, a stop at step 2 (batch 7) resumed at batch 2 (the
    step count), training batches 2-7 twice; throughput counted one batch a step."""
    ref_seen: list[int] = []
    ref_reports: list[dict] = []
    ref = _accumulating(tmp_path / "ref", None, ref_seen, ref_reports)
    first: list[int] = []
    assert _accumulating(tmp_path / "ck", 2, first, []) is None
    second: list[int] = []
    out = _accumulating(tmp_path / "ck", None, second, [])
    assert first == list(range(8)) and second == list(range(8, 16))
    assert torch.equal(ref, out)
    steps = [r for r in ref_reports if r["kind"] == "throughput"]
    assert [r["step_in_epoch"] for r in steps] == [4, 8, 12, 16]
    assert [r["epoch_progress"] for r in steps] == [0.25, 0.5, 0.75, 1.0]

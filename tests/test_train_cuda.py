"""The training helper on a CUDA device: what a CPU run cannot show. Not run where torch sees no
GPU (CI has none): marked `cuda`, they are deselected there (tests/conftest.py); README
"Training helper" says where and when these last ran on one.

- float16 autocast with a GradScaler and dropout on CUDA: a run stopped mid-way and resumed in a
  fresh process ends with weights, scaler state and CUDA RNG bit-identical to one that never
  stopped (the CUDA RNG states and the scaler go through the checkpoint);
- DistributedDataParallel over NCCL (one rank: one GPU here), a DataLoader with workers and
  pinned memory: stopped by SIGUSR1, the rerun resumes bit-identical;
- the helper's own collectives over NCCL (the stop agreed in an all-reduce of a CUDA tensor,
  every rank's RNG states gathered into the checkpoint), run in a one-rank NCCL group with the
  helper told it is distributed (with one GPU no second NCCL rank can be started);
- the restart benchmark runs on the GPU (the stop, the start and its parts are timed).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.cuda     # deselected where torch sees no GPU (tests/conftest.py)

from shockslurm.train.checkpoint import CheckpointManager  # noqa: E402

from .train_job import job_env, signal_rank_once_running  # noqa: E402

HERE = Path(__file__).resolve().parent
AMP_JOB = HERE / "cuda_amp_job.py"
DDP_EXAMPLE = HERE.parent / "examples" / "train_ddp.py"


def _env() -> dict[str, str]:
    return job_env(CUBLAS_WORKSPACE_CONFIG=":4096:8")


def _amp(tmp: Path, ckpt: str, out: str, *stop_at: int) -> subprocess.CompletedProcess[str]:
    res = subprocess.run([sys.executable, str(AMP_JOB), str(tmp / ckpt), str(tmp / out),
                          *map(str, stop_at)], capture_output=True, text=True, timeout=300,
                         env=_env())
    assert res.returncode == 0, res.stderr[-3000:]
    return res


def test_amp_and_dropout_on_cuda_resume_bit_identical(tmp_path: Path):
    _amp(tmp_path, "ref-ck", "ref.pt")
    stopped = _amp(tmp_path, "ck", "final.pt", 17)
    assert "stopped at 17" in stopped.stdout and not (tmp_path / "final.pt").exists()
    found = CheckpointManager(tmp_path / "ck").load_latest()
    assert found is not None and "cuda" in found[1]["rng"], "no CUDA RNG state in the checkpoint"
    assert found[1]["scaler"]["_growth_tracker"] > 0 or found[1]["scaler"]["scale"] < 2.0 ** 24
    resumed = _amp(tmp_path, "ck", "final.pt")
    assert "resumed at 17" in resumed.stdout and "finished 40" in resumed.stdout

    ref, final = torch.load(tmp_path / "ref.pt"), torch.load(tmp_path / "final.pt")
    assert final["scaler"] == ref["scaler"]
    assert torch.equal(final["rng"], ref["rng"]), "the CUDA RNG stream did not continue exactly"
    for name, tensor in ref["model"].items():
        assert torch.equal(final["model"][name], tensor), f"{name} differs"


def _torchrun(tmp: Path, ckpt: str, out: str, *more: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
            "1", str(DDP_EXAMPLE), "--ckpt-dir", str(tmp / ckpt), "--out", str(tmp / out),
            "--device", "cuda", "--sleep", "0.02", *more]


def test_ddp_over_nccl_stops_and_resumes_bit_identical(tmp_path: Path):
    ref = subprocess.run(_torchrun(tmp_path, "ref-ck", "ref.pt"), capture_output=True,
                         text=True, timeout=300, env=_env())
    assert ref.returncode == 0, ref.stderr[-3000:]
    pids = tmp_path / "pids"
    rc, output = signal_rank_once_running(
        _torchrun(tmp_path, "ck", "final.pt", "--pid-dir", str(pids)), pids, 0, _env())
    assert rc == 0 and "stopping at step" in output, output[-3000:]
    found = CheckpointManager(tmp_path / "ck").load_latest()
    assert found is not None and 0 < found[1]["step"] < 160
    assert "cuda" in found[1]["rng"], "no CUDA RNG state in the checkpoint"

    again = subprocess.run(_torchrun(tmp_path, "ck", "final.pt"), capture_output=True,
                           text=True, timeout=300, env=_env())
    assert again.returncode == 0 and "finished step 160" in again.stdout, again.stderr[-3000:]
    ref_w, final_w = torch.load(tmp_path / "ref.pt"), torch.load(tmp_path / "final.pt")
    for name, tensor in ref_w.items():
        assert torch.equal(final_w[name].cpu(), tensor.cpu()), f"{name} differs"


NCCL_COLLECTIVES = r"""
import sys, torch, torch.distributed as dist
import shockslurm.train._env as env
from shockslurm.train import Lease, Reporter, ShockTrainer
dist.init_process_group("nccl", init_method="tcp://127.0.0.1:" + sys.argv[2], rank=0,
                        world_size=1)
torch.cuda.set_device(0)
env.distributed = lambda: True      # one GPU: run the multi-rank code paths in a 1-rank group
model = torch.nn.Linear(8, 8).cuda()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
st = ShockTrainer(model, opt, ckpt_dir=sys.argv[1], every_steps=None, every_seconds=None,
                  reporter=Reporter(None), lease=Lease(stop_file=False))
st.start()
model(torch.randn(4, 8, device="cuda")).sum().backward()
opt.step()
st.request_stop("test")
print("stopped", st.step(), flush=True)
st.close()
dist.destroy_process_group()
"""


def test_helper_collectives_over_nccl(tmp_path: Path):
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    res = subprocess.run([sys.executable, "-c", NCCL_COLLECTIVES, str(tmp_path / "ck"),
                          str(port)], capture_output=True, text=True, timeout=120, env=_env(),
                         cwd=HERE.parent)
    assert res.returncode == 0 and "stopped True" in res.stdout, res.stderr[-3000:]
    found = CheckpointManager(tmp_path / "ck").load_latest()
    assert found is not None and found[1]["step"] == 1
    ranks = found[1]["rng_ranks"]
    assert len(ranks) == 1 and "cuda" in ranks[0], "the RNG states were not gathered over NCCL"


def test_restart_benchmark_on_cuda():
    res = subprocess.run([sys.executable, "-m", "shockslurm.train.restart_bench", "--device",
                          "cuda", "--repeats", "1"], capture_output=True, text=True, timeout=300,
                         env=job_env(), cwd=HERE.parent)
    assert res.returncode == 0, res.stderr[-3000:]
    median = json.loads(res.stdout)["median"]
    assert median["device_s"] > 0 and median["load_s"] > 0 and median["checkpoint_bytes"] > 0
    assert median["switch_s"] >= median["stop_s"] + median["start_s"]

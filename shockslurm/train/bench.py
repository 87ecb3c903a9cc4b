"""`python -m shockslurm.train.bench`: the helper's per-step overhead on a small MLP (CPU or GPU).

Prints JSON: the median step time of a plain loop and of the same loop inside `ShockTrainer`
(lease polled every step, reports to a spool directory, checkpoints at the default cadence of
every 600 s, i.e. none during the measurement), the overhead in percent (target < 2 %), and
separately what one checkpoint costs (serialise + write + fsync + rename).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ._args import positive_int
from .checkpoint import CheckpointManager
from .lease import Lease
from .reports import Reporter, SpoolSink
from .state import capture
from .trainer import ShockTrainer


def _data(n: int, seed: int = 1234) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 28 * 28, generator=gen)
    y = (x @ torch.randn(28 * 28, 10, generator=gen)).argmax(dim=1)
    return x, y


def _model(hidden: int) -> nn.Module:
    return nn.Sequential(nn.Linear(28 * 28, hidden), nn.ReLU(), nn.Dropout(0.1),
                         nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, 10))


def _sync(x: torch.Tensor) -> None:
    """Wait for the device's queued work (timings on a GPU count what ran, not what was queued)."""
    if x.is_cuda:
        torch.cuda.synchronize(x.device)


def _plain(x, y, model, opt, batch_size: int, steps: int, seed: int) -> float:
    gen = torch.Generator().manual_seed(seed)
    order = torch.randperm(len(x), generator=gen)
    n_batches = len(x) // batch_size
    t0 = time.perf_counter()
    for k in range(steps):
        i = k % n_batches
        idx = order[i * batch_size:(i + 1) * batch_size]
        xb, yb = x[idx], y[idx]
        opt.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(model(xb), yb).backward()
        opt.step()
    _sync(x)
    return (time.perf_counter() - t0) / steps


def _helped(x, y, model, opt, batch_size: int, steps: int, seed: int, tmp: Path) -> float:
    rep = Reporter(SpoolSink(tmp / "spool"), job_id=0, min_interval_s=10.0)
    lease = Lease(stop_file=tmp / "stop", file_poll_s=1.0)
    st = ShockTrainer(model, opt, ckpt_dir=tmp / f"ck-{seed}", seed=seed, resume=False,
                      reporter=rep, lease=lease)
    epochs = -(-steps // (len(x) // batch_size)) + 1
    with st:
        t0 = time.perf_counter()
        for _, _, batches in st.epochs((x, y), batch_size, epochs):
            for _, (xb, yb) in batches:
                opt.zero_grad(set_to_none=True)
                nn.functional.cross_entropy(model(xb), yb).backward()
                opt.step()
                st.step()
                if st.global_step >= steps:
                    _sync(x)
                    return (time.perf_counter() - t0) / steps
    raise AssertionError("not enough batches")  # pragma: no cover


def run(*, hidden: int = 512, batch_size: int = 128, steps: int = 300, repeats: int = 15,
        threads: int = 1, device: str = "cpu") -> dict[str, Any]:
    torch.set_num_threads(threads)
    where = torch.device(device)
    x, y = (t.to(where) for t in _data(batch_size * 64))
    plain: list[float] = []
    helped: list[float] = []
    with tempfile.TemporaryDirectory(prefix="shockslurm-bench-") as d:
        tmp = Path(d)
        for r in range(repeats + 1):          # round 0 warms up and is discarded
            for which in ("plain", "helped") if r % 2 else ("helped", "plain"):
                torch.manual_seed(r)
                model = _model(hidden).to(where)
                opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
                t = (_plain(x, y, model, opt, batch_size, steps, r) if which == "plain"
                     else _helped(x, y, model, opt, batch_size, steps, r, tmp))
                if r:
                    (plain if which == "plain" else helped).append(t)
        mgr = CheckpointManager(tmp / "ck-cost", is_writer=True)
        saves = []
        for i in range(5):
            t0 = time.perf_counter()
            mgr.save(capture(model, opt, step=i), i)
            saves.append(time.perf_counter() - t0)
        ckpt_bytes = mgr.path_for(4).stat().st_size
    p, h = statistics.median(plain), statistics.median(helped)
    # This machine's step time drifts by several percent between runs of the same loop, so the
    # overhead is the median of paired ratios: each helped run against the plain run next to it.
    overhead = statistics.median(hh / pp for hh, pp in zip(helped, plain)) - 1.0
    return {
        "model": f"MLP 784-{hidden}-{hidden}-10", "batch_size": batch_size, "steps": steps,
        "repeats": repeats, "threads": threads, "device": str(where), "torch": torch.__version__,
        "step_ms_plain": round(p * 1e3, 4), "step_ms_helper": round(h * 1e3, 4),
        "overhead_pct": round(overhead * 100.0, 3), "target_pct": 2.0,
        "checkpoint_ms": round(statistics.median(saves) * 1e3, 3),
        "checkpoint_bytes": ckpt_bytes,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m shockslurm.train.bench", description=__doc__)
    ap.add_argument("--hidden", type=positive_int, default=512)
    ap.add_argument("--batch-size", type=positive_int, default=128)
    ap.add_argument("--steps", type=positive_int, default=300)
    ap.add_argument("--repeats", type=positive_int, default=15)
    ap.add_argument("--threads", type=positive_int, default=1)
    ap.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, ...")
    args = ap.parse_args(argv)
    result = run(hidden=args.hidden, batch_size=args.batch_size, steps=args.steps,
                 repeats=args.repeats, threads=args.threads, device=args.device)
    json.dump(result, sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())

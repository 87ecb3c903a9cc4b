"""`python -m shockslurm.train.restart_bench`: what a stop and a resume cost a training job.

The job's side of a switch, measured with real processes: a fresh interpreter trains a model
through `ShockTrainer` (AdamW; synthetic batches already on the device, so no data loading is
counted), gets SIGUSR1 once warm, finishes its step, checkpoints and exits; then a fresh
interpreter resumes from that checkpoint. Per repeat it records

- `stop_s`: SIGUSR1 sent -> the process has exited (the step in flight, the checkpoint's
  serialisation, its sha256 sidecar, fsync and rename, interpreter exit);
- `start_s`: the resuming process spawned -> its first training step done, and its parts
  (`import_s` Python and torch, `device_s` the device's context, `build_s` model and optimizer,
  `load_s` the checkpoint read and restored, `first_step_s`);
- `warmup_s`: what the first steps after the resume took beyond the steady step time.

`switch_s` = stop + start + warm-up is the job's share of a switch; Slurm's own requeue and
start latency comes on top (the live benchmark measures that). Prints JSON (medians over the
repeats and every repeat).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from ._args import positive_int, writable_dir

MODELS = ("mlp", "resnet50", "transformer")
WARM_STEPS = 5            # steps before the stop signal; the first steps after a resume
STEADY_STEPS = 10         # steps after the warm-up that give the steady step time


def _mark(marks: dict[str, float], name: str) -> None:
    marks[name] = time.time()


def _build(name: str, torch: Any, device: Any, batch: int) -> tuple[Any, tuple[Any, Any]]:
    """The model and one synthetic batch (inputs, targets), both on `device`."""
    nn = torch.nn
    gen = torch.Generator().manual_seed(0)
    if name == "mlp":
        model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 10))
        x, y = torch.randn(batch, 256, generator=gen), torch.randint(0, 10, (batch,), generator=gen)
    elif name == "resnet50":
        from torchvision.models import resnet50   # type: ignore[import-not-found,unused-ignore]
        model = resnet50()
        x = torch.randn(batch, 3, 224, 224, generator=gen)
        y = torch.randint(0, 1000, (batch,), generator=gen)
    else:   # a 24-layer, 1024-wide encoder (about 335M parameters with its embedding)
        vocab, width = 32768, 1024
        layer = nn.TransformerEncoderLayer(width, 16, 4 * width, batch_first=True,
                                           norm_first=True)
        model = nn.Sequential(nn.Embedding(vocab, width), nn.TransformerEncoder(layer, 24),
                              nn.Linear(width, vocab))
        x = torch.randint(0, vocab, (batch, 512), generator=gen)
        y = torch.randint(0, vocab, (batch, 512), generator=gen)
    return model.to(device), (x.to(device), y.to(device))


def _child(args: argparse.Namespace, max_steps: int) -> int:
    """One life of the job: resume if a checkpoint is there, train until stopped or done."""
    marks: dict[str, float] = {}
    import shockslurm.train  # noqa: F401  first, as a job does
    import torch
    _mark(marks, "imported")
    device = torch.device(args.device)
    if device.type == "cuda":
        torch.cuda.init()
        torch.zeros(1, device=device)
    _mark(marks, "device")
    from .lease import Lease
    from .reports import Reporter
    from .trainer import ShockTrainer
    torch.manual_seed(0)
    model, (x, y) = _build(args.model, torch, device, args.batch_size)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    _mark(marks, "built")
    st = ShockTrainer(model, opt, ckpt_dir=args.ckpt_dir, every_steps=None, every_seconds=None,
                      reporter=Reporter(None), lease=Lease(stop_file=False))
    st.start()
    _mark(marks, "loaded")
    loss_fn = torch.nn.functional.cross_entropy
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")
    steps: list[float] = []
    for k in range(max_steps):
        t0 = time.time()
        opt.zero_grad(set_to_none=True)
        with autocast:
            out = model(x)
        loss_fn(out.float().flatten(0, -2), y.flatten()).backward()
        opt.step()
        if device.type == "cuda":
            torch.cuda.synchronize()
        steps.append(time.time() - t0)
        if k == 0:
            _mark(marks, "first_step")
        if k + 1 == WARM_STEPS:
            print(json.dumps({"event": "warm"}), flush=True)
        if st.step():
            break
    print(json.dumps({"event": "done", "marks": marks, "steps": steps,
                      "resumed_step": int(st.global_step - len(steps))}), flush=True)
    if st.stopped:
        st.save_and_exit()
    return 0


def _spawn(args: argparse.Namespace, ckpt: Path) -> tuple[subprocess.Popen[str], float]:
    cmd = [sys.executable, "-m", "shockslurm.train.restart_bench", "--child", "--model",
           args.model, "--device", args.device, "--batch-size", str(args.batch_size),
           "--ckpt-dir", str(ckpt)]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SHOCKSLURM_"))}
    t0 = time.time()
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env), t0


def _events(proc: subprocess.Popen[str]) -> Any:
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("{"):
            yield json.loads(line)


def _one(args: argparse.Namespace, ckpt: Path) -> dict[str, float]:
    """Train, stop once warm, resume until steady; the repeat's figures."""
    first, _ = _spawn(args, ckpt)
    for event in _events(first):
        if event["event"] == "warm":
            sent = time.time()
            first.send_signal(signal.SIGUSR1)
            break
    else:
        raise RuntimeError(f"the first run ended before it was warm (exit {first.wait()})")
    first.wait()
    stopped = time.time()
    if first.returncode != 0:
        raise RuntimeError(f"the stopped run exited {first.returncode}")
    size = sum(p.stat().st_size for p in ckpt.glob("ckpt-*.pt"))
    second, spawned = _spawn(args, ckpt)
    done = [e for e in _events(second) if e["event"] == "done"]
    if second.wait() != 0 or not done or done[0]["resumed_step"] == 0:
        raise RuntimeError("the resumed run failed or did not resume")
    marks, steps = done[0]["marks"], done[0]["steps"]
    steady = statistics.median(steps[WARM_STEPS:]) if len(steps) > WARM_STEPS else steps[-1]
    warmup = sum(max(0.0, s - steady) for s in steps[1:WARM_STEPS])
    start = marks["first_step"] - spawned
    return {"stop_s": stopped - sent, "start_s": start,
            "import_s": marks["imported"] - spawned, "device_s": marks["device"] - marks["imported"],
            "build_s": marks["built"] - marks["device"], "load_s": marks["loaded"] - marks["built"],
            "first_step_s": marks["first_step"] - marks["loaded"], "warmup_s": warmup,
            "step_s": steady, "switch_s": stopped - sent + start + warmup,
            "checkpoint_bytes": float(size)}


def run(args: argparse.Namespace) -> dict[str, Any]:
    repeats = []
    for r in range(args.repeats):
        with tempfile.TemporaryDirectory(prefix="shockslurm-restart-", dir=args.tmp_dir) as d:
            repeats.append(_one(args, Path(d) / "ckpt"))
        print(f"repeat {r + 1}/{args.repeats}: switch {repeats[-1]['switch_s']:.2f} s",
              file=sys.stderr, flush=True)
    medians = {k: round(statistics.median(r[k] for r in repeats), 4) for k in repeats[0]}
    return {"model": args.model, "device": args.device, "batch_size": args.batch_size,
            "repeats": args.repeats, "checkpoint_dir": args.tmp_dir or tempfile.gettempdir(),
            "median": medians, "runs": repeats}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m shockslurm.train.restart_bench",
                                 description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--model", choices=MODELS, default="mlp")
    ap.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, ...")
    ap.add_argument("--batch-size", type=positive_int, default=32)
    ap.add_argument("--repeats", type=positive_int, default=3)
    ap.add_argument("--tmp-dir", type=writable_dir,
                    help="where the checkpoints go (default: the system's temp)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--ckpt-dir", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        return _child(args, WARM_STEPS + STEADY_STEPS if _resuming(args.ckpt_dir) else 10**6)
    json.dump(run(args), sys.stdout, indent=2)
    print()
    return 0


def _resuming(ckpt_dir: str) -> bool:
    return any(Path(ckpt_dir).glob("ckpt-*.pt"))


if __name__ == "__main__":
    sys.exit(main())

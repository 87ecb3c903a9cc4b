#!/usr/bin/env python3
"""A small MNIST-like classifier trained with the shockslurm helper (no downloads).

The data is synthetic and deterministic: 28x28 "images" drawn from a seeded generator, labelled
by a fixed random teacher network. The batch size adapts between epochs (32, 32, 64, then 128),
the learning rate follows a per-epoch StepLR, and the loop draws from Python's `random` and
torch's global RNG (noise augmentation, dropout), so an exact resume has to restore all of them.

    python examples/train_mnist_like.py --ckpt-dir /tmp/ck --steps 200 --out final.pt

Send SIGUSR1 (or SIGTERM, or create $SHOCKSLURM_STOP_FILE) and it checkpoints and exits 0; run the
same command again and it resumes where it stopped. Under shocksub/Slurm the job script forwards
the signals and Slurm requeues the job.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout
import shockslurm.train  # noqa: E402,F401  first: a stop signal while torch loads is kept

import torch  # noqa: E402
from torch import nn  # noqa: E402

from shockslurm.train import ShockTrainer  # noqa: E402

SCHEDULE = [32, 32, 64, 128]   # epochs past the end keep 128


def make_data(n: int = 2048, seed: int = 1234) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 1, 28, 28, generator=gen)
    teacher = torch.randn(28 * 28, 10, generator=gen)
    y = (x.flatten(1) @ teacher).argmax(dim=1)
    return x, y


def make_model(hidden: int = 128) -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(28 * 28, hidden), nn.ReLU(), nn.Dropout(0.1),
                         nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, 10))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ckpt-dir", required=True)
    ap.add_argument("--steps", type=int, default=None, help="stop after this many steps in all")
    ap.add_argument("--epochs", type=int, default=8)
    ap.add_argument("--samples", type=int, default=2048)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--every-steps", type=int, default=50)
    ap.add_argument("--out", help="write the final state_dict here")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--sleep", type=float, default=0.0, help="extra seconds per step (tests)")
    ap.add_argument("--report-interval", type=float, default=10.0,
                    help="seconds between throughput reports ($SHOCKSLURM_SPOOL / _DB)")
    ap.add_argument("--quiet", action="store_true")
    args = ap.parse_args(argv)

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    random.seed(args.seed)
    x, y = make_data(args.samples)
    model = make_model(args.hidden)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    loss_fn = nn.CrossEntropyLoss()

    with ShockTrainer(model, opt, scheduler=sched, ckpt_dir=args.ckpt_dir,
                      every_steps=args.every_steps, seed=args.seed,
                      report_interval_s=args.report_interval) as st:
        if st.resumed_from and not args.quiet:
            print(f"resumed {st.resumed_from} step {st.global_step}", flush=True)
        done = False
        for epoch, batch_size, batches in st.epochs((x, y), SCHEDULE, args.epochs):
            for _, (xb, yb) in batches:
                if random.random() < 0.5:                       # python RNG
                    xb = xb + 0.1 * torch.randn_like(xb)        # torch RNG
                opt.zero_grad(set_to_none=True)
                loss = loss_fn(model(xb), yb)                   # dropout: torch RNG
                loss.backward()
                opt.step()
                if args.sleep:
                    time.sleep(args.sleep)
                stop = st.step()            # True: a stop was asked, this step is checkpointed
                if not args.quiet:
                    print(f"step {st.global_step} epoch {epoch} bs {batch_size} "
                          f"loss {loss.item():.4f}", flush=True)
                if stop:
                    st.save_and_exit()      # exit 0: Slurm requeues, the rerun resumes
                if args.steps is not None and st.global_step >= args.steps:
                    done = True
                    break
            if done:
                break
            sched.step()
        if args.out:
            torch.save(model.state_dict(), args.out)
        if not args.quiet:
            print(f"finished step {st.global_step}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

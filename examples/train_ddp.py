#!/usr/bin/env python3
"""The MNIST-like example data-parallel: DistributedDataParallel under torchrun (or srun).

Each rank reads only its own shard through its own DataLoader (`--workers` worker processes,
pinned memory on GPUs) with the helper's resumable sampler; the global batch size follows
SCHEDULE (per rank: its share), one DataLoader per size. The ranks are seeded apart (their noise
and dropout differ), so an exact resume needs every rank's RNG states, which the helper gathers
into rank 0's checkpoint. Only rank 0 writes checkpoints and reports; a stop (SIGUSR1/SIGTERM to
any rank, or the stop file) is agreed by all ranks at the same step. Uses NCCL on GPUs, gloo on
CPUs.

    torchrun --standalone --nproc-per-node 2 examples/train_ddp.py --ckpt-dir /tmp/ck --out w.pt
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout
sys.path.insert(0, str(Path(__file__).resolve().parent))
import shockslurm.train  # noqa: E402,F401  first: a stop signal while torch loads is kept

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn.parallel import DistributedDataParallel  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

from shockslurm.train import ShockTrainer  # noqa: E402
from train_mnist_like import SCHEDULE, make_data, make_model  # noqa: E402


class ShardLog(TensorDataset):
    """The dataset, writing every index it loads to a per-rank file (tests: each rank reads only
    its own shard; a DataLoader worker appends from its own process)."""

    def __init__(self, path: Path, *tensors: torch.Tensor) -> None:
        super().__init__(*tensors)
        self.path = path
        self.epoch = 0          # set before each epoch: its workers are forked with it

    def __getitem__(self, index: int):  # type: ignore[no-untyped-def]
        with open(self.path, "a", encoding="ascii") as fh:
            fh.write(f"{self.epoch} {index}\n")
        return super().__getitem__(index)


def _shutdown() -> None:
    """All ranks leave together, then tear the group down: a rank that destroys its group while
    another still uses its connections can abort inside gloo at exit."""
    dist.barrier()
    dist.destroy_process_group()


def train(args: argparse.Namespace, ddp: nn.Module, model: nn.Module,
          opt: torch.optim.Optimizer, rank: int, world: int, device: torch.device) -> None:
    dataset = (ShardLog(Path(args.shard_log, f"rank{rank}.idx"), *make_data()) if args.shard_log
               else TensorDataset(*make_data()))
    loss_fn = nn.CrossEntropyLoss()
    with ShockTrainer(ddp, opt, ckpt_dir=args.ckpt_dir, every_steps=None,
                      every_seconds=args.every_seconds, seed=args.seed) as st:
        sampler = st.sampler(dataset)          # this rank's shard, resumable mid-epoch
        loaders = {size: DataLoader(dataset, batch_size=size // world, sampler=sampler,
                                    num_workers=args.workers, pin_memory=device.type == "cuda")
                   for size in set(SCHEDULE)}
        if args.pid_dir:      # signal handlers are installed from here on
            Path(args.pid_dir, f"rank{rank}.pid").write_text(str(os.getpid()))
        if st.resumed_from:
            print(f"rank {rank} resumed {st.resumed_from.name} step {st.global_step}",
                  flush=True)
        for epoch in st.epoch_range(args.epochs):
            size = SCHEDULE[min(epoch, len(SCHEDULE) - 1)]
            if isinstance(dataset, ShardLog):
                dataset.epoch = epoch
            for _, (xb, yb) in st.batches(loaders[size]):
                xb, yb = xb.to(device, non_blocking=True), yb.to(device, non_blocking=True)
                if random.random() < 0.5:
                    xb = xb + 0.1 * torch.randn_like(xb)
                opt.zero_grad(set_to_none=True)
                loss_fn(ddp(xb), yb).backward()
                opt.step()
                if args.sleep:
                    time.sleep(args.sleep)
                if st.step():     # every rank stops at this step; rank 0 checkpointed it
                    break
            if st.should_stop:
                break
        if st.should_stop:
            return                # main() leaves the process group, then exits 0
        if rank == 0 and args.out:
            torch.save(model.state_dict(), args.out)
        print(f"rank {rank} finished step {st.global_step}", flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ckpt-dir", required=True)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workers", type=int, default=2, help="DataLoader worker processes per rank")
    ap.add_argument("--every-seconds", type=float, default=600.0)
    ap.add_argument("--out", help="rank 0 writes the final state_dict here")
    ap.add_argument("--sleep", type=float, default=0.0, help="extra seconds per step (tests)")
    ap.add_argument("--pid-dir", help="each rank writes its pid here (tests signal one rank)")
    ap.add_argument("--shard-log", help="each rank logs the sample indices it loads here (tests)")
    ap.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                    help="auto: a GPU per rank (NCCL) when CUDA is there, else CPU (gloo)")
    args = ap.parse_args(argv)

    gpu = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    dist.init_process_group("nccl" if gpu else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if gpu:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    device = torch.device("cuda") if gpu else torch.device("cpu")
    torch.set_num_threads(1)
    torch.manual_seed(0)                       # the same initial weights on every rank
    model = make_model().to(device)
    torch.manual_seed(args.seed + 1000 * rank)  # then per-rank streams (noise, dropout)
    random.seed(args.seed + rank)
    ddp = DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    train(args, ddp, model, opt, rank, world, device)
    _shutdown()              # (after an error, no barrier: the other ranks may never reach it)
    return 0                 # also after a stop: exit 0, Slurm requeues, the rerun resumes


if __name__ == "__main__":
    sys.exit(main())

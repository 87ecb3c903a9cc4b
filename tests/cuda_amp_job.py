"""A training job for tests/test_train_cuda.py: a small conv net with batch norm and dropout on
CUDA, float16 autocast with a GradScaler, through ShockTrainer.

    python tests/cuda_amp_job.py CKPT_DIR OUT [STOP_AT]

Trains STEPS steps in all (resuming from CKPT_DIR when it holds a checkpoint); with STOP_AT it
asks for a stop after that global step and exits 0 as a stopped job does. At the end it saves
the weights and the scaler's state to OUT. The scaler starts at 2**24 and grows every 4 steps,
so the first steps overflow and are skipped, and its scale and growth tracker change around the
stop: a resume that lost them, or the CUDA RNG (dropout), would not end bit-identical.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout
import shockslurm.train  # noqa: E402,F401  first: a stop signal while torch loads is kept

import torch  # noqa: E402
from torch import nn  # noqa: E402

from shockslurm.train import Lease, Reporter, ShockTrainer  # noqa: E402

STEPS = 40


def main(ckpt_dir: str, out: str, stop_at: int | None) -> int:
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = False
    device = torch.device("cuda")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                          nn.Dropout(0.2), nn.Conv2d(16, 16, 3, padding=1), nn.ReLU(),
                          nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10)).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    scaler = torch.amp.GradScaler("cuda", init_scale=2.0 ** 24, growth_interval=4)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(256, 3, 16, 16, generator=gen)
    y = torch.randint(0, 10, (256,), generator=gen)
    st = ShockTrainer(model, opt, scaler=scaler, ckpt_dir=ckpt_dir, every_steps=None,
                      every_seconds=None, reporter=Reporter(None), lease=Lease(stop_file=False))
    with st:
        print("resumed at", st.global_step, flush=True)
        for _, _, batches in st.epochs((x, y), 32, STEPS // 8):
            for _, (xb, yb) in batches:
                xb, yb = xb.to(device), yb.to(device)
                opt.zero_grad(set_to_none=True)
                with torch.autocast("cuda", dtype=torch.float16):
                    loss = nn.functional.cross_entropy(model(xb), yb)
                scaler.scale(loss).backward()
                scaler.step(opt)
                scaler.update()
                if stop_at is not None and st.global_step + 1 == stop_at:
                    st.request_stop("test")
                if st.step():
                    print("stopped at", st.global_step, flush=True)
                    st.save_and_exit()
    torch.save({"model": model.state_dict(), "scaler": scaler.state_dict(),
                "rng": torch.cuda.get_rng_state()}, out)
    print("finished", st.global_step, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else None))

"""The built-in model catalogue: datasets, batch-size ladders and our own throughput model.

The reference trace names models only ("ResNet-18 (batch size 32)"); the dataset and its size
come from this table. The synthetic generator also draws its jobs from it, with throughput
figures of our own (a saturating samples/s curve per model and a per-doubling scaling loss for
multi-GPU gangs), so the default workload needs no external data.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class ModelInfo:
    model: str
    dataset: str
    samples_per_epoch: int
    ladder: tuple[int, ...]        # batch sizes the model trains with, ascending
    peak_samples_per_s: float      # samples/s on one GPU at a very large batch
    half_batch: float              # batch size at which half the peak is reached
    epochs: tuple[int, int]        # range of epochs the generator draws from

    def iterations_per_s(self, batch_size: int, gpus: int) -> float:
        """Our throughput model: iterations/s of the whole gang at `batch_size` per gang."""
        samples = self.peak_samples_per_s * batch_size / (batch_size + self.half_batch)
        scaling = gpus * (0.92 ** math.log2(gpus)) if gpus > 1 else 1.0
        return samples * scaling / batch_size


CATALOGUE: dict[str, ModelInfo] = {
    m.model: m
    for m in (
        ModelInfo("ResNet-18", "CIFAR-10", 50_000, (16, 32, 64, 128, 256), 5200.0, 48.0, (20, 120)),
        ModelInfo("ResNet-50", "ImageNet", 100_000, (16, 32, 64, 128), 390.0, 20.0, (10, 40)),
        ModelInfo("Transformer", "Multi30k", 10_000, (16, 32, 64, 128, 256), 1400.0, 40.0, (20, 80)),
        ModelInfo("LM", "Wikitext-2", 59_675, (5, 10, 20, 40, 80), 3400.0, 30.0, (10, 80)),
        ModelInfo("Recommendation", "ML-20M", 117_907, (512, 1024, 2048, 4096, 8192),
                  260_000.0, 1500.0, (50, 400)),
    )
}


def model_info(model: str) -> ModelInfo:
    try:
        return CATALOGUE[model]
    except KeyError:
        known = ", ".join(sorted(CATALOGUE))
        raise KeyError(f"unknown model '{model}' (known: {known})") from None

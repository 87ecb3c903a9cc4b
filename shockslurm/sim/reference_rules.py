"""The reference simulator's own batch-size rules ("reference" adaptation mode).

The Shockwave reference simulator does not replay a job's per-epoch profile. After every round
it asks a rule whether the job *wants* a different batch size, raises a flag, and applies the
flag when the job's next run ends (a one-run lag). These rules differ from the profile (SHOCKWAVE.md
explains how). To compare our baselines with the reference's published numbers we can run the
same rules; the `profile` mode (the job follows its declared per-epoch schedule) is the default
for everything else. The facts below are the reference's behaviour, written down as data.

Epoch counts in these rules use ceil (a started epoch counts), as the reference does.
"""

from __future__ import annotations

import math
from typing import Mapping

# Largest / smallest batch size the rules move between, per model.
MAX_BS = {"ResNet-18": 256, "ResNet-50": 128, "Transformer": 128, "LM": 80, "Recommendation": 8192}
MIN_BS = {"ResNet-18": 16, "ResNet-50": 16, "Transformer": 16, "LM": 5, "Recommendation": 512}
# A job that starts at this size never changes (the reference rejects the change).
FROZEN_BS = {"LM": 80, "ResNet-18": 256, "ResNet-50": 128, "Recommendation": 8192}

# GNS doubling pattern: (model, initial bs, gang) -> [(first epoch, multiplier), ...]; each
# multiplier holds until the next entry's first epoch. Combinations not listed never change.
GNS_STEPS: Mapping[tuple[str, int, int], tuple[tuple[int, int], ...]] = {
    ("ResNet-18", 16, 1): ((31, 2), (41, 4), (51, 8), (71, 16)),
    ("ResNet-18", 32, 1): ((21, 2), (31, 4), (51, 8)),
    ("ResNet-18", 64, 1): ((11, 2), (31, 4)),
    ("ResNet-18", 128, 1): ((11, 2),),
    ("ResNet-18", 16, 2): ((21, 2), (31, 4), (91, 8), (111, 16)),
    ("ResNet-18", 32, 2): ((11, 2), (21, 4), (41, 8)),
    ("ResNet-18", 64, 2): ((21, 2), (41, 4)),
    ("ResNet-18", 128, 2): ((41, 2),),
    ("ResNet-18", 16, 4): ((11, 2), (21, 4), (81, 8), (91, 16)),
    ("ResNet-18", 32, 4): ((21, 2), (31, 4), (61, 8)),
    ("ResNet-18", 64, 4): ((11, 2), (61, 4)),
    ("ResNet-18", 128, 4): ((11, 2),),
    ("ResNet-50", 64, 1): ((101, 2),),
    ("ResNet-50", 32, 2): ((101, 2), (111, 4)),
    ("ResNet-50", 64, 2): ((81, 2),),
    ("ResNet-50", 32, 4): ((131, 2), (221, 4)),
    ("ResNet-50", 64, 4): ((191, 2),),
    ("LM", 5, 1): ((31, 2), (41, 4), (61, 8), (71, 16)),
    ("LM", 10, 1): ((11, 2), (21, 4), (41, 8)),
    ("LM", 20, 1): ((11, 2), (41, 4)),
    ("LM", 40, 1): ((11, 2),),
    ("LM", 5, 2): ((31, 2), (51, 4), (61, 8), (71, 16)),
    ("LM", 10, 2): ((11, 2), (31, 4), (41, 8)),
    ("LM", 20, 2): ((31, 2), (41, 4)),
    ("LM", 40, 2): ((11, 2),),
    ("LM", 5, 4): ((11, 2), (31, 4), (71, 8), (91, 16)),
    ("LM", 10, 4): ((11, 2), (31, 4), (61, 8)),
    ("LM", 20, 4): ((11, 2), (61, 4)),
    ("LM", 40, 4): ((61, 2),),
    ("Recommendation", 512, 1): ((21, 2), (41, 4), (71, 8), (91, 16)),
    ("Recommendation", 1024, 1): ((21, 2), (51, 4), (91, 8)),
    ("Recommendation", 2048, 1): ((21, 2), (41, 4)),
    ("Recommendation", 4096, 1): ((41, 2),),
}


def gns_pattern_bs(model: str, bs0: int, gang: int, epoch: int) -> int:
    """Batch size the GNS pattern prescribes at `epoch` (capped at the model's maximum)."""
    mult = 1
    for first, m in GNS_STEPS.get((model, bs0, gang), ()):
        if epoch >= first:
            mult = m
    if model not in MAX_BS:
        return bs0 * mult
    return min(bs0 * mult, MAX_BS[model])


def accordion_critical(model: str, bs0: int, epoch: int) -> bool | None:
    """Whether `epoch` is in a critical regime (small batch); None: the model never adapts."""
    if model == "Transformer":
        return None
    if model == "LM":
        return epoch < 10
    if model == "Recommendation":
        limit = {512: 30, 1024: 30, 2048: 40, 4096: 10, 8192: 10}.get(bs0, 10)
        return epoch < limit
    if model == "ResNet-50":
        return (epoch % 30) < 10
    if model == "ResNet-18":
        head = 20 if bs0 == 256 else 10
        return epoch < head or 150 <= epoch < 160 or 250 <= epoch < 260
    return None


def wanted_change(mode: str, model: str, bs0: int, gang: int, bs: int,
                  iterations_done: float, samples_per_epoch: int) -> int | None:
    """The batch size the job's rule asks for after this round, or None for no change."""
    epoch = math.ceil(iterations_done / math.ceil(samples_per_epoch / bs))
    top = MAX_BS.get(model, bs)
    if mode == "accordion":
        critical = accordion_critical(model, bs0, epoch)
        if critical is None:
            return None
        if bs == bs0 and not critical and bs != top:
            return top
        if bs != bs0 and critical and bs != MIN_BS.get(model, bs):
            return bs0
        return None
    if mode == "gns":
        ahead = max(gns_pattern_bs(model, bs0, gang, epoch), gns_pattern_bs(model, bs0, gang, epoch + 1))
        if ahead > bs and bs != top:
            return 2 * bs
        return None
    return None


def change_allowed(model: str, bs0: int) -> bool:
    return FROZEN_BS.get(model) != bs0

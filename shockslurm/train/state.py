"""What a checkpoint holds besides the files' format (`checkpoint`): the dict `capture` builds
from a model, its optimizer, scheduler and GradScaler, every RNG stream and the data position,
and `restore`, which puts it back (the keys are listed in `checkpoint`'s docstring)."""

from __future__ import annotations

import logging
import random
from typing import Any, Callable, Mapping, Sequence, Union, cast

import numpy as np
import torch

from .checkpoint import FORMAT_VERSION, FORMATS_READ, CheckpointMismatch, CorruptCheckpoint

log = logging.getLogger("shockslurm.train")

# What `optimizer` may be: one, or several (a GAN's generator and discriminator optimizers),
# each saved and restored as its own (`states_of`, `_load_into`)
Optimizers = Union[torch.optim.Optimizer, Sequence[torch.optim.Optimizer],
                   Mapping[str, torch.optim.Optimizer]]


def _numpy_rng_state() -> dict[str, Any]:
    """numpy's global RNG state as a tensor and numbers (weights_only cannot load an ndarray)."""
    name, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
    return {"bit_generator": str(name), "keys": torch.from_numpy(np.asarray(keys).astype(np.int64)),
            "pos": int(pos), "has_gauss": int(has_gauss), "cached_gaussian": float(cached)}


def _set_numpy_rng_state(state: Any) -> None:
    if isinstance(state, dict):
        np.random.set_state((state["bit_generator"], state["keys"].numpy().astype(np.uint32),
                             state["pos"], state["has_gauss"], state["cached_gaussian"]))
    else:                                   # format 1: numpy's own tuple
        np.random.set_state(state)


def rng_state() -> dict[str, Any]:
    """Every RNG stream a training loop commonly touches."""
    state: dict[str, Any] = {"python": random.getstate(), "numpy": _numpy_rng_state(),
                             "torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    python = state["python"]   # a tuple when pickled, a list after some round trips
    random.setstate((python[0], tuple(python[1]), python[2]))
    _set_numpy_rng_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    cuda = state.get("cuda")
    if cuda is not None and torch.cuda.is_available():
        if len(cuda) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(cuda)
        else:
            log.warning("shockslurm.train: checkpoint has CUDA RNG states for %d devices, this "
                        "process sees %d; CUDA RNG not restored", len(cuda),
                        torch.cuda.device_count())


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The model inside DistributedDataParallel / DataParallel / torch.compile wrappers, whose
    state_dict keys carry no `module.` / `_orig_mod.` prefix."""
    while True:
        if isinstance(model, (torch.nn.parallel.DistributedDataParallel, torch.nn.DataParallel)):
            model = cast(torch.nn.Module, model.module)
        elif type(model).__name__ == "OptimizedModule" and hasattr(model, "_orig_mod"):
            model = cast(torch.nn.Module, model._orig_mod)
        else:
            return model


def _model_state(state: dict[str, Any], model: torch.nn.Module) -> dict[str, Any]:
    """The checkpoint's model state for the unwrapped `model`: a format 1 checkpoint of a DDP
    model has `module.`-prefixed keys, stripped here."""
    saved = state["model"]
    prefix = "module."
    if saved and all(k.startswith(prefix) for k in saved) and not any(
            k.startswith(prefix) for k in model.state_dict()):
        return type(saved)((k[len(prefix):], v) for k, v in saved.items())
    return saved


def capture(model: torch.nn.Module, optimizer: Optimizers | None = None, *,
            scheduler: Any = None, scaler: Any = None, data: dict[str, Any] | None = None,
            batch_size: int | None = None, step: int = 0,
            extras: dict[str, Any] | None = None) -> dict[str, Any]:
    """A checkpoint dict: model (unwrapped), optimizer, scheduler, GradScaler, RNG, data
    position, extras."""
    return {
        **loop_state(scheduler=scheduler, scaler=scaler, data=data, batch_size=batch_size,
                     step=step, extras=extras),
        "model": unwrap(model).state_dict(),
        "optimizer": states_of(optimizer),
        "optimizer_type": type_names(optimizer),
        "rng": rng_state(),
    }


def loop_state(*, scheduler: Any = None, scaler: Any = None, data: dict[str, Any] | None = None,
               batch_size: int | None = None, step: int = 0,
               extras: dict[str, Any] | None = None) -> dict[str, Any]:
    """What a checkpoint holds besides the model, the optimizer and the RNG: the scheduler,
    the GradScaler, the data position and extras (all of a sharded checkpoint's that
    `torch.distributed.checkpoint` does not write, `ShockTrainer` with an FSDP model)."""
    return {
        "format": FORMAT_VERSION,
        "step": int(step),
        "scheduler": states_of(scheduler),
        "scaler": states_of(scaler),
        "data": dict(data or {}),
        "batch_size": batch_size,
        "extras": dict(extras or {}),
    }


REQUIRED_KEYS = ("step", "model", "data")
LOOP_KEYS = ("step", "data")          # a `loop_state()` dict's (a sharded checkpoint's extras)


def check_format(state: dict[str, Any], name: str,
                 required: tuple[str, ...] = REQUIRED_KEYS) -> None:
    """Raise CorruptCheckpoint unless `state` is a `capture()` dict (or with `required`
    ("step", "data"), a `loop_state()` dict) of a format this version reads, with the keys every
    format has (a file of someone else's `torch.save` is not)."""
    if state.get("format") not in FORMATS_READ:
        raise CorruptCheckpoint(f"{name}: unknown checkpoint format {state.get('format')!r} (this "
                                f"version reads formats {', '.join(map(str, FORMATS_READ))})")
    missing = [k for k in required if k not in state]
    if missing:
        raise CorruptCheckpoint(f"{name}: not a checkpoint of this helper (no "
                                f"{', '.join(missing)})")


def each(obj: Any) -> list[Any]:
    """The objects of a part given as one (an optimizer), several (a list, tuple or dict of
    them: a GAN's two optimizers) or None (none)."""
    if obj is None:
        return []
    if isinstance(obj, Mapping):
        return [o for v in obj.values() for o in each(v)]
    if isinstance(obj, (list, tuple)):
        return [o for v in obj for o in each(v)]
    return [obj]


def _shaped(obj: Any, one: Callable[[Any], Any]) -> Any:
    """`one(obj)`, or a list or dict of those for several objects (`each`); None for None."""
    if obj is None:
        return None
    if isinstance(obj, Mapping):
        return {k: _shaped(v, one) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_shaped(v, one) for v in obj]
    return one(obj)


def states_of(obj: Any) -> Any:
    """`obj.state_dict()`, or a list or dict of those for several objects (`each`); None for
    None."""
    return _shaped(obj, lambda one: one.state_dict())


def type_names(obj: Any) -> Any:
    """The class name of `obj`, or a list or dict of those for several objects (as
    `states_of`); None for None."""
    return _shaped(obj, lambda one: type(one).__qualname__)


def _check_optimizer_type(saved: Any, optimizer: Any) -> None:
    """A `CheckpointMismatch` when the checkpoint's optimizer is of another class than this
    run's (checkpoints since 2026-12-02 name it): torch loads Adam's state into an SGD, which
    then fails at its first step inside torch (KeyError 'momentum'), and into an AdamW in
    silence, with Adam's settings."""
    if saved is None or optimizer is None:
        return
    now = type_names(optimizer)
    if saved != now:
        raise CheckpointMismatch(f"the checkpoint's optimizer is {saved}, this run's is {now}: "
                                 "an optimizer's state does not carry over to another class")


def _load_into(obj: Any, saved: Any, what: str) -> None:
    """`obj.load_state_dict(saved)` (for several objects, each its own: `states_of`); a state
    that does not fit `obj` (other keys, shapes or parameter groups: another model's; another
    number of optimizers) is a `CheckpointMismatch` saying which part. Running out of memory,
    or any other error, is not a mismatch and propagates as it is."""
    if isinstance(obj, Mapping):
        if not isinstance(saved, dict) or sorted(saved) != sorted(obj):
            raise _several_mismatch(what, saved, obj)
        for name in sorted(obj):
            _load_into(obj[name], saved[name], f"{what} {name!r}")
        return
    if isinstance(obj, (list, tuple)):
        if not isinstance(saved, list) or len(saved) != len(obj):
            raise _several_mismatch(what, saved, obj)
        for i, (one, its) in enumerate(zip(obj, saved)):
            _load_into(one, its, f"{what} {i}")
        return
    if isinstance(saved, list):
        raise _several_mismatch(what, saved, obj)
    try:
        obj.load_state_dict(saved)
    except torch.OutOfMemoryError:
        raise
    except (RuntimeError, KeyError, ValueError) as exc:
        raise CheckpointMismatch(f"the checkpoint's {what} state does not fit this run's "
                                 f"{what}: {str(exc).strip()[:500]}") from exc


def _several_mismatch(what: str, saved: Any, obj: Any) -> CheckpointMismatch:
    """A checkpoint with another number (or other names) of `what` objects than this run's."""
    named = isinstance(obj, Mapping)     # a saved dict is one state unless names are asked

    def shape(value: Any) -> str:
        if isinstance(value, (list, tuple)):
            return f"a list of {len(value)}"
        if isinstance(value, Mapping) and named:
            return "a dict of " + ", ".join(repr(k) for k in sorted(value))
        return "one"
    return CheckpointMismatch(f"the checkpoint holds {shape(saved)} {what} states, this run "
                              f"has {shape(obj)}")


def _owned(value: Any) -> Any:
    """`value` with every tensor copied: a checkpoint is loaded memory-mapped, and an optimizer
    keeps the tensors it is given that already match (Adam's moments), which would then stay
    backed by the checkpoint file (holding its disk space after rotation deletes it, or an
    `.nfs*` file). Model weights are copied into the parameters by `load_state_dict` anyway."""
    if isinstance(value, torch.Tensor):
        return value.clone()
    if isinstance(value, dict):
        return {k: _owned(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_owned(v) for v in value)
    return value


def restored_into(current: Any, saved: Any) -> Any:
    """The value of `extras` to hold after a resume: `saved` (as loaded) copied into `current`'s
    own tensors where `current` has its shape (a tensor of the same size and dtype; a dict with
    the same keys, a list or tuple of the same length, in depth), so a reference the run keeps
    (an EMA's `state_dict()`, whose tensors are the EMA's) holds the resumed values and the next
    checkpoint saves what it becomes; else a copy of `saved` (`_owned`: not the memory-mapped
    checkpoint file's). Until 2026-12-02 `saved` replaced it: an EMA kept in `extras` was saved
    as it was at the first resume by every later checkpoint."""
    if isinstance(current, torch.Tensor) and isinstance(saved, torch.Tensor):
        if current.shape != saved.shape or current.dtype != saved.dtype:
            return _owned(saved)
        with torch.no_grad():
            current.copy_(saved)
        return current
    if isinstance(current, dict) and isinstance(saved, dict) and current.keys() == saved.keys():
        for key, value in saved.items():
            current[key] = restored_into(current[key], value)
        return current
    if isinstance(current, list) and isinstance(saved, list) and len(current) == len(saved):
        current[:] = [restored_into(c, v) for c, v in zip(current, saved)]
        return current
    if type(current) is tuple and type(saved) is tuple and len(current) == len(saved):
        return tuple(restored_into(c, v) for c, v in zip(current, saved))
    return _owned(saved)


def restore(state: dict[str, Any], model: torch.nn.Module,
            optimizer: Optimizers | None = None, *, scheduler: Any = None,
            scaler: Any = None, rng: bool = True, rng_rank: int = 0,
            world_size: int = 1) -> None:
    """Load a `capture()` dict back into live objects (RNG last, so nothing consumes it after).

    A checkpoint of a multi-rank run holds every rank's RNG states (`rng_ranks`); rank
    `rng_rank` takes its own when the world size is unchanged, else rank 0's (with a warning:
    the run continues, but not bit-identically)."""
    check_format(state, "checkpoint")
    inner = unwrap(model)
    _load_into(inner, _model_state(state, inner), "model")
    restore_parts(state, optimizer=optimizer, scheduler=scheduler, scaler=scaler)
    _check_optimizer_type(state.get("optimizer_type"), optimizer)   # after: the count first
    if rng:
        set_rng_state(own_rng(state.get("rng_ranks"), state["rng"], rng_rank, world_size))


def own_rng(ranks: list[Any] | None, first: dict[str, Any], rank: int,
            world_size: int) -> dict[str, Any]:
    """The RNG states rank `rank` resumes with: its own of `ranks` (every rank's, saved by a
    multi-rank run) when the world size is unchanged, else `first` (rank 0's; with a warning
    under several ranks: the run continues, but not bit-identically)."""
    if ranks and len(ranks) == world_size and 0 <= rank < len(ranks):
        return cast(dict[str, Any], ranks[rank])
    if ranks or world_size > 1:
        log.warning("shockslurm.train: checkpoint has RNG states of %d rank(s), this run has "
                    "%d; every rank restores rank 0's", len(ranks or [1]), world_size)
    return first


def restore_parts(state: dict[str, Any], **parts: Any) -> None:
    """Load the checkpoint's `optimizer`, `scheduler`, `scaler` states (those given) into the
    live objects."""
    for what, obj in parts.items():
        if obj is not None and state.get(what) is not None:
            _load_into(obj, _owned(state[what]), what)

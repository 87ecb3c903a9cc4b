"""Option shapes several commands share (`simulate`, `bench live`, `bench quality`, ...): one
declaration each, so that the same option reads and checks the same way everywhere."""

from __future__ import annotations

import math
from typing import Any, Callable, TypeVar

import click

from ..limits import MAX_ARRIVAL_S
from ..model import MAX_CLUSTER_GPUS, Node
from ..ops.keys import MAX_WAIT_SECONDS, MIN_PERIOD_SECONDS
from ..policies import REGISTRY
from .paths import OutputDir, OutputFile

FC = TypeVar("FC", bound=Callable[..., Any])

# Sizes: each bound is far above every documented run and keeps what it sizes within a
# machine's memory (a generated job costs about 3.5 KB: 20,000 took 70 MB; 100,000 ~350 MB).
MAX_JOBS = 100_000      # jobs in a workload or a snapshot (the largest documented: 5000)
MAX_SEEDS = 10_000      # workloads one benchmark simulates (the largest documented: 60)
MAX_WORKERS = 64        # processes of a benchmark's pool (documented: 2), each a Python with
#                         numpy and the solvers (about 150 MB)


class FiniteFloat(click.FloatRange):
    """A number option: a finite float (nan, inf and 1e400 are refused, which `float` and
    `click.FloatRange` let through), optionally within a range (`click.FloatRange`'s `min`,
    `max`, `min_open`, `max_open`). Every float option of `shockslurm`'s commands is one
    (shocksub's are checked with the rest of its request, `slurm.submit.JobRequest`)."""

    name = "finite float"

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> Any:
        number = click.FLOAT.convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return super().convert(number, param, ctx)


# Shared value types (and their bounds, each with its reason).
SEED = click.IntRange(min=0)        # the generators' numpy seeds are non-negative
JOBS = click.IntRange(1, MAX_JOBS)
GPUS = click.IntRange(1, MAX_CLUSTER_GPUS)
WORKERS = click.IntRange(1, MAX_WORKERS)
# A round: as the daemon's `round_seconds` (ops/keys.py): >= 0.5 s, <= one day.
ROUND_SECONDS = FiniteFloat(MIN_PERIOD_SECONDS, MAX_WAIT_SECONDS)
# A restart's cost: the reference's is 20 s, the live benchmark's 2 s; at most a day.
RESTART_OVERHEAD = FiniteFloat(0, MAX_WAIT_SECONDS)
# Real seconds per trace second: documented 0.15-20. At 100 a live replay of the default
# workload (about 2,100 trace seconds) lasts some 60 hours an arm (--arm-timeout is at most a
# week); at 0.001 its iterations are down to microseconds.
TIME_SCALE = FiniteFloat(1e-3, 100)
# A Poisson arrival rate: documented 40-343; at least so many that MAX_JOBS jobs arrive, with a
# factor 2 for the draws, within the readers' latest arrival (`limits.MAX_ARRIVAL_S`, so that
# what `trace generate` writes reads back), about 0.72 an hour; at most about 28 a second.
JOBS_PER_HOUR = FiniteFloat(2 * MAX_JOBS * 3600 / MAX_ARRIVAL_S, 100_000)


def _option(flag: str, kind: click.ParamType, default: Any, help: str) -> Callable[[FC], FC]:
    return click.option(flag, type=kind, default=default, show_default=default is not None,
                        help=help)


def seed_option(default: int | None, help: str | None = None) -> Callable[[FC], FC]:
    """`--seed N` (`seed`): an integer >= 0."""
    return _option("--seed", SEED, default, help or "Seed of the random draws.")


def jobs_option(default: int | None, help: str) -> Callable[[FC], FC]:
    """`--jobs N` (`jobs`): 1..MAX_JOBS."""
    return _option("--jobs", JOBS, default, help)


def gpus_option(default: int | None, help: str) -> Callable[[FC], FC]:
    """`--gpus N` (`gpus`): 1..MAX_CLUSTER_GPUS."""
    return _option("--gpus", GPUS, default, help)


def workers_option(help: str) -> Callable[[FC], FC]:
    """`--workers N` (`workers`): processes at once, 1..MAX_WORKERS (never more than there
    are simulations: `sim.workers.map_ordered`)."""
    return _option("--workers", WORKERS, 1, help)


def round_seconds_option(default: float, help: str) -> Callable[[FC], FC]:
    """`--round-seconds S` (`round_seconds`): ROUND_SECONDS."""
    return _option("--round-seconds", ROUND_SECONDS, default, help)


def restart_overhead_option(default: float, help: str) -> Callable[[FC], FC]:
    """`--restart-overhead S` (`restart_overhead`): RESTART_OVERHEAD."""
    return _option("--restart-overhead", RESTART_OVERHEAD, default, help)


def time_scale_option(default: float, help: str) -> Callable[[FC], FC]:
    """`--time-scale X` (`time_scale`): TIME_SCALE."""
    return _option("--time-scale", TIME_SCALE, default, help)


def jobs_per_hour_option(default: float | None, help: str) -> Callable[[FC], FC]:
    """`--jobs-per-hour R` (`jobs_per_hour`): JOBS_PER_HOUR."""
    return _option("--jobs-per-hour", JOBS_PER_HOUR, default, help)


def cluster_nodes_of(text: str, option: str = "--cluster") -> tuple[Node, ...]:
    """`--cluster NODESxGPUS[,...]` as nodes (`model.parse_cluster_shape`, at most
    MAX_CLUSTER_GPUS GPUs in all), or a usage error naming `option`."""
    from ..model import parse_cluster_shape

    try:
        return parse_cluster_shape(text)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint=option) from None


def json_option(help: str) -> Callable[[FC], FC]:
    """`--json FILE` (the command's `json_out`), checked when the command line is read."""
    return click.option("--json", "json_out", type=OutputFile(), help=help)


def plot_option(help: str) -> Callable[[FC], FC]:
    """`--plot DIR` (the command's `plot_dir`), checked when the command line is read."""
    return click.option("--plot", "plot_dir", type=OutputDir(), help=help)


def policy_list(value: str, option: str = "--policy") -> list[str]:
    """`--policy a,b`: the named policies, or a usage error naming the unknown ones (and
    `option`)."""
    names = [p.strip() for p in value.split(",") if p.strip()]
    unknown = [p for p in names if p not in REGISTRY]
    if unknown or not names:
        raise click.BadParameter(f"unknown policy {', '.join(unknown) or '(none)'}; known: "
                                 f"{', '.join(REGISTRY)}", param_hint=option)
    return names


def policy_option_flag(help: str = "") -> Callable[[FC], FC]:
    """`--policy-option KEY=VALUE` (repeatable; the command's `policy_option`)."""
    return click.option(
        "--policy-option", "policy_option", multiple=True, metavar="KEY=VALUE",
        help="A policy option (repeatable) for the chosen policies that take it, e.g. "
             "'tail_weight=10' for shockwave; VALUE is read as TOML (else as a string)."
             + (" " + help if help else ""))


def benchmark_policy_options(names: list[str], assignments: tuple[str, ...], *,
                             sets_itself: str) -> dict[str, dict[str, Any]]:
    """Each of `names`'s options from `--policy-option`, validated as the daemon validates
    `[policy]`. A benchmark sets the policy settings (`PolicySettings`: round length, gate)
    itself, so such a key is a `ConfigError` saying so (`sets_itself`)."""
    from ..errors import ConfigError
    from ..ops.config import SETTINGS_KEYS, assign_policy_options, parse_policy_assignments

    given = parse_policy_assignments(assignments, "--policy-option")
    for name in given:
        if name in SETTINGS_KEYS:
            raise ConfigError(f"the benchmark sets this itself ({sets_itself})",
                              source="--policy-option", field=f"policy.{name}")
    return assign_policy_options(names, given, dict.fromkeys(given, "--policy-option"))

"""`shockslurm bench live-family`: the live benchmark's workload over many seeds, simulated as
`bench live --simulate-only` predicts each, and every arm's ratios to native summarised over
the seeds (`shockslurm.livebench.family`)."""

from __future__ import annotations

import json
from pathlib import Path

import click

from ..errors import ShockslurmError
from .bench_live import DEFAULT_ARMS, arm_policy_options, parse_arms
from .options import (MAX_SEEDS, FiniteFloat, cluster_nodes_of, json_option, policy_option_flag,
                      restart_overhead_option, round_seconds_option, time_scale_option,
                      workers_option)
from .paths import write_output

DEFAULT_SEEDS = "10-69"
# --target: a ratio to native (the README's 0.67); no arm is 100x native on any seed.
TARGET = FiniteFloat(0, 100, min_open=True)


def seed_family(text: str) -> list[int]:
    """`--seeds` (`livebench.family.parse_seeds`), at most MAX_SEEDS of them; or a usage error
    naming the option."""
    from ..livebench.family import parse_seeds

    try:
        return parse_seeds(text, most=MAX_SEEDS)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="'--seeds'") from None


@click.command("live-family")
@click.option("--seeds", default=DEFAULT_SEEDS, show_default=True,
              help="Seeds of the built-in workload's generator: FIRST-LAST and/or single "
                   "seeds, comma-separated (the live benchmark's own workload is seed 10); "
                   f"at most {MAX_SEEDS:,} seeds.")
@click.option("--arms", default=DEFAULT_ARMS, show_default=True,
              help="Comma-separated: `native` (plain Slurm as the simulator's Slurm-like fifo) "
                   "and/or policies.")
@click.option("--against", "reference", default="native", show_default=True,
              help="The arm every other arm's ratios are taken against (one of --arms).")
@click.option("--cluster", "cluster_shape_text", default="4x8", show_default=True,
              help="Nodes as NODESxGPUS (the test cluster's shape).")
@time_scale_option(0.15, "Real seconds per trace second (the README's runs).")
@round_seconds_option(15.0, "The policies' round length (the README's runs).")
@restart_overhead_option(2.0, "The switch cost in seconds (the live median switch).")
@click.option("--target", type=TARGET, default=None,
              help="Also count the seeds whose ratio is at or below this (e.g. 0.67).")
@policy_option_flag("Each policy arm is simulated with them.")
@workers_option("Seeds simulated at once (a process pool; the same numbers).")
@json_option("Write every seed's numbers and the summary as JSON.")
def live_family_cmd(seeds: str, arms: str, reference: str, cluster_shape_text: str,
                    time_scale: float, round_seconds: float, restart_overhead: float,
                    target: float | None, policy_option: tuple[str, ...], workers: int,
                    json_out: Path | None) -> None:
    """Each arm's makespan, JCT and rho against native's over the workload family: the
    median, geometric mean and range of the per-seed ratios, beside the bounds' ratios (what
    no scheduler goes below). No Slurm needed."""
    from ..livebench.family import FamilySettings, family_rows, family_table, summarise

    arm_list = parse_arms(arms)
    options = arm_policy_options(arm_list, policy_option)
    seed_list = seed_family(seeds)
    nodes = cluster_nodes_of(cluster_shape_text)
    try:
        settings = FamilySettings(nodes=nodes, arms=tuple(arm_list), reference=reference,
                                  time_scale=time_scale, round_s=round_seconds,
                                  restart_overhead_s=restart_overhead, options=options)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="'--against'") from None
    try:
        rows = family_rows(seed_list, settings, workers,
                           progress=lambda m: click.echo(m, err=True))
    except (ShockslurmError, ValueError) as exc:
        raise click.ClickException(f"cannot simulate the family: {exc}") from None
    summary = summarise(rows, target)
    click.echo(family_table(summary, reference))
    if json_out is not None:
        document = {"seeds": seed_list, "arms": arm_list, "against": reference,
                    "cluster": cluster_shape_text, "time_scale": time_scale,
                    "round_seconds": round_seconds, "restart_overhead_s": restart_overhead,
                    "policy_options": {a: o for a, o in options.items() if o},
                    "summary": summary, "per_seed": rows}
        write_output(json_out, json.dumps(document, indent=2) + "\n", "--json")

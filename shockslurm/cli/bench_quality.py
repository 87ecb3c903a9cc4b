"""`shockslurm bench quality`: Shockwave against every baseline on reference-like workloads of
several sizes, with and without the baselines' Gavel gate (`sim.quality`, `sim.quality_summary`)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Sequence

import click

from ..errors import ShockslurmError
from ..model import MAX_CLUSTER_GPUS
from ..policies import REGISTRY
from ..sim.quality import SIZES, cases, parse_sizes, quality_runs, size_label, write_frontier_plots
from ..sim.quality_summary import REFERENCE, Row, ratio_table, size_summary
from ..workload.reference import Throughputs, read_throughputs
from ..workload.reference_like import catalogue_throughputs
from .options import (MAX_JOBS, MAX_SEEDS, benchmark_policy_options, json_option, plot_option,
                      policy_list, policy_option_flag, workers_option)
from .paths import refuse_inputs_as_outputs, write_output

DEFAULT_SIZES = ",".join(size_label(j, g) for j, g in SIZES)


def _x(value: float) -> str:
    return "inf" if math.isinf(value) else f"{value:.2f}x"


def format_tables(ratios: Sequence[Row], summary: Sequence[Row]) -> str:
    """Per size: Shockwave's medians, re-solve times, placement loss and makespan floor, then each
    baseline's median ratios (baseline / Shockwave: > 1 means Shockwave is better), its unfair
    fraction and its gap to Shockwave's in percentage points (> 0: Shockwave fairer), and its
    makespan over the floor (the most any policy could gain on it), as Markdown."""
    lines: list[str] = []
    for s in summary:
        size = s["size"]
        lines += [f"## {size} (jobs/GPUs), {s['seeds']} seeds",
                  f"shockwave medians: makespan {s['makespan_s']:,.0f} s, avg JCT "
                  f"{s['avg_jct_s']:,.0f} s, worst rho {s['worst_rho']:.2f}, unfair "
                  f"{s['unfair_fraction']:.1%}; re-solve median {s['resolve_median_s']:.3f} s, "
                  f"max {s['resolve_max_s']:.2f} s; placement loss median "
                  f"{s['placement_loss']:.2%} (pack {s['pack_loss']:.2%}, round "
                  f"{s['round_loss']:.2%}), max {s['placement_loss_max']:.2%}; layout cut "
                  f"{s['layout_cut']:.1%}; objective as placed {s['objective_drop']:.1%} "
                  f"below the solver's; "
                  f"fallbacks {s['fallbacks']}; makespan floor {s['makespan_floor_s']:,.0f} s, "
                  f"shockwave {s['makespan_over_floor']:.2f}x it",
                  "",
                  ("| policy | gate | makespan | avg JCT | worst rho | unfair (theirs) "
                   "| unfair gap (points) | makespan (theirs) / floor |"),
                  "|---|---|---|---|---|---|---|---|"]
        for r in ratios:
            if r["size"] == size:
                lines.append(f"| {r['policy']} | {r['gate']} | {_x(r['makespan_s_ratio'])} | "
                             f"{_x(r['avg_jct_s_ratio'])} | {_x(r['worst_rho_ratio'])} | "
                             f"{r['unfair_fraction']:.1%} | "
                             f"{100 * r['unfair_fraction_gap']:+.1f} | "
                             f"{_x(r['makespan_over_floor'])} |")
        lines.append("")
    return "\n".join(lines)


def _finite(value: Any) -> Any:
    """JSON has no infinity: `inf` ratios are written as the string "inf"."""
    if isinstance(value, float) and math.isinf(value):
        return "inf"
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


def _policy_list(value: str) -> list[str]:
    names = policy_list(value, "--policies")
    if REFERENCE not in names:
        names.insert(0, REFERENCE)      # every ratio is against it
    return names


def _sizes(text: str) -> list[tuple[int, int]]:
    """`--sizes` (`sim.quality.parse_sizes`), each at most MAX_JOBS jobs on MAX_CLUSTER_GPUS
    GPUs (the README's largest: 5000/2048), or a usage error naming the option."""
    try:
        sizes = parse_sizes(text)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--sizes") from None
    for jobs, gpus in sizes:
        if jobs > MAX_JOBS or gpus > MAX_CLUSTER_GPUS:
            raise click.BadParameter(f"size {size_label(jobs, gpus)}: at most {MAX_JOBS:,} jobs "
                                     f"on {MAX_CLUSTER_GPUS:,} GPUs", param_hint="--sizes")
    return sizes


def _table(throughputs: Path | None) -> Throughputs:
    if throughputs is None:
        click.echo("note: no --throughputs given: job lengths use the built-in catalogue's "
                   "throughput model, not the reference's measured throughputs", err=True)
        return catalogue_throughputs()
    return read_throughputs(throughputs)


@click.command("quality")
@click.option("--throughputs", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="The reference's throughput JSON (e.g. ../shared/data/shockwave-120/"
                   "throughputs-tacc.json); default: the built-in catalogue's model.")
@click.option("--sizes", default=DEFAULT_SIZES, show_default=True,
              help="JOBS/GPUS pairs, comma-separated.")
@click.option("--seeds", type=click.IntRange(1, MAX_SEEDS), default=5, show_default=True,
              help="Workloads per size (seeds 1..N).")
@click.option("--policies", default=",".join(REGISTRY), show_default=True,
              help="Policies, comma-separated (shockwave is always added).")
@click.option("--node-gpus", type=click.IntRange(0, MAX_CLUSTER_GPUS), default=0,
              show_default=True, help="Split the GPUs into nodes of this many (0: one pool).")
@policy_option_flag()
@workers_option("Simulations at once (a process pool; results are the same, the solve times "
                "are not comparable with a sequential run's).")
@json_option("Write every run, the ratios and the per-size summary to this JSON file.")
@plot_option("Write a frontier plot (makespan vs worst rho) per size into this folder.")
def quality_cmd(throughputs: Path | None, sizes: str, seeds: int, policies: str, node_gpus: int,
                policy_option: tuple[str, ...], workers: int, json_out: Path | None,
                plot_dir: Path | None) -> None:
    """Shockwave against every baseline on reference-like workloads (contended: the 120-job
    trace's load per GPU), the baselines with and without the Gavel gate: median ratios per
    size, re-solve times and placement loss, as Markdown (JSON with --json)."""
    refuse_inputs_as_outputs({"--json": json_out}, {"--throughputs": throughputs})
    size_list = _sizes(sizes)
    if node_gpus and any(g % node_gpus for _, g in size_list if g > node_gpus):
        raise click.BadParameter(f"every size's GPUs must split into nodes of {node_gpus}",
                                 param_hint="--node-gpus")
    names = _policy_list(policies)
    try:
        options = benchmark_policy_options(names, policy_option,
                                           sets_itself="rounds of 120 s, its gates")
        table = _table(throughputs)
        matrix = cases(size_list, range(1, seeds + 1), names,
                       gated=lambda p: REGISTRY[p].gavel, node_gpus=node_gpus, options=options)
        rows = quality_runs(matrix, table, workers=workers,
                            progress=lambda m: click.echo(m, err=True))
    except (ShockslurmError, ValueError) as exc:
        raise click.ClickException(str(exc)) from None
    ratios, summary = ratio_table(rows), size_summary(rows)
    for policy, given in options.items():
        if given:
            click.echo(f"{policy} options: "
                       + ", ".join(f"{k}={v}" for k, v in sorted(given.items())) + "\n")
    click.echo(format_tables(ratios, summary))
    if json_out is not None:
        document = {"sizes": [size_label(j, g) for j, g in size_list], "seeds": seeds,
                    "policies": names, "node_gpus": node_gpus,
                    "policy_options": {p: o for p, o in options.items() if o},
                    "throughputs": str(throughputs) if throughputs else "catalogue",
                    "summary": summary, "ratios": ratios, "runs": rows}
        write_output(json_out, json.dumps(_finite(document), indent=2) + "\n", "--json")
    if plot_dir is not None:
        try:
            for path in write_frontier_plots(rows, plot_dir):
                click.echo(f"wrote {path}", err=True)
        except OSError as exc:
            raise click.ClickException(f"cannot write plots to {plot_dir}: {exc}") from None

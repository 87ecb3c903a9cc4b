"""`shockslurm bench switch-cost`: makespan and JCT of policies as the restart overhead grows."""

from __future__ import annotations

import json
from pathlib import Path

import click

from ..errors import ShockslurmError
from ..model import parse_cluster_shape
from ..sim.run import SimConfig
from ..sim.sweep import median_table, switch_cost_runs
from ..workload.generator import GeneratorConfig, generate
from ..workload.jsonl import read_jobs
from .options import benchmark_policy_options, policy_list, policy_option_flag
from .paths import OutputFile, write_output


def _numbers(value: str, option: str, kind: type) -> list:
    try:
        out = [kind(v) for v in value.split(",") if v.strip()]
    except ValueError:
        raise click.BadParameter(f"expected comma-separated numbers, got {value!r}",
                                 param_hint=option) from None
    if not out or any(v < 0 for v in out):
        raise click.BadParameter(f"expected comma-separated numbers >= 0, got {value!r}",
                                 param_hint=option)
    return out


@click.command("switch-cost")
@click.option("--trace", "traces", multiple=True,
              type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="A workload in our JSONL format (repeat for several); default: generated "
                   "ones, one per --seeds entry (as `shockslurm trace generate` writes them).")
@click.option("--seeds", default="1,2,3,4,5", show_default=True,
              help="Generator seeds of the default workloads.")
@click.option("--jobs", type=click.IntRange(min=1), default=120, show_default=True,
              help="Jobs per generated workload.")
@click.option("--jobs-per-hour", type=click.FloatRange(min=0, min_open=True), default=100.0,
              show_default=True, help="Arrival rate of the generated workloads.")
@click.option("--cluster", "shape", default="4x8", show_default=True,
              help="Nodes x GPUs per node (see `simulate --cluster`).")
@click.option("--restart-overhead", "overheads", default="20,60,120", show_default=True,
              help="Restart overheads to compare, seconds, comma-separated.")
@click.option("--policy", "policies", default="shockwave,max_min_fairness,fifo",
              show_default=True, help="Policies, comma-separated.")
@policy_option_flag()
@click.option("--json", "json_out", type=OutputFile(),
              help="Also write every run and the medians to this JSON file.")
def switch_cost_cmd(traces: tuple[Path, ...], seeds: str, jobs: int, jobs_per_hour: float,
                    shape: str, overheads: str, policies: str, policy_option: tuple[str, ...],
                    json_out: Path | None) -> None:
    """Median makespan, average JCT and worst rho over workloads per policy and restart
    overhead, as a Markdown table (and JSON with --json)."""
    names = policy_list(policies)
    costs = _numbers(overheads, "--restart-overhead", float)
    try:
        nodes = parse_cluster_shape(shape)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--cluster") from None
    try:
        options = benchmark_policy_options(names, policy_option,
                                           sets_itself="the simulator's default rounds")
        if traces:
            workloads = [read_jobs(t) for t in traces]
        else:
            workloads = [generate(GeneratorConfig(jobs=jobs, seed=s, jobs_per_hour=jobs_per_hour))
                         for s in _numbers(seeds, "--seeds", int)]
        rows = switch_cost_runs(workloads, names, costs, SimConfig.for_nodes(nodes),
                                progress=lambda m: click.echo(m, err=True), options=options)
    except (ShockslurmError, ValueError) as exc:
        raise click.ClickException(str(exc)) from None
    table = median_table(rows)
    given = {p: o for p, o in options.items() if o}
    click.echo(f"medians over {len(workloads)} workloads, cluster {shape}"
               + "".join(f"; {p} " + ", ".join(f"{k}={v}" for k, v in sorted(o.items()))
                         for p, o in given.items()))
    click.echo("| policy | restart s | makespan s | avg JCT s | worst rho | util |")
    click.echo("|---|---|---|---|---|---|")
    for r in table:
        click.echo(f"| {r['policy']} | {r['restart_overhead_s']:g} | {r['makespan_s']:,.0f} | "
                   f"{r['avg_jct_s']:,.0f} | {r['worst_rho']:.2f} | {r['utilization']:.2f} |")
    if json_out is not None:
        write_output(json_out, json.dumps({"policy_options": given, "runs": rows,
                                           "medians": table}, indent=2) + "\n", "--json")

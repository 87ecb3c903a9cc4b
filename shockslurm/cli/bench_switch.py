"""`shockslurm bench switch-cost`: makespan and JCT of policies as the restart overhead grows."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from ..errors import ShockslurmError
from ..sim.run import SimConfig
from ..sim.sweep import median_table, switch_cost_runs
from ..workload.generator import GeneratorConfig, generate
from ..workload.jsonl import read_jobs
from .options import (MAX_JOBS, MAX_SEEDS, RESTART_OVERHEAD, SEED, benchmark_policy_options,
                      cluster_nodes_of, jobs_option, jobs_per_hour_option, json_option,
                      policy_list, policy_option_flag)
from .paths import refuse_inputs_as_outputs, write_output

MAX_OVERHEADS = 100     # --restart-overhead: each one simulates every workload and policy again


class CommaList(click.ParamType):
    """Comma-separated values of `item` (each read and checked as that option type reads one),
    at least one and at most `most`."""

    name = "list"

    def __init__(self, item: click.ParamType, most: int) -> None:
        self.item, self.most = item, most

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> Any:
        if isinstance(value, list):
            return value
        parts = [v.strip() for v in str(value).split(",") if v.strip()]
        if not parts or len(parts) > self.most:
            self.fail(f"expected 1 to {self.most:,} comma-separated values, got {value!r}",
                      param, ctx)
        return [self.item.convert(v, param, ctx) for v in parts]


@click.command("switch-cost")
@click.option("--trace", "traces", multiple=True,
              type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="A workload in our JSONL format (repeat for several); default: generated "
                   "ones, one per --seeds entry (as `shockslurm trace generate` writes them).")
@click.option("--seeds", type=CommaList(SEED, MAX_SEEDS), default="1,2,3,4,5",
              show_default=True, help="Generator seeds (>= 0, comma-separated, at most "
                                      f"{MAX_SEEDS:,}) of the default workloads.")
@jobs_option(120, "Jobs per generated workload.")
@jobs_per_hour_option(100.0, "Arrival rate of the generated workloads.")
@click.option("--cluster", "shape", default="4x8", show_default=True,
              help="Nodes x GPUs per node (see `simulate --cluster`).")
@click.option("--restart-overhead", "overheads", type=CommaList(RESTART_OVERHEAD, MAX_OVERHEADS),
              default="20,60,120", show_default=True,
              help="Restart overheads to compare, seconds, comma-separated (each at most a "
                   "day).")
@click.option("--policy", "policies", default="shockwave,max_min_fairness,fifo",
              show_default=True, help="Policies, comma-separated.")
@policy_option_flag()
@json_option("Also write every run and the medians to this JSON file.")
def switch_cost_cmd(traces: tuple[Path, ...], seeds: list[int], jobs: int, jobs_per_hour: float,
                    shape: str, overheads: list[float], policies: str,
                    policy_option: tuple[str, ...], json_out: Path | None) -> None:
    """Median makespan, average JCT and worst rho over workloads per policy and restart
    overhead, as a Markdown table (and JSON with --json)."""
    for trace in traces:
        refuse_inputs_as_outputs({"--json": json_out}, {"--trace": trace})
    names = policy_list(policies)
    nodes = cluster_nodes_of(shape)
    if not traces and len(seeds) * jobs > MAX_JOBS:    # every workload is held at once
        raise click.BadParameter(f"{len(seeds):,} workloads of {jobs:,} jobs: at most "
                                 f"{MAX_JOBS:,} generated jobs in all",
                                 param_hint=["--seeds", "--jobs"])
    try:
        options = benchmark_policy_options(names, policy_option,
                                           sets_itself="the simulator's default rounds")
        if traces:
            workloads = [read_jobs(t) for t in traces]
        else:
            workloads = [generate(GeneratorConfig(jobs=jobs, seed=s, jobs_per_hour=jobs_per_hour))
                         for s in seeds]
        rows = switch_cost_runs(workloads, names, overheads, SimConfig.for_nodes(nodes),
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

"""`shockslurm simulate`: policies side by side on a workload, in the trace-driven simulator."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from ..errors import ShockslurmError
from ..model import MAX_CLUSTER_GPUS, JobSpec, Node
from ..ops.config import (SETTINGS_KEYS, assign_policy_options, check_policy_settings,
                          parse_policy_assignments, read_policy_table)
from ..ops.keys import MAX_WAIT_SECONDS
from ..policies import PolicySettings, policy_names
from ..sim.cluster import RESTART_OVERHEAD_S
from ..sim.jobs import ADAPTATION_MODES
from ..sim.reference_profiles import load_reference_trace
from ..sim.run import SimConfig, SimResult, simulate
from ..store import open_store
from ..store.database import check_url
from ..workload.generator import GeneratorConfig, generate
from ..workload.jsonl import read_jobs
from .db import DB_HELP, record_simulation
from .options import (FiniteFloat, cluster_nodes_of, gpus_option, json_option, plot_option,
                      policy_list, policy_option_flag, restart_overhead_option,
                      round_seconds_option)
from .paths import refuse_inputs_as_outputs, write_output
from .progress_bar import DelayedProgress
from .trace import is_jsonl

DEFAULT_GPUS = 8
TABLE_COLUMNS = (
    ("policy", "policy", "{}"),
    ("makespan_s", "makespan s", "{:,.0f}"),
    ("avg_jct_s", "avg JCT s", "{:,.0f}"),
    ("p99_jct_s", "p99 JCT s", "{:,.0f}"),
    ("worst_rho", "worst rho", "{:.2f}"),
    ("median_rho", "median rho", "{:.2f}"),
    ("unfair_fraction", "rho>1.05", "{:.1%}"),
    ("utilization", "util", "{:.2f}"),
    ("sim_wall_s", "wall s", "{:.1f}"),
)



def _load_workload(trace: Path | None, throughputs: Path | None, profiles: Path | None
                   ) -> list[JobSpec]:
    if trace is None:
        if throughputs or profiles:
            raise click.UsageError("--throughputs/--profiles need --trace")
        return generate(GeneratorConfig())
    if is_jsonl(trace):
        if throughputs or profiles:
            raise click.UsageError("a JSONL workload carries its own throughputs; drop "
                                   "--throughputs/--profiles")
        return read_jobs(trace)
    if throughputs is None:
        raise click.UsageError("a reference (TSV) trace needs --throughputs FILE")
    return load_reference_trace(trace, throughputs, profiles)


def _cluster(shape: str | None, gpus: int | None) -> tuple[Node, ...]:
    """`--cluster` as nodes (empty without it: `--gpus` is one pool)."""
    if shape is None:
        return ()
    if gpus is not None:
        raise click.UsageError("give either --gpus (one pool) or --cluster (nodes), not both")
    return cluster_nodes_of(shape)


def _policy_options(names: list[str], config_file: Path | None, assignments: tuple[str, ...]
                    ) -> tuple[dict, dict[str, dict]]:
    """(the PolicySettings keys given, each policy's options) from --policy-config's [policy]
    table and --policy-option (which wins), validated as the daemon validates [policy]."""
    options: dict = {}
    origins: dict[str, str] = {}
    if config_file is not None:
        table = read_policy_table(config_file)
        options.update(table)
        origins.update(dict.fromkeys(table, str(config_file)))
    given = parse_policy_assignments(assignments, "--policy-option")
    options.update(given)
    origins.update(dict.fromkeys(given, "--policy-option"))
    options = check_policy_settings(options, origins)
    per_policy = assign_policy_options(names, options, origins)
    return {k: v for k, v in options.items() if k in SETTINGS_KEYS}, per_policy


def format_table(results: list[SimResult]) -> str:
    rows = [[fmt.format(r.as_dict()[key]) for key, _, fmt in TABLE_COLUMNS] for r in results]
    heads = [title for _, title, _ in TABLE_COLUMNS]
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(heads)]
    line = lambda cells: "  ".join(c.rjust(w) if i else c.ljust(w)  # noqa: E731
                                   for i, (c, w) in enumerate(zip(cells, widths)))
    return "\n".join([line(heads), line(["-" * w for w in widths])] + [line(r) for r in rows])


@click.command("simulate")
@click.option("--trace", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="Workload: a reference TSV trace (needs --throughputs) or our JSONL format. "
                   "Default: the built-in synthetic workload.")
@click.option("--throughputs", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="Reference throughput JSON (iterations/s per job type and gang size).")
@click.option("--profiles", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="Reference per-epoch profiles (JSON or .json.gz); without them each job's "
                   "profile is what the reference's batch-size rules make of it alone.")
@gpus_option(None, f"GPUs in the cluster (default {DEFAULT_GPUS} for the built-in workload).")
@click.option("--cluster", "cluster_shape", default=None, metavar="NODESxGPUS[,...]",
              help="The cluster as nodes, e.g. 4x8 (4 nodes of 8 GPUs) or 2x8,4x4: plans are "
                   "placed on nodes, so gangs that fit no node wait (instead of --gpus, which is "
                   f"one pool where any gang fits; at most {MAX_CLUSTER_GPUS:,} GPUs in all).")
@click.option("--policy", "policy", default=",".join(policy_names()), show_default=True,
              help="Policy name, or several separated by commas to compare side by side.")
@round_seconds_option(PolicySettings.round_s, "Round length.")
@restart_overhead_option(RESTART_OVERHEAD_S, "Seconds lost by a job that runs after not "
                         "running in the previous round.")
@click.option("--fill-on-completion/--round-boundaries", default=False, show_default=True,
              help="--fill-on-completion simulates the live daemon's event-driven rounds: GPUs a "
                   "finishing job frees are re-planned at once when jobs wait (restarts cost "
                   "their overhead whatever the run's length, and a job that runs on keeps its "
                   "part-done iteration). The default follows the reference simulator: jobs "
                   "start only at round boundaries, in whole iterations per round.")
@click.option("--adaptation", type=click.Choice(("auto",) + ADAPTATION_MODES), default="auto",
              show_default=True,
              help="How simulated jobs change batch size: 'reference' follows the reference "
                   "simulator's rules (comparable with its published numbers), 'profile' follows "
                   "each job's declared per-epoch schedule; 'auto' is 'reference' for reference "
                   "TSV traces and 'profile' otherwise.")
@click.option("--resolve-interval", type=FiniteFloat(min=0, max=MAX_WAIT_SECONDS),
              default=PolicySettings.min_resolve_interval_s,
              show_default=True,
              help="Baselines (Gavel-style policies) re-solve at most this often, plus on "
                   "arrivals and completions after it; 0 re-solves every round; at most a day "
                   "(a longer gate ran the simulation for ever). The default is Gavel's gate, "
                   "as in the reference simulator.")
@click.option("--idle-new-jobs/--no-idle-new-jobs", default=PolicySettings.idle_unallocated,
              show_default=True,
              help="Baselines leave GPUs idle for jobs that arrive between re-solves until the "
                   "next re-solve (Gavel, as in the reference simulator); --no-idle-new-jobs "
                   "hands them idle GPUs at once.")
@click.option("--policy-config", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="A daemon configuration file (TOML) whose [policy] table sets policy options "
                   "(its other tables are not used).")
@policy_option_flag("It wins over --policy-config.")
@json_option("Write the results, one object per policy, to this JSON file.")
@click.option("--progress/--no-progress", default=True, show_default=True,
              help="Show a progress bar on stderr for runs longer than a few seconds.")
@click.option("--db", "db_url", default=None,
              help=DB_HELP + " Record each policy's run there (created/upgraded if needed).")
@plot_option("Write PNG charts (GPU timeline and utilisation per policy, rho per policy) to "
             "this directory; the paths are printed.")
@click.pass_context
def simulate_cmd(ctx: click.Context, trace: Path | None, throughputs: Path | None,
                 profiles: Path | None, gpus: int | None, cluster_shape: str | None, policy: str,
                 round_seconds: float, restart_overhead: float, fill_on_completion: bool,
                 adaptation: str,
                 resolve_interval: float, idle_new_jobs: bool, policy_config: Path | None,
                 policy_option: tuple[str, ...],
                 json_out: Path | None, progress: bool, db_url: str | None,
                 plot_dir: Path | None) -> None:
    """Simulate policies on a workload and print makespan, JCT, fairness and utilisation."""
    names = policy_list(policy)
    nodes = _cluster(cluster_shape, gpus)
    try:
        file_settings, per_policy = _policy_options(names, policy_config, policy_option)
    except ShockslurmError as exc:
        raise click.ClickException(str(exc)) from None
    settings = _settings(ctx, file_settings, round_seconds, resolve_interval, idle_new_jobs)
    store_file = None if db_url is None else check_url(db_url)
    refuse_inputs_as_outputs({"--json": json_out},
                             {"--trace": trace, "--throughputs": throughputs,
                              "--profiles": profiles, "--policy-config": policy_config,
                              "--db": store_file})
    if db_url is not None:  # a store we cannot write must stop us before the simulation runs
        try:
            open_store(db_url, create=True).dispose()
        except ShockslurmError as exc:
            raise click.ClickException(str(exc)) from None
    try:
        jobs = _load_workload(trace, throughputs, profiles)
        if adaptation == "auto":
            adaptation = "reference" if trace is not None and not is_jsonl(trace) else "profile"
        config = SimConfig(gpus=_gpus(nodes, gpus, trace), restart_overhead_s=restart_overhead,
                           adaptation=adaptation, nodes=nodes, settings=settings,
                           fill_on_completion=fill_on_completion,
                           keep_partial_iterations=fill_on_completion)
        results = [_simulate(jobs, name, config, per_policy[name], progress) for name in names]
    except (ShockslurmError, ValueError) as exc:
        raise click.ClickException(str(exc)) from None
    _print(results, len(jobs), config, cluster_shape, per_policy)
    _write(results, jobs, json_out, db_url, plot_dir)


def _settings(ctx: click.Context, file_settings: dict[str, Any], round_s: float,
              resolve_interval: float, idle_new_jobs: bool) -> PolicySettings:
    """What the policies are given: the options, else the `[policy]` settings of
    --policy-config / --policy-option, else the options' defaults."""
    given = click.core.ParameterSource.COMMANDLINE
    if "min_resolve_interval_s" in file_settings and \
            ctx.get_parameter_source("resolve_interval") != given:
        resolve_interval = file_settings["min_resolve_interval_s"]
    if "idle_unallocated" in file_settings and \
            ctx.get_parameter_source("idle_new_jobs") != given:
        idle_new_jobs = file_settings["idle_unallocated"]
    return PolicySettings(round_s=round_s, min_resolve_interval_s=resolve_interval,
                          idle_unallocated=idle_new_jobs)


def _gpus(nodes: tuple[Node, ...], gpus: int | None, trace: Path | None) -> int:
    if nodes:
        return sum(n.gpus for n in nodes)
    if gpus is None:
        if trace is not None:
            raise click.UsageError("--gpus or --cluster is required with --trace")
        return DEFAULT_GPUS
    return gpus


def _simulate(jobs: list[JobSpec], name: str, config: SimConfig, options: dict[str, Any],
              progress: bool) -> SimResult:
    bar = DelayedProgress(f"{name:>22}") if progress else None
    try:
        return simulate(jobs, name, config, progress=bar, policy_options=options)
    finally:
        if bar is not None:
            bar.close()


def _print(results: list[SimResult], jobs: int, config: SimConfig, cluster_shape: str | None,
           per_policy: dict[str, dict[str, Any]]) -> None:
    s = config.settings
    shape = f" on nodes {cluster_shape.replace(' ', '')}" if cluster_shape else ""
    click.echo(f"{jobs} jobs, {config.gpus} GPUs{shape}, {s.round_s:g} s rounds, "
               f"{config.restart_overhead_s:g} s restart overhead, "
               f"adaptation={config.adaptation}, baselines "
               f"re-solve every {s.min_resolve_interval_s:g} s"
               f"{', new jobs wait for it' if s.idle_unallocated else ''}"
               f"{'; freed GPUs filled at once' if config.fill_on_completion else ''}")
    for name, opts in per_policy.items():
        if opts:
            click.echo(f"{name} options: "
                       + ", ".join(f"{k}={v!r}" for k, v in sorted(opts.items())))
    click.echo(format_table(results))


def _write(results: list[SimResult], jobs: list[JobSpec], json_out: Path | None,
           db_url: str | None, plot_dir: Path | None) -> None:
    """--json, --db, --plot."""
    if json_out is not None:
        payload = [r.as_dict() for r in results]
        write_output(json_out, json.dumps(payload if len(payload) > 1 else payload[0], indent=2)
                     + "\n", "--json")
        click.echo(f"wrote {json_out}", err=True)
    if db_url is not None:
        try:
            run_ids = record_simulation(db_url, jobs, results)
        except ShockslurmError as exc:
            raise click.ClickException(str(exc)) from None
        click.echo(f"recorded run(s) {', '.join(map(str, run_ids))} in the store", err=True)
    if plot_dir is not None:
        from ..ops.plots import write_run_plots
        from ..ops.runs import from_sim

        for path in write_run_plots([from_sim(r, jobs) for r in results], plot_dir):
            click.echo(str(path))

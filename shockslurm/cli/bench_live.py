"""`shockslurm bench live`: replay a workload on the real Slurm cluster, arm after arm, beside
the simulator's prediction for each (`shockslurm.livebench` explains the machinery)."""

from __future__ import annotations

import json
import signal
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from ..errors import ShockslurmError
from ..model import JobSpec, Node
from ..ops.keys import MAX_WAIT_SECONDS
from ..policies import REGISTRY
from .options import (FiniteFloat, benchmark_policy_options, cluster_nodes_of, json_option,
                      plot_option, policy_option_flag, restart_overhead_option,
                      round_seconds_option, seed_option, time_scale_option)
from .paths import refuse_inputs_as_outputs, write_output

if TYPE_CHECKING:
    from ..livebench.arms import ArmSettings

DEFAULT_ARMS = "native,shockwave,max_min_fairness,fifo"
DEFAULT_TIME_SCALE = 0.25
MAX_ARM_SECONDS = 7 * 86_400.0      # --arm-timeout: an arm of the README's runs takes minutes


def parse_arms(value: str) -> list[str]:
    """`--arms a,b`: `native` and/or known policies, or a usage error naming the unknown."""
    from ..livebench.arms import NATIVE

    arms = [a.strip() for a in value.split(",") if a.strip()]
    unknown = [a for a in arms if a != NATIVE and a not in REGISTRY]
    if not arms or unknown:
        raise click.BadParameter(f"unknown arm(s) {unknown} (known: {NATIVE}, "
                                 f"{', '.join(REGISTRY)})", param_hint="'--arms'")
    return arms


def _interrupt(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def cluster_nodes(partition: str) -> tuple[Node, ...]:
    """The partition's usable GPU nodes, as the simulator's `Node`s (one `sinfo --json`)."""
    from ..slurm.cli_backend import CliBackend

    nodes = tuple(Node(n.name, n.gpus) for n in sorted(CliBackend().nodes(), key=lambda n: n.name)
                  if partition in n.partitions and n.gpus > 0 and n.usable)
    if not nodes:
        raise click.ClickException(f"partition {partition!r} has no usable GPU nodes")
    return nodes


@click.command("live")
@click.option("--workload", "workload_path", type=click.Path(exists=True, dir_okay=False,
                                                                path_type=Path),
              help="A workload in our JSONL format (trace seconds). Default: the built-in one "
                   "(24 generated jobs, static/gns/accordion, ~1.5x the cluster's GPUs).")
@click.option("--arms", default=DEFAULT_ARMS, show_default=True,
              help="Comma-separated: `native` (plain Slurm) and/or policies run by the daemon.")
@time_scale_option(DEFAULT_TIME_SCALE, "Real seconds per trace second.")
@round_seconds_option(20.0, "The daemon's round length (real seconds).")
@click.option("--grace-seconds", type=FiniteFloat(0, MAX_WAIT_SECONDS), default=10.0,
              show_default=True, help="The daemon's longest wait between USR1 and requeue "
                                      "(at most a day).")
@click.option("--partition", default="gpu", show_default=True,
              help="The managed partition (the daemon's).")
@click.option("--native-partition", default="urgent", show_default=True,
              help="A partition on the same nodes that job_submit.lua leaves alone.")
@click.option("--arm-timeout", type=FiniteFloat(1, MAX_ARM_SECONDS), default=1800.0,
              show_default=True,
              help="Seconds after which an arm is stopped unfinished (at most a week).")
@click.option("--workdir", type=click.Path(file_okay=False, path_type=Path),
              help="Where plans, job logs, stores and daemon logs go (default: a new temporary "
                   "directory, kept).")
@seed_option(None, "The built-in workload's seed (default: the benchmark's own, 10).")
@click.option("--cluster", "cluster_shape_text", default=None,
              help="Nodes as NODESxGPUS (e.g. 4x8) instead of reading the partition from Slurm "
                   "(for --simulate-only away from the cluster).")
@policy_option_flag("The daemon of each policy arm gets them in its [policy] table, and the "
                    "arm's prediction too.")
@click.option("--repeat", type=click.IntRange(min=1), default=1, show_default=True,
              help="Run the arms this many times, interleaved (every arm once, then again), "
                   "and print each arm's medians and its ratios to native paired by repeat.")
@click.option("--simulate-only", is_flag=True,
              help="Run no arm: print each arm's simulated numbers and the bounds only.")
@restart_overhead_option(2.0, "With --simulate-only: the switch cost in seconds (the live "
                              "median switch).")
@json_option("Write every arm's numbers (and the workload's shape) as JSON.")
@plot_option("Write per-arm timeline and utilisation charts and rho-by-arm there.")
def live_cmd(workload_path: Path | None, arms: str, time_scale: float, round_seconds: float,
             grace_seconds: float, partition: str, native_partition: str, arm_timeout: float,
             workdir: Path | None, seed: int | None, cluster_shape_text: str | None,
             policy_option: tuple[str, ...], repeat: int, simulate_only: bool,
             restart_overhead: float, json_out: Path | None, plot_dir: Path | None) -> None:
    """Replay a workload on the real Slurm cluster: plain Slurm and each policy through the
    daemon, one arm after another, with the simulator's prediction beside each."""
    from ..livebench import workload as wl
    from ..livebench.arms import ArmSettings
    from ..livebench.report import workload_bounds

    refuse_inputs_as_outputs({"--json": json_out}, {"--workload": workload_path})
    arm_list = parse_arms(arms)
    options = arm_policy_options(arm_list, policy_option)
    # SIGTERM tears down like Ctrl-C: each arm cancels its jobs and stops its daemon.
    signal.signal(signal.SIGTERM, _interrupt)
    if cluster_shape_text is not None and not simulate_only:
        raise click.UsageError("--cluster describes the nodes for --simulate-only: the arms run "
                               "on the partition's nodes, which bench live reads from Slurm",
                               ctx=click.get_current_context())
    nodes, trace = _cluster_and_workload(partition, cluster_shape_text, workload_path, seed)
    gpus = sum(n.gpus for n in nodes)
    jobs = wl.scale(trace, time_scale)
    if simulate_only:
        if repeat > 1:
            raise click.UsageError("--repeat needs live arms: a simulation gives the same "
                                   "numbers every time", ctx=click.get_current_context())
        if plot_dir is not None:    # it was taken and nothing drawn
            raise click.UsageError("--plot draws the live arms' timelines; --simulate-only "
                                   "runs none (simulate --plot draws simulated ones)",
                                   ctx=click.get_current_context())
        _simulate_only(jobs, arm_list, nodes, round_seconds, restart_overhead, json_out,
                       options)
        return
    directory = workdir or Path(tempfile.mkdtemp(prefix="shockslurm-benchlive-"))
    settings = ArmSettings(workdir=directory, round_seconds=round_seconds,
                           grace_seconds=grace_seconds, managed_partition=partition,
                           native_partition=native_partition, timeout_s=arm_timeout,
                           node_names=tuple(n.name for n in nodes))
    shape = wl.summary(trace, gpus)
    click.echo(f"bench live: {shape}, time scale {time_scale}, rounds {round_seconds:g} s, "
               f"cluster {len(nodes)} nodes / {gpus} GPUs, work in {directory}", err=True)
    results: list[dict] = []
    bounds = workload_bounds(jobs, gpus)
    document = {"workload": {**shape, "source": str(workload_path or "built-in"),
                             "time_scale": time_scale},
                "bounds": bounds,
                "round_seconds": round_seconds, "grace_seconds": grace_seconds,
                "cluster": [[n.name, n.gpus] for n in nodes], "workdir": str(directory),
                "policy_options": {a: o for a, o in options.items() if o},
                "repeat": repeat, "arms": results}
    _run_arms(arm_list, jobs, nodes, settings, repeat, options, document, json_out)
    _echo_tables(results, repeat)
    _echo_bounds(bounds)
    if plot_dir is not None:
        _plots(results, plot_dir)


def _run_arms(arms: list[str], jobs: list[JobSpec], nodes: tuple[Node, ...],
              settings: ArmSettings, repeat: int, options: dict[str, dict[str, Any]],
              document: dict[str, Any], json_out: Path | None) -> None:
    """Run every arm `repeat` times, interleaved, into `document["arms"]` (each run with its
    `repeat` and `simulated` prediction); with repeats, `medians` and `ratios` too. The JSON is
    written after every run, so that a later failure keeps the earlier ones."""
    from ..livebench.arms import run_arm
    from ..livebench.repeats import arm_medians, paired_ratios
    from ..livebench.report import measured_switch_s, predict

    results: list[dict[str, Any]] = document["arms"]
    for index in range(1, repeat + 1):
        for arm in arms:
            run_settings = (settings if repeat == 1 else
                            replace(settings, workdir=settings.workdir / f"repeat-{index}"))
            try:
                result = run_arm(arm, jobs, run_settings, sum(n.gpus for n in nodes),
                                 echo=lambda m: click.echo(m, err=True),
                                 options=options.get(arm))
            except ShockslurmError as exc:
                raise click.ClickException(f"arm {arm}: {exc}") from None
            try:
                simulated = predict(jobs, arm, nodes, settings.round_seconds,
                                    measured_switch_s(result), options.get(arm))
            except ValueError as exc:      # the live run is kept; its prediction is not there
                simulated = {"error": str(exc)}
                click.echo(f"warning: arm {arm}: no simulated prediction: {exc}", err=True)
            result.update(repeat=index, simulated=simulated)
            results.append(result)
            click.echo(f"{arm} (run {index} of {repeat}): makespan {result.get('makespan_s')} "
                       f"s, avg JCT {result.get('avg_jct_s')} s (simulated "
                       f"{simulated.get('makespan_s', '-')} / {simulated.get('avg_jct_s', '-')})",
                       err=True)
            if repeat > 1:
                document.update(medians=arm_medians(results), ratios=paired_ratios(results))
            if json_out is not None:
                write_output(json_out, json.dumps(document, indent=2) + "\n", "--json")


def _echo_tables(results: list[dict[str, Any]], repeat: int) -> None:
    """The live-vs-simulated table: of the runs, or with repeats of each arm's medians, then
    the ratios to native paired by repeat."""
    from ..livebench.repeats import arm_medians, paired_ratios, ratio_table
    from ..livebench.report import markdown_table

    if repeat == 1:
        click.echo(markdown_table(results))
        return
    click.echo(f"Medians over {repeat} runs of each arm:\n")
    click.echo(markdown_table(arm_medians(results)))
    ratios = paired_ratios(results)
    if ratios:
        click.echo("\n" + ratio_table(ratios))


def _cluster_and_workload(partition: str, shape: str | None, workload_path: Path | None,
                          seed: int | None) -> tuple[tuple[Node, ...], list[JobSpec]]:
    """The nodes (a shape, else the partition's from Slurm) and the trace-second workload, whose
    node limits (`nodes`) must name nodes of the cluster that can hold each job, each on one
    node or in the parts it asks for (`node_count`)."""
    from ..livebench import workload as wl
    from ..sim.job_nodes import limited_jobs, node_counts
    from ..workload.jsonl import read_jobs

    given = cluster_nodes_of(shape) if shape else None
    try:
        nodes = cluster_nodes(partition) if given is None else given
        gpus = sum(n.gpus for n in nodes)
        if workload_path is None:
            return nodes, wl.default_workload(gpus, seed=wl.DEFAULT_SEED if seed is None else seed)
        jobs = read_jobs(workload_path)
    except (ShockslurmError, ValueError) as exc:
        raise click.ClickException(str(exc)) from None
    try:
        limited = limited_jobs(jobs, nodes)
        node_counts(jobs, nodes, limited)
    except ValueError as exc:
        raise click.ClickException(f"{workload_path}: {exc}") from None
    everywhere = frozenset(n.name for n in nodes)
    for job in jobs:
        may = limited.get(job.job_id, everywhere)
        most = max(n.gpus for n in nodes if n.name in may)
        if job.gang_size > most or job.node_count > 1:
            raise click.ClickException(
                f"{workload_path}: job {job.job_id} asks for {job.gang_size} GPUs on "
                f"{job.node_count} node(s), and the largest node it may run on has {most}: "
                "bench live's stand-in is one process, submitted on one node (simulate runs "
                "multi-node jobs)")
    return nodes, jobs


def arm_policy_options(arms: list[str], assignments: tuple[str, ...]
                       ) -> dict[str, dict[str, Any]]:
    """Each policy arm's options from --policy-option (`native` takes none)."""
    from ..livebench.arms import NATIVE

    policies = [a for a in arms if a != NATIVE]
    if assignments and not policies:
        raise click.BadParameter("no policy arm to take it", param_hint="'--policy-option'")
    try:
        return benchmark_policy_options(policies, assignments,
                                        sets_itself="--round-seconds; the gate is off")
    except ShockslurmError as exc:
        raise click.ClickException(str(exc)) from None


def _simulate_only(jobs: list[JobSpec], arms: list[str], nodes: tuple[Node, ...],
                   round_s: float, restart_overhead_s: float, json_out: Path | None,
                   options: dict[str, dict[str, Any]]) -> None:
    """Each arm's prediction and the bounds, without running anything on Slurm."""
    from ..livebench.report import markdown_table, predict, workload_bounds

    gpus = sum(n.gpus for n in nodes)
    try:
        results = [{"arm": arm, "simulated": predict(jobs, arm, nodes, round_s,
                                                     restart_overhead_s, options.get(arm))}
                   for arm in arms]
    except ValueError as exc:
        raise click.ClickException(f"cannot simulate the workload: {exc}") from None
    bounds = workload_bounds(jobs, gpus)
    if json_out is not None:
        write_output(json_out, json.dumps({"bounds": bounds, "round_seconds": round_s,
                                           "restart_overhead_s": restart_overhead_s,
                                           "policy_options": {a: o for a, o in options.items()
                                                              if o},
                                           "arms": results}, indent=2) + "\n", "--json")
    click.echo(markdown_table(results))
    _echo_bounds(bounds)


def _echo_bounds(bounds: dict[str, float]) -> None:
    click.echo(f"\nNo scheduler does better than: worst rho {bounds['worst_rho']:.2f} (fluid "
               f"relaxation), average JCT {bounds['avg_jct_s']:.0f} s (every job alone), "
               f"makespan {bounds['makespan_s']:.0f} s (the work after each arrival on every "
               f"GPU).")


def _plots(results: list[dict], plot_dir: Path) -> None:
    from ..ops.plots import RunSeries, write_run_plots

    repeated = any(r.get("repeat", 1) != 1 for r in results)
    series = [RunSeries(label=f"run {r['repeat']} {r['arm']}" if repeated else str(r["arm"]),
                        policy=str(r["arm"]),
                        timeline=[tuple(b) for b in r["series"]["timeline"]],
                        utilisation=[tuple(s) for s in r["series"]["utilisation"]],
                        rho=list(r["series"]["rho"])) for r in results]
    for path in write_run_plots(series, plot_dir):
        click.echo(f"wrote {path}", err=True)

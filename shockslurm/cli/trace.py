"""`shockslurm trace`: generate synthetic workloads, convert reference traces."""

from __future__ import annotations

from pathlib import Path
from typing import Mapping

import click

from ..errors import ShockslurmError
from ..workload.checks import is_compressed
from ..workload.generator import GeneratorConfig, generate
from ..workload.jsonl import write_jobs
from ..sim.reference_profiles import load_reference_trace, with_reference_profiles
from ..workload.reference import read_throughputs, reference_jobs
from ..workload.reference_like import (ReferenceLikeConfig, catalogue_throughputs,
                                       generate_reference_like, write_reference_trace)
from .options import jobs_option, jobs_per_hour_option, seed_option
from .paths import OutputFile, refuse_inputs_as_outputs


def is_jsonl(trace: Path) -> bool:
    """Whether a workload file is in our JSON Lines format (else a reference TSV trace), by its
    name less a `.gz` (a compressed file of either)."""
    name = trace.stem if is_compressed(trace) else trace.name
    return Path(name).suffix.lower() in (".jsonl", ".json")


@click.group("trace")
def trace_group() -> None:
    """Workload files: generate synthetic traces, convert reference traces."""


@trace_group.command("generate")
@click.option("--like", type=click.Choice(("builtin", "reference")), default="builtin",
              show_default=True,
              help="'builtin': our synthetic workload from the model catalogue; 'reference': "
                   "drawn the way the Shockwave reference's trace generator draws its jobs "
                   "(README: Reference-like workloads).")
@jobs_option(None, f"Jobs to draw (default {GeneratorConfig.jobs}; --like reference: "
                   f"{ReferenceLikeConfig.jobs}).")
@seed_option(GeneratorConfig.seed)
@jobs_per_hour_option(None, f"Mean arrival rate, Poisson (default "
                            f"{GeneratorConfig.jobs_per_hour:g}; --like reference: "
                            f"{3600 / ReferenceLikeConfig.mean_interarrival_s:.1f}, the "
                            "reference 120-job trace's rate on 32 GPUs).")
@click.option("--throughputs", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="--like reference: the reference throughput JSON (e.g. "
                   "../shared/data/shockwave-120/throughputs-tacc.json) that sets each job's "
                   "length in iterations; without it the built-in catalogue's throughput model "
                   "is used.")
@click.option("--out", type=OutputFile(), required=True,
              help="Output file, in our JSONL format; with --like reference a name not ending "
                   "in .jsonl/.json is written as a reference TSV trace (needs --throughputs).")
def trace_generate(like: str, jobs: int | None, seed: int, jobs_per_hour: float | None,
                   throughputs: Path | None, out: Path) -> None:
    """Generate a synthetic workload."""
    refuse_inputs_as_outputs({"--out": out}, {"--throughputs": throughputs})
    if like == "builtin":
        if throughputs is not None:
            raise click.UsageError("--throughputs applies to --like reference only")
        config = GeneratorConfig(jobs=jobs or GeneratorConfig.jobs, seed=seed,
                                 jobs_per_hour=jobs_per_hour or GeneratorConfig.jobs_per_hour)
        specs = generate(config)
        write_jobs(specs, out)
        click.echo(f"wrote {len(specs)} jobs to {out}")
        return
    try:
        _generate_reference_like(jobs, seed, jobs_per_hour, throughputs, out)
    except (ShockslurmError, ValueError) as exc:
        raise click.ClickException(str(exc)) from None


def _generate_reference_like(jobs: int | None, seed: int, jobs_per_hour: float | None,
                             throughputs: Path | None, out: Path) -> None:
    if throughputs is None and not is_jsonl(out):
        raise click.UsageError("a reference TSV trace is simulated with its throughput file: "
                               "give --throughputs FILE, or name --out *.jsonl to use the "
                               "built-in catalogue's throughputs")
    config = ReferenceLikeConfig(
        jobs=jobs or ReferenceLikeConfig.jobs, seed=seed,
        mean_interarrival_s=(3600.0 / jobs_per_hour if jobs_per_hour
                             else ReferenceLikeConfig.mean_interarrival_s))
    if throughputs is None:
        click.echo("note: no --throughputs given: job lengths use the built-in catalogue's "
                   "throughput model, not the reference's measured throughputs", err=True)
        table: Mapping[tuple[str, int], float] = catalogue_throughputs()
    else:
        table = read_throughputs(throughputs)
    drawn = generate_reference_like(config, table)
    if is_jsonl(out):
        write_jobs(with_reference_profiles(reference_jobs([d.line for d in drawn], table,
                                                          str(out))), out)
        hint = f"--trace {out} --adaptation reference"
    else:
        write_reference_trace(drawn, out)
        hint = f"--trace {out} --throughputs {throughputs}"
    click.echo(f"wrote {len(drawn)} jobs to {out}")
    click.echo(f"simulate with: shockslurm simulate {hint} --gpus G", err=True)


@trace_group.command("convert")
@click.option("--trace", type=click.Path(exists=True, dir_okay=False, path_type=Path), required=True)
@click.option("--throughputs", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              required=True)
@click.option("--profiles", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--out", type=OutputFile(), required=True)
def trace_convert(trace: Path, throughputs: Path, profiles: Path | None, out: Path) -> None:
    """Convert a reference TSV trace (+ throughputs, profiles) to our JSONL format."""
    refuse_inputs_as_outputs({"--out": out}, {"--trace": trace, "--throughputs": throughputs,
                                              "--profiles": profiles})
    try:
        specs = load_reference_trace(trace, throughputs, profiles)
    except ShockslurmError as exc:
        raise click.ClickException(str(exc)) from None
    write_jobs(specs, out)
    click.echo(f"wrote {len(specs)} jobs to {out}")

"""`shockslurm`: the admin's and researcher's command line. Only this package wires layers together.

Subcommands load lazily: `shockslurm --help` (and `shocksub`'s base install, which has no
solver, store or plotting library) imports only click; a subcommand's module, with its
dependencies, is imported when that subcommand runs or shows its own help.
"""

from __future__ import annotations

import importlib
import logging

import click

from .. import __version__
from .output_errors import OutputErrors

# name -> (module:attribute of the click command, its one-line summary for `shockslurm --help`;
# tests/test_cli_lazy.py checks that each summary is the command's own).
COMMANDS: dict[str, tuple[str, str]] = {
    "bench": ("shockslurm.cli.main:_bench_group", "Benchmarks; each prints its results as JSON "
              "(quality, switch-cost, live and live-family: Markdown tables, JSON with "
              "--json)."),
    "config": ("shockslurm.cli.config:config_group", "The daemon's configuration file: check "
               "it, print an example, list the keys."),
    "daemon": ("shockslurm.cli.daemon:daemon_cmd", "Schedule managed Slurm jobs with a policy, "
               "one round every round_seconds."),
    "db": ("shockslurm.cli.db:db_group", "The SQL store of jobs, rounds, throughput and "
           "adaptation history."),
    "report": ("shockslurm.cli.report:report_cmd", "Draw each run's GPU timeline and "
               "utilisation, and rho per policy, as PNG files."),
    "simulate": ("shockslurm.cli.simulate:simulate_cmd", "Simulate policies on a workload and "
                 "print makespan, JCT, fairness and utilisation."),
    "status": ("shockslurm.cli.status:status_cmd", "Managed jobs: state, GPUs, epochs done, "
               "forecast remaining, rho estimate, preemptions."),
    "trace": ("shockslurm.cli.trace:trace_group", "Workload files: generate synthetic traces, "
              "convert reference traces."),
}


def load_command(name: str) -> click.Command:
    """Import the subcommand `name` (a key of COMMANDS)."""
    module, attr = COMMANDS[name][0].split(":")
    command = getattr(importlib.import_module(module), attr)
    return command() if attr.startswith("_") else command


def _bench_group() -> click.Command:
    """`shockslurm bench` with the switch-cost sweep, the live benchmark and its workload family
    (their own modules)."""
    from .bench import bench_group
    from .bench_live import live_cmd
    from .bench_live_family import live_family_cmd
    from .bench_switch import switch_cost_cmd

    bench_group.add_command(switch_cost_cmd)
    bench_group.add_command(live_cmd)
    bench_group.add_command(live_family_cmd)
    return bench_group


class LazyGroup(OutputErrors, click.Group):
    """A group whose subcommands are imported only when used (COMMANDS)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        return load_command(cmd_name) if cmd_name in COMMANDS else None

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        names = self.list_commands(ctx)
        limit = formatter.width - 6 - max(map(len, names))
        rows = [(name, click.Command(name, help=COMMANDS[name][1]).get_short_help_str(limit))
                for name in names]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="shockslurm")
@click.option("--log-level", type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"]),
              default="WARNING", show_default=True, help="Log verbosity (stderr).")
def cli(log_level: str) -> None:
    """Shockwave scheduling for dynamic-adaptation ML jobs: simulate it, run it beside Slurm."""
    logging.basicConfig(level=log_level, format="shockslurm %(levelname)s %(name)s: %(message)s")


def main() -> None:  # pragma: no cover - console entry point
    cli(prog_name="shockslurm")


if __name__ == "__main__":  # pragma: no cover
    main()

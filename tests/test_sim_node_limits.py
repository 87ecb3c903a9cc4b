"""Node limits in the simulator: a workload's job may name the nodes it can run on (JSONL
`nodes`, `JobSpec.allowed_nodes`), as a live job's partition, `--exclude` or `--constraint` limit
it; every policy's simulated rounds keep it there, and `bench live` submits it with the
equivalent `--exclude`."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from shockslurm.cli.main import cli
from shockslurm.errors import InputError
from shockslurm.livebench.arms import ArmSettings, native_argv, node_limits, shocksub_argv
from shockslurm.model import parse_cluster_shape
from shockslurm.policies import PolicySettings, policy_names
from shockslurm.sim import run as sim_run
from shockslurm.sim.cluster import SimulatedCluster
from shockslurm.sim.job_nodes import limited_jobs
from shockslurm.sim.run import SimConfig, simulate
from shockslurm.workload.generator import GeneratorConfig, generate
from shockslurm.workload.jsonl import job_to_row, parse_job

ROW = {"model": "ResNet-18", "gpus": 2, "arrival_s": 0.0, "epochs": 3, "schedule": [[0, 32]]}


def test_a_rows_nodes_are_read_and_written_back():
    job = parse_job({**ROW, "nodes": ["node02", "node01", "node02"]}, index=0)
    assert job.allowed_nodes == frozenset({"node01", "node02"})
    row = job_to_row(job)
    assert row["nodes"] == ["node01", "node02"]
    assert parse_job(json.loads(json.dumps(row)), index=0).allowed_nodes == job.allowed_nodes
    assert parse_job(ROW, index=0).allowed_nodes is None
    assert "nodes" not in job_to_row(parse_job(ROW, index=0))


@pytest.mark.parametrize("nodes, says", [
    ("node01", "must list 1..100,000 node names"),
    ([], "must list 1..100,000 node names"),
    (["node01", "a b"], "must be 1-64 characters"),
    (["node01", 7], "must be 1-64 characters"),
])
def test_bad_nodes_name_the_field_and_line(nodes, says):
    with pytest.raises(InputError) as err:
        parse_job({**ROW, "nodes": nodes}, index=0, source="w.jsonl", line=4)
    assert err.value.field == "nodes" and err.value.line == 4
    assert says in str(err.value)


def _workload(limits: dict[int, frozenset[str]], jobs: int = 24, seed: int = 3):
    specs = generate(GeneratorConfig(jobs=jobs, seed=seed, jobs_per_hour=60.0,
                                     max_exclusive_hours=0.5))
    return [replace(j, allowed_nodes=limits.get(j.job_id)) for j in specs]


class _Checked(SimulatedCluster):
    """A simulated cluster that asserts, every round, that each job it runs is on its nodes
    and no node holds more GPUs than it has."""

    def enact(self, plan, snapshot):
        super().enact(plan, snapshot)
        used: dict[str, int] = {}
        for job_id, shares in self._where.items():
            gang = self.sim_jobs[job_id].spec.gang_size
            assert sum(g for _, g in shares) == gang
            allowed = self.sim_jobs[job_id].spec.allowed_nodes
            assert allowed is None or {n for n, _ in shares} <= allowed, (job_id, shares)
            for name, gpus in shares:
                used[name] = used.get(name, 0) + gpus
        capacity = {n.name: n.gpus for n in self.nodes}
        assert all(used[n] <= capacity[n] for n in used), used


@pytest.mark.parametrize("live_like", [False, True])
@pytest.mark.parametrize("policy", policy_names())
def test_every_policy_keeps_limited_jobs_on_their_nodes(monkeypatch, policy, live_like):
    nodes = parse_cluster_shape("3x4")
    limits = {j: frozenset({"node03"}) if j % 3 == 0 else frozenset({"node01", "node02"})
              for j in range(0, 24, 2)}
    jobs = [j for j in _workload(limits) if j.gang_size <= 4]
    monkeypatch.setattr(sim_run, "SimulatedCluster", _Checked)
    config = SimConfig.for_nodes(nodes, settings=PolicySettings(round_s=360.0),
                                 fill_on_completion=live_like, keep_partial_iterations=live_like)
    result = simulate(jobs, policy, config)
    assert len(result.outcomes) == len(jobs)      # every job ends


def test_limits_cost_simulated_time():
    """Two 4-GPU jobs limited to one node of two run one after the other."""
    nodes = parse_cluster_shape("2x4")
    base = parse_job({**ROW, "gpus": 4, "epochs": 2}, index=0)
    free = [replace(base, job_id=i) for i in range(2)]
    limited = [replace(j, allowed_nodes=frozenset({"node01"})) for j in free]
    config = SimConfig.for_nodes(nodes, settings=PolicySettings(round_s=60.0),
                                 restart_overhead_s=0.0)
    alone = base.exclusive_runtime_s
    apart = simulate(free, "fifo", config).metrics.makespan_s
    together = simulate(limited, "fifo", config).metrics.makespan_s
    assert apart == pytest.approx(alone, rel=0.05)
    assert together == pytest.approx(2 * alone, rel=0.05)


@pytest.mark.parametrize("shape, limit, gang, says", [
    (None, {"node01"}, 1, "the cluster is one pool of GPUs: give its nodes (--cluster)"),
    ("2x4", {"node09"}, 1, "limited to nodes the cluster does not have: node09 "
                           "(the cluster's: node01, node02)"),
    ("2x4", set(), 1, "limited to nodes the cluster does not have: none named"),
    ("2x4", {"node02"}, 8, "needs 8 GPUs, more than its nodes hold (4)"),
])
def test_limits_the_cluster_cannot_meet_are_refused(shape, limit, gang, says):
    job = replace(parse_job({**ROW, "gpus": gang}, index=5), allowed_nodes=frozenset(limit))
    nodes = parse_cluster_shape(shape) if shape else ()
    with pytest.raises(ValueError, match=r"^job 5 ") as err:
        SimulatedCluster(8, [job], nodes=nodes)
    assert says in str(err.value)


def test_simulate_refuses_them_in_one_line(tmp_path: Path):
    trace = tmp_path / "w.jsonl"
    trace.write_text(json.dumps({**ROW, "nodes": ["gpu07"]}) + "\n")
    result = CliRunner().invoke(cli, ["simulate", "--trace", str(trace), "--cluster", "2x4",
                                      "--policy", "fifo", "--no-progress"])
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit), result.output
    assert "job 0 is limited to nodes the cluster does not have: gpu07" in result.output


def test_bench_live_submits_a_limit_as_the_other_nodes_excluded(tmp_path: Path):
    settings = ArmSettings(workdir=tmp_path, node_names=("gpu01", "gpu02", "gpu03", "gpu04"))
    job = replace(parse_job(ROW, index=0), allowed_nodes=frozenset({"gpu02", "gpu04"}))
    assert node_limits(job, settings) == ["--exclude=gpu01,gpu03"]
    assert node_limits(replace(job, allowed_nodes=None), settings) == []
    everywhere = replace(job, allowed_nodes=frozenset(settings.node_names))
    assert node_limits(everywhere, settings) == []
    for build in (native_argv, shocksub_argv):
        argv = build(job, "bl-0", settings, tmp_path, ["true"])
        assert "--exclude=gpu01,gpu03" in argv[:argv.index("--wrap") if "--wrap" in argv
                                                else argv.index("--")]


def test_bench_live_needs_the_clusters_names_for_a_limit(tmp_path: Path):
    from shockslurm.livebench.arms import ArmError

    job = replace(parse_job(ROW, index=3), allowed_nodes=frozenset({"gpu02"}))
    with pytest.raises(ArmError, match="job 3 is limited to nodes"):
        node_limits(job, ArmSettings(workdir=tmp_path))


def test_bench_live_refuses_a_job_no_node_of_its_own_holds(tmp_path: Path):
    """bench live submits every job on one node: a gang only several of its nodes hold would
    never start live (the simulator would span it)."""
    trace = tmp_path / "w.jsonl"
    trace.write_text(json.dumps({**ROW, "gpus": 6, "nodes": ["node01", "node02"]}) + "\n")
    result = CliRunner().invoke(cli, ["bench", "live", "--simulate-only", "--cluster",
                                      "2x4,1x8", "--workload", str(trace), "--arms", "fifo"])
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit), result.output
    assert ("job 0 asks for 6 GPUs on 1 node(s), and the largest node it may run on has 4: "
            "bench live's stand-in is one process, submitted on one node") in result.output
    assert CliRunner().invoke(cli, ["bench", "live", "--simulate-only", "--cluster", "2x4",
                                    "--workload", str(trace), "--arms", "fifo"]).exit_code == 1


def test_bench_live_takes_cluster_only_to_simulate(tmp_path: Path):
    result = CliRunner().invoke(cli, ["bench", "live", "--cluster", "4x8", "--arms", "fifo"])
    assert result.exit_code == 2 and "--cluster describes the nodes for --simulate-only" \
        in result.output, result.output


def test_bench_live_refuses_a_workload_naming_nodes_it_lacks(tmp_path: Path):
    trace = tmp_path / "w.jsonl"
    trace.write_text(json.dumps({**ROW, "nodes": ["gpu07"]}) + "\n")
    result = CliRunner().invoke(cli, ["bench", "live", "--simulate-only", "--cluster", "2x4",
                                      "--workload", str(trace), "--arms", "native,fifo"])
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit), result.output
    assert (f"Error: {trace}: job 0 is limited to nodes the cluster does not have: gpu07"
            in result.output)


def test_limited_jobs_is_empty_without_limits():
    assert limited_jobs(_workload({}), parse_cluster_shape("4x8")) == {}


def test_every_node_named_is_no_limit():
    """As the daemon reads it (`NodeLimits.allowed`: None) and bench live submits it (no
    --exclude): the same plans as without the field."""
    nodes = parse_cluster_shape("4x8")
    everywhere = frozenset(n.name for n in nodes)
    free = _workload({}, jobs=30, seed=2)
    named = [replace(j, allowed_nodes=everywhere) if j.job_id % 2 else j for j in free]
    assert limited_jobs(named, nodes) == {}
    config = SimConfig.for_nodes(nodes, settings=PolicySettings(round_s=360.0))
    for policy in ("max_min_fairness", "shockwave"):
        a, b = simulate(free, policy, config), simulate(named, policy, config)
        assert [(o.job_id, o.completion_s) for o in a.outcomes] == \
            [(o.job_id, o.completion_s) for o in b.outcomes]

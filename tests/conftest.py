"""Shared fixtures: small hand-made jobs, and the reference data beside the repository."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import settings

from shockslurm.model import JobSpec, JobView

# No property test is timed: Hypothesis's default 200 ms per example fails on a loaded machine.
settings.register_profile("shockslurm", deadline=None)
settings.load_profile("shockslurm")

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("SHOCKSLURM_SHARED_DATA",
                                  REPO.parent / "shared" / "data" / "shockwave-120"))
# CI (.ci/run) sets it: Slurm, PostgreSQL, torch and the reference data are all there, so a test
# that would skip for want of one of them fails instead, and so does any other skip.
REQUIRE_ALL = os.environ.get("SHOCKSLURM_REQUIRE_ALL") == "1"


def skip_unless_required(reason: str) -> None:
    """Skip for a missing component (a developer's machine), fail where all are required."""
    if REQUIRE_ALL:
        pytest.fail(f"{reason} (SHOCKSLURM_REQUIRE_ALL=1: nothing may skip here)")
    pytest.skip(reason)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """With SHOCKSLURM_REQUIRE_ALL=1 any skip (importorskip included) fails the run."""
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    skipped = reporter.stats.get("skipped", []) if reporter is not None else []
    if REQUIRE_ALL and skipped:
        reporter.write_line(f"SHOCKSLURM_REQUIRE_ALL=1: {len(skipped)} skipped; nothing may skip "
                            "here", red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked `cuda` need a GPU, which CI never has (README "Training helper" says where
    they last ran on one): where torch sees none they are deselected, and pytest's summary
    counts them as such, rather than skipped."""
    cuda = [item for item in items if item.get_closest_marker("cuda") is not None]
    if not cuda or _cuda_available():
        return
    config.hook.pytest_deselected(items=cuda)
    items[:] = [item for item in items if item.get_closest_marker("cuda") is None]


@pytest.fixture(scope="session")
def reference_data() -> Path:
    if not (SHARED_DATA / "trace-120jobs.tsv").exists():
        skip_unless_required(f"reference data not found at {SHARED_DATA} "
                             "(set SHOCKSLURM_SHARED_DATA)")
    return SHARED_DATA


def make_spec(job_id: int = 0, *, epochs: int = 4, bs: int = 32, gang: int = 1,
              arrival: float = 0.0, samples: int = 1000, ips: float = 1.0,
              schedule: list[int] | None = None, mode: str = "static",
              throughput: dict[int, float] | None = None, model: str = "ResNet-18") -> JobSpec:
    """A job whose epoch at batch size `bs` lasts `ceil(samples/bs)/ips` seconds."""
    schedule = schedule or [bs] * epochs
    rates = throughput or {b: ips for b in set(schedule)}
    return JobSpec(job_id=job_id, job_type=f"{model} (batch size {schedule[0]})", model=model,
                   dataset="CIFAR-10", samples_per_epoch=samples, gang_size=gang,
                   arrival_s=arrival, mode=mode, batch_sizes=tuple(schedule),
                   epoch_durations=tuple(samples / b / rates[b] for b in schedule),
                   throughput=rates)


def make_view(job_id: int = 0, *, gang: int = 1, ips: float = 1.0, remaining: float = 100.0,
              arrival: float = 0.0, ran_last_round: bool = False, run_time: float = 0.0,
              epochs: int = 10, done: float = 0.0) -> JobView:
    return JobView(job_id=job_id, gang_size=gang, arrival_s=arrival, num_epochs=epochs,
                   epochs_done=done, batch_size=32, iterations_per_s=ips,
                   remaining_iterations=remaining, iterations_per_epoch=10,
                   observed_batch_sizes=(), profile_batch_sizes=(32,) * epochs,
                   profile_epoch_durations=(10.0 / ips,) * epochs,
                   exclusive_runtime_s=10.0 * epochs / ips, run_time_s=run_time,
                   ran_last_round=ran_last_round)

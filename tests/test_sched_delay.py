"""`slurm.sched_delay`: reading `batch_sched_delay` from `scontrol show config`, and the daemon's
start-up advice when slurmctld may start a released job seconds late."""

from __future__ import annotations

from typing import Sequence

import pytest

from shockslurm.slurm.sched_delay import (DEFAULT_BATCH_SCHED_DELAY_S, batch_sched_delay,
                                          release_delay_advice, scheduler_parameters)
from shockslurm.slurm.types import CommandResult

SHOW_CONFIG = """Configuration data as of 2026-11-25T18:30:00
AccountingStorageType   = (null)
SchedulerParameters     = {params}
SchedulerTimeSlice      = 30 sec
SchedulerType           = sched/backfill
"""


@pytest.mark.parametrize("params, seconds", [
    ("bf_interval=5,sched_interval=5,batch_sched_delay=0", 0.0),
    ("batch_sched_delay=10", 10.0),
    (" batch_sched_delay = 2 ,bf_interval=5", 2.0),
    ("bf_interval=5,sched_interval=5", DEFAULT_BATCH_SCHED_DELAY_S),
    ("(null)", DEFAULT_BATCH_SCHED_DELAY_S),
    ("batch_sched_delay=soon", DEFAULT_BATCH_SCHED_DELAY_S),
    ("batch_sched_delay=-1", DEFAULT_BATCH_SCHED_DELAY_S),
])
def test_batch_sched_delay_reads_the_value_or_slurms_default(params: str, seconds: float) -> None:
    assert batch_sched_delay(params) == seconds


def test_scheduler_parameters_is_read_from_show_config() -> None:
    text = SHOW_CONFIG.format(params="bf_interval=5,batch_sched_delay=0")
    assert scheduler_parameters(text) == "bf_interval=5,batch_sched_delay=0"
    assert scheduler_parameters("SchedulerType = sched/backfill\n") is None


def _runner(stdout: str, returncode: int = 0, calls: list | None = None):
    def run(argv: Sequence[str]) -> CommandResult:
        if calls is not None:
            calls.append(tuple(argv))
        return CommandResult(tuple(argv), returncode, stdout, "", 0.01)
    return run


def test_advice_names_the_delay_and_the_setting_when_slurm_may_wait() -> None:
    calls: list = []
    advice = release_delay_advice(_runner(SHOW_CONFIG.format(params="bf_interval=30"), 0, calls))
    assert calls == [("scontrol", "show", "config")]
    assert advice is not None
    assert "up to 3 s" in advice and "batch_sched_delay=0" in advice


@pytest.mark.parametrize("params", ["batch_sched_delay=0", "batch_sched_delay=1"])
def test_no_advice_when_the_delay_is_short(params: str) -> None:
    assert release_delay_advice(_runner(SHOW_CONFIG.format(params=params))) is None


def test_no_advice_when_the_configuration_cannot_be_read() -> None:
    assert release_delay_advice(_runner("", returncode=1)) is None

    def broken(argv: Sequence[str]) -> CommandResult:
        raise OSError("scontrol: not found")
    assert release_delay_advice(broken) is None

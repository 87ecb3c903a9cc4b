"""Prometheus metrics rendered from a fake round sequence (no Slurm, no HTTP needed), plus one
scrape over HTTP on a free port; each daemon has its own registry."""

from __future__ import annotations

import socket
import urllib.request
from types import SimpleNamespace as NS

from prometheus_client.parser import text_string_to_metric_families

from shockslurm.ops.metrics import DaemonMetrics, MetricsJournal, stderr_class
from shockslurm.slurm.types import CommandResult


def _samples(metrics: DaemonMetrics) -> dict[tuple[str, tuple], float]:
    out = {}
    for fam in text_string_to_metric_families(metrics.render().decode()):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def _view(job_id: int, remaining_iterations: float, ips: float, run_time_s: float):
    return NS(job_id=job_id, remaining_iterations=remaining_iterations, iterations_per_s=ips,
              run_time_s=run_time_s)


def test_fake_round_sequence():
    m = DaemonMetrics()
    # round 0 at t=0: job 1 running (forecast 100 s left), job 2 pending
    m.record_round(now=0.0, round_duration_s=0.4, solve_s=0.01, gpus_allocated=4, gpus_schedulable=8,
                   states={1: "RUNNING", 2: "PENDING"},
                   views={1: _view(1, 1000, 10, 20), 2: _view(2, 500, 5, 0)})
    # round 1 at t=60: job 1 still running (run time 80), job 2 running now (forecast 90 s)
    m.record_round(now=60.0, round_duration_s=3.0, solve_s=0.2, gpus_allocated=8, gpus_schedulable=8,
                   states={1: "RUNNING", 2: "RUNNING"},
                   views={1: _view(1, 400, 10, 80), 2: _view(2, 450, 5, 0)})
    # round 2 at t=120: job 1 gone (ended between 60 and 120: actual = 80-20+30 = 90)
    m.record_round(now=120.0, round_duration_s=0.5, solve_s=0.02, gpus_allocated=2, gpus_schedulable=8,
                   states={2: "COMPLETING"}, views={})
    s = _samples(m)
    assert s[("shockslurm_rounds_total", ())] == 3
    assert s[("shockslurm_round_duration_seconds_count", ())] == 3
    assert abs(s[("shockslurm_round_duration_seconds_sum", ())] - 3.9) < 1e-9
    assert abs(s[("shockslurm_solve_duration_seconds_sum", ())] - 0.23) < 1e-9
    assert s[("shockslurm_solve_duration_seconds_bucket", (("le", "0.05"),))] == 2
    assert s[("shockslurm_gpus_allocated", ())] == 2 and s[("shockslurm_gpus_schedulable", ())] == 8
    assert s[("shockslurm_managed_jobs", (("state", "COMPLETING"),))] == 1
    assert s[("shockslurm_managed_jobs", (("state", "RUNNING"),))] == 0
    assert s[("shockslurm_managed_jobs", (("state", "PENDING"),))] == 0
    assert s[("shockslurm_last_round_timestamp_seconds", ())] == 120
    # job 1: |100 - 90| = 10; job 2 (COMPLETING at 120, running at 60 with run time 0, forecast
    # 90): actual 0 - 0 + 30 = 30 -> |90 - 30| = 60
    assert s[("shockslurm_forecast_abs_error_seconds_count", ())] == 2
    assert s[("shockslurm_forecast_abs_error_seconds_sum", ())] == 70


def test_job_that_ends_while_pending_is_not_a_forecast_sample():
    m = DaemonMetrics()
    m.record_round(now=0, round_duration_s=0, solve_s=0, gpus_allocated=0, gpus_schedulable=8,
                   states={1: "RUNNING"}, views={1: _view(1, 100, 1, 0)})
    m.record_round(now=10, round_duration_s=0, solve_s=0, gpus_allocated=0, gpus_schedulable=8,
                   states={1: "PENDING"}, views={1: _view(1, 90, 1, 10)})
    m.record_round(now=20, round_duration_s=0, solve_s=0, gpus_allocated=0, gpus_schedulable=8,
                   states={}, views={})
    assert _samples(m)[("shockslurm_forecast_abs_error_seconds_count", ())] == 0


def test_enactment_failures_by_verb_and_class():
    m = DaemonMetrics()
    calls = []

    class Inner:
        def begin_round(self, *a):
            calls.append("begin")

        def intent(self, step):
            return ["h", step.action]

        def outcome(self, handle, result):
            calls.append((handle, result.returncode))

    j = MetricsJournal(Inner(), m)
    j.begin_round(None, None, None)
    for action, ids, rc, err in [
            ("release", (1, 2, 3), 1, "slurm_release_job error: Invalid job id specified"),
            ("requeuehold", (4,), 1, "Job is no longer pending execution"),
            ("signal", (5,), 0, ""),
            ("update", (6,), -1, "OSError: [Errno 2] No such file"),
            ("release", (7,), 1, "Access/permission denied")]:
        step = NS(action=action, job_ids=ids, argv=("scontrol", action))
        j.outcome(j.intent(step), CommandResult(("x",), rc, "", err, 0.0))
    assert calls[0] == "begin" and calls[1] == (["h", "release"], 1)
    s = _samples(m)
    f = "shockslurm_enactment_failures_total"
    assert s[(f, (("action", "release"), ("reason", "invalid_job")))] == 3
    assert s[(f, (("action", "requeuehold"), ("reason", "job_state")))] == 1
    assert s[(f, (("action", "update"), ("reason", "backend_error")))] == 1
    assert s[(f, (("action", "release"), ("reason", "permission")))] == 1
    assert not any(k[0] == f and ("action", "signal") in k[1] for k in s)
    assert stderr_class(1, "something odd") == "other"
    # without a store journal (dry run) the counter still works
    j2 = MetricsJournal(None, m)
    j2.outcome(j2.intent(NS(action="hold", job_ids=(9,))),
               CommandResult(("x",), 2, "", "Socket timed out", 0.0))
    assert _samples(m)[(f, (("action", "hold"), ("reason", "timeout")))] == 1


def test_registries_are_separate_and_served_over_http():
    a, b = DaemonMetrics(), DaemonMetrics()
    a.rounds.inc(5)
    assert _samples(b)[("shockslurm_rounds_total", ())] == 0
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    stop = a.serve("127.0.0.1", port)
    try:
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read()
        assert b"shockslurm_rounds_total 5.0" in body
    finally:
        stop()


def test_names_follow_prometheus_conventions_and_process_metrics_exist():
    """promtool's rules: only counters end in `_total`; plus the process and build metrics."""
    m = DaemonMetrics()
    families = list(text_string_to_metric_families(m.render().decode()))
    for fam in families:
        if fam.type != "counter":
            assert not fam.name.endswith("_total"), fam.name
    names = {fam.name for fam in families}
    assert {"process_cpu_seconds", "process_resident_memory_bytes", "process_start_time_seconds",
            "python_info", "shockslurm_build_info", "shockslurm_gpus_schedulable"} <= names
    from shockslurm import __version__

    build = _samples(m)
    assert [v for (name, labels), v in build.items() if name == "shockslurm_build_info"
            and ("version", __version__) in labels] == [1.0]

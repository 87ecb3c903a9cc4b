"""Parsing of every recorded/reconstructed Slurm JSON sample, the state table, versions, errors,
and the backend-choosing logic (with a fake pyslurm injected)."""

from __future__ import annotations

import json
import logging
import sys
import types

import pytest

from shockslurm.errors import InputError
from shockslurm.slurm import backend as backend_mod
from shockslurm.slurm.cli_backend import CliBackend
from shockslurm.slurm.gres import gpu_count, gpu_indices
from shockslurm.slurm.parse import parse_job, parse_scontrol_line, parse_sinfo, parse_squeue
from shockslurm.slurm.pyslurm_backend import PyslurmBackend
from shockslurm.slurm.states import parse_job_state
from shockslurm.slurm.types import CommandResult, JobState, SlurmVersion
from shockslurm.slurm.version import detect_version, parse_version_text, version_from_meta

from .slurm_samples import RECONSTRUCTED, RECORDED, VERSIONS, load

NEWER_RECORDED = RECORDED[1:]    # recorded live like 22.05, at another moment, other job ids


def test_the_live_22_05_samples_parse_to_what_they_hold():
    jobs = parse_squeue(load("squeue", "22.05"))
    assert [(j.job_id, j.state, j.partition, j.managed) for j in jobs] == [
        (3, JobState.PENDING, "gpu", True), (4, JobState.RUNNING, "gpu", True),
        (5, JobState.PENDING, "gpu", True), (6, JobState.RUNNING, "gpu", False),
        (7, JobState.PENDING, "gpu", True)]
    nodes = parse_sinfo(load("sinfo", "22.05"))
    assert [(n.name, n.state, n.gpus, n.gpus_used) for n in nodes] == [
        ("gpu01", "mixed", 8, 6), ("gpu02", "idle", 8, 0), ("gpu03", "idle", 8, 0),
        ("gpu04", "idle", 8, 0)]
    assert nodes[0].partitions == ("gpu", "urgent")


@pytest.mark.parametrize("ver", RECONSTRUCTED)
def test_every_reconstructed_squeue_sample_normalises_to_the_live_22_05_records(ver):
    expected = parse_squeue(load("squeue", "22.05"))
    assert parse_squeue(load("squeue", ver)) == expected


@pytest.mark.parametrize("ver", RECONSTRUCTED)
def test_every_reconstructed_sinfo_sample_normalises_to_the_live_22_05_records(ver):
    assert parse_sinfo(load("sinfo", ver)) == parse_sinfo(load("sinfo", "22.05"))


def _scenario(jobs: list) -> list[tuple]:
    """What the recording's five jobs must be on every version (ids, times, users, the plugin's
    gres spelling and which GPU indices a job got differ between recordings)."""
    return sorted((j.name, j.state, j.partition, j.managed, j.held, j.gpus_per_node,
                   j.gpus_per_job, j.gpus, j.nodes, bool(j.node_list), j.restart_count, j.comment,
                   j.reason, "REQUEUE_HOLD" in j.state_flags, len(j.gres_detail),
                   j.start_time is None, j.required_nodes,
                   j.admin_comment.replace("gres/gpu:", "gres:gpu:")) for j in jobs)


@pytest.mark.parametrize("ver", NEWER_RECORDED)
def test_recorded_squeue_samples_hold_the_22_05_scenario(ver):
    jobs = parse_squeue(load("squeue", ver))
    assert _scenario(jobs) == _scenario(parse_squeue(load("squeue", "22.05")))
    run = next(j for j in jobs if j.name == "rec-run")
    assert len(gpu_indices(run.gres_detail)) == 3
    assert len(jobs) == 5 and len({j.job_id for j in jobs}) == 5


@pytest.mark.parametrize("ver", NEWER_RECORDED)
def test_recorded_scontrol_json_gives_the_squeue_records(ver):
    """`scontrol show job --json` (23.02+) has the same job shape as `squeue --json`."""
    assert parse_squeue(load("scontrol", ver)) == parse_squeue(load("squeue", ver))


@pytest.mark.parametrize("ver", NEWER_RECORDED)
def test_recorded_sinfo_samples_hold_the_four_nodes(ver):
    for kind in ("sinfo", "sinfo-N"):       # the daemon reads `sinfo -N --json`
        nodes = {n.name: n for n in parse_sinfo(load(kind, ver))}
        assert set(nodes) == {"gpu01", "gpu02", "gpu03", "gpu04"}, kind
        assert all(n.gpus == 8 and set(n.partitions) == {"gpu", "urgent"} and n.usable
                   for n in nodes.values()), kind
        # rec-run (3 GPUs) is the only GPU job running: on one node with the CPU job
        used = sorted((n.gpus_used, n.state) for n in nodes.values())
        assert used == [(0, "idle")] * 3 + [(3, "mixed")], kind


@pytest.mark.parametrize("ver", NEWER_RECORDED)
def test_recorded_scontrol_text_keeps_tags_and_gres(ver):
    rows = {f["JobName"]: f for f in map(parse_scontrol_line, load("scontrol", ver, "txt")
                                         .splitlines())}
    assert rows["rec-held"]["Comment"] == "shock:spec=x;shock:managed"
    assert rows["rec-held"]["Priority"] == "0"
    assert rows["rec-run"]["GRES"].startswith("gpu:3(IDX:")
    assert "Comment" not in rows["rec-cpu"] and rows["rec-cpu"]["ReqNodeList"] == "(null)"


@pytest.mark.parametrize("ver", VERSIONS)
def test_sample_meta_gives_its_version(ver):
    for kind in ("squeue", "sinfo"):
        meta = json.loads(load(kind, ver))["meta"]
        assert "%d.%02d" % version_from_meta(meta).major_minor == ver


def test_live_22_05_jobs_fields():
    jobs = {j.name: j for j in parse_squeue(load("squeue", "22.05"))}
    held = jobs["rec-held"]
    assert held.managed and held.held and held.gpus_per_node == 2 and held.reason == "JobHeldUser"
    assert held.comment == "shock:spec=x;shock:managed" and held.start_time is None
    run = jobs["rec-run"]
    assert run.state is JobState.RUNNING and run.gpus == 3 and not run.held
    assert run.gres_detail == ("gpu:3(IDX:3-5)",) and gpu_indices(run.gres_detail) == (3, 4, 5)
    rq = jobs["rec-requeue"]
    assert rq.held and rq.restart_count == 1 and "REQUEUE_HOLD" in rq.state_flags
    cpu = jobs["rec-cpu"]
    assert not cpu.managed and cpu.gpus == 0
    g = jobs["rec-gpus"]
    assert g.gpus_per_job == 2 and g.gpus_per_node == 0 and g.gpus == 2


def test_live_22_05_nodes():
    nodes = {n.name: n for n in parse_sinfo(load("sinfo", "22.05"))}
    assert set(nodes) == {"gpu01", "gpu02", "gpu03", "gpu04"}
    assert nodes["gpu01"].gpus == 8 and nodes["gpu01"].gpus_used == 6
    assert nodes["gpu02"].partitions == ("gpu", "urgent") and nodes["gpu02"].usable


@pytest.mark.parametrize("value,state,flags", [
    ("PENDING", JobState.PENDING, set()), ("PD", JobState.PENDING, set()),
    ("R", JobState.RUNNING, set()), ("CG", JobState.COMPLETING, {"COMPLETING"}),
    ("CD", JobState.COMPLETED, set()), ("CA", JobState.CANCELLED, set()),
    ("F", JobState.FAILED, set()), ("TO", JobState.TIMEOUT, set()),
    ("NF", JobState.NODE_FAIL, set()), ("PR", JobState.PREEMPTED, set()),
    ("BF", JobState.BOOT_FAIL, set()), ("DL", JobState.DEADLINE, set()),
    ("OOM", JobState.OUT_OF_MEMORY, set()), ("S", JobState.SUSPENDED, set()),
    ("COMPLETING", JobState.COMPLETING, {"COMPLETING"}),          # 22.05: flag replaces base
    ("CONFIGURING", JobState.RUNNING, {"CONFIGURING"}),
    ("REQUEUED", JobState.PENDING, {"REQUEUED"}),
    (["PENDING", "REQUEUED"], JobState.PENDING, {"REQUEUED"}),    # 23.02+: lists
    (["RUNNING", "REQUEUED"], JobState.RUNNING, {"REQUEUED"}),
    (["PENDING", "REQUEUE_HOLD"], JobState.PENDING, {"REQUEUE_HOLD"}),
    (["COMPLETED", "COMPLETING"], JobState.COMPLETING, {"COMPLETING", "COMPLETED"}),
    (["RUNNING", "CONFIGURING"], JobState.RUNNING, {"CONFIGURING"}),
])
def test_state_table(value, state, flags):
    assert parse_job_state(value) == (state, frozenset(flags))


def test_unknown_state_warns_and_maps_to_unknown(caplog):
    with caplog.at_level(logging.WARNING):
        assert parse_job_state("WIBBLE", job_id=42)[0] is JobState.UNKNOWN
    assert "WIBBLE" in caplog.text and "42" in caplog.text
    assert parse_job_state(["RUNNING", "NEW_FLAG_2030"])[0] is JobState.RUNNING


@pytest.mark.parametrize("spec,n", [
    ("gres:gpu:3", 3), ("gres:gpu:a100:2", 2), ("gres/gpu:2", 2), ("gres/gpu:a100:4", 4),
    ("gres/gpu=2", 2), ("gpu:8", 8), ("gpu:h100:8(S:0-1)", 8), ("gpu:2(IDX:0-1)", 2),
    ("tmpsize:7T,gpu:l40s:4(S:0-1)", 4), ("gpu:l40s:1(IDX:0),tmpsize:10737418240", 1),
    ("gres:gpu:a100:1,gres:gpu:v100:2", 3), ("gres:shard:4", 0), ("N/A", 0), ("(null)", 0),
    ("", 0), ("gpu:a100", 1), ("gpu:4(IDX:0,2-3,5)", 4),
])
def test_gpu_count(spec, n):
    assert gpu_count(spec) == n


def _job(**over):
    rec = json.loads(load("squeue", "22.05"))["jobs"][0]
    rec.update(over)
    return rec


@pytest.mark.parametrize("field,value", [
    ("priority", "high"), ("priority", [1]), ("node_count", {"set": True, "number": "x"}),
    ("job_state", 5), ("job_state", None), ("comment", {"a": 1}), ("tres_per_node", "gres:gpu:x:y"),
    ("submit_time", True), ("gres_detail", [1, 2]),
])
def test_malformed_field_names_job_and_field(field, value):
    with pytest.raises(InputError) as exc:
        parse_job(_job(**{field: value}))
    assert exc.value.field == field and "job/node 3" in str(exc.value)


def test_malformed_documents():
    for bad in ("not json", "[]", '{"jobs": 3}', '{"meta": {}}'):
        with pytest.raises(InputError):
            parse_squeue(bad)
    with pytest.raises(InputError):
        parse_sinfo('{"something": []}')
    with pytest.raises(InputError) as exc:
        parse_squeue({"jobs": [{"job_state": "RUNNING"}]})
    assert exc.value.field == "job_id"


def test_numbers_objects_unset_and_infinite():
    j = parse_job(_job(priority={"set": False, "infinite": False, "number": 7},
                       node_count={"set": True, "infinite": False, "number": 3},
                       restart_cnt="2"))
    assert j.priority == 0 and j.nodes == 3 and j.restart_count == 2


def test_squeue_filters_are_not_trusted():
    """22.05's squeue --json ignores -j/-t: finished jobs come too and must parse."""
    doc = json.loads(load("squeue", "22.05"))
    doc["jobs"][0]["job_state"] = "CANCELLED"
    assert parse_squeue(doc)[0].state.finished


@pytest.mark.parametrize("text,ver", [
    ("slurm-wlm 22.05.8\n", (22, 5, 8)), ("slurm 23.11.4", (23, 11, 4)),
    ("slurm 24.05.0-0rc1", (24, 5, 0)), ("25.11.2", (25, 11, 2)),
])
def test_parse_version_text(text, ver):
    v = parse_version_text(text)
    assert (v.major, v.minor, v.micro) == ver


def test_version_from_meta_shapes_and_errors():
    assert version_from_meta({"Slurm": {"version": {"major": 22, "minor": 5, "micro": 8}}}) \
        == SlurmVersion(22, 5, 8)
    assert version_from_meta({"slurm": {"version": {"major": "25", "minor": "11",
                                                     "micro": "2"}}}) == SlurmVersion(25, 11, 2)
    assert version_from_meta({"slurm": {"release": "24.11.3"}}) == SlurmVersion(24, 11, 3)
    with pytest.raises(InputError):
        version_from_meta({})
    with pytest.raises(InputError):
        parse_version_text("no version here")


def test_detect_version_uses_runner():
    seen = []

    def runner(argv):
        seen.append(tuple(argv))
        return CommandResult(tuple(argv), 0, "slurm-wlm 22.05.8\n", "", 0.01)
    assert detect_version(runner) == SlurmVersion(22, 5, 8) and seen == [("sinfo", "-V")]


def test_scontrol_line_values_with_blanks():
    line = ("JobId=5 JobName=a b Priority=0 JobState=PENDING Reason=job_requeued_in_held_state "
            "AllocNode:Sid=localhost:1 Nodes=gpu01 CPU_IDs=0 Mem=0 GRES=gpu:2(IDX:0-1) "
            "Comment=shock:managed  StdOut=/x/%j.out TresPerNode=gres:gpu:1")
    f = parse_scontrol_line(line)
    assert f["JobName"] == "a b" and f["GRES"] == "gpu:2(IDX:0-1)"
    assert f["AllocNode:Sid"] == "localhost:1" and f["TresPerNode"] == "gres:gpu:1"


# --- backend choice ----------------------------------------------------------------------

class _FakeCli(CliBackend):
    def __init__(self, version):
        super().__init__()
        self._version = version


def _fake_pyslurm(monkeypatch, version):
    mod = types.ModuleType("pyslurm")
    mod.__version__ = version
    monkeypatch.setitem(sys.modules, "pyslurm", mod)
    return mod


def test_pyslurm_enabled_only_on_exact_major_minor(monkeypatch):
    _fake_pyslurm(monkeypatch, "25.11.2")
    b = backend_mod.make_backend("auto", cli=_FakeCli(SlurmVersion(25, 11, 0)))
    assert isinstance(b, PyslurmBackend) and b.version() == SlurmVersion(25, 11, 0)


@pytest.mark.parametrize("prefer", ["auto", "pyslurm"])
def test_pyslurm_version_mismatch_falls_back_to_cli_and_says_why(monkeypatch, caplog, prefer):
    _fake_pyslurm(monkeypatch, "25.11.2")
    with caplog.at_level(logging.INFO, logger="shockslurm.slurm.backend"):
        b = backend_mod.make_backend(prefer, cli=_FakeCli(SlurmVersion(22, 5, 8)))
    assert isinstance(b, CliBackend)
    assert "built for Slurm 25.11" in caplog.text and "22.05.8" in caplog.text


def test_pyslurm_missing_falls_back_to_cli(monkeypatch, caplog):
    monkeypatch.setitem(sys.modules, "pyslurm", None)      # makes `import pyslurm` fail
    with caplog.at_level(logging.INFO, logger="shockslurm.slurm.backend"):
        b = backend_mod.make_backend("auto", cli=_FakeCli(SlurmVersion(25, 11, 0)))
    assert isinstance(b, CliBackend) and "not importable" in caplog.text


def test_prefer_cli_never_imports_pyslurm(monkeypatch):
    mod = _fake_pyslurm(monkeypatch, "25.11.2")
    cli = _FakeCli(SlurmVersion(25, 11, 0))
    assert backend_mod.make_backend("cli", cli=cli) is cli and mod.__version__


def test_pyslurm_run_maps_scontrol_argv(monkeypatch):
    calls = []

    class Job:
        def __init__(self, jid): self.jid = jid
        def release(self): calls.append(("release", self.jid))
        def hold(self): calls.append(("hold", self.jid))
        def requeue(self, hold=False): calls.append(("requeue", self.jid, hold))
        def modify(self, desc): calls.append(("modify", self.jid, desc.kw))
        def cancel(self): calls.append(("cancel", self.jid))
        def send_signal(self, sig, steps): calls.append(("signal", self.jid, sig, steps))

    class Desc:
        def __init__(self, **kw): self.kw = kw
    mod = _fake_pyslurm(monkeypatch, "25.11.2")
    mod.Job, mod.JobSubmitDescription = Job, Desc
    b = PyslurmBackend(mod, SlurmVersion(25, 11, 0))
    assert b.run(["scontrol", "release", "7"]).ok
    assert b.run(["scontrol", "update", "JobId=7", "Gres=gpu:3", "StartTime=now"]).ok
    assert b.run(["scontrol", "requeuehold", "7"]).ok
    assert b.run(["scancel", "--signal=USR1", "--batch", "7"]).ok
    assert not b.run(["scontrol", "top", "7"]).ok
    assert calls == [("release", 7), ("modify", 7, {"gres_per_node": "gpu:3", "begin_time": "now"}),
                     ("requeue", 7, True), ("signal", 7, "USR1", "batch")]


def test_cli_missing_binary_is_a_clear_error():
    from shockslurm.slurm.types import SlurmError
    with pytest.raises(SlurmError, match="not found"):
        CliBackend().run(["definitely-not-a-slurm-binary-xyz"])

from __future__ import annotations

import gzip
import json

import pytest

from shockslurm.errors import InputError
from shockslurm.workload.reference import load_reference_workload, parse_trace_line, read_trace

GOOD = "ResNet-18 (batch size 32)\tpython3 main.py\tdir\t--num_steps\t1\t143450\t1\taccordion\t1\t-1.000000\t3338\t55"
THROUGHPUTS = {"v100": {
    "('ResNet-18 (batch size 32)', 1)": {"null": 42.97497938},
    "('ResNet-18 (batch size 256)', 1)": {"null": 6.31952281},
    "('ResNet-18 (batch size 64)', 1)": {"null": 0.0},
}}


def test_parse_good_line() -> None:
    tl = parse_trace_line(GOOD)
    assert (tl.model, tl.batch_size, tl.total_steps, tl.gang_size, tl.mode, tl.arrival_s) == \
        ("ResNet-18", 32, 143450, 1, "accordion", 55.0)


@pytest.mark.parametrize("index,value,field", [
    (0, "ResNet-18 batch 32", "job_type"),
    (0, "NoSuchNet (batch size 32)", "job_type"),
    (5, "-5", "total_steps"),
    (5, "abc", "total_steps"),
    (6, "3", "scale_factor"),
    (7, "elastic", "mode"),
    (8, "0", "priority_weight"),
    (11, "nan", "arrival_time"),
    (11, "-1", "arrival_time"),
])
def test_bad_field_is_named(index: int, value: str, field: str) -> None:
    parts = GOOD.split("\t")
    parts[index] = value
    with pytest.raises(InputError) as err:
        parse_trace_line("\t".join(parts), source="t.tsv", line=7)
    assert err.value.field == field and err.value.line == 7
    assert "t.tsv, line 7, field" in str(err.value)


def test_wrong_field_count(tmp_path) -> None:
    path = tmp_path / "t.tsv"
    path.write_text(GOOD + "\n" + "only\tthree\tfields\n")
    with pytest.raises(InputError, match=r"line 2: expected 12 TAB-separated fields, found 3"):
        read_trace(path)


def _write(tmp_path, trace: str, throughputs=THROUGHPUTS):
    (tmp_path / "t.tsv").write_text(trace)
    (tmp_path / "tp.json").write_text(json.dumps(throughputs))
    return tmp_path / "t.tsv", tmp_path / "tp.json"


def test_without_profiles_derives_epochs_and_pattern(tmp_path) -> None:
    jobs = load_reference_workload(*_write(tmp_path, GOOD + "\n"))
    job = jobs[0]
    # ceil(143450 / ceil(50000/32)) = ceil(143450/1563) = 92 epochs
    assert job.num_epochs == 92 and job.total_iterations == 143450
    assert job.batch_sizes[0] == 32 and job.batch_sizes[-1] == 256   # accordion rule
    assert 64 not in job.throughput                                  # 0.0 = not measured
    assert job.epoch_durations[0] == pytest.approx(50000 / 32 / 42.97497938)


def test_missing_throughput_names_line(tmp_path) -> None:
    line2 = GOOD.replace("ResNet-18 (batch size 32)", "LM (batch size 10)")
    trace, tp = _write(tmp_path, GOOD + "\n" + line2 + "\n")
    with pytest.raises(InputError) as err:
        load_reference_workload(trace, tp)
    assert err.value.line == 2 and "no throughput" in str(err.value)


def test_profiles_are_validated(tmp_path) -> None:
    trace, tp = _write(tmp_path, GOOD + "\n")
    prof = tmp_path / "p.json.gz"
    with gzip.open(prof, "wt") as fh:
        json.dump([{"model": "LM", "scale_factor": 1, "bs_every_epoch": [32],
                    "duration_every_epoch": [1.0]}], fh)
    with pytest.raises(InputError, match=r"profile is for \('LM', 1\)"):
        load_reference_workload(trace, tp, prof)


def test_corrupt_json_is_reported(tmp_path) -> None:
    trace, tp = _write(tmp_path, GOOD + "\n")
    tp.write_text("{not json")
    with pytest.raises(InputError, match="invalid JSON"):
        load_reference_workload(trace, tp)


def test_reference_trace_loads(reference_data) -> None:
    jobs = load_reference_workload(reference_data / "trace-120jobs.tsv",
                                   reference_data / "throughputs-tacc.json",
                                   reference_data / "profiles-120jobs.json.gz")
    assert len(jobs) == 120
    assert jobs[1].num_epochs == 92 and jobs[1].batch_sizes[28] == 256
    assert sum(j.exclusive_runtime_s for j in jobs) == pytest.approx(471541.75, rel=1e-6)


def test_absurd_step_count_is_refused_before_building_epochs(tmp_path) -> None:
    line = GOOD.replace("\t143450\t", f"\t{10**18}\t")
    with pytest.raises(InputError) as err:
        load_reference_workload(*_write(tmp_path, line + "\n"))
    assert err.value.field == "total_steps" and err.value.line == 1


@pytest.mark.parametrize("index, value, said", [(5, "abc", "expected an integer, got 'abc'"),
                                                (8, "high", "expected a number, got 'high'")])
def test_a_field_that_is_no_number_says_which_kind(index: int, value: str, said: str) -> None:
    """It said "expected a int" (and "a float"), Python's type names."""
    parts = GOOD.split("\t")
    parts[index] = value
    with pytest.raises(InputError, match=said):
        parse_trace_line("\t".join(parts), source="t.tsv", line=7)

from __future__ import annotations

import json

import pytest

from shockslurm.errors import InputError
from shockslurm.workload.generator import GeneratorConfig, generate
from shockslurm.workload.jsonl import read_jobs, write_jobs

ROW = {"model": "ResNet-18", "gpus": 2, "arrival_s": 10, "epochs": 5, "mode": "accordion",
       "schedule": [[0, 32], [3, 256]], "throughput": {"32": 40.0, "256": 6.0}}


def _write(tmp_path, *rows) -> object:
    path = tmp_path / "w.jsonl"
    path.write_text("# a comment\n\n" + "\n".join(r if isinstance(r, str) else json.dumps(r)
                                                  for r in rows) + "\n")
    return path


def test_schedule_segments_expand(tmp_path) -> None:
    job = read_jobs(_write(tmp_path, ROW))[0]
    assert job.batch_sizes == (32, 32, 32, 256, 256)
    assert job.samples_per_epoch == 50000 and job.gang_size == 2
    assert job.epoch_durations[3] == pytest.approx(50000 / 256 / 6.0)


@pytest.mark.parametrize("change,field", [
    ({"gpus": 0}, "gpus"),
    ({"gpus": 1.5}, "gpus"),
    ({"arrival_s": "soon"}, "arrival_s"),
    ({"schedule": [[1, 32]]}, "schedule"),
    ({"schedule": [[0, 32], [0, 64]]}, "schedule"),
    ({"schedule": [[0, 32], [9, 64]]}, "schedule"),
    ({"throughput": {"32": 40.0}}, "throughput"),
    ({"throughput": {"32": -1, "256": 6}}, "throughput"),
    ({"mode": "elastic"}, "mode"),
    ({"model": "Mystery"}, "model"),
])
def test_bad_rows_name_line_and_field(tmp_path, change, field) -> None:
    with pytest.raises(InputError) as err:
        read_jobs(_write(tmp_path, ROW, {**ROW, **change}))
    assert err.value.line == 4 and err.value.field == field


def test_bad_json_and_unknown_keys(tmp_path) -> None:
    with pytest.raises(InputError, match="line 3: invalid JSON"):
        read_jobs(_write(tmp_path, "{oops"))
    with pytest.raises(InputError, match="unknown keys"):
        read_jobs(_write(tmp_path, {**ROW, "gpu": 1}))


def test_a_repeated_job_id_names_both_lines(tmp_path) -> None:
    """A repeated id was "field 'id': job ids must be unique", with no line to look at."""
    with pytest.raises(InputError) as err:
        read_jobs(_write(tmp_path, {**ROW, "id": 7}, ROW, {**ROW, "id": 7}))
    assert err.value.line == 5 and err.value.field == "id"
    assert "job ids must be unique: 7 is line 3's too" in str(err.value)


def test_generated_workload_round_trips(tmp_path) -> None:
    jobs = generate(GeneratorConfig(jobs=25, seed=3))
    assert jobs == generate(GeneratorConfig(jobs=25, seed=3))   # deterministic
    path = tmp_path / "g.jsonl"
    write_jobs(jobs, path)
    back = read_jobs(path)
    assert [j.batch_sizes for j in back] == [j.batch_sizes for j in jobs]
    assert [j.gang_size for j in back] == [j.gang_size for j in jobs]
    for a, b in zip(jobs, back):
        assert b.exclusive_runtime_s == pytest.approx(a.exclusive_runtime_s, rel=1e-6)

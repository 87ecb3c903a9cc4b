"""Hostile workload files: every reader (reference TSV trace, throughput JSON, profile JSON or
.json.gz, our JSONL) refuses a bad or implausible value with an `InputError` that names the file
and the line and field (or the key) -- never another exception, never a value that overflows or
hangs what runs after -- while every shared reference file and built-in workload still reads.

The bounds are `shockslurm.limits`' (each with its reason there).
"""

from __future__ import annotations

import gzip
import json
import math
import random
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from shockslurm import limits
from shockslurm.errors import InputError
from shockslurm.livebench.workload import default_workload
from shockslurm.model import MAX_EPOCHS
from shockslurm.sim.jobs import SimJob
from shockslurm.sim.reference_profiles import with_reference_profiles
from shockslurm.workload.generator import GeneratorConfig, generate
from shockslurm.workload.jsonl import read_jobs, write_jobs
from shockslurm.workload.reference import (load_reference_workload, parse_trace_line,
                                           read_throughputs, reference_jobs)
from shockslurm.workload.reference_like import (ReferenceLikeConfig, catalogue_throughputs,
                                                generate_reference_like)

from .conftest import make_spec

# A reference trace line: LM at batch size 10 on 1 GPU, 134583 steps = 23 epochs of 5968.
TRACE_LINE = ("LM (batch size 10)\tpython3 main.py\tlanguage_modeling\t--steps\t1\t134583\t1\tgns"
              "\t1\t-1.000000\t1418\t0")
LM_EPOCHS = 23
THROUGHPUTS = {"v100": {"('LM (batch size 10)', 1)": {"null": 6.0},
                        "('LM (batch size 20)', 1)": {"null": 4.0},
                        "('LM (batch size 40)', 1)": {"null": 0.0}}}
PROFILE = {"model": "LM", "scale_factor": 1, "bs_every_epoch": [10] * LM_EPOCHS,
           "duration_every_epoch": [994.6] * LM_EPOCHS}
ROW = {"model": "ResNet-18", "gpus": 1, "arrival_s": 0, "epochs": 3, "schedule": [[0, 32]]}


def _write_json(path: Path, data: object) -> Path:
    path.write_text(json.dumps(data, allow_nan=True))
    return path


def _reference_files(tmp_path: Path, throughputs: object = THROUGHPUTS) -> tuple[Path, Path]:
    (tmp_path / "r1.tsv").write_text(TRACE_LINE + "\n")
    tp = tmp_path / "tp.json"
    if isinstance(throughputs, str):
        tp.write_text(throughputs)
    else:
        _write_json(tp, throughputs)
    return tmp_path / "r1.tsv", tp


def _entry(key: str, entry: object) -> dict:
    return {"v100": {**THROUGHPUTS["v100"], key: entry}}


# ----------------------------------------------------------------------------- throughputs
@pytest.mark.parametrize("throughputs,key,says", [
    ({"v100": [1, 2]}, "v100", "got a list"),
    ({"v100": {"('LM (batch size 10)', 1e999)": {"null": 1.0}}},
     "('LM (batch size 10)', 1e999)", "whole number of GPUs"),
    ({"v100": {"('LM (batch size 10)', 'x')": {"null": 1.0}}},
     "('LM (batch size 10)', 'x')", "whole number of GPUs"),
    # a gang of 1.5 was read as 1 and silently replaced the real entry
    (_entry("('LM (batch size 10)', 1.5)", {"null": 1.0}), "('LM (batch size 10)', 1.5)",
     "whole number of GPUs"),
    (_entry("('LM (batch size 10)', 0)", {"null": 1.0}), "('LM (batch size 10)', 0)",
     "whole number of GPUs"),
    (_entry("('LM (batch size 10)', 99999999999)", {"null": 1.0}),
     "('LM (batch size 10)', 99999999999)", "whole number of GPUs"),
    (_entry("('LM (batch size 10)',  1)", {"null": 1.0}), "('LM (batch size 10)',  1)",
     "a second entry"),
    (_entry("LM (batch size 10), 1", {"null": 1.0}), "LM (batch size 10), 1", "malformed key"),
    (_entry("('LM (batch size " + "9" * 5000 + ")', 2)", {"null": 1.0}), None, "batch size"),
    (_entry("('LM (batch size 0)', 2)", {"null": 1.0}), "('LM (batch size 0)', 2)",
     "batch size"),
    (_entry("('LM (batch size 80)', 1)", {"null": 1e300}), "('LM (batch size 80)', 1)",
     "iterations/s"),
    (_entry("('LM (batch size 80)', 1)", {"null": 1e-300}), "('LM (batch size 80)', 1)",
     "iterations/s"),
    (_entry("('LM (batch size 80)', 1)", {"null": -1}), "('LM (batch size 80)', 1)",
     "iterations/s"),
    (_entry("('LM (batch size 80)', 1)", {"null": math.inf}), "('LM (batch size 80)', 1)",
     "iterations/s"),
    (_entry("('LM (batch size 80)', 1)", {"null": 10 ** 400}), "('LM (batch size 80)', 1)",
     "iterations/s"),
    (_entry("('LM (batch size 80)', 1)", {"null": "3.0"}), "('LM (batch size 80)', 1)",
     "numeric 'null'"),
    (_entry("('LM (batch size 80)', 1)", {"null": True}), "('LM (batch size 80)', 1)",
     "numeric 'null'"),
    (_entry("('LM (batch size 80)', 1)", [3.0]), "('LM (batch size 80)', 1)", "numeric 'null'"),
    (_entry("('LM (batch size 80)', 1)", {}), "('LM (batch size 80)', 1)", "numeric 'null'"),
])
def test_bad_throughput_entries_name_file_and_key(tmp_path, throughputs, key, says) -> None:
    trace, tp = _reference_files(tmp_path, throughputs)
    with pytest.raises(InputError) as err:
        load_reference_workload(trace, tp)
    assert err.value.source == str(tp) and str(err.value).startswith(f"{tp}, field '")
    if key is not None:
        assert err.value.field == key
    else:                                            # a hostile key is cut short in the message
        assert err.value.field is not None and len(str(err.value)) < 400
    assert says in err.value.message


@pytest.mark.parametrize("text,says", [
    ("[" * 100_000, "unreadable JSON"),                       # was a RecursionError
    ('{"v100": {"(\'LM (batch size 10)\', 1)": {"null": ' + "1" * 5000 + "}}}",
     "unreadable JSON"),                                      # was a ValueError (4300 digits)
    ("{not json", "invalid JSON"),
    ("", "invalid JSON"),
    ("[1, 2]", "expected a JSON object of GPU types, got a list"),   # was "no GPU type"
    ('{"a100": {}}', "no GPU type 'v100'"),
])
def test_unreadable_throughput_files_name_the_file(tmp_path, text, says) -> None:
    trace, tp = _reference_files(tmp_path, text)
    with pytest.raises(InputError) as err:
        load_reference_workload(trace, tp)
    assert err.value.source == str(tp) and str(err.value).startswith(str(tp))
    assert says in err.value.message and "sys.set_int_max_str_digits" not in str(err.value)


@pytest.mark.parametrize("key", [
    "('LM (batch size 10)', " + " " * 100_000 + "x",          # was quadratic in the key's length
    "('LM (batch size 10)'," + " " * 100_000,
    "(" + " " * 100_000 + "'LM'",
    "('" + "a " * 100_000 + "(batch size 0)', 1)",
])
def test_a_hostile_key_is_refused_in_linear_time(tmp_path, key) -> None:
    trace, tp = _reference_files(tmp_path, _entry(key, {"null": 1.0}))
    started = time.perf_counter()
    with pytest.raises(InputError) as err:
        load_reference_workload(trace, tp)
    assert time.perf_counter() - started < 2.0
    assert err.value.source == str(tp) and len(str(err.value)) < 300


def test_throughputs_read_to_the_bounds(tmp_path) -> None:
    tp = _write_json(tmp_path / "tp.json", {"v100": {
        "('LM (batch size 10)', 1)": {"null": limits.MAX_ITERATIONS_PER_S},
        "('LM (batch size 20)', 65536)": {"null": limits.MIN_ITERATIONS_PER_S},
        "('A3C', 1)": {"null": 0.0, "('A3C', 1)": [1, 2]},      # not measured: left out
        '("CycleGAN", 2)': {"null": 3}}})
    assert read_throughputs(tp) == {("LM (batch size 10)", 1): limits.MAX_ITERATIONS_PER_S,
                                    ("LM (batch size 20)", 65536): limits.MIN_ITERATIONS_PER_S,
                                    ("CycleGAN", 2): 3.0}


def test_a_throughput_that_makes_an_implausible_epoch_names_the_trace_line(tmp_path) -> None:
    # 59,675 samples at batch size 10 and 1e-4 iterations/s: an epoch of 6e7 s (> 1e7)
    trace, tp = _reference_files(tmp_path, _entry("('LM (batch size 10)', 1)", {"null": 1e-4}))
    with pytest.raises(InputError) as err:
        load_reference_workload(trace, tp)
    assert (err.value.source, err.value.line, err.value.field) == (str(trace), 1, "job_type")
    assert "an epoch at batch size 10" in err.value.message


# ----------------------------------------------------------------------------- trace lines
@pytest.mark.parametrize("index,value,field", [
    (11, "1e300", "arrival_time"),
    (11, "1e400", "arrival_time"),
    (11, str(limits.MAX_ARRIVAL_S * 1.01), "arrival_time"),
    (5, str(2 ** 63), "total_steps"),
    (5, "9" * 5000, "total_steps"),
    (8, "1e300", "priority_weight"),
    (8, "1e-300", "priority_weight"),
    (6, "1.5", "scale_factor"),
    (6, "1e999", "scale_factor"),
    (0, f"LM (batch size {2 ** 63})", "job_type"),
    (0, "LM (batch size " + "9" * 5000 + ")", "job_type"),
])
def test_implausible_trace_values_name_line_and_field(index, value, field) -> None:
    parts = TRACE_LINE.split("\t")
    parts[index] = value
    with pytest.raises(InputError) as err:
        parse_trace_line("\t".join(parts), source="t.tsv", line=7)
    assert (err.value.line, err.value.field) == (7, field)
    assert str(err.value).startswith(f"t.tsv, line 7, field '{field}'")
    assert len(str(err.value)) < 300                     # a 5000-digit value is cut short


def test_trace_values_at_the_bounds_read() -> None:
    parts = TRACE_LINE.split("\t")
    parts[11], parts[8] = repr(limits.MAX_ARRIVAL_S), repr(limits.MAX_PRIORITY)
    tl = parse_trace_line("\t".join(parts))
    assert (tl.arrival_s, tl.priority_weight) == (limits.MAX_ARRIVAL_S, limits.MAX_PRIORITY)


# ----------------------------------------------------------------------------- profiles
def _profile(**change: object) -> list[dict]:
    return [{**PROFILE, **change}]


@pytest.mark.parametrize("profiles,field,says", [
    (_profile(scale_factor="abc"), "[0].scale_factor", "must be an integer"),
    (_profile(scale_factor=None), "[0].scale_factor", "must be an integer"),
    (_profile(scale_factor=[1]), "[0].scale_factor", "must be an integer"),
    (_profile(scale_factor=math.inf), "[0].scale_factor", "must be an integer"),  # 1e999
    (_profile(scale_factor=1.5), "[0].scale_factor", "must be an integer"),
    (_profile(scale_factor=2), "[0]", "profile is for ('LM', 2)"),
    (_profile(model=["LM"] * 1000), "[0]", "profile is for (<list of length 1000>, 1)"),
    (_profile(bs_every_epoch=[math.inf] + [10] * 22), "[0].bs_every_epoch[0]", "integer"),
    (_profile(bs_every_epoch=[10] * 22 + [2 ** 63]), "[0].bs_every_epoch[22]", "integer in"),
    (_profile(bs_every_epoch=[10] * 22 + [10.5]), "[0].bs_every_epoch[22]", "integer"),
    (_profile(bs_every_epoch=[10] * 22 + ["10"]), "[0].bs_every_epoch[22]", "integer"),
    (_profile(bs_every_epoch=None), "[0].bs_every_epoch", "list"),
    (_profile(bs_every_epoch=[]), "[0].bs_every_epoch", "list"),
    (_profile(duration_every_epoch=[1e-300] * LM_EPOCHS), "[0].duration_every_epoch[0]",
     "number in 0.001..1e+07"),
    (_profile(duration_every_epoch=[1e300] * LM_EPOCHS), "[0].duration_every_epoch[0]",
     "number in 0.001..1e+07"),
    (_profile(duration_every_epoch=[math.nan] * LM_EPOCHS), "[0].duration_every_epoch[0]",
     "finite"),
    (_profile(duration_every_epoch=[9e6] * LM_EPOCHS), "[0].duration_every_epoch", "366 days"),
    (_profile(duration_every_epoch=[994.6] * 22), "[0]", "bs_every_epoch has 23 epochs"),
    # the epoch count contradicts the trace line's total_steps
    (_profile(bs_every_epoch=[10] * 3, duration_every_epoch=[1.0] * 3), "[0].bs_every_epoch",
     "3 epochs, but trace line 1's 134583 steps make 23"),
    (["LM"], "[0]", "expected an object"),
    (_profile(bs_every_epoch=[10] * 22 + [80]), "[0].bs_every_epoch", "no throughput"),
])
def test_bad_profiles_name_file_and_key(tmp_path, profiles, field, says) -> None:
    trace, tp = _reference_files(tmp_path)
    prof = _write_json(tmp_path / "p.json", profiles)
    with pytest.raises(InputError) as err:
        load_reference_workload(trace, tp, prof)
    assert (err.value.source, err.value.field) == (str(prof), field)
    assert str(err.value).startswith(f"{prof}, field '{field}': ")
    assert says in err.value.message


def _gz(data: bytes) -> bytes:
    return gzip.compress(data, mtime=0)


@pytest.mark.parametrize("name,content,says", [
    ("p.json.gz", _gz(b"[]" * 100)[:-12] + b"garbage!garbage!", "cannot read"),   # zlib.error
    ("p.json.gz", b"not gzip at all", "Not a gzipped file"),                      # BadGzipFile
    ("p.json.gz", _gz(json.dumps(_profile()).encode())[:30], "cannot read"),      # EOFError
    ("p.JSON.GZ", b"not gzip at all", "Not a gzipped file"),        # the suffix in any case
    ("p.json", b"\xff\xfe[]", "not UTF-8"),
    ("p.json.gz", _gz(b"\xff[]"), "not UTF-8"),
], ids=["zlib-error", "bad-gzip-file", "eof-error", "upper-case-suffix", "not-utf8",
        "gzipped-not-utf8"])
def test_corrupt_profile_files_are_input_errors(tmp_path, name, content, says) -> None:
    trace, tp = _reference_files(tmp_path)
    prof = tmp_path / name
    prof.write_bytes(content)
    with pytest.raises(InputError) as err:
        load_reference_workload(trace, tp, prof)
    assert err.value.source == str(prof) and says in err.value.message


def test_a_decompression_bomb_is_refused(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr("shockslurm.workload.checks.MAX_WORKLOAD_BYTES", 1000)
    trace, tp = _reference_files(tmp_path)
    prof = tmp_path / "p.json.gz"
    prof.write_bytes(_gz(b"[" + b" " * 5000 + b"]"))
    with pytest.raises(InputError, match="larger than 1,000 bytes uncompressed"):
        load_reference_workload(trace, tp, prof)


def test_good_profiles_read(tmp_path) -> None:
    trace, tp = _reference_files(tmp_path)
    prof = tmp_path / "p.json.gz"
    prof.write_bytes(_gz(json.dumps(_profile(bs_every_epoch=[10] * 20 + [20.0] * 3)).encode()))
    job, = load_reference_workload(trace, tp, prof)
    assert job.batch_sizes == (10,) * 20 + (20,) * 3 and job.num_epochs == LM_EPOCHS


# ----------------------------------------------------------------------------- JSONL
def _jsonl(tmp_path: Path, change: dict, drop: tuple[str, ...] = ()) -> Path:
    row = {k: v for k, v in {**ROW, **change}.items() if k not in drop}
    path = tmp_path / "w.jsonl"
    path.write_text(json.dumps(ROW) + "\n" + json.dumps(row, allow_nan=True) + "\n")
    return path


@pytest.mark.parametrize("change,field", [
    ({"arrival_s": 1e300}, "arrival_s"),          # the simulation reported all zeros
    ({"arrival_s": limits.MAX_ARRIVAL_S * 1.01}, "arrival_s"),
    ({"arrival_s": -1}, "arrival_s"),
    ({"samples_per_epoch": 10 ** 20}, "samples_per_epoch"),            # simulate hung
    ({"samples_per_epoch": 2 ** 63}, "samples_per_epoch"),             # SQLite OverflowError
    ({"samples_per_epoch": 10 ** 400}, "samples_per_epoch"),
    ({"id": 2 ** 63}, "id"),
    ({"id": -1}, "id"),
    ({"id": "7"}, "id"),
    ({"gpus": 2 ** 63}, "gpus"),
    ({"epochs": MAX_EPOCHS + 1}, "epochs"),
    ({"schedule": [[0, 2 ** 63]]}, "schedule"),
    ({"schedule": [[0, limits.MAX_BATCH_SIZE + 1]]}, "schedule"),
    ({"throughput": {"32": 1e300}, "samples_per_epoch": 50000}, "throughput"),
    ({"throughput": {"32": 1e-300}, "samples_per_epoch": 50000}, "throughput"),
    ({"throughput": {"32": "40"}, "samples_per_epoch": 50000}, "throughput"),
    ({"throughput": {"32": True}, "samples_per_epoch": 50000}, "throughput"),
    ({"throughput": {"32": 40.0, "032": 41.0}, "samples_per_epoch": 50000}, "throughput"),
    ({"throughput": {"32": 40.0, "3_2": 41.0}, "samples_per_epoch": 50000}, "throughput"),
    ({"throughput": {"32": 40.0, " 32": 41.0}, "samples_per_epoch": 50000}, "throughput"),
    ({"throughput": {"32": 40.0, str(2 ** 63): 41.0}, "samples_per_epoch": 50000}, "throughput"),
    ({"throughput": {str(b): 1.0 for b in range(1, 100)}, "samples_per_epoch": 50}, "throughput"),
    # an epoch of 1e-6 s (1 sample at 1e6 iterations/s), and one of 5e7 s
    ({"throughput": {"32": 1e6}, "samples_per_epoch": 1}, "throughput"),
    ({"throughput": {"32": 1e-3}, "samples_per_epoch": 1_600_000}, "throughput"),
    # the catalogue's throughput model on 65536 GPUs: an epoch under a millisecond
    ({"model": "Recommendation", "gpus": 65536, "schedule": [[0, 8192]]}, "gpus"),
    # 1000 epochs of 40,000 s: over 366 days in all
    ({"epochs": 1000, "throughput": {"32": 1.0}, "samples_per_epoch": 1_280_000}, "epochs"),
    ({"iterations": 1}, "iterations"),            # contradicts 3 epochs of 1563
    ({"iterations": 3 * 1563 + 1}, "iterations"),
    ({"iterations": 2 * 1563}, "iterations"),
    ({"iterations": 2 ** 63}, "iterations"),
    ({"priority": 1e300}, "priority"),
    ({"priority": 0}, "priority"),
    ({"model": "x\x1b[31m"}, "model"),
    ({"model": "m" * 65, "throughput": {"32": 1.0}, "samples_per_epoch": 5000}, "model"),
    ({"dataset": 5}, "dataset"),
    ({"dataset": "a\nb"}, "dataset"),
    ({"dataset": "d" * 129}, "dataset"),
    ({"mode": ["static"]}, "mode"),
])
def test_implausible_jsonl_values_name_line_and_field(tmp_path, change, field) -> None:
    path = _jsonl(tmp_path, change)
    with pytest.raises(InputError) as err:
        read_jobs(path)
    assert (err.value.source, err.value.line, err.value.field) == (str(path), 2, field)
    assert str(err.value).startswith(f"{path}, line 2, field '{field}': ")
    assert len(str(err.value)) < 400 + len(str(path))


@pytest.mark.parametrize("change", [
    {"iterations": 2 * 1563 + 1},                 # ends within the third epoch
    {"iterations": 3 * 1563},
    {"iterations": 3 * 1563.0},
    {"id": limits.MAX_JOB_ID},
    {"arrival_s": limits.MAX_ARRIVAL_S},
    {"priority": limits.MIN_PRIORITY},
    {"throughput": {"32": 40.0, "16777216": 1e-3}, "samples_per_epoch": 50000},
    {"model": "GPT-2.small_v1", "throughput": {"32": 1.0}, "samples_per_epoch": 5000,
     "dataset": "My data set (v2)"},
])
def test_jsonl_values_within_the_bounds_read(tmp_path, change) -> None:
    job = read_jobs(_jsonl(tmp_path, change))[1]
    assert job.num_epochs == 3 and all(limits.MIN_EPOCH_SECONDS <= d <= limits.MAX_EPOCH_SECONDS
                                       for d in job.epoch_durations)


def test_unknown_keys_are_listed_short(tmp_path) -> None:
    path = _jsonl(tmp_path, {"k" * 10_000: 1, "\x1b[2J": 2})
    with pytest.raises(InputError) as err:
        read_jobs(path)
    assert err.value.line == 2 and "unknown keys" in err.value.message
    assert len(str(err.value)) < 500 and "\x1b" not in str(err.value)


# ----------------------------------------------------------------------------- the CLI
def test_cli_prints_errors_not_tracebacks(tmp_path) -> None:
    from shockslurm.cli.main import cli

    trace, tp = _reference_files(tmp_path, _entry("('LM (batch size 10)', 1.5)", {"null": 1.0}))
    prof = _write_json(tmp_path / "p.json", _profile(scale_factor="abc"))
    good_tp = _write_json(tmp_path / "good.json", THROUGHPUTS)
    bad_jsonl = _jsonl(tmp_path, {"arrival_s": 1e300})
    runs = [
        (["trace", "convert", "--trace", str(trace), "--throughputs", str(tp), "--out",
          str(tmp_path / "o.jsonl")], f"Error: {tp}, field '('LM (batch size 10)', 1.5)'"),
        (["simulate", "--trace", str(trace), "--throughputs", str(tp), "--gpus", "2",
          "--policy", "fifo"], f"Error: {tp}, field '('LM (batch size 10)', 1.5)'"),
        (["trace", "convert", "--trace", str(trace), "--throughputs", str(good_tp),
          "--profiles", str(prof), "--out", str(tmp_path / "o.jsonl")],
         f"Error: {prof}, field '[0].scale_factor'"),
        (["simulate", "--trace", str(bad_jsonl), "--gpus", "2", "--policy", "fifo"],
         f"Error: {bad_jsonl}, line 2, field 'arrival_s'"),
    ]
    for argv, says in runs:
        result = CliRunner().invoke(cli, argv)
        assert result.exit_code == 1, (argv, result.output)
        assert result.exception is None or isinstance(result.exception, SystemExit), argv
        assert says in result.output and "Traceback" not in result.output, (argv, result.output)


# ----------------------------------------------------------------------------- good input
def test_shared_reference_files_read(reference_data, tmp_path) -> None:
    tp = reference_data / "throughputs-tacc.json"
    for gpu_type in ("v100", "p100", "k80", "v100_unconsolidated", "p100_unconsolidated",
                     "k80_unconsolidated"):
        assert read_throughputs(tp, gpu_type)
    jobs = load_reference_workload(reference_data / "trace-120jobs.tsv", tp,
                                   reference_data / "profiles-120jobs.json.gz")
    assert len(jobs) == 120
    write_jobs(jobs, tmp_path / "ref.jsonl")               # and what trace convert writes
    assert [j.batch_sizes for j in read_jobs(tmp_path / "ref.jsonl")] == \
        [j.batch_sizes for j in jobs]


def test_builtin_workloads_read_back(tmp_path, reference_data) -> None:
    tables = [catalogue_throughputs(), read_throughputs(reference_data / "throughputs-tacc.json")]
    path = tmp_path / "w.jsonl"
    for seed in range(3):
        workloads = [generate(GeneratorConfig(jobs=60, seed=seed)), default_workload(32, seed=seed)]
        for table in tables:
            drawn = generate_reference_like(ReferenceLikeConfig(jobs=40, seed=seed), table)
            workloads.append(with_reference_profiles(
                reference_jobs([d.line for d in drawn], table, "reference-like")))
        for jobs in workloads:
            write_jobs(jobs, path)
            assert len(read_jobs(path)) == len(jobs)


# ----------------------------------------------------------------------------- the simulator
def _naive_iterations_to_change(job: SimJob) -> int:
    """The scan over every epoch that `SimJob._iterations_to_change` replaced."""
    ipe, schedule = job.iterations_per_epoch, job.spec.batch_sizes
    for epoch in range(int(job.epochs_done) + 1, job.spec.num_epochs):
        if schedule[epoch] != job.batch_size:
            return max(1, epoch * ipe - job.iterations_done)
    return job.remaining_iterations


def test_iterations_to_change_equals_the_epoch_scan() -> None:
    rng = random.Random(7)
    for _ in range(300):
        epochs = rng.randint(1, 40)
        sizes = [rng.choice((16, 32, 64)) for _ in range(rng.randint(1, 5))]
        schedule = sorted(rng.sample(range(epochs), min(epochs, len(sizes))))
        per_epoch = [sizes[0]] * epochs
        for first, bs in zip(schedule, sizes):
            per_epoch[first:] = [bs] * (epochs - first)
        spec = make_spec(schedule=per_epoch, samples=1000,
                         throughput={16: 4.0, 32: 2.0, 64: 1.0})
        job = SimJob(spec)
        assert job.exclusive_runtime_s == spec.exclusive_runtime_s
        for _ in range(10):
            job.batch_size = rng.choice((16, 32, 64))         # on or off the schedule
            job.total_iterations = epochs * job.iterations_per_epoch
            job.iterations_done = rng.randint(0, job.total_iterations)
            assert job._iterations_to_change() == _naive_iterations_to_change(job)

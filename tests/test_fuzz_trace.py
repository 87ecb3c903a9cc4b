"""Fuzz the workload readers: the reference TSV trace and our JSONL format.

Contract: a clean parse, or an `InputError` naming the file and the line (and the field where
one field is at fault) -- never another exception, never a hang.
"""

from __future__ import annotations

import json
import math
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from shockslurm.errors import InputError
from shockslurm.model import ADAPTATION_MODES
from shockslurm.workload.catalogue import CATALOGUE
from shockslurm.workload.jsonl import KNOWN, MAX_EPOCHS, read_jobs
from shockslurm.workload.reference import FIELDS, GANG_SIZES, parse_trace_line, read_trace

FUZZ = settings(deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
MODELS = sorted(CATALOGUE)
FREE_TEXT = ("command", "working_directory", "num_steps_arg", "needs_data_dir", "SLO", "duration")


def _tmp_file(text: str, suffix: str) -> Path:
    """A file in a fresh temporary directory (hypothesis reruns the body; no function fixtures)."""
    path = Path(tempfile.mkdtemp(prefix="shockfuzz-")) / f"input{suffix}"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    return path


# ------------------------------------------------------------------------------ trace
@st.composite
def trace_rows(draw) -> dict[str, str]:
    """A valid row; free-text fields get any text without TAB or a line end."""
    free = st.text(st.characters(blacklist_characters="\t\n\r", blacklist_categories=("Cs",)),
                   max_size=12)
    row = {k: draw(free) for k in FREE_TEXT}
    row.update(
        job_type=f"{draw(st.sampled_from(MODELS))} (batch size {draw(st.integers(1, 4096))})",
        total_steps=str(draw(st.integers(1, 10**9))),
        scale_factor=str(draw(st.sampled_from(GANG_SIZES))),
        mode=draw(st.sampled_from(ADAPTATION_MODES)),
        priority_weight=repr(draw(st.floats(min_value=1e-6, max_value=1e6))),
        arrival_time=repr(draw(st.floats(min_value=0, max_value=1e9))))
    return row


def _line(row: dict[str, str]) -> str:
    return "\t".join(row[f] for f in FIELDS)


ADVERSARIAL = st.one_of(
    st.sampled_from(["", " ", "0", "-1", "-0", "1.5", "1e3", "1e400", "-1e400", "nan", "NaN", "inf",
                     "-inf", "Infinity", "9" * 5000, "1_000", "0x10", "٣٢", "１２", "None", "null",
                     "a\tb", "a\nb", "a\rb", "\x0c", "\x85", "\u2028", "\x00", "static ",
                     "ResNet-18 (batch size 0)", "ResNet-18 (batch size -1)",
                     "ResNet-18 (batch size 1e3)", "ResNet-18 (batch size " + "9" * 5000 + ")",
                     "Nope (batch size 32)", "ResNet-18(batch size 32)"]),
    st.integers(min_value=-(10**30), max_value=10**30).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.text(max_size=20),
)


def _check_trace_error(exc: InputError, source: str) -> None:
    assert exc.source == source and exc.line is not None and exc.line >= 1, str(exc)
    assert exc.field is None or exc.field in FIELDS, str(exc)
    assert str(exc).startswith(source)


def _check_trace_line(tl) -> None:
    assert tl.model in CATALOGUE and tl.gang_size in GANG_SIZES and tl.mode in ADAPTATION_MODES
    assert tl.batch_size > 0 and tl.total_steps > 0
    assert math.isfinite(tl.priority_weight) and tl.priority_weight > 0
    assert math.isfinite(tl.arrival_s) and tl.arrival_s >= 0


@settings(FUZZ, max_examples=150)
@given(row=trace_rows(), field=st.sampled_from(FIELDS), value=ADVERSARIAL)
@example(row={f: "x" for f in FIELDS} | {"job_type": "ResNet-18 (batch size 32)",
                                       "total_steps": "9" * 5000, "scale_factor": "1",
                                       "mode": "static", "priority_weight": "1",
                                       "arrival_time": "0"},
         field="total_steps", value="9" * 5000)
def test_trace_line_mutations(row, field, value):
    line_no = 7
    try:
        tl = parse_trace_line(_line(row | {field: value}), source="t.tsv", line=line_no)
    except InputError as exc:
        _check_trace_error(exc, "t.tsv")
        assert exc.line == line_no
        if exc.field is None:        # only a wrong field count names no field
            assert "TAB-separated fields" in exc.message
    else:
        _check_trace_line(tl)


@settings(FUZZ, max_examples=150)
@given(text=st.text(max_size=200))
def test_trace_line_arbitrary_text(text):
    try:
        _check_trace_line(parse_trace_line(text, source="t.tsv", line=3))
    except InputError as exc:
        _check_trace_error(exc, "t.tsv")


@settings(FUZZ, max_examples=40)
@given(rows=st.lists(trace_rows(), min_size=1, max_size=5), data=st.data())
# Regression: a form feed / NEL / U+2028 in a free-text field split the line (splitlines()),
# so a valid trace was rejected with a wrong line number.
@example(rows=[{f: "x" for f in FIELDS} | {"job_type": "LM (batch size 5)", "total_steps": "9",
                                           "scale_factor": "1", "mode": "static",
                                           "priority_weight": "1.0", "arrival_time": "0.0",
                                           "command": "python\x0ctrain.py\x85\u2028"}],
         data=None)
def test_read_trace_files(rows, data):
    mutate = data is not None and data.draw(st.booleans(), label="mutate")
    lines = [_line(r) for r in rows]
    if mutate:
        k = data.draw(st.integers(0, len(rows) - 1), label="line")
        field = data.draw(st.sampled_from(FIELDS), label="field")
        value = data.draw(ADVERSARIAL, label="value")
        lines[k] = _line(rows[k] | {field: value})
    path = _tmp_file("\n".join(lines) + "\n", ".tsv")
    try:
        parsed = read_trace(path)
    except InputError as exc:
        assert mutate, f"a valid trace was rejected: {exc}"
        _check_trace_error(exc, str(path))
        # the error names the mutated line (or a later piece of it, when the value held "\n")
        assert k + 1 <= exc.line <= k + 1 + value.count("\n") + value.count("\r"), str(exc)
    else:
        assert [tl.line for tl in parsed] == list(range(1, len(rows) + 1))
        for tl in parsed:
            _check_trace_line(tl)


# ------------------------------------------------------------------------------ JSONL
JSON_SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(10**400), max_value=10**400),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=10),
    st.sampled_from([0, -1, 1, 2**63, 10**20, 1e308, 1e-320, "32", "", "ResNet-18", "static"]))
JSON_VALUES = st.recursive(
    JSON_SCALARS,
    lambda inner: st.one_of(st.lists(inner, max_size=4),
                            st.dictionaries(st.text(max_size=5), inner, max_size=4)),
    max_leaves=10)


@st.composite
def jsonl_rows(draw) -> dict:
    model = draw(st.sampled_from(MODELS))
    epochs = draw(st.integers(1, 200))
    bs = draw(st.integers(1, 1024))
    row = {"model": model, "gpus": draw(st.sampled_from([1, 2, 4, 8])),
           "arrival_s": draw(st.floats(min_value=0, max_value=1e7)), "epochs": epochs,
           "schedule": [[0, bs]], "mode": draw(st.sampled_from(ADAPTATION_MODES))}
    samples = CATALOGUE[model].samples_per_epoch
    if draw(st.booleans()):
        # within the readers' bounds (shockslurm.limits): an epoch of about 1..10^4 s (1e-3..1e7
        # allowed), 200 of them well under 366 days, 1e-3..1e4 iterations/s (1e-6..1e6 allowed)
        rate = draw(st.floats(min_value=1e-3, max_value=1e4))
        seconds = draw(st.floats(min_value=1.0, max_value=1e4))
        samples = max(1, round(seconds * rate * bs))
        row["throughput"] = {str(bs): rate}
        row["samples_per_epoch"] = samples
    if draw(st.booleans()):
        row["priority"] = draw(st.floats(min_value=0.1, max_value=10))
    if draw(st.booleans()):
        # iterations end the job within its last epoch (at the first batch size)
        per_epoch = -(-samples // bs)
        row["iterations"] = draw(st.integers((epochs - 1) * per_epoch + 1, epochs * per_epoch))
    return row


def _check_jsonl_error(exc: InputError, source: str) -> None:
    assert exc.source == source, str(exc)
    assert exc.field is None or exc.field in KNOWN, str(exc)


@settings(FUZZ, max_examples=150)
@given(rows=st.lists(jsonl_rows(), min_size=1, max_size=4), data=st.data())
@example(rows=[{"model": "LM", "gpus": 1, "arrival_s": 0.0, "epochs": 3, "schedule": [[0, 8]]}],
         data=[0, "gpus", 10**400])            # regression: OverflowError in float()
@example(rows=[{"model": "LM", "gpus": 1, "arrival_s": 0.0, "epochs": 3, "schedule": [[0, 8]]}],
         data=[0, "epochs", 10**15])           # regression: a 10**15-entry schedule (hang)
@example(rows=[{"model": "LM", "gpus": 1, "arrival_s": 0.0, "epochs": 3, "schedule": [[0, 8]],
                "samples_per_epoch": 5, "throughput": {"8": 1.0}}],
         data=[0, "throughput", {"8": 10**400}])  # regression: OverflowError in float()
@example(rows=[{"model": "LM", "gpus": 1, "arrival_s": 0.0, "epochs": 3, "schedule": [[0, 8]],
                "samples_per_epoch": 5, "throughput": {"8": 1.0}}],
         data=[0, "model", [1]])               # regression: a list accepted as the model name
def test_jsonl_value_mutations(rows, data):
    if isinstance(data, list):                 # an @example: [line index, key, value]
        k, key, value = data
    else:
        k = data.draw(st.integers(0, len(rows) - 1), label="line")
        key = data.draw(st.sampled_from(sorted(KNOWN) + ["extra"]), label="key")
        value = data.draw(st.one_of(JSON_VALUES, st.just(KeyError)), label="value")
    row = dict(rows[k])
    if value is KeyError:
        row.pop(key, None)
    else:
        row[key] = value
    lines = [json.dumps(r) for r in rows]
    lines[k] = json.dumps(row)                 # NaN/Infinity are written as JSON extensions
    path = _tmp_file("\n".join(lines) + "\n", ".jsonl")
    try:
        jobs = read_jobs(path)
    except InputError as exc:
        _check_jsonl_error(exc, str(path))
        if exc.line is None:                   # the only file-level error left: duplicate ids
            assert exc.field == "id", str(exc)
        else:
            assert exc.line == k + 1, str(exc)
            assert exc.field is not None or key == "extra" or "unreadable JSON" in exc.message, (
                str(exc))
    else:
        assert len(jobs) == len(rows)
        for job in jobs:
            assert isinstance(job.model, str) and job.model
            assert 1 <= job.num_epochs <= MAX_EPOCHS and job.gang_size >= 1
            assert all(math.isfinite(d) and d > 0 for d in job.epoch_durations)
            assert math.isfinite(job.arrival_s) and job.arrival_s >= 0


@settings(FUZZ, max_examples=120)
@given(lines=st.lists(st.one_of(st.text(max_size=60), JSON_VALUES.map(json.dumps)),
                      min_size=1, max_size=4))
@example(lines=["[" * 100_000])                # regression: RecursionError from json.loads
@example(lines=["1" * 5000])                   # regression: ValueError (over 4300 digits)
@example(lines=['{"gpus": ' + "1" * 5000 + "}"])
def test_jsonl_arbitrary_lines(lines):
    path = _tmp_file("\n".join(l.replace("\n", " ") for l in lines) + "\n", ".jsonl")
    try:
        read_jobs(path)
    except InputError as exc:
        _check_jsonl_error(exc, str(path))

"""Fuzz the Slurm readers on mutated recorded samples (tests/data/slurm/*.json).

Contract: `parse_squeue` / `parse_sinfo` / `parse_scontrol_line` return records or raise
`InputError` -- nothing else. A hostile comment is kept literally and makes a job managed only
when `shock:managed` is exactly one of its `;`-separated elements.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from shockslurm.errors import InputError
from shockslurm.slurm.gres import gpu_indices
from shockslurm.slurm.parse import parse_scontrol_line, parse_sinfo, parse_squeue
from shockslurm.slurm.types import MANAGED_TAG, SlurmJob, SlurmNode
from shockslurm.slurm.version import parse_version_text, version_from_meta

from .slurm_samples import VERSIONS, load

FUZZ = settings(deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
SQUEUE = {v: json.loads(load("squeue", v)) for v in VERSIONS}
SINFO = {v: json.loads(load("sinfo", v)) for v in VERSIONS}

HOSTILE = st.sampled_from([
    "", ";", ";;", "shock:managed", " shock:managed", "shock:managed ", "SHOCK:MANAGED",
    "shock:managed\n", "x;shock:managed", "shock:managed;x", "xshock:managed", "shock:managed=1",
    "'; rm -rf / #", '"; $(reboot) `id` ${IFS}', "$(echo shock:managed)", "a\x00b", "\x00",
    "line1\nline2", "\r\n", "tab\there", "\u2028;\u0085", "\ud800", "emoji 🧨;", "\\;\\n",
    "shock:spec={\"model\":\"x\"};shock:managed", "%s%n%x", "' OR 1=1 --"])
JSON_SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12), HOSTILE,
    st.sampled_from([0, -1, 2**63, 2**64 + 1, 10**30, 1e308, "-5", "9" * 5000, "gpu:99",
                     "gres/gpu:" + "9" * 5000, "gpu:1(IDX:0-99999999999)", "N/A", "(null)",
                     "RUNNING", "PENDING", ["RUNNING"], ["PENDING", "REQUEUED"],
                     {"set": True, "infinite": False, "number": 5}, {"set": False},
                     {"infinite": True}, {"number": None}, {"number": float("nan")}]))
JSON_VALUES = st.recursive(
    JSON_SCALARS,
    lambda inner: st.one_of(st.lists(inner, max_size=3),
                            st.dictionaries(st.text(max_size=6), inner, max_size=3)),
    max_leaves=8)


def _paths(node: Any, prefix: tuple = ()) -> list[tuple]:
    """Every path (keys / list indices) to a value in a decoded JSON document."""
    out = [prefix] if prefix else []
    if isinstance(node, dict):
        for k, v in node.items():
            out += _paths(v, prefix + (k,))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out += _paths(v, prefix + (i,))
    return out


def _mutate(doc: Any, data) -> Any:
    """Apply 1..3 random edits (drop, replace with any JSON value, wrap/unwrap in a list)."""
    doc = copy.deepcopy(doc)
    for _ in range(data.draw(st.integers(1, 3), label="edits")):
        paths = _paths(doc)
        if not paths:
            break
        path = data.draw(st.sampled_from(paths), label="path")
        parent = doc
        for key in path[:-1]:
            parent = parent[key]
        last = path[-1]
        op = data.draw(st.sampled_from(["drop", "replace", "listify", "stringify"]), label="op")
        if op == "drop":
            del parent[last]
        elif op == "replace":
            parent[last] = data.draw(JSON_VALUES, label="value")
        elif op == "listify":
            parent[last] = [parent[last]]
        else:
            parent[last] = json.dumps(parent[last])
    return doc


def _feed(parse, doc: Any, form: str):
    if form == "mapping":
        return parse(doc)
    text = json.dumps(doc)                       # NaN / Infinity as JSON extensions
    return parse(text if form == "text" else text.encode("utf-8"))


FORMS = st.sampled_from(["mapping", "text", "bytes"])


@settings(FUZZ, max_examples=120)
@given(version=st.sampled_from(VERSIONS), data=st.data(), form=FORMS)
def test_squeue_mutations(version, data, form):
    doc = _mutate(SQUEUE[version], data)
    try:
        jobs = _feed(parse_squeue, doc, form)
    except InputError as exc:
        assert str(exc)
    else:
        assert all(isinstance(j, SlurmJob) and isinstance(j.comment, str) and j.job_id > 0
                   for j in jobs)


@settings(FUZZ, max_examples=100)
@given(version=st.sampled_from(VERSIONS), data=st.data(), form=FORMS)
def test_sinfo_mutations(version, data, form):
    doc = _mutate(SINFO[version], data)
    try:
        nodes = _feed(parse_sinfo, doc, form)
    except InputError as exc:
        assert str(exc)
    else:
        assert all(isinstance(n, SlurmNode) and n.name for n in nodes)


def _job_doc(version: str, field: str, value: Any) -> dict:
    doc = copy.deepcopy(SQUEUE[version])
    doc["jobs"] = [dict(doc["jobs"][0], **{field: value})]
    return doc


# Regressions: each of these raised something other than InputError.
@pytest.mark.parametrize("doc", [
    '{"jobs": [{"job_id": Infinity, "job_state": "RUNNING"}]}',            # OverflowError
    '{"jobs": [{"job_id": 1, "job_state": "RUNNING", "priority": NaN}]}',  # ValueError
    '{"jobs": [{"job_id": "%s", "job_state": "RUNNING"}]}' % ("1" * 5000),  # ValueError (digits)
    '{"jobs": [{"job_id": %s, "job_state": "RUNNING"}]}' % ("1" * 5000),    # ValueError (json)
    "[" * 100_000,                                                          # RecursionError
    b"\xff\xfe{",                                                           # UnicodeDecodeError
])
def test_squeue_regressions(doc):
    with pytest.raises(InputError):
        parse_squeue(doc)


def test_an_unreadable_gpu_count_is_one_jobs_problem():
    """A GPU count too long for int() (a ValueError once) leaves that job unreadable, not the
    whole read (`parse._job_or_unreadable_gpus`)."""
    (job,) = parse_squeue('{"jobs": [{"job_id": 1, "job_state": "R", '
                          '"tres_per_node": "gres:gpu:%s"}]}' % ("1" * 5000))
    assert job.unreadable.startswith("tres_per_node=") and job.gpus == 0


def test_version_regressions():
    with pytest.raises(InputError):
        version_from_meta({"Slurm": {"version": {"major": float("inf"), "minor": 1}}})
    with pytest.raises(InputError):
        parse_version_text("slurm " + "2" * 5000 + ".05")
    for bad in (["gpu:2(IDX:-)"], ["gpu:1(IDX:0-99999999999)"], ["gpu:1(IDX:5-1-2)"]):
        with pytest.raises(InputError):
            gpu_indices(bad)
    assert gpu_indices(["gpu:3(IDX:0-2,5)"]) == (0, 1, 2, 5)


COMMENT_ELEMENT = st.one_of(HOSTILE, st.text(max_size=15)).map(lambda s: s.replace(";", ""))


@settings(FUZZ, max_examples=150)
@given(version=st.sampled_from(VERSIONS), elements=st.lists(COMMENT_ELEMENT, max_size=4),
       tagged=st.booleans(), position=st.integers(0, 4), form=FORMS)
@example(version="22.05", elements=["$(echo shock:managed)", "x\nshock:managed"], tagged=False,
         position=0, form="text")
@example(version="22.05", elements=["a", " shock:managed\t"], tagged=False, position=0,
         form="text")
def test_hostile_comments_round_trip(version, elements, tagged, position, form):
    if tagged:
        elements = elements[:position] + [MANAGED_TAG] + elements[position:]
    comment = ";".join(elements)
    # an element equal to the tag once blanks are trimmed at both ends (e.g. "shock:managed"
    # drawn from HOSTILE, or " shock:managed\t") also tags the job; a tag inside text does not
    expect_managed = any(e.strip(" \t\r\n\v\f") == MANAGED_TAG for e in elements)
    if form == "bytes" and any("\ud800" <= c <= "\udfff" for c in comment):
        form = "text"                # a lone surrogate has no UTF-8 bytes (json.dumps escapes it)
    (job,) = _feed(parse_squeue, _job_doc(version, "comment", comment), form)
    assert job.comment == comment                # literally, never interpreted
    assert job.managed is expect_managed


KEY = st.from_regex(r"[A-Za-z][A-Za-z0-9_]{0,10}", fullmatch=True)
VALUE = st.text(st.characters(blacklist_characters="=", blacklist_categories=("Cs",)), max_size=20)


@settings(FUZZ, max_examples=150)
@given(pairs=st.lists(st.tuples(KEY, VALUE), max_size=6))
def test_scontrol_round_trip(pairs):
    line = " ".join(f"{k}={v}" for k, v in pairs)
    out = parse_scontrol_line(line)
    first: dict[str, str] = {}
    for k, v in pairs:
        first.setdefault(k, v)
    assert set(out) == set(first)
    for k, v in first.items():
        assert out[k] == v.strip()


@settings(FUZZ, max_examples=150)
@given(line=st.one_of(st.text(max_size=200),
                      st.lists(st.one_of(KEY, HOSTILE, st.just("="), st.just(" ")),
                               max_size=20).map("".join)))
def test_scontrol_arbitrary_text(line):
    out = parse_scontrol_line(line)
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in out.items())

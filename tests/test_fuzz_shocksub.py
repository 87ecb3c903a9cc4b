"""Fuzz `shockslurm.slurm.submit`: building and validating a `JobRequest` from random input.

Contract: construction raises only `InputError` (naming the field); an accepted request renders a
script `bash -n` accepts, and every user-given argv element appears in it shell-quoted, literally.
"""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from shockslurm.errors import InputError
from shockslurm.slurm.job_script import load_template, render_script
from shockslurm.slurm.submit import TEMPLATES, JobRequest, sbatch_argv
from shockslurm.slurm.types import MANAGED_TAG, SPEC_PREFIX

from .conftest import REQUIRE_ALL

FUZZ = settings(deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
FIELDS = {"job_name", "gpus", "model", "epochs", "samples_per_epoch", "batch_sizes", "batch_size",
          "command", "script", "nodes", "partition", "cpus_per_gpu", "time", "account", "qos",
          "output", "mode", "template", "grace_seconds", "max_restarts", "epoch_seconds",
          "constraint", "exclude", "nodelist", "gpu_type"}

HOSTILE = st.sampled_from([
    "", "-", "--help", "a b", "'", '"', "\\", "$(reboot)", "`id`", "${HOME}", "$HOME", ";", "&&",
    "|", ">", "<", "*", "~", "#", "!", "\t", "\n", "x\n", "\r", "\x00", "\x0b", "\x7f", "\u2028",
    "🧨", "gpu\n", "10\n", "٣", "a" * 65, "a" * 64, "x.out\n", "%x-%j.out", "UNLIMITED"])
TEXT = st.one_of(HOSTILE, st.text(max_size=16),
                 st.from_regex(r"[A-Za-z0-9._-]{1,12}", fullmatch=True))
INTS = st.one_of(st.integers(min_value=-3, max_value=70), st.integers(),
                 st.sampled_from([True, False, 1.0, 2.5, float("nan"), "4", None]))
LADDER = st.one_of(st.lists(st.integers(min_value=-2, max_value=2048), max_size=5).map(tuple),
                   st.lists(st.one_of(st.integers(1, 64), st.booleans(), st.floats()),
                            max_size=3).map(tuple))
COMMAND = st.lists(TEXT, max_size=5).map(tuple)


@st.composite
def requests(draw) -> dict:
    """Keyword arguments for JobRequest: mostly plausible, each field sometimes hostile."""
    ladder = draw(st.one_of(st.lists(st.integers(1, 4096), min_size=1, max_size=5, unique=True)
                            .map(lambda xs: tuple(sorted(xs))), LADDER))
    kw = {
        "job_name": draw(TEXT), "gpus": draw(st.one_of(st.integers(1, 8), INTS)),
        "model": draw(st.one_of(st.just("ResNet-18"), TEXT)),
        "epochs": draw(st.one_of(st.integers(1, 100), INTS)),
        "samples_per_epoch": draw(st.one_of(st.integers(1, 10**6), INTS)),
        "batch_sizes": ladder,
        "batch_size": draw(st.one_of(st.sampled_from(ladder) if ladder else st.just(1), INTS)),
        "command": draw(COMMAND),
    }
    optional = {
        "script": st.one_of(st.none(), TEXT), "nodes": INTS, "partition": st.one_of(st.none(), TEXT),
        "cpus_per_gpu": st.one_of(st.none(), INTS), "time": st.one_of(st.none(), TEXT),
        "account": st.one_of(st.none(), TEXT), "qos": st.one_of(st.none(), TEXT),
        "output": TEXT, "mode": st.one_of(st.sampled_from(["static", "gns", "accordion"]), TEXT),
        "template": st.one_of(st.sampled_from(TEMPLATES), TEXT), "grace_seconds": INTS,
        "max_restarts": INTS,
        "epoch_seconds": st.one_of(st.none(), st.floats(allow_nan=True), INTS),
        "constraint": st.one_of(st.none(), TEXT, st.sampled_from(["a100", "a|b", "[a*2&b]"])),
        "exclude": st.one_of(st.none(), TEXT, st.just("gpu[01-02]")),
        "nodelist": st.one_of(st.none(), TEXT, st.just("gpu[01-99999999]")),
        "gpu_type": st.one_of(st.none(), TEXT)}
    for key in draw(st.lists(st.sampled_from(sorted(optional)), unique=True, max_size=4)):
        kw[key] = draw(optional[key])
    return kw


def _build(kw: dict) -> JobRequest | None:
    try:
        return JobRequest(**kw)
    except InputError as exc:
        assert exc.field in FIELDS, str(exc)
        return None


def _check_accepted(req: JobRequest) -> str:
    """Static checks of an accepted request; returns the rendered script."""
    argv = sbatch_argv(req, "/tmp/job.sbatch")
    for element in argv:
        assert not any(c in element for c in "\x00\n\r"), element
    comment = [a for a in argv if a.startswith("--comment=")]
    assert len(comment) == 1
    spec_text = comment[0][len("--comment=" + SPEC_PREFIX):]
    assert ";" not in spec_text and " " not in spec_text
    assert json.loads(spec_text) == req.spec
    assert MANAGED_TAG not in (comment[0] + ";").split(";")   # only job_submit.lua may tag it
    script = render_script(req, load_template(req.template))
    user = list(req.command) + ([req.script] if req.script is not None else [])
    for element in user:                                      # quoted, never interpreted
        assert shlex.quote(element) in script, element
    header = [ln for ln in script.splitlines() if ln.startswith("#SBATCH")]
    for line in header:
        assert len(shlex.split(line)) == 2, line              # "#SBATCH --opt=value": one token
    return script


@settings(FUZZ, max_examples=400)
@given(kw=requests())
@example(kw={"job_name": "j", "gpus": 1, "model": "m", "epochs": 1, "samples_per_epoch": 1,
             "batch_sizes": (32,), "batch_size": 32, "command": ("x",), "partition": "gpu\n"})
@example(kw={"job_name": "j\n", "gpus": 1, "model": "m", "epochs": 1, "samples_per_epoch": 1,
             "batch_sizes": (32,), "batch_size": 32, "command": ("x",)})
@example(kw={"job_name": "j", "gpus": 1, "model": "m", "epochs": 1, "samples_per_epoch": 1,
             "batch_sizes": (32,), "batch_size": 32, "command": ("x",), "output": "x.out\n"})
@example(kw={"job_name": "j", "gpus": 1, "model": "m", "epochs": 1, "samples_per_epoch": 1,
             "batch_sizes": (32,), "batch_size": 32, "command": ("x",), "time": "10\n"})
@example(kw={"job_name": "j", "gpus": 1, "model": "m", "epochs": 1, "samples_per_epoch": 1,
             "batch_sizes": (True,), "batch_size": 1, "command": ("x",)})
@example(kw={"job_name": "j", "gpus": 1, "model": "m", "epochs": 1, "samples_per_epoch": 1,
             "batch_sizes": (1,), "batch_size": True, "command": ("x",)})
@example(kw={"job_name": "j", "gpus": 1, "model": "m", "epochs": 1, "samples_per_epoch": 1,
             "batch_sizes": (32,), "batch_size": 32, "command": ("x",), "partition": 5})
@example(kw={"job_name": "j", "gpus": 1, "model": "m", "epochs": 1, "samples_per_epoch": 1,
             "batch_sizes": (32,), "batch_size": 32, "command": (1, 2)})
@example(kw={"job_name": "j", "gpus": 1, "model": "m", "epochs": 1, "samples_per_epoch": 1,
             "batch_sizes": (32,), "batch_size": 32, "command": (), "script": 7})
def test_requests_validate_or_input_error(kw):
    req = _build(kw)
    if req is not None:
        _check_accepted(req)
        # Regressions above: a trailing "\n" passed the `$` anchor, bools passed as ints, and
        # non-strings raised TypeError/AttributeError.
        for field in ("job_name", "partition", "time", "output"):
            value = getattr(req, field)
            assert value is None or "\n" not in value


# Inputs that pass validation with the most shell-hostile text where text is allowed.
ACCEPTED_COMMAND = st.lists(st.text(st.characters(blacklist_characters="\x00\n\r",
                                                  blacklist_categories=("Cs",)), max_size=12)
                            | HOSTILE.filter(lambda s: not any(c in s for c in "\x00\n\r")),
                            min_size=1, max_size=5)


@pytest.mark.skipif(shutil.which("bash") is None and not REQUIRE_ALL, reason="needs bash")
@settings(FUZZ, max_examples=15)
@given(command=ACCEPTED_COMMAND, use_script=st.booleans(),
       template=st.sampled_from(TEMPLATES), nodes=st.integers(1, 3))
@example(command=["$(touch /tmp/pwned)", "`id`", "'", "a b", "--x", ";", "\u2028"],
         use_script=True, template="multi_node", nodes=2)
def test_rendered_scripts_pass_bash_n(command, use_script, template, nodes):
    if template == "single_node":
        nodes = 1
    script = None
    if use_script:
        script, command = (command[0] or "train.py").lstrip("-") or "train.py", command[1:]
    elif command[0].startswith("-") or not command[0]:
        command = ["python", *command]
    req = JobRequest(job_name="fuzz", gpus=2, model="ResNet-18", epochs=3, samples_per_epoch=100,
                     batch_sizes=(16, 32), batch_size=16, command=tuple(command), script=script,
                     nodes=nodes, template=template)
    text = _check_accepted(req)
    proc = subprocess.run(["bash", "-n"], input=text, capture_output=True, text=True, timeout=20)
    assert proc.returncode == 0, proc.stderr

"""Build a Slurm batch submission (pure, dry-runnable) apart from running it.

In the torchx style, everything that decides *what* is submitted (`JobRequest`, `sbatch_argv`,
and the job script, `job_script.render_script`) is a pure function of validated input, so
`shocksub --dry-run` and the golden tests see exactly what a real submission would send. Only
`submit` touches the system.

Why the rules below (see /work/shared/slurm/NOTES.md, Slurm 22.05):
- GPUs are always requested as `--gres=gpu:N` per node: the meta-scheduler resizes pending jobs
  with `scontrol update Gres=gpu:K`, which fails for `--gpus` jobs, and the `gres/gpu:` form is
  silently ignored.
- The spec travels in `--comment` (Slurm sets no SLURM_JOB_COMMENT, and the daemon reads it from
  squeue); job_submit.lua appends `;shock:managed`, so the spec must hold no `;` or newline.
- sbatch is always called with an argv list, never through a shell. User text that reaches the
  script is either matched against a strict pattern or quoted with `shlex.quote`.
- The job's report secret (`$SHOCKSLURM_REPORT_SECRET`, see `train.records`) is written only into
  the job script (mode 0600 in the user's script dir; Slurm shows a batch script to its owner and
  admins only), never on the sbatch command line (visible to every user in `ps`) nor in the
  comment. A dry run shows a placeholder instead.
- The job's report spool (the site configuration's `[daemon] spool_dir`, read by shocksub) is
  exported as `$SHOCKSLURM_SPOOL` unless the job's environment already names one, so the
  helper's reports reach the daemon with no setting by the user.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from dataclasses import dataclass
from typing import Callable, Sequence

from .. import limits
from ..errors import InputError, ShockslurmError, is_utf8, raw_text
from ..model import ADAPTATION_MODES, MAX_CLUSTER_GPUS
from .constraints import limiting_nodelist, node_rules
from .gres import host_set
from .types import SlurmNode

TEMPLATES = ("single_node", "multi_node")
MAX_GPUS_PER_NODE = 64
MAX_SIGNAL_SECONDS = 65535          # Slurm stores the --signal offset in 16 bits
SBATCH_TIMEOUT_S = 120

NAME_RE = limits.NAME_RE                                     # job and model names
SLURM_NAME_RE = re.compile(r"^[A-Za-z0-9._-]{1,64}(,[A-Za-z0-9._-]{1,64})*$")  # partition(s), …
# Slurm's time formats: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S, or UNLIMITED.
TIME_RE = re.compile(r"^(\d+|\d+:\d{1,2}|\d+:\d{1,2}:\d{1,2}|\d+-\d+(:\d{1,2}){0,2}"
                     r"|UNLIMITED|INFINITE)$", re.ASCII)
# The value of an #SBATCH line: sbatch's parser splits on blanks and strips quotes/backslashes,
# so anything that would be mangled there is refused rather than escaped.
DIRECTIVE_VALUE_RE = re.compile(r"^[^\s'\"\\\x00-\x1f\x7f]+$")
LINE_BREAKERS = ("\x00", "\n", "\r")
# The JobRequest fields holding text, checked for UTF-8 (`require_utf8`) before anything else:
# model before job_name, which shocksub derives from it.
TEXT_FIELDS = ("model", "job_name", "script", "command", "partition", "time", "account", "qos",
               "output", "mode", "template", "constraint", "exclude", "nodelist", "gpu_type")
# A --constraint expression (Slurm's feature names and its operators & | [ ] ( ) * and counts)
CONSTRAINT_RE = re.compile(r"^[A-Za-z0-9_.:&|\[\]()*-]{1,1024}$")
# A GPU type as gres names it (gpu:a100:8)
GPU_TYPE_RE = re.compile(r"^[A-Za-z0-9._-]{1,64}$")
# A host list (--exclude, --nodelist): names, brackets, ranges and commas
HOST_LIST_RE = re.compile(r"^[A-Za-z0-9._\[\],-]{1,1024}$")
# NB: always `fullmatch` these patterns: with `match`, "$" also matches before a trailing "\n",
# so "gpu\n" would pass as a partition name.


class SubmitError(ShockslurmError):
    """sbatch could not be run or refused the job; the message carries its stderr."""


@dataclass(frozen=True)
class JobRequest:
    """One training job to submit. Field names mirror the `shocksub` options (`--job-name`, …).

    Construction validates, so a `JobRequest` that exists is safe to render and submit.
    Either `script` (a Python file, run with `python`/`torchrun`; `command` then holds its
    arguments) or `command` (the full argv each node/rank runs) must be given.
    """

    job_name: str
    gpus: int                                   # per node
    model: str
    epochs: int
    samples_per_epoch: int
    batch_sizes: tuple[int, ...]                # the ladder, ascending
    batch_size: int                             # initial, one of batch_sizes
    command: tuple[str, ...] = ()
    script: str | None = None
    nodes: int = 1
    partition: str | None = None
    cpus_per_gpu: int | None = None
    time: str | None = None
    account: str | None = None
    qos: str | None = None
    output: str = "%x-%j.out"
    mode: str = "static"
    template: str = "single_node"
    grace_seconds: int = 60
    max_restarts: int = 50
    epoch_seconds: float | None = None          # declared exclusive seconds per epoch
    gpu_type: str | None = None                 # --gres=gpu:TYPE:N: the GPUs' type
    constraint: str | None = None               # --constraint: node features
    exclude: str | None = None                  # --exclude: nodes never to run on
    nodelist: str | None = None                 # --nodelist (-w): nodes to run on

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> "JobRequest":
        """Raise `InputError(field=<option name>)` for the first bad field; return self."""
        self._validate_utf8()
        _name("job_name", self.job_name)
        _name("model", self.model)
        _int_range("gpus", self.gpus, 1, MAX_GPUS_PER_NODE)
        # nodes x GPUs per node within the largest cluster the model takes (a bigger job
        # would never be planned)
        _int_range("nodes", self.nodes, 1, MAX_CLUSTER_GPUS // self.gpus)
        # the daemon's bounds (shockslurm.limits): a job beyond them would stay held
        _int_range("epochs", self.epochs, 1, limits.MAX_EPOCHS)
        _int_range("samples_per_epoch", self.samples_per_epoch, 1, limits.MAX_SAMPLES_PER_EPOCH)
        _int_range("grace_seconds", self.grace_seconds, 1, MAX_SIGNAL_SECONDS)
        _int_range("max_restarts", self.max_restarts, 0, None)
        if self.cpus_per_gpu is not None:
            _int_range("cpus_per_gpu", self.cpus_per_gpu, 1, None)
        if self.epoch_seconds is not None and (
                isinstance(self.epoch_seconds, bool)
                or not isinstance(self.epoch_seconds, (int, float))
                or not limits.MIN_EPOCH_SECONDS <= self.epoch_seconds
                <= limits.MAX_EPOCH_SECONDS):
            raise InputError(f"must be a number of seconds in {limits.MIN_EPOCH_SECONDS:g}.."
                             f"{limits.MAX_EPOCH_SECONDS:g}, got {self.epoch_seconds!r}",
                             field="epoch_seconds")
        for field in ("partition", "account", "qos"):
            value = getattr(self, field)
            if value is not None and not (isinstance(value, str)
                                          and SLURM_NAME_RE.fullmatch(value)):
                raise InputError(f"{value!r} is not a Slurm name (letters, digits, '.', '_', "
                                 "'-'; commas between several)", field=field)
        if self.time is not None and not (isinstance(self.time, str)
                                          and TIME_RE.fullmatch(self.time)):
            raise InputError(f"{self.time!r} is not a Slurm time limit (minutes, H:M:S, D-H:M:S, "
                             "UNLIMITED)", field="time")
        if not (isinstance(self.output, str) and DIRECTIVE_VALUE_RE.fullmatch(self.output)):
            raise InputError("the output path must be non-empty without blanks, quotes, "
                             "backslashes or control characters (it goes on an #SBATCH line)",
                             field="output")
        self._validate_node_limits()
        self._validate_ladder()
        if self.mode not in ADAPTATION_MODES:
            raise InputError(f"unknown mode {self.mode!r} (known: {', '.join(ADAPTATION_MODES)})",
                             field="mode")
        if self.template not in TEMPLATES:
            raise InputError(f"unknown template {self.template!r} (known: {', '.join(TEMPLATES)})",
                             field="template")
        if self.template == "single_node" and self.nodes != 1:
            raise InputError(f"the single_node template runs on one node, not {self.nodes}",
                             field="template")
        self._validate_command()
        return self

    def _validate_utf8(self) -> None:
        """Every text field reaches the job script or the sbatch call: refuse non-UTF-8 first."""
        for field in TEXT_FIELDS:
            value = getattr(self, field)
            values = value if field == "command" and isinstance(value, (tuple, list)) else (value,)
            for text in values:
                if isinstance(text, str):       # other types: the field's own check says so
                    require_utf8(field, text)

    def _validate_node_limits(self) -> None:
        if self.gpu_type is not None and not (isinstance(self.gpu_type, str)
                                              and GPU_TYPE_RE.fullmatch(self.gpu_type)):
            raise InputError(f"{self.gpu_type!r} is not a GPU type (letters, digits, '.', '_', "
                             "'-', as the nodes' gres name it, e.g. a100)", field="gpu_type")
        if self.constraint is not None and not (isinstance(self.constraint, str)
                                                and CONSTRAINT_RE.fullmatch(self.constraint)):
            raise InputError(f"{self.constraint!r} is not a feature expression (feature names "
                             "with & | [ ] ( ) * and counts, no blanks)", field="constraint")
        for field in ("exclude", "nodelist"):
            value = getattr(self, field)
            if value is None:
                continue
            if not (isinstance(value, str) and HOST_LIST_RE.fullmatch(value)
                    and host_set(value)):
                raise InputError(f"{value!r} is not a host list (node names, e.g. "
                                 "gpu[01-04],gpu07)", field=field)
        listed = len(host_set(self.nodelist) or ()) if self.nodelist is not None else 0
        if listed > self.nodes:
            # sbatch refuses it ("invalid number of nodes (-N 2-1)", 22.05): Slurm runs a job on
            # every node -w lists
            raise InputError(f"{self.nodelist!r} lists {listed} nodes, more than the job's "
                             f"{self.nodes}: Slurm runs a job on every node -w lists; give "
                             f"--nodes {listed}, or --exclude the nodes it must not use",
                             field="nodelist")

    def _validate_ladder(self) -> None:
        sizes = self.batch_sizes
        if (not isinstance(sizes, (tuple, list)) or not 1 <= len(sizes) <= limits.MAX_LADDER
                or any(not isinstance(b, int) or isinstance(b, bool)
                       or not 1 <= b <= limits.MAX_BATCH_SIZE for b in sizes)):
            raise InputError(f"batch sizes must be 1..{limits.MAX_LADDER} integers in "
                             f"1..{limits.MAX_BATCH_SIZE}, got {limits.shown(sizes)}",
                             field="batch_sizes")
        if any(a >= b for a, b in zip(sizes, sizes[1:])):
            raise InputError(f"batch sizes must be strictly ascending, got {list(sizes)}",
                             field="batch_sizes")
        if (not isinstance(self.batch_size, int) or isinstance(self.batch_size, bool)
                or self.batch_size not in sizes):
            raise InputError(f"initial batch size {self.batch_size} is not in the ladder "
                             f"{list(sizes)}", field="batch_size")

    def _validate_command(self) -> None:
        if not isinstance(self.command, (tuple, list)) or not all(
                isinstance(a, str) for a in self.command):
            raise InputError(f"the command must be a list of strings, got {self.command!r}",
                             field="command")
        if self.script is not None and not isinstance(self.script, str):
            raise InputError(f"{self.script!r} is not a script path", field="script")
        if self.script is None and not self.command:
            raise InputError("give the command to run (after '--') or --script FILE",
                             field="command")
        if self.script is not None and (not self.script or self.script.startswith("-")):
            raise InputError(f"{self.script!r} is not a script path", field="script")
        if self.script is None and self.command[0].startswith("-"):
            raise InputError(f"the command must start with a program, not {self.command[0]!r}",
                             field="command")
        for field, values in (("script", (self.script or "",)), ("command", self.command)):
            for value in values:
                if any(c in value for c in LINE_BREAKERS):
                    raise InputError(f"{value!r} contains a NUL or line break", field=field)

    @property
    def spec(self) -> dict[str, object]:
        """What the meta-scheduler and the training helper need to know about the job."""
        spec: dict[str, object] = {
            "model": self.model, "epochs": self.epochs,
            "samples_per_epoch": self.samples_per_epoch,
            "batch_sizes": list(self.batch_sizes), "batch_size": self.batch_size,
            "mode": self.mode}
        if self.epoch_seconds is not None:   # only when declared: older specs stay byte-equal
            spec["epoch_seconds"] = self.epoch_seconds
        return spec

    def spec_json(self) -> str:
        """The spec as compact, key-sorted JSON: one token, no blanks, no ';', no newline."""
        text = json.dumps(self.spec, sort_keys=True, separators=(",", ":"))
        if any(c in text for c in LINE_BREAKERS + (";", " ")):   # cannot happen after validate
            raise InputError(f"job spec {text!r} would break the Slurm comment", field="model")
        return text


def require_utf8(field: str, value: str) -> None:
    """Refuse text that cannot be encoded as UTF-8 (`errors.is_utf8`): it would fail only when
    written into the job script or the store, after a file was created or the job submitted.
    Raises `InputError(field=field)`."""
    if not is_utf8(value):
        raise InputError(f"not valid UTF-8: '{raw_text(value)}' (the job script, the sbatch "
                         "call and the store take UTF-8 text only)", field=field)


def _name(field: str, value: str) -> None:
    if not isinstance(value, str) or not NAME_RE.fullmatch(value):
        raise InputError(f"{value!r} must be 1-64 characters from letters, digits, '.', '_' "
                         "and '-'", field=field)


def _int_range(field: str, value: int, low: int, high: int | None) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < low or (
            high is not None and value > high):
        bound = f"{low}..{high}" if high is not None else f">= {low}"
        raise InputError(f"must be an integer {bound}, got {value!r}", field=field)


def sbatch_directives(req: JobRequest) -> list[str]:
    """The sbatch options shared by the argv and the script's #SBATCH header (no comment)."""
    gres = f"gpu:{req.gpu_type}:{req.gpus}" if req.gpu_type else f"gpu:{req.gpus}"
    opts = [f"--job-name={req.job_name}", f"--nodes={req.nodes}", f"--gres={gres}"]
    if req.cpus_per_gpu is not None:
        opts.append(f"--cpus-per-gpu={req.cpus_per_gpu}")
    for flag, value in (("partition", req.partition), ("time", req.time),
                        ("account", req.account), ("qos", req.qos),
                        ("constraint", req.constraint), ("exclude", req.exclude),
                        ("nodelist", req.nodelist)):
        if value is not None:
            opts.append(f"--{flag}={value}")
    opts += [f"--output={req.output}", "--open-mode=append", "--requeue",
             f"--signal=B:USR1@{req.grace_seconds}"]
    return opts


def check_fits(req: JobRequest, nodes: Sequence[SlurmNode]) -> None:
    """Refuse a request no node set of the partition can ever hold, its node limits
    (`--gpu-type`, `--exclude`, `--nodelist`, a `--constraint` of a form
    `constraints.feature_test` reads) applied; each refusal names the option that rules the last nodes out.

    Slurm 22.05 accepts a held job that asks for more GPUs per node than any node has (it is only
    refused when scheduled); such a job would sit in the queue forever, so say so at submission.
    """
    where = req.partition or "the cluster"
    pool = [n for n in nodes if req.partition is None or req.partition in n.partitions]
    if not pool:
        raise InputError(f"no node in partition {req.partition!r}", field="partition")
    listed = host_set(req.nodelist or "") or frozenset()
    for field, keep in node_rules(gpu_types=(req.gpu_type,) if req.gpu_type else (),
                                  exclude=req.exclude or "",
                                  nodelist=limiting_nodelist(req.nodelist or "", req.nodes),
                                  constraint=req.constraint or ""):
        left = [n for n in pool if keep(n)]
        if not left:
            raise InputError(f"no node of {where} is left by --{field.replace('_', '-')} "
                             f"{getattr(req, field)}", field=field)
        pool = left
    fitting = [n for n in pool if n.gpus >= req.gpus]
    if not fitting:
        most = max(n.gpus for n in pool)
        raise InputError(f"{req.gpus} GPUs per node requested, but the nodes of {where} the "
                         f"job may run on have at most {most}", field="gpus")
    # a -w shorter than --nodes: Slurm adds other nodes to those it lists, each must hold it
    outside = sorted(listed - {n.name for n in fitting})
    if outside:
        raise InputError(f"{', '.join(outside)} of --nodelist {req.nodelist} cannot hold the "
                         f"job ({req.gpus} GPUs per node, {where}, its other limits applied)",
                         field="nodelist")
    if len(fitting) < req.nodes:
        raise InputError(f"{req.nodes} nodes with {req.gpus} GPUs requested, but only "
                         f"{len(fitting)} exist", field="nodes")


def sbatch_argv(req: JobRequest, script_path: str) -> list[str]:
    """The sbatch call as an argv list (never a shell string); argv options win over #SBATCH."""
    return (["sbatch", "--parsable"] + sbatch_directives(req)
            + [f"--comment=shock:spec={req.spec_json()}", str(script_path)])


def parse_job_id(stdout: str) -> int:
    """`sbatch --parsable` prints `jobid` or `jobid;cluster`."""
    first = stdout.strip().splitlines()[0] if stdout.strip() else ""
    try:
        return int(first.split(";", 1)[0])
    except ValueError:
        raise SubmitError(f"sbatch printed no job id (stdout: {stdout.strip()!r})") from None


def submit(argv: Sequence[str], *, echo: Callable[[str], None] | None = None) -> int:
    """Run sbatch (argv list, no shell) and return the job id.

    Checks the return code *and* stderr: a job_submit plugin's message (e.g. "job tagged and
    held for the meta-scheduler") arrives on stderr with rc 0 and is passed to `echo`.
    """
    argv = [str(a) for a in argv]
    if shutil.which(argv[0]) is None:
        raise SubmitError(f"'{argv[0]}' was not found on PATH: is the Slurm client installed "
                          "and this a submit host? (use --dry-run to see what would be sent)")
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=SBATCH_TIMEOUT_S,
                              check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SubmitError(f"could not run {argv[0]}: {exc}") from exc
    stderr = proc.stderr.strip()
    if proc.returncode != 0:
        raise SubmitError(f"{argv[0]} failed with exit code {proc.returncode}: "
                          f"{stderr or '(no stderr)'}")
    if stderr and echo is not None:
        echo(stderr)
    return parse_job_id(proc.stdout)

"""The job script shocksub submits: a template shipped as package data
(`shockslurm/sbatch_templates/`) filled for one validated `JobRequest` (pure, so `--dry-run` and
the golden tests see what a real submission writes), with the job's report secret and the
site's report spool. Every value is safe for bash: matched against a strict pattern when the
request was validated, or quoted with `shlex.quote` here (`submit`'s docstring says why)."""

from __future__ import annotations

import base64
import re
import secrets
import shlex
from importlib import resources
from string import Template
from typing import Mapping

from ..errors import InputError
from .submit import LINE_BREAKERS, TEMPLATES, JobRequest, sbatch_directives

# an Ed25519 key (`new_report_secret`), or a legacy hex secret: safe unquoted in bash
SECRET_RE = re.compile(r"^(ed25519:[A-Za-z0-9_-]{43}|[0-9a-f]{32,128})$")
DRY_RUN_SECRET = "dry-run-no-secret"       # what --dry-run prints in place of the secret


class ScriptTemplate(Template):
    """`string.Template` whose placeholders are only `${lowercase_name}`.

    Everything else — `$SLURM_NNODES`, `${SLURM_RESTART_COUNT:-0}`, `$!`, `$$` — is bash and
    passes through untouched, so templates read as plain bash. An unknown lowercase placeholder
    still raises KeyError from `substitute`, so a typo cannot ship.
    """

    flags = re.RegexFlag(0)
    # a str here: Template.__init_subclass__ compiles it (typeshed types the compiled pattern)
    pattern = r"""\$(?:
        (?P<escaped>(?!)) |
        (?P<named>(?!)) |
        \{(?P<braced>[a-z][a-z0-9_]*)\} |
        (?P<invalid>(?!))
    )"""  # type: ignore[assignment]


def load_template(name: str) -> str:
    """The text of a template shipped as package data (`shockslurm/sbatch_templates/`)."""
    if name not in TEMPLATES:
        raise InputError(f"unknown template {name!r} (known: {', '.join(TEMPLATES)})",
                         field="template")
    return (resources.files("shockslurm") / "sbatch_templates" / f"{name}.sbatch").read_text()


def new_report_secret() -> str:
    """A fresh per-job report secret: an Ed25519 private key, `ed25519:<base64url>` (the format
    `train.records` signs with). An Ed25519 private key is 32 random bytes (RFC 8032, 5.1.5), so
    it is drawn here without importing the signing code: shocksub stays fast."""
    raw = secrets.token_bytes(32)
    return "ed25519:" + base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=")


def spool_lines(spool: str | None) -> str:
    """The job script's lines that tell the training helper where its reports go: the site's
    spool (`siteconfig.report_spool`, read by shocksub), unless the job's environment names one
    (`$SHOCKSLURM_SPOOL` inherited from the submitter wins)."""
    if spool is None:
        return ("# No report spool was configured at submission ([daemon] spool_dir of the site "
                "configuration):\n# the training helper looks for one itself, or says once in "
                "this log why it cannot report.")
    if any(c in spool for c in LINE_BREAKERS):
        raise InputError(f"{spool!r} contains a NUL or line break", field="report_spool")
    return ("# Where progress reports go: the daemon's spool (the site configuration's "
            "[daemon] spool_dir).\n"
            f"SHOCK_SITE_SPOOL={shlex.quote(spool)}\n"
            'export SHOCKSLURM_SPOOL="${SHOCKSLURM_SPOOL:-$SHOCK_SITE_SPOOL}"')


def template_values(req: JobRequest, report_secret: str | None = None,
                    spool: str | None = None) -> Mapping[str, str]:
    """Every placeholder a template may use; each value is already safe for bash.
    `report_secret` None (a dry run) renders a placeholder; `spool` None: none configured."""
    if report_secret is not None and not SECRET_RE.fullmatch(report_secret):
        raise InputError("the report secret must be an ed25519: key or lowercase hex",
                         field="report_secret")
    if req.script is not None:
        command = ["python", req.script, *req.command]
        torchrun_args = [req.script, *req.command]
    else:
        command = list(req.command)
        torchrun_args = ["--no-python", *req.command]
    return {
        "header": "\n".join(f"#SBATCH {opt}" for opt in sbatch_directives(req)),
        "job_name": req.job_name,
        "gpus": str(req.gpus),
        "nodes": str(req.nodes),
        "grace_seconds": str(req.grace_seconds),
        "max_restarts": str(req.max_restarts),
        "spec": shlex.quote(req.spec_json()),
        "command": " ".join(shlex.quote(a) for a in command),
        "torchrun_args": " ".join(shlex.quote(a) for a in torchrun_args),
        "report_secret": report_secret if report_secret is not None else DRY_RUN_SECRET,
        "report_spool": spool_lines(spool),
    }


def render_script(req: JobRequest, template: str, report_secret: str | None = None,
                  spool: str | None = None) -> str:
    """Fill a template's `${name}` placeholders for this request (pure); `spool` is the site's
    report spool (None: none configured)."""
    return ScriptTemplate(template).substitute(template_values(req, report_secret, spool))

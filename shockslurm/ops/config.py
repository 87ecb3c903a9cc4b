"""The daemon's configuration: one TOML file, every key in one table (`KEYS`), env overrides.

`KEYS` is the single source of truth: validation (`parse_config`), `shockslurm config check`
(effective values and where each came from), the README's key table (`markdown_table`) and
`contrib/shockslurm.toml` (`example_toml`) are all produced from it, and tests check that the
README and the example file equal what it produces, so the documentation cannot drift.

Where the configuration comes from, later wins:
1. the defaults in `KEYS`;
2. the TOML file: `--config FILE`, else `$SHOCKSLURM_CONFIG`, else `DEFAULT_PATH`;
3. the environment: `SHOCKSLURM_DB` (the store URL, the same variable the training helper
   reads), then `SHOCKSLURM_DAEMON_<KEY>` for any `[daemon]` key (upper case, e.g.
   `SHOCKSLURM_DAEMON_METRICS_PORT=0`), which wins over `SHOCKSLURM_DB`, and
   `SHOCKSLURM_POLICY_<OPTION>` for a `[policy]` option (e.g.
   `SHOCKSLURM_POLICY_FUTURE_ROUNDS=30`). A string key takes the value as is; any other key, and
   every policy option, parses it as a TOML value (`120`, `false`, `["gpu", "urgent"]`; a list
   key also accepts `gpu,urgent`; a policy option that is not TOML is taken as a string).

A bad value is a `ConfigError` naming the key (`daemon.round_seconds`, `policy.<option>`) and
where it came from (the file, or the environment variable).
"""

from __future__ import annotations

import math
import os
import re
import textwrap
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from ..errors import ConfigError
from ..policies import REGISTRY, PolicySettings, make_policy, option_names
# The file's lookup and reading, shared with shocksub and the training helper (re-exported).
from ..siteconfig import CONFIG_ENV as CONFIG_ENV
from ..siteconfig import DEFAULT_PATH as DEFAULT_PATH
from ..siteconfig import config_path as config_path
from ..siteconfig import read_toml as read_toml

DB_ENV = "SHOCKSLURM_DB"
ENV_PREFIX = "SHOCKSLURM_DAEMON_"
POLICY_ENV_PREFIX = "SHOCKSLURM_POLICY_"
BACKENDS = ("auto", "cli", "pyslurm")
LOG_FORMATS = ("text", "json")
JOURNALD = ("auto", "yes", "no")
# [policy] keys that are PolicySettings fields; every other key is a policy keyword argument.
SETTINGS_KEYS = ("min_resolve_interval_s", "idle_unallocated")
_SETTINGS_DEFAULTS = PolicySettings()


@dataclass(frozen=True)
class Key:
    """One configuration key. `kind`: positive | nonnegative | string | path | choice |
    partitions | port | bool. `reload`: applied by SIGHUP without a restart."""

    section: str
    name: str
    kind: str
    default: Any
    doc: str
    reload: bool = False
    choices: tuple[str, ...] = ()
    example: Any = None            # the value contrib/shockslurm.toml uses, when not the default
    secret: bool = False           # masked (URL passwords) wherever printed

    @property
    def dotted(self) -> str:
        return f"{self.section}.{self.name}"

    @property
    def env(self) -> str | None:
        return ENV_PREFIX + self.name.upper() if self.section == "daemon" else None

    @property
    def type_name(self) -> str:
        return {"positive": "number > 0", "nonnegative": "number >= 0", "string": "string",
                "path": "string (\"\" = none)", "choice": " | ".join(f'"{c}"' for c in self.choices),
                "partitions": "list of strings", "port": "integer 0-65535",
                "bool": "boolean", "count": "integer >= 0",
                "optional_nonnegative": "number >= 0 (unset = derived)"}[self.kind]


KEYS: tuple[Key, ...] = (
    Key("daemon", "round_seconds", "positive", 120.0,
        "Round length: the policy re-plans and the daemon enacts every this many seconds.",
        reload=True),
    Key("daemon", "policy", "choice", "shockwave",
        "Scheduling policy (`shockslurm simulate --help` lists them).", reload=True,
        choices=tuple(REGISTRY)),
    Key("daemon", "grace_seconds", "nonnegative", 30.0,
        "Longest wait between a stopped job's USR1 and its requeuehold (time to checkpoint); a "
        "job that exits sooner is requeued at once.",
        reload=True),
    Key("daemon", "stop_timeout_seconds", "positive", 60.0,
        "How long a round waits for requeued jobs to release their GPUs.", reload=True),
    Key("daemon", "event_poll_seconds", "nonnegative", 2.0,
        "Between rounds, check Slurm (one `squeue --json`) this often for a job of the plan "
        "that finished while others wait; if one did, the next round starts at once and fills "
        "its GPUs (0 = off: starts only at round boundaries).", reload=True),
    Key("daemon", "partitions", "partitions", ["gpu"],
        "Partitions whose managed (`shock:managed`) jobs the daemon schedules."),
    Key("daemon", "job_name_prefix", "path", "",
        "Admin restriction: schedule only managed jobs whose name starts with this (\"\" = "
        "all). Other managed jobs are left alone and their GPUs count as taken."),
    Key("daemon", "db", "string", "/var/lib/shockslurm/shockslurm.db",
        "The store: a SQLite path or `postgresql+psycopg://USER:PASSWORD@HOST/DB` (put the "
        "password in `SHOCKSLURM_DB`, not here). The default lies in the systemd unit's "
        "`StateDirectory`.", secret=True),
    Key("daemon", "backend", "choice", "auto",
        "Slurm access: `cli` (squeue/sinfo --json, scontrol), `pyslurm`, or `auto` (pyslurm "
        "only when it matches the running Slurm).", choices=BACKENDS),
    Key("daemon", "cluster", "string", "slurm",
        "The cluster name `shocksub --cluster` registers job specs under."),
    Key("daemon", "spool_dir", "path", "",
        "Training reports spooled by jobs, ingested each round (\"\" = none). An absolute path "
        "the nodes share: shocksub passes it to each job as `$SHOCKSLURM_SPOOL`, and the training "
        "helper of a job without that variable reads it from this file. Make it owned by the "
        "daemon's user with mode 1733 (users may add files, not list the directory or remove "
        "others' files), in a directory users cannot write."),
    Key("daemon", "rejected_dir", "path", "",
        "Where refused report files are kept with a `.reason` each, created 0700 and used only "
        "while owned by the daemon and not group/world-writable (\"\" = `<spool_dir>.rejected`)."),
    Key("daemon", "min_run_seconds", "optional_nonnegative", None,
        "Churn bound: a running job is not stopped before its current run is this old "
        "(unset = 1.5 x round_seconds; 0 = no minimum).", reload=True),
    Key("daemon", "max_preemptions_per_day", "count", 24,
        "Churn bound: a job preempted this many times in the last 24 h is left running "
        "(0 = no limit).", reload=True),
    Key("daemon", "max_stops_without_checkpoint", "count", 3,
        "Churn bound: a reporting job whose last this many stops brought no successful "
        "checkpoint is flagged and left running (0 = never flag).", reload=True),
    Key("daemon", "allow_unsigned_reports", "bool", False,
        "Accept spooled training reports that carry no signature, for jobs registered "
        "without a report key (insecure: any user could report for any job)."),
    Key("daemon", "log_format", "choice", "text",
        "`text`: one readable line per round; `json`: one JSON object per line.", reload=True,
        choices=LOG_FORMATS),
    Key("daemon", "journald", "choice", "auto",
        "Log lines for journald: no timestamp of their own, each prefixed with its syslog "
        "priority (`<3>` error ... `<7>` debug) so that `journalctl -p` filters them. `auto`: "
        "when `$JOURNAL_STREAM` says the output goes to the journal.", choices=JOURNALD),
    Key("daemon", "store_timeout_seconds", "positive", 5.0,
        "How long one store read or write may wait (SQLite busy timeout; PostgreSQL connect, "
        "lock and statement timeouts) before the round is abandoned as a store outage."),
    Key("daemon", "max_snapshot_age_seconds", "optional_nonnegative", None,
        "A round whose Slurm snapshot is older than this when it comes to act re-reads Slurm "
        "and re-plans instead (unset = round_seconds / 2).", reload=True),
    Key("daemon", "standby_retry_seconds", "positive", 5.0,
        "A standby daemon (another one holds the leader lock) tries to take the lock this "
        "often (at most every round)."),
    Key("daemon", "metrics_address", "string", "127.0.0.1",
        "Address the Prometheus endpoint binds to (`0.0.0.0` to expose it)."),
    Key("daemon", "metrics_port", "port", 9814,
        "Port of the Prometheus endpoint `/metrics` (0 = off)."),
    Key("policy", "min_resolve_interval_s", "nonnegative", _SETTINGS_DEFAULTS.min_resolve_interval_s,
        "Gavel-style policies re-solve only when the job set changed and this many seconds "
        "passed (the reference's gate; 0 = every change).", reload=True),
    Key("policy", "idle_unallocated", "bool", _SETTINGS_DEFAULTS.idle_unallocated,
        "Gavel-style policies: a job arriving between re-solves waits for the next one "
        "(the reference's behaviour) instead of taking idle GPUs.", reload=True),
)
BY_NAME: dict[str, Key] = {k.dotted: k for k in KEYS}
SECTIONS = ("daemon", "policy")


@dataclass(frozen=True)
class DaemonConfig:
    round_seconds: float = 120.0
    policy: str = "shockwave"
    grace_seconds: float = 30.0
    partitions: tuple[str, ...] = ("gpu",)
    db: str = "/var/lib/shockslurm/shockslurm.db"
    backend: str = "auto"
    cluster: str = "slurm"          # the name `shocksub --cluster` registers specs under
    stop_timeout_seconds: float = 60.0
    event_poll_seconds: float = 2.0
    spool_dir: str = ""             # training reports' spool directory, ingested each round
    rejected_dir: str = ""          # refused reports ("" = `<spool_dir>.rejected`)
    policy_options: Mapping[str, Any] = field(default_factory=dict)
    log_format: str = "text"
    journald: str = "auto"
    metrics_address: str = "127.0.0.1"
    metrics_port: int = 9814
    job_name_prefix: str = ""
    min_run_seconds: float | None = None     # None: 1.5 x round_seconds
    max_preemptions_per_day: int = 24
    max_stops_without_checkpoint: int = 3
    allow_unsigned_reports: bool = False
    store_timeout_seconds: float = 5.0
    max_snapshot_age_seconds: float | None = None     # None: round_seconds / 2
    standby_retry_seconds: float = 5.0
    sources: Mapping[str, str] = field(default_factory=dict, compare=False)  # key -> origin

    @property
    def snapshot_age_bound(self) -> float:
        """`max_snapshot_age_seconds`, or half a round when unset."""
        if self.max_snapshot_age_seconds is None:
            return self.round_seconds / 2
        return self.max_snapshot_age_seconds

    def policy_settings(self) -> PolicySettings:
        opts = dict(self.policy_options)
        kwargs: dict[str, Any] = {k: opts.pop(k) for k in SETTINGS_KEYS if k in opts}
        return PolicySettings(round_s=self.round_seconds, options=tuple(sorted(opts.items())),
                              **kwargs)


# --------------------------------------------------------------------------- masking
_URL_PASSWORD = re.compile(r"(\b[A-Za-z][A-Za-z0-9+.\-]*://[^:/@\s]*:)([^@\s]+)(@)")


def mask(text: str) -> str:
    """Hide passwords in URLs anywhere in `text`: `scheme://user:***@host/db`."""
    return _URL_PASSWORD.sub(r"\1***\3", text)


# --------------------------------------------------------------------------- validation
def _check(key: Key, value: Any, source: str) -> Any:
    def bad(msg: str) -> ConfigError:
        return ConfigError(f"{msg}, got {value!r}", source=source, field=key.dotted)

    if key.kind in ("positive", "nonnegative"):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise bad("must be a number")
        if not math.isfinite(value) or value < 0 or (key.kind == "positive" and value == 0):
            raise bad(f"must be a finite number {'> 0' if key.kind == 'positive' else '>= 0'}")
        return float(value)
    if key.kind == "string":
        if not isinstance(value, str) or not value:
            raise bad("must be a non-empty string")
        return value
    if key.kind == "path":
        if not isinstance(value, str):
            raise bad("must be a string (\"\" for none)")
        return value
    if key.kind == "choice":
        if not isinstance(value, str) or value not in key.choices:
            raise bad(f"must be one of {', '.join(key.choices)}")
        return value
    if key.kind == "partitions":
        if (not isinstance(value, list) or not value
                or not all(isinstance(p, str) and p for p in value)):
            raise bad("must be a non-empty list of partition names")
        return tuple(value)
    if key.kind == "optional_nonnegative":
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise bad("must be a number")
        if not math.isfinite(value) or value < 0:
            raise bad("must be a finite number >= 0")
        return float(value)
    if key.kind == "count":
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise bad("must be an integer >= 0 (0 = off)")
        return value
    if key.kind == "port":
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 65535:
            raise bad("must be an integer port 0-65535 (0 = off)")
        return value
    if key.kind == "bool":
        if not isinstance(value, bool):
            raise bad("must be true or false")
        return value
    raise AssertionError(key.kind)  # pragma: no cover


def _toml_or_text(raw: str) -> Any:
    try:
        return tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        return raw


def _env_value(key: Key, raw: str) -> Any:
    if key.kind in ("string", "path", "choice"):
        return raw
    value = _toml_or_text(raw)
    if value is raw and key.kind == "partitions":
        return [p.strip() for p in raw.split(",") if p.strip()]
    return value  # a string where another type is expected: reported by _check


def parse_config(data: Mapping[str, Any], source: str = "<config>",
                 env: Mapping[str, str] | None = None) -> DaemonConfig:
    """Validate a parsed TOML document (plus `env` overrides, when given) into a
    `DaemonConfig`."""
    unknown_tables = set(data) - set(SECTIONS)
    if unknown_tables:
        raise ConfigError("unknown table (known: [daemon], [policy])", source=source,
                          field=sorted(map(str, unknown_tables))[0])
    tables: dict[str, dict[str, Any]] = {}
    for section in SECTIONS:
        table = data.get(section, {})
        if not isinstance(table, dict):
            raise ConfigError("must be a table", source=source, field=section)
        tables[section] = table
    known = [k.name for k in KEYS if k.section == "daemon"]
    for name in tables["daemon"]:
        if name not in known:
            raise ConfigError(f"unknown key (known: {', '.join(sorted(known))})", source=source,
                              field=f"daemon.{name}")
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for key in KEYS:
        table = tables[key.section]
        if key.name in table:
            values[key.dotted] = _check(key, table[key.name], source)
            sources[key.dotted] = source
        elif key.section == "daemon":
            values[key.dotted] = _check(key, key.default, "<defaults>")
            sources[key.dotted] = "default"
    for key in KEYS:  # environment overrides: SHOCKSLURM_DB, then SHOCKSLURM_DAEMON_<KEY>
        for var in ((DB_ENV,) if key.dotted == "daemon.db" else ()) + ((key.env,) if key.env
                                                                        else ()):
            if env is not None and var in env:
                where = f"environment variable {var}"
                values[key.dotted] = _check(key, _env_value(key, env[var]), where)
                sources[key.dotted] = var
    options = dict(tables["policy"])
    origins = {name: source for name in options}
    for var, raw in sorted((env or {}).items()):   # SHOCKSLURM_POLICY_<OPTION>
        name = var[len(POLICY_ENV_PREFIX):].lower()
        if var.startswith(POLICY_ENV_PREFIX) and name:
            options[name] = _env_value(BY_NAME[f"policy.{name}"], raw) if \
                f"policy.{name}" in BY_NAME else _toml_or_text(raw)
            origins[name] = f"environment variable {var}"
            sources[f"policy.{name}"] = var
    for name in options:
        sources.setdefault(f"policy.{name}", source)
    d = {k.name: values[k.dotted] for k in KEYS if k.section == "daemon"}
    options = check_policy_settings(options, origins)
    assign_policy_options([d["policy"]], options, origins)
    return DaemonConfig(policy_options=options, sources=sources, **d)


# --------------------------------------------------------------------------- policy options
def check_policy_settings(options: Mapping[str, Any], origins: Mapping[str, str]
                          ) -> dict[str, Any]:
    """Validate the `[policy]` keys that are `PolicySettings` fields (`SETTINGS_KEYS`);
    `origins` maps each option to where it came from (for the error)."""
    out = dict(options)
    for name in SETTINGS_KEYS:
        if name in out:
            out[name] = _check(BY_NAME[f"policy.{name}"], out[name], origins[name])
    return out


def assign_policy_options(policies: Sequence[str], options: Mapping[str, Any],
                          origins: Mapping[str, str]) -> dict[str, dict[str, Any]]:
    """Hand each policy option (every key but `SETTINGS_KEYS`) to the chosen policies that take
    it, and build each policy with its options. A key no chosen policy takes, or a value a
    policy refuses, is a `ConfigError` naming `policy.<key>` and where it came from."""
    per: dict[str, dict[str, Any]] = {p: {} for p in policies}
    for name, value in options.items():
        if name in SETTINGS_KEYS:
            continue
        takers = [p for p in policies if name in option_names(p)]
        if not takers:
            taken = "; ".join(f"{p} takes {', '.join(option_names(p)) or 'none'}"
                              for p in policies)
            raise ConfigError(f"no chosen policy takes this option ({taken})",
                              source=origins[name], field=f"policy.{name}")
        for p in takers:
            per[p][name] = value
    for p, opts in per.items():
        for name, value in opts.items():     # one at a time, so that the error names the key
            _build(p, {name: value}, origins[name], f"policy.{name}")
        if len(opts) > 1:                     # together: checks across options
            _build(p, opts, ", ".join(sorted({origins[n] for n in opts})), "policy")
    return per


def _build(policy: str, options: Mapping[str, Any], source: str, field_name: str) -> None:
    try:
        make_policy(policy, PolicySettings(options=tuple(sorted(options.items()))))
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"the policy {policy!r} refused it: {exc}", source=source,
                          field=field_name) from None


def parse_policy_assignments(items: Sequence[str], source: str) -> dict[str, Any]:
    """`KEY=VALUE` strings (`--policy-option`) as options; a VALUE is parsed as TOML (`30`,
    `1e-3`, `true`, `[0, 0.5, 1]`), else taken as a string."""
    out: dict[str, Any] = {}
    for item in items:
        name, sep, raw = item.partition("=")
        name = name.strip()
        if not sep or not name:
            raise ConfigError(f"expected KEY=VALUE, got {item!r}", source=source)
        out[name] = _toml_or_text(raw.strip())
    return out


def read_policy_table(path: str | Path) -> dict[str, Any]:
    """The `[policy]` table of a daemon configuration file (`{}` without one); the file is
    read as `load_config` reads it, and its other tables are not used."""
    data = read_toml(path)
    table = data.get("policy", {})
    if not isinstance(table, dict):
        raise ConfigError("must be a table", source=str(path), field="policy")
    return table


def load_config(path: str | Path, env: Mapping[str, str] | None = None) -> DaemonConfig:
    """Read and validate the TOML file; `env` (e.g. `os.environ`) applies the overrides."""
    return parse_config(read_toml(path), source=str(path), env=env)


def load_effective(cli_path: str | Path | None = None,
                   env: Mapping[str, str] | None = None) -> tuple[Path, DaemonConfig]:
    env = os.environ if env is None else env
    path = config_path(cli_path, env)
    return path, load_config(path, env)


# --------------------------------------------------------------------------- rendering
def _toml(value: Any) -> str:
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (tuple, list)):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return repr(value)


def effective_toml(cfg: DaemonConfig) -> str:
    """The effective configuration as TOML, secrets masked, each value's origin in a comment."""
    lines = ["[daemon]"]
    for key in KEYS:
        if key.section != "daemon":
            continue
        value = getattr(cfg, key.name)
        origin = cfg.sources.get(key.dotted, 'default')
        if value is None:
            lines.append(f"# {key.name} unset    # {origin}")
            continue
        text = _toml(value)
        if key.secret:
            text = mask(text)
        lines.append(f"{key.name} = {text}    # {origin}")
    lines.append("")
    lines.append("[policy]")
    settings = cfg.policy_settings()
    for name in SETTINGS_KEYS:
        origin = cfg.sources.get(f"policy.{name}", "default")
        lines.append(f"{name} = {_toml(getattr(settings, name))}    # {origin}")
    for name, value in sorted(cfg.policy_options.items()):
        if name not in SETTINGS_KEYS:
            lines.append(f"{name} = {_toml(value)}    # {cfg.sources.get('policy.' + name)}"
                         " (policy option)")
    return "\n".join(lines) + "\n"


def markdown_table() -> str:
    """The README's table of keys."""
    rows = ["| key | type | default | SIGHUP | environment | meaning |",
            "|---|---|---|---|---|---|"]
    for k in KEYS:
        env = f"`{k.env}`" + (f", `{DB_ENV}`" if k.dotted == "daemon.db" else "") if k.env \
            else ""
        rows.append(f"| `{k.dotted}` | {k.type_name.replace('|', chr(92) + '|')} | `{_toml(k.default)}` | "
                    f"{'yes' if k.reload else 'restart'} | {env} | {k.doc} |")
    return "\n".join(rows) + "\n"


def example_toml() -> str:
    """contrib/shockslurm.toml: every key with its documentation and default."""
    out = ["# shockslurm daemon configuration (generated by `shockslurm config example`;",
           "# every key, its default and meaning: README \"Configuration keys\").",
           "# Install as /etc/shockslurm/shockslurm.toml; validate with `shockslurm config check`.",
           "# Environment overrides: SHOCKSLURM_DB (the store URL, e.g. with a password) and",
           "# SHOCKSLURM_DAEMON_<KEY> for any [daemon] key, SHOCKSLURM_POLICY_<OPTION> for a",
           "# [policy] option. `systemctl reload shockslurm`",
           "# (SIGHUP) re-reads this file; keys marked [restart] need a restart."]
    for section in SECTIONS:
        out.append("")
        out.append(f"[{section}]")
        if section == "policy":
            out += ["# Options of the chosen policy. The two below apply to the Gavel-style",
                    "# baselines; any other key is passed to the policy (for shockwave: the",
                    "# fields of ShockwaveConfig, e.g. future_rounds = 20). Uncomment to set."]
        for k in KEYS:
            if k.section != section:
                continue
            out += textwrap.wrap(f"{k.doc} ({k.type_name}; default {_toml(k.default)}"
                                 f"{'' if k.reload else '; [restart]'})", 96,
                                 initial_indent="# ", subsequent_indent="# ",
                                 break_on_hyphens=False)
            value = k.default if k.example is None else k.example
            if value is None:
                out.append(f"# {k.name} =")
                continue
            out.append(f"{'# ' if section == 'policy' else ''}{k.name} = {_toml(value)}")
    return "\n".join(out) + "\n"

"""The daemon's settings, each declared once: name, type, validator, default and documentation.

`DaemonConfig`'s fields are the `[daemon]` keys (gunicorn's config style: a setting is one
declaration): `setting(kind, default, doc)` puts the key's validator (its `kind`), default and
documentation on the field, and `KEYS` is read from the fields, followed by the two `[policy]`
keys that are `PolicySettings` fields. A default the layer using it already declares is read
from there, not written again: the round length and the re-solve gate (`PolicySettings`), the
churn bounds (`live.enact.ChurnLimits`), the cluster name (`siteconfig`). Everything else is
produced from `KEYS`: validation and the environment overrides (`ops.config.parse_config`),
`shockslurm config check`, the README's key table and `contrib/shockslurm.toml`
(`ops.config_render`), the reload rules (`daemon.runner`).

A key's `kind` names its validator (`KINDS`): positive | nonnegative | optional_nonnegative |
count | port | string | path | directory | choice | partitions | bool. A number key may narrow
its kind's range (`minimum`, `maximum`): the validator, the documentation and the error all say
the range (`_range`).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, fields
from typing import Any, Callable, Mapping, TypeVar

from ..errors import ConfigError
from ..limits import SETTING_CHARS, finite, is_real, shown
from ..churn_rules import ChurnLimits
from ..live.acting import GRACE_SECONDS, PARTITIONS, STOP_TIMEOUT_S
from ..policies import REGISTRY, PolicySettings
from ..siteconfig import DEFAULT_CLUSTER, check_cluster, check_directory

DB_ENV = "SHOCKSLURM_DB"
ENV_PREFIX = "SHOCKSLURM_DAEMON_"
POLICY_ENV_PREFIX = "SHOCKSLURM_POLICY_"
BACKENDS = ("auto", "cli", "pyslurm")
LOG_FORMATS = ("text", "json")
JOURNALD = ("auto", "yes", "no")
SECTIONS = ("daemon", "policy")
# The shortest period the daemon repeats anything at: rounds and a standby's tries of the leader
# lock (each a full Slurm read or a store query; 1e-300 s rounds ran 130 a second). 0.5 s is the
# shortest round documented (README, `bench live --round-seconds 0.5`).
MIN_PERIOD_SECONDS = 0.5
# The longest the daemon waits on one setting: a round, a round's wait for released GPUs, a
# store statement. Longer is a unit slip; 1e300 s overflows the waits (OverflowError), and
# PostgreSQL takes its timeouts in 32-bit milliseconds (at most 24.8 days).
MAX_WAIT_SECONDS = 86_400.0

T = TypeVar("T")
# Defaults owned by the layer that uses them, read here so that each is written once (also the
# live scheduler's partitions, grace and stop timeout, from `live.acting`).
_POLICY_DEFAULTS = PolicySettings()
_CHURN_DEFAULTS = ChurnLimits()


# --------------------------------------------------------------------------- validators
class _Bad(ValueError):
    """A validator's refusal; `Key.check` turns it into a `ConfigError` naming the key."""


def _range(key: Key) -> str:
    """A number key's range as its documentation and errors say it (`> 0`, `>= 0.5, <= 86400`):
    `minimum` and `maximum`, and above 0 for the kind `positive`."""
    low = "> 0" if key.kind == "positive" and key.minimum == 0 else f">= {key.minimum:g}"
    return low if math.isinf(key.maximum) else f"{low}, <= {key.maximum:g}"


def _number(value: Any, key: Key) -> float:
    """A finite number in the key's range (`_range`)."""
    if not is_real(value):
        raise _Bad("must be a number")
    number = finite(value)
    if not (number is not None and key.minimum <= number <= key.maximum
            and (number > 0 or key.kind != "positive")):
        raise _Bad(f"must be a finite number {_range(key)}")
    return number


def _optional_number(value: Any, key: Key) -> float | None:
    return None if value is None else _number(value, key)


def _count(value: Any, key: Key) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise _Bad("must be an integer >= 0 (0 = off)")
    return value


def _port(value: Any, key: Key) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 65535:
        raise _Bad("must be an integer port 0-65535 (0 = off)")
    return value


def _string(value: Any, key: Key) -> str:
    if not isinstance(value, str) or not value:
        raise _Bad("must be a non-empty string")
    return value


def _path(value: Any, key: Key) -> str:
    if not isinstance(value, str):
        raise _Bad("must be a string (\"\" for none)")
    return value


def _directory(value: Any, key: Key) -> str:
    """`siteconfig.check_directory`'s rule, the one shocksub and the jobs apply too."""
    try:
        return check_directory(value)
    except ValueError as exc:
        raise _Bad(str(exc)) from None


def _cluster(value: Any, key: Key) -> str:
    """`siteconfig.check_cluster`'s rule, the one shocksub applies too."""
    try:
        return check_cluster(value)
    except ValueError as exc:
        raise _Bad(str(exc)) from None


def _choice(value: Any, key: Key) -> str:
    if not isinstance(value, str) or value not in key.choices:
        raise _Bad(f"must be one of {', '.join(key.choices)}")
    return value


# one partition as Slurm names them (squeue is given them joined by commas)
PARTITION_NAME_RE = re.compile(r"[A-Za-z0-9._-]{1,64}")


def _partitions(value: Any, key: Key) -> tuple[str, ...]:
    if (not isinstance(value, (list, tuple)) or not value
            or not all(isinstance(p, str) and p for p in value)):
        raise _Bad("must be a non-empty list of partition names")
    bad = [p for p in value if not PARTITION_NAME_RE.fullmatch(p)]
    if bad:
        raise _Bad(f"must be partition names, each of letters, digits and . _ - (a list of "
                   f"several, not one joined by commas): {bad[0]!r}")
    return tuple(value)


def _store_url(value: Any, key: Key) -> str:
    """A store URL of a form the store opens (`store.database.check_url`); its password is
    never in the message."""
    text = _string(value, key)
    from ..store.database import StoreError, check_url

    try:
        check_url(text)
    except StoreError as exc:
        raise _Bad(str(exc)) from None
    return text


def _bool(value: Any, key: Key) -> bool:
    if not isinstance(value, bool):
        raise _Bad("must be true or false")
    return value


@dataclass(frozen=True)
class Kind:
    """A key's type: its validator, its name in the documentation (`{range}`: a number key's
    range), and whether an environment variable's text is the value itself (else it is parsed
    as TOML)."""

    validate: Callable[[Any, Key], Any]
    type_name: str
    text: bool = False


KINDS: dict[str, Kind] = {
    "positive": Kind(_number, "number {range}"),
    "nonnegative": Kind(_number, "number {range}"),
    "optional_nonnegative": Kind(_optional_number, "number {range} (unset = derived)"),
    "count": Kind(_count, "integer >= 0"),
    "port": Kind(_port, "integer 0-65535"),
    "string": Kind(_string, "string", text=True),
    "cluster": Kind(_cluster, "printable string", text=True),
    "path": Kind(_path, "string (\"\" = none)", text=True),
    "directory": Kind(_directory, "absolute path (\"\" = none)", text=True),
    "choice": Kind(_choice, "", text=True),
    "partitions": Kind(_partitions, "list of strings"),
    "store": Kind(_store_url, "SQLite path or PostgreSQL URL", text=True),
    "bool": Kind(_bool, "boolean"),
}


# --------------------------------------------------------------------------- keys
@dataclass(frozen=True)
class Key:
    """One configuration key. `reload`: applied by SIGHUP without a restart; `secret`: masked
    (URL passwords) wherever printed; `minimum`, `maximum`: a number key's range (`_range`)."""

    section: str
    name: str
    kind: str
    default: Any
    doc: str
    reload: bool = False
    choices: tuple[str, ...] = ()
    secret: bool = False
    minimum: float = 0.0
    maximum: float = math.inf

    @property
    def dotted(self) -> str:
        return f"{self.section}.{self.name}"

    @property
    def env(self) -> str | None:
        return ENV_PREFIX + self.name.upper() if self.section == "daemon" else None

    @property
    def type_name(self) -> str:
        if self.kind == "choice":
            return " | ".join(f'"{c}"' for c in self.choices)
        return KINDS[self.kind].type_name.format(range=_range(self))

    def check(self, value: Any, source: str) -> Any:
        """`value` validated (and normalised: floats, tuples), or a `ConfigError` naming this
        key and `source`."""
        try:
            return KINDS[self.kind].validate(value, self)
        except _Bad as exc:
            raise ConfigError(f"{exc}, got {shown(value, SETTING_CHARS)}", source=source,
                              field=self.dotted) from None


def setting(kind: str, default: T, doc: str, *, reload: bool = False,
            choices: tuple[str, ...] = (), secret: bool = False, minimum: float = 0.0,
            maximum: float = math.inf) -> T:
    """A `[daemon]` key declared as a `DaemonConfig` field: its default is the field's."""
    if kind not in KINDS:
        raise AssertionError(f"unknown kind {kind!r}")
    spec = {"kind": kind, "doc": doc, "reload": reload, "choices": choices, "secret": secret,
            "minimum": minimum, "maximum": maximum}
    return field(default=default, metadata={"key": spec})


# --------------------------------------------------------------------------- the table
@dataclass(frozen=True)
class DaemonConfig:
    """The effective configuration: one field per `[daemon]` key (declared here, once), the
    `[policy]` table, and where each value came from."""

    round_seconds: float = setting(
        "positive", _POLICY_DEFAULTS.round_s,
        "Round length: the policy re-plans and the daemon enacts every this many seconds (at "
        "least 0.5 s, as each round reads Slurm in full; at most a day).", reload=True,
        minimum=MIN_PERIOD_SECONDS, maximum=MAX_WAIT_SECONDS)
    policy: str = setting(
        "choice", "shockwave", "Scheduling policy (`shockslurm simulate --help` lists them).",
        reload=True, choices=tuple(REGISTRY))
    grace_seconds: float = setting(
        "nonnegative", GRACE_SECONDS,
        "Longest wait between a stopped job's USR1 and its requeuehold (time to checkpoint); a "
        "job that exits sooner is requeued at once (at most a day).", reload=True,
        maximum=MAX_WAIT_SECONDS)
    stop_timeout_seconds: float = setting(
        "positive", STOP_TIMEOUT_S,
        "How long a round waits for requeued jobs to release their GPUs (at most a day).",
        reload=True, maximum=MAX_WAIT_SECONDS)
    event_poll_seconds: float = setting(
        "nonnegative", 0.5,
        "Between rounds, check Slurm this often (a light `squeue` of the partitions on our "
        "nodes; the full `squeue --json` only when it changed) for a job of the plan that "
        "finished while others wait, a job we do not schedule that freed GPUs on our nodes "
        "that a waiting job of ours fits, or a new job that fits the idle GPUs; if so, the "
        "next round starts at once (0 = off: starts only at round boundaries). A poll waits "
        "at least 20 times the last light read's duration (a large queue backs it off).",
        reload=True)
    stop_lead_seconds: float = setting(
        "nonnegative", 4.0,
        "Start each round's reads, solve and stop signals this long before its boundary, so "
        "the stopped jobs have exited and their successors run at the boundary (measured on "
        "the test cluster: round start -> successors RUNNING 1.9-3.9 s, of which USR1 -> exit "
        "1.1 s); at most half a round; 0 = off (rounds start at their boundary).", reload=True)
    partitions: tuple[str, ...] = setting(
        "partitions", PARTITIONS,
        "Partitions whose managed (`shock:managed`) jobs the daemon schedules.")
    job_name_prefix: str = setting(
        "path", "",
        "Admin restriction: schedule only managed jobs whose name starts with this (\"\" = "
        "all). Other managed jobs are left alone and their GPUs count as taken.")
    db: str = setting(
        "store", "/var/lib/shockslurm/shockslurm.db",
        "The store: a SQLite path or `postgresql+psycopg://USER:PASSWORD@HOST/DB` (put the "
        "password in `SHOCKSLURM_DB`, not here). The default lies in the systemd unit's "
        "`StateDirectory`.", secret=True)
    backend: str = setting(
        "choice", "auto",
        "Slurm access: `cli` (squeue/sinfo --json, scontrol), `pyslurm`, or `auto` (pyslurm "
        "only when it matches the running Slurm).", choices=BACKENDS)
    cluster: str = setting(
        "cluster", DEFAULT_CLUSTER,
        "The cluster name `shocksub --cluster` registers job specs under.")
    spool_dir: str = setting(
        "directory", "",
        "Training reports spooled by jobs, ingested each round (\"\" = none). An absolute path "
        "(no control characters) the nodes share: shocksub passes it to each job as "
        "`$SHOCKSLURM_SPOOL`, and the training helper of a job without that variable reads it "
        "from this file. Make it owned by the daemon's user with mode 1733 (users may add "
        "files, not list the directory or remove others' files), in a directory users cannot "
        "write.")
    rejected_dir: str = setting(
        "directory", "",
        "Where refused report files are kept with a `.reason` each (an absolute path, no control "
        "characters), created 0700 and used only while owned by the daemon and not "
        "group/world-writable (\"\" = `<spool_dir>.rejected`).")
    min_run_seconds: float | None = setting(
        "optional_nonnegative", None,
        "Churn bound: a running job is not stopped before its current run is this old "
        "(unset = 1.5 x round_seconds; 0 = no minimum).", reload=True)
    finish_window_seconds: float | None = setting(
        "optional_nonnegative", None,
        "Churn bound: a running job expected to finish within this many seconds (its remaining "
        "exclusive run time) is not stopped (unset = 2 x round_seconds; 0 = off).", reload=True)
    max_preemptions_per_day: int = setting(
        "count", _CHURN_DEFAULTS.max_preemptions_per_day,
        "Churn bound: a job preempted this many times in the last 24 h is left running "
        "(0 = no limit).", reload=True)
    max_stops_without_checkpoint: int = setting(
        "count", _CHURN_DEFAULTS.max_stops_without_checkpoint,
        "Churn bound: a reporting job whose last this many stops brought no successful "
        "checkpoint is flagged and left running (0 = never flag).", reload=True)
    allow_unsigned_reports: bool = setting(
        "bool", False,
        "Accept spooled training reports that carry no signature, for jobs registered "
        "without a report key (insecure: any user could report for any job).")
    log_format: str = setting(
        "choice", "text",
        "`text`: one readable line per round; `json`: one JSON object per line.", reload=True,
        choices=LOG_FORMATS)
    journald: str = setting(
        "choice", "auto",
        "Log lines for journald: no timestamp of their own, each prefixed with its syslog "
        "priority (`<3>` error ... `<7>` debug) so that `journalctl -p` filters them. `auto`: "
        "when `$JOURNAL_STREAM` says the output goes to the journal.", choices=JOURNALD)
    store_timeout_seconds: float = setting(
        "positive", 5.0,
        "How long one store read or write may wait (SQLite busy timeout; PostgreSQL connect, "
        "lock and statement timeouts) before the round is abandoned as a store outage (at most "
        "a day: PostgreSQL takes its timeouts in 32-bit milliseconds).", maximum=MAX_WAIT_SECONDS)
    max_snapshot_age_seconds: float | None = setting(
        "optional_nonnegative", None,
        "A round whose Slurm snapshot is older than this when it comes to act re-reads Slurm "
        "and re-plans instead (unset = round_seconds / 2).", reload=True)
    standby_retry_seconds: float = setting(
        "positive", 5.0,
        "A standby daemon (another one holds the leader lock) tries to take the lock this "
        "often (at most every round; at least 0.5 s: each try is a store query).",
        minimum=MIN_PERIOD_SECONDS)
    metrics_address: str = setting(
        "string", "127.0.0.1",
        "Address the Prometheus endpoint binds to (`0.0.0.0` to expose it).")
    metrics_port: int = setting(
        "port", 9814, "Port of the Prometheus endpoint `/metrics` (0 = off).")
    # not keys: the [policy] table, and each key's origin
    policy_options: Mapping[str, Any] = field(default_factory=dict)
    sources: Mapping[str, str] = field(default_factory=dict, compare=False)  # key -> origin

    @property
    def snapshot_age_bound(self) -> float:
        """`max_snapshot_age_seconds`, or half a round when unset."""
        if self.max_snapshot_age_seconds is None:
            return self.round_seconds / 2
        return self.max_snapshot_age_seconds

    def value_of(self, dotted: str) -> Any:
        """The value of key `daemon.NAME`, or of option `policy.NAME` (None: left unset)."""
        section, name = dotted.split(".", 1)
        return self.policy_options.get(name) if section == "policy" else getattr(self, name)

    def policy_settings(self) -> PolicySettings:
        opts = dict(self.policy_options)
        kwargs: dict[str, Any] = {k: opts.pop(k) for k in SETTINGS_KEYS if k in opts}
        return PolicySettings(round_s=self.round_seconds, options=tuple(sorted(opts.items())),
                              **kwargs)


POLICY_KEYS: tuple[Key, ...] = (
    Key("policy", "min_resolve_interval_s", "nonnegative", _POLICY_DEFAULTS.min_resolve_interval_s,
        "Gavel-style policies re-solve only when the job set changed and this many seconds "
        "passed (the reference's gate; 0 = every change; at most a day).", reload=True,
        maximum=MAX_WAIT_SECONDS),
    Key("policy", "idle_unallocated", "bool", _POLICY_DEFAULTS.idle_unallocated,
        "Gavel-style policies: a job arriving between re-solves waits for the next one "
        "(the reference's behaviour) instead of taking idle GPUs.", reload=True),
)
# [policy] keys that are PolicySettings fields; every other key is a policy keyword argument.
SETTINGS_KEYS = tuple(k.name for k in POLICY_KEYS)
DAEMON_KEYS: tuple[Key, ...] = tuple(
    Key("daemon", f.name, default=f.default, **f.metadata["key"])
    for f in fields(DaemonConfig) if "key" in f.metadata)
KEYS: tuple[Key, ...] = DAEMON_KEYS + POLICY_KEYS
BY_NAME: dict[str, Key] = {k.dotted: k for k in KEYS}
RUNTIME_KEYS = frozenset(k.name for k in DAEMON_KEYS if k.reload)

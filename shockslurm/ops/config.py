"""The daemon's configuration: one TOML file, every key in one table, env overrides.

The table, `KEYS`, is declared in `ops/keys.py` (each key once: type, validator, default, doc;
the `[daemon]` keys are `DaemonConfig`'s fields). It is the single source of truth: validation (`parse_config`), `shockslurm config check`
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
where it came from (the file, or the environment variable); so is an unknown key: in the file, a
`SHOCKSLURM_DAEMON_*` variable that names no `[daemon]` key, a policy option no chosen policy
takes. The file must be a regular file of at most 1 MiB (`siteconfig.read_toml`).
"""

from __future__ import annotations

import os
import textwrap
import tomllib
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from ..errors import ConfigError
from ..limits import SETTING_CHARS, shown
from ..policies import PolicySettings, make_policy, option_names
# The file's lookup and reading, shared with shocksub and the training helper (re-exported).
from ..siteconfig import CONFIG_ENV as CONFIG_ENV
from ..siteconfig import DEFAULT_PATH as DEFAULT_PATH
from ..siteconfig import config_path as config_path
from ..siteconfig import read_toml as read_toml
# The key table (re-exported: most callers import it from here).
from .keys import BACKENDS as BACKENDS
from .keys import BY_NAME as BY_NAME
from .keys import DAEMON_KEYS as DAEMON_KEYS
from .keys import DB_ENV as DB_ENV
from .keys import ENV_PREFIX as ENV_PREFIX
from .keys import KEYS as KEYS
from .keys import KINDS as KINDS
from ..masking import mask as mask
from .keys import POLICY_ENV_PREFIX as POLICY_ENV_PREFIX
from .keys import SECTIONS as SECTIONS
from .keys import SETTINGS_KEYS as SETTINGS_KEYS
from .keys import DaemonConfig as DaemonConfig
from .keys import Key as Key

# --------------------------------------------------------------------------- parsing
def _toml_or_text(raw: str) -> Any:
    try:
        return tomllib.loads(f"v = {raw}")["v"]
    except (ValueError, RecursionError):   # TOMLDecodeError, over 4,300 digits, deep nesting
        return raw


def _env_value(key: Key, raw: str) -> Any:
    if KINDS[key.kind].text:
        return raw
    value = _toml_or_text(raw)
    if value is raw and key.kind == "partitions":
        return [p.strip() for p in raw.split(",") if p.strip()]
    return value  # a string where another type is expected: reported by _check


def parse_config(data: Mapping[str, Any], source: str = "<config>",
                 env: Mapping[str, str] | None = None) -> DaemonConfig:
    """Validate a parsed TOML document (plus `env` overrides, when given) into a
    `DaemonConfig`."""
    tables = _tables(data, source)
    _check_env_names(env or {})
    sources: dict[str, str] = {}
    values = _daemon_values(tables["daemon"], source, env or {}, sources)
    options, origins = _policy_options(tables["policy"], source, env or {}, sources)
    options = check_policy_settings(options, origins)
    assign_policy_options([values["policy"]], options, origins)
    return DaemonConfig(policy_options=options, sources=sources, **values)


def _tables(data: Mapping[str, Any], source: str) -> dict[str, dict[str, Any]]:
    """The `[daemon]` and `[policy]` tables (empty when absent); an unknown table or
    `[daemon]` key is a `ConfigError`."""
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
    known = [k.name for k in DAEMON_KEYS]
    for name in tables["daemon"]:
        if name not in known:
            raise _unknown_key(known, source, field=f"daemon.{name}")
    return tables


def _check_env_names(env: Mapping[str, str]) -> None:
    """Every `SHOCKSLURM_DAEMON_<KEY>` variable names a `[daemon]` key, as every key of the
    file's `[daemon]` table must (a misspelt one would be ignored without a word). The
    `SHOCKSLURM_POLICY_<OPTION>` variables are checked as the options they set
    (`assign_policy_options`); the other `SHOCKSLURM_*` variables are no configuration keys."""
    known = [k.env for k in DAEMON_KEYS if k.env]
    for var in sorted(env):
        if var.startswith(ENV_PREFIX) and var not in known:
            raise _unknown_key(known, f"environment variable {var}")


def _unknown_key(known: Iterable[str], source: str, field: str | None = None) -> ConfigError:
    return ConfigError(f"unknown key (known: {', '.join(sorted(known))})", source=source,
                       field=field)


def _daemon_values(table: Mapping[str, Any], source: str, env: Mapping[str, str],
                   sources: dict[str, str]) -> dict[str, Any]:
    """Each `[daemon]` key's value: the default, the file's, then the environment's
    (`SHOCKSLURM_DB`, then `SHOCKSLURM_DAEMON_<KEY>`); `sources` gets each one's origin."""
    values: dict[str, Any] = {}
    for key in DAEMON_KEYS:
        if key.name in table:
            values[key.name] = key.check(table[key.name], source)
            sources[key.dotted] = source
        else:
            values[key.name] = key.check(key.default, "<defaults>")
            sources[key.dotted] = "default"
        for var in _env_names(key):
            if var in env:
                values[key.name] = key.check(_env_value(key, env[var]),
                                             f"environment variable {var}")
                sources[key.dotted] = var
    return values


def _policy_options(table: Mapping[str, Any], source: str, env: Mapping[str, str],
                    sources: dict[str, str]) -> tuple[dict[str, Any], dict[str, str]]:
    """The `[policy]` options, `SHOCKSLURM_POLICY_<OPTION>` over the file's, and each one's
    origin (also recorded in `sources`)."""
    options = dict(table)
    origins = {name: source for name in options}
    for var, raw in sorted(env.items()):
        name = var[len(POLICY_ENV_PREFIX):].lower()
        if var.startswith(POLICY_ENV_PREFIX) and name:
            key = BY_NAME.get(f"policy.{name}")
            options[name] = _env_value(key, raw) if key is not None else _toml_or_text(raw)
            origins[name] = f"environment variable {var}"
            sources[f"policy.{name}"] = var
    for name in options:
        sources.setdefault(f"policy.{name}", source)
    return options, origins


def _env_names(key: Key) -> list[str]:
    """The environment variables that set `key`, the later winning."""
    return ([DB_ENV] if key.dotted == "daemon.db" else []) + ([key.env] if key.env else [])


# --------------------------------------------------------------------------- policy options
def check_policy_settings(options: Mapping[str, Any], origins: Mapping[str, str]
                          ) -> dict[str, Any]:
    """Validate the `[policy]` keys that are `PolicySettings` fields (`SETTINGS_KEYS`);
    `origins` maps each option to where it came from (for the error)."""
    out = dict(options)
    for name in SETTINGS_KEYS:
        if name in out:
            out[name] = BY_NAME[f"policy.{name}"].check(out[name], origins[name])
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
            raise ConfigError(f"expected KEY=VALUE, got {shown(item, SETTING_CHARS)}",
                              source=source)
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
def toml_value(value: Any) -> str:
    """`value` as a TOML value (`unset` for None, as the rendered configuration shows it)."""
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (tuple, list)):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
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
        text = toml_value(value)
        if key.secret:
            text = mask(text)
        lines.append(f"{key.name} = {text}    # {origin}")
    lines.append("")
    lines.append("[policy]")
    settings = cfg.policy_settings()
    for name in SETTINGS_KEYS:
        origin = cfg.sources.get(f"policy.{name}", "default")
        lines.append(f"{name} = {toml_value(getattr(settings, name))}    # {origin}")
    for name, value in sorted(cfg.policy_options.items()):
        if name not in SETTINGS_KEYS:
            lines.append(f"{name} = {toml_value(value)}    # {cfg.sources.get('policy.' + name)}"
                         " (policy option)")
    return "\n".join(lines) + "\n"


def markdown_table() -> str:
    """The README's table of keys."""
    rows = ["| key | type | default | SIGHUP | environment | meaning |",
            "|---|---|---|---|---|---|"]
    for k in KEYS:
        env = f"`{k.env}`" + (f", `{DB_ENV}`" if k.dotted == "daemon.db" else "") if k.env \
            else ""
        rows.append(f"| `{k.dotted}` | {k.type_name.replace('|', chr(92) + '|')} | `{toml_value(k.default)}` | "
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
            out += textwrap.wrap(f"{k.doc} ({k.type_name}; default {toml_value(k.default)}"
                                 f"{'' if k.reload else '; [restart]'})", 96,
                                 initial_indent="# ", subsequent_indent="# ",
                                 break_on_hyphens=False)
            if k.default is None:
                out.append(f"# {k.name} =")
                continue
            out.append(f"{'# ' if section == 'policy' else ''}{k.name} = {toml_value(k.default)}")
    return "\n".join(out) + "\n"

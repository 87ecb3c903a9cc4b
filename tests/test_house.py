"""House rules, measured so that they cannot silently return: no module of the package over
`MAX_MODULE_LINES` lines, no function of the daemon's packages over `MAX_FUNCTION_LINES` lines
(a function's lines from its `def` to its last statement, decorators excluded), and each setting
declared once (a `[daemon]` key is a `DaemonConfig` field, with a validator, default and doc)."""

from __future__ import annotations

import ast
from dataclasses import fields
from pathlib import Path

import pytest

from shockslurm.ops.keys import DAEMON_KEYS, KEYS, KINDS, DaemonConfig

PACKAGE = Path(__file__).resolve().parent.parent / "shockslurm"
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 50
# The daemon's packages: where the long-running process's code lives.
DAEMON_PACKAGES = ("daemon", "live", "ops", "reports", "store")
# Alembic migrations are frozen history: a revision is never edited once released.
FROZEN = ("store/migrations/",)
# Modules another change is still splitting (issue #14). This list must only shrink: remove a
# module as soon as it meets the rules; never add one.
ALLOWED_LONG_MODULES: frozenset[str] = frozenset()


def _modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py")
                  if not any(p.relative_to(PACKAGE).as_posix().startswith(f) for f in FROZEN))


def _name(path: Path) -> str:
    return path.relative_to(PACKAGE).as_posix()


def long_functions(path: Path, limit: int = MAX_FUNCTION_LINES) -> list[tuple[str, int]]:
    """(qualified name, lines) of every function in `path` longer than `limit` lines."""
    out: list[tuple[str, int]] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = f"{prefix}{child.name}"
                if not isinstance(child, ast.ClassDef):
                    lines = (child.end_lineno or child.lineno) - child.lineno + 1
                    if lines > limit:
                        out.append((name, lines))
                visit(child, name + ".")
    visit(ast.parse(path.read_text(), str(path)), "")
    return out


def test_no_module_is_too_long():
    long = {_name(p): n for p in _modules()
            if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES}
    assert set(long) <= ALLOWED_LONG_MODULES, \
        f"modules over {MAX_MODULE_LINES} lines: {sorted(set(long) - ALLOWED_LONG_MODULES)}"


def test_the_allow_list_only_holds_modules_that_still_need_it():
    """A module that meets the rules leaves the allow-list (so the list can only shrink)."""
    for name in sorted(ALLOWED_LONG_MODULES):
        path = PACKAGE / name
        if not path.exists():
            continue
        too_long = len(path.read_text().splitlines()) > MAX_MODULE_LINES
        assert too_long or long_functions(path), \
            f"{name} meets the rules: remove it from ALLOWED_LONG_MODULES"


@pytest.mark.parametrize("package", DAEMON_PACKAGES)
def test_no_function_of_the_daemon_is_too_long(package: str):
    found = {f"{_name(p)}:{fn}": n for p in _modules() if _name(p).startswith(package + "/")
             and _name(p) not in ALLOWED_LONG_MODULES for fn, n in long_functions(p)}
    assert not found, f"functions over {MAX_FUNCTION_LINES} lines: {found}"


def test_the_measure_sees_a_long_function(tmp_path: Path):
    src = tmp_path / "m.py"
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    src.write_text(f"class A:\n    def long(self):\n    {body.replace(chr(10), chr(10) + '    ')}"
                   f"\n\ndef short():\n    pass\n")
    assert long_functions(src) == [("A.long", MAX_FUNCTION_LINES + 1)]


def test_every_daemon_key_is_a_config_field_with_a_validator_default_and_doc():
    by_field = {f.name: f for f in fields(DaemonConfig)}
    for key in DAEMON_KEYS:
        f = by_field[key.name]
        assert f.metadata["key"]["doc"] == key.doc and f.default == key.default, key.name
    assert all(k.kind in KINDS and k.doc.strip() for k in KEYS)
    for key in KEYS:           # the default passes its own validator
        key.check(key.default, "<defaults>")
    non_keys = {f.name for f in fields(DaemonConfig)} - {k.name for k in DAEMON_KEYS}
    assert non_keys == {"policy_options", "sources"}

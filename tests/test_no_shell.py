"""Subprocesses are started with argv lists only: no `shell=True`, `os.system` or `os.popen`
anywhere in the package (user text reaches commands, so a shell would be an injection)."""

from __future__ import annotations

import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "shockslurm"
FORBIDDEN = {
    "shell=True": re.compile(r"shell\s*=\s*True"),
    "os.system": re.compile(r"\bos\s*\.\s*system\s*\("),
    "os.popen": re.compile(r"\bos\s*\.\s*popen\s*\("),
    "from os import system/popen": re.compile(r"from\s+os\s+import\s+[^\n]*\b(system|popen)\b"),
    "commands/popen2": re.compile(r"\bimport\s+(commands|popen2)\b"),
}


def test_no_shell_in_the_package():
    files = sorted(PACKAGE.rglob("*.py"))
    assert len(files) > 20
    found = []
    for path in files:
        for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            for name, pattern in FORBIDDEN.items():
                if pattern.search(line):
                    found.append(f"{path.relative_to(PACKAGE.parent)}:{lineno}: {name}: "
                                 f"{line.strip()}")
    assert not found, "\n".join(found)


def test_the_check_catches_them():
    for bad in ("subprocess.run(cmd, shell=True)", "os.system('ls')", "os.popen('ls')",
                "from os import popen"):
        assert any(p.search(bad) for p in FORBIDDEN.values()), bad

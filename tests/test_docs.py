"""The README's relative links, and the files under docs/ it names, exist (history and plots
move out of the README into docs/: a renamed or lost file would leave a dead pointer)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def referenced_paths(text: str) -> set[str]:
    """Relative Markdown link targets (no scheme, no bare anchor; an anchor cut off) and
    `docs/...` paths in backticks."""
    links = {t.split("#")[0] for t in re.findall(r"\]\(([^)\s]+)\)", text)
             if not re.match(r"[a-z][a-z0-9+.-]*:|#", t)}
    return links | set(re.findall(r"`(docs/[^`\s]+)`", text))


def test_referenced_paths_finds_links_and_docs_paths_only() -> None:
    text = ("[a](docs/x.md) [b](https://example.org/y) [c](#z) [d](docs/w.md#part) "
            "`docs/v.png` `shockslurm/x.py`")
    assert referenced_paths(text) == {"docs/x.md", "docs/w.md", "docs/v.png"}


def test_every_path_the_readme_points_at_exists() -> None:
    paths = referenced_paths(README)
    assert "docs/history.md" in paths
    missing = sorted(p for p in paths if not (ROOT / p).exists())
    assert not missing, f"README.md points at missing files: {missing}"

"""A job's node limits read as tests of a node, for the node rules: its `--constraint` as a
test of a node's features (`feature_test`), and with its GPU type, `--exclude` and `-w` as one
test per limit (`node_rules`: the daemon's `live.job_nodes` and shocksub's submission check).

Slurm's feature expressions (`sbatch --constraint`, 22.05 .. 25.11) go from one name to
matching ORs, counts and parentheses (`[rack1|rack2]`, `a*2&b*4`, `(a|b)&c`). The daemon reads
the two forms that say which single nodes may hold the job: a name, names joined by `&` (every
one), and names joined by `|` (any one). `feature_test` gives None for every other form: the
daemon then plans such a job as if it could run on any node and releases it unpinned, so that
Slurm alone applies it (as before the daemon read constraints).
"""

from __future__ import annotations

import re
from typing import Callable, Collection

from .gres import host_set
from .types import SlurmNode

# A feature name as Slurm's node features are written (letters, digits, `_`, `.`, `-`, `:`)
_NAME = r"[A-Za-z0-9_.:-]+"
_ALL = re.compile(rf"{_NAME}(?:&{_NAME})*")
_ANY = re.compile(rf"{_NAME}(?:\|{_NAME})+")

FeatureTest = Callable[[Collection[str]], bool]


def feature_test(constraint: str) -> FeatureTest | None:
    """Whether a node with some features may hold the job, for a constraint of one of the
    forms the module reads (an empty one allows every node); None for any other form."""
    text = constraint.strip()
    if not text:
        return lambda features: True
    if _ALL.fullmatch(text):
        needed = frozenset(text.split("&"))
        return lambda features: needed <= set(features)
    if _ANY.fullmatch(text):
        wanted = frozenset(text.split("|"))
        return lambda features: bool(wanted & set(features))
    return None


NodeRule = tuple[str, Callable[[SlurmNode], bool]]


def limiting_nodelist(nodelist: str, nodes: int) -> str:
    """`-w` as a limit to the nodes it lists: the host list when it names at least as many
    nodes as the job runs on, else "". Slurm runs a job on every node -w lists (22.05: without
    `-N` the node count is raised to the list's, `-N1 -w gpu[01-02]` is refused by sbatch), and
    to a shorter list (`-N2 -w gpu03`) it adds other nodes: such a list limits no node."""
    listed = host_set(nodelist) if nodelist else None
    return nodelist if listed is not None and len(listed) >= nodes else ""


def node_rules(*, gpu_types: Collection[str] = (), exclude: str = "", nodelist: str = "",
               constraint: str = "") -> list[NodeRule]:
    """(limit, test of a node) for each limit given that can be read: "gpu_type" (the node has
    GPUs of every type named), "exclude", "nodelist" (host lists; an unreadable one gives no
    test) and "constraint" (a form `feature_test` reads)."""
    rules: list[NodeRule] = []
    types = frozenset(gpu_types)
    if types:
        rules.append(("gpu_type", lambda node: types <= node.gpu_types))
    excluded = host_set(exclude) if exclude else None
    if excluded:
        rules.append(("exclude", lambda node: node.name not in excluded))
    listed = host_set(nodelist) if nodelist else None
    if listed is not None:
        rules.append(("nodelist", lambda node: node.name in listed))
    test = feature_test(constraint) if constraint else None
    if test is not None:
        rules.append(("constraint", lambda node: test(node.features)))
    return rules

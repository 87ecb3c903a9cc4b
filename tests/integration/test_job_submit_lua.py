"""job_submit.lua's decisions, run in the Lua 5.1 runtime Slurm loads it with (liblua5.1, a
dependency of Debian's slurm-wlm-basic-plugins, hence the `slurm` marker and the cluster fixture
that installs it), against the daemon's tag rule, for comments no hand-written list covers.
Slurm's own behaviour is tested live in test_job_submit_plugin.py; here a stub `slurm` table
stands in for Slurm's and no job is submitted.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from dataclasses import dataclass
from typing import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shockslurm.slurm.types import MANAGED_TAG, JobState, SlurmJob

from ..conftest import REPO, skip_unless_required

pytestmark = pytest.mark.slurm

PLUGIN = REPO / "shockslurm" / "slurm" / "plugin" / "job_submit.lua"
LUA_GLOBALSINDEX = -10002       # Lua 5.1's pseudo-index of the globals table
REFUSED = "refused"

DRIVER = b"""
slurm = { SUCCESS = 0, ERROR = -1, ESLURM_ACCESS_DENIED = 2002,
          log_user = function() end, log_info = function() end }
dofile(PLUGIN_PATH)
local function outcome(rc, job)
   if rc ~= slurm.SUCCESS then return "refused" end
   return "ok\\0" .. tostring(job.comment) .. "\\0" .. tostring(job.priority)
end
function submit(comment, tres_per_node, partition)
   local job = { comment = comment, tres_per_node = tres_per_node, partition = partition }
   return outcome(slurm_job_submit(job, {}, 1000), job)
end
function modify(rec_comment, rec_tres, rec_partition, new_comment)
   local rec = { comment = rec_comment, tres_per_node = rec_tres, partition = rec_partition }
   local desc = { comment = new_comment }
   return outcome(slurm_job_modify(desc, rec, {}, 1000), desc)
end
"""


@dataclass(frozen=True)
class Outcome:
    refused: bool
    comment: str = ""
    priority: str = ""


class LuaPlugin:
    """The plugin loaded into a fresh Lua state; `call` runs one of the driver's functions."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        self.lib = lib
        lib.luaL_newstate.restype = ctypes.c_void_p
        lib.lua_tolstring.restype = ctypes.c_void_p
        lib.lua_tolstring.argtypes = [ctypes.c_void_p, ctypes.c_int,
                                      ctypes.POINTER(ctypes.c_size_t)]
        for name in ("luaL_openlibs", "lua_close"):
            getattr(lib, name).argtypes = [ctypes.c_void_p]
        lib.luaL_loadstring.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
        lib.lua_pcall.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_int]
        lib.lua_getfield.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_char_p]
        lib.lua_pushlstring.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t]
        lib.lua_pushnil.argtypes = [ctypes.c_void_p]
        lib.lua_settop.argtypes = [ctypes.c_void_p, ctypes.c_int]
        self.state = lib.luaL_newstate()
        lib.luaL_openlibs(self.state)
        path = str(PLUGIN).encode().replace(b"\\", b"\\\\").replace(b'"', b'\\"')
        self._run(DRIVER.replace(b"PLUGIN_PATH", b'"' + path + b'"'))

    def _run(self, chunk: bytes) -> None:
        if self.lib.luaL_loadstring(self.state, chunk) or self.lib.lua_pcall(self.state, 0, 0, 0):
            raise RuntimeError(f"Lua: {self._top()}")

    def _top(self) -> str:
        size = ctypes.c_size_t()
        ptr = self.lib.lua_tolstring(self.state, -1, ctypes.byref(size))
        text = ctypes.string_at(ptr, size.value).decode() if ptr else "(no message)"
        self.lib.lua_settop(self.state, 0)
        return text

    def call(self, function: str, *args: str | None) -> Outcome:
        self.lib.lua_getfield(self.state, LUA_GLOBALSINDEX, function.encode())
        for arg in args:
            if arg is None:
                self.lib.lua_pushnil(self.state)
            else:
                data = arg.encode()
                self.lib.lua_pushlstring(self.state, data, len(data))
        if self.lib.lua_pcall(self.state, len(args), 1, 0):
            raise RuntimeError(f"Lua: {self._top()}")
        result = self._top()
        if result == REFUSED:
            return Outcome(refused=True)
        _, comment, priority = result.split("\0")
        return Outcome(refused=False, comment=comment, priority=priority)

    def close(self) -> None:
        self.lib.lua_close(self.state)


@pytest.fixture(scope="module")
def plugin(slurm_cluster) -> Iterator[LuaPlugin]:
    name = ctypes.util.find_library("lua5.1") or "liblua5.1.so.0"
    try:
        lib = ctypes.CDLL(name)
    except OSError:
        skip_unless_required("liblua5.1 (Slurm's Lua runtime, package liblua5.1-0) not found")
    loaded = LuaPlugin(lib)
    yield loaded
    loaded.close()


def documented_rule(comment: str) -> bool:
    """The tag rule both sides document: a ';'-part equal to the tag once ASCII whitespace
    around it is stripped."""
    return any(part.strip(" \t\r\n\v\f") == MANAGED_TAG for part in comment.split(";"))


def daemon_managed(comment: str) -> bool:
    """What the daemon decides for a job with this comment (SlurmJob.managed, as shipped)."""
    job = SlurmJob(job_id=1, name="j", user="u", partition="gpu", state=JobState.PENDING,
                   state_flags=frozenset(), reason="None", priority=0, gpus_per_node=1,
                   gpus_per_job=0, nodes=1, node_list="", submit_time=0.0, start_time=None,
                   restart_count=0, comment=comment)
    return job.managed


def possible_managed(comment: str) -> bool:
    """True when any reasonable reading of the tag (exact, ASCII-stripped, or Python's full
    Unicode strip) finds it: the daemon must never act on such a job unless the plugin held it."""
    parts = comment.split(";")
    return any(p == MANAGED_TAG or p.strip() == MANAGED_TAG or p.strip(" \t\r\n\v\f") == MANAGED_TAG
               for p in parts)


COMMENTS = st.lists(st.sampled_from([MANAGED_TAG, ";", " ", "\t", "\n", "\r", "\v", "\f", "x",
                                     "shock:", "managed", "\x1c", "\u00a0", "\u2003", "=", ""]),
                    max_size=8).map("".join)


@settings(max_examples=400, deadline=None)
@given(comment=COMMENTS)
def test_managed_gpu_job_always_carries_the_exact_tag(plugin, comment) -> None:
    out = plugin.call("submit", comment, "gres:gpu:2", "gpu")
    assert not out.refused and out.priority == "0"
    assert MANAGED_TAG in out.comment.split(";")              # the exact token
    assert daemon_managed(out.comment) and documented_rule(out.comment)
    kept = [p for p in comment.split(";") if p.strip(" \t\r\n\v\f") != MANAGED_TAG]
    if comment:                                               # the user's other parts survive
        assert out.comment.split(";")[:-1] == kept


@settings(max_examples=400, deadline=None)
@given(comment=COMMENTS, partition=st.sampled_from(["gpu", "urgent", ""]),
       tres=st.sampled_from([None, "gres:gpu:1"]))
def test_a_job_the_plugin_does_not_hold_never_looks_managed(plugin, comment, partition,
                                                            tres) -> None:
    out = plugin.call("submit", comment, tres, partition)
    if out.refused or out.priority == "0":
        return
    assert not possible_managed(out.comment), repr(out.comment)
    assert not daemon_managed(out.comment)


@settings(max_examples=400, deadline=None)
@given(comment=COMMENTS)
def test_modify_sees_the_tag_by_the_daemons_rule(plugin, comment) -> None:
    """A user's comment-free update of a CPU job is refused exactly when the job's comment
    carries the tag by the documented rule (the plugin's has_managed_tag)."""
    out = plugin.call("modify", comment, None, "gpu", None)
    assert out.refused == documented_rule(comment)


@settings(max_examples=200, deadline=None)
@given(comment=COMMENTS)
def test_users_cannot_write_tag_text_into_an_untagged_job(plugin, comment) -> None:
    out = plugin.call("modify", "", None, "gpu", comment)
    assert out.refused == (MANAGED_TAG in comment)


def test_padded_tag_on_a_gpu_job_becomes_the_exact_token(plugin) -> None:
    assert plugin.call("submit", "a; shock:managed\n;b", "gres:gpu:1", "gpu").comment == \
        "a;b;shock:managed"
    assert plugin.call("submit", None, "gres:gpu:1", None).comment == MANAGED_TAG

"""``fleetscope serve`` executes itself again once with the allocator settings a large scrape needs."""

from __future__ import annotations

import os
import sys

import pytest

from fleetscope.cli import allocator


def test_the_tuned_environment_adds_both_settings_after_what_is_there():
    env = allocator.tuned_environment({"PATH": "/bin", "_RJEM_MALLOC_CONF": "narenas:4", "GLIBC_TUNABLES": "glibc.malloc.arena_max=2"}, "linux")
    assert env["PATH"] == "/bin" and env[allocator.TUNED] == "1"
    # polars reads its defaults, then this variable: ours come last so they win, the operator's others stay
    assert env["_RJEM_MALLOC_CONF"] == "narenas:4,dirty_decay_ms:10000,muzzy_decay_ms:10000"
    assert env["GLIBC_TUNABLES"] == "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1"
    bare = allocator.tuned_environment({}, "linux")
    assert bare["_RJEM_MALLOC_CONF"] == "dirty_decay_ms:10000,muzzy_decay_ms:10000" and bare["GLIBC_TUNABLES"] == "glibc.malloc.hugetlb=1"


def test_an_operators_hugetlb_is_kept_and_a_tuned_or_foreign_process_is_left_alone():
    kept = allocator.tuned_environment({"GLIBC_TUNABLES": "glibc.malloc.hugetlb=0"}, "linux")
    assert kept["GLIBC_TUNABLES"] == "glibc.malloc.hugetlb=0"
    assert allocator.tuned_environment({allocator.TUNED: "1"}, "linux") is None  # no second restart
    assert allocator.tuned_environment({}, "darwin") is None


def test_only_the_command_itself_is_replaced_never_a_program_calling_it():
    assert allocator.started_as_cli(["/venv/bin/fleetscope", "serve"])
    assert allocator.started_as_cli([os.path.join("/src", "fleetscope", "cli", "__main__.py"), "serve"])
    assert not allocator.started_as_cli(["/venv/bin/pytest", "-q"])
    assert not allocator.started_as_cli([])


def _environ_of(pid: int) -> dict[str, str]:
    with open(f"/proc/{pid}/environ", "rb") as f:
        return dict(item.decode().split("=", 1) for item in f.read().split(b"\0") if b"=" in item)


@pytest.mark.skipif(sys.platform != "linux", reason="the tunables are glibc's, read from /proc")
@pytest.mark.parametrize("tune", ["", "0"])
def test_serve_runs_under_the_settings_in_its_own_process(tmp_path, monkeypatch, tune):
    """The server that answers is the process that was started (a supervisor's pid stays right), and it runs
    with the settings unless FLEETSCOPE_TUNE_ALLOCATOR=0."""
    from tests.fleetscope.test_ingest_door_api import _free_port, _serve

    for name in ("_RJEM_MALLOC_CONF", "GLIBC_TUNABLES", allocator.TUNED):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("FLEETSCOPE_TUNE_ALLOCATOR", tune)
    proc = _serve(f"sqlite:///{tmp_path / 's.db'}", _free_port(), tmp_path)
    try:
        seen = _environ_of(proc.pid)
        if tune == "0":
            assert allocator.TUNED not in seen and "GLIBC_TUNABLES" not in seen
        else:
            assert seen[allocator.TUNED] == "1" and seen["GLIBC_TUNABLES"] == "glibc.malloc.hugetlb=1"
            assert seen["_RJEM_MALLOC_CONF"].endswith(allocator.JEMALLOC_CONF)
    finally:
        proc.terminate()
        proc.wait(timeout=30)

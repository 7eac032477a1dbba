"""``fleetscope serve`` executes itself again once with the allocator settings a large scrape needs."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from fleetscope.cli import allocator
from tests.conftest import process_alive, wait_until


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


def _cmdline_of(pid: int) -> list[str]:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return [a.decode() for a in f.read().split(b"\0") if a]


@pytest.mark.skipif(sys.platform != "linux", reason="the tunables are glibc's, read from /proc")
@pytest.mark.parametrize(("launcher", "tune"), [("module", ""), ("module", "0"), ("script", "")])
def test_serve_runs_under_the_settings_in_its_own_process(tmp_path, monkeypatch, launcher, tune):
    """The server that answers is the process that was started (a supervisor's pid stays right), the same
    program (the script stays the script: ``python -m`` would put the working directory on the module path),
    and it runs with the settings unless FLEETSCOPE_TUNE_ALLOCATOR=0."""
    import subprocess
    import time

    import httpx

    from tests.fleetscope.test_ingest_door_api import _free_port

    script = Path(sys.executable).parent / "fleetscope"
    if launcher == "script" and not script.exists():
        pytest.skip("no fleetscope script beside this interpreter")
    for name in ("_RJEM_MALLOC_CONF", "GLIBC_TUNABLES", allocator.TUNED):
        monkeypatch.delenv(name, raising=False)
    port = _free_port()
    env = {**os.environ, "FLEETSCOPE_TUNE_ALLOCATOR": tune, "FLEETSCOPE_DATA_DIR": str(tmp_path),
           "FLEETSCOPE_DATABASE_URL": f"sqlite:///{tmp_path / 's.db'}", "FLEETSCOPE_LOG_LEVEL": "WARNING"}
    start = [str(script)] if launcher == "script" else [sys.executable, "-m", "fleetscope.cli"]
    proc = subprocess.Popen([*start, "serve", "--port", str(port)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, "the server did not come up"
            time.sleep(0.1)
        seen, cmdline = _environ_of(proc.pid), _cmdline_of(proc.pid)
        if tune == "0":
            assert allocator.TUNED not in seen and "GLIBC_TUNABLES" not in seen
        else:
            assert seen[allocator.TUNED] == "1" and seen["GLIBC_TUNABLES"] == "glibc.malloc.hugetlb=1"
            assert seen["_RJEM_MALLOC_CONF"].endswith(allocator.JEMALLOC_CONF)
        assert cmdline[cmdline.index("serve"):] == ["serve", "--workers", "1", "--port", str(port)] or tune == "0"
        assert (str(script) in cmdline and "-m" not in cmdline) if launcher == "script" else "fleetscope.cli" in cmdline
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _workers_of(pid: int) -> list[int]:
    """uvicorn's worker processes under ``pid`` (multiprocessing's spawned children, not its resource tracker)."""
    from benchmarks._server import _proc_stats

    cmds: dict[int, bytes] = {}
    return [c for c, (ppid, _) in _proc_stats(cmds).items() if ppid == pid and b"spawn_main" in cmds.get(c, b"")]


def _serving(proc, port: int, workers: int) -> None:
    """Wait until ``proc`` answers on ``port`` with ``workers`` worker processes under it."""
    import httpx

    def up() -> bool:
        assert proc.poll() is None, "the server exited before it came up with its processes"
        try:
            return httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code == 200 and len(_workers_of(proc.pid)) == workers
        except httpx.TransportError:
            return False

    wait_until(up, 90, f"the server on port {port} with {workers} worker processes", poll_s=0.2)


@pytest.mark.skipif(sys.platform != "linux", reason="the processes are read from /proc")
def test_serve_on_postgresql_runs_two_api_processes_unless_told(pg_migrated, tmp_path):
    """Without --workers, ``serve`` on PostgreSQL runs FLEETSCOPE_API_WORKERS' default of two processes (a
    machine with two CPUs or more): the command it executes again says so, and two serve under it."""
    import subprocess

    from tests.fleetscope.test_ingest_door_api import _free_port

    if (os.cpu_count() or 1) < 2:
        pytest.skip("one CPU: the default is one process")
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("FLEETSCOPE_API_WORKERS", allocator.TUNED)}
    env.update({"FLEETSCOPE_DATA_DIR": str(tmp_path), "FLEETSCOPE_DATABASE_URL": pg_migrated, "FLEETSCOPE_LOG_LEVEL": "WARNING"})
    proc = subprocess.Popen([sys.executable, "-m", "fleetscope.cli", "serve", "--port", str(port)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        _serving(proc, port, 2)
        cmdline = _cmdline_of(proc.pid)
        assert cmdline[cmdline.index("serve"):] == ["serve", "--workers", "2", "--port", str(port)]
    finally:
        os.killpg(proc.pid, 15)
        proc.wait(timeout=30)


@pytest.mark.skipif(sys.platform != "linux", reason="PR_SET_PDEATHSIG is Linux's")
def test_the_api_workers_end_with_a_supervisor_killed_alone(tmp_path):
    """SIGKILL of ``serve --workers 2``'s supervisor alone (its pid, not its group): its workers stop too, so a
    ``serve`` started again can bind the port instead of finding it held by workers nobody supervises."""
    import subprocess

    from tests.fleetscope.test_ingest_door_api import _free_port

    port = _free_port()
    env = {**os.environ, "FLEETSCOPE_DATA_DIR": str(tmp_path), "FLEETSCOPE_DATABASE_URL": f"sqlite:///{tmp_path / 's.db'}",
           "FLEETSCOPE_LOG_LEVEL": "WARNING"}
    start = [sys.executable, "-m", "fleetscope.cli", "serve", "--port", str(port), "--workers", "2"]
    proc = subprocess.Popen(start, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        _serving(proc, port, 2)
        workers = _workers_of(proc.pid)
        os.kill(proc.pid, 9)
        proc.wait(10)
        wait_until(lambda: not any(process_alive(w) for w in workers), 30, f"workers {workers} to end with their supervisor", poll_s=0.1)
        again = subprocess.Popen(start, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        try:
            _serving(again, port, 2)
        finally:
            os.killpg(again.pid, 15)
            again.wait(30)
    finally:
        try:
            os.killpg(proc.pid, 9)
        except ProcessLookupError:
            pass


@pytest.mark.skipif(sys.platform != "linux", reason="the processes are read from /proc")
def test_a_worker_process_asks_one_client_in_so_many_to_reconnect(tmp_path):
    """``serve --workers 2``: on one kept-alive connection, every answer keeps it open until the process's
    ``REBALANCE_EVERY_REQUESTS``-th request, whose answer says ``Connection: close`` and after which the server
    closes it; a client's new connection then goes to whichever process accepts it first. A single process
    (``--workers 1``) never asks."""
    import socket
    import subprocess

    from fleetscope.api.server import REBALANCE_EVERY_REQUESTS
    from tests.fleetscope.test_ingest_door_api import _free_port

    def answers(port: int, most: int) -> tuple[list[bool], bytes]:
        """Whether each answer on one connection asked to close, and what the socket read after the last."""
        closes: list[bool] = []
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            f = sock.makefile("rb")
            for _ in range(most):
                sock.sendall(f"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode())
                assert f.readline().startswith(b"HTTP/1.1 200")
                length, close = 0, False
                while (line := f.readline()) not in (b"\r\n", b""):
                    name, _, value = line.partition(b":")
                    length = int(value) if name.lower() == b"content-length" else length
                    close = close or (name.lower() == b"connection" and value.strip().lower() == b"close")
                f.read(length)
                closes.append(close)
                if close:
                    break
            return closes, f.read(1)

    for workers in (2, 1):
        port = _free_port()
        env = {**os.environ, "FLEETSCOPE_DATA_DIR": str(tmp_path), "FLEETSCOPE_DATABASE_URL": f"sqlite:///{tmp_path / 's.db'}",
               "FLEETSCOPE_LOG_LEVEL": "WARNING"}
        proc = subprocess.Popen([sys.executable, "-m", "fleetscope.cli", "serve", "--port", str(port), "--workers", str(workers)], env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        try:
            _serving(proc, port, workers if workers > 1 else 0)
            closes, after = answers(port, 3 * REBALANCE_EVERY_REQUESTS)
            if workers == 1:
                assert not any(closes) and len(closes) == 3 * REBALANCE_EVERY_REQUESTS
                continue
            # the process's own count: the readiness checks' requests, on connections of their own, count too
            assert closes[-1] and not any(closes[:-1]) and len(closes) <= REBALANCE_EVERY_REQUESTS
            assert after == b""  # the server closed the connection after that answer
        finally:
            os.killpg(proc.pid, 15)
            proc.wait(timeout=30)

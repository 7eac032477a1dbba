"""What the benchmarks share: a `fleetscope serve` subprocess on a free loopback port over a given database
(migrated, with an ingest token, stopped on exit), a migrated store on a scratch PostgreSQL database, and
the CPU time of a database's backends."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import ModuleType

import httpx

from fleetscope.store import Store, db


def sibling(name: str) -> ModuleType:
    """Another script of this folder, loaded by its file: the scripts are no package, and several are named after
    the package they measure (``ingest_*.py`` beside ``ingest``), so none is imported by name."""
    spec = importlib.util.spec_from_file_location(f"_bench_{name}", Path(__file__).resolve().parent / f"{name}.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(url: str, tries: int = 300) -> None:
    """Until ``url`` answers 200 (a server starting), at most ``tries`` tenths of a second."""
    for _ in range(tries):
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            time.sleep(0.1)


@contextlib.contextmanager
def migrated_store(url: str) -> Iterator[Store]:
    """The store at ``url``, migrated to head; its connections closed after the block."""
    db.upgrade(url)
    store = Store.open(url)
    try:
        yield store
    finally:
        store.engine.dispose()


@contextlib.contextmanager
def scratch_store(admin_url: str, prefix: str = "fleetscope_bench") -> Iterator[Store]:
    """A migrated store on a new PostgreSQL database (``db.scratch_database``) under ``admin_url``'s server,
    dropped after the block, so a run never touches a database someone else migrated."""
    with db.scratch_database(admin_url, prefix) as url, migrated_store(url) as store:
        yield store


@contextlib.contextmanager
def served_api(database_url: str, workers: int | None = 1, env: Mapping[str, str] | None = None,
               started: list[int] | None = None) -> Iterator[tuple[str, str]]:
    """(base URL, ingest token) of a running API over ``database_url`` (``workers`` processes, None for the
    service's default); ``env`` adds to or overrides its
    environment (a shared data directory, a broker, alerting settings). The server's process id is
    appended to ``started`` where given (its CPU time is read from /proc)."""
    # The services import the analyzers package, which benchmarks/analyzers.py shadows in a script whose own
    # folder is first on its path (store_write.py).
    from fleetscope.services import auth  # lazy: only the scripts that serve an API load the services

    db.upgrade(database_url)
    token = auth.create_token(db.make_engine(database_url), "bench", ["ingest"])
    env = {**os.environ, "FLEETSCOPE_DATA_DIR": tempfile.mkdtemp(prefix="fleetscope-bench-"), "FLEETSCOPE_DATABASE_URL": database_url,
           "FLEETSCOPE_LOG_LEVEL": "WARNING", **(env or {})}
    port = free_port()
    given = ["--workers", str(workers)] if workers is not None else []  # None: serve's own default (FLEETSCOPE_API_WORKERS)
    server = subprocess.Popen([sys.executable, "-m", "fleetscope.cli", "serve", "--port", str(port), *given], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    if started is not None:
        started.append(server.pid)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(base + "/healthz")
        yield base, token
    finally:
        server.terminate()
        server.wait(timeout=30)


class CpuWatch:
    """CPU seconds of every process whose command line holds ``needle`` (a database's backends), sampled
    every ``interval_s`` from a thread: a backend that exits between reads keeps what it was last seen at."""

    def __init__(self, needle: str, interval_s: float = 0.25):
        self.needle, self.interval_s = needle, interval_s
        self.seen: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()

    def sample(self) -> float:
        cmds: dict[int, bytes] = {}
        needle = self.needle.encode()
        for pid, (_, cpu) in _proc_stats(cmds).items():
            if needle in cmds.get(pid, b""):
                self.seen[pid] = max(cpu, self.seen.get(pid, 0.0))
        return sum(self.seen.values())

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


def peak_rss_mb(root_pid: int) -> float | None:
    """The peak resident memory (``VmHWM``) of ``root_pid`` and its descendants, summed, in MiB: an upper bound
    of what they held at once. None without /proc."""
    kib = []
    for pid in _tree(root_pid, {pid: ppid for pid, (ppid, _) in _proc_stats().items()}):
        try:
            with open(f"/proc/{pid}/status") as f:
                kib += [int(line.split()[1]) for line in f if line.startswith("VmHWM:")]
        except OSError:
            continue
    return round(sum(kib) / 1024, 1) if kib else None


def _proc_stats(cmds: dict[int, bytes] | None = None) -> dict[int, tuple[int, float]]:
    """(parent pid, user + system CPU seconds) of every process, from /proc; with ``cmds``, their command lines
    too. Empty without /proc."""
    tick = os.sysconf("SC_CLK_TCK")
    stats: dict[int, tuple[int, float]] = {}
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
            if cmds is not None:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    cmds[int(entry)] = f.read()
        except OSError:
            continue
        stats[int(entry)] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / tick)
    return stats


def _tree(root_pid: int | None, parents: dict[int, int]) -> set[int | None]:
    """``root_pid`` and its descendants, given each process's parent."""
    keep: set[int | None] = {root_pid}
    grew = True
    while grew:
        grew = False
        for pid, ppid in parents.items():
            if ppid in keep and pid not in keep:
                keep.add(pid)
                grew = True
    return keep


def cpu_seconds(root_pid: int | None = None, cmdline_has: str | None = None) -> float:
    """User + system CPU seconds of ``root_pid`` and its descendants, or of every process whose command
    line holds ``cmdline_has`` (a database's backends, whose title names the database); 0 without /proc."""
    cmds: dict[int, bytes] | None = {} if cmdline_has is not None else None
    stats = _proc_stats(cmds)
    if cmdline_has is not None:
        needle = cmdline_has.encode()
        return sum(cpu for pid, (_, cpu) in stats.items() if needle in (cmds or {}).get(pid, b""))
    keep = _tree(root_pid, {pid: ppid for pid, (ppid, _) in stats.items()})
    return sum(stats[pid][1] for pid in keep if pid in stats)

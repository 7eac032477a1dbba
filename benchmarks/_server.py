"""A `fleetscope serve` subprocess on a free loopback port over a given database, for the end-to-end
benchmarks: migrated, with an ingest token, stopped on exit."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping

import httpx


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
def served_api(database_url: str, workers: int = 1, env: Mapping[str, str] | None = None) -> Iterator[tuple[str, str]]:
    """(base URL, ingest token) of a running API over ``database_url``; ``env`` adds to or overrides its
    environment (a shared data directory, a broker, alerting settings)."""
    from fleetscope.services import auth
    from fleetscope.store import db

    db.upgrade(database_url)
    token = auth.create_token(db.make_engine(database_url), "bench", ["ingest"])
    env = {**os.environ, "FLEETSCOPE_DATA_DIR": tempfile.mkdtemp(prefix="fleetscope-bench-"), "FLEETSCOPE_DATABASE_URL": database_url,
           "FLEETSCOPE_LOG_LEVEL": "WARNING", **(env or {})}
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "fleetscope.cli", "serve", "--port", str(port), "--workers", str(workers)], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(base + "/healthz")
        yield base, token
    finally:
        server.terminate()
        server.wait(timeout=30)

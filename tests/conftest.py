"""Shared fixtures: databases (SQLite always; PostgreSQL and Redis when reachable) and paths.

The PostgreSQL and Redis tests skip with the reason when their server is not reachable, unless
FLEETSCOPE_REQUIRE_SERVICES=1 (CI sets it), where an unreachable server fails the run instead.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import subprocess
import time
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

from fleetscope.store import db, gpu_keys, packed_energy, partitions
from fleetscope.store import schema
from fleetscope.store import Store

ROOT = Path(__file__).resolve().parents[1]
REALDATA = ROOT.parent / "shared" / "realdata"
REQUIRE_SERVICES = os.environ.get("FLEETSCOPE_REQUIRE_SERVICES") == "1"
PG_ADMIN_URL = os.environ.get("FLEETSCOPE_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
REDIS_URL = os.environ.get("FLEETSCOPE_TEST_REDIS_URL", "redis://127.0.0.1:6379/15")


def _unavailable(what: str, exc: Exception) -> None:
    msg = f"{what} not reachable ({str(exc).splitlines()[0][:200]})"
    if REQUIRE_SERVICES:
        pytest.fail(msg + " and FLEETSCOPE_REQUIRE_SERVICES=1")
    pytest.skip(msg)


@pytest.fixture(scope="session")
def pg_url() -> str:
    """A fresh PostgreSQL database for this test session, dropped at the end."""
    try:
        probe = create_engine(PG_ADMIN_URL)
        with probe.connect() as conn:
            conn.execute(text("SELECT 1"))
        probe.dispose()
    except Exception as exc:  # noqa: BLE001
        _unavailable(f"PostgreSQL at {PG_ADMIN_URL}", exc)
    with db.scratch_database(PG_ADMIN_URL, "fleetscope_test") as url:
        yield url


@pytest.fixture(scope="session")
def pg_migrated(pg_url: str) -> str:
    db.upgrade(pg_url)
    return pg_url


@pytest.fixture(scope="session")
def redis_url() -> str:
    import redis

    try:
        redis.Redis.from_url(REDIS_URL, socket_connect_timeout=2).ping()
    except Exception as exc:  # noqa: BLE001
        _unavailable(f"Redis at {REDIS_URL}", exc)
    return REDIS_URL


def _truncate_all(store: Store) -> None:
    # Day partitions earlier tests made are dropped, not kept empty: a TRUNCATE touches every partition, and
    # with a session's worth of them (tests write many different days) each test's emptying took seconds.
    tables = [t.name for t in schema.metadata.sorted_tables]
    if store.dialect == "postgresql":
        with store.engine.connect() as conn:  # made by a migration, not declared in the models
            for extra in (packed_energy.TABLE, gpu_keys.TABLE):
                if conn.execute(text("SELECT to_regclass(:t)"), {"t": extra}).scalar() is not None:
                    tables.append(extra)
    names = ", ".join(f'"{t}"' for t in tables)
    days = partitions.all_partitions(store.engine)
    with store.engine.begin() as conn:
        if days:
            conn.execute(text("DROP TABLE " + ", ".join(f'"{d}"' for d in days)))
        conn.execute(text(f"TRUNCATE {names} RESTART IDENTITY CASCADE"))
    partitions.forget_all(store.engine)


def wait_until(pred, timeout_s: float, what: str, poll_s: float = 0.05):  # type: ignore[no-untyped-def]
    """Poll ``pred`` until it returns something truthy and return that; fail the test naming ``what`` after
    ``timeout_s``: how tests wait on real processes, servers and replicas."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = pred()
        if got:
            return got
        time.sleep(poll_s)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


def process_alive(pid: int) -> bool:
    """Whether ``pid`` runs (Linux's /proc): neither gone nor a zombie its parent has not reaped."""
    status = Path(f"/proc/{pid}/status")
    try:
        return "State:\tZ" not in status.read_text()
    except OSError:
        return False


def end_worker(proc: subprocess.Popen) -> int | None:
    """Kill a Celery worker process a test is done with, and reap it; the exit status it had already ended
    with on its own (worth its log), else None.

    Not SIGTERM: a warm shutdown waits for the consumer's ``drain_events(timeout=2.0)`` to return, and on the
    embedded SQLite broker kombu polls once a second inside it, so each stop took about 4 s; a test's tasks
    have all been answered by its end, so a kill loses nothing it checks."""
    ended = proc.poll()
    if ended is None:
        proc.kill()
        proc.wait(timeout=20)
    return ended


@pytest.fixture(scope="session")
def sqlite_migrated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An empty SQLite store migrated to head once per session (per xdist worker), for ``fresh_sqlite`` to copy:
    running every migration for each of the hundreds of SQLite tests took a few tenths of a second each."""
    path = tmp_path_factory.mktemp("migrated") / "fleetscope.store.db"
    db.upgrade(f"sqlite:///{path}")
    return path


def fresh_sqlite(template: Path, path: Path) -> str:
    """A migrated, empty SQLite store at ``path`` (its URL): the file made as the product makes it (0600),
    then filled with the template's pages by SQLite's online backup, so it is the schema ``db.upgrade`` built."""
    url = f"sqlite:///{path}"
    db.create_sqlite_file(url)
    with contextlib.closing(sqlite3.connect(template)) as src, contextlib.closing(sqlite3.connect(path)) as dst:
        src.backup(dst)
    return url


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A migrated, empty database: a new SQLite file, or the session's PostgreSQL database emptied."""
    if request.param == "sqlite":
        return fresh_sqlite(request.getfixturevalue("sqlite_migrated"), tmp_path / "fleetscope.store.db")
    url = request.getfixturevalue("pg_migrated")
    st = Store.open(url)
    _truncate_all(st)
    st.engine.dispose()
    return url


@pytest.fixture
def store(db_url: str, tmp_path: Path) -> Store:
    from fleetscope.services import audit as audit_service

    st = Store.open(db_url)
    audit_service.bind(st, make_settings(tmp_path, db_url))  # audit key and checkpoints in this test's folder
    yield st
    st.engine.dispose()


@pytest.fixture
def realdata() -> Path:
    if not REALDATA.is_dir():
        pytest.skip(f"shared real data not found at {REALDATA}")
    return REALDATA


class LiveServer:
    """A real uvicorn server on a loopback port, in a thread of the test process."""

    def __init__(self, app):  # type: ignore[no-untyped-def]
        import socket
        import threading

        import uvicorn

        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    def __enter__(self) -> "LiveServer":
        import time

        import httpx

        self.thread.start()
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                httpx.get(self.url + "/healthz", timeout=1)
                return self
            except httpx.HTTPError:
                time.sleep(0.05)
        raise RuntimeError("test server did not start")

    def __exit__(self, *exc) -> None:  # type: ignore[no-untyped-def]
        self.server.should_exit = True
        self.thread.join(timeout=10)
        self.sock.close()


def make_settings(tmp_path: Path, database_url: str, **overrides):  # type: ignore[no-untyped-def]
    import dataclasses

    from fleetscope import settings as settings_mod

    base = settings_mod.load()
    return dataclasses.replace(base, data_dir=tmp_path, database_url=database_url, auto_migrate=True, **overrides)


@pytest.fixture
def api(db_url: str, tmp_path: Path):  # type: ignore[no-untyped-def]
    """A live API over a fresh database, with a 1 MiB body limit so the 413 path is cheap to test."""
    from fleetscope.api import create_app

    app = create_app(make_settings(tmp_path, db_url, max_body_bytes=2**20))
    with LiveServer(app) as server:
        server.app = app
        yield server
    app.state.store.engine.dispose()

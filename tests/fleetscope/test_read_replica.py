"""Read replicas (FLEETSCOPE_READ_DATABASE_URL) against a real streaming replica: a throwaway primary cluster
(initdb on a free port) and a replica of it made with `pg_basebackup -R`, started here. Reads of the read API
and the dashboard go to the replica, writes to the primary; replica lag is reported, made real by pausing
the replica's replay (pg_wal_replay_pause)."""

from __future__ import annotations

import datetime as dt
import glob
import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import polars as pl
import pytest
from sqlalchemy import create_engine, text

from fleetscope.core import frames as F
from fleetscope.store import Store, db, reads_on_replica
from tests.conftest import _unavailable, make_settings, wait_until

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

T0 = dt.datetime(2026, 5, 1, tzinfo=dt.UTC)


def _bin() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: int(Path(p).parent.name) if Path(p).parent.name.isdigit() else 0)
    for d in reversed(found):
        if all((Path(d) / b).exists() for b in ("initdb", "pg_ctl", "pg_basebackup")):
            return Path(d)
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Cluster:
    """PostgreSQL's own programs, run as the `postgres` account where this is root (the server refuses root)."""

    def __init__(self, bindir: Path, root: Path):
        self.bindir, self.root = bindir, root
        self.as_postgres = os.geteuid() == 0

    def run(self, *args: str) -> None:
        cmd = [str(self.bindir / args[0]), *args[1:]]
        if self.as_postgres:
            cmd = ["runuser", "-u", "postgres", "--", *cmd]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        if done.returncode:
            logs = "".join(p.read_text(errors="replace")[-2000:] for p in self.root.glob("*.log"))
            raise RuntimeError(f"{' '.join(args[:2])} failed ({done.returncode}): {done.stderr[-2000:]}{logs}")

    def start(self, name: str, port: int) -> None:
        self.run("pg_ctl", "-D", str(self.root / name), "-l", str(self.root / f"{name}.log"), "-w", "-t", "30",
                 "-o", f"-p {port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off -c full_page_writes=off", "start")

    def stop(self, name: str) -> None:
        if (self.root / name / "postmaster.pid").exists():
            self.run("pg_ctl", "-D", str(self.root / name), "-m", "immediate", "-w", "stop")


@pytest.fixture(scope="module")
def replica():  # type: ignore[no-untyped-def]
    """(primary URL, replica URL) of a migrated database streamed to a hot standby."""
    bindir = _bin()
    if bindir is None:
        _unavailable("PostgreSQL server programs (initdb, pg_ctl, pg_basebackup in /usr/lib/postgresql/*/bin)", RuntimeError("not installed"))
    if os.geteuid() == 0 and (shutil.which("runuser") is None or subprocess.run(["id", "postgres"], capture_output=True).returncode):
        _unavailable("a `postgres` account to run the throwaway clusters as (PostgreSQL refuses root)", RuntimeError("no account"))
    root = Path(tempfile.mkdtemp(prefix="fleetscope-replica-"))
    if os.geteuid() == 0:
        shutil.chown(root, "postgres", "postgres")
    cl = Cluster(bindir, root)
    p_port, r_port = _free_port(), _free_port()
    try:
        cl.run("initdb", "-D", str(root / "primary"), "-U", "postgres", "-A", "trust", "--no-sync", "-E", "UTF8")
        cl.start("primary", p_port)
        admin = create_engine(f"postgresql+psycopg://postgres@127.0.0.1:{p_port}/postgres", isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            conn.execute(text("CREATE DATABASE fleetscope"))
        admin.dispose()
        primary_url = f"postgresql+psycopg://postgres@127.0.0.1:{p_port}/fleetscope"
        db.upgrade(primary_url)
        cl.run("pg_basebackup", "-h", "127.0.0.1", "-p", str(p_port), "-U", "postgres", "-D", str(root / "replica"), "-R", "-X", "stream",
               "-c", "fast", "--no-sync")
        cl.start("replica", r_port)
        yield primary_url, f"postgresql+psycopg://postgres@127.0.0.1:{r_port}/fleetscope"
    finally:
        for name in ("replica", "primary"):
            try:
                cl.stop(name)
            except Exception:  # noqa: BLE001 - teardown goes on
                pass
        shutil.rmtree(root, ignore_errors=True)


def _gpus(names: list[str]) -> F.Batch:
    return F.Batch(gpu=pl.DataFrame({"gpu_uuid": names, "host": ["h1"] * len(names)}),
                   gpu_sample=pl.DataFrame({"ts": [T0] * len(names), "gpu_uuid": names, "power_w": [300.0] * len(names)}))


def test_reads_go_to_the_replica_writes_to_the_primary_and_the_lag_is_reported(replica, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from fastapi.testclient import TestClient
    from click.testing import CliRunner

    from fleetscope.api import create_app
    from fleetscope.cli import main
    from fleetscope.services import auth

    primary_url, replica_url = replica
    store = Store.open(primary_url, replica_url)
    on_replica = lambda: set(store.read("gpu")["gpu_uuid"])  # noqa: E731

    def replica_reads() -> set[str]:
        with reads_on_replica():
            return on_replica()

    # a write on the primary appears on the replica
    store.write(_gpus(["GPU-a", "GPU-b"]))
    wait_until(lambda: replica_reads() == {"GPU-a", "GPU-b"}, 10, "the first write on the replica")

    # replay paused: the replica stops where it is, the primary goes on
    with store.read_engine.connect() as conn:
        conn.execute(text("SELECT pg_wal_replay_pause()"))
        conn.commit()
        wait_until(lambda: conn.execute(text("SELECT pg_get_wal_replay_pause_state()")).scalar_one() == "paused", 10, "replay to pause")
    written_at = time.monotonic()
    store.write(_gpus(["GPU-c"]))
    assert on_replica() == {"GPU-a", "GPU-b", "GPU-c"}  # outside reads_on_replica: the primary
    assert replica_reads() == {"GPU-a", "GPU-b"}  # the replica, behind
    with reads_on_replica():
        assert store.query("SELECT count(*) AS n FROM gpu_sample")["n"][0] == 2 and store.counts()["gpu"] == 2

    time.sleep(1.2)
    lag = db.replica_lag(store.engine, store.read_engine)
    assert lag["reachable"] and lag["in_recovery"] and lag["replay_paused"]
    assert lag["lag_bytes"] > 0
    # its reads are behind by the age of the last transaction it replayed: at least since the write it missed
    assert 1.2 <= lag["lag_s"] <= time.monotonic() - written_at + 30, lag

    # the read API reads the replica; its writes and the tokens it checks are the primary's
    settings = make_settings(tmp_path, primary_url, read_database_url=replica_url)
    secret = auth.create_token(store.engine, "reader", ["read"])
    app = create_app(settings, store=store)
    with TestClient(app) as client:
        h = {"Authorization": f"Bearer {secret}"}
        got = client.get("/api/v1/frames/gpu", headers=h)
        assert got.status_code == 200 and {r["gpu_uuid"] for r in got.json()} == {"GPU-a", "GPU-b"}
        assert client.get("/api/v1/counts", headers=h).json()["gpu_sample"] == 2
        health = client.get("/healthz", headers=h)
        assert health.status_code == 200
        rep = health.json()["replica"]
        assert rep["replay_paused"] and rep["lag_bytes"] > 0 and rep["lag_s"] >= 1.2
        assert client.get("/healthz").json() == {"status": "ok"}  # nothing told without a token
        metrics = client.get("/metrics", headers=h).text
        gauges = {line.split()[0]: float(line.split()[1]) for line in metrics.splitlines() if line.startswith("fleetscope_read_replica_")}
        assert gauges["fleetscope_read_replica_up"] == 1.0 and gauges["fleetscope_read_replica_lag_bytes"] > 0
        assert gauges["fleetscope_read_replica_lag_seconds"] >= 1.2

    # the dashboard's cached page reads take the replica; its actions (and fresh reads) the primary
    from dashboard import ui
    from fleetscope.services import telemetry

    monkeypatch.setenv("FLEETSCOPE_DATABASE_URL", primary_url)
    monkeypatch.setenv("FLEETSCOPE_READ_DATABASE_URL", replica_url)
    assert ui.read(primary_url, "fleetscope.services.telemetry", "fleet_size", ())["gpus"][0] == 2
    assert telemetry.fleet_size(ui.store())["gpus"][0] == 3

    # the CLI reports it too
    env = {"FLEETSCOPE_DATABASE_URL": primary_url, "FLEETSCOPE_READ_DATABASE_URL": replica_url, "FLEETSCOPE_DATA_DIR": str(tmp_path)}
    out = CliRunner().invoke(main, ["db", "replica", "--json"], env=env)
    assert out.exit_code == 0, out.output
    cli = json.loads(out.output)
    assert cli["replay_paused"] and cli["lag_bytes"] > 0 and cli["lag_s"] >= 1.2

    # replay resumed: the replica catches up and the lag goes to zero
    with store.read_engine.connect() as conn:
        conn.execute(text("SELECT pg_wal_replay_resume()"))
        conn.commit()
    wait_until(lambda: replica_reads() == {"GPU-a", "GPU-b", "GPU-c"}, 10, "the replica to catch up")
    caught_up = wait_until(lambda: (lambda r: r if r["lag_bytes"] == 0 else None)(db.replica_lag(store.engine, store.read_engine)), 10, "no lag")
    assert caught_up["lag_s"] == 0.0 and not caught_up["replay_paused"]
    store.engine.dispose()
    store.read_engine.dispose()


def test_a_read_url_that_is_no_replica_makes_the_api_unready(replica, tmp_path: Path) -> None:
    from fastapi.testclient import TestClient

    from fleetscope.api import create_app
    from fleetscope.services import auth

    primary_url, _ = replica
    store = Store.open(primary_url, primary_url)  # the primary named as its own replica: not in recovery
    lag = db.replica_lag(store.engine, store.read_engine)
    assert lag["reachable"] and not lag["in_recovery"] and lag["lag_bytes"] is None
    secret = auth.create_token(store.engine, "reader2", ["read"])
    with TestClient(create_app(make_settings(tmp_path, primary_url, read_database_url=primary_url), store=store)) as client:
        got = client.get("/healthz", headers={"Authorization": f"Bearer {secret}"})
        assert got.status_code == 503 and got.json()["replica"]["in_recovery"] is False
        assert "fleetscope_read_replica_up 0.0" in client.get("/metrics", headers={"Authorization": f"Bearer {secret}"}).text
    gone = db.replica_lag(store.engine, db.make_engine("postgresql+psycopg://postgres@127.0.0.1:1/none"))
    assert gone == {"reachable": False, "in_recovery": False, "lag_bytes": None, "lag_s": None, "replay_paused": None}
    store.engine.dispose()
    store.read_engine.dispose()


def test_the_read_url_must_name_a_postgresql_replica_of_a_postgresql_primary(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from fleetscope import settings as settings_mod

    monkeypatch.setenv("FLEETSCOPE_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("FLEETSCOPE_READ_DATABASE_URL", "postgresql+psycopg://u:secret@replica/fleet")
    monkeypatch.delenv("FLEETSCOPE_DATABASE_URL", raising=False)
    with pytest.raises(ValueError, match="FLEETSCOPE_READ_DATABASE_URL='replica/fleet': a read replica is a PostgreSQL streaming replica") as err:
        settings_mod.load()
    assert "secret" not in str(err.value)
    monkeypatch.setenv("FLEETSCOPE_DATABASE_URL", "postgresql+psycopg://u@primary/fleet")
    monkeypatch.setenv("FLEETSCOPE_READ_DATABASE_URL", "sqlite:///copy.db")
    with pytest.raises(ValueError, match="a read replica is a PostgreSQL streaming replica"):
        settings_mod.load()
    monkeypatch.setenv("FLEETSCOPE_READ_DATABASE_URL", "postgresql+psycopg://u@replica/fleet")
    assert settings_mod.load().read_database_url == "postgresql+psycopg://u@replica/fleet"


def test_db_replica_without_a_replica_configured_says_how_to_name_one(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from fleetscope.cli import main

    out = CliRunner().invoke(main, ["db", "replica"], env={"FLEETSCOPE_DATA_DIR": str(tmp_path), "FLEETSCOPE_DATABASE_URL": "", "FLEETSCOPE_READ_DATABASE_URL": ""})
    assert out.exit_code == 1
    assert "no read replica configured: set FLEETSCOPE_READ_DATABASE_URL" in out.output

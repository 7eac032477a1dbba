"""Databases for the dashboard tests: empty and migrated, or seeded with the showcase world.

The seeded world is a 64-GPU fleet (2 sites × 4 nodes × 8 GPUs) over 30 minutes, plus three runs of one
model with steps and collectives (rank 5 of job-llm-a straggles), a five-run scaling sweep of a second
model that follows the Fleet Law, health events on three GPUs, two nccl-tests runs, failures, a
preemption, checkpoints and two findings (fleetscope.sim.showcase); then what the services make of it
(showcase.run_services): energy roll-ups, every job's analyses, an alert evaluation with dead-lettered
notifications, lineage, a fairness evaluation, an EU AI Act audit with its reports and a signed export,
filed in the database's folder (its FLEETSCOPE_DATA_DIR).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, text

from dashboard import signin
from fleetscope.services import auth
from fleetscope.store import db
from fleetscope import settings as settings_mod
from fleetscope.sim.fleet import FleetSpec
from fleetscope.sim.showcase import run_services, showcase
from fleetscope.store import Store
from tests.conftest import PG_ADMIN_URL, _unavailable, fresh_sqlite

SEED_START = dt.datetime(2026, 3, 1, 12, 0, tzinfo=dt.UTC)
SEED_DURATION_S = 1800
SPEC = FleetSpec()
APP = Path(__file__).resolve().parents[2] / "dashboard" / "app.py"


def sign_in(at: Any, url: str, scopes: tuple[str, ...] = ("admin",), name: str | None = None) -> str:
    """Sign an AppTest session in the way the sign-in form leaves it: a real token created in ``url``'s store
    (named ``name``, default ``test-<scopes>``), its secret in the session state the app verifies on every
    run. Returns the secret."""
    store = Store.open(url)
    try:
        secret = auth.create_token(store.engine, name or "test-" + "-".join(scopes), list(scopes))
    finally:
        store.engine.dispose()
    at.session_state[signin.TOKEN_KEY] = secret
    return secret


def seed(url: str, data_dir: Path, start: dt.datetime = SEED_START, duration_s: int = SEED_DURATION_S, spec: FleetSpec = SPEC) -> dict:
    store = Store.open(url)
    try:
        for batch in showcase(spec, start, duration_s):
            store.write(batch)
        settings = dataclasses.replace(settings_mod.load(), data_dir=data_dir, database_url=url)
        return run_services(store, settings, start, start + dt.timedelta(seconds=duration_s))
    finally:
        store.engine.dispose()


def data_dir_of(sqlite_url: str) -> Path:
    """The FLEETSCOPE_DATA_DIR of a seeded SQLite database: the folder it lies in (reports, exports, keys)."""
    return Path(sqlite_url.split("///", 1)[1]).parent


@pytest.fixture(scope="session")
def seeded_services(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict]:
    """The seeded SQLite database's URL and what run_services returned (audit and export ids)."""
    url = f"sqlite:///{tmp_path_factory.mktemp('dash-seeded') / 'fleetscope.store.db'}"
    db.upgrade(url)
    return url, seed(url, data_dir_of(url))


@pytest.fixture(scope="session")
def seeded_sqlite_url(seeded_services: tuple[str, dict]) -> str:
    return seeded_services[0]


@pytest.fixture
def empty_sqlite_url(tmp_path: Path, sqlite_migrated: Path) -> str:
    return fresh_sqlite(sqlite_migrated, tmp_path / "fleetscope.store.db")


def _pg_database() -> Iterator[str]:
    """A PostgreSQL database of our own, so module-scoped fixtures do not race the shared one's truncation."""
    try:
        admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            conn.execute(text("SELECT 1"))
    except Exception as exc:  # noqa: BLE001
        _unavailable(f"PostgreSQL at {PG_ADMIN_URL}", exc)
    name = f"fleetscope_dash_{uuid.uuid4().hex[:10]}"
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    url = admin.url.set(database=name).render_as_string(hide_password=False)
    try:
        db.upgrade(url)
        yield url
    finally:
        with admin.connect() as conn:
            conn.execute(text(f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{name}' AND pid <> pg_backend_pid()"))
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}"'))
        admin.dispose()


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def seeded_store(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Store]:
    if request.param == "sqlite":
        url = request.getfixturevalue("seeded_sqlite_url")
        store = Store.open(url)
        yield store
        store.engine.dispose()
        return
    gen = _pg_database()
    url = next(gen)
    seed(url, tmp_path_factory.mktemp("dash-pg-seeded"))
    store = Store.open(url)
    yield store
    store.engine.dispose()
    gen.close()


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def empty_store(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Store]:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path_factory.mktemp('dash-empty') / 'fleetscope.store.db'}"
        db.upgrade(url)
        store = Store.open(url)
        yield store
        store.engine.dispose()
        return
    gen = _pg_database()
    store = Store.open(next(gen))
    yield store
    store.engine.dispose()
    gen.close()


# The simulator's Slurm and Kubernetes clusters over the showcase's nodes: a training job on every node but the two
# quietest, the vision team's jobs on the quietest (at most 17 % utilisation), as the Teams & Cost tests use them.
SCHED_IDLE_NODE = "site-b-node-002"
SCHED_FREE_NODES = ("site-a-node-003", SCHED_IDLE_NODE)
SCHED_GPU_HOUR_PRICE = {"site-a": 2.0, "site-b": 3.0}


def seed_schedulers(store: Store, *, fleet_jobs: bool = True) -> Any:
    """Ingest the simulator's ``sacct -P`` text and kube-state-metrics scrape over the showcase's nodes through the
    ingest door, place the Kubernetes nodes at site-a, record the team rules and a GPU-hour price per site; the
    ``SchedulerWorld``. ``fleet_jobs=False`` leaves out the fleet ``job`` rows the parsers also make, for tests
    whose other pages count the showcase's jobs."""
    from fleetscope.core import frames as F
    from fleetscope.core import scheduler_frames as SCH
    from fleetscope.door import ingestion
    from fleetscope.services import serving as serving_svc
    from fleetscope.services import teams as teams_svc
    from fleetscope.sim import scheduler as sim_sched
    from ingest.format import Options

    hosts = store.read("host").sort("host")
    busy = [h for h in hosts["host"] if h not in SCHED_FREE_NODES]
    training = [{"job_id": "4100", "name": "pretrain", "hosts": busy, "world_size": 8 * len(busy),
                 "start": (SEED_START + dt.timedelta(seconds=60)).isoformat(), "end": None}]
    world = sim_sched.scheduler_world(SEED_START, SEED_DURATION_S, hosts["host"].to_list(), hosts["site_id"].to_list(), 8, training)
    for data, source, opts in ((sim_sched.sacct_text(world), "sim:sacct", Options()),
                               (sim_sched.kube_state_text(world), "sim:kube-state-metrics", Options(ts=world.end))):
        if fleet_jobs:
            ingestion.ingest_bytes(store, data, source=source, opts=opts)
        else:
            batch = ingestion.to_push(data, source=source, opts=opts, now=world.end).batch
            batch.job = None
            store.write(batch)
    store.write(F.Batch(source="test:k8s-nodes", host=SCH.frame(F.HOST, [{"host": h, "site_id": "site-a"} for h in sim_sched.K8S_NODES])))
    for kind, match, team in sim_sched.TEAMS:
        teams_svc.set_mapping(store, kind=kind, match=match, team=team, recorded_by="test")
    for site, price in SCHED_GPU_HOUR_PRICE.items():
        serving_svc.record_price(store, {"site_id": site, "gpu_model": "", "valid_from": SEED_START - dt.timedelta(days=1), "currency": "EUR",
                                         "gpu_hour_price": price, "energy_price_per_kwh": None}, recorded_by="test")
    return world

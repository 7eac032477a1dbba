"""A real Celery worker process, on the embedded SQLite broker and on Redis."""

import datetime as dt
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import polars as pl
import pytest

from fleetscope.core import frames as F
from fleetscope.store import Store
from fleetscope.worker import ALERTING_QUEUE, make_celery
from tests.conftest import end_worker, fresh_sqlite, make_settings, process_alive


def start_worker(env: dict[str, str], queue: str, log: Path) -> subprocess.Popen:
    args = [sys.executable, "-m", "celery", "-A", "fleetscope.worker:celery_app", "worker", "--pool=solo", "-Q", queue, "--loglevel=INFO", "--without-heartbeat", "--without-gossip", "--without-mingle"]
    return subprocess.Popen(args, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT)


@pytest.fixture(params=["embedded", "redis"])
def worker(request, tmp_path):
    env = {**os.environ, "FLEETSCOPE_DATA_DIR": str(tmp_path), "FLEETSCOPE_DATABASE_URL": f"sqlite:///{tmp_path / 'fs.db'}"}
    env.pop("FLEETSCOPE_RESULT_BACKEND", None)
    if request.param == "redis":
        env["FLEETSCOPE_BROKER_URL"] = request.getfixturevalue("redis_url")
    else:
        env.pop("FLEETSCOPE_BROKER_URL", None)
    fresh_sqlite(request.getfixturevalue("sqlite_migrated"), tmp_path / "fs.db")
    queue = f"fleetscope-test-{uuid.uuid4().hex[:8]}"
    log = tmp_path / "worker.log"
    proc = start_worker(env, queue, log)
    settings = make_settings(tmp_path, env["FLEETSCOPE_DATABASE_URL"], broker_url=env.get("FLEETSCOPE_BROKER_URL", f"sqla+sqlite:///{tmp_path / 'broker.db'}"),
                             result_backend=env.get("FLEETSCOPE_BROKER_URL", f"db+sqlite:///{tmp_path / 'results.db'}"))
    app = make_celery(settings)
    yield app, queue, env["FLEETSCOPE_DATABASE_URL"], request.param
    if end_worker(proc) is not None:  # it died before the test was done with it
        print(log.read_text())


def test_ping_round_trip_through_a_real_worker(worker):
    app, queue, url, kind = worker
    result = app.send_task("fleetscope.ping", queue=queue).get(timeout=90)
    assert result["pong"] is True and result["database"] == "sqlite"
    # The worker records each run, so /metrics and the dashboard can see work done elsewhere.
    deadline = time.monotonic() + 10
    runs = pl.DataFrame()
    while time.monotonic() < deadline:
        runs = Store.open(url).query("SELECT task, state FROM task_run")
        if runs.height:
            break
        time.sleep(0.2)
    assert runs.rows() == [("fleetscope.ping", "success")]


def test_retention_deletes_only_old_raw_telemetry(worker):
    app, queue, url, _ = worker
    store = Store.open(url)
    now = dt.datetime(2027, 6, 1, tzinfo=dt.UTC)
    old, recent = now - dt.timedelta(days=500), now - dt.timedelta(days=10)
    store.write(F.Batch(
        gpu_sample=pl.DataFrame({"ts": [old, recent], "gpu_uuid": ["g", "g"], "power_w": [1.0, 2.0]}),
        health_event=pl.DataFrame({"ts": [old], "gpu_uuid": ["g"], "kind": ["xid"], "code": [79]}),
        serving_gauge=pl.DataFrame({"ts": [old, recent], "deployment": ["d", "d"], "replica": ["r", "r"],
                                    "metric": ["requests_waiting"] * 2, "value": [3.0, 4.0]}),
    ))
    deleted = app.send_task("fleetscope.retention", kwargs={"now_iso": now.isoformat()}, queue=queue).get(timeout=90)
    assert deleted["gpu_sample"] == 1 and deleted["serving_gauge"] == 1
    assert store.read("serving_gauge")["value"].to_list() == [4.0]
    assert store.read("gpu_sample")["power_w"].to_list() == [2.0]
    assert store.counts()["health_event"] == 1  # evidence is kept


def test_retention_prunes_what_was_derived_after_its_own_tier(worker):
    """Findings, health events and the ingest log outlive raw samples (400 days), and go after three years."""
    from sqlalchemy import text

    app, queue, url, _ = worker
    store = Store.open(url)
    now = dt.datetime(2030, 6, 1, tzinfo=dt.UTC)
    ancient, old = now - dt.timedelta(days=1200), now - dt.timedelta(days=500)
    store.write(F.Batch(
        gpu_sample=pl.DataFrame({"ts": [old], "gpu_uuid": ["g"], "power_w": [1.0]}),
        health_event=pl.DataFrame({"ts": [ancient, old], "gpu_uuid": ["g", "g"], "kind": ["xid", "xid"], "code": [79, 48]}),
        finding=F.findings_frame([{"analyzer": "health", "kind": "gpu_drain_node", "subject": f"gpu:g{i}", "window_start": t, "window_end": t,
                                   "severity": "critical", "score": 1.0, "summary": "s", "evidence": "{}"} for i, t in enumerate((ancient, old))]),
    ))
    with store.engine.begin() as conn:
        conn.execute(text("UPDATE ingest_log SET at = :t"), {"t": ancient if store.dialect != "sqlite" else int(ancient.timestamp() * 1e6)})
    deleted = app.send_task("fleetscope.retention", kwargs={"now_iso": now.isoformat()}, queue=queue).get(timeout=90)
    assert deleted["gpu_sample"] == 1 and deleted["health_event"] == 1 and deleted["finding"] == 1 and deleted["ingest_log"] >= 1
    assert store.read("health_event")["code"].to_list() == [48]
    assert store.read("finding")["subject"].to_list() == ["gpu:g1"]
    assert store.query("SELECT COUNT(*) AS n FROM ingest_log", [], {"n": pl.Int64})["n"].item() == 0


def test_model_monitoring_runs_in_the_worker_and_on_beat_s_schedule(worker):
    import numpy as np

    from fleetscope.door import ingestion
    from fleetscope.sim.predictions import credit_stream

    app, queue, url, _ = worker
    assert app.conf.beat_schedule["model-monitoring"]["task"] == "fleetscope.model_monitoring"
    store = Store.open(url)
    t0 = dt.datetime(2026, 11, 2, tzinfo=dt.UTC)
    ingestion.ingest_bytes(store, credit_stream("credit", "1", t0, hours=27, rate=60, rng=np.random.default_rng(0)).jsonl, source="c.jsonl")
    out = app.send_task("fleetscope.model_monitoring", kwargs={"now_iso": (t0 + dt.timedelta(hours=27)).isoformat()}, queue=queue).get(timeout=120)
    assert out["models"] == [{"model": "credit", "version": "1", "evaluated": 3, "findings": out["models"][0]["findings"]}]
    assert store.read("monitoring_window").height == 3


def test_a_failing_task_is_recorded_as_failure(worker):
    app, queue, url, _ = worker
    with pytest.raises(Exception):
        app.send_task("fleetscope.retention", kwargs={"now_iso": "not-a-date"}, queue=queue).get(timeout=90)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        runs = Store.open(url).query("SELECT task, state, detail FROM task_run")
        if runs.height:
            break
        time.sleep(0.2)
    assert runs["state"].to_list() == ["failure"]
    assert "not-a-date" in runs["detail"][0]


def _children(pid: int) -> list[int]:
    return [int(c) for t in Path(f"/proc/{pid}/task").iterdir() for c in (t / "children").read_text().split()]


@pytest.fixture
def cli_worker(tmp_path):
    """`fleetscope worker` as shipped, on the embedded broker: (producer app, its process, its alerting worker's pid)."""
    env = {**os.environ, "FLEETSCOPE_DATA_DIR": str(tmp_path), "FLEETSCOPE_DATABASE_URL": f"sqlite:///{tmp_path / 'fs.db'}"}
    for k in ("FLEETSCOPE_BROKER_URL", "FLEETSCOPE_RESULT_BACKEND"):
        env.pop(k, None)
    app = make_celery(make_settings(tmp_path, env["FLEETSCOPE_DATABASE_URL"], broker_url=f"sqla+sqlite:///{tmp_path / 'broker.db'}",
                                    result_backend=f"db+sqlite:///{tmp_path / 'results.db'}"))
    log = tmp_path / "worker.log"
    proc = subprocess.Popen([sys.executable, "-m", "fleetscope.cli", "worker", "--pool", "solo", "--concurrency", "1"],
                            env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT)
    children: list[int] = []
    try:
        assert app.send_task("fleetscope.ping").get(timeout=90)["pong"] is True
        children = _children(proc.pid)
        assert len(children) == 1 and f"--queues\0{ALERTING_QUEUE}\0" in Path(f"/proc/{children[0]}/cmdline").read_text()
        yield app, proc, children[0]
    finally:
        for pid in (proc.pid, *children):
            if process_alive(pid):
                os.kill(pid, signal.SIGKILL)
        proc.wait(timeout=10)
        print(log.read_text()[-3000:])


@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc")
def test_fleetscope_worker_serves_alerting_from_a_process_of_its_own(cli_worker):
    """The general queue in the verb's own pool, alerting's queue in a worker process beside it, which goes on
    serving while the general worker cannot (stopped here with SIGSTOP), and ends with it."""
    app, proc, child = cli_worker
    assert app.amqp.router.route({}, "fleetscope.alerting.evaluate")["queue"].name == ALERTING_QUEUE
    assert app.amqp.router.route({}, "fleetscope.health_window")["queue"].name == "celery"
    proc.send_signal(signal.SIGSTOP)
    try:
        assert app.send_task("fleetscope.alerting.deliver_due").get(timeout=90) == {}
    finally:
        proc.send_signal(signal.SIGCONT)
    # Killed outright, the verb cannot stop its alerting worker; Linux does (PR_SET_PDEATHSIG).
    proc.kill()
    proc.wait(timeout=10)
    deadline = time.monotonic() + 30
    while process_alive(child) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not process_alive(child)


@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc")
def test_fleetscope_worker_stops_when_its_alerting_worker_dies(cli_worker):
    """Left without alerting, the verb stops, so that its supervisor restarts the whole unit."""
    _, proc, child = cli_worker
    os.kill(child, signal.SIGKILL)
    proc.wait(timeout=90)  # raises TimeoutExpired if it runs on

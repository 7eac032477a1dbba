"""A real Celery worker evaluates and delivers to a real receiver; killed mid-delivery, the notification
is delivered again by the next worker with the same webhook-id (at least once, nothing lost)."""

import datetime as dt
import os
import signal
import subprocess
import sys
import threading
import uuid

import httpx
import polars as pl
import pytest
from cryptography.fernet import Fernet

from fleetscope.core import frames as F
from fleetscope.services.alerting import notifiers as N
from fleetscope.services.alerting import state as ST
from fleetscope.store import Store
from fleetscope.worker import ALERTING_QUEUE, make_celery
from tests.alerting.receiver import Receiver
from tests.conftest import end_worker, fresh_sqlite, make_settings, wait_until

pytestmark = pytest.mark.slow

RULES = """
rules:
  - alert: GpuFellOffBus
    health: {kind: xid, code: [79]}
    lookback: 10m
    labels: {severity: critical}
route: {receiver: hook, group_by: [alertname, host], group_wait: 0s, group_interval: 10s}
"""


def start_worker(env: dict[str, str], queue: str, log) -> subprocess.Popen:
    args = [sys.executable, "-m", "celery", "-A", "fleetscope.worker.alerting:celery_app", "worker", "--pool=solo", "-Q", queue,
            "--loglevel=INFO", "--without-heartbeat", "--without-gossip", "--without-mingle"]
    return subprocess.Popen(args, env=env, stdout=log.open("ab"), stderr=subprocess.STDOUT)


@pytest.fixture
def setup(tmp_path, sqlite_migrated):
    key = Fernet.generate_key()
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES)
    url = f"sqlite:///{tmp_path / 'fs.db'}"
    env = {**os.environ, "FLEETSCOPE_DATA_DIR": str(tmp_path), "FLEETSCOPE_DATABASE_URL": url, "FLEETSCOPE_SECRET_KEY": key.decode(),
           "FLEETSCOPE_ALERT_RULES": str(rules), "FLEETSCOPE_ALERT_ALLOW_LOOPBACK": "1", "FLEETSCOPE_ALERT_DELIVERY_TIMEOUT_S": "2",
           "PYTHONPATH": os.getcwd()}
    for k in ("FLEETSCOPE_BROKER_URL", "FLEETSCOPE_RESULT_BACKEND"):
        env.pop(k, None)
    fresh_sqlite(sqlite_migrated, tmp_path / "fs.db")
    store = Store.open(url)
    app = make_celery(make_settings(tmp_path, url, broker_url=f"sqla+sqlite:///{tmp_path / 'broker.db'}", result_backend=f"db+sqlite:///{tmp_path / 'results.db'}"))
    queue = f"alerting-test-{uuid.uuid4().hex[:8]}"
    procs: list[subprocess.Popen] = []
    yield env, store, app, queue, ST.SecretBox([key]), procs, tmp_path / "worker.log"
    for p in procs:
        end_worker(p)
    store.engine.dispose()


def xid79(store: Store, gpu: str) -> None:
    store.write(F.Batch(health_event=pl.DataFrame({"ts": [dt.datetime.now(dt.UTC)], "gpu_uuid": [gpu], "host": ["n-" + gpu], "kind": ["xid"], "code": [79]})))


def test_worker_evaluates_and_delivers(setup):
    env, store, app, queue, box, procs, log = setup
    with Receiver() as rx:
        ST.put_receiver(store.engine, box, "hook", "webhook", rx.url + "/am", policy=N.OutboundPolicy(allow_loopback=True))
        procs.append(start_worker(env, queue, log))
        xid79(store, "G1")
        result = app.send_task("fleetscope.alerting.evaluate", queue=queue).get(timeout=90)
        assert result["firing"] == 1 and len(result["notifications"]) == 1
        (req,) = wait_until(rx.accepted, 60, "the webhook", poll_s=0.1)
        assert req["json"]["alerts"][0]["labels"]["gpu_uuid"] == "G1" and req["json"]["status"] == "firing"
        wait_until(lambda: ST.list_notifications(store.engine, status="delivered"), 20, "delivered status", poll_s=0.1)


def test_worker_killed_mid_delivery_leads_to_redelivery(setup):
    env, store, app, queue, box, procs, log = setup
    in_flight = threading.Event()
    release = threading.Event()

    def answer(req):
        if not in_flight.is_set():
            in_flight.set()
            release.wait(10)  # hold the first request until its worker has been killed
        return 200, {}

    with Receiver(answer=answer) as rx:
        ST.put_receiver(store.engine, box, "hook", "webhook", rx.url, policy=N.OutboundPolicy(allow_loopback=True))
        first = start_worker(env, queue, log)
        procs.append(first)
        xid79(store, "G7")
        app.send_task("fleetscope.alerting.evaluate", queue=queue).get(timeout=90)
        assert in_flight.wait(60), "the worker never reached the receiver"
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=10)
        release.set()
        (row,) = ST.list_notifications(store.engine)
        assert row["status"] == "pending" and row["attempts"] == 1  # claimed, never recorded
        procs.append(start_worker(env, queue, log))

        def redelivered():
            # What beat does every few seconds: sweep the outbox. The lease (2 x 2 s timeout + 5 s) must run out first.
            app.send_task("fleetscope.alerting.deliver_due", queue=queue).get(timeout=60)
            return ST.list_notifications(store.engine, status="delivered")

        (done,) = wait_until(redelivered, 60, "redelivery", poll_s=0.1)
        ids = [r["headers"]["webhook-id"] for r in rx.requests]
        assert ids == [done["webhook_id"], done["webhook_id"]]  # at least once, one idempotency key
        assert done["attempts"] == 2


def test_ingest_api_kicks_an_evaluation_no_beat_needed(setup, monkeypatch):
    """No beat runs here: each webhook comes from the evaluation the API queued once it had committed a
    batch carrying an XID 79, through either ingest route."""
    from fleetscope.services import auth
    from fleetscope.api import create_app
    from tests.conftest import LiveServer

    env, store, app, _, box, procs, log = setup
    monkeypatch.setenv("FLEETSCOPE_ALERT_RULES", env["FLEETSCOPE_ALERT_RULES"])  # the API reads the worker's rules
    api = create_app(app.conf.fleetscope_settings, store=store)
    with Receiver() as rx, LiveServer(api) as server:
        ST.put_receiver(store.engine, box, "hook", "webhook", rx.url, policy=N.OutboundPolicy(allow_loopback=True))
        procs.append(start_worker(env, ALERTING_QUEUE, log))  # where the API's kicks are routed
        app.send_task("fleetscope.ping", queue=ALERTING_QUEUE).get(timeout=90)  # up before the kick, which expires after an evaluation interval
        h = {"Authorization": "Bearer " + auth.create_token(store.engine, "t", ["ingest"])}

        def heard(host: str):
            return [r for r in rx.accepted() if r["json"]["groupLabels"].get("host") == host]

        scrape = b'DCGM_FI_DEV_XID_ERRORS{gpu="0",UUID="GPU-k1",Hostname="kick-1"} 79\n'
        r = httpx.post(server.url + "/api/v1/ingest/dcgm", content=scrape, headers=h, params={"ts": dt.datetime.now(dt.UTC).isoformat()})
        assert r.status_code == 200 and r.json()["written"]["health_event"] == 1
        (req,) = wait_until(lambda: heard("kick-1"), 60, "the webhook for the scrape's XID 79", poll_s=0.1)
        assert req["json"]["alerts"][0]["labels"]["gpu_uuid"] == "GPU-k1" and req["json"]["status"] == "firing"

        batch = {"frames": {"health_event": [{"ts": dt.datetime.now(dt.UTC).isoformat(), "gpu_uuid": "GPU-k2", "host": "kick-2", "kind": "xid", "code": 79}]}}
        assert httpx.post(server.url + "/api/v1/batches", json=batch, headers=h).status_code == 200
        (req,) = wait_until(lambda: heard("kick-2"), 60, "the webhook for the batch's XID 79", poll_s=0.1)
        assert req["json"]["alerts"][0]["labels"]["gpu_uuid"] == "GPU-k2"
        runs = store.query("SELECT task FROM task_run WHERE task = 'fleetscope.alerting.evaluate'", [], {"task": pl.String})
        assert runs.height >= 2  # the kicks; nothing else queues an evaluation here

"""Alerting endpoints on a live API: scopes, rule CRUD with field errors, silences, receivers, outbox."""

import datetime as dt

import httpx
import polars as pl
import pytest
from cryptography.fernet import Fernet

from fleetscope.services import auth
from fleetscope.core import frames as F
from fleetscope.services.alerting import state as ST
from fleetscope.services.alerting.rules import load_config
from tests.conftest import LiveServer, make_settings


@pytest.fixture
def live(tmp_path, monkeypatch):
    from fleetscope.store import db
    from fleetscope.api import create_app
    from fleetscope.api import routes_alerts

    monkeypatch.setenv("FLEETSCOPE_SECRET_KEY", Fernet.generate_key().decode())
    url = f"sqlite:///{tmp_path / 'fs.db'}"
    db.upgrade(url)
    app = create_app(make_settings(tmp_path, url))
    app.include_router(routes_alerts.router)
    with LiveServer(app) as server:
        engine = app.state.store.engine
        admin = auth.create_token(engine, "admin", ["admin"])
        read = auth.create_token(engine, "reader", ["read"])
        yield server.url, app, {"Authorization": f"Bearer {admin}"}, {"Authorization": f"Bearer {read}"}
    app.state.store.engine.dispose()


def test_scopes(live):
    url, _, admin, read = live
    assert httpx.get(url + "/api/v1/alerts").status_code == 401
    assert httpx.get(url + "/api/v1/alerts", headers=read).status_code == 200
    assert httpx.put(url + "/api/v1/alerts/rules/X", headers=read, json={"findings": {"kind": "a"}}).status_code == 403
    assert httpx.post(url + "/api/v1/alerts/silences", headers=read, json={}).status_code == 403
    assert httpx.get(url + "/api/v1/alerts/receivers", headers=read).status_code == 403


def test_rule_crud_and_errors(live):
    url, _, admin, read = live
    r = httpx.put(url + "/api/v1/alerts/rules/SlowJob", headers=admin, json={"findings": {"kind": "straggler"}, "for": "soon"})
    assert r.status_code == 422 and r.json()["rule"] == "SlowJob" and r.json()["field"] == "for"
    r = httpx.put(url + "/api/v1/alerts/rules/SlowJob", headers=admin, json={"findings": {"kind": "straggler"}, "for": "5m"})
    assert r.status_code == 200
    assert httpx.delete(url + "/api/v1/alerts/rules/GpuFellOffBus", headers=admin).status_code == 204
    rules = {r["name"]: r for r in httpx.get(url + "/api/v1/alerts/rules", headers=read).json()}
    assert rules["SlowJob"]["source"] == "api" and rules["Straggler"]["source"] == "file" and "GpuFellOffBus" not in rules


def test_alerts_silences_receivers_and_outbox(live):
    url, app, admin, read = live
    store = app.state.store
    r = httpx.put(url + "/api/v1/alerts/receivers/default", headers=admin, json={"kind": "webhook", "url": "http://169.254.169.254/x"})
    assert r.status_code == 422 and "169.254.169.254" in r.json()["detail"]
    r = httpx.put(url + "/api/v1/alerts/receivers/default", headers=admin, json={"kind": "standard", "url": "http://93.184.215.14/hook?k=s3cret", "secrets": ["whsec_" + "A" * 32]})
    assert r.status_code == 200 and r.json()["url_display"] == "http://93.184.215.14" and r.json()["has_secret"]
    assert "s3cret" not in httpx.get(url + "/api/v1/alerts/receivers", headers=admin).text

    now = dt.datetime.now(dt.UTC)
    store.write(F.Batch(health_event=pl.DataFrame({"ts": [now], "gpu_uuid": ["G1"], "host": ["n1"], "kind": ["xid"], "code": [79]})))
    ST.evaluate_and_dispatch(store, ST.effective_config(store.engine, load_config()), now=now + dt.timedelta(seconds=1))
    (alert,) = httpx.get(url + "/api/v1/alerts", headers=read).json()
    assert alert["rule"] == "GpuFellOffBus" and alert["state"] == "firing" and alert["silenced_by"] == []
    (note,) = httpx.get(url + "/api/v1/alerts/notifications", headers=read).json()
    assert note["status"] == "pending" and note["webhook_id"].startswith("msg_")

    r = httpx.post(url + "/api/v1/alerts/silences", headers=admin, json={
        "matchers": [{"name": "host", "value": "n1", "isRegex": False, "isEqual": True}],
        "endsAt": (now + dt.timedelta(hours=1)).isoformat(), "comment": "replacing GPU"})
    assert r.status_code == 201
    sid = r.json()["silenceID"]
    (alert,) = httpx.get(url + "/api/v1/alerts", headers=read).json()
    assert alert["silenced_by"] == [sid]
    (sil,) = httpx.get(url + "/api/v1/alerts/silences", headers=read).json()
    assert sil["status"]["state"] == "active" and sil["createdBy"] == "admin" and sil["matchers"][0]["name"] == "host"
    assert httpx.delete(url + f"/api/v1/alerts/silences/{sid}", headers=admin).status_code == 204
    assert httpx.get(url + "/api/v1/alerts/silences", headers=read).json()[0]["status"]["state"] == "expired"
    assert httpx.post(url + "/api/v1/alerts/silences", headers=admin, json={"matchers": ["host=~\".*\""], "endsAt": "2099-01-01T00:00:00Z"}).status_code == 422
    assert httpx.post(url + f"/api/v1/alerts/notifications/{note['notification_id']}/retry", headers=admin).status_code == 409

"""Durable state and delivery on SQLite and PostgreSQL, against a real HTTP receiver on loopback."""

import base64
import datetime as dt
import hashlib
import hmac
import json
import random

import polars as pl
import pytest
from cryptography.fernet import Fernet
from sqlalchemy import select, text

from fleetscope.core import frames as F
from fleetscope.services.alerting import notifiers as N
from fleetscope.store import alerting_schema as S
from fleetscope.services.alerting import state as ST
from fleetscope.services.alerting.rules import RuleError, load_config
from fleetscope.store import Store
from tests.alerting.receiver import Receiver

NOW = dt.datetime.now(dt.UTC).replace(microsecond=0)
LOOPBACK = N.OutboundPolicy(allow_loopback=True)
CONFIG_TEXT = """
rules:
  - alert: GpuFellOffBus
    health: {kind: xid, code: [79]}
    keep_firing_for: 0s
    lookback: 60s
    labels: {severity: critical}
    annotations: {summary: "{{ $labels.gpu_uuid }} fell off the bus"}
route: {receiver: hook, group_by: [alertname, host], group_wait: 0s, group_interval: 10s, repeat_interval: 1h}
"""


def at(s: float) -> dt.datetime:
    return NOW + dt.timedelta(seconds=s)


@pytest.fixture
def box():
    return ST.SecretBox([Fernet.generate_key()])


def xid(store: Store, t: float, gpus: list[str], hosts: list[str] | None = None) -> None:
    store.write(F.Batch(health_event=pl.DataFrame({
        "ts": [at(t)] * len(gpus), "gpu_uuid": gpus, "host": hosts or ["n-" + g for g in gpus], "kind": ["xid"] * len(gpus), "code": [79] * len(gpus)})))


def rows(store: Store) -> list:
    with store.engine.connect() as conn:
        return conn.execute(select(S.alert_notification).order_by(S.alert_notification.c.notification_id)).all()


def deliverer(store, box, **kw):
    retry = N.RetryPolicy(base_s=kw.pop("base_s", 1), cap_s=8, dead_after_s=kw.pop("dead_after_s", 3600))
    return ST.Deliverer(store, box, LOOPBACK, retry, timeout_s=2, rng=random.Random(0), **kw)


def test_evaluation_is_durable_and_sends_no_duplicate_after_restart(store, box):
    config = load_config(text=CONFIG_TEXT)
    xid(store, 0, ["G1"])
    r = ST.evaluate_and_dispatch(store, config, now=at(1))
    assert r.firing == 1 and len(rows(store)) == 1
    # A "restart": a new store over the same database, evaluating again.
    st2 = Store.open(store.engine.url.render_as_string(hide_password=False))
    try:
        for t in (2, 5, 9):
            ST.evaluate_and_dispatch(st2, config, now=at(t))
        ST.evaluate_and_dispatch(st2, config, now=at(11))  # group_interval: nothing new
        assert len(rows(store)) == 1
        # The XID leaves the lookback window: resolved, and the receiver is told.
        r = ST.evaluate_and_dispatch(st2, config, now=at(62))
        assert r.firing == 0 and len(rows(store)) == 2
    finally:
        st2.engine.dispose()
    first, second = (json.loads(x.payload_json) for x in rows(store))
    assert first["status"] == "firing" and second["status"] == "resolved"
    assert first["alerts"][0]["fingerprint"] == second["alerts"][0]["fingerprint"]
    assert first["alerts"][0]["annotations"]["summary"] == "G1 fell off the bus"
    assert {x.status for x in rows(store)} == {"dead"}  # no receiver named hook exists: dead-lettered, visible


def test_receiver_down_then_up_gets_every_notification_once(store, box):
    config = load_config(text=CONFIG_TEXT)
    rx = Receiver()
    ST.put_receiver(store.engine, box, "hook", "webhook", rx.url + "/alerts", policy=LOOPBACK)
    xid(store, 0, [f"G{i}" for i in range(5)])  # five hosts: five groups, five notifications
    assert len(ST.evaluate_and_dispatch(store, config, now=at(1)).notifications) == 5
    d = deliverer(store, box)
    assert d.deliver_due(now=at(1)) == {"pending": 5}  # down: connection refused, retry later
    assert d.deliver_due(now=at(1.2)) == {}  # not due yet (backoff)
    assert {x.attempts for x in rows(store)} == {1}
    assert d.deliver_due(now=at(3)) == {"pending": 5}  # still down
    rx.start()
    try:
        t = 3.0
        while any(x.status == "pending" for x in rows(store)) and t < 60:
            t += 1
            d.deliver_due(now=at(t))
        got = [r["headers"]["webhook-id"] for r in rx.accepted()]
        assert sorted(got) == sorted(x.webhook_id for x in rows(store))
        assert len(got) == len(set(got)) == 5
        assert all(x.status == "delivered" and x.attempts >= 3 for x in rows(store))
        attempts = ST.list_attempts(store.engine, rows(store)[0].notification_id)
        assert [a["outcome"] for a in attempts][-1] == "delivered" and all(a["outcome"] == "retry" for a in attempts[:-1])
        assert "ConnectError" in attempts[0]["error"]
        body = rx.accepted()[0]["json"]
        assert body["version"] == "4" and body["receiver"] == "hook" and body["status"] == "firing"
    finally:
        rx.stop()


def test_429_retry_after_is_honoured(store, box):
    config = load_config(text=CONFIG_TEXT)
    answers = iter([(429, {"Retry-After": "30"}), (200, {})])
    with Receiver(answer=lambda req: next(answers)) as rx:
        ST.put_receiver(store.engine, box, "hook", "webhook", rx.url, policy=LOOPBACK)
        xid(store, 0, ["G1"])
        ST.evaluate_and_dispatch(store, config, now=at(1))
        d = deliverer(store, box)
        assert d.deliver_due(now=at(1)) == {"pending": 1}
        (row,) = rows(store)
        assert row.next_attempt_at == at(31) and row.last_status_code == 429
        assert d.deliver_due(now=at(30)) == {}
        assert d.deliver_due(now=at(31)) == {"delivered": 1}
        assert len(rx.requests) == 2 and rx.requests[0]["headers"]["webhook-id"] == rx.requests[1]["headers"]["webhook-id"]


def test_410_disables_the_receiver(store, box):
    config = load_config(text=CONFIG_TEXT)
    with Receiver(answer=lambda req: (410, {})) as rx:
        ST.put_receiver(store.engine, box, "hook", "webhook", rx.url, policy=LOOPBACK)
        xid(store, 0, ["G1", "G2"])
        ST.evaluate_and_dispatch(store, config, now=at(1))
        d = deliverer(store, box)
        assert d.deliver_due(now=at(1), limit=1) == {"disabled": 1}
        assert [x.status for x in rows(store)] == ["disabled", "disabled"]  # the other one is not sent
        assert len(rx.requests) == 1
        info = ST.receiver_info(store.engine, "hook")
        assert info["disabled_at"] is not None and "410" in info["disabled_reason"]
        xid(store, 5, ["G3"])
        ST.evaluate_and_dispatch(store, config, now=at(6))
        assert rows(store)[-1].status == "disabled"
        # Saving the receiver again re-enables it; a requeue sends the notification with its webhook-id.
        ST.put_receiver(store.engine, box, "hook", "webhook", rx.url, policy=LOOPBACK)
        rx.answer = lambda req: (200, {})
        assert ST.requeue(store.engine, rows(store)[0].notification_id, now=at(7))
        assert d.deliver_due(now=at(7)) == {"delivered": 1}
        assert rx.requests[-1]["headers"]["webhook-id"] == rows(store)[0].webhook_id


def test_permanent_4xx_and_dead_letter_after_time(store, box):
    config = load_config(text=CONFIG_TEXT)
    with Receiver(answer=lambda req: (400, {})) as rx:
        ST.put_receiver(store.engine, box, "hook", "webhook", rx.url, policy=LOOPBACK)
        xid(store, 0, ["G1"])
        ST.evaluate_and_dispatch(store, config, now=at(1))
        assert deliverer(store, box).deliver_due(now=at(1)) == {"dead": 1}
        assert len(rx.requests) == 1  # a 400 is not retried
    port = Receiver().port  # nothing listens: retryable, until the dead-letter time passes
    ST.put_receiver(store.engine, box, "hook", "webhook", f"http://127.0.0.1:{port}/", policy=LOOPBACK)
    xid(store, 2, ["G2"])
    ST.evaluate_and_dispatch(store, config, now=at(3))
    d = deliverer(store, box, dead_after_s=10)
    t = 3
    while rows(store)[-1].status == "pending" and t < 40:
        d.deliver_due(now=at(t))
        t += 1
    assert rows(store)[-1].status == "dead" and "gave up" in rows(store)[-1].last_error
    assert [n["notification_id"] for n in ST.list_notifications(store.engine, status="dead")] == [r.notification_id for r in rows(store)][::-1]


def test_ssrf_refused_when_saving_and_when_sending(store, box):
    with pytest.raises(N.UnsafeURL):
        ST.put_receiver(store.engine, box, "meta", "webhook", "http://169.254.169.254/latest", policy=N.OutboundPolicy(True, True))
    with pytest.raises(N.UnsafeURL):
        ST.put_receiver(store.engine, box, "lo", "webhook", "http://127.0.0.1:9/", policy=N.OutboundPolicy())
    # A name that resolved to a public address when saved but to the metadata service at send time.
    public = lambda h, p: ["93.184.215.14"]
    ST.put_receiver(store.engine, box, "hook", "webhook", "http://hooks.example/x", policy=N.OutboundPolicy(), resolver=public)
    xid(store, 0, ["G1"])
    ST.evaluate_and_dispatch(store, load_config(text=CONFIG_TEXT), now=at(1))
    d = ST.Deliverer(store, box, N.OutboundPolicy(), N.RetryPolicy(), resolver=lambda h, p: ["169.254.169.254"])
    assert d.deliver_due(now=at(1)) == {"dead": 1}
    assert "metadata" in rows(store)[0].last_error


def test_signed_receiver_secrets_encrypted_and_rotation(store, box):
    config = load_config(text=CONFIG_TEXT)
    old, new = N.generate_secret(), N.generate_secret()
    with Receiver() as rx:
        ST.put_receiver(store.engine, box, "hook", "standard", rx.url + "/sig?token=abc", secrets=[new, old], policy=LOOPBACK)
        with store.engine.connect() as conn:
            raw = " ".join(str(v) for v in conn.execute(text("SELECT * FROM alert_receiver")).one())
        assert old[6:] not in raw and new[6:] not in raw and "token=abc" not in raw
        assert ST.receiver_info(store.engine) == [{"name": "hook", "kind": "standard", "url_display": rx.url, "options": {},
                                                   "disabled_at": None, "disabled_reason": None, "has_secret": True}]
        xid(store, 0, ["G1"])
        ST.evaluate_and_dispatch(store, config, now=at(1))
        assert deliverer(store, box).deliver_due(now=at(1)) == {"delivered": 1}
        (req,) = rx.requests
        h = req["headers"]
        for secret in (old, new):
            key = base64.b64decode(secret[6:])
            want = base64.b64encode(hmac.new(key, f"{h['webhook-id']}.{h['webhook-timestamp']}.".encode() + req["body"], hashlib.sha256).digest()).decode()
            assert f"v1,{want}" in h["webhook-signature"].split(" ")
        assert req["path"] == "/sig?token=abc"
    # A different key cannot read the stored secrets.
    with store.engine.connect() as conn, pytest.raises(ValueError, match="FLEETSCOPE_SECRET_KEY"):
        ST.load_notifier(conn, ST.SecretBox([Fernet.generate_key()]), "hook", 5)


def test_silence_and_rule_crud(store, box):
    base = load_config(text=CONFIG_TEXT)
    with pytest.raises(RuleError, match="field 'for'"):
        ST.put_rule(store.engine, {"alert": "X", "findings": {"kind": "a"}, "for": "later"})
    ST.put_rule(store.engine, {"alert": "Straggler", "findings": {"kind": "straggler"}, "for": "1m"})
    ST.delete_rule(store.engine, "GpuFellOffBus")
    cfg = ST.effective_config(store.engine, base)
    assert [r.name for r in cfg.rules] == ["Straggler"]
    sil = ST.create_silence(store.engine, ['host=~"n-G.*"'], None, at(600), "sre", "maintenance", now=at(0))
    assert [s.id for s in ST.list_silences(store.engine, now=at(1), active_only=True)] == [sil.id]
    with pytest.raises(ValueError):
        ST.create_silence(store.engine, ['host=~".*"'], None, at(600), "sre", "everything")
    # createdBy wider than its column: a clear refusal on both databases (PostgreSQL would fail the insert).
    with pytest.raises(ValueError, match="createdBy is longer than 200 characters"):
        ST.create_silence(store.engine, ['host="n1"'], None, at(600), "s" * 201, "too long")
    assert len(ST.list_silences(store.engine)) == 1
    # A silenced alert is held, not sent; the silence expires and it goes out.
    ST.put_rule(store.engine, {"alert": "GpuFellOffBus", "health": {"kind": "xid", "code": [79]}, "lookback": "10m", "labels": {"severity": "critical"}})
    cfg = ST.effective_config(store.engine, base)
    xid(store, 0, ["G1"])
    assert ST.evaluate_and_dispatch(store, cfg, now=at(1)).notifications == [] and rows(store) == []
    alerts = ST.list_alerts(store.engine, cfg, now=at(2))
    assert alerts[0]["silenced_by"] == [sil.id]
    assert ST.expire_silence(store.engine, sil.id, now=at(5))
    assert ST.silence_dict(ST.list_silences(store.engine)[0], at(6))["status"]["state"] == "expired"
    ST.evaluate_and_dispatch(store, cfg, now=at(11))
    assert len(rows(store)) == 1


def test_secret_key_file_is_created_0600(tmp_path, monkeypatch):
    import dataclasses
    import os
    import stat

    from fleetscope import settings as settings_mod
    from fleetscope.services.alerting import config as C

    monkeypatch.delenv("FLEETSCOPE_SECRET_KEY", raising=False)
    s = dataclasses.replace(settings_mod.load(), data_dir=tmp_path)
    keys = C.secret_keys(s, C.load(s))
    assert stat.S_IMODE(os.stat(tmp_path / "secret.key").st_mode) == 0o600
    assert C.secret_keys(s, C.load(s)) == keys  # stable across restarts
    monkeypatch.setenv("FLEETSCOPE_SECRET_KEY", "a,b")
    assert C.secret_keys(s, C.load(s)) == [b"a", b"b"]

"""Celery tasks for alerting, registered on ``fleetscope.worker.celery_app``, and their beat schedule.

- ``fleetscope.alerting.evaluate`` (beat, every ``FLEETSCOPE_ALERT_EVAL_INTERVAL_S``): evaluate the rules,
  flush due groups, write the outbox, and queue an immediate delivery of each new notification;
- ``fleetscope.alerting.deliver``: one attempt at one notification;
- ``fleetscope.alerting.deliver_due`` (beat, every ``FLEETSCOPE_ALERT_DELIVER_INTERVAL_S``): retries that
  are due, and rows whose worker died mid-delivery once their lease has run out.

Tasks are acknowledged late (the app's ``task_acks_late``), so a killed worker's task is redelivered where
the broker does so; the outbox sweep does not depend on it: the database is the source of truth.
"""

from __future__ import annotations

import datetime as dt
import socket
from typing import Any

from fleetscope.services.alerting import config as C
from fleetscope.services.alerting import state as ST
from fleetscope.services.alerting.service import Alerting, open_alerting
from fleetscope.worker.app import celery_app, store


_ctx: Alerting | None = None


def context() -> Alerting:
    """Per process: the alerting settings, the rules file (read once, at start) and the secret box."""
    global _ctx
    if _ctx is None:
        _ctx = open_alerting(celery_app.conf.fleetscope_settings)
    return _ctx


def _deliverer() -> ST.Deliverer:
    c = context()
    return ST.Deliverer(store(), c.box, c.settings.outbound, c.settings.retry, timeout_s=c.settings.delivery_timeout_s,
                        max_response_bytes=c.settings.response_max_bytes)


def _queue(task: Any) -> str | None:
    info = getattr(task.request, "delivery_info", None) or {}
    return info.get("routing_key")


@celery_app.task(name="fleetscope.alerting.evaluate", bind=True)
def evaluate(self: Any, now_iso: str | None = None) -> dict[str, Any]:
    now = dt.datetime.fromisoformat(now_iso) if now_iso else None
    c = context()
    config = c.effective_config(store().engine)
    result = ST.evaluate_and_dispatch(store(), config, now=now, holder=socket.gethostname())
    # Deliver at once rather than at the next sweep: the sweep is the safety net, not the fast path.
    queue = _queue(self)
    for nid in result.notifications:
        deliver.apply_async((nid,), queue=queue) if queue else deliver.delay(nid)
    return {"firing": result.firing, "pending": result.pending, "notifications": result.notifications, "eval_s": round(result.eval_s, 4)}


@celery_app.task(name="fleetscope.alerting.deliver")
def deliver(notification_id: int) -> str | None:
    return _deliverer().deliver(int(notification_id))


@celery_app.task(name="fleetscope.alerting.deliver_due")
def deliver_due(limit: int = 100) -> dict[str, int]:
    return _deliverer().deliver_due(limit=limit)


def schedule(alert: C.AlertSettings | None = None) -> dict[str, dict[str, Any]]:
    """Beat entries; each expires after its own interval so a backlog behind a stopped worker is dropped,
    not replayed as a burst."""
    alert = alert or C.load(celery_app.conf.fleetscope_settings)
    return {
        "alerting-evaluate": {"task": "fleetscope.alerting.evaluate", "schedule": dt.timedelta(seconds=alert.eval_interval_s),
                              "options": {"expires": max(1.0, alert.eval_interval_s)}},
        "alerting-deliver-due": {"task": "fleetscope.alerting.deliver_due", "schedule": dt.timedelta(seconds=alert.deliver_interval_s),
                                 "options": {"expires": max(1.0, alert.deliver_interval_s)}},
    }


celery_app.conf.beat_schedule = {**(celery_app.conf.beat_schedule or {}), **schedule()}

"""Alert state as the dashboard lists it: alerts (firing, pending, resolved), silences and notifications."""

from __future__ import annotations

import datetime as dt
from typing import Any

import polars as pl

from fleetscope.core import frames as F
from fleetscope.store import Store
from fleetscope.services.alerting import config as alert_config
from fleetscope.services.alerting import state as ST
from fleetscope.services.alerting.rules import RuleError, load_config

UTC = F.UTC_US


def _alerting_config() -> Any:
    """The rules file's configuration with the API's edits layered on by the caller, for inhibition; None
    when the file does not load (the API would not start either; the page still shows the alerts)."""

    try:
        return load_config(alert_config.load().rules_path)
    except (RuleError, OSError, ValueError):
        return None


def alerts(store: Store, include_resolved: bool = True, now: dt.datetime | None = None) -> pl.DataFrame:
    """Alerts the rules hold, firing first: ``alertname, state, severity, summary, labels`` (name="value"
    pairs), ``active_at, fired_at, resolved_at, value, silenced_by`` (ids of the silences muting it,
    comma-separated), ``inhibited, fingerprint``."""

    base = _alerting_config()
    config = ST.effective_config(store.reader, base) if base is not None else None
    rows = ST.list_alerts(store.reader, config, now=now, include_resolved=include_resolved)
    schema = {"alertname": pl.String, "state": pl.String, "severity": pl.String, "summary": pl.String, "labels": pl.String,
              "active_at": UTC, "fired_at": UTC, "resolved_at": UTC, "value": pl.Float64, "silenced_by": pl.String,
              "inhibited": pl.Boolean, "fingerprint": pl.String}
    out = [
        {
            "alertname": a["labels"].get("alertname", a["rule"]),
            "state": a["state"],
            "severity": a["labels"].get("severity"),
            "summary": a["annotations"].get("summary"),
            "labels": ", ".join(f'{k}="{v}"' for k, v in sorted(a["labels"].items()) if k not in ("alertname", "severity")),
            "active_at": dt.datetime.fromisoformat(a["active_at"]) if a["active_at"] else None,
            "fired_at": dt.datetime.fromisoformat(a["fired_at"]) if a["fired_at"] else None,
            "resolved_at": dt.datetime.fromisoformat(a["resolved_at"]) if a["resolved_at"] else None,
            "value": a["value"],
            "silenced_by": ", ".join(a["silenced_by"]) or None,
            "inhibited": bool(a["inhibited"]),
            "fingerprint": a["fingerprint"],
        }
        for a in rows
    ]
    order = {"firing": 0, "pending": 1, "inactive": 2}
    df = pl.DataFrame(out, schema=schema)
    return df.sort(pl.col("state").replace_strict(order, default=3, return_dtype=pl.Int64), pl.col("active_at"), descending=[False, True])


def silences(store: Store, now: dt.datetime | None = None) -> pl.DataFrame:
    """Every silence, latest ending first: ``silence_id, state`` (pending, active, expired), ``matchers``
    (Alertmanager's text form), ``starts_at, ends_at, created_by, comment``."""

    now = now or dt.datetime.now(dt.UTC)
    rows = [
        {"silence_id": s.id, "state": s.state(now), "matchers": ", ".join(str(m) for m in s.matchers), "starts_at": s.starts_at,
         "ends_at": s.ends_at, "created_by": s.created_by, "comment": s.comment}
        for s in ST.list_silences(store.reader, now=now)
    ]
    schema = {"silence_id": pl.String, "state": pl.String, "matchers": pl.String, "starts_at": UTC, "ends_at": UTC,
              "created_by": pl.String, "comment": pl.String}
    return pl.DataFrame(rows, schema=schema)


_NOTIFICATION_SCHEMA = {
    "notification_id": pl.Int64, "receiver": pl.String, "group_key": pl.String, "status": pl.String, "created_at": UTC,
    "attempts": pl.Int64, "next_attempt_at": UTC, "delivered_at": UTC, "last_status_code": pl.Int64, "last_error": pl.String,
    "webhook_id": pl.String,
}


def notifications(store: Store, status: str | None = None, limit: int = 200) -> pl.DataFrame:
    """The outbox, newest first (``status``: pending, delivered, dead or disabled; ``dead`` lists the dead
    letters): ``notification_id, receiver, group_key, status, created_at, attempts, next_attempt_at,
    delivered_at, last_status_code, last_error, webhook_id``."""

    rows = ST.list_notifications(store.reader, status=status, limit=limit)
    return pl.DataFrame([{k: r.get(k) for k in _NOTIFICATION_SCHEMA} for r in rows], schema=_NOTIFICATION_SCHEMA)


def notification_counts(store: Store) -> dict[str, int]:
    """Notifications per status (pending, delivered, dead, disabled), zeros included."""

    return {"pending": 0, "delivered": 0, "dead": 0, "disabled": 0, **ST.counts(store.reader)}

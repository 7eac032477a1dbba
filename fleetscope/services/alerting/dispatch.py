"""Notification: routing, aggregation groups and their timers, inhibition, silences, dedup.

Pure: alerts, the previous group state and ``now`` in; the next group state and the notifications to send
out. The semantics are Alertmanager's (docs, "Configuration" and "Alerting overview"; ``dispatch/``,
``inhibit/``, ``silence/``, ``notify/notify.go``):

- each alert is routed (``Route.match``) and put in the aggregation group of its route and its values of
  ``group_by``; a new group waits ``group_wait`` before its first notification (at once if the alert is
  older than that), then is looked at every ``group_interval``;
- at each look, muted alerts are dropped: *silenced* (an active silence whose matchers all match) or
  *inhibited* (a firing source alert that matches the rule's ``source_matchers`` and agrees on the ``equal``
  labels; an alert matching both sides cannot inhibit another that does, as in Alertmanager);
- then Alertmanager's dedup decides (``DedupStage.needsUpdate``): notify when a firing alert was not in the
  last notification, when an alert resolved since (``send_resolved``), when everything resolved, or when
  nothing changed but ``repeat_interval`` has passed since the last one;
- resolved alerts leave the group once notified; an empty group is deleted.

Where Fleetscope departs on purpose: a resolved alert whose firing was notified is never muted, so a
receiver that was paged always hears the end of it.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping, Sequence
from functools import cmp_to_key
from dataclasses import dataclass, field
from typing import Any

from fleetscope.services.alerting.engine import FIRING, INACTIVE, AlertState
from fleetscope.services.alerting.labels import Matcher, labelset_string, matches_all
from fleetscope.services.alerting.rules import AlertingConfig, InhibitRule, Route

ZERO_TIME = "0001-01-01T00:00:00Z"  # Go's zero time.Time, which Alertmanager sends as endsAt of firing alerts


def go_time(t: dt.datetime | None) -> str:
    """RFC 3339 as Go's ``time.Time`` marshals to JSON (``RFC3339Nano``: fraction without trailing zeros, ``Z``)."""
    if t is None:
        return ZERO_TIME
    t = t.astimezone(dt.UTC)
    base = t.strftime("%Y-%m-%dT%H:%M:%S")
    frac = f"{t.microsecond:06d}".rstrip("0")
    return f"{base}.{frac}Z" if frac else base + "Z"


def _t(s: Any) -> dt.datetime | None:
    return None if s is None else s if isinstance(s, dt.datetime) else dt.datetime.fromisoformat(s)


@dataclass(frozen=True)
class Alert:
    """What the dispatcher holds: Alertmanager's alert (``endsAt`` None while firing)."""

    fingerprint: str
    labels: dict[str, str]
    annotations: dict[str, str]
    starts_at: dt.datetime
    ends_at: dt.datetime | None = None
    generator_url: str = ""

    @property
    def resolved(self) -> bool:
        return self.ends_at is not None

    def to_dict(self) -> dict[str, Any]:
        return {"fingerprint": self.fingerprint, "labels": self.labels, "annotations": self.annotations,
                "starts_at": self.starts_at.isoformat(), "ends_at": None if self.ends_at is None else self.ends_at.isoformat(),
                "generator_url": self.generator_url}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Alert:
        return cls(d["fingerprint"], dict(d["labels"]), dict(d["annotations"]), _t(d["starts_at"]), _t(d.get("ends_at")), d.get("generator_url", ""))  # type: ignore[arg-type]

    def payload(self) -> dict[str, Any]:
        """One entry of a webhook's ``alerts`` (Alertmanager's ``template.Alert``)."""
        return {
            "status": "resolved" if self.resolved else "firing",
            "labels": dict(sorted(self.labels.items())),
            "annotations": dict(sorted(self.annotations.items())),
            "startsAt": go_time(self.starts_at),
            "endsAt": go_time(self.ends_at),
            "generatorURL": self.generator_url,
            "fingerprint": self.fingerprint,
        }


@dataclass
class Group:
    """One aggregation group and its notification log entry (Alertmanager's aggrGroup + nflog entry)."""

    id: str  # route id + group labels: unique
    group_key: str  # Alertmanager's groupKey, route key + group labels: what receivers see
    route_id: str
    receiver: str
    group_labels: dict[str, str]
    alerts: dict[str, Alert] = field(default_factory=dict)
    next_flush_at: dt.datetime | None = None
    has_flushed: bool = False
    last_firing: frozenset[str] = frozenset()
    last_resolved: frozenset[str] = frozenset()
    last_notified_at: dt.datetime | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id, "group_key": self.group_key, "route_id": self.route_id, "receiver": self.receiver,
            "group_labels": self.group_labels, "alerts": [a.to_dict() for a in self.alerts.values()],
            "next_flush_at": None if self.next_flush_at is None else self.next_flush_at.isoformat(),
            "has_flushed": self.has_flushed, "last_firing": sorted(self.last_firing), "last_resolved": sorted(self.last_resolved),
            "last_notified_at": None if self.last_notified_at is None else self.last_notified_at.isoformat(),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Group:
        alerts = [Alert.from_dict(a) for a in d.get("alerts", [])]
        return cls(d["id"], d["group_key"], d["route_id"], d["receiver"], dict(d["group_labels"]), {a.fingerprint: a for a in alerts},
                   _t(d.get("next_flush_at")), bool(d.get("has_flushed")), frozenset(d.get("last_firing", ())),
                   frozenset(d.get("last_resolved", ())), _t(d.get("last_notified_at")))


@dataclass(frozen=True)
class Silence:
    """A silence: matchers and a time window (Alertmanager's ``silencepb.Silence``)."""

    id: str
    matchers: tuple[Matcher, ...]
    starts_at: dt.datetime
    ends_at: dt.datetime
    created_by: str = ""
    comment: str = ""

    def active(self, now: dt.datetime) -> bool:
        return self.starts_at <= now < self.ends_at

    def state(self, now: dt.datetime) -> str:
        return "pending" if now < self.starts_at else "active" if now < self.ends_at else "expired"

    def mutes(self, labels: Mapping[str, str], now: dt.datetime) -> bool:
        return self.active(now) and bool(self.matchers) and matches_all(self.matchers, labels)


@dataclass(frozen=True)
class Notification:
    """One message for one receiver about one group: Alertmanager's ``template.Data`` plus the groupKey."""

    group_key: str
    receiver: str
    status: str
    alerts: tuple[Alert, ...]
    group_labels: dict[str, str]
    common_labels: dict[str, str]
    common_annotations: dict[str, str]
    external_url: str
    created_at: dt.datetime

    def data(self) -> dict[str, Any]:
        return {
            "receiver": self.receiver,
            "status": self.status,
            "alerts": [a.payload() for a in self.alerts],
            "groupLabels": dict(sorted(self.group_labels.items())),
            "commonLabels": dict(sorted(self.common_labels.items())),
            "commonAnnotations": dict(sorted(self.common_annotations.items())),
            "externalURL": self.external_url,
            "groupKey": self.group_key,
        }


def alerts_from_states(states: Iterable[AlertState], external_url: str = "") -> list[Alert]:
    """The engine's alerts as the notifier sees them: firing, or resolved after having fired. Pending
    alerts are not sent (Prometheus sends only firing and resolved alerts to Alertmanager)."""
    out = []
    for s in states:
        if s.fired_at is None or s.state not in (FIRING, INACTIVE):
            continue
        url = f"{external_url.rstrip('/')}/api/v1/alerts?alertname={s.rule}" if external_url else ""
        out.append(Alert(s.fingerprint, s.labels, s.annotations, s.fired_at, s.resolved_at if s.state == INACTIVE else None, url))
    return out


class Inhibitor:
    """Alertmanager's ``Inhibitor.Mutes``: a target is muted by a firing source alert (other than itself)
    that agrees on every ``equal`` label; if the target matches the source side too, sources that also
    match the target side are not counted (so two alerts cannot inhibit each other). Sources are indexed
    by their ``equal`` values, so muting costs a lookup, not a scan of every firing alert."""

    def __init__(self, rules: Sequence[InhibitRule], firing: Sequence[Alert]):
        self.rules = list(rules)
        self.index: list[dict[tuple[str, ...], list[Alert]]] = []
        for r in self.rules:
            idx: dict[tuple[str, ...], list[Alert]] = {}
            for src in firing:
                if not src.resolved and matches_all(r.source_matchers, src.labels):
                    idx.setdefault(tuple(src.labels.get(n, "") for n in r.equal), []).append(src)
            self.index.append(idx)

    def mutes(self, alert: Alert) -> bool:
        for r, idx in zip(self.rules, self.index):
            if not idx or not matches_all(r.target_matchers, alert.labels):
                continue
            two_sided = matches_all(r.source_matchers, alert.labels)
            for src in idx.get(tuple(alert.labels.get(n, "") for n in r.equal), ()):
                if src.fingerprint == alert.fingerprint:
                    continue
                if two_sided and matches_all(r.target_matchers, src.labels):
                    continue
                return True
        return False


def inhibited(alert: Alert, rules: Sequence[InhibitRule], firing: Sequence[Alert]) -> bool:
    """Whether ``alert`` is inhibited by any of ``firing`` (see ``Inhibitor``)."""
    return Inhibitor(rules, firing).mutes(alert)


def silenced(alert: Alert, silences: Sequence[Silence], now: dt.datetime) -> bool:
    return any(s.mutes(alert.labels, now) for s in silences)


def _routes_by_id(route: Route) -> dict[str, Route]:
    out = {route.id: route}
    for child in route.routes:
        out.update(_routes_by_id(child))
    return out


def _labels_before(a: Mapping[str, str], b: Mapping[str, str]) -> bool:
    """Prometheus' ``LabelSet.Before``: fewer labels first, then by sorted names and values."""
    if len(a) != len(b):
        return len(a) < len(b)
    for name in sorted({*a, *b}):
        if name not in a:
            return True
        if name not in b:
            return False
        if a[name] != b[name]:
            return a[name] < b[name]
    return False


def _alert_cmp(x: Alert, y: Alert) -> int:
    """Alertmanager's ``AlertSlice`` order: by ``job``, then ``instance``, then the whole label set."""
    for key in ("job", "instance"):
        xv, yv = x.labels.get(key), y.labels.get(key)
        if xv is None and yv is None:
            continue
        if xv is None:
            return 1
        if yv is None:
            return -1
        if xv != yv:
            return -1 if xv < yv else 1
    if _labels_before(x.labels, y.labels):
        return -1
    return 1 if _labels_before(y.labels, x.labels) else 0


def _common(maps: Sequence[Mapping[str, str]]) -> dict[str, str]:
    if not maps:
        return {}
    first = dict(maps[0])
    return {k: v for k, v in first.items() if all(m.get(k) == v for m in maps[1:])}


def _needs_update(g: Group, firing: frozenset[str], resolved: frozenset[str], route: Route, now: dt.datetime) -> bool:
    """Alertmanager's ``DedupStage.needsUpdate``."""
    if g.last_notified_at is None:
        return len(firing) > 0
    if not firing <= g.last_firing:
        return True
    if not firing:
        # Everything resolved: say so once (AM does this whatever send_resolved says, to clear its log).
        return len(g.last_firing) > 0
    if route.send_resolved and not resolved <= g.last_resolved:
        return True
    return (now - g.last_notified_at).total_seconds() >= route.repeat_interval_s


def dispatch(
    config: AlertingConfig,
    alerts: Iterable[Alert],
    groups: Mapping[str, Group],
    silences: Sequence[Silence],
    now: dt.datetime,
) -> tuple[dict[str, Group], list[Notification]]:
    """One tick of the dispatcher. ``alerts`` is every alert the engine holds now (firing and recently
    resolved); returns the groups to keep and the notifications to send, in a stable order."""
    routes = _routes_by_id(config.route)
    alerts = list(alerts)
    out: dict[str, Group] = {gid: Group(**{**g.__dict__, "alerts": dict(g.alerts)}) for gid, g in groups.items()}
    seen: dict[str, set[str]] = {}
    for a in alerts:
        for route in config.route.match(a.labels):
            glabels = route.group_labels(a.labels)
            gls = labelset_string(glabels)
            gid = f"{route.id}:{gls}"
            g = out.get(gid)
            seen.setdefault(gid, set()).add(a.fingerprint)
            if a.resolved and (g is None or a.fingerprint not in g.alerts):
                continue  # resolved and already told (or never told): nothing to add
            if g is None:
                g = Group(gid, f"{route.key}:{gls}", route.id, route.receiver, glabels)
                g.next_flush_at = now + dt.timedelta(seconds=route.group_wait_s)
                out[gid] = g
            if not g.has_flushed and a.starts_at + dt.timedelta(seconds=route.group_wait_s) <= now:
                g.next_flush_at = now  # the alert already waited group_wait: flush now (AM's aggrGroup.insert)
            prev = g.alerts.get(a.fingerprint)
            # A resolved copy never goes back to firing with an older start (a late, stale evaluation).
            if prev is None or not (prev.resolved and not a.resolved and a.starts_at <= prev.starts_at):
                g.alerts[a.fingerprint] = a
    # A firing alert the engine no longer reports (rule gone, routing changed) ends now.
    for gid, g in out.items():
        for fp, a in list(g.alerts.items()):
            if not a.resolved and fp not in seen.get(gid, set()):
                g.alerts[fp] = Alert(a.fingerprint, a.labels, a.annotations, a.starts_at, now, a.generator_url)

    firing_all = [a for g in out.values() for a in g.alerts.values() if not a.resolved]
    # Dedup by fingerprint: one alert can sit in several groups (continue: true).
    inhibitor = Inhibitor(config.inhibit_rules, list({a.fingerprint: a for a in firing_all}.values()))
    notifications: list[Notification] = []
    for gid in sorted(out):
        g = out[gid]
        route = routes.get(g.route_id)
        if route is None:  # route removed by a config change: its alerts were resolved above; flush once
            route = config.route
        if g.next_flush_at is not None and now < g.next_flush_at:
            continue
        g.next_flush_at = now + dt.timedelta(seconds=route.group_interval_s)
        g.has_flushed = True
        shown: list[Alert] = []
        for a in sorted(g.alerts.values(), key=cmp_to_key(_alert_cmp)):
            if a.resolved:
                if a.fingerprint in g.last_firing or not (silenced(a, silences, now) or inhibitor.mutes(a)):
                    shown.append(a)
            elif not (silenced(a, silences, now) or inhibitor.mutes(a)):
                shown.append(a)
        firing = frozenset(a.fingerprint for a in shown if not a.resolved)
        resolved = frozenset(a.fingerprint for a in shown if a.resolved)
        if shown and _needs_update(g, firing, resolved, route, now):
            payload_alerts = [a for a in shown if not a.resolved or route.send_resolved or not firing]
            if not firing and not route.send_resolved:
                payload_alerts = []  # only clearing our log: nothing to tell a receiver that wants no resolves
            if payload_alerts:
                notifications.append(Notification(
                    group_key=g.group_key, receiver=g.receiver, status="firing" if firing else "resolved",
                    alerts=tuple(payload_alerts), group_labels=g.group_labels,
                    common_labels=_common([a.labels for a in payload_alerts]),
                    common_annotations=_common([a.annotations for a in payload_alerts]),
                    external_url=config.external_url, created_at=now,
                ))
            g.last_firing, g.last_resolved, g.last_notified_at = firing, resolved, now
        # Resolved alerts leave the group once looked at (notified, or nothing to tell).
        for fp in [fp for fp, a in g.alerts.items() if a.resolved]:
            del g.alerts[fp]
    for gid in [gid for gid, g in out.items() if not g.alerts and g.has_flushed]:
        del out[gid]
    return out, notifications

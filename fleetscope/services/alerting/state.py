"""Durable alerting: rules layered from file and API, alert and group state, silences, receivers with
encrypted secrets, and the notification outbox with at-least-once delivery.

The pure core (``engine``, ``dispatch``, ``notifiers``) decides; this module only loads and saves around
it. One evaluation is one transaction: it takes the ``alert_lock`` row (so two beats or a slow run never
evaluate at once), reads states, groups and silences, runs the core, and writes states, groups and the
outbox rows together. A crash before the commit leaves the previous state, so the next run does the same
work again; after it, the rows are there for any worker. Hence no lost alert and no duplicate on restart.

Delivery claims an outbox row with a lease (a conditional UPDATE, which works the same on SQLite and
PostgreSQL), counts the attempt, posts, and records the outcome. A worker killed mid-request leaves the
lease to expire; the next sweep delivers again with the same ``webhook-id`` (at least once).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import logging
import random
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import math

import polars as pl
from sqlalchemy import Connection, Engine, delete, func, insert, or_, select, update
from sqlalchemy.exc import IntegrityError

from fleetscope.core import frames as F
from fleetscope.services.alerting import dispatch as D
from fleetscope.services.alerting import engine as E
from fleetscope.services.alerting import notifiers as N
from fleetscope.store import alerting_schema as S
from fleetscope.services.alerting.labels import Matcher
from fleetscope.services.alerting.rules import AlertingConfig, Rule, parse_rule
from fleetscope.store import Store
from cryptography.fernet import Fernet, MultiFernet
from cryptography.fernet import InvalidToken

log = logging.getLogger(__name__)


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


# --- secrets ---------------------------------------------------------------------------------------------


class SecretBox:
    """Fernet encryption of receiver URLs and signing secrets. Several keys: the first encrypts, any
    decrypts, so the key can be rotated (``cryptography``'s MultiFernet)."""

    def __init__(self, keys: Sequence[bytes]):
        if not keys:
            raise ValueError("no secret key: set FLEETSCOPE_SECRET_KEY")
        self._f = MultiFernet([Fernet(k) for k in keys])

    def encrypt(self, text: str) -> str:
        return self._f.encrypt(text.encode()).decode()

    def decrypt(self, token: str) -> str:
        try:
            return self._f.decrypt(token.encode()).decode()
        except InvalidToken:
            raise ValueError("cannot decrypt a receiver secret: FLEETSCOPE_SECRET_KEY differs from the key it was stored with") from None


# --- rules -----------------------------------------------------------------------------------------------


def rule_overrides(engine: Engine) -> dict[str, Rule | None]:
    """The API's rule edits by name (None: deleted). A stored rule that no longer validates (e.g. a regex
    RE2 refuses, saved before matchers were RE2) is left out with an error in the log, so one bad row
    does not stop every other rule; the file's rule of that name, if any, applies."""
    with engine.connect() as conn:
        rows = conn.execute(select(S.alert_rule.c.name, S.alert_rule.c.spec_json)).all()
    out: dict[str, Rule | None] = {}
    for name, spec in rows:
        if spec is None:
            out[name] = None
            continue
        try:
            out[name] = parse_rule(json.loads(spec), source="alert_rule")
        except ValueError as exc:
            log.error("stored alert rule %r is skipped: %s (save it again through the API to fix it)", name, exc)
    return out


def effective_config(engine: Engine, base: AlertingConfig) -> AlertingConfig:
    """The rules file with the API's rule edits on top."""
    return base.with_rules(rule_overrides(engine))


def put_rule(engine: Engine, spec: Mapping[str, Any], *, by: str = "") -> Rule:
    """Create or replace a rule (validated first: ``RuleError`` names the field)."""
    rule = parse_rule(dict(spec), source="api")
    doc = json.dumps(dict(spec), sort_keys=True)
    with engine.begin() as conn:
        n = conn.execute(update(S.alert_rule).where(S.alert_rule.c.name == rule.name).values(spec_json=doc, updated_at=_now(), updated_by=by)).rowcount
        if not n:
            conn.execute(insert(S.alert_rule).values(name=rule.name, spec_json=doc, updated_at=_now(), updated_by=by))
    return rule


def delete_rule(engine: Engine, name: str, *, by: str = "") -> None:
    """Delete a rule: an API rule goes; a file rule is masked (a NULL row) so it stays deleted on restart."""
    with engine.begin() as conn:
        n = conn.execute(update(S.alert_rule).where(S.alert_rule.c.name == name).values(spec_json=None, updated_at=_now(), updated_by=by)).rowcount
        if not n:
            conn.execute(insert(S.alert_rule).values(name=name, spec_json=None, updated_at=_now(), updated_by=by))


# --- silences --------------------------------------------------------------------------------------------


def create_silence(engine: Engine, matchers: Sequence[str | Mapping[str, Any]], starts_at: dt.datetime | None, ends_at: dt.datetime,
                   created_by: str, comment: str, *, now: dt.datetime | None = None) -> D.Silence:
    now = now or _now()
    if len(created_by) > 200:
        raise ValueError("createdBy is longer than 200 characters")
    ms = tuple(Matcher.from_any(m) for m in matchers)
    if not ms:
        raise ValueError("a silence needs at least one matcher")
    if all(m.matches({}) for m in ms):
        raise ValueError("a silence must not match every alert (some matcher must require a label value)")
    starts_at = starts_at or now
    if ends_at <= starts_at:
        raise ValueError("endsAt must be after startsAt")
    sil = D.Silence(str(uuid.uuid4()), ms, starts_at, ends_at, created_by, comment)
    with engine.begin() as conn:
        conn.execute(insert(S.alert_silence).values(
            silence_id=sil.id, matchers_json=json.dumps([m.to_dict() for m in ms]), starts_at=starts_at, ends_at=ends_at,
            created_by=created_by, comment=comment, created_at=now, updated_at=now))
    return sil


def expire_silence(engine: Engine, silence_id: str, *, now: dt.datetime | None = None) -> bool:
    """End a silence now (Alertmanager's expire): kept for the record, no longer active."""
    now = now or _now()
    with engine.begin() as conn:
        row = conn.execute(select(S.alert_silence.c.starts_at, S.alert_silence.c.ends_at).where(S.alert_silence.c.silence_id == silence_id)).first()
        if row is None or row.ends_at <= now:
            return False
        conn.execute(update(S.alert_silence).where(S.alert_silence.c.silence_id == silence_id)
                     .values(ends_at=now, starts_at=min(row.starts_at, now), updated_at=now))
    return True


def _silence(row: Any) -> D.Silence | None:
    try:
        matchers = tuple(Matcher.from_any(m) for m in json.loads(row.matchers_json))
    except ValueError as exc:
        # Saved before matchers were RE2 (a backreference, a lookaround): it can no longer be judged.
        log.error("silence %s is skipped: %s (expire it and create it again)", row.silence_id, exc)
        return None
    return D.Silence(row.silence_id, matchers, row.starts_at, row.ends_at, row.created_by, row.comment)


def list_silences(conn_or_engine: Connection | Engine, *, now: dt.datetime | None = None, active_only: bool = False) -> list[D.Silence]:
    now = now or _now()
    q = select(S.alert_silence)
    if active_only:
        q = q.where(S.alert_silence.c.starts_at <= now, S.alert_silence.c.ends_at > now)
    q = q.order_by(S.alert_silence.c.ends_at.desc())
    if isinstance(conn_or_engine, Engine):
        with conn_or_engine.connect() as conn:
            rows = list(conn.execute(q))
    else:
        rows = list(conn_or_engine.execute(q))
    return [s for s in map(_silence, rows) if s is not None]


def silence_dict(s: D.Silence, now: dt.datetime | None = None) -> dict[str, Any]:
    """Alertmanager API v2's ``gettableSilence`` shape."""
    return {"id": s.id, "matchers": [m.to_dict() for m in s.matchers], "startsAt": D.go_time(s.starts_at), "endsAt": D.go_time(s.ends_at),
            "createdBy": s.created_by, "comment": s.comment, "status": {"state": s.state(now or _now())}}


# --- receivers -------------------------------------------------------------------------------------------

RECEIVER_OPTIONS = {"timeout_s", "max_alerts", "send_resolved"}


def put_receiver(engine: Engine, box: SecretBox, name: str, kind: str, url: str, *, secrets: Sequence[str] | None = None,
                 options: Mapping[str, Any] | None = None, policy: N.OutboundPolicy, resolver: N.Resolver | None = None) -> dict[str, Any]:
    """Create or replace a receiver. The URL is checked against the outbound policy now (and again at
    each delivery); URL and secrets are stored encrypted. Saving re-enables a receiver disabled by a 410.
    ``secrets=None`` keeps the stored ones; for rotation pass ``[new, old]``, later ``[new]``."""
    if kind not in N.NOTIFIERS:
        raise ValueError(f"unknown receiver kind {kind!r}: expected one of {', '.join(N.NOTIFIERS)}")
    options = dict(options or {})
    bad = set(options) - RECEIVER_OPTIONS
    if bad:
        raise ValueError(f"unknown receiver option {sorted(bad)[0]!r}: expected some of {', '.join(sorted(RECEIVER_OPTIONS))}")
    _check_options(options)
    N.check_url(url, policy, resolver)
    for s in secrets or ():
        N.secret_bytes(s)
    now = _now()
    parts = urlsplit(url)
    values: dict[str, Any] = {"kind": kind, "url_encrypted": box.encrypt(url), "url_display": f"{parts.scheme}://{parts.netloc.rsplit('@', 1)[-1]}",
                              "options_json": json.dumps(options), "disabled_at": None, "disabled_reason": None, "updated_at": now}
    if secrets is not None:
        values["secrets_encrypted"] = box.encrypt(json.dumps(list(secrets))) if secrets else None
    if kind == "standard" and secrets is not None and not secrets:
        raise ValueError("a standard (signed) webhook receiver needs a secret")
    with engine.begin() as conn:
        n = conn.execute(update(S.alert_receiver).where(S.alert_receiver.c.name == name).values(**values)).rowcount
        if not n:
            if kind == "standard" and not secrets:
                raise ValueError("a standard (signed) webhook receiver needs a secret")
            conn.execute(insert(S.alert_receiver).values(name=name, created_at=now, **{"secrets_encrypted": None, **values}))
    return receiver_info(engine, name)  # type: ignore[return-value]


MAX_RECEIVER_TIMEOUT_S = 300.0


def _check_options(options: Mapping[str, Any]) -> None:
    t = options.get("timeout_s")
    if t is not None and (isinstance(t, bool) or not isinstance(t, (int, float)) or not 0 < t <= MAX_RECEIVER_TIMEOUT_S or math.isnan(t)):
        raise ValueError(f"receiver option timeout_s: {t!r} is not a number of seconds in (0, {MAX_RECEIVER_TIMEOUT_S:g}]")
    m = options.get("max_alerts")
    if m is not None and (isinstance(m, bool) or not isinstance(m, int) or m < 0):
        raise ValueError(f"receiver option max_alerts: {m!r} is not a whole number >= 0")
    r = options.get("send_resolved")
    if r is not None and not isinstance(r, bool):
        raise ValueError(f"receiver option send_resolved: {r!r} is not true or false")


def receiver_info(engine: Engine, name: str | None = None) -> list[dict[str, Any]] | dict[str, Any] | None:
    """Receivers without their secrets (the URL shows scheme and host only)."""
    t = S.alert_receiver
    q = select(t.c.name, t.c.kind, t.c.url_display, t.c.options_json, t.c.disabled_at, t.c.disabled_reason, t.c.secrets_encrypted.is_not(None).label("has_secret"))
    if name is not None:
        q = q.where(t.c.name == name)
    with engine.connect() as conn:
        rows = [{**r._mapping, "options": json.loads(r.options_json)} for r in conn.execute(q.order_by(t.c.name))]
    for r in rows:
        r.pop("options_json")
    if name is not None:
        return rows[0] if rows else None
    return rows


def delete_receiver(engine: Engine, name: str) -> bool:
    with engine.begin() as conn:
        return conn.execute(delete(S.alert_receiver).where(S.alert_receiver.c.name == name)).rowcount > 0


def load_notifier(conn: Connection, box: SecretBox, name: str, timeout_s: float,
                  max_response_bytes: int = N.DEFAULT_MAX_BYTES) -> tuple[N.Notifier | None, str | None]:
    """The notifier of receiver ``name``, or None and why (unknown, disabled). A receiver's own
    ``timeout_s`` may shorten ``timeout_s``, never lengthen it: the outbox lease is sized by the latter."""
    row = conn.execute(select(S.alert_receiver).where(S.alert_receiver.c.name == name)).first()
    if row is None:
        return None, f"no receiver named {name!r}"
    if row.disabled_at is not None:
        return None, f"receiver {name!r} is disabled: {row.disabled_reason}"
    opts = json.loads(row.options_json or "{}")
    secrets = json.loads(box.decrypt(row.secrets_encrypted)) if row.secrets_encrypted else ()
    own = opts.get("timeout_s")
    deadline_s = timeout_s if own is None else min(float(own), timeout_s)
    return N.make_notifier(row.kind, box.decrypt(row.url_encrypted), name=name, timeout_s=deadline_s, max_response_bytes=max_response_bytes,
                           max_alerts=int(opts.get("max_alerts", 0)), send_resolved=bool(opts.get("send_resolved", True)),
                           secrets=tuple(secrets)), None


# --- evaluation ------------------------------------------------------------------------------------------


def read_input(store: Store, config: AlertingConfig, now: dt.datetime) -> E.EvalInput:
    """The slices of findings, health events and roll-up series the rules can see at ``now``."""
    rules = [r for r in config.rules if r.enabled]
    out = E.EvalInput()
    future = now + dt.timedelta(microseconds=1)
    fr = [r for r in rules if r.findings]
    if fr:
        since = now - dt.timedelta(seconds=max(r.lookback_s for r in fr))
        cols = ", ".join(f'"{c}"' for c in F.FINDING.names)
        sql = f"SELECT {cols} FROM finding WHERE window_start <= ? AND ((window_end IS NOT NULL AND window_end >= ?) OR (window_end IS NULL AND window_start >= ?))"
        params: list[Any] = [now, since, since]
        # Most findings are of kinds no rule reads (scores, info); when every selector names its kinds,
        # read only those: on a 16,384-GPU fleet this is most of a tick's time.
        sels = [sel for r in fr for sel in r.findings]
        if all(sel.kinds for sel in sels):
            kinds = sorted({k for sel in sels for k in sel.kinds})
            sql += f" AND kind IN ({', '.join('?' for _ in kinds)})"
            params += kinds
        out.finding = store.query(sql, params, F.FINDING.schema)
    hr = [r for r in rules if r.health]
    if hr:
        since = now - dt.timedelta(seconds=max(r.lookback_s for r in hr))
        sels = [sel for r in hr for sel in r.health]
        kinds = sorted({k for sel in sels for k in sel.kinds}) if all(sel.kinds for sel in sels) else None
        out.health_event = store.read("health_event", start=since, end=future).filter(pl.col("kind").is_in(kinds)) if kinds else store.read("health_event", start=since, end=future)
    mr = [r for r in rules if r.metric is not None]
    if mr:
        since = now - dt.timedelta(seconds=max(r.lookback_s for r in mr))
        names = sorted({r.metric.name for r in mr if r.metric})
        marks = ", ".join("?" for _ in names)
        out.metric_sample = store.query(
            f"SELECT m.ts, s.series, m.value FROM metric_sample m JOIN series s ON s.series_id = m.series_id WHERE s.name IN ({marks}) AND m.ts >= ? AND m.ts <= ?",
            [*names, since, now], F.METRIC_SAMPLE.schema)
    gpus = store.query("SELECT gpu_uuid, host FROM gpu WHERE host IS NOT NULL", [], {"gpu_uuid": pl.String, "host": pl.String})
    out.gpu_host = dict(gpus.iter_rows()) if gpus.height else {}
    return out


def _lock(conn: Connection, holder: str, now: dt.datetime) -> None:
    """Serialise evaluations: the UPDATE takes SQLite's write lock or the row's lock on PostgreSQL, held
    until this transaction ends."""
    n = conn.execute(update(S.alert_lock).where(S.alert_lock.c.name == "evaluate").values(holder=holder, at=now)).rowcount
    if not n:
        try:
            with conn.begin_nested():
                conn.execute(insert(S.alert_lock).values(name="evaluate", holder=holder, at=now))
        except IntegrityError:
            conn.execute(update(S.alert_lock).where(S.alert_lock.c.name == "evaluate").values(holder=holder, at=now))


def _load_states(conn: Connection) -> dict[str, E.AlertState]:
    out = {}
    for r in conn.execute(select(S.alert_state)):
        out[r.fingerprint] = E.AlertState(r.rule, r.fingerprint, json.loads(r.labels_json), json.loads(r.annotations_json), r.state,
                                          r.active_at, r.last_active_at, r.fired_at, r.resolved_at, r.value)
    return out


def _state_row(s: E.AlertState) -> dict[str, Any]:
    return {"fingerprint": s.fingerprint, "rule": s.rule, "state": s.state, "labels_json": json.dumps(s.labels, sort_keys=True),
            "annotations_json": json.dumps(s.annotations, sort_keys=True), "active_at": s.active_at, "last_active_at": s.last_active_at,
            "fired_at": s.fired_at, "resolved_at": s.resolved_at, "value": s.value}


def _save_states(conn: Connection, old: Mapping[str, E.AlertState], new: Mapping[str, E.AlertState]) -> None:
    gone = [fp for fp in old if fp not in new]
    if gone:
        conn.execute(delete(S.alert_state).where(S.alert_state.c.fingerprint.in_(gone)))
    changed = [s for fp, s in new.items() if old.get(fp) != s]
    upd = [s for s in changed if s.fingerprint in old]
    if upd:
        conn.execute(delete(S.alert_state).where(S.alert_state.c.fingerprint.in_([s.fingerprint for s in upd])))
    if changed:
        conn.execute(insert(S.alert_state), [_state_row(s) for s in changed])


def _group_hash(gid: str) -> str:
    return hashlib.sha256(gid.encode()).hexdigest()


def _load_groups(conn: Connection) -> dict[str, D.Group]:
    groups = [D.Group.from_dict(json.loads(r.state_json)) for r in conn.execute(select(S.alert_group.c.state_json))]
    return {g.id: g for g in groups}


def _save_groups(conn: Connection, old: Mapping[str, D.Group], new: Mapping[str, D.Group]) -> None:
    gone = [_group_hash(gid) for gid in old if gid not in new]
    if gone:
        conn.execute(delete(S.alert_group).where(S.alert_group.c.group_hash.in_(gone)))
    rows = []
    for gid, g in new.items():
        doc = json.dumps(g.to_dict(), sort_keys=True)
        if gid in old and json.dumps(old[gid].to_dict(), sort_keys=True) == doc:
            continue
        rows.append({"group_hash": _group_hash(gid), "group_key": g.group_key, "receiver": g.receiver, "next_flush_at": g.next_flush_at, "state_json": doc})
    if rows:
        conn.execute(delete(S.alert_group).where(S.alert_group.c.group_hash.in_([r["group_hash"] for r in rows])))
        conn.execute(insert(S.alert_group), rows)


def new_webhook_id() -> str:
    """``msg_`` + a random id: Standard Webhooks' recommended form of a message id."""
    return "msg_" + uuid.uuid4().hex


@dataclass
class EvalResult:
    states: dict[str, E.AlertState]
    notifications: list[int]
    firing: int
    pending: int
    eval_s: float


def evaluate_and_dispatch(store: Store, config: AlertingConfig, *, now: dt.datetime | None = None, data: E.EvalInput | None = None,
                          holder: str = "") -> EvalResult:
    """One durable tick: evaluate the rules, flush due groups, write the outbox. Returns the new
    notifications' ids (for immediate delivery; the sweep delivers them anyway)."""
    now = now or _now()
    t0 = time.perf_counter()
    data = data if data is not None else read_input(store, config, now)
    ids: list[int] = []
    with store.engine.begin() as conn:
        _lock(conn, holder or "fleetscope", now)
        old_states = _load_states(conn)
        states = E.evaluate(config, data, old_states, now)
        old_groups = _load_groups(conn)
        silences = list_silences(conn, now=now, active_only=True)
        groups, notes = D.dispatch(config, D.alerts_from_states(states.values(), config.external_url), old_groups, silences, now)
        _save_states(conn, old_states, states)
        _save_groups(conn, old_groups, groups)
        receivers = {r.name: r for r in conn.execute(select(S.alert_receiver.c.name, S.alert_receiver.c.disabled_at, S.alert_receiver.c.disabled_reason))}
        for n in notes:
            rec = receivers.get(n.receiver)
            status, error = "pending", None
            if rec is None:
                status, error = "dead", f"no receiver named {n.receiver!r}"
            elif rec.disabled_at is not None:
                status, error = "disabled", f"receiver disabled: {rec.disabled_reason}"
            res = conn.execute(insert(S.alert_notification).values(
                webhook_id=new_webhook_id(), receiver=n.receiver, group_key=n.group_key, status=status,
                payload_json=json.dumps(n.data()), created_at=now, next_attempt_at=now if status == "pending" else None,
                attempts=0, last_error=error))
            if status == "pending":
                ids.append(int(res.inserted_primary_key[0]))
    firing = sum(1 for s in states.values() if s.state == E.FIRING)
    pending = sum(1 for s in states.values() if s.state == E.PENDING)
    return EvalResult(states, ids, firing, pending, time.perf_counter() - t0)


# --- delivery --------------------------------------------------------------------------------------------


def _redacted(error: N.DeliveryError, url: str) -> N.DeliveryError:
    """``error`` with ``url`` and any other URL in its message redacted: the message is stored in
    ``last_error`` and the attempt log, which read-scope tokens see, and logged."""
    message = N.redact_text(error.message, (url,))
    if message == error.message:
        return error
    return N.DeliveryError(message, retryable=error.retryable, status_code=error.status_code, retry_after_s=error.retry_after_s,
                           disable=error.disable, limit=error.limit)


@dataclass
class Deliverer:
    """Delivers outbox rows: claims with a lease, posts through the receiver's notifier, records."""

    store: Store
    box: SecretBox
    policy: N.OutboundPolicy
    retry: N.RetryPolicy
    timeout_s: float = 10.0
    resolver: N.Resolver | None = None
    rng: random.Random | None = None
    max_response_bytes: int = N.DEFAULT_MAX_BYTES

    @property
    def lease_s(self) -> float:
        # an attempt ends by its deadline (timeout_s), so the lease outlives it with room to record
        return 2 * self.timeout_s + 5

    def claim(self, notification_id: int, now: dt.datetime) -> Any | None:
        t = S.alert_notification
        with self.store.engine.begin() as conn:
            n = conn.execute(update(t).where(
                t.c.notification_id == notification_id, t.c.status == "pending", t.c.next_attempt_at <= now,
                or_(t.c.lease_until.is_(None), t.c.lease_until < now),
            ).values(lease_until=now + dt.timedelta(seconds=self.lease_s), attempts=t.c.attempts + 1)).rowcount
            if not n:
                return None
            return conn.execute(select(t).where(t.c.notification_id == notification_id)).first()

    def deliver(self, notification_id: int, client: N.OutboundClient | None = None, *, now: dt.datetime | None = None) -> str | None:
        """One attempt at one notification if it is due and nobody holds it; returns the new status, or
        None when there was nothing to do."""
        now = now or _now()
        row = self.claim(notification_id, now)
        if row is None:
            return None
        with self.store.engine.connect() as conn:
            notifier, why_not = load_notifier(conn, self.box, row.receiver, self.timeout_s, self.max_response_bytes)
        started = time.perf_counter()
        error: N.DeliveryError | None = None
        code: int | None = None
        if notifier is None:
            error = N.DeliveryError(why_not or "no receiver", retryable=False, disable="disabled" in (why_not or ""))
        else:
            msg = N.Message(row.webhook_id, json.loads(row.payload_json), row.created_at)
            own = client is None
            http = client or N.OutboundClient()
            try:
                code = notifier.send(msg, http, self.policy, now=now, resolver=self.resolver)
            except N.DeliveryError as exc:
                error, code = exc, exc.status_code
            except Exception as exc:  # noqa: BLE001 - a bug in a notifier must not lose the notification
                # no traceback: an exception's text can quote the receiver's URL, credentials and all
                where = exc.__traceback__
                while where is not None and where.tb_next is not None:
                    where = where.tb_next
                at = f" at {where.tb_frame.f_code.co_filename}:{where.tb_lineno}" if where is not None else ""
                error = N.DeliveryError(f"{type(exc).__name__}{at}: {exc}", retryable=True)
                log.error("notifier %s failed: %s", row.receiver, N.redact_text(error.message, (notifier.url,)))
            finally:
                if own:
                    http.close()
            if error is not None:
                error = _redacted(error, notifier.url)
        decision = N.decide(error, row.attempts, row.created_at, now, self.retry, self.rng)
        self._record(row, decision, code, error, time.perf_counter() - started, now)
        return decision.status

    def _record(self, row: Any, decision: N.Decision, code: int | None, error: N.DeliveryError | None, duration: float, now: dt.datetime) -> None:
        t = S.alert_notification
        values: dict[str, Any] = {"status": decision.status, "lease_until": None, "last_status_code": code,
                                  "last_error": None if error is None else (decision.reason or error.message)[:2000]}
        if decision.status == "delivered":
            values.update(delivered_at=_now(), next_attempt_at=None)
        elif decision.status == "pending":
            values["next_attempt_at"] = decision.next_attempt_at
        else:
            values["next_attempt_at"] = None
        with self.store.engine.begin() as conn:
            conn.execute(update(t).where(t.c.notification_id == row.notification_id).values(**values))
            conn.execute(insert(S.alert_delivery_attempt).values(
                notification_id=row.notification_id, attempt=row.attempts, at=now, duration_s=duration, status_code=code,
                outcome="retry" if decision.status == "pending" else decision.status, error=None if error is None else error.message[:2000]))
            if decision.status == "disabled":
                # 410 Gone: the endpoint is gone for good. Stop sending to it until an admin saves it again.
                r = S.alert_receiver
                conn.execute(update(r).where(r.c.name == row.receiver, r.c.disabled_at.is_(None)).values(disabled_at=now, disabled_reason=(error.message if error else "")[:500]))
                conn.execute(update(t).where(t.c.receiver == row.receiver, t.c.status == "pending")
                             .values(status="disabled", next_attempt_at=None, last_error="receiver disabled after HTTP 410"))
        level = logging.INFO if decision.status in ("delivered", "pending") else logging.WARNING
        log.log(level, "notification %s (%s) to %s attempt %d: %s%s", row.notification_id, row.webhook_id, row.receiver, row.attempts,
                decision.status, f" ({decision.reason})" if decision.reason else "")

    def due(self, now: dt.datetime, limit: int = 100) -> list[int]:
        """Pending rows due now and not held, oldest first; within one receiver and group only the oldest,
        so a group's notifications arrive in order."""
        t = S.alert_notification
        older = t.alias("older")
        blocked = select(older.c.notification_id).where(
            older.c.receiver == t.c.receiver, older.c.group_key == t.c.group_key, older.c.status == "pending",
            older.c.notification_id < t.c.notification_id).exists()
        q = (select(t.c.notification_id).where(t.c.status == "pending", t.c.next_attempt_at <= now,
                                               or_(t.c.lease_until.is_(None), t.c.lease_until < now), ~blocked)
             .order_by(t.c.next_attempt_at, t.c.notification_id).limit(limit))
        with self.store.engine.connect() as conn:
            return [r[0] for r in conn.execute(q)]

    def deliver_due(self, *, now: dt.datetime | None = None, limit: int = 100) -> dict[str, int]:
        out: dict[str, int] = {}
        with N.OutboundClient() as client:
            for nid in self.due(now or _now(), limit):
                status = self.deliver(nid, client, now=now)
                if status:
                    out[status] = out.get(status, 0) + 1
        return out


def requeue(engine: Engine, notification_id: int, *, now: dt.datetime | None = None) -> bool:
    """Send a dead or disabled notification again (after fixing the receiver), with the same webhook-id."""
    now = now or _now()
    t = S.alert_notification
    with engine.begin() as conn:
        return conn.execute(update(t).where(t.c.notification_id == notification_id, t.c.status.in_(("dead", "disabled")))
                            .values(status="pending", next_attempt_at=now, lease_until=None, created_at=now)).rowcount > 0


def list_notifications(engine: Engine, *, status: str | None = None, limit: int = 100) -> list[dict[str, Any]]:
    t = S.alert_notification
    q = select(t.c.notification_id, t.c.webhook_id, t.c.receiver, t.c.group_key, t.c.status, t.c.created_at, t.c.next_attempt_at,
               t.c.attempts, t.c.delivered_at, t.c.last_status_code, t.c.last_error)
    if status:
        q = q.where(t.c.status == status)
    with engine.connect() as conn:
        rows = [dict(r._mapping) for r in conn.execute(q.order_by(t.c.notification_id.desc()).limit(limit))]
    for r in rows:
        if r["last_error"]:
            r["last_error"] = N.redact_text(r["last_error"])
    return rows


def list_attempts(engine: Engine, notification_id: int) -> list[dict[str, Any]]:
    a = S.alert_delivery_attempt
    with engine.connect() as conn:
        rows = [dict(r._mapping) for r in conn.execute(select(a).where(a.c.notification_id == notification_id).order_by(a.c.attempt))]
    for r in rows:
        if r["error"]:
            r["error"] = N.redact_text(r["error"])
    return rows


def list_alerts(engine: Engine, config: AlertingConfig | None = None, *, now: dt.datetime | None = None, include_resolved: bool = False) -> list[dict[str, Any]]:
    """Alerts the rules hold, with whether a silence or an inhibition mutes each (the API's read)."""
    now = now or _now()
    with engine.connect() as conn:
        states = list(_load_states(conn).values())
        silences = list_silences(conn, now=now, active_only=True)
    inhibitor = D.Inhibitor(config.inhibit_rules if config else (), D.alerts_from_states([s for s in states if s.state == E.FIRING]))
    out = []
    for s in sorted(states, key=lambda x: (x.rule, x.fingerprint)):
        if s.state == E.INACTIVE and not include_resolved:
            continue
        a = D.Alert(s.fingerprint, s.labels, s.annotations, s.fired_at or s.active_at)
        silenced_by = [x.id for x in silences if x.mutes(s.labels, now)]
        out.append({**s.to_dict(), "silenced_by": silenced_by, "inhibited": inhibitor.mutes(a)})
    return out


def counts(engine: Engine) -> dict[str, int]:
    t = S.alert_notification
    with engine.connect() as conn:
        return {status: n for status, n in conn.execute(select(t.c.status, func.count()).group_by(t.c.status))}


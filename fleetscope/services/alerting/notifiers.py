"""Notifiers: one small class per channel over a shared base, and the delivery policy.

A notifier turns one notification (Alertmanager's ``template.Data``, as built by ``dispatch``) into one
HTTP request and either returns or raises ``DeliveryError``, which says whether trying again can help
(the way healthchecks.io's transports do). What to do next is the pure ``decide``: retry with
exponential backoff and jitter, honour ``429`` + ``Retry-After``, disable the endpoint on ``410``, give
up at once on other 4xx (but 408 and 429), and dead-letter after ``dead_after_s``.

Channels:
- ``WebhookNotifier``: Alertmanager's webhook, payload version 4 (Alertmanager docs, "<webhook_config>"),
  so any receiver written for Alertmanager works;
- ``AlertmanagerNotifier``: pushes the alerts to a real Alertmanager's ``POST /api/v2/alerts``
  (Alertmanager's OpenAPI spec, ``postableAlerts``);
- ``SlackNotifier``: a Slack incoming webhook with ``text`` and Block Kit ``blocks``;
- ``StandardWebhookNotifier``: the Standard Webhooks spec: ``webhook-id``, ``webhook-timestamp`` and
  ``webhook-signature: v1,<base64 HMAC-SHA256 of "id.timestamp.body">`` keyed by the ``whsec_`` secret;
  during a rotation both secrets sign, space-separated, so receivers switch keys without downtime.

Every request carries ``webhook-id``: the same for every retry of one notification, it is the receiver's
idempotency key (delivery is at least once). Where a request may go, how long it may take and how much
of the answer is read are ``fleetscope.services.alerting.outbound``'s.
"""

from __future__ import annotations

import base64
import datetime as dt
import email.utils
import hashlib
import hmac
import json
import random
import secrets as secrets_mod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from fleetscope import __version__
from fleetscope.services.alerting.outbound import (  # noqa: F401 - re-exported: the notifiers' error type and policy
    DEFAULT_MAX_BYTES,
    SNIPPET_CHARS,
    Answer,
    Deadline,
    DeliveryError,
    OutboundClient,
    OutboundPolicy,
    Resolver,
    UnsafeURL,
    address_refusal,
    check_url,
    classify,
    redact_text,
    redact_url,
    with_limit_note,
)

USER_AGENT = f"Fleetscope/{__version__}"


# --- Standard Webhooks signatures ------------------------------------------------------------------------


def generate_secret() -> str:
    """A new ``whsec_`` secret: 24 random bytes, base64 (the Standard Webhooks recommendation is 24-64)."""
    return "whsec_" + base64.b64encode(secrets_mod.token_bytes(24)).decode()


def secret_bytes(secret: str) -> bytes:
    raw = secret[len("whsec_"):] if secret.startswith("whsec_") else secret
    try:
        key = base64.b64decode(raw, validate=True)
    except ValueError:
        raise ValueError("a Standard Webhooks secret is 'whsec_' followed by base64") from None
    if not 24 <= len(key) <= 64:
        raise ValueError(f"a Standard Webhooks secret carries 24 to 64 bytes, this one {len(key)}")
    return key


def sign(secret: str, msg_id: str, timestamp: int, body: bytes) -> str:
    """``v1,<base64 HMAC-SHA256(key, "{id}.{timestamp}.{body}")>`` (Standard Webhooks, "Signature scheme")."""
    mac = hmac.new(secret_bytes(secret), f"{msg_id}.{timestamp}.".encode() + body, hashlib.sha256).digest()
    return "v1," + base64.b64encode(mac).decode()


# --- the message and the base class ---------------------------------------------------------------------


@dataclass(frozen=True)
class Message:
    """One notification to deliver: its idempotency key and Alertmanager's ``template.Data``."""

    webhook_id: str
    data: Mapping[str, Any]
    created_at: dt.datetime


@dataclass
class Notifier:
    """Shared base: builds a request, posts it without following redirects, judges the answer."""

    url: str
    name: str = ""
    timeout_s: float = 10.0  # the whole attempt's deadline
    max_response_bytes: int = DEFAULT_MAX_BYTES
    max_alerts: int = 0  # 0: all
    send_resolved: bool = True
    secrets: Sequence[str] = field(default_factory=tuple)
    kind: ClassVar[str] = ""

    def target(self) -> str:
        return self.url

    def body(self, msg: Message) -> Any:
        raise NotImplementedError

    def headers(self, msg: Message, body: bytes, now: dt.datetime) -> dict[str, str]:
        return {"content-type": "application/json", "user-agent": USER_AGENT, "webhook-id": msg.webhook_id}

    def render(self, msg: Message, now: dt.datetime) -> tuple[str, bytes, dict[str, str]]:
        body = json.dumps(self.body(msg), separators=(",", ":"), ensure_ascii=False).encode()
        return self.target(), body, self.headers(msg, body, now)

    def send(self, msg: Message, client: OutboundClient, policy: OutboundPolicy, *, now: dt.datetime | None = None,
             resolver: Resolver | None = None) -> int:
        """Deliver ``msg``; return the HTTP status (2xx) or raise ``DeliveryError``. One deadline of
        ``timeout_s`` covers resolving, connecting, sending and the answer; at most
        ``max_response_bytes`` of a refusing answer are read."""
        now = now or dt.datetime.now(dt.UTC)
        deadline = Deadline(self.timeout_s)
        url, body, headers = self.render(msg, now)
        addrs = check_url(url, policy, resolver, deadline=deadline)
        answer = client.post(url, addrs, body, headers, deadline=deadline, max_bytes=self.max_response_bytes)
        try:
            self.check_response(answer, now)
        except DeliveryError as err:
            raise with_limit_note(err, answer, self.max_response_bytes, self.timeout_s) from None
        return answer.status

    def check_response(self, answer: Answer, now: dt.datetime) -> None:
        raise_for_status(answer.status, answer.headers.get("retry-after"), answer.text(), now)

    def truncated(self, data: Mapping[str, Any]) -> tuple[list[dict[str, Any]], int]:
        alerts = list(data["alerts"])
        if not self.send_resolved:
            alerts = [a for a in alerts if a["status"] == "firing"]
        if self.max_alerts and len(alerts) > self.max_alerts:
            return alerts[: self.max_alerts], len(alerts) - self.max_alerts
        return alerts, 0


def parse_retry_after(value: str | None, now: dt.datetime) -> float | None:
    """``Retry-After`` as seconds: delta-seconds or an HTTP-date (RFC 9110, 10.2.3)."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    return max(0.0, (when - now).total_seconds())


def raise_for_status(status: int, retry_after: str | None, text: str, now: dt.datetime) -> None:
    """Judge an HTTP answer: 2xx delivered; 408, 429 and 5xx worth retrying (429 and 503 with the wait
    the receiver asked for); 410 gone for good (disable the endpoint); every other status permanent
    (redirects included: following one would skip the outbound address check)."""
    if 200 <= status < 300:
        return
    snippet = " ".join(text.split())[:SNIPPET_CHARS]
    msg = f"HTTP {status}" + (f": {snippet}" if snippet else "")
    if status == 410:
        raise DeliveryError(msg, retryable=False, status_code=status, disable=True)
    if status in (408, 429) or status >= 500:
        raise DeliveryError(msg, retryable=True, status_code=status, retry_after_s=parse_retry_after(retry_after, now))
    raise DeliveryError(msg, retryable=False, status_code=status)


# --- channels ---------------------------------------------------------------------------------------------


@dataclass
class WebhookNotifier(Notifier):
    """Alertmanager's webhook, payload version 4, field for field."""

    kind: ClassVar[str] = "webhook"

    def body(self, msg: Message) -> dict[str, Any]:
        d = msg.data
        alerts, truncated = self.truncated(d)
        return {
            "version": "4",
            "groupKey": d["groupKey"],
            "truncatedAlerts": truncated,
            "status": d["status"],
            "receiver": d["receiver"],
            "groupLabels": d["groupLabels"],
            "commonLabels": d["commonLabels"],
            "commonAnnotations": d["commonAnnotations"],
            "externalURL": d["externalURL"],
            "alerts": alerts,
        }


@dataclass
class AlertmanagerNotifier(Notifier):
    """Pushes alerts into a real Alertmanager (``POST /api/v2/alerts``) which then routes them itself.

    Firing alerts go without ``endsAt``: Alertmanager then resolves them after its ``resolve_timeout``
    unless they are sent again, so a route to it should repeat more often than that (e.g. 1m)."""

    kind: ClassVar[str] = "alertmanager"

    def target(self) -> str:
        return self.url.rstrip("/") + "/api/v2/alerts"

    def body(self, msg: Message) -> list[dict[str, Any]]:
        out = []
        for a in msg.data["alerts"]:
            item = {"labels": a["labels"], "annotations": a["annotations"], "startsAt": a["startsAt"], "generatorURL": a["generatorURL"]}
            if a["status"] == "resolved":
                item["endsAt"] = a["endsAt"]
            out.append(item)
        return out


def _slack_escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


@dataclass
class SlackNotifier(Notifier):
    """A Slack incoming webhook: ``text`` (notifications and clients without blocks) plus ``blocks``."""

    kind: ClassVar[str] = "slack"
    max_blocks_alerts: ClassVar[int] = 10  # Slack allows 50 blocks; ten alerts stay readable

    def headers(self, msg: Message, body: bytes, now: dt.datetime) -> dict[str, str]:
        return {"content-type": "application/json", "user-agent": USER_AGENT}

    def body(self, msg: Message) -> dict[str, Any]:
        d = msg.data
        alerts, _ = self.truncated(d)
        firing = sum(1 for a in alerts if a["status"] == "firing")
        name = d["groupLabels"].get("alertname") or d["commonLabels"].get("alertname", "alerts")
        rest = ", ".join(f"{k}={v}" for k, v in d["groupLabels"].items() if k != "alertname")
        status = f"FIRING:{firing}" if d["status"] == "firing" else "RESOLVED"
        title = f"[{status}] {name}" + (f" ({rest})" if rest else "")
        blocks: list[dict[str, Any]] = [{"type": "header", "text": {"type": "plain_text", "text": title[:150]}}]
        for a in alerts[: self.max_blocks_alerts]:
            ann = a["annotations"]
            icon = ":red_circle:" if a["status"] == "firing" else ":large_green_circle:"
            lines = [f"{icon} *{_slack_escape(ann.get('summary') or a['labels'].get('alertname', ''))}*"]
            if ann.get("description"):
                lines.append(_slack_escape(ann["description"]))
            if ann.get("runbook_url"):
                lines.append(f"<{ann['runbook_url']}|Runbook>")
            lines.append("`" + ", ".join(f"{k}={v}" for k, v in a["labels"].items() if k not in ("alertname",)) + "`")
            blocks.append({"type": "section", "text": {"type": "mrkdwn", "text": "\n".join(lines)[:3000]}})
        if len(alerts) > self.max_blocks_alerts:
            blocks.append({"type": "context", "elements": [{"type": "mrkdwn", "text": f"and {len(alerts) - self.max_blocks_alerts} more"}]})
        if d.get("externalURL"):
            blocks.append({"type": "context", "elements": [{"type": "mrkdwn", "text": f"<{d['externalURL']}|Fleetscope>"}]})
        return {"text": title, "blocks": blocks}


@dataclass
class StandardWebhookNotifier(Notifier):
    """A generic webhook signed per the Standard Webhooks spec. Body: ``{"type", "timestamp", "data"}``
    with the version 4 payload as ``data``. Every secret in ``secrets`` signs (rotation)."""

    kind: ClassVar[str] = "standard"

    def body(self, msg: Message) -> dict[str, Any]:
        inner = WebhookNotifier(self.url, max_alerts=self.max_alerts, send_resolved=self.send_resolved).body(msg)
        return {"type": f"alert.{msg.data['status']}", "timestamp": msg.created_at.astimezone(dt.UTC).isoformat().replace("+00:00", "Z"), "data": inner}

    def headers(self, msg: Message, body: bytes, now: dt.datetime) -> dict[str, str]:
        if not self.secrets:
            raise DeliveryError("a signed webhook needs at least one secret", retryable=False)
        ts = int(now.timestamp())
        sigs = " ".join(sign(s, msg.webhook_id, ts, body) for s in self.secrets)
        return {**super().headers(msg, body, now), "webhook-timestamp": str(ts), "webhook-signature": sigs}


NOTIFIERS: dict[str, type[Notifier]] = {c.kind: c for c in (WebhookNotifier, AlertmanagerNotifier, SlackNotifier, StandardWebhookNotifier)}


def make_notifier(kind: str, url: str, **kw: Any) -> Notifier:
    if kind not in NOTIFIERS:
        raise ValueError(f"unknown receiver kind {kind!r}: expected one of {', '.join(NOTIFIERS)}")
    return NOTIFIERS[kind](url=url, **kw)


# --- delivery policy ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RetryPolicy:
    base_s: float = 1.0
    cap_s: float = 300.0
    dead_after_s: float = 86400.0
    max_retry_after_s: float = 3600.0  # a Retry-After beyond this is clamped, not obeyed for days


def backoff_s(attempt: int, policy: RetryPolicy, rng: random.Random | None = None) -> float:
    """Exponential backoff with "equal jitter": half the doubling delay fixed, half random, so retries of
    many notifications to one recovering receiver spread out instead of arriving together."""
    ceiling = min(policy.cap_s, policy.base_s * (2 ** max(0, attempt - 1)))
    r = (rng or random).random()
    return ceiling / 2 + r * ceiling / 2


@dataclass(frozen=True)
class Decision:
    status: str  # delivered, pending (retry at next_attempt_at), dead, disabled
    next_attempt_at: dt.datetime | None
    reason: str = ""


def decide(error: DeliveryError | None, attempt: int, created_at: dt.datetime, now: dt.datetime, policy: RetryPolicy,
           rng: random.Random | None = None) -> Decision:
    """What to do after attempt number ``attempt`` (1-based) of a notification created at ``created_at``."""
    if error is None:
        return Decision("delivered", None)
    if error.disable:
        return Decision("disabled", None, f"endpoint gone ({error.message}): receiver disabled")
    if not error.retryable:
        return Decision("dead", None, f"permanent failure: {error.message}")
    wait = backoff_s(attempt, policy, rng)
    if error.retry_after_s is not None:
        wait = min(max(error.retry_after_s, 0.0), policy.max_retry_after_s)
    when = now + dt.timedelta(seconds=wait)
    if (when - created_at).total_seconds() > policy.dead_after_s:
        return Decision("dead", None, f"gave up after {attempt} attempts over {(now - created_at).total_seconds():.0f} s: {error.message}")
    return Decision("pending", when, error.message)

"""Notifiers: one small class per channel over a shared base, the delivery policy, outbound safety.

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
idempotency key (delivery is at least once).
"""

from __future__ import annotations

import base64
import datetime as dt
import email.utils
import hashlib
import hmac
import ipaddress
import json
import random
import secrets as secrets_mod
import socket
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar
from urllib.parse import urlsplit

import httpx

from fleetscope import __version__

USER_AGENT = f"Fleetscope/{__version__}"


class DeliveryError(Exception):
    """A failed delivery. ``retryable``: whether trying again later can succeed; ``disable``: the endpoint
    said it is gone for good (410); ``retry_after_s``: the receiver asked us to wait this long."""

    def __init__(self, message: str, *, retryable: bool, status_code: int | None = None, retry_after_s: float | None = None, disable: bool = False):
        super().__init__(message)
        self.message = message
        self.retryable = retryable
        self.status_code = status_code
        self.retry_after_s = retry_after_s
        self.disable = disable


class UnsafeURL(DeliveryError):
    """A URL the outbound policy refuses (metadata, link-local, private or loopback address)."""

    def __init__(self, message: str):
        super().__init__(message, retryable=False)


# --- outbound safety ---------------------------------------------------------------------------------

# Refused whatever the settings say: cloud metadata services and link-local addresses (where they live),
# and addresses that are not a real destination.
_ALWAYS_BLOCKED = [ipaddress.ip_network(n) for n in (
    "169.254.0.0/16", "fe80::/10", "100.100.100.200/32", "fd00:ec2::254/128",
    "0.0.0.0/8", "::/128", "224.0.0.0/4", "ff00::/8", "240.0.0.0/4",
)]
_LOOPBACK = [ipaddress.ip_network(n) for n in ("127.0.0.0/8", "::1/128")]
_PRIVATE = [ipaddress.ip_network(n) for n in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10", "fc00::/7")]


@dataclass(frozen=True)
class OutboundPolicy:
    """Where webhooks may go. Loopback and private addresses are refused unless allowed: a webhook URL is
    user input, and without this it reaches the cloud metadata service or internal admin ports (SSRF)."""

    allow_loopback: bool = False
    allow_private: bool = False


Resolver = Callable[[str, int], Sequence[str]]


def _system_resolver(host: str, port: int) -> list[str]:
    # getaddrinfo's order is the system's preference (RFC 6724): keep it, as a connection would try them
    return list(dict.fromkeys(info[4][0] for info in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)))


def address_refusal(ip: str, policy: OutboundPolicy) -> str | None:
    """Why ``ip`` may not be contacted, or None. IPv4-mapped IPv6 addresses are judged as their IPv4."""
    addr = ipaddress.ip_address(ip.split("%", 1)[0])
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped
    if any(addr in n for n in _ALWAYS_BLOCKED):
        return f"{addr} is a link-local, metadata or reserved address"
    if any(addr in n for n in _LOOPBACK):
        return None if policy.allow_loopback else f"{addr} is a loopback address (FLEETSCOPE_ALERT_ALLOW_LOOPBACK=1 allows it)"
    if any(addr in n for n in _PRIVATE):
        return None if policy.allow_private else f"{addr} is a private address (FLEETSCOPE_ALERT_ALLOW_PRIVATE=1 allows it)"
    return None


def check_url(url: str, policy: OutboundPolicy, resolver: Resolver | None = None) -> list[str]:
    """Refuse (``UnsafeURL``) a URL that is not http(s) or whose host resolves to any refused address;
    return the addresses. Checked when a receiver is saved and again before every request, since DNS
    answers change."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UnsafeURL(f"{url!r}: only http and https URLs with a host are allowed")
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        addrs = list((resolver or _system_resolver)(parts.hostname, port))
    except (OSError, UnicodeError) as exc:
        raise DeliveryError(f"cannot resolve {parts.hostname!r}: {exc}", retryable=True) from None
    if not addrs:
        raise DeliveryError(f"{parts.hostname!r} resolves to no address", retryable=True)
    for ip in addrs:
        why = address_refusal(ip, policy)
        if why:
            raise UnsafeURL(f"refusing {url}: {parts.hostname} resolves to {why}")
    return addrs


def pinned(url: str, addr: str) -> tuple[str, dict[str, str], dict[str, Any]]:
    """``url`` with its host replaced by ``addr``, an address :func:`check_url` approved, plus the ``Host``
    header and TLS server name that keep the request addressed to the original host. Connecting to the
    checked address closes the gap a second DNS lookup would leave between the check and the connection
    (DNS rebinding: the name answers with a public address for the check, then with an internal one).
    The certificate is still verified against the host name (httpcore's ``sni_hostname`` extension); an
    internationalised name goes as its IDNA form, and credentials in the URL stay on it (httpx sends them
    as Basic auth)."""
    u = httpx.URL(url)
    host = u.raw_host.decode("ascii")  # IDNA ("xn--...") where the name is not ASCII
    ip = ipaddress.ip_address(addr.split("%", 1)[0])
    explicit_port = urlsplit(url).port
    host_header = (f"[{host}]" if ":" in host else host) + (f":{explicit_port}" if explicit_port is not None else "")
    extensions = {"sni_hostname": host} if u.scheme == "https" else {}
    return str(u.copy_with(host=str(ip))), {"host": host_header}, extensions


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
    timeout_s: float = 10.0
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

    def send(self, msg: Message, client: httpx.Client, policy: OutboundPolicy, *, now: dt.datetime | None = None,
             resolver: Resolver | None = None) -> int:
        """Deliver ``msg``; return the HTTP status (2xx) or raise ``DeliveryError``."""
        now = now or dt.datetime.now(dt.UTC)
        url, body, headers = self.render(msg, now)
        addrs = check_url(url, policy, resolver)
        try:
            resp = self._post_pinned(client, url, addrs, body, headers)
        except httpx.TimeoutException as exc:
            raise DeliveryError(f"timed out after {self.timeout_s:g} s: {type(exc).__name__}", retryable=True) from None
        except httpx.HTTPError as exc:
            raise DeliveryError(f"{type(exc).__name__}: {exc}", retryable=True) from None
        self.check_response(resp, now)
        return resp.status_code

    def _post_pinned(self, client: httpx.Client, url: str, addrs: Sequence[str], body: bytes, headers: dict[str, str]) -> httpx.Response:
        """POST to the checked addresses in turn (as a connection to the name would try each), never to a
        fresh DNS answer."""
        for i, addr in enumerate(addrs):
            target, host, extensions = pinned(url, addr)
            # the Host header is the checked URL's, whatever a receiver's configured headers say
            sent = {**{k: v for k, v in headers.items() if k.lower() != "host"}, **host}
            try:
                return client.post(target, content=body, headers=sent, timeout=self.timeout_s, follow_redirects=False,
                                   extensions=extensions)
            except httpx.ConnectError:
                if i == len(addrs) - 1:
                    raise
        raise AssertionError("check_url returns at least one address")

    def check_response(self, resp: httpx.Response, now: dt.datetime) -> None:
        raise_for_status(resp.status_code, resp.headers.get("retry-after"), resp.text[:300], now)

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
    snippet = " ".join(text.split())[:200]
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

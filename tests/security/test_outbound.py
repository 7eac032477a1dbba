"""Webhook delivery against hostile receivers, the outbound address table, and URL redaction.

The receivers are real TCP servers on loopback speaking just enough HTTP/1.1 to attack a client: a gzip
bomb, an endless body, a body or headers dripped a byte at a time, no answer at all. Each delivery must
end by its deadline (checked loosely, under twice the deadline: these are limits, not speed figures) and
the process's resident memory must not grow past ~50 MB while it runs (sampled through the call, since a
large buffer's memory is handed back to the system as soon as it is freed).
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import random
import socket
import threading
import time
import zlib
from collections.abc import Callable, Iterator

import httpx
import psutil
import pytest
from cryptography.fernet import Fernet
from sqlalchemy import insert, select

from fleetscope.services import auth
from fleetscope.services.alerting import notifiers as N
from fleetscope.store import alerting_schema as S
from fleetscope.services.alerting import state as ST
from tests.alerting.receiver import Receiver
from tests.conftest import LiveServer, make_settings

DEADLINE_S = 1.5
LOOPBACK = N.OutboundPolicy(allow_loopback=True)
RSS_GROWTH_LIMIT_BYTES = 50 * 2**20


# --- hostile receivers ---------------------------------------------------------------------------------


class Hostile:
    """A loopback TCP server that reads each request and then runs ``behave(conn)``; ``stop`` releases any
    connection still being held."""

    def __init__(self, behave: Callable[[socket.socket, threading.Event], None]):
        self.behave = behave
        self.stopping = threading.Event()
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}/hook"
        self.requests = 0
        self.sent_bytes = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while not self.stopping.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn: socket.socket) -> None:
        with conn:
            try:
                _read_request(conn)
                self.requests += 1
                self.behave(conn, self.stopping)
            except OSError:
                pass  # the client hung up: what a client holding to its limits does

    def send(self, conn: socket.socket, data: bytes) -> None:
        conn.sendall(data)
        self.sent_bytes += len(data)

    def stop(self) -> None:
        self.stopping.set()
        self.sock.close()


def _read_request(conn: socket.socket) -> bytes:
    buf = b""
    while b"\r\n\r\n" not in buf:
        chunk = conn.recv(65536)
        if not chunk:
            raise OSError("client closed before sending a request")
        buf += chunk
    head, body = buf.split(b"\r\n\r\n", 1)
    length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")), 0)
    while len(body) < length:
        body += conn.recv(65536)
    return head


def gzip_bomb(inflated_bytes: int) -> bytes:
    """One gzip member inflating to ``inflated_bytes`` zeros. Each MiB is compressed with a full flush, so
    its compressed form is the same bytes every time and the bomb is built by repetition, not by
    compressing a GiB (the shape a hostile receiver would send: ~1 KB per inflated MiB)."""
    mib = 2**20
    assert inflated_bytes % mib == 0
    c = zlib.compressobj(9, zlib.DEFLATED, -15)
    block = c.compress(b"\0" * mib) + c.flush(zlib.Z_FULL_FLUSH)
    tail = c.flush(zlib.Z_FINISH)
    crc = 0
    zeros = b"\0" * mib
    for _ in range(inflated_bytes // mib):
        crc = zlib.crc32(zeros, crc)
    header = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x02\xff"
    trailer = crc.to_bytes(4, "little") + (inflated_bytes % 2**32).to_bytes(4, "little")
    return header + block * (inflated_bytes // mib) + tail + trailer


BOMB = gzip_bomb(2**30)


def answer_bomb(status: int) -> Callable[[Hostile], Callable[[socket.socket, threading.Event], None]]:
    def make(h: Hostile) -> Callable[[socket.socket, threading.Event], None]:
        def behave(conn: socket.socket, stop: threading.Event) -> None:
            h.send(conn, f"HTTP/1.1 {status} X\r\nContent-Encoding: gzip\r\nContent-Type: text/plain\r\nContent-Length: {len(BOMB)}\r\n\r\n".encode())
            h.send(conn, BOMB)
        return behave
    return make


def answer_endless(h: Hostile) -> Callable[[socket.socket, threading.Event], None]:
    def behave(conn: socket.socket, stop: threading.Event) -> None:
        h.send(conn, b"HTTP/1.1 500 Endless\r\nContent-Type: text/plain\r\n\r\n")  # no length: the body ends at close
        chunk = b"x" * 65536
        while not stop.is_set():
            h.send(conn, chunk)
    return behave


def answer_drip_body(h: Hostile) -> Callable[[socket.socket, threading.Event], None]:
    def behave(conn: socket.socket, stop: threading.Event) -> None:
        h.send(conn, b"HTTP/1.1 503 Drip\r\nContent-Length: 1000000\r\n\r\n")
        while not stop.wait(0.1):  # a byte every 100 ms: a per-read timeout never fires
            h.send(conn, b"y")
    return behave


def answer_drip_headers(h: Hostile) -> Callable[[socket.socket, threading.Event], None]:
    def behave(conn: socket.socket, stop: threading.Event) -> None:
        h.send(conn, b"HTTP/1.1 200 OK\r\n")
        while not stop.wait(0.1):
            h.send(conn, b"X")  # one endless header name, a byte at a time
    return behave


def answer_nothing(h: Hostile) -> Callable[[socket.socket, threading.Event], None]:
    def behave(conn: socket.socket, stop: threading.Event) -> None:
        stop.wait(60)
    return behave


@pytest.fixture
def hostile() -> Iterator[Callable[..., Hostile]]:
    made: list[Hostile] = []

    def start(make: Callable[[Hostile], Callable[[socket.socket, threading.Event], None]]) -> Hostile:
        h = Hostile(lambda conn, stop: None)
        h.behave = make(h)
        made.append(h)
        return h

    yield start
    for h in made:
        h.stop()


class PeakRSS:
    """Samples this process's resident set every 5 ms while a block runs; ``growth_bytes`` is the highest
    sample over the one taken before."""

    def __enter__(self) -> PeakRSS:
        self.proc = psutil.Process()
        self.before = self.peak = self.proc.memory_info().rss
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._sample, daemon=True)
        self.thread.start()
        return self

    def _sample(self) -> None:
        while not self.done.wait(0.005):
            self.peak = max(self.peak, self.proc.memory_info().rss)

    def __exit__(self, *exc: object) -> None:
        self.done.set()
        self.thread.join()
        self.peak = max(self.peak, self.proc.memory_info().rss)

    @property
    def growth_bytes(self) -> int:
        return self.peak - self.before


def message() -> N.Message:
    data = {"receiver": "hook", "status": "firing", "alerts": [], "groupLabels": {}, "commonLabels": {}, "commonAnnotations": {},
            "externalURL": "", "groupKey": "{}:{}"}
    return N.Message("msg_hostile", data, dt.datetime(2027, 1, 1, tzinfo=dt.UTC))


def deliver(url: str, **kw: object) -> tuple[int | N.DeliveryError, float, int]:
    """One delivery to ``url`` with a fresh client: (status or error, seconds taken, peak RSS growth). A
    first delivery to a receiver that simply accepts warms the client up (imports, the TLS context), so
    the growth measured is the hostile answer's."""
    notifier = N.WebhookNotifier(url, timeout_s=DEADLINE_S)
    with N.OutboundClient() as client, Receiver() as ok:
        assert N.WebhookNotifier(ok.url + "/hook").send(message(), client, LOOPBACK) == 200
        with PeakRSS() as rss:
            t0 = time.monotonic()
            try:
                out: int | N.DeliveryError = notifier.send(message(), client, LOOPBACK, **kw)  # type: ignore[arg-type]
            except N.DeliveryError as exc:
                out = exc
            took = time.monotonic() - t0
    return out, took, rss.growth_bytes


# --- the attacks -----------------------------------------------------------------------------------------


def test_gzip_bomb_refusal_is_read_to_the_cap_and_never_inflated(hostile):
    h = hostile(answer_bomb(500))
    out, took, growth = deliver(h.url)
    assert isinstance(out, N.DeliveryError)
    assert (out.status_code, out.retryable, out.limit) == (500, True, "max_bytes")
    assert out.message.startswith("HTTP 500") and "65536-byte limit" in out.message
    assert took < 2 * DEADLINE_S
    assert growth < RSS_GROWTH_LIMIT_BYTES, f"RSS grew {growth / 2**20:.0f} MiB"


def test_gzip_bomb_with_2xx_is_delivered_without_reading_the_body(hostile):
    h = hostile(answer_bomb(200))
    out, took, growth = deliver(h.url)
    assert out == 200
    assert took < 2 * DEADLINE_S
    assert growth < RSS_GROWTH_LIMIT_BYTES


def test_endless_body_stops_at_the_cap(hostile):
    h = hostile(answer_endless)
    out, took, growth = deliver(h.url)
    assert isinstance(out, N.DeliveryError)
    assert (out.status_code, out.retryable, out.limit) == (500, True, "max_bytes")
    assert "xxxx" in out.message  # the start of the answer is still shown
    assert took < 2 * DEADLINE_S
    assert growth < RSS_GROWTH_LIMIT_BYTES


def test_drip_fed_body_ends_at_the_deadline(hostile):
    h = hostile(answer_drip_body)
    out, took, growth = deliver(h.url)
    assert isinstance(out, N.DeliveryError)
    # the status arrived, so it decides (503: retry); the note says which limit cut the answer
    assert (out.status_code, out.retryable, out.limit) == (503, True, "deadline")
    assert f"{DEADLINE_S:g} s delivery deadline" in out.message
    assert DEADLINE_S * 0.9 <= took < 2 * DEADLINE_S
    assert growth < RSS_GROWTH_LIMIT_BYTES


def test_drip_fed_headers_end_at_the_deadline(hostile):
    h = hostile(answer_drip_headers)
    out, took, _ = deliver(h.url)
    assert isinstance(out, N.DeliveryError)
    assert (out.status_code, out.retryable, out.limit) == (None, True, "deadline")
    assert "waiting for the answer's status and headers" in out.message and "will retry" in out.message
    assert h.sent_bytes > 17 + 5  # status line plus header bytes: it really was dripping when the deadline came
    assert DEADLINE_S * 0.9 <= took < 2 * DEADLINE_S


def test_silent_receiver_ends_at_the_deadline(hostile):
    h = hostile(answer_nothing)
    out, took, _ = deliver(h.url)
    assert isinstance(out, N.DeliveryError)
    assert (out.retryable, out.limit) == (True, "deadline")
    assert "waiting for the answer's status and headers" in out.message
    assert DEADLINE_S * 0.9 <= took < 2 * DEADLINE_S


def test_slow_name_resolution_counts_against_the_deadline(hostile):
    h = hostile(answer_nothing)

    def slow(host: str, port: int) -> list[str]:
        time.sleep(5 * DEADLINE_S)
        return ["127.0.0.1"]

    out, took, _ = deliver(h.url.replace("127.0.0.1", "slow.test"), resolver=slow)
    assert isinstance(out, N.DeliveryError)
    assert (out.retryable, out.limit) == (True, "deadline") and "resolving 'slow.test'" in out.message
    assert took < 2 * DEADLINE_S and h.requests == 0


def test_proxy_settings_in_the_environment_are_not_used(hostile, monkeypatch):
    """A proxy would resolve the name again (and reach what the check refused): the request goes to the
    checked address itself whatever HTTP_PROXY says."""
    proxy = hostile(answer_nothing)
    for name in ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.setenv(name, proxy.url.rsplit("/", 1)[0])
    with Receiver() as rx, N.OutboundClient() as client:
        assert N.WebhookNotifier(rx.url.replace("127.0.0.1", "hooks.test") + "/hook").send(message(), client, LOOPBACK,
                                                                                            resolver=lambda h, p: ["127.0.0.1"]) == 200
        assert len(rx.requests) == 1 and rx.requests[0]["headers"]["accept-encoding"] == "identity"
    assert proxy.requests == 0


def test_deadline_holds_through_the_deliverer(hostile, store):
    """The worker's path: the receiver's own timeout_s cannot outlast the global deadline (the outbox
    lease is sized by it), and the dripping receiver's attempt is recorded with the limit it hit."""
    h = hostile(answer_drip_body)
    box = ST.SecretBox([Fernet.generate_key()])
    ST.put_receiver(store.engine, box, "hook", "webhook", h.url, options={"timeout_s": 300}, policy=LOOPBACK)
    now = dt.datetime.now(dt.UTC)
    _outbox_row(store, now)
    d = ST.Deliverer(store, box, LOOPBACK, N.RetryPolicy(), timeout_s=DEADLINE_S, rng=random.Random(0))
    t0 = time.monotonic()
    assert d.deliver_due(now=now) == {"pending": 1}
    assert time.monotonic() - t0 < 2 * DEADLINE_S
    with store.engine.connect() as conn:
        row = conn.execute(select(S.alert_notification)).one()
    assert row.last_status_code == 503 and f"still arriving at the {DEADLINE_S:g} s delivery deadline" in row.last_error


def test_receiver_options_are_checked(store):
    box = ST.SecretBox([Fernet.generate_key()])
    for bad, field in (({"timeout_s": float("inf")}, "timeout_s"), ({"timeout_s": -1}, "timeout_s"), ({"timeout_s": "9"}, "timeout_s"),
                       ({"max_alerts": 1.5}, "max_alerts"), ({"send_resolved": "no"}, "send_resolved")):
        with pytest.raises(ValueError, match=f"receiver option {field}"):
            ST.put_receiver(store.engine, box, "hook", "webhook", "http://127.0.0.1:9/", options=bad, policy=LOOPBACK)
    assert ST.receiver_info(store.engine) == []


# --- the address table ----------------------------------------------------------------------------------

NONE = N.OutboundPolicy()
LO = N.OutboundPolicy(allow_loopback=True)
PRIV = N.OutboundPolicy(allow_private=True)
ALL = N.OutboundPolicy(allow_loopback=True, allow_private=True)

# address, what the refusal must name (None: allowed by default), allowed under LO, allowed under PRIV
ADDRESSES = [
    # globally reachable
    ("93.184.215.14", None, True, True),
    ("1.1.1.1", None, True, True),
    ("2606:4700:4700::1111", None, True, True),
    ("192.0.0.9", None, True, True),  # PCP anycast: globally reachable inside 192.0.0.0/24
    ("2001:4:112::1", None, True, True),  # AS112-v6
    ("64:ff9b::5db8:d70e", None, True, True),  # NAT64 of 93.184.215.14
    ("::ffff:93.184.215.14", None, True, True),
    # loopback and private: allowed by their switches only
    ("127.0.0.1", "loopback", True, False),
    ("127.8.9.10", "loopback", True, False),
    ("::1", "loopback", True, False),
    ("::ffff:127.0.0.1", "IPv4-mapped", True, False),
    ("10.1.2.3", "private-use", False, True),
    ("172.16.0.1", "private-use", False, True),
    ("192.168.1.1", "private-use", False, True),
    ("100.64.0.1", "shared address space", False, True),
    ("fd12:3456::1", "unique-local", False, True),
    ("::ffff:10.0.0.1", "IPv4-mapped", False, True),
    # never
    ("169.254.169.254", "metadata", False, False),
    ("::ffff:169.254.169.254", "metadata", False, False),
    ("100.100.100.200", "Alibaba", False, False),
    ("168.63.129.16", "WireServer", False, False),
    ("fd00:ec2::254", "AWS", False, False),
    ("fd20:ce::254", "GCP", False, False),
    ("169.254.1.1", "link-local", False, False),
    ("fe80::1", "link-local", False, False),
    ("fe80::1%eth0", "link-local", False, False),
    ("0.0.0.0", "'this network'", False, False),
    ("0.1.2.3", "'this network'", False, False),
    ("::", "unspecified", False, False),
    ("192.0.0.1", "IPv4 service continuity prefix", False, False),
    ("192.0.0.100", "IETF protocol assignments", False, False),
    ("192.0.0.192", "IETF protocol assignments", False, False),  # Oracle Cloud's metadata service
    ("192.0.0.170", "NAT64/DNS64 discovery", False, False),
    ("192.0.2.1", "documentation", False, False),
    ("198.51.100.7", "documentation", False, False),
    ("203.0.113.7", "documentation", False, False),
    ("198.18.0.1", "benchmarking", False, False),
    ("198.19.255.254", "benchmarking", False, False),
    ("192.88.99.1", "6to4 relay", False, False),
    ("224.0.0.1", "multicast", False, False),
    ("239.255.255.250", "multicast", False, False),
    ("240.0.0.1", "reserved", False, False),
    ("255.255.255.255", "limited broadcast", False, False),
    ("ff02::1", "multicast", False, False),
    ("fec0::1", "site-local", False, False),
    ("2001:db8::1", "documentation", False, False),
    ("3fff::1", "documentation", False, False),
    ("2001:2::1", "benchmarking", False, False),
    ("2001:10::1", "ORCHID", False, False),
    ("100::1", "discard-only", False, False),
    ("5f00::1", "SRv6", False, False),
    ("4000::1", "2000::/3", False, False),
    # IPv6 forms that carry IPv4: judged by what they carry
    ("64:ff9b::7f00:1", "NAT64 (RFC 6052) for 127.0.0.1", False, False),
    ("64:ff9b::a9fe:a9fe", "NAT64 (RFC 6052) for 169.254.169.254", False, False),
    ("64:ff9b::a00:1", "NAT64 (RFC 6052) for 10.0.0.1", False, False),
    ("64:ff9b:1::a00:1", "local-use IPv4/IPv6 translation", False, False),
    ("::7f00:1", "IPv4-compatible", False, False),
    ("::a9fe:a9fe", "IPv4-compatible", False, False),
    ("::5db8:d70e", "IPv4-compatible", False, False),  # deprecated whatever it carries
    ("2002:7f00:1::1", "6to4 (RFC 3056), not globally reachable, for 127.0.0.1", False, False),
    ("2002:a9fe:a9fe::", "6to4 (RFC 3056), not globally reachable, for 169.254.169.254", False, False),
    ("2002:5db8:d70e::1", "6to4", False, False),
    ("2001:0:4136:e378:8000:63bf:80ff:fffe", "Teredo (RFC 4380), not globally reachable, for client 127.0.0.1", False, False),
    ("2001:0:4136:e378:8000:63bf:5646:57ab", "client 169.185.168.84", False, False),
]


@pytest.mark.parametrize("addr, refusal, loopback_ok, private_ok", ADDRESSES, ids=[a[0] for a in ADDRESSES])
def test_address_table(addr, refusal, loopback_ok, private_ok):
    why = N.address_refusal(addr, NONE)
    if refusal is None:
        assert why is None
        assert N.address_refusal(addr, ALL) is None
        return
    assert why is not None and refusal in why
    assert (N.address_refusal(addr, LO) is None) == loopback_ok
    assert (N.address_refusal(addr, PRIV) is None) == private_ok
    assert (N.address_refusal(addr, ALL) is None) == (loopback_ok or private_ok)


@pytest.mark.parametrize("addr", [a[0] for a in ADDRESSES if a[1] is not None and not a[2] and not a[3]])
def test_never_allowed_addresses_refused_through_a_name(addr):
    """Every refused form, reached the way an attacker would: a name whose DNS answer is that address,
    with every switch on. Nothing is sent."""
    with pytest.raises(N.UnsafeURL) as exc:
        N.check_url("https://hooks.attacker.example/x", ALL, resolver=lambda h, p: ["93.184.215.14", addr])
    assert "hooks.attacker.example resolves to" in exc.value.message and exc.value.retryable is False


# --- redaction ----------------------------------------------------------------------------------------------

SECRET_URL_PARTS = ("hunter2", "s3cr3t", "XyZ123abcDEF456ghiJKL789")


def secret_url(port: int) -> str:
    return f"http://ops:hunter2@127.0.0.1:{port}/services/T0AAA0000/B0BBB1111/XyZ123abcDEF456ghiJKL789?token=s3cr3t&team=gpu"


def test_redact_url():
    assert N.redact_url(secret_url(8080)) == "http://REDACTED@127.0.0.1:8080/services/T0AAA0000/B0BBB1111/REDACTED?token=REDACTED&team=REDACTED"
    assert N.redact_url("https://discord.com/api/webhooks/123456789012345678/AbCdEf0123456789ghIJkl") == \
        "https://discord.com/api/webhooks/123456789012345678/REDACTED"
    assert N.redact_url("https://[2001:db8::1]:8443/h?k") == "https://[2001:db8::1]:8443/h?k=REDACTED"
    assert N.redact_url("http://host/a#frag-secret") == "http://host/a"
    assert N.redact_text(f"x {secret_url(1)} y") == f"x {N.redact_url(secret_url(1))} y"


def test_credentials_never_reach_last_error_logs_or_the_api(tmp_path, monkeypatch, caplog):
    """A receiver saved while loopback was allowed, delivered after it no longer is: the refusal names the
    URL, redacted, in last_error, the attempt log, the worker's log and every API answer a read token
    gets; a row written by an older version with the raw URL is redacted on the way out too."""
    from fleetscope.store import db
    from fleetscope.api import create_app
    from fleetscope.api import routes_alerts

    key = Fernet.generate_key()
    monkeypatch.setenv("FLEETSCOPE_SECRET_KEY", key.decode())
    url = f"sqlite:///{tmp_path / 'fs.db'}"
    db.upgrade(url)
    app = create_app(make_settings(tmp_path, url))
    app.include_router(routes_alerts.router)
    with LiveServer(app) as server, Receiver() as rx:
        store = app.state.store
        box = ST.SecretBox([key])
        admin = {"Authorization": "Bearer " + auth.create_token(store.engine, "admin", ["admin"])}
        read = {"Authorization": "Bearer " + auth.create_token(store.engine, "reader", ["read"])}
        # refused when saved: the 422 names the address, not the credentials
        r = httpx.put(server.url + "/api/v1/alerts/receivers/hook", headers=admin, json={"kind": "webhook", "url": secret_url(rx.port)})
        assert r.status_code == 422 and "loopback" in r.json()["detail"]
        assert not any(s in r.text for s in SECRET_URL_PARTS), r.text
        ST.put_receiver(store.engine, box, "hook", "webhook", secret_url(rx.port), policy=LOOPBACK)
        now = dt.datetime.now(dt.UTC)
        nid = _outbox_row(store, now)
        caplog.set_level(logging.DEBUG)
        d = ST.Deliverer(store, box, N.OutboundPolicy(), N.RetryPolicy(), timeout_s=DEADLINE_S)
        assert d.deliver_due(now=now) == {"dead": 1}
        assert rx.requests == []
        with store.engine.connect() as conn:
            stored = conn.execute(select(S.alert_notification.c.last_error)).scalar_one()
            attempt = conn.execute(select(S.alert_delivery_attempt.c.error)).scalar_one()
        for text in (stored, attempt, caplog.text):
            assert "REDACTED@127.0.0.1" in stored and "loopback" in stored
            assert not any(s in text for s in SECRET_URL_PARTS), text
        # a row stored with the raw URL (before redaction existed) is shown redacted
        with store.engine.begin() as conn:
            conn.execute(insert(S.alert_notification).values(
                webhook_id="msg_old", receiver="hook", group_key="{}:{}", status="dead", payload_json="{}", created_at=now,
                attempts=1, last_error=f"permanent failure: refusing {secret_url(rx.port)}: old message"))
        for path in ("/api/v1/alerts/notifications", "/api/v1/alerts/notifications?status=dead", f"/api/v1/alerts/notifications/{nid}/attempts",
                     "/api/v1/alerts/receivers"):
            r = httpx.get(server.url + path, headers=admin if path.endswith("receivers") else read)
            assert r.status_code == 200
            assert not any(s in r.text for s in SECRET_URL_PARTS), (path, r.text)
        dead = httpx.get(server.url + "/api/v1/alerts/notifications?status=dead", headers=read).json()
        assert {n["webhook_id"] for n in dead} >= {"msg_old"} and all("REDACTED" in n["last_error"] for n in dead)
    app.state.store.engine.dispose()


def _outbox_row(store, now: dt.datetime) -> int:  # type: ignore[no-untyped-def]
    """One pending notification for receiver ``hook``, as an evaluation would have written it."""
    data = {"receiver": "hook", "status": "firing", "alerts": [], "groupLabels": {}, "commonLabels": {}, "commonAnnotations": {},
            "externalURL": "", "groupKey": "{}:{}"}
    with store.engine.begin() as conn:
        res = conn.execute(insert(S.alert_notification).values(
            webhook_id=ST.new_webhook_id(), receiver="hook", group_key="{}:{}", status="pending", payload_json=json.dumps(data),
            created_at=now, next_attempt_at=now, attempts=0))
        return int(res.inserted_primary_key[0])


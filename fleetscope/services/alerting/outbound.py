"""Outbound safety for webhook delivery: where a request may go, how long it may take, how much of the
answer is read, and how a URL is shown once it is stored or logged.

A receiver URL is user input and the answer comes from whoever runs the receiver, so each delivery is held
to limits a hostile receiver cannot stretch:

- **addresses**: every address a name resolves to is judged against the IANA IPv4 and IPv6
  Special-Purpose Address Registries (RFC 6890 and its updates); a range the registry does not mark
  globally reachable is refused, and so is anything outside IPv4 unicast and IANA's IPv6 global unicast
  space (2000::/3, IANA "IPv6 Address Space" registry). IPv6 forms that carry an IPv4 address (mapped,
  compatible, NAT64, 6to4, Teredo) are judged by that address too. Loopback and private ranges can be
  allowed for receivers on the same host or network; cloud metadata addresses never are;
- **one address, no second lookup**: the request connects to an address the check approved, with the
  name in ``Host`` and in TLS SNI, so a DNS answer that changes between check and connect (rebinding)
  cannot redirect it; no proxy from the environment is used, since a proxy would resolve the name again;
- **one deadline per attempt**: resolution, connect, TLS, sending and every read share one deadline, so a
  receiver that drips a byte a second cannot hold a worker past it (a per-read timeout restarts on each
  byte);
- **a bounded answer**: a 2xx status is the receiver's verdict and its body is not read; any other
  answer is read up to ``max_bytes`` for the error text, undecoded (``Accept-Encoding: identity`` is asked
  for, and a compressed answer is inflated only to the few hundred characters an error shows);
- **redaction**: URLs in errors, logs and API answers lose their userinfo, query values and token-like
  path segments.
"""

from __future__ import annotations

import base64
import contextvars
import ipaddress
import re
import socket
import ssl
import threading
import time
import zlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, quote, urlsplit, urlunsplit

import httpcore
import httpx

DEFAULT_MAX_BYTES = 64 * 1024
SNIPPET_CHARS = 200  # what an error shows of a refusing receiver's answer


class DeliveryError(Exception):
    """A failed delivery. ``retryable``: whether trying again later can succeed; ``disable``: the endpoint
    said it is gone for good (410); ``retry_after_s``: the receiver asked us to wait this long; ``limit``:
    the outbound limit that ended the attempt (``"deadline"`` or ``"max_bytes"``), None when none did."""

    def __init__(self, message: str, *, retryable: bool, status_code: int | None = None, retry_after_s: float | None = None,
                 disable: bool = False, limit: str | None = None):
        super().__init__(message)
        self.message = message
        self.retryable = retryable
        self.status_code = status_code
        self.retry_after_s = retry_after_s
        self.disable = disable
        self.limit = limit


class UnsafeURL(DeliveryError):
    """A URL the outbound policy refuses (not http(s), or an address that is not globally reachable)."""

    def __init__(self, message: str):
        super().__init__(message, retryable=False)


# --- redaction -----------------------------------------------------------------------------------------

_TOKENISH = re.compile(r"^[A-Za-z0-9_\-.~%+=]{16,}$")
_URL_IN_TEXT = re.compile(r"\b[a-zA-Z][a-zA-Z0-9+.\-]*://[^\s'\"<>]+")
REDACTED = "REDACTED"


def _secret_segment(segment: str) -> bool:
    # Webhook services put the credential in the path (Slack's /services/T../B../<token>, Discord's
    # /api/webhooks/<id>/<token>): a long run of token characters mixing letters and digits.
    return bool(_TOKENISH.match(segment)) and any(c.isdigit() for c in segment) and any(c.isalpha() for c in segment)


def redact_url(url: str) -> str:
    """``url`` without its secrets: userinfo becomes ``REDACTED@``, every query value ``REDACTED`` (names
    stay, they say what was configured), token-like path segments ``REDACTED``; the fragment is dropped.
    What stays (scheme, host, port, the path's shape) is what an operator needs to tell receivers apart."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = parts.port
    except ValueError:
        return REDACTED
    host = f"[{host}]" if ":" in host else host
    netloc = ("REDACTED@" if "@" in parts.netloc else "") + host + (f":{port}" if port is not None else "")
    path = "/".join(REDACTED if _secret_segment(s) else s for s in parts.path.split("/"))
    query = "&".join(f"{quote(k, safe='')}={REDACTED}" for k, _ in parse_qsl(parts.query, keep_blank_values=True))
    if parts.query and not query:
        query = REDACTED
    return urlunsplit((parts.scheme, netloc, path, query, ""))


def redact_text(text: str, secrets: Iterable[str] = ()) -> str:
    """``text`` with every URL in it redacted (``redact_url``) and each of ``secrets`` (e.g. a receiver's
    full URL, in case a library quoted it in a form the URL pattern misses) replaced by ``REDACTED``."""
    for s in sorted({s for s in secrets if s}, key=len, reverse=True):
        text = text.replace(s, REDACTED)
    return _URL_IN_TEXT.sub(lambda m: redact_url(m.group(0)), text)


# --- addresses --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class OutboundPolicy:
    """Where webhooks may go. Loopback and private addresses are refused unless allowed: a webhook URL is
    user input, and without this it reaches the cloud metadata service or internal admin ports (SSRF)."""

    allow_loopback: bool = False
    allow_private: bool = False


@dataclass(frozen=True)
class _Range:
    network: ipaddress.IPv4Network | ipaddress.IPv6Network
    name: str
    spec: str
    kind: str  # "global", "loopback", "private" (allowed by the policy's flags) or "refused"


def _ranges(rows: Sequence[tuple[str, str, str, str]]) -> list[_Range]:
    out = [_Range(ipaddress.ip_network(n), name, spec, kind) for n, name, spec, kind in rows]
    # most specific first: 192.0.0.9/32 (globally reachable) inside 192.0.0.0/24 (not)
    return sorted(out, key=lambda r: r.network.prefixlen, reverse=True)


# Cloud metadata services: refused whatever the policy allows, including where they sit inside a range
# that can be allowed (Alibaba's inside 100.64.0.0/10, AWS's and GCP's IPv6 ones inside fc00::/7) or in
# public space (Azure's WireServer answers on 168.63.129.16 inside every VM).
_METADATA = _ranges([
    ("169.254.169.254/32", "the cloud metadata service (AWS, GCP, Azure, OpenStack)", "RFC 3927 link-local", "refused"),
    ("100.100.100.200/32", "Alibaba Cloud's metadata service", "vendor documentation", "refused"),
    ("168.63.129.16/32", "Azure's WireServer", "vendor documentation", "refused"),
    ("fd00:ec2::254/128", "AWS's IPv6 metadata service", "vendor documentation", "refused"),
    ("fd20:ce::254/128", "GCP's IPv6 metadata service", "vendor documentation", "refused"),
])

# IANA IPv4 Special-Purpose Address Registry; "global" where its Globally Reachable column says True.
# Multicast (224.0.0.0/4) is not in that registry but is no webhook destination either.
_IPV4 = _ranges([
    ("0.0.0.0/8", "'this network'", "RFC 791 §3.2", "refused"),
    ("10.0.0.0/8", "private-use", "RFC 1918", "private"),
    ("100.64.0.0/10", "shared address space (CGNAT)", "RFC 6598", "private"),
    ("127.0.0.0/8", "loopback", "RFC 1122 §3.2.1.3", "loopback"),
    ("169.254.0.0/16", "link-local, where cloud metadata services answer", "RFC 3927", "refused"),
    ("172.16.0.0/12", "private-use", "RFC 1918", "private"),
    ("192.0.0.0/24", "IETF protocol assignments", "RFC 6890 §2.1", "refused"),
    ("192.0.0.0/29", "IPv4 service continuity prefix", "RFC 7335", "refused"),
    ("192.0.0.8/32", "IPv4 dummy address", "RFC 7600", "refused"),
    ("192.0.0.9/32", "Port Control Protocol anycast", "RFC 7723", "global"),
    ("192.0.0.10/32", "TURN anycast", "RFC 8155", "global"),
    ("192.0.0.170/31", "NAT64/DNS64 discovery", "RFC 8880", "refused"),
    ("192.0.2.0/24", "documentation (TEST-NET-1)", "RFC 5737", "refused"),
    ("192.31.196.0/24", "AS112-v4", "RFC 7535", "global"),
    ("192.52.193.0/24", "AMT", "RFC 7450", "global"),
    ("192.88.99.0/24", "deprecated 6to4 relay anycast", "RFC 7526", "refused"),
    ("192.168.0.0/16", "private-use", "RFC 1918", "private"),
    ("192.175.48.0/24", "AS112 direct delegation", "RFC 7534", "global"),
    ("198.18.0.0/15", "benchmarking", "RFC 2544", "refused"),
    ("198.51.100.0/24", "documentation (TEST-NET-2)", "RFC 5737", "refused"),
    ("203.0.113.0/24", "documentation (TEST-NET-3)", "RFC 5737", "refused"),
    ("224.0.0.0/4", "multicast", "RFC 5771", "refused"),
    ("240.0.0.0/4", "reserved", "RFC 1112 §4", "refused"),
    ("255.255.255.255/32", "limited broadcast", "RFC 919 §7", "refused"),
])

# IANA IPv6 Special-Purpose Address Registry, plus the IPv6 Address Space registry's deprecated
# site-local and multicast blocks. The forms that embed IPv4 (::ffff:0:0/96, ::/96, 64:ff9b::/96,
# 2002::/16, 2001::/32) are judged by ``_embedded`` before this table.
_IPV6 = _ranges([
    ("::/128", "unspecified", "RFC 4291 §2.5.2", "refused"),
    ("::1/128", "loopback", "RFC 4291 §2.5.3", "loopback"),
    ("64:ff9b:1::/48", "local-use IPv4/IPv6 translation", "RFC 8215", "refused"),
    ("100::/64", "discard-only", "RFC 6666", "refused"),
    ("100:0:0:1::/64", "dummy IPv6 prefix", "RFC 9780", "refused"),
    ("2001::/23", "IETF protocol assignments", "RFC 2928", "refused"),
    ("2001:1::1/128", "Port Control Protocol anycast", "RFC 7723", "global"),
    ("2001:1::2/128", "TURN anycast", "RFC 8155", "global"),
    ("2001:1::3/128", "DNS-SD service registration anycast", "RFC 9665", "global"),
    ("2001:2::/48", "benchmarking", "RFC 5180", "refused"),
    ("2001:3::/32", "AMT", "RFC 7450", "global"),
    ("2001:4:112::/48", "AS112-v6", "RFC 7535", "global"),
    ("2001:10::/28", "deprecated ORCHID", "RFC 4843", "refused"),
    ("2001:20::/28", "ORCHIDv2", "RFC 7343", "global"),
    ("2001:30::/28", "drone remote ID entity tags", "RFC 9374", "global"),
    ("2001:db8::/32", "documentation", "RFC 3849", "refused"),
    ("2620:4f:8000::/48", "AS112 direct delegation", "RFC 7534", "global"),
    ("3fff::/20", "documentation", "RFC 9637", "refused"),
    ("5f00::/16", "segment routing (SRv6) SIDs", "RFC 9602", "refused"),
    ("fc00::/7", "unique-local (private)", "RFC 4193", "private"),
    ("fe80::/10", "link-local", "RFC 4291 §2.5.6", "refused"),
    ("fec0::/10", "deprecated site-local", "RFC 3879", "refused"),
    ("ff00::/8", "multicast", "RFC 4291 §2.7", "refused"),
])
_IPV6_GLOBAL_UNICAST = ipaddress.ip_network("2000::/3")
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_IPV4_COMPATIBLE = ipaddress.ip_network("::/96")


@dataclass(frozen=True)
class Verdict:
    """How the policy sees one address: ``kind`` as in ``_Range``, ``why`` a sentence naming the range."""

    kind: str
    why: str


def _lookup(addr: ipaddress.IPv4Address | ipaddress.IPv6Address) -> Verdict:
    for table in (_METADATA, _IPV4 if addr.version == 4 else _IPV6):
        for r in table:
            if addr in r.network:
                return Verdict(r.kind, f"{addr} is {r.name} ({r.spec}, {r.network})")
    if addr.version == 6 and addr not in _IPV6_GLOBAL_UNICAST:
        return Verdict("refused", f"{addr} is outside IANA's IPv6 global unicast space (2000::/3)")
    return Verdict("global", f"{addr} is globally reachable")


def _embedded(addr: ipaddress.IPv6Address) -> Verdict | None:
    """The verdict on an IPv6 address that carries an IPv4 one, judged by that IPv4 address; None for
    other addresses. A socket sends an IPv4-mapped address to its IPv4 address, so that form is the IPv4
    address for every rule; NAT64's well-known prefix must only carry global IPv4 (RFC 6052 §3.1); the
    deprecated compatible form, 6to4 and Teredo are not globally reachable whatever they carry (IANA
    registries), and the verdict names what they carry so an attempt to reach inside is recognisable."""
    if addr.ipv4_mapped is not None:
        inner = classify(str(addr.ipv4_mapped))
        return Verdict(inner.kind, f"{addr} is IPv4-mapped (RFC 4291 §2.5.5.2): {inner.why}")
    if addr in _NAT64:
        v4 = ipaddress.IPv4Address(int(addr) & 0xFFFFFFFF)
        inner = classify(str(v4))
        if inner.kind == "global":
            return Verdict("global", f"{addr} is NAT64 (RFC 6052) for {v4}, which is globally reachable")
        return Verdict("refused", f"{addr} is NAT64 (RFC 6052) for {v4}, and the well-known prefix carries only global IPv4 (RFC 6052 §3.1): {inner.why}")
    if addr in _IPV4_COMPATIBLE and int(addr) > 1:
        v4 = ipaddress.IPv4Address(int(addr) & 0xFFFFFFFF)
        return Verdict("refused", f"{addr} is the deprecated IPv4-compatible form (RFC 4291 §2.5.5.1) of {v4}: {classify(str(v4)).why}")
    if addr.sixtofour is not None:
        v4 = addr.sixtofour
        return Verdict("refused", f"{addr} is 6to4 (RFC 3056), not globally reachable, for {v4}: {classify(str(v4)).why}")
    if addr.teredo is not None:
        server, client = addr.teredo
        return Verdict("refused", f"{addr} is Teredo (RFC 4380), not globally reachable, for client {client} via server {server}: {classify(str(client)).why}")
    return None


def classify(ip: str) -> Verdict:
    """The policy's view of one address (an IPv6 zone index is ignored)."""
    addr = ipaddress.ip_address(ip.split("%", 1)[0])
    meta = next((r for r in _METADATA if addr in r.network), None)
    if meta is not None:
        return Verdict("refused", f"{addr} is {meta.name} ({meta.spec})")
    if addr.version == 6:
        v = _embedded(addr)  # type: ignore[arg-type]
        if v is not None:
            return v
    return _lookup(addr)


def address_refusal(ip: str, policy: OutboundPolicy) -> str | None:
    """Why ``ip`` may not be contacted under ``policy``, or None."""
    v = classify(ip)
    if v.kind == "global":
        return None
    if v.kind == "loopback":
        return None if policy.allow_loopback else f"{v.why}; FLEETSCOPE_ALERT_ALLOW_LOOPBACK=1 allows loopback"
    if v.kind == "private":
        return None if policy.allow_private else f"{v.why}; FLEETSCOPE_ALERT_ALLOW_PRIVATE=1 allows private ranges"
    return f"{v.why}; never allowed"


# --- the deadline -------------------------------------------------------------------------------------------


class Deadline:
    """One attempt's time budget: every step takes what is left of it, not a fresh timeout."""

    def __init__(self, total_s: float):
        self.total_s = total_s
        self.at = time.monotonic() + total_s

    def left_s(self) -> float:
        return self.at - time.monotonic()


Resolver = Callable[[str, int], Sequence[str]]


def _system_resolver(host: str, port: int) -> list[str]:
    # getaddrinfo's order is the system's preference (RFC 6724): keep it, as a connection would try them
    return list(dict.fromkeys(info[4][0] for info in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)))


def _resolve(resolver: Resolver, host: str, port: int, deadline: Deadline | None) -> list[str]:
    if deadline is None:
        return list(resolver(host, port))
    # getaddrinfo takes no timeout; a resolver that outlives the deadline is left to finish on its own
    # thread (a daemon, holding nothing) while the attempt ends on time.
    box: dict[str, Any] = {}
    done = threading.Event()

    def run() -> None:
        try:
            box["addrs"] = list(resolver(host, port))
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting thread
            box["error"] = exc
        finally:
            done.set()

    threading.Thread(target=run, name="fleetscope-resolve", daemon=True).start()
    if not done.wait(max(0.0, deadline.left_s())):
        raise DeliveryError(f"no answer within the {deadline.total_s:g} s delivery deadline (resolving {host!r}); will retry",
                            retryable=True, limit="deadline")
    if "error" in box:
        raise box["error"]
    return box["addrs"]


def check_url(url: str, policy: OutboundPolicy, resolver: Resolver | None = None, *, deadline: Deadline | None = None) -> list[str]:
    """Refuse (``UnsafeURL``) a URL that is not http(s) or whose host resolves to any refused address;
    return the addresses. Checked when a receiver is saved and again before every request, since DNS
    answers change. Errors show the URL redacted."""
    try:
        parts = urlsplit(url)
        hostname, port = parts.hostname, parts.port
    except ValueError as exc:
        raise UnsafeURL(f"{redact_url(url)!r} is not a valid URL: {exc}") from None
    if parts.scheme not in ("http", "https") or not hostname:
        raise UnsafeURL(f"{redact_url(url)!r}: only http and https URLs with a host are allowed")
    port = port or (443 if parts.scheme == "https" else 80)
    try:
        addrs = _resolve(resolver or _system_resolver, hostname, port, deadline)
    except (OSError, UnicodeError) as exc:
        raise DeliveryError(f"cannot resolve {hostname!r}: {exc}", retryable=True) from None
    if not addrs:
        raise DeliveryError(f"{hostname!r} resolves to no address", retryable=True)
    for ip in addrs:
        try:
            why = address_refusal(ip, policy)
        except ValueError:
            why = f"{ip!r} is not an IP address"
        if why:
            raise UnsafeURL(f"refusing {redact_url(url)}: {hostname} resolves to {why}")
    return addrs


# --- the client ---------------------------------------------------------------------------------------------

_current: contextvars.ContextVar[Deadline | None] = contextvars.ContextVar("fleetscope_outbound_deadline", default=None)


def _budget(timeout: float | None, exc: type[Exception]) -> float | None:
    d = _current.get()
    if d is None:
        return timeout
    left = d.left_s()
    if left <= 0:
        raise exc("delivery deadline passed")
    return left if timeout is None else min(timeout, left)


class _DeadlineStream(httpcore.NetworkStream):
    """A connection whose every read, write and TLS handshake gets at most what is left of the deadline."""

    def __init__(self, inner: httpcore.NetworkStream):
        self._inner = inner

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._inner.read(max_bytes, _budget(timeout, httpcore.ReadTimeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._inner.write(buffer, _budget(timeout, httpcore.WriteTimeout))

    def close(self) -> None:
        self._inner.close()

    def start_tls(self, ssl_context: ssl.SSLContext, server_hostname: str | None = None, timeout: float | None = None) -> httpcore.NetworkStream:
        return _DeadlineStream(self._inner.start_tls(ssl_context, server_hostname, _budget(timeout, httpcore.ConnectTimeout)))

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)


class _DeadlineBackend(httpcore.NetworkBackend):
    def __init__(self) -> None:
        self._inner = httpcore.SyncBackend()

    def connect_tcp(self, host: str, port: int, timeout: float | None = None, local_address: str | None = None,
                    socket_options: Iterable[Any] | None = None) -> httpcore.NetworkStream:
        return _DeadlineStream(self._inner.connect_tcp(host, port, _budget(timeout, httpcore.ConnectTimeout), local_address, socket_options))

    def connect_unix_socket(self, path: str, timeout: float | None = None, socket_options: Iterable[Any] | None = None) -> httpcore.NetworkStream:
        raise httpcore.UnsupportedProtocol("webhooks go over TCP only")

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)


@dataclass(frozen=True)
class Answer:
    """A receiver's answer: status, headers (lower-case names), at most ``max_bytes`` of the body (empty
    for 2xx, which is not read), and ``cut``: the limit that stopped the body being read in full."""

    status: int
    headers: dict[str, str]
    body: bytes = b""
    cut: str | None = None  # "max_bytes" or "deadline"

    def text(self) -> str:
        """The start of the body as text for an error, inflated (to a few hundred characters at most) if
        the receiver compressed it although ``identity`` was asked for; control characters blanked."""
        enc = self.headers.get("content-encoding", "identity").strip().lower()
        data = self.body
        if enc in ("gzip", "x-gzip", "deflate"):
            try:
                # wbits 47: a gzip or zlib header, detected; max_length: no bomb gets past a snippet's size
                data = zlib.decompressobj(47).decompress(data, 4 * SNIPPET_CHARS)
            except zlib.error:
                return f"[{enc}-encoded answer that does not inflate]"
        elif enc not in ("identity", ""):
            return f"[{enc}-encoded answer]"
        text = data[: 4 * SNIPPET_CHARS].decode("utf-8", "replace")
        return "".join(c if c.isprintable() else " " for c in text)


def _target(url: str, addr: str) -> tuple[httpcore.URL, list[tuple[bytes, bytes]], dict[str, Any]]:
    """The request line's URL aimed at ``addr`` (an address ``check_url`` approved), the ``Host`` header
    and Basic credentials the original URL carries, and the TLS server name, so the request stays
    addressed to the original host while the connection goes to the checked address."""
    u = httpx.URL(url)
    host = u.raw_host  # IDNA ("xn--...") where the name is not ASCII
    ip = ipaddress.ip_address(addr.split("%", 1)[0])
    explicit_port = urlsplit(url).port
    port = u.port or (443 if u.scheme == "https" else 80)
    host_header = (b"[" + host + b"]" if b":" in host else host) + (b":%d" % explicit_port if explicit_port is not None else b"")
    headers = [(b"host", host_header)]
    if u.username or u.password:
        # RFC 7617: what a browser or httpx sends for userinfo in the URL
        headers.append((b"authorization", b"Basic " + base64.b64encode(f"{u.username}:{u.password}".encode())))
    extensions: dict[str, Any] = {"sni_hostname": host.decode("ascii")} if u.scheme == "https" else {}
    return httpcore.URL(scheme=u.raw_scheme, host=str(ip).encode("ascii"), port=port, target=u.raw_path), headers, extensions


_PHASES = {"connection.connect_tcp": "connecting", "connection.start_tls": "the TLS handshake",
           "http11.send_request_headers": "sending the request", "http11.send_request_body": "sending the request",
           "http11.receive_response_headers": "waiting for the answer's status and headers"}


class OutboundClient:
    """HTTP/1.1 for webhooks: connects only to checked addresses, holds each attempt to its deadline and
    reads a bounded answer. No connection is kept for reuse: two names on one address would otherwise
    share a connection whose certificate was checked for the first name only."""

    def __init__(self, ssl_context: ssl.SSLContext | None = None):
        self._pool = httpcore.ConnectionPool(ssl_context=ssl_context, max_keepalive_connections=0, network_backend=_DeadlineBackend())

    def close(self) -> None:
        self._pool.close()

    def __enter__(self) -> OutboundClient:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def post(self, url: str, addrs: Sequence[str], body: bytes, headers: dict[str, str], *, deadline: Deadline,
             max_bytes: int = DEFAULT_MAX_BYTES) -> Answer:
        """POST ``body`` to ``url`` at the checked ``addrs`` in turn (as a connection to the name would try
        each), never to a fresh DNS answer. Raises ``DeliveryError`` when no answer comes before the
        deadline or the connection fails."""
        token = _current.set(deadline)
        try:
            for i, addr in enumerate(addrs):
                try:
                    return self._post_one(url, addr, body, headers, deadline, max_bytes)
                except httpcore.ConnectError:
                    if i == len(addrs) - 1:
                        raise
            raise AssertionError("check_url returns at least one address")
        except DeliveryError:
            raise
        except httpcore.TimeoutException:
            raise DeliveryError(f"no answer within the {deadline.total_s:g} s delivery deadline; will retry",
                                retryable=True, limit="deadline") from None
        except (httpcore.NetworkError, httpcore.ProtocolError, httpcore.UnsupportedProtocol) as exc:
            raise DeliveryError(f"{type(exc).__name__}: {exc}; will retry", retryable=True) from None
        finally:
            _current.reset(token)

    def _post_one(self, url: str, addr: str, body: bytes, headers: dict[str, str], deadline: Deadline, max_bytes: int) -> Answer:
        target, fixed, extensions = _target(url, addr)
        names = {k for k, _ in fixed} | {b"accept-encoding"}
        sent = fixed + [(b"accept-encoding", b"identity")] + [(k.lower().encode("latin-1"), v.encode("latin-1"))
                                                            for k, v in headers.items() if k.lower().encode("latin-1") not in names]
        phase = ["connecting"]

        def trace(event: str, info: dict[str, Any]) -> None:
            if event.endswith(".started"):
                phase[0] = _PHASES.get(event[: -len(".started")], phase[0])

        left = max(0.001, deadline.left_s())
        ext = {**extensions, "trace": trace, "timeout": {"connect": left, "read": left, "write": left, "pool": left}}
        try:
            with self._pool.stream(b"POST", target, headers=sent, content=body, extensions=ext) as resp:
                status = resp.status
                got = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in resp.headers}
                if 200 <= status < 300:
                    return Answer(status, got)
                buf = bytearray()
                cut = None
                try:
                    for chunk in resp.iter_stream():
                        buf += chunk
                        if len(buf) > max_bytes:
                            del buf[max_bytes:]
                            cut = "max_bytes"
                            break
                except httpcore.TimeoutException:
                    cut = "deadline"
                except (httpcore.NetworkError, httpcore.ProtocolError):
                    pass  # the status is the verdict; a broken body only shortens the error text
                return Answer(status, got, bytes(buf), cut)
        except httpcore.TimeoutException:
            raise DeliveryError(f"no answer within the {deadline.total_s:g} s delivery deadline ({phase[0]}); will retry",
                                retryable=True, limit="deadline") from None


def with_limit_note(err: DeliveryError, answer: Answer, max_bytes: int, deadline_s: float) -> DeliveryError:
    """``err`` (judged from ``answer``'s status) with a note of the limit that cut the answer short."""
    if answer.cut == "max_bytes":
        note = f" (answer over the {max_bytes}-byte limit, not read further)"
    elif answer.cut == "deadline":
        note = f" (answer still arriving at the {deadline_s:g} s delivery deadline, not read further)"
    else:
        return err
    return DeliveryError(
        err.message + note, retryable=err.retryable, status_code=err.status_code, retry_after_s=err.retry_after_s,
        disable=err.disable, limit=answer.cut)

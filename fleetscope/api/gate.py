"""The API's front door: every HTTP request is screened here before any byte of its body is read.

In order, each refusal answered at once and nothing read past the request head:

1. **Head size** (431, RFC 6585 §5): more than ``MAX_HEADERS`` header fields or more than
   ``FLEETSCOPE_MAX_HEADER_BYTES`` of request line and headers.
2. **Authentication** (401 with ``WWW-Authenticate``, RFC 6750 §3): the route's declared scope is read
   from its ``security.require`` dependency when the app starts, so a route cannot be served before its
   token is checked — FastAPI itself reads and parses a Pydantic body before it solves dependencies.
   Public routes (``PUBLIC``) pass; a route that declares no scope needs ``admin``.
3. **Refused tokens per client address** (429 with ``Retry-After``, RFC 6585 §4): every 401 takes one
   from the address's bucket (``FLEETSCOPE_AUTH_FAIL_RATE_PER_S``, ``FLEETSCOPE_AUTH_FAIL_BURST``); with
   the bucket empty, a token not already verified is not looked up at all, so guessing is slowed to the
   bucket's rate and costs the database nothing.
4. **Scope** (403 with ``error="insufficient_scope"``).
5. **Rate per token** (429 with ``Retry-After``): a token bucket per token id
   (``FLEETSCOPE_TOKEN_RATE_PER_S``, ``FLEETSCOPE_TOKEN_BURST``).

Buckets are per API process (each uvicorn worker counts apart), kept in bounded LRU tables, and used
from the event loop only.
"""

from __future__ import annotations

import ipaddress
import logging
import math
import time
from collections import OrderedDict
from collections.abc import Hashable
from typing import Any

from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse
from starlette.routing import Match

from fleetscope.services import auth

log = logging.getLogger(__name__)

TOKEN_KEY = "fleetscope.token"  # where the verified token is left in the ASGI scope
PUBLIC = frozenset({"/healthz", "/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc"})
MAX_HEADERS = 100
_MEMO_MAX = 4096  # (method, path) -> scopes remembered; cleared whole when full (it only saves a route match)


class Buckets:
    """Token buckets by key: ``rate_per_s`` refill, ``burst`` capacity; at most ``max_keys`` keys kept
    (least recently used dropped: a dropped key starts again full). ``rate_per_s`` 0: no limit."""

    def __init__(self, rate_per_s: float, burst: int, max_keys: int):
        self.rate_per_s = rate_per_s
        self.burst = float(burst)
        self.max_keys = max_keys
        self._level: OrderedDict[Hashable, tuple[float, float]] = OrderedDict()

    def _now_level(self, key: Hashable, now: float) -> float:
        held = self._level.get(key)
        if held is None:
            return self.burst
        level, then = held
        return min(self.burst, level + (now - then) * self.rate_per_s)

    def wait_s(self, key: Hashable, now: float | None = None) -> float:
        """Seconds until ``key`` has one to take (0: now)."""
        if not self.rate_per_s:
            return 0.0
        level = self._now_level(key, time.monotonic() if now is None else now)
        return 0.0 if level >= 1 else (1 - level) / self.rate_per_s

    def take(self, key: Hashable, now: float | None = None) -> float:
        """Take one for ``key`` and return 0, or return the seconds to wait (nothing taken)."""
        if not self.rate_per_s:
            return 0.0
        now = time.monotonic() if now is None else now
        level = self._now_level(key, now)
        if level < 1:
            return (1 - level) / self.rate_per_s
        self._level[key] = (level - 1, now)
        self._level.move_to_end(key)
        if len(self._level) > self.max_keys:
            self._level.popitem(last=False)
        return 0.0

    def __len__(self) -> int:
        return len(self._level)


def client_key(scope: dict) -> str:
    """Whom to count refused tokens against: the peer address; an IPv6 peer by its /64, which one
    machine usually holds whole."""
    client = scope.get("client")
    host = client[0] if client else "unknown"
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return host
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.ip_network(f"{host}/64", strict=False))
    return str(ip)


def _required(route: Any) -> frozenset[str] | None:
    """The scopes a route's ``require`` dependencies declare (None: none declared)."""
    found: set[str] = set()
    stack = [route.dependant]
    while stack:
        dep = stack.pop()
        scope = getattr(dep.call, "required_scope", None)
        if scope is not None:
            found.add(scope)
        stack.extend(dep.dependencies)
    return frozenset(found) if found else None


def _leaves(routes: list[Any], extra: frozenset[str]) -> list[tuple[Any, frozenset[str]]]:
    """Routes with the scopes the routers they were included through add. FastAPI keeps an included
    router whole in newer releases (``original_router``) and copies its routes in older ones; both are
    read here. An include with a prefix of its own is refused: its routes would not match as stored."""
    out: list[tuple[Any, frozenset[str]]] = []
    for route in routes:
        inner = getattr(route, "original_router", None)
        if inner is None:
            out.append((route, extra))
            continue
        ctx = getattr(route, "include_context", None)
        if getattr(ctx, "prefix", ""):
            raise RuntimeError("api.gate: include routers without a prefix (give it to the APIRouter itself)")
        added = {getattr(d.dependency, "required_scope", None) for d in getattr(ctx, "dependencies", None) or []} - {None}
        out.extend(_leaves(list(inner.routes), extra | frozenset(added)))  # type: ignore[arg-type]
    return out


def route_scopes(app: Any) -> list[tuple[Any, frozenset[str]]]:
    """Every route with the scopes it needs: its declared ones, none for ``PUBLIC`` paths, ``admin`` where
    a route declares none (a route added without a scope is closed, not open)."""
    out = []
    for route, extra in _leaves(list(app.router.routes), frozenset()):
        path = getattr(route, "path", "")
        declared = (_required(route) if hasattr(route, "dependant") else None) or frozenset()
        declared |= extra
        out.append((route, declared if declared or path in PUBLIC else frozenset({"admin"})))
    return out


def _refusal(status: int, detail: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"detail": detail}, status, headers=headers)


def _retry(wait_s: float) -> dict[str, str]:
    return {"Retry-After": str(max(1, math.ceil(wait_s)))}


class Gate:
    """The screening of one app (see the module docstring); ``refuse`` runs ahead of everything else."""

    def __init__(self, app: Any, settings: Any):
        self.app = app
        self.max_header_bytes = settings.max_header_bytes
        self.tokens = Buckets(settings.token_rate_per_s, settings.token_burst, max_keys=100_000)
        self.failures = Buckets(settings.auth_fail_rate_per_s, settings.auth_fail_burst, max_keys=65_536)
        self._routes: list[tuple[Any, frozenset[str]]] | None = None
        self._memo: dict[tuple[str, str], frozenset[str] | None] = {}

    def scopes_for(self, scope: dict) -> frozenset[str] | None:
        """The scopes the route ``scope`` reaches needs; None where it reaches none (FastAPI answers 404
        or 405 without reading the body)."""
        memo_key = (scope["method"], scope["path"])
        if memo_key in self._memo:
            return self._memo[memo_key]
        if self._routes is None:
            self._routes = route_scopes(self.app)
        found = None
        for route, needs in self._routes:
            match, _ = route.matches(scope)
            if match is Match.FULL:
                found = needs
                break
        if len(self._memo) >= _MEMO_MAX:
            self._memo.clear()
        self._memo[memo_key] = found
        return found

    def head_too_large(self, scope: dict) -> JSONResponse | None:
        headers = scope.get("headers") or []
        size = len(scope.get("raw_path") or scope["path"]) + len(scope.get("query_string") or b"")
        for name, value in headers:
            size += len(name) + len(value) + 4
        if len(headers) > MAX_HEADERS:
            return _refusal(431, f"{len(headers)} request header fields, over the limit of {MAX_HEADERS}")
        if size > self.max_header_bytes:
            return _refusal(431, f"request line and headers of {size} bytes, over the limit of {self.max_header_bytes} bytes (FLEETSCOPE_MAX_HEADER_BYTES)")
        return None

    async def authenticate(self, scope: dict) -> tuple[auth.Token | None, JSONResponse | None]:
        """(the token, None), or (None, the refusal: 401, or 429 where the address has been refused too often)."""
        secret = None
        problem = "missing bearer token"
        for name, value in scope.get("headers") or []:
            if name == b"authorization":
                if secret is not None:
                    secret, problem = None, "more than one Authorization header"
                    break
                scheme, _, rest = value.decode("latin-1").partition(" ")
                secret = rest.strip() if scheme.lower() == "bearer" else None
                if secret is None:
                    problem = "missing bearer token"
                    break
        if secret is not None:
            hit, token = auth.cached(secret)
            if hit and token is not None:
                return token, None
        address = client_key(scope)
        wait = self.failures.wait_s(address)
        if wait:
            return None, _refusal(429, f"too many refused tokens from {address}; retry later (FLEETSCOPE_AUTH_FAIL_RATE_PER_S)", _retry(wait))
        token = None
        if secret is not None:
            problem = "invalid, expired or revoked token"
            hit, token = auth.cached(secret)
            if not hit:
                try:
                    token = await run_in_threadpool(auth.verify, self.app.state.store.engine, secret)
                except Exception:  # noqa: BLE001 - the database is down or busy: the caller may retry
                    log.warning("token lookup failed", exc_info=True)
                    return None, _refusal(503, "database busy or unreachable; retry shortly", {"Retry-After": "2"})
        if token is None:
            self.failures.take(address)
            challenge = "Bearer" if problem == "missing bearer token" else 'Bearer error="invalid_token"'
            return None, _refusal(401, problem, {"WWW-Authenticate": challenge})
        return token, None

    async def refuse(self, scope: dict) -> JSONResponse | None:
        """None where ``scope`` may go on (its token, if any, left at ``scope[TOKEN_KEY]``), else the answer."""
        refusal = self.head_too_large(scope)
        if refusal is not None:
            return refusal
        needs = self.scopes_for(scope)
        if not needs:
            return None
        token, refusal = await self.authenticate(scope)
        if refusal is not None:
            return refusal
        assert token is not None
        for wanted in sorted(needs):
            if not token.allows(wanted):
                return _refusal(403, f"token {token.name!r} lacks the {wanted!r} scope",
                                {"WWW-Authenticate": f'Bearer error="insufficient_scope", scope="{wanted}"'})
        wait = self.tokens.take(token.token_id)
        if wait:
            return _refusal(429, f"token {token.name!r} is over its rate of {self.tokens.rate_per_s:g} requests/s (FLEETSCOPE_TOKEN_RATE_PER_S); "
                                 f"retry after {math.ceil(wait)} s", _retry(wait))
        scope[TOKEN_KEY] = token
        return None

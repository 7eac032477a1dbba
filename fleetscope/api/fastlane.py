"""The agents' lane: ``POST /api/v1/ingest/{format}`` answered before the framework.

A fleet's agents send thousands of small pushes a second, and for each FastAPI's routing, dependency
solving and parameter models cost more than reading and storing the push itself (about 1 ms against
0.5 ms on this 2-core machine). This ASGI layer takes the plain case — a known format, a query of at most
``ts``, ``source`` and ``job_id``, a request the gate (``api.gate``) has let through with its token —
and runs the route's own ``ingest_body`` on it, ahead of the middleware stack (``api.app.FleetscopeAPI``). Everything else (other routes, an unknown or uncached
token, an odd query, a malformed timestamp) goes on to FastAPI, which answers exactly as documented, so
the lane never decides a refusal the route would make differently.
"""

from __future__ import annotations

import datetime as dt
import re
import time
from typing import Any
from urllib.parse import parse_qsl

from fastapi import HTTPException
from fastapi.responses import JSONResponse

from fleetscope.services import auth
from fleetscope.api.errors import error_response, too_large
from fleetscope.api.gate import TOKEN_KEY
from fleetscope.api import routes_otlp
from fleetscope.api.routes_data import ingest_body
from fleetscope.core.errors import FleetscopeError
from fleetscope.observability import REQUEST_SECONDS

PREFIX = "/api/v1/ingest/"
_QUERY = {"ts": 64, "source": 2000, "job_id": 500}  # the parameters the lane takes, with their length limits
_RFC3339 = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}[T ][0-9]{2}:[0-9]{2}:[0-9]{2}(?:\.[0-9]{1,6})?(?:Z|[+-][0-9]{2}:[0-9]{2})")


ROUTE = PREFIX + "{fmt}"
OTLP_PATH = "/v1/metrics"


async def handle(app: Any, scope: dict, receive: Any, send: Any) -> bool:
    """Answer ``scope`` if it is a plain push (True), or leave it to FastAPI (False, nothing read or sent).

    It runs before the middleware stack, so it keeps that stack's promises itself: a body over
    ``FLEETSCOPE_MAX_BODY_BYTES`` is refused with 413 by its length or as it streams, and the request's
    latency is recorded under the route's label."""
    if scope["method"] != "POST":
        return False
    if scope["path"] == OTLP_PATH:
        return await _otlp(app, scope, receive, send)
    if not scope["path"].startswith(PREFIX):
        return False
    params = _plain(scope)
    if params is None:
        return False
    start = time.perf_counter()
    limit = app.state.settings.max_body_bytes
    fmt, source, job_id, ts, length, token, encoding = params
    if length is not None and length > limit:
        response: Any = too_large(limit)
    else:
        body = await _read_body(receive, limit)
        if body is None:
            return True  # the client went away mid-body: nothing to answer, and a cut body is never stored
        if body is _TOO_LARGE:
            response = too_large(limit)
        else:
            try:
                response = await ingest_body(app, fmt, body, source=source, job_id=job_id, ts=ts, token=token, content_encoding=encoding)
            except HTTPException as exc:
                response = JSONResponse({"detail": exc.detail}, exc.status_code, headers=exc.headers)
            except FleetscopeError as exc:
                response = error_response(exc)
    await response(scope, receive, send)
    REQUEST_SECONDS.labels("POST", ROUTE, str(response.status_code)).observe(time.perf_counter() - start)
    return True


async def _otlp(app: Any, scope: dict, receive: Any, send: Any) -> bool:
    """``POST /v1/metrics`` from an agent or collector: the route's own ``otlp_body`` without FastAPI's
    routing and dependency solving, for a request with an ingest token, no query, one valid length and a
    content type the receiver takes; anything else goes on to the route."""
    found: auth.Token | None = scope.get(TOKEN_KEY)
    if found is None or not found.allows("ingest") or scope.get("query_string"):
        return False
    headers = _headers(scope)
    if headers is None:
        return False
    length, ctype, encoding = headers
    wire = routes_otlp.encoding_of(ctype or "")
    if wire is None:
        return False  # the route answers 415
    start = time.perf_counter()
    limit = app.state.settings.max_body_bytes
    if length is not None and length > limit:
        response: Any = too_large(limit)
    else:
        # the body before a place in the bound, as the route reads it: a slow sender holds only its connection
        body = await _read_body(receive, limit)
        if body is None:
            return True  # the client went away mid-body: nothing to answer, and a cut body is never stored
        if body is _TOO_LARGE:
            response = too_large(limit)
        elif not routes_otlp.enter():
            response = routes_otlp.saturated(wire)
        else:
            response = await routes_otlp.otlp_body(app, body, wire, encoding, found)
    await response(scope, receive, send)
    REQUEST_SECONDS.labels("POST", OTLP_PATH, str(response.status_code)).observe(time.perf_counter() - start)
    return True


def _plain(scope: dict) -> tuple[str, str | None, str | None, dt.datetime | None, int | None, auth.Token, str] | None:
    """(format, source, job id, ts, Content-Length, token, Content-Encoding) when the lane may answer this
    request, else None."""
    fmt = scope["path"][len(PREFIX):]
    if not fmt or "/" in fmt:
        return None
    found: auth.Token | None = scope.get(TOKEN_KEY)
    if found is None or not found.allows("ingest"):
        return None
    headers = _headers(scope)
    if headers is None:
        return None
    length, _, encoding = headers
    if encoding.strip().lower() not in ("", "identity", "gzip"):
        return None  # the route answers 415
    query: dict[str, str] = {}
    for k, v in parse_qsl(scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True):
        if k not in _QUERY or k in query or len(v) > _QUERY[k]:
            return None
        query[k] = v
    ts = None
    if "ts" in query:
        # RFC 3339 only, which the route's parser reads alike; anything else (ISO 8601's week dates and basic
        # format, a bare hour, an epoch number) is the route's to take or refuse
        if _RFC3339.fullmatch(query["ts"]) is None:
            return None
        try:
            ts = dt.datetime.fromisoformat(query["ts"])
        except ValueError:
            return None
    return fmt, query.get("source"), query.get("job_id"), ts, length, found, encoding


def _headers(scope: dict) -> tuple[int | None, str | None, str] | None:
    """(Content-Length, Content-Type, Content-Encoding) of ``scope``; None where a length is repeated or not
    a number, or a type or a coding repeated: FastAPI's stack answers those."""
    length = None
    ctype = None
    encoding, coded = "", False
    for name, value in scope["headers"]:
        if name == b"content-length":
            if length is not None or not value.isdigit():
                return None
            length = int(value)
        elif name == b"content-type":
            if ctype is not None:
                return None
            ctype = value.decode("latin-1")
        elif name == b"content-encoding":
            if coded:
                return None  # which of two codings counts is the route's to decide (it reads the first)
            coded, encoding = True, value.decode("latin-1")
    return length, ctype, encoding


_TOO_LARGE = object()


async def _read_body(receive: Any, limit: int) -> Any:
    """The whole body; None when the client disconnected before its end; ``_TOO_LARGE`` (by identity)
    once more than ``limit`` bytes have come."""
    parts = []
    seen = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunk = message.get("body", b"")
        seen += len(chunk)
        if seen > limit:
            return _TOO_LARGE
        parts.append(chunk)
        if not message.get("more_body", False):
            return b"".join(parts)

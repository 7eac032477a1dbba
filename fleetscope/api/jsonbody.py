"""JSON request bodies read with a nesting cap, so that no body reaches a recursive parser deep enough to
exhaust its stack (Python's ``json`` raises ``RecursionError`` near 1,000 levels; the C accelerator and
the protobuf JSON reader likewise).

RFC 8259 §9 lets a parser "set limits on the maximum depth of nesting"; the limit here is
``FLEETSCOPE_MAX_JSON_DEPTH`` (64 by default: the deepest document the service reads, an OpenLineage
event with column-lineage facets, nests about 10 levels).
"""

from __future__ import annotations

import datetime as dt
import json
import math
import re
from typing import Any

import numpy as np
from fastapi import HTTPException, Request
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute

_ESCAPE = re.compile(rb"\\.", re.S)
_STRING = re.compile(rb'"[^"]*"')
_NOT_BRACKET = bytes(b for b in range(256) if b not in b"[]{}")
_OPEN = np.zeros(256, dtype=np.int8)
_OPEN[[ord("["), ord("{")]] = 1
_OPEN[[ord("]"), ord("}")]] = -1
_SLICE_BYTES = 1 << 20


class TooDeep(ValueError):
    """A JSON text nesting arrays and objects deeper than allowed."""

    def __init__(self, limit: int):
        super().__init__(f"JSON nested deeper than {limit} levels of arrays and objects (FLEETSCOPE_MAX_JSON_DEPTH)")
        self.limit = limit


def depth_over(data: bytes, limit: int) -> bool:
    """Whether the JSON text ``data`` nests arrays and objects more than ``limit`` deep.

    Without parsing: escapes and strings are cut out, then the brackets left are counted, vectorised,
    so a 256 MiB body costs a few hundred ms and no recursion. On a valid JSON text the count is exact.
    On an invalid one it is exact up to the first invalid token, which is as far as any parser gets.
    """
    if data.count(b"[") + data.count(b"{") <= limit:
        return False
    brackets = _STRING.sub(b"", _ESCAPE.sub(b"", data)).translate(None, _NOT_BRACKET)
    level = 0
    for start in range(0, len(brackets), _SLICE_BYTES):
        steps = _OPEN[np.frombuffer(brackets, dtype=np.uint8, count=min(_SLICE_BYTES, len(brackets) - start), offset=start)]
        running = np.cumsum(steps, dtype=np.int64) + level
        if running.max(initial=level) > limit:
            return True
        level = int(running[-1])
    return False


def check_depth(data: bytes, limit: int) -> None:
    """``TooDeep`` where ``data`` nests more than ``limit`` deep."""
    if depth_over(data, limit):
        raise TooDeep(limit)


def loads(body: bytes, limit: int) -> Any:
    """The JSON document in ``body``: HTTPException 400 naming what is wrong (empty, not UTF-8, malformed
    with line and column, nested past ``limit``)."""
    if not body:
        raise HTTPException(400, "empty body: expected a JSON object")
    if depth_over(body, limit):
        raise HTTPException(400, str(TooDeep(limit)))
    try:
        return json.loads(body)
    except UnicodeDecodeError as exc:
        raise HTTPException(400, f"body is not UTF-8 text (byte {exc.start})") from None
    except json.JSONDecodeError as exc:
        raise HTTPException(400, f"malformed JSON at line {exc.lineno} column {exc.colno}: {exc.msg}") from None
    except RecursionError:  # unreachable under any sane limit; a 500 must never be the answer
        raise HTTPException(400, "JSON nested too deeply") from None


def max_depth(request: Request) -> int:
    return request.app.state.settings.max_json_depth


class CheckedRoute(APIRoute):
    """A route whose JSON body (a Pydantic model) is refused with 400 when nested past the limit, before
    FastAPI parses it. The body is read once: FastAPI's handler reads the same cached bytes."""

    def get_route_handler(self):  # type: ignore[no-untyped-def]
        handler = super().get_route_handler()
        if self.body_field is None:
            return handler

        async def checked(request: Request):  # type: ignore[no-untyped-def]
            ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
            if not ctype or ctype == "application/json" or ctype.endswith("+json"):
                limit = max_depth(request)
                if depth_over(await request.body(), limit):
                    return JSONResponse({"detail": str(TooDeep(limit))}, 400)
            return await handler(request)

        return checked


def finite(v: Any) -> Any:
    """A result made JSON-safe: JSON has no NaN or infinity (RFC 8259 §6), so a quantile or a rate of no
    data is null; datetimes as ISO 8601."""
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, dict):
        return {k: finite(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [finite(x) for x in v]
    if isinstance(v, dt.datetime):
        return v.isoformat()
    return v

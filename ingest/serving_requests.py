"""A serving deployment's per-request log (JSON Lines, Fleetscope's own schema) → ``serving_request`` rows
(``fleetscope/core/serving_frames.py``), from which SLO attainment and goodput are exact rather than bounded
by histogram buckets (``analyzers/serving_goodput.py``).

Servers log requests in their own shapes (vLLM's ``--enable-log-requests`` lines, gateway access logs), none
of which carries all of arrival, first token and finish; so Fleetscope defines one, close to what
``vllm bench serve --save-detailed`` and NVIDIA AIPerf keep per request. One JSON object (RFC 8259) per
line, UTF-8, ``\\n``-separated:

* ``deployment`` — string, 1–256 characters, required;
* ``replica`` — string, up to 256 characters, optional (empty when the log is the deployment's);
* ``request_id`` — string or integer, 1–256 characters, required: unique within the deployment and replica;
* ``model`` — string, optional;
* ``arrival`` — required: when the server received the request;
* ``first_token`` — optional (null or absent: no token was sent); not before ``arrival``;
* ``finish`` — optional: when the last token was sent or the request ended; not before ``first_token``
  (nor ``arrival``);
* times are RFC 3339 with a zone (``2026-03-01T12:00:00.125Z``) or epoch seconds (a number);
* ``prompt_tokens``, ``output_tokens`` — integers ≥ 0, optional;
* ``status`` — string, optional, ``"ok"`` when absent: ``ok`` for a request served to its end, else why it
  ended (``error``, ``abort``, ``timeout``, an HTTP status...).

Derived per request (by the analyzers, not stored): TTFT = first_token − arrival; TPOT = (finish −
first_token) / (output_tokens − 1) for output_tokens > 1, DistServe's and vLLM's definition; end-to-end =
finish − arrival.

Any other key is an error (a misspelt ``frist_token`` would otherwise be dropped unseen). Malformed input —
not UTF-8, NUL bytes, a line over 64 KiB, input over 256 MiB, invalid or truncated JSON, a missing or
mistyped field, times out of order — raises ``ParseError`` naming the source, the 1-based line and the
field, and nothing is returned. A request id repeated with different content is an error; repeated
identically it is one row.

Pure: bytes in, frames out.
"""

from __future__ import annotations

import datetime as dt
import math
import re
from typing import Any

import polars as pl

from fleetscope.core import frames as F
from fleetscope.core import serving_frames as SF
from fleetscope.core.errors import ParseError
from fleetscope.core.textinput import input_lines, json_object, unterminated_line
from ingest.format import FormatSpec, Sniff, SniffView, Splitting, cut_line

MAX_INPUT_BYTES = 256 * 2**20
MAX_LINE_BYTES = 64 * 1024
MAX_NAME_CHARS = 256
_FIELDS = {"deployment", "replica", "request_id", "model", "arrival", "first_token", "finish", "prompt_tokens", "output_tokens", "status"}
_RFC3339 = re.compile(r"^\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})$")
_MAX_EPOCH_S = 4102444800.0  # 2100-01-01: larger is milliseconds sent as seconds
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


def _text(obj: dict[str, Any], key: str, *, source: str, line: int, required: bool, allow_int: bool = False) -> str | None:
    v = obj.get(key)
    if v is None:
        if required:
            raise ParseError(f"{key} is required", source=source, line=line, field=key)
        return None
    if allow_int and isinstance(v, int) and not isinstance(v, bool):
        v = str(v)
    if not isinstance(v, str) or (required and not v) or len(v) > MAX_NAME_CHARS:
        raise ParseError(f"{key} must be a string of {'1' if required else '0'}-{MAX_NAME_CHARS} characters", source=source, line=line, field=key)
    return v


def _time(obj: dict[str, Any], key: str, *, source: str, line: int, required: bool) -> dt.datetime | None:
    v = obj.get(key)
    if v is None:
        if required:
            raise ParseError(f"{key} is required", source=source, line=line, field=key)
        return None
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        if not math.isfinite(v) or not 0 <= v < _MAX_EPOCH_S:
            raise ParseError(f"{key} {v!r} is not epoch seconds (1970..2100)", source=source, line=line, field=key)
        return _EPOCH + dt.timedelta(microseconds=round(v * 1e6))
    if isinstance(v, str) and _RFC3339.match(v):
        try:
            return dt.datetime.fromisoformat(v.replace("z", "Z")).astimezone(dt.UTC)
        except ValueError:
            pass
    raise ParseError(f"{key} must be RFC 3339 with a zone or epoch seconds", source=source, line=line, field=key)


def _count(obj: dict[str, Any], key: str, *, source: str, line: int) -> int | None:
    v = obj.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < 2**53:
        raise ParseError(f"{key} must be an integer >= 0", source=source, line=line, field=key)
    return v


def parse(data: bytes, *, source: str = "serving_requests") -> F.Batch:
    """``serving_request`` rows of a request log (the schema is this module's docstring)."""
    lines = input_lines(data, source, max_input_bytes=MAX_INPUT_BYTES, max_line_bytes=MAX_LINE_BYTES)
    last_cut = unterminated_line(data)
    rows: dict[tuple[str, str, str], dict[str, Any]] = {}
    for n, text in lines:
        obj = json_object(text, source, n, unterminated=n == last_cut)
        extra = sorted(set(obj) - _FIELDS)
        if extra:
            raise ParseError(f"unknown field {extra[0][:60]!r}", source=source, line=n, field=extra[0][:60])
        kw = {"source": source, "line": n}
        row = {
            "deployment": _text(obj, "deployment", required=True, **kw),
            "replica": _text(obj, "replica", required=False, **kw) or "",
            "request_id": _text(obj, "request_id", required=True, allow_int=True, **kw),
            "model": _text(obj, "model", required=False, **kw),
            "arrival": _time(obj, "arrival", required=True, **kw),
            "first_token": _time(obj, "first_token", required=False, **kw),
            "finish": _time(obj, "finish", required=False, **kw),
            "prompt_tokens": _count(obj, "prompt_tokens", **kw),
            "output_tokens": _count(obj, "output_tokens", **kw),
            "status": _text(obj, "status", required=False, **kw) or "ok",
        }
        if row["first_token"] is not None and row["first_token"] < row["arrival"]:
            raise ParseError("first_token is before arrival", source=source, line=n, field="first_token")
        after = row["first_token"] or row["arrival"]
        if row["finish"] is not None and row["finish"] < after:
            raise ParseError(f"finish is before {'first_token' if row['first_token'] else 'arrival'}", source=source, line=n, field="finish")
        key = (row["deployment"], row["replica"], row["request_id"])
        if key in rows and rows[key] != row:
            raise ParseError(f"request {row['request_id'][:60]!r} repeated with different content", source=source, line=n, field="request_id")
        rows[key] = row
    df = pl.DataFrame([{**r, "source": source} for r in rows.values()],
                      schema_overrides={c.name: c.dtype for c in SF.SERVING_REQUEST.columns}, infer_schema_length=None)
    return F.Batch(source=source, serving_request=F.conform(SF.SERVING_REQUEST, df), meta={"requests": len(rows)})


def _looks_like(view: SniffView) -> bool:
    obj = view.first_object
    return obj is not None and "request_id" in obj and "arrival" in obj and "deployment" in obj


FORMATS = (
    FormatSpec("serving_requests", "a serving deployment's per-request log (JSON Lines: arrival, first token, finish, tokens, status)",
               lambda d, s, o: parse(d, source=s), sniff=Sniff(15, _looks_like), streaming=Splitting(cut_line)),
)

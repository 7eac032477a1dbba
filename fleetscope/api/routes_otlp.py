"""OTLP/HTTP metrics receiver: ``POST /v1/metrics``, protobuf or JSON, gzip allowed.

Response rules from the OTLP specification (OTLP/HTTP, "Failures" and "Partial Success"): 200 with an
``ExportMetricsServiceResponse`` whose ``partial_success`` counts rejected points; 400 with a
``google.rpc.Status`` for a body that cannot be decoded (not retryable); 413 over the size limit, also
after decompression; 415 for an unknown content type; 503 with ``Retry-After`` when the server is
saturated or the database is busy (retryable: the SDK exporters back off and resend).
"""

from __future__ import annotations

from typing import Any

from typing import Annotated

from fastapi import APIRouter, Depends, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import Response
from sqlalchemy.exc import OperationalError

from fleetscope import door
from fleetscope.services import auth
from fleetscope.api import jsonbody
from fleetscope.api.inflight import InFlight
from fleetscope.api.security import require
from fleetscope.store import content_hash
from fleetscope.core.errors import FleetscopeError, ParseError
from fleetscope.door import ingestion, screen
from ingest import otlp, otlp_template
from google.protobuf import json_format
from google.rpc import status_pb2

router = APIRouter(tags=["otlp"])

# Requests being decoded or waiting at the door at once: enough for a fleet's agents over many
# connections, few enough to bound the memory of large bodies; beyond this the server answers 503 +
# Retry-After rather than queueing work it cannot finish before the client's timeout.
MAX_IN_FLIGHT = 64
_in_flight = InFlight(MAX_IN_FLIGHT)

_ENCODINGS = {"application/x-protobuf": "protobuf", "application/protobuf": "protobuf", "application/json": "json"}


def _status(code: int, message: str, encoding: str, http_status: int, headers: dict[str, str] | None = None) -> Response:
    st = status_pb2.Status(code=code, message=message)
    if encoding == "json":
        return Response(json_format.MessageToJson(st, indent=None), http_status, headers=headers, media_type="application/json")
    return Response(st.SerializeToString(), http_status, headers=headers, media_type="application/x-protobuf")


class _BadGzip(Exception):
    """A body that says gzip and is not (or is cut short)."""


def _decode(body: bytes, gzipped: bool, limit: int, encoding: str, max_depth: int = 64, looked_up: bool = False,
            received: bytes | None = None) -> tuple[Any, str]:
    """The request body, inflated where gzip, as a Batch, and the content hash of the request (``_sha``: of
    ``received``, the body as it came, where ``body`` was inflated from it); ParseError where it cannot be
    decoded (a JSON body nested past ``max_depth`` included). ``looked_up``: no template held it a moment ago
    (``_from_template``)."""
    sha = _sha(body if received is None else received, encoding)

    if gzipped:
        try:
            body = ingestion.gunzip_capped(body, limit, "otlp:/v1/metrics")  # ingestion.TooLarge past the limit
        except ParseError as exc:
            raise _BadGzip(str(exc)) from None
    if encoding == "json" and jsonbody.depth_over(body, max_depth):
        raise ParseError(str(jsonbody.TooDeep(max_depth)), source="otlp:/v1/metrics")
    # The request's readings, not yet frames: the door builds a group's OTLP requests into frames together.
    walk = otlp.read(body, encoding=encoding, source="otlp:/v1/metrics", looked_up=looked_up)
    otlp.plain(walk)  # its rows worked out here, off the door's one writer thread (kept on the walk)
    return walk, sha


def _sha(received: bytes, encoding: str) -> str:
    """The content hash of a request: of its body as it came, gzip and all, as ``fleetscope ingest`` hashes a
    ``.gz`` file and the dcgm route a gzip body. An exporter's or agent's retry sends the same bytes; an
    agent's push is ~2 KB gzip of ~50 KB, so this is a twentieth of hashing what it inflates to."""
    return content_hash(received, encoding.encode())


# An agent's request (8 GPUs, ~50 KB inflated, ~2-5 KB gzipped) whose template is known, or that a known
# node's template reads renamed, is read on the event loop: inflating and gathering it (~0.1-0.3 ms) costs
# less than handing it to a worker thread and back.
# Anything bigger, or not from a template, or wrong in any way, goes the thread's way, which answers it.
INLINE_MAX_BYTES = 64 * 1024
INLINE_MAX_INFLATED = 256 * 1024


def _from_template(body: bytes, gzipped: bool, limit: int, encoding: str) -> tuple[tuple[Any, str] | None, bytes | None]:
    """(walk, content hash) of a body a template reads; else None, with the body inflated where it was
    (the worker thread reads that rather than inflating it again)."""
    if encoding != "protobuf" or len(body) > INLINE_MAX_BYTES:
        return None, None
    received = body
    if gzipped:
        try:
            body = ingestion.gunzip_capped(body, min(limit, INLINE_MAX_INFLATED), "otlp:/v1/metrics")
        except (ingestion.TooLarge, ParseError):
            return None, None
    elif len(body) > INLINE_MAX_INFLATED:
        return None, None
    walk = otlp_template.lookup_renamed(body)
    if walk is None:
        return None, body
    otlp.plain(walk)
    return (walk, _sha(received, encoding)), body


@router.post("/v1/metrics")
async def otlp_metrics(request: Request, token: Annotated[auth.Token, Depends(require("ingest"))]) -> Response:
    """Receive OTLP metrics (the path OpenTelemetry SDK and Collector OTLP/HTTP exporters post to)."""

    ctype = request.headers.get("content-type", "")
    encoding = encoding_of(ctype)
    if encoding is None:
        return _unsupported(ctype)
    # The body first, then a place in the bound: a client that sends its body slowly, or never ends it, holds a
    # connection, not one of the places every other sender needs.
    body = await request.body()
    if not enter():
        return saturated(encoding)
    return await otlp_body(request.app, body, encoding, request.headers.get("content-encoding", ""), token)


def encoding_of(content_type: str) -> str | None:
    """``protobuf`` or ``json`` for a Content-Type this receiver takes, else None (the route answers 415)."""
    return _ENCODINGS.get(content_type.split(";")[0].strip().lower())


def _unsupported(ctype: str) -> Response:
    ctype = ctype.split(";")[0].strip().lower()
    return Response(f"unsupported content type {ctype!r}: use application/x-protobuf or application/json", 415)


def saturated(encoding: str) -> Response:
    return _status(14, "server saturated, retry later", encoding, 503, {"Retry-After": "1"})


def enter() -> bool:
    """Take a place in the in-flight bound once a body has been read (False: saturated, answer 503);
    ``otlp_body`` gives it back."""
    return _in_flight.enter()


async def otlp_body(app: Any, body: bytes, encoding: str, content_encoding: str, token: auth.Token) -> Response:
    """Decode, submit and answer one OTLP request whose body has been read, giving back the place the
    caller took with ``enter``: the route's whole work after the body, shared with the agents' lane
    (``api.fastlane``)."""
    try:
        limit = app.state.settings.max_body_bytes
        gzipped = content_encoding.lower() == "gzip"
        received = body
        try:
            found, inflated = _from_template(body, gzipped, limit, encoding)
            if found is None and inflated is not None:
                body, gzipped = inflated, False
            # Otherwise decompression and decoding together in a worker thread: at a large fleet's scrape
            # (~100 MB inflated) inflating alone takes a few hundred ms, which must not stall the event loop.
            walk, sha = found if found is not None else await run_in_threadpool(
                _decode, body, gzipped, limit, encoding, app.state.settings.max_json_depth, inflated is not None, received)
        except ingestion.TooLarge:
            return _status(8, f"decompressed body over the limit of {limit} bytes", encoding, 413)
        except _BadGzip as exc:
            return _status(3, f"invalid gzip body: {exc}", encoding, 400)
        except FleetscopeError as exc:
            return _status(3, str(exc), encoding, 400)
        except RecursionError:
            return _status(3, "request nested too deeply to decode", encoding, 400)
        try:
            # Through the ingest door: group-committed with the other pushes, logged, and alert evaluation
            # woken when it carries health events a rule reads. An exporter's retry of a body already
            # stored writes nothing.
            await app.state.door.accept_async(screen.Push("otlp:/v1/metrics", sha, ["otlp"], otlp=walk, nbytes=len(body), binding=token.binding))
        except screen.Forbidden as exc:
            return _status(7, str(exc), encoding, 403)  # google.rpc.Code PERMISSION_DENIED
        except door.Overloaded as exc:
            return _status(14, str(exc), encoding, 503, {"Retry-After": str(exc.retry_after_s)})
        except FleetscopeError as exc:
            return _status(3, str(exc), encoding, 400)
        except OperationalError:
            # Locked or unreachable database: retryable by the client, so say when to come back.
            return _status(14, "database busy, retry later", encoding, 503, {"Retry-After": "2"})
        n_rejected, why = otlp.rejected(walk)
        reasons = "; ".join(f"{n} × {w}" for w, n in list(why.items())[:10])
        content, media = otlp.response(n_rejected, reasons, encoding=encoding)
        return Response(content, 200, media_type=media)
    finally:
        _in_flight.exit()

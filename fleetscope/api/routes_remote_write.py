"""Prometheus remote write 1.0 receiver: ``POST /api/v1/write``.

Spec: https://prometheus.io/docs/specs/remote_write_spec/. The body is a ``prometheus.WriteRequest``
(protobuf), snappy block-compressed (``Content-Type: application/x-protobuf``, ``Content-Encoding: snappy``).
Answers as the spec asks of a receiver: 204 once the samples are written; 400 for a body that cannot be
decoded and 413 for one too large (not retryable: the sender drops it); 415 for another content type or
encoding (a remote write 2.0 ``io.prometheus.write.v2.Request`` included); 503 with ``Retry-After`` when the
server is saturated or the database busy (retryable: the sender backs off and resends the same body, which
the content-hash dedup then writes only once).

The decompressed size is read from the snappy preamble (the block format starts with the uncompressed
length as a varint) and refused past ``FLEETSCOPE_MAX_BODY_BYTES`` before anything is inflated. The body
then goes through the ingest door as format ``prometheus_remote_write``, like any other push.
"""

from __future__ import annotations


from typing import Annotated

from fastapi import APIRouter, Depends, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import PlainTextResponse, Response
from sqlalchemy.exc import OperationalError

from fleetscope import door
from fleetscope.services import auth
from fleetscope.api.inflight import InFlight
from fleetscope.api.security import require
from fleetscope.core.errors import ParseError
from fleetscope.door import ingestion, screen
from fleetscope.door.ingestion import TooLarge
import cramjam

router = APIRouter(tags=["remote write"])

SOURCE = "prometheus-remote-write:/api/v1/write"
FORMAT = "prometheus_remote_write"
# Requests being decoded or waiting at the door at once; past this the sender is told to come back (503 +
# Retry-After) rather than queued behind work it would time out on. Prometheus runs up to max_shards
# senders, and a fleet's vmagents more.
MAX_IN_FLIGHT = 64
_in_flight = InFlight(MAX_IN_FLIGHT)


class SnappyError(Exception):
    """A body that says snappy and is not."""


def snappy_uncompressed_bytes(body: bytes) -> int:
    """The uncompressed length a snappy block states in its preamble, a varint
    (https://github.com/google/snappy/blob/main/format_description.txt). Read up to protobuf's 10 bytes,
    so that a preamble claiming more than the 32 bits snappy allows (10 GB, say) is refused as too large;
    the decompressor refuses what is not a snappy block."""
    result = 0
    for i, b in enumerate(body[:10]):
        result |= (b & 0x7F) << (7 * i)
        if b < 0x80:
            return result
    raise SnappyError("snappy preamble (the uncompressed length varint) is missing or unterminated")


def unsnappy(body: bytes, limit: int) -> bytes:
    """The decompressed body; ``SnappyError`` when it is not a snappy block, ``ingestion.TooLarge`` when
    its preamble claims more than ``limit`` bytes (checked before inflating anything)."""


    size = snappy_uncompressed_bytes(body)
    if size > limit:
        raise TooLarge(f"snappy body would decompress to {size} bytes, over the limit of {limit} bytes (FLEETSCOPE_MAX_BODY_BYTES)")
    try:
        data = bytes(cramjam.snappy.decompress_raw(body))
    except cramjam.DecompressionError as exc:
        raise SnappyError(f"invalid snappy block: {exc}") from None
    if len(data) != size:  # cramjam checks this too; a short or long block must never pass as a request
        raise SnappyError(f"snappy block decompressed to {len(data)} bytes, its preamble says {size}")
    return data


def _media_type_error(request: Request) -> str | None:
    ctype, *params = (p.strip() for p in request.headers.get("content-type", "").split(";"))
    if ctype.lower() != "application/x-protobuf":
        return f"unsupported content type {ctype[:100]!r}: remote write 1.0 sends application/x-protobuf"
    for p in params:
        key, _, value = p.partition("=")
        if key.strip().lower() == "proto" and value.strip() != "prometheus.WriteRequest":
            return f"unsupported protobuf message {value.strip()[:100]!r}: this receiver speaks remote write 1.0 (prometheus.WriteRequest)"
    encoding = request.headers.get("content-encoding", "").strip().lower()
    if encoding != "snappy":
        return f"unsupported content encoding {encoding[:100]!r}: remote write bodies are snappy-compressed (Content-Encoding: snappy)"
    return None


@router.post("/api/v1/write", status_code=204,
             responses={400: {"description": "undecodable body (not retried)"}, 413: {"description": "too large"},
                        415: {"description": "not remote write 1.0"}, 503: {"description": "busy; retry after Retry-After"}})
async def remote_write(request: Request, token: Annotated[auth.Token, Depends(require("ingest"))]) -> Response:
    """Receive Prometheus remote write 1.0 (Prometheus, vmagent, the OTel Collector's prometheusremotewrite
    exporter): dcgm-exporter series become gpu_sample, gpu, gpu_workload, health_event and metric_sample rows."""

    problem = _media_type_error(request)
    if problem:
        return PlainTextResponse(problem, 415)
    body = await request.body()  # before taking a place: a slow sender holds its connection, not a place
    if not _in_flight.enter():
        return PlainTextResponse("server saturated, retry later", 503, headers={"Retry-After": "1"})
    try:
        if not body:
            return PlainTextResponse("empty body: expected a snappy-compressed prometheus.WriteRequest", 400)
        limit = request.app.state.settings.max_body_bytes

        def prepare() -> screen.Push:
            # Inflating and parsing in a worker thread: a large request takes tens of ms of CPU.
            push = ingestion.to_push(unsnappy(body, limit), source=SOURCE, fmt=FORMAT)
            push.binding = token.binding
            return push

        try:
            push = await run_in_threadpool(prepare)
            # Through the ingest door: group-committed, logged, alert evaluation woken for health events.
            await request.app.state.door.accept_async(push)
        except ingestion.TooLarge as exc:
            return PlainTextResponse(str(exc), 413)
        except (ParseError, SnappyError) as exc:
            return PlainTextResponse(str(exc), 400)
        except door.Overloaded as exc:
            return PlainTextResponse(str(exc), 503, headers={"Retry-After": str(exc.retry_after_s)})
        except OperationalError:
            # Locked or unreachable database: retryable, so say when to come back.
            return PlainTextResponse("database busy, retry later", 503, headers={"Retry-After": "2"})
    finally:
        _in_flight.exit()
    return Response(status_code=204)

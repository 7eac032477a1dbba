"""Generic batch ingest and frame reads: the canonical frames over HTTP as JSON."""

from __future__ import annotations

import datetime as dt
from typing import Annotated, Any

import orjson
import polars as pl
from fastapi import APIRouter, Depends, HTTPException, Path, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, Response
from sqlalchemy.exc import OperationalError
from pydantic import AwareDatetime, BaseModel, ConfigDict, Field

from fleetscope import door
from fleetscope.services import auth
from fleetscope.core import frames as F
from fleetscope.api import jsonbody
from fleetscope.api.security import require
from fleetscope.core.errors import ValidationError
from fleetscope.core.textinput import has_control
from fleetscope.core.units import check_window
from fleetscope.observability import INGEST_REFUSED_OVERLOAD
from fleetscope.store import content_hash
from ingest import dcgm_lines
from fleetscope.door import ingestion, screen
from fleetscope.services import energy as es
from fleetscope.services.energy import energy_report
from fleetscope.services.energy import fleet_productivity
from fleetscope.services.energy import model_footprint
from fleetscope.services.energy import site_pue
from fleetscope.services.health import health_window
from fleetscope.services.reliability import UnknownJob, reliability_report
from pydantic import ValidationError as BodyError

router = APIRouter(prefix="/api/v1", tags=["data"], route_class=jsonbody.CheckedRoute)

MAX_READ_ROWS = 100_000
# Bodies up to this size are made ready on the event loop (see post_ingest).
SMALL_BODY_BYTES = 64 * 1024
MAX_PARTS = 10**9  # more GPUs than any fleet has; A^N of anything larger is a typo or an attack


def claimed_source(token: auth.Token | None, given: str | None) -> str:
    """The source a push is recorded under: the one given, else the token's bound one, else ``api``;
    400 where it holds a control character, 403 where the token is bound to another."""
    if given is not None and has_control(given):
        raise HTTPException(400, "source must be text without control characters")
    bound = token.binding.source if token is not None and token.binding is not None else None
    if bound is not None and given not in (None, "", bound):
        raise HTTPException(403, f"the push claims source {given[:200]!r}, and the token {token.name!r} is bound to source {bound!r}")  # type: ignore[index,union-attr]
    return given or bound or "api"


def binding_of(token: auth.Token | None) -> auth.Binding | None:
    return token.binding if token is not None else None


@router.post("/batches")
async def post_batch(request: Request, token: Annotated[auth.Token, Depends(require("ingest"))]) -> JSONResponse:
    """Write one Batch given as ``{"source": "...", "frames": {"gpu_sample": [{...}, ...], ...}}``.

    All frames are written in one transaction, or none: a bad record anywhere gets 422 naming the frame,
    the record (0-based) and the field. Records whose natural key is already stored are skipped, so a
    re-sent batch writes nothing new. The ``ingest`` scope writes raw frames (``auth.RAW_FRAMES``); derived
    ones (findings, analyses, roll-ups, sites) need ``admin``: 403 names the frame.
    """
    body = await request.body()
    doc = jsonbody.loads(body, request.app.state.settings.max_json_depth)
    if not isinstance(doc, dict) or not isinstance(doc.get("frames"), dict):
        raise HTTPException(400, 'expected {"source": "...", "frames": {"<frame>": [records]}}')
    source = doc.get("source")
    if source is not None and (not isinstance(source, str) or len(source) > 2000):
        raise HTTPException(400, "source must be a string of at most 2000 characters")
    batch = F.Batch(source=claimed_source(token, source))
    for name in doc["frames"]:
        if name not in F.FRAMES:
            raise HTTPException(400, f"unknown frame {str(name)[:100]!r}: expected some of {', '.join(F.FRAMES)}")
        if not token.may_write(name):
            raise HTTPException(403, f"frame {name!r} is derived by the service or declared by an operator: writing it needs the 'admin' scope, "
                                     f"and token {token.name!r} has {' '.join(sorted(token.scopes))}")
    for name, records in doc["frames"].items():
        if not isinstance(records, list):
            raise HTTPException(400, f"frames.{name} must be a list of records")
        setattr(batch, name, F.from_records(F.FRAMES[name], records))
    push = screen.Push(batch.source, content_hash(body), ["batch"], batch=batch, nbytes=len(body), dedupe=False, binding=binding_of(token))
    accepted = await accept(request.app, push)
    return JSONResponse(accepted.result.to_dict())


async def accept(app: Any, push: screen.Push) -> door.Accepted:
    """Through the app's ingest door; 503 with ``Retry-After`` when it is full or the database is busy
    (retryable: nothing of the push was stored)."""
    try:
        return await app.state.door.accept_async(push)
    except door.Overloaded as exc:
        raise HTTPException(503, str(exc), headers={"Retry-After": str(exc.retry_after_s)}) from None
    except OperationalError:
        raise HTTPException(503, "database busy or unreachable; retry shortly", headers={"Retry-After": "2"}) from None


@router.get("/frames/{frame}", dependencies=[Depends(require("read"))])
def get_frame(
    request: Request,
    frame: str,
    start: Annotated[dt.datetime | None, Query(description="inclusive lower bound of the frame's time column (RFC 3339)")] = None,
    end: Annotated[dt.datetime | None, Query(description="exclusive upper bound")] = None,
    job_id: Annotated[list[str] | None, Query()] = None,
    host: Annotated[list[str] | None, Query()] = None,
    gpu_uuid: Annotated[list[str] | None, Query()] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_READ_ROWS)] = 10_000,
) -> Response:
    """Rows of one canonical frame as a JSON array, oldest first, at most ``limit`` rows."""
    if frame not in F.FRAMES:
        raise HTTPException(404, f"unknown frame {frame[:100]!r}: expected one of {', '.join(F.FRAMES)}")
    spec = F.FRAMES[frame]
    for name, value in (("job_id", job_id), ("host", host), ("gpu_uuid", gpu_uuid)):
        if value is not None and name not in spec.schema and not (frame == "gpu_sample" and name == "job_id"):
            raise HTTPException(400, f"{frame} cannot be filtered by {name}")
    if start and end and end <= start:
        raise HTTPException(400, "end must be after start")
    df: pl.DataFrame = request.app.state.store.read(frame, start=start, end=end, job_id=job_id, host=host, gpu_uuid=gpu_uuid, limit=limit)
    return Response(df.write_json(), media_type="application/json", headers={"X-Row-Count": str(df.height)})


@router.get("/counts", dependencies=[Depends(require("read"))])
def get_counts(request: Request) -> dict[str, int]:
    """Rows held per canonical table."""
    return request.app.state.store.counts()


@router.post("/ingest/{fmt}")
async def post_ingest(
    request: Request,
    fmt: str,
    token: Annotated[auth.Token, Depends(require("ingest"))],
    source: Annotated[str | None, Query(max_length=2000, description="recorded as the push's source (default: the token's bound source, else api)")] = None,
    job_id: Annotated[str | None, Query(max_length=500)] = None,
    ts: Annotated[dt.datetime | None, Query(description="timestamp for formats without their own (RFC 3339, with zone)")] = None,
) -> JSONResponse:
    """Ingest a file in a named format (``auto`` detects it), raw in the body, gzip allowed.

    The whole input is written in one transaction or not at all: unparseable input gets 400 naming
    the line and field, a bad value 422, and nothing is written. An agent's small push is usually answered
    by ``fleetscope.api.fastlane`` through the same ``ingest_body``.
    """
    encoding = request.headers.get("content-encoding", "")
    check_encoding(encoding)
    return await ingest_body(request.app, fmt, await request.body(), source=source, job_id=job_id, ts=ts, token=token, content_encoding=encoding)


CODINGS = ("", "identity", "gzip")


def check_encoding(encoding: str) -> None:
    """415 for a content coding the ingest does not undo (RFC 9110 §15.5.16): reading a Brotli or
    deflate body as plain text would store garbage or refuse it for the wrong reason."""
    if encoding.strip().lower() not in CODINGS:
        raise HTTPException(415, f"unsupported Content-Encoding {encoding[:100]!r}: send the body as is or gzip-compressed")


async def ingest_body(app: Any, fmt: str, body: bytes, *, source: str | None, job_id: str | None, ts: dt.datetime | None,
                      token: auth.Token | None = None, content_encoding: str = "") -> JSONResponse:
    """What ``POST /api/v1/ingest/{fmt}`` does once its token and query are checked: HTTPException for a
    refusal, FleetscopeError for bad input. Gzip is recognised by its magic bytes (agents and files may be
    compressed without saying so); a body declared gzip must be gzip."""

    if content_encoding.strip().lower() == "gzip" and not body.startswith(ingestion.GZIP_MAGIC):
        raise HTTPException(400, "Content-Encoding: gzip, but the body does not start with gzip's magic bytes")
    source = claimed_source(token, source)
    if fmt != "auto" and fmt not in ingestion.FORMATS:
        raise HTTPException(404, f"unknown format {fmt[:100]!r}: expected auto or one of {', '.join(ingestion.FORMATS)}")
    if ts is not None and ts.tzinfo is None:
        raise HTTPException(400, "ts needs a time zone")
    if not body:
        raise HTTPException(400, "empty body")
    limit = app.state.settings.max_body_bytes
    received = dt.datetime.now(dt.UTC)
    opts = ingestion.Options(job_id=job_id, ts=ts)

    def inflate(cap: int = limit) -> tuple[bytes, list[str]]:
        # A gzip body is inflated here, within the body limit, so no parser ever holds a bomb's output;
        # a Kineto trace stays compressed: its parser inflates it a piece at a time, whatever its size.
        formats = ingestion.resolve(body, source=source, fmt=fmt)
        if body.startswith(ingestion.GZIP_MAGIC) and formats != ["kineto"]:
            return ingestion.gunzip_capped(body, cap, source), formats
        return body, formats

    def prepare(data: bytes, formats: list[str]) -> screen.Push:
        return ingestion.to_push(data, source=source, fmt=fmt, opts=opts, now=received, formats=formats, received=body)

    try:
        # A node's push (tens of kB) is inflated and sniffed here, and a small dcgm body left for the door's
        # writer to read: a hop to the thread pool costs more than that. Anything else is parsed off the
        # event loop.
        if len(body) <= SMALL_BODY_BYTES:
            try:
                data, formats = inflate(min(limit, dcgm_lines.MAX_BYTES))
            except ingestion.TooLarge:
                # a few kB that inflate past what a node sends (a bomb, or a file): inflated off the event loop,
                # which would otherwise stop for the 30-60 ms a 64 MiB inflate takes
                if limit <= dcgm_lines.MAX_BYTES:
                    raise
                data, formats = await run_in_threadpool(inflate)
        else:
            data, formats = await run_in_threadpool(inflate)
        if len(body) <= SMALL_BODY_BYTES and formats == ["dcgm"] and len(data) <= dcgm_lines.MAX_BYTES:
            push = prepare(data, formats)
            screen.read_lines(push)
        else:
            push = await _parsed(app, len(data), lambda: prepare(data, formats))
    except ingestion.UnknownFormat as exc:
        raise HTTPException(415, str(exc)) from None
    except ingestion.TooLarge as exc:
        raise HTTPException(413, str(exc)) from None
    except RecursionError:
        # A parser that recurses on nesting (JSON formats) met a body nested past Python's stack limit.
        raise HTTPException(400, f"{source[:200]}: input nested too deeply to read") from None
    push.binding = binding_of(token)
    accepted = await accept(app, push)
    return Response(orjson.dumps(ingestion.outcome_of(accepted).to_dict(), default=str), media_type="application/json")


_parsing = {"bytes": 0}  # input being parsed now in this process; changed on the event loop only


async def _parsed(app: Any, nbytes: int, work: Any) -> screen.Push:
    """``work`` (a parse of ``nbytes`` of input) in a worker thread, within this process's budget of input being
    parsed at once (``FLEETSCOPE_INGEST_MAX_PENDING_MB``, the door's own for what waits to be written): past it,
    503 with Retry-After. The door counts pushes only once parsed, and a parse holds several times its input: 44
    gzip bodies of 64 KiB, each 64 MiB of blank lines once inflated, took a server past 23 GB. One input larger than
    the budget is still read when it is the only one."""
    budget = app.state.settings.ingest_max_pending_mb * 2**20
    if _parsing["bytes"] and _parsing["bytes"] + nbytes > budget:
        INGEST_REFUSED_OVERLOAD.inc()
        raise HTTPException(503, f"{_parsing['bytes'] >> 20} MiB of input are being read; retry later", headers={"Retry-After": "1"})
    _parsing["bytes"] += nbytes
    try:
        return await run_in_threadpool(work)
    finally:
        _parsing["bytes"] -= nbytes


@router.get("/energy", dependencies=[Depends(require("read"))])
def get_energy(
    request: Request,
    start: Annotated[dt.datetime, Query(description="inclusive start (RFC 3339)")],
    end: Annotated[dt.datetime, Query(description="exclusive end")],
    by: Annotated[list[str], Query(description="group by: job_id, rank, gpu_uuid, host, site_id, gpu_model, model_name, job_kind, minute, hour, day")] = ["site_id"],  # noqa: B006
) -> Response:
    """Energy (J and kWh) from the per-minute roll-ups, grouped; with ``by=site_id``, location-based kgCO2e
    and the grid-intensity basis used."""

    if end <= start:
        raise HTTPException(400, "end must be after start")
    try:
        df = energy_report(request.app.state.store, start, end, by)
    except ValueError as exc:
        raise HTTPException(400, str(exc)) from None
    return Response(df.write_json() if df.width else "[]", media_type="application/json")


@router.get("/energy/productivity", dependencies=[Depends(require("read"))])
def get_energy_productivity(
    request: Request,
    start: Annotated[dt.datetime, Query(description="inclusive start (RFC 3339)")],
    end: Annotated[dt.datetime, Query(description="exclusive end")],
) -> dict[str, Any]:
    """Fleet energy productivity ρ = useful FLOPs / J over the period, idle GPU energy included."""

    if end <= start:
        raise HTTPException(400, "end must be after start")
    return fleet_productivity(request.app.state.store, start, end)


@router.get("/findings", dependencies=[Depends(require("read"))])
def get_findings(
    request: Request,
    kind: Annotated[list[str] | None, Query()] = None,
    analyzer: Annotated[list[str] | None, Query()] = None,
    severity: Annotated[list[str] | None, Query()] = None,
    subject_prefix: Annotated[str | None, Query(max_length=500, description="e.g. gpu:GPU-1234 or job:train-7/")] = None,
    start: dt.datetime | None = None,
    end: dt.datetime | None = None,
    limit: Annotated[int, Query(ge=1, le=MAX_READ_ROWS)] = 1000,
) -> Response:
    """What the analyzers concluded, newest window first: kind, subject, severity, score, summary, evidence."""
    df = request.app.state.store.read("finding", start=start, end=end)
    for col, values in (("kind", kind), ("analyzer", analyzer), ("severity", severity)):
        if values:
            df = df.filter(pl.col(col).is_in(values))
    if subject_prefix:
        df = df.filter(pl.col("subject").str.starts_with(subject_prefix))
    df = df.sort("window_start", descending=True).head(limit)
    return Response(df.write_json(), media_type="application/json", headers={"X-Row-Count": str(df.height)})


@router.get("/health", dependencies=[Depends(require("read"))])
def get_health(
    request: Request,
    start: Annotated[dt.datetime, Query()],
    end: Annotated[dt.datetime, Query()],
    level: Annotated[str, Query(pattern="^(gpu|node)$")] = "gpu",
) -> Response:
    """Health score (0-100), recommendation and reasons per GPU or node over a window of at most a day."""

    try:
        out = health_window(request.app.state.store, start, end, write=False, hang_min_stall_s=request.app.state.settings.hang_min_stall_s,
                              idle_min_s=request.app.state.settings.idle_allocation_min_s)
    except ValueError as exc:
        raise HTTPException(400, str(exc)) from None
    df = out["gpus" if level == "gpu" else "nodes"]
    return Response(df.write_json() if df.width else "[]", media_type="application/json")


@router.get("/reliability", dependencies=[Depends(require("read"))])
def get_reliability(
    request: Request,
    start: Annotated[dt.datetime, Query(description="inclusive start (RFC 3339, with a zone)")],
    end: Annotated[dt.datetime, Query(description="exclusive end; at most 366 days after start")],
    job_id: Annotated[str | None, Query(min_length=1, max_length=256, description="one job only")] = None,
    parts: Annotated[int | None, Query(ge=1, le=MAX_PARTS, description="N for the all-up availability A^N (default: the job's GPUs)")] = None,
    part_availability: Annotated[float | None, Query(ge=0.0, le=1.0, allow_inf_nan=False, description="A per part (default: measured)")] = None,
) -> dict[str, Any]:
    """Interruptions by root cause (Llama 3 categories), MTBF per GPU-hour and per job, all-up availability
    A^N, and Young/Daly checkpoint advice per job, over [start, end)."""

    try:
        return reliability_report(request.app.state.store, start, end, job_id=job_id, parts=parts, part_availability=part_availability)
    except UnknownJob as exc:
        raise HTTPException(404, str(exc)) from None
    except ValueError as exc:
        raise HTTPException(400, str(exc)) from None


@router.get("/sites/{site_id}/pue", dependencies=[Depends(require("read"))])
def get_pue(request: Request, site_id: str, start: Annotated[dt.datetime, Query()], end: Annotated[dt.datetime, Query()]) -> dict[str, Any]:
    """PUE over a window with its ISO/IEC 30134-2 category, or the declared PUE marked as an estimate."""

    _window(start, end)
    try:
        return site_pue(request.app.state.store, site_id, start, end)
    except ValueError as exc:
        raise HTTPException(404, str(exc)) from None


def _window(start: dt.datetime, end: dt.datetime) -> None:
    try:
        check_window(start, end)
    except ValueError as exc:
        raise HTTPException(400, str(exc)) from None


SiteId = Annotated[str, Path(min_length=1, max_length=200)]
InstrumentId = Annotated[str, Path(min_length=1, max_length=200, description="contract or certificate id")]


class InstrumentIn(BaseModel):
    """A contractual instrument as the admin API takes it; ``analyzers.carbon.check_instrument`` checks the rest."""

    model_config = ConfigDict(extra="forbid")
    kind: str = Field(max_length=50, description="ppa, virtual_ppa, rec, go, i_rec, green_tariff or supplier_specific")
    start: AwareDatetime = Field(description="start of the consumption period it applies to (RFC 3339, with zone)")
    end: AwareDatetime = Field(description="end of that period, exclusive")
    volume_mwh: float = Field(strict=True, description="electricity it conveys over [start, end), MWh")
    g_per_kwh: float = Field(strict=True, description="its emission factor, gCO2e/kWh")
    supplier: str | None = Field(default=None, max_length=500)


@router.put("/sites/{site_id}/instruments/{instrument_id}", openapi_extra={
    "requestBody": {"required": True, "content": {"application/json": {"schema": InstrumentIn.model_json_schema()}}}})
async def put_instrument(request: Request, site_id: SiteId, instrument_id: InstrumentId,
                         token: Annotated[auth.Token, Depends(require("admin"))]) -> JSONResponse:
    """Record a PPA, certificate (REC, GO, I-REC), green tariff or supplier-specific rate the site holds for a
    period, for market-based Scope 2; re-sending it updates it. 400 for a body that is not JSON, 422 naming a
    bad field, 404 for an unknown site, 409 for an id another site already claims; none of them changes
    anything. Kept with the token's name and appended to the audit log."""


    try:
        body = InstrumentIn.model_validate(jsonbody.loads(await request.body(), request.app.state.settings.max_json_depth))
    except BodyError as exc:
        # without the input echoed back: it may hold NaN or Infinity, which JSON cannot carry
        return JSONResponse({"detail": exc.errors(include_input=False, include_context=False, include_url=False)}, 422)
    try:
        out = await run_in_threadpool(es.record_instrument, request.app.state.store,
                                      {"instrument_id": instrument_id, "site_id": site_id, **body.model_dump()}, recorded_by=token.name)
    except ValidationError as exc:
        raise HTTPException(422, str(exc)) from None
    except es.NotFound as exc:
        raise HTTPException(404, str(exc)) from None
    except es.Conflict as exc:
        raise HTTPException(409, str(exc)) from None
    return JSONResponse(out, 200 if out["updated"] else 201)


@router.get("/sites/{site_id}/instruments", dependencies=[Depends(require("read"))])
def get_instruments(request: Request, site_id: SiteId) -> Response:
    """The contractual instruments recorded for a site, by start of period."""

    df = es.instruments(request.app.state.store, [site_id])
    return Response(df.write_json(), media_type="application/json", headers={"X-Row-Count": str(df.height)})


@router.delete("/sites/{site_id}/instruments/{instrument_id}")
def delete_instrument(request: Request, site_id: SiteId, instrument_id: InstrumentId,
                      token: Annotated[auth.Token, Depends(require("admin"))]) -> dict[str, Any]:
    """Withdraw an instrument recorded in error (logged to the audit log); 404 where the site holds none."""

    try:
        return es.withdraw_instrument(request.app.state.store, site_id, instrument_id, actor=token.name)
    except es.NotFound as exc:
        raise HTTPException(404, str(exc)) from None


@router.get("/sites/{site_id}/carbon", dependencies=[Depends(require("read"))])
def get_site_carbon(request: Request, site_id: SiteId, start: Annotated[dt.datetime, Query()], end: Annotated[dt.datetime, Query()]) -> dict[str, Any]:
    """Scope 2 of a site over [start, end): location-based and market-based kgCO2e side by side (GHG Protocol
    Scope 2 Guidance dual reporting), the energy and PUE they rest on, and each instrument used."""

    _window(start, end)
    try:
        return es.site_carbon(request.app.state.store, site_id, start, end)
    except es.NotFound as exc:
        raise HTTPException(404, str(exc)) from None
    except ValidationError as exc:  # the stored inventory cannot give a figure (a declared PUE below 1)
        raise HTTPException(422, str(exc)) from None


@router.get("/models/{name}/serving-vs-training", dependencies=[Depends(require("read"))])
def get_serving_vs_training(request: Request, name: Annotated[str, Path(max_length=500)],
                            projection_days: Annotated[int, Query(ge=1, le=3650)] = 28) -> dict[str, Any]:
    """A model's training energy against its cumulative serving energy, and the date serving passes
    training: observed, or projected at the recent serving rate."""

    try:
        return es.serving_vs_training(request.app.state.store, name, projection_days=projection_days)
    except es.NotFound as exc:
        raise HTTPException(404, str(exc)) from None


@router.get("/models/{name}/footprint", dependencies=[Depends(require("read"))])
def get_footprint(request: Request, name: str) -> dict[str, Any]:
    """A model's training compute, time, energy and CO2e (Annex XI 1.2(d)-(e)), each with its basis."""

    try:
        return model_footprint(request.app.state.store, name)
    except ValueError as exc:
        raise HTTPException(404, str(exc)) from None

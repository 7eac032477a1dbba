"""Application factory, middleware and the service's own endpoints (health, metrics)."""

from __future__ import annotations

import datetime as dt
import logging
import time
from typing import Any

import polars as pl
from fastapi import Depends, FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from sqlalchemy import func, select, text
from starlette.requests import ClientDisconnect

from fleetscope import __version__, door
from fleetscope.door import ingestion
from fleetscope.store import db
from fleetscope.store import schema
from fleetscope import settings as settings_mod
from fleetscope.api import fastlane
from fleetscope.api.errors import error_response, too_large
from fleetscope.api.gate import Gate
from fleetscope.api.security import require
from fleetscope.core.errors import FleetscopeError
from fleetscope.observability import REGISTRY, REQUEST_SECONDS, setup_tracing
from fleetscope.store import Store, reads_on_replica
from fleetscope.services import audit as audit_service
from fleetscope.services import pipeline
from fleetscope.api import (routes_alerts, routes_audit, routes_data, routes_fabric, routes_fleet, routes_governance, routes_jobs,
                            routes_otlp, routes_remote_write, routes_serving, routes_teams, routes_tokens)
from fleetscope.api.routes_alerts import kick_evaluation
from fleetscope.services.energy_rollup import reroll_jobs
from prometheus_client import CollectorRegistry

log = logging.getLogger(__name__)

class BodyLimit:
    """Refuse bodies over ``limit`` bytes with 413 before the endpoint reads them: by Content-Length
    when it is given, and by counting as the body streams in when it is not (chunked uploads)."""

    def __init__(self, app, limit: int):  # type: ignore[no-untyped-def]
        self.app = app
        self.limit = limit

    async def __call__(self, scope, receive, send):  # type: ignore[no-untyped-def]
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        for name, value in scope.get("headers", []):
            if name == b"content-length":
                try:
                    too_big = int(value) > self.limit
                except ValueError:
                    return await JSONResponse({"detail": "invalid Content-Length header"}, 400)(scope, receive, send)
                if too_big:
                    return await too_large(self.limit)(scope, receive, send)
        seen = 0

        async def counted():  # type: ignore[no-untyped-def]
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.limit:
                    raise _BodyTooLarge()
            return message

        started = False

        async def tracked_send(message):  # type: ignore[no-untyped-def]
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counted, tracked_send)
        except Exception as exc:
            # Middleware built on BaseHTTPMiddleware re-raises inside an ExceptionGroup.
            if not _caused_by_limit(exc) or started:
                raise
            await too_large(self.limit)(scope, receive, send)


class RequestTiming:
    """Request latency by method, route and status (fleetscope_http_request_duration_seconds), from the
    request's arrival to the last byte of its response; background tasks run after that are not counted.

    Plain ASGI rather than Starlette's BaseHTTPMiddleware, which relays every chunk of the request body
    through a memory stream between two tasks: with it, a 17 MB gzip scrape's post took 0.045 s to reach
    the ingest on an idle machine (0.11 s with the CPUs shared), without it 0.034 s (0.04 s).
    """

    def __init__(self, app):  # type: ignore[no-untyped-def]
        self.app = app

    async def __call__(self, scope, receive, send):  # type: ignore[no-untyped-def]
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        start = time.perf_counter()
        status = 500

        async def timed_send(message):  # type: ignore[no-untyped-def]
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                # The router has put the matched route in the scope by now.
                route = scope.get("route")
                REQUEST_SECONDS.labels(scope["method"], getattr(route, "path", "unmatched"), str(status)).observe(time.perf_counter() - start)

        await self.app(scope, receive, timed_send)


class ReadsOnReplica:
    """GET and HEAD requests read from the store's read replica (``FLEETSCOPE_READ_DATABASE_URL``) where it has
    one; every other method, and whatever a GET writes, stays on the primary. The choice rides in a context
    variable that the thread pool's workers inherit (``store.reads_on_replica``)."""

    def __init__(self, app):  # type: ignore[no-untyped-def]
        self.app = app

    async def __call__(self, scope, receive, send):  # type: ignore[no-untyped-def]
        if scope["type"] == "http" and scope["method"] in ("GET", "HEAD"):
            with reads_on_replica():
                return await self.app(scope, receive, send)
        return await self.app(scope, receive, send)


class _BodyTooLarge(Exception):
    pass


def _caused_by_limit(exc: BaseException) -> bool:
    if isinstance(exc, _BodyTooLarge):
        return True
    if isinstance(exc, BaseExceptionGroup):
        return any(_caused_by_limit(e) for e in exc.exceptions)
    return False


class FleetscopeAPI(FastAPI):
    """FastAPI with the gate (``api.gate``: head size, token, scope, rate) in front of everything, then the
    agents' lane (``api.fastlane``): a plain ingest push is answered there, everything else as FastAPI
    would. Nothing of a body is read before the gate has let its request through."""

    # Every this many requests one answer says ``Connection: close`` (0: never); ``serve --workers N`` sets it.
    rebalance_every = 0
    _served = 0

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:  # type: ignore[override]
        if scope["type"] == "http":
            start = time.perf_counter()
            if self.rebalance_every:
                self._served += 1
                if self._served % self.rebalance_every == 0:
                    send = _closing(send)
            gate: Gate | None = getattr(self.state, "gate", None)
            refusal = await gate.refuse(scope) if gate is not None else None
            if refusal is not None:
                await refusal(scope, receive, send)
                REQUEST_SECONDS.labels(scope["method"], "refused by the gate", str(refusal.status_code)).observe(time.perf_counter() - start)
                return
            if await fastlane.handle(self, scope, receive, send):
                return
        await super().__call__(scope, receive, send)


def _closing(send: Any) -> Any:
    """``send`` whose response asks the client to close the connection after it (RFC 9112 §9.6).

    The API's worker processes share one listening socket, and asyncio accepts every connection waiting at
    once: when a fleet's agents reconnect together (after a restart, or a load balancer's), one process takes
    most of them and keeps them, busy on one core while the other idles (four fifths of a run's samples in one
    of two processes, profiled). Closing one connection in so many, as nginx's ``keepalive_requests`` does,
    lets its client reconnect to whichever process is free to accept it first, the idler one, so the
    connections spread out within a few seconds. An HTTP client reconnects for its next request by itself."""

    async def wrapped(message: dict) -> None:
        if message["type"] == "http.response.start":
            message = {**message, "headers": [*message.get("headers", ()), (b"connection", b"close")]}
        await send(message)

    return wrapped


class _TaskRunCollector:
    """Task outcomes recorded by the workers (table task_run), exposed as a counter at scrape time:
    workers run in other processes, so their in-memory counters are not this process's to read."""

    def __init__(self, store: Store):
        self.store = store

    def collect(self):  # type: ignore[no-untyped-def]
        fam = CounterMetricFamily("fleetscope_task_runs", "Celery task runs recorded by workers, by task and state", labels=["task", "state"])
        t = schema.task_run
        try:
            with self.store.engine.connect() as conn:
                for task, state, n in conn.execute(select(t.c.task, t.c.state, func.count()).group_by(t.c.task, t.c.state)):
                    fam.add_metric([task, state], n)
        except Exception:  # noqa: BLE001 - a scrape must not fail because the database blinked
            pass
        yield fam


class _PipelineCollector:
    """How far each roll-up stage is behind, whether it is late, whether beat has a leader and how many closed
    days wait to be packed (``services.pipeline``), read from watermarks at scrape time, so a site's own
    Prometheus can alert on the service falling behind."""

    def __init__(self, store: Store):
        self.store = store

    def collect(self):  # type: ignore[no-untyped-def]
        lag = GaugeMetricFamily("fleetscope_pipeline_lag_seconds", "Seconds the stage's newest rolled instant is behind the newest push (or now, while pushes arrive)", labels=["stage"])
        late = GaugeMetricFamily("fleetscope_pipeline_late", "1 when the stage is behind by more than its allowance", labels=["stage"])
        try:
            report = pipeline.status(self.store, dt.datetime.now(dt.UTC), tasks=False)
        except Exception:  # noqa: BLE001 - a scrape must not fail because the database blinked
            return
        for st in report["stages"]:
            if st["lag_s"] is not None:
                lag.add_metric([st["stage"]], st["lag_s"])
            late.add_metric([st["stage"]], float(st["late"]))
        yield lag
        yield late
        yield GaugeMetricFamily("fleetscope_beat_leading", "1 while a beat holds an unexpired leader lease", value=float(report["beat"]["leading"]))
        yield GaugeMetricFamily("fleetscope_packing_pending_days", "Closed days of raw telemetry waiting to be packed (PostgreSQL)",
                                value=len(report["packing_pending_days"]))
        yield GaugeMetricFamily("fleetscope_packing_overdue_hours",
                                "Hours of the day under way still raw an hour after beat should have packed them (PostgreSQL)",
                                value=len(report["packing_overdue_hours"]))
        yield GaugeMetricFamily("fleetscope_energy_packing_pending_days",
                                "Closed days of per-GPU energy minutes waiting to be packed (PostgreSQL; at most 30 counted)",
                                value=len(report["energy_packing_pending_days"]))


def create_app(settings: settings_mod.Settings | None = None, store: Store | None = None) -> FastAPI:
    settings = settings or settings_mod.load()
    setup_tracing(settings.otel_exporter, settings.otel_endpoint, "fleetscope-api")
    if store is None:
        store = Store(db.make_engine(settings.database_url), db.make_engine(settings.read_database_url) if settings.read_database_url else None)
        db.ensure_schema(settings, store.engine)

    app = FleetscopeAPI(
        title="Fleetscope",
        version=__version__,
        description="Observability, ops and governance for GPU training and serving fleets.",
    )
    app.state.settings = settings
    app.state.store = store

    audit_service.bind(store, settings)  # the audit log's key and checkpoints are this app's settings'
    # The format modules are imported now, not by the first push that names a format: a fleet's agents all push
    # at once after a restart, and the first ones waited a tenth of a second for the imports.
    ingestion.registry()
    routes_alerts.warm(app)
    app.state.door = door.Door(
        store, window_s=settings.group_commit_ms / 1000, max_pending=settings.ingest_max_pending,
        max_pending_bytes=settings.ingest_max_pending_mb * 2**20, after_commit=lambda health, jobs: _after_commit(app, health, jobs),
        max_future_skew_s=settings.max_future_skew_s, writers=settings.ingest_writers,
    )
    app.state.gate = Gate(app, settings)
    app.router.on_shutdown.append(app.state.door.close)
    store.checkpoint_in_background()
    app.router.on_shutdown.append(store.stop_checkpointing)

    app.add_middleware(ReadsOnReplica)
    app.add_middleware(RequestTiming)
    app.add_middleware(BodyLimit, limit=settings.max_body_bytes)

    @app.exception_handler(RequestValidationError)
    async def _request_validation(_request: Request, exc: RequestValidationError) -> JSONResponse:
        # FastAPI's own handler echoes each bad value back ("input"). That turns a body carrying the bare
        # NaN/Infinity tokens Python's JSON reader accepts into a 500 (they are not JSON), and hands hostile
        # input back to the caller; where and why is enough.
        detail = [{"loc": list(e.get("loc", ())), "msg": str(e.get("msg", "")), "type": str(e.get("type", ""))} for e in exc.errors()]
        return JSONResponse({"detail": detail}, 422)

    @app.exception_handler(ClientDisconnect)
    async def _client_gone(_request: Request, _exc: ClientDisconnect) -> Response:
        # The client went away before its body's end (or was cut off by `fleetscope serve`'s body deadline):
        # nothing was stored and no one is left to answer. Not the service's error, so no traceback in its log:
        # any client with a token could fill the log with them. 499 is what the request timing records.
        return Response(status_code=499)

    @app.exception_handler(FleetscopeError)
    async def _fleetscope_error(_request: Request, exc: FleetscopeError) -> JSONResponse:
        return error_response(exc)

    def health() -> tuple[bool, dict[str, Any]]:
        try:
            with store.engine.connect() as conn:
                conn.execute(text("SELECT 1"))
            current = db.current_revision(store.engine)
            head = db.head_revision(settings.database_url)
        except Exception:  # noqa: BLE001 - health reports, it does not raise
            log.warning("health check: the database does not answer", exc_info=True)
            return False, {"database": store.dialect, "reachable": False}
        if current != head:
            log.warning("health check: schema at %s, code expects %s", current, head)
        details: dict[str, Any] = {"version": __version__, "database": store.dialect, "reachable": True, "schema": current, "schema_head": head}
        ok = current == head
        if store.read_engine is not store.engine:
            # the read API and the dashboard read there: a replica that does not answer, or is no replica, is unready
            details["replica"] = replica = db.replica_lag(store.engine, store.read_engine)
            if not (replica["reachable"] and replica["in_recovery"]):
                log.warning("health check: the read replica is %s", "not in recovery (not a replica)" if replica["reachable"] else "not reachable")
                ok = False
        return ok, details

    @app.get("/healthz", tags=["service"])
    async def healthz(request: Request) -> JSONResponse:
        """Liveness and readiness: the database answers and its schema is current. No token needed for the
        verdict (``ok`` or ``not ok``); a token with ``read`` also gets the versions, and the reason is logged,
        never told to an unauthenticated caller."""
        ok, details = await run_in_threadpool(health)
        body: dict[str, Any] = {"status": "ok" if ok else "not ok"}
        if any(name == b"authorization" for name, _ in request.scope.get("headers", [])):
            token, _refusal = await app.state.gate.authenticate(request.scope)
            if token is not None and token.allows("read"):
                body.update(details)
        return JSONResponse(body, 200 if ok else 503)

    REGISTRY_WITH_TASKS = _registry_with(store)

    @app.get("/metrics", tags=["service"], dependencies=[Depends(require("read"))])
    def metrics() -> Response:
        """Prometheus exposition of Fleetscope's own counters (rows ingested, request latency, task outcomes)."""
        return Response(generate_latest(REGISTRY) + generate_latest(REGISTRY_WITH_TASKS), media_type=CONTENT_TYPE_LATEST)

    app.include_router(routes_alerts.router)
    app.include_router(routes_audit.router)
    app.include_router(routes_data.router)
    app.include_router(routes_fabric.router)
    app.include_router(routes_fleet.router)
    app.include_router(routes_fleet.gpus)
    app.include_router(routes_governance.router)
    app.include_router(routes_jobs.router)
    app.include_router(routes_jobs.models)
    app.include_router(routes_otlp.router)
    app.include_router(routes_remote_write.router)
    app.include_router(routes_serving.router)
    app.include_router(routes_teams.router)
    app.include_router(routes_tokens.router)
    return app


def _after_commit(app: FastAPI, health: pl.DataFrame | None, job_ids: list[str]) -> None:
    """What follows a group commit, off the writer: an alert evaluation now when the health events are ones
    a rule reads, and the per-job energy minutes of jobs whose rank assignments came after their roll-up."""

    if health is not None:
        kick_evaluation(app, health)
    if job_ids:
        reroll_jobs(app.state.store, job_ids)


class _ReplicaLagCollector:
    """How far the read replica is behind the primary, measured at scrape time (``db.replica_lag``)."""

    def __init__(self, store: Store):
        self.store = store

    def collect(self):  # type: ignore[no-untyped-def]
        lag = db.replica_lag(self.store.engine, self.store.read_engine)
        up = GaugeMetricFamily("fleetscope_read_replica_up", "1 while the read replica answers as a replica (in recovery)")
        up.add_metric([], 1.0 if lag["reachable"] and lag["in_recovery"] else 0.0)
        yield up
        if lag["lag_s"] is not None:
            seconds = GaugeMetricFamily("fleetscope_read_replica_lag_seconds", "age of the last transaction the replica replayed while WAL is outstanding; 0 when caught up")
            seconds.add_metric([], float(lag["lag_s"]))
            wal = GaugeMetricFamily("fleetscope_read_replica_lag_bytes", "WAL the primary wrote that the replica has not replayed")
            wal.add_metric([], float(lag["lag_bytes"]))
            yield seconds
            yield wal


def _registry_with(store: Store):  # type: ignore[no-untyped-def]

    reg = CollectorRegistry(auto_describe=False)
    reg.register(_TaskRunCollector(store))
    reg.register(_PipelineCollector(store))
    if store.read_engine is not store.engine:
        reg.register(_ReplicaLagCollector(store))
    return reg

"""Celery: the worker runs scheduled and on-demand work; beat schedules it.

Broker: Redis in production (``FLEETSCOPE_BROKER_URL=redis://...``); the embedded default is kombu's
SQLAlchemy transport over a SQLite file in the data directory, which needs no server and survives
restarts, so ``fleetscope demo`` runs a real worker on a laptop with nothing installed.
"""

from __future__ import annotations

import datetime as dt
import logging
import socket
import time
from typing import Any

from celery import Celery, signals
from celery.schedules import crontab
from sqlalchemy import delete, text

from fleetscope import safefiles
from fleetscope.store import db
from fleetscope.store import schema
from fleetscope import settings as settings_mod
from fleetscope.observability import TASKS, setup_tracing, tracer
from fleetscope.store import Store

log = logging.getLogger(__name__)


def _crontab(spec: str) -> crontab:
    """A five-field crontab string ("minute hour day-of-month month day-of-week") as Celery's schedule."""
    parts = spec.split()
    if len(parts) != 5:
        raise ValueError(f"FLEETSCOPE_REPORT_SCHEDULE={spec!r}: expected five crontab fields, e.g. '0 6 * * 1'")
    m, h, dom, mon, dow = parts
    return crontab(minute=m, hour=h, day_of_month=dom, month_of_year=mon, day_of_week=dow)


DEFAULT_QUEUE = "celery"
# Alerting's tasks have a queue of their own, which `fleetscope worker` serves from a process of its own:
# a page must not wait behind a minute's job analyses in one queue, nor for a pool slot that a
# five-minute health window holds.
ALERTING_QUEUE = "alerting"


def make_celery(settings: settings_mod.Settings | None = None) -> Celery:
    settings = settings or settings_mod.load()
    safefiles.private_dir(settings.data_dir)
    # The embedded broker and result store are SQLite files Celery would create with the umask's mode.
    for url in (settings.broker_url, settings.result_backend):
        db.create_sqlite_file(url)
    app = Celery("fleetscope", broker=settings.broker_url, backend=settings.result_backend, include=["fleetscope.worker", "fleetscope.worker.alerting"])
    app.conf.update(
        task_serializer="json",
        result_serializer="json",
        accept_content=["json"],
        timezone="UTC",
        enable_utc=True,
        # A task is acknowledged after it ran, so a worker killed mid-task hands it to the next one.
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        task_default_queue=DEFAULT_QUEUE,
        task_routes={"fleetscope.alerting.*": {"queue": ALERTING_QUEUE}},
        result_expires=3600,
        broker_connection_retry_on_startup=True,
        beat_schedule_filename=str(settings.data_dir / "celerybeat-schedule"),
        beat_schedule={
            "retention": {"task": "fleetscope.retention", "schedule": crontab(minute=17)},
            "analyze-active-jobs": {"task": "fleetscope.analyze_active_jobs", "schedule": 60.0},
            "energy-rollup": {"task": "fleetscope.energy_rollup", "schedule": 60.0},
            "health-window": {"task": "fleetscope.health_window", "schedule": 300.0},
            "audit-report": {"task": "fleetscope.audit_report", "schedule": _crontab(settings.report_schedule)},
        },
    )
    if settings.broker_url.startswith("sqla+"):
        # kombu hands these to create_engine: wait for SQLite's write lock instead of failing a publish
        # while a worker holds it.
        app.conf.broker_transport_options = {"connect_args": {"timeout": 30}}
    app.conf.fleetscope_settings = settings
    return app


celery_app = make_celery()
_store: Store | None = None


def store() -> Store:
    """The worker process's store, opened once (after fork) and migrated if the settings allow."""
    global _store
    if _store is None:
        settings: settings_mod.Settings = celery_app.conf.fleetscope_settings
        _store = Store(db.make_engine(settings.database_url))
        db.ensure_schema(settings, _store.engine)
        from fleetscope.services import audit as audit_service

        audit_service.bind(_store, settings)  # the audit log's key and checkpoints are the worker's settings'
    return _store


@signals.worker_process_init.connect
def _init_process(**_: Any) -> None:
    global _store
    _store = None  # never share a connection pool across fork
    settings: settings_mod.Settings = celery_app.conf.fleetscope_settings
    setup_tracing(settings.otel_exporter, settings.otel_endpoint, "fleetscope-worker")


_started: dict[str, float] = {}


@signals.task_prerun.connect
def _prerun(task_id: str = "", **_: Any) -> None:
    _started[task_id] = time.perf_counter()


@signals.task_postrun.connect
def _postrun(task_id: str = "", task: Any = None, state: str | None = None, retval: Any = None, **_: Any) -> None:
    runtime = time.perf_counter() - _started.pop(task_id, time.perf_counter())
    name = getattr(task, "name", "?")
    outcome = (state or "unknown").lower()
    TASKS.labels(name, outcome).inc()
    try:
        with store().engine.begin() as conn:
            conn.execute(
                schema.task_run.insert().values(
                    task=name, task_id=task_id, state=outcome, at=dt.datetime.now(dt.UTC), runtime_s=runtime,
                    detail=None if outcome == "success" else str(retval)[:2000],
                )
            )
    except Exception:  # noqa: BLE001 - bookkeeping must never fail the task it records
        log.exception("could not record task run %s", task_id)


@celery_app.task(name="fleetscope.ping")
def ping() -> dict[str, Any]:
    """Proves the path broker → worker → database → result backend end to end."""
    with tracer().start_as_current_span("task.ping"):
        with store().engine.connect() as conn:
            conn.execute(text("SELECT 1"))
        return {"pong": True, "hostname": socket.gethostname(), "database": store().dialect}


@celery_app.task(name="fleetscope.counts")
def counts() -> dict[str, int]:
    with tracer().start_as_current_span("task.counts"):
        return store().counts()


@celery_app.task(name="fleetscope.retention")
def retention(now_iso: str | None = None) -> dict[str, int]:
    """Delete raw telemetry older than ``FLEETSCOPE_RETENTION_DAYS``. Findings, inventory and governance
    records are kept: they are the evidence audits read."""
    settings: settings_mod.Settings = celery_app.conf.fleetscope_settings
    now = dt.datetime.fromisoformat(now_iso) if now_iso else dt.datetime.now(dt.UTC)
    cutoff = now - dt.timedelta(days=settings.retention_days)
    deleted: dict[str, int] = {}
    with tracer().start_as_current_span("task.retention"):
        st = store()
        with st.engine.begin() as conn:
            for name in ("gpu_sample", "gpu_workload", "metric_sample", "collective", "step", "fabric_port_sample"):
                table = schema.metadata.tables[name]
                col = table.c[schema.TIME_COLUMN[name]]
                deleted[name] = conn.execute(delete(table).where(col < cutoff)).rowcount
    return deleted


@celery_app.task(name="fleetscope.analyze_job")
def analyze_job(job_id: str) -> dict[str, Any]:
    """C3, goodput and stragglers of one job, stored as breakdowns, summaries and findings."""
    from fleetscope.services.jobs import analyze_job as run

    with tracer().start_as_current_span("task.analyze_job"):
        result = run(store(), job_id)
        return {"job_id": job_id, "c3": result.c3 is not None, "goodput": result.goodput is not None,
                "stragglers": len(result.stragglers), "notes": result.notes}


@celery_app.task(name="fleetscope.analyze_active_jobs")
def analyze_active_jobs(window_s: int = 900) -> list[str]:
    """Beat's minute tick: queue an analysis for every job with new steps or events in the window."""
    from fleetscope.services.jobs import active_jobs

    jobs = active_jobs(store(), since=dt.datetime.now(dt.UTC) - dt.timedelta(seconds=window_s))
    for job_id in jobs:
        analyze_job.delay(job_id)
    return jobs


@celery_app.task(name="fleetscope.energy_rollup")
def energy_rollup(window_start: str | None = None, window_end: str | None = None) -> dict[str, Any]:
    """Beat's minute tick: re-roll the last ten closed minutes, so late scrapes are counted; a window's
    roll-up comes out the same however often it is rewritten."""
    from fleetscope.services.energy import floor_minute, rollup_window

    end = dt.datetime.fromisoformat(window_end) if window_end else floor_minute(dt.datetime.now(dt.UTC))
    start = dt.datetime.fromisoformat(window_start) if window_start else end - dt.timedelta(minutes=10)
    with tracer().start_as_current_span("task.energy_rollup"):
        return rollup_window(store(), start, end)


@celery_app.task(name="fleetscope.health_window")
def health_window(window_s: int = 900) -> dict[str, Any]:
    """Beat's five-minute tick: GPU and node health and fabric regressions over the last window, as findings."""
    from fleetscope.services.health import health_window as run

    settings: settings_mod.Settings = celery_app.conf.fleetscope_settings
    end = dt.datetime.now(dt.UTC)
    with tracer().start_as_current_span("task.health_window"):
        out = run(store(), end - dt.timedelta(seconds=window_s), end, hang_min_stall_s=settings.hang_min_stall_s)
        return {"gpus": out["gpus"].height, "findings": out["findings"].height}


@celery_app.task(name="fleetscope.audit_report")
def audit_report() -> dict[str, Any]:
    """Beat's scheduled EU AI Act audit of the whole registry (weekly by default), filed as a report."""
    from fleetscope.services.audit import AuditError, run_audit

    settings: settings_mod.Settings = celery_app.conf.fleetscope_settings
    with tracer().start_as_current_span("task.audit_report"):
        try:
            return run_audit(store(), settings, trigger="beat", requested_by="beat")
        except AuditError as exc:
            return {"skipped": str(exc)}


# Alerting's tasks and beat entries register on this app; imported last because they import it, and
# here rather than only through `include` so that beat, which may not import included modules, has them.
from fleetscope.worker import alerting as _alerting_tasks  # noqa: E402,F401

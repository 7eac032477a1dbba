"""The Celery app: broker, queues, beat's schedule, the worker process's store and task bookkeeping.

Broker: Redis in production (``FLEETSCOPE_BROKER_URL=redis://...``); the embedded default is kombu's
SQLAlchemy transport over a SQLite file in the data directory, which needs no server and survives
restarts, so ``fleetscope demo`` runs a real worker on a laptop with nothing installed.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from typing import Any

from celery import Celery, signals
from celery.schedules import crontab

from fleetscope import safefiles
from fleetscope.services.alerting import config as alert_config
from fleetscope.services.alerting.kick import EVALUATE, Kicker
from fleetscope.store import db
from fleetscope.store import schema
from fleetscope import settings as settings_mod
from fleetscope.observability import TASKS, setup_tracing
from fleetscope.store import Store
from fleetscope.services import audit as audit_service
from fleetscope.services import scheduled

log = logging.getLogger(__name__)


def analysis_schedule() -> dict[str, dict[str, Any]]:
    """Beat's entries for the fleet's analyses, from their registries (``services.scheduled``): per job, per
    fleet window and each scheduled analysis, under its entry name, sending its task."""
    return {b.entry: {"task": b.task, "schedule": b.every_s if b.every_s is not None else scheduled.crontab_of(b.crontab or "", b.entry)}
            for b in scheduled.beats()}


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
    app = Celery("fleetscope", broker=settings.broker_url, backend=settings.result_backend, include=["fleetscope.worker.tasks", "fleetscope.worker.alerting"])
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
        # several beats may run; the one holding the lease sends, from the last sends kept in the database
        beat_scheduler="fleetscope.worker.beat:LeaderScheduler",
        beat_schedule={
            "retention": {"task": "fleetscope.retention", "schedule": crontab(minute=17)},
            "partitions-ahead": {"task": "fleetscope.partitions_ahead", "schedule": crontab(minute=3)},
            "audit-report": {"task": "fleetscope.audit_report", "schedule": scheduled.crontab_of(settings.report_schedule)},
            **analysis_schedule(),
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


def celery_kicker(settings: settings_mod.Settings) -> Kicker:
    """A Kicker that queues ``fleetscope.alerting.evaluate`` on the configured broker. A kick left in the
    queue longer than an evaluation interval expires, as beat's own ticks do: by then a tick has run."""
    app = make_celery(settings)
    expires_s = max(1.0, alert_config.load(settings).eval_interval_s)
    # The broker's transport module is imported here, not in the first send: the embedded broker's pulls in
    # SQLAlchemy's ORM, a quarter of a second of the GIL that a fleet's first pushes after a restart waited for.
    app.connection_for_write().get_transport_cls()

    def send(countdown_s: float) -> None:
        app.send_task(EVALUATE, countdown=countdown_s or None, expires=countdown_s + expires_s)

    return Kicker(send)

"""Beat's fleet work: job analyses, the scheduled analyses, health sweeps, retention and scheduled audits.

The analyses' beat entries come from their registries (``services.scheduled``, ``worker/app.py``). The
scheduled analyses' tasks are made here from their timetable (``scheduled_tasks``): each calls the service
function its entry names with the arguments an operator re-runs it with and, for a sharded one with
``FLEETSCOPE_SWEEP_SHARDS`` > 1, first sends one task per shard of hosts. The other tasks are written out
below: they are no registered analysis (upkeep, audits) or belong to the per-job and per-window registries."""

from __future__ import annotations

import datetime as dt
import socket
from collections.abc import Callable
from typing import Any

from celery import Celery, Task
from sqlalchemy import text

from fleetscope import settings as settings_mod
from fleetscope.observability import tracer
from fleetscope.worker.app import celery_app, store
from fleetscope.services import retention as retention_service
from fleetscope.services.analysis import Scheduled, Timetable, load
from fleetscope.services.audit import AuditError, run_audit
from fleetscope.services.jobs import active_jobs
from fleetscope.services.scheduled import SCHEDULED
from fleetscope.store import Store, partitions


def _span(task_name: str) -> str:
    return "task." + task_name.rpartition(".")[2]


def _entry_tasks(app: Celery, a: Scheduled, open_store: Callable[[], Store], shared: bool) -> dict[str, Task]:
    """One scheduled analysis' Celery task, and its shard task where it is sharded. Its service is loaded
    by name when the task runs (``services.analysis.load``), so beat, which imports this module, loads none."""
    sharding = a.shards
    made: dict[str, Task] = {}
    shard_task: Task | None = None
    if sharding is not None:
        def run_shard(task: Task, **args: Any) -> dict[str, Any]:
            with tracer().start_as_current_span(_span(sharding.task)):
                return load(sharding.run)(open_store(), task.app.conf.fleetscope_settings, **args)

        run_shard.__name__ = run_shard.__qualname__ = f"{a.name}_shard"
        run_shard.__doc__ = f"One shard of hosts' part of {a.name} ({sharding.run})."
        shard_task = made[sharding.task] = app.task(name=sharding.task, bind=True, shared=shared)(run_shard)

    def run(task: Task, **args: Any) -> dict[str, Any]:
        settings: settings_mod.Settings = task.app.conf.fleetscope_settings
        with tracer().start_as_current_span(_span(a.beat.task)):
            if sharding is None or shard_task is None or settings.sweep_shards <= 1:
                return load(a.run)(open_store(), settings, **args)
            shards = settings.sweep_shards
            args = load(sharding.args)(**args)  # one window for every shard, fixed before any is sent
            for shard in range(shards):
                shard_task.delay(shard=shard, shards=shards, **args)
            return {"shards": shards, **load(sharding.fleet)(open_store(), settings, **args)}

    run.__name__ = run.__qualname__ = a.name
    run.__doc__ = f"Beat's {a.beat.entry} ({a.beat.when}): {a.summary} ({a.run})."
    made[a.beat.task] = app.task(name=a.beat.task, bind=True, shared=shared)(run)
    return made


def scheduled_tasks(app: Celery, timetable: Timetable, open_store: Callable[[], Store], *, shared: bool = True) -> dict[str, Task]:
    """The Celery task of every timetable entry, under its beat entry's task name, and each sharded entry's
    shard task, by name. A task takes its service's keyword arguments (``fleetscope.energy_rollup`` takes
    ``window_start``/``window_end``, say) and returns the service's dict. ``shared`` as Celery's: whether every
    app made later has them too (the worker's do; a test's scratch app's need not)."""
    made: dict[str, Task] = {}
    for a in timetable:
        made.update(_entry_tasks(app, a, open_store, shared))
    return made


SCHEDULED_TASKS = scheduled_tasks(celery_app, SCHEDULED, store)
"""The scheduled analyses' tasks by name: ``fleetscope.energy_rollup``, ``fleetscope.energy_rollup_shard``, ..."""


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
    """Beat's hourly tick: raw telemetry past ``FLEETSCOPE_RETENTION_DAYS`` and what was derived from it past
    ``FLEETSCOPE_EVIDENCE_RETENTION_DAYS`` (``services.retention``)."""
    settings: settings_mod.Settings = celery_app.conf.fleetscope_settings
    now = dt.datetime.fromisoformat(now_iso) if now_iso else dt.datetime.now(dt.UTC)
    with tracer().start_as_current_span("task.retention"):
        return retention_service.prune(store(), now, settings.retention_days, settings.evidence_retention_days,
                                       retention_service.tier_days(settings))


@celery_app.task(name="fleetscope.analyze_job")
def analyze_job(job_id: str, incremental: bool = False) -> dict[str, Any]:
    """C3, goodput and stragglers of one job, stored as breakdowns, summaries and findings; ``incremental``
    reads only the steps since the job's watermark (``services.job_fold``)."""
    from fleetscope.services.jobs import analyze_job as run  # lazy: a task's service loads when it runs (beat imports this module)

    with tracer().start_as_current_span("task.analyze_job"):
        result = run(store(), job_id, incremental=incremental)
        return {"job_id": job_id, "c3": result.c3 is not None, "goodput": result.goodput is not None,
                "stragglers": len(result.stragglers), "notes": result.notes}


@celery_app.task(name="fleetscope.analyze_active_jobs")
def analyze_active_jobs(window_s: int = 900) -> list[str]:
    """Beat's minute tick: queue an analysis for every job with new steps or events in the window, each
    incremental: it reads what arrived since the job's watermark, so its cost does not grow with the job's age."""

    jobs = active_jobs(store(), since=dt.datetime.now(dt.UTC) - dt.timedelta(seconds=window_s))
    for job_id in jobs:
        analyze_job.delay(job_id, incremental=True)
    return jobs


@celery_app.task(name="fleetscope.partitions_ahead")
def partitions_ahead(today_iso: str | None = None) -> dict[str, list[str]]:
    """Beat's hourly tick: PostgreSQL day partitions of the raw telemetry tables for today and the next days
    (``store.partitions.ensure_ahead``), so no write waits to create one. Nothing on SQLite."""
    today = dt.date.fromisoformat(today_iso) if today_iso else dt.datetime.now(dt.UTC).date()
    with tracer().start_as_current_span("task.partitions_ahead"):
        return partitions.ensure_ahead(store().engine, today)


@celery_app.task(name="fleetscope.health_window")
def health_window(window_s: int = 900) -> dict[str, Any]:
    """Beat's five-minute tick: GPU and node health and fabric regressions over the last window, as findings."""
    from fleetscope.services.health import health_window as run  # lazy: a task's service loads when it runs (beat imports this module)

    settings: settings_mod.Settings = celery_app.conf.fleetscope_settings
    end = dt.datetime.now(dt.UTC)
    start = end - dt.timedelta(seconds=window_s)
    with tracer().start_as_current_span("task.health_window"):
        if settings.sweep_shards > 1:
            # the per-GPU analyses one task per shard of hosts, in parallel on the workers; the fleet's here
            for shard in range(settings.sweep_shards):
                health_window_shard.delay(window_start=start.isoformat(), window_end=end.isoformat(), shard=shard, shards=settings.sweep_shards)
            out = run(store(), start, end, hang_min_stall_s=settings.hang_min_stall_s, part="fleet",
                      idle_min_s=settings.idle_allocation_min_s)
            return {"shards": settings.sweep_shards, "findings": out["findings"].height}
        out = run(store(), start, end, hang_min_stall_s=settings.hang_min_stall_s, idle_min_s=settings.idle_allocation_min_s)
        return {"gpus": out["gpus"].height, "findings": out["findings"].height}


@celery_app.task(name="fleetscope.health_window_shard")
def health_window_shard(window_start: str, window_end: str, shard: int, shards: int) -> dict[str, Any]:
    """One shard of hosts' part of the health sweep: the per-GPU analyses over its GPUs
    (``services.health.health_window(part=(shard, shards))``)."""
    from fleetscope.services.health import health_window as run  # lazy: a task's service loads when it runs (beat imports this module)

    settings: settings_mod.Settings = celery_app.conf.fleetscope_settings
    with tracer().start_as_current_span("task.health_window_shard"):
        out = run(store(), dt.datetime.fromisoformat(window_start), dt.datetime.fromisoformat(window_end),
                  hang_min_stall_s=settings.hang_min_stall_s, part=(shard, shards))
        return {"shard": shard, "shards": shards, "gpus": out["gpus"].height, "findings": out["findings"].height}


@celery_app.task(name="fleetscope.audit_report")
def audit_report() -> dict[str, Any]:
    """Beat's scheduled EU AI Act audit of the whole registry (weekly by default), filed as a report."""

    settings: settings_mod.Settings = celery_app.conf.fleetscope_settings
    with tracer().start_as_current_span("task.audit_report"):
        try:
            return run_audit(store(), settings, trigger="beat", requested_by="beat")
        except AuditError as exc:
            return {"skipped": str(exc)}

"""Beat's fleet work: job analyses, energy roll-ups, health sweeps, post-market monitoring, retention and scheduled audits.

The analyses' beat entries come from their registries (``services.scheduled``, ``worker/app.py``); each task
here is what its entry sends: it takes the arguments an operator re-runs it with and fans out over shards
of hosts where the sweep is split, and calls its service."""

from __future__ import annotations

import datetime as dt
import socket
from typing import Any

from sqlalchemy import text

from fleetscope import settings as settings_mod
from fleetscope.observability import tracer
from fleetscope.worker.app import celery_app, store
from fleetscope.services import retention as retention_service
from fleetscope.services.audit import AuditError, run_audit
from fleetscope.services.energy import floor_minute, rollup_shard, rollup_sums, rollup_window
from fleetscope.services.jobs import active_jobs


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


@celery_app.task(name="fleetscope.energy_rollup")
def energy_rollup(window_start: str | None = None, window_end: str | None = None) -> dict[str, Any]:
    """Beat's minute tick: re-roll the last ten closed minutes, so late scrapes are counted; a window's
    roll-up comes out the same however often it is rewritten."""

    end = dt.datetime.fromisoformat(window_end) if window_end else floor_minute(dt.datetime.now(dt.UTC))
    start = dt.datetime.fromisoformat(window_start) if window_start else end - dt.timedelta(minutes=10)
    shards = celery_app.conf.fleetscope_settings.sweep_shards
    with tracer().start_as_current_span("task.energy_rollup"):
        if shards <= 1:
            return rollup_window(store(), start, end)
        # One task per shard of hosts rolls its GPUs' minutes, on whichever workers are free. The per-site and
        # per-job sums read those minutes back: the window is re-rolled every minute, so a minute's sums are
        # complete from the tick after its shards ran (the newest minute's lag one tick behind).
        for shard in range(shards):
            energy_rollup_shard.delay(start.isoformat(), end.isoformat(), shard, shards)
        return {"shards": shards, "sums": rollup_sums(store(), start, end)}


@celery_app.task(name="fleetscope.energy_rollup_shard")
def energy_rollup_shard(window_start: str, window_end: str, shard: int, shards: int) -> dict[str, Any]:
    """One shard of hosts' part of the energy roll-up (``services.energy.rollup_shard``)."""
    with tracer().start_as_current_span("task.energy_rollup_shard"):
        return rollup_shard(store(), dt.datetime.fromisoformat(window_start), dt.datetime.fromisoformat(window_end), shard, shards)


@celery_app.task(name="fleetscope.tier_rollup")
def tier_rollup(now_iso: str | None = None) -> dict[str, Any]:
    """Beat's minute tick: advance the GPU telemetry roll-up tiers (minute from raw, hour from minute) from their
    watermarks over the buckets closed since (``services.tiers``)."""
    from fleetscope.services import tiers

    now = dt.datetime.fromisoformat(now_iso) if now_iso else dt.datetime.now(dt.UTC)
    with tracer().start_as_current_span("task.tier_rollup"):
        return tiers.advance(store(), now)


@celery_app.task(name="fleetscope.raw_packing")
def raw_packing(now_iso: str | None = None) -> dict[str, Any]:
    """Beat's hourly tick: pack the closed days of raw GPU telemetry that the tiers have passed (``services.packing``;
    nothing on SQLite)."""
    from fleetscope.services import packing  # lazy: a task's service loads when it runs (beat imports this module)

    now = dt.datetime.fromisoformat(now_iso) if now_iso else dt.datetime.now(dt.UTC)
    with tracer().start_as_current_span("task.raw_packing"):
        return packing.pack_closed(store(), now)


@celery_app.task(name="fleetscope.partitions_ahead")
def partitions_ahead(today_iso: str | None = None) -> dict[str, list[str]]:
    """Beat's hourly tick: PostgreSQL day partitions of the raw telemetry tables for today and the next days
    (``store.partitions.ensure_ahead``), so no write waits to create one. Nothing on SQLite."""
    from fleetscope.store import partitions

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
                health_window_shard.delay(start.isoformat(), end.isoformat(), shard, settings.sweep_shards)
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


@celery_app.task(name="fleetscope.model_monitoring")
def model_monitoring(now_iso: str | None = None) -> dict[str, Any]:
    """Beat's hourly tick: every deployed model version's windows of the last two days against its
    reference (``services.monitoring.evaluate_all``), so outcomes that arrived late are counted."""
    from fleetscope.services.monitoring import evaluate_all  # lazy: a task's service loads when it runs (beat imports this module)

    now = dt.datetime.fromisoformat(now_iso) if now_iso else dt.datetime.now(dt.UTC)
    with tracer().start_as_current_span("task.model_monitoring"):
        return evaluate_all(store(), now=now)


@celery_app.task(name="fleetscope.serving_window")
def serving_window(window_s: int = 900) -> dict[str, Any]:
    """Beat's five-minute tick: serving saturation and slow-replica findings over the last window."""
    from fleetscope.services.serving import window_findings  # lazy: a task's service loads when it runs (beat imports this module)

    end = dt.datetime.now(dt.UTC)
    with tracer().start_as_current_span("task.serving_window"):
        found = window_findings(store(), start=end - dt.timedelta(seconds=window_s), end=end)
        return {"findings": found.height}


@celery_app.task(name="fleetscope.teams_showback")
def teams_showback(month: str | None = None) -> dict[str, Any]:
    """Beat's monthly showback report per team (CSV and PDF under the data directory's ``reports/``)."""
    from fleetscope.services import teams

    settings: settings_mod.Settings = celery_app.conf.fleetscope_settings
    month = month or teams.previous_month(dt.datetime.now(dt.UTC))
    with tracer().start_as_current_span("task.teams_showback"):
        return teams.write_showback(store(), month, settings.data_dir / "reports")["files"]


@celery_app.task(name="fleetscope.audit_report")
def audit_report() -> dict[str, Any]:
    """Beat's scheduled EU AI Act audit of the whole registry (weekly by default), filed as a report."""

    settings: settings_mod.Settings = celery_app.conf.fleetscope_settings
    with tracer().start_as_current_span("task.audit_report"):
        try:
            return run_audit(store(), settings, trigger="beat", requested_by="beat")
        except AuditError as exc:
            return {"skipped": str(exc)}

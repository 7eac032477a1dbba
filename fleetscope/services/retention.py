"""Retention: what is deleted when, in two tiers.

- **Raw telemetry** (``RAW``: samples, collectives, steps, port counters, serving series and requests, nccl-tests
  results, the per-op timings of the what-if analysis) after
  ``FLEETSCOPE_RETENTION_DAYS`` (400 by default; the EU AI Act asks deployers to keep logs at least six
  months, Regulation (EU) 2024/1689 Art. 19(1) and 26(6)).
- **What was derived from it** (``EVIDENCE``: energy roll-ups, per-step breakdowns, job analyses, findings,
  health and job events, the ingest and task logs, monitoring windows, predictions and outcomes, the alert
  notifications sent and their delivery attempts) after
  ``FLEETSCOPE_EVIDENCE_RETENTION_DAYS`` (three years by default, never shorter than the raw tier): the
  conclusions audits read outlive the samples, and nothing grows forever (the ingest log gains a row per
  push).

- **Roll-up tiers** of GPU telemetry (``TIERS``: ``gpu_sample_minute``, ``gpu_sample_hour``) after their own
  ``FLEETSCOPE_MINUTE_TIER_RETENTION_DAYS`` and ``FLEETSCOPE_HOUR_TIER_RETENTION_DAYS`` (``services.tiers``); the
  jobs' hours (``job_usage_hour``, ``services.job_usage``) with the hour tier.

Inventory (sites, hosts, GPUs, jobs, links), the registry, declarations, audits and the audit log are kept:
they are small and they are the record. On PostgreSQL the partitioned raw tables (``store.partitions``) lose
whole day partitions before the cutoff (a catalog change, not a scan), then a ``DELETE`` of the cutoff's own day;
the packed days of ``gpu_sample`` (``store.packed``) go the same way, to the hour, and the packed energy minutes
(``store.packed_energy``) to the hour too. Each table is pruned in a
transaction of its own, so one busy table neither holds the others back nor undoes them.
"""

from __future__ import annotations

import datetime as dt

from sqlalchemy import delete, text

from fleetscope.observability import tracer
from fleetscope.settings import Settings
from fleetscope.store import Store, packed, packed_energy, partitions, schema

RAW = ("gpu_sample", "gpu_workload", "metric_sample", "collective", "step", "fabric_port_sample",
       "serving_bucket", "serving_counter", "serving_gauge", "serving_request", "nccl_test", "job_op", "device_union")
EVIDENCE = {
    "gpu_energy_minute": "minute", "site_energy_minute": "minute", "job_energy_minute": "minute",
    "step_breakdown": "start", "job_analysis": "computed_at", "finding": "window_start", "health_event": "ts",
    "job_event": "ts", "ingest_log": "at", "job_analysis_state": "updated_at", "task_run": "at", "monitoring_window": "window_start",
    "model_prediction": "ts", "model_outcome": "ts",
    # alert history: each notification sent and its delivery attempts (the attempts also go with their notification)
    "alert_delivery_attempt": "at", "alert_notification": "created_at",
}


# roll-up tier -> its table (time column: bucket)
TIERS = {"minute": "gpu_sample_minute", "hour": "gpu_sample_hour", "job_hour": "job_usage_hour"}


def tier_days(settings: Settings) -> dict[str, int]:
    """Each roll-up tier's retention in days, from the settings."""
    # a job's hours are read with the hour tier's, and re-rolled from it
    return {"minute": settings.minute_tier_retention_days, "hour": settings.hour_tier_retention_days,
            "job_hour": settings.hour_tier_retention_days}


def cutoffs(now: dt.datetime, retention_days: int, evidence_retention_days: int,
            tier_retention_days: dict[str, int] | None = None) -> dict[str, dt.datetime]:
    """Each pruned table and the instant before which its rows go (tiers default to the evidence retention)."""
    raw = now - dt.timedelta(days=retention_days)
    evidence = now - dt.timedelta(days=evidence_retention_days)
    tiers = {table: now - dt.timedelta(days=(tier_retention_days or {}).get(tier, evidence_retention_days)) for tier, table in TIERS.items()}
    return {**dict.fromkeys(RAW, raw), **dict.fromkeys(EVIDENCE, evidence), **tiers}


def prune(store: Store, now: dt.datetime, retention_days: int, evidence_retention_days: int,
          tier_retention_days: dict[str, int] | None = None) -> dict[str, int]:
    """Delete what is past its tier's retention at ``now``; rows deleted per table."""
    deleted: dict[str, int] = {}
    with tracer().start_as_current_span("retention.prune"):
        for name, cutoff in cutoffs(now, retention_days, evidence_retention_days, tier_retention_days).items():
            table = schema.metadata.tables[name]
            dropped = 0
            if name in partitions.PARTITIONED and partitions.is_partitioned(store.engine, name):
                # whole days go as partitions; the DELETE below then has only the day the cutoff falls in
                dropped, _ = partitions.drop_before(store.engine, name, cutoff)
            col = table.c[EVIDENCE.get(name) or schema.TIME_COLUMN[name]]
            stmt = delete(table).where(col < cutoff)
            if name == "alert_notification":  # one still waiting to be sent stays, however old, until it is sent or dead
                stmt = stmt.where(table.c.status != "pending")
            with store.engine.begin() as conn:
                deleted[name] = dropped + conn.execute(stmt).rowcount
            if name == packed.RAW and partitions.is_partitioned(store.engine, packed.TABLE):
                deleted[packed.TABLE] = _prune_packed(store, cutoff)
                store.packed_changed()
            if name == packed_energy.RAW and store.dialect == "postgresql":  # packed energy minutes go with the rows
                deleted[packed_energy.TABLE] = _prune_hours(store, packed_energy.TABLE, cutoff)
    return deleted


def _prune_hours(store: Store, table: str, cutoff: dt.datetime) -> int:
    """Delete the GPU-hour rows of a packed table that end at or before ``cutoff`` (an hour the cutoff falls in
    stays whole until the next prune, so nothing younger than the retention goes): rows deleted."""
    with store.engine.begin() as conn:
        return conn.execute(text(f"DELETE FROM {table} WHERE hour <= :c"), {"c": cutoff - dt.timedelta(hours=1)}).rowcount


def _prune_packed(store: Store, cutoff: dt.datetime) -> int:
    """The packed days of raw samples (``store.packed``) go with the raw ones: whole day partitions, then the
    GPU-hours of the cutoff's day (``_prune_hours``). Rows (GPU-hours) deleted."""
    dropped, _ = partitions.drop_before(store.engine, packed.TABLE, cutoff)
    return dropped + _prune_hours(store, packed.TABLE, cutoff)

"""Reliability against the store: interruptions by root cause, MTBF per GPU-hour and per job, all-up
availability, and checkpoint advice, over a window of job events.

The formulas live in ``analyzers/reliability.py``; this module reads the window and assembles the report.
Step events (one per rank per step: the bulk of job events) are never read row by row: a job's exposure
comes from one aggregate query, and only the other lifecycle events (failures, restarts, checkpoints) are
read whole.
"""

from __future__ import annotations

import json

import datetime as dt
import math
from typing import Any

import polars as pl

from analyzers import reliability
from fleetscope.core import frames as F
from fleetscope.core.errors import NotFound
from fleetscope.services.jobs import json_safe, job_exists
from fleetscope.observability import tracer
from fleetscope.store import Store
from fleetscope.core.units import as_utc, check_window
from fleetscope.store.reads import fetch

MAX_WINDOW = dt.timedelta(days=366)


class UnknownJob(NotFound):
    """A job id with nothing ingested under it."""


def _window(start: dt.datetime, end: dt.datetime) -> None:
    check_window(start, end, MAX_WINDOW, f"window longer than {MAX_WINDOW.days} days")


def _events(store: Store, start: dt.datetime, end: dt.datetime, job_id: str | None) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(lifecycle events other than steps, per-job exposure from all lifecycle events) in [start, end)."""
    skip = ["step", *F.JOB_RECORD_KINDS]
    job_sql, job_params = (" AND job_id = ?", [job_id]) if job_id is not None else ("", [])
    where = "ts >= ? AND ts < ?"
    events = store.query(
        f"SELECT job_id, ts, kind, \"rank\", step, payload FROM job_event WHERE {where} AND kind NOT IN ({', '.join('?' * len(skip))}){job_sql}"
        " ORDER BY job_id, ts",
        [start, end, *skip, *job_params], F.JOB_EVENT.schema)
    records = list(F.JOB_RECORD_KINDS)
    span = store.query(
        "SELECT job_id, MIN(ts) AS first_ts, MAX(ts) AS last_ts, COUNT(DISTINCT CASE WHEN \"rank\" >= 0 THEN \"rank\" END) AS ranks_seen"
        f" FROM job_event WHERE {where} AND kind NOT IN ({', '.join('?' * len(records))}){job_sql} GROUP BY job_id",
        [start, end, *records, *job_params], {"job_id": pl.String, "first_ts": F.UTC_US, "last_ts": F.UTC_US, "ranks_seen": pl.Int64})
    if events.width == 0:
        events = F.JOB_EVENT.empty()
    exposure = (span.select("job_id", ((pl.col("last_ts") - pl.col("first_ts")).dt.total_microseconds() / 3.6e9).alias("wall_hours"),
                            pl.col("ranks_seen").cast(pl.Int64))
                if span.height else pl.DataFrame(schema={"job_id": pl.String, "wall_hours": pl.Float64, "ranks_seen": pl.Int64}))
    return events, exposure


def reliability_report(store: Store, start: dt.datetime, end: dt.datetime, *, job_id: str | None = None,
                       parts: int | None = None, part_availability: float | None = None) -> dict[str, Any]:
    """Interruptions by Llama 3 root-cause category, MTBF per GPU-hour and per job, the all-up availability
    A^N of ``parts`` parts (by default the job's GPUs when ``job_id`` is given), and Young/Daly checkpoint
    advice per job, over [start, end).

    ``part_availability``: A per part; measured when not given, as MTBF_GPU / (MTBF_GPU + MTTR) with MTTR
    the median time from an interruption to the job's next start (``reliability.recovery_times``).
    A job's checkpoint advice uses its own MTBF when it was interrupted in the window, else the fleet's GPU
    MTBF divided by its GPUs (the basis is stated per job).
    """
    _window(start, end)
    if parts is not None and parts < 1:
        raise ValueError("parts must be at least 1")
    if part_availability is not None and not 0.0 <= part_availability <= 1.0:
        raise ValueError("part_availability must be within [0, 1]")
    if job_id is not None and not job_exists(store, job_id):
        raise UnknownJob(f"no job {job_id[:200]!r}: nothing ingested under that id")
    with tracer().start_as_current_span("reliability.report"):
        events, exposure = _events(store, start, end, job_id)
        job = store.read("job", job_id=job_id) if job_id is not None else store.read("job")
        intr = reliability.interruptions(events)
        mtbf = reliability.mtbf_table(exposure, intr, job.select("job_id", "world_size") if job.height else None)
        gpu_hours = float(mtbf["gpu_hours"].fill_null(0).sum())
        fleet_gpu_mtbf_h = reliability.mtbf_hours(gpu_hours, intr.height)
        recoveries = reliability.recovery_times(events)["recovery_s"].drop_nulls()
        mttr_s = float(recoveries.median()) if recoveries.len() else None

        by_job_cat = {j: dict(g.group_by("category").len().iter_rows()) for (j,), g in intr.group_by(["job_id"])} if intr.height else {}
        jobs = [{**r, "interruptions_by_category": by_job_cat.get(r["job_id"], {})} for r in mtbf.to_dicts()]
        return json_safe({
            "window": {"start": start.isoformat(), "end": end.isoformat(), "job_id": job_id},
            "interruptions": {
                "total": intr.height,
                "by_category": reliability.root_cause_table(intr).to_dicts(),
                "events": intr.select("job_id", "ts", "cause", "host", "category", "component").to_dicts(),
            },
            "mtbf": {"gpu_hours": gpu_hours, "gpu_mtbf_hours": fleet_gpu_mtbf_h, "mttr_s": mttr_s, "recoveries": recoveries.len(),
                     "jobs": jobs},
            "availability": _availability(parts if parts is not None else _job_gpus(mtbf, job_id), part_availability,
                                          fleet_gpu_mtbf_h, mttr_s, intr.height),
            "checkpoint": _checkpoint_advice(events, mtbf, fleet_gpu_mtbf_h),
        })


def _job_gpus(mtbf: pl.DataFrame, job_id: str | None) -> int | None:
    if job_id is None:
        return None
    row = mtbf.filter(pl.col("job_id") == job_id)
    return int(row["gpus"][0]) if row.height and row["gpus"][0] is not None else None


def _availability(parts: int | None, given: float | None, gpu_mtbf_h: float, mttr_s: float | None, failures: int) -> dict[str, Any]:
    """A^N with its basis: the given A, or A = MTBF / (MTBF + MTTR) measured over the window."""
    if given is not None:
        a, basis = given, "given"
    elif failures == 0:
        a, basis = None, "no interruptions in the window: no failure evidence to measure availability from; pass part_availability"
    elif mttr_s is None:
        a, basis = None, "no job came back after its interruptions in the window, so MTTR is unknown; pass part_availability"
    else:
        a = reliability.steady_state_availability(gpu_mtbf_h, mttr_s / 3600)
        basis = (f"measured: GPU MTBF {gpu_mtbf_h:.4g} h / (MTBF + MTTR {mttr_s / 3600:.4g} h); MTTR is the median time from an "
                 "interruption to the job's next start, the part's repair time as the job sees it")
    out: dict[str, Any] = {"parts": parts, "part_availability": a, "basis": basis, "all_up": None, "expected_parts_down": None,
                           "job_mtbf_hours": None}
    if parts is not None:
        if a is not None:
            out["all_up"] = reliability.all_up_availability(a, parts)
            out["expected_parts_down"] = parts * (1.0 - a)
        if failures:
            out["job_mtbf_hours"] = reliability.job_mtbf_hours(gpu_mtbf_h, parts)
    return out


def _checkpoint_advice(events: pl.DataFrame, mtbf: pl.DataFrame, fleet_gpu_mtbf_h: float) -> list[dict[str, Any]]:
    costs = reliability.checkpoint_costs(events).filter(pl.col("saves") > 0) if events.height else pl.DataFrame()
    if costs.height == 0:
        return []
    own = {r["job_id"]: r for r in mtbf.to_dicts()}
    basis: dict[str, str] = {}
    mtbf_h: dict[str, float] = {}
    for job in costs["job_id"].to_list():
        r = own.get(job)
        if r and r["interruptions"]:
            mtbf_h[job], basis[job] = r["job_mtbf_hours"], f"the job's own: {r['interruptions']} interruption(s) in {r['wall_hours']:.4g} h"
        elif r and r["gpus"] and math.isfinite(fleet_gpu_mtbf_h):
            mtbf_h[job] = reliability.job_mtbf_hours(fleet_gpu_mtbf_h, r["gpus"])
            basis[job] = f"the fleet's GPU MTBF {fleet_gpu_mtbf_h:.4g} h over the job's {r['gpus']} GPUs (no interruption of its own)"
        else:
            basis[job] = "no interruptions anywhere in the window: no MTBF to advise from"
    advice = reliability.checkpoint_advice(costs, mtbf_h)
    return [{**r, "mtbf_basis": basis[r["job_id"]]} for r in advice.to_dicts()]


# --- reads (the dashboard's, the API's and the CLI's) ---------------------------------------


UTC = F.UTC_US


_DISRUPTIONS = ("failure", "preempted", "restart")


def disruptions(store: Store, start: dt.datetime, end: dt.datetime, site: str | None = None, limit: int = 1000) -> pl.DataFrame:
    """Failures, preemptions and restarts in the window, newest first: ``ts, job_id, kind, step, cause``
    (``cause`` from the event's payload; the kind itself where none was given)."""
    params: list[Any] = [as_utc(start), as_utc(end), *_DISRUPTIONS]
    site_sql = ""
    if site is not None:
        site_sql = " AND job_id IN (SELECT job_id FROM job WHERE site_id = ?)"
        params.append(site)
    sql = (
        "SELECT ts, job_id, kind, step, payload FROM job_event"
        f" WHERE ts >= ? AND ts < ? AND kind IN ({', '.join('?' for _ in _DISRUPTIONS)}){site_sql} ORDER BY ts DESC LIMIT {int(limit)}"
    )
    df = fetch(store, sql, params, {"ts": UTC, "job_id": pl.String, "kind": pl.String, "step": pl.Int64, "payload": pl.String})

    def cause(payload: str | None) -> str | None:
        try:
            value = json.loads(payload).get("cause") if payload else None
        except (ValueError, AttributeError):
            return None
        return str(value) if value is not None else None

    causes = [cause(p) for p in df["payload"].to_list()]
    return df.with_columns(cause=pl.Series(causes, dtype=pl.String)).with_columns(pl.col("cause").fill_null(pl.col("kind"))).drop("payload")


def reliability_summary(store: Store, start: dt.datetime, end: dt.datetime, site: str | None = None) -> pl.DataFrame:
    """One row: ``failures, preemptions, restarts, window_s, mtbf_s`` (the window over its failures;
    null without failures)."""
    d = disruptions(store, start, end, site)
    window_s = (as_utc(end) - as_utc(start)).total_seconds()
    failures = d.filter(pl.col("kind") == "failure").height
    return pl.DataFrame(
        {
            "failures": [failures],
            "preemptions": [d.filter(pl.col("kind") == "preempted").height],
            "restarts": [d.filter(pl.col("kind") == "restart").height],
            "window_s": [window_s],
            "mtbf_s": [window_s / failures if failures else None],
        },
        schema={"failures": pl.Int64, "preemptions": pl.Int64, "restarts": pl.Int64, "window_s": pl.Float64, "mtbf_s": pl.Float64},
    )


def checkpoint_intervals(store: Store, start: dt.datetime, end: dt.datetime, site: str | None = None) -> pl.DataFrame:
    """Per job with checkpoint saves in the window: ``job_id, saves, interval_mean_s`` (between save
    starts), ``save_mean_s`` (start to end)."""
    kinds = ("checkpoint_save_start", "checkpoint_save_end")
    params: list[Any] = [as_utc(start), as_utc(end), *kinds]
    site_sql = ""
    if site is not None:
        site_sql = " AND job_id IN (SELECT job_id FROM job WHERE site_id = ?)"
        params.append(site)
    ev = fetch(
        store,
        f"SELECT job_id, ts, kind FROM job_event WHERE ts >= ? AND ts < ? AND kind IN (?, ?) AND rank = -1{site_sql} ORDER BY job_id, ts",
        params,
        {"job_id": pl.String, "ts": UTC, "kind": pl.String},
    )
    schema = {"job_id": pl.String, "saves": pl.Int64, "interval_mean_s": pl.Float64, "save_mean_s": pl.Float64}
    if ev.is_empty():
        return pl.DataFrame(schema=schema)
    starts = ev.filter(pl.col("kind") == kinds[0]).sort("job_id", "ts")
    ends = ev.filter(pl.col("kind") == kinds[1]).sort("job_id", "ts")
    intervals = starts.with_columns(gap_s=pl.col("ts").diff().over("job_id").dt.total_microseconds() / 1e6)
    # The n-th save start of a job pairs with its n-th save end (saves of one job do not overlap); a
    # save still running at the window's end has no end yet and drops out of the mean.
    n = pl.int_range(pl.len()).over("job_id").alias("n")
    paired = starts.with_columns(n).join(ends.with_columns(n).rename({"ts": "end_ts"}).select("job_id", "n", "end_ts"), on=["job_id", "n"], how="left")
    saves = paired.with_columns(save_s=(pl.col("end_ts") - pl.col("ts")).dt.total_microseconds() / 1e6)
    return (
        intervals.group_by("job_id")
        .agg(pl.len().cast(pl.Int64).alias("saves"), pl.col("gap_s").mean().alias("interval_mean_s"))
        .join(saves.group_by("job_id").agg(pl.col("save_s").mean().alias("save_mean_s")), on="job_id", how="left")
        .select(list(schema))
        .sort("job_id")
    )

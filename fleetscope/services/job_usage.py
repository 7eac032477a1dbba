"""What scheduler jobs used of their GPUs: which GPUs a job held (Slurm node rows and device indices, pods by
dcgm-exporter's attribution), its busy share and energy over a period, and the per-job hour roll-up
(``job_usage_hour``) that lets a period of weeks read a row per job and hour instead of every GPU's hours.

The roll-up (beat's ``job-usage-rollup``) advances from its watermark (``rollup_watermark``, tier ``job_hour``)
behind the hour tier's, ``SETTLE`` after an hour ends, so the scheduler's accounting for the hour has arrived.
A rolled row says which GPUs the job had then (their count); a reader checks each job's rows against the job
as the scheduler knows it now (an hour per hour it held GPUs, the same GPU count) and works a job whose record
changed since (a late ``sacct``, a node list that arrived after the hour) out from the hour tier instead, so a
late record is never costed wrong, only slower. Each tick re-rolls such jobs of the last ``HEAL_WINDOW``.
The sums are additive (``analyzers.job_usage``): the rolled hours and the hours not rolled yet add up to what
the hour tier alone gives.

Reads ``sched_job``, ``sched_job_node``, ``sched_node``, ``gpu``, ``gpu_workload``, the tiers and raw samples;
writes ``job_usage_hour`` and its watermark. The costs built on top are ``services/team_costs.py``'s.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import polars as pl
from sqlalchemy import delete, tuple_

from analyzers import job_usage as usage
from fleetscope.core import scheduler_frames as SCH
from fleetscope.core.tier_frames import JOB_USAGE_HOUR
from fleetscope.core.units import as_utc
from fleetscope.observability import tracer
from fleetscope.services import tiers
from fleetscope.services.analysis import at
from fleetscope.settings import Settings
from fleetscope.store import Store, schema
from fleetscope.store.reads import fetch

MAX_JOBS = 2_000_000


COST_COLUMNS = ("cluster", "job_id", "scheduler", "user", "account", "partition", "state", "start_at", "end_at", "gpus", "gpu_types", "nodes", "labels")
"""The ``sched_job`` columns costing a job needs: its owner for the team, its run and GPUs, where it ran."""


def jobs_in(store: Store, start: dt.datetime, end: dt.datetime, columns: tuple[str, ...] | None = None) -> pl.DataFrame:
    """Scheduler jobs whose run overlaps ``[start, end)`` (started before its end and not ended before its start),
    those that ended in it without starting (cancelled while pending), and those pending, submitted before the end.
    ``columns``: only these (default every column)."""
    schema = {c: SCH.SCHED_JOB.schema[c] for c in (columns or SCH.SCHED_JOB.schema)}
    cols = ", ".join(f'"{c}"' for c in schema)
    t0, t1 = store._time_param(as_utc(start)), store._time_param(as_utc(end))
    sql = (f"SELECT {cols} FROM sched_job WHERE (start_at IS NOT NULL AND start_at < ? AND (end_at IS NULL OR end_at >= ?))"
           f" OR (start_at IS NULL AND end_at >= ? AND end_at < ?) OR (state = 'PENDING' AND submit_at < ?) LIMIT {MAX_JOBS}")
    p = [t1, t0, t0, t1, t1]
    return fetch(store, sql, p, schema)


JOB_FILTER_MAX = 5000
"""Up to this many jobs, their node rows are read by job id; above it, the table is read whole and joined."""


def job_gpus(store: Store, jobs: pl.DataFrame) -> pl.DataFrame:
    """(cluster, job_id, gpu_uuid) for jobs whose GPUs telemetry names: Slurm jobs by node and device index
    (``gres_detail``; a node whose GPUs the job holds all of needs none), pods by dcgm-exporter's attribution."""
    out = pl.DataFrame(schema={"cluster": pl.String, "job_id": pl.String, "gpu_uuid": pl.String})
    if not jobs.height:
        return out
    gpus = store.read("gpu", columns=["gpu_uuid", "host", "gpu_index"])
    parts = []
    slurm_jobs = jobs.filter(pl.col("scheduler") != "kubernetes")
    if slurm_jobs.height and gpus.height:
        # a few jobs (the running ones of an idle sweep) by their ids, not the node rows of the whole history
        ids = slurm_jobs["job_id"].unique().to_list() if slurm_jobs.height <= JOB_FILTER_MAX else None
        nodes = store.read("sched_job_node", job_id=ids, columns=["cluster", "job_id", "host", "gpus", "gpu_indices"]).join(
            slurm_jobs.select("cluster", "job_id"), on=["cluster", "job_id"])
        per_host = gpus.group_by("host").len("host_gpus")
        n = nodes.join(per_host, on="host", how="left")
        explicit = (n.filter(pl.col("gpu_indices").is_not_null())
                    .with_columns(pl.col("gpu_indices").str.split(",").cast(pl.List(pl.Int64)).alias("gpu_index")).explode("gpu_index")
                    .join(gpus, on=["host", "gpu_index"]))
        whole = n.filter(pl.col("gpu_indices").is_null() & (pl.col("gpus") == pl.col("host_gpus"))).join(gpus, on="host")
        parts += [explicit.select("cluster", "job_id", "gpu_uuid"), whole.select("cluster", "job_id", "gpu_uuid")]
        undivided = n.filter(pl.col("gpu_indices").is_null() & pl.col("gpus").is_null())
        if undivided.height and "gpus" in slurm_jobs.columns:
            parts.append(_whole_nodes(store, undivided, slurm_jobs).join(gpus, on="host").select("cluster", "job_id", "gpu_uuid"))
    pods = jobs.filter(pl.col("scheduler") == "kubernetes")
    if pods.height:
        w = store.read("gpu_workload", columns=["gpu_uuid", "namespace", "pod"]).unique(["gpu_uuid", "namespace", "pod"])
        if w.height:
            j = w.with_columns((pl.col("namespace") + "/" + pl.col("pod")).alias("job_id")).join(pods.select("cluster", "job_id"), on="job_id")
            parts.append(j.select("cluster", "job_id", "gpu_uuid"))
    # no (job, GPU) twice: a node row is either by device index or whole, keyed by (cluster, job_id, host), and pods were made unique
    return pl.concat(parts) if parts else out


def _whole_nodes(store: Store, undivided: pl.DataFrame, jobs: pl.DataFrame) -> pl.DataFrame:
    """The node rows (cluster, job_id, host) of jobs known only by their total GPU count (``sacct`` names a
    multi-node job's AllocTRES for the whole job, not per node) whose total is every GPU of their nodes: such
    a job holds each GPU on them. A node's GPUs are the scheduler's count (``sched_node.gpus_total``), else
    those telemetry sees on it; a job with a node of unknown size, or fewer GPUs than its nodes have, is left
    unmatched (which of them it held is not known)."""
    sn = store.read("sched_node", columns=["host", "gpus_total"])
    sizes = sn.group_by("host").agg(pl.col("gpus_total").max()) if sn.height else pl.DataFrame(schema={"host": pl.String, "gpus_total": pl.Int64})
    u = undivided.join(sizes, on="host", how="left").with_columns(pl.coalesce(pl.col("gpus_total"), pl.col("host_gpus").cast(pl.Int64)).alias("_node_gpus"))
    full = (u.group_by("cluster", "job_id").agg(pl.col("_node_gpus").sum().alias("_sum"), pl.col("_node_gpus").null_count().alias("_unknown"))
            .join(jobs.select("cluster", "job_id", pl.col("gpus").cast(pl.Int64).alias("_total")), on=["cluster", "job_id"])
            .filter((pl.col("_unknown") == 0) & (pl.col("_sum") == pl.col("_total"))))
    return u.join(full.select("cluster", "job_id"), on=["cluster", "job_id"]).select("cluster", "job_id", "host")


GPU_FILTER_MAX = 2000
"""Above this many GPUs the samples are read for the period and filtered in memory, not by an IN list."""


def usage_tier(store: Store, start: dt.datetime, end: dt.datetime) -> str:
    """Where a period's busy share and energy are read from: raw samples for a period of hours
    (``tiers.RAW_MAX_RANGE``), else the hour tier where it reaches back to the period's start (a month of a
    16,384-GPU fleet is 12 M hour rows against 4 billion raw samples), else what a panel of the period reads
    (``tiers.tier_for``: raw while no tier has been rolled)."""
    start, end = as_utc(start), as_utc(end)
    if end - start <= tiers.RAW_MAX_RANGE:
        return "raw"
    if "hour" in tiers.rolled_tiers(store):
        first = tiers.oldest(store, "hour")
        if first is not None and first <= start:
            return "hour"
    return tiers.tier_for(store, start, end)


def _held_source(store: Store, tier: str, start: dt.datetime, end: dt.datetime, uuids: pl.Series) -> pl.DataFrame:
    """``ts, gpu_uuid, util_ratio, power_w, _w`` over the period: raw samples (weight 1), or a tier's buckets as
    samples at their start, weighted by the samples each summarises; past the hour tier's watermark (the hour
    or two not rolled into it yet), the minute tier's."""
    many = uuids.len() > GPU_FILTER_MAX  # most of a fleet: one time-bounded read (parallel on SQLite), filtered here

    def read(table: str, cols: list[str], lo: dt.datetime, hi: dt.datetime) -> pl.DataFrame:
        if many:
            return store.read(table, start=lo, end=hi, columns=cols).filter(pl.col("gpu_uuid").is_in(uuids.implode()))
        return store.read(table, start=lo, end=hi, gpu_uuid=uuids.to_list(), columns=cols)

    if tier == "raw":
        return read("gpu_sample", ["ts", "gpu_uuid", "util_ratio", "power_w"], start, end).with_columns(pl.lit(1.0).alias("_w"))
    cols = ["bucket", "gpu_uuid", "samples", "util_ratio_mean", "power_w_mean"]
    spans = [(tier, start, end)]
    wm = tiers.watermark(store, tier) if tier == "hour" else None
    if wm is not None and wm < end:
        spans = [("hour", start, max(start, wm)), ("minute", max(start, wm), end)]
    parts = [read(tiers.TIER_TABLE[t], cols, lo, hi) for t, lo, hi in spans if lo < hi]
    df = pl.concat(parts) if parts else pl.DataFrame(schema={"bucket": pl.Datetime("us", "UTC"), "gpu_uuid": pl.String, "samples": pl.Int64,
                                                             "util_ratio_mean": pl.Float64, "power_w_mean": pl.Float64})
    return df.select(pl.col("bucket").alias("ts"), "gpu_uuid", pl.col("util_ratio_mean").alias("util_ratio"),
                     pl.col("power_w_mean").alias("power_w"), pl.col("samples").cast(pl.Float64).alias("_w"))


def _spans(alloc: pl.DataFrame, start: dt.datetime, end: dt.datetime) -> pl.DataFrame:
    """Each job's held span inside the period (``_j``, cluster, job_id, ``s``, ``e``), one per job."""
    lo, hi = pl.lit(as_utc(start)).cast(pl.Datetime("us", "UTC")), pl.lit(as_utc(end)).cast(pl.Datetime("us", "UTC"))
    spans = alloc.select("cluster", "job_id", pl.max_horizontal("start_at", lo).alias("s"), pl.min_horizontal(pl.col("end_at").fill_null(hi), hi).alias("e"))
    return spans.unique(["cluster", "job_id"], keep="first", maintain_order=True).with_row_index("_j")


BUSY_SCHEMA = {"cluster": pl.String, "job_id": pl.String, "busy_ratio": pl.Float64, "energy_j": pl.Float64}


def busy(store: Store, alloc: pl.DataFrame, start: dt.datetime, end: dt.datetime) -> pl.DataFrame:
    """Per job: ``busy_ratio`` (mean util_ratio of its GPUs' samples while it held them inside the period)
    and ``energy_j`` (the mean power of those samples × the time held, per GPU). Over a period of hours the
    samples are raw, each GPU's mean taken alone. Over a longer one (``usage_tier``) they are the hour tier's
    buckets, each counted whole where it starts inside the hold and weighted by its samples (a hold's first and
    last partial hours are then an hour's mean), pooled over the job's GPUs: the rolled hours from
    ``job_usage_hour``, the rest from the tiers (:func:`_tier_sums`)."""
    jg = job_gpus(store, alloc)
    if not jg.height:
        return pl.DataFrame(schema=BUSY_SCHEMA)
    tier = usage_tier(store, start, end)
    spans = _spans(alloc, start, end)
    held_s = ((pl.col("e") - pl.col("s")).dt.total_microseconds() / 1e6).alias("held_s")
    if tier != "raw":
        sums = _tier_sums(store, tier, spans, jg, start, end)
        out = usage.busy_and_energy(sums.join(spans.select("_j", "cluster", "job_id", held_s), on="_j"))
        return out.select(list(BUSY_SCHEMA))
    samples = _held_source(store, tier, start, end, jg["gpu_uuid"].unique())
    if not samples.height:
        return pl.DataFrame(schema=BUSY_SCHEMA)
    # grouped by integers (the held span, then the job), not by millions of (cluster, job, GPU) strings
    held = jg.join(spans, on=["cluster", "job_id"]).select("_j", "gpu_uuid", "s", "e", held_s).with_row_index("_h")
    x = usage.held_samples(held, samples)

    def mean(c: str) -> pl.Expr:
        return pl.col(c).filter(pl.col(c).is_not_null()).mean()

    per_gpu = x.group_by("_h").agg(pl.col("_j").first(), mean("util_ratio").alias("u"), mean("power_w").alias("p"), pl.col("held_s").first())
    per_job = per_gpu.group_by("_j").agg(
        pl.col("u").mean().alias("busy_ratio"),
        pl.when(pl.col("p").is_not_null().any()).then((pl.col("p") * pl.col("held_s")).sum()).otherwise(None).alias("energy_j"))
    return per_job.join(spans.select("_j", "cluster", "job_id"), on="_j").select(list(BUSY_SCHEMA))


def _tier_sums(store: Store, tier: str, spans: pl.DataFrame, jg: pl.DataFrame, start: dt.datetime, end: dt.datetime) -> pl.DataFrame:
    """Per job (``_j``) the usage sums over the period from a tier: the hours ``job_usage_hour`` has for it, where
    they still match the job (:func:`_rolled`), and the tiers' buckets for the rest (past the roll-up's watermark,
    or the whole period for a job whose rows do not match)."""
    held = jg.join(spans, on=["cluster", "job_id"]).select("_j", "gpu_uuid", pl.col("s").dt.truncate("1h").alias("s"), "e")
    parts: list[pl.DataFrame] = []
    wm = watermark(store) if tier == "hour" else None
    if wm is not None and wm > tiers.floor_to(start, "hour"):
        rolled, stale = _rolled(store, spans, jg, start, min(wm, as_utc(end)))
        parts.append(rolled)
        rolled_j = rolled.select("_j")
        # a job whose rows all match reads on from the watermark; the others from their start
        on = held.join(rolled_j, on="_j").with_columns(pl.max_horizontal("s", pl.lit(wm).cast(pl.Datetime("us", "UTC"))).alias("s"))
        held = pl.concat([on, held.join(stale, on="_j")])
    held = held.filter(pl.col("e") > pl.col("s"))
    if held.height:
        lo = max(as_utc(start).replace(minute=0, second=0, microsecond=0), held["s"].min())
        parts.append(usage.held_sums(held, _held_source(store, tier, lo, end, held["gpu_uuid"].unique()), ["_j"]))
    return usage.combine(parts, ["_j"]) if parts else pl.DataFrame(schema={"_j": pl.UInt32, **dict.fromkeys(usage.SUMS, pl.Float64), "power_gpus": pl.Int64})


def _rolled(store: Store, spans: pl.DataFrame, jg: pl.DataFrame, start: dt.datetime, rolled_to: dt.datetime) -> tuple[pl.DataFrame, pl.DataFrame]:
    """The rolled sums of each job (``_j``) over its held hours before ``rolled_to``, and the jobs (``_j``) whose rows
    do not match the job as known now: not a row for every hour it held GPUs in, or rolled with another GPU count."""
    rows = _read_rows(store, tiers.floor_to(start, "hour"), rolled_to)
    hour = pl.col("s").dt.truncate("1h")
    r = rows.join(spans, on=["cluster", "job_id"]).filter((pl.col("bucket") >= hour) & (pl.col("bucket") < pl.col("e")))
    last = pl.min_horizontal("e", pl.lit(rolled_to).cast(pl.Datetime("us", "UTC")))
    hours = pl.when(last > hour).then(((last - hour).dt.total_microseconds() + 3_600_000_000 - 1) // 3_600_000_000).otherwise(0)
    gpus = jg.group_by("cluster", "job_id").len("gpus_now")
    want = spans.join(gpus, on=["cluster", "job_id"]).select("_j", hours.alias("hours"), pl.col("gpus_now").cast(pl.Int64))
    got = r.group_by("_j").agg(pl.len().alias("n"), pl.col("gpus").min().alias("g0"), pl.col("gpus").max().alias("g1"),
                               *[pl.col(c).sum() for c in usage.SUMS], pl.col("power_gpus").max())
    x = want.join(got, on="_j", how="left")
    same = (pl.col("n") == pl.col("hours")) & (pl.col("g0") == pl.col("gpus_now")) & (pl.col("g1") == pl.col("gpus_now"))
    ok = (pl.col("hours") == 0) | same.fill_null(False)  # no rows at all: not rolled with the job
    matched = x.filter(ok).with_columns([pl.col(c).fill_null(0.0) for c in usage.SUMS] + [pl.col("power_gpus").fill_null(0)])
    return matched.select("_j", *usage.SUMS, "power_gpus"), x.filter(~ok).select("_j")


def _read_rows(store: Store, lo: dt.datetime, hi: dt.datetime) -> pl.DataFrame:
    schema_ = JOB_USAGE_HOUR.schema
    cols = ", ".join(f'"{c}"' for c in schema_)
    return fetch(store, f"SELECT {cols} FROM job_usage_hour WHERE bucket >= ? AND bucket < ?",
                 [store._time_param(lo), store._time_param(hi)], dict(schema_))


# --- the roll-up -------------------------------------------------------------------------------------

TIER = "job_hour"
"""The roll-up's name in ``rollup_watermark``."""
SETTLE = dt.timedelta(minutes=15)
"""An hour is rolled this long after it ends (and once the hour tier has it): the scheduler's accounting of
the jobs that ran in it (``sacct`` polls, pod events) has arrived by then; a later one is healed."""
HEAL_WINDOW = dt.timedelta(days=7)
"""Each tick re-rolls the jobs of this many rolled days whose rows no longer match them."""
CHUNK = dt.timedelta(hours=24)


def watermark(store: Store) -> dt.datetime | None:
    """Every hour before this instant is rolled into ``job_usage_hour``; None before the first roll."""
    return tiers.watermark(store, TIER)


def roll(store: Store, lo: dt.datetime, hi: dt.datetime, jobs: pl.DataFrame | None = None) -> int:
    """Write the ``job_usage_hour`` rows of the hours in ``[lo, hi)`` (hour-aligned, inside the hour tier) for
    every job that held GPUs in them, or only ``jobs`` (their ``sched_job`` records, ``COST_COLUMNS``), whose old
    rows there are replaced (an hour a job no longer holds loses its row). Rows written."""
    found = jobs if jobs is not None else jobs_in(store, lo, hi, COST_COLUMNS).filter(pl.col("start_at").is_not_null())
    jg = job_gpus(store, found)
    rows = usage.hour_rows(found, jg, _held_source(store, "hour", lo, hi, jg["gpu_uuid"].unique()), lo, hi) if jg.height else JOB_USAGE_HOUR.empty()
    if jobs is not None and jobs.height:
        t = schema.job_usage_hour
        keys = jobs.select("cluster", "job_id").unique().rows()
        # Between this and the write the jobs have no rows for these hours: a reader then finds them unmatched and
        # works them out from the hour tier, the same figures.
        with store.engine.begin() as conn:
            for i in range(0, len(keys), 500):
                part = keys[i:i + 500]
                conn.execute(delete(t).where(t.c.bucket >= lo, t.c.bucket < hi, tuple_(t.c.cluster, t.c.job_id).in_(part)))
    if rows.height:
        store.write_frames([(JOB_USAGE_HOUR, rows)], source=f"job_usage:{lo.isoformat()}")
    return rows.height


def advance(store: Store, now: dt.datetime, max_chunks: int = 30) -> dict[str, Any]:
    """Roll every hour the hour tier has and ``SETTLE`` has passed since the watermark (a day per chunk, at most
    ``max_chunks`` a call), then heal the last ``HEAL_WINDOW``'s jobs whose rows no longer match them. What it did."""
    now = as_utc(now)
    with tracer().start_as_current_span("job_usage.advance"):
        hour_wm = tiers.watermark(store, "hour")
        if hour_wm is None:
            return {"watermark": None, "hours": 0, "rows": 0, "healed_jobs": 0}
        bound = min(hour_wm, tiers.floor_to(now - SETTLE, "hour"))
        wm = watermark(store)
        start = wm
        if start is None:
            first = tiers.oldest(store, "hour")
            start = min(bound, tiers.floor_to(first, "hour")) if first is not None else bound
        hours = rows = chunks = 0
        cur = start
        while cur < bound and chunks < max_chunks:
            hi = min(bound, cur + CHUNK)
            rows += roll(store, cur, hi)
            tiers._set_watermark(store, TIER, wm, hi, now)
            hours += int((hi - cur) / dt.timedelta(hours=1))
            wm, cur, chunks = hi, hi, chunks + 1
        if wm is None:
            tiers._set_watermark(store, TIER, None, cur, now)
            wm = cur
        healed = heal(store, wm)
        return {"watermark": wm.isoformat(), "hours": hours, "rows": rows, "healed_jobs": healed}


def heal(store: Store, rolled_to: dt.datetime) -> int:
    """Re-roll the jobs of ``[rolled_to - HEAL_WINDOW, rolled_to)`` whose rows no longer match them (a record or
    node list that arrived after their hours were rolled). Jobs re-rolled."""
    lo = rolled_to - HEAL_WINDOW
    jobs = jobs_in(store, lo, rolled_to, COST_COLUMNS).filter(pl.col("start_at").is_not_null())
    if not jobs.height:
        return 0
    jg = job_gpus(store, jobs)
    spans = _spans(jobs, lo, rolled_to)
    _, stale = _rolled(store, spans, jg, lo, rolled_to)
    if not stale.height:
        return 0
    redo = jobs.join(spans.join(stale, on="_j").select("cluster", "job_id"), on=["cluster", "job_id"])
    roll(store, lo, rolled_to, redo)
    return redo.height


def scheduled_advance(store: Store, settings: Settings, *, now_iso: str | None = None) -> dict[str, Any]:
    """Beat's ``job-usage-rollup`` (``services.scheduled``): ``advance`` at ``now_iso``, else now."""
    return advance(store, at(now_iso))

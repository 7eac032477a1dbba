"""Team costs: per team and period the GPU-hours allocated and used, energy, CO2e and cost of the scheduler
jobs (``analyzers/chargeback.py``), over time for the Teams & Cost page, and the monthly showback report;
the jobs that cost the most; where each team stands against its monthly budget (``analyzers/team_budgets.py``),
for the API and the health sweep. The team rules and budgets themselves are ``services/teams.py``'s.

Reads the store (``sched_job``, ``sched_job_node``, ``sched_node``, ``sched_account``, ``team_mapping``,
``team_budget``, ``gpu``, ``host``, ``site``, ``gpu_sample``, ``gpu_workload``, ``ingest_log``), the price
book of ``services/serving.py`` and the sites' Scope 2 of ``services/energy.py``.
"""

from __future__ import annotations

import csv
import datetime as dt
import io
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from analyzers import carbon, chargeback
from analyzers import scheduler as sched_analysis
from analyzers import team_budgets
from fleetscope.core import scheduler_frames as SCH
from fleetscope.core.errors import ValidationError
from fleetscope.core.units import as_utc
from fleetscope.services.analysis import at
from fleetscope.services import energy as energy_service
from fleetscope.services import serving as serving_service
from fleetscope.services import tiers
from fleetscope.services.teams import month_bounds
from fleetscope.store import Store
from fleetscope.store.reads import fetch
from fleetscope.settings import Settings
from governance import reports

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


def host_sites(store: Store) -> dict[str, str]:
    """Each host's site, where the host table names one: what prices and carbon intensities are looked up by."""
    h = store.read("host")
    return {r["host"]: r["site_id"] for r in h.iter_rows(named=True) if r.get("site_id")} if h.height else {}


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
    df = pl.concat(parts) if parts else pl.DataFrame(schema={c: pl.Float64 for c in cols})
    return df.select(pl.col("bucket").alias("ts"), "gpu_uuid", pl.col("util_ratio_mean").alias("util_ratio"),
                     pl.col("power_w_mean").alias("power_w"), pl.col("samples").cast(pl.Float64).alias("_w"))


def busy(store: Store, alloc: pl.DataFrame, start: dt.datetime, end: dt.datetime) -> pl.DataFrame:
    """Per job: ``busy_ratio`` (mean util_ratio of its GPUs' samples while it held them inside the period)
    and ``energy_j`` (per GPU, the mean power of those samples × the time held). Over a period longer than hours
    the samples are the hour tier's buckets (``usage_tier``), each counted whole where it starts inside the
    hold and weighted by its samples: a hold's first and last partial hours are then an hour's mean."""
    schema = {"cluster": pl.String, "job_id": pl.String, "busy_ratio": pl.Float64, "energy_j": pl.Float64}
    jg = job_gpus(store, alloc)
    if not jg.height:
        return pl.DataFrame(schema=schema)
    tier = usage_tier(store, start, end)
    samples = _held_source(store, tier, start, end, jg["gpu_uuid"].unique())
    if not samples.height:
        return pl.DataFrame(schema=schema)
    lo, hi = pl.lit(as_utc(start)).cast(pl.Datetime("us", "UTC")), pl.lit(as_utc(end)).cast(pl.Datetime("us", "UTC"))
    spans = alloc.select("cluster", "job_id", pl.max_horizontal("start_at", lo).alias("s"), pl.min_horizontal(pl.col("end_at").fill_null(hi), hi).alias("e"))
    spans = spans.unique(["cluster", "job_id"], keep="first", maintain_order=True).with_row_index("_j")
    # grouped by integers (the held span, then the job), not by millions of (cluster, job, GPU) strings; over a
    # tier a hold takes the buckets from the one it starts in (``s`` truncated; ``s0`` its start), so a hold
    # inside an hour still has its hour
    held = jg.join(spans, on=["cluster", "job_id"]).select("_j", "gpu_uuid", pl.col("s").alias("s0"), "e").with_row_index("_h")
    held = held.with_columns((pl.col("s0") if tier == "raw" else pl.col("s0").dt.truncate("1h")).alias("s"))
    x = held_samples(held, samples)
    def weighted_mean(c: str) -> pl.Expr:
        w = pl.col("_w").filter(pl.col(c).is_not_null()).sum()
        return pl.when(w > 0).then((pl.col(c) * pl.col("_w")).sum() / w).otherwise(None)

    per_gpu = x.group_by("_h").agg(
        pl.col("_j").first(), weighted_mean("util_ratio").alias("u"), weighted_mean("power_w").alias("p"),
        ((pl.col("e").first() - pl.col("s0").first()).dt.total_microseconds() / 1e6).alias("held_s"))
    per_job = per_gpu.group_by("_j").agg(
        pl.col("u").mean().alias("busy_ratio"),
        pl.when(pl.col("p").is_not_null().any()).then((pl.col("p") * pl.col("held_s")).sum()).otherwise(None).alias("energy_j"))
    return per_job.join(spans.select("_j", "cluster", "job_id"), on="_j").select(list(schema))


def held_samples(held: pl.DataFrame, samples: pl.DataFrame) -> pl.DataFrame:
    """Each sample of ``samples`` (ts, gpu_uuid, ...) taken while a row of ``held`` (gpu_uuid, s, e, ...) held its
    GPU (``s <= ts < e``), with that row's columns: the join of the two on the GPU, filtered to the span, without
    forming the pairs that fall outside it. Samples are sorted by (GPU, time) once and each span finds its first
    and last sample by binary search, so the work is the samples that count, not spans × samples per GPU."""
    ids = samples.select(pl.col("gpu_uuid").unique().sort()).with_row_index("_g")
    offset = pl.lit(samples["ts"].min()).cast(pl.Datetime("us", "UTC"))
    span_us = int((samples["ts"].max() - samples["ts"].min()).total_seconds() * 1e6) + 2
    shift = (span_us + 2).bit_length()
    if (ids.height << shift) >= 2**62:  # the (GPU, time) key would overflow: the plain join, filtered
        return held.join(samples, on="gpu_uuid").filter((pl.col("ts") >= pl.col("s")) & (pl.col("ts") < pl.col("e")))

    def key(t: str) -> pl.Expr:
        rel = (pl.col(t) - offset).dt.total_microseconds().clip(-1, span_us)  # before the first sample: -1 sorts first; past the last: span
        return (pl.col("_g").cast(pl.Int64) * (1 << shift) + rel + 1)

    ss = samples.join(ids, on="gpu_uuid").with_columns(key("ts").alias("_k")).sort("_k")
    keys = ss["_k"]
    h = held.join(ids, on="gpu_uuid").with_columns(key("s").alias("_ks"), key("e").alias("_ke"))
    # binary searches in key order walk the sorted samples once instead of jumping about them (several times
    # faster for millions of spans); the positions go back to the spans' own order, so nothing else moves
    order = h["_ks"].arg_sort().to_numpy()
    lo, hi = np.empty(h.height, np.int64), np.empty(h.height, np.int64)
    lo[order] = keys.search_sorted(h["_ks"].gather(order), side="left").to_numpy()
    hi[order] = keys.search_sorted(h["_ke"].gather(order), side="left").to_numpy()
    h = h.with_columns(pl.Series("_lo", lo), pl.Series("_hi", hi))
    h = h.filter(pl.col("_hi") > pl.col("_lo")).with_columns(pl.int_ranges("_lo", "_hi").alias("_row")).explode("_row")
    rows = ss.drop("_k", "_g", "gpu_uuid").with_row_index("_row")
    return h.drop("_g", "_ks", "_ke", "_lo", "_hi").join(rows.with_columns(pl.col("_row").cast(h.schema["_row"])), on="_row").drop("_row")


def carbon_rates(store: Store, start: dt.datetime, end: dt.datetime, site_ids: list[str]) -> pl.DataFrame:
    """Per site, the location- and market-based intensity (g/kWh) of its energy over [start, end): its Scope 2
    (``services.energy.site_scope2``: roll-up energy × hourly or annual grid intensity; contractual
    instruments) over that energy. A site with no roll-up energy in the period takes the annual grid
    average of its region or country for both (no instrument can be applied to energy not measured), and
    ``carbon_basis`` says so."""
    site = store.read("site")
    known = sorted(set(site_ids) & set(site["site_id"].to_list())) if site.height else []
    if not known:
        return pl.DataFrame(schema=chargeback.CARBON_RATE_SCHEMA)
    s2 = energy_service.site_scope2(store, start, end, known)
    annual = carbon.site_intensity(site.filter(pl.col("site_id").is_in(known)))
    per_kwh = pl.col("energy_j") / carbon.J_PER_KWH
    measured = pl.col("energy_j") > 0
    return (s2.join(annual.select("site_id", pl.col("g_per_kwh").alias("_annual"), "year", "intensity_source"), on="site_id", how="left")
            .select("site_id",
                    pl.when(measured).then(pl.col("location_kgco2e") * 1000 / per_kwh).otherwise(pl.col("_annual")).alias("location_g_per_kwh"),
                    pl.when(measured).then(pl.col("market_kgco2e") * 1000 / per_kwh).otherwise(pl.col("_annual")).alias("market_g_per_kwh"),
                    pl.when(measured).then(pl.format("the site's Scope 2 over its energy in the period; location: {}; market: {}{}",
                                                      pl.col("intensity_basis"), pl.lit(energy_service.MARKET_METHOD), pl.col("uncovered_basis")))
                    .otherwise(pl.format("no roll-up energy at the site in the period: annual grid average {} ({}) for both, no instrument applied",
                                         pl.col("year"), pl.col("intensity_source"))).alias("carbon_basis"))
            .select([pl.col(c).cast(t) for c, t in chargeback.CARBON_RATE_SCHEMA.items()]))


def job_costs(store: Store, *, start: dt.datetime, end: dt.datetime, now: dt.datetime | None = None,
              rates: list[pl.DataFrame] | None = None) -> pl.DataFrame:
    """Per job in the period: team, GPU-hours allocated and used, energy, CO2e (location- and market-based) and
    cost (``analyzers.chargeback.job_costs``, ``with_carbon``). ``rates``, when given, receives the sites'
    carbon intensities the CO2e rests on (:func:`carbon_rates`)."""
    costs, r = _job_costs(store, as_utc(start), as_utc(end), as_utc(now) if now else None)
    if rates is not None:
        rates.append(r)
    return costs


def _job_costs(store: Store, start: dt.datetime, end: dt.datetime, now: dt.datetime | None) -> tuple[pl.DataFrame, pl.DataFrame]:
    jobs = jobs_in(store, start, end, COST_COLUMNS)
    jobs = chargeback.assign_teams(jobs, store.read("team_mapping"), store.read("sched_account"))
    alloc = sched_analysis.allocated_gpu_seconds(jobs, start, end, now=now)
    costs = chargeback.job_costs(alloc, busy=busy(store, alloc, start, end), prices=serving_service.price_book(store), sites=host_sites(store), start=start)
    r = carbon_rates(store, start, end, costs.filter(pl.col("energy_kwh").is_not_null())["site_id"].drop_nulls().unique().sort().to_list())
    return chargeback.with_carbon(costs, r), r


def usage(store: Store, *, start: dt.datetime, end: dt.datetime, now: dt.datetime | None = None) -> pl.DataFrame:
    """Per team in the period: jobs, GPU-hours allocated and used, busy share, energy (kWh), CO2e (location- and
    market-based, kg) and cost."""
    return chargeback.team_totals(job_costs(store, start=start, end=end, now=now))


def usage_report(store: Store, *, start: dt.datetime, end: dt.datetime, now: dt.datetime | None = None) -> dict[str, Any]:
    """:func:`usage` with the carbon intensity of each site it rests on and how that was reached."""
    rates: list[pl.DataFrame] = []
    totals = chargeback.team_totals(job_costs(store, start=start, end=end, now=now, rates=rates))
    return {"teams": totals, "carbon": rates[0] if rates else pl.DataFrame(schema=chargeback.CARBON_RATE_SCHEMA)}


def top_jobs(store: Store, *, start: dt.datetime, end: dt.datetime, limit: int = 20, now: dt.datetime | None = None) -> pl.DataFrame:
    """The jobs that cost the most in the period (by cost, then GPU-hours where no price applies)."""
    return _top(job_costs(store, start=start, end=end, now=now), limit)


def _top(costs: pl.DataFrame, limit: int) -> pl.DataFrame:
    return costs.sort(["cost", "gpu_hours"], descending=True, nulls_last=True).head(max(1, min(int(limit), 1000)))


def usage_and_top_jobs(store: Store, *, start: dt.datetime, end: dt.datetime, limit: int = 20,
                       now: dt.datetime | None = None) -> tuple[pl.DataFrame, pl.DataFrame]:
    """:func:`usage` and :func:`top_jobs` of one period from one working-out of its job costs (a page showing both:
    over a month of a large fleet the job costs are seconds of reading the hour tier)."""
    costs = job_costs(store, start=start, end=end, now=now)
    return chargeback.team_totals(costs), _top(costs, limit)


SHOWBACK_COLUMNS = ("team", "jobs", "gpu_hours", "used_gpu_hours", "busy_share", "energy_kwh", "location_kgco2e", "market_kgco2e", "cost", "currency")


def showback(store: Store, month: str, *, now: dt.datetime | None = None, top: int = 20) -> dict[str, Any]:
    """The month's showback report per team: usage, energy, CO2e and cost, the top jobs by cost, and the carbon
    intensity per site the CO2e rests on."""
    start, end = month_bounds(month)
    now = as_utc(now or dt.datetime.now(dt.UTC))
    rates: list[pl.DataFrame] = []
    costs = job_costs(store, start=start, end=end, now=min(now, end), rates=rates)
    totals = chargeback.team_totals(costs)
    top_jobs_ = costs.sort(["cost", "gpu_hours"], descending=True, nulls_last=True).head(top)
    return {"title": f"GPU showback {month}", "month": month, "start": start.isoformat(), "end": end.isoformat(), "generated_at": now.isoformat(),
            "jobs": costs.height, "teams": totals.select(list(SHOWBACK_COLUMNS)).to_dicts(), "top_jobs": top_jobs_.to_dicts(),
            "carbon": rates[0].to_dicts() if rates else []}


def showback_csv(report: dict[str, Any]) -> bytes:
    """The report's per-team table as CSV (RFC 4180), one row per team."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\r\n")
    w.writerow(["month", *SHOWBACK_COLUMNS])
    for t in report["teams"]:
        w.writerow([report["month"], *("" if t.get(c) is None else (f"{t[c]:.6f}" if isinstance(t[c], float) else t[c]) for c in SHOWBACK_COLUMNS)])
    return buf.getvalue().encode()


def write_showback(store: Store, month: str, out_dir: Any, *, now: dt.datetime | None = None) -> dict[str, Any]:
    """Write ``showback-MONTH.csv`` and ``.pdf`` (``.html`` where PDF rendering is unavailable) under ``out_dir``
    through the audit reports' rendering (``governance/reports.py``); the paths and the report."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    report = showback(store, month, now=now)
    files = {}
    csv_path = out / f"showback-{month}.csv"
    csv_path.write_bytes(showback_csv(report))
    files["csv"] = str(csv_path)
    html = reports.render_html(report, "showback_report.html.j2")
    try:
        pdf = reports.render_pdf(html=html)
        (out / f"showback-{month}.pdf").write_bytes(pdf)
        files["pdf"] = str(out / f"showback-{month}.pdf")
    except reports.PdfUnavailable as exc:
        (out / f"showback-{month}.html").write_text(html, "utf-8")
        files["html"] = str(out / f"showback-{month}.html")
        files["pdf_unavailable"] = str(exc)
    return {"files": files, "report": report}


def scheduled_showback(store: Store, settings: Settings, *, month: str | None = None) -> dict[str, Any]:
    """Beat's monthly ``teams-showback`` (``services.scheduled``): ``month`` (YYYY-MM, else the one just closed)
    written under the data directory's ``reports/``; the files written."""
    return write_showback(store, month or previous_month(at(None)), settings.data_dir / "reports")["files"]


def previous_month(now: dt.datetime) -> str:
    """The calendar month before ``now``'s, as YYYY-MM (what beat reports on the 1st)."""
    first = as_utc(now).replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    last = first - dt.timedelta(days=1)
    return f"{last.year:04d}-{last.month:02d}"


# --- budgets ---------------------------------------------------------------------------------------

_NO_USAGE = {"team": pl.String, "gpu_hours": pl.Float64, "cost": pl.Float64, "currency": pl.String}


def budget_status(store: Store, *, month: str | None = None, now: dt.datetime | None = None) -> pl.DataFrame:
    """Per team with a budget: the month's usage so far against its quota and budget, projected to the month's
    end (``analyzers.team_budgets``); the month ``now`` is in by default."""
    now = as_utc(now or dt.datetime.now(dt.UTC))
    month = month or f"{now.year:04d}-{now.month:02d}"
    start, end = month_bounds(month)
    b = store.read("team_budget")
    if not b.height:
        return pl.DataFrame(schema=team_budgets.STATUS_SCHEMA)
    used = usage(store, start=start, end=end, now=min(now, end)) if now > start else pl.DataFrame(schema=_NO_USAGE)
    return team_budgets.budget_status(used, b, month=month, start=start, end=end, now=now)


USAGE_REFRESH = dt.timedelta(minutes=15)
"""The health sweep's month-to-date usage is recomputed at most this often, and then only when the hour has
turned or scheduler, team or price data has been written since (a month of a large fleet is seconds of CPU)."""

_USAGE_INPUTS = ("sched_job", "sched_job_node", "sched_account", "team_mapping", "price_book")
"""Frames whose writes change month-to-date usage at once (telemetry's share of it waits for the hour)."""


@dataclass
class _MonthToDate:
    month: str
    as_of: dt.datetime
    ingest_id: int
    used: pl.DataFrame


_month_to_date: weakref.WeakKeyDictionary[Store, _MonthToDate] = weakref.WeakKeyDictionary()


def _last_ingest_id(store: Store) -> int:
    n = store.query("SELECT MAX(ingest_id) AS n FROM ingest_log", [], {"n": pl.Int64})["n"][0]
    return int(n or 0)


def _inputs_written_since(store: Store, ingest_id: int) -> bool:
    # the ingest log records every committed write with the rows it wrote per frame (``Store._log_ingest``)
    like = " OR ".join("rows_json LIKE ?" for _ in _USAGE_INPUTS)
    q = f"SELECT COUNT(*) AS n FROM (SELECT 1 FROM ingest_log WHERE ingest_id > ? AND ({like}) LIMIT 1) w"
    return bool(store.query(q, [ingest_id, *(f'%"{f}"%' for f in _USAGE_INPUTS)], {"n": pl.Int64})["n"][0])


def month_to_date_usage(store: Store, *, now: dt.datetime) -> tuple[pl.DataFrame, dt.datetime]:
    """The usage of the month ``now`` is in, up to ``now`` or up to when it was last computed (returned with it):
    recomputed when the month or the hour (of ``now``) turned, or scheduler, team-mapping or price data was
    written since and ``USAGE_REFRESH`` has passed. For the 5-minute health sweep, which then pages within
    ``USAGE_REFRESH`` of new jobs and within the hour as running jobs and telemetry accumulate."""
    now = as_utc(now)
    month = f"{now.year:04d}-{now.month:02d}"
    start, end = month_bounds(month)
    c = _month_to_date.get(store)
    if c is not None and c.month == month and c.as_of <= now:
        same_hour = c.as_of.replace(minute=0, second=0, microsecond=0) == now.replace(minute=0, second=0, microsecond=0)
        if same_hour and (now - c.as_of < USAGE_REFRESH or not _inputs_written_since(store, c.ingest_id)):
            return c.used, c.as_of
    ingest_id = _last_ingest_id(store)  # before the read: a write during it is seen next time
    used = usage(store, start=start, end=end, now=min(now, end)) if now > start else pl.DataFrame(schema=_NO_USAGE)
    _month_to_date[store] = _MonthToDate(month, now, ingest_id, used)
    return used, now


def budget_findings(store: Store, *, now: dt.datetime) -> pl.DataFrame:
    """Findings for teams over, or projected over, this month's budget (nothing to read without budgets). The
    budgets are read each time (a raised quota ends the finding at once); the usage is
    :func:`month_to_date_usage`'s, projected from when it was computed."""
    now = as_utc(now)
    month = f"{now.year:04d}-{now.month:02d}"
    start, end = month_bounds(month)
    b = store.read("team_budget")
    if not b.height:
        return team_budgets.budget_findings(pl.DataFrame(schema=team_budgets.STATUS_SCHEMA), start=start, now=now)
    used, as_of = month_to_date_usage(store, now=now)
    status = team_budgets.budget_status(used, b, month=month, start=start, end=end, now=as_of)
    return team_budgets.budget_findings(status, start=start, now=now)


# --- the Teams & Cost page's usage over time ---------------------------------------------------------

MAX_BUCKETS = 400


def usage_over_time(store: Store, *, start: dt.datetime, end: dt.datetime, step_s: int, now: dt.datetime | None = None) -> pl.DataFrame:
    """Per time bucket of ``step_s`` seconds and team: jobs, GPU-hours allocated and their GPU-hour cost from
    the price book. The energy cost needs telemetry per job and period and is in ``usage`` only, so a bucket's
    ``gpu_cost`` is the allocation's price alone."""
    start, end = as_utc(start), as_utc(end)
    if end <= start:
        raise ValidationError("end must be after start", frame="usage", field="end")
    step = dt.timedelta(seconds=max(int(step_s), 1))
    if (end - start) / step > MAX_BUCKETS:
        raise ValidationError(f"more than {MAX_BUCKETS} buckets of {int(step_s)} s: take a longer step", frame="usage", field="step_s")
    schema = {"bucket_start": pl.Datetime("us", "UTC"), "team": pl.String, "jobs": pl.UInt32, "gpu_hours": pl.Float64,
              "gpu_cost": pl.Float64, "currency": pl.String}
    jobs = chargeback.assign_teams(jobs_in(store, start, end), store.read("team_mapping"), store.read("sched_account"))
    if not jobs.height:
        return pl.DataFrame(schema=schema)
    prices, sites, now_ = serving_service.price_book(store), host_sites(store), as_utc(now) if now else None
    parts = []
    b = start
    while b < end:
        e = min(b + step, end)
        alloc = sched_analysis.allocated_gpu_seconds(jobs, b, e, now=now_)
        if alloc.height:
            c = chargeback.job_costs(alloc, busy=None, prices=prices, sites=sites, start=b)
            parts.append(c.group_by("team").agg(pl.len().cast(pl.UInt32).alias("jobs"), pl.col("gpu_hours").sum(),
                                                pl.when(pl.col("gpu_cost").is_not_null().any()).then(pl.col("gpu_cost").sum()).otherwise(None).alias("gpu_cost"),
                                                pl.col("currency").drop_nulls().first())
                         .with_columns(pl.lit(b).cast(pl.Datetime("us", "UTC")).alias("bucket_start")).select(list(schema)))
        b = e
    return pl.concat(parts).sort("bucket_start", "team", nulls_last=True) if parts else pl.DataFrame(schema=schema)

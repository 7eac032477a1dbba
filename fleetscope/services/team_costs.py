"""Team costs: per team and period the GPU-hours allocated and used, energy, CO2e and cost of the scheduler
jobs (``analyzers/chargeback.py``), over time for the Teams & Cost page, and the monthly showback report;
the jobs that cost the most; where each team stands against its monthly budget (``analyzers/team_budgets.py``),
for the API and the health sweep. The team rules and budgets themselves are ``services/teams.py``'s.

Reads the store (``sched_job``, ``sched_account``, ``team_mapping``, ``team_budget``, ``host``, ``site``,
``ingest_log``), what jobs used of their GPUs (``services/job_usage.py``), the price book of
``services/serving.py`` and the sites' Scope 2 of ``services/energy.py``.
"""

from __future__ import annotations

import csv
import datetime as dt
import io
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl

from analyzers import carbon, chargeback
from analyzers import scheduler as sched_analysis
from analyzers import team_budgets
from fleetscope.core.errors import ValidationError
from fleetscope.core.units import as_utc
from fleetscope.services.analysis import at
from fleetscope.services import energy as energy_service
from fleetscope.services import serving as serving_service
from fleetscope.services.job_usage import COST_COLUMNS, busy, jobs_in
from fleetscope.services.teams import month_bounds
from fleetscope.store import Store
from fleetscope.settings import Settings
from governance import reports


def host_sites(store: Store) -> dict[str, str]:
    """Each host's site, where the host table names one: what prices and carbon intensities are looked up by."""
    h = store.read("host")
    return {r["host"]: r["site_id"] for r in h.iter_rows(named=True) if r.get("site_id")} if h.height else {}


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
    # every (job, bucket) it held GPUs in at once, each allocated over its own bucket and priced at its start clipped
    # to the bucket: one pricing of the rows, not an allocation and a pricing per bucket
    utc = pl.Datetime("us", "UTC")
    t0, hi = pl.lit(start).cast(utc), pl.lit(end).cast(utc)
    step_us = int(step.total_seconds() * 1e6)
    first = (pl.max_horizontal("start_at", t0) - t0).dt.total_microseconds() // step_us
    last = ((pl.min_horizontal(pl.col("end_at").fill_null(hi), hi) - t0).dt.total_microseconds() - 1) // step_us
    buckets = (jobs.filter(pl.col("start_at").is_not_null()).with_columns(first.alias("_k0"), last.alias("_k1"))
               .filter(pl.col("_k1") >= pl.col("_k0")).with_columns(pl.int_ranges("_k0", pl.col("_k1") + 1).alias("_k")).explode("_k")
               .with_columns((t0 + pl.duration(microseconds=pl.col("_k") * step_us)).alias("bucket_start"))
               .with_columns(pl.min_horizontal(pl.col("bucket_start") + pl.duration(microseconds=step_us), hi).alias("_bucket_end")))
    held = sched_analysis.allocated_gpu_seconds(buckets, "bucket_start", "_bucket_end", now=as_utc(now) if now else None)
    held = held.with_columns(pl.max_horizontal("start_at", "bucket_start").alias("start_at"))
    if not held.height:
        return pl.DataFrame(schema=schema)
    c = chargeback.job_costs(held, busy=None, prices=serving_service.price_book(store), sites=host_sites(store), start=start)
    c = c.with_columns(held["bucket_start"])  # job_costs keeps its rows' order, one out per one in
    return (c.group_by("bucket_start", "team").agg(
                pl.len().cast(pl.UInt32).alias("jobs"), pl.col("gpu_hours").sum(),
                pl.when(pl.col("gpu_cost").is_not_null().any()).then(pl.col("gpu_cost").sum()).otherwise(None).alias("gpu_cost"),
                pl.col("currency").drop_nulls().first())
            .select(list(schema)).sort("bucket_start", "team", nulls_last=True))

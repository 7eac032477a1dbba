"""Teams and cost: the mapping of Slurm accounts, organizations, users, Kubernetes namespaces and labels to
teams (set through the API, recorded with who and when, audit-logged), and per team and period the GPU-hours
allocated and used, energy, CO2e and cost of the scheduler jobs (``analyzers/chargeback.py``); monthly team
budgets and where each team stands against them (``analyzers/team_budgets.py``); stranded capacity
(``analyzers/stranded.py``); with the scheduler reads the Teams & Cost views share: outcomes, queue waits,
pending reasons, top jobs by cost.

Reads the store (``sched_job``, ``sched_job_node``, ``sched_node``, ``sched_account``, ``team_mapping``,
``team_budget``, ``gpu``, ``host``, ``site``, ``gpu_sample``, ``gpu_workload``), the price book of
``services/serving.py`` and the sites' Scope 2 of ``services/energy.py``; writes ``team_mapping`` and
``team_budget``.
"""

from __future__ import annotations

import csv
import datetime as dt
import io
import json
import re
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from analyzers import carbon, chargeback, serving_energy
from analyzers import idle_allocations as idle
from analyzers import scheduler as sched_analysis
from analyzers import stranded as stranded_analysis
from analyzers import team_budgets
from fleetscope.core import scheduler_frames as SCH
from fleetscope.core.errors import ValidationError
from fleetscope.core.frames import findings_frame
from fleetscope.core.slurm import expand_hostlist
from fleetscope.core.units import as_utc
from fleetscope.services import auditlog
from fleetscope.services.analysis import at
from fleetscope.services import energy as energy_service
from fleetscope.services import serving as serving_service
from fleetscope.store import Store
from fleetscope.store.reads import fetch
from fleetscope.settings import Settings
from governance import reports

MAX_JOBS = 2_000_000
_NAME_MAX = 200


def set_mapping(store: Store, *, kind: str, match: str, team: str, cluster: str = "", recorded_by: str,
                now: dt.datetime | None = None) -> dict[str, Any]:
    """Map a Slurm account / organization / user, a Kubernetes namespace or a label (``key=value``) to a team;
    re-sending the same kind, match and cluster moves it. Appended to the audit log: who, when, what."""
    if kind not in chargeback.KINDS:
        raise ValidationError(f"kind must be one of {', '.join(chargeback.KINDS)}", frame="team_mapping", field="kind")
    for name, value in (("match", match), ("team", team), ("cluster", cluster)):
        if not isinstance(value, str) or len(value) > _NAME_MAX or any(ord(c) < 32 for c in value) or (name != "cluster" and not value.strip()):
            raise ValidationError(f"{name} must be 1-{_NAME_MAX} printable characters", frame="team_mapping", field=name)
    if kind == "k8s_label" and "=" not in match:
        raise ValidationError("a label rule matches key=value", frame="team_mapping", field="match")
    row = {"kind": kind, "match": match.strip(), "cluster": cluster.strip(), "team": team.strip(), "recorded_by": recorded_by,
           "recorded_at": as_utc(now or dt.datetime.now(dt.UTC))}
    store.write_frames([(SCH.TEAM_MAPPING, SCH.frame(SCH.TEAM_MAPPING, [row]))], source=f"team_mapping:{kind}")
    out = {k: (v.isoformat() if isinstance(v, dt.datetime) else v) for k, v in row.items()}
    auditlog.log(store, actor=recorded_by, action="team_mapping", subject=f"{kind}:{row['match']}", payload=out)
    return out


def mappings(store: Store) -> pl.DataFrame:
    """Every team rule, newest first."""
    df = store.read("team_mapping")
    return df.sort("recorded_at", descending=True) if df.height else df


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


def _sites(store: Store) -> dict[str, str]:
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


def busy(store: Store, alloc: pl.DataFrame, start: dt.datetime, end: dt.datetime) -> pl.DataFrame:
    """Per job: ``busy_ratio`` (mean util_ratio of its GPUs' samples while it held them inside the period)
    and ``energy_j`` (per GPU, the mean power of those samples × the time held)."""
    schema = {"cluster": pl.String, "job_id": pl.String, "busy_ratio": pl.Float64, "energy_j": pl.Float64}
    jg = job_gpus(store, alloc)
    if not jg.height:
        return pl.DataFrame(schema=schema)
    uuids = jg["gpu_uuid"].unique()
    cols = ["ts", "gpu_uuid", "util_ratio", "power_w"]
    if uuids.len() > GPU_FILTER_MAX:  # most of a fleet: one time-bounded read (parallel on SQLite), filtered here
        samples = store.read("gpu_sample", start=start, end=end, columns=cols).filter(pl.col("gpu_uuid").is_in(uuids.implode()))
    else:
        samples = store.read("gpu_sample", start=start, end=end, gpu_uuid=uuids.to_list(), columns=cols)
    if not samples.height:
        return pl.DataFrame(schema=schema)
    lo, hi = pl.lit(as_utc(start)).cast(pl.Datetime("us", "UTC")), pl.lit(as_utc(end)).cast(pl.Datetime("us", "UTC"))
    spans = alloc.select("cluster", "job_id", pl.max_horizontal("start_at", lo).alias("s"), pl.min_horizontal(pl.col("end_at").fill_null(hi), hi).alias("e"))
    spans = spans.unique(["cluster", "job_id"], keep="first", maintain_order=True).with_row_index("_j")
    # grouped by integers (the held span, then the job), not by millions of (cluster, job, GPU) strings
    held = jg.join(spans, on=["cluster", "job_id"]).select("_j", "gpu_uuid", "s", "e").with_row_index("_h")
    x = held_samples(held, samples)
    per_gpu = x.group_by("_h").agg(
        pl.col("_j").first(), pl.col("util_ratio").mean().alias("u"), pl.col("power_w").mean().alias("p"),
        ((pl.col("e").first() - pl.col("s").first()).dt.total_microseconds() / 1e6).alias("held_s"))
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
    start, end = as_utc(start), as_utc(end)
    jobs = jobs_in(store, start, end, COST_COLUMNS)
    jobs = chargeback.assign_teams(jobs, store.read("team_mapping"), store.read("sched_account"))
    alloc = sched_analysis.allocated_gpu_seconds(jobs, start, end, now=as_utc(now) if now else None)
    costs = chargeback.job_costs(alloc, busy=busy(store, alloc, start, end), prices=serving_service.price_book(store), sites=_sites(store), start=start)
    r = carbon_rates(store, start, end, costs.filter(pl.col("energy_kwh").is_not_null())["site_id"].drop_nulls().unique().sort().to_list())
    if rates is not None:
        rates.append(r)
    return chargeback.with_carbon(costs, r)


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
    c = job_costs(store, start=start, end=end, now=now)
    return c.sort(["cost", "gpu_hours"], descending=True, nulls_last=True).head(max(1, min(int(limit), 1000)))


def queue(store: Store, *, start: dt.datetime, end: dt.datetime, now: dt.datetime | None = None) -> dict[str, Any]:
    """Queue wait per partition and pending reasons, and end states as outcomes, for jobs in the period."""
    jobs = jobs_in(store, as_utc(start), as_utc(end))
    return {"queue_wait": sched_analysis.queue_wait_summary(jobs, as_utc(now) if now else None).to_dicts(),
            "pending_reasons": sched_analysis.pending_reasons(jobs).to_dicts(),
            "outcomes": sched_analysis.outcome_summary(jobs).to_dicts()}


def month_bounds(month: str) -> tuple[dt.datetime, dt.datetime]:
    """``2026-11`` as [2026-11-01, 2026-12-01) UTC; anything but YYYY-MM is refused (it names report files)."""
    if not isinstance(month, str) or not re.fullmatch(r"\d{4}-(0[1-9]|1[0-2])", month):
        raise ValidationError(f"month {str(month)[:20]!r} is not YYYY-MM", frame="report", field="month")
    try:
        y, m = (int(p) for p in month.split("-", 1))
        start = dt.datetime(y, m, 1, tzinfo=dt.UTC)
    except (ValueError, TypeError):
        raise ValidationError(f"month {month[:20]!r} is not YYYY-MM", frame="report", field="month") from None
    return start, (dt.datetime(y + 1, 1, 1, tzinfo=dt.UTC) if m == 12 else dt.datetime(y, m + 1, 1, tzinfo=dt.UTC))


IDLE_LOOKBACK = dt.timedelta(hours=6)


def idle_allocation_findings(store: Store, *, end: dt.datetime, threshold_ratio: float | None = None, min_idle_s: float | None = None) -> pl.DataFrame:
    """Findings for running scheduler jobs whose GPUs sat idle past the threshold (``analyzers.idle_allocations``),
    over the last ``IDLE_LOOKBACK`` of telemetry, priced from the price book where it can be."""
    end = as_utc(end)
    start = end - IDLE_LOOKBACK
    jobs = jobs_in(store, start, end).filter(pl.col("state") == "RUNNING")
    if not jobs.height:
        return idle.idle_findings(pl.DataFrame(schema={"cluster": pl.String, "job_id": pl.String, "gpu_uuid": pl.String}), pl.DataFrame())
    jobs = chargeback.assign_teams(jobs, store.read("team_mapping"), store.read("sched_account"))
    jg = job_gpus(store, jobs).join(jobs.select("cluster", "job_id", "team", "account"), on=["cluster", "job_id"])
    if not jg.height:
        return idle.idle_findings(jg, pl.DataFrame())
    gpus = store.read("gpu", gpu_uuid=jg["gpu_uuid"].unique().to_list(), columns=["gpu_uuid", "host"])
    jg = jg.join(gpus, on="gpu_uuid", how="left")
    samples = store.read("gpu_sample", start=start, end=end, gpu_uuid=jg["gpu_uuid"].unique().to_list(), columns=["ts", "gpu_uuid", "util_ratio"])
    # only the samples while the job held them: a GPU idle before the job started is not the job's waste
    spans = jobs.select("cluster", "job_id", "start_at")
    held = jg.join(spans, on=["cluster", "job_id"]).join(samples, on="gpu_uuid").filter(pl.col("ts") >= pl.col("start_at"))
    sites, prices, priced = _sites(store), serving_service.price_book(store), {}
    for r in jobs.iter_rows(named=True):
        hosts = expand_hostlist(r.get("nodes")) if r.get("nodes") else []
        model = (r.get("gpu_types") or "").split(",")[0].split(":")[0] if r.get("gpu_types") else ""
        p, cur = serving_energy.price_at(prices, sites.get(hosts[0]) if hosts else None, model, end, "gpu_hour_price")
        if p is not None:
            priced[(r["cluster"] or "", r["job_id"])] = (p, cur or "")
    kw = {k: v for k, v in (("threshold_ratio", threshold_ratio), ("min_idle_s", min_idle_s)) if v is not None}
    out = pl.concat([idle.idle_findings(g.select("cluster", "job_id", "gpu_uuid", "team", "account", "host"),
                                        g.select("ts", "gpu_uuid", "util_ratio"), prices=priced, **kw)
                     for _, g in held.group_by(["cluster", "job_id"])]) if held.height else idle.idle_findings(jg, pl.DataFrame())
    return out


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

_CURRENCY = re.compile(r"[A-Z]{3}")
MAX_LIMIT = 1e12  # GPU-hours or money in a month beyond any fleet: a unit mistake


def set_budget(store: Store, *, team: str, month: str = "", gpu_hour_quota: float | None = None, budget: float | None = None,
               currency: str | None = None, recorded_by: str, now: dt.datetime | None = None) -> dict[str, Any]:
    """Set a team's GPU-hour quota and/or money budget for a month (``YYYY-MM``) or every month (empty);
    re-sending the same team and month replaces it. Appended to the audit log: who, when, what."""
    def bad(field: str, message: str) -> ValidationError:
        return ValidationError(message, frame="team_budget", field=field)

    if not isinstance(team, str) or not team.strip() or len(team) > _NAME_MAX or any(ord(c) < 32 for c in team):
        raise bad("team", f"team must be 1-{_NAME_MAX} printable characters")
    if month:
        month_bounds(month)
    for name, v in (("gpu_hour_quota", gpu_hour_quota), ("budget", budget)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, int | float) or not (0 <= v <= MAX_LIMIT)):
            raise bad(name, f"{name} must be a number from 0 to {MAX_LIMIT:g}")
    if gpu_hour_quota is None and budget is None:
        raise bad("budget", "give a gpu_hour_quota, a budget or both")
    if budget is not None and (not isinstance(currency, str) or not _CURRENCY.fullmatch(currency)):
        raise bad("currency", "a money budget needs its ISO 4217 currency code, e.g. EUR")
    if budget is None and currency is not None:
        raise bad("currency", "a currency belongs to a money budget")
    row = {"team": team.strip(), "month": month or "", "gpu_hour_quota": None if gpu_hour_quota is None else float(gpu_hour_quota),
           "budget": None if budget is None else float(budget), "currency": currency, "recorded_by": recorded_by,
           "recorded_at": as_utc(now or dt.datetime.now(dt.UTC))}
    store.write_frames([(SCH.TEAM_BUDGET, SCH.frame(SCH.TEAM_BUDGET, [row]))], source=f"team_budget:{row['team']}")
    out = {k: (v.isoformat() if isinstance(v, dt.datetime) else v) for k, v in row.items()}
    auditlog.log(store, actor=recorded_by, action="team_budget", subject=f"team:{row['team']}", payload=out)
    return out


def budgets(store: Store) -> pl.DataFrame:
    """Every team budget, by team and month."""
    df = store.read("team_budget")
    return df.sort("team", "month") if df.height else df


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


# --- stranded capacity -------------------------------------------------------------------------------


STRANDED_FRESH = dt.timedelta(hours=1)


def stranded_capacity(store: Store, *, now: dt.datetime | None = None) -> dict[str, Any]:
    """Free GPUs no pending job can use (``analyzers.stranded``) from the scheduler's latest node records and
    queue: per partition, per node, the findings, and the GPU-hour price of each stranded node from the price
    book (at its site, for its GPU model). Nodes and pending jobs last observed more than ``STRANDED_FRESH``
    before the newest node record are left out: the queue and the free GPUs are compared at one moment."""
    now = as_utc(now or dt.datetime.now(dt.UTC))
    nodes = store.read("sched_node")
    empty = {"partitions": pl.DataFrame(schema=stranded_analysis.SUMMARY_SCHEMA), "nodes": pl.DataFrame(schema=stranded_analysis.NODE_SCHEMA),
             "findings": findings_frame([]), "stranded_gpus": 0, "cost_per_hour": None, "currency": None}
    if not nodes.height:
        return empty
    schema = dict(SCH.SCHED_JOB.schema)
    cols = ", ".join(f'"{c}"' for c in schema)
    pending = fetch(store, f"SELECT {cols} FROM sched_job WHERE state = 'PENDING' LIMIT {MAX_JOBS}", [], schema)
    held = None
    if nodes["gpus_alloc"].null_count():
        running = fetch(store, "SELECT cluster, job_id FROM sched_job WHERE state = 'RUNNING'", [], {"cluster": pl.String, "job_id": pl.String})
        held = store.read("sched_job_node", columns=["cluster", "job_id", "host", "gpus"]).join(running, on=["cluster", "job_id"])
    latest = nodes["observed_at"].max() if nodes["observed_at"].null_count() < nodes.height else None
    if latest is not None:  # the latest snapshot: a node or pending job last seen long before it is no longer known to be so
        nodes = nodes.filter(pl.col("observed_at").is_null() | (pl.col("observed_at") >= latest - STRANDED_FRESH))
        pending = pending.filter(pl.col("observed_at").is_null() | (pl.col("observed_at") >= latest - STRANDED_FRESH))
    per_node, summary = stranded_analysis.stranded(nodes, pending, held)
    out_nodes = per_node.filter(~pl.col("usable"))
    prices, sites, book = {}, _sites(store), serving_service.price_book(store)
    for r in out_nodes.unique("host").iter_rows(named=True):
        model = (r.get("gpu_types") or "").split(",")[0].split(":")[0]
        p, cur = serving_energy.price_at(book, sites.get(r["host"]), model, now, "gpu_hour_price")
        if p is not None:
            prices[r["host"]] = (p, cur or "")
    since = latest or now
    found = stranded_analysis.stranded_findings(per_node, summary, since=since, now=now, prices=prices)
    # the fleet's figure counts a node once, however many partitions share it: stranded in every queue it serves
    fleet = per_node.group_by("cluster", "host").agg(pl.col("usable").any(), pl.col("free_gpus").first()).filter(~pl.col("usable"))
    priced = [(r["free_gpus"] * prices[r["host"]][0], prices[r["host"]][1]) for r in fleet.iter_rows(named=True) if r["host"] in prices]
    cur = {c for _, c in priced}
    return {"partitions": summary, "nodes": out_nodes, "findings": found, "stranded_gpus": int(fleet["free_gpus"].sum()) if fleet.height else 0,
            "cost_per_hour": round(sum(p for p, _ in priced), 4) if priced and len(cur) == 1 else None,
            "currency": next(iter(cur)) if len(cur) == 1 else None}


# --- reads of the dashboard's Teams & Cost page ------------------------------------------------------

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
    prices, sites, now_ = serving_service.price_book(store), _sites(store), as_utc(now) if now else None
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


IDLE_COLUMNS = {"subject": pl.String, "team": pl.String, "account": pl.String, "gpus_idle": pl.Int64, "hosts": pl.String,
                "idle_since": pl.Datetime("us", "UTC"), "last_seen": pl.Datetime("us", "UTC"), "idle_gpu_hours": pl.Float64,
                "idle_cost": pl.Float64, "currency": pl.String, "summary": pl.String}


def idle_allocations(store: Store, *, start: dt.datetime, end: dt.datetime, limit: int = 500) -> pl.DataFrame:
    """The stored idle-allocation findings of the window (the health sweep's ``analyzers.idle_allocations``), the
    newest per job, with their evidence as columns: team, idle GPUs, since when, idle GPU-hours and cost."""
    # a finding is in the window when its own window overlaps it (as services.health reads findings)
    sql = ("SELECT subject, window_start, window_end, summary, evidence FROM finding WHERE analyzer = ? AND kind = ?"
           " AND window_start < ? AND (window_end IS NULL OR window_end >= ?)"
           f" ORDER BY window_end DESC LIMIT {max(1, min(int(limit), 5000))}")
    utc = pl.Datetime("us", "UTC")
    found = fetch(store, sql, [idle.ANALYZER, idle.KIND, as_utc(end), as_utc(start)],
                  {"subject": pl.String, "window_start": utc, "window_end": utc, "summary": pl.String, "evidence": pl.String})
    if not found.height:
        return pl.DataFrame(schema=IDLE_COLUMNS)
    newest = found.sort("window_end", descending=True, nulls_last=True).unique("subject", keep="first", maintain_order=True)
    rows = []
    for r in newest.iter_rows(named=True):
        try:
            ev = json.loads(r["evidence"] or "{}")
        except ValueError:
            ev = {}
        ev = ev if isinstance(ev, dict) else {}
        gpus, hosts = ev.get("gpus_idle"), ev.get("hosts")
        rows.append({"subject": r["subject"], "team": _text(ev.get("team")), "account": _text(ev.get("account")),
                     "gpus_idle": len(gpus) if isinstance(gpus, list) else 0,
                     "hosts": (",".join(h for h in hosts if isinstance(h, str)) or None) if isinstance(hosts, list) else None,
                     "idle_since": r["window_start"], "last_seen": r["window_end"], "idle_gpu_hours": _float(ev.get("idle_gpu_hours")),
                     "idle_cost": _float(ev.get("idle_cost")), "currency": _text(ev.get("currency")), "summary": r["summary"]})
    return pl.DataFrame(rows, schema=IDLE_COLUMNS).sort("idle_gpu_hours", descending=True, nulls_last=True)


def _float(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _text(v: Any) -> str | None:
    return v if isinstance(v, str) else None

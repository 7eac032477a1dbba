"""The scheduler's GPUs as they are used, for the Teams & Cost views and the health sweep: queue waits per
partition, pending reasons and end states (``analyzers/scheduler.py``); stranded capacity, the free GPUs no
pending job can use (``analyzers/stranded.py``); idle allocations, the GPUs a running job holds while
near-idle (``analyzers/idle_allocations.py``), found by the sweep and read back with their cost.

Reads the store (``sched_job``, ``sched_job_node``, ``sched_node``, ``sched_account``, ``team_mapping``,
``gpu``, ``host``, ``gpu_sample``, ``gpu_workload``, ``finding``) and the price book of
``services/serving.py``; jobs, their GPUs and their hosts' sites as ``services/team_costs.py`` reads them.
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import polars as pl

from analyzers import chargeback, serving_energy
from analyzers import idle_allocations as idle
from analyzers import scheduler as sched_analysis
from analyzers import stranded as stranded_analysis
from fleetscope.core import scheduler_frames as SCH
from fleetscope.core.frames import findings_frame
from fleetscope.core.slurm import expand_hostlist
from fleetscope.core.units import as_utc
from fleetscope.services import serving as serving_service
from fleetscope.services.job_usage import MAX_JOBS, job_gpus, jobs_in
from fleetscope.services.team_costs import host_sites
from fleetscope.store import Store
from fleetscope.store.reads import fetch

def queue(store: Store, *, start: dt.datetime, end: dt.datetime, now: dt.datetime | None = None) -> dict[str, Any]:
    """Queue wait per partition and pending reasons, and end states as outcomes, for jobs in the period."""
    jobs = jobs_in(store, as_utc(start), as_utc(end))
    return {"queue_wait": sched_analysis.queue_wait_summary(jobs, as_utc(now) if now else None).to_dicts(),
            "pending_reasons": sched_analysis.pending_reasons(jobs).to_dicts(),
            "outcomes": sched_analysis.outcome_summary(jobs).to_dicts()}


# --- idle allocations ------------------------------------------------------------------------------

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
    sites, prices, priced = host_sites(store), serving_service.price_book(store), {}
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
    prices, sites, book = {}, host_sites(store), serving_service.price_book(store)
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

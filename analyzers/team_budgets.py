"""Team budgets: teams over, or on course to go over, their monthly GPU-hour quota or money budget.

A budget (``team_budget``) holds for a calendar month: the team's own row for that month, else its standing
row (month empty). Against it, the team's usage so far in the month (``analyzers.chargeback.team_totals``:
GPU-hours allocated, cost from the price book):

- **over**: the month's usage already exceeds the quota or the budget;
- **projected over**: the run rate so far, carried to the month's end, exceeds it — used × month length /
  time elapsed, the linear forecast of FinOps Foundation's "Budgeting" and "Forecasting" capabilities. A
  rate from the first hours of a month says little, so no projection is made before ``MIN_ELAPSED_S``.

Money is compared only in the budget's currency: a team whose costs are priced in another (the price book
keeps no exchange rates) gets the mismatch in the evidence, never a conversion. One finding per team: critical
when over, warning when only projected over; its window is the month so far, so each sweep updates it and
it resolves when a raised budget or a new month clears it.

Pure: frames in, a ``finding`` frame out.
"""

from __future__ import annotations

import datetime as dt
import json

import polars as pl

from fleetscope.core.frames import findings_frame
from fleetscope.core.spec import require_columns

ANALYZER = "team_budgets"
KIND = "team_budget"
MIN_ELAPSED_S = 86400.0

STATUS_SCHEMA = {"team": pl.String, "month": pl.String, "gpu_hours": pl.Float64, "gpu_hour_quota": pl.Float64, "projected_gpu_hours": pl.Float64,
                 "quota_status": pl.String, "cost": pl.Float64, "budget": pl.Float64, "currency": pl.String, "projected_cost": pl.Float64,
                 "budget_status": pl.String, "note": pl.String}


def resolve(budgets: pl.DataFrame, month: str) -> pl.DataFrame:
    """The budget each team has for ``month``: its row for the month, else its standing row."""
    require_columns(budgets, "team_budget", ("team", "month", "gpu_hour_quota", "budget", "currency"))
    rows = budgets.filter(pl.col("month").is_in([month, ""]))
    return rows.sort("team", pl.col("month") == "").unique("team", keep="first", maintain_order=True)


def _check(used: float | None, limit: float | None, projected: float | None) -> str | None:
    if limit is None:
        return None
    if (used or 0.0) > limit:
        return "over"
    if projected is not None and projected > limit:
        return "projected_over"
    return "within"


def budget_status(usage: pl.DataFrame, budgets: pl.DataFrame, *, month: str, start: dt.datetime, end: dt.datetime, now: dt.datetime) -> pl.DataFrame:
    """Per team with a budget for ``month`` (``[start, end)``): usage so far, limits, the projection to the
    month's end and the status of each check (``over``, ``projected_over``, ``within``; null where no limit)."""
    require_columns(usage, "team usage", ("team", "gpu_hours", "cost", "currency"))
    if end <= start:
        raise ValueError("the month must end after it starts")
    elapsed_s = (min(max(now, start), end) - start).total_seconds()
    scale = (end - start).total_seconds() / elapsed_s if elapsed_s >= MIN_ELAPSED_S else None
    used = {r["team"]: r for r in usage.iter_rows(named=True)}
    rows = []
    for b in resolve(budgets, month).iter_rows(named=True):
        u = used.get(b["team"], {})
        gh, cost, cur = u.get("gpu_hours") or 0.0, u.get("cost"), u.get("currency")
        proj_h = gh * scale if scale is not None else None
        note, money_status, proj_cost = None, None, None
        if b["budget"] is not None:
            if cost is not None and cur and b["currency"] and cur != b["currency"]:
                note = f"costs are priced in {cur}, the budget in {b['currency']}: not compared (no exchange rates are kept)"
            else:
                proj_cost = (cost or 0.0) * scale if scale is not None else None
                money_status = _check(cost or 0.0, b["budget"], proj_cost)
        rows.append({"team": b["team"], "month": month, "gpu_hours": gh, "gpu_hour_quota": b["gpu_hour_quota"], "projected_gpu_hours": proj_h,
                     "quota_status": _check(gh, b["gpu_hour_quota"], proj_h), "cost": cost, "budget": b["budget"], "currency": b["currency"] or cur,
                     "projected_cost": proj_cost, "budget_status": money_status, "note": note})
    return pl.DataFrame(rows, schema=STATUS_SCHEMA)


def budget_findings(status: pl.DataFrame, *, start: dt.datetime, now: dt.datetime) -> pl.DataFrame:
    """One finding per team over or projected over a limit (``budget_status`` rows)."""
    out = []
    for r in status.iter_rows(named=True):
        checks = {k: r[k] for k in ("quota_status", "budget_status") if r[k] in ("over", "projected_over")}
        if not checks:
            continue
        over = "over" in checks.values()
        parts, ratios = [], []
        if "quota_status" in checks:
            ratios.append(max(r["gpu_hours"], r["projected_gpu_hours"] or 0.0) / r["gpu_hour_quota"] if r["gpu_hour_quota"] else float("inf"))
            parts.append(f"{r['gpu_hours']:,.1f} of {r['gpu_hour_quota']:,.1f} GPU-hours" + (
                "" if checks["quota_status"] == "over" else f", {r['projected_gpu_hours']:,.1f} projected"))
        if "budget_status" in checks:
            ratios.append(max(r["cost"] or 0.0, r["projected_cost"] or 0.0) / r["budget"] if r["budget"] else float("inf"))
            parts.append(f"{r['cost'] or 0.0:,.2f} of {r['budget']:,.2f} {r['currency'] or ''}".rstrip() + (
                "" if checks["budget_status"] == "over" else f", {r['projected_cost']:,.2f} projected"))
        verb = "is over" if over else "is on course to exceed"
        out.append({"analyzer": ANALYZER, "kind": KIND, "subject": f"team_budget:{r['team']}", "window_start": start, "window_end": now,
                    "severity": "critical" if over else "warning", "score": max(ratios),
                    "summary": f"team {r['team']} {verb} its {r['month']} budget: " + "; ".join(parts),
                    "evidence": json.dumps({k: v for k, v in r.items() if v is not None}, default=str)})
    return findings_frame(out)

"""Teams and cost over HTTP: the team rules and budgets (read; set with the admin scope, recorded under the
token's name and audit-logged), per team usage, CO2e and cost for a period, budget status, the top jobs by
cost, queue waits, pending reasons, end states and stranded capacity. The same service functions as ``fleetscope teams`` and the Teams & Cost page
(``fleetscope/services/teams.py``, ``team_costs.py``, ``scheduler_capacity.py``)."""

from __future__ import annotations

import datetime as dt
from typing import Annotated, Any, Literal

import polars as pl
from fastapi import APIRouter, Depends, HTTPException, Query, Request
from fastapi.concurrency import run_in_threadpool
from pydantic import BaseModel, ConfigDict, Field

from fleetscope.api import jsonbody
from fleetscope.api.security import require
from fleetscope.services import auth
from fleetscope.services import scheduler_capacity, team_costs
from fleetscope.services import teams as teams_service

router = APIRouter(prefix="/api/v1/teams", tags=["teams"])
DEFAULT_WINDOW = dt.timedelta(days=30)
MAX_WINDOW = dt.timedelta(days=400)


def _window(start: dt.datetime | None, end: dt.datetime | None, month: str | None) -> tuple[dt.datetime, dt.datetime]:
    if month is not None:
        return teams_service.month_bounds(month)
    for name, v in (("start", start), ("end", end)):
        if v is not None and v.tzinfo is None:
            raise HTTPException(400, f"{name} must carry a time zone (RFC 3339, e.g. 2026-11-01T00:00:00Z)")
    end = end or dt.datetime.now(dt.UTC)
    start = start or end - DEFAULT_WINDOW
    if not start < end or end - start > MAX_WINDOW:
        raise HTTPException(400, f"start must be before end, at most {MAX_WINDOW.days} days apart")
    return start, end



def _rows(df: pl.DataFrame) -> list[dict[str, Any]]:
    return jsonbody.finite(df.to_dicts()) if df.height else []


Start = Annotated[dt.datetime | None, Query()]
End = Annotated[dt.datetime | None, Query()]
Month = Annotated[str | None, Query(pattern=r"^\d{4}-\d{2}$")]


class MappingBody(BaseModel):
    """One team rule as PUT /api/v1/teams/mappings takes it; unknown fields are refused."""

    model_config = ConfigDict(extra="forbid")
    kind: Literal["k8s_label", "slurm_account", "k8s_namespace", "slurm_organization", "slurm_user"]
    match: str = Field(min_length=1, max_length=200)
    team: str = Field(min_length=1, max_length=200)
    cluster: str = Field(default="", max_length=200)


@router.put("/mappings")
async def put_mapping(request: Request, body: MappingBody, token: auth.Token = Depends(require("admin"))) -> dict[str, Any]:
    """Map a Slurm account, organization or user, a Kubernetes namespace or a label (key=value) to a team."""
    return await run_in_threadpool(teams_service.set_mapping, request.app.state.store, recorded_by=token.name, **body.model_dump())


class BudgetBody(BaseModel):
    """A team's monthly GPU-hour quota and/or money budget as PUT /api/v1/teams/budgets takes it."""

    model_config = ConfigDict(extra="forbid")
    team: str = Field(min_length=1, max_length=200)
    month: str = Field(default="", pattern=r"^(\d{4}-\d{2})?$", description="YYYY-MM; empty: every month without its own budget")
    gpu_hour_quota: float | None = Field(default=None, ge=0, le=1e12, allow_inf_nan=False)
    budget: float | None = Field(default=None, ge=0, le=1e12, allow_inf_nan=False)
    currency: str | None = Field(default=None, pattern=r"^[A-Z]{3}$")


@router.put("/budgets")
async def put_budget(request: Request, body: BudgetBody, token: auth.Token = Depends(require("admin"))) -> dict[str, Any]:
    """Set a team's GPU-hour quota and/or money budget for a month or every month (recorded and audit-logged)."""
    return await run_in_threadpool(teams_service.set_budget, request.app.state.store, recorded_by=token.name, **body.model_dump())


@router.get("/budgets", dependencies=[Depends(require("read"))])
async def get_budgets(request: Request) -> list[dict[str, Any]]:
    """Every team budget, with who set it and when."""
    return _rows(await run_in_threadpool(teams_service.budgets, request.app.state.store))


@router.get("/budgets/status", dependencies=[Depends(require("read"))])
async def get_budget_status(request: Request, month: Month = None) -> dict[str, Any]:
    """Per team with a budget: the month's usage so far against it, projected to the month's end, and whether
    it is over or on course to go over (default: this month)."""
    now = dt.datetime.now(dt.UTC)
    df = await run_in_threadpool(team_costs.budget_status, request.app.state.store, month=month, now=now)
    return {"month": month or f"{now.year:04d}-{now.month:02d}", "teams": _rows(df)}


@router.get("/mappings", dependencies=[Depends(require("read"))])
async def get_mappings(request: Request) -> list[dict[str, Any]]:
    """Every team rule, newest first, with who set it and when."""
    return _rows(await run_in_threadpool(teams_service.mappings, request.app.state.store))


@router.get("/usage", dependencies=[Depends(require("read"))])
async def get_usage(request: Request, start: Start = None, end: End = None, month: Month = None) -> dict[str, Any]:
    """Per team: jobs, GPU-hours allocated and used, busy share, energy (kWh), CO2e location- and market-based
    (kg), cost (default: the last 30 days); ``carbon``: each site's intensity the CO2e rests on, and its basis."""
    s, e = _window(start, end, month)
    rep = await run_in_threadpool(team_costs.usage_report, request.app.state.store, start=s, end=e, now=dt.datetime.now(dt.UTC))
    return {"start": s.isoformat(), "end": e.isoformat(), "teams": _rows(rep["teams"]), "carbon": _rows(rep["carbon"])}


@router.get("/jobs", dependencies=[Depends(require("read"))])
async def get_top_jobs(request: Request, start: Start = None, end: End = None, month: Month = None,
                       limit: Annotated[int, Query(ge=1, le=1000)] = 20) -> list[dict[str, Any]]:
    """The jobs that cost the most in the period, with team, GPU-hours allocated and used, energy and cost."""
    s, e = _window(start, end, month)
    return _rows(await run_in_threadpool(team_costs.top_jobs, request.app.state.store, start=s, end=e, limit=limit, now=dt.datetime.now(dt.UTC)))


@router.get("/queue", dependencies=[Depends(require("read"))])
async def get_queue(request: Request, start: Start = None, end: End = None, month: Month = None) -> dict[str, Any]:
    """Queue wait per partition (from eligibility), pending reasons and end states as outcomes."""
    s, e = _window(start, end, month)
    return jsonbody.finite(await run_in_threadpool(scheduler_capacity.queue, request.app.state.store, start=s, end=e, now=dt.datetime.now(dt.UTC)))


@router.get("/stranded", dependencies=[Depends(require("read"))])
async def get_stranded(request: Request) -> dict[str, Any]:
    """Free GPUs no pending job can use because of how they are spread over nodes: per partition and node, the
    fleet's count (a node once) and their cost per hour from the price book."""
    out = await run_in_threadpool(scheduler_capacity.stranded_capacity, request.app.state.store, now=dt.datetime.now(dt.UTC))
    return {"stranded_gpus": out["stranded_gpus"], "cost_per_hour": out["cost_per_hour"], "currency": out["currency"],
            "partitions": _rows(out["partitions"]), "nodes": _rows(out["nodes"]), "findings": _rows(out["findings"])}


# --- what the dashboard's Teams & Cost page reads besides the above ------------------------------------


@router.get("/usage/series", dependencies=[Depends(require("read"))])
async def get_usage_series(request: Request, start: Start = None, end: End = None, month: Month = None,
                           step_s: Annotated[int, Query(ge=60, le=31 * 86_400)] = 86_400) -> dict[str, Any]:
    """Per time bucket of ``step_s`` seconds and team: jobs, GPU-hours allocated and their GPU-hour cost (at most
    400 buckets; energy is priced in ``/usage`` only)."""
    s, e = _window(start, end, month)
    df = await run_in_threadpool(team_costs.usage_over_time, request.app.state.store, start=s, end=e, step_s=step_s, now=dt.datetime.now(dt.UTC))
    return {"start": s.isoformat(), "end": e.isoformat(), "step_s": step_s, "buckets": _rows(df)}


@router.get("/idle", dependencies=[Depends(require("read"))])
async def get_idle(request: Request, start: Start = None, end: End = None, month: Month = None) -> list[dict[str, Any]]:
    """Idle allocations found in the period: per job, the newest finding's team, idle GPUs, since when, idle
    GPU-hours and their cost."""
    s, e = _window(start, end, month)
    return _rows(await run_in_threadpool(scheduler_capacity.idle_allocations, request.app.state.store, start=s, end=e))

"""Serving deployments: replicas, latency quantiles over time, token and request rates, SLO status with
burn rates, and DistServe goodput. The deployment is a query parameter: model names carry slashes."""

from __future__ import annotations

import datetime as dt
import math
from typing import Annotated, Any

import polars as pl
from fastapi import APIRouter, Depends, HTTPException, Query, Request
from fastapi.concurrency import run_in_threadpool
from pydantic import BaseModel, ConfigDict, Field

from analyzers.slo import SLO
from fleetscope.api import jsonbody
from fleetscope.api.security import require
from fleetscope.core.errors import NotFound
from fleetscope.services import auth
from fleetscope.services import serving as serving_service

router = APIRouter(prefix="/api/v1/serving", tags=["serving"])
DEFAULT_WINDOW = dt.timedelta(hours=1)
Deployment = Annotated[str, Query(min_length=1, max_length=256)]


def _utc(value: dt.datetime | None, name: str) -> dt.datetime | None:
    if value is not None and value.tzinfo is None:
        raise HTTPException(400, f"{name} must carry a time zone (RFC 3339, e.g. 2026-12-01T12:00:00Z)")
    return value


def _window(start: dt.datetime | None, end: dt.datetime | None) -> tuple[dt.datetime, dt.datetime]:
    end = _utc(end, "end") or dt.datetime.now(dt.UTC)
    return (_utc(start, "start") or end - DEFAULT_WINDOW), end



def _rows(df: pl.DataFrame) -> list[dict[str, Any]]:
    return jsonbody.finite(df.to_dicts()) if df.height else []


async def _call(fn, *a, **kw):  # type: ignore[no-untyped-def]
    try:
        return await run_in_threadpool(fn, *a, **kw)
    except NotFound:
        raise
    except ValueError as exc:
        raise HTTPException(400, str(exc)) from None


@router.get("/deployments", dependencies=[Depends(require("read"))])
async def deployments(request: Request) -> list[dict[str, Any]]:
    """Every known replica with its deployment, server, model and where it runs (pod, host)."""
    return _rows(await run_in_threadpool(serving_service.deployments, request.app.state.store))


@router.get("/quantiles", dependencies=[Depends(require("read"))])
async def quantiles(request: Request, deployment: Deployment, metric: Annotated[str, Query(max_length=100)] = "ttft_seconds",
                    q: Annotated[float, Query(ge=0, le=1)] = 0.99, start: dt.datetime | None = None, end: dt.datetime | None = None,
                    step_s: Annotated[float, Query(gt=0)] = 60, window_s: Annotated[float, Query(gt=0)] = 300) -> dict[str, Any]:
    """``histogram_quantile(q, sum by (le) (increase(metric[window_s])))`` every ``step_s`` over [start, end]
    (default: the last hour); ``capped`` points lie past the histogram's last finite bound."""
    start, end = _window(start, end)
    df = await _call(serving_service.quantiles_over_time, request.app.state.store, deployment, metric, q, start=start, end=end,
                     step_s=step_s, window_s=window_s)
    return {"deployment": deployment, "metric": metric, "q": q, "start": start, "end": end, "points": _rows(df)}


@router.get("/rates", dependencies=[Depends(require("read"))])
async def rates(request: Request, deployment: Deployment, start: dt.datetime | None = None, end: dt.datetime | None = None) -> dict[str, Any]:
    """Each counter's reset-aware increase and per-second rate over the window (tokens/s, requests/s)."""
    start, end = _window(start, end)
    df = await _call(serving_service.rates, request.app.state.store, deployment, start=start, end=end)
    return {"deployment": deployment, "start": start, "end": end, "counters": _rows(df)}


@router.get("/slo", dependencies=[Depends(require("read"))])
async def slo(request: Request, deployment: Deployment, kind: Annotated[str, Query(pattern="^(latency|availability)$")] = "latency",
              metric: Annotated[str, Query(max_length=100)] = "ttft_seconds", threshold_s: Annotated[float | None, Query(gt=0)] = None,
              objective: Annotated[float, Query(gt=0, lt=1)] = 0.99, window_days: Annotated[int, Query(ge=1, le=31)] = 28,
              now: dt.datetime | None = None) -> dict[str, Any]:
    """An SLO's SLI, error budget left and burn rates over 5 m … 3 d, and which multiwindow rules fire (SRE
    Workbook: 1 h and 5 m over 14.4x, 6 h and 30 m over 6x page; 3 d and 6 h over 1x ticket). A latency SLO's
    ``threshold_s`` must be a bucket bound of ``metric``."""
    now = _utc(now, "now") or dt.datetime.now(dt.UTC)
    name = f"{metric}<={threshold_s}" if kind == "latency" else "availability"
    try:
        s = SLO(name, deployment, kind, objective, metric if kind == "latency" else "",
                threshold_s if threshold_s is not None else math.nan, dt.timedelta(days=window_days))
    except ValueError as exc:
        raise HTTPException(400, str(exc)) from None
    [st] = await _call(serving_service.slo_status, request.app.state.store, [s], now=now)
    return jsonbody.finite(st)


@router.get("/goodput", dependencies=[Depends(require("read"))])
async def goodput(request: Request, deployment: Deployment, ttft_slo_s: Annotated[float, Query(gt=0)],
                  tpot_slo_s: Annotated[float, Query(gt=0)], start: dt.datetime | None = None, end: dt.datetime | None = None) -> dict[str, Any]:
    """DistServe goodput (completed requests/s meeting both limits) over the window: ``exact`` from the
    deployment's request log, else ``bounded`` from its histograms (``goodput_low_rps``..``goodput_high_rps``)."""
    start, end = _window(start, end)
    return jsonbody.finite(await _call(serving_service.goodput, request.app.state.store, deployment, ttft_slo_s=ttft_slo_s,
                             tpot_slo_s=tpot_slo_s, start=start, end=end))


@router.get("/energy", dependencies=[Depends(require("read"))])
async def energy(request: Request, deployment: Deployment, start: dt.datetime | None = None, end: dt.datetime | None = None) -> dict[str, Any]:
    """GPU and facility energy per output token over the window (J/token, kWh per million tokens), from the
    GPUs the deployment's pods held, else the server's own energy counter; ``basis`` says which."""
    start, end = _window(start, end)
    return jsonbody.finite(await _call(serving_service.energy_per_token, request.app.state.store, deployment, start=start, end=end))


@router.get("/health", dependencies=[Depends(require("read"))])
async def health(request: Request, deployment: Deployment, start: dt.datetime | None = None, end: dt.datetime | None = None) -> dict[str, Any]:
    """The deployment's serving findings with those of the GPUs and hosts it ran on, for reading beside its latency."""
    start, end = _window(start, end)
    df = await _call(serving_service.deployment_health, request.app.state.store, deployment, start=start, end=end)
    return {"deployment": deployment, "start": start, "end": end, "findings": _rows(df)}


class SloBody(BaseModel):
    """An SLO as PUT /api/v1/serving/slos takes it; unknown fields are refused."""

    model_config = ConfigDict(extra="forbid")
    deployment: str = Field(min_length=1, max_length=256)
    name: str = Field(min_length=1, max_length=128)
    kind: str = Field(pattern="^(latency|availability)$")
    metric: str = Field(default="", max_length=100)
    threshold_s: float | None = Field(default=None, gt=0)
    objective: float = Field(gt=0, lt=1)
    window_days: int = Field(default=28, ge=1, le=31)


@router.put("/slos")
async def put_slo(request: Request, body: SloBody, token: auth.Token = Depends(require("admin"))) -> dict[str, Any]:
    """Record (or replace) a deployment's SLO; beat's serving window evaluates every recorded SLO each five
    minutes and writes ``slo_burn`` findings while a multiwindow rule fires (alert rule ``ServingSloBurn``)."""
    try:
        s = SLO(body.name, body.deployment, body.kind, body.objective, body.metric if body.kind == "latency" else "",
                body.threshold_s if body.threshold_s is not None else math.nan, dt.timedelta(days=body.window_days))
    except ValueError as exc:
        raise HTTPException(422, str(exc)) from None
    return jsonbody.finite(await _call(serving_service.put_slo, request.app.state.store, s, actor=token.name, now=dt.datetime.now(dt.UTC)))


@router.get("/slos", dependencies=[Depends(require("read"))])
async def list_slos(request: Request, deployment: Annotated[str | None, Query(max_length=256)] = None,
                    now: dt.datetime | None = None) -> list[dict[str, Any]]:
    """The recorded SLOs (of one deployment) with their status at ``now`` (default: the time asked)."""
    now = _utc(now, "now") or dt.datetime.now(dt.UTC)
    store = request.app.state.store

    def run() -> list[dict[str, Any]]:
        out = []
        for s in serving_service.stored_slos(store, deployment):
            try:
                out.append(serving_service.slo_status(store, [s], now=now)[0])
            except ValueError as exc:
                out.append({"slo": s.name, "deployment": s.deployment, "error": str(exc)})
        return out

    return jsonbody.finite(await run_in_threadpool(run))


class PriceBody(BaseModel):
    """One price-book row as PUT /api/v1/serving/prices takes it; unknown fields are refused."""

    model_config = ConfigDict(extra="forbid")
    site_id: str = Field(min_length=1, max_length=200)
    gpu_model: str = Field(default="", max_length=200)
    valid_from: dt.datetime
    currency: str = Field(pattern="^[A-Z]{3}$")
    gpu_hour_price: float | None = Field(default=None, ge=0, allow_inf_nan=False)
    energy_price_per_kwh: float | None = Field(default=None, ge=0, allow_inf_nan=False)


@router.put("/prices")
async def put_price(request: Request, body: PriceBody, token: auth.Token = Depends(require("admin"))) -> dict[str, Any]:
    """Record a GPU-hour price (per site and GPU model; empty model: any GPU there) and/or an energy tariff,
    valid from ``valid_from``; kept with who recorded it and when, and appended to the audit log."""
    if body.valid_from.tzinfo is None:
        raise HTTPException(422, "valid_from must carry a time zone")
    if body.gpu_hour_price is None and body.energy_price_per_kwh is None:
        raise HTTPException(422, "give gpu_hour_price, energy_price_per_kwh or both")
    return jsonbody.finite(await _call(serving_service.record_price, request.app.state.store, body.model_dump(), recorded_by=token.name))


@router.get("/prices", dependencies=[Depends(require("read"))])
async def get_prices(request: Request, site_id: Annotated[str | None, Query(max_length=200)] = None) -> list[dict[str, Any]]:
    """The price book (of one site)."""
    return _rows(await run_in_threadpool(serving_service.price_book, request.app.state.store, site_id))


@router.get("/cost", dependencies=[Depends(require("read"))])
async def cost(request: Request, deployment: Deployment, start: dt.datetime | None = None, end: dt.datetime | None = None) -> dict[str, Any]:
    """Money per million output tokens over the window: GPU-hours held at the price book's GPU-hour price plus
    facility energy at the site's tariff; ``unpriced_gpu_hours`` where no price applies."""
    start, end = _window(start, end)
    return jsonbody.finite(await _call(serving_service.cost_per_token, request.app.state.store, deployment, start=start, end=end))


@router.get("/crossover", dependencies=[Depends(require("read"))])
async def crossover(request: Request, model: Annotated[str, Query(min_length=1, max_length=256)],
                    projection_days: Annotated[int, Query(ge=1, le=366)] = 28) -> dict[str, Any]:
    """A model's training cost against its cumulative serving cost (price book), and the date serving
    passed training (observed or projected): the serving-vs-training comparison in money."""
    return jsonbody.finite(await _call(serving_service.serving_vs_training_cost, request.app.state.store, model, projection_days=projection_days))

"""InfiniBand / RoCE fabric: link health over a window, and the stored topology."""

from __future__ import annotations

import datetime as dt
from typing import Annotated, Any

import polars as pl
from fastapi import APIRouter, Depends, HTTPException, Query, Request
from fastapi.concurrency import run_in_threadpool

from fleetscope.services import health as health_service
from fleetscope.api.security import require

router = APIRouter(prefix="/api/v1/fabric", tags=["fabric"])
DEFAULT_WINDOW = dt.timedelta(minutes=15)
MAX_LINKS = 100_000


def _utc(value: dt.datetime | None, name: str) -> dt.datetime | None:
    if value is not None and value.tzinfo is None:
        raise HTTPException(400, f"{name} must carry a time zone (RFC 3339, e.g. 2026-12-01T12:00:00Z)")
    return value


def _rows(df: pl.DataFrame) -> list[dict[str, Any]]:
    return df.to_dicts() if df.height else []


@router.get("/health", dependencies=[Depends(require("read"))])
async def fabric_health(request: Request, start: Annotated[dt.datetime | None, Query()] = None,
                        end: Annotated[dt.datetime | None, Query()] = None, all_ports: bool = False) -> dict[str, Any]:
    """Link health over [start, end) (default: the last 15 minutes): the ports with flapping, errors or
    congestion (every port with ``all_ports``), links narrower or slower than their peers, the findings
    the health sweep stores for them, and the usual HCA link rate the topology implies."""
    end = _utc(end, "end") or dt.datetime.now(dt.UTC)
    start = _utc(start, "start") or end - DEFAULT_WINDOW
    try:
        out = await run_in_threadpool(health_service.fabric_health, request.app.state.store, start, end)
    except ValueError as exc:
        raise HTTPException(400, str(exc)) from None
    ports = out["ports"]
    if ports.height and not all_ports:
        ports = ports.filter(pl.col("flapping") | pl.col("errors") | pl.col("congested"))
    return {"start": start, "end": end, "nic_rate_gbps": out["nic_rate_gbps"], "links": out["links"],
            "ports_seen": out["ports"].height, "ports": _rows(ports), "degraded": _rows(out["degraded"]),
            "findings": _rows(out["findings"])}


@router.get("/links", dependencies=[Depends(require("read"))])
def fabric_links(request: Request, host: str | None = None, connected: bool | None = None,
                 limit: Annotated[int, Query(ge=1, le=MAX_LINKS)] = 10_000) -> list[dict[str, Any]]:
    """The stored topology (``fabric_link``): links, unconnected ports and host-to-leaf placements,
    optionally of one host (either end) or only (un)connected ones."""
    links = request.app.state.store.read("fabric_link")
    if links.height and host is not None:
        links = links.filter((pl.col("a_host") == host) | (pl.col("b_host") == host))
    if links.height and connected is not None:
        links = links.filter(pl.col("connected").fill_null(False) == connected)
    return _rows(links.head(limit))


@router.get("/alltoall", dependencies=[Depends(require("read"))])
async def fabric_alltoall(request: Request, start: Annotated[dt.datetime | None, Query()] = None,
                          end: Annotated[dt.datetime | None, Query()] = None, low_only: bool = False) -> dict[str, Any]:
    """nccl-tests all-to-all runs in [start, end) (default: the last day) against the bound the stored
    topology implies (per-leaf uplinks and the hosts' NICs): each run's busbw, bound, utilisation ratio,
    which limit binds, and whether it is low (below half its bound, ``alltoall_low_utilization``)."""
    end = _utc(end, "end") or dt.datetime.now(dt.UTC)
    start = _utc(start, "start") or end - health_service.NCCL_TEST_LOOKBACK
    if end <= start:
        raise HTTPException(400, "end must be after start")
    util = await run_in_threadpool(health_service.alltoall_utilization, request.app.state.store, end, start=start)
    if low_only:
        util = util.filter(pl.col("low"))
    return {"start": start, "end": end, "runs": _rows(util)}


@router.get("/attribution", dependencies=[Depends(require("read"))])
async def fabric_attribution(request: Request, job_id: Annotated[str | None, Query(max_length=256)] = None,
                             start: Annotated[dt.datetime | None, Query()] = None,
                             end: Annotated[dt.datetime | None, Query()] = None) -> dict[str, Any]:
    """The HCA port, host or leaf switch each job's slow-communicating ranks share (communication
    stragglers, slow links and slow hosts of the hour before ``end``, joined to the job's ranks, their
    GPUs' NICs and the topology), the unhealthy links on it, and the ``comm_straggler_fabric`` findings."""
    end = _utc(end, "end") or dt.datetime.now(dt.UTC)
    start = _utc(start, "start") or end - DEFAULT_WINDOW
    if end <= start:
        raise HTTPException(400, "end must be after start")
    if end - start > health_service.MAX_WINDOW:
        raise HTTPException(400, f"window longer than {health_service.MAX_WINDOW}")
    out = await run_in_threadpool(health_service.straggler_attribution, request.app.state.store, start, end, job_id=job_id)
    return {"start": start, "end": end, "job_id": job_id, "slow_ranks": _rows(out["slow"]),
            "components": _rows(out["attribution"]), "findings": _rows(out["findings"])}

"""The fleet's live state, the derived fleet series for a site's own Prometheus to scrape, the analyzer
registry, and the pipeline's own state."""

from __future__ import annotations

import datetime as dt

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import Response

from fleetscope.services import catalog, fleet_metrics, health_reads, pipeline
from fleetscope.api.security import require

router = APIRouter(prefix="/api/v1/fleet", tags=["fleet"])


@router.get("/state", dependencies=[Depends(require("read"))])
def fleet_state(
    request: Request,
    site: str | None = Query(None, max_length=256, description="Only this site's hosts and GPUs."),
    problems_only: bool = Query(False, description="The grid holds only GPUs whose status is not ok."),
) -> dict:
    """The fleet right now, as the dashboard's Overview shows it: GPUs in the inventory, how many are busy,
    idle, unhealthy (a serious health event in the last hour) and silent (no sample in the last 5 minutes),
    the power they draw now, and the worst hosts' GPUs, each with its latest temperature, power, XID and
    status (``unhealthy``, ``hot``, ``silent``, ``ok``)."""
    return health_reads.fleet_state(request.app.state.store, dt.datetime.now(dt.UTC), site, problems_only)


@router.get("/metrics", dependencies=[Depends(require("read"))])
def fleet_series(request: Request) -> Response:
    """Goodput, badput and C³ shares per job, stragglers and hangs, GPU health findings and absence (with
    dcgm-exporter's ``UUID`` and ``Hostname`` labels), and PUE and GPU power per site, in the Prometheus
    text format. Scrape it with a read token (``authorization: {credentials: ...}`` in the scrape job)."""
    return Response(fleet_metrics.exposition(request.app.state.store), media_type=fleet_metrics.CONTENT_TYPE)


@router.get("/analyzers", dependencies=[Depends(require("read"))])
def analyzers() -> list[dict]:
    """The analyzer registry: every analysis the service runs per job, per fleet window and on a schedule of its
    own, in the order it runs, with the pure modules it calls, the frames it needs, reads and writes, and the
    beat entry and task that run it and when."""
    return catalog.analyses()


@router.get("/pipeline", dependencies=[Depends(require("read"))])
def pipeline_status(request: Request) -> dict:
    """The service's own pipeline: ingest (last push, recent rate), how far the energy roll-up and the minute
    and hour tiers are behind (``late`` past each one's allowance), closed days waiting to be packed
    (PostgreSQL), beat's leader, each scheduled task's last success and failure, and bytes per table."""
    store = request.app.state.store
    return {**pipeline.status(store, dt.datetime.now(dt.UTC)), "storage": pipeline.storage(store)}

"""The fleet's live state, one GPU's history, the derived fleet series for a site's own Prometheus to scrape,
the analyzer registry, and the pipeline's own state."""

from __future__ import annotations

import datetime as dt
from typing import Annotated

import orjson
from fastapi import APIRouter, Depends, HTTPException, Path, Query, Request
from fastapi.responses import Response

from fleetscope.core.errors import NotFound, ValidationError
from fleetscope.services import catalog, fleet_metrics, health_reads, pipeline, telemetry
from fleetscope.api.security import require

router = APIRouter(prefix="/api/v1/fleet", tags=["fleet"])
# One GPU, named by its UUID, beside the fleet-wide reads.
gpus = APIRouter(prefix="/api/v1/gpus", tags=["fleet"])

# A GPU UUID as the inventory holds it (GPU-xxxxxxxx-..., MIG-...): text without control characters, bounded.
GpuUuid = Annotated[str, Path(min_length=1, max_length=telemetry.MAX_UUID_CHARS, pattern=r"^[^\x00-\x1f\x7f]+$", description="the GPU's UUID, as dcgm-exporter names it")]


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


@gpus.get("/{gpu_uuid}/series", dependencies=[Depends(require("read"))])
def gpu_series(
    request: Request,
    gpu_uuid: GpuUuid,
    start: Annotated[dt.datetime, Query(description="inclusive start (RFC 3339, with a zone)")],
    end: Annotated[dt.datetime, Query(description="exclusive end; at most FLEETSCOPE_HOUR_TIER_RETENTION_DAYS after start")],
    field: Annotated[list[str] | None, Query(description="a gpu_sample field, repeatable (default util_ratio, power_w, temp_c; at most 8)")] = None,
) -> Response:
    """One GPU's fields over [start, end): min, max, mean and last per raw sample (up to 6 h), per minute (up to 7
    days) or per hour (beyond), as the roll-up tiers hold them, the buckets the tier has not rolled yet made from
    raw samples (``from_raw``). At most 100,000 points (400 past it); 422 naming an unknown field; 400 for a window
    without a zone, empty or longer than the hour tier keeps; 404 for a GPU neither in the inventory nor sampled."""
    settings = request.app.state.settings
    try:
        out = telemetry.gpu_series(request.app.state.store, gpu_uuid, field or telemetry.DEFAULT_SERIES_FIELDS, start, end,
                                   max_days=settings.hour_tier_retention_days)
    except ValidationError as exc:
        raise HTTPException(422, str(exc)) from None
    except NotFound as exc:
        raise HTTPException(404, str(exc)) from None
    except ValueError as exc:
        raise HTTPException(400, str(exc)) from None
    return Response(orjson.dumps(out), media_type="application/json", headers={"X-Row-Count": str(out["points"])})

"""Jobs and their analyses: C3 breakdown, HTA's temporal breakdown and overlap, goodput, stragglers and the straggler
what-if; scaling across the runs of one model with the Fleet Law fit (`models`, under `/api/v1/models`)."""

from __future__ import annotations

import datetime as dt
from typing import Annotated, Any

import polars as pl
from fastapi import APIRouter, Depends, HTTPException, Path, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import Response

from fleetscope.services import jobs as analysis
from fleetscope.api.security import require
from fleetscope.services import energy as es
from fleetscope.services import job_reads
from fleetscope.core.errors import NotFound
import json

router = APIRouter(prefix="/api/v1/jobs", tags=["jobs"])
# Reads across the jobs of one model (named as the job inventory's model_name), beside the other model routes.
models = APIRouter(prefix="/api/v1/models", tags=["jobs"])

# A model name as the other model routes take it: text, no control characters (a NUL is no text to PostgreSQL).
ModelName = Annotated[str, Path(min_length=1, max_length=500, pattern=r"^[^\x00-\x1f\x7f]+$",
                                description="the model_name the job inventory gives its jobs")]


def _known(request: Request, job_id: str) -> None:
    if not analysis.job_exists(request.app.state.store, job_id):
        raise HTTPException(404, f"no job {job_id[:200]!r}: nothing ingested under that id")


def _analysis(request: Request, job_id: str, analyzer: str) -> dict[str, Any]:
    _known(request, job_id)
    found = analysis.stored_analysis(request.app.state.store, job_id, analyzer)
    if found is None:
        raise HTTPException(404, f"job {job_id[:200]!r} has no {analyzer} analysis yet: POST /api/v1/jobs/{{id}}/analyze or wait for beat")
    return found


@router.get("", dependencies=[Depends(require("read"))])
def list_jobs(request: Request) -> list[dict[str, Any]]:
    """Jobs known from inventory, steps or events, with their latest goodput where analysed."""
    store = request.app.state.store
    ids: set[str] = set()
    for frame in ("job", "step", "job_event"):
        ids.update(store.read(frame, columns=["job_id"])["job_id"].unique().to_list())
    jobs = store.read("job").select("job_id", "name", "kind", "model_name", "world_size", "status")
    gp = store.read("job_analysis").filter(pl.col("analyzer") == "goodput")
    out = []
    for job_id in sorted(ids):
        row = jobs.filter(pl.col("job_id") == job_id)
        info = row.row(0, named=True) if row.height else {"job_id": job_id}
        g = gp.filter(pl.col("job_id") == job_id)
        if g.height:
            info["goodput_ratio"] = json.loads(g["result"][0]).get("goodput_ratio")
        out.append(info)
    return out


@router.post("/{job_id}/analyze", dependencies=[Depends(require("admin"))])
async def analyze(request: Request, job_id: str,
                  incremental: Annotated[bool, Query(description="read only the steps since the job's watermark, as beat's per-minute analysis does")] = False) -> dict[str, Any]:
    """Run every job analyzer now and store the results (beat does this each minute for active jobs, incrementally):
    from the job's start by default, or from its watermark with ``incremental=true``; the results are the same."""
    _known(request, job_id)
    result = await run_in_threadpool(lambda: analysis.analyze_job(request.app.state.store, job_id, incremental=incremental))
    return result.to_dict()


@router.get("/{job_id}/c3", dependencies=[Depends(require("read"))])
def get_c3(request: Request, job_id: str, steps: Annotated[bool, Query(description="include every rank-step's breakdown")] = False) -> Response:
    """The job's C3 summary (mean/p50/p99 of C1, C2, C3, dominant part and advice); per rank-step with ``steps=true``."""

    body = _analysis(request, job_id, "c3")
    if steps:
        bd = request.app.state.store.read("step_breakdown", job_id=job_id)
        body["steps"] = json.loads(bd.write_json())
    return Response(json.dumps(body, default=str), media_type="application/json")


@router.get("/{job_id}/temporal", dependencies=[Depends(require("read"))])
def get_temporal(
    request: Request,
    job_id: str,
    include_last_step: Annotated[bool, Query(description="count the last profiler step too (HTA's include_last_profiler_step); computed on read, not stored")] = False,
    rank: Annotated[int | None, Query(ge=0, le=2**31 - 1, description="that rank only")] = None,
) -> dict[str, Any]:
    """Meta's Holistic Trace Analysis figures of the job's Kineto traces, per rank (``services.job_reads.temporal``):
    the temporal breakdown (``idle_time_us``, ``compute_time_us``, ``non_compute_time_us``, ``kernel_time_us`` and
    their ``*_pctg`` shares of kernel time) and the communication/computation overlap (``comp_comm_overlap_ratio``,
    ``comp_comm_overlap_pctg``), with ``job`` the same over all ranks, ``window`` the event window HTA's rule gave, and
    ``stored``/``computed_at`` saying whether it is the job's stored ``temporal`` analysis or was computed now.

    404 for an unknown job; a job without Kineto kernel data answers 200 with no ranks and the ``reason``; 422 naming
    the parameter for an ``include_last_step`` that is not a boolean or a ``rank`` that is not an integer from 0."""
    _known(request, job_id)
    return job_reads.temporal(request.app.state.store, job_id, include_last_step=include_last_step, rank=rank)


@router.get("/{job_id}/goodput", dependencies=[Depends(require("read"))])
def get_goodput(
    request: Request,
    job_id: str,
    windows: Annotated[int, Query(ge=0, le=job_reads.GOODPUT_WINDOWS_MAX, description="the newest rolling-goodput windows to include")] = job_reads.GOODPUT_WINDOWS_MAX,
    steps: Annotated[int, Query(ge=0, le=job_reads.GOODPUT_STEPS_MAX, description="the newest steps' step-time deviation to include")] = job_reads.GOODPUT_STEPS_MAX,
) -> dict[str, Any]:
    """Runtime goodput and the badput buckets (ml-goodput-measurement semantics), scheduling goodput,
    program goodput (MFU against the peak of the job's GPU model) and their product, Google's ML
    Productivity Goodput (``result``); over time, ``rolling`` (goodput of consecutive windows of the run, the
    newest ``windows``) and ``step_time_deviation`` (ideal step time, anomalous steps, the newest ``steps``
    steps' deviation), each with ``why`` when it holds nothing (``services.job_reads.job_goodput``, what
    ``fleetscope jobs goodput`` and the Jobs page read). 422 naming the parameter for ``windows`` or ``steps``
    outside their range."""
    _known(request, job_id)
    found = job_reads.job_goodput(request.app.state.store, job_id, windows=windows, steps=steps)
    if found is None:
        raise HTTPException(404, f"job {job_id[:200]!r} has no goodput analysis yet: POST /api/v1/jobs/{{id}}/analyze or wait for beat")
    return found


@router.get("/{job_id}/goodput/interval", dependencies=[Depends(require("read"))])
def get_goodput_interval(
    request: Request,
    job_id: str,
    start: Annotated[dt.datetime, Query(description="inclusive start of the interval (RFC 3339, with a zone)")],
    end: Annotated[dt.datetime, Query(description="exclusive end of the interval")],
) -> dict[str, Any]:
    """Runtime goodput and badput within ``[start, end)``, computed now from the job's events, as
    ml-goodput-measurement's ``get_job_goodput_interval``: the denominator is the interval's overlap with the run
    (``window_start``, ``window_end``). 400 for a window without a zone, empty, or missing the run; 404 for a job
    whose events give no timeline (none, or no start)."""
    _known(request, job_id)
    try:
        return job_reads.interval_goodput(request.app.state.store, job_id, start, end, now=dt.datetime.now(dt.UTC))
    except NotFound as exc:
        raise HTTPException(404, str(exc)) from None
    except ValueError as exc:
        raise HTTPException(400, str(exc)) from None


@router.get("/{job_id}/stragglers", dependencies=[Depends(require("read"))])
def get_stragglers(request: Request, job_id: str) -> dict[str, Any]:
    """Straggler findings of the job, each with its attribution and cost in GPU-hours."""
    body = _analysis(request, job_id, "stragglers")
    findings = request.app.state.store.read("finding").filter(pl.col("subject").str.starts_with(f"job:{job_id}/"))
    body["findings"] = findings.with_columns(pl.col("window_start").cast(pl.String), pl.col("window_end").cast(pl.String)).to_dicts()
    return body


@router.get("/{job_id}/whatif", dependencies=[Depends(require("read"))])
def get_whatif(request: Request, job_id: str) -> dict[str, Any]:
    """The straggler what-if of the job's recorded operations (format ``bytedance_whatif``): slowdown S
    against the ideal timeline, M_W and M_S, the verdict and culprits, and the slowdown each worker (rank),
    pipeline stage and data-parallel rank causes on its own."""
    return _analysis(request, job_id, "whatif")


@router.get("/{job_id}/sdc", dependencies=[Depends(require("read"))])
def get_sdc(request: Request, job_id: str) -> dict[str, Any]:
    """Silent-data-corruption screen of the job, computed now: suspects with their evidence chains,
    checksum disagreements, single-rank spikes, NaN/Inf onset, and the rerun protocol's records, verdicts
    (transient, persistent, not_gpu, no_fault, inconclusive) and cases that could not be judged."""
    _known(request, job_id)
    return analysis.job_sdc(request.app.state.store, job_id)


@router.get("/{job_id}/energy", dependencies=[Depends(require("read"))])
def get_energy(
    request: Request,
    job_id: str,
    start: Annotated[dt.datetime | None, Query(description="keep the part of the run from this instant (RFC 3339)")] = None,
    end: Annotated[dt.datetime | None, Query(description="... up to this one (exclusive)")] = None,
) -> Response:
    """The job's energy and emissions from the per-minute roll-ups: GPU and facility energy, location- and
    market-based kgCO2e side by side, per site with PUE and basis, energy per step and per million tokens."""


    _known(request, job_id)
    try:
        body = es.job_report(request.app.state.store, job_id, start, end)
    except es.NotFound as exc:
        raise HTTPException(404, str(exc)) from None
    except ValueError as exc:  # the period (job_report reads instants without a zone as UTC first)
        raise HTTPException(400, str(exc)) from None
    return Response(json.dumps(body, default=str), media_type="application/json")


@models.get("/{name}/scaling", dependencies=[Depends(require("read"))])
def get_scaling(
    request: Request,
    name: ModelName,
    points: Annotated[int, Query(ge=2, le=job_reads.FIT_POINTS_MAX, description="world sizes the fitted curve is predicted at")] = job_reads.FIT_POINTS,
    comm_term: Annotated[str, Query(pattern="^(" + "|".join(job_reads.FIT_COMM_TERMS) + ")$",
                                    description="the Fleet Law's growing term: ring 2(N-1), tree log2 N, ring_bandwidth 2(N-1)/N")] = job_reads.FIT_COMM_TERM,
) -> dict[str, Any]:
    """Scaling across the runs of one model and the Fleet Law fitted to them, as the Jobs page shows them
    (``services.job_reads.scaling_report`` over ``scaling_fit``, with its defaults):

    - ``model_name``, ``comm_term``;
    - ``runs``: per job of the model with a world size and step records, smallest world size first,
      ``{job_id, world_size, step_time_mean_s, efficiency_ratio}``; η = T1 / (N · T_N), relative to the
      smallest run where there is no 1-GPU run;
    - ``fit``: ``{a_s, b_s, c_s, r2, n_opt, comm_term}`` of T_step(N) = a/N + b·f(N) + c (``n_opt``: the world
      size with the shortest predicted step, null where the curve has no minimum; ``a_s`` ≤ 0 means the runs do not
      scale as one model and global batch would), or null with ``why`` (fewer than three world sizes);
    - ``curve``: ``{world_size, step_time_s, efficiency_ratio}`` predicted at ``points`` world sizes spread
      log-evenly around the runs, plus the runs' own.

    404 for a model no job of the inventory names; 422 naming the parameter for a name over 500 characters or
    holding a control character, ``points`` outside 2..1000, or an unknown ``comm_term``.
    """
    return job_reads.scaling_report(request.app.state.store, name, points=points, comm_term=comm_term)

"""Kineto traces to canonical frames: ``step`` rows with the C³ device-side breakdown of each
``ProfilerStep#N`` window, ``collective`` rows per NCCL kernel, ``device_union`` rows (the rank's device
timeline per HTA event window, reduced to the unions of HTA's temporal breakdown: ``fleetscope.core.kernels``),
and the ``job`` row (docs/ARCHITECTURE.md, "The C³ model"; the rules are in ``ingest.kineto``'s docstring).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np
import polars as pl

from fleetscope.core import kernels
from fleetscope.core.frames import COLLECTIVE, DEVICE_UNION, JOB, STEP, UTC_US, Batch
from ingest.kineto_decode import _Reduced


def _union_s(starts, ends) -> float:
    """Length (in the input unit) of the union of intervals [starts[i], ends[i])."""
    bs, be = kernels.merge(starts, ends)
    return float(np.sum(be - bs))


def _step_rows(t: _Reduced, job_id: str) -> pl.DataFrame:
    # the host-side span (user_annotation); the GPU-annotation copy newer PyTorch writes is a device view
    host = (
        t.profiler_steps.filter(~pl.col("device_side") & (pl.col("cat") != "gpu_user_annotation"))
        .unique("step", keep="first")
        .sort("ts_us")
    )
    if host.height == 0:
        return STEP.empty()
    is_comm, ws, we = t.work_comm, t.work_ts_us, t.work_end_us
    out: dict[str, list] = {k: [] for k in ("step", "start_us", "end_us", "compute_s", "comm_s", "comm_overlap_s", "idle_s")}
    for step, s0, d in host.select("step", "ts_us", "dur_us").iter_rows():
        s1 = s0 + d
        inside = (we > s0) & (ws < s1)
        cs, ce = np.clip(ws[inside], s0, s1), np.clip(we[inside], s0, s1)
        comm = is_comm[inside]
        comp_us = _union_s(cs[~comm], ce[~comm])
        comm_us = _union_s(cs[comm], ce[comm])
        busy_us = _union_s(cs, ce)
        overlap_us = comp_us + comm_us - busy_us  # |A ∩ B| = |A| + |B| − |A ∪ B|
        out["step"].append(step)
        out["start_us"].append(s0)
        out["end_us"].append(s1)
        out["compute_s"].append(comp_us / 1e6)
        out["comm_s"].append(comm_us / 1e6)
        out["comm_overlap_s"].append(max(overlap_us, 0.0) / 1e6)
        out["idle_s"].append(max(d - busy_us, 0.0) / 1e6)
    df = pl.DataFrame(out)
    return df.select(
        pl.lit(job_id, pl.String).alias("job_id"),
        pl.lit(t.rank, pl.Int64).alias("rank"),
        pl.col("step").cast(pl.Int64),
        _to_ts(pl.col("start_us"), t.origin_us).alias("start"),
        _to_ts(pl.col("end_us"), t.origin_us).alias("end"),
        "compute_s",
        "comm_s",
        "comm_overlap_s",
        "idle_s",
        pl.lit(None, pl.Int64).alias("tokens"),
        pl.lit(None, pl.Float64).alias("model_flops"),
    )


def _to_ts(expr: pl.Expr, origin_us: float) -> pl.Expr:
    return (expr + origin_us).round(0).cast(pl.Int64).cast(UTC_US)


def _collective_rows(t: _Reduced, job_id: str) -> pl.DataFrame:
    c = t.collectives
    if c.height == 0:
        return COLLECTIVE.empty()
    # comm_id: the process group's name where PyTorch recorded it (the same string on every member rank);
    # otherwise the CUDA stream the kernel ran on, which NCCL keeps per communicator.
    c = c.with_columns(
        pl.when(pl.col("pg").is_not_null()).then("pg:" + pl.col("pg")).otherwise("stream:" + pl.col("stream").cast(pl.String)).alias("comm_id")
    ).sort("comm_id", "ts_us")
    # seq: position of the op in its communicator on this rank. NCCL requires every member to issue the
    # ops of a communicator in the same order, so equal (comm_id, seq) on two ranks is the same collective
    # when their traces cover the same steps (the profiler schedule is the same on every rank).
    c = c.with_columns(pl.int_range(pl.len()).over("comm_id").cast(pl.Int64).alias("seq"))
    dur_s = pl.col("dur_us") / 1e6
    algbw = pl.when(dur_s > 0).then(pl.col("bytes") / dur_s / 1e9)
    # busbw = algbw × the share of the message each rank moves over its slowest link (nccl-tests
    # doc/PERFORMANCE.md), so busbw is comparable to link peak whatever the rank count.
    n = pl.col("nranks").cast(pl.Float64)
    factor = (
        pl.when(pl.col("op") == "all_reduce").then(2 * (n - 1) / n)
        .when(pl.col("op").is_in(["all_gather", "reduce_scatter", "all_to_all"])).then((n - 1) / n)
        .otherwise(pl.lit(1.0))
    )
    return c.select(
        pl.lit(job_id, pl.String).alias("job_id"),
        pl.col("rank"),
        pl.col("comm_id"),
        pl.col("seq"),
        pl.col("op"),
        pl.col("bytes"),
        pl.col("nranks"),
        _to_ts(pl.col("ts_us"), t.origin_us).alias("start"),
        dur_s.alias("duration_s"),
        algbw.alias("algbw_gbps"),
        (algbw * factor).alias("busbw_gbps"),
        pl.col("algo"),
        pl.col("proto"),
        pl.col("dtype"),
        pl.lit(None, pl.String).alias("host"),
        pl.lit(None, pl.String).alias("gpu_uuid"),
    ).sort("rank", "comm_id", "seq")


def _union_rows(t: _Reduced, job_id: str) -> pl.DataFrame:
    if t.device_start_us is None or not t.unions:
        return DEVICE_UNION.empty()
    steps = t.profiler_steps["step"]
    lo, hi = (steps.min(), steps.max()) if steps.len() else (None, None)
    rows = [(w, u.events, u.span_us, u.busy_us, u.compute_us, u.comm_us, u.overlap_us) for w, u in t.unions.items()]
    df = pl.DataFrame(rows, schema={"window": pl.String, "events": pl.Int64, "span_us": pl.Float64, "busy_us": pl.Float64,
                                    "compute_us": pl.Float64, "comm_us": pl.Float64, "overlap_us": pl.Float64}, orient="row")
    return df.select(
        pl.lit(job_id, pl.String).alias("job_id"),
        pl.lit(t.rank, pl.Int64).alias("rank"),
        _to_ts(pl.lit(t.device_start_us, pl.Float64), t.origin_us).alias("start"),
        pl.all(),
        pl.lit(lo, pl.Int64).alias("step_min"),
        pl.lit(hi, pl.Int64).alias("step_max"),
    )


def default_job_id(data: bytes) -> str:
    """The job id of a trace ingested without one: from the hash of its bytes as given (compressed or
    not), so re-ingesting the same file lands on the same natural keys (idempotent writes)."""
    return "kineto-" + hashlib.sha256(data).hexdigest()[:16]


def _batch(traces: Sequence[_Reduced], job_id: str, source: str) -> Batch:
    steps = pl.concat([_step_rows(t, job_id) for t in traces], how="vertical_relaxed")
    colls = pl.concat([_collective_rows(t, job_id) for t in traces], how="vertical_relaxed")
    unions = pl.concat([_union_rows(t, job_id) for t in traces], how="vertical_relaxed")
    worlds = {t.world_size for t in traces if t.world_size is not None}
    world = max(worlds) if worlds else None
    job = pl.DataFrame({"job_id": [job_id], "world_size": [world]}, schema={"job_id": pl.String, "world_size": pl.Int64})
    job = job.select([pl.col(c) if c in job.columns else pl.lit(None, dt).alias(c) for c, dt in JOB.schema.items()])
    return Batch(
        source=source,
        job=job,
        step=steps.select(list(STEP.names)).cast(STEP.schema),
        # Kineto kernels are collectives or p2p ops without a recorded peer: peer stays -1.
        collective=colls.with_columns(pl.lit(-1, pl.Int64).alias("peer")).select(list(COLLECTIVE.names)).cast(COLLECTIVE.schema),
        device_union=unions.select(list(DEVICE_UNION.names)).cast(DEVICE_UNION.schema),
        meta={"kineto": [dict(t.meta, source=t.source) for t in traces]},
    )

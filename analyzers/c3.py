"""C³ step-time breakdown, scaling efficiency and the Fleet Law fit; HTA-compatible temporal breakdown.

The C³ model (docs/ARCHITECTURE.md, "The C³ model"): every step of a distributed job spends its wall time on
Compute (C1, local arithmetic), Communication (C2, moving bytes over the fabric) and Coordination (C3,
waiting inside collectives for the last peer, host stalls, idle). Per rank and step, from the ``step``
frame (kernel-timeline unions written by ``ingest.kineto``) and the ``collective`` frame:

- C1 = compute_s (union of non-communication kernel time),
- exposed comm = comm_s − comm_overlap_s (communication not hidden behind compute),
- exposed comm splits into wait and transfer by the wait share of that rank's collectives in the step,
- C2 = exposed transfer, C3 = idle_s + exposed wait, so C1 + C2 + C3 = step time exactly.

Wait vs transfer without clock sync: a collective's kernel on a rank runs from the moment that rank
enters it until the data has moved, so it lasts (wait for the last peer) + (transfer). The last rank to
arrive waits ~0, hence across the ranks of one collective (same comm_id, seq) min(duration) ≈ transfer
and duration − min ≈ wait. Only durations are compared, never timestamps of different hosts, so no
clock synchronisation is needed (the same observation underlies the "late-arriving rank" straggler test
of Meta's HTA, and the what-if analysis of Lin et al., "Understanding Stragglers in Large Model Training
Using What-if Analysis", OSDI 2025).

Scaling: η(N) = T1 / (N · T_N) for a fixed global workload (strong scaling). The Fleet Law
T_step(N) = T_compute/N + T_comm(N) + T_sync(N) − T_overlap is fitted as T(N) = a/N + b·f(N) + c by
linear least squares; see :func:`fit_fleet_law` for the comm term.

The HTA-compatible functions reproduce the definitions of Meta's Holistic Trace Analysis
(github.com/facebookresearch/HolisticTraceAnalysis, ``hta/analyzers/breakdown_analysis.py``
``get_temporal_breakdown`` and ``hta/analyzers/communication_analysis.py`` ``get_comm_comp_overlap``,
v0.5.0) so a user of HTA finds the same numbers here. Written from those definitions, not copied. The
definitions themselves (kernel classes, interval merge, event window, unions) are in ``fleetscope.core.kernels``,
shared with ``ingest.kineto``, which stores each trace's unions (``device_union``); :func:`hta_breakdown` makes the
figures from those, which is how the service's ``temporal`` job analysis reports them.

Pure: polars and numpy in, polars/dataclasses out.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import polars as pl

from fleetscope.core import kernels
from fleetscope.core.kernels import KernelType, kernel_type

__all__ = [
    "KernelType",
    "kernel_type",
    "hta_window",
    "hta_unions",
    "hta_breakdown",
    "hta_job_window",
    "hta_report",
    "hta_temporal_breakdown",
    "hta_comm_comp_overlap",
    "collective_wait",
    "c3_breakdown",
    "job_summary",
    "communication_intensity",
    "network_bytes",
    "network_bytes_per_row",
    "scaling_efficiency",
    "FleetLawFit",
    "fit_fleet_law",
    "ADVICE",
]


# --- HTA temporal breakdown and overlap -------------------------------------------------------------
#
# HTA's kernel classes, interval merge, event window and unions live in fleetscope.core.kernels, which the
# Kineto reader shares: it reduces each trace to those unions at ingest (the device_union frame), and
# hta_breakdown makes HTA's figures from them, whether they were stored or computed here from a trace in memory.

_BREAKDOWN = ("rank", "idle_time_us", "compute_time_us", "non_compute_time_us", "kernel_time_us",
              "idle_time_pctg", "compute_time_pctg", "non_compute_time_pctg")
_OVERLAP = ("rank", "comp_comm_overlap_ratio", "comp_comm_overlap_pctg")
_UNION_SCHEMA = {"rank": pl.Int64, "window": pl.String, "events": pl.Int64, "span_us": pl.Float64, "busy_us": pl.Float64,
                 "compute_us": pl.Float64, "comm_us": pl.Float64, "overlap_us": pl.Float64}


def hta_window(step_numbers: int, include_last_step: bool = False) -> str:
    """The event window HTA applies to a job whose traces name ``step_numbers`` distinct ``ProfilerStep#N``:
    none (``all``) below two, else the rank's steps before its last one (``before_last_step``), or through it."""
    if step_numbers < 2:
        return "all"
    return "through_last_step" if include_last_step else "before_last_step"


def hta_unions(device_events: pl.DataFrame, profiler_steps: pl.DataFrame | None = None) -> pl.DataFrame:
    """Per rank and event window (``fleetscope.core.kernels.WINDOWS``) the unions HTA's figures are made of:
    ``rank, window, events, span_us, busy_us, compute_us, comm_us, overlap_us`` (µs; a window that keeps no
    event of a rank has no row). The Kineto reader stores the same rows per trace (``device_union``).

    ``device_events``: ``rank, name, stream, correlation, ts_us, dur_us, launch_ts_us`` (``ingest.kineto``
    ``KinetoTrace.device_events``, concatenated over ranks); ``profiler_steps``: its ``profiler_steps``, whose
    host-side spans (not ``device_side``) bound each rank's step windows.
    """
    ev = device_events.filter(pl.col("stream") != -1).sort("rank", maintain_order=True)
    host = (profiler_steps.filter(~pl.col("device_side")) if profiler_steps is not None and profiler_steps.height
            else pl.DataFrame(schema={"rank": pl.Int64, "ts_us": pl.Float64, "dur_us": pl.Float64}))
    rows = []
    memo: dict[str, int] = {}
    for (rank,), g in ev.group_by(["rank"], maintain_order=True):
        gpu = (((g["stream"] >= 0) & (g["correlation"] >= 0)) | g["name"].is_in(kernels.SYNC_EVENT_NAMES)).to_numpy()
        mine = host.filter(pl.col("rank") == rank)
        found = kernels.window_unions(
            g["ts_us"].to_numpy(), g["dur_us"].to_numpy(), kernels.kind_codes(g["name"].to_list(), memo), gpu,
            g["launch_ts_us"].fill_null(float("nan")).to_numpy(), mine["ts_us"].to_numpy(), mine["dur_us"].to_numpy())
        rows += [(rank, w, u.events, u.span_us, u.busy_us, u.compute_us, u.comm_us, u.overlap_us) for w, u in found.items()]
    return pl.DataFrame(rows, schema=_UNION_SCHEMA, orient="row")


def hta_breakdown(unions: pl.DataFrame, window: str) -> pl.DataFrame:
    """HTA's per-rank figures from the unions of one event window (:func:`hta_unions`'s rows, or the
    ``device_union`` frame's): ``rank``, then the temporal breakdown (``get_temporal_breakdown``) ``idle_time_us,
    compute_time_us, non_compute_time_us, kernel_time_us`` and their shares of kernel time ``*_pctg``, rounded to
    2 decimals as HTA does; then the overlap (``get_comm_comp_overlap``) ``comp_comm_overlap_ratio`` = |computation ∩
    communication| / |communication| and ``comp_comm_overlap_pctg``, null where the rank ran no communication kernel.
    idle = kernel − busy; non_compute = kernel − compute − idle. Sorted by rank."""
    df = unions.filter(pl.col("window") == window).sort("rank").select(
        "rank",
        (pl.col("span_us") - pl.col("busy_us")).alias("idle_time_us"),
        pl.col("compute_us").alias("compute_time_us"),
        pl.col("span_us").alias("kernel_time_us"),
        pl.when(pl.col("comm_us") > 0).then(pl.col("overlap_us") / pl.col("comm_us")).alias("comp_comm_overlap_ratio"),
    ).with_columns((pl.col("kernel_time_us") - pl.col("compute_time_us") - pl.col("idle_time_us")).alias("non_compute_time_us"))
    share = lambda c: (100 * pl.col(c) / pl.col("kernel_time_us")).round(2)  # noqa: E731
    return df.with_columns(
        share("idle_time_us").alias("idle_time_pctg"),
        share("compute_time_us").alias("compute_time_pctg"),
        share("non_compute_time_us").alias("non_compute_time_pctg"),
        (100 * pl.col("comp_comm_overlap_ratio")).round(2).alias("comp_comm_overlap_pctg"),
    ).select(*_BREAKDOWN, *_OVERLAP[1:])


def hta_job_window(unions: pl.DataFrame, include_last_step: bool = False) -> str:
    """HTA's event window for a job from its traces' stored unions: the rule of :func:`hta_window` over the
    ProfilerStep numbers the traces name (``step_min``, ``step_max``: two distinct ones or more when a trace
    names two, or traces name different ones)."""
    named = set(unions["step_min"].drop_nulls().to_list()) | set(unions["step_max"].drop_nulls().to_list())
    return hta_window(len(named), include_last_step)


NO_EVENTS_IN_WINDOW = "no device event of the job's traces falls in HTA's event window"


def hta_report(unions: pl.DataFrame, *, include_last_step: bool = False) -> dict[str, Any]:
    """A job's HTA figures from its ``device_union`` rows, as the service stores and serves them.

    Each rank's latest trace counts (HTA reads one trace per rank; ``traces`` says how many the rank has), in the
    event window HTA's rule gives the job (:func:`hta_job_window`). Returns ``window``, ``include_last_step``,
    ``ranks`` (per rank :func:`hta_breakdown`'s figures plus ``trace_start`` and ``traces``), ``job`` (over all
    ranks: the sums of kernel, idle, compute and non-compute time, their shares of the summed kernel time, and the
    overlap of the summed communication time; None without ranks) and ``reason`` (why ``ranks`` is empty, else
    None)."""
    if unions.height == 0:
        return {"window": None, "include_last_step": include_last_step, "ranks": [], "job": None,
                "reason": "no Kineto kernel data: no device_union rows"}
    latest = unions.filter(pl.col("start") == pl.col("start").max().over("rank"))
    window = hta_job_window(latest, include_last_step)
    traces = unions.group_by("rank").agg(pl.col("start").n_unique().cast(pl.Int64).alias("traces"),
                                         pl.col("start").max().alias("trace_start"))
    per_rank = hta_breakdown(latest, window).join(traces, on="rank", how="left")
    used = latest.filter(pl.col("window") == window)
    if used.height == 0:
        return {"window": window, "include_last_step": include_last_step, "ranks": [], "job": None,
                "reason": f"{NO_EVENTS_IN_WINDOW} ({window})"}
    kernel, busy, compute, comm, overlap = (float(used[c].sum()) for c in ("span_us", "busy_us", "compute_us", "comm_us", "overlap_us"))
    idle = kernel - busy
    share = (lambda x: round(100 * x / kernel, 2)) if kernel > 0 else (lambda x: None)  # noqa: E731
    ratio = overlap / comm if comm > 0 else None
    job = {"ranks": used.height, "kernel_time_us": kernel, "idle_time_us": idle, "compute_time_us": compute,
           "non_compute_time_us": kernel - compute - idle, "idle_time_pctg": share(idle), "compute_time_pctg": share(compute),
           "non_compute_time_pctg": share(kernel - compute - idle), "comp_comm_overlap_ratio": ratio,
           "comp_comm_overlap_pctg": None if ratio is None else round(100 * ratio, 2)}
    return {"window": window, "include_last_step": include_last_step, "ranks": per_rank.to_dicts(), "job": job, "reason": None}


def _trace_window(profiler_steps: pl.DataFrame | None, include_last_step: bool) -> str:
    names = 0 if profiler_steps is None or profiler_steps.height == 0 else profiler_steps["name"].n_unique()
    return hta_window(names, include_last_step)


def hta_temporal_breakdown(
    device_events: pl.DataFrame,
    profiler_steps: pl.DataFrame | None = None,
    *,
    include_last_step: bool = False,
) -> pl.DataFrame:
    """Per rank idle / compute / non-compute time and shares, as HTA's ``get_temporal_breakdown``.

    ``device_events``: ``rank, name, stream, correlation, ts_us, dur_us, launch_ts_us`` (``ingest.kineto``
    ``KinetoTrace.device_events``, concatenated over ranks); ``profiler_steps``: its ``profiler_steps``.
    HTA's definitions (``fleetscope.core.kernels``): kernel_time = end of the last merged block − start of the
    first, over all device events of the rank; idle = kernel_time − union of all device events; compute = union
    of COMPUTATION events (:func:`kernel_type`); non_compute = kernel_time − compute − idle; the last profiler
    step is left out unless ``include_last_step``, when the traces name two profiler steps or more. Shares are
    rounded to 2 decimals, as HTA does.
    Returns ``rank, idle_time_us, compute_time_us, non_compute_time_us, kernel_time_us,
    idle_time_pctg, compute_time_pctg, non_compute_time_pctg``.
    """
    window = _trace_window(profiler_steps, include_last_step)
    return hta_breakdown(hta_unions(device_events, profiler_steps), window).select(_BREAKDOWN)


def hta_comm_comp_overlap(
    device_events: pl.DataFrame,
    profiler_steps: pl.DataFrame | None = None,
    *,
    include_last_step: bool = False,
) -> pl.DataFrame:
    """Per rank share of communication time that runs concurrently with computation, as HTA's
    ``get_comm_comp_overlap``: |merged COMPUTATION ∩ merged COMMUNICATION| / |merged COMMUNICATION|.

    Same inputs and event window as :func:`hta_temporal_breakdown`. Returns ``rank,
    comp_comm_overlap_ratio, comp_comm_overlap_pctg`` (null when the rank ran no communication kernel).
    """
    window = _trace_window(profiler_steps, include_last_step)
    return hta_breakdown(hta_unions(device_events, profiler_steps), window).select(_OVERLAP)


# --- C³ ------------------------------------------------------------------------------------------


def collective_wait(collective: pl.DataFrame) -> pl.DataFrame:
    """Add ``transfer_s``, ``wait_s`` and ``ranks_seen`` to each collective row.

    Across the ranks of one collective (same job_id, comm_id, seq): transfer_s = min(duration_s),
    wait_s = duration_s − transfer_s (docs/ARCHITECTURE.md, "The C³ model"). Where only one rank of the collective is
    present there is nothing to compare with, so its wait is 0 and all of it counts as transfer;
    ``ranks_seen`` says how many ranks the minimum was taken over (below ``nranks``, the minimum is only
    an upper bound on the transfer).
    """
    key = ["job_id", "comm_id", "seq"]
    return collective.with_columns(
        pl.col("duration_s").min().over(key).alias("transfer_s"),
        pl.len().over(key).cast(pl.Int64).alias("ranks_seen"),
    ).with_columns((pl.col("duration_s") - pl.col("transfer_s")).alias("wait_s"))


# Dyadic grid for C³ components: multiples of 2^-32 s (0.23 ns, far below the profiler's 1 µs / 1 ns
# resolution). Float64 adds and subtracts such numbers exactly while they stay below 2^21 s (24 days),
# which is what lets C1 + C2 + C3 == step time hold exactly rather than to within rounding.
_GRID = float(2**32)


def _on_grid(expr: pl.Expr) -> pl.Expr:
    return (expr * _GRID).round(0) / _GRID


def c3_breakdown(step: pl.DataFrame, collective: pl.DataFrame | None = None) -> pl.DataFrame:
    """Per rank and step: C1 compute, C2 exposed transfer, C3 coordination, with C1 + C2 + C3 = step_s.

    ``step``: canonical step frame (``start``, ``end``, ``compute_s``, ``comm_s``, ``comm_overlap_s``,
    ``idle_s``). ``collective``: canonical collective frame for the same job(s); a collective belongs to the
    step of its rank whose [start, end) holds its start. The exposed communication (comm_s − overlap) is
    split into wait and transfer in proportion to that rank-step's Σwait / Σduration: the frames carry
    per-step totals, not which part of each kernel was hidden behind compute. Without collectives (or with
    one rank only) all exposed communication counts as transfer.

    The step time is end − start; the kernel unions inside it were measured over that same window, so
    C3 = step_s − C1 − C2 absorbs the window's idle time and the identity holds exactly.

    Returns ``job_id, rank, step, start, step_s, c1_compute_s, c2_comm_s, c3_coord_s, overlap_s,
    exposed_comm_s, wait_ratio, f_compute``.
    """
    st = step.with_columns(_on_grid((pl.col("end") - pl.col("start")).dt.total_microseconds() / 1e6).alias("step_s"))
    if collective is not None and collective.height:
        cw = collective_wait(collective).select("job_id", "rank", "start", "duration_s", "wait_s")
        spans = st.select("job_id", "rank", "step", pl.col("start").alias("s_start"), pl.col("end").alias("s_end"))
        # A rank's steps do not overlap, so a collective belongs to the last step starting at or before it,
        # if it starts before that step ends. An as-of join finds it in O(n log n); an equi-join on
        # (job, rank) then a range filter grows as steps × collectives per rank (10^4 rows per rank for
        # 100 steps, too many at 16k ranks).
        tagged = cw.sort("start").join_asof(
            spans.sort("s_start"), left_on="start", right_on="s_start", by=["job_id", "rank"], strategy="backward",
            check_sortedness=False,  # both sides sorted just above; polars cannot check it per group
        ).filter(pl.col("step").is_not_null() & (pl.col("start") < pl.col("s_end")))
        per = tagged.group_by("job_id", "rank", "step").agg(
            (pl.col("wait_s").sum() / pl.col("duration_s").sum()).alias("wait_ratio")
        )
        st = st.join(per, on=["job_id", "rank", "step"], how="left")
    else:
        st = st.with_columns(pl.lit(None, pl.Float64).alias("wait_ratio"))
    exposed = (pl.col("comm_s") - pl.col("comm_overlap_s")).clip(lower_bound=0.0)
    wr = pl.col("wait_ratio").fill_nan(0.0).fill_null(0.0).clip(0.0, 1.0)
    out = st.with_columns(exposed.alias("exposed_comm_s"), wr.alias("wait_ratio")).with_columns(
        _on_grid(pl.col("compute_s")).alias("c1_compute_s"),
        _on_grid(pl.col("exposed_comm_s") * (1 - pl.col("wait_ratio"))).alias("c2_comm_s"),
        pl.col("comm_overlap_s").alias("overlap_s"),
    )
    # C3 is the remainder, so it equals idle_s + exposed wait whenever the step frame's own identity holds
    # and absorbs its rounding residue otherwise. With step, C1 and C2 on the 2^-32 s grid, the remainder
    # is on it too and C1 + C2 + C3 == step_s holds bit for bit, in any order of addition.
    out = out.with_columns((pl.col("step_s") - pl.col("c1_compute_s") - pl.col("c2_comm_s")).alias("c3_coord_s"))
    out = out.with_columns(
        pl.when(pl.col("step_s") > 0).then(pl.col("c1_compute_s") / pl.col("step_s")).alias("f_compute")
    )
    return out.select(
        "job_id", "rank", "step", "start", "step_s", "c1_compute_s", "c2_comm_s", "c3_coord_s",
        "overlap_s", "exposed_comm_s", "wait_ratio", "f_compute",
    ).sort("job_id", "rank", "step")


ADVICE: dict[str, str] = {
    "C1": (
        "Compute-bound: the GPUs are busy with local arithmetic. Gains come from faster kernels: compare "
        "MFU with the GPU's peak, fuse kernels (torch.compile), use tensor cores (bf16/fp8), FlashAttention, "
        "larger micro-batches; more GPUs still help while C2 and C3 stay small."
    ),
    "C2": (
        "Communication-bound: exposed transfer dominates. Overlap communication with compute (DDP bucket "
        "size, FSDP/ZeRO prefetch), compress or down-cast gradients (bf16, PowerSGD), fuse small messages, "
        "and check topology and placement (keep tensor parallelism inside an NVLink domain; compare busbw "
        "with link peak and nccl-tests)."
    ),
    "C3": (
        "Coordination-bound: ranks wait for each other or the GPU sits idle. Look for stragglers (a slow or "
        "throttled GPU, a noisy neighbour), load imbalance (sequence-length skew, uneven pipeline stages), "
        "host stalls (data loading, kernel-launch overhead, synchronising calls such as .item())."
    ),
}

_BUSBW_FACTOR = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_to_all": lambda n: (n - 1) / n,
}


def network_bytes(collective: pl.DataFrame) -> float:
    """Bytes put on the network, summed over collective rows: message bytes × the per-rank share each
    algorithm moves (nccl-tests doc/PERFORMANCE.md bus-bandwidth factors: all-reduce 2(n−1)/n, all-gather,
    reduce-scatter and all-to-all (n−1)/n, others 1). Rows without a size count 0."""
    if collective.height == 0:
        return 0.0
    return float(network_bytes_per_row(collective).sum() or 0.0)


def network_bytes_per_row(collective: pl.DataFrame) -> pl.Series:
    """Each collective row's bytes on the network (:func:`network_bytes` before the sum; null without a size)."""
    n = pl.col("nranks").cast(pl.Float64)
    factor = (
        pl.when(pl.col("op") == "all_reduce").then(2 * (n - 1) / n)
        .when(pl.col("op").is_in(["all_gather", "reduce_scatter", "all_to_all"])).then((n - 1) / n)
        .otherwise(1.0)
    )
    return collective.select((pl.col("bytes").cast(pl.Float64) * factor.fill_null(1.0)).alias("network_bytes")).to_series()


def communication_intensity(network_bytes: float, flops: float) -> float | None:
    """CI = network bytes / FLOPs (docs/ARCHITECTURE.md): bytes the job must move per unit of arithmetic. Compare with
    the machine balance (link bytes/s ÷ GPU FLOP/s) the way the roofline model compares arithmetic
    intensity with memory balance: above it, the job cannot be compute-bound at scale."""
    if not flops or flops <= 0 or not math.isfinite(flops):
        return None
    return network_bytes / flops


def job_summary(
    breakdown: pl.DataFrame,
    *,
    collective: pl.DataFrame | None = None,
    flops: float | None = None,
) -> pl.DataFrame:
    """Per job: mean, p50 and p99 over all (rank, step) of step_s, C1, C2, C3 and f_compute, the mean share
    of each component, the dominant one with :data:`ADVICE`, and communication intensity when ``flops``
    (total model FLOPs of the covered steps) and ``collective`` are given.

    One row per job_id. Percentiles use linear interpolation.
    """
    cols = ["step_s", "c1_compute_s", "c2_comm_s", "c3_coord_s", "f_compute"]
    aggs = []
    for c in cols:
        aggs += [
            pl.col(c).mean().alias(f"{c}_mean"),
            pl.col(c).quantile(0.5, "linear").alias(f"{c}_p50"),
            pl.col(c).quantile(0.99, "linear").alias(f"{c}_p99"),
        ]
    aggs += [
        (pl.col("c1_compute_s").sum() / pl.col("step_s").sum()).alias("c1_ratio"),
        (pl.col("c2_comm_s").sum() / pl.col("step_s").sum()).alias("c2_ratio"),
        (pl.col("c3_coord_s").sum() / pl.col("step_s").sum()).alias("c3_ratio"),
        pl.col("rank").n_unique().alias("ranks"),
        pl.col("step").n_unique().alias("steps"),
    ]
    out = breakdown.group_by("job_id", maintain_order=True).agg(aggs)
    ratios = out.select("c1_ratio", "c2_ratio", "c3_ratio").to_numpy()
    dominant = [("C1", "C2", "C3")[int(np.nanargmax(r))] if np.isfinite(r).any() else None for r in ratios]
    ci = []
    for job in out["job_id"].to_list():
        if collective is None or flops is None:
            ci.append(None)
        else:
            nb = network_bytes(collective.filter(pl.col("job_id") == job))
            ci.append(communication_intensity(nb, flops))
    return out.with_columns(
        pl.Series("dominant", dominant, dtype=pl.String),
        pl.Series("advice", [ADVICE.get(d) if d else None for d in dominant], dtype=pl.String),
        pl.Series("comm_intensity_bytes_per_flop", ci, dtype=pl.Float64),
    )


# --- scaling -------------------------------------------------------------------------------------


def scaling_efficiency(world_size: Sequence[int], step_time_s: Sequence[float]) -> pl.DataFrame:
    """η(N) = T1 / (N · T_N) for runs of one model and global batch at different world sizes.

    T1 is the measured single-GPU step time when a run with N = 1 is given; otherwise it is extrapolated
    from the smallest run N0 as N0 · T_N0 (taking that run as perfectly efficient), so η is relative to it.
    Returns ``world_size, step_time_s, speedup, efficiency`` sorted by world size.
    """
    n = np.asarray(world_size, dtype=float)
    t = np.asarray(step_time_s, dtype=float)
    if n.shape != t.shape or n.size == 0:
        raise ValueError("world_size and step_time_s must be non-empty and of equal length")
    if np.any(n < 1) or np.any(~np.isfinite(t)) or np.any(t <= 0):
        raise ValueError("world sizes must be ≥ 1 and step times finite and > 0")
    order = np.argsort(n, kind="stable")
    n, t = n[order], t[order]
    t1 = t[0] * n[0]
    return pl.DataFrame(
        {"world_size": n.astype(np.int64), "step_time_s": t, "speedup": t1 / t, "efficiency": t1 / (n * t)}
    )


_COMM_TERMS = {
    # f(N) and f'(N)
    "ring": (lambda n: 2.0 * (n - 1.0), lambda n: 2.0 + 0.0 * n),
    "tree": (lambda n: np.log2(n), lambda n: 1.0 / (n * math.log(2.0))),
    "ring_bandwidth": (lambda n: 2.0 * (n - 1.0) / n, lambda n: 2.0 / n**2),
}
# The comm terms fit_fleet_law takes, for the doors that offer the choice (API, CLI).
COMM_TERMS = tuple(_COMM_TERMS)


@dataclass(frozen=True)
class FleetLawFit:
    """T_step(N) = a/N + b·f(N) + c, fitted by least squares.

    ``a_s``: compute spread over N GPUs (T_compute); ``b_s``: seconds per unit of the comm term; ``c_s``:
    the part that does not shrink with N. ``n_opt``: the world size minimising predicted step time; beyond
    it adding GPUs makes every step slower (inf when the fit has no minimum). ``r2``: coefficient of
    determination on the fitted points.
    """

    a_s: float
    b_s: float
    c_s: float
    comm_term: str
    r2: float
    n_opt: float

    def predict(self, world_size: float | np.ndarray) -> np.ndarray:
        n = np.asarray(world_size, dtype=float)
        return self.a_s / n + self.b_s * _COMM_TERMS[self.comm_term][0](n) + self.c_s


def fit_fleet_law(world_size: Sequence[int], step_time_s: Sequence[float], *, comm_term: str = "ring") -> FleetLawFit:
    """Fit the Fleet Law T_step(N) = a/N + b·f(N) + c to measured step times (needs ≥ 3 distinct N).

    Comm terms (``comm_term``):

    - ``"ring"`` (default) f(N) = 2(N−1): ring all-reduce of an M-byte gradient costs
      2(N−1)/N · M/β + 2(N−1)·α (Patarasuk & Yuan 2009; Thakur, Rabenseifner & Gropp 2005). The bandwidth
      part equals 2M/β − (2M/β)/N, so it folds into c and a; what is left that grows with N is the
      per-hop latency α times the 2(N−1) hops, so b estimates α and the model has a minimum at
      N* = sqrt(a / 2b).
    - ``"tree"`` f(N) = log2 N: tree / double-binary-tree latency (NCCL's tree algorithm); N* = a·ln2 / b.
    - ``"ring_bandwidth"`` f(N) = 2(N−1)/N: bandwidth term alone; it saturates, so step time flattens
      instead of rising and N* is inf unless b < 0 — use it to test whether the latency term is needed.

    T_sync (stragglers: the expected maximum of N noisy step times grows slowly with N) is absorbed by
    whichever growing term is chosen; the fit cannot tell them apart, so b is "cost that grows with N".
    """
    if comm_term not in _COMM_TERMS:
        raise ValueError(f"comm_term must be one of {sorted(_COMM_TERMS)}")
    n = np.asarray(world_size, dtype=float)
    t = np.asarray(step_time_s, dtype=float)
    if n.shape != t.shape or len(np.unique(n)) < 3:
        raise ValueError("need step times at ≥ 3 distinct world sizes to fit a, b and c")
    if np.any(n < 1) or not np.all(np.isfinite(t)):
        raise ValueError("world sizes must be ≥ 1 and step times finite")
    f, df = _COMM_TERMS[comm_term]
    design = np.column_stack([1.0 / n, f(n), np.ones_like(n)])
    (a, b, c), *_ = np.linalg.lstsq(design, t, rcond=None)
    pred = design @ np.array([a, b, c])
    ss_res = float(np.sum((t - pred) ** 2))
    ss_tot = float(np.sum((t - t.mean()) ** 2))
    r2 = 1.0 - ss_res / ss_tot if ss_tot > 0 else 1.0
    n_opt = _argmin_n(float(a), float(b), comm_term)
    return FleetLawFit(float(a), float(b), float(c), comm_term, r2, n_opt)


def _argmin_n(a: float, b: float, comm_term: str) -> float:
    """Stationary point of a/N + b·f(N): where the marginal compute saving a/N² equals b·f'(N)."""
    if a <= 0 or b <= 0:
        return math.inf
    if comm_term == "ring":
        return math.sqrt(a / (2.0 * b))
    if comm_term == "tree":
        return a * math.log(2.0) / b
    # ring_bandwidth: a/N² = 2b/N² has no solution unless a == 2b; the curve is monotone
    return math.inf if a > 2.0 * b else 1.0

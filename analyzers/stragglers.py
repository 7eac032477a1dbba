"""Stragglers: per-step detection, persistence, C³ attribution, what-if analysis and cost in GPU-hours.

Detection (canonical ``step`` frame, with ``collective`` when there is one). In a synchronous job every
rank's step *span* is the same length: the collectives hold the fast ranks until the slow one arrives.
What differs is the time a rank spends not waiting for its peers, ``busy_s = step_s − wait_s``, where
``wait_s`` is the exposed collective wait that :func:`analyzers.c3.c3_breakdown` separates from the
transfer (the last rank to arrive waits least). Per step, across the ranks of a job:

- relative score = median(busy_s over ranks) / busy_s of this rank; below 0.75 the rank is a straggler.
  This is the relative performance score of NVIDIA's resiliency extension
  (github.com/NVIDIA/nvidia-resiliency-ext, ``nvidia_resiliency_ext/straggler``: a rank's score is the
  reference (median) section time over its own; ``gpu_rel_threshold`` 0.75 by default);
- robust z-score = (busy_s − median) / (1.4826 · MAD) (Iglewicz & Hoaglin's modified z-score; 1.4826
  makes the MAD a consistent estimate of σ for normal data); above 3.5 is an outlier;
- the same modified z-score of each C³ part (C1 compute, C2 exposed transfer, idle) across the step's
  ranks: healthy ranks' transfers of the same collectives vary far less than their busy times, whose
  spread is the compute's, so a rank whose reduce-scatter and all-gather take twice its peers' on a
  compute-heavy step (a flapping NIC port) is an outlier in C2 while only ~10 % slower in busy time:
  under the relative threshold, and within the busy-time MAD where a third of the profiled ranks share
  its node. A part outlier is flagged only with the busy-time excess below (``min_excess_ratio``);
- persistence: flagged in at least k of the rank's last m steps, so one noisy step raises no alarm.

Attribution (from the C³ parts, per flagged rank-step): the part with the largest excess over the median
rank of that step — C1 compute → ``compute_slow`` (a slow or throttled GPU), C2 exposed transfer →
``communication_slow`` (a slow link or NIC), idle (C3 without the collective wait, i.e. the GPU idle
inside the step) → ``host_bound`` (data loading, CPU contention, launch overhead on that host).

Cost: the job advances at the pace of its slowest rank, so every rank waits out a straggler's excess;
one rank-step of excess e seconds costs e × (ranks in the step) GPU-seconds. :func:`price_findings` turns
the GPU-hours into energy (× the job's mean power per GPU, × PUE for the facility's share) and location-based
emissions (× grid intensity), the accounting of ``analyzers.energy`` and ``analyzers.carbon``.

What-if (:func:`whatif`), after Lin et al., "Understanding Stragglers in Large Model Training Using
What-if Analysis" (OSDI 2025; artifact github.com/ByteDance-Seed/StragglerAnalysis): replay the job's
operations through a dependency model with (a) their measured durations and (b) every operation at its
typical duration; S = T(actual) / T(ideal) is the slowdown stragglers cause. Replaying with only one
data-parallel rank's or one stage's operations at their measured durations gives that group's own
slowdown S_g (the paper's Eq. 4); a worker scores min(S_dp, S_stage) (as the artifact does); fixing the
top 3 % of workers, or one stage, to typical durations and measuring how much of T(actual) − T(ideal)
disappears gives M_W and M_S (the paper's characterisation metrics). The ideal timeline is the
artifact's: every operation type at one typical duration, the mean for compute and the median for
communication. Our dependency model is our own and simpler than the artifact's (see :func:`whatif`); on
the artifact's three published traces S lands within 0.3 % and M_W, M_S within 0.01 of its results.

Pure: polars/numpy in, frames and dataclasses out. Imports ``analyzers.c3`` for the C³ parts.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from datetime import datetime

import numpy as np
import polars as pl

from analyzers import c3
from fleetscope.core.frames import FINDING, UTC_US

__all__ = [
    "REL_THRESHOLD",
    "Z_THRESHOLD",
    "detect_stragglers",
    "straggler_findings",
    "findings_of_ranks",
    "EnergyPrice",
    "price_findings",
    "WhatIfResult",
    "whatif",
    "whatif_findings",
]

ANALYZER = "stragglers"
REL_THRESHOLD = 0.75  # NVIDIA resiliency extension's default gpu_rel_threshold
Z_THRESHOLD = 3.5  # Iglewicz & Hoaglin's cut-off for the modified z-score
_MAD_TO_SIGMA = 1.4826
_STEP_COLUMNS = ("job_id", "rank", "step", "start", "end", "compute_s", "comm_s", "comm_overlap_s", "idle_s")
_ATTRIBUTIONS = ("compute_slow", "communication_slow", "host_bound")
_PART_DEVIATIONS = ("_d1", "_d2", "_d3")  # each C³ part's deviation from the step's median rank


# --- per-step detection on canonical frames -----------------------------------------------------


def _check_step(step: pl.DataFrame) -> None:
    if not isinstance(step, pl.DataFrame):
        raise TypeError(f"step must be a polars DataFrame, not {type(step).__name__}")
    missing = [c for c in _STEP_COLUMNS if c not in step.columns]
    if missing:
        raise ValueError(f"step frame lacks column(s) {', '.join(missing)}")
    if step.height == 0:
        raise ValueError("step frame is empty: nothing to detect stragglers in")
    for c in ("compute_s", "comm_s", "comm_overlap_s", "idle_s"):
        bad = step.select((pl.col(c).is_null() | pl.col(c).is_nan() | pl.col(c).is_infinite() | (pl.col(c) < 0)).arg_true())
        if bad.height:
            raise ValueError(f"step row {bad.item(0, 0)}: {c} must be a finite number ≥ 0 (got {step[c][bad.item(0, 0)]!r})")
    if step.filter(pl.col("end") < pl.col("start")).height:
        raise ValueError("a step ends before it starts")


def detect_stragglers(
    step: pl.DataFrame,
    collective: pl.DataFrame | None = None,
    *,
    rel_threshold: float = REL_THRESHOLD,
    z_threshold: float = Z_THRESHOLD,
    min_excess_ratio: float = 0.05,
    persist_k: int = 3,
    persist_m: int = 5,
    breakdown: pl.DataFrame | None = None,
) -> pl.DataFrame:
    """Score every rank-step; flag stragglers and say why.

    A rank-step is flagged when its relative score is below ``rel_threshold`` or, when it is at least
    ``min_excess_ratio`` slower than the median (a tightly clustered job has a tiny MAD, and a rank 1 %
    slower than the rest is no straggler worth an alert), its busy time's or one C³ part's robust z-score
    is above ``z_threshold``.
    ``persistent``: flagged in at least ``persist_k`` of the rank's last ``persist_m`` steps (in step
    order, the current one included).

    Returns one row per (job_id, rank, step): ``start, end, step_s, busy_s, wait_s, idle_s, c1_compute_s,
    c2_comm_s, median_busy_s, relative_score, robust_z, flagged, flagged_recent, persistent, attribution,
    excess_s, ranks, gpu_s_lost`` (``attribution`` null where not flagged; ``gpu_s_lost`` = excess_s ×
    ranks on flagged rank-steps, else 0). ``breakdown``: ``c3.c3_breakdown(step, collective)`` when the caller
    has it already.
    """
    _check_step(step)
    if not (0 < rel_threshold <= 1):
        raise ValueError("rel_threshold must be in (0, 1]")
    if not (1 <= persist_k <= persist_m):
        raise ValueError("need 1 ≤ persist_k ≤ persist_m")
    bd = c3.c3_breakdown(step, collective) if breakdown is None else breakdown
    bd = bd.join(step.select("job_id", "rank", "step", "start", "end"), on=["job_id", "rank", "step", "start"], how="left")
    wait = (pl.col("exposed_comm_s") - pl.col("c2_comm_s")).clip(lower_bound=0.0)
    by = ["job_id", "step"]
    df = bd.with_columns(wait.alias("wait_s")).with_columns(
        (pl.col("c3_coord_s") - pl.col("wait_s")).clip(lower_bound=0.0).alias("idle_s"),
        (pl.col("step_s") - pl.col("wait_s")).alias("busy_s"),
    ).with_columns(
        pl.col("busy_s").median().over(by).alias("median_busy_s"),
        pl.len().over(by).cast(pl.Int64).alias("ranks"),
        (pl.col("c1_compute_s") - pl.col("c1_compute_s").median().over(by)).alias("_d1"),
        (pl.col("c2_comm_s") - pl.col("c2_comm_s").median().over(by)).alias("_d2"),
        (pl.col("idle_s") - pl.col("idle_s").median().over(by)).alias("_d3"),
    ).with_columns(
        (pl.col("busy_s") - pl.col("median_busy_s")).abs().median().over(by).alias("_mad"),
        *((pl.col(d).abs().median().over(by)).alias(f"_mad{d}") for d in _PART_DEVIATIONS),
    )
    score = pl.when(pl.col("busy_s") > 0).then(pl.col("median_busy_s") / pl.col("busy_s")).otherwise(1.0)
    z = pl.when(pl.col("_mad") > 0).then((pl.col("busy_s") - pl.col("median_busy_s")) / (_MAD_TO_SIGMA * pl.col("_mad"))).otherwise(0.0)
    # the largest modified z-score among the C³ parts (a part whose MAD is 0 scores 0, as the busy time's does)
    part_z = pl.max_horizontal(*(pl.when(pl.col(f"_mad{d}") > 0).then(pl.col(d) / (_MAD_TO_SIGMA * pl.col(f"_mad{d}"))).otherwise(0.0)
                                 for d in _PART_DEVIATIONS))
    slower = pl.col("busy_s") >= (1 + min_excess_ratio) * pl.col("median_busy_s")
    df = df.with_columns(score.alias("relative_score"), z.alias("robust_z"), part_z.alias("_part_z")).with_columns(
        ((pl.col("relative_score") < rel_threshold)
         | (((pl.col("robust_z") > z_threshold) | (pl.col("_part_z") > z_threshold)) & slower))
        .alias("flagged")
    )
    # the part of the excess that dominates says what kind of straggler it is
    best = pl.max_horizontal("_d1", "_d2", "_d3")
    attribution = (
        pl.when(~pl.col("flagged")).then(pl.lit(None, pl.String))
        .when(pl.col("_d1") == best).then(pl.lit("compute_slow"))
        .when(pl.col("_d2") == best).then(pl.lit("communication_slow"))
        .otherwise(pl.lit("host_bound"))
    )
    df = df.with_columns(
        attribution.alias("attribution"),
        (pl.col("busy_s") - pl.col("median_busy_s")).clip(lower_bound=0.0).alias("excess_s"),
    ).with_columns(
        pl.when(pl.col("flagged")).then(pl.col("excess_s") * pl.col("ranks")).otherwise(0.0).alias("gpu_s_lost"),
    ).sort("job_id", "rank", "step")
    df = df.with_columns(
        pl.col("flagged").cast(pl.Int64).rolling_sum(persist_m, min_samples=1).over("job_id", "rank").alias("flagged_recent"),
    ).with_columns((pl.col("flagged_recent") >= persist_k).alias("persistent"))
    return df.select(
        "job_id", "rank", "step", "start", "end", "step_s", "busy_s", "wait_s", "idle_s", "c1_compute_s", "c2_comm_s",
        "median_busy_s", "relative_score", "robust_z", "flagged", "flagged_recent", "persistent", "attribution",
        "excess_s", "ranks", "gpu_s_lost",
    )


def _severity(score: float) -> str:
    # half speed or worse takes the whole job to half speed: page someone
    return "critical" if score < 0.5 else "warning"


def straggler_findings(detections: pl.DataFrame) -> pl.DataFrame:
    """One ``finding`` per (job, rank) that was a persistent straggler in the detections' window.

    ``score``: the rank's median relative score over its flagged steps; ``severity``: critical below 0.5,
    else warning; ``evidence``: flagged steps, the attribution counts and the dominant one, mean parts'
    excess, and ``gpu_hours_lost`` (Σ excess × ranks / 3600 over its flagged steps).
    Returns a frame with the canonical ``finding`` columns (``fleetscope.core.frames.FINDING``).
    """
    need = ("job_id", "rank", "step", "start", "end", "flagged", "persistent", "relative_score", "attribution", "gpu_s_lost")
    missing = [c for c in need if c not in detections.columns]
    if missing:
        raise ValueError(f"detections lack column(s) {', '.join(missing)} (pass detect_stragglers' output)")
    ranks_hit = detections.filter(pl.col("persistent")).select("job_id", "rank").unique()
    if ranks_hit.height == 0:
        return FINDING.empty()
    flagged = detections.join(ranks_hit, on=["job_id", "rank"]).filter(pl.col("flagged"))
    agg = flagged.group_by("job_id", "rank").agg(
        pl.col("start").min().alias("window_start"),
        pl.col("end").max().alias("window_end"),
        pl.col("relative_score").median().alias("score"),
        pl.col("step").sort().alias("steps"),
        pl.col("attribution").value_counts(sort=True).alias("attr"),
        (pl.col("gpu_s_lost").sum() / 3600.0).alias("gpu_hours_lost"),
        pl.col("excess_s").mean().alias("mean_excess_s"),
        pl.col("median_busy_s").mean().alias("mean_median_busy_s"),
    ).sort("job_id", "rank")
    return findings_of_ranks([
        {**{k: r[k] for k in ("job_id", "rank", "window_start", "window_end", "score", "gpu_hours_lost", "mean_excess_s", "mean_median_busy_s")},
         "steps": r["steps"][:EVIDENCE_STEPS], "step_count": len(r["steps"]),
         "attribution_counts": {d["attribution"]: int(d["count"]) for d in r["attr"]}}
        for r in agg.iter_rows(named=True)
    ])


EVIDENCE_STEPS = 1000
"""A finding's evidence lists at most this many of the rank's flagged steps (the first ones), and their count."""


def findings_of_ranks(ranks: list[dict]) -> pl.DataFrame:
    """The findings of :func:`straggler_findings` from each persistent rank's figures over its flagged steps:
    ``job_id, rank, window_start, window_end, score`` (median relative score), ``steps`` (the first
    :data:`EVIDENCE_STEPS`, in order), ``step_count``, ``attribution_counts``, ``gpu_hours_lost``,
    ``mean_excess_s``, ``mean_median_busy_s`` (an incremental analysis keeps these per rank)."""
    rows = []
    for r in sorted(ranks, key=lambda x: (x["job_id"], x["rank"])):
        counts = r["attribution_counts"]
        dominant = max(_ATTRIBUTIONS, key=lambda a: counts.get(a, 0))
        score = float(r["score"])
        evidence = {
            "flagged_steps": list(r["steps"]), "flagged_step_count": r["step_count"],
            "attribution": dominant, "attribution_counts": counts,
            "median_relative_score": round(score, 6), "mean_excess_s": r["mean_excess_s"],
            "mean_median_busy_s": r["mean_median_busy_s"], "gpu_hours_lost": r["gpu_hours_lost"],
            "rel_threshold": REL_THRESHOLD,
        }
        what = {"compute_slow": "slow compute", "communication_slow": "slow communication", "host_bound": "host stalls"}[dominant]
        rows.append({
            "analyzer": ANALYZER, "kind": f"straggler_{dominant}", "subject": f"job:{r['job_id']}/rank:{r['rank']}",
            "window_start": r["window_start"], "window_end": r["window_end"], "severity": _severity(score), "score": score,
            "summary": (f"Rank {r['rank']} of job {r['job_id']} ran at {score:.0%} of the median rank's pace in "
                        f"{r['step_count']} steps, mostly from {what}, costing {r['gpu_hours_lost']:.3g} GPU-hours."),
            "evidence": json.dumps(evidence, sort_keys=True),
        })
    return pl.DataFrame(rows, schema=FINDING.schema)


@dataclass(frozen=True)
class EnergyPrice:
    """What one GPU-hour of a job costs: the job's mean power per GPU and where that figure came from; the
    location-based grid intensity and its basis; the site's PUE (None: price IT energy only)."""

    power_w: float
    power_basis: str
    g_per_kwh: float | None = None
    intensity_basis: str = ""
    pue: float | None = None
    pue_basis: str = ""

    def __post_init__(self) -> None:
        for name in ("power_w", "g_per_kwh", "pue"):
            v = getattr(self, name)
            if v is not None and not (math.isfinite(v) and v >= 0):
                raise ValueError(f"{name} must be a finite number >= 0, got {v!r}")
        if self.pue is not None and self.pue < 1.0:
            raise ValueError(f"pue must be >= 1 (ISO/IEC 30134-2: facility energy includes IT energy), got {self.pue!r}")


def price_findings(findings: pl.DataFrame, price: EnergyPrice) -> pl.DataFrame:
    """Add the energy and emissions cost to every finding whose evidence carries ``gpu_hours_lost``.

    IT energy lost = GPU-hours × mean power per GPU; facility energy = IT × PUE where a PUE is known
    (ISO/IEC 30134-2 defines PUE as facility over IT energy); kgCO2e = the facility energy (else the IT
    energy) × grid intensity (location-based, GHG Protocol Scope 2). The mean power is the job's, so a
    waiting GPU is priced at the job's average draw. Evidence gains ``energy_kwh_lost``,
    ``facility_kwh_lost``, ``kgco2e_lost`` and a ``cost_basis``; the summary gains the kWh and kgCO2e.
    Other findings pass through unchanged.
    """
    if findings.height == 0:
        return findings
    evidence, summary = [], []
    for ev_json, text in zip(findings["evidence"].to_list(), findings["summary"].to_list()):
        ev = json.loads(ev_json) if ev_json else {}
        hours = ev.get("gpu_hours_lost")
        if not isinstance(hours, (int, float)) or not math.isfinite(hours):
            evidence.append(ev_json)
            summary.append(text)
            continue
        it_kwh = hours * price.power_w / 1000.0
        fac_kwh = it_kwh * price.pue if price.pue is not None else None
        kg = (fac_kwh if fac_kwh is not None else it_kwh) * price.g_per_kwh / 1000.0 if price.g_per_kwh is not None else None
        ev.update({
            "energy_kwh_lost": it_kwh, "facility_kwh_lost": fac_kwh, "kgco2e_lost": kg,
            "cost_basis": {"power_w": price.power_w, "power": price.power_basis, "g_per_kwh": price.g_per_kwh,
                           "intensity": price.intensity_basis, "pue": price.pue, "pue_basis": price.pue_basis},
        })
        energy_txt = f"{fac_kwh:.3g} kWh at the facility" if fac_kwh is not None else f"{it_kwh:.3g} kWh of GPU energy"
        carbon_txt = f" and {kg:.3g} kgCO2e" if kg is not None else ""
        evidence.append(json.dumps(ev, sort_keys=True))
        summary.append(f"{text.rstrip('.')} (≈{energy_txt}{carbon_txt}).")
    return findings.with_columns(pl.Series("evidence", evidence, dtype=pl.String), pl.Series("summary", summary, dtype=pl.String))


# --- what-if analysis -----------------------------------------------------------------------------

# Collectives and the group of workers each one synchronises (Megatron-LM with a distributed optimizer,
# the setting of the ByteDance traces): the data-parallel replicas of one stage gather parameters and
# reduce-scatter gradients; the first and last stage of one replica all-reduce the tied embedding's
# gradient; the gradient-norm all-reduce of clipping spans every worker. Other ops run locally.
_DP_GROUP_OPS = ("params-all-gather", "grads-reduce-scatter")
_EMBEDDING_OPS = ("embedding-grads-all-reduce",)
_GLOBAL_OPS = ("optimizer-clip-main-grad",)
_P2P_LATENCY_QUANTILE = 0.05
_COMM_OPTYPES = _DP_GROUP_OPS + _EMBEDDING_OPS + _GLOBAL_OPS + ("layernorm-grads-all-reduce",)


def _typical_expr(typical: str) -> pl.Expr:
    """An operation type's typical duration. "artifact": the mean for compute and local ops, the median
    for communication, as the artifact builds its ideal timeline (``analysis_util.py``,
    ``simulation_analysis_reduce_dim_v4``): a collective's transfer has rare, long outliers (a retried
    link, a congested switch) that a mean would spread over every member, while compute varies around
    its mean."""
    d = pl.col("duration_s")
    if typical == "median":
        return d.median()
    if typical == "mean":
        return d.mean()
    comm = pl.col("optype").is_in(_COMM_OPTYPES) | _is_p2p(pl.col("optype"))
    return pl.when(comm).then(d.median()).otherwise(d.mean())


def _is_p2p(optype: pl.Expr) -> pl.Expr:
    return optype.str.contains("send") | optype.str.contains("recv")


@dataclass
class _Graph:
    nodes: pl.DataFrame  # node, dp_rank, stage, rank, optype, seq_id, mb_id, gmc, group
    order: list[list[int]]  # units (a collective group or a single op) in topological order
    deps: list[list[tuple[int, float]]]  # per node: (node it waits for, latency s)


def _build_graph(ref: pl.DataFrame, p2p_fwd_s: float, p2p_bwd_s: float) -> _Graph:
    """Dependency model from one step's ops (no p2p ops): each worker runs its ops in recorded order; a
    forward micro-batch on model chunk g waits for the same micro-batch on chunk g−1 (plus the p2p
    latency), a backward one for chunk g+1; a collective starts when its last member is ready."""
    last_gmc = int(ref["gmc"].max())
    nodes = ref.sort("dp_rank", "stage", "start_s", "seq_id").with_row_index("node").with_columns(
        pl.when(pl.col("optype").is_in(_DP_GROUP_OPS))
        .then(pl.format("dp|{}|{}|{}", "stage", "optype", "seq_id"))
        .when(pl.col("optype").is_in(_EMBEDDING_OPS))
        .then(pl.format("emb|{}|{}|{}", "dp_rank", "optype", "seq_id"))
        .when(pl.col("optype").is_in(_GLOBAL_OPS))
        .then(pl.format("all|{}|{}", "optype", "seq_id"))
        .otherwise(pl.lit(None, pl.String)).alias("group")
    )
    n = nodes.height
    deps: list[list[tuple[int, float]]] = [[] for _ in range(n)]
    dp, stage, optype = nodes["dp_rank"].to_list(), nodes["stage"].to_list(), nodes["optype"].to_list()
    mb, gmc = nodes["mb_id"].to_list(), nodes["gmc"].to_list()
    where = {(dp[i], gmc[i], optype[i], mb[i]): i for i in range(n) if mb[i] >= 0}
    for i in range(1, n):
        if dp[i] == dp[i - 1] and stage[i] == stage[i - 1]:
            deps[i].append((i - 1, 0.0))
    for i in range(n):
        if mb[i] < 0:
            continue
        if optype[i] == "forward-compute" and gmc[i] > 0:
            j = where.get((dp[i], gmc[i] - 1, optype[i], mb[i]))
            if j is not None:
                deps[i].append((j, p2p_fwd_s))
        elif optype[i] == "backward-compute" and gmc[i] < last_gmc:
            j = where.get((dp[i], gmc[i] + 1, optype[i], mb[i]))
            if j is not None:
                deps[i].append((j, p2p_bwd_s))
    # units: a collective's members move together
    unit_of = list(range(n))
    members: dict[int, list[int]] = {}
    groups: dict[str, int] = {}
    for i, g in enumerate(nodes["group"].to_list()):
        if g is None:
            members[i] = [i]
        else:
            u = groups.setdefault(g, i)
            unit_of[i] = u
            members.setdefault(u, []).append(i)
    indeg = {u: 0 for u in members}
    out: dict[int, set[int]] = {u: set() for u in members}
    for u, ms in members.items():
        srcs = {unit_of[j] for m in ms for j, _ in deps[m]} - {u}
        indeg[u] = len(srcs)
        for s in srcs:
            out[s].add(u)
    ready = sorted(u for u, d in indeg.items() if d == 0)
    order: list[list[int]] = []
    while ready:
        u = ready.pop()
        order.append(members[u])
        for v in out[u]:
            indeg[v] -= 1
            if indeg[v] == 0:
                ready.append(v)
    if len(order) != len(members):
        raise ValueError("the operations' dependencies form a cycle: the trace's op order contradicts its collectives")
    return _Graph(nodes=nodes, order=order, deps=deps)


def _simulate(g: _Graph, dur: np.ndarray) -> np.ndarray:
    """Replay with durations ``dur`` [node, column]; return each column's step time (all workers start at
    0; the step ends when the last operation does). Columns are independent steps × scenarios, so one
    pass evaluates every scenario at once."""
    end = np.zeros_like(dur)
    zero = np.zeros(dur.shape[1])
    for unit in g.order:
        starts = []
        for m in unit:
            r = zero
            for j, lat in g.deps[m]:
                r = np.maximum(r, end[j] + lat)
            starts.append(r)
        s = starts[0] if len(starts) == 1 else np.max(starts, axis=0)
        for m in unit:
            end[m] = s + dur[m]
    return end.max(axis=0)


@dataclass(frozen=True)
class WhatIfResult:
    """Outcome of :func:`whatif`. Times in seconds per step (means over the analysed steps).

    ``slowdown`` S = ΣT(actual) / ΣT(ideal) over steps, both replayed; ``measured_step_s`` is the traces'
    own mean step time (the replay's error is ``simulated_step_s`` − it). ``by_dp_rank`` / ``by_stage``:
    ``slowdown_only`` (S with only that group at measured durations) and, for stages, ``recovered_share``
    (how much of T(actual) − T(ideal) disappears when that stage runs at typical durations).
    ``by_worker``: every worker's score min(S_dp, S_stage) and, for the ``top_workers`` fixed together,
    ``m_w`` = the share recovered by fixing them. ``verdict``: ``slow_worker``, ``slow_stage``, ``spread``
    or ``no_slowdown``; ``culprits``: the workers ("dp<d>/stage<s>/rank<r>") or stages ("stage<s>") named.
    ``gpu_hours_lost`` = Σ(T(actual) − T(ideal)) × world_size / 3600 over the analysed steps.
    """

    slowdown: float
    measured_step_s: float
    simulated_step_s: float
    ideal_step_s: float
    per_step: pl.DataFrame
    by_dp_rank: pl.DataFrame
    by_stage: pl.DataFrame
    by_worker: pl.DataFrame
    top_workers: list[str]
    m_w: float
    m_s: float
    verdict: str
    culprits: list[str]
    world_size: int
    steps_analysed: int
    steps_dropped: int
    gpu_hours_lost: float


def whatif(
    ops: pl.DataFrame,
    meta: dict | None = None,
    *,
    typical: str = "artifact",
    min_slowdown: float = 1.03,
    worker_share: float = 0.5,
    stage_share: float = 0.8,
    top_fraction: float = 0.03,
) -> WhatIfResult:
    """What-if straggler analysis of one job's operations (``ingest.bytedance_whatif`` frame: ``dp_rank,
    stage, rank, step, optype, start_s, duration_s, seq_id, mb_id, gmc``).

    Durations replayed: compute and local ops their own; collectives their transfer, the shortest
    member's duration in that step (:func:`analyzers.c3.collective_wait`: the last to arrive does not
    wait), so waiting emerges from the replay instead of being counted twice. Pipeline send/recv are
    not replayed as ops: a micro-batch crossing stages pays the p2p latency, the 5th percentile of the
    recorded send/recv durations per direction (most of them include waiting; the fastest are the
    transfer). Typical duration of an op: one figure per operation type over every worker, stage, step
    and micro-batch (the artifact reduces over data-parallel rank, stage and step alike); with
    ``typical="artifact"`` (the default) the mean for compute and local ops and the median for
    communication, the artifact's definition of the ideal timeline, so S, M_W and M_S are comparable to
    its published figures; "median" or "mean" use one statistic for every type.

    Verdict, in order: S < ``min_slowdown`` (the artifact's 1.03 threshold) → no_slowdown; fixing the
    top ``top_fraction`` of workers (at least one) recovers ≥ ``worker_share`` → slow_worker; fixing one
    stage recovers ≥ ``stage_share`` → slow_stage; otherwise → spread (the slowdown is spread across
    workers: sequence-length imbalance, noise, many small stragglers).

    ``meta`` (the trace's sizes) supplies ``world_size`` for the GPU-hour cost (tensor-parallel ranks
    are not in the traces); default: the workers seen.
    """
    need = ("dp_rank", "stage", "rank", "step", "optype", "start_s", "duration_s", "seq_id", "mb_id", "gmc")
    missing = [c for c in need if c not in ops.columns]
    if missing:
        raise ValueError(f"ops frame lacks column(s) {', '.join(missing)}")
    if ops.height == 0:
        raise ValueError("ops frame is empty")
    if typical not in ("artifact", "median", "mean"):
        raise ValueError("typical must be 'artifact', 'median' or 'mean'")
    bad = ops.filter(pl.col("duration_s").is_null() | pl.col("duration_s").is_nan() | (pl.col("duration_s") < 0))
    if bad.height:
        raise ValueError(f"duration_s must be finite and ≥ 0 (got {bad['duration_s'][0]!r} for {bad['optype'][0]})")
    ops = ops.with_columns(pl.col("optype").cast(pl.String))
    p2p = ops.filter(_is_p2p(pl.col("optype")))
    lat = {}
    for d in ("forward", "backward"):
        x = p2p.filter(pl.col("optype").str.starts_with(d))["duration_s"]
        lat[d] = float(x.quantile(_P2P_LATENCY_QUANTILE)) if x.len() else 0.0
    work = ops.filter(~_is_p2p(pl.col("optype")))
    key = ["dp_rank", "stage", "optype", "seq_id"]
    # keep the steps that ran the same operations as the first one: the replay needs one graph
    ref_step = int(work["step"].min())
    ref = work.filter(pl.col("step") == ref_step)
    if ref.select(key).is_duplicated().any():
        raise ValueError("an operation (dp_rank, stage, optype, seq_id) appears twice in one step")
    sig = ref.select(key).sort(key)
    steps_all = work["step"].unique().sort().to_list()
    keep = [s for s in steps_all if work.filter(pl.col("step") == s).select(key).sort(key).equals(sig)]
    dropped = len(steps_all) - len(keep)
    work = work.filter(pl.col("step").is_in(keep))
    g = _build_graph(ref.select(*key, "rank", "mb_id", "gmc", "start_s"), lat["forward"], lat["backward"])

    # per (node, step): measured duration, and the transfer for collectives
    tagged = work.join(g.nodes.select(*key, "node", "group"), on=key)
    coll = tagged.filter(pl.col("group").is_not_null()).select(
        pl.lit("job").alias("job_id"), pl.col("group").alias("comm_id"), pl.col("step").alias("seq"),
        "node", "duration_s")
    eff = tagged.select("node", "step", "optype", "seq_id", "duration_s")
    if coll.height:
        cw = c3.collective_wait(coll).select("node", pl.col("seq").alias("step"), "transfer_s")
        eff = eff.join(cw, on=["node", "step"], how="left").with_columns(
            pl.coalesce("transfer_s", "duration_s").alias("duration_s")).drop("transfer_s")
    # one typical duration per operation type, over every worker, stage, step and micro-batch alike
    eff = eff.with_columns(_typical_expr(typical).over("optype").alias("typical_s"))
    n, steps = g.nodes.height, sorted(keep)
    col = {s: i for i, s in enumerate(steps)}
    actual = np.zeros((n, len(steps)))
    ideal = np.zeros((n, len(steps)))
    ni, si = eff["node"].to_numpy(), np.array([col[s] for s in eff["step"].to_list()])
    actual[ni, si] = eff["duration_s"].to_numpy()
    ideal[ni, si] = eff["typical_s"].to_numpy()

    nodes = g.nodes
    dps = sorted(nodes["dp_rank"].unique().to_list())
    stages = sorted(nodes["stage"].unique().to_list())
    dp_of, st_of = nodes["dp_rank"].to_numpy(), nodes["stage"].to_numpy()

    def only(mask: np.ndarray) -> np.ndarray:
        return np.where(mask[:, None], actual, ideal)

    def fix(mask: np.ndarray) -> np.ndarray:
        return np.where(mask[:, None], ideal, actual)

    blocks = [actual, ideal] + [only(dp_of == d) for d in dps] + [only(st_of == s) for s in stages] + [fix(st_of == s) for s in stages]
    t = _simulate(g, np.concatenate(blocks, axis=1)).reshape(len(blocks), len(steps))
    t_act, t_ideal = t[0], t[1]
    tot_a, tot_i = float(t_act.sum()), float(t_ideal.sum())
    S = tot_a / tot_i
    gap = tot_a - tot_i
    s_dp = {d: float(t[2 + k].sum()) / tot_i for k, d in enumerate(dps)}
    s_st = {s: float(t[2 + len(dps) + k].sum()) / tot_i for k, s in enumerate(stages)}
    rec_st = {s: ((tot_a - float(t[2 + len(dps) + len(stages) + k].sum())) / gap if gap > 0 else 0.0) for k, s in enumerate(stages)}

    workers = nodes.select("dp_rank", "stage", "rank").unique().sort("dp_rank", "stage").with_columns(
        pl.struct("dp_rank", "stage").map_elements(lambda r: min(s_dp[r["dp_rank"]], s_st[r["stage"]]), return_dtype=pl.Float64).alias("score"))
    workers = workers.sort("score", "rank", descending=[True, False])
    k = max(1, math.ceil(top_fraction * workers.height))
    top = workers.head(k)
    top_mask = np.zeros(n, bool)
    for d, s in zip(top["dp_rank"].to_list(), top["stage"].to_list()):
        top_mask |= (dp_of == d) & (st_of == s)
    t_fix_top = _simulate(g, fix(top_mask))
    m_w = (tot_a - float(t_fix_top.sum())) / gap if gap > 0 else 0.0
    last_stage = max(stages)
    m_s = rec_st[last_stage]

    names = [f"dp{d}/stage{s}/rank{r}" for d, s, r in top.select("dp_rank", "stage", "rank").iter_rows()]
    best_stage = max(stages, key=lambda s: rec_st[s])
    if S < min_slowdown:
        verdict, culprits = "no_slowdown", []
    elif m_w >= worker_share:
        verdict, culprits = "slow_worker", names
    elif rec_st[best_stage] >= stage_share:
        verdict, culprits = "slow_stage", [f"stage{best_stage}"]
    else:
        verdict, culprits = "spread", []

    measured = ops.group_by("step").agg((pl.col("start_s") + pl.col("duration_s")).max().alias("measured_s"))
    per_step = pl.DataFrame({"step": steps, "simulated_s": t_act, "ideal_s": t_ideal}).join(measured, on="step", how="left") \
        .with_columns((pl.col("simulated_s") / pl.col("ideal_s")).alias("slowdown")).select("step", "measured_s", "simulated_s", "ideal_s", "slowdown")
    world = int((meta or {}).get("world_size") or workers.height)
    return WhatIfResult(
        slowdown=S,
        measured_step_s=float(per_step["measured_s"].mean()),
        simulated_step_s=tot_a / len(steps),
        ideal_step_s=tot_i / len(steps),
        per_step=per_step,
        by_dp_rank=pl.DataFrame({"dp_rank": dps, "slowdown_only": [s_dp[d] for d in dps]}).sort("slowdown_only", descending=True),
        by_stage=pl.DataFrame({"stage": stages, "slowdown_only": [s_st[s] for s in stages],
                               "recovered_share": [rec_st[s] for s in stages]}).sort("recovered_share", descending=True),
        by_worker=workers,
        top_workers=names,
        m_w=m_w,
        m_s=m_s,
        verdict=verdict,
        culprits=culprits,
        world_size=world,
        steps_analysed=len(steps),
        steps_dropped=dropped,
        gpu_hours_lost=gap * world / 3600.0,
    )


def whatif_findings(result: WhatIfResult, *, job_id: str, window_start: datetime, window_end: datetime | None = None) -> pl.DataFrame:
    """The what-if verdict as canonical ``finding`` rows: one job-level ``whatif_<verdict>`` finding.

    The traces carry step-relative times only, so the caller gives the window. ``score`` is the slowdown
    S; ``evidence`` holds S, M_W, M_S, the top workers, per-stage shares, the replay error and the cost.
    """
    if window_start is None:
        raise ValueError("window_start is required: a finding is keyed by its window")
    S = result.slowdown
    pct = lambda x: f"{100 * x:.0f}%"  # noqa: E731
    if result.verdict == "slow_worker":
        summary = (f"Job {job_id} runs {S:.2f}x slower than with typical operation times, and worker "
                   f"{', '.join(result.culprits)} explains {pct(result.m_w)} of it ({result.gpu_hours_lost:.3g} GPU-hours lost).")
    elif result.verdict == "slow_stage":
        summary = (f"Job {job_id} runs {S:.2f}x slower than with typical operation times, and pipeline "
                   f"{result.culprits[0].replace('stage', 'stage ')} explains {pct(result.by_stage['recovered_share'][0])} of it "
                   f"({result.gpu_hours_lost:.3g} GPU-hours lost).")
    elif result.verdict == "spread":
        summary = (f"Job {job_id} runs {S:.2f}x slower than with typical operation times, spread across workers: "
                   f"fixing the slowest {len(result.top_workers)} worker(s) recovers only {pct(result.m_w)} "
                   f"({result.gpu_hours_lost:.3g} GPU-hours lost).")
    else:
        summary = f"Job {job_id} runs within {pct(S - 1)} of its typical-operation step time: no straggler slowdown."
    severity = "info" if result.verdict == "no_slowdown" else ("critical" if S >= 1.5 else "warning")
    evidence = {
        "slowdown": S, "m_w": result.m_w, "m_s_last_stage": result.m_s, "verdict": result.verdict,
        "culprits": result.culprits, "top_workers": result.top_workers,
        "stage_recovered_share": dict(zip(map(str, result.by_stage["stage"].to_list()), result.by_stage["recovered_share"].to_list())),
        "dp_rank_slowdown_only": dict(zip(map(str, result.by_dp_rank["dp_rank"].to_list()), result.by_dp_rank["slowdown_only"].to_list())),
        "measured_step_s": result.measured_step_s, "simulated_step_s": result.simulated_step_s, "ideal_step_s": result.ideal_step_s,
        "steps_analysed": result.steps_analysed, "steps_dropped": result.steps_dropped,
        "world_size": result.world_size, "gpu_hours_lost": result.gpu_hours_lost,
    }
    subject = f"job:{job_id}" + (f"/{result.culprits[0]}" if result.verdict == "slow_stage" else "")
    if result.verdict == "slow_worker" and len(result.culprits) == 1:
        subject = f"job:{job_id}/{result.culprits[0]}"
    return pl.DataFrame([{
        "analyzer": ANALYZER, "kind": f"whatif_{result.verdict}", "subject": subject,
        "window_start": window_start, "window_end": window_end, "severity": severity, "score": S,
        "summary": summary, "evidence": json.dumps(evidence, sort_keys=True, default=float),
    }], schema=FINDING.schema).with_columns(pl.col("window_start").cast(UTC_US), pl.col("window_end").cast(UTC_US))

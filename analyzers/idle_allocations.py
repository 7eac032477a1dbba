"""Idle allocations: GPUs a scheduler job or pod holds while they do nothing, for longer than a threshold —
the waste the fleet's owner pays for and no one uses (the "allocated but idle" of FinOps GPU showback; the
reserved-but-idle capacity of Jeon et al., "Analysis of Large-Scale Multi-Tenant GPU Clusters for DNN
Training Workloads", USENIX ATC 2019, §4).

A GPU is idle while its ``util_ratio`` (DCGM_FI_DEV_GPU_UTIL / 100: the share of the sample period a kernel
ran) is at most ``threshold_ratio``; an allocation is idle when every sample of a GPU since some instant is,
for at least ``min_idle_s`` up to its newest sample. One finding per job names its idle GPUs, since when,
the idle GPU-hours so far and, where a GPU-hour price is known, what they cost. The finding's window starts
where the idleness began, so later sweeps update it; when the GPUs work again no finding is written and the
alert resolves.

Pure: frames in, a ``finding`` frame out.
"""

from __future__ import annotations

import datetime as dt
import json

import polars as pl

from fleetscope.core.frames import findings_frame
from fleetscope.core.spec import require_columns

ANALYZER = "idle_allocations"
KIND = "idle_allocation"
THRESHOLD_RATIO = 0.05
MIN_IDLE_S = 1800.0


def idle_gpus(samples: pl.DataFrame, *, threshold_ratio: float = THRESHOLD_RATIO) -> pl.DataFrame:
    """Per GPU whose newest sample is idle: ``idle_since`` (the first idle sample after its last busy one),
    ``last_ts`` and ``idle_s``."""
    require_columns(samples, "gpu_sample", ("ts", "gpu_uuid", "util_ratio"))
    s = samples.filter(pl.col("util_ratio").is_not_null()).sort("gpu_uuid", "ts")
    busy = s.with_columns((pl.col("util_ratio") > threshold_ratio).alias("busy"))
    per = busy.group_by("gpu_uuid").agg(
        pl.col("ts").max().alias("last_ts"),
        pl.col("busy").last().alias("last_busy"),
        pl.col("ts").filter(pl.col("busy")).max().alias("last_busy_ts"),
        pl.col("ts").min().alias("first_ts"))
    idle = per.filter(~pl.col("last_busy"))
    first_idle = (busy.join(idle.select("gpu_uuid", "last_busy_ts"), on="gpu_uuid")
                  .filter(pl.col("last_busy_ts").is_null() | (pl.col("ts") > pl.col("last_busy_ts")))
                  .group_by("gpu_uuid").agg(pl.col("ts").min().alias("idle_since")))
    return (idle.join(first_idle, on="gpu_uuid").with_columns(((pl.col("last_ts") - pl.col("idle_since")).dt.total_microseconds() / 1e6).alias("idle_s"))
            .select("gpu_uuid", "idle_since", "last_ts", "idle_s"))


def idle_findings(job_gpus: pl.DataFrame, samples: pl.DataFrame, *, threshold_ratio: float = THRESHOLD_RATIO, min_idle_s: float = MIN_IDLE_S,
                  prices: dict[tuple[str, str], tuple[float, str]] | None = None) -> pl.DataFrame:
    """One warning per job holding GPUs idle for ``min_idle_s`` or more. ``job_gpus`` has ``cluster``,
    ``job_id``, ``gpu_uuid`` and optionally ``team``, ``account``, ``host``; ``prices`` maps (cluster, job_id)
    to its GPU-hour price and currency."""
    require_columns(job_gpus, "job_gpus", ("cluster", "job_id", "gpu_uuid"))
    # one row per (job, GPU): a caller that joined the GPUs to their samples must not count a GPU once per sample
    job_gpus = job_gpus.unique(["cluster", "job_id", "gpu_uuid"], keep="first", maintain_order=True)
    if not job_gpus.height or not samples.height:
        return findings_frame([])
    idle = idle_gpus(samples, threshold_ratio=threshold_ratio).filter(pl.col("idle_s") >= min_idle_s)
    if not idle.height:
        return findings_frame([])
    x = job_gpus.join(idle, on="gpu_uuid")
    rows = []
    for (cluster, job_id), g in x.group_by(["cluster", "job_id"], maintain_order=True):
        since: dt.datetime = g["idle_since"].min()
        idle_h = float(g["idle_s"].sum()) / 3600
        first = g.row(0, named=True)
        ev = {"gpus_idle": sorted(g["gpu_uuid"].to_list()), "idle_since": since.isoformat(), "idle_gpu_hours": round(idle_h, 4),
              "threshold_ratio": threshold_ratio, "min_idle_s": min_idle_s, "team": first.get("team"), "account": first.get("account"),
              "hosts": sorted({h for h in g["host"].to_list() if h}) if "host" in g.columns else []}
        price = (prices or {}).get((cluster, job_id))
        if price:
            ev["idle_cost"], ev["currency"] = round(idle_h * price[0], 2), price[1]
        name = f"{cluster}/{job_id}" if cluster else job_id
        cost = f", {ev['idle_cost']:.2f} {ev['currency']}" if price else ""
        rows.append({"analyzer": ANALYZER, "kind": KIND, "subject": f"job:{name}", "window_start": since, "window_end": g["last_ts"].max(),
                     "severity": "warning", "score": idle_h,
                     "summary": f"job {name} ({first.get('team') or 'unassigned'}) holds {g.height} GPU(s) idle since {since:%Y-%m-%d %H:%M} UTC: "
                                f"{idle_h:.2f} GPU-hours{cost}",
                     "evidence": json.dumps(ev, default=str)})
    return findings_frame(rows)

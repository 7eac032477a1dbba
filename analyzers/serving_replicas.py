"""A slow replica against its peers: the replicas of one deployment serve the same model on the same kind of
GPU, so one whose latency quantile stands out (a throttled GPU, a noisy neighbour, a bad node) is found by
comparing it with the others rather than with a fixed limit.

For each replica, the ``q``-quantile of ``metric`` over the window (``analyzers.serving_latency.quantiles``
by deployment and replica; by default p50 of the per-request time per output token, falling back to
inter-token latency). A replica is slow when its modified z-score against the deployment's replicas
exceeds ``z_threshold`` (Iglewicz & Hoaglin, "How to Detect and Handle Outliers", ASQC 1993: M = 0.6745 ·
(x − median) / MAD, outlier above 3.5) **and** it is at least ``min_ratio`` times the median, so a tight
fleet's harmless spread is not flagged. A deployment needs ``min_replicas`` with data; when the MAD is 0
(most replicas equal) the ratio alone decides.

Pure: frames in, findings out; the window passed in.
"""

from __future__ import annotations

import datetime as dt
import json
import math

import polars as pl

from analyzers.serving_latency import quantiles
from fleetscope.core.frames import findings_frame

METRICS = ("request_tpot_seconds", "inter_token_latency_seconds")


def slow_replica_findings(buckets: pl.DataFrame, *, start: dt.datetime, end: dt.datetime, metric: str | None = None, q: float = 0.5,
                          z_threshold: float = 3.5, min_ratio: float = 1.5, min_replicas: int = 3) -> pl.DataFrame:
    """``slow_replica`` findings: one per replica whose latency stands out from its deployment's peers."""
    rows = []
    present = set(buckets["metric"].unique()) if buckets.height else set()
    for dep, grp in (buckets.group_by("deployment", maintain_order=True) if buckets.height else []):
        dep = dep[0]
        m = metric or next((x for x in METRICS if x in set(grp["metric"])), None)
        if m is None or m not in present:
            continue
        qs = quantiles(grp.filter(pl.col("metric") == m), (q,), by=("deployment", "replica"), start=start, end=end)
        qs = qs.filter(pl.col("value").is_not_nan() & (pl.col("observations") > 0))
        if qs.height < min_replicas:
            continue
        values = qs["value"].to_list()
        med = float(pl.Series(values).median())
        mad = float(pl.Series([abs(v - med) for v in values]).median())
        for r in qs.iter_rows(named=True):
            ratio = r["value"] / med if med > 0 else math.inf
            z = 0.6745 * (r["value"] - med) / mad if mad > 0 else (math.inf if r["value"] > med else 0.0)
            if z > z_threshold and ratio >= min_ratio:
                rows.append({
                    "analyzer": "serving_replicas", "kind": "slow_replica", "subject": f"deployment:{dep}/replica:{r['replica']}",
                    "window_start": start, "window_end": end, "severity": "warning", "score": float(ratio),
                    "summary": (f"Replica {r['replica']} of {dep}: p{q * 100:g} {m} {r['value'] * 1e3:.1f} ms, {ratio:.1f}x its "
                                f"{qs.height} replicas' median {med * 1e3:.1f} ms."),
                    "evidence": json.dumps({"metric": m, "q": q, "value_s": r["value"], "median_s": med, "mad_s": mad,
                                            "modified_z": None if math.isinf(z) else z, "replicas": qs.height,
                                            "capped": r["capped"]}),
                })
    return findings_frame(rows)

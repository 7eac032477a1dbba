"""Serving reads and the serving window: a deployment's replicas, its latency quantiles over time, its
SLO status with burn rates, its goodput (exact from request logs where it has them, else bounded from
histograms), and the saturation and slow-replica findings of a window.

Every read is bounded by a window and one deployment (the serving tables' ``(deployment, metric, ts, ...)``
key order serves it); the pure analyses live in ``analyzers/serving_latency.py``, ``slo.py``,
``serving_goodput.py``, ``serving_saturation.py`` and ``serving_replicas.py``.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

import polars as pl

from analyzers import serving_goodput, serving_latency, serving_replicas, serving_saturation, slo as slo_analysis
from fleetscope.core import frames as F
from fleetscope.core import serving_frames as SF
from fleetscope.core.errors import NotFound
from fleetscope.core.units import as_utc
from fleetscope.store import Store
from fleetscope.store.reads import fetch

MAX_WINDOW = dt.timedelta(days=31)
MAX_POINTS = 2000


def _cols(spec: F.FrameSpec) -> dict[str, pl.DataType]:
    return spec.schema


def _read(store: Store, spec: F.FrameSpec, deployment: str | None, start: dt.datetime, end: dt.datetime,
          metrics: Sequence[str] | None = None, time_col: str = "ts") -> pl.DataFrame:
    if end <= start:
        raise ValueError("end must be after start")
    if end - start > MAX_WINDOW:
        raise ValueError(f"window longer than {MAX_WINDOW.days} days")
    where, params = [f"{time_col} >= ?", f"{time_col} <= ?"], [as_utc(start), as_utc(end)]
    if deployment is not None:
        where.append("deployment = ?")
        params.append(deployment)
    if metrics:
        where.append(f"metric IN ({', '.join('?' for _ in metrics)})")
        params.extend(metrics)
    schema = _cols(spec)
    sql = f"SELECT {', '.join(chr(34) + c + chr(34) for c in schema)} FROM {spec.name} WHERE {' AND '.join(where)}"
    return fetch(store, sql, params, schema)


def deployments(store: Store) -> pl.DataFrame:
    """Every known replica: ``deployment, replica, server, model, version, namespace, pod, host, last_seen``."""
    df = store.read("serving_replica")
    return df.drop("source").sort("deployment", "replica") if df.height else df.drop("source")


def _require(store: Store, deployment: str) -> None:
    n = store.query("SELECT COUNT(*) AS n FROM serving_replica WHERE deployment = ?", [deployment], {"n": pl.Int64})["n"].item()
    if not n:
        raise NotFound(f"no serving deployment {deployment[:200]!r}")


def quantiles_over_time(store: Store, deployment: str, metric: str, q: float, *, start: dt.datetime, end: dt.datetime,
                        step_s: float = 60.0, window_s: float = 300.0) -> pl.DataFrame:
    """``histogram_quantile(q, sum by (le) (increase(metric[window_s])))`` of one deployment every ``step_s``
    from ``start`` to ``end``: ``ts, value, observations, capped`` (NaN where the window saw no request)."""
    _require(store, deployment)
    if not 0 <= q <= 1:
        raise ValueError("q must be within [0, 1]")
    if step_s <= 0 or window_s <= 0:
        raise ValueError("step_s and window_s must be positive")
    if (end - start).total_seconds() / step_s > MAX_POINTS:
        raise ValueError(f"more than {MAX_POINTS} points: widen step_s")
    b = _read(store, SF.SERVING_BUCKET, deployment, start - dt.timedelta(seconds=window_s), end, [metric])
    out = serving_latency.quantiles_over_time(b, q, window_s=window_s, step_s=step_s, start=start, end=end, by=("deployment",))
    return out.drop("deployment")


def rates(store: Store, deployment: str, *, start: dt.datetime, end: dt.datetime) -> pl.DataFrame:
    """Per counter of the deployment over the window: ``metric, labels, increase, per_s`` (tokens/s,
    requests/s; reset-aware)."""
    _require(store, deployment)
    c = _read(store, SF.SERVING_COUNTER, deployment, start, end)
    return serving_latency.rates(c, start=start, end=end, by=("metric", "labels"))


def slo_status(store: Store, slos: Sequence[slo_analysis.SLO], *, now: dt.datetime) -> list[dict[str, Any]]:
    """Each SLO's SLI, budget left over its window, burn rates and firing rules at ``now``."""
    out = []
    for s in slos:
        _require(store, s.deployment)
        start = now - max(s.window, max(r[1] for r in slo_analysis.BURN_RULES))
        if s.kind == "latency":
            st = slo_analysis.status(s, now=now, buckets=_read(store, SF.SERVING_BUCKET, s.deployment, start, now, [s.metric]))
        else:
            counters = _read(store, SF.SERVING_COUNTER, s.deployment, start, now,
                             ["requests_succeeded_total", "requests_failed_total", "requests_finished_total"])
            st = slo_analysis.status(s, now=now, counters=counters)
        out.append(st.to_dict())
    return out


def goodput(store: Store, deployment: str, *, ttft_slo_s: float, tpot_slo_s: float, start: dt.datetime, end: dt.datetime) -> dict[str, Any]:
    """DistServe goodput of the deployment in the window: ``exact`` from its request log when it has one,
    else ``bounded`` from its histograms; the result's ``method`` says which."""
    _require(store, deployment)
    if ttft_slo_s <= 0 or tpot_slo_s <= 0:
        raise ValueError("the TTFT and TPOT limits must be positive")
    reqs = _read(store, SF.SERVING_REQUEST, deployment, start, end, time_col="finish")
    if reqs.height:
        return serving_goodput.exact(reqs, deployment=deployment, ttft_slo_s=ttft_slo_s, tpot_slo_s=tpot_slo_s, start=start, end=end).to_dict()
    b = _read(store, SF.SERVING_BUCKET, deployment, start, end, ["ttft_seconds", "e2e_latency_seconds", *serving_goodput.PER_REQUEST_TPOT])
    return serving_goodput.bounded(b, deployment=deployment, ttft_slo_s=ttft_slo_s, tpot_slo_s=tpot_slo_s, start=start, end=end).to_dict()


def window_findings(store: Store, *, start: dt.datetime, end: dt.datetime, write: bool = True) -> pl.DataFrame:
    """Saturation (KV cache full with a queue, preemptions climbing) and slow-replica findings of every
    deployment in ``[start, end]``, written to ``finding`` unless ``write`` is false."""
    gauges = _read(store, SF.SERVING_GAUGE, None, start, end, ["kv_cache_usage_ratio", "requests_waiting"])
    counters = _read(store, SF.SERVING_COUNTER, None, start - (end - start), end, ["preemptions_total"])
    buckets = _read(store, SF.SERVING_BUCKET, None, start, end, list(serving_replicas.METRICS))
    found = pl.concat([serving_saturation.saturation_findings(gauges, counters, start=start, end=end),
                       serving_replicas.slow_replica_findings(buckets, start=start, end=end)])
    if write and found.height:
        store.write(F.Batch(source="serving_window", finding=found))
    return found

"""Latency quantiles and rates from serving histograms and counters (the ``serving_bucket`` and
``serving_counter`` frames of ``fleetscope/core/serving_frames.py``), with Prometheus' semantics so a
figure here equals what ``histogram_quantile`` and ``increase`` give on the same data.

``histogram_quantile`` follows Prometheus' ``promql/quantile.go`` (``bucketQuantile``, as of 2.42, the
Debian package the tests run against):

* buckets sorted by upper bound, buckets of one bound coalesced, counts forced monotonic (a smaller count
  after a larger one is raised to it — scrapes of buckets are not atomic);
* NaN when the highest bound is not ``+Inf``, when fewer than two buckets remain, or when there are no
  observations; ``q`` < 0 gives −Inf, ``q`` > 1 +Inf, and NaN gives NaN;
* rank = q · count(+Inf); the answer lies in the first bucket whose cumulative count reaches the rank,
  interpolated linearly inside it, the lowest bucket starting at 0 (if its upper bound is positive; else
  its upper bound is the answer);
* a rank in the ``+Inf`` bucket returns the upper bound of the highest finite bucket: a TTFT histogram
  whose requests mostly took longer than its last bound (SGLang's 30 s) reports 30 s however long they
  took. ``quantiles`` flags such answers as ``capped``.

Counters reset when a server restarts. ``counter_increase`` is Prometheus' reset rule: a sample lower than
the one before starts a new run counted from zero, so the increase adds the new value. ``rates`` divides the
increase by the span between the first and last sample in the window; Prometheus' ``rate`` also extrapolates
to the window's edges, which a stored series with known scrape times does not need.

Pure: frames in, frames out; windows passed in.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Iterable, Sequence

import polars as pl

from fleetscope.core.frames import require_columns

SERIES = ("deployment", "replica", "model", "version", "metric", "labels")


def histogram_quantile(q: float, buckets: Iterable[tuple[float, float]]) -> float:
    """The ``q``-quantile of one histogram given as ``(upper_bound, cumulative_count)`` pairs, as
    Prometheus' ``histogram_quantile`` computes it (see the module docstring)."""
    if math.isnan(q):
        return math.nan
    if q < 0:
        return -math.inf
    if q > 1:
        return math.inf
    bs = sorted(buckets, key=lambda b: b[0])
    if not bs or bs[-1][0] != math.inf:
        return math.nan
    merged: list[list[float]] = []
    for le, c in bs:
        if merged and merged[-1][0] == le:
            merged[-1][1] += c
        else:
            merged.append([le, c])
    top = -math.inf
    for b in merged:
        if b[1] > top:
            top = b[1]
        elif b[1] < top:
            b[1] = top
    if len(merged) < 2:
        return math.nan
    observations = merged[-1][1]
    if observations == 0:
        return math.nan
    rank = q * observations
    b = next((i for i in range(len(merged) - 1) if merged[i][1] >= rank), len(merged) - 1)
    if b == len(merged) - 1:
        return merged[-2][0]
    if b == 0 and merged[0][0] <= 0:
        return merged[0][0]
    start, end, count = 0.0, merged[b][0], merged[b][1]
    if b > 0:
        start = merged[b - 1][0]
        count -= merged[b - 1][1]
        rank -= merged[b - 1][1]
    return start + (end - start) * (rank / count) if count else math.nan


def counter_increase(values: Sequence[float]) -> float:
    """Increase of a counter over its samples in time order, counting a drop as a restart from zero
    (Prometheus' ``increase`` without the extrapolation to the window's edges)."""
    total = 0.0
    for prev, cur in zip(values, values[1:]):
        total += cur - prev if cur >= prev else cur
    return total


def increase_expr(col: str) -> pl.Expr:
    """``counter_increase`` as a polars aggregation over time-sorted rows (per group in ``group_by``)."""
    d = pl.col(col).diff().fill_null(0.0)
    return pl.when(d >= 0).then(d).otherwise(pl.col(col)).sum().cast(pl.Float64)


def _window(df: pl.DataFrame, start: dt.datetime | None, end: dt.datetime | None) -> pl.DataFrame:
    if start is not None:
        df = df.filter(pl.col("ts") >= start)
    if end is not None:
        df = df.filter(pl.col("ts") <= end)
    return df


def bucket_counts(buckets: pl.DataFrame, *, start: dt.datetime | None = None, end: dt.datetime | None = None) -> pl.DataFrame:
    """Per series and bound, the observations in the window: the reset-aware increase of each bucket from
    its first to its last scrape in ``[start, end]``. With neither bound given, the latest scrape's
    cumulative counts (observations since each server started), which is what ``histogram_quantile`` over
    an instant vector reads. Columns: the series key, ``le``, ``observations``."""
    require_columns(buckets, "serving_bucket", ("ts", *SERIES, "le", "cumulative_count"))
    df = _window(buckets, start, end)
    if start is None and end is None:
        latest = df.group_by(SERIES).agg(pl.col("ts").max().alias("_last"))
        return (df.join(latest, on=list(SERIES)).filter(pl.col("ts") == pl.col("_last"))
                .select(*SERIES, "le", pl.col("cumulative_count").alias("observations")))
    return (df.sort("ts").group_by([*SERIES, "le"], maintain_order=True)
            .agg(increase_expr("cumulative_count").alias("observations")))


def quantiles(buckets: pl.DataFrame, qs: Sequence[float] = (0.5, 0.9, 0.99), *, by: Sequence[str] = ("deployment", "metric"),
              start: dt.datetime | None = None, end: dt.datetime | None = None) -> pl.DataFrame:
    """``histogram_quantile(q, sum by (by, le) (increase(bucket[window])))`` for each ``q`` (or over the latest
    scrape's cumulative counts when no window is given). Columns: ``by``, ``q``, ``value`` (in the metric's
    unit; NaN for no data), ``observations`` (the +Inf count), ``capped`` (the rank fell in the +Inf bucket:
    the value is a lower bound, the highest finite bound)."""
    counts = bucket_counts(buckets, start=start, end=end)
    summed = counts.group_by([*by, "le"]).agg(pl.col("observations").sum())
    rows = []
    for key, grp in summed.group_by(list(by), maintain_order=True):
        pairs = [(math.inf if le == "+Inf" else float(le), c) for le, c in zip(grp["le"], grp["observations"])]
        finite = sorted(le for le, _ in pairs if le != math.inf)
        total = sum(c for le, c in pairs if le == math.inf)
        below_top = sum(c for le, c in pairs if finite and le == finite[-1])
        for q in qs:
            value = histogram_quantile(q, pairs)
            capped = bool(finite) and total > 0 and q * total > below_top and value == finite[-1]
            rows.append({**dict(zip(by, key)), "q": float(q), "value": value, "observations": float(total), "capped": capped})
    schema = {**{b: pl.String for b in by}, "q": pl.Float64, "value": pl.Float64, "observations": pl.Float64, "capped": pl.Boolean}
    return pl.DataFrame(rows, schema=schema).sort([*by, "q"])


def quantiles_over_time(buckets: pl.DataFrame, q: float, *, window_s: float, step_s: float, start: dt.datetime, end: dt.datetime,
                        by: Sequence[str] = ("deployment", "metric")) -> pl.DataFrame:
    """``quantiles`` over sliding windows of ``window_s`` ending every ``step_s`` from ``start`` to ``end``
    (a Grafana panel's ``histogram_quantile(q, sum by (le) (rate(x[w])))``). Columns: ``ts`` (window end),
    ``by``, ``value``, ``observations``, ``capped``."""
    if window_s <= 0 or step_s <= 0:
        raise ValueError("window_s and step_s must be positive")
    out = []
    t = start
    while t <= end:
        part = quantiles(buckets, (q,), by=by, start=t - dt.timedelta(seconds=window_s), end=t)
        if part.height:
            out.append(part.drop("q").with_columns(pl.lit(t).cast(pl.Datetime("us", "UTC")).alias("ts")))
        t += dt.timedelta(seconds=step_s)
    if not out:
        return pl.DataFrame(schema={"ts": pl.Datetime("us", "UTC"), **{b: pl.String for b in by}, "value": pl.Float64,
                                    "observations": pl.Float64, "capped": pl.Boolean})
    return pl.concat(out).select("ts", *by, "value", "observations", "capped")


def rates(counters: pl.DataFrame, *, start: dt.datetime, end: dt.datetime, by: Sequence[str] = ("deployment", "metric", "labels")) -> pl.DataFrame:
    """Per ``by``: ``increase`` (reset-aware, summed over the series) and ``per_s`` (each series' increase over
    its own observed span, summed) in ``[start, end]``: tokens/s from ``generation_tokens_total``,
    requests/s from ``requests_*_total``. A series seen once in the window contributes nothing."""
    require_columns(counters, "serving_counter", ("ts", *SERIES, "value"))
    df = _window(counters, start, end).sort("ts")
    per_series = (df.group_by(list(SERIES), maintain_order=True)
                  .agg(increase_expr("value").alias("increase"),
                       ((pl.col("ts").max() - pl.col("ts").min()).dt.total_microseconds() / 1e6).alias("span_s")))
    per_series = per_series.with_columns(
        pl.when(pl.col("span_s") > 0).then(pl.col("increase") / pl.col("span_s")).otherwise(None).alias("per_s"))
    return per_series.group_by(list(by)).agg(pl.col("increase").sum(), pl.col("per_s").sum()).sort(list(by))


def fraction_within(buckets: Iterable[tuple[float, float]], threshold: float) -> tuple[float, float, float]:
    """Of one histogram's observations, how many lie at or under ``threshold``, as the bounds the buckets
    allow: ``(lower, upper, total)`` where ``lower`` is the count at the largest bound ≤ threshold and
    ``upper`` the count at the smallest bound ≥ threshold (equal when the threshold is a bucket bound)."""
    bs = sorted(buckets, key=lambda b: b[0])
    total = next((c for le, c in reversed(bs) if le == math.inf), math.nan)
    lower = max((c for le, c in bs if le <= threshold), default=0.0)
    upper = min((c for le, c in bs if le >= threshold), default=total)
    return lower, upper, total

"""What a scheduler job used of the GPUs it held: the samples taken while it held them, their busy share and
power summed with their weights, per job or per job and hour, and the busy share and energy those sums give.

A job's **busy share** is the mean ``util_ratio`` of its GPUs' samples while it held them (DCGM_FI_DEV_GPU_UTIL,
the share of time a kernel ran); its **energy** is the mean power of those samples × the time held × its GPUs
with power readings (``analyzers.chargeback`` prices both). Over a tier each sample is a bucket's mean,
weighted by the raw samples it summarises, so sums of ``value × weight`` and of weights add across hours and
GPUs: a month is the sum of its hours (``JOB_USAGE_HOUR`` rows, ``services.job_usage``) and of the hours not
rolled yet, and the result does not depend on where the month was cut.

Pure: polars frames in, frames out.
"""

from __future__ import annotations

import datetime as dt

import numpy as np
import polars as pl

from fleetscope.core.tier_frames import JOB_USAGE_HOUR

SUMS = ("util_weighted", "util_samples", "power_weighted", "power_samples")
"""The additive sums a period's busy share and energy come from (see the module's docstring)."""


def held_samples(held: pl.DataFrame, samples: pl.DataFrame) -> pl.DataFrame:
    """Each sample of ``samples`` (ts, gpu_uuid, ...) taken while a row of ``held`` (gpu_uuid, s, e, ...) held its
    GPU (``s <= ts < e``), with that row's columns: the join of the two on the GPU, filtered to the span, without
    forming the pairs that fall outside it. Samples are sorted by (GPU, time) once and each span finds its first
    and last sample by binary search, so the work is the samples that count, not spans × samples per GPU."""
    ids = samples.select(pl.col("gpu_uuid").unique().sort()).with_row_index("_g")
    offset = pl.lit(samples["ts"].min()).cast(pl.Datetime("us", "UTC"))
    span_us = int((samples["ts"].max() - samples["ts"].min()).total_seconds() * 1e6) + 2
    shift = (span_us + 2).bit_length()
    if (ids.height << shift) >= 2**62:  # the (GPU, time) key would overflow: the plain join, filtered
        return held.join(samples, on="gpu_uuid").filter((pl.col("ts") >= pl.col("s")) & (pl.col("ts") < pl.col("e")))

    def key(t: str) -> pl.Expr:
        rel = (pl.col(t) - offset).dt.total_microseconds().clip(-1, span_us)  # before the first sample: -1 sorts first; past the last: span
        return (pl.col("_g").cast(pl.Int64) * (1 << shift) + rel + 1)

    ss = samples.join(ids, on="gpu_uuid").with_columns(key("ts").alias("_k")).sort("_k")
    keys = ss["_k"]
    h = held.join(ids, on="gpu_uuid").with_columns(key("s").alias("_ks"), key("e").alias("_ke"))
    # binary searches in key order walk the sorted samples once instead of jumping about them (several times
    # faster for millions of spans); the positions go back to the spans' own order, so nothing else moves
    order = h["_ks"].arg_sort().to_numpy()
    lo, hi = np.empty(h.height, np.int64), np.empty(h.height, np.int64)
    lo[order] = keys.search_sorted(h["_ks"].gather(order), side="left").to_numpy()
    hi[order] = keys.search_sorted(h["_ke"].gather(order), side="left").to_numpy()
    h = h.with_columns(pl.Series("_lo", lo), pl.Series("_hi", hi))
    h = h.filter(pl.col("_hi") > pl.col("_lo")).with_columns(pl.int_ranges("_lo", "_hi").alias("_row")).explode("_row")
    rows = ss.drop("_k", "_g", "gpu_uuid").with_row_index("_row")
    return h.drop("_g", "_ks", "_ke", "_lo", "_hi").join(rows.with_columns(pl.col("_row").cast(h.schema["_row"])), on="_row").drop("_row")


def held_sums(held: pl.DataFrame, samples: pl.DataFrame, by: list[str]) -> pl.DataFrame:
    """Per group ``by`` (columns of ``held`` or ``samples``): the ``SUMS`` of the samples each row of ``held``
    (gpu_uuid, s, e, ...) held (``samples``: ts, gpu_uuid, util_ratio, power_w and their weight ``_w``), and
    ``power_gpus``, the GPUs with a power reading among them. Groups with no sample are absent."""
    if not (held.height and samples.height):
        types = {**samples.schema, **held.schema}
        return pl.DataFrame(schema={**{c: types[c] for c in by}, **dict.fromkeys(SUMS, pl.Float64), "power_gpus": pl.Int64})
    x = held_samples(held, samples)

    def weighted(c: str) -> tuple[pl.Expr, pl.Expr]:
        w = pl.col("_w").filter(pl.col(c).is_not_null())
        return (pl.col(c) * pl.col("_w")).filter(pl.col(c).is_not_null()).sum(), w.sum()

    uw, us = weighted("util_ratio")
    pw, ps = weighted("power_w")
    return x.group_by(by).agg(uw.cast(pl.Float64).alias("util_weighted"), us.cast(pl.Float64).alias("util_samples"),
                              pw.cast(pl.Float64).alias("power_weighted"), ps.cast(pl.Float64).alias("power_samples"),
                              pl.col("gpu_uuid").filter(pl.col("power_w").is_not_null()).n_unique().cast(pl.Int64).alias("power_gpus"))


def hour_rows(spans: pl.DataFrame, job_gpus: pl.DataFrame, buckets: pl.DataFrame, lo: dt.datetime, hi: dt.datetime) -> pl.DataFrame:
    """``JOB_USAGE_HOUR`` rows for the hours in ``[lo, hi)`` (hour-aligned) each job held GPUs in: ``spans``
    (cluster, job_id, start_at, end_at; a null end is a running job), ``job_gpus`` (cluster, job_id, gpu_uuid),
    ``buckets`` the hour tier's (ts = bucket, gpu_uuid, util_ratio, power_w, _w = its samples). A job's hour
    is every hour from the one it starts in to the one before its end, so a run inside one hour has its hour;
    an hour whose GPUs sent nothing still has its row (zero sums), so a reader can tell a rolled hour without
    telemetry from one not rolled."""
    lo_, hi_ = pl.lit(lo).cast(pl.Datetime("us", "UTC")), pl.lit(hi).cast(pl.Datetime("us", "UTC"))
    s = spans.filter(pl.col("start_at").is_not_null()).select(
        "cluster", "job_id", pl.max_horizontal("start_at", lo_).dt.truncate("1h").alias("s"),
        pl.min_horizontal(pl.col("end_at").fill_null(hi_), hi_).alias("e"))
    s = s.filter(pl.col("e") > pl.col("s")).unique(["cluster", "job_id"], keep="first", maintain_order=True)
    gpus = job_gpus.join(s.select("cluster", "job_id"), on=["cluster", "job_id"]).group_by("cluster", "job_id").len("gpus")
    grid = (s.join(gpus, on=["cluster", "job_id"])
            .with_columns(pl.datetime_ranges("s", "e", "1h", closed="left").alias("bucket")).explode("bucket")
            .select("bucket", "cluster", "job_id", pl.col("gpus").cast(pl.Int64)))
    held = job_gpus.join(s, on=["cluster", "job_id"])
    sums = held_sums(held, buckets, ["cluster", "job_id", "ts"]).rename({"ts": "bucket"})
    out = grid.join(sums, on=["bucket", "cluster", "job_id"], how="left").with_columns(
        [pl.col(c).fill_null(0.0) for c in SUMS] + [pl.col("power_gpus").fill_null(0)])
    return out.select([pl.col(c.name).cast(c.dtype) for c in JOB_USAGE_HOUR.columns])


def combine(parts: list[pl.DataFrame], by: list[str]) -> pl.DataFrame:
    """Sums of several periods (each with ``by``, the ``SUMS`` and ``power_gpus``) added per ``by``; a job's
    GPUs with power are the most any part saw (the same GPUs, hour after hour)."""
    return pl.concat([p.select(*by, *SUMS, "power_gpus") for p in parts], how="vertical_relaxed").group_by(by).agg(
        *[pl.col(c).sum() for c in SUMS], pl.col("power_gpus").max())


def busy_and_energy(sums: pl.DataFrame) -> pl.DataFrame:
    """``busy_ratio`` and ``energy_j`` from ``SUMS`` with ``power_gpus`` and ``held_s`` (seconds each GPU was
    held): the weighted mean util_ratio; the weighted mean power × held time × the GPUs with power. Null where
    no sample carried the field."""
    return sums.with_columns(
        pl.when(pl.col("util_samples") > 0).then(pl.col("util_weighted") / pl.col("util_samples")).otherwise(None).alias("busy_ratio"),
        pl.when(pl.col("power_samples") > 0)
        .then(pl.col("power_weighted") / pl.col("power_samples") * pl.col("held_s") * pl.col("power_gpus")).otherwise(None).alias("energy_j"))

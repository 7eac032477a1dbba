"""Roll-up tiers of GPU telemetry: raw ``gpu_sample`` rows to per-minute summaries, minutes to hours.

The tiers are the usual downsampling of a time-series store (Prometheus/Thanos downsampling keeps
min, max, sum, count and counter per 5 m and 1 h block, thanos.io/tip/components/compact.md#downsampling;
TimescaleDB continuous aggregates keep chosen aggregates per bucket): each GPU field keeps its minimum,
maximum, mean and last value per bucket, so a panel over days or months reads a few rows per GPU and
shows the same extremes the raw data had. Energy is not averaged power: it is the energy roll-up's exact
figure (``analyzers.energy.energy_rollup``: counter deltas, else trapezoid-integrated power), summed.

Rules (both tiers):
- min, max: over the bucket's non-null values (hour: of the minutes' min and max);
- mean: the mean of the bucket's non-null values (hour: the minutes' means weighted by their sample count,
  exact where the field is present in every sample);
- last: the value of the latest sample in the bucket that has one (hour: the latest minute's last);
- samples: rows summarised; gpu_energy_j and energy_covered_s: sums of ``gpu_energy_minute`` over the bucket.

Pure: polars in, polars out; no clock, no database.
"""

from __future__ import annotations

import polars as pl

from fleetscope.core.frames import GPU_FIELDS
from fleetscope.core.tier_frames import GPU_SAMPLE_HOUR, GPU_SAMPLE_MINUTE

_FIELDS = tuple(f.name for f in GPU_FIELDS)


def _energy(energy_minutes: pl.DataFrame | None, every: str) -> pl.DataFrame:
    schema = {"bucket": GPU_SAMPLE_MINUTE.schema["bucket"], "gpu_uuid": pl.String, "gpu_energy_j": pl.Float64, "energy_covered_s": pl.Float64}
    if energy_minutes is None or energy_minutes.height == 0:
        return pl.DataFrame(schema=schema)
    return (energy_minutes.group_by(pl.col("minute").dt.truncate(every).alias("bucket"), "gpu_uuid")
            .agg(pl.col("energy_j").sum().alias("gpu_energy_j"), pl.col("covered_s").sum().alias("energy_covered_s"))
            .select(list(schema)))


def minute_rollup(gpu_sample: pl.DataFrame, energy_minutes: pl.DataFrame | None = None) -> pl.DataFrame:
    """Per GPU per UTC minute, every field of ``gpu_sample`` as min, max, mean, last (the module's rules),
    with the minute's exact energy from ``energy_minutes`` (``gpu_energy_minute`` rows: minute, gpu_uuid,
    energy_j, covered_s). Columns missing from ``gpu_sample`` come out null. Rows of the result follow
    GPU_SAMPLE_MINUTE, sorted by bucket and GPU."""
    spec = GPU_SAMPLE_MINUTE
    if gpu_sample.height == 0:
        return spec.empty()
    present = [f for f in _FIELDS if f in gpu_sample.columns]
    df = gpu_sample.sort("gpu_uuid", "ts").with_columns(pl.col("ts").dt.truncate("1m").alias("bucket"))
    aggs: list[pl.Expr] = [pl.len().cast(pl.Int64).alias("samples")]
    for f in present:
        c = pl.col(f)
        aggs += [c.min().alias(f"{f}_min"), c.max().alias(f"{f}_max"), c.cast(pl.Float64).mean().alias(f"{f}_mean"),
                 c.drop_nulls().last().alias(f"{f}_last")]
    out = df.group_by("bucket", "gpu_uuid").agg(aggs)
    return _finish(out, _energy(energy_minutes, "1m"), spec)


def hour_rollup(minutes: pl.DataFrame) -> pl.DataFrame:
    """Per GPU per UTC hour from minute-tier rows (GPU_SAMPLE_MINUTE): min of mins, max of maxes, means
    weighted by samples, last of the latest minute with a value, samples and energy summed."""
    spec = GPU_SAMPLE_HOUR
    if minutes.height == 0:
        return spec.empty()
    df = minutes.sort("gpu_uuid", "bucket").with_columns(pl.col("bucket").dt.truncate("1h").alias("hour"))
    aggs: list[pl.Expr] = [pl.col("samples").sum().alias("samples"),
                           pl.col("gpu_energy_j").sum().alias("gpu_energy_j") if "gpu_energy_j" in df.columns else pl.lit(None, pl.Float64).alias("gpu_energy_j"),
                           pl.col("energy_covered_s").sum().alias("energy_covered_s")]
    for f in _FIELDS:
        mean, n = pl.col(f"{f}_mean"), pl.col("samples").cast(pl.Float64)
        weight = pl.when(mean.is_not_null()).then(n)
        aggs += [pl.col(f"{f}_min").min().alias(f"{f}_min"), pl.col(f"{f}_max").max().alias(f"{f}_max"),
                 pl.when(weight.sum() > 0).then((mean * n).sum() / weight.sum()).alias(f"{f}_mean"), pl.col(f"{f}_last").drop_nulls().last().alias(f"{f}_last")]
    out = df.group_by("hour", "gpu_uuid").agg(aggs).rename({"hour": "bucket"})
    # a minute with no energy rows has gpu_energy_j null; an hour whose every minute lacks one is null, not 0
    has_energy = df.group_by("hour", "gpu_uuid").agg(pl.col("gpu_energy_j").is_not_null().any().alias("_e")).rename({"hour": "bucket"})
    out = out.join(has_energy, on=["bucket", "gpu_uuid"], how="left").with_columns(
        pl.when(pl.col("_e")).then(pl.col("gpu_energy_j")).alias("gpu_energy_j"),
        pl.when(pl.col("_e")).then(pl.col("energy_covered_s")).alias("energy_covered_s")).drop("_e")
    return out.with_columns([pl.col(c).cast(t) for c, t in spec.schema.items()]).select(list(spec.names)).sort("bucket", "gpu_uuid")


def _finish(out: pl.DataFrame, energy: pl.DataFrame, spec) -> pl.DataFrame:  # type: ignore[no-untyped-def]
    out = out.join(energy, on=["bucket", "gpu_uuid"], how="left")
    missing = [pl.lit(None, t).alias(c) for c, t in spec.schema.items() if c not in out.columns]
    out = out.with_columns(missing) if missing else out
    return out.with_columns([pl.col(c).cast(t) for c, t in spec.schema.items()]).select(list(spec.names)).sort("bucket", "gpu_uuid")

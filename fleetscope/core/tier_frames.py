"""Roll-up tiers of GPU telemetry: every field of ``gpu_sample`` summarised per GPU per UTC minute and per UTC hour.

A tier row keeps, for each GPU field, its minimum, maximum, mean and last value over the bucket
(``<field>_min``, ``<field>_max``, ``<field>_mean``, ``<field>_last``), the number of samples, and the GPU's
energy over the bucket taken exactly from the energy roll-up (``gpu_energy_minute``: counter deltas plus
integrated power, ``analyzers.energy.energy_rollup``), never from averaged power. The minute tier is built
from raw samples, the hour tier from the minute tier (``analyzers.tiers``), so a range of days or months is
read from a few rows per GPU (README "Scale out": tiers and their retention).

Declared in the core floor so the pure roll-up (``analyzers/tiers.py``) and the store share one definition;
registered with the store by ``fleetscope/store/schema.py``. Kept out of ``FRAMES``: never pushed, only
derived.
"""

from __future__ import annotations

import polars as pl

from fleetscope.core.frames import GPU_FIELDS
from fleetscope.core.spec import UTC_US, Col, FrameSpec, _k

AGGREGATES = ("min", "max", "mean", "last")
TIERS = ("minute", "hour")
BUCKET_S = {"minute": 60, "hour": 3600}


def _agg_cols() -> tuple[Col, ...]:
    cols = []
    for f in GPU_FIELDS:
        for agg in AGGREGATES:
            dtype = pl.Float64 if agg == "mean" else f.dtype
            cols.append(Col(f"{f.name}_{agg}", dtype, doc=f"{agg} of {f.name} over the bucket"))
    return tuple(cols)


AGG_COLUMNS: tuple[Col, ...] = _agg_cols()


def _spec(tier: str) -> FrameSpec:
    return FrameSpec(
        f"gpu_sample_{tier}",
        (
            _k("bucket", UTC_US, doc=f"start of the UTC {tier}"),
            _k("gpu_uuid", pl.String),
            Col("samples", pl.Int64, nullable=False, doc="raw samples the bucket summarises"),
            Col("gpu_energy_j", pl.Float64, doc="energy the GPU used in the bucket, exactly as gpu_energy_minute has it (sum of its minutes)"),
            Col("energy_covered_s", pl.Float64, doc="seconds of the bucket with energy data (gpu_energy_minute.covered_s summed)"),
            *AGG_COLUMNS,
        ),
        on_conflict="update",
        doc=f"Per-{tier} per-GPU roll-up of every gpu_sample field (min, max, mean, last; energy exact).",
    )


GPU_SAMPLE_MINUTE = _spec("minute")
GPU_SAMPLE_HOUR = _spec("hour")
TIER_FRAMES: dict[str, FrameSpec] = {s.name: s for s in (GPU_SAMPLE_MINUTE, GPU_SAMPLE_HOUR)}
TIER_SPEC = {"minute": GPU_SAMPLE_MINUTE, "hour": GPU_SAMPLE_HOUR}


JOB_USAGE_HOUR = FrameSpec(
    "job_usage_hour",
    (
        _k("bucket", UTC_US, doc="start of the UTC hour"),
        _k("cluster", pl.String),
        _k("job_id", pl.String),
        Col("gpus", pl.Int64, nullable=False, doc="GPUs telemetry names for the job when the hour was rolled"),
        Col("util_weighted", pl.Float64, nullable=False, doc="sum over its GPUs of the hour's mean util_ratio x its samples"),
        Col("util_samples", pl.Float64, nullable=False, doc="samples under util_weighted (those with a util_ratio)"),
        Col("power_weighted", pl.Float64, nullable=False, doc="sum over its GPUs of the hour's mean power_w x its samples"),
        Col("power_samples", pl.Float64, nullable=False, doc="samples under power_weighted (those with a power_w)"),
        Col("power_gpus", pl.Int64, nullable=False, doc="GPUs of the job with a power reading in the hour"),
    ),
    on_conflict="update",
    doc=("Per scheduler job and UTC hour it held GPUs in, its GPUs' hour-tier utilisation and power summed with their "
         "sample weights: a month of team costs reads a row per job-hour, not every GPU's hours (services/job_usage.py)."),
)
"""Rolled from the hour tier by ``services.job_usage``; kept out of ``FRAMES`` and ``TIER_FRAMES``: never pushed."""

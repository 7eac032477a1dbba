"""GPU and facility energy: counters and power integration, per-minute roll-ups, job attribution,
PUE / WUE, energy productivity and the serving-versus-training crossover.

Method (issue 6):

- **GPU energy** comes from the cumulative energy counter (``gpu_sample.energy_j``,
  DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION) where it is present, because a counter keeps integrating between
  scrapes: a missed scrape loses no energy. The difference of two consecutive counter readings is the
  energy of that interval. A reading lower than the one before (driver reload, GPU reset, reboot) or a step
  implying more than ``max_power_w`` starts a new segment: that interval is not taken from the counter
  (the counter's value after a reset does not say when the reset happened).
- **Power integration** (trapezoid rule over ``power_w``) fills whatever the counter does not cover: GPUs
  without a counter and the intervals across a counter reset. An interval between two power samples longer
  than ``max_power_gap_s`` is *not* bridged — power between them is unknown — and is reported as uncovered
  time. Counter intervals are bridged up to ``max_counter_gap_s`` (the counter is exact across a gap; the
  limit only bounds how far the energy is spread uniformly over minutes it cannot resolve).
- A GPU with neither usable counter nor power is **flagged** (status ``no_energy_data``/``no_data``) with
  a null energy, never reported as zero. Every figure carries its ``method``: ``counter``,
  ``power_integration`` or ``counter+power_integration`` when both contributed.

The stored form is the **per-minute per-GPU roll-up** (:data:`ENERGY_MINUTE_SCHEMA`), one row per GPU per
UTC minute that has any covered time: a day of a 16,384-GPU fleet at 1 Hz is 1.4 G raw samples but 23.6 M
roll-up rows, and every other figure here is computed from roll-ups, never from raw telemetry.

Attribution to jobs uses ``job_rank`` (which rank ran on which GPU when) at minute resolution: a rank that
held a GPU for part of a minute gets that fraction of the minute's energy (power assumed even within the
minute). Energy of a GPU-minute not held by any rank is **idle** energy (``job_id`` null).

PUE follows ISO/IEC 30134-2: PUE = total facility energy / IT equipment energy over the same window,
labelled with its measurement category by where IT energy is metered (category 1: UPS output; 2: PDU
output; 3: IT equipment input). The standard reports PUE over a year; shorter windows are marked
``interim``. A site without a facility meter uses its declared PUE (``site.declared_pue``) and every
figure derived from it is marked ``estimate``. WUE follows ISO/IEC 30134-9: site water (L) / IT energy
(kWh).

Energy productivity ρ = useful FLOPs / J (the textbook's energy law, docs/ARCHITECTURE.md): useful FLOPs are the model
FLOPs of the steps that count (a step re-run after a restart counts once), J is GPU energy including idle
for the fleet figure.

Pure: polars and numpy over canonical frames (``fleetscope.core.frames``); nothing here reads the clock, a file
or the database.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

import polars as pl

from fleetscope.core.errors import ValidationError
from fleetscope.core.frames import UTC_US

__all__ = [
    "ENERGY_MINUTE_SCHEMA",
    "ATTRIBUTED_SCHEMA",
    "METHOD_COUNTER",
    "METHOD_POWER",
    "METHOD_BOTH",
    "FACILITY_ENERGY",
    "FACILITY_POWER",
    "IT_ENERGY",
    "IT_POWER",
    "WATER",
    "EnergyRollup",
    "energy_rollup",
    "gpu_energy",
    "attribute_to_jobs",
    "energy_summary",
    "energy_productivity",
    "fleet_energy_productivity",
    "PueResult",
    "pue",
    "apply_pue",
    "wue",
    "serving_vs_training",
    "energy_from_chip_hours",
    "J_PER_KWH",
]

J_PER_KWH = 3.6e6
_US = 1_000_000  # microseconds per second
_MINUTE_US = 60 * _US

METHOD_COUNTER = "counter"
METHOD_POWER = "power_integration"
METHOD_BOTH = "counter+power_integration"

# The roll-up the store keeps (table ``gpu_energy_minute``, natural key (minute, gpu_uuid)).
ENERGY_MINUTE_SCHEMA: dict[str, pl.DataType] = {
    "minute": UTC_US,  # start of the UTC minute
    "gpu_uuid": pl.String,
    "energy_j": pl.Float64,  # counter_energy_j + integrated_energy_j
    "counter_energy_j": pl.Float64,  # part taken from the cumulative counter
    "integrated_energy_j": pl.Float64,  # part from trapezoid integration of power_w
    "covered_s": pl.Float64,  # seconds of the minute with energy data (60 − covered_s is uncovered)
    "method": pl.String,  # counter | power_integration | counter+power_integration
}

# GPU-minute energy split between the ranks that held the GPU and idle (job_id null).
ATTRIBUTED_SCHEMA: dict[str, pl.DataType] = {
    "minute": UTC_US,
    "gpu_uuid": pl.String,
    "job_id": pl.String,
    "rank": pl.Int64,
    "energy_j": pl.Float64,
    "counter_energy_j": pl.Float64,
    "integrated_energy_j": pl.Float64,
    "covered_s": pl.Float64,
    "allocated_s": pl.Float64,  # GPU-seconds of the minute this row stands for
}

# Facility meter series in metric_sample (labels: site, and for IT meters point=ups|pdu|it).
FACILITY_ENERGY = "facility_energy_j"  # cumulative counter, J
FACILITY_POWER = "facility_power_w"
IT_ENERGY = "it_energy_j"
IT_POWER = "it_power_w"
WATER = "facility_water_l"  # cumulative counter, litres

_EVENTS_SCHEMA = {"gpu_uuid": pl.String, "ts": UTC_US, "kind": pl.String, "value": pl.Float64}
_GPU_SUMMARY_SCHEMA = {
    "gpu_uuid": pl.String,
    "samples": pl.UInt32,
    "energy_j": pl.Float64,
    "counter_energy_j": pl.Float64,
    "integrated_energy_j": pl.Float64,
    "covered_s": pl.Float64,
    "uncovered_s": pl.Float64,
    "counter_resets": pl.UInt32,
    "invalid_values": pl.UInt32,
    "method": pl.String,
    "status": pl.String,
}


# --- helpers ---------------------------------------------------------------------------------------


def _method_expr(counter: pl.Expr, integrated: pl.Expr, covered: pl.Expr) -> pl.Expr:
    return (
        pl.when(covered <= 0)
        .then(pl.lit(None, pl.String))
        .when(integrated.abs() == 0)
        .then(pl.lit(METHOD_COUNTER))
        .when(counter.abs() == 0)
        .then(pl.lit(METHOD_POWER))
        .otherwise(pl.lit(METHOD_BOTH))
    )


def _as_us(value: dt.datetime | None) -> int | None:
    if value is None:
        return None
    if value.tzinfo is None:
        raise ValidationError("window bounds must be timezone-aware (UTC)", frame="window")
    return int(pl.Series([value]).dt.convert_time_zone("UTC").dt.cast_time_unit("us").dt.epoch("us")[0])


def _utc_ts(df: pl.DataFrame, frame: str, col: str = "ts") -> pl.Expr:
    """Epoch microseconds of a UTC datetime column; a naive or non-datetime column is refused, because a
    timestamp without a zone would silently shift energy between minutes (and between jobs)."""
    if col not in df.columns:
        raise ValidationError("missing required column", frame=frame, field=col)
    dtype = df.schema[col]
    if not isinstance(dtype, pl.Datetime):
        raise ValidationError(f"expected a UTC timestamp, got {dtype}", frame=frame, field=col)
    if dtype.time_zone is None:
        raise ValidationError("timestamps must carry a time zone (UTC)", frame=frame, field=col)
    return pl.col(col).dt.convert_time_zone("UTC").dt.epoch("us")


def _clean_value(name: str, present: bool) -> pl.Expr:
    """NaN/inf are treated as missing; negative power or counter values are invalid (a sign or unit error
    upstream) and dropped, counted in ``invalid_values`` and reported as events."""
    if not present:
        return pl.lit(None, pl.Float64).alias(name)
    c = pl.col(name).cast(pl.Float64)
    return pl.when(c.is_finite() & (c >= 0)).then(c).otherwise(None).alias(name)


def _invalid_expr(name: str, present: bool) -> pl.Expr:
    if not present:
        return pl.lit(False)
    c = pl.col(name).cast(pl.Float64)
    return c.is_not_null() & (c.is_nan() | c.is_infinite() | (c < 0))


def _pairs(df: pl.DataFrame, key: str, value: str) -> pl.DataFrame:
    """Consecutive readings of ``value`` per ``key`` (df sorted by key, t): columns key, t0, t1, v0, v1."""
    sub = df.filter(pl.col(value).is_not_null()).select(key, "t", value)
    return (
        sub.with_columns(
            pl.col("t").shift(1).alias("t0"),
            pl.col(value).shift(1).alias("v0"),
            (pl.col(key) == pl.col(key).shift(1)).alias("_same"),
        )
        .filter(pl.col("_same"))
        .select(key, "t0", pl.col("t").alias("t1"), "v0", pl.col(value).alias("v1"))
    )


def _intervals(
    df: pl.DataFrame, key: str, *, max_power_gap_s: float, max_counter_gap_s: float, max_power_w: float | None
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Energy intervals and events from readings sorted by (key, t) with columns key, t, power, counter.

    Returns ``intervals`` (key, t0, t1, p0, p1, energy_j, counter: bool) and ``events`` (key, t, kind, value).
    """
    c = _pairs(df, key, "counter").with_columns(
        ((pl.col("t1") - pl.col("t0")) / _US).alias("dt_s"), (pl.col("v1") - pl.col("v0")).alias("de")
    )
    glitch = pl.lit(False) if max_power_w is None else pl.col("de") > max_power_w * pl.col("dt_s")
    c = c.with_columns(
        pl.when(pl.col("de") < 0)
        .then(pl.lit("counter_reset"))
        .when(glitch)
        .then(pl.lit("counter_implausible"))
        .when(pl.col("dt_s") > max_counter_gap_s)
        .then(pl.lit("counter_gap"))
        .otherwise(None)
        .alias("problem")
    )
    good_c = c.filter(pl.col("problem").is_null())
    bad_c = c.filter(pl.col("problem").is_not_null())

    p = _pairs(df, key, "power").with_columns(((pl.col("t1") - pl.col("t0")) / _US).alias("dt_s"))
    long_p = p.filter(pl.col("dt_s") > max_power_gap_s)
    p = p.filter(pl.col("dt_s") <= max_power_gap_s)

    # Power fills only what the counter leaves: keys with no counter, a counter problem, or power readings
    # outside the counter's span. The common case (both read on every scrape, no reset) skips the join.
    if p.height:
        c_span = df.filter(pl.col("counter").is_not_null()).group_by(key).agg(
            pl.col("t").min().alias("c_lo"), pl.col("t").max().alias("c_hi")
        )
        p_span = p.group_by(key).agg(pl.col("t0").min().alias("p_lo"), pl.col("t1").max().alias("p_hi"))
        spans = p_span.join(c_span, on=key, how="left")
        need = spans.filter(
            pl.col("c_lo").is_null() | (pl.col("p_lo") < pl.col("c_lo")) | (pl.col("p_hi") > pl.col("c_hi"))
        ).select(key)
        if bad_c.height:
            need = pl.concat([need, bad_c.select(key)]).unique()
        p = p.join(need, on=key, how="semi")
        if p.height and good_c.height:
            mid = p.with_columns(((pl.col("t0") + pl.col("t1")) // 2).alias("mid")).sort("mid")
            right = good_c.select(key, pl.col("t0").alias("c_t0"), pl.col("t1").alias("c_t1")).sort("c_t0")
            # both sides sorted globally by time, hence within each key
            joined = mid.join_asof(right, left_on="mid", right_on="c_t0", by=key, strategy="backward", check_sortedness=False)
            p = joined.filter(pl.col("c_t1").is_null() | (pl.col("mid") >= pl.col("c_t1"))).drop("mid", "c_t0", "c_t1")

    counter_iv = good_c.select(
        key, "t0", "t1", pl.lit(None, pl.Float64).alias("p0"), pl.lit(None, pl.Float64).alias("p1"),
        pl.col("de").alias("energy_j"), pl.lit(True).alias("counter"),
    )
    power_iv = p.select(
        key, "t0", "t1", pl.col("v0").alias("p0"), pl.col("v1").alias("p1"),
        ((pl.col("v0") + pl.col("v1")) / 2 * pl.col("dt_s")).alias("energy_j"), pl.lit(False).alias("counter"),
    )
    intervals = pl.concat([counter_iv, power_iv])
    events = pl.concat(
        [
            bad_c.select(key, pl.col("t1").alias("t"), pl.col("problem").alias("kind"), pl.col("de").alias("value")),
            long_p.select(key, pl.col("t1").alias("t"), pl.lit("power_gap").alias("kind"), pl.col("dt_s").alias("value")),
        ]
    )
    return intervals, events


def _split_minutes(iv: pl.DataFrame, key: str, lo: int | None, hi: int | None) -> pl.DataFrame:
    """Energy and covered seconds of each interval per UTC minute, clipped to [lo, hi).

    Counter energy is spread evenly over the interval (the counter says nothing finer); power energy is the
    trapezoid of the linearly interpolated power over each piece, so pieces add up to the whole.
    """
    if lo is not None:
        iv = iv.filter(pl.col("t1") > lo)
    if hi is not None:
        iv = iv.filter(pl.col("t0") < hi)
    a0 = pl.col("t0") if lo is None else pl.max_horizontal(pl.col("t0"), pl.lit(lo))
    b0 = pl.col("t1") if hi is None else pl.min_horizontal(pl.col("t1"), pl.lit(hi))
    iv = iv.with_columns(a0.alias("a"), b0.alias("b"))
    iv = iv.with_columns(
        (pl.col("a") // _MINUTE_US).alias("m0"), ((pl.col("b") - 1) // _MINUTE_US).alias("m1")
    )
    single = iv.filter(pl.col("m0") == pl.col("m1")).with_columns(pl.col("m0").alias("m"))
    multi = iv.filter(pl.col("m0") != pl.col("m1"))
    if multi.height:
        multi = (
            multi.with_columns(pl.int_ranges(pl.col("m0"), pl.col("m1") + 1).alias("m"))
            .explode("m")
            .with_columns(
                pl.max_horizontal(pl.col("a"), pl.col("m") * _MINUTE_US).alias("a"),
                pl.min_horizontal(pl.col("b"), (pl.col("m") + 1) * _MINUTE_US).alias("b"),
            )
        )
        pieces = pl.concat([single, multi.select(single.columns)])
    else:
        pieces = single
    span = (pl.col("t1") - pl.col("t0")).cast(pl.Float64)
    frac_a = (pl.col("a") - pl.col("t0")) / span
    frac_b = (pl.col("b") - pl.col("t0")) / span
    pa = pl.col("p0") + (pl.col("p1") - pl.col("p0")) * frac_a
    pb = pl.col("p0") + (pl.col("p1") - pl.col("p0")) * frac_b
    piece_s = (pl.col("b") - pl.col("a")) / _US
    whole = (pl.col("a") == pl.col("t0")) & (pl.col("b") == pl.col("t1"))
    energy = (
        pl.when(whole)
        .then(pl.col("energy_j"))
        .when(pl.col("counter"))
        .then(pl.col("energy_j") * (frac_b - frac_a))
        .otherwise((pa + pb) / 2 * piece_s)
    )
    return pieces.select(
        key, "m", "counter", energy.alias("energy_j"), piece_s.alias("covered_s")
    )


# --- GPU energy and the per-minute roll-up --------------------------------------------------------


@dataclass
class EnergyRollup:
    """What :func:`energy_rollup` returns.

    ``minutes``: the stored roll-up (:data:`ENERGY_MINUTE_SCHEMA`). ``gpus``: one row per GPU seen in the
    samples with its window total, coverage, method and ``status`` (``measured``, ``partial`` or
    ``no_energy_data`` — the last with a null energy, never zero). ``events``: counter resets, implausible
    counter steps, unbridged gaps and invalid values (gpu_uuid, ts, kind, value) for findings.
    """

    minutes: pl.DataFrame
    gpus: pl.DataFrame
    events: pl.DataFrame
    window_start: dt.datetime | None = None
    window_end: dt.datetime | None = None
    params: dict = field(default_factory=dict)


def energy_rollup(
    gpu_sample: pl.DataFrame,
    *,
    window_start: dt.datetime | None = None,
    window_end: dt.datetime | None = None,
    max_power_gap_s: float = 60.0,
    max_counter_gap_s: float = 3600.0,
    max_power_w: float | None = 5000.0,
) -> EnergyRollup:
    """Per-minute per-GPU energy from ``gpu_sample`` (columns ts, gpu_uuid, and power_w and/or energy_j).

    Energy is counted only inside [window_start, window_end) (default: the samples' own span); samples
    outside the window serve as interval endpoints, so an incremental run reads a little before and after
    its window (at least one scrape each side) and every minute of the window comes out complete and
    identical however the data is cut — the roll-up of a window can be rewritten idempotently.

    Policy (module docstring): counter first; a counter going backwards or stepping above ``max_power_w``
    (``None``: no check) starts a new segment; counter intervals bridge up to ``max_counter_gap_s``; power
    is integrated by trapezoid where the counter does not cover, bridging at most ``max_power_gap_s``.
    NaN/inf readings count as missing; negative readings are dropped and reported (``invalid_value``).
    Duplicate (ts, gpu_uuid) rows keep the first. Raises ``ValidationError`` for a missing ts/gpu_uuid
    column, a naive timestamp column, a null ts or gpu_uuid, or window_end <= window_start.
    """
    frame = "gpu_sample"
    ws, we = _as_us(window_start), _as_us(window_end)
    if ws is not None and we is not None and we <= ws:
        raise ValidationError("window_end must be after window_start", frame=frame)
    if "gpu_uuid" not in gpu_sample.columns:
        raise ValidationError("missing required column", frame=frame, field="gpu_uuid")
    ts = _utc_ts(gpu_sample, frame)
    has_p, has_e = "power_w" in gpu_sample.columns, "energy_j" in gpu_sample.columns
    params = dict(max_power_gap_s=max_power_gap_s, max_counter_gap_s=max_counter_gap_s, max_power_w=max_power_w)
    if gpu_sample.height == 0:
        return EnergyRollup(
            pl.DataFrame(schema=ENERGY_MINUTE_SCHEMA), pl.DataFrame(schema=_GPU_SUMMARY_SCHEMA),
            pl.DataFrame(schema=_EVENTS_SCHEMA), window_start, window_end, params,
        )
    for col in ("ts", "gpu_uuid"):
        n_null = gpu_sample.get_column(col).null_count()
        if n_null:
            row = int(gpu_sample.get_column(col).is_null().arg_true()[0])
            raise ValidationError("missing value in a required field", frame=frame, row=row, field=col)

    # Work on a dense integer GPU key: sorting and grouping 10^6 rows by a u32 is several times faster than
    # by a 40-character UUID; the UUIDs come back through a 16k-row lookup at the end.
    lut = gpu_sample.select(pl.col("gpu_uuid").unique(maintain_order=True)).with_row_index("k")
    df = gpu_sample.select(
        pl.col("gpu_uuid"),
        ts.alias("t"),
        _clean_value("power_w", has_p).alias("power"),
        _clean_value("energy_j", has_e).alias("counter"),
        (_invalid_expr("power_w", has_p) | _invalid_expr("energy_j", has_e)).alias("invalid"),
    )
    df = df.join(lut, on="gpu_uuid", how="left").drop("gpu_uuid")
    t_min, t_max = df["t"].min(), df["t"].max()
    if lut.height < 2**23 and t_max - t_min < 2**40:
        # one u64 sort key (gpu in the high bits, µs offset in the low 40) sorts ~4x faster than two columns
        order = pl.col("k").cast(pl.UInt64) * (1 << 40) + (pl.col("t") - t_min).cast(pl.UInt64)
        df = df.sort(order, maintain_order=True)
    else:
        df = df.sort("k", "t", maintain_order=True)
    # duplicate (gpu, ts) rows: keep the first (sorting is stable)
    dup = (pl.col("k") == pl.col("k").shift(1)) & (pl.col("t") == pl.col("t").shift(1))
    df = df.filter(~dup.fill_null(False))
    lo = ws if ws is not None else int(df["t"].min())
    hi = we if we is not None else int(df["t"].max())

    iv, ev = _intervals(df, "k", max_power_gap_s=max_power_gap_s, max_counter_gap_s=max_counter_gap_s, max_power_w=max_power_w)
    ev = ev.join(lut, on="k", how="left").select("gpu_uuid", "t", "kind", "value")
    pieces = _split_minutes(iv, "k", lo, hi)
    minutes = (
        pieces.group_by("m", "k")
        .agg(
            pl.col("energy_j").filter(pl.col("counter")).sum().alias("counter_energy_j"),
            pl.col("energy_j").filter(~pl.col("counter")).sum().alias("integrated_energy_j"),
            pl.col("covered_s").sum(),
        )
        .filter(pl.col("covered_s") > 0)
        .select(
            (pl.col("m") * _MINUTE_US).cast(pl.Datetime("us")).dt.replace_time_zone("UTC").alias("minute"),
            "k",
            (pl.col("counter_energy_j") + pl.col("integrated_energy_j")).alias("energy_j"),
            "counter_energy_j",
            "integrated_energy_j",
            "covered_s",
            _method_expr(pl.col("counter_energy_j"), pl.col("integrated_energy_j"), pl.col("covered_s")).alias("method"),
        )
        .join(lut, on="k", how="left")
        .select(list(ENERGY_MINUTE_SCHEMA))
        .sort("minute", "gpu_uuid")
    )

    invalid_ev = df.filter(pl.col("invalid")).join(lut, on="k", how="left").select(
        "gpu_uuid", "t", pl.lit("invalid_value").alias("kind"), pl.lit(None, pl.Float64).alias("value")
    )
    events = (
        pl.concat([ev, invalid_ev])
        .filter((pl.col("t") >= lo) & (pl.col("t") <= hi))
        .select("gpu_uuid", pl.col("t").cast(pl.Datetime("us")).dt.replace_time_zone("UTC").alias("ts"), "kind", "value")
        .sort("ts", "gpu_uuid")
    )
    window_s = (hi - lo) / _US
    per_gpu = df.group_by("k").agg(
        pl.len().cast(pl.UInt32).alias("samples"), pl.col("invalid").sum().cast(pl.UInt32).alias("invalid_values")
    )
    totals = minutes.group_by("gpu_uuid").agg(
        pl.col("energy_j").sum(), pl.col("counter_energy_j").sum(), pl.col("integrated_energy_j").sum(), pl.col("covered_s").sum()
    )
    resets = events.filter(pl.col("kind") == "counter_reset").group_by("gpu_uuid").agg(pl.len().cast(pl.UInt32).alias("counter_resets"))
    gpus = (
        per_gpu.join(lut, on="k", how="left").join(totals, on="gpu_uuid", how="left")
        .join(resets, on="gpu_uuid", how="left")
        .with_columns(pl.col("covered_s").fill_null(0.0), pl.col("counter_resets").fill_null(0))
        .with_columns(
            (pl.lit(window_s) - pl.col("covered_s")).clip(lower_bound=0).alias("uncovered_s"),
            _method_expr(pl.col("counter_energy_j"), pl.col("integrated_energy_j"), pl.col("covered_s")).alias("method"),
            pl.when(pl.col("covered_s") <= 0)
            .then(pl.lit("no_energy_data"))
            .when(pl.col("covered_s") < window_s - 1e-6)
            .then(pl.lit("partial"))
            .otherwise(pl.lit("measured"))
            .alias("status"),
        )
        .select(list(_GPU_SUMMARY_SCHEMA))
        .sort("gpu_uuid")
    )
    return EnergyRollup(minutes, gpus, events, window_start, window_end, params)


def gpu_energy(
    minutes: pl.DataFrame,
    *,
    window_start: dt.datetime,
    window_end: dt.datetime,
    gpu: pl.DataFrame | None = None,
) -> pl.DataFrame:
    """Per-GPU energy over a window from the stored roll-ups (bounds on minute boundaries: a roll-up row
    counts whole, by the minute it starts).

    Every GPU of the ``gpu`` inventory appears: one without any roll-up row in the window gets
    ``energy_j`` null and status ``no_data`` (flagged, never zero). Columns: gpu_uuid, energy_j,
    counter_energy_j, integrated_energy_j, covered_s, uncovered_s, method, status (measured/partial/no_data).
    """
    lo, hi = _as_us(window_start), _as_us(window_end)
    window_s = (hi - lo) / _US
    m = minutes.filter((pl.col("minute") >= window_start) & (pl.col("minute") < window_end))
    tot = m.group_by("gpu_uuid").agg(
        pl.col("energy_j").sum(), pl.col("counter_energy_j").sum(), pl.col("integrated_energy_j").sum(), pl.col("covered_s").sum()
    )
    if gpu is not None:
        tot = gpu.select("gpu_uuid").unique().join(tot, on="gpu_uuid", how="full", coalesce=True)
    return (
        tot.with_columns(pl.col("covered_s").fill_null(0.0))
        .with_columns(
            pl.when(pl.col("covered_s") > 0).then(pl.col("energy_j")).otherwise(None).alias("energy_j"),
            (pl.lit(window_s) - pl.col("covered_s")).clip(lower_bound=0).alias("uncovered_s"),
            _method_expr(pl.col("counter_energy_j"), pl.col("integrated_energy_j"), pl.col("covered_s")).alias("method"),
            pl.when(pl.col("covered_s") <= 0)
            .then(pl.lit("no_data"))
            .when(pl.col("covered_s") < window_s - 1e-6)
            .then(pl.lit("partial"))
            .otherwise(pl.lit("measured"))
            .alias("status"),
        )
        .select("gpu_uuid", "energy_j", "counter_energy_j", "integrated_energy_j", "covered_s", "uncovered_s", "method", "status")
        .sort("gpu_uuid")
    )


# --- attribution to jobs ---------------------------------------------------------------------------


def attribute_to_jobs(minutes: pl.DataFrame, job_rank: pl.DataFrame) -> pl.DataFrame:
    """Split each GPU-minute's energy between the ranks that held the GPU in that minute and idle.

    A rank interval [start, end) (``end`` null: still running) covering a fraction f of a minute gets
    f of its energy (power taken as even within the minute — the roll-up's resolution). If assignments on
    one GPU overlap (bad inventory or shared GPUs), shares are scaled so they sum to at most one. The rest
    of the minute is idle (``job_id`` null). Returns :data:`ATTRIBUTED_SCHEMA`; energy is conserved.
    """
    if minutes.height == 0:
        return pl.DataFrame(schema=ATTRIBUTED_SCHEMA)
    for col in ("job_id", "rank", "start", "gpu_uuid"):
        if col not in job_rank.columns:
            raise ValidationError("missing required column", frame="job_rank", field=col)
    m = minutes.with_columns(pl.col("minute").dt.epoch("us").alias("mu"))
    lo, hi = int(m["mu"].min()), int(m["mu"].max()) + _MINUTE_US
    start = _utc_ts(job_rank, "job_rank", "start")
    # an all-null "end" column built without a schema has dtype Null: every rank is still running
    has_end = "end" in job_rank.columns and job_rank.schema["end"] != pl.Null
    end = _utc_ts(job_rank, "job_rank", "end") if has_end else pl.lit(None, pl.Int64)
    jr = (
        job_rank.select("job_id", "rank", "gpu_uuid", start.alias("s"), end.alias("e"))
        .with_columns(pl.col("e").fill_null(hi))
        .with_columns(pl.max_horizontal("s", pl.lit(lo)).alias("s"), pl.min_horizontal("e", pl.lit(hi)).alias("e"))
        .filter(pl.col("e") > pl.col("s"))
        .join(m.select("gpu_uuid").unique(), on="gpu_uuid", how="semi")
    )
    jr = (
        jr.with_columns(pl.int_ranges(pl.col("s") // _MINUTE_US, (pl.col("e") - 1) // _MINUTE_US + 1).alias("mi"))
        .explode("mi")
        .with_columns((pl.col("mi") * _MINUTE_US).alias("mu"))
        .with_columns(
            ((pl.min_horizontal("e", pl.col("mu") + _MINUTE_US) - pl.max_horizontal("s", "mu")) / _US).alias("held_s")
        )
        .select("job_id", "rank", "gpu_uuid", "mu", "held_s")
    )
    held = jr.join(m, on=["gpu_uuid", "mu"], how="inner")
    scale = held.group_by("gpu_uuid", "mu").agg((pl.col("held_s").sum() / 60.0).alias("held_frac"))
    held = held.join(scale, on=["gpu_uuid", "mu"]).with_columns(
        (pl.col("held_s") / 60.0 / pl.max_horizontal(pl.col("held_frac"), pl.lit(1.0))).alias("share")
    )
    cols = ["energy_j", "counter_energy_j", "integrated_energy_j", "covered_s"]
    jobs = held.select(
        "minute", "gpu_uuid", "job_id", "rank", *[(pl.col(c) * pl.col("share")).alias(c) for c in cols],
        (pl.col("share") * 60.0).alias("allocated_s"),
    )
    idle = (
        m.join(scale, on=["gpu_uuid", "mu"], how="left")
        .with_columns((1.0 - pl.col("held_frac").fill_null(0.0)).clip(lower_bound=0.0).alias("share"))
        .filter(pl.col("share") > 1e-12)
        .select(
            "minute", "gpu_uuid", pl.lit(None, pl.String).alias("job_id"), pl.lit(None, pl.Int64).alias("rank"),
            *[(pl.col(c) * pl.col("share")).alias(c) for c in cols], (pl.col("share") * 60.0).alias("allocated_s"),
        )
    )
    return pl.concat([jobs, idle]).cast(ATTRIBUTED_SCHEMA).sort("minute", "gpu_uuid", "job_id", nulls_last=True)


def energy_summary(
    attributed: pl.DataFrame,
    by: Sequence[str],
    *,
    gpu: pl.DataFrame | None = None,
    host: pl.DataFrame | None = None,
    job: pl.DataFrame | None = None,
) -> pl.DataFrame:
    """Energy grouped ``by`` any of: job_id, rank, gpu_uuid, host, site_id, gpu_model (gpu.model_name),
    model_name (job.model_name, the ML model), job_kind (training/inference), minute, hour, day.

    Inventory frames supply the dimensions that ``attributed`` does not carry. Output: the keys, energy_j,
    counter_energy_j, integrated_energy_j, covered_s, allocated_s, coverage_ratio (covered/allocated) and
    method. Idle energy has job_id null.
    """
    df = attributed
    need = set(by)
    if need & {"host", "site_id", "gpu_model"}:
        if gpu is None:
            raise ValidationError("grouping by host/site/gpu_model needs the gpu inventory", frame="gpu")
        df = df.join(gpu.select("gpu_uuid", "host", pl.col("model_name").alias("gpu_model")), on="gpu_uuid", how="left")
    if "site_id" in need:
        if host is None:
            raise ValidationError("grouping by site_id needs the host inventory", frame="host")
        df = df.join(host.select("host", "site_id"), on="host", how="left")
    if need & {"model_name", "job_kind"}:
        if job is None:
            raise ValidationError("grouping by model_name/job_kind needs the job inventory", frame="job")
        df = df.join(job.select("job_id", "model_name", pl.col("kind").alias("job_kind")), on="job_id", how="left")
    if "hour" in need:
        df = df.with_columns(pl.col("minute").dt.truncate("1h").alias("hour"))
    if "day" in need:
        df = df.with_columns(pl.col("minute").dt.truncate("1d").alias("day"))
    return (
        df.group_by(list(by))
        .agg(pl.col(c).sum() for c in ("energy_j", "counter_energy_j", "integrated_energy_j", "covered_s", "allocated_s"))
        .with_columns(
            (pl.col("covered_s") / pl.col("allocated_s")).alias("coverage_ratio"),
            _method_expr(pl.col("counter_energy_j"), pl.col("integrated_energy_j"), pl.col("covered_s")).alias("method"),
        )
        .sort(list(by), nulls_last=True)
    )


# --- work per joule ---------------------------------------------------------------------------------


def _useful_steps(step: pl.DataFrame, rank_aggregation: str) -> pl.DataFrame:
    """Per job and step number: tokens and model FLOPs of the attempt that counted (the last one started;
    an attempt re-run after a restart is wasted work, counted once), aggregated over ranks."""
    if rank_aggregation not in ("sum", "max"):
        raise ValueError("rank_aggregation must be 'sum' (ranks report their share) or 'max' (ranks report the global figure)")
    last = step.sort("start").group_by("job_id", "rank", "step").agg(pl.col("tokens").last(), pl.col("model_flops").last())
    agg = (lambda c: pl.col(c).sum()) if rank_aggregation == "sum" else (lambda c: pl.col(c).max())
    return last.group_by("job_id", "step").agg(agg("tokens").alias("tokens"), agg("model_flops").alias("model_flops"))


def energy_productivity(job_energy: pl.DataFrame, step: pl.DataFrame, *, rank_aggregation: str = "sum") -> pl.DataFrame:
    """Energy per step, per million tokens and ρ = useful FLOPs / J per job.

    ``job_energy``: job_id, energy_j (e.g. ``energy_summary(attributed, ["job_id"])``) over the same window
    as ``step``. ``rank_aggregation``: ``sum`` when each rank reports its own tokens/FLOPs, ``max`` when
    each reports the global batch. Returns job_id, energy_j, steps, tokens, useful_flops,
    energy_per_step_j, energy_per_mtok_j (J per 10^6 tokens), flops_per_j. Ratios are null where the
    denominator is zero or unknown.
    """
    per_step = _useful_steps(step, rank_aggregation)
    work = per_step.group_by("job_id").agg(
        pl.len().alias("steps"), pl.col("tokens").sum().alias("tokens"), pl.col("model_flops").sum().alias("useful_flops")
    )
    e = job_energy.filter(pl.col("job_id").is_not_null()).select("job_id", "energy_j")
    out = e.join(work, on="job_id", how="left")

    def ratio(num: pl.Expr, den: pl.Expr) -> pl.Expr:
        return pl.when(den > 0).then(num / den).otherwise(None)

    return out.with_columns(
        ratio(pl.col("energy_j"), pl.col("steps").cast(pl.Float64)).alias("energy_per_step_j"),
        ratio(pl.col("energy_j") * 1e6, pl.col("tokens").cast(pl.Float64)).alias("energy_per_mtok_j"),
        ratio(pl.col("useful_flops"), pl.col("energy_j")).alias("flops_per_j"),
    ).sort("job_id")


def fleet_energy_productivity(attributed: pl.DataFrame, step: pl.DataFrame, *, rank_aggregation: str = "sum") -> float | None:
    """Fleet ρ = useful FLOPs of all jobs / all GPU energy of the window, idle included (idle GPUs are the
    fleet's cost of doing that work). None where there is no energy."""
    total_j = float(attributed["energy_j"].sum() or 0.0)
    if total_j <= 0:
        return None
    flops = _useful_steps(step, rank_aggregation)["model_flops"].sum()
    return float(flops or 0.0) / total_j


def energy_from_chip_hours(n_chips: float, hours: float, avg_power_w: float, pue: float = 1.0) -> float:
    """Energy in J of ``n_chips`` drawing ``avg_power_w`` each for ``hours``, times PUE — Patterson et al.
    2021 ("Carbon Emissions and Large Neural Network Training", arXiv:2104.10350, §2.5):
    MWh = hours × chips × average power × PUE. Used to estimate where telemetry is absent."""
    if n_chips < 0 or hours < 0 or avg_power_w < 0 or pue < 1.0:
        raise ValueError("chips, hours and power must be >= 0 and PUE >= 1")
    return n_chips * hours * 3600.0 * avg_power_w * pue


# --- facility meters: PUE and WUE ------------------------------------------------------------------

_SERIES_RE = re.compile(r"^([^{]+)(?:\{(.*)\})?$")
_LABEL_RE = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"')

_CATEGORY_BY_POINT = {"ups": 1, "pdu": 2, "it": 3, "server": 3}
_CATEGORY_TEXT = {
    1: "category 1 (IT energy at UPS output)",
    2: "category 2 (IT energy at PDU output)",
    3: "category 3 (IT energy at IT equipment input)",
}


def _parse_series(series: pl.Series) -> pl.DataFrame:
    names, labels = [], []
    for key in series.to_list():
        mt = _SERIES_RE.match(key or "")
        names.append(mt.group(1) if mt else key)
        labels.append(dict(_LABEL_RE.findall(mt.group(2) or "")) if mt else {})
    return pl.DataFrame(
        {
            "series": series,
            "name": names,
            "site": [lb.get("site") for lb in labels],
            "point": [lb.get("point") for lb in labels],
        },
        schema={"series": pl.String, "name": pl.String, "site": pl.String, "point": pl.String},
    )


def _meter_energy(metric_sample: pl.DataFrame, names: tuple[str, str], site_id: str, lo: int, hi: int, *, max_gap_s: float) -> pl.DataFrame:
    """Energy per meter series of one site in [lo, hi): counter series (names[0]) by differences with
    resets starting new segments, power series (names[1]) by trapezoid. Returns series, point, energy, covered_s."""
    pieces = _meter_minutes(metric_sample, names, lo, hi, max_gap_s=max_gap_s, site_id=site_id)
    return pieces.group_by("series", "point").agg(pl.col("energy").sum(), pl.col("covered_s").sum()).select("series", "point", "energy", "covered_s")


def _meter_minutes(metric_sample: pl.DataFrame, names: tuple[str, str], lo: int, hi: int, *, max_gap_s: float,
                   site_id: str | None = None) -> pl.DataFrame:
    """Energy and covered seconds per meter series (of one site, or all) and UTC minute index ``m`` in
    [lo, hi): series, site, point, m, energy, covered_s."""
    schema = {"series": pl.String, "site": pl.String, "point": pl.String, "m": pl.Int64, "energy": pl.Float64, "covered_s": pl.Float64}
    if metric_sample.height == 0:
        return pl.DataFrame(schema=schema)
    keys = _parse_series(metric_sample.get_column("series").unique())
    keys = keys.filter(pl.col("name").is_in(list(names)) & (pl.col("site") == site_id if site_id is not None else pl.col("site").is_not_null()))
    out = []
    for kind_name, is_counter in ((names[0], True), (names[1], False)):
        ks = keys.filter(pl.col("name") == kind_name)
        if ks.height == 0:
            continue
        df = (
            metric_sample.join(ks.select("series"), on="series", how="semi")
            .select("series", _utc_ts(metric_sample, "metric_sample").alias("t"), pl.col("value").cast(pl.Float64))
            .with_columns(pl.when(pl.col("value").is_finite() & (pl.col("value") >= 0)).then(pl.col("value")).alias("value"))
            .with_columns(
                (pl.col("value") if is_counter else pl.lit(None, pl.Float64)).alias("counter"),
                (pl.lit(None, pl.Float64) if is_counter else pl.col("value")).alias("power"),
            )
            .sort("series", "t")
        )
        iv, _ = _intervals(df, "series", max_power_gap_s=max_gap_s, max_counter_gap_s=max_gap_s, max_power_w=None)
        pieces = _split_minutes(iv, "series", lo, hi)
        out.append(pieces.group_by("series", "m").agg(pl.col("energy_j").sum().alias("energy"), pl.col("covered_s").sum()))
    if not out:
        return pl.DataFrame(schema=schema)
    return pl.concat(out).join(keys.select("series", "site", "point"), on="series", how="left").select(list(schema)).cast(schema)


def pue_series(
    metric_sample: pl.DataFrame,
    *,
    window_start: dt.datetime,
    window_end: dt.datetime,
    bucket_s: int = 900,
    max_gap_s: float = 900.0,
    min_coverage_ratio: float = 0.95,
) -> pl.DataFrame:
    """PUE per site and time bucket from the facility and IT meters, the way :func:`pue` computes it for one
    window (ISO/IEC 30134-2: facility energy / IT energy; the IT point nearest the equipment that the site
    meters sets the category) — for a chart of PUE over time. A bucket needs both meters to cover
    ``min_coverage_ratio`` of it. Buckets are UTC-aligned multiples of ``bucket_s`` (a whole number of
    minutes). Returns site_id, ts (bucket start), pue, category, facility_energy_j, it_energy_j; sites with
    no usable pair of meters have no rows. Sub-annual values are interim figures under the standard."""
    if bucket_s < 60 or bucket_s % 60:
        raise ValidationError("bucket_s must be a whole number of minutes", frame="pue_series", field="bucket_s")
    out_schema = {"site_id": pl.String, "ts": pl.Datetime("us", "UTC"), "pue": pl.Float64, "category": pl.Int64,
                  "facility_energy_j": pl.Float64, "it_energy_j": pl.Float64}
    lo, hi = _as_us(window_start), _as_us(window_end)
    if hi <= lo:
        raise ValidationError("window_end must be after window_start", frame="window")
    per = bucket_s // 60

    def bucketed(names: tuple[str, str]) -> pl.DataFrame:
        m = _meter_minutes(metric_sample, names, lo, hi, max_gap_s=max_gap_s)
        return (m.with_columns((pl.col("m") // per * per).alias("b"))
                .group_by("series", "site", "point", "b").agg(pl.col("energy").sum(), pl.col("covered_s").sum()))

    def covered(df: pl.DataFrame) -> pl.DataFrame:
        # the bucket's own length: the first and last bucket may be cut by the window
        length_s = ((pl.min_horizontal((pl.col("b") + per) * _MINUTE_US, pl.lit(hi))
                     - pl.max_horizontal(pl.col("b") * _MINUTE_US, pl.lit(lo))) / _US)
        return df.filter(pl.col("covered_s") >= min_coverage_ratio * length_s)

    fac = covered(bucketed((FACILITY_ENERGY, FACILITY_POWER)))
    fac = fac.group_by("site", "b").agg(pl.col("energy").sum().alias("facility_energy_j"), pl.len().alias("feeds"))
    it = covered(bucketed((IT_ENERGY, IT_POWER))).with_columns(
        pl.col("point").replace_strict(_CATEGORY_BY_POINT, default=None, return_dtype=pl.Int64).alias("category")).drop_nulls("category")
    # one category per site for the whole chart, so its line does not jump between measurement points
    best = it.group_by("site").agg(pl.col("category").max())
    it = it.join(best, on=["site", "category"]).group_by("site", "b", "category").agg(pl.col("energy").sum().alias("it_energy_j"))
    both = fac.join(it, on=["site", "b"]).filter(pl.col("it_energy_j") > 0)
    if both.height == 0:
        return pl.DataFrame(schema=out_schema)
    return both.select(
        pl.col("site").alias("site_id"), (pl.col("b") * _MINUTE_US).cast(pl.Datetime("us")).dt.replace_time_zone("UTC").alias("ts"),
        (pl.col("facility_energy_j") / pl.col("it_energy_j")).alias("pue"), "category", "facility_energy_j", "it_energy_j",
    ).cast(out_schema).sort("site_id", "ts")


@dataclass(frozen=True)
class PueResult:
    """PUE of one site over one window, with how it was obtained.

    ``basis``: ``measured`` (facility and IT meters), ``measured_facility_gpu_it`` (facility meter over GPU
    energy from telemetry: not an ISO/IEC 30134-2 category, since GPUs are only part of IT load) or
    ``declared`` (the site's declared PUE; ``estimate`` is then True and so is every figure derived from it).
    """

    site_id: str
    window_start: dt.datetime
    window_end: dt.datetime
    pue: float | None
    basis: str
    category: int | None
    label: str
    estimate: bool
    interim: bool
    facility_energy_j: float | None
    it_energy_j: float | None
    coverage_ratio: float | None


def pue(
    metric_sample: pl.DataFrame,
    site_id: str,
    *,
    window_start: dt.datetime,
    window_end: dt.datetime,
    site: pl.DataFrame | None = None,
    gpu_it_energy_j: float | None = None,
    max_gap_s: float = 900.0,
    min_coverage_ratio: float = 0.95,
) -> PueResult:
    """PUE = total facility energy / IT equipment energy over [window_start, window_end) — ISO/IEC 30134-2.

    Meters are ``metric_sample`` series labelled ``site="<site_id>"``: ``facility_energy_j`` (cumulative,
    preferred) or ``facility_power_w``; ``it_energy_j`` / ``it_power_w`` with ``point="ups"|"pdu"|"it"``
    giving the measurement category 1/2/3 (with several points, the one nearest the IT equipment wins, as
    it is the more accurate category). Several feeds of one kind are summed. Meters covering less than
    ``min_coverage_ratio`` of the window are not used. Without an IT meter, ``gpu_it_energy_j`` may stand
    in (labelled as not an ISO category). Without a usable facility meter, the site's ``declared_pue``
    is returned as an estimate; with neither, ``pue`` is None and ``basis`` says why.
    """
    lo, hi = _as_us(window_start), _as_us(window_end)
    if hi <= lo:
        raise ValidationError("window_end must be after window_start", frame="window")
    window_s = (hi - lo) / _US
    interim = window_s < 365 * 86400
    suffix = " (interim: ISO/IEC 30134-2 reports PUE over 12 months)" if interim else ""

    fac = _meter_energy(metric_sample, (FACILITY_ENERGY, FACILITY_POWER), site_id, lo, hi, max_gap_s=max_gap_s)
    fac_ok = fac.height > 0 and float(fac["covered_s"].min()) >= min_coverage_ratio * window_s
    facility_j = float(fac["energy"].sum()) if fac_ok else None
    fac_cov = float(fac["covered_s"].min()) / window_s if fac.height else None

    it = _meter_energy(metric_sample, (IT_ENERGY, IT_POWER), site_id, lo, hi, max_gap_s=max_gap_s)
    it = it.with_columns(pl.col("point").replace_strict(_CATEGORY_BY_POINT, default=None, return_dtype=pl.Int64).alias("category"))
    it = it.filter(pl.col("category").is_not_null() & (pl.col("covered_s") >= min_coverage_ratio * window_s))
    category, it_j = None, None
    if it.height:
        category = int(it["category"].max())
        it_j = float(it.filter(pl.col("category") == category)["energy"].sum())

    if facility_j is not None and it_j:
        return PueResult(site_id, window_start, window_end, facility_j / it_j, "measured", category,
                         f"PUE{category}: ISO/IEC 30134-2 {_CATEGORY_TEXT[category]}{suffix}", False, interim, facility_j, it_j, fac_cov)
    if facility_j is not None and gpu_it_energy_j:
        return PueResult(site_id, window_start, window_end, facility_j / gpu_it_energy_j, "measured_facility_gpu_it", None,
                         "facility energy / GPU energy from telemetry: not an ISO/IEC 30134-2 category (GPUs are part of IT load); an upper bound on PUE" + suffix,
                         True, interim, facility_j, gpu_it_energy_j, fac_cov)
    declared = None
    if site is not None and "declared_pue" in site.columns:
        row = site.filter(pl.col("site_id") == site_id)
        if row.height and row["declared_pue"][0] is not None:
            declared = float(row["declared_pue"][0])
    if declared is not None:
        if declared < 1.0:
            raise ValidationError(f"declared PUE {declared} is below 1", frame="site", field="declared_pue")
        return PueResult(site_id, window_start, window_end, declared, "declared", None,
                         "declared PUE (no usable facility meter): estimate", True, interim, None, None, fac_cov)
    return PueResult(site_id, window_start, window_end, None, "none", None,
                     "no facility meter and no declared PUE", True, interim, None, None, fac_cov)


def apply_pue(site_energy: pl.DataFrame, pues: Sequence[PueResult]) -> pl.DataFrame:
    """Add facility energy to per-site IT energy: ``facility_energy_j`` = energy_j × PUE, with ``pue``,
    ``pue_basis``, ``pue_label`` and ``estimate`` (True wherever the PUE was declared rather than metered,
    or missing). ``site_energy`` needs columns site_id, energy_j."""
    table = pl.DataFrame(
        {
            "site_id": [p.site_id for p in pues],
            "pue": [p.pue for p in pues],
            "pue_basis": [p.basis for p in pues],
            "pue_label": [p.label for p in pues],
            "estimate": [p.estimate for p in pues],
        },
        schema={"site_id": pl.String, "pue": pl.Float64, "pue_basis": pl.String, "pue_label": pl.String, "estimate": pl.Boolean},
    )
    return site_energy.join(table, on="site_id", how="left").with_columns(
        (pl.col("energy_j") * pl.col("pue")).alias("facility_energy_j"),
        pl.col("estimate").fill_null(True),
        pl.col("pue_basis").fill_null("none"),
    )


def wue(
    metric_sample: pl.DataFrame,
    site_id: str,
    *,
    window_start: dt.datetime,
    window_end: dt.datetime,
    it_energy_j: float,
    max_gap_s: float = 3600.0,
) -> float | None:
    """WUE in L/kWh = site water usage / IT equipment energy — ISO/IEC 30134-9. Water from the cumulative
    ``facility_water_l{site=...}`` meter; None where the site has no water meter (never zero)."""
    lo, hi = _as_us(window_start), _as_us(window_end)
    water = _meter_energy(metric_sample, (WATER, "\x00none"), site_id, lo, hi, max_gap_s=max_gap_s)
    if water.height == 0 or not it_energy_j or it_energy_j <= 0:
        return None
    return float(water["energy"].sum()) / (it_energy_j / J_PER_KWH)


# --- serving versus training ---------------------------------------------------------------------


def serving_vs_training(attributed: pl.DataFrame, job: pl.DataFrame, *, projection_days: int = 28) -> pl.DataFrame:
    """Per model: training energy, serving (inference) energy and emissions, and the date cumulative
    serving energy passes training energy (the serving-cost-dominance law).

    ``attributed``: :data:`ATTRIBUTED_SCHEMA` rows (optionally with a ``kgco2e`` column, e.g. from
    ``analyzers.carbon.location_based``); ``job``: job_id, kind (training/inference), model_name.
    ``crossover_basis``: ``observed`` (the day it happened), ``projected`` (not yet: extrapolated at the
    mean daily serving energy of the last ``projection_days`` days observed), or ``none`` (no serving or
    no training energy). Returns model_name, training_energy_j, serving_energy_j, training_kgco2e,
    serving_kgco2e, serving_days, crossover_date, crossover_basis.
    """
    has_c = "kgco2e" in attributed.columns
    df = attributed.filter(pl.col("job_id").is_not_null()).join(
        job.select("job_id", "kind", "model_name"), on="job_id", how="inner"
    ).with_columns(pl.col("minute").dt.date().alias("day"))
    carbon = pl.col("kgco2e") if has_c else pl.lit(None, pl.Float64)
    train = df.filter(pl.col("kind") == "training").group_by("model_name").agg(
        pl.col("energy_j").sum().alias("training_energy_j"), carbon.sum().alias("training_kgco2e") if has_c else carbon.first().alias("training_kgco2e")
    )
    daily = (
        df.filter(pl.col("kind") == "inference")
        .group_by("model_name", "day")
        .agg(pl.col("energy_j").sum().alias("e"), (carbon.sum() if has_c else carbon.first()).alias("c"))
        .sort("model_name", "day")
    )
    rows = []
    models = sorted(set(train["model_name"].to_list()) | set(daily["model_name"].to_list()), key=lambda x: (x is None, x))
    for model in models:
        t = train.filter(pl.col("model_name") == model)
        t_j = float(t["training_energy_j"][0]) if t.height else None
        t_c = t["training_kgco2e"][0] if t.height else None
        d = daily.filter(pl.col("model_name") == model)
        s_j = float(d["e"].sum()) if d.height else 0.0
        s_c = float(d["c"].sum()) if (has_c and d.height) else None
        date, basis = None, "none"
        if d.height and t_j:
            cum = d["e"].cum_sum()
            hit = (cum >= t_j).arg_true()
            if len(hit):
                date, basis = d["day"][int(hit[0])], "observed"
            else:
                recent = d.tail(projection_days)
                span_days = (recent["day"][-1] - recent["day"][0]).days + 1
                rate = float(recent["e"].sum()) / span_days
                if rate > 0:
                    days_more = (t_j - s_j) / rate
                    date = d["day"][-1] + dt.timedelta(days=int(-(-days_more // 1)))
                    basis = "projected"
        rows.append(
            {"model_name": model, "training_energy_j": t_j, "serving_energy_j": s_j, "training_kgco2e": t_c,
             "serving_kgco2e": s_c, "serving_days": d.height, "crossover_date": date, "crossover_basis": basis}
        )
    schema = {"model_name": pl.String, "training_energy_j": pl.Float64, "serving_energy_j": pl.Float64,
              "training_kgco2e": pl.Float64, "serving_kgco2e": pl.Float64, "serving_days": pl.Int64,
              "crossover_date": pl.Date, "crossover_basis": pl.String}
    return pl.DataFrame(rows, schema=schema)

"""Energy of the intervals between meter readings, per UTC minute: the integration GPU energy
(``analyzers.energy``) and the facility meters (``analyzers.facility``) share.

A cumulative counter's interval energy is the difference of two consecutive readings; a reading lower than
the one before (a reset) or a step above a power bound is not an interval but an event, and so is a gap
longer than the counter's bridge. Sampled power is integrated by the trapezoid rule where no counter
interval covers it, never across a gap longer than ``max_power_gap_s``. Intervals are then cut at UTC
minute boundaries (counter energy spread evenly, power energy as the trapezoid of each piece), so pieces
add up to the whole.

Pure: polars over frames with integer epoch-microsecond times; nothing here reads the clock, a file or the
database.
"""

from __future__ import annotations

import datetime as dt

import polars as pl

from fleetscope.core.errors import ValidationError

__all__ = ["US", "MINUTE_US", "epoch_us", "utc_epoch_us", "reading_intervals", "split_minutes"]

US = 1_000_000  # microseconds per second
MINUTE_US = 60 * US


def epoch_us(value: dt.datetime | None) -> int | None:
    """Epoch microseconds of a window bound; a naive bound is refused (it would shift the window by the
    local offset)."""
    if value is None:
        return None
    if value.tzinfo is None:
        raise ValidationError("window bounds must be timezone-aware (UTC)", frame="window")
    return int(pl.Series([value]).dt.convert_time_zone("UTC").dt.cast_time_unit("us").dt.epoch("us")[0])


def utc_epoch_us(df: pl.DataFrame, frame: str, col: str = "ts") -> pl.Expr:
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


def reading_intervals(
    df: pl.DataFrame, key: str, *, max_power_gap_s: float, max_counter_gap_s: float, max_power_w: float | None
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Energy intervals and events from readings sorted by (key, t) with columns key, t, power, counter.

    Returns ``intervals`` (key, t0, t1, p0, p1, energy_j, counter: bool) and ``events`` (key, t, kind, value).
    """
    c = _pairs(df, key, "counter").with_columns(
        ((pl.col("t1") - pl.col("t0")) / US).alias("dt_s"), (pl.col("v1") - pl.col("v0")).alias("de")
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

    p = _pairs(df, key, "power").with_columns(((pl.col("t1") - pl.col("t0")) / US).alias("dt_s"))
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


def split_minutes(iv: pl.DataFrame, key: str, lo: int | None, hi: int | None) -> pl.DataFrame:
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
        (pl.col("a") // MINUTE_US).alias("m0"), ((pl.col("b") - 1) // MINUTE_US).alias("m1")
    )
    single = iv.filter(pl.col("m0") == pl.col("m1")).with_columns(pl.col("m0").alias("m"))
    multi = iv.filter(pl.col("m0") != pl.col("m1"))
    if multi.height:
        multi = (
            multi.with_columns(pl.int_ranges(pl.col("m0"), pl.col("m1") + 1).alias("m"))
            .explode("m")
            .with_columns(
                pl.max_horizontal(pl.col("a"), pl.col("m") * MINUTE_US).alias("a"),
                pl.min_horizontal(pl.col("b"), (pl.col("m") + 1) * MINUTE_US).alias("b"),
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
    piece_s = (pl.col("b") - pl.col("a")) / US
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

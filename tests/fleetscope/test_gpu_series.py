"""One GPU's history (``telemetry.gpu_field_series``): two GPUs sampled three times a minute with values whose
minimum, maximum, mean and last per minute and per hour follow by hand; raw samples for a short window, the minute
and hour tiers for long ones, the buckets past a tier's watermark rolled from raw; field names checked before
any SQL."""

from __future__ import annotations

import datetime as dt

import polars as pl
import pytest

from fleetscope.core import frames as F
from fleetscope.core.errors import ValidationError
from fleetscope.services import telemetry, tiers

T0 = dt.datetime(2026, 11, 2, 9, 0, tzinfo=dt.UTC)
M = dt.timedelta(minutes=1)
MINUTES = 130
A, B, IDLE = "GPU-aaaa", "GPU-bbbb", "GPU-idle"  # A and IDLE in the inventory; B only sampled; IDLE never sampled
END = T0 + MINUTES * M


def value(gpu: str, field: str, m: int, s: int) -> float | None:
    """The sample of ``gpu`` at minute ``m``, second ``20 * s`` (s = 0, 1, 2)."""
    if gpu == A:
        return {"temp_c": 40.0 + s, "power_w": 200.0 + m + 10 * s}[field]
    # B's temperature is missing from every third sample: a minute's last is its second sample's
    return {"temp_c": None if s == 2 else 60.0 + s, "power_w": 500.0 - m - 5 * s}[field]


def minute_want(gpu: str, field: str, m: int) -> tuple[float, float, float, float]:
    """(min, max, mean, last) of minute ``m``, by hand from ``value``: A's temperature 40, 41, 42 → (40, 42, 41, 42);
    A's power 200 + m + (0, 10, 20) → (200 + m, 220 + m, 210 + m, 220 + m); B's temperature 60, 61, - → (60, 61, 60.5, 61);
    B's power 500 - m - (0, 5, 10) → (490 - m, 500 - m, 495 - m, 490 - m)."""
    return {(A, "temp_c"): (40.0, 42.0, 41.0, 42.0), (A, "power_w"): (200.0 + m, 220.0 + m, 210.0 + m, 220.0 + m),
            (B, "temp_c"): (60.0, 61.0, 60.5, 61.0), (B, "power_w"): (490.0 - m, 500.0 - m, 495.0 - m, 490.0 - m)}[(gpu, field)]


def seed(store) -> None:  # type: ignore[no-untyped-def]
    rows = [{"ts": T0 + m * M + dt.timedelta(seconds=20 * s), "gpu_uuid": g, "temp_c": value(g, "temp_c", m, s),
             "power_w": value(g, "power_w", m, s), "util_ratio": 0.5}
            for m in range(MINUTES) for s in range(3) for g in (A, B)]
    store.write(F.Batch(host=F.conform(F.HOST, pl.DataFrame([{"host": "n1"}])),
                        gpu=F.conform(F.GPU, pl.DataFrame([{"gpu_uuid": A, "host": "n1", "gpu_index": 0}, {"gpu_uuid": IDLE, "host": "n1", "gpu_index": 1}])),
                        gpu_sample=F.conform(F.GPU_SAMPLE, pl.DataFrame(rows))))
    # beat rolled the minutes up to minute 125 and the hours up to 11:00; minutes 125-129 and the hour under way are not rolled
    tiers.advance(store, T0 + 125 * M + tiers.SETTLE)
    assert tiers.watermark(store, "minute") == T0 + 125 * M and tiers.watermark(store, "hour") == T0 + 120 * M


def rows_of(df: pl.DataFrame, field: str) -> list[dict]:
    return df.filter(pl.col("field") == field).to_dicts()


def test_a_short_window_reads_each_raw_sample(store) -> None:  # type: ignore[no-untyped-def]
    seed(store)
    df = telemetry.gpu_field_series(store, A, ["temp_c", "power_w"], T0 + 5 * M, T0 + 65 * M)
    assert df.columns == ["field", "ts", "samples", "min", "max", "mean", "last", "tier", "from_raw"]
    assert df["tier"].unique().to_list() == ["raw"] and df["from_raw"].all()
    assert df["field"].to_list() == ["temp_c"] * 180 + ["power_w"] * 180  # fields in the order asked, each by time
    first = rows_of(df, "power_w")[:3]
    assert [(r["ts"], r["min"], r["max"], r["mean"], r["last"], r["samples"]) for r in first] == [
        (T0 + 5 * M, 205.0, 205.0, 205.0, 205.0, 1), (T0 + 5 * M + dt.timedelta(seconds=20), 215.0, 215.0, 215.0, 215.0, 1),
        (T0 + 5 * M + dt.timedelta(seconds=40), 225.0, 225.0, 225.0, 225.0, 1)]
    for r in df.iter_rows(named=True):
        offset = int((r["ts"] - T0).total_seconds())
        assert r["mean"] == value(A, r["field"], offset // 60, offset % 60 // 20)
    # B's missing temperatures are null samples, not zeros
    b = telemetry.gpu_field_series(store, B, "temp_c", T0, T0 + M)
    assert b["mean"].to_list() == [60.0, 61.0, None]


def test_a_day_reads_the_minute_tier_and_rolls_the_minutes_past_its_watermark_from_raw(store) -> None:  # type: ignore[no-untyped-def]
    seed(store)
    for gpu in (A, B):
        df = telemetry.gpu_field_series(store, gpu, ("power_w", "temp_c"), END - dt.timedelta(days=1), END)
        assert df["tier"].unique().to_list() == ["minute"]
        for field in ("power_w", "temp_c"):
            got = rows_of(df, field)
            assert [r["ts"] for r in got] == [T0 + m * M for m in range(MINUTES)]
            assert [(r["min"], r["max"], r["mean"], r["last"]) for r in got] == [minute_want(gpu, field, m) for m in range(MINUTES)]
            assert [r["samples"] for r in got] == [3] * MINUTES
            # minutes 0-124 from the tier, 125-129 (past its watermark) rolled here from raw samples
            assert [r["from_raw"] for r in got] == [False] * 125 + [True] * 5


def test_a_month_reads_the_hour_tier_and_the_hour_under_way_from_raw(store) -> None:  # type: ignore[no-untyped-def]
    seed(store)
    df = telemetry.gpu_field_series(store, A, ["power_w", "temp_c"], END - dt.timedelta(days=30), END)
    assert df["tier"].unique().to_list() == ["hour"]
    power = rows_of(df, "power_w")
    # hour 0: minutes 0-59, power 200 + m + (0, 10, 20): min 200, max 279, mean 210 + 29.5, last 279;
    # hour 1: 260, 339, 299.5, 339; the hour under way (minutes 120-129, not rolled): 320, 349, 334.5, 349
    assert [(r["ts"], r["samples"], r["min"], r["max"], r["mean"], r["last"], r["from_raw"]) for r in power] == [
        (T0, 180, 200.0, 279.0, 239.5, 279.0, False), (T0 + 60 * M, 180, 260.0, 339.0, 299.5, 339.0, False),
        (T0 + 120 * M, 30, 320.0, 349.0, 334.5, 349.0, True)]
    assert [(r["min"], r["max"], r["mean"], r["last"]) for r in rows_of(df, "temp_c")] == [(40.0, 42.0, 41.0, 42.0)] * 3
    b = telemetry.gpu_field_series(store, B, "power_w", END - dt.timedelta(days=30), END)
    # B: 500 - m - (0, 5, 10): hour 0 min 431, max 500, mean 495 - 29.5, last 431
    assert [(r["min"], r["max"], r["mean"], r["last"]) for r in b.to_dicts()] == [
        (431.0, 500.0, 465.5, 431.0), (371.0, 440.0, 405.5, 371.0), (361.0, 380.0, 370.5, 361.0)]


def test_a_read_past_its_point_budget_is_refused_not_cut(store) -> None:  # type: ignore[no-untyped-def]
    seed(store)
    # 180 raw samples of each of two fields in the hour: 360 points
    assert telemetry.gpu_field_series(store, A, ["temp_c", "power_w"], T0, T0 + 60 * M, max_points=360).height == 360
    with pytest.raises(telemetry.TooManyPoints, match="shorter window or fewer fields"):
        telemetry.gpu_field_series(store, A, ["temp_c", "power_w"], T0, T0 + 60 * M, max_points=359)
    with pytest.raises(telemetry.TooManyPoints):
        telemetry.gpu_field_series(store, A, "temp_c", END - dt.timedelta(days=1), END, max_points=100)


@pytest.mark.parametrize("fields", [["temp_c; DROP TABLE gpu"], ["ts"], ["gpu_uuid"], ["temp_c", "power_w) FROM gpu --"], [],
                                    ["x" * 10_000], [f.name for f in F.GPU_FIELDS[:9]]])
def test_field_names_are_checked_before_any_sql(store, fields) -> None:  # type: ignore[no-untyped-def]
    seen: list[str] = []
    real = store.query
    store.query = lambda sql, *a, **k: (seen.append(sql), real(sql, *a, **k))[1]  # type: ignore[method-assign]
    with pytest.raises(ValidationError) as exc:
        telemetry.gpu_field_series(store, A, fields, T0, END)
    assert seen == [] and exc.value.frame == "gpu_sample" and len(str(exc.value)) < 1_000

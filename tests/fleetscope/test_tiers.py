"""Roll-up tiers of GPU telemetry (services/tiers.py, analyzers/tiers.py): values against raw computed here
independently, incremental advance from the watermark, retention per tier, and tier choice by range."""

from __future__ import annotations

import datetime as dt
import math
import re

import polars as pl
import pytest

from analyzers import tiers as tier_rollup
from fleetscope.core import frames as F
from fleetscope.services import energy_rollup
from fleetscope.services import retention, telemetry, tiers

T0 = dt.datetime(2026, 11, 2, 9, 0, tzinfo=dt.UTC)
# a read of raw samples (on PostgreSQL their integer GPU ids joined back to UUIDs, store.gpu_keys)
RAW_READ = re.compile(r"FROM gpu_sample(?: JOIN gpu_key USING \(gpu_id\))? WHERE")
GPUS = ("GPU-aaaa", "GPU-bbbb", "GPU-cccc")
INTERVAL_S = 10


def _samples(minutes: int, start: dt.datetime = T0) -> pl.DataFrame:
    """Three GPUs every 10 s: power and utilisation vary by sample, the energy counter integrates power, one GPU
    drops its temperature every third sample (a null inside a bucket), one field is an integer."""
    rows = []
    for g, gpu in enumerate(GPUS):
        energy = 1.0e6 * (g + 1)
        for i in range(minutes * 60 // INTERVAL_S):
            ts = start + dt.timedelta(seconds=i * INTERVAL_S)
            power = 300.0 + 50 * g + (i * 37 % 23) * 10.0  # 300..~620 W, an H100 SXM's range (TDP 700 W)
            rows.append({
                "ts": ts, "gpu_uuid": gpu, "power_w": power, "energy_j": energy,
                "util_ratio": ((i * 7 + g) % 11) / 10, "temp_c": None if g == 2 and i % 3 == 0 else 40.0 + (i % 13),
                "fb_used_bytes": (i % 5 + g) * 2**30,
            })
            energy += power * INTERVAL_S
    return F.conform(F.GPU_SAMPLE, pl.DataFrame(rows))


def _expected(rows: list[dict], field: str) -> dict[tuple, tuple]:
    """(bucket, gpu) -> (min, max, mean, last) of ``field`` from raw dicts, by plain Python."""
    out: dict[tuple, list] = {}
    for r in sorted(rows, key=lambda r: r["ts"]):
        key = (r["ts"].replace(second=0, microsecond=0), r["gpu_uuid"])
        out.setdefault(key, []).append(r[field])
    res = {}
    for key, vals in out.items():
        vs = [v for v in vals if v is not None]
        res[key] = (min(vs), max(vs), sum(vs) / len(vs), vs[-1]) if vs else (None, None, None, None)
    return res


def test_minute_rollup_matches_raw_computed_independently():
    raw = _samples(5)
    got = tier_rollup.minute_rollup(raw)
    assert got.height == 5 * len(GPUS)
    assert set(got.columns) >= {"power_w_min", "temp_c_last", "fb_used_bytes_max", "nvlink_rx_bytes_per_s_mean"}
    rows = raw.to_dicts()
    for field in ("power_w", "util_ratio", "temp_c", "fb_used_bytes"):
        exp = _expected(rows, field)
        for r in got.iter_rows(named=True):
            e = exp[(r["bucket"], r["gpu_uuid"])]
            assert (r[f"{field}_min"], r[f"{field}_max"], r[f"{field}_last"]) == (e[0], e[1], e[3]), (field, r["bucket"], r["gpu_uuid"])
            assert r[f"{field}_mean"] == pytest.approx(e[2], rel=1e-12)
    assert got["samples"].to_list() == [6] * got.height
    assert got["fb_used_bytes_min"].dtype == pl.Int64  # an integer field keeps its type but for the mean
    # a field no sample carries is null in every aggregate, not zero
    assert got["sm_active_ratio_max"].null_count() == got.height


def test_hour_rollup_from_minutes_matches_raw():
    raw = _samples(120)
    hours = tier_rollup.hour_rollup(tier_rollup.minute_rollup(raw))
    assert hours.height == 2 * len(GPUS)
    for r in hours.iter_rows(named=True):
        vals = raw.filter((pl.col("gpu_uuid") == r["gpu_uuid"]) & (pl.col("ts").dt.truncate("1h") == r["bucket"])).sort("ts")
        p = vals["power_w"].to_list()
        assert (r["power_w_min"], r["power_w_max"], r["power_w_last"]) == (min(p), max(p), p[-1])
        assert r["power_w_mean"] == pytest.approx(sum(p) / len(p), rel=1e-12)  # present in every sample: exact
        assert r["samples"] == 360
        t = [v for v in vals["temp_c"].to_list() if v is not None]
        assert (r["temp_c_min"], r["temp_c_max"]) == (min(t), max(t))
    assert hours["gpu_energy_j"].null_count() == hours.height  # no energy roll-up given: unknown, not 0


def test_advance_rolls_incrementally_with_exact_energy(store):
    raw = _samples(130)
    store.write_frames([(F.GPU_SAMPLE, raw)], source="test")
    energy_rollup.rollup_window(store, T0, T0 + dt.timedelta(minutes=130))
    # first tick: 61 minutes after T0 plus the settling time; only closed minutes are rolled
    out = tiers.advance(store, T0 + dt.timedelta(minutes=61) + tiers.SETTLE)
    assert out["minute"]["watermark"] == (T0 + dt.timedelta(minutes=61)).isoformat()
    assert out["minute"]["rows"] == 61 * len(GPUS)
    assert out["hour"]["rows"] == len(GPUS) and out["hour"]["watermark"] == (T0 + dt.timedelta(hours=1)).isoformat()
    # second tick reads only what closed since: one hour's worth of new minutes
    out2 = tiers.advance(store, T0 + dt.timedelta(minutes=125) + tiers.SETTLE)
    assert out2["minute"]["buckets"] == 125 - 61 and out2["minute"]["rows"] == (125 - 61) * len(GPUS)
    assert out2["hour"]["buckets"] == 1
    again = tiers.advance(store, T0 + dt.timedelta(minutes=125) + tiers.SETTLE)
    assert again["minute"]["rows"] == 0 and again["hour"]["rows"] == 0  # nothing re-read
    minutes = store.read("gpu_sample_minute")
    assert minutes.height == 125 * len(GPUS)
    em = store.read("gpu_energy_minute")
    joined = minutes.join(em, left_on=["bucket", "gpu_uuid"], right_on=["minute", "gpu_uuid"])
    assert joined.height == minutes.height
    assert (joined["gpu_energy_j"] - joined["energy_j"]).abs().max() == 0.0  # exactly the energy roll-up's figure
    hours = store.read("gpu_sample_hour").sort("bucket", "gpu_uuid")
    assert hours.height == 2 * len(GPUS)
    first = hours.filter((pl.col("gpu_uuid") == "GPU-aaaa") & (pl.col("bucket") == T0)).row(0, named=True)
    e = em.filter((pl.col("gpu_uuid") == "GPU-aaaa") & (pl.col("minute") < T0 + dt.timedelta(hours=1)))["energy_j"].sum()
    assert first["gpu_energy_j"] == pytest.approx(e, rel=1e-12)
    # the counter rose by power x 10 s per sample: the hour's energy is the sum of those steps (the hour's
    # first interval starts at the previous hour's last sample, which here is T0's own: none before it)
    rawa = raw.filter(pl.col("gpu_uuid") == "GPU-aaaa").sort("ts")
    steps = rawa.filter(pl.col("ts") < T0 + dt.timedelta(hours=1))["power_w"].to_list()
    assert first["gpu_energy_j"] == pytest.approx(sum(steps[:-1]) * INTERVAL_S + steps[-1] * INTERVAL_S, rel=1e-9)
    p = rawa.filter(pl.col("ts") < T0 + dt.timedelta(hours=1))["power_w"]
    assert first["power_w_max"] == p.max() and first["power_w_mean"] == pytest.approx(p.mean(), rel=1e-12)


def test_advance_skips_a_gap_and_waits_for_the_first_sample(store):
    assert tiers.advance(store, T0)["minute"]["watermark"] is None  # nothing to roll yet
    store.write_frames([(F.GPU_SAMPLE, _samples(3))], source="a")
    store.write_frames([(F.GPU_SAMPLE, _samples(3, T0 + dt.timedelta(days=3)))], source="b")
    out = tiers.advance(store, T0 + dt.timedelta(days=3, minutes=10))
    # two chunks with data, not 3 days of empty hour-long chunks
    assert out["minute"]["chunks"] == 2 and out["minute"]["rows"] == 6 * len(GPUS)
    assert out["minute"]["watermark"] == (T0 + dt.timedelta(days=3, minutes=7)).isoformat()


def test_tier_choice_by_range_and_retention():
    end = T0
    assert tiers.choose_tier(end - dt.timedelta(hours=1), end) == "raw"
    assert tiers.choose_tier(end - dt.timedelta(hours=24), end) == "minute"
    assert tiers.choose_tier(end - dt.timedelta(days=30), end) == "hour"
    # a 1-hour range older than the raw retention goes to the minute tier, older than the minute tier's to the hour tier
    days = {"raw": 30, "minute": 90}
    assert tiers.choose_tier(end - dt.timedelta(days=40, hours=1), end - dt.timedelta(days=40), now=end, retention_days=days) == "minute"
    assert tiers.choose_tier(end - dt.timedelta(days=100, hours=1), end - dt.timedelta(days=100), now=end, retention_days=days) == "hour"


def spy_queries(store) -> list[str]:  # type: ignore[no-untyped-def]
    """Every statement ``store.query`` runs from now on (the store is the test's own)."""
    seen: list[str] = []
    real = store.query

    def spy(sql, params=(), schema_=None, small=False):  # type: ignore[no-untyped-def]
        seen.append(sql)
        return real(sql, params, schema_, small)

    store.query = spy  # type: ignore[method-assign]
    return seen


def test_thirty_day_fleet_series_reads_the_hour_tier_not_raw(store):
    store.write_frames([(F.GPU_SAMPLE, _samples(130))], source="test")
    tiers.advance(store, T0 + dt.timedelta(minutes=130) + tiers.SETTLE)
    end = T0 + dt.timedelta(hours=2)
    real = store.query
    seen = spy_queries(store)
    df = telemetry.fleet_series(store, end - dt.timedelta(days=30), end, points=48)
    assert seen and not any("gpu_sample " in s or "gpu_sample\n" in s or s.rstrip().endswith("gpu_sample") for s in seen)
    assert all("gpu_sample_hour" in s for s in seen)
    # the last point (at `end`) covers both hours; its fleet power is the sum over GPUs of each GPU's mean of hour means
    last = df.row(-1, named=True)
    hours = store.read("gpu_sample_hour")
    exp = hours.group_by("gpu_uuid").agg(pl.col("power_w_mean").mean())["power_w_mean"].sum()
    assert last["gpus_reporting"] == 3 and last["power_w"] == pytest.approx(exp, rel=1e-12)
    assert last["temp_max_c"] == 52.0
    seen.clear()
    day = telemetry.fleet_series(store, end - dt.timedelta(hours=24), end, points=4)
    # (tiers.tier_for's indexed MIN probes of how far back each tier holds aside) every read is of the minute tier
    assert all("gpu_sample_minute" in s for s in seen if not s.startswith("SELECT (SELECT MIN(bucket)")) and day.height >= 1
    seen.clear()
    telemetry.fleet_series(store, end - dt.timedelta(hours=1), end, points=2)
    assert any(RAW_READ.search(s) for s in seen)  # a short range still reads raw
    store.query = real  # type: ignore[method-assign]


def test_gpu_field_series_per_tier(store):
    raw = _samples(130)
    store.write_frames([(F.GPU_SAMPLE, raw)], source="test")
    tiers.advance(store, T0 + dt.timedelta(minutes=130) + tiers.SETTLE)
    hour = telemetry.gpu_field_series(store, "GPU-bbbb", "power_w", T0 - dt.timedelta(days=29), T0 + dt.timedelta(days=1))
    assert hour["tier"].unique().to_list() == ["hour"] and hour.height == 2
    p = raw.filter((pl.col("gpu_uuid") == "GPU-bbbb") & (pl.col("ts") < T0 + dt.timedelta(hours=1)))["power_w"]
    assert hour.row(0, named=True)["max"] == p.max() and hour.row(0, named=True)["min"] == p.min()
    minute = telemetry.gpu_field_series(store, "GPU-bbbb", "temp_c", T0, T0 + dt.timedelta(hours=12))
    assert minute["tier"][0] == "minute" and minute.height == 130
    rawser = telemetry.gpu_field_series(store, "GPU-bbbb", "temp_c", T0, T0 + dt.timedelta(minutes=1))
    assert rawser["tier"][0] == "raw" and rawser.height == 6
    with pytest.raises(ValueError):
        telemetry.gpu_field_series(store, "GPU-bbbb", "power_w; DROP TABLE gpu", T0, T0 + dt.timedelta(days=30))


def test_each_tier_has_its_own_retention(store):
    store.write_frames([(F.GPU_SAMPLE, _samples(130))], source="test")
    tiers.advance(store, T0 + dt.timedelta(minutes=130) + tiers.SETTLE)
    now = T0 + dt.timedelta(days=10, minutes=30)
    # raw 400 days; minute tier 10 days (the first 30 minutes go); hour tier 400 days (kept)
    deleted = retention.prune(store, now, 400, 1095, {"minute": 10, "hour": 400})
    assert deleted["gpu_sample_minute"] == 30 * len(GPUS)
    assert deleted["gpu_sample_hour"] == 0 and deleted["gpu_sample"] == 0
    cut = retention.cutoffs(now, 400, 1095, {"minute": 10, "hour": 20})
    assert cut["gpu_sample_hour"] == now - dt.timedelta(days=20)
    assert math.isclose((now - cut["gpu_sample_minute"]).total_seconds(), 10 * 86400)


def test_a_panel_passes_over_a_tier_retention_pruned_past_its_start(store):
    # A day's panel reads the minute tier, unless retention (FLEETSCOPE_MINUTE_TIER_RETENTION_DAYS) has pruned it
    # past the range's start: then the hour tier, which still holds it, rather than an empty chart.
    store.write_frames([(F.GPU_SAMPLE, _samples(130))], source="test")
    energy_rollup.rollup_window(store, T0, T0 + dt.timedelta(minutes=130))
    tiers.advance(store, T0 + dt.timedelta(minutes=130) + tiers.SETTLE)
    start, end = T0, T0 + dt.timedelta(hours=24)
    assert tiers.tier_for(store, start, end) == "minute"
    assert telemetry.gpu_field_series(store, GPUS[0], "power_w", start, end).height == 130
    # a range starting before any data (a young install): no tier holds its start, the range's choice stays
    assert tiers.tier_for(store, start - dt.timedelta(hours=2), end - dt.timedelta(hours=2)) == "minute"
    # raw pruned past T0 + 30 min (the minute tier kept a day longer): an hour's panel starting before the cut
    # goes to the minute tier, one after it stays on raw
    retention.prune(store, T0 + dt.timedelta(days=30, minutes=30), retention_days=30, evidence_retention_days=1095,
                    tier_retention_days={"minute": 31, "hour": 1095})
    assert tiers.oldest(store, "raw") == T0 + dt.timedelta(minutes=30) and tiers.oldest(store, "minute") == T0
    assert tiers.tier_for(store, T0 + dt.timedelta(minutes=10), T0 + dt.timedelta(minutes=70)) == "minute"
    assert tiers.tier_for(store, T0 + dt.timedelta(minutes=40), T0 + dt.timedelta(minutes=100)) == "raw"
    # the minute tier pruned likewise: the day's panel reads the hour tier, which still holds its start
    retention.prune(store, T0 + dt.timedelta(days=30, minutes=30), retention_days=30, evidence_retention_days=1095,
                    tier_retention_days={"minute": 30, "hour": 1095})
    assert tiers.oldest(store, "minute") == T0 + dt.timedelta(minutes=30) and tiers.oldest(store, "hour") == T0
    assert tiers.tier_for(store, start, end) == "hour"
    df = telemetry.gpu_field_series(store, GPUS[0], "power_w", start, end)
    assert df["tier"].to_list() == ["hour", "hour"] and df["ts"].to_list() == [T0, T0 + dt.timedelta(hours=1)]


def test_a_tier_never_rolled_leaves_the_read_on_raw(store):
    store.write_frames([(F.GPU_SAMPLE, _samples(10))], source="test")
    end = T0 + dt.timedelta(minutes=10)
    assert tiers.rolled_tiers(store) == frozenset()
    df = telemetry.fleet_series(store, end - dt.timedelta(days=30), end, points=2)  # no beat yet: raw probes
    assert df.height >= 1 and df["gpus_reporting"][-1] == 3
    assert tiers.choose_tier(end - dt.timedelta(days=30), end, rolled=frozenset({"minute"})) == "minute"


def test_a_long_range_reads_the_tier_and_raw_only_past_its_watermark(store):
    """The minute tier rolled up to 60 minutes into 90 of raw samples (beat behind the data): probes the tier has
    rolled read it, the probes after its watermark read raw and give what an all-raw read gives at those instants."""
    store.write_frames([(F.GPU_SAMPLE, _samples(90))], source="test")
    tiers.advance(store, T0 + dt.timedelta(minutes=60) + tiers.SETTLE)
    assert tiers.watermark(store, "minute") == T0 + dt.timedelta(minutes=60)
    end = T0 + dt.timedelta(minutes=90)
    real = store.query
    seen = spy_queries(store)
    mixed = telemetry.fleet_series(store, T0, end, points=9, tier="minute")
    store.query = real  # type: ignore[method-assign]
    # one query of every probe: the tier's and the raw samples'
    probes = next(s for s in seen if "gpu_sample_minute" in s and "gpus_reporting" in s)
    assert RAW_READ.search(probes)
    # every 10 minutes; the tier covers the instants whose 5-minute probe starts before minute 60
    assert mixed["ts"].to_list() == [T0 + dt.timedelta(minutes=10 * i) for i in range(1, 10)]
    assert mixed["gpus_reporting"].to_list() == [3] * 9
    tail = mixed.filter(pl.col("ts") >= T0 + dt.timedelta(minutes=70))
    raw = telemetry.fleet_series(store, T0 + dt.timedelta(minutes=60), end, points=3, tier="raw")
    assert tail.equals(raw)
    hour_of_tier = telemetry.fleet_series(store, T0, T0 + dt.timedelta(minutes=60), points=6, tier="minute")
    assert mixed.head(6).equals(hour_of_tier)
    # the tier's probe at minute 60 is the mean of each GPU's five minute means, summed over the GPUs
    minutes = store.read("gpu_sample_minute").filter(pl.col("bucket") >= T0 + dt.timedelta(minutes=55))
    assert mixed["power_w"][5] == pytest.approx(minutes.group_by("gpu_uuid").agg(pl.col("power_w_mean").mean())["power_w_mean"].sum(), rel=1e-12)
    # a page's grid of instants in one statement: each from the tier's bucket before it, raw past the watermark
    grid = telemetry.fleet_series_at(store, tuple(mixed["ts"]), tier="minute")
    assert grid["ts"].to_list() == mixed["ts"].to_list() and grid.tail(3).equals(tail)
    last = minutes.filter(pl.col("bucket") == T0 + dt.timedelta(minutes=59))
    assert grid["power_w"][5] == pytest.approx(last["power_w_mean"].sum(), rel=1e-12) and grid["gpus_reporting"][5] == 3
    assert telemetry.fleet_series_at(store, tuple(tail["ts"]), tier="raw", probe_s=15.0).equals(raw)


def test_a_tier_with_no_rows_leaves_the_read_on_raw(store):
    store.write_frames([(F.GPU_SAMPLE, _samples(10))], source="test")
    tiers._set_watermark(store, "minute", None, T0, T0)  # rolled to where the data begins: no row yet
    end = T0 + dt.timedelta(minutes=10)
    assert "minute" in tiers.rolled_tiers(store) and store.read("gpu_sample_minute").is_empty()
    assert telemetry.fleet_series(store, T0, end, points=2, tier="minute").equals(telemetry.fleet_series(store, T0, end, points=2, tier="raw"))


def test_series_tier_follows_the_range_and_what_was_rolled(store):
    assert telemetry.series_tier(store, 3600) == "raw"
    assert telemetry.series_tier(store, 30 * 86_400) == "raw"  # nothing rolled yet
    store.write_frames([(F.GPU_SAMPLE, _samples(130))], source="test")
    tiers.advance(store, T0 + dt.timedelta(minutes=130) + tiers.SETTLE)
    assert (telemetry.series_tier(store, 86_400), telemetry.series_tier(store, 30 * 86_400)) == ("minute", "hour")
    # the minute tier pruned (a retention shorter than the data's age): the day's series reads the hour tier
    retention.prune(store, T0 + dt.timedelta(days=10), retention_days=400, evidence_retention_days=1095,
                    tier_retention_days={"minute": 1, "hour": 1095})
    assert tiers.oldest(store, "minute") is None and telemetry.series_tier(store, 86_400) == "hour"


def test_a_roll_reads_bounded_chunks_and_gpu_ranges_and_rolls_the_same_rows(store, monkeypatch):
    """A roll's read is cut to ``ROLL_ROWS``: the minute tier's chunk to fewer minutes, an hour of a fleet larger
    than the hour tier's budget into ranges of GPUs (a catch-up of a day's hours of 16,384 GPUs read 23 M minute
    rows at once and ran out of memory). Cut or not, the tiers hold what the roll-ups of the whole range give."""
    raw = _samples(130)
    store.write_frames([(F.GPU_SAMPLE, raw)], source="test")
    energy_rollup.rollup_window(store, T0, T0 + dt.timedelta(minutes=130))
    energy = store.read("gpu_energy_minute", columns=["minute", "gpu_uuid", "energy_j", "covered_s"])
    want_minutes = tier_rollup.minute_rollup(raw, energy)
    want_hours = tier_rollup.hour_rollup(want_minutes.filter(pl.col("bucket") < T0 + dt.timedelta(hours=2)))
    # 18 raw rows a minute, 180 minute rows an hour: two-minute chunks, and each hour read a GPU at a time
    monkeypatch.setattr(tiers, "ROLL_ROWS", {"minute": 40, "hour": 70})
    reads: dict[str, list[int]] = {"minute": [], "hour": []}
    minute_rollup, hour_rollup = tier_rollup.minute_rollup, tier_rollup.hour_rollup
    monkeypatch.setattr(tier_rollup, "minute_rollup", lambda s, e: (reads["minute"].append(s.height), minute_rollup(s, e))[1])
    monkeypatch.setattr(tier_rollup, "hour_rollup", lambda m: (reads["hour"].append(m.height), hour_rollup(m))[1])
    out = tiers.advance(store, T0 + dt.timedelta(minutes=130) + tiers.SETTLE, max_chunks=10_000)
    assert out["minute"]["chunks"] == 65 and reads["minute"] == [36] * 65
    assert out["hour"]["chunks"] == 2 and reads["hour"] == [60] * 6  # two hours, three GPUs each
    got_minutes, got_hours = store.read("gpu_sample_minute"), store.read("gpu_sample_hour")
    assert got_minutes.sort("bucket", "gpu_uuid").equals(want_minutes.sort("bucket", "gpu_uuid"))
    assert got_hours.sort("bucket", "gpu_uuid").equals(want_hours.sort("bucket", "gpu_uuid"))

"""Closed days of raw GPU telemetry packed into per-(GPU, hour) column arrays (store/packed.py, services/packing.py,
migration 0021): on PostgreSQL a packed day reads back as its rows did, field by field (the float4 fields as
their float4 rounding, everything else exactly, NULLs and timestamps included), through every read of raw
samples; late samples are folded in by the next pack, and retention drops packed days. SQLite never packs
and reads the same."""

from __future__ import annotations

import datetime as dt
import re
import threading

import numpy as np
import polars as pl
import pytest
from sqlalchemy import text

from fleetscope.core import frames as F
from fleetscope.services import energy_reads, health, health_reads, packing, pipeline, retention, shards, telemetry, tiers
from fleetscope.store import packed, partitions

DAY = dt.datetime(2026, 10, 1, tzinfo=dt.UTC)
GPUS = [f"GPU-{g:04d}" for g in range(4)]


def _samples() -> pl.DataFrame:
    """Two days at 60 s for four GPUs with DCGM-shaped values: whole-percent utilisation, power to the mW, an
    energy counter in J with mJ digits, bytes in MiB, counters; NULLs where a source lacks a field, GPU 3
    silent from 05:00 to 07:00 and without memory temperature on day one."""
    rng = np.random.default_rng(3)
    ts = [DAY + dt.timedelta(seconds=s) for s in range(0, 2 * 86400, 60)]
    frames = []
    for g, uuid in enumerate(GPUS):
        n = len(ts)
        power = np.round(300 + 400 * rng.random(n), 3)
        df = pl.DataFrame({
            "ts": ts, "gpu_uuid": [uuid] * n,
            "util_ratio": rng.integers(0, 101, n) / 100, "sm_active_ratio": np.round(rng.random(n), 6),
            "power_w": power, "energy_j": np.round(1e7 * g + np.cumsum(power * 60), 3),
            "temp_c": rng.integers(30, 85, n).astype(float), "mem_temp_c": rng.integers(30, 90, n).astype(float),
            "sm_clock_mhz": np.where(rng.random(n) < 0.9, 1980.0, 1410.0), "fb_used_bytes": rng.integers(0, 81_920, n) * 2**20,
            "pcie_tx_bytes_per_s": rng.integers(0, 64_000_000_000, n).astype(float), "xid_last": np.where(rng.random(n) < 0.01, 79, 0),
            "power_violation_s": np.round(np.cumsum(rng.random(n)), 9),
        })
        if g == 3:
            df = df.filter(~pl.col("ts").is_between(DAY + dt.timedelta(hours=5), DAY + dt.timedelta(hours=7)))
            df = df.with_columns(pl.when(pl.col("ts") < DAY + dt.timedelta(days=1)).then(None).otherwise(pl.col("mem_temp_c")).alias("mem_temp_c"))
        if g == 2:
            df = df.with_columns(pl.when(pl.col("ts").dt.minute() % 7 == 0).then(None).otherwise(pl.col("power_w")).alias("power_w"))
        frames.append(df)
    return F.conform(F.GPU_SAMPLE, pl.concat(frames))


def _as_packed(df: pl.DataFrame, packed_days: int = 1) -> pl.DataFrame:
    """What reads of ``df`` give once its first ``packed_days`` days are packed: their float4 fields rounded."""
    inside = pl.col("ts") < DAY + dt.timedelta(days=packed_days)
    return df.with_columns(pl.when(inside).then(pl.col(c).cast(pl.Float32).cast(pl.Float64)).otherwise(pl.col(c)).alias(c)
                           for c in df.columns if c in packed.FLOAT4_FIELDS)


def _reads(store) -> dict[str, object]:  # type: ignore[no-untyped-def]
    """Every read of raw samples, over ranges inside day one, across its end and unbounded."""
    mid = DAY + dt.timedelta(hours=12, seconds=30)
    host = store.read("gpu", columns=["gpu_uuid", "host"])
    return {
        "read_all": store.read("gpu_sample"),
        "read_range": store.read("gpu_sample", start=DAY + dt.timedelta(hours=4, minutes=30), end=DAY + dt.timedelta(days=1, hours=2)),
        "read_gpu_cols": store.read("gpu_sample", gpu_uuid=[GPUS[3]], columns=["ts", "mem_temp_c", "power_w"], start=DAY, end=DAY + dt.timedelta(hours=8)),
        "read_job": store.read("gpu_sample", job_id="job-1", columns=["ts", "gpu_uuid", "energy_j"]),
        "read_limit": store.read("gpu_sample", start=DAY, limit=7),
        # the oldest rows: read in growing windows on PostgreSQL, never by unpacking every hour (Store._read_oldest);
        # GPU 3 is silent from 05:00 to 07:00, so its window grows past the gap, and past the packed day's end
        "read_oldest": store.read("gpu_sample", limit=9),
        "read_oldest_of_gpu": store.read("gpu_sample", gpu_uuid=[GPUS[3]], start=DAY + dt.timedelta(hours=4, minutes=58), limit=5),
        "read_oldest_across_days": store.read("gpu_sample", gpu_uuid=[GPUS[0]], start=DAY + dt.timedelta(hours=23, minutes=59), limit=3),
        "read_oldest_to": store.read("gpu_sample", end=DAY + dt.timedelta(minutes=3), limit=1000),
        # without the time column the rows are ordered by GPU, and a limit takes them whole, not window by window
        "read_limit_by_gpu": store.read("gpu_sample", columns=["gpu_uuid"], limit=3),
        "data_start": telemetry.data_start(store),
        "data_end": telemetry.data_end(store),
        "interval": telemetry.sample_interval_s(store, mid),
        # five minutes of the fleet through ``reads.gpu_samples_sql``, the FROM item of every fleet-wide read
        "last_minutes": shards.shard_gpu_samples(store, 0, 1, mid - dt.timedelta(minutes=5), mid,
                                                 ["gpu_uuid", "ts", "util_ratio", "power_w", "temp_c", "mem_temp_c", "xid_last"], F.GPU_SAMPLE.schema),
        "state_counts": health_reads.gpu_state_counts(store, mid, window_s=900),
        "fleet_series": telemetry.fleet_series(store, DAY + dt.timedelta(hours=1), DAY + dt.timedelta(hours=5), points=8, tier="raw"),
        "field_series": telemetry.gpu_field_series(store, GPUS[2], "power_w", DAY + dt.timedelta(hours=2), DAY + dt.timedelta(hours=3), tier="raw"),
        "gpu_energy": energy_reads.gpu_energy(store, DAY + dt.timedelta(hours=1), DAY + dt.timedelta(hours=9)),
        "counter_energy": energy_reads.counter_energy_by_site_hour(store, DAY + dt.timedelta(hours=20), DAY + dt.timedelta(hours=26)),
        "clock_p90": health.fleet_loaded_clock_p90(store, DAY, DAY + dt.timedelta(hours=6)),
        "shard": shards.shard_gpu_samples(store, 0, 1, DAY + dt.timedelta(hours=23), DAY + dt.timedelta(days=1, hours=1),
                                          ["gpu_uuid", "ts", "temp_c", "xid_last"], F.GPU_SAMPLE.schema),
        "hosts": host.height,
    }


def _assert_same(before: dict[str, object], after: dict[str, object], packed_day: bool) -> None:
    from polars.testing import assert_frame_equal

    for name, b in before.items():
        a = after[name]
        if not packed_day or not isinstance(b, pl.DataFrame | float):
            assert (a.equals(b) if isinstance(b, pl.DataFrame) else a == b), name
        elif isinstance(b, float):
            assert a == pytest.approx(b, rel=1e-6), name
        elif name == "field_series":  # power_w of one GPU, as min, max, mean and last
            assert a.equals(b.with_columns(pl.col("min", "max", "mean", "last").cast(pl.Float32).cast(pl.Float64))), name
        elif name in ("fleet_series", "gpu_energy", "counter_energy"):
            # aggregates over float4-rounded inputs: the same to float4's precision
            assert_frame_equal(a, b, check_exact=False, rel_tol=1e-6, abs_tol=1e-6)
        else:
            assert a.equals(_as_packed(b)), name


def _write(store, df: pl.DataFrame) -> None:  # type: ignore[no-untyped-def]
    inv = pl.DataFrame({"gpu_uuid": GPUS, "host": ["h0", "h0", "h1", "h1"], "gpu_index": [0, 1, 0, 1]})
    hosts = pl.DataFrame({"host": ["h0", "h1"], "site_id": ["s1", "s1"]})
    site = pl.DataFrame({"site_id": ["s1"], "name": ["one"], "country": ["DEU"]})
    store.write(F.Batch(source="t", site=F.conform(F.SITE, site), host=F.conform(F.HOST, hosts), gpu=F.conform(F.GPU, inv), gpu_sample=df))
    rank = pl.DataFrame({"job_id": ["job-1"], "rank": [0], "start": [DAY + dt.timedelta(hours=3)],
                         "end": [DAY + dt.timedelta(days=1, hours=1)], "gpu_uuid": [GPUS[1]], "host": ["h0"]})
    store.write_frames([(F.JOB_RANK, F.conform(F.JOB_RANK, rank))], source="t")


def test_a_packed_day_reads_back_as_its_rows_through_every_raw_read(store):
    df = _samples()
    _write(store, df)
    tiers.advance(store, DAY + dt.timedelta(days=1, minutes=5), max_chunks=10_000)
    before = _reads(store)
    assert before["read_all"].equals(df.sort("ts", "gpu_uuid")) and before["read_job"].height > 0
    assert before["read_limit_by_gpu"]["gpu_uuid"].to_list() == [GPUS[0]] * 3
    assert before["fleet_series"].height == 8 and before["gpu_energy"].height > 0 and before["counter_energy"].height > 0

    done = packing.pack_closed(store, DAY + dt.timedelta(days=3))
    if store.dialect == "sqlite":
        assert done == {}
        _assert_same(before, _reads(store), packed_day=False)
        return
    # day one only: day two's end is past the minute tier's watermark
    day1 = df.filter(pl.col("ts") < DAY + dt.timedelta(days=1))
    assert done == {"2026-10-01": {"samples": day1.height, "rows": 4 * 24 - 2}}
    with store.engine.connect() as conn:
        raw_left = conn.execute(text(f'SELECT count(*) FROM "{partitions.partition_name("gpu_sample", DAY.date())}"')).scalar()
        nulls = conn.execute(text(f"SELECT count(*) FROM {packed.TABLE} WHERE gpu_uuid = 'GPU-0003' AND mem_temp_c IS NULL")).scalar()
    assert raw_left == 0 and nulls == 24 - 2  # an all-NULL field of a GPU-hour is stored as NULL, not an array
    assert store.counts()["gpu_sample"] == df.height
    after = _reads(store)
    _assert_same(before, after, packed_day=True)
    # the rows outside the packed day are untouched, bit for bit
    day2 = after["read_all"].filter(pl.col("ts") >= DAY + dt.timedelta(days=1))
    assert day2.equals(df.filter(pl.col("ts") >= DAY + dt.timedelta(days=1)).sort("ts", "gpu_uuid"))
    # energy_j and the integer fields keep every digit
    assert after["read_all"].select("energy_j", "fb_used_bytes", "power_violation_s").equals(
        before["read_all"].select("energy_j", "fb_used_bytes", "power_violation_s"))


def _last_read_sql(store, job_id: str) -> str:  # type: ignore[no-untyped-def]
    """The SQL ``Store.read`` runs for a job's samples, its parameters bound (for EXPLAIN)."""
    from fleetscope.store.sql import bind

    seen: list[str] = []
    real = store._fetch

    def grab(sql, params, *rest):  # type: ignore[no-untyped-def]
        seen.append(bind(sql, params))
        return real(sql, params, *rest)

    store._fetch = grab
    try:
        store.read("gpu_sample", job_id=job_id, columns=["ts", "gpu_uuid", "energy_j"])
    finally:
        del store._fetch
    return seen[-1]


def _packed_day_one(store) -> pl.DataFrame:  # type: ignore[no-untyped-def]
    """The two days of ``_samples`` written, rolled and day one packed (PostgreSQL only); the samples."""
    if store.dialect == "sqlite":
        pytest.skip("SQLite does not pack")
    df = _samples()
    _write(store, df)
    tiers.advance(store, DAY + dt.timedelta(days=1, minutes=5), max_chunks=10_000)
    packing.pack_closed(store, DAY + dt.timedelta(days=3))
    return df


def test_a_read_of_the_oldest_rows_unpacks_a_bounded_window_not_every_packed_day(store, monkeypatch):
    """``GET /api/v1/frames/gpu_sample?limit=10`` asks for the oldest rows held. Every packed hour an unbounded
    read reaches is unpacked before it is sorted, so over a fleet's packed history that read would take hours; it
    is read in windows from the oldest row instead, each bounded."""
    df = _packed_day_one(store)
    asked: list[tuple[object, object]] = []
    real = packed.source

    def spy(dialect, start, end, columns=None, alias="gpu_sample", packed_until=None):  # type: ignore[no-untyped-def]
        asked.append((start, end))
        return real(dialect, start, end, columns, alias, packed_until)

    monkeypatch.setattr(packed, "source", spy)
    got = store.read("gpu_sample", limit=10)
    assert got.equals(_as_packed(df).sort("ts", "gpu_uuid").head(10))
    # the first minute held has the 4 GPUs' first samples, too few; the first 8 minutes have 32
    assert asked == [(DAY, DAY + dt.timedelta(minutes=1)), (DAY, DAY + dt.timedelta(minutes=8))]
    asked.clear()
    sparse = store.read("gpu_sample", gpu_uuid=[GPUS[3]], start=DAY + dt.timedelta(hours=4, minutes=59, seconds=30), limit=2)
    assert sparse["ts"].to_list() == [DAY + dt.timedelta(hours=7, minutes=1), DAY + dt.timedelta(hours=7, minutes=2)]
    assert all(s is not None and e is not None for s, e in asked) and len(asked) == 4  # 1, 8, 64 and 512 minutes
    # a job's samples are read over the span its ranks held GPUs (03:00 to 01:00 the next day), never all history
    asked.clear()
    job = store.read("gpu_sample", job_id="job-1", columns=["ts", "gpu_uuid", "energy_j"])
    assert asked == [(DAY + dt.timedelta(hours=3), DAY + dt.timedelta(days=1, hours=1))]
    assert job.height == 22 * 60 and job["gpu_uuid"].unique().to_list() == [GPUS[1]]
    asked.clear()
    assert store.read("gpu_sample", job_id="no-such-job").height == 0 and asked[0][0] == asked[0][1]
    # and over the job's GPUs only, before the unpacking: GPU 1's packed hours, not the fleet's
    with store.engine.connect() as conn:
        plan = "\n".join(r[0] for r in conn.execute(text("EXPLAIN " + _last_read_sql(store, "job-1"))))
    assert "'GPU-0001'" in plan and "'GPU-0000'" not in plan


def test_late_samples_of_a_packed_day_are_read_once_and_folded_in_by_the_next_pack(store):
    df = _packed_day_one(store)
    # GPU 3's gap filled late, and a re-sent sample that only adds a field the stored copy lacked
    late = df.filter(pl.col("gpu_uuid") == GPUS[0]).filter(pl.col("ts").is_between(DAY + dt.timedelta(hours=5), DAY + dt.timedelta(hours=5, minutes=10)))
    late = late.with_columns(pl.lit(GPUS[3]).alias("gpu_uuid"))
    resent = df.filter((pl.col("gpu_uuid") == GPUS[3]) & (pl.col("ts") == DAY + dt.timedelta(hours=1))).with_columns(
        pl.lit(55.0).alias("mem_temp_c"), pl.lit(1.0).alias("power_w"))
    partitions.forget_all(store.engine)
    store.write(F.Batch(source="late", gpu_sample=pl.concat([late, resent])))
    between = store.read("gpu_sample", gpu_uuid=GPUS[3], start=DAY, end=DAY + dt.timedelta(days=1))
    # before the next pack: the late rows as rows, and the re-sent sample read once, as the packed copy stored first
    day_one = df.filter((pl.col("gpu_uuid") == GPUS[3]) & (pl.col("ts") < DAY + dt.timedelta(days=1)))
    assert between.equals(pl.concat([_as_packed(day_one), late]).sort("ts"))
    assert store.read("gpu_sample", start=DAY, end=DAY + dt.timedelta(days=2)).height == df.height + late.height
    # the services' reads too (``reads.gpu_samples_sql``): ten minutes at 60 s around the re-sent one, ten samples
    around = shards.shard_gpu_samples(store, 0, 1, DAY + dt.timedelta(hours=1, minutes=-5), DAY + dt.timedelta(hours=1, minutes=5),
                                      ["gpu_uuid", "ts"], F.GPU_SAMPLE.schema)
    assert around.filter(pl.col("gpu_uuid") == GPUS[3]).height == 10
    assert packing.packable_days(store, DAY + dt.timedelta(days=3)) == [DAY.date()]
    packing.pack_closed(store, DAY + dt.timedelta(days=3))
    got = store.read("gpu_sample", gpu_uuid=GPUS[3], start=DAY, end=DAY + dt.timedelta(days=1))
    want = _as_packed(pl.concat([df.filter((pl.col("gpu_uuid") == GPUS[3]) & (pl.col("ts") < DAY + dt.timedelta(days=1))), late]).sort("ts"))
    # the packed copy's values stay (power_w), its missing memory temperature is filled from the re-sent one
    want = want.with_columns(pl.when(pl.col("ts") == DAY + dt.timedelta(hours=1)).then(55.0).otherwise(pl.col("mem_temp_c")).alias("mem_temp_c"))
    assert got.equals(want)
    assert packing.packable_days(store, DAY + dt.timedelta(days=3)) == []


def test_retention_drops_packed_days_whole_and_to_the_hour(store):
    if store.dialect == "sqlite":
        pytest.skip("SQLite does not pack")
    df = _samples()
    _write(store, df)
    tiers.advance(store, DAY + dt.timedelta(days=2, minutes=5), max_chunks=10_000)
    assert set(packing.pack_closed(store, DAY + dt.timedelta(days=3))) == {"2026-10-01", "2026-10-02"}
    now = DAY + dt.timedelta(days=3, hours=12, minutes=30)
    deleted = retention.prune(store, now, retention_days=2, evidence_retention_days=10_000)
    # cutoff 2026-10-02 12:30: day one's partition goes whole, day two's hours ending by 12:30, 12:00's stays
    assert deleted[packed.TABLE] == 4 * 24 - 2 + 4 * 12
    assert [d for _, d in partitions.partitions(store.engine, packed.TABLE)] == [dt.date(2026, 10, 2)]
    left = store.read("gpu_sample")
    assert left["ts"].min() == DAY + dt.timedelta(days=1, hours=12)
    assert left.height == df.filter(pl.col("ts") >= DAY + dt.timedelta(days=1, hours=12)).height


def test_a_pack_stopped_half_way_leaves_whole_hours_and_the_next_one_finishes(store, monkeypatch):
    if store.dialect == "sqlite":
        pytest.skip("SQLite does not pack")
    df = _samples()
    _write(store, df)
    tiers.advance(store, DAY + dt.timedelta(days=1, minutes=5), max_chunks=10_000)
    before = _reads(store)
    real = packed.pack_sql

    def failing(day, merge, hour):  # type: ignore[no-untyped-def]
        if hour >= DAY + dt.timedelta(hours=5):
            raise RuntimeError("worker killed")
        return real(day, merge, hour)

    monkeypatch.setattr(packed, "pack_sql", failing)
    with pytest.raises(RuntimeError, match="worker killed"):
        packing.pack_closed(store, DAY + dt.timedelta(days=3))
    # hours 00-04 packed and gone from the raw partition, the rest still raw: every read the same, no sample twice
    with store.engine.connect() as conn:
        hours = conn.execute(text(f"SELECT DISTINCT hour FROM {packed.TABLE} ORDER BY 1")).scalars().all()
        raw_min = conn.execute(text(f'SELECT min(ts) FROM "{partitions.partition_name("gpu_sample", DAY.date())}"')).scalar()
    assert [h.astimezone(dt.UTC) for h in hours] == [DAY + dt.timedelta(hours=h) for h in range(5)]
    assert raw_min.astimezone(dt.UTC) == DAY + dt.timedelta(hours=5)
    assert store.counts()["gpu_sample"] == df.height
    half = _reads(store)
    assert half["read_all"].filter(pl.col("ts") >= DAY + dt.timedelta(hours=5)).equals(
        before["read_all"].filter(pl.col("ts") >= DAY + dt.timedelta(hours=5)))
    assert half["read_all"].filter(pl.col("ts") < DAY + dt.timedelta(hours=5)).equals(
        _as_packed(before["read_all"]).filter(pl.col("ts") < DAY + dt.timedelta(hours=5)))
    # the next tick goes on from hour 05 and empties the raw partition
    monkeypatch.setattr(packed, "pack_sql", real)
    assert packing.packable_days(store, DAY + dt.timedelta(days=3)) == [DAY.date()]
    done = packing.pack_closed(store, DAY + dt.timedelta(days=3))
    assert done == {"2026-10-01": {"samples": df.filter(pl.col("ts") < DAY + dt.timedelta(days=1)).height, "rows": 4 * 24 - 2}}
    _assert_same(before, _reads(store), packed_day=True)


def _open_day(store, hours: int = 6) -> pl.DataFrame:  # type: ignore[no-untyped-def]
    """``hours`` of the day under way at 60 s, four GPUs, power only, rolled into the minute tier to its end."""
    ts = [DAY + dt.timedelta(seconds=s) for s in range(0, hours * 3600, 60)]
    df = F.conform(F.GPU_SAMPLE, pl.DataFrame({"ts": ts * 4, "gpu_uuid": [g for g in GPUS for _ in ts],
                                               "power_w": [100.0 + 10 * g + i / 8 for g in range(4) for i in range(len(ts))]}))
    store.write(F.Batch(source="t", gpu_sample=df))
    tiers.advance(store, DAY + dt.timedelta(hours=hours, minutes=5), max_chunks=10_000)
    return df


def _raw_rows_before(store, t: dt.datetime) -> int:  # type: ignore[no-untyped-def]
    with store.engine.connect() as conn:
        return conn.execute(text(f'SELECT count(*) FROM "{partitions.partition_name("gpu_sample", DAY.date())}" WHERE ts < :t'), {"t": t}).scalar()


def test_the_hours_of_the_day_under_way_are_packed_while_agents_write_it(store):
    if store.dialect == "sqlite":
        pytest.skip("SQLite does not pack")
    df = _open_day(store, hours=12)
    now = DAY + dt.timedelta(hours=7, minutes=2)
    # ended an hour ago and passed by the minute tier: 00:00 to 06:00; the day itself is not closed
    assert packing.HOUR_GRACE == dt.timedelta(hours=1)
    assert packing.packable_hours(store, now) == [DAY + dt.timedelta(hours=h) for h in range(6)]
    assert packing.packable_days(store, now) == []
    # an hour on with no tick, the service says so: the hours packable an hour before are overdue
    overdue = pipeline.status(store, now + dt.timedelta(hours=1), tasks=False)["packing_overdue_hours"]
    assert overdue == [(DAY + dt.timedelta(hours=h)).isoformat() for h in range(6)]
    stop = threading.Event()
    written: list[int] = []

    def agent() -> None:  # the newest minutes keep arriving while the hours are packed, and one late sample of 02:30
        i = 0
        while not stop.is_set() and i < 200:
            at = DAY + dt.timedelta(hours=12, seconds=i)
            store.write(F.Batch(source=f"live-{i}", gpu_sample=F.conform(F.GPU_SAMPLE, pl.DataFrame(
                {"ts": [at, DAY + dt.timedelta(hours=2, minutes=30, seconds=1 + i)], "gpu_uuid": [GPUS[0], "GPU-late"], "power_w": [1.0, 2.0]}))))
            written.append(i)
            i += 1

    thread = threading.Thread(target=agent)
    thread.start()
    try:
        done = packing.pack_hours(store, now)
    finally:
        stop.set()
        thread.join(60)
    assert done == {(DAY + dt.timedelta(hours=h)).isoformat(): "packed" for h in range(6)} and written
    # a late sample that landed after its hour's pack is a row until the next tick folds it in
    packing.pack_hours(store, now)
    assert _raw_rows_before(store, DAY + dt.timedelta(hours=6)) == 0
    assert pipeline.status(store, now + dt.timedelta(hours=1), tasks=False)["packing_overdue_hours"] == []
    got = store.read("gpu_sample", columns=["ts", "gpu_uuid", "power_w"])
    late = got.filter(pl.col("gpu_uuid") == "GPU-late")
    live = got.filter(pl.col("ts") >= DAY + dt.timedelta(hours=12))
    assert late.height == len(written) == live.height and late["ts"].n_unique() == late.height  # each exactly once
    mine = got.filter(pl.col("gpu_uuid").is_in(GPUS) & (pl.col("ts") < DAY + dt.timedelta(hours=12)))
    want = df.select("ts", "gpu_uuid", "power_w").sort("ts", "gpu_uuid")
    # the packed hours read as their float4 rounding, the hour still raw exactly
    packed_part = pl.col("ts") < DAY + dt.timedelta(hours=6)
    want = want.with_columns(pl.when(packed_part).then(pl.col("power_w").cast(pl.Float32).cast(pl.Float64)).otherwise(pl.col("power_w")))
    assert mine.equals(want)


def test_an_hour_whose_row_a_writer_changed_during_its_pack_is_left_whole_for_the_next_tick(store, monkeypatch):
    if store.dialect == "sqlite":
        pytest.skip("SQLite does not pack")
    _open_day(store, hours=7)
    now = DAY + dt.timedelta(hours=1, minutes=2) + packing.HOUR_GRACE  # the first hour alone is packable
    real = packed.pack_sql

    def racing(day, merge, hour):  # type: ignore[no-untyped-def]
        statements = real(day, merge, hour)
        yield from statements[:-1]
        # between the pack and its delete, an agent re-sends a sample of the hour with a field it lacked
        store.write(F.Batch(source="resent", gpu_sample=F.conform(F.GPU_SAMPLE, pl.DataFrame(
            {"ts": [hour + dt.timedelta(minutes=7)], "gpu_uuid": [GPUS[1]], "power_w": [0.0], "temp_c": [51.0]}))))
        yield statements[-1]

    monkeypatch.setattr(packed, "pack_sql", racing)
    done = packing.pack_hours(store, now)
    assert done == {DAY.isoformat(): "left for the next tick: SerializationFailure"}
    # nothing of the hour moved: every sample still a row, none packed
    assert _raw_rows_before(store, DAY + dt.timedelta(hours=1)) == 4 * 60
    with store.engine.connect() as conn:
        assert conn.execute(text(f"SELECT count(*) FROM {packed.TABLE}")).scalar() == 0
    monkeypatch.setattr(packed, "pack_sql", real)
    assert packing.pack_hours(store, now) == {DAY.isoformat(): "packed"}
    one = store.read("gpu_sample", gpu_uuid=GPUS[1], start=DAY + dt.timedelta(minutes=7), end=DAY + dt.timedelta(minutes=8))
    assert one.select("power_w", "temp_c").rows() == [(pytest.approx(110.875), 51.0)]  # the stored power kept, the field filled


def _ten_second_day(store, hours: int) -> pl.DataFrame:  # type: ignore[no-untyped-def]
    """``hours`` of the day under way at 10 s for the four GPUs, utilisation, power, temperature and an energy
    counter random per sample (a minute's mean is then no single sample's value), rolled to its end."""
    rng = np.random.default_rng(11)
    ts = [DAY + dt.timedelta(seconds=s) for s in range(0, hours * 3600, 10)]
    n = len(ts)
    power = np.round(200 + 500 * rng.random(4 * n), 3)
    df = F.conform(F.GPU_SAMPLE, pl.DataFrame({
        "ts": ts * 4, "gpu_uuid": [g for g in GPUS for _ in ts], "util_ratio": rng.integers(0, 101, 4 * n) / 100,
        "power_w": power, "temp_c": rng.integers(30, 90, 4 * n).astype(float),
        "energy_j": np.concatenate([1e6 * g + np.cumsum(power[g * n:(g + 1) * n] * 10) for g in range(4)]).round(3)}))
    _write(store, df)
    tiers.advance(store, DAY + dt.timedelta(hours=hours, minutes=5), max_chunks=10_000)
    return df


def _point(df: pl.DataFrame, lo: dt.datetime, hi: dt.datetime) -> tuple[int, float, float, float]:
    """A fleet point computed here from the written samples in ``[lo, hi)``: GPUs, mean utilisation, power, hottest."""
    per = (df.filter((pl.col("ts") >= lo) & (pl.col("ts") < hi)).group_by("gpu_uuid")
           .agg(pl.col("util_ratio").mean().alias("u"), pl.col("power_w").mean().alias("p"), pl.col("temp_c").max().alias("t")))
    return per.height, per["u"].mean(), per["p"].sum(), per["t"].max()


def _packed_hours_read(sql: str) -> set[dt.datetime]:
    """The hours of packed rows a statement unpacks for the fleet (``store.packed.source``'s arms)."""
    hours: set[dt.datetime] = set()
    for group in re.findall(r"p\.hour IN \(([^)]*)\)", sql):
        hours |= {dt.datetime.fromisoformat(t) for t in re.findall(r"TIMESTAMPTZ '([^']+)'", group)}
    for a, b in re.findall(r"p\.hour >= TIMESTAMPTZ '([^']+)' AND p\.hour < TIMESTAMPTZ '([^']+)'", sql):
        h = dt.datetime.fromisoformat(a)
        while h < dt.datetime.fromisoformat(b):
            hours.add(h)
            h += dt.timedelta(hours=1)
    return hours


def _statements_of(store, monkeypatch) -> list[str]:  # type: ignore[no-untyped-def]
    """The SQL of every bulk read ``store`` runs from now on, in order."""
    statements: list[str] = []
    fetch = store._fetch

    def seen(sql, *args):  # type: ignore[no-untyped-def]
        statements.append(sql)
        return fetch(sql, *args)

    monkeypatch.setattr(store, "_fetch", seen)
    return statements


def test_fleet_probes_and_energy_readings_in_packed_hours_read_the_minute_tier_not_every_gpus_hour(store, monkeypatch):
    """A packed hour is one array row per GPU, so a probe of a few seconds in it would unpack the hour for every
    GPU (six hours of a 1,024-GPU panel: 6.8 s). Such probes read the minute tier's last full minute before the
    instant, and the counter readings of an energy total the counter interpolated within its minute; probes in hours still
    raw read the samples of the last 1.5 intervals as before. Expected values are computed here from the samples."""
    df = _ten_second_day(store, hours=8)
    if store.dialect == "postgresql":
        done = packing.pack_hours(store, DAY + dt.timedelta(hours=6) + packing.HOUR_GRACE)
        assert sorted(done) == [(DAY + dt.timedelta(hours=h)).isoformat() for h in range(6)]
    packed_until = DAY + dt.timedelta(hours=6 if store.dialect == "postgresql" else 0)
    statements = _statements_of(store, monkeypatch)
    series = telemetry.fleet_series(store, DAY + dt.timedelta(hours=2), DAY + dt.timedelta(hours=8), points=12, tier="raw")
    grid = telemetry.fleet_series_at(store, [DAY + dt.timedelta(hours=3, minutes=7, seconds=30), DAY + dt.timedelta(hours=7, minutes=7, seconds=30)])
    early = energy_reads.gpu_energy(store, DAY + dt.timedelta(hours=1), DAY + dt.timedelta(hours=5, minutes=30))
    across = energy_reads.gpu_energy(store, DAY + dt.timedelta(hours=2, seconds=5), DAY + dt.timedelta(hours=7, seconds=5))
    unpacked = set().union(*(_packed_hours_read(sql) for sql in statements))
    assert len(statements) > 4 and not {h for h in unpacked if h < packed_until}  # no packed hour was unpacked
    assert series.height == 12 and grid.height == 2
    for row in [*series.iter_rows(named=True), *grid.iter_rows(named=True)]:
        at = row["ts"]
        if at - dt.timedelta(seconds=15) < packed_until:
            minute = at.replace(second=0, microsecond=0)
            want = _point(df, minute - dt.timedelta(minutes=1), minute)
        else:  # 1.5 sample intervals: the one sample 10 s before the instant
            want = _point(df, at - dt.timedelta(seconds=15), at)
        got = (row["gpus_reporting"], row["util_mean_ratio"], row["power_w"], row["temp_max_c"])
        assert got[0] == want[0] == 4 and got[1:] == pytest.approx(want[1:], rel=1e-9), at

    def reading(t: dt.datetime) -> pl.DataFrame:
        return df.filter(pl.col("ts") == t).select("gpu_uuid", "energy_j")

    def total(a: dt.datetime, b: dt.datetime) -> float:
        return float(reading(b).join(reading(a), on="gpu_uuid").select((pl.col("energy_j") - pl.col("energy_j_right")).sum()).item())

    if store.dialect == "postgresql":
        # opening in a packed hour on a minute's edge: that minute's first reading; closing in one: the last full minute's last
        assert early["energy_j"].to_list() == pytest.approx([total(DAY + dt.timedelta(hours=1), DAY + dt.timedelta(hours=5, minutes=29, seconds=50))])
        # opening 5 s into a minute, which its six samples' spacing places at its first (taken at :05, it was at :00);
        # closing in a raw hour: the last sample before the end
        assert across["energy_j"].to_list() == pytest.approx([total(DAY + dt.timedelta(hours=2), DAY + dt.timedelta(hours=7))])
    else:  # raw samples throughout: the first reading in the opening probe, the last in the closing one
        assert early["energy_j"].to_list() == pytest.approx([total(DAY + dt.timedelta(hours=1), DAY + dt.timedelta(hours=5, minutes=29, seconds=50))])
        assert across["energy_j"].to_list() == pytest.approx([total(DAY + dt.timedelta(hours=2, seconds=10), DAY + dt.timedelta(hours=7))])
    assert early["gpus"].to_list() == across["gpus"].to_list() == [4]
    if store.dialect != "postgresql":
        return
    # past the minute tier's retention (it keeps less than raw) a packed hour is read after all: the raw points
    with store.engine.begin() as conn:
        conn.execute(text("DELETE FROM gpu_sample_minute WHERE bucket < :t"), {"t": DAY + dt.timedelta(hours=4)})
    pruned = telemetry.fleet_series(store, DAY + dt.timedelta(hours=2), DAY + dt.timedelta(hours=8), points=12, tier="raw")
    assert pruned.height == 12
    for row in pruned.iter_rows(named=True):
        at = row["ts"]
        if at < DAY + dt.timedelta(hours=4, minutes=2, seconds=15):
            want = _point(_as_packed(df), at - dt.timedelta(seconds=15), at)
        elif at - dt.timedelta(seconds=15) < packed_until:
            minute = at.replace(second=0, microsecond=0)
            want = _point(df, minute - dt.timedelta(minutes=1), minute)
        else:
            want = _point(df, at - dt.timedelta(seconds=15), at)
        got = (row["gpus_reporting"], row["util_mean_ratio"], row["power_w"], row["temp_max_c"])
        assert got[0] == want[0] == 4 and got[1:] == pytest.approx(want[1:], rel=1e-6), at


def test_live_panel_anchored_in_a_packed_hour_reads_the_minute_tier(store, monkeypatch):
    """The Overview's live panel at a past instant (a time in its URL) reads each GPU's latest sample of the last
    minute and its mean utilisation over five minutes: in a packed hour that would unpack the hour for every GPU, so
    there it reads the minute tier (the last whole minute's last readings, the minutes' means). Expected values are
    computed here from the samples."""
    df = _ten_second_day(store, hours=4)
    on_pg = store.dialect == "postgresql"
    if on_pg:
        assert len(packing.pack_hours(store, DAY + dt.timedelta(hours=3) + packing.HOUR_GRACE)) == 3
    statements = _statements_of(store, monkeypatch)
    at = DAY + dt.timedelta(hours=1, minutes=30, seconds=20)
    # raw rows: each GPU's newest sample of the last 60 s (10 s ago) and its mean over 300 s; packed: the minutes'
    latest_at = DAY + dt.timedelta(hours=1, minutes=29, seconds=50) if on_pg else at - dt.timedelta(seconds=10)
    window = (DAY + dt.timedelta(hours=1, minutes=25), DAY + dt.timedelta(hours=1, minutes=30)) if on_pg else (at - dt.timedelta(minutes=5), at)
    util = df.filter((pl.col("ts") >= window[0]) & (pl.col("ts") < window[1])).group_by("gpu_uuid").agg(pl.col("util_ratio").mean())
    # the busy line halfway between the window's second and third GPU: two busy, two idle, by the window's means
    means = sorted(util["util_ratio"].to_list())
    monkeypatch.setattr(health_reads, "BUSY_UTIL_RATIO", (means[1] + means[2]) / 2)
    state = health_reads.live_state(store, at)
    assert statements and not set().union(*(_packed_hours_read(sql) for sql in statements))
    latest = df.filter(pl.col("ts") == latest_at)
    assert latest.height == 4
    assert state["power"]["power_w"].item() == pytest.approx(latest["power_w"].sum(), rel=1e-6)
    assert state["power"]["gpus_reporting"].item() == 4
    grid = state["grid"].sort("gpu_uuid")
    assert grid["temp_c"].to_list() == latest.sort("gpu_uuid")["temp_c"].to_list()
    counts = state["counts"].row(0, named=True)
    assert (counts["reporting"], counts["busy"], counts["idle"], counts["silent"]) == (4, 2, 2, 0)


def test_the_newest_sample_skips_the_packed_hours_only_when_a_row_is_newer(store):
    """``data_end`` and the newest sample before an instant: a raw row at or past the newest packed hour's end is
    the answer without unpacking (a live fleet's hours under way are rows); otherwise the packed hours are read,
    a late raw row in an older hour included."""
    df = _ten_second_day(store, hours=4)
    newest = df["ts"].max()
    if store.dialect != "postgresql":
        assert telemetry.data_end(store) == newest
        return
    assert len(packing.pack_hours(store, DAY + dt.timedelta(hours=3) + packing.HOUR_GRACE)) == 3

    def unpacked() -> bool:
        """Whether the newest-sample query read packed rows (EXPLAIN ANALYZE says so), beyond the newest packed
        hour's index-only lookup."""
        with store.engine.connect() as conn:
            plan = [r[0] for r in conn.execute(text(f"EXPLAIN ANALYZE SELECT {packed.max_ts_sql('postgresql')[0]} AS t"))]
        scans = [line for line in plan if " on gpu_sample_packed" in line and "Index Only Scan" not in line]
        assert scans, plan
        return not all("never executed" in line for line in scans)

    assert telemetry.data_end(store) == newest and not unpacked()  # hour 3 is rows: nothing unpacked
    # the hour under way packed too: the newest sample is a packed one
    with store.engine.begin() as conn:
        conn.execute(text("UPDATE rollup_watermark SET rolled_to = :t WHERE tier = 'minute'"), {"t": DAY + dt.timedelta(hours=5)})
    assert len(packing.pack_hours(store, DAY + dt.timedelta(hours=4) + packing.HOUR_GRACE)) == 1
    assert telemetry.data_end(store) == newest and unpacked()
    # a late row in an older hour is not the newest: the packed hours are still read
    late = df.filter((pl.col("ts") == DAY + dt.timedelta(minutes=30)) & (pl.col("gpu_uuid") == GPUS[0])).with_columns(
        pl.col("ts") + dt.timedelta(seconds=5))
    store.write(F.Batch(source="late", gpu_sample=late))
    assert telemetry.data_end(store) == newest and unpacked()
    before = DAY + dt.timedelta(hours=2, minutes=30, seconds=5)
    sql, params = packed.max_ts_sql("postgresql", before=before)
    got = store.query(f"SELECT {sql} AS t", params, {"t": F.UTC_US})["t"][0]
    assert got == df.filter(pl.col("ts") < before)["ts"].max()


def test_the_newest_sample_before_an_instant_crosses_an_hour_with_no_data(store):
    """A fleet-wide outage leaves hours with no packed rows: the newest packed sample before an instant inside the
    next packed hour, ahead of its first sample, is the last one before the outage, hours earlier, as raw rows give
    it; the energy over a window that runs past the data reads from it."""
    first = _ten_second_day(store, hours=1)
    again = first.with_columns(pl.col("ts") + dt.timedelta(hours=2, minutes=30))  # nothing from 01:00 to 02:30
    _write(store, again)
    tiers.advance(store, DAY + dt.timedelta(hours=4), max_chunks=10_000)
    before = DAY + dt.timedelta(hours=2, minutes=10)  # in hour 2, ahead of its first sample
    want = DAY + dt.timedelta(minutes=59, seconds=50)
    assert pl.concat([first, again]).filter(pl.col("ts") < before)["ts"].max() == want
    window = (DAY + dt.timedelta(minutes=10), before)
    as_rows = energy_reads.counter_energy_by_site_hour(store, *window)
    assert as_rows.height > 0
    if store.dialect != "postgresql":
        return
    assert len(packing.pack_hours(store, DAY + dt.timedelta(hours=3) + packing.HOUR_GRACE)) == 2  # hours 0 and 2
    sql, params = packed.max_ts_sql("postgresql", before=before)
    assert store.query(f"SELECT {sql} AS t", params, {"t": F.UTC_US})["t"][0] == want
    got = energy_reads.counter_energy_by_site_hour(store, *window)
    assert got["hour"].to_list() == as_rows["hour"].to_list()
    assert got["energy_j"].to_list() == pytest.approx(as_rows["energy_j"].to_list())


def test_the_sampling_interval_of_packed_hours_comes_from_a_gpu_with_two_samples(store):
    """A GPU that sent one sample and went quiet gives no interval: in packed hours as in rows, the interval near an
    instant is measured on a GPU with two samples or more, not whichever GPU an hour's index meets first (the last
    UUID looking back, the first looking ahead)."""
    df = _ten_second_day(store, hours=3)
    once = df.filter((pl.col("gpu_uuid") == GPUS[0]) & pl.col("ts").is_in([DAY + dt.timedelta(minutes=20), DAY + dt.timedelta(hours=1, minutes=20)]))
    once = once.with_columns(pl.when(pl.col("ts") < DAY + dt.timedelta(hours=1)).then(pl.lit("GPU-~once")).otherwise(pl.lit("GPU-+once")).alias("gpu_uuid"))
    _write(store, once)
    assert telemetry.sample_interval_s(store, DAY + dt.timedelta(hours=1, minutes=30)) == 10.0
    if store.dialect != "postgresql":
        return
    assert len(packing.pack_hours(store, DAY + dt.timedelta(hours=2) + packing.HOUR_GRACE)) == 2
    assert store.query(f"SELECT gpu_uuid FROM {packed.TABLE} WHERE samples = 1 ORDER BY 1", [], {"gpu_uuid": pl.String})["gpu_uuid"].to_list() == [
        "GPU-+once", "GPU-~once"]
    assert telemetry.sample_interval_s(store, DAY + dt.timedelta(hours=1, minutes=30)) == 10.0  # looks back to hour 0
    assert telemetry.sample_interval_s(store, DAY + dt.timedelta(minutes=10)) == 10.0  # nothing before: ahead to hour 1


def test_energy_over_a_range_in_packed_hours_is_the_counters_rise_over_it(store):
    """A GPU's energy over a range reaching packed hours is read from the minute tier (unpacking an hour for every
    GPU costs more than the read): the counter interpolated at each end within its minute, so a range of seconds
    gets its share and whole minutes the raw readings. Checked against each counter's rise between the range's
    ends (linear between samples), within what the raw probes give: each end within a sampling interval (10 s) of
    the hottest GPU's power (a minute's rise, 40-130 kJ here, read as none before)."""
    df = _ten_second_day(store, hours=3)
    if store.dialect != "postgresql":
        pytest.skip("SQLite does not pack")
    assert len(packing.pack_hours(store, DAY + dt.timedelta(hours=2) + packing.HOUR_GRACE)) == 2

    def truth(a: dt.datetime, b: dt.datetime) -> float:
        total = 0.0
        for g in GPUS:
            one = df.filter(pl.col("gpu_uuid") == g).sort("ts")
            t = [(x - DAY).total_seconds() for x in one["ts"]]
            total += float(np.interp((b - DAY).total_seconds(), t, one["energy_j"]) - np.interp((a - DAY).total_seconds(), t, one["energy_j"]))
        return total

    slack = len(GPUS) * 2 * 10 * df["power_w"].max()
    for start_s, length_s in [(1830.4, 20), (2011.0, 45), (3333.3, 90), (600, 150), (1234.5, 900), (0, 3600), (900, 4500)]:
        a = DAY + dt.timedelta(seconds=start_s)
        b = a + dt.timedelta(seconds=length_s)
        got = energy_reads.gpu_energy(store, a, b)
        want = truth(a, b)
        assert got["gpus"].sum() == len(GPUS)
        assert abs(got["energy_j"].sum() - want) <= slack, (start_s, length_s, got["energy_j"].sum(), want)
    # whole minutes: the raw probes' readings, to the joule
    whole = energy_reads.gpu_energy(store, DAY + dt.timedelta(minutes=10), DAY + dt.timedelta(minutes=40))["energy_j"].sum()
    opening, closing = (df.filter(pl.col("ts") == DAY + dt.timedelta(seconds=s))["energy_j"].sum() for s in (600, 39 * 60 + 50))
    assert whole == pytest.approx(closing - opening)


def test_packed_rows_carry_their_first_and_last_times_and_older_rows_are_filled(store):
    """Each packed GPU-hour keeps its first and last sample time beside the array (migration 0028), merges
    included, so the oldest and newest sample reads need not detoast every GPU's timestamps; rows packed before
    the migration (NULL there) are read from their arrays and filled at the ends by the packing tick."""
    if store.dialect != "postgresql":
        pytest.skip("SQLite does not pack")
    df = _ten_second_day(store, hours=4)
    assert len(packing.pack_hours(store, DAY + dt.timedelta(hours=3) + packing.HOUR_GRACE)) == 3
    # a late sample at 00:59:56, after that GPU's last of hour 0 (00:59:50), folded in by a merge: its last time moves
    late = df.filter((pl.col("ts") == DAY + dt.timedelta(hours=1)) & (pl.col("gpu_uuid") == GPUS[2])).with_columns(
        pl.col("ts") - dt.timedelta(seconds=4))
    store.write(F.Batch(source="late", gpu_sample=late))
    assert len(packing.pack_hours(store, DAY + dt.timedelta(hours=3) + packing.HOUR_GRACE)) == 1

    def rows() -> pl.DataFrame:
        return store.query(f"SELECT hour, gpu_uuid, first_ts, last_ts, ts[1] AS a, ts[array_upper(ts, 1)] AS b FROM {packed.TABLE}", [],
                           {"hour": F.UTC_US, "gpu_uuid": pl.String, "first_ts": F.UTC_US, "last_ts": F.UTC_US, "a": F.UTC_US, "b": F.UTC_US})

    got = rows()
    assert got.height == 12 and got["first_ts"].equals(got["a"]) and got["last_ts"].equals(got["b"])
    h0 = got.filter((pl.col("hour") == DAY) & (pl.col("gpu_uuid") == GPUS[2]))
    assert h0["last_ts"].item() == late["ts"].item()  # the merged sample, 00:59:56
    first, last = df["ts"].min(), df["ts"].max()
    assert telemetry.data_start(store) == first
    # as rows packed before migration 0028 are: no first or last time, read from the arrays meanwhile
    with store.engine.begin() as conn:
        conn.execute(text(f"UPDATE {packed.TABLE} SET first_ts = NULL, last_ts = NULL"))
    assert telemetry.data_start(store) == first
    assert store.query(f"SELECT {packed.max_ts_sql('postgresql')[0]} AS t", [], {"t": F.UTC_US})["t"][0] == last
    assert packing.fill_bounds(store) == 8  # four GPUs in the oldest and in the newest packed hour
    assert packing.fill_bounds(store) == 0
    filled = rows().filter(pl.col("first_ts").is_not_null())
    assert sorted(set(filled["hour"].to_list())) == [DAY, DAY + dt.timedelta(hours=2)]
    assert filled["first_ts"].equals(filled["a"]) and filled["last_ts"].equals(filled["b"])
    assert telemetry.data_start(store) == first


def test_the_packed_horizon_is_read_where_the_read_goes(store):
    """A read on the replica (``reads_on_replica``) asks the replica for the packed horizon, as for its rows: the
    replica's own packing state, and reads that go on while the primary is down."""
    from fleetscope.store import Store, db, reads_on_replica

    df = _packed_day_one(store)
    down = Store(db.make_engine("postgresql+psycopg://postgres@127.0.0.1:9/nowhere?connect_timeout=2"), store.engine)
    with reads_on_replica():
        assert down.packed_until() == DAY + dt.timedelta(days=1)
        assert down.read("gpu_sample", start=DAY, end=DAY + dt.timedelta(hours=2)).height == df.filter(pl.col("ts") < DAY + dt.timedelta(hours=2)).height
    with pytest.raises(Exception, match="nowhere|refused|connect"):
        down.packed_until()  # outside it, the primary's

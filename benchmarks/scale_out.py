"""Scale-out figures on PostgreSQL (README "Scaling out"): a 30-day fleet panel read from the hour tier, retention
of a day of raw partitions, and bytes per GPU-day in raw samples and in each roll-up tier.

- ``panel_30d``: the hour tier filled for ``--panel-gpus`` GPUs (16,384) over 30 days (COPY, the columns the
  fleet panel reads), then ``services.telemetry.fleet_series`` over the 30 days, the read behind the Overview
  and Energy & Carbon pages' fleet panels. Target: under 2 s.
- ``storage``: ``--gpus`` GPUs (64) sampled every 10 s for a day with 30 fields through ``Store.write`` (the
  day's partition), rolled to the minute and hour tiers by the service's own ``tiers.advance``; bytes of each
  (table, indexes and TOAST: ``pg_total_relation_size``) per GPU-day; then the day packed by
  ``services.packing.pack_day`` as beat does once the day is closed, and the bytes of the packed day (its
  packed partition and the emptied raw one). ``--values random`` (default): every field uniform random at
  full float8 precision, the worst case for compression; ``--values dcgm``: values as DCGM reports them
  (``_dcgm_scrapes``), a busy GPU.
- ``retention``: the next day written too, then ``services.retention.prune`` with the cutoff at its start:
  the first day goes as one dropped partition. Target: under 1 s.
- ``energy``: a day of DCGM-shaped samples rolled into per-GPU energy minutes by the service's own roll-up, their
  bytes per GPU-day as rows and once ``services.packing.pack_energy_day`` has packed the day; an hour of every
  GPU's minutes (checked equal) and the day's per-site hours (``energy_by_site_hour``, joined to the inventory)
  read both ways.
- ``reads``: a day of DCGM-shaped samples of ``--gpus`` GPUs on one site, and the service's reads of raw samples over
  that day timed as rows and again once ``services.packing.pack_day`` has packed it (each checked equal): the
  oldest rows with a limit and no range (``GET /api/v1/frames/gpu_sample?limit=``), an hour of every GPU, a job's 8
  GPUs over the day, a job's samples by its id (12 hours of 8 ranks, no range given), the fleet's activity and its
  latest samples at an instant of the day, each GPU's energy over the day from its counter, the site's hourly
  energy from the counters, one GPU's power over the day.
- ``openday``: the day under way packed an hour at a time as beat does (``bench_open_day``): its bytes at 23:59,
  packed hours and the raw partition, and at the raw rows' peak.
- ``openreads``: ``--hours`` of the day under way for ``--gpus`` GPUs, the live reads (the fleet panel over six hours
  and one, a GPU's six hours, the live panel, the six-hour energy total) as rows and once beat's tick has packed
  the hours it packs.
- ``layouts``: the bytes of a raw GPU-day in bare tables keyed by text UUID, by integer GPU id, and by integer
  id with 4-byte floats (``bench_layouts``): what narrower keys and columns would save.

    python benchmarks/scale_out.py [--panel-gpus 16384] [--gpus 64] [--only storage|openday|openreads|layouts|panel|energy|reads] [--hours 7] [--values random|dcgm]
                                   [--postgres URL]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import sys
import time
from pathlib import Path

# benchmarks/analyzers.py would shadow the analyzers package the services import
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
sys.path.insert(0, str(_HERE.parent))

import numpy as np  # noqa: E402
import polars as pl  # noqa: E402
from sqlalchemy import text  # noqa: E402

from fleetscope.core import frames as F  # noqa: E402
from fleetscope.services import energy_reads, energy_rollup, health_reads, packing, retention, telemetry, tiers  # noqa: E402
from benchmarks._server import scratch_store  # noqa: E402
from fleetscope.store import Store, packed, packed_energy, partitions, schema  # noqa: E402

FIELDS = [c.name for c in F.GPU_FIELDS][:30]
DAY0 = dt.datetime(2026, 11, 1, tzinfo=dt.UTC)


def _emit(**row: object) -> None:
    print(json.dumps(row), flush=True)


def _uuids(n: int, tag: str) -> list[str]:
    return [f"GPU-{tag}{i:07x}-0000-0000-0000-{i:012x}" for i in range(n)]


def _scrapes(uuids: list[str], start: dt.datetime, scrapes: int, interval_s: int, rng: np.random.Generator) -> pl.DataFrame:
    n = len(uuids)
    ts = np.repeat(np.arange(scrapes, dtype=np.int64) * interval_s * 1_000_000, n) + int(start.timestamp() * 1_000_000)
    cols: dict[str, object] = {"ts": pl.Series("ts", ts).cast(pl.Datetime("us", "UTC")), "gpu_uuid": uuids * scrapes}
    for name in FIELDS:
        if F.GPU_SAMPLE.schema[name] == pl.Int64:
            cols[name] = pl.Series(name, rng.integers(0, 80 * 2**30, n * scrapes), dtype=pl.Int64)
        else:
            cols[name] = pl.Series(name, rng.random(n * scrapes) * 700.0)
    return pl.DataFrame(cols)


def _wander(rng: np.random.Generator, n: int, scrapes: int, mean: float, sd: float, lo: float, hi: float) -> np.ndarray:
    """``scrapes`` x ``n`` values (scrape-major, as ``_scrapes`` lays rows out): per GPU, a level of its own and
    AR(1) noise about it (each scrape keeps 0.9 of the last one's deviation; stationary deviation ``sd``),
    clipped to [lo, hi]: readings that move every scrape, as a busy GPU's do, without sitting at a bound."""
    level = rng.normal(mean, sd, n)
    eps = rng.normal(0.0, sd * np.sqrt(1 - 0.9**2), (scrapes, n))
    dev = np.empty_like(eps)
    dev[0] = rng.normal(0.0, sd, n)
    for i in range(1, scrapes):
        dev[i] = 0.9 * dev[i - 1] + eps[i]
    return np.clip(level + dev, lo, hi).ravel()


def _dcgm_scrapes(uuids: list[str], start: dt.datetime, scrapes: int, interval_s: int, rng: np.random.Generator,
                  energy0_j: np.ndarray) -> pl.DataFrame:
    """The same rows as ``_scrapes`` with values shaped as dcgm-exporter reports a busy training GPU (H100, DCGM
    3.x ``default-counters.csv`` and profiling fields): utilisations in whole percent, profiling ratios to 6
    decimals, memory in whole MiB changing when a job does, power to the mW, the energy counter in mJ,
    temperatures in whole °C, clocks in whole MHz, PCIe and NVLink bytes per second, error counters and the
    last XID at zero. ``energy0_j`` (per GPU) carries the counter on across calls."""
    n = len(uuids)
    m = n * scrapes
    ts = np.repeat(np.arange(scrapes, dtype=np.int64) * interval_s * 1_000_000, n) + int(start.timestamp() * 1_000_000)
    power = np.round(_wander(rng, n, scrapes, 550.0, 60.0, 60.0, 700.0), 3)
    energy = energy0_j + np.cumsum(np.round(power * interval_s * 1000).reshape(scrapes, n), axis=0) / 1000
    energy0_j[:] = energy[-1]
    mib = np.repeat(rng.integers(20_000, 80_000, n)[None, :], scrapes, axis=0).ravel()
    cols: dict[str, object] = {"ts": pl.Series("ts", ts).cast(pl.Datetime("us", "UTC")), "gpu_uuid": uuids * scrapes}
    for name in FIELDS:
        if name in ("util_ratio", "mem_copy_util_ratio"):
            v = np.round(_wander(rng, n, scrapes, 90.0, 8.0, 0.0, 100.0)) / 100
        elif name in ("enc_util_ratio", "dec_util_ratio", "fp64_active_ratio"):
            v = np.zeros(m)
        elif name.endswith("_ratio"):
            v = np.round(_wander(rng, n, scrapes, 0.6, 0.1, 0.0, 1.0), 6)
        elif name == "fb_used_bytes":
            v = mib * 2**20
        elif name == "fb_free_bytes":
            v = (81_559 - mib) * 2**20
        elif name == "fb_reserved_bytes":
            v = np.full(m, 521 * 2**20)
        elif name == "power_w":
            v = power
        elif name == "energy_j":
            v = energy.ravel()
        elif name in ("temp_c", "mem_temp_c"):
            v = np.round(_wander(rng, n, scrapes, 65.0, 3.0, 25.0, 95.0))
        elif name == "sm_clock_mhz":
            v = np.where(rng.random(m) < 0.95, 1980.0, 1755.0)
        elif name == "mem_clock_mhz":
            v = np.full(m, 2619.0)
        elif name.endswith("_bytes_per_s"):
            v = np.round(_wander(rng, n, scrapes, 1e10, 3e9, 0.0, 6.4e10))
        else:  # counters and the last XID
            v = np.zeros(m, dtype=np.int64)
        cols[name] = pl.Series(name, v, dtype=F.GPU_SAMPLE.schema[name])
    return pl.DataFrame(cols)


def _write_day(store: Store, uuids: list[str], day: dt.datetime, interval_s: int, rng: np.random.Generator, values: str = "random") -> int:
    per_write = max(1, 200_000 // len(uuids))
    scrapes = 86_400 // interval_s
    rows = 0
    energy0_j = np.full(len(uuids), 1e8)
    for s0 in range(0, scrapes, per_write):
        k = min(per_write, scrapes - s0)
        at = day + dt.timedelta(seconds=s0 * interval_s)
        df = _scrapes(uuids, at, k, interval_s, rng) if values == "random" else _dcgm_scrapes(uuids, at, k, interval_s, rng, energy0_j)
        rows += store.write(F.Batch(source="bench", gpu_sample=df)).written.get("gpu_sample", 0)
    return rows


def _bytes(store: Store, relation: str) -> int:
    with store.engine.connect() as conn:
        return int(conn.execute(text("SELECT pg_total_relation_size(to_regclass(:r))"), {"r": relation}).scalar() or 0)


def bench_open_day(store: Store, gpus: int, interval_s: int, values: str) -> None:
    """The day under way packed an hour at a time (``packing.pack_hours``, beat's ``raw-packing``): each hour
    written, rolled into the minute tier, and beat's tick 40 minutes after its end run (which packs and vacuums the
    partition), then the day's bytes at 23:59, before the day closes: the packed
    partition and the raw one (the hours within ``packing.HOUR_GRACE`` of the end, and the last). Beat packs at :40,
    so the raw rows peak 40 minutes later than here: ``peak_bytes_per_gpu_day`` adds 40 minutes' worth of the
    open-day rows measured by ``storage``."""
    rng = np.random.default_rng(7)
    uuids = _uuids(gpus, "o")
    energy0_j = np.full(len(uuids), 1e8)
    scrapes = 3600 // interval_s
    part, packed_part = f"gpu_sample_p{DAY0:%Y%m%d}", f"gpu_sample_packed_p{DAY0:%Y%m%d}"
    pack_s = 0.0
    for h in range(24):
        at = DAY0 + dt.timedelta(hours=h)
        df = _scrapes(uuids, at, scrapes, interval_s, rng) if values == "random" else _dcgm_scrapes(uuids, at, scrapes, interval_s, rng, energy0_j)
        store.write(F.Batch(source="bench", gpu_sample=df))
        tiers.advance(store, at + dt.timedelta(hours=1, minutes=5), max_chunks=10_000)
        if h == 23:
            break  # 23:59: the last hour still rows, the day not closed
        t = time.perf_counter()
        done = packing.pack_hours(store, at + dt.timedelta(hours=1, minutes=40))
        pack_s += time.perf_counter() - t
        assert set(done.values()) <= {"packed"}, done
    raw, packed_bytes = _bytes(store, part), _bytes(store, packed_part)
    open_rows_per_hour = 3_064_960 / 24  # bytes of an hour of rows a GPU, measured by `storage` (2026-12-06)
    _emit(bench="open_day_packed_hourly", db="postgresql", values=values, gpus=gpus, interval_s=interval_s,
          packed_bytes_per_gpu_day_23h=round(packed_bytes / gpus), raw_bytes_per_gpu_at_2359=round(raw / gpus),
          open_day_bytes_per_gpu=round((raw + packed_bytes) / gpus),
          peak_bytes_per_gpu_day=round((raw + packed_bytes) / gpus + 40 / 60 * open_rows_per_hour),
          ratio_to_4_21_mb=round(4_210_000 / ((raw + packed_bytes) / gpus + 40 / 60 * open_rows_per_hour), 2),
          pack_s_per_hour=round(pack_s / 23, 3))


def bench_open_day_reads(store: Store, gpus: int, hours: int, interval_s: int) -> None:
    """What the day under way's packing costs the live reads: ``hours`` of DCGM-shaped samples of ``gpus`` GPUs, the
    Overview's fleet panel over the last six hours and the last hour, one GPU's six hours, the live panel and the
    Energy page's counter total over six hours, the oldest and newest sample held, each
    the best of 3, as rows and again once beat's tick 40 minutes after the last hour has packed what it packs."""
    rng = np.random.default_rng(1)
    uuids = _uuids(gpus, "r")
    energy0_j = np.full(gpus, 1e8)
    for h in range(hours):
        store.write(F.Batch(source="bench", gpu_sample=_dcgm_scrapes(uuids, DAY0 + dt.timedelta(hours=h), 3600 // interval_s, interval_s, rng, energy0_j)))
    end = DAY0 + dt.timedelta(hours=hours)
    tiers.advance(store, end + dt.timedelta(minutes=5), max_chunks=10_000)
    with store.engine.begin() as conn:
        conn.execute(text("ANALYZE gpu_sample"))

    def reads() -> dict[str, float]:
        out = {}
        for name, read in (("fleet_panel_6h", lambda: telemetry.fleet_series(store, end - dt.timedelta(hours=6), end, points=48)),
                           ("fleet_panel_1h", lambda: telemetry.fleet_series(store, end - dt.timedelta(hours=1), end, points=48)),
                           ("gpu_power_6h", lambda: telemetry.gpu_field_series(store, uuids[0], "power_w", end - dt.timedelta(hours=6), end)),
                           ("live_panel", lambda: health_reads.live_state(store, end)),
                           # the same panel anchored two hours back (a past time in the Overview's URL): a packed hour
                           ("live_panel_2h_ago", lambda: health_reads.live_state(store, end - dt.timedelta(hours=2))),
                           ("energy_6h", lambda: energy_reads.gpu_energy(store, end - dt.timedelta(hours=6), end)),
                           # what every page asks first: the oldest and the newest sample held
                           ("data_start", lambda: telemetry.data_start(store)),
                           ("data_end", lambda: telemetry.data_end(store))):
            best = math.inf
            for _ in range(3):
                t = time.perf_counter()
                read()
                best = min(best, time.perf_counter() - t)
            out[name] = round(best, 3)
        return out

    rows = reads()
    done = packing.pack_hours(store, end + dt.timedelta(minutes=40))  # which vacuums the day's raw partition
    with store.engine.begin() as conn:
        conn.execute(text("ANALYZE gpu_sample_packed"))
    _emit(bench="open_day_reads", db="postgresql", gpus=gpus, hours=hours, hours_packed=len(done), hour_grace_h=packing.HOUR_GRACE.total_seconds() / 3600,
          seconds_as_rows=rows, seconds_after_packing=reads())


def bench_storage_and_retention(store: Store, gpus: int, interval_s: int, values: str) -> None:
    rng = np.random.default_rng(7)
    uuids = _uuids(gpus, "s")
    t = time.perf_counter()
    rows = _write_day(store, uuids, DAY0, interval_s, rng, values)
    write_s = time.perf_counter() - t
    t = time.perf_counter()
    rolled = tiers.advance(store, DAY0 + dt.timedelta(days=1, minutes=5), max_chunks=10_000)
    roll_s = time.perf_counter() - t
    with store.engine.begin() as conn:
        conn.execute(text("ANALYZE gpu_sample_minute"))
        conn.execute(text("ANALYZE gpu_sample_hour"))
    part = f"gpu_sample_p{DAY0:%Y%m%d}"
    raw = _bytes(store, part)
    minute, hour = _bytes(store, "gpu_sample_minute"), _bytes(store, "gpu_sample_hour")
    # what the raw figure is made of: the heap (row headers, the integer GPU id, the 8-byte columns) and each index
    with store.engine.connect() as conn:
        heap = int(conn.execute(text("SELECT pg_relation_size(to_regclass(:r))"), {"r": part}).scalar())
        indexes = {name: int(size) for name, size in conn.execute(text(
            "SELECT i.relname, pg_relation_size(i.oid) FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid"
            " WHERE x.indrelid = to_regclass(:r) ORDER BY 1"), {"r": part})}
        row_bytes, uuid_bytes = conn.execute(text(
            f"SELECT AVG(pg_column_size(t.*)), AVG(pg_column_size(t.gpu_id)) FROM (SELECT * FROM {part} LIMIT 10000) t")).one()
    _emit(bench="storage_per_gpu_day", db="postgresql", values=values, gpus=gpus, interval_s=interval_s, fields=len(FIELDS),
          raw_rows=rows, minute_rows=rolled["minute"]["rows"], hour_rows=rolled["hour"]["rows"],
          raw_bytes_per_gpu_day=round(raw / gpus), minute_bytes_per_gpu_day=round(minute / gpus),
          hour_bytes_per_gpu_day=round(hour / gpus), raw_to_minute_ratio=round(raw / max(minute, 1), 2),
          raw_to_hour_ratio=round(raw / max(hour, 1), 1), write_s=round(write_s, 1), rollup_s=round(roll_s, 1))
    _emit(bench="raw_bytes_breakdown", db="postgresql", heap_bytes_per_gpu_day=round(heap / gpus),
          index_bytes_per_gpu_day={k: round(v / gpus) for k, v in indexes.items()},
          mean_row_bytes=round(float(row_bytes), 1), mean_gpu_id_bytes=round(float(uuid_bytes), 1),
          rows_per_gpu_day=rows // gpus)

    # the closed day packed as beat packs it, and what it then costs: its packed partition and the emptied raw one;
    # an hour of every GPU's 30 fields read through Store.read before and after
    hour = {"start": DAY0 + dt.timedelta(hours=12), "end": DAY0 + dt.timedelta(hours=13), "columns": ["ts", "gpu_uuid", *FIELDS]}
    t = time.perf_counter()
    rows_before = store.read("gpu_sample", **hour).height
    read_raw_s = time.perf_counter() - t
    t = time.perf_counter()
    done = packing.pack_day(store, DAY0.date())
    pack_s = time.perf_counter() - t
    t = time.perf_counter()
    rows_after = store.read("gpu_sample", **hour).height
    read_packed_s = time.perf_counter() - t
    assert rows_after == rows_before, (rows_before, rows_after)
    packed_part = partitions.partition_name(packed.TABLE, DAY0.date())
    with store.engine.begin() as conn:
        conn.execute(text(f'ANALYZE "{packed_part}"'))
    packed_bytes, emptied = _bytes(store, packed_part), _bytes(store, part)
    with store.engine.connect() as conn:
        toast = int(conn.execute(text("SELECT pg_total_relation_size(reltoastrelid) FROM pg_class WHERE oid = to_regclass(:r)"),
                                 {"r": packed_part}).scalar() or 0)
    _emit(bench="packed_bytes_per_gpu_day", db="postgresql", values=values, gpus=gpus, interval_s=interval_s, fields=len(FIELDS),
          samples=done["samples"], gpu_hour_rows=done["rows"], packed_bytes_per_gpu_day=round((packed_bytes + emptied) / gpus),
          toast_bytes_per_gpu_day=round(toast / gpus), emptied_raw_partition_bytes=emptied,
          raw_to_packed_ratio=round(raw / max(packed_bytes + emptied, 1), 2), target_bytes=round(4.21e6 / 4), pack_s=round(pack_s, 2),
          read_hour_rows=rows_after, read_hour_raw_s=round(read_raw_s, 3), read_hour_packed_s=round(read_packed_s, 3))

    # The next day, so the first one is a whole partition behind the cutoff.
    _write_day(store, uuids, DAY0 + dt.timedelta(days=1), 3600, rng)
    now = DAY0 + dt.timedelta(days=2)
    # the partition drops timed on their own too: the rest of prune is a DELETE per table (nothing there to delete)
    drop_s: dict[str, float] = {}
    drop_before = partitions.drop_before

    def timed_drop(engine, table, cutoff):  # type: ignore[no-untyped-def]
        t0 = time.perf_counter()
        try:
            return drop_before(engine, table, cutoff)
        finally:
            drop_s[table] = round(time.perf_counter() - t0, 3)

    partitions.drop_before = timed_drop
    t = time.perf_counter()
    deleted = retention.prune(store, now, retention_days=1, evidence_retention_days=10_000,
                              tier_retention_days={"minute": 10_000, "hour": 10_000})
    prune_s = time.perf_counter() - t
    partitions.drop_before = drop_before
    _emit(bench="retention_day_of_partitions", db="postgresql", raw_rows_dropped=deleted.get("gpu_sample"),
          packed_gpu_hours_dropped=deleted.get(packed.TABLE),
          day_bytes=raw, seconds=round(prune_s, 3), target_s=1.0, gpu_sample_drop_s=drop_s.get("gpu_sample"),
          tables_pruned=len(deleted))


def bench_layouts(store: Store, gpus: int, interval_s: int) -> None:
    """What narrower keys and columns would make of a raw GPU-day, not what the store does: the same day of 30
    random fields in three bare tables (no BRIN, rows in time order as scrapes arrive), keyed (text UUID, ts)
    as ``gpu_sample`` is, (integer GPU id, ts), and (integer GPU id, ts) with 4-byte floats for 22 of the 30
    fields (ratios, temperatures, clocks and rates; counters such as ``energy_j`` keep 8 bytes)."""
    layouts = {"text_uuid": ("gpu_uuid text", ["double precision"] * 30), "int_id": ("gpu_id int", ["double precision"] * 30),
               "int_id_float4": ("gpu_id int", ["real"] * 22 + ["double precision"] * 8)}
    fields = ", ".join(f"random() AS f{i}" for i in range(30))
    with store.engine.begin() as conn:
        conn.execute(text(
            f"CREATE TEMP TABLE _day AS SELECT t AS ts, g, {fields} FROM generate_series(TIMESTAMPTZ '{DAY0.isoformat()}',"
            f" TIMESTAMPTZ '{(DAY0 + dt.timedelta(days=1, seconds=-interval_s)).isoformat()}', interval '{interval_s} s') t,"
            f" generate_series(0, {gpus - 1}) g ORDER BY t, g"))
        out = {}
        for name, (key, types) in layouts.items():
            cols = ", ".join(f"f{i} {ty}" for i, ty in enumerate(types))
            kcol = key.split()[0]
            conn.execute(text(f"CREATE TABLE _l_{name} (ts timestamptz, {key}, {cols}, PRIMARY KEY ({kcol}, ts))"))
            kval = "'GPU-s' || lpad(to_hex(g), 7, '0') || '-0000-0000-0000-' || lpad(to_hex(g), 12, '0')" if kcol == "gpu_uuid" else "g"
            conn.execute(text(f"INSERT INTO _l_{name} SELECT ts, {kval}, {', '.join(f'f{i}' for i in range(30))} FROM _day ORDER BY ts, g"))
            out[name] = round(int(conn.execute(text(f"SELECT pg_total_relation_size('_l_{name}')")).scalar()) / gpus)
            conn.execute(text(f"DROP TABLE _l_{name}"))
    _emit(bench="raw_layouts_bytes_per_gpu_day", db="postgresql", gpus=gpus, interval_s=interval_s, fields=30, **out,
          int_id_float4_ratio=round(out["text_uuid"] / out["int_id_float4"], 2))


def _copy_hour_tier(store: Store, gpus: int, days: int) -> int:
    """The hour tier for ``gpus`` GPUs over ``days`` days ending at DAY0, written with COPY (what the panel reads)."""
    rng = np.random.default_rng(11)
    uuids = _uuids(gpus, "p")
    hours = days * 24
    first = DAY0 - dt.timedelta(days=days)
    raw = store.engine.raw_connection()
    try:
        with raw.cursor() as cur:
            for day in range(days):
                n = gpus * 24
                buckets = np.repeat(np.arange(24, dtype=np.int64) + (day * 24), gpus) * 3_600_000_000 + int(first.timestamp() * 1_000_000)
                chunk = pl.DataFrame({
                    "bucket": pl.Series(buckets).cast(pl.Datetime("us", "UTC")),
                    "gpu_uuid": uuids * 24,
                    "samples": pl.repeat(360, n, eager=True),
                    "util_ratio_mean": rng.random(n).round(4),
                    "power_w_mean": (100 + rng.random(n) * 600).round(2),
                    "temp_c_max": (30 + rng.random(n) * 50).round(1),
                })
                with cur.copy("COPY gpu_sample_hour (bucket, gpu_uuid, samples, util_ratio_mean, power_w_mean, temp_c_max)"
                              " FROM STDIN WITH (FORMAT csv)") as cp:
                    cp.write(chunk.write_csv(include_header=False, datetime_format="%Y-%m-%dT%H:%M:%S%z"))
        raw.commit()
    finally:
        raw.close()
    with store.engine.begin() as conn:
        conn.execute(text("ANALYZE gpu_sample_hour"))
        wm = schema.rollup_watermark
        for tier in ("minute", "hour"):
            conn.execute(wm.insert().values(tier=tier, rolled_to=DAY0, rolled_at=DAY0))
    return gpus * hours


def bench_panel(store: Store, gpus: int, days: int) -> None:
    t = time.perf_counter()
    rows = _copy_hour_tier(store, gpus, days)
    fill_s = time.perf_counter() - t
    start, end = DAY0 - dt.timedelta(days=days), DAY0
    assert tiers.choose_tier(start, end, rolled=tiers.rolled_tiers(store)) == "hour"
    for label in ("first", "again"):
        t = time.perf_counter()
        series = telemetry.fleet_series(store, start, end, points=48)
        seconds = time.perf_counter() - t
        assert series.height >= 47 and int(series["gpus_reporting"].max()) == gpus, series
        _emit(bench=f"panel_30d_{label}", db="postgresql", gpus=gpus, days=days, tier="hour", hour_rows=rows,
              points=series.height, seconds=round(seconds, 3), target_s=2.0, fill_s=round(fill_s, 1))


def _site_inventory(store: Store, uuids: list[str], site: str) -> None:
    """8 GPUs a host on one site, so reads that join the inventory join as they do in a fleet."""
    hosts = [f"{site}-host-{i // 8}" for i in range(len(uuids))]
    store.write(F.Batch(source="bench", site=F.conform(F.SITE, pl.DataFrame({"site_id": [site], "name": [site], "country": ["DEU"]})),
                        host=F.conform(F.HOST, pl.DataFrame({"host": sorted(set(hosts)), "site_id": site})),
                        gpu=F.conform(F.GPU, pl.DataFrame({"gpu_uuid": uuids, "host": hosts}))))


def bench_energy_packing(store: Store, gpus: int, interval_s: int) -> None:
    """A day of per-GPU energy minutes as the energy roll-up writes them from DCGM-shaped samples (the energy
    counter in J with mJ digits, power to the mW), in bytes per GPU-day as rows and once the day is packed
    (``services.packing.pack_energy_day``: the packed table with its indexes and TOAST); an hour of every GPU's
    minutes read both ways, and checked equal."""
    rng = np.random.default_rng(11)
    uuids = _uuids(gpus, "e")
    _site_inventory(store, uuids, "e1")
    _write_day(store, uuids, DAY0, interval_s, rng, "dcgm")
    t = time.perf_counter()
    for h in range(24):  # as beat rolls it, a window at a time
        energy_rollup.rollup_window(store, DAY0 + dt.timedelta(hours=h), DAY0 + dt.timedelta(hours=h + 1))
    roll_s = time.perf_counter() - t
    with store.engine.begin() as conn:
        conn.execute(text(f"ANALYZE {packed_energy.RAW}"))
        minutes = int(conn.execute(text(f"SELECT count(*) FROM {packed_energy.RAW}")).scalar())
    rows_bytes = _bytes(store, packed_energy.RAW)
    hour = {"start": DAY0 + dt.timedelta(hours=12), "end": DAY0 + dt.timedelta(hours=13)}
    t = time.perf_counter()
    before = store.read(packed_energy.RAW, **hour)
    read_rows_s = time.perf_counter() - t
    day = (DAY0, DAY0 + dt.timedelta(days=1))
    t = time.perf_counter()
    site_before = energy_reads.energy_by_site_hour(store, *day)
    site_rows_s = time.perf_counter() - t
    t = time.perf_counter()
    done = packing.pack_energy_day(store, DAY0.date())
    pack_s = time.perf_counter() - t
    t = time.perf_counter()
    after = store.read(packed_energy.RAW, **hour)
    read_packed_s = time.perf_counter() - t
    assert after.equals(before), "a packed hour reads back other than its rows"
    t = time.perf_counter()
    site_after = energy_reads.energy_by_site_hour(store, *day)
    site_packed_s = time.perf_counter() - t
    assert site_after.height == site_before.height == 24, (site_before.height, site_after.height)
    with store.engine.begin() as conn:
        conn.execute(text(f"ANALYZE {packed_energy.TABLE}"))
        toast = int(conn.execute(text("SELECT pg_total_relation_size(reltoastrelid) FROM pg_class WHERE oid = to_regclass(:r)"),
                                 {"r": packed_energy.TABLE}).scalar() or 0)
    packed_bytes = _bytes(store, packed_energy.TABLE)
    _emit(bench="energy_minute_bytes_per_gpu_day", db="postgresql", gpus=gpus, interval_s=interval_s, minutes=minutes,
          packed_minutes=done["minutes"], gpu_hour_rows=done["rows"], rows_bytes_per_gpu_day=round(rows_bytes / gpus),
          packed_bytes_per_gpu_day=round(packed_bytes / gpus), toast_bytes_per_gpu_day=round(toast / gpus),
          rows_to_packed_ratio=round(rows_bytes / max(packed_bytes, 1), 2), rollup_s=round(roll_s, 1), pack_s=round(pack_s, 2),
          read_hour_minutes=after.height, read_hour_rows_s=round(read_rows_s, 3), read_hour_packed_s=round(read_packed_s, 3),
          site_hours_of_day_rows_s=round(site_rows_s, 3), site_hours_of_day_packed_s=round(site_packed_s, 3))


def _same_within_float4(packed_df: pl.DataFrame, rows_df: pl.DataFrame, what: str) -> None:
    """Equal but for the fields packed as ``real`` (``store.packed.FLOAT4_FIELDS``), which read back within float4's
    precision of what was written, and for aggregates of them."""
    assert packed_df.columns == rows_df.columns and packed_df.height == rows_df.height, (what, packed_df.shape, rows_df.shape)
    for c in rows_df.columns:
        a, b = packed_df[c], rows_df[c]
        if b.dtype.is_float():
            assert bool(((a - b).abs() <= 1e-6 * b.abs() + 1e-9).all()) and a.is_null().equals(b.is_null()), f"{what}: {c} differs packed"
        else:
            assert a.equals(b), f"{what}: {c} differs packed"


def bench_packed_reads(store: Store, gpus: int, interval_s: int) -> None:
    """The service's reads of raw samples over a day, as rows and once the day is packed: seconds each way, and
    the packed read checked equal to the rows' (README "Packed days of raw samples")."""
    rng = np.random.default_rng(13)
    uuids = _uuids(gpus, "r")
    _site_inventory(store, uuids, "r1")
    _write_day(store, uuids, DAY0, interval_s, rng, "dcgm")
    day = (DAY0, DAY0 + dt.timedelta(days=1))
    # a job of 8 ranks on GPUs 8-15 from 06:00 to 18:00
    ranks = pl.DataFrame({"job_id": ["j-8"] * 8, "rank": list(range(8)), "start": [DAY0 + dt.timedelta(hours=6)] * 8,
                          "end": [DAY0 + dt.timedelta(hours=18)] * 8, "gpu_uuid": uuids[8:16], "host": ["r1-host-1"] * 8})
    store.write_frames([(F.JOB_RANK, F.conform(F.JOB_RANK, ranks))], source="bench")
    noon = DAY0 + dt.timedelta(hours=12)
    reads = {
        "oldest_1000_no_range": lambda: store.read(packed.RAW, limit=1000),
        "hour_of_every_gpu": lambda: store.read(packed.RAW, start=noon, end=noon + dt.timedelta(hours=1)),
        "job_8_gpus_day": lambda: store.read(packed.RAW, start=day[0], end=day[1], gpu_uuid=uuids[8:16]),
        "job_by_id_12h": lambda: store.read(packed.RAW, job_id="j-8"),
        "fleet_state_counts_5min": lambda: health_reads.gpu_state_counts(store, noon, 300),
        "latest_samples_at_noon": lambda: telemetry.latest_fields(store, noon, ["util_ratio", "power_w", "temp_c", "xid_last"]).sort("gpu_uuid"),
        "site_energy_day_counters": lambda: energy_reads.gpu_energy(store, *day).sort("site_id"),
        "site_counter_energy_hours": lambda: energy_reads.counter_energy_by_site_hour(store, *day),
        "one_gpu_power_day": lambda: telemetry.gpu_field_series(store, uuids[3], "power_w", *day, tier="raw"),
    }

    def timed() -> dict[str, tuple[float, pl.DataFrame]]:
        with store.engine.begin() as conn:
            conn.execute(text(f"ANALYZE {packed.RAW}"))
            conn.execute(text(f"ANALYZE {packed.TABLE}"))
        out = {}
        for name, read in reads.items():
            read()  # once to warm the caches the same way for both
            t = time.perf_counter()
            df = read()
            out[name] = (time.perf_counter() - t, df)
        return out

    as_rows = timed()
    t = time.perf_counter()
    packing.pack_day(store, DAY0.date())
    pack_s = time.perf_counter() - t
    as_packed = timed()
    for name, (_, df) in as_rows.items():
        assert df.height > 0, name
        _same_within_float4(as_packed[name][1], df, name)
        _emit(bench="packed_raw_read", db="postgresql", gpus=gpus, read=name, rows=df.height, rows_s=round(as_rows[name][0], 3),
              packed_s=round(as_packed[name][0], 3), ratio=round(as_packed[name][0] / max(as_rows[name][0], 1e-6), 2), pack_s=round(pack_s, 1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--panel-gpus", type=int, default=16384)
    ap.add_argument("--days", type=int, default=30)
    ap.add_argument("--gpus", type=int, default=64)
    ap.add_argument("--interval-s", type=int, default=10)
    ap.add_argument("--only", choices=("storage", "openday", "openreads", "layouts", "panel", "energy", "reads"), help="run one of the measurements")
    ap.add_argument("--hours", type=int, default=7, help="openreads: hours of the day under way written")
    ap.add_argument("--values", choices=("random", "dcgm"), default="random",
                    help="storage: uniform random fields (the worst case for compression) or values as DCGM reports them")
    ap.add_argument("--postgres", default=os.environ.get("FLEETSCOPE_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"))
    args = ap.parse_args()
    # each measurement on its own scratch database, so one's rows are not in the other's tables
    runs = {"storage": lambda store: bench_storage_and_retention(store, args.gpus, args.interval_s, args.values),
            "openday": lambda store: bench_open_day(store, args.gpus, args.interval_s, args.values),
            "openreads": lambda store: bench_open_day_reads(store, args.gpus, args.hours, args.interval_s),
            "layouts": lambda store: bench_layouts(store, args.gpus, args.interval_s),
            "panel": lambda store: bench_panel(store, args.panel_gpus, args.days),
            "energy": lambda store: bench_energy_packing(store, args.gpus, args.interval_s),
            "reads": lambda store: bench_packed_reads(store, args.gpus, args.interval_s)}
    for name, run in runs.items():
        if args.only not in (None, name):
            continue
        with scratch_store(args.postgres) as store:
            run(store)


if __name__ == "__main__":
    main()

"""Read-side queries for the dashboard: small, bounded reads over the store, each a polars frame.

DESIGN.md asks that the dashboard never read raw telemetry of a whole fleet. Every function here is
bounded by construction:

- fleet-wide GPU telemetry is read only over a short window at an instant (the latest samples, or a
  "probe" of one or two sample intervals); a time series over a long range is built from a fixed number
  of such probes, so its cost grows with fleet size × points, never with the length of the range;
- per-job reads go through the ``(job_id, start)`` indexes of ``step`` and ``collective``;
- events, findings and nccl-tests rows are small tables, read by time window with a row limit.

Aggregation happens in SQL (or in polars on the small result). Results carry units in their column
names and keep their declared dtypes even when empty, so pages can test ``df.is_empty()`` and chart
without special cases. The functions take a ``Store`` and plain, hashable arguments so the dashboard can
cache them keyed on those arguments. SQL is written once for SQLite and PostgreSQL; where the two
differ (time bucketing, durations) a helper picks the dialect's form.
"""

from __future__ import annotations

import datetime as dt
import json
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import polars as pl
from sqlalchemy import inspect

from fleetscope.core import frames as F
from fleetscope.store import Store

UTC = F.UTC_US

# Health event kinds that make a GPU "unhealthy" on the overview. Throttling (thermal, power) and NCCL
# warnings are worth seeing but do not by themselves mean the GPU should be drained.
UNHEALTHY_KINDS: tuple[str, ...] = ("xid", "ecc", "row_remap", "nvlink", "sdc")

# When no sample interval can be measured, assume dcgm-exporter's usual scrape interval.
DEFAULT_SAMPLE_INTERVAL_S = 30.0


# --- plumbing --------------------------------------------------------------------------------


def _fetch(store: Store, sql: str, params: Sequence[Any], schema: dict[str, pl.DataType]) -> pl.DataFrame:
    """Run ``sql`` and return exactly the columns of ``schema`` with those dtypes, even when empty."""
    df = store.query(sql, list(params), schema)
    cols = []
    for name, dtype in schema.items():
        if name not in df.columns:
            cols.append(pl.lit(None, dtype).alias(name))
        elif df.schema[name] != dtype:
            cols.append(pl.col(name).cast(dtype, strict=False))
        else:
            cols.append(pl.col(name))
    return df.select(cols) if df.width else pl.DataFrame(schema=schema)


def _as_utc(value: dt.datetime) -> dt.datetime:
    return value.replace(tzinfo=dt.UTC) if value.tzinfo is None else value.astimezone(dt.UTC)


def _bucket_us(store: Store, column: str, bucket_s: int) -> str:
    """SQL for the start of ``column``'s time bucket, as integer µs since the epoch on both databases
    (SQLite stores µs integers; PostgreSQL's timestamptz is converted), so one result schema fits both."""
    bucket_s = max(1, int(bucket_s))
    if store.dialect == "sqlite":
        b = bucket_s * 1_000_000
        return f"(({column} / {b}) * {b})"
    return f"(FLOOR(EXTRACT(EPOCH FROM {column}) / {bucket_s}) * {bucket_s} * 1000000)::bigint"


def _duration_s(store: Store, start: str, end: str) -> str:
    """SQL for ``end - start`` in seconds."""
    if store.dialect == "sqlite":
        return f"(({end} - {start}) / 1e6)"
    return f"EXTRACT(EPOCH FROM ({end} - {start}))::float8"


def _json_number(store: Store, column: str, key: str) -> str:
    """SQL for the number at top-level ``key`` of the JSON text in ``column`` (``key`` is a constant of
    this module, never user input)."""
    if not key.isidentifier():
        raise ValueError(f"JSON key {key!r} must be an identifier")
    if store.dialect == "sqlite":
        return f"json_extract({column}, '$.{key}')"
    return f"(({column})::jsonb ->> '{key}')::float8"


def _site_gpus(site: str | None, params: list[Any], column: str = "gpu_uuid") -> str:
    """A filter on a GPU column to the GPUs of one site (inventory: gpu → host → site)."""
    if site is None:
        return ""
    params.append(site)
    return f" AND {column} IN (SELECT g.gpu_uuid FROM gpu g JOIN host h ON h.host = g.host WHERE h.site_id = ?)"


def _site_is(site: str | None, params: list[Any], column: str = "site_id") -> str:
    """A filter on a table's own site column."""
    if site is None:
        return ""
    params.append(site)
    return f" AND {column} = ?"


def _site_hosts(site: str | None, params: list[Any], column: str = "host") -> str:
    if site is None:
        return ""
    params.append(site)
    return f" AND {column} IN (SELECT host FROM host WHERE site_id = ?)"


def existing_tables(store: Store) -> list[str]:
    """Tables present in the database."""
    return sorted(inspect(store.engine).get_table_names())


def table_rows(store: Store, tables: Sequence[str] | None = None) -> pl.DataFrame:
    """Rows held per table: exact for small tables, an O(1) estimate for the telemetry tables.

    ``COUNT(*)`` over a day of a large fleet's samples takes seconds, so for the big tables SQLite's
    largest rowid (rows are only appended, and retention deletes the oldest) and PostgreSQL's planner
    estimate stand in; ``approximate`` says which is which.
    """
    big = {"gpu_sample", "metric_sample", "collective", "step", "gpu_workload", "step_breakdown", "gpu_energy_minute"}
    present = set(existing_tables(store))
    names = [t for t in (tables or list(F.FRAMES)) if t in present]
    rows: list[tuple[str, int, bool]] = []
    for name in names:
        quoted = '"' + name.replace('"', '""') + '"'
        if name in big and store.dialect == "sqlite":
            sql, approx = f"SELECT COALESCE(MAX(rowid), 0) AS n FROM {quoted}", True
        elif name in big:
            sql, approx = f"SELECT GREATEST(reltuples, 0)::bigint AS n FROM pg_class WHERE oid = '{quoted}'::regclass", True
        else:
            sql, approx = f"SELECT COUNT(*) AS n FROM {quoted}", False
        df = _fetch(store, sql, [], {"n": pl.Int64})
        rows.append((name, int(df["n"][0]) if df.height and df["n"][0] is not None else 0, approx))
    return pl.DataFrame(rows, schema={"table": pl.String, "rows": pl.Int64, "approximate": pl.Boolean}, orient="row")


# --- time anchor ----------------------------------------------------------------------------


def data_end(store: Store) -> dt.datetime | None:
    """The latest instant the GPU telemetry, events, nccl-tests runs or jobs describe (metric series only
    when there is nothing else), or None for an empty database.

    Pages window "the last hour" back from here by default, so a database that stopped receiving data
    (a demo, a replay, an outage) still shows its last hour, with its age in the sidebar. Each part is a
    MAX over an indexed time column (or a small table), so this stays cheap on a large store.
    """
    # metric_sample anchors the window only when nothing else has arrived: its series may be stamped with
    # the start of a period that runs on past the data (an hourly grid intensity for the hour ahead, a
    # forecast), and anchoring there would leave every live panel looking at an empty window.
    sql = (
        "SELECT COALESCE((SELECT MAX(t) FROM ("
        " SELECT MAX(ts) AS t FROM gpu_sample"
        " UNION ALL SELECT MAX(ts) FROM job_event"
        " UNION ALL SELECT MAX(ts) FROM health_event"
        " UNION ALL SELECT MAX(ts) FROM nccl_test"
        " UNION ALL SELECT MAX(started_at) FROM job"
        " UNION ALL SELECT MAX(ended_at) FROM job"
        ") x), (SELECT MAX(ts) FROM metric_sample)) AS t"
    )
    df = _fetch(store, sql, [], {"t": UTC})
    return df["t"][0] if df.height else None


def data_start(store: Store) -> dt.datetime | None:
    """The earliest GPU sample held (indexed MIN), or None."""
    df = _fetch(store, "SELECT MIN(ts) AS t FROM gpu_sample", [], {"t": UTC})
    return df["t"][0] if df.height else None


def sample_interval_s(store: Store, at: dt.datetime) -> float:
    """The GPU sampling interval near ``at``: the median gap between the last few samples of the GPU
    sampled last before ``at`` (two indexed lookups). Falls back to DEFAULT_SAMPLE_INTERVAL_S."""
    at = _as_utc(at)
    last = _fetch(store, "SELECT gpu_uuid FROM gpu_sample WHERE ts <= ? ORDER BY ts DESC LIMIT 1", [at], {"gpu_uuid": pl.String})
    if last.is_empty():
        last = _fetch(store, "SELECT gpu_uuid FROM gpu_sample WHERE ts > ? ORDER BY ts LIMIT 1", [at], {"gpu_uuid": pl.String})
    if last.is_empty():
        return DEFAULT_SAMPLE_INTERVAL_S
    ts = _fetch(
        store,
        "SELECT ts FROM gpu_sample WHERE gpu_uuid = ? AND ts <= ? ORDER BY ts DESC LIMIT 9",
        [last["gpu_uuid"][0], at + dt.timedelta(days=1)],
        {"ts": UTC},
    )["ts"]
    if ts.len() < 2:
        return DEFAULT_SAMPLE_INTERVAL_S
    gaps = (ts.sort().diff().dt.total_microseconds() / 1e6).drop_nulls()
    gap = gaps.median()
    return float(gap) if gap and gap > 0 else DEFAULT_SAMPLE_INTERVAL_S


# --- inventory -------------------------------------------------------------------------------


def sites(store: Store) -> pl.DataFrame:
    """``site_id, name`` of every site in the inventory (from hosts too, where no site row exists)."""
    sql = (
        "SELECT s.site_id, s.name FROM site s"
        " UNION SELECT DISTINCT h.site_id, NULL FROM host h"
        " WHERE h.site_id IS NOT NULL AND h.site_id NOT IN (SELECT site_id FROM site)"
        " ORDER BY 1"
    )
    return _fetch(store, sql, [], {"site_id": pl.String, "name": pl.String})


def fleet_size(store: Store, site: str | None = None) -> pl.DataFrame:
    """One row: ``sites, hosts, gpus`` in the inventory (optionally of one site)."""
    params: list[Any] = []
    where = ""
    if site is not None:
        where = " WHERE h.site_id = ?"
        params.append(site)
    sql = (
        "SELECT COUNT(DISTINCT h.site_id) AS sites, COUNT(DISTINCT g.host) AS hosts, COUNT(*) AS gpus"
        f" FROM gpu g LEFT JOIN host h ON h.host = g.host{where}"
    )
    return _fetch(store, sql, params, {"sites": pl.Int64, "hosts": pl.Int64, "gpus": pl.Int64})


# --- GPU telemetry at an instant ---------------------------------------------------------------


_LATEST_COLUMNS = (
    "util_ratio",
    "power_w",
    "energy_j",
    "temp_c",
    "mem_temp_c",
    "fb_used_bytes",
    "sm_clock_mhz",
    "xid_last",
    "ecc_dbe_volatile_total",
    "remap_pending",
    "clock_event_reasons",
)


def _lookback(store: Store, end: dt.datetime, lookback_s: float | None) -> float:
    # Three sample intervals: a GPU whose last scrape was slow or dropped still counts as reporting.
    return float(lookback_s) if lookback_s else max(60.0, 3 * sample_interval_s(store, end))


def latest_gpu_samples(store: Store, end: dt.datetime, lookback_s: float | None = None, site: str | None = None) -> pl.DataFrame:
    """The latest sample of every GPU that reported in ``[end - lookback_s, end)``, with its place in
    the inventory: ``gpu_uuid, host, gpu_index, site_id, ts`` and the fields in ``_LATEST_COLUMNS``.

    Reads about ``lookback_s / interval`` rows per GPU, through the ``ts`` index.
    """
    end = _as_utc(end)
    start = end - dt.timedelta(seconds=_lookback(store, end, lookback_s))
    params: list[Any] = [start, end]
    site_sql = _site_gpus(site, params)
    fields = ", ".join(f"s.{c}" for c in _LATEST_COLUMNS)
    sql = (
        f"SELECT x.gpu_uuid, g.host, g.gpu_index, h.site_id, x.ts, {', '.join('x.' + c for c in _LATEST_COLUMNS)} FROM ("
        f" SELECT s.gpu_uuid, s.ts, {fields}, ROW_NUMBER() OVER (PARTITION BY s.gpu_uuid ORDER BY s.ts DESC) AS rn"
        f" FROM gpu_sample s WHERE s.ts >= ? AND s.ts < ?{site_sql}"
        ") x LEFT JOIN gpu g ON g.gpu_uuid = x.gpu_uuid LEFT JOIN host h ON h.host = g.host"
        " WHERE x.rn = 1 ORDER BY g.host, g.gpu_index, x.gpu_uuid"
    )
    schema: dict[str, pl.DataType] = {"gpu_uuid": pl.String, "host": pl.String, "gpu_index": pl.Int64, "site_id": pl.String, "ts": UTC}
    schema |= {c: F.GPU_SAMPLE.schema[c] for c in _LATEST_COLUMNS}
    return _fetch(store, sql, params, schema)


def power_now(store: Store, end: dt.datetime, lookback_s: float | None = None, site: str | None = None) -> pl.DataFrame:
    """One row: ``as_of`` (newest sample), ``gpus_reporting`` and their summed latest ``power_w``."""
    df = latest_gpu_samples(store, end, lookback_s, site)
    return pl.DataFrame(
        {
            "as_of": [df["ts"].max() if df.height else None],
            "gpus_reporting": [df.height],
            "power_w": [float(df["power_w"].sum()) if df.height and df["power_w"].null_count() < df.height else None],
        },
        schema={"as_of": UTC, "gpus_reporting": pl.Int64, "power_w": pl.Float64},
    )


def gpu_activity(
    store: Store, end: dt.datetime, window_s: float = 300, busy_util_ratio: float = 0.1, site: str | None = None
) -> pl.DataFrame:
    """Per GPU that reported in ``[end - window_s, end)``: mean utilisation and power over the window and
    whether it counts as busy (mean ``util_ratio`` at or above ``busy_util_ratio``).

    Columns: ``gpu_uuid, host, gpu_index, site_id, samples, util_mean_ratio, power_mean_w, last_ts, busy``.
    """
    end = _as_utc(end)
    params: list[Any] = [end - dt.timedelta(seconds=window_s), end]
    site_sql = _site_gpus(site, params)
    sql = (
        "SELECT a.gpu_uuid, g.host, g.gpu_index, h.site_id, a.samples, a.util_mean_ratio, a.power_mean_w, a.last_ts FROM ("
        " SELECT gpu_uuid, COUNT(*) AS samples, AVG(util_ratio) AS util_mean_ratio, AVG(power_w) AS power_mean_w, MAX(ts) AS last_ts"
        f" FROM gpu_sample WHERE ts >= ? AND ts < ?{site_sql} GROUP BY gpu_uuid"
        ") a LEFT JOIN gpu g ON g.gpu_uuid = a.gpu_uuid LEFT JOIN host h ON h.host = g.host"
    )
    schema = {
        "gpu_uuid": pl.String,
        "host": pl.String,
        "gpu_index": pl.Int64,
        "site_id": pl.String,
        "samples": pl.Int64,
        "util_mean_ratio": pl.Float64,
        "power_mean_w": pl.Float64,
        "last_ts": UTC,
    }
    df = _fetch(store, sql, params, schema)
    return df.with_columns(busy=(pl.col("util_mean_ratio").fill_null(0.0) >= busy_util_ratio))


def unhealthy_gpus(store: Store, start: dt.datetime, end: dt.datetime, site: str | None = None) -> pl.DataFrame:
    """GPUs with a health event of an UNHEALTHY_KINDS kind in ``[start, end)``: ``gpu_uuid, host,
    events, kinds`` (comma-separated), ``last_ts``. Host-level events (no GPU) are left to the grid."""
    params: list[Any] = [_as_utc(start), _as_utc(end), *UNHEALTHY_KINDS]
    site_sql = _site_hosts(site, params)
    kinds = ", ".join("?" for _ in UNHEALTHY_KINDS)
    sql = (
        "SELECT gpu_uuid, MAX(host) AS host, COUNT(*) AS events, MAX(ts) AS last_ts FROM health_event"
        f" WHERE ts >= ? AND ts < ? AND kind IN ({kinds}) AND gpu_uuid <> ''{site_sql} GROUP BY gpu_uuid"
    )
    df = _fetch(store, sql, params, {"gpu_uuid": pl.String, "host": pl.String, "events": pl.Int64, "last_ts": UTC})
    kinds_df = _fetch(
        store,
        f"SELECT DISTINCT gpu_uuid, kind FROM health_event WHERE ts >= ? AND ts < ? AND kind IN ({kinds}) AND gpu_uuid <> ''{site_sql}",
        params,
        {"gpu_uuid": pl.String, "kind": pl.String},
    )
    kinds_by_gpu = kinds_df.group_by("gpu_uuid").agg(pl.col("kind").sort().str.join(", ").alias("kinds"))
    return df.join(kinds_by_gpu, on="gpu_uuid", how="left").select("gpu_uuid", "host", "events", "kinds", "last_ts").sort("gpu_uuid")


def gpu_state_counts(
    store: Store,
    end: dt.datetime,
    window_s: float = 300,
    busy_util_ratio: float = 0.1,
    health_window_s: float = 3600,
    site: str | None = None,
) -> pl.DataFrame:
    """One row splitting the fleet into disjoint states at ``end``:

    ``gpus`` (inventory) = ``unhealthy`` (a serious health event in the last ``health_window_s``)
    + ``busy`` / ``idle`` (reporting, mean utilisation over ``window_s`` at or above / below the threshold)
    + ``silent`` (in the inventory, no sample in the window). ``reporting`` counts GPUs with samples,
    including ones not (yet) in the inventory.
    """
    end = _as_utc(end)
    size = fleet_size(store, site)
    inventory = int(size["gpus"][0]) if size.height else 0
    act = gpu_activity(store, end, window_s, busy_util_ratio, site)
    bad = unhealthy_gpus(store, end - dt.timedelta(seconds=health_window_s), end, site)
    bad_set = set(bad["gpu_uuid"].to_list())
    healthy = act.filter(~pl.col("gpu_uuid").is_in(list(bad_set)))
    busy = int(healthy["busy"].sum()) if healthy.height else 0
    idle = healthy.height - busy
    silent = max(0, inventory - act.height - len(bad_set - set(act["gpu_uuid"].to_list())))
    return pl.DataFrame(
        {"gpus": [max(inventory, act.height)], "reporting": [act.height], "busy": [busy], "idle": [idle], "unhealthy": [len(bad_set)], "silent": [silent]},
        schema={k: pl.Int64 for k in ("gpus", "reporting", "busy", "idle", "unhealthy", "silent")},
    )


def health_grid(
    store: Store, end: dt.datetime, lookback_s: float | None = None, health_window_s: float = 3600, site: str | None = None, max_hosts: int = 64
) -> pl.DataFrame:
    """Host × GPU grid of the latest temperature, power and XID, with health events in the last
    ``health_window_s``: ``host, gpu_index, gpu_uuid, temp_c, power_w, xid_last, events, status``.

    ``status`` is ``unhealthy`` (an UNHEALTHY_KINDS event in the window: the same rule as
    ``gpu_state_counts``, so grid and counts agree), ``hot`` (≥ 85 °C), ``silent`` (no recent sample) or
    ``ok``; ``xid_last`` is shown, not judged, since DCGM keeps reporting the last XID long after it.
    Hosts are ordered worst first and cut at ``max_hosts``: a 16k-GPU fleet has 2,048 hosts, more than a
    screen shows, and the ones needing attention are the point of the grid.
    """
    end = _as_utc(end)
    latest = latest_gpu_samples(store, end, lookback_s, site)
    params: list[Any] = [end - dt.timedelta(seconds=health_window_s), end]
    site_sql = _site_hosts(site, params)
    ev = _fetch(
        store,
        f"SELECT host, gpu_uuid, kind, COUNT(*) AS events FROM health_event WHERE ts >= ? AND ts < ?{site_sql} GROUP BY host, gpu_uuid, kind",
        params,
        {"host": pl.String, "gpu_uuid": pl.String, "kind": pl.String, "events": pl.Int64},
    )
    ev_gpu = ev.filter(pl.col("gpu_uuid") != "").group_by("gpu_uuid").agg(
        pl.col("events").sum().alias("events"),
        pl.col("kind").is_in(list(UNHEALTHY_KINDS)).any().alias("serious"),
    )
    inv_params: list[Any] = []
    inv_where = ""
    if site is not None:
        inv_where = " WHERE h.site_id = ?"
        inv_params.append(site)
    inventory = _fetch(
        store,
        f"SELECT g.gpu_uuid, g.host, g.gpu_index FROM gpu g LEFT JOIN host h ON h.host = g.host{inv_where}",
        inv_params,
        {"gpu_uuid": pl.String, "host": pl.String, "gpu_index": pl.Int64},
    )
    grid = (
        inventory.join(latest.select("gpu_uuid", "ts", "temp_c", "power_w", "xid_last"), on="gpu_uuid", how="full", coalesce=True)
        .join(ev_gpu, on="gpu_uuid", how="left")
        .with_columns(
            pl.col("host").fill_null("(unknown host)"),
            pl.col("gpu_index").fill_null(-1),
            pl.col("events").fill_null(0),
            pl.col("serious").fill_null(False),
        )
    )
    if grid.is_empty():
        return pl.DataFrame(
            schema={"host": pl.String, "gpu_index": pl.Int64, "gpu_uuid": pl.String, "temp_c": pl.Float64, "power_w": pl.Float64,
                    "xid_last": pl.Int64, "events": pl.Int64, "status": pl.String}
        )
    status = (
        pl.when(pl.col("serious"))
        .then(pl.lit("unhealthy"))
        .when(pl.col("ts").is_null())
        .then(pl.lit("silent"))
        .when(pl.col("temp_c").fill_null(0) >= 85)
        .then(pl.lit("hot"))
        .otherwise(pl.lit("ok"))
    )
    grid = grid.with_columns(status=status)
    rank = {"unhealthy": 3, "hot": 2, "silent": 1, "ok": 0}
    worst = (
        grid.group_by("host")
        .agg(pl.col("status").replace_strict(rank, return_dtype=pl.Int64).max().alias("worst"), pl.col("events").sum().alias("host_events"))
        .sort(["worst", "host_events", "host"], descending=[True, True, False])
        .head(max_hosts)
    )
    order = worst.select("host").with_row_index("host_order")
    return (
        grid.join(order, on="host", how="inner")
        .sort("host_order", "gpu_index")
        .select("host", "gpu_index", "gpu_uuid", "temp_c", "power_w", "xid_last", "events", "status")
    )


# --- GPU telemetry over a range: probes ------------------------------------------------------------


def fleet_series(
    store: Store,
    start: dt.datetime,
    end: dt.datetime,
    points: int = 48,
    busy_util_ratio: float = 0.1,
    site: str | None = None,
) -> pl.DataFrame:
    """Fleet power and utilisation at ``points`` instants evenly spread over ``(start, end]``.

    Each point is a probe: the GPUs' samples over the 1.5 sample intervals before the instant, averaged
    per GPU, then summed (power) or counted (busy GPUs) across the fleet. Reading a probe per point
    instead of every sample keeps a day of a 16k-GPU fleet at ``points`` × 16k rows, the same as an hour.
    Columns: ``ts, gpus_reporting, gpus_busy, util_mean_ratio, power_w, temp_max_c``.
    """
    start, end = _as_utc(start), _as_utc(end)
    schema = {
        "ts": UTC,
        "gpus_reporting": pl.Int64,
        "gpus_busy": pl.Int64,
        "util_mean_ratio": pl.Float64,
        "power_w": pl.Float64,
        "temp_max_c": pl.Float64,
    }
    first = data_start(store)
    if first is None or end <= start:
        return pl.DataFrame(schema=schema)
    start = max(start, first)
    probe = dt.timedelta(seconds=1.5 * max(sample_interval_s(store, end), sample_interval_s(store, start)))
    points = max(1, int(points))
    step = (end - start) / points
    parts: list[str] = []
    params: list[Any] = []
    for i in range(points):
        at = start + step * (i + 1)
        params += [at, busy_util_ratio, at - probe, at]
        site_sql = _site_gpus(site, params)
        parts.append(
            "SELECT ? AS ts, COUNT(*) AS gpus_reporting, SUM(CASE WHEN u >= ? THEN 1 ELSE 0 END) AS gpus_busy,"
            " AVG(u) AS util_mean_ratio, SUM(p) AS power_w, MAX(t) AS temp_max_c FROM ("
            " SELECT gpu_uuid, AVG(util_ratio) AS u, AVG(power_w) AS p, MAX(temp_c) AS t"
            f" FROM gpu_sample WHERE ts >= ? AND ts < ?{site_sql} GROUP BY gpu_uuid) x"
        )
    df = _fetch(store, " UNION ALL ".join(parts), params, schema)
    return df.filter(pl.col("gpus_reporting") > 0).sort("ts")


def rollup_power(store: Store, start: dt.datetime, end: dt.datetime, site: str | None = None, bucket_s: int = 1800) -> pl.DataFrame:
    """Mean GPU power per site and time bucket over ``[start, end)`` from the per-site energy roll-up
    (``site_energy_minute``): ``ts, site_id, power_w, gpus`` — the bucket's energy over the minutes rolled up
    in it. One row per site and minute is read, so a day costs the same for 16 or 16,384 GPUs. GPUs the
    inventory places at no site are not in the roll-up; empty before the first roll-up of the window."""
    start, end = _as_utc(start), _as_utc(end)
    params: list[Any] = [start, end]
    site_sql = _site_is(site, params)
    bucket = _bucket_us(store, "minute", max(60, int(bucket_s)))
    sql = (f"SELECT {bucket} AS ts, site_id, SUM(energy_j) / (60.0 * COUNT(DISTINCT minute)) AS power_w, MAX(gpus) AS gpus"
           f" FROM site_energy_minute WHERE minute >= ? AND minute < ?{site_sql} GROUP BY 1, 2 ORDER BY 1, 2")
    return _fetch(store, sql, params, {"ts": UTC, "site_id": pl.String, "power_w": pl.Float64, "gpus": pl.Int64})


def gpu_energy(store: Store, start: dt.datetime, end: dt.datetime, site: str | None = None) -> pl.DataFrame:
    """GPU energy per site over ``[start, end)`` from the GPUs' energy counters: ``site_id, gpus, energy_j``.

    The counter is read at two probes (the first samples after ``start``, or after the data begins, and
    the last before ``end``); a GPU's energy is the difference, and a counter that went backwards
    (driver reload) counts as zero rather than negative.
    """
    start, end = _as_utc(start), _as_utc(end)
    schema = {"site_id": pl.String, "gpus": pl.Int64, "energy_j": pl.Float64}
    first = data_start(store)
    if first is None or end <= start:
        return pl.DataFrame(schema=schema)
    start = max(start, first)
    probe = dt.timedelta(seconds=1.5 * max(sample_interval_s(store, end), sample_interval_s(store, start)))
    params: list[Any] = [start, start + probe, end - probe, end]
    site_sql = _site_gpus(site, params, "a.gpu_uuid")
    sql = (
        "SELECT h.site_id, COUNT(*) AS gpus,"
        " SUM(CASE WHEN b.e > a.e THEN b.e - a.e ELSE 0 END) AS energy_j FROM"
        " (SELECT gpu_uuid, MIN(energy_j) AS e FROM gpu_sample WHERE ts >= ? AND ts < ? GROUP BY gpu_uuid) a"
        " JOIN (SELECT gpu_uuid, MAX(energy_j) AS e FROM gpu_sample WHERE ts >= ? AND ts < ? GROUP BY gpu_uuid) b"
        " ON b.gpu_uuid = a.gpu_uuid"
        " LEFT JOIN gpu g ON g.gpu_uuid = a.gpu_uuid LEFT JOIN host h ON h.host = g.host"
        f" WHERE a.e IS NOT NULL AND b.e IS NOT NULL{site_sql} GROUP BY h.site_id ORDER BY 1"
    )
    return _fetch(store, sql, params, schema)


def site_carbon(store: Store, start: dt.datetime, end: dt.datetime, site: str | None = None) -> pl.DataFrame:
    """Scope 2 per site over ``[start, end)`` from the per-minute energy roll-ups, location- and market-based
    side by side (``fleetscope.energy_service.site_scope2``: energy × PUE, hourly or annual grid intensity,
    the site's recorded contractual instruments): ``site_id, energy_kwh, location_kgco2e, market_kgco2e,
    covered_kwh, instruments, pue, energy_basis, uncovered_basis``. Sites that used no energy are left out.
    The roll-ups are summed per site and minute in the database, so the cost follows the window."""
    from fleetscope.energy_service import site_scope2

    schema = {"site_id": pl.String, "energy_kwh": pl.Float64, "location_kgco2e": pl.Float64, "market_kgco2e": pl.Float64,
              "covered_kwh": pl.Float64, "instruments": pl.String, "pue": pl.Float64, "energy_basis": pl.String, "uncovered_basis": pl.String}
    start, end = _as_utc(start), _as_utc(end)
    known = _fetch(store, "SELECT site_id FROM site ORDER BY 1", [], {"site_id": pl.String})["site_id"].to_list()
    ids = [s for s in known if site is None or s == site]
    if not ids or end <= start:
        return pl.DataFrame(schema=schema)
    df = site_scope2(store, start, end, ids).filter(pl.col("energy_j") > 0)
    return df.select(
        "site_id", (pl.col("energy_j") / 3.6e6).alias("energy_kwh"), "location_kgco2e", "market_kgco2e",
        (pl.col("covered_energy_j") / 3.6e6).alias("covered_kwh"), "instruments", "pue", "energy_basis", "uncovered_basis",
    ).cast(schema)


def energy_rollup_end(store: Store) -> dt.datetime | None:
    """The end of the newest minute the energy roll-up (``gpu_energy_minute``) holds, or None before any."""
    df = _fetch(store, "SELECT MAX(minute) AS t FROM gpu_energy_minute", [], {"t": UTC})
    t = df["t"][0] if df.height else None
    return None if t is None else t + dt.timedelta(minutes=1)


_SITE_HOUR = {"site_id": pl.String, "hour": UTC, "gpus": pl.Int64, "energy_j": pl.Float64}
_SITE_HOUR_CARBON = {**_SITE_HOUR, "g_per_kwh": pl.Float64, "intensity_basis": pl.String, "kgco2e": pl.Float64}


def _location_carbon(store: Store, energy: pl.DataFrame, start: dt.datetime, end: dt.datetime) -> pl.DataFrame:
    """``energy`` (site_id, hour, gpus, energy_j) with location-based emissions (analyzers.carbon.location_based:
    the site's hourly grid intensity where ``grid_intensity_g_per_kwh`` series cover the hour, else its
    annual figure). Rows of sites outside the inventory keep null emissions."""
    if energy.is_empty():
        return pl.DataFrame(schema=_SITE_HOUR_CARBON)
    from analyzers import carbon
    from fleetscope.energy_service import metric_samples

    site_rows = store.read("site")
    known = energy.filter(pl.col("site_id").is_in(site_rows["site_id"].implode()))
    intensity = metric_samples(store, (carbon.INTENSITY_SERIES,), start.replace(minute=0, second=0, microsecond=0), end)
    located = carbon.location_based(known, site_rows, metric_sample=intensity, time_col="hour") if known.height else known
    rest = energy.join(known.select("site_id", "hour"), on=["site_id", "hour"], how="anti", nulls_equal=True)
    return pl.concat([located.select(list(_SITE_HOUR_CARBON)), rest], how="diagonal_relaxed").select(
        [pl.col(c).cast(t) for c, t in _SITE_HOUR_CARBON.items()]
    ).sort("site_id", "hour", nulls_last=True)


def energy_by_site_hour(store: Store, start: dt.datetime, end: dt.datetime, site: str | None = None) -> pl.DataFrame:
    """GPU energy per site and UTC hour over ``[start, end)`` from the per-minute roll-ups the worker writes
    (``gpu_energy_minute``, fleetscope.energy_service), with location-based emissions: ``site_id, hour,
    gpus, energy_j, g_per_kwh, intensity_basis, kgco2e``. GPUs outside the inventory's sites come as
    site_id null, without emissions.

    Reads the window's roll-up rows through the ``minute`` index: the cost follows GPUs × minutes, about
    4 s an hour for 16,384 GPUs on SQLite, so fleet-wide headlines read the counters instead
    (``counter_energy_by_site_hour``) and use this where a GPU has no energy counter.
    """
    start, end = _as_utc(start), _as_utc(end)
    params: list[Any] = [start, end]
    site_sql = _site_gpus(site, params, "m.gpu_uuid")
    sql = (
        f"SELECT h.site_id, {_bucket_us(store, 'm.minute', 3600)} AS hour, COUNT(DISTINCT m.gpu_uuid) AS gpus, SUM(m.energy_j) AS energy_j"
        " FROM gpu_energy_minute m LEFT JOIN gpu g ON g.gpu_uuid = m.gpu_uuid LEFT JOIN host h ON h.host = g.host"
        f" WHERE m.minute >= ? AND m.minute < ?{site_sql} GROUP BY 1, 2 ORDER BY 1, 2"
    )
    return _location_carbon(store, _fetch(store, sql, params, _SITE_HOUR), start, end)


def counter_energy_by_site_hour(store: Store, start: dt.datetime, end: dt.datetime, site: str | None = None) -> pl.DataFrame:
    """GPU energy per site and UTC hour over ``[start, end)`` from the GPUs' energy counters, with
    location-based emissions (the columns of ``energy_by_site_hour``).

    The counter is read at a probe after ``start`` (or the first sample), after each hour boundary and
    after ``end`` (before it, where no sample follows ``end`` yet); a GPU's energy in an hour is the rise
    of its counter between consecutive probes, and a counter that went backwards (driver reload) counts
    as zero. Reading after each boundary gives the interval that straddles it to one hour only, so the
    hours of a day read one by one add up to the day read at once (the dashboard caches settled hours).
    The cost is GPUs × (hours + 1) probe rows, whatever the sample rate: about 0.2 s an hour for 16,384
    GPUs on SQLite.
    """
    start, end = _as_utc(start), _as_utc(end)
    first = data_start(store)
    if first is None or end <= max(start, first):
        return pl.DataFrame(schema=_SITE_HOUR_CARBON)
    start = max(start, first)
    probe = dt.timedelta(seconds=1.5 * max(sample_interval_s(store, end), sample_interval_s(store, start)))
    followed = _fetch(store, "SELECT ts FROM gpu_sample WHERE ts >= ? AND ts < ? LIMIT 1", [end, end + probe], {"ts": UTC}).height > 0
    if not followed:
        # The window runs past the data: close it at the newest sample instead.
        last = _fetch(store, "SELECT MAX(ts) AS ts FROM gpu_sample WHERE ts < ?", [end], {"ts": UTC})["ts"][0]
        if last is None or last < start:
            return pl.DataFrame(schema=_SITE_HOUR_CARBON)
        end = min(end, last + dt.timedelta(microseconds=1))
    bounds = [start]
    hour = start.replace(minute=0, second=0, microsecond=0) + dt.timedelta(hours=1)
    while hour < end:
        bounds.append(hour)
        hour += dt.timedelta(hours=1)
    parts: list[str] = []
    params: list[Any] = []
    closing = (end, "MIN", end, end + probe) if followed else (end, "MAX", end - probe, end)
    # Probe k's reading closes hour k-1 and opens hour k; the last probe only closes.
    for k, (at, agg, lo, hi) in enumerate([(b, "MIN", b, b + probe) for b in bounds] + [closing]):
        params += [lo, hi]
        site_sql = _site_gpus(site, params)
        parts.append(f"SELECT {k} AS k, gpu_uuid, {agg}(energy_j) AS e FROM gpu_sample WHERE ts >= ? AND ts < ?{site_sql} GROUP BY gpu_uuid")
    sql = (
        "SELECT h.site_id, x.k, COUNT(*) AS gpus, SUM(CASE WHEN x.d > 0 THEN x.d ELSE 0 END) AS energy_j FROM ("
        " SELECT k, gpu_uuid, LEAD(e) OVER (PARTITION BY gpu_uuid ORDER BY k) - e AS d FROM (" + " UNION ALL ".join(parts) + ") p"
        " WHERE e IS NOT NULL) x LEFT JOIN gpu g ON g.gpu_uuid = x.gpu_uuid LEFT JOIN host h ON h.host = g.host"
        " WHERE x.d IS NOT NULL GROUP BY 1, 2 ORDER BY 1, 2"
    )
    rises = _fetch(store, sql, params, {"site_id": pl.String, "k": pl.Int64, "gpus": pl.Int64, "energy_j": pl.Float64})
    hours = pl.DataFrame({"k": list(range(len(bounds))), "hour": [b.replace(minute=0, second=0, microsecond=0) for b in bounds]},
                         schema={"k": pl.Int64, "hour": UTC})
    energy = rises.join(hours, on="k").group_by("site_id", "hour").agg(pl.col("gpus").max(), pl.col("energy_j").sum()).select(list(_SITE_HOUR))
    return _location_carbon(store, energy, start, end)


def pue_over_time(store: Store, start: dt.datetime, end: dt.datetime, site: str | None = None, bucket_s: int = 900) -> pl.DataFrame:
    """PUE per site and time bucket from the facility and IT meter series (``analyzers.energy.pue_series``:
    ISO/IEC 30134-2, category from the IT metering point): ``site_id, ts, pue, category, facility_energy_j,
    it_energy_j``. Reads the meter series by name only: a handful of series per site."""
    from analyzers import energy
    from fleetscope.energy_service import METER_SERIES, PAD, metric_samples

    start, end = _as_utc(start), _as_utc(end)
    bucket_s = max(60, int(bucket_s) // 60 * 60)
    meters = metric_samples(store, METER_SERIES, start - PAD, end + PAD)
    # by the site label pue_series itself parses, not a second text match on the series key
    out = energy.pue_series(meters, window_start=start, window_end=end, bucket_s=bucket_s)
    return out if site is None else out.filter(pl.col("site_id") == site)


_JOB_ENERGY = {"job_id": pl.String, "model_name": pl.String, "kind": pl.String, "energy_j": pl.Float64, "gpu_hours": pl.Float64,
               "gpus": pl.Int64, "location_kgco2e": pl.Float64, "embodied_kgco2e": pl.Float64}


def energy_by_job(store: Store, start: dt.datetime, end: dt.datetime, site: str | None = None, limit: int = 50) -> pl.DataFrame:
    """The jobs that used the most GPU energy in ``[start, end)``, from the per-job minutes the roll-up
    writes (``job_energy_minute``): ``job_id, model_name, kind, energy_j, gpu_hours, gpus, location_kgco2e,
    embodied_kgco2e``. Emissions are location-based (each hour's energy × its site's grid intensity);
    embodied emissions are amortised by GPU-hours held (``analyzers.carbon.embodied_by``, BLOOM's method)."""
    start, end = _as_utc(start), _as_utc(end)
    rows = _job_hours(store, start, end, site, top=int(limit))
    if rows.is_empty():
        return pl.DataFrame(schema=_JOB_ENERGY)
    return _job_energy_totals(store, rows, start, end).sort("energy_j", descending=True)


def energy_by_model(store: Store, start: dt.datetime, end: dt.datetime, site: str | None = None) -> pl.DataFrame:
    """GPU energy of each ML model's jobs in ``[start, end)``, training and serving apart, from
    ``job_energy_minute`` and the job inventory: ``model_name, kind, jobs, energy_j, gpu_hours,
    location_kgco2e, embodied_kgco2e``. Jobs with no model in the inventory come as model_name null."""
    start, end = _as_utc(start), _as_utc(end)
    schema = {"model_name": pl.String, "kind": pl.String, "jobs": pl.Int64, "energy_j": pl.Float64, "gpu_hours": pl.Float64,
              "location_kgco2e": pl.Float64, "embodied_kgco2e": pl.Float64}
    rows = _job_hours(store, start, end, site)
    if rows.is_empty():
        return pl.DataFrame(schema=schema)
    return (
        _job_energy_totals(store, rows, start, end).group_by("model_name", "kind")
        .agg(pl.len().cast(pl.Int64).alias("jobs"), pl.col("energy_j").sum(), pl.col("gpu_hours").sum(),
             pl.col("location_kgco2e").sum(), pl.col("embodied_kgco2e").sum())
        .select(list(schema)).cast(schema).sort("energy_j", descending=True)
    )


def _job_hours(store: Store, start: dt.datetime, end: dt.datetime, site: str | None, top: int | None = None) -> pl.DataFrame:
    """``job_energy_minute`` summed per job, site and UTC hour (of the ``top`` jobs by energy, or all):
    job_id, site_id, hour, energy_j, allocated_s, gpus."""
    params: list[Any] = []
    jobs_sql = ""
    if top is not None:
        params += [start, end]
        jobs_sql = (f" AND e.job_id IN (SELECT job_id FROM job_energy_minute WHERE minute >= ? AND minute < ?{_site_is(site, params)}"
                    " GROUP BY job_id ORDER BY SUM(energy_j) DESC LIMIT ?)")
        params.append(top)
    params = [start, end] + ([site] if site is not None else []) + params
    sql = (
        f"SELECT e.job_id, e.site_id, {_bucket_us(store, 'e.minute', 3600)} AS hour, SUM(e.energy_j) AS energy_j,"
        " SUM(e.allocated_s) AS allocated_s, MAX(e.gpus) AS gpus FROM job_energy_minute e"
        f" WHERE e.minute >= ? AND e.minute < ?{' AND e.site_id = ?' if site is not None else ''}{jobs_sql} GROUP BY 1, 2, 3"
    )
    return _fetch(store, sql, params, {"job_id": pl.String, "site_id": pl.String, "hour": UTC, "energy_j": pl.Float64,
                                      "allocated_s": pl.Float64, "gpus": pl.Int64})


def _job_energy_totals(store: Store, rows: pl.DataFrame, start: dt.datetime, end: dt.datetime) -> pl.DataFrame:
    """Per-job totals of (job_id, site_id, hour) energy rows: location-based kgCO2e from the hours' grid
    intensity, GPU-hours, embodied kgCO2e, and the job's model and kind from the inventory."""
    from analyzers import carbon

    rows = rows.with_columns(pl.when(pl.col("site_id") != "").then(pl.col("site_id")).alias("site_id"))
    located = _location_carbon(store, rows.group_by("site_id", "hour").agg(pl.col("gpus").max(), pl.col("energy_j").sum()), start, end)
    # each job's share of its site-hour's emissions, by energy
    per_kwh = located.select("site_id", "hour", (pl.col("kgco2e") / pl.col("energy_j")).alias("kg_per_j"))
    rows = rows.join(per_kwh, on=["site_id", "hour"], how="left", nulls_equal=True).with_columns(
        (pl.col("energy_j") * pl.col("kg_per_j")).alias("location_kgco2e"))
    by = ["job_id"]
    totals = rows.group_by(by).agg(
        pl.col("energy_j").sum(), pl.col("allocated_s").sum(), pl.col("gpus").max(),
        pl.when(pl.col("location_kgco2e").null_count() == 0).then(pl.col("location_kgco2e").sum()).alias("location_kgco2e"))
    emb = carbon.embodied_by(totals, by).select(*by, "gpu_hours", "embodied_kgco2e")
    jobs = _fetch(store, "SELECT job_id, model_name, kind FROM job", [], {"job_id": pl.String, "model_name": pl.String, "kind": pl.String})
    return totals.join(emb, on=by).join(jobs, on="job_id", how="left").select(list(_JOB_ENERGY)).cast(_JOB_ENERGY)


def embodied_by_site(store: Store, start: dt.datetime, end: dt.datetime, site: str | None = None) -> pl.DataFrame:
    """Embodied emissions of the GPUs and servers each site used in ``[start, end)``, amortised by GPU-hours
    with energy data (``site_energy_minute.gpus``; ``analyzers.carbon.embodied_by``, the method of the BLOOM
    footprint study): ``site_id, gpu_hours, embodied_kgco2e, embodied_basis``. Reported apart from Scope 2."""
    from analyzers import carbon

    params: list[Any] = [_as_utc(start), _as_utc(end)]
    site_sql = _site_is(site, params)
    df = _fetch(store, f"SELECT site_id, SUM(gpus) * 60.0 AS allocated_s FROM site_energy_minute WHERE minute >= ? AND minute < ?{site_sql}"
                " GROUP BY site_id ORDER BY site_id", params, {"site_id": pl.String, "allocated_s": pl.Float64})
    schema = {"site_id": pl.String, "gpu_hours": pl.Float64, "embodied_kgco2e": pl.Float64, "embodied_basis": pl.String}
    if df.is_empty():
        return pl.DataFrame(schema=schema)
    return carbon.embodied_by(df, ["site_id"]).select(list(schema))


def metric_series(store: Store, name_like: str, start: dt.datetime, end: dt.datetime, bucket_s: int = 900) -> pl.DataFrame:
    """Mean value per time bucket of the ``metric_sample`` series whose name matches ``name_like`` (SQL
    LIKE): ``ts, series, value_mean``. Facility meters (PUE, site power, grid intensity) arrive this way."""
    bucket = _bucket_us(store, "m.ts", bucket_s)
    sql = (
        f"SELECT {bucket} AS ts, s.series, AVG(m.value) AS value_mean FROM metric_sample m JOIN series s ON s.series_id = m.series_id"
        " WHERE s.name LIKE ? AND m.ts >= ? AND m.ts < ? GROUP BY 1, 2 ORDER BY 1, 2"
    )
    return _fetch(store, sql, [name_like, _as_utc(start), _as_utc(end)], {"ts": UTC, "series": pl.String, "value_mean": pl.Float64})


# --- health events and findings -----------------------------------------------------------------


def health_events_over_time(
    store: Store, start: dt.datetime, end: dt.datetime, bucket_s: int = 3600, site: str | None = None
) -> pl.DataFrame:
    """Health events per time bucket, host and kind: ``ts, host, kind, events``."""
    params: list[Any] = [_as_utc(start), _as_utc(end)]
    site_sql = _site_hosts(site, params)
    bucket = _bucket_us(store, "ts", bucket_s)
    sql = (
        f"SELECT {bucket} AS ts, host, kind, COUNT(*) AS events FROM health_event"
        f" WHERE ts >= ? AND ts < ?{site_sql} GROUP BY 1, 2, 3 ORDER BY 1, 2, 3"
    )
    return _fetch(store, sql, params, {"ts": UTC, "host": pl.String, "kind": pl.String, "events": pl.Int64})


def health_events_by_node(store: Store, start: dt.datetime, end: dt.datetime, site: str | None = None) -> pl.DataFrame:
    """Per host and kind in the window: ``host, kind, events, gpus`` (distinct GPUs), ``last_ts``;
    hosts with the most events first."""
    params: list[Any] = [_as_utc(start), _as_utc(end)]
    site_sql = _site_hosts(site, params)
    sql = (
        "SELECT host, kind, COUNT(*) AS events, COUNT(DISTINCT NULLIF(gpu_uuid, '')) AS gpus, MAX(ts) AS last_ts"
        f" FROM health_event WHERE ts >= ? AND ts < ?{site_sql} GROUP BY host, kind ORDER BY 3 DESC, 1, 2"
    )
    return _fetch(store, sql, params, {"host": pl.String, "kind": pl.String, "events": pl.Int64, "gpus": pl.Int64, "last_ts": UTC})


def health_events_recent(
    store: Store, start: dt.datetime, end: dt.datetime, site: str | None = None, kinds: Sequence[str] | None = None, limit: int = 200
) -> pl.DataFrame:
    """The newest health events in the window (at most ``limit``), newest first."""
    params: list[Any] = [_as_utc(start), _as_utc(end)]
    kind_sql = ""
    if kinds:
        kind_sql = f" AND kind IN ({', '.join('?' for _ in kinds)})"
        params += list(kinds)
    site_sql = _site_hosts(site, params)
    cols = ("ts", "host", "gpu_uuid", "kind", "code", "value", "message", "source")
    sql = f"SELECT {', '.join(cols)} FROM health_event WHERE ts >= ? AND ts < ?{kind_sql}{site_sql} ORDER BY ts DESC LIMIT {int(limit)}"
    return _fetch(store, sql, params, {c: F.HEALTH_EVENT.schema[c] for c in cols})


def _finding_window(params: list[Any], start: dt.datetime, end: dt.datetime) -> str:
    # A finding is in the window when its own window overlaps it.
    params += [_as_utc(end), _as_utc(start)]
    return "window_start < ? AND (window_end IS NULL OR window_end >= ?)"


def findings_by_kind(store: Store, start: dt.datetime, end: dt.datetime, kind_like: str | None = None) -> pl.DataFrame:
    """Findings per analyzer, kind and severity in the window: ``analyzer, kind, severity, findings, last_window_start``."""
    params: list[Any] = []
    where = _finding_window(params, start, end)
    if kind_like:
        where += " AND kind LIKE ?"
        params.append(kind_like)
    sql = (
        "SELECT analyzer, kind, severity, COUNT(*) AS findings, MAX(window_start) AS last_window_start"
        f" FROM finding WHERE {where} GROUP BY analyzer, kind, severity ORDER BY 4 DESC, 1, 2, 3"
    )
    return _fetch(
        store,
        sql,
        params,
        {"analyzer": pl.String, "kind": pl.String, "severity": pl.String, "findings": pl.Int64, "last_window_start": UTC},
    )


def findings(
    store: Store,
    start: dt.datetime,
    end: dt.datetime,
    kind_like: str | None = None,
    subject_like: str | None = None,
    limit: int = 200,
    analyzer: str | None = None,
) -> pl.DataFrame:
    """The newest findings in the window (of one ``analyzer`` if given), most severe first within a window."""
    params: list[Any] = []
    where = _finding_window(params, start, end)
    if kind_like:
        where += " AND kind LIKE ?"
        params.append(kind_like)
    if analyzer:
        where += " AND analyzer = ?"
        params.append(analyzer)
    if subject_like:
        where += " AND subject LIKE ?"
        params.append(subject_like)
    cols = ("window_start", "window_end", "analyzer", "kind", "subject", "severity", "score", "summary", "evidence")
    sql = (
        f"SELECT {', '.join(cols)} FROM finding WHERE {where}"
        " ORDER BY window_start DESC, CASE severity WHEN 'critical' THEN 0 WHEN 'warning' THEN 1 ELSE 2 END, COALESCE(score, 0) DESC"
        f" LIMIT {int(limit)}"
    )
    return _fetch(store, sql, params, {c: F.FINDING.schema[c] for c in cols})


# --- jobs ----------------------------------------------------------------------------------------


_JOB_COLS = ("job_id", "name", "kind", "model_name", "world_size", "site_id", "owner", "status", "started_at", "ended_at")


def jobs(store: Store, start: dt.datetime, end: dt.datetime, site: str | None = None, limit: int = 500) -> pl.DataFrame:
    """Jobs whose run overlaps ``[start, end)`` (jobs with unknown times too), newest first, with
    ``goodput_ratio`` (runtime goodput) from the goodput analyzer's stored analysis, where it has run."""
    params: list[Any] = [_as_utc(end), _as_utc(start)]
    where = "(j.started_at IS NULL OR j.started_at < ?) AND (j.ended_at IS NULL OR j.ended_at >= ?)"
    if site is not None:
        where += " AND j.site_id = ?"
        params.append(site)
    cols = ", ".join(f"j.{c}" for c in _JOB_COLS)
    sql = (
        f"SELECT {cols}, (SELECT {_json_number(store, 'a.result', 'goodput_ratio')} FROM job_analysis a"
        " WHERE a.job_id = j.job_id AND a.analyzer = 'goodput') AS goodput_ratio"
        # (started_at IS NULL) first: both databases then put jobs of unknown start last.
        f" FROM job j WHERE {where} ORDER BY (j.started_at IS NULL), j.started_at DESC, j.job_id LIMIT {int(limit)}"
    )
    return _fetch(store, sql, params, {**{c: F.JOB.schema[c] for c in _JOB_COLS}, "goodput_ratio": pl.Float64})


def running_jobs(store: Store, end: dt.datetime, site: str | None = None, limit: int = 200) -> pl.DataFrame:
    """Jobs running at ``end``: started, not ended (by time or by a terminal status)."""
    df = jobs(store, end - dt.timedelta(seconds=1), end, site, limit)
    done = ("finished", "failed", "cancelled", "canceled", "preempted", "completed")
    return df.filter(pl.col("started_at").is_not_null() & pl.col("ended_at").is_null() & ~pl.col("status").fill_null("").str.to_lowercase().is_in(done))


def job_step_summary(store: Store, job_id: str, max_steps: int = 2000) -> pl.DataFrame:
    """Per step of a job, averaged over its ranks (the last ``max_steps`` steps):

    ``step, ranks, start, step_mean_s, step_max_s, compute_mean_s, comm_exposed_mean_s, idle_mean_s,
    overlap_mean_s, tokens, model_flops``. compute + exposed communication + idle = step time (DESIGN.md's
    C³ model, before a collective's wait is split from its transfer).
    """
    dur = _duration_s(store, '"start"', '"end"')
    sql = (
        f"SELECT step, COUNT(*) AS ranks, MIN(\"start\") AS start, AVG({dur}) AS step_mean_s, MAX({dur}) AS step_max_s,"
        " AVG(compute_s) AS compute_mean_s, AVG(comm_s - COALESCE(comm_overlap_s, 0)) AS comm_exposed_mean_s,"
        " AVG(idle_s) AS idle_mean_s, AVG(comm_overlap_s) AS overlap_mean_s, SUM(tokens) AS tokens, SUM(model_flops) AS model_flops"
        f" FROM step WHERE job_id = ? GROUP BY step ORDER BY step DESC LIMIT {int(max_steps)}"
    )
    schema = {
        "step": pl.Int64,
        "ranks": pl.Int64,
        "start": UTC,
        "step_mean_s": pl.Float64,
        "step_max_s": pl.Float64,
        "compute_mean_s": pl.Float64,
        "comm_exposed_mean_s": pl.Float64,
        "idle_mean_s": pl.Float64,
        "overlap_mean_s": pl.Float64,
        "tokens": pl.Int64,
        "model_flops": pl.Float64,
    }
    return _fetch(store, sql, [job_id], schema).sort("step")


def job_rank_step_times(store: Store, job_id: str, last_steps: int = 50, max_ranks: int = 256) -> pl.DataFrame:
    """Per rank and step over a job's last ``last_steps`` steps: ``rank, ranks_in_cell, step, step_s,
    compute_s, idle_s``.

    In synchronous training every rank's step lasts as long as the slowest rank's, so a straggler shows
    in compute time (high) and in the others' idle time (they wait for it), not in step time. Above
    ``max_ranks`` ranks, neighbouring ranks share a cell (``rank`` is the first of them) holding the
    largest step and compute time and the smallest idle time, so a straggler still stands out and the
    heatmap stays drawable.
    """
    bounds = _fetch(
        store, "SELECT MAX(step) AS last, MAX(rank) AS top FROM step WHERE job_id = ?", [job_id], {"last": pl.Int64, "top": pl.Int64}
    )
    schema = {"rank": pl.Int64, "ranks_in_cell": pl.Int64, "step": pl.Int64, "step_s": pl.Float64, "compute_s": pl.Float64, "idle_s": pl.Float64}
    if bounds.is_empty() or bounds["last"][0] is None:
        return pl.DataFrame(schema=schema)
    last, top = int(bounds["last"][0]), int(bounds["top"][0])
    per_cell = max(1, math.ceil((top + 1) / max(1, max_ranks)))
    dur = _duration_s(store, '"start"', '"end"')
    sql = (
        f"SELECT (rank / {per_cell}) * {per_cell} AS rank, COUNT(DISTINCT rank) AS ranks_in_cell, step,"
        f" MAX({dur}) AS step_s, MAX(compute_s) AS compute_s, MIN(idle_s) AS idle_s"
        " FROM step WHERE job_id = ? AND step > ? GROUP BY 1, 3 ORDER BY 1, 3"
    )
    return _fetch(store, sql, [job_id, last - int(last_steps)], schema)


def job_rank_summary(store: Store, job_id: str, last_steps: int = 50) -> pl.DataFrame:
    """Per rank over a job's last steps, slowest first: ``rank, host, steps, step_mean_s, compute_mean_s,
    idle_mean_s, slowdown_ratio`` (the rank's mean compute time over the median rank's: a straggler
    computes longer while the others idle waiting for it). A raw view until the straggler analyzer lands."""
    bounds = _fetch(store, "SELECT MAX(step) AS last FROM step WHERE job_id = ?", [job_id], {"last": pl.Int64})
    schema = {"rank": pl.Int64, "steps": pl.Int64, "step_mean_s": pl.Float64, "compute_mean_s": pl.Float64, "idle_mean_s": pl.Float64}
    out_schema = {"rank": pl.Int64, "host": pl.String, **{k: v for k, v in schema.items() if k != "rank"}, "slowdown_ratio": pl.Float64}
    if bounds.is_empty() or bounds["last"][0] is None:
        return pl.DataFrame(schema=out_schema)
    dur = _duration_s(store, '"start"', '"end"')
    df = _fetch(
        store,
        f"SELECT rank, COUNT(*) AS steps, AVG({dur}) AS step_mean_s, AVG(compute_s) AS compute_mean_s, AVG(idle_s) AS idle_mean_s"
        " FROM step WHERE job_id = ? AND step > ? GROUP BY rank",
        [job_id, int(bounds["last"][0]) - int(last_steps)],
        schema,
    )
    hosts = _fetch(
        store, "SELECT rank, MAX(host) AS host FROM job_rank WHERE job_id = ? GROUP BY rank", [job_id], {"rank": pl.Int64, "host": pl.String}
    )
    median = df["compute_mean_s"].median() if df.height else None
    return (
        df.join(hosts, on="rank", how="left")
        .with_columns(slowdown_ratio=pl.col("compute_mean_s") / median if median else pl.lit(None, pl.Float64))
        .select(list(out_schema))
        .sort(["slowdown_ratio", "rank"], descending=[True, False], nulls_last=True)
    )


def job_totals(store: Store, job_id: str) -> pl.DataFrame:
    """One row for a job: ``steps, ranks, step_mean_s, tokens, model_flops, collective_bytes,
    comm_intensity_bytes_per_flop`` (network bytes / model FLOPs, DESIGN.md's CI)."""
    dur = _duration_s(store, '"start"', '"end"')
    s = _fetch(
        store,
        f"SELECT COUNT(DISTINCT step) AS steps, COUNT(DISTINCT rank) AS ranks, AVG({dur}) AS step_mean_s,"
        " SUM(tokens) AS tokens, SUM(model_flops) AS model_flops FROM step WHERE job_id = ?",
        [job_id],
        {"steps": pl.Int64, "ranks": pl.Int64, "step_mean_s": pl.Float64, "tokens": pl.Int64, "model_flops": pl.Float64},
    )
    c = _fetch(store, "SELECT SUM(bytes) AS collective_bytes FROM collective WHERE job_id = ?", [job_id], {"collective_bytes": pl.Int64})
    out = pl.concat([s, c], how="horizontal")
    return out.with_columns(
        comm_intensity_bytes_per_flop=pl.when(pl.col("model_flops") > 0)
        .then(pl.col("collective_bytes").cast(pl.Float64) / pl.col("model_flops"))
        .otherwise(None)
    )


def scaling(store: Store, model_name: str) -> pl.DataFrame:
    """Runs of one model at different world sizes: ``job_id, world_size, step_time_mean_s,
    efficiency_ratio`` (η = T1 / (N · T_N), relative to the smallest run when there is no 1-GPU run)."""
    from analyzers.c3 import scaling_efficiency

    dur = _duration_s(store, 's."start"', 's."end"')
    df = _fetch(
        store,
        f"SELECT j.job_id, j.world_size, AVG({dur}) AS step_time_mean_s FROM job j JOIN step s ON s.job_id = j.job_id"
        " WHERE j.model_name = ? AND j.world_size IS NOT NULL GROUP BY j.job_id, j.world_size ORDER BY 2, 1",
        [model_name],
        {"job_id": pl.String, "world_size": pl.Int64, "step_time_mean_s": pl.Float64},
    ).filter(pl.col("step_time_mean_s") > 0)
    if df.is_empty():
        return df.with_columns(efficiency_ratio=pl.lit(None, pl.Float64))
    eff = scaling_efficiency(df["world_size"].to_list(), df["step_time_mean_s"].to_list())
    # scaling_efficiency sorts by world size (stably), as df already is.
    return df.with_columns(efficiency_ratio=eff["efficiency"])


def job_analyses(store: Store, job_id: str) -> dict[str, dict[str, Any]]:
    """The analyzers' stored summaries of a job (``fleetscope.analysis``: c3, goodput, stragglers, sdc,
    checkpoint), keyed by analyzer: each the parsed ``result`` plus ``computed_at``, ``window_start`` and
    ``window_end``. Empty before the job has been analysed."""
    df = _fetch(
        store,
        "SELECT analyzer, computed_at, window_start, window_end, result FROM job_analysis WHERE job_id = ?",
        [job_id],
        {"analyzer": pl.String, "computed_at": UTC, "window_start": UTC, "window_end": UTC, "result": pl.String},
    )
    out: dict[str, dict[str, Any]] = {}
    for row in df.iter_rows(named=True):
        try:
            result = json.loads(row["result"]) if row["result"] else {}
        except ValueError:
            result = {}
        out[row["analyzer"]] = {**(result if isinstance(result, dict) else {"value": result}),
                                "computed_at": row["computed_at"], "window_start": row["window_start"], "window_end": row["window_end"]}
    return out


def job_c3_steps(store: Store, job_id: str, max_steps: int = 2000) -> pl.DataFrame:
    """Per step of a job, averaged over its ranks, from the C³ analyzer's stored breakdown
    (``step_breakdown``, analyzers.c3.c3_breakdown; the last ``max_steps`` steps): ``step, ranks,
    step_mean_s, c1_compute_s, c2_comm_s, c3_coord_s, f_compute``. C1 + C2 + C3 = step time; unlike the
    raw step records, a collective's wait for its last peer is in C3 (coordination), not in C2."""
    sql = (
        "SELECT step, COUNT(*) AS ranks, AVG(step_s) AS step_mean_s, AVG(c1_compute_s) AS c1_compute_s, AVG(c2_comm_s) AS c2_comm_s,"
        " AVG(c3_coord_s) AS c3_coord_s, AVG(f_compute) AS f_compute"
        f" FROM step_breakdown WHERE job_id = ? GROUP BY step ORDER BY step DESC LIMIT {int(max_steps)}"
    )
    schema = {k: pl.Float64 for k in ("step_mean_s", "c1_compute_s", "c2_comm_s", "c3_coord_s", "f_compute")}
    return _fetch(store, sql, [job_id], {"step": pl.Int64, "ranks": pl.Int64, **schema}).sort("step")


# How far either side of the runs the fitted curve is drawn, in factors of the world size.
_FIT_SPAN = 2.0


def scaling_fit(store: Store, model_name: str, points: int = 64, comm_term: str = "ring") -> dict[str, Any]:
    """The Fleet Law fitted to the runs of one model (analyzers.c3.fit_fleet_law: T_step(N) = a/N +
    b·f(N) + c, ring all-reduce f(N) = 2(N−1) by default), for the Jobs page:

    - ``runs``: ``scaling(store, model_name)`` (measured step time and η per run);
    - ``fit``: ``a_s, b_s, c_s, r2, n_opt`` and ``comm_term``, or None with ``why`` when there are fewer than
      three distinct world sizes or the fit fails;
    - ``curve``: ``world_size, step_time_s, efficiency_ratio`` predicted at ``points`` world sizes spread
      log-evenly from half the smallest run to twice the largest (or past N*, where the curve turns up),
      η relative to the same baseline as the runs' η;
    - ``n_opt``: the world size with the shortest predicted step, past which adding GPUs makes every step
      slower (inf when the fitted curve has no minimum).
    """
    from analyzers.c3 import fit_fleet_law

    runs = scaling(store, model_name)
    out: dict[str, Any] = {"runs": runs, "fit": None, "why": None,
                           "curve": pl.DataFrame(schema={"world_size": pl.Float64, "step_time_s": pl.Float64, "efficiency_ratio": pl.Float64})}
    sizes = runs["world_size"].n_unique() if runs.height else 0
    if sizes < 3:
        out["why"] = f"{sizes} distinct world size{'s' if sizes != 1 else ''} of {model_name}; the fit needs three"
        return out
    try:
        fit = fit_fleet_law(runs["world_size"].to_list(), runs["step_time_mean_s"].to_list(), comm_term=comm_term)
    except ValueError as exc:
        out["why"] = str(exc)
        return out
    lo = max(1.0, float(runs["world_size"].min()) / _FIT_SPAN)
    hi = float(runs["world_size"].max()) * _FIT_SPAN
    if math.isfinite(fit.n_opt):
        hi = max(hi, fit.n_opt * 1.5)
    # The runs' own world sizes are points of the curve too, so it can be read off at each of them.
    n = np.unique(np.concatenate([np.geomspace(lo, hi, max(2, int(points))), runs["world_size"].to_numpy().astype(float)]))
    t = fit.predict(n)
    # η relative to the runs' baseline: the smallest run's N·T (scaling_efficiency's T1).
    base = runs.sort("world_size").row(0, named=True)
    t1 = base["world_size"] * base["step_time_mean_s"]
    curve = pl.DataFrame({"world_size": n, "step_time_s": t}).with_columns(efficiency_ratio=t1 / (pl.col("world_size") * pl.col("step_time_s")))
    out["curve"] = curve.filter(pl.col("step_time_s") > 0)
    out["fit"] = {"a_s": fit.a_s, "b_s": fit.b_s, "c_s": fit.c_s, "r2": fit.r2, "n_opt": fit.n_opt, "comm_term": fit.comm_term}
    return out


# --- network ----------------------------------------------------------------------------------


def nccl_test_runs(store: Store, start: dt.datetime, end: dt.datetime, limit: int = 200) -> pl.DataFrame:
    """One row per nccl-tests run in the window, newest first: ``run_id, ts, op, nranks, hosts, sizes,
    busbw_max_gbps, busbw_avg_gbps`` (the average over sizes, as nccl-tests' "Avg bus bandwidth")."""
    sql = (
        "SELECT run_id, MIN(ts) AS ts, MIN(op) AS op, MAX(nranks) AS nranks, MAX(hosts) AS hosts,"
        " COUNT(DISTINCT size_bytes) AS sizes, MAX(busbw_gbps) AS busbw_max_gbps, AVG(busbw_gbps) AS busbw_avg_gbps"
        f" FROM nccl_test WHERE ts >= ? AND ts < ? GROUP BY run_id ORDER BY 2 DESC LIMIT {int(limit)}"
    )
    schema = {
        "run_id": pl.String,
        "ts": UTC,
        "op": pl.String,
        "nranks": pl.Int64,
        "hosts": pl.String,
        "sizes": pl.Int64,
        "busbw_max_gbps": pl.Float64,
        "busbw_avg_gbps": pl.Float64,
    }
    return _fetch(store, sql, [_as_utc(start), _as_utc(end)], schema)


def nccl_test_sizes(store: Store, run_ids: Sequence[str]) -> pl.DataFrame:
    """Bus bandwidth by message size for the given nccl-tests runs: ``run_id, ts, op, size_bytes,
    in_place, time_s, algbw_gbps, busbw_gbps``."""
    cols = ("run_id", "ts", "op", "size_bytes", "in_place", "time_s", "algbw_gbps", "busbw_gbps")
    schema = {c: F.NCCL_TEST.schema[c] for c in cols}
    if not run_ids:
        return pl.DataFrame(schema=schema)
    sql = f"SELECT {', '.join(cols)} FROM nccl_test WHERE run_id IN ({', '.join('?' for _ in run_ids)}) ORDER BY run_id, size_bytes, in_place"
    return _fetch(store, sql, list(run_ids), schema)


def collective_busbw(
    store: Store, start: dt.datetime, end: dt.datetime, job_id: str | None = None, max_jobs: int = 50
) -> pl.DataFrame:
    """NCCL bus bandwidth by operation and message size in the window: ``op, bytes, calls,
    busbw_mean_gbps, busbw_min_gbps, busbw_max_gbps, duration_mean_s``.

    Reads one job's collectives, or those of the ``max_jobs`` most recent jobs in the window, through the
    ``(job_id, start)`` index; never the whole table.
    """
    schema = {
        "op": pl.String,
        "bytes": pl.Int64,
        "calls": pl.Int64,
        "busbw_mean_gbps": pl.Float64,
        "busbw_min_gbps": pl.Float64,
        "busbw_max_gbps": pl.Float64,
        "duration_mean_s": pl.Float64,
    }
    params: list[Any] = []
    if job_id is not None:
        job_sql = "job_id = ?"
        params.append(job_id)
    else:
        recent = jobs(store, start, end, limit=max_jobs)["job_id"].to_list()
        if not recent:
            return pl.DataFrame(schema=schema)
        job_sql = f"job_id IN ({', '.join('?' for _ in recent)})"
        params += recent
    params += [_as_utc(start), _as_utc(end)]
    sql = (
        "SELECT op, bytes, COUNT(*) AS calls, AVG(busbw_gbps) AS busbw_mean_gbps, MIN(busbw_gbps) AS busbw_min_gbps,"
        " MAX(busbw_gbps) AS busbw_max_gbps, AVG(duration_s) AS duration_mean_s FROM collective"
        f' WHERE {job_sql} AND "start" >= ? AND "start" < ? AND peer = -1 AND bytes > 0 GROUP BY op, bytes ORDER BY op, bytes'
    )
    return _fetch(store, sql, params, schema)


# --- reliability ----------------------------------------------------------------------------------


_DISRUPTIONS = ("failure", "preempted", "restart")


def disruptions(store: Store, start: dt.datetime, end: dt.datetime, site: str | None = None, limit: int = 1000) -> pl.DataFrame:
    """Failures, preemptions and restarts in the window, newest first: ``ts, job_id, kind, step, cause``
    (``cause`` from the event's payload; the kind itself where none was given)."""
    params: list[Any] = [_as_utc(start), _as_utc(end), *_DISRUPTIONS]
    site_sql = ""
    if site is not None:
        site_sql = " AND job_id IN (SELECT job_id FROM job WHERE site_id = ?)"
        params.append(site)
    sql = (
        "SELECT ts, job_id, kind, step, payload FROM job_event"
        f" WHERE ts >= ? AND ts < ? AND kind IN ({', '.join('?' for _ in _DISRUPTIONS)}){site_sql} ORDER BY ts DESC LIMIT {int(limit)}"
    )
    df = _fetch(store, sql, params, {"ts": UTC, "job_id": pl.String, "kind": pl.String, "step": pl.Int64, "payload": pl.String})

    def cause(payload: str | None) -> str | None:
        try:
            value = json.loads(payload).get("cause") if payload else None
        except (ValueError, AttributeError):
            return None
        return str(value) if value is not None else None

    causes = [cause(p) for p in df["payload"].to_list()]
    return df.with_columns(cause=pl.Series(causes, dtype=pl.String)).with_columns(pl.col("cause").fill_null(pl.col("kind"))).drop("payload")


def reliability_summary(store: Store, start: dt.datetime, end: dt.datetime, site: str | None = None) -> pl.DataFrame:
    """One row: ``failures, preemptions, restarts, window_s, mtbf_s`` (the window over its failures;
    null without failures)."""
    d = disruptions(store, start, end, site)
    window_s = (_as_utc(end) - _as_utc(start)).total_seconds()
    failures = d.filter(pl.col("kind") == "failure").height
    return pl.DataFrame(
        {
            "failures": [failures],
            "preemptions": [d.filter(pl.col("kind") == "preempted").height],
            "restarts": [d.filter(pl.col("kind") == "restart").height],
            "window_s": [window_s],
            "mtbf_s": [window_s / failures if failures else None],
        },
        schema={"failures": pl.Int64, "preemptions": pl.Int64, "restarts": pl.Int64, "window_s": pl.Float64, "mtbf_s": pl.Float64},
    )


def checkpoint_intervals(store: Store, start: dt.datetime, end: dt.datetime, site: str | None = None) -> pl.DataFrame:
    """Per job with checkpoint saves in the window: ``job_id, saves, interval_mean_s`` (between save
    starts), ``save_mean_s`` (start to end)."""
    kinds = ("checkpoint_save_start", "checkpoint_save_end")
    params: list[Any] = [_as_utc(start), _as_utc(end), *kinds]
    site_sql = ""
    if site is not None:
        site_sql = " AND job_id IN (SELECT job_id FROM job WHERE site_id = ?)"
        params.append(site)
    ev = _fetch(
        store,
        f"SELECT job_id, ts, kind FROM job_event WHERE ts >= ? AND ts < ? AND kind IN (?, ?) AND rank = -1{site_sql} ORDER BY job_id, ts",
        params,
        {"job_id": pl.String, "ts": UTC, "kind": pl.String},
    )
    schema = {"job_id": pl.String, "saves": pl.Int64, "interval_mean_s": pl.Float64, "save_mean_s": pl.Float64}
    if ev.is_empty():
        return pl.DataFrame(schema=schema)
    starts = ev.filter(pl.col("kind") == kinds[0]).sort("job_id", "ts")
    ends = ev.filter(pl.col("kind") == kinds[1]).sort("job_id", "ts")
    intervals = starts.with_columns(gap_s=pl.col("ts").diff().over("job_id").dt.total_microseconds() / 1e6)
    # The n-th save start of a job pairs with its n-th save end (saves of one job do not overlap); a
    # save still running at the window's end has no end yet and drops out of the mean.
    n = pl.int_range(pl.len()).over("job_id").alias("n")
    paired = starts.with_columns(n).join(ends.with_columns(n).rename({"ts": "end_ts"}).select("job_id", "n", "end_ts"), on=["job_id", "n"], how="left")
    saves = paired.with_columns(save_s=(pl.col("end_ts") - pl.col("ts")).dt.total_microseconds() / 1e6)
    return (
        intervals.group_by("job_id")
        .agg(pl.len().cast(pl.Int64).alias("saves"), pl.col("gap_s").mean().alias("interval_mean_s"))
        .join(saves.group_by("job_id").agg(pl.col("save_s").mean().alias("save_mean_s")), on="job_id", how="left")
        .select(list(schema))
        .sort("job_id")
    )


# --- alerting -------------------------------------------------------------------------------------
# The alerting service's own reads (fleetscope.alerting.state, as the API's /api/v1/alerts uses them),
# as frames. Its tables are small: alerts the rules hold, silences, and the outbox.


def _alerting_config() -> Any:
    """The rules file's configuration with the API's edits layered on by the caller, for inhibition; None
    when the file does not load (the API would not start either; the page still shows the alerts)."""
    from fleetscope.alerting import config as alert_config
    from fleetscope.alerting.rules import RuleError, load_config

    try:
        return load_config(alert_config.load().rules_path)
    except (RuleError, OSError, ValueError):
        return None


def alerts(store: Store, include_resolved: bool = True, now: dt.datetime | None = None) -> pl.DataFrame:
    """Alerts the rules hold, firing first: ``alertname, state, severity, summary, labels`` (name="value"
    pairs), ``active_at, fired_at, resolved_at, value, silenced_by`` (ids of the silences muting it,
    comma-separated), ``inhibited, fingerprint``."""
    from fleetscope.alerting import state as ST

    base = _alerting_config()
    config = ST.effective_config(store.engine, base) if base is not None else None
    rows = ST.list_alerts(store.engine, config, now=now, include_resolved=include_resolved)
    schema = {"alertname": pl.String, "state": pl.String, "severity": pl.String, "summary": pl.String, "labels": pl.String,
              "active_at": UTC, "fired_at": UTC, "resolved_at": UTC, "value": pl.Float64, "silenced_by": pl.String,
              "inhibited": pl.Boolean, "fingerprint": pl.String}
    out = [
        {
            "alertname": a["labels"].get("alertname", a["rule"]),
            "state": a["state"],
            "severity": a["labels"].get("severity"),
            "summary": a["annotations"].get("summary"),
            "labels": ", ".join(f'{k}="{v}"' for k, v in sorted(a["labels"].items()) if k not in ("alertname", "severity")),
            "active_at": dt.datetime.fromisoformat(a["active_at"]) if a["active_at"] else None,
            "fired_at": dt.datetime.fromisoformat(a["fired_at"]) if a["fired_at"] else None,
            "resolved_at": dt.datetime.fromisoformat(a["resolved_at"]) if a["resolved_at"] else None,
            "value": a["value"],
            "silenced_by": ", ".join(a["silenced_by"]) or None,
            "inhibited": bool(a["inhibited"]),
            "fingerprint": a["fingerprint"],
        }
        for a in rows
    ]
    order = {"firing": 0, "pending": 1, "inactive": 2}
    df = pl.DataFrame(out, schema=schema)
    return df.sort(pl.col("state").replace_strict(order, default=3, return_dtype=pl.Int64), pl.col("active_at"), descending=[False, True])


def silences(store: Store, now: dt.datetime | None = None) -> pl.DataFrame:
    """Every silence, latest ending first: ``silence_id, state`` (pending, active, expired), ``matchers``
    (Alertmanager's text form), ``starts_at, ends_at, created_by, comment``."""
    from fleetscope.alerting import state as ST

    now = now or dt.datetime.now(dt.UTC)
    rows = [
        {"silence_id": s.id, "state": s.state(now), "matchers": ", ".join(str(m) for m in s.matchers), "starts_at": s.starts_at,
         "ends_at": s.ends_at, "created_by": s.created_by, "comment": s.comment}
        for s in ST.list_silences(store.engine, now=now)
    ]
    schema = {"silence_id": pl.String, "state": pl.String, "matchers": pl.String, "starts_at": UTC, "ends_at": UTC,
              "created_by": pl.String, "comment": pl.String}
    return pl.DataFrame(rows, schema=schema)


_NOTIFICATION_SCHEMA = {
    "notification_id": pl.Int64, "receiver": pl.String, "group_key": pl.String, "status": pl.String, "created_at": UTC,
    "attempts": pl.Int64, "next_attempt_at": UTC, "delivered_at": UTC, "last_status_code": pl.Int64, "last_error": pl.String,
    "webhook_id": pl.String,
}


def notifications(store: Store, status: str | None = None, limit: int = 200) -> pl.DataFrame:
    """The outbox, newest first (``status``: pending, delivered, dead or disabled; ``dead`` lists the dead
    letters): ``notification_id, receiver, group_key, status, created_at, attempts, next_attempt_at,
    delivered_at, last_status_code, last_error, webhook_id``."""
    from fleetscope.alerting import state as ST

    rows = ST.list_notifications(store.engine, status=status, limit=limit)
    return pl.DataFrame([{k: r.get(k) for k in _NOTIFICATION_SCHEMA} for r in rows], schema=_NOTIFICATION_SCHEMA)


def notification_counts(store: Store) -> dict[str, int]:
    """Notifications per status (pending, delivered, dead, disabled), zeros included."""
    from fleetscope.alerting import state as ST

    return {"pending": 0, "delivered": 0, "dead": 0, "disabled": 0, **ST.counts(store.engine)}


# --- governance ----------------------------------------------------------------------------------


def models(store: Store) -> pl.DataFrame:
    """The model registry: ``model_name, model_version, intended_purpose, role, updated_at``."""
    cols = ("model_name", "model_version", "intended_purpose", "role", "updated_at")
    return _fetch(store, f"SELECT {', '.join(cols)} FROM model ORDER BY model_name, model_version", [],
                  {"model_name": pl.String, "model_version": pl.String, "intended_purpose": pl.String, "role": pl.String, "updated_at": UTC})


_STATUSES = ("pass", "fail", "missing_evidence", "not_applicable")


def audit_runs(store: Store, limit: int = 50) -> pl.DataFrame:
    """EU AI Act audit runs, newest first: ``audit_id, scope, as_of, trigger, requested_by``, the number of
    rule results per status (``pass, fail, missing_evidence, not_applicable``), ``formats`` (the reports
    filed: json, html, pdf) and ``exports`` (signed bundles made of it)."""
    runs = _fetch(
        store,
        f"SELECT audit_id, scope, as_of, trigger, requested_by, counts FROM aiact_audit_run ORDER BY as_of DESC LIMIT {int(limit)}",
        [],
        {"audit_id": pl.String, "scope": pl.String, "as_of": UTC, "trigger": pl.String, "requested_by": pl.String, "counts": pl.String},
    )
    schema = {**{c: runs.schema[c] for c in ("audit_id", "scope", "as_of", "trigger", "requested_by")}, **{s: pl.Int64 for s in _STATUSES},
              "formats": pl.String, "exports": pl.Int64}
    if runs.is_empty():
        return pl.DataFrame(schema=schema)
    ids = runs["audit_id"].to_list()
    marks = ", ".join("?" for _ in ids)
    reports = _fetch(store, f"SELECT audit_id, format FROM aiact_report WHERE audit_id IN ({marks})", ids, {"audit_id": pl.String, "format": pl.String})
    exports = _fetch(store, f"SELECT audit_id, COUNT(*) AS exports FROM aiact_export WHERE audit_id IN ({marks}) GROUP BY audit_id", ids,
                     {"audit_id": pl.String, "exports": pl.Int64})
    order = {"json": 0, "html": 1, "pdf": 2}
    formats = reports.sort(pl.col("format").replace_strict(order, default=9, return_dtype=pl.Int64)).group_by("audit_id", maintain_order=True).agg(
        pl.col("format").str.join(", ").alias("formats"))

    def count(text: str | None, status: str) -> int:
        try:
            return int(json.loads(text or "{}").get(status, 0))
        except (ValueError, AttributeError, TypeError):
            return 0

    counts = {s: [count(c, s) for c in runs["counts"].to_list()] for s in _STATUSES}
    return (
        runs.drop("counts").with_columns(**{s: pl.Series(v, dtype=pl.Int64) for s, v in counts.items()})
        .join(formats, on="audit_id", how="left").join(exports, on="audit_id", how="left")
        .with_columns(pl.col("exports").fill_null(0))
        .select(list(schema))
    )


def audit_exports(store: Store, limit: int = 50) -> pl.DataFrame:
    """Signed export bundles, newest first: ``export_id, audit_id, created_at, size_bytes, key_fingerprint,
    manifest_sha256, requested_by``."""
    cols = {"export_id": pl.String, "audit_id": pl.String, "created_at": UTC, "size_bytes": pl.Int64, "key_fingerprint": pl.String,
            "manifest_sha256": pl.String, "requested_by": pl.String}
    return _fetch(store, f"SELECT {', '.join(cols)} FROM aiact_export ORDER BY created_at DESC LIMIT {int(limit)}", [], cols)


def rule_results(store: Store, audit_id: str) -> pl.DataFrame:
    """One audit's rule results: ``model`` (name:version), ``rule_id, title, citation, status, reason,
    due_at, evidence`` (JSON), in rule order as the rules engine wrote them."""
    sql = (
        "SELECT model_name || ':' || model_version AS model, rule_id, title, citation, status, reason, due_at, evidence"
        " FROM aiact_rule_result WHERE audit_id = ? ORDER BY model_name, model_version"
    )
    schema = {"model": pl.String, "rule_id": pl.String, "title": pl.String, "citation": pl.String, "status": pl.String, "reason": pl.String,
              "due_at": UTC, "evidence": pl.String}
    return _fetch(store, sql, [audit_id], schema)


_FAIRNESS_METRICS = ("selection_rate", "tpr", "fpr", "fnr", "accuracy", "ppv")


def fairness_groups(store: Store) -> pl.DataFrame:
    """Each model's latest fairness evaluation, one row per sensitive feature, group and metric, with the
    evaluation's bootstrap confidence interval: ``model, evaluated_at, passed, feature, group, count,
    metric, value, ci_low, ci_high, confidence``."""
    ev = _fetch(
        store,
        "SELECT model_name || ':' || model_version AS model, evaluated_at, passed, result FROM fairness_evaluation ORDER BY evaluated_at DESC",
        [],
        {"model": pl.String, "evaluated_at": UTC, "passed": pl.Boolean, "result": pl.String},
    ).unique("model", keep="first", maintain_order=True)
    schema = {"model": pl.String, "evaluated_at": UTC, "passed": pl.Boolean, "feature": pl.String, "group": pl.String, "count": pl.Int64,
              "metric": pl.String, "value": pl.Float64, "ci_low": pl.Float64, "ci_high": pl.Float64, "confidence": pl.Float64}
    rows = []
    for e in ev.iter_rows(named=True):
        try:
            result = json.loads(e["result"] or "{}")
        except ValueError:
            continue
        for feat in result.get("features") or []:
            for g in feat.get("groups") or []:
                for metric in _FAIRNESS_METRICS:
                    ci = (g.get("ci") or {}).get(metric) or [None, None]
                    rows.append({"model": e["model"], "evaluated_at": e["evaluated_at"], "passed": e["passed"], "feature": feat.get("feature"),
                                 "group": str(g.get("group")), "count": g.get("count"), "metric": metric, "value": g.get(metric),
                                 "ci_low": ci[0], "ci_high": ci[1], "confidence": result.get("confidence")})
    return pl.DataFrame(rows, schema=schema)


def model_lineage(store: Store, model_name: str, model_version: str) -> dict[str, Any] | None:
    """A registered model's upstream datasets with the path proving each, and what taints them
    (fleetscope.governance_service.model_lineage, as ``GET /api/v1/models/{name}/lineage``); None for a
    model not in the registry."""
    from fleetscope import governance_service as gs

    try:
        return gs.model_lineage(store, model_name, model_version)
    except gs.NotFound:
        return None


IB_FINDING_KINDS = ("ib_link_flapping", "ib_link_errors", "ib_link_degraded", "ib_congestion")


def fabric_link_findings(store: Store, start: dt.datetime, end: dt.datetime, limit: int = 500) -> pl.DataFrame:
    """The InfiniBand link findings the health sweep stored for windows ending in [start, end), newest
    first: ``kind, subject, severity, score, window_end, summary``."""
    marks = ", ".join("?" for _ in IB_FINDING_KINDS)
    sql = ("SELECT kind, subject, severity, score, window_end, summary FROM finding"
           f" WHERE analyzer = 'fabric' AND kind IN ({marks}) AND window_end >= ? AND window_end < ?"
           f" ORDER BY window_end DESC LIMIT {int(limit)}")
    schema = {"kind": pl.String, "subject": pl.String, "severity": pl.String, "score": pl.Float64, "window_end": UTC, "summary": pl.String}
    return _fetch(store, sql, [*IB_FINDING_KINDS, _as_utc(start), _as_utc(end)], schema)


FABRIC_TOPOLOGY_KINDS = ("comm_straggler_fabric", "alltoall_low_utilization")


def fabric_topology_findings(store: Store, start: dt.datetime, end: dt.datetime, limit: int = 500) -> pl.DataFrame:
    """The health sweep's findings against the topology for windows ending in [start, end), newest first:
    the port or switch a job's slow ranks share (``comm_straggler_fabric``) and all-to-all runs far below
    the topology's bound (``alltoall_low_utilization``). Columns ``kind, subject, severity, score,
    window_end, summary``."""
    marks = ", ".join("?" for _ in FABRIC_TOPOLOGY_KINDS)
    sql = ("SELECT kind, subject, severity, score, window_end, summary FROM finding"
           f" WHERE analyzer = 'fabric' AND kind IN ({marks}) AND window_end >= ? AND window_end < ?"
           f" ORDER BY window_end DESC LIMIT {int(limit)}")
    schema = {"kind": pl.String, "subject": pl.String, "severity": pl.String, "score": pl.Float64, "window_end": UTC, "summary": pl.String}
    return _fetch(store, sql, [*FABRIC_TOPOLOGY_KINDS, _as_utc(start), _as_utc(end)], schema)


def fabric_nic_rate_gbps(store: Store) -> pl.DataFrame:
    """The usual HCA link rate in the stored topology (``analyzers.ib_links.nic_link_rate_gbps``), as one
    row ``rate_gbps, links`` (null rate when no topology is stored)."""
    from analyzers import ib_links

    rows = _fetch(store, "SELECT a_kind, rate_gbps, connected FROM fabric_link WHERE a_kind = 'CA'", [],
                  {"a_kind": pl.String, "rate_gbps": pl.Float64, "connected": pl.Boolean})
    return pl.DataFrame({"rate_gbps": [ib_links.nic_link_rate_gbps(rows)], "links": [rows.filter(pl.col("connected").fill_null(False)).height]},
                        schema={"rate_gbps": pl.Float64, "links": pl.Int64})

"""Fleet telemetry reads: what the store holds, the fleet's size, the latest GPU samples, activity and state
counts, and fleet-wide series built from a fixed number of short probes (so a long range costs no more
than a short one). Bounded by construction: the dashboard never reads raw telemetry of a whole fleet."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

import polars as pl
from sqlalchemy import inspect

from analyzers import tiers as tier_rollup
from fleetscope.core import frames as F
from fleetscope.core.errors import NotFound, ValidationError
from fleetscope.core.textinput import has_control
from fleetscope.core import units
from fleetscope.core.units import as_utc
from fleetscope.services import tiers
from fleetscope.store import Store, packed, packed_energy
from fleetscope.store.reads import bucket_us_sql, fetch, gpu_samples_sql, packed_hours_reached, site_gpus_sql

UTC = F.UTC_US


# When no sample interval can be measured, assume dcgm-exporter's usual scrape interval.
DEFAULT_SAMPLE_INTERVAL_S = 30.0


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
    counts: list[tuple[str, str, bool]] = []
    for name in names:
        quoted = '"' + name.replace('"', '""') + '"'
        if name in big and store.dialect == "sqlite":
            sql, approx = f"SELECT COALESCE(MAX(rowid), 0) AS n FROM {quoted}", True
        elif name in big:
            # a partitioned table's rows are its partitions' (store.partitions)
            sql, approx = (f"SELECT (GREATEST(reltuples, 0) + COALESCE((SELECT SUM(GREATEST(c.reltuples, 0)) FROM pg_inherits i"
                           f" JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = '{quoted}'::regclass), 0))::bigint AS n"
                           f" FROM pg_class WHERE oid = '{quoted}'::regclass"), True
            if name == packed.RAW and packed.TABLE in present:
                # packed days hold their samples in GPU-hour rows: those rows times the samples of a few of them
                sql = (f"SELECT ((SELECT n FROM ({sql}) a) + COALESCE((SELECT SUM(GREATEST(c.reltuples, 0))"
                       f" FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = '{packed.TABLE}'::regclass)"
                       f" * (SELECT AVG(samples) FROM (SELECT samples FROM {packed.TABLE} LIMIT 100) s), 0))::bigint AS n")
            if name == packed_energy.RAW and packed_energy.TABLE in present:
                # packed energy minutes likewise: GPU-hour rows times the minutes of a few of them
                sql = (f"SELECT ((SELECT n FROM ({sql}) a) + COALESCE((SELECT GREATEST(reltuples, 0) FROM pg_class"
                       f" WHERE oid = '{packed_energy.TABLE}'::regclass)"
                       f" * (SELECT AVG(cardinality(minutes)) FROM (SELECT minutes FROM {packed_energy.TABLE} LIMIT 100) s), 0))::bigint AS n")
        else:
            sql, approx = f"SELECT COUNT(*) AS n FROM {quoted}", False
        counts.append((name, sql, approx))
    schema = {"table": pl.String, "rows": pl.Int64, "approximate": pl.Boolean}
    if not counts:
        return pl.DataFrame(schema=schema)
    # one statement for every table: each statement is a round trip (a new connection on PostgreSQL)
    union = " UNION ALL ".join(f"SELECT {i} AS i, ({sql}) AS n" for i, (_, sql, _) in enumerate(counts))
    n = dict(fetch(store, union, [], {"i": pl.Int64, "n": pl.Int64}, small=True).iter_rows())
    return pl.DataFrame([(name, int(n.get(i) or 0), approx) for i, (name, _, approx) in enumerate(counts)], schema=schema, orient="row")


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
        f" SELECT {packed.max_ts_sql(store.dialect)[0]} AS t"
        " UNION ALL SELECT MAX(ts) FROM job_event"
        " UNION ALL SELECT MAX(ts) FROM health_event"
        " UNION ALL SELECT MAX(ts) FROM nccl_test"
        " UNION ALL SELECT MAX(started_at) FROM job"
        " UNION ALL SELECT MAX(ended_at) FROM job"
        ") x), (SELECT MAX(ts) FROM metric_sample)) AS t"
    )
    df = fetch(store, sql, [], {"t": UTC}, small=True)
    return df["t"][0] if df.height else None


def data_start(store: Store) -> dt.datetime | None:
    """The earliest GPU sample held (indexed MIN), or None."""
    df = fetch(store, f"SELECT {packed.min_ts_sql(store.dialect)} AS t", [], {"t": UTC}, small=True)
    return df["t"][0] if df.height else None


def sample_interval_s(store: Store, at: dt.datetime) -> float:
    """The GPU sampling interval near ``at``: the median gap between the last few samples of the GPU
    sampled last before ``at`` (two indexed lookups). Falls back to DEFAULT_SAMPLE_INTERVAL_S."""
    at = as_utc(at)
    last = fetch(store, *packed.nearest_gpu_sql(store.dialect, at, before=True), {"gpu_uuid": pl.String}, small=True)
    if last.is_empty():
        last = fetch(store, *packed.nearest_gpu_sql(store.dialect, at, before=False), {"gpu_uuid": pl.String}, small=True)
    if last.is_empty():
        return DEFAULT_SAMPLE_INTERVAL_S
    ts = fetch(store, *packed.gpu_last_ts_sql(store.dialect, last["gpu_uuid"][0], at + dt.timedelta(days=1), 9), {"ts": UTC}, small=True)["ts"]
    if ts.len() < 2:
        return DEFAULT_SAMPLE_INTERVAL_S
    gaps = (ts.sort().diff().dt.total_microseconds() / 1e6).drop_nulls()
    gap = gaps.median()
    return float(gap) if gap and gap > 0 else DEFAULT_SAMPLE_INTERVAL_S


def sites(store: Store) -> pl.DataFrame:
    """``site_id, name`` of every site in the inventory (from hosts too, where no site row exists)."""
    sql = (
        "SELECT s.site_id, s.name FROM site s"
        " UNION SELECT DISTINCT h.site_id, NULL FROM host h"
        " WHERE h.site_id IS NOT NULL AND h.site_id NOT IN (SELECT site_id FROM site)"
        " ORDER BY 1"
    )
    return fetch(store, sql, [], {"site_id": pl.String, "name": pl.String}, small=True)


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
    return fetch(store, sql, params, {"sites": pl.Int64, "hosts": pl.Int64, "gpus": pl.Int64}, small=True)


def inventory_gpus(store: Store, site: str | None = None, limit: int = 2_000) -> pl.DataFrame:
    """``gpu_uuid, host, gpu_index, model_name`` of the inventory's GPUs (of one site), by host and index, at most
    ``limit`` of them: what a page offers to pick one GPU from."""
    params: list[Any] = []
    where = ""
    if site is not None:
        where = " WHERE g.host IN (SELECT host FROM host WHERE site_id = ?)"
        params.append(site)
    sql = f"SELECT g.gpu_uuid, g.host, g.gpu_index, g.model_name FROM gpu g{where} ORDER BY g.host, g.gpu_index, g.gpu_uuid LIMIT {int(limit)}"
    return fetch(store, sql, params, {"gpu_uuid": pl.String, "host": pl.String, "gpu_index": pl.Int64, "model_name": pl.String}, small=True)


def fleet_rows_sql(store: Store, start: dt.datetime, end: dt.datetime, columns: Sequence[str], alias: str, agg: str = "last") -> str:
    """The FROM item of a fleet-wide read of raw samples in ``[start, end)`` (``ts``, ``gpu_uuid``, ``columns``):
    ``gpu_samples_sql``, or where the range reaches an hour held packed and the minute tier serves it
    (``minute_tier_serves``: a packed hour is one array row per GPU, unpacked whole for a few minutes of it), each
    GPU's whole minutes from the minute tier's start before ``start`` to its last before ``end`` (at least that
    one), one row a minute standing in for its samples: ``ts`` the minute's start, each field its minute's
    ``agg`` (``last`` for a latest reading, ``mean`` for an average)."""
    if not minute_tier_serves(store, [(start, end)])[0]:
        return gpu_samples_sql(store, start, end, columns, alias)
    first, last = tiers.floor_to(start, "minute"), tiers.floor_to(end, "minute")
    first = min(first, last - tiers.BUCKET["minute"])
    fields = "".join(f", {c}_{agg} AS {c}" for c in dict.fromkeys(columns) if c not in ("ts", "gpu_uuid"))
    return (f"(SELECT bucket AS ts, gpu_uuid{fields} FROM {tiers.TIER_TABLE['minute']}"
            f" WHERE bucket >= {packed.time_literal(first)} AND bucket < {packed.time_literal(last)}) {alias}")


def _lookback(store: Store, end: dt.datetime, lookback_s: float | None) -> float:
    # Three sample intervals: a GPU whose last scrape was slow or dropped still counts as reporting.
    return float(lookback_s) if lookback_s else max(60.0, 3 * sample_interval_s(store, end))


def latest_fields(store: Store, end: dt.datetime, columns: Sequence[str], lookback_s: float | None = None,
                  site: str | None = None) -> pl.DataFrame:
    """``gpu_uuid, ts`` and ``columns`` of the latest sample of every GPU that reported in ``[end - lookback_s,
    end)``, unordered and without the inventory: a read of a few fields of the whole fleet (the database sorts
    narrow rows, and a 100,000-GPU fleet sends 100,000 short ones). In an hour held packed, each GPU's last
    whole minute before ``end`` stands in for its latest sample (``fleet_rows_sql``): ``ts`` that minute's
    start, the fields their last readings in it."""
    end = as_utc(end)
    start = end - dt.timedelta(seconds=_lookback(store, end, lookback_s))
    params: list[Any] = []
    site_sql = site_gpus_sql(site, params, "s.gpu_uuid")
    cols = [c for c in dict.fromkeys(columns) if c not in ("ts", "gpu_uuid")]
    if any(c not in F.GPU_SAMPLE.schema for c in cols):
        raise ValueError(f"gpu_sample has no field among {cols!r}")
    fields = "".join(f", s.{c}" for c in cols)
    sql = (
        f"SELECT gpu_uuid, ts{''.join(', ' + c for c in cols)} FROM ("
        f" SELECT s.gpu_uuid, s.ts{fields}, ROW_NUMBER() OVER (PARTITION BY s.gpu_uuid ORDER BY s.ts DESC) AS rn"
        f" FROM {fleet_rows_sql(store, start, end, cols, 's')} WHERE TRUE{site_sql}) x WHERE rn = 1"
    )
    return fetch(store, sql, params, {"gpu_uuid": pl.String, "ts": UTC, **{c: F.GPU_SAMPLE.schema[c] for c in cols}})


def power_of(latest: pl.DataFrame) -> pl.DataFrame:
    """``power_now``'s row from ``latest_fields`` rows that hold ``power_w``: the same GPUs (each one's latest
    sample in the window) and the same sums, without a second read of them."""
    watts = latest["power_w"].drop_nulls()
    return pl.DataFrame({"as_of": [latest["ts"].max()], "gpus_reporting": [latest.height],
                         "power_w": [float(watts.sum()) if watts.len() else None]},
                        schema={"as_of": UTC, "gpus_reporting": pl.Int64, "power_w": pl.Float64})


def power_now(store: Store, end: dt.datetime, lookback_s: float | None = None, site: str | None = None) -> pl.DataFrame:
    """One row: ``as_of`` (newest sample), ``gpus_reporting`` and their summed latest ``power_w`` (the GPUs of
    ``latest_fields``, summed in the database: one row comes back however large the fleet)."""
    end = as_utc(end)
    start = end - dt.timedelta(seconds=_lookback(store, end, lookback_s))
    params: list[Any] = []
    site_sql = site_gpus_sql(site, params, "s.gpu_uuid")
    sql = (
        "SELECT MAX(ts) AS as_of, COUNT(*) AS gpus_reporting, SUM(power_w) AS power_w FROM ("
        " SELECT s.ts, s.power_w, ROW_NUMBER() OVER (PARTITION BY s.gpu_uuid ORDER BY s.ts DESC) AS rn"
        f" FROM {fleet_rows_sql(store, start, end, ('power_w',), 's')} WHERE TRUE{site_sql}) x WHERE rn = 1"
    )
    return fetch(store, sql, params, {"as_of": UTC, "gpus_reporting": pl.Int64, "power_w": pl.Float64}, small=True)


def fleet_series(
    store: Store,
    start: dt.datetime,
    end: dt.datetime,
    points: int = 48,
    busy_util_ratio: float = 0.1,
    site: str | None = None,
    tier: str | None = None,
    probe_s: float | None = None,
) -> pl.DataFrame:
    """Fleet power and utilisation at ``points`` instants evenly spread over ``(start, end]``.

    ``tier`` (default: ``services.tiers.choose_tier`` of the range) says what the probes read: raw samples
    for a short range, the minute or hour roll-up tier for a long one, so a 30-day panel reads no raw row.
    A tier probe averages the GPU's bucket means (utilisation, power) and takes its bucket maximum
    (temperature) over the ``TIER_PROBE`` before the instant; an instant the tier has not rolled yet (past its
    watermark) is probed in the raw samples, as is every instant while the tier holds no row.

    Each point is a probe: the GPUs' samples over the 1.5 sample intervals before the instant, averaged
    per GPU, then summed (power) or counted (busy GPUs) across the fleet. Reading a probe per point
    instead of every sample keeps a day of a 16k-GPU fleet at ``points`` × 16k rows, the same as an hour.
    ``probe_s`` (``raw_probe_s`` of a page's whole range, read once for its many one-point calls) stands in
    for measuring the sample interval at the range's ends.
    Columns: ``ts, gpus_reporting, gpus_busy, util_mean_ratio, power_w, temp_max_c``.
    """
    start, end = as_utc(start), as_utc(end)
    schema = {
        "ts": UTC,
        "gpus_reporting": pl.Int64,
        "gpus_busy": pl.Int64,
        "util_mean_ratio": pl.Float64,
        "power_w": pl.Float64,
        "temp_max_c": pl.Float64,
    }
    # a tier never rolled (no beat yet: a fresh embedded install) leaves the read on raw samples
    tier = tier or tiers.tier_for(store, start, end)
    if tier != "raw":
        return _tier_fleet_series(store, tier, start, end, points, busy_util_ratio, site, schema, probe_s)
    if end <= start:
        return pl.DataFrame(schema=schema)
    if points > 1 or probe_s is None:
        # a one-point series' instant is its end, wherever the data begins
        first = data_start(store)
        if first is None:
            return pl.DataFrame(schema=schema)
        start = max(start, first)
    probe = dt.timedelta(seconds=probe_s) if probe_s else _raw_probe_length(store, start, end)
    return _probes(store, _raw_probes(store, _instants(start, end, points), probe), busy_util_ratio, site, schema)


def raw_probe_s(store: Store, start: dt.datetime, end: dt.datetime) -> float:
    """How far back a raw probe of ``fleet_series`` over ``[start, end)`` looks: 1.5 sample intervals, measured
    at both ends (one scrape of every GPU however the scrapes fall)."""
    return _raw_probe_length(store, as_utc(start), as_utc(end)).total_seconds()


def series_tier(store: Store, range_s: int) -> str:
    """The tier ``fleet_series`` reads for the last ``range_s`` seconds: the one a panel's read of that range goes
    to (``services.tiers.tier_for``: by the range, passing over tiers never rolled and tiers retention has pruned
    past its start). A page probing a long range instant by instant asks once, so each of its probes reads the
    tier the whole range would, not raw samples because one probe's own span is short."""
    now = dt.datetime.now(dt.UTC)
    return tiers.tier_for(store, now - dt.timedelta(seconds=int(range_s)), now)


def series_start(store: Store, range_s: int) -> dt.datetime | None:
    """The earliest instant a fleet series over a range of ``range_s`` seconds can show: the oldest raw sample, or
    the oldest bucket of the tier such a range reads where that is older (raw samples kept for less long than
    the tier), or None before any data."""
    first = data_start(store)
    tier = series_tier(store, range_s)
    if tier != "raw":
        oldest = tiers.oldest(store, tier)
        if oldest is not None and (first is None or oldest < first):
            first = oldest
    return first


def _instants(start: dt.datetime, end: dt.datetime, points: int) -> list[dt.datetime]:
    points = max(1, int(points))
    step = (end - start) / points
    return [start + step * (i + 1) for i in range(points)]


Probe = tuple[dt.datetime, str, list[Any]]
"""One probe of ``fleet_series``: its instant, the per-GPU aggregates (``u``, ``p``, ``t``) it reads up to the
instant (SQL ending in a WHERE clause), and that SQL's parameters."""


def _raw_probe_length(store: Store, start: dt.datetime, end: dt.datetime) -> dt.timedelta:
    """1.5 sample intervals, measured at both ends of a range: one scrape of every GPU however the scrapes fall."""
    return dt.timedelta(seconds=1.5 * max(sample_interval_s(store, end), sample_interval_s(store, start)))


def _raw_probe(store: Store, at: dt.datetime, probe: dt.timedelta) -> Probe:
    """A probe of the raw samples over the ``probe`` before ``at``."""
    source = gpu_samples_sql(store, at - probe, at, ("util_ratio", "power_w", "temp_c"))
    return at, f"AVG(util_ratio) AS u, AVG(power_w) AS p, MAX(temp_c) AS t FROM {source} WHERE TRUE", []


def _tier_inner(tier: str) -> str:
    """A tier probe's per-GPU aggregates over the buckets ``bucket >= ? AND bucket < ?``."""
    return (f"AVG(util_ratio_mean) AS u, AVG(power_w_mean) AS p, MAX(temp_c_max) AS t FROM {tiers.TIER_TABLE[tier]}"
            " WHERE bucket >= ? AND bucket < ?")


def minute_tier_serves(store: Store, spans: Sequence[tuple[dt.datetime, dt.datetime]]) -> list[bool]:
    """Whether a fleet-wide raw read of each ``[start, end)`` should read the minute tier instead: it reaches an hour
    held packed (``store.reads.packed_hours_reached``), and the minute tier still holds the minutes around it
    (its retention is shorter than raw samples'; past it, the packed hour is read after all). A packed hour is one
    array row per GPU, so a probe of a few seconds in it unpacks the hour for every GPU: six hours of yesterday's
    fleet panel over 1,024 GPUs took 6.8 s that way. Packing waits for the minute tier to pass an hour."""
    reached = packed_hours_reached(store, spans)
    if not any(reached):
        return reached
    oldest = tiers.oldest(store, "minute")
    return [r and oldest is not None and start - 2 * tiers.BUCKET["minute"] >= oldest for r, (start, _) in zip(reached, spans, strict=True)]


def _raw_probes(store: Store, instants: Sequence[dt.datetime], probe: dt.timedelta) -> list[Probe]:
    """Raw probes of ``instants``, save those ``minute_tier_serves``, which read the minute tier's last full minute
    before the instant."""
    out: list[Probe] = []
    for at, by_minute in zip(instants, minute_tier_serves(store, [(at - probe, at) for at in instants]), strict=True):
        if by_minute:
            out.append((at, _tier_inner("minute"), list(tiers.bucket_before(at, "minute"))))
        else:
            out.append(_raw_probe(store, at, probe))
    return out


def _probes(store: Store, probes: list[Probe], busy_util_ratio: float, site: str | None, schema: dict[str, pl.DataType]) -> pl.DataFrame:
    """``fleet_series``' probes as one query: per instant, each GPU's aggregates over its probe, from raw samples
    or a tier, folded over the fleet."""
    parts: list[str] = []
    params: list[Any] = []
    for at, inner, inner_params in probes:
        params += [at, busy_util_ratio, *inner_params]
        site_sql = site_gpus_sql(site, params)
        parts.append(
            "SELECT ? AS ts, COUNT(*) AS gpus_reporting, SUM(CASE WHEN u >= ? THEN 1 ELSE 0 END) AS gpus_busy,"
            " AVG(u) AS util_mean_ratio, SUM(p) AS power_w, MAX(t) AS temp_max_c FROM ("
            f" SELECT gpu_uuid, {inner}{site_sql} GROUP BY gpu_uuid) x"
        )
    if not parts:
        return pl.DataFrame(schema=schema)
    df = fetch(store, " UNION ALL ".join(parts), params, schema, small=True)  # a row a point
    return df.filter(pl.col("gpus_reporting") > 0).sort("ts")


TIER_PROBE = {"minute": dt.timedelta(minutes=5), "hour": dt.timedelta(hours=2)}
"""How far back a tier probe looks: a few buckets, so a probe just behind the tier's watermark still finds one."""


def _tier_fleet_series(store: Store, tier: str, start: dt.datetime, end: dt.datetime, points: int, busy_util_ratio: float,
                       site: str | None, schema: dict[str, pl.DataType], probe_s: float | None = None) -> pl.DataFrame:
    table = tiers.TIER_TABLE[tier]
    first = fetch(store, f"SELECT MIN(bucket) AS t FROM {table}", [], {"t": UTC}, small=True)["t"][0]
    if first is None:
        return fleet_series(store, start, end, points, busy_util_ratio, site, tier="raw", probe_s=probe_s)
    start = max(start, first)
    if end <= start:
        return pl.DataFrame(schema=schema)
    return _tier_probes(store, tier, _instants(start, end, points), busy_util_ratio, site, schema, probe_s, TIER_PROBE[tier])


def _tier_probes(store: Store, tier: str, instants: list[dt.datetime], busy_util_ratio: float, site: str | None,
                 schema: dict[str, pl.DataType], probe_s: float | None, width: dt.timedelta) -> pl.DataFrame:
    """Tier probes of the ``width`` before each instant over what the tier has rolled, and raw probes for instants
    whose probe holds no rolled bucket (past the watermark: ``tiers.SETTLE`` and beat's tick behind the data for
    the minute tier, up to an hour more for the hour tier), so the newest points are not missing while the tier
    catches up."""
    rolled_to = tiers.watermark(store, tier)
    inner = _tier_inner(tier)

    def rolled(at: dt.datetime) -> bool:
        # the first bucket the probe reads starts before the watermark
        return rolled_to is None or tiers.bucket_from(at - width, tier) < rolled_to

    tail = [at for at in instants if not rolled(at)]
    probes: list[Probe] = [(at, inner, [at - width, at]) for at in instants if rolled(at)]
    if tail:
        probe = dt.timedelta(seconds=probe_s) if probe_s else _raw_probe_length(store, tail[0], tail[-1])
        probes += _raw_probes(store, tail, probe)
    return _probes(store, probes, busy_util_ratio, site, schema)


def fleet_series_at(store: Store, instants: Sequence[dt.datetime], site: str | None = None, tier: str = "raw",
                    probe_s: float | None = None, busy_util_ratio: float = 0.1) -> pl.DataFrame:
    """``fleet_series``' point at each of ``instants`` (a page's grid), all in one statement: from the bucket of
    ``tier`` that ends at or before the instant where the tier has rolled it (one bucket: a grid's instants fall
    on bucket edges), else from raw samples over ``probe_s`` (measured at the instants' ends if not given)."""
    ats = sorted(as_utc(a) for a in instants)
    schema = {"ts": UTC, "gpus_reporting": pl.Int64, "gpus_busy": pl.Int64, "util_mean_ratio": pl.Float64, "power_w": pl.Float64,
              "temp_max_c": pl.Float64}
    if not ats:
        return pl.DataFrame(schema=schema)
    if tier != "raw" and fetch(store, f"SELECT MIN(bucket) AS t FROM {tiers.TIER_TABLE[tier]}", [], {"t": UTC}, small=True)["t"][0] is not None:
        return _tier_probes(store, tier, ats, busy_util_ratio, site, schema, probe_s, tiers.BUCKET[tier])
    probe = dt.timedelta(seconds=probe_s) if probe_s else _raw_probe_length(store, ats[0], ats[-1])
    return _probes(store, _raw_probes(store, ats, probe), busy_util_ratio, site, schema)


SERIES_FIELDS: tuple[str, ...] = tuple(c.name for c in F.GPU_FIELDS)
"""The fields a GPU's series may ask for: every field of ``gpu_sample`` (each has its column in both tiers)."""
DEFAULT_SERIES_FIELDS = ("util_ratio", "power_w", "temp_c")
MAX_SERIES_FIELDS = 8
MAX_UUID_CHARS = 128
MAX_SERIES_POINTS = 100_000
"""The most rows (points of all fields together) one GPU's series gives: a read past it is refused, not cut."""


class TooManyPoints(ValueError):
    """A GPU series over more than ``MAX_SERIES_POINTS`` points: a shorter window or fewer fields."""


def series_fields(fields: str | Sequence[str]) -> tuple[str, ...]:
    """``fields`` checked against ``SERIES_FIELDS`` (the names go into SQL, so nothing else passes), in the order
    given, each once; ``ValidationError`` naming the first unknown one."""
    asked = [fields] if isinstance(fields, str) else list(fields)
    if not asked:
        raise ValidationError("ask for at least one field", frame="gpu_sample", field="field")
    for name in asked:
        if not isinstance(name, str) or name not in SERIES_FIELDS:
            raise ValidationError(f"no such GPU field (one of gpu_sample's: {', '.join(SERIES_FIELDS)})", frame="gpu_sample", field=str(name)[:64])
    out = tuple(dict.fromkeys(asked))
    if len(out) > MAX_SERIES_FIELDS:
        raise ValidationError(f"{len(out)} fields asked, at most {MAX_SERIES_FIELDS} in one read", frame="gpu_sample", field="field")
    return out


def check_gpu_uuid(gpu_uuid: str) -> None:
    """``ValidationError`` for a UUID no GPU has: empty, over ``MAX_UUID_CHARS``, or with control characters (a NUL is
    no text to PostgreSQL). It is only ever a bound parameter; this keeps a typo from reaching the database."""
    if not isinstance(gpu_uuid, str) or not gpu_uuid or len(gpu_uuid) > MAX_UUID_CHARS or has_control(gpu_uuid):
        raise ValidationError(f"not a GPU UUID: empty, over {MAX_UUID_CHARS} characters or with control characters", frame="gpu", field="gpu_uuid")


def _per_field_cap(fields: Sequence[str], max_points: int) -> int:
    """The most rows one read of ``fields`` may give within ``max_points`` values of all fields."""
    return max(1, max_points // len(fields))


def _raw_series(store: Store, gpu_uuid: str, fields: Sequence[str], start: dt.datetime, end: dt.datetime, max_points: int) -> pl.DataFrame:
    """One wide read of a GPU's raw samples over ``[start, end)`` (``ts`` and ``fields``), refused past ``max_points``
    values of all fields."""
    cap = _per_field_cap(fields, max_points)
    source = gpu_samples_sql(store, start, end, fields)
    df = fetch(store, f"SELECT ts, {', '.join(fields)} FROM {source} WHERE gpu_uuid = ? ORDER BY ts LIMIT {cap + 1}", [gpu_uuid],
               {"ts": UTC, **{f: F.GPU_SAMPLE.schema[f] for f in fields}})
    if df.height > cap:
        raise TooManyPoints(f"more than {cap:,} points of each of {len(fields)} field(s) in the window (at most {max_points:,} in all):"
                            " ask for a shorter window or fewer fields")
    return df


def gpu_field_series(store: Store, gpu_uuid: str, field: str | Sequence[str], start: dt.datetime, end: dt.datetime,
                     tier: str | None = None, max_points: int | None = None) -> pl.DataFrame:
    """GPU fields of one GPU over ``[start, end)``, every field in one read: ``field, ts, samples, min, max, mean,
    last, tier, from_raw`` per field (in the order asked) and per raw sample, or per bucket of the tier
    ``services.tiers.tier_for`` picks for the range (a GPU panel's read: raw up to 6 h, minute buckets up to 7
    days, hours beyond). A tier's buckets start in the range; those past its watermark (the minutes beat has not
    rolled yet, the hour under way) are rolled here from raw samples the way the tier rolls them
    (``analyzers.tiers``), at most ``RAW_MAX_RANGE`` of them, and say ``from_raw``. Field names are checked
    (``series_fields``) before they reach SQL; more than ``max_points`` (``MAX_SERIES_POINTS``) points raise
    ``TooManyPoints``."""
    check_gpu_uuid(gpu_uuid)
    fields = series_fields(field)
    max_points = max_points or MAX_SERIES_POINTS
    start, end = as_utc(start), as_utc(end)
    tier = tier or tiers.tier_for(store, start, end)
    schema = {"field": pl.String, "ts": UTC, "samples": pl.Int64, "min": pl.Float64, "max": pl.Float64, "mean": pl.Float64,
              "last": pl.Float64, "tier": pl.String, "from_raw": pl.Boolean}
    if end <= start:
        return pl.DataFrame(schema=schema)
    parts: list[pl.DataFrame] = []
    if tier == "raw":
        wide = _raw_series(store, gpu_uuid, fields, start, end, max_points)
        parts = [wide.select(pl.lit(f).alias("field"), "ts", pl.lit(1, pl.Int64).alias("samples"), *(pl.col(f).alias(a) for a in ("min", "max", "mean", "last")),
                             pl.lit(True).alias("from_raw")) for f in fields]
    else:
        rolled_to = tiers.watermark(store, tier)
        first = tiers.bucket_from(start, tier)
        # the tier's buckets up to its watermark; past it, at most RAW_MAX_RANGE of raw samples rolled here
        cut = max(first, min(end, rolled_to or end), tiers.floor_to(end - tiers.RAW_MAX_RANGE, tier))
        cols = ", ".join(f"{f}_{a}" for f in fields for a in ("min", "max", "mean", "last"))
        sql = f"SELECT bucket AS ts, samples, {cols} FROM {tiers.TIER_TABLE[tier]} WHERE gpu_uuid = ? AND bucket >= ? AND bucket < ? ORDER BY bucket"
        out = {"ts": UTC, "samples": pl.Int64, **{f"{f}_{a}": pl.Float64 for f in fields for a in ("min", "max", "mean", "last")}}
        cap = _per_field_cap(fields, max_points)
        rolled = fetch(store, f"{sql} LIMIT {cap + 1}", [gpu_uuid, first, min(cut, end)], out)
        if cut < end:
            raw = _raw_series(store, gpu_uuid, fields, cut, end, max_points)
            made = tier_rollup.minute_rollup(raw.with_columns(pl.lit(gpu_uuid).alias("gpu_uuid")))
            made = tier_rollup.hour_rollup(made) if tier == "hour" else made
            rolled = pl.concat([rolled.with_columns(pl.lit(False).alias("from_raw")),
                                made.select(pl.col("bucket").alias("ts"), *(pl.col(c).cast(t) for c, t in out.items() if c != "ts"),
                                            pl.lit(True).alias("from_raw"))])
        else:
            rolled = rolled.with_columns(pl.lit(False).alias("from_raw"))
        if rolled.height > cap:
            raise TooManyPoints(f"more than {cap:,} buckets of each of {len(fields)} field(s) in the window (at most {max_points:,} points in all):"
                                " ask for a shorter window or fewer fields")
        parts = [rolled.select(pl.lit(f).alias("field"), "ts", "samples", *(pl.col(f"{f}_{a}").alias(a) for a in ("min", "max", "mean", "last")),
                               "from_raw") for f in fields]
    return pl.concat(parts).with_columns(pl.lit(tier).alias("tier")).select([pl.col(c).cast(t) for c, t in schema.items()])


def _sampled(store: Store, gpu_uuid: str) -> bool:
    """Whether any raw sample names ``gpu_uuid`` (its newest, by index; packed days too)."""
    sql, params = packed.gpu_last_ts_sql(store.dialect, gpu_uuid, dt.datetime(9999, 1, 1, tzinfo=dt.UTC), 1)
    return fetch(store, sql, params, {"ts": UTC}, small=True).height > 0


def check_window(start: dt.datetime, end: dt.datetime, max_days: int) -> None:
    """``units.check_window`` with the hour tier's retention (``max_days``) as the longest window: the longest range a
    tier still serves."""
    units.check_window(start, end)  # first: a span of a time without a zone is no span
    if end - start > dt.timedelta(days=max_days):
        raise ValueError(f"the window is {(end - start).total_seconds() / 86_400:,.1f} days; the longest the tiers serve is {max_days:,}"
                         " (FLEETSCOPE_HOUR_TIER_RETENTION_DAYS)")


def gpu_series(store: Store, gpu_uuid: str, fields: Sequence[str], start: dt.datetime, end: dt.datetime, *, max_days: int,
               max_points: int | None = None) -> dict[str, Any]:
    """One GPU's history as ``GET /api/v1/gpus/{gpu_uuid}/series`` and ``fleetscope fleet gpu`` give it: the window
    (``check_window``), the tier read, whether the inventory holds the GPU, and ``gpu_field_series``' rows with
    RFC 3339 times. ``NotFound`` for a GPU neither in the inventory nor named by any sample; ``ValidationError`` for
    a UUID no GPU has (empty, over ``MAX_UUID_CHARS``, control characters) or an unknown field."""
    check_gpu_uuid(gpu_uuid)
    fields = series_fields(fields)
    check_window(start, end, max_days)
    tier = tiers.tier_for(store, start, end)
    df = gpu_field_series(store, gpu_uuid, fields, start, end, tier=tier, max_points=max_points)
    in_inventory = fetch(store, "SELECT COUNT(*) AS n FROM gpu WHERE gpu_uuid = ?", [gpu_uuid], {"n": pl.Int64}, small=True)["n"][0] > 0
    if not in_inventory and df.is_empty() and not _sampled(store, gpu_uuid):
        raise NotFound(f"no GPU {gpu_uuid[:200]!r} in the inventory, and no sample names it")
    rows = [{**r, "ts": r["ts"].isoformat()} for r in df.to_dicts()]
    return {"gpu_uuid": gpu_uuid, "in_inventory": in_inventory, "start": as_utc(start).isoformat(), "end": as_utc(end).isoformat(),
            "tier": tier, "fields": list(fields), "points": len(rows), "series": rows}


def metric_series(store: Store, name_like: str, start: dt.datetime, end: dt.datetime, bucket_s: int = 900) -> pl.DataFrame:
    """Mean value per time bucket of the ``metric_sample`` series whose name matches ``name_like`` (SQL
    LIKE): ``ts, series, value_mean``. Facility meters (PUE, site power, grid intensity) arrive this way."""
    bucket = bucket_us_sql(store, "m.ts", bucket_s)
    sql = (
        f"SELECT {bucket} AS ts, s.series, AVG(m.value) AS value_mean FROM metric_sample m JOIN series s ON s.series_id = m.series_id"
        " WHERE s.name LIKE ? AND m.ts >= ? AND m.ts < ? GROUP BY 1, 2 ORDER BY 1, 2"
    )
    return fetch(store, sql, [name_like, as_utc(start), as_utc(end)], {"ts": UTC, "series": pl.String, "value_mean": pl.Float64})

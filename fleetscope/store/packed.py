"""Closed days of raw GPU telemetry packed into per-(GPU, hour) rows of column arrays (PostgreSQL only).

A day of ``gpu_sample`` rows costs 4.2 MB per GPU as rows (a 24-byte tuple header, the 41-byte text UUID and
the (gpu_uuid, ts) key entry on every 10-second sample). Once a day is closed and the roll-up tiers have
passed it, beat packs its partition into ``gpu_sample_packed``: one row per GPU and UTC hour holding the
hour's timestamps and each field as an array in time order, which PostgreSQL's TOAST compresses (lz4 where
the server has it; PostgreSQL 15 docs, ch. 73.2 "TOAST"). The UUID and the row overhead are then paid once
per 360 samples, and fields that hold still (clocks, memory, error counters) compress to almost nothing.

Fields whose source precision is far below float4's 24-bit mantissa (DCGM's utilisations are whole percent or
ratios, temperatures whole °C, clocks whole MHz, power to the mW, bandwidths averaged over a second) are
kept as ``real``; counters read as differences (energy in J, violation time in s) keep ``double precision``,
and integer fields ``bigint``. Every read of raw samples goes through ``source``: on PostgreSQL the rows of
the range from the raw partitions and, unnested, from the packed ones (partition pruning on the literal
bounds leaves out whatever the range does not reach); on SQLite, which never packs, the table itself.

A day is packed an hour at a time, each hour in its own transaction that inserts the packed rows and deletes the
raw ones it read, so a reader sees an hour either raw or packed, never both, and a 16,384-GPU day is 24
bounded transactions rather than one of hours. Packing keeps the day's (emptied) raw partition, so a late or
backfilled sample still finds it and the next pack folds it in. Retention drops both tables' day partitions.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence

import polars as pl

from fleetscope.core import frames as F
from fleetscope.core.units import as_utc
from fleetscope.store import gpu_keys
from fleetscope.store.sql import epoch_us

TABLE = "gpu_sample_packed"
RAW = "gpu_sample"

FLOAT4_FIELDS = frozenset({
    "util_ratio", "mem_copy_util_ratio", "enc_util_ratio", "dec_util_ratio", "gr_engine_active_ratio", "sm_active_ratio",
    "sm_occupancy_ratio", "tensor_active_ratio", "fp64_active_ratio", "fp32_active_ratio", "fp16_active_ratio",
    "dram_active_ratio", "power_w", "temp_c", "mem_temp_c", "sm_clock_mhz", "mem_clock_mhz", "pcie_tx_bytes_per_s",
    "pcie_rx_bytes_per_s", "nvlink_tx_bytes_per_s", "nvlink_rx_bytes_per_s",
})
"""Fields packed as ``real``: measured to far fewer than float4's 7 significant digits."""

FIELDS: tuple[str, ...] = tuple(c.name for c in F.GPU_FIELDS)


def array_type(field: str) -> str:
    """The SQL array type a packed field is held in."""
    if field in FLOAT4_FIELDS:
        return "real[]"
    return "bigint[]" if F.GPU_SAMPLE.schema[field] == pl.Int64 else "double precision[]"


def time_literal(t: dt.datetime) -> str:
    """A UTC instant as a SQL literal: a packed read's bounds are literals, so the planner prunes partitions."""
    if not isinstance(t, dt.datetime):
        raise TypeError(f"a bound of packed data must be a datetime, got {t!r}")
    return f"TIMESTAMPTZ '{as_utc(t).isoformat()}'"


def hour_floor(t: dt.datetime) -> dt.datetime:
    return as_utc(t).replace(minute=0, second=0, microsecond=0)


def source(dialect: str, start: dt.datetime | None, end: dt.datetime | None, columns: Sequence[str] | None = None,
           alias: str = "gpu_sample", packed_until: dt.datetime | None = None) -> str:
    """A FROM item, named ``alias``, of the raw samples with ``start <= ts < end`` (either bound may be None),
    with ``ts``, ``gpu_uuid`` and ``columns`` (default: every field). The bounds are applied here, exactly, on
    both databases: a caller adds no ``ts`` filter of its own (see the estimate below).

    ``packed_until``: the end of the newest packed hour (``HORIZON_SQL``), or None where none is. A raw row
    before it may be a sample that a packed hour also holds: sent again in another body after its hour was
    packed, which the raw table's key cannot see. Such a row is left out (the packed copy was stored first;
    the next pack folds the raw one in, filling only the packed copy's NULLs, ``pack_sql``, as a re-sent raw
    sample does on write), each raw row before the horizon probing its own GPU-hour by the packed table's key.
    Those are late rows only (the hours under way are rows), so a range after the horizon is read as
    without it, by the same SQL."""
    fields = [c for c in dict.fromkeys(columns if columns is not None else FIELDS) if c not in ("ts", "gpu_uuid")]
    bad = [c for c in fields if c not in FIELDS]
    if bad:
        raise ValueError(f"gpu_sample has no field {bad[0]!r}")
    start, end = (None if t is None else as_utc(t) for t in (start, end))  # a naive bound is UTC, as on every read
    raw_where = range_sql(dialect, "ts", start, end)
    if dialect != "postgresql":
        return f"({_raw_select(RAW, fields, raw_where, keyed=False)}) {alias}"
    # A range filter on an unpacked timestamp is an expression without statistics, which the planner gives a
    # selectivity of 0.005 (and a caller's second filter another 0.005): a packed hour of a fleet estimated at a
    # few rows, then joined by nested loops, or sorted where it should be hashed. So the packed hours wholly inside
    # the range are chosen by ``hour`` alone (a column with statistics), and only the one or two hours the bounds
    # cut are filtered sample by sample (``store.packed_energy.source`` does the same for the energy minutes).
    whole, edges = hour_split(start, end)
    arms = _raw_arms(fields, start, end, packed_until)
    if whole is not None:
        arms.append(_packed_select(TABLE, fields, whole, []))
    if edges:
        arms.append(_packed_select(TABLE, fields, ["p.hour IN (" + ", ".join(time_literal(h) for h in edges) + ")"],
                                   [f"u.{c}" for c in raw_where]))
    return f"({' UNION ALL '.join(arms)}) {alias}"


HORIZON_SQL = f"SELECT MAX(hour) + INTERVAL '1 hour' FROM {TABLE}"
"""The end of the newest packed hour (NULL where none is): ``source``'s ``packed_until``."""


def _raw_arms(fields: Sequence[str], start: dt.datetime | None, end: dt.datetime | None,
              packed_until: dt.datetime | None) -> list[str]:
    """PostgreSQL's raw rows of ``[start, end)``: those at or after ``packed_until`` as they are, those before it
    without the samples a packed hour also holds (``source``)."""
    if packed_until is None or (start is not None and start >= packed_until):
        return [_raw_select(RAW, fields, range_sql("postgresql", "ts", start, end))]
    packed_until = as_utc(packed_until)
    before = packed_until if end is None else min(end, packed_until)
    # A scalar subquery stays a per-row probe by the packed key: as a join, the planner (not knowing how few these
    # rows are) might hash a range's packed hours, detoasting every GPU-hour's timestamps.
    probe = (f"NOT (SELECT EXISTS (SELECT 1 FROM {TABLE} q WHERE q.gpu_uuid = {gpu_keys.TABLE}.gpu_uuid"
             f" AND q.hour = date_trunc('hour', {RAW}.ts, 'UTC') AND {RAW}.ts = ANY(q.ts)))")
    arms = [_raw_select(RAW, fields, [*range_sql("postgresql", "ts", start, before), probe])]
    if end is None or end > packed_until:
        arms.insert(0, _raw_select(RAW, fields, range_sql("postgresql", "ts", packed_until, end)))
    return arms


def hour_split(start: dt.datetime | None, end: dt.datetime | None) -> tuple[list[str] | None, list[dt.datetime]]:
    """How a packed read of ``[start, end)`` picks its hours: the conditions on ``p.hour`` of the hours wholly
    inside the range (None where there are none), and the one or two hours a bound cuts, to be filtered value by
    value. Chosen by ``hour`` alone, a column with statistics, where a filter on unpacked times has none."""
    whole: list[str] = []
    edges: list[dt.datetime] = []
    first = last = None
    if start is not None:
        first = hour_floor(start)
        if first < start:
            edges.append(first)
            first += dt.timedelta(hours=1)
        whole.append(f"p.hour >= {time_literal(first)}")
    if end is not None:
        last = hour_floor(end)
        if last < end and last not in edges:
            edges.append(last)
        whole.append(f"p.hour < {time_literal(last)}")
    return (None if first is not None and last is not None and first >= last else whole), edges


def range_sql(dialect: str, column: str, start: dt.datetime | None, end: dt.datetime | None) -> list[str]:
    """The conditions ``start <= column < end`` (a None bound left out) with the bounds as literals in the
    dialect's storage form: SQLite's epoch microseconds, PostgreSQL's timestamptz (which prunes partitions)."""
    lit = epoch_us if dialect != "postgresql" else time_literal
    return [*([f"{column} >= {lit(start)}"] if start is not None else []), *([f"{column} < {lit(end)}"] if end is not None else [])]


def where_sql(conds: Sequence[str]) -> str:
    return " WHERE " + " AND ".join(conds) if conds else ""


def _raw_select(table: str, fields: Sequence[str], where: Sequence[str], tag: str = "", keyed: bool = True) -> str:
    """Raw rows of ``table`` (``gpu_sample`` or a day partition); ``keyed``: PostgreSQL's, whose GPU is an
    integer id, the UUID joined back (``store.gpu_keys``)."""
    cols = ", ".join(["ts", "gpu_uuid", *(f'"{c}"' for c in fields)])
    return f"SELECT {tag}{cols} FROM {gpu_keys.join_sql(table) if keyed else table}{where_sql(where)}"


def _packed_select(table: str, fields: Sequence[str], hour_where: Sequence[str], ts_where: Sequence[str], tag: str = "") -> str:
    """Rows of ``table``'s packed samples: the arrays unnested side by side in the select list (a ProjectSet,
    which PostgreSQL 10+ runs in lockstep, an all-NULL field's NULL array giving NULLs; several times faster
    than ``unnest`` in FROM, which stores its rows first), float4 fields widened to float8 as ``gpu_sample``
    holds them."""
    picked = ", ".join(["unnest(p.ts) AS ts", "p.gpu_uuid",
                        *(f'unnest(p."{c}"){"::float8" if c in FLOAT4_FIELDS else ""} AS "{c}"' for c in fields)])
    return f"SELECT {tag}u.* FROM (SELECT {picked} FROM {table} p{where_sql(hour_where)}) u{where_sql(ts_where)}"


def max_ts_sql(dialect: str, before: dt.datetime | None = None) -> tuple[str, list[dt.datetime]]:
    """A scalar subquery, and its parameters: the newest raw sample's ``ts`` (before ``before``, when given), or NULL."""
    if dialect != "postgresql":
        return f"(SELECT MAX(ts) FROM {RAW}" + ("" if before is None else " WHERE ts < ?") + ")", ([] if before is None else [before])
    below = "" if before is None else f" WHERE ts < {time_literal(before)}"
    # The newest packed sample lies in the newest packed hour; with ``before`` inside that hour ahead of its first
    # sample, in the packed hour before it, which a fleet-wide outage may have left hours earlier. Only the newest
    # hour's timestamps are unpacked; the one before gives its last times, each GPU-hour's a column (migration
    # 0028; the array's last element for rows packed before it).
    last = f"(SELECT MAX(hour) FROM {TABLE}" + ("" if before is None else f" WHERE hour < {time_literal(before)}") + ")"

    def last_of(hour: str) -> str:
        return f"(SELECT MAX(COALESCE(last_ts, ts[array_upper(ts, 1)])) FROM {TABLE} WHERE hour = {hour})"

    if before is None:
        packed = last_of(last)
    else:
        packed = (f"GREATEST((SELECT MAX(u.t) FROM {TABLE} p CROSS JOIN LATERAL unnest(p.ts) AS u(t)"
                  f" WHERE p.hour = {last} AND u.t < {time_literal(before)}),"
                  f" {last_of(f'(SELECT MAX(hour) FROM {TABLE} WHERE hour < {last})')})")
    # A raw sample at or past the end of the newest packed hour is newer than any packed one, and on a live fleet
    # the hours under way are rows: the packed hours are then not unpacked at all (the CASE's other arm, a
    # subplan, runs only when reached). Unpacking the newest two hours of every GPU took 0.23 s over 2,048 GPUs,
    # and every dashboard page asks for the newest sample.
    return (f"(SELECT CASE WHEN r.t >= {last} + INTERVAL '1 hour' THEN r.t ELSE GREATEST(r.t, {packed}) END"
            f" FROM (SELECT (SELECT MAX(ts) FROM {RAW}{below}) AS t) r)"), []


def held_hours_sql(hours: Sequence[dt.datetime]) -> str:
    """A query of ``hour``: which of ``hours`` hold packed rows (PostgreSQL), one indexed probe an hour, each
    hour a literal so only its day's partition is asked."""
    if not hours:
        raise ValueError("held_hours_sql needs at least one hour")
    lits = [time_literal(hour_floor(h)) for h in dict.fromkeys(hours)]
    return " UNION ALL ".join(f"SELECT {lit} AS hour WHERE EXISTS (SELECT 1 FROM {TABLE} WHERE hour = {lit})" for lit in lits)


def min_ts_sql(dialect: str) -> str:
    """A scalar subquery: the oldest raw sample's ``ts``, or NULL."""
    if dialect != "postgresql":
        return f"(SELECT MIN(ts) FROM {RAW})"
    # each GPU-hour's first time is a column (migration 0028); the array only for rows packed before it
    return (f"LEAST((SELECT MIN(ts) FROM {RAW}),"
            f" (SELECT MIN(COALESCE(first_ts, ts[1])) FROM {TABLE} WHERE hour = (SELECT MIN(hour) FROM {TABLE})))")


def nearest_gpu_sql(dialect: str, at: dt.datetime, before: bool) -> tuple[str, list[dt.datetime]]:
    """A query of one row, and its parameters, ``gpu_uuid, ts``: the GPU sampled last at or before ``at`` (``before``), else first
    after it. Of packed days it looks at whole hours only (the newest hour ending by ``at``, the oldest
    starting after it), and takes any one GPU of that hour with two samples or more, which
    ``telemetry.sample_interval_s`` needs: a GPU reporting near ``at``. Ordering the hour's GPUs by their last sample detoasted every GPU's timestamps
    (58 ms over 4,096 GPUs, called at both ends of every fleet panel's range)."""
    op, order = ("<=", "DESC") if before else (">", "")
    if dialect != "postgresql":
        return f"SELECT gpu_uuid, ts FROM {RAW} WHERE ts {op} ? ORDER BY ts {order} LIMIT 1", [at]
    raw = f"SELECT gpu_uuid, ts FROM {gpu_keys.join_sql(RAW)} WHERE ts {op} {time_literal(at)} ORDER BY ts {order} LIMIT 1"
    # A GPU with one sample in the hour has no interval to give (a node that sent once and went quiet): one with
    # two or more is taken, as ``sample_interval_s`` measures the gap between a GPU's samples.
    if before:
        packed = (f"SELECT gpu_uuid, ts[array_upper(ts, 1)] AS ts FROM {TABLE} WHERE hour <= {time_literal(at - dt.timedelta(hours=1))}"
                  " AND samples >= 2 ORDER BY hour DESC LIMIT 1")
    else:
        packed = f"SELECT gpu_uuid, ts[1] AS ts FROM {TABLE} WHERE hour > {time_literal(at)} AND samples >= 2 ORDER BY hour LIMIT 1"
    return f"SELECT gpu_uuid, ts FROM (({raw}) UNION ALL ({packed})) x ORDER BY ts {order} LIMIT 1", []


def gpu_last_ts_sql(dialect: str, gpu_uuid: str, at: dt.datetime, n: int) -> tuple[str, list[object]]:
    """A query, and its parameters, of the ``ts`` of one GPU's last ``n`` samples at or before ``at``, newest
    first; of packed days, its two newest hours there (≥ ``n`` samples at any interval under 400 s)."""
    if dialect != "postgresql":
        return f"SELECT ts FROM {RAW} WHERE gpu_uuid = ? AND ts <= ? ORDER BY ts DESC LIMIT {int(n)}", [gpu_uuid, at]
    raw = f"SELECT ts FROM {gpu_keys.join_sql(RAW)} WHERE gpu_uuid = ? AND ts <= {time_literal(at)} ORDER BY ts DESC LIMIT {int(n)}"
    packed = (f"SELECT u.t AS ts FROM (SELECT ts FROM {TABLE} WHERE gpu_uuid = ? AND hour <= {time_literal(at)} ORDER BY hour DESC LIMIT 2) p"
              f" CROSS JOIN LATERAL unnest(p.ts) AS u(t) WHERE u.t <= {time_literal(at)}")
    return f"SELECT ts FROM (({raw}) UNION ALL ({packed})) x ORDER BY ts DESC LIMIT {int(n)}", [gpu_uuid, gpu_uuid]


def pack_sql(day: dt.date, merge: bool, hour: dt.datetime) -> list[str]:
    """The statements that pack ``hour`` (of ``day``) of the day's raw partition into ``TABLE``'s partition of
    the day, and delete the raw rows they packed. ``merge``: that hour already holds packed rows (samples arrived
    after an earlier pack), so they are unpacked, joined by the raw ones and packed again, a sample present in
    both taking the packed copy's values and only filling its NULLs from the raw one, as a re-sent sample does
    on write (``gpu_sample``'s ``fill``)."""
    raw, packed = f'"{RAW}_p{day:%Y%m%d}"', f'"{TABLE}_p{day:%Y%m%d}"'
    hour = hour_floor(hour)
    in_hour = [f"ts >= {time_literal(hour)}", f"ts < {time_literal(hour + dt.timedelta(hours=1))}"]
    this_hour = [f"p.hour = {time_literal(hour)}"]
    drop_raw = f"DELETE FROM {raw}{where_sql(in_hour)}"
    cols = ", ".join(f'"{c}"' for c in FIELDS)
    aggs = ", ".join(
        f'CASE WHEN count("{c}") = 0 THEN NULL ELSE array_agg("{c}"{"::real" if c in FLOAT4_FIELDS else ""}) END AS "{c}"'
        for c in FIELDS)
    insert = f"INSERT INTO {TABLE} (hour, gpu_uuid, samples, first_ts, last_ts, ts, {cols})"
    # One sort of the day's rows by (hour, GPU, time), then one pass: the aggregates take the rows in that order,
    # every array of a GPU-hour in the same one (an ORDER BY inside each of the 42 aggregates sorted each group 42
    # times), and the rows go in by hour, as the hour BRIN index wants.
    group = (f" SELECT hour, gpu_uuid, count(*) AS samples, min(ts) AS first_ts, max(ts) AS last_ts, array_agg(ts) AS ts, {aggs} FROM"
             f" (SELECT date_trunc('hour', ts, 'UTC') AS hour, ts, gpu_uuid, {cols} FROM src ORDER BY 1, 3, 2) sorted"
             " GROUP BY hour, gpu_uuid")
    if not merge:
        return [f"{insert} WITH src AS ({_raw_select(raw, FIELDS, in_hour)}){group}", drop_raw]
    tagged = f"{_raw_select(raw, FIELDS, in_hour, '1 AS src_order, ')} UNION ALL {_packed_select(packed, FIELDS, this_hour, [], '0 AS src_order, ')}"
    firsts = ", ".join(f'(array_agg("{c}" ORDER BY src_order) FILTER (WHERE "{c}" IS NOT NULL))[1] AS "{c}"' for c in FIELDS)
    # the day's rows are rebuilt aside first: a row deleted and inserted again by one statement would still
    # hold its key in the unique index
    return [f"CREATE TEMP TABLE _repack ON COMMIT DROP AS WITH tagged AS ({tagged}),"
            f" src AS (SELECT ts, gpu_uuid, {firsts} FROM tagged GROUP BY gpu_uuid, ts){group}",
            f"DELETE FROM {packed} WHERE hour = {time_literal(hour)}",
            f"{insert} SELECT hour, gpu_uuid, samples, first_ts, last_ts, ts, {cols} FROM _repack", drop_raw]

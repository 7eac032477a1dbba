"""Closed days of the per-GPU energy minutes packed into per-(GPU, hour) rows of arrays (PostgreSQL only).

``gpu_energy_minute`` is kept with the evidence (three years by default) and, as rows, costs 281 bytes a
GPU-minute (a 24-byte tuple header, the 41-byte text UUID, and two B-tree entries on every row): 0.40 MB a
GPU-day, the largest table of a fleet's disk once raw days are packed (README, "Capacity model"). Once a day
is closed, beat moves each of its hours into ``gpu_energy_minute_packed``: one row per GPU and UTC hour with
the minutes' offsets in the hour and each column as an array in minute order, which TOAST compresses (lz4
where the server has it; PostgreSQL 15 docs, ch. 73.2 "TOAST"). Every value is kept exactly (``double
precision`` and ``text`` as stored), so an energy figure read from a packed day is the figure read before.

Every read goes through ``source``, which applies the range itself: the rows of the range from the table and,
unnested, from the packed hours, a packed minute giving way to a row of the same minute and GPU in the table (a
re-roll after the pack), until the next pack folds that row in. SQLite never packs: there ``source`` is the
table's rows of the range.
"""

from __future__ import annotations

import datetime as dt

from fleetscope.core.units import as_utc
from fleetscope.store.packed import hour_floor, hour_split, range_sql, time_literal, where_sql

TABLE = "gpu_energy_minute_packed"
RAW = "gpu_energy_minute"
FIELDS: tuple[str, ...] = ("energy_j", "counter_energy_j", "integrated_energy_j", "covered_s", "method")
"""The columns packed as arrays, beside ``minute`` (as its offset in the hour) and ``gpu_uuid``."""


def _unpacked(where: list[str]) -> str:
    """The packed rows' minutes, unnested in lockstep in the select list (a ProjectSet: arrays of one row are
    walked side by side, several times faster than ``unnest`` in FROM)."""
    cols = ", ".join(f'unnest(p."{c}") AS "{c}"' for c in FIELDS)
    return (f"SELECT p.hour + unnest(p.minutes) * INTERVAL '1 minute' AS minute, p.gpu_uuid, {cols}"
            f" FROM {TABLE} p{where_sql(where)}")


def source(dialect: str, start: dt.datetime | None, end: dt.datetime | None, alias: str = RAW) -> str:
    """A FROM item, named ``alias``, of the energy minutes with ``start <= minute < end`` (either bound may be
    None), every column of ``gpu_energy_minute``. The bounds are applied here, exactly: a caller adds no filter
    on ``minute`` of its own (see the estimate below)."""
    start, end = (None if t is None else as_utc(t) for t in (start, end))  # a naive bound is UTC, as on every read
    cols = ", ".join(["minute", "gpu_uuid", *(f'"{c}"' for c in FIELDS)])
    raw_where = range_sql(dialect, "minute", start, end)
    if dialect != "postgresql":
        return f"(SELECT {cols} FROM {RAW}{where_sql(raw_where)}) {alias}"
    # A filter on unpacked minutes has no statistics (a site-hour read of a packed day of 1,024 GPUs joined the
    # inventory by nested loops: 30 s, against 2 s as rows), so hours are picked by ``hour`` (``packed.hour_split``).
    whole, edges = hour_split(start, end)
    # A packed minute re-rolled since its pack is in the table too, and the table's row wins. Only the table's
    # rows up to the newest packed hour's end can be such a row (days are packed oldest first), and there are
    # none until a late re-roll, which the next pack folds in. So the per-minute check runs only when the range
    # holds one: the range's oldest row (one probe of the key's index, computed once as an InitPlan) is not below
    # the newest packed hour's end, and the OR short-circuits. A re-rolled minute replaces its packed copy whole,
    # where a re-roll of a row keeps a stored value the new one lacks (the frame's ``update``): the pack folds it
    # in the same way, so a minute reads the same before and after that pack.
    newest = f"(SELECT MAX(hour) FROM {TABLE}) + INTERVAL '1 hour'"
    in_range = [c.replace("minute", "r.minute", 1) for c in raw_where]
    inner = " AND ".join([f"r.minute < {newest}", *in_range])
    shadowed = (f"(COALESCE((SELECT MIN(r.minute) FROM {RAW} r{where_sql(in_range)}) >= {newest}, TRUE)"
                f" OR NOT EXISTS (SELECT 1 FROM {RAW} r WHERE r.minute = u.minute AND r.gpu_uuid = u.gpu_uuid AND {inner}))")
    arms = [f"SELECT {cols} FROM {RAW}{where_sql(raw_where)}",
            *([f"SELECT u.* FROM ({_unpacked(whole)}) u WHERE {shadowed}"] if whole is not None else [])]
    if edges:
        cut = [f"u.{c}" for c in raw_where]
        arms.append(f"SELECT u.* FROM ({_unpacked(['p.hour IN (' + ', '.join(time_literal(h) for h in edges) + ')'])}) u"
                    f" WHERE {' AND '.join([*cut, shadowed])}")
    return f"({' UNION ALL '.join(arms)}) {alias}"


def oldest_minute_sql(dialect: str) -> str:
    """A scalar subquery: a time no later than the oldest energy minute held, packed or not (the oldest packed
    hour's start stands for its minutes), or NULL."""
    if dialect != "postgresql":
        return f"(SELECT MIN(minute) FROM {RAW})"
    return f"LEAST((SELECT MIN(minute) FROM {RAW}), (SELECT MIN(hour) FROM {TABLE}))"


def newest_minute_sql(dialect: str) -> str:
    """A scalar subquery: the newest energy minute held, packed or not, or NULL."""
    if dialect != "postgresql":
        return f"(SELECT MAX(minute) FROM {RAW})"
    last = f"(SELECT MAX(hour) FROM {TABLE})"
    packed = (f"(SELECT MAX(p.hour + p.minutes[array_upper(p.minutes, 1)] * INTERVAL '1 minute') FROM {TABLE} p"
              f" WHERE p.hour = {last})")
    return f"GREATEST((SELECT MAX(minute) FROM {RAW}), {packed})"


def pack_sql(hour: dt.datetime, merge: bool) -> list[str]:
    """The statements that pack the table's rows of ``hour`` into ``TABLE`` and delete them. ``merge``: the hour
    holds packed rows already (a re-roll after an earlier pack), so they are unpacked, joined by the table's
    rows, the table's row winning a minute both hold, and packed again."""
    hour = hour_floor(hour)
    lo, hi = time_literal(hour), time_literal(hour + dt.timedelta(hours=1))
    in_hour = [f"minute >= {lo}", f"minute < {hi}"]
    cols = ", ".join(f'"{c}"' for c in FIELDS)
    aggs = ", ".join(f'array_agg("{c}") AS "{c}"' for c in FIELDS)
    insert = f"INSERT INTO {TABLE} (hour, gpu_uuid, minutes, {cols})"
    # one sort by (GPU, minute), then one pass: every aggregate of a GPU takes its rows in that order
    group = (f"SELECT {lo} AS hour, gpu_uuid, array_agg(m) AS minutes, {aggs} FROM"
             f" (SELECT gpu_uuid, (EXTRACT(EPOCH FROM minute - {lo}) / 60)::smallint AS m, {cols} FROM src ORDER BY 1, 2) sorted"
             " GROUP BY gpu_uuid")
    drop_raw = f"DELETE FROM {RAW}{where_sql(in_hour)}"
    if not merge:
        return [f"{insert} WITH src AS (SELECT minute, gpu_uuid, {cols} FROM {RAW}{where_sql(in_hour)}) {group}", drop_raw]
    tagged = (f"SELECT 0 AS older, minute, gpu_uuid, {cols} FROM {RAW}{where_sql(in_hour)}"
              f" UNION ALL SELECT 1 AS older, u.* FROM ({_unpacked([f'p.hour = {lo}'])}) u")
    return [f"CREATE TEMP TABLE _repack_energy ON COMMIT DROP AS WITH tagged AS ({tagged}),"
            f" src AS (SELECT DISTINCT ON (gpu_uuid, minute) minute, gpu_uuid, {cols} FROM tagged ORDER BY gpu_uuid, minute, older) {group}",
            f"DELETE FROM {TABLE} WHERE hour = {lo}",
            f"{insert} SELECT hour, gpu_uuid, minutes, {cols} FROM _repack_energy", drop_raw]

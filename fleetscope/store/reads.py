"""SQL pieces the read services share, written once for SQLite and PostgreSQL: a typed fetch that keeps
its declared columns even when empty, time buckets and durations in each dialect's form, and site filters."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

import polars as pl

from fleetscope.core import frames as F
from fleetscope.store import Store, packed, packed_energy


def fetch(store: Store, sql: str, params: Sequence[Any], schema: dict[str, pl.DataType], small: bool = False) -> pl.DataFrame:
    """Run ``sql`` and return exactly the columns of ``schema`` with those dtypes, even when empty; ``small`` as
    ``Store.query`` takes it (a result of a few rows: a pooled connection on PostgreSQL)."""
    df = store.query(sql, list(params), schema, small)
    cols = []
    for name, dtype in schema.items():
        if name not in df.columns:
            cols.append(pl.lit(None, dtype).alias(name))
        elif df.schema[name] != dtype:
            cols.append(pl.col(name).cast(dtype, strict=False))
        else:
            cols.append(pl.col(name))
    return df.select(cols) if df.width else pl.DataFrame(schema=schema)


def gpu_samples_sql(store: Store, start: dt.datetime | None, end: dt.datetime | None, columns: Sequence[str] = (),
                    alias: str = "gpu_sample") -> str:
    """The FROM item every SQL read of raw GPU samples uses in place of ``gpu_sample``: the rows with
    ``start <= ts < end`` (each bound optional) and ``ts``, ``gpu_uuid`` and ``columns``, packed days included
    (``store.packed.source``). The range is applied there: the query adds no ``ts`` filter of its own, which
    would leave PostgreSQL's planner estimating the unpacked samples at a two-hundredth of their number."""
    return packed.source(store.dialect, start, end, columns, alias, store.packed_until())


def packed_hours_reached(store: Store, spans: Sequence[tuple[dt.datetime, dt.datetime]]) -> list[bool]:
    """Whether each ``[start, end)`` reaches into an hour of raw samples held packed (``store.packed``; never on
    SQLite), one indexed probe per distinct hour. A packed hour is one array row per GPU, so a fleet-wide read of
    a few seconds in it unpacks the whole hour for every GPU: such probes read a roll-up tier instead."""
    reach = [{packed.hour_floor(a), packed.hour_floor(b - dt.timedelta(microseconds=1))} for a, b in spans]
    if store.dialect != "postgresql" or not reach:
        return [False] * len(reach)
    held = set(fetch(store, packed.held_hours_sql(sorted(set().union(*reach))), [], {"hour": F.UTC_US}, small=True)["hour"].to_list())
    return [bool(r & held) for r in reach]


def energy_minutes_sql(store: Store, start: dt.datetime | None, end: dt.datetime | None, alias: str = "gpu_energy_minute") -> str:
    """The FROM item every SQL read of the per-GPU energy minutes uses in place of ``gpu_energy_minute``: the
    minutes with ``start <= minute < end`` (each bound optional), packed days included
    (``store.packed_energy.source``). The range is applied there: the query adds no ``minute`` filter of its own,
    which would leave the planner estimating the unpacked minutes at a two-hundredth of their number."""
    return packed_energy.source(store.dialect, start, end, alias)


def bucket_us_sql(store: Store, column: str, bucket_s: int) -> str:
    """SQL for the start of ``column``'s time bucket, as integer µs since the epoch on both databases
    (SQLite stores µs integers; PostgreSQL's timestamptz is converted), so one result schema fits both."""
    bucket_s = max(1, int(bucket_s))
    if store.dialect == "sqlite":
        b = bucket_s * 1_000_000
        return f"(({column} / {b}) * {b})"
    # date_part gives float8 (EXTRACT gives numeric since PostgreSQL 14, several times slower per row); epoch
    # seconds to the µs fit its 53 bits, so whole-second bucket edges floor exactly
    return f"(FLOOR(date_part('epoch', {column}) / {bucket_s}) * {bucket_s} * 1000000)::bigint"


def duration_s_sql(store: Store, start: str, end: str) -> str:
    """SQL for ``end - start`` in seconds."""
    if store.dialect == "sqlite":
        return f"(({end} - {start}) / 1e6)"
    return f"EXTRACT(EPOCH FROM ({end} - {start}))::float8"


def json_number_sql(store: Store, column: str, key: str) -> str:
    """SQL for the number at top-level ``key`` of the JSON text in ``column`` (``key`` is a constant of
    this module, never user input)."""
    if not key.isidentifier():
        raise ValueError(f"JSON key {key!r} must be an identifier")
    if store.dialect == "sqlite":
        return f"json_extract({column}, '$.{key}')"
    return f"(({column})::jsonb ->> '{key}')::float8"


def site_gpus_sql(site: str | None, params: list[Any], column: str = "gpu_uuid") -> str:
    """A filter on a GPU column to the GPUs of one site (inventory: gpu → host → site)."""
    if site is None:
        return ""
    params.append(site)
    return f" AND {column} IN (SELECT g.gpu_uuid FROM gpu g JOIN host h ON h.host = g.host WHERE h.site_id = ?)"


def site_is_sql(site: str | None, params: list[Any], column: str = "site_id") -> str:
    """A filter on a table's own site column."""
    if site is None:
        return ""
    params.append(site)
    return f" AND {column} = ?"


def site_hosts_sql(site: str | None, params: list[Any], column: str = "host") -> str:
    if site is None:
        return ""
    params.append(site)
    return f" AND {column} IN (SELECT host FROM host WHERE site_id = ?)"

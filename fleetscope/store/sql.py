"""SQL text the store writes and reads with, for SQLite and PostgreSQL: quoted names, the ON CONFLICT
clause of each spec's ``on_conflict``, the columns worth binding, values in the databases' storage
form and back in canonical dtypes, and literals for the one reader that takes no bound parameters (connectorx)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Sequence
from typing import Any

import polars as pl

from fleetscope.core import frames as F
from fleetscope.core.units import as_utc
from fleetscope.store import schema


def quote(name: str) -> str:
    """``name`` as a quoted SQL identifier."""
    return '"' + name.replace('"', '""') + '"'


def epoch_us(value: dt.datetime) -> int:
    """``value`` as integer microseconds since the epoch, SQLite's storage form of a timestamp."""
    delta = as_utc(value) - schema.EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def conflict_sql(dialect: str, table: str, cols: Sequence[str], key: Sequence[str], on_conflict: str) -> str:
    """The ON CONFLICT clause of an insert of ``cols`` into ``table`` (``on_conflict`` of its spec)."""
    _q = quote
    if on_conflict == "update" and len(cols) > len(key):
        # COALESCE: a source that knows less (nvidia-smi without the rack, say) must not erase what
        # another source told us; a value is replaced only by a value.
        sets = ", ".join(f"{_q(c)} = COALESCE(excluded.{_q(c)}, {_q(table)}.{_q(c)})" for c in cols if c not in key)
        # Only rows that would change are rewritten: a scrape re-sends the whole inventory (16,384 gpu
        # rows a second), and rewriting identical rows cost PostgreSQL a new row version each (0.12 s a
        # scrape, against 0.05 s to compare). The stored result is the same; `written` then counts the
        # rows new or changed, as WriteResult says.
        distinct = "IS NOT" if dialect == "sqlite" else "IS DISTINCT FROM"
        changed = " OR ".join(
            f"(excluded.{_q(c)} IS NOT NULL AND excluded.{_q(c)} {distinct} {_q(table)}.{_q(c)})" for c in cols if c not in key
        )
        return f"ON CONFLICT ({', '.join(_q(k) for k in key)}) DO UPDATE SET {sets} WHERE {changed}"
    if on_conflict == "fill" and len(cols) > len(key):
        # The stored copy's values stay; only fields it lacks are taken from this one, and only rows that
        # gain a field are rewritten.
        sets = ", ".join(f"{_q(c)} = COALESCE({_q(table)}.{_q(c)}, excluded.{_q(c)})" for c in cols if c not in key)
        gains = " OR ".join(f"({_q(table)}.{_q(c)} IS NULL AND excluded.{_q(c)} IS NOT NULL)" for c in cols if c not in key)
        return f"ON CONFLICT ({', '.join(_q(k) for k in key)}) DO UPDATE SET {sets} WHERE {gains}"
    return f"ON CONFLICT ({', '.join(_q(k) for k in key)}) DO NOTHING"


def bound_columns(table: str, df: pl.DataFrame, key: Sequence[str]) -> list[str]:
    """The columns worth sending: a column null in every row of the batch (a dcgm field the exporter does
    not export) is left out, which stores the same NULL and, on conflict, leaves the stored value alone as
    COALESCE would. Binding dozens of NULLs per row costs sqlite3's executemany more than the values
    themselves (a 10-field frame of the 43-column gpu_sample writes about 3x faster), and each is a field
    PostgreSQL's COPY parses. Columns with a server default keep their NULL (leaving them out would store
    the default instead)."""
    t = schema.metadata.tables.get(table)
    defaulted = {c.name for c in t.columns if c.server_default is not None} if t is not None else set(df.columns)
    nulls = df.null_count().row(0, named=True)
    return [c for c in df.columns if c in key or c in defaulted or nulls[c] < df.height]




def db_ready(df: pl.DataFrame) -> pl.DataFrame:
    """Timestamps as epoch µs and booleans as 0/1: the shape both databases take without conversion."""
    exprs = []
    for name, dtype in df.schema.items():
        if isinstance(dtype, pl.Datetime):
            exprs.append(pl.col(name).dt.epoch("us"))
        elif dtype == pl.Boolean:
            exprs.append(pl.col(name).cast(pl.Int64))
    return df.with_columns(exprs) if exprs else df


def sqlite_values(df: pl.DataFrame) -> Iterable[tuple[Any, ...]]:
    return db_ready(df).iter_rows()


def storage_dtypes(out_schema: dict[str, pl.DataType]) -> dict[str, pl.DataType | None]:
    """How SQLite stores each canonical dtype: timestamps as epoch microseconds, booleans as 0/1."""
    return {name: pl.Int64 if dtype in (F.UTC_US, pl.Boolean) else dtype for name, dtype in out_schema.items()}


def conform(df: pl.DataFrame, out_schema: dict[str, pl.DataType]) -> pl.DataFrame:
    """Canonical dtypes for what a driver returned: UTC datetimes from epoch integers or naive/zoned
    timestamps, and casts where the storage type differs."""
    casts = []
    for name, dtype in out_schema.items():
        if name not in df.columns:
            continue
        have = df.schema[name]
        if dtype == F.UTC_US:
            if isinstance(have, pl.Datetime):
                casts.append(pl.col(name).dt.convert_time_zone("UTC").dt.cast_time_unit("us") if have.time_zone else pl.col(name).dt.replace_time_zone("UTC"))
            else:
                casts.append(pl.col(name).cast(pl.Int64).cast(pl.Datetime("us")).dt.replace_time_zone("UTC"))
        elif have != dtype:
            casts.append(pl.col(name).cast(dtype))
    return df.with_columns(casts) if casts else df


def literal(value: Any) -> str:
    """A PostgreSQL literal for a read filter (only connectorx, which takes no bound parameters, needs
    one). Strings double their quotes (standard_conforming_strings); NUL cannot be stored, so it is refused."""
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int):
        return str(int(value))
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            raise ValueError(f"non-finite filter value {value!r}")
        return repr(value)
    if isinstance(value, dt.datetime):
        return f"TIMESTAMPTZ '{as_utc(value).isoformat()}'"
    text_value = str(value)
    if "\x00" in text_value:
        raise ValueError("filter value contains a NUL character")
    return "'" + text_value.replace("'", "''") + "'"


def bind(sql: str, params: Sequence[Any]) -> str:
    """``sql`` with each ``?`` replaced by the ``literal`` of its parameter."""
    parts = sql.split("?")
    if len(parts) - 1 != len(params):
        raise ValueError(f"statement has {len(parts) - 1} placeholders, {len(params)} values given")
    out = [parts[0]]
    for value, rest in zip(params, parts[1:]):
        out.append(literal(value))
        out.append(rest)
    return "".join(out)

"""The store's PostgreSQL read path for small results (a job's ranks, an inventory lookup, a state row): one
query on a pooled psycopg connection, the rows built into a polars frame in Python.

connectorx, the bulk path, opens a connection of its own for every read (a backend started, authenticated,
its catalog caches warmed) and asks for the result's types before it COPYs: about 10 ms before the first row
on an idle 2-core machine, 50 ms under load, for a site row as for a thousand. A warm pooled connection
answers a one-row query in tens of microseconds and a thousand rows in about a millisecond; past a few
thousand rows the Python objects cost more than connectorx's setup, so callers choose this path only for
reads they know are small."""

from __future__ import annotations

from typing import Any

import polars as pl
from sqlalchemy import Engine

from fleetscope.core import frames as F


def fetch_pooled(engine: Engine, sql: str, out_schema: dict[str, pl.DataType]) -> pl.DataFrame:
    """The rows of ``sql`` (its values already inlined, ``store.sql.bind``) read on one of ``engine``'s pooled
    connections, typed by ``out_schema`` where it names a column (timestamps come as zoned datetimes, which
    polars converts to UTC exactly)."""
    with engine.connect() as conn:
        with conn.connection.driver_connection.cursor() as cur:
            # no parameters: psycopg sends the text as it is (a literal "%" stays one)
            cur.execute(sql)
            names = [d.name for d in cur.description or ()]
            rows = cur.fetchall()
    columns: list[Any] = list(zip(*rows)) if rows else [() for _ in names]
    return pl.DataFrame([pl.Series(name, list(values), dtype=_dtype(out_schema.get(name)))
                         for name, values in zip(names, columns)])


def _dtype(dtype: pl.DataType | None) -> pl.DataType | None:
    return pl.Datetime("us", "UTC") if dtype == F.UTC_US else dtype

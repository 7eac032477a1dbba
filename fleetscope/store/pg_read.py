"""The store's PostgreSQL read path for results of up to some tens of thousands of rows (a job's ranks, an
inventory lookup, what a job reported since its watermark): ``COPY (query) TO STDOUT`` as CSV on a pooled
psycopg connection, parsed by polars.

connectorx, the bulk path, opens a connection of its own for every read (a backend started, authenticated,
its catalog caches warmed) and asks for the result's types before it COPYs: about 10 ms before the first
row on an idle 2-core machine, 20-50 ms under load, for a site row as for a thousand. A warm pooled
connection sends a one-row result in tens of microseconds, and a 12,000-row tail sooner than connectorx
(66-89 ms against 114-150 ms for 12,288 step rows, measured on this machine at load 11-12);
for the millions of rows of a fleet-wide read connectorx's binary protocol is the faster one (README,
``benchmarks/store_write.py``), so callers choose this path only for reads they know are not that large.

The CSV is exact: PostgreSQL writes a double in its shortest form that reads back to the same value
(``extra_float_digits`` ≥ 1, PostgreSQL 12 and later), polars parses it correctly rounded, NULL is an
unquoted empty field and an empty string a quoted one, and timestamps are written in ISO form in UTC
(``DateStyle``, ``TimeZone`` and ``extra_float_digits`` set for the transaction, whatever the server's or the
role's defaults)."""

from __future__ import annotations

import io

import polars as pl
from sqlalchemy import Engine

from fleetscope.core import frames as F

SMALL_ROWS = 20_000
"""The most rows a small read takes this way (``Store.read``'s ``small``): measured at load 12, a 12,288-row
read took 89 ms here against 114 ms through connectorx, and a 61,440-row one 0.50 s against 0.42 s."""

# JIT off as on the bulk path (``store._no_jit_url``): a statement of many cheap probes is costed as one and
# crossed the JIT threshold, compiling for longer than it ran
_SESSION = "SET LOCAL DateStyle = 'ISO, YMD'; SET LOCAL TimeZone = 'UTC'; SET LOCAL extra_float_digits = 1; SET LOCAL jit = off"
_ISO = "%Y-%m-%d %H:%M:%S%.f%#z"


def fetch_pooled(engine: Engine, sql: str, out_schema: dict[str, pl.DataType]) -> pl.DataFrame:
    """The rows of ``sql`` (a SELECT with its values inlined, ``store.sql.bind``) read on one of ``engine``'s
    pooled connections, typed by ``out_schema`` where it names a column."""
    buf = io.BytesIO()
    with engine.connect() as conn:
        raw = conn.connection.driver_connection
        with raw.cursor() as cur:
            cur.execute(_SESSION)
            with cur.copy(f"COPY ({sql}) TO STDOUT (FORMAT CSV, HEADER)") as cp:
                for block in cp:
                    buf.write(block)
        raw.rollback()  # nothing was written; the SET LOCALs end with the transaction
    data = buf.getvalue()
    names = pl.read_csv(io.BytesIO(data), n_rows=0).columns
    df = pl.read_csv(io.BytesIO(data), schema={c: _csv_dtype(out_schema.get(c)) for c in names})
    return df.with_columns(_typed(c, out_schema[c]) for c in names if out_schema.get(c) in (F.UTC_US, pl.Boolean))


def _csv_dtype(dtype: pl.DataType | None) -> pl.DataType:
    return pl.String if dtype is None or dtype in (F.UTC_US, pl.Boolean) else dtype


def _typed(name: str, dtype: pl.DataType) -> pl.Expr:
    col = pl.col(name)
    if dtype == pl.Boolean:
        return col.replace_strict({"t": True, "f": False}, return_dtype=pl.Boolean)
    return col.str.to_datetime(_ISO, time_unit="us").dt.convert_time_zone("UTC")

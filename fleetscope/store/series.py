"""The ``series`` table's ids for ``metric_sample`` label sets: looked up, or created in the writing transaction."""

from __future__ import annotations

import polars as pl
from sqlalchemy.engine import Connection

from fleetscope.store import pg_write


def series_ids(conn: Connection, dialect: str, keys: list[str]) -> pl.DataFrame:
    """``series_id, series`` of ``keys`` (label-set keys), creating in ``conn``'s transaction those not stored yet."""
    # In one order for every writer: two transactions creating the same new series in different orders
    # each wait for a key the other holds, and PostgreSQL aborts one as a deadlock.
    keys = sorted(keys)
    names = [k.split("{", 1)[0] for k in keys]
    if dialect == "sqlite":
        cur = conn.connection.driver_connection.cursor()
        try:
            cur.executemany("INSERT INTO series (series, name) VALUES (?, ?) ON CONFLICT (series) DO NOTHING", zip(keys, names))
            found: list[tuple[int, str]] = []
            for i in range(0, len(keys), 5000):
                chunk = keys[i : i + 5000]
                cur.execute(f"SELECT series_id, series FROM series WHERE series IN ({', '.join('?' for _ in chunk)})", chunk)
                found.extend(cur.fetchall())
        finally:
            cur.close()
    else:
        from fleetscope.store import pg_arrays  # lazy: psycopg, only against PostgreSQL

        with pg_write.pg(conn).cursor() as cur:
            # RETURNING hands back the ids of the rows it created; only keys that already existed (stored
            # by another process, or before this one started) are looked up. A fleet's first scrape
            # creates all of its series, and the lookup of 32,768 keys was 0.2 s of it.
            # The key arrays go in binary (%b): psycopg escapes a text-format array element by element
            # in Python, 0.43 s of CPU for 32,768 label sets against 0.02 s.
            cur.execute(
                "INSERT INTO series (series, name) SELECT * FROM unnest(%b::text[], %b::text[]) ON CONFLICT (series) DO NOTHING"
                " RETURNING series_id, series",
                (pg_arrays.encode(keys), pg_arrays.encode(names)),
            )
            found = cur.fetchall()
            if len(found) < len(keys):
                created = {k for _, k in found}
                existing = [k for k in keys if k not in created]
                cur.execute("SELECT series_id, series FROM series WHERE series = ANY(%b::text[])", (pg_arrays.encode(existing),))
                found.extend(cur.fetchall())
    return pl.DataFrame(found, schema={"series_id": pl.Int64, "series": pl.String}, orient="row")

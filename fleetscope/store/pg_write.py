"""The store's PostgreSQL write path: rows sent as binary arrays and unnested, frames COPYed (straight into
their table, or through a session temp table and ``INSERT ... SELECT ... ON CONFLICT``), the ingest log's
duplicate check under per-input advisory locks, and ``Store.write_rows``' statements pipelined into one
round trip. psycopg is imported only when a PostgreSQL store writes."""

from __future__ import annotations

import functools
import hashlib
import zlib
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import polars as pl
from sqlalchemy import Connection, String
from sqlalchemy.dialects import postgresql

from fleetscope.core import frames as F
from fleetscope.store import gpu_keys, schema
from fleetscope.store.sql import conflict_sql, quote as _q
from fleetscope.store.inventory import VERSION_SQL, Confirm, InventoryMoved
from fleetscope.store.sqltypes import UTCDateTime
from fleetscope.store.writing import AlreadyLogged, Rows, WriteResult

if TYPE_CHECKING:
    from fleetscope.store import Store

# Below this many rows the direct COPY's savepoint is not worth having (``insert_frame``).
DIRECT_COPY_ROWS = 1000


def on_connect(dbapi_conn: Any, _record: Any) -> None:
    """The store engine's ``connect`` event: each new psycopg connection learns ``pg_arrays``' columns once."""
    from fleetscope.store import pg_arrays  # lazy: psycopg, only against PostgreSQL

    pg_arrays.register(dbapi_conn)


def pg(conn: Connection) -> Any:
    """``conn``'s psycopg connection, able to send ``pg_arrays``' columns (cursors copy their connection's
    adapters when made, so this comes before any cursor of a write)."""
    raw = conn.connection.driver_connection
    if not getattr(raw, "_fleetscope_arrays", False):  # pooled before the store listened (``on_connect``)
        on_connect(raw, None)
    return raw


@functools.lru_cache(maxsize=512)
def unnest_sql(table: str, columns: tuple[str, ...], key: tuple[str, ...], conflict: str) -> str:
    """Insert rows given as one array per column. Timestamps travel as epoch microseconds (``Rows``' form)
    and are turned into ``timestamptz`` exactly, by integer interval arithmetic. The arrays go in binary
    (``%b``), encoded by ``store.pg_arrays`` and cast here to each column's type. A column holds one Python
    type (``Rows``' promise: psycopg refuses a list of mixed types)."""
    mark = "%b"

    cols = schema.metadata.tables[table].columns
    arrays, exprs = [], []
    for c in columns:
        if table == gpu_keys.RAW and c == "gpu_uuid":
            # PostgreSQL keys raw samples by integer GPU id: the UUID's id probed (store.gpu_keys)
            arrays.append(f"{mark}::text[]")
            exprs.append(f"{gpu_keys.PROBE} AS gpu_id")
            continue
        sa_type = cols[c].type
        if isinstance(sa_type, UTCDateTime):
            arrays.append(f"{mark}::bigint[]")
            exprs.append(f"'epoch'::timestamptz + u.{_q(c)} * interval '1 microsecond' AS {_q(c)}")
        else:
            # an array's cast names the element type alone: a column's collation is the column's, not the value's
            element = "text" if isinstance(sa_type, String) else sa_type.compile(dialect=postgresql.dialect())
            arrays.append(f"{mark}::{element}[]")
            exprs.append(f"u.{_q(c)} AS {_q(c)}")
    names = ", ".join(_q(c) for c in columns)
    stored, key = gpu_keys.physical(table, columns, key)
    order = ", ".join(_q(k) for k in key)
    return (f"INSERT INTO {_q(table)} ({', '.join(_q(c) for c in stored)}) SELECT {', '.join(exprs)} FROM unnest({', '.join(arrays)})"
            f" AS u({names}) ORDER BY {order} {conflict}")


def execute_unnest(cur: Any, table: str, rows: Rows, key: Sequence[str], conflict: str) -> None:
    """Send ``rows`` as one ``INSERT ... SELECT FROM unnest`` of binary arrays on ``cur`` (of a connection
    ``pg`` prepared)."""
    from fleetscope.store import pg_arrays  # lazy: psycopg, only against PostgreSQL

    params = [pg_arrays.encode(list(col)) for col in zip(*rows.rows)] if rows.rows else [[] for _ in rows.columns]
    cur.execute(unnest_sql(table, tuple(rows.columns), tuple(key), conflict), params)


_NEW_SERIES_SQL = "INSERT INTO series (series, name) SELECT * FROM unnest(%b::text[], %b::text[]) ON CONFLICT (series) DO NOTHING"
_SERIES_IDS_SQL = "SELECT series_id, series FROM series WHERE series = ANY(%b::text[])"
# Each id by a probe of the series index (a scalar subquery), not a join: the planner, guessing an unnest's
# rows, may hash the whole series table for a push's few keys.
_BY_KEY_SQL = ("INSERT INTO metric_sample (series_id, ts, value) SELECT (SELECT s.series_id FROM series s WHERE s.series = u.series),"
               " 'epoch'::timestamptz + u.ts * interval '1 microsecond', u.value FROM unnest(%b::text[], %b::bigint[], %b::float8[])"
               " AS u(series, ts, value) ORDER BY 1, 2 " + conflict_sql("postgresql", "metric_sample", ["series_id", "ts", "value"], ["series_id", "ts"], "ignore"))


def send_series(ids: Any, rows: Rows) -> None:
    """On a pipelined connection, the series of ``metric_sample`` rows given by series key (``series, ts, value``)
    created where missing (in key order, as every writer creates them, so two never wait on each other
    crosswise), and every key's id asked for on ``ids``. No round trip of its own: a node's first push no longer
    waits for its series' ids before sending its samples (``send_by_series_key``)."""
    from fleetscope.store import pg_arrays  # lazy: psycopg, only against PostgreSQL

    i_series = rows.columns.index("series")
    keys = sorted({row[i_series] for row in rows.rows})
    with ids.connection.cursor() as made:
        made.execute(_NEW_SERIES_SQL, (pg_arrays.encode(keys), pg_arrays.encode([k.split("{", 1)[0] for k in keys])))
    ids.execute(_SERIES_IDS_SQL, (pg_arrays.encode(keys),))


def send_by_series_key(cur: Any, rows: Rows) -> None:
    """The ``metric_sample`` rows given by series key, inserted on ``cur`` with each id probed from ``series`` (the
    rows ``send_series`` just made are visible to a later statement of the transaction), in ``(series_id, ts)``
    order."""
    from fleetscope.store import pg_arrays  # lazy: psycopg, only against PostgreSQL

    at = {c: i for i, c in enumerate(rows.columns)}
    i_series, i_ts, i_value = at["series"], at["ts"], at["value"]
    cur.execute(_BY_KEY_SQL, (pg_arrays.encode([row[i_series] for row in rows.rows]), pg_arrays.encode([row[i_ts] for row in rows.rows]),
                              pg_arrays.encode([row[i_value] for row in rows.rows])))


def insert_rows(conn: Connection, table: str, rows: Rows, key: Sequence[str], conflict: str) -> int:
    """``rows`` into ``table``: rows new or changed."""
    # A small group (an agent's push or a few): one statement, the columns sent as arrays and
    # unnested, instead of a temp table's create, empty, COPY and INSERT ... SELECT: five round
    # trips a frame become one, and a push's write is mostly round trips.
    with pg(conn).cursor() as cur:
        execute_unnest(cur, table, rows, key, conflict)
        return max(cur.rowcount, 0)


def insert_frame(conn: Connection, table: str, df: pl.DataFrame, key: Sequence[str], on_conflict: str, conflict: str) -> int:
    """``df`` into ``table`` by COPY, ``conflict`` (``sql.conflict_sql``) deciding on stored keys: rows new or
    changed."""
    col_sql = ", ".join(_q(c) for c in df.columns)
    # One temp table per column list: a session's tables keep the columns they were made with, and
    # writes of one table may carry different columns (all-null ones left out of a group's rows).
    tmp = _q(f"_in_{table}_{zlib.crc32(col_sql.encode()):08x}")
    raw = conn.connection.driver_connection
    if on_conflict != "update" and df.height >= DIRECT_COPY_ROWS:
        # New telemetry (the usual case) is COPYed straight into its table: the detour through the temp
        # table and INSERT ... SELECT cost a third more (0.30 s against 0.22 s for a scrape's 32,768
        # metric samples). A row already stored makes the COPY fail; the savepoint undoes it alone and
        # the rows go the conflict-skipping way below, so a re-sent batch still writes nothing new.
        import psycopg  # lazy: psycopg, only against PostgreSQL

        # SQLAlchemy's savepoint, not psycopg's raw.transaction(): with no statement sent yet the driver
        # has no transaction open, and psycopg would then run the COPY in a BEGIN ... COMMIT of its
        # own, committing these rows even if the rest of the batch fails.
        savepoint = conn.begin_nested()
        try:
            with raw.cursor() as cur:
                # Key order for the same reason as the ORDER BY below: concurrent writers of the same keys.
                copy_csv(cur, f"COPY {_q(table)} ({col_sql}) FROM STDIN (FORMAT CSV)", df.sort(list(key)))
            savepoint.commit()
            return df.height
        except psycopg.errors.UniqueViolation:
            savepoint.rollback()
    with raw.cursor() as cur:
        # A session temp table with the target's column types and none of its constraints; ON COMMIT
        # DELETE ROWS keeps it empty between batches so pooled connections can reuse it.
        cur.execute(
            f"CREATE TEMP TABLE IF NOT EXISTS {tmp} ON COMMIT DELETE ROWS AS SELECT {col_sql} FROM {_q(table)} WITH NO DATA"
        )
        # Empty already unless this transaction used it before. DELETE, not TRUNCATE: TRUNCATE gives the
        # table a new file each time (catalog writes, a file created and unlinked per batch), the larger
        # part of PostgreSQL's CPU for an agent's 8-GPU push.
        cur.execute(f"DELETE FROM {tmp}")
        copy_csv(cur, f"COPY {tmp} ({col_sql}) FROM STDIN (FORMAT CSV)", df)
        # In key order, as every writer takes them: two transactions upserting the same keys in different
        # orders (two sources, or overlapping re-sends) each wait for a row the other holds, and one is
        # aborted as a deadlock.
        order = ", ".join(_q(k) for k in key)
        cur.execute(f"INSERT INTO {_q(table)} ({col_sql}) SELECT {col_sql} FROM {tmp} ORDER BY {order} {conflict}")
        return max(cur.rowcount, 0)


def copy_csv(cur: Any, statement: str, df: pl.DataFrame) -> None:
    """Stream ``df`` into a ``COPY ... FROM STDIN (FORMAT CSV)``.

    Strings are always quoted so that an empty string stays distinct from NULL (an unquoted empty
    field); timestamps are written with an explicit UTC offset.
    """
    with cur.copy(statement) as cp:
        step = max(1, min(df.height, 200_000))
        for off in range(0, df.height, step):
            part = df.slice(off, step)
            data = part.write_csv(
                include_header=False,
                quote_style="non_numeric",
                datetime_format="%Y-%m-%dT%H:%M:%S%.6f+00:00",
            )
            cp.write(data.encode() if isinstance(data, str) else data)


def sha_lock_keys(shas: Iterable[str]) -> list[int]:
    """The transaction advisory lock keys of content hashes: a writer holds its inputs' keys from its
    duplicate check to its commit, so a second writer of the same input (another API process) checks only
    once the first has committed, and finds it."""
    return sorted({int.from_bytes(hashlib.blake2b(s.encode(), digest_size=8).digest(), "big", signed=True) for s in shas})


def logged_cursor(raw: Any, shas: Sequence[str]) -> Any:
    """Send the advisory locks of ``shas`` and the query for those the ingest log holds (two statements, so
    that the query's snapshot is taken once the locks are held); the cursor of the query, or None without
    hashes."""
    if not shas:
        return None
    from fleetscope.store import pg_arrays  # lazy: psycopg, only against PostgreSQL

    keys = sha_lock_keys(shas)
    with raw.cursor() as cur:
        cur.execute("SELECT pg_advisory_xact_lock(k) FROM (SELECT k FROM unnest(%b::bigint[]) AS u(k) ORDER BY k) AS s",
                    (pg_arrays.encode(keys),))
    check = raw.cursor()
    check.execute(LOGGED_SQL.format("%b"), (pg_arrays.encode(sorted(set(shas))),))
    return check


# Which of the hashes in the parameter the ingest log holds: one index probe a hash, whatever the table's
# statistics. The plain ``content_sha256 = ANY(...)`` is prepared (psycopg, after five runs) while a new
# store's log is small and unanalysed; PostgreSQL then keeps a generic plan that scans the table, and each
# group's check grew with the log (1.9 ms at 6,000 rows) until autovacuum's first ANALYZE. Probed a hash
# at a time, the generic plan is the index's (0.15 ms).
LOGGED_SQL = ("SELECT l.content_sha256 FROM unnest({}::text[]) AS u(h)"
              " CROSS JOIN LATERAL (SELECT content_sha256 FROM ingest_log WHERE content_sha256 = u.h LIMIT 1) AS l")


def write_rows_pipelined(store: Store, conn: Connection, frames: Sequence[tuple[F.FrameSpec, Rows]], result: WriteResult,
                         new_series: dict[str, int], unless_logged: Sequence[str]) -> Confirm | None:
    """``Store.write_rows``' statements in one round trip (psycopg's pipeline mode): the duplicate check and
    every frame's insert are sent together and their results read at one sync. A group of agents' pushes
    took a round trip a statement, each a wake-up of the database's backend and of the writer, on a 2-core
    machine shared with the API, most of a group's wall time under load. Series the process has no id for
    are created first (their ids go into the metric rows); a frame of ``DIRECT_COPY_ROWS`` or more goes by
    COPY after the sync. The gpu rows' upsert is skipped where the process knows them stored
    (``store.inventory.InventoryRows``), the inventory's counter read around it: what to confirm there once
    the write commits is returned."""
    raw = pg(conn)
    check = None
    inventory = store._inventory
    gpu_rows = next((r for spec, r in frames if spec.name == "gpu" and len(r.rows) < DIRECT_COPY_ROWS), None)
    counted = gpu_rows is not None and inventory.counted(conn)
    known = inventory.rows.known_at(gpu_rows) if counted and gpu_rows is not None else None
    around: list[Any] = []
    staged: list[tuple[str, Rows, Sequence[str], str]] = []
    # metric rows with series this process has no id for (a node's first push): the series are created, and the
    # rows insert with their ids joined, in the pipeline itself, after the duplicate check's locks
    by_key: Rows | None = None
    for spec, r in frames:
        if spec.name != "metric_sample":
            staged.append((spec.name, r, spec.key, spec.on_conflict))
        elif len(r.rows) < DIRECT_COPY_ROWS and not store._series_known(r):
            by_key = r  # its series are sent first in the pipeline, its samples in the tables' order
            staged.append(("metric_sample", r, ("series_id", "ts"), "ignore"))
        else:
            if not store._series_known(r):
                # Series to create outside the pipeline: the check first, so that a writer waiting on
                # another's check holds no row.
                store._refuse_logged(conn, unless_logged)
                unless_logged = ()
            staged.append(("metric_sample", store._metric_rows(conn, r, new_series), ("series_id", "ts"), "ignore"))
    # One table order for every writer: two groups in flight lock rows of the same tables in the same
    # order (and each table's rows in key order), so they wait for each other rather than deadlock.
    staged.sort(key=lambda item: item[0])
    cursors = []
    around_new: list[Any] = []  # the gpu_key inserts' cursors, closed once the pipeline has synced
    series_ids = None
    with raw.pipeline():
        check = logged_cursor(raw, unless_logged)
        if by_key is not None:
            # the series first, as every writer that creates series does
            series_ids = raw.cursor()
            send_series(series_ids, by_key)
        for name, r, key, on_conflict in staged:
            if r is by_key:
                cur = raw.cursor()
                send_by_series_key(cur, by_key)
                cursors.append((name, cur))
                continue
            if len(r.rows) < DIRECT_COPY_ROWS:
                inventory_rows = counted and r is gpu_rows
                if inventory_rows:
                    around.append(raw.cursor().execute(VERSION_SQL["postgresql"]))
                if inventory_rows and known is not None:
                    # every row is remembered stored as of the counter's value ``known``: the counter is read
                    # and the upsert not sent (its arrays cost the writer and the backend more than the rest
                    # of a group's inventory); a counter that moved sends the write again (InventoryMoved)
                    continue
                if name == gpu_keys.RAW:
                    made = raw.cursor()
                    store._gpu_keys.send_new(made, r)  # before the samples that probe their ids
                    around_new.append(made)
                cur = raw.cursor()
                execute_unnest(cur, name, r, key, conflict_sql("postgresql", name, *gpu_keys.physical(name, r.columns, key), on_conflict))
                cursors.append((name, cur))
                if inventory_rows:
                    around.append(raw.cursor().execute(VERSION_SQL["postgresql"]))
    for cur in around_new:
        cur.close()
    if check is not None:
        found = {row[0] for row in check.fetchall()}
        check.close()
        if found:
            for _, cur in cursors:
                cur.close()
            for cur in [*around, *([series_ids] if series_ids is not None else [])]:
                cur.close()
            raise AlreadyLogged(found)
    if series_ids is not None:
        new_series.update((key, sid) for sid, key in series_ids.fetchall())
        series_ids.close()
    for name, cur in cursors:
        result.written[name] = max(cur.rowcount, 0)
        cur.close()
    confirm = None
    if around:
        readings = [int(cur.fetchone()[0]) for cur in around]
        for cur in around:
            cur.close()
        assert gpu_rows is not None
        if len(readings) == 1:  # the upsert was not sent
            if readings[0] != known:
                raise InventoryMoved(f"the gpu inventory's counter reads {readings[0]}, not {known}")
            result.written["gpu"] = 0
            readings *= 2
        confirm = (gpu_rows, readings[0], readings[1], result.written["gpu"])
    for name, r, key, on_conflict in staged:
        if len(r.rows) >= DIRECT_COPY_ROWS:
            spec = F.FRAMES[name] if name != "metric_sample" else None
            df = r.frame(spec) if spec is not None else pl.DataFrame(r.rows, schema={"series_id": pl.Int64, "ts": pl.Int64, "value": pl.Float64},
                                                                      orient="row").with_columns(pl.col("ts").cast(F.UTC_US))
            result.written[name] = store._insert(conn, name, df, key, on_conflict)
    return confirm

"""The ingest log: one row per input a write stored (source, content hash, rows written per frame, values),
written in the write's transaction, and the check of content hashes against it that keeps an input from
being stored twice (``AlreadyLogged``)."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Sequence

from sqlalchemy import Connection

from fleetscope.store import pg_write, schema
from fleetscope.store.counters import NEWEST_SQL
from fleetscope.store.writing import AlreadyLogged


def logged(conn: Connection, dialect: str, shas: Sequence[str]) -> set[str]:
    """Which of ``shas`` the ingest log holds, read in ``conn``."""
    found: set[str] = set()
    # On the driver's cursor: SQLAlchemy's statement building cost more than the query (one per group).
    mark = "?" if dialect == "sqlite" else "%s"
    cur = conn.connection.driver_connection.cursor()
    try:
        for i in range(0, len(shas), 500):
            chunk = list(shas[i : i + 500])
            cur.execute(f"SELECT content_sha256 FROM ingest_log WHERE content_sha256 IN ({', '.join(mark for _ in chunk)})", chunk)
            found.update(r[0] for r in cur.fetchall())
    finally:
        cur.close()
    return found


def refuse_logged(conn: Connection, dialect: str, shas: Sequence[str], counters: bool = False) -> int | None:
    """``AlreadyLogged`` where the ingest log holds any of ``shas``, checked in ``conn``'s transaction
    (see ``Store.write_frames``). With ``counters`` on PostgreSQL, the fault counters' newest version
    (``store.counters.NEWEST_SQL``) is read in the same round trip, after the check, and returned; else None."""
    if not shas:
        return None
    newest = None
    if dialect == "postgresql":
        raw = pg_write.pg(conn)
        with raw.pipeline():
            check = pg_write.logged_cursor(raw, shas)
            versions = raw.cursor().execute(NEWEST_SQL) if counters else None
        found = {row[0] for row in check.fetchall()}
        check.close()
        if versions is not None:
            newest = int(versions.fetchone()[0] or 0)
            versions.close()
    else:
        found = logged(conn, dialect, shas)
    if found:
        raise AlreadyLogged(found)
    return newest


def log(conn: Connection, dialect: str, entries: list[tuple[str, str | None, dict[str, int], int]]) -> None:
    """The ingest-log rows of ``entries`` (source, content hash, rows written per frame, values), in ``conn``."""
    at = dt.datetime.now(dt.UTC)
    if dialect == "postgresql":
        # One statement on the driver's cursor, rows in their order: SQLAlchemy's executemany of a group's
        # rows cost the writer more than the rows' own insert.
        from fleetscope.store import pg_arrays  # lazy: psycopg, only against PostgreSQL

        raw = pg_write.pg(conn)
        columns = ([source[:2000] for source, _, _, _ in entries], [sha for _, sha, _, _ in entries],
                   [json.dumps(written, sort_keys=True) for _, _, written, _ in entries], [int(v) for _, _, _, v in entries])
        with raw.cursor() as cur:
            cur.execute('INSERT INTO ingest_log (at, source, content_sha256, rows_json, "values") SELECT %s, u.s, u.h, u.r, u.v'
                        " FROM unnest(%b::text[], %b::text[], %b::text[], %b::bigint[]) WITH ORDINALITY AS u(s, h, r, v, i) ORDER BY u.i",
                        (at, *(pg_arrays.encode(c) for c in columns)))
        return
    conn.execute(schema.ingest_log.insert(), [
        {"at": at, "source": source[:2000], "content_sha256": sha, "rows_json": json.dumps(written, sort_keys=True), "values": values}
        for source, sha, written, values in entries
    ])

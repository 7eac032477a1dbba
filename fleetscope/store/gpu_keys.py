"""Integer GPU ids in PostgreSQL's raw samples (migration 0026).

A raw ``gpu_sample`` row is mostly its thirty values, but its 41-byte text UUID was paid in the row and again
in each primary-key entry: about 1.3 MB of an open day's 4.2 MB a GPU. On PostgreSQL the table holds
``gpu_id`` (4 bytes) instead, ``gpu_key`` maps ids to UUIDs, and every read joins the UUID back
(``store.packed.source``), so what reads and writes see is unchanged. SQLite keeps the text key.

Ids are made on first sight (``INSERT ... ON CONFLICT DO NOTHING``, in key order like every writer's rows) and
never change or go away, so a process may remember them, as it does series ids. A small write sends UUIDs
and lets the database probe each one's id in the same statement (``unnest_sql``); a frame COPYed is mapped to
ids here first. What a write learns is remembered only once it commits (``begin``, ``commit``): an id made
by a transaction that rolled back never existed. The store's write lock makes one write at a time per
``Store``, which these methods rely on.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import polars as pl

from fleetscope.store.writing import Rows

TABLE = "gpu_key"
RAW = "gpu_sample"
MAX_REMEMBERED = 2_000_000

# Each UUID's id by a probe of the unique index, not a join (the planner, guessing an unnest's rows, may hash
# the whole table for a push's eight GPUs).
PROBE = f"(SELECT k.gpu_id FROM {TABLE} k WHERE k.gpu_uuid = u.gpu_uuid)"
_NEW_SQL = f"INSERT INTO {TABLE} (gpu_uuid) SELECT u.k FROM unnest(%b::text[]) AS u(k) ORDER BY 1 ON CONFLICT (gpu_uuid) DO NOTHING"
_IDS_SQL = f"SELECT gpu_uuid, gpu_id FROM {TABLE} WHERE gpu_uuid = ANY(%b::text[])"


def physical(table: str, columns: Sequence[str], key: Sequence[str]) -> tuple[list[str], tuple[str, ...]]:
    """The columns and key a write of ``columns`` to ``table`` has in PostgreSQL's table: ``gpu_sample``'s
    ``gpu_uuid`` is ``gpu_id`` there."""
    if table != RAW:
        return list(columns), tuple(key)
    return ["gpu_id" if c == "gpu_uuid" else c for c in columns], tuple("gpu_id" if k == "gpu_uuid" else k for k in key)


def join_sql(table: str) -> str:
    """A FROM item of ``table`` (``gpu_sample`` or one of its day partitions) with ``gpu_uuid`` joined back."""
    return f"{table} JOIN {TABLE} USING (gpu_id)"


class GpuKeys:
    """A process's memory of ``gpu_key``: the ids it has read, and the UUIDs it knows have one."""

    def __init__(self) -> None:
        self._ids: dict[str, int] = {}
        self._exist: set[str] = set()
        self._pending_ids: dict[str, int] = {}
        self._pending_exist: set[str] = set()
        # The UUID column of the last frame whose every id was committed, and those ids row by row: a scrape lists
        # the same GPUs in the same order every time, so one compare stands in for the lookups and the join.
        self._last: tuple[pl.Series, pl.Series] | None = None

    def begin(self) -> None:
        """A write's transaction opens: nothing it learns is remembered until ``commit``."""
        self._pending_ids.clear()
        self._pending_exist.clear()

    def commit(self) -> None:
        """The write committed: what it learned holds."""
        if len(self._ids) + len(self._exist) + len(self._pending_ids) + len(self._pending_exist) > MAX_REMEMBERED:
            self._ids.clear()
            self._exist.clear()
        self._ids.update(self._pending_ids)
        self._exist.update(self._pending_exist)
        self.begin()

    def unknown(self, uuids: Iterable[str]) -> list[str]:
        """The UUIDs, sorted, this process does not know to have an id."""
        seen = (self._ids, self._exist, self._pending_ids, self._pending_exist)
        return sorted({u for u in uuids if not any(u in s for s in seen)})

    def send_new(self, cur: Any, rows: Rows) -> None:
        """On ``cur`` (of a connection ``pg_write.pg`` prepared, pipelined or not), make the ids of the GPUs of
        ``rows`` (``gpu_sample`` rows) this process does not know: a statement sent, its result not awaited."""
        i = rows.columns.index("gpu_uuid")
        new = self.unknown(row[i] for row in rows.rows)
        if not new:
            return
        from fleetscope.store import pg_arrays  # lazy: psycopg, only against PostgreSQL

        cur.execute(_NEW_SQL, (pg_arrays.encode(new),))
        self._pending_exist.update(new)

    def keyed(self, raw: Any, df: pl.DataFrame) -> pl.DataFrame:
        """``df`` (``gpu_sample`` rows) with ``gpu_id`` in place of ``gpu_uuid``, ids made for new UUIDs on
        ``raw`` (a psycopg connection in the write's transaction)."""
        column = df.get_column("gpu_uuid")
        cols = ["gpu_id" if c == "gpu_uuid" else c for c in df.columns]
        last = self._last
        if last is not None and last[0].len() == column.len() and last[0].equals(column):
            return df.with_columns(last[1]).select(cols)
        uuids = column.unique().to_list()
        ids, pending = self._ids, self._pending_ids
        need = sorted(u for u in uuids if u not in ids and u not in pending)
        if need:
            from fleetscope.store import pg_arrays  # lazy: psycopg, only against PostgreSQL

            with raw.cursor() as cur:
                cur.execute(_NEW_SQL, (pg_arrays.encode(need),))
                cur.execute(_IDS_SQL, (pg_arrays.encode(need),))
                pending.update(cur.fetchall())
        got = [ids.get(u) or pending[u] for u in uuids]
        table = pl.DataFrame({"gpu_uuid": uuids, "gpu_id": got}, schema={"gpu_uuid": pl.String, "gpu_id": pl.Int32})
        out = df.join(table, on="gpu_uuid", how="left", maintain_order="left").select(cols)
        if not need:
            # only ids committed before this write: remembered whatever becomes of it
            self._last = (column, out.get_column("gpu_id"))
        return out

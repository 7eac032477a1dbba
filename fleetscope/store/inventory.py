"""The GPU inventory a process has found stored already, so a scrape that re-sends it unchanged costs no upsert.

A dcgm-exporter scrape carries the inventory of every GPU it lists (uuid, host, index, bus id, model, driver):
16,384 ``gpu`` rows a scrape for a large fleet, nearly always what the table holds. The upsert that finds
nothing to change still binds and compares every row (0.12 CPU-s of SQLite's single writer a scrape). The
``gpu`` table has a change counter (migration 0020): a trigger advances it for every row inserted, updated or
deleted, by any process or statement — SQLite a one-row table (``inventory_version``; its writers take turns
anyway), PostgreSQL a sequence (``gpu_inventory_version``; ``nextval`` takes no lock that concurrent writers
would queue on, and is never rolled back, so the counter can only move more often than the table changes).

A frame is remembered with the counter's value only when its own upsert changed nothing and the counter did
not move across it: the table then held every value of the frame (the upsert's COALESCE keeps stored values
where the frame has nulls), and nothing has changed it as long as the counter reads the same. The next write of
an equal frame at that value changes nothing and is skipped; any other change, from this process or another,
moves the counter and the frame is upserted as usual.

The agents' pushes (``Store.write_rows``) carry a node's few GPUs each, grouped with whichever nodes pushed at once, so no
frame repeats; ``InventoryRows`` keeps the same kind of memory per row.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import polars as pl
from sqlalchemy import Connection

from fleetscope.store.writing import Rows

_REMEMBERED = 8  # frames kept (one per scraper of a different fleet slice, say); the oldest goes first
_REMEMBERED_ROWS = 200_000  # GPUs' rows kept (a 100,000-GPU fleet's); cleared whole when full
# The counter as a statement reads it (a sequence never advanced reads last_value 1 with is_called false: 0).
VERSION_SQL = {"sqlite": "SELECT version FROM inventory_version WHERE name = 'gpu'",
               "postgresql": "SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM gpu_inventory_version"}


class InventoryMemory:
    """Per-process memory of ``gpu`` frames found stored, checked against the table's change counter."""

    def __init__(self, dialect: str):
        self.dialect = dialect
        self._counted: bool | None = None  # whether the database has the counter (looked up on first use)
        self._seen: dict[tuple[Any, ...], tuple[pl.DataFrame, int]] = {}
        self._lock = threading.Lock()
        self.rows = InventoryRows()

    def counted(self, conn: Connection) -> bool:
        """Whether the database has the counter (a schema from 0020 on), looked up once."""
        if self._counted is None:
            self.version(conn)
        return bool(self._counted)

    def version(self, conn: Connection) -> int | None:
        """The counter as ``conn`` reads it now; None where the database has none (a schema before 0020)."""
        cur = conn.connection.driver_connection.cursor()
        try:
            if self._counted is None:
                if self.dialect == "sqlite":
                    cur.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'inventory_version'")
                else:
                    cur.execute("SELECT to_regclass('gpu_inventory_version') IS NOT NULL")
                row = cur.fetchone()
                self._counted = bool(row and row[0])
            if not self._counted:
                return None
            cur.execute(VERSION_SQL[self.dialect])
            row = cur.fetchone()
            return int(row[0]) if row else None
        finally:
            cur.close()

    def upsert_rows(self, conn: Connection, rows: Rows, upsert: Callable[[], int]) -> tuple[int, Confirm | None]:
        """SQLite: ``rows`` of ``gpu`` upserted by ``upsert`` (rows changed), or skipped where every one is
        remembered at the counter's value now; and what to ``InventoryRows.confirm`` once the write commits.
        In the write's transaction, under the store's write lock, so no other writer moves the counter."""
        if not self.counted(conn):
            return upsert(), None
        before = self.version(conn)
        assert before is not None
        if self.rows.known_at(rows) == before:
            return 0, None
        changed = upsert()
        after = self.version(conn)
        assert after is not None
        return changed, (rows, before, after, changed)

    @staticmethod
    def _fingerprint(df: pl.DataFrame) -> tuple[Any, ...]:
        return (df.height, tuple(df.columns), df.row(0) if df.height else None, df.row(-1) if df.height else None)

    def unchanged(self, df: pl.DataFrame, version: int) -> bool:
        """Whether ``df`` was found stored at counter ``version``: its upsert would change nothing."""
        with self._lock:
            seen = self._seen.get(self._fingerprint(df))
        return seen is not None and seen[1] == version and seen[0].equals(df)

    def remember(self, df: pl.DataFrame, version: int) -> None:
        """``df`` is stored, as of counter ``version`` (its upsert changed nothing, the counter stayed)."""
        key = self._fingerprint(df)
        with self._lock:
            self._seen.pop(key, None)
            self._seen[key] = (df, version)
            while len(self._seen) > _REMEMBERED:
                self._seen.pop(next(iter(self._seen)))


# (gpu rows, the counter just before their upsert, just after it, rows the upsert changed)
Confirm = tuple[Rows, int, int, int]


class InventoryMoved(Exception):
    """A write left out an upsert of gpu rows the process remembered stored, and found the table's counter
    moved since: the write is rolled back and sent again whole, without the memory (``InventoryRows.forget``)."""


class InventoryRows:
    """Per-process memory of single ``gpu`` rows the table holds as some push gave them, for the agents' row
    path (``Store.write_rows``): a node's push carries its 8 GPUs' inventory every interval, and a group's
    upsert that finds nothing to change still looks up and locks every row (on PostgreSQL a WAL record a row
    locked). The memory is valid as of one value of the table's change counter; a group whose every row it
    holds, unchanged, is not upserted while the counter still reads that value (PostgreSQL: the counter is
    read in the group's pipeline instead of the upsert being sent, and a counter found moved rolls the write
    back to be sent again whole, ``InventoryMoved``; SQLite: read in the write's transaction, writers taking
    turns).

    What a write teaches it, once committed (``confirm``): the counter read just before the group's upsert
    and just after. Where they differ by exactly the rows the upsert changed, nothing but this upsert moved
    the counter between them (every row changed advances it once, and any other writer's change at least
    once), so the table then holds each of these rows as pushed, with stored values where the push had
    nulls (the upsert's COALESCE): upserting them again would change nothing. Where the memory was valid at
    the value read before, it stays valid after (only these rows changed in between, and they are
    remembered anew). Anything else — another writer's change in between, a counter that moved elsewhere —
    leaves the memory valid at no later value than it was, or starts it again from this group's rows."""

    def __init__(self) -> None:
        self._rows: dict[str, tuple[tuple[str, ...], tuple[Any, ...]]] = {}
        self._version: int | None = None
        self._lock = threading.Lock()

    def forget(self) -> None:
        """Remember nothing: the table has changed since the memory's counter value."""
        with self._lock:
            self._rows.clear()
            self._version = None

    def known_at(self, rows: Rows) -> int | None:
        """The counter value at which every row of ``rows`` is remembered as stored, or None."""
        cols = rows.columns
        i = cols.index("gpu_uuid")
        with self._lock:
            get = self._rows.get
            if self._version is None or any(get(row[i]) != (cols, row) for row in rows.rows):
                return None
            return self._version

    def confirm(self, rows: Rows, before: int, after: int, changed: int) -> None:
        """After the commit of a write whose upsert of ``rows`` changed ``changed`` of them, with the counter
        read ``before`` and ``after`` it (see the class docstring)."""
        if after - before != changed:
            return  # another writer changed the table meanwhile: these rows may not be what it holds
        cols = rows.columns
        i = cols.index("gpu_uuid")
        with self._lock:
            if self._version is not None and after < self._version:
                return  # the memory has moved past this write already, along a chain this write is not in
            if self._version is None or (before != self._version and after != self._version) or len(self._rows) >= _REMEMBERED_ROWS:
                self._rows.clear()
            self._version = after
            for row in rows.rows:
                self._rows[row[i]] = (cols, row)

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
"""

from __future__ import annotations

import threading
from typing import Any

import polars as pl
from sqlalchemy import Connection

_REMEMBERED = 8  # frames kept (one per scraper of a different fleet slice, say); the oldest goes first


class InventoryMemory:
    """Per-process memory of ``gpu`` frames found stored, checked against the table's change counter."""

    def __init__(self, dialect: str):
        self.dialect = dialect
        self._counted: bool | None = None  # whether the database has the counter (looked up on first use)
        self._seen: dict[tuple[Any, ...], tuple[pl.DataFrame, int]] = {}
        self._lock = threading.Lock()

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
            if self.dialect == "sqlite":
                cur.execute("SELECT version FROM inventory_version WHERE name = 'gpu'")
            else:
                # A sequence never advanced reads last_value 1 with is_called false: count that as 0.
                cur.execute("SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM gpu_inventory_version")
            row = cur.fetchone()
            return int(row[0]) if row else None
        finally:
            cur.close()

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

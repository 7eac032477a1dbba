"""The store's memory of DCGM fault-counter readings (ECC, row remap): which health events repeat a GPU's
previous reading and are no new event. The readings are the database's (``counter_reading``), shared by
every process that writes; each store keeps a copy of them, brought up to date by the rows changed since."""

from __future__ import annotations

from collections.abc import Callable
import hashlib
import math
import threading
import time
from typing import Any

import polars as pl
from sqlalchemy import Connection, text
from sqlalchemy.dialects import postgresql
from sqlalchemy.dialects import sqlite as sqlite_dialect

from fleetscope.core import dcgm_fields
from fleetscope.store import schema
from fleetscope.store.writing import Rows

_COUNTER_CODES = frozenset(code for _, _, code, _ in dcgm_fields.DCGM_HEALTH_COUNTERS)
_COUNTER_COLUMNS = tuple(col for col, _, _, _ in dcgm_fields.DCGM_HEALTH_COUNTERS)
_COUNTER_SCHEMA = {"gpu_uuid": pl.String, "code": pl.Int64, "value": pl.Float64}
# the advisory lock writers of changed counter readings take turns on (PostgreSQL): any fixed 64-bit number
_COUNTER_LOCK_KEY = int.from_bytes(hashlib.sha256(b"fleetscope.counter_reading").digest()[:8], "big", signed=True)
# The readings' newest version: one indexed read, which a write may send with its duplicate check (store.ingest_log)
NEWEST_SQL = "SELECT MAX(version) FROM counter_reading"
# How old this process's copy may grow before a write with counter readings brings it up to date anyway
# (``CounterMemory.resets``): another API process's counts reach this one's within this and a scrape.
REFRESH_S = 5.0


def _counter_decision(events: pl.DataFrame, is_counter: pl.Expr, counters: pl.DataFrame, seq: pl.DataFrame,
                      known: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    """``events`` keeping the counter readings that differ from the GPU's previous one (in ``seq``, the batch's
    readings by GPU, code and time, or before it in ``known``); and each counter's newest reading where it is
    not what ``known`` holds. A counter ``known`` lacks that reads zero is left out of the changes: an unknown
    counter's next reading is new anyway, and a fleet's zeros would fill the table and take its lock."""
    seq = seq.join(known.rename({"value": "_seen"}).with_columns(_known=pl.lit(True)), on=["gpu_uuid", "code"], how="left").with_columns(
        pl.when(pl.col("ts") == pl.col("ts").first().over("gpu_uuid", "code"))
        .then(pl.col("_seen")).otherwise(pl.col("value").shift(1).over("gpu_uuid", "code")).alias("_prev"))
    kept = (counters.join(seq.select("gpu_uuid", "code", "ts", "_prev"), on=["gpu_uuid", "code", "ts"], how="left")
            .filter(pl.col("_prev").is_null() | pl.col("value").is_null() | (pl.col("value") != pl.col("_prev")))
            .select(events.columns))
    changes = (seq.group_by("gpu_uuid", "code").agg(pl.col("value").last(), pl.col("_seen").first(), pl.col("_known").first())
               .filter(pl.when(pl.col("_known").is_null()).then(pl.col("value").ne_missing(0.0))
                       .otherwise(pl.col("value").ne_missing(pl.col("_seen"))))
               .select(list(_COUNTER_SCHEMA)))
    return pl.concat([events.filter(~is_counter), kept]), changes


# (gpu_uuid, code) -> the counter's last reading
Known = dict[tuple[str, int], float | None]


def _decide_rows(events: Rows, counter_rows: list[int], seq: dict[tuple[str, int], dict[int, float | None]],
                 known: Known) -> tuple[Rows, list[tuple[str, int, float | None]]]:
    """``_counter_decision`` over plain rows: ``events`` keeping the counter readings (``counter_rows``, their
    indices) that differ from the GPU's previous one, and each counter's newest reading where it is not what
    ``known`` holds."""
    at = {c: i for i, c in enumerate(events.columns)}
    its, ig, ic, iv = at["ts"], at["gpu_uuid"], at["code"], at["value"]
    prev_at: dict[tuple[str, int, int], float | None] = {}
    changes: list[tuple[str, int, float | None]] = []
    for key, readings in seq.items():
        prev = known.get(key)
        for ts in sorted(readings):
            prev_at[(*key, ts)] = prev
            prev = readings[ts]
        if (prev != 0) if key not in known else (prev != known[key]):
            changes.append((*key, prev))
    dropped = set()
    for n in counter_rows:
        row = events.rows[n]
        prev, value = prev_at[(row[ig], row[ic], row[its])], row[iv]
        if not (prev is None or value is None or value != prev):
            dropped.add(n)
    if not dropped:
        return events, changes
    return Rows(events.columns, [row for n, row in enumerate(events.rows) if n not in dropped]), changes


class CounterMemory:
    """The last reading of each GPU's DCGM fault counters: gpu_uuid, code, value. A counter above zero is in
    every scrape; only a changed reading is a new health event, or a GPU with one old corrected error would add
    an event every second. The readings are the database's (counter_reading), shared by every process that
    writes, so API processes behind one proxy agree on what is new; this is this process's copy of them as of
    change ``_version``, checked against the table's newest version in each write that carries readings and
    brought up to date by the rows changed since. The copy is replaced, never changed in place, so a writer
    decides on one version of it whatever another writer commits meanwhile."""

    def __init__(self, dialect: str):
        self._dialect = dialect
        self._known: Known = {}
        self._version = 0
        self._frame: tuple[Known, pl.DataFrame] | None = None  # a copy as a frame, for the frame path
        self._nonzero: frozenset[str] = frozenset()  # the GPUs with a counter above zero in the copy
        self._checked_at = -math.inf  # monotonic time the copy was last checked against the table
        self._lock = threading.Lock()

    def resets(self, conn: Connection, samples: pl.DataFrame | Rows | None) -> bool:
        """Whether ``samples`` (a write's gpu_sample rows) name a GPU whose counter this process last knew above
        zero. A write with no health event still carries every GPU's readings, and a zero there (a volatile
        counter after a driver reload or a reboot) is the change that makes the same count later a new event:
        without it a second double-bit error reading 1, as the first did, would page nobody. A GPU set above
        zero by another API process is known here once the copy is brought up to date: a write with readings
        checks it against the table, in ``conn``'s transaction, when it was last checked more than ``REFRESH_S``
        ago (or never, in a process just started): one indexed read, and the rows changed since where it moved.
        A node whose agent reconnects to another process after a reboot has its zero recorded within that and a
        scrape."""
        if samples is None or not any(col in samples.columns for col in _COUNTER_COLUMNS):
            return False
        if time.monotonic() - self._checked_at > REFRESH_S:
            self._state(conn)
        nonzero = self._nonzero
        if not nonzero:
            return False
        if isinstance(samples, Rows):
            i = samples.columns.index("gpu_uuid")
            return any(row[i] in nonzero for row in samples.rows)
        return bool(samples.get_column("gpu_uuid").is_in(list(nonzero)).any())

    def changed(self, conn: Connection, events: pl.DataFrame, samples: pl.DataFrame | None,
                newest: int | None = None) -> tuple[pl.DataFrame, tuple[list[tuple[str, int, float | None]], int] | None]:
        """``events`` without the DCGM fault-counter readings (``dcgm_fields.DCGM_HEALTH_COUNTERS``) that repeat the
        GPU's previous reading of that counter, in this batch (by time, zeros from its ``gpu_sample`` rows
        included, since a zero reading is no event) or as the database has it (``counter_reading``); and the
        readings this write changes there, with their version, written in ``conn``'s transaction and kept by
        this process once it commits (``remember``). A first reading, a change, a reading after a reset to zero
        and a null value are kept. Other health events (XIDs among them: rules read the repeating last-XID
        gauge) pass unchanged.

        Writers that change readings take turns (PostgreSQL: a transaction advisory lock; SQLite: the store's
        write lock, already held), each deciding on the readings the last one committed, so two processes
        sharing one GPU's pushes decide as one process would. A write that changes nothing takes no lock:
        the newest version is one indexed read (``newest``, where the caller read it in this transaction
        already), and the copy is brought up to date only when it moved."""
        is_counter = pl.col("kind").is_in(["ecc", "row_remap"]) & pl.col("code").is_in(list(_COUNTER_CODES)) & (pl.col("gpu_uuid") != "")
        counters = events.filter(is_counter)
        seen = [counters.select("ts", "gpu_uuid", "code", "value")]
        if samples is not None:
            for col, _, code, _ in dcgm_fields.DCGM_HEALTH_COUNTERS:
                if col in samples.columns:
                    seen.append(samples.filter(pl.col(col).is_not_null()).select(
                        "ts", "gpu_uuid", pl.lit(code, pl.Int64).alias("code"), pl.col(col).cast(pl.Float64).alias("value")))
        seq = pl.concat(seen).unique(["gpu_uuid", "code", "ts"], keep="first").sort("gpu_uuid", "code", "ts")
        if seq.height == 0:
            return events, None

        def decide(known: Known) -> tuple[pl.DataFrame, list[tuple[str, int, float | None]]]:
            kept, changes = _counter_decision(events, is_counter, counters, seq, self._as_frame(known))
            return kept, changes.rows()

        return self._in_turn(conn, newest, decide)

    def changed_rows(self, conn: Connection, events: Rows, samples: Rows | None,
                     newest: int | None = None) -> tuple[Rows, tuple[list[tuple[str, int, float | None]], int] | None]:
        """:meth:`changed` for events and samples given as plain rows (``Store.write_rows``): the same decision,
        the same turns, made in Python, where the frame path's dozen frame operations cost a small group's
        write more than its rows."""
        at = {c: i for i, c in enumerate(events.columns)}
        its, ig, ik, ic, iv = at["ts"], at["gpu_uuid"], at["kind"], at["code"], at["value"]
        seq: dict[tuple[str, int], dict[int, float | None]] = {}
        counter_rows = []
        for n, row in enumerate(events.rows):
            if row[ik] in ("ecc", "row_remap") and row[ic] in _COUNTER_CODES and row[ig] != "":
                counter_rows.append(n)
                seq.setdefault((row[ig], row[ic]), {}).setdefault(row[its], row[iv])
        if samples is not None:
            sat = {c: i for i, c in enumerate(samples.columns)}
            st, sg = sat["ts"], sat["gpu_uuid"]
            for col, _, code, _ in dcgm_fields.DCGM_HEALTH_COUNTERS:
                j = sat.get(col)
                if j is None:
                    continue
                for row in samples.rows:
                    if row[j] is not None:
                        seq.setdefault((row[sg], code), {}).setdefault(row[st], float(row[j]))
        if not seq:
            return events, None
        return self._in_turn(conn, newest, lambda known: _decide_rows(events, counter_rows, seq, known))

    def _in_turn(self, conn: Connection, newest: int | None, decide: Callable[[Known], tuple[Any, list[tuple[str, int, float | None]]]],
                 ) -> tuple[Any, tuple[list[tuple[str, int, float | None]], int] | None]:
        """``decide`` (the copy -> the events kept and the readings changed) on the copy as of the table's newest
        version; where it changes readings, decided again on what the last writer of changed readings left, in
        that writer's turn (PostgreSQL: a transaction advisory lock; SQLite: the store's write lock, already held),
        and the changes written in ``conn``'s transaction as the next version, which is returned with them."""
        known, version = self._state(conn, newest)
        kept, changes = decide(known)
        if not changes:
            return kept, None
        if self._dialect == "postgresql":
            conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _COUNTER_LOCK_KEY})
            known, version = self._state(conn)  # as the writer before us left them
            kept, changes = decide(known)
            if not changes:
                return kept, None
        version += 1
        t = schema.counter_reading
        ins = (postgresql.insert(t) if self._dialect == "postgresql" else sqlite_dialect.insert(t))
        conn.execute(ins.on_conflict_do_update(index_elements=[t.c.gpu_uuid, t.c.code],
                                               set_={"value": ins.excluded.value, "version": ins.excluded.version}),
                     [{"gpu_uuid": g, "code": c, "value": v, "version": version} for g, c, v in changes])
        return kept, (changes, version)

    def _as_frame(self, known: Known) -> pl.DataFrame:
        """A copy of the readings as a frame (made once a copy)."""
        with self._lock:
            cached = self._frame
        if cached is not None and cached[0] is known:
            return cached[1]
        frame = pl.DataFrame([(g, c, v) for (g, c), v in known.items()], schema=_COUNTER_SCHEMA, orient="row")
        with self._lock:
            self._frame = (known, frame)
        return frame

    def _state(self, conn: Connection, newest: int | None = None) -> tuple[Known, int]:
        """The counter readings as of the table's newest version (``newest``, where read already in ``conn``'s
        transaction): this process's copy, with the rows changed since it was taken read in (all of them when
        the table went back, as when it was emptied)."""
        if newest is None:
            # on the driver's cursor: SQLAlchemy's statement handling costs more than this one-row index read
            cur = conn.connection.driver_connection.cursor()
            try:
                cur.execute(NEWEST_SQL)
                newest = cur.fetchone()[0] or 0
            finally:
                cur.close()
        with self._lock:
            known, version = self._known, self._version
        if newest == version:
            with self._lock:
                self._checked_at = time.monotonic()
            return known, version
        since = version if newest > version else 0
        rows = conn.execute(text("SELECT gpu_uuid, code, value FROM counter_reading WHERE version > :v"), {"v": since}).all()
        delta = {(g, c): v for g, c, v in rows}
        known = {**known, **delta} if since else delta
        with self._lock:
            # a whole reading (the table went back, as when it was emptied) replaces the copy whatever its version:
            # kept at the old, higher version, the rows the table gets back up to it would never be read in
            if self._version <= newest or not since:
                self._nonzero = _nonzero(known, {g for g, _ in delta}, self._nonzero if since else frozenset())
                self._known, self._version = known, newest
                self._checked_at = time.monotonic()
        return known, newest

    def remember(self, changes: list[tuple[str, int, float | None]], version: int) -> None:
        """After the commit of the change ``version``: the changed readings into this process's copy, where the
        copy was the one that change was decided on (else the next write reads the table's rows in)."""
        with self._lock:
            if self._version == version - 1:
                self._known = {**self._known, **{(g, c): v for g, c, v in changes}}
                self._nonzero = _nonzero(self._known, {g for g, _, _ in changes}, self._nonzero)
                self._version = version


def _nonzero(known: Known, changed: set[str], before: frozenset[str]) -> frozenset[str]:
    """The GPUs with a counter above zero in ``known``: ``before`` with those of ``changed`` looked at again."""
    now = {g for g in changed if any(known.get((g, code)) for code in _COUNTER_CODES)}
    return (before - changed) | now

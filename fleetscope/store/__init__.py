"""The store: writes Batches atomically and idempotently, reads canonical frames back as polars.

Writes take the fast path docs/ARCHITECTURE.md measured: wide rows, one transaction per Batch, ``executemany``
of plain tuples on SQLite and ``COPY`` on PostgreSQL (into a session temp table, then one
``INSERT ... SELECT ... ON CONFLICT`` so that re-sent rows are skipped rather than failing the COPY).
Every frame is validated against its canonical spec before the transaction opens, so a bad row
rejects the whole Batch and leaves the database as it was.

Reads go around the ORM: timestamps travel as integer microseconds and polars builds the frame,
which is an order of magnitude faster than materialising one Python datetime per value.
"""

from __future__ import annotations

import contextlib
import contextvars
import datetime as dt
import fcntl
import functools
import hashlib
import json
import os
import sqlite3
import threading
import weakref
import zlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import polars as pl
from sqlalchemy import Connection, Engine, text

from fleetscope.core.units import as_utc
from fleetscope.core import dcgm_fields
from fleetscope.core import frames as F
from fleetscope.store import schema
from fleetscope.store import partitions
from fleetscope.store.inventory import InventoryMemory
from fleetscope.store import packed
from fleetscope.store import sqlite_reader
from fleetscope.core.errors import ValidationError
from fleetscope.observability import BATCHES_REJECTED, ROWS_WRITTEN, VALUES_WRITTEN, tracer
from fleetscope.store.db import make_engine
from fleetscope.store.sqltypes import UTCDateTime
from sqlalchemy.dialects import postgresql
from sqlalchemy.dialects import sqlite as sqlite_dialect
from sqlalchemy import event

_COPY_CHUNK_BYTES = 8 * 2**20
# Below this many rows the direct COPY's savepoint is not worth having (PostgreSQL path of Store._insert).
_DIRECT_COPY_ROWS = 1000


@dataclass
class WriteResult:
    """What one write did: rows offered per frame, rows new or changed per frame, values carried."""

    offered: dict[str, int] = field(default_factory=dict)
    written: dict[str, int] = field(default_factory=dict)
    values: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"offered": self.offered, "written": self.written, "values": self.values}


def _q(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


@functools.lru_cache(maxsize=256)
@functools.lru_cache(maxsize=512)
def _unnest_sql(table: str, columns: tuple[str, ...], key: tuple[str, ...], conflict: str) -> str:
    """PostgreSQL: insert rows given as one array per column. Timestamps travel as epoch microseconds
    (``Rows``' form) and are turned into ``timestamptz`` exactly, by integer interval arithmetic. The
    arrays go in binary (``%b``), encoded by ``store.pg_arrays`` and cast here to each column's type. A
    column holds one Python type (``Rows``' promise: psycopg refuses a list of mixed types)."""
    mark = "%b"

    cols = schema.metadata.tables[table].columns
    arrays, exprs = [], []
    for c in columns:
        sa_type = cols[c].type
        if isinstance(sa_type, UTCDateTime):
            arrays.append(f"{mark}::bigint[]")
            exprs.append(f"'epoch'::timestamptz + u.{_q(c)} * interval '1 microsecond' AS {_q(c)}")
        else:
            arrays.append(f"{mark}::{sa_type.compile(dialect=postgresql.dialect())}[]")
            exprs.append(f"u.{_q(c)} AS {_q(c)}")
    names = ", ".join(_q(c) for c in columns)
    order = ", ".join(_q(k) for k in key)
    return (f"INSERT INTO {_q(table)} ({names}) SELECT {', '.join(exprs)} FROM unnest({', '.join(arrays)}) AS u({names}) "
            f"ORDER BY {order} {conflict}")


def _epoch_us(value: dt.datetime) -> int:
    delta = as_utc(value) - schema.EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def _time_cols(spec_schema: dict[str, pl.DataType]) -> list[str]:
    return [n for n, t in spec_schema.items() if t == F.UTC_US]


def _as_list(value: str | Iterable[str] | None) -> list[str] | None:
    if value is None:
        return None
    if isinstance(value, str):
        return [value]
    return list(value)


_COUNTER_CODES = frozenset(code for _, _, code, _ in dcgm_fields.DCGM_HEALTH_COUNTERS)
_COUNTER_SCHEMA = {"gpu_uuid": pl.String, "code": pl.Int64, "value": pl.Float64}
# the advisory lock writers of changed counter readings take turns on (PostgreSQL): any fixed 64-bit number
_COUNTER_LOCK_KEY = int.from_bytes(hashlib.sha256(b"fleetscope.counter_reading").digest()[:8], "big", signed=True)


def _counter_decision(events: pl.DataFrame, is_counter: pl.Expr, counters: pl.DataFrame, seq: pl.DataFrame,
                      known: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    """``events`` keeping the counter readings that differ from the GPU's previous one (in ``seq``, the batch's
    readings by GPU, code and time, or before it in ``known``); and each counter's newest reading where it is
    not what ``known`` holds."""
    seq = seq.join(known.rename({"value": "_seen"}).with_columns(_known=pl.lit(True)), on=["gpu_uuid", "code"], how="left").with_columns(
        pl.when(pl.col("ts") == pl.col("ts").first().over("gpu_uuid", "code"))
        .then(pl.col("_seen")).otherwise(pl.col("value").shift(1).over("gpu_uuid", "code")).alias("_prev"))
    kept = (counters.join(seq.select("gpu_uuid", "code", "ts", "_prev"), on=["gpu_uuid", "code", "ts"], how="left")
            .filter(pl.col("_prev").is_null() | pl.col("value").is_null() | (pl.col("value") != pl.col("_prev")))
            .select(events.columns))
    changes = (seq.group_by("gpu_uuid", "code").agg(pl.col("value").last(), pl.col("_seen").first(), pl.col("_known").first())
               .filter(pl.col("_known").is_null() | pl.col("value").ne_missing(pl.col("_seen")))
               .select(list(_COUNTER_SCHEMA)))
    return pl.concat([events.filter(~is_counter), kept]), changes


@dataclass
class Rows:
    """A frame as Python tuples, built and checked by its writer: canonical types (timestamps as epoch
    microseconds), one row per natural key, no column null in every row. A small write spends more on the
    frame machinery's fixed costs (~0.1-0.2 ms an operation here) than on its rows; the ingest door hands
    the store its groups of agents' pushes this way (``Store.write_rows``)."""

    columns: tuple[str, ...]
    rows: list[tuple[Any, ...]]

    def frame(self, spec: F.FrameSpec) -> pl.DataFrame:
        schema_ = {c: (pl.Int64 if spec.schema[c] == F.UTC_US else spec.schema[c]) for c in self.columns}
        df = pl.DataFrame(self.rows, schema=schema_, orient="row")
        return df.with_columns([pl.col(c).cast(F.UTC_US) for c in self.columns if spec.schema[c] == F.UTC_US])


IDLE_CHECKPOINT_S = 5.0
"""How often the background checkpointer looks at the log when this store has not written."""

# What an ingest-log row holds: source, content hash, rows written per frame, values.
LogRows = Callable[[WriteResult], list[tuple[str, str | None, dict[str, int], int]]]


class AlreadyLogged(Exception):
    """A write given ``unless_logged`` content hashes found some in the ingest log: nothing was written.
    ``shas`` are those found; the caller writes the rest again without them."""

    def __init__(self, shas: set[str]):
        super().__init__(f"{len(shas)} input(s) already in the ingest log")
        self.shas = shas


def _sha_lock_keys(shas: Iterable[str]) -> list[int]:
    """The transaction advisory lock keys of content hashes (PostgreSQL): a writer holds its inputs' keys
    from its duplicate check to its commit, so a second writer of the same input (another API process)
    checks only once the first has committed, and finds it."""
    return sorted({int.from_bytes(hashlib.blake2b(s.encode(), digest_size=8).digest(), "big", signed=True) for s in shas})


_READS_ON_REPLICA: contextvars.ContextVar[bool] = contextvars.ContextVar("fleetscope_reads_on_replica", default=False)


@contextlib.contextmanager
def reads_on_replica() -> Iterator[None]:
    """Within this block (this thread or task, and the threads it hands work to with its context), a store's
    reads go to its read replica where it has one; its writes stay on the primary. For the read API and the
    dashboard's reads, never for work that writes what it read (a replica may lag the primary)."""
    token = _READS_ON_REPLICA.set(True)
    try:
        yield
    finally:
        _READS_ON_REPLICA.reset(token)


class Store:
    """One database, SQLite or PostgreSQL, behind the canonical frames; optionally a read replica of it
    (``read_engine``) that reads go to inside ``reads_on_replica``."""

    def __init__(self, engine: Engine, read_engine: Engine | None = None):
        self.engine = engine
        self.read_engine = read_engine or engine
        self.dialect = engine.dialect.name
        # series key -> id. Ids never change once committed (retention deletes samples, not series), so a
        # process may remember them: a scrape re-sends the same 30k series every time.
        self._series_cache: dict[str, int] = {}
        # The last reading of each GPU's DCGM fault counters (ECC, row remap): gpu_uuid, code, value. A counter
        # above zero is in every scrape; only a changed reading is a new health event, or a GPU with one old
        # corrected error would add an event every second. The readings are the database's (counter_reading),
        # shared by every process that writes, so API processes behind one proxy agree on what is new; this
        # is this process's copy of them as of change ``_counter_version``, checked against the table's
        # newest version in each write that carries readings and brought up to date by the rows changed since.
        self._counter_readings = pl.DataFrame(schema=_COUNTER_SCHEMA)
        self._counter_version = 0
        self._counter_lock = threading.Lock()
        # gpu inventory frames found stored, so an unchanged one is not upserted again (store.inventory)
        self._inventory = InventoryMemory(self.dialect)
        # which raw tables are partitioned (PostgreSQL, store.partitions): looked up on the first write
        self._partitioned: frozenset[str] | None = None
        # SQLite takes one writer at a time. Writers queue here, and the next one starts the moment the
        # last commits, rather than in SQLite's busy handler, which polls with sleeps of up to 100 ms:
        # threads of this process on a lock, other processes (API workers, the worker, the CLI) on an
        # advisory lock of the database file's, which the kernel hands on at once.
        self._write_lock: Any = _SqliteWriteLock(engine.url.database) if engine.dialect.name == "sqlite" else contextlib.nullcontext()
        if self.dialect not in ("sqlite", "postgresql"):
            raise ValueError(f"unsupported database {self.dialect!r}: use SQLite or PostgreSQL")

    @classmethod
    def open(cls, url: str, read_url: str | None = None) -> Store:
        return cls(make_engine(url), make_engine(read_url) if read_url else None)

    @property
    def reader(self) -> Engine:
        """The engine a read takes here: the replica inside ``reads_on_replica``, else the primary."""
        return self.read_engine if _READS_ON_REPLICA.get() else self.engine

    def checkpoint_in_background(self, interval_s: float = 0.25) -> None:
        """SQLite: copy the write-ahead log into the database from a thread of its own, not in a commit.

        SQLite checkpoints in whichever commit takes the log past 1,000 pages: a small group commit then
        waits 10-15 ms copying pages it did not write, a latency spike every dozen commits and a third
        of the commit time on average. A PASSIVE checkpoint never blocks writers or readers and runs
        without the GIL (https://www.sqlite.org/wal.html#ckpt, ``sqlite3_wal_checkpoint_v2``), so this
        process's connections stop checkpointing and a thread does it every ``interval_s``. Durability
        is the log's either way. Other processes keep SQLite's own checkpoints. Nothing for PostgreSQL."""
        path = self.engine.url.database
        if self.dialect != "sqlite" or not path or path == ":memory:" or getattr(self, "_checkpointer", None) is not None:
            return

        @event.listens_for(self.engine, "connect")
        def _no_autocheckpoint(dbapi_conn: Any, _record: Any) -> None:
            dbapi_conn.execute("PRAGMA wal_autocheckpoint=0")

        self.engine.dispose()  # pooled connections reopen with the pragma
        stop = threading.Event()
        self._wal_dirty = dirty = threading.Event()
        alive = weakref.ref(self)  # a store no one holds any more takes its thread with it

        def run() -> None:
            conn = sqlite3.connect(path, timeout=30, check_same_thread=False)
            try:
                while not stop.is_set():
                    # woken by this store's commits; other writers (services' own transactions) are
                    # covered by the idle tick
                    dirty.wait(IDLE_CHECKPOINT_S)
                    if alive() is None or stop.wait(interval_s):
                        break
                    dirty.clear()
                    try:
                        conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
                    except sqlite3.Error:  # busy or gone for a moment: the next tick tries again
                        continue
                with contextlib.suppress(sqlite3.Error):
                    conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
            finally:
                conn.close()

        thread = threading.Thread(target=run, name="sqlite-checkpoint", daemon=True)
        self._checkpointer = (thread, stop)
        thread.start()

    def stop_checkpointing(self) -> None:
        """Stop the thread ``checkpoint_in_background`` started, after one last checkpoint."""
        found = getattr(self, "_checkpointer", None)
        if found is not None:
            thread, stop = found
            stop.set()
            thread.join(timeout=30)
            self._checkpointer = None

    # --- writing -----------------------------------------------------------------------------

    def write(self, batch: F.Batch, *, content_sha256: str | None = None, ingest_log: LogRows | None = None,
              unless_logged: Sequence[str] = ()) -> WriteResult:
        """Write every frame of ``batch`` in one transaction: all of it or, on any error, nothing.

        Rows whose natural key is already stored are skipped (telemetry) or update the stored row
        (inventory, findings), so writing the same Batch twice leaves one copy.
        """
        return self.write_frames(list(batch.frames()), source=batch.source, values=batch.values(), content_sha256=content_sha256,
                                 ingest_log=ingest_log, unless_logged=unless_logged)

    def write_frames(
        self, frames: Sequence[tuple[F.FrameSpec, pl.DataFrame]], *, source: str, values: int = 0, content_sha256: str | None = None,
        ingest_log: LogRows | None = None, unless_logged: Sequence[str] = (),
    ) -> WriteResult:
        """Write frames of any registered spec (canonical or governance) in one transaction, all or nothing.

        The ingest log gets one row for the write, or, with ``ingest_log``, the rows it makes of the write's
        result — (source, content hash, rows written per frame, values) per input of a group commit —
        in the same transaction. ``unless_logged``: content hashes checked against the ingest log in that
        transaction, before anything is written; any found raise ``AlreadyLogged`` and nothing is written.
        Writers of the same hashes take turns from the check to the commit (SQLite: the write lock;
        PostgreSQL: an advisory lock per hash), so of two identical inputs, from any processes, one is
        written and the other finds it."""
        with tracer().start_as_current_span("store.write") as span:
            span.set_attribute("fleetscope.source", source)
            span.set_attribute("db.system", self.dialect)
            unknown = [spec.name for spec, _ in frames if spec.name not in schema.FRAME_SPECS]
            if unknown:
                raise ValueError(f"no table for frame {unknown[0]!r}")
            try:
                conformed = [(spec, F.conform(spec, df)) for spec, df in frames if df.height]
            except ValidationError:
                BATCHES_REJECTED.labels("validation").inc()
                raise
            result = WriteResult(offered={spec.name: df.height for spec, df in conformed}, values=values)
            self._ensure_partitions([(spec.name, df) for spec, df in conformed])
            new_series: dict[str, int] = {}
            for attempt in (0, 1):
                readings = None
                try:
                    with self._write_lock, self.engine.begin() as conn:
                        self._refuse_logged(conn, unless_logged)
                        todo = conformed
                        if any(spec.name == "health_event" for spec, _ in conformed):
                            # first in the transaction: a writer waiting for the counters' lock holds no row lock
                            events = next(df for spec, df in conformed if spec.name == "health_event")
                            samples = next((df for spec, df in conformed if spec.name == "gpu_sample"), None)
                            changed, readings = self._changed_counter_readings(conn, events, samples)
                            todo = [(spec, changed if spec.name == "health_event" else df) for spec, df in conformed]
                            todo = [(spec, df) for spec, df in todo if df.height]
                        for spec, df in todo:
                            result.written[spec.name] = self._write_frame(conn, spec, df, new_series)
                        entries = ingest_log(result) if ingest_log is not None else [(source, content_sha256, result.written, result.values)]
                        self._log_ingest(conn, entries)
                    break
                except Exception as exc:  # noqa: BLE001 - re-raised unless a day partition was missing (SQLAlchemy wraps it; the raw driver cursor does not)
                    if attempt or not self._partition_missing(exc, [(spec.name, df) for spec, df in conformed]):
                        raise
                    new_series.clear()
            if readings is not None:
                self._remember_counter_readings(*readings)
            self._committed(result, new_series, span)
            return result

    def _committed(self, result: WriteResult, new_series: dict[str, int], span: Any) -> None:
        """What follows a committed write: remember the series ids it created, count what it wrote, wake
        the checkpointer."""
        dirty = getattr(self, "_wal_dirty", None)
        if dirty is not None:
            dirty.set()
        # Only ids from a committed transaction are remembered: a rolled-back insert never existed.
        if len(self._series_cache) + len(new_series) > 2_000_000:
            self._series_cache.clear()
        self._series_cache.update(new_series)
        for name, n in result.written.items():
            ROWS_WRITTEN.labels(name).inc(n)
        VALUES_WRITTEN.inc(result.values)
        span.set_attribute("fleetscope.rows", sum(result.written.values()))

    def write_rows(self, frames: Sequence[tuple[F.FrameSpec, Rows]], *, ingest_log: LogRows, values: int = 0,
                   unless_logged: Sequence[str] = ()) -> WriteResult:
        """Write frames given as ``Rows`` in one transaction, all or nothing, as ``write_frames`` does (with its
        ``unless_logged`` check), without conforming them: the caller vouches for their types and keys. Health
        events are not taken here (their fault-counter memory needs the frame path)."""
        with tracer().start_as_current_span("store.write") as span:
            span.set_attribute("db.system", self.dialect)
            if any(spec.name == "health_event" or spec.name not in schema.FRAME_SPECS for spec, _ in frames):
                raise ValueError("write_rows takes telemetry and inventory frames only")
            frames = [(spec, r) for spec, r in frames if r.rows]
            result = WriteResult(offered={spec.name: len(r.rows) for spec, r in frames}, values=values)
            self._ensure_partitions([(spec.name, r) for spec, r in frames])
            new_series: dict[str, int] = {}
            for attempt in (0, 1):
                try:
                    with self._write_lock, self.engine.begin() as conn:
                        if self.dialect == "postgresql":
                            self._write_rows_pipelined(conn, frames, result, new_series, unless_logged)
                        else:
                            self._refuse_logged(conn, unless_logged)
                            for spec, r in frames:
                                if spec.name == "metric_sample":
                                    result.written[spec.name] = self._insert(conn, "metric_sample", self._metric_rows(conn, r, new_series),
                                                                             ("series_id", "ts"), "ignore")
                                else:
                                    result.written[spec.name] = self._insert(conn, spec.name, r, spec.key, spec.on_conflict)
                        self._log_ingest(conn, ingest_log(result))
                    break
                except Exception as exc:  # noqa: BLE001 - re-raised unless a day partition was missing (SQLAlchemy wraps it; the raw driver cursor does not)
                    if attempt or not self._partition_missing(exc, [(spec.name, r) for spec, r in frames]):
                        raise
                    new_series.clear()
            self._committed(result, new_series, span)
            return result

    def _write_rows_pipelined(self, conn: Connection, frames: Sequence[tuple[F.FrameSpec, Rows]], result: WriteResult,
                              new_series: dict[str, int], unless_logged: Sequence[str]) -> None:
        """PostgreSQL: ``write_rows``' statements in one round trip (psycopg's pipeline mode): the duplicate
        check and every frame's insert are sent together and their results read at one sync. A group of
        agents' pushes took a round trip a statement, each a wake-up of the database's backend and of the
        writer, on a 2-core machine shared with the API, most of a group's wall time under load. Series the
        process has no id for are created first (their ids go into the metric rows); a frame of
        ``_DIRECT_COPY_ROWS`` or more goes by COPY after the sync."""
        raw = self._pg(conn)
        check = None
        if any(spec.name == "metric_sample" and not self._series_known(r) for spec, r in frames):
            # Series to create: the check first, so that a writer waiting on another's check holds no row.
            self._refuse_logged(conn, unless_logged)
            unless_logged = ()
        staged: list[tuple[str, Rows, Sequence[str], str]] = []
        for spec, r in frames:
            if spec.name == "metric_sample":
                staged.append(("metric_sample", self._metric_rows(conn, r, new_series), ("series_id", "ts"), "ignore"))
            else:
                staged.append((spec.name, r, spec.key, spec.on_conflict))
        # One table order for every writer: two groups in flight lock rows of the same tables in the same
        # order (and each table's rows in key order), so they wait for each other rather than deadlock.
        staged.sort(key=lambda item: item[0])
        cursors = []
        with raw.pipeline():
            check = self._logged_cursor(raw, unless_logged)
            for name, r, key, on_conflict in staged:
                if len(r.rows) < _DIRECT_COPY_ROWS:
                    cur = raw.cursor()
                    self._execute_unnest(cur, name, r, key, self._conflict_sql(name, list(r.columns), key, on_conflict))
                    cursors.append((name, cur))
        if check is not None:
            found = {row[0] for row in check.fetchall()}
            check.close()
            if found:
                for _, cur in cursors:
                    cur.close()
                raise AlreadyLogged(found)
        for name, cur in cursors:
            result.written[name] = max(cur.rowcount, 0)
            cur.close()
        for name, r, key, on_conflict in staged:
            if len(r.rows) >= _DIRECT_COPY_ROWS:
                spec = F.FRAMES[name] if name != "metric_sample" else None
                df = r.frame(spec) if spec is not None else pl.DataFrame(r.rows, schema={"series_id": pl.Int64, "ts": pl.Int64, "value": pl.Float64},
                                                                          orient="row").with_columns(pl.col("ts").cast(F.UTC_US))
                result.written[name] = self._insert(conn, name, df, key, on_conflict)

    def _logged_cursor(self, raw: Any, shas: Sequence[str]) -> Any:
        """PostgreSQL: send the advisory locks of ``shas`` and the query for those the ingest log holds (two
        statements, so that the query's snapshot is taken once the locks are held); the cursor of the query,
        or None without hashes."""
        if not shas:
            return None
        from fleetscope.store import pg_arrays  # lazy: psycopg, only against PostgreSQL

        keys = _sha_lock_keys(shas)
        with raw.cursor() as cur:
            cur.execute("SELECT pg_advisory_xact_lock(k) FROM (SELECT k FROM unnest(%b::bigint[]) AS u(k) ORDER BY k) AS s",
                        (pg_arrays.encode(keys),))
        check = raw.cursor()
        check.execute("SELECT content_sha256 FROM ingest_log WHERE content_sha256 = ANY(%b::text[])", (pg_arrays.encode(sorted(set(shas))),))
        return check

    def _refuse_logged(self, conn: Connection, shas: Sequence[str]) -> None:
        """``AlreadyLogged`` where the ingest log holds any of ``shas``, checked in ``conn``'s transaction
        (see ``write_frames``)."""
        if not shas:
            return
        if self.dialect == "postgresql":
            raw = self._pg(conn)
            with raw.pipeline():
                check = self._logged_cursor(raw, shas)
            found = {row[0] for row in check.fetchall()}
            check.close()
        else:
            found = self._logged(conn, shas)
        if found:
            raise AlreadyLogged(found)

    def _partition_missing(self, exc: Exception, frames: Sequence[tuple[str, pl.DataFrame | Rows]]) -> bool:
        """Whether a write failed for want of a day partition this process believed was there (another process
        dropped it, or the schema was rebuilt): if so, forget what it knew and make them, for one retry."""
        if self.dialect != "postgresql" or "no partition of relation" not in str(exc):
            return False
        partitions.forget_all(self.engine)
        self._partitioned = None
        self._ensure_partitions(frames)
        return True

    def _ensure_partitions(self, frames: Sequence[tuple[str, pl.DataFrame | Rows]]) -> None:
        """PostgreSQL: the day partitions the rows of partitioned tables fall in, created before the write's
        transaction opens (``store.partitions``: creating one locks its parent, which the write must not hold)."""
        if self.dialect != "postgresql":
            return
        if self._partitioned is None:
            self._partitioned = frozenset(t for t in partitions.PARTITIONED if partitions.is_partitioned(self.engine, t))
        for name, data in frames:
            if name not in self._partitioned:
                continue
            tcol = partitions.PARTITIONED[name]
            if isinstance(data, Rows):
                i = data.columns.index(tcol)
                days = {(schema.EPOCH + dt.timedelta(microseconds=us)).date() for us in {row[i] // 86_400_000_000 * 86_400_000_000 for row in data.rows}}
            else:
                days = set(data.get_column(tcol).dt.date().unique().drop_nulls().to_list())
            partitions.ensure_days(self.engine, name, days)

    def _series_known(self, r: Rows) -> bool:
        """Whether this process has the id of every series of these ``metric_sample`` rows."""
        i_series, get = r.columns.index("series"), self._series_cache.get
        return all(get(row[i_series]) is not None for row in r.rows)

    def _metric_rows(self, conn: Connection, r: Rows, new_series: dict[str, int]) -> Rows:
        """``metric_sample`` rows with series keys as ids (series new to this process are looked up or
        created in ``conn``'s transaction), in key order."""
        at = {c: i for i, c in enumerate(r.columns)}
        i_series, i_ts, i_value = at["series"], at["ts"], at["value"]
        get = self._series_cache.get
        missing = sorted({row[i_series] for row in r.rows if get(row[i_series]) is None})
        ids = {}
        if missing:
            fetched = self._series_ids(conn, missing)
            ids = dict(zip(fetched["series"].to_list(), fetched["series_id"].to_list()))
            new_series.update(ids)
        return Rows(("series_id", "ts", "value"), sorted((get(row[i_series]) or ids[row[i_series]], row[i_ts], row[i_value]) for row in r.rows))

    def _changed_counter_readings(self, conn: Connection, events: pl.DataFrame, samples: pl.DataFrame | None) -> tuple[pl.DataFrame, tuple[pl.DataFrame, int] | None]:
        """``events`` without the DCGM fault-counter readings (``dcgm_fields.DCGM_HEALTH_COUNTERS``) that repeat the
        GPU's previous reading of that counter, in this batch (by time, zeros from its ``gpu_sample`` rows
        included, since a zero reading is no event) or as the database has it (``counter_reading``); and the
        readings this write changes there, with their version, written in ``conn``'s transaction and kept by
        this process once it commits. A first reading, a change, a reading after a reset to zero and a null
        value are kept. Other health events (XIDs among them: rules read the repeating last-XID gauge) pass
        unchanged.

        Writers that change readings take turns (PostgreSQL: a transaction advisory lock; SQLite: the store's
        write lock, already held), each deciding on the readings the last one committed, so two processes
        sharing one GPU's pushes decide as one process would. A write that changes nothing takes no lock:
        the newest version is one indexed read, and the copy is brought up to date only when it moved."""
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
        known, version = self._counter_state(conn)
        kept, changes = _counter_decision(events, is_counter, counters, seq, known)
        if changes.height == 0:
            return kept, None
        if self.dialect == "postgresql":
            conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _COUNTER_LOCK_KEY})
            known, version = self._counter_state(conn)  # as the writer before us left them
            kept, changes = _counter_decision(events, is_counter, counters, seq, known)
            if changes.height == 0:
                return kept, None
        version += 1
        t = schema.counter_reading
        ins = (postgresql.insert(t) if self.dialect == "postgresql" else sqlite_dialect.insert(t))
        conn.execute(ins.on_conflict_do_update(index_elements=[t.c.gpu_uuid, t.c.code],
                                               set_={"value": ins.excluded.value, "version": ins.excluded.version}),
                     [{"gpu_uuid": g, "code": c, "value": v, "version": version} for g, c, v in changes.iter_rows()])
        return kept, (changes, version)

    def _counter_state(self, conn: Connection) -> tuple[pl.DataFrame, int]:
        """The counter readings as of the table's newest version: this process's copy, with the rows changed
        since it was taken read in (all of them when the table went back, as when it was emptied)."""
        # on the driver's cursor: SQLAlchemy's statement handling costs more than this one-row index read
        cur = conn.connection.driver_connection.cursor()
        try:
            cur.execute("SELECT MAX(version) FROM counter_reading")
            newest = cur.fetchone()[0] or 0
        finally:
            cur.close()
        with self._counter_lock:
            known, version = self._counter_readings, self._counter_version
        if newest == version:
            return known, version
        since = version if newest > version else 0
        rows = conn.execute(text("SELECT gpu_uuid, code, value FROM counter_reading WHERE version > :v"), {"v": since}).all()
        delta = pl.DataFrame(rows, schema=_COUNTER_SCHEMA, orient="row")
        known = pl.concat([known.join(delta, on=["gpu_uuid", "code"], how="anti"), delta]) if since else delta
        with self._counter_lock:
            if self._counter_version <= newest:
                self._counter_readings, self._counter_version = known, newest
        return known, newest

    def _remember_counter_readings(self, changes: pl.DataFrame, version: int) -> None:
        """After the commit of the change ``version``: the changed readings into this process's copy, where the
        copy was the one that change was decided on (else the next write reads the table's rows in)."""
        with self._counter_lock:
            if self._counter_version == version - 1:
                known = self._counter_readings
                self._counter_readings = pl.concat([known.join(changes, on=["gpu_uuid", "code"], how="anti"), changes])
                self._counter_version = version

    def _write_frame(self, conn: Connection, spec: F.FrameSpec, df: pl.DataFrame, new_series: dict[str, int]) -> int:
        if spec.name == "metric_sample":
            return self._write_metric_samples(conn, df, new_series)
        if spec.name == "gpu":
            return self._write_inventory(conn, spec, df)
        return self._insert(conn, spec.name, df, spec.key, spec.on_conflict)

    def _write_inventory(self, conn: Connection, spec: F.FrameSpec, df: pl.DataFrame) -> int:
        """The gpu upsert, skipped where this process found an equal frame stored and the table's change
        counter has not moved since (``store.inventory``)."""
        before = self._inventory.version(conn)
        if before is not None and self._inventory.unchanged(df, before):
            return 0
        n = self._insert(conn, spec.name, df, spec.key, spec.on_conflict)
        if before is not None and n == 0 and self._inventory.version(conn) == before:
            self._inventory.remember(df, before)
        return n

    def _conflict_sql(self, table: str, cols: Sequence[str], key: Sequence[str], on_conflict: str) -> str:
        """The ON CONFLICT clause of an insert of ``cols`` into ``table`` (``on_conflict`` of its spec)."""
        if on_conflict == "update" and len(cols) > len(key):
            # COALESCE: a source that knows less (nvidia-smi without the rack, say) must not erase what
            # another source told us; a value is replaced only by a value.
            sets = ", ".join(f"{_q(c)} = COALESCE(excluded.{_q(c)}, {_q(table)}.{_q(c)})" for c in cols if c not in key)
            # Only rows that would change are rewritten: a scrape re-sends the whole inventory (16,384 gpu
            # rows a second), and rewriting identical rows cost PostgreSQL a new row version each (0.12 s a
            # scrape, against 0.05 s to compare). The stored result is the same; `written` then counts the
            # rows new or changed, as WriteResult says.
            distinct = "IS NOT" if self.dialect == "sqlite" else "IS DISTINCT FROM"
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

    @staticmethod
    def _pg(conn: Connection) -> Any:
        """PostgreSQL: ``conn``'s psycopg connection, able to send ``pg_arrays``' columns (cursors copy their
        connection's adapters when made, so this comes before any cursor of a write)."""
        from fleetscope.store import pg_arrays  # lazy: psycopg, only against PostgreSQL

        raw = conn.connection.driver_connection
        pg_arrays.register(raw)
        return raw

    @staticmethod
    def _execute_unnest(cur: Any, table: str, rows: Rows, key: Sequence[str], conflict: str) -> None:
        """PostgreSQL: send ``rows`` as one ``INSERT ... SELECT FROM unnest`` of binary arrays on ``cur`` (of a
        connection ``_pg`` prepared)."""
        from fleetscope.store import pg_arrays  # lazy: psycopg, only against PostgreSQL

        params = [pg_arrays.encode(list(col)) for col in zip(*rows.rows)] if rows.rows else [[] for _ in rows.columns]
        cur.execute(_unnest_sql(table, tuple(rows.columns), tuple(key), conflict), params)

    def _insert(self, conn: Connection, table: str, df: pl.DataFrame | Rows, key: Sequence[str], on_conflict: str) -> int:
        cols = list(df.columns)
        if self.dialect == "sqlite" and isinstance(df, pl.DataFrame):
            cols = _sqlite_columns(table, df, key)
        col_sql = ", ".join(_q(c) for c in cols)
        conflict = self._conflict_sql(table, cols, key, on_conflict)
        if self.dialect == "sqlite":
            rows = df.rows if isinstance(df, Rows) else _sqlite_values(df.select(cols))
            placeholders = ", ".join("?" for _ in cols)
            cur = conn.connection.driver_connection.cursor()
            try:
                cur.executemany(f"INSERT INTO {_q(table)} ({col_sql}) VALUES ({placeholders}) {conflict}", rows)
                return max(cur.rowcount, 0)
            finally:
                cur.close()
        if isinstance(df, Rows):
            # A small group (an agent's push or a few): one statement, the columns sent as arrays and
            # unnested, instead of a temp table's create, empty, COPY and INSERT ... SELECT: five round
            # trips a frame become one, and a push's write is mostly round trips.
            with self._pg(conn).cursor() as cur:
                self._execute_unnest(cur, table, df, key, conflict)
                return max(cur.rowcount, 0)
        # One temp table per column list: a session's tables keep the columns they were made with, and
        # writes of one table may carry different columns (all-null ones left out of a group's rows).
        tmp = _q(f"_in_{table}_{zlib.crc32(col_sql.encode()):08x}")
        raw = conn.connection.driver_connection
        if on_conflict != "update" and df.height >= _DIRECT_COPY_ROWS:
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
                    _copy_csv(cur, f"COPY {_q(table)} ({col_sql}) FROM STDIN (FORMAT CSV)", df.sort(list(key)))
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
            _copy_csv(cur, f"COPY {tmp} ({col_sql}) FROM STDIN (FORMAT CSV)", df)
            # In key order, as every writer takes them: two transactions upserting the same keys in different
            # orders (two sources, or overlapping re-sends) each wait for a row the other holds, and one is
            # aborted as a deadlock.
            order = ", ".join(_q(k) for k in key)
            cur.execute(f"INSERT INTO {_q(table)} ({col_sql}) SELECT {col_sql} FROM {tmp} ORDER BY {order} {conflict}")
            return max(cur.rowcount, 0)

    def _write_metric_samples(self, conn: Connection, df: pl.DataFrame, new_series: dict[str, int]) -> int:
        keys = df.get_column("series").unique().to_list()
        get = self._series_cache.get
        # One lookup per key, and the frame built by columns: a scrape maps 32,768 keys every second.
        ids = pl.DataFrame({"series_id": [get(k) for k in keys], "series": keys}, schema={"series_id": pl.Int64, "series": pl.String})
        missing = ids.filter(pl.col("series_id").is_null())["series"].to_list()
        if missing:
            fetched = self._series_ids(conn, missing)
            new_series.update(zip(fetched["series"].to_list(), fetched["series_id"].to_list()))
            ids = pl.concat([ids.filter(pl.col("series_id").is_not_null()), fetched])
        mapped = df.join(ids, on="series", how="left").select("series_id", "ts", "value")
        # In key order the inserts walk the (series_id, ts) index and PostgreSQL's per-row foreign-key
        # checks walk `series` page by page instead of at random: A/B over 16 scrapes of 16,384 GPUs,
        # PostgreSQL's CPU per write 0.43 s -> 0.37 s and SQLite's 0.45 s -> 0.38 s.
        mapped = mapped.sort("series_id", "ts")
        return self._insert(conn, "metric_sample", mapped, ("series_id", "ts"), "ignore")

    def _series_ids(self, conn: Connection, keys: list[str]) -> pl.DataFrame:
        # In one order for every writer: two transactions creating the same new series in different orders
        # each wait for a key the other holds, and PostgreSQL aborts one as a deadlock.
        keys = sorted(keys)
        names = [k.split("{", 1)[0] for k in keys]
        if self.dialect == "sqlite":
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

            with self._pg(conn).cursor() as cur:
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

    def _log_ingest(self, conn: Connection, entries: list[tuple[str, str | None, dict[str, int], int]]) -> None:
        at = dt.datetime.now(dt.UTC)
        if self.dialect == "postgresql":
            # One statement on the driver's cursor, rows in their order: SQLAlchemy's executemany of a group's
            # rows cost the writer more than the rows' own insert.
            from fleetscope.store import pg_arrays  # lazy: psycopg, only against PostgreSQL

            raw = self._pg(conn)
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

    # --- reading -----------------------------------------------------------------------------

    def read(
        self,
        frame: str,
        *,
        start: dt.datetime | None = None,
        end: dt.datetime | None = None,
        job_id: str | Iterable[str] | None = None,
        host: str | Iterable[str] | None = None,
        gpu_uuid: str | Iterable[str] | None = None,
        columns: Sequence[str] | None = None,
        limit: int | None = None,
    ) -> pl.DataFrame:
        """Rows of one canonical frame as a polars frame with canonical dtypes.

        ``start``/``end`` bound the frame's time column (``start <= t < end``); ``job_id``, ``host`` and
        ``gpu_uuid`` filter where the frame has that column. For ``gpu_sample`` a ``job_id`` selects the
        samples of the GPUs the job's ranks held, each only while its rank held it, and adds
        ``job_id`` and ``rank`` columns.
        """
        if frame not in schema.FRAME_SPECS:
            raise ValueError(f"unknown frame {frame!r}: expected one of {', '.join(schema.FRAME_SPECS)}")
        spec = schema.FRAME_SPECS[frame]
        want = list(columns) if columns else list(spec.names)
        bad = [c for c in want if c not in spec.schema]
        if bad:
            raise ValueError(f"{frame} has no column {bad[0]!r}")
        out_schema = {c: spec.schema[c] for c in want}
        tcol = schema.TIME_COLUMN.get(frame, "")
        where: list[str] = []
        params: list[Any] = []
        alias = "t"
        joins = ""
        select_cols = [f"{alias}.{_q(c)}" for c in want]
        if frame == "metric_sample":
            joins = " JOIN series s ON s.series_id = t.series_id"
            select_cols = [("s.series" if c == "series" else f"t.{_q(c)}") for c in want]
        job_ids, hosts, gpus = _as_list(job_id), _as_list(host), _as_list(gpu_uuid)
        assignments = None
        if frame == "gpu_sample" and job_ids is not None:
            joins = (
                ' JOIN job_rank r ON r.gpu_uuid = t.gpu_uuid AND t.ts >= r."start" AND (r."end" IS NULL OR t.ts < r."end")'
            )
            where.append(self._in("r.job_id", job_ids, params))
            out_schema = {"job_id": pl.String, "rank": pl.Int64, **out_schema}
            if self.dialect == "sqlite":
                # Every row would otherwise carry two strings (job id, GPU UUID) that the stdlib driver
                # builds one Python object each for: a third of the read's time. The job_rank rowid stands
                # in for the three columns, joined back from the (small) assignments frame afterwards.
                select_cols = ["r.rowid AS _assignment", *(c for c in select_cols if c != "t.gpu_uuid")]
                assignments = (job_ids, "gpu_uuid" in want)
            else:
                select_cols = ["r.job_id", "r.rank", *select_cols]
            job_ids = None
        i_start = i_end = -1
        if tcol and start is not None:
            where.append(f"{alias}.{_q(tcol)} >= ?")
            i_start = len(params)
            params.append(self._time_param(start))
        if tcol and end is not None:
            where.append(f"{alias}.{_q(tcol)} < ?")
            i_end = len(params)
            params.append(self._time_param(end))
        for colname, values in (("job_id", job_ids), ("host", hosts), ("gpu_uuid", gpus)):
            if values is None:
                continue
            if colname not in spec.schema:
                raise ValueError(f"{frame} cannot be filtered by {colname}")
            where.append(self._in(f"{alias}.{_q(colname)}", values, params))
        # raw GPU samples of packed days are read back from their arrays (store.packed)
        table = packed.source(self.dialect, start, end, want, alias) if frame == packed.RAW else f"{_q(frame)} {alias}"
        source = f" FROM {table}{joins}" + (" WHERE " + " AND ".join(where) if where else "")
        sql = f"SELECT {', '.join(select_cols)}{source}"
        order = list(dict.fromkeys(c for c in (tcol, *spec.key) if c and c in want))
        # Without a LIMIT, polars sorts the result (in parallel, after the fact) faster than SQLite's
        # temporary B-tree; both order NULLs first and strings bytewise, so the order is the same.
        sort_after = limit is None and self.dialect == "sqlite"
        if order and not sort_after:
            sql += " ORDER BY " + ", ".join(f"{alias}.{_q(c)}" if c != "series" else "s.series" for c in order)
        if limit is not None:
            sql += f" LIMIT {int(limit)}"
        with tracer().start_as_current_span("store.read") as span:
            span.set_attribute("fleetscope.frame", frame)
            fetch_schema = out_schema if assignments is None else {"_assignment": pl.Int64, **{c: out_schema[c] for c in want if c != "gpu_uuid"}}
            df = None
            if sort_after and frame in _PARALLEL_FRAMES and i_start >= 0 and i_end >= 0:
                df = self._fetch_sqlite_parallel(sql, source, params, i_start, i_end, fetch_schema)
            if df is None:
                df = self._fetch(sql, params, fetch_schema)
            if assignments is not None:
                df = self._with_assignments(df, *assignments).select(list(out_schema))
            return df.sort(order) if order and sort_after else df

    def _fetch_sqlite_parallel(self, sql: str, source: str, params: list[Any], i_start: int, i_end: int,
                               out_schema: dict[str, pl.DataType]) -> pl.DataFrame | None:
        """A large time-bounded read split into equal time slices, one per reader process
        (fleetscope.store.sqlite_reader); None when the database is not a file, the result is small, or no pool
        can run here."""
        path = self.engine.url.database
        if not path or path == ":memory:" or sqlite_reader.WORKERS < 2:
            return None
        bound = [_epoch_us(p) if isinstance(p, dt.datetime) else p for p in params]
        with self.engine.connect() as conn:
            rows = conn.connection.driver_connection.execute(f"SELECT count(*){source}", bound).fetchone()[0]
        if rows < sqlite_reader.MIN_ROWS:
            return None
        lo, hi = bound[i_start], bound[i_end]
        n = sqlite_reader.WORKERS
        edges = [lo + (hi - lo) * k // n for k in range(n)] + [hi]
        parts = []
        for a, b in zip(edges, edges[1:]):
            if b > a:
                p = list(bound)
                p[i_start], p[i_end] = a, b
                parts.append((sql, p))
        df = sqlite_reader.fetch_parts(path, parts, _storage_dtypes(out_schema))
        return None if df is None else self._conform(df, out_schema)

    def _with_assignments(self, df: pl.DataFrame, job_ids: list[str], with_gpu: bool) -> pl.DataFrame:
        """Replace the ``_assignment`` rowids of a SQLite job read by the job_rank columns they stand for."""
        params: list[Any] = []
        keys = self._fetch(f"SELECT rowid AS _assignment, job_id, rank, gpu_uuid FROM job_rank WHERE {self._in('job_id', job_ids, params)}",
                           params, {"_assignment": pl.Int64, "job_id": pl.String, "rank": pl.Int64, "gpu_uuid": pl.String})
        if not with_gpu:
            keys = keys.drop("gpu_uuid")
        return df.join(keys, on="_assignment", how="left", maintain_order="left").drop("_assignment")

    def _in(self, column: str, values: list[str], params: list[Any]) -> str:
        if not values:
            return "1 = 0"
        params.extend(values)
        return f"{column} IN ({', '.join('?' for _ in values)})"

    def _time_param(self, value: dt.datetime) -> Any:
        return as_utc(value)

    def query(self, sql: str, params: Sequence[Any] = (), schema_: dict[str, pl.DataType] | None = None) -> pl.DataFrame:
        """Run a read-only SQL statement with ``?`` placeholders; timestamp columns named in ``schema_``
        come back as UTC datetimes on both databases."""
        return self._fetch(sql, list(params), schema_ or {})

    def _fetch(self, sql: str, params: list[Any], out_schema: dict[str, pl.DataType]) -> pl.DataFrame:
        if self.dialect == "sqlite":
            df = self._fetch_sqlite(sql, params, out_schema)
        else:
            df = self._fetch_postgres(sql, params)
        return self._conform(df, out_schema)

    @staticmethod
    def _conform(df: pl.DataFrame, out_schema: dict[str, pl.DataType]) -> pl.DataFrame:
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

    def _fetch_sqlite(self, sql: str, params: list[Any], out_schema: dict[str, pl.DataType]) -> pl.DataFrame:
        # Only the stdlib driver may open the file: a second SQLite library in the same process (as
        # bundled by connectorx or ADBC) does not see this one's POSIX locks and can truncate a live WAL
        # (sqlite.org/howtocorrupt.html, "multiple copies of SQLite"); we saw exactly that in testing.
        with self.engine.connect() as conn:
            cur = conn.connection.driver_connection.cursor()
            try:
                cur.execute(sql, [_epoch_us(p) if isinstance(p, dt.datetime) else p for p in params])
                names = [d[0] for d in cur.description]
                rows = cur.fetchall()
            finally:
                cur.close()
        return sqlite_reader.frame_from_rows(names, rows, _storage_dtypes(out_schema))

    def _fetch_postgres(self, sql: str, params: list[Any]) -> pl.DataFrame:
        # connectorx streams PostgreSQL's binary protocol into Arrow in Rust: measured about 2x faster
        # than COPY TO CSV for an hour of a 256-GPU job (benchmarks/store_write.py). It takes no bound
        # parameters, so values are inlined as escaped literals.
        import connectorx as cx  # lazy: connectorx, only for PostgreSQL bulk reads

        url = self.reader.url.set(drivername="postgresql").render_as_string(hide_password=False)
        df = pl.from_arrow(cx.read_sql(url, _bind(sql, params), return_type="arrow"))
        assert isinstance(df, pl.DataFrame)
        return df

    # --- small helpers the service layer uses ------------------------------------------------------

    def counts(self) -> dict[str, int]:
        """Row count of every canonical table (cheap enough for the demo and tests, not for dashboards)."""
        out = {}
        with self.reader.connect() as conn:
            for name in F.FRAMES:
                out[name] = int(conn.execute(text(f"SELECT COUNT(*) FROM {_q(name)}")).scalar_one())
            if self.dialect == "postgresql":  # with the samples of packed days (store.packed)
                out[packed.RAW] += int(conn.execute(text(f"SELECT COALESCE(SUM(samples), 0) FROM {packed.TABLE}")).scalar_one())
        return out

    def _logged(self, conn: Connection, shas: Sequence[str]) -> set[str]:
        found: set[str] = set()
        # On the driver's cursor: SQLAlchemy's statement building cost more than the query (one per group).
        mark = "?" if self.dialect == "sqlite" else "%s"
        cur = conn.connection.driver_connection.cursor()
        try:
            for i in range(0, len(shas), 500):
                chunk = list(shas[i : i + 500])
                cur.execute(f"SELECT content_sha256 FROM ingest_log WHERE content_sha256 IN ({', '.join(mark for _ in chunk)})", chunk)
                found.update(r[0] for r in cur.fetchall())
        finally:
            cur.close()
        return found

    def ingested(self, shas: Sequence[str]) -> set[str]:
        """Which of these content hashes the ingest log holds."""
        with self.engine.connect() as conn:
            return self._logged(conn, shas)


class _SqliteWriteLock:
    """This process's threads, then the processes sharing the database file, one writer at a time."""

    def __init__(self, database: str | None):
        self._thread = threading.Lock()
        self._path = f"{database}-writelock" if database and database != ":memory:" else None
        self._fd: int | None = None

    def __enter__(self) -> None:
        self._thread.acquire()
        if self._path is None:
            return
        try:
            if self._fd is None:
                self._fd = os.open(self._path, os.O_RDWR | os.O_CREAT, 0o600)
            fcntl.flock(self._fd, fcntl.LOCK_EX)
        except OSError:
            # A read-only folder, say: SQLite's own busy handler still keeps writers apart.
            self._path = None

    def __exit__(self, *exc: object) -> None:
        try:
            if self._path is not None and self._fd is not None:
                fcntl.flock(self._fd, fcntl.LOCK_UN)
        finally:
            self._thread.release()


def content_hash(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _db_ready(df: pl.DataFrame) -> pl.DataFrame:
    """Timestamps as epoch µs and booleans as 0/1: the shape both databases take without conversion."""
    exprs = []
    for name, dtype in df.schema.items():
        if isinstance(dtype, pl.Datetime):
            exprs.append(pl.col(name).dt.epoch("us"))
        elif dtype == pl.Boolean:
            exprs.append(pl.col(name).cast(pl.Int64))
    return df.with_columns(exprs) if exprs else df


# Telemetry frames whose hour-long reads are large enough to split across reader processes.
_PARALLEL_FRAMES = frozenset({"gpu_sample", "metric_sample", "collective", "step"})


def _storage_dtypes(out_schema: dict[str, pl.DataType]) -> dict[str, pl.DataType | None]:
    """How SQLite stores each canonical dtype: timestamps as epoch microseconds, booleans as 0/1."""
    return {name: pl.Int64 if dtype in (F.UTC_US, pl.Boolean) else dtype for name, dtype in out_schema.items()}


def _literal(value: Any) -> str:
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


def _bind(sql: str, params: Sequence[Any]) -> str:
    parts = sql.split("?")
    if len(parts) - 1 != len(params):
        raise ValueError(f"statement has {len(parts) - 1} placeholders, {len(params)} values given")
    out = [parts[0]]
    for value, rest in zip(params, parts[1:]):
        out.append(_literal(value))
        out.append(rest)
    return "".join(out)


def _sqlite_columns(table: str, df: pl.DataFrame, key: Sequence[str]) -> list[str]:
    """The columns worth binding: a column null in every row of the batch (a dcgm field the exporter does
    not export) is left out, which stores the same NULL and, on conflict, leaves the stored value alone as
    COALESCE would. Binding dozens of NULLs per row costs sqlite3's executemany more than the values
    themselves: a 10-field frame of the 43-column gpu_sample writes about 3x faster. Columns with a server
    default keep their NULL (leaving them out would store the default instead)."""
    t = schema.metadata.tables.get(table)
    defaulted = {c.name for c in t.columns if c.server_default is not None} if t is not None else set(df.columns)
    nulls = df.null_count().row(0, named=True)
    return [c for c in df.columns if c in key or c in defaulted or nulls[c] < df.height]


def _sqlite_values(df: pl.DataFrame) -> Iterable[tuple[Any, ...]]:
    return _db_ready(df).iter_rows()


def _copy_csv(cur: Any, statement: str, df: pl.DataFrame) -> None:
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

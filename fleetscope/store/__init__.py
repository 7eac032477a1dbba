"""The store: writes Batches atomically and idempotently, reads canonical frames back as polars.

Writes take the fast path docs/ARCHITECTURE.md measured: wide rows, one transaction per Batch, ``executemany``
of plain tuples on SQLite and ``COPY`` on PostgreSQL (into a session temp table, then one
``INSERT ... SELECT ... ON CONFLICT`` so that re-sent rows are skipped rather than failing the COPY).
Every frame is validated against its canonical spec before the transaction opens, so a bad row
rejects the whole Batch and leaves the database as it was.

Reads go around the ORM: timestamps travel as integer microseconds and polars builds the frame,
which is an order of magnitude faster than materialising one Python datetime per value.

The write machinery lives beside this module: ``store.writing`` (what a write takes and gives back),
``store.sql`` (SQL text), ``store.pg_write`` (the PostgreSQL path), ``store.ingest_log``,
``store.counters`` (fault-counter memory) and ``store.sqlite_wal`` (SQLite's write lock and checkpoints).
"""

from __future__ import annotations

import contextlib
import contextvars
import datetime as dt
import sys
import time
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import polars as pl
from sqlalchemy import Connection, Engine, event, text
from sqlalchemy.exc import DBAPIError, OperationalError

from fleetscope.core.units import as_utc
from fleetscope.core import frames as F
from fleetscope.core import hashing
from fleetscope.store import schema
from fleetscope.store import partitions
from fleetscope.store.inventory import InventoryMemory, InventoryMoved
from fleetscope.store import gpu_keys, packed, packed_energy
from fleetscope.store.gpu_keys import GpuKeys
from fleetscope.store import sqlite_reader
from fleetscope.store import ingest_log as _ingest_log
from fleetscope.store import pg_read, pg_write
from fleetscope.store.series import series_ids
from fleetscope.store.counters import CounterMemory
from fleetscope.core.errors import ValidationError
from fleetscope.observability import BATCHES_REJECTED, ROWS_WRITTEN, VALUES_WRITTEN, tracer
from fleetscope.store.db import make_engine
from fleetscope.store.sql import bind as _bind, epoch_us as _epoch_us, quote as _q
from fleetscope.store.sql import bound_columns, conflict_sql, conform, sqlite_values, storage_dtypes
from fleetscope.store.sqlite_wal import IDLE_CHECKPOINT_S, SqliteWriteLock, checkpointer
from fleetscope.store.writing import AlreadyLogged, LogRows, Rows, WriteResult

__all__ = ["AlreadyLogged", "IDLE_CHECKPOINT_S", "LogRows", "Rows", "Store", "WriteResult", "content_hash", "reads_on_replica"]


def _as_list(value: str | Iterable[str] | None) -> list[str] | None:
    if value is None:
        return None
    if isinstance(value, str):
        return [value]
    return list(value)


JOB_GPU_FILTER_MAX = 20_000
"""Most GPUs a job's raw-sample read lists as a filter (PostgreSQL takes 65,535 parameters a statement)."""


def _job_span(ranks: pl.DataFrame, start: dt.datetime | None,
              end: dt.datetime | None) -> tuple[dt.datetime | None, dt.datetime | None, list[str]]:
    """``[start, end)`` narrowed to when the jobs' ranks (``Store._job_ranks``) held GPUs, and those GPUs: a job's
    samples are joined to its ranks after the packed hours are unpacked, so a read of a job with no range would
    unpack every packed day kept (one that ran an hour last month, a month), and every GPU of the fleet in the
    job's hours."""
    if not ranks.height:  # no ranks: nothing to read, over an empty range
        first = as_utc(start) if start is not None else dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
        return first, first, []
    lo, hi = ranks["start"].min(), ranks["end"].max()
    start = lo if start is None else max(as_utc(start), lo)
    if not ranks["end"].null_count() and hi is not None:
        end = hi if end is None else min(as_utc(end), hi)
    return start, end, sorted(ranks["gpu_uuid"].drop_nulls().unique().to_list())


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


def _wrapped(exc: Exception) -> Exception:
    """``exc`` as its callers meet the database's errors: a driver's own ``OperationalError`` (rows go by the drivers'
    cursors, whose errors come unwrapped: sqlite3's "database is locked" after the busy timeout, psycopg's lost
    connection) as SQLAlchemy's, which the API answers 503 with Retry-After; anything else as it is."""
    if isinstance(exc, DBAPIError):
        return exc
    import sqlite3  # lazy: only to classify an error

    psycopg = sys.modules.get("psycopg")  # loaded where PostgreSQL is used
    if isinstance(exc, sqlite3.OperationalError) or (psycopg is not None and isinstance(exc, psycopg.OperationalError)):
        return OperationalError("store write", None, exc)  # type: ignore[arg-type]
    return exc


PACKED_UNTIL_TTL_S = 5.0
"""How long a process trusts its reading of ``Store.packed_until``."""


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
        # The series column of the last metric_sample frame whose every key had a committed id, and those ids
        # row by row: a scrape lists the same series in the same order every time, so one compare of the
        # column stands in for the lookups, the frame and the join (0.02-0.03 CPU-s a 16,384-GPU scrape).
        self._series_column: tuple[pl.Series, pl.Series] | None = None
        # the last reading of each GPU's DCGM fault counters, so a repeated one is no new event (store.counters)
        self._counters = CounterMemory(self.dialect)
        # gpu inventory frames found stored, so an unchanged one is not upserted again (store.inventory)
        self._inventory = InventoryMemory(self.dialect)
        # PostgreSQL's integer GPU ids of raw samples this process has met (store.gpu_keys)
        self._gpu_keys = GpuKeys()
        # which raw tables are partitioned (PostgreSQL, store.partitions): looked up on the first write
        self._partitioned: frozenset[str] | None = None
        self._packed_until: dict[int, tuple[float, dt.datetime | None]] = {}  # per engine: (when read, monotonic; the value)
        # SQLite takes one writer at a time. Writers queue here, and the next one starts the moment the
        # last commits, rather than in SQLite's busy handler, which polls with sleeps of up to 100 ms:
        # threads of this process on a lock, other processes (API workers, the worker, the CLI) on an
        # advisory lock of the database file's, which the kernel hands on at once.
        self._write_lock: Any = SqliteWriteLock(engine.url.database) if engine.dialect.name == "sqlite" else contextlib.nullcontext()
        if self.dialect not in ("sqlite", "postgresql"):
            raise ValueError(f"unsupported database {self.dialect!r}: use SQLite or PostgreSQL")
        if self.dialect == "postgresql" and not event.contains(engine, "connect", pg_write.on_connect):
            event.listen(engine, "connect", pg_write.on_connect)

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
        thread, stop, self._wal_dirty = checkpointer(path, self, interval_s)
        self._checkpointer = (thread, stop)
        thread.start()

    def stop_checkpointing(self) -> None:
        """Stop the thread ``checkpoint_in_background`` started, after one last checkpoint."""
        found = getattr(self, "_checkpointer", None)
        if found is not None:
            thread, stop = found
            stop.set()
            self._wal_dirty.set()  # wake it from its idle wait, which the stop event alone does not end
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
                        self._gpu_keys.begin()
                        events = next((df for spec, df in conformed if spec.name == "health_event"), None)
                        samples = next((df for spec, df in conformed if spec.name == "gpu_sample"), None)
                        counted = events is not None or self._counters.resets(conn, samples)
                        newest = self._refuse_logged(conn, unless_logged, counters=counted)
                        todo = conformed
                        if counted:
                            # first in the transaction: a writer waiting for the counters' lock holds no row lock
                            changed, readings = self._counters.changed(conn, events if events is not None else F.HEALTH_EVENT.empty(), samples, newest)
                            todo = [(spec, changed if spec.name == "health_event" else df) for spec, df in conformed]
                            todo = [(spec, df) for spec, df in todo if df.height]
                        for spec, df in todo:
                            result.written[spec.name] = self._write_frame(conn, spec, df, new_series)
                        entries = ingest_log(result) if ingest_log is not None else [(source, content_sha256, result.written, result.values)]
                        self._log_ingest(conn, entries)
                    break
                except Exception as exc:  # noqa: BLE001 - re-raised unless a day partition was missing (SQLAlchemy wraps it; the raw driver cursor does not)
                    if attempt or not self._partition_missing(exc, [(spec.name, df) for spec, df in conformed]):
                        raise _wrapped(exc)
                    new_series.clear()
            if readings is not None:
                self._counters.remember(*readings)
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
        self._gpu_keys.commit()
        for name, n in result.written.items():
            ROWS_WRITTEN.labels(name).inc(n)
        VALUES_WRITTEN.inc(result.values)
        span.set_attribute("fleetscope.rows", sum(result.written.values()))

    def write_rows(self, frames: Sequence[tuple[F.FrameSpec, Rows]], *, ingest_log: LogRows, values: int = 0,
                   unless_logged: Sequence[str] = ()) -> WriteResult:
        """Write frames given as ``Rows`` in one transaction, all or nothing, as ``write_frames`` does (with its
        ``unless_logged`` check), without conforming them: the caller vouches for their types and keys. Health
        events are kept or dropped by the fault-counter memory as ``write_frames`` keeps them
        (``CounterMemory.changed_rows``)."""
        with tracer().start_as_current_span("store.write") as span:
            span.set_attribute("db.system", self.dialect)
            unknown = [spec.name for spec, _ in frames if spec.name not in schema.FRAME_SPECS]
            if unknown:
                raise ValueError(f"no table for frame {unknown[0]!r}")
            frames = [(spec, r) for spec, r in frames if r.rows]
            result = WriteResult(offered={spec.name: len(r.rows) for spec, r in frames}, values=values)
            self._ensure_partitions([(spec.name, r) for spec, r in frames])
            new_series: dict[str, int] = {}
            health = next((r for spec, r in frames if spec.name == "health_event"), None)
            samples = next((r for spec, r in frames if spec.name == "gpu_sample"), None)
            for attempt in (0, 1):
                confirm = None  # gpu rows to remember as stored once committed (store.inventory.InventoryRows)
                readings = None
                try:
                    with self._write_lock, self.engine.begin() as conn:
                        self._gpu_keys.begin()
                        todo, shas = frames, unless_logged
                        if health is not None or self._counters.resets(conn, samples):
                            # the check, then the counters, first in the transaction, as write_frames has them
                            newest = self._refuse_logged(conn, shas, counters=True)
                            shas = ()
                            events = health if health is not None else Rows(F.HEALTH_EVENT.names, [])
                            kept, readings = self._counters.changed_rows(conn, events, samples, newest)
                            todo = [(spec, kept if r is health else r) for spec, r in frames]
                            todo = [(spec, r) for spec, r in todo if r.rows]
                        if self.dialect == "postgresql":
                            confirm = pg_write.write_rows_pipelined(self, conn, todo, result, new_series, shas)
                        else:
                            self._refuse_logged(conn, shas)
                            for spec, r in todo:
                                if spec.name == "metric_sample":
                                    result.written[spec.name] = self._insert(conn, "metric_sample", self._metric_rows(conn, r, new_series),
                                                                             ("series_id", "ts"), "ignore")
                                elif spec.name == "gpu":
                                    result.written["gpu"], confirm = self._inventory.upsert_rows(
                                        conn, r, lambda r=r, spec=spec: self._insert(conn, "gpu", r, spec.key, spec.on_conflict))
                                else:
                                    result.written[spec.name] = self._insert(conn, spec.name, r, spec.key, spec.on_conflict)
                        self._log_ingest(conn, ingest_log(result))
                    break
                except InventoryMoved:
                    # rolled back: sent again with the gpu rows' upsert, which the memory had left out
                    if attempt:
                        raise
                    self._inventory.rows.forget()
                    new_series.clear()
                    result.written.clear()
                except Exception as exc:  # noqa: BLE001 - re-raised unless a day partition was missing (SQLAlchemy wraps it; the raw driver cursor does not)
                    if attempt or not self._partition_missing(exc, [(spec.name, r) for spec, r in frames]):
                        raise _wrapped(exc)
                    new_series.clear()
            if confirm is not None:
                self._inventory.rows.confirm(*confirm)
            if readings is not None:
                self._counters.remember(*readings)
            self._committed(result, new_series, span)
            return result

    def _refuse_logged(self, conn: Connection, shas: Sequence[str], counters: bool = False) -> int | None:
        """``AlreadyLogged`` where the ingest log holds any of ``shas``, in ``conn``'s transaction (store.ingest_log);
        with ``counters``, the fault counters' newest version where it was read with the check."""
        return _ingest_log.refuse_logged(conn, self.dialect, shas, counters)

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
            fetched = series_ids(conn, self.dialect, missing)
            ids = dict(zip(fetched["series"].to_list(), fetched["series_id"].to_list()))
            new_series.update(ids)
        return Rows(("series_id", "ts", "value"), sorted((get(row[i_series]) or ids[row[i_series]], row[i_ts], row[i_value]) for row in r.rows))

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

    def _insert(self, conn: Connection, table: str, df: pl.DataFrame | Rows, key: Sequence[str], on_conflict: str) -> int:
        if table == gpu_keys.RAW and self.dialect == "postgresql":
            # keyed by integer GPU id there (store.gpu_keys): a frame is mapped to ids here, rows probe theirs in SQL
            if isinstance(df, Rows):
                with pg_write.pg(conn).cursor() as cur:
                    self._gpu_keys.send_new(cur, df)
            else:
                df = self._gpu_keys.keyed(pg_write.pg(conn), df)
            key = gpu_keys.physical(table, (), key)[1]
        cols = list(df.columns)
        if isinstance(df, pl.DataFrame):
            cols = bound_columns(table, df, key)
            df = df.select(cols) if len(cols) < df.width else df
        col_sql = ", ".join(_q(c) for c in cols)
        conflict = conflict_sql(self.dialect, table, gpu_keys.physical(table, cols, key)[0] if self.dialect == "postgresql" else cols, key, on_conflict)
        if self.dialect == "sqlite":
            rows = df.rows if isinstance(df, Rows) else sqlite_values(df)
            placeholders = ", ".join("?" for _ in cols)
            cur = conn.connection.driver_connection.cursor()
            try:
                cur.executemany(f"INSERT INTO {_q(table)} ({col_sql}) VALUES ({placeholders}) {conflict}", rows)
                return max(cur.rowcount, 0)
            finally:
                cur.close()
        if isinstance(df, Rows):
            return pg_write.insert_rows(conn, table, df, key, conflict)
        return pg_write.insert_frame(conn, table, df, key, on_conflict, conflict)

    def _write_metric_samples(self, conn: Connection, df: pl.DataFrame, new_series: dict[str, int]) -> int:
        column = df.get_column("series")
        last = self._series_column
        if last is not None and last[0].len() == column.len() and last[0].equals(column):
            mapped = pl.DataFrame([last[1], df.get_column("ts"), df.get_column("value")])
        else:
            keys = column.unique().to_list()
            get = self._series_cache.get
            # One lookup per key, and the frame built by columns: a scrape maps 32,768 keys every second.
            ids = pl.DataFrame({"series_id": [get(k) for k in keys], "series": keys}, schema={"series_id": pl.Int64, "series": pl.String})
            missing = ids.filter(pl.col("series_id").is_null())["series"].to_list()
            if missing:
                fetched = series_ids(conn, self.dialect, missing)
                new_series.update(zip(fetched["series"].to_list(), fetched["series_id"].to_list()))
                ids = pl.concat([ids.filter(pl.col("series_id").is_not_null()), fetched])
            mapped = df.join(ids, on="series", how="left", maintain_order="left").select("series_id", "ts", "value")
            if not missing:
                # Only ids committed before this write: remembered whatever becomes of it.
                self._series_column = (column, mapped.get_column("series_id"))
        # In key order the inserts walk the (series_id, ts) index page by page instead of at random: A/B
        # over 16 scrapes of 16,384 GPUs (with the foreign key to `series` that migration 0022 dropped),
        # PostgreSQL's CPU per write 0.43 s -> 0.37 s and SQLite's 0.45 s -> 0.38 s.
        mapped = mapped.sort("series_id", "ts")
        return self._insert(conn, "metric_sample", mapped, ("series_id", "ts"), "ignore")

    def _log_ingest(self, conn: Connection, entries: list[tuple[str, str | None, dict[str, int], int]]) -> None:
        """The ingest log's rows of a write, in its transaction (store.ingest_log)."""
        _ingest_log.log(conn, self.dialect, entries)

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
        small: bool = False,
    ) -> pl.DataFrame:
        """Rows of one canonical frame as a polars frame with canonical dtypes.

        ``start``/``end`` bound the frame's time column (``start <= t < end``); ``job_id``, ``host`` and
        ``gpu_uuid`` filter where the frame has that column. For ``gpu_sample`` a ``job_id`` selects the
        samples of the GPUs the job's ranks held, each only while its rank held it, and adds
        ``job_id`` and ``rank`` columns. ``small``: the caller expects at most some thousands of rows (a job's
        ranks, an inventory lookup, a job's rows since a watermark), which PostgreSQL then sends over a pooled
        connection (``store.pg_read``); a result past ``pg_read.SMALL_ROWS`` is read again the bulk way.
        """
        if frame not in schema.FRAME_SPECS:
            raise ValueError(f"unknown frame {frame!r}: expected one of {', '.join(schema.FRAME_SPECS)}")
        if frame == packed.RAW and job_id is not None and self.dialect == "postgresql":
            ranks = self._job_ranks(_as_list(job_id) or [])
            start, end, job_gpus = _job_span(ranks, start, end)
            # the join to the ranks comes after the unpacking: the packed arm is confined to the jobs' GPUs first (a
            # list of them within a statement's parameters; past that the join alone confines the rows)
            if gpu_uuid is None and len(job_gpus) <= JOB_GPU_FILTER_MAX:
                if limit is None:
                    return self._job_samples(ranks, start, end, job_gpus, host, columns, small)
                gpu_uuid = job_gpus
        # windows hold a range's first rows only where the rows are ordered by time first (the time column asked)
        filters = dict(job_id=job_id, host=host, gpu_uuid=gpu_uuid, columns=columns, small=small)
        if (limit is not None and self.dialect == "postgresql" and frame in (packed.RAW, packed_energy.RAW)
                and (not columns or schema.TIME_COLUMN[frame] in columns)):
            return self._read_oldest(frame, start, end, limit, filters)
        return self._read(frame, start=start, end=end, limit=limit, **filters)

    def _read(
        self,
        frame: str,
        *,
        start: dt.datetime | None,
        end: dt.datetime | None,
        job_id: str | Iterable[str] | None,
        host: str | Iterable[str] | None,
        gpu_uuid: str | Iterable[str] | None,
        columns: Sequence[str] | None,
        limit: int | None,
        small: bool,
    ) -> pl.DataFrame:
        """``read`` as one statement: a job's span and GPUs already narrowed, no windows."""
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
        # the packed frames' sources apply the range themselves (an outer filter spoils PostgreSQL's estimate);
        # SQLite's raw samples keep the outer filter too, which its parallel read slices by
        filtered = bool(tcol) and frame != packed_energy.RAW and not (frame == packed.RAW and self.dialect == "postgresql")
        if filtered and start is not None:
            where.append(f"{alias}.{_q(tcol)} >= ?")
            i_start = len(params)
            params.append(self._time_param(start))
        if filtered and end is not None:
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
        # and the energy minutes of packed days from theirs (store.packed_energy)
        if frame == packed.RAW:
            # SQLite: the outer filter holds the range, which its parallel read slices (a range inside the source too
            # would have each slice's reader seek by the whole range's bounds)
            table = (packed.source(self.dialect, start, end, want, alias, self.packed_until()) if self.dialect == "postgresql"
                     else packed.source(self.dialect, None, None, want, alias))
        elif frame == packed_energy.RAW:
            table = packed_energy.source(self.dialect, start, end, alias)
        else:
            table = f"{_q(frame)} {alias}"
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
            if df is None and small and self.dialect == "postgresql" and (limit is None or limit <= pg_read.SMALL_ROWS):
                probe = sql + (f" LIMIT {pg_read.SMALL_ROWS + 1}" if limit is None else "")
                df = conform(pg_read.fetch_pooled(self.reader, _bind(probe, params), fetch_schema), fetch_schema)
                df = df if df.height <= pg_read.SMALL_ROWS else None
            if df is None:
                df = self._fetch(sql, params, fetch_schema)
            if assignments is not None:
                df = self._with_assignments(df, *assignments).select(list(out_schema))
            return df.sort(order) if order and sort_after else df

    def _job_ranks(self, job_ids: list[str]) -> pl.DataFrame:
        """The jobs' rank assignments: ``job_id, rank, gpu_uuid, start, end``."""
        marks = ", ".join("?" for _ in job_ids) or "NULL"
        return self.query(f'SELECT r.job_id, r.rank, r.gpu_uuid, r."start", r."end" FROM job_rank r WHERE r.job_id IN ({marks})',
                          list(job_ids), {"job_id": pl.String, "rank": pl.Int64, "gpu_uuid": pl.String, "start": F.UTC_US, "end": F.UTC_US})

    def _job_samples(self, ranks: pl.DataFrame, start: dt.datetime | None, end: dt.datetime | None, gpus: list[str],
                     host: str | Iterable[str] | None, columns: Sequence[str] | None, small: bool) -> pl.DataFrame:
        """A job read of raw samples on PostgreSQL: the jobs' GPUs' samples in ``[start, end)``, each kept while a
        rank held its GPU, with that rank's ``job_id`` and ``rank``. The ranks are joined here, not in SQL: the
        planner, with no statistics yet for a day partition written a moment ago (the first minute of a day), guessed
        its rows at a few and could join the ranks by nested loops (a 256-GPU job's hour read before ANALYZE 1.0-1.3 s,
        0.76-0.90 s joined here; ``benchmarks/store_write.py --fresh-partition``)."""
        want = list(columns) if columns else list(schema.FRAME_SPECS[packed.RAW].names)
        read_cols = list(dict.fromkeys([*want, "ts", "gpu_uuid"]))
        df = self._read(packed.RAW, start=start, end=end, job_id=None, host=host, gpu_uuid=gpus, columns=read_cols, limit=None, small=small)
        held = ranks.select("job_id", "rank", "gpu_uuid", pl.col("start").alias("_from"), pl.col("end").alias("_to"))
        # the samples come ordered by time and GPU, as the SQL join orders them; the join keeps their order
        out = (df.join(held, on="gpu_uuid", how="inner", maintain_order="left")
               .filter((pl.col("ts") >= pl.col("_from")) & (pl.col("_to").is_null() | (pl.col("ts") < pl.col("_to")))))
        return out.select(pl.col("job_id").cast(pl.String), pl.col("rank").cast(pl.Int64), *want)

    def _read_oldest(self, frame: str, start: dt.datetime | None, end: dt.datetime | None, limit: int,
                     filters: dict[str, Any]) -> pl.DataFrame:
        """``read``'s oldest ``limit`` rows of a frame that packs its closed days (PostgreSQL), read in windows
        from the oldest row held that grow eightfold (a minute, 8, 64, ...) until one holds ``limit`` rows or
        reaches the range's end. Ordered by time, a window's first ``limit`` rows are the range's; and a
        packed hour is unpacked whole to be read at all, so one over the whole range, all of it packed history
        (``GET /api/v1/frames/gpu_sample?limit=10``), would unpack every day kept."""
        if frame == packed.RAW:
            newest_sql, newest_params = packed.max_ts_sql(self.dialect)
            bounds = f"SELECT {packed.min_ts_sql(self.dialect)} AS lo, {newest_sql} AS hi"
        else:
            newest_sql, newest_params = packed_energy.newest_minute_sql(self.dialect), []
            bounds = f"SELECT {packed_energy.oldest_minute_sql(self.dialect)} AS lo, {newest_sql} AS hi"
        held = self.query(bounds, newest_params, {"lo": F.UTC_US, "hi": F.UTC_US})
        oldest, newest = held["lo"][0], held["hi"][0]
        if oldest is None or newest is None:
            return self._read(frame, start=start, end=end, limit=limit, **filters)
        lo = oldest if start is None else max(as_utc(start), oldest)
        last = newest + dt.timedelta(microseconds=1)
        stop = last if end is None else min(as_utc(end), last)
        span = dt.timedelta(minutes=1)
        while True:
            hi = min(lo + span, stop)
            df = self._read(frame, start=lo, end=hi if hi < stop else end, limit=limit, **filters)
            if df.height >= limit or hi >= stop:
                return df
            span *= 8

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
        df = sqlite_reader.fetch_parts(path, parts, storage_dtypes(out_schema))
        return None if df is None else conform(df, out_schema)

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

    def query(self, sql: str, params: Sequence[Any] = (), schema_: dict[str, pl.DataType] | None = None,
              small: bool = False) -> pl.DataFrame:
        """Run a read-only SQL statement with ``?`` placeholders; timestamp columns named in ``schema_``
        come back as UTC datetimes on both databases. ``small``: the caller knows the result is a few rows (an
        aggregate, a newest or oldest instant, a panel's points), which PostgreSQL then sends over a pooled
        connection (``store.pg_read``) rather than a connection of the bulk path's own, whose start alone took
        ~15 ms, more than most such reads."""
        return self._fetch(sql, list(params), schema_ or {}, small)

    def _fetch(self, sql: str, params: list[Any], out_schema: dict[str, pl.DataType], small: bool = False) -> pl.DataFrame:
        if self.dialect == "sqlite":
            df = self._fetch_sqlite(sql, params, out_schema)
        elif small:
            df = pg_read.fetch_pooled(self.reader, _bind(sql, params), out_schema)
        else:
            df = self._fetch_postgres(sql, params)
        return conform(df, out_schema)

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
        return sqlite_reader.frame_from_rows(names, rows, storage_dtypes(out_schema))

    def _fetch_postgres(self, sql: str, params: list[Any]) -> pl.DataFrame:
        # connectorx streams PostgreSQL's binary protocol into Arrow in Rust: measured about 2x faster
        # than COPY TO CSV for an hour of a 256-GPU job (benchmarks/store_write.py). It takes no bound
        # parameters, so values are inlined as escaped literals.
        import connectorx as cx  # lazy: connectorx, only for PostgreSQL bulk reads

        df = pl.from_arrow(cx.read_sql(_no_jit_url(self.reader.url), _bind(sql, params), return_type="arrow"))
        assert isinstance(df, pl.DataFrame)
        return df

    # --- small helpers the service layer uses ------------------------------------------------------

    def packed_until(self) -> dt.datetime | None:
        """The end of the newest hour of raw samples held packed (``store.packed.HORIZON_SQL``; None on SQLite, or
        where none is), read again at most every ``PACKED_UNTIL_TTL_S``: what ``packed.source`` needs to leave out a
        raw sample that a packed hour also holds. Packing in this process forgets it (``packed_changed``); another
        process's pack is seen within the TTL, and only a sample re-sent into the hour just packed, in that time,
        could be read twice until the next pack."""
        if self.dialect != "postgresql":
            return None
        # from the database the read goes to: a replica's own horizon, and reads that go on with the primary down
        engine = self.reader
        now = time.monotonic()
        cached = self._packed_until.get(id(engine))
        if cached is not None and now - cached[0] < PACKED_UNTIL_TTL_S:
            return cached[1]
        with engine.connect() as conn:
            value = conn.exec_driver_sql(packed.HORIZON_SQL).scalar()
        self._packed_until[id(engine)] = (now, value)
        return value

    def packed_changed(self) -> None:
        """This process packed (or dropped) hours of raw samples: ``packed_until`` is read again."""
        self._packed_until.clear()

    def counts(self) -> dict[str, int]:
        """Row count of every canonical table (cheap enough for the demo and tests, not for dashboards)."""
        out = {}
        with self.reader.connect() as conn:
            for name in F.FRAMES:
                out[name] = int(conn.execute(text(f"SELECT COUNT(*) FROM {_q(name)}")).scalar_one())
            if self.dialect == "postgresql":  # with the samples of packed days (store.packed) and packed energy minutes
                out[packed.RAW] += int(conn.execute(text(f"SELECT COALESCE(SUM(samples), 0) FROM {packed.TABLE}")).scalar_one())
                if packed_energy.RAW in out:
                    out[packed_energy.RAW] += int(conn.execute(text(f"SELECT COALESCE(SUM(cardinality(minutes)), 0) FROM {packed_energy.TABLE}"))
                                                  .scalar_one())
        return out


def _no_jit_url(url: Any) -> str:
    """``url`` for connectorx, its sessions without PostgreSQL's JIT. A read is costed on its estimated rows, and a
    panel's statement of 48 short probes is costed as one: over the JIT threshold (``jit_above_cost``), it compiled
    ~2,000 functions, 2.4 s of CPU, to run 48 index probes of 1 ms each (the six-hour fleet panel over 1,024 GPUs:
    1.1 s, 0.25 s without). The reads here are probes and bounded ranges, which JIT does not pay back
    (PostgreSQL 15 docs, 32.2 "When to JIT?"). Any ``options`` the URL carries are kept."""
    from urllib.parse import quote  # lazy: only for PostgreSQL bulk reads

    options = " ".join(o for o in (url.query.get("options"), "-cjit=off") if o)
    # percent-encoded by hand: the URL's own rendering writes a space as "+", which the server reads as part of a name
    base = url.set(drivername="postgresql").difference_update_query(["options"]).render_as_string(hide_password=False)
    return f"{base}{'&' if '?' in base else '?'}options={quote(options, safe='')}"


def content_hash(*parts: bytes) -> str:
    """The hex SHA-256 of ``parts`` joined (``core.hashing``: a small input without releasing the GIL)."""
    return hashing.sha256(*parts).hexdigest()


# Telemetry frames whose hour-long reads are large enough to split across reader processes.
_PARALLEL_FRAMES = frozenset({"gpu_sample", "metric_sample", "collective", "step"})

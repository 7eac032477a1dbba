"""Reading one large SQLite result with several processes at once.

Python's sqlite3 module builds a Python object for every value of every row while holding the GIL, so a
big read (an hour of a 256-GPU job is 184,320 rows of 45 columns) is bound to one core however many the
machine has. Split by time into one part per core, each part read by its own process over its own
connection, the read takes about 1/cores of the time; the parts come back as polars frames (Arrow IPC
under pickle) and are concatenated.

Every process uses the stdlib driver, so one SQLite library per process: the rule that keeps WAL locking
sound (sqlite.org/howtocorrupt.html, "multiple copies of SQLite"). The readers are fresh interpreters
(``python -m fleetscope.store.sqlite_reader``) that talk over their stdin/stdout: never forked from a threaded
API or worker, and, unlike multiprocessing's spawn, they never re-import the caller's main script. The parts are separate read
transactions: rows committed while the read runs may appear in a later part and not in an earlier one,
which for append-only telemetry means the read sees a little more of the newest data, never a torn row.
"""

from __future__ import annotations

import atexit
import io
import logging
import os
import pickle
import sqlite3
import struct
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, BinaryIO

import polars as pl

log = logging.getLogger(__name__)

# Below this many rows one process is about as fast: shipping the parts costs ~10 ms.
MIN_ROWS = 50_000
WORKERS = max(1, min(4, os.cpu_count() or 1))
_HEADER = struct.Struct("!Q")


def frame_from_rows(names: list[str], rows: list[tuple[Any, ...]], dtypes: dict[str, pl.DataType | None]) -> pl.DataFrame:
    """Rows from the sqlite3 driver as a frame, built column by column (about twice as fast as polars'
    row orientation for wide rows); ``dtypes`` gives each column's storage type (None: infer).

    Each column is built with polars' type inference and cast afterwards: handing the dtype to the
    constructor with ``strict=False`` takes a per-value conversion path two to three times slower. A column
    whose values do not share one type (SQLite allows that) takes the lenient path.
    """
    cols = list(zip(*rows)) if rows else [() for _ in names]
    series = []
    for name, values in zip(names, cols):
        want = dtypes.get(name)
        try:
            s = pl.Series(name, values)
        except (TypeError, OverflowError, pl.exceptions.PolarsError):
            s = pl.Series(name, values, dtype=want, strict=False)
        if want is not None and s.dtype != want:
            s = s.cast(want, strict=False)
        series.append(s)
    return pl.DataFrame(series)


def fetch(path: str, sql: str, params: list[Any], dtypes: dict[str, pl.DataType | None]) -> pl.DataFrame:
    """Run one read-only statement on the database file at ``path``."""
    con = sqlite3.connect(path, timeout=30)
    try:
        con.execute("PRAGMA query_only=1")
        cur = con.execute(sql, params)
        names = [d[0] for d in cur.description]
        rows = cur.fetchall()
    finally:
        con.close()
    return frame_from_rows(names, rows, dtypes)


def _send(stream: BinaryIO, payload: bytes) -> None:
    stream.write(_HEADER.pack(len(payload)))
    stream.write(payload)
    stream.flush()


def _recv(stream: BinaryIO) -> bytes | None:
    head = stream.read(_HEADER.size)
    if len(head) < _HEADER.size:
        return None
    (n,) = _HEADER.unpack(head)
    return stream.read(n)


class _Reader:
    """One reader process; one request at a time."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", __name__], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self.lock = threading.Lock()

    def fetch(self, path: str, sql: str, params: list[Any], dtypes: dict[str, pl.DataType | None]) -> pl.DataFrame:
        with self.lock:
            assert self.proc.stdin is not None and self.proc.stdout is not None
            _send(self.proc.stdin, pickle.dumps((path, sql, params, dtypes)))
            reply = _recv(self.proc.stdout)
        if reply is None:
            raise BrokenPipeError(f"SQLite reader process {self.proc.pid} exited (status {self.proc.poll()})")
        if reply[:1] == b"E":
            raise pickle.loads(reply[1:])
        return pl.read_ipc(io.BytesIO(reply[1:]))

    def close(self) -> None:
        try:
            if self.proc.stdin:
                self.proc.stdin.close()
            self.proc.wait(timeout=5)
        except OSError:  # the reader already died: its pipe is broken
            self.proc.kill()
        except subprocess.TimeoutExpired:
            self.proc.kill()


_lock = threading.Lock()
_readers: list[_Reader] = []
_owner_pid: int | None = None


def _pool() -> list[_Reader]:
    global _owner_pid
    with _lock:
        if _owner_pid != os.getpid():  # after a fork the pipes belong to the parent: start our own
            _readers.clear()
            _owner_pid = os.getpid()
        _readers[:] = [r for r in _readers if r.proc.poll() is None]
        while len(_readers) < WORKERS:
            _readers.append(_Reader())
        return list(_readers)


@atexit.register
def shutdown() -> None:
    """Stop the reader processes (they also exit on their own when this process's pipes close)."""
    with _lock:
        if _owner_pid == os.getpid():
            for r in _readers:
                r.close()
        _readers.clear()


def warm() -> None:
    """Start the reader processes and wait until each answers, so that the first large read does not
    pay for their start (about a quarter of a second each: an interpreter and polars)."""
    if WORKERS >= 2:
        for r in _pool():
            r.fetch(":memory:", "SELECT 1", [], {})


def fetch_parts(path: str, parts: list[tuple[str, list[Any]]], dtypes: dict[str, pl.DataType | None]) -> pl.DataFrame | None:
    """Read ``parts`` (statement, parameters) concurrently and concatenate them in order. None when no
    reader can run (the caller reads in-process); an error of a statement itself is raised."""
    if WORKERS < 2:
        return None
    try:
        readers = _pool()
        with ThreadPoolExecutor(len(parts)) as ex:
            futures = [ex.submit(readers[i % len(readers)].fetch, path, sql, params, dtypes) for i, (sql, params) in enumerate(parts)]
            frames = [f.result() for f in futures]
    except (OSError, EOFError) as exc:
        log.warning("parallel SQLite read unavailable (%s); reading in one process", exc)
        shutdown()
        return None
    return pl.concat(frames, how="vertical_relaxed")


def _serve(stdin: BinaryIO, stdout: BinaryIO) -> None:
    """The reader process: answer requests until the caller closes the pipe."""
    while (request := _recv(stdin)) is not None:
        try:
            df = fetch(*pickle.loads(request))
            buf = io.BytesIO()
            df.write_ipc(buf, compression="uncompressed")
            _send(stdout, b"D" + buf.getvalue())
        except Exception as exc:  # noqa: BLE001 - every failure goes back to the caller, who raises it
            _send(stdout, b"E" + pickle.dumps(exc))


if __name__ == "__main__":
    _serve(sys.stdin.buffer, sys.stdout.buffer)

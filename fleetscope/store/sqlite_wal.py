"""SQLite writers one at a time, and its write-ahead log checkpointed from a thread of its own: the
store's SQLite-only write machinery (``Store._write_lock``, ``Store.checkpoint_in_background``)."""

from __future__ import annotations

import contextlib
import fcntl
import os
import sqlite3
import threading
import weakref
from typing import Any

IDLE_CHECKPOINT_S = 5.0
"""How often the background checkpointer looks at the log when this store has not written."""


class SqliteWriteLock:
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


def checkpointer(path: str, owner: Any, interval_s: float) -> tuple[threading.Thread, threading.Event, threading.Event]:
    """A thread, not yet started, that PASSIVE-checkpoints the database at ``path`` every ``interval_s`` once
    woken (or every ``IDLE_CHECKPOINT_S`` unwoken), until its stop event is set or ``owner`` is no longer
    held, then once more; with that stop event and the event that wakes it."""
    stop = threading.Event()
    dirty = threading.Event()
    alive = weakref.ref(owner)  # a store no one holds any more takes its thread with it

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

    return threading.Thread(target=run, name="sqlite-checkpoint", daemon=True), stop, dirty

"""The ingest door: the one accept path of every push (the ingest and batch routes, OTLP, remote write,
`fleetscope ingest` and the agent through them). It screens each push alone (``door/screen.py``: what a
push is, its rows made ready, the future-skew and token-binding checks), writes, records the ingest log,
and wakes alert evaluation, and it commits concurrent pushes together.

Group commit. A fleet arrives as thousands of small pushes (an agent per node, ~240 values each), and a
write's fixed costs — a transaction, a frame conform, a duplicate-input query, an inventory compare — do not
shrink with the push. A writer thread of the process takes every push that is waiting (after at most
``FLEETSCOPE_GROUP_COMMIT_MS`` for company; ``Door.__init__`` says how two share the work) and writes them
with one ingest-log row per push, in as few transactions as their kinds allow (``_split``): small
dcgm-exporter bodies, which :mod:`ingest.dcgm_lines` reads into lists without parsing, go to the store as
plain rows (``Store.write_rows``), their health events with them (a node with a sticky XID sends one every
scrape); so do plain OTLP requests (``ingest.otlp.tuples``); pushes parsed already, and the rare group the rows
cannot say the same as frames (``_as_rows``), are assembled into frames in one go.

What each push is promised:
- *Acknowledged means stored.* A push's future resolves only after the transaction holding its rows
  has committed; the API answers from that.
- *Alone when it must be.* A push that does not parse is refused alone before the group forms; if a
  group's write fails, each of its pushes is written again alone, so each gets its own answer and a bad
  one never spoils the rest.
- *Idempotent.* A push whose content (bytes and options) is in the ingest log, or earlier in the same
  group, writes nothing and says so; rows already stored are skipped by their natural keys anyway. The
  log is checked inside the group's write transaction, with the writers of one content taking turns
  (``Store.write_frames``' ``unless_logged``), so two API processes given the same push store it once.
- *Bounded.* Past ``FLEETSCOPE_INGEST_MAX_PENDING`` pushes or ``FLEETSCOPE_INGEST_MAX_PENDING_MB`` waiting,
  :class:`Overloaded` is raised at once (the API answers 503 with ``Retry-After``), never a hang.

``written`` in a push's result: exact for a group of one. In a group of several, a frame whose rows were
all new (or all already stored) is exact too; where only some were, the group's count is given to its
pushes in arrival order.
"""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import polars as pl
from sqlalchemy.exc import OperationalError

from fleetscope.core import frames as F
from fleetscope.core.dcgm_fields import health_rows_in_order
from fleetscope.core.errors import FleetscopeError
from fleetscope.door import screen
from fleetscope.door.screen import Push
from fleetscope.observability import INGEST_GROUP_PUSHES, INGEST_REFUSED_OVERLOAD
from fleetscope.store import AlreadyLogged, Rows, Store, WriteResult
from ingest import dcgm_lines, otlp

log = logging.getLogger(__name__)


# How often a writer holding its group for another writer to finish (``Door._run``) looks again.
_HELD_POLL_S = 0.001
# GPUs a door remembers having written (a 200,000-GPU fleet's), for which groups may go beside another writer.
_KNOWN_GPUS = 200_000


class Overloaded(FleetscopeError):
    """More pushes are waiting than the door holds; retry after ``retry_after_s``."""

    def __init__(self, message: str, retry_after_s: int = 1):
        super().__init__(message)
        self.retry_after_s = retry_after_s


@dataclass
class Accepted:
    """What the door did with one push."""

    source: str
    formats: list[str]
    result: WriteResult
    skipped_duplicate: bool = False
    notes: dict[str, Any] = field(default_factory=dict)
    group_size: int = 1


Hook = Callable[[pl.DataFrame | None, list[str]], None]


def _offered(lines: dcgm_lines.Lines) -> dict[str, int]:
    """Rows a line-read body offers per frame (health events aside)."""
    n = len(lines.keys)
    rows = {"gpu": n, "gpu_sample": n}
    pods = sum(1 for lab in lines.labels if dcgm_lines.workload_of(lab) is not None)
    if pods:
        rows["gpu_workload"] = pods
    if lines.metrics:
        rows["metric_sample"] = len(lines.metrics)
    return {k: v for k, v in rows.items() if v}


def _as_rows(pushes: Sequence[Push]) -> tuple[list[tuple[F.FrameSpec, Rows]], list[dict[str, int]], list[int]] | None:
    """A group of line-read dcgm bodies, or of plain OTLP requests, as plain rows (``Store.write_rows``): the
    frame machinery's fixed costs are most of a small group's write. Their health events too (a node with a
    sticky XID or an ECC count sends one every scrape), except where a GPU's instant is in two dcgm bodies:
    which body's labels name its event is the frame path's to settle. None for any other group."""
    if all(p.otlp is not None and p.batch is None for p in pushes):
        walks = [p.otlp for p in pushes]
        rows = otlp.tuples(walks)
        if rows is None:
            return None
        counted = [otlp.counts(w) for w in walks]
        offered = [_with_health(c[0], len(otlp.health_rows(w))) for c, w in zip(counted, walks)]
        return [(F.FRAMES[name], Rows(cols, r)) for name, (cols, r) in rows.items()], offered, [c[1] for c in counted]
    if any(p.lines is None for p in pushes):
        return None
    parts: list[tuple[dcgm_lines.Lines, int]] = [(p.lines, p.ts_us) for p in pushes]  # type: ignore[misc]
    health = [dcgm_lines.health_rows(lines, t) for lines, t in parts]
    if any(health) and len({(t, key) for lines, t in parts for key in lines.keys}) < sum(len(lines.keys) for lines, _ in parts):
        return None
    rows_of = dcgm_lines.tuples(parts)
    if any(health):
        rows_of["health_event"] = (F.HEALTH_EVENT.names, health_rows_in_order(row for rows in health for row in rows))
    frames = [(F.FRAMES[name], Rows(cols, rows)) for name, (cols, rows) in rows_of.items() if rows]
    return frames, [_with_health(_offered(lines), len(h)) for (lines, _), h in zip(parts, health)], [lines.values() for lines, _ in parts]


def _with_health(offered: dict[str, int], events: int) -> dict[str, int]:
    if events:
        offered["health_event"] = events
    return offered


def _kind(push: Push) -> str:
    """Which write a push can share: ``lines`` / ``otlp`` for what ``_as_rows`` takes, else ``frames``."""
    if push.lines is not None and push.batch is None:
        return "lines"
    if push.otlp is not None and push.batch is None and otlp.plain(push.otlp):
        return "otlp"
    return "frames"


def _gpus(push: Push) -> list[str]:
    if push.lines is not None:
        return push.lines.keys
    if push.otlp is not None:
        return otlp.gpu_uuids(push.otlp)
    return []


def _split(group: list[Any]) -> list[list[Any]]:
    """A group as the writes it takes: its plain dcgm bodies as rows, its plain OTLP requests as rows, the
    rest (a JSON batch, a request with NCCL operations, ...) as frames, each a transaction of its own, so that one
    such push does not send a whole group down the frame path. Each push is still in one transaction whole. Kept
    one group where two kinds name one GPU: which copy of a reading is stored follows arrival order within
    a write, not across writes."""
    if len(group) < 2 or any(item[0].batch is not None for item in group):
        return [group]  # a parsed batch's GPUs are not listed here: kept whole
    kinds: dict[str, list[Any]] = {}
    for item in group:
        kinds.setdefault(_kind(item[0]), []).append(item)
    parts = list(kinds.values())
    if len(parts) < 2:
        return [group]
    seen: set[str] = set()
    for part in parts:
        gpus = {g for item in part for g in _gpus(item[0])}
        if not seen.isdisjoint(gpus):
            return [group]
        seen |= gpus
    return parts


def _assemble(pushes: Sequence[Push], source: str) -> tuple[F.Batch, list[dict[str, int]], list[int]]:
    """The group's Batch, each push's rows offered per frame, and each push's values."""
    lined = [p for p in pushes if p.lines is not None]
    parts: list[F.Batch] = []
    offered: list[dict[str, int]] = []
    values: list[int] = []
    if lined:
        parts.append(dcgm_lines.assemble([(p.lines, p.ts_us) for p in lined], source=source))  # type: ignore[misc]
    # OTLP requests about distinct GPUs are built into frames together; one about a GPU already in the
    # group is built alone, so that which copy of a point is stored does not depend on the grouping.
    walks, seen = [], set()
    for p in pushes:
        if p.otlp is not None:
            uuids = otlp.gpu_uuids(p.otlp)
            if seen.isdisjoint(uuids):
                seen.update(uuids)
                walks.append(p.otlp)
            else:
                p.batch = p.otlp.batch(p.source)
    otlp_batch = otlp.gather(walks, source) if walks else None
    if otlp_batch is not None:
        parts.append(otlp_batch)
    parts.extend(p.batch for p in pushes if p.batch is not None)
    grouped = [b.health_event for b in parts[: (1 if lined else 0) + (1 if otlp_batch is not None else 0)]
               if b.health_event is not None and b.health_event.height]
    health = pl.concat(grouped, how="diagonal_relaxed") if grouped else None
    events = list(zip(health["gpu_uuid"].to_list(), health["ts"].dt.epoch("us").to_list())) if health is not None else []
    for p in pushes:
        lines = p.lines
        if lines is not None:
            rows = _offered(lines)
            keys = set(lines.keys)
            hits = sum(1 for u, t in events if t == p.ts_us and u in keys)
            if hits:
                rows["health_event"] = hits
            offered.append(rows)
            values.append(lines.values())
        elif p.otlp is not None and p.batch is None:
            rows, n = otlp.counts(p.otlp)
            uuids = set(otlp.gpu_uuids(p.otlp))
            hits = sum(1 for u, _ in events if u in uuids)
            if hits:
                rows["health_event"] = hits
            offered.append(rows)
            values.append(n)
        else:
            assert p.batch is not None
            offered.append(p.batch.rows())
            values.append(p.batch.values())
    batch = parts[0]
    for other in parts[1:]:
        batch = batch.merge(other)
    batch.source = source
    return batch, offered, values


def _attribute(group: WriteResult, offered: list[dict[str, int]]) -> list[dict[str, int]]:
    """Each push's share of the group's rows written (see the module docstring)."""
    out: list[dict[str, int]] = [dict.fromkeys(o, 0) for o in offered]
    for frame, written in group.written.items():
        total = sum(o.get(frame, 0) for o in offered)
        left = written
        for share, o in zip(out, offered):
            n = o.get(frame, 0)
            if not n:
                continue
            if written >= total:
                share[frame] = n
            else:
                share[frame] = min(n, left)
                left -= share[frame]
    return out


class Door:
    """The accept path of one process: call :meth:`accept` from any thread, or await :meth:`accept_async`."""

    def __init__(self, store: Store, *, window_s: float = 0.002, max_pending: int = 1024, max_pending_bytes: int = 512 * 2**20,
                 max_group: int = 512, max_group_bytes: int = 64 * 2**20, after_commit: Hook | None = None,
                 max_future_skew_s: float | None = None, writers: int = 1):
        self.store = store
        # Writer threads, each committing its own group (the API's: ``FLEETSCOPE_INGEST_WRITERS``, two). Two that
        # each gathered a group of their own split one writer's groups in half, and on the shared 2-core machine
        # cost more CPU a push than they gained. So one gathers at a time, and a group whose window has passed
        # while another writer is in the database waits for it, then gathers one window more (``_gather``):
        # groups stay as large as one writer's. A group holding a node's first push (``_fresh``) goes at once
        # beside it: that push creates the node's inventory and series, the slowest writes there are, and a
        # fleet's first round is every node's (README, benchmarks/ingest_agents.py --door-writers). SQLite
        # takes one writer at a time (``Store._write_lock``) whatever the number. Pushes that arrive together
        # (one group) keep their order within the write; pushes committed by two writers at once were concurrent
        # requests, which no order is promised between.
        self.writers = max(1, writers)
        self._busy = 0  # writers inside ``_commit``
        self._gathering = threading.Lock()
        self._known_gpus: set[str] = set()
        # The API's door refuses pushes dated past the clock plus this; the CLI's (files an operator
        # chose, a simulation's) takes any time.
        self.max_future_skew_s = max_future_skew_s
        self.window_s = window_s
        self.max_pending = max_pending
        self.max_pending_bytes = max_pending_bytes
        self.max_group = max_group
        self.max_group_bytes = max_group_bytes
        self.after_commit = after_commit
        self._queue: queue.SimpleQueue[tuple[Push, cf.Future[Accepted]] | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._pending = 0
        self._pending_bytes = 0
        self._threads: list[threading.Thread] = []
        self._hooks = cf.ThreadPoolExecutor(max_workers=1, thread_name_prefix="door-hooks")
        self._closed = False

    # --- the way in ------------------------------------------------------------------------------------

    def submit(self, push: Push) -> cf.Future[Accepted]:
        """Queue ``push`` for the next group; ``Overloaded`` at once when the door is full."""
        # What the push holds in memory while it waits; a frame's size is read off its buffers, not counted.
        push.nbytes = push.nbytes or len(push.dcgm or b"") or (
            sum(df.estimated_size() for _, df in push.batch.frames()) if push.batch is not None else 0)
        with self._lock:
            if self._closed:
                raise Overloaded("the ingest door is closing; retry shortly", 2)
            if self._pending >= self.max_pending or (self._pending and self._pending_bytes + push.nbytes > self.max_pending_bytes):
                INGEST_REFUSED_OVERLOAD.inc()
                raise Overloaded(f"{self._pending} pushes ({self._pending_bytes >> 20} MiB) are waiting to be written; retry shortly")
            self._pending += 1
            self._pending_bytes += push.nbytes
            if not self._threads:
                self._threads = [threading.Thread(target=self._run, name=f"ingest-door-{i}", daemon=True) for i in range(self.writers)]
                for thread in self._threads:
                    thread.start()
        fut: cf.Future[Accepted] = cf.Future()
        self._queue.put((push, fut))
        return fut

    def accept(self, push: Push, timeout_s: float | None = None) -> Accepted:
        return self.submit(push).result(timeout_s)

    async def accept_async(self, push: Push) -> Accepted:
        return await asyncio.wrap_future(self.submit(push))

    def close(self) -> None:
        """Write what is queued, then stop the writer."""
        with self._lock:
            self._closed = True
            threads = self._threads
        for _ in threads:
            self._queue.put(None)  # one stop for each writer, after everything queued
        for thread in threads:
            thread.join(timeout=60)
        self._hooks.shutdown(wait=True)

    # --- the writer --------------------------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            # One writer gathers at a time: two gathering at once would split one group in two.
            with self._gathering:
                gathered = self._gather()
                if gathered is None:
                    return
                group, size, stop, fresh = gathered
                with self._lock:
                    self._busy += 1
            try:
                self._commit(group)
            except BaseException as exc:  # noqa: BLE001 - the writer must outlive any one group
                log.exception("ingest group failed")
                for _, fut in group:
                    if not fut.done():
                        fut.set_exception(exc)
            finally:
                with self._lock:
                    self._busy -= 1
                    self._pending -= len(group)
                    self._pending_bytes -= size
                if fresh:
                    self._learn_gpus(group)
            if stop:
                return

    def _gather(self) -> tuple[list[tuple[Push, cf.Future[Accepted]]], int, bool, bool] | None:
        """The next group (with its bytes, whether a stop came after it, whether it holds a GPU new to the door),
        or None at a stop."""
        first = self._queue.get()
        if first is None:
            return None
        group = [first]
        size = first[0].nbytes
        deadline = time.monotonic() + self.window_s
        stop = False
        fresh = self._fresh(first[0])
        was_held = False
        while len(group) < self.max_group and size < self.max_group_bytes:
            wait = deadline - time.monotonic()
            held = wait <= 0 and self._busy > 0 and not fresh
            if was_held and not held and not fresh:
                # the other writer is done: a window for company from now, as one writer would have after its commit
                deadline, wait, was_held = time.monotonic() + self.window_s, self.window_s, False
            was_held = was_held or held
            try:
                if wait > 0:
                    item = self._queue.get(timeout=wait)
                else:
                    item = self._queue.get(timeout=_HELD_POLL_S) if held else self._queue.get_nowait()
            except queue.Empty:
                if held or wait > 0:
                    continue  # held, or the window just ran out: whether to hold is asked again
                break
            if item is None:
                stop = True
                break
            group.append(item)
            size += item[0].nbytes
            fresh = fresh or self._fresh(item[0])
        return group, size, stop, fresh

    def _fresh(self, push: Push) -> bool:
        """Whether ``push`` is a node's first, read as lines, naming a GPU this door has not written (only asked
        with several writers). An OTLP request's first groups wait instead: beside another write they cost the
        server a third more CPU (its general reader's worker threads and two writers on two cores), and a
        fleet's first OTLP round went a sixth slower (benchmarks/ingest_agents.py --door-writers)."""
        return self.writers > 1 and push.lines is not None and not self._known_gpus.issuperset(push.lines.keys)

    def _learn_gpus(self, group: list[tuple[Push, cf.Future[Accepted]]]) -> None:
        """Remember the GPUs of the group's stored pushes (a bounded set, emptied when full)."""
        gpus = [g for push, fut in group if fut.done() and fut.exception() is None for g in _gpus(push)]
        if len(self._known_gpus) + len(gpus) > _KNOWN_GPUS:
            self._known_gpus.clear()
        self._known_gpus.update(gpus)

    def _commit(self, group: list[tuple[Push, cf.Future[Accepted]]]) -> None:
        live: list[tuple[Push, cf.Future[Accepted]]] = []
        for push, fut in group:
            try:
                screen.prepare(push)
                screen.check(push, self.max_future_skew_s)
            except Exception as exc:  # noqa: BLE001 - this push's own error, told to it alone
                fut.set_exception(exc)
                continue
            live.append((push, fut))
        if not live:
            return
        INGEST_GROUP_PUSHES.observe(len(live))
        fresh: list[tuple[Push, cf.Future[Accepted]]] = []
        copies: list[tuple[Push, cf.Future[Accepted], cf.Future[Accepted]]] = []  # a later copy, its first copy's answer
        first_of: dict[str, cf.Future[Accepted]] = {}
        for push, fut in live:
            if push.sha and push.dedupe and push.sha in first_of:
                copies.append((push, fut, first_of[push.sha]))
            else:
                if push.sha and push.dedupe:
                    first_of[push.sha] = fut
                fresh.append((push, fut))
        logged: list[tuple[Push, cf.Future[Accepted]]] = []
        try:
            if fresh:
                logged = self._write(fresh)
        finally:
            for push, fut in logged:  # stored by an earlier group or another process
                if not fut.done():
                    fut.set_result(_skipped(push))
            # A later copy of a push in the group shares its first copy's fate: skipped once that one is stored,
            # its error where that one failed (an acknowledgement means stored), and, where the group's write
            # raised before answering it, the group's error with the rest (``_run``).
            for push, fut, first in copies:
                if fut.done() or not first.done():
                    continue
                exc = first.exception()
                if exc is not None:
                    fut.set_exception(exc)
                else:
                    fut.set_result(_skipped(push))

    def _write(self, fresh: list[tuple[Push, cf.Future[Accepted]]]) -> list[tuple[Push, cf.Future[Accepted]]]:
        """Write ``fresh`` and answer each push; the pushes found in the ingest log instead (stored by an
        earlier group or another process), for the caller to answer as duplicates."""
        parts = _split(fresh)
        if len(parts) > 1:
            return [dup for part in parts for dup in self._write(part)]
        pushes = [p for p, _ in fresh]
        source = pushes[0].source if len(pushes) == 1 else f"group of {len(pushes)}"
        batch = None
        # Checked in the write's own transaction (``Store.write_frames``): one round trip less than a query
        # of its own, and exact between API processes.
        shas = [p.sha for p in pushes if p.sha and p.dedupe]

        def log_rows(result: WriteResult) -> list[tuple[str, str | None, dict[str, int], int]]:
            return [(p.source, p.sha, w, v) for p, w, v in zip(pushes, _attribute(result, offered), values)]

        health_rows: Rows | None = None
        try:
            as_rows = _as_rows(pushes)
            if as_rows is not None:
                frames, offered, values = as_rows
                health_rows = next((r for spec, r in frames if spec.name == "health_event"), None)
                result = self.store.write_rows(frames, values=sum(values), ingest_log=log_rows, unless_logged=shas)
            else:
                batch, offered, values = _assemble(pushes, source)
                result = self.store.write(batch, ingest_log=log_rows, unless_logged=shas)
        except AlreadyLogged as found:
            # Rare (a re-sent input): nothing was written; the rest go again without those found.
            logged = [item for item in fresh if item[0].dedupe and item[0].sha in found.shas]
            rest = [item for item in fresh if not (item[0].dedupe and item[0].sha in found.shas)]
            return logged + (self._write(rest) if rest else [])
        except OperationalError as exc:
            # The database is busy or gone (the store gives its drivers' errors as SQLAlchemy's): every push may
            # retry; none was stored. Not written again one by one: each would wait out the busy timeout in turn.
            for _, fut in fresh:
                fut.set_exception(exc)
            return []
        except Exception:
            if len(fresh) == 1:
                raise
            log.info("a group of %d pushes failed; writing each alone", len(fresh))
            dups = []
            for item in fresh:
                try:
                    dups.extend(self._write([item]))
                except Exception as exc:  # noqa: BLE001 - that push's own answer
                    item[1].set_exception(exc)
            return dups
        shares = _attribute(result, offered)
        written_health: pl.DataFrame | Rows | None = None
        if result.written.get("health_event"):
            written_health = batch.health_event if batch is not None else health_rows
        job_ids = (batch.job_rank["job_id"].unique().to_list()
                   if batch is not None and result.written.get("job_rank") and batch.job_rank is not None else [])
        for (push, fut), share, off, v in zip(fresh, shares, offered, values):
            fut.set_result(Accepted(push.source, push.formats, WriteResult(offered=off, written=share, values=v), notes=push.notes,
                                    group_size=len(fresh)))
        if self.after_commit is not None and (written_health is not None or job_ids):
            self._hooks.submit(self._hook, written_health, job_ids)
        return []

    def _hook(self, health: pl.DataFrame | Rows | None, job_ids: list[str]) -> None:
        try:
            assert self.after_commit is not None
            # rows made a frame here, off the writer
            self.after_commit(health.frame(F.HEALTH_EVENT) if isinstance(health, Rows) else health, job_ids)
        except Exception:  # noqa: BLE001 - the pushes are stored; beat's next tick covers a lost wake-up
            log.warning("post-commit hook failed", exc_info=True)


def _skipped(push: Push) -> Accepted:
    """The answer to a push whose input was stored before: nothing written."""
    _batch, offered, values = _assemble([push], push.source)
    return Accepted(push.source, push.formats, WriteResult(offered=offered[0], written=dict.fromkeys(offered[0], 0), values=values[0]),
                    skipped_duplicate=True, notes=push.notes)


def for_store(store: Store) -> Door:
    """The door of this process for ``store`` (the CLI's and tests' way in; the API makes its own with
    the service's settings and wake-ups)."""
    door = getattr(store, "_door", None)
    if door is None:
        door = store._door = Door(store)  # type: ignore[attr-defined]
    return door

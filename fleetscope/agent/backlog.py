"""The agent's backlog: readings kept, as the requests that deliver them, across failed pushes, bounded by
bytes and by ticks, the oldest dropped first; with a spool directory each one is also a file, so a restart
loses nothing (``fleetscope.agent``'s docstring says when a reading is kept, sent again or dropped).
"""

from __future__ import annotations

import collections
import datetime as dt
import gzip
import json
import logging
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fleetscope import safefiles

# the collector's logger: an operator filters the agent's lines by one name
log = logging.getLogger("fleetscope.agent")


@dataclass(eq=False)
class Reading:
    """What one source (in OTLP mode: all sources) read at one tick, as the request that delivers it:
    kept as is until the API has it, so a resend carries the time it was measured."""

    ts: dt.datetime  # when it was measured
    path: str  # API path it goes to
    body: bytes  # gzip when ``gzipped``
    content_type: str
    kind: str  # readings of one kind may share a request: "batch:<source>" (NVML batches); "" never shares
    params: dict[str, str] = field(default_factory=dict)
    sources: dict[str, dict[str, int]] = field(default_factory=dict)  # source -> what it read (TickReport.pushed)
    gzipped: bool = False
    file: Path | None = None  # its spool file

    @property
    def nbytes(self) -> int:
        return len(self.body)

    def raw(self) -> bytes:
        return gzip.decompress(self.body) if self.gzipped else self.body

    def header(self) -> dict[str, Any]:
        return {"ts": self.ts.isoformat(), "path": self.path, "content_type": self.content_type, "kind": self.kind,
                "params": self.params, "sources": self.sources, "gzipped": self.gzipped}


class Backlog:
    """Readings not yet delivered, oldest first, bounded by bytes and by ticks; past either bound the
    oldest are dropped (and counted in ``dropped``). With ``spool`` every reading is also a file there
    (``<sequence>.reading``: a JSON header line, then the body), written before it is kept and removed
    once delivered or dropped, and a new Backlog over the same directory starts with what it holds."""

    def __init__(self, max_bytes: int, max_ticks: int, spool: str | Path | None = None) -> None:
        if max_bytes < 1 or max_ticks < 1:
            raise ValueError("the backlog needs room for at least one byte and one tick")
        self.max_bytes, self.max_ticks = max_bytes, max_ticks
        self.items: collections.deque[Reading] = collections.deque()
        self.nbytes = 0
        self.dropped = 0
        self._ticks: collections.Counter[dt.datetime] = collections.Counter()
        self._seq = 0
        self.spool = Path(spool) if spool is not None else None
        if self.spool is not None:
            safefiles.private_dir(self.spool)
            self._load()

    def __len__(self) -> int:
        return len(self.items)

    @property
    def ticks(self) -> int:
        return len(self._ticks)

    def add(self, r: Reading) -> list[Reading]:
        """Keep ``r`` (newest); returns the readings dropped to stay within the bounds, oldest first."""
        if self.spool is not None and r.file is None:
            self._seq += 1
            r.file = self.spool / f"{self._seq:012d}.reading"
            tmp = r.file.with_suffix(".tmp")
            try:
                safefiles.write_private(tmp, json.dumps(r.header()).encode() + b"\n" + r.body)
                os.replace(tmp, r.file)
            except OSError as exc:  # a full or read-only disk: the reading is still kept in memory
                log.warning("spool: cannot write %s (%s); this reading is kept in memory only", r.file, exc)
                tmp.unlink(missing_ok=True)
                r.file = None
        self.items.append(r)
        self.nbytes += r.nbytes
        self._ticks[r.ts] += 1
        dropped = []
        while self.items and (self.nbytes > self.max_bytes or len(self._ticks) > self.max_ticks):
            dropped.append(self._pop())
        self.dropped += len(dropped)
        return dropped

    def head(self, max_bytes: int, max_items: int | None = None) -> list[Reading]:
        """The oldest reading and the ones after it that may share its request, within ``max_bytes``
        (uncompressed, estimated from the stored size) and ``max_items``."""
        if not self.items:
            return []
        first = self.items[0]
        out, size = [first], raw_size(first)
        for r in list(self.items)[1:]:
            if not first.kind or r.kind != first.kind or (max_items is not None and len(out) >= max_items):
                break
            size += raw_size(r)
            if size > max_bytes:
                break
            out.append(r)
        return out

    def remove(self, done: Iterable[Reading]) -> None:
        """Forget readings from the head (delivered, or refused for good)."""
        for r in done:
            if not self.items or self.items[0] is not r:
                raise RuntimeError("only the oldest readings leave the backlog")
            self._pop()

    def _pop(self) -> Reading:
        r = self.items.popleft()
        self.nbytes -= r.nbytes
        self._ticks[r.ts] -= 1
        if not self._ticks[r.ts]:
            del self._ticks[r.ts]
        if r.file is not None:
            r.file.unlink(missing_ok=True)
        return r

    def _load(self) -> None:
        assert self.spool is not None
        for tmp in self.spool.glob("*.tmp"):  # a write cut short by a crash: never became a reading
            tmp.unlink(missing_ok=True)
        files = sorted(self.spool.glob("*.reading"))
        for f in files:
            try:
                head, _, body = f.read_bytes().partition(b"\n")
                h = json.loads(head)
                r = Reading(ts=dt.datetime.fromisoformat(h["ts"]), path=h["path"], body=body, content_type=h["content_type"],
                            kind=h["kind"], params=h["params"], sources=h["sources"], gzipped=h["gzipped"], file=f)
            except (OSError, ValueError, KeyError, TypeError) as exc:
                log.warning("spool: %s is unreadable (%s); removed", f.name, str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__)
                f.unlink(missing_ok=True)
                continue
            self.add(r)
        self._seq = max((int(f.stem) for f in files if f.stem.isdigit()), default=0)
        if self.items:
            log.info("spool: %d readings from %s to %s waiting to be sent", len(self.items), self.items[0].ts.isoformat(), self.items[-1].ts.isoformat())
        if self.dropped:
            log.warning("spool: dropped the %d oldest readings to fit the backlog's bounds", self.dropped)


def raw_size(r: Reading) -> int:
    # gzip'd bodies shrink ~5-10x; a generous estimate keeps merged requests under the limit
    return r.nbytes * 10 if r.gzipped else r.nbytes

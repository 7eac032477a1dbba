"""Tamper-evident, append-only log of governance writes (declarations, fairness evaluations, audit runs,
reports, exports).

Each entry carries the SHA-256 of the previous entry, and its own hash covers the canonical JSON of its
fields together with that previous hash, so editing, deleting or reordering any row breaks every link
after it: ``verify_chain`` returns the index of the first broken link. This supports the AI Act's
record-keeping (Art. 12(1) traceability, Art. 18 documentation keeping) by making after-the-fact edits of
the governance trail visible; it does not prevent them. Truncating the newest rows is only visible
against a head hash kept elsewhere (``expected_head``; the export bundle's manifest is one such place).

Pure: entries in, entries out. The service appends under a lock or in a transaction that fails on a
duplicate ``seq`` (two writers must never both extend the same head).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import polars as pl

from fleetscope.frames import conform
from governance.aiact.frames import AUDIT_LOG
from governance.aiact.model import canonical_json, utc

GENESIS = "0" * 64
"""``prev_hash`` of the first entry."""


def ts_text(t: datetime) -> str:
    """Microseconds always written: the store keeps microseconds, so the text re-reads the same."""
    return utc(t).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass(frozen=True)
class AuditEntry:
    seq: int
    ts: datetime
    actor: str
    action: str
    subject: str
    payload: str  # canonical JSON text, hashed as stored
    prev_hash: str
    hash: str

    def to_dict(self) -> dict[str, Any]:
        return {"seq": self.seq, "ts": ts_text(self.ts), "actor": self.actor, "action": self.action, "subject": self.subject,
                "payload": self.payload, "prev_hash": self.prev_hash, "hash": self.hash}


def entry_hash(seq: int, ts: datetime, actor: str, action: str, subject: str, payload: str, prev_hash: str) -> str:
    """SHA-256 of the canonical JSON (sorted keys, no spaces, UTF-8) of the entry's fields with the
    previous entry's hash among them."""
    body = {"seq": seq, "ts": ts_text(ts), "actor": actor, "action": action, "subject": subject, "payload": payload, "prev_hash": prev_hash}
    return hashlib.sha256(canonical_json(body).encode()).hexdigest()


def append(last: AuditEntry | None, *, ts: datetime, actor: str, action: str, subject: str,
           payload: Mapping[str, Any] | None = None) -> AuditEntry:
    """The entry that follows ``last`` (None: the first entry of the log)."""
    if not actor.strip() or not action.strip():
        raise ValueError("an audit log entry needs an actor and an action")
    seq = 0 if last is None else last.seq + 1
    prev = GENESIS if last is None else last.hash
    text = canonical_json(dict(payload or {}))
    t = utc(ts)
    return AuditEntry(seq, t, actor, action, subject, text, prev, entry_hash(seq, t, actor, action, subject, text, prev))


def first_break(entries: Sequence[AuditEntry], *, start_hash: str = GENESIS, start_seq: int | None = None,
                expected_head: str | None = None) -> tuple[int, str] | None:
    """(index, why) of the first broken link, or None when the chain holds. ``entries`` in ``seq`` order;
    to check a tail of the log, give the hash (``start_hash``) and ``start_seq`` the tail starts after.
    With ``expected_head``, a chain whose last hash differs (rows dropped from the end) breaks at
    ``len(entries)``."""
    prev = start_hash
    seq0 = (0 if start_hash == GENESIS else None) if start_seq is None else start_seq
    for i, e in enumerate(entries):
        want_seq = (seq0 + i) if seq0 is not None else (entries[0].seq + i)
        if e.seq != want_seq:
            return i, f"seq {e.seq} where {want_seq} was expected (a row was deleted or inserted)"
        if e.prev_hash != prev:
            return i, f"seq {e.seq}: prev_hash does not match the hash of the entry before it"
        h = entry_hash(e.seq, e.ts, e.actor, e.action, e.subject, e.payload, e.prev_hash)
        if h != e.hash:
            return i, f"seq {e.seq}: the entry's content does not match its hash (edited)"
        prev = e.hash
    if expected_head is not None and prev != expected_head:
        return len(entries), "the newest hash differs from the expected head (entries removed from or added at the end)"
    return None


def verify_chain(entries: Sequence[AuditEntry], *, start_hash: str = GENESIS, start_seq: int | None = None,
                 expected_head: str | None = None) -> int | None:
    """Index of the first broken entry, or None when every link holds (see ``first_break``)."""
    b = first_break(entries, start_hash=start_hash, start_seq=start_seq, expected_head=expected_head)
    return None if b is None else b[0]


def entries_frame(entries: Sequence[AuditEntry]) -> pl.DataFrame:
    """Rows for the ``audit_log`` table."""
    if not entries:
        return AUDIT_LOG.empty()
    rows = [{**e.to_dict(), "ts": e.ts} for e in entries]
    data = {c.name: pl.Series(c.name, [r[c.name] for r in rows], dtype=c.dtype) for c in AUDIT_LOG.columns}
    return conform(AUDIT_LOG, pl.DataFrame(data))


def entries_from_frame(df: pl.DataFrame) -> list[AuditEntry]:
    """Entries in ``seq`` order from stored rows."""
    return [AuditEntry(int(r["seq"]), utc(r["ts"]), r["actor"], r["action"], r["subject"], r["payload"], r["prev_hash"], r["hash"])
            for r in df.sort("seq").iter_rows(named=True)]

"""Tamper-evident, append-only log of governance writes (registry changes, declarations, fairness
evaluations, audit runs and their reports, exports, alert receiver, rule and silence changes).

Two things make it hold against someone who can write the database:

1. **A keyed chain.** Each entry's ``hash`` is HMAC-SHA-256 (RFC 2104) under a secret key kept outside
   the database, over the canonical JSON of the entry's fields with the previous entry's hash among them.
   Editing, deleting, inserting or reordering a row breaks a link, and without the key nobody can compute
   a consistent replacement chain (a plain SHA-256 chain, the construction before keying, could be
   recomputed by anyone who edits the rows).
2. **Signed checkpoints outside the database.** After every append the service writes a checkpoint (the
   log's identity, the entry's ``seq`` and ``hash``, the time, where keying began and which key) signed
   with Ed25519 (RFC 8032) to an append-only file. A chain cut short at the end is still a valid chain;
   the newest checkpoint says how long it was. A checkpoint file that lost its last lines shows as
   entries newer than the newest checkpoint.

The transition from unkeyed logs: entries written before keying keep their plain SHA-256 hashes. The
first keyed append to such a log writes an ``auditlog_keyed`` entry (itself keyed, its ``prev_hash`` the
last unkeyed hash), and every checkpoint records ``keyed_from``, the seq of that entry. Verification
takes the boundary from the signed checkpoints, never from the database, so it cannot be moved by
whoever edits the rows; an unkeyed entry edited and re-chained shows at the boundary, whose HMAC covers
the last unkeyed hash. A log that is keyed from its first entry has ``keyed_from`` 0. No migration
rewrites old rows.

This supports the AI Act's record-keeping (Art. 12(1) traceability, Art. 18 documentation keeping) by
making after-the-fact changes of the governance trail visible; it does not prevent them, and it cannot
stop someone holding both the key and the checkpoint file.

Pure: entries, keys and checkpoint lines in, entries, checkpoints and verdicts out. The service appends
under a lock, writes the files and reads the clock.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import polars as pl
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from fleetscope.core.frames import conform
from governance.aiact.frames import AUDIT_LOG
from governance.aiact.model import canonical_json, utc
from governance.exports import key_fingerprint

GENESIS = "0" * 64
"""``prev_hash`` of the first entry."""

KEY_BYTES = 32
"""Shortest audit key accepted, and the length of a generated one: RFC 2104 §3 discourages keys shorter
than the hash's output (32 bytes for SHA-256)."""

KEYED_ACTION = "auditlog_keyed"
"""Action of the entry that starts the keyed part of a log that began unkeyed."""

CHECKPOINT_FORMAT = "fleetscope-auditlog-checkpoint/1"


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


def _body(seq: int, ts: datetime, actor: str, action: str, subject: str, payload: str, prev_hash: str) -> bytes:
    return canonical_json({"seq": seq, "ts": ts_text(ts), "actor": actor, "action": action, "subject": subject, "payload": payload,
                           "prev_hash": prev_hash}).encode()


def entry_hash(seq: int, ts: datetime, actor: str, action: str, subject: str, payload: str, prev_hash: str, *, key: bytes | None) -> str:
    """HMAC-SHA-256 (RFC 2104) under ``key`` of the canonical JSON (sorted keys, no spaces, UTF-8) of the
    entry's fields with the previous entry's hash among them. ``key=None`` gives the plain SHA-256 of the
    same text: only entries written before the log was keyed carry that."""
    body = _body(seq, ts, actor, action, subject, payload, prev_hash)
    if key is None:
        return hashlib.sha256(body).hexdigest()
    return hmac.new(key, body, hashlib.sha256).hexdigest()


def key_id(key: bytes) -> str:
    """A name for the audit key that reveals nothing of it (an HMAC of a fixed label), recorded in every
    checkpoint so a verifier given the wrong key says so rather than reporting every entry as edited."""
    return hmac.new(key, b"fleetscope audit log key id", hashlib.sha256).hexdigest()[:16]


def append(last: AuditEntry | None, *, key: bytes, ts: datetime, actor: str, action: str, subject: str,
           payload: Mapping[str, Any] | None = None) -> AuditEntry:
    """The entry that follows ``last`` (None: the first entry of the log), keyed with ``key``."""
    if not actor.strip() or not action.strip():
        raise ValueError("an audit log entry needs an actor and an action")
    if len(key) < KEY_BYTES:
        raise ValueError(f"the audit key has {len(key)} bytes; at least {KEY_BYTES} are needed")
    seq = 0 if last is None else last.seq + 1
    prev = GENESIS if last is None else last.hash
    text = canonical_json(dict(payload or {}))
    t = utc(ts)
    return AuditEntry(seq, t, actor, action, subject, text, prev, entry_hash(seq, t, actor, action, subject, text, prev, key=key))


# --- checkpoints -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Checkpoint:
    """A signed statement that the log named ``log`` (the hash of its entry 0) held entry ``seq`` with
    hash ``head`` at ``ts``; entries from ``keyed_from`` on are keyed with the key named ``key_id``;
    ``signer`` is the Ed25519 key's fingerprint (``governance.exports.key_fingerprint``)."""

    log: str
    seq: int
    head: str
    ts: datetime
    keyed_from: int
    key_id: str
    signer: str
    sig: str = ""

    def body(self) -> dict[str, Any]:
        return {"format": CHECKPOINT_FORMAT, "log": self.log, "seq": self.seq, "head": self.head, "ts": ts_text(self.ts),
                "keyed_from": self.keyed_from, "key_id": self.key_id, "signer": self.signer}

    def signed_bytes(self) -> bytes:
        return canonical_json(self.body()).encode()

    def line(self) -> str:
        """One line of the checkpoint file (no newline)."""
        return canonical_json({**self.body(), "sig": self.sig})

    def signature_valid(self, public_key: Ed25519PublicKey) -> bool:
        try:
            public_key.verify(base64.b64decode(self.sig, validate=True), self.signed_bytes())
        except (InvalidSignature, ValueError):
            return False
        return True

    def to_dict(self) -> dict[str, Any]:
        return {**self.body(), "sig": self.sig}


def checkpoint(entry: AuditEntry, *, log: str, keyed_from: int, key: bytes, signing_key: Ed25519PrivateKey, ts: datetime) -> Checkpoint:
    """The signed checkpoint of ``entry`` as the newest entry of log ``log``."""
    cp = Checkpoint(log, entry.seq, entry.hash, utc(ts), keyed_from, key_id(key), key_fingerprint(signing_key))
    return Checkpoint(**{**cp.__dict__, "sig": base64.b64encode(signing_key.sign(cp.signed_bytes())).decode()})


def parse_checkpoint(text: str) -> Checkpoint:
    """A checkpoint from one line of the file; ``ValueError`` saying what is wrong with it."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not JSON ({exc.msg} at column {exc.colno})") from None
    if not isinstance(doc, dict) or doc.get("format") != CHECKPOINT_FORMAT:
        raise ValueError(f"not a checkpoint (format {doc.get('format') if isinstance(doc, dict) else None!r}, expected {CHECKPOINT_FORMAT!r})")
    want = {"log": str, "seq": int, "head": str, "ts": str, "keyed_from": int, "key_id": str, "signer": str, "sig": str}
    for name, kind in want.items():
        if not isinstance(doc.get(name), kind) or isinstance(doc.get(name), bool):
            raise ValueError(f"field {name!r} missing or not a {kind.__name__}")
    try:
        ts = datetime.fromisoformat(doc["ts"].replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"field 'ts' {doc['ts'][:40]!r} is not an RFC 3339 time") from None
    return Checkpoint(doc["log"], doc["seq"], doc["head"], utc(ts), doc["keyed_from"], doc["key_id"], doc["signer"], doc["sig"])


# --- verifying ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Break:
    """The first thing wrong: the entry it concerns (``seq``; None where no entry can be named) and why;
    ``line`` is the checkpoint file's line (1-based) where the problem was found there."""

    seq: int | None
    why: str
    line: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"seq": self.seq, "why": self.why, "line": self.line}


@dataclass(frozen=True)
class Verdict:
    entries: int
    head: str
    head_seq: int | None
    keyed_from: int | None
    checkpoints: int
    latest: Checkpoint | None
    problem: Break | None

    @property
    def ok(self) -> bool:
        return self.problem is None


def verify(entries: Sequence[AuditEntry], *, key: bytes | None, checkpoint_lines: Sequence[str],
           public_key: Ed25519PublicKey | None) -> Verdict:
    """Check the whole log (``entries`` in ``seq`` order, as stored) under the audit ``key`` and against
    the checkpoint file's lines, signed by ``public_key``'s private half. The verdict names the first
    problem found, in this order: the checkpoint file (unreadable or unsigned lines, lines out of order,
    another key), then the entries from seq 0 up (a missing seq, a broken link, content that does not
    match its HMAC, a hash that differs from its signed checkpoint), then the end (rows missing after the
    newest entry that a checkpoint records, or entries no checkpoint covers).

    ``key`` None: the key file is absent, which is only fine for an empty, never-checkpointed log."""
    n = len(entries)
    head = entries[-1].hash if entries else GENESIS
    head_seq = entries[-1].seq if entries else None

    def verdict(problem: Break | None, keyed_from: int | None = None, mine: Sequence[tuple[int, Checkpoint]] = ()) -> Verdict:
        return Verdict(n, head, head_seq, keyed_from, len(mine), mine[-1][1] if mine else None, problem)

    parsed: list[tuple[int, Checkpoint]] = []
    for number, text in enumerate(checkpoint_lines, 1):
        if not text.strip():
            return verdict(Break(None, f"checkpoint file line {number} is empty (the file was edited, or a write was cut short)", number))
        try:
            parsed.append((number, parse_checkpoint(text)))
        except ValueError as exc:
            return verdict(Break(None, f"checkpoint file line {number}: {exc}", number))
    if not entries:
        if parsed:
            number, top = parsed[-1]
            return verdict(Break(0, f"seq 0: missing; the log is empty but the checkpoint file holds {len(parsed)} signed checkpoints, "
                                    f"the newest (line {number}) of seq {top.seq}: every row was deleted", number))
        return verdict(None)

    log_id = entries[0].hash if entries[0].seq == 0 else None
    logs = {cp.log for _, cp in parsed}
    if log_id is None and len(logs) == 1:
        log_id = next(iter(logs))  # entry 0 is gone: judge the rest against the only log the file knows
    mine = [(number, cp) for number, cp in parsed if cp.log == log_id]

    for i, (number, cp) in enumerate(mine):
        where = f"checkpoint file line {number} (seq {cp.seq})"
        if public_key is None:
            return verdict(Break(cp.seq, f"{where}: no signing key to check it with (FLEETSCOPE_SIGNING_KEY or the data directory's signing_key.pem is gone)", number))
        if not cp.signature_valid(public_key):
            return verdict(Break(cp.seq, f"{where}: its Ed25519 signature does not verify with key {key_fingerprint(public_key)} "
                                         f"(the line was edited, or signed by key {cp.signer})", number))
        if key is not None and cp.key_id != key_id(key):
            return verdict(Break(cp.seq, f"{where}: made with audit key {cp.key_id}, but the key given is {key_id(key)} "
                                         "(FLEETSCOPE_AUDIT_KEY_FILE names another key, or the key was replaced)", number))
        if cp.keyed_from != mine[0][1].keyed_from:
            return verdict(Break(cp.seq, f"{where}: says keying began at seq {cp.keyed_from}, line {mine[0][0]} says seq {mine[0][1].keyed_from}", number))
        if i and cp.seq <= mine[i - 1][1].seq:
            return verdict(Break(cp.seq, f"{where}: comes after the checkpoint of seq {mine[i - 1][1].seq} (lines reordered or inserted)", number))

    if mine:
        keyed_from: int | None = mine[0][1].keyed_from
    elif key is not None and _matches(entries[0], key):
        keyed_from = 0  # a keyed log whose checkpoints are all gone: say that, not that every entry was edited
    else:
        keyed_from = None
    if key is None and keyed_from is not None:
        return verdict(Break(keyed_from, f"seq {keyed_from}: keyed, but there is no audit key to check it with "
                                         "(restore FLEETSCOPE_AUDIT_KEY_FILE or the data directory's audit.key from backup)"), keyed_from, mine)
    by_seq = {cp.seq: (number, cp) for number, cp in mine}
    prev = GENESIS
    for expected, e in enumerate(entries):
        if e.seq != expected:
            if e.seq < expected:
                why = f"seq {e.seq}: out of order where seq {expected} was expected"
            elif expected == 0:
                why = f"seq 0: missing (the log starts at seq {e.seq}): rows were deleted"
            else:
                why = f"seq {expected}: missing (the log goes from seq {expected - 1} to seq {e.seq}): rows were deleted"
            return verdict(Break(expected, why), keyed_from, mine)
        if e.prev_hash != prev:
            return verdict(Break(e.seq, f"seq {e.seq}: prev_hash is not the hash of seq {e.seq - 1} (an entry was deleted, replaced, "
                                        "moved or re-chained)" if e.seq else "seq 0: prev_hash is not the genesis value"), keyed_from, mine)
        if keyed_from is not None and e.seq >= keyed_from:
            if not _matches(e, key):
                return verdict(Break(e.seq, f"seq {e.seq}: the content does not match its HMAC-SHA-256 under the audit key "
                                            "(edited, or re-chained without the key)"), keyed_from, mine)
        elif not _matches(e, None):
            why = (f"seq {e.seq}: keyed with the audit key, but the signed checkpoints say keying began at seq {keyed_from} "
                   "(the checkpoint file lost lines)" if key is not None and _matches(e, key)
                   else f"seq {e.seq}: the content does not match its SHA-256 (an entry from before keying was edited)")
            return verdict(Break(e.seq, why), keyed_from, mine)
        if e.seq in by_seq and by_seq[e.seq][1].head != e.hash:
            number, cp = by_seq[e.seq]
            return verdict(Break(e.seq, f"seq {e.seq}: its hash differs from the one the signed checkpoint of {ts_text(cp.ts)} "
                                        f"(line {number}) records: the entry was replaced", number), keyed_from, mine)
        prev = e.hash

    last = entries[-1].seq
    if not mine:
        if parsed:
            other = sorted(logs)[0]
            return verdict(Break(0, f"seq 0: no signed checkpoint names this log; the checkpoint file's name log {other[:16]}…: "
                                    "the first entry was replaced, or the file belongs to another database"), keyed_from)
        if keyed_from == 0:
            return verdict(Break(0, "seq 0: no signed checkpoint anchors this log: the checkpoint file is missing or empty"), keyed_from)
        return verdict(Break(0, f"seq 0 to {last}: written before the log was keyed and never anchored by a signed checkpoint "
                                "(any governance write, or `fleetscope audit anchor`, anchors it)"), keyed_from)
    number, top = mine[-1]
    if top.seq > last:
        return verdict(Break(last + 1, f"seq {last + 1}: missing; the signed checkpoint of {ts_text(top.ts)} (line {number}) records the log "
                                       f"up to seq {top.seq}: the newest rows were deleted", number), keyed_from, mine)
    if top.seq < last:
        return verdict(Break(top.seq + 1, f"seq {top.seq + 1}: newer than the newest signed checkpoint (seq {top.seq}, line {number}): "
                                          "the checkpoint file lost its newest lines, or the service stopped between writing the entry "
                                          "and its checkpoint", number), keyed_from, mine)
    return verdict(None, keyed_from, mine)


def _matches(e: AuditEntry, key: bytes | None) -> bool:
    want = entry_hash(e.seq, e.ts, e.actor, e.action, e.subject, e.payload, e.prev_hash, key=key)
    return hmac.compare_digest(want, e.hash)


# --- frames ------------------------------------------------------------------------------------------


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

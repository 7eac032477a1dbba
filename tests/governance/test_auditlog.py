"""The keyed audit log and its signed checkpoints, pure: every kind of tampering is named by the first bad
entry, and the boundary of a log that began unkeyed cannot be moved. The same attacks against a real
database through the service's append path are in tests/security/test_audit_tamper.py."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from datetime import timedelta

import polars as pl
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from governance import auditlog as A
from governance.aiact.frames import AIACT_FRAMES
from tests.governance.aiact_fixtures import NOW

KEY = bytes(range(32))
SIGNER = Ed25519PrivateKey.generate()
PUBLIC = SIGNER.public_key()


def chain(n: int = 6, key: bytes = KEY) -> list[A.AuditEntry]:
    out: list[A.AuditEntry] = []
    for i in range(n):
        out.append(A.append(out[-1] if out else None, key=key, ts=NOW + timedelta(seconds=i, microseconds=7), actor="alice@example.com",
                            action=["declaration", "fairness_evaluation", "audit_run", "export"][i % 4], subject=f"model:cv-screener:{i}",
                            payload={"kind": "area", "value": {"area": "employment"}, "n": i, "note": "ünïcode"}))
    return out


def checkpoints(entries: list[A.AuditEntry], keyed_from: int = 0, key: bytes = KEY, signer: Ed25519PrivateKey = SIGNER) -> list[str]:
    """One signed line per entry from ``keyed_from`` on, as the service writes them."""
    return [A.checkpoint(e, log=entries[0].hash, keyed_from=keyed_from, key=key, signing_key=signer, ts=e.ts).line()
            for e in entries if e.seq >= keyed_from]


def check(entries: list[A.AuditEntry], lines: list[str], key: bytes | None = KEY) -> A.Break | None:
    return A.verify(entries, key=key, checkpoint_lines=lines, public_key=PUBLIC).problem


def unkeyed(last: A.AuditEntry | None, i: int) -> A.AuditEntry:
    """An entry as written before keying: plain SHA-256."""
    seq, prev = (0, A.GENESIS) if last is None else (last.seq + 1, last.hash)
    t = NOW + timedelta(seconds=i)
    payload = json.dumps({"n": i}, separators=(",", ":"))
    return A.AuditEntry(seq, t, "bob", "declaration", "model:m:1", payload, prev, A.entry_hash(seq, t, "bob", "declaration", "model:m:1", payload, prev, key=None))


def legacy_then_keyed(n_unkeyed: int = 3, n_keyed: int = 3) -> list[A.AuditEntry]:
    out: list[A.AuditEntry] = []
    for i in range(n_unkeyed):
        out.append(unkeyed(out[-1] if out else None, i))
    out.append(A.append(out[-1], key=KEY, ts=NOW + timedelta(minutes=1), actor="fleetscope", action=A.KEYED_ACTION, subject="auditlog",
                        payload={"unkeyed_entries": n_unkeyed, "unkeyed_head": out[-1].hash}))
    for i in range(n_keyed - 1):
        out.append(A.append(out[-1], key=KEY, ts=NOW + timedelta(minutes=2, seconds=i), actor="carol", action="export", subject="audit:a"))
    return out


def test_a_fresh_chain_verifies() -> None:
    es = chain()
    v = A.verify(es, key=KEY, checkpoint_lines=checkpoints(es), public_key=PUBLIC)
    assert v.ok and v.problem is None
    assert (v.entries, v.head, v.head_seq, v.keyed_from, v.checkpoints, v.latest.seq) == (6, es[-1].hash, 5, 0, 6, 5)
    assert es[0].prev_hash == A.GENESIS and es[0].seq == 0
    assert all(b.prev_hash == a.hash for a, b in zip(es, es[1:]))
    assert A.verify([], key=None, checkpoint_lines=[], public_key=None).ok


def test_the_hash_is_an_hmac_under_the_key() -> None:
    e = chain(1)[0]
    import hmac

    body = json.dumps({"seq": 0, "ts": A.ts_text(e.ts), "actor": e.actor, "action": e.action, "subject": e.subject, "payload": e.payload,
                       "prev_hash": A.GENESIS}, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
    assert e.hash == hmac.new(KEY, body, hashlib.sha256).hexdigest()
    assert e.hash != hashlib.sha256(body).hexdigest()


def test_edited_row_in_the_stored_frame_is_found() -> None:
    es = chain()
    df = A.entries_frame(es)
    assert df.schema == AIACT_FRAMES["audit_log"].schema
    assert check(A.entries_from_frame(df), checkpoints(es)) is None  # the store's round trip keeps every hash
    edited = df.with_columns(pl.when(pl.col("seq") == 3).then(pl.lit('{"kind":"area","value":{"area":"none"}}')).otherwise(pl.col("payload")).alias("payload"))
    brk = check(A.entries_from_frame(edited), checkpoints(es))
    assert brk.seq == 3 and "does not match its HMAC" in brk.why


@pytest.mark.parametrize("field,value", [("actor", "mallory"), ("action", "nothing"), ("subject", "model:other:1"),
                                         ("ts", NOW - timedelta(days=1)), ("payload", "{}")])
def test_any_field_edit_is_found(field, value) -> None:
    es = chain()
    lines = checkpoints(es)
    es[2] = dataclasses.replace(es[2], **{field: value})
    brk = check(es, lines)
    assert brk.seq == 2 and "HMAC" in brk.why


@pytest.mark.parametrize("rekey", [None, b"k" * 32], ids=["plain-sha256", "wrong-key"])
def test_re_chaining_without_the_key_is_found_at_the_first_changed_entry(rekey) -> None:
    es = chain()
    lines = checkpoints(es)
    forged = es[:2]
    for e in es[2:]:
        e = dataclasses.replace(e, actor="mallory" if e.seq == 2 else e.actor, prev_hash=forged[-1].hash)
        forged.append(dataclasses.replace(e, hash=A.entry_hash(e.seq, e.ts, e.actor, e.action, e.subject, e.payload, e.prev_hash, key=rekey)))
    brk = check(forged, lines)
    assert brk.seq == 2 and "HMAC" in brk.why


def test_deleted_reordered_and_truncated_rows() -> None:
    es = chain()
    lines = checkpoints(es)
    brk = check(es[:2] + es[3:], lines)
    assert brk.seq == 2 and "missing" in brk.why and "deleted" in brk.why
    swapped = [es[0], dataclasses.replace(es[2], seq=1), dataclasses.replace(es[1], seq=2), *es[3:]]
    brk = check(swapped, lines)
    assert brk.seq == 1 and "prev_hash" in brk.why
    brk = check(es[1:], lines)  # the first row removed: judged against the file's only log
    assert brk.seq == 0 and "missing" in brk.why
    brk = check(es[:-2], lines)
    assert brk.seq == 4 and "newest rows were deleted" in brk.why
    brk = check([], lines)
    assert brk.seq == 0 and "every row was deleted" in brk.why


def test_a_lost_newest_checkpoint_leaves_entries_uncovered() -> None:
    es = chain()
    brk = check(es, checkpoints(es)[:-1])
    assert brk.seq == 5 and "newer than the newest signed checkpoint" in brk.why
    brk = check(es, [])
    assert brk.seq == 0 and "no signed checkpoint anchors this log" in brk.why


def test_checkpoint_lines_edited_reordered_or_signed_by_another_key() -> None:
    es = chain()
    lines = checkpoints(es)
    doc = json.loads(lines[3])
    doc["head"] = "f" * 64
    brk = check(es, [*lines[:3], json.dumps(doc), *lines[4:]])
    assert (brk.seq, brk.line) == (3, 4) and "signature does not verify" in brk.why
    brk = check(es, [*lines[:2], lines[3], lines[2], *lines[4:]])
    assert (brk.seq, brk.line) == (2, 4) and "reordered" in brk.why
    brk = check(es, checkpoints(es, signer=Ed25519PrivateKey.generate()))
    assert brk.line == 1 and "signature does not verify" in brk.why
    brk = check(es, [*lines[:2], "{not json", *lines[3:]])
    assert brk.line == 3 and "not JSON" in brk.why


def test_the_wrong_key_is_named_as_such() -> None:
    es = chain()
    brk = check(es, checkpoints(es), key=b"x" * 32)
    assert brk.line == 1 and f"the key given is {A.key_id(b'x' * 32)}" in brk.why
    brk = check(es, checkpoints(es), key=None)
    assert brk.seq == 0 and "no audit key" in brk.why


def test_a_log_that_began_unkeyed_verifies_from_its_boundary() -> None:
    es = legacy_then_keyed()
    lines = checkpoints(es, keyed_from=3)
    v = A.verify(es, key=KEY, checkpoint_lines=lines, public_key=PUBLIC)
    assert v.ok and v.keyed_from == 3
    # an unkeyed entry edited in place: its SHA-256 no longer matches
    edited = [*es[:1], dataclasses.replace(es[1], actor="mallory"), *es[2:]]
    brk = check(edited, lines)
    assert brk.seq == 1 and "SHA-256" in brk.why
    # edited and re-chained up to the boundary: the keyed entry's HMAC covers the old last hash
    e1 = dataclasses.replace(es[1], actor="mallory")
    e1 = dataclasses.replace(e1, hash=A.entry_hash(1, e1.ts, e1.actor, e1.action, e1.subject, e1.payload, e1.prev_hash, key=None))
    e2 = dataclasses.replace(es[2], prev_hash=e1.hash)
    e2 = dataclasses.replace(e2, hash=A.entry_hash(2, e2.ts, e2.actor, e2.action, e2.subject, e2.payload, e2.prev_hash, key=None))
    brk = check([es[0], e1, e2, *es[3:]], lines)
    assert brk.seq == 3 and "prev_hash" in brk.why


def test_the_boundary_comes_from_the_signed_checkpoints_not_the_rows() -> None:
    # Re-chaining the keyed part with plain SHA-256 would pass if the boundary were read from the rows.
    es = legacy_then_keyed()
    lines = checkpoints(es, keyed_from=3)
    forged = es[:3]
    for e in es[3:]:
        e = dataclasses.replace(e, prev_hash=forged[-1].hash)
        forged.append(dataclasses.replace(e, hash=A.entry_hash(e.seq, e.ts, e.actor, e.action, e.subject, e.payload, e.prev_hash, key=None)))
    brk = check(forged, lines)
    assert brk.seq == 3 and "HMAC" in brk.why
    # and a keyed entry found before the recorded boundary means checkpoint lines were lost
    es = chain()
    brk = check(es, checkpoints(es, keyed_from=2)[:0] + [A.checkpoint(es[-1], log=es[0].hash, keyed_from=4, key=KEY, signing_key=SIGNER, ts=NOW).line()])
    assert brk.seq == 0 and "keying began at seq 4" in brk.why


def test_an_unkeyed_log_never_anchored_says_so() -> None:
    es = [unkeyed(None, 0)]
    es.append(unkeyed(es[-1], 1))
    brk = check(es, [])
    assert brk.seq == 0 and "never anchored" in brk.why and "fleetscope audit anchor" in brk.why


def test_checkpoints_of_another_log_in_the_file() -> None:
    es = chain()
    other = [A.append(None, key=KEY, ts=NOW, actor="x", action="declaration", subject="s")]  # another database's log
    other.append(A.append(other[-1], key=KEY, ts=NOW, actor="x", action="declaration", subject="s"))
    brk = check(es, checkpoints(other))
    assert brk.seq == 0 and "no signed checkpoint names this log" in brk.why
    # lines of another log beside this one's are passed over
    assert check(es, checkpoints(other)[:1] + checkpoints(es)) is None


def test_parse_checkpoint_refuses_what_is_not_one() -> None:
    with pytest.raises(ValueError, match="not JSON"):
        A.parse_checkpoint("{")
    with pytest.raises(ValueError, match="not a checkpoint"):
        A.parse_checkpoint('{"format": "x"}')
    line = json.loads(checkpoints(chain(1))[0])
    with pytest.raises(ValueError, match="'seq' missing or not a int"):
        A.parse_checkpoint(json.dumps({**line, "seq": "0"}))
    assert A.parse_checkpoint(json.dumps(line)).signature_valid(PUBLIC)


def test_append_needs_actor_action_and_a_long_enough_key() -> None:
    with pytest.raises(ValueError, match="actor and an action"):
        A.append(None, key=KEY, ts=NOW, actor=" ", action="x", subject="s")
    with pytest.raises(ValueError, match="at least 32"):
        A.append(None, key=b"short", ts=NOW, actor="a", action="x", subject="s")

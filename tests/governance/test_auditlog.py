"""Hash-chained audit log: an edited, deleted, reordered or truncated row is found."""

from __future__ import annotations

import dataclasses
from datetime import timedelta

import polars as pl
import pytest

from governance import auditlog as A
from governance.aiact.frames import AIACT_FRAMES
from tests.governance.aiact_fixtures import NOW


def chain(n: int = 6) -> list[A.AuditEntry]:
    out: list[A.AuditEntry] = []
    for i in range(n):
        out.append(A.append(out[-1] if out else None, ts=NOW + timedelta(seconds=i, microseconds=7), actor="alice@example.com",
                            action=["declaration", "fairness_evaluation", "audit_run", "export"][i % 4], subject=f"model:cv-screener:{i}",
                            payload={"kind": "area", "value": {"area": "employment"}, "n": i, "note": "ünïcode"}))
    return out


def test_a_fresh_chain_verifies() -> None:
    es = chain()
    assert A.verify_chain(es) is None
    assert es[0].prev_hash == A.GENESIS and es[0].seq == 0
    assert all(b.prev_hash == a.hash for a, b in zip(es, es[1:]))
    assert A.verify_chain([]) is None


def test_edited_row_in_the_stored_frame_is_found() -> None:
    df = A.entries_frame(chain())
    assert df.schema == AIACT_FRAMES["audit_log"].schema
    assert A.verify_chain(A.entries_from_frame(df)) is None  # the store's round trip keeps every hash
    edited = df.with_columns(pl.when(pl.col("seq") == 3).then(pl.lit('{"kind":"area","value":{"area":"none"}}')).otherwise(pl.col("payload")).alias("payload"))
    assert A.verify_chain(A.entries_from_frame(edited)) == 3
    idx, why = A.first_break(A.entries_from_frame(edited))
    assert idx == 3 and "edited" in why


@pytest.mark.parametrize("field,value", [("actor", "mallory"), ("action", "nothing"), ("subject", "model:other:1"),
                                         ("ts", NOW - timedelta(days=1))])
def test_any_field_edit_is_found(field, value) -> None:
    es = chain()
    es[2] = dataclasses.replace(es[2], **{field: value})
    assert A.verify_chain(es) == 2


def test_rehashing_an_edited_row_breaks_the_next_link() -> None:
    es = chain()
    e = dataclasses.replace(es[2], actor="mallory")
    es[2] = dataclasses.replace(e, hash=A.entry_hash(e.seq, e.ts, e.actor, e.action, e.subject, e.payload, e.prev_hash))
    assert A.verify_chain(es) == 3


def test_deleted_reordered_and_truncated_rows() -> None:
    es = chain()
    assert A.verify_chain(es[:2] + es[3:]) == 2
    assert A.verify_chain([es[0], es[2], es[1], *es[3:]]) == 1
    assert A.verify_chain(es[1:]) == 0  # the first row removed
    head = es[-1].hash
    assert A.verify_chain(es[:-2], expected_head=head) == 4
    assert A.verify_chain(es, expected_head=head) is None


def test_a_tail_verifies_from_a_known_hash() -> None:
    es = chain()
    assert A.verify_chain(es[3:], start_hash=es[2].hash, start_seq=3) is None
    assert A.verify_chain(es[3:], start_hash=es[1].hash, start_seq=3) == 0


def test_append_needs_actor_and_action() -> None:
    with pytest.raises(ValueError):
        A.append(None, ts=NOW, actor=" ", action="x", subject="s")

"""Job lifecycle events: the schema in ingest/job_events.py and docs/job_events.md."""

from __future__ import annotations

import json
from datetime import datetime, timezone

import pytest

from fleetscope.core.errors import ParseError
from fleetscope.core.frames import JOB, JOB_EVENT, STEP
from ingest import job_events


def _jsonl(*objs: dict) -> bytes:
    return b"".join(json.dumps(o).encode() + b"\n" for o in objs)


T0 = datetime(2025, 3, 1, 12, 0, tzinfo=timezone.utc)
LIFECYCLE = [
    {"job_id": "j1", "ts": "2025-03-01T12:00:00Z", "kind": "allocated",
     "job": {"name": "llama-pretrain", "kind": "training", "model_name": "llama-3-8b", "world_size": 16,
             "submitted_at": "2025-03-01T11:55:00Z"}},
    {"job_id": "j1", "ts": "2025-03-01T14:00:05+02:00", "kind": "started"},
    {"job_id": "j1", "ts": 1740830410, "kind": "initialized", "rank": 0},
    {"job_id": "j1", "ts": "2025-03-01T12:00:12.250Z", "kind": "step", "rank": 0, "step": 1, "duration_s": 2.25,
     "tokens": 524288, "model_flops": 3.1e15, "loss": 9.8, "grad_norm": 1.7, "compute_s": 1.9, "comm_s": 0.5,
     "comm_overlap_s": 0.3, "idle_s": 0.15},
    {"job_id": "j1", "ts": "2025-03-01T12:00:15Z", "kind": "step", "rank": 0, "step": 2,
     "start": "2025-03-01T12:00:12.250Z", "end": "2025-03-01T12:00:14.400Z", "tokens": 524288,
     "param_checksum": "9f2c11aa"},
    {"job_id": "j1", "ts": "2025-03-01T12:00:16Z", "kind": "step", "rank": 1, "step": 2, "loss": 9.7},
    {"job_id": "j1", "ts": "2025-03-01T12:00:20Z", "kind": "checkpoint_save_start", "step": 2},
    {"job_id": "j1", "ts": "2025-03-01T12:00:31Z", "kind": "checkpoint_save_end", "step": 2, "bytes": 16000000000},
    {"job_id": "j1", "ts": "2025-03-01T12:05:00Z", "kind": "failure", "rank": 5, "cause": "xid_79",
     "host": "node-b"},
    {"job_id": "j1", "ts": "2025-03-01T12:06:00Z", "kind": "job", "job": {"status": "failed",
                                                                        "ended_at": "2025-03-01T12:05:00Z"}},
]


def test_lifecycle_rows():
    b = job_events.parse(_jsonl(*LIFECYCLE), source="events.jsonl")
    ev = b.job_event
    assert ev.schema == JOB_EVENT.schema and ev.height == 9 and b.meta["job_lines"] == 1
    assert ev["kind"].to_list()[:3] == ["allocated", "started", "initialized"]
    started = ev.filter(ev["kind"] == "started").row(0, named=True)
    assert started["ts"] == datetime(2025, 3, 1, 12, 0, 5, tzinfo=timezone.utc) and started["rank"] == -1
    assert ev.filter(ev["kind"] == "initialized")["ts"][0] == datetime(2025, 3, 1, 12, 0, 10, tzinfo=timezone.utc)
    failure = ev.filter(ev["kind"] == "failure").row(0, named=True)
    assert failure["rank"] == 5 and json.loads(failure["payload"]) == {"cause": "xid_79", "host": "node-b"}
    assert ev.filter(ev["kind"] == "started")["payload"][0] is None
    save = ev.filter(ev["kind"] == "checkpoint_save_end").row(0, named=True)
    assert save["step"] == 2 and json.loads(save["payload"])["bytes"] == 16000000000

    st = b.step
    assert st.schema == STEP.schema and st.height == 2  # rank 1's step 2 has no span
    assert b.meta["steps_without_span"] == 1
    s1 = st.filter(st["step"] == 1).row(0, named=True)
    assert s1["end"] == datetime(2025, 3, 1, 12, 0, 12, 250000, tzinfo=timezone.utc)
    assert s1["start"] == datetime(2025, 3, 1, 12, 0, 10, tzinfo=timezone.utc)
    assert (s1["tokens"], s1["model_flops"], s1["compute_s"], s1["comm_s"], s1["comm_overlap_s"], s1["idle_s"]) == (
        524288, 3.1e15, 1.9, 0.5, 0.3, 0.15)
    s2 = st.filter(st["step"] == 2).row(0, named=True)
    assert (s2["end"] - s2["start"]).total_seconds() == pytest.approx(2.15)

    job = b.job.row(0, named=True)
    assert b.job.schema == JOB.schema and b.job.height == 1
    assert (job["job_id"], job["name"], job["kind"], job["model_name"], job["world_size"], job["status"]) == (
        "j1", "llama-pretrain", "training", "llama-3-8b", 16, "failed")
    assert job["submitted_at"] == datetime(2025, 3, 1, 11, 55, tzinfo=timezone.utc)
    assert job["ended_at"] == datetime(2025, 3, 1, 12, 5, tzinfo=timezone.utc) and job["started_at"] is None


def test_resent_lines_are_one_row():
    data = _jsonl(*LIFECYCLE) + _jsonl(LIFECYCLE[3], LIFECYCLE[8])
    b = job_events.parse(data, source="e")
    assert b.job_event.height == 9 and b.step.height == 2
    assert b.meta["duplicates_dropped"] == 2 and b.meta["conflicting_duplicates"] == 0
    clash = dict(LIFECYCLE[8], cause="oom")
    b = job_events.parse(_jsonl(*LIFECYCLE, clash), source="e")
    assert b.meta["conflicting_duplicates"] == 1
    assert json.loads(b.job_event.filter(b.job_event["kind"] == "failure")["payload"][0])["cause"] == "xid_79"


def test_epoch_and_rfc3339_agree():
    a = job_events.parse(_jsonl({"job_id": "j", "ts": 1740830400.5, "kind": "started"}), source="e")
    b = job_events.parse(_jsonl({"job_id": "j", "ts": "2025-03-01T12:00:00.500000000Z", "kind": "started"}), source="e")
    assert a.job_event["ts"][0] == b.job_event["ts"][0] == datetime(2025, 3, 1, 12, 0, 0, 500000, tzinfo=timezone.utc)


def _ok(**over) -> dict:
    return {"job_id": "j", "ts": "2025-03-01T12:00:00Z", "kind": "step", "step": 3, "duration_s": 1.0, **over}


@pytest.mark.parametrize(
    "data, line, field",
    [
        (b"", None, None),
        (b"\n \n", None, None),
        (b"\x00\x00\x00\x00", 1, None),
        (b"\xff\xd8\xff\xe0 jpeg", 1, None),
        (_jsonl(_ok()) + json.dumps(_ok(step=4))[:-7].encode(), 2, None),  # last line cut short
        (b'{"job_id": "j", "ts": 1, "kind": "started",}\n', 1, None),
        (b'["j", 1, "started"]\n', 1, None),
        (b'{"job_id": "j", "ts": 1, "kind": "started", "x": "' + b"y" * (1 << 20) + b'"}\n', 1, None),
        (json.dumps(_ok(loss=1.0)).replace("1.0,", "NaN,", 1).encode(), 1, None),
        (json.dumps(_ok()).replace('"duration_s": 1.0', '"duration_s": 1e999').encode(), 1, "duration_s"),
        (_jsonl(_ok(job_id=None)), 1, "job_id"),
        (_jsonl(_ok(job_id=42)), 1, "job_id"),
        (_jsonl(_ok(job_id="")), 1, "job_id"),
        (_jsonl(_ok(job_id="x" * 300)), 1, "job_id"),
        (_jsonl(_ok(ts=None)), 1, "ts"),
        (_jsonl(_ok(ts="2025-03-01 12:00:00")), 1, "ts"),  # no zone
        (_jsonl(_ok(ts="yesterday")), 1, "ts"),
        (_jsonl(_ok(ts=1740830400000)), 1, "ts"),  # milliseconds, not seconds
        (_jsonl(_ok(ts=-5)), 1, "ts"),
        (_jsonl(_ok(ts=True)), 1, "ts"),
        (_jsonl(_ok(kind="exploded")), 1, "kind"),
        (_jsonl(_ok(kind=None)), 1, "kind"),
        (_jsonl(_ok(step=None)), 1, "step"),
        (_jsonl(_ok(step=-1)), 1, "step"),
        (_jsonl(_ok(step="3")), 1, "step"),
        (_jsonl(_ok(step=2**64)), 1, "step"),
        (_jsonl(_ok(rank=-2)), 1, "rank"),
        (_jsonl(_ok(rank=1.5)), 1, "rank"),
        (_jsonl(_ok(tokens=-100)), 1, "tokens"),
        (_jsonl(_ok(model_flops="lots")), 1, "model_flops"),
        (_jsonl(_ok(grad_norm=-0.1)), 1, "grad_norm"),
        (_jsonl(_ok(cause=["a"])), 1, "cause"),
        (_jsonl(_ok(param_checksum=1.5)), 1, "param_checksum"),
        (_jsonl(_ok(start="2025-03-01T12:00:01Z")), 1, "start"),  # starts after it ends
        (_jsonl(_ok(job={"world_size": 0})), 1, "job.world_size"),
        (_jsonl(_ok(job={"kind": "batch"})), 1, "job.kind"),
        (_jsonl(_ok(job="llama")), 1, "job"),
        (_jsonl({"job_id": "j", "ts": 1, "kind": "job"}), 1, "job"),
    ],
)
def test_bad_input(data, line, field):
    with pytest.raises(ParseError) as e:
        job_events.parse(data, source="bad.jsonl")
    assert e.value.source == "bad.jsonl" and e.value.line == line
    if field:
        assert e.value.field == field

"""ingest.kineto.parse_chunks: a trace decoded piece by piece gives the Batch of a whole-file parse, on the real
traces in ../shared/realdata/traces/hta and on hand-built ones with content that trips naive splitters, cut
into tiny pieces and chunks so every boundary case occurs; bad input is a ParseError naming the byte."""

from __future__ import annotations

import gzip
import hashlib
import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from polars.testing import assert_frame_equal

from fleetscope.core.errors import ParseError
from ingest import kineto, kineto_decode, kineto_stream

REPO = Path(__file__).resolve().parents[2]
HTA = REPO.parent / "shared" / "realdata" / "traces" / "hta"
needs_traces = pytest.mark.skipif(not HTA.is_dir(), reason=f"real traces not found at {HTA}")
REAL = sorted(str(p.relative_to(HTA)) for p in HTA.rglob("*.json.gz")) if HTA.is_dir() else []


def chunks(data: bytes, size: int) -> Iterator[bytes]:
    for i in range(0, len(data), size):
        yield data[i: i + size]


def assert_same(a, b) -> None:
    for name in ("job", "step", "collective", "device_union"):
        assert_frame_equal(getattr(a, name), getattr(b, name), check_exact=True)
    assert a.meta == b.meta and a.source == b.source


def streamed(data: bytes, *, chunk: int, piece: int, source: str = "t.json", job_id: str | None = None):
    return kineto.parse_chunks(chunks(data, chunk), source=source, job_id=job_id, piece_bytes=piece)


# --- real traces ------------------------------------------------------------------------------------


@needs_traces
@pytest.mark.parametrize("rel", REAL)
def test_real_trace_streamed_equals_whole(rel):
    raw = (HTA / rel).read_bytes()
    whole = kineto.parse(raw, source=rel)
    assert whole.meta["kineto"][0]["events"] > 1000
    # gzip as stored, odd read sizes, pieces far smaller than the trace (hundreds of cuts)
    assert_same(whole, streamed(raw, chunk=65_537, piece=256 * 1024, source=rel))
    plain = gzip.decompress(raw)
    job = whole.job["job_id"].item()
    assert_same(whole, streamed(plain, chunk=1 << 20, piece=kineto.PIECE_BYTES, source=rel, job_id=job))


@needs_traces
def test_real_trace_with_keys_after_trace_events_in_tiny_pieces():
    # nccl_data ends with traceName, displayTimeUnit and baseTimeNanoseconds after the events (relative ts)
    raw = (HTA / "nccl_data_rank0_of_2/nccl_data.json.gz").read_bytes()
    whole = kineto.parse(raw, source="n")
    s = streamed(raw, chunk=4099, piece=3000, source="n")
    assert_same(whole, s)
    assert s.step["start"][0].year == 2024 and s.collective.height == 21


@needs_traces
def test_parse_many_takes_chunk_iterables():
    rels = ("two_rank_sampled_128gpu_job/sampled_rank-0.json.gz", "two_rank_sampled_128gpu_job/sampled_rank-1.json.gz")
    raws = [(r, (HTA / r).read_bytes()) for r in rels]
    whole = kineto.parse_many(raws, job_id="j")
    mixed = kineto.parse_many([(raws[0][0], raws[0][1]), (raws[1][0], chunks(raws[1][1], 10_000))], job_id="j", piece_bytes=50_000)
    assert_same(whole, mixed)
    assert whole.collective.height == 20


# --- hand-built traces --------------------------------------------------------------------------------


def _x(name, ts, dur, cat="kernel", **args) -> dict:
    return {"ph": "X", "cat": cat, "name": name, "pid": 0, "tid": 7, "ts": ts, "dur": dur, "args": args}


def tricky_events() -> list[dict]:
    """Two profiler steps with compute, memcpy and NCCL kernels, plus events whose strings and args hold what
    a splitter looking for `}, {` or `]` would cut at."""
    ev: list[dict] = []
    for step, t0 in ((7, 1000), (8, 2000)):
        ev += [
            _x(f"ProfilerStep#{step}", t0, 900, cat="user_annotation"),
            _x('aten::weird}, {"name": "x"}] "quoted" \\ back\\slash', t0 + 1, 3, cat="cpu_op",
               **{"Input Dims": [[1, 2], []], "note": '}, {"ph": "X"}', "nested": {"a": {"b": [{"c": "}]"}, {}]}, "d": "{"}}),
            _x("cudaLaunchKernel", t0 + 2, 1, cat="cuda_runtime", correlation=step * 10 + 1, **{"External id": step}),
            _x("sm80_xmma_gemm_\u00e9\u4e2d\U0001F600", t0 + 10, 300, stream=7, correlation=step * 10 + 1),
            _x("Memcpy HtoD", t0 + 200, 150, cat="gpu_memcpy", stream=7, correlation=step * 10 + 2),
            _x("record_param_comms", t0 + 3, 5, cat="cpu_op", **{"External id": 40 + step, "Collective name": "_allgather_base",
               "In msg nelems": 256, "Out msg nelems": 1024, "dtype": "BFloat16", "Group size": 4, "Process Group Name": "7"}),
            _x("ncclKernel_AllGather_RING_LL_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)", t0 + 250, 100, stream=20,
               correlation=step * 10 + 3, **{"External id": 40 + step}),
            _x("ncclDevKernel_AllReduce_Sum_f32_RING_LL(x)", t0 + 400, 120, stream=21, correlation=step * 10 + 4,
               **{"Collective name": "allreduce", "In msg nelems": 1000, "Out msg nelems": 1000, "dtype": "Float",
                  "Group size": 4, "Process Group Name": "0"}),
            {"ph": "M", "name": "thread_name", "pid": 0, "tid": 7, "args": {"name": "}, {\"]"}},
            {"ph": "f", "id": step, "pid": 0, "tid": 7, "ts": t0 + 5, "cat": "ac2g", "name": "flow"},
        ]
    return ev


def tricky_trace(*, events_first: bool = False, indent: int | None = None, ascii_only: bool = False) -> bytes:
    top = {"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "NVIDIA H100 {\"80GB\"}"}],
           "distributedInfo": {"backend": "nccl", "rank": 3, "world_size": 4, "pg_config": [{"pg_name": "0", "ranks": [0, 1]}]}}
    tail = {"traceName": "/tmp/x}]}.json", "displayTimeUnit": "ms", "baseTimeNanoseconds": 1_700_000_000_000_000_000}
    doc = {"traceEvents": tricky_events(), **top, **tail} if events_first else {**top, "traceEvents": tricky_events(), **tail}
    return json.dumps(doc, indent=indent, ensure_ascii=ascii_only).encode()


@pytest.mark.parametrize("events_first", [False, True], ids=["events-mid", "events-first"])
@pytest.mark.parametrize("indent", [None, 2], ids=["compact", "indented"])
@pytest.mark.parametrize("ascii_only", [False, True], ids=["utf8", "escaped"])
def test_tricky_trace_in_every_piece_and_chunk_size(events_first, indent, ascii_only):
    data = tricky_trace(events_first=events_first, indent=indent, ascii_only=ascii_only)
    whole = kineto.parse(data, source="t.json")
    assert (whole.step.height, whole.collective.height) == (2, 4)
    assert whole.step["comm_s"][0] == pytest.approx(220e-6)
    gz = gzip.compress(data)
    for piece in (1, 7, 64, 500, 4096, 1 << 20):
        for chunk in (1, 5, 333, len(data)):
            got = streamed(data, chunk=chunk, piece=piece, job_id=whole.job["job_id"].item())
            assert_same(whole, got)
        assert_same(kineto.parse(gz, source="t.json"), streamed(gz, chunk=97, piece=piece))


def test_a_cut_at_every_byte_of_the_input():
    # Compared at the reduction the Batch is built from (building thousands of Batches would take minutes).
    data = tricky_trace(indent=1)
    want = kineto_decode._reduce(kineto.load(data, source="t.json"))
    assert want.collectives.height == 4 and len(want.work_ts_us) == 8
    assert sorted(want.unions) == ["all", "before_last_step", "through_last_step"]
    for k in range(1, len(data)):
        got, _ = kineto_stream._load_chunks(iter((data[:k], data[k:])), "t.json", 300)
        assert_frame_equal(got.profiler_steps, want.profiler_steps)
        assert_frame_equal(got.collectives, want.collectives)
        assert (got.work_ts_us == want.work_ts_us).all() and (got.work_end_us == want.work_end_us).all()
        assert (got.work_comm == want.work_comm).all() and got.meta == want.meta, k
        assert got.unions == want.unions and got.device_start_us == want.device_start_us, k


def test_multi_member_gzip_and_default_job_id_is_the_hash_of_the_file():
    data = tricky_trace()
    gz = gzip.compress(data[:1000]) + gzip.compress(data[1000:])
    whole = kineto.parse(gz, source="t.json")
    assert_same(whole, streamed(gz, chunk=10, piece=200))
    # streamed or whole, the id hashes the raw (here compressed, two-member) bytes as given
    want = "kineto-" + hashlib.sha256(gz).hexdigest()[:16]
    assert whole.job["job_id"].item() == want
    assert streamed(gz, chunk=7, piece=200).job["job_id"].item() == want


# --- bad input ------------------------------------------------------------------------------------


def _bad(data: bytes, **kw) -> ParseError:
    with pytest.raises(ParseError) as ei:
        streamed(data, chunk=kw.pop("chunk", 50), piece=kw.pop("piece", 64), source="bad.json")
    err = ei.value
    assert err.source == "bad.json" and "bad.json" in str(err)
    return err


def _byte(err: ParseError) -> int:
    m = re.search(r"\(byte (\d+)", err.message)
    assert m, err.message
    return int(m.group(1))


def test_truncated_mid_event_names_the_event_byte_and_line():
    data = tricky_trace(indent=2)
    for cut in (len(data) // 3, len(data) // 2, len(data) - 200):
        err = _bad(data[:cut])
        assert "truncated" in err.message and _byte(err) <= cut
        assert err.line == data.count(b"\n", 0, _byte(err)) + 1
        assert err.field and err.field.startswith("traceEvents[")


def test_truncated_gzip_mid_event():
    gz = gzip.compress(tricky_trace(indent=2))
    err = _bad(gz[: len(gz) // 2])
    assert "gzip" in err.message and "truncated" in err.message


def test_garbage_inside_an_event_names_its_byte_line_and_index():
    data = tricky_trace(indent=2)
    pos = data.index(b'"Memcpy HtoD"')
    bad = data[:pos] + b"@@garbage@@" + data[pos + 1:]
    n = json.loads(data)["traceEvents"].index(next(e for e in tricky_events() if e["name"] == "Memcpy HtoD"))
    for piece in (100, 1 << 20):  # the bad event alone in its piece, or after others in one piece
        err = _bad(bad, piece=piece)
        assert "not valid JSON" in err.message
        assert _byte(err) == pos and err.line == bad.count(b"\n", 0, pos) + 1
        assert err.field == f"traceEvents[{n}]"


@pytest.mark.parametrize(
    ("data", "words", "field"),
    [
        (b"", "empty input", None),
        (b"   \n ", "empty input", None),
        (b"this is not json", "top level must be a JSON object", None),
        (b"[1, 2, 3]", "top level must be a JSON object", None),
        (b'{"schemaVersion": 1}', "no 'traceEvents'", "traceEvents"),
        (b'{"traceEvents": null}', "no 'traceEvents'", "traceEvents"),
        (b'{"traceEvents": {"a": [1]}}', "must be an array, got dict", "traceEvents"),
        (b'{"traceEvents": "[{}]"}', "must be an array, got str", "traceEvents"),
        (b'{"traceEvents": []}', "no events", "traceEvents"),
        (b'{"traceEvents": [17, {"ph": "X"}]}', "expected an event object", "traceEvents[0]"),
        (b'{"traceEvents": [{"ph": "i"}, 17]}', "object", "traceEvents[1]"),
        (b'{"traceEvents": [{"ph": "i", "args": 5}]}', "Expected `object | null`", "traceEvents[0].args"),
        (b'{"traceEvents": [{"ph": "i"}], "traceEvents": [{"ph": "i"}]}', "given twice", "traceEvents"),
        (b'{"traceEvents": [{"ph": "i"}]} trailing', "data after the top-level object", None),
        (b'{"traceEvents": [{"ph": "i"}] "x": 1}', "expected ',' or '}'", None),
        (b'{"traceEvents": [{"ph": "i"}], "distributedInfo": {"rank": -1}}', "not a non-negative integer", "distributedInfo.rank"),
        (b'{"distributedInfo": {"rank": 1,, }, "traceEvents": [{"ph": "i"}]}', "not valid JSON", "distributedInfo"),
        (b'{"traceEvents": [{"ph": "X", "cat": "k", "name": "n", "ts": 1, "dur": -5}]}', "out of range", "traceEvents[0].dur"),
        (b'{"traceEvents": [{"ph": "i"}' + b', {"ph": "i"}' * 50 + b', {"ph": "X", "cat": "k", "name": 3, "ts": 1, "dur": 1}]}',
         "name must be a string", "traceEvents[51].name"),
    ],
)
def test_bad_input_is_a_parse_error_naming_what_and_where(data, words, field):
    err = _bad(data, chunk=7, piece=16)
    assert words in err.message
    assert err.field == field


def test_hostile_nesting_depth_is_a_parse_error_not_a_crash():
    deep = b'{"traceEvents": [{"ph": "i", "args": {"x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}}]}"
    err = _bad(deep, chunk=4096, piece=1 << 20)
    assert "nested too deeply" in err.message and err.field == "traceEvents[0]"
    with pytest.raises(ParseError, match="nested too deeply"):
        kineto.parse(deep, source="bad.json")
    # an unclosed nest never ends an event: the byte where it started is named
    err = _bad(b'{"traceEvents": [{"ph": "i", "args": ' + b"[" * 10_000, chunk=4096)
    assert "ends inside an event" in err.message and err.field == "traceEvents[0]"


def test_strings_full_of_fake_boundaries_cost_time_not_correctness():
    # every candidate cut inside one long string: the exact scanner takes over after two misses
    name = '}, {"ph": "X"}, ' * 20_000 + '}]'
    data = tricky_trace().replace(b'"traceEvents": [', b'"traceEvents": [' + json.dumps(_x(name, 5, 1, cat="cpu_op")).encode() + b", ", 1)
    whole = kineto.parse(data, source="t.json")
    assert_same(whole, streamed(data, chunk=1 << 16, piece=1 << 14, job_id=whole.job["job_id"].item()))


def test_an_event_past_the_size_cap_is_refused_naming_it(monkeypatch):
    """One event larger than the cap (a body of nothing but one open-ended event) is a ParseError naming
    the event, found in time linear in its size: the text is looked at again only when it has doubled."""
    monkeypatch.setattr(kineto_stream, "_MAX_EVENT_BYTES", 2**20)
    looks = []
    real = kineto_stream._event_end
    monkeypatch.setattr(kineto_stream, "_event_end", lambda buf, start: looks.append(len(buf) - start) or real(buf, start))
    body = b'{"traceEvents": [{"ph": "X", "name": "' + b"a" * (3 * 2**20)
    with pytest.raises(ParseError, match=r"traceEvents\[0\].*no end of event within 1 MiB"):
        kineto.parse_chunks([body[i:i + 4096] for i in range(0, len(body), 4096)], source="huge.json", job_id="j", piece_bytes=4096)
    assert len(looks) <= 12 and all(b >= 2 * a for a, b in zip(looks, looks[1:]))

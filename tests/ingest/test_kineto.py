"""ingest.kineto on real PyTorch profiler traces (shared/realdata/traces/hta) and on hand-built ones."""

from __future__ import annotations

import gzip
import hashlib
import json
from datetime import datetime, timedelta, timezone
from pathlib import Path

import polars as pl
import pytest

from analyzers import c3
from fleetscope.core.errors import ParseError
from fleetscope.core.frames import COLLECTIVE, STEP
from ingest import kineto

REPO = Path(__file__).resolve().parents[2]
HTA = REPO.parent / "shared" / "realdata" / "traces" / "hta"
needs_traces = pytest.mark.skipif(not HTA.is_dir(), reason=f"real traces not found at {HTA}")


def _read(rel: str) -> bytes:
    return (HTA / rel).read_bytes()


# --- synthetic traces -----------------------------------------------------------------------------


def _trace(events: list[dict], **top) -> bytes:
    doc = {"schemaVersion": 1, "distributedInfo": {"backend": "nccl", "rank": 0, "world_size": 4}, **top, "traceEvents": events}
    return json.dumps(doc).encode()


def _x(name, ts, dur, cat="kernel", **args) -> dict:
    return {"ph": "X", "cat": cat, "name": name, "pid": 0, "tid": 7, "ts": ts, "dur": dur, "args": args}


STEP_SPAN = _x("ProfilerStep#7", 1000, 100, cat="user_annotation")


def _launch(corr: int, ts: float, ext: int = -1) -> dict:
    return _x("cudaLaunchKernel", ts, 1, cat="cuda_runtime", correlation=corr, **({"External id": ext} if ext >= 0 else {}))


def test_step_breakdown_on_hand_built_trace():
    # step [1000, 1100): compute [1010, 1040) + memcpy [1030, 1050) → compute union 40;
    # NCCL [1045, 1075) → comm 30, overlap with compute [1045, 1050) = 5; busy = 40 + 30 − 5 = 65, idle 35.
    ev = [
        STEP_SPAN,
        _launch(1, 1001), _x("sm80_xmma_gemm", 1010, 30, stream=7, correlation=1),
        _launch(2, 1002), _x("Memcpy HtoD (Pageable -> Device)", 1030, 20, cat="gpu_memcpy", stream=7, correlation=2),
        _launch(3, 1003),
        _x("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)", 1045, 30, stream=20, correlation=3,
           **{"Collective name": "allreduce", "In msg nelems": 1000, "Out msg nelems": 1000, "dtype": "Float",
              "Group size": 4, "Process Group Name": "0"}),
    ]
    b = kineto.parse(_trace(ev), source="t.json", job_id="j1")
    s = b.step.row(0, named=True)
    assert (s["rank"], s["step"], s["job_id"]) == (0, 7, "j1")
    assert s["compute_s"] == pytest.approx(40e-6)
    assert s["comm_s"] == pytest.approx(30e-6)
    assert s["comm_overlap_s"] == pytest.approx(5e-6)
    assert s["idle_s"] == pytest.approx(35e-6)
    assert b.step.schema == pl.Schema(STEP.schema)
    c = b.collective.row(0, named=True)
    assert c["op"] == "all_reduce" and c["comm_id"] == "pg:0" and c["seq"] == 0
    assert (c["bytes"], c["nranks"], c["dtype"], c["algo"], c["proto"]) == (4000, 4, "Float", "RING", "LL")
    assert c["duration_s"] == pytest.approx(30e-6)
    assert c["algbw_gbps"] == pytest.approx(4000 / 30e-6 / 1e9)
    assert c["busbw_gbps"] == pytest.approx(c["algbw_gbps"] * 2 * 3 / 4)  # nccl-tests all-reduce factor
    assert b.collective.schema == pl.Schema(COLLECTIVE.schema)
    assert b.job["world_size"].to_list() == [4]


def test_old_kernel_name_takes_metadata_from_record_param_comms():
    # PyTorch < 2.2 wrote collective args only on the record_param_comms CPU op; the kernel shares its External id.
    ev = [
        STEP_SPAN,
        _x("record_param_comms", 1001, 5, cat="cpu_op", **{"External id": 42, "Collective name": "_allgather_base",
           "In msg nelems": 256, "Out msg nelems": 1024, "dtype": "BFloat16", "Group size": 4, "Process Group Name": "7"}),
        _launch(9, 1002, ext=42),
        _x("ncclKernel_AllGather_RING_LL_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)", 1010, 10, stream=20,
           correlation=9, **{"External id": 42}),
        _x("ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)", 1050, 10, stream=21, correlation=10),
    ]
    c = kineto.parse(_trace(ev), job_id="j").collective.sort("start")
    ag, sr = c.row(0, named=True), c.row(1, named=True)
    assert (ag["op"], ag["bytes"], ag["comm_id"], ag["algo"]) == ("all_gather", 2048, "pg:7", "RING")
    assert ag["busbw_gbps"] == pytest.approx(ag["algbw_gbps"] * 3 / 4)
    # no metadata anywhere: op from the kernel name, group from world size, comm from the stream
    assert (sr["op"], sr["bytes"], sr["nranks"], sr["comm_id"], sr["proto"]) == ("send_recv", None, 4, "stream:21", "SIMPLE")


def test_relative_timestamps_use_base_time_and_gzip_is_detected():
    ev = [STEP_SPAN, _launch(1, 1001), _x("k", 1010, 5, stream=7, correlation=1)]
    raw = _trace(ev, baseTimeNanoseconds=1_700_000_000_000_000_000)
    b1 = kineto.parse(raw, job_id="j")
    b2 = kineto.parse(gzip.compress(raw), job_id="j")
    assert b1.step.equals(b2.step)
    assert b1.step["start"][0] == datetime(2023, 11, 14, 22, 13, 20, 1000, tzinfo=timezone.utc)
    # without baseTimeNanoseconds and with small ts, the trace has no absolute clock: say so
    assert kineto.load(_trace(ev)).relative_time is True


def test_default_job_id_is_the_hash_of_the_bytes_as_given():
    # the same file re-ingested must land on the same natural keys, so the id comes from its bytes alone
    raw = _trace([STEP_SPAN])
    gz = gzip.compress(raw, mtime=0)
    assert kineto.parse(raw).step["job_id"].to_list() == ["kineto-" + hashlib.sha256(raw).hexdigest()[:16]]
    # compressed, it is another file: hashed as given, not after inflating
    assert kineto.parse(gz).step["job_id"].to_list() == ["kineto-" + hashlib.sha256(gz).hexdigest()[:16]]
    assert kineto.parse(raw, job_id="j").step["job_id"].to_list() == ["j"]


# --- bad input ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "where"),
    [
        (b"", None),
        (b'{"traceEvents": [{"ph": "X", "ts": 1,', "line"),
        (gzip.compress(_trace([STEP_SPAN]))[:-20], None),
        (b"this is not json", "line"),
        (b"[1, 2, 3]", None),
        (b'{"schemaVersion": 1}', "traceEvents"),
        (b'{"traceEvents": {}}', "traceEvents"),
        (b'{"traceEvents": []}', "traceEvents"),
        (_trace([STEP_SPAN, _x("k", 10, -5)]), "traceEvents[1].dur"),
        (_trace([STEP_SPAN, _x("k", 1e300, 5)]), "traceEvents[1].ts"),
        (_trace([STEP_SPAN, _x("k", "10", 5)]), "traceEvents[1].ts"),
        (_trace([STEP_SPAN, _x("k", 10, 1e18)]), "traceEvents[1].dur"),
        (_trace([STEP_SPAN, _x("k", True, 5)]), "traceEvents[1].ts"),
        (_trace([STEP_SPAN, 17]), "traceEvents[1]"),
        (_trace([STEP_SPAN, {**_x("k", 10, 5), "name": 3}]), "traceEvents[1].name"),
        (json.dumps({"distributedInfo": {"rank": -1}, "traceEvents": [STEP_SPAN]}).encode(), "distributedInfo.rank"),
    ],
    ids=["empty", "truncated-json", "truncated-gzip", "not-json", "not-object", "no-traceEvents", "traceEvents-not-list",
         "no-events", "negative-dur", "huge-ts", "string-ts", "huge-dur", "bool-ts", "event-not-object", "name-not-str",
         "negative-rank"],
)
def test_bad_input_raises_parse_error_naming_source_and_place(data, where):
    with pytest.raises(ParseError) as ei:
        kineto.parse(data, source="bad.json")
    err = ei.value
    assert err.source == "bad.json" and "bad.json" in str(err)
    if where == "line":
        assert err.line is not None
    elif where is not None:
        assert err.field == where


def test_nan_timestamp_is_rejected():
    # JSON has no NaN, but Python's json module and some writers emit the bare token; either the decoder
    # refuses it (orjson) or the value check does (stdlib json).
    raw = _trace([STEP_SPAN, _x("k", 10, 5)]).replace(b'"ts": 10,', b'"ts": NaN,')
    with pytest.raises(ParseError) as ei:
        kineto.parse(raw, source="nan.json")
    assert ei.value.source == "nan.json" and (ei.value.field == "traceEvents[1].ts" or ei.value.line is not None)


def test_parse_many_rejects_duplicate_rank():
    raw = _trace([STEP_SPAN])
    with pytest.raises(ParseError, match="rank 0"):
        kineto.parse_many([("a.json", raw), ("b.json", raw)], job_id="j")
    with pytest.raises(ParseError):
        kineto.parse_many([], job_id="j")


# --- real traces ----------------------------------------------------------------------------------

REAL = {
    # file: (rank, world_size, profiler steps, NCCL kernels)
    "two_rank_sampled_128gpu_job/sampled_rank-0.json.gz": (0, 128, 2, 10),
    "nccl_data_rank0_of_2/nccl_data.json.gz": (0, 2, 3, 21),
    "df_index_resolver_rank1_of_2/df_index_resolver.json.gz": (1, 2, 5, 2020),
    "queue_length_rank0_of_16/rank0.json.gz": (0, 16, 5, 80),
    "trace_diff/control/control.json.gz": (3, 8, 6, 60),
    "trace_diff/test/test.json.gz": (1, 2, 6, 64),
}


@needs_traces
@pytest.mark.parametrize("rel", sorted(REAL))
def test_real_trace_steps_add_up(rel):
    rank, world, n_steps, n_nccl = REAL[rel]
    b = kineto.parse(_read(rel), source=rel, job_id="real")
    assert b.step.height == n_steps and b.collective.height == n_nccl
    assert set(b.step["rank"]) == {rank} and b.job["world_size"].item() == world
    st = b.step.with_columns(((pl.col("end") - pl.col("start")).dt.total_microseconds() / 1e6).alias("step_s"))
    # compute ∪ comm + idle == window, to float precision (µs rounding of the window bounds aside)
    total = st["compute_s"] + st["comm_s"] - st["comm_overlap_s"] + st["idle_s"]
    assert ((total - st["step_s"]).abs() < 2e-6).all()
    assert (st["comm_overlap_s"] <= st["comm_s"] + 1e-12).all() and (st["idle_s"] >= 0).all()
    assert b.collective.select(pl.struct("comm_id", "seq").is_unique().all()).item()
    assert b.step["start"].dt.year().min() >= 2022  # absolute epoch timestamps


@needs_traces
def test_real_trace_collective_metadata_from_kernel_args():
    b = kineto.parse(_read("nccl_data_rank0_of_2/nccl_data.json.gz"), job_id="j")
    c = b.collective
    assert set(c["op"]) == {"all_reduce", "broadcast"} and set(c["comm_id"]) == {"pg:0"}
    assert c["seq"].to_list() == list(range(21)) and set(c["nranks"]) == {2}
    first_ar = c.filter(pl.col("op") == "all_reduce").row(0, named=True)
    assert first_ar["bytes"] == 2049000 * 4 and first_ar["dtype"] == "Float"
    # relative ts + baseTimeNanoseconds (2024-04-01) give an absolute 2024 time
    assert b.step["start"][0].year == 2024


@needs_traces
def test_parse_many_two_ranks_of_one_job():
    files = [(p, _read(p)) for p in ("two_rank_sampled_128gpu_job/sampled_rank-0.json.gz",
                                     "two_rank_sampled_128gpu_job/sampled_rank-1.json.gz")]
    b = kineto.parse_many(files[::-1], job_id="job-128")
    assert sorted(set(b.step["rank"])) == [0, 1] and set(b.step["job_id"]) == {"job-128"}
    assert b.step.height == 4 and b.collective.height == 20
    # the same collective on both ranks lines up by (comm_id, seq)
    pairs = b.collective.group_by("comm_id", "seq").agg(pl.len().alias("n"))
    assert (pairs["n"] == 2).all()
    assert len(b.meta["kineto"]) == 2


# --- device_union: HTA's unions, reduced at ingest ---------------------------------------------------------


@needs_traces
@pytest.mark.parametrize("rel", sorted(REAL))
def test_device_union_rows_are_the_unions_hta_is_computed_from(rel):
    # the stored reduction is analyzers.c3's from the trace in memory, window by window, to the bit
    raw = _read(rel)
    b = kineto.parse(raw, source=rel, job_id="real")
    t = kineto.load(raw, source=rel)
    want = c3.hta_unions(t.device_events, t.profiler_steps).sort("window")
    got = b.device_union.sort("window")
    assert got.select(want.columns).equals(want)
    assert got["job_id"].unique().to_list() == ["real"] and got["start"].n_unique() == 1
    # the trace's first device event, HTA-rounded, on the trace's clock
    first = t.device_events.filter(pl.col("stream") != -1)["ts_us"].ceil().min() + t.origin_us
    assert got["start"][0] == datetime.fromtimestamp(0, timezone.utc) + timedelta(microseconds=round(first))
    named = t.profiler_steps["step"]
    assert (got["step_min"].to_list(), got["step_max"].to_list()) == (
        ([named.min()] * got.height, [named.max()] * got.height) if named.len() else ([None], [None]))
    # a trace without profiler steps has only the window that leaves nothing out
    assert sorted(got["window"]) == (["all", "before_last_step", "through_last_step"] if named.len() else ["all"])


def test_device_union_windows_on_hand_built_trace():
    # two host steps; a gemm launched in step 7 that runs late, an NCCL kernel under it, a memcpy after, and a
    # gemm launched in the last step: HTA rounds starts up and ends down, and windows go by launch time
    events = [
        _x("ProfilerStep#7", 1000, 100, cat="user_annotation"), _x("ProfilerStep#8", 1100, 100, cat="user_annotation"),
        _launch(1, 1001), _launch(2, 1002), _launch(3, 1003), _launch(4, 1150),
        _x("sm80_gemm", 1010.4, 40, stream=7, correlation=1),                 # [1011, 1050)
        _x("ncclDevKernel_AllReduce_Sum_f32", 1030, 40, stream=9, correlation=2),  # [1030, 1070)
        _x("Memcpy DtoH (Device -> Pinned)", 1080, 10, cat="gpu_memcpy", stream=7, correlation=3),  # [1080, 1090)
        _x("sm80_gemm", 1160, 20, stream=7, correlation=4),                   # [1160, 1180), launched in the last step
    ]
    u = {r["window"]: r for r in kineto.parse(_trace(events), job_id="j").device_union.iter_rows(named=True)}
    before = u["before_last_step"]
    assert (before["events"], before["span_us"], before["busy_us"]) == (3, 79.0, 69.0)  # [1011, 1090), idle 1070-1080
    assert (before["compute_us"], before["comm_us"], before["overlap_us"]) == (39.0, 40.0, 20.0)  # gemm ∩ nccl = [1030, 1050)
    assert (u["through_last_step"]["events"], u["through_last_step"]["span_us"]) == (4, 169.0)
    assert u["all"]["compute_us"] == 59.0 and (before["step_min"], before["step_max"]) == (7, 8)
    assert c3.hta_breakdown(kineto.parse(_trace(events), job_id="j").device_union, "before_last_step").row(0, named=True) == {
        "rank": 0, "idle_time_us": 10.0, "compute_time_us": 39.0, "non_compute_time_us": 30.0, "kernel_time_us": 79.0,
        "idle_time_pctg": 12.66, "compute_time_pctg": 49.37, "non_compute_time_pctg": 37.97,
        "comp_comm_overlap_ratio": 0.5, "comp_comm_overlap_pctg": 50.0}

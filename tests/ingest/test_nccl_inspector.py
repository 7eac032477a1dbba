"""NCCL Inspector parser: the real README examples (v4.0, Prometheus v5.1), the v4.1-v4.3 layouts as
the plugin's inspector_json.cc writes them, and hostile input."""

from __future__ import annotations

import json
from datetime import datetime, timezone

import pytest

from fleetscope.core.errors import ParseError
from fleetscope.core.frames import COLLECTIVE, METRIC_SAMPLE
from ingest import nccl_inspector

V40 = "nccl-inspector_output-examples_v4.0_from-README.jsonl"
PROM = "nccl-inspector_prometheus-textfile-examples_v5.1_from-README.prom"

HEADER = {"id": "0x7f8c496ae9f661", "comm_name": "DP Group 0", "rank": 2, "n_ranks": 8, "nnodes": 1}


def _meta(version: str) -> dict:
    return {"inspector_output_format_version": version, "git_rev": "", "rec_mechanism": "nccl_profiler_interface",
            "dump_timestamp_us": 1748030377748202, "hostname": "node-7", "pid": 1639453}


def _marker(version: str, coll: int, p2p: int, proxy: int | None = None, header: dict = HEADER) -> dict:
    stats = {"coll_records": coll, "coll_dropped_total": 0, "coll_dropped_since_last_dump": 0,
             "p2p_records": p2p, "p2p_dropped_total": 0, "p2p_dropped_since_last_dump": 0}
    if proxy is not None:
        stats["proxy_records"] = proxy
    return {"header": header, "metadata": _meta(version), "dump_stats": stats}


def _coll(sn: int, size: int = 1 << 20, **extra) -> dict:
    return {"coll_perf": {"coll": "AllReduce", "coll_sn": sn, "coll_msg_size_bytes": size, "coll_exec_time_us": 100,
                          "coll_timing_source": "kernel_gpu", "coll_algobw_gbs": 10.5, "coll_busbw_gbs": 18.375,
                          **extra}}


def _p2p(sn: int) -> dict:
    return {"p2p_perf": {"p2p": "Send", "p2p_sn": sn, "p2p_peer": 3, "p2p_msg_size_bytes": 4096,
                         "p2p_exec_time_us": 7, "p2p_timing_source": "kernel_gpu", "p2p_algobw_gbs": 0.5,
                         "p2p_busbw_gbs": 0.5}}


def _jsonl(*objs: dict) -> bytes:
    return b"".join(json.dumps(o).encode() + b"\n" for o in objs)


def test_real_v40_examples(telemetry):
    path = telemetry / V40
    b = nccl_inspector.parse(path.read_bytes(), source=str(path))
    df = b.collective
    assert df.schema == COLLECTIVE.schema and df.height == 3
    r = df.row(0, named=True)
    assert (r["rank"], r["nranks"], r["comm_id"], r["seq"], r["op"]) == (2, 8, "0x7f8c496ae9f661", 1407, "AllReduce")
    assert r["bytes"] == 17179869184 and r["duration_s"] == pytest.approx(0.061974)
    assert r["algbw_gbps"] == 277.210914 and r["busbw_gbps"] == 485.119099
    assert r["host"] == "example-hostname" and r["start"] is None and r["gpu_uuid"] is None
    v = df.row(1, named=True)  # the verbose example: start from the first kernel_start_ts
    assert (v["op"], v["seq"], v["rank"], v["bytes"]) == ("ReduceScatter", 1231, 4, 2147483648)
    assert v["start"] == datetime(2025, 7, 18, 19, 33, 49, 235181, tzinfo=timezone.utc)
    assert v["busbw_gbps"] == 366.134533
    last = df.row(2, named=True)
    assert (last["rank"], last["nranks"], last["bytes"], last["seq"]) == (31, 32, 65536, 129)
    assert last["duration_s"] == pytest.approx(110e-6)
    assert b.meta["format_versions"] == ["v4.0"]
    assert set(df["job_id"]) == {"unknown"} and b.meta["job_id_source"] == "none"


def test_job_id_precedence(telemetry):
    raw = (telemetry / V40).read_bytes()
    b = nccl_inspector.parse(raw, source="/logs/nccl-inspector-8812/host.log")
    assert set(b.collective["job_id"]) == {"8812"} and b.meta["job_id_source"] == "dump_dir"
    b = nccl_inspector.parse(raw, source="/logs/nccl-inspector-8812/host.log", job_id="train-42")
    assert set(b.collective["job_id"]) == {"train-42"} and b.meta["job_id_source"] == "caller"


def test_v41_marker_and_self_contained_records():
    rec = {"header": HEADER, "metadata": _meta("v4.1"), **_coll(5)}
    b = nccl_inspector.parse(_jsonl(_marker("v4.1", 1, 0), rec), source="v41.log")
    assert b.collective.height == 1 and b.meta["dump_markers"] == 1
    assert b.collective["algo"][0] is None  # algo/proto arrive in v4.2


def test_v42_algo_proto():
    rec = {"header": HEADER, "metadata": _meta("v4.2"), **_coll(9, coll_algo="RING", coll_proto="LL")}
    b = nccl_inspector.parse(_jsonl(_marker("v4.2", 1, 0), rec), source="v42.log")
    assert (b.collective["algo"][0], b.collective["proto"][0]) == ("RING", "LL")


def test_v43_bare_records_inherit_marker_context():
    other = {**HEADER, "id": "0xabc", "rank": 0, "n_ranks": 2}
    data = _jsonl(
        _marker("v4.3", 2, 1, proxy=1), _coll(1, coll_algo="RING", coll_proto="SIMPLE"), _coll(2),
        _p2p(1), {"proxy_trace": {"record_type": "proxy_op", "record_sn": 1}},
        _marker("v4.3", 1, 0, header=other), _coll(1),
    )
    b = nccl_inspector.parse(data, source="v43.log")
    df = b.collective
    assert df.height == 4 and b.meta["proxy_records"] == 1 and b.meta["format_versions"] == ["v4.3"]
    first = df.filter(df["comm_id"] == "0x7f8c496ae9f661")
    assert first["seq"].to_list() == [1, 2] and set(first["rank"]) == {2} and set(first["host"]) == {"node-7"}
    p2p = df.filter(df["op"] == "Send").row(0, named=True)
    # p2p_sn counts separately from coll_sn: a distinct comm_id keeps Send #1 apart from AllReduce #1
    assert p2p["comm_id"] == "0x7f8c496ae9f661#p2p" and p2p["seq"] == 1 and p2p["bytes"] == 4096
    second = df.filter(df["comm_id"] == "0xabc").row(0, named=True)
    assert (second["rank"], second["nranks"]) == (0, 2)


@pytest.mark.parametrize(
    "objs, line, field",
    [
        ([_coll(1)], 1, "header"),  # bare record, no marker: must not invent a communicator
        ([_marker("v4.3", 1, 0), _coll(1), _coll(2)], 3, "coll_perf"),  # beyond announced counts
        ([_marker("v4.3", 2, 0), _coll(1)], 2, "dump_stats"),  # file ends inside the dump
        ([_marker("v4.3", 2, 0), _coll(1), _marker("v4.3", 1, 0)], 3, "dump_stats"),  # interleaved
        ([_marker("v4.3", 1, 0), {**_coll(1), "extra": 1}], 2, "extra"),
        ([_marker("v4.3", "2", 0)], 1, "dump_stats.coll_records"),
    ],
)
def test_v43_context_errors(objs, line, field):
    with pytest.raises(ParseError) as e:
        nccl_inspector.parse(_jsonl(*objs), source="v43.log")
    assert (e.value.source, e.value.line, e.value.field) == ("v43.log", line, field)


def _v40(**perf_over) -> dict:
    rec = {"header": {"id": "0x1", "rank": 0, "n_ranks": 2, "nnodes": 1}, "metadata": _meta("v4.0"), **_coll(3)}
    rec["coll_perf"].update(perf_over)
    return rec


@pytest.mark.parametrize(
    "data, line, field",
    [
        (b"", None, None),
        (b"\n  \n", None, None),
        (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", 1, None),
        (b"ok\n\x00\x00\x00\rIHDR", 2, None),
        (b"\xff\xfe\xfa\xfb", 1, None),
        (_jsonl(_v40()) + json.dumps(_v40())[:-20].encode(), 2, None),  # last line cut
        (b'{"header": {"id": "0x1", ,}}\n', 1, None),
        (b"[1, 2, 3]\n", 1, None),
        (b'{"something": 1}\n', 1, None),
        (b'{"a": "' + b"x" * (2 << 20) + b'"}\n', 1, None),
        (_jsonl(_v40(coll_busbw_gbs=-1.0)), 1, "coll_perf.coll_busbw_gbs"),
        (_jsonl(_v40(coll_msg_size_bytes=-5)), 1, "coll_perf.coll_msg_size_bytes"),
        (_jsonl(_v40(coll_msg_size_bytes=2**64)), 1, "coll_perf.coll_msg_size_bytes"),
        (_jsonl(_v40(coll_msg_size_bytes="1024")), 1, "coll_perf.coll_msg_size_bytes"),
        (json.dumps(_v40()).replace('"coll_exec_time_us": 100', '"coll_exec_time_us": 1e400').encode(), 1,
         "coll_perf.coll_exec_time_us"),
        (_jsonl(_v40(coll_sn=True)), 1, "coll_perf.coll_sn"),
        (_jsonl(_v40(coll=None)), 1, "coll_perf.coll"),
        (json.dumps(_v40()).replace("10.5", "NaN").encode(), 1, None),
        (json.dumps(_v40()).replace('"rank": 0', '"rank": 5').encode(), 1, "header.rank"),
    ],
)
def test_bad_input(data, line, field):
    with pytest.raises(ParseError) as e:
        nccl_inspector.parse(data, source="bad.log")
    assert e.value.source == "bad.log"
    assert e.value.line == line
    if field:
        assert e.value.field == field


def test_resent_line_is_one_row(telemetry):
    lines = (telemetry / V40).read_bytes().splitlines()
    b = nccl_inspector.parse(b"\n".join(lines + lines[:1]), source=V40)
    assert b.collective.height == 3 and b.meta["duplicates_dropped"] == 1


def test_prometheus_textfile(telemetry):
    path = telemetry / PROM
    when = datetime(2025, 6, 1, 12, tzinfo=timezone.utc)
    src = "/var/lib/node_exporter/nccl_inspector/nccl_inspector_metrics_GPU-9f1c2b6e-0000-4d5e-8f00-112233445566.prom"
    b = nccl_inspector.parse_prometheus(path.read_bytes(), source=src, ts=when, job_id="train-42")
    df = b.metric_sample
    assert df.schema == METRIC_SAMPLE.schema and df.height == 4
    vals = {s.split("{")[0]: v for s, v in zip(df["series"], df["value"])}
    assert vals == {"nccl_bus_bandwidth_gbs": 678.263, "nccl_collective_exec_time_microseconds": 9498.47,
                    "nccl_p2p_bus_bandwidth_gbs": 464.9, "nccl_p2p_exec_time_microseconds": 1154.87}
    s = df["series"][0]
    assert 'comm_name="DP Group 0"' in s and 'node="nvl72004-T01"' in s and 'message_size="4-5GB"' in s
    assert 'job_id="train-42"' in s and 'gpu_uuid="GPU-9f1c2b6e-0000-4d5e-8f00-112233445566"' in s
    assert set(df["ts"]) == {when}
    assert b.collective is None  # aggregates have no rank/sequence: not collective rows


def test_prometheus_needs_a_time_and_sane_values(telemetry):
    raw = (telemetry / PROM).read_bytes()
    with pytest.raises(ParseError) as e:
        nccl_inspector.parse_prometheus(raw, source="x.prom")
    assert (e.value.line, e.value.field) == (1, "ts")
    when = datetime(2025, 6, 1, tzinfo=timezone.utc)
    for bad, field in [(b"nccl_bus_bandwidth_gbs{node=\"a\"} NaN\n", "nccl_bus_bandwidth_gbs"),
                       (b"nccl_bus_bandwidth_gbs{node=\"a\"} -3\n", "nccl_bus_bandwidth_gbs"),
                       (b"nccl_bus_bandwidth_gbs{node=\"a\" 3\n", None),
                       (b"nccl_bus_bandwidth_gbs{node=\"a\",node=\"b\"} 3\n", "node")]:
        with pytest.raises(ParseError) as e:
            nccl_inspector.parse_prometheus(bad, source="x.prom", ts=when)
        assert e.value.line == 1 and (field is None or e.value.field == field)
    dup = nccl_inspector.parse_prometheus(raw + raw, source="x.prom", ts=when)
    assert dup.metric_sample.height == 4 and dup.meta["duplicates_dropped"] == 4

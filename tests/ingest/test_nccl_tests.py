"""nccl-tests parser against real captures (shared/realdata/telemetry) and hostile input."""

from __future__ import annotations

import json
from datetime import datetime, timezone

import polars as pl
import pytest

from fleetscope.core.errors import ParseError
from fleetscope.core.frames import NCCL_TEST
from ingest import nccl_tests

H100 = "nccl-tests_all_reduce_perf_p5.48xlarge_H100_EFA_mpirun_excerpt.txt"
T4 = "nccl-debug-info+all_reduce_perf_2xT4_EFA_nccl-2.12.7_mpirun.log"


def _row(df: pl.DataFrame, size: int, in_place: bool) -> dict:
    rows = df.filter((pl.col("size_bytes") == size) & (pl.col("in_place") == in_place)).to_dicts()
    assert len(rows) == 1
    return rows[0]


def test_h100_excerpt_values(telemetry):
    path = telemetry / H100
    b = nccl_tests.parse(path.read_bytes(), source=str(path))
    df = b.nccl_test
    assert df.schema == NCCL_TEST.schema
    assert df.height == 64  # 32 sizes x (out-of-place, in-place)
    assert df["size_bytes"].min() == 8 and df["size_bytes"].max() == 17179869184
    assert set(df["op"]) == {"all_reduce"}  # from the file name: the excerpt lost its header
    big_oop = _row(df, 17179869184, False)
    assert big_oop["busbw_gbps"] == 480.87 and big_oop["algbw_gbps"] == 256.46
    assert big_oop["time_s"] == pytest.approx(66988e-6)
    assert big_oop["count"] == 4294967296 and big_oop["dtype"] == "float" and big_oop["redop"] == "sum"
    assert big_oop["root"] == -1 and big_oop["wrong"] == 0
    assert _row(df, 17179869184, True)["busbw_gbps"] == 482.82
    assert _row(df, 1073741824, True)["busbw_gbps"] == 381.74
    assert df["nranks"].is_null().all() and df["hosts"].is_null().all()
    # the "Avg bus bandwidth" line, exactly as printed
    assert b.meta["avg_busbw_gbps"] == 123.343
    # nccl-tests averages busBw over every printed measurement (both placements); from the
    # two-decimal figures the mean can only differ by rounding (< 0.005)
    assert df["busbw_gbps"].mean() == pytest.approx(123.343, abs=0.005)
    assert b.meta["busbw_mean_gbps"] == pytest.approx(df["busbw_gbps"].mean())
    assert b.meta["out_of_bounds"] == {"count": 0, "status": "OK"}


def test_t4_debug_log_values(telemetry):
    path = telemetry / T4
    b = nccl_tests.parse(path.read_bytes(), source=str(path))
    df = b.nccl_test
    assert b.meta["avg_busbw_gbps"] == 1.15327
    assert df["nranks"].unique().to_list() == [2]
    assert df["hosts"].unique().to_list() == ["test-nccl-efa-worker-0,test-nccl-efa-worker-1"]
    assert [d["bus_id"] for d in b.meta["devices"]] == ["0x35", "0xf5"]
    gib = _row(df, 1073741824, False)
    assert gib["busbw_gbps"] == 3.11 and gib["time_s"] == pytest.approx(0.344981) and gib["count"] == 268435456
    assert _row(df, 134217728, True)["busbw_gbps"] == 3.15
    # minBytes=1 makes nccl-tests print two size-0 lines; the natural key keeps one of each placement
    assert b.meta["table_rows"] == 62 and b.meta["duplicates_dropped"] == 2 and df.height == 60
    # the mean the tool computes counts every printed measurement, duplicates included (both 0.00)
    assert b.meta["busbw_mean_gbps"] == pytest.approx(1.15327, abs=0.005)
    assert df["busbw_gbps"].sum() / b.meta["table_rows"] == pytest.approx(1.15327, abs=0.005)
    assert b.meta["skipped_lines"] >= 40  # NCCL INFO and ssh lines are noise here, not errors


def test_run_id_is_stable_and_ignores_mpirun_prefixes(telemetry):
    raw = (telemetry / H100).read_bytes()
    a = nccl_tests.parse(raw, source="a_all_reduce_perf.txt")
    b = nccl_tests.parse(raw, source="b_all_reduce_perf.txt")
    clean = b"\n".join(line.replace(b"[1,0]<stdout>:", b"") for line in raw.split(b"\n"))
    c = nccl_tests.parse(clean, source="c_all_reduce_perf.txt")
    assert a.nccl_test["run_id"].n_unique() == 1
    assert a.nccl_test["run_id"][0] == b.nccl_test["run_id"][0] == c.nccl_test["run_id"][0]
    other = nccl_tests.parse(raw.replace(b"480.87", b"480.88"), source="all_reduce_perf")
    assert other.nccl_test["run_id"][0] != a.nccl_test["run_id"][0]


def test_ts_argument_stamps_rows(telemetry):
    when = datetime(2024, 3, 1, 12, tzinfo=timezone.utc)
    b = nccl_tests.parse((telemetry / H100).read_bytes(), source=H100, ts=when)
    assert b.nccl_test["ts"].unique().to_list() == [when]


def _json_report(**over) -> dict:
    """A report shaped as nccl-tests' util.cu writes it with -J (JSON_FILE_VERSION 2)."""
    doc = {
        "version": 2, "start_time": "2025-01-01 00:00:00",
        "args": ["./build/reduce_scatter_perf", "-b", "8", "-e", "16", "-J", "out.json"],
        "env": [], "nccl_version": 22703,
        "config": {"nthreads": 1, "ngpus": 1, "minimum_bytes": 8, "maximum_bytes": 16,
                   "devices": [
                       {"rank": 0, "group": 0, "pid": 11, "hostname": "node-a", "device": 0,
                        "device_hex": "0000:18:00", "device_info": "NVIDIA H100 80GB HBM3"},
                       {"rank": 1, "group": 0, "pid": 12, "hostname": "node-b", "device": 0,
                        "device_hex": "0000:18:00", "device_info": "NVIDIA H100 80GB HBM3"}]},
        "results": [
            {"size": 8, "count": 1, "type": "float", "redop": "sum", "root": "    -1",
             "out_of_place": {"time": 20.5, "alg_bw": 0.1, "bus_bw": 0.05, "nwrong": 0.0},
             "in_place": {"time": 21.0, "alg_bw": 0.1, "bus_bw": 0.05, "nwrong": 0.0},
             "actual_iterations": 20, "experiment_name": ""},
            {"size": 16, "count": 2, "type": "float", "redop": "sum", "root": "    -1",
             "out_of_place": {"time": 22.0, "alg_bw": 0.2, "bus_bw": 0.1, "nwrong": None},
             "in_place": {"time": 23.0, "alg_bw": 0.2, "bus_bw": 0.1, "nwrong": None},
             "actual_iterations": 20, "experiment_name": ""},
        ],
        "out_of_bounds": {"count": 0, "okay": "true"},
        "average_bus_bandwidth": {"bandwidth": 0.075, "okay": "unchecked"},
        "errors": [], "end_time": "2025-01-01 00:00:05",
    }
    doc.update(over)
    return doc


def test_json_form():
    b = nccl_tests.parse(json.dumps(_json_report()).encode(), source="out.json")
    df = b.nccl_test
    assert df.height == 4 and set(df["op"]) == {"reduce_scatter"}
    assert df["hosts"][0] == "node-a,node-b" and df["nranks"][0] == 2
    assert _row(df, 16, True)["time_s"] == pytest.approx(23e-6) and _row(df, 16, True)["wrong"] is None
    assert _row(df, 8, False)["root"] == -1
    assert b.meta["avg_busbw_gbps"] == 0.075 and df["busbw_gbps"].mean() == pytest.approx(0.075)


@pytest.mark.parametrize(
    "data, field",
    [
        (b"", None),
        (b"   \n\n", None),
        (b"\x00\x01\x02binary\xff\xfe", None),
        (b"\xff\xfe\xfd not utf8", None),
        (b"# size count type\n" + b"8 " * (1 << 20), None),
        (b"  8  2  float  sum  -1  12.3  0.00  0.00  0  12.0  0.00\n", "columns"),  # truncated line
        (b"  8  2  float  sum  -1  -12.3  0.00  0.00  0  12.0  0.00  0.00  0\n", "time"),
        (b"  8  2  float  sum  -1  12.3  nan  0.00  0  12.0  0.00  0.00  0\n", "algbw"),
        (b"  8  2  float  sum  -1  12.3  0.00  inf  0  12.0  0.00  0.00  0\n", "busbw"),
        (b"  8  2  float  sum  -1  12.3  0.00  1e400  0  12.0  0.00  0.00  0\n", "busbw"),
        (b"  99999999999999999999  2  float  sum  -1  1  0  0  0  1  0  0  0\n", None),
        (b"  8  2  float  sum  -1  12.3  0.00  0.00  0.5  12.0  0.00  0.00  0\n", "#wrong"),
        (b"# Avg bus bandwidth : 1.0\n", None),  # no rows at all
        (b'{"results": [', None),  # truncated JSON report
        (b'{"results": [{"size": 8}]', None),
        (b"[1, 2]", None),
    ],
)
def test_bad_input_raises_parse_error(data, field):
    with pytest.raises(ParseError) as e:
        nccl_tests.parse(data, source="bad_all_reduce_perf.txt")
    assert e.value.source == "bad_all_reduce_perf.txt"
    if field:
        assert e.value.field == field and e.value.line == 1


@pytest.mark.parametrize(
    "mutate, field",
    [
        (lambda d: d["results"][0]["out_of_place"].update(bus_bw=-1.0), "results[0].out_of_place.bus_bw"),
        (lambda d: d["results"][0]["out_of_place"].update(bus_bw="nan"), "results[0].out_of_place.bus_bw"),
        (lambda d: d["results"][1].update(size="big"), "results[1].size"),
        (lambda d: d["results"][1].update(size=2**70), "results[1].size"),
        (lambda d: d["results"][1]["in_place"].update(time=True), "results[1].in_place.time"),
        (lambda d: d.update(results=[]), "results"),
        (lambda d: d.pop("results"), "results"),
    ],
)
def test_bad_json_values_name_the_field(mutate, field):
    doc = _json_report()
    mutate(doc)
    with pytest.raises(ParseError) as e:
        nccl_tests.parse(json.dumps(doc).encode(), source="r.json")
    assert e.value.field == field and e.value.source == "r.json"


def test_json_nan_literal_rejected():
    text = json.dumps(_json_report()).replace('"bus_bw": 0.05', '"bus_bw": NaN', 1)
    with pytest.raises(ParseError):
        nccl_tests.parse(text.encode(), source="r.json")


def test_unknown_op_needs_a_name():
    line = b"  8  2  float  sum  -1  12.3  0.00  0.00  0  12.0  0.00  0.00  0\n"
    with pytest.raises(ParseError) as e:
        nccl_tests.parse(line, source="capture.txt")
    assert e.value.field == "op"
    assert nccl_tests.parse(line, source="capture.txt", op="all_gather").nccl_test["op"][0] == "all_gather"


def test_resent_line_gives_one_row(telemetry):
    raw = (telemetry / H100).read_bytes()
    lines = raw.split(b"\n")
    resent = b"\n".join(lines[:10] + [lines[9]] + lines[10:])
    b = nccl_tests.parse(resent, source=H100)
    assert b.nccl_test.height == 64 and b.meta["duplicates_dropped"] == 2

"""Streamed ingest of large line-oriented files: chunked with tiny chunk sizes over inputs built from the real
files in ../shared/realdata, the stored rows must equal a whole-file parse; bad input stops at its chunk with
the file's line named, earlier chunks stay, and re-running writes nothing new."""

from __future__ import annotations

import datetime as dt
import gzip
import json
import os

import pytest
from polars.testing import assert_frame_equal

from fleetscope.core import frames as F
from fleetscope.door import ingestion
from fleetscope.door import streaming
from fleetscope.core.errors import ParseError
from fleetscope.door.ingestion import Options
from tests import clirun

T0 = dt.datetime(2026, 3, 1, 12, tzinfo=dt.UTC)
SCRAPES = (
    "telemetry/dcgm-exporter_metrics_L40S_helm-default_full_cncf-upcloud.prom",
    "telemetry/dcgm-exporter_metrics_8xH100_k8s-pod-labels_sampled_nvidia-aicr.prom",
    "telemetry/dcgm-exporter_metrics_1xL4_default-counters_full_cncf-kops.prom",
)


def stamped(body: bytes, ms: int) -> bytes:
    """A real scrape with a Prometheus sample timestamp on every sample (as a scrape log keeps them)."""
    return b"".join(ln + (b"" if not ln.strip() or ln.startswith(b"#") else b" %d" % ms) + b"\n" for ln in body.splitlines())


def with_unmapped_field(body: bytes) -> bytes:
    """The body with a DCGM field that has no ``gpu_sample`` column (a ``metric_sample`` series) for each GPU's
    temperature line: every field of these real scrapes has a column."""
    extra = [ln.replace(b"DCGM_FI_DEV_GPU_TEMP{", b"DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL{") for ln in body.splitlines()
             if ln.startswith(b"DCGM_FI_DEV_GPU_TEMP{")]
    return body.rstrip(b"\n") + b"\n" + b"\n".join(extra) + b"\n"


def scrape_log(realdata, rounds: int = 4) -> bytes:
    bodies = [with_unmapped_field((realdata / s).read_bytes()) for s in SCRAPES]
    return b"".join(stamped(b, int(T0.timestamp() * 1000) + 10_000 * r + i) for r in range(rounds) for i, b in enumerate(bodies))


def same_rows(store, batch: F.Batch, names) -> None:
    """The stored frames equal what a whole-file parse of the same input gives."""
    for name in names:
        spec = F.FRAMES[name]
        want = F.conform(spec, getattr(batch, name)).sort(list(spec.key))
        got = store.read(name).select(spec.names).sort(list(spec.key))
        assert got.height == want.height > 0, name
        assert_frame_equal(got, want, check_exact=False, check_dtypes=False)


def ingest(store, path, chunk_bytes, **kw):
    return streaming.ingest_file(store, path, opts=Options(ts=T0), chunk_bytes=chunk_bytes, **kw)


def test_dcgm_scrape_log_streams_to_the_rows_of_a_whole_parse_and_reruns_write_nothing(store, realdata, tmp_path):
    data = scrape_log(realdata)
    path = tmp_path / "scrapes.prom"
    path.write_bytes(data)
    seen: list[int] = []
    out = ingest(store, path, 1500, progress=seen.append)
    assert out.error is None and out.notes["streamed"] and out.notes["chunks"] > 20
    assert sum(seen) == len(data)
    whole = ingestion.parse(data, source=str(path), opts=Options(ts=T0))[1]
    same_rows(store, whole, ("gpu_sample", "gpu", "gpu_workload", "metric_sample"))
    assert store.read("gpu_sample")["ts"].n_unique() == 12  # 4 rounds of 3 scrapes, each its own instant
    again = ingest(store, path, 1500)
    assert again.error is None and again.skipped_duplicate and sum(again.result.written.values()) == 0
    assert again.notes["chunks_already_ingested"] >= 12


def test_dcgm_without_timestamps_is_one_instant_first_copy_wins(store, realdata, tmp_path):
    """Concatenated scrapes without timestamps are one instant (the --ts); the first copy of a value wins,
    as in a whole-file parse, even when the copies fall in different chunks."""
    body = (realdata / SCRAPES[0]).read_bytes()
    changed = body.replace(b"} 35.686000\n", b"} 99.500000\n")
    assert changed != body
    path = tmp_path / "concat.prom"
    path.write_bytes(body + changed + body)
    out = ingest(store, path, 700)
    assert out.error is None and out.notes["chunks"] > 10
    rows = store.read("gpu_sample")
    assert rows.height == 1 and rows["power_w"].to_list() == [35.686] and rows["energy_j"].to_list() == [pytest.approx(5551899.58)]
    same_rows(store, ingestion.parse(path.read_bytes(), source=str(path), opts=Options(ts=T0))[1], ("gpu_sample", "gpu"))


def test_a_bad_line_stops_at_its_chunk_earlier_chunks_stay_and_a_fixed_rerun_continues(store, realdata, tmp_path):
    data = scrape_log(realdata)
    lines = data.split(b"\n")
    bad_at = len(lines) * 2 // 3  # 1-based line number of the broken sample
    while lines[bad_at - 1].startswith(b"#") or not lines[bad_at - 1]:
        bad_at += 1
    good_line = lines[bad_at - 1]
    lines[bad_at - 1] = good_line.rsplit(b"} ", 1)[0] + b"} not-a-number 1"
    path = tmp_path / "broken.prom"
    path.write_bytes(b"\n".join(lines))
    with pytest.raises(Exception, match=f"line {bad_at}"):
        ingestion.parse(path.read_bytes(), source=str(path), opts=Options(ts=T0))
    out = ingest(store, path, 1500)
    assert out.error and f"line {bad_at}" in out.error and "chunk " in out.error and "not a number" in out.error
    kept = store.read("gpu_sample")
    assert 0 < kept.height < 40 and out.result.written["gpu_sample"] == kept.height

    lines[bad_at - 1] = good_line
    path.write_bytes(b"\n".join(lines))
    fixed = ingest(store, path, 1500)
    assert fixed.error is None and fixed.notes["chunks_already_ingested"] >= 1
    assert fixed.result.written["gpu_sample"] == 40 - kept.height
    same_rows(store, ingestion.parse(path.read_bytes(), source=str(path), opts=Options(ts=T0))[1], ("gpu_sample",))


def test_gzip_streams_and_a_truncated_gzip_is_named(store, realdata, tmp_path):
    data = scrape_log(realdata, rounds=2)
    path = tmp_path / "scrapes.prom.gz"
    path.write_bytes(gzip.compress(data))
    seen: list[int] = []
    out = ingest(store, path, 2000, progress=seen.append)
    assert out.error is None and out.notes["chunks"] > 5 and sum(seen) == path.stat().st_size
    assert store.read("gpu_sample").height == 20
    cut = tmp_path / "cut.prom.gz"
    cut.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    bad = ingest(store, cut, 2000)
    assert "truncated or corrupt gzip" in bad.error and str(cut) in bad.error


def test_nvidia_smi_csv_repeats_the_header_and_names_the_bad_row(store, realdata, tmp_path):
    header, row = (realdata / "telemetry/nvidia-smi_query-gpu_all-fields_H100_590.48.01_load.csv").read_bytes().rstrip(b"\n").split(b"\n")
    rows = [row.replace(b"2026/07/14 08:12:53.353", b"2026/07/14 08:%02d:%02d.000" % divmod(i, 60)) for i in range(40)]
    path = tmp_path / "smi.csv"
    path.write_bytes(header + b"\n" + b"\n".join(rows) + b"\n")
    out = ingest(store, path, 3 * len(row))
    assert out.error is None and out.notes["chunks"] > 5
    same_rows(store, ingestion.parse(path.read_bytes(), source=str(path), opts=Options(ts=T0))[1], ("gpu_sample",))
    assert store.read("gpu_sample").height == 40

    rows[30] = rows[30].rsplit(b",", 3)[0]  # three fields short: a row cut by a crash
    path.write_bytes(header + b"\n" + b"\n".join(rows) + b"\n")
    bad = ingest(store, path, 3 * len(row))
    assert bad.error and "line 32" in bad.error and "values for" in bad.error


def _inspector_v43_dump(sn0: int, n: int) -> list[dict]:
    header = {"id": "0x7f8c496ae9f661", "comm_name": "DP Group 0", "rank": 2, "n_ranks": 8, "nnodes": 1}
    meta = {"inspector_output_format_version": "v4.3", "git_rev": "", "rec_mechanism": "nccl_profiler_interface",
            "dump_timestamp_us": 1748030377748202, "hostname": "node-7", "pid": 1639453}
    marker = {"header": header, "metadata": meta, "dump_stats": {"coll_records": n, "coll_dropped_total": 0, "coll_dropped_since_last_dump": 0,
                                                                 "p2p_records": 0, "p2p_dropped_total": 0, "p2p_dropped_since_last_dump": 0}}
    recs = [{"coll_perf": {"coll": "AllReduce", "coll_algo": "RING", "coll_proto": "LL", "coll_sn": sn0 + i, "coll_msg_size_bytes": 1 << 20,
                           "coll_exec_time_us": 100 + i, "coll_timing_source": "kernel_gpu", "coll_algobw_gbs": 10.5, "coll_busbw_gbs": 18.375}}
            for i in range(n)]
    return [marker, *recs]


def test_nccl_inspector_never_cuts_inside_a_v43_dump(store, realdata, tmp_path):
    """v4.3 records inherit their dump marker's header: a cut may only fall before a line with its own header,
    so a dump larger than the chunk size stays whole, and the rows equal a whole parse."""
    v40 = (realdata / "telemetry/nccl-inspector_output-examples_v4.0_from-README.jsonl").read_bytes()
    objs = [o for d in range(6) for o in _inspector_v43_dump(100 * d, 12)]
    path = tmp_path / "nccl-inspector-777" / "dump.jsonl"
    path.parent.mkdir()
    path.write_bytes(v40 + b"".join(json.dumps(o).encode() + b"\n" for o in objs))
    out = ingest(store, path, 600)
    assert out.error is None and 6 <= out.notes["chunks"] <= 8
    same_rows(store, ingestion.parse(path.read_bytes(), source=str(path), opts=Options(ts=T0))[1], ("collective",))
    assert store.read("collective").height == 3 + 72

    # a record lost in the middle of the file: the chunk of its dump fails, naming the dump's marker (line 43)
    # and the dump's last line (54, one record short); the chunks before it stay written
    lines = path.read_bytes().split(b"\n")
    del lines[3 + 13 * 3 + 5]
    path.write_bytes(b"\n".join(lines))
    bad = streaming.ingest_file(store, path, opts=Options(ts=T0, job_id="other"), chunk_bytes=600)
    assert bad.error and "line 54" in bad.error and "dump started on line 43: 1 coll_perf announced records missing" in bad.error
    assert bad.result.written["collective"] == 3 + 36


def test_job_events_truncated_last_line_fails_after_earlier_chunks(store, tmp_path):
    events = [json.dumps({"job_id": "j1", "ts": (T0 + dt.timedelta(seconds=i)).isoformat(), "kind": "step", "rank": 0, "step": i,
                          "duration_s": 0.9, "tokens": 4096}) for i in range(200)]
    text = "\n".join(events)
    path = tmp_path / "events.jsonl"
    path.write_text(text[:-20])  # the writer died mid-line
    out = ingest(store, path, 2000)
    assert out.error and "truncated JSON line" in out.error and "line 200" in out.error
    assert 150 < store.read("job_event").height < 200 and store.read("step").height == store.read("job_event").height


def test_nccl_log_chunks_carry_the_communicators_forward(store, realdata, tmp_path):
    """COLL lines far from their communicator's Init line (other chunks) still get rank and comm id."""
    raw = (realdata / "telemetry/nccl-debug-info+all_reduce_perf_2xT4_EFA_nccl-2.12.7_mpirun.log").read_bytes()
    raw = b"".join(ln + b"\n" for ln in raw.splitlines() if b" NCCL " in ln or b"NCCL version" in ln)  # the log without the nccl-tests table
    colls = "".join(
        f"[1,{r}]<stdout>:test-nccl-efa-worker-{r}:21:21 [0] NCCL INFO AllReduce: opCount {i:x} sendbuff 0x7fdd7e000000 recvbuff 0x7fdd7c000000 "
        f"count 1024 datatype 7 op 0 root 0 comm {comm} [nranks=2] stream 0x5581a7a0a1f0\n"
        for i in range(60) for r, comm in ((0, "0x7fde98000f60"), (1, "0x7f9c0c000f60")))
    path = tmp_path / "nccl.log"
    path.write_bytes(raw + colls.encode())
    assert ingestion.detect(path.read_bytes()) == ["nccl_log"]
    out = streaming.ingest_file(store, path, opts=Options(ts=T0, job_id="j7"), chunk_bytes=2048)
    assert out.error is None and out.notes["chunks"] > 5
    got = store.read("collective")
    assert got.height == 120 and set(got["rank"]) == {0, 1} and got["bytes"].unique().to_list() == [4096]
    same_rows(store, ingestion.parse(path.read_bytes(), source=str(path), opts=Options(ts=T0, job_id="j7"))[1], ("collective",))


def test_cli_streams_with_a_byte_progress_bar_and_reports_the_chunk(realdata, tmp_path):
    data = scrape_log(realdata)
    path = tmp_path / "scrapes.prom"
    path.write_bytes(data)
    env = {**os.environ, "FLEETSCOPE_DATA_DIR": str(tmp_path), "FLEETSCOPE_DATABASE_URL": f"sqlite:///{tmp_path / 'fs.db'}"}

    def run(*args):
        return clirun.cli("ingest", *args, env=env)

    first = run("--chunk-mb", "0.002", "--ts", T0.isoformat(), str(path))
    assert first.returncode == 0, first.stderr
    assert " chunks: gpu 10, gpu_sample 40," in first.stdout and "B/s" in first.stderr  # tqdm counts bytes
    again = run("--json", "--chunk-mb", "0.002", "--ts", T0.isoformat(), str(path))
    out = json.loads(again.stdout.splitlines()[0])
    assert out["skipped_duplicate"] and out["written"]["gpu_sample"] == 0 and out["notes"]["streamed"]
    broken = tmp_path / "broken.prom"
    broken.write_bytes(data[: len(data) // 2] + b"DCGM_FI_DEV_GPU_TEMP{UUID=\"GPU-x\"} hot 1\n" + data[len(data) // 2:].split(b"\n", 1)[1])
    env["FLEETSCOPE_DATABASE_URL"] = f"sqlite:///{tmp_path / 'other.db'}"  # a fresh store: the good prefix is new there
    bad = run("--chunk-mb", "0.002", "--ts", T0.isoformat(), str(broken))
    assert bad.returncode == 1
    assert "rejected" in bad.stderr and "chunk " in bad.stderr and "is not a number" in bad.stderr and "rows of earlier chunks stay written" in bad.stderr


@pytest.mark.parametrize(("junk", "words"), [(b"\x00\x01\x02 binary", "binary data (NUL byte)"), (b"\xff\xfe not utf-8", "not UTF-8")],
                         ids=["nul", "not-utf8"])
def test_binary_junk_mid_file_names_its_line(store, tmp_path, junk, words):
    lines = [json.dumps({"job_id": "j2", "ts": (T0 + dt.timedelta(seconds=i)).isoformat(), "kind": "started" if i == 0 else "step",
                         "rank": 0, "step": i}).encode() for i in range(300)]
    lines[250] = junk
    path = tmp_path / "events.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    out = ingest(store, path, 4000)
    assert out.error and words in out.error and "line 251" in out.error
    assert 0 < store.read("job_event").height < 250


def test_a_large_kineto_trace_streams_as_one_transaction_equal_to_a_whole_ingest(store, realdata, tmp_path):
    raw = (realdata / "traces/hta/nccl_data_rank0_of_2/nccl_data.json.gz").read_bytes()  # 0.75 MB gzip, 9.8 MB JSON
    path = tmp_path / "trace.json.gz"
    path.write_bytes(raw)
    seen: list[int] = []
    out = streaming.ingest_file(store, path, opts=Options(ts=T0), chunk_bytes=1 << 20, progress=seen.append)
    assert out.error is None and out.notes["streamed"] and out.formats == ["kineto"] and sum(seen) == len(raw)
    assert out.result.written["step"] == 3 and out.result.written["collective"] == 21
    same_rows(store, ingestion.parse(raw, source=str(path), opts=Options(ts=T0))[1], ("step", "collective"))
    # the content hash is the whole path's: the same bytes ingested whole, or streamed again, write nothing
    assert ingestion.ingest_bytes(store, raw, source=str(path), opts=Options(ts=T0)).skipped_duplicate
    assert streaming.ingest_file(store, path, opts=Options(ts=T0), chunk_bytes=1 << 20).skipped_duplicate
    # plain JSON over the chunk size streams too; under it, the whole-file path
    plain = tmp_path / "trace.json"
    plain.write_bytes(gzip.decompress(raw))
    assert streaming.ingest_file(store, plain, opts=Options(ts=T0, job_id="p"), chunk_bytes=1 << 20).notes["streamed"]
    assert "streamed" not in streaming.ingest_file(store, plain, opts=Options(ts=T0, job_id="q"), chunk_bytes=64 << 20).notes
    assert "streamed" not in streaming.ingest_file(store, path, opts=Options(ts=T0, job_id="r"), chunk_bytes=16 << 20).notes
    # a small gzip file that inflates far past the chunk size (its trailer says so) streams as well
    padded = tmp_path / "padded.json.gz"
    padded.write_bytes(gzip.compress(b"{" + b" " * 20_000_000 + gzip.decompress(raw).lstrip()[1:]))
    assert padded.stat().st_size < 1 << 20
    assert streaming.ingest_file(store, padded, fmt="kineto", opts=Options(ts=T0, job_id="s"), chunk_bytes=16 << 20).notes["streamed"]


def test_a_truncated_large_kineto_trace_writes_nothing_and_names_the_byte(store, realdata, tmp_path):
    data = gzip.decompress((realdata / "traces/hta/nccl_data_rank0_of_2/nccl_data.json.gz").read_bytes())
    path = tmp_path / "trace.json"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(ParseError) as ei:
        streaming.ingest_file(store, path, opts=Options(ts=T0), chunk_bytes=1 << 20)
    assert ei.value.source == str(path) and "truncated" in ei.value.message and "(byte " in ei.value.message
    assert ei.value.line is not None and ei.value.field.startswith("traceEvents[")
    assert store.read("step").height == 0 and store.read("collective").height == 0

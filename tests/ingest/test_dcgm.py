"""ingest.dcgm on real dcgm-exporter bodies (../shared/realdata/telemetry) and on hostile input."""

from __future__ import annotations

import math
from datetime import UTC, datetime
from pathlib import Path

import polars as pl
import pytest

from fleetscope.core.errors import ParseError
from fleetscope.core.frames import GPU, GPU_SAMPLE, GPU_WORKLOAD, HEALTH_EVENT, METRIC_SAMPLE
from ingest import dcgm, dcgm_lex

REPO = Path(__file__).resolve().parents[2]
TELEMETRY = REPO.parent / "shared" / "realdata" / "telemetry"
H100 = TELEMETRY / "dcgm-exporter_metrics_8xH100_k8s-pod-labels_sampled_nvidia-aicr.prom"
L4 = TELEMETRY / "dcgm-exporter_metrics_1xL4_default-counters_full_cncf-kops.prom"
L40S = TELEMETRY / "dcgm-exporter_metrics_L40S_helm-default_full_cncf-upcloud.prom"
NCCL_PROM = TELEMETRY / "nccl-inspector_prometheus-textfile-examples_v5.1_from-README.prom"

realdata = pytest.mark.skipif(
    not TELEMETRY.is_dir(), reason=f"real telemetry fixtures not found at {TELEMETRY} (shared/realdata absent)"
)

TS = datetime(2026, 3, 10, 12, 0, tzinfo=UTC)
MiB = 2**20


def _gpu_row(batch, uuid: str) -> dict:
    rows = batch.gpu_sample.filter(pl.col("gpu_uuid") == uuid).to_dicts()
    assert len(rows) == 1, rows
    return rows[0]


def _line(name: str, value: str, uuid: str = "GPU-1", extra: str = "", gpu: int = 0) -> str:
    return (
        f'{name}{{gpu="{gpu}",UUID="{uuid}",pci_bus_id="00000000:53:00.0",device="nvidia{gpu}",'
        f'modelName="NVIDIA H100 80GB HBM3",Hostname="node-a",DCGM_FI_DRIVER_VERSION="580.105.08"{extra}}} {value}\n'
    )


def _check_schemas(batch) -> None:
    for spec in (GPU, GPU_SAMPLE, GPU_WORKLOAD, HEALTH_EVENT, METRIC_SAMPLE):
        df = getattr(batch, spec.name)
        if df is not None:
            assert df.schema == spec.schema, spec.name


# --- real scrapes -----------------------------------------------------------------------------


@realdata
def test_8xh100_gpus_temps_power_and_pod_attribution():
    b = dcgm.parse(H100.read_bytes(), source=H100.name, ts=TS)
    _check_schemas(b)
    assert b.gpu_sample.height == 8 and b.gpu.height == 8
    g0 = _gpu_row(b, "GPU-c4529c8d-69c4-b61d-e0bc-7b2460096005")
    assert g0["temp_c"] == 30
    assert g0["power_w"] == pytest.approx(113.611)
    assert g0["util_ratio"] == 0.0 and g0["mem_copy_util_ratio"] == 0.0
    assert g0["ts"] == TS
    inv = b.gpu.filter(pl.col("gpu_uuid") == "GPU-c4529c8d-69c4-b61d-e0bc-7b2460096005").row(0, named=True)
    assert inv == {
        "gpu_uuid": "GPU-c4529c8d-69c4-b61d-e0bc-7b2460096005",
        "host": "gpu-node-1",
        "gpu_index": 0,
        "pci_bus_id": "00000000:53:00.0",
        "model_name": "NVIDIA H100 80GB HBM3",
        "mig_profile": None,
        "mig_instance_id": None,
        "driver_version": "580.105.08",
    }
    g7 = _gpu_row(b, "GPU-04d228d3-3b5a-3534-f5cf-969706647d56")
    assert g7["temp_c"] == 26 and g7["power_w"] == pytest.approx(66.997)
    # The sampled capture stops after GPU 5's MEM_COPY_UTIL line.
    assert g7["mem_copy_util_ratio"] is None
    assert sorted(b.gpu["host"].unique()) == ["gpu-node-1"]
    # Only GPU 0 carries pod labels.
    assert b.gpu_workload.to_dicts() == [
        {
            "ts": TS,
            "gpu_uuid": "GPU-c4529c8d-69c4-b61d-e0bc-7b2460096005",
            "namespace": "dynamo-workload",
            "pod": "vllm-agg-0-vllmdecodeworker-s65j5",
            "container": "main",
        }
    ]
    assert b.values() == 30
    assert b.health_event is None


@realdata
def test_l4_units_converted():
    b = dcgm.parse(L4.read_bytes(), source=L4.name, ts=TS)
    _check_schemas(b)
    g = _gpu_row(b, "GPU-c2f76b33-7953-256e-8f33-1343419b1a1c")
    assert g["power_w"] == pytest.approx(16.365)
    assert g["fb_free_bytes"] == 22563 * MiB
    assert g["fb_used_bytes"] == 0
    assert g["fb_reserved_bytes"] == 470 * MiB
    assert g["energy_j"] == pytest.approx(4742776 / 1000)
    assert g["temp_c"] == 31 and g["mem_temp_c"] == 0
    assert g["sm_clock_mhz"] == 210 and g["mem_clock_mhz"] == 405
    assert g["pcie_tx_bytes_per_s"] == 112603 and g["pcie_rx_bytes_per_s"] == 17544
    assert g["remap_failure"] == 0 and g["remap_uncorrectable_total"] == 0
    assert g["gr_engine_active_ratio"] == 0.0
    assert b.gpu.row(0, named=True)["host"] == "i-030791dc5a37cd257"
    assert b.gpu.row(0, named=True)["model_name"] == "NVIDIA L4"
    # the default counters' vGPU licence status is a column (migration 0029), so nothing of this body is a series
    assert g["vgpu_license_status"] == 0
    assert b.metric_sample is None or b.metric_sample.height == 0
    assert not b.meta.get("unmapped_fields")
    assert b.values() == 23


@realdata
def test_l40s_energy_above_int32_blank_band_is_kept():
    b = dcgm.parse(L40S.read_bytes(), source=L40S.name, ts=TS)
    g = _gpu_row(b, "GPU-5b4e07f6-3a86-4340-039d-25f2a83cdc43")
    # 5,551,899,580 mJ is above 0x7ffffff0 but a real int64 reading, not a 32-bit blank.
    assert g["energy_j"] == pytest.approx(5551899.580)
    assert g["power_w"] == pytest.approx(35.686)
    assert g["fb_free_bytes"] == 45459 * MiB and g["fb_reserved_bytes"] == 608 * MiB
    assert g["dram_active_ratio"] == pytest.approx(0.000131)
    assert g["temp_c"] == 32
    assert b.gpu.row(0, named=True)["driver_version"] == "595.58.03"
    assert b.meta["dcgm_blank_dropped"] == 0


@realdata
def test_crlf_copy_of_real_scrape_parses_the_same():
    body = L40S.read_bytes()
    a = dcgm.parse(body, ts=TS)
    b = dcgm.parse(body.replace(b"\n", b"\r\n"), ts=TS)
    assert a.gpu_sample.equals(b.gpu_sample)
    assert a.gpu.equals(b.gpu)


@realdata
def test_non_dcgm_metrics_are_counted_not_stored():
    b = dcgm.parse(NCCL_PROM.read_bytes(), source=NCCL_PROM.name, ts=TS)
    assert b.gpu_sample.height == 0
    assert b.meta["skipped_series"] == 4
    assert b.meta["skipped_names"]["nccl_bus_bandwidth_gbs"] == 1


# --- label handling ---------------------------------------------------------------------------


def test_escaped_label_values_are_unescaped():
    body = _line("DCGM_FI_DEV_GPU_TEMP", "41", extra=r',namespace="ns",pod="we\"ird\\pod\nx",container="c"')
    b = dcgm.parse(body.encode(), ts=TS)
    assert b.gpu_workload["pod"].to_list() == ['we"ird\\pod\nx']
    assert _gpu_row(b, "GPU-1")["temp_c"] == 41


def test_braces_inside_label_values():
    body = _line("DCGM_FI_DEV_GPU_TEMP", "41", extra=',namespace="ns",pod="a{b}c}",container="c"')
    body += _line("DCGM_FI_DEV_POWER_USAGE", "250.5", extra=',namespace="ns",pod="a{b}c}",container="c"')
    b = dcgm.parse(body.encode(), ts=TS)
    assert b.gpu_workload["pod"].to_list() == ["a{b}c}"]
    g = _gpu_row(b, "GPU-1")
    assert g["temp_c"] == 41 and g["power_w"] == 250.5


def test_exporter_own_pod_labels_are_not_a_workload():
    own = ',container="nvidia-dcgm-exporter",namespace="gpu-operator",pod="nvidia-dcgm-exporter-wqqqn"'
    work = ',container="main",namespace="dynamo-workload",pod="vllm-0"'
    body = _line("DCGM_FI_DEV_GPU_UTIL", "0", uuid="GPU-idle", extra=own) + _line(
        "DCGM_FI_DEV_GPU_UTIL", "87", uuid="GPU-busy", extra=work, gpu=1
    )
    b = dcgm.parse(body.encode(), ts=TS)
    assert b.gpu_workload.select("gpu_uuid", "pod").to_dicts() == [{"gpu_uuid": "GPU-busy", "pod": "vllm-0"}]
    assert b.meta["exporter_pod_labels_ignored"] == 1
    assert _gpu_row(b, "GPU-busy")["util_ratio"] == pytest.approx(0.87)


def test_mig_instances_are_their_own_rows():
    mig = ',GPU_I_PROFILE="1g.10gb",GPU_I_ID="{}"'
    body = (
        _line("DCGM_FI_DEV_FB_USED", "12", uuid="GPU-a100", extra=mig.format(3))
        + _line("DCGM_FI_DEV_FB_USED", "900", uuid="GPU-a100", extra=mig.format(5))
        + _line("DCGM_FI_DEV_GPU_TEMP", "27", uuid="GPU-a100")
    )
    b = dcgm.parse(body.encode(), ts=TS)
    assert sorted(b.gpu_sample["gpu_uuid"]) == ["GPU-a100", "GPU-a100/mig3", "GPU-a100/mig5"]
    assert _gpu_row(b, "GPU-a100/mig5")["fb_used_bytes"] == 900 * MiB
    assert _gpu_row(b, "GPU-a100")["temp_c"] == 27
    inv = b.gpu.filter(pl.col("gpu_uuid") == "GPU-a100/mig3").row(0, named=True)
    assert inv["mig_profile"] == "1g.10gb" and inv["mig_instance_id"] == 3 and inv["host"] == "node-a"


def test_legacy_lowercase_names_and_labels():
    body = 'dcgm_gpu_temp{gpu="0",uuid="GPU-old",hostname="h1",model_name="Tesla T4"} 52\n'
    body += 'dcgm_fi_prof_dram_active{gpu="0",uuid="GPU-old",hostname="h1",model_name="Tesla T4"} 35\n'
    b = dcgm.parse(body.encode(), ts=TS)
    g = _gpu_row(b, "GPU-old")
    assert g["temp_c"] == 52
    assert g["dram_active_ratio"] == pytest.approx(0.35)  # 1.x compatibility mode prints DCP ratios in %
    assert b.gpu.row(0, named=True)["host"] == "h1" and b.gpu.row(0, named=True)["model_name"] == "Tesla T4"


def test_unknown_dcgm_field_with_extra_labels_gets_a_canonical_series_key():
    body = _line("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_L0", "3", extra=',link="0"')
    b = dcgm.parse(body.encode(), ts=TS)
    assert b.metric_sample["series"].to_list() == [
        'DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_L0{gpu_uuid="GPU-1",link="0"}'
    ]
    assert b.metric_sample["value"].to_list() == [3.0]


def test_nvlink_total_is_a_column_under_either_name_kept_as_exported():
    """Field 449, in dcgm-exporter's default counters as ``NVLINK_BANDWIDTH_TOTAL`` and named
    ``NVLINK_THROUGHPUT_TOTAL`` in newer DCGM releases, is one column holding the exported value (DCGM states no unit)."""
    body = (_line("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", "8734187331", uuid="GPU-1", gpu=0)
            + _line("DCGM_FI_DEV_NVLINK_THROUGHPUT_TOTAL", "12.5", uuid="GPU-2", gpu=1))
    b = dcgm.parse(body.encode(), ts=TS)
    _check_schemas(b)
    assert _gpu_row(b, "GPU-1")["nvlink_throughput_raw"] == 8734187331.0
    assert _gpu_row(b, "GPU-2")["nvlink_throughput_raw"] == 12.5
    assert b.metric_sample is None or b.metric_sample.height == 0
    assert not b.meta.get("unmapped_fields") and b.values() == 2


# --- values -----------------------------------------------------------------------------------


def test_dcgm_blank_sentinels_are_dropped():
    body = (
        _line("DCGM_FI_DEV_GPU_TEMP", str(0x7FFFFFF0))  # DCGM_INT32_BLANK
        + _line("DCGM_FI_DEV_MEMORY_TEMP", str(0x7FFFFFF2))  # DCGM_INT32_NOT_SUPPORTED
        + _line("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", str(0x7FFFFFFFFFFFFFF2))  # DCGM_INT64_NOT_SUPPORTED
        + _line("DCGM_FI_DEV_POWER_USAGE", "140737488355328")  # DCGM_FP64_BLANK
        + _line("DCGM_FI_PROF_SM_ACTIVE", "140737488355330")  # DCGM_FP64_NOT_SUPPORTED
        + _line("DCGM_FI_DEV_SM_CLOCK", "1980")
    )
    b = dcgm.parse(body.encode(), ts=TS)
    g = _gpu_row(b, "GPU-1")
    assert g["temp_c"] is None and g["mem_temp_c"] is None and g["energy_j"] is None
    assert g["power_w"] is None and g["sm_active_ratio"] is None
    assert g["sm_clock_mhz"] == 1980
    assert b.meta["dcgm_blank_dropped"] == 5
    assert b.values() == 1


def test_non_finite_values_are_dropped_and_counted():
    body = (
        _line("DCGM_FI_DEV_GPU_TEMP", "NaN")
        + _line("DCGM_FI_DEV_POWER_USAGE", "+Inf")
        + _line("DCGM_FI_PROF_DRAM_ACTIVE", "-Inf")
        + _line("DCGM_FI_DEV_SM_CLOCK", "1.98e3")
    )
    b = dcgm.parse(body.encode(), ts=TS)
    g = _gpu_row(b, "GPU-1")
    assert g["temp_c"] is None and g["power_w"] is None and g["dram_active_ratio"] is None
    assert g["sm_clock_mhz"] == 1980
    assert b.meta["non_finite_dropped"] == 3


def test_duplicated_series_keeps_the_first():
    body = _line("DCGM_FI_DEV_GPU_TEMP", "40") + _line("DCGM_FI_DEV_POWER_USAGE", "300") + _line("DCGM_FI_DEV_GPU_TEMP", "99")
    b = dcgm.parse(body.encode(), ts=TS)
    assert _gpu_row(b, "GPU-1")["temp_c"] == 40
    assert b.meta["duplicates_dropped"] == 1


def test_sample_timestamps_override_scrape_time():
    body = _line("DCGM_FI_DEV_GPU_TEMP", "40 1700000000000") + _line("DCGM_FI_DEV_POWER_USAGE", "300 1700000000000")
    b = dcgm.parse(body.encode(), ts=TS)
    g = _gpu_row(b, "GPU-1")
    assert g["ts"] == datetime(2023, 11, 14, 22, 13, 20, tzinfo=UTC)
    assert g["temp_c"] == 40 and g["power_w"] == 300
    # Without a scrape time, the sample timestamps suffice.
    assert dcgm.parse(body.encode()).gpu_sample.height == 1


def test_no_timestamp_at_all_is_an_error():
    with pytest.raises(ParseError) as e:
        dcgm.parse(_line("DCGM_FI_DEV_GPU_TEMP", "40").encode(), source="s")
    assert e.value.line == 1 and e.value.field == "timestamp"


def test_health_events_from_xid_ecc_and_row_remap():
    body = (
        _line("DCGM_FI_DEV_XID_ERRORS", "79", extra=',err_code="79",err_msg="GPU has fallen off the bus"')
        + _line("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "2")
        + _line("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "0")
        + _line("DCGM_FI_DEV_ROW_REMAP_FAILURE", "1")
        + _line("DCGM_FI_DEV_XID_ERRORS", "0", uuid="GPU-ok", gpu=1)
    )
    b = dcgm.parse(body.encode(), ts=TS)
    _check_schemas(b)
    ev = b.health_event.select("gpu_uuid", "host", "kind", "code", "value", "source").to_dicts()
    assert ev == [
        {"gpu_uuid": "GPU-1", "host": "node-a", "kind": "ecc", "code": 311, "value": 2.0, "source": "dcgm"},
        {"gpu_uuid": "GPU-1", "host": "node-a", "kind": "row_remap", "code": 395, "value": 1.0, "source": "dcgm"},
        {"gpu_uuid": "GPU-1", "host": "node-a", "kind": "xid", "code": 79, "value": 79.0, "source": "dcgm"},
    ]
    assert b.health_event.filter(pl.col("kind") == "xid")["message"].to_list() == ["XID 79: GPU has fallen off the bus"]
    assert _gpu_row(b, "GPU-1")["xid_last"] == 79


# --- structure of the body --------------------------------------------------------------------


def test_help_type_comments_and_blank_lines():
    body = (
        "# HELP DCGM_FI_DEV_GPU_TEMP GPU temperature (in C).\n# TYPE DCGM_FI_DEV_GPU_TEMP gauge\n\n"
        + _line("DCGM_FI_DEV_GPU_TEMP", "33")
        + "   # an indented comment\n\n# EOF\n"
    )
    b = dcgm.parse(body.encode(), ts=TS)
    assert _gpu_row(b, "GPU-1")["temp_c"] == 33


def test_empty_body_is_an_empty_batch():
    for body in (b"", b"\n\n", b"# HELP x y\n# TYPE x gauge\n"):
        b = dcgm.parse(body, source="empty", ts=TS)
        assert b.gpu_sample.height == 0 and b.values() == 0
        assert b.gpu_sample.schema == GPU_SAMPLE.schema


@pytest.mark.parametrize("cut_at", ["labels", "value", "newline"])
def test_a_last_line_without_its_line_feed_refuses_the_body(cut_at):
    full = _line("DCGM_FI_DEV_GPU_TEMP", "33") + _line("DCGM_FI_DEV_POWER_USAGE", "22563", gpu=1, uuid="GPU-2")
    # Mid-way through the second line's labels; inside its value (22563 -> 225, which still parses); or
    # only its line feed missing: the text format requires it, and a cut cannot be told from a whole value.
    cut = {"labels": full[: full.index("Hostname", len(full) // 2)], "value": full[: full.rindex("22563") + 3],
           "newline": full[:-1]}[cut_at]
    for lexer_ts in (TS, None):  # records and line paths alike
        with pytest.raises(ParseError) as e:
            dcgm.parse(cut.encode(), source="node-a", ts=lexer_ts)
        assert (e.value.source, e.value.line, e.value.field) == ("node-a", 2, "line")
        assert "without a line feed" in e.value.message and "nothing is stored" in e.value.message
    # Blanks after the last line feed are no line.
    b = dcgm.parse((full + "  \n\t").encode(), ts=TS)
    assert _gpu_row(b, "GPU-2")["power_w"] == 22563


def test_binary_garbage_is_a_parse_error_naming_the_line():
    body = _line("DCGM_FI_DEV_GPU_TEMP", "33").encode() + b"\x00\xff\xfe\x80garbage\n" + _line("DCGM_FI_DEV_SM_CLOCK", "1").encode()
    with pytest.raises(ParseError) as e:
        dcgm.parse(body, source="http://node-a:9400/metrics", ts=TS)
    assert e.value.line == 2 and e.value.field == "line"
    assert "http://node-a:9400/metrics" in str(e.value) and "line 2" in str(e.value)


def test_text_that_is_not_exposition_format_names_line_and_field():
    body = _line("DCGM_FI_DEV_GPU_TEMP", "33") + "this is not prometheus\n"
    with pytest.raises(ParseError) as e:
        dcgm.parse(body.encode(), source="s", ts=TS)
    assert e.value.line == 2 and e.value.field == "value"
    body = _line("DCGM_FI_DEV_GPU_TEMP", "33") + 'DCGM_FI_DEV_SM_CLOCK{gpu="0",UUID=GPU-1} 5\n'
    with pytest.raises(ParseError) as e:
        dcgm.parse(body.encode(), source="s", ts=TS)
    assert e.value.line == 2 and e.value.field == "UUID"


def test_missing_uuid_label_names_the_line():
    body = _line("DCGM_FI_DEV_GPU_TEMP", "33") + 'DCGM_FI_DEV_GPU_TEMP{gpu="1",Hostname="node-a"} 35\n'
    with pytest.raises(ParseError) as e:
        dcgm.parse(body.encode(), source="scrape-7", ts=TS)
    assert e.value.line == 2 and e.value.field == "UUID" and e.value.source == "scrape-7"
    assert "DCGM_FI_DEV_GPU_TEMP" in str(e.value)


def test_fleet_scrape_fast_path_matches_line_path():
    """The record-cut fast path and the exact line path agree on a scrape shaped like the benchmark's."""
    import sys

    sys.path.insert(0, str(REPO / "benchmarks"))
    from ingest_dcgm import synth_scrape

    body = synth_scrape(64, busy_fraction=0.5, seed=3)
    fast = dcgm.parse(body, ts=TS)
    slow = dcgm.parse(body.replace(b"\n", b"\r\n"), ts=TS)  # CRLF is only handled line by line
    assert fast.meta["lexer"] == "records" and slow.meta["lexer"] == "lines"
    assert fast.gpu_sample.height == 64 and fast.values() == 64 * 30
    assert fast.gpu_sample.equals(slow.gpu_sample)
    assert fast.gpu.equals(slow.gpu)
    assert fast.gpu_workload.equals(slow.gpu_workload)
    # every field of dcgm-exporter's default counters has a column (NVLINK_BANDWIDTH_TOTAL since 0030)
    assert fast.metric_sample is None and slow.metric_sample is None
    # Units: the first line of each family in the body, converted.
    text = body.decode()
    first = {ln.split("{")[0]: ln.rsplit(" ", 1)[1] for ln in reversed(text.splitlines()) if not ln.startswith("#")}
    uuid0 = text.split('UUID="', 1)[1].split('"', 1)[0]
    g = _gpu_row(fast, uuid0)
    assert g["fb_used_bytes"] == int(first["DCGM_FI_DEV_FB_USED"]) * MiB
    assert g["energy_j"] == pytest.approx(int(first["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"]) / 1000)
    assert g["util_ratio"] == pytest.approx(int(first["DCGM_FI_DEV_GPU_UTIL"]) / 100)
    assert math.isclose(g["power_w"], float(first["DCGM_FI_DEV_POWER_USAGE"]))
    assert g["nvlink_throughput_raw"] == float(first["DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL"])


def test_family_in_another_order_or_shorter_is_matched_by_text():
    import sys

    sys.path.insert(0, str(REPO / "benchmarks"))
    from ingest_dcgm import synth_scrape

    lines = synth_scrape(16, busy_fraction=0.5, seed=5).decode().splitlines(keepends=True)
    # Reverse the GPU order of the power family and drop one GPU from the temperature family.
    power = [i for i, ln in enumerate(lines) if ln.startswith("DCGM_FI_DEV_POWER_USAGE{")]
    lines[power[0] : power[-1] + 1] = reversed(lines[power[0] : power[-1] + 1])
    temp = [i for i, ln in enumerate(lines) if ln.startswith("DCGM_FI_DEV_GPU_TEMP{")]
    dropped = lines.pop(temp[3])
    body = "".join(lines).encode()
    fast = dcgm.parse(body, ts=TS)
    slow = dcgm.parse(body.replace(b"\n", b"\r\n"), ts=TS)
    assert fast.meta["lexer"] == "records"
    assert fast.gpu_sample.equals(slow.gpu_sample)
    uuid3 = dropped.split('UUID="', 1)[1].split('"', 1)[0]
    assert _gpu_row(fast, uuid3)["temp_c"] is None
    for ln in lines[power[0] : power[0] + 3]:
        uuid = ln.split('UUID="', 1)[1].split('"', 1)[0]
        assert _gpu_row(fast, uuid)["power_w"] == pytest.approx(float(ln.rsplit(" ", 1)[1]))


def test_line_path_in_small_pieces_keeps_line_numbers(monkeypatch):
    """Bodies over _PIECE_BYTES are read piece by piece; values and error lines must not shift."""
    body = "".join(_line("DCGM_FI_DEV_GPU_TEMP", str(30 + i), uuid=f"GPU-{i}", gpu=i) for i in range(20))
    crlf = body.replace("\n", "\r\n").encode()  # CRLF: the line path
    whole = dcgm.parse(crlf, ts=TS)
    monkeypatch.setattr(dcgm_lex, "_PIECE_BYTES", 700)
    pieces = dcgm.parse(crlf, ts=TS)
    assert pieces.gpu_sample.equals(whole.gpu_sample) and pieces.gpu_sample.height == 20
    assert _gpu_row(pieces, "GPU-17")["temp_c"] == 47
    bad = body + 'DCGM_FI_DEV_GPU_TEMP{gpu="9"} 35\n'
    with pytest.raises(ParseError) as e:
        dcgm.parse(bad.replace("\n", "\r\n").encode(), source="s", ts=TS)
    assert e.value.line == 21 and e.value.field == "UUID"
    garbage = body.encode() + b"\xff\xfe\n"
    with pytest.raises(ParseError) as e:
        dcgm.parse(garbage, source="s", ts=TS)
    assert e.value.line == 21 and e.value.field == "line"


def test_label_order_may_differ_between_series():
    body = (
        'DCGM_FI_DEV_GPU_TEMP{UUID="GPU-a",Hostname="h1",gpu="0",modelName="M"} 40\n'
        'DCGM_FI_DEV_GPU_TEMP{gpu="1",modelName="M",Hostname="h2",UUID="GPU-b"} 41\n'
        'DCGM_FI_DEV_GPU_TEMP{Hostname="h3",UUID="GPU-c",pod="p\rq",namespace="n"} 42\n'
    )
    b = dcgm.parse(body.encode(), ts=TS)
    assert b.gpu.select("gpu_uuid", "host", "gpu_index").to_dicts() == [
        {"gpu_uuid": "GPU-a", "host": "h1", "gpu_index": 0},
        {"gpu_uuid": "GPU-b", "host": "h2", "gpu_index": 1},
        {"gpu_uuid": "GPU-c", "host": "h3", "gpu_index": None},
    ]
    assert b.gpu_sample["temp_c"].to_list() == [40, 41, 42]
    assert b.gpu_workload["pod"].to_list() == ["p\rq"]


def test_naive_scrape_time_is_utc_and_aware_times_are_converted():
    from datetime import timedelta, timezone

    body = _line("DCGM_FI_DEV_GPU_TEMP", "33").encode()
    naive = dcgm.parse(body, ts=datetime(2026, 3, 10, 12, 0))
    shifted = dcgm.parse(body, ts=datetime(2026, 3, 10, 14, 0, tzinfo=timezone(timedelta(hours=2))))
    assert naive.gpu_sample["ts"].to_list() == [TS] == shifted.gpu_sample["ts"].to_list()


def test_a_scrape_whose_blocks_differ_from_the_last_only_inside_reads_its_own_labels():
    """The resolution of label blocks kept from the last scrape is reused only for blocks equal to them all:
    a GPU that moved host in the middle of the fleet (same count, same first and last block) is seen."""
    import sys

    sys.path.insert(0, str(REPO / "benchmarks"))
    from ingest_dcgm import synth_scrape

    body = synth_scrape(16, seed=7)
    text = body.decode()
    uuid5 = list(dict.fromkeys(ln.split('UUID="', 1)[1].split('"', 1)[0] for ln in text.splitlines() if 'UUID="' in ln))[5]  # printed 6th
    host5 = text.split(f'UUID="{uuid5}"', 1)[1].split('Hostname="', 1)[1].split('"', 1)[0]
    moved = "\n".join(ln.replace(f'Hostname="{host5}"', 'Hostname="moved-host"') if f'UUID="{uuid5}"' in ln else ln
                      for ln in text.split("\n")).encode()
    first, again, other = dcgm.parse(body, ts=TS), dcgm.parse(body, ts=TS), dcgm.parse(moved, ts=TS)
    assert first.meta["lexer"] == again.meta["lexer"] == other.meta["lexer"] == "records"
    assert first.gpu.equals(again.gpu) and first.gpu_sample.equals(again.gpu_sample)
    hosts = dict(other.gpu.select("gpu_uuid", "host").iter_rows())
    assert hosts[uuid5] == "moved-host" and dict(first.gpu.select("gpu_uuid", "host").iter_rows())[uuid5] == host5 != "moved-host"
    assert {g: h for g, h in hosts.items() if g != uuid5} == {g: h for g, h in first.gpu.select("gpu_uuid", "host").iter_rows() if g != uuid5}

"""ingest.nvidia_smi on real nvidia-smi output (../shared/realdata/telemetry) and on hostile input."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from pathlib import Path

import polars as pl
import pytest

from fleetscope.core.errors import ParseError
from fleetscope.core.frames import GPU, GPU_SAMPLE, METRIC_SAMPLE
from ingest import nvidia_smi

REPO = Path(__file__).resolve().parents[2]
TELEMETRY = REPO.parent / "shared" / "realdata" / "telemetry"
IDLE_CSV = TELEMETRY / "nvidia-smi_query-gpu_all-fields_H100_590.48.01_idle.csv"
LOAD_CSV = TELEMETRY / "nvidia-smi_query-gpu_all-fields_H100_590.48.01_load.csv"
CAPTURE = TELEMETRY / "nvidia-smi_capture_linux-x86_64__nvidia-h100-80gb-hbm3__590.48.01.txt"
CAPTURE_MIG = TELEMETRY / "nvidia-smi_capture_linux-x86_64__nvidia-h100-mig__590.48.01.txt"
XML_A100 = TELEMETRY / "nvidia-smi_q-x_A100-SXM4-80GB_MIG_driver-535.54.03_telegraf-testdata.xml"

realdata = pytest.mark.skipif(
    not TELEMETRY.is_dir(), reason=f"real telemetry fixtures not found at {TELEMETRY} (shared/realdata absent)"
)

MiB = 2**20
H100_UUID = "GPU-00000000-0000-0000-0000-000000000000"  # masked by the capture tool
A100_UUID = "GPU-513536b6-7d19-9063-b049-1e69664bb298"


def _metric(batch, name: str, uuid: str) -> list[float]:
    return batch.metric_sample.filter(pl.col("series") == f'{name}{{gpu_uuid="{uuid}"}}')["value"].to_list()


def _schemas(batch) -> None:
    for spec in (GPU, GPU_SAMPLE, METRIC_SAMPLE):
        df = getattr(batch, spec.name)
        if df is not None:
            assert df.schema == spec.schema, spec.name


# --- --query-gpu CSV --------------------------------------------------------------------------


@realdata
def test_query_gpu_csv_idle_h100():
    b = nvidia_smi.parse_csv(IDLE_CSV.read_bytes(), source=IDLE_CSV.name)
    _schemas(b)
    g = b.gpu_sample.row(0, named=True)
    assert b.gpu_sample.height == 1
    assert g["gpu_uuid"] == H100_UUID
    assert g["ts"] == datetime(2026, 7, 14, 8, 12, 38, 696000, tzinfo=UTC)
    assert g["temp_c"] == 41 and g["mem_temp_c"] == 48
    assert g["power_w"] == pytest.approx(69.85)
    assert g["fb_used_bytes"] == 0 and g["fb_free_bytes"] == 81081 * MiB and g["fb_reserved_bytes"] == 479 * MiB
    assert g["util_ratio"] == 0.0
    assert g["sm_clock_mhz"] == 345 and g["mem_clock_mhz"] == 2619
    assert g["clock_event_reasons"] == 0x1  # "0x0000000000000001": GPU idle
    assert g["remap_pending"] == 0 and g["remap_failure"] == 0  # "No"
    assert g["retired_sbe_total"] is None  # "[N/A]" on an H100 (row remapping replaced page retirement)
    assert _metric(b, "nvsmi_power_limit_w", H100_UUID) == [700.0]
    assert _metric(b, "nvsmi_power_min_limit_w", H100_UUID) == [200.0]
    assert _metric(b, "nvsmi_memory_total_bytes", H100_UUID) == [81559 * MiB]
    assert _metric(b, "nvsmi_temperature_gpu_tlimit_c", H100_UUID) == [46.0]
    assert _metric(b, "nvsmi_clocks_max_sm_mhz", H100_UUID) == [1980.0]
    # Identifiers and versions that look numeric (pci.device_id 0x233010DE, vbios 96.00.A5.00.01) are not readings.
    names = {x.split("{")[0] for x in b.metric_sample["series"]}
    assert not {"nvsmi_pci_device_id", "nvsmi_vbios_version", "nvsmi_compute_cap", "nvsmi_inforom_ecc"} & names
    # "[Requested functionality has been deprecated]" is no value, not an error and not a metric.
    assert not b.metric_sample.filter(pl.col("series").str.starts_with("nvsmi_clocks_applications")).height
    assert b.gpu.row(0, named=True) == {
        "gpu_uuid": H100_UUID,
        "host": None,  # hostname "[N/A]"
        "gpu_index": 0,
        "pci_bus_id": "00000000:00:09.0",
        "model_name": "NVIDIA H100 80GB HBM3",
        "mig_profile": None,
        "mig_instance_id": None,
        "driver_version": "590.48.01",
    }


@realdata
def test_query_gpu_csv_under_load():
    b = nvidia_smi.parse_csv(LOAD_CSV.read_bytes(), source=LOAD_CSV.name)
    g = b.gpu_sample.row(0, named=True)
    assert g["ts"] == datetime(2026, 7, 14, 8, 12, 53, 353000, tzinfo=UTC)
    assert g["power_w"] == pytest.approx(631.95)
    assert g["temp_c"] == 59 and g["mem_temp_c"] == 54
    assert g["util_ratio"] == 1.0 and g["mem_copy_util_ratio"] == pytest.approx(0.11)
    assert g["fb_used_bytes"] == 19818 * MiB
    assert g["sm_clock_mhz"] == 1980
    assert g["clock_event_reasons"] == 0


@realdata
def test_nounits_gives_the_same_numbers():
    header, row = LOAD_CSV.read_text().splitlines()[:2]
    stripped = ", ".join(re.sub(r" (W|MiB|%|MHz|us)$", "", v) for v in row.split(", "))
    with_units = nvidia_smi.parse_csv(LOAD_CSV.read_bytes())
    nounits = nvidia_smi.parse_csv(f"{header}\n{stripped}\n".encode())
    assert nounits.gpu_sample.equals(with_units.gpu_sample)
    assert nounits.metric_sample.equals(with_units.metric_sample)


def test_csv_without_header_units_or_timestamp_column_uses_ts():
    body = (
        "index, uuid, name, temperature.gpu, power.draw, memory.used, utilization.gpu\n"
        "0, GPU-a, Tesla T4, 38, 27.50 W, 300 MiB, 12 %\n"
        "1, GPU-b, Tesla T4, N/A, [Not Supported], [N/A], [Unknown Error]\n"
    )
    ts = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    b = nvidia_smi.parse_csv(body.encode(), source="t4", ts=ts)
    a, c = b.gpu_sample.sort("gpu_uuid").to_dicts()
    assert a["ts"] == ts and a["temp_c"] == 38 and a["power_w"] == 27.5
    assert a["fb_used_bytes"] == 300 * MiB and a["util_ratio"] == pytest.approx(0.12)
    assert c["temp_c"] is None and c["power_w"] is None and c["fb_used_bytes"] is None and c["util_ratio"] is None


def test_csv_errors_name_line_and_field():
    with pytest.raises(ParseError) as e:
        nvidia_smi.parse_csv(b"index, temperature.gpu\n0, 40\n", source="s", ts=datetime.now(UTC))
    assert e.value.field == "uuid" and e.value.line == 1
    with pytest.raises(ParseError) as e:
        nvidia_smi.parse_csv(b"uuid, temperature.gpu\nGPU-a, 40\nGPU-b, forty\n", source="s", ts=datetime.now(UTC))
    assert e.value.line == 3 and e.value.field == "temperature.gpu"
    with pytest.raises(ParseError) as e:
        nvidia_smi.parse_csv(b"uuid, temperature.gpu\nGPU-a, 40, 41\n", source="s", ts=datetime.now(UTC))
    assert e.value.line == 2
    with pytest.raises(ParseError) as e:
        nvidia_smi.parse_csv(b"uuid, temperature.gpu\nGPU-a, 40\n", source="s")
    assert e.value.field == "timestamp"
    with pytest.raises(ParseError) as e:
        nvidia_smi.parse_csv(b"uuid, name\nGPU-a, \xff\xfe\n", source="s", ts=datetime.now(UTC))
    assert e.value.line == 2 and e.value.field == "line"
    assert nvidia_smi.parse_csv(b"", source="empty").gpu_sample.height == 0


# --- capture bundles --------------------------------------------------------------------------


@realdata
def test_capture_bundle_idle_and_load_sections():
    b = nvidia_smi.parse_capture(CAPTURE.read_bytes(), source=CAPTURE.name)
    _schemas(b)
    assert b.meta["sections_parsed"] == [
        "idle :: query-gpu (csv, what the exporter parses)",
        "load :: query-gpu (csv, what the exporter parses)",
    ]
    assert "idle :: query (-q)" in b.meta["sections_skipped"]
    s = b.gpu_sample.sort("ts")
    assert s["power_w"].to_list() == pytest.approx([69.85, 631.95])
    assert s["temp_c"].to_list() == [41, 59]
    # The extracted CSV files are those sections: same frames.
    both = nvidia_smi.parse_csv(IDLE_CSV.read_bytes()).gpu_sample.vstack(nvidia_smi.parse_csv(LOAD_CSV.read_bytes()).gpu_sample)
    assert s.equals(both.sort("ts"))
    assert _metric(b, "nvsmi_power_limit_w", H100_UUID) == [700.0, 700.0]
    assert b.gpu.height == 1 and b.gpu.row(0, named=True)["model_name"] == "NVIDIA H100 80GB HBM3"


@realdata
def test_capture_bundle_with_mig_enabled():
    b = nvidia_smi.parse_capture(CAPTURE_MIG.read_bytes(), source=CAPTURE_MIG.name)
    s = b.gpu_sample.sort("ts")
    assert s["ts"].to_list() == [
        datetime(2026, 7, 14, 9, 0, 27, 792000, tzinfo=UTC),
        datetime(2026, 7, 14, 9, 0, 44, 579000, tzinfo=UTC),
    ]
    assert s["power_w"].to_list() == pytest.approx([71.15, 433.78])
    assert s["temp_c"].to_list() == [42, 53]
    # With MIG on, whole-GPU utilization is "[N/A]".
    assert s["util_ratio"].to_list() == [None, None]


# --- -q -x XML --------------------------------------------------------------------------------


@realdata
def test_xml_a100_with_four_mig_devices():
    b = nvidia_smi.parse_xml(XML_A100.read_bytes(), source=XML_A100.name)
    _schemas(b)
    assert b.gpu_sample.height == 5
    g = b.gpu_sample.filter(pl.col("gpu_uuid") == A100_UUID).row(0, named=True)
    assert g["ts"] == datetime(2023, 8, 4, 11, 44, 30, tzinfo=UTC)
    assert g["power_w"] == pytest.approx(67.03)
    assert g["temp_c"] == 27 and g["mem_temp_c"] == 44
    assert g["fb_used_bytes"] == 50 * MiB and g["fb_free_bytes"] == 80999 * MiB and g["fb_reserved_bytes"] == 869 * MiB
    assert g["sm_clock_mhz"] == 1275 and g["mem_clock_mhz"] == 1593
    assert g["util_ratio"] is None  # "N/A" with MIG on
    assert g["ecc_dbe_volatile_total"] == 0 and g["clock_event_reasons"] == 0
    assert _metric(b, "nvsmi_power_limit_w", A100_UUID) == [500.0]
    assert _metric(b, "nvsmi_memory_total_bytes", A100_UUID) == [81920 * MiB]
    assert _metric(b, "nvsmi_temperature_gpu_max_threshold_c", A100_UUID) == [92.0]
    migs = b.gpu.filter(pl.col("mig_instance_id").is_not_null()).sort("mig_instance_id")
    assert migs["gpu_uuid"].to_list() == [f"{A100_UUID}/mig{i}" for i in (3, 4, 5, 6)]
    assert set(migs["driver_version"]) == {"535.54.03"} and set(migs["model_name"]) == {"NVIDIA A100-SXM4-80GB"}
    m3 = b.gpu_sample.filter(pl.col("gpu_uuid") == f"{A100_UUID}/mig3").row(0, named=True)
    assert m3["fb_used_bytes"] == 12 * MiB and m3["fb_free_bytes"] == 19955 * MiB
    assert _metric(b, "nvsmi_memory_total_bytes", f"{A100_UUID}/mig3") == [19968 * MiB]


def test_xml_entity_declarations_are_refused():
    laughs = (
        b'<?xml version="1.0"?><!DOCTYPE lolz [<!ENTITY lol "lol">'
        b'<!ENTITY lol2 "&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;">]>'
        b"<nvidia_smi_log><timestamp>&lol2;</timestamp></nvidia_smi_log>"
    )
    with pytest.raises(ParseError) as e:
        nvidia_smi.parse_xml(laughs, source="evil.xml")
    assert e.value.field == "xml" and "evil.xml" in str(e.value)
    external = b'<?xml version="1.0"?><!DOCTYPE x [<!ELEMENT x ANY>]><nvidia_smi_log/>'
    with pytest.raises(ParseError):
        nvidia_smi.parse_xml(external, source="evil.xml")


def test_xml_malformed_or_foreign_documents():
    with pytest.raises(ParseError) as e:
        nvidia_smi.parse_xml(b"<nvidia_smi_log><gpu>\n<uuid>GPU-1</gpu>", source="cut.xml")
    assert e.value.field == "xml" and e.value.line == 2
    with pytest.raises(ParseError):
        nvidia_smi.parse_xml(b"<html/>", source="x")
    with pytest.raises(ParseError) as e:
        nvidia_smi.parse_xml(b"<nvidia_smi_log><gpu id='0'><uuid>GPU-1</uuid></gpu></nvidia_smi_log>", source="x")
    assert e.value.field == "timestamp"


def test_xml_older_dtd_ecc_and_throttle_reasons():
    doc = b"""<?xml version="1.0" ?>
<!DOCTYPE nvidia_smi_log SYSTEM "nvsmi_device_v10.dtd">
<nvidia_smi_log><timestamp>Mon Jan  2 03:04:05 2023</timestamp><driver_version>470.57.02</driver_version>
<gpu id="00000000:00:1E.0"><product_name>Tesla T4</product_name><uuid>GPU-t4</uuid>
<ecc_errors><volatile><single_bit><total>3</total></single_bit><double_bit><total>1</total></double_bit></volatile></ecc_errors>
<clocks_throttle_reasons><clocks_throttle_reason_gpu_idle>Not Active</clocks_throttle_reason_gpu_idle>
<clocks_throttle_reason_sw_power_cap>Active</clocks_throttle_reason_sw_power_cap>
<clocks_throttle_reason_hw_thermal_slowdown>Active</clocks_throttle_reason_hw_thermal_slowdown></clocks_throttle_reasons>
<power_readings><power_draw>27.97 W</power_draw><power_limit>70.00 W</power_limit></power_readings>
<utilization><gpu_util>45 %</gpu_util></utilization>
</gpu></nvidia_smi_log>"""
    b = nvidia_smi.parse_xml(doc, source="t4.xml")
    g = b.gpu_sample.row(0, named=True)
    assert g["ts"] == datetime(2023, 1, 2, 3, 4, 5, tzinfo=UTC)
    assert g["ecc_sbe_volatile_total"] == 3 and g["ecc_dbe_volatile_total"] == 1
    assert g["clock_event_reasons"] == 0x4 | 0x40
    assert g["power_w"] == pytest.approx(27.97) and g["util_ratio"] == pytest.approx(0.45)
    assert _metric(b, "nvsmi_power_limit_w", "GPU-t4") == [70.0]
    assert b.gpu.row(0, named=True)["pci_bus_id"] == "00000000:00:1E.0"

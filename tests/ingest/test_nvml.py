"""NVML collector: the pure mapping against nvidia-smi's reading of the same H100, and the no-driver error."""

import datetime as dt

import pytest

from fleetscope.devices import nvml as nvml_driver
from ingest import nvidia_smi, nvml

LOAD_CSV = "telemetry/nvidia-smi_query-gpu_all-fields_H100_590.48.01_load.csv"


def test_without_a_driver_the_error_says_so():
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001 - the point: this machine has no NVIDIA driver
        with pytest.raises(nvml_driver.NvmlUnavailable, match="NVIDIA driver"):
            nvml_driver.read_devices()
        with pytest.raises(nvml_driver.NvmlUnavailable):
            nvml_driver.xid_events()
    else:  # pragma: no cover - only on a GPU host
        pytest.skip("an NVIDIA driver is present: the no-driver path cannot be exercised")


def test_mapping_agrees_with_nvidia_smi_on_the_same_gpu(realdata):
    """nvidia-smi reads the same NVML fields; feed our mapping NVML's units for the values the real
    capture printed and both must give the same canonical row."""
    smi = nvidia_smi.parse_csv((realdata / LOAD_CSV).read_bytes()).gpu_sample.row(0, named=True)
    mib = 2**20
    reading = {
        "index": 0, "uuid": smi["gpu_uuid"], "name": "NVIDIA H100 80GB HBM3", "pci_bus_id": "00000000:00:09.0",
        "gpu_util_pct": 100, "mem_util_pct": 11,
        "fb_used_b": 19818 * mib, "fb_free_b": 61263 * mib, "fb_reserved_b": 479 * mib,  # as printed, MiB
        "power_mw": 631950, "temp_c": 59, "mem_temp_c": 54, "sm_clock_mhz": 1980, "mem_clock_mhz": 2619,
        "ecc_sbe_volatile": 0, "ecc_dbe_volatile": 0, "ecc_sbe_aggregate": 0, "ecc_dbe_aggregate": 0,
        "remap_correctable": 0, "remap_uncorrectable": 0, "remap_pending": 0, "remap_failure": 0, "clock_event_reasons": 0,
        "energy_mj": None,  # not supported on this reading: must stay null, never 0
    }
    batch = nvml.to_batch([reading], ts=smi["ts"], host="gpu-node-1")
    ours = batch.gpu_sample.row(0, named=True)
    for col in ("util_ratio", "mem_copy_util_ratio", "fb_used_bytes", "fb_free_bytes", "fb_reserved_bytes", "power_w", "temp_c",
                "mem_temp_c", "sm_clock_mhz", "mem_clock_mhz", "remap_failure", "clock_event_reasons"):
        assert ours[col] == pytest.approx(smi[col]), col
    assert "energy_j" not in batch.gpu_sample.columns
    assert batch.gpu.row(0, named=True)["host"] == "gpu-node-1"


def test_xids_become_health_events_and_gpus_without_uuid_are_skipped():
    ts = dt.datetime(2026, 3, 1, tzinfo=dt.UTC)
    batch = nvml.to_batch([{"uuid": None, "power_mw": 1}, {"uuid": "GPU-a", "energy_mj": 123_456_789}], ts=ts, host="h",
                          xids=[{"uuid": "GPU-a", "xid": 79}])
    assert batch.gpu_sample["gpu_uuid"].to_list() == ["GPU-a"]
    assert batch.gpu_sample["energy_j"].to_list() == [123_456.789]
    assert batch.health_event.select("gpu_uuid", "kind", "code").rows() == [("GPU-a", "xid", 79)]


def test_every_nvml_call_names_a_function_the_bindings_have():
    """No GPU here to call them, but each NVML function and constant the collector uses must exist in
    NVIDIA's bindings (a misspelt name would only fail on a GPU host)."""
    import inspect
    import re

    import pynvml

    used = set(re.findall(r"\bnv\.([A-Za-z_][A-Za-z0-9_]*)", inspect.getsource(nvml_driver)))
    assert {"nvmlDeviceGetTotalEnergyConsumption", "nvmlDeviceGetPowerUsage", "nvmlEventSetWait"} <= used
    assert sorted(n for n in used if not hasattr(pynvml, n)) == []

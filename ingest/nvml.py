"""NVML readings to canonical frames: ``to_batch(readings, ts=..., host=...)`` maps what
``fleetscope.devices.nvml`` read from the driver (one plain dict per GPU, in NVML's units) to a Batch in SI
units. Pure: the driver half lives with the devices, so this mapping is testable without a GPU.

Energy: the total energy counter (``nvmlDeviceGetTotalEnergyConsumption``, mJ since the driver loaded,
Volta and newer) where the GPU has one, and instantaneous power (``nvmlDeviceGetPowerUsage``, mW) always,
so the energy analyzer can integrate power where the counter is missing. Units per the NVML API
reference (docs.nvidia.com/deploy/nvml-api).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping
from typing import Any

import polars as pl

from fleetscope.core.frames import GPU, GPU_SAMPLE, HEALTH_EVENT, Batch


# reading key -> (gpu_sample column, factor to SI)
_COLUMNS: dict[str, tuple[str, float]] = {
    "gpu_util_pct": ("util_ratio", 0.01),
    "mem_util_pct": ("mem_copy_util_ratio", 0.01),
    "fb_used_b": ("fb_used_bytes", 1.0),
    "fb_free_b": ("fb_free_bytes", 1.0),
    "fb_reserved_b": ("fb_reserved_bytes", 1.0),
    "power_mw": ("power_w", 1e-3),
    "energy_mj": ("energy_j", 1e-3),
    "temp_c": ("temp_c", 1.0),
    "mem_temp_c": ("mem_temp_c", 1.0),
    "sm_clock_mhz": ("sm_clock_mhz", 1.0),
    "mem_clock_mhz": ("mem_clock_mhz", 1.0),
    "pcie_replay": ("pcie_replay_total", 1.0),
    "ecc_sbe_volatile": ("ecc_sbe_volatile_total", 1.0),
    "ecc_dbe_volatile": ("ecc_dbe_volatile_total", 1.0),
    "ecc_sbe_aggregate": ("ecc_sbe_aggregate_total", 1.0),
    "ecc_dbe_aggregate": ("ecc_dbe_aggregate_total", 1.0),
    "remap_correctable": ("remap_correctable_total", 1.0),
    "remap_uncorrectable": ("remap_uncorrectable_total", 1.0),
    "remap_pending": ("remap_pending", 1.0),
    "remap_failure": ("remap_failure", 1.0),
    "clock_event_reasons": ("clock_event_reasons", 1.0),
}
_INT = {c.name for c in GPU_SAMPLE.columns if c.dtype == pl.Int64}


def to_batch(readings: Iterable[Mapping[str, Any]], *, ts: dt.datetime, host: str, xids: Iterable[Mapping[str, Any]] = (),
             source: str = "nvml") -> Batch:
    """Readings (as ``read_devices`` returns them) to gpu_sample and gpu rows; XIDs to health events.
    Fields the GPU did not report stay null, never zero."""
    samples, gpus = [], []
    for r in readings:
        uuid = r.get("uuid")
        if not uuid:
            continue
        row: dict[str, Any] = {"ts": ts, "gpu_uuid": uuid}
        for key, (column, factor) in _COLUMNS.items():
            v = r.get(key)
            if v is not None:
                row[column] = int(round(v * factor)) if column in _INT else float(v) * factor
        samples.append(row)
        gpus.append({"gpu_uuid": uuid, "host": host, "gpu_index": r.get("index"), "pci_bus_id": r.get("pci_bus_id"),
                     "model_name": r.get("name"), "driver_version": r.get("driver_version")})
    events = [{"ts": ts, "host": host, "gpu_uuid": x.get("uuid") or "", "kind": "xid", "code": int(x["xid"]), "value": float(x["xid"]),
               "source": "nvml"} for x in xids]
    batch = Batch(source=source)
    if samples:
        batch.gpu_sample = pl.DataFrame(samples, schema={k: GPU_SAMPLE.schema[k] for k in dict.fromkeys(k for s in samples for k in s)})
        batch.gpu = pl.DataFrame(gpus, schema={c: GPU.schema[c] for c in gpus[0]})
    if events:
        batch.health_event = pl.DataFrame(events, schema={c: HEALTH_EVENT.schema[c] for c in events[0]})
    return batch

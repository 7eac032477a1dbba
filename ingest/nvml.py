"""NVML: the live collector for GPU hosts, through NVIDIA's Python bindings (``nvidia-ml-py``, ``pynvml``).

Two halves, kept apart so the mapping is testable without a GPU:
- ``read_devices()`` talks to the driver: one reading per GPU (a plain dict of what NVML returned, in
  NVML's units), and ``xid_events(timeout_ms)`` drains critical-XID events from an NVML event set.
- ``to_batch(readings, ts=..., host=...)`` is pure: readings in, a canonical Batch out (SI units).

Energy: the total energy counter (``nvmlDeviceGetTotalEnergyConsumption``, mJ since the driver loaded,
Volta and newer) where the GPU has one, and instantaneous power (``nvmlDeviceGetPowerUsage``, mW) always,
so the energy analyzer can integrate power where the counter is missing. Units per the NVML API
reference (docs.nvidia.com/deploy/nvml-api).

On a machine without the NVIDIA driver every entry point raises ``NvmlUnavailable`` with a sentence that
says so, never a traceback from ctypes.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping
from typing import Any

import polars as pl

from fleetscope.core.errors import FleetscopeError
from fleetscope.core.frames import GPU, GPU_SAMPLE, HEALTH_EVENT, Batch


class NvmlUnavailable(FleetscopeError, RuntimeError):
    """NVML cannot be used here: no driver, no library, or no permission."""


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


def _nvml() -> Any:
    try:
        import pynvml
    except ImportError as exc:  # pragma: no cover - declared dependency
        raise NvmlUnavailable("the NVML bindings are not installed (pip install nvidia-ml-py)") from exc
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        raise NvmlUnavailable(f"NVML could not start: {exc} (is the NVIDIA driver installed and loaded on this host?)") from None
    return pynvml


def _try(fn: Any, *args: Any) -> Any:
    """One NVML query; None where the GPU or driver does not support it (a real answer, not an error)."""
    import pynvml

    try:
        return fn(*args)
    except pynvml.NVMLError:
        return None


def read_devices() -> list[dict[str, Any]]:
    """One reading per GPU, in NVML's own units (mW, mJ, bytes, %, MHz, C)."""
    nv = _nvml()
    try:
        out = []
        for i in range(nv.nvmlDeviceGetCount()):
            h = nv.nvmlDeviceGetHandleByIndex(i)
            util = _try(nv.nvmlDeviceGetUtilizationRates, h)
            mem = _try(nv.nvmlDeviceGetMemoryInfo, h)
            remap = _try(nv.nvmlDeviceGetRemappedRows, h)
            pci = _try(nv.nvmlDeviceGetPciInfo, h)
            ecc = {}
            for key, err, counter in (("ecc_sbe_volatile", 0, 0), ("ecc_dbe_volatile", 1, 0), ("ecc_sbe_aggregate", 0, 1), ("ecc_dbe_aggregate", 1, 1)):
                ecc[key] = _try(nv.nvmlDeviceGetTotalEccErrors, h, err, counter)
            reasons = _try(getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", nv.nvmlDeviceGetCurrentClocksThrottleReasons), h)
            out.append({
                "index": i,
                "uuid": _try(nv.nvmlDeviceGetUUID, h),
                "name": _try(nv.nvmlDeviceGetName, h),
                "pci_bus_id": getattr(pci, "busId", None) if pci is not None else None,
                "driver_version": _try(nv.nvmlSystemGetDriverVersion),
                "gpu_util_pct": getattr(util, "gpu", None),
                "mem_util_pct": getattr(util, "memory", None),
                "fb_used_b": getattr(mem, "used", None),
                "fb_free_b": getattr(mem, "free", None),
                "fb_reserved_b": getattr(mem, "reserved", None),
                "power_mw": _try(nv.nvmlDeviceGetPowerUsage, h),
                "energy_mj": _try(nv.nvmlDeviceGetTotalEnergyConsumption, h),
                "temp_c": _try(nv.nvmlDeviceGetTemperature, h, nv.NVML_TEMPERATURE_GPU),
                "sm_clock_mhz": _try(nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_SM),
                "mem_clock_mhz": _try(nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_MEM),
                "pcie_replay": _try(nv.nvmlDeviceGetPcieReplayCounter, h),
                **ecc,
                # (correctable, uncorrectable, pending, failure) per nvmlDeviceGetRemappedRows
                "remap_correctable": remap[0] if remap else None,
                "remap_uncorrectable": remap[1] if remap else None,
                "remap_pending": int(bool(remap[2])) if remap else None,
                "remap_failure": int(bool(remap[3])) if remap else None,
                "clock_event_reasons": reasons,
            })
        return out
    finally:
        _try(nv.nvmlShutdown)


def xid_events(timeout_ms: int = 0) -> list[dict[str, Any]]:
    """Critical XID events waiting in NVML's event set (``nvmlEventTypeXidCriticalError``)."""
    nv = _nvml()
    try:
        es = nv.nvmlEventSetCreate()
        for i in range(nv.nvmlDeviceGetCount()):
            h = nv.nvmlDeviceGetHandleByIndex(i)
            _try(nv.nvmlDeviceRegisterEvents, h, nv.nvmlEventTypeXidCriticalError, es)
        events = []
        while True:
            try:
                ev = nv.nvmlEventSetWait(es, timeout_ms)
            except nv.NVMLError_Timeout:
                break
            events.append({"uuid": _try(nv.nvmlDeviceGetUUID, ev.device), "xid": int(ev.eventData)})
            timeout_ms = 0
        _try(nv.nvmlEventSetFree, es)
        return events
    finally:
        _try(nv.nvmlShutdown)


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

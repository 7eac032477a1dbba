"""NVML on a GPU host, through NVIDIA's Python bindings (``nvidia-ml-py``, ``pynvml``): the driver half of
the NVML collector. ``read_devices()`` returns one reading per GPU (a plain dict of what NVML returned, in
NVML's units) and ``xid_events(timeout_ms)`` drains critical-XID events from an NVML event set;
``ingest.nvml.to_batch`` maps them to canonical frames. Units per the NVML API reference
(docs.nvidia.com/deploy/nvml-api).

On a machine without the NVIDIA driver every entry point raises ``NvmlUnavailable`` with a sentence that
says so, never a traceback from ctypes.
"""

from __future__ import annotations

from typing import Any

from fleetscope.core.errors import FleetscopeError


class NvmlUnavailable(FleetscopeError, RuntimeError):
    """NVML cannot be used here: no driver, no library, or no permission."""


def _nvml() -> Any:
    try:
        import pynvml  # lazy: NVML bindings, only on GPU hosts
    except ImportError as exc:  # pragma: no cover - declared dependency
        raise NvmlUnavailable("the NVML bindings are not installed (pip install nvidia-ml-py)") from exc
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        raise NvmlUnavailable(f"NVML could not start: {exc} (is the NVIDIA driver installed and loaded on this host?)") from None
    return pynvml


def _try(fn: Any, *args: Any) -> Any:
    """One NVML query; None where the GPU or driver does not support it (a real answer, not an error)."""
    import pynvml  # lazy: NVML bindings, only on GPU hosts

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

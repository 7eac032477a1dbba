"""Unit conversions and bit tables the readers and analyzers share, declared once.

NVML clock event ("throttle") reasons: ``nvml.h`` ``nvmlClocksEventReason*`` (NVML API Reference,
"Clock Event Reasons"); nvidia-smi's XML names the same bits, spelling one of them differently.
"""

from __future__ import annotations

import datetime as dt

CLOCK_EVENT_BITS: dict[str, int] = {
    "gpu_idle": 0x1,
    "applications_clocks_setting": 0x2,
    "sw_power_cap": 0x4,
    "hw_slowdown": 0x8,
    "sync_boost": 0x10,
    "sw_thermal_slowdown": 0x20,
    "hw_thermal_slowdown": 0x40,
    "hw_power_brake_slowdown": 0x80,
    "display_clock_setting": 0x100,
}

# nvidia-smi -q -x writes <clocks_event_reason_display_clocks_setting> for NVML's DisplayClockSetting.
NVIDIA_SMI_REASON_NAMES: dict[str, str] = {"display_clocks_setting": "display_clock_setting"}


def as_utc(value: dt.datetime) -> dt.datetime:
    """``value`` in UTC, a naive time read as UTC already (the convention of every frame and table here)."""
    return value.replace(tzinfo=dt.UTC) if value.tzinfo is None else value.astimezone(dt.UTC)


def check_window(start: dt.datetime, end: dt.datetime, longest: dt.timedelta | None = None, too_long: str = "") -> None:
    """``ValueError`` naming what is wrong with a window ``[start, end)`` a caller gave: a bound without a time zone
    (a time read as UTC here would be a guess about the caller's clock), an end not after the start, or, with
    ``longest``, a span over it (``too_long``, the caller's reason, is the message)."""
    for name, t in (("start", start), ("end", end)):
        if t.tzinfo is None:
            raise ValueError(f"{name} needs a time zone (RFC 3339, e.g. 2026-03-01T00:00:00Z)")
    if end <= start:
        raise ValueError("end must be after start")
    if longest is not None and end - start > longest:
        raise ValueError(too_long or f"the window is longer than {longest}")

"""Switch vitals from ``ibswinfo`` (a script that reads an unmanaged Mellanox/NVIDIA switch's MADs and
registers through ``mlxreg``): ``key | value`` lines for part number, GUID, firmware, uptime, each PSU
(status, DC power, fan, watts), temperature and fans.

Each value becomes a ``metric_sample`` series labelled with the switch's ``guid``: ``ib_switch_uptime_s``,
``ib_switch_temperature_c``, ``ib_switch_max_temperature_c``, ``ib_switch_ports``,
``ib_switch_psu_ok{psu}`` / ``ib_switch_psu_dc_ok{psu}`` / ``ib_switch_psu_fan_ok{psu}`` (1 OK, 0 not),
``ib_switch_psu_power_w{psu}``, ``ib_switch_fan_ok`` and ``ib_switch_fan_rpm{fan}``; ``ib_switch_info``
(value 1) carries part number, serial and firmware as labels. A fan status of ERROR while every fan
reports rpm is kept as it is (0): the switch says so, and its rpm readings do not contradict a failed
fan-tray sensor.

Pure: bytes in, a ``Batch`` with ``metric_sample`` rows out; the caller's time stamps them.
"""

from __future__ import annotations

import datetime as dt
import re

import polars as pl

from fleetscope.core import frames as F
from fleetscope.core.errors import ParseError
from fleetscope.core.textinput import input_lines
from ingest import infiniband as ib
from ingest.format import FormatSpec, Sniff, SniffView

MAX_INPUT_BYTES = 1 * 2**20
MAX_LINE_BYTES = 1024
_KV = re.compile(r"^(\s*)([^|]+?)\s*\|\s*(.*?)\s*$")
_UPTIME = re.compile(r"^(\d+)d-(\d{1,2}):(\d{2}):(\d{2})$")


def _ok(value: str) -> float:
    return 1.0 if value.strip().upper() == "OK" else 0.0


def _num(value: str, source: str, lineno: int, key: str) -> float:
    try:
        v = float(value)
    except ValueError:
        raise ParseError(f"{value[:40]!r} is not a number", source=source, line=lineno, field=key) from None
    if not -1e9 < v < 1e9:
        raise ParseError(f"{value[:40]!r} is out of range", source=source, line=lineno, field=key)
    return v


def parse(data: bytes, *, ts: dt.datetime | None, source: str = "ibswinfo") -> F.Batch:
    """The switch's vitals as ``metric_sample`` series."""
    if ts is None:
        raise ParseError("ibswinfo prints no time: pass ts", source=source)
    if ts.tzinfo is None:
        raise ParseError("ts must be timezone-aware", source=source)
    info: dict[str, str] = {}
    values: list[tuple[str, dict[str, str], float]] = []
    psu: str | None = None
    for lineno, line in input_lines(data, source, max_input_bytes=MAX_INPUT_BYTES, max_line_bytes=MAX_LINE_BYTES, strip=False):
        m = _KV.match(line)
        if not m:
            continue  # banners (=====, -----) and the product title
        indent, key, value = m.group(1), m.group(2).strip().lower(), m.group(3)
        if indent and psu is not None:
            if key == "dc power":
                values.append(("ib_switch_psu_dc_ok", {"psu": psu}, _ok(value)))
            elif key == "fan status":
                values.append(("ib_switch_psu_fan_ok", {"psu": psu}, _ok(value)))
            elif key == "power (w)":
                values.append(("ib_switch_psu_power_w", {"psu": psu}, _num(value, source, lineno, key)))
            continue
        psu = None
        pm = re.match(r"^psu(\d+) status$", key)
        fm = re.match(r"^fan#(\d+) \(rpm\)$", key)
        if key in ("part number", "serial number", "firmware version", "product name", "psid", "revision"):
            info[key.replace(" ", "_")] = value[: ib.MAX_TEXT]
        elif key == "guid":
            try:
                info["guid"] = ib.guid(value)
            except ValueError as exc:
                raise ParseError(str(exc), source=source, line=lineno, field="GUID") from None
        elif key == "ports":
            values.append(("ib_switch_ports", {}, _num(value, source, lineno, key)))
        elif key.startswith("uptime"):
            um = _UPTIME.match(value)
            if not um:
                raise ParseError(f"uptime {value[:40]!r} is not like 96d-01:55:47", source=source, line=lineno, field="uptime")
            d, h, mi, s = (int(x) for x in um.groups())
            values.append(("ib_switch_uptime_s", {}, float(((d * 24 + h) * 60 + mi) * 60 + s)))
        elif pm:
            psu = pm.group(1)
            values.append(("ib_switch_psu_ok", {"psu": psu}, _ok(value)))
        elif key == "temperature (c)":
            values.append(("ib_switch_temperature_c", {}, _num(value, source, lineno, key)))
        elif key == "max temp (c)":
            values.append(("ib_switch_max_temperature_c", {}, _num(value, source, lineno, key)))
        elif key == "fan status":
            values.append(("ib_switch_fan_ok", {}, _ok(value)))
        elif fm:
            values.append(("ib_switch_fan_rpm", {"fan": fm.group(1)}, _num(value, source, lineno, key)))
    if "guid" not in info:
        raise ParseError("no 'GUID | 0x...' line: cannot name the switch", source=source, field="GUID")
    guid = info["guid"]
    when = ts.astimezone(dt.UTC)
    rows = [{"ts": when, "series": F.series_key(name, {"guid": guid, **labels}), "value": v} for name, labels, v in values]
    meta_labels = {"guid": guid, **{k: v for k, v in info.items() if k != "guid"}}
    rows.append({"ts": when, "series": F.series_key("ib_switch_info", meta_labels), "value": 1.0})
    df = pl.DataFrame(rows, schema={"ts": F.UTC_US, "series": pl.String, "value": pl.Float64})
    return F.Batch(source=source, metric_sample=F.conform(F.METRIC_SAMPLE, df), meta={"switch_guid": guid, "series": len(rows)})


def _looks_like(view: SniffView) -> bool:
    t = view.text[:8192]
    return bool(re.search(r"^part number\s+\|", t, re.MULTILINE) and re.search(r"^GUID\s+\|\s*0x", t, re.MULTILINE))


FORMATS = (
    FormatSpec("ibswinfo", "InfiniBand switch vitals from ibswinfo (PSUs, temperature, fans, uptime)",
               lambda d, s, o: parse(d, ts=o.ts, source=s), sniff=Sniff(54, _looks_like), needs_ts=True),
)

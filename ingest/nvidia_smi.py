"""nvidia-smi output -> a :class:`Batch`: ``--query-gpu=... --format=csv``, ``-q -x`` XML, capture bundles.

Three entry points, one shape of result (``gpu_sample``, ``gpu`` inventory, ``metric_sample`` for
readings without a ``gpu_sample`` column, ``meta`` for what was skipped):

- :func:`parse_csv` reads ``nvidia-smi --query-gpu=<fields> --format=csv[,nounits]`` with its header row.
  Units come from the header (``power.draw [W]``) or from the value (``69.85 W``), so ``nounits`` and
  plain ``csv`` give the same numbers. nvidia-smi prints a missing reading as ``[N/A]``, ``N/A``,
  ``[Not Supported]``, ``[Requested functionality has been deprecated]``, ``[Unknown Error]`` and so
  on: anything in square brackets, ``N/A`` and an empty field are "no value" and never stored.
- :func:`parse_xml` reads ``nvidia-smi -q -x`` (DTD ``nvsmi_device_v1x``), including MIG devices.
  The document is refused (:class:`ParseError`) if it declares entities, references an external
  entity or carries an internal DTD subset: that is how entity-expansion ("billion laughs", CWE-776)
  and external-entity (XXE, CWE-611) attacks start, and nvidia-smi never writes either. The refusal is
  made by the XML parser as it meets the declaration (defusedxml's expat handlers), after it decoded
  the document, so it holds in every encoding expat reads (UTF-8, UTF-16 LE/BE with or without a
  byte-order mark, an 8-bit encoding named in the XML declaration); an encoding expat cannot read
  (UTF-32, UTF-7, ...) is refused as not well-formed. A plain external
  ``<!DOCTYPE nvidia_smi_log SYSTEM "...dtd">``, which nvidia-smi does write, is allowed: it is never fetched.
- :func:`parse_capture` reads a multi-section capture bundle as collected by nvidia_gpu_exporter's
  capture tool (sections headed ``# <phase> :: <what>`` / ``# $ <command>``) and parses every
  ``--query-gpu`` CSV section in it.

Units: MiB -> bytes (x 2**20), % -> ratio, W, MHz, degrees C, us -> s. The CSV ``timestamp`` column
and the XML ``<timestamp>`` are the host's local time without a zone; they are taken as UTC (run
nvidia-smi with ``TZ=UTC``), and ``ts=`` replaces them when given. MIG instances are rows of their own,
keyed ``f"{parent_uuid}/mig{gpu_instance_id}"`` exactly as :mod:`ingest.dcgm` keys them.

Readings without a ``gpu_sample`` column (power limits, memory total, clock maxima, thresholds, ...)
go to ``metric_sample`` as ``nvsmi_<field>_<unit>{gpu_uuid="..."}`` with dots turned into ``_``,
e.g. ``nvsmi_power_limit_w`` and ``nvsmi_memory_total_bytes``.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from datetime import UTC, datetime

import defusedxml
import polars as pl
from defusedxml.ElementTree import DefusedXMLParser

from fleetscope.core.units import CLOCK_EVENT_BITS, NVIDIA_SMI_REASON_NAMES
from fleetscope.core.errors import ParseError
from fleetscope.core.frames import GPU, GPU_SAMPLE, METRIC_SAMPLE, Batch, series_key
from ingest.format import FormatSpec, Sniff, SniffView, Splitting, cut_line

__all__ = ["CSV_FIELDS", "parse_capture", "parse_csv", "parse_xml"]

MiB = 2**20

# --query-gpu field -> gpu_sample column. Several names can feed one column (renamed fields across
# driver generations): the first present and non-null wins.
CSV_FIELDS: dict[str, tuple[str, ...]] = {
    "util_ratio": ("utilization.gpu",),
    "mem_copy_util_ratio": ("utilization.memory",),
    "enc_util_ratio": ("utilization.encoder",),
    "dec_util_ratio": ("utilization.decoder",),
    "fb_used_bytes": ("memory.used",),
    "fb_free_bytes": ("memory.free",),
    "fb_reserved_bytes": ("memory.reserved",),
    "power_w": ("power.draw", "power.draw.average", "power.draw.instant"),
    "temp_c": ("temperature.gpu",),
    "mem_temp_c": ("temperature.memory",),
    "sm_clock_mhz": ("clocks.current.sm", "clocks.sm"),
    "mem_clock_mhz": ("clocks.current.memory", "clocks.mem"),
    "ecc_sbe_volatile_total": ("ecc.errors.corrected.volatile.total",),
    "ecc_dbe_volatile_total": ("ecc.errors.uncorrected.volatile.total",),
    "ecc_sbe_aggregate_total": ("ecc.errors.corrected.aggregate.total",),
    "ecc_dbe_aggregate_total": ("ecc.errors.uncorrected.aggregate.total",),
    "retired_sbe_total": ("retired_pages.single_bit_ecc.count", "retired_pages.sbe"),
    "retired_dbe_total": ("retired_pages.double_bit.count", "retired_pages.dbe"),
    "retired_pending_total": ("retired_pages.pending",),
    "remap_correctable_total": ("remapped_rows.correctable",),
    "remap_uncorrectable_total": ("remapped_rows.uncorrectable",),
    "remap_pending": ("remapped_rows.pending",),
    "remap_failure": ("remapped_rows.failure",),
    "clock_event_reasons": ("clocks_event_reasons.active", "clocks_throttle_reasons.active"),
}
_INVENTORY_FIELDS = {"timestamp", "uuid", "name", "pci.bus_id", "index", "driver_version", "hostname", "serial"}
_INT_COLUMNS = {c.name for c in GPU_SAMPLE.columns if c.dtype == pl.Int64}

# Unit -> (multiplier to SI, suffix of the metric_sample name).
_UNITS: dict[str, tuple[float, str]] = {
    "MiB": (MiB, "bytes"),
    "KiB": (1024.0, "bytes"),
    "GiB": (2.0**30, "bytes"),
    "%": (0.01, "ratio"),
    "W": (1.0, "w"),
    "MHz": (1.0, "mhz"),
    "C": (1.0, "c"),
    "us": (1e-6, "s"),
    "ms": (1e-3, "s"),
    "s": (1.0, "s"),
    "mV": (1e-3, "v"),
    "KB/s": (1000.0, "bytes_per_s"),
}
_ABSENT = re.compile(r"^\[.*\]$|^N/A$|^$")
# A reading: a number, then optionally a blank and its unit ("700.00 W", "81559 MiB", "0 %").
_NUMBER = re.compile(r"^([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)(?:\s+(\S+))?$")
# Numeric-looking fields that are identifiers or versions, not readings.
_NOT_A_READING = re.compile(r"^(pci\.|inforom\.|platform\.|fabric\.(cliqueId|clusterUuid)$|compute_cap$|.*version|.*serial|.*guid)")
_YES_NO = {"Yes": 1, "No": 0, "Active": 1, "Not Active": 0, "Enabled": 1, "Disabled": 0}
_NUMERIC_ENUM_FIELDS = {"remapped_rows.pending", "remapped_rows.failure", "retired_pages.pending"}



# --- CSV ------------------------------------------------------------------------------------------


def parse_csv(data: bytes | str, *, source: str = "", ts: datetime | None = None) -> Batch:
    """Parse ``nvidia-smi --query-gpu=... --format=csv[,nounits]`` output (header row required).

    Each data row is one GPU at the row's ``timestamp`` (UTC, see module doc) or at ``ts``; a row with
    neither is a :class:`ParseError`. ``uuid`` must be among the queried fields.
    """
    text = _decode(data, source)
    # nvidia-smi separates fields with ", " and never quotes: a plain split is the format's own rule.
    lines = text.replace("\r\n", "\n").split("\n")
    while lines and not lines[-1].strip():
        lines.pop()
    if not lines:
        return _empty(source, {"format": "nvidia-smi-csv"})
    header = [h.strip() for h in lines[0].split(",")]
    fields, units = zip(*(_split_header(h) for h in header))
    if "uuid" not in fields:
        raise ParseError("no uuid column: query uuid with --query-gpu", source=source, line=1, field="uuid")
    rows = []
    for n, line in enumerate(lines[1:], start=2):
        if not line.strip():
            continue
        cells = [c.strip() for c in line.split(",")]
        if len(cells) != len(fields):
            raise ParseError(
                f"{len(cells)} values for {len(fields)} header fields", source=source, line=n, field="line"
            )
        rows.append((n, cells))
    records = []
    for n, cells in rows:
        records.append(_csv_record(dict(zip(fields, cells)), dict(zip(fields, units)), n, source, ts))
    return _batch(records, source, {"format": "nvidia-smi-csv", "rows": len(rows), "fields": len(fields)})


def _decode(data: bytes | str, source: str) -> str:
    if isinstance(data, str):
        return data
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise ParseError(f"not UTF-8 text (byte {e.start})", source=source, line=line, field="line") from None


def _split_header(h: str) -> tuple[str, str | None]:
    m = re.match(r"^(.*?)\s*\[(.+)\]$", h)
    if m:
        return m.group(1), m.group(2)
    # nvidia-smi prints temperatures as bare numbers, in degrees C (--help-query-gpu).
    return h, "C" if h.startswith("temperature.") else None


def _value(raw: str, header_unit: str | None, field: str, n: int, source: str) -> float | None:
    """A reading in SI units, or None when nvidia-smi reports it absent."""
    if _ABSENT.match(raw):
        return None
    if raw in _YES_NO and field in _NUMERIC_ENUM_FIELDS:
        return float(_YES_NO[raw])
    if raw.lower().startswith("0x"):
        try:
            return float(int(raw, 16))
        except ValueError:
            raise ParseError(f"bad hexadecimal value {raw!r}", source=source, line=n, field=field) from None
    m = _NUMBER.match(raw)
    if not m:
        raise ParseError(f"not a number: {raw[:40]!r}", source=source, line=n, field=field)
    unit = m.group(2) or header_unit
    if unit is not None and unit not in _UNITS:
        raise ParseError(f"unknown unit {unit!r} in {raw[:40]!r}", source=source, line=n, field=field)
    return float(m.group(1)) * (_UNITS[unit][0] if unit else 1.0)


def _csv_record(row: dict[str, str], units: dict[str, str | None], n: int, source: str, ts: datetime | None) -> dict:
    uuid = row.get("uuid", "")
    if _ABSENT.match(uuid):
        raise ParseError("row has no GPU UUID", source=source, line=n, field="uuid")
    # The row's own timestamp wins: ``ts`` (the CLI passes the file's modification time) only stands in
    # for queries without a timestamp field; otherwise a log of many polls would collapse into one instant.
    stamp = row.get("timestamp")
    if stamp is None or _ABSENT.match(stamp):
        if ts is None:
            raise ParseError("no timestamp column and no ts= given", source=source, line=n, field="timestamp")
        when = ts
    else:
        try:
            when = datetime.strptime(stamp, "%Y/%m/%d %H:%M:%S.%f").replace(tzinfo=UTC)
        except ValueError:
            raise ParseError(f"unreadable timestamp {stamp!r}", source=source, line=n, field="timestamp") from None
    sample: dict[str, float | None] = {}
    used = set(_INVENTORY_FIELDS)
    for col, names in CSV_FIELDS.items():
        for name in names:
            if name in row:
                used.add(name)
                v = _value(row[name], units.get(name), name, n, source)
                if v is not None and sample.get(col) is None:
                    sample[col] = v
    metrics = {}
    for name, raw in row.items():
        if name in used or _ABSENT.match(raw) or _NOT_A_READING.match(name):
            continue
        m = _NUMBER.match(raw)
        unit = (m.group(2) or units.get(name)) if m else None
        if not m or (unit is not None and unit not in _UNITS):
            continue  # text readings (modes, states, ids) are not metrics
        scale, suffix = _UNITS[unit] if unit else (1.0, "")
        metric = "nvsmi_" + re.sub(r"[^a-zA-Z0-9_]", "_", name) + (f"_{suffix}" if suffix else "")
        metrics[metric] = float(m.group(1)) * scale
    index = row.get("index")
    return {
        "ts": when,
        "uuid": uuid,
        "sample": sample,
        "metrics": metrics,
        "inventory": {
            "host": None if _ABSENT.match(row.get("hostname", "")) else row["hostname"],
            "gpu_index": int(index) if index is not None and index.isdigit() else None,
            "pci_bus_id": _present(row.get("pci.bus_id")),
            "model_name": _present(row.get("name")),
            "mig_profile": None,
            "mig_instance_id": None,
            "driver_version": _present(row.get("driver_version")),
        },
    }


def _present(v: str | None) -> str | None:
    return None if v is None or _ABSENT.match(v) else v


# --- XML ------------------------------------------------------------------------------------------


def parse_xml(data: bytes | str, *, source: str = "", ts: datetime | None = None) -> Batch:
    """Parse ``nvidia-smi -q -x`` output: one row per GPU and one per MIG device.

    Raises :class:`ParseError` for entity declarations or an internal DTD subset (see module doc) and
    for documents that are not well-formed or not an ``nvidia_smi_log``.
    """
    raw = data.encode() if isinstance(data, str) else data
    root = _parse_xml(raw, source)
    if root.tag != "nvidia_smi_log":
        raise ParseError(f"root element is <{root.tag}>, not <nvidia_smi_log>", source=source, field="xml")
    when = ts
    if when is None:
        stamp = _text(root, "timestamp")
        if stamp is None:
            raise ParseError("no <timestamp> and no ts= given", source=source, field="timestamp")
        try:
            when = datetime.strptime(" ".join(stamp.split()), "%a %b %d %H:%M:%S %Y").replace(tzinfo=UTC)
        except ValueError:
            raise ParseError(f"unreadable <timestamp> {stamp!r}", source=source, field="timestamp") from None
    driver = _text(root, "driver_version")
    records = []
    for index, gpu in enumerate(root.findall("gpu")):
        uuid = _text(gpu, "uuid")
        if uuid is None:
            raise ParseError(f"<gpu id={gpu.get('id')!r}> has no <uuid>", source=source, field="uuid")
        inventory = {
            "host": None,
            "gpu_index": index,  # nvidia-smi enumerates GPUs in this order (minor_number is not the index)
            "pci_bus_id": _text(gpu, "pci/pci_bus_id") or gpu.get("id"),
            "model_name": _text(gpu, "product_name"),
            "mig_profile": None,
            "mig_instance_id": None,
            "driver_version": driver,
        }
        records.append(
            {"ts": when, "uuid": uuid, "sample": _xml_sample(gpu), "metrics": _xml_metrics(gpu), "inventory": inventory}
        )
        for mig in gpu.findall("mig_devices/mig_device"):
            gi = _text(mig, "gpu_instance_id")
            if gi is None:
                continue
            sample = {
                "fb_used_bytes": _num(mig, "fb_memory_usage/used"),
                "fb_free_bytes": _num(mig, "fb_memory_usage/free"),
                "fb_reserved_bytes": _num(mig, "fb_memory_usage/reserved"),
                "ecc_dbe_volatile_total": _num(mig, "ecc_error_count/volatile_count/sram_uncorrectable"),
            }
            metrics = {"nvsmi_memory_total_bytes": _num(mig, "fb_memory_usage/total")}
            records.append(
                {
                    "ts": when,
                    "uuid": f"{uuid}/mig{gi}",
                    "sample": sample,
                    "metrics": {k: v for k, v in metrics.items() if v is not None},
                    "inventory": {**inventory, "gpu_index": None, "mig_instance_id": int(gi)},
                }
            )
    return _batch(records, source, {"format": "nvidia-smi-xml", "gpus": len(root.findall("gpu"))})


class _InternalSubset(Exception):
    def __init__(self, name: str) -> None:
        self.name = name


class _Parser(DefusedXMLParser):
    """defusedxml's parser (entity declarations and external references refused), which also refuses a
    DOCTYPE with an internal subset as soon as it opens: entities are declared there (an external DTD is
    never read), and nvidia-smi writes none."""

    def __init__(self) -> None:
        super().__init__(forbid_dtd=False, forbid_entities=True, forbid_external=True)
        # Not named _doctype: ElementTree's XMLParser keeps an attribute of that name.
        self.parser.StartDoctypeDeclHandler = self._refuse_internal_subset

    def _refuse_internal_subset(self, name: str, sysid: str | None, pubid: str | None, has_internal_subset: int) -> None:
        if has_internal_subset:
            raise _InternalSubset(name)


def _parse_xml(raw: bytes, source: str) -> ET.Element:
    parser = _Parser()
    try:
        parser.feed(raw)
        return parser.close()
    except defusedxml.EntitiesForbidden as e:
        raise ParseError(f"XML declares entity {e.name!r}; refused (entity expansion)", source=source, line=_line(parser),
                         field="xml") from None
    except defusedxml.ExternalReferenceForbidden as e:
        raise ParseError(f"XML references external entity {e.sysid!r}; refused", source=source, line=_line(parser), field="xml") from None
    except _InternalSubset as e:
        raise ParseError(f"XML DOCTYPE {e.name} has an internal subset, where entities are declared; refused (entity expansion)",
                         source=source, line=_line(parser), field="xml") from None
    except ET.ParseError as e:
        line = e.position[0] if getattr(e, "position", None) else None
        raise ParseError(f"not well-formed XML: {e}", source=source, line=line, field="xml") from None


def _line(parser: _Parser) -> int | None:
    return getattr(parser.parser, "CurrentLineNumber", None)


def _text(el: ET.Element, path: str) -> str | None:
    node = el.find(path)
    if node is None or node.text is None:
        return None
    t = node.text.strip()
    return None if _ABSENT.match(t) else t


def _num(el: ET.Element, path: str) -> float | None:
    """A reading with its unit ("81920 MiB", "27 C", "67.03 W", "45 %") in SI units, None if absent."""
    t = _text(el, path)
    if t is None:
        return None
    if t in _YES_NO:
        return float(_YES_NO[t])
    m = _NUMBER.match(t)
    if not m:
        return None
    unit = m.group(2)
    if unit == "x":  # link widths print as "16x"
        unit = None
    return float(m.group(1)) * (_UNITS.get(unit, (1.0, ""))[0] if unit else 1.0)


def _sum(*vals: float | None) -> float | None:
    present = [v for v in vals if v is not None]
    return sum(present) if present else None


def _first(*vals: float | None) -> float | None:
    return next((v for v in vals if v is not None), None)


def _xml_sample(gpu: ET.Element) -> dict[str, float | None]:
    power = _first(
        _num(gpu, "gpu_power_readings/power_draw"),
        _num(gpu, "gpu_power_readings/average_power_draw"),
        _num(gpu, "gpu_power_readings/instant_power_draw"),
        _num(gpu, "power_readings/power_draw"),
    )
    s = {
        "util_ratio": _num(gpu, "utilization/gpu_util"),
        "mem_copy_util_ratio": _num(gpu, "utilization/memory_util"),
        "enc_util_ratio": _num(gpu, "utilization/encoder_util"),
        "dec_util_ratio": _num(gpu, "utilization/decoder_util"),
        "fb_used_bytes": _num(gpu, "fb_memory_usage/used"),
        "fb_free_bytes": _num(gpu, "fb_memory_usage/free"),
        "fb_reserved_bytes": _num(gpu, "fb_memory_usage/reserved"),
        "power_w": power,
        "temp_c": _num(gpu, "temperature/gpu_temp"),
        "mem_temp_c": _num(gpu, "temperature/memory_temp"),
        "sm_clock_mhz": _num(gpu, "clocks/sm_clock"),
        "mem_clock_mhz": _num(gpu, "clocks/mem_clock"),
        "pcie_replay_total": _num(gpu, "pci/replay_counter"),
        "retired_sbe_total": _num(gpu, "retired_pages/multiple_single_bit_retirement/retired_count"),
        "retired_dbe_total": _num(gpu, "retired_pages/double_bit_retirement/retired_count"),
        "retired_pending_total": _num(gpu, "retired_pages/pending_retirement"),
        "remap_correctable_total": _num(gpu, "remapped_rows/remapped_row_corr"),
        "remap_uncorrectable_total": _num(gpu, "remapped_rows/remapped_row_unc"),
        "remap_pending": _num(gpu, "remapped_rows/remapped_row_pending"),
        "remap_failure": _num(gpu, "remapped_rows/remapped_row_failure"),
    }
    # ECC: DTD v12 splits SRAM and DRAM; older DTDs give single_bit / double_bit totals.
    for scope, kind in (("volatile", "volatile"), ("aggregate", "aggregate")):
        s[f"ecc_sbe_{kind}_total"] = _first(
            _sum(_num(gpu, f"ecc_errors/{scope}/sram_correctable"), _num(gpu, f"ecc_errors/{scope}/dram_correctable")),
            _num(gpu, f"ecc_errors/{scope}/single_bit/total"),
        )
        s[f"ecc_dbe_{kind}_total"] = _first(
            _sum(
                _num(gpu, f"ecc_errors/{scope}/sram_uncorrectable"), _num(gpu, f"ecc_errors/{scope}/dram_uncorrectable")
            ),
            _num(gpu, f"ecc_errors/{scope}/double_bit/total"),
        )
    s["clock_event_reasons"] = _reason_mask(gpu)
    return s


def _reason_mask(gpu: ET.Element) -> float | None:
    block = gpu.find("clocks_event_reasons")
    prefix = "clocks_event_reason_"
    if block is None:
        block, prefix = gpu.find("clocks_throttle_reasons"), "clocks_throttle_reason_"
    if block is None:
        return None
    mask, seen = 0, False
    for child in block:
        reason = child.tag.removeprefix(prefix)
        bit = CLOCK_EVENT_BITS.get(NVIDIA_SMI_REASON_NAMES.get(reason, reason))
        state = (child.text or "").strip()
        if bit is None or state not in ("Active", "Not Active"):
            continue
        seen = True
        if state == "Active":
            mask |= bit
    return float(mask) if seen else None


# (XML path, metric_sample name) for readings without a gpu_sample column.
_XML_METRICS = (
    ("fb_memory_usage/total", "nvsmi_memory_total_bytes"),
    ("bar1_memory_usage/total", "nvsmi_bar1_memory_total_bytes"),
    ("gpu_power_readings/current_power_limit", "nvsmi_power_limit_w"),
    ("gpu_power_readings/default_power_limit", "nvsmi_power_default_limit_w"),
    ("gpu_power_readings/min_power_limit", "nvsmi_power_min_limit_w"),
    ("gpu_power_readings/max_power_limit", "nvsmi_power_max_limit_w"),
    ("power_readings/power_limit", "nvsmi_power_limit_w"),
    ("temperature/gpu_temp_max_threshold", "nvsmi_temperature_gpu_max_threshold_c"),
    ("temperature/gpu_temp_slow_threshold", "nvsmi_temperature_gpu_slow_threshold_c"),
    ("temperature/gpu_temp_tlimit", "nvsmi_temperature_gpu_tlimit_c"),
    ("clocks/graphics_clock", "nvsmi_clocks_current_graphics_mhz"),
    ("clocks/video_clock", "nvsmi_clocks_current_video_mhz"),
    ("max_clocks/graphics_clock", "nvsmi_clocks_max_graphics_mhz"),
    ("max_clocks/sm_clock", "nvsmi_clocks_max_sm_mhz"),
    ("max_clocks/mem_clock", "nvsmi_clocks_max_memory_mhz"),
    ("pci/tx_util", "nvsmi_pci_tx_util_bytes_per_s"),
    ("pci/rx_util", "nvsmi_pci_rx_util_bytes_per_s"),
    ("pci/pci_gpu_link_info/pcie_gen/current_link_gen", "nvsmi_pcie_link_gen_current"),
    ("pci/pci_gpu_link_info/link_widths/current_link_width", "nvsmi_pcie_link_width_current"),
    ("fan_speed", "nvsmi_fan_speed_ratio"),
    ("voltage/graphics_volt", "nvsmi_voltage_graphics_v"),
)


def _xml_metrics(gpu: ET.Element) -> dict[str, float]:
    out: dict[str, float] = {}
    for path, name in _XML_METRICS:
        v = _num(gpu, path)
        if v is not None and name not in out:
            out[name] = v
    return out


# --- capture bundles ------------------------------------------------------------------------------

_SECTION = re.compile(r"^#{20,}\n# (?P<title>[^\n]*)\n(?:# \$ (?P<cmd>[^\n]*)\n)?#{20,}\n", re.MULTILINE)


def parse_capture(data: bytes | str, *, source: str = "") -> Batch:
    """Parse every ``--query-gpu ... --format=csv`` section of a multi-section nvidia-smi capture.

    Other sections (help texts, ``-L``, ``topo -m``, the human-readable ``-q`` and table views,
    ``pmon``/``dmon``) are listed in ``meta["sections_skipped"]``; each parsed section's rows keep
    their own ``timestamp``.
    """
    text = _decode(data, source)
    marks = list(_SECTION.finditer(text))
    batch = _empty(source, {})
    parsed, skipped = [], []
    for i, m in enumerate(marks):
        body = text[m.end() : marks[i + 1].start() if i + 1 < len(marks) else len(text)]
        cmd = m.group("cmd") or ""
        title = m.group("title")
        if "--query-gpu=" in cmd and "--format=csv" in cmd and body.strip():
            first_line = text.count("\n", 0, m.end()) + 1
            try:
                part = parse_csv(body.strip("\n"), source=f"{source}#{title}")
            except ParseError as e:
                line = None if e.line is None else e.line + first_line - 1
                raise ParseError(e.message, source=source, line=line, field=e.field) from None
            batch = batch.merge(part)
            parsed.append(title)
        else:
            skipped.append(title)
    batch.source = source
    batch.meta = {"format": "nvidia-smi-capture", "sections_parsed": parsed, "sections_skipped": skipped}
    if batch.gpu is not None and batch.gpu.height:
        batch.gpu = batch.gpu.unique("gpu_uuid", keep="last", maintain_order=True)
    return batch


# --- frames ---------------------------------------------------------------------------------------


def _batch(records: list[dict], source: str, meta: dict) -> Batch:
    if not records:
        return _empty(source, meta)
    cols: dict[str, list] = {c.name: [] for c in GPU_SAMPLE.columns}
    for r in records:
        cols["ts"].append(r["ts"])
        cols["gpu_uuid"].append(r["uuid"])
        for c in GPU_SAMPLE.columns[2:]:
            v = r["sample"].get(c.name)
            if v is not None and c.name in _INT_COLUMNS:
                v = int(round(v))
            cols[c.name].append(v)
    gpu_sample = pl.DataFrame(cols, schema=GPU_SAMPLE.schema)
    gpu = pl.DataFrame(
        [{"gpu_uuid": r["uuid"], **r["inventory"]} for r in records], schema=GPU.schema
    ).unique("gpu_uuid", keep="last", maintain_order=True)
    metric_rows = [
        (r["ts"], series_key(name, {"gpu_uuid": r["uuid"]}), v)
        for r in records
        for name, v in sorted(r["metrics"].items())
    ]
    metric = pl.DataFrame(metric_rows, schema=METRIC_SAMPLE.schema, orient="row") if metric_rows else None
    before = gpu_sample.height
    gpu_sample = gpu_sample.unique(["ts", "gpu_uuid"], keep="first", maintain_order=True)
    meta["duplicates_dropped"] = before - gpu_sample.height
    return Batch(source=source, gpu=gpu, gpu_sample=gpu_sample, metric_sample=metric, meta=meta)


def _empty(source: str, meta: dict) -> Batch:
    return Batch(source=source, gpu=GPU.empty(), gpu_sample=GPU_SAMPLE.empty(), meta=meta)



# --- declarations (ingest.format) --------------------------------------------------------------------

# Query fields an nvidia-smi CSV header names (dotted, lower case, never label blocks).
_CSV_HEADER_FIELDS = ("pci.bus_id", "uuid", "power.draw", "utilization.gpu", "memory.used")


def _looks_like_csv(view: SniffView) -> bool:
    first = view.stripped.split("\n", 1)[0].lower()
    return "," in first and "{" not in first and any(k in first for k in _CSV_HEADER_FIELDS)


FORMATS = (
    FormatSpec("nvidia_smi_csv", "nvidia-smi --query-gpu=... --format=csv",
               lambda d, s, o: parse_csv(d, source=s, ts=o.ts), sniff=Sniff(40, _looks_like_csv),
               streaming=Splitting(cut_line, header=True)),
    FormatSpec("nvidia_smi_xml", "nvidia-smi -q -x",
               lambda d, s, o: parse_xml(d, source=s, ts=o.ts), sniff=Sniff(20, lambda v: "<nvidia_smi_log" in v.text[:4096])),
    FormatSpec("nvidia_smi_capture", "multi-section nvidia-smi capture bundle",
               lambda d, s, o: parse_capture(d, source=s), sniff=Sniff(21, lambda v: "$ nvidia-smi" in v.text[:8192])),
)

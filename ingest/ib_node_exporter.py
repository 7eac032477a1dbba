"""InfiniBand port counters as node_exporter's ``infiniband`` collector exposes them (Prometheus text,
``node_infiniband_*``; ``collector/infiniband_linux.go``, which reads ``/sys/class/infiniband`` through
``prometheus/procfs``).

node_exporter has already turned the 4-octet data counters into bytes and the rate into bytes per second.
Its ``legacy_*`` series come from ``counters_ext/*_64`` and the unprefixed ones from ``counters/``; both are
read and the larger kept (``ingest.infiniband.merge_counter``), so this parser and the sysfs reader give
the same row for the same tree. Other series in the body (a whole node_exporter scrape) are skipped.

The host is the sample's ``host``, ``hostname`` or ``instance`` label (without its port) when there is
one; the caller's time stamps samples that carry no timestamp of their own.

Pure: bytes in, a ``Batch`` with ``fabric_port_sample`` rows out.
"""

from __future__ import annotations

import datetime as dt
import math
import re

import polars as pl

from fleetscope.core import frames as F
from fleetscope.core.promtext import label_map, lex_line
from fleetscope.core.errors import ParseError
from fleetscope.core.textinput import input_lines
from ingest import infiniband as ib
from ingest.format import FormatSpec, Sniff, SniffView, Splitting, cut_line

MAX_INPUT_BYTES = 256 * 2**20
MAX_LINE_BYTES = 64 * 1024
PREFIX = "node_infiniband_"

# series (without the prefix) -> column; counters are integers, the rest handled apart
COUNTERS: dict[str, str] = {
    "port_data_received_bytes_total": "rcv_bytes_total",
    "port_data_transmitted_bytes_total": "xmit_bytes_total",
    "legacy_data_received_bytes_total": "rcv_bytes_total",
    "legacy_data_transmitted_bytes_total": "xmit_bytes_total",
    "port_packets_received_total": "rcv_packets_total",
    "port_packets_transmitted_total": "xmit_packets_total",
    "legacy_packets_received_total": "rcv_packets_total",
    "legacy_packets_transmitted_total": "xmit_packets_total",
    "unicast_packets_received_total": "unicast_rcv_packets_total",
    "unicast_packets_transmitted_total": "unicast_xmit_packets_total",
    "legacy_unicast_packets_received_total": "unicast_rcv_packets_total",
    "legacy_unicast_packets_transmitted_total": "unicast_xmit_packets_total",
    "multicast_packets_received_total": "multicast_rcv_packets_total",
    "multicast_packets_transmitted_total": "multicast_xmit_packets_total",
    "legacy_multicast_packets_received_total": "multicast_rcv_packets_total",
    "legacy_multicast_packets_transmitted_total": "multicast_xmit_packets_total",
    "link_downed_total": "link_downed_total",
    "link_error_recovery_total": "link_error_recovery_total",
    "symbol_error_total": "symbol_errors_total",
    "port_errors_received_total": "rcv_errors_total",
    "port_receive_remote_physical_errors_total": "rcv_remote_physical_errors_total",
    "port_receive_switch_relay_errors_total": "rcv_switch_relay_errors_total",
    "port_discards_received_total": "rcv_discards_total",
    "port_discards_transmitted_total": "xmit_discards_total",
    "port_constraint_errors_received_total": "rcv_constraint_errors_total",
    "port_constraint_errors_transmitted_total": "xmit_constraint_errors_total",
    "local_link_integrity_errors_total": "local_link_integrity_errors_total",
    "excessive_buffer_overrun_errors_total": "excessive_buffer_overrun_errors_total",
    "vl15_dropped_total": "vl15_dropped_total",
    "port_transmit_wait_total": "xmit_wait_total",
}


def parse(data: bytes, *, ts: dt.datetime | None = None, source: str = "node_exporter") -> F.Batch:
    """``fabric_port_sample`` rows from the ``node_infiniband_*`` series of a node_exporter body."""
    if ts is not None and ts.tzinfo is None:
        raise ParseError("ts must be timezone-aware", source=source)
    rows: dict[tuple[dt.datetime, str, str, int], dict[str, object]] = {}
    skipped = 0
    for lineno, line in input_lines(data, source, max_input_bytes=MAX_INPUT_BYTES, max_line_bytes=MAX_LINE_BYTES):
        if line.startswith("#") or not line.startswith(PREFIX):
            continue
        sample = lex_line(line, lineno, source)
        if sample is None:
            continue
        _, name, pairs, value, ts_ms = sample
        value_text = line.split()[-2 if ts_ms is not None else -1]
        series = name[len(PREFIX):]
        if series == "info" or (series not in COUNTERS and series not in ("rate_bytes_per_second", "state_id", "physical_state_id")):
            skipped += 1
            continue
        labels = label_map(pairs, name=name, source=source, line=lineno)
        dev, port_text = labels.get("device"), labels.get("port")
        if not dev or not port_text:
            raise ParseError("a port series needs device and port labels", source=source, line=lineno, field="device" if not dev else "port")
        if not port_text.isdigit() or not 0 < int(port_text) <= 255:
            raise ParseError("port must be 1..255", source=source, line=lineno, field="port")
        if not math.isfinite(value) or value < 0:
            raise ParseError(f"{value_text[:40]!r} is not a counter or gauge value here (negative or not finite)", source=source, line=lineno, field=name)
        if ts_ms is not None:
            if abs(ts_ms) > 2**53:
                raise ParseError("timestamp out of range", source=source, line=lineno)
            when = dt.datetime.fromtimestamp(ts_ms / 1000, tz=dt.UTC)
        elif ts is not None:
            when = ts.astimezone(dt.UTC)
        else:
            raise ParseError("sample has no timestamp and none was given (pass ts)", source=source, line=lineno)
        host = labels.get("host") or labels.get("hostname") or (labels.get("instance") or "").rsplit(":", 1)[0] or None
        row = rows.setdefault((when, host or dev, dev, int(port_text)), {"host": host})
        if series in COUNTERS:
            if value >= 2**63 or value != math.floor(value):
                raise ParseError(f"{value_text[:40]!r} is not a counter value", source=source, line=lineno, field=name)
            col = COUNTERS[series]
            row[col] = ib.merge_counter(row.get(col), int(value))  # type: ignore[arg-type]
        elif series == "rate_bytes_per_second":
            row["rate_gbps"] = value * 8 / 1e9
        else:
            if value != math.floor(value) or value > 255:
                raise ParseError(f"{value_text[:40]!r} is not a port state number", source=source, line=lineno, field=name)
            names = ib.PORT_STATES if series == "state_id" else ib.PHYS_STATES
            row["state" if series == "state_id" else "phys_state"] = names.get(int(value), str(int(value)))
    if not rows:
        return F.Batch(source=source, meta={"fabric_ports": 0, "skipped_series": skipped})
    out = [{"ts": k[0], "node": k[1], "device": k[2], "port": k[3], **v, "source": source} for k, v in rows.items()]
    df = pl.DataFrame(out, schema_overrides={c.name: c.dtype for c in F.FABRIC_PORT_SAMPLE.columns if c.name in {k for r in out for k in r}},
                      infer_schema_length=None)
    return F.Batch(source=source, fabric_port_sample=F.conform(F.FABRIC_PORT_SAMPLE, df), meta={"fabric_ports": len(out), "skipped_series": skipped})


def _looks_like(view: SniffView) -> bool:
    return bool(re.search(r"^node_infiniband_\w+\{", view.text, re.MULTILINE))


FORMATS = (
    # Before dcgm (30): a node_exporter body is Prometheus text too.
    FormatSpec("ib_node_exporter", "InfiniBand port counters from node_exporter's infiniband collector (node_infiniband_*)",
               lambda d, s, o: parse(d, ts=o.ts, source=s), sniff=Sniff(29, _looks_like), needs_ts=True,
               streaming=Splitting(cut_line)),
)

"""Port counters as infiniband-diags' ``perfquery`` prints them: ``-x`` (PortCountersExtended, 64-bit data
and packet counters, with the PortCounters error counters) or plain (PortCounters), and ``-E``
(PortRcvErrorDetails), one block per port:

    # Port extended counters: Lid 1719 port 1 (CapMask: 0x5300 CapMask2: 0x0000002)
    PortSelect:......................1
    PortXmitData:....................36298026860928

Field names are the IBTA attribute fields (InfiniBand Architecture Specification vol. 1, 16.1.3.5 and
16.1.4); ``PortXmitData`` / ``PortRcvData`` count 4-octet words and are stored as bytes (x 4). perfquery
prints the LID it queried, not the GUID, so a port's node is ``lid:<n>``; the topology
(``ingest.ibnetdiscover``) maps LIDs to GUIDs and names. A block for port 255 (perfquery's sum over all
ports) is not a port and is skipped.

Pure: bytes in, a ``Batch`` with ``fabric_port_sample`` rows out; the caller's time stamps them.
"""

from __future__ import annotations

import datetime as dt
import re

import polars as pl

from fleetscope.core import frames as F
from fleetscope.core.errors import ParseError
from fleetscope.core.textinput import input_lines
from ingest.format import FormatSpec, Sniff, SniffView

MAX_INPUT_BYTES = 64 * 2**20
MAX_LINE_BYTES = 1024
ALL_PORTS = 255

FIELDS: dict[str, tuple[str, int]] = {
    "PortXmitData": ("xmit_bytes_total", 4),
    "PortRcvData": ("rcv_bytes_total", 4),
    "PortXmitPkts": ("xmit_packets_total", 1),
    "PortRcvPkts": ("rcv_packets_total", 1),
    "PortUnicastXmitPkts": ("unicast_xmit_packets_total", 1),
    "PortUnicastRcvPkts": ("unicast_rcv_packets_total", 1),
    "PortMulticastXmitPkts": ("multicast_xmit_packets_total", 1),
    "PortMulticastRcvPkts": ("multicast_rcv_packets_total", 1),
    "SymbolErrorCounter": ("symbol_errors_total", 1),
    "LinkErrorRecoveryCounter": ("link_error_recovery_total", 1),
    "LinkDownedCounter": ("link_downed_total", 1),
    "PortRcvErrors": ("rcv_errors_total", 1),
    "PortRcvRemotePhysicalErrors": ("rcv_remote_physical_errors_total", 1),
    "PortRcvSwitchRelayErrors": ("rcv_switch_relay_errors_total", 1),
    "PortXmitDiscards": ("xmit_discards_total", 1),
    "PortXmitConstraintErrors": ("xmit_constraint_errors_total", 1),
    "PortRcvConstraintErrors": ("rcv_constraint_errors_total", 1),
    "LocalLinkIntegrityErrors": ("local_link_integrity_errors_total", 1),
    "ExcessiveBufferOverrunErrors": ("excessive_buffer_overrun_errors_total", 1),
    "VL15Dropped": ("vl15_dropped_total", 1),
    "PortXmitWait": ("xmit_wait_total", 1),
    "QP1Dropped": ("qp1_dropped_total", 1),
    "PortLocalPhysicalErrors": ("rcv_local_physical_errors_total", 1),
    "PortMalformedPktErrors": ("rcv_malformed_packet_errors_total", 1),
    "PortBufferOverrunErrors": ("rcv_buffer_overrun_errors_total", 1),
    "PortDLIDMappingErrors": ("rcv_dlid_mapping_errors_total", 1),
    "PortVLMappingErrors": ("rcv_vl_mapping_errors_total", 1),
    "PortLoopingErrors": ("rcv_looping_errors_total", 1),
}
_IGNORED = {"CounterSelect", "CounterSelect2"}
_HEADER = re.compile(r"^#\s*(Port extended counters|Port counters|PortRcvErrorDetails counters):\s*Lid\s+(\d+)\s+port\s+(\d+)\b")
_FIELD = re.compile(r"^([A-Za-z0-9]+):\.*\s*(\S+)$")


def parse(data: bytes, *, ts: dt.datetime | None, source: str = "perfquery") -> F.Batch:
    """``fabric_port_sample`` rows from perfquery output (any mix of ``-x``, plain and ``-E`` blocks)."""
    if ts is None:
        raise ParseError("perfquery prints no time: pass ts", source=source)
    if ts.tzinfo is None:
        raise ParseError("ts must be timezone-aware", source=source)
    when = ts.astimezone(dt.UTC)
    rows: dict[tuple[int, int], dict[str, object]] = {}
    cur: dict[str, object] | None = None
    port = 0
    skipped = 0
    for lineno, line in input_lines(data, source, max_input_bytes=MAX_INPUT_BYTES, max_line_bytes=MAX_LINE_BYTES):
        h = _HEADER.match(line)
        if h:
            lid, port = int(h.group(2)), int(h.group(3))
            if lid > 0xFFFF:
                raise ParseError("LID must be 16 bits", source=source, line=lineno, field="Lid")
            if port > ALL_PORTS:
                raise ParseError("port must be 0..255", source=source, line=lineno, field="port")
            if port == ALL_PORTS:
                skipped += 1
                cur = {}
                continue
            cur = rows.setdefault((lid, port), {"lid": lid})
            continue
        if line.startswith("#"):
            continue
        m = _FIELD.match(line)
        if not m:
            raise ParseError("expected 'Field:....value'", source=source, line=lineno)
        if cur is None:
            raise ParseError("counter before any '# ... counters: Lid N port P' header", source=source, line=lineno)
        name, value = m.groups()
        if name in _IGNORED:
            continue
        if not value.isdigit() or len(value) > 20 or int(value) >= 2**63:
            raise ParseError(f"{value[:40]!r} is not a counter value", source=source, line=lineno, field=name)
        if name == "PortSelect":
            if port != ALL_PORTS and int(value) != port:
                raise ParseError(f"PortSelect {value} does not match the header's port {port}", source=source, line=lineno, field=name)
            continue
        if name not in FIELDS or port == ALL_PORTS:
            continue
        col, mult = FIELDS[name]
        v = int(value) * mult
        if v >= 2**63:
            raise ParseError("counter beyond 2^63 bytes cannot be stored", source=source, line=lineno, field=name)
        cur[col] = v
    if not rows:
        if skipped:
            return F.Batch(source=source, meta={"fabric_ports": 0, "all_ports_blocks": skipped})
        raise ParseError("no '# ... counters: Lid N port P' block", source=source)
    out = [{"ts": when, "node": f"lid:{lid}", "device": "", "port": p, **v, "source": source} for (lid, p), v in rows.items()]
    df = pl.DataFrame(out, schema_overrides={c.name: c.dtype for c in F.FABRIC_PORT_SAMPLE.columns if c.name in {k for r in out for k in r}},
                      infer_schema_length=None)
    return F.Batch(source=source, fabric_port_sample=F.conform(F.FABRIC_PORT_SAMPLE, df), meta={"fabric_ports": len(out), "all_ports_blocks": skipped})


def _looks_like(view: SniffView) -> bool:
    return bool(_HEADER.match(view.stripped)) or bool(re.search(r"^#\s*Port (extended )?counters: Lid \d+ port \d+", view.text, re.MULTILINE)
                                                      and "PortXmitData:" in view.text)


FORMATS = (
    FormatSpec("perfquery", "infiniband-diags perfquery output (-x extended, plain, -E receive error details)",
               lambda d, s, o: parse(d, ts=o.ts, source=s), sniff=Sniff(52, _looks_like), needs_ts=True),
)

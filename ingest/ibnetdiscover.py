"""Fabric topology from infiniband-diags' ``ibnetdiscover --ports`` (one line per port):

    CA   134  1 0x7cfe9003003b4bde 4x EDR - SW  1719 10 0x7cfe9003009ce5b0 ( 'o0001 HCA-1' - 'ib-i1l1s01' )
    SW  2052 37 0x506b4b03005c2740 4x ???                                    'ib-i4l1s01'

type (CA, SW, RT), LID, port, GUID, width and speed of the local port, then either its peer (type, LID,
port, GUID) and both node descriptions, or only the local description when the port has no peer. A link
between two ports is printed once from each end; here it is kept once, HCA end first (between switches,
the lower GUID and port first). A port without a peer is kept apart (``connected`` false): an unused
switch port is not a slow link, whatever width and speed it reports (``4x SDR`` or ``4x ???``).

Node descriptions are trimmed (switches are often named with leading or trailing blanks). An HCA's
description is ``<hostname> <device>`` (the kernel's default ``node_desc``), so its first word is the
host when the second names a device (``mlx5_3``, ``HCA-1``).

Pure: bytes in, a ``Batch`` with ``fabric_link`` rows out.
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

MAX_INPUT_BYTES = 64 * 2**20
MAX_LINE_BYTES = 4096

_END = r"(CA|SW|RT)\s+(\d+)\s+(\d+)\s+(0x[0-9a-fA-F]{1,16})"
_LINE = re.compile(
    rf"^{_END}\s+(\d+[xX])\s+(\S+)\s*(?:-\s+{_END}\s+\(\s*'(.*?)'\s+-\s+'(.*)'\s*\)|'(.*)')\s*$"
)
_DEVICE_WORD = re.compile(r"^(HCA-\d+|[a-z][a-z0-9]*_\d+)$")


def _host(kind: str, desc: str | None) -> str | None:
    if kind != "CA" or not desc:
        return None
    words = desc.split()
    return words[0] if len(words) == 2 and _DEVICE_WORD.match(words[1]) else None


def parse(data: bytes, *, ts: dt.datetime | None = None, source: str = "ibnetdiscover") -> F.Batch:
    """``fabric_link`` rows: each link once, each unconnected port once."""
    if ts is not None and ts.tzinfo is None:
        raise ParseError("ts must be timezone-aware", source=source)
    links: dict[tuple[str, int], dict[str, object]] = {}
    conflicts = 0
    for lineno, line in input_lines(data, source, max_input_bytes=MAX_INPUT_BYTES, max_line_bytes=MAX_LINE_BYTES):
        if line.startswith("#"):
            continue
        m = _LINE.match(line)
        if not m:
            raise ParseError("not an 'ibnetdiscover --ports' line (TYPE LID PORT GUID WIDTH SPEED ...)", source=source, line=lineno)
        (k1, lid1, p1, g1, width, speed, k2, lid2, p2, g2, d1, d2, alone) = m.groups()
        for lid, port, what in ((lid1, p1, "local"), (lid2, p2, "peer")):
            if lid is not None and (int(lid) > 0xFFFF or int(port) > 255):
                raise ParseError(f"{what} LID must be 16 bits and port 0..255", source=source, line=lineno)
        width = width.upper()
        if width not in ib.WIDTH_LANES:
            raise ParseError(f"unknown link width {width!r}", source=source, line=lineno, field="width")
        speed_name = speed.upper() if speed.upper() in ib.LANE_GBPS else None  # '???': the tool could not name it
        for d in (d1, d2, alone):
            if d is not None and len(d) > ib.MAX_TEXT:
                raise ParseError(f"node description longer than {ib.MAX_TEXT} characters", source=source, line=lineno)
        a = {"node": ib.guid(g1), "port": int(p1), "kind": k1, "lid": int(lid1), "desc": (d1 if alone is None else alone).strip()}
        common = {"width": width, "speed": speed_name, "rate_gbps": ib.rate_gbps(width, speed_name), "observed_at": ts, "source": source}
        if k2 is None:
            row = {"a_node": a["node"], "a_port": a["port"], "a_kind": a["kind"], "a_lid": a["lid"], "a_desc": a["desc"],
                   "a_host": _host(a["kind"], a["desc"]), "connected": False, **common}
            links.setdefault((a["node"], a["port"]), row)  # type: ignore[arg-type]
            continue
        b = {"node": ib.guid(g2), "port": int(p2), "kind": k2, "lid": int(lid2), "desc": d2.strip()}
        if (b["kind"] == "CA" and a["kind"] != "CA") or (a["kind"] == b["kind"] and (b["node"], b["port"]) < (a["node"], a["port"])):
            a, b = b, a
        row = {**{f"a_{k}": v for k, v in a.items()}, **{f"b_{k}": v for k, v in b.items()},
               "a_host": _host(a["kind"], a["desc"]), "b_host": _host(b["kind"], b["desc"]), "connected": True, **common}  # type: ignore[arg-type]
        key = (a["node"], a["port"])
        seen = links.get(key)  # type: ignore[arg-type]
        if seen is None or not seen["connected"]:
            links[key] = row  # type: ignore[index]
        elif (seen["b_node"], seen["b_port"]) != (b["node"], b["port"]):
            conflicts += 1  # a port listed with two different peers (a capture stitched from two sweeps): the first stays
    if not links:
        raise ParseError("no port lines", source=source)
    # a port first seen unconnected but connected in another line is the connected one
    connected_ends = {(r["b_node"], r["b_port"]) for r in links.values() if r["connected"]}
    rows = [r for k, r in links.items() if r["connected"] or k not in connected_ends]
    df = pl.DataFrame(rows, schema_overrides={c.name: c.dtype for c in F.FABRIC_LINK.columns}, infer_schema_length=None)
    return F.Batch(source=source, fabric_link=F.conform(F.FABRIC_LINK, df),
                   meta={"links": sum(1 for r in rows if r["connected"]), "unconnected_ports": sum(1 for r in rows if not r["connected"]),
                         "conflicts": conflicts})


def _looks_like(view: SniffView) -> bool:
    return bool(_LINE.match(view.stripped.split("\n", 1)[0].strip()))


FORMATS = (
    FormatSpec("ibnetdiscover", "fabric topology from 'ibnetdiscover --ports' (switches, HCAs, links with width and speed)",
               lambda d, s, o: parse(d, ts=o.ts, source=s), sniff=Sniff(53, _looks_like), needs_ts=True),
)

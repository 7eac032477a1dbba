"""The node-to-InfiniBand-leaf map as Slurm node features carry it, from
``sinfo -ho "<RS>%c<US>%n<US>%f"``: records separated by 0x1E (ASCII record separator), fields by 0x1F
(unit separator): CPUs, node name, comma-separated features (``sinfo(1)`` ``--format``: ``%c``, ``%n``,
``%f``). Sites encode placement in features; at OSC a record reads
``28␟o0001␟c6320,cpu,eth-owens-rack02h1,ib-i1l1s01,ib-i1,1,1-c01``.

Features are matched by prefix, not position (their number varies by node class): ``ib-i<N>l<N>s<N>`` is
the IB leaf switch, ``ib-i<N>`` the island (spine group). A node without a leaf feature has no row.

Pure: bytes in, a ``Batch`` with placement rows in ``fabric_link`` (a_kind ``host``, b the leaf switch).
"""

from __future__ import annotations

import datetime as dt
import re

import polars as pl

from fleetscope.core import frames as F
from fleetscope.core.errors import ParseError
from ingest.format import FormatSpec, Sniff, SniffView

MAX_INPUT_BYTES = 64 * 2**20
MAX_RECORD_BYTES = 8192
RS, US = "\x1e", "\x1f"
_LEAF = re.compile(r"^ib-i\d+l\d+s\d+$")
_ISLAND = re.compile(r"^ib-i\d+$")
_NODE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,252}$")


def parse(data: bytes, *, ts: dt.datetime | None = None, source: str = "sinfo") -> F.Batch:
    """One placement row per node that carries an IB leaf feature."""
    if not isinstance(data, (bytes, bytearray)):
        raise TypeError("data must be bytes")
    if len(data) > MAX_INPUT_BYTES:
        raise ParseError(f"input of {len(data)} bytes exceeds {MAX_INPUT_BYTES}", source=source)
    if b"\x00" in data:
        raise ParseError("binary data (NUL byte)", source=source)
    try:
        text = bytes(data).decode("utf-8")
    except UnicodeDecodeError:
        raise ParseError("input is not UTF-8 text", source=source) from None
    if RS not in text:
        raise ParseError("no 0x1E record separator: expected sinfo -ho '<RS>%c<US>%n<US>%f'", source=source)
    rows: dict[str, dict[str, object]] = {}
    without = 0
    for i, rec in enumerate(text.split(RS)[1:], start=1):
        rec = rec.strip("\r\n")
        if len(rec) > MAX_RECORD_BYTES:
            raise ParseError(f"record longer than {MAX_RECORD_BYTES} bytes", source=source, line=i)
        fields = rec.split(US)
        if len(fields) != 3:
            raise ParseError(f"record has {len(fields)} fields, expected 3 (cpus, node, features)", source=source, line=i)
        cpus, node, features = (f.strip() for f in fields)
        if not cpus.isdigit():
            raise ParseError(f"cpus {cpus[:20]!r} is not a number", source=source, line=i, field="cpus")
        if not _NODE.match(node):
            raise ParseError(f"{node[:40]!r} is not a node name", source=source, line=i, field="node")
        feats = [f.strip() for f in features.split(",")]
        leaves = [f for f in feats if _LEAF.match(f)]
        islands = [f for f in feats if _ISLAND.match(f)]
        if len(leaves) > 1:
            raise ParseError(f"node {node} carries two IB leaf features ({', '.join(leaves[:2])})", source=source, line=i, field="features")
        if not leaves:
            without += 1
            continue
        rows[node] = {"a_node": node, "a_port": 0, "a_kind": "host", "a_host": node, "a_desc": node, "b_node": leaves[0], "b_kind": "SW",
                      "b_desc": leaves[0], "island": islands[0] if islands else None, "connected": True, "observed_at": ts, "source": source}
    if not rows:
        raise ParseError("no node carries an IB leaf feature (ib-i<N>l<N>s<N>)", source=source)
    df = pl.DataFrame(list(rows.values()), schema_overrides={c.name: c.dtype for c in F.FABRIC_LINK.columns}, infer_schema_length=None)
    return F.Batch(source=source, fabric_link=F.conform(F.FABRIC_LINK, df), meta={"nodes": len(rows), "without_leaf": without})


def _looks_like(view: SniffView) -> bool:
    t = view.text[:4096]
    return t.startswith(RS) and US in t and "ib-" in t


FORMATS = (
    FormatSpec("slurm_ib_features", "node-to-IB-leaf map from Slurm node features (sinfo -ho '<RS>%c<US>%n<US>%f')",
               lambda d, s, o: parse(d, ts=o.ts, source=s), sniff=Sniff(55, _looks_like), needs_ts=True),
)

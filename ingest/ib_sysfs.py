"""InfiniBand / RoCE port counters from the Linux sysfs tree ``/sys/class/infiniband``.

The tree (Linux ``Documentation/ABI/stable/sysfs-class-infiniband``): ``<device>/node_guid``,
``<device>/ports/<n>/{rate,state,phys_state,link_layer,lid}``, ``ports/<n>/counters/*`` (the IBTA
PortCounters; ``port_{xmit,rcv}_data`` in 4-octet words), ``ports/<n>/counters_ext/*_64`` (64-bit
PortCountersExtended on mlx4) and ``ports/<n>/hw_counters/*`` (mlx5 RDMA counters such as
``roce_adp_retrans``, ``out_of_buffer``, ``local_ack_timeout_err``). A counter that reads ``N/A (no PMA)``
(a device without a performance management agent) is unknown, not zero.

Two readers share one mapping (``ingest.infiniband``): ``from_files`` takes the files as a mapping of
path (relative to ``class/infiniband``) to text, which the node agent fills from the real directory
(``fleetscope.agent.read_infiniband``), and ``parse_ttar`` reads the same tree from a ``ttar`` archive,
the plain-text format node_exporter and procfs keep their sysfs fixtures in (``Path:`` / ``Lines:`` /
content / ``Mode:`` blocks; a last line ending in ``EOF`` had no newline).

Pure: text in, a ``Batch`` with ``fabric_port_sample`` rows out; the time and host come from the caller.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Mapping

import polars as pl

from fleetscope.core import frames as F
from fleetscope.core.errors import ParseError
from fleetscope.core.textinput import input_lines
from ingest import infiniband as ib
from ingest.format import FormatSpec, Sniff, SniffView

MAX_INPUT_BYTES = 64 * 2**20
MAX_LINE_BYTES = 4096
MAX_FILE_LINES = 64  # every attribute we read is one line; more is not a sysfs attribute
MAX_DEVICES = 64
MAX_PORTS = 255  # a switch's port numbers are 8 bits

_DEVICE = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")
_NA = "N/A"


def _ts(ts: dt.datetime | None, source: str) -> dt.datetime:
    if ts is None:
        raise ParseError("sysfs counters carry no time of their own: pass ts", source=source)
    if ts.tzinfo is None:
        raise ParseError("ts must be timezone-aware", source=source)
    return ts.astimezone(dt.UTC)


def from_files(files: Mapping[str, str], *, ts: dt.datetime | None, host: str | None = None, source: str = "sysfs",
               lines: Mapping[str, int] | None = None) -> F.Batch:
    """One ``fabric_port_sample`` row per device port found in ``files`` (path relative to
    ``class/infiniband`` -> its text). ``lines`` maps a path to where it sits in its input, for errors.
    Files the mapping does not know are skipped; a value that is not what its file must hold is an error
    naming the file."""
    when = _ts(ts, source)
    rows: dict[tuple[str, int], dict[str, object]] = {}
    guids: dict[str, str] = {}

    def fail(path: str, msg: str) -> ParseError:
        return ParseError(msg, source=source, line=(lines or {}).get(path), field=path)

    for path in sorted(files):
        text = files[path]
        parts = path.strip("/").split("/")
        dev = parts[0]
        if not _DEVICE.match(dev) or any(part in ("", ".", "..") for part in parts):
            raise fail(path, "not an InfiniBand device name")
        value = text.strip()
        if len(value) > ib.MAX_TEXT:
            raise fail(path, f"value longer than {ib.MAX_TEXT} characters")
        if len(parts) == 2 and parts[1] == "node_guid":
            try:
                guids[dev] = ib.guid(value)
            except ValueError as exc:
                raise fail(path, str(exc)) from None
            continue
        if len(parts) < 4 or parts[1] != "ports":
            continue
        if not parts[2].isdigit() or not 0 < int(parts[2]) <= MAX_PORTS:
            raise fail(path, f"port number must be 1..{MAX_PORTS}")
        key = (dev, int(parts[2]))
        if key not in rows and len({d for d, _ in rows} | {dev}) > MAX_DEVICES:
            raise fail(path, f"more than {MAX_DEVICES} devices")
        row = rows.setdefault(key, {})
        try:
            if len(parts) == 4:
                attr = parts[3]
                if attr == "rate":
                    if value:
                        row["rate_gbps"], row["width"], row["speed"] = ib.parse_rate(value)
                elif attr == "state":
                    row["state"] = ib.parse_state(value, ib.PORT_STATES)
                elif attr == "phys_state":
                    row["phys_state"] = ib.parse_state(value, ib.PHYS_STATES)
                elif attr == "link_layer":
                    if value not in ("InfiniBand", "Ethernet"):
                        raise ValueError(f"link layer must be InfiniBand or Ethernet, not {value[:40]!r}")
                    row["link_layer"] = value
                elif attr == "lid":
                    row["lid"] = int(value, 16) if value.lower().startswith("0x") else int(value)
            elif len(parts) == 5:
                group, name = parts[3], parts[4]
                if value.startswith(_NA):
                    continue
                if (group == "counters" and name in ib.SYSFS_COUNTERS) or (group == "counters_ext" and name in ib.SYSFS_COUNTERS_EXT):
                    col, mult = (ib.SYSFS_COUNTERS if group == "counters" else ib.SYSFS_COUNTERS_EXT)[name]
                    row[col] = ib.merge_counter(row.get(col), ib.counter(value) * mult)  # type: ignore[arg-type]
                elif group == "hw_counters" and name in ib.HW_COUNTERS:
                    row[f"{name}_total"] = ib.counter(value)
        except ValueError as exc:
            raise fail(path, str(exc)) from None
    out = []
    for (dev, port), row in rows.items():
        g = guids.get(dev)
        out.append({"ts": when, "node": host or g or dev, "device": dev, "port": port, "host": host, "node_guid": g,
                    **{k: v for k, v in row.items() if v is not None}, "source": source})
    for r in out:
        for col in ("xmit_bytes_total", "rcv_bytes_total") + tuple(c for c, _ in ib.SYSFS_COUNTERS.values()):
            v = r.get(col)
            if isinstance(v, int) and v >= 2**63:
                raise ParseError("counter beyond 2^63 cannot be stored", source=source, field=f"{r['device']}/ports/{r['port']}/{col}")
    if not out:
        return F.Batch(source=source, meta={"fabric_ports": 0})
    df = pl.DataFrame(out, schema_overrides={"ts": F.UTC_US, **{c.name: c.dtype for c in F.FABRIC_PORT_SAMPLE.columns if c.name != "ts"}},
                      infer_schema_length=None)
    return F.Batch(source=source, fabric_port_sample=F.conform(F.FABRIC_PORT_SAMPLE, df), meta={"fabric_ports": len(out)})


def ttar_files(data: bytes, *, source: str = "ttar") -> tuple[dict[str, str], dict[str, int]]:
    """The files of a ttar archive under any ``.../class/infiniband/``: path relative to it -> text, and
    the line each file's content starts on."""
    lines = input_lines(data, source, max_input_bytes=MAX_INPUT_BYTES, max_line_bytes=MAX_LINE_BYTES, strip=False)
    files: dict[str, str] = {}
    where: dict[str, int] = {}
    i = 0
    n = len(lines)
    while i < n:
        lineno, text = lines[i]
        text = text.rstrip("\r")
        if text.startswith("# ttar") or text.startswith("Mode:") or text.startswith("Directory:") or text.startswith("SymlinkTo:"):
            i += 1
            continue
        if not text.startswith("Path:"):
            raise ParseError("expected 'Path:', 'Directory:' or 'Mode:' (ttar archive)", source=source, line=lineno)
        path = text[5:].strip()
        if not path or ".." in path.split("/") or len(path) > 1024:
            raise ParseError("bad path in archive", source=source, line=lineno, field="Path")
        if i + 1 >= n or not lines[i + 1][1].startswith("Lines:"):
            raise ParseError("a 'Path:' must be followed by 'Lines: <count>'", source=source, line=lineno)
        count_text = lines[i + 1][1][6:].strip()
        if not count_text.isdigit() or int(count_text) > MAX_FILE_LINES:
            raise ParseError(f"line count must be 0..{MAX_FILE_LINES}", source=source, line=lines[i + 1][0], field="Lines")
        count = int(count_text)
        # blank lines inside a file were dropped by input_lines: take content by line number, not position
        first = lines[i + 1][0] + 1
        body: list[str] = []
        j = i + 2
        while j < n and lines[j][0] < first + count:
            body.append(lines[j][1])
            j += 1
        if count and j >= n and (not body or lines[j - 1][0] != first + count - 1):
            raise ParseError(f"archive ends inside {path!r} (truncated)", source=source, line=lines[-1][0])
        content = "\n".join(body)
        if content.endswith("EOF"):
            content = content[:-3]
        marker = "class/infiniband/"
        k = path.find(marker)
        if k >= 0 and path[k + len(marker):]:
            rel = path[k + len(marker):]
            files[rel] = content
            where[rel] = first
        i = j
    return files, where


def parse_ttar(data: bytes, *, ts: dt.datetime | None, host: str | None = None, source: str = "ttar") -> F.Batch:
    """Port samples from a ttar archive of a ``/sys/class/infiniband`` tree."""
    _ts(ts, source)
    files, where = ttar_files(data, source=source)
    if not files:
        raise ParseError("no files under class/infiniband/ in the archive", source=source)
    return from_files(files, ts=ts, host=host, source=source, lines=where)


def _looks_like(view: SniffView) -> bool:
    head = view.text[:65536]
    return ("class/infiniband" in head and ("\nPath: " in "\n" + head or head.startswith("Directory: "))
            and "\nLines: " in head)


FORMATS = (
    FormatSpec("ib_sysfs_ttar", "the /sys/class/infiniband tree as a ttar archive (node_exporter / procfs fixtures)",
               lambda d, s, o: parse_ttar(d, ts=o.ts, source=s), sniff=Sniff(24, _looks_like), needs_ts=True),
)

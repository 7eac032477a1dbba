"""nccl-tests output (``all_reduce_perf`` and friends) → ``nccl_test`` rows.

Two forms are read, both as nccl-tests writes them (NVIDIA/nccl-tests ``src/util.cu``):

* the text table on stdout, with or without Open MPI's ``[1,0]<stdout>:`` prefixes and with NCCL
  ``INFO`` lines interleaved when ``NCCL_DEBUG=INFO`` is set (those are counted, not rows);
* the JSON report written with ``-J <path>`` (``JSON_FILE_VERSION`` 2): ``config.devices``,
  ``results[]`` with ``size``, ``count``, ``type``, ``redop``, ``root`` and ``out_of_place`` /
  ``in_place`` objects holding ``time`` (or ``cpu_time``), ``alg_bw``, ``bus_bw``, ``nwrong``, then
  ``average_bus_bandwidth.bandwidth``.

One table line becomes two rows, out-of-place and in-place (``in_place`` is part of the key).
Units follow nccl-tests: time in µs (stored as seconds), bandwidth in GB/s = 1e9 bytes/s (stored
as ``*_gbps``, the same unit Fleetscope's ``collective`` frame uses).

``batch.meta``:

* ``avg_busbw_gbps`` — the "Avg bus bandwidth" nccl-tests printed. nccl-tests computes it as the
  arithmetic mean of the bus bandwidth of *every* measurement it printed, out-of-place and in-place
  alike (``args->bw[0] += busBw; args->bw_count[0]++`` in ``BenchTime``, then
  ``bw[0] /= bw_count[0]``), from unrounded values; ``busbw_mean_gbps`` is the same mean over the
  printed (rounded to 0.01) figures, so the two agree to within 0.005 GB/s.
* ``table_rows`` (printed lines × 2), ``duplicates_dropped``, ``skipped_lines`` (noise such as NCCL
  INFO lines), ``devices`` (the ``# Rank`` lines), ``out_of_bounds``, ``nccl_tests_header``.

``run_id`` is a stable hash of the run's *content*: the operation, the device lines and the result
table after prefixes and spacing are normalised, so the same run read from a prefixed mpirun log
and from a clean capture gets one id, and re-ingesting a file writes nothing new.

The operation name comes from the output itself (``# Collective test starting: all_reduce_perf``
in recent versions, ``args[0]`` in JSON), else from the caller's ``op``, else from the source
name (``..._all_reduce_perf_...``); without any of them the row has no key and ``ParseError``
says so.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from datetime import datetime, timezone
from typing import Any

import polars as pl

from fleetscope.core.errors import ParseError
from fleetscope.core.frames import NCCL_TEST, Batch
from ingest.format import FormatSpec, Sniff, SniffView

MAX_LINE_BYTES = 1 << 20  # no legitimate nccl-tests line is near this; bigger means garbage
MAX_INPUT_BYTES = 256 << 20

# Open MPI --tag-output prefix: "[jobid,rank]<stdout>:".
_MPI_PREFIX = re.compile(r"^\[\d+,\d+\]<(?:stdout|stderr)>:")
_RANK_LINE = re.compile(
    r"^#\s*Rank\s+(?P<rank>\d+)\s+Group\s+(?P<group>\d+)\s+Pid\s+(?P<pid>\d+)\s+on\s+(?P<host>\S+)"
    r"\s+device\s+(?P<device>\d+)\s+\[(?P<bus>[^\]]*)\]\s*(?P<name>.*?)\s*$"
)
_AVG_LINE = re.compile(r"^#\s*Avg bus bandwidth\s*:\s*(?P<v>\S+)")
_OOB_LINE = re.compile(r"^#\s*Out of bounds values\s*:\s*(?P<n>\d+)\s*(?P<status>\S*)")
_START_LINE = re.compile(r"^#\s*Collective test starting:\s*(?P<prog>\S+)")
_DATA_LINE = re.compile(r"^\s*\d+\s+\d+\s+\S+")
# The known nccl-tests binaries, longest first so reduce_scatter wins over reduce/scatter.
_OP_IN_NAME = re.compile(
    r"(?<![a-z])(all_gather|all_reduce|alltoallv|alltoall|broadcast|reduce_scatter|reduce|sendrecv"
    r"|scatter|gather|hypercube)_perf"
)
_TIME_COLS = ("time", "cputime")
_WRONG_COLS = ("#wrong", "error")
# Header of nccl-tests >= 2.x without per-iteration columns; used when an excerpt lost its header.
_DEFAULT_HEADER = ["size", "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong",
                   "time", "algbw", "busbw", "#wrong"]


def parse(
    data: bytes,
    *,
    source: str = "",
    op: str | None = None,
    ts: datetime | None = None,
) -> Batch:
    """Parse nccl-tests text or ``-J`` JSON output into a Batch with an ``nccl_test`` frame.

    ``op`` names the benchmark (``all_reduce``) when the output does not; ``ts`` (timezone-aware)
    stamps the rows, since nccl-tests prints local wall-clock times without a zone.
    """
    text = _decode(data, source)
    ts_utc = _utc(ts)
    if text.lstrip().startswith("{"):
        return _parse_json(text, source=source, op=op, ts=ts_utc)
    return _parse_text(text, source=source, op=op, ts=ts_utc)


# --- text ------------------------------------------------------------------------------------


def _parse_text(text: str, *, source: str, op: str | None, ts: datetime | None) -> Batch:
    header: list[str] | None = None
    program: str | None = None
    devices: list[dict[str, Any]] = []
    canon: list[str] = []  # normalised content for run_id
    rows: list[dict[str, Any]] = []
    meta: dict[str, Any] = {"skipped_lines": 0}
    avg: float | None = None

    for lineno, raw in enumerate(text.split("\n"), start=1):
        line = _MPI_PREFIX.sub("", raw.rstrip("\r"), count=1)
        stripped = line.strip()
        if not stripped:
            continue
        if stripped.startswith("#"):
            if m := _START_LINE.match(stripped):
                program = m.group("prog")
            elif m := _RANK_LINE.match(stripped):
                devices.append(
                    {"rank": int(m.group("rank")), "group": int(m.group("group")), "pid": int(m.group("pid")),
                     "host": m.group("host"), "device": int(m.group("device")), "bus_id": m.group("bus"),
                     "device_name": m.group("name")}
                )
                canon.append("dev " + " ".join(stripped.split()))
            elif m := _AVG_LINE.match(stripped):
                avg = _num(m.group("v"), source=source, line=lineno, field="avg_busbw")
            elif m := _OOB_LINE.match(stripped):
                meta["out_of_bounds"] = {"count": int(m.group("n")), "status": m.group("status") or None}
            elif stripped.startswith("# nThread"):
                meta["nccl_tests_header"] = stripped[1:].strip()
            else:
                names = stripped[1:].split()
                if "size" in names and "count" in names and "type" in names:
                    header = names
            continue
        if not _DATA_LINE.match(stripped):
            meta["skipped_lines"] += 1  # NCCL INFO lines, ssh warnings, "..." of excerpts
            continue
        cols = header or _DEFAULT_HEADER
        rows.extend(_table_line(stripped, cols, source=source, line=lineno))
        canon.append("row " + " ".join(stripped.split()))

    if not rows:
        raise ParseError("no nccl-tests result rows found", source=source)
    op_name = _op_name(program, op, source)
    if avg is not None:
        meta["avg_busbw_gbps"] = avg
    devices.sort(key=lambda d: d["rank"])
    return _finish(rows, devices=devices, op=op_name, ts=ts, meta=meta, canon=canon, source=source)


def _table_line(text: str, names: list[str], *, source: str, line: int) -> list[dict[str, Any]]:
    """One result line → its out-of-place and in-place measurements (``util.cu`` column order)."""
    leading, groups, has_ts = _groups(names)
    toks = text.split()
    # strftime "%Y-%m-%d %H:%M:%S" is two tokens; trace-replay lines leave out-of-place blank.
    if has_ts and len(toks) >= 2 and re.fullmatch(r"\d{4}-\d{2}-\d{2}", toks[-2] or ""):
        toks = toks[:-2]
    width = len(leading) + sum(len(g) for g in groups)
    if len(toks) == width:
        placed = list(zip(("out_of_place", "in_place"), groups))
    elif groups and len(toks) == width - len(groups[0]):
        placed = [("in_place", groups[-1])]
    else:
        raise ParseError(
            f"result line has {len(toks)} columns, the header announces {width}", source=source, line=line,
            field="columns",
        )
    lead = dict(zip(leading, toks[: len(leading)]))
    base = {
        "size_bytes": _int(lead.get("size"), source=source, line=line, field="size"),
        "count": _int(lead.get("count"), source=source, line=line, field="count"),
        "dtype": lead.get("type"),
        "redop": lead.get("redop"),
        "root": _int(lead.get("root"), source=source, line=line, field="root", minimum=-1)
        if "root" in lead else None,
    }
    out = []
    pos = len(leading)
    for placement, group in placed:
        vals = dict(zip(group, toks[pos: pos + len(group)]))
        pos += len(group)
        time_us = _num(vals.get("time", vals.get("cputime")), source=source, line=line, field="time")
        out.append({
            **base,
            "in_place": placement == "in_place",
            "time_s": time_us / 1e6,
            "algbw_gbps": _num(vals.get("algbw"), source=source, line=line, field="algbw"),
            "busbw_gbps": _num(vals.get("busbw"), source=source, line=line, field="busbw"),
            "wrong": _wrong(next((vals[c] for c in _WRONG_COLS if c in vals), None), source=source, line=line),
        })
    return out


def _groups(names: list[str]) -> tuple[list[str], list[list[str]], bool]:
    """Split header names into leading columns, the per-placement groups, and a timestamp flag."""
    has_ts = bool(names) and names[-1] == "timestamp"
    body = names[:-1] if has_ts else names
    starts = [i for i, n in enumerate(body) if n in _TIME_COLS]
    if not starts:
        return body, [], has_ts
    leading = body[: starts[0]]
    groups = [body[s: (starts[k + 1] if k + 1 < len(starts) else len(body))] for k, s in enumerate(starts)]
    return leading, groups[:2], has_ts


# --- JSON (-J) -------------------------------------------------------------------------------


def _parse_json(text: str, *, source: str, op: str | None, ts: datetime | None) -> Batch:
    try:
        doc = json.loads(text, parse_constant=_reject_constant)
    except json.JSONDecodeError as e:
        raise ParseError(f"malformed JSON: {e.msg}", source=source, line=e.lineno) from None
    except ValueError as e:  # NaN/Infinity literals, integers too long to convert
        raise ParseError(f"malformed JSON: {e}", source=source) from None
    if not isinstance(doc, dict):
        raise ParseError("nccl-tests JSON report must be an object", source=source)
    results = doc.get("results")
    if not isinstance(results, list):
        raise ParseError("nccl-tests JSON report has no results list", source=source, field="results")
    config = doc.get("config") if isinstance(doc.get("config"), dict) else {}
    devices = []
    for i, d in enumerate(config.get("devices") or []):
        if not isinstance(d, dict):
            raise ParseError("device entry must be an object", source=source, field=f"config.devices[{i}]")
        devices.append({
            "rank": _int(d.get("rank"), source=source, line=None, field=f"config.devices[{i}].rank"),
            "group": d.get("group"), "pid": d.get("pid"),
            "host": _str(d.get("hostname"), source, f"config.devices[{i}].hostname"),
            "device": d.get("device"), "bus_id": d.get("device_hex"), "device_name": d.get("device_info"),
        })
    rows: list[dict[str, Any]] = []
    canon: list[str] = ["dev " + json.dumps(d, sort_keys=True) for d in devices]
    for i, r in enumerate(results):
        f = f"results[{i}]"
        if not isinstance(r, dict):
            raise ParseError("result must be an object", source=source, field=f)
        base = {
            "size_bytes": _int(r.get("size"), source=source, line=None, field=f + ".size"),
            "count": _int(r.get("count"), source=source, line=None, field=f + ".count"),
            "dtype": _str(r.get("type"), source, f + ".type"),
            "redop": _str(r.get("redop"), source, f + ".redop"),
            # util.cu writes root as the printed, space-padded string ("    -1")
            "root": _int(r.get("root"), source=source, line=None, field=f + ".root", minimum=-1),
        }
        for placement in ("out_of_place", "in_place"):
            m = r.get(placement)
            if m is None:
                continue  # trace replay writes out_of_place: null
            pf = f"{f}.{placement}"
            if not isinstance(m, dict):
                raise ParseError("measurement must be an object", source=source, field=pf)
            time_us = m.get("time", m.get("cpu_time"))
            rows.append({
                **base,
                "in_place": placement == "in_place",
                "time_s": _num(time_us, source=source, line=None, field=pf + ".time") / 1e6,
                "algbw_gbps": _num(m.get("alg_bw"), source=source, line=None, field=pf + ".alg_bw"),
                "busbw_gbps": _num(m.get("bus_bw"), source=source, line=None, field=pf + ".bus_bw"),
                "wrong": _wrong(m.get("nwrong"), source=source, line=None, field=pf + ".nwrong"),
            })
        canon.append("row " + json.dumps(r, sort_keys=True))
    if not rows:
        raise ParseError("nccl-tests JSON report has no measurements", source=source, field="results")
    args = doc.get("args")
    program = args[0] if isinstance(args, list) and args and isinstance(args[0], str) else None
    meta: dict[str, Any] = {"skipped_lines": 0}
    abw = doc.get("average_bus_bandwidth")
    if isinstance(abw, dict) and "bandwidth" in abw:
        meta["avg_busbw_gbps"] = _num(abw["bandwidth"], source=source, line=None,
                                      field="average_bus_bandwidth.bandwidth")
    if isinstance(doc.get("out_of_bounds"), dict):
        meta["out_of_bounds"] = doc["out_of_bounds"]
    for k in ("nccl_version", "start_time", "end_time", "version"):
        if k in doc:
            meta["json_" + k] = doc[k]
    return _finish(rows, devices=devices, op=_op_name(program, op, source), ts=ts, meta=meta, canon=canon,
                   source=source)


def _reject_constant(name: str) -> float:
    raise ValueError(f"non-finite number {name} is not JSON")


# --- shared ----------------------------------------------------------------------------------


def _finish(rows: list[dict[str, Any]], *, devices: list[dict[str, Any]], op: str, ts: datetime | None,
            meta: dict[str, Any], canon: list[str], source: str) -> Batch:
    run_id = hashlib.sha256(("op " + op + "\n" + "\n".join(canon)).encode()).hexdigest()[:32]
    hosts: list[str] = []
    for d in devices:
        if d["host"] and d["host"] not in hosts:
            hosts.append(d["host"])
    nranks = len({d["rank"] for d in devices}) or None
    busbw = [r["busbw_gbps"] for r in rows]
    meta["table_rows"] = len(rows)
    meta["busbw_mean_gbps"] = sum(busbw) / len(busbw)
    meta["devices"] = devices
    seen: set[tuple[int, bool]] = set()
    kept = []
    for r in rows:
        k = (r["size_bytes"], r["in_place"])
        if k in seen:
            continue  # e.g. minBytes=1 prints two size-0 lines; the natural key keeps the first
        seen.add(k)
        kept.append(r)
    meta["duplicates_dropped"] = len(rows) - len(kept)
    df = pl.DataFrame(
        [{**r, "run_id": run_id, "op": op, "ts": ts, "nranks": nranks, "hosts": ",".join(hosts) or None}
         for r in kept],
        schema=NCCL_TEST.schema,
    )
    return Batch(source=source, nccl_test=df, meta=meta)


def _op_name(program: str | None, op: str | None, source: str) -> str:
    for candidate in (program, op, source):
        if not candidate:
            continue
        base = re.split(r"[\\/]", candidate)[-1]
        if m := _OP_IN_NAME.search(base):
            return m.group(1)
        if candidate is op:
            if not re.fullmatch(r"[a-z][a-z0-9_]{0,63}", op):
                raise ParseError(f"op {op!r} is not an nccl-tests operation name", source=source, field="op")
            return op
        if candidate is program and base.endswith("_perf") and len(base) > 5:
            return base[:-5]
    raise ParseError(
        "cannot tell which collective was measured: no '# Collective test starting' line, no op= "
        "argument and no <op>_perf in the source name", source=source, field="op",
    )


def _decode(data: bytes, source: str) -> str:
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise TypeError(f"data must be bytes, not {type(data).__name__}")
    data = bytes(data)
    if len(data) > MAX_INPUT_BYTES:
        raise ParseError(f"input of {len(data)} bytes exceeds {MAX_INPUT_BYTES}", source=source)
    if not data.strip():
        raise ParseError("empty input", source=source)
    if (nul := data.find(b"\x00")) >= 0:
        raise ParseError("binary data (NUL byte) in text output", source=source, line=data.count(b"\n", 0, nul) + 1)
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise ParseError("input is not UTF-8 text", source=source, line=data.count(b"\n", 0, e.start) + 1) from None
    for lineno, chunk in enumerate(data.split(b"\n"), start=1):
        if len(chunk) > MAX_LINE_BYTES:
            raise ParseError(f"line longer than {MAX_LINE_BYTES} bytes", source=source, line=lineno)
    return text


def _num(v: Any, *, source: str, line: int | None, field: str) -> float:
    if isinstance(v, bool) or v is None:
        raise ParseError(f"expected a number, got {v!r}", source=source, line=line, field=field)
    try:
        x = float(v)
    except OverflowError:
        x = math.inf
    except (TypeError, ValueError):
        raise ParseError(f"expected a number, got {str(v)[:40]!r}", source=source, line=line, field=field) from None
    if not math.isfinite(x):
        raise ParseError(f"non-finite value {v!r}", source=source, line=line, field=field)
    if x < 0:
        raise ParseError(f"negative value {x}", source=source, line=line, field=field)
    return x


def _int(v: Any, *, source: str, line: int | None, field: str, minimum: int = 0) -> int:
    if isinstance(v, str) and re.fullmatch(r"\s*-?\d{1,19}\s*", v):
        x = int(v)
    elif isinstance(v, int) and not isinstance(v, bool):
        x = v
    else:
        raise ParseError(f"expected an integer, got {str(v)[:40]!r}", source=source, line=line, field=field)
    if x < minimum:
        raise ParseError(f"value {x} is below {minimum}", source=source, line=line, field=field)
    if x > 2**63 - 1:
        raise ParseError(f"value {x} does not fit in 64 bits", source=source, line=line, field=field)
    return x


def _wrong(v: Any, *, source: str, line: int | None, field: str = "#wrong") -> int | None:
    """``#wrong``: an element count, "N/A" when validation is off (``-c 0``), null in JSON."""
    if v is None or v == "N/A":
        return None
    if isinstance(v, str):
        v = v.rstrip("*")  # older versions flag a failed check with a trailing '*'
    x = _num(v, source=source, line=line, field=field)
    if x != int(x) or x > 2**63 - 1:
        raise ParseError(f"wrong-element count {x} is not an integer", source=source, line=line, field=field)
    return int(x)


def _str(v: Any, source: str, field: str) -> str:
    if not isinstance(v, str) or len(v) > 256:
        raise ParseError(f"expected a short string, got {str(v)[:40]!r}", source=source, field=field)
    return v


def _utc(ts: datetime | None) -> datetime | None:
    if ts is None:
        return None
    if ts.tzinfo is None:
        raise ValueError("ts must be timezone-aware")
    return ts.astimezone(timezone.utc)


# --- declaration (ingest.format) ---------------------------------------------------------------------

# The result table's header row, and the closing average, as nccl-tests prints them (possibly behind an
# mpirun "[1,0]<stdout>:" tag). Prose that merely mentions them does not match.
_SNIFF_HEADER = re.compile(r"^\S*#\s+size\s+count\s+type\b.*#wrong", re.MULTILINE)
_SNIFF_AVG = re.compile(r"^\S*#\s*Avg bus bandwidth\s*:\s*[0-9.]+", re.MULTILINE)


def _looks_like_json(view: SniffView) -> bool:
    text = view.text
    return view.is_json and '"results"' in text and ('"busbw"' in text or '"bus_bw"' in text or '"algbw"' in text or '"alg_bw"' in text)


def _looks_like_table(view: SniffView) -> bool:
    return bool(_SNIFF_HEADER.search(view.text) or _SNIFF_AVG.search(view.text))


FORMATS = (
    # The -J JSON output is told among the JSON formats; the text table may share its file with the NCCL
    # debug log (NCCL_DEBUG=INFO), so it combines, after the log.
    FormatSpec("nccl_tests", "nccl-tests output (text table or -J JSON)",
               lambda d, s, o: parse(d, source=s, op=o.op, ts=o.ts),
               sniff=(Sniff(14, _looks_like_json), Sniff(51, _looks_like_table, combines=True))),
)

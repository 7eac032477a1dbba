"""NCCL debug logs (``NCCL_DEBUG=INFO``) → communicators, topology, collectives and warnings.

Line shape, from NCCL's ``ncclDebugLog`` (``src/debug.cc``)::

    [<timestamp>] <hostname>:<pid>:<tid> [<cudaDev>] NCCL INFO <message>
    [<timestamp>] <hostname>:<pid>:<tid> [<cudaDev>] <file>:<line> NCCL WARN <message>

The timestamp is optional (``NCCL_DEBUG_TIMESTAMP_LEVELS``; on for WARN by default in recent
releases, format ``NCCL_DEBUG_TIMESTAMP_FORMAT``, default ``[%F %T] ``, local time). Launchers add
their own prefixes, all accepted and stripped: Open MPI's ``[1,0]<stdout>:`` tag, an RFC 3339 /
ISO 8601 timestamp at the start of the line (``ts``, log shippers, ``kubectl logs --timestamps``)
and Slurm's ``srun -l`` ``0: `` label. Every other line (application output, nccl-tests tables,
ssh warnings) is counted in ``meta["skipped_lines"]``: a real log is mixed, so noise is not an error.

What is read:

* ``comm 0x.. rank R nranks N cudaDev D [nvmlDev V] busId B [commId 0x..] - Init COMPLETE``
  (INIT subsystem; the ``commId`` field exists from NCCL 2.19) → ``meta["communicators"]``: one
  dict per (host, pid, comm pointer) with rank, nranks, cuda_dev, nvml_dev, bus_id, comm_id,
  destroyed. ``meta["job_ranks"]`` lists rank → host / cudaDev / busId of the largest communicator
  (the world), the shape of a ``job_rank`` row minus the GPU UUID and start time a log cannot give.
* ``Channel 00/02 :    0   1`` (ring order), ``Trees [0] 1/-1/-1->0->-1 ...`` (three children, rank,
  parent) and ``Channel 00/0 : 0[35000] -> 1[f5000] [send] via NET/AWS Libfabric/0`` (transport per
  channel and peer) → ``meta["topology"]``, one entry per communicator. NCCL prints them from the
  thread that initialises the communicator, so lines of one ``host:pid:tid`` are attached to the
  next ``Init COMPLETE`` of that thread.
* ``<Op>: opCount <hex> sendbuff .. recvbuff .. count N datatype T op O root R comm 0x.. [nranks=N]
  stream ..`` (COLL subsystem, ``enqueue.cc``) → ``collective`` rows: ``seq`` = opCount (printed in
  hex, ``%lx``), ``bytes`` = count × size of the ``ncclDataType_t`` (``nccl.h``), ``rank`` and
  ``comm_id`` from the communicator's Init line. ``start`` is the line's timestamp (the host-side
  enqueue time) when it has one. A call on a communicator whose Init line is not in the log has no
  rank and is counted in ``meta["collectives_unknown_comm"]``.
* ``NCCL WARN`` → ``health_event`` rows, kind ``nccl_warn``, ``message`` the text, ``source``
  ``nccl <file>:<line>``. ``code`` is a CRC-32 of site and message: two different warnings in the
  same second stay two rows, a re-sent line stays one. A warning needs a time: the line's own
  timestamp, else the caller's ``default_ts``; without either it is listed in ``meta["warnings"]``
  and counted in ``meta["warnings_without_ts"]`` but makes no row.

* PyTorch's ``ProcessGroupNCCL`` watchdog, whose lines land in the same logs: ``[Rank R] Watchdog caught
  collective operation timeout: WorkNCCL(SeqNum=S, OpType=OP, ..., Timeout(ms)=T) ran for M milliseconds
  before timing out`` → ``health_event`` rows, kind ``nccl_watchdog_timeout``, ``code`` the rank, ``value``
  the seconds it ran, ``message`` naming the job, operation and sequence number: the collective a hung job
  was stuck in. The host is the log's, when its NCCL lines name a single one. A timeout needs a time, like a
  warning (``meta["watchdog_without_ts"]``).

``comm_id``: the ``commId`` NCCL prints (shared by all ranks of a communicator) when present; older
NCCL prints only the process-local ``comm`` pointer, so the id is then ``<host>:<pid>:<pointer>``
— unique, but not joinable across ranks. ``job_id``: the caller's, else ``"unknown"``
(``meta["job_id_source"]``). Timestamps without a zone are read in ``tz`` (default UTC).
"""

from __future__ import annotations

import re
import zlib
from datetime import datetime, timezone, tzinfo
from typing import Any

import polars as pl

from fleetscope.core.errors import ParseError
from fleetscope.core.textinput import input_lines
from fleetscope.core.frames import COLLECTIVE, HEALTH_EVENT, Batch
from ingest.format import FormatSpec, Sniff, Splitting, cut_line

MAX_LINE_BYTES = 1 << 16  # NCCL formats into a 1024-byte buffer; launcher prefixes add little
MAX_INPUT_BYTES = 1 << 30
_I64_MAX = 2**63 - 1

# ncclDataType_t values and element sizes (nccl.h): Int8/Char, Uint8, Int32/Int, Uint32, Int64,
# Uint64, Float16/Half, Float32/Float, Float64/Double, Bfloat16 (2.10), Float8e4m3/e5m2 (2.24).
_DTYPES: dict[int, tuple[str, int]] = {
    0: ("int8", 1), 1: ("uint8", 1), 2: ("int32", 4), 3: ("uint32", 4), 4: ("int64", 8), 5: ("uint64", 8),
    6: ("float16", 2), 7: ("float32", 4), 8: ("float64", 8), 9: ("bfloat16", 2), 10: ("float8e4m3", 1),
    11: ("float8e5m2", 1),
}

_ISO_TS = re.compile(r"^(\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(?:[.,]\d{1,9})?(?:Z|[+-]\d{2}:?\d{2})?)\s+")
_NCCL_TS = re.compile(r"^\[(\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}:\d{2}(?:[.,]\d{1,9})?)\]\s*")
_MPI_TAG = re.compile(r"^\[\d+,\d+\]<(?:stdout|stderr|stddiag)>:")
_SRUN_LABEL = re.compile(r"^\d{1,6}: ")
_PREFIX = re.compile(r"^(?P<host>[^\s:\[\]]+):(?P<pid>\d{1,10}):(?P<tid>\d{1,10}) \[(?P<dev>-?\d{1,6})\] (?P<rest>.*)$")
_VERSION = re.compile(r"^NCCL version (\S+)")
_INFO = re.compile(r"^NCCL INFO (?P<msg>.*)$")
_WARN = re.compile(r"^(?P<site>\S+:\d+) NCCL WARN (?P<msg>.*)$")
_WATCHDOG = re.compile(r"\[Rank (?P<rank>\d{1,9})\] Watchdog caught collective operation timeout: WorkNCCL\((?P<work>.{0,2000}?)\) "
                       r"ran for (?P<ran_ms>\d{1,15}) milliseconds before timing out")
_WORK_KV = re.compile(r"(SeqNum|OpType|Timeout\(ms\))=([^,\s)]+)")
_COMM_EVENT = re.compile(r"\bcomm (?P<ptr>0x[0-9a-fA-F]+) .*- (?P<what>Init|Destroy|Abort) COMPLETE\b")
_KV = re.compile(r"\b(rank|nranks|nRanks|cudaDev|nvmlDev|busId|commId)\s+(\S+)")
_RING = re.compile(r"^(?:Channel|Ring) (?P<ch>\d+)(?:/(?P<n>\d+))? :(?P<ranks>(?:\s+\d+)+)\s*$")
_TREES = re.compile(r"^Trees((?:\s*\[\d+\]\s*-?\d+/-?\d+/-?\d+->-?\d+->-?\d+)+)\s*$")
_TREE = re.compile(r"\[(\d+)\]\s*(-?\d+)/(-?\d+)/(-?\d+)->(-?\d+)->(-?\d+)")
_CONN = re.compile(
    r"^(?:Channel|Ring) (?P<ch>\d+)(?:/\d+)? : (?P<src>\d+)\[(?P<srcbus>[0-9a-fA-Fx]+)\] -> "
    r"(?P<dst>\d+)\[(?P<dstbus>[0-9a-fA-Fx]+)\](?: \[(?P<dir>send|receive)\])? via (?P<via>.+?)\s*$"
)
_COLL_START = re.compile(r"^\w+: opCount ")
_COLL = re.compile(
    r"^(?P<op>\w+): opCount (?P<opcount>[0-9a-fA-F]{1,16}) sendbuff (?P<send>\S+) recvbuff (?P<recv>\S+) "
    r"count (?P<count>\d{1,20}) datatype (?P<dtype>\d{1,3}) op (?P<redop>\d{1,3}) root (?P<root>-?\d{1,10}) "
    r"comm (?P<comm>0x[0-9a-fA-F]+|\(nil\)) \[nranks=(?P<nranks>\d{1,10})\] stream (?P<stream>\S+)"
)


def parse(
    data: bytes,
    *,
    source: str = "",
    job_id: str | None = None,
    tz: tzinfo = timezone.utc,
    default_ts: datetime | None = None,
) -> Batch:
    """Parse an NCCL debug log into a Batch (``collective``, ``health_event``, ``meta``)."""
    if default_ts is not None:
        if default_ts.tzinfo is None:
            raise ValueError("default_ts must be timezone-aware")
        default_ts = default_ts.astimezone(timezone.utc)
    lines = _lines(data, source)
    job = job_id or "unknown"
    meta: dict[str, Any] = {
        "job_id_source": "caller" if job_id else "none", "skipped_lines": 0, "nccl_lines": 0,
        "collectives_unknown_comm": 0, "duplicates_dropped": 0, "warnings": [], "warnings_without_ts": 0,
    }
    comms: dict[tuple[str, int, str], dict[str, Any]] = {}
    pending_topo: dict[tuple[str, int, int], dict[str, Any]] = {}
    topology: list[dict[str, Any]] = []
    colls: list[dict[str, Any]] = []
    seen_coll: set[tuple[str, int, str, int]] = set()
    warns: dict[tuple[datetime, str, str, int], dict[str, Any]] = {}

    hosts: set[str] = set()
    watchdog: list[tuple[int, datetime | None, re.Match[str]]] = []
    for lineno, raw in lines:
        line, ts = _strip_prefixes(raw, tz, source, lineno)
        if not line:
            continue
        if w := _WATCHDOG.search(line):
            watchdog.append((lineno, ts or default_ts, w))
            continue
        if m := _VERSION.match(line):
            meta.setdefault("nccl_version", m.group(1))
            continue
        p = _PREFIX.match(line)
        if not p:
            meta["skipped_lines"] += 1
            continue
        meta["nccl_lines"] += 1
        host, pid, tid, rest = p.group("host"), int(p.group("pid")), int(p.group("tid")), p.group("rest")
        hosts.add(host)
        if w := _WARN.match(rest):
            _warn(w.group("site"), w.group("msg"), host, pid, ts or default_ts, warns, meta, source, lineno)
            continue
        i = _INFO.match(rest)
        if not i:
            continue  # NCCL TRACE / CALL lines carry nothing Fleetscope reads
        msg = i.group("msg")
        topo = pending_topo.setdefault((host, pid, tid), _empty_topology())
        if m := _COMM_EVENT.search(msg):
            key = (host, pid, m.group("ptr").lower())
            if m.group("what") == "Init":
                comm = _comm_record(msg, host, pid, m.group("ptr").lower(), source, lineno)
                comms[key] = {**comms.get(key, {}), **comm}
                claimed = pending_topo.pop((host, pid, tid))
                if claimed["rings"] or claimed["trees"] or claimed["connections"]:
                    topology.append({**_topology_subject(comm), **_topology_out(claimed)})
            elif key in comms:
                comms[key]["destroyed"] = True
        elif m := _RING.match(msg):
            topo["rings"][int(m.group("ch"))] = [int(r) for r in m.group("ranks").split()]
        elif m := _TREES.match(msg):
            for ch, d0, d1, d2, r, up in _TREE.findall(m.group(1)):
                children = [int(d) for d in (d0, d1, d2) if d != "-1"]
                topo["trees"][int(ch)] = {"rank": int(r), "up": int(up), "down": children}
        elif m := _CONN.match(msg):
            via = m.group("via")
            conn = {"channel": int(m.group("ch")), "from_rank": int(m.group("src")), "from_bus": m.group("srcbus"),
                    "to_rank": int(m.group("dst")), "to_bus": m.group("dstbus"), "direction": m.group("dir"),
                    "transport": via, "transport_kind": via.split("/")[0]}
            if conn not in topo["connections"]:
                topo["connections"].append(conn)
        elif _COLL_START.match(msg):
            row = _coll_row(msg, host, pid, ts, comms, job, meta, source, lineno)
            if row is None:
                continue
            k = (row["job_id"], row["rank"], row["comm_id"], row["seq"])
            if k in seen_coll:
                meta["duplicates_dropped"] += 1
                continue
            seen_coll.add(k)
            colls.append(row)

    for (host, pid, _tid), topo in pending_topo.items():
        if topo["rings"] or topo["trees"] or topo["connections"]:
            topology.append({"host": host, "pid": pid, "comm": None, "comm_id": None, "rank": None,
                             "nranks": None, **_topology_out(topo)})
    communicators = sorted(comms.values(), key=lambda c: (c["nranks"], c["comm_id"], c["rank"]))
    meta["communicators"] = communicators
    meta["topology"] = topology
    meta["job_ranks"] = _job_ranks(communicators)
    if not meta["nccl_lines"] and not watchdog:
        raise ParseError("no NCCL log lines (host:pid:tid [dev] NCCL ...) found", source=source)
    meta["watchdog_timeouts"], meta["watchdog_without_ts"] = len(watchdog), 0
    log_host = next(iter(hosts)) if len(hosts) == 1 else ""
    for lineno, ts, w in watchdog:
        if ts is None:
            meta["watchdog_without_ts"] += 1
            continue
        work = dict(_WORK_KV.findall(w.group("work")))
        ran_s = int(w.group("ran_ms")) / 1000
        timeout = f", past its timeout of {int(work['Timeout(ms)']) / 1000:g} s" if work.get("Timeout(ms)", "").isdigit() else ""
        key = (ts, log_host, "nccl_watchdog_timeout", int(w.group("rank")))
        if key in warns:
            meta["duplicates_dropped"] += 1
            continue
        warns[key] = {"ts": ts, "host": log_host, "gpu_uuid": "", "kind": "nccl_watchdog_timeout", "code": int(w.group("rank")), "value": ran_s,
                      "message": f"job {job}: rank {w.group('rank')} {work.get('OpType', '?')} SeqNum={work.get('SeqNum', '?')} ran {ran_s:g} s{timeout}",
                      "source": f"pytorch ProcessGroupNCCL watchdog (line {lineno})"}
    return Batch(
        source=source,
        collective=pl.DataFrame(colls, schema=COLLECTIVE.schema) if colls else COLLECTIVE.empty(),
        health_event=pl.DataFrame(list(warns.values()), schema=HEALTH_EVENT.schema) if warns else HEALTH_EVENT.empty(),
        meta=meta,
    )


def _strip_prefixes(raw: str, tz: tzinfo, source: str, line: int) -> tuple[str, datetime | None]:
    """Remove launcher tags and timestamps in whatever order they were stacked; return the time seen."""
    text, ts = raw.strip(), None
    for _ in range(4):
        if m := _MPI_TAG.match(text):
            text = text[m.end():]
        elif m := _ISO_TS.match(text):
            ts = ts or _parse_ts(m.group(1), tz, source, line)
            text = text[m.end():]
        elif m := _NCCL_TS.match(text):
            ts = ts or _parse_ts(m.group(1), tz, source, line)
            text = text[m.end():]
        elif m := _SRUN_LABEL.match(text):
            text = text[m.end():]
        else:
            break
        text = text.lstrip()
    return text, ts


def _parse_ts(text: str, tz: tzinfo, source: str, line: int) -> datetime:
    t = text.replace(",", ".").replace("Z", "+00:00")
    if m := re.match(r"^(.*\.\d{6})\d+(.*)$", t):  # fromisoformat takes at most microseconds
        t = m.group(1) + m.group(2)
    try:
        dt = datetime.fromisoformat(t)
    except ValueError:
        raise ParseError(f"bad timestamp {text!r}", source=source, line=line, field="timestamp") from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=tz)
    return dt.astimezone(timezone.utc)


def _comm_record(msg: str, host: str, pid: int, ptr: str, source: str, line: int) -> dict[str, Any]:
    kv = {k.lower(): v for k, v in _KV.findall(msg)}
    try:
        rank, nranks = int(kv["rank"]), int(kv["nranks"])
    except (KeyError, ValueError):
        raise ParseError("Init COMPLETE line without rank/nranks", source=source, line=line, field="rank") from None
    if nranks < 1 or not 0 <= rank < nranks or nranks > 10_000_000:
        raise ParseError(f"rank {rank} outside communicator of {nranks}", source=source, line=line, field="rank")
    comm_id = kv.get("commid")
    return {
        "host": host, "pid": pid, "comm": ptr, "rank": rank, "nranks": nranks,
        "cuda_dev": int(kv["cudadev"]) if kv.get("cudadev", "").isdigit() else None,
        "nvml_dev": int(kv["nvmldev"]) if kv.get("nvmldev", "").isdigit() else None,
        "bus_id": kv.get("busid"),
        "comm_id": comm_id.lower() if comm_id else f"{host}:{pid}:{ptr}",
        "comm_id_is_global": comm_id is not None,
        "destroyed": False, "line": line,
    }


def _coll_row(msg: str, host: str, pid: int, ts: datetime | None, comms: dict, job: str, meta: dict,
              source: str, line: int) -> dict[str, Any] | None:
    m = _COLL.match(msg)
    if not m:
        raise ParseError("malformed opCount line", source=source, line=line, field="opCount")
    comm = comms.get((host, pid, m.group("comm").lower()))
    if comm is None:
        meta["collectives_unknown_comm"] += 1
        return None
    nranks = int(m.group("nranks"))
    if nranks != comm["nranks"]:
        raise ParseError(f"[nranks={nranks}] disagrees with the communicator's {comm['nranks']}", source=source,
                         line=line, field="nranks")
    seq = int(m.group("opcount"), 16)
    if seq > _I64_MAX:
        raise ParseError("opCount does not fit in 64 bits", source=source, line=line, field="opCount")
    count = int(m.group("count"))
    dt = int(m.group("dtype"))
    name, size = _DTYPES.get(dt, (f"nccl_dtype_{dt}", None))
    nbytes = count * size if size is not None else None
    if nbytes is not None and nbytes > _I64_MAX:
        raise ParseError(f"count {count} x {size} bytes does not fit in 64 bits", source=source, line=line,
                         field="count")
    return {
        "job_id": job, "rank": comm["rank"], "comm_id": comm["comm_id"], "seq": seq, "op": m.group("op"),
        "bytes": nbytes, "nranks": nranks, "start": ts, "duration_s": None, "algbw_gbps": None, "busbw_gbps": None,
        "algo": None, "proto": None, "dtype": name, "host": host, "gpu_uuid": None,
    }


def _warn(site: str, msg: str, host: str, pid: int, ts: datetime | None, warns: dict, meta: dict, source: str,
          line: int) -> None:
    msg = msg.strip()[:4096]
    meta["warnings"].append({"line": line, "host": host, "pid": pid, "site": site, "message": msg,
                             "ts": ts.isoformat() if ts else None})
    if ts is None:
        meta["warnings_without_ts"] += 1
        return
    code = zlib.crc32(f"{site} {msg}".encode()) & 0x7FFFFFFF
    key = (ts, host, "nccl_warn", code)
    if key in warns:
        meta["duplicates_dropped"] += 1
        return
    warns[key] = {"ts": ts, "host": host, "gpu_uuid": "", "kind": "nccl_warn", "code": code, "value": None,
                  "message": msg, "source": f"nccl {site}"}


def _empty_topology() -> dict[str, Any]:
    return {"rings": {}, "trees": {}, "connections": []}


def _topology_subject(comm: dict[str, Any]) -> dict[str, Any]:
    return {k: comm[k] for k in ("host", "pid", "comm", "comm_id", "rank", "nranks")}


def _topology_out(topo: dict[str, Any]) -> dict[str, Any]:
    kinds = sorted({c["transport_kind"] for c in topo["connections"]})
    return {"rings": dict(sorted(topo["rings"].items())), "trees": dict(sorted(topo["trees"].items())),
            "connections": topo["connections"], "transports": kinds}


def _job_ranks(communicators: list[dict[str, Any]]) -> list[dict[str, Any]]:
    if not communicators:
        return []
    world = max(c["nranks"] for c in communicators)
    out: dict[int, dict[str, Any]] = {}
    for c in communicators:
        if c["nranks"] == world and c["rank"] not in out:
            out[c["rank"]] = {"rank": c["rank"], "host": c["host"], "pid": c["pid"], "cuda_dev": c["cuda_dev"],
                              "bus_id": c["bus_id"], "comm_id": c["comm_id"]}
    return [out[r] for r in sorted(out)]


def _lines(data: bytes, source: str) -> list[tuple[int, str]]:
    return input_lines(data, source, max_input_bytes=MAX_INPUT_BYTES, max_line_bytes=MAX_LINE_BYTES, strip=False)


# --- declaration (ingest.format) ---------------------------------------------------------------------

_INIT_MARK = b" - Init COMPLETE"
_VERSION_MARK = b"NCCL version "


def context_lines(piece: bytes) -> list[bytes]:
    """The lines of a piece that later pieces need to resolve their collective calls' rank and
    communicator: communicator ``Init COMPLETE`` lines and the ``NCCL version`` line."""
    out = []
    for mark in (_VERSION_MARK, _INIT_MARK):
        i = piece.find(mark)
        while i >= 0:
            start, end = piece.rfind(b"\n", 0, i) + 1, piece.find(b"\n", i)
            out.append(piece[start: end if end >= 0 else len(piece)])
            i = piece.find(mark, end if end >= 0 else len(piece))
    return out


FORMATS = (
    # Combines: nccl-tests run with NCCL_DEBUG=INFO prints the debug log and its result table interleaved.
    FormatSpec("nccl_log", "NCCL debug log (NCCL_DEBUG=INFO)",
               lambda d, s, o: parse(d, source=s, job_id=o.job_id, default_ts=o.ts),
               sniff=Sniff(50, lambda v: "NCCL INFO" in v.text or "NCCL WARN" in v.text, combines=True),
               streaming=Splitting(cut_line, context=context_lines)),
)

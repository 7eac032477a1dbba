"""NCCL Inspector output → ``collective`` rows (JSON Lines) or ``metric_sample`` rows (Prometheus).

The NCCL Inspector is NCCL's profiler plugin (NVIDIA/nccl ``plugins/profiler/inspector``, earlier
``ext-profiler/inspector``). Its JSON mode writes one JSON object per line; what a line holds depends
on ``metadata.inspector_output_format_version`` (read from ``inspector_json.cc`` of each release and
the plugin's ``inspector_json_reader.py``):

* **v4.0** — every line is self-contained: ``header`` {``id`` (communicator hash), ``rank``,
  ``n_ranks``, ``nnodes``}, ``metadata`` {version, ``git_rev``, ``rec_mechanism``,
  ``dump_timestamp_us``, ``hostname``, ``pid``} and one of ``coll_perf`` {``coll``, ``coll_sn``,
  ``coll_msg_size_bytes``, ``coll_exec_time_us``, ``coll_timing_source``, ``coll_algobw_gbs``,
  ``coll_busbw_gbs``, verbose ``event_trace_sn`` / ``event_trace_ts``} or ``p2p_perf`` (same with a
  ``p2p_`` prefix and ``p2p_peer``).
* **v4.1** — ``header`` gains ``comm_name``; each communicator dump starts with a ``dump_stats``
  marker line (header + metadata + record/drop counts). Operation lines stay self-contained.
* **v4.2** — ``coll_perf`` gains ``coll_algo`` and ``coll_proto``.
* **v4.3** — header and metadata are written *once*, on the ``dump_stats`` marker; the
  ``coll_records`` + ``p2p_records`` + ``proxy_records`` lines that follow are bare
  ``{"coll_perf": ...}`` / ``{"p2p_perf": ...}`` / ``{"proxy_trace": ...}`` objects that inherit
  the marker's context. The writer holds its output lock for the whole batch, so batches never
  interleave. As in NVIDIA's reader, a bare line without a marker, a line beyond the announced
  counts, or a new marker (or end of input) before the counts are used up is an error: carrying the
  wrong communicator or PID forward would silently mislabel data.

Any line that carries its own ``header`` + ``metadata`` is read as self-contained, whatever its
version; context carried forward only ever comes from the latest marker of a v4.3+ dump.

Mapping to ``collective``: ``comm_id`` = ``header.id``; ``seq`` = ``coll_sn`` (``p2p_sn``);
``bytes`` = ``*_msg_size_bytes``; ``duration_s`` = ``*_exec_time_us`` / 1e6; ``algbw_gbps`` /
``busbw_gbps`` as reported (GB/s); ``host`` = ``metadata.hostname``; ``start`` = the earliest
``kernel_start_ts`` of the verbose event trace (else ``coll_start_ts``), null without a verbose trace
(``dump_timestamp_us`` is when the dump was written, not when the operation ran). The JSON has no GPU
UUID, so ``gpu_uuid`` stays null.

P2P operations number their ``p2p_sn`` independently of ``coll_sn`` on the same communicator, and
``collective``'s natural key (job_id, rank, comm_id, seq) has no operation kind, so P2P rows use
``comm_id`` = ``<id>#p2p`` to keep a Send from overwriting the collective with the same number.
``proxy_trace`` records (sub-operation network progress) are counted in ``meta["proxy_records"]``,
not turned into rows.

``job_id``: the JSON carries none. In order: the caller's ``job_id``; the Slurm job id in the
plugin's default dump directory name ``nccl-inspector-<SLURM_JOBID>`` when ``source`` is such a
path; else ``"unknown"``. ``meta["job_id_source"]`` says which.

The Prometheus textfile mode (``NCCL_INSPECTOR_PROM_DUMP=1``, ``inspector_prom.cc``) writes
*aggregates* per (communicator name, collective, message-size bucket, algo_proto): the geometric
mean bus bandwidth and the mean execution time over a dump interval. Those have no rank and no
sequence number, so they are not ``collective`` rows; ``parse_prometheus`` returns them as
``metric_sample`` series, names and values unchanged (the unit is in the name), plus a ``job_id``
label (``slurm_job_id`` when it is not ``"unknown"``, else the caller's) and a ``gpu_uuid`` label
when the file name is the plugin's ``nccl_inspector_metrics_<uuid>.prom``.

The plugin's third output, OTLP/HTTP (``NCCL_INSPECTOR_OTEL_EXPORT=1``, same metric names as the textfile
mode), arrives at ``POST /v1/metrics`` and is mapped by ``ingest.otlp``: per-operation points of its verbose
mode to ``collective`` rows, its aggregates to ``metric_sample``.
"""

from __future__ import annotations

import math
import re
from datetime import datetime, timezone
from typing import Any

import polars as pl

from fleetscope.core.promtext import label_map, lex_line
from fleetscope.core.errors import ParseError
from fleetscope.core.textinput import input_lines, json_object, require_final_newline, unterminated_line
from fleetscope.core.frames import COLLECTIVE, METRIC_SAMPLE, Batch, series_key
from ingest.format import FormatSpec, Sniff, SniffView, Splitting

MAX_LINE_BYTES = 1 << 20  # a verbose coll_perf line is ~1 KB; the plugin never writes megabytes
MAX_INPUT_BYTES = 1 << 30
_I64_MAX = 2**63 - 1
_KNOWN_VERSIONS = ("v4.0", "v4.1", "v4.2", "v4.3")
_SLURM_DIR = re.compile(r"nccl-inspector-(\d+)(?:[\\/]|$)")
_PROM_FILE = re.compile(r"nccl_inspector_metrics_(GPU-[0-9a-fA-F-]+|MIG-[0-9a-fA-F-]+)\.prom$")
_OP_KINDS = ("coll_perf", "p2p_perf", "proxy_trace")


def parse(data: bytes, *, source: str = "", job_id: str | None = None) -> Batch:
    """Parse NCCL Inspector JSON Lines (format v4.0–v4.3) into a Batch with a ``collective`` frame.

    Re-sent lines (same job, rank, communicator and sequence number) produce one row; the number
    dropped is ``meta["duplicates_dropped"]``.
    """
    lines = _lines(data, source)
    job, job_src = _job_id(job_id, source)
    rows: list[dict[str, Any]] = []
    seen: set[tuple[str, int, str, int]] = set()
    meta: dict[str, Any] = {
        "job_id_source": job_src, "format_versions": [], "dump_markers": 0, "proxy_records": 0,
        "duplicates_dropped": 0, "dropped_by_inspector": 0,
    }
    ctx: dict[str, Any] | None = None  # the v4.3 marker whose records are being read
    remaining: dict[str, int] = {}
    ctx_line = 0
    cut = unterminated_line(data)

    for lineno, text in lines:
        obj = json_object(text, source, lineno, unterminated=lineno == cut)
        if "dump_stats" in obj:
            if any(remaining.values()):
                raise ParseError(
                    f"new dump marker while the dump started on line {ctx_line} still announces "
                    f"{_left(remaining)} records (truncated or interleaved dump)",
                    source=source, line=lineno, field="dump_stats",
                )
            header, metadata = _context(obj, source, lineno)
            stats = obj["dump_stats"]
            if not isinstance(stats, dict):
                raise ParseError("dump_stats must be an object", source=source, line=lineno, field="dump_stats")
            meta["dump_markers"] += 1
            meta["dropped_by_inspector"] += sum(
                _uint(stats.get(k, 0), source, lineno, f"dump_stats.{k}")
                for k in ("coll_dropped_since_last_dump", "p2p_dropped_since_last_dump")
            )
            _note_version(meta, metadata)
            ctx, remaining, ctx_line = None, {}, lineno
            if _carries_forward(metadata):
                ctx = {"header": header, "metadata": metadata}
                remaining = {
                    "coll_perf": _uint(stats.get("coll_records"), source, lineno, "dump_stats.coll_records"),
                    "p2p_perf": _uint(stats.get("p2p_records"), source, lineno, "dump_stats.p2p_records"),
                    "proxy_trace": _uint(stats.get("proxy_records", 0), source, lineno, "dump_stats.proxy_records"),
                }
            continue

        kinds = [k for k in _OP_KINDS if k in obj]
        if len(kinds) != 1:
            raise ParseError(
                "line is neither a dump marker nor exactly one of coll_perf, p2p_perf, proxy_trace",
                source=source, line=lineno, field="/".join(kinds) or None,
            )
        kind = kinds[0]
        if "header" in obj or "metadata" in obj:
            header, metadata = _context(obj, source, lineno)
            _note_version(meta, metadata)
        else:
            # v4.3: a bare record inherits the marker's communicator and process
            if ctx is None:
                raise ParseError(
                    f"bare {kind} record with no preceding v4.3 dump marker to take header/metadata from",
                    source=source, line=lineno, field="header",
                )
            if len(obj) != 1:
                raise ParseError(f"unexpected fields next to {kind} in a v4.3 record", source=source, line=lineno,
                                 field=",".join(sorted(k for k in obj if k != kind)))
            if remaining.get(kind, 0) <= 0:
                raise ParseError(
                    f"{kind} record beyond the counts announced by the dump marker on line {ctx_line}",
                    source=source, line=lineno, field=kind,
                )
            remaining[kind] -= 1
            header, metadata = ctx["header"], ctx["metadata"]
        if kind == "proxy_trace":
            meta["proxy_records"] += 1
            continue
        row = _row(kind, obj[kind], header, metadata, job, source, lineno)
        key = (row["job_id"], row["rank"], row["comm_id"], row["seq"])
        if key in seen:
            meta["duplicates_dropped"] += 1
            continue
        seen.add(key)
        rows.append(row)

    if any(remaining.values()):
        raise ParseError(
            f"input ends inside the dump started on line {ctx_line}: {_left(remaining)} announced records "
            "missing (truncated file)", source=source, line=lines[-1][0], field="dump_stats",
        )
    meta["format_versions"] = sorted(set(meta["format_versions"]))
    df = pl.DataFrame(rows, schema=COLLECTIVE.schema) if rows else COLLECTIVE.empty()
    return Batch(source=source, collective=df, meta=meta)


def _row(kind: str, perf: Any, header: dict[str, Any], metadata: dict[str, Any], job: str, source: str,
         line: int) -> dict[str, Any]:
    if not isinstance(perf, dict):
        raise ParseError(f"{kind} must be an object", source=source, line=line, field=kind)
    p = "coll" if kind == "coll_perf" else "p2p"
    f = f"{kind}."
    op = perf.get(p)
    if not isinstance(op, str) or not op or len(op) > 64:
        raise ParseError(f"operation name must be a short string, got {str(op)[:40]!r}", source=source, line=line,
                         field=f + p)
    nranks = _uint(header.get("n_ranks"), source, line, "header.n_ranks")
    rank = _uint(header.get("rank"), source, line, "header.rank")
    if nranks < 1 or rank >= nranks:
        raise ParseError(f"rank {rank} outside communicator of {nranks} ranks", source=source, line=line,
                         field="header.rank")
    comm_id = header.get("id")
    if not isinstance(comm_id, str) or not comm_id or len(comm_id) > 128:
        raise ParseError("communicator id must be a non-empty string", source=source, line=line, field="header.id")
    host = metadata.get("hostname")
    if host is not None and (not isinstance(host, str) or len(host) > 255):
        raise ParseError("hostname must be a string", source=source, line=line, field="metadata.hostname")
    exec_us = _nonneg(perf.get(f"{p}_exec_time_us"), source, line, f + f"{p}_exec_time_us")
    algo = perf.get("coll_algo") if p == "coll" else None
    proto = perf.get("coll_proto") if p == "coll" else None
    return {
        "job_id": job,
        "rank": rank,
        "comm_id": comm_id if p == "coll" else comm_id + "#p2p",
        "seq": _uint(perf.get(f"{p}_sn"), source, line, f + f"{p}_sn"),
        "op": op,
        "bytes": _uint(perf.get(f"{p}_msg_size_bytes"), source, line, f + f"{p}_msg_size_bytes"),
        "nranks": nranks,
        "start": _start(perf, p, source, line),
        "duration_s": exec_us / 1e6,
        "algbw_gbps": _nonneg(perf.get(f"{p}_algobw_gbs"), source, line, f + f"{p}_algobw_gbs"),
        "busbw_gbps": _nonneg(perf.get(f"{p}_busbw_gbs"), source, line, f + f"{p}_busbw_gbs"),
        "algo": algo if isinstance(algo, str) and algo != "unknown" else None,
        "proto": proto if isinstance(proto, str) and proto != "unknown" else None,
        "dtype": None,
        "host": host,
        "gpu_uuid": None,
    }


def _start(perf: dict[str, Any], p: str, source: str, line: int) -> datetime | None:
    trace = perf.get("event_trace_ts")
    if trace is None:
        return None
    if not isinstance(trace, dict):
        raise ParseError("event_trace_ts must be an object", source=source, line=line, field="event_trace_ts")
    starts = []
    for i, k in enumerate(trace.get("kernel_events") or []):
        if isinstance(k, dict) and k.get("kernel_start_ts"):
            field = f"event_trace_ts.kernel_events[{i}].kernel_start_ts"
            starts.append(_uint(k["kernel_start_ts"], source, line, field))
    if not starts and trace.get(f"{p}_start_ts"):
        starts.append(_uint(trace[f"{p}_start_ts"], source, line, f"event_trace_ts.{p}_start_ts"))
    if not starts:
        return None
    us = min(starts)
    if us > 4102444800_000000:  # 2100-01-01: not a microsecond epoch timestamp
        raise ParseError(f"timestamp {us} µs is past 2100", source=source, line=line, field="event_trace_ts")
    return datetime.fromtimestamp(us // 1_000_000, tz=timezone.utc).replace(microsecond=us % 1_000_000)


def _context(obj: dict[str, Any], source: str, line: int) -> tuple[dict[str, Any], dict[str, Any]]:
    header, metadata = obj.get("header"), obj.get("metadata")
    if not isinstance(header, dict):
        raise ParseError("missing or malformed header", source=source, line=line, field="header")
    if not isinstance(metadata, dict):
        raise ParseError("missing or malformed metadata", source=source, line=line, field="metadata")
    return header, metadata


def _carries_forward(metadata: dict[str, Any]) -> bool:
    """v4.3 and later write operation records bare after the marker; earlier markers are stats only."""
    v = metadata.get("inspector_output_format_version")
    m = re.fullmatch(r"v(\d+)\.(\d+)", v) if isinstance(v, str) else None
    return bool(m) and (int(m.group(1)), int(m.group(2))) >= (4, 3)


def _note_version(meta: dict[str, Any], metadata: dict[str, Any]) -> None:
    v = metadata.get("inspector_output_format_version")
    if isinstance(v, str) and v not in meta["format_versions"]:
        meta["format_versions"].append(v)
        if v not in _KNOWN_VERSIONS:
            meta.setdefault("unknown_format_versions", []).append(v)


def _left(remaining: dict[str, int]) -> str:
    return ", ".join(f"{n} {k}" for k, n in remaining.items() if n)


def _job_id(job_id: str | None, source: str) -> tuple[str, str]:
    if job_id:
        return job_id, "caller"
    if m := _SLURM_DIR.search(source or ""):
        return m.group(1), "dump_dir"
    return "unknown", "none"


# --- Prometheus textfile mode ---------------------------------------------------------------



def parse_prometheus(
    data: bytes,
    *,
    source: str = "",
    job_id: str | None = None,
    ts: datetime | None = None,
) -> Batch:
    """Parse the Inspector's Prometheus textfile output into ``metric_sample`` rows.

    The textfile has no timestamps (node exporter stamps samples at scrape time), so ``ts`` —
    timezone-aware, typically the file's modification time — is required unless every sample
    carries the optional millisecond timestamp of the exposition format. A last line without its line
    feed is refused: the file was cut mid-line (``fleetscope.core.textinput.require_final_newline``).
    """
    require_final_newline(data, source)
    lines = _lines(data, source)
    ts_utc = None
    if ts is not None:
        if ts.tzinfo is None:
            raise ValueError("ts must be timezone-aware")
        ts_utc = ts.astimezone(timezone.utc)
    gpu_uuid = m.group(1) if (m := _PROM_FILE.search(source or "")) else None
    rows: dict[tuple[datetime, str], dict[str, Any]] = {}
    meta: dict[str, Any] = {"duplicates_dropped": 0, "job_id_source": "none"}
    for lineno, text in lines:
        sample = lex_line(text, lineno, source)
        if sample is None:
            continue
        _, name, pairs, value, ms = sample
        labels = label_map(pairs, name=name, source=source, line=lineno)
        if not math.isfinite(value) or value < 0:
            # bandwidths and execution times: a negative or non-finite figure is corruption
            raise ParseError(f"sample value {value} is not a finite non-negative number", source=source,
                             line=lineno, field=name)
        if ms is not None:
            if not 0 <= ms <= 4102444800_000:
                raise ParseError(f"sample timestamp {ms} ms out of range", source=source, line=lineno,
                                 field="timestamp")
            when = datetime.fromtimestamp(ms // 1000, tz=timezone.utc).replace(microsecond=(ms % 1000) * 1000)
        elif ts_utc is not None:
            when = ts_utc
        else:
            raise ParseError("sample has no timestamp and no ts= was given", source=source, line=lineno, field="ts")
        slurm = labels.get("slurm_job_id")
        if slurm and slurm != "unknown":
            labels["job_id"], meta["job_id_source"] = slurm, "slurm_job_id"
        elif job_id:
            labels["job_id"], meta["job_id_source"] = job_id, "caller"
        if gpu_uuid:
            labels["gpu_uuid"] = gpu_uuid
        key = (when, series_key(name, labels))
        if key in rows:
            meta["duplicates_dropped"] += 1
            continue
        rows[key] = {"ts": when, "series": key[1], "value": value}
    if not rows:
        raise ParseError("no samples", source=source)
    df = pl.DataFrame(list(rows.values()), schema=METRIC_SAMPLE.schema)
    return Batch(source=source, metric_sample=df, meta=meta)


def _lines(data: bytes, source: str) -> list[tuple[int, str]]:
    return input_lines(data, source, max_input_bytes=MAX_INPUT_BYTES, max_line_bytes=MAX_LINE_BYTES)


def _uint(v: Any, source: str, line: int, field: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise ParseError(f"expected a non-negative integer, got {str(v)[:40]!r}", source=source, line=line,
                         field=field)
    if v < 0 or v > _I64_MAX:
        raise ParseError(f"value {v} outside 0..2^63-1", source=source, line=line, field=field)
    return v


def _nonneg(v: Any, source: str, line: int, field: str) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ParseError(f"expected a number, got {str(v)[:40]!r}", source=source, line=line, field=field)
    try:
        x = float(v)
    except OverflowError:
        x = math.inf
    if not math.isfinite(x) or x < 0:
        raise ParseError(f"value {v} is not a finite non-negative number", source=source, line=line, field=field)
    return x


# --- declarations (ingest.format) --------------------------------------------------------------------


def _looks_like(view: SniffView) -> bool:
    obj = view.first_object if view.is_json else None
    return obj is not None and ("header" in obj or "dump_stats" in obj)


def _looks_like_prometheus(view: SniffView) -> bool:
    return any(line.startswith(("nccl_bus_bandwidth", "nccl_collective_", "nccl_p2p_")) for line in view.text.splitlines()[:200])


def cut_dump(buf: bytes) -> int:
    """Before the last line that carries its own header (a v4.3 dump marker or a self-contained v4.0-v4.2
    line; bare v4.3 records never do), never inside a dump whose records inherit it; 0 if none yet."""
    i = buf.rfind(b'"header"')
    while i >= 0:
        start = buf.rfind(b"\n", 0, i) + 1
        if start > 0:
            return start
        i = buf.rfind(b'"header"', 0, i)
    return 0


FORMATS = (
    FormatSpec("nccl_inspector", "NCCL Inspector JSON Lines (v4.0-v4.3)",
               lambda d, s, o: parse(d, source=s, job_id=o.job_id), sniff=Sniff(12, _looks_like),
               streaming=Splitting(cut_dump)),
    # Tried last: only a text that nothing else claimed (its metric names are generic enough).
    FormatSpec("nccl_inspector_prom", "NCCL Inspector Prometheus textfile",
               lambda d, s, o: parse_prometheus(d, source=s, job_id=o.job_id, ts=o.ts),
               sniff=Sniff(90, _looks_like_prometheus), needs_ts=True, final_newline=True),
)

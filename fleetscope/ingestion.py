"""Which parser reads which bytes: the format registry, content sniffing and the ingest entry point
shared by `fleetscope ingest` and `POST /api/v1/ingest/{format}`.

Parsers in ``ingest/`` are pure and never import each other; this module is where the service layer
chooses among them. Detection looks at content, not file names, because collectors name files freely.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import importlib
import json
import re
import zlib
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import polars as pl
from isal import isal_zlib

from fleetscope import door
from fleetscope import frames as F
from fleetscope.errors import FleetscopeError, ParseError
from fleetscope.observability import tracer
from fleetscope.textinput import MAX_GZIP_MEMBERS
from fleetscope.store import Store, WriteResult
from ingest import dcgm_lines

SNIFF_BYTES = 256 * 1024
GZIP_MAGIC = b"\x1f\x8b"


@dataclass(frozen=True)
class Options:
    """What a caller may tell a parser that the bytes do not say."""

    job_id: str | None = None
    ts: dt.datetime | None = None  # stamps formats without their own timestamps (scrapes, textfiles)
    op: str | None = None


@dataclass(frozen=True)
class Format:
    name: str
    module: str
    description: str
    call: Callable[[Any, bytes, str, Options], F.Batch]
    gzip_aware: bool = False  # the parser reads gzip itself


def _now(opts: Options) -> dt.datetime:
    return opts.ts or dt.datetime.now(dt.UTC)


FORMATS: dict[str, Format] = {
    f.name: f
    for f in (
        Format("dcgm", "ingest.dcgm", "dcgm-exporter /metrics body (Prometheus text)",
               lambda m, d, s, o: m.parse(d, source=s, ts=_now(o))),
        Format("nvidia_smi_csv", "ingest.nvidia_smi", "nvidia-smi --query-gpu=... --format=csv",
               lambda m, d, s, o: m.parse_csv(d, source=s, ts=o.ts)),
        Format("nvidia_smi_xml", "ingest.nvidia_smi", "nvidia-smi -q -x",
               lambda m, d, s, o: m.parse_xml(d, source=s, ts=o.ts)),
        Format("nvidia_smi_capture", "ingest.nvidia_smi", "multi-section nvidia-smi capture bundle",
               lambda m, d, s, o: m.parse_capture(d, source=s)),
        Format("kineto", "ingest.kineto", "PyTorch profiler (Kineto) trace, .json or .json.gz",
               lambda m, d, s, o: _kineto(m, d, s, o), gzip_aware=True),
        Format("nccl_inspector", "ingest.nccl_inspector", "NCCL Inspector JSON Lines (v4.0-v4.3)",
               lambda m, d, s, o: m.parse(d, source=s, job_id=o.job_id)),
        Format("nccl_inspector_prom", "ingest.nccl_inspector", "NCCL Inspector Prometheus textfile",
               lambda m, d, s, o: m.parse_prometheus(d, source=s, job_id=o.job_id, ts=_now(o))),
        Format("nccl_log", "ingest.nccl_log", "NCCL debug log (NCCL_DEBUG=INFO)",
               lambda m, d, s, o: m.parse(d, source=s, job_id=o.job_id, default_ts=o.ts)),
        Format("nccl_tests", "ingest.nccl_tests", "nccl-tests output (text table or -J JSON)",
               lambda m, d, s, o: m.parse(d, source=s, op=o.op, ts=o.ts)),
        Format("otlp_json", "ingest.otlp", "OTLP/JSON ExportMetricsServiceRequest (as posted to /v1/metrics)",
               lambda m, d, s, o: m.parse(d, encoding="json", source=s)),
        Format("job_events", "ingest.job_events", "job lifecycle events, JSON Lines (docs/job_events.md)",
               lambda m, d, s, o: m.parse(d, source=s)),
        # Never detected from content (a protobuf body has no signature); POST /api/v1/write names it.
        Format("prometheus_remote_write", "ingest.remote_write",
               "Prometheus remote write 1.0 WriteRequest, snappy-decompressed protobuf",
               lambda m, d, s, o: m.parse(d, source=s)),
    )
}


# A Kineto trace parsed whole peaks at ~3.2x its JSON; above this many bytes of JSON it is decoded a piece
# at a time instead (ingest.kineto.parse_chunks: same Batch, memory bounded by the piece), so the largest
# request, or a .json.gz of any size, stays well under 1 GiB.
KINETO_WHOLE_MAX_BYTES = 32 * 2**20
# Most JSON a gzip Kineto body may inflate to: memory stays bounded either way, this bounds the time a
# body of zeros or whitespace can take (about a minute at the streamed parse's ~120 MB/s).
KINETO_MAX_INFLATED_BYTES = 8 * 2**30


def _kineto(module: Any, data: bytes, source: str, opts: Options) -> F.Batch:
    gz = data.startswith(GZIP_MAGIC)
    if gz:
        # Inflated within the whole-parse size, never trusting the trailer's size (the sender's to forge,
        # and only mod 2**32); a trace past it is inflated again a piece at a time.
        job_id = opts.job_id or module.default_job_id(data)  # the file's id, not its inflated text's
        try:
            return module.parse(gunzip_capped(data, KINETO_WHOLE_MAX_BYTES, source), source=source, job_id=job_id)
        except TooLarge:
            pieces = inflate_pieces(data, KINETO_MAX_INFLATED_BYTES, source)
    elif len(data) <= KINETO_WHOLE_MAX_BYTES:
        return module.parse(data, source=source, job_id=opts.job_id)
    else:
        view = memoryview(data)
        pieces = (bytes(view[i:i + module.PIECE_BYTES]) for i in range(0, len(data), module.PIECE_BYTES))
    return module.parse_chunks(pieces, source=source, job_id=opts.job_id or module.default_job_id(data))


def inflate_pieces(data: bytes, limit: int, source: str, piece_bytes: int = 8 * 2**20, wbits: int = 31) -> Iterator[bytes]:
    """The inflated bytes of a gzip body (every member, at most ``textinput.MAX_GZIP_MEMBERS``),
    ``piece_bytes`` at a time, never holding more; ``TooLarge`` past ``limit`` bytes in all, ``ParseError``
    naming ``source`` for a corrupt or cut body. ``wbits`` 47 takes a zlib header too."""
    total, rest = 0, data
    try:
        for member in range(MAX_GZIP_MEMBERS + 1):
            if not rest:
                break
            _member_check(member, source)
            d = isal_zlib.decompressobj(wbits)
            tail = rest
            while True:
                piece = d.decompress(tail, piece_bytes)
                total += len(piece)
                if total > limit:
                    raise TooLarge(f"{source}: body inflates past the limit of {limit} bytes")
                if piece:
                    yield piece
                tail = d.unconsumed_tail
                if d.eof:
                    break
                if not tail and not piece:
                    raise EOFError("compressed stream ended before its end marker")
            rest = d.unused_data
    except (OSError, EOFError, zlib.error, isal_zlib.error) as exc:
        raise ParseError(f"truncated or corrupt gzip: {exc}", source=source) from None


class UnknownFormat(FleetscopeError):
    """Bytes that no registered parser recognises."""


def _first_json_object(text: str) -> dict[str, Any] | None:
    line = text.lstrip().split("\n", 1)[0].strip()
    try:
        obj = json.loads(line)
    except ValueError:
        return None
    return obj if isinstance(obj, dict) else None


# The result table's header row, and the closing average, as nccl-tests prints them (possibly behind an
# mpirun "[1,0]<stdout>:" tag). Prose that merely mentions them does not match.
_NCCL_TESTS_HEADER = re.compile(r"^\S*#\s+size\s+count\s+type\b.*#wrong", re.MULTILINE)
# A sample line of the Prometheus text format with a DCGM metric name: name, optional labels, a number.
_DCGM_LINE = re.compile(r"^(?:DCGM_FI_[A-Z0-9_]+|dcgm_[a-z0-9_]+)(?:\{[^\n]*\})?[ \t]+[-+]?(?:[0-9.]+(?:[eE][-+]?[0-9]+)?|NaN|Inf)", re.MULTILINE)
_NCCL_TESTS_AVG = re.compile(r"^\S*#\s*Avg bus bandwidth\s*:\s*[0-9.]+", re.MULTILINE)


def detect(data: bytes) -> list[str]:
    """The formats ``data`` holds, most specific first; empty when none is recognised.

    One file can hold two: nccl-tests run with NCCL_DEBUG=INFO prints the debug log and the result
    table interleaved, and both are worth keeping.
    """
    head = data[:SNIFF_BYTES]
    if head.startswith(GZIP_MAGIC):
        try:
            head = zlib.decompressobj(wbits=31).decompress(head, SNIFF_BYTES)
        except zlib.error:
            return []
    text = head.decode("utf-8", errors="replace")
    stripped = text.lstrip()
    found: list[str] = []
    if stripped.startswith("{"):
        if '"traceEvents"' in text or '"distributedInfo"' in text or ('"schemaVersion"' in text and '"ph"' in text):
            return ["kineto"]
        if '"resourceMetrics"' in text[:4096]:
            return ["otlp_json"]
        obj = _first_json_object(text)
        if obj is not None:
            if "header" in obj or "dump_stats" in obj:
                return ["nccl_inspector"]
            if "job_id" in obj and "kind" in obj:
                return ["job_events"]
        if '"results"' in text and ('"busbw"' in text or '"bus_bw"' in text or '"algbw"' in text or '"alg_bw"' in text):
            return ["nccl_tests"]
    if "<nvidia_smi_log" in text[:4096]:
        return ["nvidia_smi_xml"]
    if "$ nvidia-smi" in text[:8192]:
        return ["nvidia_smi_capture"]
    if _DCGM_LINE.search(text):
        return ["dcgm"]
    # nvidia-smi's CSV header names query fields (dotted, lower case), never label blocks.
    first = stripped.split("\n", 1)[0].lower()
    if "," in first and "{" not in first and any(k in first for k in ("pci.bus_id", "uuid", "power.draw", "utilization.gpu", "memory.used")):
        return ["nvidia_smi_csv"]
    if "NCCL INFO" in text or "NCCL WARN" in text:
        found.append("nccl_log")
    if _NCCL_TESTS_HEADER.search(text) or _NCCL_TESTS_AVG.search(text):
        found.append("nccl_tests")
    if not found and any(line.startswith(("nccl_bus_bandwidth", "nccl_collective_", "nccl_p2p_")) for line in text.splitlines()[:200]):
        found.append("nccl_inspector_prom")
    return found


@dataclass
class Outcome:
    """What ingesting one input did."""

    source: str
    formats: list[str]
    result: WriteResult | None = None
    error: str | None = None
    skipped_duplicate: bool = False
    notes: dict[str, Any] = field(default_factory=dict)
    # The health events written, for the API's alerting kick (fleetscope.alerting.kick); not reported.
    health_event: pl.DataFrame | None = field(default=None, repr=False)

    def to_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "formats": self.formats,
            "written": self.result.written if self.result else {},
            "offered": self.result.offered if self.result else {},
            "values": self.result.values if self.result else 0,
            "skipped_duplicate": self.skipped_duplicate,
            "error": self.error,
            "notes": self.notes,
        }


def resolve(data: bytes, *, source: str, fmt: str = "auto") -> list[str]:
    """The formats to parse ``data`` (or its first bytes) with: ``fmt`` itself, or every one detected."""
    if fmt == "auto":
        formats = detect(data)
        if not formats:
            raise UnknownFormat(f"{source}: format not recognised; pass --format (one of {', '.join(FORMATS)})")
        return formats
    if fmt in FORMATS:
        return [fmt]
    raise UnknownFormat(f"unknown format {fmt!r}: expected auto or one of {', '.join(FORMATS)}")


def parse(data: bytes, *, source: str, fmt: str = "auto", opts: Options = Options()) -> tuple[list[str], F.Batch]:
    """Parse ``data`` with the named format (or every detected one) into one Batch."""
    formats = resolve(data, source=source, fmt=fmt)
    batch = F.Batch(source=source)
    plain: bytes | None = None  # decompressed once, however many formats read it
    for name in formats:
        spec = FORMATS[name]
        payload = data
        if data.startswith(GZIP_MAGIC) and not spec.gzip_aware:
            if plain is None:
                plain = gunzip_capped(data, WHOLE_INFLATED_MAX_BYTES, source)
            payload = plain
        with tracer().start_as_current_span("ingest.parse") as span:
            span.set_attribute("fleetscope.format", name)
            span.set_attribute("fleetscope.source", source)
            span.set_attribute("fleetscope.bytes", len(payload))
            part = spec.call(importlib.import_module(spec.module), payload, source, opts)
        batch = batch.merge(part)
    batch.source = source
    return formats, batch


# The most a gzip input parsed whole may inflate to. Line formats of any size stream (fleetscope.streaming)
# and the API inflates within its body limit first; this bounds what is left, a document format read
# whole (nvidia-smi XML, nccl-tests), so a small gzip bomb is refused rather than inflated.
WHOLE_INFLATED_MAX_BYTES = 1 * 2**30


class TooLarge(FleetscopeError):
    """Input that inflates past the size limit (a gzip bomb, or simply too much for one request)."""


def gunzip_capped(data: bytes, limit: int, source: str) -> bytes:
    """The bytes of a gzip (or zlib) body, refused with ``TooLarge`` once they pass ``limit`` bytes, so a
    small bomb never expands in memory: ISA-L's inflate (about half of zlib's time on a 17 MB dcgm scrape)
    is asked for at most ``limit + 1`` bytes. A corrupt or cut-short body is a ``ParseError`` naming
    ``source``. Members after the first (concatenated files) are read too, within the same limit."""
    # one piece per member, so the join hands back the inflated bytes without a copy
    return b"".join(inflate_pieces(data, limit, source, piece_bytes=limit + 1, wbits=47))


def _member_check(member: int, source: str) -> None:
    """``ParseError`` once a gzip input reaches member ``MAX_GZIP_MEMBERS`` + 1 (counting from 0)."""
    if member >= MAX_GZIP_MEMBERS:
        raise ParseError(f"more than {MAX_GZIP_MEMBERS} gzip members", source=source)


def _notes(batch: F.Batch) -> dict[str, Any]:
    return door.notes(batch.meta)


def _content_sha(data: bytes, fmt: str, opts: Options) -> str:
    """The content hash of an input: its bytes and the options it was ingested with (the same trace under
    another job id is new data)."""
    h = hashlib.sha256(data)
    h.update(json.dumps([fmt, opts.job_id, opts.ts.isoformat() if opts.ts else None, opts.op]).encode())
    return h.hexdigest()


_BESIDE = ThreadPoolExecutor(max_workers=4, thread_name_prefix="ingest-hash")


def to_push(data: bytes, *, source: str, fmt: str = "auto", opts: Options = Options(), now: dt.datetime | None = None,
            formats: list[str] | None = None) -> door.Push:
    """An input made ready for the ingest door: parsed, or, for a small dcgm-exporter body (an agent's
    per-node push), left for the door to read with the rest of its group. ``now`` stamps formats without
    timestamps when ``opts.ts`` does not (the time the input was received); ``formats``, where the caller
    has resolved them already."""
    formats = formats or resolve(data, source=source, fmt=fmt)
    if formats == ["dcgm"] and len(data) <= dcgm_lines.MAX_BYTES and not data.startswith(GZIP_MAGIC):
        when = opts.ts or now or dt.datetime.now(dt.UTC)
        return door.Push(source, _content_sha(data, fmt, opts), formats, dcgm=data, ts_us=_epoch_us(when))
    # Hashing the input overlaps the parse (hashlib releases the GIL; the server has a second core):
    # 15 ms of a 17 MB scrape's ingest.
    sha = _BESIDE.submit(_content_sha, data, fmt, opts)
    formats, batch = parse(data, source=source, fmt=formats[0] if len(formats) == 1 else fmt, opts=opts)
    return door.Push(source, sha.result(), formats, batch=batch, notes=_notes(batch))


def _epoch_us(when: dt.datetime) -> int:
    when = when.replace(tzinfo=dt.UTC) if when.tzinfo is None else when
    delta = when - dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def outcome_of(accepted: door.Accepted) -> Outcome:
    return Outcome(source=accepted.source, formats=accepted.formats, result=accepted.result, skipped_duplicate=accepted.skipped_duplicate,
                   notes=accepted.notes, health_event=accepted.health_event)


def ingest_bytes(store: Store, data: bytes, *, source: str, fmt: str = "auto", opts: Options = Options()) -> Outcome:
    """Parse and write one input atomically, through the ingest door. A byte-identical input (with the
    same options) already ingested writes nothing."""
    return outcome_of(door.for_store(store).accept(to_push(data, source=source, fmt=fmt, opts=opts)))

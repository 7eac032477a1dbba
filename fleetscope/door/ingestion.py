"""Which parser reads which bytes: the format registry, content sniffing and the ingest entry point
shared by `fleetscope ingest` and `POST /api/v1/ingest/{format}`.

Each format declares itself at the end of its module in ``ingest/`` (``FORMATS``, a tuple of
``ingest.format.FormatSpec``); this module collects the declarations of the modules in ``FORMAT_MODULES``
and is where the service layer chooses among them. Detection looks at content, not file names, because
collectors name files freely.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import importlib
import json
import zlib
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from isal import isal_zlib

from fleetscope import door
from fleetscope.door import screen
from fleetscope.core import frames as F
from fleetscope.core import hashing
from fleetscope.core.errors import FleetscopeError, ParseError
from fleetscope.observability import tracer
from fleetscope.core.textinput import MAX_GZIP_MEMBERS
from fleetscope.store import Store, WriteResult
from ingest import dcgm_lines
from ingest.format import FormatSpec, Options, Sniff, SniffView

SNIFF_BYTES = 256 * 1024
GZIP_MAGIC = b"\x1f\x8b"


# The modules whose ``FORMATS`` declarations (ingest.format.FormatSpec) make up the registry, in the order
# `fleetscope fleet formats` lists them. A new source is one module in ingest/ plus its line here.
FORMAT_MODULES: list[str] = [
    "ingest.dcgm",
    "ingest.nvidia_smi",
    "ingest.kineto",
    "ingest.nccl_inspector",
    "ingest.nccl_log",
    "ingest.nccl_tests",
    "ingest.otlp",
    "ingest.job_events",
    "ingest.remote_write",
    "ingest.ib_node_exporter",
    "ingest.ib_sysfs",
    "ingest.perfquery",
    "ingest.serving_metrics",
    "ingest.serving_requests",
    "ingest.ibnetdiscover",
    "ingest.nccl_topo",
    "ingest.nvidia_smi_topo",
    "ingest.ibswinfo",
    "ingest.slurm_ib_features",
    "ingest.bytedance_whatif",
    "ingest.model_monitoring",
    "ingest.slurmrestd",
    "ingest.slurm_sacct",
    "ingest.slurm_squeue",
    "ingest.slurm_scontrol",
    "ingest.kube_state",
]


@dataclass(frozen=True)
class Format:
    """A registered format as the service calls it: ``call(module, data, source, opts)``."""

    name: str
    module: str
    description: str
    call: Callable[[Any, bytes, str, Options], F.Batch]
    gzip_aware: bool = False  # the parser reads gzip itself
    spec: FormatSpec | None = field(default=None, repr=False, compare=False)


def _now(opts: Options) -> dt.datetime:
    return opts.ts or dt.datetime.now(dt.UTC)


def _adapter(spec: FormatSpec) -> Callable[[Any, bytes, str, Options], F.Batch]:
    parse_ = spec.parse
    if spec.needs_ts:  # the clock is read here, in the service, never in ingest/
        return lambda m, d, s, o: parse_(d, s, o if o.ts is not None else dataclasses.replace(o, ts=_now(o)))
    return lambda m, d, s, o: parse_(d, s, o)


@dataclass(frozen=True)
class _Registry:
    formats: dict[str, Format]
    sniffers: tuple[tuple[Sniff, str], ...]  # every Sniff of every format, in priority order


def _collect(modules: tuple[str, ...]) -> _Registry:
    formats: dict[str, Format] = {}
    sniffers: list[tuple[Sniff, str]] = []
    for module in modules:
        declared = getattr(importlib.import_module(module), "FORMATS", None)
        if not declared:
            raise TypeError(f"{module} declares no FORMATS (a tuple of ingest.format.FormatSpec)")
        for spec in declared:
            if spec.name in formats or spec.name == "auto":
                raise ValueError(f"format {spec.name!r} of {module} is already registered (by {formats[spec.name].module})"
                                 if spec.name in formats else f"{module}: 'auto' is not a format name")
            call = _SERVICE_CALLS.get(spec.name, _adapter(spec))
            formats[spec.name] = Format(spec.name, module, spec.description, call, spec.gzip_aware, spec)
            sniffers.extend((sniff, spec.name) for sniff in spec.sniff)
    sniffers.sort(key=lambda x: x[0].priority)  # stable: equal priorities keep registration order
    return _Registry(formats, tuple(sniffers))


_registries: dict[tuple[str, ...], _Registry] = {}


def registry() -> _Registry:
    """The formats declared by the modules in ``FORMAT_MODULES`` now (collected once per list)."""
    key = tuple(FORMAT_MODULES)
    reg = _registries.get(key)
    if reg is None:
        reg = _registries[key] = _collect(key)
    return reg


class LiveView(Mapping[str, Any]):
    """A read-only mapping computed from the registry whenever it is read, so it follows ``FORMAT_MODULES``."""

    def __init__(self, build: Callable[[_Registry], Mapping[str, Any]]) -> None:
        self._build = build

    def _current(self) -> Mapping[str, Any]:
        return self._build(registry())

    def __getitem__(self, name: str) -> Any:
        return self._current()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._current())

    def __len__(self) -> int:
        return len(self._current())

    def __repr__(self) -> str:
        return f"LiveView({dict(self._current())!r})"


# name -> Format, in FORMAT_MODULES order: what `fleetscope fleet formats`, `--format` and /api/v1/ingest/{name} know.
FORMATS: Mapping[str, Format] = LiveView(lambda reg: reg.formats)


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


# Formats whose call the service wraps: what a request may inflate and hold in memory is its policy, not the
# parser's (ingest.kineto declares the whole parse; the bounded, piecewise reading of a large body is here).
_SERVICE_CALLS: dict[str, Callable[[Any, bytes, str, Options], F.Batch]] = {
    "kineto": lambda m, d, s, o: _kineto(m, d, s, o),
}


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


def detect(data: bytes) -> list[str]:
    """The formats ``data`` holds, most specific first; empty when none is recognised.

    The registered sniffers (``FormatSpec.sniff``) run in priority order over the decoded head; the first
    match is the answer, except that formats which can share a file (``Sniff.combines``: nccl-tests run
    with NCCL_DEBUG=INFO prints the debug log and the result table interleaved) are all kept.
    """
    head = data[:SNIFF_BYTES]
    if head.startswith(GZIP_MAGIC):
        try:
            head = zlib.decompressobj(wbits=31).decompress(head, SNIFF_BYTES)
        except zlib.error:
            return []
    view = SniffView(head.decode("utf-8", errors="replace"))
    found: list[str] = []
    for sniff, name in registry().sniffers:
        if found and not sniff.combines:
            continue
        if sniff.test(view):
            if not sniff.combines:
                return [name]
            if name not in found:
                found.append(name)
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


# The most a gzip input parsed whole may inflate to. Line formats of any size stream (fleetscope.door.streaming)
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
    return screen.notes(batch.meta)


def _content_sha(data: bytes, fmt: str, opts: Options) -> str:
    """The content hash of an input: its bytes and the options it was ingested with (the same trace under
    another job id is new data)."""
    h = hashing.sha256(data)
    h.update(json.dumps([fmt, opts.job_id, opts.ts.isoformat() if opts.ts else None, opts.op]).encode())
    return h.hexdigest()


_BESIDE = ThreadPoolExecutor(max_workers=4, thread_name_prefix="ingest-hash")


def to_push(data: bytes, *, source: str, fmt: str = "auto", opts: Options = Options(), now: dt.datetime | None = None,
            formats: list[str] | None = None, received: bytes | None = None) -> screen.Push:
    """An input made ready for the ingest door: parsed, or, for a small dcgm-exporter body (an agent's
    per-node push), left for the door to read with the rest of its group. ``now`` stamps formats without
    timestamps when ``opts.ts`` does not (the time the input was received); ``formats``, where the caller
    has resolved them already. ``received``: the input as it arrived, where the caller inflated it into
    ``data``; the content hash is taken over those bytes, as ``fleetscope ingest`` takes it over a
    ``.gz`` file, so the same bytes sent again are known and a 112 MB scrape is hashed as its 17 MB of gzip
    (20 ms of SHA-256 instead of 130 ms)."""
    formats = formats or resolve(data, source=source, fmt=fmt)
    hashed = data if received is None else received
    if formats == ["dcgm"] and len(data) <= dcgm_lines.MAX_BYTES and not data.startswith(GZIP_MAGIC):
        when = opts.ts or now or dt.datetime.now(dt.UTC)
        return screen.Push(source, _content_sha(hashed, fmt, opts), formats, dcgm=data, ts_us=_epoch_us(when))
    # Hashing the input overlaps the parse (hashlib releases the GIL; the server has a second core).
    sha = _BESIDE.submit(_content_sha, hashed, fmt, opts)
    formats, batch = parse(data, source=source, fmt=formats[0] if len(formats) == 1 else fmt, opts=opts)
    return screen.Push(source, sha.result(), formats, batch=batch, notes=_notes(batch))


def _epoch_us(when: dt.datetime) -> int:
    when = when.replace(tzinfo=dt.UTC) if when.tzinfo is None else when
    delta = when - dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def outcome_of(accepted: door.Accepted) -> Outcome:
    return Outcome(source=accepted.source, formats=accepted.formats, result=accepted.result, skipped_duplicate=accepted.skipped_duplicate,
                   notes=accepted.notes)


def ingest_bytes(store: Store, data: bytes, *, source: str, fmt: str = "auto", opts: Options = Options()) -> Outcome:
    """Parse and write one input atomically, through the ingest door. A byte-identical input (with the
    same options) already ingested writes nothing."""
    return outcome_of(door.for_store(store).accept(to_push(data, source=source, fmt=fmt, opts=opts)))

"""PyTorch profiler (Kineto) Chrome-trace JSON → canonical ``step``, ``collective`` and ``device_union`` frames.

Input is what ``torch.profiler`` writes with ``export_chrome_trace`` / ``tensorboard_trace_handler``:
a JSON object (optionally gzip-compressed, detected by its magic bytes) with ``traceEvents`` in the
Chrome Trace Event Format (https://docs.google.com/document/d/1CvAClvFfyA5R-PhYUmn5OOQtYMH4h6I0nSsKchNAySU),
plus Kineto's top-level metadata: ``distributedInfo`` (rank, world_size, pg_config), ``baseTimeNanoseconds``
(present since PyTorch 2.3, when ``ts`` became relative), ``deviceProperties``.

What comes out:

- one ``step`` row per ``ProfilerStep#N`` span on the host timeline, with the device-side breakdown inside
  that window (docs/ARCHITECTURE.md, "The C³ model"): ``compute_s`` = union of non-communication GPU work (compute
  kernels, memcpy, memset), ``comm_s`` = union of NCCL kernels, ``comm_overlap_s`` = their intersection,
  ``idle_s`` = window − (compute ∪ comm). The window is the host span, so a device interval is sliced by
  when it runs: in steady state the GPU lags the host by about the same amount every step, so each window
  still holds one step's worth of device time and ``compute_s + comm_s − comm_overlap_s + idle_s`` equals
  the window length exactly.
- three ``device_union`` rows, one per HTA event window (everything; launched before the last profiler step;
  through it): the rank's device timeline reduced to the unions Meta's Holistic Trace Analysis makes its
  temporal breakdown and communication/computation overlap of (``fleetscope.core.kernels``), so the service can
  report HTA's figures (``analyzers.c3.hta_breakdown``) without keeping every kernel;
- one ``collective`` row per NCCL kernel (``ncclKernel_*`` before NCCL 2.19, ``ncclDevKernel_*`` after) with
  op, message bytes, group size and process group taken from the kernel's own args (PyTorch ≥ 2.2 copies
  ``Collective name``, ``In msg nelems``, ``Out msg nelems``, ``dtype``, ``Group size``, ``Process Group Name``
  onto it), else from the ``record_param_comms`` CPU op with the same ``External id``, else from the kernel name.

:func:`load` also returns the device timeline (every event with a CUDA stream) and the profiler-step spans
as frames, for analyses that need kernel-level detail (``analyzers.c3.hta_temporal_breakdown``).

:func:`parse_chunks` reads a trace given as an iterable of byte chunks (a file of any size, JSON or gzip) in
bounded memory: ``traceEvents`` is decoded a piece at a time and each piece reduced at once to the columns the
frames need; its Batch is the one :func:`parse` gives for the same bytes.

The module is pure: bytes in, frames out. It raises :class:`fleetscope.core.errors.ParseError` naming the source
and the event (``traceEvents[i].field``) for anything it cannot read.

The pieces: ``ingest.kineto_decode`` (bytes to a trace and its reduced columns), ``ingest.kineto_frames``
(the canonical frames), ``ingest.kineto_stream`` (a trace of any size, piece by piece); this module is the
way in (``parse``, ``parse_many``, ``parse_chunks``) and the format's declaration.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from fleetscope.core.errors import ParseError
from fleetscope.core.frames import Batch
from ingest.format import FormatSpec, Sniff, SniffView
from ingest.kineto_decode import DTYPE_BYTES, KinetoTrace, _reduce, load
from ingest.kineto_frames import _batch, default_job_id
from ingest.kineto_stream import PIECE_BYTES, _load_chunks

__all__ = ["KinetoTrace", "load", "parse", "parse_chunks", "parse_many", "DTYPE_BYTES", "PIECE_BYTES"]


def parse(data: bytes, *, source: str = "", job_id: str | None = None) -> Batch:
    """Parse one rank's Kineto trace into a Batch with ``step``, ``collective``, ``device_union`` and ``job`` frames.

    ``job_id`` defaults to a hash of the bytes, so the same file always maps to the same job.
    Raises :class:`ParseError` (see :func:`load`).
    """
    t = _reduce(load(data, source=source))
    return _batch([t], job_id or default_job_id(bytes(data)), source)


def parse_many(files: Sequence[tuple[str, bytes | Iterable[bytes]]], *, job_id: str,
               piece_bytes: int | None = None) -> Batch:
    """Parse the traces of several ranks of one job together (``files`` = ``(source, data)`` pairs).

    ``data`` is a trace's bytes, or an iterable of its bytes in chunks (a large file read piece by piece),
    which is parsed in bounded memory as in :func:`parse_chunks`. Every file must name a distinct rank in
    ``distributedInfo``; a duplicate is a ParseError naming both sources, since two traces claiming one
    rank would double-count its collectives.
    """
    if not files:
        raise ParseError("no trace files given", source="")
    traces = [
        _reduce(load(d, source=s)) if isinstance(d, (bytes, bytearray, memoryview))
        else _load_chunks(d, s, piece_bytes or PIECE_BYTES)[0]
        for s, d in files
    ]
    seen: dict[int, str] = {}
    for t in traces:
        if t.rank in seen:
            raise ParseError(f"rank {t.rank} also in {seen[t.rank]!r}", source=t.source, field="distributedInfo.rank")
        seen[t.rank] = t.source
    traces.sort(key=lambda t: t.rank)
    return _batch(traces, job_id, ",".join(s for s, _ in files))


def parse_chunks(chunks: Iterable[bytes], *, source: str = "", job_id: str | None = None,
                 piece_bytes: int = PIECE_BYTES) -> Batch:
    """:func:`parse` for a trace given as an iterable of byte chunks (JSON or gzip JSON, e.g. a file read
    in blocks), in memory bounded by ``piece_bytes`` of events at a time plus 25 bytes per device event and 16
    per kernel launch, whatever the trace's size. The Batch is the one :func:`parse` returns for the same bytes.

    Raises :class:`ParseError` naming the source, the byte offset and line (of the decompressed text for
    gzip), and the event (``traceEvents[i]``) where known.
    """
    t, sha = _load_chunks(chunks, source, piece_bytes, hashed=job_id is None)
    return _batch([t], job_id or f"kineto-{sha[:16]}", source)


# --- declaration (ingest.format) ---------------------------------------------------------------------


def _looks_like(view: SniffView) -> bool:
    text = view.text
    return view.is_json and ('"traceEvents"' in text or '"distributedInfo"' in text or ('"schemaVersion"' in text and '"ph"' in text))


# ``parse`` reads a whole trace, plain or gzip. The service bounds what a request may inflate and decodes a
# large body piece by piece with parse_chunks instead (fleetscope.door.ingestion._kineto; fleetscope.door.streaming
# for files), which is the same Batch in bounded memory.
FORMATS = (
    FormatSpec("kineto", "PyTorch profiler (Kineto) trace, .json or .json.gz",
               lambda d, s, o: parse(d, source=s, job_id=o.job_id), sniff=Sniff(10, _looks_like), gzip_aware=True),
)

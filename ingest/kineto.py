"""PyTorch profiler (Kineto) Chrome-trace JSON → canonical ``step`` and ``collective`` frames.

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
"""

from __future__ import annotations

import hashlib
import math
import re
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec
import numpy as np
from isal import igzip, isal_zlib
import polars as pl

from fleetscope.core.errors import ParseError
from fleetscope.core.textinput import MAX_GZIP_MEMBERS
from fleetscope.core.frames import COLLECTIVE, JOB, STEP, UTC_US, Batch
from ingest.format import FormatSpec, Sniff, SniffView

__all__ = ["KinetoTrace", "load", "parse", "parse_chunks", "parse_many", "DTYPE_BYTES", "PIECE_BYTES"]

_GZIP_MAGIC = b"\x1f\x8b"
# HTA's communication-kernel rule (hta/utils/utils.py NCCL_KERNEL_RE): matches both ncclKernel_* and
# ncclDevKernel_*. Kept identical so our comm time and HTA's agree on the same trace.
_NCCL_KERNEL = re.compile(r"^nccl.*Kernel")
_PROFILER_STEP = re.compile(r"ProfilerStep\s*#\s*(\d+)")
# Device-side categories whose time occupies the GPU (Kineto ActivityType names as written in "cat").
_DEVICE_WORK_CATS = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})
# Bounds on timestamps and durations (microseconds). Anything beyond is corrupt input, not a long run:
# 1e17 us is ~3,000 years after 1970; a single event over 30 days is not a profiler trace.
_MAX_TS_US = 1e17
_MAX_DUR_US = 30 * 86400 * 1e6
# ts values above this are epoch microseconds (2001-09-09 and later); below, relative to an unknown origin.
_EPOCH_US_FLOOR = 1e15

# Element sizes for the dtype strings PyTorch writes into record_param_comms args (c10 ScalarType names).
DTYPE_BYTES: dict[str, int] = {
    "Byte": 1, "Char": 1, "Bool": 1, "Float8_e4m3fn": 1, "Float8_e5m2": 1, "Float8_e4m3fnuz": 1,
    "Float8_e5m2fnuz": 1, "UInt8": 1, "Int8": 1, "QInt8": 1, "QUInt8": 1,
    "Short": 2, "Half": 2, "BFloat16": 2, "UInt16": 2, "ComplexHalf": 4,
    "Int": 4, "Float": 4, "UInt32": 4, "QInt32": 4,
    "Long": 8, "Double": 8, "UInt64": 8, "ComplexFloat": 8, "ComplexDouble": 16,
}

# Kineto "Collective name" values and NCCL kernel-name ops → one canonical op name (nccl-tests style).
_OP_ALIASES: dict[str, str] = {
    "allreduce": "all_reduce", "all_reduce": "all_reduce", "allreduce_coalesced": "all_reduce",
    "allgather": "all_gather", "all_gather": "all_gather", "_allgather_base": "all_gather",
    "allgather_into_tensor_coalesced": "all_gather", "allgather_coalesced": "all_gather",
    "all_gather_into_tensor": "all_gather",
    "reducescatter": "reduce_scatter", "reduce_scatter": "reduce_scatter", "_reduce_scatter_base": "reduce_scatter",
    "reduce_scatter_tensor_coalesced": "reduce_scatter", "reduce_scatter_tensor": "reduce_scatter",
    "broadcast": "broadcast", "reduce": "reduce", "alltoall": "all_to_all", "all_to_all": "all_to_all",
    "alltoall_base": "all_to_all", "all_to_allv": "all_to_all", "gather": "gather", "scatter": "scatter",
    "send": "send", "recv": "recv", "sendrecv": "send_recv", "barrier": "barrier",
}


@dataclass(frozen=True)
class KinetoTrace:
    """One rank's trace, decoded.

    ``device_events``: every event HTA treats as device-side (its ``stream`` arg is an int ≠ −1), columns
    ``rank, cat, name, stream, correlation, ts_us, dur_us, launch_ts_us``; ``ts_us`` is as written in the
    file (relative when ``baseTimeNanoseconds`` is present); ``launch_ts_us`` is the earliest host-side event
    (stream −1, e.g. ``cudaLaunchKernel``) with the same ``correlation``, null when none.
    ``profiler_steps``: one row per event named ``ProfilerStep#N``: ``rank, step, name, ts_us, dur_us,
    device_side, cat`` (``device_side``: HTA's GPU-event test, stream ≥ 0 and correlation ≥ 0).
    ``origin_us``: add to ``ts_us`` to get epoch microseconds (0.0 when the trace has no absolute clock).
    """

    source: str
    rank: int
    world_size: int | None
    origin_us: float
    relative_time: bool
    device_events: pl.DataFrame
    profiler_steps: pl.DataFrame
    collectives: pl.DataFrame
    meta: dict[str, Any] = field(default_factory=dict)


# --- decoding ----------------------------------------------------------------------------------
#
# A schema-directed decoder: msgspec reads only the fields below and skips the rest of each event (most of
# a trace's bytes are args we never look at) without building dicts or strings for them. On the shared
# 53 MB trace that is ~2-3x faster than decoding everything with orjson and uses far less memory.
# Values stay ``Any`` so that our own checks (_num, _int_or_minus1) decide what is acceptable and name
# the field; only the shape (an event is an object, args is an object) is enforced by the decoder.
# gc=False: decoded JSON holds no reference cycles, and tracking 200k+ event objects doubled the decode time.


class _Args(msgspec.Struct, gc=False):
    stream: Any = None
    correlation: Any = None
    external_id: Any = msgspec.field(name="External id", default=None)
    collective_name: Any = msgspec.field(name="Collective name", default=None)
    in_nelems: Any = msgspec.field(name="In msg nelems", default=None)
    out_nelems: Any = msgspec.field(name="Out msg nelems", default=None)
    dtype: Any = None
    group_size: Any = msgspec.field(name="Group size", default=None)
    pg_name: Any = msgspec.field(name="Process Group Name", default=None)


_NO_ARGS = _Args()


class _Event(msgspec.Struct, gc=False):
    ph: Any = None
    cat: Any = None
    name: Any = None
    ts: Any = None
    dur: Any = None
    args: _Args | None = None


class _Doc(msgspec.Struct, gc=False):
    traceEvents: list[_Event] | None = None  # noqa: N815 - the file's own key
    distributedInfo: Any = None  # noqa: N815
    baseTimeNanoseconds: Any = None  # noqa: N815
    deviceProperties: Any = None  # noqa: N815


_DECODER = msgspec.json.Decoder(_Doc)
_AT_PATH = re.compile(r" - at `\$\.?(.*)`$")
_AT_BYTE = re.compile(r"\(byte (\d+)\)")


def _decode(data: bytes, source: str) -> _Doc:
    """bytes → the decoded top-level object, with ParseError for anything unreadable."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise ParseError(f"expected bytes, got {type(data).__name__}", source=source)
    if not isinstance(data, bytes):
        data = bytes(data)
    # the first 64 bytes tell empty from not: avoids copying a whole trace just to strip it
    if not data[:64].strip() and not data.strip():
        raise ParseError("empty input", source=source)
    if data[:2] == _GZIP_MAGIC:
        try:
            # ISA-L's inflate: a third of the time of zlib's on the shared traces, same stream format. One
            # member is the profiler's case; anything after it (a multi-member file) takes the general reader.
            inflater = isal_zlib.decompressobj(31)
            out = inflater.decompress(data)
            if not inflater.eof:
                raise EOFError("compressed stream ended before its end marker")
            data = igzip.decompress(data) if inflater.unused_data else out
        except (EOFError, OSError, zlib.error, isal_zlib.error) as e:
            raise ParseError(f"corrupt or truncated gzip stream: {e}", source=source) from None
    try:
        return _DECODER.decode(data)
    except msgspec.ValidationError as e:
        msg = str(e)
        m = _AT_PATH.search(msg)
        where = m.group(1) if m else ""
        if not where:
            raise ParseError("top level must be a JSON object", source=source) from None
        what = msg[: m.start()] if m else msg
        raise ParseError(f"{what}", source=source, field=where) from None
    except RecursionError:
        raise ParseError("JSON nested too deeply", source=source) from None
    except msgspec.DecodeError as e:
        m = _AT_BYTE.search(str(e))
        # a truncated document ends without a position: the error is at its last line
        line = _line_of(data, int(m.group(1)) if m else len(data))
        raise ParseError(f"not valid JSON: {e}", source=source, line=line) from None


def _line_of(data: bytes, pos: int | None) -> int | None:
    return None if pos is None else data.count(b"\n", 0, pos) + 1


def _num(v: Any, source: str, i: int, name: str, *, lo: float, hi: float) -> float:
    """A finite JSON number within [lo, hi]; bool and strings are rejected (Kineto writes plain numbers)."""
    if type(v) is int or type(v) is float:
        if lo <= v <= hi:  # NaN fails both comparisons
            return float(v)
        what = "not finite" if isinstance(v, float) and not math.isfinite(v) else f"out of range [{lo:g}, {hi:g}]"
        raise ParseError(f"value {v!r} is {what}", source=source, field=f"traceEvents[{i}].{name}")
    raise ParseError(f"expected a number, got {type(v).__name__} {v!r:.40}", source=source, field=f"traceEvents[{i}].{name}")


def _int_or_minus1(v: Any) -> int:
    """HTA's stream normalization: anything int() accepts, else −1."""
    if v is None:
        return -1
    try:
        return int(v)
    except (TypeError, ValueError, OverflowError):
        return -1


def _canonical_op(name: str | None) -> str | None:
    if not name:
        return None
    key = name.strip().lower()
    return _OP_ALIASES.get(key, _OP_ALIASES.get(key.lstrip("_"), key))


def _kernel_name_parts(name: str) -> tuple[str | None, str | None, str | None]:
    """(op, algo, proto) from an NCCL kernel name.

    ``ncclKernel_AllReduce_RING_LL_Sum_float(...)`` (NCCL < 2.19: op, algo, proto, redop, type) and
    ``ncclDevKernel_AllReduce_Sum_f32_RING_LL(...)`` (NCCL ≥ 2.19: op, redop, type, algo, proto).
    """
    base = name.split("(", 1)[0]
    parts = base.split("_")
    if len(parts) < 2:
        return None, None, None
    raw = parts[1]
    op = _canonical_op(re.sub(r"(?<!^)(?=[A-Z])", "_", raw).lower().replace("send_recv", "sendrecv"))
    algo = next((p for p in parts[2:] if p in ("RING", "TREE", "COLLNET", "COLLNETDIRECT", "COLLNETCHAIN", "NVLS", "NVLSTREE", "PAT")), None)
    proto = next((p for p in parts[2:] if p in ("LL", "LL128", "SIMPLE")), None)
    return op, algo, proto


def _top(doc: _Doc, source: str) -> tuple[int, int | None, int | None, dict]:
    """(rank, world_size, baseTimeNanoseconds, distributedInfo) from the top-level keys, checked."""
    dist = doc.distributedInfo or {}
    if not isinstance(dist, dict):
        raise ParseError("'distributedInfo' must be an object", source=source, field="distributedInfo")
    rank = dist.get("rank", 0)
    if type(rank) is not int or rank < 0:
        raise ParseError(f"rank {rank!r} is not a non-negative integer", source=source, field="distributedInfo.rank")
    world = dist.get("world_size")
    if world is not None and (type(world) is not int or world < 1):
        raise ParseError(f"world_size {world!r} is not a positive integer", source=source, field="distributedInfo.world_size")
    base_ns = doc.baseTimeNanoseconds
    if base_ns is not None and (type(base_ns) is not int or not 0 <= base_ns < 10**19):
        raise ParseError(f"baseTimeNanoseconds {base_ns!r} is not an epoch in ns", source=source, field="baseTimeNanoseconds")
    return rank, world, base_ns, dist


def _meta(doc: _Doc, dist: dict, rank: int, world: int | None, relative: bool, n_events: int) -> dict[str, Any]:
    meta = {
        "rank": rank,
        "world_size": world,
        "backend": dist.get("backend"),
        "nccl_version": dist.get("nccl_version"),
        "relative_time": relative,
        "events": n_events,
    }
    props = doc.deviceProperties
    if isinstance(props, list) and props and isinstance(props[0], dict):
        meta["device_name"] = props[0].get("name")
    return meta


class _Scan:
    """One pass over a trace's events, given whole (:func:`load`) or piece by piece (:func:`parse_chunks`).

    ``compact``: after each piece, keep only what the step and collective frames need (per device-work
    event: ts, dur and whether it is an NCCL kernel, as numpy columns) and drop the rest, so memory grows
    with the number of device events (17 bytes each), not with the JSON.
    """

    def __init__(self, source: str, *, compact: bool) -> None:
        self.source = source
        self.compact = compact
        # device events as row tuples (one append per event is cheaper than seven); transposed afterwards
        self.dev_rows: list[tuple[str, str, int, int, float, float, int]] = []
        self.nccl: list[tuple[str, int, float, float, int, _Args]] = []  # NCCL kernels, in file order
        self.launch: dict[int, float] = {}  # correlation → earliest host-side ts (HTA's CPU-event set)
        self.comms_by_ext: dict[int, _Args] = {}  # External id → record_param_comms args
        self.s_step: list[int] = []
        self.s_name: list[str] = []
        self.s_ts: list[float] = []
        self.s_dur: list[float] = []
        self.s_dev: list[bool] = []
        self.s_cat: list[str] = []
        self.max_ts = 0.0
        self.n_events = 0
        # compact: per piece, the device-work events' ts, dur and whether each is an NCCL kernel
        self.work_ts: list[np.ndarray] = []
        self.work_dur: list[np.ndarray] = []
        self.work_comm: list[np.ndarray] = []
        self._is_comm: dict[str, bool] = {}

    def feed(self, events: list[_Event], first: int) -> None:
        """Reduce ``events``, the slice of ``traceEvents`` that starts at index ``first``."""
        source = self.source
        dev_append = self.dev_rows.append
        nccl_append = self.nccl.append
        launch = self.launch
        comms_by_ext = self.comms_by_ext
        s_step, s_name, s_ts, s_dur, s_dev, s_cat = self.s_step, self.s_name, self.s_ts, self.s_dur, self.s_dev, self.s_cat
        max_ts = self.max_ts
        sync_names = ("Event Sync", "Context Sync")
        for i, e in enumerate(events, first):
            if e.ph != "X":
                continue  # metadata (M), flows (s/f), instants (i), counters (C): no duration on a timeline
            # The common case inline (a call per value costs a tenth of the whole load); _num decides and
            # names the field for anything else.
            ts, dur = e.ts, e.dur
            if (type(ts) is not float and type(ts) is not int) or not -_MAX_TS_US <= ts <= _MAX_TS_US:
                ts = _num(ts, source, i, "ts", lo=-_MAX_TS_US, hi=_MAX_TS_US)
            if (type(dur) is not float and type(dur) is not int) or not 0.0 <= dur <= _MAX_DUR_US:
                dur = _num(dur, source, i, "dur", lo=0.0, hi=_MAX_DUR_US)
            cat = e.cat
            if cat is None or cat == "Trace":
                continue  # HTA drops rows without cat and the profiler's own "Trace" span; so do we
            if type(cat) is not str:
                raise ParseError(f"cat must be a string, got {type(cat).__name__}", source=source, field=f"traceEvents[{i}].cat")
            name = e.name
            if type(name) is not str:
                raise ParseError(f"name must be a string, got {type(name).__name__}", source=source, field=f"traceEvents[{i}].name")
            args = e.args or _NO_ARGS
            if ts > max_ts:
                max_ts = ts
            stream, corr = args.stream, args.correlation
            if type(stream) is not int:
                stream = -1 if stream is None else _int_or_minus1(stream)
            if type(corr) is not int:
                corr = -1 if corr is None else _int_or_minus1(corr)
            device = (stream >= 0 and corr >= 0) or name in sync_names
            if stream != -1:
                ext = args.external_id
                ext = ext if type(ext) is int else -1
                dev_append((cat, name, stream, corr, ts, dur, ext))
                # kernel args are kept for NCCL kernels only (their collective metadata)
                if cat == "kernel" and _NCCL_KERNEL.match(name):
                    nccl_append((name, stream, ts, dur, ext, args))
            if not device:
                prev = launch.get(corr)
                if prev is None or ts < prev:
                    launch[corr] = ts
                if name == "record_param_comms":
                    ext = args.external_id
                    if type(ext) is int:
                        comms_by_ext[ext] = args
            if "ProfilerStep" in name:
                m = _PROFILER_STEP.search(name)
                if m:
                    s_step.append(int(m.group(1)))
                    s_name.append(name)
                    s_ts.append(ts)
                    s_dur.append(dur)
                    s_dev.append(device)
                    s_cat.append(cat)
        self.max_ts = max_ts
        self.n_events += len(events)
        if self.compact:
            self._compact()

    def _compact(self) -> None:
        is_comm = self._is_comm
        work = [(r[4], r[5], r[1]) for r in self.dev_rows if r[0] in _DEVICE_WORK_CATS]
        self.dev_rows.clear()
        self.launch.clear()  # launch times feed device_events only, which the compact form does not keep
        if not work:
            return
        ts, dur, names = zip(*work)
        flags = []
        for n in names:
            f = is_comm.get(n)
            if f is None:
                f = is_comm[n] = _NCCL_KERNEL.match(n) is not None
            flags.append(f)
        self.work_ts.append(np.array(ts, dtype=np.float64))
        self.work_dur.append(np.array(dur, dtype=np.float64))
        self.work_comm.append(np.array(flags, dtype=bool))

    def steps(self, rank: int) -> pl.DataFrame:
        return pl.DataFrame(
            {
                "rank": pl.Series([rank] * len(self.s_step), dtype=pl.Int64),
                "step": pl.Series(self.s_step, dtype=pl.Int64),
                "name": pl.Series(self.s_name, dtype=pl.String),
                "ts_us": pl.Series(self.s_ts, dtype=pl.Float64),
                "dur_us": pl.Series(self.s_dur, dtype=pl.Float64),
                "device_side": pl.Series(self.s_dev, dtype=pl.Boolean),
                "cat": pl.Series(self.s_cat, dtype=pl.String),
            }
        )

    def check(self) -> None:
        if self.n_events == 0:
            raise ParseError("trace has no events", source=self.source, field="traceEvents")

    def _header(self, doc: _Doc) -> tuple[int, int, Any, bool, float]:
        """rank, world size, distributedInfo, whether timestamps are relative, and the time origin (µs)."""
        self.check()
        rank, world, base_ns, dist = _top(doc, self.source)
        relative = base_ns is None and self.max_ts < _EPOCH_US_FLOOR
        return rank, world, dist, relative, (base_ns / 1000.0 if base_ns is not None else 0.0)

    def trace(self, doc: _Doc) -> KinetoTrace:
        """The whole-trace result (not compact): device timeline, steps and collectives."""
        source = self.source
        rank, world, dist, relative, origin_us = self._header(doc)
        launch = self.launch
        cols = list(zip(*self.dev_rows)) if self.dev_rows else [()] * 7
        d_cat, d_name, d_stream, d_corr, d_ts, d_dur, _ = (list(c) for c in cols)
        dev = pl.DataFrame(
            {
                "rank": pl.Series([rank] * len(d_cat), dtype=pl.Int64),
                "cat": pl.Series(d_cat, dtype=pl.String),
                "name": pl.Series(d_name, dtype=pl.String),
                "stream": pl.Series(d_stream, dtype=pl.Int64),
                "correlation": pl.Series(d_corr, dtype=pl.Int64),
                "ts_us": pl.Series(d_ts, dtype=pl.Float64),
                "dur_us": pl.Series(d_dur, dtype=pl.Float64),
                "launch_ts_us": pl.Series([launch.get(c) for c in d_corr], dtype=pl.Float64),
            }
        )
        coll = _collectives(rank, self.nccl, self.comms_by_ext, world)
        meta = _meta(doc, dist, rank, world, relative, self.n_events)
        return KinetoTrace(source, rank, world, origin_us, relative, dev, self.steps(rank), coll, meta)

    def reduced(self, doc: _Doc) -> _Reduced:
        """The compact result: what the step and collective frames need."""
        source = self.source
        rank, world, dist, relative, origin_us = self._header(doc)
        # one column at a time, each piece list dropped once joined: the peak is ~25 bytes per work event
        ts = _join(self.work_ts, np.float64)
        self.work_ts = []
        end = _join(self.work_dur, np.float64)
        self.work_dur = []
        end += ts
        comm = _join(self.work_comm, np.bool_)
        self.work_comm = []
        coll = _collectives(rank, self.nccl, self.comms_by_ext, world)
        meta = _meta(doc, dist, rank, world, relative, self.n_events)
        return _Reduced(source, rank, world, origin_us, self.steps(rank), coll, ts, end, comm, meta)


def _join(parts: list[np.ndarray], dtype: Any) -> np.ndarray:
    return np.concatenate(parts) if parts else np.empty(0, dtype=dtype)


@dataclass(frozen=True)
class _Reduced:
    """What the canonical frames need of one rank's trace: steps, collectives and the device-work intervals
    (``work_*``: every kernel/memcpy/memset on a stream, in file order, and whether it is an NCCL kernel)."""

    source: str
    rank: int
    world_size: int | None
    origin_us: float
    profiler_steps: pl.DataFrame
    collectives: pl.DataFrame
    work_ts_us: np.ndarray
    work_end_us: np.ndarray
    work_comm: np.ndarray
    meta: dict[str, Any]


def _reduce(t: KinetoTrace) -> _Reduced:
    work = t.device_events.filter(pl.col("cat").is_in(list(_DEVICE_WORK_CATS)))
    ws = work["ts_us"].to_numpy()
    return _Reduced(t.source, t.rank, t.world_size, t.origin_us, t.profiler_steps, t.collectives, ws,
                    ws + work["dur_us"].to_numpy(), work["name"].str.contains(r"^nccl.*Kernel").to_numpy(), t.meta)


def load(data: bytes, *, source: str = "") -> KinetoTrace:
    """Decode one Kineto trace (JSON or gzip JSON bytes) into its device timeline, steps and collectives.

    Raises :class:`ParseError` for undecodable input, a missing or empty ``traceEvents`` list, or an event
    with a non-numeric, non-finite, negative or absurd ``ts``/``dur`` (field ``traceEvents[i].ts``).
    """
    doc = _decode(data, source)
    events = doc.traceEvents
    if events is None:
        raise ParseError("no 'traceEvents' list: not a Chrome/Kineto trace", source=source, field="traceEvents")
    if not isinstance(events, list):
        raise ParseError(f"'traceEvents' must be a list, got {type(events).__name__}", source=source, field="traceEvents")
    if not events:
        raise ParseError("trace has no events", source=source, field="traceEvents")
    _top(doc, source)  # top-level errors first, as before any event is looked at
    scan = _Scan(source, compact=False)
    scan.feed(events, 0)
    return scan.trace(doc)


def _collectives(rank: int, nccl: list[tuple[str, int, float, float, int, _Args]], comms_by_ext: dict[int, _Args],
                 world: int | None) -> pl.DataFrame:
    """One row per NCCL kernel; metadata from the kernel args, else its record_param_comms, else the name."""
    rows: dict[str, list] = {k: [] for k in ("rank", "pg", "stream", "op", "bytes", "nranks", "ts_us", "dur_us", "algo", "proto", "dtype")}
    for name, stream, ts, dur, ext, a in nccl:
        meta = a if a.collective_name is not None or a.in_nelems is not None else comms_by_ext.get(ext, _NO_ARGS)
        op_k, algo, proto = _kernel_name_parts(name)
        coll_name = meta.collective_name
        op = (_canonical_op(coll_name) if isinstance(coll_name, str) else None) or op_k or "unknown"
        dtype = meta.dtype
        size = DTYPE_BYTES.get(dtype) if isinstance(dtype, str) else None
        n_in, n_out = meta.in_nelems, meta.out_nelems
        # nccl-tests' "size": the larger buffer (all-gather's output, reduce-scatter's input).
        nelems = max((x for x in (n_in, n_out) if type(x) is int and x >= 0), default=None)
        group = meta.group_size
        pg = meta.pg_name
        rows["rank"].append(rank)
        rows["pg"].append(str(pg) if pg is not None else None)
        rows["stream"].append(stream)
        rows["op"].append(op)
        rows["bytes"].append(nelems * size if nelems is not None and size is not None else None)
        rows["nranks"].append(group if type(group) is int and group > 0 else world)
        rows["ts_us"].append(ts)
        rows["dur_us"].append(dur)
        rows["algo"].append(algo)
        rows["proto"].append(proto)
        rows["dtype"].append(dtype if isinstance(dtype, str) else None)
    schema = {
        "rank": pl.Int64, "pg": pl.String, "stream": pl.Int64, "op": pl.String, "bytes": pl.Int64,
        "nranks": pl.Int64, "ts_us": pl.Float64, "dur_us": pl.Float64, "algo": pl.String, "proto": pl.String,
        "dtype": pl.String,
    }
    return pl.DataFrame(rows, schema=schema)


# --- canonical frames ----------------------------------------------------------------------------


def _union_s(starts, ends) -> float:
    """Length (in the input unit) of the union of intervals [starts[i], ends[i])."""
    if len(starts) == 0:
        return 0.0
    order = np.argsort(starts, kind="stable")
    s, e = starts[order], ends[order]
    run_end = np.maximum.accumulate(e)
    # a new merged block starts where an interval begins after everything before it has ended
    new = np.empty(len(s), dtype=bool)
    new[0] = True
    new[1:] = s[1:] > run_end[:-1]
    idx = np.flatnonzero(new)
    block_end = np.append(run_end[idx[1:] - 1], run_end[-1])
    return float(np.sum(block_end - s[idx]))


def _step_rows(t: _Reduced, job_id: str) -> pl.DataFrame:
    # the host-side span (user_annotation); the GPU-annotation copy newer PyTorch writes is a device view
    host = (
        t.profiler_steps.filter(~pl.col("device_side") & (pl.col("cat") != "gpu_user_annotation"))
        .unique("step", keep="first")
        .sort("ts_us")
    )
    if host.height == 0:
        return STEP.empty()
    is_comm, ws, we = t.work_comm, t.work_ts_us, t.work_end_us
    out: dict[str, list] = {k: [] for k in ("step", "start_us", "end_us", "compute_s", "comm_s", "comm_overlap_s", "idle_s")}
    for step, s0, d in host.select("step", "ts_us", "dur_us").iter_rows():
        s1 = s0 + d
        inside = (we > s0) & (ws < s1)
        cs, ce = np.clip(ws[inside], s0, s1), np.clip(we[inside], s0, s1)
        comm = is_comm[inside]
        comp_us = _union_s(cs[~comm], ce[~comm])
        comm_us = _union_s(cs[comm], ce[comm])
        busy_us = _union_s(cs, ce)
        overlap_us = comp_us + comm_us - busy_us  # |A ∩ B| = |A| + |B| − |A ∪ B|
        out["step"].append(step)
        out["start_us"].append(s0)
        out["end_us"].append(s1)
        out["compute_s"].append(comp_us / 1e6)
        out["comm_s"].append(comm_us / 1e6)
        out["comm_overlap_s"].append(max(overlap_us, 0.0) / 1e6)
        out["idle_s"].append(max(d - busy_us, 0.0) / 1e6)
    df = pl.DataFrame(out)
    return df.select(
        pl.lit(job_id, pl.String).alias("job_id"),
        pl.lit(t.rank, pl.Int64).alias("rank"),
        pl.col("step").cast(pl.Int64),
        _to_ts(pl.col("start_us"), t.origin_us).alias("start"),
        _to_ts(pl.col("end_us"), t.origin_us).alias("end"),
        "compute_s",
        "comm_s",
        "comm_overlap_s",
        "idle_s",
        pl.lit(None, pl.Int64).alias("tokens"),
        pl.lit(None, pl.Float64).alias("model_flops"),
    )


def _to_ts(expr: pl.Expr, origin_us: float) -> pl.Expr:
    return (expr + origin_us).round(0).cast(pl.Int64).cast(UTC_US)


def _collective_rows(t: _Reduced, job_id: str) -> pl.DataFrame:
    c = t.collectives
    if c.height == 0:
        return COLLECTIVE.empty()
    # comm_id: the process group's name where PyTorch recorded it (the same string on every member rank);
    # otherwise the CUDA stream the kernel ran on, which NCCL keeps per communicator.
    c = c.with_columns(
        pl.when(pl.col("pg").is_not_null()).then("pg:" + pl.col("pg")).otherwise("stream:" + pl.col("stream").cast(pl.String)).alias("comm_id")
    ).sort("comm_id", "ts_us")
    # seq: position of the op in its communicator on this rank. NCCL requires every member to issue the
    # ops of a communicator in the same order, so equal (comm_id, seq) on two ranks is the same collective
    # when their traces cover the same steps (the profiler schedule is the same on every rank).
    c = c.with_columns(pl.int_range(pl.len()).over("comm_id").cast(pl.Int64).alias("seq"))
    dur_s = pl.col("dur_us") / 1e6
    algbw = pl.when(dur_s > 0).then(pl.col("bytes") / dur_s / 1e9)
    # busbw = algbw × the share of the message each rank moves over its slowest link (nccl-tests
    # doc/PERFORMANCE.md), so busbw is comparable to link peak whatever the rank count.
    n = pl.col("nranks").cast(pl.Float64)
    factor = (
        pl.when(pl.col("op") == "all_reduce").then(2 * (n - 1) / n)
        .when(pl.col("op").is_in(["all_gather", "reduce_scatter", "all_to_all"])).then((n - 1) / n)
        .otherwise(pl.lit(1.0))
    )
    return c.select(
        pl.lit(job_id, pl.String).alias("job_id"),
        pl.col("rank"),
        pl.col("comm_id"),
        pl.col("seq"),
        pl.col("op"),
        pl.col("bytes"),
        pl.col("nranks"),
        _to_ts(pl.col("ts_us"), t.origin_us).alias("start"),
        dur_s.alias("duration_s"),
        algbw.alias("algbw_gbps"),
        (algbw * factor).alias("busbw_gbps"),
        pl.col("algo"),
        pl.col("proto"),
        pl.col("dtype"),
        pl.lit(None, pl.String).alias("host"),
        pl.lit(None, pl.String).alias("gpu_uuid"),
    ).sort("rank", "comm_id", "seq")


def default_job_id(data: bytes) -> str:
    """The job id of a trace ingested without one: from the hash of its bytes as given (compressed or
    not), so re-ingesting the same file lands on the same natural keys (idempotent writes)."""
    return "kineto-" + hashlib.sha256(data).hexdigest()[:16]


def _batch(traces: Sequence[_Reduced], job_id: str, source: str) -> Batch:
    steps = pl.concat([_step_rows(t, job_id) for t in traces], how="vertical_relaxed")
    colls = pl.concat([_collective_rows(t, job_id) for t in traces], how="vertical_relaxed")
    worlds = {t.world_size for t in traces if t.world_size is not None}
    world = max(worlds) if worlds else None
    job = pl.DataFrame({"job_id": [job_id], "world_size": [world]}, schema={"job_id": pl.String, "world_size": pl.Int64})
    job = job.select([pl.col(c) if c in job.columns else pl.lit(None, dt).alias(c) for c, dt in JOB.schema.items()])
    return Batch(
        source=source,
        job=job,
        step=steps.select(list(STEP.names)).cast(STEP.schema),
        # Kineto kernels are collectives or p2p ops without a recorded peer: peer stays -1.
        collective=colls.with_columns(pl.lit(-1, pl.Int64).alias("peer")).select(list(COLLECTIVE.names)).cast(COLLECTIVE.schema),
        meta={"kineto": [dict(t.meta, source=t.source) for t in traces]},
    )


def parse(data: bytes, *, source: str = "", job_id: str | None = None) -> Batch:
    """Parse one rank's Kineto trace into a Batch with ``step``, ``collective`` and ``job`` frames.

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


# --- streamed decoding -----------------------------------------------------------------------------
#
# A trace is one JSON object whose ``traceEvents`` array holds nearly all of its bytes. The streamed path
# reads the object's top level itself, keeps the other (small) top-level values to decode at the end, and
# cuts the array into pieces of about PIECE_BYTES at event boundaries. Each piece is decoded by the same
# msgspec schema as a whole file and reduced at once (_Scan, compact), so the results are the same.
#
# Finding a boundary without tokenizing every byte in Python: the last ``}`` that is followed by ``,{``
# or ``]`` is a candidate end of an event, and decoding ``[`` + piece + ``]`` validates it, because a JSON
# parser's state at a position depends only on the bytes before it: if the prefix closed by ``]`` is a
# valid array, the array's real parser is between two elements at that point too. A candidate inside a
# string or a nested object fails to decode; after two misses an exact (slower) scanner of strings and
# brackets finds the boundary, so adversarial strings cost time, never a wrong cut.

PIECE_BYTES = 16 * 2**20
_MAX_EVENT_BYTES = 32 * 2**20  # one event (or the bytes of one piece) larger than this is refused: real ones are KBs
_MAX_TOP_BYTES = 64 * 2**20  # the top-level values other than traceEvents, together
_OUT_BLOCK = 8 * 2**20  # most decompressed bytes produced per inflate call: bounds a gzip bomb's buffer
_EVENTS_DECODER = msgspec.json.Decoder(list[_Event])
_RAW_LIST = msgspec.json.Decoder(list[msgspec.Raw])
_AFTER_EVENT = re.compile(rb"[ \t\r\n]*(?:,[ \t\r\n]*\{|\])")
_WS = b" \t\r\n"
# a complete JSON string (escapes included), else a lone quote (a string the buffer cuts), else a bracket
_TOKEN = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"|"|[\[\]{},]')
_AT_ITEM = re.compile(r" - at `\$\[(\d+)\](.*)`$")


class _Inflow:
    """Decompressed bytes of a trace given as raw chunks (gzip detected by its magic); with ``hashed``, the
    sha256 of the raw bytes (the default job id) as well."""

    def __init__(self, chunks: Iterable[bytes], source: str, block: int, *, hashed: bool) -> None:
        self.it = iter(chunks)
        self.source = source
        self.block = block
        self.sha = hashlib.sha256() if hashed else None
        self.raw_bytes = 0  # raw bytes taken so far
        self.members = 1
        self.gz: bool | None = None
        self.pending = b""  # raw bytes not yet inflated (or, before detection, not yet returned)
        self.inflater: Any = None
        self.raw_done = False

    def _raw(self) -> bytes:
        for chunk in self.it:
            if chunk:
                chunk = bytes(chunk)
                if self.sha is not None:
                    self.sha.update(chunk)
                self.raw_bytes += len(chunk)
                return chunk
        self.raw_done = True
        return b""

    def read(self) -> bytes:
        """The next decompressed block; b"" at the end."""
        if self.gz is None:
            head = self.pending
            while len(head) < 2 and not self.raw_done:
                head += self._raw()
            self.gz = head[:2] == _GZIP_MAGIC
            self.pending = head
            if self.gz:
                self.inflater = isal_zlib.decompressobj(31)
        if not self.gz:
            out, self.pending = self.pending, b""
            return out or self._raw()
        try:
            while True:
                if not self.pending and not self.raw_done:
                    self.pending = self._raw()
                if self.inflater.eof:
                    rest = self.inflater.unused_data + self.pending
                    if not rest and self.raw_done:
                        return b""
                    if len(rest) < 2 and not self.raw_done:
                        self.pending = rest + self._raw()
                        continue
                    if rest[:2] != _GZIP_MAGIC:  # as igzip.decompress: only another member may follow
                        raise isal_zlib.error("data after the end of the gzip stream is not another member")
                    self.members += 1
                    if self.members > MAX_GZIP_MEMBERS:
                        raise isal_zlib.error(f"more than {MAX_GZIP_MEMBERS} gzip members")
                    self.inflater = isal_zlib.decompressobj(31)
                    self.pending = rest
                if not self.pending and self.raw_done:
                    raise EOFError("compressed stream ended before its end marker")
                out = self.inflater.decompress(self.pending, self.block)
                self.pending = self.inflater.unconsumed_tail
                if out:
                    return out
        except (EOFError, OSError, zlib.error, isal_zlib.error) as e:
            raise ParseError(f"corrupt or truncated gzip stream near byte {self.raw_bytes - len(self.pending)} of the file: {e}",
                             source=self.source) from None


class _Cursor:
    """A window on the decompressed text: ``buf[pos:]`` is unread; ``base`` and ``line0`` place ``buf[0]``."""

    def __init__(self, inflow: _Inflow, source: str) -> None:
        self.inflow = inflow
        self.source = source
        self.buf = b""
        self.pos = 0
        self.base = 0  # decompressed offset of buf[0]
        self.line0 = 1  # line of buf[0]
        self.eof = False

    def fill(self) -> bool:
        """Append the next block, dropping what is read; False at the end of input."""
        if self.eof:
            return False
        block = self.inflow.read()
        if not block:
            self.eof = True
            return False
        if self.pos:
            self.line0 += self.buf.count(b"\n", 0, self.pos)
            self.base += self.pos
            self.buf = self.buf[self.pos:] + block
            self.pos = 0
        else:
            self.buf = self.buf + block if self.buf else block
        return True

    def error(self, message: str, at: int | None = None, field: str | None = None) -> ParseError:
        at = self.pos if at is None else at
        gz = " of the decompressed stream" if self.inflow.gz else ""
        line = self.line0 + self.buf.count(b"\n", 0, at)
        return ParseError(f"{message} (byte {self.base + at}{gz})", source=self.source, line=line, field=field)

    def peek(self) -> int | None:
        """The next non-blank byte (consumed blanks only), None at the end of input."""
        while True:
            n = len(self.buf)
            p = self.pos
            while p < n and self.buf[p] in _WS:
                p += 1
            self.pos = p
            if p < n:
                return self.buf[p]
            if not self.fill():
                return None

    def expect(self, char: bytes, what: str) -> None:
        c = self.peek()
        if c != char[0]:
            got = "the end of input" if c is None else repr(chr(c))
            raise self.error(f"expected {what}, got {got}")
        self.pos += 1

    def value_end(self, limit: int, what: str) -> int:
        """End (exclusive) of the JSON value at ``pos``, reading more as needed. The value's syntax is
        checked later by the decoder; this only finds where it stops (strings and nesting respected)."""
        start = self.pos
        while True:
            depth = 0
            for m in _TOKEN.finditer(self.buf, self.pos):
                t = self.buf[m.start()]
                if t == 0x22:  # "
                    if m.end() - m.start() == 1:
                        break  # a string the buffer cuts: read more
                    if depth == 0:
                        return m.end()
                elif t in b"[{":
                    depth += 1
                elif t in b"]}":
                    if depth == 0:
                        return m.start()
                    depth -= 1
                    if depth == 0:
                        return m.end()
                elif depth == 0:  # a comma ends a scalar
                    return m.start()
            if len(self.buf) - start > limit:
                raise self.error(f"{what} is longer than {limit >> 20} MiB", at=start)
            self.pos = start  # fill() keeps buf[pos:]
            if not self.fill():
                if depth == 0 and len(self.buf) > self.pos:
                    return len(self.buf)  # a scalar at the very end: the missing '}' is reported after
                raise self.error(f"input ends inside {what}", at=len(self.buf))
            start = self.pos

    def string(self) -> tuple[bytes, str]:
        """(raw, decoded) JSON string at ``pos``."""
        if self.peek() != 0x22:
            c = self.peek()
            raise self.error(f"expected a key string, got {'the end of input' if c is None else repr(chr(c))}")
        end = self.value_end(_MAX_TOP_BYTES, "a key")
        raw = self.buf[self.pos:end]
        try:
            key = msgspec.json.decode(raw)
        except msgspec.DecodeError as e:
            raise self.error(f"not a valid JSON string: {e}") from None
        if not isinstance(key, str):
            raise self.error("expected a key string")
        self.pos = end
        return raw, key


def _event_end(buf: bytes, start: int) -> tuple[int | None, bool]:
    """Exact scan from an event's start: (end of the last complete event in ``buf``, or None; whether the
    array's closing ``]`` was reached)."""
    depth = 0
    last = None
    for m in _TOKEN.finditer(buf, start):
        t = buf[m.start()]
        if t == 0x22:
            if m.end() - m.start() == 1:
                break
        elif t in b"[{":
            depth += 1
        elif t in b"]}":
            depth -= 1
            if depth == 0:
                last = m.end()
            elif depth < 0:
                return last, True
    return last, False


def _events_closed(buf: bytes, start: int, stop: int) -> int:
    """How many whole events ``buf[start:stop]`` holds (an error path: a Python-speed scan)."""
    depth = n = 0
    for m in _TOKEN.finditer(buf, start, stop):
        t = buf[m.start()]
        if t in b"[{":
            depth += 1
        elif t in b"]}":
            depth -= 1
            n += depth == 0
    return n


class _EventReader:
    """Decodes ``traceEvents`` piece by piece from a cursor just past its ``[``, feeding a scan."""

    def __init__(self, cur: _Cursor, scan: _Scan, piece_bytes: int) -> None:
        self.cur = cur
        self.scan = scan
        self.piece = max(1, piece_bytes)
        self.index = 0  # traceEvents index of the next event

    def run(self) -> None:
        cur = self.cur
        first = True
        while True:
            while len(cur.buf) - cur.pos < self.piece and cur.fill():
                pass
            c = cur.peek()
            if c is None:
                raise cur.error("input ends inside traceEvents (truncated file?)", field=f"traceEvents[{self.index}]")
            if c == 0x5D:  # ]
                cur.pos += 1
                return
            if not first:
                if c != 0x2C:
                    raise cur.error(f"expected ',' or ']' after an event, got {chr(c)!r}", field=f"traceEvents[{self.index}]")
                cur.pos += 1
                c = cur.peek()
            if c != 0x7B:  # {
                got = "the end of input" if c is None else repr(chr(c))
                raise cur.error(f"expected an event object, got {got}", field=f"traceEvents[{self.index}]")
            first = False
            self._piece()

    def _piece(self) -> None:
        """Decode and feed the complete events at ``pos`` (at least one), reading more if none is complete."""
        cur = self.cur
        tried = 0  # bytes from the event's start at the last attempt that found no whole event
        while True:
            buf, start = cur.buf, cur.pos
            size = len(buf) - start
            # Look again only once the text has doubled (or ends): each look scans from the event's start,
            # so one huge event would otherwise cost time quadratic in its size, fill after fill.
            if size >= 2 * tried or cur.eof:
                k = buf.rfind(b"}", start)
                misses = 0
                while k > start and misses < 2:
                    if _AFTER_EVENT.match(buf, k + 1):
                        events = self._decode(start, k + 1, final=False)
                        if events is not None:
                            return self._feed(events, k + 1)
                        misses += 1
                    k = buf.rfind(b"}", start, k)
                end, _ = _event_end(buf, start)
                if end is not None and (misses or end < len(buf) or cur.eof):
                    return self._feed(self._decode(start, end, final=True), end)
                if cur.eof:
                    raise cur.error("input ends inside an event (truncated file?)", at=len(cur.buf), field=f"traceEvents[{self.index}]")
                tried = max(size, 1)
            if size > _MAX_EVENT_BYTES:
                raise cur.error(f"no end of event within {_MAX_EVENT_BYTES >> 20} MiB", at=start, field=f"traceEvents[{self.index}]")
            cur.fill()

    def _decode(self, start: int, end: int, *, final: bool) -> list[_Event] | None:
        """The events in ``buf[start:end]``; None (unless ``final``) if that is not a run of whole events."""
        cur = self.cur
        text = b"[" + cur.buf[start:end] + b"]"
        field = f"traceEvents[{self.index}]"
        try:
            return _EVENTS_DECODER.decode(text)
        except msgspec.ValidationError as e:
            # The typed decoder stops at the first ill-typed event: only a syntax check of the whole text
            # tells a bad event at a real boundary from a cut inside an event.
            try:
                _RAW_LIST.decode(text)
            except (msgspec.DecodeError, RecursionError) as syntax:
                if not final:
                    return None
                if isinstance(syntax, RecursionError):
                    raise cur.error("JSON nested too deeply", at=start, field=field) from None
                raise self._syntax(syntax, start, end) from None
            msg = str(e)
            m = _AT_ITEM.search(msg)
            if m is None:
                raise cur.error(msg, at=start, field=field) from None
            raise cur.error(msg[: m.start()], at=start, field=f"traceEvents[{self.index + int(m.group(1))}]{m.group(2)}") from None
        except RecursionError:
            if not final:
                return None
            raise cur.error("JSON nested too deeply", at=start, field=field) from None
        except msgspec.DecodeError as e:
            if not final:
                return None
            raise self._syntax(e, start, end) from None

    def _syntax(self, e: Exception, start: int, end: int) -> ParseError:
        m = _AT_BYTE.search(str(e))
        at = min(max(start + int(m.group(1)) - 1 if m else end, start), end)
        # the bytes before the error are valid JSON, so counting the events they close is exact
        n = _events_closed(self.cur.buf, start, at)
        return self.cur.error(f"not valid JSON: {_AT_BYTE.sub('', str(e)).strip()}", at=at, field=f"traceEvents[{self.index + n}]")

    def _feed(self, events: list[_Event], end: int) -> None:
        self.scan.feed(events, self.index)
        self.index += len(events)
        self.cur.pos = end


def _load_chunks(chunks: Iterable[bytes], source: str, piece_bytes: int, *, hashed: bool = False) -> tuple[_Reduced, str | None]:
    """Stream one trace: (its reduction, sha256 hex of the raw bytes if ``hashed``)."""
    inflow = _Inflow(chunks, source, min(_OUT_BLOCK, max(1, piece_bytes)), hashed=hashed)
    cur = _Cursor(inflow, source)
    scan = _Scan(source, compact=True)
    c = cur.peek()
    if c is None:
        raise ParseError("empty input", source=source)
    if c != 0x7B:
        raise cur.error("top level must be a JSON object")
    cur.pos += 1
    others: list[bytes] = []
    kept = 0
    seen_events = False
    if cur.peek() == 0x7D:
        cur.pos += 1
    else:
        while True:
            raw_key, key = cur.string()
            cur.expect(b":", "':' after a key")
            c = cur.peek()
            if key == "traceEvents":
                if seen_events:
                    raise cur.error("'traceEvents' given twice", field="traceEvents")
                seen_events = True
                if c == 0x5B:
                    cur.pos += 1
                    _EventReader(cur, scan, piece_bytes).run()
                else:
                    end = cur.value_end(_MAX_TOP_BYTES, "'traceEvents'")
                    try:
                        value = msgspec.json.decode(cur.buf[cur.pos:end])
                    except (msgspec.DecodeError, RecursionError):
                        value = ...
                    if value is not None:
                        what = "invalid JSON" if value is ... else type(value).__name__
                        raise cur.error(f"'traceEvents' must be an array, got {what}", field="traceEvents")
                    seen_events = False  # null: as if absent
                    cur.pos = end
            else:
                end = cur.value_end(_MAX_TOP_BYTES, f"top-level value {key!r}")
                raw = cur.buf[cur.pos:end]
                try:
                    msgspec.json.decode(raw)
                except (msgspec.DecodeError, RecursionError) as e:
                    raise cur.error(f"not valid JSON: {e}", field=key) from None
                kept += len(raw)
                if kept > _MAX_TOP_BYTES:
                    raise cur.error(f"top-level values other than traceEvents exceed {_MAX_TOP_BYTES >> 20} MiB", field=key)
                others.append(raw_key + b":" + raw)
                cur.pos = end
            c = cur.peek()
            if c == 0x2C:
                cur.pos += 1
                continue
            if c == 0x7D:
                cur.pos += 1
                break
            got = "the end of input" if c is None else repr(chr(c))
            raise cur.error(f"expected ',' or '}}' in the top-level object, got {got}")
    if cur.peek() is not None:
        raise cur.error("data after the top-level object")
    while inflow.read():  # drain: a gzip member's trailer and the hash cover the whole file
        pass
    if not seen_events:
        raise ParseError("no 'traceEvents' list: not a Chrome/Kineto trace", source=source, field="traceEvents")
    try:
        doc = _DECODER.decode(b"{" + b",".join(others) + b"}")
    except msgspec.ValidationError as e:
        msg = str(e)
        m = _AT_PATH.search(msg)
        raise ParseError(msg[: m.start()] if m else msg, source=source, field=m.group(1) if m else None) from None
    return scan.reduced(doc), inflow.sha.hexdigest() if inflow.sha is not None else None


def parse_chunks(chunks: Iterable[bytes], *, source: str = "", job_id: str | None = None,
                 piece_bytes: int = PIECE_BYTES) -> Batch:
    """:func:`parse` for a trace given as an iterable of byte chunks (JSON or gzip JSON, e.g. a file read
    in blocks), in memory bounded by ``piece_bytes`` of events at a time plus 17 bytes per device-work
    event, whatever the trace's size. The Batch is the one :func:`parse` returns for the same bytes.

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

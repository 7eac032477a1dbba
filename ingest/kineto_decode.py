"""Kineto trace decoding: a whole trace's bytes (plain or gzip) to a ``KinetoTrace`` (``load``) and to the
columns the frames need (``_reduce``, ``_Scan``). What the fields mean, and the trace format, are in
``ingest.kineto``; the frames are built by ``ingest.kineto_frames``, a trace in pieces read by
``ingest.kineto_stream``.
"""

from __future__ import annotations

import math
import re
import zlib
from dataclasses import dataclass, field
from typing import Any

import msgspec
import numpy as np
from isal import igzip, isal_zlib
import polars as pl

from fleetscope.core import kernels
from fleetscope.core.errors import ParseError

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

    ``compact``: after each piece, keep only what the step, collective and device_union frames need (per device
    event: ts, dur, HTA kernel class with whether it is device work and a GPU event, and its correlation id, as
    numpy columns; per host-side correlation id its earliest ts, HTA's launch time) and drop the rest, so memory
    grows with the number of device events (25 bytes each, 16 per launch), not with the JSON.
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
        # compact: per piece, every device event's ts, dur, flags (HTA kernel class, device work, GPU event) and
        # correlation id, and the host-side events' earliest ts per correlation id (HTA's launch times)
        self.dev_ts: list[np.ndarray] = []
        self.dev_dur: list[np.ndarray] = []
        self.dev_flags: list[np.ndarray] = []
        self.dev_corr: list[np.ndarray] = []
        self.launch_corr: list[np.ndarray] = []
        self.launch_ts: list[np.ndarray] = []
        self._kinds: dict[str, int] = {}

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
        launch = self.launch
        if launch:
            self.launch_corr.append(np.fromiter(launch.keys(), np.int64, len(launch)))
            self.launch_ts.append(np.fromiter(launch.values(), np.float64, len(launch)))
            launch.clear()
        if not self.dev_rows:
            return
        cat, name, stream, corr, ts, dur, _ = zip(*self.dev_rows)
        self.dev_rows.clear()
        stream_a, corr_a = np.array(stream, dtype=np.int64), np.array(corr, dtype=np.int64)
        gpu = ((stream_a >= 0) & (corr_a >= 0)) | np.fromiter((n in kernels.SYNC_EVENT_NAMES for n in name), bool, len(name))
        work = np.fromiter((c in _DEVICE_WORK_CATS for c in cat), bool, len(cat))
        flags = kernels.kind_codes(name, self._kinds) | (work.astype(np.uint8) << 2) | (gpu.astype(np.uint8) << 3)
        self.dev_ts.append(np.array(ts, dtype=np.float64))
        self.dev_dur.append(np.array(dur, dtype=np.float64))
        self.dev_flags.append(flags)
        self.dev_corr.append(corr_a)

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
        # one column at a time, each piece list dropped once joined
        ts = _join(self.dev_ts, np.float64)
        self.dev_ts = []
        dur = _join(self.dev_dur, np.float64)
        self.dev_dur = []
        flags = _join(self.dev_flags, np.uint8)
        self.dev_flags = []
        corr = _join(self.dev_corr, np.int64)
        self.dev_corr = []
        launch = _launch_times(corr, _join(self.launch_corr, np.int64), _join(self.launch_ts, np.float64))
        self.launch_corr, self.launch_ts = [], []
        del corr
        steps = self.steps(rank)
        kinds = flags & 3
        unions = _device_unions(ts, dur, kinds, (flags & 8) != 0, launch, steps)
        del launch
        work = (flags & 4) != 0
        work_ts = ts[work]
        del ts
        end = dur[work]
        del dur
        end += work_ts
        comm = kinds[work] == kernels.COMMUNICATION
        coll = _collectives(rank, self.nccl, self.comms_by_ext, world)
        meta = _meta(doc, dist, rank, world, relative, self.n_events)
        return _Reduced(source, rank, world, origin_us, steps, coll, work_ts, end, comm, meta, *unions)


def _join(parts: list[np.ndarray], dtype: Any) -> np.ndarray:
    return np.concatenate(parts) if parts else np.empty(0, dtype=dtype)


@dataclass(frozen=True)
class _Reduced:
    """What the canonical frames need of one rank's trace: steps, collectives, the device-work intervals
    (``work_*``: every kernel/memcpy/memset on a stream, in file order, and whether it is an NCCL kernel), and
    the device timeline's unions per HTA event window (``unions``; ``device_start_us``, the first device event
    rounded up, None when the trace has none)."""

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
    device_start_us: float | None = None
    unions: dict[str, kernels.Unions] = field(default_factory=dict)


def _launch_times(corr: np.ndarray, host_corr: np.ndarray, host_ts: np.ndarray) -> np.ndarray:
    """Each device event's launch time: the earliest host-side event with its correlation id (NaN when none),
    from the host-side (correlation, earliest ts) pairs gathered piece by piece."""
    if len(host_corr) == 0:
        return np.full(len(corr), np.nan)
    order = np.lexsort((host_ts, host_corr))
    hc, ht = host_corr[order], host_ts[order]
    first = np.empty(len(hc), dtype=bool)
    first[0] = True
    first[1:] = hc[1:] != hc[:-1]
    hc, ht = hc[first], ht[first]
    at = np.minimum(np.searchsorted(hc, corr), len(hc) - 1)
    return np.where(hc[at] == corr, ht[at], np.nan)


def _device_unions(ts: np.ndarray, dur: np.ndarray, kinds: np.ndarray, gpu: np.ndarray, launch: np.ndarray,
                   steps: pl.DataFrame) -> tuple[float | None, dict[str, kernels.Unions]]:
    """The trace's device events reduced per HTA event window (``fleetscope.core.kernels.window_unions``), against
    the trace's host-side profiler steps; and its first device event, rounded up as HTA rounds starts."""
    if len(ts) == 0:
        return None, {}
    host = steps.filter(~pl.col("device_side"))
    found = kernels.window_unions(ts, dur, kinds, gpu, launch, host["ts_us"].to_numpy(), host["dur_us"].to_numpy())
    return float(np.min(np.ceil(ts))), found


def _reduce(t: KinetoTrace) -> _Reduced:
    dev = t.device_events
    kinds = kernels.kind_codes(dev["name"].to_list())
    gpu = (((dev["stream"] >= 0) & (dev["correlation"] >= 0)) | dev["name"].is_in(kernels.SYNC_EVENT_NAMES)).to_numpy()
    unions = _device_unions(dev["ts_us"].to_numpy(), dev["dur_us"].to_numpy(), kinds, gpu,
                            dev["launch_ts_us"].fill_null(np.nan).to_numpy(), t.profiler_steps)
    work = dev.filter(pl.col("cat").is_in(list(_DEVICE_WORK_CATS)))
    ws = work["ts_us"].to_numpy()
    return _Reduced(t.source, t.rank, t.world_size, t.origin_us, t.profiler_steps, t.collectives, ws,
                    ws + work["dur_us"].to_numpy(), work["name"].str.contains(r"^nccl.*Kernel").to_numpy(), t.meta, *unions)


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

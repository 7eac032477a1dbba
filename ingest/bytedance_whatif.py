"""Per-operation traces of ByteDance's straggler what-if artifact → an operation frame for
``analyzers.stragglers.whatif``.

Format (github.com/ByteDance-Seed/StragglerAnalysis, ``data/trace-*.parquet`` and ``meta-*.yaml``, the
artifact of Lin et al., "Understanding Stragglers in Large Model Training Using What-if Analysis",
OSDI 2025): one Parquet row per recorded operation of one worker in one training step, columns
``dp_rank, stage, rank, step, optype, start_ts, duration, seq_id, mc, mb_id, gmc``. ``start_ts`` and
``duration`` are seconds, ``start_ts`` relative to the start of its step; ``optype`` is one of
forward/backward-compute, forward/backward-send/recv, grads-reduce-scatter, params-all-gather,
(layernorm|embedding)-grads-all-reduce, optimizer, optimizer-clip-main-grad, gc; ``seq_id`` numbers the
ops of one type on one worker in one step; ``mb_id`` is the micro-batch of a compute op (−1 otherwise),
``gmc`` its global model chunk. The YAML sidecar holds the parallel sizes (``dp_size``, ``pp_size``,
``tp_size``, ``dsp_size``, ``vpp_size``, ``world_size``) as flat ``key: value`` lines.

:func:`parse` returns the operations as their own frame (units in the names: ``start_s``,
``duration_s``); :func:`to_batch` makes them the canonical ``job_op`` frame of one job, which is how the
format ``bytedance_whatif`` enters the store (it must be named: Parquet is binary and is not sniffed; the
job id is required, and the time received stamps the rows, since the ops carry only step-relative times).
Pure: bytes in, frame out.
"""

from __future__ import annotations

import io
import re
from dataclasses import dataclass

import datetime as dt

import polars as pl

from fleetscope.core.errors import ParseError
from fleetscope.core.frames import JOB_OP, Batch
from ingest.format import FormatSpec

__all__ = ["WhatifTrace", "OP_SCHEMA", "parse", "parse_meta", "to_batch", "FORMATS"]

OP_SCHEMA: dict[str, pl.DataType] = {
    "dp_rank": pl.Int64,
    "stage": pl.Int64,
    "rank": pl.Int64,
    "step": pl.Int64,
    "optype": pl.String,
    "start_s": pl.Float64,
    "duration_s": pl.Float64,
    "seq_id": pl.Int64,
    "mc": pl.Int64,
    "mb_id": pl.Int64,
    "gmc": pl.Int64,
}
_RENAME = {"start_ts": "start_s", "duration": "duration_s"}
_META_INTS = ("dp_size", "pp_size", "tp_size", "dsp_size", "vpp_size", "world_size", "run_id")


@dataclass(frozen=True)
class WhatifTrace:
    """One job's operations (``ops``, :data:`OP_SCHEMA`) and its parallel layout (``meta``)."""

    ops: pl.DataFrame
    meta: dict[str, object]
    source: str = ""


def parse_meta(data: bytes, *, source: str = "") -> dict[str, object]:
    """The flat ``key: value`` YAML sidecar; the sizes become integers ≥ 1 (run_id ≥ 0)."""
    try:
        text = bytes(data).decode("utf-8")
    except UnicodeDecodeError:
        raise ParseError("meta file is not UTF-8 text", source=source) from None
    meta: dict[str, object] = {}
    for lineno, line in enumerate(text.splitlines(), start=1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        m = re.fullmatch(r"([A-Za-z_][A-Za-z0-9_]*)\s*:\s*(.*)", line)
        if not m:
            raise ParseError("expected 'key: value'", source=source, line=lineno)
        key, value = m.group(1), m.group(2).strip().strip("'\"")
        if key in _META_INTS:
            if not re.fullmatch(r"\d+", value):
                raise ParseError(f"{key} must be a non-negative integer, got {value!r}", source=source, line=lineno, field=key)
            meta[key] = int(value)
            if key != "run_id" and meta[key] < 1:
                raise ParseError(f"{key} must be at least 1", source=source, line=lineno, field=key)
        else:
            meta[key] = value
    return meta


def parse(data: bytes, *, meta: bytes | None = None, source: str = "") -> WhatifTrace:
    """Read one ``trace-*.parquet`` (and optionally its ``meta-*.yaml``) into a :class:`WhatifTrace`.

    Raises ``ParseError`` naming the source and field for: bytes that are not Parquet, a missing column,
    a value that does not fit its type, a null, a negative or non-finite time, or an empty trace.
    """
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise TypeError(f"data must be bytes, not {type(data).__name__}")
    try:
        raw = pl.read_parquet(io.BytesIO(bytes(data)))
    except Exception as exc:  # noqa: BLE001 - polars raises several kinds for a damaged file
        raise ParseError(f"not a readable Parquet file ({type(exc).__name__})", source=source) from None
    raw = raw.rename({k: v for k, v in _RENAME.items() if k in raw.columns})
    missing = [c for c in OP_SCHEMA if c not in raw.columns]
    if missing:
        raise ParseError(f"missing column(s) {', '.join(missing)}", source=source, field=missing[0])
    if raw.height == 0:
        raise ParseError("trace holds no operations", source=source)
    cols = {}
    for name, dtype in OP_SCHEMA.items():
        s = raw.get_column(name)
        if dtype == pl.String:
            s = s.cast(pl.String)
        else:
            out = s.cast(dtype, strict=False)
            if int((s.is_not_null() & out.is_null()).sum()):
                raise ParseError(f"values that are not {dtype}", source=source, field=name)
            s = out
        nulls = s.is_null()
        if dtype == pl.Float64:
            nulls = nulls | s.is_nan() | s.is_infinite()
        if int(nulls.sum()):
            raise ParseError(f"missing or non-finite value in row {int(nulls.arg_true()[0])}", source=source, field=name)
        cols[name] = s
    ops = pl.DataFrame(cols)
    neg = ops.filter(pl.col("duration_s") < 0)
    if neg.height:
        raise ParseError(f"negative duration for {neg['optype'][0]} on rank {neg['rank'][0]} step {neg['step'][0]}",
                         source=source, field="duration_s")
    return WhatifTrace(ops=ops, meta=parse_meta(meta, source=source) if meta is not None else {}, source=source)


def to_batch(trace: WhatifTrace, *, job_id: str, ts: dt.datetime) -> Batch:
    """The trace's operations as one job's ``job_op`` rows, stamped ``ts`` (when they were received)."""
    if not job_id:
        raise ParseError("a what-if trace needs the job it belongs to (job_id)", source=trace.source, field="job_id")
    if ts is None or ts.tzinfo is None:
        raise ParseError("a what-if trace needs a time with a zone to stamp its rows", source=trace.source, field="ts")
    ops = trace.ops.with_columns(pl.lit(job_id).alias("job_id"), pl.lit(ts).alias("ts"))
    dup = ops.select(JOB_OP.key).is_duplicated()
    if dup.any():
        i = int(dup.arg_true()[0])
        r = ops.row(i, named=True)
        raise ParseError(f"operation {r['optype']} #{r['seq_id']} of rank {r['rank']} appears twice in step {r['step']}",
                         source=trace.source, line=i + 1, field="seq_id")
    return Batch(job_op=ops.select([pl.col(c.name).cast(c.dtype) for c in JOB_OP.columns]), source=trace.source)


FORMATS = (
    FormatSpec("bytedance_whatif", "per-operation training trace (Parquet) of ByteDance's straggler what-if artifact",
               lambda d, s, o: to_batch(parse(d, source=s), job_id=o.job_id or "", ts=o.ts),
               needs_ts=True),
)

"""dcgm-exporter ``/metrics`` bodies (Prometheus text exposition format 0.0.4) -> a :class:`Batch`.

What comes out
--------------
- ``gpu_sample``: one wide row per GPU (or MIG instance) per instant, DCGM fields converted to SI
  (MiB -> bytes, mJ -> J, percent -> ratio, ns -> s); see ``FIELDS`` and ``frames.GPU_FIELDS``.
- ``gpu``: inventory from the exporter's labels (``UUID``/``uuid``, ``Hostname``/``hostname``, ``gpu``,
  ``pci_bus_id``, ``modelName``/``model_name``, ``DCGM_FI_DRIVER_VERSION``, ``GPU_I_PROFILE``/``GPU_I_ID``).
- ``gpu_workload``: Kubernetes ``namespace``/``pod``/``container`` labels (dcgm-exporter's pod attribution).
  On idle GPUs a Prometheus scrape with ``honorLabels`` off shows the exporter's *own* pod there; a pod or
  container whose name contains ``dcgm-exporter`` is that exporter, not a workload, and is ignored.
- ``health_event``: XID (``DCGM_FI_DEV_XID_ERRORS`` nonzero, code = the XID), ECC SBE/DBE counts (kind
  ``ecc``), row remap failure / pending / uncorrectable rows (kind ``row_remap``). For ECC and row remap,
  ``code`` is the DCGM field id that raised the event (310-313, 393, 395, 396; ``dcgm_fields.h``).
- ``metric_sample``: DCGM_FI_* fields that have no ``gpu_sample`` column (``DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL``,
  the other violation counters, ...), as exported (no unit conversion), series
  ``FIELD{gpu_uuid="<key>", <non-standard labels>}``.
- ``meta``: counts of what was dropped and why (``skipped_series`` for non-DCGM metrics, ``dcgm_blank_dropped``,
  ``non_finite_dropped``, ``duplicates_dropped``, ``exporter_pod_labels_ignored``).

A body whose last line has no line feed is refused whole (:class:`ParseError` naming that line): it was
cut in transit, and a value cut short (``} 22563`` -> ``} 225``) still parses. The text format requires
the final line feed (:func:`fleetscope.core.textinput.require_final_newline`).

MIG: a MIG instance is its own row, keyed ``f"{parent_uuid}/mig{GPU_I_ID}"`` (dcgm-exporter labels a MIG
instance's series with the parent GPU's UUID plus ``GPU_I_ID``/``GPU_I_PROFILE``); the parent GPU keeps
the bare UUID. ``nvidia_smi`` uses the same key so both sources meet.

How it is fast
--------------
Text exposition format 0.0.4 (https://prometheus.io/docs/instrumenting/exposition_formats/) is parsed
columnar, never line by line in Python:

1. Records path (well-formed bodies, the common case). polars' CSV reader cuts the body with ``}`` as
   record terminator and ``{`` as field separator, so every sample's label block comes out as a column
   with no per-line split; a record's name is the last line before its ``{`` and its value the first
   line after its ``}``. dcgm-exporter prints every family over the same devices in the same order, so
   one vectorised string compare per family proves its label blocks equal to a reference family's and
   numbers them by position; families that differ are matched by text. Each DISTINCT block is then
   parsed once (~16k blocks for ~500k samples), by splitting the blocks at ``"`` with the CSV reader.
2. Line path (anything the records path does not vouch for: labels without braces, braces in label
   values or comments, timestamps, tabs, CRLF, invalid UTF-8). The reader cuts
   lines at ``}`` with one row per physical line, so row number = line number; lines that are not plainly
   well formed are re-read by an exact lexer that either normalises them or raises :class:`ParseError`
   with the source, line and field. Bodies over 256 MB are read in pieces so memory stays bounded.

Both paths end in a long (row, field, value) frame scattered into one flat buffer that is sliced into
the wide columns; scattering back to front keeps the first copy of a duplicated series.

Blank / not-supported values: DCGM reports an unreadable field with sentinel values (``dcgm_structs.h``:
``DCGM_INT32_BLANK`` 0x7ffffff0 .. 0x7fffffff for 32-bit values, ``DCGM_INT64_BLANK``
0x7ffffffffffffff0 and up, ``DCGM_FP64_BLANK`` 2**47 and up; ``+1`` not found, ``+2`` not supported,
``+3`` not permissioned). Older exporters print them verbatim; they are dropped here, never stored.
Non-finite values (``NaN``, ``+Inf``, ``-Inf``, valid in the text format) are dropped as well: every
mapped DCGM field is a gauge or a monotonically increasing counter, for which neither is a reading.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime

import polars as pl

from fleetscope.core.promtext import unescape as _unescape
from fleetscope.core.errors import ParseError
from fleetscope.core.dcgm_fields import DCGM_FIELDS, EXPORTER_POD_MARK, dcgm_health_events
from fleetscope.core.frames import (
    GPU,
    GPU_SAMPLE,
    GPU_WORKLOAD,
    HEALTH_EVENT,
    METRIC_SAMPLE,
    Batch,
    series_key,
)
from fleetscope.core.textinput import require_final_newline
from ingest.format import FormatSpec, Sniff, SniffView, Splitting, cut_line
from ingest import dcgm_lex
from ingest.dcgm_blocks import _KNOWN_LABELS, _parse_block_py, resolve_blocks
from ingest.dcgm_lex import _lex, _lex_records, _NeedLines, _Run

__all__ = ["FIELDS", "from_samples", "parse"]

# (DCGM field, gpu_sample column, multiplier to SI, DCGM value type: "i" int64 / "d" double).
# Names, columns and unit factors come from dcgm_fields.DCGM_FIELDS, shared with the OTLP path; what is
# particular to this text format is each field's DCGM value type (it decides which blank sentinels
# apply; dcgm_fields.h) and the 1.x-compatibility names below.
_DOUBLE_FIELDS = {
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE", "DCGM_FI_PROF_SM_ACTIVE", "DCGM_FI_PROF_SM_OCCUPANCY", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
    "DCGM_FI_PROF_PIPE_FP64_ACTIVE", "DCGM_FI_PROF_PIPE_FP32_ACTIVE", "DCGM_FI_PROF_PIPE_FP16_ACTIVE", "DCGM_FI_PROF_DRAM_ACTIVE",
    "DCGM_FI_DEV_POWER_USAGE",
}
FIELDS: tuple[tuple[str, str, float, str], ...] = tuple(
    (name, column, factor, "d" if name in _DOUBLE_FIELDS else "i") for name, (column, factor) in DCGM_FIELDS.items()
) + (
    # gpu-monitoring-tools 1.x names, still emitted by dcgm-exporter's 1.x-compatibility mode; that mode
    # prints DCP ratios multiplied by 100 (ToUint32(value, 100)), hence 0.01 there.
    ("dcgm_sm_clock", "sm_clock_mhz", 1.0, "i"),
    ("dcgm_memory_clock", "mem_clock_mhz", 1.0, "i"),
    ("dcgm_memory_temp", "mem_temp_c", 1.0, "i"),
    ("dcgm_gpu_temp", "temp_c", 1.0, "i"),
    ("dcgm_power_usage", "power_w", 1.0, "d"),
    ("dcgm_total_energy_consumption", "energy_j", 1e-3, "i"),
    ("dcgm_pcie_replay_counter", "pcie_replay_total", 1.0, "i"),
    ("dcgm_gpu_utilization", "util_ratio", 0.01, "i"),
    ("dcgm_mem_copy_utilization", "mem_copy_util_ratio", 0.01, "i"),
    ("dcgm_enc_utilization", "enc_util_ratio", 0.01, "i"),
    ("dcgm_dec_utilization", "dec_util_ratio", 0.01, "i"),
    ("dcgm_xid_errors", "xid_last", 1.0, "i"),
    ("dcgm_fb_free", "fb_free_bytes", 2.0**20, "i"),
    ("dcgm_fb_used", "fb_used_bytes", 2.0**20, "i"),
    ("dcgm_fi_prof_gr_engine_active", "gr_engine_active_ratio", 0.01, "d"),
    ("dcgm_fi_prof_sm_active", "sm_active_ratio", 0.01, "d"),
    ("dcgm_fi_prof_sm_occupancy", "sm_occupancy_ratio", 0.01, "d"),
    ("dcgm_fi_prof_pipe_tensor_active", "tensor_active_ratio", 0.01, "d"),
    ("dcgm_fi_prof_dram_active", "dram_active_ratio", 0.01, "d"),
)

_FIELD_BY_NAME = {f[0]: f for f in FIELDS}
_INT_COLUMNS = {c.name for c in GPU_SAMPLE.columns if c.dtype == pl.Int64}

# Sentinels from dcgm_structs.h (DCGM_BLANK_VALUES). A 32-bit blank can reach the exporter inside an
# int64 field (dcgm-exporter's ToString checks both), so for int fields the whole 32-bit blank band is
# dropped; real int64 values above it (energy in mJ, byte counters) are kept.
_INT32_BLANK = 0x7FFFFFF0
_INT32_MAX = 0x7FFFFFFF
_INT64_BLANK = float(0x7FFFFFFFFFFFFFF0)  # rounds to 2**63 as a double; >= catches every int64 blank
_FP64_BLANK = 140737488355328.0  # 2**47





def parse(data: bytes, *, source: str = "", ts: datetime | None = None) -> Batch:
    """Parse one dcgm-exporter ``/metrics`` body.

    ``ts`` is the scrape time (UTC; a naive datetime is taken as UTC). A sample that carries its own
    Prometheus timestamp (milliseconds since the epoch, exposition format 0.0.4) uses that instead; a
    sample with neither is a :class:`ParseError`. An empty body is a valid, empty batch.
    Raises :class:`ParseError` naming source, line and field for malformed lines, for a DCGM series
    without a ``UUID``/``uuid`` label, and for a last line without its line feed (a cut body).
    """
    if isinstance(data, str):
        data = data.encode()
    require_final_newline(data, source)
    scrape_us = _to_us(ts) if ts is not None else None
    meta: dict = {
        "format": "prometheus-text-0.0.4",
        "samples": 0,
        "skipped_series": 0,
        "skipped_names": {},
        "dcgm_blank_dropped": 0,
        "non_finite_dropped": 0,
        "duplicates_dropped": 0,
        "exporter_pod_labels_ignored": 0,
        "unmapped_fields": {},
    }
    if scrape_us is not None and len(data) <= dcgm_lex._PIECE_BYTES:
        lexed = _lex_records(data)
        if lexed is not None:
            try:
                return _assemble(*lexed, source, scrape_us, dict(meta, lexer="records"), exact=False)
            except _NeedLines:
                pass
    meta["lexer"] = "lines"
    long = _lex(data, source, meta)
    if not long.height:
        return _empty(source, meta)
    uniq = long["labels"].unique()
    blocks = pl.DataFrame({"bid": uniq.to_physical(), "text": uniq.cast(pl.String)})
    long = long.with_columns(bid=long["labels"].to_physical()).drop("labels")
    return _assemble(long, blocks, None, source, scrape_us, meta, exact=True)


def from_samples(samples: pl.DataFrame, labels: pl.DataFrame, *, source: str = "", meta: dict | None = None) -> Batch:
    """The Batch for dcgm-exporter series that arrived by another transport than the text format (Prometheus
    remote write), mapped by exactly the code that maps a ``/metrics`` body.

    ``samples``: one row per sample, columns ``line`` (UInt32, the sample's position in its input, which
    errors cite as the line), ``name`` (metric name), ``bid`` (UInt32, its label set), ``value`` (Float64,
    as exported) and ``ts_ms`` (Int64 milliseconds since the epoch, never null).
    ``labels``: the label sets, one row per label: ``bid``, ``name`` (a valid label name, ``__name__``
    aside, at most once per set), ``value``. ``meta`` is merged into the Batch's.
    Raises :class:`ParseError` for a DCGM series without a ``UUID``/``uuid`` label, as ``parse`` does.
    """
    meta = {
        "samples": 0, "skipped_series": 0, "skipped_names": {}, "dcgm_blank_dropped": 0, "non_finite_dropped": 0,
        "duplicates_dropped": 0, "exporter_pod_labels_ignored": 0, "unmapped_fields": {}, **(meta or {}),
    }
    if not samples.height:
        return _empty(source, meta)
    long = samples.select(
        pl.col("line").cast(pl.UInt32),
        pl.col("name").cast(pl.String).cast(pl.Categorical),
        pl.col("bid").cast(pl.UInt32),
        pl.col("value").cast(pl.Float64),
        pl.col("ts_ms").cast(pl.Int64),
    )
    # Each set as a text-format label block (`name="value",...`, values escaped), which _assemble reads.
    v = pl.col("value").str.replace_all("\\", "\\\\", literal=True).str.replace_all("\n", "\\n", literal=True)
    v = v.str.replace_all('"', '\\"', literal=True)
    text = labels.select(pl.col("bid").cast(pl.UInt32), t=pl.col("name") + '="' + v + '"').group_by("bid", maintain_order=True).agg(
        text=pl.col("t").str.join(",")
    )
    blocks = long.select(pl.col("bid").unique()).join(text, on="bid", how="left").with_columns(pl.col("text").fill_null(""))
    return _assemble(long, blocks, None, source, None, meta, exact=True)


# --- assembling the batch -------------------------------------------------------------------------

_GPU_COLS = tuple(c.name for c in GPU_SAMPLE.columns if not c.key)
_COL_INDEX = {c: i for i, c in enumerate(_GPU_COLS)}


def _lut(codes: pl.Series, values: pl.Series, dtype: pl.DataType) -> pl.Series:
    """A lookup table indexed by a Categorical's physical code (codes are dense and start at 0)."""
    size = int(codes.max()) + 1 if codes.len() else 0
    return pl.repeat(None, size, dtype=dtype, eager=True).scatter(codes, values)


def _assemble(
    long: pl.DataFrame,
    block_text: pl.DataFrame,
    runs: list[_Run] | None,
    source: str,
    scrape_us: int | None,
    meta: dict,
    *,
    exact: bool,
) -> Batch:
    """Long (line, name, bid, value, ts_ms) plus the (bid, text) table of label blocks -> the batch."""
    meta["samples"] = long.height
    values_in_body_order = long["value"]

    # Metric names (few distinct): DCGM fields we map, other DCGM_FI_* fields (metric_sample), and
    # everything else (skipped). The fast path leaves comment lines in front of a name at family
    # boundaries; the metric name is the last line.
    names = long.select(pl.col("name").unique())["name"]
    name_codes = names.to_physical()
    metric = [t.rsplit("\n", 1)[-1] for t in names.to_list()]
    cls = [1 if m in _FIELD_BY_NAME else 2 if m.startswith("DCGM_FI_") else 0 for m in metric]
    metric_lut = _lut(name_codes, pl.Series(metric, dtype=pl.String), pl.String)
    if 0 in cls or 2 in cls:
        long = long.with_columns(_cls=_lut(name_codes, pl.Series(cls, dtype=pl.UInt8), pl.UInt8).gather(long["name"].to_physical()))
    if 0 in cls:
        skipped = long.filter(pl.col("_cls") == 0)
        skipped = skipped.with_columns(_metric=metric_lut.gather(skipped["name"].to_physical())).group_by("_metric").len()
        meta["skipped_names"] = dict(sorted(skipped.iter_rows()))
        meta["skipped_series"] = int(skipped["len"].sum())
        long = long.filter(pl.col("_cls") != 0)
    if not long.height:
        return _empty(source, meta)

    line_ts = long["ts_ms"].null_count() < long.height
    if scrape_us is None:
        missing = long.filter(pl.col("ts_ms").is_null())
        if missing.height:
            raise ParseError(
                "sample has no timestamp and no scrape time (ts=) was given",
                source=source,
                line=int(missing["line"].min()),
                field="timestamp",
            )

    # Resolve each distinct label block once, then give every row its GPU key id (kid).
    if long.height < meta["samples"]:  # some families were skipped: resolve only the blocks still used
        block_text = block_text.filter(pl.col("bid").is_in(long["bid"].unique().implode()))
    blocks = resolve_blocks(block_text["bid"], block_text["text"])
    no_uuid = blocks.filter(pl.col("uuid").is_null() | (pl.col("uuid") == ""))
    if no_uuid.height:
        if not exact:
            raise _NeedLines
        first = long.filter(pl.col("bid").is_in(no_uuid["bid"].implode())).sort("line").row(0, named=True)
        raise ParseError(
            f"{first['name'].rsplit(chr(10), 1)[-1]} series has no UUID label, so it cannot be tied to a GPU",
            source=source,
            line=int(first["line"]),
            field="UUID",
        )
    blocks = blocks.with_columns(
        key=pl.when(pl.col("gpu_i_id").is_not_null() & (pl.col("gpu_i_id") != ""))
        .then(pl.col("uuid") + "/mig" + pl.col("gpu_i_id"))
        .otherwise(pl.col("uuid"))
    )
    # Keys numbered in order of first appearance, so that gpu_sample rows follow the exporter's order.
    keys = blocks.sort("bid").select(pl.col("key").unique(maintain_order=True)).with_row_index("kid")
    blocks = blocks.join(keys, on="key")
    kid_lut = _lut(blocks["bid"], blocks["kid"], pl.UInt32)
    long = long.with_columns(kid=kid_lut.gather(long["bid"]))
    # Row of gpu_sample: one per key, or per (key, timestamp) when samples carry their own timestamps.
    if line_ts:
        ts_us = pl.col("ts_ms") * 1000
        long = long.with_columns(ts_us=ts_us if scrape_us is None else ts_us.fill_null(scrape_us))
        rowkeys = long.select("kid", "ts_us").unique().sort("kid", "ts_us").with_row_index("rk")
        long = long.join(rowkeys, on=["kid", "ts_us"], how="left")
    else:
        rowkeys = keys.select(rk=pl.col("kid"), kid=pl.col("kid"), ts_us=pl.lit(scrape_us, pl.Int64))
        long = long.with_columns(rk=pl.col("kid"))
    rowkeys = rowkeys.join(keys, on="kid").sort("rk")
    ts_col = pl.from_epoch(pl.col("ts_us"), time_unit="us").dt.replace_time_zone("UTC")

    columns = None
    if runs is not None and not line_ts:
        columns = _wide_by_family(runs, values_in_body_order, kid_lut, keys.height, meta)
    gpu_sample = columns if columns is not None else _wide(long, name_codes, metric, rowkeys, meta)
    gpu_sample = gpu_sample.with_columns(rowkeys["ts_us"]).with_columns(ts_col.alias("ts"), gpu_uuid=rowkeys["key"])
    gpu_sample = gpu_sample.select(GPU_SAMPLE.names).sort("gpu_uuid", "ts")

    # Inventory from the first block of each key (most keys have exactly one block).
    inv = blocks if blocks.height == keys.height else blocks.sort("bid").unique("key", keep="first", maintain_order=True)
    gpu = inv.select(
        gpu_uuid=pl.col("key"),
        host=pl.col("host"),
        gpu_index=pl.col("gpu").cast(pl.Int64, strict=False),
        pci_bus_id=pl.col("pci_bus_id"),
        model_name=pl.col("model"),
        mig_profile=pl.col("gpu_i_profile"),
        mig_instance_id=pl.col("gpu_i_id").cast(pl.Int64, strict=False),
        driver_version=pl.col("driver"),
    ).sort("gpu_uuid")

    workload = _workload(long, blocks, rowkeys, line_ts, meta)
    health = dcgm_health_events(gpu_sample, inv.select(gpu_uuid="key", host="host", err_msg="err_msg"), source="dcgm")
    metric_sample = None
    if 2 in cls:
        other = long.filter(pl.col("_cls") == 2)
        other = other.with_columns(_metric=metric_lut.gather(other["name"].to_physical()))
        meta["unmapped_fields"] = dict(sorted(other.group_by("_metric").len().iter_rows()))
        metric_sample = _metric_samples(other, blocks, rowkeys, meta)

    return Batch(
        source=source,
        gpu=gpu,
        gpu_sample=gpu_sample,
        gpu_workload=workload,
        health_event=health,
        metric_sample=metric_sample,
        meta=meta,
    )


def _blank_mask(v: pl.Expr, kind: pl.Expr | str) -> pl.Expr:
    """True where a finite value is a DCGM sentinel (int bands for int fields, >= 2**47 for doubles)."""
    int_blank = ((v >= _INT32_BLANK) & (v <= _INT32_MAX)) | (v >= _INT64_BLANK)
    if isinstance(kind, str):  # unknown DCGM type: both integer bands plus the exact FP64 sentinels
        mask = int_blank | ((v >= _FP64_BLANK) & (v <= _FP64_BLANK + 3.0))
    else:
        mask = pl.when(kind).then(v >= _FP64_BLANK).otherwise(int_blank)
    return v.is_finite() & mask


def _wide_by_family(runs: list[_Run], values: pl.Series, kid_lut: pl.Series, n_keys: int, meta: dict) -> pl.DataFrame | None:
    """Wide columns straight from the value column when every mapped family is printed over the
    reference devices in key order: each family is then one slice. None when that does not hold."""
    mapped = [r for r in runs if r[0] in _FIELD_BY_NAME]
    targets = [_FIELD_BY_NAME[m][1] for m, *_ in mapped]
    if (
        not mapped
        or len(set(targets)) != len(targets)
        or not all(same and n == n_keys for _, _, n, same in mapped)
        or kid_lut.len() < n_keys
        or not (kid_lut.head(n_keys) == pl.int_range(0, n_keys, dtype=pl.UInt32, eager=True)).all()
    ):
        return None
    # Mask and scale the mapped families' values in one pass, then cut one slice per column.
    parts = [values.slice(start, n) for _, start, n, _ in mapped]
    family = pl.int_range(0, n_keys * len(mapped), dtype=pl.UInt32, eager=True) // n_keys
    kinds = pl.Series([_FIELD_BY_NAME[m][3] == "d" for m, *_ in mapped], dtype=pl.Boolean).gather(family)
    scales = pl.Series([_FIELD_BY_NAME[m][2] for m, *_ in mapped], dtype=pl.Float64).gather(family)
    v = pl.DataFrame({"v": pl.concat(parts), "d": kinds, "s": scales})
    blank = _blank_mask(pl.col("v"), pl.col("d"))
    n_blank, n_nonfinite = v.select(b=blank.sum(), n=(~pl.col("v").is_finite() & ~blank).sum()).row(0)
    meta["dcgm_blank_dropped"] += int(n_blank)
    meta["non_finite_dropped"] += int(n_nonfinite)
    scaled = pl.col("v") * pl.col("s")
    if n_blank or n_nonfinite:
        scaled = pl.when(blank | ~pl.col("v").is_finite()).then(None).otherwise(scaled)
    out = v.select(scaled.alias("v"))["v"]
    cols: dict[str, pl.Series] = {}
    for i, col in enumerate(targets):
        s = out.slice(i * n_keys, n_keys)
        cols[col] = s.round(0).cast(pl.Int64, strict=False) if col in _INT_COLUMNS else s
    return pl.DataFrame(
        [cols[c].alias(c) if c in cols else pl.repeat(None, n_keys, dtype=GPU_SAMPLE.col(c).dtype, eager=True).alias(c) for c in _GPU_COLS]
    )


def _wide(long: pl.DataFrame, name_codes: pl.Series, metric: list[str], rowkeys: pl.DataFrame, meta: dict):
    """Long (row, field, value) -> one column per gpu_sample field, by scattering into a flat buffer."""
    n = rowkeys.height
    spec = [_FIELD_BY_NAME.get(m) for m in metric]
    # Per distinct name code: target column, multiplier to SI, DCGM type (double or integer).
    fid = _lut(name_codes, pl.Series([_COL_INDEX[f[1]] if f else None for f in spec], dtype=pl.UInt32), pl.UInt32)
    scale = _lut(name_codes, pl.Series([f[2] if f else None for f in spec], dtype=pl.Float64), pl.Float64)
    dbl = _lut(name_codes, pl.Series([f[3] == "d" if f else None for f in spec], dtype=pl.Boolean), pl.Boolean)
    phys = long["name"].to_physical()
    v = long["value"]
    rows = pl.DataFrame({"rk": long["rk"], "v": v, "fid": fid.gather(phys), "s": scale.gather(phys), "d": dbl.gather(phys)})
    blank = _blank_mask(pl.col("v"), pl.col("d"))
    rows = rows.with_columns(_blank=blank.fill_null(False), _nf=~pl.col("v").is_finite())
    bad = rows.select(
        # a field with no column is counted where its metric samples are (``_metric_samples``), not here as well
        b=(pl.col("_blank") & pl.col("fid").is_not_null()).sum(), n=(pl.col("_nf") & ~pl.col("_blank") & pl.col("fid").is_not_null()).sum(),
        other=pl.col("fid").null_count()
    ).row(0)
    meta["dcgm_blank_dropped"] += int(bad[0])
    meta["non_finite_dropped"] += int(bad[1])
    if bad[0] or bad[1] or bad[2]:
        rows = rows.filter(~pl.col("_blank") & ~pl.col("_nf") & pl.col("fid").is_not_null())
    # Scatter writes in order, so writing the rows back to front leaves the FIRST copy of a duplicated
    # series (same field, GPU and time) in place: deterministic, and the one a reader meets first.
    idx = (rows["fid"].cast(pl.Int64) * n + rows["rk"].cast(pl.Int64)).reverse()
    vals = (rows["v"] * rows["s"]).reverse()
    flat = pl.repeat(None, n * len(_GPU_COLS), dtype=pl.Float64, eager=True).scatter(idx, vals)
    meta["duplicates_dropped"] += int(rows.height - (flat.len() - flat.null_count()))
    out = {}
    for i, col in enumerate(_GPU_COLS):
        s = flat.slice(i * n, n)
        if col in _INT_COLUMNS:
            s = s.round(0).cast(pl.Int64, strict=False)
        out[col] = s
    return pl.DataFrame(out)


def _is_exporter(col: str) -> pl.Expr:
    return pl.col(col).fill_null("").str.contains(EXPORTER_POD_MARK, literal=True)


def _workload(long: pl.DataFrame, blocks: pl.DataFrame, rowkeys: pl.DataFrame, line_ts: bool, meta: dict):
    with_pod = blocks.filter(pl.col("pod").is_not_null() & (pl.col("pod") != ""))
    if not with_pod.height:
        return None
    exporter = _is_exporter("pod") | _is_exporter("container")
    meta["exporter_pod_labels_ignored"] = int(with_pod.filter(exporter).height)
    with_pod = with_pod.filter(~exporter)
    if not with_pod.height:
        return None
    if line_ts:
        when = long.filter(pl.col("bid").is_in(with_pod["bid"].implode())).select("bid", "ts_us").unique()
        with_pod = with_pod.join(when, on="bid")
    else:
        with_pod = with_pod.with_columns(ts_us=pl.lit(rowkeys["ts_us"][0] if rowkeys.height else 0, pl.Int64))
    w = (
        with_pod.select(
            ts=pl.from_epoch(pl.col("ts_us"), time_unit="us").dt.replace_time_zone("UTC"),
            gpu_uuid=pl.col("key"),
            namespace=pl.col("namespace"),
            pod=pl.col("pod"),
            container=pl.col("container"),
        )
        .sort("gpu_uuid", "ts", "namespace", "pod", "container", nulls_last=True)
        .unique(["ts", "gpu_uuid"], keep="first", maintain_order=True)
    )
    return w.select([pl.col(c.name).cast(c.dtype) for c in GPU_WORKLOAD.columns])


def _metric_samples(long: pl.DataFrame, blocks: pl.DataFrame, rowkeys: pl.DataFrame, meta: dict):
    if not long.height:
        return None
    blank = _blank_mask(pl.col("value"), "?")
    counts = long.select(b=blank.sum(), n=(~pl.col("value").is_finite() & ~blank).sum()).row(0)
    meta["dcgm_blank_dropped"] += int(counts[0])
    meta["non_finite_dropped"] += int(counts[1])
    df = long.filter(~blank & pl.col("value").is_finite())
    # Duplicated series: keep the first in the body.
    first = (pl.col("name").to_physical().cast(pl.UInt64) * (1 << 32) + pl.col("rk").cast(pl.UInt64)).is_first_distinct()
    before = df.height
    df = df.filter(first)
    meta["duplicates_dropped"] += before - df.height
    key = rowkeys["key"].gather(df["rk"])
    esc = key.str.replace_all("\\", "\\\\", literal=True).str.replace_all("\n", "\\n", literal=True)
    esc = esc.str.replace_all('"', '\\"', literal=True)
    df = df.with_columns(
        series=pl.col("_metric") + '{gpu_uuid="' + esc + '"}',
        ts=pl.from_epoch(rowkeys["ts_us"].gather(df["rk"]), time_unit="us").dt.replace_time_zone("UTC"),
    )
    if (blocks["_extra"] != "").any():
        # Non-standard labels (rare): build the canonical, sorted series key exactly.
        extra = blocks.filter(pl.col("_extra") != "").select("bid", "_extra")
        df = df.join(extra, on="bid", how="left")
        has = df.filter(pl.col("_extra").is_not_null())
        combos = has.select("_metric", "series", "_extra").unique()
        m = combos.with_columns(
            _s=pl.struct("_metric", "series", "_extra").map_elements(
                lambda r: _series_with_extra(r["_metric"], r["series"], r["_extra"]), return_dtype=pl.String
            )
        ).drop("_extra")
        df = df.join(m, on=["_metric", "series"], how="left").with_columns(series=pl.coalesce("_s", "series"))
    return df.select([pl.col(c.name).cast(c.dtype) for c in METRIC_SAMPLE.columns])


def _series_with_extra(name: str, plain_series: str, block: str) -> str:
    """Series key with the block's non-standard labels added to ``name{gpu_uuid="..."}``."""
    key = _unescape(plain_series[len(name) + len('{gpu_uuid="') : -2])
    labels = {k: v for k, v in _parse_block_py(block).items() if k not in _KNOWN_LABELS}
    labels["gpu_uuid"] = key
    return series_key(name, labels)


def _empty(source: str, meta: dict) -> Batch:
    return Batch(
        source=source,
        gpu=GPU.empty(),
        gpu_sample=GPU_SAMPLE.empty(),
        gpu_workload=GPU_WORKLOAD.empty(),
        health_event=HEALTH_EVENT.empty(),
        meta=meta,
    )


def _to_us(ts: datetime) -> int:
    if ts.tzinfo is None:
        ts = ts.replace(tzinfo=UTC)
    delta = ts.astimezone(UTC) - datetime(1970, 1, 1, tzinfo=UTC)
    return delta.days * 86_400_000_000 + delta.seconds * 1_000_000 + delta.microseconds



# --- declaration (ingest.format) ---------------------------------------------------------------------

# A sample line of the Prometheus text format with a DCGM metric name: name, optional labels, a number.
_DCGM_LINE = re.compile(r"^(?:DCGM_FI_[A-Z0-9_]+|dcgm_[a-z0-9_]+)(?:\{[^\n]*\})?[ \t]+[-+]?(?:[0-9.]+(?:[eE][-+]?[0-9]+)?|NaN|Inf)", re.MULTILINE)


def _looks_like(view: SniffView) -> bool:
    return bool(_DCGM_LINE.search(view.text))


def cut_family(buf: bytes) -> int:
    """Before the last ``# HELP`` line in the second half of the buffer (a new metric family, which keeps
    the parser on its fast path), else at the last line."""
    i = buf.rfind(b"\n# HELP ", len(buf) // 2)
    return i + 1 if i >= 0 else cut_line(buf)


FORMATS = (
    FormatSpec("dcgm", "dcgm-exporter /metrics body (Prometheus text)",
               lambda d, s, o: parse(d, source=s, ts=o.ts), sniff=Sniff(30, _looks_like), needs_ts=True,
               streaming=Splitting(cut_family, wide=True, max_piece=32 * 2**20), final_newline=True),
)

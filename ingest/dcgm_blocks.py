"""The label blocks of dcgm-exporter samples: which labels the parser reads, and each DISTINCT block
(``name="value",...`` between the braces) resolved once into the identity, inventory and workload labels
``ingest.dcgm`` builds its frames from. A fleet's scrapes repeat the same blocks scrape after scrape, so the
last few resolutions are kept and reused for blocks equal to theirs (``resolve_blocks``).
"""

from __future__ import annotations

import io
import re
import threading
from collections import OrderedDict

import polars as pl

from fleetscope.core.promtext import VALUE_RE as _VALUE_RE
from fleetscope.core.promtext import unescape as _unescape

# Labels the parser understands; (output name, label names in order of preference).
_LABELS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("uuid", ("UUID", "uuid")),
    ("gpu_i_id", ("GPU_I_ID",)),
    ("gpu_i_profile", ("GPU_I_PROFILE",)),
    ("gpu", ("gpu",)),
    ("pci_bus_id", ("pci_bus_id",)),
    ("model", ("modelName", "model_name")),
    ("host", ("Hostname", "hostname")),
    ("driver", ("DCGM_FI_DRIVER_VERSION",)),
    ("namespace", ("namespace",)),
    ("pod", ("pod",)),
    ("container", ("container",)),
    ("err_msg", ("err_msg",)),
)
# Identity and static-configuration labels: not part of a metric_sample series key. The DCGM_FI_* ones
# are the "label" rows of dcgm-exporter's counters CSVs (driver, NVML, VBIOS, inforom versions, ...).
_KNOWN_LABELS = frozenset(n for _, names in _LABELS for n in names) | {
    "device",
    "pod_uid",
    "err_code",
    "DCGM_FI_NVML_VERSION",
    "DCGM_FI_DEV_BRAND",
    "DCGM_FI_DEV_SERIAL",
    "DCGM_FI_DEV_OEM_INFOROM_VER",
    "DCGM_FI_DEV_ECC_INFOROM_VER",
    "DCGM_FI_DEV_POWER_INFOROM_VER",
    "DCGM_FI_DEV_INFOROM_IMAGE_VER",
    "DCGM_FI_DEV_VBIOS_VERSION",
}
_LABEL_OUT = tuple(out for out, _ in _LABELS)

# The resolutions of the last few distinct sets of blocks, keyed by their first and last text and count and
# checked in full before reuse: comparing a 16,384-GPU scrape's blocks with the last one's costs ~1 ms,
# resolving them again ~50 ms. A set is kept only as long as it is among the last _KEPT seen.
_KEPT = 4
_resolved: OrderedDict[tuple, tuple[pl.Series, pl.Series, pl.DataFrame]] = OrderedDict()
_resolved_lock = threading.Lock()


def resolve_blocks(bids: pl.Series, text: pl.Series) -> pl.DataFrame:
    """``_resolve_blocks``, reused for blocks (ids and text) equal to a set resolved lately. The frame
    returned is shared between callers; polars frames are never changed in place."""
    key = (text.len(), text[0] if text.len() else None, text[-1] if text.len() else None)
    with _resolved_lock:
        hit = _resolved.get(key)
    if hit is not None and hit[1].equals(text) and hit[0].equals(bids):
        return hit[2]
    out = _resolve_blocks(bids, text)
    with _resolved_lock:
        _resolved[key] = (bids, text, out)
        _resolved.move_to_end(key)
        while len(_resolved) > _KEPT:
            _resolved.popitem(last=False)
    return out


def _parse_block_py(block: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for m in re.finditer(rf'([a-zA-Z_][a-zA-Z0-9_]*)="({_VALUE_RE})"', block):
        out.setdefault(m.group(1), _unescape(m.group(2)))
    return out


def _block_row(block: str) -> dict[str, str | None]:
    labels = _parse_block_py(block)
    row: dict[str, str | None] = {}
    for out, names in _LABELS:
        row[out] = next((labels[n] for n in names if n in labels), None)
    row["_extra"] = block if any(k not in _KNOWN_LABELS for k in labels) else ""
    return row


def _resolve_blocks(bids: pl.Series, text: pl.Series) -> pl.DataFrame:
    """Parse each distinct label block once: identity, inventory and workload labels.

    Blocks without a backslash hold no escaped quote, so splitting them at '"' is exact: fields alternate
    ``,name=`` and value. polars' CSV reader does that split for all blocks at once. When every position
    holds the same label name in every block (dcgm-exporter prints labels in a fixed order), each wanted
    label is a column; otherwise it is picked by matching the name field at every position. Blocks with
    escapes (rare) go through the exact Python path.
    """
    # A backslash means escapes; a carriage return could end a CSV row early: both take the exact path.
    escaped = text.str.contains(r"[\\\r]")
    n_escaped = int(escaped.sum())
    frames = []
    if n_escaped < bids.len():
        simple = bids.filter(~escaped) if n_escaped else bids
        simple_text = text.filter(~escaped) if n_escaped else text
        n_fields = int(simple_text.str.count_matches('"', literal=True).max() or 0) + 1
        cols = [f"c{i}" for i in range(n_fields)]
        body = ("," + simple_text.str.join("\n,").item() + "\n").encode()
        split = pl.read_csv(
            io.BytesIO(body),
            has_header=False,
            separator='"',
            quote_char=None,
            schema=dict.fromkeys(cols, pl.String),
            missing_columns="insert",
            truncate_ragged_lines=True,
        )
        if split.height != simple.len():  # never misalign blocks and their labels: go the exact way
            return _resolve_blocks_py(bids, text)
        name_cols, value_cols = cols[0::2], cols[1::2]
        at = split.select([pl.col(nc).drop_nulls().unique().implode() for nc in name_cols]).row(0)
        static = all(len(a) <= 1 for a in at)
        exprs = []
        for out, names in _LABELS:
            if static:
                # A label present in only some blocks has a null name field where it is absent.
                picks = [
                    pl.when(pl.col(nc).is_not_null()).then(pl.col(vc).fill_null(""))
                    for n in names
                    for nc, vc, a in zip(name_cols, value_cols, at)
                    if a and a[0] == f",{n}="
                ]
            else:
                picks = [
                    pl.when(pl.col(nc) == f",{n}=").then(pl.col(vc).fill_null(""))
                    for n in names
                    for nc, vc in zip(name_cols, value_cols)
                ]
            exprs.append((pl.coalesce(picks) if picks else pl.lit(None, pl.String)).alias(out))
        known = [f",{n}=" for n in _KNOWN_LABELS] + [","]
        if static:
            extra_cols = [nc for nc, a in zip(name_cols, at) if a and a[0] not in known]
        else:
            extra_cols = name_cols
        has_extra = pl.any_horizontal(
            [pl.col(nc).is_not_null() & ~pl.col(nc).is_in(known) for nc in extra_cols] or [pl.lit(False)]
        )
        res = split.select(*exprs, _has_extra=has_extra)
        frames.append(
            res.with_columns(
                bid=simple, _extra=pl.when("_has_extra").then(simple_text).otherwise(pl.lit(""))
            ).drop("_has_extra")
        )
    if n_escaped:
        frames.append(_resolve_blocks_py(bids.filter(escaped), text.filter(escaped)))
    return pl.concat(frames, how="diagonal_relaxed").select("bid", *_LABEL_OUT, "_extra")


def _resolve_blocks_py(bids: pl.Series, text: pl.Series) -> pl.DataFrame:
    rows = [_block_row(t) for t in text.to_list()]
    schema = {**dict.fromkeys(_LABEL_OUT, pl.String), "_extra": pl.String}
    return pl.DataFrame(rows, schema=schema).with_columns(bid=bids).select("bid", *_LABEL_OUT, "_extra")

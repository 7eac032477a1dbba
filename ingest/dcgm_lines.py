"""Small dcgm-exporter bodies read line by line: the per-node push of a fleet's agents.

A fleet sends one exporter body per node every interval (8 GPUs x ~30 fields, ~240 samples). The
columnar parser in :mod:`ingest.dcgm` is built for one large scrape: each of its ~400 frame operations
has a fixed cost (100-200 µs on a small machine), so an 8-GPU body costs ~30 ms there and ~0.4 ms here.
This reader vouches only for the plain shape dcgm-exporter prints (text exposition format 0.0.4,
https://prometheus.io/docs/instrumenting/exposition_formats/): ``name{labels} value`` lines, comments,
no timestamps, no escapes, one label block per GPU. Anything else returns ``None`` and the body goes to
:func:`ingest.dcgm.parse`, which also names the line and field of an error. Its output is the same
Batch as that parser's (tests compare the two on real, synthetic and mutated bodies).

Many bodies are assembled into one Batch at once (:func:`assemble`), each with its own scrape time,
so frames are built once per group commit rather than once per request.
"""

from __future__ import annotations

import copy
import hashlib
from itertools import accumulate
import math
from array import array
import operator
import re
from dataclasses import dataclass, field
from typing import Any

import polars as pl

from fleetscope.core import hashing
from fleetscope.core.dcgm_fields import DCGM_HEALTH_COUNTERS, dcgm_health_events, health_event_rows
from fleetscope.core.frames import (
    GPU,
    GPU_SAMPLE,
    GPU_WORKLOAD,
    METRIC_SAMPLE,
    UTC_US,
    Batch,
)
from ingest.dcgm import (
    _FIELD_BY_NAME,
    _FP64_BLANK,
    _GPU_COLS,
    _INT32_BLANK,
    _INT32_MAX,
    _INT64_BLANK,
    _INT_COLUMNS,
)
from ingest import dcgm_labels
from ingest.dcgm_labels import _OUT_INDEX, Shape, block_by_shape, block_of, host_of, inventory_row, plain, series_of, shape_of, workload_of

try:  # the compiled per-push loop (ingest/_lines.c), built where a compiler was; the same steps in Python otherwise
    from ingest import _lines as _c
except ImportError:  # pragma: no cover - exercised by the tests that run without it
    _c = None

__all__ = ["MAX_BYTES", "Lines", "read", "assemble", "tuples", "faulty", "health_rows", "forget", "host_of"]

# Bodies larger than this are a scrape of many GPUs: the columnar parser is faster there.
MAX_BYTES = 512 * 1024

_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
# A sample's value: what follows "} " up to the end of its line (no look-behind: a tenth of the time).
_VALUE_CUT = re.compile(rb"\} ([^ \n]*)\n")
# The values of a templated body joined by commas: only a plain number's characters (no space, which float()
# would strip, no name such as "nan"; a comma in a value makes float() refuse it).
_PLAIN_NUMBERS = re.compile(rb"[0-9eE.+\-,]*")
_NUMBER = re.compile(r"[-+]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?")
_SPECIAL = {"NaN": math.nan, "+Inf": math.inf, "-Inf": -math.inf, "Inf": math.inf}
_STRING_OF = {c.name: c.dtype for c in GPU_SAMPLE.columns}
_SAMPLE_SCHEMA = {c: _STRING_OF[c] for c in _GPU_COLS}
# Bodies' templates by the SHA-1 of their text around the values: one a node, a fleet's worth per process.
_TEMPLATES: dict[bytes, _Template] = {}
_MAX_TEMPLATES = 16_384
# Templates by their body's skeleton (``_skeleton``): the text around the values with each label block
# given as the order it first appears in. The nodes of a fleet that run one exporter version on one GPU
# count print one skeleton; a new node's body takes its template from another's (``_sibling``).
_SKELETONS: dict[bytes, _Template] = {}
_MAX_SKELETONS = 256
# The same skeletons by what a new node's body shares with the first body of each (its count of pieces, its first
# piece's text before the label block, its text after the last value), so that the body is checked against one
# piece by piece (``_Kin``) instead of having its skeleton digested.
_KIN: dict[tuple[int, bytes, bytes], _Kin] = {}
# The most label shapes (``dcgm_labels.Shape``) a skeleton learns: a node's GPUs print one or two (with a pod's
# labels and without), and a block that fits none is tried against each before it is read label by label.
_MAX_SHAPES = 8
# Fields whose nonzero reading is a health event (frames.dcgm_health_events).
_FAULT_COLUMNS = ("xid_last", *(c for c, *_ in DCGM_HEALTH_COUNTERS))
_INVENTORY_SCHEMA = {"gpu_uuid": pl.String, "host": pl.String, "gpu_index": pl.Int64, "pci_bus_id": pl.String, "model_name": pl.String,
                     "mig_profile": pl.String, "mig_instance_id": pl.Int64, "driver_version": pl.String, "err_msg": pl.String}


@dataclass
class Lines:
    """One body, read: per GPU key (in order of first appearance) its fields, labels and extra samples."""

    keys: list[str] = field(default_factory=list)
    fields: list[dict[str, float | int | None]] = field(default_factory=list)
    labels: list[tuple[str | None, ...]] = field(default_factory=list)  # per key, in _LABELS order
    extra: list[str] = field(default_factory=list)  # per key: its block when it has non-standard labels
    metrics: list[tuple[int, str, float]] = field(default_factory=list)  # (key index, DCGM field, value)
    meta: dict[str, Any] = field(default_factory=dict)
    # A body filled from a template keeps its gpu_sample values flat, key-major in ``compiled.cols``
    # order (None where a GPU lacks a field), and builds ``fields`` only when something asks for them.
    flat: tuple[Any, ...] | None = None
    compiled: _Compiled | None = None
    n_values: int = -1

    def __post_init__(self) -> None:
        if self.flat is not None:  # ``fields`` (set first, through the property) was only its default
            self._fields: list[dict[str, float | int | None]] | None = None

    def values(self) -> int:
        if self.n_values >= 0:
            return self.n_values
        return sum(sum(v is not None for v in row.values()) for row in self.fields) + len(self.metrics)


def _get_fields(self: Lines) -> list[dict[str, float | int | None]]:
    if self._fields is None:
        c = self.compiled
        assert c is not None and self.flat is not None
        n = len(c.cols)
        self._fields = [{col: v for col, v in zip(c.cols, self.flat[k * n:(k + 1) * n]) if v is not None or col in c.present[k]}
                        for k in range(len(self.keys))]
    return self._fields


def _set_fields(self: Lines, value: list[dict[str, float | int | None]]) -> None:
    self._fields = value
    self.flat = None


Lines.fields = property(_get_fields, _set_fields)  # type: ignore[assignment]


def _blank(value: float, kind: str) -> bool:
    """``ingest.dcgm._blank_mask`` for one finite value."""
    int_blank = (_INT32_BLANK <= value <= _INT32_MAX) or value >= _INT64_BLANK
    if kind == "d":
        return value >= _FP64_BLANK
    if kind == "i":
        return int_blank
    return int_blank or _FP64_BLANK <= value <= _FP64_BLANK + 3.0


def read(data: bytes) -> Lines | None:
    """The body's samples, or None where the columnar parser must read it (see the module docstring).

    A node sends the same lines every interval with new values. The body is cut at its values in one
    regex pass; a body whose text around the values was seen before (by its SHA-1) is filled in from that
    body's template instead of being read line by line, as long as its values are plain numbers outside
    DCGM's blank bands. A new node's body whose pieces match a known skeleton's but for their label blocks
    (``_Kin``) borrows that skeleton's template (``_sibling``). Anything else is read line by line, which may
    leave a template for next time."""
    if len(data) > MAX_BYTES or not data.endswith(b"\n"):
        return None
    joined, lengths, values = _cut(data)
    # ``_digest`` of the pieces with their lengths: the same text cut at other places (a quote moved across a
    # value) is another body
    digest = hashing.fed(hashlib.sha1(), joined, lengths).digest()
    template = _TEMPLATES.get(digest)
    if template is not None:
        out = template.fill(values)
        if out is not None:
            return out
    # a body no template fills: the pieces themselves are compared below
    ends = list(accumulate(array("I", lengths)))
    texts = [joined[a:b] for a, b in zip([0, *ends], ends)]
    if template is None:
        # a new node of a known skeleton, told by comparing its pieces with that skeleton's (``_Kin``)
        template = _kin_template(data, texts)
        if template is not None:
            out = template.fill(values)
            if out is not None:
                _keep(digest, None, template)
                return out
    skeleton = _skeleton(texts)
    if template is None and skeleton is not None:
        known = _SKELETONS.get(skeleton[0])
        template = _sibling(data, known, skeleton[2]) if known is not None else None
        if template is not None:
            out = template.fill(values)
            if out is not None:
                _keep(digest, skeleton[0], template)
                _learn_kin(texts, skeleton[1], skeleton[2], template)  # where the index lost it (``_KIN`` full)
                return out
    raws: list[str] = []
    slots: list[_Slot] = []
    out = _read_lines(data, raws, slots)
    if (out is not None and not out.meta["dcgm_blank_dropped"] and not out.meta["non_finite_dropped"]
            and [v.decode() for v in values] == raws):
        template = _Template(out, slots)
        if skeleton is not None:
            template.blocks = _key_of_block(skeleton[1], slots)
        _keep(digest, skeleton[0] if skeleton is not None else None, template)
        if skeleton is not None and template.blocks is not None:
            _learn_kin(texts, skeleton[1], skeleton[2], template)
        # The body as its template gives it (the same readings, kept flat): a fleet's first round then
        # takes the group's flat row path too, not the per-field dicts of a line-read body.
        filled = template.fill(values)
        if filled is not None:
            return filled
    return out


def forget() -> None:
    """Drop every template, skeleton and label block this reader has learned (tests start from nothing)."""
    for cache in (_TEMPLATES, _SKELETONS, _KIN, dcgm_labels._BLOCKS):
        cache.clear()


def _keep(digest: bytes, skeleton: bytes | None, template: _Template) -> None:
    if len(_TEMPLATES) >= _MAX_TEMPLATES:
        _TEMPLATES.clear()
    _TEMPLATES[digest] = template
    if skeleton is not None and template.blocks is not None:
        if len(_SKELETONS) >= _MAX_SKELETONS:
            _SKELETONS.clear()
        _SKELETONS.setdefault(skeleton, template)


class _Kin:
    """A skeleton's first template, with what a new node's body must match to borrow it: each sample's text up
    to and with its label block's brace (``heads``), which distinct block each sample carries (``pick``: the
    blocks in ``_skeleton``'s order to the samples'), and the sample each block first appears at; and the label
    shapes its nodes' blocks were seen in, to read a new node's by (``shapes``, at most ``_MAX_SHAPES``)."""

    __slots__ = ("template", "heads", "pick", "first", "shapes")

    def __init__(self, template: _Template, texts: list[bytes], order: list[int], blocks: list[bytes]):
        self.template = template
        self.heads = [t.rpartition(b"{")[0] + b"{" for t in texts[:-1]]
        self.pick = operator.itemgetter(*order) if len(order) > 1 else (lambda b: (b[order[0]],))
        first: dict[int, int] = {}
        for i, j in enumerate(order):
            first.setdefault(j, i)
        self.first = [first[j] for j in range(len(blocks))]
        self.shapes: list[Shape] = []
        for raw in blocks:
            try:
                block = raw.decode("utf-8")
            except UnicodeDecodeError:
                continue
            if block_by_shape(block, self.shapes) is None:
                self._learn(block)

    def read(self, block: str) -> tuple[str, tuple[str | None, ...], str] | None:
        """``block_of`` of a new node's label block, by a shape its skeleton's nodes print where one fits."""
        parsed = block_by_shape(block, self.shapes)
        if parsed is None:
            parsed = block_of(block)
            if parsed is not None:
                self._learn(block)
        return parsed

    def _learn(self, block: str) -> None:
        if len(self.shapes) < _MAX_SHAPES:
            shape = shape_of(block)
            if shape is not None:
                self.shapes.append(shape)


def _kin_key(texts: list[bytes]) -> tuple[int, bytes, bytes]:
    """What a body shares with the first body of its skeleton, as ``_KIN`` is keyed."""
    return len(texts), texts[0].rpartition(b"{")[0], texts[-1]


def _learn_kin(texts: list[bytes], order: list[int], blocks: list[bytes], template: _Template) -> None:
    """Index a new skeleton's first template by what a new node's body shares with it (``_KIN``)."""
    key = _kin_key(texts)
    if not order or key in _KIN:
        return
    if len(_KIN) >= _MAX_SKELETONS:
        _KIN.clear()
    _KIN[key] = _Kin(template, texts, order, blocks)


def _kin_template(data: bytes, texts: list[bytes]) -> _Template | None:
    """A template for a body no template holds, from a known skeleton's whose every piece it matches but for
    its label blocks: what ``_skeleton`` and ``_sibling`` find for it, exactly (each piece is compared, not
    digested), at a fraction of the cost."""
    if len(texts) < 2:
        return None
    kin = _KIN.get(_kin_key(texts))
    if kin is None:
        return None
    blocks = [texts[i].rpartition(b"{")[2] for i in kin.first]
    if len(set(blocks)) != len(blocks):
        return None  # two of the skeleton's blocks are one here: its own order differs
    # a block holds no brace (it is what follows a piece's last), so each piece equal to its head and block is cut
    # there by ``_skeleton`` too: the same heads, the same order
    if list(map(operator.add, kin.heads, kin.pick(blocks))) != texts[:-1]:
        return None
    return _sibling(data, kin.template, blocks, kin)


def _skeleton(texts: list[bytes]) -> tuple[bytes, list[int], list[bytes]] | None:
    """(digest of the text around the values with each label block replaced by the order it first appears
    in; that order, sample by sample; the distinct blocks in it) of a body cut at its values. None where a
    sample's text has no label block."""
    cut = [t.rpartition(b"{") for t in texts[:-1]]
    seen: dict[bytes, int] = {}
    order = [seen.setdefault(block, len(seen)) for _, brace, block in cut]
    if any(not brace for _, brace, _ in cut):
        return None
    heads = [head for head, _, _ in cut]
    return _digest(b"{".join([*heads, texts[-1]]), map(len, heads), order), order, list(seen)


def _digest(text: bytes, *numbers: Any) -> bytes:
    """SHA-1 of ``text`` and of each sequence of ``numbers`` (the lengths it was cut into, an order), which tell
    apart texts that join alike."""
    digest = hashing.fed(hashlib.sha1(), text)
    for seq in numbers:
        digest.update(array("I", seq).tobytes())
    return digest.digest()


def _key_of_block(order: list[int], slots: list[_Slot]) -> list[int | None] | None:
    """For each distinct label block of a templated body (``order``: each sample's, as ``_skeleton`` numbers
    them), the GPU (key index) its samples fill, or None for a block only skipped samples carry; None where
    a block's samples fill two."""
    out: list[int | None] = [None] * (max(order) + 1 if order else 0)
    for i, slot in zip(order, slots):
        if slot is None:
            continue
        if out[i] is None:
            out[i] = slot[0]
        elif out[i] != slot[0]:
            return None
    return out


def _sibling(data: bytes, known: _Template, blocks: list[bytes], kin: _Kin | None = None) -> _Template | None:
    """A template for a body no template holds, from another body's of the same skeleton (``known``): its lines
    read alike but for their label blocks (``blocks``, in ``_skeleton``'s order), which are read here (each once,
    as ``_read_lines`` reads them, by the label shapes of ``kin`` where they fit); None where a block would
    make ``_read_lines`` read the body otherwise (it then does)."""
    if known.blocks is None or b"\r" in data or b"\t" in data or b"\x00" in data:
        return None
    base = known.lines
    n = len(base.keys)
    keys: list[str | None] = [None] * n
    labels: list[tuple[str | None, ...]] = [()] * n
    extra: list[str] = [""] * n
    for raw, k in zip(blocks, known.blocks):
        try:
            block = raw.decode("utf-8")
        except UnicodeDecodeError:
            return None
        if k is None:
            if not plain(block):
                return None
            continue
        parsed = block_of(block) if kin is None else kin.read(block)
        if parsed is None:
            return None
        keys[k], labels[k], extra[k] = parsed
    if None in keys or len(set(keys)) != n:
        return None  # a GPU given two label blocks: the columnar parser decides
    meta = dict(base.meta)
    meta["exporter_pod_labels_ignored"] = sum(1 for lab in labels if lab[_OUT_INDEX["pod"]] and workload_of(lab) is None)
    lines = Lines(keys=keys, labels=labels, extra=extra, meta=meta)  # type: ignore[arg-type]
    return _Template(lines, known.slots, known.compiled.relabelled(lines), known.blocks)


def _read_lines(data: bytes, raws: list[str], slots: list[_Slot]) -> Lines | None:
    """``read`` line by line; ``raws`` gets each sample's value text and ``slots`` where it went."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return None
    if "\r" in text or "\t" in text or "\x00" in text:
        return None
    out = Lines()
    meta = out.meta
    skipped: dict[str, int] = {}
    blank = nonfinite = dups = samples = 0
    block_key: dict[str, int] = {}  # label block -> key index
    key_index: dict[str, int] = {}
    match_number = _NUMBER.fullmatch
    names_ok: set[str] = set()
    plain_blocks: set[str] = set()
    unmapped: dict[str, int] = {}  # every DCGM_FI_* sample without a column, as the columnar parser counts
    seen_metrics: set[tuple[int, str]] = set()
    for line in text.split("\n"):
        if not line or line[0] == "#":
            continue
        # str methods rather than a regex per line: a third of the time. What they let through that the
        # exposition format forbids is caught per distinct name and label block below, or by the number.
        head, sep, raw = line.rpartition(" ")
        brace = head.find("{")
        if not sep or brace < 1 or head[-1] != "}":
            return None
        name = head[:brace]
        block = head[brace + 1 : -1]
        if name not in names_ok:
            if not _NAME.fullmatch(name):
                return None
            names_ok.add(name)
        samples += 1
        raws.append(raw)
        spec = _FIELD_BY_NAME.get(name)
        if spec is None and not name.startswith("DCGM_FI_"):
            if block not in plain_blocks:
                if not plain(block):
                    return None
                plain_blocks.add(block)
            if not (raw.isdigit() or match_number(raw) or raw in _SPECIAL):
                return None  # skipped, but a value that is no number makes the body malformed all the same
            skipped[name] = skipped.get(name, 0) + 1
            slots.append(None)
            continue
        k = block_key.get(block)
        if k is None:
            parsed = block_of(block)
            if parsed is None:
                return None
            key, labels, extra = parsed
            if key in key_index:  # a second label block for one GPU: the columnar parser decides
                return None
            k = block_key[block] = key_index[key] = len(out.keys)
            out.keys.append(key)
            out.fields.append({})
            out.labels.append(labels)
            out.extra.append(extra)
        if raw.isdigit() or match_number(raw):
            value = float(raw)
        elif raw in _SPECIAL:
            value = _SPECIAL[raw]
        else:
            return None
        if spec is None:
            unmapped[name] = unmapped.get(name, 0) + 1
        slots.append(None)
        if not math.isfinite(value):
            nonfinite += 1
            continue
        if spec is None:
            if value >= _INT32_BLANK and _blank(value, "?"):
                blank += 1
            elif (k, name) in seen_metrics:  # a duplicated series: the first one stays
                dups += 1
                slots[-1] = (k, name, 0.0, "d", "?")
            else:
                seen_metrics.add((k, name))
                out.metrics.append((k, name, value))
                slots[-1] = (k, name, 0.0, "m")
            continue
        _, col, factor, kind = spec
        if value >= _INT32_BLANK and _blank(value, kind):  # every sentinel band starts above 2**31 - 16
            blank += 1
            continue
        row = out.fields[k]
        if col in row:
            dups += 1
            slots[-1] = (k, col, factor, "d", kind)
            continue
        row[col] = _scaled(value, factor, col in _INT_COLUMNS)
        slots[-1] = (k, col, factor, "i" if col in _INT_COLUMNS else "f", kind)
    exporter = sum(1 for labels in out.labels if labels[_OUT_INDEX["pod"]] and workload_of(labels) is None)
    meta.update(
        format="prometheus-text-0.0.4", lexer="lines-small", samples=samples,
        skipped_series=sum(skipped.values()), skipped_names=dict(sorted(skipped.items())),
        dcgm_blank_dropped=blank, non_finite_dropped=nonfinite, duplicates_dropped=dups,
        exporter_pod_labels_ignored=exporter,
    )
    meta["unmapped_fields"] = dict(sorted(unmapped.items()))
    return out


def _cut_py(data: bytes) -> tuple[bytes, bytes, list[bytes]]:
    """The body cut at its values (``_VALUE_CUT``): the texts between them joined, their lengths as native
    uint32, and the values (``_lines.cut``)."""
    parts = _VALUE_CUT.split(data)
    texts = parts[0::2]
    return b"".join(texts), array("I", map(len, texts)).tobytes(), parts[1::2]


def _numbers_py(values: list[bytes], high: float) -> tuple[list[float], float, list[int]] | None:
    """The values as floats where each is a plain number, with their minimum (inf for none) and the indices
    of those at or above ``high`` (``_lines.numbers``); else None."""
    if not _PLAIN_NUMBERS.fullmatch(b",".join(values)):
        return None
    try:
        numbers = list(map(float, values))
    except ValueError:
        return None
    low = min(numbers, default=math.inf)
    above = [i for i, v in enumerate(numbers) if v >= high] if numbers and max(numbers) >= high else []
    return numbers, low, above


def _scale_ints_py(values: list[Any], at: list[int], factors: list[float]) -> int:
    """Each ``values[i]`` for ``i`` in ``at`` scaled by its factor and rounded (``_scaled``), in place; how many
    fell outside int64 (``_lines.scale_ints``)."""
    lost = 0
    for i, factor in zip(at, factors):
        values[i] = _scaled(values[i], factor, True)
        lost += values[i] is None
    return lost


_cut = _c.cut if _c is not None else _cut_py
_numbers = _c.numbers if _c is not None else _numbers_py
_scale_ints = _c.scale_ints if _c is not None else _scale_ints_py


def _scaled(value: float, factor: float, integer: bool) -> float | int | None:
    scaled = value * factor
    if not integer:
        return scaled
    r = round(scaled)
    return r if -(2**63) <= r < 2**63 else None


# Where a sample's value went: (key index, gpu_sample column, factor, "i"/"f" for an integer or float
# column, DCGM type) or (key index, DCGM field, 0.0, "m") for a metric_sample; (..., "d", DCGM type or "?") for
# a later copy of a series, dropped but for its value's blank test (a blank there is counted as blank, not as a
# duplicate, so the template declines it); None where it was dropped.
_Slot = tuple[Any, ...] | None


class _Template:
    """What a body's lines are, apart from their values: fills a later body with the same text around them.
    ``blocks``: the GPU each of its distinct label blocks fills (``_key_of_block``), for ``_sibling``."""

    def __init__(self, lines: Lines, slots: list[_Slot], compiled: _Compiled | None = None,
                 blocks: list[int | None] | None = None):
        self.lines = lines
        self.slots = slots
        self.compiled = compiled if compiled is not None else _Compiled(lines, slots)
        self.blocks = blocks

    def fill(self, values: list[bytes]) -> Lines | None:
        if len(values) != len(self.slots):
            return None
        # Every sentinel band and infinity lies above 2**31 - 16: only values there (an energy counter in mJ,
        # say) need their slot's blank test before the index tables take the body.
        got = _numbers(values, _INT32_BLANK)
        if got is None:
            return None
        numbers, low, high = got
        if low == -math.inf:
            return None
        for i in high:
            slot = self.slots[i]
            if slot is not None and _blank(numbers[i], slot[4] if slot[3] != "m" else "?"):
                return None  # a blank or an infinity: dropped and counted line by line
        return self.compiled.fill(self.lines, numbers)


class _Compiled:
    """A template's slots as index tables, so a body is filled with a few C-level passes instead of a
    Python step per value: where each value lands in the key-major gpu_sample rows, which are integers or
    scaled, and the rows that do not change between bodies (inventory, pod attribution, series keys)."""

    def __init__(self, lines: Lines, slots: list[_Slot]):
        cols_seen = {s[1] for s in slots if s is not None and s[3] not in ("m", "d")}
        self.cols = tuple(c for c in _GPU_COLS if c in cols_seen)
        n = len(self.cols)
        at = {c: j for j, c in enumerate(self.cols)}
        k_n = len(lines.keys)
        where = [len(slots)] * (k_n * n)  # the index of a None appended to the values
        ints: list[tuple[int, float]] = []
        self.scaled: list[tuple[int, float]] = []
        metric_at: list[int] = []
        self.series: list[str] = []
        self.metric_keys: list[tuple[int, str]] = []
        for i, slot in enumerate(slots):
            if slot is None or slot[3] == "d":
                continue
            k, col, factor, how = slot[0], slot[1], slot[2], slot[3]
            if how == "m":
                metric_at.append(i)
                self.series.append(series_of(lines.keys[k], lines.extra[k], col))
                self.metric_keys.append((k, col))
                continue
            where[k * n + at[col]] = i
            if how == "i":
                ints.append((i, factor))
            elif factor != 1.0:
                self.scaled.append((i, factor))
        self.int_at = [i for i, _ in ints]
        self.int_factors = [float(factor) for _, factor in ints]
        self.pick = operator.itemgetter(*where) if len(where) > 1 else (lambda v: tuple(v[i] for i in where))
        self.pick_metrics = (operator.itemgetter(*metric_at) if len(metric_at) > 1
                             else (lambda v: tuple(v[i] for i in metric_at)))
        self.n_metrics = len(metric_at)
        self.n_fields = sum(1 for w in where if w != len(slots))
        self.present = [frozenset(c for j, c in enumerate(self.cols) if where[k * n + j] != len(slots)) for k in range(k_n)]
        self.inventory = [inventory_row(key, labels)[:-1] for key, labels in zip(lines.keys, lines.labels)]
        self.workload = [workload_of(labels) for labels in lines.labels]
        fault_cols = [at[c] for c in _FAULT_COLUMNS if c in at]
        self.faults = [k * n + j for k in range(k_n) for j in fault_cols]

    def relabelled(self, lines: Lines) -> _Compiled:
        """These tables for a body whose samples lie where this one's do, with ``lines``' GPUs: what the
        label blocks decide (inventory, pods, series keys) made again, the rest shared."""
        out = copy.copy(self)
        out.series = [series_of(lines.keys[k], lines.extra[k], col) for k, col in self.metric_keys]
        out.inventory = [inventory_row(key, labels)[:-1] for key, labels in zip(lines.keys, lines.labels)]
        out.workload = [workload_of(labels) for labels in lines.labels]
        return out

    def fill(self, base: Lines, numbers: list[float]) -> Lines:
        values: list[Any] = numbers
        lost = _scale_ints(values, self.int_at, self.int_factors)
        for i, factor in self.scaled:
            values[i] *= factor
        metrics = []
        if self.n_metrics:
            metrics = [(k, col, v) for (k, col), v in zip(self.metric_keys, self.pick_metrics(values))]
        values.append(None)
        return Lines(keys=base.keys, labels=base.labels, extra=base.extra, metrics=metrics, meta=dict(base.meta),
                     flat=self.pick(values), compiled=self, n_values=self.n_fields - lost + self.n_metrics)


def faulty(lines: Lines) -> bool:
    """Whether a body carries a fault reading (an XID, ECC or row-remap count above zero): a health event."""
    if lines.flat is not None and lines.compiled is not None:
        flat = lines.flat
        return any(flat[i] for i in lines.compiled.faults)
    return any(row.get(c) for row in lines.fields for c in _FAULT_COLUMNS)


def health_rows(lines: Lines, ts_us: int) -> list[tuple[Any, ...]]:
    """The health events of one body scraped at ``ts_us`` as rows (``dcgm_fields.health_event_rows``): what
    :func:`assemble` gives a body whose GPUs are in no other body of its group. Empty without a fault reading."""
    if not faulty(lines):
        return []
    inventory = [inventory_row(key, labels) for key, labels in zip(lines.keys, lines.labels)]
    host_of_: dict[str, str | None] = {}
    for row in inventory:
        host_of_.setdefault(row[0], row[1])
    return health_event_rows(((ts_us, key, row) for key, row in zip(lines.keys, lines.fields)), host_of_,
                             {row[0]: row[-1] for row in inventory}, source="dcgm")


_TUPLE_COLUMNS = {
    "gpu": tuple(_INVENTORY_SCHEMA)[:-1],
    "gpu_workload": ("ts", "gpu_uuid", "namespace", "pod", "container"),
    "metric_sample": ("ts", "series", "value"),
}


def tuples(parts: list[tuple[Lines, int]]) -> dict[str, tuple[tuple[str, ...], list[tuple[Any, ...]]]]:
    """Many bodies' rows as plain tuples per frame, ``(columns, rows)``, without building frames: what
    ``assemble`` gives, conformed (one row per natural key: for gpu_sample the first copy of each field,
    the first row for other telemetry, the last for inventory; a column null in every row left out;
    timestamps as epoch microseconds). Health events aside: each body's are :func:`health_rows`."""
    fast = _flat_tuples(parts)
    if fast is not None:
        return fast
    samples: dict[tuple[int, str], dict[str, Any]] = {}
    inventory: dict[str, tuple[Any, ...]] = {}
    workload: dict[tuple[int, str], tuple[Any, ...]] = {}
    metrics: dict[tuple[int, str], tuple[Any, ...]] = {}
    for lines, t in parts:
        for key, row, labels in zip(lines.keys, lines.fields, lines.labels):
            kept = samples.get((t, key))
            if kept is None:
                samples[(t, key)] = row
            else:  # the same GPU and instant twice: the first copy of each field stays ("fill")
                samples[(t, key)] = {**row, **kept}
            inventory[key] = inventory_row(key, labels)[:-1]  # gpu has no err_msg column
            work = workload_of(labels)
            if work is not None:
                workload.setdefault((t, key), (t, key, *work))
        for k, name, value in lines.metrics:
            series = series_of(lines.keys[k], lines.extra[k], name)
            metrics.setdefault((t, series), (t, series, value))
    fields = [c for c in _GPU_COLS if any(c in row for row in samples.values())]
    out = {"gpu_sample": (("ts", "gpu_uuid", *fields), [(t, key, *(row.get(c) for c in fields)) for (t, key), row in samples.items()])}
    for name, rows in (("gpu", list(inventory.values())), ("gpu_workload", list(workload.values())), ("metric_sample", list(metrics.values()))):
        cols = _TUPLE_COLUMNS[name]
        keep = [i for i, c in enumerate(cols) if i == 0 or c in ("ts", "gpu_uuid") or any(r[i] is not None for r in rows)]
        out[name] = (tuple(cols[i] for i in keep), [tuple(r[i] for i in keep) for r in rows])
    return out


def _flat_tuples(parts: list[tuple[Lines, int]]) -> dict[str, tuple[tuple[str, ...], list[tuple[Any, ...]]]] | None:
    """``tuples`` for a group of template-filled bodies with one column set and no GPU twice at one
    instant (a fleet's steady state); None for any other group, which the general path takes."""
    if not parts:
        return None
    first = parts[0][0].compiled
    if first is None:
        return None
    cols = first.cols
    if any(lines.flat is None or lines.compiled is None or lines.compiled.cols != cols for lines, _ in parts):
        return None
    n = len(cols)
    samples: list[tuple[Any, ...]] = []
    inventory: dict[str, tuple[Any, ...]] = {}
    workload: list[tuple[Any, ...]] = []
    metrics: list[tuple[Any, ...]] = []
    for lines, t in parts:
        c = lines.compiled
        flat = lines.flat
        assert c is not None and flat is not None
        for k, key in enumerate(lines.keys):
            samples.append((t, key) + flat[k * n:(k + 1) * n])
            work = c.workload[k]
            if work is not None:
                workload.append((t, key, *work))
        for key, row in zip(lines.keys, c.inventory):
            inventory[key] = row
        if lines.metrics:
            metrics.extend((t, series, v) for series, (_, _, v) in zip(c.series, lines.metrics))
    if len({(r[0], r[1]) for r in samples}) != len(samples):
        return None
    out = {"gpu_sample": (("ts", "gpu_uuid", *cols), samples)}
    for name, rows in (("gpu", list(inventory.values())), ("gpu_workload", workload), ("metric_sample", metrics)):
        names = _TUPLE_COLUMNS[name]
        keep = [i for i, col in enumerate(names) if i == 0 or col in ("ts", "gpu_uuid") or any(r[i] is not None for r in rows)]
        out[name] = (tuple(names[i] for i in keep), rows if len(keep) == len(names) else [tuple(r[i] for i in keep) for r in rows])
    return out


def assemble(parts: list[tuple[Lines, int]], source: str = "") -> Batch:
    """One Batch of many bodies, each ``(lines, scrape time in µs since the epoch)``; equal, frame by frame,
    to merging :func:`ingest.dcgm.parse` of each body (duplicate keys across bodies included: the
    store keeps the first copy)."""
    uuids: list[str] = []
    ts_us: list[int] = []
    inv: list[tuple[Any, ...]] = []
    work: list[tuple[Any, ...]] = []
    ms: list[tuple[int, str, float]] = []
    rows: list[dict[str, Any]] = []
    for lines, t in parts:
        rows.extend(lines.fields)
        for key, labels in zip(lines.keys, lines.labels):
            uuids.append(key)
            ts_us.append(t)
            inv.append(inventory_row(key, labels))
            pod = workload_of(labels)
            if pod is not None:
                work.append((t, key, *pod))
        ms.extend((t, series_of(lines.keys[k], lines.extra[k], name), value) for k, name, value in lines.metrics)
    n = len(uuids)
    ts = pl.Series("ts", ts_us, dtype=pl.Int64).cast(UTC_US)
    # polars reads the row dicts in Rust (a missing field is null): a tenth of building the columns in Python.
    fields = pl.from_dicts(rows, schema=_SAMPLE_SCHEMA) if n else pl.DataFrame(schema=_SAMPLE_SCHEMA)
    gpu_sample = fields.with_columns(ts=ts, gpu_uuid=pl.Series(uuids, dtype=pl.String)).select(GPU_SAMPLE.names)
    # Every frame operation costs ~0.1-0.2 ms here whatever its size, so work a group does not need (a
    # node twice, a pod, a fault) is found in Python first and skipped.
    inventory = pl.DataFrame(inv, schema=_INVENTORY_SCHEMA, orient="row")
    by_body = inventory
    repeated = len(set(uuids)) < n
    if repeated:  # a GPU in two bodies: its inventory as the later one says (the store's upsert keeps the last)
        inventory = inventory.unique("gpu_uuid", keep="last", maintain_order=True)
    gpu = inventory.select(GPU.names)
    workload = None
    if work:
        workload = (pl.DataFrame(work, schema={"ts": pl.Int64, **dict.fromkeys(GPU_WORKLOAD.names[1:], pl.String)}, orient="row")
                    .with_columns(pl.col("ts").cast(UTC_US)).sort("gpu_uuid", "ts", "namespace", "pod", "container", nulls_last=True)
                    .unique(["ts", "gpu_uuid"], keep="first", maintain_order=True).select(GPU_WORKLOAD.names))
    metric_sample = None
    if ms:
        metric_sample = pl.DataFrame(ms, schema={"ts": pl.Int64, "series": pl.String, "value": pl.Float64}, orient="row").with_columns(
            pl.col("ts").cast(UTC_US)).select(METRIC_SAMPLE.names)
    health = None
    if any(faulty(lines) for lines, _ in parts):
        if not repeated:
            health = dcgm_health_events(gpu_sample, inventory.select("gpu_uuid", "host", "err_msg"), source="dcgm")
        else:  # each body's events named by its own labels (a GPU moved host between them), as parsed alone
            at, events = 0, []
            for lines, _ in parts:
                rows = len(lines.keys)
                if faulty(lines):
                    events.append(dcgm_health_events(gpu_sample.slice(at, rows), by_body.slice(at, rows).select("gpu_uuid", "host", "err_msg"),
                                                     source="dcgm"))
                at += rows
            found = [e for e in events if e is not None]
            health = pl.concat(found).sort("ts", "gpu_uuid", "kind", "code") if found else None
    return Batch(source=source, gpu=gpu if n else GPU.empty(), gpu_sample=gpu_sample, gpu_workload=workload,
                 health_event=health, metric_sample=metric_sample, meta={})

"""Whole-request templates for OTLP protobuf pushes: an agent's body, read again without walking it.

An agent (or a Collector per node) sends the same request every interval with new times and values. In
the protobuf wire format (https://protobuf.dev/programming-guides/encoding/) a ``NumberDataPoint``'s
``start_time_unix_nano`` (2), ``time_unix_nano`` (3), ``as_double`` (4) and ``as_int`` (6) are fixed64
fields: 8 bytes whatever they hold, so a repeat body has the same length and the same bytes everywhere
but in those slots. A template records, for one body, where its slots are (its *shape*), a digest of
the body with the slots zeroed, and which slot each reading of the request's ``_Walk`` came from. A
later body with the same length, shape and digest is the same request with other times and values; its
walk is gathered from its slots with numpy, where the general path (``ingest.otlp._parse_protobuf``)
walks 30 metrics and 240 points in Python.

Which slot feeds which reading is not worked out here: the general path tells. The template's body is
read twice by it, as sent and as a *probe* (slot j's time set to (j+1) µs, every value to 1), so every
reading of the probe's walk names its slot and carries its unit factor. A template is kept only where
its own body, filled from it, gives exactly the walk the general path gave; and only for walks of GPU
samples and plain series (no NCCL operations, no inference-server histograms, nothing rejected). A body
the template cannot vouch for (a value that is not finite, out of range for its column, a zero time)
returns None and goes the general way, which counts the rejection as before.

A fleet's nodes send bodies of one shape that differ, outside the slots, only in the names they carry: a
GPU's UUID, the host, a pod. A node's first body is read from another node's template *renamed*
(``_renamed``) where every byte it differs in lies inside the string value of an attribute that only
names something (``_NAME_KEYS``), and the names map one to one: the general walk treats such a value as an
opaque name, so its walk of the new body is the known walk with the names replaced. The first few renamed
reads of each shape are checked against the general path; one disagreement turns renaming off for it.
"""

from __future__ import annotations

import re
import threading
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fleetscope.core import hashing
from fleetscope.core.dcgm_fields import EXPORTER_POD_MARK
from fleetscope.core.protowire import WireError
from fleetscope.core.protowire import fields as _fields
from ingest.otlp_mapping import _INT_COLUMNS, _UUID_KEYS, _WORKLOAD_KEYS, _Walk

_B8 = np.arange(8, dtype=np.int64)
_I64_MIN, _I64_END = -float(2**63), float(2**63)

# Templates by (shape, digest of the body with its slots zeroed): one a node, a fleet's worth per process.
_MAX_TEMPLATES = 16_384
# Shapes by body length: bodies of one length from a fleet's nodes usually share one.
_MAX_SHAPES_PER_LENGTH = 4
# Larger bodies are a scrape of many GPUs, read by the wire path's own layouts.
MAX_BYTES = 512 * 1024
# What the shapes may hold in memory together (about 150 KB for an 8-GPU body's); past it all are forgotten.
_MAX_SHAPE_BYTES = 64 * 2**20
# Attributes whose values the general walk (ingest.otlp_mapping) only uses as names: compared for equality,
# copied into the GPU's inventory or pod, never parsed or tested for a value. A pod's name is also tested
# for dcgm-exporter's mark, which a renamed read checks stays as it was.
_NAME_KEYS = frozenset((*_UUID_KEYS, "Hostname", "hostname", "host.name", "k8s.node.name", "pci_bus_id", "modelName",
                        "model_name", "hw.model", *(k for _, keys in _WORKLOAD_KEYS for k in keys)))
# What a renamed value may hold: printable ASCII without the characters label syntax escapes.
_NAME_BYTES = re.compile(rb'[^\x00-\x1f"\\,={}\x7f-\xff]+')
# Renamed reads of a shape checked against the general path before renaming is trusted for it.
_RENAME_CHECKS = 2


@dataclass
class _Shape:
    """Where the fixed64 slots of one body's data points are."""

    ident: int
    size: int
    keep: np.ndarray  # uint8 per byte: 0xFF outside the slots, 0 in them
    time_idx: np.ndarray  # (points, 8) byte positions of each point's time
    value_idx: np.ndarray  # (points, 8) byte positions of each point's value
    value_tag_at: np.ndarray  # position of each point's value tag (0x21 double, 0x31 int)
    struct_idx: np.ndarray  # every byte the walk that found the slots read
    struct_bytes: np.ndarray  # and what it read there
    ref: _Reference | None = None  # the first body templated in this shape, for renamed reads

    @property
    def nbytes(self) -> int:
        return self.keep.nbytes + self.time_idx.nbytes + self.value_idx.nbytes + self.struct_idx.nbytes + self.struct_bytes.nbytes

    def digest(self, arr: np.ndarray) -> bytes:
        return hashing.sha256(np.bitwise_and(arr, self.keep).data).digest()  # SHA-NI: faster than BLAKE2 here


@dataclass
class _Reference:
    """A templated body of a shape, with where its attributes' string values are, for renamed reads."""

    masked: np.ndarray  # the body with its slots zeroed
    tpl: _Template
    starts: np.ndarray  # each string value's first byte, ascending
    ends: np.ndarray
    nameable: np.ndarray  # per value span: its key only names things and its text may be renamed
    value_of: np.ndarray  # per value span: which distinct text it holds
    texts: list[str]  # the distinct texts
    members: list[np.ndarray]  # per text: the spans holding it
    clean: np.ndarray  # per text: its bytes occur in the body only as those spans
    inside: frozenset[int]  # the texts some text of the template holds inside it (a series key, a composed id)
    checked: int = 0
    off: bool = False
    _places: dict[int, tuple[np.ndarray, np.ndarray] | None] = field(default_factory=dict)

    def places(self, t: int) -> tuple[np.ndarray, np.ndarray] | None:
        """None where text ``t`` may not be renamed (not ``clean``, inside another text, or a span of it under a key
        that does not only name); else the byte offsets of its places after the first, each beside the offset of the
        same byte in the first place, so that one gather tells whether a body holds one name at all of them. Worked
        out once a text: a shape's new nodes rename the same texts of its reference."""
        if t in self._places:
            return self._places[t]
        spans = self.members[t]
        found = None
        if self.clean[t] and t not in self.inside and self.nameable[spans].all():
            first, n = int(self.starts[spans[0]]), int(self.ends[spans[0]] - self.starts[spans[0]])
            others = (self.starts[spans[1:]][:, None] + np.arange(n)).ravel()
            found = (others, np.tile(np.arange(first, first + n), spans.size - 1))
        self._places[t] = found
        return found


@dataclass
class _Part:
    """One of the walk's GPU parts: its points' slots, GPU numbers, column and unit factor."""

    slots: np.ndarray
    gids: np.ndarray
    column: str
    factor: float
    integer: bool


@dataclass
class _Template:
    is_int: np.ndarray  # per point: the value is as_int
    parts: list[_Part]
    series: list[tuple[int, str]]  # (slot, series key) of each plain series point, in walk order
    workloads: list[tuple[int, dict[str, Any]]]  # (slot of the GPU's first point, row without ts_us)
    gpus: list[dict[str, Any]]
    accepted: int
    # (slots, factor per part as a column, integer parts) where every part has as many points
    grid: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
    # where the grid's parts all name the same GPUs in the same order, each once (a scrape): those GPU
    # numbers, the columns in the order ``otlp._scrape_columns`` gives them, and the part feeding each
    # (a later metric of a column wins)
    scrape: tuple[np.ndarray, list[str], np.ndarray] | None = None

    def __post_init__(self) -> None:
        if self.grid is None and self.parts and len({p.slots.size for p in self.parts}) == 1:
            self.grid = (np.stack([p.slots for p in self.parts]), np.array([[p.factor] for p in self.parts]),
                         np.array([p.integer for p in self.parts]))
            g0 = self.parts[0].gids
            if all(np.array_equal(p.gids, g0) for p in self.parts) and np.unique(g0).size == g0.size:
                last = {p.column: i for i, p in enumerate(self.parts)}
                self.scrape = (g0, list(last), np.array(list(last.values()), np.int64))


_SHAPES: dict[int, list[_Shape]] = {}
_TEMPLATES: dict[tuple[int, bytes], _Template] = {}
_shape_count = 0
_stats = {"hits": 0, "learned": 0, "misses": 0, "renamed": 0}
_lock = threading.Lock()


def clear() -> None:
    """Forget every template (tests; a process keeps its own)."""
    _SHAPES.clear()
    _TEMPLATES.clear()
    _stats.update(hits=0, learned=0, misses=0, renamed=0)


def lookup(data: bytes) -> Any:
    """The walk of ``data`` from a template, or None where none vouches for it."""
    return _lookup(data, {})


def _lookup(data: bytes, digests: dict[int, bytes]) -> Any:
    """``lookup``, leaving in ``digests`` each shape's digest of ``data`` it worked out (by shape ident)."""
    shapes = _SHAPES.get(len(data))
    if shapes:
        arr = np.frombuffer(data, np.uint8)
        for shape in list(shapes):
            digest = digests[shape.ident] = shape.digest(arr)
            tpl = _TEMPLATES.get((shape.ident, digest))
            if tpl is not None:
                walk = _fill(tpl, shape, arr)
                if walk is not None:
                    _stats["hits"] += 1
                return walk
    _stats["misses"] += 1
    return None


def lookup_renamed(data: bytes) -> Any:
    """``lookup``; where no template holds ``data``, a renamed read (``_renamed``) if its shape's renaming has
    passed its checks, so that no general read is spent (cheap enough for the API's event loop); else None."""
    digests: dict[int, bytes] = {}
    walk = _lookup(data, digests)
    shapes = _SHAPES.get(len(data)) if walk is None and len(data) <= MAX_BYTES else None
    if not shapes or _backing_off() or not any(s.ref is not None and not s.ref.off and s.ref.checked >= _RENAME_CHECKS for s in list(shapes)):
        return walk
    # never waits: a worker thread may hold the lock through a general read, which the event loop must not sit behind
    if not _lock.acquire(blocking=False):
        return None
    try:
        if len(_TEMPLATES) >= _MAX_TEMPLATES:
            return None
        arr = np.frombuffer(data, np.uint8)
        shape = _known_shape(arr)
        ref = shape.ref if shape is not None else None
        if ref is None or ref.off or ref.checked < _RENAME_CHECKS:
            return None
        return _renamed(shape, ref, data, arr, None, digests.get(shape.ident))[0]
    finally:
        _lock.release()


def _backing_off() -> bool:
    return _stats["learned"] >= _MAX_TEMPLATES // 2 and 4 * _stats["hits"] < _stats["learned"] and bool(_stats["misses"] % 16)


def learn(data: bytes, walk: Any, read: Any) -> None:
    """Make a template of ``data``, whose walk the general path (``read``: bytes to walk) gave as ``walk``,
    where one can stand for it. Learning costs about two general reads. A fleet's first round learns a
    template per node (up to half the cache; the rest once those come back) and the rounds after use
    them; a sender whose bodies never come again would pay that on every push, so past half the cache
    with fewer hits than a quarter of the templates learned, only one miss in 16 tries."""
    if walk.colls or walk.serving or walk.rejected or len(data) > MAX_BYTES:
        return
    if _backing_off():
        return
    with _lock:
        if len(_TEMPLATES) >= _MAX_TEMPLATES or sum(x.nbytes for v in _SHAPES.values() for x in v) > _MAX_SHAPE_BYTES:
            _evict()
        _learn(data, walk, read)


def read_new(data: bytes, read: Any) -> tuple[Any, bool]:
    """The walk of ``data``, which no template holds, from a template made for it now with one general read
    (``read``) where a shape already known fits it: a fleet's nodes send bodies of one shape, and each node's
    first body then costs one general read, of its probe, instead of two (the body, then its probe). The
    template is kept only where it gives its probe's walk exactly; with every slot's time distinct there,
    that proves which slot feeds which reading, and the body's own times and values are then read as every
    later body's are. (walk, True); (None, True) where the read was spent without a template (the caller
    reads the body the general way and learns nothing more); (None, False) where nothing was tried."""
    if len(data) > MAX_BYTES or not _SHAPES.get(len(data)) or _backing_off():
        return None, False
    with _lock:
        if len(_TEMPLATES) >= _MAX_TEMPLATES:
            return None, False  # the general way, whose ``learn`` makes room
        arr = np.frombuffer(data, np.uint8)
        shape = _known_shape(arr)
        if shape is None:
            return None, False
        if shape.ref is not None and not shape.ref.off:
            walk, spent = _renamed(shape, shape.ref, data, arr, read)
            if walk is not None or spent:
                return walk, True
        probe, is_int = _probe(arr, shape)
        try:
            pw = read(probe.tobytes())
        except Exception:  # noqa: BLE001 - the body itself is read the general way, which says what is wrong
            return None, True
        if pw.colls or pw.serving or pw.rejected:
            return None, True
        n = shape.time_idx.shape[0]
        tpl = _derive(pw, None, is_int, n)
        if tpl is None:
            return None, True
        own = _fill(tpl, shape, probe)
        if own is None or not same_walk(own, pw):
            return None, True
        walk = _fill(tpl, shape, arr)
        if walk is None:
            return None, True  # a value the template cannot vouch for: the general way counts it
        _keep(shape, tpl, data, arr)
        return walk, True


def _probe(arr: np.ndarray, shape: _Shape) -> tuple[np.ndarray, np.ndarray]:
    """``arr`` with slot j's time set to (j+1) µs and every value to 1 (of its kind); and which values are ints."""
    tag = arr[shape.value_tag_at]
    probe = arr.copy()
    n = shape.time_idx.shape[0]
    probe[shape.time_idx] = np.arange(1000, 1000 * (n + 1), 1000, dtype="<u8").view(np.uint8).reshape(n, 8)
    is_int = tag == 0x31
    ones = np.where(is_int, np.int64(1).view("<u8"), np.float64(1.0).view("<u8")).astype("<u8")
    probe[shape.value_idx] = ones.view(np.uint8).reshape(n, 8)
    return probe, is_int


def _learn(data: bytes, walk: Any, read: Any) -> None:
    shape = _find_shape(data)
    if shape is None:
        return
    arr = np.frombuffer(data, np.uint8)
    probe, is_int = _probe(arr, shape)
    n = shape.time_idx.shape[0]
    try:
        pw = read(probe.tobytes())
    except Exception:  # noqa: BLE001 - a body whose probe reads otherwise is not templated
        return
    tpl = _derive(pw, walk, is_int, n)
    if tpl is None:
        return
    filled = _fill(tpl, shape, arr)
    if filled is None or not same_walk(filled, walk):
        return  # the general path reads this body in a way the template does not capture
    _keep(shape, tpl, data, arr)


def _keep(shape: _Shape, tpl: _Template, data: bytes, arr: np.ndarray) -> None:
    """Keep ``tpl`` as the template of ``data``; the shape's first becomes its reference for renamed reads."""
    _TEMPLATES[(shape.ident, shape.digest(arr))] = tpl
    _stats["learned"] += 1
    if shape.ref is None:
        shape.ref = _reference(data, arr, shape, tpl)


def _reference(data: bytes, arr: np.ndarray, shape: _Shape, tpl: _Template) -> _Reference:
    """``data`` as the reference of its shape: where the string values of its resource's and data points'
    attributes are. Renaming is off (``off``) for a body whose attributes are not plain key/string pairs."""
    spans: list[tuple[int, int, str]] = []

    def attributes(pos: int, end: int, depth: int) -> bool:
        key = value = None
        for num, wt, _at, a, b in _fields(data, pos, end, depth):
            if wt != 2 or num not in (1, 2) or (key if num == 1 else value) is not None:
                return False  # a repeated or unknown field: which one the decoder keeps is not ours to guess
            if num == 1:
                key = (a, b)
            else:
                value = (a, b)
        if key is None or value is None:
            return False
        try:
            name = data[key[0]:key[1]].decode("utf-8")
        except UnicodeDecodeError:
            return False
        inner = list(_fields(data, value[0], value[1], depth + 1))
        if len(inner) == 1 and inner[0][:2] == (1, 2):  # AnyValue.string_value, alone
            spans.append((inner[0][3], inner[0][4], name))
        elif name in _NAME_KEYS:
            return False  # a name given as a number or a bool is a name the walk reads as text: its collisions go unseen
        return True

    def each(pos: int, end: int, depth: int, want: int) -> Any:
        return ((a, b) for num, wt, _at, a, b in _fields(data, pos, end, depth) if num == want and wt == 2)

    ok = True
    try:
        for rm in each(0, len(data), 0, 1):
            for num, wt, _at, a, b in _fields(data, *rm, 1):
                if num == 1 and wt == 2:  # Resource
                    ok &= all(attributes(*kv, 3) for kv in each(a, b, 2, 1))
                elif num == 2 and wt == 2:  # ScopeMetrics
                    for metric in each(a, b, 2, 2):
                        for data_ in (x for n, w, _t, *x in _fields(data, *metric, 3) if n in (5, 7) and w == 2):
                            for point in each(*data_, 4, 1):
                                ok &= all(attributes(*kv, 6) for kv in each(*point, 5, 7))
    except (WireError, RecursionError):
        ok = False
    spans.sort()
    starts = np.array([a for a, _, _ in spans], np.int64)
    ends = np.array([b for _, b, _ in spans], np.int64)
    texts: dict[bytes, int] = {}
    value_of = np.array([texts.setdefault(data[a:b], len(texts)) for a, b, _ in spans], np.int64)
    raw = list(texts)
    nameable = np.array([k in _NAME_KEYS and _NAME_BYTES.fullmatch(data[a:b]) is not None for a, b, k in spans], bool)
    members = [np.flatnonzero(value_of == i) for i in range(len(raw))]
    clean = np.array([bool(t) and data.count(t) == m.size for t, m in zip(raw, members)], bool)
    texts = [t.decode("latin-1") for t in raw]
    exact = set(texts)
    composed = [v for v in _texts(tpl) if v not in exact]
    inside = frozenset(i for i, t in enumerate(texts) if any(t in v for v in composed))
    return _Reference(np.bitwise_and(arr, shape.keep), tpl, starts, ends, nameable, value_of, texts, members, clean, inside,
                      off=not ok or not spans)


def _texts(tpl: _Template) -> list[str]:
    """Every text a template's walk carries: inventory, pods, series keys."""
    out = [v for g in tpl.gpus for v in g.values() if isinstance(v, str)]
    out += [v for _slot, row in tpl.workloads for v in row.values() if isinstance(v, str)]
    return out + [key for _slot, key in tpl.series]


def _renamed(shape: _Shape, ref: _Reference, data: bytes, arr: np.ndarray, read: Any, digest: bytes | None = None) -> tuple[Any, bool]:
    """The walk of ``data`` from its shape's reference template with names replaced, kept as ``data``'s
    own template; (None, False) where ``data`` differs from the reference in more than names. The first
    ``_RENAME_CHECKS`` of a shape are read the general way too ((walk, True) either way; (None, True) where
    that read failed: the caller reads again and says why)."""
    masked = np.bitwise_and(arr, shape.keep)
    diff = np.flatnonzero(masked != ref.masked)
    if not diff.size:
        return None, False
    at = np.searchsorted(ref.starts, diff, side="right") - 1
    if at[0] < 0 or (diff >= ref.ends[at]).any():
        return None, False  # a byte outside every string value
    changed = at[np.flatnonzero(np.diff(at, prepend=-1))]  # ``at`` ascends with ``diff``
    if not ref.nameable[changed].all():
        return None, False
    texts = set(ref.value_of[changed].tolist())
    places = [ref.places(t) for t in texts]
    if any(p is None for p in places):
        return None, False
    # every other place of each name against its first, in one gather (a host's is in each of a node's 240 points)
    others = np.concatenate([p[0] for p in places])  # type: ignore[index]
    if others.size and not np.array_equal(arr[others], arr[np.concatenate([p[1] for p in places])]):  # type: ignore[index]
        return None, False  # one name became two: the walk would see two things where it saw one
    names: dict[str, str] = {}
    for t in texts:
        spans = ref.members[t]
        first, n = int(ref.starts[spans[0]]), int(ref.ends[spans[0]] - ref.starts[spans[0]])
        new = data[first:first + n]
        if _NAME_BYTES.fullmatch(new) is None:
            return None, False
        old, text = ref.texts[t], new.decode("ascii")
        if text in names.values() or text in ref.texts or (EXPORTER_POD_MARK in old) != (EXPORTER_POD_MARK in text):
            return None, False  # two names became one, or a pod became or stopped being the exporter's own
        names[old] = text
    tpl = _rename(ref.tpl, names)
    walk = _fill(tpl, shape, arr)
    if walk is None:
        return None, False
    if ref.checked < _RENAME_CHECKS:
        try:
            want = read(data)
        except Exception:  # noqa: BLE001 - the caller reads it again and says what is wrong
            ref.off = True
            return None, True
        if not same_walk(walk, want):
            ref.off = True
            return want, True
        ref.checked += 1
    # the digest ``lookup`` took of this body for its shape, where it took one
    _TEMPLATES[(shape.ident, digest if digest is not None else hashing.sha256(masked.data).digest())] = tpl
    _stats["learned"] += 1
    _stats["renamed"] += 1
    return walk, True


def _rename(tpl: _Template, names: dict[str, str]) -> _Template:
    """``tpl`` with every text that is one of ``names`` replaced (none holds one inside it: ``_Reference.inside``)."""
    gpus = [{k: names.get(v, v) if isinstance(v, str) else v for k, v in g.items()} for g in tpl.gpus]
    workloads = [(slot, {k: names.get(v, v) if isinstance(v, str) else v for k, v in row.items()}) for slot, row in tpl.workloads]
    return _Template(tpl.is_int, tpl.parts, tpl.series, workloads, gpus, tpl.accepted, tpl.grid, tpl.scrape)


def _evict() -> None:
    _TEMPLATES.clear()
    _SHAPES.clear()


def _known_shape(arr: np.ndarray) -> _Shape | None:
    """The known shape of a body of this length whose bytes, at every place its walk read, are this body's."""
    return next((s for s in list(_SHAPES.get(arr.size, ())) if np.array_equal(arr[s.struct_idx], s.struct_bytes)), None)


def _find_shape(data: bytes) -> _Shape | None:
    """The fixed64 slots of every data point of every gauge/sum in ``data``, or None where a point has no
    time or no value, or one of them twice. A shape of this length already known is taken where the body
    has the same bytes at every place this walk would read (each field's tag and length, each varint):
    the walk would then find the same slots."""
    global _shape_count
    arr = np.frombuffer(data, np.uint8)
    known = _known_shape(arr)
    if known is not None:
        return known
    times: list[int] = []
    values: list[int] = []
    tags: list[int] = []
    starts: list[int] = []
    read_at: list[int] = []  # [start, end) of every byte range the walk reads, flat
    mark = read_at.extend

    def fields(pos: int, end: int, depth: int) -> Any:
        for num, wt, at, a, b in _fields(data, pos, end, depth):
            mark((at, a if wt in (1, 2, 5) else b))
            yield num, wt, at, a, b

    try:
        for num, wt, _at, a, b in fields(0, len(data), 0):
            if num != 1 or wt != 2:
                continue
            for num2, wt2, _at2, a2, b2 in fields(a, b, 1):
                if num2 != 2 or wt2 != 2:
                    continue
                for num3, wt3, _at3, a3, b3 in fields(a2, b2, 2):
                    if num3 != 2 or wt3 != 2:
                        continue
                    for num4, wt4, _at4, a4, b4 in fields(a3, b3, 3):
                        if num4 not in (5, 7) or wt4 != 2:
                            continue
                        for num5, wt5, _at5, a5, b5 in fields(a4, b4, 4):
                            if num5 != 1 or wt5 != 2:
                                continue
                            t = v = tag_at = -1
                            for num6, wt6, at6, a6, _b6 in fields(a5, b5, 5):
                                if wt6 != 1:
                                    continue
                                if num6 == 3:
                                    if t >= 0:
                                        return None
                                    t = a6
                                elif num6 in (4, 6):
                                    if v >= 0:
                                        return None
                                    v, tag_at = a6, at6
                                elif num6 == 2:
                                    starts.append(a6)
                            if t < 0 or v < 0 or v - tag_at != 1:
                                return None  # no time, no value, or a tag in more than one byte
                            times.append(t)
                            values.append(v)
                            tags.append(tag_at)
    except (WireError, RecursionError):
        return None
    if not times:
        return None
    keep = np.full(len(data), 0xFF, np.uint8)
    time_idx = np.array(times, np.int64)[:, None] + _B8
    value_idx = np.array(values, np.int64)[:, None] + _B8
    keep[time_idx] = 0
    keep[value_idx] = 0
    if starts:
        keep[np.array(starts, np.int64)[:, None] + _B8] = 0
    spans = np.array(read_at, np.int64).reshape(-1, 2)
    lengths = spans[:, 1] - spans[:, 0]
    offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    struct_idx = np.repeat(spans[:, 0] - offsets, lengths) + np.arange(int(lengths.sum()))
    shapes = _SHAPES.setdefault(len(data), [])
    if len(shapes) >= _MAX_SHAPES_PER_LENGTH:
        return None
    _shape_count += 1
    shape = _Shape(_shape_count, len(data), keep, time_idx, value_idx, np.array(tags, np.int64), struct_idx, arr[struct_idx].copy())
    shapes.append(shape)
    return shape


def _derive(probe: Any, walk: Any, is_int: np.ndarray, n: int) -> _Template | None:
    """Read off the probe's walk which slot each reading came from; None where the probe's walk is not
    the real one's in everything but times and values (``walk`` None: the probe's is the only walk read)."""
    same = walk is None
    walk = probe if walk is None else walk
    if (probe.colls or probe.serving or probe.rejected or probe.accepted != walk.accepted or probe.gpus != walk.gpus
            or len(probe.parts) != len(walk.parts) or len(probe.series_rows) != len(walk.series_rows)
            or len(probe.workloads) != len(walk.workloads)):
        return None
    parts = []
    fed = []
    for (pts, pg, pcol, pv), (_wts, wg, wcol, _wv) in zip(probe.parts, walk.parts):
        slots = pts - 1
        if (not same and (pcol != wcol or not np.array_equal(pg, wg))) or slots.min(initial=0) < 0 or slots.max(initial=0) >= n:
            return None
        if not pv.size or not (pv == pv[0]).all():
            return None
        parts.append(_Part(slots.astype(np.int64), pg.copy(), pcol, float(pv[0]), False))
        fed.append(slots)
    series = []
    for (ts_us, key), value in probe.series_rows.items():
        if value != 1.0 or not 1 <= ts_us <= n:
            return None
        series.append((ts_us - 1, key))
        fed.append(np.array([ts_us - 1]))
    workloads = []
    for pw, ww in zip(probe.workloads, walk.workloads):
        if {k: v for k, v in pw.items() if k != "ts_us"} != {k: v for k, v in ww.items() if k != "ts_us"} or not 1 <= pw["ts_us"] <= n:
            return None
        workloads.append((pw["ts_us"] - 1, {k: v for k, v in pw.items() if k != "ts_us"}))
    for p in parts:
        p.integer = p.column in _INT_COLUMNS
    covered = np.zeros(n, bool)
    for slots in fed:
        covered[slots] = True
    if not covered.all():
        return None  # a point no reading comes from: its value might still decide a rejection
    return _Template(is_int, parts, series, workloads, [dict(g) for g in walk.gpus], walk.accepted)


def _fill(tpl: _Template, shape: _Shape, arr: np.ndarray) -> Any:
    ts_ns = arr[shape.time_idx].view("<u8").ravel()
    raw = arr[shape.value_idx]
    values = raw.view("<f8").ravel()
    if tpl.is_int.any():
        values = values.copy()
        values[tpl.is_int] = raw.view("<i8").ravel()[tpl.is_int].astype(np.float64)
    if not np.isfinite(values).all() or not ts_ns.all():  # every point feeds a reading
        return None  # the general path rejects such a point and says why
    ts_us = (ts_ns // 1000).astype(np.int64)
    walk = _Walk()
    if tpl.grid is not None:
        # every part has as many points (a scrape: one a GPU per metric): all parts in a few array operations
        grid, factors, integer = tpl.grid
        scaled = values[grid] * factors
        if integer.any():
            ints = scaled[integer]
            if not ((ints >= _I64_MIN) & (ints < _I64_END)).all():
                return None
        times = ts_us[grid]
        walk.parts = [(times[i], p.gids, p.column, scaled[i]) for i, p in enumerate(tpl.parts)]
        if tpl.scrape is not None and (times == times[0, 0]).all():
            # every point at one time: what ``otlp._scrape_columns`` would work out, and the values as one matrix
            gids, columns, rows = tpl.scrape
            matrix = scaled[rows]
            walk._scrape = (times[0], gids, dict(zip(columns, matrix)))
            walk._one_ts_us = int(times[0, 0])  # the door's future-skew check reads it instead of every part's times
            walk._matrix = (columns, matrix, integer[rows])
    else:
        for p in tpl.parts:
            scaled = values[p.slots] * p.factor
            if p.integer and not ((scaled >= _I64_MIN) & (scaled < _I64_END)).all():
                return None
            walk.parts.append((ts_us[p.slots], p.gids, p.column, scaled))
    for slot, key in tpl.series:
        walk.series_rows[(int(ts_us[slot]), key)] = float(values[slot])
    for slot, row in tpl.workloads:
        walk.workloads.append({"ts_us": int(ts_us[slot]), **row})
    walk.gpus = [dict(g) for g in tpl.gpus]
    walk.gpu_index = {g["gpu_uuid"]: i for i, g in enumerate(walk.gpus)}
    walk.accepted = tpl.accepted
    walk.rejected = Counter()
    return walk


def same_walk(a: Any, b: Any) -> bool:
    """Whether two walks hold the same readings, bit for bit."""
    if (a.gpus != b.gpus or a.gpu_index != b.gpu_index or a.workloads != b.workloads or a.accepted != b.accepted
            or a.rejected != b.rejected or a.colls != b.colls or a.serving != b.serving or len(a.parts) != len(b.parts)):
        return False
    if list(a.series_rows.items()) != list(b.series_rows.items()):
        # bit for bit: NaN never stands here (rejected), so == is exact but for -0.0 == 0.0
        return False
    if any(np.signbit(np.float64(x)) != np.signbit(np.float64(y)) for x, y in zip(a.series_rows.values(), b.series_rows.values())):
        return False
    for (t1, g1, c1, v1), (t2, g2, c2, v2) in zip(a.parts, b.parts):
        if c1 != c2 or t1.dtype != t2.dtype or g1.dtype != g2.dtype or v1.dtype != v2.dtype:
            return False
        if not (np.array_equal(t1, t2) and np.array_equal(g1, g2) and v1.tobytes() == v2.tobytes()):
            return False
    return True

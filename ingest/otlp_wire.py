"""The OTLP protobuf wire path: protobuf bodies without a message object per data point.

Wire format: https://protobuf.dev/programming-guides/encoding/. Field numbers: opentelemetry-proto
collector/metrics/v1/metrics_service.proto, metrics/v1/metrics.proto, common/v1/common.proto.
A short walk down to each Metric (``_strip``) cuts the points of GPU gauges/sums out of the body; upb
decodes the rest, so everything else is checked and read exactly as before. The cut points are read
as numpy columns when every point has the layout collectors write (time, value, then plain string
attributes), each distinct attribute byte string decoded once; a GPU metric with a point of another
shape is decoded by upb from its own bytes and walked as before. Either way ``_Walk`` gets the same.

A malformed body's ParseError names what is wrong and its byte offset (``locate_error``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fleetscope.core.errors import ParseError
from fleetscope.core.protowire import MAX_DEPTH as _MAX_DEPTH
from fleetscope.core.protowire import WireError as _WireError
from fleetscope.core.protowire import fields as _fields
from fleetscope.core.protowire import uvarint as _uvarint
from ingest.otlp_mapping import _INSPECTOR_OPS, _UUID_KEYS, _gpu_target
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import DecodeError

_B8 = np.arange(8, dtype=np.int64)


def locate_error(data: bytes) -> str | None:
    """Where an ``ExportMetricsServiceRequest`` body is malformed, walking it with the real schema: the
    first wire error, invalid UTF-8 in a string field or nesting past upb's limit, with its byte offset
    and field path. None where the walk finds nothing (upb's own message is then the best there is)."""

    try:
        _check(data, 0, len(data), ExportMetricsServiceRequest.DESCRIPTOR, 0, "request")
    except _WireError as exc:
        return str(exc)
    except RecursionError:
        return "messages nested too deeply"
    return None


def _check(data: bytes, pos: int, end: int, desc: Any, depth: int, path: str) -> None:
    seen: dict[int, int] = {}
    try:
        for num, wt, at, a, b in _fields(data, pos, end, depth):
            f = desc.fields_by_number.get(num)
            if f is None or wt != 2:
                continue
            if f.type == FieldDescriptor.TYPE_MESSAGE:
                i = seen[num] = seen.get(num, -1) + 1
                where = f"{path}.{f.name}" + (f"[{i}]" if _repeated(f) else "")
                if depth + 1 >= _MAX_DEPTH:
                    raise _WireError(f"messages nested deeper than {_MAX_DEPTH}", at, where)
                _check(data, a, b, f.message_type, depth + 1, where)
            elif f.type == FieldDescriptor.TYPE_STRING:
                try:
                    data[a:b].decode("utf-8")
                except UnicodeDecodeError as exc:
                    raise _WireError("invalid UTF-8 in a string", a + exc.start, f"{path}.{f.name}") from None
    except _WireError as exc:
        exc.where = exc.where or path
        raise


def _repeated(f: Any) -> bool:
    rep = getattr(f, "is_repeated", None)
    return bool(rep) if rep is not None else f.label == f.LABEL_REPEATED


def _strip(data: bytes) -> tuple[bytes, list[tuple[int, int, int, int] | None]] | None:
    """The request with the points of every GPU gauge/sum cut out (the field left, empty), and per Metric
    in request order the (points start, points end, metric start, metric end) that was cut, or None.

    upb decodes the stripped request, checking everything in it as before and making the messages the
    other metrics are read from; the cut points are read by ``_wire_points``, or by upb from the metric's
    own bytes where they have another shape. None where a Metric carries more than one ``data`` oneof
    field: upb keeps the last but still checks the others, so that request goes to upb whole.
    Raises _WireError on malformed structure down to the Metric."""
    cuts: list[tuple[int, int, int, int] | None] = []
    out = []
    for num, wt, at, a, b in _fields(data, 0, len(data)):
        if num != 1 or wt != 2:
            out.append(data[at:b])
            continue
        rm = []
        for num2, wt2, at2, a2, b2 in _fields(data, a, b, 1):
            if num2 != 2 or wt2 != 2:
                rm.append(data[at2:b2])
                continue
            sm = []
            for num3, wt3, at3, a3, b3 in _fields(data, a2, b2, 2):
                if num3 != 2 or wt3 != 2:
                    sm.append(data[at3:b3])
                    continue
                metric = _strip_metric(data, a3, b3, cuts)
                if metric is None:
                    return None
                sm.append(_len_field(2, metric))
            rm.append(_len_field(2, b"".join(sm)))
        out.append(_len_field(1, b"".join(rm)))
    return b"".join(out), cuts


def _strip_metric(data: bytes, start: int, end: int, cuts: list[tuple[int, int, int, int] | None]) -> bytes | None:
    name_at = None
    found = []
    for num, wt, at, a, b in _fields(data, start, end, 3):
        if wt != 2:
            continue
        if num == 1:
            name_at = (a, b)
        elif num in (5, 7, 9, 10, 11):
            found.append((num, at, a, b))
    if len(found) > 1:
        return None
    if found and found[0][0] in (5, 7) and name_at is not None:
        num, at, a, b = found[0]
        try:
            name = data[name_at[0]:name_at[1]].decode("utf-8")
        except UnicodeDecodeError:
            name = ""  # upb refuses the body on this name
        if name not in _INSPECTOR_OPS and _gpu_target(name) != (None, None):
            cuts.append((a, b, start, end))
            return data[start:at] + bytes((num << 3 | 2, 0)) + data[b:end]
    cuts.append(None)
    return data[start:end]


def _len_field(num: int, payload: bytes) -> bytes:
    n, head = len(payload), bytearray([num << 3 | 2])
    while n >= 0x80:
        head.append(n & 0x7F | 0x80)
        n >>= 7
    head.append(n)
    return bytes(head) + payload


def _real_metric(metric: bytes, data: bytes, source: str) -> Any:
    """A Metric's bytes decoded with the real schema, wrapped in a request as deep as the Metric sat in
    the body so that upb's nesting limit falls where it would have."""

    body = _len_field(1, _len_field(2, _len_field(2, metric)))
    try:
        return ExportMetricsServiceRequest.FromString(body).resource_metrics[0].scope_metrics[0].metrics[0]
    except (DecodeError, ValueError, RecursionError) as exc:
        raise ParseError(f"not an OTLP protobuf ExportMetricsServiceRequest: {locate_error(data) or exc}", source=source) from None


class _LabelSets:
    """Distinct attribute byte strings of GPU points, each decoded once: the same label set comes back in
    every metric of a scrape. Only the plainest encoding is taken (each KeyValue a key then a string
    AnyValue, nothing else); anything else sends its metric to upb."""

    def __init__(self) -> None:
        self.index: dict[bytes, int] = {}
        self.attrs: list[dict[str, str]] = []
        self.uuid: list[str | None] = []
        self.simple: list[bool] = []
        self.hw_gpu: list[bool] = []
        self._columns = {"has_uuid": np.zeros(0, bool), "simple": np.zeros(0, bool), "hw_gpu": np.zeros(0, bool), "gid": np.zeros(0, np.int64)}
        self._done = 0  # sets copied into _columns so far
        self.layout: _Layout | None = None

    def add(self, raw: bytes) -> int | None:
        aid = self.index.get(raw)
        if aid is not None:
            return aid
        kvs = _plain_attributes(raw)
        if kvs is None:
            return None
        return self._store(raw, tuple(k for k, _ in kvs), [v for _, v in kvs])

    def add_many(self, raws: list[bytes]) -> bool:
        """Decode new label sets together; False if one is not plain. Sets of one length usually share
        their keys and value lengths (dcgm-exporter's labels: same keys, fixed-width UUID, PCI id, ...):
        those are read as fixed columns of one byte matrix, one template decoded per shape."""
        by_len: dict[int, list[bytes]] = {}
        for raw in dict.fromkeys(raws):
            if raw not in self.index:
                by_len.setdefault(len(raw), []).append(raw)
        for group in by_len.values():
            for _ in range(4):  # a few shapes per length; sets of one length in many shapes go one by one
                if len(group) < 8:
                    break
                before = len(group)
                group = self._add_template(group)
                if group is None:
                    return False
                if before - len(group) < 8:
                    break
            for raw in group:
                if self.add(raw) is None:
                    return False
        return True

    def _add_template(self, group: list[bytes]) -> list[bytes] | None:
        """Store the sets of ``group`` (all one length) laid out like its first; the rest are returned."""
        spans = _plain_spans(group[0])
        if spans is None:
            return None
        arr = np.frombuffer(b"".join(group), np.uint8).reshape(len(group), len(group[0]))
        fixed = np.ones(arr.shape[1], bool)
        for _k0, _k1, v0, v1 in spans:
            fixed[v0:v1] = False
        same = (arr[:, fixed] == arr[0, fixed]).all(axis=1)
        rows = np.flatnonzero(same)
        first = group[0]
        cols = []
        try:
            keys = tuple(first[k0:k1].decode("utf-8") for k0, k1, _v0, _v1 in spans)
            for _k0, _k1, v0, v1 in spans:
                blob = arr[rows, v0:v1].tobytes()
                w = v1 - v0
                if blob.isascii():
                    text = blob.decode("ascii")
                    cols.append([text[i:i + w] for i in range(0, len(text), w)] if w else [""] * rows.size)
                else:
                    cols.append([blob[i:i + w].decode("utf-8") for i in range(0, len(blob), w)] if w else [""] * rows.size)
        except UnicodeDecodeError:
            return None  # upb refuses the body; the message path says so
        # _store, for many sets of one key list: the id and hw.type positions are the template's
        id_at = [j for j, k in enumerate(keys) if k in _UUID_KEYS]
        if len(id_at) > 1 or len(set(keys)) < len(keys):
            for i, vals in zip(rows.tolist(), zip(*cols)):
                self._store(group[i], keys, vals)
        else:
            m = rows.size
            n = len(self.attrs)
            self.attrs.extend(dict(zip(keys, vals)) for vals in zip(*cols))
            self.uuid.extend([v or None for v in cols[id_at[0]]] if id_at else [None] * m)
            self.hw_gpu.extend([v == "gpu" for v in cols[keys.index("hw.type")]] if "hw.type" in keys else [False] * m)
            self.simple.extend([True] * m)
            self.index.update(zip([group[i] for i in rows.tolist()], range(n, n + m)))
        return [group[i] for i in np.flatnonzero(~same).tolist()]

    def _store(self, raw: bytes, keys: tuple[str, ...], vals: Any) -> int:
        attrs = dict(zip(keys, vals))  # repeated keys: the last value, at the first key's place, as _attrs
        id_keys = [k for k in keys if k in _UUID_KEYS]
        # The message path reads the id at the position where it last found it, else the first id
        # attribute with a value. With at most one id attribute both give the same answer for every point.
        self.simple.append(len(id_keys) <= 1)
        self.uuid.append(next((attrs[k] for k in id_keys if attrs[k]), None))
        self.attrs.append(attrs)
        self.hw_gpu.append(attrs.get("hw.type") == "gpu")
        aid = self.index[raw] = len(self.attrs) - 1
        return aid

    def column(self, name: str) -> np.ndarray:
        """``has_uuid``, ``simple``, ``hw_gpu`` or ``gid`` (GPU number, -1 until registered) per set, as a
        view of arrays that grow by doubling: a request of many small metrics adds sets a few at a time."""
        n = len(self.attrs)
        if n > self._done:
            cols = self._columns
            if n > cols["gid"].size:
                cap = max(n, 2 * cols["gid"].size, 64)
                for key, old in cols.items():
                    grown = np.full(cap, -1, np.int64) if key == "gid" else np.zeros(cap, bool)
                    grown[:self._done] = old[:self._done]
                    cols[key] = grown
            new = slice(self._done, n)
            cols["has_uuid"][new] = [u is not None for u in self.uuid[new]]
            cols["simple"][new] = self.simple[new]
            cols["hw_gpu"][new] = self.hw_gpu[new]
            self._done = n
        return self._columns[name][:n]


def _plain_attributes(raw: bytes) -> list[tuple[str, str]] | None:
    """``NumberDataPoint.attributes`` fields (number 7) as (key, string value), or None unless every one is
    exactly ``KeyValue{key: 1, value: 2 AnyValue{string_value: 1}}``. Strings are checked as UTF-8, as
    upb checks them."""
    spans = _plain_spans(raw)
    if spans is None:
        return None
    try:
        return [(raw[k0:k1].decode("utf-8"), raw[v0:v1].decode("utf-8")) for k0, k1, v0, v1 in spans]
    except UnicodeDecodeError:
        return None


def _plain_spans(raw: bytes) -> list[tuple[int, int, int, int]] | None:
    """(key start, key end, value start, value end) of each plain attribute in ``raw`` (see
    ``_plain_attributes``), or None. Lengths under 128 (one varint byte) are read inline."""
    out = []
    pos, end = 0, len(raw)
    try:
        while pos < end:
            if raw[pos] != 0x3A:
                return None
            n = raw[pos + 1]
            if n < 0x80:
                pos += 2
            else:
                n, pos = _uvarint(raw, pos + 1, end)
            kv_end = pos + n
            if kv_end > end or raw[pos] != 0x0A:
                return None
            n = raw[pos + 1]
            if n < 0x80:
                k = pos + 2
            else:
                n, k = _uvarint(raw, pos + 1, kv_end)
            key_end = k + n
            if key_end >= kv_end or raw[key_end] != 0x12:
                return None
            n = raw[key_end + 1]
            if n < 0x80:
                p = key_end + 2
            else:
                n, p = _uvarint(raw, key_end + 1, kv_end)
            if p + n != kv_end or not n or raw[p] != 0x0A:
                return None
            n = raw[p + 1]
            if n < 0x80:
                p += 2
            else:
                n, p = _uvarint(raw, p + 1, kv_end)
            if p + n != kv_end:
                return None
            out.append((k, key_end, p, kv_end))
            pos = kv_end
    except (IndexError, _WireError):
        return None
    return out


class _Layout:
    """Where the fixed-size fields of each point of a Gauge/Sum payload sit, and the payload with those
    bytes zeroed: a payload that equals the skeleton once the same bytes are zeroed has the same points,
    lengths and attributes, differing only in times and values (the next metric of a scrape)."""

    def __init__(self, time_at: np.ndarray, start_at: np.ndarray, aids: np.ndarray, payload: bytes):
        self.size = len(payload)
        self.aids = aids
        self.time_idx = (time_at + 1)[:, None] + _B8
        self.tag_at = time_at + 9
        self.value_idx = (time_at + 10)[:, None] + _B8
        self.zero = np.concatenate([self.time_idx.ravel(), self.tag_at, self.value_idx.ravel(), ((start_at + 1)[:, None] + _B8).ravel()])
        self.skeleton = np.frombuffer(payload, np.uint8).copy()
        self.skeleton[self.zero] = 0
        self._scratch = np.empty_like(self.skeleton)  # reused: a fresh 3 MB array per metric costs page faults

    def matches(self, payload: Any) -> bool:
        if len(payload) != self.size:
            return False
        scratch = self._scratch
        np.copyto(scratch, np.frombuffer(payload, np.uint8))
        scratch[self.zero] = 0
        np.bitwise_xor(scratch, self.skeleton, out=scratch)
        return not scratch.any()


def _split_points(payload: bytes, labels: _LabelSets) -> _Layout | None:
    """Walk a Gauge/Sum payload point by point. None unless every data point (field 1) is
    ``[start_time_unix_nano (2)] time_unix_nano (3) as_double (4) | as_int (6)`` followed by plain
    attributes (7) only, the order the Go and Python serializers write; other fields must be varints
    (Sum's aggregation_temporality and is_monotonic)."""
    pos, end = 0, len(payload)
    time_at: list[int] = []
    start_at: list[int] = []
    aids: list[int] = []
    new: list[tuple[int, bytes]] = []  # label sets not seen yet: decoded together after the walk
    get = labels.index.get
    try:
        while pos < end:
            tag = payload[pos]
            if tag == 0x0A:
                n = payload[pos + 1]
                if n < 0x80:
                    s = pos + 2
                elif payload[pos + 2] < 0x80:  # points of 128 bytes to 16 KiB: a DCGM point with its labels
                    n = (n & 0x7F) | payload[pos + 2] << 7
                    s = pos + 3
                else:
                    n, s = _uvarint(payload, pos + 1, end)
                e = s + n
                if n < 18 or e > end:
                    return None
                t = s
                if payload[s] == 0x11:  # fixed64 start_time_unix_nano
                    if n < 27:
                        return None
                    start_at.append(s)
                    t = s + 9
                if payload[t] != 0x19 or payload[t + 9] not in (0x21, 0x31):  # fixed64 time; double / sfixed64 value
                    return None
                rest = payload[t + 18:e]
                aid = get(rest)
                if aid is None:
                    new.append((len(aids), rest))
                    aid = -1
                time_at.append(t)
                aids.append(aid)
                pos = e
            elif tag == 0x10 or tag == 0x18:
                pos = _uvarint(payload, pos + 1, end)[1]
            else:
                return None
    except (IndexError, _WireError):
        return None
    if new:
        if not labels.add_many([rest for _, rest in new]):
            return None
        for i, rest in new:
            aids[i] = labels.index[rest]
    return _Layout(np.array(time_at, np.int64), np.array(start_at, np.int64), np.array(aids, np.int64), payload)


def _wire_points(payload: Any, labels: _LabelSets) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """(time_unix_nano, value, label set) columns of a Gauge/Sum payload, or None where a point is not of
    the shape ``_split_points`` reads. The points are walked one by one only when the payload differs
    from the last one walked in more than times and values."""
    layout = labels.layout
    if layout is None or not layout.matches(payload):
        layout = _split_points(bytes(payload), labels)
        if layout is None:
            return None
        labels.layout = layout
    buf = np.frombuffer(payload, np.uint8)
    tag = buf[layout.tag_at]
    is_int = tag == 0x31
    if not (is_int | (tag == 0x21)).all():
        return None
    ts_ns = buf[layout.time_idx].view("<u8").ravel()
    raw = buf[layout.value_idx]
    values = raw.view("<f8").ravel().copy()
    if is_int.any():
        values[is_int] = raw.view("<i8").ravel()[is_int].astype(np.float64)
    return ts_ns, values, layout.aids

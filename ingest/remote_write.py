"""Prometheus remote write 1.0 (``prometheus.WriteRequest``, protobuf) -> a :class:`Batch`.

Sites that run Prometheus, vmagent or an OpenTelemetry Collector (``prometheusremotewrite`` exporter)
forward dcgm-exporter's series unchanged; this module reads what they send, after the HTTP layer has
undone the snappy block compression. Spec: https://prometheus.io/docs/specs/remote_write_spec/ and its
``prompb/remote.proto``, ``prompb/types.proto``::

    WriteRequest { repeated TimeSeries timeseries = 1; repeated MetricMetadata metadata = 3; }
    TimeSeries   { repeated Label labels = 1; repeated Sample samples = 2;
                   repeated Exemplar exemplars = 3; repeated Histogram histograms = 4; }
    Label        { string name = 1; string value = 2; }
    Sample       { double value = 1; int64 timestamp = 2; }   // timestamp: ms since the epoch

Mapping: the series become the long (line, name, labels, value, ts_ms) shape the text parser lexes a
``/metrics`` body into, and :func:`ingest.dcgm.from_samples` maps them with the same code, so a series
gives the same ``gpu_sample`` / ``gpu`` / ``gpu_workload`` / ``health_event`` / ``metric_sample`` rows
whichever way it arrived (DCGM fields, unit factors, blank sentinels, MIG keys, the exporter's own pod:
see ``ingest.dcgm``). A series' ``line`` is its 1-based position among the request's time series.

What the sender adds is undone first, so it cannot break the mapping:
- ``job`` and ``instance`` (the scrape target, not the GPU: a GPU is keyed by its UUID) are dropped;
- ``exported_<label>``, Prometheus' rename of an exporter label that clashed with a target label
  (``honor_labels: false``; e.g. the workload's ``pod`` under Kubernetes service discovery, whose own
  ``pod`` is the exporter's) is restored as ``<label>``, replacing the target's;
- empty label values are absent labels (Prometheus semantics);
- other labels added by relabelling stay, as non-standard labels do in the text format (they end up in
  ``metric_sample`` series keys only).

Samples dropped and counted in ``meta``: staleness markers (the NaN with bits ``0x7ff0000000000002`` that
Prometheus writes when a series disappears: ``stale_markers_dropped``), other non-finite values and DCGM
blank sentinels (``non_finite_dropped``, ``dcgm_blank_dropped``, as in the text parser); series of other
metrics (``skipped_series``, ``skipped_names``). Exemplars, native histograms and metadata are read past.

Strictness: the body must be a well-formed WriteRequest. Truncated or malformed wire data (a varint past
10 bytes, a length past its message or negative as int64, a bad wire type or field number), a label name
that is not ``[a-zA-Z_][a-zA-Z0-9_]*``, a label given twice, invalid UTF-8, a series without a valid
``__name__``, a timestamp outside years 1970..9999: :class:`ParseError` naming what and its byte offset.
Unknown fields are skipped, as protobuf decoders must.
"""

from __future__ import annotations

import re
import struct

import numpy as np
import polars as pl

from fleetscope.errors import ParseError
from fleetscope.frames import Batch
from fleetscope.protowire import WireError, fields, tag, uvarint
from ingest.dcgm import from_samples

__all__ = ["STALE_NAN_BITS", "parse"]

STALE_NAN_BITS = 0x7FF0000000000002  # Prometheus' staleness marker (model/value.StaleNaN)
MAX_TS_MS = 253_402_300_799_999  # 9999-12-31T23:59:59.999Z: beyond it no datetime holds the time
_TARGET_LABELS = frozenset({"job", "instance"})
_EXPORTED = "exported_"
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_NAME_LABEL = b"\x0a\x08__name__"  # the start of Label{name: "__name__"} as every encoder writes it
_DOUBLE = struct.Struct("<d")
_I64_WRAP = 1 << 64
_I64_SIGN = 1 << 63


def parse(data: bytes, *, source: str = "") -> Batch:
    """Parse one snappy-decompressed ``prometheus.WriteRequest`` (remote write 1.0) into a Batch.

    An empty body is a valid, empty request. Raises :class:`ParseError` naming the byte offset for a
    malformed body; see the module docstring for what is dropped and counted in ``meta``."""
    reader = _Reader(bytes(data), source)
    try:
        reader.read()
    except WireError as exc:
        raise ParseError(f"malformed remote-write WriteRequest: {exc}", source=source) from None
    return reader.batch()


class _Reader:
    """One pass over a WriteRequest into sample columns; each distinct label byte string decoded once.

    Two paths read a TimeSeries, with the same result. The columnar path (``_columnar``) walks all series
    at once with numpy, one field of every series per step, and vouches only for the layout senders write
    (labels first, one ``__name__``, one-byte tags, samples as value-then-timestamp or a lone timestamp
    for a zero value); a series it does not vouch for, malformed or merely unusual, is read by the exact
    path (``_series``), which raises the error with its byte offset."""

    def __init__(self, data: bytes, source: str):
        self.data, self.source = data, source
        self.buf = np.frombuffer(data, dtype=np.uint8)
        self.n_series = 0
        self.metadata = 0
        self.parts: list[tuple[np.ndarray, ...]] = []  # (line, name code, bid, value, ts_ms) per path
        self.labels: dict[bytes, tuple[str, str]] = {}  # raw Label message -> (name, value)
        self.names: dict[bytes, int] = {}  # raw __name__ Label message -> metric name code
        self.name_list: list[str] = []
        self.name_code: dict[str, int] = {}
        self.bids: dict[tuple[bytes, ...], int] = {}  # raw labels of a series but its name -> label set id
        self.bid_of_set: dict[tuple[tuple[str, str], ...], int] = {}  # normalised label set -> id
        self.label_sets: list[dict[str, str]] = []
        self.target_labels_dropped: set[str] = set()

    # --- the request: where each TimeSeries lies ---------------------------------------------------

    def read(self) -> None:
        data, end = self.data, len(self.data)
        starts: list[int] = []
        stops: list[int] = []
        pos = 0
        while pos < end:
            if data[pos] == 0x0A and pos + 2 < end and data[pos + 1] < 0x80:  # one-byte length
                n, s = data[pos + 1], pos + 2
            elif data[pos] == 0x0A and pos + 3 < end and data[pos + 2] < 0x80:  # two-byte length
                n, s = (data[pos + 1] & 0x7F) | (data[pos + 2] << 7), pos + 3
            else:
                num, wt, at, start, stop = next(fields(data, pos, end))
                if num == 1:
                    self._expect_len(num, wt, at, "WriteRequest.timeseries")
                    starts.append(start)
                    stops.append(stop)
                elif num == 3:
                    self._expect_len(num, wt, at, "WriteRequest.metadata")
                    for _ in fields(data, start, stop):  # read past, but only when well formed
                        pass
                    self.metadata += 1
                pos = stop
                continue
            if n > end - s:
                raise WireError(f"TimeSeries claims {n} bytes but only {end - s} remain", pos, "WriteRequest.timeseries")
            starts.append(s)
            stops.append(s + n)
            pos = s + n
        self.n_series = len(starts)
        start_a, stop_a = np.array(starts, dtype=np.int64), np.array(stops, dtype=np.int64)
        slow = self._columnar(start_a, stop_a)
        for i in np.flatnonzero(slow).tolist():
            self._series(i + 1, starts[i], stops[i])

    def _expect_len(self, num: int, wt: int, at: int, where: str) -> None:
        if wt != 2:
            raise WireError(f"field {num} has wire type {wt}, expected 2 (length-delimited)", at, where)

    # --- the columnar path ---------------------------------------------------------------------------

    def _columnar(self, start: np.ndarray, stop: np.ndarray) -> np.ndarray:
        """Read every series the columnar way can vouch for; returns the mask of those it left."""
        buf, n = self.buf, len(start)
        slow = np.zeros(n, dtype=bool)
        pos = start.copy()
        recs: list[tuple[np.ndarray, ...]] = []  # (series, step, key, tag offset, payload start, stop)
        act = np.flatnonzero(pos < stop)
        step = 0
        while act.size:
            p, e = pos[act], stop[act]
            key = buf[p]
            length, s, ok = _varints(buf, p + 1, e)
            ok &= ((key == 0x0A) | (key == 0x12)) & (length <= (e - s).clip(0).astype(np.uint64))
            slow[act[~ok]] = True
            act, p, key, s = act[ok], p[ok], key[ok], s[ok]
            end = s + length[ok].astype(np.int64)
            recs.append((act, np.full(act.size, step, dtype=np.int32), key, p, s, end))
            pos[act] = end
            act = act[end < stop[act]]
            step += 1
        if not recs:  # no series has a field: the exact path says what is missing
            return np.ones(n, dtype=bool)
        sid, it, key, at, s, e = (np.concatenate(c) for c in zip(*recs))
        is_label = key == 0x0A
        # Labels: exactly one __name__, and all labels before the first sample (steps 0..L-1).
        n_labels = np.bincount(sid[is_label], minlength=n)
        name = is_label & (e - s >= 10)
        name[name] = (buf[s[name, None] + np.arange(10)] == np.frombuffer(_NAME_LABEL, np.uint8)).all(axis=1)
        slow |= np.bincount(sid[name], minlength=n) != 1
        slow[sid[is_label & (it >= n_labels[sid])]] = True
        # Samples: value then timestamp (0x09 <8 bytes> 0x10 <varint>), or a zero value left out (0x10 <varint>).
        smp = ~is_label
        ss, se = s[smp], e[smp]
        lone = buf[np.minimum(ss, len(buf) - 1)] == 0x10
        both = (se - ss >= 11) & (buf[np.minimum(ss, len(buf) - 1)] == 0x09) & (buf[np.minimum(ss + 9, len(buf) - 1)] == 0x10)
        ts_raw, ts_end, ts_ok = _varints(buf, np.where(both, ss + 10, ss + 1), se)
        good = (both | lone) & ts_ok & (ts_end == se)
        slow[sid[smp][~good]] = True
        value = np.zeros(ss.size, dtype=np.float64)
        if both.any():
            idx = np.flatnonzero(both & good)
            value[idx] = np.ascontiguousarray(buf[ss[idx, None] + 1 + np.arange(8)]).view("<f8").ravel()
        # Per series: its label set (the labels' bytes around __name__) and name, each decoded once.
        fast = ~slow
        keep = name & fast[sid]
        nsid, nat, ns, ne = sid[keep], at[keep], s[keep], e[keep]
        last = np.zeros(n, dtype=np.int64)
        lab_keep = is_label & fast[sid] & (it == n_labels[sid] - 1)
        last[sid[lab_keep]] = e[lab_keep]
        data, bids, names = self.data, self.bids, self.names
        bid_l, code_l = [], []
        for i, a, b, c, d, z in zip(nsid.tolist(), start[nsid].tolist(), nat.tolist(), ns.tolist(), ne.tolist(), last[nsid].tolist()):
            # Prefix (labels before __name__) and suffix (after it): the series' label set but its name.
            k = (data[a:b], data[d:z])
            got = bids.get(k)
            if got is None:
                got = bids[k] = self._ranges_set(i + 1, a, b, d, z)
            bid_l.append(got)
            raw = data[c:d]
            nc = names.get(raw)
            code_l.append(nc if nc is not None else self._metric_name(i + 1, raw, c))
        bid = np.full(n, -1, dtype=np.int64)
        code = np.full(n, -1, dtype=np.int64)
        bid[nsid] = bid_l
        code[nsid] = code_l
        ok = good & fast[sid[smp]]
        ssid = sid[smp][ok]
        order = np.argsort(ssid, kind="stable")
        ssid = ssid[order]
        ts = ts_raw[ok][order].view(np.int64)
        self.parts.append((ssid + 1, code[ssid], bid[ssid], value[ok][order], ts))
        return slow

    def _ranges_set(self, series: int, a: int, b: int, d: int, e: int) -> int:
        raw = []
        for lo, hi in ((a, b), (d, e)):
            for num, wt, at, s, stop in fields(self.data, lo, hi):
                lab = self.data[s:stop]
                raw.append(lab)
                if lab not in self.labels:
                    self.labels[lab] = self._label(series, s, stop)
        return self._label_set(series, raw, a)

    # --- the exact path ------------------------------------------------------------------------------

    def _series(self, series: int, pos: int, end: int) -> None:
        """One TimeSeries, field by field, every rule checked."""
        data = self.data
        raw: list[bytes] = []
        name_at = -1
        name_raw = b""
        samples: list[tuple[float, int]] = []
        series_at = pos
        where = f"timeseries {series}"
        while pos < end:
            num, wt, at, after = tag(data, pos, end)
            if num not in (1, 2):  # exemplars, native histograms, unknown fields: skip the field whole
                pos = next(fields(data, at, end))[4]
                continue
            self._expect_len(num, wt, at, where)
            n, pos = uvarint(data, after, end)
            if n > end - pos:
                what = "Label" if num == 1 else "Sample"
                raise WireError(f"{what} claims {n} bytes but only {end - pos} remain in its TimeSeries", at, where)
            stop = pos + n
            if num == 1:
                lab = data[pos:stop]
                if lab not in self.labels:
                    self.labels[lab] = self._label(series, pos, stop)
                if self.labels[lab][0] == "__name__":
                    if name_at >= 0:
                        raise WireError("label '__name__' given twice", at, where)
                    name_at, name_raw = pos, lab
                else:
                    raw.append(lab)
            else:
                samples.append(self._sample(series, pos, stop))
            pos = stop
        if name_at < 0:
            raise WireError("time series has no '__name__' label", series_at, where)
        code = self.names.get(name_raw)
        if code is None:
            code = self._metric_name(series, name_raw, name_at)
        bid = self.bids.get(key := tuple(raw))
        if bid is None:
            bid = self.bids[key] = self._label_set(series, raw, series_at)
        k = len(samples)
        self.parts.append((
            np.full(k, series, dtype=np.int64), np.full(k, code, dtype=np.int64), np.full(k, bid, dtype=np.int64),
            np.array([v for v, _ in samples], dtype=np.float64), np.array([t for _, t in samples], dtype=np.int64),
        ))

    def _sample(self, series: int, pos: int, end: int) -> tuple[float, int]:
        """(value, timestamp ms) of a Sample; proto3 leaves zero values out, so both default to 0."""
        value, ts = 0.0, 0
        for num, wt, at, start, stop in fields(self.data, pos, end):
            if num == 1:
                if wt != 1:
                    raise WireError(f"Sample.value has wire type {wt}, expected 1 (64-bit)", at, f"timeseries {series}")
                value = _DOUBLE.unpack_from(self.data, start)[0]
            elif num == 2:
                if wt != 0:
                    raise WireError(f"Sample.timestamp has wire type {wt}, expected 0 (varint)", at, f"timeseries {series}")
                if start >= _I64_WRAP:
                    raise WireError("Sample.timestamp overflows int64", at, f"timeseries {series}")
                ts = start - _I64_WRAP if start >= _I64_SIGN else start
        return value, ts

    def _label(self, series: int, pos: int, end: int) -> tuple[str, str]:
        """(name, value) of one Label message, checked: both strings UTF-8, the name a Prometheus name."""
        name = value = None
        where = f"timeseries {series}"
        for num, wt, at, start, stop in fields(self.data, pos, end):
            if num in (1, 2):
                self._expect_len(num, wt, at, where)
                try:
                    text = self.data[start:stop].decode("utf-8")
                except UnicodeDecodeError as exc:
                    what = "name" if num == 1 else "value"
                    raise WireError(f"label {what} is not UTF-8", start + exc.start, where) from None
                if num == 1:
                    name = text
                else:
                    value = text
        if not name or not _LABEL_NAME.fullmatch(name):
            raise WireError(f"invalid label name {(name or '')[:100]!r}", pos, where)
        return name, value or ""

    def _metric_name(self, series: int, raw: bytes, at: int) -> int:
        """The code of the metric name in a raw ``__name__`` Label (checked once per distinct name)."""
        if raw not in self.labels:
            self.labels[raw] = self._label(series, at, at + len(raw))
        name, value = self.labels[raw]
        if name != "__name__" or not _METRIC_NAME.fullmatch(value):
            raise WireError(f"invalid metric name {value[:100]!r}", at, f"timeseries {series}")
        code = self.name_code.get(value)
        if code is None:
            code = self.name_code[value] = len(self.name_list)
            self.name_list.append(value)
        self.names[raw] = code
        return code

    def _label_set(self, series: int, raw: list[bytes], at: int) -> int:
        """The id of a series' labels (``__name__`` aside) once the sender's additions are undone."""
        labels: dict[str, str] = {}
        for lab in raw:
            name, value = self.labels[lab]
            if name in labels or name == "__name__":
                raise WireError(f"label {name!r} given twice", at, f"timeseries {series}")
            labels[name] = value
        out: dict[str, str] = {}
        for name, value in labels.items():
            if name in _TARGET_LABELS:
                self.target_labels_dropped.add(name)
            elif name.startswith(_EXPORTED) and len(name) > len(_EXPORTED):
                if value:
                    out[name[len(_EXPORTED):]] = value
            elif value and f"{_EXPORTED}{name}" not in labels:
                out[name] = value
        key = tuple(sorted(out.items()))
        bid = self.bid_of_set.get(key)
        if bid is None:
            bid = self.bid_of_set[key] = len(self.label_sets)
            self.label_sets.append(out)
        return bid

    # --- the batch -------------------------------------------------------------------------------

    def batch(self) -> Batch:
        cols = [np.concatenate(c) if self.parts else np.zeros(0) for c in zip(*self.parts)] if self.parts else [np.zeros(0, np.int64)] * 5
        line, code, bid, value, ts_ms = cols
        value = value.astype(np.float64, copy=False)
        if len(self.parts) > 1:  # both paths ran: back to the order of the request
            order = np.argsort(line, kind="stable")
            line, code, bid, value, ts_ms = line[order], code[order], bid[order], value[order], ts_ms[order]
        bad_ts = (ts_ms < 0) | (ts_ms > MAX_TS_MS)
        if bad_ts.any():
            i = int(np.argmax(bad_ts))
            raise ParseError(
                f"sample timestamp {int(ts_ms[i])} ms is outside 1970..9999 (timeseries {int(line[i])})",
                source=self.source, field="timestamp",
            )
        stale = value.view(np.uint64) == STALE_NAN_BITS
        n_stale = int(stale.sum())
        samples = pl.DataFrame(
            {
                "line": line.astype(np.uint32),
                "name": pl.Series(self.name_list, dtype=pl.String).gather(code) if len(code) else pl.Series([], dtype=pl.String),
                "bid": bid.astype(np.uint32),
                "value": value,
                "ts_ms": ts_ms.astype(np.int64),
            }
        )
        if n_stale:
            samples = samples.filter(pl.Series(~stale))
        meta = {
            "format": "prometheus-remote-write-1.0",
            "timeseries": self.n_series,
            "samples_received": len(value),
            "stale_markers_dropped": n_stale,
            "target_labels_dropped": sorted(self.target_labels_dropped),
            "metadata_entries": self.metadata,
        }
        try:
            return from_samples(samples, self.label_sets, source=self.source, meta=meta)
        except ParseError as exc:  # the text parser's "line" is a time series here
            where = f" (timeseries {exc.line})" if exc.line is not None else ""
            raise ParseError(exc.message + where, source=self.source, field=exc.field) from None


def _varints(buf: np.ndarray, pos: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Base-128 varints at ``pos`` (each bounded by ``end``), all at once: (value as uint64, position
    after, ok). Not ok: cut off by ``end``, or past 64 bits; the exact path then names the fault."""
    val = np.zeros(pos.size, dtype=np.uint64)
    after = np.full(pos.size, -1, dtype=np.int64)
    ok = np.zeros(pos.size, dtype=bool)
    live = np.ones(pos.size, dtype=bool)
    last = len(buf) - 1
    for k in range(10):
        q = pos + k
        live &= q < end
        if not live.any():
            break
        b = buf[np.where(live, q, 0).clip(0, last)].astype(np.uint64)
        val |= np.where(live, (b & np.uint64(0x7F)) << np.uint64(7 * k), np.uint64(0))
        done = live & (b < 0x80) & ((b <= 1) if k == 9 else True)
        after[done] = q[done] + 1
        ok |= done
        live &= b >= 0x80
    return val, after, ok

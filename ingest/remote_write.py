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

Inference servers' series (names with a prefix of ``ingest.serving_metrics.TABLES``: ``vllm:``, ``sglang:``,
``tgi_``, ``nv_``) go to the serving frames through ``serving_metrics.from_samples``, the same name tables as
their ``/metrics`` bodies (counted in ``meta["serving_samples"]``, that mapping's own notes in ``meta["serving"]``).

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
import pyarrow as pa

from fleetscope.core.errors import ParseError
from fleetscope.core.frames import Batch
from fleetscope.core.protowire import WireError, fields, tag, uvarint
from ingest import serving_metrics
from ingest.dcgm import from_samples
from ingest.format import FormatSpec

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


SERVING_NAMES = "^(?:" + "|".join(re.escape(p) for p, _ in serving_metrics.TABLES.values() if p) + ")"


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
        # Label sets (a series' labels but __name__), numbered in order of first appearance. The columnar
        # path tells them apart by the bytes before and after the __name__ label, the exact path by its labels'.
        self.exact_bids: dict[tuple[bytes, ...], int] = {}
        self.set_where: list[tuple[int, int]] = []  # (time series, byte offset) of each set's first sight
        self.set_ranges: list[tuple[int, int, int, int, int]] = []  # columnar: (bid, a, b, d, z)
        self.set_rows: list[tuple[int, str, str]] = []  # exact: (bid, label name, value)

    # --- the request: where each TimeSeries lies ---------------------------------------------------

    def read(self) -> None:
        data, end = self.data, len(self.data)
        starts: list[int] = []
        stops: list[int] = []
        pos = 0
        while pos < end:
            at = pos
            # The common header inline: tag 0x0a and a length of one or two bytes (series up to 16 KiB).
            n = data[pos + 1] if data[pos] == 0x0A and pos + 2 < end else 0xFF
            if n < 0x80:
                s = pos + 2
            elif n != 0xFF and data[pos + 2] < 0x80 and pos + 3 < end:
                n, s = (n & 0x7F) | (data[pos + 2] << 7), pos + 3
            else:
                num, wt, _, start, stop = next(fields(data, pos, end))
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
            pos = s + n
            if pos > end:
                raise WireError(f"TimeSeries claims {n} bytes but only {end - s} remain", at, "WriteRequest.timeseries")
            starts.append(s)
            stops.append(pos)
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
        name[name] = (buf[s[name] + 1] == 0x08) & (buf[s[name] + 2] == 0x5F)  # 8 bytes, starting with "_"
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
        order = np.argsort(nsid)
        nsid, nat, ns, ne = nsid[order], nat[order], ns[order], ne[order]
        last = np.zeros(n, dtype=np.int64)
        lab_keep = is_label & fast[sid] & (it == n_labels[sid] - 1)
        last[sid[lab_keep]] = e[lab_keep]
        a, z = start[nsid], last[nsid]
        # Cut each series into prefix (labels before __name__), name, suffix (labels after it), without a
        # copy per series, and number the distinct (prefix, suffix) pairs and names with polars.
        cuts = _pieces(self.data, np.stack([a, nat, ns, ne, z], axis=1).ravel(), (0, 2, 3), 5)
        keys = pl.DataFrame({"pre": cuts[0], "name": cuts[1], "post": cuts[2]}).with_row_index("row")
        sets = keys.unique(["pre", "post"], keep="first", maintain_order=True).select("row", "pre", "post").with_row_index("g")
        rows = sets["row"].to_numpy()
        first_bid = len(self.set_where)
        for i, r in enumerate(rows.tolist()):
            self._new_set(int(nsid[r]) + 1, int(a[r]))
            self.set_ranges.append((first_bid + i, int(a[r]), int(nat[r]), int(ne[r]), int(z[r])))
        uniq_names = keys.unique("name", keep="first", maintain_order=True).select("row", "name")
        codes = [self._metric_name(int(nsid[r]) + 1, raw, int(ns[r])) for r, raw in uniq_names.iter_rows()]
        mapped = keys.join(sets.select("pre", "post", "g"), on=["pre", "post"], how="left", maintain_order="left").join(
            uniq_names.select("name", code=pl.Series(codes, dtype=pl.Int64)), on="name", how="left", maintain_order="left"
        )
        bid = np.full(n, -1, dtype=np.int64)
        code = np.full(n, -1, dtype=np.int64)
        bid[nsid] = mapped["g"].to_numpy().astype(np.int64) + first_bid
        code[nsid] = mapped["code"].to_numpy()
        ok = good & fast[sid[smp]]
        ssid = sid[smp][ok]
        order = np.argsort(ssid, kind="stable")
        ssid = ssid[order]
        ts = ts_raw[ok][order].view(np.int64)
        self.parts.append((ssid + 1, code[ssid], bid[ssid], value[ok][order], ts))
        return slow

    def _new_set(self, series: int, at: int) -> int:
        self.set_where.append((series, at))
        return len(self.set_where) - 1

    def _set_labels(self) -> pl.DataFrame:
        """(bid, name, value) of every label of every set, the columnar sets decoded all at once: each
        Label must be ``0x0a len name [0x12 len value]`` with one-byte lengths, else its set is decoded
        by the exact path (which names what is wrong)."""
        buf = self.buf
        exact: list[int] = []
        frames = []
        if self.set_ranges:
            r = np.array(self.set_ranges, dtype=np.int64)
            seg_bid = np.concatenate([r[:, 0], r[:, 0]])
            pos = np.concatenate([r[:, 1], r[:, 3]])
            end = np.concatenate([r[:, 2], r[:, 4]])
            bad = np.zeros(len(self.set_where), dtype=bool)
            last = len(buf) - 1
            recs = []
            act = np.flatnonzero(pos < end)
            while act.size:  # one Label of every segment per step
                p, e = pos[act], end[act]
                n = buf[np.minimum(p + 1, last)].astype(np.int64)
                ok = (buf[p] == 0x0A) & (p + 1 < e) & (n < 0x80) & (p + 2 + n <= e)
                bad[seg_bid[act[~ok]]] = True
                act, p, n = act[ok], p[ok], n[ok]
                recs.append((seg_bid[act], p + 2, p + 2 + n))
                pos[act] = p + 2 + n
                act = act[pos[act] < end[act]]
            if recs:
                bid, s, e = (np.concatenate(c) for c in zip(*recs))
                nlen = buf[np.minimum(s + 1, last)].astype(np.int64)
                ns, ne = s + 2, s + 2 + nlen
                vtag = buf[np.minimum(ne, last)]
                vlen = buf[np.minimum(ne + 1, last)].astype(np.int64)
                no_value = ne == e
                ok = (buf[s] == 0x0A) & (nlen < 0x80) & (ne <= e) & (no_value | ((vtag == 0x12) & (vlen < 0x80) & (ne + 2 + vlen == e)))
                bad[bid[~ok]] = True
                keep = ~bad[bid]
                bid, ns, ne, e, no_value = bid[keep], ns[keep], ne[keep], e[keep], no_value[keep]
                vs = np.where(no_value, e, ne + 2)
                order = np.argsort(ns)
                bid, ns, ne, vs, e = bid[order], ns[order], ne[order], vs[order], e[order]
                names, values = _strings(self.data, ns, ne, vs, e)
                if names is None:  # invalid UTF-8 somewhere: the exact path finds and names it
                    bad[bid] = True
                else:
                    frames.append(pl.DataFrame({"bid": bid.astype(np.uint32), "name": names, "value": values}))
            exact = np.flatnonzero(bad).tolist()
        by_bid = {row[0]: row for row in self.set_ranges}
        for b in exact:
            _, a, lo, d, z = by_bid[b]
            series = self.set_where[b][0]
            for first, stop in ((a, lo), (d, z)):
                for num, wt, at, ps, pe in fields(self.data, first, stop):
                    self._expect_len(num, wt, at, f"timeseries {series}")
                    lab = self.data[ps:pe]
                    name, value = self.labels.get(lab) or self._label(series, ps, pe)
                    self.set_rows.append((b, name, value))
        if exact:
            frames = [f.filter(~pl.col("bid").is_in(exact)) for f in frames]
        if self.set_rows:
            rows = self.set_rows
            frames.append(pl.DataFrame({"bid": [r[0] for r in rows], "name": [r[1] for r in rows], "value": [r[2] for r in rows]},
                                       schema={"bid": pl.UInt32, "name": pl.String, "value": pl.String}))
        if not frames:
            return pl.DataFrame(schema={"bid": pl.UInt32, "name": pl.String, "value": pl.String})
        return pl.concat(frames)

    def _normalised(self, labels: pl.DataFrame) -> tuple[pl.DataFrame, list[str]]:
        """The labels checked (names, no name twice in a set), then what the sender added undone: target
        labels dropped, ``exported_X`` restored as ``X`` (replacing the target's), empty values removed."""
        bad = labels.filter(~pl.col("name").str.contains(r"^[a-zA-Z_][a-zA-Z0-9_]*$") | (pl.col("name") == "__name__"))
        twice = labels.filter(pl.struct("bid", "name").is_duplicated())
        for frame, what in ((bad, "invalid label name {!r}"), (twice, "label {!r} given twice")):
            if frame.height:
                b, name = frame.sort("bid").row(0)[:2]
                series, at = self.set_where[b]
                raise WireError(what.format(name[:100]), at, f"timeseries {series}")
        target = labels.filter(pl.col("name").is_in(list(_TARGET_LABELS)))
        dropped = sorted(target["name"].unique().to_list())
        exported = pl.col("name").str.starts_with(_EXPORTED) & (pl.col("name").str.len_chars() > len(_EXPORTED))
        out = (
            labels.filter(~pl.col("name").is_in(list(_TARGET_LABELS)))
            .with_columns(
                pri=pl.when(exported).then(0).otherwise(1),
                name=pl.when(exported).then(pl.col("name").str.slice(len(_EXPORTED))).otherwise(pl.col("name")),
            )
            .sort("bid", "name", "pri")
            .unique(["bid", "name"], keep="first", maintain_order=True)
            .filter(pl.col("value") != "")
            .drop("pri")
        )
        return out, dropped

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
        bid = self.exact_bids.get(key := tuple(raw))
        if bid is None:
            bid = self.exact_bids[key] = self._new_set(series, series_at)
            self.set_rows.extend((bid, *self.labels[lab]) for lab in raw)
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
        try:
            labels, dropped = self._normalised(self._set_labels())
        except WireError as exc:
            raise ParseError(f"malformed remote-write WriteRequest: {exc}", source=self.source) from None
        meta = {
            "format": "prometheus-remote-write-1.0",
            "timeseries": self.n_series,
            "samples_received": len(value),
            "stale_markers_dropped": n_stale,
            "target_labels_dropped": dropped,
            "metadata_entries": self.metadata,
        }
        # Inference servers' series (vLLM, SGLang, TGI, Triton) go to the serving frames, mapped by the same
        # name tables as their /metrics bodies; the rest as dcgm-exporter's.
        is_serving = samples["name"].str.contains(SERVING_NAMES)
        serving = samples.filter(is_serving)
        if serving.height:
            samples = samples.filter(~is_serving)
        try:
            out = from_samples(samples, labels, source=self.source, meta=meta)
            if serving.height:
                sb = serving_metrics.from_samples(serving, labels, source=self.source)
                sb.meta = {"serving_samples": serving.height, "serving": sb.meta}
                out = out.merge(sb)
            return out
        except ParseError as exc:  # the text parser's "line" is a time series here
            where = f" (timeseries {exc.line})" if exc.line is not None else ""
            raise ParseError(exc.message + where, source=self.source, field=exc.field) from None


def _varints(buf: np.ndarray, pos: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Base-128 varints at ``pos`` (each bounded by ``end``), all at once: (value as uint64, position
    after, ok). Not ok: cut off by ``end``, or past 64 bits; the exact path then names the fault."""
    last = len(buf) - 1
    inside = pos < end
    b = buf[np.where(inside, pos, 0).clip(0, last)]
    val = b.astype(np.uint64) & np.uint64(0x7F)
    ok = inside & (b < 0x80)
    after = np.where(ok, pos + 1, -1)
    live = np.flatnonzero(inside & (b >= 0x80))  # the few longer ones, byte by byte
    for k in range(1, 10):
        if not live.size:
            break
        q = pos[live] + k
        live, q = live[q < end[live]], q[q < end[live]]
        b = buf[q]
        val[live] |= (b.astype(np.uint64) & np.uint64(0x7F)) << np.uint64(7 * k)
        done = (b < 0x80) & ((b <= 1) if k == 9 else True)
        ok[live[done]] = True
        after[live[done]] = q[done] + 1
        live = live[b >= 0x80]
    return val, after, ok


def _pieces(data: bytes, bounds: np.ndarray, take: tuple[int, ...], stride: int) -> list[pa.Array]:
    """Byte strings of ``data`` cut at ``bounds`` (non-decreasing offsets), without a copy per string: an
    Arrow array over the body's buffer whose element i is ``data[bounds[i]:bounds[i + 1]]``; element
    ``k * stride + t`` for each ``t`` in ``take``."""
    if bounds.size == 0:
        return [pa.array([], pa.large_binary()) for _ in take]
    whole = pa.LargeBinaryArray.from_buffers(pa.large_binary(), bounds.size - 1, [None, pa.py_buffer(bounds.astype(np.int64)), pa.py_buffer(data)])
    base = np.arange(bounds.size // stride, dtype=np.int64) * stride
    return [whole.take(pa.array(base + t)) for t in take]


def _strings(data: bytes, ns: np.ndarray, ne: np.ndarray, vs: np.ndarray, ve: np.ndarray) -> tuple[pl.Series | None, pl.Series | None]:
    """The UTF-8 strings at byte ranges [ns, ne) and [vs, ve) of ``data`` (disjoint, in increasing order);
    (None, None) when one is not UTF-8."""
    if not ns.size:
        return pl.Series([], dtype=pl.String), pl.Series([], dtype=pl.String)
    names, values = _pieces(data, np.stack([ns, ne, vs, ve], axis=1).ravel(), (0, 2), 4)
    try:
        return pl.Series(names.cast(pa.large_string()), dtype=pl.String), pl.Series(values.cast(pa.large_string()), dtype=pl.String)
    except pa.ArrowInvalid:
        return None, None


# --- declaration (ingest.format) ---------------------------------------------------------------------

# Never detected from content (a protobuf body has no signature); POST /api/v1/write names it.
FORMATS = (
    FormatSpec("prometheus_remote_write", "Prometheus remote write 1.0 WriteRequest, snappy-decompressed protobuf",
               lambda d, s, o: parse(d, source=s)),
)

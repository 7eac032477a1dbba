"""OTLP metrics (``ExportMetricsServiceRequest``, protobuf or JSON) into canonical frames.

What maps onto ``gpu_sample`` (wide, one row per GPU and instant):
- DCGM series as an OpenTelemetry Collector's prometheus receiver forwards dcgm-exporter's scrape:
  metric ``DCGM_FI_*`` with the exporter's labels (``UUID``/``uuid``, ``Hostname``, ``gpu``, ...) as
  data-point attributes; units converted by ``dcgm_fields.DCGM_FIELDS``.
- The OpenTelemetry hardware semantic conventions (semconv ``hw.*``): ``hw.gpu.utilization`` (ratio),
  ``hw.gpu.memory.usage`` (By), and ``hw.power`` (W), ``hw.energy`` (J), ``hw.temperature`` (Cel) where
  ``hw.type`` is ``gpu``; the GPU is ``hw.id``.
GPU samples also give ``health_event`` rows (XID, ECC, row remap; ``dcgm_fields.dcgm_health_events``, as for the
exporter's text) and ``gpu_workload`` rows from the pod attributes of a GPU's first point in the request
(``k8s.namespace.name`` / ``k8s.pod.name`` / ``k8s.container.name``, or dcgm-exporter's ``namespace`` /
``pod`` / ``container`` labels as a Collector forwards them; the exporter's own pod is ignored).

NCCL Inspector's own OTLP export (``NCCL_INSPECTOR_OTEL_EXPORT=1``; NVIDIA/nccl
``plugins/profiler/inspector/inspector_otel.cc`` and the README's "OTLP HTTP Output Mode", commit
12df1a11afad322be5a204a2db890161cbf8131d). All points are gauges with string attributes:
- Verbose mode (``NCCL_INSPECTOR_OTEL_VERBOSE=1``), one point per completed operation and metric:
  ``nccl_bus_bandwidth_gbs`` (GB/s), ``nccl_collective_exec_time_microseconds`` (us),
  ``nccl_collective_algobw_gbs`` (GB/s) with attributes ``version``, ``node``, ``gpu`` (``GPU<cudaDev>``),
  ``comm_name``, ``comm_id`` (communicator hash), ``n_nodes``, ``nranks``, ``coll_msg_size_bytes``,
  ``collective``, ``coll_sn``, ``algo_proto`` (``<algo>_<proto>``); P2P the same as ``nccl_p2p_bus_bandwidth_gbs``,
  ``nccl_p2p_exec_time_microseconds``, ``nccl_p2p_algobw_gbs`` with ``p2p_msg_size_bytes``,
  ``p2p_operation``, ``p2p_sn``, ``p2p_peer``. These become ``collective`` rows, one per operation (the three
  metrics of an operation meet on one row): ``seq`` = ``coll_sn`` / ``p2p_sn``, ``bytes`` = the exact message
  size, ``duration_s`` = exec time / 1e6, ``algo`` / ``proto`` split from ``algo_proto`` (``unknown`` is
  null), ``host`` = ``node``, ``job_id`` = the resource's ``slurm.job.id`` (the plugin sets it from
  ``SLURM_JOB_ID``) or ``"unknown"``. P2P rows use ``comm_id`` ``<id>#p2p`` and ``peer``, as
  ``ingest.nccl_inspector`` does for the JSON mode. ``start`` stays null: the point's time is when the
  operation entered the completed ring, not when its kernel started.
  The export carries no rank. ``rank`` is therefore a stand-in: ``-1 - (CRC-32 of "<node>/<gpu>" mod 2**31)``.
  One device holds one rank of a communicator, so the stand-in tells the ranks of an operation apart (the
  analyzers compare ranks of one ``comm_id``/``seq``), is the same in every export, and is negative so that
  nobody mistakes it for NCCL's rank.
- Default (aggregated) mode: the same metric names per bucket (``message_size`` range such as ``4-5GB``, no
  ``coll_sn``), and verbose mode's per-device counters ``nccl_collectives_total``,
  ``nccl_collectives_dropped_total``, ``nccl_p2p_total``, ``nccl_p2p_dropped_total``: aggregates, so
  ``metric_sample`` series like every other metric.
Everything else numeric becomes ``metric_sample`` series keyed by name and attributes (resource attributes
included, prefixed ``resource.`` where they would clash).

Rejected points are counted with a reason, as the OTLP partial-success response reports them
(opentelemetry-proto, ``ExportMetricsPartialSuccess``): histograms and summaries (we keep scalars; inference
servers' cumulative histograms, by their ``vllm:``/``sglang:``/``tgi_``/``nv_`` names, are the exception: serving rows),
points with no value, non-finite values, values an integer column cannot hold (beyond int64 once in
the column's unit), GPU series without a GPU id, Inspector operation points whose sequence number,
size, rank count or communicator is missing or malformed.

The other direction, ``gpu_observations``, is what the Fleetscope agent exports: the semconv names where the
hardware conventions define the field, the DCGM field name in DCGM's unit otherwise, so that this module
reads back exactly what the agent sent.

Protobuf bodies take a wire path (``_parse_protobuf``): the points of GPU gauges/sums are read from the
protobuf wire format as numpy columns, each distinct attribute byte string decoded once, and everything
else by upb as before; its Batch is the one ``from_request`` gives for the same body, and a malformed
body's ParseError names what is wrong and its byte offset (https://protobuf.dev/programming-guides/encoding/).

Spec: https://opentelemetry.io/docs/specs/otlp/ (OTLP/HTTP, JSON encoding) and the semantic conventions
for hardware metrics (https://opentelemetry.io/docs/specs/semconv/hardware/).
"""

from __future__ import annotations

import math
import re
import zlib
from collections import Counter
from collections.abc import Mapping
from typing import Any

import numpy as np
import polars as pl

from fleetscope.core.errors import ParseError
from fleetscope.core.protowire import MAX_DEPTH as _MAX_DEPTH
from fleetscope.core.protowire import WireError as _WireError
from fleetscope.core.protowire import fields as _fields
from fleetscope.core.protowire import uvarint as _uvarint
from fleetscope.core.dcgm_fields import DCGM_FIELDS, EXPORTER_POD_MARK, dcgm_health_events
from fleetscope.core.frames import (
    COLLECTIVE,
    GPU_SAMPLE,
    GPU_WORKLOAD,
    METRIC_SAMPLE,
    UTC_US,
    Batch,
    series_key,
)
from ingest import serving_metrics
from ingest.format import FormatSpec, Sniff

_HW_GPU = {
    "hw.gpu.utilization": ("util_ratio", 1.0),
    "hw.gpu.memory.usage": ("fb_used_bytes", 1.0),
    "hw.gpu.memory.utilization": (None, 1.0),
}
_HW_TYPED = {"hw.power": ("power_w", 1.0), "hw.energy": ("energy_j", 1.0), "hw.temperature": ("temp_c", 1.0)}
_UUID_KEYS = ("UUID", "uuid", "gpu_uuid", "hw.id", "gpu.uuid")
# Pod attribution: (gpu_workload column, attribute names in order of preference).
_WORKLOAD_KEYS = (
    ("namespace", ("k8s.namespace.name", "namespace")),
    ("pod", ("k8s.pod.name", "pod")),
    ("container", ("k8s.container.name", "container")),
)

# NCCL Inspector per-operation metrics: name -> (operation kind, collective column, factor to its unit).
_INSPECTOR_OPS = {
    "nccl_bus_bandwidth_gbs": ("coll", "busbw_gbps", 1.0),
    "nccl_collective_exec_time_microseconds": ("coll", "duration_s", 1e-6),
    "nccl_collective_algobw_gbs": ("coll", "algbw_gbps", 1.0),
    "nccl_p2p_bus_bandwidth_gbs": ("p2p", "busbw_gbps", 1.0),
    "nccl_p2p_exec_time_microseconds": ("p2p", "duration_s", 1e-6),
    "nccl_p2p_algobw_gbs": ("p2p", "algbw_gbps", 1.0),
}
_I64_MAX = 2**63 - 1
# An integer gpu_sample column holds what rounds into int64: [-2**63, 2**63) as floats.
_I64_MIN, _I64_END = -float(2**63), float(2**63)

# What the agent sends per gpu_sample column: (metric name, unit, multiplier from the column's SI value,
# extra attributes). Semconv first; every other column under its DCGM name, in DCGM's unit, which
# DCGM_FIELDS converts back. The first DCGM name of a column wins (the current name, not the pre-3.2 alias).
_SEMCONV_OUT = {
    "util_ratio": ("hw.gpu.utilization", "1"),
    "fb_used_bytes": ("hw.gpu.memory.usage", "By"),
    "power_w": ("hw.power", "W"),
    "energy_j": ("hw.energy", "J"),
    "temp_c": ("hw.temperature", "Cel"),
}
GPU_EXPORT: dict[str, tuple[str, str, float]] = {c: (name, unit, 1.0) for c, (name, unit) in _SEMCONV_OUT.items()}
for _name, (_column, _factor) in DCGM_FIELDS.items():
    GPU_EXPORT.setdefault(_column, (_name, "", 1.0 / _factor))
del _name, _column, _factor
_INT_COLUMNS = {c for c, t in GPU_SAMPLE.schema.items() if t == pl.Int64}


def decode(data: bytes, *, encoding: str, source: str = "") -> Any:
    """Bytes to an ``ExportMetricsServiceRequest``; ``encoding`` is ``protobuf`` or ``json``."""
    from google.protobuf import json_format
    from google.protobuf.message import DecodeError
    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

    req = ExportMetricsServiceRequest()
    if encoding == "protobuf":
        try:
            req.ParseFromString(data)
        except (DecodeError, ValueError, RecursionError) as exc:
            raise ParseError(f"not an OTLP protobuf ExportMetricsServiceRequest: {locate_error(data) or exc}", source=source) from None
    elif encoding == "json":
        try:
            # OTLP/JSON is proto3 JSON with lowerCamelCase names and int64 as strings; unknown fields
            # must be ignored for forward compatibility (OTLP spec, "JSON Protobuf Encoding").
            json_format.Parse(data.decode("utf-8"), req, ignore_unknown_fields=True)
        except UnicodeDecodeError as exc:
            raise ParseError(f"OTLP/JSON body is not UTF-8 (byte {exc.start})", source=source) from None
        except (json_format.ParseError, ValueError, RecursionError) as exc:
            raise ParseError(f"not an OTLP/JSON ExportMetricsServiceRequest: {str(exc)[:300]}", source=source) from None
    else:
        raise ValueError(f"encoding must be protobuf or json, not {encoding!r}")
    return req


def _attrs(kvs: Any) -> dict[str, str]:
    out: dict[str, str] = {}
    for kv in kvs:
        v = kv.value
        kind = v.WhichOneof("value")
        if kind is None:
            continue
        val = getattr(v, kind)
        if kind in ("array_value", "kvlist_value", "bytes_value"):
            continue  # not label material; keeping them would make series keys unbounded
        out[kv.key] = str(val).lower() if kind == "bool_value" else str(val)
    return out


def parse(data: bytes, *, encoding: str, source: str = "") -> Batch:
    """Parse an OTLP metrics request into a Batch; ``meta`` holds ``rejected_points`` and their reasons.

    Protobuf bodies take the wire path (``_parse_protobuf``); its Batch is the one ``from_request`` gives
    for the same request, which the tests check over varied requests."""
    return read(data, encoding=encoding, source=source).batch(source)


def read(data: bytes, *, encoding: str, source: str = "") -> _Walk:
    """What ``parse`` gathers from a request before building its frames: many requests' readings are
    built into one Batch by ``gather`` (a group commit of agents' pushes), each frame once."""
    if encoding == "protobuf":
        return _parse_protobuf(data, source)
    return _walk_request(decode(data, encoding=encoding, source=source))


def gather(walks: list[_Walk], source: str = "") -> Batch:
    """One Batch of many requests' readings: equal, once conformed, to merging their ``parse`` Batches, as
    long as no GPU is in two of them (the caller keeps such requests apart: whose copy of a point is
    stored then follows from the order they are written in)."""
    if len(walks) == 1:
        return walks[0].batch(source)
    merged = _Walk()
    for w in walks:
        offset = len(merged.gpus)
        if any(g["gpu_uuid"] in merged.gpu_index for g in w.gpus):
            raise ValueError("a GPU is in two of the requests gathered")
        for g in w.gpus:
            merged.gpu_index[g["gpu_uuid"]] = len(merged.gpus)
            merged.gpus.append(g)
        merged.workloads.extend(w.workloads)
        merged.parts.extend((t, gid + offset, col, v) for t, gid, col, v in w.parts)
        for k, v in w.series_rows.items():
            merged.series_rows.setdefault(k, v)
        for k, v in w.colls.items():
            merged.colls.setdefault(k, v)
        merged.rejected.update(w.rejected)
        merged.accepted += w.accepted
        merged.serving.extend(w.serving)
    return merged.batch(source)


def gpu_uuids(walk: _Walk) -> list[str]:
    """The GPUs a request's readings are about (to keep apart requests that share one)."""
    return [g["gpu_uuid"] for g in walk.gpus]


def counts(walk: _Walk) -> tuple[dict[str, int], int]:
    """Rows a request offers per frame (health events aside) and the values it carries, as its ``parse``
    Batch would count them, without building the frames."""
    cells = {(t, g, col) for ts, gids, col, _ in walk.parts for t, g in zip(ts.tolist(), gids.tolist())}
    rows = {"gpu_sample": len({(t, g) for t, g, _ in cells}), "gpu": len(walk.gpus), "gpu_workload": len(walk.workloads),
            "metric_sample": len(walk.series_rows), "collective": len(walk.colls)}
    return {k: v for k, v in rows.items() if v}, len(cells) + len(walk.series_rows)


def rejected(walk: _Walk) -> tuple[int, dict[str, int]]:
    """Points a request's walk refused, and why (OTLP partial success)."""
    return sum(walk.rejected.values()), dict(walk.rejected)


def from_request(req: Any, *, source: str = "") -> Batch:
    """Columnar walk of a decoded request: per GPU metric, three columns (GPU, time, value), put side by
    side as wide rows at the end."""
    return _walk_request(req).batch(source)


def _walk_request(req: Any) -> _Walk:
    walk = _Walk()
    for rm in req.resource_metrics:
        res = _attrs(rm.resource.attributes)
        host_default = res.get("host.name") or res.get("k8s.node.name")
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                walk.metric(metric, res, host_default)
    return walk


class _Walk:
    """What a walk over a request's metrics has gathered so far. The message path (``metric``) and the
    wire path (``gpu_points``) both feed it, metric by metric in request order, so the Batch does not
    depend on which path read a metric: GPUs are numbered in the order they are first seen, rejection
    reasons counted in the order they first occur."""

    def __init__(self) -> None:
        self.parts: list[tuple[np.ndarray, np.ndarray, str, np.ndarray]] = []  # (ts_us, GPU number, column, value)
        self.series_rows: dict[tuple[int, str], float] = {}
        self.gpu_index: dict[str, int] = {}
        self.gpus: list[dict[str, Any]] = []
        self.workloads: list[dict[str, Any]] = []
        self.colls: dict[tuple[str, int, str, int, str, int], dict[str, Any]] = {}
        self.rejected: Counter[str] = Counter()
        self.accepted = 0
        self.serving: list[tuple[int, str, dict[str, str], float, int]] = []  # inference servers' samples

    def register(self, uuid: str, attrs: Mapping[str, str], host_default: str | None, ts_ns: int) -> int:
        """The GPU's number; the first point of a GPU gives its inventory row and pod."""
        gid = self.gpu_index.get(uuid)
        if gid is None:
            gid = self.gpu_index[uuid] = len(self.gpus)
            self.gpus.append({
                "gpu_uuid": uuid,
                "host": attrs.get("Hostname") or attrs.get("hostname") or attrs.get("host.name") or host_default,
                "model_name": attrs.get("modelName") or attrs.get("model_name") or attrs.get("hw.model"),
                "pci_bus_id": attrs.get("pci_bus_id"),
            })
            work = _workload(attrs)
            if work:
                self.workloads.append({"ts_us": ts_ns // 1000, "gpu_uuid": uuid, **work})
        return gid

    def metric(self, metric: Any, res: dict[str, str], host_default: str | None) -> None:
        """One decoded ``Metric`` message."""
        rejected = self.rejected
        kind = metric.WhichOneof("data")
        if _SERVING_NAME.match(metric.name) and kind in ("gauge", "sum", "histogram"):
            self.accepted += _serving_points(metric, kind, res, self.serving, rejected)
            return
        if kind not in ("gauge", "sum"):
            n = len(getattr(metric, kind).data_points) if kind else 1
            rejected[f"{kind or 'empty'} metrics are not stored ({metric.name})"] += n
            return
        name = metric.name
        points = getattr(metric, kind).data_points
        if name in _INSPECTOR_OPS:
            self.accepted += _inspector_points(name, points, res, self.colls, self.series_rows, rejected)
            return
        static, typed = _gpu_target(name)
        if static is None and typed is None:
            self.accepted += _series_points(name, points, res, self.series_rows, rejected)
            return
        col = static if typed is None else typed
        gids: list[int] = []
        times: list[int] = []
        values: list[float] = []
        pos = -1  # where the GPU id sits in this metric's attribute lists; collectors keep one order
        for dp in points:
            # _value's checks, inlined: this loop runs once per GPU value
            which = dp.WhichOneof("value")
            if which is None:
                rejected[f"data point without a value ({name})"] += 1
                continue
            value = float(dp.as_double if which == "as_double" else dp.as_int)
            if not math.isfinite(value):
                rejected[f"non-finite value ({name})"] += 1
                continue
            if col[0] in _INT_COLUMNS and not _I64_MIN <= value * col[1] < _I64_END:
                rejected[f"value out of range for {col[0]} ({name})"] += 1
                continue
            ts_ns = dp.time_unix_nano
            if ts_ns <= 0:
                rejected[f"data point without a timestamp ({name})"] += 1
                continue
            kvs = dp.attributes
            attrs = None
            uuid = None
            if typed is not None:
                # hw.power / hw.energy / hw.temperature describe any hardware; only GPUs are GPU samples.
                attrs = _attrs(kvs)
                if attrs.get("hw.type") != "gpu":
                    self.accepted += _series_points(name, [dp], res, self.series_rows, rejected)
                    continue
            elif 0 <= pos < len(kvs):
                kv = kvs[pos]
                if kv.key in _UUID_KEYS:
                    uuid = kv.value.string_value
            if not uuid:
                attrs = attrs if attrs is not None else _attrs(kvs)
                pos, uuid = next(((i, attrs.get(kvs[i].key)) for i in range(len(kvs)) if kvs[i].key in _UUID_KEYS and attrs.get(kvs[i].key)), (-1, None))
            if not uuid:
                rejected[f"GPU metric without a GPU id attribute ({name})"] += 1
                continue
            gid = self.gpu_index.get(uuid)
            if gid is None:
                gid = self.register(uuid, attrs if attrs is not None else _attrs(kvs), host_default, ts_ns)
            gids.append(gid)
            times.append(ts_ns // 1000)
            values.append(value * col[1])
        if gids:
            self.accepted += len(gids)
            self.parts.append((np.array(times, np.int64), np.array(gids, np.int64), col[0], np.array(values, np.float64)))

    def gpu_points(self, name: str, col: tuple[str, float], ts_ns: np.ndarray, values: np.ndarray, aids: np.ndarray,
                   labels: _LabelSets, host_default: str | None) -> None:
        """A GPU metric's points as columns (from the wire path), with the same checks, in the same order,
        as ``metric``: a value, finite, in range, a timestamp, a GPU id. Every label set is ``simple``
        here, so a point's GPU id does not depend on the points before it."""
        finite = np.isfinite(values)
        with np.errstate(over="ignore", invalid="ignore"):
            scaled = values * col[1]
        in_range = finite
        if col[0] in _INT_COLUMNS:
            in_range = finite & (scaled >= _I64_MIN) & (scaled < _I64_END)
        no_ts = in_range & (ts_ns == 0)
        has_uuid = labels.column("has_uuid")[aids]
        ok = in_range & ~no_ts & has_uuid
        found = []
        for mask, why in ((~finite, "non-finite value"), (finite & ~in_range, f"value out of range for {col[0]}"),
                          (no_ts, "data point without a timestamp"), (in_range & ~no_ts & ~has_uuid, "GPU metric without a GPU id attribute")):
            hits = np.flatnonzero(mask)
            if hits.size:
                found.append((hits[0], f"{why} ({name})", hits.size))
        for _first, reason, n in sorted(found):
            self.rejected[reason] += n
        idx = np.flatnonzero(ok)
        if not idx.size:
            return
        kept = aids[idx]
        gid_of = labels.column("gid")  # a view: the numbers registered below are written through it
        new = np.flatnonzero(gid_of[kept] < 0)
        if new.size:
            # GPUs registered in the order their first points come, as the message path does
            _, first = np.unique(kept[new], return_index=True)
            for i in np.sort(new[first]).tolist():
                aid = int(kept[i])
                gid_of[aid] = self.register(labels.uuid[aid], labels.attrs[aid], host_default, int(ts_ns[idx[i]]))
        self.accepted += idx.size
        self.parts.append(((ts_ns[idx] // 1000).astype(np.int64), gid_of[kept], col[0], scaled[idx]))

    def batch(self, source: str) -> Batch:
        rejected = self.rejected
        batch = Batch(source=source, meta={"accepted_points": self.accepted, "rejected_points": sum(rejected.values()), "rejected_reasons": dict(rejected)})
        if self.parts:
            batch.gpu_sample = _wide(self.parts, [g["gpu_uuid"] for g in self.gpus])
            batch.gpu = pl.DataFrame({k: [g[k] for g in self.gpus] for k in ("gpu_uuid", "host", "model_name", "pci_bus_id")},
                                     schema={"gpu_uuid": pl.String, "host": pl.String, "model_name": pl.String, "pci_bus_id": pl.String})
            batch.health_event = dcgm_health_events(batch.gpu_sample, batch.gpu, source="otlp")
        if self.workloads:
            batch.gpu_workload = pl.DataFrame(self.workloads, schema={"ts_us": pl.Int64, "gpu_uuid": pl.String, "namespace": pl.String, "pod": pl.String, "container": pl.String}).select(
                pl.col("ts_us").cast(pl.Datetime("us")).dt.replace_time_zone("UTC").alias("ts"), *GPU_WORKLOAD.names[1:])
        if self.colls:
            batch.collective = pl.DataFrame(list(self.colls.values()), schema=COLLECTIVE.schema)
        if self.serving:
            sb = serving_metrics.from_items(self.serving, source=source)
            for name in ("serving_replica", "serving_bucket", "serving_counter", "serving_gauge"):
                setattr(batch, name, getattr(sb, name))
        if self.series_rows:
            keys = list(self.series_rows)
            batch.metric_sample = pl.DataFrame(
                {"ts": pl.Series([k[0] for k in keys], dtype=pl.Int64).cast(pl.Datetime("us")).dt.replace_time_zone("UTC"),
                 "series": [k[1] for k in keys], "value": list(self.series_rows.values())},
                schema={"ts": UTC_US, "series": pl.String, "value": pl.Float64},
            ).select(list(METRIC_SAMPLE.names))
        return batch


_SERVING_NAME = re.compile("^(?:" + "|".join(re.escape(p) for p, _ in serving_metrics.TABLES.values() if p) + ")")
# Resource attributes that place a replica, as the labels the serving parser reads them from.
_SERVING_PLACE = {"k8s.pod.name": "pod", "k8s.namespace.name": "namespace", "k8s.node.name": "node", "host.name": "host"}
_CUMULATIVE = 2  # AggregationTemporality.AGGREGATION_TEMPORALITY_CUMULATIVE


def _serving_points(metric: Any, kind: str, res: dict[str, str], out: list[tuple[int, str, dict[str, str], float, int]],
                    rejected: Counter[str]) -> int:
    """An inference server's metric (``vllm:``, ``sglang:``, ``tgi_``, ``nv_``) as the samples its ``/metrics``
    body would hold: a cumulative histogram point becomes ``_bucket`` samples with their ``le`` (OTLP's
    per-bucket counts summed), ``_sum`` and ``_count``; gauges and sums one sample each. Delta temporality
    is refused (a rate per export, not the server's counters)."""
    name = metric.name
    data = getattr(metric, kind)
    if kind in ("sum", "histogram") and data.aggregation_temporality != _CUMULATIVE:
        rejected[f"delta temporality is not stored ({name})"] += len(data.data_points)
        return 0
    place = {label: res[k] for k, label in _SERVING_PLACE.items() if res.get(k)}
    n = 0
    for dp in data.data_points:
        if not dp.time_unix_nano:
            rejected[f"data point without a timestamp ({name})"] += 1
            continue
        ts_ms = dp.time_unix_nano // 1_000_000
        labels = {**place, **_attrs(dp.attributes)}
        line = len(out) + 1
        if kind == "histogram":
            counts, bounds = list(dp.bucket_counts), list(dp.explicit_bounds)
            if len(counts) != len(bounds) + 1:
                rejected[f"histogram point with {len(counts)} counts for {len(bounds)} bounds ({name})"] += 1
                continue
            cum = 0
            for le, c in zip([*bounds, math.inf], counts):
                cum += c
                out.append((line, f"{name}_bucket", {**labels, "le": "+Inf" if le == math.inf else repr(float(le))}, float(cum), ts_ms))
            out.append((line, f"{name}_count", labels, float(dp.count), ts_ms))
            if dp.HasField("sum"):
                out.append((line, f"{name}_sum", labels, float(dp.sum), ts_ms))
        else:
            value = _value(name, dp, rejected)
            if value is None:
                continue
            out.append((line, name, labels, value, ts_ms))
        n += 1
    return n


def _value(name: str, dp: Any, rejected: Counter[str]) -> float | None:
    """A data point's finite value, or None with the reason counted."""
    which = dp.WhichOneof("value")
    if which is None:
        rejected[f"data point without a value ({name})"] += 1
        return None
    value = float(dp.as_double if which == "as_double" else dp.as_int)
    if not math.isfinite(value):
        rejected[f"non-finite value ({name})"] += 1
        return None
    if dp.time_unix_nano <= 0:
        rejected[f"data point without a timestamp ({name})"] += 1
        return None
    return value


def _workload(attrs: Mapping[str, str]) -> dict[str, str | None] | None:
    """Pod attribution of a GPU point, or None (no pod, or dcgm-exporter's own pod on an idle GPU)."""
    pod = attrs.get("k8s.pod.name") or attrs.get("pod")
    if not pod:
        return None  # most GPU points: checked first, as this runs once per GPU
    work = {col: next((attrs[k] for k in keys if attrs.get(k)), None) for col, keys in _WORKLOAD_KEYS}
    if any(EXPORTER_POD_MARK in (work[c] or "") for c in ("pod", "container")):
        return None
    return work


def _inspector_points(name: str, points: Any, res: dict[str, str], colls: dict[tuple, dict[str, Any]],
                      series_rows: dict[tuple[int, str], float], rejected: Counter[str]) -> int:
    """NCCL Inspector points: per-operation ones (with ``coll_sn`` / ``p2p_sn``) onto collective rows,
    aggregated buckets onto metric_sample series."""
    p, column, factor = _INSPECTOR_OPS[name]
    job = res.get("slurm.job.id") or "unknown"
    n = 0
    for dp in points:
        attrs = _attrs(dp.attributes)
        if f"{p}_sn" not in attrs:
            n += _series_points(name, [dp], res, series_rows, rejected)
            continue
        value = _value(name, dp, rejected)
        if value is None:
            continue
        try:
            key, base = _inspector_op(p, attrs, job)
        except ValueError as exc:
            rejected[f"NCCL Inspector operation point {exc} ({name})"] += 1
            continue
        if value < 0:
            rejected[f"negative value ({name})"] += 1
            continue
        row = colls.setdefault(key, base)
        row[column] = value * factor
        n += 1
    return n


def _inspector_op(p: str, attrs: dict[str, str], job: str) -> tuple[tuple[str, int, str, int, str, int], dict[str, Any]]:
    """The collective key and the row's fixed fields from one operation point's attributes."""
    def uint(k: str, minimum: int = 0) -> int:
        v = attrs.get(k)
        if v is None or not v.isdigit() or not minimum <= int(v) <= _I64_MAX:
            raise ValueError(f"has no valid {k} ({str(v)[:20]!r})")
        return int(v)

    comm = attrs.get("comm_id")
    if not comm or comm == "unknown" or len(comm) > 128:
        raise ValueError("has no communicator id (comm_id)")
    op = attrs.get("collective" if p == "coll" else "p2p_operation")
    if not op or len(op) > 64:
        raise ValueError("has no operation name")
    node, gpu = attrs.get("node") or "", attrs.get("gpu") or ""
    seq, nranks, size = uint(f"{p}_sn"), uint("nranks", 1), uint(f"{p}_msg_size_bytes")
    if p == "coll":
        peer = -1
        algo, _, proto = (attrs.get("algo_proto") or "").partition("_")
    else:
        peer = uint("p2p_peer")
        algo = proto = ""
    rank = -1 - (zlib.crc32(f"{node}/{gpu}".encode()) & 0x7FFFFFFF)
    comm_id = comm if p == "coll" else comm + "#p2p"
    key = (job, rank, comm_id, seq, op, peer)
    row = {
        "job_id": job, "rank": rank, "comm_id": comm_id, "seq": seq, "op": op, "peer": peer, "bytes": size,
        "nranks": nranks, "start": None, "duration_s": None, "algbw_gbps": None, "busbw_gbps": None,
        "algo": algo if algo and algo != "unknown" else None, "proto": proto if proto and proto != "unknown" else None,
        "dtype": None, "host": node or None, "gpu_uuid": None,
    }
    return key, row


def _series_points(name: str, points: Any, res: dict[str, str], out: dict[tuple[int, str], float], rejected: Counter[str]) -> int:
    n = 0
    for dp in points:
        value = _value(name, dp, rejected)
        if value is None:
            continue
        attrs = _attrs(dp.attributes)
        labels = dict(attrs)
        for k, v in res.items():
            labels.setdefault(k if k not in attrs else f"resource.{k}", v)
        out[(dp.time_unix_nano // 1000, series_key(name, labels))] = value
        n += 1
    return n


def _gpu_target(name: str) -> tuple[tuple[str, float] | None, tuple[str, float] | None]:
    """(column, factor) for a GPU metric: first for metrics that are always per GPU, second for ``hw.*``
    metrics that are GPU samples only where ``hw.type`` is ``gpu``."""
    # Instrument names are case-insensitive in OpenTelemetry and the SDK lowercases them; the Collector's
    # prometheus receiver keeps dcgm-exporter's upper case. Both are the same DCGM field.
    if name.upper() in DCGM_FIELDS:
        return DCGM_FIELDS[name.upper()], None
    if name in _HW_GPU and _HW_GPU[name][0] is not None:
        column, factor = _HW_GPU[name]
        return (column, factor), None
    if name in _HW_TYPED:
        return None, _HW_TYPED[name]
    return None, None


def _wide(parts: list[tuple[np.ndarray, np.ndarray, str, np.ndarray]], uuids: list[str]) -> pl.DataFrame:
    """GPU points (ts_us, GPU number, column, value) to one row per GPU and instant, rows and columns in
    the order they first come; the last point of a repeated (ts, GPU, column) wins, as a re-sent point
    should."""
    uuid_s = pl.Series("gpu_uuid", uuids, dtype=pl.String)
    t0, g0 = parts[0][0], parts[0][1]
    if all(np.array_equal(p[0], t0) and np.array_equal(p[1], g0) for p in parts[1:]) and _distinct(t0, g0):
        # A scrape: every metric has the same points in the same order, so its values are a column as
        # they stand (what the pivot below gives, without sorting out 30 x N long rows).
        cols: dict[str, np.ndarray] = {}
        for _t, _g, column, values in parts:
            cols[column] = values  # a later metric of the same column wins; the column keeps its place
        wide = pl.DataFrame({"ts_us": t0, "gpu_uuid": uuid_s.gather(g0), **cols})
    else:
        names = list(dict.fromkeys(p[2] for p in parts))
        which = np.concatenate([np.full(p[0].size, names.index(p[2]), np.int64) for p in parts])
        long = pl.DataFrame({
            "ts_us": np.concatenate([p[0] for p in parts]),
            "gpu_uuid": uuid_s.gather(np.concatenate([p[1] for p in parts])),
            "column": pl.Series(names, dtype=pl.String).gather(which),
            "value": np.concatenate([p[3] for p in parts]),
        })
        wide = long.pivot(on="column", index=["ts_us", "gpu_uuid"], values="value", aggregate_function="last")
    casts = [pl.col(c).round(0).cast(pl.Int64) for c in wide.columns if c in _INT_COLUMNS]
    return wide.with_columns(*casts, pl.col("ts_us").cast(pl.Datetime("us")).dt.replace_time_zone("UTC").alias("ts")).drop("ts_us").select(
        "ts", "gpu_uuid", *[c for c in wide.columns if c not in ("ts_us", "gpu_uuid")]
    )


def _distinct(ts_us: np.ndarray, gids: np.ndarray) -> bool:
    """No (ts, GPU) pair twice."""
    if not ts_us.size or (ts_us == ts_us[0]).all():
        return np.unique(gids).size == gids.size
    return not pl.DataFrame({"t": ts_us, "g": gids}).is_duplicated().any()


def response(rejected: int, message: str, *, encoding: str) -> tuple[bytes, str]:
    """An ``ExportMetricsServiceResponse`` with ``partial_success`` filled in when points were rejected."""
    from google.protobuf import json_format
    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceResponse

    resp = ExportMetricsServiceResponse()
    if rejected:
        resp.partial_success.rejected_data_points = rejected
        resp.partial_success.error_message = message
    if encoding == "json":
        return json_format.MessageToJson(resp, indent=None).encode(), "application/json"
    return resp.SerializeToString(), "application/x-protobuf"


def gpu_observations(batch: Batch) -> dict[str, list[tuple[float, dict[str, str]]]]:
    """A batch's GPU samples as OTLP observations, ``{metric name: [(value, attributes), ...]}``, named by
    ``GPU_EXPORT`` so that ``from_request`` reads them back into the same columns.

    One observation per GPU and metric: the GPU's latest row (an OTLP gauge has one value per attribute set
    and collection). Attributes: ``hw.id`` (the GPU key), ``hw.type`` ``gpu``, and where the batch knows
    them ``host.name``, ``hw.model``, ``pci_bus_id`` and the pod (``k8s.namespace.name``,
    ``k8s.pod.name``, ``k8s.container.name``). An XID the batch holds only as a health event (NVML reports
    XIDs as events) goes out as ``DCGM_FI_DEV_XID_ERRORS``, DCGM's "value of the last XID".
    """
    gs = batch.gpu_sample
    if gs is None or not gs.height:
        return {}
    latest = gs.sort("ts").unique("gpu_uuid", keep="last", maintain_order=True)
    attrs: dict[str, dict[str, str]] = {u: {"hw.id": u, "hw.type": "gpu"} for u in latest["gpu_uuid"]}
    if batch.gpu is not None:
        for row in batch.gpu.iter_rows(named=True):
            a = attrs.get(row["gpu_uuid"])
            if a is not None:
                for key, col in (("host.name", "host"), ("hw.model", "model_name"), ("pci_bus_id", "pci_bus_id")):
                    if row.get(col):
                        a[key] = str(row[col])
    if batch.gpu_workload is not None:
        for row in batch.gpu_workload.sort("ts").iter_rows(named=True):
            a = attrs.get(row["gpu_uuid"])
            if a is not None:
                for col, (key, _) in _WORKLOAD_KEYS:
                    if row.get(col):
                        a[key] = row[col]
    xids: dict[str, int] = {}
    if batch.health_event is not None and "xid_last" not in gs.columns:
        for row in batch.health_event.filter(pl.col("kind") == "xid").sort("ts").iter_rows(named=True):
            if row["gpu_uuid"] in attrs:
                xids[row["gpu_uuid"]] = int(row["code"])
    out: dict[str, list[tuple[float, dict[str, str]]]] = {}
    for column, (name, _unit, factor) in GPU_EXPORT.items():
        if column not in latest.columns:
            continue
        obs = [(float(v) * factor, attrs[u]) for u, v in zip(latest["gpu_uuid"], latest[column]) if v is not None]
        if obs:
            out[name] = obs
    if xids:
        out[GPU_EXPORT["xid_last"][0]] = [(float(x), attrs[u]) for u, x in xids.items()]
    return out


# --- The wire path: protobuf bodies without a message object per data point ---------------------------
#
# Wire format: https://protobuf.dev/programming-guides/encoding/. Field numbers: opentelemetry-proto
# collector/metrics/v1/metrics_service.proto, metrics/v1/metrics.proto, common/v1/common.proto.
# A short walk down to each Metric (``_strip``) cuts the points of GPU gauges/sums out of the body; upb
# decodes the rest, so everything else is checked and read exactly as before. The cut points are read
# as numpy columns when every point has the layout collectors write (time, value, then plain string
# attributes), each distinct attribute byte string decoded once; a GPU metric with a point of another
# shape is decoded by upb from its own bytes and walked as before. Either way ``_Walk`` gets the same.

_WIRE_MIN_BYTES = 4096  # GPU metrics with smaller payloads (about 25 DCGM points) take the message path
_B8 = np.arange(8, dtype=np.int64)


def locate_error(data: bytes) -> str | None:
    """Where an ``ExportMetricsServiceRequest`` body is malformed, walking it with the real schema: the
    first wire error, invalid UTF-8 in a string field or nesting past upb's limit, with its byte offset
    and field path. None where the walk finds nothing (upb's own message is then the best there is)."""
    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

    try:
        _check(data, 0, len(data), ExportMetricsServiceRequest.DESCRIPTOR, 0, "request")
    except _WireError as exc:
        return str(exc)
    except RecursionError:
        return "messages nested too deeply"
    return None


def _check(data: bytes, pos: int, end: int, desc: Any, depth: int, path: str) -> None:
    from google.protobuf.descriptor import FieldDescriptor

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
    from google.protobuf.message import DecodeError
    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

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


def _parse_protobuf(data: bytes, source: str) -> _Walk:
    from google.protobuf.message import DecodeError
    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

    if b"DCGM_FI_" not in data and b"dcgm_fi_" not in data and b"hw." not in data:
        # No GPU metric spelled as collectors and SDKs spell them (a mixed-case name still reads right
        # on the message path): skip the walk, which only costs a request of many small series.
        return _walk_request(decode(data, encoding="protobuf", source=source))
    try:
        stripped = _strip(data)
    except _WireError as exc:
        raise ParseError(f"not an OTLP protobuf ExportMetricsServiceRequest: {exc}", source=source) from None
    except RecursionError:
        raise ParseError("not an OTLP protobuf ExportMetricsServiceRequest: groups nested too deeply", source=source) from None
    if stripped is None:
        return _walk_request(decode(data, encoding="protobuf", source=source))
    body, cuts = stripped
    req = ExportMetricsServiceRequest()
    try:
        req.ParseFromString(body)
    except (DecodeError, ValueError, RecursionError) as exc:
        raise ParseError(f"not an OTLP protobuf ExportMetricsServiceRequest: {locate_error(data) or exc}", source=source) from None
    walk = _Walk()
    labels = _LabelSets()
    view = memoryview(data)  # the points are read in place
    k = 0
    for rm in req.resource_metrics:
        res = _attrs(rm.resource.attributes)
        host_default = res.get("host.name") or res.get("k8s.node.name")
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                cut = cuts[k]
                k += 1
                if cut is None:
                    walk.metric(metric, res, host_default)
                elif not _gpu_metric_wire(walk, metric.name, view[cut[0]:cut[1]], res, host_default, labels):
                    walk.metric(_real_metric(data[cut[2]:cut[3]], data, source), res, host_default)
    return walk


def _gpu_metric_wire(walk: _Walk, name: str, points: memoryview, res: dict[str, str], host_default: str | None, labels: _LabelSets) -> bool:
    """Feed a GPU gauge/sum to ``walk`` from its Gauge/Sum payload; False (and nothing fed) where the
    metric needs the message path."""
    if len(points) < _WIRE_MIN_BYTES:
        return False  # a few points: numpy's fixed cost per metric is more than upb's per point
    static, typed = _gpu_target(name)
    cols = _wire_points(points, labels)
    if cols is None:
        return False
    ts_ns, values, aids = cols
    if not labels.column("simple")[aids].all():
        return False
    if typed is not None and not labels.column("hw_gpu")[aids].all():
        return False  # some points are other hardware: series, which the message path writes
    walk.gpu_points(name, static if typed is None else typed, ts_ns, values, aids, labels, host_default)
    return True


# --- declaration (ingest.format) ---------------------------------------------------------------------

FORMATS = (
    FormatSpec("otlp_json", "OTLP/JSON ExportMetricsServiceRequest (as posted to /v1/metrics)",
               lambda d, s, o: parse(d, encoding="json", source=s),
               sniff=Sniff(11, lambda v: v.is_json and '"resourceMetrics"' in v.text[:4096])),
)

"""OTLP metrics to canonical frames: what a walk over an ``ExportMetricsServiceRequest``'s metrics
gathers (``_Walk``), point by point or (from ``ingest.otlp_wire``) column by column, and the frames it builds.

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

from fleetscope.core.dcgm_fields import DCGM_FIELDS, EXPORTER_POD_MARK, dcgm_health_events
from fleetscope.core.frames import COLLECTIVE, GPU_SAMPLE, GPU_WORKLOAD, METRIC_SAMPLE, UTC_US, Batch, series_key
from ingest import serving_metrics

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

_INT_COLUMNS = {c for c, t in GPU_SAMPLE.schema.items() if t == pl.Int64}



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
                   labels: Any, host_default: str | None) -> None:
        """A GPU metric's points as columns (from the wire path; ``labels`` is its ``otlp_wire._LabelSets``),
        with the same checks, in the same order, as ``metric``: a value, finite, in range, a timestamp, a GPU
        id. Every label set is ``simple``
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

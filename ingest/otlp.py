"""OTLP metrics (``ExportMetricsServiceRequest``, protobuf or JSON) into canonical frames.

What maps onto ``gpu_sample`` (wide, one row per GPU and instant):
- DCGM series as an OpenTelemetry Collector's prometheus receiver forwards dcgm-exporter's scrape:
  metric ``DCGM_FI_*`` with the exporter's labels (``UUID``/``uuid``, ``Hostname``, ``gpu``, ...) as
  data-point attributes; units converted by ``frames.DCGM_FIELDS``.
- The OpenTelemetry hardware semantic conventions (semconv ``hw.*``): ``hw.gpu.utilization`` (ratio),
  ``hw.gpu.memory.usage`` (By), and ``hw.power`` (W), ``hw.energy`` (J), ``hw.temperature`` (Cel) where
  ``hw.type`` is ``gpu``; the GPU is ``hw.id``.
GPU samples also give ``health_event`` rows (XID, ECC, row remap; ``frames.dcgm_health_events``, as for the
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
(opentelemetry-proto, ``ExportMetricsPartialSuccess``): histograms and summaries (we keep scalars),
points with no value, non-finite values, GPU series without a GPU id, Inspector operation points whose
sequence number, size, rank count or communicator is missing or malformed.

The other direction, ``gpu_observations``, is what the Fleetscope agent exports: the semconv names where the
hardware conventions define the field, the DCGM field name in DCGM's unit otherwise, so that this module
reads back exactly what the agent sent.

Spec: https://opentelemetry.io/docs/specs/otlp/ (OTLP/HTTP, JSON encoding) and the semantic conventions
for hardware metrics (https://opentelemetry.io/docs/specs/semconv/hardware/).
"""

from __future__ import annotations

import math
import zlib
from collections import Counter
from collections.abc import Mapping
from typing import Any

import polars as pl

from fleetscope.errors import ParseError
from fleetscope.frames import (
    COLLECTIVE,
    DCGM_FIELDS,
    EXPORTER_POD_MARK,
    GPU_SAMPLE,
    GPU_WORKLOAD,
    METRIC_SAMPLE,
    UTC_US,
    Batch,
    dcgm_health_events,
    series_key,
)

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
            raise ParseError(f"not an OTLP protobuf ExportMetricsServiceRequest: {exc}", source=source) from None
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
    """Parse an OTLP metrics request into a Batch; ``meta`` holds ``rejected_points`` and their reasons."""
    return from_request(decode(data, encoding=encoding, source=source), source=source)


def from_request(req: Any, *, source: str = "") -> Batch:
    """Columnar walk of a decoded request: per GPU metric, three lists (GPU id, time, value), pivoted
    to wide rows by polars at the end. Attribute wrappers are what cost most in the protobuf runtime, so
    a GPU's full attribute set is read only the first time the GPU is seen; after that only its id."""
    parts: list[pl.DataFrame] = []
    series_rows: dict[tuple[int, str], float] = {}
    gpus: dict[str, dict[str, Any]] = {}
    workloads: list[dict[str, Any]] = []
    colls: dict[tuple[str, int, str, int, str, int], dict[str, Any]] = {}
    rejected: Counter[str] = Counter()
    accepted = 0
    for rm in req.resource_metrics:
        res = _attrs(rm.resource.attributes)
        host_default = res.get("host.name") or res.get("k8s.node.name")
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                kind = metric.WhichOneof("data")
                if kind not in ("gauge", "sum"):
                    n = len(getattr(metric, kind).data_points) if kind else 1
                    rejected[f"{kind or 'empty'} metrics are not stored ({metric.name})"] += n
                    continue
                name = metric.name
                points = getattr(metric, kind).data_points
                if name in _INSPECTOR_OPS:
                    accepted += _inspector_points(name, points, res, colls, series_rows, rejected)
                    continue
                static, typed = _gpu_target(name)
                if static is None and typed is None:
                    accepted += _series_points(name, points, res, series_rows, rejected)
                    continue
                uuids: list[str] = []
                times: list[int] = []
                values: list[float] = []
                columns: list[str] = []
                pos = -1  # where the GPU id sits in this metric's attribute lists; collectors keep one order
                for dp in points:
                    # _value's checks, inlined: this loop runs once per GPU value and is the receiver's hot path
                    which = dp.WhichOneof("value")
                    if which is None:
                        rejected[f"data point without a value ({name})"] += 1
                        continue
                    value = float(dp.as_double if which == "as_double" else dp.as_int)
                    if not math.isfinite(value):
                        rejected[f"non-finite value ({name})"] += 1
                        continue
                    ts_ns = dp.time_unix_nano
                    if ts_ns <= 0:
                        rejected[f"data point without a timestamp ({name})"] += 1
                        continue
                    kvs = dp.attributes
                    attrs = None
                    uuid = None
                    col = static
                    if typed is not None:
                        # hw.power / hw.energy / hw.temperature describe any hardware; only GPUs are GPU samples.
                        attrs = _attrs(kvs)
                        if attrs.get("hw.type") != "gpu":
                            accepted += _series_points(name, [dp], res, series_rows, rejected)
                            continue
                        col = typed
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
                    if uuid not in gpus:
                        attrs = attrs if attrs is not None else _attrs(kvs)
                        gpus[uuid] = {
                            "gpu_uuid": uuid,
                            "host": attrs.get("Hostname") or attrs.get("hostname") or attrs.get("host.name") or host_default,
                            "model_name": attrs.get("modelName") or attrs.get("model_name") or attrs.get("hw.model"),
                            "pci_bus_id": attrs.get("pci_bus_id"),
                        }
                        work = _workload(attrs)
                        if work:
                            workloads.append({"ts_us": ts_ns // 1000, "gpu_uuid": uuid, **work})
                    uuids.append(uuid)
                    times.append(ts_ns // 1000)
                    values.append(value * col[1])
                    columns.append(col[0])
                if uuids:
                    accepted += len(uuids)
                    parts.append(pl.DataFrame({"ts_us": times, "gpu_uuid": uuids, "column": columns, "value": values},
                                              schema={"ts_us": pl.Int64, "gpu_uuid": pl.String, "column": pl.String, "value": pl.Float64}))
    batch = Batch(source=source, meta={"accepted_points": accepted, "rejected_points": sum(rejected.values()), "rejected_reasons": dict(rejected)})
    if parts:
        batch.gpu_sample = _wide(pl.concat(parts))
        batch.gpu = pl.DataFrame(list(gpus.values()), schema={"gpu_uuid": pl.String, "host": pl.String, "model_name": pl.String, "pci_bus_id": pl.String})
        batch.health_event = dcgm_health_events(batch.gpu_sample, batch.gpu, source="otlp")
    if workloads:
        batch.gpu_workload = pl.DataFrame(workloads, schema={"ts_us": pl.Int64, "gpu_uuid": pl.String, "namespace": pl.String, "pod": pl.String, "container": pl.String}).select(
            pl.col("ts_us").cast(pl.Datetime("us")).dt.replace_time_zone("UTC").alias("ts"), *GPU_WORKLOAD.names[1:])
    if colls:
        batch.collective = pl.DataFrame(list(colls.values()), schema=COLLECTIVE.schema)
    if series_rows:
        keys = list(series_rows)
        batch.metric_sample = pl.DataFrame(
            {"ts": pl.Series([k[0] for k in keys], dtype=pl.Int64).cast(pl.Datetime("us")).dt.replace_time_zone("UTC"),
             "series": [k[1] for k in keys], "value": list(series_rows.values())},
            schema={"ts": UTC_US, "series": pl.String, "value": pl.Float64},
        ).select(list(METRIC_SAMPLE.names))
    return batch


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
    work = {col: next((attrs[k] for k in keys if attrs.get(k)), None) for col, keys in _WORKLOAD_KEYS}
    if not work["pod"] or any(EXPORTER_POD_MARK in (work[c] or "") for c in ("pod", "container")):
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


def _wide(long: pl.DataFrame) -> pl.DataFrame:
    """(ts, GPU, column, value) points to one row per GPU and instant; the last point of a repeated
    (ts, GPU, column) wins, as a re-sent point should."""
    wide = long.pivot(on="column", index=["ts_us", "gpu_uuid"], values="value", aggregate_function="last")
    casts = [pl.col(c).round(0).cast(pl.Int64) for c in wide.columns if c in _INT_COLUMNS]
    return wide.with_columns(*casts, pl.col("ts_us").cast(pl.Datetime("us")).dt.replace_time_zone("UTC").alias("ts")).drop("ts_us").select(
        "ts", "gpu_uuid", *[c for c in wide.columns if c not in ("ts_us", "gpu_uuid")]
    )


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

"""OTLP metrics (``ExportMetricsServiceRequest``, protobuf or JSON) into canonical frames.

What maps onto ``gpu_sample`` (wide, one row per GPU and instant):
- DCGM series as an OpenTelemetry Collector's prometheus receiver forwards dcgm-exporter's scrape:
  metric ``DCGM_FI_*`` with the exporter's labels (``UUID``/``uuid``, ``Hostname``, ``gpu``, ...) as
  data-point attributes; units converted by ``frames.DCGM_FIELDS``.
- The OpenTelemetry hardware semantic conventions (semconv ``hw.*``): ``hw.gpu.utilization`` (ratio),
  ``hw.gpu.memory.usage`` (By), and ``hw.power`` (W), ``hw.energy`` (J), ``hw.temperature`` (Cel) where
  ``hw.type`` is ``gpu``; the GPU is ``hw.id``.
Everything else numeric (NCCL Inspector's own OTLP metrics among them) becomes ``metric_sample`` series keyed
by name and attributes (resource attributes included, prefixed ``resource.`` where they would clash).

Rejected points are counted with a reason, as the OTLP partial-success response reports them
(opentelemetry-proto, ``ExportMetricsPartialSuccess``): histograms and summaries (we keep scalars),
points with no value, non-finite values, GPU series without a GPU id.

Spec: https://opentelemetry.io/docs/specs/otlp/ (OTLP/HTTP, JSON encoding) and the semantic conventions
for hardware metrics (https://opentelemetry.io/docs/specs/semconv/hardware/).
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

import polars as pl

from fleetscope.errors import ParseError
from fleetscope.frames import DCGM_FIELDS, GPU_SAMPLE, METRIC_SAMPLE, UTC_US, Batch, series_key

_HW_GPU = {
    "hw.gpu.utilization": ("util_ratio", 1.0),
    "hw.gpu.memory.usage": ("fb_used_bytes", 1.0),
    "hw.gpu.memory.utilization": (None, 1.0),
}
_HW_TYPED = {"hw.power": ("power_w", 1.0), "hw.energy": ("energy_j", 1.0), "hw.temperature": ("temp_c", 1.0)}
_UUID_KEYS = ("UUID", "uuid", "gpu_uuid", "hw.id", "gpu.uuid")
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
    if series_rows:
        keys = list(series_rows)
        batch.metric_sample = pl.DataFrame(
            {"ts": pl.Series([k[0] for k in keys], dtype=pl.Int64).cast(pl.Datetime("us")).dt.replace_time_zone("UTC"),
             "series": [k[1] for k in keys], "value": list(series_rows.values())},
            schema={"ts": UTC_US, "series": pl.String, "value": pl.Float64},
        ).select(list(METRIC_SAMPLE.names))
    return batch


def _series_points(name: str, points: Any, res: dict[str, str], out: dict[tuple[int, str], float], rejected: Counter[str]) -> int:
    n = 0
    for dp in points:
        which = dp.WhichOneof("value")
        if which is None:
            rejected[f"data point without a value ({name})"] += 1
            continue
        value = float(getattr(dp, which))
        if not math.isfinite(value):
            rejected[f"non-finite value ({name})"] += 1
            continue
        if dp.time_unix_nano <= 0:
            rejected[f"data point without a timestamp ({name})"] += 1
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

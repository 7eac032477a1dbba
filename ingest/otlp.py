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
    gpu_rows: dict[tuple[int, str], dict[str, Any]] = {}
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
                target = _gpu_column(name)
                for dp in getattr(metric, kind).data_points:
                    which = dp.WhichOneof("value")
                    if which is None:
                        rejected[f"data point without a value ({name})"] += 1
                        continue
                    value = float(getattr(dp, which))
                    if not math.isfinite(value):
                        rejected[f"non-finite value ({name})"] += 1
                        continue
                    ts_ns = dp.time_unix_nano
                    if ts_ns <= 0:
                        rejected[f"data point without a timestamp ({name})"] += 1
                        continue
                    ts_us = ts_ns // 1000
                    attrs = _attrs(dp.attributes)
                    col = target(attrs) if target else None
                    if col is not None:
                        column, factor = col
                        uuid = next((attrs[k] for k in _UUID_KEYS if attrs.get(k)), None)
                        if not uuid:
                            rejected[f"GPU metric without a GPU id attribute ({name})"] += 1
                            continue
                        row = gpu_rows.setdefault((ts_us, uuid), {})
                        row[column] = value * factor
                        if uuid not in gpus:
                            gpus[uuid] = {
                                "gpu_uuid": uuid,
                                "host": attrs.get("Hostname") or attrs.get("hostname") or attrs.get("host.name") or host_default,
                                "model_name": attrs.get("modelName") or attrs.get("model_name") or attrs.get("hw.model"),
                                "pci_bus_id": attrs.get("pci_bus_id"),
                            }
                        accepted += 1
                        continue
                    labels = dict(attrs)
                    for k, v in res.items():
                        labels.setdefault(k if k not in attrs else f"resource.{k}", v)
                    series_rows[(ts_us, series_key(name, labels))] = value
                    accepted += 1
    batch = Batch(source=source, meta={"accepted_points": accepted, "rejected_points": sum(rejected.values()), "rejected_reasons": dict(rejected)})
    if gpu_rows:
        batch.gpu_sample = _wide(gpu_rows)
        batch.gpu = pl.DataFrame(list(gpus.values()), schema={"gpu_uuid": pl.String, "host": pl.String, "model_name": pl.String, "pci_bus_id": pl.String})
    if series_rows:
        keys = list(series_rows)
        batch.metric_sample = pl.DataFrame(
            {"ts": pl.Series([k[0] for k in keys], dtype=pl.Int64).cast(pl.Datetime("us")).dt.replace_time_zone("UTC"),
             "series": [k[1] for k in keys], "value": list(series_rows.values())},
            schema={"ts": UTC_US, "series": pl.String, "value": pl.Float64},
        ).select(list(METRIC_SAMPLE.names))
    return batch


def _gpu_column(name: str):  # type: ignore[no-untyped-def]
    """A function from a point's attributes to its (column, factor), or None where the metric is not a GPU field."""
    # Instrument names are case-insensitive in OpenTelemetry and the SDK lowercases them; the Collector's
    # prometheus receiver keeps dcgm-exporter's upper case. Both are the same DCGM field.
    if name.upper() in DCGM_FIELDS:
        found = DCGM_FIELDS[name.upper()]
        return lambda _attrs: found
    if name in _HW_GPU and _HW_GPU[name][0] is not None:
        found = _HW_GPU[name]
        return lambda _attrs: found
    if name in _HW_TYPED:
        found = _HW_TYPED[name]
        # hw.power / hw.energy / hw.temperature describe any hardware; only GPUs go to gpu_sample.
        return lambda attrs: found if attrs.get("hw.type") == "gpu" else None
    return None


def _wide(rows: dict[tuple[int, str], dict[str, Any]]) -> pl.DataFrame:
    keys = list(rows)
    columns = sorted({c for r in rows.values() for c in r})
    data: dict[str, Any] = {
        "ts": pl.Series([k[0] for k in keys], dtype=pl.Int64).cast(pl.Datetime("us")).dt.replace_time_zone("UTC"),
        "gpu_uuid": [k[1] for k in keys],
    }
    for c in columns:
        values = [rows[k].get(c) for k in keys]
        if c in _INT_COLUMNS:
            data[c] = pl.Series(c, [None if v is None else round(v) for v in values], dtype=pl.Int64)
        else:
            data[c] = pl.Series(c, values, dtype=pl.Float64)
    return pl.DataFrame(data)


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

"""OTLP metrics (``ExportMetricsServiceRequest``, protobuf or JSON) into canonical frames.

This module is the way in: ``parse`` and ``read`` (a request's walk, for ``gather``) and the
partial-success ``response``. The pieces, each its own module:
- ``ingest.otlp_mapping``: OTLP to canonical frames (what maps onto ``gpu_sample``, ``collective``,
  ``metric_sample``, serving rows, and what is rejected and why);
- ``ingest.otlp_wire``: the protobuf wire reader that cuts GPU points out of a body as numpy columns;
- ``ingest.otlp_export``: the other direction, what the Fleetscope agent exports (``gpu_observations``).

Protobuf bodies take a wire path (``_parse_protobuf``): the points of GPU gauges/sums are read from the
protobuf wire format as numpy columns, each distinct attribute byte string decoded once, and everything
else by upb as before; its Batch is the one ``from_request`` gives for the same body, and a malformed
body's ParseError names what is wrong and its byte offset (https://protobuf.dev/programming-guides/encoding/).

Spec: https://opentelemetry.io/docs/specs/otlp/ (OTLP/HTTP, JSON encoding) and the semantic conventions
for hardware metrics (https://opentelemetry.io/docs/specs/semconv/hardware/).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fleetscope.core.dcgm_fields import DCGM_HEALTH_COUNTERS, health_event_rows, health_rows_in_order
from fleetscope.core.errors import ParseError
from fleetscope.core.frames import HEALTH_EVENT, Batch
from fleetscope.core.protowire import WireError as _WireError
from ingest import otlp_template
from ingest.format import FormatSpec, Sniff
from ingest.otlp_mapping import _INT_COLUMNS, _attrs, _distinct, _gpu_target, _Walk, _walk_request
from ingest.otlp_wire import _LabelSets, _real_metric, _strip, _wire_points, locate_error
from google.protobuf import json_format
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceResponse,
)


def decode(data: bytes, *, encoding: str, source: str = "") -> Any:
    """Bytes to an ``ExportMetricsServiceRequest``; ``encoding`` is ``protobuf`` or ``json``."""

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


def parse(data: bytes, *, encoding: str, source: str = "") -> Batch:
    """Parse an OTLP metrics request into a Batch; ``meta`` holds ``rejected_points`` and their reasons.

    Protobuf bodies take the wire path (``_parse_protobuf``); its Batch is the one ``from_request`` gives
    for the same request, which the tests check over varied requests."""
    return read(data, encoding=encoding, source=source).batch(source)


def read(data: bytes, *, encoding: str, source: str = "", looked_up: bool = False) -> _Walk:
    """What ``parse`` gathers from a request before building its frames: many requests' readings are
    built into one Batch by ``gather`` (a group commit of agents' pushes), each frame once. ``looked_up``:
    the caller has just found no template for ``data`` (``otlp_template.lookup``)."""
    if encoding == "protobuf":
        walk = None if looked_up else otlp_template.lookup(data)
        if walk is None:
            walk, tried = otlp_template.read_new(data, lambda body: _parse_protobuf(body, source))
            if walk is None:
                walk = _parse_protobuf(data, source)
                if not tried:
                    otlp_template.learn(data, walk, lambda body: _parse_protobuf(body, source))
        return walk
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


_FAULT_COLUMNS = frozenset(("xid_last", *(c for c, *_ in DCGM_HEALTH_COUNTERS)))
_GPU_TUPLE_COLUMNS = ("gpu_uuid", "host", "pci_bus_id", "model_name")
_WORKLOAD_COLUMNS = ("namespace", "pod", "container")


def _scrape_columns(walk: _Walk) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]] | None:
    """(ts_us, GPU number, values per column) of a walk whose GPU metrics all have the same points in the
    same order, no (ts, GPU) twice (``_wide``'s scrape case, a later metric of a column winning); None for
    any other walk."""
    found = walk.__dict__.get("_scrape", False)  # worked out once a walk: the door asks twice
    if found is not False:
        return found
    found = None
    parts = walk.parts
    if not parts:
        found = np.zeros(0, np.int64), np.zeros(0, np.int64), {}
    else:
        t0, g0 = parts[0][0], parts[0][1]
        if all(p[0].size == t0.size and p[1].size == g0.size for p in parts) and t0.size == g0.size:
            same = len(parts) == 1 or (bool((np.stack([p[0] for p in parts[1:]]) == t0).all())
                                       and bool((np.stack([p[1] for p in parts[1:]]) == g0).all()))
            if same and _distinct(t0, g0):
                found = t0, g0, {column: values for _t, _g, column, values in parts}  # a later metric of a column wins
    walk._scrape = found
    return found


def plain(walk: _Walk) -> bool:
    """Whether a request's readings can be written as rows (``tuples``): a scrape of GPU samples and plain
    series (no NCCL operations, no serving rows), every float finite and no NUL in any text (which the
    frame path refuses, and says where)."""
    return _walk_rows(walk) is not None


def health_rows(walk: _Walk) -> list[tuple[Any, ...]]:
    """The health events of a ``plain`` request's GPU samples as rows (``dcgm_fields.health_event_rows``): what
    its ``parse`` Batch holds. Empty without a fault reading."""
    found = walk.__dict__.get("_health")
    if found is not None:
        return found
    rows = _walk_rows(walk)
    if rows is None:
        raise ValueError("health_rows takes a plain request (otlp.plain)")
    ts, keys, out = rows
    faults = [values for column, values in out.items() if column in _FAULT_COLUMNS]
    hit = [i for i in range(len(ts)) if any(values[i] for values in faults)]
    found = []
    if hit:
        host_of: dict[str, str | None] = {}
        for g in walk.gpus:
            host_of.setdefault(g["gpu_uuid"], g["host"])
        found = health_event_rows(((ts[i], keys[i], {c: v[i] for c, v in out.items() if c in _FAULT_COLUMNS}) for i in hit),
                                  host_of, {}, source="otlp")
    walk._health = found
    return found


def _walk_rows(walk: _Walk) -> tuple[list[int], list[str], dict[str, list[Any]]] | None:
    """(ts_us, GPU key, values per column) of a ``plain`` walk's gpu_sample rows; None for another walk.
    Worked out once a walk."""
    found = walk.__dict__.get("_rows", False)
    if found is not False:
        return found
    walk._rows = None
    if walk.colls or walk.serving:
        return None
    shaped = _scrape_columns(walk)
    if shaped is None:
        return None
    t0, g0, cols = shaped
    matrix = walk.__dict__.get("_matrix")  # a template's scrape: its values as one matrix (otlp_template._fill)
    out = _matrix_rows(*matrix) if matrix is not None else _column_rows(cols)
    if out is None:
        return None
    texts = [v for g in walk.gpus for v in g.values() if isinstance(v, str)]
    texts += [v for r in walk.workloads for v in r.values() if isinstance(v, str)]
    texts += [series for _, series in walk.series_rows]
    if any("\x00" in v for v in texts):
        return None
    uuids = [g["gpu_uuid"] for g in walk.gpus]
    walk._rows = (t0.tolist(), [uuids[g] for g in g0.tolist()], out)
    return walk._rows


def _column_rows(cols: dict[str, np.ndarray]) -> dict[str, list[Any]] | None:
    """Each column's values as a list (integer columns rounded); None for a value not finite."""
    out = {}
    for column, values in cols.items():
        if column in _INT_COLUMNS:
            out[column] = np.round(values).astype(np.int64).tolist()  # half to even, as the frame path's round(0)
        elif not np.isfinite(values).all():
            return None
        else:
            out[column] = values.tolist()
    return out


def _matrix_rows(columns: list[str], values_of: np.ndarray, integer: np.ndarray) -> dict[str, list[Any]] | None:
    """``_column_rows`` of a template's scrape given as one matrix (a row a column), in a few array operations."""
    floats = values_of[~integer]
    if not np.isfinite(floats).all():
        return None
    ints, flts = iter(np.round(values_of[integer]).astype(np.int64).tolist()), iter(floats.tolist())
    return {column: next(ints) if i else next(flts) for column, i in zip(columns, integer.tolist())}


def tuples(walks: list[_Walk]) -> dict[str, tuple[tuple[str, ...], list[tuple[Any, ...]]]] | None:
    """Many requests' readings as plain rows per frame, ``(columns, rows)`` with times in epoch
    microseconds, for ``Store.write_rows``: what ``gather``'s Batch stores, without building frames. None
    unless every walk is ``plain`` and no GPU is in two of them."""
    columns: dict[str, None] = {}
    per_walk = []
    seen: set[str] = set()
    for w in walks:
        rows = _walk_rows(w)
        if rows is None:
            return None
        uuids = [g["gpu_uuid"] for g in w.gpus]
        if not seen.isdisjoint(uuids):
            return None
        seen.update(uuids)
        columns.update(dict.fromkeys(rows[2]))
        per_walk.append(rows)
    names = tuple(columns)
    samples: list[tuple[Any, ...]] = []
    for ts, keys, out in per_walk:
        filled = [out.get(c) or [None] * len(ts) for c in names]
        samples.extend(zip(ts, keys, *filled))
    inventory: dict[str, tuple[Any, ...]] = {}
    workload: dict[tuple[int, str], tuple[Any, ...]] = {}
    metrics: dict[tuple[int, str], tuple[Any, ...]] = {}
    for w in walks:
        for g in w.gpus:
            inventory[g["gpu_uuid"]] = tuple(g[c] for c in _GPU_TUPLE_COLUMNS)
        for r in w.workloads:
            workload.setdefault((r["ts_us"], r["gpu_uuid"]), (r["ts_us"], r["gpu_uuid"], *(r[c] for c in _WORKLOAD_COLUMNS)))
        for (ts_us, series), value in w.series_rows.items():
            metrics.setdefault((ts_us, series), (ts_us, series, value))
    health = [row for w in walks for row in health_rows(w)]
    out_frames = {"gpu_sample": (("ts", "gpu_uuid", *names), samples)}
    if health:
        out_frames["health_event"] = (HEALTH_EVENT.names, health_rows_in_order(health))
    for name, cols, rows_ in (("gpu", _GPU_TUPLE_COLUMNS, list(inventory.values())),
                              ("gpu_workload", ("ts", "gpu_uuid", *_WORKLOAD_COLUMNS), list(workload.values())),
                              ("metric_sample", ("ts", "series", "value"), list(metrics.values()))):
        # a column null in every row is left out (none of these has a server default)
        keep = [i for i, c in enumerate(cols) if i < 2 or any(r[i] is not None for r in rows_)]
        out_frames[name] = (tuple(cols[i] for i in keep), rows_ if len(keep) == len(cols) else [tuple(r[i] for i in keep) for r in rows_])
    return {k: v for k, v in out_frames.items() if v[1]}


def gpu_uuids(walk: _Walk) -> list[str]:
    """The GPUs a request's readings are about (to keep apart requests that share one)."""
    return [g["gpu_uuid"] for g in walk.gpus]


def counts(walk: _Walk) -> tuple[dict[str, int], int]:
    """Rows a request offers per frame (health events aside) and the values it carries, as its ``parse``
    Batch would count them, without building the frames."""
    shaped = _scrape_columns(walk)
    if shaped is not None:
        n_rows, n_cells = shaped[0].size, shaped[0].size * len(shaped[2])
    else:
        cells = {(t, g, col) for ts, gids, col, _ in walk.parts for t, g in zip(ts.tolist(), gids.tolist())}
        n_rows, n_cells = len({(t, g) for t, g, _ in cells}), len(cells)
    rows = {"gpu_sample": n_rows, "gpu": len(walk.gpus), "gpu_workload": len(walk.workloads),
            "metric_sample": len(walk.series_rows), "collective": len(walk.colls)}
    return {k: v for k, v in rows.items() if v}, n_cells + len(walk.series_rows)


def rejected(walk: _Walk) -> tuple[int, dict[str, int]]:
    """Points a request's walk refused, and why (OTLP partial success)."""
    return sum(walk.rejected.values()), dict(walk.rejected)


def from_request(req: Any, *, source: str = "") -> Batch:
    """Columnar walk of a decoded request: per GPU metric, three columns (GPU, time, value), put side by
    side as wide rows at the end."""
    return _walk_request(req).batch(source)


def response(rejected: int, message: str, *, encoding: str) -> tuple[bytes, str]:
    """An ``ExportMetricsServiceResponse`` with ``partial_success`` filled in when points were rejected."""

    resp = ExportMetricsServiceResponse()
    if rejected:
        resp.partial_success.rejected_data_points = rejected
        resp.partial_success.error_message = message
    if encoding == "json":
        return json_format.MessageToJson(resp, indent=None).encode(), "application/json"
    return resp.SerializeToString(), "application/x-protobuf"


_WIRE_MIN_BYTES = 4096  # GPU metrics with smaller payloads (about 25 DCGM points) take the message path



def _parse_protobuf(data: bytes, source: str) -> _Walk:
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

"""The other direction: what the Fleetscope agent exports over OTLP. ``gpu_observations`` names a batch's
GPU samples by ``GPU_EXPORT``: the semconv names where the hardware conventions define the field, the DCGM
field name in DCGM's unit otherwise, so that ``ingest.otlp_mapping`` reads back exactly what the agent sent.

Spec: the semantic conventions for hardware metrics (https://opentelemetry.io/docs/specs/semconv/hardware/).
"""

from __future__ import annotations

import polars as pl

from fleetscope.core.dcgm_fields import DCGM_FIELDS
from fleetscope.core.frames import Batch
from ingest.otlp_mapping import _WORKLOAD_KEYS

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

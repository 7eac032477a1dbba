"""The canonical frames and the ``Batch`` that carries them: the unit ingest produces and the store writes in
one transaction, its JSON body for ``POST /api/v1/batches``, and the finding frame analyzers build.

This is the one place readers import frames from: the specs are declared in ``core.canonical_frames``, how a
frame is declared and checked in ``core.spec``, the series-key codec in ``core.series``, and their names are
re-exported here. DCGM's field table is ``core.dcgm_fields``.

Pure: polars only, nothing of the database, HTTP or Celery.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import polars as pl

from fleetscope.core.canonical_frames import (  # noqa: F401  (the frames' public names, imported from here)
    GPU_FIELDS, GPU_SAMPLE, METRIC_SAMPLE, COLLECTIVE, STEP, DEVICE_UNION, JOB_OP, JOB_LIFECYCLE_KINDS, JOB_RECORD_KINDS,
    JOB_EVENT_KINDS, JOB_EVENT, HEALTH_EVENT, GPU_WORKLOAD, NCCL_TEST, FABRIC_COUNTERS, FABRIC_PORT_SAMPLE,
    FABRIC_LINK, FABRIC_GPU_NIC, FABRIC_FRAMES, SITE, HOST, GPU, JOB, JOB_RANK, FINDING, STEP_BREAKDOWN,
    GPU_ENERGY_MINUTE, JOB_ANALYSIS, ENERGY_INSTRUMENT, SITE_ENERGY_MINUTE, JOB_ENERGY_MINUTE, ENERGY_FRAMES,
    FRAMES,
)
from fleetscope.core.series import parse_series_key, series_key  # noqa: F401  (the frames' public names)
from fleetscope.core.spec import UTC_US, Col, FrameSpec, conform, from_records, require_columns  # noqa: F401  (the frames' public names)


@dataclass
class Batch:
    """The unit ingest produces and the store writes in one transaction.

    Each field is a canonical frame or ``None``. ``source`` says where the data came from (a file
    path, an endpoint, an exporter URL) so errors and the audit trail can name it.
    """

    source: str = ""
    site: pl.DataFrame | None = None
    host: pl.DataFrame | None = None
    gpu: pl.DataFrame | None = None
    job: pl.DataFrame | None = None
    job_rank: pl.DataFrame | None = None
    gpu_sample: pl.DataFrame | None = None
    gpu_workload: pl.DataFrame | None = None
    metric_sample: pl.DataFrame | None = None
    collective: pl.DataFrame | None = None
    step: pl.DataFrame | None = None
    device_union: pl.DataFrame | None = None
    job_op: pl.DataFrame | None = None
    job_event: pl.DataFrame | None = None
    health_event: pl.DataFrame | None = None
    nccl_test: pl.DataFrame | None = None
    fabric_link: pl.DataFrame | None = None
    fabric_gpu_nic: pl.DataFrame | None = None
    fabric_port_sample: pl.DataFrame | None = None
    serving_replica: pl.DataFrame | None = None
    serving_bucket: pl.DataFrame | None = None
    serving_counter: pl.DataFrame | None = None
    serving_gauge: pl.DataFrame | None = None
    serving_request: pl.DataFrame | None = None
    serving_slo: pl.DataFrame | None = None
    sched_account: pl.DataFrame | None = None
    sched_partition: pl.DataFrame | None = None
    sched_node: pl.DataFrame | None = None
    sched_job: pl.DataFrame | None = None
    sched_job_node: pl.DataFrame | None = None
    sched_step: pl.DataFrame | None = None
    team_mapping: pl.DataFrame | None = None
    step_breakdown: pl.DataFrame | None = None
    gpu_energy_minute: pl.DataFrame | None = None
    job_analysis: pl.DataFrame | None = None
    finding: pl.DataFrame | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    # Frames of registered specs declared above the core's canonical set (a deployed model's predictions
    # and outcomes, fleetscope/core/monitoring_frames.py) that a format's parser produces: the store
    # knows their tables, the core need not import them. Written after the canonical frames.
    extra: tuple[tuple[FrameSpec, pl.DataFrame], ...] = ()

    def frames(self) -> Iterator[tuple[FrameSpec, pl.DataFrame]]:
        """The non-empty frames, in write order (inventory first, ``extra`` last)."""
        for name, spec in FRAMES.items():
            df = getattr(self, name)
            if df is not None and df.height:
                yield spec, df
        for spec, df in self.extra:
            if df.height:
                yield spec, df

    def rows(self) -> dict[str, int]:
        return {spec.name: df.height for spec, df in self.frames()}

    def values(self) -> int:
        """Metric values carried: non-key fields of telemetry rows (a wide GPU row of 30 fields is 30)."""
        n = 0
        if self.gpu_sample is not None and self.gpu_sample.height:
            fields = [c.name for c in GPU_FIELDS if c.name in self.gpu_sample.columns]
            if fields:
                n += int(self.gpu_sample.select(pl.sum_horizontal(pl.col(fields).is_not_null())).sum().item() or 0)
        for name in ("metric_sample", "serving_bucket", "serving_counter", "serving_gauge"):
            df = getattr(self, name)
            if df is not None:
                n += df.height
        return n

    def merge(self, other: Batch) -> Batch:
        """Concatenate another batch's frames into a new batch (diagonal: missing columns become null)."""
        out = dataclasses.replace(self, meta={**self.meta, **other.meta})
        for name in FRAMES:
            a, b = getattr(self, name), getattr(other, name)
            if a is None or b is None:
                setattr(out, name, a if b is None else b)
            else:
                setattr(out, name, pl.concat([a, b], how="diagonal_relaxed"))
        extra: dict[str, tuple[FrameSpec, pl.DataFrame]] = {}
        for spec, df in (*self.extra, *other.extra):
            extra[spec.name] = (spec, pl.concat([extra[spec.name][1], df], how="diagonal_relaxed") if spec.name in extra else df)
        out.extra = tuple(extra.values())
        return out


def findings_frame(rows: list[dict[str, Any]]) -> pl.DataFrame:
    """Finding rows (dicts with the ``finding`` columns) as a conformed frame; the empty frame for none."""
    if not rows:
        return FINDING.empty()
    return conform(FINDING, pl.DataFrame(rows, schema_overrides={"window_start": UTC_US, "window_end": UTC_US}))


def batch_to_json(batch: Batch) -> dict[str, Any]:
    """The JSON body of POST /api/v1/batches for ``batch``."""
    return {"source": batch.source, "frames": {spec.name: json.loads(df.write_json()) for spec, df in batch.frames()}}

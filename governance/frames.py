"""Governance tables, declared like the canonical frames (``fleetscope.core.frames.FrameSpec``) so the SQL
schema can be generated from them, and the pure conversions between records and frames.

Kept out of ``fleetscope/core/frames.py`` on purpose: telemetry ingest does not need to know them, and the
service layer registers them with the store when it wires governance in.

Keys are natural: an OpenLineage event posted twice, a run's edge re-sent in its COMPLETE event, a
registry entry updated, all land on the same rows.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from datetime import datetime
from typing import Any

import polars as pl

from fleetscope.core.frames import UTC_US, Col, FrameSpec, conform
from governance.fairness import FairnessPolicy, FairnessResult, PolicyOutcome
from governance.lineage import (
    ColumnEdge,
    DatasetRecord,
    DatasetRef,
    IoEdge,
    JobRef,
    LineageGraph,
    ParsedEvent,
    RunEventRecord,
    to_json,
)
from governance.registry import DatasetEntry, ModelEntry
import orjson


def _k(name: str, dtype: pl.DataType, default: Any = None, doc: str = "") -> Col:
    return Col(name, dtype, key=True, nullable=False, default=default, doc=doc)


def _f(name: str, dtype: pl.DataType = pl.String, doc: str = "") -> Col:
    return Col(name, dtype, doc=doc)


def _r(name: str, dtype: pl.DataType, doc: str = "") -> Col:
    return Col(name, dtype, nullable=False, doc=doc)


LINEAGE_EVENT = FrameSpec(
    "lineage_event",
    (
        _k("event_id", pl.String, doc="sha256 of the event JSON with sorted keys"),
        _r("kind", pl.String, doc="RunEvent, DatasetEvent or JobEvent"),
        _r("event_time", UTC_US),
        _f("run_id"),
        _f("job_namespace"),
        _f("job_name"),
        _r("payload", pl.String, doc="the event as received (JSON): the audit trail, and what rebuilds the other tables"),
    ),
    doc="Every accepted OpenLineage event, verbatim.",
)

LINEAGE_RUN_EVENT = FrameSpec(
    "lineage_run_event",
    (
        _k("run_id", pl.String, doc="OpenLineage runId, lower case"),
        _k("event_time", UTC_US),
        _k("event_type", pl.String, doc="START, RUNNING, COMPLETE, ABORT, FAIL, OTHER"),
        _r("job_namespace", pl.String),
        _r("job_name", pl.String),
        _f("parent_run_id"),
        _f("parent_job_namespace"),
        _f("parent_job_name"),
        _f("nominal_start_time", UTC_US),
        _f("nominal_end_time", UTC_US),
        _f("fleet_job_id", doc="from the fleetscope_job run facet: joins job.job_id"),
        _f("model_name", doc="from the fleetscope_model run facet"),
        _f("model_version"),
        _f("facets", doc="run facets (JSON object), unknown ones included"),
    ),
    doc="One state change of one lineage run.",
)

LINEAGE_JOB = FrameSpec(
    "lineage_job",
    (_k("job_namespace", pl.String), _k("job_name", pl.String), _f("updated_at", UTC_US), _f("facets")),
    on_conflict="update",
    doc="Jobs seen in lineage events (the newest facets win).",
)

LINEAGE_DATASET = FrameSpec(
    "lineage_dataset",
    (
        _k("dataset_namespace", pl.String),
        _k("dataset_name", pl.String),
        _f("updated_at", UTC_US),
        _f("fields", doc="schema facet fields (JSON array)"),
        _f("facets"),
    ),
    on_conflict="update",
    doc="Datasets seen in lineage events (the newest facets win).",
)

LINEAGE_IO = FrameSpec(
    "lineage_io",
    (
        _k("run_id", pl.String, default="", doc='"" for static lineage from a JobEvent'),
        _k("job_namespace", pl.String),
        _k("job_name", pl.String),
        _k("direction", pl.String, doc="input or output"),
        _k("dataset_namespace", pl.String),
        _k("dataset_name", pl.String),
        _k("event_time", UTC_US, doc="kept per event: the lineage timing rule needs the earliest write"),
        _f("facets", doc="inputFacets / outputFacets (JSON object)"),
    ),
    doc="A dataset read or written by a run, as each event reported it.",
)

LINEAGE_COLUMN = FrameSpec(
    "lineage_column",
    (
        _k("run_id", pl.String, default=""),
        _k("output_namespace", pl.String),
        _k("output_name", pl.String),
        _k("output_field", pl.String, default="", doc='"" for a dependency of the whole dataset'),
        _k("input_namespace", pl.String),
        _k("input_name", pl.String),
        _k("input_field", pl.String),
        _k("transformation_type", pl.String, default="", doc="DIRECT, INDIRECT or \"\""),
        _k("transformation_subtype", pl.String, default=""),
        _f("masking", pl.Boolean),
        _f("event_time", UTC_US),
    ),
    doc="Column lineage from the columnLineage dataset facet.",
)

DATASET_REGISTRY = FrameSpec(
    "dataset_registry",
    (
        _k("dataset_namespace", pl.String),
        _k("dataset_name", pl.String),
        _f("license"),
        _r("contains_personal_data", pl.Boolean),
        _r("special_category_data", pl.Boolean),
        _f("legal_basis", doc="GDPR Art. 6(1): consent, contract, legal_obligation, vital_interests, public_task, legitimate_interests"),
        _f("art9_condition", doc="GDPR Art. 9(2): art9_2_a .. art9_2_j"),
        _f("consent_reference"),
        _f("provenance"),
        _r("quarantined", pl.Boolean),
        _f("quarantine_reason"),
        _f("updated_at", UTC_US, doc="set by the service (pure code has no clock)"),
    ),
    on_conflict="update",
    doc="Governance attributes of a dataset.",
)

MODEL = FrameSpec(
    "model",
    (
        _k("model_name", pl.String),
        _k("model_version", pl.String),
        _f("intended_purpose"),
        _r("role", pl.String, doc="provider, deployer or provider_and_deployer (AI Act Art. 3(3), 3(4))"),
        _f("updated_at", UTC_US),
    ),
    on_conflict="update",
    doc="A model version in the registry.",
)

MODEL_TRAINING_RUN = FrameSpec(
    "model_training_run",
    (_k("model_name", pl.String), _k("model_version", pl.String), _k("run_id", pl.String)),
    doc="Registry link from a model version to a lineage run that trained it (facet links are read from lineage_run_event).",
)

FAIRNESS_EVALUATION = FrameSpec(
    "fairness_evaluation",
    (
        _k("evaluation_id", pl.String, doc="sha256 of model, result and policy: re-posting the same upload is one evaluation"),
        _r("model_name", pl.String),
        _r("model_version", pl.String),
        _f("evaluated_at", UTC_US, doc="set by the service"),
        _r("n_rows", pl.Int64),
        _r("min_group_size", pl.Int64),
        _f("passed", pl.Boolean, doc="null: nothing could be judged"),
        _f("policy", doc="JSON"),
        _f("result", doc="JSON: FairnessResult.to_dict() (aggregates only)"),
        _f("outcome", doc="JSON: PolicyOutcome.to_dict() (checks, conflicts, notes)"),
    ),
    doc="One fairness evaluation of one model version.",
)

FAIRNESS_GROUP = FrameSpec(
    "fairness_group",
    (
        _k("evaluation_id", pl.String),
        _k("feature", pl.String, doc='a sensitive column, or columns joined by "&" for an intersection'),
        _k("group_value", pl.String),
        _r("count", pl.Int64),
        _r("tp", pl.Int64),
        _r("fp", pl.Int64),
        _r("tn", pl.Int64),
        _r("fn", pl.Int64),
        _r("judged", pl.Boolean),
        _f("selection_rate", pl.Float64),
        _f("tpr", pl.Float64),
        _f("fpr", pl.Float64),
        _f("fnr", pl.Float64),
        _f("accuracy", pl.Float64),
        _f("ppv", pl.Float64),
        _f("base_rate", pl.Float64),
        _f("auc", pl.Float64),
    ),
    doc="Per-group confusion counts and rates of an evaluation (no rows of the upload are stored).",
)

GOVERNANCE_FRAMES: dict[str, FrameSpec] = {
    s.name: s
    for s in (
        LINEAGE_EVENT, LINEAGE_RUN_EVENT, LINEAGE_JOB, LINEAGE_DATASET, LINEAGE_IO, LINEAGE_COLUMN,
        DATASET_REGISTRY, MODEL, MODEL_TRAINING_RUN, FAIRNESS_EVALUATION, FAIRNESS_GROUP,
    )
}


def _frame(spec: FrameSpec, rows: list[dict[str, Any]]) -> pl.DataFrame:
    if not rows:
        return spec.empty()
    data = {c.name: pl.Series(c.name, [r.get(c.name) for r in rows], dtype=c.dtype) for c in spec.columns}
    return conform(spec, pl.DataFrame(data))


def lineage_frames(events: Iterable[ParsedEvent]) -> dict[str, pl.DataFrame]:
    """The rows one batch of parsed events adds, per lineage table, in canonical shape."""
    ev, runs, jobs, dss, io, cols = [], [], [], [], [], []
    for e in events:
        r0 = e.runs[0] if e.runs else None
        j0 = e.jobs[0].job if e.jobs else None
        ev.append({"event_id": e.event_id, "kind": e.kind, "event_time": e.event_time, "run_id": r0.run_id if r0 else None,
                   "job_namespace": j0.namespace if j0 else None, "job_name": j0.name if j0 else None, "payload": to_json(e.raw)})
        for r in e.runs:
            runs.append({
                "run_id": r.run_id, "event_time": r.event_time, "event_type": r.event_type,
                "job_namespace": r.job.namespace, "job_name": r.job.name, "parent_run_id": r.parent_run_id,
                "parent_job_namespace": r.parent_job.namespace if r.parent_job else None,
                "parent_job_name": r.parent_job.name if r.parent_job else None,
                "nominal_start_time": r.nominal_start_time, "nominal_end_time": r.nominal_end_time,
                "fleet_job_id": r.fleet_job_id, "model_name": r.model_name, "model_version": r.model_version,
                "facets": to_json(r.facets),
            })
        for j in e.jobs:
            jobs.append({"job_namespace": j.job.namespace, "job_name": j.job.name, "updated_at": j.event_time, "facets": to_json(j.facets)})
        for d in e.datasets:
            dss.append({"dataset_namespace": d.dataset.namespace, "dataset_name": d.dataset.name, "updated_at": d.event_time,
                        "fields": to_json(d.fields), "facets": to_json(d.facets)})
        for x in e.io:
            io.append({"run_id": x.run_id, "job_namespace": x.job.namespace, "job_name": x.job.name, "direction": x.direction,
                       "dataset_namespace": x.dataset.namespace, "dataset_name": x.dataset.name, "event_time": x.event_time,
                       "facets": to_json(x.facets)})
        for c in e.columns:
            cols.append({"run_id": c.run_id, "output_namespace": c.output.namespace, "output_name": c.output.name,
                         "output_field": c.output_field, "input_namespace": c.input.namespace, "input_name": c.input.name,
                         "input_field": c.input_field, "transformation_type": c.transformation_type,
                         "transformation_subtype": c.transformation_subtype, "masking": c.masking, "event_time": c.event_time})
    # The newest facets of a job or dataset win (on_conflict="update" keeps the last row of a key).
    jobs.sort(key=lambda r: r["updated_at"])
    dss.sort(key=lambda r: r["updated_at"])
    return {
        "lineage_event": _frame(LINEAGE_EVENT, ev),
        "lineage_run_event": _frame(LINEAGE_RUN_EVENT, runs),
        "lineage_job": _frame(LINEAGE_JOB, jobs),
        "lineage_dataset": _frame(LINEAGE_DATASET, dss),
        "lineage_io": _frame(LINEAGE_IO, io),
        "lineage_column": _frame(LINEAGE_COLUMN, cols),
    }


def _opt(v: Any) -> Any:
    return v if v not in ("",) else None


def graph_from_frames(run_event: pl.DataFrame, lineage_io: pl.DataFrame, lineage_dataset: pl.DataFrame | None = None) -> LineageGraph:
    """A ``LineageGraph`` from stored rows (what the API builds for each query)."""

    runs = [
        RunEventRecord(
            run_id=r["run_id"], event_type=r["event_type"], event_time=r["event_time"], job=JobRef(r["job_namespace"], r["job_name"]),
            parent_run_id=r["parent_run_id"],
            parent_job=JobRef(r["parent_job_namespace"], r["parent_job_name"]) if r["parent_job_namespace"] and r["parent_job_name"] else None,
            nominal_start_time=r["nominal_start_time"], nominal_end_time=r["nominal_end_time"], fleet_job_id=r["fleet_job_id"],
            model_name=r["model_name"], model_version=r["model_version"],
        )
        for r in run_event.iter_rows(named=True)
    ]
    io = [
        IoEdge(r["run_id"], JobRef(r["job_namespace"], r["job_name"]), r["direction"], DatasetRef(r["dataset_namespace"], r["dataset_name"]), r["event_time"])
        for r in lineage_io.iter_rows(named=True)
    ]
    dss = []
    if lineage_dataset is not None:
        for r in lineage_dataset.iter_rows(named=True):
            fields = orjson.loads(r["fields"]) if r["fields"] else []
            dss.append(DatasetRecord(DatasetRef(r["dataset_namespace"], r["dataset_name"]), r["updated_at"], {"schema": {"fields": fields}}))
    return LineageGraph(io, runs, dss)


def columns_from_frame(lineage_column: pl.DataFrame) -> list[ColumnEdge]:
    return [
        ColumnEdge(r["run_id"], DatasetRef(r["output_namespace"], r["output_name"]), r["output_field"],
                   DatasetRef(r["input_namespace"], r["input_name"]), r["input_field"], _opt(r["transformation_type"]),
                   _opt(r["transformation_subtype"]), r["masking"], r["event_time"])
        for r in lineage_column.iter_rows(named=True)
    ]


def registry_frames(datasets: Iterable[DatasetEntry] = (), models: Iterable[ModelEntry] = (), now: datetime | None = None) -> dict[str, pl.DataFrame]:
    ds_rows = [{"dataset_namespace": d.namespace, "dataset_name": d.name, "license": d.license,
                "contains_personal_data": d.contains_personal_data, "special_category_data": d.special_category_data,
                "legal_basis": d.legal_basis, "art9_condition": d.art9_condition, "consent_reference": d.consent_reference,
                "provenance": d.provenance, "quarantined": d.quarantined, "quarantine_reason": d.quarantine_reason, "updated_at": now}
               for d in datasets]
    models = list(models)
    m_rows = [{"model_name": m.name, "model_version": m.version, "intended_purpose": m.intended_purpose, "role": m.role, "updated_at": now} for m in models]
    l_rows = [{"model_name": m.name, "model_version": m.version, "run_id": r.lower()} for m in models for r in m.training_run_ids]
    return {"dataset_registry": _frame(DATASET_REGISTRY, ds_rows), "model": _frame(MODEL, m_rows), "model_training_run": _frame(MODEL_TRAINING_RUN, l_rows)}


def registry_from_frames(dataset_registry: pl.DataFrame, model: pl.DataFrame, model_training_run: pl.DataFrame) -> tuple[list[DatasetEntry], list[ModelEntry]]:
    ds = [DatasetEntry(r["dataset_namespace"], r["dataset_name"], r["license"], r["contains_personal_data"], r["special_category_data"],
                       r["legal_basis"], r["art9_condition"], r["consent_reference"], r["provenance"], r["quarantined"], r["quarantine_reason"])
          for r in dataset_registry.iter_rows(named=True)]
    runs: dict[tuple[str, str], list[str]] = {}
    for r in model_training_run.iter_rows(named=True):
        runs.setdefault((r["model_name"], r["model_version"]), []).append(r["run_id"])
    ms = [ModelEntry(r["model_name"], r["model_version"], r["intended_purpose"] or "", r["role"],
                     tuple(sorted(runs.get((r["model_name"], r["model_version"]), []))))
          for r in model.iter_rows(named=True)]
    return ds, ms


def fairness_frames(model: ModelEntry, result: FairnessResult, policy: FairnessPolicy, outcome: PolicyOutcome,
                    now: datetime | None = None) -> dict[str, pl.DataFrame]:
    """Rows of one evaluation: aggregates and confusion counts only."""
    result_json, policy_json = to_json(result.to_dict()), to_json(policy.to_dict())
    eid = hashlib.sha256("\n".join((model.name, model.version, result_json, policy_json)).encode()).hexdigest()
    ev = [{"evaluation_id": eid, "model_name": model.name, "model_version": model.version, "evaluated_at": now, "n_rows": result.n,
           "min_group_size": result.min_group_size, "passed": outcome.passed, "policy": policy_json, "result": result_json,
           "outcome": to_json(outcome.to_dict())}]
    groups = [{"evaluation_id": eid, **{("group_value" if k == "group" else k): v for k, v in row.items()}} for row in result.group_rows()]
    return {"fairness_evaluation": _frame(FAIRNESS_EVALUATION, ev), "fairness_group": _frame(FAIRNESS_GROUP, groups)}

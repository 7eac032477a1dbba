"""Governance against the store: lineage events in, the registry kept, lineage questions answered,
fairness evaluations run and recorded. The pure logic lives in ``governance/``; this module adds the
database and the clock.
"""

from __future__ import annotations

import json

import datetime as dt
from pathlib import Path
from typing import Any

import polars as pl

from fleetscope import safefiles
from fleetscope.core.errors import NotFound
from fleetscope.services import auditlog
from fleetscope.store import Store
from governance import fairness
from governance import frames as GF
from governance import lineage as L
from governance import lineage_events
from governance.registry import DatasetEntry, ModelEntry
from fleetscope.core import frames as F
from fleetscope.store.reads import fetch


def _write(store: Store, frames: dict[str, pl.DataFrame], source: str) -> dict[str, int]:
    specs = [(GF.GOVERNANCE_FRAMES[name], df) for name, df in frames.items()]
    return store.write_frames(specs, source=source).written


def record_lineage(store: Store, body: bytes, *, content_encoding: str | None = None, source: str = "api:/api/v1/lineage") -> L.ParsedEvent:
    """Validate and store one OpenLineage event; re-sending it stores nothing new (event id = its hash)."""
    parsed = lineage_events.parse_body(body, content_encoding=content_encoding)
    _write(store, GF.lineage_frames([parsed]), source)
    return parsed


def graph(store: Store) -> L.LineageGraph:
    return GF.graph_from_frames(store.read("lineage_run_event"), store.read("lineage_io"), store.read("lineage_dataset"))


def registry(store: Store) -> tuple[list[DatasetEntry], list[ModelEntry]]:
    return GF.registry_from_frames(store.read("dataset_registry"), store.read("model"), store.read("model_training_run"))


def _log(store: Store, actor: str, action: str, subject: str, payload: dict[str, Any]) -> None:
    auditlog.log(store, actor=actor, action=action, subject=subject, payload=payload)


def put_dataset(store: Store, entry: DatasetEntry, *, actor: str) -> dict[str, int]:
    """Create or update a dataset's registry entry, logged with ``actor`` (the API token's name, the OS user)."""
    written = _write(store, GF.registry_frames(datasets=[entry], now=dt.datetime.now(dt.UTC)), "registry")
    _log(store, actor, "registry_dataset", entry.node_id, {k: v for k, v in entry.__dict__.items()})
    return written


def put_model(store: Store, entry: ModelEntry, *, actor: str) -> dict[str, int]:
    """Register a model version, logged with ``actor``."""
    written = _write(store, GF.registry_frames(models=[entry], now=dt.datetime.now(dt.UTC)), "registry")
    _log(store, actor, "registry_model", entry.node_id, {"intended_purpose": entry.intended_purpose, "role": entry.role,
                                                          "training_run_ids": list(entry.training_run_ids)})
    return written


def find_model(store: Store, name: str, version: str | None = None) -> ModelEntry:
    """The registered model ``name`` at ``version``, or its latest version (highest string) when none is given."""
    _, models = registry(store)
    found = [m for m in models if m.name == name and (version is None or m.version == version)]
    if not found:
        known = sorted({f"{m.name}@{m.version}" for m in models})
        raise NotFound(f"no model {name!r}{f' version {version!r}' if version else ''} in the registry" + (f" (registered: {', '.join(known[:20])})" if known else ""))
    return sorted(found, key=lambda m: m.version)[-1]


def find_dataset(store: Store, name: str, namespace: str | None = None) -> L.DatasetRef:
    """A dataset seen in lineage or the registry, by name (and namespace where names repeat)."""
    seen = store.read("lineage_dataset", columns=["dataset_namespace", "dataset_name"])
    io = store.read("lineage_io", columns=["dataset_namespace", "dataset_name"])
    reg = store.read("dataset_registry", columns=["dataset_namespace", "dataset_name"])
    refs = {(r[0], r[1]) for df in (seen, io, reg) for r in df.iter_rows()}
    match = sorted(r for r in refs if r[1] == name and (namespace is None or r[0] == namespace))
    if not match:
        # Asking about a dataset never seen is a fair question with an answer (no); keep the ref.
        if namespace is not None:
            return L.DatasetRef(namespace, name)
        raise NotFound(f"no dataset named {name!r} in lineage or the registry; give its namespace to ask anyway")
    if len(match) > 1:
        raise NotFound(f"dataset name {name!r} is in several namespaces ({', '.join(m[0] for m in match)}); give the namespace")
    return L.DatasetRef(*match[0])


def model_lineage(store: Store, name: str, version: str | None = None) -> dict[str, Any]:
    """Upstream datasets of a model with the path proving each, and what taints them."""
    model = find_model(store, name, version)
    g = graph(store)
    datasets, models = registry(store)
    taints = L.propagate(g, datasets, models)
    return {
        "model": {"name": model.name, "version": model.version, "intended_purpose": model.intended_purpose, "role": model.role,
                  "training_runs": list(model.training_run_ids)},
        "upstream": [u.to_dict() for u in L.upstream_datasets(g, model)],
        "taints": [t.to_dict() for t in taints.get(model.node_id, [])],
    }


def column_lineage(store: Store, namespace: str, name: str, column: str) -> dict[str, Any]:
    """The input columns a dataset's column is computed from, transitively, from OpenLineage's
    ColumnLineageDatasetFacet where events carried it."""
    edges = GF.columns_from_frame(store.read("lineage_column"))
    found = L.column_upstream(edges, L.DatasetRef(namespace, name), column)
    return {"dataset": f"dataset:{namespace}:{name}", "column": column,
            "upstream": [{"dataset": d.node_id, "column": c, "path": list(p)} for d, c, p in found]}


def model_ingested(store: Store, name: str, dataset: str, *, namespace: str | None = None, version: str | None = None) -> dict[str, Any]:
    model = find_model(store, name, version)
    return L.did_ingest(graph(store), model, find_dataset(store, dataset, namespace)).to_dict()


def evaluate_fairness(
    store: Store,
    name: str,
    data: bytes,
    *,
    sensitive: list[str],
    version: str | None = None,
    fmt: str | None = None,
    y_true: str = "y_true",
    y_pred: str = "y_pred",
    y_score: str | None = None,
    positive_label: Any = None,
    min_group_size: int = 30,
    policy: fairness.FairnessPolicy | None = None,
    actor: str,
    keep_upload_dir: Path | None = None,
) -> dict[str, Any]:
    """Evaluate an uploaded prediction table for a registered model and record the aggregates.

    Privacy by design: only per-group aggregates and confusion counts are stored; the uploaded rows are
    dropped when this returns (the caller keeps the upload only if the user asked).
    """
    model = find_model(store, name, version)
    frame = fairness.read_predictions(data, fmt)
    kept = None
    if keep_upload_dir is not None:
        # Names come from the registry, which takes any text: checked before anything is evaluated or written.
        stamp = f"{dt.datetime.now(dt.UTC):%Y%m%dT%H%M%SZ}"
        try:
            kept = safefiles.contained(keep_upload_dir, f"{model.name}@{model.version}-{stamp}.{fmt or 'csv'}", what="kept upload (model name@version)")
        except safefiles.UnsafePathError as exc:
            raise fairness.FairnessInputError(f"keep_upload: {exc}") from None
    result = fairness.evaluate(frame, y_true=y_true, y_pred=y_pred, sensitive=sensitive, y_score=y_score,
                               positive_label=positive_label, min_group_size=min_group_size)
    policy = policy or fairness.FairnessPolicy()
    outcome = fairness.judge(result, policy)
    frames = GF.fairness_frames(model, result, policy, outcome, now=dt.datetime.now(dt.UTC))
    if kept is not None:
        # Kept only when the user asked: by default the rows are dropped once the aggregates are computed.
        kept = _keep(kept, data)
    try:
        _write(store, frames, f"fairness:{model.name}@{model.version}")
    except BaseException:
        if kept is not None:
            kept.unlink(missing_ok=True)
        raise
    eid = frames["fairness_evaluation"]["evaluation_id"][0]
    _log(store, actor, "fairness_evaluation", model.node_id, {"evaluation_id": eid, "passed": outcome.passed, "n": result.n})
    return {"evaluation_id": frames["fairness_evaluation"]["evaluation_id"][0], "model": model.name, "version": model.version,
            "passed": outcome.passed, "result": result.to_dict(), "outcome": outcome.to_dict(), "upload_kept_at": str(kept) if kept else None}


def _keep(path: Path, data: bytes) -> Path:
    """Write a kept upload without replacing an earlier one of the same second (``-2``, ``-3``, ... appended)."""
    candidate = path
    for n in range(2, 1000):
        try:
            return safefiles.write_private(candidate, data, exclusive=True)
        except FileExistsError:
            candidate = path.with_name(f"{path.stem}-{n}{path.suffix}")
    raise FileExistsError(f"{path}: too many kept uploads of this model in one second")


def fairness_evaluations(store: Store, name: str) -> list[dict[str, Any]]:
    ev = store.read("fairness_evaluation").filter(pl.col("model_name") == name).sort("evaluated_at", descending=True)
    return [{"evaluation_id": r["evaluation_id"], "version": r["model_version"], "evaluated_at": r["evaluated_at"].isoformat() if r["evaluated_at"] else None,
             "n_rows": r["n_rows"], "passed": r["passed"], "outcome": json.loads(r["outcome"])} for r in ev.iter_rows(named=True)]


# --- reads (the dashboard's, the API's and the CLI's) ---------------------------------------


UTC = F.UTC_US


def models(store: Store) -> pl.DataFrame:
    """The model registry: ``model_name, model_version, intended_purpose, role, updated_at``."""
    cols = ("model_name", "model_version", "intended_purpose", "role", "updated_at")
    return fetch(store, f"SELECT {', '.join(cols)} FROM model ORDER BY model_name, model_version", [],
                  {"model_name": pl.String, "model_version": pl.String, "intended_purpose": pl.String, "role": pl.String, "updated_at": UTC})


_FAIRNESS_METRICS = ("selection_rate", "tpr", "fpr", "fnr", "accuracy", "ppv")

def fairness_groups(store: Store) -> pl.DataFrame:
    """Each model's latest fairness evaluation, one row per sensitive feature, group and metric, with the
    evaluation's bootstrap confidence interval: ``model, evaluated_at, passed, feature, group, count,
    metric, value, ci_low, ci_high, confidence``."""
    ev = fetch(
        store,
        "SELECT model_name || ':' || model_version AS model, evaluated_at, passed, result FROM fairness_evaluation ORDER BY evaluated_at DESC",
        [],
        {"model": pl.String, "evaluated_at": UTC, "passed": pl.Boolean, "result": pl.String},
    ).unique("model", keep="first", maintain_order=True)
    schema = {"model": pl.String, "evaluated_at": UTC, "passed": pl.Boolean, "feature": pl.String, "group": pl.String, "count": pl.Int64,
              "metric": pl.String, "value": pl.Float64, "ci_low": pl.Float64, "ci_high": pl.Float64, "confidence": pl.Float64}
    rows = []
    for e in ev.iter_rows(named=True):
        try:
            result = json.loads(e["result"] or "{}")
        except ValueError:
            continue
        for feat in result.get("features") or []:
            for g in feat.get("groups") or []:
                for metric in _FAIRNESS_METRICS:
                    ci = (g.get("ci") or {}).get(metric) or [None, None]
                    rows.append({"model": e["model"], "evaluated_at": e["evaluated_at"], "passed": e["passed"], "feature": feat.get("feature"),
                                 "group": str(g.get("group")), "count": g.get("count"), "metric": metric, "value": g.get(metric),
                                 "ci_low": ci[0], "ci_high": ci[1], "confidence": result.get("confidence")})
    return pl.DataFrame(rows, schema=schema)


def registered_model_lineage(store: Store, model_name: str, model_version: str) -> dict[str, Any] | None:
    """A registered model's upstream datasets with the path proving each, and what taints them
    (fleetscope.services.governance.model_lineage, as ``GET /api/v1/models/{name}/lineage``); None for a
    model not in the registry."""
    try:
        return model_lineage(store, model_name, model_version)
    except NotFound:
        return None

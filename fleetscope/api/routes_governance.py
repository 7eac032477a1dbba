"""Governance API: OpenLineage intake (Marquez-compatible), the dataset and model registry, lineage
questions, fairness evaluations and post-market monitoring. Scope ``governance`` throughout; writes are audit-logged with the
token's name."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
from typing import Annotated, Any, get_type_hints

import polars as pl

from fastapi import APIRouter, Depends, HTTPException, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field, create_model

from fleetscope.services import auth
from fleetscope.services import governance as gs
from fleetscope.services import monitoring as ms
from fleetscope.api.jsonbody import CheckedRoute
from fleetscope.api.security import require
from governance import fairness
from governance import lineage as L
from governance import lineage_events
from governance.registry import DatasetEntry, ModelEntry

_governance = require("governance")
# The same dependency object on the router and on a route runs once per request (FastAPI caches it), so a
# route that needs the token's name gets it without a second check.
router = APIRouter(prefix="/api/v1", tags=["governance"], dependencies=[Depends(_governance)], route_class=CheckedRoute)
Gov = Annotated[auth.Token, Depends(_governance)]


def _not_found(exc: gs.NotFound) -> HTTPException:
    return HTTPException(404, str(exc))


@router.post("/lineage", status_code=201)
async def post_lineage(request: Request) -> JSONResponse:
    """Accept one OpenLineage event (RunEvent, DatasetEvent or JobEvent, spec 2-0-x), as Marquez does, so the
    OpenLineage client's HTTP transport works unchanged. 400 for a body that is not JSON, 422 naming the
    JSON Pointer of what breaks the schema; unknown facets are kept and reported in ``notes``."""
    body = await request.body()
    try:
        parsed = await run_in_threadpool(gs.record_lineage, request.app.state.store, body, content_encoding=request.headers.get("content-encoding"))
    except lineage_events.LineageError as exc:
        return JSONResponse(exc.to_dict(), 400 if exc.malformed else 422)
    return JSONResponse({"kind": parsed.kind, "event_id": parsed.event_id, "notes": list(parsed.notes)}, 201)


@router.get("/lineage")
def get_lineage(request: Request, nodeId: Annotated[str, Query(max_length=2000)], depth: Annotated[int, Query(ge=0, le=100)] = 20) -> dict[str, Any]:  # noqa: N803 - Marquez's parameter name
    """The lineage graph around ``nodeId`` (``dataset:<ns>:<name>`` or ``job:<ns>:<name>``) in Marquez's shape."""
    store = request.app.state.store
    datasets, _ = gs.registry(store)
    try:
        return gs.graph(store).marquez_graph(nodeId, depth, registry={d_ref(d): d for d in datasets})
    except L.LineageNotFound as exc:
        raise HTTPException(404, str(exc)) from None
    except lineage_events.LineageError as exc:
        raise HTTPException(400, str(exc)) from None


@router.get("/lineage/column")
def get_column_lineage(request: Request, namespace: str, name: str, column: str) -> dict[str, Any]:
    """Which input columns ``namespace:name.column`` is computed from (OpenLineage column lineage), with paths."""
    return gs.column_lineage(request.app.state.store, namespace, name, column)


def d_ref(d: DatasetEntry) -> L.DatasetRef:
    return L.DatasetRef(d.namespace, d.name)


def _body_of(entry: type, **bounded: Any) -> type[BaseModel]:
    """A registry entry's request body: the dataclass's own fields, types and defaults (one declaration, in
    ``governance.registry``), unknown keys refused; ``bounded`` gives a field the limits of its own."""
    hints = get_type_hints(entry)
    fields = {f.name: (hints[f.name], bounded.get(f.name, ... if f.default is dataclasses.MISSING else f.default))
              for f in dataclasses.fields(entry)}
    return create_model(f"{entry.__name__.removesuffix('Entry')}In", __config__=ConfigDict(extra="forbid"), **fields)


DatasetIn = _body_of(DatasetEntry, namespace=Field(min_length=1, max_length=1000), name=Field(min_length=1, max_length=1000))


class ModelIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    intended_purpose: str = Field(default="", max_length=5000)
    role: str = "provider"
    training_run_ids: list[str] = Field(default_factory=list, max_length=10_000)


@router.put("/datasets")
def put_dataset(request: Request, body: DatasetIn, token: Gov) -> dict[str, Any]:
    """Create or update a dataset's governance attributes (licence, personal / special-category data,
    legal basis, provenance, quarantine)."""
    try:
        entry = DatasetEntry(**body.model_dump())
    except ValueError as exc:
        raise HTTPException(422, str(exc)) from None
    gs.put_dataset(request.app.state.store, entry, actor=token.name)
    return {"dataset": entry.node_id, "issues": entry.issues()}


@router.get("/datasets")
def list_datasets(request: Request) -> list[dict[str, Any]]:
    datasets, _ = gs.registry(request.app.state.store)
    return [{**d.__dict__, "node_id": d.node_id, "issues": d.issues()} for d in datasets]


@router.put("/models/{name}/{version}")
def put_model(request: Request, name: str, version: str, body: ModelIn, token: Gov) -> dict[str, Any]:
    """Register a model version: intended purpose, provider/deployer role, the lineage runs that trained it."""
    try:
        entry = ModelEntry(name, version, body.intended_purpose, body.role, tuple(body.training_run_ids))
    except ValueError as exc:
        raise HTTPException(422, str(exc)) from None
    gs.put_model(request.app.state.store, entry, actor=token.name)
    return {"model": entry.node_id}


@router.get("/models")
def list_models(request: Request) -> list[dict[str, Any]]:
    _, models = gs.registry(request.app.state.store)
    return [{"name": m.name, "version": m.version, "intended_purpose": m.intended_purpose, "role": m.role, "training_runs": list(m.training_run_ids)} for m in models]


@router.get("/models/{name}/lineage")
def model_lineage(request: Request, name: str, version: str | None = None) -> dict[str, Any]:
    """Datasets upstream of the model, each with the path that proves it, and the taints that reach it."""
    try:
        return gs.model_lineage(request.app.state.store, name, version)
    except gs.NotFound as exc:
        raise _not_found(exc) from None


@router.get("/models/{name}/ingested")
def model_ingested(request: Request, name: str, dataset: str, namespace: str | None = None, version: str | None = None) -> dict[str, Any]:
    """Did the model ever ingest ``dataset`` or anything derived from it? Yes with the path, or no with every dataset searched."""
    try:
        return gs.model_ingested(request.app.state.store, name, dataset, namespace=namespace, version=version)
    except gs.NotFound as exc:
        raise _not_found(exc) from None


@router.post("/models/{name}/fairness")
async def post_fairness(
    request: Request,
    name: str,
    token: Gov,
    sensitive: Annotated[list[str], Query(min_length=1, description="sensitive feature columns; repeat for several")],
    version: str | None = None,
    y_true: str = "y_true",
    y_pred: str = "y_pred",
    y_score: str | None = None,
    positive_label: str | None = None,
    min_group_size: Annotated[int, Query(ge=1)] = 30,
    format: Annotated[str | None, Query(pattern="^(csv|parquet)$")] = None,  # noqa: A002
    keep_upload: Annotated[bool, Query(description="keep the uploaded rows under the data directory (default: discarded)")] = False,
) -> JSONResponse:
    """Evaluate an uploaded prediction table (CSV or Parquet in the body). Only aggregates are stored."""
    body = await request.body()
    if not body:
        raise HTTPException(400, "empty body: upload the prediction table as CSV or Parquet")
    try:
        out = await run_in_threadpool(
            gs.evaluate_fairness, request.app.state.store, name, body, sensitive=sensitive, version=version, fmt=format,
            y_true=y_true, y_pred=y_pred, y_score=y_score, positive_label=positive_label, min_group_size=min_group_size, actor=token.name,
            keep_upload_dir=request.app.state.settings.data_dir / "fairness-uploads" if keep_upload else None,
        )
    except gs.NotFound as exc:
        raise _not_found(exc) from None
    except fairness.FairnessInputError as exc:
        raise HTTPException(422, str(exc)) from None
    return JSONResponse(json.loads(json.dumps(out, default=str)))


@router.get("/models/{name}/fairness")
def get_fairness(request: Request, name: str) -> list[dict[str, Any]]:
    return gs.fairness_evaluations(request.app.state.store, name)


# --- post-market monitoring (AI Act Art. 72) ----------------------------------------------------------
# Predictions and outcomes come in through the ingest door (POST /api/v1/ingest/model_monitoring); these
# routes evaluate them into windows and read the windows, drift, fairness over time and findings back.

_When = Annotated[dt.datetime | None, Query(description="RFC 3339 with a zone")]


def _frame(df: pl.DataFrame) -> Response:
    return Response(df.write_json(), media_type="application/json")


@router.get("/monitoring/models")
def monitoring_models(request: Request) -> Response:
    """Model versions with stored predictions: counts of predictions and outcomes, first and last prediction."""
    return _frame(ms.monitored(request.app.state.store))


@router.post("/models/{name}/{version}/monitoring/evaluate")
async def monitoring_evaluate(
    request: Request, name: str, version: str,
    window_s: Annotated[int, Query(ge=60, le=7 * 86400)] = ms.DEFAULT_WINDOW_S,
    reference_s: Annotated[int, Query(ge=60, le=366 * 86400)] = ms.DEFAULT_REFERENCE_S,
    reference_start: _When = None, reference_end: _When = None, start: _When = None, end: _When = None,
) -> JSONResponse:
    """Evaluate the version's closed windows against its reference window and store windows and findings
    (what beat does hourly). ``reference_start``/``reference_end`` name the reference; by default the first
    ``reference_s`` seconds of its predictions."""
    if (reference_start is None) != (reference_end is None):
        raise HTTPException(400, "give both reference_start and reference_end, or neither")
    for t in (reference_start, reference_end, start, end):
        if t is not None and t.tzinfo is None:
            raise HTTPException(400, "times need a zone (RFC 3339, e.g. 2026-11-02T00:00:00Z)")
    ref = (reference_start, reference_end) if reference_start is not None and reference_end is not None else None
    out = await run_in_threadpool(ms.evaluate, request.app.state.store, name, version, window_s=window_s, reference=ref,
                                  reference_s=reference_s, start=start, end=end)
    return JSONResponse(json.loads(json.dumps(out, default=str)))


@router.get("/models/{name}/{version}/monitoring/windows")
def monitoring_windows(request: Request, name: str, version: str, start: _When = None, end: _When = None,
                       limit: Annotated[int, Query(ge=1, le=100_000)] = 2000) -> Response:
    """Evaluated windows, oldest first: counts, accuracy and error rates, PSI and KS maxima, fairness gap, status."""
    return _frame(ms.windows(request.app.state.store, name, version, start=start, end=end, limit=limit))


@router.get("/models/{name}/{version}/monitoring/windows/{window_start}")
def monitoring_window(request: Request, name: str, version: str, window_start: dt.datetime) -> JSONResponse:
    """One window in full: drift per feature, rates per group with their intervals, its findings."""
    return JSONResponse(ms.window_detail(request.app.state.store, name, version, window_start))


@router.get("/models/{name}/{version}/monitoring/drift")
def monitoring_drift(request: Request, name: str, version: str, start: _When = None, end: _When = None) -> Response:
    """Per window and feature: PSI (reference deciles), KS statistic and p-value, and whether it counted as drift."""
    return _frame(ms.drift_over_time(request.app.state.store, name, version, start=start, end=end))


@router.get("/models/{name}/{version}/monitoring/fairness")
def monitoring_fairness(request: Request, name: str, version: str, start: _When = None, end: _When = None) -> Response:
    """Per window, attribute and group: selection rate, TPR, FPR and accuracy with bootstrap intervals (group
    ``*``: the watched disparity)."""
    return _frame(ms.fairness_over_time(request.app.state.store, name, version, start=start, end=end))


@router.get("/models/{name}/{version}/monitoring/findings")
def monitoring_findings(request: Request, name: str, version: str, include_cleared: bool = False) -> Response:
    return _frame(ms.findings(request.app.state.store, name, version, include_cleared=include_cleared))


@router.get("/models/{name}/{version}/monitoring/impossibility")
def monitoring_impossibility(request: Request, name: str, version: str, attribute: Annotated[str, Query(min_length=1, max_length=128)],
                             start: _When = None, end: _When = None,
                             tolerance: Annotated[float, Query(gt=0, lt=1)] = 0.05) -> JSONResponse:
    """Which of calibration, equalized odds and demographic parity hold on the version's predictions with
    outcomes, and the base rates per group that force the trade-off."""
    try:
        out = ms.impossibility(request.app.state.store, name, version, attribute, start=start, end=end, tolerance=tolerance)
    except fairness.FairnessInputError as exc:
        raise HTTPException(422, str(exc)) from None
    return JSONResponse(json.loads(json.dumps(out, default=str)))

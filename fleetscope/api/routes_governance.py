"""Governance API: OpenLineage intake (Marquez-compatible), the dataset and model registry, lineage
questions, and fairness evaluations. Scope ``governance`` throughout; writes are audit-logged with the
token's name."""

from __future__ import annotations

import json
from typing import Annotated, Any

from fastapi import APIRouter, Depends, HTTPException, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from fleetscope.services import auth
from fleetscope.services import governance as gs
from fleetscope.api.jsonbody import CheckedRoute
from fleetscope.api.security import require
from governance import fairness
from governance import lineage as L
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
    except L.LineageError as exc:
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
    except L.LineageError as exc:
        raise HTTPException(400, str(exc)) from None


@router.get("/lineage/column")
def get_column_lineage(request: Request, namespace: str, name: str, column: str) -> dict[str, Any]:
    """Which input columns ``namespace:name.column`` is computed from (OpenLineage column lineage), with paths."""
    return gs.column_lineage(request.app.state.store, namespace, name, column)


def d_ref(d: DatasetEntry) -> L.DatasetRef:
    return L.DatasetRef(d.namespace, d.name)


class DatasetIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    namespace: str = Field(min_length=1, max_length=1000)
    name: str = Field(min_length=1, max_length=1000)
    license: str | None = None
    contains_personal_data: bool = False
    special_category_data: bool = False
    legal_basis: str | None = None
    art9_condition: str | None = None
    consent_reference: str | None = None
    provenance: str | None = None
    quarantined: bool = False
    quarantine_reason: str | None = None


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

"""EU AI Act: declarations, audit runs, reports, signed exports and the audit log (scope ``governance``)."""

from __future__ import annotations

import datetime as dt
from typing import Annotated, Any

import polars as pl
from fastapi import APIRouter, Depends, HTTPException, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field

from fleetscope.services import audit as au
from fleetscope.services import auth
from fleetscope.services import governance as gs
from fleetscope.api.jsonbody import CheckedRoute
from fleetscope.api.security import require
from governance.aiact import checks
from governance.aiact import model as M
from governance import exports

router = APIRouter(prefix="/api/v1", tags=["ai act"], route_class=CheckedRoute)
Gov = Annotated[auth.Token, Depends(require("governance"))]


class DeclarationIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    model: str = Field(min_length=1, max_length=500, description='model name, or "*" for the whole organisation')
    version: str = Field(default="*", max_length=200, description='"*" for every version')
    kind: str = Field(description="one of " + ", ".join(M.DECLARATION_KINDS))
    value: dict[str, Any] = Field(default_factory=dict)
    key: str = Field(default="", max_length=500)
    retracted: bool = False


@router.post("/declarations", status_code=201)
def post_declaration(request: Request, body: DeclarationIn, token: Gov) -> dict[str, Any]:
    """Record a fact only a person can state (purpose, Annex III area, oversight, documentation, incident ...),
    kept with the token's name as who entered it, and appended to the audit log."""
    try:
        d = au.declare(request.app.state.store, body.model, body.version, body.kind, body.value, entered_by=token.name, key=body.key,
                       retracted=body.retracted, source="api")
    except M.DeclarationError as exc:
        raise HTTPException(422, str(exc)) from None
    return {"declaration_id": d.declaration_id, "entered_by": d.entered_by, "entered_at": d.entered_at.isoformat()}


@router.get("/declarations")
def get_declarations(request: Request, _: Gov, model: str | None = None) -> Response:
    df = request.app.state.store.read("aiact_declaration")
    if model:
        df = df.filter(pl.col("model_name").is_in([model, "*"]))
    return Response(df.sort("entered_at").write_json(), media_type="application/json")


class IncidentIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    finding_kind: str = Field(min_length=1, max_length=100, description="the monitoring finding's kind, e.g. model_fairness")
    subject: str = Field(min_length=1, max_length=1000, description="the finding's subject, model:NAME:VERSION[/...]")
    window_start: dt.datetime = Field(description="the finding's window start")
    kind: str = Field(description="serious incident kind: one of " + ", ".join(M.INCIDENT_KINDS))
    description: str | None = Field(default=None, max_length=5000)
    aware_at: dt.datetime | None = Field(default=None, description="when the provider became aware (default: now)")


@router.post("/incidents", status_code=201)
def post_incident(request: Request, body: IncidentIn, token: Gov) -> dict[str, Any]:
    """Declare a serious incident from a post-market monitoring finding: starts the Art. 73 clock (15 days,
    Art. 73(2); 2 days for a widespread infringement or critical infrastructure, 73(3); 10 days for a death,
    73(4)) from ``aware_at``; the next audit shows the deadline."""
    for t in (body.window_start, body.aware_at):
        if t is not None and t.tzinfo is None:
            raise HTTPException(422, "times need a zone (RFC 3339)")
    try:
        d = au.declare_incident(request.app.state.store, body.finding_kind, body.subject, body.window_start, incident_kind=body.kind,
                                entered_by=token.name, description=body.description, aware_at=body.aware_at)
    except M.DeclarationError as exc:
        raise HTTPException(422, str(exc)) from None
    days = checks.incident_deadline(d.value["kind"])
    due = M.parse_time(d.value["aware_at"]) + dt.timedelta(days=days)  # type: ignore[operator]
    return {"declaration_id": d.declaration_id, "key": d.key, "model": d.model_name, "version": d.model_version, "value": dict(d.value),
            "deadline_days": days, "paragraph": checks.incident_paragraph(d.value["kind"]), "report_due_at": M.iso(due)}


@router.post("/audits", status_code=201)
async def post_audit(request: Request, token: Gov, model: str | None = None, version: str | None = None) -> dict[str, Any]:
    """Evaluate the AI Act rules now for one model or the whole registry; files JSON, HTML and PDF reports."""
    try:
        return await run_in_threadpool(au.run_audit, request.app.state.store, request.app.state.settings, model=model, version=version,
                                       trigger="api", requested_by=token.name)
    except gs.NotFound as exc:
        raise HTTPException(404, str(exc)) from None
    except au.AuditError as exc:
        raise HTTPException(409, str(exc)) from None


@router.get("/audits")
def get_audits(request: Request, _: Gov) -> list[dict[str, Any]]:
    return au.list_audits(request.app.state.store)


@router.get("/audits/{audit_id}/results")
def get_results(request: Request, audit_id: str, _: Gov) -> Response:
    df = request.app.state.store.read("aiact_rule_result").filter(pl.col("audit_id") == audit_id)
    if df.height == 0:
        raise HTTPException(404, f"no audit {audit_id[:100]!r}")
    return Response(df.write_json(), media_type="application/json")


@router.get("/audits/{audit_id}/report.{fmt}")
def get_report(request: Request, audit_id: str, fmt: str, _: Gov) -> Response:
    if fmt not in ("json", "html", "pdf"):
        raise HTTPException(404, "report formats: json, html, pdf")
    try:
        data, media = au.report_file(request.app.state.store, request.app.state.settings, audit_id, fmt)
    except au.AuditError as exc:
        raise HTTPException(404, str(exc)) from None
    return Response(data, media_type=media, headers={"Content-Disposition": f'inline; filename="fleetscope-audit-{audit_id}.{fmt}"'})


@router.post("/exports", status_code=201)
async def post_export(request: Request, token: Gov, audit_id: str | None = None) -> dict[str, Any]:
    """A signed compliance bundle of an audit (default: the latest): reports, evidence, SHA-256 manifest, Ed25519 signature."""
    try:
        out = await run_in_threadpool(au.make_export, request.app.state.store, request.app.state.settings, audit_id=audit_id, requested_by=token.name)
    except au.AuditError as exc:
        raise HTTPException(404, str(exc)) from None
    out.pop("path", None)
    out.pop("public_key", None)
    return out


@router.get("/exports/{export_id}")
def get_export(request: Request, export_id: str, _: Gov) -> Response:
    try:
        data, name = au.export_file(request.app.state.store, request.app.state.settings, export_id)
    except au.AuditError as exc:
        raise HTTPException(404, str(exc)) from None
    return Response(data, media_type="application/zip", headers={"Content-Disposition": f'attachment; filename="{name}"'})


@router.get("/signing-key")
def get_signing_key(request: Request, _: Gov) -> Response:
    """The public half of the export signing key (PEM), for auditors to verify bundles offline."""

    key = au.signing_key(request.app.state.settings)
    return Response(exports.public_pem(key.public_key()), media_type="application/x-pem-file")


@router.get("/auditlog/verify")
def verify_auditlog(request: Request, _: Gov) -> dict[str, Any]:
    """Check the audit log under its key and against its signed checkpoints; ``first_break`` names the
    first bad entry (seq and why), ``ok`` is true only when nothing is wrong."""
    return au.verify_log(request.app.state.store)

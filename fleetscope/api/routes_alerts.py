"""Alerting over HTTP: alerts (read), rules CRUD (admin), silences (admin to change), receivers (admin),
the outbox and its dead letters (read; admin to retry). Rule, silence and receiver changes are
audit-logged with the token's name (``fleetscope.services.alerting.service``).

Include with ``app.include_router(routes_alerts.router)``. Silences take and return Alertmanager API v2's
shapes (``matchers`` with name/value/isRegex/isEqual, ``startsAt``/``endsAt``, ``createdBy``, ``comment``)
so tools that speak to Alertmanager's silences read them too.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import threading
from typing import Annotated, Any

import polars as pl
from fastapi import APIRouter, Depends, FastAPI, HTTPException, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse

from fleetscope.services import auth
from fleetscope.services.alerting import state as ST
from fleetscope.services.alerting.kick import needs_evaluation
from fleetscope.worker import celery_kicker
from fleetscope.services.alerting.notifiers import DeliveryError
from fleetscope.services.alerting.rules import RuleError
from fleetscope.services.alerting import service as AS
from fleetscope.services.alerting.service import Alerting, open_alerting
from fleetscope.api import jsonbody
from fleetscope.api.security import require

router = APIRouter(prefix="/api/v1/alerts", tags=["alerts"])
log = logging.getLogger(__name__)


def _ctx(request: Request) -> Alerting:
    return _app_ctx(request.app)


def _app_ctx(app: FastAPI) -> Alerting:
    ctx = getattr(app.state, "alerting", None)
    if ctx is None:
        ctx = app.state.alerting = open_alerting(app.state.settings)
    return ctx


_kicker_lock = threading.Lock()


def kick_evaluation(app: FastAPI, health_event: pl.DataFrame | None) -> None:
    """The ingest routes' background task once a batch with health events is committed and answered: ask
    the worker for an evaluation now if a rule reads them (``fleetscope.services.alerting.kick``). Never raises: the
    batch is accepted already, and beat's next tick evaluates anyway."""
    try:
        if health_event is None or health_event.height == 0:
            return
        if not needs_evaluation(_app_ctx(app).effective_config(app.state.store.engine), health_event):
            return
        with _kicker_lock:
            kicker = getattr(app.state, "alert_kicker", None)
            if kicker is None:
                kicker = app.state.alert_kicker = celery_kicker(app.state.settings)
        kicker.kick()
    except Exception:  # noqa: BLE001 - e.g. the broker is down
        log.warning("could not ask for an alert evaluation; beat's next tick will evaluate", exc_info=True)


def warm(app: FastAPI) -> None:
    """Make this process's alert kicker (its broker transport imported) before the first push with a health
    event needs it, so that push's hook does not hold the GIL while the agents wait. Never raises: a broker
    that is not right yet is the first kick's to report."""
    try:
        with _kicker_lock:
            if getattr(app.state, "alert_kicker", None) is None:
                app.state.alert_kicker = celery_kicker(app.state.settings)
    except Exception:  # noqa: BLE001 - the first kick tries again and logs
        log.warning("could not prepare alert kicks ahead of the first health event", exc_info=True)


def _engine(request: Request):  # type: ignore[no-untyped-def]
    return request.app.state.store.engine


def _json(value: Any, status: int = 200) -> JSONResponse:
    return JSONResponse(json.loads(json.dumps(value, default=lambda o: o.isoformat() if isinstance(o, dt.datetime) else str(o))), status)


async def _body(request: Request) -> dict[str, Any]:
    doc = jsonbody.loads(await request.body(), jsonbody.max_depth(request))
    if not isinstance(doc, dict):
        raise HTTPException(400, "expected a JSON object")
    return doc


def _rule_error(exc: RuleError) -> JSONResponse:
    return JSONResponse({"detail": str(exc), "rule": exc.rule, "field": exc.field}, 422)


# --- alerts ---------------------------------------------------------------------------------------------


@router.get("", dependencies=[Depends(require("read"))])
def list_alerts(request: Request, include_resolved: bool = False, state: Annotated[str | None, Query(pattern="^(pending|firing|inactive)$")] = None) -> JSONResponse:
    """Alerts the rules hold (pending and firing; resolved too with ``include_resolved``), each with the
    silences and inhibition muting it."""
    ctx = _ctx(request)
    config = ST.effective_config(_engine(request), ctx.base)
    alerts = ST.list_alerts(_engine(request), config, include_resolved=include_resolved or state == "inactive")
    if state:
        alerts = [a for a in alerts if a["state"] == state]
    return _json(alerts)


# --- rules ----------------------------------------------------------------------------------------------


@router.get("/rules", dependencies=[Depends(require("read"))])
def list_rules(request: Request) -> JSONResponse:
    ctx = _ctx(request)
    overrides = ST.rule_overrides(_engine(request))
    config = ctx.base.with_rules(overrides)
    return _json([{"name": r.name, "source": "api" if r.name in overrides else "file", "enabled": r.enabled, "spec": dict(r.spec)} for r in config.rules])


@router.put("/rules/{name}")
async def put_rule(request: Request, name: str, token: auth.Token = Depends(require("admin"))) -> JSONResponse:
    """Create or replace a rule (its YAML document as JSON); 422 names the rule and the field."""
    doc = await _body(request)
    given = doc.get("alert", doc.get("name"))
    if given is not None and given != name:
        raise HTTPException(422, f"the rule's name {given!r} differs from the path's {name!r}")
    doc.setdefault("alert", name)
    try:
        rule = await run_in_threadpool(AS.put_rule, request.app.state.store, doc, actor=token.name)
    except RuleError as exc:
        return _rule_error(exc)
    return _json({"name": rule.name, "source": "api", "spec": dict(rule.spec)})


@router.delete("/rules/{name}", status_code=204)
def delete_rule(request: Request, name: str, token: auth.Token = Depends(require("admin"))) -> None:
    AS.delete_rule(request.app.state.store, name, actor=token.name)


# --- silences -------------------------------------------------------------------------------------------


def _time(doc: dict[str, Any], key: str) -> dt.datetime | None:
    raw = doc.get(key)
    if raw is None:
        return None
    try:
        t = dt.datetime.fromisoformat(str(raw).replace("Z", "+00:00"))
    except ValueError:
        raise HTTPException(422, f"{key}: {raw!r} is not an RFC 3339 time") from None
    if t.tzinfo is None:
        raise HTTPException(422, f"{key}: give a time zone (e.g. Z)")
    return t


@router.get("/silences", dependencies=[Depends(require("read"))])
def list_silences(request: Request) -> JSONResponse:
    now = dt.datetime.now(dt.UTC)
    return _json([ST.silence_dict(s, now) for s in ST.list_silences(_engine(request), now=now)])


@router.post("/silences", status_code=201)
async def create_silence(request: Request, token: auth.Token = Depends(require("admin"))) -> JSONResponse:
    """``{"matchers": [...], "startsAt"?, "endsAt", "createdBy"?, "comment"}``; matchers as API v2 objects or
    text (``host=~"n1.*"``). Returns ``{"silenceID"}``. ``createdBy`` is the token's name: a value in the
    body is ignored (Alertmanager clients such as amtool always send one), so nobody silences in
    another's name."""
    doc = await _body(request)
    starts, ends = _time(doc, "startsAt"), _time(doc, "endsAt")
    if ends is None:
        raise HTTPException(422, "endsAt is required")
    try:
        sil = await run_in_threadpool(lambda: AS.create_silence(request.app.state.store, doc.get("matchers") or [], starts, ends,
                                                                created_by=token.name, comment=str(doc.get("comment") or ""), actor=token.name))
    except ValueError as exc:
        raise HTTPException(422, str(exc)) from None
    return _json({"silenceID": sil.id}, 201)


@router.delete("/silences/{silence_id}", status_code=204)
def expire_silence(request: Request, silence_id: str, token: auth.Token = Depends(require("admin"))) -> None:
    if not AS.expire_silence(request.app.state.store, silence_id, actor=token.name):
        raise HTTPException(404, f"no active or pending silence {silence_id!r}")


# --- receivers ------------------------------------------------------------------------------------------


@router.get("/receivers", dependencies=[Depends(require("admin"))])
def list_receivers(request: Request) -> JSONResponse:
    """Receivers, never with their URL path or secrets."""
    return _json(ST.receiver_info(_engine(request)))


@router.put("/receivers/{name}")
async def put_receiver(request: Request, name: str, token: auth.Token = Depends(require("admin"))) -> JSONResponse:
    """``{"kind": "webhook|alertmanager|slack|standard", "url": "...", "secrets"?: ["whsec_..."], "options"?: {...}}``.
    The URL is refused (422) if it points at a metadata, link-local or (unless allowed) private address."""
    doc = await _body(request)
    ctx = _ctx(request)
    secrets = doc.get("secrets")
    if secrets is not None and (not isinstance(secrets, list) or not all(isinstance(s, str) for s in secrets)):
        raise HTTPException(422, "secrets must be a list of whsec_ strings")
    try:
        info = await run_in_threadpool(lambda: AS.put_receiver(
            request.app.state.store, ctx, name, str(doc.get("kind", "")), str(doc.get("url", "")), actor=token.name, secrets=secrets,
            options=doc.get("options") or {}))
    except DeliveryError as exc:
        raise HTTPException(422, exc.message) from None
    except ValueError as exc:
        raise HTTPException(422, str(exc)) from None
    return _json(info)


@router.delete("/receivers/{name}", status_code=204)
def delete_receiver(request: Request, name: str, token: auth.Token = Depends(require("admin"))) -> None:
    if not AS.delete_receiver(request.app.state.store, name, actor=token.name):
        raise HTTPException(404, f"no receiver {name!r}")


# --- the outbox -----------------------------------------------------------------------------------------


@router.get("/notifications", dependencies=[Depends(require("read"))])
def list_notifications(request: Request, status: Annotated[str | None, Query(pattern="^(pending|delivered|dead|disabled)$")] = None,
                       limit: Annotated[int, Query(ge=1, le=1000)] = 100) -> JSONResponse:
    """Notifications, newest first; ``status=dead`` lists the dead letters."""
    return _json(ST.list_notifications(_engine(request), status=status, limit=limit))


@router.get("/notifications/{notification_id}/attempts", dependencies=[Depends(require("read"))])
def list_attempts(request: Request, notification_id: int) -> JSONResponse:
    return _json(ST.list_attempts(_engine(request), notification_id))


@router.post("/notifications/{notification_id}/retry", dependencies=[Depends(require("admin"))])
def retry(request: Request, notification_id: int) -> JSONResponse:
    """Send a dead or disabled notification again, with its original webhook-id."""
    if not ST.requeue(_engine(request), notification_id):
        raise HTTPException(409, "only a dead or disabled notification can be retried")
    return _json({"notification_id": notification_id, "status": "pending"})

"""Token management over HTTP (scope ``admin``): create a token, optionally bound to a site, host or
source; list tokens (never their secrets); revoke one."""

from __future__ import annotations

import datetime as dt
from typing import Any

from fastapi import APIRouter, Depends, HTTPException, Request
from fastapi.concurrency import run_in_threadpool
from pydantic import BaseModel, ConfigDict, Field

from fleetscope.services import auth
from fleetscope.api.jsonbody import CheckedRoute
from fleetscope.api.security import require

router = APIRouter(prefix="/api/v1/tokens", tags=["tokens"], route_class=CheckedRoute, dependencies=[Depends(require("admin"))])


class TokenIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1, max_length=200, description="what the token is for")
    scopes: list[str] = Field(min_length=1, max_length=len(auth.SCOPES), description="some of " + ", ".join(auth.SCOPES))
    expires_days: int | None = Field(default=None, ge=1, le=3650)
    site: str | None = Field(default=None, max_length=auth.BINDING_MAX_CHARS["site"], description="bind: rows naming a site must name this one")
    host: str | None = Field(default=None, max_length=auth.BINDING_MAX_CHARS["host"], description="bind: rows naming a host must name this one")
    source: str | None = Field(default=None, max_length=auth.BINDING_MAX_CHARS["source"], description="bind: pushes must claim this source")


def _row(r: dict[str, Any]) -> dict[str, Any]:
    return {k: (v.isoformat() if isinstance(v, dt.datetime) else v) for k, v in r.items()}


@router.post("", status_code=201)
async def create(request: Request, body: TokenIn) -> dict[str, Any]:
    """Create a token; its secret is in this answer only. 422 names a bad scope or binding."""
    expires = dt.datetime.now(dt.UTC) + dt.timedelta(days=body.expires_days) if body.expires_days else None
    binding = auth.Binding(body.site, body.host, body.source)
    try:
        secret = await run_in_threadpool(auth.create_token, request.app.state.store.engine, body.name, body.scopes, expires_at=expires, binding=binding)
    except ValueError as exc:
        raise HTTPException(422, str(exc)) from None
    bound = auth.check_binding(binding)
    return {"token": secret, "name": body.name, "scopes": sorted(set(body.scopes)), "expires_at": expires.isoformat() if expires else None,
            "binding": {"site": bound.site, "host": bound.host, "source": bound.source} if bound else None}


@router.get("")
def list_tokens(request: Request) -> list[dict[str, Any]]:
    return [_row(r) for r in auth.list_tokens(request.app.state.store.engine)]


@router.delete("/{token_id}", status_code=204)
def revoke(request: Request, token_id: int) -> None:
    if not auth.revoke_token(request.app.state.store.engine, token_id):
        raise HTTPException(404, f"no active token with id {token_id}")

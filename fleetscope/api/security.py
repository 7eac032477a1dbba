"""Bearer-token authentication with scopes, as a FastAPI dependency."""

from __future__ import annotations

from fastapi import Depends, HTTPException, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from fleetscope.services import auth
from fleetscope.api.gate import TOKEN_KEY

_bearer = HTTPBearer(auto_error=False)


def require(scope: str):  # type: ignore[no-untyped-def]
    """A dependency that admits a request only with a valid token holding ``scope`` (or ``admin``).

    401 when the token is missing or unknown (with ``WWW-Authenticate: Bearer`` as RFC 6750 asks),
    403 when it is valid but lacks the scope. In the app the check is made by ``api.gate`` before the body
    is read, from the scope declared here (``required_scope``); the dependency then hands the route the
    token the gate verified, and checks on its own only where a router is served without the gate.
    """

    async def check(request: Request, creds: HTTPAuthorizationCredentials | None = Depends(_bearer)) -> auth.Token:
        token = request.scope.get(TOKEN_KEY)
        if token is None:
            if creds is None or creds.scheme.lower() != "bearer":
                raise HTTPException(401, "missing bearer token", headers={"WWW-Authenticate": "Bearer"})
            hit, token = auth.cached(creds.credentials)
            if not hit:
                token = await run_in_threadpool(auth.verify, request.app.state.store.engine, creds.credentials)
            if token is None:
                raise HTTPException(401, "invalid, expired or revoked token", headers={"WWW-Authenticate": 'Bearer error="invalid_token"'})
        if not token.allows(scope):
            raise HTTPException(403, f"token {token.name!r} lacks the {scope!r} scope", headers={"WWW-Authenticate": f'Bearer error="insufficient_scope", scope="{scope}"'})
        return token

    check.required_scope = scope  # type: ignore[attr-defined]
    return check

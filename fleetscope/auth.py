"""API tokens: bearer secrets with scopes, stored only as SHA-256 hashes.

A token is shown once, when created; the database keeps its hash, so a leaked database does not leak
working tokens. Scopes: ``ingest`` (write telemetry), ``read`` (query), ``governance`` (lineage,
fairness, audit), ``admin`` (everything, plus token and rule management).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import secrets
import threading
import time
from dataclasses import dataclass

from sqlalchemy import Engine, select, update

from fleetscope import schema

SCOPES = ("ingest", "read", "governance", "admin")
PREFIX = "fs_"
_CACHE_TTL_S = 10.0


@dataclass(frozen=True)
class Token:
    token_id: int
    name: str
    scopes: frozenset[str]

    def allows(self, scope: str) -> bool:
        return "admin" in self.scopes or scope in self.scopes


def _hash(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def create_token(engine: Engine, name: str, scopes: list[str] | tuple[str, ...], *, expires_at: dt.datetime | None = None) -> str:
    """Create a token and return its secret (the only time it is visible)."""
    bad = [s for s in scopes if s not in SCOPES]
    if bad or not scopes:
        raise ValueError(f"unknown scope {bad[0]!r}: expected some of {', '.join(SCOPES)}" if bad else "a token needs at least one scope")
    secret = PREFIX + secrets.token_urlsafe(32)
    with engine.begin() as conn:
        conn.execute(
            schema.api_token.insert().values(
                name=name,
                token_sha256=_hash(secret),
                scopes=" ".join(sorted(set(scopes))),
                created_at=dt.datetime.now(dt.UTC),
                expires_at=expires_at,
            )
        )
    return secret


def list_tokens(engine: Engine) -> list[dict]:
    t = schema.api_token
    with engine.connect() as conn:
        rows = conn.execute(select(t.c.token_id, t.c.name, t.c.scopes, t.c.created_at, t.c.expires_at, t.c.revoked_at).order_by(t.c.token_id))
        return [dict(r._mapping) for r in rows]


def revoke_token(engine: Engine, token_id: int) -> bool:
    with engine.begin() as conn:
        res = conn.execute(
            update(schema.api_token)
            .where(schema.api_token.c.token_id == token_id, schema.api_token.c.revoked_at.is_(None))
            .values(revoked_at=dt.datetime.now(dt.UTC))
        )
    _cache.clear()
    return res.rowcount > 0


class _Cache:
    """Verified tokens for a few seconds, so a busy ingest endpoint does not query the database per request.
    A revocation takes effect within ``_CACHE_TTL_S`` in other processes, at once in this one."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._items: dict[str, tuple[float, Token | None]] = {}

    def get(self, key: str) -> tuple[bool, Token | None]:
        with self._lock:
            hit = self._items.get(key)
            if hit and hit[0] > time.monotonic():
                return True, hit[1]
            return False, None

    def put(self, key: str, token: Token | None) -> None:
        with self._lock:
            if len(self._items) > 10_000:
                self._items.clear()
            self._items[key] = (time.monotonic() + _CACHE_TTL_S, token)

    def clear(self) -> None:
        with self._lock:
            self._items.clear()


_cache = _Cache()


def cached(secret: str) -> tuple[bool, Token | None]:
    """(True, the token or None) where ``secret`` was verified within the cache's lifetime, else (False, None)."""
    if not secret.startswith(PREFIX) or len(secret) > 200:
        return True, None
    return _cache.get(_hash(secret))


def verify(engine: Engine, secret: str) -> Token | None:
    """The token for ``secret`` if it exists, is not revoked and has not expired."""
    if not secret.startswith(PREFIX) or len(secret) > 200:
        return None
    digest = _hash(secret)
    hit, token = _cache.get(digest)
    if hit:
        return token
    t = schema.api_token
    now = dt.datetime.now(dt.UTC)
    with engine.begin() as conn:
        row = conn.execute(select(t.c.token_id, t.c.name, t.c.scopes, t.c.expires_at, t.c.revoked_at).where(t.c.token_sha256 == digest)).first()
        token = None
        if row is not None and row.revoked_at is None and (row.expires_at is None or row.expires_at > now):
            token = Token(row.token_id, row.name, frozenset(row.scopes.split()))
            conn.execute(update(t).where(t.c.token_id == row.token_id).values(last_used_at=now))
    _cache.put(digest, token)
    return token

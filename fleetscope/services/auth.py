"""API tokens: bearer secrets with scopes, stored only as SHA-256 hashes, optionally bound to a site,
a host or a source.

A token is shown once, when created; the database keeps its hash, so a leaked database does not leak
working tokens. Scopes (least privilege: a token holds the fewest it needs):

- ``ingest``: push raw telemetry (``RAW_FRAMES``: samples, events, collectives, steps, inventory);
- ``read``: query;
- ``governance``: lineage, registry, fairness, AI Act declarations and audits;
- ``admin``: everything, plus derived frames (findings, analyses, roll-ups, site declarations), tokens,
  rules, receivers and instruments.

A binding narrows what a token may push: rows naming a site or host must name the bound one, and a push
must claim the bound source (``Binding``). It is checked on the push itself, not against stored
inventory, so that a fleet's pushes cost no extra query.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import logging
import secrets
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass

from sqlalchemy import Engine, select, text, update
from sqlalchemy.exc import OperationalError

from fleetscope.core import frames as F
from fleetscope.core.textinput import has_control
from fleetscope.door.screen import Binding  # noqa: F401  (a token carries one; the door's screen enforces it)
from fleetscope.store import schema

log = logging.getLogger(__name__)

SCOPES = ("ingest", "read", "governance", "admin")
PREFIX = "fs_"
MAX_SECRET_CHARS = 200
_CACHE_TTL_S = 10.0
# Verified tokens remembered at once; a fleet has a few hundred tokens at most, so this is never the
# bound a real deployment meets. Unknown secrets are remembered apart (``_Cache``).
CACHE_MAX_TOKENS = 10_000
CACHE_MAX_UNKNOWN = 4_096

# What an ingest token may write: telemetry as observed, and the inventory collectors report. Everything
# else in ``frames.FRAMES`` is derived by the service itself (findings, per-job analyses, energy roll-ups)
# or declared by an operator (sites with their PUE), and written through /batches only with ``admin``.
# A frame added to FRAMES is admin-only until it is listed here.
RAW_FRAMES = frozenset({
    "host", "gpu", "job", "job_rank",
    "gpu_sample", "gpu_workload", "metric_sample", "collective", "step", "device_union", "job_op", "job_event", "health_event", "nccl_test",
    "fabric_port_sample", "fabric_link", "fabric_gpu_nic",
    "serving_replica", "serving_bucket", "serving_counter", "serving_gauge", "serving_request",
})
DERIVED_FRAMES = frozenset(F.FRAMES) - RAW_FRAMES

BINDING_MAX_CHARS = {"site": 200, "host": 500, "source": 2000}


@dataclass(frozen=True)
class Token:
    token_id: int
    name: str
    scopes: frozenset[str]
    binding: Binding | None = None

    def allows(self, scope: str) -> bool:
        return "admin" in self.scopes or scope in self.scopes

    def may_write(self, frame: str) -> bool:
        """Whether this token may write ``frame`` through /batches: raw frames with ``ingest``, any with ``admin``."""
        return "admin" in self.scopes or ("ingest" in self.scopes and frame in RAW_FRAMES)


def _hash(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def check_binding(binding: Binding | None) -> Binding | None:
    """``binding`` with empty fields dropped; ValueError naming a field that is too long or not text."""
    if binding is None:
        return None
    out = {}
    for name, limit in BINDING_MAX_CHARS.items():
        value = getattr(binding, name)
        if value is None or value == "":
            continue
        if not isinstance(value, str) or len(value) > limit or has_control(value):
            raise ValueError(f"binding {name} must be text of at most {limit} characters without control characters")
        out[name] = value
    return Binding(**out) if out else None


def create_token(engine: Engine, name: str, scopes: list[str] | tuple[str, ...], *, expires_at: dt.datetime | None = None,
                 binding: Binding | None = None) -> str:
    """Create a token and return its secret (the only time it is visible)."""
    bad = [s for s in scopes if s not in SCOPES]
    if bad or not scopes:
        raise ValueError(f"unknown scope {bad[0]!r}: expected some of {', '.join(SCOPES)}" if bad else "a token needs at least one scope")
    binding = check_binding(binding)
    secret = PREFIX + secrets.token_urlsafe(32)
    with engine.begin() as conn:
        conn.execute(
            schema.api_token.insert().values(
                name=name,
                token_sha256=_hash(secret),
                scopes=" ".join(sorted(set(scopes))),
                created_at=dt.datetime.now(dt.UTC),
                expires_at=expires_at,
                bound_site=binding.site if binding else None,
                bound_host=binding.host if binding else None,
                bound_source=binding.source if binding else None,
            )
        )
    return secret


def list_tokens(engine: Engine) -> list[dict]:
    t = schema.api_token
    with engine.connect() as conn:
        rows = conn.execute(select(t.c.token_id, t.c.name, t.c.scopes, t.c.created_at, t.c.expires_at, t.c.revoked_at,
                                   t.c.bound_site, t.c.bound_host, t.c.bound_source).order_by(t.c.token_id))
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
    A revocation takes effect within ``_CACHE_TTL_S`` in other processes, at once in this one.

    Two bounded LRU maps: tokens found, and secrets found to be no token. They are apart so that a flood
    of made-up secrets can only push other made-up secrets out, never a working token (whose eviction
    would send every push of a fleet to the database).
    """

    def __init__(self, max_tokens: int = CACHE_MAX_TOKENS, max_unknown: int = CACHE_MAX_UNKNOWN) -> None:
        self._lock = threading.Lock()
        self._known: OrderedDict[str, tuple[float, Token]] = OrderedDict()
        self._unknown: OrderedDict[str, float] = OrderedDict()
        self.max_tokens = max_tokens
        self.max_unknown = max_unknown

    def get(self, key: str) -> tuple[bool, Token | None]:
        now = time.monotonic()
        with self._lock:
            hit = self._known.get(key)
            if hit is not None:
                if hit[0] > now:
                    self._known.move_to_end(key)
                    return True, hit[1]
                del self._known[key]
            until = self._unknown.get(key)
            if until is not None:
                if until > now:
                    return True, None
                del self._unknown[key]
            return False, None

    def put(self, key: str, token: Token | None) -> None:
        until = time.monotonic() + _CACHE_TTL_S
        with self._lock:
            table: OrderedDict = self._known if token is not None else self._unknown
            table[key] = (until, token) if token is not None else until
            table.move_to_end(key)
            while len(table) > (self.max_tokens if token is not None else self.max_unknown):
                table.popitem(last=False)

    def sizes(self) -> tuple[int, int]:
        """(tokens, unknown secrets) held."""
        with self._lock:
            return len(self._known), len(self._unknown)

    def clear(self) -> None:
        with self._lock:
            self._known.clear()
            self._unknown.clear()


_cache = _Cache()


def _plausible(secret: str) -> bool:
    return secret.startswith(PREFIX) and len(secret) <= MAX_SECRET_CHARS


def cached(secret: str) -> tuple[bool, Token | None]:
    """(True, the token or None) where ``secret`` was verified within the cache's lifetime, else (False, None)."""
    if not _plausible(secret):
        return True, None
    return _cache.get(_hash(secret))


def verify(engine: Engine, secret: str) -> Token | None:
    """The token for ``secret`` if it exists, is not revoked and has not expired."""
    if not _plausible(secret):
        return None
    digest = _hash(secret)
    hit, token = _cache.get(digest)
    if hit:
        return token
    t = schema.api_token
    now = dt.datetime.now(dt.UTC)
    with engine.connect() as conn:
        row = conn.execute(select(t.c.token_id, t.c.name, t.c.scopes, t.c.expires_at, t.c.revoked_at, t.c.bound_site, t.c.bound_host,
                                  t.c.bound_source, t.c.last_used_at).where(t.c.token_sha256 == digest)).first()
    token = None
    if row is not None and row.revoked_at is None and (row.expires_at is None or row.expires_at > now):
        binding = Binding(row.bound_site, row.bound_host, row.bound_source)
        token = Token(row.token_id, row.name, frozenset(row.scopes.split()), binding if binding else None)
        if row.last_used_at is None or now - _utc(row.last_used_at) >= LAST_USED_EVERY:
            _mark_used(engine, row.token_id, now)
    _cache.put(digest, token)
    return token


LAST_USED_EVERY = dt.timedelta(minutes=1)
"""How stale a token's ``last_used_at`` may be: rewritten at most this often, not on every cache miss."""


def _utc(t: dt.datetime) -> dt.datetime:
    return t if t.tzinfo is not None else t.replace(tzinfo=dt.UTC)


def _mark_used(engine: Engine, token_id: int, now: dt.datetime) -> None:
    """Record that a token was used, if the database takes the write at once. A request is not made to wait for
    it: while SQLite's one writer holds the file (a large ingest), the update would wait out the busy timeout
    (30 s) before the request was even authenticated; the next use after the writer is done records it."""
    t = schema.api_token
    try:
        with engine.connect() as conn:
            if engine.dialect.name == "sqlite":
                raw = conn.connection.driver_connection
                waited = raw.execute("PRAGMA busy_timeout").fetchone()[0]
                raw.execute("PRAGMA busy_timeout = 0")
                try:
                    conn.execute(update(t).where(t.c.token_id == token_id).values(last_used_at=now))
                    conn.commit()
                finally:
                    conn.rollback()
                    raw.execute(f"PRAGMA busy_timeout = {int(waited)}")
            else:
                conn.execute(text("SET LOCAL lock_timeout = '100ms'"))
                conn.execute(update(t).where(t.c.token_id == token_id).values(last_used_at=now))
                conn.commit()
    except OperationalError:
        log.debug("token %s used; last_used_at not written (database busy)", token_id)

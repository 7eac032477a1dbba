"""Who is signed in to the dashboard and what they may do: the rules, with no Streamlit and no database.

A signed-in user holds the scopes of the API (``fleetscope.services.auth.SCOPES``) and the dashboard applies them
as the API does (``fleetscope.api.security.require``): ``admin`` allows everything. With a Fleetscope API
token the scopes are the token's; with single sign-on (OpenID Connect through Streamlit's ``st.login``)
they come from a configured mapping of e-mail addresses, e-mail domains and groups to scopes
(``FLEETSCOPE_DASHBOARD_OIDC_SCOPES``). ``dashboard/signin.py`` draws the sign-in; this module decides.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from fleetscope.services.auth import SCOPES

# What each page of the dashboard needs, as its API twin does (fleetscope/api/routes_*.py): fleet pages
# read what `read` routes serve; the Governance page reads models, lineage, fairness, audits and exports,
# all under `governance`.
PAGE_SCOPES: dict[str, str] = {
    "overview": "read",
    "health_sdc": "read",
    "reliability": "read",
    "network": "read",
    "energy_carbon": "read",
    "teams_cost": "read",
    "jobs": "read",
    "stragglers": "read",
    "serving": "read",
    "alerts": "read",
    "governance": "governance",
    "service": "read",
}
# Page actions and the scope of the API route that does the same (routes_alerts.create_silence and
# expire_silence: admin; routes_audit.post_export and post_incident: governance).
ACTION_SCOPES: dict[str, str] = {
    "create_silence": "admin",
    "expire_silence": "admin",
    "make_export": "governance",
    "declare_incident": "governance",
}

# Where the gate (dashboard/signin.py) leaves the signed-in user's Access for the pages (dashboard/ui.py).
SESSION_KEY = "_fs_access"

# A failed sign-in locks the session's form for 2^(n-1) seconds after the n-th failure in a row, up to this.
MAX_LOCK_S = 300.0


@dataclass(frozen=True)
class Access:
    """A signed-in user: ``name`` is the actor the dashboard's writes are recorded under (the token's name,
    or the identity provider's e-mail address), ``via`` is ``token`` or ``oidc``."""

    name: str
    scopes: frozenset[str]
    via: str

    def allows(self, scope: str) -> bool:
        return "admin" in self.scopes or scope in self.scopes

    def may_see(self, page: str) -> bool:
        return self.allows(PAGE_SCOPES[page])

    def may(self, action: str) -> bool:
        return self.allows(ACTION_SCOPES[action])

    def holding(self) -> str:
        """Who this is and what they hold, as a user reads it: ``ana has read, governance``."""
        return f"{self.name} has {', '.join(sorted(self.scopes)) or 'no scope'}"

    def why_not(self, scope: str) -> str:
        """What a user is told where a page or control needs a scope they lack."""
        return f"This needs the {scope} scope; {self.holding()}."


# --- single sign-on: who gets which scopes -----------------------------------------------------------


class MappingError(ValueError):
    """FLEETSCOPE_DASHBOARD_OIDC_SCOPES does not parse; the message names the entry and what is wrong."""


@dataclass(frozen=True)
class Rule:
    """One entry of the mapping: ``kind`` is ``email`` (one address), ``domain`` (``*@example.org``: every
    address of the domain) or ``group`` (``group:sre``: members of the group the provider names)."""

    kind: str
    value: str
    scopes: frozenset[str] = field(default_factory=frozenset)


def parse_mapping(spec: str) -> tuple[Rule, ...]:
    """Parse ``pattern=scope[,scope...]`` entries separated by ``;``, e.g.
    ``alice@x.org=admin;*@x.org=read;group:auditors=read,governance``.

    A pattern is an e-mail address, ``*@domain`` or ``group:NAME``. There is no pattern for "anyone the
    provider signs in": a public provider (Google, GitHub) signs in the whole world. Addresses and domains
    compare case-insensitively (domains are case-insensitive by RFC 5321 §2.4; providers differ in the case
    of local parts they send, and none issues two mailboxes differing only by case); groups compare exactly.
    """
    rules: list[Rule] = []
    for i, raw in enumerate(spec.split(";"), start=1):
        entry = raw.strip()
        if not entry:
            continue
        where = f"FLEETSCOPE_DASHBOARD_OIDC_SCOPES entry {i} ({entry[:80]!r})"
        pattern, sep, scope_text = entry.partition("=")
        pattern = pattern.strip()
        if not sep or not pattern:
            raise MappingError(f"{where}: expected pattern=scope[,scope...], e.g. alice@example.org=admin")
        scopes = [s.strip() for s in scope_text.split(",") if s.strip()]
        bad = [s for s in scopes if s not in SCOPES]
        if not scopes or bad:
            raise MappingError(f"{where}: " + (f"unknown scope {bad[0]!r}" if bad else "no scope given") + f"; expected some of {', '.join(SCOPES)}")
        rules.append(Rule(*_pattern(pattern, where), frozenset(scopes)))
    return tuple(rules)


def _pattern(pattern: str, where: str) -> tuple[str, str]:
    if pattern.lower().startswith("group:"):
        group = pattern[len("group:"):].strip()
        if not group:
            raise MappingError(f"{where}: group: needs a group name")
        return "group", group
    local, at, domain = pattern.rpartition("@")
    if not at or not local or not domain or "*" in domain or ("*" in local and local != "*"):
        raise MappingError(f"{where}: a pattern is an e-mail address, *@domain or group:NAME (not {pattern[:80]!r})")
    return ("domain", domain.lower()) if local == "*" else ("email", pattern.lower())


def scopes_for(rules: Iterable[Rule], claims: Mapping[str, Any]) -> frozenset[str]:
    """The scopes of a user the identity provider signed in, from its ID token's claims: the union of every
    rule that matches. The e-mail counts only if the provider does not say it is unverified
    (``email_verified``, OpenID Connect Core 1.0 §5.1); groups are read from the ``groups`` claim."""
    email = _email(claims)
    domain = email.rpartition("@")[2] if email and "@" in email else None
    raw_groups = claims.get("groups")
    groups = {raw_groups} if isinstance(raw_groups, str) else {g for g in raw_groups or () if isinstance(g, str)}
    held: set[str] = set()
    for rule in rules:
        if (rule.kind == "email" and rule.value == email) or (rule.kind == "domain" and rule.value == domain) or (rule.kind == "group" and rule.value in groups):
            held |= rule.scopes
    return frozenset(held)


def oidc_access(rules: Iterable[Rule], claims: Mapping[str, Any]) -> Access | None:
    """The access of a user signed in by the identity provider, or None where it sent no usable e-mail
    address to record their actions under."""
    email = _email(claims)
    return None if email is None else Access(email, scopes_for(rules, claims), "oidc")


def _email(claims: Mapping[str, Any]) -> str | None:
    """The claims' e-mail address in lower case, or None where there is none or the provider says it is not
    verified (some providers send the boolean as the string "false")."""
    email, verified = claims.get("email"), claims.get("email_verified", True)
    if not isinstance(email, str) or "@" not in email or verified is False or str(verified).lower() == "false":
        return None
    return email.strip().lower()


# --- failed sign-ins ---------------------------------------------------------------------------------


@dataclass
class Backoff:
    """Failed token sign-ins of one session: after the n-th failure in a row the form refuses every try
    for 2^(n-1) seconds (capped at ``MAX_LOCK_S``) without checking it, so guessing costs time. ``now_s``
    is a monotonic clock reading the caller passes in."""

    failures: int = 0
    locked_until_s: float = 0.0

    def wait_s(self, now_s: float) -> float:
        """Seconds until the next try is checked (0: now)."""
        return max(0.0, self.locked_until_s - now_s)

    def failed(self, now_s: float) -> None:
        self.failures += 1
        self.locked_until_s = now_s + min(MAX_LOCK_S, 2.0 ** (self.failures - 1))

    def succeeded(self) -> None:
        self.failures = 0
        self.locked_until_s = 0.0

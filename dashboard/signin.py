"""The dashboard's sign-in: nothing of the fleet is drawn until a user has signed in, and what they see and
do then follows their scopes (``dashboard.access``).

By default a user signs in with a Fleetscope API token, checked with ``fleetscope.services.auth.verify`` against the
store on every script run, so a revoked or expired token stops working within the auth cache's few
seconds. The secret is kept in the session's server-side state only: never in the URL, never in a cookie.
A reload starts a new session, which signs in again. With ``FLEETSCOPE_DASHBOARD_AUTH=oidc`` Streamlit's
own OpenID Connect sign-in (``st.login``, configured by ``[auth]`` in ``.streamlit/secrets.toml``) says who
the user is, in a signed HttpOnly cookie, and ``FLEETSCOPE_DASHBOARD_OIDC_SCOPES`` says what they may do.
"""

from __future__ import annotations

import math
import sqlite3
import time
from typing import Any

import streamlit as st
from sqlalchemy.exc import SQLAlchemyError

from dashboard import connection as ui
from dashboard.access import SESSION_KEY, Access, Backoff, MappingError, oidc_access, parse_mapping
from fleetscope.services import auth
from fleetscope import settings as settings_mod
from fleetscope.settings import Settings

# Session-state keys. TOKEN_KEY holds the signed-in token's secret; tests sign a session in by setting it.
TOKEN_KEY = "_fs_token"
BACKOFF_KEY = "_fs_backoff"
SECRET_INPUT_KEY = "signin_secret"
NOTICE_KEY = "signin_result"

FAILED = "Sign-in failed: that is not a valid token."
UNCHECKED = "The sign-in could not be checked: the database did not answer. Try again in a moment."
USABLE = ("read", "governance", "admin")


def resolve(settings: Settings) -> Access | None:
    """Who is signed in to this session now (None: nobody), drawing nothing. Raises SQLAlchemyError or
    sqlite3.Error where the store does not answer, MappingError where the OIDC mapping does not parse,
    LookupError where OIDC is chosen but Streamlit has no ``[auth]`` section."""
    if settings.dashboard_auth == "oidc":
        rules = parse_mapping(settings.dashboard_oidc_scopes)
        claims = st.user.to_dict()
        if "is_logged_in" not in claims:
            raise LookupError("FLEETSCOPE_DASHBOARD_AUTH=oidc, but Streamlit has no `[auth]` section in .streamlit/secrets.toml: "
                              "configure the identity provider there (README, Security).")
        return oidc_access(rules, claims) if claims["is_logged_in"] else None
    secret = st.session_state.get(TOKEN_KEY)
    if not secret:
        return None
    token = auth.verify(ui.store().engine, secret)
    return None if token is None else Access(token.name, token.scopes, "token")


def acting(action: str) -> Access | None:
    """The signed-in user, checked again at the moment of a write, where they may do ``action``; else None.

    A widget's callback runs at the start of the next script run, before app.py's gate: this keeps a
    token revoked meanwhile, or a session signed out in another way, from making one more write."""
    try:
        who = resolve(settings_mod.load())
    except (SQLAlchemyError, sqlite3.Error, MappingError, LookupError):
        return None
    return who if who is not None and who.may(action) else None


def unchanged() -> bool:
    """Whether the session is still signed in as the gate last found it (same user, same scopes): what an
    auto-refreshing fragment, which reruns without the gate, checks before it draws."""
    try:
        now = resolve(settings_mod.load())
    except (SQLAlchemyError, sqlite3.Error, MappingError, LookupError):
        return False
    return now is not None and now == st.session_state.get(SESSION_KEY)


def gate(settings: Settings) -> Access | None:
    """Establish who is signed in. Returns their access; otherwise draws the sign-in (and nothing else) and
    returns None, and the caller shows no page."""
    st.session_state.pop(SESSION_KEY, None)
    try:
        found = resolve(settings)
    except (SQLAlchemyError, sqlite3.Error):
        st.error(UNCHECKED)
        return None
    except (MappingError, LookupError) as exc:
        st.error(f"Single sign-on is misconfigured: {exc}")
        return None
    if found is None:
        if settings.dashboard_auth == "oidc":
            _oidc_form()
        else:
            if TOKEN_KEY in st.session_state:
                _forget_session()
                ui.tell(NOTICE_KEY, False, "The token this session signed in with is no longer valid (revoked or expired): sign in again.")
            _token_form()
        return None
    if not any(found.allows(s) for s in USABLE):
        st.title("Fleetscope")
        ask = " Ask an administrator to add you to FLEETSCOPE_DASHBOARD_OIDC_SCOPES." if found.via == "oidc" else ""
        st.error(f"{found.holding()}: the dashboard needs read, governance or admin.{ask}")
        sign_out_button(found, st)
        return None
    st.session_state[SESSION_KEY] = found
    return found


def sign_out_button(who: Access, where: Any) -> None:
    """Who is signed in, with which scopes, and a button that signs them out, drawn in ``where`` (``st`` or
    ``st.sidebar``)."""
    where.caption(f"Signed in as **{who.name}** ({', '.join(sorted(who.scopes)) or 'no scope'})")
    if who.via == "oidc":
        if where.button("Sign out", key="signout"):
            st.session_state.clear()
            st.logout()
    else:
        where.button("Sign out", key="signout", on_click=_sign_out)


def _sign_out() -> None:
    _forget_session()
    ui.tell(NOTICE_KEY, True, "Signed out.")


def _forget_session() -> None:
    """Drop everything the session holds (the secret, filters, outcomes) but its failed sign-ins, so whoever
    signs in next starts clean and a sign-out does not reset the backoff."""
    backoff = st.session_state.get(BACKOFF_KEY)
    st.session_state.clear()
    if backoff is not None:
        st.session_state[BACKOFF_KEY] = backoff


# --- API token -------------------------------------------------------------------------------------


def _token_form() -> None:
    st.title("Sign in to Fleetscope")
    ui.told(NOTICE_KEY)
    with st.form("signin", clear_on_submit=True):
        st.text_input("API token", type="password", key=SECRET_INPUT_KEY, autocomplete="off", max_chars=200,
                      help="A Fleetscope API token (fs_...): `fleetscope token create --name NAME --scope read`. "
                           "Its scopes decide what you see: read for the fleet pages, governance for the Governance page, admin for silences.")
        st.form_submit_button("Sign in", on_click=_try_token, key="signin_submit")


def _try_token() -> None:
    secret = (st.session_state.get(SECRET_INPUT_KEY) or "").strip()
    # The field forgets what was typed whatever the outcome: the secret lives on only where it is checked.
    st.session_state[SECRET_INPUT_KEY] = ""
    backoff: Backoff = st.session_state.setdefault(BACKOFF_KEY, Backoff())
    now_s = time.monotonic()
    wait_s = backoff.wait_s(now_s)
    if wait_s > 0:
        ui.tell(NOTICE_KEY, False, f"Too many failed sign-ins: try again in {math.ceil(wait_s)} s.")
        return
    if not secret:
        ui.tell(NOTICE_KEY, False, "Paste an API token to sign in.")
        return
    try:
        token = auth.verify(ui.store().engine, secret)
    except (SQLAlchemyError, sqlite3.Error):
        ui.tell(NOTICE_KEY, False, UNCHECKED)
        return
    if token is None:
        # One answer for unknown, revoked and expired tokens alike: the form tells nothing about which exist.
        backoff.failed(now_s)
        ui.tell(NOTICE_KEY, False, FAILED)
        return
    backoff.succeeded()
    st.session_state[TOKEN_KEY] = secret


# --- OpenID Connect through st.login --------------------------------------------------------------------


def _oidc_form() -> None:
    claims = st.user.to_dict()
    if claims.get("is_logged_in"):
        # Signed in by the provider, but without a verified e-mail address to act under.
        st.title("Fleetscope")
        st.error("The identity provider sent no verified e-mail address, which the dashboard needs to record who did what.")
        if st.button("Sign out", key="signout"):
            st.session_state.clear()
            st.logout()
        return
    st.title("Sign in to Fleetscope")
    st.button("Sign in with your identity provider", key="signin_oidc", on_click=st.login)

"""The dashboard server's connection to the store, and the outcome messages widget callbacks leave.

Both the sign-in (``signin``) and the pages' helpers (``ui``) stand on this module, so neither imports
the other to reach the store.
"""

from __future__ import annotations

import streamlit as st

from fleetscope import settings as settings_mod
from fleetscope.store import Store


def database_url() -> str:
    return settings_mod.load().database_url


def read_database_url() -> str:
    """The read replica the pages' cached reads go to (FLEETSCOPE_READ_DATABASE_URL), or "" for the primary."""
    return settings_mod.load().read_database_url


@st.cache_resource(show_spinner=False)
def _store(url: str, read_url: str = "") -> Store:
    # One engine (and connection pool) per database per server process, shared by every session.
    return Store.open(url, read_url or None)


def store() -> Store:
    """The configured store (one per database per server process), for the few actions a page takes
    through a service function (a silence, an export) rather than a read, and for reads that must see
    such an action at once: both on the primary."""
    return _store(database_url(), read_database_url())


def tell(key: str, ok: bool, text: str) -> None:
    """Leave an action's outcome (from a widget callback) for the page to show once, where ``told`` is called."""
    st.session_state[key] = (ok, text)


def told(key: str) -> None:
    """Show the outcome ``tell`` left under ``key``, if any, as a success or an error."""
    outcome = st.session_state.pop(key, None)
    if outcome:
        (st.success if outcome[0] else st.error)(outcome[1])

"""Fleetscope dashboard: ``streamlit run dashboard/app.py`` (or ``fleetscope dashboard``).

This script runs on every interaction: it establishes who is signed in (``dashboard.signin``: nothing else
is drawn until someone is), checks the database, draws the common sidebar (time range, site, job, refresh)
and runs the page picked in the navigation, out of the pages the user's scopes allow. Each page lives in
``views/`` and reads through ``dashboard.ui.q``, which caches the domain services' reads (``fleetscope.services.*``).

The folder is not called ``pages/``: Streamlit treats a ``pages/`` folder beside the main script as an
app of its own pages (multipage v1) until the first run reaches ``st.navigation``, so on a fresh server a
request for ``/governance`` would run that page's script without this one, and without the sign-in.
"""

from __future__ import annotations

import sys
from pathlib import Path

# `streamlit run` puts this file's folder on sys.path, not the repository root; a source checkout that is
# not pip-installed still needs `fleetscope` and `dashboard` importable.
_ROOT = str(Path(__file__).resolve().parents[1])
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

import streamlit as st  # noqa: E402

from dashboard import access, signin, ui  # noqa: E402
from fleetscope import settings as settings_mod  # noqa: E402

st.set_page_config(page_title="Fleetscope", page_icon=":material/monitoring:", layout="wide")

# (section, page name, title, icon); the page name is its file in views/ and its key in access.PAGE_SCOPES.
PAGES = (
    ("Fleet", "overview", "Overview", ":material/dashboard:"),
    ("Fleet", "health_sdc", "Health & SDC", ":material/health_and_safety:"),
    ("Fleet", "reliability", "Reliability", ":material/restart_alt:"),
    ("Fleet", "network", "Network", ":material/lan:"),
    ("Fleet", "energy_carbon", "Energy & Carbon", ":material/bolt:"),
    ("Fleet", "teams_cost", "Teams & Cost", ":material/payments:"),
    ("Jobs", "jobs", "Jobs", ":material/model_training:"),
    ("Jobs", "stragglers", "Stragglers", ":material/slow_motion_video:"),
    ("Serving", "serving", "Serving", ":material/speed:"),
    ("Operations", "alerts", "Alerts", ":material/notifications:"),
    ("Operations", "service", "Service", ":material/manage_history:"),
    ("Operations", "governance", "Governance", ":material/gavel:"),
)


def _sign_in_page() -> None:
    """Stands in for every page until someone signs in (the gate has drawn the form already)."""


settings = settings_mod.load()
ui.check_database(signed_in=False)  # sign-in reads the token table: a schema behind says so, not "sign-in failed"
who = signin.gate(settings)
if who is None:
    # Every page's address leads to the sign-in, so a shared link (/jobs?job=...) opens its page once
    # signed in; no page, link or count is drawn before.
    st.navigation([st.Page(_sign_in_page, title="Sign in", url_path=name, default=i == 0) for i, (_, name, _, _) in enumerate(PAGES)],
                  position="hidden").run()
    st.stop()

visible = [p for p in PAGES if who.may_see(p[1])]
sections: dict[str, list[st.Page]] = {}
for i, (section, name, title, icon) in enumerate(visible):
    sections.setdefault(section, []).append(st.Page(f"views/{name}.py", title=title, icon=icon, default=i == 0))
page = st.navigation(sections)
if who.allows("read"):
    ui.sidebar()
not_shown: dict[str, list[str]] = {}
for _, name, title, _ in PAGES:
    if not who.may_see(name):
        not_shown.setdefault(access.PAGE_SCOPES[name], []).append(title)
for scope, titles in not_shown.items():
    st.sidebar.caption(f"Not shown, as they need the {scope} scope: {', '.join(titles)}.")
signin.sign_out_button(who, st.sidebar)
page.run()

"""Fleetscope dashboard: ``streamlit run dashboard/app.py`` (or ``fleetscope dashboard``).

This script runs on every interaction: it checks the database, draws the common sidebar (time range,
site, job, refresh) and runs the page picked in the navigation. Each page lives in ``pages/`` and reads
through ``dashboard.ui.q``, which caches ``fleetscope.queries``.
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

from dashboard import ui  # noqa: E402

st.set_page_config(page_title="Fleetscope", page_icon=":material/monitoring:", layout="wide")

PAGES = {
    "Fleet": [
        st.Page("pages/overview.py", title="Overview", icon=":material/dashboard:", default=True),
        st.Page("pages/health_sdc.py", title="Health & SDC", icon=":material/health_and_safety:"),
        st.Page("pages/reliability.py", title="Reliability", icon=":material/restart_alt:"),
        st.Page("pages/network.py", title="Network", icon=":material/lan:"),
        st.Page("pages/energy_carbon.py", title="Energy & Carbon", icon=":material/bolt:"),
    ],
    "Jobs": [
        st.Page("pages/jobs.py", title="Jobs", icon=":material/model_training:"),
        st.Page("pages/stragglers.py", title="Stragglers", icon=":material/slow_motion_video:"),
    ],
    "Operations": [
        st.Page("pages/alerts.py", title="Alerts", icon=":material/notifications:"),
        st.Page("pages/governance.py", title="Governance", icon=":material/gavel:"),
    ],
}

page = st.navigation(PAGES)
ui.check_database()
ui.sidebar()
page.run()

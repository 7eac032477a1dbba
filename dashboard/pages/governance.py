"""Governance: models and their risk class, lineage, fairness, the EU AI Act rule matrix, reports and exports.

The governance tables land with the governance part; until then each section says what it will show.
Sections read the first of their candidate tables that exists, so they fill in as those tables arrive.
"""

from __future__ import annotations

import streamlit as st

from dashboard import ui

ui.filters()
st.title("Governance")

ui.pending_table("Models and risk class", ("model", "ai_model"), "no models registered.", "Models and their EU AI Act risk class arrive with the governance service.")
ui.pending_table("Lineage", ("lineage_run", "lineage_edge", "lineage_io"), "no lineage events.", "OpenLineage events (`/api/v1/lineage`) build the graph of which data trained which model.")
ui.pending_table("Fairness by group", ("fairness_evaluation", "fairness"), "no fairness evaluations.", "Metrics by group with confidence intervals arrive with the fairness evaluations.")
ui.pending_table("EU AI Act rule matrix", ("rule_result", "aiact_rule_result"), "no rule results.", "Each rule's outcome with its evidence arrives with the AI Act rules.")
ui.pending_table("Audit reports and export bundles", ("audit_run", "audit_report", "export_bundle"), "no audit reports or exports.", "Scheduled reports and signed export bundles will be downloadable here.")

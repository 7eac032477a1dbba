"""Alerts: firing and recent alerts, silences, delivery status and dead letters.

The alerting tables land with the alerting service; until then each section says what it will show.
"""

from __future__ import annotations

import streamlit as st

from dashboard import ui

ui.filters()
st.title("Alerts")

ui.pending_table("Firing and recent", ("alert", "alerts", "alert_state"), "no alerts.", "Rules over findings and roll-ups, with `for:` pending, grouping and dedup, arrive with the alerting service.")
ui.pending_table("Silences", ("silence", "alert_silence"), "no silences.", "Creating and expiring silences will be possible here.")
ui.pending_table("Delivery status", ("notification", "alert_delivery", "delivery"), "no deliveries.", "Webhook deliveries (Alertmanager, Slack, signed webhooks) with retries will show here.")
ui.pending_table("Dead letters", ("dead_letter", "alert_dead_letter"), "no dead letters.", "Notifications that exhausted their retries will show here.")

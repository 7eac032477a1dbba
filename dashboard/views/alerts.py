"""Alerts: firing and recent alerts, silences (create and expire), delivery status and dead letters.

Everything here goes through the alerting service's own functions (``fleetscope.services.alerting.service``), the
ones the API's ``/api/v1/alerts`` endpoints call, so a silence made here is the same as one made there and
is audit-logged the same way. As there, reading needs the read scope and creating or expiring a silence the
admin scope; a silence is created by the signed-in user (the token's name), who is also the audit log's
actor. These tables are small and the page changes some of them, so they are read fresh on every run.
"""

from __future__ import annotations

import datetime as dt

import streamlit as st

from dashboard import signin, ui
from fleetscope.services.alerting import reads as alert_reads
from fleetscope.services.alerting import service as alert_service

MAX_CREATED_BY = 200  # the column's width (alert_silence.created_by)
MAX_COMMENT = 2000
MAX_MATCHERS = 50

ui.filters()
who = ui.access()
st.title("Alerts")


def firing() -> None:
    st.subheader("Firing and recent")
    alerts = ui.q(alert_reads.alerts, fresh=True)
    if alerts.is_empty():
        ui.no_data("no alerts.", "The worker evaluates the rules (findings, health events, roll-ups) every minute; alerts show here as they match.")
        return
    by_state = alerts["state"].value_counts()
    n = dict(zip(by_state["state"].to_list(), by_state["count"].to_list()))
    c = st.columns(4)
    c[0].metric("Firing", f"{n.get('firing', 0)}")
    c[1].metric("Pending", f"{n.get('pending', 0)}", help="matching, waiting out the rule's `for:`")
    c[2].metric("Resolved (kept)", f"{n.get('inactive', 0)}")
    c[3].metric("Muted", f"{alerts.filter(alerts['silenced_by'].is_not_null() | alerts['inhibited']).height}", help="silenced or inhibited")
    st.dataframe(
        alerts.drop("fingerprint"),
        hide_index=True,
        column_config={
            "active_at": ui.utc_column("Active since"),
            "fired_at": ui.utc_column("Fired"),
            "resolved_at": ui.utc_column("Resolved"),
        },
    )


ui.live(firing)

# --- silences --------------------------------------------------------------------------------------


def _utc(day: dt.date, at: dt.time) -> dt.datetime:
    return dt.datetime.combine(day, at.replace(second=0, microsecond=0), dt.UTC)


def silence_problems(matchers: list[str], comment: str) -> list[str]:
    """What the form must have before the service is asked (Alertmanager refuses a silence without a
    comment too); the service then checks the matchers and the time window."""
    problems = []
    if not matchers:
        problems.append("Give at least one matcher, e.g. alertname=\"GpuFellOffBus\".")
    elif len(matchers) > MAX_MATCHERS:
        problems.append(f"At most {MAX_MATCHERS} matchers ({len(matchers)} given).")
    if not comment.strip():
        problems.append("Say why (Comment): whoever sees the alert muted will read it.")
    elif len(comment) > MAX_COMMENT:
        problems.append(f"The comment is at most {MAX_COMMENT} characters ({len(comment)} given).")
    return problems


def create_silence() -> None:
    s = st.session_state
    actor = signin.acting("create_silence")
    if actor is None:
        ui.tell("sil_result", False, "The silence was not created: creating a silence needs the admin scope, and this session no longer holds it.")
        return
    matchers = [line.strip() for line in s["sil_matchers"].splitlines() if line.strip()]
    problems = silence_problems(matchers, s["sil_comment"])
    if problems:
        ui.tell("sil_result", False, " ".join(problems))
        return
    try:
        sil = alert_service.create_silence(
            ui.store(), matchers, _utc(s["sil_start_day"], s["sil_start_time"]), _utc(s["sil_end_day"], s["sil_end_time"]),
            created_by=actor.name[:MAX_CREATED_BY], comment=s["sil_comment"].strip(), actor=actor.name,
        )
    except ValueError as exc:  # a matcher that does not parse, a bad regex, an empty or inverted window
        ui.tell("sil_result", False, f"The silence was not created: {exc}")
        return
    ui.tell("sil_result", True, f"Silence {sil.id} created: {', '.join(str(m) for m in sil.matchers)} until {sil.ends_at:%Y-%m-%d %H:%M} UTC.")


def expire_silence() -> None:
    s = st.session_state
    silence_id = s.get("sil_expire_id")
    actor = signin.acting("expire_silence")
    if actor is None:
        ui.tell("sil_result", False, "Nothing was expired: expiring a silence needs the admin scope, and this session no longer holds it.")
    elif not silence_id:
        ui.tell("sil_result", False, "Pick a silence to expire.")
    elif alert_service.expire_silence(ui.store(), silence_id, actor=actor.name):
        ui.tell("sil_result", True, f"Silence {silence_id} expired.")
    else:
        ui.tell("sil_result", False, f"Silence {silence_id} is no longer active or pending: nothing to expire.")


st.subheader("Silences")
ui.told("sil_result")
silences = ui.q(alert_reads.silences, fresh=True)
if silences.is_empty():
    ui.no_data("no silences.", "Create one below to mute matching alerts for a while." if who.may("create_silence") else None)
else:
    st.dataframe(
        silences,
        hide_index=True,
        column_config={
            "starts_at": ui.utc_column("Starts", seconds=False),
            "ends_at": ui.utc_column("Ends", seconds=False),
        },
    )

now = dt.datetime.now(dt.UTC)
if not who.may("create_silence"):
    st.caption(f"Creating and expiring silences needs the admin scope, as `POST /api/v1/alerts/silences` does; {who.holding()}.")
else:
    with st.expander("Create a silence", expanded=silences.is_empty()):
        with st.form("create_silence", clear_on_submit=False):
            st.text_area(
                "Matchers, one per line", key="sil_matchers", placeholder='alertname="GpuFellOffBus"\nhost=~"site-a-node-00.*"',
                help='Alertmanager\'s syntax: name="value", name!="value", name=~"regex", name!~"regex". An alert is muted when every matcher matches.',
            )
            c1, c2 = st.columns(2)
            c1.date_input("Starts (UTC date)", value=now.date(), key="sil_start_day")
            c2.time_input("Starts (UTC time)", value=now.time().replace(second=0, microsecond=0), key="sil_start_time", step=60)
            later = now + dt.timedelta(hours=2)
            c1.date_input("Ends (UTC date)", value=later.date(), key="sil_end_day")
            c2.time_input("Ends (UTC time)", value=later.time().replace(second=0, microsecond=0), key="sil_end_time", step=60)
            st.text_area("Comment", key="sil_comment", max_chars=MAX_COMMENT, placeholder="why, and a ticket if there is one")
            st.caption(f"Created by {who.name}, the signed-in user.")
            st.form_submit_button("Create silence", on_click=create_silence, key="sil_create")

    expirable = silences.filter(silences["state"].is_in(["active", "pending"])) if silences.height else silences
    if expirable.height:
        with st.form("expire_silence"):
            labels = {r["silence_id"]: f"{r['matchers']} · until {r['ends_at']:%Y-%m-%d %H:%M} · {r['created_by']}" for r in expirable.iter_rows(named=True)}
            st.selectbox("Silence to expire", list(labels), format_func=labels.get, key="sil_expire_id")
            st.form_submit_button("Expire silence", on_click=expire_silence, key="sil_expire")

# --- the outbox -----------------------------------------------------------------------------------

st.subheader("Delivery status")
counts = ui.q(alert_reads.notification_counts, fresh=True)
if not any(counts.values()):
    ui.no_data("no notifications yet.", "Each firing or resolved alert group is sent to its receiver (Alertmanager, Slack or signed webhooks) with retries.")
else:
    shown = (
        ("delivered", "Delivered", "the receiver answered 2xx"),
        ("pending", "Retrying", "not delivered yet: waiting for its next attempt"),
        ("dead", "Dead", "retries exhausted, or no such receiver"),
        ("disabled", "Receiver disabled", "held until the receiver is enabled again"),
    )
    for col, (status, label, help_text) in zip(st.columns(4), shown):
        col.metric(label, f"{counts[status]:,}", help=help_text)
    st.dataframe(
        ui.q(alert_reads.notifications, fresh=True, limit=200),
        hide_index=True,
        column_config={
            "created_at": ui.utc_column("Created"),
            "next_attempt_at": ui.utc_column("Next attempt"),
            "delivered_at": ui.utc_column("Delivered"),
        },
    )

st.subheader("Dead letters")
dead = ui.q(alert_reads.notifications, fresh=True, status="dead", limit=200)
if dead.is_empty():
    ui.no_data("no dead letters.", "Notifications that exhaust their retries, or whose receiver does not exist, are kept here to be sent again.")
else:
    st.caption("Fix the receiver, then send one again with its original webhook-id: `POST /api/v1/alerts/notifications/{id}/retry` (scope admin).")
    st.dataframe(dead.select("notification_id", "receiver", "group_key", "created_at", "attempts", "last_status_code", "last_error"), hide_index=True,
                 column_config={"created_at": ui.utc_column("Created")})

"""Reliability: failures by cause, mean time between failures, checkpoint intervals against advice."""

from __future__ import annotations

import altair as alt
import polars as pl
import streamlit as st

from dashboard import ui
from fleetscope.services import health_reads
from fleetscope.services import reliability as reliability_svc

f = ui.filters()
st.title("Reliability")

summary = ui.q(reliability_svc.reliability_summary, live=False, start=f.start, end=f.end, site=f.site).row(0, named=True)
c = st.columns(4)
c[0].metric("Failures", f"{summary['failures']}")
c[1].metric("Preemptions", f"{summary['preemptions']}")
c[2].metric("Restarts", f"{summary['restarts']}")
c[3].metric("MTBF", "—" if summary["mtbf_s"] is None else ui.fmt_duration(summary["mtbf_s"]), help="time range / failures in it, across the jobs shown")

st.subheader("Failures by category")
events = ui.q(reliability_svc.disruptions, live=False, start=f.start, end=f.end, site=f.site)
if events.is_empty():
    ui.no_data("no failures, preemptions or restarts in this time range.")
else:
    by_cause = events.group_by("kind", "cause").agg(pl.len().alias("events"))
    ui.chart(
        alt.Chart(by_cause).mark_bar().encode(
            y=alt.Y("cause:N", title="Cause", sort="-x"),
            x=alt.X("events:Q", title="Disruptions (count)"),
            color=alt.Color("kind:N", title="Kind"),
            tooltip=["cause", "kind", "events"],
        ),
        height=max(120, 30 * by_cause.height),
    )
    st.dataframe(events, hide_index=True)

st.subheader("Checkpoint intervals")
ckpt = ui.q(reliability_svc.checkpoint_intervals, live=False, start=f.start, end=f.end, site=f.site)
if ckpt.is_empty():
    ui.no_data("no checkpoint saves in this time range.")
else:
    ui.chart(
        alt.Chart(ckpt).mark_bar().encode(
            x=alt.X("job_id:N", title="Job"),
            y=alt.Y("interval_mean_s:Q", title="Mean checkpoint interval (s)"),
            tooltip=["job_id", "saves", alt.Tooltip("interval_mean_s:Q", format=".1f"), alt.Tooltip("save_mean_s:Q", format=".1f")],
        ),
        height=220,
    )
    st.dataframe(ckpt, hide_index=True)
advice = ui.q(health_reads.findings, live=False, start=f.start, end=f.end, kind_like="checkpoint%")
if advice.is_empty():
    ui.no_data("no checkpoint-interval advice.", "The advised interval (Young/Daly, from MTBF and save cost) arrives with the reliability analyzer.")
else:
    st.dataframe(advice.select("subject", "summary", "score", "evidence"), hide_index=True)

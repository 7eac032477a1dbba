"""Health & SDC: XIDs, ECC and other GPU faults by node over time; what to drain; silent data corruption."""

from __future__ import annotations

import altair as alt
import polars as pl
import streamlit as st

from dashboard import ui
from fleetscope.services import health_reads

f = ui.filters()
st.title("Health & SDC")

# Above this many hosts the colour legend stops being readable; the rest are summed as "other hosts".
TOP_HOSTS = 12

bucket_s = ui.bucket_for(f.range_s)
over_time = ui.q(health_reads.health_events_over_time, live=False, start=f.start, end=f.end, bucket_s=bucket_s, site=f.site)
st.subheader("Health events over time by node")
if over_time.is_empty():
    ui.no_data("no XID, ECC, row-remap, NVLink, throttle or SDC events in this time range.")
else:
    kinds = sorted(over_time["kind"].unique().to_list())
    chosen = st.multiselect("Kinds", kinds, default=kinds, key="health_kinds")
    shown = over_time.filter(pl.col("kind").is_in(chosen))
    top = shown.group_by("host").agg(pl.col("events").sum()).sort("events", descending=True).head(TOP_HOSTS)["host"].to_list()
    shown = shown.with_columns(node=pl.when(pl.col("host").is_in(top)).then(pl.col("host")).otherwise(pl.lit("other hosts")))
    st.caption(f"Events per {ui.fmt_age(bucket_s)}; the {TOP_HOSTS} nodes with most events are named.")
    ui.chart(
        alt.Chart(shown).mark_bar().encode(
            x=alt.X("ts:T", title=ui.TIME_AXIS, axis=alt.Axis(format="%H:%M")),
            y=alt.Y("sum(events):Q", title="Health events (count)"),
            color=alt.Color("node:N", title="Node"),
            tooltip=["node:N", "kind:N", alt.Tooltip("ts:T", title="bucket (UTC)"), alt.Tooltip("sum(events):Q", title="events")],
        )
    )
    st.dataframe(ui.q(health_reads.health_events_by_node, live=False, start=f.start, end=f.end, site=f.site), hide_index=True)

st.subheader("Drain and repair recommendations")
# The health analyzer's findings are its recommendations: gpu_/node_ followed by the action (drain_node,
# send_for_repair, reset, watch, ...; analyzers.health).
advice = ui.q(health_reads.findings, live=False, start=f.start, end=f.end, analyzer="health")
if advice.is_empty():
    ui.no_data("no drain or repair recommendations.", "The health analyzer (`fleetscope.health_window`, run by beat) recommends actions from XIDs, ECC, row remaps and throttling.")
else:
    advice = advice.with_columns(action=pl.col("kind").str.replace(r"^(gpu|node)_", "").str.replace_all("_", " "))
    st.dataframe(advice.select("subject", "action", "severity", "summary", "window_start"), hide_index=True)

st.subheader("Silent GPUs, hosts down and hung jobs")
# analyzers.absence (a GPU, host or site that stopped reporting) and analyzers.hangs (a job that stopped
# stepping with its GPUs held), both from the health sweep
quiet = pl.concat([ui.q(health_reads.findings, live=False, start=f.start, end=f.end, analyzer=a) for a in ("absence", "hangs")], how="vertical_relaxed")
if quiet.is_empty():
    ui.no_data("nothing has gone quiet.", "The health sweep flags a GPU or host silent for three of its intervals (and 2 minutes), a site silent "
               "at once, and a job with no step for ten of its steps (and FLEETSCOPE_HANG_MIN_STALL_S) while it holds its GPUs.")
else:
    st.dataframe(quiet.select("kind", "subject", "severity", "summary", "window_start", "window_end"), hide_index=True)

st.subheader("SDC suspects")
sdc = ui.q(health_reads.findings, live=False, start=f.start, end=f.end, kind_like="sdc%")
sdc_events = ui.q(health_reads.health_events_recent, live=False, start=f.start, end=f.end, site=f.site, kinds=("sdc",))
if sdc.is_empty() and sdc_events.is_empty():
    ui.no_data("no silent-data-corruption suspects.", "Checksum and loss-divergence evidence arrives with the SDC analyzer.")
else:
    if sdc.height:
        st.dataframe(sdc.select("subject", "severity", "score", "summary", "evidence", "window_start"), hide_index=True)
    if sdc_events.height:
        st.caption("SDC events reported by sources")
        st.dataframe(sdc_events, hide_index=True)

st.subheader("Recent events")
recent = ui.q(health_reads.health_events_recent, live=False, start=f.start, end=f.end, site=f.site)
if recent.is_empty():
    ui.no_data("no health events in this time range.")
else:
    st.dataframe(recent, hide_index=True)

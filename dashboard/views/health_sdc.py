"""Health & SDC: XIDs, ECC and other GPU faults by node over time; what to drain; silent data corruption; one GPU's
history over the page's range (linked as ``?gpu=UUID``)."""

from __future__ import annotations

import altair as alt
import polars as pl
import streamlit as st

from dashboard import ui
from fleetscope.core.errors import ValidationError
from fleetscope.services import health_reads, telemetry

f = ui.filters()
st.title("Health & SDC")

# Above this many hosts the colour legend stops being readable; the rest are summed as "other hosts".
TOP_HOSTS = 12
# The GPU of the history section travels in the URL (?gpu=UUID), so an alert or a chat can link to it.
GPU_PARAM = "gpu"

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


st.subheader("One GPU over time")
inventory = ui.q(telemetry.inventory_gpus, live=False, site=f.site)
labels = {r["gpu_uuid"]: f"{r['host']} #{r['gpu_index']} · {r['gpu_uuid']}" for r in inventory.iter_rows(named=True)}
# GPUs with health events in the range first (newest first), then the inventory by host and index
with_events = [g for g in dict.fromkeys(recent["gpu_uuid"].to_list() if recent.height else []) if g]
options = list(dict.fromkeys([*with_events, *labels]))
if "health_gpu" not in st.session_state:
    linked = st.query_params.get(GPU_PARAM)
    if linked and linked not in options:
        options.insert(0, linked)
    st.session_state["health_gpu"] = linked or (options[0] if options else None)
elif st.session_state["health_gpu"] and st.session_state["health_gpu"] not in options:
    options.insert(0, st.session_state["health_gpu"])
if not options:
    ui.no_data("no GPU in the inventory or with health events to pick.", "GPUs arrive with dcgm-exporter, NVML or the agent's pushes.")
else:
    left, right = st.columns([2, 3])
    gpu = left.selectbox("GPU", options, key="health_gpu", format_func=lambda u: labels.get(u, u), accept_new_options=True,
                         help="GPUs with health events in the range first; type a UUID to pick one not listed.")
    fields = right.multiselect("Fields", telemetry.SERIES_FIELDS, default=list(telemetry.DEFAULT_SERIES_FIELDS), key="health_gpu_fields",
                               max_selections=telemetry.MAX_SERIES_FIELDS)
    if gpu:
        st.query_params[GPU_PARAM] = gpu
    else:
        st.query_params.pop(GPU_PARAM, None)
    if gpu and fields:
        try:
            series = ui.q(telemetry.gpu_field_series, live=False, gpu_uuid=gpu, field=tuple(fields), start=f.start, end=f.end)
        except (ValidationError, telemetry.TooManyPoints) as exc:
            st.warning(str(exc))
            series = None
        if series is not None and series.is_empty():
            ui.no_data(f"no sample of {gpu} in this time range.")
        elif series is not None:
            tier = series["tier"][0]
            fresh = series.filter(pl.col("from_raw"))["ts"].n_unique() if tier != "raw" else 0
            st.caption({"raw": "Every raw sample.", "minute": "Per minute from the minute tier: line the mean, band min to max.",
                        "hour": "Per hour from the hour tier: line the mean, band min to max."}[tier]
                       + (f" The last {fresh} bucket(s) are not rolled yet: made from raw samples now." if fresh else ""))
            for name in fields:
                one = series.filter(pl.col("field") == name)
                base = alt.Chart(one).encode(x=ui.time_x())
                tip = [alt.Tooltip("ts:T", title="UTC", format="%Y-%m-%d %H:%M:%S"), alt.Tooltip("mean:Q", title="mean"),
                       alt.Tooltip("min:Q", title="min"), alt.Tooltip("max:Q", title="max"), alt.Tooltip("last:Q", title="last")]
                line = base.mark_line(point=one.height < 200).encode(y=alt.Y("mean:Q", title=name, scale=alt.Scale(zero=False)), tooltip=tip)
                band = base.mark_area(opacity=0.25).encode(y="min:Q", y2="max:Q")
                ui.chart(line if tier == "raw" else alt.layer(band, line), height=180)
            with st.expander("Values"):
                st.dataframe(series, hide_index=True, column_config={"ts": ui.utc_column("Time")})

"""Network: unhealthy InfiniBand links; the switch or link a job's comm stragglers share and starved
all-to-all runs (against the topology's bound); NCCL bus bandwidth by collective and message size against the fabric's
peak (from the topology's HCA link rate, or typed in); nccl-tests history."""

from __future__ import annotations

import altair as alt
import polars as pl
import streamlit as st

from dashboard import ui
from fleetscope.services import fabric as fabric_svc

f = ui.filters()
st.title("Network")

nic = ui.q(fabric_svc.fabric_nic_rate_gbps, live=False)
nic_rate = nic["rate_gbps"][0] if nic.height else None
typed = st.number_input(
    "Fabric peak bus bandwidth (GB/s)", min_value=0.0, value=0.0, step=25.0, key="fabric_peak",
    help="drawn as a line on the charts; 0 takes it from the topology (one HCA link's rate / 8), where one is stored "
         "(e.g. about 450 for NVLink 4 all_reduce within an H100 node)",
)
peak = typed or (nic_rate / 8 if nic_rate else 0.0)
if not typed and nic_rate:
    st.caption(f"Peak from the topology: HCA links of {nic_rate:g} Gb/s = {nic_rate / 8:g} GB/s per NIC ({nic['links'][0]} links).")

st.subheader("InfiniBand links")
ib = ui.q(fabric_svc.fabric_link_findings, start=f.start, end=f.end)
if ib.is_empty():
    ui.no_data("no unhealthy InfiniBand links in this time range.",
               "Port counters arrive from `fleetscope agent` (sysfs), node_exporter, perfquery; topology from ibnetdiscover.")
else:
    latest = ib.unique(["kind", "subject"], keep="first")
    st.dataframe(latest.select("kind", "subject", "severity", "window_end", "summary"), hide_index=True)

topo = ui.q(fabric_svc.fabric_topology_findings, start=f.start, end=f.end)
if not topo.is_empty():
    # shown only when there is something: a healthy fabric has no suspects and no starved all-to-all
    latest = topo.unique(["kind", "subject"], keep="first")
    suspects = latest.filter(pl.col("kind") == "comm_straggler_fabric")
    if suspects.height:
        st.subheader("Communication stragglers by switch and link")
        st.caption("The HCA port, host or leaf switch a job's slow-communicating ranks share (`fleetscope topology attribution`).")
        st.dataframe(suspects.select("subject", "severity", "score", "window_end", "summary"), hide_index=True)
    low = latest.filter(pl.col("kind") == "alltoall_low_utilization")
    if low.height:
        st.subheader("All-to-all against the topology's bound")
        st.caption("nccl-tests alltoall runs below half the bound the leaves' uplinks and the hosts' NICs allow (`fleetscope topology alltoall`).")
        st.dataframe(low.select("subject", pl.col("score").alias("utilization_ratio"), "window_end", "summary"), hide_index=True)

# Message sizes are powers of two: label them in binary units (1 MiB, not 1.048576M).
BYTES_LABEL = (
    "datum.value >= 1073741824 ? format(datum.value / 1073741824, '~g') + ' GiB'"
    " : datum.value >= 1048576 ? format(datum.value / 1048576, '~g') + ' MiB'"
    " : datum.value >= 1024 ? format(datum.value / 1024, '~g') + ' KiB' : format(datum.value, '~g') + ' B'"
)
SIZE_X = alt.X("size_bytes:Q", title="Message size (bytes)", scale=alt.Scale(type="log", base=2), axis=alt.Axis(labelExpr=BYTES_LABEL, labelOverlap=True))


def with_peak(c: alt.Chart) -> alt.Chart | alt.LayerChart:
    if not peak:
        return c
    rule = alt.Chart(pl.DataFrame({"peak": [peak]})).mark_rule(strokeDash=[6, 4], color="gray").encode(y="peak:Q")
    return alt.layer(c, rule)


st.subheader("Collectives in production" + (f" · {f.job_id}" if f.job_id else ""))
coll = ui.q(fabric_svc.collective_busbw, live=False, start=f.start, end=f.end, job_id=f.job_id)
if coll.is_empty():
    ui.no_data("no NCCL collectives in this time range.", "They arrive with NCCL Inspector, NCCL debug logs or Kineto traces.")
else:
    ui.chart(
        with_peak(
            alt.Chart(coll.rename({"bytes": "size_bytes"})).mark_line(point=True).encode(
                x=SIZE_X,
                y=alt.Y("busbw_mean_gbps:Q", title="Bus bandwidth (GB/s)"),
                color=alt.Color("op:N", title="Operation"),
                tooltip=["op", "size_bytes", "calls", alt.Tooltip("busbw_mean_gbps:Q", format=".1f"), alt.Tooltip("busbw_min_gbps:Q", format=".1f")],
            )
        )
    )
    st.dataframe(coll, hide_index=True)

st.subheader("nccl-tests history")
runs = ui.q(fabric_svc.nccl_test_runs, live=False, start=f.start, end=f.end)
if runs.is_empty():
    ui.no_data("no nccl-tests runs in this time range.", "Ingest nccl-tests output with `fleetscope ingest`.")
    st.stop()
ui.chart(
    with_peak(
        alt.Chart(runs).mark_line(point=True).encode(
            x=ui.time_x(),
            y=alt.Y("busbw_max_gbps:Q", title="Peak bus bandwidth (GB/s)"),
            color=alt.Color("op:N", title="Operation"),
            tooltip=["run_id", "op", "nranks", "hosts", alt.Tooltip("busbw_max_gbps:Q", format=".1f"), alt.Tooltip("busbw_avg_gbps:Q", format=".1f")],
        )
    ),
    height=220,
)
chosen = st.multiselect("Runs", runs["run_id"].to_list(), default=runs["run_id"].head(2).to_list(), key="nccl_runs")
sizes = ui.q(fabric_svc.nccl_test_sizes, live=False, run_ids=tuple(chosen))
if sizes.is_empty():
    ui.no_data("pick a run to see bandwidth by size.")
else:
    sizes = sizes.filter(~pl.col("in_place"))  # in-place and out-of-place agree closely; one line per run reads better
    ui.chart(
        with_peak(
            alt.Chart(sizes).mark_line(point=True).encode(
                x=SIZE_X,
                y=alt.Y("busbw_gbps:Q", title="Bus bandwidth (GB/s)"),
                color=alt.Color("run_id:N", title="Run"),
                tooltip=["run_id", "op", "size_bytes", alt.Tooltip("busbw_gbps:Q", format=".1f"), alt.Tooltip("time_s:Q", format=".6f")],
            )
        )
    )
st.dataframe(runs, hide_index=True)

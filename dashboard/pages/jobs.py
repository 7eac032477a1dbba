"""Jobs: where a job's step time goes (C³), its goodput, how it scales, how much it talks."""

from __future__ import annotations

import altair as alt
import polars as pl
import streamlit as st

from dashboard import ui
from fleetscope import queries

MAX_RANK_BARS = 128

f = ui.filters()
st.title("Jobs")

jobs = ui.q(queries.jobs, live=False, start=f.start, end=f.end, site=f.site)
if jobs.is_empty():
    ui.no_data("no job ran in this time range.", "Jobs arrive with job lifecycle events, Kineto traces or the scheduler integration.")
    st.stop()

job_id = ui.pick_job(f)
meta = jobs.filter(pl.col("job_id") == job_id)
meta_row = meta.row(0, named=True) if meta.height else {"name": None, "model_name": None, "world_size": None, "status": None}
totals = ui.q(queries.job_totals, live=False, job_id=job_id).row(0, named=True)

st.subheader(f"{job_id}" + (f" · {meta_row['name']}" if meta_row["name"] else ""))
c = st.columns(5)
c[0].metric("World size", f"{meta_row['world_size'] or totals['ranks'] or 0:,} GPUs")
c[1].metric("Status", meta_row["status"] or "—")
c[2].metric("Steps recorded", f"{totals['steps'] or 0:,}")
c[3].metric("Mean step time", ui.fmt_duration(totals["step_mean_s"]))
ci = totals["comm_intensity_bytes_per_flop"]
c[4].metric("Comm. intensity", "—" if ci is None else f"{ci:.1e} B/FLOP".replace("e-0", "e-"), help="communication intensity: network bytes / model FLOPs")

st.subheader("C³ breakdown over steps")
steps = ui.q(queries.job_step_summary, live=False, job_id=job_id)
if steps.is_empty():
    ui.no_data("no step records for this job.", "Steps arrive with Kineto traces or step events.")
else:
    st.caption("Mean over ranks per step: compute (C1), exposed communication (C2), idle. Splitting collective wait from transfer arrives with the C³ analyzer's roll-ups.")
    parts = {"compute_mean_s": "compute", "comm_exposed_mean_s": "exposed communication", "idle_mean_s": "idle"}
    ui.chart(ui.stacked_parts(steps, "step", parts, alt.X("step:O", title="Step", axis=alt.Axis(labelOverlap=True)), "Time per step (s)"))

    st.subheader("Per rank")
    ranks = ui.q(queries.job_rank_summary, live=False, job_id=job_id)
    if ranks.height > MAX_RANK_BARS:
        # Thousands of bars draw slowly and read as noise: keep the slowest ranks (the summary is sorted
        # slowest first), where a straggler would be.
        st.caption(f"The {MAX_RANK_BARS} slowest of {ranks.height:,} ranks (by compute time per step).")
        ranks = ranks.head(MAX_RANK_BARS)
    ranks = ranks.with_columns(comm_exposed_mean_s=(pl.col("step_mean_s") - pl.col("compute_mean_s") - pl.col("idle_mean_s")).clip(lower_bound=0))
    rparts = {"compute_mean_s": "compute", "comm_exposed_mean_s": "exposed communication", "idle_mean_s": "idle"}
    ui.chart(ui.stacked_parts(ranks, "rank", rparts, alt.X("rank:O", title="Rank"), "Mean time per step (s)"), height=240)

st.subheader("Goodput and badput")
goodput = ui.q(queries.findings, live=False, start=f.start, end=f.end, kind_like="%goodput%", subject_like=f"job:{job_id}%")
badput = ui.q(queries.findings, live=False, start=f.start, end=f.end, kind_like="badput%", subject_like=f"job:{job_id}%")
if goodput.is_empty() and badput.is_empty():
    ui.no_data("no goodput for this job.", "Goodput (scheduling × runtime × program) and the badput waterfall arrive with the goodput analyzer.")
else:
    if goodput.height:
        st.metric("Goodput", f"{goodput['score'][0]:.0%}")
    if badput.height:
        ui.chart(
            alt.Chart(badput).mark_bar().encode(
                x=alt.X("kind:N", title="Badput bucket", sort="-y"), y=alt.Y("score:Q", title="Share of wall time (ratio)"), tooltip=["kind", "score", "summary"]
            ),
            height=220,
        )

st.subheader("Scaling across runs")
model = meta_row["model_name"]
runs = ui.q(queries.scaling, live=False, model_name=model) if model else None
if runs is None or runs.height < 2:
    ui.no_data("fewer than two runs of this model at different world sizes.", "Scaling efficiency and the Fleet Law fit need at least two (three for the fit).")
else:
    st.caption(f"Runs of {model}: η = T1 / (N · T_N), relative to the smallest run.")
    c1, c2 = st.columns(2)
    with c1:
        ui.chart(
            alt.Chart(runs).mark_line(point=True).encode(
                x=alt.X("world_size:Q", title="World size (GPUs)", scale=alt.Scale(type="log", base=2)),
                y=alt.Y("step_time_mean_s:Q", title="Mean step time (s)"),
                tooltip=["job_id", "world_size", alt.Tooltip("step_time_mean_s:Q", format=".3f")],
            ),
            height=220,
        )
    with c2:
        ui.chart(
            alt.Chart(runs).mark_line(point=True).encode(
                x=alt.X("world_size:Q", title="World size (GPUs)", scale=alt.Scale(type="log", base=2)),
                y=alt.Y("efficiency_ratio:Q", title="Scaling efficiency η (ratio)", scale=alt.Scale(domain=[0, 1.1])),
                tooltip=["job_id", "world_size", alt.Tooltip("efficiency_ratio:Q", format=".2f")],
            ),
            height=220,
        )

with st.expander(f"All jobs in the range ({jobs.height})"):
    st.dataframe(jobs, hide_index=True)

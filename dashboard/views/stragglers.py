"""Stragglers: which rank holds every step back, and what it costs."""

from __future__ import annotations

import altair as alt
import polars as pl
import streamlit as st

from dashboard import ui
from fleetscope.services import health_reads
from fleetscope.services import job_reads as jobs_svc

f = ui.filters()
st.title("Stragglers")

st.subheader("Current suspects")
suspects = ui.q(health_reads.findings, live=False, start=f.start, end=f.end, kind_like="%straggler%")
if suspects.is_empty():
    ui.no_data("no straggler findings in this time range.", "Attribution and cost arrive with the straggler analyzer.")
else:
    st.dataframe(suspects.select("subject", "severity", "score", "summary", "window_start", "window_end"), hide_index=True)

jobs = ui.q(jobs_svc.jobs, live=False, start=f.start, end=f.end, site=f.site)
if jobs.is_empty():
    ui.no_data("no job ran in this time range.")
    st.stop()
job_id = ui.pick_job(f, key="straggler_job")

st.subheader("What-if: slowdown with every operation at its typical duration")
whatif = ui.q(jobs_svc.job_analyses, live=False, job_id=job_id).get("whatif")
if not whatif or whatif.get("slowdown") is None:
    ui.no_data("no what-if for this job.", "It needs the job's per-operation trace: `fleetscope ingest TRACE.parquet --format bytedance_whatif --job-id JOB`, then the job analysis.")
else:
    c = st.columns(4)
    c[0].metric("Slowdown S", f"{whatif['slowdown']:.3f}×", help="T(actual) / T(ideal), both replayed (Lin et al., OSDI 2025); ideal: compute at its mean, communication at its median duration")
    c[1].metric("M_W (top 3 % of workers)", f"{whatif['m_w']:.2f}", help="share of the slowdown removed by fixing the slowest workers")
    c[2].metric("M_S (last stage)", f"{whatif['m_s']:.2f}", help="share of the slowdown removed by fixing the last pipeline stage")
    c[3].metric("Verdict", whatif["verdict"].replace("_", " "), help=", ".join(whatif.get("culprits") or []) or None)
    left, right = st.columns(2)
    by_stage = pl.DataFrame(whatif["by_stage"])
    with left:
        st.caption("Per stage: S with only that stage at its measured durations")
        ui.chart(alt.Chart(by_stage).mark_bar().encode(
            x=alt.X("stage:O", title="Pipeline stage"), y=alt.Y("slowdown_only:Q", title="Slowdown", scale=alt.Scale(zero=False)),
            tooltip=["stage:O", alt.Tooltip("slowdown_only:Q", format=".3f"), alt.Tooltip("recovered_share:Q", format=".2f", title="recovered when fixed")],
        ), height=220)
    by_worker = pl.DataFrame(whatif["by_worker"])
    right.caption("Per rank: min(S of its data-parallel rank, S of its stage), slowest first")
    right.dataframe(by_worker.head(20), hide_index=True, column_config={"slowdown": st.column_config.NumberColumn("Slowdown", format="%.3f")})

st.subheader(f"Rank × step: {job_id}")
metric = st.segmented_control(
    "Colour by", ["compute", "idle", "step"], default="compute", key="straggler_metric",
    help="In synchronous training every rank's step lasts as long as the slowest rank's: a straggler shows as long compute, the others as idle time spent waiting for it.",
) or "compute"
column, title = {"compute": ("compute_s", "Compute per step (s)"), "idle": ("idle_s", "Idle per step (s)"), "step": ("step_s", "Step time (s)")}[metric]
# 128 rows × 50 steps keeps the heatmap to ~6k cells: beyond that it draws slowly and no row is readable.
# Both rank views read the job's last steps: asked at once, their reads overlap.
ui.prefetch(lambda: ui.q(jobs_svc.job_rank_step_times, live=False, job_id=job_id, last_steps=50, max_ranks=128),
            lambda: ui.q(jobs_svc.job_rank_summary, live=False, job_id=job_id))
cells = ui.q(jobs_svc.job_rank_step_times, live=False, job_id=job_id, last_steps=50, max_ranks=128)
if cells.is_empty():
    ui.no_data("no step records for this job.", "Steps arrive with Kineto traces or step events.")
    st.stop()
grouped = int(cells["ranks_in_cell"].max() or 1) > 1
if grouped:
    st.caption(f"{int(cells['ranks_in_cell'].max())} ranks per row: each row shows the slowest of its ranks.")
heat = alt.Chart(cells).mark_rect().encode(
    x=alt.X("step:O", title="Step", axis=alt.Axis(labelOverlap=True)),
    y=alt.Y("rank:O", title="Rank (first of group)" if grouped else "Rank"),
    color=alt.Color(f"{column}:Q", title=title, scale=alt.Scale(scheme="viridis")),
    tooltip=["rank:O", "step:O", alt.Tooltip("step_s:Q", format=".3f", title="Step (s)"), alt.Tooltip("compute_s:Q", format=".3f", title="Compute (s)"), alt.Tooltip("idle_s:Q", format=".3f", title="Idle (s)")],
)
ui.chart(heat, height=min(700, 60 + 14 * cells["rank"].n_unique()))

st.subheader("Slowest ranks")
ranks = ui.q(jobs_svc.job_rank_summary, live=False, job_id=job_id)
slow = ranks.filter(pl.col("slowdown_ratio") >= 1.1)
wait_gpu_h = float((ranks["idle_mean_s"].fill_null(0) * ranks["steps"]).sum()) / 3600 if ranks.height else 0.0
c1, c2 = st.columns(2)
c1.metric("Ranks ≥ 1.1× median compute", f"{slow.height}")
c2.metric("Time spent idle in these steps", f"{wait_gpu_h:.3f} GPU-h", help="sum over ranks of idle time per step × steps; the straggler analyzer will attribute it")
st.dataframe(ranks.head(20), hide_index=True, column_config={"slowdown_ratio": st.column_config.NumberColumn("Slowdown (× median)", format="%.2f")})


"""Jobs: where a job's step time goes (C³), where its GPUs' time goes (HTA's temporal breakdown), its goodput, how it
scales, how much it talks."""

from __future__ import annotations

import datetime as dt

import altair as alt
import polars as pl
import streamlit as st

from dashboard import ui
from fleetscope.services import job_reads as jobs_svc

MAX_RANK_BARS = 128
STEP_ROWS = 262_144
"""The most rank-steps a per-step chart reads: it shows the job's last STEP_ROWS / ranks steps, within MIN_STEPS and MAX_STEPS."""
MIN_STEPS, MAX_STEPS = 100, 2000

f = ui.filters()
st.title("Jobs")

jobs = ui.q(jobs_svc.jobs, live=False, start=f.start, end=f.end, site=f.site)
if jobs.is_empty():
    ui.no_data("no job ran in this time range.", "Jobs arrive with job lifecycle events, Kineto traces or the scheduler integration.")
    st.stop()

job_id = ui.pick_job(f)
meta = jobs.filter(pl.col("job_id") == job_id)
meta_row = meta.row(0, named=True) if meta.height else {"name": None, "model_name": None, "world_size": None, "status": None}
analyses = ui.q(jobs_svc.job_analyses, live=False, job_id=job_id)
c3 = analyses.get("c3") or {}
# A job the C3 analysis has folded has its totals in the summary (as of its last run, a minute at most behind a
# running job): a month-long 1,024-rank job's totals would be a scan of its 4.4 M rank-steps. The per-step charts
# read at most STEP_ROWS rank-steps (the last 2,000 steps of a 128-rank job, 256 of a 1,024-rank one), all at once.
world = meta_row["world_size"] or c3.get("ranks")
max_steps = min(MAX_STEPS, max(MIN_STEPS, STEP_ROWS // int(world))) if world else MAX_STEPS
reads = [lambda: ui.q(jobs_svc.job_c3_steps, live=False, job_id=job_id, max_steps=max_steps),
         lambda: ui.q(jobs_svc.job_step_summary, live=False, job_id=job_id, max_steps=max_steps),
         lambda: ui.q(jobs_svc.job_rank_summary, live=False, job_id=job_id)]
if not c3.get("steps"):
    reads.append(lambda: ui.q(jobs_svc.job_totals, live=False, job_id=job_id))
ui.prefetch(*reads)
totals = ({"ranks": c3["ranks"], "steps": c3["steps"], "step_mean_s": c3.get("step_s_mean"),
           "comm_intensity_bytes_per_flop": c3.get("comm_intensity_bytes_per_flop")} if c3.get("steps")
          else ui.q(jobs_svc.job_totals, live=False, job_id=job_id).row(0, named=True))

st.subheader(f"{job_id}" + (f" · {meta_row['name']}" if meta_row["name"] else ""))
c = st.columns(5)
c[0].metric("World size", f"{meta_row['world_size'] or totals['ranks'] or 0:,} GPUs")
c[1].metric("Status", meta_row["status"] or "—")
c[2].metric("Steps recorded", f"{totals['steps'] or 0:,}")
c[3].metric("Mean step time", ui.fmt_duration(totals["step_mean_s"]))
ci = totals["comm_intensity_bytes_per_flop"]
c[4].metric("Comm. intensity", "—" if ci is None else f"{ci:.1e} B/FLOP".replace("e-0", "e-"), help="communication intensity: network bytes / model FLOPs")

st.subheader("C³ breakdown over steps")
c3_steps = ui.q(jobs_svc.job_c3_steps, live=False, job_id=job_id, max_steps=max_steps)
steps = ui.q(jobs_svc.job_step_summary, live=False, job_id=job_id, max_steps=max_steps)
step_x = alt.X("step:O", title="Step", axis=alt.Axis(labelOverlap=True))
if c3_steps.height:
    c = st.columns(3)
    for col, part, label in zip(c, ("c1", "c2", "c3"), ("C1 compute", "C2 communication", "C3 coordination")):
        ratio = c3.get(f"{part}_ratio")
        col.metric(label, "—" if ratio is None else f"{ratio:.0%}", help="share of step time, over the job's steps and ranks (C³ analyzer)")
    st.caption(f"Mean over ranks per step (the last {c3_steps.height:,}), from the C³ analyzer: C1 compute, C2 exposed transfer, C3 coordination (idle and waiting for the last peer of a collective). C1 + C2 + C3 = step time."
               + (f" {c3['advice']}" if c3.get("advice") else ""))
    parts = {"c1_compute_s": "C1 compute", "c2_comm_s": "C2 communication", "c3_coord_s": "C3 coordination"}
    ui.chart(ui.stacked_parts(c3_steps, "step", parts, step_x, "Time per step (s)"))
elif steps.height:
    st.caption(f"Mean over ranks per step (the last {steps.height:,}), from the step records: compute, exposed communication, idle. The C³ analyzer has not run on this job yet; its breakdown also splits a collective's wait (coordination) from its transfer.")
    parts = {"compute_mean_s": "compute", "comm_exposed_mean_s": "exposed communication", "idle_mean_s": "idle"}
    ui.chart(ui.stacked_parts(steps, "step", parts, step_x, "Time per step (s)"))
else:
    ui.no_data("no step records for this job.", "Steps arrive with Kineto traces or step events.")
if steps.height:
    st.subheader("Per rank")
    ranks = ui.q(jobs_svc.job_rank_summary, live=False, job_id=job_id)
    if ranks.height > MAX_RANK_BARS:
        # Thousands of bars draw slowly and read as noise: keep the slowest ranks (the summary is sorted
        # slowest first), where a straggler would be.
        st.caption(f"The {MAX_RANK_BARS} slowest of {ranks.height:,} ranks (by compute time per step).")
        ranks = ranks.head(MAX_RANK_BARS)
    ranks = ranks.with_columns(comm_exposed_mean_s=(pl.col("step_mean_s") - pl.col("compute_mean_s") - pl.col("idle_mean_s")).clip(lower_bound=0))
    rparts = {"compute_mean_s": "compute", "comm_exposed_mean_s": "exposed communication", "idle_mean_s": "idle"}
    ui.chart(ui.stacked_parts(ranks, "rank", rparts, alt.X("rank:O", title="Rank"), "Mean time per step (s)"), height=240)

st.subheader("GPU time per rank (HTA temporal breakdown)")
tb = ui.q(jobs_svc.temporal, live=False, job_id=job_id)
if not tb["ranks"]:
    ui.no_data(f"no HTA temporal breakdown for this job: {tb['reason']}.",
               "It comes from the job's PyTorch profiler (Kineto) traces, one per rank.")
else:
    j = tb["job"]
    pct = lambda v: "—" if v is None else f"{v:.1f}%"  # noqa: E731
    c = st.columns(4)
    c[0].metric("GPU idle", pct(j["idle_time_pctg"]), help="share of kernel time no kernel, copy or sync ran, over the job's ranks (HTA's idle_time)")
    c[1].metric("GPU computing", pct(j["compute_time_pctg"]), help="share of kernel time in computation kernels (HTA's compute_time)")
    c[2].metric("Non-compute", pct(j["non_compute_time_pctg"]), help="share of kernel time busy with communication, memory copies and syncs alone (HTA's non_compute_time)")
    c[3].metric("Communication under compute", pct(j["comp_comm_overlap_pctg"]), help="share of communication kernel time that ran while computation did (HTA's comp_comm_overlap)")
    window = {"before_last_step": "the last profiler step left out, as HTA does by default", "through_last_step": "through the last profiler step",
              "all": "every device event (the traces name fewer than two profiler steps)"}[tb["window"]]
    ranks = pl.DataFrame(tb["ranks"])
    shown = ranks
    if ranks.height > MAX_RANK_BARS:  # the idlest ranks first, where a stalled or starved rank would be
        shown = ranks.sort("idle_time_pctg", descending=True, nulls_last=True).head(MAX_RANK_BARS).sort("rank")
    st.caption(f"Share of each rank's kernel time (first to last device event of its Kineto trace) the GPU was idle, computing, or busy otherwise, "
               f"with {window}; Meta's Holistic Trace Analysis gives the same figures. "
               + (f"The {MAX_RANK_BARS} idlest of {ranks.height:,} ranks. " if shown.height < ranks.height else "")
               + (f"Analysed {tb['computed_at'][:16].replace('T', ' ')} UTC." if tb["stored"] else "Computed from the stored traces; the analysis has not run yet."))
    tparts = {"compute_time_pctg": "computing", "non_compute_time_pctg": "non-compute", "idle_time_pctg": "idle"}
    ui.chart(ui.stacked_parts(shown, "rank", tparts, alt.X("rank:O", title="Rank"), "Share of kernel time (%)"), height=240)
    st.dataframe(shown.select("rank", "kernel_time_us", "idle_time_pctg", "compute_time_pctg", "non_compute_time_pctg", "comp_comm_overlap_pctg"),
                 hide_index=True, column_config={
                     "kernel_time_us": st.column_config.NumberColumn("kernel time (µs)", format="%d"),
                     "idle_time_pctg": st.column_config.NumberColumn("idle %", format="%.2f"),
                     "compute_time_pctg": st.column_config.NumberColumn("compute %", format="%.2f"),
                     "non_compute_time_pctg": st.column_config.NumberColumn("non-compute %", format="%.2f"),
                     "comp_comm_overlap_pctg": st.column_config.NumberColumn("comm. under compute %", format="%.2f")})


def goodput_over_time(roll: dict, dev: dict) -> None:
    """Rolling goodput and step-time deviation beside the goodput panel: what ``GET /api/v1/jobs/{id}/goodput`` and
    ``fleetscope jobs goodput`` give (``services.job_reads.job_goodput``)."""
    left, right = st.columns(2)
    with left:
        st.markdown("**Rolling goodput**")
        if roll["why"]:
            st.caption(f"No windows: {roll['why']}.")
        else:
            ws = pl.DataFrame([{"window_start": w["window_start"], "goodput_ratio": w["goodput_ratio"], "productive_s": w["productive_s"],
                                **{f"{b}_s": v for b, v in w["badput_s"].items()}} for w in roll["windows"]])
            ws = ws.with_columns(pl.col("window_start").str.to_datetime(time_zone="UTC"))
            c = st.columns(2)
            c[0].metric("Newest window goodput", f"{ws['goodput_ratio'][-1]:.1%}", help="productive time / the window's time (the newest window may be shorter)")
            c[1].metric("Lowest window goodput", f"{ws['goodput_ratio'].min():.1%}")
            parts = {"productive_s": "productive", **{c: c[:-2].replace("_", " ") for c in ws.columns if c.endswith("_s") and c != "productive_s" and ws[c].sum() > 0}}
            ui.chart(ui.stacked_parts(ws, "window_start", parts, alt.X("window_start:T", title="Window start (UTC)", axis=alt.Axis(labelOverlap=True)),
                                      "Seconds per window"), height=220)
            length = f"{roll['window_s']:g} s" if roll["window_s"] < 120 else ui.fmt_duration(roll["window_s"])
            st.caption(f"Windows of {length} from the job's start, each at least {roll['window_steps']} ideal steps of "
                       f"{ui.fmt_duration(roll['ideal_step_time_s'])}; {roll['windows_total']} in all"
                       + (f", the newest {ws.height} shown." if ws.height < roll["windows_total"] else "."))
    with right:
        st.markdown("**Step-time deviation**")
        if dev["why"]:
            st.caption(f"No deviation: {dev['why']}.")
        else:
            c = st.columns(3)
            c[0].metric("Ideal step time", ui.fmt_duration(dev["ideal_step_time_s"]), help="mean of the step times not above median + 3 × MAD (ml-goodput-measurement)")
            c[1].metric("Anomalous steps", f"{dev['anomalous_steps']:,} of {dev['steps']:,}", help=f"step times above median + 3 × MAD, {ui.fmt_duration(dev['anomaly_threshold_s'])}")
            c[2].metric("Largest deviation", "+" + ui.fmt_duration(dev["max_deviation_s"]), help=f"at step {dev['max_deviation_step']}: its time − the ideal step time")
            if dev["last"]:
                steps = pl.DataFrame(dev["last"]).with_columns(anomalous=pl.col("step_time_s") > dev["anomaly_threshold_s"])
                ui.chart(alt.Chart(steps).mark_bar().encode(
                    x=alt.X("step:O", title="Step", axis=alt.Axis(labelOverlap=True)),
                    y=alt.Y("deviation_s:Q", title="Step time − ideal (s)"),
                    color=alt.Color("anomalous:N", scale=alt.Scale(domain=[False, True], range=["#1565c0", "#c62828"]), legend=None),
                    tooltip=["step", alt.Tooltip("step_time_s:Q", format=".3f", title="step time (s)"), alt.Tooltip("deviation_s:Q", format="+.3f", title="deviation (s)")],
                ), height=220)
                st.caption(f"The newest {len(dev['last']):,} of {dev['steps']:,} completed steps; red: anomalous, left out of the ideal.")


def interval_goodput(job_id: str, run_start: dt.datetime, run_end: dt.datetime) -> None:
    """Goodput within a span of the run picked on a slider: what ``GET /api/v1/jobs/{id}/goodput/interval`` and
    ``fleetscope jobs goodput --start --end`` give (``services.job_reads.interval_goodput``), computed now."""
    st.markdown("**Goodput in an interval**")
    step = max(dt.timedelta(seconds=1), (run_end - run_start) / 200)
    lo, hi = st.slider("Interval of the run (UTC)", min_value=run_start, max_value=run_end, value=(run_start, run_end), step=step,
                       format="YYYY-MM-DD HH:mm:ss", key="goodput_interval")
    if hi <= lo:
        st.caption("Pick an interval longer than zero.")
        return
    try:
        got = ui.q(jobs_svc.interval_goodput, live=False, job_id=job_id, start=lo, end=hi, now=run_end)
    except ValueError as exc:
        st.caption(str(exc))
        return
    c = st.columns(3)
    c[0].metric("Goodput in the interval", f"{got['goodput_ratio']:.1%}", help="productive time / the interval's overlap with the run (ml-goodput-measurement's interval goodput)")
    c[1].metric("Productive", ui.fmt_duration(got["productive_s"]))
    top = max(got["badput_s"].items(), key=lambda kv: (kv[1], kv[0]))
    c[2].metric("Largest badput", f"{top[0].replace('_', ' ')} {ui.fmt_duration(top[1])}" if top[1] else "none")
    st.caption(f"From {got['window_start'][:19]} to {got['window_end'][:19]} UTC, as of the last analysis; the API and "
               "`fleetscope jobs goodput --start --end` read a running job up to now.")


st.subheader("Goodput and badput")
gp = analyses.get("goodput")
if not gp or gp.get("total_s") is None:
    ui.no_data("no goodput for this job.", "The goodput analyzer needs the job's lifecycle events (started, step, checkpoint, failure, ...); `POST /api/v1/jobs/{id}/analyze` or the worker runs it.")
else:
    c = st.columns(4)
    c[0].metric("Runtime goodput", "—" if gp.get("goodput_ratio") is None else f"{gp['goodput_ratio']:.1%}", help="productive step time / wall time (ml-goodput-measurement's semantics)")
    sched = gp.get("scheduling_goodput_ratio")
    c[1].metric("Scheduling goodput", "—" if sched is None else f"{sched:.1%}", help="time holding its GPUs / time since it asked for them")
    c[2].metric("Disruptions", f"{gp.get('disruptions') or 0}")
    c[3].metric("Wall time", ui.fmt_duration(gp["total_s"]))
    badput = {k: v for k, v in (gp.get("badput_s") or {}).items() if v}
    # A waterfall from the wall time down to the productive time, one step per badput bucket.
    rows, level = [{"part": "wall time", "top_s": gp["total_s"], "bottom_s": 0.0, "kind": "total"}], gp["total_s"]
    for bucket, seconds in sorted(badput.items(), key=lambda kv: -kv[1]):
        rows.append({"part": bucket.replace("_", " "), "top_s": level, "bottom_s": level - seconds, "kind": "badput"})
        level -= seconds
    rows.append({"part": "productive", "top_s": gp.get("productive_s") or 0.0, "bottom_s": 0.0, "kind": "productive"})
    water = pl.DataFrame(rows).with_columns(seconds=pl.col("top_s") - pl.col("bottom_s"), order=pl.int_range(pl.len()))
    ui.chart(
        alt.Chart(water).mark_bar().encode(
            x=alt.X("part:N", title="Badput bucket", sort=alt.EncodingSortField("order")),
            y=alt.Y("top_s:Q", title="Wall time (s)"),
            y2="bottom_s:Q",
            color=alt.Color("kind:N", scale=alt.Scale(domain=["total", "badput", "productive"], range=["#9e9e9e", "#c62828", "#2e7d32"]), legend=None),
            tooltip=["part", alt.Tooltip("seconds:Q", format=".1f", title="seconds")],
        ),
        height=240,
    )
    mfu, product = gp.get("mfu_ratio"), gp.get("goodput_product_ratio")
    c = st.columns(2)
    c[0].metric("Program goodput (MFU)", "—" if mfu is None else f"{mfu:.1%}",
                help=("model FLOPs done / (peak × step time)" + (f", against the {gp.get('mfu_dtype')} dense peak of {gp.get('gpu_model')} (NVIDIA datasheet)" if mfu is not None else ": needs model_flops on the steps and a known GPU model")))
    c[1].metric("ML Productivity Goodput", "—" if product is None else f"{product:.1%}", help="scheduling × runtime × program goodput (Google Cloud)")
    st.caption(f"Computed {gp['computed_at']:%Y-%m-%d %H:%M} UTC." + ("" if gp.get("finished") else " The job had not finished: its time runs to then."))
    trend = ui.q(jobs_svc.job_goodput, live=False, job_id=job_id)
    if trend is not None:
        goodput_over_time(trend["rolling"], trend["step_time_deviation"])
    run_start, run_end = gp.get("window_start"), gp.get("window_end")
    if run_start is not None and run_end is not None and run_end > run_start:
        interval_goodput(job_id, run_start, run_end)

st.subheader("Scaling across runs")
model = meta_row["model_name"]
if not model:
    ui.no_data("this job names no model.", "Runs of one model at different world sizes give scaling efficiency and the Fleet Law fit.")
else:
    sf = ui.q(jobs_svc.scaling_fit, live=False, model_name=model)
    runs, fit, curve = sf["runs"], sf["fit"], sf["curve"]
    if runs.height < 2:
        ui.no_data(f"fewer than two runs of {model} with step records.", "Scaling efficiency needs runs at two world sizes, the Fleet Law fit three.")
    else:
        log2 = alt.Scale(type="log", base=2)
        x = alt.X("world_size:Q", title="World size N (GPUs)", scale=log2)
        measured = alt.Chart(runs).mark_point(filled=True, size=70, color="#1565c0")
        tips = ["job_id", "world_size", alt.Tooltip("step_time_mean_s:Q", format=".3f", title="T_step (s)"), alt.Tooltip("efficiency_ratio:Q", format=".2f", title="η")]
        if fit is not None and fit["a_s"] <= 0:
            st.warning(f"The Fleet Law does not fit these runs of {model} (fitted T_compute a = {fit['a_s']:.3g} s ≤ 0): their step times do not shrink "
                       "with N the way one model and global batch would, e.g. different batch sizes or a straggler in one run. Measured points and η only.")
            fit = None
        elif fit is None:
            ui.no_data(f"no Fleet Law fit: {sf['why']}.", "Scaling efficiency of the runs is shown.")
        if fit is None:
            t_chart = measured.encode(x=x, y=alt.Y("step_time_mean_s:Q", title="Mean step time T_step (s)"), tooltip=tips)
            e_chart = measured.encode(x=x, y=alt.Y("efficiency_ratio:Q", title="Scaling efficiency η (ratio)"), tooltip=tips)
        else:
            n_opt = fit["n_opt"]
            c = st.columns(5)
            c[0].metric("GPUs past which steps get slower", "none found" if n_opt == float("inf") else f"{n_opt:,.1f}" if n_opt < 100 else f"{n_opt:,.0f}",
                        help="N* where the fitted T_step(N) is smallest: beyond it adding GPUs makes every step slower")
            c[1].metric("T_compute (a)", ui.fmt_duration(fit["a_s"]), help="the part of a step that divides over N GPUs")
            c[2].metric("Growing cost (b per hop)", ui.fmt_duration(fit["b_s"]), help="cost per unit of the comm term 2(N−1): ring all-reduce latency, stragglers")
            c[3].metric("Fit R²", f"{fit['r2']:.3f}")
            mine = runs.filter(pl.col("job_id") == job_id)
            c[4].metric("η of this run", f"{mine['efficiency_ratio'][0]:.2f}" if mine.height else "—", help="T1 / (N · T_N), relative to the smallest run")
            st.caption(f"Runs of {model}, and the Fleet Law T_step(N) = a/N + b·2(N−1) + c fitted to them (a = {fit['a_s']:.3g} s, b = {fit['b_s']:.3g} s, "
                       f"c = {fit['c_s']:.3g} s). η = T1 / (N · T_N), relative to the smallest run.")
            line = alt.Chart(curve).mark_line(color="#9e9e9e", strokeDash=[5, 3])
            rule = []
            if n_opt != float("inf"):
                rule = [alt.Chart(pl.DataFrame({"world_size": [n_opt]})).mark_rule(color="#c62828").encode(x="world_size:Q",
                        tooltip=[alt.Tooltip("world_size:Q", format=",.0f", title="N* (GPUs)")])]
            t_chart = alt.layer(line.encode(x=x, y=alt.Y("step_time_s:Q", title="Mean step time T_step (s)")),
                                measured.encode(x=x, y="step_time_mean_s:Q", tooltip=tips), *rule)
            e_chart = alt.layer(line.encode(x=x, y=alt.Y("efficiency_ratio:Q", title="Scaling efficiency η (ratio)")),
                                measured.encode(x=x, y="efficiency_ratio:Q", tooltip=tips), *rule)
        c1, c2 = st.columns(2)
        with c1:
            ui.chart(t_chart, height=240)
        with c2:
            ui.chart(e_chart, height=240)
        st.dataframe(runs, hide_index=True, column_config={"efficiency_ratio": st.column_config.NumberColumn("η", format="%.2f")})

with st.expander(f"All jobs in the range ({jobs.height})"):
    st.dataframe(jobs, hide_index=True)

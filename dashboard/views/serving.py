"""Serving: per deployment, TTFT and TPOT quantiles over time against the recorded SLOs, budget left and burn
rates, throughput, queue and KV cache, energy and money per million output tokens, the crossover of serving
over training cost, and the findings of its replicas
and of the GPUs and hosts they ran on."""

from __future__ import annotations

import math

import altair as alt
import polars as pl
import streamlit as st

from dashboard import ui
from fleetscope.core.errors import NotFound
from fleetscope.services import serving as serving_svc

METRICS = {"ttft_seconds": "Time to first token", "request_tpot_seconds": "Time per output token (per request)",
           "inter_token_latency_seconds": "Inter-token latency", "e2e_latency_seconds": "End-to-end latency",
           "queue_time_seconds": "Queue time"}

f = ui.filters()
st.title("Serving")

replicas = ui.q(serving_svc.deployments, live=False)
if replicas.is_empty():
    ui.no_data("no inference server has been scraped.",
               "Point `fleetscope agent --serving http://POD:8000/metrics` at vLLM, SGLang, TGI, Triton or NIM replicas.")
    st.stop()

deps = replicas["deployment"].unique().sort().to_list()
dep = st.selectbox("Deployment", deps, key="serving_deployment")
mine = replicas.filter(pl.col("deployment") == dep)
st.caption(f"{mine.height} replica(s); server {', '.join(sorted({s for s in mine['server'] if s}))}; "
           f"hosts {', '.join(sorted({h for h in mine['host'] if h})) or 'not labelled'}")

slos = ui.q(serving_svc.slo_table, live=False, deployment=dep, now=f.end)
metric = st.selectbox("Latency", list(METRICS), format_func=METRICS.get, key="serving_metric")
span_s = max(60, int((f.end - f.start).total_seconds()))
step_s = max(60, span_s // 120)
lines = []
for qv in (0.5, 0.9, 0.99):
    pts = ui.q(serving_svc.quantiles_over_time, live=False, deployment=dep, metric=metric, q=qv, start=f.start, end=f.end,
               step_s=float(step_s), window_s=float(max(300, step_s)))
    if pts.height:
        lines.append(pts.filter(pl.col("value").is_not_nan()).with_columns(pl.lit(f"p{qv * 100:g}").alias("quantile")))
data = pl.concat(lines) if lines else pl.DataFrame()
if data.is_empty():
    ui.no_data(f"no {METRICS[metric].lower()} observations in this time range.")
else:
    chart = alt.Chart(data).mark_line().encode(x=ui.time_x(), y=alt.Y("value:Q", title=f"{METRICS[metric]} (s)"),
                                                color=alt.Color("quantile:N", title="Quantile"),
                                                tooltip=["ts:T", "quantile", alt.Tooltip("value:Q", format=".4f"), "capped"])
    limits = slos.filter((pl.col("metric") == metric) & pl.col("threshold_s").is_not_null()) if slos.height else slos
    if limits.height:
        rule = alt.Chart(limits.select("slo", "threshold_s")).mark_rule(strokeDash=[4, 4], color="red").encode(
            y="threshold_s:Q", tooltip=["slo", "threshold_s"])
        chart = alt.layer(chart, rule)
    ui.chart(chart)
    if data["capped"].any():
        st.caption("Some points lie past the histogram's last finite bucket: shown at that bound, the true value is higher.")

st.subheader("SLOs")
if slos.is_empty():
    ui.no_data("no SLO recorded for this deployment.", "Record one with `PUT /api/v1/serving/slos`.")
else:
    st.dataframe(slos, hide_index=True)

st.subheader("Throughput, queue and KV cache")
rates = ui.q(serving_svc.rates, live=False, deployment=dep, start=f.start, end=f.end)
c = st.columns(4)
gen = rates.filter(pl.col("metric") == "generation_tokens_total")["per_s"].sum() if rates.height else 0.0
fin = rates.filter(pl.col("metric").is_in(["requests_finished_total", "requests_succeeded_total"]))["per_s"].sum() if rates.height else 0.0
c[0].metric("Output tokens/s", f"{gen:,.1f}")
c[1].metric("Requests/s", f"{fin:,.2f}")
energy = ui.q(serving_svc.energy_per_token, live=False, deployment=dep, start=f.start, end=f.end)
kwh = energy.get("gpu_kwh_per_million_tokens")
c[2].metric("GPU kWh / M tokens", "—" if kwh is None or math.isnan(kwh) else f"{kwh:.3f}", help=f"basis: {energy.get('basis')}")
fac = energy.get("facility_kwh_per_million_tokens")
c[3].metric("Facility kWh / M tokens", "—" if fac is None or math.isnan(fac) else f"{fac:.3f}", help="GPU energy × the site's declared PUE")
if rates.height:
    st.dataframe(rates, hide_index=True)

st.subheader("Cost per token")
try:
    cost = ui.q(serving_svc.cost_per_token, live=False, deployment=dep, start=f.start, end=f.end)
except NotFound as exc:
    ui.no_data(str(exc), "Place the replicas' hosts at a site and record prices with `PUT /api/v1/serving/prices`.")
else:
    per_m = cost.get("cost_per_million_tokens")
    k = st.columns(3)
    k[0].metric("Cost / M output tokens", "—" if per_m is None or per_m != per_m else f"{per_m:,.2f} {cost.get('currency') or ''}")
    k[1].metric("GPU-hours held", f"{cost.get('gpu_hours', 0):,.2f}", help=f"unpriced: {cost.get('unpriced_gpu_hours', 0):,.2f}")
    k[2].metric("Facility energy (kWh)", f"{cost.get('energy_kwh', 0):,.2f}")
    if cost.get("note"):
        st.caption(cost["note"])
models = sorted({m for m in mine["model"] if m}) if "model" in mine.columns else []
for model in models:
    try:
        cross = ui.q(serving_svc.serving_vs_training_cost, live=False, model_name=model)
    except NotFound:
        st.caption(f"{model}: no training job of this model in the job inventory, so no serving-versus-training crossover.")
        continue
    when = cross.get("crossover_date")
    st.caption(f"{model}: training cost {cross.get('training_cost') or 0:,.2f}, serving so far {cross.get('serving_cost') or 0:,.2f} "
               f"{cross.get('currency') or ''}; " + (f"serving passes training on {when} ({cross.get('crossover_basis')})." if when
                                                     else "serving has not passed training, nor is it projected to."))

st.subheader("Findings")
found = ui.q(serving_svc.deployment_health, live=False, deployment=dep, start=f.start, end=f.end)
if found.is_empty():
    ui.no_data("no findings for this deployment, its GPUs or its hosts in this time range.")
else:
    st.dataframe(found.select("kind", "subject", "severity", "summary", "window_start"), hide_index=True)

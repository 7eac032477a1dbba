"""Overview: is the fleet healthy and busy right now, what does it draw, what runs on it."""

from __future__ import annotations

import datetime as dt

import altair as alt
import polars as pl
import streamlit as st

from dashboard import ui
from fleetscope.services.alerting import reads as alert_reads
from fleetscope.services import catalog, energy_rollup
from fleetscope.services import energy_reads as energy_reads
from fleetscope.services import health_reads
from fleetscope.services import job_reads as jobs_svc
from fleetscope.services import telemetry

f = ui.filters()
st.title("Fleet overview")

STATUS_COLORS = alt.Scale(domain=["ok", "hot", "silent", "unhealthy"], range=["#2e7d32", "#f9a825", "#9e9e9e", "#c62828"])


def live_panel() -> None:
    state = ui.q(health_reads.live_state, end=ui.live_end(f), site=f.site)
    size = state["size"]
    counts = state["counts"].row(0, named=True)
    gpus = int(size["gpus"][0]) if size.height else 0
    if gpus == 0 and counts["reporting"] == 0:
        ui.no_data("no GPUs in the inventory and no GPU telemetry.", "Point dcgm-exporter or the agent at the API, or run `fleetscope demo`.")
        return
    power = state["power"].row(0, named=True)
    cols = st.columns(6)
    cols[0].metric("GPUs", f"{max(gpus, counts['gpus']):,}", help="GPUs in the inventory (or reporting, if more)")
    cols[1].metric("Busy", f"{counts['busy']:,}", help="mean utilisation ≥ 10 % over the last 5 min")
    cols[2].metric("Idle", f"{counts['idle']:,}")
    cols[3].metric("Unhealthy", f"{counts['unhealthy']:,}", help="XID, ECC, row remap, NVLink or SDC event in the last hour")
    cols[4].metric("Silent", f"{counts['silent']:,}", help="in the inventory, no sample in the last 5 min")
    cols[5].metric("Power now", ui.fmt_power(power["power_w"]), help=f"sum of {power['gpus_reporting']:,} GPUs' latest power")

    st.subheader("Host × GPU health")
    grid = state["grid"]
    if grid.is_empty():
        ui.no_data("no GPU in the inventory or reporting.")
        return
    hosts = grid["host"].n_unique()
    st.caption(f"Latest sample per GPU; worst hosts first ({hosts} shown). Hover for temperature, power and XID.")
    heat = (
        alt.Chart(grid)
        .mark_rect(stroke="white", strokeWidth=1)
        .encode(
            x=alt.X("gpu_index:O", title="GPU index"),
            y=alt.Y("host:N", title="Host", sort=None),
            color=alt.Color("status:N", scale=STATUS_COLORS, title="Status"),
            tooltip=[
                "host:N",
                alt.Tooltip("gpu_index:O", title="GPU"),
                "gpu_uuid:N",
                "status:N",
                alt.Tooltip("temp_c:Q", title="Temperature (°C)", format=".0f"),
                alt.Tooltip("power_w:Q", title="Power (W)", format=".0f"),
                alt.Tooltip("xid_last:Q", title="Last XID"),
                alt.Tooltip("events:Q", title="Health events (1 h)"),
            ],
        )
    )
    ui.chart(heat, height=min(900, 40 + 22 * hosts))


# Whole hours older than this are settled: the counters' readings after their end have arrived.
SETTLE = ui.SETTLE


def energy_today(end: dt.datetime) -> tuple[pl.DataFrame, str]:
    """GPU energy and location-based CO2e per site and hour since 00:00 UTC, and where it came from.

    From the GPUs' energy counters, each settled hour read once and kept (``ui.q(settled=True)``), the
    hour under way read live: a day of a 16k-GPU fleet costs one hour's probes per visit, not a day's. A
    settled hour the worker's energy roll-up has summed per site is read from those sums (a few hundred rows
    instead of two probes of every GPU). GPUs without an energy counter (power only) have no counter
    readings: the worker's roll-up, which integrates their power, stands in."""
    day_start = dt.datetime.combine(end.date(), dt.time(), dt.UTC)
    live_from = max(day_start, (end - SETTLE).replace(minute=0, second=0, microsecond=0))
    hours = [day_start + dt.timedelta(hours=i) for i in range(int((live_from - day_start).total_seconds() // 3600))]
    rolled = ui.q(energy_reads.rolled_energy_by_site_hour, settled=True, start=day_start, end=live_from, site=f.site) if hours else pl.DataFrame()
    done = set(rolled["hour"].to_list()) if rolled.height else set()
    parts = [rolled] + [ui.q(energy_reads.counter_energy_by_site_hour, settled=True, start=h, end=h + dt.timedelta(hours=1), site=f.site)
                        for h in hours if h not in done]
    parts.append(ui.q(energy_reads.counter_energy_by_site_hour, live=False, start=live_from, end=end, site=f.site))
    parts = [p for p in parts if p.height]
    if parts:
        return pl.concat(parts), "the GPUs' energy counters" + (" (whole hours past through the worker's per-site roll-up of them)" if done else "")
    upto = ui.q(energy_rollup.energy_rollup_end, live=False)
    if upto is None or min(end, upto) <= day_start:
        return pl.DataFrame(), ""
    # Ending at the roll-up's newest minute keeps one cache entry per roll-up, not one per window end.
    return ui.q(energy_reads.energy_by_site_hour, live=False, start=day_start, end=min(end, upto), site=f.site), f"the energy roll-up (to {upto:%H:%M} UTC)"


# A first visit's reads, all at once (ui.prefetch): the panels below then draw from the cache.
ui.prefetch(
    lambda: ui.q(health_reads.live_state, end=ui.live_end(f), site=f.site),
    lambda: energy_today(f.end),
    lambda: ui.q(jobs_svc.running_jobs, end=f.end, site=f.site),
    lambda: ui.q(alert_reads.alerts, include_resolved=False),
    lambda: ui.fleet_series(f),
)
ui.live(live_panel)

left, right = st.columns(2)
with left:
    st.subheader("Energy and CO2e today")
    energy, source = energy_today(f.end)
    if energy.is_empty():
        ui.no_data("no GPU energy today.", "It comes from the GPUs' energy counters, or the worker's energy roll-up (`fleetscope worker` and `fleetscope beat`).")
    else:
        kg = energy["kgco2e"].drop_nulls()
        c1, c2 = st.columns(2)
        c1.metric("GPU energy today (UTC)", ui.fmt_energy(float(energy["energy_j"].sum())), help="facility overhead (PUE) not included")
        c2.metric("CO2e today", "—" if kg.is_empty() else f"{float(kg.sum()):,.1f} kg",
                  help="location-based: each hour's energy × its site's grid intensity (hourly where the grid's series cover the hour, else annual)")
        bases = sorted(set(energy["intensity_basis"].drop_nulls().to_list()))
        st.caption(f"From {source}. Grid intensity: {'; '.join(bases) or 'none (no site in the inventory)'}. Market-based figures are on the Energy & Carbon page.")
with right:
    st.subheader("Jobs running")
    running = ui.q(jobs_svc.running_jobs, end=f.end, site=f.site)
    if running.is_empty():
        ui.no_data("no job is running.")
    else:
        st.dataframe(
            running.select("job_id", "name", "model_name", "world_size", "started_at", "goodput_ratio"),
            hide_index=True,
            column_config={
                "goodput_ratio": st.column_config.ProgressColumn("Goodput", min_value=0.0, max_value=1.0, format="percent"),
                "world_size": st.column_config.NumberColumn("GPUs"),
                "started_at": ui.utc_column("Started", seconds=False),
            },
        )
        if running["goodput_ratio"].null_count() == running.height:
            st.caption("Goodput shows once the goodput analyzer has run on these jobs (the worker runs it on active jobs).")

st.subheader("Firing alerts")
firing = ui.q(alert_reads.alerts, include_resolved=False).filter(pl.col("state") == "firing")
if firing.is_empty():
    ui.no_data("no alert is firing.", "The Alerts page lists pending and resolved alerts, silences and deliveries.")
else:
    st.dataframe(firing.select("alertname", "severity", "summary", "fired_at", "silenced_by"), hide_index=True,
                 column_config={"fired_at": ui.utc_column("Fired", seconds=False)})

st.subheader("Fleet power and utilisation")
series = ui.fleet_series(f)
if series.is_empty():
    ui.no_data("no GPU telemetry in this time range.")
else:
    st.caption(f"{series.height} points, each the fleet's state over one sample interval.")
    power = alt.Chart(series.with_columns(power_kw=pl.col("power_w") / 1e3)).mark_line().encode(
        x=ui.time_x(), y=alt.Y("power_kw:Q", title="GPU power (kW)"), tooltip=[alt.Tooltip("ts:T", title="UTC"), alt.Tooltip("power_kw:Q", format=".1f", title="kW")]
    )
    busy = alt.Chart(series).mark_area(opacity=0.6).encode(
        x=ui.time_x(), y=alt.Y("gpus_busy:Q", title="Busy GPUs (count)"), tooltip=[alt.Tooltip("ts:T", title="UTC"), "gpus_busy:Q", "gpus_reporting:Q"]
    )
    c1, c2 = st.columns(2)
    with c1:
        ui.chart(power, height=240)
    with c2:
        ui.chart(busy, height=240)

with st.expander("Data held"):
    st.dataframe(ui.q(telemetry.table_rows, live=False), hide_index=True)
    st.caption("Large telemetry tables show an estimate (approximate = true).")

with st.expander("What the service runs"):
    # the analyzer registry: every analysis per job and per fleet window, in the order it runs
    st.dataframe(pl.DataFrame([{**r, **{k: ", ".join(r[k]) for k in ("modules", "needs", "reads", "writes")}} for r in catalog.analyses()]),
                 hide_index=True)

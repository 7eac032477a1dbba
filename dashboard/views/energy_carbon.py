"""Energy & Carbon: GPU energy by site, power over time, PUE over time, location- and market-based carbon, energy by
job and model, embodied emissions."""

from __future__ import annotations

import altair as alt
import polars as pl
import streamlit as st

from dashboard import ui
from fleetscope.services import energy_reads as energy_reads


def _kg(kg: float) -> str:
    return f"{kg / 1000:.2f} t" if kg >= 1000 else f"{kg:.1f} kg"


f = ui.filters()
st.title("Energy & Carbon")

# A first visit's reads, all at once (ui.prefetch): the sections below then draw from the cache.
_window = {"start": f.start, "end": f.end, "site": f.site}
ui.prefetch(
    lambda: ui.q(energy_reads.gpu_energy, live=False, **_window),
    lambda: ui.q(energy_reads.rollup_power, live=False, **_window, bucket_s=ui.bucket_for(f.range_s)),
    lambda: ui.q(energy_reads.pue_over_time, live=False, **_window, bucket_s=ui.bucket_for(f.range_s)),
    lambda: ui.q(energy_reads.site_carbon, live=False, **_window),
    lambda: ui.q(energy_reads.energy_by_job_and_model, live=False, **_window, limit=50),
    lambda: ui.q(energy_reads.embodied_by_site, live=False, **_window),
)

st.subheader("GPU energy by site")
energy = ui.q(energy_reads.gpu_energy, live=False, start=f.start, end=f.end, site=f.site)
if energy.is_empty():
    ui.no_data("no GPU energy counters in this time range.")
else:
    energy = energy.with_columns(energy_kwh=pl.col("energy_j") / 3.6e6, site_id=pl.col("site_id").fill_null("(no site)"))
    c1, c2 = st.columns([1, 2])
    c1.metric("GPU energy in range", ui.fmt_energy(float(energy["energy_j"].sum())), help="from the GPUs' energy counters; facility overhead not included")
    with c2:
        ui.chart(
            alt.Chart(energy).mark_bar().encode(
                y=alt.Y("site_id:N", title="Site"), x=alt.X("energy_kwh:Q", title="GPU energy (kWh)"), tooltip=["site_id", "gpus", alt.Tooltip("energy_kwh:Q", format=".1f")]
            ),
            height=max(100, 40 * energy.height),
        )

st.subheader("GPU power over time")
# From the per-site roll-up where the worker has written it (a day of a large fleet is a few thousand
# rows); where it has not, from the Overview's probes of the fleet (the same cached ones).
series = ui.q(energy_reads.rollup_power, live=False, start=f.start, end=f.end, site=f.site, bucket_s=ui.bucket_for(f.range_s))
by_site = not series.is_empty()
if not by_site:
    series = ui.fleet_series(f)
if series.is_empty():
    ui.no_data("no GPU telemetry in this time range.")
else:
    series = series.with_columns(power_kw=pl.col("power_w") / 1e3)
    color = alt.Color("site_id:N", title="Site") if by_site else alt.value("#4c78a8")
    ui.chart(
        alt.Chart(series).mark_area(opacity=0.7).encode(
            x=ui.time_x(), y=alt.Y("power_kw:Q", title="GPU power (kW)", stack=True), color=color,
            tooltip=[alt.Tooltip("ts:T", title="UTC"), *(["site_id"] if by_site else []), alt.Tooltip("power_kw:Q", format=".1f")],
        ),
        height=220,
    )
    st.caption("Mean GPU power per bucket from the energy roll-up, by site." if by_site else
               "GPU power at evenly spaced instants, from the samples (no energy roll-up covers this range yet).")

st.subheader("PUE over time")
pue = ui.q(energy_reads.pue_over_time, live=False, start=f.start, end=f.end, site=f.site, bucket_s=ui.bucket_for(f.range_s))
if pue.is_empty():
    ui.no_data("no facility and IT meter readings in this time range.",
               "PUE is facility energy over IT energy (ISO/IEC 30134-2) from `facility_power_w` / `facility_energy_j` and "
               "`it_power_w` / `it_energy_j` series labelled with the site; sites without meters use their declared PUE.")
else:
    pue = pue.with_columns(pl.format("{} (PUE{})", pl.col("site_id"), pl.col("category")).alias("site"))
    ui.chart(
        alt.Chart(pue).mark_line(point=True).encode(
            x=ui.time_x(), y=alt.Y("pue:Q", title="PUE (ratio)", scale=alt.Scale(zero=False)), color=alt.Color("site:N", title="Site (category)"),
            tooltip=["site_id", alt.Tooltip("ts:T", title="UTC"), alt.Tooltip("pue:Q", format=".3f"), "category"],
        ),
        height=220,
    )
    st.caption("PUE1: IT energy metered at the UPS output, PUE2: at the PDU output, PUE3: at the IT equipment input. "
               "Values over less than a year are interim under ISO/IEC 30134-2.")

st.subheader("Carbon: location- vs market-based")
carbon = ui.q(energy_reads.site_carbon, live=False, start=f.start, end=f.end, site=f.site)
if carbon.is_empty():
    ui.no_data("no energy roll-ups in this time range.", "Location-based (grid intensity) and market-based (contractual instruments, "
               "recorded with `fleetscope energy instrument`) CO2e per site come from the per-minute GPU energy roll-ups.")
else:
    c1, c2, c3 = st.columns(3)
    c1.metric("Location-based CO2e", _kg(float(carbon["location_kgco2e"].sum())), help="energy × the grid intensity of its hour and site")
    c2.metric("Market-based CO2e", _kg(float(carbon["market_kgco2e"].sum())),
              help="energy covered by PPAs, certificates or supplier rates × their factors; the rest at the location-based average (no residual mix ships)")
    c3.metric("Covered by instruments", f"{float(carbon['covered_kwh'].sum()) / max(float(carbon['energy_kwh'].sum()), 1e-12):.0%}")
    long = carbon.select("site_id", pl.col("location_kgco2e").alias("location-based"), pl.col("market_kgco2e").alias("market-based")).unpivot(
        index="site_id", variable_name="method", value_name="kgco2e")
    ui.chart(
        alt.Chart(long).mark_bar().encode(
            y=alt.Y("site_id:N", title="Site"), yOffset="method:N", x=alt.X("kgco2e:Q", title="kgCO2e"),
            color=alt.Color("method:N", title="Scope 2"), tooltip=["site_id", "method", alt.Tooltip("kgco2e:Q", format=".2f")],
        ),
        height=max(120, 60 * carbon.height),
    )
    st.dataframe(carbon, hide_index=True)

st.subheader("Energy by job and model")
by_job, by_model = ui.q(energy_reads.energy_by_job_and_model, live=False, start=f.start, end=f.end, site=f.site, limit=50)
if by_job.is_empty():
    ui.no_data("no per-job energy in this time range.", "Jobs get their share of their GPUs' energy once the roll-up has run over "
               "minutes in which the scheduler's rank-to-GPU assignments place them.")
else:
    c1, c2 = st.columns(2)
    with c1:
        top = by_job.head(15).with_columns(energy_kwh=pl.col("energy_j") / 3.6e6)
        ui.chart(
            alt.Chart(top).mark_bar().encode(
                y=alt.Y("job_id:N", title="Job", sort="-x"), x=alt.X("energy_kwh:Q", title="GPU energy (kWh)"), color=alt.Color("kind:N", title="Kind"),
                tooltip=["job_id", "model_name", "kind", alt.Tooltip("energy_kwh:Q", format=".1f"), alt.Tooltip("gpu_hours:Q", format=".1f"),
                         alt.Tooltip("location_kgco2e:Q", format=".2f")],
            ),
            height=max(120, 24 * top.height),
        )
    with c2:
        models = by_model.with_columns(energy_kwh=pl.col("energy_j") / 3.6e6, model_name=pl.col("model_name").fill_null("(no model)"))
        ui.chart(
            alt.Chart(models).mark_bar().encode(
                y=alt.Y("model_name:N", title="Model", sort="-x"), x=alt.X("energy_kwh:Q", title="GPU energy (kWh)"),
                color=alt.Color("kind:N", title="Kind"), tooltip=["model_name", "kind", "jobs", alt.Tooltip("energy_kwh:Q", format=".1f")],
            ),
            height=max(120, 30 * models.height),
        )
    st.dataframe(by_job.with_columns(energy_kwh=pl.col("energy_j") / 3.6e6).select(
        "job_id", "model_name", "kind", "energy_kwh", "gpu_hours", "gpus", "location_kgco2e", "embodied_kgco2e"), hide_index=True)

st.subheader("Embodied emissions")
emb = ui.q(energy_reads.embodied_by_site, live=False, start=f.start, end=f.end, site=f.site)
if emb.is_empty():
    ui.no_data("no GPU-hours rolled up in this time range.")
else:
    c1, c2 = st.columns([1, 2])
    c1.metric("Embodied CO2e in range", _kg(float(emb["embodied_kgco2e"].sum())), help=emb["embodied_basis"][0])
    with c2:
        ui.chart(
            alt.Chart(emb).mark_bar().encode(
                y=alt.Y("site_id:N", title="Site"), x=alt.X("embodied_kgco2e:Q", title="Embodied kgCO2e (amortised)"),
                tooltip=["site_id", alt.Tooltip("gpu_hours:Q", format=".1f"), alt.Tooltip("embodied_kgco2e:Q", format=".2f")],
            ),
            height=max(100, 40 * emb.height),
        )
    st.caption("Manufacturing emissions of GPUs and servers spread over their service life by hours used (Luccioni et al., BLOOM); "
               "reported apart from Scope 2.")

"""Teams & Cost: who holds the fleet's GPUs and what it costs. Per team, GPU-hours allocated and used (busy share
from telemetry), energy, CO2e and cost over the range and over time; idle allocations with their cost; this
month's budgets and quotas; stranded capacity; queue wait per
partition, pending reasons and end states; the jobs that cost the most. Scheduler jobs come from Slurm (sacct,
squeue, slurmrestd) and Kubernetes (kube-state-metrics); teams from the mapping set with ``PUT /api/v1/teams/mappings``."""

from __future__ import annotations

import altair as alt
import polars as pl
import streamlit as st

from dashboard import ui
from fleetscope.services import scheduler_capacity, team_costs

UNASSIGNED = "(unassigned)"


def _money(df: pl.DataFrame, col: str) -> str:
    """A sum of money in its currency; several currencies are never added up (no exchange rates are kept)."""
    priced = df.filter(pl.col(col).is_not_null()) if df.height else df
    if not priced.height:
        return "—"
    currencies = sorted({c for c in priced["currency"].to_list() if c})
    if len(currencies) > 1:
        return ", ".join(f"{priced.filter(pl.col('currency') == c)[col].sum():,.2f} {c}" for c in currencies)
    return f"{priced[col].sum():,.2f} {currencies[0] if currencies else ''}".rstrip()


f = ui.filters()
st.title("Teams & Cost")

# A first visit's independent reads at once (ui.prefetch); the sections below then draw from the cache.
step_s = ui.bucket_for(f.range_s)
month = f"{f.end.year:04d}-{f.end.month:02d}"
ui.prefetch(
    lambda: ui.q(team_costs.usage_and_top_jobs, live=False, start=f.start, end=f.end, limit=20),
    lambda: ui.q(team_costs.usage_over_time, live=False, start=f.start, end=f.end, step_s=step_s),
    lambda: ui.q(scheduler_capacity.queue, live=False, start=f.start, end=f.end),
    lambda: ui.q(scheduler_capacity.idle_allocations, live=False, start=f.start, end=f.end),
    lambda: ui.q(team_costs.budget_status, live=False, month=month, now=f.end),
    lambda: ui.q(scheduler_capacity.stranded_capacity, live=False, now=f.end),
)

# totals and top jobs from one working-out of the period's job costs
usage, top = ui.q(team_costs.usage_and_top_jobs, live=False, start=f.start, end=f.end, limit=20)
queue = ui.q(scheduler_capacity.queue, live=False, start=f.start, end=f.end)
if usage.is_empty() and not any(queue.values()):
    ui.no_data("no scheduler job in this time range.",
               "Ingest `sacct -P`, `squeue --json`, slurmrestd or kube-state-metrics output with `fleetscope ingest`, or poll "
               "slurmrestd with `fleetscope agent --slurm URL`; map accounts and namespaces to teams with `fleetscope teams map`.")
    st.stop()
if f.site:
    st.caption(f"Teams and queues cover every site (the site filter, {f.site}, applies to the top jobs only).")

usage = usage.with_columns(pl.col("team").fill_null(UNASSIGNED)) if usage.height else usage
c = st.columns(4)
c[0].metric("Teams", f"{usage.filter(pl.col('team') != UNASSIGNED).height}" if usage.height else "0",
            help=f"{UNASSIGNED}: jobs no team rule matches")
c[1].metric("GPU-hours allocated", f"{usage['gpu_hours'].sum():,.1f}" if usage.height else "0.0")
used = usage.filter(pl.col("used_gpu_hours").is_not_null()) if usage.height else usage
c[2].metric("GPU-hours used", f"{used['used_gpu_hours'].sum():,.1f}" if used.height else "—",
            help="allocated GPU-hours × the busy share of the GPUs' telemetry, where telemetry names the job's GPUs")
c[3].metric("Cost", _money(usage, "cost") if usage.height else "—", help="GPU-hours at the price book's GPU-hour price plus energy at its tariff")

st.subheader("Usage and cost per team")
if usage.is_empty():
    ui.no_data("no job held GPUs in this time range.")
else:
    carbon = [c for c in ("location_kgco2e", "market_kgco2e") if c in usage.columns]
    st.dataframe(usage.select("team", "jobs", "gpu_hours", "used_gpu_hours", "busy_share", "energy_kwh", *carbon, "cost", "currency"), hide_index=True,
                 column_config={"gpu_hours": st.column_config.NumberColumn("GPU-hours", format="%.2f"),
                                "location_kgco2e": st.column_config.NumberColumn("kgCO2e (location)", format="%.1f"),
                                "market_kgco2e": st.column_config.NumberColumn("kgCO2e (market)", format="%.1f"),
                                "used_gpu_hours": st.column_config.NumberColumn("used GPU-hours", format="%.2f"),
                                "busy_share": st.column_config.NumberColumn("busy share", format="percent"),
                                "energy_kwh": st.column_config.NumberColumn("energy (kWh)", format="%.1f"),
                                "cost": st.column_config.NumberColumn("cost", format="%.2f")})

st.subheader("GPU-hours per team over time")
over = ui.q(team_costs.usage_over_time, live=False, start=f.start, end=f.end, step_s=step_s)
if over.is_empty():
    ui.no_data("no job held GPUs in this time range.")
else:
    over = over.with_columns(pl.col("team").fill_null(UNASSIGNED))
    ui.chart(alt.Chart(over).mark_bar().encode(
        x=ui.time_x("bucket_start"), y=alt.Y("gpu_hours:Q", title="GPU-hours allocated", stack=True), color=alt.Color("team:N", title="Team"),
        tooltip=[alt.Tooltip("bucket_start:T", title="UTC"), "team", "jobs", alt.Tooltip("gpu_hours:Q", format=".2f"),
                 alt.Tooltip("gpu_cost:Q", format=".2f"), "currency"]), height=240)
    st.caption(f"Per {ui.fmt_duration(step_s)}: the GPU-hours each team's jobs held and their GPU-hour price "
               f"({_money(over, 'gpu_cost')} in all); energy is priced in the table above.")

st.subheader("Idle allocations")
idle = ui.q(scheduler_capacity.idle_allocations, live=False, start=f.start, end=f.end)
if idle.is_empty():
    ui.no_data("no job or pod held GPUs idle past the threshold in this time range.",
               "The health sweep flags GPUs at or under 5 % utilisation for FLEETSCOPE_IDLE_ALLOCATION_MIN_S (30 minutes by default).")
else:
    k = st.columns(2)
    k[0].metric("Idle GPU-hours", f"{idle['idle_gpu_hours'].sum():,.2f}")
    k[1].metric("Their cost", _money(idle, "idle_cost"))
    st.dataframe(idle.select("subject", "team", "account", "gpus_idle", "hosts", "idle_since", "idle_gpu_hours", "idle_cost", "currency"),
                 hide_index=True, column_config={"idle_since": ui.utc_column("idle since"),
                                                 "idle_gpu_hours": st.column_config.NumberColumn("idle GPU-hours", format="%.2f"),
                                                 "idle_cost": st.column_config.NumberColumn("idle cost", format="%.2f")})

st.subheader("Budgets this month")
budgets = ui.q(team_costs.budget_status, live=False, month=month, now=f.end)
if budgets.is_empty():
    st.caption(f"No team has a GPU-hour quota or money budget for {month}: set one with `fleetscope teams budget TEAM` or "
               "`PUT /api/v1/teams/budgets` (admin); the health sweep then pages when a team is over or on course to exceed it.")
else:
    over = budgets.filter((pl.col("quota_status") == "over") | (pl.col("budget_status") == "over"))
    st.metric("Teams over budget or quota", f"{over.height} of {budgets.height}")
    st.dataframe(budgets.select("team", "gpu_hours", "gpu_hour_quota", "projected_gpu_hours", "quota_status", "cost", "budget", "currency",
                                "projected_cost", "budget_status", "note"), hide_index=True,
                 column_config={c: st.column_config.NumberColumn(c.replace("_", " "), format="%.2f")
                                for c in ("gpu_hours", "gpu_hour_quota", "projected_gpu_hours", "cost", "budget", "projected_cost")})
    st.caption(f"{month} so far, projected to the month's end at the rate so far (no projection on its first day).")

st.subheader("Stranded capacity")
stranded = ui.q(scheduler_capacity.stranded_capacity, live=False, now=f.end)
if not stranded["stranded_gpus"]:
    st.caption("No free GPU is stranded: every node with free GPUs can take some pending job of its partitions, or nothing is pending.")
else:
    k = st.columns(2)
    k[0].metric("Stranded GPUs", f"{stranded['stranded_gpus']:,}",
                help="free GPUs on nodes where no pending job of their partitions fits (too few free GPUs or CPUs on the node)")
    k[1].metric("Their cost per hour", f"{stranded['cost_per_hour']:,.2f} {stranded['currency']}" if stranded["cost_per_hour"] is not None else "—")
    st.dataframe(stranded["partitions"], hide_index=True)

st.subheader("Queue wait per partition")
waits = pl.DataFrame(queue["queue_wait"]) if queue["queue_wait"] else pl.DataFrame()
if waits.height:  # Kubernetes pods and jobs whose scheduler names none
    waits = waits.with_columns(pl.col("partition").cast(pl.String).fill_null("(no partition)"))
if waits.is_empty():
    ui.no_data("no job started or pending in this time range.")
else:
    st.dataframe(waits, hide_index=True, column_config={
        c: st.column_config.NumberColumn(c.replace("_s", " (s)").replace("_", " "), format="%.0f") for c in ("mean_wait_s", "median_wait_s", "p90_wait_s", "max_wait_s")})
    st.caption("Wait from when a job became eligible (its submit time where the scheduler gives none) to its start.")
cols = st.columns(2)
with cols[0]:
    st.markdown("**Pending, by reason**")
    if queue["pending_reasons"]:
        st.dataframe(pl.DataFrame(queue["pending_reasons"]), hide_index=True)
    else:
        ui.no_data("no job is pending.")
with cols[1]:
    st.markdown("**End states**")
    if queue["outcomes"]:
        st.dataframe(pl.DataFrame(queue["outcomes"]).select("state", "outcome", "reliability", "jobs", "gpu_hours"), hide_index=True,
                     column_config={"gpu_hours": st.column_config.NumberColumn("GPU-hours", format="%.2f")})
        st.caption("Preemptions are planned interruptions; node failures and out-of-memory ends count against reliability.")
    else:
        ui.no_data("no job ended in this time range.")

st.subheader("Top jobs by cost")
if f.site and top.height:
    top = top.filter(pl.col("site_id") == f.site)
if top.is_empty():
    ui.no_data("no job held GPUs in this time range" + (f" at {f.site}." if f.site else "."))
else:
    st.dataframe(top.with_columns(pl.col("team").fill_null(UNASSIGNED)).select(
        "cluster", "job_id", "team", "account", "user", "partition", "state", "site_id", "gpu_model", "gpu_hours", "used_gpu_hours",
        "energy_kwh", "cost", "currency"), hide_index=True,
        column_config={"gpu_hours": st.column_config.NumberColumn("GPU-hours", format="%.2f"),
                       "used_gpu_hours": st.column_config.NumberColumn("used GPU-hours", format="%.2f"),
                       "energy_kwh": st.column_config.NumberColumn("energy (kWh)", format="%.2f"),
                       "cost": st.column_config.NumberColumn("cost", format="%.2f")})

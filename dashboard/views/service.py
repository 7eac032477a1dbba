"""Service: the pipeline watching itself (``fleetscope.services.pipeline``): whether ingest is arriving, how far
the energy roll-up, the minute and hour tiers and the jobs' hours are behind, closed days waiting to be packed, beat's
leader, each scheduled task's last outcomes, and what the store holds per table."""

from __future__ import annotations

import datetime as dt

import polars as pl
import streamlit as st

from dashboard import ui
from fleetscope.services import pipeline

st.title("Service")
st.caption("The service's own pipeline, read from its watermarks and the database's catalogue "
           "(the same figures as `fleetscope db status` and `GET /api/v1/fleet/pipeline`).")


def body() -> None:
    now = dt.datetime.now(dt.UTC)
    report = ui.q(pipeline.status, fresh=True, now=now)
    ing, beat = report["ingest"], report["beat"]
    c = st.columns(4)
    c[0].metric("Last push", "never" if ing["last_push_at"] is None else f"{ui.fmt_age((now - ing['last_push_at']).total_seconds())} ago")
    c[1].metric("Values/s", f"{ing['values_per_s']:,.0f}", help=f"over the last {ing['recent_s']:g} s, from the ingest log")
    late = [st_["stage"] for st_ in report["stages"] if st_["late"]]
    c[2].metric("Roll-ups", "late: " + ", ".join(late) if late else "keeping up")
    c[3].metric("Beat", "leading" if beat["leading"] else "no leader", help=beat["holder"] or "no beat has held the lease")
    if late:
        st.warning(f"Behind by more than their allowance: {', '.join(late)}. Panels over recent time read raw rows until they catch up; "
                   "check that `fleetscope worker` and `fleetscope beat` run (the tasks below say when each last succeeded).")
    if not beat["leading"]:
        st.warning("No beat holds the leader lease: scheduled analyses, roll-ups and retention are not being sent. Start `fleetscope beat`.")

    st.subheader("Roll-up stages")
    stages = pl.DataFrame([{"stage": s["stage"], "rolled to": s["rolled_to"],
                            "behind": None if s["lag_s"] is None else ui.fmt_age(s["lag_s"]),
                            "allowed": ui.fmt_age(s["allowed_lag_s"]), "late": s["late"]} for s in report["stages"]])
    st.dataframe(stages, hide_index=True)
    pending = report["packing_pending_days"]
    energy_pending = report["energy_packing_pending_days"]
    st.caption(f"Closed days waiting to be packed: {', '.join(pending) if pending else 'none'}; of energy minutes: "
               f"{', '.join(energy_pending) if energy_pending else 'none'} (PostgreSQL packs each closed day once the tiers and the energy roll-up have passed it).")
    if report["packing_overdue_hours"]:
        st.warning(f"Hours of the day under way still raw an hour after they should have been packed: {', '.join(report['packing_overdue_hours'])}. "
                   "Beat's raw-packing tick missed or failed them (its last outcome is in the tasks below); they stay readable as rows.")

    st.subheader("Scheduled tasks")
    if not report["tasks"]:
        ui.no_data("no task runs recorded.", "Workers record each task's outcome once `fleetscope worker` runs them.")
    else:
        st.dataframe(pl.DataFrame(report["tasks"]), hide_index=True)

    st.subheader("Storage")
    sizes = pl.DataFrame(ui.q(pipeline.storage, fresh=True), schema={"table": pl.String, "bytes": pl.Int64, "rows_estimate": pl.Int64, "partitions": pl.Int64})
    st.dataframe(sizes.with_columns((pl.col("bytes") / 2**20).round(1).alias("MiB")).select("table", "MiB", "rows_estimate", "partitions"), hide_index=True)


ui.live(body)

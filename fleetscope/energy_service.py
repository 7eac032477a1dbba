"""Energy against the store: per-minute GPU roll-ups written incrementally, and energy / carbon reports
read from those roll-ups (never from raw telemetry of a whole fleet)."""

from __future__ import annotations

import datetime as dt
from typing import Any

import polars as pl

from analyzers import carbon, energy
from fleetscope import frames as F
from fleetscope.observability import tracer
from fleetscope.store import Store

# Samples read either side of a window so every minute inside it has interval endpoints (at least one
# scrape on each side; dcgm-exporter scrapes default to 30 s and are often 60 s).
PAD = dt.timedelta(minutes=2)
GROUPS = ("job_id", "rank", "gpu_uuid", "host", "site_id", "gpu_model", "model_name", "job_kind", "minute", "hour", "day")


def floor_minute(t: dt.datetime) -> dt.datetime:
    return t.replace(second=0, microsecond=0)


def rollup_window(store: Store, start: dt.datetime, end: dt.datetime) -> dict[str, Any]:
    """Roll up [start, end) (whole minutes) from gpu_sample into gpu_energy_minute. Idempotent."""
    start, end = floor_minute(start), floor_minute(end)
    if end <= start:
        raise ValueError(f"empty window [{start}, {end})")
    with tracer().start_as_current_span("energy.rollup"):
        samples = store.read("gpu_sample", start=start - PAD, end=end + PAD, columns=["ts", "gpu_uuid", "power_w", "energy_j"])
        if samples.height == 0:
            return {"window_start": start.isoformat(), "window_end": end.isoformat(), "minutes": 0, "gpus": 0, "events": 0}
        roll = energy.energy_rollup(samples, window_start=start, window_end=end)
        minutes = roll.minutes.select(list(F.GPU_ENERGY_MINUTE.names))
        store.write(F.Batch(source=f"energy_rollup:{start.isoformat()}", gpu_energy_minute=minutes))
        return {"window_start": start.isoformat(), "window_end": end.isoformat(), "minutes": minutes.height,
                "gpus": roll.gpus.height, "events": roll.events.height,
                "no_energy_data": int((roll.gpus["status"] == "no_energy_data").sum()) if "status" in roll.gpus.columns else 0}


def energy_report(store: Store, start: dt.datetime, end: dt.datetime, by: list[str]) -> pl.DataFrame:
    """Energy from the roll-ups over [start, end), grouped by ``by``, with location-based kgCO2e where
    the grouping keeps sites apart (grid intensity is per site)."""
    bad = [b for b in by if b not in GROUPS]
    if bad:
        raise ValueError(f"cannot group by {bad[0]!r}: expected some of {', '.join(GROUPS)}")
    minutes = store.read("gpu_energy_minute", start=start, end=end)
    if minutes.height == 0:
        return pl.DataFrame()
    attributed = energy.attribute_to_jobs(minutes, store.read("job_rank"))
    group = list(dict.fromkeys([*by, "site_id", "minute"] if "site_id" in by else by))
    summary = energy.energy_summary(attributed, group, gpu=store.read("gpu"), host=store.read("host"), job=store.read("job"))
    site = store.read("site")
    if "site_id" in by and site.height and summary.filter(pl.col("site_id").is_not_null()).height:
        located = carbon.location_based(summary.filter(pl.col("site_id").is_in(site["site_id"].implode())), site,
                                        metric_sample=store.read("metric_sample", start=start, end=end))
        summary = located.group_by(by).agg(pl.col("energy_j").sum(), pl.col("kgco2e").sum(), pl.col("intensity_basis").unique().sort().str.join("; "))
    elif "minute" not in by and "minute" in summary.columns:
        summary = summary.group_by(by).agg(pl.col("energy_j").sum())
    return summary.with_columns((pl.col("energy_j") / energy.J_PER_KWH).alias("energy_kwh")).sort(by, nulls_last=True)


def site_pue(store: Store, site_id: str, start: dt.datetime, end: dt.datetime) -> dict[str, Any]:
    """PUE of a site over a window (ISO/IEC 30134-2), from its facility and IT meters; the declared PUE,
    marked as an estimate, where it has none."""
    import dataclasses

    site = store.read("site")
    if site.filter(pl.col("site_id") == site_id).height == 0:
        raise ValueError(f"no site {site_id!r} in the inventory")
    meters = store.read("metric_sample", start=start - PAD, end=end + PAD)
    res = energy.pue(meters, site_id, window_start=start, window_end=end, site=site)
    return {k: (v.isoformat() if isinstance(v, dt.datetime) else v) for k, v in dataclasses.asdict(res).items()}


def model_footprint(store: Store, model_name: str) -> dict[str, Any]:
    """Training compute, time, energy and emissions of a model (EU AI Act Annex XI 1.2(d)-(e)): measured
    from the fleet's telemetry where it covers the runs, with the basis of every figure stated."""
    job = store.read("job")
    # A job belongs to the model by the scheduler's record (job.model_name) or by lineage: a training run
    # of the model whose fleetscope_job facet names the fleet job.
    linked = _lineage_jobs(store, model_name)
    if linked:
        job = job.with_columns(
            pl.when(pl.col("job_id").is_in(linked)).then(pl.lit(model_name)).otherwise(pl.col("model_name")).alias("model_name"),
            pl.when(pl.col("job_id").is_in(linked)).then(pl.lit("training")).otherwise(pl.col("kind")).alias("kind"),
        )
    ids = job.filter((pl.col("model_name") == model_name) & (pl.col("kind") == "training"))["job_id"].to_list()
    if not ids:
        raise ValueError(f"no training job of model {model_name!r} in the job inventory")
    fp = carbon.model_footprint(model_name, job=job, job_energy=job_energy(store, ids), step=store.read("step", job_id=ids))
    return {"jobs": ids, **fp.as_dict()}


def job_energy(store: Store, job_ids: list[str]) -> pl.DataFrame | None:
    """GPU energy per job from the stored roll-ups (None before any roll-up exists): the input
    ``analyzers.carbon.model_footprint`` takes."""
    minutes = store.read("gpu_energy_minute")
    if minutes.height == 0:
        return None
    attributed = energy.attribute_to_jobs(minutes, store.read("job_rank", job_id=job_ids))
    return energy.energy_summary(attributed, ["job_id"]).filter(pl.col("job_id").is_not_null())


def _lineage_jobs(store: Store, model_name: str) -> list[str]:
    """Fleet job ids of the lineage runs that trained ``model_name`` (registry links or the run's
    ``fleetscope_model`` facet), read from their ``fleetscope_job`` facets."""
    runs = store.read("lineage_run_event", columns=["run_id", "fleet_job_id", "model_name"])
    linked = store.read("model_training_run").filter(pl.col("model_name") == model_name)["run_id"].to_list()
    hit = runs.filter((pl.col("model_name") == model_name) | pl.col("run_id").is_in(linked))
    return sorted(set(hit["fleet_job_id"].drop_nulls().to_list()))

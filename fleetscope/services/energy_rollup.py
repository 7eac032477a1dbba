"""Energy roll-up writes: per-GPU minutes (``gpu_energy_minute``) rolled incrementally from ``gpu_sample``,
whole or one shard of hosts at a time, with the per-site and per-job sums and the sites' measured PUE
written beside them; beat's scheduled entry points; and the re-roll of jobs whose assignments came late.
The reports read from these roll-ups are ``fleetscope.services.energy``."""

from __future__ import annotations

import datetime as dt
from typing import Any

import polars as pl
from sqlalchemy import delete

from analyzers import energy, facility
from fleetscope.core import frames as F
from fleetscope.observability import tracer
from fleetscope.services.analysis import at
from fleetscope.services import shards as shards_mod
from fleetscope.settings import Settings
from fleetscope.store import Store, packed_energy
from fleetscope.store import schema

# Samples read either side of a window so every minute inside it has interval endpoints (at least one
# scrape on each side; dcgm-exporter scrapes default to 30 s and are often 60 s).
PAD = dt.timedelta(minutes=2)
# metric_sample series the energy figures read: facility meters (PUE, WUE) and grid intensity. Read by
# name, never the whole table: they are a handful among the fleet's many series.
WINDOW = dt.timedelta(minutes=10)
"""Beat's roll-up re-rolls this many closed minutes every minute: a minute's figures are final this long after it."""
METER_SERIES = (facility.FACILITY_ENERGY, facility.FACILITY_POWER, facility.IT_ENERGY, facility.IT_POWER, facility.WATER)


def energy_rollup_end(store: Store) -> dt.datetime | None:
    """The end of the newest minute the energy roll-up (``gpu_energy_minute``) holds, or None before any."""
    df = store.query(f"SELECT {packed_energy.newest_minute_sql(store.dialect)} AS t", [], {"t": F.UTC_US})
    t = df["t"][0] if df.height else None
    return None if t is None else t + dt.timedelta(minutes=1)


def floor_minute(t: dt.datetime) -> dt.datetime:
    return t.replace(second=0, microsecond=0)


def rollup_window(store: Store, start: dt.datetime, end: dt.datetime) -> dict[str, Any]:
    """Roll up [start, end) (whole minutes) from gpu_sample into gpu_energy_minute, and the window's per-site and
    per-job sums and measured PUE from those minutes. Idempotent. The same as every shard's
    ``rollup_shard`` followed by ``rollup_sums``."""
    start, end = floor_minute(start), floor_minute(end)
    if end <= start:
        raise ValueError(f"empty window [{start}, {end})")
    with tracer().start_as_current_span("energy.rollup"):
        samples = store.read("gpu_sample", start=start - PAD, end=end + PAD, columns=["ts", "gpu_uuid", "power_w", "energy_j"])
        if samples.height == 0:
            return {"window_start": start.isoformat(), "window_end": end.isoformat(), "minutes": 0, "gpus": 0, "events": 0}
        roll = energy.energy_rollup(samples, window_start=start, window_end=end)
        minutes = roll.minutes.select(list(F.GPU_ENERGY_MINUTE.names))
        frames, pues = _sum_frames(store, minutes, start, end)
        store.write_frames([(F.GPU_ENERGY_MINUTE, minutes), *frames], source=f"energy_rollup:{start.isoformat()}")
        return {"site_pue": pues, "window_start": start.isoformat(), "window_end": end.isoformat(), "minutes": minutes.height,
                "gpus": roll.gpus.height, "events": roll.events.height, "job_minutes": frames[1][1].height,
                "no_energy_data": int((roll.gpus["status"] == "no_energy_data").sum()) if "status" in roll.gpus.columns else 0}


def _sum_frames(store: Store, minutes: pl.DataFrame, start: dt.datetime, end: dt.datetime) -> tuple[list[tuple[F.FrameSpec, pl.DataFrame]], int]:
    """The per-site and per-job sums of per-GPU ``minutes`` and the sites' measured PUE at ``end``. The minutes
    are summed in (minute, GPU) order, so the sums come out the same from minutes just rolled as from the
    same minutes read back after a sharded roll-up."""
    minutes = minutes.sort("minute", "gpu_uuid")
    gpu, host = store.read("gpu", columns=["gpu_uuid", "host"]), store.read("host", columns=["host", "site_id"])
    frames = rollup_frames(minutes, ranks_during(store, start, end), gpu, host)[1:]
    pues = site_pue_samples(store, end)
    if pues.height:
        frames.append((F.METRIC_SAMPLE, pues))
    return frames, pues.height


def rollup_shard(store: Store, start: dt.datetime, end: dt.datetime, shard: int, shards: int) -> dict[str, Any]:
    """``rollup_window``'s per-GPU part for the GPUs of one shard of hosts (``services.shards``): their minutes of
    [start, end) into gpu_energy_minute. A GPU's minutes depend on its own samples only, so the shards together
    write exactly what one roll-up writes; ``rollup_sums`` then adds the per-site and per-job sums."""
    start, end = floor_minute(start), floor_minute(end)
    if end <= start:
        raise ValueError(f"empty window [{start}, {end})")
    with tracer().start_as_current_span("energy.rollup_shard") as span:
        span.set_attribute("fleetscope.shard", f"{shard}/{shards}")
        cols = ["ts", "gpu_uuid", "power_w", "energy_j"]
        samples = shards_mod.shard_gpu_samples(store, shard, shards, start - PAD, end + PAD, cols, dict(F.GPU_SAMPLE.schema))
        out = {"shard": shard, "shards": shards, "window_start": start.isoformat(), "window_end": end.isoformat(), "minutes": 0, "gpus": 0}
        if samples.height == 0:
            return out
        roll = energy.energy_rollup(samples, window_start=start, window_end=end)
        minutes = roll.minutes.select(list(F.GPU_ENERGY_MINUTE.names))
        store.write_frames([(F.GPU_ENERGY_MINUTE, minutes)], source=f"energy_rollup:{start.isoformat()}:{shard}/{shards}")
        return {**out, "minutes": minutes.height, "gpus": roll.gpus.height}


def rollup_sums(store: Store, start: dt.datetime, end: dt.datetime) -> dict[str, Any]:
    """The per-site and per-job sums and the sites' measured PUE of [start, end), from the stored per-GPU minutes
    (``rollup_shard``'s): a small read, one row per GPU-minute, not the raw samples."""
    start, end = floor_minute(start), floor_minute(end)
    with tracer().start_as_current_span("energy.rollup_sums"):
        minutes = store.read("gpu_energy_minute", start=start, end=end).select(list(F.GPU_ENERGY_MINUTE.names))
        frames, pues = _sum_frames(store, minutes, start, end)
        store.write_frames(frames, source=f"energy_sums:{start.isoformat()}")
        return {"window_start": start.isoformat(), "window_end": end.isoformat(), "minutes": minutes.height,
                "site_minutes": frames[0][1].height, "job_minutes": frames[1][1].height, "site_pue": pues}


def rollup_args(*, window_start: str | None = None, window_end: str | None = None) -> dict[str, str]:
    """Beat's energy roll-up window: the last ten closed minutes unless given, so late scrapes are counted; a
    window's roll-up comes out the same however often it is rewritten."""
    end = dt.datetime.fromisoformat(window_end) if window_end else floor_minute(at(None))
    start = dt.datetime.fromisoformat(window_start) if window_start else end - WINDOW
    return {"window_start": start.isoformat(), "window_end": end.isoformat()}


def scheduled_rollup(store: Store, settings: Settings, **window: str | None) -> dict[str, Any]:
    """Beat's ``energy-rollup`` (``services.scheduled``): ``rollup_window`` over ``rollup_args``' window."""
    w = rollup_args(**window)
    return rollup_window(store, dt.datetime.fromisoformat(w["window_start"]), dt.datetime.fromisoformat(w["window_end"]))


def scheduled_rollup_shard(store: Store, settings: Settings, *, shard: int, shards: int, window_start: str, window_end: str) -> dict[str, Any]:
    """One shard of hosts' part of beat's sharded energy roll-up: ``rollup_shard``."""
    return rollup_shard(store, dt.datetime.fromisoformat(window_start), dt.datetime.fromisoformat(window_end), shard, shards)


def scheduled_rollup_sums(store: Store, settings: Settings, *, window_start: str, window_end: str) -> dict[str, Any]:
    """The sharded energy roll-up's part run once, after its shards are sent: ``rollup_sums``. The window is
    re-rolled every minute, so a minute's sums are complete from the tick after its shards ran (the newest
    minute's lag one tick behind)."""
    return {"sums": rollup_sums(store, dt.datetime.fromisoformat(window_start), dt.datetime.fromisoformat(window_end))}


PUE_SERIES = "site_pue_ratio"
"""The series the ``PueOutOfRange`` and ``PueImplausible`` rules read: each metered site's PUE over the
``PUE_WINDOW`` ending at each roll-up (labels: site)."""
PUE_WINDOW = dt.timedelta(minutes=15)


def site_pue_samples(store: Store, end: dt.datetime) -> pl.DataFrame:
    """``site_pue_ratio{site}`` at ``end`` for every site whose facility and IT meters cover the last
    ``PUE_WINDOW`` (ISO/IEC 30134-2 through ``analyzers.facility.pue``; interim, since the standard's PUE is
    annual). Declared PUEs are not measurements and are not written: an alert on them would page on a
    number someone typed."""
    start = end - PUE_WINDOW
    meters = metric_samples(store, METER_SERIES, start - PAD, end + PAD)
    site = store.read("site")
    rows = []
    if meters.height and site.height:
        for site_id in site["site_id"].to_list():
            res = facility.pue(meters, site_id, window_start=start, window_end=end, site=site)
            if res.pue is not None and not res.estimate and res.basis == "measured":
                rows.append({"ts": end, "series": F.series_key(PUE_SERIES, {"site": site_id}), "value": float(res.pue)})
    return pl.DataFrame(rows, schema=F.METRIC_SAMPLE.schema)


def rollup_frames(minutes: pl.DataFrame, job_rank: pl.DataFrame, gpu: pl.DataFrame, host: pl.DataFrame) -> list[tuple[F.FrameSpec, pl.DataFrame]]:
    """What a roll-up writes for per-GPU ``minutes``: those minutes, their per-site sums and the jobs'
    shares (``job_rank``: the assignments overlapping them), in that order."""
    return [(F.GPU_ENERGY_MINUTE, minutes), (F.SITE_ENERGY_MINUTE, site_rollup(minutes, gpu, host)),
            (F.JOB_ENERGY_MINUTE, job_rollup(minutes, job_rank, gpu, host))]


def metric_samples(store: Store, names: tuple[str, ...], start: dt.datetime, end: dt.datetime) -> pl.DataFrame:
    """``metric_sample`` rows (ts, series, value) of the series with these metric names over [start, end)."""
    schema = {"ts": F.UTC_US, "series": pl.String, "value": pl.Float64}
    sql = ("SELECT m.ts, s.series, m.value FROM metric_sample m JOIN series s ON s.series_id = m.series_id"
           f" WHERE s.name IN ({', '.join('?' for _ in names)}) AND m.ts >= ? AND m.ts < ? ORDER BY s.series, m.ts")
    df = store.query(sql, [*names, start, end], schema)
    return df.select(list(schema)) if df.height else pl.DataFrame(schema=schema)


def site_rollup(minutes: pl.DataFrame, gpu: pl.DataFrame, host: pl.DataFrame) -> pl.DataFrame:
    """Per-GPU minutes summed per site (``site_energy_minute``): GPUs the inventory places at no site are
    left out, as they are from every per-site figure."""
    if minutes.height == 0:
        return F.SITE_ENERGY_MINUTE.empty()
    return (
        minutes.join(gpu.select("gpu_uuid", "host"), on="gpu_uuid", how="inner")
        .join(host.select("host", "site_id"), on="host", how="inner")
        .filter(pl.col("site_id").is_not_null())
        .group_by("minute", "site_id")
        .agg(pl.col("energy_j").sum(), pl.len().cast(pl.Int64).alias("gpus"))
        .select(list(F.SITE_ENERGY_MINUTE.names))
    )


def ranks_during(store: Store, start: dt.datetime, end: dt.datetime) -> pl.DataFrame:
    """``job_rank`` assignments that overlap [start, end): the few a roll-up window needs, not the table."""
    schema = {c: F.JOB_RANK.schema[c] for c in ("job_id", "rank", "gpu_uuid", "start", "end")}
    df = store.query('SELECT job_id, "rank", gpu_uuid, "start", "end" FROM job_rank WHERE "start" < ? AND ("end" IS NULL OR "end" > ?)',
                     [end, start], schema)
    return df.select(list(schema)) if df.height else pl.DataFrame(schema=schema)


def job_rollup(minutes: pl.DataFrame, job_rank: pl.DataFrame, gpu: pl.DataFrame, host: pl.DataFrame) -> pl.DataFrame:
    """Per-GPU minutes attributed to the jobs that held the GPUs (``analyzers.energy.attribute_to_jobs``),
    summed per job, site and minute (``job_energy_minute``). Idle shares are left out: they belong to no
    job. GPUs at no known site get site_id ``""`` (a key column cannot be null)."""
    if minutes.height == 0 or job_rank.height == 0:
        return F.JOB_ENERGY_MINUTE.empty()
    att = energy.attribute_to_jobs(minutes, job_rank).filter(pl.col("job_id").is_not_null())
    return (
        att.join(gpu.select("gpu_uuid", "host"), on="gpu_uuid", how="left")
        .join(host.select("host", "site_id"), on="host", how="left")
        .with_columns(pl.col("site_id").fill_null(""))
        .group_by("minute", "job_id", "site_id")
        .agg(pl.col("energy_j").sum(), pl.col("covered_s").sum(), pl.col("allocated_s").sum(),
             pl.col("gpu_uuid").n_unique().cast(pl.Int64).alias("gpus"))
        .select(list(F.JOB_ENERGY_MINUTE.names))
    )


def reroll_jobs(store: Store, job_ids: list[str]) -> dict[str, Any]:
    """Rewrite the ``job_energy_minute`` rows of these jobs from the per-GPU roll-ups, over their runs up to
    the newest rolled-up minute: for assignments written after the minutes they cover were rolled up (a
    rank added or moved mid-run, a scheduler record that arrives late). The per-GPU minutes are the
    truth; every job holding the jobs' GPUs is read, so shared GPUs split as in the roll-up."""

    jr = store.read("job_rank", job_id=job_ids)
    rolled_to = energy_rollup_end(store)
    if jr.height == 0 or rolled_to is None:
        return {"jobs": 0, "rows": 0}
    lo, hi = floor_minute(jr["start"].min()), rolled_to
    if not jr["end"].null_count():
        hi = min(hi, floor_minute(jr["end"].max()) + dt.timedelta(minutes=1))
    if hi <= lo:
        return {"jobs": 0, "rows": 0}
    gpus = jr["gpu_uuid"].unique().to_list()
    minutes = store.read("gpu_energy_minute", start=lo, end=hi, gpu_uuid=gpus)
    ranks = ranks_during(store, lo, hi).filter(pl.col("gpu_uuid").is_in(gpus))
    gpu, host = store.read("gpu", columns=["gpu_uuid", "host"]), store.read("host", columns=["host", "site_id"])
    rows = job_rollup(minutes, ranks, gpu, host).filter(pl.col("job_id").is_in(job_ids))
    t = schema.metadata.tables["job_energy_minute"]
    # Rows a moved rank no longer earns go too. Between the two transactions the jobs have no rows for
    # the period, and readers attribute from the per-GPU minutes meanwhile: the same figures.
    with store.engine.begin() as conn:
        conn.execute(delete(t).where(t.c.job_id.in_(job_ids) & (t.c.minute >= lo) & (t.c.minute < hi)))
    store.write_frames([(F.JOB_ENERGY_MINUTE, rows)], source=f"energy_reroll:{lo.isoformat()}")
    return {"jobs": len(set(rows["job_id"].to_list())), "rows": rows.height, "start": lo.isoformat(), "end": hi.isoformat()}

"""Energy and carbon reads over the roll-ups: power, per-GPU and per-site energy, location- and
market-based emissions, PUE over time, energy by job and model, embodied emissions. The roll-ups are
``fleetscope.services.energy_rollup``, the reports ``fleetscope.services.energy``."""

from __future__ import annotations

import datetime as dt
from typing import Any

import polars as pl

from fleetscope.core import frames as F
from fleetscope.core.units import as_utc
from fleetscope.services.telemetry import data_start, minute_tier_serves, sample_interval_s
from fleetscope.services.tiers import BUCKET, TIER_TABLE, floor_to
from fleetscope.store import Store, packed
from fleetscope.store.packed import time_literal
from fleetscope.store.reads import bucket_us_sql, energy_minutes_sql, fetch, gpu_samples_sql, site_gpus_sql, site_is_sql
from analyzers import carbon
from analyzers import facility
from fleetscope.services.energy_rollup import METER_SERIES, PAD, WINDOW, energy_rollup_end, metric_samples
from fleetscope.services.energy import site_scope2

UTC = F.UTC_US


def rollup_power(store: Store, start: dt.datetime, end: dt.datetime, site: str | None = None, bucket_s: int = 1800) -> pl.DataFrame:
    """Mean GPU power per site and time bucket over ``[start, end)`` from the per-site energy roll-up
    (``site_energy_minute``): ``ts, site_id, power_w, gpus`` — the bucket's energy over the minutes rolled up
    in it. One row per site and minute is read, so a day costs the same for 16 or 16,384 GPUs. GPUs the
    inventory places at no site are not in the roll-up; empty before the first roll-up of the window."""
    start, end = as_utc(start), as_utc(end)
    params: list[Any] = [start, end]
    site_sql = site_is_sql(site, params)
    bucket = bucket_us_sql(store, "minute", max(60, int(bucket_s)))
    sql = (f"SELECT {bucket} AS ts, site_id, SUM(energy_j) / (60.0 * COUNT(DISTINCT minute)) AS power_w, MAX(gpus) AS gpus"
           f" FROM site_energy_minute WHERE minute >= ? AND minute < ?{site_sql} GROUP BY 1, 2 ORDER BY 1, 2")
    return fetch(store, sql, params, {"ts": UTC, "site_id": pl.String, "power_w": pl.Float64, "gpus": pl.Int64})


def gpu_energy(store: Store, start: dt.datetime, end: dt.datetime, site: str | None = None) -> pl.DataFrame:
    """GPU energy per site over ``[start, end)`` from the GPUs' energy counters: ``site_id, gpus, energy_j``.

    The counter is read at two probes (the first samples after ``start``, or after the data begins, and
    the last before ``end``); a GPU's energy is the difference, and a counter that went backwards
    (driver reload) counts as zero rather than negative.
    """
    start, end = as_utc(start), as_utc(end)
    schema = {"site_id": pl.String, "gpus": pl.Int64, "energy_j": pl.Float64}
    first = data_start(store)
    if first is None or end <= start:
        return pl.DataFrame(schema=schema)
    start = max(start, first)
    probe = dt.timedelta(seconds=1.5 * max(sample_interval_s(store, end), sample_interval_s(store, start)))
    opening, closing = minute_tier_serves(store, [(start, start + probe), (end - probe, end)])
    params: list[Any] = []
    site_sql = site_gpus_sql(site, params, "a.gpu_uuid")
    sql = (
        "SELECT h.site_id, COUNT(*) AS gpus,"
        " SUM(CASE WHEN b.e > a.e THEN b.e - a.e ELSE 0 END) AS energy_j FROM"
        f" ({_counter_reading(store, 'MIN', start, start + probe, opening)}) a"
        f" JOIN ({_counter_reading(store, 'MAX', end - probe, end, closing)}) b"
        " ON b.gpu_uuid = a.gpu_uuid"
        " LEFT JOIN gpu g ON g.gpu_uuid = a.gpu_uuid LEFT JOIN host h ON h.host = g.host"
        f" WHERE a.e IS NOT NULL AND b.e IS NOT NULL{site_sql} GROUP BY h.site_id ORDER BY 1"
    )
    return fetch(store, sql, params, schema, small=True)  # a row a site


def _counter_reading(store: Store, agg: str, lo: dt.datetime, hi: dt.datetime, by_minute: bool) -> str:
    """Each GPU's energy counter over ``[lo, hi)``, its first (``MIN``) or last (``MAX``) reading, as ``gpu_uuid, e``.
    ``by_minute`` (``telemetry.minute_tier_serves``: the range reaches a packed hour), where the raw probe would
    unpack the hour for every GPU, the counter at ``lo`` (``MIN``) or ``hi`` (``MAX``) from the minute tier instead:
    the minute holding that instant keeps the counter's first and last reading and how many samples it had, taken as
    evenly spaced (the first half a spacing after the minute starts, the last half a spacing before it ends), and
    the counter is interpolated between them. Whole minutes (an hour's bounds) give the raw probe's readings; a
    range of seconds gets its share of the minute rather than nothing."""
    if not by_minute:
        return f"SELECT gpu_uuid, {agg}(energy_j) AS e FROM {gpu_samples_sql(store, lo, hi, ('energy_j',))} GROUP BY gpu_uuid"
    instant = lo if agg == "MIN" else hi
    # the minute holding the instant; an end bound belongs to the minute before it
    bucket = floor_to(instant if agg == "MIN" else instant - dt.timedelta(microseconds=1), "minute")
    offset_s = (instant - bucket).total_seconds()
    minute_s = BUCKET["minute"].total_seconds()
    share = (f"LEAST(GREATEST(({offset_s!r} - {minute_s / 2!r} / samples) / ({minute_s!r} - {minute_s!r} / samples), 0.0), 1.0)")
    return (f"SELECT gpu_uuid, CASE WHEN samples > 1 THEN energy_j_min + (energy_j_max - energy_j_min) * {share}"
            f" ELSE energy_j_min END AS e FROM {TIER_TABLE['minute']} WHERE bucket = {time_literal(bucket)}")


def site_carbon(store: Store, start: dt.datetime, end: dt.datetime, site: str | None = None) -> pl.DataFrame:
    """Scope 2 per site over ``[start, end)`` from the per-minute energy roll-ups, location- and market-based
    side by side (``fleetscope.services.energy.site_scope2``: energy × PUE, hourly or annual grid intensity,
    the site's recorded contractual instruments): ``site_id, energy_kwh, location_kgco2e, market_kgco2e,
    covered_kwh, instruments, pue, energy_basis, uncovered_basis``. Sites that used no energy are left out.
    The roll-ups are summed per site and minute in the database, so the cost follows the window."""

    schema = {"site_id": pl.String, "energy_kwh": pl.Float64, "location_kgco2e": pl.Float64, "market_kgco2e": pl.Float64,
              "covered_kwh": pl.Float64, "instruments": pl.String, "pue": pl.Float64, "energy_basis": pl.String, "uncovered_basis": pl.String}
    start, end = as_utc(start), as_utc(end)
    known = fetch(store, "SELECT site_id FROM site ORDER BY 1", [], {"site_id": pl.String}, small=True)["site_id"].to_list()
    ids = [s for s in known if site is None or s == site]
    if not ids or end <= start:
        return pl.DataFrame(schema=schema)
    df = site_scope2(store, start, end, ids).filter(pl.col("energy_j") > 0)
    return df.select(
        "site_id", (pl.col("energy_j") / 3.6e6).alias("energy_kwh"), "location_kgco2e", "market_kgco2e",
        (pl.col("covered_energy_j") / 3.6e6).alias("covered_kwh"), "instruments", "pue", "energy_basis", "uncovered_basis",
    ).cast(schema)


_SITE_HOUR = {"site_id": pl.String, "hour": UTC, "gpus": pl.Int64, "energy_j": pl.Float64}

_SITE_HOUR_CARBON = {**_SITE_HOUR, "g_per_kwh": pl.Float64, "intensity_basis": pl.String, "kgco2e": pl.Float64}


def _location_carbon(store: Store, energy: pl.DataFrame, start: dt.datetime, end: dt.datetime) -> pl.DataFrame:
    """``energy`` (site_id, hour, gpus, energy_j) with location-based emissions (analyzers.carbon.location_based:
    the site's hourly grid intensity where ``grid_intensity_g_per_kwh`` series cover the hour, else its
    annual figure). Rows of sites outside the inventory keep null emissions."""
    if energy.is_empty():
        return pl.DataFrame(schema=_SITE_HOUR_CARBON)

    site_rows = store.read("site")
    known = energy.filter(pl.col("site_id").is_in(site_rows["site_id"].implode()))
    intensity = metric_samples(store, (carbon.INTENSITY_SERIES,), start.replace(minute=0, second=0, microsecond=0), end)
    located = carbon.location_based(known, site_rows, metric_sample=intensity, time_col="hour") if known.height else known
    rest = energy.join(known.select("site_id", "hour"), on=["site_id", "hour"], how="anti", nulls_equal=True)
    return pl.concat([located.select(list(_SITE_HOUR_CARBON)), rest], how="diagonal_relaxed").select(
        [pl.col(c).cast(t) for c, t in _SITE_HOUR_CARBON.items()]
    ).sort("site_id", "hour", nulls_last=True)


def energy_by_site_hour(store: Store, start: dt.datetime, end: dt.datetime, site: str | None = None) -> pl.DataFrame:
    """GPU energy per site and UTC hour over ``[start, end)`` from the per-minute roll-ups the worker writes
    (``gpu_energy_minute``, fleetscope.services.energy), with location-based emissions: ``site_id, hour,
    gpus, energy_j, g_per_kwh, intensity_basis, kgco2e``. GPUs outside the inventory's sites come as
    site_id null, without emissions.

    Reads the window's roll-up rows through the ``minute`` index: the cost follows GPUs × minutes, about
    4 s an hour for 16,384 GPUs on SQLite, so fleet-wide headlines read the counters instead
    (``counter_energy_by_site_hour``) and use this where a GPU has no energy counter.
    """
    start, end = as_utc(start), as_utc(end)
    params: list[Any] = []
    site_sql = site_gpus_sql(site, params, "m.gpu_uuid")
    sql = (
        f"SELECT h.site_id, {bucket_us_sql(store, 'm.minute', 3600)} AS hour, COUNT(DISTINCT m.gpu_uuid) AS gpus, SUM(m.energy_j) AS energy_j"
        f" FROM {energy_minutes_sql(store, start, end, 'm')} LEFT JOIN gpu g ON g.gpu_uuid = m.gpu_uuid LEFT JOIN host h ON h.host = g.host"
        f" WHERE TRUE{site_sql} GROUP BY 1, 2 ORDER BY 1, 2"
    )
    return _location_carbon(store, fetch(store, sql, params, _SITE_HOUR), start, end)


def counter_energy_by_site_hour(store: Store, start: dt.datetime, end: dt.datetime, site: str | None = None) -> pl.DataFrame:
    """GPU energy per site and UTC hour over ``[start, end)`` from the GPUs' energy counters, with
    location-based emissions (the columns of ``energy_by_site_hour``).

    The counter is read at a probe after ``start`` (or the first sample), after each hour boundary and
    after ``end`` (before it, where no sample follows ``end`` yet); a GPU's energy in an hour is the rise
    of its counter between consecutive probes, and a counter that went backwards (driver reload) counts
    as zero. Reading after each boundary gives the interval that straddles it to one hour only, so the
    hours of a day read one by one add up to the day read at once (the dashboard caches settled hours).
    The cost is GPUs × (hours + 1) probe rows, whatever the sample rate: about 0.2 s an hour for 16,384
    GPUs on SQLite.
    """
    start, end = as_utc(start), as_utc(end)
    first = data_start(store)
    if first is None or end <= max(start, first):
        return pl.DataFrame(schema=_SITE_HOUR_CARBON)
    start = max(start, first)
    probe = dt.timedelta(seconds=1.5 * max(sample_interval_s(store, end), sample_interval_s(store, start)))
    ahead = gpu_samples_sql(store, end, end + probe)
    followed = fetch(store, f"SELECT ts FROM {ahead} LIMIT 1", [], {"ts": UTC}, small=True).height > 0
    if not followed:
        # The window runs past the data: close it at the newest sample instead.
        newest, newest_params = packed.max_ts_sql(store.dialect, before=end)
        last = fetch(store, f"SELECT {newest} AS ts", newest_params, {"ts": UTC}, small=True)["ts"][0]
        if last is None or last < start:
            return pl.DataFrame(schema=_SITE_HOUR_CARBON)
        end = min(end, last + dt.timedelta(microseconds=1))
    bounds = [start]
    hour = start.replace(minute=0, second=0, microsecond=0) + dt.timedelta(hours=1)
    while hour < end:
        bounds.append(hour)
        hour += dt.timedelta(hours=1)
    parts: list[str] = []
    params: list[Any] = []
    closing = (end, "MIN", end, end + probe) if followed else (end, "MAX", end - probe, end)
    # Probe k's reading closes hour k-1 and opens hour k; the last probe only closes.
    for k, (at, agg, lo, hi) in enumerate([(b, "MIN", b, b + probe) for b in bounds] + [closing]):
        site_sql = site_gpus_sql(site, params)
        source = gpu_samples_sql(store, lo, hi, ("energy_j",))
        parts.append(f"SELECT {k} AS k, gpu_uuid, {agg}(energy_j) AS e FROM {source} WHERE TRUE{site_sql} GROUP BY gpu_uuid")
    sql = (
        "SELECT h.site_id, x.k, COUNT(*) AS gpus, SUM(CASE WHEN x.d > 0 THEN x.d ELSE 0 END) AS energy_j FROM ("
        " SELECT k, gpu_uuid, LEAD(e) OVER (PARTITION BY gpu_uuid ORDER BY k) - e AS d FROM (" + " UNION ALL ".join(parts) + ") p"
        " WHERE e IS NOT NULL) x LEFT JOIN gpu g ON g.gpu_uuid = x.gpu_uuid LEFT JOIN host h ON h.host = g.host"
        " WHERE x.d IS NOT NULL GROUP BY 1, 2 ORDER BY 1, 2"
    )
    rises = fetch(store, sql, params, {"site_id": pl.String, "k": pl.Int64, "gpus": pl.Int64, "energy_j": pl.Float64}, small=True)
    hours = pl.DataFrame({"k": list(range(len(bounds))), "hour": [b.replace(minute=0, second=0, microsecond=0) for b in bounds]},
                         schema={"k": pl.Int64, "hour": UTC})
    energy = rises.join(hours, on="k").group_by("site_id", "hour").agg(pl.col("gpus").max(), pl.col("energy_j").sum()).select(list(_SITE_HOUR))
    return _location_carbon(store, energy, start, end)


def rolled_energy_by_site_hour(store: Store, start: dt.datetime, end: dt.datetime, site: str | None = None) -> pl.DataFrame:
    """GPU energy per site and UTC hour, with location-based emissions (the columns of ``energy_by_site_hour``),
    for the whole hours of ``[start, end)`` that the per-site energy roll-up (``site_energy_minute``: the
    counters' energy the worker sums per site and minute) holds every minute of and beat no longer re-rolls
    (``energy_rollup.WINDOW``); other hours have no row.

    One read of the sites' minutes whatever the fleet's size, where the counters cost two probes of every GPU
    an hour (about a second an hour at 100,000 GPUs); the two agree to rounding for GPUs with a counter
    (``tests/fleetscope/test_energy_service.py``). The roll-up leaves out GPUs the inventory places at no site,
    and counts GPUs without a counter by their integrated power."""
    start, end = as_utc(start), as_utc(end)
    upto = energy_rollup_end(store)
    if upto is None:
        return pl.DataFrame(schema=_SITE_HOUR_CARBON)
    end = min(end, upto - WINDOW).replace(minute=0, second=0, microsecond=0)
    start = start.replace(minute=0, second=0, microsecond=0) + (dt.timedelta(hours=1) if start.minute or start.second or start.microsecond else dt.timedelta())
    if end <= start:
        return pl.DataFrame(schema=_SITE_HOUR_CARBON)
    hour = bucket_us_sql(store, "minute", 3600)
    params: list[Any] = [start, end]
    site_sql = site_is_sql(site, params)
    params += [start, end]
    # an hour counts once every one of its minutes was rolled (some site has a row in each): a roll-up that
    # began inside it, or skipped minutes, leaves it to the counters
    sql = (f"SELECT site_id, {hour} AS hour, MAX(gpus) AS gpus, SUM(energy_j) AS energy_j FROM site_energy_minute"
           f" WHERE minute >= ? AND minute < ?{site_sql} GROUP BY 1, 2 HAVING {hour} IN ("
           f"SELECT {hour} FROM site_energy_minute WHERE minute >= ? AND minute < ? GROUP BY 1 HAVING COUNT(DISTINCT minute) = 60)"
           " ORDER BY 1, 2")
    return _location_carbon(store, fetch(store, sql, params, _SITE_HOUR), start, end)


def pue_over_time(store: Store, start: dt.datetime, end: dt.datetime, site: str | None = None, bucket_s: int = 900) -> pl.DataFrame:
    """PUE per site and time bucket from the facility and IT meter series (``analyzers.facility.pue_series``:
    ISO/IEC 30134-2, category from the IT metering point): ``site_id, ts, pue, category, facility_energy_j,
    it_energy_j``. Reads the meter series by name only: a handful of series per site."""

    start, end = as_utc(start), as_utc(end)
    bucket_s = max(60, int(bucket_s) // 60 * 60)
    meters = metric_samples(store, METER_SERIES, start - PAD, end + PAD)
    # by the site label pue_series itself parses, not a second text match on the series key
    out = facility.pue_series(meters, window_start=start, window_end=end, bucket_s=bucket_s)
    return out if site is None else out.filter(pl.col("site_id") == site)


_JOB_ENERGY = {"job_id": pl.String, "model_name": pl.String, "kind": pl.String, "energy_j": pl.Float64, "gpu_hours": pl.Float64,
               "gpus": pl.Int64, "location_kgco2e": pl.Float64, "embodied_kgco2e": pl.Float64}


def energy_by_job(store: Store, start: dt.datetime, end: dt.datetime, site: str | None = None, limit: int = 50) -> pl.DataFrame:
    """The jobs that used the most GPU energy in ``[start, end)``, from the per-job minutes the roll-up
    writes (``job_energy_minute``): ``job_id, model_name, kind, energy_j, gpu_hours, gpus, location_kgco2e,
    embodied_kgco2e``. Emissions are location-based (each hour's energy × its site's grid intensity);
    embodied emissions are amortised by GPU-hours held (``analyzers.carbon.embodied_by``, BLOOM's method)."""
    start, end = as_utc(start), as_utc(end)
    rows = _job_hours(store, start, end, site, top=int(limit))
    if rows.is_empty():
        return pl.DataFrame(schema=_JOB_ENERGY)
    return _job_energy_totals(store, rows, start, end).sort("energy_j", descending=True)


def energy_by_model(store: Store, start: dt.datetime, end: dt.datetime, site: str | None = None) -> pl.DataFrame:
    """GPU energy of each ML model's jobs in ``[start, end)``, training and serving apart, from
    ``job_energy_minute`` and the job inventory: ``model_name, kind, jobs, energy_j, gpu_hours,
    location_kgco2e, embodied_kgco2e``. Jobs with no model in the inventory come as model_name null."""
    start, end = as_utc(start), as_utc(end)
    rows = _job_hours(store, start, end, site)
    if rows.is_empty():
        return pl.DataFrame(schema=_MODEL_ENERGY)
    return _by_model(_job_energy_totals(store, rows, start, end))


def energy_by_job_and_model(store: Store, start: dt.datetime, end: dt.datetime, site: str | None = None,
                            limit: int = 50) -> tuple[pl.DataFrame, pl.DataFrame]:
    """``energy_by_job`` and ``energy_by_model`` from one read of the range's job minutes, for a page that shows
    both (30 days of a busy fleet's job minutes are read once, not twice)."""
    start, end = as_utc(start), as_utc(end)
    rows = _job_hours(store, start, end, site)
    if rows.is_empty():
        return pl.DataFrame(schema=_JOB_ENERGY), pl.DataFrame(schema=_MODEL_ENERGY)
    totals = _job_energy_totals(store, rows, start, end)
    return totals.sort("energy_j", "job_id", descending=[True, False]).head(int(limit)), _by_model(totals)


_MODEL_ENERGY = {"model_name": pl.String, "kind": pl.String, "jobs": pl.Int64, "energy_j": pl.Float64, "gpu_hours": pl.Float64,
                 "location_kgco2e": pl.Float64, "embodied_kgco2e": pl.Float64}


def _by_model(totals: pl.DataFrame) -> pl.DataFrame:
    return (
        totals.group_by("model_name", "kind")
        .agg(pl.len().cast(pl.Int64).alias("jobs"), pl.col("energy_j").sum(), pl.col("gpu_hours").sum(),
             pl.col("location_kgco2e").sum(), pl.col("embodied_kgco2e").sum())
        .select(list(_MODEL_ENERGY)).cast(_MODEL_ENERGY).sort("energy_j", descending=True)
    )


def _job_hours(store: Store, start: dt.datetime, end: dt.datetime, site: str | None, top: int | None = None) -> pl.DataFrame:
    """``job_energy_minute`` summed per job, site and UTC hour (of the ``top`` jobs by energy, or all):
    job_id, site_id, hour, energy_j, allocated_s, gpus. One pass over the range's minutes: the top jobs are
    picked from its hourly sums, not by a second pass."""
    params: list[Any] = [start, end] + ([site] if site is not None else [])
    sql = (
        f"SELECT e.job_id, e.site_id, {bucket_us_sql(store, 'e.minute', 3600)} AS hour, SUM(e.energy_j) AS energy_j,"
        " SUM(e.allocated_s) AS allocated_s, MAX(e.gpus) AS gpus FROM job_energy_minute e"
        f" WHERE e.minute >= ? AND e.minute < ?{' AND e.site_id = ?' if site is not None else ''} GROUP BY 1, 2, 3"
    )
    rows = fetch(store, sql, params, {"job_id": pl.String, "site_id": pl.String, "hour": UTC, "energy_j": pl.Float64,
                                      "allocated_s": pl.Float64, "gpus": pl.Int64})
    if top is None or rows.is_empty():
        return rows
    keep = rows.group_by("job_id").agg(pl.col("energy_j").sum()).sort("energy_j", "job_id", descending=[True, False]).head(top)["job_id"]
    return rows.filter(pl.col("job_id").is_in(keep.implode()))


def _job_energy_totals(store: Store, rows: pl.DataFrame, start: dt.datetime, end: dt.datetime) -> pl.DataFrame:
    """Per-job totals of (job_id, site_id, hour) energy rows: location-based kgCO2e from the hours' grid
    intensity, GPU-hours, embodied kgCO2e, and the job's model and kind from the inventory."""

    rows = rows.with_columns(pl.when(pl.col("site_id") != "").then(pl.col("site_id")).alias("site_id"))
    located = _location_carbon(store, rows.group_by("site_id", "hour").agg(pl.col("gpus").max(), pl.col("energy_j").sum()), start, end)
    # each job's share of its site-hour's emissions, by energy
    per_kwh = located.select("site_id", "hour", (pl.col("kgco2e") / pl.col("energy_j")).alias("kg_per_j"))
    rows = rows.join(per_kwh, on=["site_id", "hour"], how="left", nulls_equal=True).with_columns(
        (pl.col("energy_j") * pl.col("kg_per_j")).alias("location_kgco2e"))
    by = ["job_id"]
    totals = rows.group_by(by).agg(
        pl.col("energy_j").sum(), pl.col("allocated_s").sum(), pl.col("gpus").max(),
        pl.when(pl.col("location_kgco2e").null_count() == 0).then(pl.col("location_kgco2e").sum()).alias("location_kgco2e"))
    emb = carbon.embodied_by(totals, by).select(*by, "gpu_hours", "embodied_kgco2e")
    jobs = fetch(store, "SELECT job_id, model_name, kind FROM job", [], {"job_id": pl.String, "model_name": pl.String, "kind": pl.String})
    return totals.join(emb, on=by).join(jobs, on="job_id", how="left").select(list(_JOB_ENERGY)).cast(_JOB_ENERGY)


def embodied_by_site(store: Store, start: dt.datetime, end: dt.datetime, site: str | None = None) -> pl.DataFrame:
    """Embodied emissions of the GPUs and servers each site used in ``[start, end)``, amortised by GPU-hours
    with energy data (``site_energy_minute.gpus``; ``analyzers.carbon.embodied_by``, the method of the BLOOM
    footprint study): ``site_id, gpu_hours, embodied_kgco2e, embodied_basis``. Reported apart from Scope 2."""

    params: list[Any] = [as_utc(start), as_utc(end)]
    site_sql = site_is_sql(site, params)
    df = fetch(store, f"SELECT site_id, SUM(gpus) * 60.0 AS allocated_s FROM site_energy_minute WHERE minute >= ? AND minute < ?{site_sql}"
                " GROUP BY site_id ORDER BY site_id", params, {"site_id": pl.String, "allocated_s": pl.Float64})
    schema = {"site_id": pl.String, "gpu_hours": pl.Float64, "embodied_kgco2e": pl.Float64, "embodied_basis": pl.String}
    if df.is_empty():
        return pl.DataFrame(schema=schema)
    return carbon.embodied_by(df, ["site_id"]).select(list(schema))

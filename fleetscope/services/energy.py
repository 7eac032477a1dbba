"""Energy against the store: energy / carbon reports read from the per-minute roll-ups (never from raw
telemetry of a whole fleet), and the sites' contractual instruments for market-based Scope 2. The roll-ups
themselves are written by ``fleetscope.services.energy_rollup``."""

from __future__ import annotations

import datetime as dt
from typing import Any

import polars as pl

from analyzers import carbon, energy, facility
from fleetscope.core import frames as F
from fleetscope.core.errors import Conflict, NotFound  # noqa: F401  (this domain's refusals)
from fleetscope.services import auditlog
from fleetscope.services.energy_rollup import METER_SERIES, PAD, floor_minute, job_rollup, metric_samples
from fleetscope.store import Store
from fleetscope.store import schema
from fleetscope.store.reads import energy_minutes_sql
import dataclasses
from sqlalchemy import delete

MARKET_METHOD = ("market-based, GHG Protocol Scope 2 Guidance (2015) ch. 6: energy covered by the site's contractual instruments "
                 "× each instrument's factor + uncovered energy × ")


GROUPS = ("job_id", "rank", "gpu_uuid", "host", "site_id", "gpu_model", "model_name", "job_kind", "minute", "hour", "day")


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
        summary = _with_market(store, summary, start, end)
    elif "minute" not in by and "minute" in summary.columns:
        summary = summary.group_by(by).agg(pl.col("energy_j").sum())
    return summary.with_columns((pl.col("energy_j") / energy.J_PER_KWH).alias("energy_kwh")).sort(by, nulls_last=True)


def _with_market(store: Store, summary: pl.DataFrame, start: dt.datetime, end: dt.datetime) -> pl.DataFrame:
    """Market-based kgCO2e beside the location-based figure of each row (GHG Protocol Scope 2: reported
    beside it, never instead): the row's location-based kgCO2e × its site's market- to location-based
    ratio over the period (:func:`site_scope2`), so both rest on the same energy."""
    sites = summary["site_id"].drop_nulls().unique().sort().to_list()
    ratio = site_scope2(store, start, end, sites).select(
        "site_id",
        pl.when(pl.col("location_kgco2e") > 0).then(pl.col("market_kgco2e") / pl.col("location_kgco2e")).alias("_ratio"),
        pl.concat_str(pl.lit(MARKET_METHOD), pl.col("uncovered_basis")).alias("market_basis"),
    )
    return summary.join(ratio, on="site_id", how="left").with_columns((pl.col("kgco2e") * pl.col("_ratio")).alias("market_kgco2e")).drop("_ratio")


def site_pue(store: Store, site_id: str, start: dt.datetime, end: dt.datetime) -> dict[str, Any]:
    """PUE of a site over a window (ISO/IEC 30134-2), from its facility and IT meters; the declared PUE,
    marked as an estimate, where it has none."""

    site = store.read("site")
    if site.filter(pl.col("site_id") == site_id).height == 0:
        raise ValueError(f"no site {site_id!r} in the inventory")
    meters = metric_samples(store, METER_SERIES, start - PAD, end + PAD)
    res = facility.pue(meters, site_id, window_start=start, window_end=end, site=site)
    # WUE (ISO/IEC 30134-9) over the IT energy the PUE used: metered where it was, else the GPUs' own
    it_j, it_basis = res.it_energy_j, "IT energy from the site's IT meter"
    if not it_j:
        it_j = float(site_minutes(store, start, end, [site_id])["energy_j"].sum()) or None
        it_basis = "GPU energy from the roll-ups (no IT meter): an upper bound on WUE"
    w = facility.wue(meters, site_id, window_start=start, window_end=end, it_energy_j=it_j or 0.0)
    return {**_jsonable(dataclasses.asdict(res)), "wue_l_per_kwh": w,
            "wue_basis": f"ISO/IEC 30134-9: site water / {it_basis}" if w is not None else "no water meter (facility_water_l) at the site"}


def site_minutes(store: Store, start: dt.datetime, end: dt.datetime, site_ids: list[str]) -> pl.DataFrame:
    """GPU energy per site and minute over [start, end): site_id, minute, energy_j.

    From ``site_energy_minute``, which the roll-up writes beside the per-GPU minutes: one row per site and
    minute, so a year of a site is half a million rows however many GPUs it has. Where the per-GPU roll-ups
    of the window have no site rows (written directly rather than by :func:`rollup_window`), they are summed
    in the database instead: one statement per site, the site's GPUs as a subquery, which SQLite walks
    through the (gpu_uuid, minute) index once per GPU.
    """
    schema = {"site_id": pl.String, "minute": F.UTC_US, "energy_j": pl.Float64}
    stored = store.read("site_energy_minute", start=start, end=end, columns=["site_id", "minute", "energy_j"])
    stored = stored.filter(pl.col("site_id").is_in(site_ids)).select(list(schema))
    have = set(stored["site_id"].unique().to_list())
    sql = (f'SELECT ? AS site_id, m."minute", SUM(m.energy_j) AS energy_j FROM {energy_minutes_sql(store, start, end, "m")} WHERE'
           " m.gpu_uuid IN (SELECT g.gpu_uuid FROM gpu g JOIN host h ON h.host = g.host WHERE h.site_id = ?)"
           ' GROUP BY m."minute"')
    parts = [stored] if stored.height else []
    parts += [store.query(sql, [sid, sid], schema).select(list(schema)) for sid in site_ids if sid not in have]
    parts = [p for p in parts if p.height]
    return pl.concat(parts).filter(pl.col("energy_j").is_not_null()).sort("site_id", "minute") if parts else pl.DataFrame(schema=schema)


# --- market-based Scope 2: contractual instruments ----------------------------------------------------


def instruments(store: Store, site_ids: list[str] | None = None) -> pl.DataFrame:
    """Recorded instruments (``energy_instrument``), of some sites or all, in the order scope2 applies
    them: by start of period, then id."""
    df = store.read("energy_instrument")
    if site_ids is not None:
        df = df.filter(pl.col("site_id").is_in(site_ids))
    return df.sort("start", "instrument_id")


def record_instrument(store: Store, record: dict[str, Any], *, recorded_by: str, now: dt.datetime | None = None) -> dict[str, Any]:
    """Check and store one contractual instrument (a re-sent record updates it), and append it to the audit
    log. ``ValidationError`` for a bad field, ``NotFound`` for a site not in the inventory, ``Conflict`` for an
    id already claimed by another site (the Scope 2 Guidance forbids counting one instrument twice); each
    leaves the store as it was."""
    rec = carbon.check_instrument(record)
    if store.read("site").filter(pl.col("site_id") == rec["site_id"]).height == 0:
        raise NotFound(f"no site {rec['site_id']!r} in the inventory")
    held = store.read("energy_instrument").filter(pl.col("instrument_id") == rec["instrument_id"])
    if held.height and held["site_id"][0] != rec["site_id"]:
        raise Conflict(f"instrument {rec['instrument_id']!r} is already claimed by site {held['site_id'][0]!r}: an instrument counts for one site only")
    row = {**rec, "recorded_at": now or dt.datetime.now(dt.UTC), "recorded_by": recorded_by}
    store.write_frames([(F.ENERGY_INSTRUMENT, pl.DataFrame([row], schema=F.ENERGY_INSTRUMENT.schema))], source=f"energy_instrument:{rec['instrument_id']}")
    out = _jsonable(row)
    auditlog.log(store, actor=recorded_by, action="energy_instrument", subject=f"site:{rec['site_id']}", payload=out)
    return {**out, "updated": bool(held.height)}


def withdraw_instrument(store: Store, site_id: str, instrument_id: str, *, actor: str) -> dict[str, Any]:
    """Delete an instrument recorded in error, and log it; ``NotFound`` where the site holds no such one."""


    t = schema.metadata.tables["energy_instrument"]
    with store.engine.begin() as conn:
        n = conn.execute(delete(t).where((t.c.instrument_id == instrument_id) & (t.c.site_id == site_id))).rowcount
    if not n:
        raise NotFound(f"site {site_id!r} holds no instrument {instrument_id!r}")
    auditlog.log(store, actor=actor, action="energy_instrument_withdrawn", subject=f"site:{site_id}", payload={"instrument_id": instrument_id})
    return {"site_id": site_id, "instrument_id": instrument_id, "withdrawn": True}


def site_scope2(store: Store, start: dt.datetime, end: dt.datetime, site_ids: list[str]) -> pl.DataFrame:
    """Location- and market-based Scope 2 of each site over [start, end), side by side (GHG Protocol Scope 2
    Guidance, 2015: dual reporting).

    Energy is the GPU energy of the roll-ups times the site's PUE over the period (ISO/IEC 30134-2 from its
    meters; else facility meter over GPU energy, an upper bound; else the declared PUE, an estimate): the
    site's electricity for the fleet. Without any PUE it is GPU energy alone, and the basis says so.
    Location-based: each minute's energy × the site's grid intensity for that hour (series, else the annual
    table). Market-based: ``analyzers.carbon.scope2`` with the site's recorded instruments; the energy they
    do not cover takes the location-based average, since no residual-mix table ships with Fleetscope.
    One row per site (zeros where no roll-up covers it), columns of :func:`analyzers.carbon.scope2` plus
    gpu_energy_j, pue, pue_basis, pue_label, estimate, energy_basis, intensity_basis.
    """
    site = store.read("site")
    unknown = sorted(set(site_ids) - set(site["site_id"].to_list()))
    if unknown:
        raise NotFound(f"no site {unknown[0]!r} in the inventory")
    gpu_min = site_minutes(store, start, end, site_ids)
    meters = metric_samples(store, METER_SERIES, start - PAD, end + PAD)
    pues = [facility.pue(meters, sid, window_start=start, window_end=end, site=site,
                       gpu_it_energy_j=float(gpu_min.filter(pl.col("site_id") == sid)["energy_j"].sum()) or None) for sid in site_ids]
    per_site = gpu_min.group_by("site_id").agg(pl.col("energy_j").sum())
    per_site = pl.DataFrame({"site_id": site_ids}).join(per_site, on="site_id", how="left").with_columns(pl.col("energy_j").fill_null(0.0))
    per_site = facility.apply_pue(per_site.with_columns(pl.col("energy_j").alias("gpu_energy_j")), pues).with_columns(
        pl.col("pue_label").fill_null(""),
        pl.when(pl.col("pue").is_not_null())
        .then(pl.format("facility energy for the GPUs: GPU energy from the roll-ups × PUE {} ({})", pl.col("pue").round(3), pl.col("pue_label")))
        .otherwise(pl.lit("GPU energy only: the site has no facility meter and no declared PUE, so facility overhead is left out"))
        .alias("energy_basis"),
    ).drop("energy_j", "facility_energy_j")
    rows = gpu_min.join(per_site.select("site_id", "pue"), on="site_id").with_columns((pl.col("energy_j") * pl.col("pue").fill_null(1.0)).alias("energy_j"))
    intensity = metric_samples(store, (carbon.INTENSITY_SERIES,), start.replace(minute=0, second=0, microsecond=0), end)
    located = carbon.location_based(rows, site, metric_sample=intensity)
    s2 = carbon.scope2(located, instruments(store, site_ids), period_start=start, period_end=end)
    bases = located.group_by("site_id").agg(pl.col("intensity_basis").unique().sort().str.join("; "))
    zero = pl.DataFrame({"site_id": site_ids}).join(s2, on="site_id", how="anti").with_columns(
        pl.lit(0.0).alias("energy_j"), pl.lit(0.0).alias("location_kgco2e"), pl.lit(0.0).alias("market_kgco2e"), pl.lit(0.0).alias("covered_energy_j"),
        pl.lit("").alias("instruments"), pl.lit([], s2.schema["covered_by"]).alias("covered_by"), pl.lit("no energy: no roll-up covers the site in this period").alias("uncovered_basis"),
    )
    return (
        pl.concat([s2, zero.select(s2.columns)])
        .join(per_site, on="site_id", how="left")
        .join(bases, on="site_id", how="left")
        .with_columns(pl.col("intensity_basis").fill_null("none: no energy"))
        .sort("site_id")
    )


def site_carbon(store: Store, site_id: str, start: dt.datetime, end: dt.datetime) -> dict[str, Any]:
    """A site's Scope 2 over [start, end): location- and market-based kgCO2e beside each other, the energy
    and PUE they rest on, each instrument used and how much it covered (:func:`site_scope2`)."""
    r = site_scope2(store, start, end, [site_id]).row(0, named=True)
    inst = instruments(store, [site_id])
    used = {d["instrument_id"]: d for d in r["covered_by"]}
    return {
        "site_id": site_id, "start": start.isoformat(), "end": end.isoformat(),
        "gpu_energy_j": r["gpu_energy_j"], "pue": r["pue"], "pue_basis": r["pue_basis"], "estimate": r["estimate"],
        "energy_j": r["energy_j"], "energy_kwh": r["energy_j"] / energy.J_PER_KWH, "energy_basis": r["energy_basis"],
        "location_based_kgco2e": r["location_kgco2e"], "location_basis": "location-based, GHG Protocol Scope 2 Guidance (2015) ch. 6: "
        "each minute's energy × the grid intensity of its hour (" + r["intensity_basis"] + ")",
        "market_based_kgco2e": r["market_kgco2e"], "market_basis": MARKET_METHOD + r["uncovered_basis"],
        "covered_energy_j": r["covered_energy_j"], "uncovered_energy_j": r["energy_j"] - r["covered_energy_j"],
        "uncovered_basis": r["uncovered_basis"],
        "instruments": [
            {**_jsonable(i), "covered_energy_j": used[i["instrument_id"]]["covered_energy_j"], "kgco2e": used[i["instrument_id"]]["kgco2e"]}
            for i in inst.iter_rows(named=True) if i["instrument_id"] in used
        ],
    }


def _jsonable(row: dict[str, Any]) -> dict[str, Any]:
    return {k: (v.isoformat() if isinstance(v, dt.datetime) else v) for k, v in row.items()}


def model_footprint(store: Store, model_name: str) -> dict[str, Any]:
    """Training compute, time, energy and emissions of a model (EU AI Act Annex XI 1.2(d)-(e)): measured
    from the fleet's telemetry where it covers the runs, with the basis of every figure stated; location-
    and market-based emissions side by side."""
    job = model_jobs(store, model_name)
    ids = job.filter((pl.col("model_name") == model_name) & (pl.col("kind") == "training"))["job_id"].to_list()
    if not ids:
        raise NotFound(f"no training job of model {model_name!r} in the job inventory")
    fp = carbon.model_footprint(model_name, job=job, job_energy=job_energy(store, ids), step=store.read("step", job_id=ids))
    return {"jobs": ids, **fp.as_dict()}


def model_jobs(store: Store, model_name: str) -> pl.DataFrame:
    """The job inventory with the model's jobs labelled: a job belongs to the model by the scheduler's record
    (job.model_name) or by lineage — a training run of the model whose ``fleetscope_job`` facet names the
    fleet job (those are labelled kind ``training``)."""
    job = store.read("job")
    linked = _lineage_jobs(store, model_name)
    if linked:
        job = job.with_columns(
            pl.when(pl.col("job_id").is_in(linked)).then(pl.lit(model_name)).otherwise(pl.col("model_name")).alias("model_name"),
            pl.when(pl.col("job_id").is_in(linked)).then(pl.lit("training")).otherwise(pl.col("kind")).alias("kind"),
        )
    return job


def job_report(store: Store, job_id: str, start: dt.datetime | None = None, end: dt.datetime | None = None) -> dict[str, Any]:
    """One job's energy and emissions over its run, or the part of it in [start, end): GPU and facility
    energy, location- and market-based kgCO2e side by side (GHG Protocol Scope 2 dual reporting), per site
    with the PUE and basis of each, and energy per step, per million tokens and useful FLOPs per J
    (``analyzers.energy.energy_productivity``) from the job's step records in the same period.
    ``NotFound`` where no roll-up covers the job, ``ValueError`` for an empty period."""
    # an instant without a zone is taken as UTC, as the rest of the API reads time
    start, end = (t.replace(tzinfo=dt.UTC) if t is not None and t.tzinfo is None else t for t in (start, end))
    if start and end and end <= start:
        raise ValueError("end must be after start")
    rows = _job_rows(store, [job_id], start, end)
    if rows is None:
        raise NotFound(f"no energy roll-up covers job {job_id!r}" + (" in that period" if start or end else "") + ": no rank-to-GPU assignments or no roll-ups yet")
    minutes, parts = rows
    total = job_energy(store, [job_id], start, end).row(0, named=True)
    lo, hi = minutes["minute"].min(), minutes["minute"].max() + dt.timedelta(minutes=1)
    steps = store.read("step", job_id=job_id, start=lo, end=hi, columns=["job_id", "rank", "step", "start", "tokens", "model_flops"])
    prod = energy.energy_productivity(pl.DataFrame({"job_id": [job_id], "energy_j": [total["energy_j"]]}), steps).row(0, named=True)
    per_site = minutes.group_by("site_id").agg(pl.col("gpu_energy_j").sum(), pl.col("kgco2e").sum(), pl.len().alias("minutes"))
    return {
        "carbon_shift_hint": _shift_hint(store, minutes, per_site),
        "job_id": job_id, "start": lo.isoformat(), "end": hi.isoformat(),
        "gpu_energy_j": total["energy_j"], "gpu_energy_kwh": total["energy_j"] / energy.J_PER_KWH,
        "facility_energy_j": total["facility_energy_j"], "estimate": total["estimate"],
        "covered_s": total["covered_s"], "allocated_s": total["allocated_s"],
        "location_based_kgco2e": total["kgco2e"], "market_based_kgco2e": total["market_kgco2e"], "market_basis": total["market_basis"],
        "steps": prod["steps"], "tokens": prod["tokens"], "useful_flops": prod["useful_flops"],
        "energy_per_step_j": prod["energy_per_step_j"], "energy_per_mtok_j": prod["energy_per_mtok_j"], "flops_per_j": prod["flops_per_j"],
        "sites": [
            {**_jsonable({k: v for k, v in p.items() if k != "market_kgco2e"}), "gpu_energy_j": s["gpu_energy_j"], "location_based_kgco2e": s["kgco2e"], "market_based_kgco2e": p["market_kgco2e"]}
            for p in parts.iter_rows(named=True)
            for s in per_site.filter(pl.col("site_id").eq_missing(p["site_id"])).iter_rows(named=True)
        ],
    }


SHIFT_HORIZON_H = 24


def _shift_hint(store: Store, minutes: pl.DataFrame, per_site: pl.DataFrame) -> dict[str, Any]:
    """What running the job's energy at its main site in that site's lowest-intensity hours within a day of
    its start would have saved (``analyzers.carbon.shift_hint``), from the hourly grid-intensity series; an
    annual figure has no hours to choose between, so without the series there is no hint."""
    main = per_site.filter(pl.col("site_id").is_not_null()).sort("gpu_energy_j", descending=True)
    if main.height == 0:
        return {"feasible": False, "basis": "the job's GPUs are at no known site"}
    site_id = main["site_id"][0]
    hourly = (minutes.filter(pl.col("site_id") == site_id).group_by(pl.col("minute").dt.truncate("1h").alias("hour"))
              .agg(pl.col("gpu_energy_j").sum().alias("energy_j")))
    lo = hourly["hour"].min()
    series = metric_samples(store, (carbon.INTENSITY_SERIES,), lo, lo + dt.timedelta(hours=SHIFT_HORIZON_H + hourly.height))
    intensity = carbon.hourly_intensity(series).filter(pl.col("site_id") == site_id).select("hour", "g_per_kwh")
    if intensity.height == 0:
        return {"feasible": False, "site_id": site_id, "basis": f"no hourly grid-intensity series ({carbon.INTENSITY_SERIES}) for site {site_id!r}"}
    hint = carbon.shift_hint(hourly, intensity, horizon_h=SHIFT_HORIZON_H)
    return {"site_id": site_id, **{k: ([h.isoformat() for h in v] if k == "best_hours" else v) for k, v in hint.items()}}


def fleet_productivity(store: Store, start: dt.datetime, end: dt.datetime) -> dict[str, Any]:
    """Fleet energy productivity ρ = useful FLOPs / J over [start, end) (``analyzers.energy``): the model
    FLOPs of every step that counted, over all GPU energy the roll-ups hold for the period at the fleet's
    sites, idle included (idle GPUs are the fleet's cost of doing that work)."""
    total_j = float(site_minutes(store, start, end, store.read("site", columns=["site_id"])["site_id"].to_list())["energy_j"].sum())
    steps = store.read("step", start=start, end=end, columns=["job_id", "rank", "step", "start", "tokens", "model_flops"])
    rho = energy.fleet_energy_productivity(pl.DataFrame({"energy_j": [total_j]}), steps)
    return {"start": start.isoformat(), "end": end.isoformat(), "gpu_energy_j": total_j, "useful_flops": None if rho is None else rho * total_j,
            "flops_per_j": rho, "basis": "model FLOPs of the steps recorded in the period (each step once, ranks summed) "
            "over the GPU energy of the per-site roll-ups, idle included"}


def job_energy(store: Store, job_ids: list[str], start: dt.datetime | None = None, end: dt.datetime | None = None) -> pl.DataFrame | None:
    """Energy and emissions per job from the stored roll-ups (None before any roll-up covers them): the
    input ``analyzers.carbon.model_footprint`` takes. GPU energy (energy_j, covered_s, allocated_s); where
    every site the jobs ran at has a PUE, facility_energy_j (GPU energy × PUE over the job's period there)
    and ``estimate`` (a declared PUE); kgco2e (location-based) and market_kgco2e with market_basis, both on
    the facility energy where it is given, else on the GPU energy. ``start``/``end`` keep the part of
    the jobs' runs inside that period."""
    rows = _job_rows(store, job_ids, start, end)
    if rows is None:
        return None
    minutes, parts = rows
    fac = pl.col("facility_energy_j")
    return (
        minutes.group_by("job_id")
        .agg(
            pl.col("gpu_energy_j").sum().alias("energy_j"), pl.col("covered_s").sum(), pl.col("allocated_s").sum(),
            pl.when(fac.null_count() == 0).then(fac.sum()).alias("facility_energy_j"),
            pl.when(pl.col("kgco2e").null_count() == 0).then(pl.col("kgco2e").sum()).alias("kgco2e"),
        )
        .join(
            parts.group_by("job_id").agg(
                pl.col("estimate").any(),
                pl.when(pl.col("market_kgco2e").null_count() == 0).then(pl.col("market_kgco2e").sum()).alias("market_kgco2e"),
                pl.col("market_basis").unique().sort().str.join("; "),
            ),
            on="job_id", how="left",
        )
        .sort("job_id")
    )


def serving_vs_training(store: Store, model_name: str, *, projection_days: int = 28) -> dict[str, Any]:
    """A model's training energy against its cumulative serving (inference) energy, with the date serving
    passed training — observed, or projected at the recent serving rate (the serving-cost-dominance law;
    ``analyzers.energy.serving_vs_training``). Jobs are the model's by the scheduler's record or lineage."""
    job = model_jobs(store, model_name)
    mine = job.filter((pl.col("model_name") == model_name) & pl.col("kind").is_in(["training", "inference"]))
    if mine.height == 0:
        raise NotFound(f"no training or inference job of model {model_name!r} in the job inventory")
    ids = mine["job_id"].to_list()
    rows = _job_rows(store, ids)
    attributed = rows[0].select("minute", "job_id", "energy_j", "kgco2e") if rows else pl.DataFrame(
        schema={"minute": F.UTC_US, "job_id": pl.String, "energy_j": pl.Float64, "kgco2e": pl.Float64})
    res = energy.serving_vs_training(attributed, mine, projection_days=projection_days).filter(pl.col("model_name") == model_name)
    out = res.row(0, named=True) if res.height else {
        "model_name": model_name, "training_energy_j": None, "serving_energy_j": 0.0, "training_kgco2e": None, "serving_kgco2e": None,
        "serving_days": 0, "crossover_date": None, "crossover_basis": "none"}
    explain = {
        "observed": "the first UTC day on which cumulative serving energy reached the training energy",
        "projected": f"not reached yet: extrapolated at the mean daily serving energy of the last {projection_days} serving days",
        "none": "no crossover to report: " + ("no training energy measured" if not out["training_energy_j"] else "no serving energy measured"),
    }[out["crossover_basis"]]
    basis = (rows[1]["energy_basis"].unique().sort().str.join("; ")[0] if rows and rows[1].height else "no energy roll-ups cover these jobs")
    return {
        **out,
        "crossover_date": out["crossover_date"].isoformat() if out["crossover_date"] else None,
        "crossover_explanation": explain,
        "training_jobs": mine.filter(pl.col("kind") == "training")["job_id"].sort().to_list(),
        "inference_jobs": mine.filter(pl.col("kind") == "inference")["job_id"].sort().to_list(),
        "energy_basis": basis,
        "emissions_basis": "location-based: the energy of each minute × its site's grid intensity (hourly series, else the annual table)",
    }


def _job_rows(store: Store, job_ids: list[str], start: dt.datetime | None = None, end: dt.datetime | None = None) -> tuple[pl.DataFrame, pl.DataFrame] | None:
    """The jobs' energy per minute and site with carbon, and per job and site its period's PUE and
    market-based emissions; None where no roll-up covers the jobs.

    Minutes: job_id, site_id, minute, gpu_energy_j, covered_s, allocated_s, facility_energy_j (null where
    the site has no PUE), energy_j (the energy the emissions are on), kgco2e. Parts: job_id, site_id,
    start, end, estimate, energy_basis, market_kgco2e (the job's share by energy of the site's market-based
    emissions over [start, end): ``analyzers.carbon.allocate_scope2``), market_basis.
    """
    jr = store.read("job_rank", job_id=job_ids)
    if jr.height == 0:
        return None
    lo = floor_minute(jr["start"].min())
    hi = None if jr["end"].null_count() else floor_minute(jr["end"].max()) + dt.timedelta(minutes=1)
    lo = max(lo, start) if start else lo
    hi = (min(hi, end) if hi else end) if end else hi
    if hi is not None and hi <= lo:
        return None
    att = job_minutes(store, jr, lo, hi).rename({"energy_j": "gpu_energy_j"})
    if att.height == 0:
        return None
    site = store.read("site")
    parts, located = [], []
    for (job_id, site_id), g in att.group_by("job_id", "site_id", maintain_order=True):
        start, end = g["minute"].min(), g["minute"].max() + dt.timedelta(minutes=1)
        known = site_id is not None and site.filter(pl.col("site_id") == site_id).height > 0
        s2 = site_scope2(store, start, end, [site_id]).row(0, named=True) if known else None
        pue_ = s2["pue"] if s2 else None
        g = g.with_columns((pl.col("gpu_energy_j") * pue_).alias("facility_energy_j") if pue_ else pl.lit(None, pl.Float64).alias("facility_energy_j"))
        parts.append({"job_id": job_id, "site_id": site_id, "start": start, "end": end, "pue": pue_,
                      "estimate": bool(s2["estimate"]) if s2 else True,
                      "energy_basis": s2["energy_basis"] if s2 else f"GPU energy only: GPUs with no known site ({site_id!r})",
                      "market_basis": (MARKET_METHOD + s2["uncovered_basis"]) if s2 else "unknown: no site"})
        located.append((g, s2))
    parts_df = pl.DataFrame(parts, schema={"job_id": pl.String, "site_id": pl.String, "start": F.UTC_US, "end": F.UTC_US, "pue": pl.Float64,
                                           "estimate": pl.Boolean, "energy_basis": pl.String, "market_basis": pl.String})
    # One energy for every emission figure of these jobs: facility energy only where every part has a PUE.
    use_fac = parts_df["pue"].null_count() == 0
    rows, market = [], []
    intensity = metric_samples(store, (carbon.INTENSITY_SERIES,), lo.replace(minute=0), hi or dt.datetime.now(dt.UTC))
    for g, s2 in located:
        g = g.with_columns((pl.col("facility_energy_j") if use_fac else pl.col("gpu_energy_j")).alias("energy_j"))
        if s2 is None:
            rows.append(g.with_columns(pl.lit(None, pl.Float64).alias("kgco2e")))
            market.append(None)
            continue
        rows.append(carbon.location_based(g, site, metric_sample=intensity).drop("g_per_kwh", "intensity_basis"))
        # the site's market-based kgCO2e per J of its energy, applied to the jobs' energy there
        share = g.select(pl.col("site_id").first(), pl.col("energy_j").sum())
        market.append(carbon.allocate_scope2(share, pl.DataFrame([s2]).select("site_id", "energy_j", "market_kgco2e"))["market_kgco2e"][0])
    parts_df = parts_df.with_columns(pl.Series("market_kgco2e", market, dtype=pl.Float64))
    if not use_fac:
        parts_df = parts_df.with_columns(pl.lit("GPU energy only: a site these jobs ran at has no PUE, so facility overhead is left out").alias("energy_basis"))
    return pl.concat(rows, how="diagonal_relaxed").sort("job_id", "minute"), parts_df


def job_minutes(store: Store, job_rank: pl.DataFrame, start: dt.datetime, end: dt.datetime | None) -> pl.DataFrame:
    """Energy of the jobs of ``job_rank`` per job, site and minute over [start, end): job_id, site_id (null
    for no known site), minute, energy_j, covered_s, allocated_s.

    From ``job_energy_minute`` (one row per job, site and minute, written by :func:`rollup_window`), so a
    long job's period costs what its minutes cost, not its GPU-minutes. A job with no rows there — its
    assignments arrived after its minutes were rolled up — is attributed from the per-GPU roll-ups instead,
    as the roll-up would have done.
    """
    job_ids = job_rank["job_id"].unique().to_list()
    cols = ["job_id", "site_id", "minute", "energy_j", "covered_s", "allocated_s"]
    stored = store.read("job_energy_minute", start=start, end=end, job_id=job_ids, columns=cols)
    missing = job_rank.filter(~pl.col("job_id").is_in(stored["job_id"].unique().implode()))
    parts = [stored] if stored.height else []
    if missing.height:
        minutes = store.read("gpu_energy_minute", start=start, end=end, gpu_uuid=missing["gpu_uuid"].unique().to_list())
        gpu, host = store.read("gpu", columns=["gpu_uuid", "host"]), store.read("host", columns=["host", "site_id"])
        parts.append(job_rollup(minutes, missing, gpu, host).select(cols))
    if not parts:
        return pl.DataFrame(schema={c: F.JOB_ENERGY_MINUTE.schema[c] for c in cols})
    return (
        pl.concat(parts).filter(pl.col("job_id").is_in(job_ids))
        .with_columns(pl.when(pl.col("site_id") != "").then(pl.col("site_id")).alias("site_id"))
        .sort("job_id", "site_id", "minute", nulls_last=True)
    )


def _lineage_jobs(store: Store, model_name: str) -> list[str]:
    """Fleet job ids of the lineage runs that trained ``model_name`` (registry links or the run's
    ``fleetscope_model`` facet), read from their ``fleetscope_job`` facets."""
    runs = store.read("lineage_run_event", columns=["run_id", "fleet_job_id", "model_name"])
    linked = store.read("model_training_run").filter(pl.col("model_name") == model_name)["run_id"].to_list()
    hit = runs.filter((pl.col("model_name") == model_name) | pl.col("run_id").is_in(linked))
    return sorted(set(hit["fleet_job_id"].drop_nulls().to_list()))

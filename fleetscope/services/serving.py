"""Serving reads and the serving window: a deployment's replicas, its latency quantiles over time, its
SLO status with burn rates, its goodput (exact from request logs where it has them, else bounded from
histograms), and the saturation and slow-replica findings of a window.

Every read is bounded by a window and one deployment (the serving tables' ``(deployment, metric, ts, ...)``
key order serves it); the pure analyses live in ``analyzers/serving_latency.py``, ``slo.py``,
``serving_goodput.py``, ``serving_saturation.py`` and ``serving_replicas.py``.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

import polars as pl

from analyzers import carbon
from analyzers import energy as energy_analysis
from analyzers import serving_energy, serving_goodput, serving_latency, serving_replicas, serving_saturation, slo as slo_analysis
from fleetscope.core import frames as F
from fleetscope.core import serving_frames as SF
from fleetscope.core.errors import NotFound
from fleetscope.services.analysis import at
from fleetscope.settings import Settings
from fleetscope.core.units import as_utc
from fleetscope.services import auditlog
from fleetscope.services import energy as energy_service
from fleetscope.services.energy_rollup import metric_samples
from fleetscope.store import Store
from fleetscope.store.reads import fetch

MAX_WINDOW = dt.timedelta(days=31)
MAX_POINTS = 2000


def _cols(spec: F.FrameSpec) -> dict[str, pl.DataType]:
    return spec.schema


def _read(store: Store, spec: F.FrameSpec, deployment: str | None, start: dt.datetime, end: dt.datetime,
          metrics: Sequence[str] | None = None, time_col: str = "ts") -> pl.DataFrame:
    if end <= start:
        raise ValueError("end must be after start")
    if end - start > MAX_WINDOW:
        raise ValueError(f"window longer than {MAX_WINDOW.days} days")
    where, params = [f"{time_col} >= ?", f"{time_col} <= ?"], [as_utc(start), as_utc(end)]
    if deployment is not None:
        where.append("deployment = ?")
        params.append(deployment)
    if metrics:
        where.append(f"metric IN ({', '.join('?' for _ in metrics)})")
        params.extend(metrics)
    schema = _cols(spec)
    sql = f"SELECT {', '.join(chr(34) + c + chr(34) for c in schema)} FROM {spec.name} WHERE {' AND '.join(where)}"
    return fetch(store, sql, params, schema)


def deployments(store: Store) -> pl.DataFrame:
    """Every known replica: ``deployment, replica, server, model, version, namespace, pod, host, last_seen``."""
    df = store.read("serving_replica")
    return df.drop("source").sort("deployment", "replica") if df.height else df.drop("source")


def _require(store: Store, deployment: str) -> None:
    n = store.query("SELECT COUNT(*) AS n FROM serving_replica WHERE deployment = ?", [deployment], {"n": pl.Int64})["n"].item()
    if not n:
        raise NotFound(f"no serving deployment {deployment[:200]!r}")


def quantiles_over_time(store: Store, deployment: str, metric: str, q: float, *, start: dt.datetime, end: dt.datetime,
                        step_s: float = 60.0, window_s: float = 300.0) -> pl.DataFrame:
    """``histogram_quantile(q, sum by (le) (increase(metric[window_s])))`` of one deployment every ``step_s``
    from ``start`` to ``end``: ``ts, value, observations, capped`` (NaN where the window saw no request)."""
    _require(store, deployment)
    if not 0 <= q <= 1:
        raise ValueError("q must be within [0, 1]")
    if step_s <= 0 or window_s <= 0:
        raise ValueError("step_s and window_s must be positive")
    if (end - start).total_seconds() / step_s > MAX_POINTS:
        raise ValueError(f"more than {MAX_POINTS} points: widen step_s")
    b = _read(store, SF.SERVING_BUCKET, deployment, start - dt.timedelta(seconds=window_s), end, [metric])
    out = serving_latency.quantiles_over_time(b, q, window_s=window_s, step_s=step_s, start=start, end=end, by=("deployment",))
    return out.drop("deployment")


def rates(store: Store, deployment: str, *, start: dt.datetime, end: dt.datetime) -> pl.DataFrame:
    """Per counter of the deployment over the window: ``metric, labels, increase, per_s`` (tokens/s,
    requests/s; reset-aware)."""
    _require(store, deployment)
    c = _read(store, SF.SERVING_COUNTER, deployment, start, end)
    return serving_latency.rates(c, start=start, end=end, by=("metric", "labels"))


def slo_status_obj(store: Store, s: slo_analysis.SLO, *, now: dt.datetime) -> slo_analysis.SLOStatus:
    """One SLO's status at ``now`` from the stored series."""
    _require(store, s.deployment)
    start = now - min(MAX_WINDOW, max(s.window, max(r[1] for r in slo_analysis.BURN_RULES)))
    if s.kind == "latency":
        return slo_analysis.status(s, now=now, buckets=_read(store, SF.SERVING_BUCKET, s.deployment, start, now, [s.metric]))
    counters = _read(store, SF.SERVING_COUNTER, s.deployment, start, now,
                     ["requests_succeeded_total", "requests_failed_total", "requests_finished_total"])
    return slo_analysis.status(s, now=now, counters=counters)


def slo_status(store: Store, slos: Sequence[slo_analysis.SLO], *, now: dt.datetime) -> list[dict[str, Any]]:
    """Each SLO's SLI, budget left over its window, burn rates and firing rules at ``now``."""
    return [slo_status_obj(store, s, now=now).to_dict() for s in slos]


def goodput(store: Store, deployment: str, *, ttft_slo_s: float, tpot_slo_s: float, start: dt.datetime, end: dt.datetime) -> dict[str, Any]:
    """DistServe goodput of the deployment in the window: ``exact`` from its request log when it has one,
    else ``bounded`` from its histograms; the result's ``method`` says which."""
    _require(store, deployment)
    if ttft_slo_s <= 0 or tpot_slo_s <= 0:
        raise ValueError("the TTFT and TPOT limits must be positive")
    reqs = _read(store, SF.SERVING_REQUEST, deployment, start, end, time_col="finish")
    if reqs.height:
        return serving_goodput.exact(reqs, deployment=deployment, ttft_slo_s=ttft_slo_s, tpot_slo_s=tpot_slo_s, start=start, end=end).to_dict()
    b = _read(store, SF.SERVING_BUCKET, deployment, start, end, ["ttft_seconds", "e2e_latency_seconds", *serving_goodput.PER_REQUEST_TPOT])
    return serving_goodput.bounded(b, deployment=deployment, ttft_slo_s=ttft_slo_s, tpot_slo_s=tpot_slo_s, start=start, end=end).to_dict()


def put_slo(store: Store, slo: slo_analysis.SLO, *, actor: str, now: dt.datetime) -> dict[str, Any]:
    """Record (or replace) a deployment's SLO; beat's serving window evaluates it from then on. Appended to the
    audit log, as alerting's changes are: an SLO loosened is a page that no longer comes (``ServingSloBurn``)."""
    _require(store, slo.deployment)
    row = {"deployment": slo.deployment, "name": slo.name, "kind": slo.kind, "metric": slo.metric or None,
           "threshold_s": slo.threshold_s if slo.kind == "latency" else None, "objective": slo.objective,
           "window_days": int(slo.window / dt.timedelta(days=1)), "updated_by": actor, "updated_at": as_utc(now)}
    store.write(F.Batch(source=f"slo:{actor}", serving_slo=F.conform(SF.SERVING_SLO, pl.DataFrame([row]))))
    auditlog.log(store, actor=actor, action="serving_slo", subject=f"deployment:{slo.deployment}/slo:{slo.name}",
                 payload={k: (v.isoformat() if isinstance(v, dt.datetime) else v) for k, v in row.items()})
    return row


def stored_slos(store: Store, deployment: str | None = None) -> list[slo_analysis.SLO]:
    """The recorded SLOs (of one deployment), as analyzers.slo objects."""
    df = store.read("serving_slo")
    if deployment is not None and df.height:
        df = df.filter(pl.col("deployment") == deployment)
    return [slo_analysis.SLO(r["name"], r["deployment"], r["kind"], r["objective"], r["metric"] or "",
                             r["threshold_s"] if r["threshold_s"] is not None else float("nan"), dt.timedelta(days=r["window_days"]))
            for r in df.sort("deployment", "name").iter_rows(named=True)]


def window_findings(store: Store, *, start: dt.datetime, end: dt.datetime, write: bool = True) -> pl.DataFrame:
    """Saturation (KV cache full with a queue, preemptions climbing), slow-replica and SLO burn-rate findings
    (every recorded SLO evaluated at ``end``) of every deployment in ``[start, end]``, written to ``finding``
    unless ``write`` is false. An SLO that cannot be evaluated (its threshold no longer a bucket bound) is
    skipped, not fatal to the others."""
    gauges = _read(store, SF.SERVING_GAUGE, None, start, end, ["kv_cache_usage_ratio", "requests_waiting"])
    counters = _read(store, SF.SERVING_COUNTER, None, start - (end - start), end, ["preemptions_total"])
    buckets = _read(store, SF.SERVING_BUCKET, None, start, end, list(serving_replicas.METRICS))
    statuses = []
    for s in stored_slos(store):
        try:
            statuses.append(slo_status_obj(store, s, now=end))
        except (ValueError, NotFound):
            continue
    found = pl.concat([serving_saturation.saturation_findings(gauges, counters, start=start, end=end),
                       serving_replicas.slow_replica_findings(buckets, start=start, end=end),
                       slo_analysis.burn_findings(statuses, now=end)])
    if write and found.height:
        store.write(F.Batch(source="serving_window", finding=found))
    return found


def scheduled_window(store: Store, settings: Settings, *, window_s: int = 900) -> dict[str, Any]:
    """Beat's five-minute ``serving-window`` (``services.scheduled``): ``window_findings`` over the last
    ``window_s`` seconds."""
    end = at(None)
    return {"findings": window_findings(store, start=end - dt.timedelta(seconds=window_s), end=end).height}


def _pods(store: Store, deployment: str) -> pl.DataFrame:
    return store.query("SELECT namespace, pod, host FROM serving_replica WHERE deployment = ? AND pod IS NOT NULL", [deployment],
                       {"namespace": pl.String, "pod": pl.String, "host": pl.String})


def _held(store: Store, deployment: str, start: dt.datetime, end: dt.datetime) -> pl.DataFrame:
    pods = _pods(store, deployment)
    if pods.height == 0:
        return pl.DataFrame(schema={"minute": F.UTC_US, "gpu_uuid": pl.String})
    names = pods["pod"].unique().to_list()
    sql = (f"SELECT ts, gpu_uuid, namespace, pod FROM gpu_workload WHERE ts >= ? AND ts < ? AND pod IN ({', '.join('?' for _ in names)})")
    wl = fetch(store, sql, [as_utc(start), as_utc(end), *names], {c: F.GPU_WORKLOAD.schema[c] for c in ("ts", "gpu_uuid", "namespace", "pod")})
    return serving_energy.held_minutes(wl, pods)


def energy_per_token(store: Store, deployment: str, *, start: dt.datetime, end: dt.datetime) -> dict[str, Any]:
    """GPU and facility energy per output token of the deployment over the window: the GPUs its pods held
    (``gpu_workload``) and their per-minute roll-ups, else the server's own energy counter; PUE the declared
    one of the first replica host's site."""
    _require(store, deployment)
    counters = _read(store, SF.SERVING_COUNTER, deployment, start, end, ["generation_tokens_total", "gpu_energy_joules_total"])
    r = serving_latency.rates(counters, start=start, end=end, by=("metric",))
    inc = dict(zip(r["metric"], r["increase"]))
    held = _held(store, deployment, start, end)
    gpu_minutes = None
    if held.height:
        gpu_minutes = store.read("gpu_energy_minute", start=start, end=end, gpu_uuid=held["gpu_uuid"].unique().to_list(),
                                 columns=["minute", "gpu_uuid", "energy_j"])
    pue, site_id = None, None
    hosts = [h for h in _pods(store, deployment)["host"].to_list() if h]
    if hosts:
        site = store.query("SELECT s.site_id AS site_id, s.declared_pue AS pue FROM host h JOIN site s ON s.site_id = h.site_id WHERE h.host = ?",
                           [hosts[0]], {"site_id": pl.String, "pue": pl.Float64})
        if site.height:
            pue, site_id = site["pue"][0], site["site_id"][0]
    out = serving_energy.energy_per_token(deployment, output_tokens=inc.get("generation_tokens_total", 0.0), gpu_minutes=gpu_minutes,
                                          held=held, server_energy_j=inc.get("gpu_energy_joules_total"), pue=pue)
    result: dict[str, Any] = {**out.to_dict(), "start": start, "end": end, "kgco2e_per_million_tokens": None, "carbon_basis": None}
    if out.basis == "gpu_energy_minute" and site_id is not None and gpu_minutes is not None and out.output_tokens > 0:
        # Location-based (GHG Protocol Scope 2): each hour's energy at its site's grid intensity, on facility
        # energy where the site declares a PUE (the electricity metered), else on the GPUs' own
        hourly = (gpu_minutes.join(held, on=["minute", "gpu_uuid"]).group_by(pl.col("minute").dt.truncate("1h").alias("hour"))
                  .agg(pl.col("energy_j").sum()).with_columns(pl.lit(site_id).alias("site_id")))
        intensity = metric_samples(store, (carbon.INTENSITY_SERIES,), start.replace(minute=0, second=0, microsecond=0), end)
        located = carbon.location_based(hourly, store.read("site"), metric_sample=intensity, time_col="hour")
        factor = pue if pue is not None and pue >= 1 else 1.0
        result["kgco2e_per_million_tokens"] = float(located["kgco2e"].sum()) * factor / out.output_tokens * 1e6
        result["carbon_basis"] = (f"location-based, {'facility (GPU x PUE)' if factor != 1.0 else 'GPU'} energy; intensity "
                                  + ", ".join(sorted(set(located["intensity_basis"].to_list()))))
    return result


def deployment_health(store: Store, deployment: str, *, start: dt.datetime, end: dt.datetime) -> pl.DataFrame:
    """The findings of the GPUs the deployment's pods held in the window and of their hosts (GPU health,
    throttling, absence, fabric...), beside the deployment's own serving findings, newest first."""
    _require(store, deployment)
    subjects = {f"gpu:{g}" for g in _held(store, deployment, start, end)["gpu_uuid"].unique().to_list()}
    subjects |= {f"host:{h}" for h in _pods(store, deployment)["host"].to_list() if h}
    f = store.read("finding", start=start - MAX_WINDOW, end=end)
    if f.height == 0:
        return f
    mine = pl.col("subject").str.starts_with(f"deployment:{deployment}/") | pl.col("subject").is_in(sorted(subjects))
    return f.filter(mine & (pl.col("window_end").is_null() | (pl.col("window_end") >= start))).sort("window_start", descending=True)


def slo_table(store: Store, deployment: str, *, now: dt.datetime) -> pl.DataFrame:
    """The deployment's recorded SLOs and their status at ``now`` as one row each: ``slo, kind, metric,
    threshold_s, objective, sli, budget_left, burn_5m, burn_1h, burn_6h, alerts`` (``error`` where one
    cannot be evaluated)."""
    rows = []
    for s in stored_slos(store, deployment):
        try:
            d = slo_status_obj(store, s, now=now).to_dict()
            rows.append({"slo": s.name, "kind": s.kind, "metric": s.metric, "threshold_s": d["threshold_s"], "objective": s.objective,
                         "sli": d["sli"], "budget_left": d["budget_left"], "burn_5m": d["burn_rates"]["5m"], "burn_1h": d["burn_rates"]["1h"],
                         "burn_6h": d["burn_rates"]["6h"], "alerts": ",".join(d["alerts"]), "error": None})
        except ValueError as exc:
            rows.append({"slo": s.name, "kind": s.kind, "metric": s.metric, "objective": s.objective, "error": str(exc)})
    schema = {"slo": pl.String, "kind": pl.String, "metric": pl.String, "threshold_s": pl.Float64, "objective": pl.Float64, "sli": pl.Float64,
              "budget_left": pl.Float64, "burn_5m": pl.Float64, "burn_1h": pl.Float64, "burn_6h": pl.Float64, "alerts": pl.String, "error": pl.String}
    return pl.DataFrame(rows, schema=schema) if rows else pl.DataFrame(schema=schema)


def record_price(store: Store, record: dict[str, Any], *, recorded_by: str, now: dt.datetime | None = None) -> dict[str, Any]:
    """Store one price-book row (a re-sent row of the same site, model and start updates it) and append it
    to the audit log: who set which price, when. ``NotFound`` for a site not in the inventory."""
    if store.read("site").filter(pl.col("site_id") == record["site_id"]).height == 0:
        raise NotFound(f"no site {str(record['site_id'])[:200]!r} in the inventory")
    row = {**record, "valid_from": as_utc(record["valid_from"]), "recorded_by": recorded_by, "recorded_at": as_utc(now or dt.datetime.now(dt.UTC))}
    store.write_frames([(SF.PRICE_BOOK, F.conform(SF.PRICE_BOOK, pl.DataFrame([row])))], source=f"price_book:{record['site_id']}")
    out = {k: (v.isoformat() if isinstance(v, dt.datetime) else v) for k, v in row.items()}
    auditlog.log(store, actor=recorded_by, action="price_book", subject=f"site:{record['site_id']}", payload=out)
    return out


def price_book(store: Store, site_id: str | None = None) -> pl.DataFrame:
    df = store.read("price_book")
    return df.filter(pl.col("site_id") == site_id) if site_id is not None and df.height else df


def cost_per_token(store: Store, deployment: str, *, start: dt.datetime, end: dt.datetime) -> dict[str, Any]:
    """Money per million output tokens of the deployment over the window, from the price book: the GPU-hours
    its pods held at their GPU-hour price plus its facility energy at the site's tariff."""
    e = energy_per_token(store, deployment, start=start, end=end)
    hosts = [h for h in _pods(store, deployment)["host"].to_list() if h]
    site = store.query("SELECT site_id FROM host WHERE host = ?", [hosts[0]], {"site_id": pl.String}) if hosts else None
    if site is None or site.height == 0 or site["site_id"][0] is None:
        raise NotFound(f"deployment {deployment[:200]!r} runs on no host placed at a site: no price applies")
    held = _held(store, deployment, start, end)
    gpus = store.read("gpu", gpu_uuid=held["gpu_uuid"].unique().to_list()) if held.height else store.read("gpu", limit=0)
    models = dict(zip(gpus["gpu_uuid"], gpus["model_name"].fill_null(""))) if gpus.height else {}
    kwh = e["gpu_energy_j"] / serving_energy.J_PER_KWH if e["gpu_energy_j"] is not None and e["basis"] != "none" else 0.0
    if e["pue"] is not None and e["pue"] == e["pue"]:
        kwh *= e["pue"]
    c = serving_energy.cost_per_token(deployment, held=held, gpu_models=models, site_id=site["site_id"][0], prices=price_book(store),
                                      energy_kwh=kwh, output_tokens=e["output_tokens"])
    return {**c.to_dict(), "site_id": site["site_id"][0], "start": start, "end": end}


def serving_vs_training_cost(store: Store, model_name: str, *, projection_days: int = 28) -> dict[str, Any]:
    """A model's training cost against its cumulative serving cost from the price book, with the date serving
    passed training (observed, or projected at the recent daily serving cost): the energy comparison of
    ``services.energy.serving_vs_training`` in money, by the same crossover rule."""
    jobs = energy_service.model_jobs(store, model_name)
    mine = jobs.filter((pl.col("model_name") == model_name) & pl.col("kind").is_in(["training", "inference"]))
    if mine.height == 0:
        raise NotFound(f"no training or inference job of model {model_name[:200]!r} in the job inventory")
    minutes = store.read("job_energy_minute", job_id=mine["job_id"].to_list())
    sites = store.read("site")
    pue = {r["site_id"]: r["declared_pue"] for r in sites.iter_rows(named=True) if r["declared_pue"] and r["declared_pue"] >= 1}
    costed, currency = serving_energy.minute_costs(minutes, price_book(store), pue)
    unpriced = int(costed["cost"].is_null().sum()) if costed.height else 0
    attributed = costed.filter(pl.col("cost").is_not_null()).select("minute", "job_id", pl.col("cost").alias("energy_j"))
    res = energy_analysis.serving_vs_training(attributed, mine, projection_days=projection_days).filter(pl.col("model_name") == model_name)
    row = res.row(0, named=True) if res.height else {}
    return {"model_name": model_name, "currency": currency, "training_cost": row.get("training_energy_j"),
            "serving_cost": row.get("serving_energy_j", 0.0), "serving_days": row.get("serving_days", 0),
            "crossover_date": row["crossover_date"].isoformat() if row.get("crossover_date") else None,
            "crossover_basis": row.get("crossover_basis", "none"), "unpriced_job_minutes": unpriced,
            "cost_basis": "GPU-seconds held x the site's GPU-hour price + energy x PUE x the site's tariff, each valid at that minute"}

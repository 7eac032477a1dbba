"""Energy per output token of a serving deployment: the energy of the GPUs its replicas held, over the output
tokens they generated in the same window.

The GPUs come from pod attribution: a minute of a GPU counts for the deployment when dcgm-exporter's
``gpu_workload`` shows one of the deployment's pods holding it in that minute (the per-minute per-GPU
roll-up ``gpu_energy_minute`` supplies the joules). Where no attribution is stored, a server that meters its
GPUs itself (Triton's ``nv_energy_consumption``, a joules counter since the server started) gives the
energy as that counter's increase; the result's ``basis`` says which. Facility energy is GPU energy × PUE
(ISO/IEC 30134-2: PUE = facility energy / IT energy; applied to the GPU share it counts GPU energy as the
IT energy and so leaves out CPUs, memory and network, a lower bound). Per million tokens, as the MLPerf
Inference power results and the serving-cost literature quote it.

Pure: frames in, a dataclass out.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import polars as pl

from fleetscope.core.frames import require_columns

J_PER_KWH = 3.6e6


@dataclass(frozen=True)
class EnergyPerToken:
    deployment: str
    basis: str  # gpu_energy_minute, server_energy_counter, or none
    gpus: int
    gpu_energy_j: float
    output_tokens: float
    j_per_token: float
    gpu_kwh_per_million_tokens: float
    pue: float
    facility_kwh_per_million_tokens: float

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def held_minutes(workload: pl.DataFrame, pods: pl.DataFrame) -> pl.DataFrame:
    """``minute, gpu_uuid`` of every minute in which one of ``pods`` (``namespace, pod``; a null namespace
    matches any) held a GPU, from ``gpu_workload`` samples."""
    require_columns(workload, "gpu_workload", ("ts", "gpu_uuid", "namespace", "pod"))
    if workload.height == 0 or pods.height == 0:
        return pl.DataFrame(schema={"minute": workload.schema["ts"], "gpu_uuid": pl.String})
    exact = workload.join(pods.filter(pl.col("namespace").is_not_null()).select("namespace", "pod"), on=["namespace", "pod"])
    anyns = workload.join(pods.filter(pl.col("namespace").is_null()).select("pod"), on="pod")
    both = pl.concat([exact.select("ts", "gpu_uuid"), anyns.select("ts", "gpu_uuid")])
    return both.select(pl.col("ts").dt.truncate("1m").alias("minute"), "gpu_uuid").unique().sort("minute", "gpu_uuid")


def energy_per_token(deployment: str, *, output_tokens: float, gpu_minutes: pl.DataFrame | None = None, held: pl.DataFrame | None = None,
                     server_energy_j: float | None = None, pue: float | None = None) -> EnergyPerToken:
    """Energy per output token from the held GPU-minutes' roll-up (``gpu_minutes``: ``minute, gpu_uuid,
    energy_j``), else from the server's own energy counter increase ``server_energy_j``."""
    basis, gpus, energy = "none", 0, math.nan
    if gpu_minutes is not None and held is not None and held.height:
        require_columns(gpu_minutes, "gpu_energy_minute", ("minute", "gpu_uuid", "energy_j"))
        joined = gpu_minutes.join(held, on=["minute", "gpu_uuid"])
        if joined.height:
            basis, gpus, energy = "gpu_energy_minute", held["gpu_uuid"].n_unique(), float(joined["energy_j"].sum())
    if basis == "none" and server_energy_j is not None:
        basis, energy = "server_energy_counter", float(server_energy_j)
    jpt = energy / output_tokens if output_tokens > 0 and math.isfinite(energy) else math.nan
    kwh_m = jpt * 1e6 / J_PER_KWH
    p = pue if pue is not None and pue >= 1 else math.nan
    return EnergyPerToken(deployment, basis, gpus, energy, float(output_tokens), jpt, kwh_m, p, kwh_m * p)


@dataclass(frozen=True)
class CostPerToken:
    deployment: str
    currency: str | None
    gpu_hours: float
    gpu_cost: float
    energy_kwh: float
    energy_cost: float
    output_tokens: float
    cost_per_million_tokens: float
    unpriced_gpu_hours: float  # GPU-hours with no GPU-hour price for their site and model
    note: str = ""

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def price_at(prices: pl.DataFrame, site_id: str | None, gpu_model: str, at: object, col: str) -> tuple[float | None, str | None]:
    """The newest price of ``col`` (a ``price_book`` column) valid at ``at`` for the site and GPU model, else
    the site's any-GPU row; (None, None) where the site has none (or no site is known)."""
    if site_id is None or prices.height == 0:
        return None, None
    for model in (gpu_model, ""):
        p = prices.filter((pl.col("site_id") == site_id) & (pl.col("gpu_model") == model) & (pl.col("valid_from") <= at)
                          & pl.col(col).is_not_null()).sort("valid_from")
        if p.height:
            return float(p[col][-1]), str(p["currency"][-1])
    return None, None


def cost_per_token(deployment: str, *, held: pl.DataFrame, gpu_models: dict[str, str], site_id: str, prices: pl.DataFrame,
                   energy_kwh: float, output_tokens: float) -> CostPerToken:
    """Money per million output tokens: each held GPU-minute at its site's GPU-hour price for its model (or the
    site's any-GPU price), valid at that minute, plus ``energy_kwh`` (facility energy where a PUE is known) at
    the tariff valid at the window's last minute. Prices in more than one currency are refused (no exchange
    rates are kept)."""
    require_columns(prices, "price_book", ("site_id", "gpu_model", "valid_from", "currency", "gpu_hour_price", "energy_price_per_kwh"))
    gpu_cost = unpriced = 0.0
    currencies: set[str] = set()
    by_gpu_minute = held.group_by("gpu_uuid", "minute").len() if held.height else held
    for r in by_gpu_minute.iter_rows(named=True) if held.height else []:
        price, cur = price_at(prices, site_id, gpu_models.get(r["gpu_uuid"], ""), r["minute"], "gpu_hour_price")
        if price is None:
            unpriced += 1
        else:
            gpu_cost += price / 60
            currencies.add(cur or "")
    energy_cost, note = 0.0, ""
    if held.height and energy_kwh and math.isfinite(energy_kwh):
        tariff, cur = price_at(prices, site_id, "", held["minute"].max(), "energy_price_per_kwh")
        if tariff is None:
            note = "no energy tariff for the site: energy not priced"
        else:
            energy_cost = energy_kwh * tariff
            currencies.add(cur or "")
    if len(currencies) > 1:
        raise ValueError(f"prices of {deployment!r} are in several currencies ({', '.join(sorted(currencies))}); record them in one")
    total = gpu_cost + energy_cost
    per_m = total / output_tokens * 1e6 if output_tokens > 0 and currencies else math.nan
    gpu_hours = by_gpu_minute.height / 60 if held.height else 0.0
    return CostPerToken(deployment, next(iter(currencies)) if currencies else None, gpu_hours, gpu_cost, float(energy_kwh or 0.0),
                        energy_cost, float(output_tokens), per_m, unpriced / 60, note)


def minute_costs(minutes: pl.DataFrame, prices: pl.DataFrame, pue: dict[str, float] | None = None) -> tuple[pl.DataFrame, str | None]:
    """Money of each job-minute (``job_energy_minute`` rows: ``minute, job_id, site_id, energy_j, allocated_s``):
    the GPU-seconds held at the site's any-GPU GPU-hour price valid then, plus the energy × the site's PUE at
    its tariff valid then. Adds ``cost`` (null where the site has neither price) and returns the currency;
    prices in several currencies are refused. Job-minutes carry no GPU model, so per-model prices are not
    used here."""
    require_columns(minutes, "job_energy_minute", ("minute", "job_id", "site_id", "energy_j", "allocated_s"))
    site_prices = prices.filter(pl.col("gpu_model") == "")
    currencies = set(site_prices["currency"].unique().to_list()) if site_prices.height else set()
    if len(currencies) > 1:
        raise ValueError(f"site prices are in several currencies ({', '.join(sorted(currencies))}); record them in one")
    df = minutes.sort("minute")
    for col in ("gpu_hour_price", "energy_price_per_kwh"):
        p = site_prices.filter(pl.col(col).is_not_null()).select("site_id", pl.col("valid_from").alias("minute"), col).sort("minute")
        # both sides sorted by minute above; polars cannot verify it within groups, hence the flag
        df = df.join_asof(p, on="minute", by="site_id", strategy="backward", check_sortedness=False) if p.height else df.with_columns(pl.lit(None, pl.Float64).alias(col))
    factor = pl.col("site_id").replace_strict(pue or {}, default=1.0, return_dtype=pl.Float64)
    gpu = pl.col("allocated_s").fill_null(0) / 3600 * pl.col("gpu_hour_price")
    energy = pl.col("energy_j").fill_null(0) / J_PER_KWH * factor * pl.col("energy_price_per_kwh")
    cost = pl.when(pl.col("gpu_hour_price").is_null() & pl.col("energy_price_per_kwh").is_null()).then(None).otherwise(
        gpu.fill_null(0) + energy.fill_null(0))
    return df.with_columns(cost.alias("cost")).drop("gpu_hour_price", "energy_price_per_kwh"), next(iter(currencies), None)

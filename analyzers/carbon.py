"""Carbon: location- and market-based Scope 2 emissions, embodied emissions, a carbon-aware hint and the
per-model training footprint governance reports.

- **Location-based** (GHG Protocol Scope 2 Guidance, 2015, ch. 6): energy × grid average intensity of where
  and when it was consumed — the site's ingested hourly intensity series (``metric_sample`` series
  ``grid_intensity_g_per_kwh{site="..."}``) where present, else the annual table shipped in
  ``analyzers/data/grid_intensity.csv`` (derived from CodeCarbon / Our World in Data / Green Algorithms;
  see ``analyzers/data/ATTRIBUTION.md``), matched by the site's grid region, then its country, then the
  world average. Each row says which intensity it used.
- **Market-based** (same guidance, ch. 6-7): energy covered by contractual instruments (PPAs, RECs, GOs,
  supplier-specific rates) held for the site and period takes the instrument's emission factor; the rest
  takes the residual mix, or, where no residual mix is known, the location-based grid average (the guidance
  allows this with disclosure; the basis column says so). Always reported *beside* the location-based
  figure (dual reporting), never instead of it.
- **Embodied** emissions (Scope 3, reported separately): per GPU and per server, amortised over service life
  by hours used, the method of Luccioni, Viguier & Ligozat, "Estimating the Carbon Footprint of BLOOM, a
  176B Parameter Language Model", JMLR 24(253), 2023 (arXiv:2211.02001): 150 kgCO2e per GPU and 2,500 kgCO2e
  per server (HPE Apollo 6500 Gen10 Plus), a 6-year life at 85 % use. For BLOOM's 1,082,990 A100-hours on
  8-GPU nodes this gives the paper's 11.2 t (3.64 t GPUs + 7.57 t servers).
- **Carbon-aware hint**: for flexible work, the emissions saved by running the same energy in the site's
  lowest-intensity hours within a horizon.
- **Model footprint** for governance (EU AI Act, Regulation (EU) 2024/1689, Annex XI Section 1 point 2(d)
  compute and training time, 2(e) known or estimated energy — "where the energy consumption of the model is
  unknown, the energy consumption may be based on information about computational resources used"):
  measured where telemetry covers the run, estimated from compute where it does not, the basis stated.

Pure: polars over frames from ``analyzers.energy`` and the canonical inventory. The only I/O is reading the
shipped table in :func:`load_grid_intensity`.
"""

from __future__ import annotations

import datetime as dt
import math
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import polars as pl

from fleetscope.core.errors import ValidationError
from fleetscope.core.frames import ENERGY_INSTRUMENT

__all__ = [
    "GRID_TABLE_PATH",
    "INTENSITY_SERIES",
    "INSTRUMENT_SCHEMA",
    "INSTRUMENT_KINDS",
    "check_instrument",
    "load_grid_intensity",
    "site_intensity",
    "hourly_intensity",
    "emissions_kgco2e",
    "location_based",
    "scope2",
    "allocate_scope2",
    "EmbodiedFactors",
    "BLOOM_EMBODIED",
    "embodied_kgco2e",
    "embodied_by",
    "shift_hint",
    "ComputeEstimate",
    "ModelFootprint",
    "model_footprint",
]

GRID_TABLE_PATH = Path(__file__).resolve().parent / "data" / "grid_intensity.csv"
INTENSITY_SERIES = "grid_intensity_g_per_kwh"  # metric_sample series, label site="<site_id>"
J_PER_KWH = 3.6e6
WORLD = "WLD"

# Contractual instruments held for a site (GHG Protocol Scope 2 quality criteria: the instrument must match
# the site's market and the period of consumption; that is the caller's responsibility to record). The
# columns scope2 reads, declared once in the stored frame (table ``energy_instrument``).
INSTRUMENT_SCHEMA: dict[str, pl.DataType] = {
    c: ENERGY_INSTRUMENT.schema[c] for c in ("instrument_id", "site_id", "kind", "start", "end", "volume_mwh", "g_per_kwh")
}

# The instrument types of the Scope 2 Guidance, Table 7.1: energy attribute certificates (RECs in North
# America, GOs in Europe, I-RECs elsewhere), direct contracts (physical and virtual PPAs), supplier-specific
# emission rates and green tariffs.
INSTRUMENT_KINDS: tuple[str, ...] = ("ppa", "virtual_ppa", "rec", "go", "i_rec", "green_tariff", "supplier_specific")
MAX_VOLUME_MWH = 1e8  # 100 TWh: more than any one site consumes in a decade; above it is a unit mistake
MAX_G_PER_KWH = 2000.0  # above the dirtiest generation (lignite, ~1,100-1,200 g lifecycle)
MAX_TERM = dt.timedelta(days=366 * 30)
_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:#/+-]{0,199}$")


def emissions_kgco2e(energy_j: float, g_per_kwh: float) -> float:
    """kgCO2e of ``energy_j`` at ``g_per_kwh`` (Patterson et al. 2021 §2.5: tCO2e = MWh × tCO2e/MWh)."""
    if energy_j < 0 or g_per_kwh < 0:
        raise ValueError("energy and intensity must be >= 0")
    return energy_j / J_PER_KWH * g_per_kwh / 1000.0


def _kg_expr(energy: pl.Expr, g_per_kwh: pl.Expr) -> pl.Expr:
    return energy / J_PER_KWH * g_per_kwh / 1000.0


# --- grid intensity ----------------------------------------------------------------------------------


def load_grid_intensity(path: Path | str | None = None) -> pl.DataFrame:
    """The annual grid-intensity table: country (ISO alpha-3; ``WLD`` world), region ("" for the whole
    country), year, g_per_kwh, basis, source (file and row it was derived from)."""
    df = pl.read_csv(
        path or GRID_TABLE_PATH,
        schema={"country": pl.String, "region": pl.String, "year": pl.Int64, "g_per_kwh": pl.Float64, "basis": pl.String, "source": pl.String},
    )
    return df.with_columns(pl.col("region").fill_null(""))


def site_intensity(site: pl.DataFrame, table: pl.DataFrame | None = None) -> pl.DataFrame:
    """Annual intensity per site: its ``grid_region`` if the table has it (region code, case-insensitive),
    else its ``country`` (alpha-3), else the world average. Columns: site_id, g_per_kwh, year,
    intensity_source (the table's source), intensity_match (region/country/world)."""
    table = load_grid_intensity() if table is None else table
    world = table.filter((pl.col("country") == WORLD) & (pl.col("region") == ""))
    rows = []
    for s in site.iter_rows(named=True):
        region, country = (s.get("grid_region") or "").upper(), (s.get("country") or "").upper()
        hit, how = None, None
        if region:
            r = table.filter(pl.col("region").str.to_uppercase() == region)
            if r.height:
                hit, how = r.row(0, named=True), "region"
        if hit is None and country:
            r = table.filter((pl.col("country") == country) & (pl.col("region") == ""))
            if r.height:
                hit, how = r.row(0, named=True), "country"
        if hit is None:
            hit, how = world.row(0, named=True), "world"
        rows.append({"site_id": s["site_id"], "g_per_kwh": hit["g_per_kwh"], "year": hit["year"],
                     "intensity_source": hit["source"], "intensity_match": how})
    return pl.DataFrame(rows, schema={"site_id": pl.String, "g_per_kwh": pl.Float64, "year": pl.Int64,
                                      "intensity_source": pl.String, "intensity_match": pl.String})


_SITE_LABEL = re.compile(r'site="((?:[^"\\]|\\.)*)"')


def hourly_intensity(metric_sample: pl.DataFrame) -> pl.DataFrame:
    """Hourly grid intensity per site from ``grid_intensity_g_per_kwh{site="..."}`` series: site_id, hour,
    g_per_kwh (mean of the readings stamped in that UTC hour). Non-finite or negative readings are dropped."""
    ms = metric_sample.filter(pl.col("series").str.starts_with(INTENSITY_SERIES + "{"))
    return (
        ms.with_columns(pl.col("series").str.extract(_SITE_LABEL.pattern, 1).alias("site_id"))
        .filter(pl.col("site_id").is_not_null() & pl.col("value").is_finite() & (pl.col("value") >= 0))
        .group_by("site_id", pl.col("ts").dt.truncate("1h").alias("hour"))
        .agg(pl.col("value").mean().alias("g_per_kwh"))
        .sort("site_id", "hour")
    )


def location_based(
    energy: pl.DataFrame,
    site: pl.DataFrame,
    *,
    table: pl.DataFrame | None = None,
    metric_sample: pl.DataFrame | None = None,
    time_col: str = "minute",
    energy_col: str = "energy_j",
) -> pl.DataFrame:
    """Location-based emissions of each row of ``energy`` (columns site_id, ``time_col``, ``energy_col``):
    adds g_per_kwh, intensity_basis (``hourly`` or ``annual <year>: <source>``) and kgco2e.

    Hourly intensity from ``metric_sample`` is used for the rows whose site and hour it covers; the others
    fall back to the annual table. A row whose site is unknown to ``site`` raises ``ValidationError``.
    """
    for col in ("site_id", time_col, energy_col):
        if col not in energy.columns:
            raise ValidationError("missing required column", frame="energy", field=col)
    annual = site_intensity(site, table)
    unknown = energy.join(annual, on="site_id", how="anti")
    if unknown.height:
        raise ValidationError(f"site {unknown['site_id'][0]!r} is not in the site inventory", frame="energy", field="site_id")
    df = energy.with_columns(pl.col(time_col).dt.truncate("1h").alias("_hour"))
    hourly = hourly_intensity(metric_sample) if metric_sample is not None and metric_sample.height else None
    if hourly is not None and hourly.height:
        df = df.join(hourly.rename({"hour": "_hour", "g_per_kwh": "_g_hourly"}), on=["site_id", "_hour"], how="left")
    else:
        df = df.with_columns(pl.lit(None, pl.Float64).alias("_g_hourly"))
    df = df.join(annual.select("site_id", pl.col("g_per_kwh").alias("_g_annual"), "year", "intensity_source"), on="site_id", how="left")
    return df.with_columns(
        pl.coalesce("_g_hourly", "_g_annual").alias("g_per_kwh"),
        pl.when(pl.col("_g_hourly").is_not_null())
        .then(pl.lit("hourly"))
        .otherwise(pl.format("annual {}: {}", pl.col("year"), pl.col("intensity_source")))
        .alias("intensity_basis"),
    ).with_columns(_kg_expr(pl.col(energy_col), pl.col("g_per_kwh")).alias("kgco2e")).drop(
        "_hour", "_g_hourly", "_g_annual", "year", "intensity_source"
    )


def check_instrument(record: dict) -> dict:
    """A contractual instrument as recorded (``instrument_id, site_id, kind, start, end, volume_mwh,
    g_per_kwh`` and optionally ``supplier``), checked: returns the record with times in UTC and numbers as
    floats, or raises ``ValidationError`` naming the field. The Scope 2 Guidance's quality criteria that a
    record can show: a known instrument type, a consumption period with a start and an end, a volume and
    an emission factor that are physically possible."""

    def bad(field: str, message: str) -> ValidationError:
        return ValidationError(message, frame="energy_instrument", field=field)

    iid = record.get("instrument_id")
    if not isinstance(iid, str) or not _ID_RE.match(iid):
        raise bad("instrument_id", "must be 1-200 characters: letters, digits and . _ : # / + -, starting with a letter or digit")
    site = record.get("site_id")
    if not isinstance(site, str) or not site or len(site) > 200:
        raise bad("site_id", "must be a site id of 1-200 characters")
    kind = record.get("kind")
    if kind not in INSTRUMENT_KINDS:
        raise bad("kind", f"{str(kind)[:50]!r} is not an instrument type: expected one of {', '.join(INSTRUMENT_KINDS)}")
    times = {}
    for field in ("start", "end"):
        t = record.get(field)
        if not isinstance(t, dt.datetime) or t.tzinfo is None or t.utcoffset() is None:
            raise bad(field, "must be a date-time with a time zone (RFC 3339)")
        times[field] = t.astimezone(dt.timezone.utc)
    if times["end"] <= times["start"]:
        raise bad("end", "must be after start")
    if times["end"] - times["start"] > MAX_TERM:
        raise bad("end", f"the period may span at most {MAX_TERM.days // 366} years")
    nums = {}
    for field, lo, hi, lo_open in (("volume_mwh", 0.0, MAX_VOLUME_MWH, True), ("g_per_kwh", 0.0, MAX_G_PER_KWH, False)):
        v = record.get(field)
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
            raise bad(field, "must be a finite number")
        if (v <= lo if lo_open else v < lo) or v > hi:
            raise bad(field, f"{v} is outside {'(' if lo_open else '['}{lo:g}, {hi:g}]")
        nums[field] = float(v)
    supplier = record.get("supplier")
    if supplier is not None and (not isinstance(supplier, str) or len(supplier) > 500 or any(ord(c) < 32 for c in supplier)):
        raise bad("supplier", "must be text of at most 500 characters without control characters")
    return {"instrument_id": iid, "site_id": site, "kind": kind, **times, **nums, "supplier": supplier}


def scope2(
    located: pl.DataFrame,
    instruments: pl.DataFrame | None,
    *,
    period_start: dt.datetime,
    period_end: dt.datetime,
    residual_mix: pl.DataFrame | None = None,
    time_col: str = "minute",
    energy_col: str = "energy_j",
) -> pl.DataFrame:
    """Location- and market-based Scope 2 emissions per site over [period_start, period_end) — GHG Protocol
    Scope 2 Guidance (dual reporting).

    ``located``: rows from :func:`location_based` (site_id, time, energy, kgco2e). ``instruments``:
    :data:`INSTRUMENT_SCHEMA`; an instrument's volume is pro-rated to the part of its term inside the period
    and covers at most the site's energy consumed within that part (instruments applied in the given order;
    one never covers energy an earlier one already covered). ``residual_mix``: site_id, g_per_kwh.
    Returns site_id, energy_j, location_kgco2e, market_kgco2e, covered_energy_j, instruments (ids, comma
    separated), covered_by (per instrument used: instrument_id, kind, g_per_kwh, covered_energy_j, kgco2e)
    and uncovered_basis — the two emission figures side by side. Market-based = Σ covered energy ×
    instrument factor + uncovered energy × residual-mix factor (the guidance's ch. 6 calculation).
    """
    ps, pe = period_start, period_end
    if pe <= ps:
        raise ValidationError("period_end must be after period_start", frame="period")
    inp = located.filter((pl.col(time_col) >= ps) & (pl.col(time_col) < pe))
    sites = inp.group_by("site_id").agg(pl.col(energy_col).sum().alias("energy_j"), pl.col("kgco2e").sum().alias("location_kgco2e")).sort("site_id")
    resid = {}
    if residual_mix is not None:
        resid = dict(zip(residual_mix["site_id"].to_list(), residual_mix["g_per_kwh"].to_list()))
    inst = instruments if instruments is not None else pl.DataFrame(schema=INSTRUMENT_SCHEMA)
    rows = []
    for s in sites.iter_rows(named=True):
        sid, e_total, loc = s["site_id"], s["energy_j"], s["location_kgco2e"]
        site_rows = inp.filter(pl.col("site_id") == sid)
        covered_total, market_covered, used = 0.0, 0.0, []
        detail: list[dict] = []
        windows: list[tuple[dt.datetime, dt.datetime, float]] = []
        for ins in inst.filter(pl.col("site_id") == sid).iter_rows(named=True):
            a, b = max(ps, ins["start"]), min(pe, ins["end"])
            if b <= a:
                continue
            term_s = (ins["end"] - ins["start"]).total_seconds()
            if term_s <= 0 or ins["volume_mwh"] is None or ins["volume_mwh"] < 0:
                raise ValidationError("instrument needs end > start and volume_mwh >= 0", frame="instrument", field="volume_mwh")
            volume_j = ins["volume_mwh"] * 1000 * J_PER_KWH * (b - a).total_seconds() / term_s
            in_window = float(site_rows.filter((pl.col(time_col) >= a) & (pl.col(time_col) < b))[energy_col].sum())
            # energy of this window already covered by earlier instruments whose windows overlap it
            already = sum(c for (wa, wb, c) in windows if wa < b and a < wb)
            cov = max(0.0, min(volume_j, in_window - already, e_total - covered_total))
            if cov > 0:
                windows.append((a, b, cov))
                covered_total += cov
                kg = _kg_py(cov, ins["g_per_kwh"])
                market_covered += kg
                used.append(ins["instrument_id"])
                detail.append({"instrument_id": ins["instrument_id"], "kind": ins["kind"], "g_per_kwh": ins["g_per_kwh"],
                               "covered_energy_j": cov, "kgco2e": kg})
        uncovered = max(0.0, e_total - covered_total)
        if sid in resid and resid[sid] is not None:
            market_rest, basis = _kg_py(uncovered, resid[sid]), "residual mix"
        else:
            market_rest = loc * (uncovered / e_total) if e_total > 0 else 0.0
            basis = "location-based grid average (no residual mix known; disclosed per GHG Protocol Scope 2 Guidance)"
        rows.append({"site_id": sid, "energy_j": e_total, "location_kgco2e": loc, "market_kgco2e": market_covered + market_rest,
                     "covered_energy_j": covered_total, "instruments": ",".join(used), "covered_by": detail, "uncovered_basis": basis})
    return pl.DataFrame(rows, schema=_SCOPE2_SCHEMA)


_COVERED_BY = pl.List(pl.Struct({"instrument_id": pl.String, "kind": pl.String, "g_per_kwh": pl.Float64,
                                 "covered_energy_j": pl.Float64, "kgco2e": pl.Float64}))
_SCOPE2_SCHEMA = {"site_id": pl.String, "energy_j": pl.Float64, "location_kgco2e": pl.Float64, "market_kgco2e": pl.Float64,
                  "covered_energy_j": pl.Float64, "instruments": pl.String, "covered_by": _COVERED_BY, "uncovered_basis": pl.String}


def allocate_scope2(part: pl.DataFrame, sites: pl.DataFrame) -> pl.DataFrame:
    """A share of each site's market-based emissions for part of its energy (a job's, a model's): rows of
    ``part`` (site_id, energy_j, any other columns) get ``market_kgco2e`` = energy_j × the site's
    market_kgco2e / energy_j over the same period (``sites``: rows of :func:`scope2`). Instruments are bought
    for a site's consumption, not a job's, so each kWh consumed there carries the site's market-based
    average; the parts of a site sum to the site's figure. Null where the site used no energy."""
    rate = sites.select(
        "site_id", pl.when(pl.col("energy_j") > 0).then(pl.col("market_kgco2e") / pl.col("energy_j")).alias("_kg_per_j")
    )
    return part.join(rate, on="site_id", how="left").with_columns((pl.col("energy_j") * pl.col("_kg_per_j")).alias("market_kgco2e")).drop("_kg_per_j")


def _kg_py(energy_j: float, g_per_kwh: float) -> float:
    return energy_j / J_PER_KWH * g_per_kwh / 1000.0


# --- embodied emissions ------------------------------------------------------------------------------


@dataclass(frozen=True)
class EmbodiedFactors:
    """Manufacturing emissions and the life they are spread over."""

    gpu_kgco2e: float
    server_kgco2e: float
    gpus_per_server: int
    lifetime_years: float
    use_ratio: float
    source: str

    def per_gpu_hour_kgco2e(self) -> float:
        """GPU plus its share of the server, per hour of use."""
        hours = self.lifetime_years * 8760.0 * self.use_ratio
        return (self.gpu_kgco2e + self.server_kgco2e / self.gpus_per_server) / hours


BLOOM_EMBODIED = EmbodiedFactors(
    gpu_kgco2e=150.0,
    server_kgco2e=2500.0,
    gpus_per_server=8,
    lifetime_years=6.0,
    use_ratio=0.85,
    source="Luccioni, Viguier & Ligozat 2023 (JMLR 24(253); arXiv:2211.02001), §4.1: 150 kgCO2e per A100, "
    "2,500 kgCO2e per HPE Apollo 6500 server, 6-year life, 85 % use",
)


def embodied_kgco2e(gpu_hours: float, factors: EmbodiedFactors = BLOOM_EMBODIED) -> dict[str, float]:
    """Embodied emissions attributable to ``gpu_hours`` of use: GPU part, server part (servers counted as
    gpu_hours / gpus_per_server server-hours) and total, in kgCO2e."""
    if gpu_hours < 0:
        raise ValueError("gpu_hours must be >= 0")
    hours = factors.lifetime_years * 8760.0 * factors.use_ratio
    gpu = gpu_hours * factors.gpu_kgco2e / hours
    server = gpu_hours / factors.gpus_per_server * factors.server_kgco2e / hours
    return {"gpu_kgco2e": gpu, "server_kgco2e": server, "embodied_kgco2e": gpu + server}


def embodied_by(attributed: pl.DataFrame, by: Sequence[str], factors: EmbodiedFactors = BLOOM_EMBODIED) -> pl.DataFrame:
    """Embodied emissions per group of ``attributed`` rows (:data:`analyzers.energy.ATTRIBUTED_SCHEMA`), by
    GPU-hours held (``allocated_s``); idle GPU time (job_id null) carries its share too. Adds gpu_hours and
    embodied_kgco2e; reported separately from Scope 2."""
    rate = factors.per_gpu_hour_kgco2e()
    return (
        attributed.group_by(list(by))
        .agg((pl.col("allocated_s").sum() / 3600.0).alias("gpu_hours"))
        .with_columns((pl.col("gpu_hours") * rate).alias("embodied_kgco2e"), pl.lit(factors.source).alias("embodied_basis"))
        .sort(list(by), nulls_last=True)
    )


# --- carbon-aware hint -------------------------------------------------------------------------------


def shift_hint(job_hourly: pl.DataFrame, intensity: pl.DataFrame, *, horizon_h: int = 24) -> dict:
    """What running a flexible job's energy in the site's lowest-intensity hours would save.

    ``job_hourly``: hour, energy_j (one job at one site); ``intensity``: hour, g_per_kwh for that site
    (e.g. a day-ahead forecast or :func:`hourly_intensity`). The job keeps its number of hours and its mean
    hourly energy, but may run in any hours within ``horizon_h`` of its first hour. Returns actual_kgco2e,
    shifted_kgco2e, saving_kgco2e, saving_ratio, best_hours, and ``basis``; ``feasible`` False where
    the intensity series does not cover the job or the horizon is shorter than the job.
    """
    job = job_hourly.filter(pl.col("energy_j") > 0).sort("hour")
    if job.height == 0:
        return {"feasible": False, "basis": "no energy to shift"}
    start = job["hour"][0]
    act = job.join(intensity, on="hour", how="left")
    if act["g_per_kwh"].null_count():
        return {"feasible": False, "basis": "intensity missing for some hours the job ran"}
    actual = float((act["energy_j"] / J_PER_KWH * act["g_per_kwh"] / 1000).sum())
    window = intensity.filter((pl.col("hour") >= start) & (pl.col("hour") < start + dt.timedelta(hours=horizon_h)))
    n = job.height
    if window.height < n:
        return {"feasible": False, "actual_kgco2e": actual, "basis": f"horizon of {horizon_h} h has fewer hours than the job's {n}"}
    best = window.sort("g_per_kwh", "hour").head(n)
    mean_e = float(job["energy_j"].mean())
    shifted = float((mean_e / J_PER_KWH * best["g_per_kwh"] / 1000).sum())
    saving = actual - shifted
    return {
        "feasible": True,
        "actual_kgco2e": actual,
        "shifted_kgco2e": shifted,
        "saving_kgco2e": saving,
        "saving_ratio": saving / actual if actual > 0 else 0.0,
        "best_hours": sorted(best["hour"].to_list()),
        "basis": f"same {n} h at mean hourly energy moved to the {n} lowest-intensity hours within {horizon_h} h",
    }


# --- model footprint for governance ------------------------------------------------------------------

LEGAL_BASIS = "Regulation (EU) 2024/1689 (AI Act), Annex XI Section 1 point 2(d)-(e)"


@dataclass(frozen=True)
class ComputeEstimate:
    """What is known of a run without telemetry: FLOPs (or time), chips, their peak, the utilisation reached
    (MFU), average power per chip, PUE and grid intensity. The Patterson et al. 2021 §2.5 estimate."""

    n_chips: int
    avg_power_w: float
    pue: float
    g_per_kwh: float
    training_flops: float | None = None
    peak_flops_per_s: float | None = None
    mfu: float | None = None
    training_time_s: float | None = None


@dataclass(frozen=True)
class ModelFootprint:
    """Training footprint of one model, each figure with its basis (measured / extrapolated / estimated)."""

    model_name: str
    training_flops: float | None
    flops_basis: str
    training_time_s: float | None
    time_basis: str
    energy_j: float | None
    energy_basis: str
    kgco2e: float | None
    emissions_basis: str
    telemetry_coverage_ratio: float | None
    estimate: bool
    legal_basis: str = LEGAL_BASIS
    market_kgco2e: float | None = None  # beside kgco2e (location-based), never instead of it
    market_basis: str = "unknown"

    def as_dict(self) -> dict:
        d = asdict(self)
        d["energy_kwh"] = None if self.energy_j is None else self.energy_j / J_PER_KWH
        return d


def model_footprint(
    model_name: str,
    *,
    job: pl.DataFrame,
    job_energy: pl.DataFrame | None = None,
    step: pl.DataFrame | None = None,
    estimate: ComputeEstimate | None = None,
    rank_aggregation: str = "sum",
    min_coverage_ratio: float = 0.99,
) -> ModelFootprint:
    """Training compute, time, energy and emissions of ``model_name`` for governance (AI Act Annex XI 1.2(d)-(e)).

    ``job``: the job inventory (kind ``training`` rows of this model count). ``job_energy``: per job
    (job_id, energy_j, covered_s, allocated_s, and optionally facility_energy_j, kgco2e (location-based),
    market_kgco2e and market_basis (market-based, on the same energy)) — e.g.
    ``energy_summary(attributed, ["job_id"])`` with PUE and location-based carbon applied. Energy is
    *measured* where telemetry covers at least ``min_coverage_ratio`` of the GPU-time the ranks held;
    *extrapolated* at the measured mean power where it covers less; *estimated from compute* (``estimate``)
    where there is none. Facility energy (with PUE) is reported when present, else GPU energy.
    """
    tj = job.filter((pl.col("model_name") == model_name) & (pl.col("kind") == "training"))
    ids = tj["job_id"].to_list()

    flops, flops_basis = None, "unknown"
    if step is not None and step.height and ids:
        st = step.filter(pl.col("job_id").is_in(ids))
        if st.height and st["model_flops"].drop_nulls().len():
            last = st.sort("start").group_by("job_id", "rank", "step").agg(pl.col("model_flops").last())
            agg = pl.col("model_flops").sum() if rank_aggregation == "sum" else pl.col("model_flops").max()
            flops = float(last.group_by("job_id", "step").agg(agg)["model_flops"].sum())
            flops_basis = "measured: model FLOPs reported per step (each step counted once)"
    if flops is None and estimate is not None and estimate.training_flops:
        flops, flops_basis = estimate.training_flops, "declared: training FLOPs supplied with the estimate"

    time_s, time_basis = None, "unknown"
    if tj.height and {"started_at", "ended_at"} <= set(tj.columns):
        spans = tj.filter(pl.col("started_at").is_not_null() & pl.col("ended_at").is_not_null())
        if spans.height:
            time_s = float((spans["ended_at"] - spans["started_at"]).dt.total_microseconds().sum()) / 1e6
            time_basis = "measured: wall time of the training jobs (started_at to ended_at)"
    if time_s is None and estimate is not None:
        if estimate.training_time_s:
            time_s, time_basis = estimate.training_time_s, "declared: training time supplied with the estimate"
        elif flops and estimate.peak_flops_per_s and estimate.mfu:
            time_s = flops / (estimate.n_chips * estimate.peak_flops_per_s * estimate.mfu)
            time_basis = "estimated: FLOPs / (chips × peak FLOP/s × MFU)"

    energy, e_basis, kg, c_basis, coverage, est = None, "unknown", None, "unknown", None, True
    mkg, m_basis = None, "unknown"
    je = job_energy.filter(pl.col("job_id").is_in(ids)) if (job_energy is not None and ids) else None
    if je is not None and je.height and float(je["covered_s"].sum()) > 0:
        covered, allocated = float(je["covered_s"].sum()), float(je["allocated_s"].sum())
        coverage = covered / allocated if allocated > 0 else None
        use_fac = "facility_energy_j" in je.columns and je["facility_energy_j"].null_count() == 0
        e_col = "facility_energy_j" if use_fac else "energy_j"
        measured_j = float(je[e_col].sum())
        scope = "facility energy (GPU energy × PUE)" if use_fac else "GPU energy (no PUE applied)"
        if coverage is not None and coverage >= min_coverage_ratio:
            energy, e_basis, est = measured_j, f"measured: {scope} from GPU telemetry ({coverage:.1%} of held GPU-time covered)", False
            factor = 1.0
        else:
            factor = allocated / covered
            energy = measured_j * factor
            e_basis = f"measured over {coverage:.1%} of held GPU-time, rest extrapolated at the measured mean power: {scope}"
        extrapolated = "" if factor == 1.0 else " (extrapolated)"
        if "kgco2e" in je.columns and je["kgco2e"].null_count() == 0:
            kg = float(je["kgco2e"].sum()) * factor
            c_basis = "location-based, from the per-minute energy and the site's grid intensity" + extrapolated
        if "market_kgco2e" in je.columns and je["market_kgco2e"].null_count() == 0:
            mkg = float(je["market_kgco2e"].sum()) * factor
            m_basis = "; ".join(sorted(set(je["market_basis"].drop_nulls().to_list()))) if "market_basis" in je.columns else "market-based"
            m_basis += extrapolated
        if use_fac and "estimate" in je.columns and bool(je["estimate"].any()):
            est = True
            e_basis += "; PUE declared, not metered (estimate)"
    elif estimate is not None and time_s:
        energy = estimate.n_chips * time_s * estimate.avg_power_w * estimate.pue
        e_basis = "estimated from compute: chips × time × average power × PUE (Patterson et al. 2021 §2.5), no telemetry for this run"
        kg = _kg_py(energy, estimate.g_per_kwh)
        c_basis = f"estimated: energy × {estimate.g_per_kwh} gCO2e/kWh"
    return ModelFootprint(model_name, flops, flops_basis, time_s, time_basis, energy, e_basis, kg, c_basis, coverage, est,
                          market_kgco2e=mkg, market_basis=m_basis)

"""Facility meters: PUE per site over a window or per time bucket, PUE applied to site IT energy, WUE.

PUE follows ISO/IEC 30134-2: PUE = total facility energy / IT equipment energy over the same window,
labelled with its measurement category by where IT energy is metered (category 1: UPS output; 2: PDU
output; 3: IT equipment input). The standard reports PUE over a year; shorter windows are marked
``interim``. A site without a facility meter uses its declared PUE (``site.declared_pue``) and every
figure derived from it is marked ``estimate``. WUE follows ISO/IEC 30134-9: site water (L) / IT energy
(kWh).

Meters are ``metric_sample`` series (labels: ``site``, and for IT meters ``point=ups|pdu|it``), cumulative
counters or sampled power, integrated as GPU energy is (``analyzers.energy_intervals``).

Pure: polars over canonical frames (``fleetscope.core.frames``); nothing here reads the clock, a file or the
database.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Sequence
from dataclasses import dataclass

import polars as pl

from analyzers.energy import J_PER_KWH
from analyzers.energy_intervals import MINUTE_US, US, epoch_us, reading_intervals, split_minutes, utc_epoch_us
from fleetscope.core.errors import ValidationError

__all__ = [
    "FACILITY_ENERGY",
    "FACILITY_POWER",
    "IT_ENERGY",
    "IT_POWER",
    "WATER",
    "PueResult",
    "pue",
    "pue_series",
    "apply_pue",
    "wue",
]

# Facility meter series in metric_sample (labels: site, and for IT meters point=ups|pdu|it).
FACILITY_ENERGY = "facility_energy_j"  # cumulative counter, J
FACILITY_POWER = "facility_power_w"
IT_ENERGY = "it_energy_j"
IT_POWER = "it_power_w"
WATER = "facility_water_l"  # cumulative counter, litres

_SERIES_RE = re.compile(r"^([^{]+)(?:\{(.*)\})?$")
_LABEL_RE = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"')

_CATEGORY_BY_POINT = {"ups": 1, "pdu": 2, "it": 3, "server": 3}
_CATEGORY_TEXT = {
    1: "category 1 (IT energy at UPS output)",
    2: "category 2 (IT energy at PDU output)",
    3: "category 3 (IT energy at IT equipment input)",
}


def _parse_series(series: pl.Series) -> pl.DataFrame:
    names, labels = [], []
    for key in series.to_list():
        mt = _SERIES_RE.match(key or "")
        names.append(mt.group(1) if mt else key)
        labels.append(dict(_LABEL_RE.findall(mt.group(2) or "")) if mt else {})
    return pl.DataFrame(
        {
            "series": series,
            "name": names,
            "site": [lb.get("site") for lb in labels],
            "point": [lb.get("point") for lb in labels],
        },
        schema={"series": pl.String, "name": pl.String, "site": pl.String, "point": pl.String},
    )


def _meter_energy(metric_sample: pl.DataFrame, names: tuple[str, str], site_id: str, lo: int, hi: int, *, max_gap_s: float) -> pl.DataFrame:
    """Energy per meter series of one site in [lo, hi): counter series (names[0]) by differences with
    resets starting new segments, power series (names[1]) by trapezoid. Returns series, point, energy, covered_s."""
    pieces = _meter_minutes(metric_sample, names, lo, hi, max_gap_s=max_gap_s, site_id=site_id)
    return pieces.group_by("series", "point").agg(pl.col("energy").sum(), pl.col("covered_s").sum()).select("series", "point", "energy", "covered_s")


def _meter_minutes(metric_sample: pl.DataFrame, names: tuple[str, str], lo: int, hi: int, *, max_gap_s: float,
                   site_id: str | None = None) -> pl.DataFrame:
    """Energy and covered seconds per meter series (of one site, or all) and UTC minute index ``m`` in
    [lo, hi): series, site, point, m, energy, covered_s."""
    schema = {"series": pl.String, "site": pl.String, "point": pl.String, "m": pl.Int64, "energy": pl.Float64, "covered_s": pl.Float64}
    if metric_sample.height == 0:
        return pl.DataFrame(schema=schema)
    keys = _parse_series(metric_sample.get_column("series").unique())
    keys = keys.filter(pl.col("name").is_in(list(names)) & (pl.col("site") == site_id if site_id is not None else pl.col("site").is_not_null()))
    out = []
    for kind_name, is_counter in ((names[0], True), (names[1], False)):
        ks = keys.filter(pl.col("name") == kind_name)
        if ks.height == 0:
            continue
        df = (
            metric_sample.join(ks.select("series"), on="series", how="semi")
            .select("series", utc_epoch_us(metric_sample, "metric_sample").alias("t"), pl.col("value").cast(pl.Float64))
            .with_columns(pl.when(pl.col("value").is_finite() & (pl.col("value") >= 0)).then(pl.col("value")).alias("value"))
            .with_columns(
                (pl.col("value") if is_counter else pl.lit(None, pl.Float64)).alias("counter"),
                (pl.lit(None, pl.Float64) if is_counter else pl.col("value")).alias("power"),
            )
            .sort("series", "t")
        )
        iv, _ = reading_intervals(df, "series", max_power_gap_s=max_gap_s, max_counter_gap_s=max_gap_s, max_power_w=None)
        pieces = split_minutes(iv, "series", lo, hi)
        out.append(pieces.group_by("series", "m").agg(pl.col("energy_j").sum().alias("energy"), pl.col("covered_s").sum()))
    if not out:
        return pl.DataFrame(schema=schema)
    return pl.concat(out).join(keys.select("series", "site", "point"), on="series", how="left").select(list(schema)).cast(schema)


def pue_series(
    metric_sample: pl.DataFrame,
    *,
    window_start: dt.datetime,
    window_end: dt.datetime,
    bucket_s: int = 900,
    max_gap_s: float = 900.0,
    min_coverage_ratio: float = 0.95,
) -> pl.DataFrame:
    """PUE per site and time bucket from the facility and IT meters, the way :func:`pue` computes it for one
    window (ISO/IEC 30134-2: facility energy / IT energy; the IT point nearest the equipment that the site
    meters sets the category) — for a chart of PUE over time. A bucket needs both meters to cover
    ``min_coverage_ratio`` of it. Buckets are UTC-aligned multiples of ``bucket_s`` (a whole number of
    minutes). Returns site_id, ts (bucket start), pue, category, facility_energy_j, it_energy_j; sites with
    no usable pair of meters have no rows. Sub-annual values are interim figures under the standard."""
    if bucket_s < 60 or bucket_s % 60:
        raise ValidationError("bucket_s must be a whole number of minutes", frame="pue_series", field="bucket_s")
    out_schema = {"site_id": pl.String, "ts": pl.Datetime("us", "UTC"), "pue": pl.Float64, "category": pl.Int64,
                  "facility_energy_j": pl.Float64, "it_energy_j": pl.Float64}
    lo, hi = epoch_us(window_start), epoch_us(window_end)
    if hi <= lo:
        raise ValidationError("window_end must be after window_start", frame="window")
    per = bucket_s // 60

    def bucketed(names: tuple[str, str]) -> pl.DataFrame:
        m = _meter_minutes(metric_sample, names, lo, hi, max_gap_s=max_gap_s)
        return (m.with_columns((pl.col("m") // per * per).alias("b"))
                .group_by("series", "site", "point", "b").agg(pl.col("energy").sum(), pl.col("covered_s").sum()))

    def covered(df: pl.DataFrame) -> pl.DataFrame:
        # the bucket's own length: the first and last bucket may be cut by the window
        length_s = ((pl.min_horizontal((pl.col("b") + per) * MINUTE_US, pl.lit(hi))
                     - pl.max_horizontal(pl.col("b") * MINUTE_US, pl.lit(lo))) / US)
        return df.filter(pl.col("covered_s") >= min_coverage_ratio * length_s)

    fac = covered(bucketed((FACILITY_ENERGY, FACILITY_POWER)))
    fac = fac.group_by("site", "b").agg(pl.col("energy").sum().alias("facility_energy_j"), pl.len().alias("feeds"))
    it = covered(bucketed((IT_ENERGY, IT_POWER))).with_columns(
        pl.col("point").replace_strict(_CATEGORY_BY_POINT, default=None, return_dtype=pl.Int64).alias("category")).drop_nulls("category")
    # one category per site for the whole chart, so its line does not jump between measurement points
    best = it.group_by("site").agg(pl.col("category").max())
    it = it.join(best, on=["site", "category"]).group_by("site", "b", "category").agg(pl.col("energy").sum().alias("it_energy_j"))
    both = fac.join(it, on=["site", "b"]).filter(pl.col("it_energy_j") > 0)
    if both.height == 0:
        return pl.DataFrame(schema=out_schema)
    return both.select(
        pl.col("site").alias("site_id"), (pl.col("b") * MINUTE_US).cast(pl.Datetime("us")).dt.replace_time_zone("UTC").alias("ts"),
        (pl.col("facility_energy_j") / pl.col("it_energy_j")).alias("pue"), "category", "facility_energy_j", "it_energy_j",
    ).cast(out_schema).sort("site_id", "ts")


@dataclass(frozen=True)
class PueResult:
    """PUE of one site over one window, with how it was obtained.

    ``basis``: ``measured`` (facility and IT meters), ``measured_facility_gpu_it`` (facility meter over GPU
    energy from telemetry: not an ISO/IEC 30134-2 category, since GPUs are only part of IT load) or
    ``declared`` (the site's declared PUE; ``estimate`` is then True and so is every figure derived from it).
    """

    site_id: str
    window_start: dt.datetime
    window_end: dt.datetime
    pue: float | None
    basis: str
    category: int | None
    label: str
    estimate: bool
    interim: bool
    facility_energy_j: float | None
    it_energy_j: float | None
    coverage_ratio: float | None


def pue(
    metric_sample: pl.DataFrame,
    site_id: str,
    *,
    window_start: dt.datetime,
    window_end: dt.datetime,
    site: pl.DataFrame | None = None,
    gpu_it_energy_j: float | None = None,
    max_gap_s: float = 900.0,
    min_coverage_ratio: float = 0.95,
) -> PueResult:
    """PUE = total facility energy / IT equipment energy over [window_start, window_end) — ISO/IEC 30134-2.

    Meters are ``metric_sample`` series labelled ``site="<site_id>"``: ``facility_energy_j`` (cumulative,
    preferred) or ``facility_power_w``; ``it_energy_j`` / ``it_power_w`` with ``point="ups"|"pdu"|"it"``
    giving the measurement category 1/2/3 (with several points, the one nearest the IT equipment wins, as
    it is the more accurate category). Several feeds of one kind are summed. Meters covering less than
    ``min_coverage_ratio`` of the window are not used. Without an IT meter, ``gpu_it_energy_j`` may stand
    in (labelled as not an ISO category). Without a usable facility meter, the site's ``declared_pue``
    is returned as an estimate; with neither, ``pue`` is None and ``basis`` says why.
    """
    lo, hi = epoch_us(window_start), epoch_us(window_end)
    if hi <= lo:
        raise ValidationError("window_end must be after window_start", frame="window")
    window_s = (hi - lo) / US
    interim = window_s < 365 * 86400
    suffix = " (interim: ISO/IEC 30134-2 reports PUE over 12 months)" if interim else ""

    fac = _meter_energy(metric_sample, (FACILITY_ENERGY, FACILITY_POWER), site_id, lo, hi, max_gap_s=max_gap_s)
    fac_ok = fac.height > 0 and float(fac["covered_s"].min()) >= min_coverage_ratio * window_s
    facility_j = float(fac["energy"].sum()) if fac_ok else None
    fac_cov = float(fac["covered_s"].min()) / window_s if fac.height else None

    it = _meter_energy(metric_sample, (IT_ENERGY, IT_POWER), site_id, lo, hi, max_gap_s=max_gap_s)
    it = it.with_columns(pl.col("point").replace_strict(_CATEGORY_BY_POINT, default=None, return_dtype=pl.Int64).alias("category"))
    it = it.filter(pl.col("category").is_not_null() & (pl.col("covered_s") >= min_coverage_ratio * window_s))
    category, it_j = None, None
    if it.height:
        category = int(it["category"].max())
        it_j = float(it.filter(pl.col("category") == category)["energy"].sum())

    if facility_j is not None and it_j:
        return PueResult(site_id, window_start, window_end, facility_j / it_j, "measured", category,
                         f"PUE{category}: ISO/IEC 30134-2 {_CATEGORY_TEXT[category]}{suffix}", False, interim, facility_j, it_j, fac_cov)
    if facility_j is not None and gpu_it_energy_j:
        return PueResult(site_id, window_start, window_end, facility_j / gpu_it_energy_j, "measured_facility_gpu_it", None,
                         "facility energy / GPU energy from telemetry: not an ISO/IEC 30134-2 category (GPUs are part of IT load); an upper bound on PUE" + suffix,
                         True, interim, facility_j, gpu_it_energy_j, fac_cov)
    declared = None
    if site is not None and "declared_pue" in site.columns:
        row = site.filter(pl.col("site_id") == site_id)
        if row.height and row["declared_pue"][0] is not None:
            declared = float(row["declared_pue"][0])
    if declared is not None:
        if declared < 1.0:
            raise ValidationError(f"declared PUE {declared} is below 1", frame="site", field="declared_pue")
        return PueResult(site_id, window_start, window_end, declared, "declared", None,
                         "declared PUE (no usable facility meter): estimate", True, interim, None, None, fac_cov)
    return PueResult(site_id, window_start, window_end, None, "none", None,
                     "no facility meter and no declared PUE", True, interim, None, None, fac_cov)


def apply_pue(site_energy: pl.DataFrame, pues: Sequence[PueResult]) -> pl.DataFrame:
    """Add facility energy to per-site IT energy: ``facility_energy_j`` = energy_j × PUE, with ``pue``,
    ``pue_basis``, ``pue_label`` and ``estimate`` (True wherever the PUE was declared rather than metered,
    or missing). ``site_energy`` needs columns site_id, energy_j."""
    table = pl.DataFrame(
        {
            "site_id": [p.site_id for p in pues],
            "pue": [p.pue for p in pues],
            "pue_basis": [p.basis for p in pues],
            "pue_label": [p.label for p in pues],
            "estimate": [p.estimate for p in pues],
        },
        schema={"site_id": pl.String, "pue": pl.Float64, "pue_basis": pl.String, "pue_label": pl.String, "estimate": pl.Boolean},
    )
    return site_energy.join(table, on="site_id", how="left").with_columns(
        (pl.col("energy_j") * pl.col("pue")).alias("facility_energy_j"),
        pl.col("estimate").fill_null(True),
        pl.col("pue_basis").fill_null("none"),
    )


def wue(
    metric_sample: pl.DataFrame,
    site_id: str,
    *,
    window_start: dt.datetime,
    window_end: dt.datetime,
    it_energy_j: float,
    max_gap_s: float = 3600.0,
) -> float | None:
    """WUE in L/kWh = site water usage / IT equipment energy — ISO/IEC 30134-9. Water from the cumulative
    ``facility_water_l{site=...}`` meter; None where the site has no water meter (never zero)."""
    lo, hi = epoch_us(window_start), epoch_us(window_end)
    water = _meter_energy(metric_sample, (WATER, "\x00none"), site_id, lo, hi, max_gap_s=max_gap_s)
    if water.height == 0 or not it_energy_j or it_energy_j <= 0:
        return None
    return float(water["energy"].sum()) / (it_energy_j / J_PER_KWH)

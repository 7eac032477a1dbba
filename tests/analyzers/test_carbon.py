"""analyzers.carbon: Patterson et al. 2021 reproduced, grid table provenance, location vs market, embodied,
carbon-aware hint, model footprint."""

from __future__ import annotations

import csv
import datetime as dt
import json
from pathlib import Path

import polars as pl
import pytest

from analyzers import carbon as C
from analyzers import energy as E

REPO = Path(__file__).resolve().parents[2]
REALDATA = REPO.parent / "shared" / "realdata" / "energy"
needs_realdata = pytest.mark.skipif(not REALDATA.is_dir(), reason=f"reference data not found at {REALDATA}")
T0 = dt.datetime(2025, 6, 1, tzinfo=dt.timezone.utc)


def at_h(h: float) -> dt.datetime:
    return T0 + dt.timedelta(hours=h)


# --- Patterson et al. 2021 ------------------------------------------------------------------------


def _patterson_rows() -> list[dict]:
    if not REALDATA.is_dir():
        return []
    with open(REALDATA / "published_training_footprints.csv", newline="") as f:
        rows = [r for r in csv.DictReader(f) if r["source"] == "patterson2021"]
    need = ("n_chips", "train_days", "power_w", "pue", "ci_kgco2e_per_kwh", "energy_mwh", "tco2e")
    return [r for r in rows if all(r[k] for k in need)]


# The one row that misses 1.5 %: GShard-600B at net (24/7 CFE) intensity. Its inputs are rounded in the
# paper: 3.1 days (3.05-3.15, ±1.6 %) gives 23.9 MWh where the paper has 24.1 (days ≈ 3.12), and the
# published 4.3 t is 24.1 MWh × 0.177 = 4.27 rounded up to two figures. Our 4.233 t is 1.55 % below it.
ROUNDING_LIMITED = {("GShard-600B", "net (24/7 CFE)"): "days rounded to 3.1 and tCO2e to 2 significant figures"}


@needs_realdata
@pytest.mark.parametrize("row", _patterson_rows(), ids=lambda r: f"{r['table']}/{r['model']}/{r['processor']}/{r['ci_basis']}")
def test_patterson_2021_energy_and_emissions_reproduced(row):
    chips, days, watts, pue = float(row["n_chips"]), float(row["train_days"]), float(row["power_w"]), float(row["pue"])
    g_per_kwh = float(row["ci_kgco2e_per_kwh"]) * 1000
    energy_j = E.energy_from_chip_hours(chips, days * 24, watts, pue)
    mwh = energy_j / 3.6e9
    tco2e = C.emissions_kgco2e(energy_j, g_per_kwh) / 1000
    assert mwh == pytest.approx(float(row["energy_mwh"]), rel=0.015)
    key = (row["model"], row["ci_basis"])
    if key not in ROUNDING_LIMITED:
        assert tco2e == pytest.approx(float(row["tco2e"]), rel=0.015)
    else:
        # the emissions step itself reproduces from the published energy ...
        from_published_mwh = C.emissions_kgco2e(float(row["energy_mwh"]) * 3.6e9, g_per_kwh) / 1000
        assert from_published_mwh == pytest.approx(float(row["tco2e"]), rel=0.015)
        # ... and the published figure lies within what the rounded inputs allow
        hi = C.emissions_kgco2e(E.energy_from_chip_hours(chips, (days + 0.05) * 24, watts, pue), g_per_kwh) / 1000
        assert tco2e < float(row["tco2e"]) <= hi + 0.05


@needs_realdata
def test_patterson_table4_has_the_expected_rows():
    t4 = [r for r in _patterson_rows() if r["table"] == "Table 4"]
    assert {r["model"] for r in t4} == {"Evolved Transformer NAS", "T5", "Meena", "GShard-600B", "Switch Transformer", "GPT-3"}
    assert len(t4) == 11


# --- the shipped grid-intensity table ----------------------------------------------------------------


def test_grid_table_loads_with_a_source_on_every_row():
    t = C.load_grid_intensity()
    assert t.height > 250
    assert t["source"].null_count() == 0 and t["g_per_kwh"].null_count() == 0
    assert t.filter(pl.col("country") == "WLD")["g_per_kwh"].to_list() == [475.0]
    assert t.select("country", "region").is_duplicated().sum() == 0


@needs_realdata
def test_grid_table_matches_its_sources_row_by_row():
    import importlib.util

    spec = importlib.util.spec_from_file_location("build_grid", REPO / "analyzers" / "data" / "build_grid_intensity.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    rebuilt = pl.DataFrame(mod.build(REALDATA)).with_columns(pl.col("year").cast(pl.Int64), pl.col("g_per_kwh").cast(pl.Float64))
    shipped = C.load_grid_intensity()
    assert rebuilt.select(shipped.columns).equals(shipped)
    # spot-check the cited rows independently of the builder
    mix = json.loads((REALDATA / "codecarbon_global_energy_mix.json").read_text())
    lines = (REALDATA / "green-algorithms_CI_aggregated.csv").read_text(encoding="utf-8").splitlines()
    for r in shipped.iter_rows(named=True):
        if r["source"].startswith("codecarbon_global_energy_mix.json"):
            assert mix[r["country"]]["carbon_intensity"] == r["g_per_kwh"]
        elif r["source"].startswith("green-algorithms_CI_aggregated.csv line "):
            n = int(r["source"].split("line ")[1].split()[0])
            fields = next(csv.reader([lines[n - 1]]))
            assert float(fields[4]) == r["g_per_kwh"] and (fields[0] == r["region"] or fields[0] == "WORLD")


@needs_realdata
def test_owid_country_values_agree_between_codecarbon_and_carbontracker():
    ct = pl.read_csv(REALDATA / "carbontracker_carbon-intensities.csv")
    ct = ct.rename({"Code": "country", "Year": "ct_year", "Carbon intensity of electricity (gCO2/kWh)": "ct"})
    j = C.load_grid_intensity().filter(pl.col("region") == "").join(ct, on="country")
    same_year = j.filter(pl.col("year") == pl.col("ct_year"))
    assert same_year.height > 150
    assert ((same_year["g_per_kwh"] - same_year["ct"]).abs() < 0.01).all()


# --- location and market based -------------------------------------------------------------------

SITE = pl.DataFrame({"site_id": ["fr", "ca", "xx"], "country": ["FRA", "USA", None], "grid_region": [None, "US-CA", None]})


def _energy(site: str, hours: int, kwh_per_hour: float = 1.0) -> pl.DataFrame:
    return pl.DataFrame({"site_id": [site] * hours, "minute": [at_h(h) for h in range(hours)], "energy_j": [kwh_per_hour * 3.6e6] * hours},
                        schema={"site_id": pl.String, "minute": pl.Datetime("us", "UTC"), "energy_j": pl.Float64})


def test_site_intensity_matches_region_then_country_then_world():
    si = C.site_intensity(SITE).sort("site_id")
    assert si["intensity_match"].to_list() == ["region", "country", "world"]
    assert si.filter(pl.col("site_id") == "ca")["g_per_kwh"][0] == 216.43


def test_location_based_uses_hourly_series_where_present_else_annual():
    ms = pl.DataFrame({"ts": [at_h(0), at_h(0.5), at_h(1)], "series": ['grid_intensity_g_per_kwh{site="fr"}'] * 3, "value": [100.0, 200.0, 30.0]},
                      schema={"ts": pl.Datetime("us", "UTC"), "series": pl.String, "value": pl.Float64})
    out = C.location_based(_energy("fr", 3), SITE, metric_sample=ms).sort("minute")
    assert out["g_per_kwh"].to_list() == pytest.approx([150.0, 30.0, 56.039])
    assert out["intensity_basis"].to_list()[:2] == ["hourly", "hourly"]
    assert out["intensity_basis"][2].startswith("annual 2023: codecarbon_global_energy_mix.json")
    assert out["kgco2e"].to_list() == pytest.approx([0.150, 0.030, 0.056039])
    with pytest.raises(Exception, match="not in the site inventory"):
        C.location_based(_energy("nowhere", 1), SITE)


def test_market_based_reported_beside_location_based():
    loc = C.location_based(_energy("ca", 10), SITE)  # 10 kWh at 216.43 g
    ppa = pl.DataFrame(
        {"instrument_id": ["ppa-1"], "site_id": ["ca"], "kind": ["ppa"], "start": [at_h(0)], "end": [at_h(20)],
         "volume_mwh": [0.008], "g_per_kwh": [0.0]},
        schema=C.INSTRUMENT_SCHEMA,
    )
    # 8 kWh over a 20 h term, pro-rated to the 10 h period: 4 kWh covered at 0 g
    out = C.scope2(loc, ppa, period_start=at_h(0), period_end=at_h(10)).row(0, named=True)
    assert out["location_kgco2e"] == pytest.approx(10 * 0.21643)
    assert out["covered_energy_j"] == pytest.approx(4 * 3.6e6)
    assert out["market_kgco2e"] == pytest.approx(6 * 0.21643)
    assert "location-based grid average" in out["uncovered_basis"] and out["instruments"] == "ppa-1"
    resid = pl.DataFrame({"site_id": ["ca"], "g_per_kwh": [300.0]})
    out2 = C.scope2(loc, ppa, period_start=at_h(0), period_end=at_h(10), residual_mix=resid).row(0, named=True)
    assert out2["market_kgco2e"] == pytest.approx(6 * 0.300) and out2["location_kgco2e"] == pytest.approx(10 * 0.21643)
    # no instruments: both figures still there
    none = C.scope2(loc, None, period_start=at_h(0), period_end=at_h(10)).row(0, named=True)
    assert none["market_kgco2e"] == pytest.approx(none["location_kgco2e"]) and none["covered_energy_j"] == 0


def test_instruments_never_cover_more_than_consumed():
    loc = C.location_based(_energy("fr", 2), SITE)
    big = pl.DataFrame(
        {"instrument_id": ["a", "b"], "site_id": ["fr", "fr"], "kind": ["rec", "go"], "start": [at_h(0)] * 2, "end": [at_h(2)] * 2,
         "volume_mwh": [1.0, 1.0], "g_per_kwh": [0.0, 0.0]},
        schema=C.INSTRUMENT_SCHEMA,
    )
    out = C.scope2(loc, big, period_start=at_h(0), period_end=at_h(2)).row(0, named=True)
    assert out["covered_energy_j"] == pytest.approx(2 * 3.6e6) and out["market_kgco2e"] == 0 and out["instruments"] == "a"


# --- embodied ------------------------------------------------------------------------------------


def test_embodied_reproduces_bloom_11_2_tonnes():
    # Luccioni et al.: 1,082,990 A100-hours on 8-GPU servers -> 3.64 t (GPUs) + 7.57 t (servers) = 11.2 t
    e = C.embodied_kgco2e(1_082_990)
    assert e["gpu_kgco2e"] / 1000 == pytest.approx(3.64, rel=0.01)
    assert e["server_kgco2e"] / 1000 == pytest.approx(7.57, rel=0.01)
    assert e["embodied_kgco2e"] / 1000 == pytest.approx(11.2, rel=0.01)


def test_embodied_by_job_uses_held_gpu_hours():
    att = pl.DataFrame({"job_id": ["j", "j", None], "allocated_s": [3600.0, 3600.0, 1800.0]})
    out = C.embodied_by(att, ["job_id"])
    rate = C.BLOOM_EMBODIED.per_gpu_hour_kgco2e()
    assert out["gpu_hours"].to_list() == [2.0, 0.5]
    assert out["embodied_kgco2e"].to_list() == pytest.approx([2 * rate, 0.5 * rate])


# --- carbon-aware hint -------------------------------------------------------------------------


def test_shift_hint_moves_flexible_work_to_the_cleanest_hours():
    intensity = pl.DataFrame({"hour": [at_h(h) for h in range(24)], "g_per_kwh": [400.0] * 8 + [100.0] * 4 + [400.0] * 12})
    job = pl.DataFrame({"hour": [at_h(0), at_h(1)], "energy_j": [3.6e6, 3.6e6]})
    h = C.shift_hint(job, intensity)
    assert h["feasible"] and h["actual_kgco2e"] == pytest.approx(0.8) and h["shifted_kgco2e"] == pytest.approx(0.2)
    assert h["saving_ratio"] == pytest.approx(0.75) and h["best_hours"] == [at_h(8), at_h(9)]
    assert not C.shift_hint(job, intensity.head(1))["feasible"]


# --- model footprint ---------------------------------------------------------------------------

JOB = pl.DataFrame({"job_id": ["t1", "i1"], "kind": ["training", "inference"], "model_name": ["m", "m"],
                    "started_at": [at_h(0), at_h(5)], "ended_at": [at_h(2), at_h(6)]},
                   schema={"job_id": pl.String, "kind": pl.String, "model_name": pl.String,
                           "started_at": pl.Datetime("us", "UTC"), "ended_at": pl.Datetime("us", "UTC")})


def test_model_footprint_measured_where_telemetry_covers_the_run():
    je = pl.DataFrame({"job_id": ["t1", "i1"], "energy_j": [7.2e6, 1e6], "covered_s": [7200.0, 3600.0], "allocated_s": [7200.0, 3600.0],
                       "kgco2e": [0.5, 0.1]})
    step = pl.DataFrame({"job_id": ["t1"] * 2, "rank": [0, 0], "step": [1, 2], "start": [at_h(0), at_h(1)], "model_flops": [1e18, 1e18]})
    fp = C.model_footprint("m", job=JOB, job_energy=je, step=step)
    assert fp.training_flops == 2e18 and fp.training_time_s == 7200.0
    assert fp.energy_j == 7.2e6 and fp.kgco2e == 0.5 and not fp.estimate
    assert fp.energy_basis.startswith("measured") and "Annex XI" in fp.legal_basis
    assert fp.as_dict()["energy_kwh"] == pytest.approx(2.0)


def test_model_footprint_extrapolates_partial_coverage_and_estimates_without_telemetry():
    je = pl.DataFrame({"job_id": ["t1"], "energy_j": [3.6e6], "covered_s": [3600.0], "allocated_s": [7200.0]})
    fp = C.model_footprint("m", job=JOB, job_energy=je)
    assert fp.energy_j == pytest.approx(7.2e6) and fp.estimate and "extrapolated" in fp.energy_basis
    assert fp.telemetry_coverage_ratio == pytest.approx(0.5)
    est = C.ComputeEstimate(n_chips=10000, avg_power_w=330, pue=1.1, g_per_kwh=429, training_flops=3.14e23,
                            peak_flops_per_s=24.6e12, mfu=1.0)
    job = pl.DataFrame({"job_id": ["old"], "kind": ["training"], "model_name": ["gpt3"]})
    fp2 = C.model_footprint("gpt3", job=job, estimate=est)
    # GPT-3 in Patterson Table 4: 14.8 days, 1,287 MWh, 552 tCO2e
    assert fp2.training_time_s / 86400 == pytest.approx(14.77, rel=0.01)
    assert fp2.energy_j / 3.6e9 == pytest.approx(1287, rel=0.015)
    assert fp2.kgco2e / 1000 == pytest.approx(552.1, rel=0.015)
    assert fp2.estimate and fp2.energy_basis.startswith("estimated from compute")
    assert fp2.time_basis.startswith("estimated") and fp2.flops_basis.startswith("declared")

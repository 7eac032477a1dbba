"""analyzers.facility: PUE labelled with its ISO/IEC 30134-2 category, PUE per bucket, declared PUE as an
estimate, meter resets, WUE."""

from __future__ import annotations

import datetime as dt

import polars as pl
import pytest

from analyzers import facility as F
from fleetscope.core.errors import ValidationError

T0 = dt.datetime(2025, 3, 1, tzinfo=dt.timezone.utc)


def at(s: float) -> dt.datetime:
    return T0 + dt.timedelta(seconds=s)


def _meters(site: str, series: dict[str, list[float]], step_s: int = 60) -> pl.DataFrame:
    rows = [(at(i * step_s), k, v) for k, vals in series.items() for i, v in enumerate(vals)]
    return pl.DataFrame({"ts": [r[0] for r in rows], "series": [r[1] for r in rows], "value": [r[2] for r in rows]},
                        schema={"ts": pl.Datetime("us", "UTC"), "series": pl.String, "value": pl.Float64})


@pytest.mark.parametrize("point,category", [("ups", 1), ("pdu", 2), ("it", 3)])
def test_pue_measured_is_labelled_with_its_iso_category(point, category):
    ms = _meters("s1", {
        'facility_energy_j{site="s1"}': [0, 1.3e6, 2.6e6, 3.9e6],
        f'it_power_w{{point="{point}",site="s1"}}': [1e6 / 60] * 4,  # 1 MJ per minute
    })
    r = F.pue(ms, "s1", window_start=at(0), window_end=at(180))
    assert r.pue == pytest.approx(1.3) and r.basis == "measured" and r.category == category
    assert r.label.startswith(f"PUE{category}: ISO/IEC 30134-2 category {category}")
    assert r.interim and not r.estimate


def test_pue_prefers_the_category_nearest_the_it_equipment():
    ms = _meters("s1", {
        'facility_power_w{site="s1"}': [1.5e5] * 4,
        'it_power_w{point="ups",site="s1"}': [1.2e5] * 4,
        'it_power_w{point="it",site="s1"}': [1.0e5] * 4,
    })
    r = F.pue(ms, "s1", window_start=at(0), window_end=at(180))
    assert r.category == 3 and r.pue == pytest.approx(1.5)


def test_pue_series_per_bucket_equals_pue_of_that_bucket():
    """Two sites over two hours at 1-minute meter readings: site s1 meters facility energy (a counter) and
    IT power at the UPS and the IT input (category 3 wins); s2's IT load drops half way, so its PUE rises."""
    n = 121
    ms = pl.concat([
        _meters("s1", {
            'facility_energy_j{site="s1"}': [i * 60 * 1.25e5 for i in range(n)],
            'it_power_w{point="ups",site="s1"}': [1.2e5] * n,
            'it_power_w{point="it",site="s1"}': [1.0e5 + 2e4 * (i >= 60) for i in range(n)],
        }),
        _meters("s2", {
            'facility_power_w{site="s2"}': [2.4e5] * n,
            'it_power_w{point="pdu",site="s2"}': [2.0e5 if i < 60 else 1.6e5 for i in range(n)],
        }),
    ])
    got = F.pue_series(ms, window_start=at(0), window_end=at(7200), bucket_s=1800)
    assert got["site_id"].to_list() == ["s1"] * 4 + ["s2"] * 4
    assert got["ts"].to_list() == [at(0), at(1800), at(3600), at(5400)] * 2
    assert got["category"].to_list() == [3] * 4 + [2] * 4
    for r in got.iter_rows(named=True):
        one = F.pue(ms, r["site_id"], window_start=r["ts"], window_end=r["ts"] + dt.timedelta(seconds=1800))
        assert r["pue"] == pytest.approx(one.pue, rel=1e-12) and r["category"] == one.category
    # s1: 1.25e5 W facility over 1.0e5 then 1.2e5 W IT (the IT power ramps between the readings at 59 and 60 min, in the second bucket)
    assert got["pue"].to_list()[:4] == pytest.approx([1.25, 1.25, 1.25 / 1.2, 1.25 / 1.2], rel=5e-3)
    assert got["pue"].to_list()[4:] == pytest.approx([1.2, 1.2, 1.5, 1.5], rel=1e-2)
    # a bucket its meters do not cover is left out, not reported from a sliver
    gap = ms.filter(~((pl.col("series").str.contains("s2")) & (pl.col("ts") > at(300)) & (pl.col("ts") < at(1500))))
    assert F.pue_series(gap, window_start=at(0), window_end=at(7200), bucket_s=1800).filter(pl.col("site_id") == "s2")["ts"].to_list() == [
        at(1800), at(3600), at(5400)]
    assert F.pue_series(ms.head(0), window_start=at(0), window_end=at(60), bucket_s=60).height == 0
    with pytest.raises(ValidationError, match="bucket_s"):
        F.pue_series(ms, window_start=at(0), window_end=at(60), bucket_s=90)


def test_pue_without_meter_uses_declared_value_and_marks_estimates():
    site = pl.DataFrame({"site_id": ["s2"], "declared_pue": [1.4]})
    r = F.pue(_meters("s1", {}), "s2", window_start=at(0), window_end=at(3600), site=site)
    assert r.basis == "declared" and r.estimate and r.pue == 1.4 and r.category is None
    out = F.apply_pue(pl.DataFrame({"site_id": ["s2"], "energy_j": [1000.0]}), [r])
    assert out["facility_energy_j"][0] == pytest.approx(1400.0) and out["estimate"][0]
    none = F.pue(_meters("s1", {}), "s3", window_start=at(0), window_end=at(60), site=site)
    assert none.pue is None and none.basis == "none"


def test_pue_facility_meter_over_gpu_energy_is_not_an_iso_category():
    ms = _meters("s1", {'facility_energy_j{site="s1"}': [0, 2e6, 4e6, 6e6]})
    r = F.pue(ms, "s1", window_start=at(0), window_end=at(180), gpu_it_energy_j=4e6)
    assert r.pue == pytest.approx(1.5) and r.category is None and "not an ISO" in r.label


def test_facility_counter_reset_is_handled():
    ms = _meters("s1", {'facility_energy_j{site="s1"}': [0, 1e6, 2e6, 5e5, 1.5e6], 'it_energy_j{point="pdu",site="s1"}': [0, 8e5, 1.6e6, 2.4e6, 3.2e6]})
    r = F.pue(ms, "s1", window_start=at(0), window_end=at(240), min_coverage_ratio=0.5)
    # the reset interval (2 -> 3) is not counted: facility 3e6 J over 180 s covered vs IT 3.2e6 over 240 s
    assert r.facility_energy_j == pytest.approx(3e6)


def test_wue_where_water_is_metered():
    ms = _meters("s1", {'facility_water_l{site="s1"}': [0, 100, 200, 300]})
    w = F.wue(ms, "s1", window_start=at(0), window_end=at(180), it_energy_j=3.6e8)  # 100 kWh
    assert w == pytest.approx(3.0)
    assert F.wue(ms, "s9", window_start=at(0), window_end=at(180), it_energy_j=3.6e8) is None

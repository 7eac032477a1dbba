"""The Energy & Carbon page shows location- and market-based CO2e side by side, from the roll-ups and the
recorded contractual instruments (the hand-checked world of tests/fleetscope/test_scope2.py)."""

from __future__ import annotations

import datetime as dt

import polars as pl
import pytest

from fleetscope.services import energy as es
from fleetscope.services import energy_rollup
from fleetscope.core import frames as F
from fleetscope.services import energy_reads as energy_reads
from fleetscope.store import Store
from tests.dashboard.test_pages import healthy, open_page
from tests.fleetscope.test_scope2 import PPA, SUPPLIER, T0, world


def test_site_carbon_query_and_page(empty_sqlite_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    store = Store.open(empty_sqlite_url)
    world(store)
    es.record_instrument(store, PPA, recorded_by="ana")
    es.record_instrument(store, SUPPLIER, recorded_by="ana")
    # a last reading at 10:00 anchors the page's default 24 h window on the whole 10 hours of energy
    store.write(F.Batch(metric_sample=pl.DataFrame({"ts": [T0 + dt.timedelta(hours=10)], "series": ['grid_intensity_g_per_kwh{site="s1"}'], "value": [400.0]})))
    q = energy_reads.site_carbon(store, T0, T0 + dt.timedelta(hours=10))
    assert q.select("site_id", "energy_kwh", "location_kgco2e", "market_kgco2e", "covered_kwh").rows() == [
        ("s1", pytest.approx(25.0), pytest.approx(10.0), pytest.approx(5.0), pytest.approx(15.0))]
    assert q["instruments"].to_list() == ["ppa-1,ssr-1"] and energy_reads.site_carbon(store, T0, T0 + dt.timedelta(hours=10), site="s2").is_empty()
    store.engine.dispose()

    at = open_page(empty_sqlite_url, "energy_carbon", monkeypatch)
    healthy(at)
    m = {x.label: x.value for x in at.metric}
    assert (m["Location-based CO2e"], m["Market-based CO2e"], m["Covered by instruments"]) == ("10.0 kg", "5.0 kg", "60%")
    table = next(d.value for d in at.dataframe if "market_kgco2e" in d.value.columns)
    assert table["site_id"].tolist() == ["s1"] and table["market_kgco2e"].iloc[0] == pytest.approx(5.0, rel=1e-6)


def test_pue_job_model_and_embodied_panels(empty_sqlite_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The simulator's 16-GPU fleet with two jobs, rolled up as beat does, and a metered site: the page draws
    PUE over time, energy by job and by model and embodied emissions from the roll-ups, with the figures the
    roll-up tables hold."""
    from analyzers import carbon
    from tests.fleetscope.test_energy_service import T0 as E0
    from tests.fleetscope.test_energy_service import seed_two_jobs

    store = Store.open(empty_sqlite_url)
    seed_two_jobs(store)
    store.write(F.Batch(job=pl.DataFrame([{"job_id": "train-1", "kind": "training", "model_name": "llm-7b", "world_size": 4},
                                          {"job_id": "serve-2", "kind": "inference", "model_name": "llm-7b", "world_size": 2}])))
    n = 21
    store.write(F.Batch(metric_sample=pl.DataFrame({
        "ts": [E0 + dt.timedelta(minutes=i) for i in range(n)] * 2,
        "series": ['facility_power_w{site="site-a"}'] * n + ['it_power_w{point="pdu",site="site-a"}'] * n,
        "value": [13_000.0] * n + [10_000.0] * n})))
    end = E0 + dt.timedelta(minutes=20)
    energy_rollup.rollup_window(store, E0, end)

    jobs = energy_reads.energy_by_job(store, E0, end)
    stored = store.read("job_energy_minute").group_by("job_id").agg(pl.col("energy_j").sum(), pl.col("allocated_s").sum())
    want = dict(stored.select("job_id", "energy_j").rows())
    assert jobs["job_id"].to_list() == sorted(want, key=want.get, reverse=True)
    assert dict(jobs.select("job_id", "energy_j").rows()) == pytest.approx(want)
    rate = carbon.BLOOM_EMBODIED.per_gpu_hour_kgco2e()
    assert jobs.filter(pl.col("job_id") == "train-1")["gpu_hours"][0] == pytest.approx(4 * 10 / 60)
    assert jobs.filter(pl.col("job_id") == "train-1")["embodied_kgco2e"][0] == pytest.approx(4 * 10 / 60 * rate)
    assert (jobs["location_kgco2e"] > 0).all() and jobs["model_name"].to_list() == ["llm-7b", "llm-7b"]
    models = energy_reads.energy_by_model(store, E0, end)
    assert models.select("model_name", "kind", "jobs").sort("kind").rows() == [("llm-7b", "inference", 1), ("llm-7b", "training", 1)]
    assert models["energy_j"].sum() == pytest.approx(sum(want.values()))
    # train-1 held GPUs of site-a, serve-2 GPUs of site-b
    assert energy_reads.energy_by_job(store, E0, end, site="site-b")["job_id"].to_list() == ["serve-2"]
    pue = energy_reads.pue_over_time(store, E0, end, bucket_s=300)
    assert pue["site_id"].unique().to_list() == ["site-a"] and pue["pue"].to_list() == pytest.approx([1.3] * 4)
    assert pue["category"].unique().to_list() == [2]
    assert energy_reads.pue_over_time(store, E0, end, site="site-a", bucket_s=300).equals(pue) and energy_reads.pue_over_time(store, E0, end, site="site-b").is_empty()
    power = energy_reads.rollup_power(store, E0, end, bucket_s=600)
    site_min = store.read("site_energy_minute")
    assert power.height == 4 and power["ts"].to_list() == [E0, E0, E0 + dt.timedelta(minutes=10), E0 + dt.timedelta(minutes=10)]
    for r in power.iter_rows(named=True):
        rows = site_min.filter((pl.col("site_id") == r["site_id"]) & (pl.col("minute") >= r["ts"]) & (pl.col("minute") < r["ts"] + dt.timedelta(minutes=10)))
        assert r["power_w"] == pytest.approx(rows["energy_j"].sum() / (60 * rows.height)) and r["gpus"] == 8
    assert energy_reads.rollup_power(store, E0, end, site="site-b")["site_id"].unique().to_list() == ["site-b"]
    emb = energy_reads.embodied_by_site(store, E0, end)
    assert emb["site_id"].to_list() == ["site-a", "site-b"] and emb["gpu_hours"].to_list() == pytest.approx([8 * 20 / 60] * 2)
    store.engine.dispose()

    at = open_page(empty_sqlite_url, "energy_carbon", monkeypatch)
    healthy(at)
    infos = " ".join(i.value for i in at.info)
    assert "PUE" not in infos and "per-job energy" not in infos and "GPU-hours" not in infos, infos
    table = next(d.value for d in at.dataframe if "embodied_kgco2e" in d.value.columns and "job_id" in d.value.columns)
    assert table["job_id"].tolist() == jobs["job_id"].to_list()
    assert any(c.value.startswith("Mean GPU power per bucket from the energy roll-up") for c in at.caption)
    m = {x.label: x.value for x in at.metric}
    assert m["Embodied CO2e in range"] == f"{float(emb['embodied_kgco2e'].sum()):.1f} kg"


def test_energy_by_job_and_model_in_one_read_is_both_reads(empty_sqlite_url: str) -> None:
    from tests.fleetscope.test_energy_service import T0 as E0
    from tests.fleetscope.test_energy_service import seed_two_jobs

    store = Store.open(empty_sqlite_url)
    seed_two_jobs(store)
    store.write(F.Batch(job=pl.DataFrame([{"job_id": "train-1", "kind": "training", "model_name": "llm-7b", "world_size": 4},
                                          {"job_id": "serve-2", "kind": "inference", "model_name": "llm-7b", "world_size": 2}])))
    end = E0 + dt.timedelta(minutes=20)
    energy_rollup.rollup_window(store, E0, end)
    for site in (None, "site-a"):
        jobs, models = energy_reads.energy_by_job_and_model(store, E0, end, site=site)
        assert jobs.equals(energy_reads.energy_by_job(store, E0, end, site=site))
        assert models.sort("kind").equals(energy_reads.energy_by_model(store, E0, end, site=site).sort("kind"))
    top, _ = energy_reads.energy_by_job_and_model(store, E0, end, limit=1)
    assert top["job_id"].to_list() == energy_reads.energy_by_job(store, E0, end, limit=1)["job_id"].to_list()
    store.engine.dispose()

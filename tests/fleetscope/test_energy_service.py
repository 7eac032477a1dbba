"""Energy roll-ups written to the store, and energy / carbon reports read from them."""

import datetime as dt

import httpx
import polars as pl
import pytest

from fleetscope import auth
from fleetscope import frames as F
from fleetscope.energy_service import energy_report, rollup_window
from fleetscope.sim import FleetSpec, gpu_fleet

T0 = dt.datetime(2026, 3, 1, 12, tzinfo=dt.UTC)


def seed(store, minutes=20):
    batch = gpu_fleet(FleetSpec(sites=2, nodes_per_site=2, gpus_per_node=4, interval_s=10), T0, minutes * 60)
    gpus = batch.gpu["gpu_uuid"].to_list()
    batch.site = batch.site.with_columns(pl.Series("country", ["FRA", "POL"]))
    batch.job_rank = pl.DataFrame({"job_id": ["train-1"] * 4, "rank": [0, 1, 2, 3], "start": [T0 + dt.timedelta(minutes=5)] * 4,
                                   "end": [T0 + dt.timedelta(minutes=15)] * 4, "gpu_uuid": gpus[:4]})
    store.write(batch)
    return batch


def test_rollup_matches_the_energy_counter_and_is_idempotent(store):
    batch = seed(store)
    out = rollup_window(store, T0 + dt.timedelta(minutes=1), T0 + dt.timedelta(minutes=18))
    assert out["minutes"] == 17 * 16 and out["no_energy_data"] == 0
    minutes = store.read("gpu_energy_minute")
    s = batch.gpu_sample
    for uuid in s["gpu_uuid"].unique().to_list()[:4]:
        g = s.filter(pl.col("gpu_uuid") == uuid).sort("ts")
        e = g.filter((pl.col("ts") >= T0 + dt.timedelta(minutes=1)) & (pl.col("ts") <= T0 + dt.timedelta(minutes=18)))["energy_j"]
        stored = minutes.filter(pl.col("gpu_uuid") == uuid)["energy_j"].sum()
        assert stored == pytest.approx(e[-1] - e[0], rel=1e-9)  # the counter's own difference
    rollup_window(store, T0 + dt.timedelta(minutes=1), T0 + dt.timedelta(minutes=18))
    assert store.read("gpu_energy_minute").height == minutes.height


def test_report_by_site_carries_location_based_carbon(store):
    seed(store)
    rollup_window(store, T0, T0 + dt.timedelta(minutes=20))
    rep = energy_report(store, T0, T0 + dt.timedelta(minutes=20), ["site_id"])
    assert rep["site_id"].to_list() == ["site-a", "site-b"]
    total = store.read("gpu_energy_minute")["energy_j"].sum()
    assert rep["energy_j"].sum() == pytest.approx(total)
    # France's grid is far cleaner than Poland's in every published annual table.
    per_kwh = (rep["kgco2e"] / rep["energy_kwh"]).to_list()
    assert per_kwh[0] < 0.15 < 0.5 < per_kwh[1]
    assert all("annual" in b for b in rep["intensity_basis"])


def test_report_by_job_separates_idle(store):
    seed(store)
    rollup_window(store, T0, T0 + dt.timedelta(minutes=20))
    rep = energy_report(store, T0, T0 + dt.timedelta(minutes=20), ["job_id"])
    jobs = dict(zip(rep["job_id"].to_list(), rep["energy_j"].to_list()))
    assert set(jobs) == {"train-1", None}
    assert jobs["train-1"] + jobs[None] == pytest.approx(store.read("gpu_energy_minute")["energy_j"].sum())
    with pytest.raises(ValueError, match="cannot group by 'colour'"):
        energy_report(store, T0, T0 + dt.timedelta(minutes=20), ["colour"])


def test_energy_endpoint(api):
    store = api.app.state.store
    seed(store)
    rollup_window(store, T0, T0 + dt.timedelta(minutes=20))
    h = {"Authorization": "Bearer " + auth.create_token(store.engine, "r", ["read"])}
    params = {"start": T0.isoformat(), "end": (T0 + dt.timedelta(minutes=20)).isoformat(), "by": "site_id"}
    rows = httpx.get(api.url + "/api/v1/energy", params=params, headers=h).json()
    assert [r["site_id"] for r in rows] == ["site-a", "site-b"] and all(r["kgco2e"] > 0 for r in rows)
    assert httpx.get(api.url + "/api/v1/energy", params={**params, "by": "colour"}, headers=h).status_code == 400
    assert httpx.get(api.url + "/api/v1/energy", params={**params, "end": T0.isoformat()}, headers=h).status_code == 400
    empty = httpx.get(api.url + "/api/v1/energy", params={**params, "start": "2020-01-01T00:00:00Z", "end": "2020-01-02T00:00:00Z"}, headers=h)
    assert empty.json() == []

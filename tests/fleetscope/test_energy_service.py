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


def test_rollup_writes_per_site_minutes_that_site_carbon_reads(store):
    from fleetscope import energy_service as es

    seed(store)
    rollup_window(store, T0, T0 + dt.timedelta(minutes=20))
    sites = store.read("site_energy_minute")
    per_gpu = store.read("gpu_energy_minute").join(store.read("gpu", columns=["gpu_uuid", "host"]), on="gpu_uuid") \
        .join(store.read("host", columns=["host", "site_id"]), on="host").group_by("site_id", "minute") \
        .agg(pl.col("energy_j").sum().alias("want"), pl.len().alias("n"))
    both = sites.join(per_gpu, on=["site_id", "minute"])
    assert both.height == sites.height == 2 * 20 and both["gpus"].to_list() == both["n"].cast(pl.Int64).to_list()
    assert (both["energy_j"] - both["want"]).abs().max() < 1e-6
    # a site's carbon from the per-site rows equals the one summed from the per-GPU rows
    window = (T0 + dt.timedelta(minutes=3), T0 + dt.timedelta(minutes=17))
    from_sites = es.site_scope2(store, *window, ["site-a", "site-b"])
    with store.engine.begin() as conn:
        conn.exec_driver_sql("DELETE FROM site_energy_minute")
    from_gpus = es.site_scope2(store, *window, ["site-a", "site-b"])
    for col in ("gpu_energy_j", "location_kgco2e", "market_kgco2e"):
        assert from_sites[col].to_list() == pytest.approx(from_gpus[col].to_list(), rel=1e-12), col
    # idempotent: the same window rolled up again keeps one row per site and minute
    rollup_window(store, T0, T0 + dt.timedelta(minutes=20))
    rollup_window(store, T0, T0 + dt.timedelta(minutes=20))
    assert store.read("site_energy_minute").height == 40


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


def test_pue_and_footprint_endpoints_on_the_simulator(api, tmp_path):
    """The simulator's facility meters (OTLP) give a measured PUE; its training job gets a measured footprint."""
    from fleetscope import ingestion
    from fleetscope.energy_service import rollup_window
    from fleetscope.sim import simulate_small

    store = api.app.state.store
    m = simulate_small(tmp_path / "sim")
    root = tmp_path / "sim"
    from fleetscope.sim.fleet import build_topology
    from fleetscope.sim.spec import small_spec

    spec = small_spec()
    topo = build_topology(spec.sites, spec.racks_per_site, spec.nodes_per_rack, spec.gpus_per_node, spec.gpu.name, spec.seed)
    store.write(topo.frames())
    j = m.jobs[0]
    store.write(F.Batch(job=pl.DataFrame([{"job_id": j["job_id"], "kind": "training", "model_name": j["model_name"], "world_size": j["world_size"]}]),
                        job_rank=pl.DataFrame([{"job_id": j["job_id"], "rank": r, "start": j["start"], "end": j["end"], "gpu_uuid": u} for r, u in enumerate(j["gpu_uuids"])])))
    for rel in m.files["dcgm"] + m.files["otlp_json"] + m.files["job_events"]:
        ingestion.ingest_bytes(store, (root / rel).read_bytes(), source=rel, opts=ingestion.Options(ts=dt.datetime.fromisoformat(
            next(s["ts"] for s in m.dcgm_scrapes if rel.startswith(s["dir"])).replace("Z", "+00:00")) if rel.startswith("dcgm/") else None))
    start, end = spec.start, spec.start + dt.timedelta(seconds=spec.duration_s)
    rollup_window(store, start, end)
    h = {"Authorization": "Bearer " + auth.create_token(store.engine, "r", ["read"])}
    pue = httpx.get(api.url + "/api/v1/sites/site-a/pue", params={"start": start.isoformat(), "end": end.isoformat()}, headers=h).json()
    assert pue["basis"] == "measured" and pue["category"] == 3 and 1.05 < pue["pue"] < 1.5 and pue["estimate"] is False
    assert httpx.get(api.url + "/api/v1/sites/nowhere/pue", params={"start": start.isoformat(), "end": end.isoformat()}, headers=h).status_code == 404
    fp = httpx.get(api.url + f"/api/v1/models/{j['model_name']}/footprint", headers=h).json()
    assert fp["jobs"] == [j["job_id"]] and fp["energy_j"] > 0 and fp["energy_basis"].startswith("measured")
    assert httpx.get(api.url + "/api/v1/models/unknown/footprint", headers=h).status_code == 404


def test_footprint_follows_lineage_from_model_to_fleet_job(store):
    """A job the scheduler did not tag with the model still counts when a lineage run that trained the
    model names it in its fleetscope_job facet."""
    from fleetscope import governance_service as gs
    from fleetscope.energy_service import model_footprint
    from governance.registry import ModelEntry

    seed(store)
    rollup_window(store, T0, T0 + dt.timedelta(minutes=20))
    store.write(F.Batch(job=pl.DataFrame([{"job_id": "train-1", "kind": "training", "world_size": 4}])))  # no model_name
    run_id = "0e6c1f6a-8d5f-4a63-9f5e-2d5f6a7b8c9d"
    event = {"eventType": "COMPLETE", "eventTime": T0.isoformat(), "producer": "p", "schemaURL": "https://openlineage.io/spec/2-0-2/OpenLineage.json#/$defs/RunEvent",
             "run": {"runId": run_id, "facets": {"fleetscope_job": {"_producer": "p", "_schemaURL": "https://fleetscope.dev/spec/facets/1-0-0/FleetscopeJobRunFacet.json", "jobId": "train-1"}}},
             "job": {"namespace": "ml", "name": "train"}, "inputs": [], "outputs": []}
    import json

    gs.record_lineage(store, json.dumps(event).encode())
    gs.put_model(store, ModelEntry("ranker", "1", "rank", "provider", (run_id,)))
    fp = model_footprint(store, "ranker")
    assert fp["jobs"] == ["train-1"] and fp["energy_j"] > 0

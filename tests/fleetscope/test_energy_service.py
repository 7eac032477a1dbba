"""Energy roll-ups written to the store, and energy / carbon reports read from them."""

import datetime as dt
import json

import httpx
import polars as pl
import pytest
from sqlalchemy import text

from fleetscope.services import auth
from fleetscope.core import frames as F
from fleetscope.services.energy import energy_report
from fleetscope.services import energy_reads, energy_rollup
from fleetscope.services.energy_rollup import rollup_window
from fleetscope.sim import FleetSpec, gpu_fleet
from fleetscope.store import _epoch_us

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
    from fleetscope.services import energy as es

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
    from fleetscope.door import ingestion
    from fleetscope.services.energy_rollup import rollup_window
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
    assert fp["jobs"] == [j["job_id"]]
    # Each minute's energy is the GPUs' counter rise over it (DCGM scrapes every 30 s); a minute the job held
    # in part gets that part of the rise (analyzers.energy: power taken as even within a minute); the PUE
    # of the job's minutes at its site, 08:00 to 08:10, then makes it facility energy.
    assert (j["start"], j["end"], j["sites"]) == ("2025-03-03T08:00:30.000000Z", "2025-03-03T08:09:58.992592Z", ["site-a"])
    gs = store.read("gpu_sample", gpu_uuid=j["gpu_uuids"], start=start, end=end + dt.timedelta(minutes=1))
    at = lambda m: gs.filter(pl.col("ts") == start + dt.timedelta(minutes=m)).sort("gpu_uuid")["energy_j"]  # noqa: E731
    assert all(at(m).len() == 24 for m in (0, 1, 9, 10))
    gpu_j = (30 / 60) * (at(1) - at(0)).sum() + (at(9) - at(1)).sum() + (58.992592 / 60) * (at(10) - at(9)).sum()
    pue_job = httpx.get(api.url + "/api/v1/sites/site-a/pue", params={"start": "2025-03-03T08:00:00Z", "end": "2025-03-03T08:10:00Z"},
                        headers=h).json()["pue"]
    assert fp["energy_basis"] == "measured: facility energy (GPU energy × PUE) from GPU telemetry (100.0% of held GPU-time covered)"
    assert fp["energy_j"] == pytest.approx(gpu_j * pue_job, rel=1e-6)
    assert httpx.get(api.url + "/api/v1/models/unknown/footprint", headers=h).status_code == 404


def register_via_lineage(store, model: str, job_id: str) -> None:
    """Register ``model`` trained by a lineage run whose fleetscope_job facet names ``job_id``."""
    from fleetscope.services import governance as gs
    from governance.registry import ModelEntry

    run_id = "0e6c1f6a-8d5f-4a63-9f5e-2d5f6a7b8c9d"
    event = {"eventType": "COMPLETE", "eventTime": T0.isoformat(), "producer": "p", "schemaURL": "https://openlineage.io/spec/2-0-2/OpenLineage.json#/$defs/RunEvent",
             "run": {"runId": run_id, "facets": {"fleetscope_job": {"_producer": "p", "_schemaURL": "https://fleetscope.dev/spec/facets/1-0-0/FleetscopeJobRunFacet.json", "jobId": job_id}}},
             "job": {"namespace": "ml", "name": "train"}, "inputs": [], "outputs": []}
    gs.record_lineage(store, json.dumps(event).encode())
    gs.put_model(store, ModelEntry(model, "1", "rank", "provider", (run_id,)), actor="test")


def test_footprint_follows_lineage_from_model_to_fleet_job(store):
    """A job the scheduler did not tag with the model still counts when a lineage run that trained the
    model names it in its fleetscope_job facet."""
    from fleetscope.services.energy import model_footprint

    batch = seed(store)
    rollup_window(store, T0, T0 + dt.timedelta(minutes=20))
    store.write(F.Batch(job=pl.DataFrame([{"job_id": "train-1", "kind": "training", "world_size": 4}])))  # no model_name
    register_via_lineage(store, "ranker", "train-1")
    fp = model_footprint(store, "ranker")
    # train-1 held its 4 GPUs from minute 5 to 15: its energy is their counters' rise over that span, read
    # from the seed's own samples (every 10 s, so both ends are samples), not from the roll-up
    s = batch.gpu_sample.filter(pl.col("gpu_uuid").is_in(batch.gpu["gpu_uuid"].to_list()[:4]))
    at = lambda m: s.filter(pl.col("ts") == T0 + dt.timedelta(minutes=m)).sort("gpu_uuid")["energy_j"]  # noqa: E731
    assert at(5).len() == at(15).len() == 4
    assert fp["jobs"] == ["train-1"] and fp["energy_j"] == pytest.approx((at(15) - at(5)).sum(), rel=1e-9)


def seed_two_jobs(store):
    """seed() plus a second job that moves to another GPU half way through a minute, and one job on a
    GPU the inventory places at no site."""
    batch = seed(store)
    gpus = batch.gpu["gpu_uuid"].to_list()
    t = lambda m: T0 + dt.timedelta(minutes=m)  # noqa: E731
    store.write(F.Batch(job_rank=pl.DataFrame({
        "job_id": ["serve-2", "serve-2", "serve-2"], "rank": [0, 1, 1],
        "start": [t(2), t(2), t(9.5)], "end": [None, t(9.5), None], "gpu_uuid": [gpus[8], gpus[9], gpus[10]]})))
    return batch


def test_rollup_writes_job_minutes_equal_to_attributing_the_gpu_minutes(store):
    from fleetscope.services import energy as es

    seed_two_jobs(store)
    rollup_window(store, T0, T0 + dt.timedelta(minutes=20))
    jm = store.read("job_energy_minute")
    # train-1: 4 GPUs for minutes 5..14; serve-2: 2 GPUs from minute 2 to the end of the window (18 minutes)
    per_job = jm.group_by("job_id").agg(pl.len(), pl.col("allocated_s").sum(), pl.col("gpus").min()).sort("job_id")
    assert per_job.rows() == [("serve-2", 18, pytest.approx(2 * 18 * 60.0), 2), ("train-1", 10, pytest.approx(4 * 10 * 60.0), 4)]
    # the minute serve-2's rank 1 moved holds both GPUs, half a minute each
    moved = jm.filter((pl.col("job_id") == "serve-2") & (pl.col("minute") == T0 + dt.timedelta(minutes=9)))
    assert moved["gpus"].to_list() == [3] and moved["allocated_s"].to_list() == [pytest.approx(120.0)]
    # the job's energy read from these rows equals attributing the per-GPU minutes directly
    window = (T0 + dt.timedelta(minutes=3), T0 + dt.timedelta(minutes=17))
    stored = es.job_energy(store, ["train-1", "serve-2"])
    from_rows = es.job_minutes(store, store.read("job_rank"), *window)
    with store.engine.begin() as conn:
        conn.exec_driver_sql("DELETE FROM job_energy_minute")
    recomputed = es.job_energy(store, ["train-1", "serve-2"])
    from_gpus = es.job_minutes(store, store.read("job_rank"), *window)
    for col in ("energy_j", "allocated_s", "covered_s", "kgco2e", "market_kgco2e"):
        assert stored[col].to_list() == pytest.approx(recomputed[col].to_list(), rel=1e-9), col
    assert from_rows.drop("energy_j").equals(from_gpus.drop("energy_j"))
    assert from_rows["energy_j"].to_list() == pytest.approx(from_gpus["energy_j"].to_list(), rel=1e-12)
    assert from_rows["minute"].min() == window[0] and from_rows["minute"].max() == window[1] - dt.timedelta(minutes=1)
    # idempotent
    rollup_window(store, T0, T0 + dt.timedelta(minutes=20))
    rollup_window(store, T0, T0 + dt.timedelta(minutes=20))
    assert store.read("job_energy_minute").height == jm.height


def test_a_job_whose_ranks_arrive_after_the_rollup_is_attributed_from_gpu_minutes(store):
    from fleetscope.services import energy as es

    batch = seed(store)
    rollup_window(store, T0, T0 + dt.timedelta(minutes=20))
    gpus = batch.gpu["gpu_uuid"].to_list()
    store.write(F.Batch(job_rank=pl.DataFrame({"job_id": ["late-3"], "rank": [0], "start": [T0 + dt.timedelta(minutes=4)],
                                               "end": [T0 + dt.timedelta(minutes=6)], "gpu_uuid": [gpus[12]]})))
    assert store.read("job_energy_minute", job_id="late-3").height == 0
    e = es.job_energy(store, ["late-3"]).row(0, named=True)
    want = store.read("gpu_energy_minute", gpu_uuid=gpus[12]).filter(
        pl.col("minute").is_between(T0 + dt.timedelta(minutes=4), T0 + dt.timedelta(minutes=5)))["energy_j"].sum()
    assert e["energy_j"] == pytest.approx(want) and e["allocated_s"] == pytest.approx(120.0)


def test_migration_backfills_job_minutes_as_the_rollup_writes_them(db_url):
    """Revision 0009 fills job_energy_minute from roll-ups written before it, as the roll-up would."""
    from fleetscope.store import db
    from fleetscope.store import Store

    st = Store.open(db_url)
    seed_two_jobs(st)
    rollup_window(st, T0, T0 + dt.timedelta(minutes=20))
    want = st.read("job_energy_minute").sort("job_id", "minute", "site_id")
    st.engine.dispose()
    db.downgrade(db_url, "0008")
    db.upgrade(db_url)
    st = Store.open(db_url)
    got = st.read("job_energy_minute").sort("job_id", "minute", "site_id")
    st.engine.dispose()
    assert got.select("job_id", "minute", "site_id", "gpus").equals(want.select("job_id", "minute", "site_id", "gpus"))
    for col in ("energy_j", "covered_s", "allocated_s"):
        assert got[col].to_list() == pytest.approx(want[col].to_list(), rel=1e-9), col


def test_job_energy_endpoint_and_cli(api, tmp_path, monkeypatch):
    from click.testing import CliRunner

    from fleetscope import cli
    from fleetscope.cli import energy as cli_energy  # where the energy verbs live
    from fleetscope.services import energy as es

    store = api.app.state.store
    batch = seed(store)
    gpus = batch.gpu["gpu_uuid"].to_list()
    store.write(F.Batch(
        job=pl.DataFrame([{"job_id": "train-1", "kind": "training", "world_size": 4}]),
        step=pl.DataFrame({"job_id": ["train-1"] * 8, "rank": [0, 1, 2, 3] * 2, "step": [1] * 4 + [2] * 4,
                           "start": [T0 + dt.timedelta(minutes=6)] * 4 + [T0 + dt.timedelta(minutes=9)] * 4,
                           "end": [T0 + dt.timedelta(minutes=9)] * 4 + [T0 + dt.timedelta(minutes=12)] * 4,
                           "tokens": [1_000_000] * 8, "model_flops": [2e15] * 8})))
    rollup_window(store, T0, T0 + dt.timedelta(minutes=20))
    h = {"Authorization": "Bearer " + auth.create_token(store.engine, "r", ["read"])}
    body = httpx.get(api.url + "/api/v1/jobs/train-1/energy", headers=h).json()
    gpu_j = store.read("gpu_energy_minute").filter(pl.col("gpu_uuid").is_in(gpus[:4]) & pl.col("minute").is_between(
        T0 + dt.timedelta(minutes=5), T0 + dt.timedelta(minutes=14)))["energy_j"].sum()
    assert body["gpu_energy_j"] == pytest.approx(gpu_j) and body["allocated_s"] == pytest.approx(4 * 10 * 60.0)
    assert body["start"] == (T0 + dt.timedelta(minutes=5)).isoformat() and body["end"] == (T0 + dt.timedelta(minutes=15)).isoformat()
    # two steps, 8 M tokens, 1.6e16 useful FLOPs (each rank reports its share)
    assert body["steps"] == 2 and body["energy_per_step_j"] == pytest.approx(gpu_j / 2)
    assert body["energy_per_mtok_j"] == pytest.approx(gpu_j / 8) and body["flops_per_j"] == pytest.approx(1.6e16 / gpu_j)
    assert body["location_based_kgco2e"] > 0 and body["market_based_kgco2e"] == pytest.approx(body["location_based_kgco2e"])  # no instruments
    assert [s["site_id"] for s in body["sites"]] == ["site-a"] and body["sites"][0]["gpu_energy_j"] == pytest.approx(gpu_j)
    part = httpx.get(api.url + "/api/v1/jobs/train-1/energy", headers=h,
                     params={"start": (T0 + dt.timedelta(minutes=10)).isoformat(), "end": (T0 + dt.timedelta(minutes=12)).isoformat()}).json()
    assert part["allocated_s"] == pytest.approx(4 * 2 * 60.0) and part["steps"] is None and part["energy_per_step_j"] is None
    assert httpx.get(api.url + "/api/v1/jobs/nope/energy", headers=h).status_code == 404
    early = httpx.get(api.url + "/api/v1/jobs/train-1/energy", headers=h, params={"end": T0.isoformat()})
    assert early.status_code == 404 and "no energy roll-up covers job 'train-1' in that period" in early.json()["detail"]
    bad = httpx.get(api.url + "/api/v1/jobs/train-1/energy", headers=h, params={"start": T0.isoformat(), "end": T0.isoformat()})
    assert bad.status_code == 400
    assert httpx.get(api.url + "/api/v1/jobs/train-1/energy", headers=h, params={"start": "yesterday"}).status_code == 422
    naive = httpx.get(api.url + "/api/v1/jobs/train-1/energy", headers=h,
                      params={"start": "2026-03-01T12:10:00", "end": (T0 + dt.timedelta(minutes=12)).isoformat()})  # no zone: UTC
    assert naive.status_code == 200 and naive.json()["allocated_s"] == pytest.approx(4 * 2 * 60.0)
    # the CLI reads the same store
    monkeypatch.setattr(cli_energy, "_store", lambda: store)
    res = CliRunner().invoke(cli.main, ["energy", "job", "train-1", "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["gpu_energy_j"] == pytest.approx(gpu_j)
    res = CliRunner().invoke(cli.main, ["energy", "job", "nope"])
    assert res.exit_code == 1 and "no energy roll-up covers job 'nope'" in res.output
    assert es.job_report(store, "train-1")["gpu_energy_j"] == pytest.approx(gpu_j)


def test_energy_by_site_reports_market_beside_location(store):
    from fleetscope.services import energy as es

    seed(store)
    rollup_window(store, T0, T0 + dt.timedelta(minutes=20))
    window = (T0, T0 + dt.timedelta(minutes=20))
    before = energy_report(store, *window, ["site_id"])
    assert before["market_kgco2e"].to_list() == pytest.approx(before["kgco2e"].to_list())  # no instruments: market = location
    # a PPA covering all of site-a's energy at 0 g/kWh makes its market-based figure 0 and leaves site-b's alone
    es.record_instrument(store, {"instrument_id": "ppa-1", "site_id": "site-a", "kind": "ppa", "start": T0, "end": T0 + dt.timedelta(days=1),
                                 "volume_mwh": 10.0, "g_per_kwh": 0.0}, recorded_by="test")
    after = energy_report(store, *window, ["site_id"])
    assert after["kgco2e"].to_list() == pytest.approx(before["kgco2e"].to_list())
    assert after["market_kgco2e"].to_list() == pytest.approx([0.0, before["kgco2e"][1]])
    assert "market-based" in after["market_basis"][0]


def test_audit_measures_compute_of_a_job_linked_only_by_lineage(store, tmp_path):
    """The audit's Art. 51 evidence finds the same jobs the footprint does: here one the scheduler did not
    tag with the model, which a lineage run that trained it names."""
    import dataclasses

    from fleetscope.services import audit as audit_service
    from fleetscope import settings as settings_mod

    seed(store)
    rollup_window(store, T0, T0 + dt.timedelta(minutes=20))
    store.write(F.Batch(
        job=pl.DataFrame([{"job_id": "train-1", "kind": "training", "world_size": 4}]),  # no model_name
        step=pl.DataFrame({"job_id": ["train-1"] * 4, "rank": [0, 1, 2, 3], "step": [1] * 4, "start": [T0 + dt.timedelta(minutes=6)] * 4,
                           "end": [T0 + dt.timedelta(minutes=9)] * 4, "tokens": [1000] * 4, "model_flops": [2.5e18] * 4})))
    register_via_lineage(store, "ranker", "train-1")
    audit_service.declare(store, "ranker", "1", "classification", {"general_purpose": True}, entered_by="test")
    settings = dataclasses.replace(settings_mod.load(), data_dir=tmp_path)
    out = audit_service.run_audit(store, settings, model="ranker")
    res = store.read("aiact_rule_result").filter(pl.col("rule_id") == "art51-52")
    assert res.height == 1 and out["audit_id"]
    assert res["status"][0] == "pass" and "training compute 1e+19 FLOPs does not exceed 10^25" in res["reason"][0], res.select("status", "reason").to_dicts()


def test_shift_hint_wue_and_fleet_productivity(api):
    """The carbon-aware hint moves a job's hour to its site's cleanest hour of the next day; WUE is water
    over IT energy; fleet ρ is useful FLOPs over all GPU energy of the period, idle included."""
    from fleetscope.services import energy as es

    store = api.app.state.store
    seed(store)
    rollup_window(store, T0, T0 + dt.timedelta(minutes=20))
    assert es.job_report(store, "train-1")["carbon_shift_hint"] == {
        "feasible": False, "site_id": "site-a", "basis": "no hourly grid-intensity series (grid_intensity_g_per_kwh) for site 'site-a'"}
    hours = [T0 + dt.timedelta(hours=h) for h in range(24)]
    g = [400.0, 300.0, 50.0] + [200.0] * 21
    store.write(F.Batch(metric_sample=pl.DataFrame({"ts": hours, "series": ['grid_intensity_g_per_kwh{site="site-a"}'] * 24, "value": g})))
    rep = es.job_report(store, "train-1")
    hint = rep["carbon_shift_hint"]
    kwh = rep["gpu_energy_j"] / 3.6e6
    assert hint["feasible"] and hint["site_id"] == "site-a" and hint["best_hours"] == [(T0 + dt.timedelta(hours=2)).isoformat()]
    assert hint["actual_kgco2e"] == pytest.approx(kwh * 0.4) and hint["saving_kgco2e"] == pytest.approx(kwh * 0.35)

    # WUE: 2 L a minute of water against 10 kW of metered IT load is 12 L/kWh
    n = 21
    store.write(F.Batch(metric_sample=pl.DataFrame({
        "ts": [T0 + dt.timedelta(minutes=i) for i in range(n)] * 3,
        "series": ['facility_water_l{site="site-a"}'] * n + ['facility_power_w{site="site-a"}'] * n + ['it_power_w{point="it",site="site-a"}'] * n,
        "value": [2.0 * i for i in range(n)] + [12_000.0] * n + [10_000.0] * n})))
    h = {"Authorization": "Bearer " + auth.create_token(store.engine, "r", ["read"])}
    window = {"start": (T0 + dt.timedelta(minutes=2)).isoformat(), "end": (T0 + dt.timedelta(minutes=18)).isoformat()}
    pue = httpx.get(api.url + "/api/v1/sites/site-a/pue", params=window, headers=h).json()
    assert pue["pue"] == pytest.approx(1.2) and pue["wue_l_per_kwh"] == pytest.approx(12.0) and "IT meter" in pue["wue_basis"]
    assert httpx.get(api.url + "/api/v1/sites/site-b/pue", params=window, headers=h).json()["wue_l_per_kwh"] is None

    # fleet ρ: four ranks of one step, 1e15 FLOPs each
    store.write(F.Batch(step=pl.DataFrame({"job_id": ["train-1"] * 4, "rank": [0, 1, 2, 3], "step": [1] * 4, "start": [T0 + dt.timedelta(minutes=6)] * 4,
                                           "end": [T0 + dt.timedelta(minutes=7)] * 4, "model_flops": [1e15] * 4})))
    rho = httpx.get(api.url + "/api/v1/energy/productivity", params={"start": T0.isoformat(), "end": (T0 + dt.timedelta(minutes=20)).isoformat()}, headers=h).json()
    total_j = store.read("site_energy_minute")["energy_j"].sum()
    assert rho["gpu_energy_j"] == pytest.approx(total_j) and rho["useful_flops"] == pytest.approx(4e15)
    assert rho["flops_per_j"] == pytest.approx(4e15 / total_j)
    assert httpx.get(api.url + "/api/v1/energy/productivity", params={"start": T0.isoformat(), "end": T0.isoformat()}, headers=h).status_code == 400


def test_a_rank_added_after_the_rollup_is_counted_once_its_batch_is_posted(api):
    """train-1 gains a fifth GPU for minutes 5-15 after those minutes were rolled up: the scheduler's batch
    through the API rewrites the job's per-job minutes, and the job's energy counts the new GPU."""
    import time

    from fleetscope.services import energy as es

    store = api.app.state.store
    batch = seed(store)
    rollup_window(store, T0, T0 + dt.timedelta(minutes=20))
    gpus = batch.gpu["gpu_uuid"].to_list()
    before = es.job_energy(store, ["train-1"]).row(0, named=True)
    h = {"Authorization": "Bearer " + auth.create_token(store.engine, "t", ["ingest"])}
    rank = {"job_id": "train-1", "rank": 4, "start": (T0 + dt.timedelta(minutes=5)).isoformat(), "end": (T0 + dt.timedelta(minutes=15)).isoformat(),
            "gpu_uuid": gpus[4]}
    assert httpx.post(api.url + "/api/v1/batches", json={"source": "scheduler", "frames": {"job_rank": [rank]}}, headers=h).status_code == 200
    fifth = store.read("gpu_energy_minute", gpu_uuid=gpus[4]).filter(
        pl.col("minute").is_between(T0 + dt.timedelta(minutes=5), T0 + dt.timedelta(minutes=14)))["energy_j"].sum()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and store.read("job_energy_minute", job_id="train-1")["allocated_s"].sum() < 5 * 600 - 1e-6:
        time.sleep(0.1)
    after = es.job_energy(store, ["train-1"]).row(0, named=True)
    assert after["allocated_s"] == pytest.approx(5 * 10 * 60.0) and after["energy_j"] == pytest.approx(before["energy_j"] + fifth)
    assert energy_rollup.reroll_jobs(store, ["nope"]) == {"jobs": 0, "rows": 0}


def test_whole_hours_the_roll_up_holds_finally_come_from_its_site_sums_and_agree_with_the_counters(store):
    seed(store, minutes=150)
    start = T0 - dt.timedelta(minutes=30)
    rollup_window(store, T0 + dt.timedelta(minutes=1), T0 + dt.timedelta(minutes=150))  # begins a minute into 12:00
    rolled = energy_reads.rolled_energy_by_site_hour(store, start, T0 + dt.timedelta(hours=3))
    # 12:00 lacks its first minute, 14:00 is still re-rolled (the roll-up ends at 14:30): only 13:00
    assert rolled["hour"].unique().to_list() == [T0 + dt.timedelta(hours=1)] and rolled["site_id"].to_list() == ["site-a", "site-b"]
    counted = energy_reads.counter_energy_by_site_hour(store, T0 + dt.timedelta(hours=1), T0 + dt.timedelta(hours=2))
    assert rolled["energy_j"].to_list() == pytest.approx(counted["energy_j"].to_list(), rel=1e-9)
    assert rolled["kgco2e"].to_list() == pytest.approx(counted["kgco2e"].to_list(), rel=1e-9)
    assert rolled["gpus"].to_list() == [8, 8] and rolled["intensity_basis"].to_list() == counted["intensity_basis"].to_list()
    one = energy_reads.rolled_energy_by_site_hour(store, T0, T0 + dt.timedelta(hours=3), site="site-b")
    assert one["site_id"].to_list() == ["site-b"] and one["energy_j"].to_list() == pytest.approx(rolled["energy_j"].to_list()[1:], rel=1e-12)
    # a skipped minute leaves its hour to the counters
    cut = T0 + dt.timedelta(minutes=75)
    with store.engine.begin() as conn:
        conn.execute(text("DELETE FROM site_energy_minute WHERE minute = :t"), {"t": cut if store.dialect == "postgresql" else _epoch_us(cut)})
    assert energy_reads.rolled_energy_by_site_hour(store, start, T0 + dt.timedelta(hours=3)).is_empty()

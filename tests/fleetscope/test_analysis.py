"""Job analysis through the service: real Kineto traces and job events in, C3 / goodput / stragglers out,
via the store, the API and the CLI."""

import datetime as dt
import json
import os

import httpx
import polars as pl
import pytest

from analyzers import c3, carbon
from fleetscope.services import jobs as analysis
from fleetscope.services import auth
from fleetscope.door import ingestion
from fleetscope.core import frames as F
from tests import clirun

T0 = dt.datetime(2024, 1, 1, 1, tzinfo=dt.UTC)
TWO_RANKS = "traces/hta/two_rank_sampled_128gpu_job"


def job_events_jsonl(job_id: str) -> bytes:
    # ml-goodput-measurement's sample program: started at 0, steps at 5, 8, 11, 14, 17, finished at 20.
    lines = [{"job_id": job_id, "ts": T0.isoformat(), "kind": "started"}]
    lines += [{"job_id": job_id, "ts": (T0 + dt.timedelta(seconds=5 + 3 * i)).isoformat(), "kind": "step", "step": i} for i in range(5)]
    lines.append({"job_id": job_id, "ts": (T0 + dt.timedelta(seconds=20)).isoformat(), "kind": "finished"})
    return "\n".join(json.dumps(x) for x in lines).encode() + b"\n"


def ingest_two_ranks(store, realdata, job_id="two-rank"):
    for name in ("sampled_rank-0.json.gz", "sampled_rank-1.json.gz"):
        ingestion.ingest_bytes(store, (realdata / TWO_RANKS / name).read_bytes(), source=name, opts=ingestion.Options(job_id=job_id))


def test_analysis_of_real_traces_matches_the_pure_analyzer(store, realdata):
    ingest_two_ranks(store, realdata)
    ingestion.ingest_bytes(store, job_events_jsonl("two-rank"), source="events.jsonl")
    result = analysis.analyze_job(store, "two-rank")
    steps, colls = store.read("step", job_id="two-rank"), store.read("collective", job_id="two-rank")
    assert steps["rank"].unique().sort().to_list() == [0, 1]
    want = c3.job_summary(c3.c3_breakdown(steps, colls), collective=colls).row(0, named=True)
    assert result.c3["c1_ratio"] == pytest.approx(want["c1_ratio"])
    assert result.c3["dominant"] == want["dominant"]
    assert round(100 * result.goodput["goodput_ratio"], 3) == 75.000
    # stored: per rank-step breakdowns whose parts add up to the step, and one summary per analyzer
    bd = store.read("step_breakdown", job_id="two-rank")
    assert bd.height == steps.height
    assert (bd["c1_compute_s"] + bd["c2_comm_s"] + bd["c3_coord_s"] - bd["step_s"]).abs().max() < 1e-9
    # the goodput analysis writes its rolling goodput and step-time deviation beside it (goodput_trend), and the
    # traces' HTA unions give the temporal analysis (tests/fleetscope/test_job_temporal.py checks its figures)
    assert sorted(store.read("job_analysis", job_id="two-rank")["analyzer"].to_list()) == ["c3", "goodput", "goodput_trend", "stragglers", "temporal"]
    # idempotent: a second run replaces, never duplicates
    analysis.analyze_job(store, "two-rank")
    assert store.read("job_analysis").height == 5 and store.read("step_breakdown").height == bd.height


def straggler_steps(job_id="synthetic", ranks=8, steps=10, slow_rank=5) -> pl.DataFrame:
    rows = []
    for s in range(steps):
        for r in range(ranks):
            compute = 1.0 if r != slow_rank else 1.6  # one rank computes 60 % slower
            start = T0 + dt.timedelta(seconds=2 * s)
            rows.append({"job_id": job_id, "rank": r, "step": s, "start": start, "end": start + dt.timedelta(seconds=compute + 0.2),
                         "compute_s": compute, "comm_s": 0.2, "comm_overlap_s": 0.0, "idle_s": 0.0})
    return pl.DataFrame(rows)


def test_straggler_becomes_a_finding_and_only_the_parts_with_data_run(store):
    store.write(F.Batch(step=straggler_steps()))
    result = analysis.analyze_job(store, "synthetic")
    assert [f["subject"] for f in result.stragglers] == ["job:synthetic/rank:5"]
    assert result.goodput is None and "no job events: goodput, SDC screening and checkpoint advice skipped" in result.notes
    found = store.read("finding")
    assert found["subject"].to_list() == ["job:synthetic/rank:5"]
    assert found["kind"][0] == "straggler_compute_slow"


def test_straggler_cost_priced_from_the_jobs_measured_energy_and_its_site(store):
    store.write(F.Batch(
        step=straggler_steps(),
        site=pl.DataFrame({"site_id": ["fra-1"], "country": ["DEU"], "declared_pue": [1.2]}),
        host=pl.DataFrame({"host": ["node-0"], "site_id": ["fra-1"]}),
        job_rank=pl.DataFrame({"job_id": ["synthetic"] * 8, "rank": list(range(8)), "start": [T0] * 8,
                               "gpu_uuid": [f"GPU-{r}" for r in range(8)], "host": ["node-0"] * 8}),
        # the minute the steps ran in: every GPU drew 500 W (30 kJ over 60 s)
        gpu_energy_minute=pl.DataFrame({"minute": [T0] * 8, "gpu_uuid": [f"GPU-{r}" for r in range(8)], "energy_j": [30_000.0] * 8,
                                        "counter_energy_j": [30_000.0] * 8, "integrated_energy_j": [0.0] * 8,
                                        "covered_s": [60.0] * 8, "method": ["counter"] * 8}),
    ))
    analysis.analyze_job(store, "synthetic")
    ev = json.loads(store.read("finding")["evidence"][0])
    g_deu = carbon.load_grid_intensity().filter((pl.col("country") == "DEU") & (pl.col("region") == ""))["g_per_kwh"][0]
    assert ev["cost_basis"]["power_w"] == pytest.approx(500.0) and ev["cost_basis"]["pue"] == 1.2
    assert ev["energy_kwh_lost"] == pytest.approx(ev["gpu_hours_lost"] * 0.5)
    assert ev["facility_kwh_lost"] == pytest.approx(ev["gpu_hours_lost"] * 0.5 * 1.2)
    assert ev["kgco2e_lost"] == pytest.approx(ev["gpu_hours_lost"] * 0.6 * g_deu / 1000)
    assert "site fra-1" in ev["cost_basis"]["intensity"]


def test_straggler_cost_stays_in_gpu_hours_without_energy_data(store):
    store.write(F.Batch(step=straggler_steps()))
    result = analysis.analyze_job(store, "synthetic")
    assert "no rank-to-GPU assignments: straggler cost left in GPU-hours" in result.notes
    assert "energy_kwh_lost" not in json.loads(store.read("finding")["evidence"][0])


def test_api_job_endpoints(api, realdata):
    store = api.app.state.store
    ingest_two_ranks(store, realdata, "api-job")
    ingestion.ingest_bytes(store, job_events_jsonl("api-job"), source="events.jsonl")
    read = {"Authorization": "Bearer " + auth.create_token(store.engine, "r", ["read"])}
    admin = {"Authorization": "Bearer " + auth.create_token(store.engine, "a", ["admin"])}
    assert httpx.get(api.url + "/api/v1/jobs/api-job/c3", headers=read).status_code == 404  # not analysed yet
    assert httpx.post(api.url + "/api/v1/jobs/api-job/analyze", headers=read).status_code == 403
    r = httpx.post(api.url + "/api/v1/jobs/api-job/analyze", headers=admin, timeout=60)
    assert r.status_code == 200 and r.json()["goodput"]["goodput_ratio"] == 0.75
    c = httpx.get(api.url + "/api/v1/jobs/api-job/c3", params={"steps": "true"}, headers=read).json()
    assert c["result"]["ranks"] == 2 and len(c["steps"]) == store.read("step", job_id="api-job").height
    g = httpx.get(api.url + "/api/v1/jobs/api-job/goodput", headers=read).json()
    assert g["result"]["badput_s"]["other"] == 5.0
    s = httpx.get(api.url + "/api/v1/jobs/api-job/stragglers", headers=read).json()
    assert s["findings"] == []
    jobs = httpx.get(api.url + "/api/v1/jobs", headers=read).json()
    assert [j["job_id"] for j in jobs] == ["api-job"] and jobs[0]["goodput_ratio"] == 0.75
    assert httpx.get(api.url + "/api/v1/jobs/nope/goodput", headers=read).status_code == 404


def test_cli_analyze(tmp_path, realdata):
    env = {**os.environ, "FLEETSCOPE_DATA_DIR": str(tmp_path)}
    env.pop("FLEETSCOPE_DATABASE_URL", None)
    ev = tmp_path / "events.jsonl"
    ev.write_bytes(job_events_jsonl("cli-job"))
    run = lambda *a: clirun.cli(*a, env=env)  # noqa: E731
    assert run("ingest", str(ev)).returncode == 0
    out = run("jobs", "analyze", "cli-job")
    assert out.returncode == 0, out.stderr
    assert "goodput 75.0% of 20 s" in out.stdout and "other 5 s" in out.stdout
    assert "no step data" in out.stdout
    assert json.loads(run("jobs", "analyze", "cli-job", "--json").stdout)["goodput"]["productive_s"] == 15.0


def sdc_and_checkpoint_events(job_id="sdc-job") -> bytes:
    """4 data-parallel ranks; rank 2's parameter checksum disagrees from step 30 on. Checkpoints every
    10 minutes costing 60 s; two failures in 5 hours of running."""
    lines = [{"job_id": job_id, "ts": T0.isoformat(), "kind": "started"}]
    for s in range(40):
        t = T0 + dt.timedelta(seconds=10 + 2 * s)
        for r in range(4):
            checksum = "c0ffee" if (r != 2 or s < 30) else "deadbeef"
            lines.append({"job_id": job_id, "ts": t.isoformat(), "kind": "step", "step": s, "rank": r,
                          "loss": 2.0 - s * 0.01, "param_checksum": f"{checksum}{s}"})
    for k in range(30):
        t = T0 + dt.timedelta(minutes=10 * (k + 1))
        lines.append({"job_id": job_id, "ts": t.isoformat(), "kind": "checkpoint_save_start"})
        lines.append({"job_id": job_id, "ts": (t + dt.timedelta(seconds=60)).isoformat(), "kind": "checkpoint_save_end"})
    for hours in (2, 4):
        lines.append({"job_id": job_id, "ts": (T0 + dt.timedelta(hours=hours, minutes=5)).isoformat(), "kind": "failure", "cause": "GPU HBM3 memory"})
    lines.append({"job_id": job_id, "ts": (T0 + dt.timedelta(hours=5, minutes=5)).isoformat(), "kind": "finished"})
    return "\n".join(json.dumps(x) for x in lines).encode() + b"\n"


def test_sdc_suspect_and_checkpoint_advice_from_job_events(store):
    ingestion.ingest_bytes(store, sdc_and_checkpoint_events(), source="events.jsonl")
    result = analysis.analyze_job(store, "sdc-job")
    assert [f["subject"] for f in result.sdc] == ["job:sdc-job/rank:2"]
    assert result.sdc[0]["severity"] == "critical"  # a strict 3-of-4 majority disagrees with it
    cp = result.checkpoint
    assert cp["save_cost_s"] == 60.0 and cp["interval_s"] == 540.0
    # Daly's interval from δ = 60 s and this job's own MTBF (wall hours / 2 failures)
    from analyzers import reliability

    mtbf_s = 3600 * reliability.fleet_mtbf(store.read("job_event", job_id="sdc-job"))["job_mtbf_hours"][0]
    assert cp["daly_interval_s"] == pytest.approx(reliability.daly_interval_s(60.0, mtbf_s))
    kinds = set(store.read("finding")["kind"].to_list())
    assert any(k.startswith("sdc") for k in kinds)
    assert sorted(store.read("job_analysis", job_id="sdc-job")["analyzer"].to_list()) == ["checkpoint", "goodput", "goodput_trend", "sdc"]

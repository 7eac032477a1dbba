"""The CLI verbs that mirror API routes: ``energy report / pue / productivity / footprint``, ``health scores``,
``teams idle``, ``serving price / prices / slo``. Each runs on one seeded store whose figures follow by hand
from constant power, meters, steps and prices, and must give those figures, the same ones its route serves
for the same store; a bad argument ends it naming what was wrong, with nothing written."""

from __future__ import annotations

import datetime as dt
import getpass
import json
import os

import httpx
import polars as pl
import pytest

from fleetscope.core import frames as F
from fleetscope.core import scheduler_frames as SCH
from fleetscope.core import serving_frames as SF
from fleetscope.services import auth
from tests.clirun import cli

T0 = dt.datetime(2026, 3, 1, 12, tzinfo=dt.UTC)
M = dt.timedelta(minutes=1)
MINUTES = 20  # the window every read asks for: [T0, T0 + 20 min)
WINDOW = ("--start", T0.isoformat(), "--end", (T0 + MINUTES * M).isoformat())
P_A, P_B = 400.0, 300.0  # W, constant, of site-a's two GPUs and of site-b's two
G_A, G_B = 100.0, 600.0  # gCO2e/kWh, the hourly grid intensity of each site for the hour of T0
FACILITY_W, IT_W, WATER_L_PER_MIN = 12_000.0, 10_000.0, 2.0  # site-a's meters
FLOPS_PER_RANK_STEP, STEPS, RANKS = 1e15, 3, 2  # train-1 (model llama-x) on site-a's two GPUs, minutes 5 to 15
JOB_MINUTES = 10
GPU_HOUR_PRICE_B = 3.0  # EUR, any GPU at site-b
J_PER_KWH = 3.6e6


def seed(store) -> None:
    """Two sites of one two-GPU host each; samples every 10 s over [T0, T0 + 20 min]; site-a metered; a training
    job on site-a's GPUs; a running Slurm job holding site-b's (idle) GPUs; a serving deployment on site-b."""
    gpus = (("GA0", "a1", 0, P_A, 0.9), ("GA1", "a1", 1, P_A, 0.9), ("GB0", "b1", 0, P_B, 0.0), ("GB1", "b1", 1, P_B, 0.0))
    rows = []
    for k in range(6 * MINUTES + 1):
        late = k >= 6 * MINUTES // 2  # from T0 + 10 min: GA1 has 2 uncorrectable ECC errors, GB0 one and a pending row remap
        for uuid, _host, _i, power, util in gpus:
            rows.append({"ts": T0 + dt.timedelta(seconds=10 * k), "gpu_uuid": uuid, "power_w": power, "energy_j": 1e6 + power * 10 * k,
                         "util_ratio": util, "ecc_dbe_volatile_total": {"GA1": 2, "GB0": 1}.get(uuid, 0) if late else 0,
                         "remap_pending": int(uuid == "GB0" and late)})
    meters = [(T0 + k * M, s, v) for k in range(-5, MINUTES + 6) for s, v in (
        ('facility_power_w{site="site-a"}', FACILITY_W), ('it_power_w{point="it",site="site-a"}', IT_W),
        ('facility_water_l{site="site-a"}', WATER_L_PER_MIN * (k + 5)))]
    meters += [(T0, 'grid_intensity_g_per_kwh{site="site-a"}', G_A), (T0, 'grid_intensity_g_per_kwh{site="site-b"}', G_B)]
    step_rows = [{"job_id": "train-1", "rank": r, "step": s, "start": T0 + (4 + 2 * s) * M, "end": T0 + (5 + 2 * s) * M,
                  "model_flops": FLOPS_PER_RANK_STEP} for s in range(1, STEPS + 1) for r in range(RANKS)]
    store.write(F.Batch(
        site=F.conform(F.SITE, pl.DataFrame([{"site_id": "site-a", "country": "FRA"}, {"site_id": "site-b", "country": "POL"}])),
        host=F.conform(F.HOST, pl.DataFrame([{"host": "a1", "site_id": "site-a"}, {"host": "b1", "site_id": "site-b"}])),
        gpu=F.conform(F.GPU, pl.DataFrame([{"gpu_uuid": u, "host": h, "gpu_index": i, "model_name": "H100"} for u, h, i, _, _ in gpus])),
        gpu_sample=F.conform(F.GPU_SAMPLE, pl.DataFrame(rows)),
        metric_sample=pl.DataFrame(meters, schema={"ts": pl.Datetime("us", "UTC"), "series": pl.String, "value": pl.Float64}, orient="row"),
        job=F.conform(F.JOB, pl.DataFrame([{"job_id": "train-1", "kind": "training", "model_name": "llama-x", "world_size": RANKS,
                                            "started_at": T0 + 5 * M, "ended_at": T0 + 15 * M}])),
        job_rank=F.conform(F.JOB_RANK, pl.DataFrame({"job_id": ["train-1"] * RANKS, "rank": list(range(RANKS)), "start": [T0 + 5 * M] * RANKS,
                                                     "end": [T0 + 15 * M] * RANKS, "gpu_uuid": ["GA0", "GA1"]})),
        step=F.conform(F.STEP, pl.DataFrame(step_rows))))
    store.write_frames([
        (SCH.SCHED_JOB, F.conform(SCH.SCHED_JOB, pl.DataFrame([{
            "cluster": "c1", "job_id": "777", "scheduler": "slurm", "account": "nlp", "user": "u1", "partition": "gpu", "state": "RUNNING",
            "submit_at": T0 - M, "start_at": T0, "gpus": 2, "gpu_types": "h100:2", "node_count": 1, "nodes": "b1"}]))),
        (SCH.SCHED_JOB_NODE, F.conform(SCH.SCHED_JOB_NODE, pl.DataFrame([{"cluster": "c1", "job_id": "777", "host": "b1", "gpus": 2, "gpu_indices": "0,1"}]))),
        (SF.SERVING_REPLICA, F.conform(SF.SERVING_REPLICA, pl.DataFrame([{"deployment": "chat", "replica": "r1", "server": "vllm", "host": "b1",
                                                                          "last_seen": T0}]))),
    ], source="test:seed")


def run(store, tmp_path, *args):
    """``fleetscope *args`` on ``store``'s database, as an operator on that host runs it."""
    env = {**os.environ, "FLEETSCOPE_DATABASE_URL": store.engine.url.render_as_string(hide_password=False), "FLEETSCOPE_DATA_DIR": str(tmp_path)}
    return cli(*args, env=env)


def ok(store, tmp_path, *args):
    proc = run(store, tmp_path, *args)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(proc.stdout) if "--json" in args else proc.stdout


def refused(store, tmp_path, *args, words: str) -> None:
    proc = run(store, tmp_path, *args)
    assert proc.returncode != 0, proc.stdout
    assert words in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr


def written(store) -> dict[str, int]:
    """Rows of every table a verb could write."""
    return {**store.counts(), "audit_log": store.read("audit_log").height}


def api_get(api, path, **params):
    h = {"Authorization": "Bearer " + auth.create_token(api.app.state.store.engine, "reader", ["read"])}
    r = httpx.get(api.url + path, params=params, headers=h, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def test_energy_report_pue_productivity_footprint(api, tmp_path):
    from fleetscope.services.energy_rollup import rollup_window

    store = api.app.state.store
    seed(store)
    rollup_window(store, T0, T0 + MINUTES * M)
    window = {"start": T0.isoformat(), "end": (T0 + MINUTES * M).isoformat()}
    seconds = MINUTES * 60

    # by hand: two GPUs a site at constant power for 20 minutes; kgCO2e = kWh x g/kWh / 1000; no instruments: market = location
    want = {"site-a": 2 * P_A * seconds, "site-b": 2 * P_B * seconds}  # J: 960,000 and 720,000
    g = {"site-a": G_A, "site-b": G_B}
    rows = ok(store, tmp_path, "energy", "report", *WINDOW, "--json")
    assert [r["site_id"] for r in rows] == ["site-a", "site-b"]
    for r in rows:
        kwh = want[r["site_id"]] / J_PER_KWH
        assert r["energy_j"] == pytest.approx(want[r["site_id"]]) and r["energy_kwh"] == pytest.approx(kwh)
        assert r["kgco2e"] == pytest.approx(kwh * g[r["site_id"]] / 1000) and r["market_kgco2e"] == pytest.approx(r["kgco2e"])
    assert rows == api_get(api, "/api/v1/energy", **window, by="site_id")
    # by job: train-1 held site-a's two GPUs for 10 minutes; the rest of the fleet's energy belongs to no job
    by_job = {r["job_id"]: r["energy_j"] for r in ok(store, tmp_path, "energy", "report", *WINDOW, "--by", "job_id", "--json")}
    job_j = RANKS * P_A * JOB_MINUTES * 60
    assert by_job == pytest.approx({"train-1": job_j, None: sum(want.values()) - job_j})
    assert {r["job_id"]: r["energy_j"] for r in api_get(api, "/api/v1/energy", **window, by="job_id")} == pytest.approx(by_job)
    text = ok(store, tmp_path, "energy", "report", *WINDOW)
    assert "kWh" in text and "site-a" in text and f"{want['site-a'] / J_PER_KWH:.3f}" in text

    # PUE: 12 kW facility over 10 kW IT; WUE: 2 L a minute over 10 kW of IT load = 2 / (10 / 60) L/kWh
    pue = ok(store, tmp_path, "energy", "pue", "site-a", *WINDOW, "--json")
    assert pue["pue"] == pytest.approx(FACILITY_W / IT_W) and pue["basis"] == "measured" and pue["estimate"] is False
    assert pue["facility_energy_j"] == pytest.approx(FACILITY_W * seconds) and pue["it_energy_j"] == pytest.approx(IT_W * seconds)
    assert pue["wue_l_per_kwh"] == pytest.approx(WATER_L_PER_MIN / (IT_W / 1000 / 60))
    assert pue == api_get(api, "/api/v1/sites/site-a/pue", **window)
    assert "PUE 1.200 (measured" in ok(store, tmp_path, "energy", "pue", "site-a", *WINDOW)

    # fleet ρ: 3 steps x 2 ranks x 1e15 FLOPs over all GPU energy of the period, idle included
    rho = ok(store, tmp_path, "energy", "productivity", *WINDOW, "--json")
    flops = STEPS * RANKS * FLOPS_PER_RANK_STEP
    assert rho["gpu_energy_j"] == pytest.approx(sum(want.values())) and rho["useful_flops"] == pytest.approx(flops)
    assert rho["flops_per_j"] == pytest.approx(flops / sum(want.values()))
    assert rho == api_get(api, "/api/v1/energy/productivity", **window)
    assert f"{flops / sum(want.values()):.4g} useful FLOP/J" in ok(store, tmp_path, "energy", "productivity", *WINDOW)

    # llama-x's footprint: train-1's GPU energy x site-a's PUE, at site-a's intensity; 10 minutes of wall time
    fp = ok(store, tmp_path, "energy", "footprint", "llama-x", "--json")
    facility_j = job_j * FACILITY_W / IT_W
    assert fp["jobs"] == ["train-1"] and fp["training_flops"] == pytest.approx(flops) and fp["training_time_s"] == pytest.approx(JOB_MINUTES * 60)
    assert fp["energy_j"] == pytest.approx(facility_j) and fp["energy_kwh"] == pytest.approx(facility_j / J_PER_KWH) and fp["estimate"] is False
    assert fp["kgco2e"] == pytest.approx(facility_j / J_PER_KWH * G_A / 1000) and fp["market_kgco2e"] == pytest.approx(fp["kgco2e"])
    assert fp == api_get(api, "/api/v1/models/llama-x/footprint")
    assert f"energy   {facility_j / J_PER_KWH:.3f} kWh (measured" in ok(store, tmp_path, "energy", "footprint", "llama-x")


def test_energy_verbs_refuse_bad_input(store, tmp_path):
    seed(store)
    before = written(store)
    later, earlier = WINDOW[3], WINDOW[1]
    for verb in (("energy", "report"), ("energy", "productivity"), ("energy", "pue", "site-a")):
        refused(store, tmp_path, *verb, "--start", "yesterday", "--end", later, words="Invalid value for --start: 'yesterday' is not an RFC 3339 time")
        refused(store, tmp_path, *verb, "--start", "2026-03-01T12:00:00", "--end", later, words="--start: needs a time zone")
        refused(store, tmp_path, *verb, "--start", later, "--end", earlier, words="Invalid value for --end: must be after --start")
    refused(store, tmp_path, "energy", "report", *WINDOW, "--by", "colour", words="cannot group by 'colour': expected some of job_id")
    refused(store, tmp_path, "energy", "pue", "nowhere", *WINDOW, words="no site 'nowhere' in the inventory")
    refused(store, tmp_path, "energy", "footprint", "nope", words="no training job of model 'nope' in the job inventory")
    assert written(store) == before


def test_health_scores_are_the_routes_and_write_nothing(api, tmp_path):
    store = api.app.state.store
    seed(store)
    before = written(store)
    window = {"start": T0.isoformat(), "end": (T0 + MINUTES * M).isoformat()}
    # by analyzers.health's rules: an uncorrectable ECC error or a pending remap is reset_gpu, 35 off 100; each further
    # reason min(5, 35 / 4) more. GA1: one reason, 65; GB0: two, 60; the others none, 100. A node: its worst GPU.
    gpus = ok(store, tmp_path, "health", "scores", *WINDOW, "--json")
    assert [(r["gpu_uuid"], r["host"], r["score"], r["recommendation"]) for r in gpus] == [
        ("GB0", "b1", 60.0, "reset_gpu"), ("GA1", "a1", 65.0, "reset_gpu"), ("GA0", "a1", 100.0, "none"), ("GB1", "b1", 100.0, "none")]
    assert gpus[0]["reasons"] == ["1 uncorrectable ECC error(s) in the window", "row remap pending: takes effect at the next GPU reset"]
    assert gpus[1]["reasons"] == ["2 uncorrectable ECC error(s) in the window"]
    routed = {r["gpu_uuid"]: r for r in api_get(api, "/api/v1/health", **window)}
    assert {r["gpu_uuid"]: (r["score"], r["recommendation"], r["reasons"]) for r in gpus} == {
        u: (r["score"], r["recommendation"], r["reasons"]) for u, r in routed.items()}
    nodes = ok(store, tmp_path, "health", "scores", *WINDOW, "--level", "node", "--json")
    assert [(n["host"], n["gpus"], n["score"], n["score_mean"], n["recommendation"], n["gpus_flagged"]) for n in nodes] == [
        ("b1", 2, 60.0, 80.0, "reset_gpu", ["GB0"]), ("a1", 2, 65.0, 82.5, "reset_gpu", ["GA1"])]
    assert sorted(nodes, key=lambda n: n["host"]) == api_get(api, "/api/v1/health", **window, level="node")
    text = ok(store, tmp_path, "health", "scores", *WINDOW)
    assert text.splitlines()[1].split()[:4] == ["GB0", "b1", "60", "reset_gpu"]
    assert written(store) == before  # the sweep writes findings; the read does not

    refused(store, tmp_path, "health", "scores", "--start", T0.isoformat(), "--end", (T0 + dt.timedelta(days=2)).isoformat(),
            words="window longer than 1 day")
    refused(store, tmp_path, "health", "scores", "--start", WINDOW[3], "--end", WINDOW[1], words="end must be after start")
    refused(store, tmp_path, "health", "scores", "--end", "noon", words="Invalid value for --end: 'noon' is not an RFC 3339 time")
    refused(store, tmp_path, "health", "scores", *WINDOW, "--level", "rack", words="'rack' is not one of 'gpu', 'node'")
    assert written(store) == before


def test_teams_idle_reads_what_the_sweep_found(api, tmp_path):
    from fleetscope.services import serving, teams
    from fleetscope.services.health import health_window

    store = api.app.state.store
    seed(store)
    teams.set_mapping(store, kind="slurm_account", match="nlp", team="nlp", recorded_by="test")
    serving.record_price(store, {"site_id": "site-b", "gpu_model": "", "valid_from": dt.datetime(2026, 1, 1, tzinfo=dt.UTC), "currency": "EUR",
                                 "gpu_hour_price": GPU_HOUR_PRICE_B, "energy_price_per_kwh": None}, recorded_by="test")
    health_window(store, T0, T0 + MINUTES * M, idle_min_s=600)  # the sweep, as beat runs it, writes the finding
    # by hand: job 777 holds GB0 and GB1 at 0 % from T0 to the last sample before the window's end, 20 min less 10 s
    idle_s = MINUTES * 60 - 10
    gpu_hours = round(2 * idle_s / 3600, 4)
    rows = ok(store, tmp_path, "teams", "idle", *WINDOW, "--json")
    assert [(r["subject"], r["team"], r["account"], r["gpus_idle"], r["hosts"], r["currency"]) for r in rows] == [
        ("job:c1/777", "nlp", "nlp", 2, "b1", "EUR")]
    assert rows[0]["idle_gpu_hours"] == pytest.approx(gpu_hours) and rows[0]["idle_cost"] == pytest.approx(round(2 * idle_s / 3600 * GPU_HOUR_PRICE_B, 2))
    assert rows[0]["idle_since"] == str(T0) and rows[0]["last_seen"] == str(T0 + MINUTES * M - dt.timedelta(seconds=10))
    routed = api_get(api, "/api/v1/teams/idle", start=T0.isoformat(), end=(T0 + MINUTES * M).isoformat())
    assert [{k: v for k, v in r.items() if k not in ("idle_since", "last_seen")} for r in rows] == [
        {k: v for k, v in r.items() if k not in ("idle_since", "last_seen")} for r in routed]
    assert ok(store, tmp_path, "teams", "idle", "--month", "2026-03", "--json") == rows
    assert ok(store, tmp_path, "teams", "idle", "--month", "2026-02", "--json") == []
    line = ok(store, tmp_path, "teams", "idle", *WINDOW).splitlines()[1].split()
    assert line[:3] == ["c1/777", "nlp", "2"] and line[-3:] == [f"{gpu_hours:.4f}", "1.98", "EUR"]

    before = written(store)
    refused(store, tmp_path, "teams", "idle", "--month", "2026-13", words="month '2026-13' is not YYYY-MM")
    refused(store, tmp_path, "teams", "idle", "--start", "March", words="Invalid value for --start: 'March' is not an RFC 3339 time")
    refused(store, tmp_path, "teams", "idle", "--start", WINDOW[3], "--end", WINDOW[1], words="Invalid value for --end: must be after the start")
    assert written(store) == before


def test_serving_price_and_slo_write_what_the_routes_read(api, tmp_path):
    store = api.app.state.store
    seed(store)
    out = ok(store, tmp_path, "serving", "price", "site-b", "--currency", "EUR", "--valid-from", "2026-01-01T00:00:00Z", "--gpu-model", "H100",
             "--gpu-hour-price", "2.9", "--energy-price-per-kwh", "0.21", "--by", "finance", "--json")
    assert {k: out[k] for k in ("site_id", "gpu_model", "valid_from", "currency", "gpu_hour_price", "energy_price_per_kwh", "recorded_by")} == {
        "site_id": "site-b", "gpu_model": "H100", "valid_from": "2026-01-01T00:00:00+00:00", "currency": "EUR", "gpu_hour_price": 2.9,
        "energy_price_per_kwh": 0.21, "recorded_by": "finance"}
    routed = api_get(api, "/api/v1/serving/prices", site_id="site-b")
    assert [(r["gpu_model"], r["currency"], r["gpu_hour_price"], r["energy_price_per_kwh"], r["recorded_by"]) for r in routed] == [
        ("H100", "EUR", 2.9, 0.21, "finance")]
    log = store.read("audit_log").filter(pl.col("action") == "price_book")
    assert log.select("actor", "subject").rows() == [("finance", "site:site-b")]
    listed = ok(store, tmp_path, "serving", "prices", "--json")
    assert [(r["site_id"], r["gpu_model"], r["gpu_hour_price"], r["energy_price_per_kwh"]) for r in listed] == [("site-b", "H100", 2.9, 0.21)]
    assert "2.9 EUR/GPU-h" in ok(store, tmp_path, "serving", "prices", "--site", "site-b")

    row = ok(store, tmp_path, "serving", "slo", "chat", "ttft-p99", "--kind", "latency", "--metric", "ttft_seconds", "--threshold-s", "0.5",
             "--objective", "0.99", "--by", "sre", "--json")
    assert {k: row[k] for k in ("deployment", "name", "kind", "metric", "threshold_s", "objective", "window_days", "updated_by")} == {
        "deployment": "chat", "name": "ttft-p99", "kind": "latency", "metric": "ttft_seconds", "threshold_s": 0.5, "objective": 0.99,
        "window_days": 28, "updated_by": "sre"}
    ok(store, tmp_path, "serving", "slo", "chat", "avail", "--kind", "availability", "--objective", "0.999", "--window-days", "7", "--metric", "ignored")
    slos = {r["slo"]: r for r in api_get(api, "/api/v1/serving/slos", deployment="chat", now=(T0 + MINUTES * M).isoformat())}
    assert {(s, r["kind"], r["objective"], r["metric"], r["threshold_s"]) for s, r in slos.items()} == {
        ("ttft-p99", "latency", 0.99, "ttft_seconds", 0.5), ("avail", "availability", 0.999, "", None)}
    stored = store.read("serving_slo").sort("name")
    assert stored.select("name", "window_days", "updated_by").rows()[0] == ("avail", 7, getpass.getuser())  # no --by: the OS user
    assert "ttft-p99" in ok(store, tmp_path, "serving", "slos", "chat", "--end", (T0 + MINUTES * M).isoformat())
    # who set which objective: an SLO loosened is a page that no longer comes
    slo_log = store.read("audit_log").filter(pl.col("action") == "serving_slo").sort("seq")
    assert slo_log.select("actor", "subject").rows() == [("sre", "deployment:chat/slo:ttft-p99"), (getpass.getuser(), "deployment:chat/slo:avail")]
    assert json.loads(slo_log["payload"][0])["objective"] == 0.99

    before, book, slo_rows = written(store), store.read("price_book"), store.read("serving_slo")
    price = ("serving", "price", "site-b", "--currency", "EUR", "--valid-from", "2026-02-01T00:00:00Z")
    refused(store, tmp_path, *price, "--gpu-hour-price", "-1", words="Invalid value for '--gpu-hour-price': -1.0 is not a price")
    refused(store, tmp_path, *price, "--energy-price-per-kwh", "nan", words="Invalid value for '--energy-price-per-kwh': nan is not a price")
    refused(store, tmp_path, *price, words="give --gpu-hour-price, --energy-price-per-kwh or both")
    refused(store, tmp_path, "serving", "price", "nowhere", "--currency", "EUR", "--valid-from", "2026-02-01T00:00:00Z", "--gpu-hour-price", "1",
            words="no site 'nowhere' in the inventory")
    refused(store, tmp_path, "serving", "price", "site-b", "--currency", "euro", "--valid-from", "2026-02-01T00:00:00Z", "--gpu-hour-price", "1",
            words="'euro' is not an ISO 4217 code")
    refused(store, tmp_path, "serving", "price", "site-b", "--currency", "EUR", "--valid-from", "February", "--gpu-hour-price", "1",
            words="Invalid value for --valid-from: 'February' is not an RFC 3339 time")
    slo = ("serving", "slo", "chat", "x")
    refused(store, tmp_path, "serving", "slo", "nope", "x", "--kind", "availability", "--objective", "0.9", words="no serving deployment 'nope'")
    refused(store, tmp_path, *slo, "--kind", "latency", "--objective", "0.9", words="a latency SLO needs a histogram metric and a positive threshold_s")
    refused(store, tmp_path, *slo, "--kind", "availability", "--objective", "1.5", words="Invalid value for '--objective': 1.5 is not in the range 0<x<1")
    refused(store, tmp_path, *slo, "--kind", "latency", "--metric", "ttft_seconds", "--threshold-s", "-0.5", "--objective", "0.9",
            words="Invalid value for '--threshold-s'")
    refused(store, tmp_path, *slo, "--kind", "availability", "--objective", "0.9", "--window-days", "40", words="Invalid value for '--window-days'")
    assert written(store) == before
    assert store.read("price_book").equals(book) and store.read("serving_slo").equals(slo_rows)

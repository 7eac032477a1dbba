"""The serving service and its routes over a live API: vLLM scrapes of two replicas pushed through the
ingest door minute by minute, then quantiles over time, rates, SLO status, goodput (bounded from the
histograms, exact once a request log arrives) and the window's findings."""

from __future__ import annotations

import datetime as dt
import json

import httpx
import polars as pl
import pytest

from analyzers import serving_latency as sl
from fleetscope.services import auth
from fleetscope.services import serving as serving_service
from tests import clirun

T0 = dt.datetime(2026, 3, 1, 12, 0, tzinfo=dt.UTC)
BOUNDS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
MINUTES = 10


def _body(pod: str, m: int, *, slow_from: int | None, kv: float, waiting: int) -> bytes:
    """A vLLM V1-style scrape after ``m`` minutes of 100 requests a minute at TTFT 0.08 s (0.8 s for 30 of
    them from minute ``slow_from`` on), 20 output tokens each."""
    fast = slow = 0
    for i in range(1, m + 1):
        n_slow = 30 if slow_from is not None and i >= slow_from else 0
        slow += n_slow
        fast += 100 - n_slow
    lab = f'model_name="llama",pod="{pod}",namespace="serve",node="gpu-{pod[-1]}"'
    lines = []
    for le in BOUNDS:
        c = (fast if le >= 0.08 else 0) + (slow if le >= 0.8 else 0)
        lines.append(f'vllm:time_to_first_token_seconds_bucket{{{lab},le="{le}"}} {c}')
    lines += [f'vllm:time_to_first_token_seconds_bucket{{{lab},le="+Inf"}} {fast + slow}',
              f"vllm:time_to_first_token_seconds_count{{{lab}}} {fast + slow}",
              f"vllm:time_to_first_token_seconds_sum{{{lab}}} {0.08 * fast + 0.8 * slow}",
              f"vllm:generation_tokens_total{{{lab}}} {20 * (fast + slow)}",
              f'vllm:request_success_total{{{lab},finished_reason="stop"}} {fast + slow}',
              f"vllm:kv_cache_usage_perc{{{lab}}} {kv}",
              f"vllm:num_requests_waiting{{{lab}}} {waiting}"]
    return ("\n".join(lines) + "\n").encode()


@pytest.fixture
def loaded(api):
    store = api.app.state.store
    h = {"Authorization": "Bearer " + auth.create_token(store.engine, "t", ["ingest"]), "Content-Type": "text/plain"}
    for m in range(MINUTES + 1):
        ts = (T0 + dt.timedelta(minutes=m)).isoformat()
        for pod, slow_from, kv, waiting in (("llama-0", None, 0.4, 0), ("llama-1", 6, 0.97, 12)):
            r = httpx.post(api.url + "/api/v1/ingest/auto", params={"ts": ts, "source": pod},
                           content=_body(pod, m, slow_from=slow_from, kv=kv, waiting=waiting), headers=h, timeout=60)
            assert r.status_code == 200 and r.json()["formats"] == ["vllm"], r.text
    read = {"Authorization": "Bearer " + auth.create_token(store.engine, "r", ["read"])}
    return api, store, h, read


def _get(api, read, path, **params):  # type: ignore[no-untyped-def]
    return httpx.get(api.url + "/api/v1/serving/" + path, params=params, headers=read, timeout=60)


def test_serving_reads_over_the_api(loaded):
    api, store, ingest_h, read = loaded
    deps = _get(api, read, "deployments").json()
    assert [(d["deployment"], d["replica"], d["pod"], d["host"], d["server"]) for d in deps] == [
        ("llama", "llama-0", "llama-0", "gpu-0", "vllm"), ("llama", "llama-1", "llama-1", "gpu-1", "vllm")]
    end = (T0 + dt.timedelta(minutes=MINUTES)).isoformat()
    q = _get(api, read, "quantiles", deployment="llama", q=0.9, start=(T0 + dt.timedelta(minutes=5)).isoformat(), end=end,
             step_s=60, window_s=60).json()
    values = [p["value"] for p in q["points"]]
    # minute 5: 200 fast of 200; from minute 6 on, 30 of 200 at 0.8 s: the 0.9 rank (180) falls in (0.5, 1.0]
    assert values[0] == pytest.approx(0.05 + 0.05 * 180 / 200)
    assert values[1:] == pytest.approx([0.5 + 0.5 * (180 - 170) / 30] * 5)
    assert values[1] == pytest.approx(sl.histogram_quantile(0.9, [(0.05, 0), (0.1, 170), (0.25, 170), (0.5, 170), (1.0, 200), (float("inf"), 200)]))
    rates = _get(api, read, "rates", deployment="llama", start=T0.isoformat(), end=end).json()["counters"]
    gen = next(c for c in rates if c["metric"] == "generation_tokens_total")
    assert gen["increase"] == 2 * 20 * 100 * MINUTES and gen["per_s"] == pytest.approx(2 * 2000 / 60)
    # TTFT <= 0.5 s at 99 %: 30 bad of 200 a minute since minute 6 is 15 % errors, 15x the budget
    s = _get(api, read, "slo", deployment="llama", metric="ttft_seconds", threshold_s=0.5, objective=0.99, now=end).json()
    assert s["burn_rates"]["5m"] == pytest.approx(15.0) and s["burn_rates"]["1h"] == pytest.approx(150 / 2000 / 0.01)
    assert s["alerts"] == ["page_slow", "ticket"] and s["good"] == 2000 - 150
    avail = _get(api, read, "slo", deployment="llama", kind="availability", objective=0.999, now=end).json()
    assert avail["sli"] == 1.0 and avail["alerts"] == []
    bad = _get(api, read, "slo", deployment="llama", metric="ttft_seconds", threshold_s=0.3, now=end)
    assert bad.status_code == 400 and "between 0.25 and 0.5" in bad.json()["detail"]
    g = _get(api, read, "goodput", deployment="llama", ttft_slo_s=0.5, tpot_slo_s=0.05, start=T0.isoformat(), end=end)
    assert g.status_code == 200 and g.json()["method"] == "bounded" and g.json()["goodput_low_rps"] is None
    assert "no ttft_seconds or e2e_latency_seconds" in g.json()["note"]  # these scrapes carry no end-to-end histogram
    assert _get(api, read, "quantiles", deployment="mistral").status_code == 404
    assert _get(api, read, "quantiles", deployment="llama", start="2026-03-01T12:00:00").status_code == 400
    assert httpx.get(api.url + "/api/v1/serving/deployments", timeout=10).status_code == 401

    # a request log makes goodput exact
    log = "".join(json.dumps({"deployment": "llama", "replica": "llama-0", "request_id": str(i),
                              "arrival": (T0 + dt.timedelta(seconds=i)).isoformat(),
                              "first_token": (T0 + dt.timedelta(seconds=i, milliseconds=100 if i % 4 else 900)).isoformat(),
                              "finish": (T0 + dt.timedelta(seconds=i + 2)).isoformat(), "output_tokens": 41}) + "\n" for i in range(40))
    r = httpx.post(api.url + "/api/v1/ingest/auto", content=log.encode(), headers=ingest_h, timeout=60)
    assert r.status_code == 200 and r.json()["formats"] == ["serving_requests"], r.text
    g = _get(api, read, "goodput", deployment="llama", ttft_slo_s=0.5, tpot_slo_s=0.05, start=T0.isoformat(), end=end).json()
    assert g["method"] == "exact" and g["completed"] == 40 and g["attainment"] == 0.75


def test_window_findings_are_written_once(loaded):
    api, store, _, _ = loaded
    start, end = T0 + dt.timedelta(minutes=5), T0 + dt.timedelta(minutes=MINUTES)
    f = serving_service.window_findings(store, start=start, end=end)
    assert f["kind"].to_list() == ["kv_cache_saturated"] and f["subject"].to_list() == ["deployment:llama/replica:llama-1"]
    serving_service.window_findings(store, start=start, end=end)
    stored = store.read("finding").filter(pl.col("analyzer") == "serving_saturation")
    assert stored.height == 1


def test_energy_per_token_and_health_beside_latency(loaded):
    """Each pod held one GPU of 350 W for the ten minutes; 2 x 20 x 100 tokens a minute: 350 * 60 * 2 /
    4000 = 10.5 J a token, 2.917 kWh per million, x 1.25 PUE at the site."""
    from fleetscope.core import frames as F

    api, store, _, read = loaded
    minutes = [T0 + dt.timedelta(minutes=m) for m in range(MINUTES)]
    wl = pl.DataFrame([{"ts": t, "gpu_uuid": f"GPU-{p}", "namespace": "serve", "pod": f"llama-{p}"} for t in minutes for p in (0, 1)])
    em = pl.DataFrame([{"minute": t, "gpu_uuid": f"GPU-{p}", "energy_j": 350.0 * 60} for t in minutes for p in (0, 1)])
    store.write(F.Batch(site=pl.DataFrame({"site_id": ["dc1"], "declared_pue": [1.25]}),
                        host=pl.DataFrame({"host": ["gpu-0", "gpu-1"], "site_id": ["dc1", "dc1"]}),
                        gpu_workload=wl, gpu_energy_minute=em,
                        finding=F.findings_frame([{"analyzer": "health", "kind": "thermal_throttle", "subject": "gpu:GPU-1",
                                                   "window_start": T0, "window_end": T0 + dt.timedelta(minutes=5), "severity": "warning"},
                                                  {"analyzer": "health", "kind": "thermal_throttle", "subject": "gpu:GPU-7",
                                                   "window_start": T0, "window_end": T0 + dt.timedelta(minutes=5), "severity": "warning"}])))
    end = (T0 + dt.timedelta(minutes=MINUTES)).isoformat()
    e = _get(api, read, "energy", deployment="llama", start=T0.isoformat(), end=end).json()
    assert e["basis"] == "gpu_energy_minute" and e["gpus"] == 2
    assert e["output_tokens"] == 2 * 20 * 100 * MINUTES and e["j_per_token"] == pytest.approx(10.5)
    assert e["gpu_kwh_per_million_tokens"] == pytest.approx(10.5e6 / 3.6e6) and e["pue"] == 1.25
    assert e["facility_kwh_per_million_tokens"] == pytest.approx(10.5e6 / 3.6e6 * 1.25)
    from analyzers import carbon

    g = carbon.site_intensity(store.read("site"))["g_per_kwh"][0]  # the site declares no country: the world's annual figure
    assert e["kgco2e_per_million_tokens"] == pytest.approx(10.5e6 / 3.6e6 * 1.25 * g / 1000)
    assert e["carbon_basis"].startswith("location-based, facility (GPU x PUE) energy; intensity annual")
    # money: 20 GPU-minutes at 2 EUR a GPU-hour, and 0.1458 kWh of facility energy at 0.25 EUR/kWh
    admin = {"Authorization": "Bearer " + auth.create_token(store.engine, "finance", ["admin"])}
    first = {"site_id": "dc1", "valid_from": (T0 - dt.timedelta(days=1)).isoformat(), "currency": "EUR", "gpu_hour_price": 2.0}
    r = httpx.put(api.url + "/api/v1/serving/prices", json=first, headers=admin, timeout=30)
    assert r.status_code == 200 and r.json()["recorded_by"] == "finance", r.text
    # the same site, model and start again: the row is updated, now with the site's tariff
    assert httpx.put(api.url + "/api/v1/serving/prices", json={**first, "energy_price_per_kwh": 0.25}, headers=admin, timeout=30).status_code == 200
    httpx.put(api.url + "/api/v1/serving/prices", json={**first, "gpu_model": "NVIDIA B200", "gpu_hour_price": 6.0}, headers=admin, timeout=30)
    for bad, status in (({"site_id": "dc9", "valid_from": T0.isoformat(), "currency": "EUR", "gpu_hour_price": 1.0}, 404),
                        ({"site_id": "dc1", "valid_from": T0.isoformat(), "currency": "euro", "gpu_hour_price": 1.0}, 422),
                        ({"site_id": "dc1", "valid_from": T0.isoformat(), "currency": "EUR"}, 422),
                        ({"site_id": "dc1", "valid_from": T0.isoformat(), "currency": "EUR", "gpu_hour_price": -1}, 422)):
        assert httpx.put(api.url + "/api/v1/serving/prices", json=bad, headers=admin, timeout=30).status_code == status, bad
    c = _get(api, read, "cost", deployment="llama", start=T0.isoformat(), end=end).json()
    gpu_cost, kwh = 20 / 60 * 2.0, 350 * 60 * 20 / 3.6e6 * 1.25
    assert c["currency"] == "EUR" and c["gpu_hours"] == pytest.approx(20 / 60) and c["unpriced_gpu_hours"] == 0
    assert c["gpu_cost"] == pytest.approx(gpu_cost) and c["energy_kwh"] == pytest.approx(kwh) and c["energy_cost"] == pytest.approx(kwh * 0.25)
    assert c["cost_per_million_tokens"] == pytest.approx((gpu_cost + kwh * 0.25) / 40_000 * 1e6)
    assert len(_get(api, read, "prices", site_id="dc1").json()) == 2
    h = _get(api, read, "health", deployment="llama", start=T0.isoformat(), end=end).json()["findings"]
    assert [f["subject"] for f in h] == ["gpu:GPU-1"]


def test_recorded_slos_are_evaluated_and_burn_findings_written(loaded):
    api, store, _, read = loaded
    admin = {"Authorization": "Bearer " + auth.create_token(store.engine, "sre", ["admin"])}
    body = {"deployment": "llama", "name": "ttft", "kind": "latency", "metric": "ttft_seconds", "threshold_s": 0.5, "objective": 0.99}
    assert httpx.put(api.url + "/api/v1/serving/slos", json=body, headers=read, timeout=30).status_code == 403
    r = httpx.put(api.url + "/api/v1/serving/slos", json=body, headers=admin, timeout=30)
    assert r.status_code == 200 and r.json()["updated_by"] == "sre", r.text
    for bad, status in (({**body, "objective": 1.5}, 422), ({**body, "colour": "red"}, 422), ({**body, "deployment": "mistral"}, 404),
                        ({**body, "threshold_s": None}, 422)):
        assert httpx.put(api.url + "/api/v1/serving/slos", json=bad, headers=admin, timeout=30).status_code == status, bad
    end = T0 + dt.timedelta(minutes=MINUTES)
    listed = httpx.get(api.url + "/api/v1/serving/slos", params={"now": end.isoformat()}, headers=read, timeout=30).json()
    assert [(x["slo"], x["alerts"]) for x in listed] == [("ttft", ["page_slow", "ticket"])]
    found = serving_service.window_findings(store, start=end - dt.timedelta(minutes=5), end=end)
    burn = found.filter(pl.col("kind") == "slo_burn").sort("subject")
    assert burn["subject"].to_list() == ["deployment:llama/slo:ttft/page_slow", "deployment:llama/slo:ttft/ticket"]
    assert burn["severity"].to_list() == ["critical", "warning"]
    assert json.loads(burn["evidence"][0])["burn_rates"]["30m"] == pytest.approx(7.5)


def test_serving_vs_training_in_money(api, tmp_path):
    """Training: 8 GPUs for an hour (8 GPU-hours at 2 EUR, 5.6 kWh x 1.25 PUE at 0.25 EUR); serving: one GPU ten
    minutes a day for three days. The crossover is projected at the mean daily serving cost."""
    from fleetscope.core import frames as F

    store = api.app.state.store
    day0 = dt.datetime(2026, 2, 1, tzinfo=dt.UTC)
    train = [{"minute": day0 + dt.timedelta(minutes=m), "job_id": "train", "site_id": "dc1", "energy_j": 8 * 700.0 * 60, "allocated_s": 480.0,
              "covered_s": 480.0, "gpus": 8} for m in range(60)]
    serve = [{"minute": day0 + dt.timedelta(days=d, minutes=m), "job_id": "serve", "site_id": "dc1", "energy_j": 700.0 * 60, "allocated_s": 60.0,
              "covered_s": 60.0, "gpus": 1} for d in range(1, 4) for m in range(10)]
    store.write_frames([(F.JOB_ENERGY_MINUTE, pl.DataFrame(train + serve, schema_overrides={"minute": F.UTC_US}))], source="test")
    store.write(F.Batch(site=pl.DataFrame({"site_id": ["dc1"], "declared_pue": [1.25]}),
                        job=pl.DataFrame({"job_id": ["train", "serve"], "kind": ["training", "inference"], "model_name": ["llama", "llama"]})))
    admin = {"Authorization": "Bearer " + auth.create_token(store.engine, "finance", ["admin"])}
    r = httpx.put(api.url + "/api/v1/serving/prices", json={"site_id": "dc1", "valid_from": (day0 - dt.timedelta(days=1)).isoformat(),
                                                            "currency": "EUR", "gpu_hour_price": 2.0, "energy_price_per_kwh": 0.25},
                  headers=admin, timeout=30)
    assert r.status_code == 200, r.text
    read = {"Authorization": "Bearer " + auth.create_token(store.engine, "r", ["read"])}
    c = httpx.get(api.url + "/api/v1/serving/crossover", params={"model": "llama"}, headers=read, timeout=30).json()
    training = 8 * 2.0 + 60 * 8 * 700 * 60 / 3.6e6 * 1.25 * 0.25
    per_day = 10 / 60 * 2.0 + 10 * 700 * 60 / 3.6e6 * 1.25 * 0.25
    assert c["currency"] == "EUR" and c["training_cost"] == pytest.approx(training) and c["serving_cost"] == pytest.approx(3 * per_day)
    assert c["crossover_basis"] == "projected" and c["crossover_date"] > "2026-02-04" and c["unpriced_job_minutes"] == 0
    assert httpx.get(api.url + "/api/v1/serving/crossover", params={"model": "mistral"}, headers=read, timeout=30).status_code == 404
    # the CLI answers the same from the same store
    env = {"FLEETSCOPE_DATA_DIR": str(tmp_path / "cli"), "PATH": "/usr/bin:/bin",
           "FLEETSCOPE_DATABASE_URL": store.engine.url.render_as_string(hide_password=False)}
    cli = clirun.cli("serving", "crossover", "llama", "--json", env=env)
    assert cli.returncode == 0, cli.stderr
    assert json.loads(cli.stdout)["training_cost"] == pytest.approx(training)
    text = clirun.cli("serving", "crossover", "llama", env=env).stdout
    assert text.startswith(f"llama: training {training:,.2f} EUR, serving so far {3 * per_day:,.2f} EUR over 3 days; serving passes training on")


def test_the_cli_reads_what_the_api_reads(loaded, tmp_path):
    import subprocess

    api, store, _, read = loaded
    env = {"FLEETSCOPE_DATA_DIR": str(tmp_path / "cli"), "FLEETSCOPE_DATABASE_URL": store.engine.url.render_as_string(hide_password=False),
           "PATH": "/usr/bin:/bin"}

    def cli(*args: str) -> subprocess.CompletedProcess:
        return clirun.cli("serving", *args, env=env)

    end = (T0 + dt.timedelta(minutes=MINUTES)).isoformat()
    deps = cli("deployments", "--json")
    assert deps.returncode == 0, deps.stderr
    assert [d["replica"] for d in json.loads(deps.stdout)] == ["llama-0", "llama-1"]
    q = cli("quantiles", "llama", "--q", "0.9", "--since", "300", "--end", end, "--step-s", "60", "--rate-window-s", "60", "--json")
    api_q = _get(api, read, "quantiles", deployment="llama", q=0.9, start=(T0 + dt.timedelta(minutes=5)).isoformat(), end=end,
                 step_s=60, window_s=60).json()
    assert [p["value"] for p in json.loads(q.stdout)] == pytest.approx([p["value"] for p in api_q["points"]])
    assert [p["value"] for p in json.loads(q.stdout)][1] == pytest.approx(0.5 + 0.5 * 10 / 30)
    text = cli("quantiles", "llama", "--q", "0.9", "--since", "300", "--end", end, "--step-s", "60", "--rate-window-s", "60").stdout
    assert text.splitlines()[1].split()[-1] == f"{0.5 + 0.5 * 10 / 30:.3g}"
    g = cli("goodput", "llama", "--ttft-slo-s", "0.5", "--tpot-slo-s", "0.05", "--since", "600", "--end", end, "--json")
    assert json.loads(g.stdout)["method"] == "bounded"
    missing = cli("quantiles", "mistral")
    assert missing.returncode == 1 and "no serving deployment 'mistral'" in missing.stderr
    assert cli("slos", "llama").stdout.startswith("no SLO recorded for llama")

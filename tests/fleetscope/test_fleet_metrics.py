"""The derived fleet series in Prometheus format: what the analyzers stored, read back through
``prometheus_client``'s own parser, through the API with its scope, and scraped by the real Prometheus."""

from __future__ import annotations

import datetime as dt
import os
import shutil
import subprocess
import time

import httpx
import polars as pl
import pytest
from prometheus_client.parser import text_string_to_metric_families

from benchmarks._server import free_port, served_api
from fleetscope.services import jobs as analysis
from fleetscope.services import auth
from fleetscope.store import db
from fleetscope.services import energy_rollup
from fleetscope.services import fleet_metrics
from fleetscope.services import health as health_service
from fleetscope.core import frames as F
from fleetscope.store import Store

MIN = dt.timedelta(minutes=1)
GPUS = [(f"GPU-n{h}-{g}", f"n{h}") for h in range(2) for g in range(4)]


def seed(store: Store, now: dt.datetime) -> None:
    """Half an hour of a two-host site ending at ``now``: an 8-rank job with a slow rank and a restart, an XID 79,
    facility and IT meters at PUE 1.5; then the analyses beat would have run."""
    t0 = now - 30 * MIN
    store.write(F.Batch(
        site=pl.DataFrame({"site_id": ["dc1"]}), host=pl.DataFrame({"host": ["n0", "n1"], "site_id": ["dc1", "dc1"]}),
        gpu=pl.DataFrame({"gpu_uuid": [g for g, _ in GPUS], "host": [h for _, h in GPUS]}),
        job_rank=pl.DataFrame({"job_id": ["j1"] * 8, "rank": list(range(8)), "gpu_uuid": [g for g, _ in GPUS], "host": [h for _, h in GPUS],
                               "start": [t0] * 8}, schema_overrides={"start": F.UTC_US}),
    ))
    samples, steps, meters = [], [], []
    for i in range(0, 30 * 60, 10):
        t = t0 + dt.timedelta(seconds=i)
        samples += [{"ts": t, "gpu_uuid": g, "util_ratio": 0.9, "power_w": 500.0, "energy_j": 1e9 + 500.0 * i} for g, _ in GPUS]
        for r in range(8):
            c = 1.6 if r == 5 else 1.0
            steps.append({"job_id": "j1", "rank": r, "step": i // 10, "start": t, "end": t + dt.timedelta(seconds=c + 0.2),
                          "compute_s": c, "comm_s": 0.2, "comm_overlap_s": 0.0, "idle_s": 0.0})
        if i % 30 == 0:
            meters += [{"ts": t, "series": F.series_key("it_power_w", {"site": "dc1", "point": "it"}), "value": 5000.0},
                       {"ts": t, "series": F.series_key("facility_power_w", {"site": "dc1"}), "value": 7500.0}]
    ev = [{"job_id": "j1", "ts": t0, "kind": "started"}, {"job_id": "j1", "ts": t0 + 10 * MIN, "kind": "failure"},
          {"job_id": "j1", "ts": t0 + 15 * MIN, "kind": "restart"}]
    ev += [{"job_id": "j1", "ts": t0 + dt.timedelta(seconds=s), "kind": "step", "step": s // 10}
           for s in [*range(60, 600, 10), *range(960, 1790, 10)]]
    store.write(F.Batch(
        gpu_sample=pl.DataFrame(samples, schema_overrides={"ts": F.UTC_US}), step=pl.DataFrame(steps, schema_overrides={"start": F.UTC_US, "end": F.UTC_US}),
        metric_sample=pl.DataFrame(meters, schema=F.METRIC_SAMPLE.schema), job_event=pl.DataFrame(ev, schema_overrides={"ts": F.UTC_US, "step": pl.Int64}),
        health_event=pl.DataFrame({"ts": [now - 5 * MIN], "host": ["n1"], "gpu_uuid": ["GPU-n1-2"], "kind": ["xid"], "code": [79]},
                                  schema_overrides={"ts": F.UTC_US}),
    ))
    analysis.analyze_job(store, "j1", now=now)
    energy_rollup.rollup_window(store, now - 10 * MIN, now)
    health_service.health_window(store, now - 15 * MIN, now)


def families(text: bytes) -> dict[str, dict[tuple, float]]:
    out: dict[str, dict[tuple, float]] = {}
    for fam in text_string_to_metric_families(text.decode()):
        for s in fam.samples:
            out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


@pytest.fixture
def seeded(tmp_path):
    url = f"sqlite:///{tmp_path / 'fs.db'}"
    db.upgrade(url)
    store = Store.open(url)
    now = energy_rollup.floor_minute(dt.datetime.now(dt.UTC))
    seed(store, now)
    yield store, url, now
    store.engine.dispose()


def test_exposition_carries_what_the_analyzers_stored(seeded):
    store, _, now = seeded
    got = families(fleet_metrics.exposition(store, now))
    gp = analysis.stored_analysis(store, "j1", "goodput")["result"]
    assert got["fleetscope_job_goodput_ratio"] == {(("job_id", "j1"),): pytest.approx(gp["goodput_ratio"])}
    assert 0 < gp["goodput_ratio"] < 0.8  # ten minutes lost to the failure out of thirty
    bad = got["fleetscope_job_badput_seconds"]
    assert bad[(("bucket", "infrastructure_recovery"), ("job_id", "j1"))] == gp["badput_s"]["infrastructure_recovery"] > 0
    c3 = analysis.stored_analysis(store, "j1", "c3")["result"]
    shares = got["fleetscope_job_c3_ratio"]
    assert shares[(("job_id", "j1"), ("part", "compute"))] == pytest.approx(c3["c1_ratio"])
    assert sum(shares.values()) == pytest.approx(1.0)
    assert got["fleetscope_job_stragglers"] == {(("job_id", "j1"),): 1.0}  # rank 5
    # the XID 79 GPU, with dcgm-exporter's label names so PromQL can join it to the DCGM series
    findings = got["fleetscope_gpu_finding"]
    assert {dict(k)["UUID"] for k in findings} == {"GPU-n1-2"} and all(dict(k)["Hostname"] == "n1" for k in findings)
    assert (("Hostname", "n1"), ("UUID", "GPU-n1-2")) in got["fleetscope_gpu_health_score"]
    assert got["fleetscope_site_pue_ratio"] == {(("site", "dc1"),): pytest.approx(1.5)}
    assert got["fleetscope_site_gpu_power_watts"] == {(("site", "dc1"),): pytest.approx(8 * 500.0)}
    assert got["fleetscope_site_gpus_reporting"] == {(("site", "dc1"),): 8.0}
    assert "fleetscope_job_hung" not in got and "fleetscope_host_down" not in got


def test_exposition_of_an_empty_store_is_valid_and_empty(tmp_path):
    url = f"sqlite:///{tmp_path / 'e.db'}"
    db.upgrade(url)
    store = Store.open(url)
    assert families(fleet_metrics.exposition(store)) == {}
    store.engine.dispose()


PROMETHEUS = shutil.which("prometheus")


@pytest.mark.slow
def test_the_real_prometheus_scrapes_the_fleet_series(seeded, tmp_path):
    if PROMETHEUS is None:
        msg = "prometheus not installed (CI: apt-get install -y prometheus)"
        if os.environ.get("FLEETSCOPE_REQUIRE_SERVICES") == "1":
            pytest.fail(msg + " and FLEETSCOPE_REQUIRE_SERVICES=1")
        pytest.skip(msg)
    store, url, _ = seeded
    with served_api(url) as (base, ingest_token):
        assert httpx.get(base + "/api/v1/fleet/metrics").status_code == 401
        assert httpx.get(base + "/api/v1/fleet/metrics", headers={"authorization": f"Bearer {ingest_token}"}).status_code == 403
        token = auth.create_token(store.engine, "prometheus", ["read"])
        target = base.split("//", 1)[1]
        (tmp_path / "prometheus.yml").write_text(f"""global:
  scrape_interval: 1s
scrape_configs:
  - job_name: fleetscope
    metrics_path: /api/v1/fleet/metrics
    authorization:
      credentials: {token}
    static_configs:
      - targets: ["{target}"]
""")
        port = free_port()
        log = tmp_path / "prometheus.log"
        with log.open("wb") as out:
            prom = subprocess.Popen([PROMETHEUS, f"--config.file={tmp_path / 'prometheus.yml'}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                                     f"--web.listen-address=127.0.0.1:{port}"], stdout=out, stderr=subprocess.STDOUT)
            try:
                got = None
                deadline = time.monotonic() + 60
                while time.monotonic() < deadline and got is None:
                    time.sleep(0.5)
                    try:
                        r = httpx.get(f"http://127.0.0.1:{port}/api/v1/query", params={"query": "fleetscope_job_goodput_ratio"}).json()
                    except httpx.HTTPError:
                        continue
                    got = r["data"]["result"] or None
                assert prom.poll() is None, "Prometheus exited:\n" + log.read_text()[-3000:]
                up = httpx.get(f"http://127.0.0.1:{port}/api/v1/query", params={"query": "up"}).json()["data"]["result"]
                pue = httpx.get(f"http://127.0.0.1:{port}/api/v1/query",
                                params={"query": "fleetscope_site_pue_ratio"}).json()["data"]["result"]
            finally:
                prom.terminate()
                prom.wait(timeout=30)
    assert got is not None, "Prometheus never stored the series:\n" + log.read_text()[-3000:]
    assert [s["value"][1] for s in up] == ["1"]  # the scrape itself succeeded
    gp = analysis.stored_analysis(store, "j1", "goodput")["result"]["goodput_ratio"]
    assert got[0]["metric"]["job_id"] == "j1" and got[0]["metric"]["job"] == "fleetscope"
    assert float(got[0]["value"][1]) == pytest.approx(gp)
    assert [(s["metric"]["site"], float(s["value"][1])) for s in pue] == [("dc1", pytest.approx(1.5))]

"""GPU health windows, fabric regressions and the known-answer probe through the store, API and CLI."""

import datetime as dt
import json
import os

import httpx
import polars as pl

from fleetscope.services import auth
from fleetscope.core import frames as F
from fleetscope.services import health as health_service
from fleetscope.services.health import health_window
from fleetscope.sim import FleetSpec, gpu_fleet
from tests import clirun

T0 = dt.datetime(2026, 3, 1, 12, tzinfo=dt.UTC)


def seed(store):
    batch = gpu_fleet(FleetSpec(sites=1, nodes_per_site=2, gpus_per_node=4, interval_s=10), T0, 600)
    sick = batch.gpu["gpu_uuid"][5]
    sick_host = batch.gpu["host"][5]
    # GPU 5 fell off the bus (XID 79) and its row remapping failed: NVIDIA's catalog says drain / repair.
    batch.gpu_sample = batch.gpu_sample.with_columns(
        pl.when(pl.col("gpu_uuid") == sick).then(1).otherwise(0).alias("remap_failure"),
    )
    batch.health_event = pl.DataFrame({"ts": [T0 + dt.timedelta(minutes=3)], "host": [sick_host], "gpu_uuid": [sick], "kind": ["xid"], "code": [79]})
    store.write(batch)
    return sick, sick_host


def test_sick_gpu_gets_a_critical_finding_and_the_rest_none(store):
    sick, host = seed(store)
    out = health_window(store, T0, T0 + dt.timedelta(minutes=10))
    gpus = out["gpus"]
    assert gpus.height == 8
    worst = gpus.sort("score").row(0, named=True)
    assert worst["gpu_uuid"] == sick and worst["recommendation"] in ("drain_node", "send_for_repair")
    assert gpus.filter(pl.col("gpu_uuid") != sick)["recommendation"].unique().to_list() == ["none"]
    found = store.read("finding")
    assert f"gpu:{sick}" in found["subject"].to_list()
    assert set(found.filter(pl.col("subject") == f"gpu:{sick}")["severity"]) == {"critical"}
    # re-running the window updates the same findings
    health_window(store, T0, T0 + dt.timedelta(minutes=10))
    assert store.read("finding").height == found.height


def test_health_and_findings_endpoints(api):
    store = api.app.state.store
    sick, _ = seed(store)
    health_window(store, T0, T0 + dt.timedelta(minutes=10))
    h = {"Authorization": "Bearer " + auth.create_token(store.engine, "r", ["read"])}
    params = {"start": T0.isoformat(), "end": (T0 + dt.timedelta(minutes=10)).isoformat()}
    gpus = httpx.get(api.url + "/api/v1/health", params=params, headers=h).json()
    assert len(gpus) == 8 and min(gpus, key=lambda g: g["score"])["gpu_uuid"] == sick
    nodes = httpx.get(api.url + "/api/v1/health", params={**params, "level": "node"}, headers=h).json()
    assert len(nodes) == 2
    assert httpx.get(api.url + "/api/v1/health", params={**params, "end": (T0 + dt.timedelta(days=2)).isoformat()}, headers=h).status_code == 400
    found = httpx.get(api.url + "/api/v1/findings", params={"severity": "critical", "subject_prefix": "gpu:"}, headers=h).json()
    assert [f["subject"] for f in found] == [f"gpu:{sick}"]
    assert httpx.get(api.url + "/api/v1/findings", params={"kind": "nope"}, headers=h).json() == []


def test_cli_probe_records_a_health_event(tmp_path):
    env = {**os.environ, "FLEETSCOPE_DATA_DIR": str(tmp_path)}
    env.pop("FLEETSCOPE_DATABASE_URL", None)
    proc = clirun.cli("health", "probe", "--gpu-uuid", "GPU-test", "--json", env=env)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["passed"] is True and result["digest"] == result["golden"]
    from fleetscope.store import Store

    ev = Store.open(f"sqlite:///{tmp_path / 'fleetscope.store.db'}").read("health_event")
    assert ev.select("gpu_uuid", "kind", "value").rows() == [("GPU-test", "sdc_probe", 1.0)]


def test_cli_probe_without_cuda_fails_naming_what_is_missing_and_records_nothing(tmp_path):
    import importlib.util

    if importlib.util.find_spec("torch") or importlib.util.find_spec("cupy"):
        import pytest

        pytest.skip("a CUDA library is installed here")
    env = {**os.environ, "FLEETSCOPE_DATA_DIR": str(tmp_path)}
    env.pop("FLEETSCOPE_DATABASE_URL", None)
    proc = clirun.cli("health", "probe", "--backend", "cuda", env=env)
    assert proc.returncode == 1 and proc.stdout == ""
    assert "no CUDA probe backend can run here" in proc.stderr and "torch is not installed" in proc.stderr and "cupy is not installed" in proc.stderr
    from fleetscope.store import Store

    assert Store.open(f"sqlite:///{tmp_path / 'fleetscope.store.db'}").read("health_event").height == 0


def test_a_failed_probe_is_a_confirmed_suspect_in_the_health_window(store):
    from analyzers import sdc_probe
    from fleetscope.services.health import probe_event, run_probe

    seed(store)
    good = run_probe(store, "numpy", gpu_uuid="GPU-ok")  # recorded now: outside the window below
    assert good.passed is True and good.device_type == "cpu" and good.digest == good.golden
    wrong = sdc_probe.probe_matmul()
    wrong[7, 9] += 1  # one element computed wrong, as a corrupting GPU would
    bad = sdc_probe.ProbeResult("torch", "NVIDIA H200 (cuda:0)", sdc_probe.PROBE_N, sdc_probe.PROBE_ROUNDS, sdc_probe.PROBE_SEED, sdc_probe.probe_digest(wrong),
                          good.golden, sdc_probe.check_probe(sdc_probe.probe_digest(wrong)), 0.1, 1, "NVIDIA H200")
    ok = sdc_probe.ProbeResult("torch", "NVIDIA H200 (cuda:1)", sdc_probe.PROBE_N, sdc_probe.PROBE_ROUNDS, sdc_probe.PROBE_SEED, good.digest, good.golden, True, 0.1,
                         None, "NVIDIA H200")
    at = T0 + dt.timedelta(minutes=4)
    store.write(F.Batch(source="probe", health_event=pl.concat([probe_event(bad, ts=at, host="h1", gpu_uuid="GPU-bad"),
                                                                probe_event(ok, ts=at, host="h1", gpu_uuid="GPU-fine")])))
    health_window(store, T0, T0 + dt.timedelta(minutes=10))
    found = store.read("finding").filter(pl.col("analyzer") == "sdc")
    assert found.select("subject", "kind", "severity").rows() == [("gpu:GPU-bad", "sdc_confirmed", "critical")]
    (signal,) = json.loads(found["evidence"][0])["signals"]
    assert signal == {"signal": "probe_failed", "digest": bad.digest, "golden": good.golden, "mismatched_elements": 1, "device_type": "NVIDIA H200"}


def test_the_sweep_finds_a_slow_host_and_a_slow_link_from_the_windows_collectives(store):
    """Two-rank all-reduce communicators over 8 hosts (one rank each); every group with host h5 moves data at
    half the rate, and the point-to-point sends from rank 1 to rank 2 crawl."""
    t0 = dt.datetime(2026, 11, 30, 12, 0, tzinfo=dt.UTC)
    rows, seq = [], 0
    for a in range(8):
        for b in range(a + 1, 8):
            for rep in range(3):
                bw = 50.0 if 5 in (a, b) else 100.0
                for rank in (a, b):
                    rows.append({"job_id": "j", "rank": rank, "comm_id": f"c{a}{b}", "seq": rep, "op": "AllReduce", "peer": -1,
                                 "bytes": 1 << 28, "nranks": 2, "start": t0 + dt.timedelta(seconds=seq), "busbw_gbps": bw, "host": f"h{rank}"})
                seq += 1
    for rank in range(4):
        for k in range(5):
            rows.append({"job_id": "j", "rank": rank, "comm_id": "p2p", "seq": 1000 + k, "op": "Send", "peer": (rank + 1) % 4,
                         "bytes": 1 << 24, "start": t0 + dt.timedelta(seconds=200 + k), "busbw_gbps": 10.0 if rank == 1 else 40.0,
                         "host": f"h{rank}"})
    store.write(F.Batch(collective=pl.DataFrame(rows, schema_overrides={"start": F.UTC_US})))
    found = health_service.slow_fabric(store, t0, t0 + dt.timedelta(minutes=15))
    got = sorted(found.select("kind", "subject").rows())
    assert got == [("slow_host", "host:h5"), ("slow_link", "job:j/link:1->2")]
    ev = json.loads(found.filter(pl.col("kind") == "slow_host")["evidence"][0])
    assert ev["score"] == 0.5 and ev["innocent_groups"] == 0  # every group with h5 at half the shape's median
    # the whole sweep stores them, where the NcclBandwidthRegression rule reads slow_host and slow_link
    health_service.health_window(store, t0, t0 + dt.timedelta(minutes=15))
    assert set(store.read("finding")["kind"].to_list()) >= {"slow_host", "slow_link"}

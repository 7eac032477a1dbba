"""The node agent polling real dcgm-exporter output over HTTP on loopback and pushing to a live API,
as OpenTelemetry SDK metrics (the default) and as Fleetscope batches."""

import contextlib
import datetime as dt
import http.server
import json
import os
import socket
import subprocess
import sys
import threading

import polars as pl
import pytest
from polars.testing import assert_frame_equal

from fleetscope.services import auth
from fleetscope.agent import Agent, AgentStopped
from ingest import dcgm

SCRAPE = "telemetry/dcgm-exporter_metrics_8xH100_k8s-pod-labels_sampled_nvidia-aicr.prom"
FULL_SCRAPE = "telemetry/dcgm-exporter_metrics_L40S_helm-default_full_cncf-upcloud.prom"


@contextlib.contextmanager
def serving(body: bytes):
    """Serves a dcgm-exporter /metrics body on loopback, as the exporter would (it cannot run without a GPU)."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}/metrics"
    finally:
        srv.shutdown()


@pytest.fixture
def exporter(realdata):
    with serving((realdata / SCRAPE).read_bytes()) as url:
        yield url


def dead_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}/metrics"


@pytest.mark.parametrize("push", ["otlp", "batch"])
def test_tick_pushes_the_scrape_and_survives_a_dead_exporter(api, exporter, push):
    token = auth.create_token(api.app.state.store.engine, "agent", ["ingest"])
    dead = dead_url()
    report = Agent(api.url, token, [exporter, dead], push=push).tick()
    assert report.pushed[exporter]["gpu_sample"] == 8
    # the error is filed under the exporter that failed, and says why
    assert list(report.errors) == [dead] and "Connection refused" in report.errors[dead]
    store = api.app.state.store
    assert store.read("gpu_sample")["gpu_uuid"].n_unique() == 8
    assert store.read("gpu").filter(store.read("gpu")["gpu_uuid"] == "GPU-c4529c8d-69c4-b61d-e0bc-7b2460096005")["host"].to_list() == ["gpu-node-1"]


@pytest.mark.parametrize("push", ["otlp", "batch"])
def test_a_refused_token_stops_the_agent(api, exporter, push):
    reader = auth.create_token(api.app.state.store.engine, "wrong-scope", ["read"])
    with pytest.raises(AgentStopped, match="403"):
        Agent(api.url, reader, [exporter], push=push).tick()
    assert api.app.state.store.counts()["gpu_sample"] == 0


def test_cli_agent_once(api, exporter, tmp_path):
    token = auth.create_token(api.app.state.store.engine, "agent", ["ingest"])
    env = {**os.environ, "FLEETSCOPE_DATA_DIR": str(tmp_path)}
    proc = subprocess.run([sys.executable, "-m", "fleetscope.cli", "agent", "--dcgm", exporter, "--once", "--json", "--api", api.url, "--token", token],
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    # the values the scrape holds: temperature, power and utilization of 8 GPUs, memory-copy utilization of 6
    assert out["pushed"][exporter] == {"gpu_sample": 8, "points": 30} and out["points"] == 30 and out["rejected_points"] == 0
    batch = subprocess.run([sys.executable, "-m", "fleetscope.cli", "agent", "--push", "batch", "--dcgm", exporter, "--once", "--json", "--api", api.url, "--token", token],
                           env=env, capture_output=True, text=True, timeout=120)
    assert batch.returncode == 0, batch.stderr
    assert json.loads(batch.stdout)["pushed"][exporter]["gpu_sample"] == 8
    nvml = subprocess.run([sys.executable, "-m", "fleetscope.cli", "agent", "--nvml", "--once", "--api", api.url, "--token", token],
                          env=env, capture_output=True, text=True, timeout=120)
    assert nvml.returncode == 1 and "NVIDIA driver" in nvml.stderr and "Traceback" not in nvml.stderr


def _no_ts(df: pl.DataFrame) -> pl.DataFrame:
    return df.drop("ts").sort("gpu_uuid")


def test_otlp_push_lands_as_the_rows_the_scrape_parses_to(api, realdata):
    """The SDK export of two real scrapes, read back by the server, equals parsing the scrapes directly:
    every gpu_sample column with its unit converted (MiB, mJ, percent), inventory, pod attribution, and a
    row-remap health event from a real scrape whose uncorrectable-rows counter was raised to 2."""
    full = (realdata / FULL_SCRAPE).read_bytes()
    remapped = full.replace(
        b'DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS{gpu="0",UUID="GPU-5b4e07f6-3a86-4340-039d-25f2a83cdc43",pci_bus_id="00000000:00:07.0",device="nvidia0",modelName="NVIDIA L40S",Hostname="gpu1-wl8sg",DCGM_FI_DRIVER_VERSION="595.58.03"} 0',
        b'DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS{gpu="0",UUID="GPU-5b4e07f6-3a86-4340-039d-25f2a83cdc43",pci_bus_id="00000000:00:07.0",device="nvidia0",modelName="NVIDIA L40S",Hostname="gpu1-wl8sg",DCGM_FI_DRIVER_VERSION="595.58.03"} 2',
    )
    assert remapped != full
    sampled = (realdata / SCRAPE).read_bytes()
    token = auth.create_token(api.app.state.store.engine, "agent", ["ingest"])
    with serving(sampled) as url_a, serving(remapped) as url_b:
        agent = Agent(api.url, token, [url_a, url_b], host="collector-1")
        before = dt.datetime.now(dt.UTC)
        report = agent.tick()
        agent.close()
    assert report.errors == {} and report.rejected_points == 0
    assert report.pushed[url_b]["gpu_sample"] == 1

    store = api.app.state.store
    want = dcgm.parse(sampled, ts=before).merge(dcgm.parse(remapped, ts=before))
    got = store.read("gpu_sample")
    assert got.height == 9 and got["ts"].n_unique() == 1 and got["ts"][0] >= before
    cols = [c for c in want.gpu_sample.columns if want.gpu_sample[c].null_count() < want.gpu_sample.height]
    assert_frame_equal(_no_ts(got.select(cols)), _no_ts(want.gpu_sample.select(cols)), check_exact=False)
    l40s = got.filter(pl.col("gpu_uuid") == "GPU-5b4e07f6-3a86-4340-039d-25f2a83cdc43").row(0, named=True)
    assert l40s["energy_j"] == pytest.approx(5551899.58) and l40s["fb_free_bytes"] == 47667216384 and l40s["sm_clock_mhz"] == 210.0

    gpus = store.read("gpu").sort("gpu_uuid")
    assert dict(zip(gpus["gpu_uuid"], gpus["host"]))["GPU-5b4e07f6-3a86-4340-039d-25f2a83cdc43"] == "gpu1-wl8sg"
    assert set(gpus["model_name"]) == {"NVIDIA H100 80GB HBM3", "NVIDIA L40S"}
    work = store.read("gpu_workload")
    assert work.select("gpu_uuid", "namespace", "pod", "container").rows() == [
        ("GPU-c4529c8d-69c4-b61d-e0bc-7b2460096005", "dynamo-workload", "vllm-agg-0-vllmdecodeworker-s65j5", "main")]
    ev = store.read("health_event")
    assert ev.select("gpu_uuid", "host", "kind", "code", "value").rows() == [
        ("GPU-5b4e07f6-3a86-4340-039d-25f2a83cdc43", "gpu1-wl8sg", "row_remap", 393, 2.0)]


def test_agent_polls_inference_servers_and_each_is_detected(api, realdata):
    """``--serving``: real vLLM and Triton bodies served on loopback, pushed as they are to the ingest route,
    which tells the servers apart by their names; the URL names the replica."""
    token = auth.create_token(api.app.state.store.engine, "agent", ["ingest"])
    vllm = (realdata / "serving/vllm-v0_metrics_Llama-3.1-8B-FP8_kubeai-mock.prom").read_bytes()
    triton = (realdata / "serving/triton-server_metrics_T4_densenet_datadog-fixture.prom").read_bytes()  # no final newline
    with serving(vllm) as url_v, serving(triton) as url_t:
        env = {**os.environ}
        proc = subprocess.run([sys.executable, "-m", "fleetscope.cli", "agent", "--no-infiniband", "--serving", url_v, "--serving", url_t,
                               "--once", "--json", "--api", api.url, "--token", token], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    pushed = json.loads(proc.stdout)["pushed"]
    assert pushed[url_v]["serving_bucket"] == 70 and pushed[url_t]["serving_counter"] == 73
    store = api.app.state.store
    g = store.read("serving_gauge").filter(pl.col("metric") == "requests_running")
    assert g.filter(pl.col("replica") == url_v)["value"].to_list() == [3.0]
    energy = store.read("serving_counter").filter((pl.col("metric") == "gpu_energy_joules_total") & (pl.col("replica") == url_t))
    assert energy["value"].to_list() == [pytest.approx(4_879_631.328)]

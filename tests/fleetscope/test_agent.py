"""The node agent polling real dcgm-exporter output over HTTP on loopback and pushing to a live API."""

import http.server
import json
import os
import socket
import subprocess
import sys
import threading

import pytest

from fleetscope import auth
from fleetscope.agent import Agent, AgentStopped

SCRAPE = "telemetry/dcgm-exporter_metrics_8xH100_k8s-pod-labels_sampled_nvidia-aicr.prom"


@pytest.fixture
def exporter(realdata):
    """Serves a real dcgm-exporter /metrics body, as the exporter would (it cannot run without a GPU)."""
    body = (realdata / SCRAPE).read_bytes()

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
    yield f"http://127.0.0.1:{srv.server_address[1]}/metrics"
    srv.shutdown()


def dead_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}/metrics"


def test_tick_pushes_the_scrape_and_survives_a_dead_exporter(api, exporter):
    token = auth.create_token(api.app.state.store.engine, "agent", ["ingest"])
    report = Agent(api.url, token, [exporter, dead_url()]).tick()
    assert report.pushed[exporter]["gpu_sample"] == 8
    assert list(report.errors) != [] and exporter not in report.errors
    store = api.app.state.store
    assert store.read("gpu_sample")["gpu_uuid"].n_unique() == 8
    assert store.read("gpu").filter(store.read("gpu")["gpu_uuid"] == "GPU-c4529c8d-69c4-b61d-e0bc-7b2460096005")["host"].to_list() == ["gpu-node-1"]


def test_a_refused_token_stops_the_agent(api, exporter):
    reader = auth.create_token(api.app.state.store.engine, "wrong-scope", ["read"])
    with pytest.raises(AgentStopped, match="403"):
        Agent(api.url, reader, [exporter]).tick()
    assert api.app.state.store.counts()["gpu_sample"] == 0


def test_cli_agent_once(api, exporter, tmp_path):
    token = auth.create_token(api.app.state.store.engine, "agent", ["ingest"])
    env = {**os.environ, "FLEETSCOPE_DATA_DIR": str(tmp_path)}
    proc = subprocess.run([sys.executable, "-m", "fleetscope.cli", "agent", "--dcgm", exporter, "--once", "--json", "--api", api.url, "--token", token],
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["pushed"][exporter]["gpu_sample"] == 8
    nvml = subprocess.run([sys.executable, "-m", "fleetscope.cli", "agent", "--nvml", "--once", "--api", api.url, "--token", token],
                          env=env, capture_output=True, text=True, timeout=120)
    assert nvml.returncode == 1 and "NVIDIA driver" in nvml.stderr and "Traceback" not in nvml.stderr

"""The real Prometheus server (Debian package ``prometheus``) scrapes real inference-server bodies from
../shared/realdata/serving served over loopback, and its ``histogram_quantile`` over the scraped buckets
equals ``analyzers.serving_latency.quantiles`` over the same bodies as Fleetscope ingests them: interpolated
values, the answer capped at the last finite bound (SGLang's TTFT) and NaN for an idle server (vLLM V1)."""

from __future__ import annotations

import datetime as dt
import http.server
import math
import os
import shutil
import socket
import subprocess
import threading
import time

import httpx
import polars as pl
import pytest

from analyzers import serving_latency as sl
from ingest import serving_metrics as sm

from tests.ingest.conftest import REALDATA

PROMETHEUS = shutil.which("prometheus")
T0 = dt.datetime(2026, 3, 1, tzinfo=dt.UTC)

# target path -> (file, server, [(Prometheus metric, our canonical metric, extra label selector)])
TARGETS = {
    "vllm0": ("vllm-v0_metrics_Llama-3.1-8B-FP8_kubeai-mock.prom", "vllm", [
        ("vllm:time_to_first_token_seconds", "ttft_seconds", ""),
        ("vllm:time_per_output_token_seconds", "inter_token_latency_seconds", ""),
        ("vllm:e2e_request_latency_seconds", "e2e_latency_seconds", "")]),
    "vllm1": ("vllm-v1_metrics_Qwen2.5-0.5B_idle_full_cncf-kops.prom", "vllm", [
        ("vllm:time_to_first_token_seconds", "ttft_seconds", "")]),
    "sglang": ("sglang_metrics_Llama-3.1-8B_overload_docs-example.prom", "sglang", [
        ("sglang:time_to_first_token_seconds", "ttft_seconds", ""),
        ("sglang:time_per_output_token_seconds", "inter_token_latency_seconds", "")]),
    "tgi": ("huggingface-tgi_metrics_datadog-fixture.prom", "tgi", [
        ("tgi_request_duration", "e2e_latency_seconds", ""),
        ("tgi_batch_forward_duration", "batch_forward_seconds", 'method="decode"')]),
}
QS = (0.25, 0.5, 0.9, 0.99)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_histogram_quantile_equals_the_real_prometheus(tmp_path):
    if PROMETHEUS is None:
        msg = "prometheus not installed (CI: apt-get install -y prometheus)"
        if os.environ.get("FLEETSCOPE_REQUIRE_SERVICES") == "1":
            pytest.fail(msg + " and FLEETSCOPE_REQUIRE_SERVICES=1")
        pytest.skip(msg)
    folder = REALDATA / "serving"
    if not folder.is_dir():
        pytest.skip(f"real data folder {folder} is absent")
    bodies = {path: (folder / f).read_bytes() for path, (f, _, _) in TARGETS.items()}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            body = bodies.get(self.path.strip("/"))
            if body is None:
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a) -> None:  # type: ignore[no-untyped-def]
            pass

    exporter = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=exporter.serve_forever, daemon=True).start()
    target = f"127.0.0.1:{exporter.server_address[1]}"
    jobs = "".join(f"""  - job_name: {path}
    metrics_path: /{path}
    static_configs:
      - targets: ["{target}"]
""" for path in TARGETS)
    (tmp_path / "prometheus.yml").write_text("global:\n  scrape_interval: 1s\nscrape_configs:\n" + jobs)
    port = _free_port()
    log = tmp_path / "prometheus.log"
    api = f"http://127.0.0.1:{port}/api/v1/query"
    theirs: dict[tuple[str, str, float], float] = {}
    with log.open("wb") as out:
        prom = subprocess.Popen([PROMETHEUS, f"--config.file={tmp_path / 'prometheus.yml'}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                                 f"--web.listen-address=127.0.0.1:{port}"], stdout=out, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 60
            up: list = []
            while time.monotonic() < deadline and len(up) < len(TARGETS):
                time.sleep(0.5)
                try:
                    up = [s for s in httpx.get(api, params={"query": "up == 1"}).json()["data"]["result"]]
                except (httpx.HTTPError, KeyError, ValueError):
                    continue
            assert prom.poll() is None, "Prometheus exited:\n" + log.read_text()[-3000:]
            assert len(up) == len(TARGETS), "not every body was scraped:\n" + log.read_text()[-3000:]
            for path, (_, _, metrics) in TARGETS.items():
                for prom_name, _, selector in metrics:
                    sel = f'{{job="{path}"{"," + selector if selector else ""}}}'
                    for q in QS:
                        expr = f"histogram_quantile({q}, sum by (le) ({prom_name}_bucket{sel}))"
                        res = httpx.get(api, params={"query": expr}).json()
                        assert res["status"] == "success", res
                        [sample] = res["data"]["result"]
                        theirs[(path, prom_name, q)] = float(sample["value"][1])
        finally:
            prom.terminate()
            prom.wait(timeout=30)
            exporter.shutdown()
    compared = 0
    for path, (f, server, metrics) in TARGETS.items():
        b = sm.parse(bodies[path], server=server, source=f, ts=T0).serving_bucket
        for prom_name, metric, selector in metrics:
            labels = selector
            ours = sl.quantiles(b.filter((pl.col("metric") == metric) & (pl.col("labels").str.contains(labels, literal=True))), QS,
                                by=("metric",))
            for q, v in zip(ours["q"], ours["value"]):
                want = theirs[(path, prom_name, q)]
                assert (math.isnan(v) and math.isnan(want)) or v == pytest.approx(want, rel=1e-12, abs=1e-15), (path, prom_name, q, v, want)
                compared += 1
    assert compared == len(QS) * sum(len(m) for _, _, m in TARGETS.values())
    assert math.isnan(theirs[("vllm1", "vllm:time_to_first_token_seconds", 0.5)])  # idle: no data, not 0
    assert theirs[("sglang", "sglang:time_to_first_token_seconds", 0.5)] == 30.0  # past the last bucket: its bound
    assert theirs[("vllm0", "vllm:time_to_first_token_seconds", 0.99)] == pytest.approx(0.0794)

"""The real Prometheus (Debian's ``prometheus``) scrapes a real dcgm-exporter body from a loopback port and
remote-writes it to a running ``fleetscope serve``; the store must then hold the body's GPUs with the values
the body states, unit-converted."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from datetime import UTC, datetime
from pathlib import Path

import polars as pl
import pytest

from benchmarks._server import free_port, served_api
from fleetscope.store import Store
from ingest import dcgm
from tests.fleetscope.test_agent import serving

TELEMETRY = Path(__file__).resolve().parents[2].parent / "shared" / "realdata" / "telemetry"
BODY = TELEMETRY / "dcgm-exporter_metrics_8xH100_k8s-pod-labels_sampled_nvidia-aicr.prom"
PROMETHEUS = shutil.which("prometheus")
REQUIRE = os.environ.get("FLEETSCOPE_REQUIRE_SERVICES") == "1"
WAIT_S = 60

pytestmark = pytest.mark.slow


def test_prometheus_remote_writes_a_dcgm_scrape_into_the_store(tmp_path):
    if PROMETHEUS is None:
        msg = "prometheus not installed (CI: apt-get install -y prometheus)"
        if REQUIRE:
            pytest.fail(msg + " and FLEETSCOPE_REQUIRE_SERVICES=1")
        pytest.skip(msg)
    if not BODY.is_file():
        pytest.skip(f"real dcgm-exporter body not found at {BODY}")
    body = BODY.read_bytes()  # read in place, never copied into the repository
    expected = dcgm.parse(body, ts=datetime.now(UTC)).gpu_sample  # the values, unit-converted; Prometheus sets the times
    with serving(body) as metrics_url:  # a stand-in dcgm-exporter: serves the body at /metrics
        target = metrics_url.split("//", 1)[1].split("/", 1)[0]
        url = f"sqlite:///{tmp_path / 'fleetscope.store.db'}"
        prom_port = free_port()
        log = tmp_path / "prometheus.log"
        with served_api(url) as (base, token):
            (tmp_path / "prometheus.yml").write_text(
                f"""global:
  scrape_interval: 1s
scrape_configs:
  - job_name: dcgm-exporter
    scrape_interval: 1s
    static_configs:
      - targets: ["{target}"]
remote_write:
  - url: {base}/api/v1/write
    authorization:
      credentials: {token}
    queue_config:
      batch_send_deadline: 1s
"""
            )
            with log.open("wb") as out:
                prom = subprocess.Popen(
                    [PROMETHEUS, f"--config.file={tmp_path / 'prometheus.yml'}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                     f"--web.listen-address=127.0.0.1:{prom_port}"],
                    stdout=out, stderr=subprocess.STDOUT,
                )
                try:
                    store = Store.open(url)
                    got = _wait_for(store, expected["gpu_uuid"].to_list(), prom)
                finally:
                    prom.terminate()
                    try:
                        prom.wait(timeout=30)
                    except subprocess.TimeoutExpired:
                        prom.kill()
                        prom.wait()
            assert got is not None, f"no complete gpu_sample rows after {WAIT_S} s; Prometheus said:\n{log.read_text()[-3000:]}"
            # Every scrape gives one row per GPU at the scrape's time, with the body's values.
            cols = ["temp_c", "power_w", "util_ratio", "mem_copy_util_ratio"]
            first = got.sort("ts").unique("gpu_uuid", keep="first").sort("gpu_uuid").select("gpu_uuid", *cols)
            assert first.equals(expected.sort("gpu_uuid").select("gpu_uuid", *cols)), (first, expected)
            g0 = first.filter(pl.col("gpu_uuid") == "GPU-c4529c8d-69c4-b61d-e0bc-7b2460096005").row(0, named=True)
            assert g0["temp_c"] == 30 and g0["power_w"] == pytest.approx(113.611) and g0["util_ratio"] == 0.0
            inventory = store.read("gpu").sort("gpu_uuid")
            assert inventory["host"].unique().to_list() == ["gpu-node-1"] and inventory.height == 8
            workload = store.read("gpu_workload")
            assert workload["pod"].unique().to_list() == ["vllm-agg-0-vllmdecodeworker-s65j5"]
            store.engine.dispose()


def _wait_for(store: Store, uuids: list[str], prom: subprocess.Popen) -> pl.DataFrame | None:
    """The gpu_sample rows once every GPU of the body has one, or None after WAIT_S seconds."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        if prom.poll() is not None:
            return None
        rows = store.read("gpu_sample")
        if rows.height and set(uuids) <= set(rows["gpu_uuid"].to_list()):
            # A request may hold part of a scrape; wait for one where every GPU has every field.
            complete = rows.filter(pl.col("temp_c").is_not_null() & pl.col("power_w").is_not_null())
            if set(uuids) <= set(complete["gpu_uuid"].to_list()):
                return complete
        time.sleep(0.5)
    return None

"""`fleetscope demo` from the outside: a fresh data directory, real API, worker, beat and dashboard processes,
the simulator's files ingested through the API, and every injected fault found by its analyzer."""

import json
import os
import socket
import subprocess
import sys

import httpx
import pytest


@pytest.mark.slow
def test_demo_finds_every_injected_fault(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEETSCOPE_")}
    env["FLEETSCOPE_DATA_DIR"] = str(tmp_path / "data")
    proc = subprocess.run(
        [sys.executable, "-m", "fleetscope.cli", "demo", "--size", "small", "--exit-after", "1", "--port", str(port), "--json"],
        env=env, capture_output=True, text=True, timeout=400,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    faults = {f["fault"]: f for f in summary["faults"]}
    # the simulator's injected faults, plus the governance ones
    assert set(faults) == {"thermal_straggler", "slow_link", "sdc", "row_remap_failure", "gpu_failure", "preemption",
                           "quarantined_dataset_upstream", "biased_model"}
    missed = [f for f in summary["faults"] if not f["found"]]
    assert missed == []
    assert summary["written"]["gpu_sample"] == 64 * 21  # 64 GPUs, a scrape every 30 s for 10 minutes
    assert summary["alerts_delivered"] >= 1 and "GpuRowRemapFailure" in summary["alertnames"]
    assert sum(summary["audit"]["counts"].values()) >= 17 * 2  # every rule for both models
    assert summary["ready_s"] < 90
    assert (tmp_path / "data" / "reports").is_dir() and any((tmp_path / "data" / "exports").glob("*.zip"))
    # Ctrl-C path: every child was stopped, so the API port is free again and nothing answers there.
    with pytest.raises(httpx.HTTPError):
        httpx.get(summary["api_url"] + "/healthz", timeout=2)
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # connections the demo made linger in TIME_WAIT
        s.bind(("127.0.0.1", port))

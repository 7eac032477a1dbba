"""`fleetscope demo` from the outside: a fresh data directory, real API, worker and beat processes."""

import json
import os
import socket
import subprocess
import sys

import pytest


@pytest.mark.slow
def test_demo_starts_everything_and_ingests_through_the_api(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEETSCOPE_")}
    env["FLEETSCOPE_DATA_DIR"] = str(tmp_path / "data")
    proc = subprocess.run(
        [sys.executable, "-m", "fleetscope.cli", "demo", "--minutes", "5", "--exit-after", "1", "--port", str(port), "--json"],
        env=env, capture_output=True, text=True, timeout=180,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    # 2 sites x 4 nodes x 8 GPUs, one sample every 10 s for 5 minutes
    assert summary["written"] == {"site": 2, "host": 8, "gpu": 64, "gpu_sample": 64 * 30}
    assert summary["worker"]["pong"] is True
    assert summary["api_url"] == f"http://127.0.0.1:{port}"
    assert summary["ready_s"] < 90
    # Ctrl-C path: every child was stopped, so the port is free again.
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))

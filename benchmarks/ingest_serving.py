"""Serving fleets at scrape shape: N inference-server replicas each pushing its own vLLM ``/metrics`` body
every interval, as ``fleetscope agent --serving`` does, to a running `fleetscope serve`.

The body is the real vLLM V0 scrape of ``../shared/realdata/serving`` (193 lines, 5 histograms), given a
``pod`` label per replica so each push is a replica of its own, and a new scrape time each round. Each round
posts every replica once over ``--connections`` keep-alive connections to ``POST /api/v1/ingest/vllm``; the
target is 1,000 replicas every 10 s, i.e. a round in under 10 s. Also the parser alone on one core.

One JSON line per measurement:

    python benchmarks/ingest_serving.py [--replicas 1000] [--rounds 3] [--connections 16] [--workers 1]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
sys.path.insert(0, str(_HERE.parent))

from ingest import serving_metrics  # noqa: E402

BODY = _HERE.parent.parent / "shared" / "realdata" / "serving" / "vllm-v0_metrics_Llama-3.1-8B-FP8_kubeai-mock.prom"

from benchmarks import _server  # noqa: E402

_load = _server.sibling

def bodies(n: int) -> list[bytes]:
    base = BODY.read_bytes()
    return [base.replace(b'model_name="', b'pod="vllm-%d",model_name="' % i) for i in range(n)]


def parse_rate(body: bytes, seconds: float = 3.0) -> dict[str, float]:
    ts = dt.datetime(2026, 3, 1, tzinfo=dt.UTC)
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        serving_metrics.parse(body, server="vllm", source="bench", ts=ts)
        n += 1
    el = time.perf_counter() - t0
    return {"bench": "serving_parse", "bodies_per_s": round(n / el, 1), "ms_per_body": round(el / n * 1e3, 3), "body_bytes": len(body)}


def run(replicas: int, rounds: int, connections: int, workers: int) -> list[dict[str, object]]:
    server = _server
    out = []
    all_bodies = bodies(replicas)
    with tempfile.TemporaryDirectory() as tmp, server.served_api(f"sqlite:///{tmp}/bench.db", workers=workers) as (base, token):
        headers = {"Authorization": f"Bearer {token}", "Content-Type": "text/plain"}
        with httpx.Client(base_url=base, headers=headers, timeout=120,
                          limits=httpx.Limits(max_connections=connections, max_keepalive_connections=connections)) as client:
            t_start = dt.datetime(2026, 3, 1, tzinfo=dt.UTC)
            for r in range(rounds):
                ts = (t_start + dt.timedelta(seconds=10 * r)).isoformat()
                lat: list[float] = []

                def post(i: int) -> int:
                    t0 = time.perf_counter()
                    resp = client.post("/api/v1/ingest/vllm", params={"ts": ts, "source": f"vllm-{i}"}, content=all_bodies[i])
                    lat.append(time.perf_counter() - t0)
                    return resp.status_code

                t0 = time.perf_counter()
                with ThreadPoolExecutor(connections) as pool:
                    codes = list(pool.map(post, range(replicas)))
                el = time.perf_counter() - t0
                lat.sort()
                out.append({"bench": "serving_ingest", "round": r, "replicas": replicas, "round_s": round(el, 2),
                            "pushes_per_s": round(replicas / el, 1), "ok": codes.count(200), "other": len(codes) - codes.count(200),
                            "p50_ms": round(lat[len(lat) // 2] * 1e3, 1), "p99_ms": round(lat[int(len(lat) * 0.99) - 1] * 1e3, 1),
                            "sustains_10s_interval": el < 10.0, "connections": connections, "workers": workers, "database": "sqlite"})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--replicas", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--connections", type=int, default=16)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--parse-only", action="store_true")
    a = ap.parse_args()
    print(json.dumps(parse_rate(bodies(1)[0])), flush=True)
    if not a.parse_only:
        for line in run(a.replicas, a.rounds, a.connections, a.workers):
            print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()

"""Ingest end to end: a 16,384-GPU dcgm-exporter scrape posted to a running `fleetscope serve`
(`POST /api/v1/ingest/dcgm`), parsed and written to the store, on SQLite and on PostgreSQL; and, where the
``victoria-metrics`` binary is installed, the same gzip body to VictoriaMetrics' ``/api/v1/import/prometheus``
in the same run, as the peer whose rate the target is set against.
Prints JSON lines: values/s per system (a value = one field of one GPU sample), the steady ratio to
VictoriaMetrics, and, since wall time on a shared machine follows its load, the CPU seconds a steady-state
scrape costs the server (all its threads) and PostgreSQL's backends, and the server's peak resident memory (what
the allocator settings of ``fleetscope serve`` trade for that CPU, ``FLEETSCOPE_TUNE_ALLOCATOR``).

Parse-only rates: benchmarks/ingest_dcgm.py (dcgm text), benchmarks/ingest_otlp.py (OTLP),
benchmarks/ingest_kineto.py (Kineto traces).

    python benchmarks/ingest.py [--gpus 16384] [--scrapes 5] [--workers 1] [--in-flight 1] [--no-postgres]
                                   [--no-victoria-metrics]
"""

from __future__ import annotations

import argparse
import datetime as dt
import gzip
import json
import os
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

# This script is named after the package it measures: take its own folder off the path so that
# `import ingest` finds the package, and load the scrape builder of ingest_dcgm.py by file.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
sys.path.insert(0, str(_HERE.parent))

from benchmarks import _server  # noqa: E402

synth_scrape = _server.sibling("ingest_dcgm").synth_scrape
served_api = _server.served_api
_agents = _server.sibling("ingest_agents")

from fleetscope.store import db  # noqa: E402
from ingest import dcgm  # noqa: E402


def run_victoria_metrics(body: bytes, gpus: int, scrapes: int, values_per_scrape: int) -> dict | None:
    """The same scrapes, one at a time, into VictoriaMetrics; each scrape's lines stamped by ``timestamp``
    (milliseconds), as Fleetscope's by ``ts``. None where the binary is not installed."""
    with _agents.victoria_metrics() as base:
        if base is None:
            return None
        gz = gzip.compress(body, compresslevel=1)
        t0_ms = int(dt.datetime(2026, 6, 1, tzinfo=dt.UTC).timestamp() * 1000)
        answered: list[float] = []
        with httpx.Client(timeout=600) as client:
            start = time.perf_counter()
            for s in range(scrapes):
                r = client.post(base + "/api/v1/import/prometheus", content=gz, params={"timestamp": t0_ms + 1000 * s},
                                headers={"Content-Type": "text/plain", "Content-Encoding": "gzip"})
                assert r.status_code == 204, r.text[:300]
                answered.append(time.perf_counter() - start)
        seconds = answered[-1]
        line = {"bench": "dcgm_api_end_to_end", "system": "victoria-metrics", "gpus": gpus, "scrapes": scrapes,
                "values": values_per_scrape * scrapes, "seconds": round(seconds, 2),
                "values_per_s": round(values_per_scrape * scrapes / seconds), "first_scrape_s": round(answered[0], 2)}
        if scrapes > 1:
            line["steady_values_per_s"] = round(values_per_scrape * (scrapes - 1) / (answered[-1] - answered[0]))
        print(json.dumps(line), flush=True)
        return line


def run(label: str, url: str, body: bytes, gpus: int, scrapes: int, workers: int, values_per_scrape: int, in_flight: int = 1,
        peer: dict | None = None) -> None:
    started: list[int] = []
    # PostgreSQL's backends name their database in their process title.
    watch = _server.CpuWatch(f" {url.rsplit('/', 1)[1]} ") if label == "postgresql" else None
    with served_api(url, workers, started=started) as (base, token):
        gz = gzip.compress(body, compresslevel=1)
        headers = {"Authorization": f"Bearer {token}", "Content-Type": "text/plain", "Content-Encoding": "gzip"}
        t0 = dt.datetime(2026, 6, 1, tzinfo=dt.UTC)

        answered: list[float] = []  # when each answer came, seconds after the start
        cpu_after_first: list[float] = []  # server and database CPU seconds once the first answer came

        def post(client: httpx.Client, s: int) -> None:
            r = client.post(base + "/api/v1/ingest/dcgm", content=gz, headers=headers,
                            params={"ts": (t0 + dt.timedelta(seconds=s)).isoformat(), "source": f"bench-{s}"})
            assert r.status_code == 200, r.text[:300]
            assert r.json()["written"]["gpu_sample"] == gpus
            answered.append(time.perf_counter() - start)
            if len(answered) == 1:
                cpu_after_first.extend([_server.cpu_seconds(started[0]), watch.sample() if watch else 0.0])

        def poster(first: int) -> None:
            # Poster k sends scrapes k, k + in_flight, ...: a scrape goes out before the one ahead of it
            # has been answered, as exporters that push on a clock do.
            with httpx.Client(timeout=600) as client:
                for s in range(first, scrapes, in_flight):
                    post(client, s)

        cpu_before = (_server.cpu_seconds(started[0]), watch.sample() if watch else 0.0)
        start = time.perf_counter()
        with ThreadPoolExecutor(in_flight) as pool:
            for f in [pool.submit(poster, k) for k in range(in_flight)]:
                f.result()
        seconds = time.perf_counter() - start
        values = values_per_scrape * scrapes
        # The first scrape also creates the fleet's series and inventory rows; the rest is the steady state
        # of a service that has seen the fleet before (reported apart, never instead). With scrapes in
        # flight together the second answer is not one scrape's work after the first, so none is given.
        answered.sort()
        steady = {"steady_values_per_s": round(values_per_scrape * (scrapes - 1) / (answered[-1] - answered[0]))} if scrapes > 1 and in_flight == 1 else {}
        if scrapes > 1 and in_flight == 1:
            server_cpu = (_server.cpu_seconds(started[0]) - cpu_after_first[0]) / (scrapes - 1)
            db_cpu = (watch.sample() - cpu_after_first[1]) / (scrapes - 1) if watch else 0.0
            steady |= {"steady_server_cpu_s_per_scrape": round(server_cpu, 3), "steady_db_cpu_s_per_scrape": round(db_cpu, 3),
                       "steady_values_per_cpu_s": round(values_per_scrape / (server_cpu + db_cpu)) if server_cpu + db_cpu else None}
        elif in_flight > 1:
            # No steady state to read apart with scrapes overlapping: the CPU of all of them, the first included.
            server_cpu = (_server.cpu_seconds(started[0]) - cpu_before[0]) / scrapes
            db_cpu = (watch.sample() - cpu_before[1]) / scrapes if watch else 0.0
            steady |= {"server_cpu_s_per_scrape": round(server_cpu, 3), "db_cpu_s_per_scrape": round(db_cpu, 3)}
        if peer:
            steady["ratio_to_victoriametrics"] = round(values / seconds / peer["values_per_s"], 2)
            if "steady_values_per_s" in steady and "steady_values_per_s" in peer:
                steady["steady_ratio_to_victoriametrics"] = round(steady["steady_values_per_s"] / peer["steady_values_per_s"], 2)
        print(json.dumps({"bench": "dcgm_api_end_to_end", "system": f"fleetscope-{label}", "db": label, "gpus": gpus, "scrapes": scrapes, "workers": workers, "in_flight": in_flight,
                          "body_mb": round(len(body) / 2**20, 1), "gzip_mb": round(len(gz) / 2**20, 1), "values": values,
                          "seconds": round(seconds, 2), "values_per_s": round(values / seconds), **steady,
                          "first_scrape_s": round(answered[0], 2), "server_peak_rss_mb": _server.peak_rss_mb(started[0]),
                          "target_values_per_s": 1_500_000}), flush=True)
    if watch:
        watch.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gpus", type=int, default=16384)
    ap.add_argument("--scrapes", type=int, default=5)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--in-flight", type=int, default=1, help="scrapes posted concurrently (1: each waits for the previous answer)")
    ap.add_argument("--postgres", default=os.environ.get("FLEETSCOPE_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"))
    ap.add_argument("--no-postgres", action="store_true")
    ap.add_argument("--no-victoria-metrics", action="store_true")
    args = ap.parse_args()
    body = synth_scrape(args.gpus)
    values = dcgm.parse(body, ts=dt.datetime(2026, 6, 1, tzinfo=dt.UTC)).values()
    peer = None if args.no_victoria_metrics else run_victoria_metrics(body, args.gpus, args.scrapes, values)
    run("sqlite", f"sqlite:///{tempfile.mkdtemp(prefix='fleetscope-ingest-db-')}/fs.db", body, args.gpus, args.scrapes, args.workers, values, args.in_flight, peer)
    if not args.no_postgres:
        try:
            with db.scratch_database(args.postgres, "fleetscope_bench") as url:
                run("postgresql", url, body, args.gpus, args.scrapes, args.workers, values, args.in_flight, peer)
        except Exception as exc:  # noqa: BLE001 - a missing server is a skipped measurement
            print(json.dumps({"bench": "dcgm_api_end_to_end", "db": "postgresql", "skipped": str(exc).splitlines()[0]}))


if __name__ == "__main__":
    main()

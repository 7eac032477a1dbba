"""Ingest at fleet shape: an agent per node, each pushing its own small body, many at once.

2,048 hosts x 8 GPUs x 30 DCGM fields (240 values a push), posted over 16 keep-alive connections for 3 rounds
(every host once a round, each round a new scrape time), as dcgm-exporter text to
``POST /api/v1/ingest/dcgm`` and as OTLP protobuf to ``POST /v1/metrics``, against a running
`fleetscope serve` on SQLite and on PostgreSQL; and, where the ``victoria-metrics`` binary is installed,
the same dcgm bodies to VictoriaMetrics' ``/api/v1/import/prometheus`` in the same run. One JSON line per
system and body kind: requests/s, values/s, p50/p99 latency, and the ratio to VictoriaMetrics; beside them
the same for the rounds after the first (``steady_*``, a fleet the service knows) and for the first round
alone (``first_*``, every node new), each with the CPU a push cost the server and PostgreSQL's backends.

The load generator is a small asyncio HTTP/1.1 client over pre-built requests, so that it costs the
2-core machine as little as it can: its CPU is taken from the server under test, for every system alike.

    python benchmarks/ingest_agents.py [--hosts 2048] [--rounds 3] [--connections 16] [--workers N]
                                       [--door-writers N] [--no-postgres] [--no-sqlite] [--only dcgm|otlp]

``--workers``: API processes (``fleetscope serve --workers``); by default the service's own
(``FLEETSCOPE_API_WORKERS``: two on PostgreSQL, one on SQLite), reported as ``workers``;
``--door-writers``: the ingest door's writer threads in each (``FLEETSCOPE_INGEST_WRITERS``, two by default, as
the service's).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import gzip
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path


_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
sys.path.insert(0, str(_HERE.parent))

from sqlalchemy import text  # noqa: E402

from fleetscope import settings  # noqa: E402
from fleetscope.store import db  # noqa: E402

from benchmarks import _server  # noqa: E402

_load = _server.sibling

_dcgm = _load("ingest_dcgm")
_otlp = _load("ingest_otlp")

VALUES_PER_HOST = 8 * 30
T0 = dt.datetime(2026, 6, 1, tzinfo=dt.UTC)


def dcgm_requests(hosts: int, rounds: int, host_header: str, path: str, token: str | None, ts_param: str) -> list[list[bytes]]:
    """Per round, one raw HTTP request per host: its exporter body, stamped with the round's scrape time."""
    bodies = [_dcgm.agent_body(h) for h in range(hosts)]
    out = []
    for r in range(rounds):
        when = T0 + dt.timedelta(seconds=10 * r)
        stamp = when.isoformat().replace("+", "%2B") if ts_param == "ts" else str(int(when.timestamp() * 1000))
        reqs = []
        for h, body in enumerate(bodies):
            target = f"{path}?{ts_param}={stamp}&source=agent-{h}" if ts_param == "ts" else f"{path}?timestamp={stamp}"
            reqs.append(_request(target, host_header, body, "text/plain", token))
        out.append(reqs)
    return out


def otlp_requests(hosts: int, rounds: int, host_header: str, token: str) -> list[list[bytes]]:
    out = []
    for r in range(rounds):
        ts_ns = int((T0 + dt.timedelta(seconds=10 * r)).timestamp()) * 10**9
        out.append([_request("/v1/metrics", host_header, gzip.compress(_otlp.build_request(8, ts_ns, first=8 * h), compresslevel=1),
                             "application/x-protobuf", token, gzip_=True) for h in range(hosts)])
    return out


def _request(target: str, host: str, body: bytes, ctype: str, token: str | None, gzip_: bool = False) -> bytes:
    head = [f"POST {target} HTTP/1.1", f"Host: {host}", f"Content-Type: {ctype}", f"Content-Length: {len(body)}"]
    if token:
        head.append(f"Authorization: Bearer {token}")
    if gzip_:
        head.append("Content-Encoding: gzip")
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


async def _connection(host: str, port: int, work: asyncio.Queue, latencies: list[float], statuses: dict[int, int]) -> None:
    """A keep-alive client taking requests from ``work`` until it is empty. An answer with ``Connection: close``
    is followed by a new connection; a connection the server closes unannounced (a worker restarted) counts its
    request as status 0 and opens a new one, as an agent would."""
    reader, writer = await asyncio.open_connection(host, port)
    try:
        while True:
            try:
                req = work.get_nowait()
            except asyncio.QueueEmpty:
                return
            t = time.perf_counter()
            try:
                writer.write(req)
                await writer.drain()
                status_line = await reader.readline()
                if not status_line:
                    raise ConnectionError("closed by the server")
                length, closing = 0, False
                while (line := await reader.readline()) not in (b"\r\n", b""):
                    name, _, value = line.partition(b":")
                    name = name.strip().lower()
                    if name == b"content-length":
                        length = int(value)
                    elif name == b"connection" and value.strip().lower() == b"close":
                        closing = True
                if length:
                    await reader.readexactly(length)
                if closing:  # the server asked for a new connection for the next request, as HTTP clients honour
                    writer.close()
                    reader, writer = await asyncio.open_connection(host, port)
            except (ConnectionError, asyncio.IncompleteReadError):
                statuses[0] = statuses.get(0, 0) + 1
                writer.close()
                reader, writer = await asyncio.open_connection(host, port)
                continue
            latencies.append(time.perf_counter() - t)
            code = int(status_line.split()[1])
            statuses[code] = statuses.get(code, 0) + 1
    finally:
        writer.close()


async def _drive(base: str, rounds: list[list[bytes]], connections: int, cpu: object = None) -> tuple[float, list[float], dict[int, int], dict]:
    """Seconds, latencies and statuses of all rounds, and the same for the rounds after the first as
    ``{"seconds", "latencies"}``: the first round is the service meeting every node for the first time
    (series, inventory, a template per node), the rest the steady state of a fleet it knows. ``cpu``
    (no arguments: CPU seconds so far of what is measured) is read after the first round and at the end:
    ``{"cpu_s"}`` is what the steady state cost; ``{"first"}`` holds the same for the first round alone."""
    host, port = base.split("//")[1].split(":")
    latencies: list[float] = []
    statuses: dict[int, int] = {}
    cpu_start = cpu() if cpu else {}
    start = time.perf_counter()
    after_first = start
    for i, reqs in enumerate(rounds):
        work: asyncio.Queue = asyncio.Queue()
        for r in reqs:
            work.put_nowait(r)
        await asyncio.gather(*(_connection(host, int(port), work, latencies, statuses) for _ in range(connections)))
        if i == 0:
            after_first, first_n = time.perf_counter(), len(latencies)
            cpu_first = cpu() if cpu else {}
    end = time.perf_counter()
    cpu_end = cpu() if cpu else {}
    return end - start, latencies, statuses, {"seconds": end - after_first, "latencies": latencies[first_n:],
                                              "cpu_s": {k: cpu_end[k] - cpu_first[k] for k in cpu_end},
                                              "first": {"seconds": after_first - start, "latencies": latencies[:first_n],
                                                        "cpu_s": {k: cpu_first[k] - cpu_start[k] for k in cpu_first}}}


def _quantile(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


def _phase(line: dict, name: str, phase: dict) -> None:
    """``name``_requests_per_s, _p50_ms, _p99_ms and the CPU ms a push of each process watched, of one phase of the run."""
    n = len(phase["latencies"])
    line.update({f"{name}_requests_per_s": round(n / phase["seconds"]), f"{name}_p50_ms": round(_quantile(phase["latencies"], 0.5) * 1e3, 1),
                 f"{name}_p99_ms": round(_quantile(phase["latencies"], 0.99) * 1e3, 1)})
    for what, seconds_ in phase.get("cpu_s", {}).items():
        line[f"{name}_{what}_cpu_ms_per_push"] = round(seconds_ * 1e3 / n, 2)


def report(system: str, body: str, hosts: int, seconds: float, latencies: list[float], statuses: dict[int, int], peer: dict | None,
           steady: dict | None = None, **extra: object) -> dict:
    n = len(latencies)
    line = {
        "bench": "ingest_agents", "system": system, "body": body, "hosts": hosts, "requests": n,
        "seconds": round(seconds, 2), "requests_per_s": round(n / seconds), "values_per_s": round(n * VALUES_PER_HOST / seconds),
        "p50_ms": round(_quantile(latencies, 0.5) * 1e3, 1), "p99_ms": round(_quantile(latencies, 0.99) * 1e3, 1),
        "statuses": {str(k): v for k, v in sorted(statuses.items())}, "target_requests_per_s": 1000, "target_p99_ms": 100, **extra,
    }
    if steady and steady["latencies"]:
        # Reported beside the whole run, never instead of it; the CPU a push costs, whatever else loads the machine.
        _phase(line, "steady", steady)
        first = steady.get("first")
        if first and first["latencies"]:
            # the first round alone: every node new to the service
            _phase(line, "first", first)
    if peer:
        line["ratio_to_victoriametrics"] = round(line["requests_per_s"] / peer["requests_per_s"], 2)
        if "steady_requests_per_s" in line and "steady_requests_per_s" in peer:
            line["steady_ratio_to_victoriametrics"] = round(line["steady_requests_per_s"] / peer["steady_requests_per_s"], 2)
    print(json.dumps(line), flush=True)
    return line


@contextlib.contextmanager
def victoria_metrics() -> Iterator[str | None]:
    binary = shutil.which("victoria-metrics")
    if not binary:
        yield None
        return
    port = _server.free_port()
    data = tempfile.mkdtemp(prefix="vm-bench-")
    proc = subprocess.Popen([binary, f"-storageDataPath={data}", f"-httpListenAddr=127.0.0.1:{port}", "-loggerLevel=ERROR"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        _server.wait_healthy(base + "/health")
        yield base
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        shutil.rmtree(data, ignore_errors=True)


def stored_rows(url: str) -> int:
    """gpu_sample rows in the store after the dcgm load: every acknowledged push must be there."""
    with db.make_engine(url).connect() as conn:
        return int(conn.execute(text("SELECT count(*) FROM gpu_sample")).scalar_one())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hosts", type=int, default=2048)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--connections", type=int, default=16)
    ap.add_argument("--workers", type=int, default=None, help="API processes (default: the service's, 2 on PostgreSQL, 1 on SQLite)")
    ap.add_argument("--door-writers", type=int, default=2)
    ap.add_argument("--no-postgres", action="store_true")
    ap.add_argument("--no-sqlite", action="store_true")
    ap.add_argument("--only", choices=("dcgm", "otlp"))
    args = ap.parse_args()

    peer = None
    if args.only != "otlp":
        with victoria_metrics() as vm:
            if vm:
                reqs = dcgm_requests(args.hosts, args.rounds, vm.split("//")[1], "/api/v1/import/prometheus", None, "timestamp")
                seconds, lat, st, steady = asyncio.run(_drive(vm, reqs, args.connections))
                peer = report("victoria-metrics", "dcgm", args.hosts, seconds, lat, st, None, steady)
    if not args.no_sqlite:
        run_db("sqlite", f"sqlite:///{tempfile.mkdtemp(prefix='fleetscope-agents-')}/fleetscope.store.db", args, peer)
    if not args.no_postgres:
        base = os.environ.get("FLEETSCOPE_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
        try:
            with db.scratch_database(base, "fleetscope_bench_agents") as url:
                run_db("postgresql", url, args, peer)
        except Exception as exc:  # noqa: BLE001 - a missing server is a skipped measurement
            print(json.dumps({"bench": "ingest_agents", "system": "fleetscope-postgresql", "skipped": str(exc).splitlines()[0]}))


def run_db(label: str, url: str, args: argparse.Namespace, peer: dict | None) -> None:
    for kind in ("dcgm", "otlp"):
        if args.only and kind != args.only:
            continue
        started: list[int] = []
        with _server.served_api(url, args.workers, env={"FLEETSCOPE_INGEST_WRITERS": str(args.door_writers)}, started=started) as (base, token):
            hh = base.split("//")[1]
            reqs = (dcgm_requests(args.hosts, args.rounds, hh, "/api/v1/ingest/dcgm", token, "ts") if kind == "dcgm"
                    else otlp_requests(args.hosts, args.rounds, hh, token))
            before = stored_rows(url)
            # PostgreSQL's backends of this database (their title names it); a pooled connection closed
            # mid-run keeps the CPU it was last seen with
            watch = _server.CpuWatch(f" {url.rsplit('/', 1)[1]} ") if label == "postgresql" else None

            def cpu() -> dict[str, float]:
                out = {"server": _server.cpu_seconds(started[0])}
                if watch is not None:
                    out["postgres"] = watch.sample()
                return out

            try:
                seconds, lat, st, steady = asyncio.run(_drive(base, reqs, args.connections, cpu))
            finally:
                if watch is not None:
                    watch.close()
            report(f"fleetscope-{label}", kind, args.hosts, seconds, lat, st, peer if kind == "dcgm" else None, steady,
                   workers=args.workers or settings.api_workers(url), door_writers=args.door_writers, gpu_rows_stored=stored_rows(url) - before, gpu_rows_expected=8 * args.hosts * args.rounds)


if __name__ == "__main__":
    main()

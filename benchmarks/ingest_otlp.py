"""OTLP/HTTP end to end: a 16,384-GPU fleet's DCGM scrape, as an OpenTelemetry Collector would forward it,
posted to a running `fleetscope serve` and written to the store. Prints JSON lines.

Each request carries one scrape: 30 DCGM fields × N GPUs data points with dcgm-exporter's labels as
attributes (gpu, UUID, device, modelName, Hostname, pci_bus_id). Measures parse-only rate in process, then
end-to-end values/s through the API on SQLite and PostgreSQL. As in a real fleet, the fault fields (last XID,
ECC and row-remap counters) are zero on all but one GPU in a thousand, which report XID 13 and counts; with
every GPU faulting, each scrape would also write ~65,000 health events.

    python benchmarks/ingest_otlp.py [--gpus 16384] [--scrapes 5] [--workers 1] [--no-postgres]
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import sys
import tempfile
import time

import httpx
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

from fleetscope.core import dcgm_fields

# The repository first: benchmarks/ingest.py would otherwise shadow the `ingest` package.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(_HERE))
sys.path.append(_HERE)
from _server import served_api  # noqa: E402

from fleetscope.store import db  # noqa: E402
from ingest import otlp  # noqa: E402

FIELDS = list(dict.fromkeys(dcgm_fields.DCGM_FIELDS))[:30]
FAULT_FIELDS = {"DCGM_FI_DEV_XID_ERRORS", *(name for *_, name in dcgm_fields.DCGM_HEALTH_COUNTERS)}


def value(field: str, f: int, i: int) -> float:
    if field in FAULT_FIELDS:
        return 13.0 if i % 1000 == 0 else 0.0
    return float((i * 7 + f * 13) % 97)


def build_request(gpus: int, ts_ns: int, first: int = 0) -> bytes:
    """One OTLP request of ``gpus`` GPUs' DCGM fields, numbered from ``first`` (8 to a host)."""
    req = ExportMetricsServiceRequest()
    rm = req.resource_metrics.add()
    rm.resource.attributes.append(KeyValue(key="service.name", value=AnyValue(string_value="dcgm-exporter")))
    sm = rm.scope_metrics.add()
    labels = []
    for i in range(first, first + gpus):
        host = f"gpu-node-{i // 8:05d}"
        labels.append([
            KeyValue(key="gpu", value=AnyValue(string_value=str(i % 8))),
            KeyValue(key="UUID", value=AnyValue(string_value=f"GPU-{i:08x}-69c4-b61d-e0bc-{i:012x}")),
            KeyValue(key="pci_bus_id", value=AnyValue(string_value=f"00000000:{0x18 + 0x11 * (i % 8):02X}:00.0")),
            KeyValue(key="device", value=AnyValue(string_value=f"nvidia{i % 8}")),
            KeyValue(key="modelName", value=AnyValue(string_value="NVIDIA H100 80GB HBM3")),
            KeyValue(key="Hostname", value=AnyValue(string_value=host)),
        ])
    for f, name in enumerate(FIELDS):
        m = sm.metrics.add()
        m.name = name
        for k, i in enumerate(range(first, first + gpus)):
            dp = m.gauge.data_points.add()
            dp.time_unix_nano = ts_ns
            dp.as_double = value(name, f, i)
            dp.attributes.extend(labels[k])
    return req.SerializeToString()


def run(label: str, url: str, gpus: int, scrapes: int, workers: int) -> None:
    with served_api(url, workers) as (base, token):
        # Scrape times just behind the server's clock: its future-skew check refuses readings from ahead.
        first_s = int(time.time()) - 600
        bodies = [gzip.compress(build_request(gpus, (first_s + 10 * s) * 10**9), compresslevel=1) for s in range(scrapes)]
        headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/x-protobuf", "Content-Encoding": "gzip"}
        values = gpus * len(FIELDS) * scrapes
        with httpx.Client(timeout=300) as client:
            t = time.perf_counter()
            for body in bodies:
                r = client.post(base + "/v1/metrics", content=body, headers=headers)
                assert r.status_code == 200, r.text[:300]
            seconds = time.perf_counter() - t
        print(json.dumps({"bench": "otlp_end_to_end", "db": label, "gpus": gpus, "scrapes": scrapes, "workers": workers, "values": values,
                          "gzip_mb_per_scrape": round(len(bodies[0]) / 2**20, 1), "seconds": round(seconds, 2),
                          "values_per_s": round(values / seconds), "target_values_per_s": 500_000}), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gpus", type=int, default=16384)
    ap.add_argument("--scrapes", type=int, default=5)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--postgres", default=os.environ.get("FLEETSCOPE_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"))
    ap.add_argument("--no-postgres", action="store_true")
    args = ap.parse_args()

    body = build_request(args.gpus, 1_800_000_000 * 10**9)
    t = time.perf_counter()
    batch = otlp.parse(body, encoding="protobuf")
    seconds = time.perf_counter() - t
    values = args.gpus * len(FIELDS)
    assert batch.gpu_sample.height == args.gpus
    print(json.dumps({"bench": "otlp_parse", "gpus": args.gpus, "values": values, "mb": round(len(body) / 2**20, 1), "seconds": round(seconds, 3),
                      "values_per_s": round(values / seconds)}), flush=True)
    run("sqlite", f"sqlite:///{tempfile.mkdtemp(prefix='fleetscope-otlp-db-')}/fs.db", args.gpus, args.scrapes, args.workers)
    if not args.no_postgres:
        try:
            with db.scratch_database(args.postgres, "fleetscope_bench") as url:
                run("postgresql", url, args.gpus, args.scrapes, args.workers)
        except Exception as exc:  # noqa: BLE001 - a missing server is a skipped measurement
            print(json.dumps({"bench": "otlp_end_to_end", "db": "postgresql", "skipped": str(exc).splitlines()[0]}))


if __name__ == "__main__":
    main()

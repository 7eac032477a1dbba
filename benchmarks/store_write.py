"""Store throughput: metric values written per second into gpu_sample, and read back per second.

A metric value is one field of one GPU sample. The write target (issue 2) is 500,000 values/s sustained,
i.e. a 16,384-GPU fleet sampled every second with 30 fields; the read target is 2,000,000 values/s for
one hour of one job's GPUs into a polars frame. Prints one JSON line per measurement.

    python benchmarks/store_write.py [--gpus 16384] [--scrapes 10] [--postgres URL] [--no-sqlite] [--fresh-partition]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import resource
import sys
import tempfile
import time

import numpy as np
import polars as pl
from sqlalchemy import text

from fleetscope.store import db
from fleetscope.core import frames as F
from fleetscope.store import Store
from _server import migrated_store

# 30 fields a default-plus-DCP dcgm-exporter scrape fills in.
FIELDS = [c.name for c in F.GPU_FIELDS][:30]
T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def scrape(uuids: pl.Series, ts: dt.datetime, rng: np.random.Generator) -> pl.DataFrame:
    n = len(uuids)
    cols: dict[str, object] = {"ts": pl.repeat(ts, n, eager=True, dtype=F.UTC_US), "gpu_uuid": uuids}
    for name in FIELDS:
        dtype = F.GPU_SAMPLE.schema[name]
        if dtype == pl.Int64:
            cols[name] = pl.Series(name, rng.integers(0, 80 * 2**30, n), dtype=pl.Int64)
        else:
            cols[name] = pl.Series(name, rng.random(n) * 700.0)
    return pl.DataFrame(cols)


def bench_write(store: Store, label: str, gpus: int, scrapes: int) -> None:
    rng = np.random.default_rng(1)
    uuids = pl.Series("gpu_uuid", [f"GPU-{i:08x}-0000-0000-0000-{i:012x}" for i in range(gpus)])
    frames = [scrape(uuids, T0 + dt.timedelta(seconds=s), rng) for s in range(scrapes)]
    values = 0
    t = time.perf_counter()
    for df in frames:
        values += store.write(F.Batch(source="bench", gpu_sample=df)).values
    seconds = time.perf_counter() - t
    print(json.dumps({"bench": "store_write", "db": label, "gpus": gpus, "scrapes": scrapes, "fields": len(FIELDS),
                      "values": values, "seconds": round(seconds, 3), "values_per_s": round(values / seconds),
                      "target_values_per_s": 500_000}), flush=True)
    # Idempotence costs something too: the same scrape re-sent writes nothing.
    t = time.perf_counter()
    res = store.write(F.Batch(source="bench", gpu_sample=frames[-1]))
    seconds = time.perf_counter() - t
    print(json.dumps({"bench": "store_rewrite_duplicate", "db": label, "rows_written": sum(res.written.values()),
                      "values": res.values, "seconds": round(seconds, 3), "values_per_s": round(res.values / seconds)}), flush=True)


def bench_read(store: Store, label: str, job_gpus: int, other_gpus: int, interval_s: int, fresh: bool = False) -> None:
    """One hour of one job: its GPUs sampled every ``interval_s`` beside other jobs' GPUs; with ``fresh``, read before
    the day partition is analyzed."""
    rng = np.random.default_rng(2)
    all_uuids = pl.Series("gpu_uuid", [f"GPU-read-{i:06d}" for i in range(job_gpus + other_gpus)])
    job_uuids = all_uuids[:job_gpus]
    start = T0 + dt.timedelta(days=1)
    store.write(F.Batch(source="bench", job_rank=pl.DataFrame({
        "job_id": ["bench-job"] * job_gpus, "rank": list(range(job_gpus)), "start": [start] * job_gpus,
        "gpu_uuid": job_uuids, "host": [f"node-{i // 8}" for i in range(job_gpus)]})))
    steps = 3600 // interval_s
    chunk = max(1, 200_000 // len(all_uuids))
    for s0 in range(0, steps, chunk):
        parts = [scrape(all_uuids, start + dt.timedelta(seconds=s * interval_s), rng) for s in range(s0, min(steps, s0 + chunk))]
        store.write(F.Batch(source="bench", gpu_sample=pl.concat(parts)))
    if store.dialect == "postgresql" and not fresh:
        # A running service's autovacuum analyzes a day partition within a minute of its first rows and again as it
        # grows by a tenth; read the moment after the write, the planner would have no statistics for the hour
        # just written and guess it at a few rows (``--fresh-partition`` reads it so: the ranks are joined in polars,
        # so no plan can join them by nested loops: 1.0-1.3 s that way here, 0.76-0.90 s joined in polars).
        with store.engine.begin() as conn:
            conn.execute(text("ANALYZE gpu_sample"))
    # A running service has its SQLite reader processes up (fleetscope.store.sqlite_reader); the first read of
    # a fresh process also starts them, and is reported separately.
    for bench in ("store_read_job_hour_first", "store_read_job_hour"):
        t = time.perf_counter()
        df = store.read("gpu_sample", job_id="bench-job", start=start, end=start + dt.timedelta(hours=1))
        seconds = time.perf_counter() - t
        values = df.height * len(FIELDS)
        assert df.height == job_gpus * steps, (df.height, job_gpus * steps)
        print(json.dumps({"bench": bench, "db": label, "job_gpus": job_gpus, "rows": df.height,
                          "values": values, "seconds": round(seconds, 3), "values_per_s": round(values / seconds),
                          "fresh_partition": fresh, "target_values_per_s": 2_000_000}), flush=True)


def measure(label: str, url: str, args: argparse.Namespace) -> None:
    with migrated_store(url) as store:
        bench_write(store, label, args.gpus, args.scrapes)
        bench_read(store, label, args.job_gpus, args.other_gpus, args.interval_s, args.fresh_partition)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gpus", type=int, default=16384)
    ap.add_argument("--scrapes", type=int, default=10)
    ap.add_argument("--job-gpus", type=int, default=256)
    ap.add_argument("--other-gpus", type=int, default=256)
    ap.add_argument("--interval-s", type=int, default=5)
    ap.add_argument("--postgres", default=os.environ.get("FLEETSCOPE_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"))
    ap.add_argument("--no-sqlite", action="store_true")
    ap.add_argument("--no-postgres", action="store_true")
    ap.add_argument("--fresh-partition", action="store_true",
                    help="read the job's hour before its day partition is analyzed (the first minute of a day)")
    args = ap.parse_args()
    if not args.no_sqlite:
        tmp = tempfile.mkdtemp(prefix="fleetscope-bench-")
        measure("sqlite", f"sqlite:///{tmp}/bench.db", args)
    if not args.no_postgres:
        try:
            with db.scratch_database(args.postgres, "fleetscope_bench") as url:
                measure("postgresql", url, args)
        except Exception as exc:  # noqa: BLE001 - a missing server is a skipped measurement, not a crash
            print(json.dumps({"bench": "store", "db": "postgresql", "skipped": str(exc).splitlines()[0]}), flush=True)
    print(json.dumps({"bench": "peak_rss", "mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)}), file=sys.stderr)


if __name__ == "__main__":
    main()

"""A site's location- and market-based Scope 2 read from the stored per-minute roll-ups (issue 6: "a job's or
a site's energy and carbon for any period from the roll-ups in under 1 s"), through the database, as the
API (GET /api/v1/sites/{site}/carbon) and the dashboard do.

The store holds one hour of per-minute roll-ups of a --gpus fleet on two sites (8 GPUs a host), hourly grid
intensity for each site and two contractual instruments on site-a. Prints one JSON line per query: a
30-minute and a 1-hour window of one site (``fleetscope.services.energy.site_carbon``) and of every site
(``fleetscope.services.queries.site_carbon``), best of three, with the figures so a run can be checked.

Jobs, through ``fleetscope.services.energy.job_report`` (what GET /api/v1/jobs/{id}/energy serves): a 1,024-GPU
job over the hour, rolled up as the beat does it, and a 1,024-GPU job that has run for --job-days, whose
earlier minutes are in ``job_energy_minute`` only (per-GPU minutes of that long are not generated here:
1,024 GPUs × 30 days would be 44 M rows, and the job read never touches them).

    python benchmarks/scope2.py [--gpus 16384] [--job-days 30] [--postgres URL] [--no-sqlite] [--no-postgres]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import polars as pl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fleetscope.store import db  # noqa: E402
from fleetscope.services import energy as es  # noqa: E402
from fleetscope.services import energy_rollup  # noqa: E402
from fleetscope.core import frames as F  # noqa: E402
from fleetscope.services import energy_reads as energy_reads
from fleetscope.store import Store  # noqa: E402
from _server import migrated_store  # noqa: E402

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
H = dt.timedelta(hours=1)


JOB_GPUS = 1024


def fill(store: Store, gpus: int, job_days: int) -> None:
    uuids = [f"GPU-{i:08x}-0000-0000-0000-{i:012x}" for i in range(gpus)]
    hosts = [f"node-{i // 8:05d}" for i in range(gpus)]
    host_ids = sorted(set(hosts))
    store.write(F.Batch(
        site=pl.DataFrame({"site_id": ["site-a", "site-b"], "country": ["FRA", "USA"], "grid_region": [None, "US-CA"], "declared_pue": [1.2, None]}),
        host=pl.DataFrame({"host": host_ids, "site_id": ["site-a" if i < len(host_ids) // 2 else "site-b" for i in range(len(host_ids))]}),
        gpu=pl.DataFrame({"gpu_uuid": uuids, "host": hosts}),
        metric_sample=pl.DataFrame({"ts": [T0, T0], "series": [f'grid_intensity_g_per_kwh{{site="{s}"}}' for s in ("site-a", "site-b")],
                                    "value": [50.0, 250.0]}),
    ))
    n = min(JOB_GPUS, gpus // 2)
    long_start = T0 - dt.timedelta(days=job_days)
    store.write(F.Batch(job_rank=pl.DataFrame({
        "job_id": ["job-hour"] * n + ["job-long"] * n, "rank": list(range(n)) * 2,
        "start": [T0] * n + [long_start] * n, "end": [None] * (2 * n), "gpu_uuid": uuids[:n] + uuids[n:2 * n]})))
    gpu, host = store.read("gpu", columns=["gpu_uuid", "host"]), store.read("host", columns=["host", "site_id"])
    ranks = store.read("job_rank")
    for m in range(60):  # a minute per batch, with its per-site and per-job rows, as energy_service.rollup_window writes them
        minutes = pl.DataFrame({
            "minute": pl.repeat(T0 + dt.timedelta(minutes=m), gpus, eager=True, dtype=F.UTC_US), "gpu_uuid": uuids,
            "energy_j": [42_000.0] * gpus, "counter_energy_j": [42_000.0] * gpus, "integrated_energy_j": [0.0] * gpus,
            "covered_s": [60.0] * gpus, "method": ["counter"] * gpus})
        store.write_frames(energy_rollup.rollup_frames(minutes, ranks, gpu, host), source="bench")
    # the long job's and its site's earlier minutes, as the roll-ups of those days left them
    earlier = pl.datetime_range(long_start, T0, "1m", closed="left", time_unit="us", eager=True).dt.replace_time_zone("UTC")
    for chunk in earlier.to_frame("minute").iter_slices(100_000):
        store.write_frames([(F.JOB_ENERGY_MINUTE, chunk.with_columns(
            pl.lit("job-long").alias("job_id"), pl.lit("site-b").alias("site_id"), pl.lit(42_000.0 * n).alias("energy_j"),
            pl.lit(60.0 * n).alias("covered_s"), pl.lit(60.0 * n).alias("allocated_s"), pl.lit(n, pl.Int64).alias("gpus"))),
            (F.SITE_ENERGY_MINUTE, chunk.with_columns(pl.lit("site-b").alias("site_id"), pl.lit(42_000.0 * (gpus // 2)).alias("energy_j"),
                                                      pl.lit(gpus // 2, pl.Int64).alias("gpus")))], source="bench")
    for iid, kind, mwh, g in (("ppa-1", "ppa", 50.0, 0.0), ("go-1", "go", 20.0, 0.0)):
        es.record_instrument(store, {"instrument_id": iid, "site_id": "site-a", "kind": kind, "start": T0, "end": T0 + 24 * H,
                                     "volume_mwh": mwh, "g_per_kwh": g}, recorded_by="bench")


def best_of(fn, n: int = 3) -> tuple[float, object]:  # type: ignore[no-untyped-def]
    best, out = float("inf"), None
    for _ in range(n):
        t = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t)
    return best, out


def measure(label: str, url: str, gpus: int, job_days: int) -> None:
    with migrated_store(url) as store:
        t = time.perf_counter()
        fill(store, gpus, job_days)
        print(json.dumps({"bench": "scope2_fill", "db": label, "gpus": gpus, "rollup_rows": gpus * 60, "seconds": round(time.perf_counter() - t, 2)}), flush=True)
        for minutes in (30, 60):
            start, end = T0 + dt.timedelta(minutes=60 - minutes), T0 + H
            s, one = best_of(lambda: es.site_carbon(store, "site-a", start, end))
            print(json.dumps({"bench": "scope2_site", "db": label, "window_min": minutes, "gpus": gpus // 2, "seconds": round(s, 3), "target": "< 1 s",
                              "energy_kwh": round(one["energy_kwh"], 3), "location_kgco2e": round(one["location_based_kgco2e"], 3),
                              "market_kgco2e": round(one["market_based_kgco2e"], 3)}), flush=True)
            s, every = best_of(lambda: energy_reads.site_carbon(store, start, end))
            print(json.dumps({"bench": "scope2_all_sites", "db": label, "window_min": minutes, "gpus": gpus, "seconds": round(s, 3), "target": "< 1 s",
                              "sites": every.height, "market_kgco2e": round(float(every["market_kgco2e"].sum()), 3)}), flush=True)
        for job_id, days in (("job-hour", 1 / 24), ("job-long", job_days + 1 / 24)):
            s, rep = best_of(lambda: es.job_report(store, job_id))
            print(json.dumps({"bench": "job_energy", "db": label, "job_id": job_id, "gpus": min(JOB_GPUS, gpus // 2), "period_days": round(days, 3),
                              "seconds": round(s, 3), "target": "< 1 s", "gpu_energy_kwh": round(rep["gpu_energy_kwh"], 3),
                              "location_kgco2e": round(rep["location_based_kgco2e"], 3), "market_kgco2e": round(rep["market_based_kgco2e"], 3)}), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gpus", type=int, default=16384)
    ap.add_argument("--job-days", type=int, default=30, help="how long the long job has run before the hour")
    ap.add_argument("--postgres", default=os.environ.get("FLEETSCOPE_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"))
    ap.add_argument("--no-sqlite", action="store_true")
    ap.add_argument("--no-postgres", action="store_true")
    args = ap.parse_args()
    if not args.no_sqlite:
        measure("sqlite", f"sqlite:///{tempfile.mkdtemp(prefix='fleetscope-bench-')}/bench.db", args.gpus, args.job_days)
    if not args.no_postgres:
        try:
            with db.scratch_database(args.postgres, "fleetscope_bench") as url:
                measure("postgresql", url, args.gpus, args.job_days)
        except Exception as exc:  # noqa: BLE001 - a missing server is a skipped measurement, not a crash
            print(json.dumps({"bench": "scope2", "db": "postgresql", "skipped": str(exc).splitlines()[0]}), flush=True)


if __name__ == "__main__":
    main()

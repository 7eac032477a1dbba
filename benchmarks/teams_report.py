"""A month of a 16,384-GPU fleet's scheduler accounting reported per team (issue 20: "a month of a 16,384-GPU
fleet's accounting (hundreds of thousands of jobs) reported per team in under 10 s").

The store holds November 2026 of a Slurm cluster: 2,048 nodes of 8 GPUs on two sites, four partitions, 60
accounts under 12 organizations mapped to teams (by account and by organization), --jobs jobs (default
300,000: two thirds 1-4 GPUs on part of a node, then whole nodes and multi-node jobs of up to 64 nodes) with
their node rows (device indices for part-node jobs), a price book (a GPU-hour price per site and model and a
tariff), and GPU telemetry at a coarse grain: one sample per GPU every --sample-h hours (util_ratio,
power_w). The fleet is filled to about 70 % of its GPU-hours.

Timed, best of --repeat: ``fleetscope.services.team_costs.usage`` over the month — what GET /api/v1/teams/usage,
``fleetscope teams usage --month`` and beat's showback read — and the month's showback report
(``showback``: usage, CO2e, top jobs). Prints one JSON line per database and read with the seconds, the
process CPU seconds of the read, and the machine's load average (``os.getloadavg``) before it.

    python benchmarks/teams_report.py [--jobs 300000] [--sample-h 6] [--postgres URL] [--no-sqlite] [--no-postgres] [--sqlite-file PATH]
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

import numpy as np
import polars as pl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fleetscope.core import frames as F  # noqa: E402
from fleetscope.core import scheduler_frames as SCH  # noqa: E402
from fleetscope.core.spec import conform  # noqa: E402
from fleetscope.services import serving, team_costs, teams  # noqa: E402
from fleetscope.store import Store, db  # noqa: E402
from _server import migrated_store  # noqa: E402

MONTH = "2026-11"
START, END = dt.datetime(2026, 11, 1, tzinfo=dt.UTC), dt.datetime(2026, 12, 1, tzinfo=dt.UTC)
NODES, PER_NODE = 2048, 8
PARTITIONS = [("train", 0, 1024), ("research", 1024, 1536), ("inference", 1536, 1792), ("debug", 1792, 2048)]
US = pl.Datetime("us", "UTC")
FILL = 0.7


def host(i: int) -> str:
    return f"gpu{i:04d}"


def jobs(n: int, seed: int = 7) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(sched_job, sched_job_node) for ``n`` jobs over the month."""
    rng = np.random.default_rng(seed)
    kind = rng.choice(4, n, p=[0.66, 0.2, 0.12, 0.02])  # part of a node, one node, 2-8 nodes, 16-64 nodes
    part_gpus = rng.choice([1, 2, 4], n)
    nodes = np.where(kind == 0, 1, np.where(kind == 1, 1, np.where(kind == 2, rng.integers(2, 9, n), rng.integers(16, 65, n))))
    gpus = np.where(kind == 0, part_gpus, nodes * PER_NODE)
    # durations: hours, log-normal, longer for bigger jobs; the fleet ends up about 70 % allocated
    dur_s = np.minimum(rng.lognormal(np.log(3600 * np.where(kind == 0, 2.0, np.where(kind == 1, 6.0, 10.0))), 1.0, n), 7 * 86400).astype(np.int64)
    month_s = int((END - START).total_seconds())
    start_s = rng.integers(-3 * 86400, month_s, n)
    # scaled so the month's allocated GPU-hours come to FILL of the fleet's, whatever the job count
    for _ in range(3):
        held = (np.clip(start_s + dur_s, 0, month_s) - np.clip(start_s, 0, month_s)) * gpus
        dur_s = np.maximum((dur_s * FILL * NODES * PER_NODE * month_s / held.sum()).astype(np.int64), 60)
    wait_s = rng.exponential(1800, n).astype(np.int64)
    p = rng.choice(len(PARTITIONS), n, p=[0.55, 0.25, 0.12, 0.08])
    lo = np.array([PARTITIONS[i][1] for i in p])
    width = np.array([PARTITIONS[i][2] - PARTITIONS[i][1] for i in p])
    first = lo + rng.integers(0, 1 << 30, n) % np.maximum(width - nodes + 1, 1)
    acct = rng.integers(0, 60, n)
    state = rng.choice(["COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED"], n, p=[0.8, 0.08, 0.06, 0.03, 0.01, 0.02])
    running = start_s + dur_s > month_s
    t0 = np.datetime64(START.replace(tzinfo=None), "us")
    start_at = t0 + start_s.astype("timedelta64[s]")
    idx = [",".join(str(g) for g in range(k)) for k in (1, 2, 4)]
    j = pl.DataFrame({
        "cluster": "c1", "job_id": [str(i) for i in range(n)], "scheduler": "slurm", "user": [f"u{a * 7 % 400}" for a in acct.tolist()],
        "account": [f"acct{a:02d}" for a in acct.tolist()], "partition": [PARTITIONS[i][0] for i in p.tolist()],
        "state": np.where(running, "RUNNING", state), "submit_at": start_at - wait_s.astype("timedelta64[s]"), "eligible_at": start_at - wait_s.astype("timedelta64[s]"),
        "start_at": start_at, "end_at": np.where(running, np.datetime64("NaT"), start_at + dur_s.astype("timedelta64[s]")),
        "gpus": gpus, "gpu_types": [f"{'h100' if f < 1536 else 'a100'}:{g}" for f, g in zip(first.tolist(), gpus.tolist())],
        "node_count": nodes, "nodes": [f"gpu[{f:04d}-{f + k - 1:04d}]" if k > 1 else host(f) for f, k in zip(first.tolist(), nodes.tolist())],
        "cpus": gpus * 16, "source": "bench"}).with_columns(pl.col("start_at", "end_at", "submit_at", "eligible_at").cast(US))
    jn = pl.DataFrame({"job_id": j["job_id"], "first": first, "k": nodes, "g": np.minimum(gpus, PER_NODE), "part": kind == 0,
                       "pg": part_gpus}).with_columns(pl.int_ranges(0, "k").alias("o")).explode("o")
    jn = jn.select(pl.lit("c1").alias("cluster"), "job_id", pl.format("gpu{}", (pl.col("first") + pl.col("o")).cast(pl.String).str.zfill(4)).alias("host"),
                   pl.col("g").alias("gpus"), pl.when(pl.col("part")).then(pl.col("pg").replace_strict({1: idx[0], 2: idx[1], 4: idx[2]}, return_dtype=pl.String))
                   .alias("gpu_indices"), pl.lit("bench").alias("source"))
    return conform(SCH.SCHED_JOB, j), conform(SCH.SCHED_JOB_NODE, jn)


def samples(sample_h: float, seed: int = 3) -> pl.DataFrame:
    rng = np.random.default_rng(seed)
    ts = pl.datetime_range(START, END, dt.timedelta(hours=sample_h), closed="left", eager=True, time_zone="UTC")
    uu = [f"GPU-{i:06d}" for i in range(NODES * PER_NODE)]
    n = len(ts) * len(uu)
    return pl.DataFrame({"ts": np.repeat(ts.to_numpy(), len(uu)), "gpu_uuid": uu * len(ts), "util_ratio": rng.beta(2, 1.2, n),
                         "power_w": rng.uniform(90, 700, n)}).with_columns(pl.col("ts").cast(US))


def fill(store: Store, n_jobs: int, sample_h: float) -> dict[str, float]:
    t = time.perf_counter()
    hosts = [host(i) for i in range(NODES)]
    store.write(F.Batch(
        site=F.conform(F.SITE, pl.DataFrame({"site_id": ["east", "west"], "country": ["DEU", "FRA"]})),
        host=F.conform(F.HOST, pl.DataFrame({"host": hosts, "site_id": ["east" if i < 1024 else "west" for i in range(NODES)]})),
        gpu=F.conform(F.GPU, pl.DataFrame({"gpu_uuid": [f"GPU-{i:06d}" for i in range(NODES * PER_NODE)], "host": [host(i // PER_NODE) for i in range(NODES * PER_NODE)],
                                           "gpu_index": [i % PER_NODE for i in range(NODES * PER_NODE)],
                                           "model_name": ["h100" if i // PER_NODE < 1536 else "a100" for i in range(NODES * PER_NODE)]}))))
    for site, model, price in (("east", "h100", 2.9), ("west", "h100", 3.1), ("west", "a100", 1.6)):
        serving.record_price(store, {"site_id": site, "gpu_model": model, "valid_from": dt.datetime(2026, 1, 1, tzinfo=dt.UTC), "currency": "EUR",
                                     "gpu_hour_price": price}, recorded_by="bench")
    for site in ("east", "west"):
        serving.record_price(store, {"site_id": site, "gpu_model": "", "valid_from": dt.datetime(2026, 1, 1, tzinfo=dt.UTC), "currency": "EUR",
                                     "energy_price_per_kwh": 0.21}, recorded_by="bench")
    store.write(F.Batch(sched_account=conform(SCH.SCHED_ACCOUNT, pl.DataFrame({"cluster": "c1", "account": [f"acct{a:02d}" for a in range(60)],
                                                                                 "organization": [f"org{a % 12}" for a in range(60)]}))))
    for a in range(0, 60, 5):  # a few accounts mapped directly; the rest by their organization
        teams.set_mapping(store, kind="slurm_account", match=f"acct{a:02d}", team=f"team-{a % 7}", recorded_by="bench")
    for o in range(12):
        teams.set_mapping(store, kind="slurm_organization", match=f"org{o}", team=f"team-{o % 9}", recorded_by="bench")
    j, jn = jobs(n_jobs)
    for lo in range(0, j.height, 50_000):
        store.write_frames([(SCH.SCHED_JOB, j.slice(lo, 50_000))], source="bench:sched_job")
    for lo in range(0, jn.height, 100_000):
        store.write_frames([(SCH.SCHED_JOB_NODE, jn.slice(lo, 100_000))], source="bench:sched_job_node")
    s = samples(sample_h)
    for lo in range(0, s.height, 250_000):
        store.write(F.Batch(source="bench:gpu_sample", gpu_sample=F.conform(F.GPU_SAMPLE, s.slice(lo, 250_000))))
    return {"jobs": j.height, "job_nodes": jn.height, "gpu_samples": s.height, "fill_s": round(time.perf_counter() - t, 1)}


def timed(fn, repeat: int):  # type: ignore[no-untyped-def]
    best, cpu, out = float("inf"), 0.0, None
    for _ in range(repeat):
        load = os.getloadavg()
        c0, t0 = time.process_time(), time.perf_counter()
        out = fn()
        t, c = time.perf_counter() - t0, time.process_time() - c0
        if t < best:
            best, cpu, best_load = t, c, load
    return best, cpu, best_load, out


def run(name: str, url: str, args: argparse.Namespace, *, filled: bool = False) -> None:
    with migrated_store(url) as store:
        meta = {"jobs": store.query("SELECT COUNT(*) AS n FROM sched_job", [], {"n": pl.Int64})["n"][0]} if filled else fill(store, args.jobs, args.sample_h)
        t, cpu, load, df = timed(lambda: team_costs.usage(store, start=START, end=END, now=END), args.repeat)
        gh = float(df["gpu_hours"].sum())
        print(json.dumps({"bench": "teams_usage_month", "db": name, **meta, "gpus": NODES * PER_NODE, "teams": df.height, "seconds": round(t, 2),
                          "cpu_s": round(cpu, 2), "loadavg": [round(x, 2) for x in load], "gpu_hours": round(gh),
                          "allocated_share": round(gh / (NODES * PER_NODE * (END - START).total_seconds() / 3600), 3),
                          "cost": round(float(df["cost"].sum())), "kgco2e_location": round(float(df["location_kgco2e"].sum()))}), flush=True)
        t, cpu, load, rep = timed(lambda: team_costs.showback(store, MONTH, now=END + dt.timedelta(hours=2)), args.repeat)
        print(json.dumps({"bench": "teams_showback_month", "db": name, "jobs": rep["jobs"], "seconds": round(t, 2), "cpu_s": round(cpu, 2),
                          "loadavg": [round(x, 2) for x in load]}), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--jobs", type=int, default=300_000)
    ap.add_argument("--sample-h", type=float, default=6.0)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--postgres", default=os.environ.get("FLEETSCOPE_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"))
    ap.add_argument("--no-sqlite", action="store_true")
    ap.add_argument("--sqlite-file", default=None, help="fill this SQLite file (or reuse it, already filled) instead of a temporary one")
    ap.add_argument("--no-postgres", action="store_true")
    args = ap.parse_args()
    if args.sqlite_file:  # keep (or reuse) the filled database, to time the reads again
        path = Path(args.sqlite_file)
        run("sqlite", f"sqlite:///{path}", args, filled=path.exists())
    elif not args.no_sqlite:
        with tempfile.TemporaryDirectory() as d:
            run("sqlite", f"sqlite:///{d}/bench.db", args)
    if not args.no_postgres:
        try:
            with db.scratch_database(args.postgres, "fleetscope_bench_teams") as url:
                run("postgresql", url, args)
        except Exception as exc:  # noqa: BLE001 (a missing server skips the run, said so)
            print(json.dumps({"bench": "teams_usage_month", "db": "postgresql", "skipped": str(exc).splitlines()[0]}))


if __name__ == "__main__":
    main()

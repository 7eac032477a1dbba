"""Energy roll-up throughput and roll-up query latency (issue 6 targets).

Usage: python benchmarks/energy.py [--gpus 16384] [--seconds 3600] [--chunk-s 60] [--jobs 64]

Prints JSON lines:
- {"bench": "energy_rollup", ...}: one hour of 1 Hz samples (power_w + energy_j counter) of a --gpus fleet,
  generated chunk by chunk (never all in memory) and turned into per-minute per-GPU roll-ups with
  analyzers.energy.energy_rollup. ``rollup_s`` is the time inside energy_rollup, ``generate_s`` the time
  spent making the synthetic samples; ``peak_rss_mib`` is the process's peak resident memory (everything
  included). 16 GPUs get a counter reset at minute 30, so the power fallback path runs too. ``energy_rel_err``
  compares the roll-up total with the exact energy the generator put in.
  Target: rollup under 60 s, peak memory under 4 GiB (2-core machine).
- {"bench": "energy_query", ...}: a job's and a site's energy and location-based carbon for a 30-minute
  period from the in-memory roll-ups (job_rank attribution, grid table lookup). Target: under 1 s each.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import resource
import sys
import time
from pathlib import Path

import numpy as np
import polars as pl

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from analyzers import carbon as C  # noqa: E402
from analyzers import energy as E  # noqa: E402

T0 = dt.datetime(2025, 1, 1, tzinfo=dt.timezone.utc)
IDLE_W, TDP_W = 70.0, 700.0


class Fleet:
    """Deterministic 1 Hz telemetry: power is a function of (gpu, second); the counter is its running sum
    (rectangle rule, as the simulator does), with an optional reset for a few GPUs."""

    def __init__(self, n: int, reset_at_s: int, n_reset: int = 16, seed: int = 1):
        rng = np.random.default_rng(seed)
        self.n = n
        self.uuid = pl.Series("gpu_uuid", [f"GPU-{i:08x}-0000-0000-0000-{i:012x}" for i in range(n)])
        self.base = np.where(rng.random(n) > 0.25, 0.85, 0.02)
        self.omega = rng.uniform(0.01, 0.2, n)
        self.phase = rng.uniform(0, 6.3, n)
        self.e0 = rng.uniform(1e8, 2e8, n)
        self.reset = np.zeros(n, dtype=bool)
        self.reset[rng.choice(n, n_reset, replace=False)] = True
        self.reset_at_s = reset_at_s
        self.counter_before = self.e0.copy()  # counter at the second before the next chunk's first
        self.next_first_s: int | None = None

    def power(self, secs: np.ndarray) -> np.ndarray:
        u = np.clip(self.base[None, :] + 0.08 * np.sin(secs[:, None] * self.omega[None, :] + self.phase[None, :]), 0, 1)
        return IDLE_W + (TDP_W - IDLE_W) * u

    def chunk(self, first_s: int, last_s: int) -> pl.DataFrame:
        """Samples for seconds first_s..last_s inclusive; consecutive chunks may overlap (first_s of the next
        chunk <= last_s of this one), and the overlapping samples are identical."""
        secs = np.arange(first_s, last_s + 1)
        p = self.power(secs)
        counter = self.counter_before[None, :] + np.cumsum(p, axis=0)
        reported = counter - np.where((secs[:, None] >= self.reset_at_s) & self.reset[None, :], self.e0[None, :], 0.0)
        self._pending = (secs, counter)
        t = (np.datetime64(T0.replace(tzinfo=None), "us") + secs.astype("timedelta64[s]")).astype("datetime64[us]")
        return pl.DataFrame(
            {
                "ts": np.repeat(t, self.n),
                "gpu_uuid": self.uuid.gather(np.tile(np.arange(self.n), len(secs))),
                "power_w": p.ravel(),
                "energy_j": reported.ravel(),
            }
        ).with_columns(pl.col("ts").dt.replace_time_zone("UTC"))

    def advance_to(self, next_first_s: int) -> None:
        """Keep the counter at the second before ``next_first_s`` (taken from the last chunk generated)."""
        secs, counter = self._pending
        self.counter_before = counter[np.searchsorted(secs, next_first_s - 1)]

    def exact_energy_j(self, lo_s: int, hi_s: int) -> float:
        """Energy the counter accrued over (lo_s, hi_s]: the sum of power at lo_s+1..hi_s."""
        return float(self.power(np.arange(lo_s + 1, hi_s + 1)).sum())


def bench_rollup(n_gpus: int, seconds: int, chunk_s: int) -> tuple[pl.DataFrame, dict]:
    fleet = Fleet(n_gpus, reset_at_s=seconds // 2)
    parts, roll_s, gen_s, samples = [], 0.0, 0.0, 0
    for w0 in range(0, seconds, chunk_s):
        w1 = min(seconds, w0 + chunk_s)
        t = time.perf_counter()
        # one sample either side of the window so its first and last minutes come out complete
        df = fleet.chunk(max(0, w0 - 1), w1)
        fleet.advance_to(w1 - 1 if w1 < seconds else w1)
        gen_s += time.perf_counter() - t
        samples += df.height
        t = time.perf_counter()
        r = E.energy_rollup(df, window_start=T0 + dt.timedelta(seconds=w0), window_end=T0 + dt.timedelta(seconds=w1))
        roll_s += time.perf_counter() - t
        parts.append(r.minutes)
        del df, r
    minutes = pl.concat(parts)
    exact = fleet.exact_energy_j(0, seconds)
    # the reset seconds: one interval per reset GPU is integrated from power (trapezoid), not counted exactly
    got = float(minutes["energy_j"].sum())
    out = {
        "bench": "energy_rollup", "gpus": n_gpus, "seconds": seconds, "chunk_s": chunk_s,
        "samples": samples, "rollup_rows": minutes.height,
        "rollup_s": round(roll_s, 2), "generate_s": round(gen_s, 2),
        "samples_per_s": round(samples / roll_s),
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
        "energy_rel_err": float(f"{abs(got - exact) / exact:.2e}"),
        "methods": sorted(minutes["method"].unique().to_list()),
        "target": "rollup_s < 60, peak_rss_mib < 4096",
    }
    return minutes, out


def bench_query(minutes: pl.DataFrame, n_jobs: int) -> list[dict]:
    gpus = minutes.select("gpu_uuid").unique().sort("gpu_uuid")["gpu_uuid"]
    n = len(gpus)
    hosts = [f"node-{i // 8:05d}" for i in range(n)]
    gpu = pl.DataFrame({"gpu_uuid": gpus, "host": hosts, "model_name": ["H100"] * n})
    host = pl.DataFrame({"host": sorted(set(hosts))}).with_columns(
        pl.when(pl.int_range(pl.len()) < pl.len() // 2).then(pl.lit("site-a")).otherwise(pl.lit("site-b")).alias("site_id")
    )
    site = pl.DataFrame({"site_id": ["site-a", "site-b"], "country": ["FRA", "USA"], "grid_region": [None, "US-CA"]})
    per_job = n // n_jobs
    start, end = T0 + dt.timedelta(minutes=10), T0 + dt.timedelta(minutes=40)
    # job k holds GPUs [k*per_job, (k+1)*per_job) for the hour; rank 0 of each job moves GPU at minute 20
    jr = pl.DataFrame(
        {
            "job_id": [f"job-{i // per_job:03d}" for i in range(n_jobs * per_job)],
            "rank": [i % per_job for i in range(n_jobs * per_job)],
            "start": [T0] * (n_jobs * per_job),
            "end": [None] * (n_jobs * per_job),
            "gpu_uuid": gpus[: n_jobs * per_job],
        },
        schema={"job_id": pl.String, "rank": pl.Int64, "start": pl.Datetime("us", "UTC"), "end": pl.Datetime("us", "UTC"), "gpu_uuid": pl.String},
    )
    table = C.load_grid_intensity()
    out = []

    # a job's energy and carbon for the period
    best = float("inf")
    for _ in range(3):
        t = time.perf_counter()
        ranks = jr.filter(pl.col("job_id") == "job-007")
        sub = minutes.filter((pl.col("minute") >= start) & (pl.col("minute") < end)).join(ranks.select("gpu_uuid"), on="gpu_uuid", how="semi")
        att = E.attribute_to_jobs(sub, ranks).filter(pl.col("job_id") == "job-007")
        att = att.join(gpu.select("gpu_uuid", "host"), on="gpu_uuid").join(host, on="host")
        hourly = att.group_by("site_id", pl.col("minute").dt.truncate("1h")).agg(pl.col("energy_j").sum())
        carbon = C.location_based(hourly, site, table=table)
        job_j, job_kg = float(att["energy_j"].sum()), float(carbon["kgco2e"].sum())
        best = min(best, time.perf_counter() - t)
    out.append({"bench": "energy_query", "what": "job energy+carbon, 30 min", "gpus": per_job, "seconds": round(best, 4),
                "energy_kwh": round(job_j / 3.6e6, 3), "kgco2e": round(job_kg, 3), "target": "< 1 s"})

    # a site's energy and carbon for the period
    best = float("inf")
    for _ in range(3):
        t = time.perf_counter()
        site_gpus = gpu.join(host.filter(pl.col("site_id") == "site-b"), on="host").select("gpu_uuid")
        sub = minutes.filter((pl.col("minute") >= start) & (pl.col("minute") < end)).join(site_gpus, on="gpu_uuid", how="semi")
        hourly = sub.group_by(pl.col("minute").dt.truncate("1h")).agg(pl.col("energy_j").sum()).with_columns(pl.lit("site-b").alias("site_id"))
        carbon = C.location_based(hourly, site, table=table)
        site_j, site_kg = float(sub["energy_j"].sum()), float(carbon["kgco2e"].sum())
        best = min(best, time.perf_counter() - t)
    out.append({"bench": "energy_query", "what": "site energy+carbon, 30 min", "gpus": site_gpus.height, "seconds": round(best, 4),
                "energy_kwh": round(site_j / 3.6e6, 3), "kgco2e": round(site_kg, 3), "target": "< 1 s"})
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpus", type=int, default=16384)
    ap.add_argument("--seconds", type=int, default=3600)
    ap.add_argument("--chunk-s", type=int, default=60)
    ap.add_argument("--jobs", type=int, default=64)
    args = ap.parse_args()
    minutes, line = bench_rollup(args.gpus, args.seconds, args.chunk_s)
    print(json.dumps(line), flush=True)
    for q in bench_query(minutes, args.jobs):
        print(json.dumps(q), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

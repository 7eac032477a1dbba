"""An active 1,024-GPU job's per-minute analysis (beat's analyze-active-jobs: ``services.jobs.analyze_job`` with
``incremental=True``) at 1 hour and at 30 days of age, on PostgreSQL (README "Scaling out"). Target: under 1 s
at both ages.

Each job has 1,024 ranks on 1,024 GPUs (128 hosts of one site), one all-reduce per rank-step, model FLOPs, its
lifecycle events, and a straggler: rank 17 computes 40 % slower in bursts of three steps (a persistent
straggler, so the run finds it and prices it from the GPUs' energy minutes). Its history is written with
COPY, then folded the way beat would have folded it (a run per history chunk), then the job goes on at a
10 s step: each measured minute writes the minute's six steps (6,144 step rows and as many collectives) and
the GPUs' energy minute, then times one incremental analysis. The 30-day job's history has one step every
10 minutes (4,320 steps, 4.4 M step rows and 4.4 M collectives: a step every 10 s for 30 days would be 265 M
rows, more than this machine's disk holds beside the others'); the 1-hour job's, one every 10 s (360 steps).
What a minute's analysis reads is the tail past the job's watermark through the (job_id, start) index, so
the history's density changes only the index's depth.

Also prints the same job's full analysis (``incremental=False``, what ``POST /api/v1/jobs/{id}/analyze``
runs), the cost the per-minute analysis had before it advanced from watermarks.

With ``--step-events`` the job also reports a ``step`` job event per rank and step (loss, grad norm, parameter
checksum: the SDC screen's input), which goodput, SDC screening and checkpoint advice fold from the job's event
watermark (``services.event_fold``); ``event_state_bytes`` is the size of that folded state.

    python benchmarks/job_analysis.py [--ranks 1024] [--minutes 5] [--only 1h|30d] [--step-events] [--postgres URL] [--skip-full]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import sys
import time
from pathlib import Path

_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
sys.path.insert(0, str(_HERE.parent))

import numpy as np  # noqa: E402
import polars as pl  # noqa: E402

from fleetscope.core import frames as F  # noqa: E402
from fleetscope.services import event_fold, job_fold, jobs  # noqa: E402
from benchmarks._server import scratch_store  # noqa: E402
from fleetscope.store import Store  # noqa: E402

NOW = dt.datetime(2026, 11, 30, 12, tzinfo=dt.UTC)
SLOW_RANK = 17


def _emit(**row: object) -> None:
    print(json.dumps(row), flush=True)


def _steps(job_id: str, ranks: int, first_step: int, starts_us: np.ndarray, step_s: float, rng: np.random.Generator) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Steps ``first_step ..`` starting at ``starts_us`` (one per step), every rank, with one all-reduce each."""
    n_steps = starts_us.size
    step_no = np.repeat(np.arange(first_step, first_step + n_steps, dtype=np.int64), ranks)
    rank = np.tile(np.arange(ranks, dtype=np.int64), n_steps)
    span_s = min(step_s * 0.9, 9.0)
    start = np.repeat(starts_us, ranks) + rng.integers(0, 3000, n_steps * ranks)
    compute = rng.uniform(0.5, 0.52, n_steps * ranks) * span_s
    slow = (rank == SLOW_RANK) & ((step_no % 40) < 3)
    compute = np.where(slow, compute * 1.4, compute)
    # the all-reduce holds every rank until the slowest arrives: the slow rank waits least
    per_step_max = pl.DataFrame({"s": step_no, "c": compute}).with_columns(m=pl.col("c").max().over("s"))["m"].to_numpy()
    wait = per_step_max - compute
    dur_us = int(span_s * 0.3 * 1e6)
    ts = lambda us: pl.Series(us).cast(pl.Datetime("us")).dt.replace_time_zone("UTC")  # noqa: E731
    steps = pl.DataFrame({
        "job_id": job_id, "rank": rank, "step": step_no, "start": ts(start), "end": ts(start + int(span_s * 1e6)),
        "compute_s": compute, "comm_s": span_s * 0.35, "comm_overlap_s": span_s * 0.05, "idle_s": span_s * 0.02,
        "tokens": pl.Series(np.full(n_steps * ranks, 8192, dtype=np.int64)), "model_flops": rng.uniform(4e14, 4.2e14, n_steps * ranks),
    })
    colls = pl.DataFrame({
        "job_id": job_id, "rank": rank, "comm_id": "dp", "seq": step_no, "op": "all_reduce", "peer": -1,
        "bytes": pl.Series(np.full(n_steps * ranks, 2**28, dtype=np.int64)), "nranks": ranks,
        "start": ts(start + int(compute.mean() * 1e6) + dur_us // 4), "duration_s": 1.0 + wait + rng.uniform(0, 0.002, n_steps * ranks),
    })
    return steps, colls


def _step_events(steps: pl.DataFrame) -> pl.DataFrame:
    """A ``step`` job event per rank and step with the SDC screen's payload (loss, grad norm, parameter checksum),
    as a job instrumented for it reports."""
    return steps.select(
        "job_id", pl.col("end").alias("ts"), pl.lit("step").alias("kind"), "step", "rank",
        pl.format('{{"loss": {}, "grad_norm": {}, "param_checksum": "{}"}}', (pl.col("compute_s") * 0.7).round(6),
                  (pl.col("compute_s") * 0.1).round(6), pl.col("step") * 7919).alias("payload"))


def _energy(gpus: list[str], minutes: list[dt.datetime], rng: np.random.Generator) -> pl.DataFrame:
    n = len(gpus) * len(minutes)
    e = rng.uniform(36_000, 42_000, n)
    return pl.DataFrame({"minute": [m for m in minutes for _ in gpus], "gpu_uuid": gpus * len(minutes), "energy_j": e,
                         "counter_energy_j": e, "integrated_energy_j": 0.0, "covered_s": 60.0, "method": "counter"})


def run_job(store: Store, job_id: str, ranks: int, age: dt.timedelta, history_step_s: float, minutes: int, full: bool,
            step_events: bool = False) -> None:
    rng = np.random.default_rng(5)
    gpus = [f"GPU-{job_id}-{r:05d}-0000-0000-{r:012x}" for r in range(ranks)]
    hosts = [f"{job_id}-node-{r // 8:04d}" for r in range(ranks)]
    started = NOW - age
    store.write(F.Batch(
        site=pl.DataFrame({"site_id": ["site-a"], "country": ["FRA"], "declared_pue": [1.2]}),
        host=pl.DataFrame({"host": sorted(set(hosts)), "site_id": "site-a"}),
        gpu=pl.DataFrame({"gpu_uuid": gpus, "host": hosts, "model_name": "NVIDIA H100 80GB HBM3"}),
        job=pl.DataFrame({"job_id": [job_id], "world_size": [ranks], "started_at": [started], "status": ["running"]}),
        job_rank=pl.DataFrame({"job_id": job_id, "rank": list(range(ranks)), "start": started, "gpu_uuid": gpus, "host": hosts}),
        job_event=pl.DataFrame({"job_id": [job_id, job_id], "ts": [started - dt.timedelta(minutes=2), started], "kind": ["allocated", "started"]}),
    ))
    # history: steps every history_step_s from the start to NOW, folded a chunk at a time as beat would have
    t = time.perf_counter()
    n_hist = int(age.total_seconds() // history_step_s)
    chunk = max(1, int(86_400 // history_step_s))
    rows = 0
    for s0 in range(0, n_hist, chunk):
        k = min(chunk, n_hist - s0)
        starts = int(started.timestamp() * 1e6) + (np.arange(s0, s0 + k, dtype=np.int64) * int(history_step_s * 1e6))
        steps, colls = _steps(job_id, ranks, s0, starts, history_step_s, rng)
        store.write(F.Batch(source="bench", step=steps, collective=colls, job_event=_step_events(steps) if step_events else None))
        rows += steps.height
        jobs.analyze_job(store, job_id, now=started + dt.timedelta(seconds=(s0 + k) * history_step_s), incremental=True)
    # the GPUs' energy for the last 20 minutes (the analysis reads the unsettled 15 and the minute that settles)
    store.write(F.Batch(source="bench", gpu_energy_minute=_energy(gpus, [NOW - dt.timedelta(minutes=m) for m in range(20, 0, -1)], rng)))
    jobs.analyze_job(store, job_id, now=NOW, incremental=True)
    fill_s = time.perf_counter() - t
    # the job goes on at a 10 s step: each minute, its six steps and energy minute, then one analysis
    step_no = n_hist
    times, cpu = [], []
    for m in range(minutes):
        now = NOW + dt.timedelta(minutes=m + 1)
        starts = int((now - dt.timedelta(minutes=1)).timestamp() * 1e6) + np.arange(6, dtype=np.int64) * 10_000_000
        steps, colls = _steps(job_id, ranks, step_no, starts, 10.0, rng)
        step_no += 6
        store.write(F.Batch(source="bench", step=steps, collective=colls, job_event=_step_events(steps) if step_events else None,
                            gpu_energy_minute=_energy(gpus, [now - dt.timedelta(minutes=1)], rng)))
        t, c = time.perf_counter(), time.process_time()
        out = jobs.analyze_job(store, job_id, now=now, incremental=True)
        times.append(time.perf_counter() - t)
        cpu.append(time.process_time() - c)
    state = job_fold._load(store, job_id)
    events = job_fold.load_state(store, job_id, event_fold.STATE) if step_events else None
    _emit(bench="job_analysis_per_minute", db="postgresql", ranks=ranks, per_rank_step_events=step_events, age_h=round(age.total_seconds() / 3600, 1),
          history_step_s=history_step_s, history_rank_steps=rows, minutes=minutes, seconds_median=round(statistics.median(times), 3),
          seconds_max=round(max(times), 3), cpu_s_median=round(statistics.median(cpu), 3), target_s=1.0,
          stragglers=[f["subject"] for f in out.stragglers], steps_folded=state.steps, state_bytes=len(state.to_json()),
          event_state_bytes=len(events) if events is not None else None,
          fill_s=round(fill_s, 1))
    if full:
        t, c = time.perf_counter(), time.process_time()
        whole = jobs.analyze_job(store, job_id, now=NOW + dt.timedelta(minutes=minutes))
        _emit(bench="job_analysis_full", db="postgresql", ranks=ranks, age_h=round(age.total_seconds() / 3600, 1),
              seconds=round(time.perf_counter() - t, 3), cpu_s=round(time.process_time() - c, 3),
              same_result=whole.to_dict() == out.to_dict())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, default=1024)
    ap.add_argument("--minutes", type=int, default=5)
    ap.add_argument("--skip-full", action="store_true", help="leave out the full analyses")
    ap.add_argument("--only", choices=("1h", "30d"))
    ap.add_argument("--step-events", action="store_true",
                    help="the job also reports a step event per rank and step (the SDC screen's input), folded from the job's event watermark")
    ap.add_argument("--postgres", default=os.environ.get("FLEETSCOPE_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"))
    args = ap.parse_args()
    for name, age, step_s in (("1h", dt.timedelta(hours=1), 10.0), ("30d", dt.timedelta(days=30), 600.0)):
        if args.only not in (None, name):
            continue
        with scratch_store(args.postgres) as store:
            run_job(store, f"job-{name}", args.ranks, age, step_s, args.minutes, not args.skip_full, args.step_events)


if __name__ == "__main__":
    main()

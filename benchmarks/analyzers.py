"""C³ and straggler analysis of a synthetic job: 16,384 ranks × 100 steps (1.6 M rank-steps) by default.

Usage: python benchmarks/analyzers.py [--ranks N] [--steps N] [--repeat N] [--no-collectives]
Prints JSON lines: {"bench": ..., "rank_steps": ..., "seconds": ..., "rank_steps_per_s": ...}, one per stage
(c3_breakdown, detect_stragglers end to end, straggler_findings) and one for the real what-if traces when
../shared/realdata is present. Seconds are the best of --repeat runs (least disturbed by other load on a
shared machine). Target (issue 4): C³ + straggler analysis of 1.6 M rank-steps in under 5 s on 2 cores.

The synthetic job obeys the C³ model: per rank-step compute ~ N(1.0, 0.02) s, comm 0.3 s of which 0.2 s
overlapped, idle 0.02 s; one all-reduce per rank-step whose kernel lasts transfer (0.1 s) + wait for the
slowest rank. Ranks 7 (compute 1.6×) and 4242 (host stalls, +0.5 s idle) straggle from step 20 on.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import polars as pl

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from analyzers import c3, stragglers  # noqa: E402
from fleetscope.core.frames import UTC_US  # noqa: E402
from ingest import bytedance_whatif  # noqa: E402


def synthetic_job(ranks: int, steps: int, *, collectives: bool = True, seed: int = 0) -> tuple[pl.DataFrame, pl.DataFrame | None]:
    rng = np.random.default_rng(seed)
    n = ranks * steps
    rank = np.tile(np.arange(ranks, dtype=np.int64), steps)
    step = np.repeat(np.arange(steps, dtype=np.int64), ranks)
    compute = rng.normal(1.0, 0.02, n).clip(0.5)
    idle = np.full(n, 0.02)
    late = step >= 20
    compute[(rank == 7) & late] *= 1.6
    idle[(rank == 4242) & late] += 0.5
    comm, overlap, transfer = 0.3, 0.2, 0.1
    busy = compute + (comm - overlap) + idle
    slowest = busy.reshape(steps, ranks).max(axis=1)
    wait = np.repeat(slowest, ranks) - busy  # everyone waits for the slowest inside the all-reduce
    step_s = busy + wait
    t0 = int(datetime(2025, 1, 1, tzinfo=timezone.utc).timestamp() * 1e6)
    step_start = t0 + np.concatenate([[0], np.cumsum(slowest[:-1])]) * 1e6
    start_us = np.repeat(step_start, ranks).astype(np.int64)
    end_us = start_us + np.round(step_s * 1e6).astype(np.int64)
    st = pl.DataFrame({
        "job_id": "bench", "rank": rank, "step": step,
        "start": start_us, "end": end_us,
        "compute_s": compute, "comm_s": comm + wait, "comm_overlap_s": np.full(n, overlap), "idle_s": idle,
    }).with_columns(pl.col("start").cast(UTC_US), pl.col("end").cast(UTC_US))
    if not collectives:
        return st, None
    coll = pl.DataFrame({
        "job_id": "bench", "rank": rank, "comm_id": "dp", "seq": step, "op": "all_reduce", "peer": -1,
        "bytes": np.full(n, 1 << 28, dtype=np.int64), "nranks": np.full(n, ranks, dtype=np.int64),
        "start": start_us + np.round((busy - idle) * 1e6).astype(np.int64) - 100_000,
        "duration_s": transfer + wait,
    }).with_columns(pl.col("start").cast(UTC_US))
    return st, coll


def best_of(repeat: int, fn):
    best, out = float("inf"), None
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t)
    return best, out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, default=16384)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--no-collectives", action="store_true")
    args = ap.parse_args()
    st, coll = synthetic_job(args.ranks, args.steps, collectives=not args.no_collectives)
    n = st.height
    emit = lambda name, s, **kw: print(json.dumps({"bench": name, "rank_steps": n, "seconds": round(s, 3),  # noqa: E731
                                                   "rank_steps_per_s": round(n / s), **kw}), flush=True)
    s, _ = best_of(args.repeat, lambda: c3.c3_breakdown(st, coll))
    emit("c3_breakdown", s, collectives=coll is not None)
    s, det = best_of(args.repeat, lambda: stragglers.detect_stragglers(st, coll))
    emit("c3_plus_straggler_detection", s, collectives=coll is not None, target_s=5.0)
    s, fnd = best_of(args.repeat, lambda: stragglers.straggler_findings(det))
    emit("straggler_findings", s, findings=fnd.height, subjects=fnd["subject"].to_list(), kinds=fnd["kind"].to_list())

    realdata = REPO.parent / "shared" / "realdata" / "traces" / "bytedance_straggler_whatif"
    if realdata.is_dir():
        for name in ("AR", "SE", "ST"):
            tr = bytedance_whatif.parse((realdata / f"trace-{name}.parquet").read_bytes(),
                                        meta=(realdata / f"meta-{name}.yaml").read_bytes(), source=name)
            s, r = best_of(args.repeat, lambda: stragglers.whatif(tr.ops, tr.meta))
            print(json.dumps({"bench": "whatif", "trace": name, "ops": tr.ops.height, "seconds": round(s, 3),
                              "slowdown": round(r.slowdown, 3), "verdict": r.verdict, "culprits": r.culprits}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Reliability report latency over a store holding a long job with many step events (issue 5).

Usage: python benchmarks/reliability.py [--ranks 512] [--steps 1000] [--days 54] [--database-url URL]

A job of --ranks ranks runs --steps steps (one ``step`` event per rank per step, the bulk of job events),
with the Llama 3 405B interruption mix (419 failures over --days days, each followed by a restart) and a
checkpoint every hour. The report must not read the step events row by row: it aggregates them in SQL.

Prints JSON lines: {"bench": "reliability_write", ...} (the synthetic events written, not a target) and
{"bench": "reliability_report", ...} (``reliability_report`` over the whole window: best of --repeat runs).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
import tempfile
import time
from pathlib import Path

import polars as pl

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from analyzers import reliability as rel  # noqa: E402
from fleetscope.store import db  # noqa: E402
from fleetscope.core import frames as F  # noqa: E402
from fleetscope.services.reliability import reliability_report  # noqa: E402
from fleetscope.store import Store  # noqa: E402

T0 = dt.datetime(2025, 1, 1, tzinfo=dt.UTC)
JOB = "llama3-405b"


def events(ranks: int, steps: int, days: float) -> pl.DataFrame:
    span_us = int(days * 86400e6)
    step_ts = [T0 + dt.timedelta(microseconds=span_us * (s + 0.5) / steps) for s in range(steps)]
    step = pl.DataFrame({"ts": step_ts, "step": list(range(steps))}, schema={"ts": F.UTC_US, "step": pl.Int64}).join(
        pl.DataFrame({"rank": list(range(ranks))}, schema={"rank": pl.Int64}), how="cross").with_columns(
        pl.lit(JOB).alias("job_id"), pl.lit("step").alias("kind"), pl.lit('{"loss":2.0}').alias("payload"))
    causes = [c for c, _, n in rel.LLAMA3_INTERRUPTIONS for _ in range(n)]
    other = [{"ts": T0, "kind": "started", "rank": -1, "step": None, "payload": None},
             {"ts": T0 + dt.timedelta(days=days), "kind": "finished", "rank": -1, "step": None, "payload": None}]
    for i, cause in enumerate(causes):
        t = T0 + dt.timedelta(microseconds=span_us * (i + 0.25) / len(causes))
        other.append({"ts": t, "kind": "failure", "rank": i % ranks, "step": None, "payload": json.dumps({"cause": cause})})
        other.append({"ts": t + dt.timedelta(minutes=30), "kind": "restart", "rank": -1, "step": None, "payload": None})
    for h in range(int(days * 24)):
        s = T0 + dt.timedelta(hours=h, minutes=10)
        other.append({"ts": s, "kind": "checkpoint_save_start", "rank": -1, "step": None, "payload": None})
        other.append({"ts": s + dt.timedelta(minutes=5), "kind": "checkpoint_save_end", "rank": -1, "step": None, "payload": None})
    rest = pl.DataFrame(other, schema={"ts": F.UTC_US, "kind": pl.String, "rank": pl.Int64, "step": pl.Int64, "payload": pl.String})
    rest = rest.with_columns(pl.lit(JOB).alias("job_id"))
    return pl.concat([step.select(F.JOB_EVENT.names), rest.select(F.JOB_EVENT.names)])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=512)
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--days", type=float, default=54.0)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--database-url", default=None, help="default: a new SQLite file in a temporary directory")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        url = args.database_url or f"sqlite:///{Path(tmp) / 'bench.db'}"
        db.upgrade(url)
        store = Store.open(url)
        ev = events(args.ranks, args.steps, args.days)
        t = time.perf_counter()
        store.write(F.Batch(source="bench", job=pl.DataFrame({"job_id": [JOB], "world_size": [args.ranks]}), job_event=ev))
        print(json.dumps({"bench": "reliability_write", "job_events": ev.height, "write_s": round(time.perf_counter() - t, 2),
                          "database": store.dialect}), flush=True)
        best = float("inf")
        for _ in range(args.repeat):
            t = time.perf_counter()
            out = reliability_report(store, T0, T0 + dt.timedelta(days=args.days, hours=1), job_id=JOB)
            best = min(best, time.perf_counter() - t)
        job = out["mtbf"]["jobs"][0]
        print(json.dumps({"bench": "reliability_report", "job_events": ev.height, "report_s": round(best, 3),
                          "interruptions": out["interruptions"]["total"], "job_mtbf_hours": round(job["job_mtbf_hours"], 3),
                          "checkpoint_saves": out["checkpoint"][0]["saves"], "database": store.dialect}), flush=True)
        store.engine.dispose()


if __name__ == "__main__":
    main()

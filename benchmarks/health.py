"""A day of health signals for a 16,384-GPU fleet through analyzers.health, timed.

Usage: python benchmarks/health.py [--gpus N] [--minutes M] [--repeat R] [--seed S]
Prints JSON lines: one for the synthesis (not timed against the target), one per analysis stage and
one total. Target (issue 5): the whole analysis under 10 s on the 2-core development machine.

The synthetic day: one gpu_sample row per GPU per minute (1,440 × 16,384 = 23.6 M rows) with
utilisation, SM clock, temperatures, clock event reasons, ECC SBE/DBE, remapped rows, remap
flags and violation counters, plus Xid events. A few GPUs carry injected faults (SBE storms, a DBE with
a row remap, thermal throttling, a slow clock, a counter reset from a driver reload) so the
rules have work to do; the run checks they are found.
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

from analyzers import health  # noqa: E402


def synthesize(gpus: int, minutes: int, seed: int) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame, dict[str, list[str]]]:
    rng = np.random.default_rng(seed)
    n = gpus * minutes
    gi = np.repeat(np.arange(gpus, dtype=np.int64), minutes)
    mi = np.tile(np.arange(minutes, dtype=np.int64), gpus)
    uuids = np.array([f"GPU-{i:08x}-0000-0000-0000-000000000000" for i in range(gpus)])
    t0 = int(datetime(2026, 11, 1, tzinfo=timezone.utc).timestamp() * 1e6)
    ts = t0 + mi * 60_000_000
    util = np.clip(rng.normal(0.93, 0.05, n), 0, 1)
    clock = np.full(n, 1980.0) - rng.integers(0, 30, n)
    reasons = np.zeros(n, dtype=np.int64)
    sbe = np.zeros(n, dtype=np.int64)
    dbe = np.zeros(n, dtype=np.int64)
    remap_c = np.zeros(n, dtype=np.int64)
    pending = np.zeros(n, dtype=np.int64)
    thermal_v = np.zeros(n)
    faults: dict[str, list[str]] = {"sbe_storm": [], "dbe_remap": [], "thermal": [], "slow_clock": [], "reset": []}
    picks = rng.choice(gpus, size=50, replace=False)
    for k, g in enumerate(picks):
        sl = slice(g * minutes, (g + 1) * minutes)
        kind = list(faults)[k % len(faults)]
        faults[kind].append(uuids[g])
        if kind == "sbe_storm":
            sbe[sl] = np.cumsum(rng.poisson(2.0, minutes))
        elif kind == "dbe_remap":
            dbe[sl] = (np.arange(minutes) > minutes // 2).astype(np.int64)
            remap_c[sl] = dbe[sl]
            pending[sl] = dbe[sl]
        elif kind == "thermal":
            reasons[sl] = 0x20
            clock[sl] = 1400.0
            thermal_v[sl] = np.cumsum(np.full(minutes, 30.0))
        elif kind == "slow_clock":
            clock[sl] = 1500.0
        elif kind == "reset":  # driver reload at midday: volatile counters restart from zero
            base = np.cumsum(rng.poisson(0.05, minutes))
            base[minutes // 2:] -= base[minutes // 2]
            sbe[sl] = base
    sample = pl.DataFrame({
        "ts": pl.Series(ts).cast(pl.Datetime("us", "UTC")),
        "gpu_uuid": uuids[gi],
        "util_ratio": util,
        "sm_clock_mhz": clock,
        "temp_c": rng.normal(60, 5, n),
        "clock_event_reasons": reasons,
        "ecc_sbe_volatile_total": sbe,
        "ecc_dbe_volatile_total": dbe,
        "remap_correctable_total": remap_c,
        "remap_uncorrectable_total": np.zeros(n, dtype=np.int64),
        "remap_pending": pending,
        "remap_failure": np.zeros(n, dtype=np.int64),
        "thermal_violation_s": thermal_v,
        "power_violation_s": np.zeros(n),
    })
    hosts = pl.DataFrame({"gpu_uuid": uuids, "host": [f"node-{i // 8:05d}" for i in range(gpus)]})
    ev = []
    for g in faults["dbe_remap"]:
        ev += [{"ts": datetime(2026, 11, 1, 12, tzinfo=timezone.utc), "host": "", "gpu_uuid": g, "kind": "xid", "code": 48},
               {"ts": datetime(2026, 11, 1, 12, 0, 1, tzinfo=timezone.utc), "host": "", "gpu_uuid": g, "kind": "xid", "code": 63}]
    # background noise: application Xids across the fleet
    for g in rng.choice(uuids, 500, replace=False):
        ev.append({"ts": datetime(2026, 11, 1, 8, tzinfo=timezone.utc), "host": "", "gpu_uuid": str(g), "kind": "xid", "code": 13})
    events = pl.DataFrame(ev, schema={"ts": pl.Datetime("us", "UTC"), "host": pl.String, "gpu_uuid": pl.String, "kind": pl.String, "code": pl.Int64})
    return sample, events, hosts, faults


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpus", type=int, default=16_384)
    ap.add_argument("--minutes", type=int, default=1_440)
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--seed", type=int, default=5)
    args = ap.parse_args()
    t = time.perf_counter()
    sample, events, hosts, faults = synthesize(args.gpus, args.minutes, args.seed)
    print(json.dumps({"bench": "health_synthesize", "rows": sample.height, "values": sample.height * (sample.width - 2),
                      "seconds": round(time.perf_counter() - t, 2)}), flush=True)
    best = float("inf")
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        g = health.gpu_health(sample, events, gpu_host=hosts, expected_sm_clock_mhz=1980.0)
        t1 = time.perf_counter()
        n = health.node_health(g)
        f = health.health_findings(g, n)
        t2 = time.perf_counter()
        best = min(best, t2 - t0)
        print(json.dumps({"bench": "health_analyse", "gpus": g.height, "rows": sample.height,
                          "gpu_health_s": round(t1 - t0, 2), "node_and_findings_s": round(t2 - t1, 2),
                          "total_s": round(t2 - t0, 2), "rows_per_s": round(sample.height / (t2 - t0))}), flush=True)
    rec = dict(zip(g["gpu_uuid"], g["recommendation"]))
    found = {k: sum(rec.get(u) != "none" for u in v) for k, v in faults.items() if k != "reset"}
    found["injected"] = {k: len(v) for k, v in faults.items()}
    false_alarms = sum(1 for u, r in rec.items() if r not in ("none", "restart_app") and not any(u in v for v in faults.values()))
    print(json.dumps({"bench": "health_total", "best_s": round(best, 2), "target_s": 10.0, "met": best < 10.0,
                      "findings": f.height, "faults_flagged": found, "false_alarms": false_alarms}), flush=True)
    return 0 if best < 10.0 else 1


if __name__ == "__main__":
    raise SystemExit(main())

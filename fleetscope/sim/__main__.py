"""``python -m fleetscope.sim OUT_DIR [--demo] [--seed N]``: write a simulated fleet and print its manifest summary."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from fleetscope.sim.simulate import simulate_demo, simulate_small


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m fleetscope.sim", description=__doc__)
    ap.add_argument("out_dir", type=Path)
    ap.add_argument("--demo", action="store_true", help="the demo size (2 sites, 64 nodes, 4 jobs, 2 h) instead of the test size")
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args(argv)
    m = (simulate_demo if args.demo else simulate_small)(args.out_dir, seed=args.seed)
    summary = {"out_dir": m.out_dir, "files": {k: len(v) for k, v in m.files.items()},
               "jobs": [j["job_id"] for j in m.jobs], "faults": [f.to_dict() for f in m.faults]}
    json.dump(summary, sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Throughput of ingest.kineto.parse on real Kineto traces (uncompressed JSON bytes in, Batch out), and of
ingest.kineto.parse_chunks, the streamed path for large files, on the same bytes in 4 MiB chunks
(``streamed_mb_per_s``; pieces of kineto.PIECE_BYTES, so a trace under 16 MiB is one piece).

Usage: python benchmarks/ingest_kineto.py [--repeat N] [--traces DIR]
Prints one JSON line per trace and one for the total:
{"bench": "kineto_parse", "file": ..., "mb": ..., "seconds": ..., "mb_per_s": ..., "streamed_seconds": ..., "streamed_mb_per_s": ...}
MB are 10^6 bytes of uncompressed JSON; seconds is the best of --repeat runs (least disturbed by
other load on a shared machine). Traces: ../shared/realdata/traces/hta relative to the repository.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from ingest import kineto  # noqa: E402

CHUNK = 4 * 2**20


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--traces", type=Path, default=REPO.parent / "shared" / "realdata" / "traces" / "hta")
    args = ap.parse_args()
    files = sorted(args.traces.rglob("*.json.gz")) + sorted(args.traces.rglob("*.json"))
    if not files:
        print(json.dumps({"bench": "kineto_parse", "error": f"no traces under {args.traces}"}))
        return 1
    total_mb = total_s = total_stream_s = 0.0
    for f in files:
        raw = gzip.decompress(f.read_bytes()) if f.suffix == ".gz" else f.read_bytes()
        best = float("inf")
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            kineto.parse(raw, source=str(f), job_id="bench")
            best = min(best, time.perf_counter() - t0)
        best_stream = float("inf")
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            kineto.parse_chunks((raw[i: i + CHUNK] for i in range(0, len(raw), CHUNK)), source=str(f), job_id="bench")
            best_stream = min(best_stream, time.perf_counter() - t0)
        mb = len(raw) / 1e6
        total_mb += mb
        total_s += best
        total_stream_s += best_stream
        print(json.dumps({"bench": "kineto_parse", "file": str(f.relative_to(args.traces)), "mb": round(mb, 2),
                          "seconds": round(best, 3), "mb_per_s": round(mb / best, 1),
                          "streamed_seconds": round(best_stream, 3), "streamed_mb_per_s": round(mb / best_stream, 1)}))
    print(json.dumps({"bench": "kineto_parse", "file": "ALL", "mb": round(total_mb, 2), "seconds": round(total_s, 3),
                      "mb_per_s": round(total_mb / total_s, 1), "streamed_seconds": round(total_stream_s, 3),
                      "streamed_mb_per_s": round(total_mb / total_stream_s, 1), "json_decoder": "msgspec"}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

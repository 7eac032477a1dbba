"""SQLite: what a scrape's write costs as the raw-sample table grows, by the order of its key.

Before migration 0031 the embedded store's ``gpu_sample`` was a rowid table keyed ``(gpu_uuid, ts)`` with a second
index on ``ts``: a scrape's rows landed across the whole key index, so the pages a commit writes (and the checkpoint
copies) grew with the table. Keyed ``(ts, gpu_uuid)``, as it is now, a scrape's rows land at the index's end. This writes the same scrapes (16,384
GPUs x 30 fields by default) into both shapes of a bare table, WAL mode and ``synchronous=NORMAL`` as the store
opens it, and prints one JSON line per shape: the mean seconds of insert + commit over the first and last tenth of
the scrapes. ``benchmarks/ingest.py --scrapes 120`` shows the same through the API.

    python benchmarks/sqlite_key_order.py [--gpus 16384] [--scrapes 120]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sqlite3
import tempfile
import time

FIELDS = 30
SHAPES = {
    # the store's shape on SQLite before migration 0031 (pk_gpu_sample and ix_gpu_sample_ts)
    "gpu_uuid_ts": ("PRIMARY KEY (gpu_uuid, ts)", "CREATE INDEX ix_ts ON s (ts)"),
    # time first; the store since 0031 also keeps its index on ts, which a scrape appends to as well
    "ts_gpu_uuid": ("PRIMARY KEY (ts, gpu_uuid)", None),
}


def run(shape: str, gpus: int, scrapes: int, folder: str) -> dict:
    key, index = SHAPES[shape]
    conn = sqlite3.connect(os.path.join(folder, f"{shape}.db"), isolation_level=None)
    for pragma in ("journal_mode=WAL", "synchronous=NORMAL", "cache_size=-262144"):
        conn.execute(f"PRAGMA {pragma}")
    cols = ", ".join(f"f{i} DOUBLE" for i in range(FIELDS))
    conn.execute(f"CREATE TABLE s (ts BIGINT NOT NULL, gpu_uuid TEXT NOT NULL, {cols}, {key})")
    if index:
        conn.execute(index)
    rng = random.Random(7)
    uuids = [f"GPU-{rng.getrandbits(128):032x}" for _ in range(gpus)]
    values = [tuple(rng.random() for _ in range(FIELDS)) for _ in range(gpus)]
    insert = f"INSERT INTO s VALUES ({', '.join('?' for _ in range(FIELDS + 2))}) ON CONFLICT DO NOTHING"
    seconds = []
    for k in range(scrapes):
        ts = 1_700_000_000_000_000 + k * 10_000_000
        rows = [(ts, u, *v) for u, v in zip(uuids, values)]
        t0 = time.perf_counter()
        conn.execute("BEGIN")
        conn.executemany(insert, rows)
        conn.execute("COMMIT")
        if k % 10 == 9:
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # the store checkpoints in the background; here in the timing
        seconds.append(time.perf_counter() - t0)
    conn.close()
    tenth = max(1, scrapes // 10)
    first, last = seconds[1:1 + tenth], seconds[-tenth:]
    return {"bench": "sqlite_key_order", "key": shape, "gpus": gpus, "scrapes": scrapes, "rows": gpus * scrapes,
            "first_tenth_s_per_scrape": round(sum(first) / len(first), 4), "last_tenth_s_per_scrape": round(sum(last) / len(last), 4),
            "growth": round((sum(last) / len(last)) / (sum(first) / len(first)), 2)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gpus", type=int, default=16384)
    ap.add_argument("--scrapes", type=int, default=120)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="fleetscope-keyorder-") as folder:
        for shape in SHAPES:
            print(json.dumps(run(shape, args.gpus, args.scrapes, folder)), flush=True)


if __name__ == "__main__":
    main()

"""SQLite: what a scrape's write costs as the raw-sample table grows, by the order of its key.

The embedded store's ``gpu_sample`` is a rowid table keyed ``(gpu_uuid, ts)`` with a second index on ``ts``: a
scrape's rows land across the whole key index, so the pages a commit writes (and the checkpoint copies) grow with
the table. Keyed ``(ts, gpu_uuid)`` a scrape's rows land at the index's end, but one GPU's range is then a scan of
every GPU's rows of it (a GPU panel's raw read covers up to 6 h): the store keeps the GPU-first key. This writes the same scrapes (16,384
GPUs x 30 fields by default) into both shapes of a bare table, WAL mode and ``synchronous=NORMAL`` as the store
opens it, and prints one JSON line per shape: the mean seconds of insert + commit over the first and last tenth of
the scrapes. ``benchmarks/ingest.py --scrapes 120`` shows the same through the API.

``--group-gpus N`` writes each scrape as transactions of N rows instead of one, the shape of the ingest door's
group commits under an agent per node (48 pushes of 8 GPUs: ``--group-gpus 384``), each row stamped a millisecond
apart by host as agents' clocks are; the line then also gives the commit's share (``*_commit_s_per_scrape``). A
commit writes every page the transaction dirtied to the WAL in full, so a key that scatters rows pays per page, not
per row: the agent-shaped load pays it on every small group.

    python benchmarks/sqlite_key_order.py [--gpus 16384] [--scrapes 120] [--group-gpus N]
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
    # the store's shape on SQLite (`.schema gpu_sample`: pk_gpu_sample and ix_gpu_sample_ts)
    "gpu_uuid_ts": ("PRIMARY KEY (gpu_uuid, ts)", "CREATE INDEX ix_ts ON s (ts)"),
    "ts_gpu_uuid": ("PRIMARY KEY (ts, gpu_uuid)", None),
}


def run(shape: str, gpus: int, scrapes: int, folder: str, group_gpus: int | None = None) -> dict:
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
    step = group_gpus or gpus
    seconds, commits = [], []
    for k in range(scrapes):
        ts = 1_700_000_000_000_000 + k * 10_000_000
        if group_gpus:
            rows = [(ts + (i // 8) * 1000, u, *v) for i, (u, v) in enumerate(zip(uuids, values))]
        else:
            rows = [(ts, u, *v) for u, v in zip(uuids, values)]
        t0 = time.perf_counter()
        committing = 0.0
        for off in range(0, gpus, step):
            conn.execute("BEGIN")
            conn.executemany(insert, rows[off:off + step])
            c0 = time.perf_counter()
            conn.execute("COMMIT")
            committing += time.perf_counter() - c0
        if k % 10 == 9:
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # the store checkpoints in the background; here in the timing
        seconds.append(time.perf_counter() - t0)
        commits.append(committing)
    conn.close()
    tenth = max(1, scrapes // 10)

    def mean(xs: list[float], last: bool) -> float:
        part = xs[-tenth:] if last else xs[1:1 + tenth]
        return round(sum(part) / len(part), 4)

    out = {"bench": "sqlite_key_order", "key": shape, "gpus": gpus, "scrapes": scrapes, "rows": gpus * scrapes,
           "rows_per_commit": step, "first_tenth_s_per_scrape": mean(seconds, False), "last_tenth_s_per_scrape": mean(seconds, True),
           "growth": round(mean(seconds, True) / mean(seconds, False), 2)}
    if group_gpus:
        out |= {"first_tenth_commit_s_per_scrape": mean(commits, False), "last_tenth_commit_s_per_scrape": mean(commits, True)}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gpus", type=int, default=16384)
    ap.add_argument("--scrapes", type=int, default=120)
    ap.add_argument("--group-gpus", type=int, default=None, help="rows a transaction (default: a whole scrape in one)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="fleetscope-keyorder-") as folder:
        for shape in SHAPES:
            print(json.dumps(run(shape, args.gpus, args.scrapes, folder, args.group_gpus)), flush=True)


if __name__ == "__main__":
    main()

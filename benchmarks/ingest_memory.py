"""Peak memory of `fleetscope ingest` on large files: streamed line-oriented formats, and Kineto traces
(one JSON document, read whole).

Each measurement runs in a fresh child process that ingests one generated file into a fresh SQLite store
with ``fleetscope.door.streaming.ingest_file`` (what ``fleetscope ingest PATH`` calls) and reports its own peak
RSS (``VmHWM`` from /proc/self/status; ``ru_maxrss`` where /proc is missing). Inputs are generated in a
temporary directory and deleted afterwards:

- ``dcgm``: a scrape log, one dcgm-exporter scrape of ``--gpus`` GPUs after another, each sample carrying
  its scrape's timestamp (the scrape body is ``benchmarks/ingest_dcgm.py``'s, built from the structure of
  the real scrapes in ../shared/realdata/telemetry), ``--dcgm-gb`` GB in all; and the same without
  timestamps (concatenated scrapes are one instant: held rows merge, one row per GPU), ``--flat-gb``.
- ``job_events``: job lifecycle JSON Lines (step events with a payload), ``--events-gb`` GB.
- ``kineto``: real HTA traces' events repeated (timestamps shifted) to ``--kineto-mb`` sizes (a trace over
  the chunk size is streamed since ``kineto.parse_chunks``; under it, parsed whole).
- ``kineto_large``: the same construction written to disk as it is generated, ``--kineto-gb`` GB of JSON
  (default 2.5), ingested as ``.json`` and as ``.json.gz`` (ISA-L level 1); ``json_mb`` is the JSON size,
  and ``mb_per_s`` for the gzip file counts the JSON MB too (what was decoded), ``file_mb_per_s`` the file's.
  Needs about 1.2x ``--kineto-gb`` GB free in the temporary directory (checked first).

Prints one JSON line per run:
  {"bench": "ingest_memory", "format": "dcgm", "input_mb": ..., "peak_rss_mb": ..., "target_peak_mb": 1024, ...}

Usage: python benchmarks/ingest_memory.py [--dcgm-gb 3] [--flat-gb 1] [--events-gb 0.5] [--kineto-mb 50,100,200]
       [--kineto-gb 2.5] [--gpus 4096] [--chunk-mb 64] [--only dcgm,flat,events,kineto,kineto_large]
"""

from __future__ import annotations

import argparse
import datetime as dt
import gzip
import importlib.util
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
T0 = dt.datetime(2026, 6, 1, tzinfo=dt.UTC)


def _synth_scrape(gpus: int) -> bytes:
    spec = importlib.util.spec_from_file_location("_bench_ingest_dcgm", Path(__file__).resolve().parent / "ingest_dcgm.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.synth_scrape(gpus)


def write_dcgm(path: Path, gb: float, gpus: int, *, stamped: bool) -> int:
    body = _synth_scrape(gpus)
    if stamped:
        body = re.sub(rb"(?m)^([^#\n].*)$", rb"\1 @TS@", body)
    n = 0
    with open(path, "wb") as f:
        while f.tell() < gb * 1e9:
            f.write(body.replace(b"@TS@", b"%d" % (int(T0.timestamp() * 1000) + 15_000 * n)) if stamped else body)
            n += 1
    return n


def write_events(path: Path, gb: float) -> int:
    n = 0
    t0 = T0.timestamp()
    with open(path, "w") as f:
        while f.tell() < gb * 1e9:
            lines = []
            for _ in range(10_000):
                job, rank, step = f"job-{n // 4_000_000}", n % 64, n // 64
                lines.append(json.dumps({"job_id": job, "ts": t0 + step * 0.9 + rank * 1e-3, "kind": "step", "rank": rank, "step": step,
                                         "duration_s": 0.85, "tokens": 8192, "loss": 2.5 - step * 1e-6, "grad_norm": 1.1}))
                n += 1
            f.write("\n".join(lines) + "\n")
    return n


def write_kineto(path: Path, mb: float) -> int:
    """Real HTA trace events repeated with shifted timestamps until the JSON is ``mb`` MB."""
    src = REPO.parent / "shared" / "realdata" / "traces" / "hta" / "nccl_data_rank0_of_2" / "nccl_data.json.gz"
    doc = json.loads(gzip.decompress(src.read_bytes()))
    events = doc["traceEvents"]
    span = max(e.get("ts", 0) + e.get("dur", 0) for e in events) - min(e.get("ts", 0) for e in events if "ts" in e) + 1
    one = len(json.dumps(events).encode())
    copies = max(1, int(mb * 1e6 / one))
    out = []
    for k in range(copies):
        for e in events:
            if "ts" in e:
                e = {**e, "ts": e["ts"] + k * span}
            out.append(e)
    doc["traceEvents"] = out
    path.write_text(json.dumps(doc))
    return copies


def write_kineto_large(path: Path, gz_path: Path, gb: float) -> dict:
    """The real nccl_data trace's structure (keys before and after traceEvents, in its order) with its events
    repeated, timestamps shifted, until the JSON is ``gb`` GB; written as generated, plain and gzip at once."""
    # lazy: the generator's libraries stay out of the measured child, which imports this script
    import msgspec
    from isal import igzip  # lazy: as msgspec, kept out of the measured child

    src = REPO.parent / "shared" / "realdata" / "traces" / "hta" / "nccl_data_rank0_of_2" / "nccl_data.json.gz"
    doc = json.loads(gzip.decompress(src.read_bytes()))
    keys = list(doc)
    at = keys.index("traceEvents")
    events = doc["traceEvents"]
    head = json.dumps({k: doc[k] for k in keys[:at]}, indent=2)[:-2].encode()  # without its closing "\n}"
    tail = json.dumps({k: doc[k] for k in keys[at + 1:]}, indent=2)[1:].encode()  # without its opening "{"
    span = max(e.get("ts", 0) + e.get("dur", 0) for e in events) - min(e.get("ts", 0) for e in events if "ts" in e) + 1
    copies = 0
    written = 0
    with open(path, "wb") as f, igzip.open(gz_path, "wb", compresslevel=1) as g:
        def put(b: bytes) -> None:
            nonlocal written
            f.write(b)
            g.write(b)
            written += len(b)

        put(head + b',\n  "traceEvents": [\n')
        while written < gb * 1e9:
            shifted = [{**e, "ts": e["ts"] + copies * span} if "ts" in e else e for e in events]
            put((b",\n" if copies else b"") + msgspec.json.encode(shifted)[1:-1].replace(b"},{", b"},\n{"))
            copies += 1
        put(b"\n  ],\n" + tail if keys[at + 1:] else b"\n  ]\n}")
    return {"copies": copies, "events": copies * len(events), "json_mb": round(written / 1e6, 1)}


def child(path: str, fmt: str, chunk_mb: float) -> None:
    sys.path.insert(0, str(REPO))
    # lazy: the store and the ingest door load in the measured child only, once the repository is on its path
    from fleetscope.door import ingestion, streaming
    from fleetscope.store import Store, db  # lazy: as the door, in the measured child only

    url = f"sqlite:///{Path(path).parent / 'bench.db'}"
    db.upgrade(url)
    store = Store.open(url)
    t = time.perf_counter()
    opts = ingestion.Options(ts=T0, job_id="bench" if fmt == "kineto" else None)
    out = streaming.ingest_file(store, Path(path), opts=opts, chunk_bytes=int(chunk_mb * 2**20))
    seconds = time.perf_counter() - t
    hwm = None
    try:
        hwm = next(int(ln.split()[1]) for ln in Path("/proc/self/status").read_text().splitlines() if ln.startswith("VmHWM:")) / 1024
    except (OSError, StopIteration):
        pass
    print(json.dumps({"peak_rss_mb": round(hwm or resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1), "seconds": round(seconds, 2),
                      "error": out.error, "written": out.result.written if out.result else {}, "values": out.result.values if out.result else 0,
                      "chunks": out.notes.get("chunks")}))


def measure(label: str, path: Path, fmt: str, chunk_mb: float, **extra) -> None:
    size = path.stat().st_size
    proc = subprocess.run([sys.executable, __file__, "--child", str(path), fmt, str(chunk_mb)], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    if proc.returncode != 0:
        print(json.dumps({"bench": "ingest_memory", "format": label, "error": proc.stderr.strip().splitlines()[-1:]}), flush=True)
        return
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    decoded_mb = extra.get("json_mb", size / 1e6)
    line = {"bench": "ingest_memory", "format": label, "input_mb": round(size / 1e6, 1), **extra, **r,
            "mb_per_s": round(decoded_mb / r["seconds"], 1) if r["seconds"] else None, "target_peak_mb": 1024}
    if path.suffix == ".gz" and r["seconds"]:
        line["file_mb_per_s"] = round(size / 1e6 / r["seconds"], 1)
    if r.get("values"):
        line["values_per_s"] = round(r["values"] / r["seconds"])
    print(json.dumps(line), flush=True)


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(sys.argv[2], sys.argv[3], float(sys.argv[4]))
        return 0
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dcgm-gb", type=float, default=3.0)
    ap.add_argument("--flat-gb", type=float, default=1.0)
    ap.add_argument("--events-gb", type=float, default=0.5)
    ap.add_argument("--kineto-mb", default="50,100,200")
    ap.add_argument("--kineto-gb", type=float, default=2.5)
    ap.add_argument("--gpus", type=int, default=4096)
    ap.add_argument("--chunk-mb", type=float, default=64.0)
    ap.add_argument("--only", default="dcgm,flat,events,kineto,kineto_large")
    args = ap.parse_args()
    only = set(args.only.split(","))
    tmp = Path(tempfile.mkdtemp(prefix="fleetscope-ingest-memory-"))
    try:
        runs = [("dcgm", "scrapes.prom", lambda p: {"scrapes": write_dcgm(p, args.dcgm_gb, args.gpus, stamped=True), "gpus": args.gpus}, "dcgm"),
                ("flat", "concat.prom", lambda p: {"scrapes": write_dcgm(p, args.flat_gb, args.gpus, stamped=False), "gpus": args.gpus}, "dcgm_no_timestamps"),
                ("events", "events.jsonl", lambda p: {"events": write_events(p, args.events_gb)}, "job_events")]
        for key, name, make, label in runs:
            if key in only:
                path = tmp / name
                extra = make(path)
                measure(label, path, "auto", args.chunk_mb, **extra)
                path.unlink()
                (tmp / "bench.db").unlink(missing_ok=True)
        if "kineto" in only:
            for mb in (float(x) for x in args.kineto_mb.split(",") if x):
                path = tmp / "trace.json"
                copies = write_kineto(path, mb)
                measure("kineto", path, "kineto", args.chunk_mb, copies=copies)
                path.unlink()
                (tmp / "bench.db").unlink(missing_ok=True)
        if "kineto_large" in only:
            free = shutil.disk_usage(tmp).free
            if free < 1.2 * args.kineto_gb * 1e9:
                print(json.dumps({"bench": "ingest_memory", "format": "kineto_large", "error": f"{free / 1e9:.1f} GB free in {tmp}"}))
            else:
                plain, gz = tmp / "large.json", tmp / "large.json.gz"
                extra = write_kineto_large(plain, gz, args.kineto_gb)
                for path in (plain, gz):
                    measure("kineto_large" + (".gz" if path is gz else ""), path, "kineto", args.chunk_mb, **extra)
                    path.unlink()
                    (tmp / "bench.db").unlink(missing_ok=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

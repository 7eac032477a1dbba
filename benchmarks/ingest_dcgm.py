"""Benchmark: parse one dcgm-exporter scrape of a 16,384-GPU fleet with ``ingest.dcgm.parse``.

The scrape follows the structure of the real dcgm-exporter bodies in ``../shared/realdata/telemetry``
(GPU Operator defaults plus the DCP fields of ``dcp-metrics-included.csv``: HELP/TYPE per family, one
line per GPU, labels ``gpu, UUID, pci_bus_id, device, modelName, Hostname, DCGM_FI_DRIVER_VERSION`` and,
for GPUs running a pod, ``container, namespace, pod, pod_uid`` as in the 8xH100 capture). UUIDs, hosts,
pods and values are synthesized; 30 fields per GPU, ~117 MB of text.

The parses run in a fresh child process so that ``peak_rss_mb`` is the parser's (plus the body it was
given), not the generator's. A service parses scrape after scrape in one process, so the child first
parses a small scrape (thread pools, compiled regexes), then the big one ``--runs`` times; the first big
parse also pays the kernel's page faults for memory the process never had, so it is reported apart.
Prints one JSON line per parse, then a summary with the median of the steady-state parses:

    {"bench":"dcgm_parse","gpus":16384,"values":491520,"seconds":...,"values_per_s":...,"peak_rss_mb":...}

Usage: python benchmarks/ingest_dcgm.py [--gpus 16384] [--runs 5]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# (field, prometheus type, help, value generator) in dcgm-exporter's default + DCP order.
FIELDS = (
    ("DCGM_FI_DEV_SM_CLOCK", "gauge", "SM clock frequency (in MHz).", lambda r, busy: str(r.choice((1755, 1980)) if busy else 345)),
    ("DCGM_FI_DEV_MEM_CLOCK", "gauge", "Memory clock frequency (in MHz).", lambda r, busy: "2619"),
    ("DCGM_FI_DEV_MEMORY_TEMP", "gauge", "Memory temperature (in C).", lambda r, busy: str(r.randint(55, 75) if busy else r.randint(30, 45))),
    ("DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (in C).", lambda r, busy: str(r.randint(45, 80) if busy else r.randint(25, 35))),
    ("DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W).", lambda r, busy: f"{r.uniform(350, 700) if busy else r.uniform(60, 120):.6f}"),
    ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "counter", "Total energy consumption since boot (in mJ).", lambda r, busy: str(r.randint(10**9, 10**12))),
    ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "counter", "Total number of PCIe retries.", lambda r, busy: "0"),
    ("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %).", lambda r, busy: str(r.randint(60, 100) if busy else 0)),
    ("DCGM_FI_DEV_MEM_COPY_UTIL", "gauge", "Memory utilization (in %).", lambda r, busy: str(r.randint(10, 60) if busy else 0)),
    ("DCGM_FI_DEV_ENC_UTIL", "gauge", "Encoder utilization (in %).", lambda r, busy: "0"),
    ("DCGM_FI_DEV_DEC_UTIL", "gauge", "Decoder utilization (in %).", lambda r, busy: "0"),
    ("DCGM_FI_DEV_XID_ERRORS", "gauge", "Value of the last XID error encountered.", lambda r, busy: "0"),
    ("DCGM_FI_DEV_FB_FREE", "gauge", "Framebuffer memory free (in MiB).", lambda r, busy: str(r.randint(1000, 40000) if busy else 81080)),
    ("DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer memory used (in MiB).", lambda r, busy: str(r.randint(40000, 80000) if busy else 0)),
    ("DCGM_FI_DEV_FB_RESERVED", "gauge", "Framebuffer memory reserved (in MiB).", lambda r, busy: "479"),
    ("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", "counter", "Total number of NVLink bandwidth counters for all lanes.", lambda r, busy: str(r.randint(0, 10**13))),
    ("DCGM_FI_DEV_VGPU_LICENSE_STATUS", "gauge", "vGPU License status", lambda r, busy: "0"),
    ("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "counter", "Number of remapped rows for uncorrectable errors", lambda r, busy: "0"),
    ("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "counter", "Number of remapped rows for correctable errors", lambda r, busy: "0"),
    ("DCGM_FI_DEV_ROW_REMAP_FAILURE", "gauge", "Whether remapping of rows has failed", lambda r, busy: "0"),
    ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "gauge", "Ratio of time the graphics engine is active.", lambda r, busy: f"{r.random() if busy else 0:.6f}"),
    ("DCGM_FI_PROF_SM_ACTIVE", "gauge", "The ratio of cycles an SM has at least 1 warp assigned.", lambda r, busy: f"{r.random() if busy else 0:.6f}"),
    ("DCGM_FI_PROF_SM_OCCUPANCY", "gauge", "The ratio of number of warps resident on an SM.", lambda r, busy: f"{r.random() if busy else 0:.6f}"),
    ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "gauge", "Ratio of cycles the tensor (HMMA) pipe is active.", lambda r, busy: f"{r.random() if busy else 0:.6f}"),
    ("DCGM_FI_PROF_DRAM_ACTIVE", "gauge", "Ratio of cycles the device memory interface is active sending or receiving data.", lambda r, busy: f"{r.random() if busy else 0:.6f}"),
    ("DCGM_FI_PROF_PIPE_FP64_ACTIVE", "gauge", "Ratio of cycles the fp64 pipes are active.", lambda r, busy: f"{r.random() * 0.1 if busy else 0:.6f}"),
    ("DCGM_FI_PROF_PIPE_FP32_ACTIVE", "gauge", "Ratio of cycles the fp32 pipes are active.", lambda r, busy: f"{r.random() if busy else 0:.6f}"),
    ("DCGM_FI_PROF_PIPE_FP16_ACTIVE", "gauge", "Ratio of cycles the fp16 pipes are active.", lambda r, busy: f"{r.random() if busy else 0:.6f}"),
    ("DCGM_FI_PROF_PCIE_TX_BYTES", "gauge", "The rate of data transmitted over the PCIe bus - including both protocol headers and data payloads - in bytes per second.", lambda r, busy: str(r.randint(10**5, 10**10))),
    ("DCGM_FI_PROF_PCIE_RX_BYTES", "gauge", "The rate of data received over the PCIe bus - including both protocol headers and data payloads - in bytes per second.", lambda r, busy: str(r.randint(10**5, 10**10))),
)

# H100 SXM PCI bus ids as in the 8xH100 capture.
BUS = ("53", "64", "75", "86", "97", "A8", "B9", "CA")


def synth_scrape(gpus: int, *, busy_fraction: float = 0.1, seed: int = 0, first_gpu: int = 0, xids: Mapping[int, int] | None = None) -> bytes:
    """A dcgm-exporter /metrics body for ``gpus`` GPUs, 8 per host (deterministic for a seed).

    ``busy_fraction`` of the GPUs run a pod (and carry its labels); 0.1 gives the ~117 MB per 16,384 GPUs
    that DESIGN.md's performance notes measured. ``first_gpu`` numbers the GPUs (and so the hosts) from
    there, so that slices of one fleet posted apart name distinct hosts; ``xids`` maps a GPU's number to
    the XID its ``DCGM_FI_DEV_XID_ERRORS`` reports (0 elsewhere).
    """
    r = random.Random(seed)
    blocks, busy = [], []
    for i in range(first_gpu, first_gpu + gpus):
        host, g = f"gpu-node-{i // 8 + 1}", i % 8
        block = (
            f'gpu="{g}",UUID="GPU-{uuid.UUID(int=r.getrandbits(128))}",pci_bus_id="00000000:{BUS[g]}:00.0",'
            f'device="nvidia{g}",modelName="NVIDIA H100 80GB HBM3",Hostname="{host}",DCGM_FI_DRIVER_VERSION="580.105.08"'
        )
        b = r.random() < busy_fraction
        if b:
            block += f',container="main",namespace="team-{i // 512}",pod="train-{i // 64}-worker-{i % 64}",pod_uid=""'
        blocks.append(block)
        busy.append(b)
    out = []
    for name, typ, text, gen in FIELDS:
        out.append(f"# HELP {name} {text}\n# TYPE {name} {typ}\n")
        if name == "DCGM_FI_DEV_XID_ERRORS" and xids:
            out.extend(f"{name}{{{block}}} {xids.get(first_gpu + k, 0)}\n" for k, block in enumerate(blocks))
            continue
        out.extend(f"{name}{{{block}}} {gen(r, b)}\n" for block, b in zip(blocks, busy))
    return "".join(out).encode()


def agent_body(host: int) -> bytes:
    """Node ``host``'s exporter body as its agent pushes it (8 GPUs, numbered from ``8 * host``). As in a real
    fleet, and as in the OTLP requests of ``ingest_otlp.py``, one GPU in a thousand reports a sticky XID 13:
    its node's body carries a health event every scrape."""
    first = 8 * host
    return synth_scrape(8, first_gpu=first, seed=host, xids={i: 13 for i in range(first, first + 8) if i % 1000 == 0})


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def _child(path: str, gpus: int, runs: int) -> None:
    sys.path.insert(0, str(ROOT))
    from ingest import dcgm  # lazy: in the measured child only, once the repository is on its path

    ts = datetime(2026, 1, 1, tzinfo=UTC)
    dcgm.parse(synth_scrape(64, seed=1), source="warm-up", ts=ts)
    data = Path(path).read_bytes()
    for run in range(runs):
        t0, c0 = time.perf_counter(), time.process_time()
        batch = dcgm.parse(data, source=path, ts=ts)
        seconds, cpu_seconds = time.perf_counter() - t0, time.process_time() - c0
        values, lexer = batch.values(), batch.meta.get("lexer")
        assert batch.gpu_sample is not None and batch.gpu_sample.height == gpus, batch.rows()
        del batch
        print(
            json.dumps(
                {
                    "bench": "dcgm_parse",
                    "run": run,
                    "lexer": lexer,
                    "gpus": gpus,
                    "values": values,
                    "bytes": len(data),
                    "seconds": round(seconds, 4),
                    "cpu_seconds": round(cpu_seconds, 4),
                    "values_per_s": round(values / seconds),
                    "peak_rss_mb": round(_peak_rss_mb(), 1),
                }
            ),
            flush=True,
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", type=int, default=16384)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        _child(args.child, args.gpus, args.runs)
        return
    body = synth_scrape(args.gpus)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "scrape.prom")
        Path(path).write_bytes(body)
        del body
        out = subprocess.run(
            [sys.executable, __file__, "--child", path, "--gpus", str(args.gpus), "--runs", str(args.runs)],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
    results = [json.loads(line) for line in out.splitlines() if line.strip()]
    for r in results:
        print(json.dumps(r))
    steady = sorted(results[1:] or results, key=lambda r: r["seconds"])
    median = steady[len(steady) // 2]
    summary = {
        "bench": "dcgm_parse_summary",
        "gpus": args.gpus,
        "values": median["values"],
        "bytes": median["bytes"],
        "seconds": median["seconds"],
        "values_per_s": median["values_per_s"],
        "best_values_per_s": steady[0]["values_per_s"],
        "first_parse_seconds": results[0]["seconds"],
        "peak_rss_mb": max(r["peak_rss_mb"] for r in results),
        "runs": args.runs,
        # Other work on the machine slows every figure above; say how much there was.
        "loadavg_1m": round(os.getloadavg()[0], 2),
        "cpus": os.cpu_count(),
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()

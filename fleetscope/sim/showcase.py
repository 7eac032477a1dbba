"""A small, hand-built world around ``gpu_fleet``: jobs with steps and collectives, health events,
nccl-tests runs, job events and findings, so the dashboard has something on every page.

The dashboard's tests, its benchmark and the screenshots use it until the full simulator (Fleet Law jobs,
injected faults, real formats) grows in ``fleetscope.sim``. Everything is deterministic: the same
arguments give the same rows, so tests can assert exact content.
"""

from __future__ import annotations

import datetime as dt
import json

import numpy as np
import polars as pl

from fleetscope import frames as F
from fleetscope.sim.fleet import FleetSpec, gpu_fleet

STRAGGLER_JOB = "job-llm-a"
STRAGGLER_RANK = 5
XID_CODE = 79  # "GPU has fallen off the bus": the classic drain-the-node XID


def showcase(
    spec: FleetSpec, start: dt.datetime, duration_s: int, *, with_telemetry: bool = True, world_sizes: tuple[int, int, int] = (8, 16, 32)
) -> list[F.Batch]:
    """Batches to write in order: the fleet's inventory and samples (unless ``with_telemetry`` is False,
    for callers that seed telemetry themselves), then the jobs and events placed inside
    ``[start, start + duration_s)``. ``world_sizes`` are the three runs' GPU counts (the middle one,
    job-llm-a, is running and has the straggler), capped at the fleet's size."""
    out: list[F.Batch] = []
    fleet = gpu_fleet(spec, start, duration_s if with_telemetry else spec.interval_s)
    if not with_telemetry:
        fleet.gpu_sample = None
    out.append(fleet)
    gpus = fleet.gpu.sort("host", "gpu_index")
    end = start + dt.timedelta(seconds=duration_s)
    rng = np.random.default_rng(spec.seed + 1)
    out.append(_jobs(gpus, start, end, rng, world_sizes))
    out.append(_health(gpus, start, end))
    out.append(_nccl_tests(start, end))
    return out


def _jobs(gpus: pl.DataFrame, start: dt.datetime, end: dt.datetime, rng: np.random.Generator, world_sizes: tuple[int, int, int]) -> F.Batch:
    site = "site-a"
    # Three runs of one model at three world sizes: enough for a scaling-efficiency curve.
    small, mid, large = world_sizes
    runs = [("job-llm-b", small, "finished", 1.00), (STRAGGLER_JOB, mid, "running", 0.55), ("job-llm-c", large, "finished", 0.32)]
    n_gpus = gpus.height
    job_rows, rank_rows, step_rows, coll_rows, ev_rows = [], [], [], [], []
    for job_id, world, status, compute_s in runs:
        world = min(world, n_gpus)
        steps = 40 if job_id == STRAGGLER_JOB else 12
        step_s_nominal = compute_s + 0.25 + 0.05
        t0 = end - dt.timedelta(seconds=steps * step_s_nominal * 1.3 + 60)
        if status == "finished":
            t0 = start + dt.timedelta(seconds=60)
        job_rows.append(
            {
                "job_id": job_id,
                "name": f"pretrain-7b-n{world}",
                "kind": "training",
                "model_name": "llama-7b",
                "world_size": world,
                "site_id": site,
                "owner": "ml-platform",
                "submitted_at": t0 - dt.timedelta(seconds=30),
                "started_at": t0,
                "ended_at": None if status == "running" else t0 + dt.timedelta(seconds=steps * step_s_nominal * 1.3 + 30),
                "status": status,
            }
        )
        for r in range(world):
            g = gpus.row(r, named=True)
            rank_rows.append({"job_id": job_id, "rank": r, "start": t0, "end": None, "gpu_uuid": g["gpu_uuid"], "host": g["host"]})
        for s in range(steps):
            step_start = t0 + dt.timedelta(seconds=s * step_s_nominal * 1.3)
            for r in range(world):
                slow = 1.8 if (job_id == STRAGGLER_JOB and r == STRAGGLER_RANK) else 1.0
                compute = compute_s * slow * (1 + rng.normal(0, 0.02))
                comm, overlap = 0.25, 0.10
                # The other ranks wait for the straggler: their idle time grows by its extra compute.
                idle = 0.05 + (compute_s * 0.8 if job_id == STRAGGLER_JOB and r != STRAGGLER_RANK else 0.0)
                dur = compute + comm - overlap + idle
                step_rows.append(
                    {
                        "job_id": job_id,
                        "rank": r,
                        "step": s,
                        "start": step_start,
                        "end": step_start + dt.timedelta(seconds=dur),
                        "compute_s": compute,
                        "comm_s": comm,
                        "comm_overlap_s": overlap,
                        "idle_s": idle,
                        "tokens": 4096,
                        "model_flops": 6 * 7e9 * 4096,
                    }
                )
                if job_id == STRAGGLER_JOB:
                    for k, (op, size) in enumerate((("all_reduce", 2**20), ("all_reduce", 2**27), ("all_gather", 2**24), ("all_reduce", 2**30))):
                        duration = 5e-5 + size / 380e9 * 2 * (world - 1) / world
                        algbw = size / duration / 1e9
                        coll_rows.append(
                            {
                                "job_id": job_id,
                                "rank": r,
                                "comm_id": "0xabc",
                                "seq": s * 4 + k,
                                "op": op,
                                "bytes": size,
                                "nranks": world,
                                "start": step_start + dt.timedelta(seconds=compute_s * 0.5 + 0.01 * k),
                                "duration_s": duration,
                                "algbw_gbps": algbw,
                                "busbw_gbps": algbw * (2 * (world - 1) / world if op == "all_reduce" else (world - 1) / world),
                                "host": gpus["host"][r],
                                "gpu_uuid": gpus["gpu_uuid"][r],
                            }
                        )
        ev_rows.append({"job_id": job_id, "ts": t0, "kind": "started", "rank": -1})
        for c in range(0, steps, 10):
            cs = t0 + dt.timedelta(seconds=c * step_s_nominal * 1.3 + 0.5)
            ev_rows.append({"job_id": job_id, "ts": cs, "kind": "checkpoint_save_start", "rank": -1, "step": c})
            ev_rows.append({"job_id": job_id, "ts": cs + dt.timedelta(seconds=4), "kind": "checkpoint_save_end", "rank": -1, "step": c})
    ev_rows.append(
        {"job_id": "job-llm-b", "ts": start + dt.timedelta(seconds=120), "kind": "failure", "rank": -1, "step": 3, "payload": json.dumps({"cause": "xid_79"})}
    )
    ev_rows.append({"job_id": "job-llm-b", "ts": start + dt.timedelta(seconds=150), "kind": "restart", "rank": -1, "step": 3})
    ev_rows.append(
        {"job_id": "job-llm-c", "ts": start + dt.timedelta(seconds=200), "kind": "failure", "rank": -1, "step": 5, "payload": json.dumps({"cause": "nccl_timeout"})}
    )
    ev_rows.append({"job_id": "job-llm-c", "ts": start + dt.timedelta(seconds=260), "kind": "preempted", "rank": -1, "step": 7})
    finding = pl.DataFrame(
        [
            {
                "analyzer": "stragglers",
                "kind": "straggler",
                "subject": f"job:{STRAGGLER_JOB}/rank:{STRAGGLER_RANK}",
                "window_start": end - dt.timedelta(seconds=600),
                "window_end": end,
                "severity": "warning",
                "score": 1.8,
                "summary": f"rank {STRAGGLER_RANK} runs 1.8x slower than the median rank; every step waits for it",
                "evidence": json.dumps({"slowdown_ratio": 1.8}),
            },
            {
                "analyzer": "sdc",
                "kind": "sdc_suspect",
                "subject": f"gpu:{gpus['gpu_uuid'][9]}",
                "window_start": end - dt.timedelta(seconds=900),
                "window_end": end,
                "severity": "critical",
                "score": 0.97,
                "summary": "parameter checksum diverged from the other data-parallel replicas",
                "evidence": json.dumps({"step": 17}),
            },
        ]
    )
    return F.Batch(
        source="sim:showcase/jobs",
        job=pl.DataFrame(job_rows),
        job_rank=pl.DataFrame(rank_rows),
        step=pl.DataFrame(step_rows),
        collective=pl.DataFrame(coll_rows),
        job_event=pl.DataFrame(ev_rows, schema={"job_id": pl.String, "ts": F.UTC_US, "kind": pl.String, "rank": pl.Int64, "step": pl.Int64, "payload": pl.String}),
        finding=finding,
    )


def _health(gpus: pl.DataFrame, start: dt.datetime, end: dt.datetime) -> F.Batch:
    def g(i: int) -> dict:
        return gpus.row(i, named=True)

    mid = start + (end - start) / 2
    rows = [
        (end - dt.timedelta(seconds=300), g(8)["host"], g(8)["gpu_uuid"], "xid", XID_CODE, "GPU has fallen off the bus"),
        (end - dt.timedelta(seconds=200), g(8)["host"], g(8)["gpu_uuid"], "xid", XID_CODE, "GPU has fallen off the bus"),
        (mid, g(9)["host"], g(9)["gpu_uuid"], "sdc", 0, "checksum mismatch against replica"),
        (mid, g(17)["host"], g(17)["gpu_uuid"], "ecc", 48, "double-bit ECC error"),
        (start + dt.timedelta(seconds=60), g(3)["host"], g(3)["gpu_uuid"], "thermal", 0, "thermal slowdown"),
        (end - dt.timedelta(seconds=100), g(24)["host"], "", "nccl_warn", 0, "NET/IB : Got completion with error 12"),
    ]
    df = pl.DataFrame(rows, schema={"ts": F.UTC_US, "host": pl.String, "gpu_uuid": pl.String, "kind": pl.String, "code": pl.Int64, "message": pl.String}, orient="row")
    return F.Batch(source="sim:showcase/health", health_event=df.with_columns(source=pl.lit("sim")))


def _nccl_tests(start: dt.datetime, end: dt.datetime) -> F.Batch:
    rows = []
    # Two all_reduce sweeps, the second after a fabric fix: bus bandwidth saturates toward the link's peak.
    for run, (ts, peak) in enumerate(((start + dt.timedelta(seconds=30), 310.0), (end - dt.timedelta(seconds=400), 385.0))):
        for e in range(3, 31, 3):
            size = 2**e
            for in_place in (False, True):
                busbw = peak * size / (size + 2**22)
                nranks = 16
                algbw = busbw / (2 * (nranks - 1) / nranks)
                rows.append(
                    {
                        "run_id": f"nccl-tests-{run}",
                        "op": "all_reduce",
                        "size_bytes": size,
                        "in_place": in_place,
                        "ts": ts,
                        "nranks": nranks,
                        "count": size // 4,
                        "dtype": "float",
                        "redop": "sum",
                        "root": -1,
                        "time_s": size / (algbw * 1e9) if algbw > 0 else None,
                        "algbw_gbps": algbw,
                        "busbw_gbps": busbw,
                        "wrong": 0,
                        "hosts": "site-a-node-000,site-a-node-001",
                    }
                )
    return F.Batch(source="sim:showcase/nccl_tests", nccl_test=pl.DataFrame(rows))

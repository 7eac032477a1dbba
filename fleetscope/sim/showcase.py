"""A small, hand-built world around ``gpu_fleet``: jobs with steps and collectives, health events,
nccl-tests runs, job events and findings, so the dashboard has something on every page.

The dashboard's tests, its benchmark and the screenshots use it until the full simulator (Fleet Law jobs,
injected faults, real formats) grows in ``fleetscope.sim``. Everything is deterministic: the same
arguments give the same rows, so tests can assert exact content.
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import numpy as np
import polars as pl

from fleetscope.core import frames as F
from fleetscope.settings import Settings
from fleetscope.sim.fleet import FleetSpec, gpu_fleet
from fleetscope.store import Store
from fleetscope.services import jobs as analysis
from fleetscope.services import audit as audit_service
from fleetscope.services import energy_rollup
from fleetscope.services import health as health_service
from fleetscope.services import governance as gs
from fleetscope.services.alerting import state as alert_state
from fleetscope.services.alerting.rules import load_config
from fleetscope.sim.lineage import lineage_events
from fleetscope.sim.predictions import prediction_table
from governance.registry import DatasetEntry, ModelEntry
from fleetscope.door import ingestion
from fleetscope.services import monitoring as monitoring_service
from fleetscope.services import tiers as tiers_service
from fleetscope.sim.predictions import credit_stream

STRAGGLER_JOB = "job-llm-a"
STRAGGLER_RANK = 5
XID_CODE = 79  # "GPU has fallen off the bus": the classic drain-the-node XID

# A scaling sweep of a second model whose step times follow the Fleet Law exactly (docs/ARCHITECTURE.md, with
# analyzers.c3.fit_fleet_law's ring comm term): T(N) = a/N + b·2(N−1) + c. With these constants the
# step time is smallest at N* = sqrt(a / 2b) ≈ 31.6 GPUs: the 64-GPU run is slower than the 32-GPU one.
SWEEP_MODEL = "gpt-1.3b"
SWEEP_WORLD_SIZES = (4, 8, 16, 32, 64)
SWEEP_A_S, SWEEP_B_S, SWEEP_C_S = 8.0, 0.004, 0.1
SWEEP_STEPS = 6


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
    out.append(_sweep(gpus, start))
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
            # Step starts as the goodput library records them (analyzers.goodput reads these).
            ev_rows.append({"job_id": job_id, "ts": step_start, "kind": "step", "rank": -1, "step": s})
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


def sweep_step_s(world_size: int) -> float:
    """The sweep's step time at ``world_size`` GPUs (the Fleet Law with SWEEP_A_S, SWEEP_B_S, SWEEP_C_S)."""
    return SWEEP_A_S / world_size + SWEEP_B_S * 2 * (world_size - 1) + SWEEP_C_S


def _sweep(gpus: pl.DataFrame, start: dt.datetime) -> F.Batch:
    """Finished runs of SWEEP_MODEL, one per world size (capped at the fleet), early in the window: the
    Jobs page's Fleet Law fit needs three or more."""
    job_rows, rank_rows, step_rows, ev_rows = [], [], [], []
    sizes = sorted({min(n, gpus.height) for n in SWEEP_WORLD_SIZES})
    for k, world in enumerate(sizes):
        job_id = f"job-sweep-n{world}"
        t0 = start + dt.timedelta(seconds=120 + 60 * k)
        step_s = sweep_step_s(world)
        end = t0 + dt.timedelta(seconds=SWEEP_STEPS * step_s)
        job_rows.append({"job_id": job_id, "name": f"scaling-sweep-n{world}", "kind": "training", "model_name": SWEEP_MODEL, "world_size": world,
                         "site_id": "site-a", "owner": "ml-platform", "submitted_at": t0, "started_at": t0, "ended_at": end, "status": "finished"})
        for r in range(world):
            rank_rows.append({"job_id": job_id, "rank": r, "start": t0, "end": end, "gpu_uuid": gpus["gpu_uuid"][r], "host": gpus["host"][r]})
            for s in range(SWEEP_STEPS):
                at = t0 + dt.timedelta(seconds=s * step_s)
                if r == 0:
                    ev_rows.append({"job_id": job_id, "ts": at, "kind": "step", "rank": -1, "step": s})
                step_rows.append({"job_id": job_id, "rank": r, "step": s, "start": at, "end": at + dt.timedelta(seconds=step_s),
                                  "compute_s": SWEEP_A_S / world, "comm_s": SWEEP_B_S * 2 * (world - 1), "comm_overlap_s": 0.0,
                                  "idle_s": SWEEP_C_S, "tokens": 2048, "model_flops": 6 * 1.3e9 * 2048})
        ev_rows += [{"job_id": job_id, "ts": t0, "kind": "started", "rank": -1, "step": None},
                    {"job_id": job_id, "ts": end, "kind": "finished", "rank": -1, "step": SWEEP_STEPS - 1}]
    return F.Batch(
        source="sim:showcase/sweep",
        job=pl.DataFrame(job_rows),
        job_rank=pl.DataFrame(rank_rows),
        step=pl.DataFrame(step_rows),
        job_event=pl.DataFrame(ev_rows, schema={"job_id": pl.String, "ts": F.UTC_US, "kind": pl.String, "rank": pl.Int64, "step": pl.Int64}),
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


# The worker's health tick reads the last 15 minutes of samples (fleetscope.worker.health_window).
HEALTH_WINDOW = dt.timedelta(seconds=900)


def run_services(store: Store, settings: Settings, start: dt.datetime, end: dt.datetime, *, rollup: bool = True, health: bool = True,
                 seed: int = 7) -> dict[str, Any]:
    """What the worker and the API would have made of the showcase world by ``end``, through their own
    service functions: the energy roll-up of ``[start, end)`` (unless the caller wrote its own), every
    job's analyses, the health tick's findings over the last 15 minutes (unless ``health`` is False, for a
    caller that writes the telemetry afterwards), one alert evaluation (its notifications go to the default route's receiver, which is
    not configured here, so they are dead letters), the models registered with a fairness evaluation of a
    biased classifier, one EU AI Act audit with its reports and a signed export. ``settings.data_dir``
    receives the reports, the export, the signing key and the audit log's key and checkpoints."""

    out: dict[str, Any] = {}
    audit_service.bind(store, settings)  # the audit log's key and checkpoints go beside the reports
    if rollup:
        out["energy"] = energy_rollup.rollup_window(store, start, end)
        out["tiers"] = tiers_service.advance(store, end + dt.timedelta(minutes=5))
    job_ids = store.read("job", columns=["job_id"])["job_id"].sort().to_list()
    out["jobs"] = {j: analysis.analyze_job(store, j, now=end).to_dict() for j in job_ids}
    if health:
        out["health"] = health_service.health_window(store, max(start, end - HEALTH_WINDOW), end)["findings"].height
    out["alerts"] = alert_state.evaluate_and_dispatch(store, load_config(), now=end).firing
    # Lineage as OpenLineage events through the API's path: llama-7b trains downstream of the quarantined
    # forum dump, the sweep's model on licensed books only (fleetscope.sim.lineage).
    job = store.read("job")
    trained = [job.filter(pl.col("job_id") == STRAGGLER_JOB), job.filter(pl.col("model_name") == SWEEP_MODEL).sort("world_size").tail(1)]
    lin = lineage_events(seed, start, [(r["job_id"], r["model_name"], r["started_at"], r["ended_at"] or end) for t in trained for r in t.iter_rows(named=True)])
    for event in lin.events:
        gs.record_lineage(store, json.dumps(event).encode(), source="showcase")
    for d in lin.registry["datasets"]:
        gs.put_dataset(store, DatasetEntry(**d), actor="showcase")
    for m in lin.registry["models"]:
        gs.put_model(store, ModelEntry(**{**m, "training_run_ids": tuple(m["training_run_ids"])}), actor="showcase")
    gs.put_model(store, ModelEntry("loan-screen", "1", intended_purpose="credit scoring of loan applicants"), actor="showcase")
    table = prediction_table(600, np.random.default_rng(seed))  # bootstrap CIs cost time per row; 600 keeps every group above 30
    out["fairness"] = gs.evaluate_fairness(store, "loan-screen", table.frame.write_csv().encode(), sensitive=list(table.sensitive), fmt="csv",
                                           actor="showcase")["passed"]
    # loan-screen in service: a day of reference, then hours whose applicants drift (post-market monitoring)

    first = end.replace(minute=0, second=0, microsecond=0) - dt.timedelta(hours=29)
    stream = credit_stream("loan-screen", "1", first, hours=28, rate=100, rng=np.random.default_rng(seed), drift_from_hour=26, bias=1.5)
    ingestion.ingest_bytes(store, stream.jsonl, source="sim:showcase/monitoring")
    out["monitoring"] = monitoring_service.evaluate(store, "loan-screen", "1", now=end)["findings"]
    audit_service.declare(store, "llama-7b", "1", "classification", {"general_purpose": True}, entered_by="showcase")
    audit_service.declare(store, "loan-screen", "1", "area", {"area": "essential_services"}, entered_by="showcase")  # Annex III 5(b)
    # Declarations, the registry and fairness evaluations are stamped with the wall clock, so the audit is too.
    out["audit"] = audit_service.run_audit(store, settings, trigger="showcase", requested_by="showcase")
    out["export"] = audit_service.make_export(store, settings, audit_id=out["audit"]["audit_id"], requested_by="showcase")
    return out

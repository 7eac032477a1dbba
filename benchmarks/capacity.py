"""Capacity run (README "Capacity model"): a simulated fleet pushed through the API into PostgreSQL, then the
worker's sweeps and the reads over what it pushed, per GPU and per day.

The fleet is the simulator's (``fleetscope.sim``: ``build_topology``, ``GpuTelemetry`` for the readings with
energy counters that integrate power, ``DcgmWriter`` for one dcgm-exporter body per node): ``--gpus`` GPUs
(100,000 by default), 8 a node, 4 sites, three nodes in four running a job. On a PostgreSQL scratch database:

1. ``ingest``: ``--rounds`` push rounds through a running ``fleetscope serve`` (``--workers`` processes), each
   round every node's body to ``POST /api/v1/ingest/dcgm?ts=..`` over ``--connections`` keep-alive connections
   (the agent's ``batch`` push), the rounds back to back with the scrape time 10 s apart (time-compressed). The
   first round is the service meeting every node (inventory, series); the rest are the steady state: pushes/s,
   values/s, p50/p99, seconds per round against the 10 s interval (``lag_ratio`` over 1: one API machine of
   this size falls behind by that factor), and the CPU of the API processes and of PostgreSQL's backends per
   round, per push and per GPU-day (x 8,640 scrapes).
2. ``fill``: the rest of ``--fill-minutes`` of the same fleet at the same 10 s step, written in-process with
   ``Store.write`` (no HTTP): the next scrape's bodies parsed in one piece by ``ingest.dcgm``, then that batch
   at each later time with power and the energy counter from the simulator's readings (``fill``): the data
   the sweeps read, loaded faster than the API takes it.
3. ``sweeps``, in this process as a worker runs them, CPU of this process and of PostgreSQL's backends each:
   the energy roll-up of one minute and of a 5-minute window, unsharded (``rollup_window``) and in ``--shards``
   shards (``rollup_shard`` each, then ``rollup_sums``); the minute tier of one minute and then of the next
   four (``tiers.advance``), the hour tier's roll-up of those minutes (``tier_rollup.hour_rollup`` over the
   minute tier, what ``advance`` runs per hour); the health sweep of a 5-minute window unsharded and in shards
   (``health_window(part=...)``).
4. ``storage``: rows and ``pg_total_relation_size`` of the raw day partition, the minute and hour tiers and
   ``gpu_energy_minute`` (the tiers and energy after ``VACUUM FULL``, since the sharded runs rewrite the same
   rows), per row and per GPU-day (raw 8,640 rows at 10 s, minute tier and energy 1,440, hour tier 24).
5. ``job``: ``benchmarks/job_analysis.py``'s 1-hour 1,024-rank job, per-minute analysis, on this database.
6. ``dashboard``: the Overview and Energy & Carbon pages in headless Chromium (``benchmarks/dashboard.py``'s
   machinery) over this database: the fleet's last minutes of raw samples, its minute tier and energy minutes.
   Not a day: a day of 100,000 GPUs is 864 M raw rows (about 350 GB at 3.5 MB a GPU-day), more than this
   machine's disk.
7. ``model``: ``capacity_model`` of the run's per-GPU figures (README "Capacity model"); ``--compare`` checks the
   model's linearity: one run's per-GPU figures scaled to another run's fleet against what that run measured.

Every line is JSON; the first has the load average, since the 2-core machine is shared: CPU seconds are the
figure to trust, wall seconds what the machine gave at that load.

    python benchmarks/capacity.py [--gpus 100000] [--rounds 3] [--fill-minutes 6] [--shards 4] [--connections 16]
                                  [--workers 2] [--skip job,dashboard] [--postgres URL]
    python benchmarks/capacity.py --compare run16k.jsonl run100k.jsonl
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import datetime as dt
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
sys.path.insert(0, str(_HERE.parent))

import numpy as np  # noqa: E402
import polars as pl  # noqa: E402
from sqlalchemy import text  # noqa: E402

from analyzers import tiers as tier_rollup  # noqa: E402
from fleetscope.core import frames as F  # noqa: E402
from fleetscope.core.tier_frames import GPU_SAMPLE_HOUR  # noqa: E402
from fleetscope.services import auth, energy_rollup, health, tiers  # noqa: E402
from fleetscope.sim import formats  # noqa: E402
from fleetscope.sim.faults import FaultPlan  # noqa: E402
from fleetscope.sim.fleet import Topology, build_topology  # noqa: E402
from fleetscope.sim.spec import GPU_MODELS  # noqa: E402
from fleetscope.sim.telemetry import GpuActivity, GpuTelemetry  # noqa: E402
from fleetscope.store import Store, db  # noqa: E402
from ingest import dcgm  # noqa: E402

INTERVAL_S = 10
SCRAPES_PER_DAY = 86_400 // INTERVAL_S
GPUS_PER_NODE = 8
SITES = 4
MACHINE_CORES = 2
CORE_BUSY = 0.7
"""Share of a machine's cores the model plans to keep busy: headroom for bursts, catching up after an outage,
and the reads nobody scheduled."""
ENERGY_WINDOW_MIN = 10
"""Beat's energy roll-up re-rolls the last 10 minutes every minute (``worker.tasks.energy_rollup``)."""
HEALTH_WINDOW_S, HEALTH_EVERY_S = 900, 300
"""Beat's health sweep: a 15-minute window every 5 minutes (``worker.tasks.health_window``,
``services.scheduled.WINDOW_BEAT``), so each sample is read three times."""

from benchmarks import _server  # noqa: E402

_load = _server.sibling

def _emit(**row: object) -> None:
    print(json.dumps(row), flush=True)


def _load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def capacity_model(per_gpu_day: dict[str, float], gpus: int, *, cores: int = MACHINE_CORES, busy: float = CORE_BUSY) -> dict[str, Any]:
    """Machines of ``cores`` cores, kept ``busy`` of the time, for ``gpus`` GPUs: for each role (``api``,
    ``database``, ``worker``) its CPU seconds per GPU-day times the GPUs, over the CPU seconds one machine gives
    in a day (``cores`` x 86,400 x ``busy``), rounded up. ``per_gpu_day`` maps a role to CPU-s per GPU-day;
    a linear model (per-GPU costs do not grow with the fleet), which the measured runs check."""
    if gpus <= 0 or cores <= 0 or not 0 < busy <= 1:
        raise ValueError(f"gpus, cores must be positive and busy in (0, 1], not {gpus}, {cores}, {busy}")
    machine_s = cores * 86_400 * busy
    out: dict[str, Any] = {"gpus": gpus, "machine_cpu_s_per_day": round(machine_s)}
    for role, cpu_s in per_gpu_day.items():
        if cpu_s < 0:
            raise ValueError(f"CPU seconds per GPU-day of {role} is negative: {cpu_s}")
        need = cpu_s * gpus
        # less a rounding error's worth, so a load that exactly fills n machines asks for n
        out[role] = {"cpu_s_per_day": round(need), "cores": round(need / 86_400, 2), "machines": max(1, math.ceil(need / machine_s - 1e-9))}
    return out


def predicted_round_s(cpu_s_per_gpu_round: float, gpus: int, cores: int = MACHINE_CORES) -> float:
    """Wall seconds of one push round of ``gpus`` GPUs on one machine of ``cores`` cores whose API and
    PostgreSQL share them, if the round is bound by CPU (``cpu_s_per_gpu_round``: both together per GPU)."""
    return cpu_s_per_gpu_round * gpus / cores


def per_gpu_figures(lines: list[dict[str, Any]]) -> dict[str, float]:
    """The figures of one run's JSON lines that the model takes as linear in GPUs, per GPU: CPU seconds per
    push round (API, PostgreSQL), per 5-minute energy roll-up and health sweep, per minute of the minute tier,
    and bytes per GPU-day of each tier."""
    by = {ln.get("what"): ln for ln in lines if ln.get("bench") == "capacity"}
    gpus = by["start"]["gpus"]
    ing = by["ingest"]
    out = {"api_cpu_s_per_round": ing["api_cpu_s_per_round"] / gpus, "pg_cpu_s_per_round": ing["pg_cpu_s_per_round"] / gpus}
    if "energy_rollup" in by:
        out["energy_5min_cpu_s"] = (by["energy_rollup"]["energy_5min"]["worker_cpu_s"] + by["energy_rollup"]["energy_5min"]["pg_cpu_s"]) / gpus
        tm = by["tier_rollup"]["tier_minute_4min"]
        out["tier_minute_cpu_s_per_min"] = (tm["worker_cpu_s"] + tm["pg_cpu_s"]) / 4 / gpus
        h = by["health_sweep"]["health_5min"]
        out["health_5min_cpu_s"] = (h["worker_cpu_s"] + h["pg_cpu_s"]) / gpus
    for tier in ("raw", "minute", "hour", "energy_minute"):
        if tier in by.get("storage", {}):
            out[f"{tier}_bytes_per_gpu_day"] = float(by["storage"][tier]["bytes_per_gpu_day"])
    return out


def compare_runs(small: list[dict[str, Any]], large: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """For each per-GPU figure: what the smaller run predicts for the larger fleet (linear in GPUs), what the
    larger run measured, and measured over predicted (1.0: the linear model holds)."""
    gs = next(ln["gpus"] for ln in small if ln.get("what") == "start")
    gl = next(ln["gpus"] for ln in large if ln.get("what") == "start")
    a, b = per_gpu_figures(small), per_gpu_figures(large)
    out = []
    for k in a.keys() & b.keys():
        scale = 1 if k.endswith("_per_gpu_day") else gl
        predicted, measured = a[k] * scale, b[k] * scale
        out.append({"bench": "capacity", "what": "model_check", "figure": k, "from_gpus": gs, "to_gpus": gl,
                    "predicted": round(predicted, 3), "measured": round(measured, 3),
                    "measured_over_predicted": round(measured / predicted, 2) if predicted else None})
    return sorted(out, key=lambda r: r["figure"])


# --- the simulated fleet --------------------------------------------------------------------------------


def fleet_topology(gpus: int) -> Topology:
    """``gpus`` GPUs, 8 a node, on 4 sites of equal racks (at most 32 nodes a rack)."""
    if gpus % (GPUS_PER_NODE * SITES):
        raise ValueError(f"--gpus {gpus}: must be a multiple of {GPUS_PER_NODE * SITES} (8 GPUs a node, 4 sites)")
    per_site = gpus // GPUS_PER_NODE // SITES
    per_rack = max(d for d in range(1, 33) if per_site % d == 0)
    return build_topology(SITES, per_site // per_rack, per_rack, GPUS_PER_NODE, GPU_MODELS["H100-SXM"].name, seed=22)


def fleet_telemetry(topo: Topology) -> GpuTelemetry:
    rng = np.random.default_rng(22)
    busy_node = rng.random(len(topo.hosts)) < 0.75
    job_of_gpu = np.where(np.repeat(busy_node, GPUS_PER_NODE), 0, -1).astype(np.int64)
    act = GpuActivity(job_of_gpu, [[(-1e12, 1e12)]])
    quiet = FaultPlan(by_job={}, faults=[], xids={}, thermal_gpu=None, slow_link_node=None, row_remap=None)
    return GpuTelemetry(topo, GPU_MODELS["H100-SXM"], act, quiet, rng)


def _inventory(store: Any, topo: Topology) -> None:
    """Sites and hosts (the pushes name GPUs and hosts, not sites): what the per-site sums group by."""
    store.write(F.Batch(source="bench:capacity",
                        site=pl.DataFrame({"site_id": list(topo.sites), "country": "FRA", "declared_pue": 1.2}),
                        host=pl.DataFrame({"host": list(topo.hosts), "site_id": list(topo.host_site)})))


# --- 1. ingest through the API --------------------------------------------------------------------------


async def _round(agents: Any, base: str, reqs: list[bytes], connections: int) -> tuple[float, list[float], dict[int, int]]:
    host, port = base.split("//")[1].split(":")
    work: asyncio.Queue = asyncio.Queue()
    for r in reqs:
        work.put_nowait(r)
    latencies: list[float] = []
    statuses: dict[int, int] = {}
    t = time.perf_counter()
    await asyncio.gather(*(agents._connection(host, int(port), work, latencies, statuses) for _ in range(connections)))
    return time.perf_counter() - t, latencies, statuses


def bench_ingest(url: str, topo: Topology, telem: GpuTelemetry, writer: formats.DcgmWriter, t0: dt.datetime, args: argparse.Namespace) -> dict[str, Any]:
    agents, server = _load("ingest_agents"), _server
    started: list[int] = []
    rounds: list[dict[str, Any]] = []
    with server.served_api(url, args.workers, started=started) as (base, token):
        hh = base.split("//")[1]
        watch = server.CpuWatch(f" {url.rsplit('/', 1)[1]} ")
        try:
            for r in range(args.rounds):
                when = t0 + dt.timedelta(seconds=INTERVAL_S * r)
                stamp = when.isoformat().replace("+", "%2B")
                bodies = writer.bodies(telem.scrape(float(INTERVAL_S * r)))
                reqs = [agents._request(f"/api/v1/ingest/dcgm?ts={stamp}&source=agent-{h}", hh, body, "text/plain", token)
                        for h, body in zip(topo.hosts, bodies)]
                del bodies
                api0, pg0 = server.cpu_seconds(started[0]), watch.sample()
                seconds, lat, st = asyncio.run(_round(agents, base, reqs, args.connections))
                rounds.append({"seconds": seconds, "latencies": lat, "statuses": st, "api_cpu_s": server.cpu_seconds(started[0]) - api0,
                               "pg_cpu_s": watch.sample() - pg0, "bytes": sum(len(q) for q in reqs)})
                _emit(bench="capacity", what="ingest_round", gpus=topo.n_gpus, round=r, seconds=round(seconds, 2), pushes=len(lat),
                      statuses={str(k): v for k, v in sorted(st.items())}, api_cpu_s=round(rounds[-1]["api_cpu_s"], 2),
                      pg_cpu_s=round(rounds[-1]["pg_cpu_s"], 2), load=_load_average())
        finally:
            watch.close()
    steady = rounds[1:] or rounds
    n_push = sum(len(r["latencies"]) for r in steady)
    secs = sum(r["seconds"] for r in steady)
    lat = [x for r in steady for x in r["latencies"]]
    api_cpu = sum(r["api_cpu_s"] for r in steady) / len(steady)
    pg_cpu = sum(r["pg_cpu_s"] for r in steady) / len(steady)
    values_per_push = 30 * GPUS_PER_NODE
    round_s = secs / len(steady)
    out = {
        "gpus": topo.n_gpus, "nodes": len(topo.hosts), "rounds": args.rounds, "steady_rounds": len(steady), "workers": args.workers,
        "connections": args.connections, "push_bytes": round(statistics.mean(r["bytes"] for r in rounds) / len(topo.hosts)),
        "first_round_s": round(rounds[0]["seconds"], 2), "steady_round_s": round(round_s, 2), "interval_s": INTERVAL_S,
        "lag_ratio": round(round_s / INTERVAL_S, 2), "lag_s_per_interval": round(max(0.0, round_s - INTERVAL_S), 2),
        "pushes_per_s": round(n_push / secs), "values_per_s": round(n_push * values_per_push / secs),
        "p50_ms": round(statistics.median(lat) * 1e3, 1), "p99_ms": round(sorted(lat)[int(0.99 * (len(lat) - 1))] * 1e3, 1),
        "statuses": {str(k): v for k, v in sorted(_merge(r["statuses"] for r in rounds).items())},
        "api_cpu_s_per_round": round(api_cpu, 2), "pg_cpu_s_per_round": round(pg_cpu, 2),
        "api_cpu_ms_per_push": round(api_cpu * 1e3 / len(topo.hosts), 2), "pg_cpu_ms_per_push": round(pg_cpu * 1e3 / len(topo.hosts), 2),
        "api_cpu_s_per_gpu_day": round(api_cpu / topo.n_gpus * SCRAPES_PER_DAY, 2),
        "pg_cpu_s_per_gpu_day": round(pg_cpu / topo.n_gpus * SCRAPES_PER_DAY, 2),
        "predicted_round_s": round(predicted_round_s((api_cpu + pg_cpu) / topo.n_gpus, topo.n_gpus), 2),
    }
    _emit(bench="capacity", what="ingest", **out, load=_load_average())
    return out


def _merge(dicts: Any) -> dict[int, int]:
    out: dict[int, int] = {}
    for d in dicts:
        for k, v in d.items():
            out[k] = out.get(k, 0) + v
    return out


# --- 2. the rest of the minutes, written directly -------------------------------------------------------


def fill(store: Any, topo: Topology, telem: GpuTelemetry, writer: formats.DcgmWriter, t0: dt.datetime, first: int, last: int) -> None:
    """Scrapes ``first..last`` written through ``Store.write``. The first is every node's body parsed by
    ``ingest.dcgm`` in one piece; the later ones are that batch at their own time with power and the energy
    counter from the simulator's next readings (what the energy roll-up integrates), the other fields held:
    parsing 12,500 bodies a scrape would take this 2-core machine longer than the sweeps it feeds."""
    t = time.perf_counter()
    rows = 0
    base = dcgm.parse(b"".join(writer.bodies(telem.scrape(float(INTERVAL_S * first)))), source="bench:capacity:fill",
                      ts=t0 + dt.timedelta(seconds=INTERVAL_S * first))
    uuids = pl.Series("gpu_uuid", list(topo.gpu_uuid))
    for k in range(first, last + 1):
        at = t0 + dt.timedelta(seconds=INTERVAL_S * k)
        batch = base
        if k > first:
            v = telem.scrape(float(INTERVAL_S * k))
            now = pl.DataFrame({"gpu_uuid": uuids, "power_w": v["DCGM_FI_DEV_POWER_USAGE"], "energy_j": v["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"] * 1e-3})
            sample = (base.gpu_sample.drop("power_w", "energy_j").join(now, on="gpu_uuid", how="left")
                      .with_columns(ts=pl.lit(at).cast(base.gpu_sample.schema["ts"])).select(base.gpu_sample.columns))
            metric = None if base.metric_sample is None else base.metric_sample.with_columns(ts=pl.lit(at).cast(base.metric_sample.schema["ts"]))
            batch = dataclasses.replace(base, source=f"bench:capacity:{k}", gpu_sample=sample, metric_sample=metric)
        rows += store.write(batch).written.get("gpu_sample", 0)
    _emit(bench="capacity", what="fill", gpus=topo.n_gpus, scrapes=last - first + 1, rows=rows, seconds=round(time.perf_counter() - t, 1),
          load=_load_average())


# --- 3. the worker's sweeps -----------------------------------------------------------------------------


class Meter:
    """Wall seconds, this process's CPU and PostgreSQL's backends' CPU of one call."""

    def __init__(self, url: str):
        server = _server
        self.watch = server.CpuWatch(f" {url.rsplit('/', 1)[1]} ")

    def run(self, fn: Any, *a: Any, **kw: Any) -> tuple[Any, dict[str, float]]:
        pg0, c0, t0 = self.watch.sample(), time.process_time(), time.perf_counter()
        out = fn(*a, **kw)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        return out, {"seconds": round(wall, 2), "worker_cpu_s": round(cpu, 2), "pg_cpu_s": round(self.watch.sample() - pg0, 2)}

    def close(self) -> None:
        self.watch.close()


def bench_sweeps(store: Any, url: str, gpus: int, t0: dt.datetime, shards: int) -> dict[str, Any]:

    meter = Meter(url)
    out: dict[str, Any] = {}
    try:
        m1 = (t0 + dt.timedelta(minutes=1), t0 + dt.timedelta(minutes=2))
        m5 = (t0 + dt.timedelta(minutes=1), t0 + dt.timedelta(minutes=6))
        _, out["energy_1min"] = meter.run(energy_rollup.rollup_window, store, *m1)
        _, out["energy_5min"] = meter.run(energy_rollup.rollup_window, store, *m5)
        shard_parts = []
        for i in range(shards):
            shard_parts.append(meter.run(energy_rollup.rollup_shard, store, *m5, i, shards)[1])
        _, sums = meter.run(energy_rollup.rollup_sums, store, *m5)
        out["energy_5min_sharded"] = {"shards": shards, "max_shard_s": max(p["seconds"] for p in shard_parts),
                                      "sum_shard_s": round(sum(p["seconds"] for p in shard_parts), 2),
                                      "sums_s": sums["seconds"],
                                      "worker_cpu_s": round(sum(p["worker_cpu_s"] for p in shard_parts) + sums["worker_cpu_s"], 2),
                                      "pg_cpu_s": round(sum(p["pg_cpu_s"] for p in shard_parts) + sums["pg_cpu_s"], 2)}
        _emit(bench="capacity", what="energy_rollup", gpus=gpus, **out, load=_load_average())

        settle = tiers.SETTLE
        _, out["tier_minute_1min"] = meter.run(tiers.advance, store, t0 + dt.timedelta(minutes=1) + settle)
        _, out["tier_minute_4min"] = meter.run(tiers.advance, store, t0 + dt.timedelta(minutes=5) + settle)

        def hour_of_minutes() -> int:
            minutes = store.read("gpu_sample_minute", start=t0, end=t0 + dt.timedelta(minutes=5))
            rolled = tier_rollup.hour_rollup(minutes)
            store.write_frames([(GPU_SAMPLE_HOUR, rolled)], source="bench:capacity:hour")
            return minutes.height

        minute_rows, out["tier_hour_of_5min"] = meter.run(hour_of_minutes)
        _emit(bench="capacity", what="tier_rollup", gpus=gpus, minute_rows_read=minute_rows,
              **{k: out[k] for k in ("tier_minute_1min", "tier_minute_4min", "tier_hour_of_5min")}, load=_load_average())

        found, out["health_5min"] = meter.run(health.health_window, store, *m5)
        parts = [meter.run(health.health_window, store, *m5, part=(i, shards))[1] for i in range(shards)]
        _, fleet = meter.run(health.health_window, store, *m5, part="fleet")
        out["health_5min_sharded"] = {"shards": shards, "max_shard_s": max(p["seconds"] for p in parts), "fleet_part_s": fleet["seconds"],
                                      "worker_cpu_s": round(sum(p["worker_cpu_s"] for p in parts) + fleet["worker_cpu_s"], 2),
                                      "pg_cpu_s": round(sum(p["pg_cpu_s"] for p in parts) + fleet["pg_cpu_s"], 2)}
        _emit(bench="capacity", what="health_sweep", gpus=gpus, window_s=300, findings=found["findings"].height,
              health_5min=out["health_5min"], health_5min_sharded=out["health_5min_sharded"], load=_load_average())
    finally:
        meter.close()
    return out


def sweep_cpu_per_gpu_day(sweeps: dict[str, Any], gpus: int) -> dict[str, float]:
    """Worker and PostgreSQL CPU seconds per GPU-day of beat's schedule, from one run's sweeps: the energy
    roll-up re-rolls ``ENERGY_WINDOW_MIN`` minutes every minute, the minute tier rolls each minute once and the
    hour tier each hour once (from the minute tier), the health sweep reads each sample
    ``HEALTH_WINDOW_S / HEALTH_EVERY_S`` times."""
    per_min: dict[str, dict[str, float]] = {
        "energy": {k: sweeps["energy_5min"][k] / 5 * ENERGY_WINDOW_MIN for k in ("worker_cpu_s", "pg_cpu_s")},
        "tier_minute": {k: sweeps["tier_minute_4min"][k] / 4 for k in ("worker_cpu_s", "pg_cpu_s")},
        "tier_hour": {k: sweeps["tier_hour_of_5min"][k] / 5 for k in ("worker_cpu_s", "pg_cpu_s")},
        "health": {k: sweeps["health_5min"][k] / 5 * HEALTH_WINDOW_S / HEALTH_EVERY_S for k in ("worker_cpu_s", "pg_cpu_s")},
    }
    out = {}
    for name, d in per_min.items():
        for k, v in d.items():
            out[f"{name}_{k.removesuffix('_cpu_s')}"] = round(v * 1440 / gpus, 3)
    return out


# --- 4. storage -----------------------------------------------------------------------------------------


def bench_storage(store: Any, gpus: int, t0: dt.datetime) -> dict[str, Any]:
    with store.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        for table in ("gpu_sample_minute", "gpu_sample_hour", "gpu_energy_minute"):
            conn.execute(text(f"VACUUM FULL ANALYZE {table}"))
        conn.execute(text(f"ANALYZE gpu_sample_p{t0:%Y%m%d}"))

        def size(rel: str) -> tuple[int, int]:
            n = int(conn.execute(text(f"SELECT count(*) FROM {rel}")).scalar_one())
            return n, int(conn.execute(text("SELECT pg_total_relation_size(to_regclass(:r))"), {"r": rel}).scalar() or 0)

        tiers = {"raw": (f"gpu_sample_p{t0:%Y%m%d}", SCRAPES_PER_DAY), "minute": ("gpu_sample_minute", 1440),
                 "hour": ("gpu_sample_hour", 24), "energy_minute": ("gpu_energy_minute", 1440)}
        out: dict[str, Any] = {}
        for name, (rel, per_day) in tiers.items():
            rows, nbytes = size(rel)
            if not rows:
                continue  # a tier the run did not roll (``--skip sweeps``)
            per_row = nbytes / max(rows, 1)
            out[name] = {"relation": rel, "rows": rows, "bytes": nbytes, "bytes_per_row": round(per_row, 1), "rows_per_gpu_day": per_day,
                         "bytes_per_gpu_day": round(per_row * per_day)}
    _emit(bench="capacity", what="storage", gpus=gpus, **out, load=_load_average())
    return out


# --- 6. dashboard -------------------------------------------------------------------------------------------


def bench_dashboard(url: str, gpus: int, pages: list[str]) -> dict[str, Any]:
    from dashboard import browser as B  # lazy: Playwright loads only when the dashboard is measured

    why = B.missing_browser()
    if why:
        _emit(bench="capacity", what="dashboard", skipped=why)
        return {}
    engine = db.make_engine(url)
    token = auth.create_token(engine, "bench-capacity", ["admin"])
    engine.dispose()
    specs = {p.name: p for p in B.PAGES}
    out: dict[str, Any] = {}
    with B.dashboard_server(url, timeout_s=300) as base, B.browser_page() as page:
        first = B.open_page(page, base, specs[pages[0]], timeout_s=300, token=token)
        out[pages[0]] = {"first_load_s": round(first, 2)}
        for _ in range(2):
            for name in pages[1:] + pages[:1]:
                try:
                    out.setdefault(name, {}).setdefault("visits_s", []).append(round(B.navigate(page, specs[name], timeout_s=300), 2))
                except Exception as exc:  # noqa: BLE001 - playwright's TimeoutError and friends: recorded, the run goes on
                    out.setdefault(name, {}).setdefault("errors", []).append(f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}")
    for name, d in out.items():
        _emit(bench="capacity", what="dashboard_page", gpus=gpus, page=name, **d, target_s=2.0, load=_load_average())
    return out


# --- main ---------------------------------------------------------------------------------------------------


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gpus", type=int, default=100_000)
    ap.add_argument("--rounds", type=int, default=3, help="push rounds through the API (the first meets the fleet)")
    ap.add_argument("--fill-minutes", type=int, default=6, help="minutes of data in all (pushed rounds included)")
    ap.add_argument("--shards", type=int, default=4)
    ap.add_argument("--connections", type=int, default=16)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--skip", default="", help="comma-separated: job, dashboard, sweeps (and the fill they read)")
    ap.add_argument("--pages", default="overview,energy_carbon")
    ap.add_argument("--postgres", default=os.environ.get("FLEETSCOPE_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"))
    ap.add_argument("--compare", nargs=2, metavar=("SMALL.jsonl", "LARGE.jsonl"),
                    help="no run: the smaller run's per-GPU figures against the larger run's, from two runs' output")
    args = ap.parse_args()
    if args.compare:
        runs = [[json.loads(ln) for ln in Path(f).read_text().splitlines() if ln.startswith("{")] for f in args.compare]
        for row in compare_runs(*runs):
            print(json.dumps(row))
        return
    skip = set(filter(None, args.skip.split(",")))
    if args.fill_minutes < 6 and "sweeps" not in skip:
        ap.error("--fill-minutes must be at least 6: the sweeps read minutes 1-6")

    topo = fleet_topology(args.gpus)
    telem = fleet_telemetry(topo)
    writer = formats.DcgmWriter(topo, formats.dcgm_label_blocks(topo, "580.105.08"))
    # ends a minute ago, so the dashboard's "last minutes" hold the fleet
    t0 = dt.datetime.now(dt.UTC).replace(second=0, microsecond=0) - dt.timedelta(minutes=args.fill_minutes + 1)
    _emit(bench="capacity", what="start", gpus=topo.n_gpus, nodes=len(topo.hosts), sites=SITES, cpus=os.cpu_count(), load=_load_average(),
          t0=t0.isoformat())
    with db.scratch_database(args.postgres, "fleetscope_bench_capacity") as url:
        db.upgrade(url)
        store = Store.open(url)
        try:
            _inventory(store, topo)
            ingest = bench_ingest(url, topo, telem, writer, t0, args)
            model_in = {"api": ingest["api_cpu_s_per_gpu_day"], "database": ingest["pg_cpu_s_per_gpu_day"]}
            if "sweeps" not in skip:
                fill(store, topo, telem, writer, t0, args.rounds, args.fill_minutes * 60 // INTERVAL_S)
                sweeps = bench_sweeps(store, url, topo.n_gpus, t0, args.shards)
                worker = sweep_cpu_per_gpu_day(sweeps, topo.n_gpus)
                _emit(bench="capacity", what="sweep_cpu_s_per_gpu_day", gpus=topo.n_gpus, **worker)
                model_in["worker"] = round(sum(v for k, v in worker.items() if k.endswith("_worker")), 3)
                model_in["database"] = round(model_in["database"] + sum(v for k, v in worker.items() if k.endswith("_pg")), 3)
            bench_storage(store, topo.n_gpus, t0)
            if "job" not in skip:
                jobs_bench = _load("job_analysis")
                jobs_bench.run_job(store, "job-capacity", 1024, dt.timedelta(hours=1), 10.0, 3, False)
            if "dashboard" not in skip:
                bench_dashboard(url, topo.n_gpus, args.pages.split(","))
            _emit(bench="capacity", what="model_inputs", gpus=topo.n_gpus, cpu_s_per_gpu_day=model_in)
            for n in (16_384, 100_000, 1_000_000):
                _emit(bench="capacity", what="model", measured_at_gpus=topo.n_gpus, **capacity_model(model_in, n))
        finally:
            store.engine.dispose()
    _emit(bench="capacity", what="end", load=_load_average())


if __name__ == "__main__":
    main()

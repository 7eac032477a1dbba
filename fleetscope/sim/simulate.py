"""``simulate(spec, out_dir) -> Manifest``: a whole fleet written out in the real formats.

Layout of ``out_dir``::

    manifest.json                       what was written, and every injected fault (kind, where, when)
    dcgm/<UTC stamp>/<host>.prom        one dcgm-exporter /metrics body per host per scrape
    nccl-inspector-<job>/<host>-pid<pid>.log   NCCL Inspector JSON Lines, one file per process
    kineto/<job>/rank<r>.pt.trace.json  PyTorch profiler traces of the profiled ranks
    job_events/<job>.jsonl              job lifecycle events (docs/job_events.md)
    facility/<site>.otlp.json           facility / IT power and grid intensity (OTLP/JSON)
    nccl_tests/<UTC stamp>-all_reduce_perf.txt   an nccl-tests sweep over the flapping port's node, before and during
    lineage/NNN-<job>-<type>.json       OpenLineage RunEvents, one per file
    lineage/registry.json               dataset and model registry bodies (PUT /api/v1/datasets, /models)
    predictions/<model>.csv             a prediction table for the fairness evaluation

Deterministic: every random draw comes from ``numpy.random.default_rng([seed, stream, ...])``, one
stream per concern, so the same spec gives the same bytes, and changing one concern's draws leaves the
others alone.
"""

from __future__ import annotations

import datetime as dt
import json
import math
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from fleetscope import safefiles
from fleetscope.sim import formats
from fleetscope.sim import scheduler as sched_sim
from fleetscope.sim.facility import facility_series
from fleetscope.sim.faults import InjectedFault, plan_faults
from fleetscope.sim.fleet import Topology, build_topology
from fleetscope.sim.jobs import JobPlan, JobRun, fleet_law, simulate_job
from fleetscope.sim.lineage import lineage_events
from fleetscope.sim.predictions import prediction_table
from fleetscope.sim.spec import JobSpec, SimSpec, demo_spec, small_spec
from fleetscope.sim.telemetry import GpuActivity, GpuTelemetry
from fleetscope.sim.predictions import credit_stream

_STREAM_FAULTS, _STREAM_JOBS, _STREAM_TELEMETRY, _STREAM_FACILITY, _STREAM_PREDICTIONS, _STREAM_PLACEMENT, _STREAM_MONITORING = range(1, 8)
_MODELS = (("llama-3-8b-sim", 8e9), ("mistral-7b-sim", 7e9), ("llama-2-13b-sim", 13e9), ("phi-3b-sim", 3e9))


@dataclass
class Manifest:
    """What ``simulate`` wrote (paths relative to ``out_dir``) and what it injected."""

    out_dir: str
    seed: int
    start: str
    end: str
    topology: dict[str, Any]
    files: dict[str, list[str]]
    dcgm_scrapes: list[dict[str, str]]
    jobs: list[dict[str, Any]]
    faults: list[InjectedFault]
    lineage: dict[str, Any]
    predictions: dict[str, Any]
    facility: dict[str, Any]
    notes: list[str] = field(default_factory=list)
    ib_scrapes: list[dict[str, str]] = field(default_factory=list)  # (ts, file) of node_exporter infiniband bodies
    nccl_tests: list[dict[str, Any]] = field(default_factory=list)  # (ts, file, hosts) of nccl-tests sweeps, oldest first
    monitoring: dict[str, Any] = field(default_factory=dict)  # the high-risk deployment: its versions, files, declarations
    scheduler: dict[str, Any] = field(default_factory=dict)  # the Slurm and Kubernetes clusters: files, teams, what must be found

    def faults_of(self, kind: str) -> list[InjectedFault]:
        return [f for f in self.faults if f.kind == kind]

    def job(self, job_id: str) -> dict[str, Any]:
        return next(j for j in self.jobs if j["job_id"] == job_id)

    def to_dict(self) -> dict[str, Any]:
        d = {k: v for k, v in self.__dict__.items() if k != "faults"}
        d["faults"] = [f.to_dict() for f in self.faults]
        return d

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1, sort_keys=True)


def auto_jobs(spec: SimSpec) -> tuple[JobSpec, ...]:
    """``spec.n_jobs`` jobs sharing ``spec.job_node_share`` of the nodes, checkpointing ~8 times a run."""
    usable = max(spec.n_jobs, int(spec.n_nodes * spec.job_node_share))
    weights = np.array([0.3, 0.3, 0.22, 0.14, 0.1, 0.1, 0.1, 0.1][: spec.n_jobs] + [0.1] * max(0, spec.n_jobs - 8))
    sizes = np.maximum(1, np.floor(usable * weights / weights.sum())).astype(int)
    out = []
    for i, n in enumerate(sizes):
        model, params = _MODELS[i % len(_MODELS)]
        js = JobSpec(job_id=str(73100 + 11 * i), nodes=int(n), name=f"pretrain-{model}", model_name=model, params=params,
                     start_offset_s=30.0 + 40.0 * i)
        step_s = fleet_law(js, spec.gpu, spec.gpus_per_node).step_s
        ckpt = max(20, int((spec.duration_s / step_s) // 8))
        # short simulations get proportionally shorter start-up and checkpoint costs, so that a ten-minute
        # test run still trains most of the time
        out.append(replace(js, checkpoint_every_steps=ckpt, checkpoint_save_s=min(20.0, 0.005 * spec.duration_s),
                           checkpoint_restore_s=min(25.0, 0.006 * spec.duration_s), init_s=min(45.0, 0.03 * spec.duration_s)))
    return tuple(out)


def place_jobs(spec: SimSpec, topo: Topology, jobs: tuple[JobSpec, ...]) -> list[tuple[int, ...]]:
    """Whole nodes per job, within one site where the job fits (a job spanning sites would cross the WAN),
    largest jobs first; otherwise the lowest free nodes fleet-wide."""
    npsite = spec.nodes_per_site
    free = {s: list(range(i * npsite, (i + 1) * npsite)) for i, s in enumerate(topo.sites)}
    placed: dict[int, tuple[int, ...]] = {}
    for j in sorted(range(len(jobs)), key=lambda j: -jobs[j].nodes):
        need = jobs[j].nodes
        site = max(topo.sites, key=lambda s: (len(free[s]), -topo.sites.index(s)))
        if len(free[site]) >= need:
            take = free[site][:need]
            free[site] = free[site][need:]
        else:
            pool = sorted(n for s in topo.sites for n in free[s])
            if len(pool) < need:
                raise ValueError(f"job {jobs[j].job_id} needs {need} nodes, {len(pool)} are free")
            take = pool[:need]
            for s in topo.sites:
                free[s] = [n for n in free[s] if n not in take]
        placed[j] = tuple(take)
    return [placed[j] for j in range(len(jobs))]


def _stamp(t: dt.datetime) -> str:
    return t.strftime("%Y%m%dT%H%M%S") + (f".{t.microsecond // 1000:03d}" if t.microsecond else "") + "Z"


def _write(root: Path, rel: str, data: bytes, files: dict[str, list[str]], kind: str) -> None:
    safefiles.write_private(root / rel, data)
    files.setdefault(kind, []).append(rel)


def simulate(spec: SimSpec, out_dir: Path) -> Manifest:
    """Simulate ``spec`` and write every output under ``out_dir`` (created; existing files are replaced).
    Returns the manifest, also written as ``out_dir/manifest.json``."""
    out = Path(out_dir)
    safefiles.private_dir(out)
    g = spec.gpus_per_node
    D = spec.duration_s
    topo = build_topology(spec.sites, spec.racks_per_site, spec.nodes_per_rack, g, spec.gpu.name, spec.seed)
    jobs = spec.jobs or auto_jobs(spec)
    placement = place_jobs(spec, topo, jobs)
    plans = [
        JobPlan(js, nodes, g, spec.gpu, D, spec.detail_every_steps, 0.6 * D, spec.kineto_steps, f"{spec.seed}/{js.job_id}")
        for js, nodes in zip(jobs, placement)
    ]
    fplan = plan_faults(spec, topo, plans, np.random.default_rng([spec.seed, _STREAM_FAULTS]))
    runs: list[JobRun] = [simulate_job(p, fplan.by_job[p.spec.job_id], np.random.default_rng([spec.seed, _STREAM_JOBS, i]))
                          for i, p in enumerate(plans)]
    files: dict[str, list[str]] = {}
    notes: list[str] = []
    t_of = lambda s: spec.start + dt.timedelta(seconds=float(s))  # noqa: E731

    # --- GPU telemetry: one dcgm-exporter body per host per scrape
    act = GpuActivity.from_runs(topo, runs)
    telem = GpuTelemetry(topo, spec.gpu, act, fplan, np.random.default_rng([spec.seed, _STREAM_TELEMETRY]))
    pods = None
    if spec.k8s_pod_labels:
        pods = [None] * topo.n_gpus
        for r in runs:
            for k, node in enumerate(r.plan.nodes):
                for i in range(g):
                    pods[node * g + i] = ("trainer", "training", f"{r.plan.spec.name}-{r.job_id}-worker-{k}")
    writer = formats.DcgmWriter(topo, formats.dcgm_label_blocks(topo, spec.driver_version, pods))
    scrapes = []
    for k in range(int(math.floor(D / spec.dcgm_interval_s)) + 1):
        t = k * spec.dcgm_interval_s
        values = telem.scrape(t)
        ts = t_of(t)
        d = f"dcgm/{_stamp(ts)}"
        if spec.write_dcgm:
            quiet = fplan.silent_host
            for k_node, (host, body) in enumerate(zip(topo.hosts, writer.bodies(values))):
                if quiet is not None and k_node == quiet[0] and t >= quiet[1]:
                    continue
                _write(out, f"{d}/{host}.prom", body, files, "dcgm")
        scrapes.append({"ts": formats.iso_us(formats.epoch_us(ts)), "dir": d})

    # --- InfiniBand: node_exporter's infiniband collector, every host in one body per scrape
    ib_scrapes = []
    for k in range(int(math.floor(D / spec.ib_interval_s)) + 1):
        t = k * spec.ib_interval_s
        ts = t_of(t)
        rel = f"ib/{_stamp(ts)}.prom"
        _write(out, rel, formats.ib_node_exporter_body(list(topo.hosts), t, fplan.ib_flaps), files, "ib_node_exporter")
        ib_scrapes.append({"ts": formats.iso_us(formats.epoch_us(ts)), "file": rel})

    # --- nccl-tests: an acceptance sweep over the flapping port's node and a neighbour, before the flaps and again
    # between them, when the ring runs at the flapping link's pace (the fault's communication factor)
    nccl_runs = []
    if fplan.ib_flaps is not None:
        node, flap_times = fplan.ib_flaps
        pair = [topo.hosts[node], topo.hosts[node - 1 if node else node + 1]]
        # the rails' NICs together, at the nine tenths of line rate NCCL's all-reduce sustains across nodes
        peak = g * spec.gpu.nic_bytes_per_s * 0.9
        for k, (t, busbw) in enumerate(((0.1 * D, peak), (0.5 * (flap_times[0] + flap_times[1]), peak / spec.faults.flapping_ib_comm_factor))):
            ts = t_of(t)
            rel = f"nccl_tests/{_stamp(ts)}-all_reduce_perf.txt"
            _write(out, rel, formats.nccl_tests_all_reduce(pair, g, spec.gpu.name, busbw, 4100 + 100 * k), files, "nccl_tests")
            nccl_runs.append({"ts": formats.iso_us(formats.epoch_us(ts)), "file": rel, "hosts": pair})

    # --- jobs: events, NCCL Inspector, Kineto
    job_info = []
    for i, r in enumerate(runs):
        uuids = [topo.gpu_uuid[node * g + k] for node in r.plan.nodes for k in range(g)]
        ev_rel = f"job_events/{r.job_id}.jsonl"
        _write(out, ev_rel, formats.job_events_jsonl(r, topo, spec.start, uuids), files, "job_events")
        for rel, data in sorted(formats.inspector_files(r, topo, spec.start).items()):
            _write(out, rel, data, files, "nccl_inspector")
        traced = _kineto_nodes(spec, r, fplan.by_job[r.job_id], np.random.default_rng([spec.seed, _STREAM_PLACEMENT, i]))
        k_ranks = [k * g + j for k in traced for j in range(g)] if r.kineto else []
        if not r.kineto:
            notes.append(f"job {r.job_id}: no undisrupted profiling window after {0.6 * D:.0f} s; no Kineto traces")
        for rank in k_ranks:
            _write(out, f"kineto/{r.job_id}/rank{rank}.pt.trace.json", formats.kineto_trace(r, rank, topo, spec.gpu, spec.start),
                   files, "kineto")
        law = r.law
        job_info.append({
            "job_id": r.job_id, "name": r.plan.spec.name, "model_name": r.plan.spec.model_name, "world_size": r.world_size,
            "nodes": len(r.plan.nodes), "hosts": [topo.hosts[k] for k in r.plan.nodes],
            "sites": sorted({topo.host_site[k] for k in r.plan.nodes}),
            "gpu_uuids": uuids, "start": formats.iso_us(formats.epoch_us(t_of(r.events[0]["t"]))),
            # a job that never finished (it hung) holds its GPUs past the simulation: no end, still running
            "end": formats.iso_us(formats.epoch_us(t_of(r.events[-1]["t"]))) if r.events[-1]["kind"] == "finished" else None,
            "status": "finished" if r.events[-1]["kind"] == "finished" else "running",
            "steps_run": r.steps_run, "steps_rerun": r.steps_rerun, "events_file": ev_rel,
            "inspector_dir": f"nccl-inspector-{r.job_id}", "kineto_ranks": k_ranks,
            "kineto_steps": [d.step for d in r.kineto], "detail_steps": [d.step for d in r.details],
            "replica_groups": {str(rank): f"shard-{rank % g}" for rank in range(r.world_size)},
            "fleet_law": {**asdict(law), "step_s": law.step_s} if law else None,
            "process_groups": formats.process_groups(r),
        })

    # --- the schedulers: a Slurm cluster (sacct -P) running the jobs, a team holding idle GPUs and a preempted job
    # on a node no job uses, and a Kubernetes cluster (kube-state-metrics) beside it
    quiet_host = (topo.hosts[fplan.silent_host[0]],) if fplan.silent_host is not None else ()
    world = sched_sim.scheduler_world(spec.start, D, list(topo.hosts), list(topo.host_site), g, job_info, avoid_hosts=quiet_host)
    _write(out, "scheduler/sacct.txt", sched_sim.sacct_text(world), files, "slurm_sacct")
    _write(out, "scheduler/squeue.json", sched_sim.slurmrestd_jobs_json(world, g), files, "slurmrestd")
    _write(out, "scheduler/kube-state-metrics.prom", sched_sim.kube_state_text(world, g), files, "kube_state_metrics")
    scheduler = {**world.truth(), "sacct": "scheduler/sacct.txt", "squeue_json": "scheduler/squeue.json",
                 "kube_state_metrics": "scheduler/kube-state-metrics.prom"}

    # --- facility meters and grid intensity (OTLP/JSON)
    frng = np.random.default_rng([spec.seed, _STREAM_FACILITY])
    fac_files = []
    series = facility_series(topo, telem, spec.start, D, spec.facility_interval_s, frng)
    for site in topo.sites:
        rel = f"facility/{site}.otlp.json"
        _write(out, rel, formats.otlp_gauges_json([s for s in series if s[2]["site"] == site]), files, "otlp_json")
        fac_files.append(rel)

    # --- lineage and the registry
    lin = lineage_events(spec.seed, spec.start, [(r.job_id, r.plan.spec.model_name, t_of(r.events[0]["t"]), t_of(r.events[-1]["t"]))
                                                 for r in runs])
    for k, ev in enumerate(lin.events):
        rel = f"lineage/{k:03d}-{ev['job']['name']}-{ev['eventType'].lower()}.json"
        _write(out, rel, (json.dumps(ev, indent=1, sort_keys=True) + "\n").encode(), files, "openlineage")
    _write(out, "lineage/registry.json", (json.dumps(lin.registry, indent=1, sort_keys=True) + "\n").encode(), files, "registry")

    # --- predictions of the tainted model, with group-dependent errors
    pt = prediction_table(spec.prediction_rows, np.random.default_rng([spec.seed, _STREAM_PREDICTIONS]))
    pred_rel = f"predictions/{lin.tainted_model[0] or 'model'}.csv"
    _write(out, pred_rel, pt.frame.write_csv().encode(), files, "predictions")

    # --- a high-risk deployment (Annex III 5(b)): a credit-scoring model in service, two versions
    monitoring = credit_deployment(out, files, spec.start, spec.seed)

    manifest = Manifest(
        out_dir=str(out), seed=spec.seed, start=formats.iso_us(formats.epoch_us(spec.start)),
        end=formats.iso_us(formats.epoch_us(t_of(D))),
        topology={"sites": list(topo.sites), "hosts": len(topo.hosts), "gpus": topo.n_gpus, "gpus_per_node": g,
                  "racks_per_site": spec.racks_per_site, "nodes_per_rack": spec.nodes_per_rack, "gpu_model": spec.gpu.name},
        files={k: sorted(v) for k, v in files.items()},
        dcgm_scrapes=scrapes,
        ib_scrapes=ib_scrapes,
        nccl_tests=nccl_runs,
        jobs=job_info,
        faults=fplan.faults,
        lineage={"quarantined_dataset": {"namespace": lin.quarantined[0], "name": lin.quarantined[1]},
                 "tainted_model": {"name": lin.tainted_model[0], "version": lin.tainted_model[1]},
                 "clean_model": {"name": lin.clean_model[0], "version": lin.clean_model[1]} if lin.clean_model else None,
                 "path": lin.tainted_path, "registry": "lineage/registry.json"},
        predictions={"file": pred_rel, "model": lin.tainted_model[0], "sensitive": list(pt.sensitive),
                     "disadvantaged": pt.disadvantaged, "metric": pt.metric, "rows": spec.prediction_rows},
        facility={"files": fac_files, "interval_s": spec.facility_interval_s,
                  "series": ["facility_power_w", "it_power_w", "grid_intensity_g_per_kwh"]},
        notes=notes,
        monitoring=monitoring,
        scheduler=scheduler,
    )
    safefiles.write_private(out / "manifest.json", (manifest.to_json() + "\n").encode())
    return manifest


def _kineto_nodes(spec: SimSpec, run: JobRun, jf, rng: np.random.Generator) -> list[int]:
    """Nodes (within the job) whose ranks are profiled: node 0, the nodes of injected stragglers, slow
    links and flapping ports (so the demo shows them), then a seeded sample of the rest."""
    g = spec.gpus_per_node
    n_nodes = len(run.plan.nodes)
    want = [0]
    if jf.thermal is not None:
        want.append(jf.thermal[0] // g)
    if jf.slow_link is not None:
        want.append(jf.slow_link[0])
    if jf.ib_flap is not None:
        want.append(jf.ib_flap[0])
    rest = [k for k in range(n_nodes) if k not in want]
    rng.shuffle(rest)
    chosen = list(dict.fromkeys(want))
    for k in rest:
        if len(chosen) >= max(spec.kineto_nodes, len(chosen)):
            break
        chosen.append(k)
    return sorted(chosen[: max(spec.kineto_nodes, len(dict.fromkeys(want)))])


def simulate_small(out_dir: Path, seed: int = 7, **overrides: Any) -> Manifest:
    """The test-sized fleet (2 sites × 4 nodes × 8 GPUs, 2 jobs, 10 minutes): see ``spec.small_spec``."""
    return simulate(small_spec(seed, **overrides), out_dir)


def simulate_demo(out_dir: Path, seed: int = 7, **overrides: Any) -> Manifest:
    """The demo fleet (2 sites, 64 nodes of 8 GPUs, 4 jobs, 2 hours): see ``spec.demo_spec``."""
    return simulate(demo_spec(seed, **overrides), out_dir)


CREDIT_MODEL = "credit-score"
MONITORING_HOURS, MONITORING_RATE, DRIFT_HOUR = 30, 100, 27


def credit_deployment(out: Path, files: dict[str, list[str]], start: dt.datetime, seed: int) -> dict[str, Any]:
    """A credit-scoring model (Annex III point 5(b)) deployed before the simulated window: version 1's
    applicants drift in its last hours (a downturn: incomes fall), version 2 misses women who would repay
    (a biased version). Each writes ``MONITORING_HOURS`` hours of predictions with outcomes, ending an hour
    before ``start`` so every outcome is in the past; the first day is each version's reference window. The
    declarations are what a provider states: enough for real passes, and documentation that lacks Annex IV
    point 9 (the post-market monitoring evaluation system) for a real failure; version 2's declared
    accuracy (0.92) is above what it achieves in operation."""

    first = start.replace(minute=0, second=0, microsecond=0) - dt.timedelta(hours=MONITORING_HOURS + 1)
    versions = {}
    for version, kw in (("1", {"drift_from_hour": DRIFT_HOUR}), ("2", {"bias": 1.5})):
        stream = credit_stream(CREDIT_MODEL, version, first, hours=MONITORING_HOURS, rate=MONITORING_RATE,
                               rng=np.random.default_rng([seed, _STREAM_MONITORING, int(version)]), **kw)
        rel = f"monitoring/{CREDIT_MODEL}-{version}.jsonl"
        _write(out, rel, stream.jsonl, files, "model_monitoring")
        versions[version] = {"file": rel, "drift_from": stream.drift_from.isoformat() if stream.drift_from else None,
                             "drift_feature": stream.drift_feature, "biased": stream.biased}
    reviewed = (start - dt.timedelta(days=10)).date().isoformat()
    declarations = [
        {"kind": "area", "value": {"area": "essential_services", "point": "5(b)"}},
        {"kind": "classification", "value": {"general_purpose": False, "profiling": True}},
        {"kind": "risk_management", "value": {"reviewed_at": reviewed, "reference": "RMS-credit-4"}},
        {"kind": "instructions", "value": {"reference": "IFU-credit-2", "accuracy": "0.92 overall", "per_group_performance": "by sex and age band, see IFU 4.2"}},
        {"kind": "oversight", "value": {"measures": ["a credit officer reviews every refusal"], "override": True, "stop": True}},
        {"kind": "accuracy_metrics", "value": {"metrics": {"accuracy": 0.92}, "tolerance": 0.02}},
        {"kind": "post_market_plan", "value": {"active": True, "interval_days": 30, "last_review_at": reviewed, "reference": "PMM-credit-1"}},
        {"kind": "logging", "value": {"enabled": True}},
        *[{"kind": "documentation", "key": str(k), "value": {"reference": f"doc://credit/annex-iv/{k}"}} for k in range(1, 9)],
    ]
    return {"model": CREDIT_MODEL, "purpose": "credit scoring of loan applicants", "versions": versions, "hours": MONITORING_HOURS,
            "rate": MONITORING_RATE, "reference_hours": 24, "declarations": declarations}

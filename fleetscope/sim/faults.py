"""Injected faults: where and when each happens, chosen by the seeded generator and reported exactly.

- **Thermal throttling** of one GPU: its compute runs slower (a straggler), and dcgm-exporter shows the
  thermal clock-event bits (DCGM_CLOCKS_EVENT_REASON_SW_THERMAL 0x20, HW_THERMAL 0x40), a high
  temperature and a low SM clock.
- **Slow link**: the NVLink of one node degrades (to roughly PCIe speed), so that node's intra-node
  collectives take longer, its ranks arrive late at the inter-node ones and every other rank waits;
  the node's GPUs count PCIe replays.
- **Silent data corruption** on one GPU: its replica's parameter checksum differs from the other
  replicas' from a known step on (Llama 3 §3.3.4 and Gemini §3 describe this replica comparison),
  optionally with an XID (79, 94, 95, ...).
- **GPU failures** as a Poisson process: a job of N GPUs fails at rate N / MTBF (exponential gaps, so a
  Poisson count over the run). Causes follow the mix Meta reported for Llama 3 405B pre-training
  (Dubey et al., "The Llama 3 Herd of Models", 2024, Table 5: 419 unexpected interruptions in 54 days),
  each with the XID it typically raises.
- **Preemption** of one job by the scheduler, with a graceful checkpoint before it goes.
- **Row-remap failure** on one GPU: DCGM_FI_DEV_ROW_REMAP_FAILURE = 1, one more uncorrectable
  remapped row and XID 64 ("ECC page retirement or row remapping recording failure", NVIDIA's XID
  catalogue).
- **A hung job**: every rank blocks in a collective (one rank stuck, the rest waiting for it) and the job
  makes no further step, with no event, while its GPUs stay allocated and busy — what a real NCCL hang
  looks like until the collective timeout fires.
- **A silent host**: an idle node stops sending telemetry (a crashed node or its exporter gone).
- **A flapping InfiniBand link** under one job: its HCA port goes down and retrains several times
  (LinkDownedCounter and LinkErrorRecoveryCounter rise, symbol errors with them), as a marginal cable or
  transceiver does. While it flaps, that node's ranks communicate slower than their peers, so the job's
  communication stragglers share the port (what ``analyzers.fabric_attribution`` points at).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fleetscope.sim.fleet import Topology
from fleetscope.sim.jobs import Disruption, JobFaults, JobPlan
from fleetscope.sim.spec import SimSpec

# (category, share of interruptions in Llama 3 Table 5 (approximate), XID it raises or None)
FAILURE_MIX: tuple[tuple[str, float, int | None], ...] = (
    ("faulty_gpu", 30.1, 79),  # GPU has fallen off the bus
    ("gpu_hbm3_memory", 17.2, 95),  # uncontained ECC error
    ("software_bug", 12.9, None),
    ("network_switch_cable", 8.4, None),
    ("host_maintenance", 7.6, None),
    ("gpu_sram_memory", 4.5, 94),  # contained ECC error
    ("gpu_system_processor", 4.1, 119),  # GSP RPC timeout
    ("nic", 1.7, None),
    ("nccl_watchdog_timeout", 1.7, None),
    ("silent_data_corruption", 1.4, None),
    ("gpu_thermal_interface_sensor", 1.4, None),
    ("other_hardware", 9.0, None),  # SSD, power supply, chassis, IO board, CPU, DRAM, dependencies
)

THERMAL_REASONS = 0x20 | 0x40  # DCGM_CLOCKS_EVENT_REASON_SW_THERMAL | HW_THERMAL
IDLE_REASON = 0x1  # DCGM_CLOCKS_EVENT_REASON_GPU_IDLE
ROW_REMAP_XID = 64


@dataclass(frozen=True)
class InjectedFault:
    """One fault as the manifest reports it: what, where, when, and what should find it."""

    kind: str
    start: dt.datetime
    end: dt.datetime | None
    job_id: str | None = None
    ranks: tuple[int, ...] = ()
    hosts: tuple[str, ...] = ()
    gpu_uuids: tuple[str, ...] = ()
    detail: dict[str, Any] = field(default_factory=dict)
    expect: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "start": _iso(self.start),
            "end": _iso(self.end) if self.end else None,
            "job_id": self.job_id,
            "ranks": list(self.ranks),
            "hosts": list(self.hosts),
            "gpu_uuids": list(self.gpu_uuids),
            "detail": self.detail,
            "expect": self.expect,
        }


def _iso(t: dt.datetime) -> str:
    return t.astimezone(dt.UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


@dataclass
class FaultPlan:
    """Faults by job (as the job simulator consumes them) and for the GPU telemetry."""

    by_job: dict[str, JobFaults]
    faults: list[InjectedFault]
    # GPU index -> list of (t_s, xid): XIDs the dcgm output reports from then on
    xids: dict[int, list[tuple[float, int]]]
    thermal_gpu: tuple[int, float, float] | None  # gpu index, t0, t1
    slow_link_node: tuple[int, float, float] | None  # global node index, t0, t1
    row_remap: tuple[int, float] | None  # gpu index, t
    silent_host: tuple[int, float] | None = None  # global node index, t: no dcgm body from then on
    ib_flaps: tuple[int, tuple[float, ...]] | None = None  # global node index, times its HCA link went down


def plan_faults(spec: SimSpec, topo: Topology, plans: list[JobPlan], rng: np.random.Generator) -> FaultPlan:
    """Place every enabled fault. Times are seconds from ``spec.start``."""
    fs = spec.faults
    D = spec.duration_s
    g = topo.gpus_per_node
    t_of = lambda s: spec.start + dt.timedelta(seconds=float(s))  # noqa: E731
    by_job: dict[str, dict[str, Any]] = {p.spec.job_id: {"disruptions": []} for p in plans}
    faults: list[InjectedFault] = []
    xids: dict[int, list[tuple[float, int]]] = {}
    thermal_gpu = slow_node = row_remap = None

    def gpu_of(plan: JobPlan, rank: int) -> int:
        return topo.gpu_index(plan.nodes[rank // g], rank % g)

    if plans and fs.thermal_straggler:
        p = plans[0]
        n = len(p.nodes) * g
        rank = int(rng.integers(0, n))
        a, b = 0.2 * D, D
        by_job[p.spec.job_id]["thermal"] = (rank, a, b, fs.thermal_compute_factor)
        gi = gpu_of(p, rank)
        thermal_gpu = (gi, a, b)
        faults.append(InjectedFault("thermal_straggler", t_of(a), t_of(b), p.spec.job_id, (rank,), (topo.hosts[gi // g],),
                                    (topo.gpu_uuid[gi],), {"compute_factor": fs.thermal_compute_factor,
                                                           "clock_event_reasons": THERMAL_REASONS},
                                    "analyzers.stragglers: persistent straggler, attribution compute_slow; dcgm thermal clock-event bits"))
    if plans and fs.slow_link:
        p = plans[1 % len(plans)]
        avoid = {by_job[p.spec.job_id]["thermal"][0] // g} if "thermal" in by_job[p.spec.job_id] else set()
        choices = [k for k in range(len(p.nodes)) if k not in avoid] or list(range(len(p.nodes)))
        k = int(choices[int(rng.integers(0, len(choices)))])
        a, b = 0.3 * D, D
        by_job[p.spec.job_id]["slow_link"] = (k, a, b, fs.slow_link_factor)
        node = p.nodes[k]
        slow_node = (node, a, b)
        faults.append(InjectedFault("slow_link", t_of(a), t_of(b), p.spec.job_id, tuple(range(k * g, (k + 1) * g)),
                                    (topo.hosts[node],), tuple(topo.gpu_uuid[node * g:(node + 1) * g]),
                                    {"link": "nvlink", "bandwidth_factor": 1 / fs.slow_link_factor},
                                    "analyzers.stragglers: the node's ranks persistent, attribution communication_slow; "
                                    "NCCL Inspector busbw of that host's node communicator drops"))
    if plans and fs.sdc:
        # a replica comparison needs at least three replicas of each shard: prefer a job with >= 3 nodes
        cands = [p for p in plans if len(p.nodes) >= 3] or plans
        p = cands[0]
        n = len(p.nodes) * g
        taken = {by_job[p.spec.job_id][k][0] for k in ("thermal",) if k in by_job[p.spec.job_id]}
        rank = int(rng.integers(0, n))
        while rank in taken and n > 1:
            rank = int(rng.integers(0, n))
        a = 0.25 * D
        by_job[p.spec.job_id]["sdc"] = (rank, a)
        gi = gpu_of(p, rank)
        if fs.sdc_xid:
            xids.setdefault(gi, []).append((a, fs.sdc_xid))
        faults.append(InjectedFault("sdc", t_of(a), None, p.spec.job_id, (rank,), (topo.hosts[gi // g],), (topo.gpu_uuid[gi],),
                                    {"xid": fs.sdc_xid, "replica_group": f"shard-{rank % g}"},
                                    "param_checksum of this rank disagrees with its replica group on every checksum step from start"))
    preempt_t: dict[str, float] = {}
    if plans and fs.preemption:
        p = plans[-1]
        t = 0.45 * D
        preempt_t[p.spec.job_id] = t
        by_job[p.spec.job_id]["disruptions"].append(Disruption(t, "preempted", None, "preempted_by_higher_priority", fs.preemption_wait_s))
        hosts = tuple(topo.hosts[k] for k in p.nodes)
        faults.append(InjectedFault("preemption", t_of(t), t_of(t + fs.preemption_wait_s), p.spec.job_id, (), hosts, (),
                                    {"wait_s": fs.preemption_wait_s},
                                    "analyzers.goodput: scheduling goodput < 1 (allocated → preempted → allocated)"))
    hang_t: dict[str, float] = {}
    if plans and fs.hung_job:
        # the job with the fewest other faults, so each fault stays visible on its own; late enough that a
        # preempted job is back, early enough that the stall outlasts the hang check's floor by the end
        busy = {jid for jid, d in by_job.items() if any(k in d for k in ("thermal", "slow_link", "sdc"))}
        p = next((q for q in plans if q.spec.job_id not in busy and q.spec.job_id not in preempt_t), None) or plans[-1]
        t = 0.75 * D
        hang_t[p.spec.job_id] = t
        by_job[p.spec.job_id]["hang"] = t
        hosts = tuple(topo.hosts[k] for k in p.nodes)
        faults.append(InjectedFault("hung_job", t_of(t), None, p.spec.job_id, (), hosts, (),
                                    {"cause": "every rank blocked in a collective"},
                                    "analyzers.hangs: no step for k times the job's step while its GPUs are held"))
    if fs.gpu_mtbf_h:
        failures: list[tuple[JobPlan, float]] = []
        for p in plans:
            n = len(p.nodes) * g
            lo, hi = p.spec.start_offset_s + p.spec.init_s + 30.0, 0.85 * D
            if hi <= lo:
                continue
            rate_per_s = n / (fs.gpu_mtbf_h * 3600.0)
            for t in np.sort(rng.uniform(lo, hi, rng.poisson(rate_per_s * (hi - lo)))):
                failures.append((p, float(t)))
        if len(failures) < fs.min_failures and plans:
            # guarantee the demo something to find; the manifest says the failure was forced
            for _ in range(fs.min_failures - len(failures)):
                p = max(plans, key=lambda q: len(q.nodes))
                lo, hi = p.spec.start_offset_s + p.spec.init_s + 30.0, 0.85 * D
                failures.append((p, float(rng.uniform(lo, max(hi, lo + 1.0)))))
        for p, t in failures:
            if t >= hang_t.get(p.spec.job_id, float("inf")) - 60.0:
                continue  # a hung job takes no further step: nothing of it can fail visibly after the hang
            pt = preempt_t.get(p.spec.job_id)
            if pt is not None and pt - 60.0 <= t <= pt + fs.preemption_wait_s + 300.0:
                continue  # the nodes were not running the job then
            shares = np.array([m[1] for m in FAILURE_MIX])
            cat, _, xid = FAILURE_MIX[int(rng.choice(len(FAILURE_MIX), p=shares / shares.sum()))]
            n = len(p.nodes) * g
            rank = int(rng.integers(0, n))
            gi = gpu_of(p, rank)
            cause = f"xid_{xid}" if xid else cat
            rec = float(rng.uniform(*fs.recovery_s))
            by_job[p.spec.job_id]["disruptions"].append(Disruption(t, "failure", rank, cause, rec, xid))
            if xid:
                xids.setdefault(gi, []).append((t, xid))
            faults.append(InjectedFault("gpu_failure", t_of(t), t_of(t + rec), p.spec.job_id, (rank,), (topo.hosts[gi // g],),
                                        (topo.gpu_uuid[gi],), {"category": cat, "xid": xid, "cause": cause, "recovery_s": rec,
                                                               "mtbf_h": fs.gpu_mtbf_h},
                                        "analyzers.goodput: failure event, restart from the last checkpoint, wasted progress > 0"))
    if fs.row_remap_failure:
        used = {topo.gpu_index(k, i) for p in plans for k in p.nodes for i in range(g)}
        idle = [i for i in range(topo.n_gpus) if i not in used]
        pool = idle or list(range(topo.n_gpus))
        gi = int(pool[int(rng.integers(0, len(pool)))])
        t = 0.4 * D
        row_remap = (gi, t)
        xids.setdefault(gi, []).append((t, ROW_REMAP_XID))
        faults.append(InjectedFault("row_remap_failure", t_of(t), None, None, (), (topo.hosts[gi // g],), (topo.gpu_uuid[gi],),
                                    {"xid": ROW_REMAP_XID, "dcgm_field": "DCGM_FI_DEV_ROW_REMAP_FAILURE"},
                                    "dcgm: DCGM_FI_DEV_ROW_REMAP_FAILURE=1 and XID 64 on this GPU from start"))
    silent = None
    if fs.silent_host:
        used = {k for p in plans for k in p.nodes}
        taken = {row_remap[0] // g} if row_remap else set()
        pool = [k for k in range(topo.n_gpus // g) if k not in used and k not in taken] or [k for k in range(topo.n_gpus // g) if k not in used]
        if pool:
            node = int(pool[int(rng.integers(0, len(pool)))])
            t = 0.7 * D
            silent = (node, t)
            faults.append(InjectedFault("silent_host", t_of(t), None, None, (), (topo.hosts[node],),
                                        tuple(topo.gpu_uuid[node * g:(node + 1) * g]), {},
                                        "analyzers.absence: host_down, every GPU of the host silent past three intervals"))
    flaps = None
    if plans and fs.flapping_ib_link:
        # the first job's last node without its thermal straggler: a compute-slow rank holds its whole node
        # back, which would hide the node's slow communication
        p = plans[0]
        thermal = by_job[p.spec.job_id].get("thermal")
        k = next((i for i in reversed(range(len(p.nodes))) if thermal is None or thermal[0] // g != i), len(p.nodes) - 1)
        node = p.nodes[k]
        times = tuple(float(t) for t in np.linspace(0.5 * D, 0.8 * D, 4))
        flaps = (node, times)
        by_job[p.spec.job_id]["ib_flap"] = (k, times[0], times[-1], fs.flapping_ib_comm_factor)
        faults.append(InjectedFault("flapping_ib_link", t_of(times[0]), t_of(times[-1]), p.spec.job_id,
                                    tuple(range(k * g, (k + 1) * g)), (topo.hosts[node],), (),
                                    {"device": "mlx5_0", "port": 1, "link_downs": len(times),
                                     "comm_factor": fs.flapping_ib_comm_factor},
                                    "analyzers.ib_links: ib_link_flapping on the host's HCA port (LinkDownedCounter rose); "
                                    "analyzers.fabric_attribution: the job's communication stragglers share that port"))
    jf = {}
    for jid, d in by_job.items():
        jf[jid] = JobFaults(thermal=d.get("thermal"), slow_link=d.get("slow_link"), sdc=d.get("sdc"),
                            ib_flap=d.get("ib_flap"), disruptions=tuple(sorted(d["disruptions"], key=lambda x: x.t_s)), hang=d.get("hang"))
    for v in xids.values():
        v.sort()
    faults.sort(key=lambda f: (f.start, f.kind))
    return FaultPlan(jf, faults, xids, thermal_gpu, slow_node, row_remap, silent, flaps)

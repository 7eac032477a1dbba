"""Training jobs whose step times follow the Fleet Law, simulated rank by rank.

The Fleet Law (docs/ARCHITECTURE.md, "The C³ model"): T_step(N) = T_compute/N + T_comm(N) + T_sync(N) − T_overlap.

- **Compute.** A step of the global batch costs 6·P·tokens FLOPs (Kaplan et al., "Scaling Laws for
  Neural Language Models", 2020: forward 2·P, backward 4·P per token); spread over N GPUs at a kernel
  efficiency of the GPU's peak, each rank computes T_compute/N.
- **Communication.** Gradients are synchronised hierarchically, as PyTorch HSDP and NCCL's own
  multi-node algorithms do: a reduce-scatter inside each node over NVLink, an all-reduce of each shard
  across nodes over the rail NICs, an all-gather inside the node. Each phase costs what a ring of n
  members costs (Thakur, Rabenseifner & Gropp, "Optimization of Collective Communication Operations in
  MPICH", IJHPCA 2005; the same factors as nccl-tests' doc/PERFORMANCE.md bus bandwidth):
  reduce-scatter and all-gather (n−1)/n·M/B + (n−1)·α, all-reduce 2(n−1)/n·M/B + 2(n−1)·α.
- **Sync.** Collectives wait for their last member, so the slowest rank of each group sets the pace;
  a small all-reduce of the gradient norm over the whole job (clipping) is the job-wide barrier.
- **Overlap.** The intra-node reduce-scatter is launched while the last backward kernels still run
  (DDP/FSDP bucketing), so part of it is hidden behind compute.

Each step is simulated for every rank: when it arrives at each collective, when the collective starts
(the last member's arrival) and ends. That is what the kernel timelines and NCCL records show, and what
the C³ analysis separates again (the last rank to arrive waits least). Noise: per-rank and per-step
lognormal compute jitter, per-collective bandwidth jitter, host gaps, rare host hiccups.

Pure: a :class:`JobPlan` and a seeded generator in, a :class:`JobRun` (events and arrays) out.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field

import numpy as np

from fleetscope.sim.spec import GpuModel, JobSpec

ALPHA_NVLINK_S = 2e-6  # per-hop latency of an NVLink ring step (order of NCCL's LL protocol latency)
ALPHA_NET_S = 8e-6  # per-hop latency across the network (InfiniBand/RoCE, NIC + switch)
OPTIMIZER_S = 0.015  # the local optimizer update of one shard
HOST_GAP_S = 0.003  # host-side gap between steps (next batch, launch of the first kernel)
GRAD_NORM_BYTES = 4


def ring_reduce_scatter_s(nbytes: float, n: int, bytes_per_s: float, alpha_s: float) -> float:
    """Ring reduce-scatter (or all-gather) of an ``nbytes`` buffer over ``n`` members:
    (n−1)/n · M/B + (n−1)·α (Thakur et al. 2005)."""
    if n <= 1:
        return 0.0
    return (n - 1) / n * nbytes / bytes_per_s + (n - 1) * alpha_s


def ring_allreduce_s(nbytes: float, n: int, bytes_per_s: float, alpha_s: float) -> float:
    """Ring all-reduce: a reduce-scatter then an all-gather, 2(n−1)/n · M/B + 2(n−1)·α."""
    return 2 * ring_reduce_scatter_s(nbytes, n, bytes_per_s, alpha_s)


@dataclass(frozen=True)
class FleetLaw:
    """The noise-free terms of one job's step (seconds)."""

    compute_s: float  # T_compute / N
    comm_s: float  # T_comm(N): reduce-scatter + inter-node all-reduce + grad-norm + all-gather
    sync_s: float  # optimizer and host gap between the collectives and the next step
    overlap_s: float
    rs_s: float
    ar_s: float
    gn_s: float
    ag_s: float

    @property
    def step_s(self) -> float:
        return self.compute_s + self.comm_s + self.sync_s - self.overlap_s


def fleet_law(job: JobSpec, gpu: GpuModel, gpus_per_node: int, nodes: int | None = None) -> FleetLaw:
    """T_step(N) = T_compute/N + T_comm(N) + T_sync(N) − T_overlap for ``job`` on ``nodes`` nodes
    (default: the job's own). Strong scaling: the global batch stays that of the job's own size."""
    n_nodes = job.nodes if nodes is None else nodes
    g = gpus_per_node
    n = n_nodes * g
    global_tokens = job.tokens_per_gpu_step * job.nodes * g
    t_compute_1 = 6.0 * job.params * global_tokens / (gpu.bf16_peak_flops * job.kernel_efficiency)
    grad_bytes = 2.0 * job.params  # bf16 gradients
    rs = ring_reduce_scatter_s(grad_bytes, g, gpu.nvlink_bytes_per_s, ALPHA_NVLINK_S)
    ar = ring_allreduce_s(grad_bytes / g, n_nodes, gpu.nic_bytes_per_s, ALPHA_NET_S)
    gn = ring_allreduce_s(GRAD_NORM_BYTES, n, gpu.nic_bytes_per_s if n_nodes > 1 else gpu.nvlink_bytes_per_s,
                          ALPHA_NET_S if n_nodes > 1 else ALPHA_NVLINK_S)
    ag = rs
    return FleetLaw(t_compute_1 / n, rs + ar + gn + ag, OPTIMIZER_S + HOST_GAP_S, job.overlap_fraction * rs, rs, ar, gn, ag)


# --- faults as the job sees them -----------------------------------------------------------------


@dataclass(frozen=True)
class Disruption:
    """A failure or preemption hitting the job at ``t_s`` (seconds from the simulation start)."""

    t_s: float
    kind: str  # "failure" | "preempted"
    rank: int | None
    cause: str
    recovery_s: float
    xid: int | None = None


@dataclass(frozen=True)
class JobFaults:
    thermal: tuple[int, float, float, float] | None = None  # rank, t0, t1, compute factor
    slow_link: tuple[int, float, float, float] | None = None  # node within the job, t0, t1, NVLink factor
    sdc: tuple[int, float] | None = None  # rank, t0
    ib_flap: tuple[int, float, float, float] | None = None  # node within the job, t0, t1, comm factor
    disruptions: tuple[Disruption, ...] = ()
    hang: float | None = None  # t0: every rank blocks in a collective and the job makes no further step


@dataclass(frozen=True)
class JobPlan:
    spec: JobSpec
    nodes: tuple[int, ...]  # global node indices, in rank order
    gpus_per_node: int
    gpu: GpuModel
    end_s: float  # the job stops at the simulation's end
    detail_every: int
    kineto_from_s: float
    kineto_steps: int
    checksum_salt: str


# --- results -------------------------------------------------------------------------------------


@dataclass
class StepDetail:
    """One step on every rank (arrays over ranks, seconds from the simulation start)."""

    step: int
    attempt: int
    start: np.ndarray
    end: np.ndarray  # the next step's start (the step's span, host side)
    compute_end: np.ndarray  # S + forward/backward
    a_rs: np.ndarray
    rs_end: np.ndarray
    ar_end: np.ndarray
    gn_end: np.ndarray
    opt_end: np.ndarray
    ag_end: np.ndarray
    loss: np.ndarray
    checksum_bad: np.ndarray  # bool per rank: wrong parameter checksum (SDC)


@dataclass
class JobRun:
    plan: JobPlan
    events: list[dict] = field(default_factory=list)  # job events with "t" (seconds) instead of "ts"
    running: list[tuple[float, float]] = field(default_factory=list)  # when the job's GPUs are busy
    details: list[StepDetail] = field(default_factory=list)  # every detail_every-th step
    kineto: list[StepDetail] = field(default_factory=list)  # consecutive steps of the profiling window
    steps_run: int = 0
    steps_rerun: int = 0
    law: FleetLaw | None = None

    @property
    def job_id(self) -> str:
        return self.plan.spec.job_id

    @property
    def world_size(self) -> int:
        return len(self.plan.nodes) * self.plan.gpus_per_node


def checksum(salt: str, step: int, group: int, corrupt: bool) -> str:
    """A replica group's parameter checksum at a step: hashlib (never hash(), which is salted per process)."""
    h = hashlib.sha256(f"{salt}/{step}/{group}/{'bad' if corrupt else 'ok'}".encode()).hexdigest()
    return h[:16]


def simulate_job(plan: JobPlan, faults: JobFaults, rng: np.random.Generator) -> JobRun:
    """Run the job from its start offset to ``plan.end_s`` through its disruptions."""
    spec, g = plan.spec, plan.gpus_per_node
    n_nodes = len(plan.nodes)
    n = n_nodes * g
    law = fleet_law(spec, plan.gpu, g)
    run = JobRun(plan, law=law)
    ev = run.events
    tokens_rank = spec.tokens_per_gpu_step
    flops_rank = 6.0 * spec.params * tokens_rank

    t = spec.start_offset_s
    ev.append({"t": t, "kind": "allocated", "job": {"name": spec.name, "kind": "training", "model_name": spec.model_name,
                                                   "world_size": n}})
    ev.append({"t": t + 2.0, "kind": "started"})
    t_run_from = t
    t = t + 2.0 + spec.init_s * float(rng.uniform(0.9, 1.1))
    ev.append({"t": t, "kind": "initialized"})
    S = np.full(n, t)
    step = 0
    last_ckpt_step = 0  # the step training resumes from
    attempt = 0
    pending = sorted(faults.disruptions, key=lambda d: d.t_s)
    kwin: list[StepDetail] = []
    stop_margin = law.step_s * 2

    noise = _Noise(rng, n_nodes, g)
    loss0 = float(rng.uniform(2.1, 2.4))

    def detail_of(st: _Step, step_no: int, t0: float) -> StepDetail:
        loss = loss0 + 6.0 * (step_no + 20) ** -0.35 + rng.normal(0, 0.02, n)
        bad = np.zeros(n, dtype=bool)
        if faults.sdc is not None and t0 >= faults.sdc[1]:
            bad[faults.sdc[0]] = True
        return st.detail(step_no, attempt, S, loss, bad)

    hung = False
    while True:
        if S.max() + stop_margin >= plan.end_s:
            break
        if faults.hang is not None and S.min() >= faults.hang:
            hung = True
            break
        st = _step(plan, faults, noise, S, law, n_nodes, g)
        t0, t1 = float(S.min()), float(st.S_next.max())
        if pending and pending[0].t_s < t1:
            dis = pending.pop(0)
            t_dis = max(dis.t_s, float(S.max()) + 1e-3)
            if t0 < t_dis:
                ev.append({"t": t0, "kind": "step", "step": step, "tokens": tokens_rank * n, "model_flops": flops_rank * n})
            if dis.kind == "failure":
                run.steps_rerun += step - last_ckpt_step
            kwin = []
            t_dis = _disrupt(run, dis, t_dis, step, spec, rng)
            run.running.append((t_run_from, t_dis))
            if dis.kind == "preempted":
                last_ckpt_step = step  # a graceful save before giving the nodes back
            attempt += 1
            t = t_dis + dis.recovery_s
            if dis.kind == "preempted":
                ev.append({"t": t, "kind": "allocated"})
            ev.append({"t": t + 1.0, "kind": "restart", "cause": dis.cause})
            t_run_from = t
            t = t + 1.0 + spec.init_s * float(rng.uniform(0.9, 1.1))
            ev.append({"t": t, "kind": "initialized"})
            ev.append({"t": t, "kind": "checkpoint_restore_start", "step": last_ckpt_step})
            t += spec.checkpoint_restore_s * float(rng.uniform(0.9, 1.1))
            ev.append({"t": t, "kind": "checkpoint_restore_end", "step": last_ckpt_step})
            step = last_ckpt_step
            S = np.full(n, t)
            continue
        ev.append({"t": t0, "kind": "step", "step": step, "tokens": tokens_rank * n, "model_flops": flops_rank * n})
        if step % plan.detail_every == 0:
            run.details.append(detail_of(st, step, t0))
        if not run.kineto and t0 >= plan.kineto_from_s:
            kwin.append(run.details[-1] if step % plan.detail_every == 0 else detail_of(st, step, t0))
            if len(kwin) == plan.kineto_steps:
                run.kineto = kwin
        run.steps_run += 1
        step += 1
        S = st.S_next
        if spec.checkpoint_every_steps and step % spec.checkpoint_every_steps == 0:
            ts = float(S.max())
            ev.append({"t": ts, "kind": "checkpoint_save_start", "step": step})
            te = ts + spec.checkpoint_save_s * float(rng.uniform(0.9, 1.2))
            ev.append({"t": te, "kind": "checkpoint_save_end", "step": step, "bytes": int(spec.params * 14)})
            last_ckpt_step = step
            kwin = [] if not run.kineto else kwin
            S = np.full(n, te) + rng.uniform(0, 1e-3, n)
    if hung:
        # a hang ends nothing: no event, the ranks keep their GPUs, busy spinning in the collective's kernel
        run.running.append((t_run_from, plan.end_s))
        return run
    t_end = float(S.max())
    run.running.append((t_run_from, t_end))
    ev.append({"t": t_end, "kind": "finished", "job": {"status": "completed"}})
    return run


def _disrupt(run: JobRun, dis: Disruption, t: float, step: int, spec: JobSpec, rng: np.random.Generator) -> float:
    """Record a failure or a preemption; return when the job's nodes were released."""
    ev = run.events
    if dis.kind == "failure":
        e = {"t": t, "kind": "failure", "cause": dis.cause}
        if dis.rank is not None:
            e["rank"] = dis.rank
        ev.append(e)
        return t
    # preemption: the scheduler's SIGTERM gives time for a checkpoint, then the job is stopped
    ev.append({"t": t, "kind": "checkpoint_save_start", "step": step})
    t2 = t + spec.checkpoint_save_s * float(rng.uniform(0.9, 1.2))
    ev.append({"t": t2, "kind": "checkpoint_save_end", "step": step, "bytes": int(spec.params * 14)})
    ev.append({"t": t2 + 0.5, "kind": "preempted", "cause": dis.cause})
    return t2 + 0.5


class _Noise:
    """Random draws for blocks of steps at a time: one generator call per block instead of a dozen per
    step keeps a two-hour fleet fast. The sequence is fixed by the seed, so runs stay reproducible."""

    BLOCK = 256

    def __init__(self, rng: np.random.Generator, n_nodes: int, g: int):
        self.rng, self.n_nodes, self.g, self.i = rng, n_nodes, g, self.BLOCK

    def next(self) -> tuple[np.ndarray, ...]:
        if self.i == self.BLOCK:
            r, B, nn, g = self.rng, self.BLOCK, self.n_nodes, self.g
            n = nn * g
            c = np.exp(r.normal(0.0, 0.015, (B, n)) + r.normal(0.0, 0.01, (B, 1)))
            # a GC pause or page-cache stall on the host, now and then
            hiccup = (r.random((B, n)) < 0.002) * r.uniform(0.02, 0.06, (B, n))
            self.block = (c, hiccup, np.exp(r.normal(0.0, 0.03, (B, nn))), np.exp(r.normal(0.0, 0.03, (B, nn))),
                          np.exp(r.normal(0.0, 0.03, (B, g))), np.exp(r.normal(0.0, 0.05, (B, n))),
                          r.exponential(0.002, (B, n)))
            self.i = 0
        out = tuple(x[self.i] for x in self.block)
        self.i += 1
        return out


@dataclass
class _Step:
    """One step, compactly: per-node and per-rail times (all ranks of a node leave a node collective
    together, all members of a rail leave the rail all-reduce together)."""

    g: int
    compute_end: np.ndarray  # per rank
    a_rs: np.ndarray  # per rank
    rs_end: np.ndarray  # per node
    ar_end: np.ndarray  # per rail (local index)
    gn_end: float
    opt_end: np.ndarray  # per rank
    ag_end: np.ndarray  # per node
    S_next: np.ndarray  # per rank

    def detail(self, step: int, attempt: int, S: np.ndarray, loss: np.ndarray, bad: np.ndarray) -> StepDetail:
        n = len(S)
        nn = n // self.g
        return StepDetail(step, attempt, S, self.S_next, self.compute_end, self.a_rs, np.repeat(self.rs_end, self.g),
                          np.tile(self.ar_end, nn), np.full(n, self.gn_end), self.opt_end, np.repeat(self.ag_end, self.g),
                          loss, bad)


def _step(plan: JobPlan, faults: JobFaults, noise: _Noise, S: np.ndarray, law: FleetLaw, n_nodes: int, g: int) -> _Step:
    """One step on every rank: arrivals, collective starts (the last member's arrival) and ends."""
    t_now = float(S[0])
    cn, hic, rsn, agn, arn, optn, gap = noise.next()
    c = law.compute_s * cn + hic
    if faults.thermal is not None:
        r, a, b, f = faults.thermal
        if a <= t_now < b:
            c = c.copy()
            c[r] *= f
    rs_node = law.rs_s * rsn
    ag_node = law.ag_s * agn
    for slow in (faults.slow_link, faults.ib_flap):
        if slow is not None:
            k, a, b, f = slow
            if a <= t_now < b:
                rs_node, ag_node = rs_node.copy(), ag_node.copy()
                rs_node[k] *= f
                ag_node[k] *= f
    compute_end = S + c
    a_rs = compute_end - law.overlap_s * 0.95
    rs_end = a_rs.reshape(n_nodes, g).max(axis=1) + rs_node
    ar_end = rs_end.max() + law.ar_s * arn if n_nodes > 1 else np.full(g, rs_end.max())
    gn_end = float(ar_end.max()) + law.gn_s
    opt_end = gn_end + OPTIMIZER_S * optn
    ag_end = opt_end.reshape(n_nodes, g).max(axis=1) + ag_node
    S_next = np.repeat(ag_end, g) + HOST_GAP_S + gap
    return _Step(g, compute_end, a_rs, rs_end, ar_end, gn_end, opt_end, ag_end, S_next)


def expected_steps(plan: JobPlan) -> int:
    law = fleet_law(plan.spec, plan.gpu, plan.gpus_per_node)
    return max(0, math.floor((plan.end_s - plan.spec.start_offset_s) / law.step_s))

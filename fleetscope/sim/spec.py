"""What to simulate: the fleet, its jobs, the faults to inject and the outputs to write.

Everything the simulator does is a function of a :class:`SimSpec`; nothing reads the wall clock, so a
spec (with its ``start``) and a seed give the same bytes every time.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field, replace


@dataclass(frozen=True)
class GpuModel:
    """The GPU properties the models need. Figures from NVIDIA's H100 / A100 datasheets (SXM parts):
    dense BF16 peak, TDP, NVLink bandwidth per GPU and direction (NVLink 4: 900 GB/s bidirectional, so
    450 GB/s each way; NVLink 3: 600 / 300), HBM size; the NIC is one 400 Gb/s (50 GB/s) ConnectX-7 per
    GPU on rail-optimised H100 systems (200 Gb/s on A100 systems)."""

    key: str
    name: str  # as NVML / dcgm-exporter's modelName label reports it
    bf16_peak_flops: float
    tdp_w: float
    idle_w: float
    nvlink_bytes_per_s: float
    nic_bytes_per_s: float
    memory_mib: int
    max_sm_clock_mhz: float
    mem_clock_mhz: float


GPU_MODELS: dict[str, GpuModel] = {
    m.key: m
    for m in (
        GpuModel("H100-SXM", "NVIDIA H100 80GB HBM3", 989e12, 700.0, 70.0, 450e9, 50e9, 81559, 1980.0, 2619.0),
        GpuModel("A100-SXM", "NVIDIA A100-SXM4-80GB", 312e12, 400.0, 55.0, 300e9, 25e9, 81920, 1410.0, 1593.0),
    )
}


@dataclass(frozen=True)
class JobSpec:
    """One data-parallel training job. ``nodes`` whole nodes; compute per step follows from the model
    size and tokens (6·P·tokens FLOPs, Kaplan et al. 2020) at ``kernel_efficiency`` of the GPU's peak."""

    job_id: str
    nodes: int
    name: str = "pretrain"
    model_name: str = "llama-3-8b"
    params: float = 8e9
    tokens_per_gpu_step: int = 16384
    kernel_efficiency: float = 0.5
    start_offset_s: float = 60.0
    checkpoint_every_steps: int = 300
    checkpoint_save_s: float = 20.0
    checkpoint_restore_s: float = 25.0
    init_s: float = 45.0
    overlap_fraction: float = 0.5  # share of the intra-node reduce-scatter hidden behind the backward pass


@dataclass(frozen=True)
class FaultSpec:
    """Which faults to inject. Each is placed by the seeded generator and reported in the manifest.

    ``gpu_mtbf_h``: mean time between failures of one GPU (all causes), so a job of N GPUs fails as a
    Poisson process of rate N / MTBF. Llama 3's 54-day run saw 419 interruptions on 16,384 GPUs, about
    one per 50,000 GPU-hours (Dubey et al. 2024, §3.3.4); the default is far shorter so that a two-hour
    demo shows failures. ``None`` switches failures off."""

    thermal_straggler: bool = True
    thermal_compute_factor: float = 1.5
    slow_link: bool = True
    slow_link_factor: float = 8.0  # NVLink down to ~PCIe speed
    sdc: bool = True
    sdc_xid: int | None = None  # e.g. 79, 94, 95; None: silent
    preemption: bool = True
    row_remap_failure: bool = True
    hung_job: bool = True
    silent_host: bool = True
    flapping_ib_link: bool = True
    # the node's inter-node collective phases while the port retrains: NCCL stalls on each link-down and
    # resumes on a retrained (often narrower) link, so its ranks communicate far slower than their peers
    flapping_ib_comm_factor: float = 4.0
    gpu_mtbf_h: float | None = 400.0
    min_failures: int = 1  # at least this many failures (the Poisson draw is kept when it has more)
    recovery_s: tuple[float, float] = (120.0, 300.0)  # detect + reschedule, uniform
    preemption_wait_s: float = 600.0


@dataclass(frozen=True)
class SimSpec:
    """A whole simulation. Sizes, durations and intervals are parameters; ``start`` is explicit (UTC)."""

    seed: int = 7
    start: dt.datetime = dt.datetime(2025, 3, 3, 8, 0, tzinfo=dt.UTC)
    duration_s: float = 600.0
    sites: int = 2
    racks_per_site: int = 2
    nodes_per_rack: int = 2
    gpus_per_node: int = 8
    gpu_model: str = "H100-SXM"
    driver_version: str = "580.105.08"
    jobs: tuple[JobSpec, ...] = ()
    n_jobs: int = 2  # used when ``jobs`` is empty
    job_node_share: float = 0.8  # share of the fleet's nodes auto-generated jobs take
    faults: FaultSpec = field(default_factory=FaultSpec)
    dcgm_interval_s: float = 30.0
    facility_interval_s: float = 300.0
    detail_every_steps: int = 20  # rank-level step events, NCCL Inspector records, checksums
    kineto_nodes: int = 3  # nodes per job whose ranks are profiled
    kineto_steps: int = 6
    k8s_pod_labels: bool = False
    prediction_rows: int = 4000
    write_dcgm: bool = True
    ib_interval_s: float = 60.0  # node_exporter infiniband scrapes (all hosts in one body per scrape)

    def __post_init__(self) -> None:
        if self.start.tzinfo is None:
            raise ValueError("start must be timezone-aware (UTC)")
        if self.gpu_model not in GPU_MODELS:
            raise ValueError(f"unknown gpu_model {self.gpu_model!r}; known: {', '.join(GPU_MODELS)}")
        for name in ("sites", "racks_per_site", "nodes_per_rack", "gpus_per_node"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")
        if self.duration_s <= 0 or self.dcgm_interval_s <= 0 or self.facility_interval_s <= 0:
            raise ValueError("duration_s and the intervals must be > 0")

    @property
    def nodes_per_site(self) -> int:
        return self.racks_per_site * self.nodes_per_rack

    @property
    def n_nodes(self) -> int:
        return self.sites * self.nodes_per_site

    @property
    def gpu(self) -> GpuModel:
        return GPU_MODELS[self.gpu_model]


def small_spec(seed: int = 7, **overrides) -> SimSpec:
    """A test-sized fleet: 2 sites × 4 nodes × 8 GPUs (64 GPUs), 2 jobs, 10 simulated minutes."""
    base = SimSpec(seed=seed, duration_s=600.0, sites=2, racks_per_site=2, nodes_per_rack=2, n_jobs=2,
                   dcgm_interval_s=30.0, detail_every_steps=10, kineto_nodes=3, prediction_rows=3000,
                   faults=FaultSpec(gpu_mtbf_h=60.0, recovery_s=(40.0, 60.0), preemption_wait_s=60.0))
    return replace(base, **overrides)


def demo_spec(seed: int = 7, **overrides) -> SimSpec:
    """The demo fleet: 2 sites × 32 nodes (64 nodes, 512 GPUs), 4 jobs, 2 simulated hours, a dcgm
    scrape every 60 s."""
    base = SimSpec(seed=seed, duration_s=7200.0, sites=2, racks_per_site=4, nodes_per_rack=8, n_jobs=4,
                   dcgm_interval_s=60.0, detail_every_steps=50, kineto_nodes=3, prediction_rows=5000)
    return replace(base, **overrides)

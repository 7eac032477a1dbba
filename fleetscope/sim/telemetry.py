"""GPU telemetry as dcgm-exporter reports it, from what the jobs and the faults did.

Power follows activity: a training GPU draws about 80 % of TDP, an idle one its idle power; the energy
counter integrates that power, so counter- and power-based energy agree (the first-order GPU power model
used by ``gpu_fleet`` too). A thermally throttled GPU runs hot with a low SM clock and the thermal
clock-event bits set. Values are in the exporter's own units (%, MiB, mJ, MHz, W), as ``FIELDS`` says.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fleetscope.sim.faults import IDLE_REASON, THERMAL_REASONS, FaultPlan
from fleetscope.sim.fleet import Topology
from fleetscope.sim.jobs import JobRun
from fleetscope.sim.spec import GpuModel

NODE_BUSY_W = 1800.0  # CPUs, memory, NICs and fans of an 8-GPU node under load (excluding GPUs)
NODE_IDLE_W = 900.0
FB_RESERVED_MIB = 566

# (DCGM field, Prometheus type, help text, value kind "i" printed as integer / "d" as %f), in the order a
# dcgm-exporter body lists them. Help texts are the exporter's (etc/default-counters.csv).
FIELDS: tuple[tuple[str, str, str, str], ...] = (
    ("DCGM_FI_DEV_SM_CLOCK", "gauge", "SM clock frequency (in MHz).", "i"),
    ("DCGM_FI_DEV_MEM_CLOCK", "gauge", "Memory clock frequency (in MHz).", "i"),
    ("DCGM_FI_DEV_MEMORY_TEMP", "gauge", "Memory temperature (in C).", "i"),
    ("DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (in C).", "i"),
    ("DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W).", "d"),
    ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "counter", "Total energy consumption since boot (in mJ).", "i"),
    ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "counter", "Total number of PCIe retries.", "i"),
    ("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %).", "i"),
    ("DCGM_FI_DEV_MEM_COPY_UTIL", "gauge", "Memory utilization (in %).", "i"),
    ("DCGM_FI_DEV_ENC_UTIL", "gauge", "Encoder utilization (in %).", "i"),
    ("DCGM_FI_DEV_DEC_UTIL", "gauge", "Decoder utilization (in %).", "i"),
    ("DCGM_FI_DEV_XID_ERRORS", "gauge", "Value of the last XID error encountered.", "i"),
    ("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "gauge", "Current clock event reasons (bitmask of DCGM_CLOCKS_EVENT_REASON_*).", "i"),
    ("DCGM_FI_DEV_FB_FREE", "gauge", "Framebuffer memory free (in MiB).", "i"),
    ("DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer memory used (in MiB).", "i"),
    ("DCGM_FI_DEV_FB_RESERVED", "gauge", "Framebuffer memory reserved (in MiB).", "i"),
    ("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "counter", "Number of remapped rows for uncorrectable errors", "i"),
    ("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "counter", "Number of remapped rows for correctable errors", "i"),
    ("DCGM_FI_DEV_ROW_REMAP_FAILURE", "gauge", "Whether remapping of rows has failed", "i"),
    ("DCGM_FI_DEV_VGPU_LICENSE_STATUS", "gauge", "vGPU License status", "i"),
    ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "gauge", "Ratio of time the graphics engine is active.", "d"),
    ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "gauge", "Ratio of cycles the tensor (HMMA) pipe is active.", "d"),
    ("DCGM_FI_PROF_DRAM_ACTIVE", "gauge", "Ratio of cycles the device memory interface is active sending or receiving data.", "d"),
    ("DCGM_FI_PROF_PCIE_TX_BYTES", "gauge", "The rate of data transmitted over the PCIe bus - including both protocol headers and data payloads - in bytes per second.", "i"),
    ("DCGM_FI_PROF_PCIE_RX_BYTES", "gauge", "The rate of data received over the PCIe bus - including both protocol headers and data payloads - in bytes per second.", "i"),
)


@dataclass
class GpuActivity:
    """Which GPU belongs to which job, and when each job ran (seconds from the simulation start)."""

    job_of_gpu: np.ndarray  # int, -1 when no job
    running: list[list[tuple[float, float]]]  # per job

    @classmethod
    def from_runs(cls, topo: Topology, runs: list[JobRun]) -> GpuActivity:
        job_of = np.full(topo.n_gpus, -1, dtype=np.int64)
        g = topo.gpus_per_node
        for j, r in enumerate(runs):
            for node in r.plan.nodes:
                job_of[node * g:(node + 1) * g] = j
        return cls(job_of, [list(r.running) for r in runs])

    def busy(self, t_s: float) -> np.ndarray:
        on = np.array([any(a <= t_s < b for a, b in iv) for iv in self.running] + [False], dtype=bool)
        return on[self.job_of_gpu]  # index -1 picks the trailing False


class GpuTelemetry:
    """Stateful over successive scrapes only through the energy and replay counters."""

    def __init__(self, topo: Topology, gpu: GpuModel, activity: GpuActivity, faults: FaultPlan, rng: np.random.Generator):
        self.topo, self.gpu, self.act, self.faults, self.rng = topo, gpu, activity, faults, rng
        n = topo.n_gpus
        self.energy_mj = rng.uniform(5e9, 5e11, n)  # since boot
        self.replays = np.zeros(n)
        self.last_t: float | None = None
        self.last_power = np.full(n, gpu.idle_w)

    def expected_power_w(self, t_s: float) -> np.ndarray:
        """Noise-free GPU power at ``t_s`` (what the IT meters integrate)."""
        busy = self.act.busy(t_s)
        p = np.where(busy, 0.80 * self.gpu.tdp_w, self.gpu.idle_w)
        th = self._throttled(t_s, busy)
        if th is not None:
            p[th] = 0.68 * self.gpu.tdp_w
        return p

    def _throttled(self, t_s: float, busy: np.ndarray) -> int | None:
        tg = self.faults.thermal_gpu
        if tg is not None and tg[1] <= t_s < tg[2] and busy[tg[0]]:
            return tg[0]
        return None

    def scrape(self, t_s: float) -> dict[str, np.ndarray]:
        """Every field of ``FIELDS`` for every GPU at ``t_s``, in exporter units."""
        rng, gpu, n = self.rng, self.gpu, self.topo.n_gpus
        busy = self.act.busy(t_s)
        th = self._throttled(t_s, busy)
        power = np.where(busy, 0.80 * gpu.tdp_w + rng.normal(0, 18, n), gpu.idle_w + rng.normal(0, 2.5, n))
        temp = np.where(busy, 63 + rng.normal(0, 2.5, n), 31 + rng.normal(0, 1.5, n))
        mem_temp = np.where(busy, 56 + rng.normal(0, 2, n), 33 + rng.normal(0, 1.2, n))
        sm_clock = np.where(busy, gpu.max_sm_clock_mhz - rng.integers(0, 4, n) * 15, 345.0)
        reasons = np.where(busy, 0, IDLE_REASON)
        util = np.where(busy, rng.integers(96, 101, n), 0)
        mem_util = np.where(busy, rng.integers(30, 46, n), 0)
        fb_used = np.where(busy, 71000 + rng.integers(-400, 400, n), 0)
        tensor = np.where(busy, np.clip(0.42 + rng.normal(0, 0.02, n), 0, 1), 0.0)
        gr = np.where(busy, np.clip(0.95 + rng.normal(0, 0.01, n), 0, 1), 0.0)
        dram = np.where(busy, np.clip(0.36 + rng.normal(0, 0.02, n), 0, 1), 0.0)
        tx = np.where(busy, rng.normal(2.1e9, 1e8, n), rng.normal(1.1e5, 1e4, n))
        rx = np.where(busy, rng.normal(1.7e9, 1e8, n), rng.normal(1.6e4, 2e3, n))
        if th is not None:
            power[th] = 0.68 * gpu.tdp_w + rng.normal(0, 10)
            temp[th] = 89 + rng.normal(0, 1.0)
            mem_temp[th] = 84 + rng.normal(0, 1.0)
            sm_clock[th] = 1310 - 15 * int(rng.integers(0, 4))
            reasons[th] = THERMAL_REASONS
            tensor[th] *= 1 / 1.5
        sl = self.faults.slow_link_node
        if sl is not None and sl[1] <= t_s < sl[2]:
            g = self.topo.gpus_per_node
            self.replays[sl[0] * g:(sl[0] + 1) * g] += rng.poisson(40, g)
        if self.last_t is not None:
            # trapezoid between scrapes: the counter grows with the power drawn in between
            self.energy_mj += (self.last_power + power) / 2 * (t_s - self.last_t) * 1000.0
        self.last_t, self.last_power = t_s, power
        xid = np.zeros(n, dtype=np.int64)
        for gi, events in self.faults.xids.items():
            for tx_s, code in events:
                if tx_s <= t_s:
                    xid[gi] = code
        remap_fail = np.zeros(n, dtype=np.int64)
        remap_unc = np.zeros(n, dtype=np.int64)
        rr = self.faults.row_remap
        if rr is not None and rr[1] <= t_s:
            remap_fail[rr[0]] = 1
            remap_unc[rr[0]] = 1
        zeros = np.zeros(n, dtype=np.int64)
        return {
            "DCGM_FI_DEV_SM_CLOCK": sm_clock,
            "DCGM_FI_DEV_MEM_CLOCK": np.full(n, gpu.mem_clock_mhz),
            "DCGM_FI_DEV_MEMORY_TEMP": mem_temp,
            "DCGM_FI_DEV_GPU_TEMP": temp,
            "DCGM_FI_DEV_POWER_USAGE": power,
            "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": self.energy_mj,
            "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": self.replays,
            "DCGM_FI_DEV_GPU_UTIL": util,
            "DCGM_FI_DEV_MEM_COPY_UTIL": mem_util,
            "DCGM_FI_DEV_ENC_UTIL": zeros,
            "DCGM_FI_DEV_DEC_UTIL": zeros,
            "DCGM_FI_DEV_XID_ERRORS": xid,
            "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": reasons,
            "DCGM_FI_DEV_FB_FREE": gpu.memory_mib - FB_RESERVED_MIB - fb_used,
            "DCGM_FI_DEV_FB_USED": fb_used,
            "DCGM_FI_DEV_FB_RESERVED": np.full(n, FB_RESERVED_MIB),
            "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": remap_unc,
            "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": zeros,
            "DCGM_FI_DEV_ROW_REMAP_FAILURE": remap_fail,
            "DCGM_FI_DEV_VGPU_LICENSE_STATUS": zeros,
            "DCGM_FI_PROF_GR_ENGINE_ACTIVE": gr,
            "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": tensor,
            "DCGM_FI_PROF_DRAM_ACTIVE": dram,
            "DCGM_FI_PROF_PCIE_TX_BYTES": np.maximum(tx, 0),
            "DCGM_FI_PROF_PCIE_RX_BYTES": np.maximum(rx, 0),
        }

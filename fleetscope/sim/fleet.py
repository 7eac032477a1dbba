"""A fleet of GPUs with plausible telemetry: inventory plus wide GPU samples, deterministic per seed."""

from __future__ import annotations

import datetime as dt
import hashlib
from dataclasses import dataclass

import numpy as np
import polars as pl

from fleetscope.core import frames as F


@dataclass(frozen=True)
class FleetSpec:
    sites: int = 2
    nodes_per_site: int = 4
    gpus_per_node: int = 8
    gpu_model: str = "NVIDIA H100 80GB HBM3"
    tdp_w: float = 700.0
    idle_w: float = 70.0
    interval_s: int = 10
    seed: int = 7


def _uuid(seed: int, host: str, index: int) -> str:
    # hashlib, not hash(): Python salts str hashes per process, and the fleet must be the same every run.
    h = hashlib.sha1(f"{seed}/{host}/{index}".encode()).hexdigest()
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def gpu_fleet(spec: FleetSpec, start: dt.datetime, duration_s: int) -> F.Batch:
    """Sites, hosts, GPUs and one sample per GPU every ``spec.interval_s`` over ``duration_s``.

    Power follows utilisation linearly between idle and TDP (the usual first-order GPU power model);
    the energy counter integrates that power, so counter- and power-based energy agree.
    """
    rng = np.random.default_rng(spec.seed)
    sites = [f"site-{chr(ord('a') + i)}" for i in range(spec.sites)]
    hosts = [f"{s}-node-{n:03d}" for s in sites for n in range(spec.nodes_per_site)]
    gpu_rows = [
        {
            "gpu_uuid": _uuid(spec.seed, h, g),
            "host": h,
            "gpu_index": g,
            "pci_bus_id": f"00000000:{0x18 + 0x11 * g:02X}:00.0",
            "model_name": spec.gpu_model,
        }
        for hi, h in enumerate(hosts)
        for g in range(spec.gpus_per_node)
    ]
    gpus = pl.DataFrame(gpu_rows)
    n = gpus.height
    steps = max(1, duration_s // spec.interval_s)
    ts = pl.datetime_range(start, start + dt.timedelta(seconds=spec.interval_s * (steps - 1)), f"{spec.interval_s}s", time_zone="UTC", eager=True)
    # Busy GPUs hover near 85% with noise; a quarter of the nodes idle.
    busy = np.repeat(rng.random(len(hosts)) > 0.25, spec.gpus_per_node)
    util = np.clip(np.where(busy, 0.85, 0.02)[None, :] + rng.normal(0, 0.05, (steps, n)), 0, 1)
    power = spec.idle_w + (spec.tdp_w - spec.idle_w) * util
    energy = np.cumsum(power * spec.interval_s, axis=0) + rng.uniform(1e6, 1e8, n)[None, :]
    samples = pl.DataFrame(
        {
            "ts": np.repeat(ts.to_numpy(), n),
            "gpu_uuid": np.tile(gpus["gpu_uuid"].to_numpy(), steps),
            "util_ratio": util.ravel(),
            "sm_active_ratio": (util * 0.9).ravel(),
            "tensor_active_ratio": (util * 0.45).ravel(),
            "power_w": power.ravel(),
            "energy_j": energy.ravel(),
            "temp_c": (30 + 45 * util + rng.normal(0, 1, (steps, n))).ravel(),
            "fb_used_bytes": (util * 70 * 2**30).astype(np.int64).ravel(),
            "sm_clock_mhz": np.where(util > 0.1, 1980.0, 345.0).ravel(),
        }
    ).with_columns(pl.col("ts").dt.replace_time_zone("UTC"))
    return F.Batch(
        source=f"sim:gpu_fleet(seed={spec.seed})",
        site=pl.DataFrame({"site_id": sites, "name": sites}),
        host=pl.DataFrame({"host": hosts, "site_id": [h.rsplit("-node-", 1)[0] for h in hosts]}),
        gpu=gpus,
        gpu_sample=samples,
    )


# --- topology for the full simulator -----------------------------------------------------------


@dataclass(frozen=True)
class Topology:
    """Sites → racks → nodes → GPUs, as flat arrays indexed by global GPU index (node-major)."""

    sites: tuple[str, ...]
    hosts: tuple[str, ...]  # one per node
    host_site: tuple[str, ...]
    host_rack: tuple[str, ...]
    gpus_per_node: int
    gpu_uuid: tuple[str, ...]
    pci_bus_id: tuple[str, ...]
    model_name: str

    @property
    def n_gpus(self) -> int:
        return len(self.gpu_uuid)

    def gpu_index(self, node: int, local: int) -> int:
        return node * self.gpus_per_node + local

    def frames(self) -> F.Batch:
        """Inventory as canonical frames (site, host, gpu)."""
        g = self.gpus_per_node
        return F.Batch(
            source="sim:topology",
            site=pl.DataFrame({"site_id": list(self.sites), "name": list(self.sites)}),
            host=pl.DataFrame({"host": list(self.hosts), "site_id": list(self.host_site)}),
            gpu=pl.DataFrame({
                "gpu_uuid": list(self.gpu_uuid),
                "host": [h for h in self.hosts for _ in range(g)],
                "gpu_index": [i for _ in self.hosts for i in range(g)],
                "pci_bus_id": list(self.pci_bus_id),
                "model_name": [self.model_name] * self.n_gpus,
            }),
        )


def _pci_bus_id(local: int) -> str:
    # HGX H100 boards put the eight GPUs on buses 0x18, 0x2a, 0x3a, 0x5d, 0x9a, 0xab, 0xba, 0xdb; any
    # distinct ids would do, these look like the real thing.
    buses = (0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB)
    bus = buses[local] if local < len(buses) else 0x10 + local
    return f"00000000:{bus:02X}:00.0"


def build_topology(sites: int, racks_per_site: int, nodes_per_rack: int, gpus_per_node: int, model_name: str, seed: int) -> Topology:
    """Names are stable for a given shape (``site-a-r01-n003``); GPU UUIDs depend on the seed too."""
    site_names = tuple(f"site-{chr(ord('a') + i)}" if i < 26 else f"site-{i:03d}" for i in range(sites))
    hosts, host_site, host_rack = [], [], []
    for s in site_names:
        for r in range(racks_per_site):
            for n in range(nodes_per_rack):
                hosts.append(f"{s}-r{r:02d}-n{n:03d}")
                host_site.append(s)
                host_rack.append(f"{s}-r{r:02d}")
    uuids = tuple(_uuid(seed, h, g) for h in hosts for g in range(gpus_per_node))
    pci = tuple(_pci_bus_id(g) for _ in hosts for g in range(gpus_per_node))
    return Topology(site_names, tuple(hosts), tuple(host_site), tuple(host_rack), gpus_per_node, uuids, pci, model_name)

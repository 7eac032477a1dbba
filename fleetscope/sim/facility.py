"""Facility meters and grid carbon intensity per site, as ``metric_sample`` series.

Series follow the conventions ``analyzers.facility`` and ``analyzers.carbon`` read (README, "Energy, PUE and
carbon"): ``facility_power_w{site}``, ``it_power_w{point="it",site}`` and
``grid_intensity_g_per_kwh{site}`` (hourly).

- PUE is diurnal: cooling works hardest in the local afternoon (outside air is warmest), so
  PUE(t) = base + amplitude · cos(2π (local hour − 15) / 24), plus meter noise. Typical hyperscale
  PUE is 1.1–1.4 (Uptime Institute's annual surveys report an industry average near 1.55).
- Grid intensity follows the daily solar cycle: lowest around local noon, highest in the evening
  peak, around a per-site annual mean of the order of the national figures in
  ``analyzers/data/grid_intensity.csv``.
"""

from __future__ import annotations

import datetime as dt
import math
from dataclasses import dataclass

import numpy as np

from fleetscope.sim.fleet import Topology
from fleetscope.sim.telemetry import NODE_BUSY_W, NODE_IDLE_W, GpuTelemetry


@dataclass(frozen=True)
class SiteClimate:
    utc_offset_h: float
    pue_base: float
    pue_amplitude: float
    grid_mean_g_per_kwh: float
    solar_dip: float  # share of the mean intensity that midday solar takes away


_CLIMATES = (
    SiteClimate(1.0, 1.18, 0.05, 380.0, 0.35),  # a central-European site on a mixed grid
    SiteClimate(-6.0, 1.32, 0.09, 240.0, 0.25),  # a warmer site on a cleaner grid
    SiteClimate(9.0, 1.25, 0.06, 450.0, 0.2),
)


def climate(i: int) -> SiteClimate:
    return _CLIMATES[i % len(_CLIMATES)]


def pue_at(c: SiteClimate, t: dt.datetime) -> float:
    local_h = (t.hour + t.minute / 60 + c.utc_offset_h) % 24
    return c.pue_base + c.pue_amplitude * math.cos(2 * math.pi * (local_h - 15) / 24)


def grid_at(c: SiteClimate, hour: dt.datetime) -> float:
    local_h = (hour.hour + 0.5 + c.utc_offset_h) % 24
    solar = max(0.0, math.cos(2 * math.pi * (local_h - 12.5) / 24)) ** 2  # daylight bump centred on noon
    evening = math.exp(-((local_h - 19) ** 2) / 8)  # the evening peak runs gas plants
    return c.grid_mean_g_per_kwh * (1 - c.solar_dip * solar + 0.15 * evening)


def facility_series(topo: Topology, telem: GpuTelemetry, start: dt.datetime, duration_s: float, interval_s: float,
                    rng: np.random.Generator) -> list[tuple[str, str, dict[str, str], list[tuple[int, float]]]]:
    """(name, unit, labels, [(epoch µs, value)]) per site for the three series."""
    base_us = (start - dt.datetime(1970, 1, 1, tzinfo=dt.UTC)) // dt.timedelta(microseconds=1)
    g = topo.gpus_per_node
    site_of_gpu = np.repeat(np.array(topo.host_site, dtype=object), g)
    times = np.arange(0.0, duration_s + 1e-9, interval_s)
    out = []
    for i, site in enumerate(topo.sites):
        c = climate(i)
        mask = site_of_gpu == site
        fac, it = [], []
        for t in times:
            p = telem.expected_power_w(float(t))
            busy_nodes = float(np.sum(p[mask].reshape(-1, g).mean(axis=1) > telem.gpu.idle_w * 1.5))
            nodes = mask.sum() / g
            it_w = float(p[mask].sum()) + busy_nodes * NODE_BUSY_W + (nodes - busy_nodes) * NODE_IDLE_W
            it_w *= 1 + rng.normal(0, 0.003)
            pue = pue_at(c, start + dt.timedelta(seconds=float(t))) + rng.normal(0, 0.004)
            us = base_us + round(float(t) * 1e6)
            it.append((us, it_w))
            fac.append((us, it_w * pue))
        out.append(("facility_power_w", "W", {"site": site}, fac))
        out.append(("it_power_w", "W", {"site": site, "point": "it"}, it))
        h0 = start.replace(minute=0, second=0, microsecond=0)
        hours = [h0 + dt.timedelta(hours=k) for k in range(int(math.ceil(duration_s / 3600)) + 1)]
        grid = [((h - dt.datetime(1970, 1, 1, tzinfo=dt.UTC)) // dt.timedelta(microseconds=1), grid_at(c, h) * (1 + rng.normal(0, 0.02)))
                for h in hours]
        out.append(("grid_intensity_g_per_kwh", "g/kWh", {"site": site}, grid))
    return out

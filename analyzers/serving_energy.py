"""Energy per output token of a serving deployment: the energy of the GPUs its replicas held, over the output
tokens they generated in the same window.

The GPUs come from pod attribution: a minute of a GPU counts for the deployment when dcgm-exporter's
``gpu_workload`` shows one of the deployment's pods holding it in that minute (the per-minute per-GPU
roll-up ``gpu_energy_minute`` supplies the joules). Where no attribution is stored, a server that meters its
GPUs itself (Triton's ``nv_energy_consumption``, a joules counter since the server started) gives the
energy as that counter's increase; the result's ``basis`` says which. Facility energy is GPU energy × PUE
(ISO/IEC 30134-2: PUE = facility energy / IT energy; applied to the GPU share it counts GPU energy as the
IT energy and so leaves out CPUs, memory and network, a lower bound). Per million tokens, as the MLPerf
Inference power results and the serving-cost literature quote it.

Pure: frames in, a dataclass out.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import polars as pl

from fleetscope.core.frames import require_columns

J_PER_KWH = 3.6e6


@dataclass(frozen=True)
class EnergyPerToken:
    deployment: str
    basis: str  # gpu_energy_minute, server_energy_counter, or none
    gpus: int
    gpu_energy_j: float
    output_tokens: float
    j_per_token: float
    gpu_kwh_per_million_tokens: float
    pue: float
    facility_kwh_per_million_tokens: float

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def held_minutes(workload: pl.DataFrame, pods: pl.DataFrame) -> pl.DataFrame:
    """``minute, gpu_uuid`` of every minute in which one of ``pods`` (``namespace, pod``; a null namespace
    matches any) held a GPU, from ``gpu_workload`` samples."""
    require_columns(workload, "gpu_workload", ("ts", "gpu_uuid", "namespace", "pod"))
    if workload.height == 0 or pods.height == 0:
        return pl.DataFrame(schema={"minute": workload.schema["ts"], "gpu_uuid": pl.String})
    exact = workload.join(pods.filter(pl.col("namespace").is_not_null()).select("namespace", "pod"), on=["namespace", "pod"])
    anyns = workload.join(pods.filter(pl.col("namespace").is_null()).select("pod"), on="pod")
    both = pl.concat([exact.select("ts", "gpu_uuid"), anyns.select("ts", "gpu_uuid")])
    return both.select(pl.col("ts").dt.truncate("1m").alias("minute"), "gpu_uuid").unique().sort("minute", "gpu_uuid")


def energy_per_token(deployment: str, *, output_tokens: float, gpu_minutes: pl.DataFrame | None = None, held: pl.DataFrame | None = None,
                     server_energy_j: float | None = None, pue: float | None = None) -> EnergyPerToken:
    """Energy per output token from the held GPU-minutes' roll-up (``gpu_minutes``: ``minute, gpu_uuid,
    energy_j``), else from the server's own energy counter increase ``server_energy_j``."""
    basis, gpus, energy = "none", 0, math.nan
    if gpu_minutes is not None and held is not None and held.height:
        require_columns(gpu_minutes, "gpu_energy_minute", ("minute", "gpu_uuid", "energy_j"))
        joined = gpu_minutes.join(held, on=["minute", "gpu_uuid"])
        if joined.height:
            basis, gpus, energy = "gpu_energy_minute", held["gpu_uuid"].n_unique(), float(joined["energy_j"].sum())
    if basis == "none" and server_energy_j is not None:
        basis, energy = "server_energy_counter", float(server_energy_j)
    jpt = energy / output_tokens if output_tokens > 0 and math.isfinite(energy) else math.nan
    kwh_m = jpt * 1e6 / J_PER_KWH
    p = pue if pue is not None and pue >= 1 else math.nan
    return EnergyPerToken(deployment, basis, gpus, energy, float(output_tokens), jpt, kwh_m, p, kwh_m * p)

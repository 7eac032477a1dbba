"""The SDC known-answer test: a matrix-multiply chain on small integers. Every product and every partial
sum is an integer below 2**24, so float64, float32 and TF32 arithmetic are exact in *any* summation order:
the result is bit-identical across BLAS builds, thread counts and GPUs, and one SHA-256 is the golden answer
for all of them. A device that returns another digest computed something wrong (the screen it feeds, and
its sources, are ``analyzers.sdc``'s).

The probe's arithmetic and its golden digests are here, and so is its record: a result as the ``sdc_probe``
health event a node sends (``probe_event``) and those events read back as the rows the screen takes
(``probe_results``), so that the CLI, the agent and the sweep agree on one encoding. Running it on a device is
``fleetscope.devices.probe.run_probe``.

Pure: numpy in, digests, dataclasses and frames out.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import polars as pl

from fleetscope.core.spec import UTC_US

__all__ = ["PROBE_N", "PROBE_ROUNDS", "PROBE_SEED", "PROBE_GOLDEN_SHA256", "probe_inputs", "probe_matmul", "probe_digest",
           "ProbeResult", "check_probe", "probe_event", "probe_results"]

PROBE_N = 256
PROBE_ROUNDS = 8
PROBE_SEED = 20_240_731
_PROBE_LO, _PROBE_HI, _PROBE_MOD = -8, 8, 17
# Golden digest of probe_matmul(PROBE_N, PROBE_ROUNDS, PROBE_SEED): computed with numpy's exact int64
# matmul (no BLAS) and checked equal to float64 BLAS; see tests/analyzers/test_sdc.py. Any correct device
# gives this value, because every intermediate is an integer that float32 represents exactly.
PROBE_GOLDEN_SHA256: dict[tuple[int, int, int], str] = {
    (PROBE_N, PROBE_ROUNDS, PROBE_SEED): "bd1dcbc036f416e5e9ae752ef346462241583f51d03e9b8d08c9b526bf6d2b21",
}


def probe_inputs(n: int = PROBE_N, seed: int = PROBE_SEED) -> tuple[np.ndarray, np.ndarray]:
    """The probe's two n×n matrices of integers in [-8, 8], from numpy's PCG64 with a fixed seed (the
    generator's stream is fixed across numpy versions by NEP 19)."""
    if not 1 <= n <= 8192:
        raise ValueError("probe size must be 1..8192")
    rng = np.random.Generator(np.random.PCG64(seed))
    a = rng.integers(_PROBE_LO, _PROBE_HI + 1, size=(n, n), dtype=np.int64)
    b = rng.integers(_PROBE_LO, _PROBE_HI + 1, size=(n, n), dtype=np.int64)
    return a, b


def probe_matmul(n: int = PROBE_N, rounds: int = PROBE_ROUNDS, seed: int = PROBE_SEED, *, dtype: Any = np.float64,
                 xp: Any = np, device_put: Any = None) -> np.ndarray:
    """X₀ = A; X_{k+1} = ((X_k · B) mod 17) − 8, for ``rounds`` rounds; returns X_rounds as int64 (numpy).

    Exactness: entries stay in [-8, 8], so each dot product is a sum of n terms of magnitude ≤ 64 and
    every partial sum is an integer of magnitude ≤ 64·n ≤ 2**19 for n ≤ 8192 — exact in float64, float32
    and TF32 (inputs ≤ 8 need 4 mantissa bits), whatever order a BLAS sums in. ``xp`` is the array module
    (numpy, cupy, or torch with ``device_put`` moving arrays to the device).
    """
    if rounds < 1:
        raise ValueError("rounds must be >= 1")
    a, b = probe_inputs(n, seed)
    put = device_put or (lambda arr: xp.asarray(arr.astype(dtype)))
    x, bm = put(a), put(b)
    for _ in range(rounds):
        y = x @ bm
        x = (y % _PROBE_MOD) - 8  # floor modulo in numpy, cupy and torch alike
    if hasattr(x, "cpu"):  # torch
        x = x.cpu().numpy()
    elif hasattr(x, "get"):  # cupy
        x = x.get()
    return np.asarray(x).astype(np.int64)


def probe_digest(result: np.ndarray) -> str:
    """SHA-256 of the result as little-endian int64 in C order, prefixed by its shape (so a truncated
    result cannot collide with a smaller probe)."""
    arr = np.ascontiguousarray(np.asarray(result).astype("<i8"))
    h = hashlib.sha256(f"fleetscope-probe-v1 {arr.shape}".encode())
    h.update(arr.tobytes())
    return h.hexdigest()


@dataclass(frozen=True)
class ProbeResult:
    backend: str
    device: str
    n: int
    rounds: int
    seed: int
    digest: str
    golden: str | None
    passed: bool | None
    seconds: float
    mismatched_elements: int | None = None
    device_type: str = ""  # "cpu" or the GPU's name: the golden digest is the same for every type

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def check_probe(digest: str, n: int = PROBE_N, rounds: int = PROBE_ROUNDS, seed: int = PROBE_SEED,
                golden: Mapping[tuple[int, int, int], str] | None = None) -> bool | None:
    """True when ``digest`` is the golden answer for this probe shape, False when not, None when no
    golden answer is known for it (a probe size nobody has blessed is not a pass)."""
    g = (golden or PROBE_GOLDEN_SHA256).get((n, rounds, seed))
    if not g:
        return None
    return digest == g


def probe_event(result: ProbeResult, *, ts: dt.datetime, host: str, gpu_uuid: str) -> pl.DataFrame:
    """One ``sdc_probe`` health-event row for a probe result (what a node that ran the probe sends): value 1
    passed, 0 failed, null when no golden digest is known for the probe's shape; the digests in ``message``."""
    row = {"ts": ts, "host": host, "gpu_uuid": gpu_uuid, "kind": "sdc_probe", "code": 0,
           "value": None if result.passed is None else float(result.passed),
           "message": json.dumps({"digest": result.digest, "golden": result.golden, "backend": result.backend,
                                  "device_type": result.device_type, "mismatched_elements": result.mismatched_elements,
                                  "seconds": result.seconds}),
           "source": "fleetscope probe"}
    return pl.DataFrame([row], schema_overrides={"ts": UTC_US, "value": pl.Float64})


def probe_results(events: pl.DataFrame) -> pl.DataFrame:
    """``sdc_probe`` health events as the probe rows ``sdc.sdc_findings`` reads: gpu_uuid, ts, passed, digest,
    golden, mismatched_elements, device_type."""
    p = events.filter(pl.col("kind") == "sdc_probe") if events.height else events
    if p.height == 0:
        return pl.DataFrame(schema={"gpu_uuid": pl.String, "ts": UTC_US, "passed": pl.Boolean, "digest": pl.String})
    msg = pl.col("message").str.json_path_match
    return p.select("gpu_uuid", "ts", pl.when(pl.col("value").is_not_null()).then(pl.col("value") >= 1.0).alias("passed"),
                    msg("$.digest").alias("digest"), msg("$.golden").alias("golden"),
                    msg("$.mismatched_elements").cast(pl.Int64, strict=False).alias("mismatched_elements"),
                    msg("$.device_type").alias("device_type"))

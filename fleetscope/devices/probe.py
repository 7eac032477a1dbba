"""The known-answer SDC probe on a device: numpy on the CPU, torch or cupy on CUDA. The arithmetic and
the golden digests it is checked against are pure (``analyzers.sdc_probe``); this module imports the GPU
libraries, picks the device and reads the clock.
"""

from __future__ import annotations

import importlib
import time
import uuid
from dataclasses import dataclass
from typing import Any

import numpy as np

from analyzers.sdc_probe import PROBE_GOLDEN_SHA256, PROBE_N, PROBE_ROUNDS, PROBE_SEED, ProbeResult, check_probe, probe_digest, probe_matmul


class ProbeUnavailable(RuntimeError):
    """The probe's backend cannot run here: the message names what is missing (library, CUDA build, driver, device)."""


_CUDA_HINT = "install cupy-cuda12x (or a CUDA build of torch) on a host with an NVIDIA driver and GPU"


def _torch_cuda(device_index: int) -> tuple[Any, Any, str]:
    """(torch, device, device type) or ProbeUnavailable naming what is missing."""
    try:
        torch = importlib.import_module("torch")
    except ImportError as e:
        raise ProbeUnavailable(f"probe backend torch: torch is not installed ({_CUDA_HINT})") from e
    if getattr(getattr(torch, "version", None), "cuda", None) is None:
        raise ProbeUnavailable("probe backend torch: this torch is a CPU-only build (torch.version.cuda is None); "
                               "install a CUDA build of torch")
    if not torch.cuda.is_available():
        raise ProbeUnavailable("probe backend torch: torch sees no CUDA device (no NVIDIA driver loaded, no GPU, "
                               "or CUDA_VISIBLE_DEVICES hides them)")
    count = torch.cuda.device_count()
    if not 0 <= device_index < count:
        raise ProbeUnavailable(f"probe backend torch: no CUDA device {device_index} (torch sees {count})")
    dev = torch.device("cuda", device_index)
    return torch, dev, str(torch.cuda.get_device_name(dev))


def _cupy_cuda(device_index: int) -> tuple[Any, str]:
    """(cupy, device type) or ProbeUnavailable naming what is missing."""
    try:
        cp = importlib.import_module("cupy")
    except ImportError as e:
        raise ProbeUnavailable(f"probe backend cupy: cupy is not installed ({_CUDA_HINT})") from e
    try:
        count = int(cp.cuda.runtime.getDeviceCount())
    except Exception as e:  # noqa: BLE001 - cupy raises its own CUDA errors (no driver, driver too old, no runtime)
        raise ProbeUnavailable(f"probe backend cupy: the CUDA runtime is not usable: {e}") from e
    if not 0 <= device_index < count:
        raise ProbeUnavailable(f"probe backend cupy: no CUDA device {device_index} (cupy sees {count})")
    name = cp.cuda.runtime.getDeviceProperties(device_index)["name"]
    return cp, name.decode(errors="replace") if isinstance(name, bytes) else str(name)


@dataclass(frozen=True)
class CudaDevice:
    """A CUDA device as a probe backend numbers it, with what names it outside CUDA's numbering (which
    ``CUDA_VISIBLE_DEVICES`` and ``CUDA_DEVICE_ORDER`` change): its UUID and PCI address, where the backend says."""

    index: int
    name: str
    uuid: str | None = None  # "GPU-<uuid>", as NVML writes it
    pci: tuple[int, int, int] | None = None  # (domain, bus, device)


def _gpu_uuid(value: Any) -> str | None:
    """A CUDA device UUID (torch's ``_CUuuid`` or text, cupy's 16 bytes) as NVML writes it: ``GPU-`` and 36 characters."""
    if value is None:
        return None
    try:
        text = str(uuid.UUID(bytes=bytes(value))) if isinstance(value, (bytes, bytearray)) else str(uuid.UUID(str(value).removeprefix("GPU-")))
    except (ValueError, TypeError):
        return None
    return f"GPU-{text}"


def _pci(domain: Any, bus: Any, device: Any) -> tuple[int, int, int] | None:
    try:
        return int(domain), int(bus), int(device)
    except (TypeError, ValueError):
        return None


def cuda_devices(backend: str) -> tuple[str, list[CudaDevice]]:
    """The CUDA devices a GPU probe backend sees, and the backend that runs (``torch``, ``cupy``, or for
    ``cuda`` torch where it can reach a GPU, else cupy). Raises ``ProbeUnavailable`` naming what is missing."""
    if backend == "cuda":
        reasons = []
        for candidate in ("torch", "cupy"):
            try:
                return cuda_devices(candidate)
            except ProbeUnavailable as e:
                reasons.append(str(e))
        raise ProbeUnavailable("no CUDA probe backend can run here: " + "; ".join(reasons))
    out = []
    if backend == "torch":
        torch, _, _ = _torch_cuda(0)
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            out.append(CudaDevice(i, str(p.name), _gpu_uuid(getattr(p, "uuid", None)),
                                  _pci(getattr(p, "pci_domain_id", None), getattr(p, "pci_bus_id", None), getattr(p, "pci_device_id", None))))
    elif backend == "cupy":
        cp, _ = _cupy_cuda(0)
        for i in range(int(cp.cuda.runtime.getDeviceCount())):
            p = cp.cuda.runtime.getDeviceProperties(i)
            name = p.get("name", b"")
            out.append(CudaDevice(i, name.decode(errors="replace") if isinstance(name, bytes) else str(name), _gpu_uuid(p.get("uuid")),
                                  _pci(p.get("pciDomainID"), p.get("pciBusID"), p.get("pciDeviceID"))))
    else:
        raise ValueError(f"not a CUDA probe backend: {backend!r} (torch, cupy or cuda)")
    return backend, out


def run_probe(backend: str = "numpy", *, n: int = PROBE_N, rounds: int = PROBE_ROUNDS, seed: int = PROBE_SEED,
              device_index: int = 0) -> ProbeResult:
    """Run the known-answer probe on ``numpy`` (CPU), ``torch`` (CUDA, float32), ``cupy`` (CUDA, float32), or
    ``cuda`` (torch if it can reach a GPU, else cupy) and compare with the golden digest, which is the
    same for every device type. Raises ``ProbeUnavailable`` (a ``RuntimeError``) naming what is missing
    when the backend cannot run here, and ``ValueError`` for an unknown backend."""
    if backend not in ("numpy", "torch", "cupy", "cuda"):
        raise ValueError(f"unknown probe backend {backend!r} (numpy, torch, cupy or cuda)")
    t0 = time.perf_counter()
    if backend == "cuda":
        reasons = []
        for candidate in ("torch", "cupy"):
            try:
                return run_probe(candidate, n=n, rounds=rounds, seed=seed, device_index=device_index)
            except ProbeUnavailable as e:
                reasons.append(str(e))
        raise ProbeUnavailable("no CUDA probe backend can run here: " + "; ".join(reasons))
    if backend == "numpy":
        device = device_type = "cpu"
        res = probe_matmul(n, rounds, seed)
    elif backend == "torch":
        torch, dev, device_type = _torch_cuda(device_index)
        device = f"{device_type} (cuda:{device_index})"
        res = probe_matmul(n, rounds, seed, xp=torch,
                           device_put=lambda arr: torch.from_numpy(arr.astype(np.float32)).to(dev))
        torch.cuda.synchronize(dev)
    else:
        cp, device_type = _cupy_cuda(device_index)
        device = f"{device_type} (cuda:{device_index})"
        with cp.cuda.Device(device_index):
            res = probe_matmul(n, rounds, seed, dtype=np.float32, xp=cp)
    digest = probe_digest(res)
    passed = check_probe(digest, n, rounds, seed)
    mism = None
    if passed is False:
        ref = probe_matmul(n, rounds, seed, dtype=np.int64)  # exact integer arithmetic, no BLAS
        mism = int((ref != res).sum())
    return ProbeResult(backend, device, n, rounds, seed, digest, PROBE_GOLDEN_SHA256.get((n, rounds, seed)) or None,
                       passed, round(time.perf_counter() - t0, 4), mism, device_type)

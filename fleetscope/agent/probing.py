"""The agent's SDC probe: the known-answer test (``fleetscope.devices.probe.run_probe``) on each of the node's
GPUs every ``probe_every_s``, in a thread of its own so that a round never holds up a telemetry tick.

A round probes every target one after the other. Numpy's probe takes well under a second on a CPU, but a
CUDA backend's first round loads its library and makes a context on every GPU (seconds), a GPU shared
with a training job may be slow to answer, and a wedged one may not answer at all: the ticks go on
meanwhile, each taking the results that have finished (``Prober.poll``), and a round that is still running
when the next is due is reported, not doubled up.

Each result is named by the GPU's UUID where NVML lists the device the backend probed (matched by the
UUID or PCI address the backend gives, never by CUDA's ordinal, which ``CUDA_VISIBLE_DEVICES`` and
``CUDA_DEVICE_ORDER`` renumber), else as ``fleetscope health probe`` names it: ``backend:device``.
"""

from __future__ import annotations

import datetime as dt
import logging
import math
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from analyzers.sdc_probe import ProbeResult
from fleetscope.devices import nvml as nvml_driver
from fleetscope.devices import probe as probe_device

# the collector's logger: an operator filters the agent's lines by one name
log = logging.getLogger("fleetscope.agent")

PROBE_BACKENDS = ("auto", "numpy", "torch", "cupy")
# The probe takes the GPU from whatever runs on it for a moment: a few minutes to an hour apart is the
# useful range, and more often than once a minute is a mistake (the CLI's --probe-every holds the same bound).
MIN_PROBE_EVERY_S = 60.0


@dataclass(frozen=True)
class Target:
    """One device a round probes: the backend that runs there, its device number, and NVML's UUID for it."""

    backend: str  # numpy, torch or cupy
    index: int
    gpu_uuid: str | None = None

    @property
    def label(self) -> str:
        return "numpy (cpu)" if self.backend == "numpy" else f"{self.backend} cuda:{self.index}"

    def subject(self, result: ProbeResult, host: str) -> str:
        """The health event's ``gpu_uuid``: NVML's UUID, else ``backend:host/device``. A device name alone
        (``numpy:cpu``, ``torch:cuda:0``) is the same on every node, so one node's failed probe would be
        every node's finding."""
        return self.gpu_uuid or f"{result.backend}:{host}/{result.device}"


@dataclass(frozen=True)
class Outcome:
    """One target's probe in a round: its result, or why it could not run."""

    ts: dt.datetime  # the tick that started the round: when the probe was taken
    target: Target
    result: ProbeResult | None
    error: str | None = None

    def to_dict(self, host: str) -> dict[str, Any]:
        """What a tick's report says of it (``fleetscope agent --json``'s ``probe``)."""
        out: dict[str, Any] = {"ts": self.ts.isoformat(), "device": self.target.label}
        if self.result is None:
            return out | {"error": self.error}
        r = self.result
        return out | {"gpu_uuid": self.target.subject(r, host), "backend": r.backend, "device": r.device, "passed": r.passed,
                      "digest": r.digest, "golden": r.golden, "mismatched_elements": r.mismatched_elements, "seconds": r.seconds}


def _pci(bus_id: Any) -> tuple[int, int, int] | None:
    """(domain, bus, device) of an NVML PCI bus id, ``00000000:07:00.0``."""
    if isinstance(bus_id, bytes):
        bus_id = bus_id.decode(errors="replace")
    try:
        domain, bus, rest = str(bus_id).strip().split(":")
        return int(domain, 16), int(bus, 16), int(rest.split(".")[0], 16)
    except (ValueError, AttributeError):
        return None


def nvml_names(devices: list[probe_device.CudaDevice], nvml: list[dict[str, Any]]) -> dict[int, str]:
    """CUDA device number -> NVML's UUID of that GPU, matched by the UUID the backend gives, else by PCI
    address; devices NVML does not list are left out."""
    by_uuid: dict[str, str] = {}
    by_pci: dict[tuple[int, int, int], str] = {}
    for d in nvml:
        u = d.get("uuid")
        if isinstance(u, bytes):
            u = u.decode(errors="replace")
        if not u:
            continue
        by_uuid[str(u).lower()] = str(u)
        pci = _pci(d.get("pci_bus_id"))
        if pci is not None:
            by_pci[pci] = str(u)
    out = {}
    for dev in devices:
        name = by_uuid.get(dev.uuid.lower()) if dev.uuid else None
        if name is None and dev.pci is not None:
            name = by_pci.get(dev.pci)
        if name is not None:
            out[dev.index] = name
    return out


def targets(backend: str, *, read_nvml: Callable[[], list[dict[str, Any]]] | None = None) -> tuple[list[Target], str | None]:
    """What a round probes for ``backend`` (one of ``PROBE_BACKENDS``), and for ``auto`` on a host where no
    GPU backend runs, a note saying so: the round then probes the CPU with numpy. ``torch`` or ``cupy`` that
    cannot run here raises ``ProbeUnavailable`` naming what is missing."""
    if backend not in PROBE_BACKENDS:
        raise ValueError(f"probe backend must be one of {', '.join(PROBE_BACKENDS)}, not {str(backend)[:40]!r}")
    if backend == "numpy":
        return [Target("numpy", 0)], None
    try:
        runs, devices = probe_device.cuda_devices("cuda" if backend == "auto" else backend)
    except probe_device.ProbeUnavailable as exc:
        if backend != "auto":
            raise
        return [Target("numpy", 0)], f"no GPU probe backend here, so the SDC probe runs on the CPU with numpy, not on the GPUs: {exc}"
    try:
        names = nvml_names(devices, (read_nvml or nvml_driver.read_devices)())
    except nvml_driver.NvmlUnavailable as exc:
        log.info("probe: NVML cannot name the GPUs (%s); results are named backend:device", exc)
        names = {}
    return [Target(runs, d.index, names.get(d.index)) for d in devices], None


class Prober:
    """Probe rounds every ``every_s`` seconds of ``clock``, each in a daemon thread; ``poll`` (once a tick)
    starts a round when one is due and hands out the outcomes finished since the last poll."""

    def __init__(self, found: list[Target], every_s: float, clock: Callable[[], float]) -> None:
        if not every_s >= MIN_PROBE_EVERY_S:  # also refuses NaN
            raise ValueError(f"a probe every {every_s} s is too often: at least {MIN_PROBE_EVERY_S:g} s apart")
        if not found:
            raise ValueError("no device to probe")
        self.targets, self.every_s, self.clock = found, every_s, clock
        self.next_at = -math.inf  # the first tick starts a round
        self.started: dt.datetime | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._done: list[Outcome] = []

    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def poll(self, now: dt.datetime, *, wait: float | None = None) -> tuple[list[Outcome], str | None]:
        """Start a round stamped ``now`` if one is due and none is running; with ``wait`` (seconds), let the
        running round finish within that time first. Returns the outcomes finished since the last poll,
        oldest first, and a note when a round that was due could not start or did not finish in time."""
        note = None
        t = self.clock()
        if t >= self.next_at:
            self.next_at = t + self.every_s
            if self.running():
                assert self.started is not None
                note = f"the probe round started at {self.started.isoformat()} is still running; the one due now is skipped"
            else:
                self.started = now
                self._thread = threading.Thread(target=self._round, args=(now,), name="fleetscope-probe", daemon=True)
                self._thread.start()
        if wait is not None and self._thread is not None:
            self._thread.join(wait)
            if self._thread.is_alive() and note is None:
                note = f"the probe round started at {now.isoformat()} did not finish within {wait:g} s"
        with self._lock:
            done, self._done = self._done, []
        return done, note

    def _round(self, now: dt.datetime) -> None:
        for target in self.targets:
            try:
                out = Outcome(now, target, probe_device.run_probe(target.backend, device_index=target.index))
            except Exception as exc:  # noqa: BLE001 - reported in a tick's errors; the other devices and the next round go on
                why = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
                out = Outcome(now, target, None, why)
            with self._lock:
                self._done.append(out)

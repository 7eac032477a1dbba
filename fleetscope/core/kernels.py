"""GPU device time as Meta's Holistic Trace Analysis (HTA 0.5.0) reads it: its kernel classes, its interval merge,
its event window, and the unions its temporal breakdown and communication/computation overlap are made of.

Shared by ``ingest.kineto``, which reduces each rank's device timeline to these unions when a trace is ingested
(the ``device_union`` frame: a handful of numbers per rank and window instead of every kernel), and
``analyzers.c3``, which computes HTA's figures from them (``hta_breakdown``) and from a trace in memory
(``hta_temporal_breakdown``, ``hta_comm_comp_overlap``). A pure-floor module may not import another, so what
both need lives here, once.

HTA's definitions (``hta/analyzers/breakdown_analysis.py`` ``get_temporal_breakdown``,
``hta/analyzers/communication_analysis.py`` ``get_comm_comp_overlap``, ``hta/common/trace.py``
``_filter_irrelevant_gpu_kernels`` and ``round_down_time_stamps``), written from those definitions, not copied:

- a device event is one with a CUDA stream (``stream`` ≠ −1); its start is rounded up and its end down to whole
  µs (pytorch/pytorch#122425), no-ops on integer timestamps;
- the event window: when the job's traces name at least two distinct ``ProfilerStep#N``, an event is kept only
  if it was launched (GPU work: the host-side event with its correlation id; other device events: its own
  start) before the last profiler step of its rank began (``before_last_step``, HTA's default) or, with
  ``include_last_step``, by the time it ended (``through_last_step``); with fewer step names nothing is left
  out (``all``);
- over the kept events of a rank: kernel time = last merged block's end − first block's start (``span_us``),
  busy = their union, compute = the union of COMPUTATION events, communication = the union of COMMUNICATION
  events, and overlap = the time a communication block and a computation block are both open.

Pure: numpy in, numbers out.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

__all__ = [
    "KernelType", "kernel_type", "kind_codes", "COMPUTATION", "COMMUNICATION", "merge", "sweep_overlap",
    "SYNC_EVENT_NAMES", "WINDOWS", "Unions", "hta_round", "window_keep", "unions", "window_unions",
]


class KernelType:
    """HTA's kernel classes (``hta.utils.utils.KernelType``)."""

    COMMUNICATION = "COMMUNICATION"
    MEMORY = "MEMORY"
    COMPUTATION = "COMPUTATION"
    OTHER = "OTHER"


# HTA's rules, in its order: NCCL kernels are communication; names starting Memcpy/Memset/dma are memory;
# anything else is computation unless it looks like an NCCL kernel, a copy, a memset or a sync (OTHER).
# The last pattern's grouping is HTA's: "(^nccl.*Kernel)|(.*(Memcpy)|(Memset))|(.*Sync)" under re.match.
_COMM_RE = re.compile(r"^nccl.*Kernel")
_MEMORY_RE = re.compile(r"(^Memcpy)|(^Memset)|(^dma)")
_NOT_COMPUTE_RE = re.compile(r"(^nccl.*Kernel)|(.*(Memcpy)|(Memset))|(.*Sync)")
SYNC_EVENT_NAMES = ("Event Sync", "Context Sync")
"""Device events HTA counts as GPU work whatever their stream and correlation say."""


def kernel_type(name: str) -> str:
    """Classify a device event name the way HTA does: COMMUNICATION, MEMORY, COMPUTATION or OTHER."""
    if _COMM_RE.match(name):
        return KernelType.COMMUNICATION
    if _MEMORY_RE.match(name):
        return KernelType.MEMORY
    if not _NOT_COMPUTE_RE.match(name):
        return KernelType.COMPUTATION
    return KernelType.OTHER


_CODES = {KernelType.COMPUTATION: 0, KernelType.COMMUNICATION: 1, KernelType.MEMORY: 2, KernelType.OTHER: 3}
COMPUTATION, COMMUNICATION = _CODES[KernelType.COMPUTATION], _CODES[KernelType.COMMUNICATION]
"""The codes :func:`kind_codes` gives the two classes the figures tell apart."""


def kind_codes(names: Iterable[str], memo: dict[str, int] | None = None) -> np.ndarray:
    """Each name's class as a small integer (``COMPUTATION``, ``COMMUNICATION``, 2 memory, 3 other); ``memo``
    keeps the names already classified (a trace repeats a few hundred kernel names thousands of times)."""
    memo = {} if memo is None else memo
    out = []
    for n in names:
        c = memo.get(n)
        if c is None:
            c = memo[n] = _CODES[kernel_type(n)]
        out.append(c)
    return np.array(out, dtype=np.uint8)


# --- intervals -------------------------------------------------------------------------------------------


def merge(ts: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Merge intervals into disjoint blocks, HTA's way: sort by start; a new block begins where a start
    lies strictly after every earlier end (touching intervals merge). Returns (block_start, block_end)."""
    if len(ts) == 0:
        return ts, end
    order = np.argsort(ts, kind="stable")
    ts, end = ts[order], end[order]
    run = np.maximum.accumulate(end)
    new = np.empty(len(ts), dtype=bool)
    new[0] = True
    new[1:] = ts[1:] > run[:-1]
    first = np.flatnonzero(new)
    block_end = np.maximum.reduceat(end, first)
    return ts[first], block_end


def sweep_overlap(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray]) -> float:
    """Time during which a block of ``a`` and a block of ``b`` are both open (a: +1/−1, b: +2/−2; count
    the time the running sum is 3), as HTA's get_comm_comp_overlap measures it."""
    times = np.concatenate([a[0], a[1], b[0], b[1]])
    delta = np.concatenate([np.ones(len(a[0])), -np.ones(len(a[1])), np.full(len(b[0]), 2.0), np.full(len(b[1]), -2.0)])
    if len(times) < 2:
        return 0.0
    order = np.argsort(times, kind="stable")
    times, running = times[order], np.cumsum(delta[order])
    seg = np.diff(times)
    return float(np.sum(seg[running[:-1] == 3]))


# --- HTA's event window and unions ----------------------------------------------------------------------

WINDOWS = ("all", "before_last_step", "through_last_step")
"""HTA's event windows: nothing left out; events launched before the rank's last profiler step began (HTA's
default); and through that step's end (``include_last_step``)."""


@dataclass(frozen=True)
class Unions:
    """One rank's device events in one window, reduced to what HTA's figures are made of (µs)."""

    events: int
    span_us: float  # HTA's kernel_time: last merged block's end − first block's start
    busy_us: float  # union of every kept event
    compute_us: float  # union of COMPUTATION events
    comm_us: float  # union of COMMUNICATION events
    overlap_us: float  # time a communication block and a computation block are both open


def hta_round(ts_us: np.ndarray, dur_us: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """HTA's rounding of device events: start up to the next µs, end (start + duration) down."""
    return np.ceil(ts_us), np.floor(ts_us + dur_us)


def window_keep(when: np.ndarray, step_start: np.ndarray, step_end: np.ndarray) -> dict[str, np.ndarray]:
    """Which of one rank's device events each window keeps. ``when``: the event's launch time for GPU work (NaN
    when no host-side event has its correlation id), else its own rounded start; ``step_start``/``step_end``: the
    rank's host-side profiler steps, rounded as events are. A rank without profiler steps keeps nothing in the
    two step windows: HTA's maximum over an empty set is NaN, and every comparison with NaN is false."""
    every = np.ones(len(when), dtype=bool)
    if len(step_start) == 0:
        return {"all": every, "before_last_step": ~every, "through_last_step": ~every}
    return {"all": every, "before_last_step": when < np.max(step_start), "through_last_step": when <= np.max(step_end)}


def unions(start: np.ndarray, end: np.ndarray, kinds: np.ndarray) -> Unions | None:
    """The unions of one rank's kept device events (rounded ``start``/``end``, ``kinds`` from :func:`kind_codes`);
    None when none is kept (HTA then reports no row for the rank)."""
    if len(start) == 0:
        return None
    bs, be = merge(start, end)
    span_us = float(be[-1] - bs[0])
    busy_us = float(np.sum(be - bs))
    comp = merge(start[kinds == COMPUTATION], end[kinds == COMPUTATION])
    comm = merge(start[kinds == COMMUNICATION], end[kinds == COMMUNICATION])
    compute_us = float(np.sum(comp[1] - comp[0]))
    comm_us = float(np.sum(comm[1] - comm[0]))
    overlap_us = sweep_overlap(comm, comp) if comm_us > 0 else 0.0
    return Unions(int(len(start)), span_us, busy_us, compute_us, comm_us, overlap_us)


def window_unions(ts_us: np.ndarray, dur_us: np.ndarray, kinds: np.ndarray, gpu: np.ndarray, launch_us: np.ndarray,
                  step_ts_us: np.ndarray, step_dur_us: np.ndarray) -> dict[str, Unions]:
    """One rank's device events (as written: ``ts_us``, ``dur_us``; ``kinds``; ``gpu``: HTA's GPU-event test;
    ``launch_us``: the earliest host-side event with the same correlation id, NaN when none) reduced per window,
    against the rank's host-side profiler steps (``step_ts_us``, ``step_dur_us``, as written). Windows that keep
    no event are left out."""
    start, end = hta_round(ts_us, dur_us)
    when = np.where(gpu, np.ceil(launch_us), start)
    s0, s1 = hta_round(step_ts_us, step_dur_us)
    out: dict[str, Unions] = {}
    for window, keep in window_keep(when, s0, s1).items():
        u = unions(start[keep], end[keep], kinds[keep])
        if u is not None:
            out[window] = u
    return out

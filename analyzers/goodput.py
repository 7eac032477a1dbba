"""Goodput: runtime goodput with its badput buckets, scheduling goodput, program goodput (MFU) and their
product, Google's ML Productivity Goodput.

Definitions follow Google Cloud's "ML Productivity Goodput" (scheduling × runtime × program goodput) and,
for runtime goodput, the semantics of Google's ``ml-goodput-measurement`` library
(github.com/AI-Hypercomputer/ml-goodput-measurement, ``goodput.py`` / ``goodput_utils.py``), so a user of
that library finds the same numbers here. Written from those semantics, not copied:

- A step lasts from its start to the next step's start (the library records step *starts* only); the
  last step of the job ends at the job's end.
- Productive time is the time of steps whose progress was kept. After a disruption the job resumes from
  a checkpoint at some step r: steps ≥ r of the disrupted attempt were done twice, so their time, and the
  unfinished step cut short by the disruption, is *wasted progress*.
- *Infrastructure recovery* is the gap from the disruption (a ``failure``/``preempted`` event, else the
  attempt's last sign of life) to the next attempt's start.
- *Program startup*: the first step after a (re)start carries compilation and warm-up; its excess over the
  mean of the attempt's other completed steps is badput (the library's "first step extra time").
- *Initialization* (the library's TPU_INITIALIZATION): attempt start → ``initialized``; *training
  preparation*: ``initialized`` → first step. Without an ``initialized`` event that span is *other*, as
  the library leaves unrecorded time in OTHER.
- *Synchronous data loading*: ``data_loading_s`` in a step event's payload, the blocking load before
  that step starts; *checkpoint save / restore*: the ``checkpoint_*_start`` → ``_end`` spans. These are
  carved out of whatever they overlap (the library subtracts blocking checkpoint time from goodput).
- *Other*: everything else in the elapsed time, so the buckets add up to the total exactly.

The runtime denominator is elapsed time from the first ``started`` to ``finished`` (or ``until``, which
the caller passes for a running job: analyzers never read the clock). Times are handled as integer
microseconds, so the buckets sum to the total exactly and the library's worked examples come out exact
(steps at 5, 8, 11, 14, 17 s after a start at 0 and an end at 20 s: 75.000 %).

Pure: polars/numpy in, frames and dataclasses out.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from functools import cache
from pathlib import Path

import numpy as np
import polars as pl

from analyzers.goodput_events import US, check_events, epoch_us, from_epoch_us, one_job, steps_from_events
from fleetscope.core.frames import UTC_US

__all__ = [
    "BUCKETS",
    "BADPUT_BUCKETS",
    "RuntimeGoodput",
    "goodput_timeline",
    "runtime_goodput",
    "runtime_goodput_of",
    "rolling_goodput",
    "rolling_goodput_of",
    "step_times",
    "step_times_of",
    "step_time_deviation",
    "anomaly_threshold_s",
    "ideal_step_time",
    "scheduling_goodput",
    "load_gpu_peaks",
    "gpu_peak_flops",
    "peak_table_name",
    "program_goodput",
    "program_goodput_of",
    "ml_productivity_goodput",
]

PRODUCTIVE = "productive"
# Badput buckets and the ml-goodput-measurement BadputType each one corresponds to.
BADPUT_BUCKETS: dict[str, str] = {
    "wasted_progress": "WASTED_PROGRESS_FROM_DISRUPTION",
    "infrastructure_recovery": "INFRASTRUCTURE_RECOVERY_FROM_DISRUPTION",
    "initialization": "TPU_INITIALIZATION",
    "training_preparation": "TRAINING_PREP",
    "program_startup": "PROGRAM_STARTUP",
    "data_loading": "DATA_LOADING_SYNC",
    "checkpoint_save": "UNPRODUCTIVE_CHECKPOINT_SAVE_TIME",
    "checkpoint_restore": "UNPRODUCTIVE_CHECKPOINT_RESTORE_TIME",
    "other": "OTHER",
}
BUCKETS: tuple[str, ...] = (PRODUCTIVE, *BADPUT_BUCKETS)
# Overlays win over the base timeline, earlier entries over later ones.
_OVERLAY_ORDER = ("checkpoint_restore", "checkpoint_save", "data_loading")


# --- the runtime timeline --------------------------------------------------------------------------


@dataclass
class _Attempt:
    start: int
    initialized: int | None = None
    steps: list[tuple[int, int, float]] = field(default_factory=list)  # (step, start_us, data_loading_s)
    disruption: int | None = None
    last_seen: int = 0


def running_until(job_event: pl.DataFrame, now: datetime) -> datetime | None:
    """``until`` for :func:`goodput_timeline` as of ``now``: None for a job with a ``finished`` event (its timeline
    ends there), else ``now`` (a running job's time runs to the present)."""
    return None if job_event.filter(pl.col("kind") == "finished").height else now


def goodput_timeline(job_event: pl.DataFrame, *, until: datetime | None = None) -> pl.DataFrame:
    """The job's elapsed runtime cut into labelled spans: ``job_id, start, end, duration_s, bucket, step``.

    Buckets are :data:`BUCKETS` (module docstring for their meaning); spans do not overlap and cover
    [first ``started``, ``finished`` or ``until``) exactly. ``step`` is set on productive, program-startup
    and wasted spans. ``until`` ends a running job's timeline (required when there is no ``finished``);
    it also cuts a finished job's timeline short.

    Raises ``ValueError`` on an empty frame, missing columns, unknown kinds, several jobs, a step before
    the job started, a checkpoint end without its start, or a non-finite payload number.
    """
    ev = check_events(job_event)
    job_id = one_job(ev)
    # Step events are most of the rows (one per rank per step); everything per event is done column-wise,
    # and the Python below runs per lifecycle event and per distinct step.
    ts_all = ev["ts"].dt.epoch("us").to_numpy()
    life = ev.filter(pl.col("kind") != "step")
    kinds = life["kind"].to_list()
    ts_us = [int(t) for t in life["ts"].dt.epoch("us").to_list()]

    boundaries = [t for k, t in zip(kinds, ts_us) if k in ("started", "restart")]
    if not boundaries:
        raise ValueError(f"job {job_id}: no 'started' event, so the runtime has no beginning")
    step_no, step_start, step_dl = steps_from_events(ev)
    if step_start.size and int(step_start.min()) < boundaries[0]:
        raise ValueError(f"job {job_id}: a step starts before the job's first 'started' event")

    # Attempts: a 'restart' followed by 'started' (or the reverse) with no step between is one attempt.
    step_starts = np.sort(step_start)
    attempts: list[_Attempt] = []
    for b in boundaries:
        if attempts and np.searchsorted(step_starts, b, side="left") == np.searchsorted(step_starts, attempts[-1].start, side="left"):
            continue
        attempts.append(_Attempt(start=b, last_seen=b))
    starts = np.array([a.start for a in attempts])

    # Steps into attempts; several ranks reporting one step collapse to its earliest start (the first such
    # event in time order on a tie).
    if step_start.size:
        att = np.searchsorted(starts, step_start, side="right") - 1
        order = np.lexsort((np.arange(step_start.size), step_start, step_no, att))
        a_s, n_s = att[order], step_no[order]
        first = np.ones(order.size, dtype=bool)
        first[1:] = (a_s[1:] != a_s[:-1]) | (n_s[1:] != n_s[:-1])
        keep = order[first]
        for i, step, start, dl in zip(att[keep].tolist(), step_no[keep].tolist(), step_start[keep].tolist(), step_dl[keep].tolist()):
            attempts[i].steps.append((step, start, dl))
    for a in attempts:
        a.steps.sort(key=lambda s: (s[1], s[0]))

    finished = [t for k, t in zip(kinds, ts_us) if k == "finished"]
    end = min(finished[-1], epoch_us(until)) if finished and until is not None else (
        finished[-1] if finished else (epoch_us(until) if until is not None else None))
    if end is None:
        raise ValueError(f"job {job_id} has no 'finished' event: pass until= to measure it while it runs")
    if end < boundaries[0]:
        raise ValueError(f"job {job_id}: end {from_epoch_us(end).isoformat()} is before its start")

    # Per attempt: initialization, disruption and the attempt's last sign of life (any event, steps too).
    for i, a in enumerate(attempts):
        nxt = attempts[i + 1].start if i + 1 < len(attempts) else end
        last_step = a.steps[-1][1] if a.steps else a.start
        lo, hi = np.searchsorted(ts_all, a.start, side="left"), np.searchsorted(ts_all, nxt, side="left")
        if hi > lo:
            a.last_seen = max(a.last_seen, int(ts_all[hi - 1]))
        for k, t in zip(kinds, ts_us):
            if not (a.start <= t < nxt):
                continue
            if k == "initialized" and a.initialized is None:
                a.initialized = t
            if k in ("failure", "preempted") and t >= last_step and a.disruption is None:
                a.disruption = t
        if i + 1 < len(attempts) and a.disruption is None:
            # no failure event: the job was last seen alive at its last event
            a.disruption = max(a.last_seen, last_step)

    base: list[tuple[int, int, str, int | None]] = []  # (start, end, bucket, step)

    def add(s: int, e: int, bucket: str, step: int | None = None) -> None:
        e = min(e, end)
        if e > s:
            base.append((s, e, bucket, step))

    for i, a in enumerate(attempts):
        last = i + 1 == len(attempts)
        stop = end if last else attempts[i + 1].start
        cut = a.disruption if a.disruption is not None else stop
        first_step = a.steps[0][1] if a.steps else cut
        if a.initialized is not None and a.initialized < first_step:
            add(a.start, a.initialized, "initialization")
            add(a.initialized, first_step, "training_preparation")
        else:
            add(a.start, first_step, "other")
        if not a.steps:
            add(cut, stop, "infrastructure_recovery")
            continue
        resume = None if last else (attempts[i + 1].steps[0][0] if attempts[i + 1].steps else None)
        spans = []  # (step, start, end, completed)
        for j, (step, s, _) in enumerate(a.steps):
            if j + 1 < len(a.steps):
                spans.append((step, s, a.steps[j + 1][1], True))
            else:
                # The last step of the final attempt ends with the job; otherwise the disruption cut it short.
                spans.append((step, s, cut if not last or a.disruption is not None else stop, last and a.disruption is None))
        kept = [sp for sp in spans if sp[3] and (resume is None or sp[0] < resume)]
        times = [sp[2] - sp[1] for sp in kept]
        extra = 0
        if len(kept) >= 2 and kept[0] is spans[0]:
            mean_rest = sum(times[1:]) / (len(times) - 1)
            extra = max(0, round(times[0] - mean_rest))
        # a typical step: the startup excess is not part of it
        mean_step = ((sum(times) - extra) / len(times)) if times else 0.0
        for step, s, e, completed in spans:
            if completed and (resume is None or step < resume):
                if extra and (step, s) == (spans[0][0], spans[0][1]):
                    add(s, s + extra, "program_startup", step)
                    add(s + extra, e, PRODUCTIVE, step)
                else:
                    add(s, e, PRODUCTIVE, step)
            elif not completed and resume is not None and step < resume:
                # Resumed past the cut-short step: its checkpoint held it. Credit it with a typical step
                # time (the library's "sequential" restart mode); the rest of its span was lost.
                credit = min(e - s, round(mean_step)) if times else 0
                add(s, s + credit, PRODUCTIVE, step)
                add(s + credit, e, "wasted_progress", step)
            else:
                add(s, e, "wasted_progress", step)
        add(cut, stop, "infrastructure_recovery")

    overlays = _overlays(kinds, ts_us, int(ts_all[-1]), attempts, job_id)
    return _paint(job_id, base, overlays, attempts[0].start, end)


def _overlays(kinds: list[str], ts_us: list[int], t_last: int, attempts: list[_Attempt], job_id: str) -> dict[str, list[tuple[int, int]]]:
    out: dict[str, list[tuple[int, int]]] = {b: [] for b in _OVERLAY_ORDER}
    for what in ("save", "restore"):
        open_at: int | None = None
        for k, t in zip(kinds, ts_us):
            if k == f"checkpoint_{what}_start":
                open_at = t if open_at is None else open_at
            elif k == f"checkpoint_{what}_end":
                if open_at is None:
                    raise ValueError(f"job {job_id}: checkpoint_{what}_end at {from_epoch_us(t).isoformat()} without a start")
                out[f"checkpoint_{what}"].append((open_at, t))
                open_at = None
        # a save still open at the end (job cut by until=, or a crash mid-save) blocks until then
        if open_at is not None:
            out[f"checkpoint_{what}"].append((open_at, t_last))
    for a in attempts:
        for _, s, dl in a.steps:
            if dl > 0:
                out["data_loading"].append((s - round(dl * US), s))
    return out


def _paint(job_id: str, base: list, overlays: dict[str, list[tuple[int, int]]], t0: int, t1: int) -> pl.DataFrame:
    """Lay the overlays over the base spans and return non-overlapping labelled spans covering [t0, t1)."""
    base.sort(key=lambda b: b[0])
    pts = {t0, t1}
    for s, e, *_ in base:
        pts.update((s, e))
    for spans in overlays.values():
        for s, e in spans:
            pts.update((max(s, t0), min(e, t1)))
    cuts = np.array(sorted(p for p in pts if t0 <= p <= t1), dtype=np.int64)
    lo, hi = cuts[:-1], cuts[1:]
    bs = np.array([b[0] for b in base], dtype=np.int64)
    be = np.array([b[1] for b in base], dtype=np.int64)
    idx = np.searchsorted(bs, lo, side="right") - 1
    inside = (idx >= 0) & (lo < be[np.clip(idx, 0, None)]) if len(bs) else np.zeros(len(lo), bool)
    labels = np.array(["other"] * len(lo), dtype=object)
    steps = np.full(len(lo), -1, dtype=np.int64)
    for j in np.flatnonzero(inside):
        b = base[idx[j]]
        labels[j] = b[2]
        steps[j] = -1 if b[3] is None else b[3]
    for bucket in reversed(_OVERLAY_ORDER):  # painted last wins
        for s, e in overlays[bucket]:
            hit = (lo >= s) & (hi <= e) & (labels != "infrastructure_recovery")
            labels[hit] = bucket
    df = pl.DataFrame({
        "start_us": lo, "end_us": hi, "bucket": labels.astype(str), "step": steps,
    }).filter(pl.col("end_us") > pl.col("start_us"))
    return df.select(
        pl.lit(job_id).alias("job_id"),
        pl.from_epoch("start_us", time_unit="us").dt.replace_time_zone("UTC").alias("start"),
        pl.from_epoch("end_us", time_unit="us").dt.replace_time_zone("UTC").alias("end"),
        ((pl.col("end_us") - pl.col("start_us")) / US).alias("duration_s"),
        "bucket",
        pl.when(pl.col("step") >= 0).then(pl.col("step")).alias("step"),
    )


# --- reports ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RuntimeGoodput:
    """Runtime goodput of one job over a window: seconds per bucket and their shares of the elapsed time.

    ``goodput_ratio`` = productive_s / total_s (0–1); ``badput_s`` maps each of :data:`BADPUT_BUCKETS` to
    seconds; ``last_step`` is the highest productive step; ``disruptions`` the number of restarts seen.
    """

    job_id: str
    window_start: datetime
    window_end: datetime
    total_s: float
    productive_s: float
    badput_s: dict[str, float]
    last_step: int | None
    disruptions: int

    @property
    def goodput_ratio(self) -> float:
        return self.productive_s / self.total_s if self.total_s > 0 else math.nan

    @property
    def badput_ratio(self) -> dict[str, float]:
        return {k: (v / self.total_s if self.total_s > 0 else math.nan) for k, v in self.badput_s.items()}

    def to_frame(self) -> pl.DataFrame:
        """One row per bucket: ``job_id, bucket, library_type, seconds, ratio``."""
        rows = [(PRODUCTIVE, "GOODPUT", self.productive_s)] + [(b, BADPUT_BUCKETS[b], s) for b, s in self.badput_s.items()]
        return pl.DataFrame(
            {"job_id": [self.job_id] * len(rows), "bucket": [r[0] for r in rows], "library_type": [r[1] for r in rows],
             "seconds": [r[2] for r in rows], "ratio": [r[2] / self.total_s if self.total_s else None for r in rows]},
            schema={"job_id": pl.String, "bucket": pl.String, "library_type": pl.String, "seconds": pl.Float64, "ratio": pl.Float64},
        )


def _clip(tl: pl.DataFrame, a: datetime, b: datetime) -> pl.DataFrame:
    return tl.with_columns(
        pl.max_horizontal(pl.col("start"), pl.lit(a, UTC_US)).alias("start"),
        pl.min_horizontal(pl.col("end"), pl.lit(b, UTC_US)).alias("end"),
    ).filter(pl.col("end") > pl.col("start")).with_columns(
        ((pl.col("end") - pl.col("start")).dt.total_microseconds() / US).alias("duration_s"))


def runtime_goodput(
    job_event: pl.DataFrame,
    *,
    until: datetime | None = None,
    window_start: datetime | None = None,
    window_end: datetime | None = None,
) -> RuntimeGoodput:
    """Runtime goodput and badput breakdown of one job, as ``ml-goodput-measurement``'s
    ``get_job_goodput(include_badput_breakdown=True)`` (whole run) or ``get_job_goodput_interval``
    (``window_start``/``window_end``: the timeline clipped to that window, which is the interval's
    denominator). See :func:`goodput_timeline` for ``until`` and the errors raised."""
    return runtime_goodput_of(goodput_timeline(job_event, until=until), window_start=window_start, window_end=window_end)


def runtime_goodput_of(tl: pl.DataFrame, *, window_start: datetime | None = None, window_end: datetime | None = None) -> RuntimeGoodput:
    """:func:`runtime_goodput` of a timeline :func:`goodput_timeline` made (the ``*_of`` functions share one)."""
    t0, t1 = tl["start"].min(), tl["end"].max()
    a = t0 if window_start is None else max(window_start, t0)
    b = t1 if window_end is None else min(window_end, t1)
    if b <= a:
        raise ValueError(f"window [{a}, {b}) does not overlap the job's runtime [{t0}, {t1})")
    tl = _clip(tl, a, b)
    # sum integer microseconds: exact, so the buckets add up to the total exactly
    us = tl.group_by("bucket").agg(((pl.col("end") - pl.col("start")).dt.total_microseconds().sum()).alias("us"))
    by = dict(zip(us["bucket"].to_list(), us["us"].to_list()))
    total_us = sum(by.values())
    prod_steps = tl.filter(pl.col("bucket") == PRODUCTIVE)["step"]
    disruptions = int(tl.filter(pl.col("bucket") == "infrastructure_recovery").height)
    return RuntimeGoodput(
        job_id=str(tl["job_id"][0]),
        window_start=a,
        window_end=b,
        total_s=total_us / US,
        productive_s=by.get(PRODUCTIVE, 0) / US,
        badput_s={k: by.get(k, 0) / US for k in BADPUT_BUCKETS},
        last_step=int(prod_steps.max()) if prod_steps.len() and prod_steps.max() is not None else None,
        disruptions=disruptions,
    )


def rolling_goodput(
    job_event: pl.DataFrame,
    *,
    every_s: float,
    period_s: float,
    until: datetime | None = None,
) -> pl.DataFrame:
    """Goodput over rolling windows [t0 + k·every, t0 + k·every + period) from the job's start, as the
    library's rolling-window monitoring does. Returns ``window_start, window_end, total_s, productive_s,
    goodput_ratio`` and one ``<bucket>_s`` column per badput bucket. Windows are clipped at the job's end."""
    return rolling_goodput_of(goodput_timeline(job_event, until=until), every_s=every_s, period_s=period_s)


def rolling_goodput_of(tl: pl.DataFrame, *, every_s: float, period_s: float) -> pl.DataFrame:
    """:func:`rolling_goodput` of a timeline :func:`goodput_timeline` made."""
    if not (every_s > 0 and period_s > 0 and math.isfinite(every_s) and math.isfinite(period_s)):
        raise ValueError("every_s and period_s must be finite and > 0")
    s, e = tl["start"].dt.epoch("us").to_numpy(), tl["end"].dt.epoch("us").to_numpy()
    t0, t1 = int(s.min()), int(e.max())
    starts = np.arange(t0, t1, round(every_s * US), dtype=np.int64)
    ends = np.minimum(starts + round(period_s * US), t1)
    lab = np.array(tl["bucket"].to_list(), dtype=object)
    out: dict[str, object] = {
        "window_start": [from_epoch_us(x) for x in starts], "window_end": [from_epoch_us(x) for x in ends],
        "total_s": (ends - starts) / US,
    }
    # cumulative time per bucket: F(t) = time in the bucket before t; a window's share is F(b) − F(a)
    for bucket in BUCKETS:
        m = lab == bucket
        bs, be = s[m], e[m]
        cum = np.concatenate([[0], np.cumsum(be - bs)])

        def F(t: np.ndarray, bs=bs, be=be, cum=cum) -> np.ndarray:
            if len(bs) == 0:
                return np.zeros(len(t), dtype=np.int64)
            i = np.searchsorted(bs, t, side="right") - 1
            j = np.clip(i, 0, None)
            part = np.clip(t - bs[j], 0, be[j] - bs[j])
            return np.where(i >= 0, cum[j] + part, 0)

        out[f"{bucket}_s"] = (F(ends) - F(starts)) / US
    df = pl.DataFrame(out).with_columns(
        pl.col("window_start").cast(UTC_US), pl.col("window_end").cast(UTC_US))
    return df.with_columns(
        (pl.col("productive_s") / pl.col("total_s")).alias("goodput_ratio"))


def step_times(job_event: pl.DataFrame, *, until: datetime | None = None) -> pl.DataFrame:
    """Productive step times ``step, step_time_s`` (program-startup excess included, as the library
    measures a step from its start to the next step's start), in step order."""
    return step_times_of(goodput_timeline(job_event, until=until))


def step_times_of(tl: pl.DataFrame) -> pl.DataFrame:
    """:func:`step_times` of a timeline :func:`goodput_timeline` made."""
    st = tl.filter(pl.col("bucket").is_in([PRODUCTIVE, "program_startup"]) & pl.col("step").is_not_null())
    return st.group_by("step").agg(pl.col("duration_s").sum().alias("step_time_s")).sort("step")


def anomaly_threshold_s(step_time_s: Iterable[float]) -> float:
    """Where a step time becomes anomalous for :func:`ideal_step_time`: median + 3 × MAD (unscaled median
    absolute deviation, scipy's default). Raises ``ValueError`` on no or non-finite step times."""
    x = np.asarray(list(step_time_s), dtype=float)
    if x.size == 0:
        raise ValueError("no step times")
    if not np.all(np.isfinite(x)):
        raise ValueError("step times must be finite (got NaN or inf)")
    med = float(np.median(x))
    return med + 3 * float(np.median(np.abs(x - med)))


def ideal_step_time(step_time_s: Iterable[float]) -> float:
    """The library's ideal step time (``goodput_utils.compute_ideal_step_time``): the mean of the step
    times that are not anomalous, anomalous meaning above :func:`anomaly_threshold_s` (median + 3 × MAD)."""
    x = np.asarray(list(step_time_s), dtype=float)
    return float(x[x <= anomaly_threshold_s(x)].mean())


def step_time_deviation(job_event: pl.DataFrame, *, until: datetime | None = None,
                        ideal_s: float | None = None) -> pl.DataFrame:
    """Per productive step: ``step, step_time_s, ideal_step_time_s, deviation_s`` (actual − ideal), the
    library's step-time deviation. ``ideal_s`` overrides the computed ideal (the library's
    ``configured_ideal_step_time``)."""
    st = step_times(job_event, until=until)
    if st.height == 0:
        raise ValueError("no productive steps to measure deviation on")
    ideal = ideal_step_time(st["step_time_s"].to_list()) if ideal_s is None else float(ideal_s)
    return st.with_columns(pl.lit(ideal).alias("ideal_step_time_s")).with_columns(
        (pl.col("step_time_s") - pl.col("ideal_step_time_s")).alias("deviation_s"))


# --- scheduling, program and ML productivity goodput ----------------------------------------------


def scheduling_goodput(
    job_event: pl.DataFrame,
    *,
    submitted_at: datetime | None = None,
    until: datetime | None = None,
) -> float:
    """Scheduling goodput: the share of the time the job wanted its resources during which it held all
    of them (Google Cloud, "ML Productivity Goodput"). Resources are held from each ``allocated`` event
    until the next ``preempted`` or ``finished``; the job wants them from ``submitted_at`` (the job
    frame's submission time; default: its first event) until ``finished`` or ``until``."""
    ev = check_events(job_event)
    job_id = one_job(ev)
    if not ev.filter(pl.col("kind") == "allocated").height:
        raise ValueError(f"job {job_id}: no 'allocated' event, so scheduling goodput is undefined")
    t_first = epoch_us(ev["ts"].min())
    a = epoch_us(submitted_at) if submitted_at is not None else t_first
    fin = ev.filter(pl.col("kind") == "finished")["ts"]
    b = epoch_us(until) if until is not None else (epoch_us(fin.max()) if fin.len() else None)
    if b is None:
        raise ValueError(f"job {job_id} has no 'finished' event: pass until=")
    if b <= a:
        raise ValueError("the job's end is not after its submission")
    held, since = 0, None
    # only these kinds move the state below; a job may send ~10⁵ step events an hour
    held_by = ev.filter(pl.col("kind").is_in(["allocated", "preempted", "finished"]))
    for k, t in zip(held_by["kind"].to_list(), held_by["ts"].dt.epoch("us").to_list()):
        t = min(max(t, a), b)
        if k == "allocated" and since is None:
            since = t
        elif k in ("preempted", "finished") and since is not None:
            held += t - since
            since = None
    if since is not None:
        held += b - since
    return held / (b - a)


@cache
def load_gpu_peaks() -> pl.DataFrame:
    """The shipped table of GPU peaks (``analyzers/data/gpu_peaks.csv``): dense FLOP/s by data type, TDP,
    memory and bandwidth, each row citing its NVIDIA datasheet."""
    path = Path(__file__).with_name("data") / "gpu_peaks.csv"
    return pl.read_csv(path, comment_prefix="#", schema_overrides={"memory_bytes": pl.Int64, "tdp_w": pl.Float64})


_DTYPE_COLUMN = {"fp64": "fp64_tensor_flops", "fp64_vector": "fp64_flops", "fp32": "fp32_flops", "tf32": "tf32_flops",
                 "bf16": "bf16_flops", "fp16": "fp16_flops", "fp8": "fp8_flops"}


# The names NVML (nvidia-smi --query-gpu=name, dcgm-exporter's modelName) reports for the boards in
# gpu_peaks.csv, per NVIDIA's nvidia-smi output for each board: the name says the form factor only
# through the memory ("80GB HBM3" is the SXM5 board; the PCIe board says "PCIe").
_NVML_NAMES = {
    "nvidia a100-sxm4-40gb": "A100-SXM4-40GB",
    "nvidia a100-sxm4-80gb": "A100-SXM4-80GB",
    "nvidia a100-pcie-40gb": "A100-PCIE-40GB",
    "nvidia a100 80gb pcie": "A100-PCIE-80GB",
    "nvidia h100 80gb hbm3": "H100-SXM5-80GB",
    "nvidia h100 pcie": "H100-PCIE-80GB",
    "nvidia h200": "H200-SXM-141GB",
    "nvidia b200": "B200-SXM-180GB",
    "nvidia l4": "L4",
    "nvidia l40s": "L40S",
    "nvidia a10": "A10",
    "tesla v100-sxm2-32gb": "V100-SXM2-32GB",
    "tesla v100-pcie-32gb": "V100-PCIE-32GB",
    "tesla t4": "T4",
}


def peak_table_name(model_name: str) -> str:
    """The ``gpu_peaks.csv`` row of a GPU model as the inventory names it: an NVML name from the table
    above, or a row name itself. Raises ``ValueError`` naming the model when neither fits, rather than
    guessing a board whose peak differs (the PCIe H100 is 24 % slower than the SXM5 one)."""
    name = " ".join(str(model_name).split())
    hit = _NVML_NAMES.get(name.lower())
    if hit is not None:
        return hit
    rows = load_gpu_peaks()["gpu"].to_list()
    exact = [r for r in rows if r.lower() == name.lower()]
    if exact:
        return exact[0]
    raise ValueError(f"GPU model {model_name!r} is not in gpu_peaks.csv nor a known NVML name for one of its rows")


def gpu_peak_flops(gpu: str, dtype: str = "bf16") -> float:
    """Peak dense FLOP/s of ``gpu`` (a row of :func:`load_gpu_peaks`, matched case-insensitively, or a
    unique prefix such as ``"H100-SXM"``; NVML names like ``"NVIDIA H100 80GB HBM3"`` are not guessed at)
    for ``dtype`` in fp64 (tensor core where there is one, else vector), fp64_vector, fp32, tf32, bf16,
    fp16, fp8."""
    if dtype not in _DTYPE_COLUMN:
        raise ValueError(f"dtype must be one of {', '.join(_DTYPE_COLUMN)}")
    peaks = load_gpu_peaks()
    names = peaks["gpu"].to_list()
    hits = [n for n in names if n.lower() == gpu.lower()] or [n for n in names if n.lower().startswith(gpu.lower())]
    if len(hits) != 1:
        raise ValueError(f"GPU {gpu!r} matches {len(hits)} rows of gpu_peaks.csv ({', '.join(hits) or 'none'}); known: {', '.join(names)}")
    row = peaks.filter(pl.col("gpu") == hits[0]).row(0, named=True)
    value = row[_DTYPE_COLUMN[dtype]]
    if value is None and dtype == "fp64":
        value = row["fp64_flops"]
    if value is None:
        raise ValueError(f"{hits[0]} has no {dtype} rate in its datasheet")
    return float(value)


def program_goodput(step: pl.DataFrame, *, peak_flops: float) -> float:
    """Program goodput as model FLOPs utilisation (MFU): model FLOPs done / (peak FLOP/s × time), summed
    over every rank-step of the canonical ``step`` frame (``model_flops`` per rank per step, the span
    ``end − start``). ``peak_flops`` is one GPU's peak for the dtype the model trains in
    (:func:`gpu_peak_flops`). Rank-steps without ``model_flops`` are left out of both sums."""
    for c in ("start", "end", "model_flops"):
        if c not in step.columns:
            raise ValueError(f"step frame lacks column {c!r}")
    if not (peak_flops > 0 and math.isfinite(peak_flops)):
        raise ValueError("peak_flops must be finite and > 0")
    st = step.filter(pl.col("model_flops").is_not_null())
    if st.height == 0:
        raise ValueError("no step carries model_flops: program goodput needs them")
    if st.filter(pl.col("model_flops").is_nan() | (pl.col("model_flops") < 0)).height:
        raise ValueError("model_flops must be finite and ≥ 0 (got NaN or a negative value)")
    secs = st.select((pl.col("end") - pl.col("start")).dt.total_microseconds().sum()).item() / US
    return program_goodput_of(float(st["model_flops"].sum()), secs, peak_flops=peak_flops)


def program_goodput_of(model_flops: float, span_s: float, *, peak_flops: float, problem: str | None = None) -> float:
    """:func:`program_goodput` from its two sums: the model FLOPs of the rank-steps that carry them and those
    rank-steps' spans in seconds (an incremental analysis keeps these sums). ``problem``: why the FLOPs
    cannot be used (a NaN or negative value among them), raised as the ValueError it is."""
    if problem:
        raise ValueError(problem)
    if not (peak_flops > 0 and math.isfinite(peak_flops)):
        raise ValueError("peak_flops must be finite and > 0")
    if span_s <= 0:
        raise ValueError("steps with model_flops span no time")
    return model_flops / (peak_flops * span_s)


def ml_productivity_goodput(scheduling: float, runtime: float, program: float) -> float:
    """Google's ML Productivity Goodput = scheduling goodput × runtime goodput × program goodput."""
    for name, v in (("scheduling", scheduling), ("runtime", runtime), ("program", program)):
        if not (0.0 <= v <= 1.0):
            raise ValueError(f"{name} goodput must be a ratio in [0, 1], got {v!r}")
    return scheduling * runtime * program

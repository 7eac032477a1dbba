"""The per-event loops analyzers.goodput's timeline and scheduling goodput were first written as, kept
verbatim as the references the column-wise versions are checked against in test_goodput_vectorised.py."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

import numpy as np
import polars as pl

from analyzers.goodput import PRODUCTIVE
# the payload readers are the exact per-row ones goodput_events still uses for rows its columnar reader cannot read
from analyzers.goodput_events import US as _US, _payload, _payload_number, _payload_time, check_events, one_job
from analyzers.goodput_events import epoch_us as _us, from_epoch_us as _dt
from fleetscope.core.frames import UTC_US

_OVERLAY_ORDER = ("checkpoint_restore", "checkpoint_save", "data_loading")


@dataclass
class _Attempt:
    start: int
    initialized: int | None = None
    steps: list[tuple[int, int, float]] = field(default_factory=list)  # (step, start_us, data_loading_s)
    disruption: int | None = None
    last_seen: int = 0


def _steps_from_events(ev: pl.DataFrame) -> list[tuple[int, int, float]]:
    """(step, start µs, data loading s) per step event. A step's start is its payload ``start``, else
    ``ts − duration_s`` (``ts`` is the step's end in our schema), else ``ts`` itself: a bare step event
    marks the step's start, as the library's ``record_step_start_time`` does. Several ranks reporting the
    same step give one start: the earliest."""
    rows = ev.filter(pl.col("kind") == "step").select("ts", "step", "payload", "rank").iter_rows()
    out: list[tuple[int, int, float]] = []
    for ts, step, text, rank in rows:
        where = f"step event (step {step}, rank {rank})"
        p = _payload(text, where)
        start = _payload_time(p, "start", where)
        if start is None:
            end = _payload_time(p, "end", where)
            end = _us(ts) if end is None else end
            dur = _payload_number(p, "duration_s", where)
            start = end - round(dur * _US) if dur is not None else end
        dl = _payload_number(p, "data_loading_s", where) or 0.0
        out.append((int(step), start, dl))
    return out


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
    kinds = ev["kind"].to_list()
    ts_us = [_us(t) for t in ev["ts"].to_list()]

    boundaries = [t for k, t in zip(kinds, ts_us) if k in ("started", "restart")]
    if not boundaries:
        raise ValueError(f"job {job_id}: no 'started' event, so the runtime has no beginning")
    steps = _steps_from_events(ev)
    if steps and min(s[1] for s in steps) < boundaries[0]:
        raise ValueError(f"job {job_id}: a step starts before the job's first 'started' event")

    # Attempts: a 'restart' followed by 'started' (or the reverse) with no step between is one attempt.
    step_starts = sorted(s[1] for s in steps)
    attempts: list[_Attempt] = []
    for b in boundaries:
        if attempts and not any(attempts[-1].start <= s < b for s in step_starts):
            continue
        attempts.append(_Attempt(start=b, last_seen=b))
    starts = np.array([a.start for a in attempts])

    # Steps into attempts; several ranks reporting one step collapse to its earliest start.
    per: dict[tuple[int, int], tuple[int, float]] = {}
    for step, start, dl in steps:
        i = int(np.searchsorted(starts, start, side="right")) - 1
        key = (i, step)
        if key not in per or start < per[key][0]:
            per[key] = (start, dl)
    for (i, step), (start, dl) in per.items():
        attempts[i].steps.append((step, start, dl))
    for a in attempts:
        a.steps.sort(key=lambda s: (s[1], s[0]))

    finished = [t for k, t in zip(kinds, ts_us) if k == "finished"]
    end = min(finished[-1], _us(until)) if finished and until is not None else (
        finished[-1] if finished else (_us(until) if until is not None else None))
    if end is None:
        raise ValueError(f"job {job_id} has no 'finished' event: pass until= to measure it while it runs")
    if end < boundaries[0]:
        raise ValueError(f"job {job_id}: end {_dt(end).isoformat()} is before its start")

    # Per attempt: initialization, disruption and the attempt's last sign of life.
    for i, a in enumerate(attempts):
        nxt = attempts[i + 1].start if i + 1 < len(attempts) else end
        last_step = a.steps[-1][1] if a.steps else a.start
        for k, t in zip(kinds, ts_us):
            if not (a.start <= t < nxt):
                continue
            a.last_seen = max(a.last_seen, t)
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

    overlays = _overlays(ev, kinds, ts_us, attempts, job_id)
    return _paint(job_id, base, overlays, attempts[0].start, end)


def _overlays(ev: pl.DataFrame, kinds: list[str], ts_us: list[int], attempts: list[_Attempt], job_id: str) -> dict[str, list[tuple[int, int]]]:
    out: dict[str, list[tuple[int, int]]] = {b: [] for b in _OVERLAY_ORDER}
    for what in ("save", "restore"):
        open_at: int | None = None
        for k, t in zip(kinds, ts_us):
            if k == f"checkpoint_{what}_start":
                open_at = t if open_at is None else open_at
            elif k == f"checkpoint_{what}_end":
                if open_at is None:
                    raise ValueError(f"job {job_id}: checkpoint_{what}_end at {_dt(t).isoformat()} without a start")
                out[f"checkpoint_{what}"].append((open_at, t))
                open_at = None
        # a save still open at the end (job cut by until=, or a crash mid-save) blocks until then
        if open_at is not None:
            out[f"checkpoint_{what}"].append((open_at, max(ts_us)))
    for a in attempts:
        for _, s, dl in a.steps:
            if dl > 0:
                out["data_loading"].append((s - round(dl * _US), s))
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
        ((pl.col("end_us") - pl.col("start_us")) / _US).alias("duration_s"),
        "bucket",
        pl.when(pl.col("step") >= 0).then(pl.col("step")).alias("step"),
    )



def scheduling_goodput(job_event: pl.DataFrame, *, submitted_at: datetime | None = None, until: datetime | None = None) -> float:
    ev = check_events(job_event)
    job_id = one_job(ev)
    if not ev.filter(pl.col("kind") == "allocated").height:
        raise ValueError(f"job {job_id}: no 'allocated' event, so scheduling goodput is undefined")
    t_first = _us(ev["ts"].min())
    a = _us(submitted_at) if submitted_at is not None else t_first
    fin = ev.filter(pl.col("kind") == "finished")["ts"]
    b = _us(until) if until is not None else (_us(fin.max()) if fin.len() else None)
    if b is None:
        raise ValueError(f"job {job_id} has no 'finished' event: pass until=")
    if b <= a:
        raise ValueError("the job's end is not after its submission")
    held, since = 0, None
    for k, t in zip(ev["kind"].to_list(), (_us(x) for x in ev["ts"].to_list())):
        t = min(max(t, a), b)
        if k == "allocated" and since is None:
            since = t
        elif k in ("preempted", "finished") and since is not None:
            held += t - since
            since = None
    if since is not None:
        held += b - since
    return held / (b - a)

"""Rolling goodput and step-time deviation as a job's analysis reports them: the window length chosen for
the run, the goodput of each window, and how far each completed step's time is from the ideal step time.

Both read one :func:`analyzers.goodput.goodput_timeline` (the formulas are ``analyzers.goodput``'s:
:func:`~analyzers.goodput.rolling_goodput_of`, :func:`~analyzers.goodput.step_times_of`,
:func:`~analyzers.goodput.ideal_step_time`, ``ml-goodput-measurement``'s semantics). What this module adds is
the choice a report needs and a caller should not have to make:

- *Which steps are measured*: a step's time runs from its start to the next step's start, so the step a
  running job is in has no time yet; it is left out (a finished job's last step ends with the job).
- *The window*: consecutive windows from the job's start, each the shortest of :data:`RUNGS_S` that holds
  :data:`WINDOW_STEPS` ideal steps and cuts the run into at most :data:`MAX_WINDOWS` windows (the longest
  rung past that); the newest :data:`MAX_WINDOWS` are kept. The last window ends with the run (a running
  job's at ``until``), so it may be shorter.
- *Too little to say*: a run that fits in one window, or with no completed productive step, gets no windows;
  fewer than :data:`MIN_DEVIATION_STEPS` completed steps, no deviation. Each says why instead (``why``),
  never raises.

Pure: polars in, JSON-ready dicts out (times as ``datetime``).
"""

from __future__ import annotations

from typing import Any

import polars as pl

from analyzers import goodput

__all__ = ["RUNGS_S", "WINDOW_STEPS", "MAX_WINDOWS", "MIN_DEVIATION_STEPS", "window_s", "measured_steps", "rolling", "deviation", "trend"]

RUNGS_S: tuple[int, ...] = (10, 30, 60, 300, 900, 1800, 3600, 6 * 3600, 86_400, 7 * 86_400)
"""Window lengths a run's rolling goodput is cut by: 10 s to a week."""
WINDOW_STEPS = 10
"""A window holds at least this many ideal steps, so one slow step does not make a window."""
MAX_WINDOWS = 48
"""The most windows a run is cut into (and the newest kept)."""
MIN_DEVIATION_STEPS = 2
"""Completed productive steps step-time deviation needs: a single step is its own ideal."""


def window_s(elapsed_s: float, ideal_step_s: float) -> float:
    """The rolling window of a run ``elapsed_s`` long whose ideal step is ``ideal_step_s``: the shortest of
    :data:`RUNGS_S` that is at least :data:`WINDOW_STEPS` ideal steps long and cuts the run into at most
    :data:`MAX_WINDOWS` windows; the longest rung when none does."""
    for rung in RUNGS_S:
        if rung >= WINDOW_STEPS * ideal_step_s and elapsed_s <= MAX_WINDOWS * rung:
            return float(rung)
    return float(RUNGS_S[-1])


def measured_steps(tl: pl.DataFrame, *, running: bool) -> pl.DataFrame:
    """The completed productive steps of a timeline, ``step, step_time_s`` in step order: a running job's
    step under way (the step of the span its timeline ends in, unless that step's progress was wasted) is
    left out, having no end yet."""
    st = goodput.step_times_of(tl)
    if running and st.height:
        last = tl.sort("end").row(-1, named=True)
        if last["step"] is not None and last["bucket"] != "wasted_progress":
            st = st.filter(pl.col("step") != last["step"])
    return st


def rolling(tl: pl.DataFrame, steps: pl.DataFrame) -> dict[str, Any]:
    """Goodput of consecutive windows of the run (:func:`window_s` long, from its start): ``window_s``,
    ``window_steps``, ``ideal_step_time_s`` (what the window was sized by), ``windows_total`` and the newest
    :data:`MAX_WINDOWS` ``windows`` (``window_start, window_end, total_s, productive_s, goodput_ratio,
    badput_s`` by bucket), oldest first; ``why`` (else None) when there are none."""
    t0, t1 = tl["start"].min(), tl["end"].max()
    elapsed = (t1 - t0).total_seconds()
    out: dict[str, Any] = {"window_s": None, "window_steps": WINDOW_STEPS, "ideal_step_time_s": None, "windows_total": 0, "windows": [], "why": None}
    if steps.height == 0:
        out["why"] = "no completed productive step to size the windows by"
        return out
    ideal = goodput.ideal_step_time(steps["step_time_s"])
    w = window_s(elapsed, ideal)
    out.update(window_s=w, ideal_step_time_s=ideal)
    if elapsed <= w:
        out["why"] = (f"too few steps for a rolling window: the run ({elapsed:g} s, {steps.height} completed step"
                      f"{'s' if steps.height != 1 else ''}) fits in one window of {w:g} s, the shortest that holds "
                      f"{WINDOW_STEPS} ideal steps of {ideal:.4g} s; rolling goodput needs two windows or more")
        return out
    df = goodput.rolling_goodput_of(tl, every_s=w, period_s=w)
    out["windows_total"] = df.height
    out["windows"] = [
        {"window_start": r["window_start"], "window_end": r["window_end"], "total_s": r["total_s"],
         "productive_s": r[f"{goodput.PRODUCTIVE}_s"], "goodput_ratio": r["goodput_ratio"],
         "badput_s": {b: r[f"{b}_s"] for b in goodput.BADPUT_BUCKETS}}
        for r in df.tail(MAX_WINDOWS).iter_rows(named=True)
    ]
    return out


def deviation(steps: pl.DataFrame, *, last_steps: int) -> dict[str, Any]:
    """Step-time deviation (the library's: step time − ideal step time) over the completed steps: ``steps``,
    ``ideal_step_time_s``, ``anomaly_threshold_s`` (median + 3 × MAD: the steps above it are left out of the
    ideal), ``anomalous_steps``, ``mean_deviation_s``, the largest deviation and its step (the earliest on a
    tie), and the newest ``last_steps`` steps as ``last`` (``step, step_time_s, deviation_s``); ``why`` (else
    None) when there are too few steps."""
    out: dict[str, Any] = {"steps": steps.height, "ideal_step_time_s": None, "anomaly_threshold_s": None, "anomalous_steps": None,
                           "mean_deviation_s": None, "max_deviation_s": None, "max_deviation_step": None, "last": [], "why": None}
    if steps.height < MIN_DEVIATION_STEPS:
        out["why"] = (f"{steps.height} completed productive step{'s' if steps.height != 1 else ''}: step-time deviation needs "
                      f"{MIN_DEVIATION_STEPS} or more (a single step is its own ideal)")
        return out
    times = steps["step_time_s"]
    ideal, threshold = goodput.ideal_step_time(times), goodput.anomaly_threshold_s(times)
    dev = steps.with_columns((pl.col("step_time_s") - ideal).alias("deviation_s"))
    worst = dev.row(int(dev["deviation_s"].arg_max()), named=True)  # the first maximum: the earliest step on a tie
    out.update(ideal_step_time_s=ideal, anomaly_threshold_s=threshold, anomalous_steps=int((times > threshold).sum()),
               mean_deviation_s=float(dev["deviation_s"].mean()), max_deviation_s=worst["deviation_s"],
               max_deviation_step=int(worst["step"]), last=dev.tail(max(0, int(last_steps))).to_dicts())
    return out


def trend(tl: pl.DataFrame, *, running: bool, last_steps: int) -> dict[str, Any]:
    """``{"rolling": rolling(...), "step_time_deviation": deviation(...)}`` of one timeline; ``running``: the
    job has not finished (its step under way is not measured)."""
    steps = measured_steps(tl, running=running)
    return {"rolling": rolling(tl, steps), "step_time_deviation": deviation(steps, last_steps=last_steps)}

"""analyzers.goodput_trend: rolling goodput and step-time deviation as the goodput analysis reports them, on
ml-goodput-measurement's worked examples (the partial-restart run, 30.612 %; the sample program, 75.000 %),
worked out by hand from their timelines; the window rule; a running job's step under way; too few steps."""

from __future__ import annotations

from datetime import timedelta

import polars as pl
import pytest

from analyzers import goodput as g
from analyzers import goodput_trend as trend

from .test_goodput import RESTART_ROWS, T0, events, simple_job

# The partial-restart run's timeline (tests/analyzers/test_goodput.py): other [0, 5), step 0 [5, 13) = program
# startup 5 s + productive 3 s, step 1 [13, 16) productive, steps 2 and 3 [16, 22) wasted, infrastructure
# recovery [22, 30); other [30, 35), step 2 [35, 43) = 5 s startup + 3 s, steps 3 and 4 [43, 49) productive.
RESTART_BADPUT_0_30 = {"wasted_progress": 6.0, "infrastructure_recovery": 8.0, "program_startup": 5.0, "other": 5.0}
RESTART_BADPUT_30_49 = {"program_startup": 5.0, "other": 5.0}


def badput(nonzero: dict[str, float]) -> dict[str, float]:
    return {b: nonzero.get(b, 0.0) for b in g.BADPUT_BUCKETS}


def test_the_partial_restart_run_by_hand():
    out = trend.trend(g.goodput_timeline(events(RESTART_ROWS)), running=False, last_steps=100)
    roll = out["rolling"]
    # step times 8, 3, 8, 3, 3 s: median 3, MAD 0, so the ideal is 3 s; 10 ideal steps = 30 s, a rung
    assert (roll["window_s"], roll["ideal_step_time_s"], roll["windows_total"], roll["why"]) == (30.0, 3.0, 2, None)
    assert roll["windows"] == [
        {"window_start": T0, "window_end": T0 + timedelta(seconds=30), "total_s": 30.0, "productive_s": 6.0, "goodput_ratio": 0.2,
         "badput_s": badput(RESTART_BADPUT_0_30)},
        {"window_start": T0 + timedelta(seconds=30), "window_end": T0 + timedelta(seconds=49), "total_s": 19.0, "productive_s": 9.0,
         "goodput_ratio": 9 / 19, "badput_s": badput(RESTART_BADPUT_30_49)},
    ]
    # the windows add up to the run: 15 s productive of 49 s, the published 30.612 %
    assert sum(w["productive_s"] for w in roll["windows"]) / sum(w["total_s"] for w in roll["windows"]) == g.runtime_goodput(events(RESTART_ROWS)).goodput_ratio
    dev = out["step_time_deviation"]
    assert dev == {"steps": 5, "ideal_step_time_s": 3.0, "anomaly_threshold_s": 3.0, "anomalous_steps": 2, "mean_deviation_s": 2.0,
                   "max_deviation_s": 5.0, "max_deviation_step": 0, "why": None,
                   "last": [{"step": 0, "step_time_s": 8.0, "deviation_s": 5.0}, {"step": 1, "step_time_s": 3.0, "deviation_s": 0.0},
                            {"step": 2, "step_time_s": 8.0, "deviation_s": 5.0}, {"step": 3, "step_time_s": 3.0, "deviation_s": 0.0},
                            {"step": 4, "step_time_s": 3.0, "deviation_s": 0.0}]}
    # the newest steps only, when fewer are asked for
    assert [r["step"] for r in trend.trend(g.goodput_timeline(events(RESTART_ROWS)), running=False, last_steps=2)["step_time_deviation"]["last"]] == [3, 4]


def test_the_windows_are_the_analyzers_rolling_goodput():
    tl = g.goodput_timeline(events(RESTART_ROWS))
    want = g.rolling_goodput(events(RESTART_ROWS), every_s=30, period_s=30)
    got = trend.rolling(tl, trend.measured_steps(tl, running=False))["windows"]
    assert [w["goodput_ratio"] for w in got] == want["goodput_ratio"].to_list()
    assert [w["badput_s"]["other"] for w in got] == want["other_s"].to_list()
    assert g.step_time_deviation(events(RESTART_ROWS))["deviation_s"].to_list() == [5.0, 0.0, 5.0, 0.0, 0.0]


def test_a_run_that_fits_in_one_window_has_none_and_says_why():
    # the library's sample program: five 3 s steps, 20 s in all; a window of 10 ideal steps is 30 s
    out = trend.trend(g.goodput_timeline(simple_job()), running=False, last_steps=100)
    roll = out["rolling"]
    assert roll["windows"] == [] and roll["windows_total"] == 0 and roll["window_s"] == 30.0
    assert roll["why"] == ("too few steps for a rolling window: the run (20 s, 5 completed steps) fits in one window of 30 s, the shortest "
                           "that holds 10 ideal steps of 3 s; rolling goodput needs two windows or more")
    dev = out["step_time_deviation"]
    assert (dev["ideal_step_time_s"], dev["anomalous_steps"], dev["max_deviation_s"], dev["max_deviation_step"], dev["why"]) == (3.0, 0, 0.0, 0, None)


def test_one_step_or_none_gives_reasons_not_errors():
    one = events([(0, "started", None, None), (5, "step", 0, None), (8, "finished", None, None)])
    out = trend.trend(g.goodput_timeline(one), running=False, last_steps=100)
    assert out["step_time_deviation"]["why"] == "1 completed productive step: step-time deviation needs 2 or more (a single step is its own ideal)"
    assert out["step_time_deviation"]["last"] == [] and out["step_time_deviation"]["steps"] == 1
    assert out["rolling"]["why"].startswith("too few steps for a rolling window: the run (8 s, 1 completed step) fits in one window of 30 s")
    none = events([(0, "started", None, None), (8, "finished", None, None)])
    out = trend.trend(g.goodput_timeline(none), running=False, last_steps=100)
    assert out["rolling"]["why"] == "no completed productive step to size the windows by" and out["rolling"]["window_s"] is None
    assert out["step_time_deviation"]["why"].startswith("0 completed productive steps")


def test_a_running_jobs_step_under_way_is_not_measured():
    rows = [(0, "started", None, None)] + [(5 + 3 * i, "step", i, None) for i in range(4)]  # step 3 began at 14 s
    tl = g.goodput_timeline(events(rows), until=T0 + timedelta(seconds=15))
    assert g.step_times_of(tl)["step"].to_list() == [0, 1, 2, 3]
    assert trend.measured_steps(tl, running=True)["step"].to_list() == [0, 1, 2]
    # finished at the same instant, its last step ends with it and counts
    assert trend.measured_steps(tl, running=False)["step"].to_list() == [0, 1, 2, 3]
    # a running job in recovery after a failure: its last step was cut short and is not under way
    failed = rows + [(16, "failure", None, None)]
    tl = g.goodput_timeline(events(failed), until=T0 + timedelta(seconds=30))
    assert tl.sort("end")["bucket"].to_list()[-1] == "infrastructure_recovery"
    assert trend.measured_steps(tl, running=True)["step"].to_list() == g.step_times_of(tl)["step"].to_list() == [0, 1, 2]


@pytest.mark.parametrize("elapsed, ideal, want", [
    (49, 3.0, 30.0),        # 10 ideal steps: 30 s
    (49, 0.1, 10.0),        # the shortest rung
    (600, 0.1, 30.0),       # 48 windows of 10 s are 480 s: the next rung
    (7 * 86_400, 2.0, 21_600.0),
    (86_400 * 400, 1.0, 604_800.0),  # past 48 weeks: the longest rung
    (3600, 1e6, 604_800.0),  # steps longer than the longest rung holds 10 of
])
def test_the_window_is_the_shortest_rung_holding_ten_steps_and_at_most_48_windows(elapsed, ideal, want):
    assert trend.window_s(elapsed, ideal) == want


def test_a_long_run_keeps_its_newest_48_windows():
    # 120 steps of 1 s after a 5 s start: 125 s, ideal 1 s, windows of 10 s: 13, all kept
    rows = [(0, "started", None, None)] + [(5 + i, "step", i, None) for i in range(120)] + [(125, "finished", None, None)]
    roll = trend.trend(g.goodput_timeline(events(rows)), running=False, last_steps=100)["rolling"]
    assert (roll["window_s"], roll["windows_total"], len(roll["windows"])) == (10.0, 13, 13)
    assert [w["goodput_ratio"] for w in roll["windows"]] == [0.5] + [1.0] * 11 + [1.0]
    assert roll["windows"][-1]["total_s"] == 5.0
    # 1,005 s of 1 s steps: 101 windows of 10 s would be too many; windows of 30 s, 34 of them
    rows = [(0, "started", None, None)] + [(5 + i, "step", i, None) for i in range(1000)] + [(1005, "finished", None, None)]
    roll = trend.trend(g.goodput_timeline(events(rows)), running=False, last_steps=100)["rolling"]
    assert (roll["window_s"], roll["windows_total"], len(roll["windows"])) == (30.0, 34, 34)
    tl = g.goodput_timeline(events(rows))
    assert pl.DataFrame(roll["windows"])["productive_s"].sum() == g.runtime_goodput_of(tl).productive_s == 1000.0

"""Hung jobs: no step for k times the job's own step period while it holds GPUs and has not stopped."""

import datetime as dt
import json

import polars as pl

from analyzers import hangs

T0 = dt.datetime(2026, 11, 30, 12, 0, tzinfo=dt.UTC)


def progress(**over) -> pl.DataFrame:
    row = {"job_id": "j", "last_progress_ts": T0, "first_progress_ts": T0 - dt.timedelta(seconds=990), "steps": 100,
           "stopped_ts": None, "gpus": 1024}
    row.update(over)
    return pl.DataFrame([row], schema=hangs.PROGRESS_SCHEMA)


def test_stall_past_k_steps_and_the_floor_is_a_hang():
    # 100 steps over 990 s: a 10 s step. Floor 300 s > 10 × 10 s, so 301 s of silence is a hang, 299 s is not.
    assert hangs.hang_findings(progress(), now=T0 + dt.timedelta(seconds=299)).height == 0
    f = hangs.hang_findings(progress(), now=T0 + dt.timedelta(seconds=301))
    r = f.row(0, named=True)
    assert (r["kind"], r["subject"], r["severity"], r["window_start"]) == ("job_hang", "job:j", "critical", T0)
    ev = json.loads(r["evidence"])
    assert ev["typical_step_s"] == 10.0 and ev["stalled_s"] == 301.0 and ev["gpus"] == 1024


def test_a_slow_job_is_judged_by_its_own_pace():
    slow = progress(first_progress_ts=T0 - dt.timedelta(seconds=99 * 60))  # a one-minute step: limit 600 s
    assert hangs.hang_findings(slow, now=T0 + dt.timedelta(seconds=599)).height == 0
    assert hangs.hang_findings(slow, now=T0 + dt.timedelta(seconds=601)).height == 1


def test_a_job_that_stopped_released_its_gpus_or_has_one_step_is_not_hung():
    later = T0 + dt.timedelta(hours=1)
    assert hangs.hang_findings(progress(stopped_ts=T0 + dt.timedelta(seconds=5)), now=later).height == 0  # finished / failed
    assert hangs.hang_findings(progress(gpus=0), now=later).height == 0  # every rank released
    assert hangs.hang_findings(progress(steps=1), now=later).height == 0  # no pace to judge against
    # a terminal event from an earlier attempt does not excuse the current stall
    assert hangs.hang_findings(progress(stopped_ts=T0 - dt.timedelta(hours=1)), now=later).height == 1
    assert hangs.hang_findings(progress(gpus=None), now=later).height == 1  # assignments unknown: judged by steps alone

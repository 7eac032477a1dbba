"""Hung jobs: no step for k times the job's own step period while it holds GPUs and has not stopped."""

import datetime as dt
import json

import polars as pl
import pytest

from analyzers import hangs
from fleetscope.core.errors import ValidationError

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


def watchdog(job="j", *, after_s=120.0, host="node7", rank=3) -> pl.DataFrame:
    return pl.DataFrame([{"job_id": job, "ts": T0 + dt.timedelta(seconds=after_s), "host": host, "rank": rank,
                          "message": f"job {job}: rank {rank} ALLREDUCE SeqNum=12 ran 600.046 s, past its timeout of 600 s"}],
                        schema=hangs.WATCHDOG_SCHEMA)


def test_a_watchdog_timeout_during_the_stall_reports_the_hang_at_once_with_it_as_evidence():
    # 120 s after the last 10 s step: under the 300 s floor, so by steps alone not yet a hang
    now = T0 + dt.timedelta(seconds=121)
    assert hangs.hang_findings(progress(), now=now).height == 0
    f = hangs.hang_findings(progress(), now=now, watchdog=watchdog())
    r = f.row(0, named=True)
    assert (r["kind"], r["subject"], r["window_start"]) == ("job_hang", "job:j", T0)
    ev = json.loads(r["evidence"])
    assert ev["detected_by"] == "watchdog" and ev["watchdog_timeouts"] == 1
    assert ev["watchdog"][0]["host"] == "node7" and ev["watchdog"][0]["rank"] == 3 and "ALLREDUCE" in ev["watchdog"][0]["message"]
    assert "1 NCCL watchdog timeout(s) since, first rank 3 on node7" in r["summary"]
    # past the limit the stall finds it anyway; the watchdog is still its evidence
    late = json.loads(hangs.hang_findings(progress(), now=T0 + dt.timedelta(seconds=400), watchdog=watchdog())["evidence"][0])
    assert late["detected_by"] == "stall" and late["watchdog_timeouts"] == 1


def test_a_watchdog_timeout_before_the_last_step_another_jobs_or_a_stopped_job_is_no_evidence():
    now = T0 + dt.timedelta(seconds=121)
    assert hangs.hang_findings(progress(), now=now, watchdog=watchdog(after_s=-30)).height == 0  # the job went on after it
    assert hangs.hang_findings(progress(), now=now, watchdog=watchdog("other")).height == 0
    assert hangs.hang_findings(progress(stopped_ts=T0 + dt.timedelta(seconds=100)), now=now, watchdog=watchdog()).height == 0
    assert hangs.hang_findings(progress(), now=now, watchdog=watchdog(after_s=500)).height == 0  # after `now`: not yet seen
    # a job with one step has no pace, but a timeout after it is still a hang
    assert hangs.hang_findings(progress(steps=1), now=now, watchdog=watchdog()).height == 1


def test_watchdog_events_are_tied_to_the_job_named_or_the_jobs_on_the_host():
    ts = T0 + dt.timedelta(seconds=60)
    events = pl.DataFrame({"ts": [ts, ts, ts, ts], "host": ["n1", "n2", "", "n3"], "kind": ["nccl_watchdog_timeout"] * 3 + ["xid"],
                           "code": [3, 5, 1, 79], "message": ["job train-9: rank 3 ALLREDUCE", "job unknown: rank 5 BROADCAST",
                                                              "job unknown: rank 1 ALLREDUCE", "Xid 79"]},
                          schema_overrides={"ts": pl.Datetime("us", "UTC")})
    ranks = pl.DataFrame({"job_id": ["a", "b", "c"], "host": ["n2", "n2", "n2"], "start": [T0, T0, T0],
                          "end": [None, ts - dt.timedelta(seconds=1), None]}, schema_overrides={"start": pl.Datetime("us", "UTC"), "end": pl.Datetime("us", "UTC")})
    w = hangs.watchdog_by_job(events, ranks)
    # train-9 by its message; the unnamed one on n2 goes to the jobs holding n2 then (b had left); no host, no job
    assert w.select("job_id", "host", "rank").rows() == [("a", "n2", 5), ("c", "n2", 5), ("train-9", "n1", 3)]
    assert hangs.watchdog_by_job(events.filter(pl.col("kind") == "xid"), ranks).height == 0
    with pytest.raises(ValidationError, match="watchdog"):
        hangs.hang_findings(progress(), now=T0, watchdog=pl.DataFrame({"job_id": ["j"]}))

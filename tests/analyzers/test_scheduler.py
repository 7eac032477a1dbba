"""Scheduler accounting on the real Hábrók sacct text and slurmrestd responses: outcomes, queue waits,
pending reasons and GPU-hours per period, checked against figures computed by hand."""

import datetime as dt
import json

import polars as pl
import pytest

from analyzers import scheduler as A
from ingest import slurm_sacct, slurm_squeue, slurmrestd

T0 = dt.datetime(2026, 11, 15, tzinfo=dt.UTC)


@pytest.fixture()
def habrok(realdata):
    return slurm_sacct.parse((realdata / "scheduler/slurm_sacct-parsable-snowman-delim_habrok_gres-gpu.txt").read_bytes()).sched_job


def test_outcomes_with_evidence(habrok):
    o = A.job_outcomes(habrok)
    assert o.height == 100 - 7 - 3  # pending and running jobs have not ended
    nf = o.filter(pl.col("state") == "NODE_FAIL").row(0, named=True)
    assert nf["outcome"] == "infrastructure_failure" and nf["interruption"] is True and json.loads(nf["evidence"])["state"] == "NODE_FAIL"
    c = o.filter(pl.col("job_id") == "8150389").row(0, named=True)
    assert c["outcome"] == "cancelled" and json.loads(c["evidence"])["cancelled_by"] == "33128806"
    assert c["lost_gpu_s_max"] == 2 * 248956
    s = A.outcome_summary(habrok)
    assert s["jobs"].sum() == 90 and s["gpu_hours_share"].sum() == pytest.approx(1.0)
    t = o.filter(pl.col("state") == "TIMEOUT")
    # Elapsed less Timelimit of the seven TIMEOUT rows of the file, e.g. 6708912: 3-00:00:25 - 3-00:00:00;
    # Slurm lets a job overrun by up to its kill wait, so each is a few seconds
    over = {r["job_id"]: json.loads(r["evidence"]).get("over_limit_s") for r in t.iter_rows(named=True)}
    assert over == {"6708912": 25, "2296177": 24, "7195760": 27, "7216821_144": 17, "8180204": 6, "8181476_31": 1, "8182578": 8}


def test_preempted_and_oom_map(realdata):
    jobs = pl.DataFrame({"job_id": ["1", "2", "3"], "state": ["PREEMPTED", "OUT_OF_MEMORY", "COMPLETED"], "gpus": [8, 1, 2], "elapsed_s": [3600, 60, 10]})
    o = {r["job_id"]: r for r in A.job_outcomes(jobs).to_dicts()}
    assert (o["1"]["outcome"], o["1"]["reliability"], o["1"]["interruption"], o["1"]["lost_gpu_s_max"]) == ("preempted", "planned", False, 28800.0)
    assert o["2"]["outcome"] == "job_failure" and o["3"]["lost_gpu_s_max"] == 0.0


def test_queue_waits_from_eligible(realdata, habrok):
    w = {r["job_id"]: r["wait_s"] for r in A.queue_waits(habrok).to_dicts()}
    assert w["7946767"] == 51018 and w["7965768"] == 8132
    b = slurmrestd.parse((realdata / "scheduler/slurmrestd_v0.0.40_23.11.1_jobs_talapas.json").read_bytes())
    w = A.queue_waits(b.sched_job, now=dt.datetime(2024, 7, 29, 18, tzinfo=dt.UTC))
    run = b.sched_job.filter(pl.col("state") == "RUNNING").row(0, named=True)
    assert (run["start_at"] - run["submit_at"]).total_seconds() == 6044  # SOURCES.md: submit -> start
    assert dict(w.select("pending", "wait_s").iter_rows())[False] == 6035 == (run["start_at"] - run["eligible_at"]).total_seconds()  # eligible 9 s after submit
    pend = w.filter(pl.col("pending")).row(0, named=True)
    assert pend["state_reason"] == "Resources" and pend["wait_s"] == 7674  # 18:00 less eligible 15:52:06
    # eligible, not submit: a job with a begin time that started waits from its eligible time
    jobs = pl.DataFrame({"job_id": ["9"], "state": ["COMPLETED"], "submit_at": [T0], "eligible_at": [T0 + dt.timedelta(hours=1)],
                         "start_at": [T0 + dt.timedelta(hours=1, seconds=30)]})
    assert A.queue_waits(jobs)["wait_s"].item() == 30
    s = A.queue_wait_summary(habrok)
    assert s["started"].sum() + 0 == A.queue_waits(habrok).filter(~pl.col("pending")).height
    assert s["pending"].sum() == 7


def test_pending_reasons(realdata):
    b = slurm_squeue.parse((realdata / "scheduler/slurm_squeue-dependency-reason-cpus_habrok.txt").read_bytes(), ts=T0)
    r = dict(A.pending_reasons(b.sched_job).select("reason", "jobs").iter_rows())
    assert r["Dependency"] == 3 and r["Priority"] == 3 and sum(r.values()) == 7


def test_allocated_gpu_seconds_clip_to_the_period(habrok):
    whole = A.allocated_gpu_seconds(habrok, dt.datetime(2000, 1, 1, tzinfo=dt.UTC), dt.datetime(2100, 1, 1, tzinfo=dt.UTC), now=dt.datetime(2100, 1, 1, tzinfo=dt.UTC))
    ended = whole.filter(pl.col("end_at").is_not_null())
    want = habrok.filter(pl.col("gpus").is_not_null() & pl.col("end_at").is_not_null()).select((pl.col("gpus") * pl.col("elapsed_s")).sum()).item()
    assert ended["gpu_s"].sum() == want and round(want / 3600, 2) == 175.54  # 220.40 less the two still running
    # one day of job 8150389 (2 GPUs): 2 x 86400 s
    j = habrok.filter(pl.col("job_id") == "8150389")
    s = j["start_at"].item()
    day = A.allocated_gpu_seconds(j, s + dt.timedelta(days=1), s + dt.timedelta(days=2))
    assert day["gpu_s"].item() == 2 * 86400

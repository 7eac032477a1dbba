"""Scheduler accounting: GPU-hours allocated per period, queue waits from eligibility, pending reasons, and
each job's end state read as goodput and reliability with its evidence.

End states (``sacct(1)`` JOB STATE CODES) mean different things for the fleet:

| state | outcome | an interruption? | GPU time |
|---|---|---|---|
| COMPLETED | success | no | productive |
| FAILED | job failure (non-zero exit: the job's own code unless other evidence says the host) | no | lost past the last checkpoint |
| OUT_OF_MEMORY | job failure (host memory limit) | no | lost past the last checkpoint |
| TIMEOUT | ran into its time limit | no | lost past the last checkpoint |
| CANCELLED | cancelled (by the user, or an operator: ``cancelled_by``) | no | lost past the last checkpoint |
| PREEMPTED | planned interruption by a higher-priority job | planned (the Llama 3 report's tables count unexpected ones only) | lost past the last checkpoint |
| NODE_FAIL, BOOT_FAIL | infrastructure failure | yes (unexpected) | lost past the last checkpoint |
| DEADLINE | missed its deadline | no | lost |

The scheduler cannot see checkpoints, so the GPU time of a non-success end is an upper bound of what was
lost (``held_gpu_s``); the job's own events (``job_event``) narrow it in the goodput analysis.

Queue wait is ``start - eligible`` (falling back to submit when the source gives no eligible time): a job held
by ``--begin`` or a dependency is not waiting for resources before it becomes eligible (slurmrestd's
``eligible_time``; Slurm's ``sprio``/``sshare`` docs). A job still pending has waited ``now - eligible``.

Pure: polars frames in (``sched_job`` columns), frames out; ``now`` is an argument.
"""

from __future__ import annotations

import datetime as dt
import json

import polars as pl

from fleetscope.core.spec import require_columns

OUTCOMES: dict[str, tuple[str, str, bool]] = {
    # state: (outcome, reliability class, unexpected interruption)
    "COMPLETED": ("success", "none", False),
    "FAILED": ("job_failure", "job", False),
    "OUT_OF_MEMORY": ("job_failure", "job", False),
    "TIMEOUT": ("timeout", "job", False),
    "CANCELLED": ("cancelled", "none", False),
    "PREEMPTED": ("preempted", "planned", False),
    "NODE_FAIL": ("infrastructure_failure", "infrastructure", True),
    "BOOT_FAIL": ("infrastructure_failure", "infrastructure", True),
    "DEADLINE": ("deadline", "job", False),
}
TERMINAL = frozenset(OUTCOMES)


def job_outcomes(jobs: pl.DataFrame) -> pl.DataFrame:
    """One row per ended job: ``outcome``, ``reliability``, ``interruption``, the GPU-seconds it held
    (``held_gpu_s``; ``lost_gpu_s_max`` the same for a non-success end) and ``evidence`` (JSON: the state,
    reason, exit code, who cancelled, elapsed against the time limit)."""
    require_columns(jobs, "sched_job", ("job_id", "state", "gpus", "elapsed_s"))
    ended = jobs.filter(pl.col("state").is_in(list(TERMINAL)))
    rows = []
    for r in ended.iter_rows(named=True):
        outcome, rel, unexpected = OUTCOMES[r["state"]]
        held = (r["gpus"] or 0) * (r["elapsed_s"] or 0)
        ev = {k: r.get(k) for k in ("state", "state_reason", "exit_code", "exit_signal", "cancelled_by", "elapsed_s", "time_limit_s", "nodes")
              if r.get(k) is not None}
        if r["state"] == "TIMEOUT" and r.get("time_limit_s") and r.get("elapsed_s") is not None:
            ev["over_limit_s"] = r["elapsed_s"] - r["time_limit_s"]
        if r["state"] == "FAILED" and r.get("exit_code") not in (None, 0):
            ev["why"] = "non-zero exit code"
        rows.append({"cluster": r.get("cluster") or "", "job_id": r["job_id"], "state": r["state"], "outcome": outcome, "reliability": rel,
                     "interruption": unexpected, "gpus": r["gpus"], "held_gpu_s": float(held),
                     "lost_gpu_s_max": 0.0 if outcome == "success" else float(held), "evidence": json.dumps(ev, sort_keys=True, default=str)})
    schema = {"cluster": pl.String, "job_id": pl.String, "state": pl.String, "outcome": pl.String, "reliability": pl.String,
              "interruption": pl.Boolean, "gpus": pl.Int64, "held_gpu_s": pl.Float64, "lost_gpu_s_max": pl.Float64, "evidence": pl.String}
    return pl.DataFrame(rows, schema=schema)


def outcome_summary(jobs: pl.DataFrame) -> pl.DataFrame:
    """Ended jobs per state with their outcome, GPU-hours held and the share of all GPU-hours held."""
    o = job_outcomes(jobs)
    total = o["held_gpu_s"].sum() or 0.0
    return (o.group_by("state", "outcome", "reliability").agg(pl.len().alias("jobs"), (pl.col("held_gpu_s").sum() / 3600).alias("gpu_hours"))
            .with_columns((pl.col("gpu_hours") * 3600 / total if total else pl.lit(0.0)).alias("gpu_hours_share")).sort("gpu_hours", "jobs", descending=True))


def queue_waits(jobs: pl.DataFrame, now: dt.datetime | None = None) -> pl.DataFrame:
    """Each job's queue wait in seconds: ``start - (eligible or submit)``; a pending job's wait so far when
    ``now`` is given (``pending`` true). Jobs with neither time are left out."""
    require_columns(jobs, "sched_job", ("job_id", "submit_at", "start_at", "state"))
    cols = jobs.columns
    since = pl.coalesce(pl.col("eligible_at"), pl.col("submit_at")) if "eligible_at" in cols else pl.col("submit_at")
    until = pl.col("start_at")
    if now is not None:
        until = pl.when(pl.col("state") == "PENDING").then(pl.lit(now).cast(pl.Datetime("us", "UTC"))).otherwise(pl.col("start_at"))
    out = jobs.select(
        pl.col("cluster") if "cluster" in cols else pl.lit("").alias("cluster"), "job_id",
        pl.col("partition") if "partition" in cols else pl.lit(None, pl.String).alias("partition"),
        (pl.col("state") == "PENDING").alias("pending"),
        pl.col("state_reason") if "state_reason" in cols else pl.lit(None, pl.String).alias("state_reason"),
        ((until - since).dt.total_microseconds() / 1e6).alias("wait_s"),
    )
    return out.filter(pl.col("wait_s").is_not_null() & (pl.col("wait_s") >= 0))


def queue_wait_summary(jobs: pl.DataFrame, now: dt.datetime | None = None) -> pl.DataFrame:
    """Per partition: jobs started, mean, median, p90 and max wait (s) of started jobs, jobs pending now."""
    w = queue_waits(jobs, now)
    started = w.filter(~pl.col("pending")).group_by("partition").agg(
        pl.len().alias("started"), pl.col("wait_s").mean().alias("mean_wait_s"), pl.col("wait_s").median().alias("median_wait_s"),
        pl.col("wait_s").quantile(0.9, "nearest").alias("p90_wait_s"), pl.col("wait_s").max().alias("max_wait_s"))
    pending = jobs.filter(pl.col("state") == "PENDING").group_by("partition").agg(pl.len().alias("pending"))
    return started.join(pending, on="partition", how="full", coalesce=True).with_columns(
        pl.col("started").fill_null(0), pl.col("pending").fill_null(0)).sort("partition", nulls_last=True)


def pending_reasons(jobs: pl.DataFrame) -> pl.DataFrame:
    """Pending jobs by reason (Resources, Priority, Dependency, BeginTime, ...), with the GPUs they ask for."""
    p = jobs.filter(pl.col("state") == "PENDING")
    return (p.group_by(pl.col("state_reason").fill_null("unknown").alias("reason"))
            .agg(pl.len().alias("jobs"), pl.col("gpus").fill_null(0).sum().alias("gpus_requested")).sort("jobs", "reason", descending=[True, False]))


def allocated_gpu_seconds(jobs: pl.DataFrame, start: dt.datetime | str, end: dt.datetime | str, now: dt.datetime | None = None) -> pl.DataFrame:
    """GPU-seconds each job held inside ``[start, end)``: GPUs × the overlap of its run with the period.
    A running job runs until ``now`` (or the period's end). Jobs without a GPU count or start are left out.
    ``start`` and ``end`` may name columns of ``jobs`` instead: each row's own period (a job cut into buckets)."""
    require_columns(jobs, "sched_job", ("job_id", "gpus", "start_at", "end_at"))
    utc = pl.Datetime("us", "UTC")
    lo = pl.col(start) if isinstance(start, str) else pl.lit(start).cast(utc)
    hi = pl.col(end) if isinstance(end, str) else pl.lit(end).cast(utc)
    running_to = pl.min_horizontal(pl.lit(now).cast(utc), hi) if now else hi
    run_end = pl.col("end_at").fill_null(running_to)
    s = pl.max_horizontal(pl.col("start_at"), lo)
    e = pl.min_horizontal(run_end, hi)
    return (jobs.filter(pl.col("gpus").is_not_null() & pl.col("start_at").is_not_null() & (pl.col("gpus") > 0))
            .with_columns(s.alias("_s"), e.alias("_e"))
            .with_columns((pl.when(pl.col("_e") > pl.col("_s")).then((pl.col("_e") - pl.col("_s")).dt.total_microseconds() / 1e6).otherwise(0.0)
                           * pl.col("gpus")).alias("gpu_s"))
            .filter(pl.col("gpu_s") > 0).drop("_s", "_e"))

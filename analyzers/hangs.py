"""Hung jobs: a job whose steps stop while it still holds its GPUs.

A hang is the costliest failure of a large synchronous job: one rank blocked in a collective (a dead NIC, a
stuck kernel, a deadlock in the data loader) stops every other rank at its next collective, the job's GPUs
stay allocated and busy-waiting, and nothing crashes until the collective's timeout — ten minutes by default
for PyTorch's NCCL process group (``init_process_group(timeout=...)``, enforced by its watchdog), often raised
much higher so that large checkpoints do not trip it. The Llama 3 report ("The Llama 3 Herd of Models", 2024,
on 16k-GPU training reliability) and ByteDance's MegaScale (Jiang et al., NSDI 2024) both detect hangs from
progress signals rather than wait for the timeout.

The rule here is progress against the job's own pace: no step for ``k`` times its typical step time (and at
least ``min_stall_s``) while no terminal event (finished, failure, preemption) says it stopped on purpose or
crashed, which other analyses own. Pure: progress summaries in, findings out; the caller owns the clock.
"""

from __future__ import annotations

import json
from datetime import datetime

import polars as pl

from fleetscope.core.frames import findings_frame, require_columns

PROGRESS_SCHEMA = {"job_id": pl.String, "last_progress_ts": pl.Datetime("us", "UTC"), "first_progress_ts": pl.Datetime("us", "UTC"),
                   "steps": pl.Int64, "stopped_ts": pl.Datetime("us", "UTC"), "gpus": pl.Int64}
"""Per job: its last and first step time over the span read, distinct steps seen, the time of its last
terminal event (null if none) and the GPUs it holds (null when unknown)."""


def typical_step_s(progress: pl.DataFrame) -> pl.Expr:
    """The mean step period over the span read: (last − first) / (steps − 1); null with fewer than 2 steps."""
    span_s = (pl.col("last_progress_ts") - pl.col("first_progress_ts")).dt.total_microseconds() / 1e6
    return pl.when(pl.col("steps") >= 2).then(span_s / (pl.col("steps") - 1)).otherwise(None)


def hang_findings(progress: pl.DataFrame, *, now: datetime, k: float = 10.0, min_stall_s: float = 300.0) -> pl.DataFrame:
    """``job_hang`` findings (critical) for jobs stalled past ``max(k × typical step, min_stall_s)``. The
    finding's ``window_start`` is the last step seen, so re-running during the same stall updates it."""
    require_columns(progress, "job_progress", tuple(PROGRESS_SCHEMA))
    if progress.height == 0:
        return findings_frame([])
    p = progress.with_columns(typical_step_s(progress).alias("typical_step_s")).with_columns(
        ((pl.lit(now) - pl.col("last_progress_ts")).dt.total_microseconds() / 1e6).alias("stalled_s"),
        pl.max_horizontal(pl.col("typical_step_s") * k, pl.lit(min_stall_s)).alias("limit_s"))
    stopped = pl.col("stopped_ts").is_not_null() & (pl.col("stopped_ts") >= pl.col("last_progress_ts"))
    hung = p.filter(pl.col("typical_step_s").is_not_null() & ~stopped & (pl.col("stalled_s") > pl.col("limit_s"))
                    & pl.col("gpus").fill_null(1).gt(0))
    rows = []
    for r in hung.sort("job_id").to_dicts():
        gpus = f"{r['gpus']} GPUs" if r["gpus"] is not None else "its GPUs"
        rows.append({
            "analyzer": "hangs", "kind": "job_hang", "subject": f"job:{r['job_id']}",
            "window_start": r["last_progress_ts"], "window_end": now, "severity": "critical", "score": float(r["stalled_s"]),
            "summary": f"Job {r['job_id']} has made no step for {r['stalled_s']:.0f} s ({r['stalled_s'] / r['typical_step_s']:.0f}× its "
                       f"{r['typical_step_s']:.3g} s step) while holding {gpus}: suspect a hang in a collective.",
            "evidence": json.dumps({"last_step_at": r["last_progress_ts"], "typical_step_s": r["typical_step_s"], "stalled_s": r["stalled_s"],
                                    "limit_s": r["limit_s"], "steps_seen": r["steps"], "gpus": r["gpus"]}, default=str, sort_keys=True),
        })
    return findings_frame(rows)

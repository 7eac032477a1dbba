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

PyTorch's watchdog is direct evidence: ``[Rank R] Watchdog caught collective operation timeout`` means a
collective on that rank ran past its timeout (``nccl_watchdog_timeout`` health events, ``ingest.nccl_log``).
A job with such a timeout on one of its ranks' hosts after its last step cannot be making progress, so it
is reported at once, without waiting for ``k`` step times: the timeout already waited (ten minutes by
default), longer than any step the job took. The timeouts go into the finding's evidence either way.
"""

from __future__ import annotations

import json
from datetime import datetime

import polars as pl

from fleetscope.core.frames import findings_frame, require_columns

WATCHDOG_SCHEMA = {"job_id": pl.String, "ts": pl.Datetime("us", "UTC"), "host": pl.String, "rank": pl.Int64, "message": pl.String}
"""Watchdog timeouts attributed to a job: when, where (host), the rank that logged it, its message."""
_JOB_IN_MESSAGE = r"^job (\S+): "

PROGRESS_SCHEMA = {"job_id": pl.String, "last_progress_ts": pl.Datetime("us", "UTC"), "first_progress_ts": pl.Datetime("us", "UTC"),
                   "steps": pl.Int64, "stopped_ts": pl.Datetime("us", "UTC"), "gpus": pl.Int64}
"""Per job: its last and first step time over the span read, distinct steps seen, the time of its last
terminal event (null if none) and the GPUs it holds (null when unknown)."""


def typical_step_s(progress: pl.DataFrame) -> pl.Expr:
    """The mean step period over the span read: (last − first) / (steps − 1); null with fewer than 2 steps."""
    span_s = (pl.col("last_progress_ts") - pl.col("first_progress_ts")).dt.total_microseconds() / 1e6
    return pl.when(pl.col("steps") >= 2).then(span_s / (pl.col("steps") - 1)).otherwise(None)


def watchdog_by_job(events: pl.DataFrame, ranks: pl.DataFrame) -> pl.DataFrame:
    """``nccl_watchdog_timeout`` health events (ts, host, code = the rank, message "job <id>: ...") as
    ``WATCHDOG_SCHEMA`` rows: the job the log named, else every job with a rank on the event's host at the
    time (``ranks``: job_rank rows job_id, host, start, end; end null while held)."""
    require_columns(events, "health_event", ("ts", "host", "kind", "code", "message"))
    w = events.filter(pl.col("kind") == "nccl_watchdog_timeout").select(
        "ts", pl.col("host").fill_null(""), pl.col("code").cast(pl.Int64).alias("rank"), pl.col("message").fill_null(""))
    if w.height == 0:
        return pl.DataFrame(schema=WATCHDOG_SCHEMA)
    w = w.with_columns(pl.col("message").str.extract(_JOB_IN_MESSAGE).alias("named"))
    named = w.filter(pl.col("named").is_not_null() & (pl.col("named") != "unknown")).rename({"named": "job_id"})
    rest = w.filter(pl.col("named").is_null() | (pl.col("named") == "unknown")).drop("named").filter(pl.col("host") != "")
    out = [named.select(list(WATCHDOG_SCHEMA))]
    if rest.height and ranks.height:
        require_columns(ranks, "job_rank", ("job_id", "host", "start", "end"))
        held = ranks.select("job_id", "host", "start", "end").drop_nulls("host")
        on_host = rest.join(held, on="host", how="inner").filter(
            (pl.col("start") <= pl.col("ts")) & (pl.col("end").is_null() | (pl.col("end") > pl.col("ts"))))
        out.append(on_host.select(list(WATCHDOG_SCHEMA)))
    return pl.concat(out).unique(["job_id", "ts", "host", "rank"]).sort("job_id", "ts", "rank").cast(WATCHDOG_SCHEMA)  # type: ignore[arg-type]


def hang_findings(progress: pl.DataFrame, *, now: datetime, k: float = 10.0, min_stall_s: float = 300.0,
                  watchdog: pl.DataFrame | None = None) -> pl.DataFrame:
    """``job_hang`` findings (critical) for jobs stalled past ``max(k × typical step, min_stall_s)``, or
    with a watchdog timeout (``watchdog_by_job`` rows) logged after their last step. The finding's
    ``window_start`` is the last step seen, so re-running during the same stall updates it; its evidence
    lists the stall's watchdog timeouts and ``detected_by`` (``stall`` or ``watchdog``)."""
    require_columns(progress, "job_progress", tuple(PROGRESS_SCHEMA))
    if progress.height == 0:
        return findings_frame([])
    p = progress.with_columns(typical_step_s(progress).alias("typical_step_s")).with_columns(
        ((pl.lit(now) - pl.col("last_progress_ts")).dt.total_microseconds() / 1e6).alias("stalled_s"),
        pl.max_horizontal(pl.col("typical_step_s") * k, pl.lit(min_stall_s)).alias("limit_s"))
    wd = pl.DataFrame(schema=WATCHDOG_SCHEMA) if watchdog is None else watchdog
    require_columns(wd, "watchdog", tuple(WATCHDOG_SCHEMA))
    # only timeouts during the stall: one before the last step was survived (the job went on)
    during = (wd.join(p.select("job_id", "last_progress_ts"), on="job_id", how="inner")
              .filter((pl.col("ts") > pl.col("last_progress_ts")) & (pl.col("ts") <= now))
              .sort("ts").group_by("job_id").agg(pl.struct("ts", "host", "rank", "message").head(20).alias("watchdog"),
                                                  pl.len().alias("watchdog_timeouts")))
    p = p.join(during, on="job_id", how="left").with_columns(pl.col("watchdog_timeouts").fill_null(0))
    stopped = pl.col("stopped_ts").is_not_null() & (pl.col("stopped_ts") >= pl.col("last_progress_ts"))
    by_stall = pl.col("typical_step_s").is_not_null() & (pl.col("stalled_s") > pl.col("limit_s"))
    hung = p.filter((by_stall | (pl.col("watchdog_timeouts") > 0)) & ~stopped & pl.col("gpus").fill_null(1).gt(0))
    rows = []
    for r in hung.sort("job_id").to_dicts():
        gpus = f"{r['gpus']} GPUs" if r["gpus"] is not None else "its GPUs"
        pace = (f" ({r['stalled_s'] / r['typical_step_s']:.0f}× its {r['typical_step_s']:.3g} s step)" if r["typical_step_s"] else "")
        stall_hit = r["typical_step_s"] is not None and r["stalled_s"] > r["limit_s"]
        wd_rows = r["watchdog"] or []
        why = (f"; {r['watchdog_timeouts']} NCCL watchdog timeout(s) since, first rank {wd_rows[0]['rank']} on "
               f"{wd_rows[0]['host'] or 'an unnamed host'}" if wd_rows else "")
        rows.append({
            "analyzer": "hangs", "kind": "job_hang", "subject": f"job:{r['job_id']}",
            "window_start": r["last_progress_ts"], "window_end": now, "severity": "critical", "score": float(r["stalled_s"]),
            "summary": f"Job {r['job_id']} has made no step for {r['stalled_s']:.0f} s{pace} while holding {gpus}{why}: "
                       f"suspect a hang in a collective.",
            "evidence": json.dumps({"last_step_at": r["last_progress_ts"], "typical_step_s": r["typical_step_s"], "stalled_s": r["stalled_s"],
                                    "limit_s": r["limit_s"], "steps_seen": r["steps"], "gpus": r["gpus"],
                                    "watchdog_timeouts": r["watchdog_timeouts"], "watchdog": wd_rows,
                                    "detected_by": "stall" if stall_hit else "watchdog"}, default=str, sort_keys=True),
        })
    return findings_frame(rows)

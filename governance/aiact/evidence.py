"""Evidence the rules read, computed from frames Fleetscope already holds. Pure: frames in, records out;
the service layer reads the tables and passes them here.

- ``threshold_crossing``: when cumulative measured training compute first exceeded a threshold (Art. 52(1)
  counts its two weeks from then);
- ``robustness``: SDC suspicions and failures of the model's jobs (Art. 15(4));
- ``logging_evidence``: the retention setting and the oldest log record held (Art. 12, 19(1), 26(6)).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime

import polars as pl

from governance.aiact.frames import declarations_from_frame, fairness_records
from governance.aiact.model import (
    AuditPolicy,
    ComputeEvidence,
    Evidence,
    LineageEvidence,
    LoggingEvidence,
    MonitoringEvidence,
    RobustnessEvidence,
    current,
    parse_time,
    utc,
)
from governance.lineage import Taint
from governance.registry import ModelEntry

SDC_KIND = "sdc"
SDC_RESOLVED_KIND = "sdc_resolved"
"""``health_event`` kinds: a suspicion of silent data corruption on a GPU, and the all-clear for it (a
later ``sdc_resolved`` event on the same GPU, e.g. after a passed DCGM diagnostic or replacement)."""


def model_job_ids(job: pl.DataFrame, model_name: str, kinds: Iterable[str] | None = None) -> list[str]:
    """Job ids of ``model_name`` in the job inventory (all kinds, or only ``kinds``)."""
    f = pl.col("model_name") == model_name
    if kinds is not None:
        f = f & pl.col("kind").is_in(list(kinds))
    return job.filter(f)["job_id"].to_list()


def threshold_crossing(step: pl.DataFrame, job_ids: Iterable[str], threshold: float = 1e25) -> datetime | None:
    """The end of the first step after which the model's cumulative ``model_flops`` exceed ``threshold``
    (each step counted once: the last re-run of a (job, rank, step) counts, ranks summed, as
    ``analyzers.carbon.model_footprint`` does), or None when they never do."""
    ids = list(job_ids)
    st = step.filter(pl.col("job_id").is_in(ids) & pl.col("model_flops").is_not_null())
    if st.height == 0:
        return None
    last = st.sort("start").group_by("job_id", "rank", "step").agg(pl.col("model_flops").last(), pl.col("end").last())
    per_step = last.group_by("job_id", "step").agg(pl.col("model_flops").sum(), pl.col("end").max()).sort("end")
    cum = per_step.with_columns(pl.col("model_flops").cum_sum().alias("cum"))
    over = cum.filter(pl.col("cum") > threshold)
    return utc(over["end"][0]) if over.height else None


def robustness(health_event: pl.DataFrame, job_event: pl.DataFrame, job_rank: pl.DataFrame, job_ids: Iterable[str],
               window_start: datetime, window_end: datetime, *, as_of: datetime | None = None) -> RobustnessEvidence:
    """Failures (``job_event`` kind ``failure``) of the model's jobs and SDC suspicions on the GPUs their
    ranks held while they held them, within the window. A suspicion is resolved by a later
    ``sdc_resolved`` event on the same GPU."""
    ids = list(job_ids)
    lo, hi = utc(window_start), utc(window_end)
    fails = job_event.filter(pl.col("job_id").is_in(ids) & (pl.col("kind") == "failure") & pl.col("ts").is_between(lo, hi))
    ranks = job_rank.filter(pl.col("job_id").is_in(ids))
    sdc = health_event.filter((pl.col("kind") == SDC_KIND) & pl.col("ts").is_between(lo, hi))
    hit = sdc.join(ranks.select("gpu_uuid", "start", "end"), on="gpu_uuid", how="inner").filter(
        (pl.col("ts") >= pl.col("start")) & (pl.col("end").is_null() | (pl.col("ts") <= pl.col("end")))
    ).select("ts", "gpu_uuid").unique()
    cleared = health_event.filter(pl.col("kind") == SDC_RESOLVED_KIND).group_by("gpu_uuid").agg(pl.col("ts").max().alias("cleared"))
    unresolved = hit.join(cleared, on="gpu_uuid", how="left").filter(pl.col("cleared").is_null() | (pl.col("cleared") < pl.col("ts")))
    return RobustnessEvidence(lo, hi, len(set(ids)), fails.height, hit.height, unresolved.height, as_of or hi)


def logging_evidence(*, retention_days: int | None, oldest_record_at: datetime | None, declared: Mapping[str, object] | None = None,
                     as_of: datetime | None = None, source: str = "") -> LoggingEvidence:
    """From the store's retention setting (``Settings.retention_days``), the oldest record of the system's
    event logs the store holds, and the ``logging`` declaration (enabled, in_service_since)."""
    enabled = declared.get("enabled") if declared else None
    since = parse_time(declared.get("in_service_since")) if declared else None
    return LoggingEvidence(enabled if isinstance(enabled, bool) else None, retention_days,
                           utc(oldest_record_at) if oldest_record_at else None, since, as_of, source)


def evidence_from_frames(
    model: ModelEntry,
    *,
    declaration: pl.DataFrame,
    fairness_evaluation: pl.DataFrame,
    fairness_group: pl.DataFrame,
    taints: Iterable[Taint] | None,
    training_runs_seen: int,
    retention_days: int | None,
    oldest_log_record_at: datetime | None,
    compute: ComputeEvidence | None,
    robustness: RobustnessEvidence | None,
    as_of: datetime,
    policy: AuditPolicy | None = None,
    monitoring: MonitoringEvidence | None = None,
) -> Evidence:
    """One model's ``Evidence`` from the stored tables and the computed parts: what the service calls per
    model before ``governance.aiact.evaluate``. ``taints``: ``governance.lineage.propagate(...)[model.node_id]``
    (None when lineage was not consulted); ``training_runs_seen``: how many of the model's training runs
    appear in lineage; ``oldest_log_record_at``: the oldest event-log row the store still holds for it."""
    decls = tuple(declarations_from_frame(declaration))
    logging_decl = current(decls, model, as_of=as_of).get(("logging", ""))
    return Evidence(
        model,
        decls,
        tuple(fairness_records(fairness_evaluation, fairness_group, model.name, model.version)),
        None if taints is None else LineageEvidence(training_runs_seen, tuple(taints), as_of),
        logging_evidence(retention_days=retention_days, oldest_record_at=oldest_log_record_at,
                         declared=logging_decl.value if logging_decl else None, as_of=as_of, source="store"),
        compute,
        robustness,
        policy or AuditPolicy(),
        monitoring,
    )

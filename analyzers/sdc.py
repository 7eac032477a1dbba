"""Silent data corruption (SDC): cross-replica checksums, loss / grad-norm spikes, NaN/Inf onset, the
rerun protocol, and a bit-exact known-answer matrix-multiply probe.

Signals and where they come from:

* **Cross-replica checksums.** Data-parallel replicas apply the same all-reduced gradients to the same
  parameters, so after each optimizer step every replica of a shard holds bit-identical parameters
  (given deterministic optimizer kernels). A job can log a per-rank ``param_checksum`` every N steps
  in its ``step`` events (docs/job_events.md); within a replica group the majority checksum is taken
  as right and a rank that disagrees is a suspect. A group with no unique most-common checksum (two
  replicas that disagree, or 2–2) is reported as a *tie*: the data cannot say who is wrong. This is the
  "replica comparison" SDC screen used in large runs (Meta, "The Llama 3 Herd of Models", 2024, §3.3.4;
  Google, "Gemini: a family of highly capable multimodal models", 2023, §3 — "SDC ... detected by
  deterministic replay and ... comparison").
* **Loss and gradient-norm spikes**, robust over a rolling window of the preceding steps: the score is
  (x − median) / (IQR / 1.349), i.e. a z-score whose centre and scale come from the median and
  inter-quartile range, so a few earlier spikes do not mask the next (Hampel-style filter).
  A spike on one rank while the others are calm points at that rank's hardware.
* **NaN/Inf onset**: the first step at which a job's loss or grad norm stops being finite, and on how
  many ranks. JSON has no NaN, so producers send ``"loss": null`` with a ``cause``; an explicit null,
  or a ``NaN``/``Infinity`` token from a non-strict writer, counts as non-finite.
* **Rerun protocol** (deterministic replay): re-run the suspect step on the same GPU; a different result
  means the fault was transient. If it reproduces, re-run on another GPU: a different result there
  (agreeing with the healthy replicas) means a persistent fault on the first GPU; the same result
  means the step itself is deterministic — software or data, not the GPU.
* **Known-answer test**: a matrix-multiply chain on small integers. Every product and every partial
  sum is an integer below 2**24, so float64, float32 and TF32 arithmetic are exact in *any* summation
  order: the result is bit-identical across BLAS builds, thread counts and GPUs, and one SHA-256 is the
  golden answer for all of them. A device that returns another digest computed something wrong.

The probe's arithmetic and its golden digests are ``analyzers.sdc_probe``'s; running it on a device is
``fleetscope.devices.probe.run_probe``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import polars as pl

from fleetscope.core.errors import ValidationError
from fleetscope.core.frames import FINDING, UTC_US, findings_frame, require_columns

__all__ = [
    "step_signals",
    "checksum_mismatches",
    "metric_spikes",
    "spike_rows",
    "nonfinite_onset",
    "RERUN_VERDICTS",
    "rerun_verdict",
    "rerun_verdicts",
    "rerun_case_id",
    "rerun_records",
    "rerun_runs",
    "rerun_findings",
    "rerun_report",
    "sdc_findings",
    "screen",
]



# --- signals from job events --------------------------------------------------------------------------


def _nonfinite_token(field: str) -> pl.Expr:
    return pl.col("payload").str.contains(rf'"{field}"\s*:\s*(?:null|NaN|-?Infinity)').fill_null(False)


def _number(field: str) -> pl.Expr:
    # A payload with a NaN token is not valid JSON; read the number by pattern, which works either way.
    return (pl.col("payload").str.extract(rf'"{field}"\s*:\s*(-?[0-9][0-9.eE+\-]*)', 1)
            .cast(pl.Float64, strict=False))


def step_signals(job_event: pl.DataFrame, replica_groups: pl.DataFrame | Mapping[int, str] | None = None) -> pl.DataFrame:
    """The per-rank step signals SDC screening reads, from ``step`` job events.

    Columns: job_id, rank, step, ts, loss, grad_norm (null when absent or non-finite), loss_nonfinite,
    grad_norm_nonfinite, param_checksum (text; integers as their decimal form), replica_group.

    ``replica_groups``: which ranks hold the same parameters — a frame (job_id optional, rank,
    replica_group) or a mapping rank → group. Without it a ``replica_group`` payload field is used,
    and without that every rank of a job is one group (pure data parallelism).
    """
    require_columns(job_event, "job_event", ("job_id", "ts", "kind", "rank", "step", "payload"))
    ev = job_event.filter((pl.col("kind") == "step") & (pl.col("rank") >= 0))
    if ev.filter(pl.col("step").is_null()).height:
        raise ValidationError("step event without a step number", frame="job_event", field="step")
    checksum = pl.col("payload").str.extract(r'"param_checksum"\s*:\s*("(?:[^"\\]|\\.)*"|-?[0-9]+)', 1).str.strip_chars('"')
    group = pl.col("payload").str.extract(r'"replica_group"\s*:\s*("(?:[^"\\]|\\.)*"|-?[0-9]+)', 1).str.strip_chars('"')
    out = ev.select(
        "job_id", "rank", "step", "ts",
        pl.when(~_nonfinite_token("loss")).then(_number("loss")).alias("loss"),
        pl.when(~_nonfinite_token("grad_norm")).then(_number("grad_norm")).alias("grad_norm"),
        _nonfinite_token("loss").alias("loss_nonfinite"),
        _nonfinite_token("grad_norm").alias("grad_norm_nonfinite"),
        checksum.alias("param_checksum"),
        group.fill_null("all").alias("replica_group"),
    )
    if replica_groups is not None:
        if isinstance(replica_groups, Mapping):
            rg = pl.DataFrame({"rank": [int(k) for k in replica_groups], "_g": [str(v) for v in replica_groups.values()]},
                              schema={"rank": pl.Int64, "_g": pl.String})
            on = ["rank"]
        else:
            require_columns(replica_groups, "replica_groups", ("rank", "replica_group"))
            on = ["job_id", "rank"] if "job_id" in replica_groups.columns else ["rank"]
            rg = replica_groups.select(*on, pl.col("replica_group").cast(pl.String).alias("_g"))
        out = out.join(rg, on=on, how="left").with_columns(pl.coalesce("_g", "replica_group").alias("replica_group")).drop("_g")
    return out.sort("job_id", "step", "rank")


def checksum_mismatches(signals: pl.DataFrame) -> pl.DataFrame:
    """Ranks whose parameter checksum disagrees with their replica group at a step (``step_signals`` output).

    One row per rank involved in a disagreement: ``verdict`` is ``suspect`` (differs from the group's
    unique most common checksum) or ``tie`` (no unique most common checksum: every rank of the group is
    listed, nobody is blamed). ``strict_majority`` says whether the winning checksum was held by more
    than half the group. Groups that agree produce no rows.
    """
    require_columns(signals, "signals", ("job_id", "step", "rank", "param_checksum", "replica_group"))
    cs = signals.filter(pl.col("param_checksum").is_not_null())
    keys = ["job_id", "step", "replica_group"]
    counts = cs.group_by(*keys, "param_checksum").agg(pl.len().alias("n"))
    summary = counts.group_by(keys).agg(
        pl.col("n").sum().alias("group_size"),
        pl.col("n").max().alias("agreeing"),
        pl.len().alias("distinct_checksums"),
        (pl.col("n") == pl.col("n").max()).sum().alias("_n_top"),
        pl.col("param_checksum").filter(pl.col("n") == pl.col("n").max()).first().alias("_top"),
    ).filter(pl.col("distinct_checksums") > 1)
    summary = summary.with_columns(
        pl.when(pl.col("_n_top") == 1).then(pl.col("_top")).otherwise(None).alias("majority_checksum"),
        (pl.col("agreeing") * 2 > pl.col("group_size")).and_(pl.col("_n_top") == 1).alias("strict_majority"),
    ).drop("_n_top", "_top")
    out = cs.join(summary, on=keys, how="inner").with_columns(
        pl.when(pl.col("majority_checksum").is_null()).then(pl.lit("tie"))
        .when(pl.col("param_checksum") != pl.col("majority_checksum")).then(pl.lit("suspect"))
        .otherwise(None).alias("verdict")
    ).filter(pl.col("verdict").is_not_null())
    return out.select("job_id", "step", "replica_group", "rank", "param_checksum", "verdict", "majority_checksum",
                      "strict_majority", "group_size", "agreeing", "distinct_checksums").sort("job_id", "step", "rank")


def metric_spikes(signals: pl.DataFrame, metric: str = "loss", *, window_steps: int = 50, min_history: int = 10,
                  threshold: float = 6.0) -> pl.DataFrame:
    """Upward spikes of ``metric`` (``loss`` or ``grad_norm``) per job and rank, robust over the
    preceding ``window_steps`` steps (the current step is not part of its own baseline).

    Score = (x − rolling median) / (rolling IQR / 1.349); a spike scores above ``threshold``. The IQR
    floor is 1e-6 × |median| so a perfectly flat history does not divide by zero. Each spike carries
    how many ranks of the job spiked at that step and how many reported, and ``single_rank`` when it was
    the only one (a rank-local cause; a job-wide spike is usually the data or the optimiser).
    """
    if metric not in ("loss", "grad_norm"):
        raise ValueError(f"metric must be 'loss' or 'grad_norm', not {metric!r}")
    if window_steps < 3 or min_history < 3 or min_history > window_steps:
        raise ValueError("need 3 <= min_history <= window_steps")
    require_columns(signals, "signals", ("job_id", "rank", "step", metric))
    x = pl.col(metric)
    roll = dict(window_size=window_steps, min_samples=min_history)
    s = signals.filter(x.is_not_null()).sort("job_id", "rank", "step").with_columns(
        x.rolling_median(**roll).shift(1).over("job_id", "rank").alias("baseline"),
        (x.rolling_quantile(0.75, **roll) - x.rolling_quantile(0.25, **roll)).shift(1).over("job_id", "rank").alias("_iqr"),
    )
    return spike_rows(s, metric, threshold=threshold)


def spike_rows(s: pl.DataFrame, metric: str, *, threshold: float = 6.0) -> pl.DataFrame:
    """``metric_spikes``' rows from its rows with their ``baseline`` and ``_iqr`` (the rolling median and
    interquartile range of the rank's previous values, null where there are too few): the scores, the spikes
    and how many ranks spiked and reported at each step (of ``s``'s rows; ``analyzers.sdc_fold`` passes whole
    steps only)."""
    x = pl.col(metric)
    s = s.with_columns(
        pl.max_horizontal(pl.col("_iqr") / 1.349, pl.col("baseline").abs() * 1e-6, pl.lit(1e-12)).alias("robust_scale"),
    ).with_columns(((x - pl.col("baseline")) / pl.col("robust_scale")).alias("score"))
    reporting = s.group_by("job_id", "step").agg(pl.len().alias("ranks_reporting"))
    spikes = s.filter(pl.col("score") > threshold)
    per_step = spikes.group_by("job_id", "step").agg(pl.len().alias("ranks_spiking"))
    out = spikes.join(per_step, on=["job_id", "step"]).join(reporting, on=["job_id", "step"]).with_columns(
        pl.lit(metric).alias("metric"),
        ((pl.col("ranks_spiking") == 1) & (pl.col("ranks_reporting") > 1)).alias("single_rank"),
    )
    return out.select("job_id", "rank", "step", "ts", "metric", pl.col(metric).alias("value"), "baseline", "robust_scale",
                      "score", "ranks_spiking", "ranks_reporting", "single_rank").sort("job_id", "step", "rank")


def nonfinite_onset(signals: pl.DataFrame) -> pl.DataFrame:
    """Per job, the first step where loss or grad norm is not finite, and on which ranks.

    ``pattern``: ``single_rank`` (one rank of several: suspect that rank's GPU), ``all_ranks`` (the job
    diverged: usually the model or data), ``some_ranks`` otherwise.
    """
    require_columns(signals, "signals", ("job_id", "rank", "step", "loss_nonfinite", "grad_norm_nonfinite"))
    s = signals.with_columns((pl.col("loss_nonfinite") | pl.col("grad_norm_nonfinite")).alias("_bad"))
    first = s.filter("_bad").group_by("job_id").agg(pl.col("step").min().alias("step"))
    at = s.join(first, on=["job_id", "step"]).group_by("job_id", "step").agg(
        pl.col("rank").filter("_bad").sort().alias("ranks_nonfinite"),
        pl.len().alias("ranks_reporting"),
        pl.col("ts").min().alias("ts"),
    )
    n_bad = pl.col("ranks_nonfinite").list.len()
    return at.with_columns(
        pl.when((n_bad == 1) & (pl.col("ranks_reporting") > 1)).then(pl.lit("single_rank"))
        .when(n_bad == pl.col("ranks_reporting")).then(pl.lit("all_ranks"))
        .otherwise(pl.lit("some_ranks")).alias("pattern")
    ).sort("job_id")


# --- rerun protocol -----------------------------------------------------------------------------------

RERUN_VERDICTS = ("no_fault", "transient", "persistent", "not_gpu", "inconclusive")


def rerun_verdict(original: str, same_gpu: Sequence[str] = (), other_gpu: Sequence[str] = (),
                  expected: str | None = None) -> tuple[str, str]:
    """Classify a suspect step from its replays: (verdict, reason).

    ``original``: the suspect GPU's result (a checksum or hash of the step's output); ``same_gpu``: results
    of re-running the step on that GPU; ``other_gpu``: results on other GPUs; ``expected``: the healthy
    replicas' result when known. Verdicts: ``no_fault`` (the original equals the expected answer),
    ``transient`` (a same-GPU replay differs from the original: the fault did not reproduce),
    ``persistent`` (reproduces on the suspect GPU, and other GPUs agree on a different answer),
    ``not_gpu`` (other GPUs reproduce the original: deterministic, so software or data),
    ``inconclusive`` (not enough replays, or the other GPUs disagree among themselves).
    """
    if expected is not None and original == expected:
        return "no_fault", "the suspect GPU's result equals the healthy replicas'"
    if any(r != original for r in same_gpu):
        return "transient", f"replay on the same GPU gave a different result ({len(same_gpu)} replay(s))"
    if other_gpu:
        others = set(other_gpu)
        if others == {original}:
            return "not_gpu", f"{len(other_gpu)} replay(s) on other GPUs reproduce the result: deterministic, not this GPU"
        if len(others) == 1:
            if not same_gpu:
                return "inconclusive", "other GPUs disagree with the original; replay on the same GPU to tell transient from persistent"
            agree = "" if expected is None else (" and match the healthy replicas" if other_gpu[0] == expected else
                                                 " but not the healthy replicas")
            return "persistent", f"reproduces on the suspect GPU ({len(same_gpu)}×); other GPUs agree on a different result{agree}"
        return "inconclusive", "replays on other GPUs disagree with each other"
    if same_gpu:
        return "inconclusive", "reproduces on the same GPU; replay on another GPU to tell a persistent fault from software"
    return "inconclusive", "no replays recorded"


def rerun_verdicts(reruns: pl.DataFrame) -> pl.DataFrame:
    """``rerun_verdict`` over recorded replays.

    ``reruns``: one row per run of a suspect step — ``case_id`` (one suspect step), ``suspect_gpu``,
    ``gpu_uuid`` (where this run ran), ``attempt`` (0 = the original run), ``result``; optional
    ``expected`` (the healthy replicas' result) and ``job_id`` / ``rank`` / ``step`` / ``ts`` (carried
    through from the original run).
    """
    require_columns(reruns, "reruns", ("case_id", "suspect_gpu", "gpu_uuid", "attempt", "result"))
    extra = [c for c in ("job_id", "rank", "step", "ts", "expected") if c in reruns.columns]
    rows = []
    for (case,), g in reruns.sort("case_id", "attempt").group_by(["case_id"], maintain_order=True):
        suspects = g.get_column("suspect_gpu").unique()
        if suspects.len() != 1:
            raise ValidationError(f"case {case!r} names {suspects.len()} suspect GPUs", frame="reruns", field="suspect_gpu")
        suspect = suspects[0]
        orig = g.filter(pl.col("attempt") == 0)
        if orig.height != 1:
            raise ValidationError(f"case {case!r} needs exactly one original run (attempt 0), has {orig.height}",
                                  frame="reruns", field="attempt")
        if orig["gpu_uuid"][0] != suspect:
            raise ValidationError(f"case {case!r}: the original run is not on the suspect GPU", frame="reruns", field="gpu_uuid")
        rep = g.filter(pl.col("attempt") > 0)
        same = rep.filter(pl.col("gpu_uuid") == suspect)["result"].to_list()
        other = rep.filter(pl.col("gpu_uuid") != suspect)["result"].to_list()
        expected = g["expected"].drop_nulls()[0] if "expected" in g.columns and g["expected"].drop_nulls().len() else None
        verdict, reason = rerun_verdict(orig["result"][0], same, other, expected)
        row = {"case_id": case, "suspect_gpu": suspect, "verdict": verdict, "reason": reason, "original_result": orig["result"][0],
               "same_gpu_results": same, "other_gpu_results": other, "other_gpus": rep.filter(pl.col("gpu_uuid") != suspect)["gpu_uuid"].to_list()}
        for c in extra:
            if c != "expected":
                row[c] = orig[c][0]
        rows.append(row)
    schema = {"case_id": pl.String, "suspect_gpu": pl.String, "verdict": pl.String, "reason": pl.String, "original_result": pl.String,
              "same_gpu_results": pl.List(pl.String), "other_gpu_results": pl.List(pl.String), "other_gpus": pl.List(pl.String)}
    for c in extra:
        if c != "expected":
            schema[c] = reruns.schema[c]
    return pl.DataFrame(rows, schema=schema)


RERUN_SEVERITY = {"persistent": "critical", "transient": "warning", "not_gpu": "info", "inconclusive": "info", "no_fault": "info"}
RERUN_SCORE = {"persistent": 1.0, "transient": 0.6, "not_gpu": 0.3, "inconclusive": 0.2, "no_fault": 0.0}
_RUNS_SCHEMA = {"case_id": pl.String, "job_id": pl.String, "step": pl.Int64, "rank": pl.Int64, "ts": UTC_US,
                "suspect_gpu": pl.String, "gpu_uuid": pl.String, "attempt": pl.Int64, "result": pl.String,
                "expected": pl.String, "source": pl.String, "expected_source": pl.String}
_PROBLEMS_SCHEMA = {"case_id": pl.String, "job_id": pl.String, "step": pl.Int64, "rank": pl.Int64, "problem": pl.String}


def rerun_case_id(job_id: str, step: int, rank: int) -> str:
    """One case of the rerun protocol is one suspect step on one rank of one job."""
    return f"{job_id}/step:{step}/rank:{rank}"


def rerun_records(job_event: pl.DataFrame) -> pl.DataFrame:
    """The ``sdc_rerun`` records of a job-event frame (docs/job_events.md), their payload fields as columns:
    job_id, ts, step, rank, suspect_gpu, gpu_uuid, result, attempt (null for a replay that gave none), expected."""
    require_columns(job_event, "job_event", ("job_id", "ts", "kind", "rank", "step", "payload"))
    rec = job_event.filter(pl.col("kind") == "sdc_rerun")
    field = pl.col("payload").str.json_path_match
    return rec.select(
        "job_id", "ts", "step", "rank",
        field("$.suspect_gpu").alias("suspect_gpu"), field("$.gpu_uuid").alias("gpu_uuid"), field("$.result").alias("result"),
        field("$.attempt").cast(pl.Int64, strict=False).alias("attempt"), field("$.expected").alias("expected"),
    ).sort("job_id", "step", "rank", "ts")


def rerun_runs(records: pl.DataFrame, signals: pl.DataFrame | None = None,
               checksums: pl.DataFrame | None = None) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Assemble each case's runs for ``rerun_verdicts``: (runs, problems).

    The original run (attempt 0) is the case's ``attempt: 0`` record, else the suspect rank's
    ``param_checksum`` at that step (from ``signals``, ``step_signals`` output). The expected answer is a
    record's ``expected``, else — only when the original is that checksum, so that like is compared with
    like — the replica majority (``checksums``, ``checksum_mismatches`` output; a rank its group agreed
    with has its own checksum as the majority; a tie has none). Replays are numbered in time order.
    A case that cannot be judged (records naming different suspect GPUs, an original run on another GPU,
    conflicting originals or expected answers, no original result at all) goes to ``problems`` with the
    reason, and not to ``runs``.
    """
    require_columns(records, "rerun records", ("job_id", "ts", "step", "rank", "suspect_gpu", "gpu_uuid", "result", "attempt", "expected"))
    own: dict[tuple[str, int, int], tuple[str, Any]] = {}
    # Only the (job, step, rank) of a rerun record is looked up: a job reporting every rank's step has
    # ~10⁵ signals an hour and, most of the time, no rerun records at all.
    cases = records.select("job_id", "step", "rank").unique()

    def of_cases(frame: pl.DataFrame) -> pl.DataFrame:
        keys = cases.cast({c: frame.schema[c] for c in cases.columns})
        return (frame.with_row_index("_at").join(keys, on=cases.columns, how="semi", nulls_equal=True).sort("_at").drop("_at")
                if frame.height else frame)

    if signals is not None and signals.height:
        require_columns(signals, "signals", ("job_id", "step", "rank", "ts", "param_checksum"))
        signals = of_cases(signals)
    if checksums is not None and checksums.height:
        require_columns(checksums, "checksums", ("job_id", "step", "rank", "majority_checksum"))
        checksums = of_cases(checksums)
    if signals is not None and signals.height:
        require_columns(signals, "signals", ("job_id", "step", "rank", "ts", "param_checksum"))
        for j, st, r, ts, cs in signals.filter(pl.col("param_checksum").is_not_null()).select("job_id", "step", "rank", "ts", "param_checksum").iter_rows():
            own.setdefault((j, st, r), (cs, ts))
    disputed: dict[tuple[str, int, int], str | None] = {}
    if checksums is not None and checksums.height:
        require_columns(checksums, "checksums", ("job_id", "step", "rank", "majority_checksum"))
        for j, st, r, maj in checksums.select("job_id", "step", "rank", "majority_checksum").iter_rows():
            disputed[(j, st, r)] = maj
    runs: list[dict[str, Any]] = []
    problems: list[dict[str, Any]] = []
    for (job, step, rank), g in records.sort("ts").group_by(["job_id", "step", "rank"], maintain_order=True):
        case = rerun_case_id(job, step, rank)
        where = {"case_id": case, "job_id": job, "step": step, "rank": rank}

        def problem(why: str) -> None:
            problems.append({**where, "problem": why})

        suspects = g["suspect_gpu"].unique().to_list()
        if len(suspects) != 1:
            problem(f"records name {len(suspects)} different suspect GPUs ({', '.join(sorted(map(str, suspects)))})")
            continue
        suspect = suspects[0]
        originals = g.filter(pl.col("attempt") == 0)
        replays = g.filter(pl.col("attempt").is_null() | (pl.col("attempt") > 0))
        if originals.select("gpu_uuid", "result").unique().height > 1:
            problem("attempt-0 records disagree on the original run")
            continue
        expected_given = g["expected"].drop_nulls().unique().to_list()
        if len(expected_given) > 1:
            problem(f"records disagree on the expected result ({len(expected_given)} values)")
            continue
        if originals.height:
            o = originals.row(0, named=True)
            if o["gpu_uuid"] != suspect:
                problem(f"the original run (attempt 0) is on {o['gpu_uuid']}, not on the suspect GPU {suspect}")
                continue
            orig_result, orig_ts, source = o["result"], o["ts"], "sdc_rerun record (attempt 0)"
        elif (job, step, rank) in own:
            orig_result, orig_ts = own[(job, step, rank)]
            source = "step event param_checksum"
        else:
            problem(f"original result unknown: no attempt-0 record and no param_checksum for rank {rank} at step {step}")
            continue
        if expected_given:
            expected, expected_source = str(expected_given[0]), "sdc_rerun record"
        elif source.startswith("step event"):
            expected = disputed.get((job, step, rank), orig_result)
            expected_source = None if expected is None else "replica majority" if (job, step, rank) in disputed else "replicas agreed"
        else:
            expected, expected_source = None, None
        base = {**where, "suspect_gpu": suspect, "expected": expected, "expected_source": expected_source}
        runs.append({**base, "ts": orig_ts, "gpu_uuid": suspect, "attempt": 0, "result": orig_result, "source": source})
        for i, r in enumerate(replays.iter_rows(named=True), start=1):
            runs.append({**base, "ts": r["ts"], "gpu_uuid": r["gpu_uuid"], "attempt": i, "result": r["result"], "source": "sdc_rerun record"})
    return (pl.DataFrame(runs, schema=_RUNS_SCHEMA) if runs else pl.DataFrame(schema=_RUNS_SCHEMA),
            pl.DataFrame(problems, schema=_PROBLEMS_SCHEMA) if problems else pl.DataFrame(schema=_PROBLEMS_SCHEMA))


def rerun_findings(verdicts: pl.DataFrame, runs: pl.DataFrame) -> pl.DataFrame:
    """One finding (kind ``sdc_rerun``, subject ``gpu:<suspect>``) per judged case, with the evidence chain:
    the step, the rank, every run (GPU, same GPU or not, result, time, where it came from), the expected
    answer and the verdict. Severity: critical for ``persistent``, warning for ``transient``, info otherwise."""
    require_columns(verdicts, "verdicts", ("case_id", "suspect_gpu", "verdict", "reason", "job_id", "step", "rank"))
    require_columns(runs, "runs", ("case_id", "ts", "gpu_uuid", "attempt", "result", "source", "expected", "expected_source"))
    rows = []
    for v in verdicts.to_dicts():
        g = runs.filter(pl.col("case_id") == v["case_id"]).sort("attempt")
        chain = [{"attempt": r["attempt"], "gpu_uuid": r["gpu_uuid"], "same_gpu": r["gpu_uuid"] == v["suspect_gpu"],
                  "result": r["result"], "ts": r["ts"], "source": r["source"]} for r in g.iter_rows(named=True)]
        gpus = list(dict.fromkeys(r["gpu_uuid"] for r in chain))
        evidence = {"case_id": v["case_id"], "job_id": v["job_id"], "step": v["step"], "rank": v["rank"],
                    "suspect_gpu": v["suspect_gpu"], "gpus": gpus, "runs": chain, "expected": g["expected"][0],
                    "expected_source": g["expected_source"][0], "verdict": v["verdict"], "reason": v["reason"]}
        rows.append({
            "analyzer": "sdc", "kind": "sdc_rerun", "subject": f"gpu:{v['suspect_gpu']}",
            "window_start": g["ts"].min(), "window_end": g["ts"].max(),
            "severity": RERUN_SEVERITY[v["verdict"]], "score": RERUN_SCORE[v["verdict"]],
            "summary": f"Rerun of job {v['job_id']} step {v['step']} (rank {v['rank']}, {v['suspect_gpu']}): {v['verdict']} — {v['reason']}.",
            "evidence": json.dumps(evidence, default=str, sort_keys=True),
        })
    return findings_frame(rows)


def rerun_report(job_event: pl.DataFrame, signals: pl.DataFrame | None = None,
                 checksums: pl.DataFrame | None = None) -> dict[str, pl.DataFrame]:
    """The rerun protocol end to end over a job-event frame: ``records``, ``runs``, ``problems``,
    ``verdicts`` (``rerun_verdicts``) and ``findings`` (``rerun_findings``)."""
    records = rerun_records(job_event)
    runs, problems = rerun_runs(records, signals, checksums)
    verdicts = rerun_verdicts(runs) if runs.height else pl.DataFrame()
    findings = rerun_findings(verdicts, runs) if runs.height else FINDING.empty()
    return {"records": records, "runs": runs, "problems": problems, "verdicts": verdicts, "findings": findings}


# --- findings -----------------------------------------------------------------------------------------


def sdc_findings(
    *,
    checksums: pl.DataFrame | None = None,
    spikes: pl.DataFrame | None = None,
    nonfinite: pl.DataFrame | None = None,
    reruns: pl.DataFrame | None = None,
    probes: pl.DataFrame | None = None,
    job_rank: pl.DataFrame | None = None,
    signals: pl.DataFrame | None = None,
) -> pl.DataFrame:
    """One finding per suspect, with the evidence chain: which signals fired, at which steps, against
    which replicas. Suspects are job ranks (``job:<id>/rank:<n>``, or ``gpu:<uuid>`` when ``job_rank``
    says which GPU the rank ran on) and GPUs named by reruns and probes.

    ``probes``: rows with ``gpu_uuid``, ``ts``, ``passed`` and ``digest`` (``sdc_probe.ProbeResult`` fields), as
    ingested health results. ``signals`` (``step_signals`` output) supplies step times for the window.
    Severity: ``critical`` for a persistent rerun verdict, a failed probe or a strict-majority checksum
    mismatch; ``warning`` otherwise. Ties and job-wide spikes name no suspect and make no finding.
    """
    chains: dict[str, dict[str, Any]] = {}

    def chain(subject: str) -> dict[str, Any]:
        return chains.setdefault(subject, {"signals": [], "critical": False, "ts": [], "job_rank": None})

    step_ts: dict[tuple[str, int], Any] = {}
    if signals is not None and signals.height:
        for j, st, ts in signals.group_by("job_id", "step").agg(pl.col("ts").min()).iter_rows():
            step_ts[(j, st)] = ts
    gpu_of = _gpu_lookup(job_rank)
    if reruns is not None and reruns.height and {"job_id", "rank"} <= set(reruns.columns):
        # a rerun record names the GPU the suspect rank ran on: its other signals join that GPU's chain
        for j, r, g in reruns.select("job_id", "rank", "suspect_gpu").unique().iter_rows():
            gpu_of.setdefault((j, r), g)

    def rank_subject(job: str, rank: int) -> str:
        g = gpu_of.get((job, rank))
        return f"gpu:{g}" if g else f"job:{job}/rank:{rank}"

    if checksums is not None:
        for r in checksums.filter(pl.col("verdict") == "suspect").to_dicts():
            c = chain(rank_subject(r["job_id"], r["rank"]))
            c["job_rank"] = (r["job_id"], r["rank"])
            c["signals"].append({"signal": "checksum_mismatch", "step": r["step"], "replica_group": r["replica_group"],
                                 "checksum": r["param_checksum"], "majority_checksum": r["majority_checksum"],
                                 "agreeing_replicas": r["agreeing"], "group_size": r["group_size"],
                                 "strict_majority": r["strict_majority"]})
            c["critical"] |= bool(r["strict_majority"])
            c["ts"].append(step_ts.get((r["job_id"], r["step"])))
    if spikes is not None:
        for r in spikes.filter(pl.col("single_rank")).to_dicts():
            c = chain(rank_subject(r["job_id"], r["rank"]))
            c["job_rank"] = (r["job_id"], r["rank"])
            c["signals"].append({"signal": f"{r['metric']}_spike", "step": r["step"], "value": r["value"],
                                 "baseline": r["baseline"], "robust_z": round(r["score"], 2),
                                 "ranks_reporting": r["ranks_reporting"]})
            c["ts"].append(r["ts"])
    if nonfinite is not None:
        for r in nonfinite.filter(pl.col("pattern") == "single_rank").to_dicts():
            rank = r["ranks_nonfinite"][0]
            c = chain(rank_subject(r["job_id"], rank))
            c["job_rank"] = (r["job_id"], rank)
            c["signals"].append({"signal": "nonfinite_onset", "step": r["step"], "ranks_reporting": r["ranks_reporting"]})
            c["ts"].append(r["ts"])
    if reruns is not None:
        for r in reruns.filter(pl.col("verdict").is_in(["transient", "persistent"])).to_dicts():
            c = chain(f"gpu:{r['suspect_gpu']}")
            if r.get("job_id") is not None and r.get("rank") is not None:
                c["job_rank"] = (r["job_id"], r["rank"])
            c["signals"].append({"signal": f"rerun_{r['verdict']}", "case_id": r["case_id"], "reason": r["reason"],
                                 "step": r.get("step"), "other_gpus": r["other_gpus"]})
            c["critical"] |= r["verdict"] == "persistent"
            c["ts"].append(r.get("ts"))
    if probes is not None:
        require_columns(probes, "probes", ("gpu_uuid", "ts", "passed", "digest"))
        for r in probes.filter(pl.col("passed") == False).to_dicts():  # noqa: E712 (null = unknown, not failed)
            c = chain(f"gpu:{r['gpu_uuid']}")
            c["signals"].append({"signal": "probe_failed", "digest": r["digest"], "golden": r.get("golden"),
                                 "mismatched_elements": r.get("mismatched_elements"), "device_type": r.get("device_type")})
            c["critical"] = True
            c["ts"].append(r["ts"])

    rows = []
    for subject, c in chains.items():
        times = [t for t in c["ts"] if t is not None]
        if not times:
            continue  # a rerun verdict without a time joins a chain that has one
        names = sorted({s["signal"] for s in c["signals"]})
        steps = sorted({s["step"] for s in c["signals"] if s.get("step") is not None})
        evidence = {"signals": c["signals"], "job_rank": c["job_rank"]}
        n = len(c["signals"])
        rows.append({
            "analyzer": "sdc", "kind": "sdc_confirmed" if c["critical"] else "sdc_suspect", "subject": subject,
            "window_start": min(times), "window_end": max(times),
            "severity": "critical" if c["critical"] else "warning",
            # more independent signals, more confidence; critical evidence starts high
            "score": min(1.0, (0.6 if c["critical"] else 0.3) + 0.1 * (len(names) - 1) + 0.02 * (n - 1)),
            "summary": f"{subject}: silent data corruption {'confirmed' if c['critical'] else 'suspected'} from "
                       f"{', '.join(names)}" + (f" at step {steps[0]}" if len(steps) == 1 else
                                                f" at steps {steps[0]}–{steps[-1]}" if steps else "") + ".",
            "evidence": json.dumps(evidence, default=str, sort_keys=True),
        })
    return findings_frame(rows)


def _gpu_lookup(job_rank: pl.DataFrame | None) -> dict[tuple[str, int], str]:
    """(job, rank) → GPU, when the rank ran on exactly one GPU (a rank that moved is left as a rank)."""
    if job_rank is None or job_rank.height == 0:
        return {}
    require_columns(job_rank, "job_rank", ("job_id", "rank", "gpu_uuid"))
    one = job_rank.group_by("job_id", "rank").agg(pl.col("gpu_uuid").unique()).filter(pl.col("gpu_uuid").list.len() == 1)
    return {(j, r): g[0] for j, r, g in one.iter_rows()}


def screen(job_event: pl.DataFrame, job_rank: pl.DataFrame | None = None) -> dict[str, pl.DataFrame]:
    """Every SDC signal of a job-event frame and what follows from them: ``signals``, ``checksums``
    (mismatches and ties), ``spikes`` (loss), ``nonfinite``, the rerun protocol's ``records``, ``runs``,
    ``problems`` and ``verdicts``, and ``findings`` — one evidence chain per suspect (``sdc_findings``,
    rerun verdicts included) plus one ``sdc_rerun`` finding per judged case."""
    signals = step_signals(job_event)
    checksums = checksum_mismatches(signals)
    spikes = metric_spikes(signals, "loss")
    nonfinite = nonfinite_onset(signals)
    rr = rerun_report(job_event, signals, checksums)
    jr = job_rank if job_rank is not None and job_rank.height else None
    chains = sdc_findings(checksums=checksums, spikes=spikes, nonfinite=nonfinite, job_rank=jr, signals=signals,
                          reruns=rr["verdicts"] if rr["verdicts"].height else None)
    found = [f for f in (chains, rr["findings"]) if f.height]
    findings = pl.concat(found, how="vertical_relaxed") if found else FINDING.empty()
    return {"signals": signals, "checksums": checksums, "spikes": spikes, "nonfinite": nonfinite, **rr, "findings": findings}

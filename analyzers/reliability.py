"""Reliability: interruptions by root cause, MTBF, all-up availability, checkpoint-interval advice.

* Root-cause categories follow Table 5 of Meta's "The Llama 3 Herd of Models" (arXiv:2407.21783, 2024):
  419 unexpected interruptions in a 54-day snapshot of Llama 3 405B pre-training on 16,384 H100 GPUs,
  by root cause and component. ``LLAMA3_INTERRUPTIONS`` carries the published counts. Note the paper
  prints 30.1 % for "Faulty GPU" although 148/419 = 35.3 %; its other rows match count/419, and its
  printed percentages sum to 94.9 %, so the count is taken as right and shares are computed from counts.
* MTBF = exposure / failures (exponential failures, the model every formula below assumes). Per GPU-hour
  it is a fleet property; a job's MTBF is the GPU MTBF divided by the GPUs it needs.
* All-up availability of a job that needs all N parts: A^N (independent parts). 0.999^1000 ≈ 0.368 —
  the "reliability gap" of synchronous training at scale.
* Checkpoint interval: Young, "A first order approximation to the optimum checkpoint interval", CACM
  17(9), 1974: τ = √(2δM). Daly, "A higher order estimate of the optimum checkpoint interval for restart
  dumps", FGCS 22(3), 2006, eq. (37): τ = √(2δM)·[1 + (1/3)√(δ/(2M)) + (1/9)(δ/(2M))] − δ for δ < 2M,
  else τ = M. Expected wall time for solve time T_s under Daly's complete model (his eq. 13):
  T_w = M·e^{R/M}·(e^{(τ+δ)/M} − 1)·T_s/τ, with restart cost R; the fraction of wall time lost is
  1 − T_s/T_w.

Pure: polars frames and floats in, polars frames and floats out.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from datetime import datetime

import polars as pl

from fleetscope.core.frames import JOB_RECORD_KINDS, findings_frame, require_columns

__all__ = [
    "LLAMA3_INTERRUPTIONS",
    "CATEGORIES",
    "categorize_cause",
    "interruptions",
    "root_cause_table",
    "mtbf_hours",
    "job_mtbf_hours",
    "job_exposure",
    "mtbf_table",
    "fleet_mtbf",
    "recovery_times",
    "steady_state_availability",
    "all_up_availability",
    "young_interval_s",
    "daly_interval_s",
    "expected_lost_fraction",
    "checkpoint_costs",
    "checkpoint_advice",
    "checkpoint_findings",
]

# (root cause, component, interruptions) — Llama 3 paper, Table 5, in the paper's order.
LLAMA3_INTERRUPTIONS: tuple[tuple[str, str, int], ...] = (
    ("Faulty GPU", "GPU", 148),
    ("GPU HBM3 Memory", "GPU", 72),
    ("Software Bug", "Dependency", 54),
    ("Network Switch/Cable", "Network", 35),
    ("Host Maintenance", "Unplanned Maintenance", 32),
    ("GPU SRAM Memory", "GPU", 19),
    ("GPU System Processor", "GPU", 17),
    ("NIC", "Host", 7),
    ("NCCL Watchdog Timeouts", "Unknown", 7),
    ("Silent Data Corruption", "GPU", 6),
    ("GPU Thermal Interface + Sensor", "GPU", 6),
    ("SSD", "Host", 3),
    ("Power Supply", "Host", 3),
    ("Server Chassis", "Host", 2),
    ("IO Expansion Board", "Host", 2),
    ("Dependency", "Dependency", 2),
    ("CPU", "Host", 2),
    ("System Memory", "Host", 2),
)
CATEGORIES: tuple[str, ...] = tuple(c for c, _, _ in LLAMA3_INTERRUPTIONS) + ("Other",)
_COMPONENT = {c: comp for c, comp, _ in LLAMA3_INTERRUPTIONS} | {"Other": "Unknown"}

# Xid → category. Memory errors are HBM unless the message says SRAM; GSP is the "GPU system processor";
# PCIe / NVLink / engine faults are "Faulty GPU" (the paper counts NVLink failures there).
_XID_CATEGORY: dict[int, str] = {
    **{c: "GPU HBM3 Memory" for c in (48, 63, 64, 92, 94, 95, 140, 156, 157)},
    **{c: "GPU System Processor" for c in (119, 120)},
    **{c: "Faulty GPU" for c in (46, 54, 62, 74, 79, 109, 110, 136, 143, 144, 145, 146, 147, 148, 149, 150, 158)},
    **{c: "Software Bug" for c in (13, 31, 43, 45, 69)},
}

# Keyword rules over a free-text cause (docs/job_events.md: ``cause`` such as xid_79, oom, nccl_timeout),
# first match wins, so specific causes come before general ones.
_RULES: tuple[tuple[str, str], ...] = (
    (r"\bsdc\b|silent.?data|checksum", "Silent Data Corruption"),
    (r"sram", "GPU SRAM Memory"),
    (r"hbm|\becc\b|dbe|row.?remap|uncorrectable|page.?retire", "GPU HBM3 Memory"),
    (r"\bgsp\b|system.?processor", "GPU System Processor"),
    (r"thermal|overheat|temperature|sensor", "GPU Thermal Interface + Sensor"),
    (r"nccl.*(timeout|watchdog)|watchdog|collective.?timeout", "NCCL Watchdog Timeouts"),
    (r"\bnic\b|\bhca\b|mlx|infiniband.?(card|adapter)|\befa\b", "NIC"),
    (r"switch|cable|link.?down|network|infiniband|\bib\b|transceiver|optic", "Network Switch/Cable"),
    (r"maintenance|drain|reboot|kernel.?upgrade|firmware.?update", "Host Maintenance"),
    (r"\bssd\b|nvme|disk", "SSD"),
    (r"\bpsu\b|power.?supply", "Power Supply"),
    (r"chassis|\bbmc\b|fan", "Server Chassis"),
    (r"io.?expansion|riser|pcie.?switch|retimer", "IO Expansion Board"),
    (r"\bcpu\b|mce|machine.?check", "CPU"),
    (r"dimm|system.?memory|host.?memory", "System Memory"),
    (r"storage|filesystem|\bnfs\b|lustre|object.?store|dependency|scheduler|slurm|kubernetes", "Dependency"),
    (r"\boom\b|out.?of.?memory|bug|exception|segfault|assert|traceback|software|python|cuda.?error", "Software Bug"),
    (r"xid|gpu|fell.?off|fallen.?off", "Faulty GPU"),
)
_RULES_C = tuple((re.compile(p, re.IGNORECASE), c) for p, c in _RULES)
_XID_IN_CAUSE = re.compile(r"xid[\s_:-]*(\d{1,3})", re.IGNORECASE)


def categorize_cause(cause: str | None) -> str:
    """The Llama 3 root-cause category of a failure cause string (``xid_79``, ``nccl_timeout``, ``hbm dbe``, ...).

    An Xid number decides first (by component: memory Xids are HBM, GSP Xids the system processor); then
    keyword rules; anything else is ``Other``.
    """
    if not cause:
        return "Other"
    if m := _XID_IN_CAUSE.search(cause):
        if (code := int(m.group(1))) in _XID_CATEGORY:
            if _XID_CATEGORY[code] == "GPU HBM3 Memory" and "sram" in cause.lower():
                return "GPU SRAM Memory"
            return _XID_CATEGORY[code]
    for rx, cat in _RULES_C:
        if rx.search(cause):
            return cat
    return "Other"



def interruptions(job_event: pl.DataFrame) -> pl.DataFrame:
    """Unexpected interruptions: ``failure`` events, one per job and instant (many ranks reporting the same
    crash are one interruption), with ``cause``, ``host`` and the Llama 3 ``category`` / ``component``.
    ``preempted`` events are planned and left out (the paper's table counts unexpected ones only)."""
    require_columns(job_event, "job_event", ("job_id", "ts", "kind", "payload"))
    f = job_event.filter(pl.col("kind") == "failure").with_columns(
        pl.col("payload").str.json_path_match("$.cause").alias("cause"),
        pl.col("payload").str.json_path_match("$.host").alias("host"),
    )
    f = f.sort("job_id", "ts").unique(["job_id", "ts"], keep="first", maintain_order=True)
    cats = [categorize_cause(c) for c in f.get_column("cause").to_list()]
    return f.select("job_id", "ts", *(["rank"] if "rank" in f.columns else []), "cause", "host").with_columns(
        pl.Series("category", cats, dtype=pl.String),
        pl.Series("component", [_COMPONENT[c] for c in cats], dtype=pl.String),
    )


def root_cause_table(events: pl.DataFrame | None = None) -> pl.DataFrame:
    """Interruptions per root cause with share and component, in the paper's order; without ``events``
    (``interruptions`` output) it is the paper's own Table 5 from its counts."""
    if events is None:
        counts = {c: n for c, _, n in LLAMA3_INTERRUPTIONS}
    else:
        require_columns(events, "interruptions", ("category",))
        counts = dict(events.group_by("category").len().iter_rows())
    total = sum(counts.values())
    rows = [{"category": c, "component": _COMPONENT[c], "interruptions": int(counts.get(c, 0)),
             "share": (counts.get(c, 0) / total) if total else 0.0} for c in CATEGORIES]
    return pl.DataFrame(rows, schema={"category": pl.String, "component": pl.String, "interruptions": pl.Int64, "share": pl.Float64})


# --- MTBF and availability ----------------------------------------------------------------------------


def mtbf_hours(exposure_hours: float, failures: int) -> float:
    """Mean time between failures: exposure / failures; ``inf`` with no failures (no evidence of any)."""
    if exposure_hours < 0 or failures < 0 or not math.isfinite(exposure_hours):
        raise ValueError("exposure and failures must be finite and non-negative")
    return math.inf if failures == 0 else exposure_hours / failures


def job_mtbf_hours(gpu_mtbf_hours: float, gpus: int) -> float:
    """A job that fails when any of its ``gpus`` fails: MTBF_job = MTBF_gpu / N (exponential, independent)."""
    if gpus < 1:
        raise ValueError("a job needs at least one GPU")
    return gpu_mtbf_hours / gpus


def job_exposure(job_event: pl.DataFrame) -> pl.DataFrame:
    """Per job: ``wall_hours`` (first to last lifecycle event) and ``ranks_seen`` (distinct ranks ≥ 0).
    Records such as SDC replays (``JOB_RECORD_KINDS``) may come long after the job and are not exposure."""
    require_columns(job_event, "job_event", ("job_id", "ts", "kind"))
    ev = job_event.filter(~pl.col("kind").is_in(list(JOB_RECORD_KINDS)))
    return ev.group_by("job_id").agg(
        ((pl.col("ts").max() - pl.col("ts").min()).dt.total_microseconds() / 3.6e9).alias("wall_hours"),
        pl.col("rank").filter(pl.col("rank") >= 0).n_unique().cast(pl.Int64).alias("ranks_seen") if "rank" in ev.columns
        else pl.lit(None, pl.Int64).alias("ranks_seen"),
    )


def mtbf_table(exposure: pl.DataFrame, interruption_rows: pl.DataFrame, job: pl.DataFrame | None = None) -> pl.DataFrame:
    """Per job: wall hours, GPUs (``job.world_size``, else distinct ranks seen), GPU-hours, unexpected
    interruptions, MTBF per job (wall hours / interruptions) and per GPU (GPU-hours / interruptions);
    ``inf`` where there were none. ``exposure``: ``job_exposure`` output (job_id, wall_hours, ranks_seen);
    ``interruption_rows``: ``interruptions`` output."""
    require_columns(exposure, "exposure", ("job_id", "wall_hours", "ranks_seen"))
    require_columns(interruption_rows, "interruptions", ("job_id",))
    fails = interruption_rows.group_by("job_id").len().rename({"len": "interruptions"}).with_columns(pl.col("interruptions").cast(pl.Int64))
    out = exposure.select("job_id", "wall_hours", pl.col("ranks_seen").cast(pl.Int64)).join(fails, on="job_id", how="left").with_columns(
        pl.col("interruptions").fill_null(0))
    if job is not None:
        require_columns(job, "job", ("job_id", "world_size"))
        out = out.join(job.select("job_id", pl.col("world_size").cast(pl.Int64)), on="job_id", how="left")
        gpus = pl.coalesce(pl.col("world_size"), pl.col("ranks_seen"))
    else:
        gpus = pl.col("ranks_seen")
    out = out.with_columns(gpus.alias("gpus")).with_columns((pl.col("wall_hours") * pl.col("gpus")).alias("gpu_hours"))
    return out.with_columns(
        pl.when(pl.col("interruptions") > 0).then(pl.col("wall_hours") / pl.col("interruptions")).otherwise(float("inf")).alias("job_mtbf_hours"),
        pl.when(pl.col("interruptions") > 0).then(pl.col("gpu_hours") / pl.col("interruptions")).otherwise(float("inf")).alias("gpu_mtbf_hours"),
    ).select("job_id", "wall_hours", "gpus", "gpu_hours", "interruptions", "job_mtbf_hours", "gpu_mtbf_hours").sort("job_id")


def fleet_mtbf(job_event: pl.DataFrame, job: pl.DataFrame | None = None) -> pl.DataFrame:
    """``mtbf_table`` straight from job events: exposure from their span, interruptions from ``failure`` events."""
    return mtbf_table(job_exposure(job_event), interruptions(job_event), job)


def recovery_times(job_event: pl.DataFrame) -> pl.DataFrame:
    """Per unexpected interruption (``interruptions`` rows): ``recovery_s``, the time until the job's next
    ``started`` or ``restart`` event — how long the failure kept the job down (null when it never came back
    within the events given). It is the part's repair time as the job sees it (a spare swapped in), which
    is shorter than the repair of the part itself."""
    intr = interruptions(job_event)
    back = job_event.filter(pl.col("kind").is_in(["started", "restart"])).select("job_id", pl.col("ts").alias("back_ts")).sort("back_ts")
    if intr.height == 0:
        return intr.with_columns(pl.lit(None, pl.Float64).alias("recovery_s"))
    # both sides are sorted by time overall, hence within each job: polars cannot check that itself with ``by``
    joined = intr.sort("ts").join_asof(back, left_on="ts", right_on="back_ts", by="job_id", strategy="forward",
                                       allow_exact_matches=False, check_sortedness=False)
    return joined.with_columns(((pl.col("back_ts") - pl.col("ts")).dt.total_microseconds() / 1e6).alias("recovery_s")).drop("back_ts").sort("job_id", "ts")


def steady_state_availability(mtbf_h: float, mttr_h: float) -> float:
    """A = MTBF / (MTBF + MTTR), the long-run fraction of time a repairable part is up."""
    if not (mtbf_h > 0) or not (mttr_h >= 0) or math.isnan(mttr_h):
        raise ValueError(f"need MTBF > 0 and MTTR >= 0, got {mtbf_h!r} and {mttr_h!r}")
    return 1.0 if math.isinf(mtbf_h) else mtbf_h / (mtbf_h + mttr_h)


def all_up_availability(part_availability: float, parts: int) -> float:
    """Probability all ``parts`` independent parts are up at once: A^N."""
    if not 0.0 <= part_availability <= 1.0:
        raise ValueError("availability must be within [0, 1]")
    if parts < 0:
        raise ValueError("parts must be >= 0")
    return part_availability ** parts


# --- checkpoint intervals -----------------------------------------------------------------------------


def _check(save_cost_s: float, mtbf_s: float) -> None:
    if not (save_cost_s > 0 and math.isfinite(save_cost_s)):
        raise ValueError(f"checkpoint save cost must be a positive number of seconds, got {save_cost_s!r}")
    if not (mtbf_s > 0):
        raise ValueError(f"MTBF must be positive, got {mtbf_s!r}")


def young_interval_s(save_cost_s: float, mtbf_s: float) -> float:
    """Young (1974): τ = √(2δM), compute time between checkpoints."""
    _check(save_cost_s, mtbf_s)
    return math.sqrt(2 * save_cost_s * mtbf_s)


def daly_interval_s(save_cost_s: float, mtbf_s: float) -> float:
    """Daly (2006), eq. (37): τ = √(2δM)·[1 + ⅓√(δ/2M) + (1/9)(δ/2M)] − δ for δ < 2M, else M."""
    _check(save_cost_s, mtbf_s)
    d, m = save_cost_s, mtbf_s
    if math.isinf(m):
        return math.inf
    if d >= 2 * m:
        return m
    x = d / (2 * m)
    return math.sqrt(2 * d * m) * (1 + math.sqrt(x) / 3 + x / 9) - d


def expected_lost_fraction(interval_s: float, save_cost_s: float, mtbf_s: float, restart_s: float = 0.0) -> float:
    """Fraction of wall time not spent on useful compute when checkpointing every ``interval_s`` of
    compute, under Daly's complete model (2006, eq. 13): 1 − τ / (M·e^{R/M}·(e^{(τ+δ)/M} − 1)).

    It counts the checkpoint writes, the rework lost to failures and the restarts; with M → ∞ it tends to
    δ/(τ+δ), the cost of the writes alone.
    """
    _check(save_cost_s, mtbf_s)
    if not (interval_s > 0):
        raise ValueError("checkpoint interval must be positive")
    if restart_s < 0:
        raise ValueError("restart cost must be >= 0")
    if math.isinf(mtbf_s):
        return save_cost_s / (interval_s + save_cost_s)
    m = mtbf_s
    # expm1 keeps precision when (τ+δ) ≪ M
    wall_per_compute = m * math.exp(restart_s / m) * math.expm1((interval_s + save_cost_s) / m) / interval_s
    return 1.0 - 1.0 / wall_per_compute


def checkpoint_costs(job_event: pl.DataFrame) -> pl.DataFrame:
    """Per job, from ``checkpoint_save_start``/``_end`` pairs (job-level or rank 0): measured save cost δ
    (median seconds), saves seen, and the actual interval (median seconds between save starts, minus δ:
    the compute between checkpoints); and restore cost (median ``checkpoint_restore_*`` seconds)."""
    require_columns(job_event, "job_event", ("job_id", "ts", "kind"))
    ev = job_event
    if "rank" in ev.columns:
        ev = ev.filter(pl.col("rank") <= 0)  # -1 job-level or rank 0; other ranks repeat the same save
    out = []
    for (job,), g in ev.sort("ts").group_by(["job_id"], maintain_order=True):
        saves = _pairs(g, "checkpoint_save_start", "checkpoint_save_end")
        restores = _pairs(g, "checkpoint_restore_start", "checkpoint_restore_end")
        starts = [s for s, _ in saves]
        gaps = [(b - a).total_seconds() for a, b in zip(starts, starts[1:])]
        d = _median([(e - s).total_seconds() for s, e in saves])
        out.append({"job_id": job, "saves": len(saves), "save_cost_s": d,
                    "interval_s": (_median(gaps) - d) if gaps and d is not None else None,
                    "restore_cost_s": _median([(e - s).total_seconds() for s, e in restores])})
    return pl.DataFrame(out, schema={"job_id": pl.String, "saves": pl.Int64, "save_cost_s": pl.Float64,
                                     "interval_s": pl.Float64, "restore_cost_s": pl.Float64})


def _pairs(g: pl.DataFrame, start: str, end: str) -> list[tuple[datetime, datetime]]:
    """Match each start with the next end, in time order (a start without an end — the job died mid-save —
    and an end without a start are dropped)."""
    out, open_ts = [], None
    for kind, ts in g.filter(pl.col("kind").is_in([start, end])).select("kind", "ts").iter_rows():
        if kind == start:
            open_ts = ts
        elif open_ts is not None:  # an end with no start in the window (it began earlier) is dropped
            out.append((open_ts, ts))
            open_ts = None
    return out


def _median(xs: list[float]) -> float | None:
    if not xs:
        return None
    s = sorted(xs)
    n = len(s)
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


def checkpoint_advice(costs: pl.DataFrame, mtbf_hours_by_job: Mapping[str, float] | pl.DataFrame) -> pl.DataFrame:
    """Young and Daly intervals per job and the expected lost fraction at the actual and the advised
    (Daly) interval. ``costs``: ``checkpoint_costs`` output; MTBF per job in hours (a mapping, or a frame
    with job_id and job_mtbf_hours such as ``fleet_mtbf``'s)."""
    require_columns(costs, "checkpoint_costs", ("job_id", "save_cost_s", "interval_s", "restore_cost_s"))
    if isinstance(mtbf_hours_by_job, pl.DataFrame):
        require_columns(mtbf_hours_by_job, "mtbf", ("job_id", "job_mtbf_hours"))
        mtbf = dict(mtbf_hours_by_job.select("job_id", "job_mtbf_hours").iter_rows())
    else:
        mtbf = dict(mtbf_hours_by_job)
    rows = []
    for r in costs.to_dicts():
        m_h = mtbf.get(r["job_id"])
        d = r["save_cost_s"]
        row = {**r, "mtbf_s": None if m_h is None else m_h * 3600, "young_interval_s": None, "daly_interval_s": None,
               "lost_fraction_actual": None, "lost_fraction_advised": None}
        if m_h is not None and d is not None and d > 0 and m_h > 0:
            m = m_h * 3600
            row["young_interval_s"] = young_interval_s(d, m)
            row["daly_interval_s"] = daly_interval_s(d, m)
            rest = r["restore_cost_s"] or 0.0
            if math.isfinite(row["daly_interval_s"]):
                row["lost_fraction_advised"] = expected_lost_fraction(row["daly_interval_s"], d, m, rest)
            if r["interval_s"] is not None and r["interval_s"] > 0:
                row["lost_fraction_actual"] = expected_lost_fraction(r["interval_s"], d, m, rest)
        rows.append(row)
    schema = {**costs.schema, "mtbf_s": pl.Float64, "young_interval_s": pl.Float64, "daly_interval_s": pl.Float64,
              "lost_fraction_actual": pl.Float64, "lost_fraction_advised": pl.Float64}
    return pl.DataFrame(rows, schema=schema)


def checkpoint_findings(advice: pl.DataFrame, *, window_start: datetime, window_end: datetime,
                        min_gain: float = 0.01) -> pl.DataFrame:
    """A finding per job whose actual interval loses at least ``min_gain`` (absolute fraction of wall time)
    more than the advised one. Score = the fraction of wall time the change would win back."""
    require_columns(advice, "checkpoint_advice", ("job_id", "lost_fraction_actual", "lost_fraction_advised", "daly_interval_s", "interval_s"))
    rows = []
    for r in advice.to_dicts():
        a, b = r["lost_fraction_actual"], r["lost_fraction_advised"]
        if a is None or b is None or a - b < min_gain:
            continue
        direction = "more" if r["daly_interval_s"] < r["interval_s"] else "less"
        rows.append({
            "analyzer": "reliability", "kind": "checkpoint_interval", "subject": f"job:{r['job_id']}",
            "window_start": window_start, "window_end": window_end,
            "severity": "warning" if a - b >= 0.05 else "info", "score": a - b,
            "summary": f"Job {r['job_id']} checkpoints every {r['interval_s'] / 60:.1f} min and loses {a:.1%} of its time; "
                       f"checkpointing {direction} often, every {r['daly_interval_s'] / 60:.1f} min (Daly), would lose {b:.1%}.",
            "evidence": json.dumps({k: v for k, v in r.items() if v is not None}, default=str, sort_keys=True),
        })
    return findings_frame(rows)

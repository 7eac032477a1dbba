"""GPU energy: counters and power integration, per-minute roll-ups, job attribution, energy productivity
and the serving-versus-training crossover. Site-level figures (PUE, WUE) are ``analyzers.facility``.

Method (issue 6):

- **GPU energy** comes from the cumulative energy counter (``gpu_sample.energy_j``,
  DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION) where it is present, because a counter keeps integrating between
  scrapes: a missed scrape loses no energy. The difference of two consecutive counter readings is the
  energy of that interval. A reading lower than the one before (driver reload, GPU reset, reboot) or a step
  implying more than ``max_power_w`` starts a new segment: that interval is not taken from the counter
  (the counter's value after a reset does not say when the reset happened).
- **Power integration** (trapezoid rule over ``power_w``) fills whatever the counter does not cover: GPUs
  without a counter and the intervals across a counter reset. An interval between two power samples longer
  than ``max_power_gap_s`` is *not* bridged — power between them is unknown — and is reported as uncovered
  time. Counter intervals are bridged up to ``max_counter_gap_s`` (the counter is exact across a gap; the
  limit only bounds how far the energy is spread uniformly over minutes it cannot resolve).
- A GPU with neither usable counter nor power is **flagged** (status ``no_energy_data``/``no_data``) with
  a null energy, never reported as zero. Every figure carries its ``method``: ``counter``,
  ``power_integration`` or ``counter+power_integration`` when both contributed.

The stored form is the **per-minute per-GPU roll-up** (:data:`ENERGY_MINUTE_SCHEMA`), one row per GPU per
UTC minute that has any covered time: a day of a 16,384-GPU fleet at 1 Hz is 1.4 G raw samples but 23.6 M
roll-up rows, and every other figure here is computed from roll-ups, never from raw telemetry.

Attribution to jobs uses ``job_rank`` (which rank ran on which GPU when) at minute resolution: a rank that
held a GPU for part of a minute gets that fraction of the minute's energy (power assumed even within the
minute). Energy of a GPU-minute not held by any rank is **idle** energy (``job_id`` null).

Energy productivity ρ = useful FLOPs / J (the textbook's energy law, docs/ARCHITECTURE.md): useful FLOPs are the model
FLOPs of the steps that count (a step re-run after a restart counts once), J is GPU energy including idle
for the fleet figure.

Pure: polars over canonical frames (``fleetscope.core.frames``); nothing here reads the clock, a file
or the database.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass, field

import polars as pl

from analyzers.energy_intervals import MINUTE_US, US, epoch_us, reading_intervals, split_minutes, utc_epoch_us
from fleetscope.core.errors import ValidationError
from fleetscope.core.frames import UTC_US

__all__ = [
    "ENERGY_MINUTE_SCHEMA",
    "ATTRIBUTED_SCHEMA",
    "METHOD_COUNTER",
    "METHOD_POWER",
    "METHOD_BOTH",
    "EnergyRollup",
    "energy_rollup",
    "gpu_energy",
    "attribute_to_jobs",
    "energy_summary",
    "energy_productivity",
    "fleet_energy_productivity",
    "serving_vs_training",
    "energy_from_chip_hours",
    "J_PER_KWH",
]

J_PER_KWH = 3.6e6  # J per kWh, for the reports that give GPU energy in kWh

METHOD_COUNTER = "counter"
METHOD_POWER = "power_integration"
METHOD_BOTH = "counter+power_integration"

# The roll-up the store keeps (table ``gpu_energy_minute``, natural key (minute, gpu_uuid)).
ENERGY_MINUTE_SCHEMA: dict[str, pl.DataType] = {
    "minute": UTC_US,  # start of the UTC minute
    "gpu_uuid": pl.String,
    "energy_j": pl.Float64,  # counter_energy_j + integrated_energy_j
    "counter_energy_j": pl.Float64,  # part taken from the cumulative counter
    "integrated_energy_j": pl.Float64,  # part from trapezoid integration of power_w
    "covered_s": pl.Float64,  # seconds of the minute with energy data (60 − covered_s is uncovered)
    "method": pl.String,  # counter | power_integration | counter+power_integration
}

# GPU-minute energy split between the ranks that held the GPU and idle (job_id null).
ATTRIBUTED_SCHEMA: dict[str, pl.DataType] = {
    "minute": UTC_US,
    "gpu_uuid": pl.String,
    "job_id": pl.String,
    "rank": pl.Int64,
    "energy_j": pl.Float64,
    "counter_energy_j": pl.Float64,
    "integrated_energy_j": pl.Float64,
    "covered_s": pl.Float64,
    "allocated_s": pl.Float64,  # GPU-seconds of the minute this row stands for
}

_EVENTS_SCHEMA = {"gpu_uuid": pl.String, "ts": UTC_US, "kind": pl.String, "value": pl.Float64}
_GPU_SUMMARY_SCHEMA = {
    "gpu_uuid": pl.String,
    "samples": pl.UInt32,
    "energy_j": pl.Float64,
    "counter_energy_j": pl.Float64,
    "integrated_energy_j": pl.Float64,
    "covered_s": pl.Float64,
    "uncovered_s": pl.Float64,
    "counter_resets": pl.UInt32,
    "invalid_values": pl.UInt32,
    "method": pl.String,
    "status": pl.String,
}


# --- helpers ---------------------------------------------------------------------------------------


def _method_expr(counter: pl.Expr, integrated: pl.Expr, covered: pl.Expr) -> pl.Expr:
    return (
        pl.when(covered <= 0)
        .then(pl.lit(None, pl.String))
        .when(integrated.abs() == 0)
        .then(pl.lit(METHOD_COUNTER))
        .when(counter.abs() == 0)
        .then(pl.lit(METHOD_POWER))
        .otherwise(pl.lit(METHOD_BOTH))
    )


def _clean_value(name: str, present: bool) -> pl.Expr:
    """NaN/inf are treated as missing; negative power or counter values are invalid (a sign or unit error
    upstream) and dropped, counted in ``invalid_values`` and reported as events."""
    if not present:
        return pl.lit(None, pl.Float64).alias(name)
    c = pl.col(name).cast(pl.Float64)
    return pl.when(c.is_finite() & (c >= 0)).then(c).otherwise(None).alias(name)


def _invalid_expr(name: str, present: bool) -> pl.Expr:
    if not present:
        return pl.lit(False)
    c = pl.col(name).cast(pl.Float64)
    return c.is_not_null() & (c.is_nan() | c.is_infinite() | (c < 0))


# --- GPU energy and the per-minute roll-up --------------------------------------------------------


@dataclass
class EnergyRollup:
    """What :func:`energy_rollup` returns.

    ``minutes``: the stored roll-up (:data:`ENERGY_MINUTE_SCHEMA`). ``gpus``: one row per GPU seen in the
    samples with its window total, coverage, method and ``status`` (``measured``, ``partial`` or
    ``no_energy_data`` — the last with a null energy, never zero). ``events``: counter resets, implausible
    counter steps, unbridged gaps and invalid values (gpu_uuid, ts, kind, value) for findings.
    """

    minutes: pl.DataFrame
    gpus: pl.DataFrame
    events: pl.DataFrame
    window_start: dt.datetime | None = None
    window_end: dt.datetime | None = None
    params: dict = field(default_factory=dict)


def energy_rollup(
    gpu_sample: pl.DataFrame,
    *,
    window_start: dt.datetime | None = None,
    window_end: dt.datetime | None = None,
    max_power_gap_s: float = 60.0,
    max_counter_gap_s: float = 3600.0,
    max_power_w: float | None = 5000.0,
) -> EnergyRollup:
    """Per-minute per-GPU energy from ``gpu_sample`` (columns ts, gpu_uuid, and power_w and/or energy_j).

    Energy is counted only inside [window_start, window_end) (default: the samples' own span); samples
    outside the window serve as interval endpoints, so an incremental run reads a little before and after
    its window (at least one scrape each side) and every minute of the window comes out complete and
    identical however the data is cut — the roll-up of a window can be rewritten idempotently.

    Policy (module docstring): counter first; a counter going backwards or stepping above ``max_power_w``
    (``None``: no check) starts a new segment; counter intervals bridge up to ``max_counter_gap_s``; power
    is integrated by trapezoid where the counter does not cover, bridging at most ``max_power_gap_s``.
    NaN/inf readings count as missing; negative readings are dropped and reported (``invalid_value``).
    Duplicate (ts, gpu_uuid) rows keep the first. Raises ``ValidationError`` for a missing ts/gpu_uuid
    column, a naive timestamp column, a null ts or gpu_uuid, or window_end <= window_start.
    """
    frame = "gpu_sample"
    ws, we = epoch_us(window_start), epoch_us(window_end)
    if ws is not None and we is not None and we <= ws:
        raise ValidationError("window_end must be after window_start", frame=frame)
    if "gpu_uuid" not in gpu_sample.columns:
        raise ValidationError("missing required column", frame=frame, field="gpu_uuid")
    ts = utc_epoch_us(gpu_sample, frame)
    has_p, has_e = "power_w" in gpu_sample.columns, "energy_j" in gpu_sample.columns
    params = dict(max_power_gap_s=max_power_gap_s, max_counter_gap_s=max_counter_gap_s, max_power_w=max_power_w)
    if gpu_sample.height == 0:
        return EnergyRollup(
            pl.DataFrame(schema=ENERGY_MINUTE_SCHEMA), pl.DataFrame(schema=_GPU_SUMMARY_SCHEMA),
            pl.DataFrame(schema=_EVENTS_SCHEMA), window_start, window_end, params,
        )
    for col in ("ts", "gpu_uuid"):
        n_null = gpu_sample.get_column(col).null_count()
        if n_null:
            row = int(gpu_sample.get_column(col).is_null().arg_true()[0])
            raise ValidationError("missing value in a required field", frame=frame, row=row, field=col)

    # Work on a dense integer GPU key: sorting and grouping 10^6 rows by a u32 is several times faster than
    # by a 40-character UUID; the UUIDs come back through a 16k-row lookup at the end.
    lut = gpu_sample.select(pl.col("gpu_uuid").unique(maintain_order=True)).with_row_index("k")
    df = gpu_sample.select(
        pl.col("gpu_uuid"),
        ts.alias("t"),
        _clean_value("power_w", has_p).alias("power"),
        _clean_value("energy_j", has_e).alias("counter"),
        (_invalid_expr("power_w", has_p) | _invalid_expr("energy_j", has_e)).alias("invalid"),
    )
    df = df.join(lut, on="gpu_uuid", how="left").drop("gpu_uuid")
    t_min, t_max = df["t"].min(), df["t"].max()
    if lut.height < 2**23 and t_max - t_min < 2**40:
        # one u64 sort key (gpu in the high bits, µs offset in the low 40) sorts ~4x faster than two columns
        order = pl.col("k").cast(pl.UInt64) * (1 << 40) + (pl.col("t") - t_min).cast(pl.UInt64)
        df = df.sort(order, maintain_order=True)
    else:
        df = df.sort("k", "t", maintain_order=True)
    # duplicate (gpu, ts) rows: keep the first (sorting is stable)
    dup = (pl.col("k") == pl.col("k").shift(1)) & (pl.col("t") == pl.col("t").shift(1))
    df = df.filter(~dup.fill_null(False))
    lo = ws if ws is not None else int(df["t"].min())
    hi = we if we is not None else int(df["t"].max())

    iv, ev = reading_intervals(df, "k", max_power_gap_s=max_power_gap_s, max_counter_gap_s=max_counter_gap_s, max_power_w=max_power_w)
    ev = ev.join(lut, on="k", how="left").select("gpu_uuid", "t", "kind", "value")
    pieces = split_minutes(iv, "k", lo, hi)
    minutes = (
        pieces.group_by("m", "k")
        .agg(
            pl.col("energy_j").filter(pl.col("counter")).sum().alias("counter_energy_j"),
            pl.col("energy_j").filter(~pl.col("counter")).sum().alias("integrated_energy_j"),
            pl.col("covered_s").sum(),
        )
        .filter(pl.col("covered_s") > 0)
        .select(
            (pl.col("m") * MINUTE_US).cast(pl.Datetime("us")).dt.replace_time_zone("UTC").alias("minute"),
            "k",
            (pl.col("counter_energy_j") + pl.col("integrated_energy_j")).alias("energy_j"),
            "counter_energy_j",
            "integrated_energy_j",
            "covered_s",
            _method_expr(pl.col("counter_energy_j"), pl.col("integrated_energy_j"), pl.col("covered_s")).alias("method"),
        )
        .join(lut, on="k", how="left")
        .select(list(ENERGY_MINUTE_SCHEMA))
        .sort("minute", "gpu_uuid")
    )

    invalid_ev = df.filter(pl.col("invalid")).join(lut, on="k", how="left").select(
        "gpu_uuid", "t", pl.lit("invalid_value").alias("kind"), pl.lit(None, pl.Float64).alias("value")
    )
    events = (
        pl.concat([ev, invalid_ev])
        .filter((pl.col("t") >= lo) & (pl.col("t") <= hi))
        .select("gpu_uuid", pl.col("t").cast(pl.Datetime("us")).dt.replace_time_zone("UTC").alias("ts"), "kind", "value")
        .sort("ts", "gpu_uuid")
    )
    window_s = (hi - lo) / US
    per_gpu = df.group_by("k").agg(
        pl.len().cast(pl.UInt32).alias("samples"), pl.col("invalid").sum().cast(pl.UInt32).alias("invalid_values")
    )
    totals = minutes.group_by("gpu_uuid").agg(
        pl.col("energy_j").sum(), pl.col("counter_energy_j").sum(), pl.col("integrated_energy_j").sum(), pl.col("covered_s").sum()
    )
    resets = events.filter(pl.col("kind") == "counter_reset").group_by("gpu_uuid").agg(pl.len().cast(pl.UInt32).alias("counter_resets"))
    gpus = (
        per_gpu.join(lut, on="k", how="left").join(totals, on="gpu_uuid", how="left")
        .join(resets, on="gpu_uuid", how="left")
        .with_columns(pl.col("covered_s").fill_null(0.0), pl.col("counter_resets").fill_null(0))
        .with_columns(
            (pl.lit(window_s) - pl.col("covered_s")).clip(lower_bound=0).alias("uncovered_s"),
            _method_expr(pl.col("counter_energy_j"), pl.col("integrated_energy_j"), pl.col("covered_s")).alias("method"),
            pl.when(pl.col("covered_s") <= 0)
            .then(pl.lit("no_energy_data"))
            .when(pl.col("covered_s") < window_s - 1e-6)
            .then(pl.lit("partial"))
            .otherwise(pl.lit("measured"))
            .alias("status"),
        )
        .select(list(_GPU_SUMMARY_SCHEMA))
        .sort("gpu_uuid")
    )
    return EnergyRollup(minutes, gpus, events, window_start, window_end, params)


def gpu_energy(
    minutes: pl.DataFrame,
    *,
    window_start: dt.datetime,
    window_end: dt.datetime,
    gpu: pl.DataFrame | None = None,
) -> pl.DataFrame:
    """Per-GPU energy over a window from the stored roll-ups (bounds on minute boundaries: a roll-up row
    counts whole, by the minute it starts).

    Every GPU of the ``gpu`` inventory appears: one without any roll-up row in the window gets
    ``energy_j`` null and status ``no_data`` (flagged, never zero). Columns: gpu_uuid, energy_j,
    counter_energy_j, integrated_energy_j, covered_s, uncovered_s, method, status (measured/partial/no_data).
    """
    lo, hi = epoch_us(window_start), epoch_us(window_end)
    window_s = (hi - lo) / US
    m = minutes.filter((pl.col("minute") >= window_start) & (pl.col("minute") < window_end))
    tot = m.group_by("gpu_uuid").agg(
        pl.col("energy_j").sum(), pl.col("counter_energy_j").sum(), pl.col("integrated_energy_j").sum(), pl.col("covered_s").sum()
    )
    if gpu is not None:
        tot = gpu.select("gpu_uuid").unique().join(tot, on="gpu_uuid", how="full", coalesce=True)
    return (
        tot.with_columns(pl.col("covered_s").fill_null(0.0))
        .with_columns(
            pl.when(pl.col("covered_s") > 0).then(pl.col("energy_j")).otherwise(None).alias("energy_j"),
            (pl.lit(window_s) - pl.col("covered_s")).clip(lower_bound=0).alias("uncovered_s"),
            _method_expr(pl.col("counter_energy_j"), pl.col("integrated_energy_j"), pl.col("covered_s")).alias("method"),
            pl.when(pl.col("covered_s") <= 0)
            .then(pl.lit("no_data"))
            .when(pl.col("covered_s") < window_s - 1e-6)
            .then(pl.lit("partial"))
            .otherwise(pl.lit("measured"))
            .alias("status"),
        )
        .select("gpu_uuid", "energy_j", "counter_energy_j", "integrated_energy_j", "covered_s", "uncovered_s", "method", "status")
        .sort("gpu_uuid")
    )


# --- attribution to jobs ---------------------------------------------------------------------------


def attribute_to_jobs(minutes: pl.DataFrame, job_rank: pl.DataFrame) -> pl.DataFrame:
    """Split each GPU-minute's energy between the ranks that held the GPU in that minute and idle.

    A rank interval [start, end) (``end`` null: still running) covering a fraction f of a minute gets
    f of its energy (power taken as even within the minute — the roll-up's resolution). If assignments on
    one GPU overlap (bad inventory or shared GPUs), shares are scaled so they sum to at most one. The rest
    of the minute is idle (``job_id`` null). Returns :data:`ATTRIBUTED_SCHEMA`; energy is conserved.
    """
    if minutes.height == 0:
        return pl.DataFrame(schema=ATTRIBUTED_SCHEMA)
    for col in ("job_id", "rank", "start", "gpu_uuid"):
        if col not in job_rank.columns:
            raise ValidationError("missing required column", frame="job_rank", field=col)
    m = minutes.with_columns(pl.col("minute").dt.epoch("us").alias("mu"))
    lo, hi = int(m["mu"].min()), int(m["mu"].max()) + MINUTE_US
    start = utc_epoch_us(job_rank, "job_rank", "start")
    # an all-null "end" column built without a schema has dtype Null: every rank is still running
    has_end = "end" in job_rank.columns and job_rank.schema["end"] != pl.Null
    end = utc_epoch_us(job_rank, "job_rank", "end") if has_end else pl.lit(None, pl.Int64)
    jr = (
        job_rank.select("job_id", "rank", "gpu_uuid", start.alias("s"), end.alias("e"))
        .with_columns(pl.col("e").fill_null(hi))
        .with_columns(pl.max_horizontal("s", pl.lit(lo)).alias("s"), pl.min_horizontal("e", pl.lit(hi)).alias("e"))
        .filter(pl.col("e") > pl.col("s"))
        .join(m.select("gpu_uuid").unique(), on="gpu_uuid", how="semi")
    )
    jr = (
        jr.with_columns(pl.int_ranges(pl.col("s") // MINUTE_US, (pl.col("e") - 1) // MINUTE_US + 1).alias("mi"))
        .explode("mi")
        .with_columns((pl.col("mi") * MINUTE_US).alias("mu"))
        .with_columns(
            ((pl.min_horizontal("e", pl.col("mu") + MINUTE_US) - pl.max_horizontal("s", "mu")) / US).alias("held_s")
        )
        .select("job_id", "rank", "gpu_uuid", "mu", "held_s")
    )
    held = jr.join(m, on=["gpu_uuid", "mu"], how="inner")
    scale = held.group_by("gpu_uuid", "mu").agg((pl.col("held_s").sum() / 60.0).alias("held_frac"))
    held = held.join(scale, on=["gpu_uuid", "mu"]).with_columns(
        (pl.col("held_s") / 60.0 / pl.max_horizontal(pl.col("held_frac"), pl.lit(1.0))).alias("share")
    )
    cols = ["energy_j", "counter_energy_j", "integrated_energy_j", "covered_s"]
    jobs = held.select(
        "minute", "gpu_uuid", "job_id", "rank", *[(pl.col(c) * pl.col("share")).alias(c) for c in cols],
        (pl.col("share") * 60.0).alias("allocated_s"),
    )
    idle = (
        m.join(scale, on=["gpu_uuid", "mu"], how="left")
        .with_columns((1.0 - pl.col("held_frac").fill_null(0.0)).clip(lower_bound=0.0).alias("share"))
        .filter(pl.col("share") > 1e-12)
        .select(
            "minute", "gpu_uuid", pl.lit(None, pl.String).alias("job_id"), pl.lit(None, pl.Int64).alias("rank"),
            *[(pl.col(c) * pl.col("share")).alias(c) for c in cols], (pl.col("share") * 60.0).alias("allocated_s"),
        )
    )
    return pl.concat([jobs, idle]).cast(ATTRIBUTED_SCHEMA).sort("minute", "gpu_uuid", "job_id", nulls_last=True)


def energy_summary(
    attributed: pl.DataFrame,
    by: Sequence[str],
    *,
    gpu: pl.DataFrame | None = None,
    host: pl.DataFrame | None = None,
    job: pl.DataFrame | None = None,
) -> pl.DataFrame:
    """Energy grouped ``by`` any of: job_id, rank, gpu_uuid, host, site_id, gpu_model (gpu.model_name),
    model_name (job.model_name, the ML model), job_kind (training/inference), minute, hour, day.

    Inventory frames supply the dimensions that ``attributed`` does not carry. Output: the keys, energy_j,
    counter_energy_j, integrated_energy_j, covered_s, allocated_s, coverage_ratio (covered/allocated) and
    method. Idle energy has job_id null.
    """
    df = attributed
    need = set(by)
    if need & {"host", "site_id", "gpu_model"}:
        if gpu is None:
            raise ValidationError("grouping by host/site/gpu_model needs the gpu inventory", frame="gpu")
        df = df.join(gpu.select("gpu_uuid", "host", pl.col("model_name").alias("gpu_model")), on="gpu_uuid", how="left")
    if "site_id" in need:
        if host is None:
            raise ValidationError("grouping by site_id needs the host inventory", frame="host")
        df = df.join(host.select("host", "site_id"), on="host", how="left")
    if need & {"model_name", "job_kind"}:
        if job is None:
            raise ValidationError("grouping by model_name/job_kind needs the job inventory", frame="job")
        df = df.join(job.select("job_id", "model_name", pl.col("kind").alias("job_kind")), on="job_id", how="left")
    if "hour" in need:
        df = df.with_columns(pl.col("minute").dt.truncate("1h").alias("hour"))
    if "day" in need:
        df = df.with_columns(pl.col("minute").dt.truncate("1d").alias("day"))
    return (
        df.group_by(list(by))
        .agg(pl.col(c).sum() for c in ("energy_j", "counter_energy_j", "integrated_energy_j", "covered_s", "allocated_s"))
        .with_columns(
            (pl.col("covered_s") / pl.col("allocated_s")).alias("coverage_ratio"),
            _method_expr(pl.col("counter_energy_j"), pl.col("integrated_energy_j"), pl.col("covered_s")).alias("method"),
        )
        .sort(list(by), nulls_last=True)
    )


# --- work per joule ---------------------------------------------------------------------------------


def _useful_steps(step: pl.DataFrame, rank_aggregation: str) -> pl.DataFrame:
    """Per job and step number: tokens and model FLOPs of the attempt that counted (the last one started;
    an attempt re-run after a restart is wasted work, counted once), aggregated over ranks."""
    if rank_aggregation not in ("sum", "max"):
        raise ValueError("rank_aggregation must be 'sum' (ranks report their share) or 'max' (ranks report the global figure)")
    last = step.sort("start").group_by("job_id", "rank", "step").agg(pl.col("tokens").last(), pl.col("model_flops").last())
    agg = (lambda c: pl.col(c).sum()) if rank_aggregation == "sum" else (lambda c: pl.col(c).max())
    return last.group_by("job_id", "step").agg(agg("tokens").alias("tokens"), agg("model_flops").alias("model_flops"))


def energy_productivity(job_energy: pl.DataFrame, step: pl.DataFrame, *, rank_aggregation: str = "sum") -> pl.DataFrame:
    """Energy per step, per million tokens and ρ = useful FLOPs / J per job.

    ``job_energy``: job_id, energy_j (e.g. ``energy_summary(attributed, ["job_id"])``) over the same window
    as ``step``. ``rank_aggregation``: ``sum`` when each rank reports its own tokens/FLOPs, ``max`` when
    each reports the global batch. Returns job_id, energy_j, steps, tokens, useful_flops,
    energy_per_step_j, energy_per_mtok_j (J per 10^6 tokens), flops_per_j. Ratios are null where the
    denominator is zero or unknown.
    """
    per_step = _useful_steps(step, rank_aggregation)
    work = per_step.group_by("job_id").agg(
        pl.len().alias("steps"), pl.col("tokens").sum().alias("tokens"), pl.col("model_flops").sum().alias("useful_flops")
    )
    e = job_energy.filter(pl.col("job_id").is_not_null()).select("job_id", "energy_j")
    out = e.join(work, on="job_id", how="left")

    def ratio(num: pl.Expr, den: pl.Expr) -> pl.Expr:
        return pl.when(den > 0).then(num / den).otherwise(None)

    return out.with_columns(
        ratio(pl.col("energy_j"), pl.col("steps").cast(pl.Float64)).alias("energy_per_step_j"),
        ratio(pl.col("energy_j") * 1e6, pl.col("tokens").cast(pl.Float64)).alias("energy_per_mtok_j"),
        ratio(pl.col("useful_flops"), pl.col("energy_j")).alias("flops_per_j"),
    ).sort("job_id")


def fleet_energy_productivity(attributed: pl.DataFrame, step: pl.DataFrame, *, rank_aggregation: str = "sum") -> float | None:
    """Fleet ρ = useful FLOPs of all jobs / all GPU energy of the window, idle included (idle GPUs are the
    fleet's cost of doing that work). None where there is no energy."""
    total_j = float(attributed["energy_j"].sum() or 0.0)
    if total_j <= 0:
        return None
    flops = _useful_steps(step, rank_aggregation)["model_flops"].sum()
    return float(flops or 0.0) / total_j


def energy_from_chip_hours(n_chips: float, hours: float, avg_power_w: float, pue: float = 1.0) -> float:
    """Energy in J of ``n_chips`` drawing ``avg_power_w`` each for ``hours``, times PUE — Patterson et al.
    2021 ("Carbon Emissions and Large Neural Network Training", arXiv:2104.10350, §2.5):
    MWh = hours × chips × average power × PUE. Used to estimate where telemetry is absent."""
    if n_chips < 0 or hours < 0 or avg_power_w < 0 or pue < 1.0:
        raise ValueError("chips, hours and power must be >= 0 and PUE >= 1")
    return n_chips * hours * 3600.0 * avg_power_w * pue

# --- serving versus training ---------------------------------------------------------------------


def serving_vs_training(attributed: pl.DataFrame, job: pl.DataFrame, *, projection_days: int = 28) -> pl.DataFrame:
    """Per model: training energy, serving (inference) energy and emissions, and the date cumulative
    serving energy passes training energy (the serving-cost-dominance law).

    ``attributed``: :data:`ATTRIBUTED_SCHEMA` rows (optionally with a ``kgco2e`` column, e.g. from
    ``analyzers.carbon.location_based``); ``job``: job_id, kind (training/inference), model_name.
    ``crossover_basis``: ``observed`` (the day it happened), ``projected`` (not yet: extrapolated at the
    mean daily serving energy of the last ``projection_days`` days observed), or ``none`` (no serving or
    no training energy). Returns model_name, training_energy_j, serving_energy_j, training_kgco2e,
    serving_kgco2e, serving_days, crossover_date, crossover_basis.
    """
    has_c = "kgco2e" in attributed.columns
    df = attributed.filter(pl.col("job_id").is_not_null()).join(
        job.select("job_id", "kind", "model_name"), on="job_id", how="inner"
    ).with_columns(pl.col("minute").dt.date().alias("day"))
    carbon = pl.col("kgco2e") if has_c else pl.lit(None, pl.Float64)
    train = df.filter(pl.col("kind") == "training").group_by("model_name").agg(
        pl.col("energy_j").sum().alias("training_energy_j"), carbon.sum().alias("training_kgco2e") if has_c else carbon.first().alias("training_kgco2e")
    )
    daily = (
        df.filter(pl.col("kind") == "inference")
        .group_by("model_name", "day")
        .agg(pl.col("energy_j").sum().alias("e"), (carbon.sum() if has_c else carbon.first()).alias("c"))
        .sort("model_name", "day")
    )
    rows = []
    models = sorted(set(train["model_name"].to_list()) | set(daily["model_name"].to_list()), key=lambda x: (x is None, x))
    for model in models:
        t = train.filter(pl.col("model_name") == model)
        t_j = float(t["training_energy_j"][0]) if t.height else None
        t_c = t["training_kgco2e"][0] if t.height else None
        d = daily.filter(pl.col("model_name") == model)
        s_j = float(d["e"].sum()) if d.height else 0.0
        s_c = float(d["c"].sum()) if (has_c and d.height) else None
        date, basis = None, "none"
        if d.height and t_j:
            cum = d["e"].cum_sum()
            hit = (cum >= t_j).arg_true()
            if len(hit):
                date, basis = d["day"][int(hit[0])], "observed"
            else:
                recent = d.tail(projection_days)
                span_days = (recent["day"][-1] - recent["day"][0]).days + 1
                rate = float(recent["e"].sum()) / span_days
                if rate > 0:
                    days_more = (t_j - s_j) / rate
                    date = d["day"][-1] + dt.timedelta(days=int(-(-days_more // 1)))
                    basis = "projected"
        rows.append(
            {"model_name": model, "training_energy_j": t_j, "serving_energy_j": s_j, "training_kgco2e": t_c,
             "serving_kgco2e": s_c, "serving_days": d.height, "crossover_date": date, "crossover_basis": basis}
        )
    schema = {"model_name": pl.String, "training_energy_j": pl.Float64, "serving_energy_j": pl.Float64,
              "training_kgco2e": pl.Float64, "serving_kgco2e": pl.Float64, "serving_days": pl.Int64,
              "crossover_date": pl.Date, "crossover_basis": pl.String}
    return pl.DataFrame(rows, schema=schema)

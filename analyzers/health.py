"""GPU health: Xid classification, ECC / row-remap / retired-page rates, throttling, low clocks, a
per-GPU and per-node health score with a drain / repair recommendation, and findings.

Sources of the rules:

* Xid meaning and NVIDIA's resolution buckets: NVIDIA, *Analyzing Xid Errors with the Xid Catalog*
  (docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html), shipped as
  ``analyzers/data/xid_catalog.csv`` with its provenance in ``analyzers/data/SOURCES.md``. The
  catalog's ``WORKFLOW_XID_48`` says "Solo: RESET_GPU; w/ 63 or 64: DRAIN_AND_RESET" — applied here
  as a combination rule on top of the per-code action.
* Row remapping: NVIDIA, *GPU Memory Error Management* (docs.nvidia.com/deploy/a100-gpu-mem-error-mgmt/),
  "Error Recovery and Response Flags": a pending remap takes effect at the next GPU reset and does not
  stop running work (so: reset when convenient); the failure flag is defined by the RMA policy
  thresholds (so: send for repair).
* Clock event reasons: NVML ``nvmlClocksEventReason*`` bits (``nvml.h``): 0x1 GpuIdle,
  0x2 ApplicationsClocksSetting, 0x4 SwPowerCap, 0x8 HwSlowdown, 0x10 SyncBoost,
  0x20 SwThermalSlowdown, 0x40 HwThermalSlowdown, 0x80 HwPowerBrakeSlowdown,
  0x100 DisplayClockSetting. DCGM exports the same mask as DCGM_FI_DEV_CLOCKS_EVENT_REASONS.
* PCIe replays and NVLink errors: DCGM's health watches (``DcgmHealthWatch.cpp``, limits in
  ``dcgm_gpu_hardware_limits.h``). PCIe: more than 8 replays per minute ("the maximum recommended by
  RM", ``DCGM_LIMIT_MAX_PCIREPLAY_RATE``) warns ``DCGM_FR_PCI_REPLAY_RATE``, whose triage is to check
  the riser, slot and firmware. NVLink: one or more CRC flit/data errors warns
  ``DCGM_FR_NVLINK_ERROR_THRESHOLD`` (the link still carries work), CRC errors at 100/s or more fail
  (``DCGM_LIMIT_MAX_NVLINK_CRC_ERROR``: "CRC errors only matter at rates of 100+ per second"), and any
  replay or recovery error fails (``DCGM_FR_NVLINK_ERROR_CRITICAL``: run a field diagnostic). Here a
  warning is ``watch`` and a failure ``investigate``; the counts are increases over the window, the
  rates averages over it.
* Counters (ECC, remapped rows, retired pages, violation time, PCIe replays, NVLink errors) are monotonic until the driver
  reloads or someone clears them. Increases follow Prometheus' ``increase()``: a sample lower than
  the one before is a reset, after which the counter counted up from zero to the new value.

Pure: polars frames in, polars frames out. The only file read is the shipped catalog.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from functools import lru_cache
from pathlib import Path

import polars as pl

from fleetscope.core.units import CLOCK_EVENT_BITS
from fleetscope.core.errors import ValidationError
from fleetscope.core.frames import findings_frame, require_columns

__all__ = [
    "NVLINK_COUNTERS",
    "XID_CATALOG_PATH",
    "ACTIONS",
    "CLOCK_EVENT_BITS",
    "THERMAL_MASK",
    "POWER_MASK",
    "xid_catalog",
    "classify_xids",
    "decode_clock_event_reasons",
    "counter_increase",
    "gpu_health",
    "loaded_clock_p90",
    "node_health",
    "health_findings",
]

XID_CATALOG_PATH = Path(__file__).resolve().parent / "data" / "xid_catalog.csv"

# Ordered from least to most disruptive; a GPU's recommendation is the most disruptive one it earned.
ACTIONS: tuple[str, ...] = ("none", "watch", "restart_app", "investigate", "reset_gpu", "drain_node", "send_for_repair")
_RANK = {a: i for i, a in enumerate(ACTIONS)}

THERMAL_MASK = 0x20 | 0x40
POWER_MASK = 0x4 | 0x80
# HwSlowdown (0x8) halves the clock or worse for over-temperature *or* power brake; counted on its own.
HW_SLOWDOWN_MASK = 0x8

# Counters whose increase over the window is reported, and the name of the output column.
_COUNTERS: dict[str, str] = {
    "ecc_sbe_volatile_total": "ecc_sbe",
    "ecc_dbe_volatile_total": "ecc_dbe",
    "retired_sbe_total": "retired_sbe",
    "retired_dbe_total": "retired_dbe",
    "remap_correctable_total": "remap_correctable",
    "remap_uncorrectable_total": "remap_uncorrectable",
    "power_violation_s": "power_violation_s",
    "thermal_violation_s": "thermal_violation_s",
    "pcie_replay_total": "pcie_replay",
    # not gpu_sample columns (dcgm-exporter's DCGM_FI_DEV_NVLINK_*_ERROR_COUNT_TOTAL land in metric_sample):
    # the caller adds them to the samples where it has them
    "nvlink_crc_flit_errors_total": "nvlink_crc_flit_errors",
    "nvlink_crc_data_errors_total": "nvlink_crc_data_errors",
    "nvlink_replay_errors_total": "nvlink_replay_errors",
    "nvlink_recovery_errors_total": "nvlink_recovery_errors",
}
NVLINK_COUNTERS = ("nvlink_crc_flit_errors_total", "nvlink_crc_data_errors_total", "nvlink_replay_errors_total",
                   "nvlink_recovery_errors_total")
PCIE_REPLAY_LIMIT_PER_MIN = 8.0  # DCGM_LIMIT_MAX_PCIREPLAY_RATE
NVLINK_CRC_LIMIT_PER_S = 100.0  # DCGM_LIMIT_MAX_NVLINK_CRC_ERROR


# --- Xid catalog -------------------------------------------------------------------------------


@lru_cache(maxsize=1)
def _catalog_cached() -> pl.DataFrame:
    df = pl.read_csv(XID_CATALOG_PATH, comment_prefix="#", schema_overrides={"code": pl.Int64}, infer_schema_length=0)
    df = df.with_columns(pl.col("code").cast(pl.Int64))
    bad = df.filter(~pl.col("action").is_in(ACTIONS))
    if bad.height:
        raise ValueError(f"{XID_CATALOG_PATH}: unknown action {bad['action'][0]!r} for Xid {bad['code'][0]}")
    return df


def xid_catalog() -> pl.DataFrame:
    """The shipped Xid table: code, mnemonic, description, category, component, NVIDIA's immediate and
    investigatory resolution buckets, Fleetscope's ``action`` and ``severity``."""
    return _catalog_cached().clone()


def classify_xids(health_event: pl.DataFrame, catalog: pl.DataFrame | None = None) -> pl.DataFrame:
    """The ``xid`` rows of a health_event frame joined with the catalog (unknown codes: category
    ``unknown``, action ``investigate``, severity ``warning`` — a code newer than the table deserves a look)."""
    require_columns(health_event, "health_event", ("ts", "kind", "code"))
    cat = catalog if catalog is not None else _catalog_cached()
    x = health_event.filter(pl.col("kind") == "xid")
    for c, default in (("host", ""), ("gpu_uuid", "")):
        if c not in x.columns:
            x = x.with_columns(pl.lit(default).alias(c))
    out = x.join(cat, on="code", how="left")
    return out.with_columns(
        pl.col("category").fill_null("unknown"),
        pl.col("action").fill_null("investigate"),
        pl.col("severity").fill_null("warning"),
        pl.col("mnemonic").fill_null("UNKNOWN_XID"),
    )


# --- clocks and counters ---------------------------------------------------------------------------


def decode_clock_event_reasons(mask: int) -> list[str]:
    """Names of the NVML clock event reasons set in ``mask`` (lowest bit first)."""
    if mask < 0:
        raise ValueError(f"clock event reason mask {mask} is negative")
    return [name for name, bit in CLOCK_EVENT_BITS.items() if mask & bit]


def counter_increase(values: pl.Expr) -> pl.Expr:
    """Increase of a monotonic counter over consecutive samples, counting resets as Prometheus does:
    a drop means the counter restarted from 0, so the increase at that sample is the new value."""
    d = values.diff()
    return pl.when(d < 0).then(values).otherwise(d).fill_null(0).sum()


def _resets(values: pl.Expr) -> pl.Expr:
    return (values.diff() < 0).sum()



def _check_finite(df: pl.DataFrame, frame: str, cols: Sequence[str]) -> None:
    """NaN in a counter would silently poison every sum after it; refuse it naming row and field."""
    for c in cols:
        if c in df.columns and df.schema[c].is_float():
            bad = (df.get_column(c).is_nan() | df.get_column(c).is_infinite()).fill_null(False)
            if bad.any():
                raise ValidationError(f"{df.get_column(c)[int(bad.arg_true()[0])]!r} is not a finite number",
                                      frame=frame, row=int(bad.arg_true()[0]), field=c)


# --- per GPU ------------------------------------------------------------------------------------


def loaded_clock_p90(gpu_sample: pl.DataFrame, load_util_ratio: float = 0.5) -> float | None:
    """The 90th percentile of the SM clock over the samples under load (``util_ratio >= load_util_ratio``):
    what :func:`gpu_health` expects a loaded GPU to hold when not told. Needs ``sm_clock_mhz`` and
    ``util_ratio`` columns (None without them or without a loaded sample)."""
    if "sm_clock_mhz" not in gpu_sample.columns or "util_ratio" not in gpu_sample.columns:
        return None
    loaded = (pl.col("util_ratio") >= load_util_ratio).fill_null(False)
    return gpu_sample.select(pl.col("sm_clock_mhz").filter(loaded).quantile(0.9)).item()


def gpu_health(
    gpu_sample: pl.DataFrame,
    health_event: pl.DataFrame | None = None,
    *,
    gpu_host: pl.DataFrame | None = None,
    expected_sm_clock_mhz: float | Mapping[str, float] | None = None,
    load_util_ratio: float = 0.5,
    low_clock_ratio: float = 0.9,
    sbe_watch_per_h: float = 10.0,
    throttle_watch_ratio: float = 0.05,
    low_clock_watch_ratio: float = 0.1,
    repair_repeat: int = 2,
    expectation_given: bool = False,
) -> pl.DataFrame:
    """Per-GPU health over the window the samples span.

    ``gpu_sample``: canonical gpu_sample rows (``ts``, ``gpu_uuid`` and any of the counter, clock,
    utilisation and throttle fields); samples of one GPU may come in any order. ``health_event``: Xid
    events (kind ``xid``) for the same window. ``gpu_host``: a frame with ``gpu_uuid`` and ``host``
    (the ``gpu`` inventory frame) so node roll-ups know where each GPU sits.

    ``expected_sm_clock_mhz``: the clock a loaded GPU should hold (its max SM clock, e.g. 1980 MHz
    on H100 SXM), as one number or per ``gpu_uuid``; without it the expectation is the 90th
    percentile of loaded clocks across the fleet given (:func:`loaded_clock_p90`), so a GPU slower than its
    peers shows; ``expectation_given``: ``expected_sm_clock_mhz`` is that fleet figure already, None included
    (a sweep split by hosts computes it once over the whole fleet). A sample is "under load" at
    ``util_ratio >= load_util_ratio``.

    Returns one row per GPU: counter increases over the window and per hour (ECC SBE/DBE, retired
    pages, remapped rows), counter resets seen, remap pending / failure flags, throttle ratios
    (share of loaded samples with thermal / power / HW-slowdown reasons; violation seconds per
    second), loaded median SM clock and the share of loaded samples under ``low_clock_ratio`` ×
    expected, Xid counts, a ``score`` (100 healthy … 0), ``recommendation`` (one of ACTIONS) and
    ``reasons`` (why, most severe first).
    """
    require_columns(gpu_sample, "gpu_sample", ("ts", "gpu_uuid"))
    if gpu_sample.height == 0:
        raise ValidationError("no samples to analyse", frame="gpu_sample")
    present = [c for c in _COUNTERS if c in gpu_sample.columns]
    _check_finite(gpu_sample, "gpu_sample", [*present, "util_ratio", "sm_clock_mhz"])
    has_clock = "sm_clock_mhz" in gpu_sample.columns
    util = pl.col("util_ratio") if "util_ratio" in gpu_sample.columns else pl.lit(None, pl.Float64)
    loaded = (util >= load_util_ratio).fill_null(False)
    clock = pl.col("sm_clock_mhz") if has_clock else pl.lit(None, pl.Float64)

    # The clock expectation: given, or the fleet's loaded p90 (so a GPU slower than its peers shows;
    # pass one model's GPUs at a time, or a per-GPU mapping, when models are mixed).
    s = gpu_sample
    if isinstance(expected_sm_clock_mhz, Mapping):
        exp = pl.DataFrame({"gpu_uuid": list(expected_sm_clock_mhz),
                            "expected_sm_clock_mhz": [float(v) for v in expected_sm_clock_mhz.values()]})
        s = s.join(exp, on="gpu_uuid", how="left", maintain_order="left")
        expected = pl.col("expected_sm_clock_mhz")
    elif expected_sm_clock_mhz is None and has_clock and not expectation_given:
        expected = pl.lit(loaded_clock_p90(s, load_util_ratio), pl.Float64)
    else:
        expected = pl.lit(None if expected_sm_clock_mhz is None else float(expected_sm_clock_mhz), pl.Float64)

    per = _aggregate(s, present, loaded, clock, expected, low_clock_ratio)
    if per is None:
        # Counter increases need each GPU's samples contiguous and in time order (the store reads
        # gpu_sample ordered by gpu, ts). Sorting 24 M rows costs more than the analysis, so only here.
        per = _aggregate(s.sort("gpu_uuid", "ts", maintain_order=True), present, loaded, clock, expected, low_clock_ratio)
        assert per is not None

    window_s = (pl.col("window_end") - pl.col("window_start")).dt.total_microseconds() / 1e6
    hours = window_s / 3600
    rate_cols = []
    for name in ("ecc_sbe", "ecc_dbe", "retired_sbe", "retired_dbe", "remap_correctable", "remap_uncorrectable",
                 "pcie_replay", "nvlink_crc_flit_errors", "nvlink_crc_data_errors", "nvlink_replay_errors", "nvlink_recovery_errors"):
        if f"{name}_increase" in per.columns:
            rate_cols.append(pl.when(hours > 0).then(pl.col(f"{name}_increase") / hours).otherwise(None).alias(f"{name}_per_h"))
    for name in ("power_violation_s", "thermal_violation_s"):
        if f"{name}_increase" in per.columns:
            # seconds of violation per second of wall time: the share of time the GPU was held back
            rate_cols.append(pl.when(window_s > 0).then(pl.col(f"{name}_increase") / window_s).otherwise(None)
                             .alias(name.replace("_s", "_ratio")))
    per = per.with_columns(rate_cols)

    # Xids in the window, per GPU and action. Application Xids (13, 31, 43, ...) say the job crashed, not
    # that the GPU is unwell, so they set no GPU action; repeated on one GPU they earn a look
    # (NVIDIA's WORKFLOW_XID_13 / _31: repeats on the same GPU → run diagnostics).
    if health_event is not None and health_event.height:
        x = classify_xids(health_event).filter(pl.col("gpu_uuid") != "")
        hw_repeat = x.filter(pl.col("category") == "hardware").group_by("gpu_uuid", "code").len().group_by("gpu_uuid").agg(
            pl.col("len").max().alias("xid_repeat_max_hw"))
        xa = x.group_by("gpu_uuid").agg(
            pl.len().alias("xid_events"),
            pl.col("code").unique().sort().alias("xid_codes"),
            pl.col("action").filter(pl.col("category") != "application").replace_strict(_RANK, default=0, return_dtype=pl.Int64)
            .max().fill_null(0).alias("_worst"),
            pl.col("code").filter(pl.col("category") == "application").value_counts().struct.field("count").max()
            .fill_null(0).alias("xid_repeat_max_app"),
        ).with_columns(pl.col("_worst").replace_strict(dict(enumerate(ACTIONS)), return_dtype=pl.String).alias("xid_worst_action")).drop("_worst")
        xa = xa.join(hw_repeat, on="gpu_uuid", how="left")
        per = per.join(xa, on="gpu_uuid", how="left")
        if gpu_host is None and "host" in health_event.columns:
            gpu_host = health_event.filter(pl.col("gpu_uuid") != "").select("gpu_uuid", "host").unique("gpu_uuid")
    else:
        per = per.with_columns(pl.lit(None, pl.UInt32).alias("xid_events"), pl.lit(None, pl.List(pl.Int64)).alias("xid_codes"),
                               pl.lit(None, pl.String).alias("xid_worst_action"), pl.lit(None, pl.UInt32).alias("xid_repeat_max_hw"),
                               pl.lit(None, pl.UInt32).alias("xid_repeat_max_app"))
    per = per.with_columns(pl.col(c).fill_null(0) for c in ("xid_events", "xid_repeat_max_hw", "xid_repeat_max_app"))
    if gpu_host is not None:
        require_columns(gpu_host, "gpu", ("gpu_uuid", "host"))
        per = per.join(gpu_host.select("gpu_uuid", "host").unique("gpu_uuid"), on="gpu_uuid", how="left")
    else:
        per = per.with_columns(pl.lit(None, pl.String).alias("host"))

    return _score(per, sbe_watch_per_h=sbe_watch_per_h, throttle_watch_ratio=throttle_watch_ratio,
                  low_clock_watch_ratio=low_clock_watch_ratio, repair_repeat=repair_repeat).sort("gpu_uuid")


_ENGINE = "auto"


_FLAGS = ("remap_pending", "remap_failure", "retired_pending_total")  # states, read as the GPU's last reading


def _aggregate(s: pl.DataFrame, present: list[str], loaded: pl.Expr, clock: pl.Expr, expected: pl.Expr,
               low_clock_ratio: float) -> pl.DataFrame | None:
    """One pass of row-wise expressions, then one group_by of plain sums (polars' fast path).

    Differences are taken between adjacent rows and masked at the first row of each GPU's run, which is
    right only when each GPU is one contiguous, time-ordered run; returns None when it is not."""
    keep = [c for c in ("remap_pending", "remap_failure", "retired_pending_total", "temp_c", "mem_temp_c") if c in s.columns]
    reasons = pl.col("clock_event_reasons") if "clock_event_reasons" in s.columns else pl.lit(None, pl.Int64)
    # Runs of one GPU get an integer id: grouping on it is ~30× faster than hashing 24 M UUID strings.
    base = s.lazy().select(
        "gpu_uuid", "ts", *keep, *present,
        pl.col("gpu_uuid").rle_id().alias("_run"),
        loaded.alias("_loaded"), reasons.alias("_reasons"), clock.alias("_clock"), expected.alias("expected_sm_clock_mhz"),
    ).with_columns((pl.col("_run") != pl.col("_run").shift(1)).fill_null(True).alias("_first"))
    first, ld, rs, ck = pl.col("_first"), pl.col("_loaded"), pl.col("_reasons"), pl.col("_clock")
    row: list[pl.Expr] = [
        (~first & (pl.col("ts") < pl.col("ts").shift(1))).fill_null(False).alias("_back"),
        (((rs & THERMAL_MASK) > 0) & ld).alias("_thermal"),
        (((rs & POWER_MASK) > 0) & ld).alias("_power"),
        (((rs & HW_SLOWDOWN_MASK) > 0) & ld).alias("_hw"),
        (ld & rs.is_not_null()).alias("_reasons_known"),
        ((ck < low_clock_ratio * pl.col("expected_sm_clock_mhz")) & ld).alias("_low_clock"),
        (ld & ck.is_not_null() & pl.col("expected_sm_clock_mhz").is_not_null()).alias("_clock_known"),
        pl.when(ld).then(ck).alias("_loaded_clock"),
    ]
    # A GPU's readings of a counter or flag may be interleaved with rows that lack it: another source's samples
    # (the agent's NVML beside a scraped dcgm-exporter) or a blank. Each reading is compared with the GPU's
    # previous reading, wherever it sat, and a flag's last reading is its last non-null one.
    # A column without nulls (the usual case) takes the plain adjacent-row forms, a fifth of the time.
    run = pl.col("_run")
    for col in present:
        v = pl.col(col)
        if s[col].null_count() == 0:
            d, has_prev = v.diff(), ~first
        else:
            has_prev = (pl.when(v.is_not_null()).then(run).forward_fill().shift(1) == run).fill_null(False)
            d = v - v.forward_fill().shift(1)
        row.append(pl.when(~has_prev | v.is_null()).then(0).when(d < 0).then(v).otherwise(d).alias(f"_inc_{col}"))
        row.append((has_prev & (d < 0)).fill_null(False).alias(f"_reset_{col}"))
    for col in _FLAGS:
        if col in keep:
            v = pl.col(col)
            now = v if s[col].null_count() == 0 else pl.when(pl.when(v.is_not_null()).then(run).forward_fill() == run).then(v.forward_fill())
            row.append(now.alias(f"_now_{col}"))
    d = base.with_columns(row)
    # Plain sums / mins / maxes only: polars runs those on its fast group-by path; ratios come after.
    aggs: list[pl.Expr] = [
        pl.col("gpu_uuid").first(),
        pl.len().alias("samples"),
        pl.col("_back").sum().alias("_backs"),
        pl.col("ts").min().alias("window_start"),
        pl.col("ts").max().alias("window_end"),
        pl.col("_loaded").sum().alias("loaded_samples"),
        *[pl.col(c).sum() for c in ("_thermal", "_power", "_hw", "_reasons_known", "_low_clock", "_clock_known")],
        pl.col("_loaded_clock").median().alias("sm_clock_loaded_median_mhz"),
        pl.col("expected_sm_clock_mhz").first(),
        *[pl.col(f"_reset_{c}").sum() for c in present],
        *[pl.col(f"_inc_{c}").sum().alias(f"{_COUNTERS[c]}_increase") for c in present],
        *[pl.col(f"_now_{c}").last().alias(f"{c}_last") for c in _FLAGS if c in keep],
        *[pl.col(c).max().alias(f"{c}_max") for c in ("temp_c", "mem_temp_c") if c in keep],
    ]
    # Lazy, so the ~25 per-row helper columns over 24 M rows are never all materialised at once.
    per = d.group_by("_run").agg(aggs).collect(engine=_ENGINE)

    def ratio(num: str, den: str) -> pl.Expr:
        return pl.when(pl.col(den) > 0).then(pl.col(num) / pl.col(den)).otherwise(None)

    per = per.with_columns(
        ratio("_thermal", "_reasons_known").alias("thermal_throttle_ratio"),
        ratio("_power", "_reasons_known").alias("power_throttle_ratio"),
        ratio("_hw", "_reasons_known").alias("hw_slowdown_ratio"),
        ratio("_low_clock", "_clock_known").alias("low_clock_ratio"),
        pl.sum_horizontal([pl.col(f"_reset_{c}") for c in present] or [pl.lit(0)]).alias("counter_resets"),
    )
    if (per.get_column("_backs") > 0).any() or per.get_column("gpu_uuid").is_duplicated().any():
        return None  # a GPU in several runs, or time going backwards within one
    return per.drop([c for c in per.columns if c.startswith("_")])


# Score penalties: chosen so a GPU that needs repair scores 0-20, drain 20-50, reset 50-70, watch 70-95.
_PENALTY = {"send_for_repair": 85, "drain_node": 55, "reset_gpu": 35, "investigate": 20, "restart_app": 5, "watch": 10, "none": 0}


def _score(per: pl.DataFrame, *, sbe_watch_per_h: float, throttle_watch_ratio: float, low_clock_watch_ratio: float,
           repair_repeat: int) -> pl.DataFrame:
    """Rules → (action, reason) pairs per GPU; the worst action is the recommendation. Kept in Python
    so the rules read as a list, but only over GPUs with any signal at all: on a healthy fleet that is a
    few rows, not 16,384."""
    def pos(c: str) -> pl.Expr:
        return (pl.col(c).fill_null(0) > 0) if c in per.columns else pl.lit(False)

    notable = pl.any_horizontal(
        pos("xid_events"), pos("ecc_dbe_increase"), pos("remap_pending_last"), pos("remap_failure_last"),
        pos("retired_pending_total_last"), pos("remap_correctable_increase"), pos("remap_uncorrectable_increase"),
        (pl.col("ecc_sbe_per_h").fill_null(0) > sbe_watch_per_h) if "ecc_sbe_per_h" in per.columns else pl.lit(False),
        *[(pl.col(c).fill_null(0) > throttle_watch_ratio) for c in ("thermal_throttle_ratio", "power_throttle_ratio",
                                                                     "hw_slowdown_ratio", "thermal_violation_ratio") if c in per.columns],
        (pl.col("low_clock_ratio").fill_null(0) > low_clock_watch_ratio) if "low_clock_ratio" in per.columns else pl.lit(False),
        *[pos(f"{_COUNTERS[c]}_increase") for c in ("pcie_replay_total", *NVLINK_COUNTERS)],
    )
    per = per.with_columns(notable.alias("_notable"))
    calm = per.filter(~pl.col("_notable")).with_columns(
        pl.lit(100.0).alias("score"), pl.lit("none").alias("recommendation"), pl.lit([], pl.List(pl.String)).alias("reasons"))
    per = per.filter("_notable")
    rows = per.to_dicts()
    recs, scores, why = [], [], []
    for r in rows:
        found: list[tuple[str, str]] = []
        codes = set(r.get("xid_codes") or [])

        def num(k: str) -> float:
            v = r.get(k)
            return float(v) if v is not None else 0.0

        if num("remap_failure_last") > 0 or 64 in codes:
            found.append(("send_for_repair", "row remapping failed (NVIDIA RMA policy; Xid 64 / remap failure flag)"))
        if 157 in codes:
            found.append(("send_for_repair", "resource retirement failed: no spare resources left (Xid 157)"))
        if 79 in codes and r.get("xid_repeat_max_hw", 0) >= repair_repeat:
            found.append(("send_for_repair", f"fell off the bus repeatedly (Xid 79 ×{r['xid_repeat_max_hw']})"))
        elif r.get("xid_repeat_max_hw", 0) >= repair_repeat and r.get("xid_worst_action") in ("reset_gpu", "drain_node"):
            found.append(("send_for_repair", f"hardware Xid recurred {r['xid_repeat_max_hw']}× in the window despite resets"))
        if 48 in codes and (63 in codes or 64 in codes):
            found.append(("drain_node", "double-bit ECC error with a row remap (Xid 48 with 63/64: drain and reset)"))
        if r.get("xid_worst_action") is not None and r["xid_worst_action"] != "none":
            found.append((r["xid_worst_action"], f"Xid {', '.join(str(c) for c in sorted(codes))}"))
        if r.get("xid_repeat_max_app", 0) >= repair_repeat:
            found.append(("investigate", f"application Xid repeated {r['xid_repeat_max_app']}× on this GPU: run diagnostics"))
        if num("ecc_dbe_increase") > 0:
            found.append(("reset_gpu", f"{int(num('ecc_dbe_increase'))} uncorrectable ECC error(s) in the window"))
        if num("remap_pending_last") > 0:
            found.append(("reset_gpu", "row remap pending: takes effect at the next GPU reset"))
        if num("retired_pending_total_last") > 0:
            found.append(("reset_gpu", "retired pages pending: take effect at the next GPU reset"))
        if num("ecc_sbe_per_h") > sbe_watch_per_h:
            found.append(("watch", f"corrected ECC errors at {num('ecc_sbe_per_h'):.1f}/h"))
        if num("remap_correctable_increase") + num("remap_uncorrectable_increase") > 0:
            found.append(("watch", "rows remapped in the window"))
        for k, label in (("thermal_throttle_ratio", "thermal slowdown"), ("power_throttle_ratio", "power capping"),
                         ("hw_slowdown_ratio", "hardware slowdown")):
            if num(k) > throttle_watch_ratio:
                found.append(("watch", f"{label} in {num(k):.0%} of loaded samples"))
        if num("thermal_violation_ratio") > throttle_watch_ratio:
            found.append(("watch", f"thermal violation {num('thermal_violation_ratio'):.0%} of the time"))
        if num("low_clock_ratio") > low_clock_watch_ratio:
            found.append(("watch", f"SM clock under expectation in {num('low_clock_ratio'):.0%} of loaded samples"))
        found.extend(_link_reasons(num))
        found.sort(key=lambda t: -_RANK[t[0]])
        worst = found[0][0] if found else "none"
        # Score: the worst finding's penalty plus a little for each further one, so two problems rank below one.
        penalty = _PENALTY[worst] + sum(min(5, _PENALTY[a] / 4) for a, _ in found[1:])
        recs.append(worst)
        scores.append(max(0.0, 100.0 - penalty))
        why.append([w for _, w in found])
    scored = per.with_columns(
        pl.Series("score", scores, dtype=pl.Float64),
        pl.Series("recommendation", recs, dtype=pl.String),
        pl.Series("reasons", why, dtype=pl.List(pl.String)),
    )
    return pl.concat([scored, calm], how="vertical_relaxed").drop("_notable")


def _link_reasons(num: Callable[[str], float]) -> list[tuple[str, str]]:
    """PCIe replay and NVLink error rules of DCGM's health watches (module docstring)."""
    found: list[tuple[str, str]] = []
    if num("pcie_replay_increase") > 0:
        per_min = num("pcie_replay_per_h") / 60
        if per_min > PCIE_REPLAY_LIMIT_PER_MIN:
            found.append(("investigate", f"PCIe replays at {per_min:.3g}/min, over DCGM's limit of "
                                         f"{PCIE_REPLAY_LIMIT_PER_MIN:g}/min: check the riser, slot and firmware"))
        else:
            found.append(("watch", f"{int(num('pcie_replay_increase'))} PCIe replay(s) in the window ({per_min:.3g}/min)"))
    crc = num("nvlink_crc_flit_errors_increase") + num("nvlink_crc_data_errors_increase")
    if crc > 0:
        per_s = (num("nvlink_crc_flit_errors_per_h") + num("nvlink_crc_data_errors_per_h")) / 3600
        if per_s >= NVLINK_CRC_LIMIT_PER_S:
            found.append(("investigate", f"NVLink CRC errors at {per_s:.3g}/s, over DCGM's limit of "
                                         f"{NVLINK_CRC_LIMIT_PER_S:g}/s: inspect the cables and backplane"))
        else:
            found.append(("watch", f"{int(crc)} NVLink CRC error(s) in the window ({per_s:.3g}/s)"))
    for name, label in (("nvlink_replay_errors", "replay"), ("nvlink_recovery_errors", "recovery")):
        if num(f"{name}_increase") > 0:
            found.append(("investigate", f"{int(num(f'{name}_increase'))} NVLink {label} error(s) in the window: "
                                         "run a field diagnostic"))
    return found


# --- per node -----------------------------------------------------------------------------------


def node_health(gpu: pl.DataFrame, *, cooling_share: float = 0.5) -> pl.DataFrame:
    """Roll per-GPU health (``gpu_health`` output) up to hosts.

    A node's score is its worst GPU's score; it must be drained when any GPU needs draining or repair
    (a GPU cannot be swapped under a running job), and a reset of one GPU takes the node's job down, so
    a node inherits ``reset_gpu``. When at least ``cooling_share`` of a node's GPUs throttle thermally the
    cause is likely the node's cooling, not the GPUs: the node gets a reason saying so.
    """
    require_columns(gpu, "gpu_health", ("gpu_uuid", "host", "score", "recommendation"))
    g = gpu.filter(pl.col("host").is_not_null())
    thermal = (pl.col("thermal_throttle_ratio").fill_null(0) > 0.05) if "thermal_throttle_ratio" in g.columns else pl.lit(False)
    out = g.group_by("host").agg(
        pl.len().alias("gpus"),
        pl.col("score").min().alias("score"),
        pl.col("score").mean().alias("score_mean"),
        pl.col("recommendation").replace_strict(_RANK, return_dtype=pl.Int64).max().alias("_worst"),
        pl.col("gpu_uuid").filter(pl.col("recommendation") != "none").sort().alias("gpus_flagged"),
        thermal.mean().alias("thermal_gpu_share"),
    )
    out = out.with_columns(
        pl.col("_worst").replace_strict(dict(enumerate(ACTIONS)), return_dtype=pl.String).alias("gpu_worst"),
    ).with_columns(
        pl.when(pl.col("gpu_worst").is_in(["drain_node", "send_for_repair"])).then(pl.lit("drain_node"))
        .otherwise(pl.col("gpu_worst")).alias("recommendation"),
        pl.when(pl.col("thermal_gpu_share") >= cooling_share)
        .then(pl.lit("most GPUs throttle thermally: check the node's cooling"))
        .otherwise(None).alias("node_reason"),
    ).drop("_worst")
    return out.sort("host")


# --- findings -----------------------------------------------------------------------------------


def health_findings(gpu: pl.DataFrame, node: pl.DataFrame | None = None, *, window_start: datetime | None = None,
                    window_end: datetime | None = None) -> pl.DataFrame:
    """Findings (canonical ``finding`` frame) for every GPU and node whose recommendation is not ``none``.

    Severity: ``critical`` for drain / repair, ``warning`` for reset / investigate / restart, ``info``
    for watch. The evidence is the GPU's row (counters, ratios, Xids) as JSON.
    """
    require_columns(gpu, "gpu_health", ("gpu_uuid", "score", "recommendation", "reasons"))
    sev = {"send_for_repair": "critical", "drain_node": "critical", "reset_gpu": "warning", "investigate": "warning",
           "restart_app": "warning", "watch": "info"}
    rows = []
    for r in gpu.filter(pl.col("recommendation") != "none").to_dicts():
        ws = window_start or r.get("window_start")
        we = window_end or r.get("window_end")
        rec = r["recommendation"]
        reasons = r.get("reasons") or []
        evidence = {k: v for k, v in r.items() if k not in ("window_start", "window_end") and v is not None}
        rows.append({
            "analyzer": "health", "kind": f"gpu_{rec}", "subject": f"gpu:{r['gpu_uuid']}",
            "window_start": ws, "window_end": we, "severity": sev[rec], "score": float(r["score"]),
            "summary": f"GPU {r['gpu_uuid']}{' on ' + r['host'] if r.get('host') else ''}: {rec.replace('_', ' ')} — "
                       f"{reasons[0] if reasons else 'see evidence'}.",
            "evidence": json.dumps(evidence, default=str, sort_keys=True),
        })
    if node is not None:
        for r in node.filter(pl.col("recommendation").is_in(["drain_node", "reset_gpu"]) | pl.col("node_reason").is_not_null()).to_dicts():
            rec = r["recommendation"]
            rows.append({
                "analyzer": "health", "kind": f"node_{rec}" if rec != "none" else "node_cooling", "subject": f"host:{r['host']}",
                "window_start": window_start or gpu.get_column("window_start").min(),
                "window_end": window_end or gpu.get_column("window_end").max(),
                "severity": sev.get(rec, "info"), "score": float(r["score"]),
                "summary": f"Host {r['host']}: {rec.replace('_', ' ')} ({len(r['gpus_flagged'])} of {r['gpus']} GPUs flagged"
                           f"{'; ' + r['node_reason'] if r.get('node_reason') else ''}).",
                "evidence": json.dumps({k: v for k, v in r.items() if v is not None}, default=str, sort_keys=True),
            })
    return findings_frame(rows)


def throttle_findings(gpu: pl.DataFrame, *, thermal_ratio: float = 0.2, window_start: datetime | None = None,
                      window_end: datetime | None = None) -> pl.DataFrame:
    """``thermal_throttle`` findings (warning) for GPUs held back by heat in at least ``thermal_ratio`` of
    their loaded samples or of the window's time (the SW/HW thermal slowdown clock-event reasons, NVML's
    ``nvmlClocksEventReasons``; DCGM's thermal violation counter). Distinct from the health score's
    ``gpu_watch``: a watch is for a person to look at, a throttle slows the whole job the GPU is in (a
    synchronous collective waits for its slowest rank), so it is what the thermal alert pages on."""
    require_columns(gpu, "gpu_health", ("gpu_uuid",))
    ratios = [c for c in ("thermal_throttle_ratio", "thermal_violation_ratio") if c in gpu.columns]
    if not ratios or gpu.height == 0:
        return findings_frame([])
    hot = gpu.with_columns(pl.max_horizontal([pl.col(c).fill_null(0) for c in ratios]).alias("_ratio")).filter(pl.col("_ratio") >= thermal_ratio)
    rows = []
    for r in hot.to_dicts():
        where = f" on {r['host']}" if r.get("host") else ""
        rows.append({
            "analyzer": "health", "kind": "thermal_throttle", "subject": f"gpu:{r['gpu_uuid']}",
            "window_start": window_start or r.get("window_start"), "window_end": window_end or r.get("window_end"),
            "severity": "warning", "score": float(r["_ratio"]),
            "summary": f"GPU {r['gpu_uuid']}{where} throttled by heat in {r['_ratio']:.0%} of the window.",
            "evidence": json.dumps({k: r.get(k) for k in ("host", *ratios, "sm_clock_loaded_median_mhz", "low_clock_ratio") if r.get(k) is not None},
                                   default=str, sort_keys=True),
        })
    return findings_frame(rows)

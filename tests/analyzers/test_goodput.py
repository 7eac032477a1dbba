"""analyzers.goodput: ml-goodput-measurement's worked examples, each badput bucket, windows, scheduling,
program and ML Productivity goodput, and bad input."""

from __future__ import annotations

import json
import math
from datetime import datetime, timedelta, timezone

import polars as pl
import pytest

from analyzers import goodput as g
from fleetscope.core.frames import JOB_EVENT, STEP, UTC_US

T0 = datetime(2024, 1, 1, 1, tzinfo=timezone.utc)


def events(rows, job="j1") -> pl.DataFrame:
    """rows: (seconds after T0, kind, step, payload dict or None[, rank])."""
    recs = []
    for r in rows:
        t, kind, step, payload = r[:4]
        recs.append({"job_id": job, "ts": T0 + timedelta(seconds=t), "kind": kind, "rank": r[4] if len(r) > 4 else -1,
                     "step": step, "payload": json.dumps(payload) if payload is not None else None})
    return pl.DataFrame(recs, schema=JOB_EVENT.schema)


def simple_job(end=20.0):
    # ml-goodput-measurement's _mock_sample_program: start at 0, 5 s program startup, 5 steps of 3 s
    return events([(0, "started", None, None)] + [(5 + 3 * i, "step", i, None) for i in range(5)] + [(end, "finished", None, None)])


# the library's GoodputDisruptionPartialRestartTest.test_goodput_with_startup_badput, made deterministic:
# first step of each attempt 5 s slower (compilation), a 5 s disruption after step 4 started, restart from
# step 2's checkpoint, and the job's end recorded when step 4 completes.
RESTART_ROWS = [
    (0, "started", None, None), (5, "step", 0, None), (13, "step", 1, None), (16, "step", 2, None),
    (19, "step", 3, None), (22, "step", 4, None),
    (30, "started", None, None), (35, "step", 2, None), (43, "step", 3, None), (46, "step", 4, None),
    (49, "finished", None, None),
]


# --- the library's worked examples ---------------------------------------------------------------


def test_library_example_five_steps_is_75_percent():
    r = g.runtime_goodput(simple_job())
    assert round(100 * r.goodput_ratio, 3) == 75.000
    assert r.total_s == 20.0 and r.productive_s == 15.0
    # the 5 s before the first step was not recorded as anything: the library's OTHER
    assert r.badput_s["other"] == 5.0
    assert r.last_step == 4


def test_library_restart_scenario_is_30_612_percent():
    r = g.runtime_goodput(events(RESTART_ROWS))
    assert round(100 * r.goodput_ratio, 3) == 30.612
    assert r.productive_s == 15.0 and r.total_s == 49.0
    assert r.badput_s["program_startup"] == 10.0  # 5 s extra on the first step of each attempt
    assert r.badput_s["wasted_progress"] == 6.0  # steps 2 and 3 were done twice
    assert r.badput_s["infrastructure_recovery"] == 8.0  # last sign of life (step 4 start, 22 s) to restart (30 s)
    assert r.badput_s["other"] == 10.0  # start → first step, twice
    assert r.disruptions == 1
    assert r.productive_s + sum(r.badput_s.values()) == r.total_s


def test_failure_event_moves_the_cut_from_last_sign_of_life():
    rows = RESTART_ROWS[:6] + [(25, "failure", None, {"cause": "xid_79"})] + RESTART_ROWS[6:]
    r = g.runtime_goodput(events(rows))
    assert r.badput_s["wasted_progress"] == 9.0  # steps 2, 3 and the cut-short step 4 (22 → 25 s)
    assert r.badput_s["infrastructure_recovery"] == 5.0
    assert round(100 * r.goodput_ratio, 3) == 30.612


# --- each bucket, hand-built ---------------------------------------------------------------------


def test_initialization_and_training_preparation():
    rows = [(0, "started", None, None), (2, "initialized", None, None)] + [(5 + 3 * i, "step", i, None) for i in range(5)] + [(20, "finished", None, None)]
    r = g.runtime_goodput(events(rows))
    assert r.badput_s["initialization"] == 2.0
    assert r.badput_s["training_preparation"] == 3.0
    assert r.badput_s["other"] == 0.0


def test_checkpoint_save_and_restore_are_carved_out():
    rows = [(0, "started", None, None), (1, "initialized", None, None), (2, "checkpoint_restore_start", None, None),
            (4, "checkpoint_restore_end", None, None)] + [(5 + 3 * i, "step", i, None) for i in range(5)] + [
        (9, "checkpoint_save_start", 1, None), (10.5, "checkpoint_save_end", 1, None), (20, "finished", None, None)]
    r = g.runtime_goodput(events(rows))
    assert r.badput_s["checkpoint_restore"] == 2.0
    assert r.badput_s["training_preparation"] == 2.0  # 1 → 5 s less the restore
    assert r.badput_s["checkpoint_save"] == 1.5
    assert r.productive_s == 13.5


def test_synchronous_data_loading_from_step_payload():
    rows = [(0, "started", None, None)] + [(5 + 3 * i, "step", i, {"data_loading_s": 0.5} if i else None) for i in range(5)] + [(20, "finished", None, None)]
    r = g.runtime_goodput(events(rows))
    assert r.badput_s["data_loading"] == 2.0  # four loads of 0.5 s before steps 1-4
    assert r.productive_s == 13.0


def test_resume_past_the_cut_step_credits_it_sequential_mode():
    # the checkpoint held step 4: resume at 5. Step 4 is credited a typical 3 s, the rest of its span wasted.
    rows = RESTART_ROWS[:6] + [(27, "failure", None, None), (30, "restart", None, None), (35, "step", 5, None), (38, "finished", None, None)]
    r = g.runtime_goodput(events(rows))
    assert r.badput_s["wasted_progress"] == pytest.approx(2.0)  # 22 → 27 s less a 3 s credit
    assert r.badput_s["infrastructure_recovery"] == 3.0
    tl = g.goodput_timeline(events(rows))
    assert tl.filter((pl.col("step") == 4) & (pl.col("bucket") == "productive"))["duration_s"].sum() == 3.0


def test_step_start_from_payload_span_and_several_ranks():
    # a step event's ts is the step's end when it carries duration_s; ranks reporting the same step
    # collapse to the earliest start
    rows = [(0, "started", None, None)]
    for i in range(5):
        rows.append((8 + 3 * i, "step", i, {"duration_s": 3.0}, 0))
        rows.append((8.2 + 3 * i, "step", i, {"duration_s": 3.1}, 1))
    rows.append((20, "finished", None, None))
    assert round(100 * g.runtime_goodput(events(rows)).goodput_ratio, 3) == 75.000


def test_buckets_sum_to_total_and_timeline_tiles():
    tl = g.goodput_timeline(events(RESTART_ROWS))
    assert set(tl["bucket"]) <= set(g.BUCKETS)
    s, e = tl["start"].to_list(), tl["end"].to_list()
    assert all(e[i] == s[i + 1] for i in range(len(s) - 1)), "spans must tile the runtime without gaps or overlaps"
    assert (tl["end"].max() - tl["start"].min()).total_seconds() == tl["duration_s"].sum() == 49.0


# --- windows and step-time deviation --------------------------------------------------------------


def test_interval_goodput_clips_the_timeline():
    r = g.runtime_goodput(simple_job(), window_start=T0 + timedelta(seconds=10), window_end=T0 + timedelta(seconds=20))
    assert r.total_s == 10.0 and r.productive_s == 10.0
    r = g.runtime_goodput(simple_job(), window_start=T0, window_end=T0 + timedelta(seconds=10))
    assert r.goodput_ratio == 0.5


def test_rolling_goodput_windows():
    df = g.rolling_goodput(events(RESTART_ROWS), every_s=10, period_s=20)
    assert df["window_start"].to_list()[:2] == [T0, T0 + timedelta(seconds=10)]
    assert df["total_s"].to_list() == [20.0, 20.0, 20.0, 19.0, 9.0]
    assert df["productive_s"].to_list() == [6.0, 6.0, 0.0, 9.0, 9.0]
    bucket_cols = [f"{b}_s" for b in g.BUCKETS]
    sums = df.select(pl.sum_horizontal(bucket_cols)).to_series().to_list()
    assert sums == df["total_s"].to_list()


def test_step_time_deviation_uses_median_plus_3_mad():
    dev = g.step_time_deviation(events(RESTART_ROWS))
    assert dev["ideal_step_time_s"][0] == 3.0  # 8 s first steps are anomalous (median 3, MAD 0)
    assert dev.filter(pl.col("step") == 0)["deviation_s"][0] == 5.0
    assert g.ideal_step_time([1.0, 1.0, 1.2, 10.0]) == pytest.approx((1.0 + 1.0 + 1.2) / 3)
    with pytest.raises(ValueError, match="finite"):
        g.ideal_step_time([1.0, math.nan])


# --- scheduling, program, ML productivity ---------------------------------------------------------


def test_scheduling_goodput_from_allocations():
    rows = [(0, "allocated", None, None), (10, "started", None, None), (40, "preempted", None, None),
            (60, "allocated", None, None), (100, "finished", None, None)]
    ev = events(rows)
    assert g.scheduling_goodput(ev) == pytest.approx(80 / 100)
    assert g.scheduling_goodput(ev, submitted_at=T0 - timedelta(seconds=100)) == pytest.approx(80 / 200)


@pytest.mark.parametrize("nvml, row, bf16", [
    ("NVIDIA H100 80GB HBM3", "H100-SXM5-80GB", 989.5e12),  # dcgm-exporter's modelName in the real captures
    ("NVIDIA H100 PCIe", "H100-PCIE-80GB", 756.5e12),
    ("NVIDIA A100-SXM4-80GB", "A100-SXM4-80GB", 312e12),
    ("nvidia  l40s", "L40S", 366.5e12),
    ("H200-SXM-141GB", "H200-SXM-141GB", 989.5e12),
])
def test_nvml_names_map_to_their_datasheet_rows(nvml, row, bf16):
    assert g.peak_table_name(nvml) == row and g.gpu_peak_flops(row, "bf16") == bf16


@pytest.mark.parametrize("name", ["NVIDIA H100", "H100", "", "NVIDIA GeForce RTX 4090"])
def test_unknown_or_ambiguous_models_are_refused_not_guessed(name):
    with pytest.raises(ValueError, match="not in gpu_peaks.csv"):
        g.peak_table_name(name)


def test_gpu_peaks_table_and_lookup():
    peaks = g.load_gpu_peaks()
    assert peaks["source"].null_count() == 0 and peaks["source"].str.contains("datasheet").all()
    for name in ("A100-SXM4-40GB", "A100-SXM4-80GB", "H100-SXM5-80GB", "H100-PCIE-80GB", "H200-SXM-141GB",
                 "B200-SXM-180GB", "L4", "L40S", "V100-SXM2-32GB", "T4"):
        assert name in peaks["gpu"].to_list()
    assert g.gpu_peak_flops("H100-SXM", "bf16") == 989.5e12
    assert g.gpu_peak_flops("a100-sxm4-80gb", "tf32") == 156e12
    assert g.gpu_peak_flops("V100-SXM2-32GB", "fp64") == 7.8e12  # no FP64 tensor core: the vector rate
    with pytest.raises(ValueError, match="matches 2 rows"):
        g.gpu_peak_flops("A100-SXM4")
    with pytest.raises(ValueError, match="no fp8"):
        g.gpu_peak_flops("A100-SXM4-80GB", "fp8")


def test_program_goodput_is_mfu_and_product():
    st = pl.DataFrame({
        "job_id": ["j"] * 2, "rank": [0, 1], "step": [0, 0],
        "start": [T0, T0], "end": [T0 + timedelta(seconds=2)] * 2,
        "model_flops": [989.5e12, 989.5e12],  # half of 2 s at peak on each rank
    }).with_columns(pl.col("start").cast(UTC_US), pl.col("end").cast(UTC_US))
    mfu = g.program_goodput(st, peak_flops=g.gpu_peak_flops("H100-SXM5-80GB", "bf16"))
    assert mfu == pytest.approx(0.5)
    assert g.ml_productivity_goodput(0.8, 0.75, mfu) == pytest.approx(0.3)
    with pytest.raises(ValueError, match="ratio"):
        g.ml_productivity_goodput(1.2, 0.5, 0.5)
    with pytest.raises(ValueError, match="NaN"):
        g.program_goodput(st.with_columns(pl.lit(math.nan).alias("model_flops")), peak_flops=1e12)


# --- bad input ------------------------------------------------------------------------------------


def test_empty_frame_and_missing_columns():
    with pytest.raises(ValueError, match="empty"):
        g.runtime_goodput(JOB_EVENT.empty())
    with pytest.raises(ValueError, match="lacks column"):
        g.runtime_goodput(simple_job().drop("kind"))
    with pytest.raises(ValueError, match="lacks column"):
        g.program_goodput(STEP.empty().drop("model_flops"), peak_flops=1e12)


def test_unknown_kind_and_several_jobs():
    bad = simple_job().with_columns(pl.when(pl.col("kind") == "finished").then(pl.lit("done")).otherwise(pl.col("kind")).alias("kind"))
    with pytest.raises(ValueError, match="unknown job event kind 'done'"):
        g.runtime_goodput(bad)
    with pytest.raises(ValueError, match="2 jobs"):
        g.runtime_goodput(pl.concat([simple_job(), events([(0, "started", None, None)], job="j2")]))


def test_events_out_of_order_give_the_same_answer():
    ev = events(RESTART_ROWS)
    shuffled = ev.sample(fraction=1.0, shuffle=True, seed=7)
    assert shuffled["ts"].to_list() != ev["ts"].to_list()
    assert g.runtime_goodput(shuffled) == g.runtime_goodput(ev)


def test_inconsistent_sequences_raise():
    with pytest.raises(ValueError, match="before the job's first 'started'"):
        g.runtime_goodput(events([(1, "step", 0, None), (2, "started", None, None), (5, "finished", None, None)]))
    with pytest.raises(ValueError, match="without a start"):
        g.runtime_goodput(events([(0, "started", None, None), (1, "checkpoint_save_end", None, None), (5, "finished", None, None)]))
    with pytest.raises(ValueError, match="no 'finished'"):
        g.runtime_goodput(events([(0, "started", None, None), (1, "step", 0, None)]))
    with pytest.raises(ValueError, match="no 'started'"):
        g.runtime_goodput(events([(1, "step", 0, None), (5, "finished", None, None)]))


def test_non_finite_payload_number_raises():
    ev = simple_job().with_columns(
        pl.when(pl.col("step") == 2).then(pl.lit('{"data_loading_s": NaN}')).otherwise(pl.col("payload")).alias("payload"))
    with pytest.raises(ValueError, match="not JSON|finite"):
        g.runtime_goodput(ev)
    ev = simple_job().with_columns(
        pl.when(pl.col("step") == 2).then(pl.lit('{"data_loading_s": -1}')).otherwise(pl.col("payload")).alias("payload"))
    with pytest.raises(ValueError, match="finite number ≥ 0"):
        g.runtime_goodput(ev)


def test_running_job_measured_until():
    ev = simple_job().filter(pl.col("kind") != "finished")
    r = g.runtime_goodput(ev, until=T0 + timedelta(seconds=20))
    assert round(100 * r.goodput_ratio, 3) == 75.000

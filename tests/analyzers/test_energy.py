"""analyzers.energy: counter vs integration, resets, gaps, flagging, attribution, productivity, bad input."""

from __future__ import annotations

import datetime as dt

import polars as pl
import pytest

from analyzers import energy as E
from fleetscope.core.errors import ValidationError
from fleetscope.sim import FleetSpec, gpu_fleet

T0 = dt.datetime(2025, 3, 1, tzinfo=dt.timezone.utc)


def at(s: float) -> dt.datetime:
    return T0 + dt.timedelta(seconds=s)


def samples(rows: list[tuple]) -> pl.DataFrame:
    """rows: (seconds, gpu, power_w, energy_j)."""
    return pl.DataFrame(
        {
            "ts": [at(r[0]) for r in rows],
            "gpu_uuid": [r[1] for r in rows],
            "power_w": [r[2] for r in rows],
            "energy_j": [r[3] for r in rows],
        },
        schema={"ts": pl.Datetime("us", "UTC"), "gpu_uuid": pl.String, "power_w": pl.Float64, "energy_j": pl.Float64},
    )


# --- counter vs integration on a simulated run ----------------------------------------------------


def test_counter_and_power_integration_agree_within_1pct_on_simulated_run():
    b = gpu_fleet(FleetSpec(sites=1, nodes_per_site=2, interval_s=10, seed=3), T0, 2 * 3600)
    by_counter = E.energy_rollup(b.gpu_sample)
    by_power = E.energy_rollup(b.gpu_sample.drop("energy_j"))
    assert set(by_counter.minutes["method"].unique()) == {E.METHOD_COUNTER}
    assert set(by_power.minutes["method"].unique()) == {E.METHOD_POWER}
    c = by_counter.gpus.sort("gpu_uuid")["energy_j"]
    p = by_power.gpus.sort("gpu_uuid")["energy_j"]
    assert ((c - p).abs() / c).max() < 0.01
    assert abs(c.sum() - p.sum()) / c.sum() < 0.01
    assert by_counter.gpus["status"].unique().to_list() == ["measured"]


def test_rollup_is_the_same_however_the_data_is_cut():
    b = gpu_fleet(FleetSpec(sites=1, nodes_per_site=1, interval_s=7, seed=5), T0, 1800)
    whole = E.energy_rollup(b.gpu_sample, window_start=at(0), window_end=at(1200)).minutes
    parts = []
    for lo, hi in ((0, 420), (420, 1200)):
        # each window reads one scrape interval either side, as an incremental run would
        chunk = b.gpu_sample.filter((pl.col("ts") >= at(lo - 7)) & (pl.col("ts") <= at(hi + 7)))
        parts.append(E.energy_rollup(chunk, window_start=at(lo), window_end=at(hi)).minutes)
    cut = pl.concat(parts).sort("minute", "gpu_uuid")
    assert cut.height == whole.height
    assert cut["energy_j"].to_list() == pytest.approx(whole["energy_j"].to_list(), rel=1e-9)
    assert cut["covered_s"].to_list() == pytest.approx([60.0] * cut.height)


# --- hand-built cases -----------------------------------------------------------------------------


def test_counter_reset_starts_a_new_segment_and_power_fills_the_interval():
    rows = [(t, "g", 100.0, 1000.0 + 100.0 * t) for t in range(0, 31, 10)]  # 1000 .. 4000
    rows += [(40, "g", 100.0, 50.0), (50, "g", 100.0, 1050.0), (60, "g", 100.0, 2050.0)]  # driver reload
    r = E.energy_rollup(samples(rows))
    g = r.gpus.row(0, named=True)
    assert g["counter_resets"] == 1
    assert g["counter_energy_j"] == pytest.approx(3000.0 + 2000.0)
    assert g["integrated_energy_j"] == pytest.approx(1000.0)  # 30 s -> 40 s from power
    assert g["energy_j"] == pytest.approx(6000.0)
    assert g["method"] == E.METHOD_BOTH
    assert r.events.filter(pl.col("kind") == "counter_reset").height == 1


def test_counter_reset_without_power_is_uncovered_not_guessed():
    rows = [(0, "g", None, 500.0), (10, "g", None, 1500.0), (20, "g", None, 10.0), (30, "g", None, 1010.0)]
    g = E.energy_rollup(samples(rows)).gpus.row(0, named=True)
    assert g["energy_j"] == pytest.approx(2000.0)
    assert g["covered_s"] == pytest.approx(20.0) and g["uncovered_s"] == pytest.approx(10.0)
    assert g["status"] == "partial"


def test_power_gap_longer_than_threshold_is_not_bridged():
    rows = [(0, "g", 200.0, None), (10, "g", 200.0, None), (200, "g", 200.0, None), (210, "g", 200.0, None)]
    r = E.energy_rollup(samples(rows), max_power_gap_s=60)
    g = r.gpus.row(0, named=True)
    assert g["energy_j"] == pytest.approx(200.0 * 20)
    assert g["covered_s"] == pytest.approx(20.0)
    assert g["uncovered_s"] == pytest.approx(190.0)
    assert g["method"] == E.METHOD_POWER
    assert r.events.filter(pl.col("kind") == "power_gap")["value"].to_list() == [190.0]
    # with a larger threshold the gap is bridged
    assert E.energy_rollup(samples(rows), max_power_gap_s=300).gpus["energy_j"][0] == pytest.approx(200.0 * 210)


def test_counter_bridges_missed_scrapes_exactly():
    rows = [(0, "g", None, 0.0), (600, "g", None, 6000.0), (610, "g", None, 6100.0)]
    r = E.energy_rollup(samples(rows))
    assert r.gpus["energy_j"][0] == pytest.approx(6100.0)
    # spread evenly: 10 J/s over minutes 0..9, then the last interval in minute 10
    assert r.minutes["energy_j"].to_list() == pytest.approx([600.0] * 10 + [100.0])


def test_trapezoid_split_across_a_minute_boundary_is_exact():
    # power ramps 0 -> 120 W over 50 s -> 110 s; minute boundary at 60 s
    r = E.energy_rollup(samples([(50, "g", 0.0, None), (110, "g", 120.0, None)]))
    m = r.minutes.sort("minute")
    # p(60) = 20 W: [50,60] = 10*(0+20)/2 = 100 J; [60,110] = 50*(20+120)/2 = 3500 J
    assert m["energy_j"].to_list() == pytest.approx([100.0, 3500.0])
    assert m["covered_s"].to_list() == pytest.approx([10.0, 50.0])


def test_gpu_with_neither_counter_nor_power_is_flagged_never_zero():
    df = samples([(0, "a", 100.0, None), (10, "a", 100.0, None), (0, "b", None, None), (10, "b", None, None)])
    r = E.energy_rollup(df)
    b = r.gpus.filter(pl.col("gpu_uuid") == "b").row(0, named=True)
    assert b["energy_j"] is None and b["status"] == "no_energy_data" and b["method"] is None
    inv = pl.DataFrame({"gpu_uuid": ["a", "b", "c"]})
    tot = E.gpu_energy(r.minutes, window_start=at(0), window_end=at(10), gpu=inv)
    assert tot.filter(pl.col("gpu_uuid") == "a")["energy_j"][0] == pytest.approx(1000.0)
    for gid in ("b", "c"):
        row = tot.filter(pl.col("gpu_uuid") == gid).row(0, named=True)
        assert row["energy_j"] is None and row["status"] == "no_data"


def test_implausible_counter_step_is_refused():
    rows = [(0, "g", 100.0, 0.0), (10, "g", 100.0, 1000.0), (20, "g", 100.0, 9e9), (30, "g", 100.0, 9e9 + 1000)]
    r = E.energy_rollup(samples(rows), max_power_w=3000)
    assert r.gpus["energy_j"][0] == pytest.approx(3000.0)  # glitch interval taken from power
    assert r.events["kind"].to_list() == ["counter_implausible"]


# --- bad input -----------------------------------------------------------------------------------


def test_empty_frame_gives_empty_results():
    r = E.energy_rollup(samples([]))
    assert r.minutes.height == 0 and r.gpus.height == 0
    assert r.minutes.schema == pl.Schema(E.ENERGY_MINUTE_SCHEMA)
    assert E.attribute_to_jobs(r.minutes, pl.DataFrame(schema={"job_id": pl.String, "rank": pl.Int64, "start": pl.Datetime("us", "UTC"), "gpu_uuid": pl.String})).height == 0


def test_nan_counts_as_missing_and_negative_values_are_dropped_and_reported():
    rows = [(0, "g", 100.0, None), (10, "g", float("nan"), None), (20, "g", 100.0, None), (30, "g", -5.0, None), (40, "g", 100.0, None)]
    r = E.energy_rollup(samples(rows))
    g = r.gpus.row(0, named=True)
    assert g["energy_j"] == pytest.approx(4000.0)  # 0->20 and 20->40 bridged (20 s <= 60 s)
    assert g["invalid_values"] == 2
    assert r.events.filter(pl.col("kind") == "invalid_value").height == 2


def test_negative_counter_is_invalid_not_a_reset():
    rows = [(0, "g", None, 100.0), (10, "g", None, -50.0), (20, "g", None, 300.0)]
    g = E.energy_rollup(samples(rows)).gpus.row(0, named=True)
    assert g["energy_j"] == pytest.approx(200.0) and g["counter_resets"] == 0 and g["invalid_values"] == 1


def test_clear_errors_for_missing_or_naive_columns():
    with pytest.raises(ValidationError, match="gpu_uuid"):
        E.energy_rollup(pl.DataFrame({"ts": [at(0)], "power_w": [1.0]}))
    with pytest.raises(ValidationError, match="time zone"):
        E.energy_rollup(pl.DataFrame({"ts": [dt.datetime(2025, 1, 1)], "gpu_uuid": ["g"], "power_w": [1.0]}))
    with pytest.raises(ValidationError, match="row 1"):
        E.energy_rollup(pl.DataFrame({"ts": [at(0), None], "gpu_uuid": ["g", "g"], "power_w": [1.0, 1.0]},
                                     schema={"ts": pl.Datetime("us", "UTC"), "gpu_uuid": pl.String, "power_w": pl.Float64}))
    with pytest.raises(ValidationError, match="window_end"):
        E.energy_rollup(samples([(0, "g", 1.0, None)]), window_start=at(10), window_end=at(0))


# --- attribution ---------------------------------------------------------------------------------


def _flat(gpus: list[str], seconds: int, watts: float = 100.0) -> pl.DataFrame:
    return samples([(t, g, watts, watts * t) for g in gpus for t in range(0, seconds + 1, 10)])


def test_attribution_follows_a_rank_that_moves_gpus_and_conserves_energy():
    minutes = E.energy_rollup(_flat(["g1", "g2"], 600)).minutes  # 10 minutes, 6000 J per minute per GPU
    jr = pl.DataFrame(
        {
            "job_id": ["j", "j"],
            "rank": [0, 0],
            "start": [at(0), at(270)],
            "end": [at(270), None],  # moved from g1 to g2 at 4:30, still running
            "gpu_uuid": ["g1", "g2"],
        },
        schema={"job_id": pl.String, "rank": pl.Int64, "start": pl.Datetime("us", "UTC"), "end": pl.Datetime("us", "UTC"), "gpu_uuid": pl.String},
    )
    att = E.attribute_to_jobs(minutes, jr)
    assert att["energy_j"].sum() == pytest.approx(minutes["energy_j"].sum())
    s = E.energy_summary(att, ["job_id", "gpu_uuid"])
    get = lambda j, g: s.filter((pl.col("job_id").eq_missing(j)) & (pl.col("gpu_uuid") == g))["energy_j"][0]  # noqa: E731
    assert get("j", "g1") == pytest.approx(100.0 * 270)
    assert get("j", "g2") == pytest.approx(100.0 * 330)
    assert get(None, "g1") == pytest.approx(100.0 * 330)  # idle after the rank left
    assert get(None, "g2") == pytest.approx(100.0 * 270)  # idle before it arrived
    job = E.energy_summary(att, ["job_id"]).filter(pl.col("job_id") == "j").row(0, named=True)
    assert job["energy_j"] == pytest.approx(60000.0) and job["allocated_s"] == pytest.approx(600.0)
    assert job["method"] == E.METHOD_COUNTER and job["coverage_ratio"] == pytest.approx(1.0)


def test_energy_summary_by_site_and_model_and_productivity():
    minutes = E.energy_rollup(_flat(["g1", "g2"], 120)).minutes
    jr = pl.DataFrame({"job_id": ["j1"], "rank": [0], "start": [at(0)], "end": [at(120)], "gpu_uuid": ["g1"]})
    att = E.attribute_to_jobs(minutes, jr)
    gpu = pl.DataFrame({"gpu_uuid": ["g1", "g2"], "host": ["h1", "h2"], "model_name": ["H100", "H100"]})
    host = pl.DataFrame({"host": ["h1", "h2"], "site_id": ["s1", "s2"]})
    job = pl.DataFrame({"job_id": ["j1"], "kind": ["training"], "model_name": ["m"]})
    by_site = E.energy_summary(att, ["site_id"], gpu=gpu, host=host)
    assert by_site["energy_j"].to_list() == pytest.approx([12000.0, 12000.0])
    by_model = E.energy_summary(att, ["model_name"], job=job)
    assert by_model.filter(pl.col("model_name") == "m")["energy_j"][0] == pytest.approx(12000.0)
    step = pl.DataFrame(
        {"job_id": ["j1"] * 3, "rank": [0] * 3, "step": [1, 2, 2], "start": [at(0), at(40), at(80)],
         "tokens": [1000, 1000, 1000], "model_flops": [1e12, 1e12, 1e12]}
    )  # step 2 re-run after a restart: counted once
    prod = E.energy_productivity(E.energy_summary(att, ["job_id"]), step).row(0, named=True)
    assert prod["steps"] == 2 and prod["tokens"] == 2000
    assert prod["energy_per_step_j"] == pytest.approx(6000.0)
    assert prod["energy_per_mtok_j"] == pytest.approx(12000.0 / 2000 * 1e6)
    assert prod["flops_per_j"] == pytest.approx(2e12 / 12000.0)
    assert E.fleet_energy_productivity(att, step) == pytest.approx(2e12 / 24000.0)


# --- serving vs training -----------------------------------------------------------------------


def test_serving_crossover_date_observed_and_projected():
    day = lambda d: dt.datetime(2025, 1, d, tzinfo=dt.timezone.utc)  # noqa: E731
    att = pl.DataFrame(
        {"minute": [day(1), day(2), day(3), day(4), day(2), day(3)],
         "job_id": ["train", "inf", "inf", "inf", "inf2", "inf2"],
         "energy_j": [100.0, 40.0, 40.0, 40.0, 10.0, 10.0]},
        schema={"minute": pl.Datetime("us", "UTC"), "job_id": pl.String, "energy_j": pl.Float64},
    )
    job = pl.DataFrame({"job_id": ["train", "inf", "inf2", "train2"], "kind": ["training", "inference", "inference", "training"],
                        "model_name": ["m", "m", "n", "n"]})
    att = pl.concat([att, pl.DataFrame({"minute": [day(1)], "job_id": ["train2"], "energy_j": [100.0]}, schema=att.schema)])
    out = E.serving_vs_training(att, job)
    m = out.filter(pl.col("model_name") == "m").row(0, named=True)
    assert m["crossover_date"] == dt.date(2025, 1, 4) and m["crossover_basis"] == "observed"
    n = out.filter(pl.col("model_name") == "n").row(0, named=True)
    # 20 J served over 2 days at 10 J/day: 80 J to go -> 8 more days after Jan 3
    assert n["crossover_basis"] == "projected" and n["crossover_date"] == dt.date(2025, 1, 11)


def test_energy_from_chip_hours():
    assert E.energy_from_chip_hours(8, 1.0, 300.0, 1.1) == pytest.approx(8 * 3600 * 300 * 1.1)
    with pytest.raises(ValueError):
        E.energy_from_chip_hours(8, 1.0, 300.0, 0.9)


def test_attribution_accepts_an_all_null_end_column():
    minutes = E.energy_rollup(_flat(["g1"], 120)).minutes
    jr = pl.DataFrame({"job_id": ["j"], "rank": [0], "start": [at(60)], "end": [None], "gpu_uuid": ["g1"]})
    s = E.energy_summary(E.attribute_to_jobs(minutes, jr), ["job_id"])
    assert s["energy_j"].to_list() == pytest.approx([6000.0, 6000.0])  # j, then idle (null last)

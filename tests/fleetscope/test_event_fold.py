"""Incremental analysis of a job's events (services.event_fold): goodput, SDC screening and checkpoint advice
folded minute by minute from the job's watermark give exactly what one analysis of its whole history gives,
on random event streams and on the simulator's jobs with injected SDC, failures and preemptions."""

import datetime as dt
import json
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from polars.testing import assert_frame_equal

from analyzers import goodput, goodput_events, reliability, sdc, sdc_fold
from fleetscope.door import ingestion
from fleetscope.core import frames as F
from fleetscope.services import event_fold
from fleetscope.services import jobs as analysis
from fleetscope.sim import Manifest, simulate, small_spec

T0 = dt.datetime(2026, 11, 2, 8, tzinfo=dt.UTC)


def random_events(seed: int, job_id: str = "job", ranks: int = 6, steps: int = 60, fail: bool = True) -> pl.DataFrame:
    """A job's events: allocation, start, initialisation, a step event per rank and step (loss, grad norm,
    checksums; now and then a NaN, a loss spike on one rank, a checksum one rank gets wrong, data loading,
    a payload start), checkpoint saves, a failure and a restart that resumes from the last checkpoint (so
    step numbers come again), and an SDC rerun record of a suspect step, stamped after the job."""
    rng = np.random.default_rng(seed)
    rows = [(T0 - dt.timedelta(seconds=40), "allocated", -1, None, None), (T0, "started", -1, None, None),
            (T0 + dt.timedelta(seconds=3), "initialized", -1, None, None)]
    t = T0 + dt.timedelta(seconds=5)
    fail_at = int(rng.integers(30, 45)) if fail else -1
    step, attempt_steps = 0, 0
    bad_rank = int(rng.integers(0, ranks))
    while step < steps:
        dur = float(rng.uniform(2.0, 3.0))
        for r in range(ranks):
            end = t + dt.timedelta(seconds=dur, microseconds=int(rng.integers(0, 200_000)))
            loss = 2.0 - step * 0.01 + float(rng.normal(0, 0.01))
            p = {"loss": round(loss, 6), "grad_norm": round(float(rng.uniform(0.9, 1.1)), 6)}
            if step % 4 == 0:
                p["param_checksum"] = f"c{step}" if not (r == bad_rank and step >= 20) else f"x{step}"
            if rng.random() < 0.01:
                p["loss"] = None
            if r == 1 and step in (25, 47):
                p["loss"] = 40.0
            if rng.random() < 0.05:
                p["data_loading_s"] = round(float(rng.uniform(0.01, 0.2)), 3)
            if rng.random() < 0.05:
                p["start"] = t.isoformat()
            rows.append((end, "step", r, step, json.dumps(p)))
        if step % 10 == 9:
            rows.append((t + dt.timedelta(seconds=dur + 0.5), "checkpoint_save_start", -1, None, None))
            rows.append((t + dt.timedelta(seconds=dur + 2.5), "checkpoint_save_end", -1, None, None))
            t += dt.timedelta(seconds=2.5)
        t += dt.timedelta(seconds=dur + 0.4)
        step += 1
        attempt_steps += 1
        if step == fail_at:
            rows.append((t + dt.timedelta(seconds=1), "failure", 3, None, json.dumps({"cause": "GPU HBM3 memory"})))
            t += dt.timedelta(seconds=60)
            rows.append((t, "restart", -1, None, None))
            t += dt.timedelta(seconds=5)
            step = (step // 10) * 10  # back to the last checkpoint
            steps += fail_at - step
            fail_at = -1
    rows.append((t + dt.timedelta(hours=2), "sdc_rerun", bad_rank, 24,
                 json.dumps({"suspect_gpu": f"GPU-{bad_rank}", "gpu_uuid": f"GPU-{bad_rank}", "result": "x24", "attempt": 1})))
    return pl.DataFrame(rows, schema={"ts": F.UTC_US, "kind": pl.String, "rank": pl.Int64, "step": pl.Int64, "payload": pl.String},
                        orient="row").with_columns(pl.lit(job_id).alias("job_id")).select(F.JOB_EVENT.names)


def _chunks(ev: pl.DataFrame, seed: int) -> list[pl.DataFrame]:
    """The events cut at random times, in arrival (time) order."""
    ev = ev.sort("ts")
    cuts = np.sort(np.random.default_rng(seed).choice(np.arange(1, ev.height), size=12, replace=False))
    return [ev[a:b] for a, b in zip([0, *cuts], [*cuts, ev.height])]


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_compacted_events_give_the_same_goodput_and_checkpoint_inputs(seed):
    ev = random_events(seed)
    kept = ev.clear()
    for chunk in _chunks(ev, seed):
        kept = goodput_events.compact_events(pl.concat([kept, chunk]))
    assert kept.height < ev.height / 3  # the step events are what it leaves out
    until = ev["ts"].max() + dt.timedelta(minutes=1)
    for f in (lambda e: goodput.runtime_goodput(e, until=until), lambda e: goodput.scheduling_goodput(e, until=until),
              lambda e: goodput.goodput_timeline(e, until=until).to_dicts(), lambda e: reliability.checkpoint_costs(e).to_dicts(),
              lambda e: reliability.fleet_mtbf(e.filter(~pl.col("kind").is_in(list(F.JOB_RECORD_KINDS)))).to_dicts()):
        assert f(kept) == f(ev)
    rg = goodput.runtime_goodput(ev, until=until)
    assert rg.disruptions == 1 and rg.badput_s["wasted_progress"] > 0 and rg.badput_s["data_loading"] > 0


def test_a_bad_payload_keeps_its_error():
    ev = random_events(4)
    bad = ev.with_columns(pl.when((pl.col("step") == 7) & (pl.col("rank") == 2)).then(pl.lit('{"duration_s": -1}'))
                          .otherwise(pl.col("payload")).alias("payload"))
    kept = goodput_events.compact_events(bad)
    with pytest.raises(ValueError, match="duration_s must be a finite number") as want:
        goodput.runtime_goodput(bad, until=T0 + dt.timedelta(days=1))
    with pytest.raises(ValueError) as got:
        goodput.runtime_goodput(kept, until=T0 + dt.timedelta(days=1))
    assert str(got.value) == str(want.value)


def _screen_json(s: dict) -> dict:
    return {k: (v.to_dicts() if isinstance(v, pl.DataFrame) else v) for k, v in s.items()
            if k in ("checksums", "spikes", "nonfinite", "records", "runs", "problems", "verdicts", "findings")}


@pytest.mark.parametrize("seed", [1, 5, 6])
def test_the_sdc_screen_folded_step_by_step_equals_one_screen(seed):
    # a run with no restart: the fold takes steps in order (a step number that comes again refolds the job)
    ev = random_events(seed, fail=False)
    whole = sdc.screen(ev)
    state = sdc_fold.ScreenFold()
    cases = ev.filter(pl.col("kind") == "sdc_rerun").select("job_id", "step", "rank")
    numbers = sorted(ev["step"].drop_nulls().unique().to_list())
    rng = np.random.default_rng(seed)
    bounds = [numbers[0], *sorted(rng.choice(numbers[1:], size=8, replace=False)), numbers[-1] + 1]
    for a, b in zip(bounds, bounds[1:]):
        state = sdc_fold.fold_screen(state, sdc.step_signals(ev.filter(pl.col("step").is_between(a, b, closed="left"))), cases)
    got = sdc_fold.folded_screen(state, ev)
    assert _screen_json(got) == _screen_json(whole)
    assert got["steps_screened"] == whole["signals"].height
    assert (got["first_ts"], got["last_ts"]) == (whole["signals"]["ts"].min(), whole["signals"]["ts"].max())
    # and the comparison is of something: a checksum suspect, a single-rank loss spike, a rerun verdict
    kinds = {json.loads(f["evidence"]).get("verdict") or f["kind"] for f in whole["findings"].to_dicts()}
    assert "sdc_confirmed" in kinds or "sdc_suspect" in kinds
    assert whole["spikes"].filter(pl.col("single_rank")).height >= 1
    assert whole["verdicts"].height == 1


@pytest.mark.parametrize("seed", range(8))
def test_spikes_scored_after_a_step_are_metric_spikes_rows_bit_for_bit(seed):
    # ties, nulls, infinities, short histories, two jobs, rows in any order; every scored row compared (threshold
    # -inf) and the spikes alone, with and without a step before which rows are baselines only
    rng = np.random.default_rng(seed)
    ranks, steps = int(rng.integers(1, 6)), int(rng.integers(20, 90))
    loss = {0: lambda: float(rng.normal(2, 0.01)), 1: lambda: float(np.round(rng.normal(2, 0.01), 3)),
            2: lambda: float(rng.integers(0, 3)), 3: lambda: float(rng.choice([rng.normal(2, 0.01), np.inf, -np.inf], p=[0.96, 0.02, 0.02]))}[seed % 4]
    rows = [(j, r, st, T0 + dt.timedelta(seconds=st), None if rng.random() < 0.05 else loss() * (40 if rng.random() < 0.02 else 1))
            for j in (["a", "b"] if seed % 3 == 0 else ["j"]) for r in range(ranks) for st in range(steps)]
    df = pl.DataFrame(rows, schema={"job_id": pl.String, "rank": pl.Int64, "step": pl.Int64, "ts": F.UTC_US, "loss": pl.Float64},
                      orient="row").sample(fraction=1.0, shuffle=True, seed=seed)
    scored = 0
    for after in (None, int(rng.integers(0, steps)), steps + 5):
        for threshold in (6.0, -np.inf):
            want = sdc.metric_spikes(df, "loss", window_steps=sdc_fold.SPIKE_WINDOW_STEPS, threshold=threshold)
            want = want if after is None else want.filter(pl.col("step") > after)
            assert_frame_equal(sdc_fold.spikes_after(df, after, threshold=threshold), want, check_exact=True)
            scored += want.height
    assert scored > 0


def test_folding_steps_out_of_order_is_refused():
    ev = random_events(1).filter(pl.col("kind") == "step")
    state = sdc_fold.fold_screen(sdc_fold.ScreenFold(), sdc.step_signals(ev.filter(pl.col("step").is_between(10, 12))))
    with pytest.raises(ValueError, match="signals of step 5 folded after step 12"):
        sdc_fold.fold_screen(state, sdc.step_signals(ev.filter(pl.col("step") == 5)))


def test_the_cut_leaves_the_last_step_and_any_step_still_reporting_open():
    def ev(*rows):
        return pl.DataFrame([(T0 + dt.timedelta(seconds=s), "step", r, n) for s, r, n in rows],
                            schema={"ts": F.UTC_US, "kind": pl.String, "rank": pl.Int64, "step": pl.Int64}, orient="row")
    us = lambda s: int((T0 + dt.timedelta(seconds=s)).timestamp()) * 1_000_000  # noqa: E731
    assert event_fold.cut_us(ev((1, 0, 1), (2, 1, 1), (5, 0, 2), (6, 1, 2))) == us(5)
    # rank 1 reports step 2 after rank 0 reported step 3: step 2 stays open with it
    assert event_fold.cut_us(ev((1, 0, 1), (2, 1, 1), (5, 0, 2), (9, 1, 2), (8, 0, 3))) == us(5)
    assert event_fold.cut_us(ev((1, 0, 1))) == us(1)
    assert event_fold.cut_us(ev().clear()) is None


# --- the service, minute by minute, against one analysis ---------------------------------------------


def comparable(store, job_id: str, result: analysis.JobAnalysis) -> dict:
    def strip(x):
        return json.loads(json.dumps(x, default=str).replace(job_id, "JOB"))
    stored = store.read("job_analysis", job_id=job_id).sort("analyzer")
    found = store.read("finding").filter(pl.col("evidence").str.contains(job_id, literal=True)
                                         | pl.col("subject").str.contains(job_id, literal=True)).sort("subject", "kind", "window_start")
    return strip({
        "result": result.to_dict(),
        "stored": [(r["analyzer"], r["window_start"], r["window_end"], json.loads(r["result"])) for r in stored.iter_rows(named=True)],
        "findings": found.select("kind", "subject", "severity", "score", "window_start", "window_end", "summary", "evidence").to_dicts(),
    })


def replay(store, events: pl.DataFrame, job_id: str, every: dt.timedelta, end: dt.datetime) -> tuple[analysis.JobAnalysis, list[int]]:
    """Write the job's events as they arrive (by time) and analyse it incrementally after each ``every``;
    returns the last result and how many events each run read past its watermark."""
    events = events.with_columns(pl.lit(job_id).alias("job_id"))
    t, prev, last, tails = events["ts"].min(), None, None, []
    while prev is None or prev < end:
        now = min(t + every, end)
        arrived = events.filter((pl.col("ts") <= now) & ((pl.col("ts") > prev) if prev is not None else pl.lit(True)))
        if arrived.height:
            store.write(F.Batch(source="test", job_event=arrived))
        before = event_fold._load(store, job_id)
        last = analysis.analyze_job(store, job_id, now=now, incremental=True)
        if before is not None:
            tails.append(store.read("job_event", job_id=job_id, start=event_fold._dt(before.commit_ts_us)).height)
        prev, t = now, now
    return last, tails


def test_minute_by_minute_matches_one_analysis_on_random_events(store):
    ev = random_events(7, ranks=8, steps=90).filter(pl.col("kind") != "sdc_rerun")
    end = ev["ts"].max() + dt.timedelta(seconds=30)
    store.write(F.Batch(job_rank=pl.DataFrame({"job_id": ["inc"] * 8 + ["full"] * 8, "rank": list(range(8)) * 2, "start": [T0] * 16,
                                               "gpu_uuid": [f"GPU-{j}-{r}" for j in ("inc", "full") for r in range(8)]})))
    last, tails = replay(store, ev, "inc", dt.timedelta(minutes=1), end)
    store.write(F.Batch(source="test", job_event=ev.with_columns(pl.lit("full").alias("job_id"))))
    whole = analysis.analyze_job(store, "full", now=end)
    got, want = comparable(store, "inc", last), comparable(store, "full", whole)
    assert got == want
    assert want["result"]["goodput"]["disruptions"] == 1 and want["result"]["sdc"] and want["result"]["checkpoint"]["saves"] >= 8
    # rolling goodput and step-time deviation fold the same way (the job runs on: its step under way is not measured)
    trend = want["result"]["goodput_trend"]
    assert trend["rolling"]["window_s"] == 30.0 and trend["rolling"]["windows_total"] >= 8 and trend["rolling"]["why"] is None
    assert trend["step_time_deviation"]["steps"] >= 80 and trend["step_time_deviation"]["why"] is None
    assert [a for a, *_ in want["stored"]].count("goodput_trend") == 1
    # the restart re-ran steps: the fold started over once, then went on from its watermark
    assert max(tails) <= 3 * 8 * 30


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Manifest:
    return simulate(small_spec(seed=7), tmp_path_factory.mktemp("sim"))


def test_the_simulators_sdc_job_minute_by_minute_matches_one_analysis(store, sim):
    fault = sim.faults_of("sdc")[0]
    rel = sim.job(fault.job_id)["events_file"]
    _, batch = ingestion.parse((Path(sim.out_dir) / rel).read_bytes(), source=rel)
    ev = batch.job_event
    end = ev["ts"].max() + dt.timedelta(seconds=5)
    last, tails = replay(store, ev, "inc", dt.timedelta(minutes=1), end)
    store.write(F.Batch(source="test", job_event=ev.with_columns(pl.lit("full").alias("job_id"))))
    whole = analysis.analyze_job(store, "full", now=end)
    got, want = comparable(store, "inc", last), comparable(store, "full", whole)
    assert got == want
    assert [f["subject"] for f in want["result"]["sdc"]] == [f"job:JOB/rank:{fault.ranks[0]}"]
    assert want["result"]["goodput"]["goodput_ratio"] > 0
    per_step = ev.filter(pl.col("kind") == "step")["step"].n_unique()
    assert max(tails) < ev.height / 3 and len(tails) >= per_step // 20


def test_a_rerun_record_for_a_folded_step_reads_that_step_back(store):
    ev = random_events(8)
    # each job's own GPU, so that the two jobs' findings about it are two findings
    def of(job: str) -> pl.DataFrame:
        return ev.with_columns(pl.lit(job).alias("job_id"), pl.col("payload").str.replace_all("GPU-", f"GPU-{job}-", literal=True))
    rerun = ev.filter(pl.col("kind") == "sdc_rerun")
    run = ev.filter(pl.col("kind") != "sdc_rerun")
    end = run["ts"].max() + dt.timedelta(seconds=30)
    replay(store, run, "incr", dt.timedelta(minutes=1), end)
    later = rerun["ts"][0] + dt.timedelta(minutes=1)
    store.write(F.Batch(source="test", job_event=of("incr").filter(pl.col("kind") == "sdc_rerun")))
    inc = analysis.analyze_job(store, "incr", now=later, incremental=True)
    store.write(F.Batch(source="test", job_event=of("whole")))
    full = analysis.analyze_job(store, "whole", now=later)
    got, want = comparable(store, "incr", inc), comparable(store, "whole", full)
    # the store also holds what earlier runs concluded before the record came (a rank's suspicion, now its GPU's)
    assert (got["result"], got["stored"]) == (want["result"], want["stored"])
    cols = ["kind", "subject", "severity", "score", "window_start", "window_end", "summary", "evidence"]
    assert (json.dumps(inc.batch.finding.select(cols).to_dicts(), default=str).replace("incr", "JOB")
            == json.dumps(full.batch.finding.select(cols).to_dicts(), default=str).replace("whole", "JOB"))
    assert [v["verdict"] for v in full.sdc_reruns] == ["inconclusive"]
    assert event_fold._load(store, "incr").screen.case_signals.height == 1


def test_lifecycle_events_alone_fold_too(store):
    ev = random_events(9).filter(pl.col("kind") != "step")
    end = ev.filter(pl.col("kind") != "sdc_rerun")["ts"].max() + dt.timedelta(minutes=1)
    last, _ = replay(store, ev.filter(pl.col("kind") != "sdc_rerun"), "inc", dt.timedelta(minutes=1), end)
    store.write(F.Batch(source="test", job_event=ev.filter(pl.col("kind") != "sdc_rerun").with_columns(pl.lit("full").alias("job_id"))))
    whole = analysis.analyze_job(store, "full", now=end)
    assert comparable(store, "inc", last) == comparable(store, "full", whole)
    state = event_fold._load(store, "inc")
    # no step events: everything read is committed, and the watermark is past the last event
    assert state.last_step is None and state.commit_ts_us == event_fold._us(ev.filter(pl.col("kind") != "sdc_rerun")["ts"].max()) + 1
    assert whole.goodput["goodput_ratio"] == 0.0 and whole.checkpoint["saves"] >= 5

"""Incremental job analysis (services.job_fold): a running job analysed minute by minute from its watermark gives
exactly what one analysis of its whole history gives, and each minute reads only what is new."""

import datetime as dt
import json

import numpy as np
import polars as pl
import pytest

from analyzers import c3
from fleetscope.core import frames as F
from fleetscope.core.exact import SKETCH_RELATIVE_ERROR
from fleetscope.services import job_fold
from fleetscope.services import jobs as analysis

T0 = dt.datetime(2026, 11, 2, 8, tzinfo=dt.UTC)
RANKS, STEPS, STEP_S = 12, 48, 7.5  # steps that do not line up with minutes, so the open step moves about
SLOW = 5  # a rank that straggles for three steps in a row: persistent


def job_frames(job_id: str, seed: int = 3) -> dict[str, pl.DataFrame]:
    """One job's steps, collectives (two a rank-step, their waits differing by rank), inventory, events and
    energy minutes; the same numbers for every job id, so two ids hold two copies of one job."""
    rng = np.random.default_rng(seed)
    gpus = [f"GPU-{job_id}-{r:02d}" for r in range(RANKS)]
    steps, colls = [], []
    for s in range(STEPS):
        t = T0 + dt.timedelta(seconds=STEP_S * s)
        compute = rng.uniform(3.0, 3.1, RANKS)
        # SLOW is persistent only across a watermark: step 14 is folded by the minute-2 run, 15 and 16 by the next
        if s in (14, 15, 16, 33):
            compute[SLOW] = 4.4
        if s in (8, 20, 38):  # slow now and then, never persistent: no finding
            compute[2] = 4.4
        for r in range(RANKS):
            # a rank's step starts a few ms after its peers', as real ranks do
            start = t + dt.timedelta(microseconds=int(rng.integers(0, 4000)))
            # the collectives hold every rank until the last one arrives: the slow rank waits least
            wait = float(compute.max() - compute[r]) / 2
            steps.append({"job_id": job_id, "rank": r, "step": s, "start": start, "end": start + dt.timedelta(seconds=6.9),
                          "compute_s": float(compute[r]), "comm_s": 3.0, "comm_overlap_s": float(rng.uniform(0, 0.3)),
                          "idle_s": 0.2, "tokens": 4096, "model_flops": float(rng.uniform(4e14, 5e14)) if r != 7 or s % 5 else None})
            for k in range(2):
                colls.append({"job_id": job_id, "rank": r, "comm_id": "c0", "seq": s * 2 + k, "op": "all_reduce",
                              "bytes": int(2**26), "nranks": RANKS, "start": start + dt.timedelta(seconds=3.2 + k),
                              "duration_s": 0.3 + wait + float(rng.uniform(0, 0.01))})
    minutes = pl.datetime_range(T0, T0 + dt.timedelta(minutes=7), "1m", eager=True, time_zone="UTC")
    energy = pl.DataFrame({"minute": [m for m in minutes for _ in gpus], "gpu_uuid": gpus * len(minutes),
                           "energy_j": rng.uniform(30_000, 42_000, len(minutes) * RANKS)}).with_columns(
        counter_energy_j=pl.col("energy_j"), integrated_energy_j=pl.lit(0.0), covered_s=pl.lit(60.0), method=pl.lit("counter"))
    return {
        "step": pl.DataFrame(steps), "collective": pl.DataFrame(colls),
        "gpu": pl.DataFrame({"gpu_uuid": gpus, "host": ["node-a"] * RANKS, "model_name": ["NVIDIA H100 80GB HBM3"] * RANKS}),
        "host": pl.DataFrame({"host": ["node-a"], "site_id": ["fra-1"]}),
        "site": pl.DataFrame({"site_id": ["fra-1"], "country": ["DEU"], "declared_pue": [1.2]}),
        "job_rank": pl.DataFrame({"job_id": [job_id] * RANKS, "rank": list(range(RANKS)), "start": [T0] * RANKS,
                                  "gpu_uuid": gpus, "host": ["node-a"] * RANKS}),
        "job_event": pl.DataFrame([{"job_id": job_id, "ts": T0 - dt.timedelta(seconds=30), "kind": "started"}]),
        "gpu_energy_minute": energy,
    }


def write_until(store, frames: dict[str, pl.DataFrame], until: dt.datetime, since: dt.datetime | None) -> None:
    """What had arrived by ``until`` and not by ``since``: steps and collectives once they ended, energy minutes
    once closed, inventory and events at the start."""
    def cut(df: pl.DataFrame, col: pl.Expr) -> pl.DataFrame:
        df = df.filter(col <= until)
        return df if since is None else df.filter(col > since)
    batch = F.Batch(source="test",
                    step=cut(frames["step"], pl.col("end")),
                    collective=cut(frames["collective"], pl.col("start") + pl.duration(microseconds=(pl.col("duration_s") * 1e6).cast(pl.Int64))),
                    gpu_energy_minute=cut(frames["gpu_energy_minute"], pl.col("minute") + pl.duration(minutes=1)))
    if since is None:
        for name in ("gpu", "host", "site", "job_rank", "job_event"):
            setattr(batch, name, frames[name])
    store.write(batch)


def comparable(store, job_id: str, result: analysis.JobAnalysis) -> dict:
    """The run's result, the stored summaries, breakdown rows and findings, with the job id taken out."""
    def strip(x):
        return json.loads(json.dumps(x, default=str).replace(job_id, "JOB"))
    stored = store.read("job_analysis", job_id=job_id).sort("analyzer")
    bd = store.read("step_breakdown", job_id=job_id).drop("job_id").sort("rank", "step")
    found = store.read("finding").filter(pl.col("subject").str.contains(f"job:{job_id}/", literal=True)).sort("subject", "kind")
    return strip({
        "result": result.to_dict(),
        "stored": [(r["analyzer"], r["window_start"], r["window_end"], json.loads(r["result"])) for r in stored.iter_rows(named=True)],
        "breakdown": bd.to_dicts(),
        "findings": found.select("kind", "subject", "severity", "score", "window_start", "window_end", "summary", "evidence").to_dicts(),
    })


def test_minute_by_minute_matches_one_analysis_of_the_whole_history(store):
    inc, full = job_frames("inc"), job_frames("full")
    end = T0 + dt.timedelta(seconds=STEP_S * STEPS + 5)
    minutes = int((end - T0).total_seconds() // 60) + 1
    last, prev = None, None
    tails = []
    for m in range(1, minutes + 1):
        now = min(T0 + dt.timedelta(minutes=m), end)
        write_until(store, inc, now, prev)
        prev = now
        before = job_fold._load(store, "inc")
        last = analysis.analyze_job(store, "inc", now=now, incremental=True)
        after = job_fold._load(store, "inc")
        if before is not None:
            # each minute folds only the steps it read past the watermark, never the job again
            tails.append(after.rows - before.rows)
            assert after.commit_start_us >= before.commit_start_us
    write_until(store, full, end, None)
    whole = analysis.analyze_job(store, "full", now=end)

    got, want = comparable(store, "inc", last), comparable(store, "full", whole)
    assert got["result"] == want["result"]
    assert got["stored"] == want["stored"]
    assert got["breakdown"] == want["breakdown"]
    assert got["findings"] == want["findings"]
    # and the comparison is of something: the straggler was found and priced, MFU and C3 computed
    assert [f["subject"] for f in want["result"]["stragglers"]] == [f"job:JOB/rank:{SLOW}"]
    ev = json.loads(want["findings"][0]["evidence"])
    assert ev["cost_basis"]["pue"] == 1.2 and ev["energy_kwh_lost"] > 0
    assert want["result"]["goodput"]["mfu_ratio"] > 0 and want["result"]["c3"]["steps"] == STEPS
    assert max(tails) <= 9 * RANKS  # a minute holds at most 8 new steps and the step left open last time
    assert len(tails) >= 5


def test_the_folded_summary_agrees_with_the_pure_analyzer(store):
    frames = job_frames("one")
    write_until(store, frames, T0 + dt.timedelta(hours=1), None)
    out = analysis.analyze_job(store, "one", now=T0 + dt.timedelta(hours=1)).c3
    steps, colls = frames["step"], frames["collective"]
    flops = steps["model_flops"].sum()
    want = c3.job_summary(c3.c3_breakdown(steps, colls), collective=colls, flops=flops).row(0, named=True)
    for k in ("c1_ratio", "c2_ratio", "c3_ratio", "step_s_mean", "c1_compute_s_mean", "f_compute_mean", "comm_intensity_bytes_per_flop"):
        assert out[k] == pytest.approx(want[k], rel=1e-12), k
    # the percentiles come from the sketch: within its relative error of the exact order statistics
    for k in ("c1_compute_s_p50", "c1_compute_s_p99", "c3_coord_s_p50", "step_s_p99"):
        assert out[k] == pytest.approx(want[k], rel=SKETCH_RELATIVE_ERROR), k
    assert (out["ranks"], out["steps"], out["dominant"]) == (want["ranks"], want["steps"], want["dominant"])


def test_a_rerun_step_refolds_the_job_and_still_matches(store):
    frames = job_frames("rr")
    write_until(store, frames, T0 + dt.timedelta(minutes=3), None)
    analysis.analyze_job(store, "rr", now=T0 + dt.timedelta(minutes=3), incremental=True)
    # a restart: steps 10 and 11 run again later, as new rows (their start is part of the key)
    again = frames["step"].filter(pl.col("step").is_in([10, 11])).with_columns(
        pl.col("start") + pl.duration(minutes=3), pl.col("end") + pl.duration(minutes=3))
    store.write(F.Batch(step=again))
    now = T0 + dt.timedelta(minutes=7)
    inc = analysis.analyze_job(store, "rr", now=now, incremental=True)
    assert job_fold._load(store, "rr").rows == store.read("step", job_id="rr").height - RANKS  # all but the open step
    full = analysis.analyze_job(store, "rr", now=now)
    assert inc.to_dict() == full.to_dict()


def test_api_and_cli_run_the_incremental_analysis_with_the_same_results(api, tmp_path, monkeypatch):
    from click.testing import CliRunner

    import httpx

    from fleetscope.cli import main
    from fleetscope.services import auth

    store = api.app.state.store
    frames = job_frames("api")
    admin = {"Authorization": "Bearer " + auth.create_token(store.engine, "a", ["admin"])}
    url = api.url + "/api/v1/jobs/api/analyze"
    write_until(store, frames, T0 + dt.timedelta(minutes=2), None)
    first = httpx.post(url, params={"incremental": "true"}, headers=admin, timeout=120)
    assert first.status_code == 200 and job_fold._load(store, "api").steps > 0
    write_until(store, frames, T0 + dt.timedelta(hours=1), T0 + dt.timedelta(minutes=2))
    inc = httpx.post(url, params={"incremental": "true"}, headers=admin, timeout=120).json()
    assert httpx.post(url, params={"incremental": "maybe"}, headers=admin).status_code == 422
    full = httpx.post(url, headers=admin, timeout=120).json()
    # analysed at different instants: goodput's elapsed time moves with the clock, the step analyses do not
    assert inc["c3"] == full["c3"] and inc["stragglers"] == full["stragglers"] and inc["c3"]["steps"] == STEPS
    # the CLI, on the same database
    monkeypatch.setenv("FLEETSCOPE_DATABASE_URL", str(store.engine.url.render_as_string(hide_password=False)))
    monkeypatch.setenv("FLEETSCOPE_DATA_DIR", str(tmp_path))
    out = CliRunner().invoke(main, ["jobs", "analyze", "api", "--incremental", "--json"])
    assert out.exit_code == 0, out.output
    assert json.loads(out.output)["c3"] == full["c3"]

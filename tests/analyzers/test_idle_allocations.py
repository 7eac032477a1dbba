"""Idle allocations on frames built here: the idle run, the threshold, the price, nothing for busy GPUs."""

import datetime as dt
import json

import polars as pl

from analyzers import idle_allocations as A

T = dt.datetime(2026, 11, 3, 9, tzinfo=dt.UTC)


def samples(utils: list[float], gpu: str = "G0") -> pl.DataFrame:
    return pl.DataFrame({"ts": [T + dt.timedelta(minutes=i) for i in range(len(utils))], "gpu_uuid": gpu, "util_ratio": utils},
                        schema_overrides={"ts": pl.Datetime("us", "UTC")})


JOB = pl.DataFrame({"cluster": ["hpc"], "job_id": ["7"], "gpu_uuid": ["G0"], "team": ["nlp"], "account": ["ml"], "host": ["n0"]})


def test_idle_run_past_the_threshold_is_found_and_priced():
    s = samples([0.9] * 10 + [0.01] * 41)  # idle from minute 10 to minute 50: 40 min
    f = A.idle_findings(JOB, s, prices={("hpc", "7"): (3.0, "EUR")})
    r = f.row(0, named=True)
    ev = json.loads(r["evidence"])
    assert (r["kind"], r["subject"], r["window_start"]) == ("idle_allocation", "job:hpc/7", T + dt.timedelta(minutes=10))
    assert r["score"] == 40 / 60 and ev["idle_cost"] == 2.0 and ev["team"] == "nlp" and ev["gpus_idle"] == ["G0"]


def test_short_idle_busy_end_and_empty_inputs_find_nothing():
    assert A.idle_findings(JOB, samples([0.9] * 10 + [0.0] * 20)).height == 0  # 19 min < 30
    assert A.idle_findings(JOB, samples([0.0] * 40 + [0.5])).height == 0  # working again
    assert A.idle_findings(JOB, samples([0.06] * 60)).height == 0  # above 5 %
    assert A.idle_findings(JOB.head(0), samples([0.0] * 60)).height == 0
    assert A.idle_findings(JOB, samples([0.0] * 31), min_idle_s=60).height == 1


def test_a_gpu_listed_once_per_sample_counts_once():
    # the service hands over the job's GPUs joined to their samples: one row per sample must not multiply the hours
    s = samples([0.0] * 41)
    repeated = pl.concat([JOB] * 41)
    f = A.idle_findings(repeated, s, prices={("hpc", "7"): (3.0, "EUR")})
    ev = json.loads(f["evidence"][0])
    assert f.height == 1 and f["score"][0] == 40 / 60 and ev["gpus_idle"] == ["G0"] and ev["idle_cost"] == 2.0

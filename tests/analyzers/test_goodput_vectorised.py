"""analyzers.goodput's column-wise timeline against the per-event loop it replaced
(goodput_loop_reference.py), on random event sequences: several ranks per step, restarts with and without
failure events, preemptions, checkpoint saves and restores, payload spans and data loading, odd payloads that
take the exact per-row path, running and finished jobs."""

from __future__ import annotations

import json
import random
from datetime import datetime, timedelta, timezone

import polars as pl
import pytest
from polars.testing import assert_frame_equal

from analyzers import goodput as g
from fleetscope.core.frames import JOB_EVENT

from . import goodput_loop_reference as ref

T0 = datetime(2024, 3, 1, tzinfo=timezone.utc)


def _payload(rng: random.Random, t: float) -> str | None:
    r = rng.random()
    if r < 0.4:
        return None
    p: dict = {"loss": round(rng.uniform(1, 3), 4)}
    if r < 0.55:
        p["duration_s"] = round(rng.uniform(0.5, 2.5), 6)
    elif r < 0.65:
        p["start"] = (T0 + timedelta(seconds=t - rng.uniform(0.5, 2))).isoformat()
    elif r < 0.72:
        p["start"] = round((T0 + timedelta(seconds=t - 1.25)).timestamp(), 6)
        p["end"] = round((T0 + timedelta(seconds=t)).timestamp(), 6)
    elif r < 0.78:
        p["end"] = round((T0 + timedelta(seconds=t + 0.25)).timestamp(), 6)
        p["duration_s"] = 1
    if rng.random() < 0.3:
        p["data_loading_s"] = round(rng.uniform(0, 0.8), 6)
    if rng.random() < 0.05:
        p["note"] = {"start": "nested, not the step's"}
    return json.dumps(p, separators=(",", ":") if rng.random() < 0.5 else (", ", ": "))


def random_job(seed: int) -> tuple[pl.DataFrame, datetime | None]:
    rng = random.Random(seed)
    ranks = rng.choice([1, 2, 4])
    rows: list[dict] = []

    def ev(t: float, kind: str, step: int | None = None, payload: str | None = None, rank: int = -1) -> None:
        rows.append({"job_id": "j", "ts": T0 + timedelta(seconds=round(t, 6)), "kind": kind, "rank": rank,
                     "step": step, "payload": payload})

    t, step = 0.0, 0
    ev(t, "allocated")
    for attempt in range(rng.randint(1, 4)):
        if attempt:
            if rng.random() < 0.3:
                ev(t, "restart")
            step = max(0, step - rng.randint(0, 4))  # resume from a checkpoint a few steps back
        ev(t, "started")
        if rng.random() < 0.7:
            t += rng.uniform(0.5, 3)
            ev(t, "initialized")
        if rng.random() < 0.4:
            ev(t + 0.1, "checkpoint_restore_start")
            t += rng.uniform(0.5, 2)
            ev(t, "checkpoint_restore_end")
        t += rng.uniform(1, 4)
        for _ in range(rng.randint(0, 12)):
            for r in range(ranks):
                ev(t + rng.uniform(0, 0.3), "step", step, _payload(rng, t), r)
            if rng.random() < 0.2:
                ev(t + 0.5, "checkpoint_save_start")
                ev(t + 0.5 + rng.uniform(0.1, 1), "checkpoint_save_end")
            step += 1
            t += rng.uniform(1, 3)
        kind = rng.choice(["failure", "preempted", None])
        if kind:
            ev(t, kind)
        t += rng.uniform(1, 20)
    if rng.random() < 0.2:
        ev(t - 0.5, "checkpoint_save_start")  # open at the end
    if rng.random() < 0.6:
        ev(t, "finished")
        until = None if rng.random() < 0.7 else T0 + timedelta(seconds=t * rng.uniform(0.5, 1.2))
    else:
        until = T0 + timedelta(seconds=t + rng.uniform(0, 5))
    df = pl.DataFrame(rows, schema=JOB_EVENT.schema)
    return df.sample(fraction=1.0, shuffle=True, seed=seed), until


def _both(job_event: pl.DataFrame, until: datetime | None):
    out = []
    for f in (g.goodput_timeline, ref.goodput_timeline):
        try:
            out.append(f(job_event, until=until))
        except ValueError as e:
            out.append(str(e))
    return out


@pytest.mark.parametrize("seed", range(300))
def test_vectorised_timeline_equals_the_loop(seed):
    job_event, until = random_job(seed)
    new, old = _both(job_event, until)
    if isinstance(old, str):
        assert new == old
    else:
        assert isinstance(new, pl.DataFrame), new
        assert_frame_equal(new, old)


@pytest.mark.parametrize("seed", range(0, 300, 7))
def test_scheduling_goodput_equals_the_loop(seed):
    job_event, until = random_job(seed)
    extra = job_event.filter(pl.col("kind") == "preempted").with_columns(
        pl.lit("allocated").alias("kind"), pl.col("ts") + timedelta(seconds=2))  # re-allocated after preemption
    job_event = pl.concat([job_event, extra])
    got = []
    for f in (g.scheduling_goodput, ref.scheduling_goodput):
        try:
            got.append(f(job_event, until=until))
        except ValueError as e:
            got.append(str(e))
    assert got[0] == got[1]
    assert isinstance(got[0], float) or "finished" in got[0]


def test_the_random_jobs_cover_what_they_are_for():
    buckets: set[str] = set()
    for seed in range(300):
        job_event, until = random_job(seed)
        tl = _both(job_event, until)[1]
        if isinstance(tl, pl.DataFrame):
            buckets |= set(tl["bucket"].to_list())
    assert buckets == set(g.BUCKETS)


@pytest.mark.parametrize("payload, match", [
    ('{"duration_s": "1.5"}', "duration_s must be a finite number"),
    ('{"duration_s": true}', "duration_s must be a finite number"),
    ('{"data_loading_s": 1e400}', "data_loading_s must be a finite number"),
    ('{"data_loading_s": NaN}', "finite"),
    ('{"duration_s": -1}', "duration_s must be a finite number"),
    ('{"start": "yesterday"}', "start is not a timestamp"),
    ('{"start": 1', "payload is not JSON"),
    ('[1, 2]', "payload is not a JSON object"),
    ('{"a": 1} trailing', "payload is not JSON"),
])
def test_odd_payloads_raise_what_the_loop_raised(payload, match):
    rows = [{"job_id": "j", "ts": T0, "kind": "started", "rank": -1, "step": None, "payload": None},
            {"job_id": "j", "ts": T0 + timedelta(seconds=5), "kind": "step", "rank": 3, "step": 1, "payload": payload},
            {"job_id": "j", "ts": T0 + timedelta(seconds=9), "kind": "finished", "rank": -1, "step": None, "payload": None}]
    job_event = pl.DataFrame(rows, schema=JOB_EVENT.schema)
    new, old = _both(job_event, None)
    assert new == old
    assert "step event (step 1, rank 3)" in new
    with pytest.raises(ValueError, match=match):
        g.goodput_timeline(job_event)

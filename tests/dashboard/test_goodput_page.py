"""The Jobs page shows a job's rolling goodput and step-time deviation beside its goodput panel: the figures
``GET /api/v1/jobs/{id}/goodput`` and ``fleetscope jobs goodput`` give (services.job_reads.job_goodput), on
ml-goodput-measurement's partial-restart run (30.612 %) worked out by hand, and the reason when a job has too
few steps for a rolling window."""

from __future__ import annotations

import datetime as dt
import json

import polars as pl
import pytest

from fleetscope.core import frames as F
from fleetscope.door import ingestion
from fleetscope.services import job_reads
from fleetscope.services import jobs as analysis
from tests.dashboard.conftest import SEED_START
from tests.dashboard import test_pages
from tests.dashboard.test_pages import healthy, infos, metrics, open_page, store_of
from tests.fleetscope.test_goodput_trend_reads import RESTART, SAMPLE

T0 = SEED_START + dt.timedelta(minutes=5)
seeded_copy = test_pages.seeded_copy  # the fixture: a private copy of the seeded database


def add_job(store, job_id: str, rows) -> None:  # type: ignore[no-untyped-def]
    """``rows`` (seconds after T0, kind, step) as the job's events, the job in the inventory, analysed."""
    lines = [{"job_id": job_id, "ts": (T0 + dt.timedelta(seconds=t)).isoformat(), "kind": k, **({"step": s} if s is not None else {})}
             for t, k, s in rows]
    ingestion.ingest_bytes(store, "\n".join(json.dumps(x) for x in lines).encode() + b"\n", source=f"{job_id}.jsonl")
    end = T0 + dt.timedelta(seconds=rows[-1][0])
    store.write(F.Batch(job=F.conform(F.JOB, pl.DataFrame([{"job_id": job_id, "kind": "training", "world_size": 1, "status": "finished",
                                                            "started_at": T0, "ended_at": end}]))))
    analysis.analyze_job(store, job_id, now=end + dt.timedelta(minutes=1))


def test_the_jobs_page_shows_rolling_goodput_and_step_time_deviation(seeded_copy: str, monkeypatch: pytest.MonkeyPatch) -> None:
    store = store_of(seeded_copy)
    add_job(store, "job-restart", RESTART)
    at = open_page(seeded_copy, "jobs", monkeypatch, {"job": "job-restart"})
    healthy(at)
    m = metrics(at)
    assert m["Runtime goodput"] == "30.6%" and m["Disruptions"] == "1"
    # windows [0, 30) and [30, 49) s: 6 s of 30 productive, 9 of 19; step times 8, 3, 8, 3, 3 s: ideal 3 s, two anomalous
    assert (m["Newest window goodput"], m["Lowest window goodput"]) == ("47.4%", "20.0%")
    assert (m["Ideal step time"], m["Anomalous steps"], m["Largest deviation"]) == ("3.00 s", "2 of 5", "+5.00 s")
    captions = [c.value for c in at.caption]
    assert "Windows of 30 s from the job's start, each at least 10 ideal steps of 3.00 s; 2 in all." in captions
    assert "The newest 5 of 5 completed steps; red: anomalous, left out of the ideal." in captions
    # the page's figures are the service's, which the API and the CLI serve
    g = job_reads.job_goodput(store, "job-restart")
    assert [w["goodput_ratio"] for w in g["rolling"]["windows"]] == [0.2, 9 / 19]
    assert (g["step_time_deviation"]["ideal_step_time_s"], g["step_time_deviation"]["anomalous_steps"]) == (3.0, 2)
    assert not any(t.startswith("No data yet: no goodput") for t in infos(at)), infos(at)


def test_too_few_steps_for_a_rolling_window_says_why(seeded_copy: str, monkeypatch: pytest.MonkeyPatch) -> None:
    store = store_of(seeded_copy)
    add_job(store, "job-sample", SAMPLE)
    at = open_page(seeded_copy, "jobs", monkeypatch, {"job": "job-sample"})
    healthy(at)
    m = metrics(at)
    assert m["Runtime goodput"] == "75.0%" and "Newest window goodput" not in m
    assert ("No windows: too few steps for a rolling window: the run (20 s, 5 completed steps) fits in one window of 30 s, the shortest "
            "that holds 10 ideal steps of 3 s; rolling goodput needs two windows or more.") in [c.value for c in at.caption]
    # five steps of 3 s: the deviation is there, every step at the ideal
    assert (m["Ideal step time"], m["Anomalous steps"], m["Largest deviation"]) == ("3.00 s", "0 of 5", "+0 ms")

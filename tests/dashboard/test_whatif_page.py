"""The Stragglers page shows a job's what-if (per-stage and per-rank slowdowns); the Jobs page its MFU."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest

from fleetscope.services import jobs as analysis
from fleetscope.door import ingestion
from tests.dashboard.test_pages import healthy, infos, metrics, open_page, seeded_copy, store_of  # noqa: F401

REALDATA = Path(__file__).resolve().parents[2].parent / "shared" / "realdata"
ST = REALDATA / "traces" / "bytedance_straggler_whatif" / "trace-ST.parquet"


@pytest.mark.skipif(not ST.is_file(), reason=f"ByteDance what-if traces not found at {ST.parent}")
def test_stragglers_page_shows_the_whatif(seeded_copy: str, monkeypatch: pytest.MonkeyPatch) -> None:
    store = store_of(seeded_copy)
    ingestion.ingest_bytes(store, ST.read_bytes(), source="trace-ST.parquet", fmt="bytedance_whatif",
                           opts=ingestion.Options(job_id="job-llm-a", ts=dt.datetime(2026, 1, 1, tzinfo=dt.UTC)))
    w = analysis.analyze_job(store, "job-llm-a").whatif
    at = open_page(seeded_copy, "stragglers", monkeypatch, {"job": "job-llm-a"})
    healthy(at)
    m = metrics(at)
    assert m["Slowdown S"] == f"{w['slowdown']:.3f}×" and m["Verdict"] == "slow stage"
    assert m["M_S (last stage)"] == f"{w['m_s']:.2f}"
    per_rank = at.dataframe[1].value
    assert len(per_rank) == 8 and per_rank["stage"].tolist()[0] == 3  # the slow last stage's ranks first
    assert not [t for t in infos(at) if t.startswith("No data yet: no what-if")]


def test_stragglers_page_says_when_a_job_has_no_whatif(seeded_sqlite_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    at = open_page(seeded_sqlite_url, "stragglers", monkeypatch, {"job": "job-llm-a"})
    healthy(at)
    assert any(t.startswith("No data yet: no what-if for this job.") for t in infos(at)), infos(at)
    assert "Program goodput (MFU)" not in metrics(at)

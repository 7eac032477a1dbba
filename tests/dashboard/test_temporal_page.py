"""The Jobs page's HTA panel: a job's real Kineto traces (../shared/realdata/traces/hta, read in place) ingested
through the ingest door give, beside the C³ breakdown, each rank's idle, compute and non-compute shares of its GPU
time and its communication/computation overlap, Meta's HTA's own figures (tests/hta_reference.py)."""

from __future__ import annotations

import pytest

from fleetscope.door import ingestion
from fleetscope.services import job_reads
from fleetscope.services import jobs as analysis
from tests.dashboard import test_pages
from tests.dashboard.test_pages import healthy, infos, metrics, open_page, store_of
from tests.hta_reference import HTA_REFERENCE, needs_traces, trace_files

seeded_copy = test_pages.seeded_copy  # the fixture: a private copy of the seeded showcase database

TWO_RANK = "two_rank_sampled_128gpu_job"
JOB = "job-profiled"


@needs_traces
@pytest.mark.parametrize("analysed", [False, True], ids=["computed-on-read", "stored"])
def test_jobs_page_shows_htas_temporal_breakdown_per_rank(seeded_copy: str, monkeypatch: pytest.MonkeyPatch, analysed: bool) -> None:
    store = store_of(seeded_copy)
    for p in trace_files(TWO_RANK):
        ingestion.ingest_bytes(store, p.read_bytes(), source=p.name, fmt="kineto", opts=ingestion.Options(job_id=JOB))
    if analysed:
        analysis.analyze_job(store, JOB)
    want = job_reads.temporal(store, JOB)
    assert want["stored"] is analysed
    at = open_page(seeded_copy, "jobs", monkeypatch, {"job": JOB})
    healthy(at)
    assert "GPU time per rank (HTA temporal breakdown)" in [s.value for s in at.subheader]
    m = metrics(at)
    j = want["job"]
    assert (m["GPU idle"], m["GPU computing"], m["Non-compute"], m["Communication under compute"]) == (
        f"{j['idle_time_pctg']:.1f}%", f"{j['compute_time_pctg']:.1f}%", f"{j['non_compute_time_pctg']:.1f}%", f"{j['comp_comm_overlap_pctg']:.1f}%")
    table = next(d.value for d in at.dataframe if "idle_time_pctg" in d.value.columns)
    assert table["rank"].tolist() == [0, 1]
    ref = HTA_REFERENCE[TWO_RANK]
    for _, row in table.iterrows():
        r = ref[int(row["rank"])]
        assert row["kernel_time_us"] == pytest.approx(r[3], abs=1.0)
        assert [row["idle_time_pctg"], row["compute_time_pctg"], row["non_compute_time_pctg"], row["comp_comm_overlap_pctg"]] == pytest.approx(
            [*r[4:7], r[7]], abs=0.1)
    assert not [t for t in infos(at) if "HTA temporal breakdown" in t], infos(at)
    caption = [c.value for c in at.caption if c.value.startswith("Share of each rank's kernel time")]
    assert caption and ("Analysed " in caption[0]) is analysed and "the last profiler step left out" in caption[0]

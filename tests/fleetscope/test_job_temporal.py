"""HTA's temporal breakdown and communication/computation overlap as the service runs them: real Kineto traces
(../shared/realdata/traces/hta, read in place) ingested through the ingest door, the API and the CLI, the job's
``temporal`` analysis run (``services.jobs``), and its figures read from ``services.job_reads.temporal``,
``GET /api/v1/jobs/{id}/temporal`` and ``fleetscope jobs temporal`` equal to Meta's HTA's own (the reference and
tolerances of tests/analyzers/test_c3.py, in tests/hta_reference.py); unknown jobs, jobs without kernel data and
bad parameters answered as the other job reads answer them."""

from __future__ import annotations

import datetime as dt
import json
import os

import httpx
import polars as pl
import pytest

from fleetscope.core import frames as F
from fleetscope.door import ingestion
from fleetscope.services import auth, job_reads
from fleetscope.services import jobs as analysis
from tests import clirun
from tests.hta_reference import HTA_REFERENCE, check_rank, needs_traces, trace_files

pytestmark = needs_traces

TWO_RANK = "two_rank_sampled_128gpu_job"


def job_of(trace_dir: str) -> str:
    return "hta-" + trace_dir.replace("/", "-")


def ingest_dir(store, trace_dir: str, files=None) -> str:  # type: ignore[no-untyped-def]
    job = job_of(trace_dir)
    for p in files or trace_files(trace_dir):
        out = ingestion.ingest_bytes(store, p.read_bytes(), source=p.name, fmt="kineto", opts=ingestion.Options(job_id=job))
        assert out.error is None and out.result.written.get("device_union", 0) >= 1, out
    return job


def check_report(out: dict, trace_dir: str) -> None:
    """A temporal report (the service's, the API's body or the CLI's --json) against HTA's figures."""
    ref = HTA_REFERENCE[trace_dir]
    assert out["reason"] is None and out["window"] == ("all" if trace_dir == "critical_path_alexnet" else "before_last_step")
    assert [r["rank"] for r in out["ranks"]] == sorted(ref)
    for row in out["ranks"]:
        check_rank(row, ref[row["rank"]])
        assert row["traces"] == 1
    assert out["job"]["ranks"] == len(ref)
    assert out["job"]["kernel_time_us"] == pytest.approx(sum(r[3] for r in ref.values()), abs=len(ref))


def test_every_reference_trace_through_the_service_gives_htas_figures(store) -> None:  # type: ignore[no-untyped-def]
    for trace_dir in sorted(HTA_REFERENCE):
        job = ingest_dir(store, trace_dir)
        before = job_reads.temporal(store, job)  # not analysed yet: computed from the stored unions
        assert before["stored"] is False and before["computed_at"] is None
        check_report(before, trace_dir)
        result = analysis.analyze_job(store, job)
        assert result.temporal["rows"] == store.read("device_union", job_id=job).height
        out = job_reads.temporal(store, job)
        assert out["stored"] is True and out["computed_at"] is not None
        check_report(out, trace_dir)
        assert {k: out[k] for k in ("ranks", "job", "window")} == {k: before[k] for k in ("ranks", "job", "window")}
        json.dumps(out, allow_nan=False)
    # the stored row is the job_analysis table's, read by the Jobs page with the other analyzers' summaries
    stored = job_reads.job_analyses(store, job_of(TWO_RANK))["temporal"]
    assert [r["rank"] for r in stored["ranks"]] == [0, 1] and stored["window"] == "before_last_step"


def test_include_last_step_and_one_rank(store) -> None:  # type: ignore[no-untyped-def]
    job = ingest_dir(store, TWO_RANK)
    analysis.analyze_job(store, job)
    full = job_reads.temporal(store, job, include_last_step=True)
    # not stored: computed now, over both profiler steps, so each rank's kernel time is longer than HTA's default
    assert full["stored"] is False and full["window"] == "through_last_step" and full["include_last_step"] is True
    default = job_reads.temporal(store, job)
    for a, b in zip(full["ranks"], default["ranks"]):
        assert a["kernel_time_us"] > b["kernel_time_us"]
    one = job_reads.temporal(store, job, rank=1)
    assert [r["rank"] for r in one["ranks"]] == [1] and one["ranks"][0] == default["ranks"][1]
    none = job_reads.temporal(store, job, rank=7)
    assert none["ranks"] == [] and none["reason"] == "rank 7 has no device events in the job's traces (before_last_step window)"
    with pytest.raises(ValueError, match="rank must be 0 or more"):
        job_reads.temporal(store, job, rank=-1)


def test_incremental_runs_read_the_unions_again_only_when_a_trace_arrived(store) -> None:  # type: ignore[no-untyped-def]
    rank0, rank1 = trace_files(TWO_RANK)
    t0 = dt.datetime(2026, 3, 1, tzinfo=dt.UTC)
    job = ingest_dir(store, TWO_RANK, [rank0])
    assert analysis.active_jobs(store, since=dt.datetime(2023, 1, 1, tzinfo=dt.UTC)) == [job]  # beat sees the new trace
    first = analysis.analyze_job(store, job, now=t0, incremental=True).temporal
    assert [r["rank"] for r in first["ranks"]] == [0]
    # nothing new: the stored result stands, its analysis time too
    again = analysis.analyze_job(store, job, now=t0 + dt.timedelta(minutes=1), incremental=True).temporal
    assert again == first
    assert job_reads.temporal(store, job)["computed_at"] == t0.isoformat()
    # the other rank's trace arrives: the next run reads the job's unions again
    ingest_dir(store, TWO_RANK, [rank1])
    later = analysis.analyze_job(store, job, now=t0 + dt.timedelta(minutes=2), incremental=True).temporal
    out = job_reads.temporal(store, job)
    assert later["rows"] == 6 and out["computed_at"] == (t0 + dt.timedelta(minutes=2)).isoformat()
    check_report(out, TWO_RANK)


def test_a_job_without_kernel_data_has_an_empty_result_with_the_reason(store) -> None:  # type: ignore[no-untyped-def]
    store.write(F.Batch(job=pl.DataFrame({"job_id": ["events-only"], "world_size": [8]}, schema={"job_id": pl.String, "world_size": pl.Int64})))
    result = analysis.analyze_job(store, "events-only")
    assert result.temporal is None and not [n for n in result.notes if "temporal" in n]  # nothing to analyse, no note
    out = job_reads.temporal(store, "events-only")
    assert out == {"job_id": "events-only", "stored": False, "computed_at": None, "window_start": None, "window_end": None,
                   "window": None, "include_last_step": False, "ranks": [], "job": None, "reason": job_reads.TEMPORAL_NO_DATA}


def test_api_and_cli_give_htas_figures_and_refuse_bad_input(api, db_url, tmp_path) -> None:  # type: ignore[no-untyped-def]
    store = api.app.state.store
    tokens = {s: {"Authorization": "Bearer " + auth.create_token(store.engine, s, [s])} for s in ("ingest", "read", "admin")}
    job = job_of(TWO_RANK)
    for p in trace_files(TWO_RANK):  # through the API's ingest route, as an agent or a training job would send them
        r = httpx.post(api.url + "/api/v1/ingest/kineto", params={"job_id": job}, content=p.read_bytes(), headers=tokens["ingest"], timeout=60)
        assert r.status_code == 200, r.text
    r = httpx.post(api.url + f"/api/v1/jobs/{job}/analyze", headers=tokens["admin"], timeout=60)
    assert r.status_code == 200, r.text
    assert [x["rank"] for x in r.json()["temporal"]["ranks"]] == [0, 1]
    url = api.url + f"/api/v1/jobs/{job}/temporal"
    r = httpx.get(url, headers=tokens["read"], timeout=30)
    assert r.status_code == 200, r.text
    body = r.json()
    check_report(body, TWO_RANK)
    assert body == job_reads.temporal(store, job) and body["stored"] is True
    full = httpx.get(url, params={"include_last_step": "true", "rank": "1"}, headers=tokens["read"], timeout=30).json()
    assert full == job_reads.temporal(store, job, include_last_step=True, rank=1) and full["window"] == "through_last_step"

    env = {**os.environ, "FLEETSCOPE_DATA_DIR": str(tmp_path), "FLEETSCOPE_DATABASE_URL": db_url}
    out = clirun.cli("jobs", "temporal", job, "--json", env=env)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == body
    assert json.loads(clirun.cli("jobs", "temporal", job, "--include-last-step", "--rank", "1", "--json", env=env).stdout) == full
    text = clirun.cli("jobs", "temporal", job, env=env)
    assert text.returncode == 0, text.stderr
    lines = text.stdout.splitlines()
    ref = HTA_REFERENCE[TWO_RANK]
    assert lines[0].startswith(f"job {job}: HTA temporal breakdown of 2 ranks, last profiler step left out (analysed ")
    assert lines[1].split() == ["rank", "kernel", "(µs)", "idle", "%", "compute", "%", "non-compute", "%", "overlap", "%"]
    for line, rank in zip(lines[2:4], (0, 1)):
        cells = line.split()
        assert cells[0] == str(rank) and cells[1] == f"{ref[rank][3]:,}"
        assert [float(c) for c in cells[2:6]] == pytest.approx([*ref[rank][4:7], ref[rank][7]], abs=0.1)
    assert lines[4].split()[0] == "all"

    def refused(r: httpx.Response, name: str) -> None:
        assert r.status_code == 422, r.text
        assert [d["loc"] for d in r.json()["detail"]] == [["query", name]], r.text

    for bad in ("maybe", "2", ""):
        refused(httpx.get(url, params={"include_last_step": bad}, headers=tokens["read"], timeout=30), "include_last_step")
    for bad in ("-1", "abc", "1.5", "2147483648"):
        refused(httpx.get(url, params={"rank": bad}, headers=tokens["read"], timeout=30), "rank")
    # unknown job: 404 naming it, as the other job reads; scope read, as they
    r = httpx.get(api.url + "/api/v1/jobs/nope/temporal", headers=tokens["read"], timeout=30)
    assert r.status_code == 404 and r.json() == {"detail": "no job 'nope': nothing ingested under that id"}
    assert httpx.get(url, timeout=30).status_code == 401 and httpx.get(url, headers=tokens["ingest"], timeout=30).status_code == 403
    # a job without kernel data: an empty result with the reason
    store.write(F.Batch(job=pl.DataFrame({"job_id": ["events-only"]})))
    empty = httpx.get(api.url + "/api/v1/jobs/events-only/temporal", headers=tokens["read"], timeout=30)
    assert empty.status_code == 200 and empty.json()["ranks"] == [] and empty.json()["reason"] == job_reads.TEMPORAL_NO_DATA
    cli_empty = clirun.cli("jobs", "temporal", "events-only", env=env)
    assert cli_empty.returncode == 0 and cli_empty.stdout.splitlines() == [f"job events-only: {job_reads.TEMPORAL_NO_DATA}"]
    assert json.loads(clirun.cli("jobs", "temporal", "events-only", "--json", env=env).stdout) == empty.json()
    # and the CLI's refusals: an unknown job, a negative rank
    nope = clirun.cli("jobs", "temporal", "nope", env=env)
    assert nope.returncode == 1 and "no job 'nope': nothing ingested under that id" in nope.stderr and nope.stdout == ""
    neg = clirun.cli("jobs", "temporal", job, "--rank", "-1", env=env)
    assert neg.returncode == 2 and "--rank" in neg.stderr


def test_cli_ingests_a_trace_streamed_and_reports_htas_figures(store, db_url, tmp_path) -> None:  # type: ignore[no-untyped-def]
    # `fleetscope ingest` with a chunk far below the trace's size reads it piece by piece (ingest.kineto.parse_chunks)
    env = {**os.environ, "FLEETSCOPE_DATA_DIR": str(tmp_path), "FLEETSCOPE_DATABASE_URL": db_url}
    trace_dir = "nccl_data_rank0_of_2"
    job = job_of(trace_dir)
    (path,) = trace_files(trace_dir)
    out = clirun.cli("ingest", str(path), "--format", "kineto", "--job-id", job, "--chunk-mb", "0.05", "--json", env=env)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.splitlines()[0])["notes"].get("streamed") is True
    assert clirun.cli("jobs", "analyze", job, env=env).returncode == 0
    got = json.loads(clirun.cli("jobs", "temporal", job, "--json", env=env).stdout)
    assert got["stored"] is True
    check_report(got, trace_dir)

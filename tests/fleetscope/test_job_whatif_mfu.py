"""The straggler what-if and program goodput (MFU) in the service: a real ByteDance trace ingested as
``job_op``, analysed per job, stored, served by the API and the CLI; MFU and the ML Productivity Goodput
product from steps' model FLOPs and the GPU model's datasheet peak, stored, served and scraped."""

import datetime as dt
import json
import os

import httpx
import polars as pl
import pytest

from fleetscope.services import jobs as analysis
from fleetscope.services import auth
from fleetscope.services import fleet_metrics
from fleetscope.door import ingestion
from fleetscope.core import frames as F
from fleetscope.core.errors import ParseError
from tests import clirun

T0 = dt.datetime(2025, 3, 1, 8, tzinfo=dt.UTC)
WHATIF = "traces/bytedance_straggler_whatif"
# data/result-ST.json "blocking_slowdown" and data/ms-ST.json "Ms" of the artifact (commit 8efcd7f)
ST_SLOWDOWN, ST_MS = 1.1787021836556841, 1.2193563788811714


def ingest_st(store, realdata, job_id="st-job"):
    data = (realdata / WHATIF / "trace-ST.parquet").read_bytes()
    return ingestion.ingest_bytes(store, data, source="trace-ST.parquet", fmt="bytedance_whatif",
                                  opts=ingestion.Options(job_id=job_id, ts=T0))


def test_whatif_runs_per_job_on_a_real_trace(store, realdata):
    ingest_st(store, realdata)
    ops = store.read("job_op", job_id="st-job")
    assert ops.height == 6784 and ops["rank"].n_unique() == 8 and ops["ts"].unique().to_list() == [T0]
    store.write(F.Batch(job=pl.DataFrame({"job_id": ["st-job"], "world_size": [8]})))
    result = analysis.analyze_job(store, "st-job")
    w = result.whatif
    assert abs(w["slowdown"] / ST_SLOWDOWN - 1) < 0.02 and abs(w["m_s"] - ST_MS) < 0.02
    assert w["verdict"] == "slow_stage" and w["culprits"] == ["stage3"] and w["world_size"] == 8
    # per stage: only the last stage at its measured durations gives nearly the whole slowdown
    by_stage = {r["stage"]: r["slowdown_only"] for r in w["by_stage"]}
    assert by_stage[3] > 1.15 and max(by_stage[s] for s in (0, 1, 2)) < 1.01
    assert len(w["by_worker"]) == 8 and {r["rank"] for r in w["by_worker"]} == set(range(8))
    stored = analysis.stored_analysis(store, "st-job", "whatif")
    assert stored["result"]["slowdown"] == pytest.approx(w["slowdown"]) and stored["window_start"] == T0.isoformat()
    found = store.read("finding").filter(pl.col("analyzer") == "stragglers")
    assert found["kind"].to_list() == ["whatif_slow_stage"] and found["subject"].to_list() == ["job:st-job/stage3"]
    # the same bytes again write nothing; a second analysis updates, never duplicates
    assert ingest_st(store, realdata).skipped_duplicate
    analysis.analyze_job(store, "st-job")
    assert store.read("finding").height == 1 and store.read("job_analysis", job_id="st-job").height == 1
    assert "st-job" in analysis.active_jobs(store, since=T0 - dt.timedelta(minutes=1))


def test_whatif_format_refuses_bad_input(store, realdata):
    data = (realdata / WHATIF / "trace-ST.parquet").read_bytes()
    with pytest.raises(ParseError, match="job_id"):
        ingestion.ingest_bytes(store, data, source="t.parquet", fmt="bytedance_whatif", opts=ingestion.Options(ts=T0))
    with pytest.raises(ParseError, match="not a readable Parquet"):
        ingestion.ingest_bytes(store, b"PAR1 truncated", source="t.parquet", fmt="bytedance_whatif",
                               opts=ingestion.Options(job_id="x", ts=T0))
    with pytest.raises(ParseError, match="not a readable Parquet"):  # cut in half
        ingestion.ingest_bytes(store, data[: len(data) // 2], source="t.parquet", fmt="bytedance_whatif",
                               opts=ingestion.Options(job_id="x", ts=T0))
    assert store.read("job_op").height == 0


def test_whatif_analysis_notes_a_trace_it_cannot_replay(store):
    # a row written past the parser (which refuses negative durations) makes the replay refuse: noted, not raised
    rows = [{"job_id": "bad", "step": 0, "rank": 0, "optype": "forward-compute", "seq_id": 0, "ts": T0, "dp_rank": 0,
             "stage": 0, "start_s": 0.0, "duration_s": -1.0, "mb_id": 0, "gmc": 0, "mc": 0}]
    store.write(F.Batch(job_op=pl.DataFrame(rows, schema=F.JOB_OP.schema)))
    result = analysis.analyze_job(store, "bad")
    assert result.whatif is None and any(n.startswith("what-if not computed: duration_s must be finite") for n in result.notes)


def mfu_job(store, job_id="mfu-job", model="NVIDIA H100 80GB HBM3"):
    """8 ranks on 8 GPUs of one host, 10 steps of 2 s, each rank doing 5e14 model FLOPs per step; events:
    allocated at 0, started at 10 s, steps at 20..38 s, finished at 40 s."""
    gpus = [f"GPU-{i:04d}" for i in range(8)]
    steps = [{"job_id": job_id, "rank": r, "step": s, "start": T0 + dt.timedelta(seconds=20 + 2 * s),
              "end": T0 + dt.timedelta(seconds=22 + 2 * s), "compute_s": 1.6, "comm_s": 0.3, "comm_overlap_s": 0.0,
              "idle_s": 0.1, "model_flops": 5e14} for s in range(10) for r in range(8)]
    events = [{"job_id": job_id, "ts": T0, "kind": "allocated"}, {"job_id": job_id, "ts": T0 + dt.timedelta(seconds=10), "kind": "started"}]
    events += [{"job_id": job_id, "ts": T0 + dt.timedelta(seconds=22 + 2 * s), "kind": "step", "step": s} for s in range(10)]
    events.append({"job_id": job_id, "ts": T0 + dt.timedelta(seconds=40), "kind": "finished"})
    store.write(F.Batch(
        gpu=pl.DataFrame({"gpu_uuid": gpus, "host": ["node-0"] * 8, "model_name": [model] * 8}),
        job_rank=pl.DataFrame({"job_id": [job_id] * 8, "rank": list(range(8)), "start": [T0] * 8, "gpu_uuid": gpus, "host": ["node-0"] * 8}),
        step=pl.DataFrame(steps),
        job_event=pl.DataFrame(events),
    ))


def test_mfu_and_goodput_product_are_stored_and_scraped(store):
    mfu_job(store)
    g = analysis.analyze_job(store, "mfu-job").goodput
    # 5e14 FLOPs in 2 s on a 989.5 TFLOP/s (bf16 dense, H100 SXM5 datasheet) GPU
    assert g["gpu_model"] == "NVIDIA H100 80GB HBM3" and g["peak_flops"] == 989.5e12 and g["mfu_dtype"] == "bf16"
    assert g["mfu_ratio"] == pytest.approx(5e14 / (2 * 989.5e12))
    assert g["scheduling_goodput_ratio"] == 1.0
    assert g["goodput_product_ratio"] == pytest.approx(g["scheduling_goodput_ratio"] * g["goodput_ratio"] * g["mfu_ratio"])
    assert 0 < g["goodput_ratio"] < 1
    series = store.read("metric_sample")["series"].to_list()
    assert sorted(series) == ['job_goodput_product_ratio{job_id="mfu-job"}', 'job_goodput_ratio{job_id="mfu-job"}',
                              'job_mfu_ratio{job_id="mfu-job"}']
    text = fleet_metrics.exposition(store).decode()
    mfu_line = [ln for ln in text.splitlines() if ln.startswith('fleetscope_job_mfu_ratio{job_id="mfu-job"}')]
    assert len(mfu_line) == 1 and float(mfu_line[0].split()[-1]) == pytest.approx(g["mfu_ratio"])
    assert f'fleetscope_job_goodput_product_ratio{{job_id="mfu-job"}} {g["goodput_product_ratio"]}' in text


@pytest.mark.parametrize("model, note", [
    ("Tesla T4", "T4 has no bf16 rate in its datasheet"),
    ("NVIDIA Mystery 9000", "GPU model 'NVIDIA Mystery 9000' is not in gpu_peaks.csv"),
])
def test_mfu_left_out_with_a_note_when_the_peak_is_unknown(store, model, note):
    mfu_job(store, model=model)
    result = analysis.analyze_job(store, "mfu-job")
    assert result.goodput["mfu_ratio"] is None and result.goodput["goodput_product_ratio"] is None
    assert any(note in n for n in result.notes), result.notes
    assert 'job_mfu_ratio{job_id="mfu-job"}' not in store.read("metric_sample")["series"].to_list()


def test_api_whatif_and_goodput(api, realdata):
    store = api.app.state.store
    ingest = {"Authorization": "Bearer " + auth.create_token(store.engine, "i", ["ingest"])}
    read = {"Authorization": "Bearer " + auth.create_token(store.engine, "r", ["read"])}
    admin = {"Authorization": "Bearer " + auth.create_token(store.engine, "a", ["admin"])}
    body = (realdata / WHATIF / "trace-ST.parquet").read_bytes()
    r = httpx.post(api.url + "/api/v1/ingest/bytedance_whatif", params={"job_id": "st-api", "ts": T0.isoformat()},
                   content=body, headers=ingest, timeout=60)
    assert r.status_code == 200, r.text
    assert httpx.get(api.url + "/api/v1/jobs/st-api/whatif", headers=read).status_code == 404  # not analysed yet
    assert httpx.post(api.url + "/api/v1/jobs/st-api/analyze", headers=admin, timeout=60).status_code == 200
    assert httpx.get(api.url + "/api/v1/jobs/st-api/whatif").status_code == 401
    w = httpx.get(api.url + "/api/v1/jobs/st-api/whatif", headers=read).json()
    assert abs(w["result"]["slowdown"] / ST_SLOWDOWN - 1) < 0.02 and w["result"]["verdict"] == "slow_stage"
    mfu_job(store, "mfu-api")
    httpx.post(api.url + "/api/v1/jobs/mfu-api/analyze", headers=admin, timeout=60)
    g = httpx.get(api.url + "/api/v1/jobs/mfu-api/goodput", headers=read).json()["result"]
    assert g["mfu_ratio"] == pytest.approx(5e14 / (2 * 989.5e12)) and g["goodput_product_ratio"] > 0


def test_cli_whatif(tmp_path, realdata):
    env = {**os.environ, "FLEETSCOPE_DATA_DIR": str(tmp_path)}
    env.pop("FLEETSCOPE_DATABASE_URL", None)
    run = lambda *a: clirun.cli(*a, env=env)  # noqa: E731
    trace = realdata / WHATIF / "trace-ST.parquet"
    out = run("ingest", str(trace), "--format", "bytedance_whatif", "--job-id", "st-cli")
    assert out.returncode == 0, out.stderr
    assert "no what-if analysis" in run("jobs", "whatif", "st-cli").stderr
    assert run("jobs", "analyze", "st-cli").returncode == 0
    out = run("jobs", "whatif", "st-cli")
    assert out.returncode == 0, out.stderr
    assert "slow_stage (stage3)" in out.stdout and "stage 3 1.2" in out.stdout
    w = json.loads(run("jobs", "whatif", "st-cli", "--json").stdout)["result"]
    assert abs(w["slowdown"] / ST_SLOWDOWN - 1) < 0.02
    assert run("jobs", "whatif", "nope").returncode != 0

"""Format detection and the ingest entry points (CLI and API) over the real files in ../shared/realdata."""

import gzip
import json
import os

import httpx
import pytest

from fleetscope.services import auth
from fleetscope.door import ingestion
from fleetscope.core import frames as F
from fleetscope.core.errors import ParseError
from fleetscope.store import Store
from tests import clirun

TELEMETRY = "telemetry"
EXPECTED = {
    "telemetry/nccl-debug-info+all_reduce_perf_2xT4_EFA_nccl-2.12.7_mpirun.log": ["nccl_log", "nccl_tests"],
    "telemetry/nccl-inspector_output-examples_v4.0_from-README.jsonl": ["nccl_inspector"],
    "telemetry/nccl-inspector_prometheus-textfile-examples_v5.1_from-README.prom": ["nccl_inspector_prom"],
    "telemetry/nccl-tests_all_reduce_perf_p5.48xlarge_H100_EFA_mpirun_excerpt.txt": ["nccl_tests"],
    "traces/hta/nccl_data_rank0_of_2/nccl_data.json.gz": ["kineto"],
    "traces/hta/trace_diff/control/control.json.gz": ["kineto"],
    "telemetry/otlp-json_ExportMetricsServiceRequest_example_opentelemetry-proto.json": ["otlp_json"],
    "telemetry/dcgm-exporter_metrics_8xH100_k8s-pod-labels_sampled_nvidia-aicr.prom": ["dcgm"],
    "telemetry/dcgm-exporter_metrics_L40S_helm-default_full_cncf-upcloud.prom": ["dcgm"],
    "telemetry/dcgm-exporter_metrics_1xL4_default-counters_full_cncf-kops.prom": ["dcgm"],
    "telemetry/nvidia-smi_q-x_A100-SXM4-80GB_MIG_driver-535.54.03_telegraf-testdata.xml": ["nvidia_smi_xml"],
    "telemetry/nvidia-smi_query-gpu_all-fields_H100_590.48.01_load.csv": ["nvidia_smi_csv"],
    "telemetry/nvidia-smi_capture_linux-x86_64__nvidia-h100-80gb-hbm3__590.48.01.txt": ["nvidia_smi_capture"],
    "telemetry/dcgm-exporter_default-counters.csv": [],
    "telemetry/SOURCES.md": [],
    "fabric/SOURCES.md": [],
    "fabric/node-exporter_e2e-output_node_infiniband.prom": ["ib_node_exporter"],
    "fabric/node-exporter_sys-class-infiniband_i40iw0-mlx4_0.ttar": ["ib_sysfs_ttar"],
    "fabric/procfs_sys-class-infiniband_hfi1-mlx4-mlx5-hw_counters.ttar": ["ib_sysfs_ttar"],
    "fabric/perfquery-x_osc_0x506b4b03005c2740.txt": ["perfquery"],
    "fabric/perfquery-x_osc_0x7cfe9003009ce5b0.txt": ["perfquery"],
    "fabric/perfquery-x_osc_0x7cfe9003003b4bde.txt": ["perfquery"],
    "fabric/perfquery-x_osc_0x7cfe9003003b4b96.txt": ["perfquery"],
    "fabric/perfquery-E-rcv-error-details_osc_0x7cfe9003009ce5b0-port1.txt": ["perfquery"],
    "fabric/ibnetdiscover-ports_osc_edr.txt": ["ibnetdiscover"],
    "fabric/ibnetdiscover-ports_hdr-sharp-spine.txt": ["ibnetdiscover"],
    "fabric/nccl-topo_azure-ndv5_8xH100-8xIB.xml": ["nccl_topo"],
    "fabric/nccl-topo_azure-ndv4_8xA100-8xIB.xml": ["nccl_topo"],
    "fabric/ibswinfo_qm8790-hdr-switch.txt": ["ibswinfo"],
    "fabric/ibswinfo_sb7790-edr-switch_fan-error.txt": ["ibswinfo"],
    "fabric/sinfo-node-features_osc-owens_ib-leaf-switch-map.txt": ["slurm_ib_features"],
    "serving/vllm-v1_metrics_Qwen2.5-0.5B_idle_full_cncf-kops.prom": ["vllm"],
    "serving/vllm-v0_metrics_Llama-3.1-8B-FP8_kubeai-mock.prom": ["vllm"],
    "serving/sglang_metrics_Llama-3.1-8B_overload_docs-example.prom": ["sglang"],
    "serving/huggingface-tgi_metrics_datadog-fixture.prom": ["tgi"],
    "serving/nvidia-nim_llama-3.1-8b-instruct_metrics_datadog-fixture.prom": ["nim"],
    "serving/triton-server_metrics_T4_densenet_datadog-fixture.prom": ["triton"],
    "serving/triton-trtllm-backend_nv_trt_llm_metrics_doc-example_README.prom": ["triton"],
    "serving/grafana-dashboard_vllm-model-metrics_production-stack.json": [],
    "serving/SOURCES.md": [],
    "scheduler/SOURCES.md": [],
    "scheduler/slurm_sacct-parsable-snowman-delim_habrok_gres-gpu.txt": ["slurm_sacct"],
    "scheduler/slurm_sstat-parsable_habrok.txt": ["slurm_sstat"],
    "scheduler/slurm_squeue-dependency-reason-cpus_habrok.txt": ["slurm_squeue"],
    "scheduler/slurm_scontrol-show-nodes-cfgtres_habrok.txt": ["slurm_scontrol_nodes"],
    "scheduler/sinfo-N-json_v0.0.39_23.02.5_localhost.json": ["slurmrestd"],
    "scheduler/squeue-json_v0.0.37_21.08.5_rivos.json": ["slurmrestd"],
    "scheduler/slurmrestd_v0.0.41_24.05.6_nodes_981x8gpu-fleet.json": ["slurmrestd"],
    "scheduler/slurmrestd_v0.0.42_24.11_slurm-jobs.json": ["slurmrestd"],
    "scheduler/slurmrestd_v0.0.44_25.11_slurmdb-job-completed.json": ["slurmrestd"],
}


@pytest.mark.parametrize(("path", "formats"), sorted(EXPECTED.items()))
def test_detects_real_files(realdata, path, formats):
    assert ingestion.detect((realdata / path).read_bytes()) == formats


def test_detects_job_events_and_rejects_noise():
    assert ingestion.detect(b'{"job_id": "j1", "ts": "2026-03-01T12:00:00Z", "kind": "started"}\n') == ["job_events"]
    for noise in (b"", b"\x00\x01\x02" * 100, b"hello world\n", b"\x1f\x8b\x08\x00garbage", b"[1,2,3]"):
        assert ingestion.detect(noise) == []


def test_unknown_and_forced_formats():
    with pytest.raises(ingestion.UnknownFormat, match="format not recognised"):
        ingestion.parse(b"hello", source="x.txt")
    with pytest.raises(ingestion.UnknownFormat, match="unknown format 'csv'"):
        ingestion.parse(b"hello", source="x.txt", fmt="csv")


def run_cli(tmp_path, *args):
    env = {**os.environ, "FLEETSCOPE_DATA_DIR": str(tmp_path)}
    env.pop("FLEETSCOPE_DATABASE_URL", None)
    return clirun.cli(*args, env=env)


def test_cli_ingests_good_files_reports_bad_ones_and_exits_1(realdata, tmp_path):
    bad = tmp_path / "inputs" / "broken.jsonl"
    bad.parent.mkdir()
    bad.write_bytes(b'{"job_id": "j1", "ts": "2026-03-01T12:00:00Z", "kind": "started"}\n{"job_id": "j1", "ts": ')
    good = realdata / "telemetry/nccl-tests_all_reduce_perf_p5.48xlarge_H100_EFA_mpirun_excerpt.txt"
    proc = run_cli(tmp_path, "ingest", "--json", str(good), str(bad))
    assert proc.returncode == 1, proc.stderr
    lines = [json.loads(line) for line in proc.stdout.splitlines()]
    assert lines[0]["formats"] == ["nccl_tests"] and lines[0]["written"] == {"nccl_test": 64}
    assert lines[0]["notes"]["avg_busbw_gbps"] == 123.343  # as printed in the file
    assert "broken.jsonl" in lines[1]["error"] and "line 2" in lines[1]["error"]
    assert lines[2]["summary"] == {"files": 2, "rejected": 1, "skipped": 0, "written": {"nccl_test": 64}}
    store = Store.open(f"sqlite:///{tmp_path / 'fleetscope.store.db'}")
    assert store.counts()["job_event"] == 0  # the broken file wrote nothing, not even its good first line
    again = run_cli(tmp_path, "ingest", "--json", str(good))
    assert json.loads(again.stdout.splitlines()[0])["skipped_duplicate"] is True
    assert store.counts()["nccl_test"] == 64


def test_cli_formats_and_missing_path(tmp_path):
    names = [f["name"] for f in json.loads(run_cli(tmp_path, "fleet", "formats", "--json").stdout)]
    assert names == list(ingestion.FORMATS)
    proc = run_cli(tmp_path, "ingest", str(tmp_path / "nope.log"))
    assert proc.returncode != 0 and "no such file or directory" in proc.stderr


def ingest_headers(api):
    return {"Authorization": "Bearer " + auth.create_token(api.app.state.store.engine, "t", ["ingest"]), "Content-Type": "application/octet-stream"}


def test_api_ingests_a_real_kineto_trace_and_is_idempotent(api, realdata):
    data = (realdata / "traces/hta/nccl_data_rank0_of_2/nccl_data.json.gz").read_bytes()
    h = ingest_headers(api)
    r = httpx.post(api.url + "/api/v1/ingest/auto", params={"job_id": "hta-nccl", "source": "nccl_data.json.gz"}, content=data, headers=h, timeout=120)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["formats"] == ["kineto"]
    assert body["written"]["collective"] == 21 and body["written"]["step"] == 3
    store = api.app.state.store
    steps = store.read("step", job_id="hta-nccl")
    assert steps["rank"].unique().to_list() == [0]
    r2 = httpx.post(api.url + "/api/v1/ingest/kineto", params={"job_id": "hta-nccl"}, content=data, headers=h, timeout=120)
    assert r2.status_code == 200 and sum(r2.json()["written"].values()) <= 1  # the job row may refresh; no new facts
    assert store.counts()["collective"] == 21


@pytest.mark.parametrize(
    ("fmt", "content", "status", "words"),
    [
        ("auto", b"definitely not telemetry", 415, "format not recognised"),
        ("tarball", b"x", 404, "unknown format"),
        ("kineto", gzip.compress(b'{"traceEvents": [' + b'{"ph": "X"},' * 1000)[:200], 400, "not valid json"),
        ("kineto", b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 10, 400, ""),
        ("job_events", b'{"job_id": "j", "ts": "2026-03-01T12:00:00Z", "kind": "teleported"}\n', 400, "kind"),
        ("nccl_inspector", b'{"header": {"id": "0x1", "rank": 0}}\n{not json\n', 400, "line"),
        ("auto", b"", 400, "empty body"),
    ],
    ids=["unrecognised", "unknown-format", "truncated-gzip", "binary", "bad-kind", "malformed-jsonl", "empty"],
)
def test_api_rejects_bad_input_and_writes_nothing(api, fmt, content, status, words):
    r = httpx.post(api.url + f"/api/v1/ingest/{fmt}", content=content, headers=ingest_headers(api), timeout=60)
    assert r.status_code == status, r.text
    assert words.lower() in r.json()["detail"].lower()
    assert sum(api.app.state.store.counts().values()) == 0


def test_api_ingest_needs_the_ingest_scope(api, realdata):
    data = (realdata / "telemetry/nccl-tests_all_reduce_perf_p5.48xlarge_H100_EFA_mpirun_excerpt.txt").read_bytes()
    read_only = {"Authorization": "Bearer " + auth.create_token(api.app.state.store.engine, "r", ["read"])}
    assert httpx.post(api.url + "/api/v1/ingest/auto", content=data, headers=read_only).status_code == 403
    assert httpx.post(api.url + "/api/v1/ingest/auto", content=data).status_code == 401
    assert api.app.state.store.counts()["nccl_test"] == 0


def test_api_refuses_a_gzip_bomb_before_it_inflates(api):
    """1 MB is this server's body limit; 2 MB of gzip that would inflate to 2 GB of zeros is a 413 once the
    inflated bytes pass the limit, and nothing is written; a body inflating to just under it is fine."""
    limit = api.app.state.settings.max_body_bytes
    bomb = gzip.compress(b"0" * (64 * limit), compresslevel=9)
    assert len(bomb) < limit
    r = httpx.post(api.url + "/api/v1/ingest/dcgm", content=bomb, headers=ingest_headers(api), timeout=60)
    assert r.status_code == 413 and f"inflates past the limit of {limit} bytes" in r.json()["detail"]
    multi = gzip.compress(b"# two members\n") + gzip.compress(b"DCGM_FI_DEV_GPU_TEMP{gpu=\"0\",UUID=\"GPU-a\",Hostname=\"n1\"} 41\n")
    ok = httpx.post(api.url + "/api/v1/ingest/dcgm", content=multi, headers=ingest_headers(api), params={"ts": "2026-03-01T12:00:00Z"})
    assert ok.status_code == 200, ok.text
    assert api.app.state.store.read("gpu_sample")["temp_c"].to_list() == [41.0]
    cut = httpx.post(api.url + "/api/v1/ingest/dcgm", content=multi[:-10], headers=ingest_headers(api))
    assert cut.status_code == 400 and "truncated or corrupt gzip" in cut.json()["detail"]
    assert sum(api.app.state.store.counts().values()) == sum(ok.json()["written"].values())


def spy_streamed_inflate(monkeypatch) -> list[int]:
    """A list that gets a 1 for each streamed inflate (gunzip_capped's whole one, which also takes a zlib
    header, is not counted)."""
    seen: list[int] = []
    real = ingestion.inflate_pieces

    def spy(*a, **k):
        if "wbits" not in k:
            seen.append(1)
        return real(*a, **k)

    monkeypatch.setattr(ingestion, "inflate_pieces", spy)
    return seen


def test_api_streams_a_large_kineto_trace_and_bounds_its_inflation(api, realdata, monkeypatch):
    """Above the whole-parse size a Kineto body is decoded a piece at a time (a gzip one inflated a piece at
    a time too), with the same rows as the whole parse; a gzip trace that inflates past the Kineto limit is
    a 413 and writes nothing."""
    gz = (realdata / "traces/hta/nccl_data_rank0_of_2/nccl_data.json.gz").read_bytes()
    plain = gzip.decompress(gz)
    whole = ingestion.parse(plain, source="t", fmt="kineto", opts=ingestion.Options(job_id="j"))[1]
    monkeypatch.setattr(ingestion, "KINETO_WHOLE_MAX_BYTES", 1024)
    calls = spy_streamed_inflate(monkeypatch)
    r = httpx.post(api.url + "/api/v1/ingest/kineto", params={"job_id": "from-gz"}, content=gz, headers=ingest_headers(api), timeout=120)
    assert r.status_code == 200, r.text
    assert calls == [1]  # inflated a piece at a time, not whole
    sliced = ingestion.parse(plain, source="t", fmt="kineto", opts=ingestion.Options(job_id="j"))[1]  # plain JSON, cut in pieces
    assert sliced.collective.equals(whole.collective) and sliced.step.equals(whole.step)
    store = api.app.state.store
    got = store.read("collective", job_id="from-gz").drop("job_id").sort("rank", "comm_id", "seq")
    want = F.conform(F.COLLECTIVE, whole.collective).drop("job_id").sort("rank", "comm_id", "seq")
    assert got.equals(want.select(got.columns))
    assert store.read("step", job_id="from-gz").height == whole.step.height == 3
    monkeypatch.setattr(ingestion, "KINETO_MAX_INFLATED_BYTES", len(plain) // 2)
    r = httpx.post(api.url + "/api/v1/ingest/kineto", params={"job_id": "too-big"}, content=gz, headers=ingest_headers(api), timeout=120)
    assert r.status_code == 413 and store.read("step", job_id="too-big").height == 0


def test_a_gzip_document_read_whole_is_refused_past_the_inflation_limit(store, tmp_path, realdata, monkeypatch):
    """Document formats are read whole; their gzip is inflated within WHOLE_INFLATED_MAX_BYTES, so a small
    file cannot expand without bound. The real nccl-tests output passes; past the limit is TooLarge, and
    nothing is written."""
    from fleetscope.door import streaming

    text = (realdata / "telemetry/nccl-tests_all_reduce_perf_p5.48xlarge_H100_EFA_mpirun_excerpt.txt").read_bytes()
    path = tmp_path / "all_reduce_perf.txt.gz"
    path.write_bytes(gzip.compress(text))
    monkeypatch.setattr(ingestion, "WHOLE_INFLATED_MAX_BYTES", len(text) - 1)
    with pytest.raises(ingestion.TooLarge, match=f"inflates past the limit of {len(text) - 1} bytes"):
        streaming.ingest_file(store, path)
    assert sum(store.counts().values()) == 0
    monkeypatch.setattr(ingestion, "WHOLE_INFLATED_MAX_BYTES", len(text))
    assert streaming.ingest_file(store, path).result.written["nccl_test"] > 0


def test_gzip_members_are_bounded_and_a_forged_trailer_is_not_trusted(monkeypatch):
    from fleetscope.core.textinput import MAX_GZIP_MEMBERS
    from ingest import kineto

    many = gzip.compress(b"") * (MAX_GZIP_MEMBERS + 1)
    for inflate in (lambda: ingestion.gunzip_capped(many, 2**20, "bomb.gz"), lambda: list(ingestion.inflate_pieces(many, 2**20, "bomb.gz")),
                    lambda: kineto.parse_chunks([many], source="bomb.gz")):
        with pytest.raises(ParseError, match=f"more than {MAX_GZIP_MEMBERS} gzip members"):
            inflate()
    assert ingestion.gunzip_capped(gzip.compress(b"a") * MAX_GZIP_MEMBERS, 2**20, "ok.gz") == b"a" * MAX_GZIP_MEMBERS
    # 40 MB of whitespace in a trace whose trailer claims 100 bytes: inflated within the whole-parse size,
    # found too large, and taken a piece at a time, never whole
    body = bytearray(gzip.compress(b'{"traceEvents": [' + b" " * (40 * 2**20)))
    body[-4:] = (100).to_bytes(4, "little")
    pieces = spy_streamed_inflate(monkeypatch)
    with pytest.raises(ParseError):
        ingestion.parse(bytes(body), source="forged.json.gz", fmt="kineto")
    assert pieces == [1]


def test_cli_ingests_every_scheduler_file(realdata, tmp_path):
    """`fleetscope ingest DIR` on ../shared/realdata/scheduler: every data file detected and written (only
    SOURCES.md, the provenance notes, is refused), and the stored figures are the files'."""
    folder = realdata / "scheduler"
    proc = run_cli(tmp_path, "ingest", "--json", str(folder))
    lines = [json.loads(line) for line in proc.stdout.splitlines()]
    per_file = {os.path.basename(o["source"]): o for o in lines if "source" in o}
    data_files = sorted(p.name for p in folder.iterdir() if p.name != "SOURCES.md")
    assert len(data_files) == 32
    for name in data_files:
        assert not per_file[name].get("error"), (name, per_file[name])
        assert per_file[name]["formats"], name
    assert [n for n, o in per_file.items() if o.get("error")] == ["SOURCES.md"]
    store = Store.open(f"sqlite:///{tmp_path / 'fleetscope.store.db'}")
    jobs = store.read("sched_job")
    habrok = jobs.filter(jobs["cluster"] == "")
    import polars as pl

    gpu_h = habrok.filter(pl.col("gpus").is_not_null() & pl.col("elapsed_s").is_not_null())
    assert round(gpu_h.select((pl.col("gpus") * pl.col("elapsed_s")).sum()).item() / 3600, 2) == 220.40
    nodes = store.read("sched_node")
    assert nodes.filter(pl.col("host").str.starts_with("fs-mbz-gpu"))["gpus_alloc"].sum() == 2263
    assert store.counts()["sched_account"] == 10

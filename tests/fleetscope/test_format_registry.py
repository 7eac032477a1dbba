"""The format registry: every format is declared once in its own module (ingest.format.FormatSpec) and
collected from ingestion.FORMAT_MODULES. Each declaration is complete, each content test finds a sample of
its own format (real files from ../shared/realdata where they exist), and a new source is one module plus
its line in the list."""

from __future__ import annotations

import datetime as dt
import gzip
import importlib
import textwrap

import pytest

from fleetscope.door import ingestion
from fleetscope.door import streaming
from fleetscope.door.ingestion import Options
from ingest.format import FormatSpec, Sniff, SniffView, Splitting

T0 = dt.datetime(2026, 3, 1, 12, tzinfo=dt.UTC)

# Samples per format: ("real", path under shared/realdata) or ("synthetic", bytes).
SAMPLES: dict[str, list[tuple[str, str | bytes]]] = {
    "dcgm": [("real", "telemetry/dcgm-exporter_metrics_1xL4_default-counters_full_cncf-kops.prom"),
             ("synthetic", b'# HELP DCGM_FI_DEV_GPU_TEMP temp\nDCGM_FI_DEV_GPU_TEMP{gpu="0",UUID="GPU-a"} 41\n')],
    "nvidia_smi_csv": [("real", "telemetry/nvidia-smi_query-gpu_all-fields_H100_590.48.01_load.csv"),
                       ("synthetic", b"timestamp, uuid, power.draw [W]\n2026/03/01 12:00:00.000, GPU-a, 70.5 W\n")],
    "nvidia_smi_xml": [("real", "telemetry/nvidia-smi_q-x_A100-SXM4-80GB_MIG_driver-535.54.03_telegraf-testdata.xml")],
    "nvidia_smi_capture": [("real", "telemetry/nvidia-smi_capture_linux-x86_64__nvidia-h100-80gb-hbm3__590.48.01.txt")],
    "kineto": [("real", "traces/hta/trace_diff/control/control.json.gz"),
               ("synthetic", b'{"schemaVersion": 1, "traceEvents": [{"ph": "X", "name": "k", "ts": 1, "dur": 2}]}')],
    "nccl_inspector": [("real", "telemetry/nccl-inspector_output-examples_v4.0_from-README.jsonl")],
    "nccl_inspector_prom": [("real", "telemetry/nccl-inspector_prometheus-textfile-examples_v5.1_from-README.prom"),
                            ("synthetic", b'nccl_bus_bandwidth{comm="0x1",rank="0"} 12.5\n')],
    "nccl_log": [("real", "telemetry/nccl-debug-info+all_reduce_perf_2xT4_EFA_nccl-2.12.7_mpirun.log"),
                 ("synthetic", b"node1:4242:4242 [0] NCCL INFO Bootstrap : Using eth0\n")],
    "nccl_tests": [("real", "telemetry/nccl-tests_all_reduce_perf_p5.48xlarge_H100_EFA_mpirun_excerpt.txt"),
                   ("synthetic", b'{"results": [{"size": 8, "busbw": 0.01, "algbw": 0.01}]}\n'),  # the -J JSON sniff
                   ("synthetic", b"#       size   count   type   redop    root     time   algbw   busbw #wrong\n")],
    "otlp_json": [("real", "telemetry/otlp-json_ExportMetricsServiceRequest_example_opentelemetry-proto.json"),
                  ("synthetic", b'{"resourceMetrics": []}')],
    "job_events": [("synthetic", b'{"job_id": "j1", "ts": "2026-03-01T12:00:00Z", "kind": "started"}\n')],
    "ib_node_exporter": [("real", "fabric/node-exporter_e2e-output_node_infiniband.prom")],
    "ib_sysfs_ttar": [("real", "fabric/procfs_sys-class-infiniband_hfi1-mlx4-mlx5-hw_counters.ttar")],
    "perfquery": [("real", "fabric/perfquery-x_osc_0x506b4b03005c2740.txt")],
    "ibnetdiscover": [("real", "fabric/ibnetdiscover-ports_osc_edr.txt")],
    "nccl_topo": [("real", "fabric/nccl-topo_azure-ndv5_8xH100-8xIB.xml")],
    # no file of its own in realdata (the H100 capture holds one inside, read by tests/ingest/test_nvidia_smi_topo.py)
    "nvidia_smi_topo": [("synthetic", b"\t\x1b[4mGPU0\tNIC0\tCPU Affinity\tNUMA Affinity\x1b[0m\nGPU0\t X \tPIX\t0-19\t0\n"
                                      b"NIC0\tPIX\t X \n\nLegend:\n\n  X    = Self\n\nNIC Legend:\n\n  NIC0: mlx5_0\n")],
    "ibswinfo": [("real", "fabric/ibswinfo_qm8790-hdr-switch.txt")],
    "slurm_ib_features": [("real", "fabric/sinfo-node-features_osc-owens_ib-leaf-switch-map.txt")],
    "slurmrestd": [("real", "scheduler/slurmrestd_v0.0.42_24.11_slurm-jobs.json"), ("real", "scheduler/squeue-json_v0.0.37_21.08.5_rivos.json")],
    "slurm_sacct": [("real", "scheduler/slurm_sacct-parsable-snowman-delim_habrok_gres-gpu.txt"),
                    ("synthetic", b"JobID|JobName|Account|State|AllocTRES|\n42|train|ml|COMPLETED|cpu=8,gres/gpu=8|\n")],
    "slurm_sstat": [("real", "scheduler/slurm_sstat-parsable_habrok.txt")],
    "slurm_squeue": [("real", "scheduler/slurm_squeue-dependency-reason-cpus_habrok.txt")],
    "slurm_scontrol_nodes": [("real", "scheduler/slurm_scontrol-show-nodes-cfgtres_habrok.txt")],
    "kube_state_metrics": [("synthetic", b'kube_pod_container_resource_requests{namespace="ml",pod="p",container="c",node="n1",resource="nvidia_com_gpu",unit="integer"} 1\n')],
    "model_monitoring": [("synthetic", b'{"model": "credit", "version": "1", "prediction_id": "p1", "ts": "2026-03-01T12:00:00Z", "score": 0.4}\n')],
    "vllm": [("real", "serving/vllm-v0_metrics_Llama-3.1-8B-FP8_kubeai-mock.prom"),
             ("synthetic", b'vllm:num_requests_waiting{model_name="m"} 2\n')],
    "sglang": [("real", "serving/sglang_metrics_Llama-3.1-8B_overload_docs-example.prom")],
    "tgi": [("real", "serving/huggingface-tgi_metrics_datadog-fixture.prom"), ("synthetic", b"tgi_queue_size 0\n")],
    "triton": [("real", "serving/triton-server_metrics_T4_densenet_datadog-fixture.prom")],
    "serving_requests": [("synthetic", b'{"deployment": "chat", "request_id": 1, "arrival": "2026-03-01T12:00:00Z"}\n')],
    "nim": [("real", "serving/nvidia-nim_llama-3.1-8b-instruct_metrics_datadog-fixture.prom")],
}
SNIFFED = [name for name, f in ingestion.FORMATS.items() if f.spec.sniff]


CASES = [(name, kind, what) for name in SNIFFED for kind, what in SAMPLES.get(name, [])]


def _sample(kind: str, what: str | bytes, request) -> bytes:
    """A synthetic sample, or a real file read in place (the realdata fixture skips with the reason)."""
    return what if kind == "synthetic" else (request.getfixturevalue("realdata") / what).read_bytes()


def _fired(spec: FormatSpec, data: bytes) -> set[int]:
    """The indexes of the format's content tests that match the sample's decoded head."""
    head = data[: ingestion.SNIFF_BYTES]
    if head.startswith(ingestion.GZIP_MAGIC):
        head = gzip.decompress(data)[: ingestion.SNIFF_BYTES]
    view = SniffView(head.decode("utf-8", "replace"))
    return {i for i, s in enumerate(spec.sniff) if s.test(view)}


def test_every_format_is_declared_completely_and_once():
    seen = set()
    for name in ingestion.FORMAT_MODULES:
        for spec in importlib.import_module(name).FORMATS:
            assert isinstance(spec, FormatSpec)
            assert spec.name not in seen, f"{spec.name} declared twice"
            seen.add(spec.name)
            assert spec.name.isidentifier() and spec.name != "auto"
            assert spec.description.strip(), spec.name
            assert callable(spec.parse), spec.name
            assert all(isinstance(s, Sniff) and callable(s.test) for s in spec.sniff), spec.name
            assert spec.streaming is None or isinstance(spec.streaming, Splitting), spec.name
    assert seen == set(ingestion.FORMATS)
    for name, f in ingestion.FORMATS.items():
        assert f.name == name and f.module in ingestion.FORMAT_MODULES and callable(f.call)
        assert f.gzip_aware == f.spec.gzip_aware
    assert set(streaming.STREAMED) == {n for n, f in ingestion.FORMATS.items() if f.spec.streaming}
    assert "prometheus_remote_write" in ingestion.FORMATS and "prometheus_remote_write" not in SNIFFED


def test_every_sniffed_format_has_a_sample():
    assert not [name for name in SNIFFED if name not in SAMPLES], "add a sample for each new sniffed format"


@pytest.mark.parametrize(("name", "kind", "what"), CASES, ids=[f"{n}-{k}{i}" for i, (n, k, _) in enumerate(CASES)])
def test_every_sniffed_format_is_detected_on_a_sample_of_its_own(name, kind, what, request):
    data = _sample(kind, what, request)
    assert name in ingestion.detect(data)
    assert _fired(ingestion.FORMATS[name].spec, data)


@pytest.mark.parametrize("name", SNIFFED)
def test_each_content_test_of_a_format_finds_one_of_its_samples(name, request):
    """A format with several content tests (nccl-tests: -J JSON, text table) has a sample for each."""
    spec = ingestion.FORMATS[name].spec
    fired: set[int] = set()
    for kind, what in SAMPLES.get(name, []):
        fired |= _fired(spec, _sample(kind, what, request))
    assert fired == set(range(len(spec.sniff)))


# A throwaway source: one module and its line in FORMAT_MODULES, nothing else.
THROWAWAY = '''
import datetime as dt

import polars as pl

from fleetscope.core.errors import ParseError
from fleetscope.core.frames import METRIC_SAMPLE, Batch
from ingest.format import FormatSpec, Sniff, Splitting, cut_line


def parse(data, *, source="", ts=None):
    rows = []
    for n, line in enumerate(data.decode().splitlines(), start=1):
        if not line.strip():
            continue
        word, name, value = line.split()
        if word != "TICK":
            raise ParseError("not a TICK line", source=source, line=n)
        rows.append({"ts": ts, "series": "tick_" + name, "value": float(value)})
    return Batch(source=source, metric_sample=pl.DataFrame(rows, schema=METRIC_SAMPLE.schema))


FORMATS = (
    FormatSpec("ticks", "throwaway TICK lines", lambda d, s, o: parse(d, source=s, ts=o.ts),
               sniff=Sniff(45, lambda v: v.stripped.startswith("TICK ")), needs_ts=True,
               streaming=Splitting(cut_line, max_piece=64)),
)
'''


def test_a_new_source_is_one_module_plus_its_registration(store, tmp_path, monkeypatch):
    (tmp_path / "throwaway_ticks_format.py").write_text(textwrap.dedent(THROWAWAY))
    monkeypatch.syspath_prepend(str(tmp_path))
    assert "ticks" not in ingestion.FORMATS
    monkeypatch.setattr(ingestion, "FORMAT_MODULES", [*ingestion.FORMAT_MODULES, "throwaway_ticks_format"])
    assert "ticks" in ingestion.FORMATS and ingestion.FORMATS["ticks"].module == "throwaway_ticks_format"
    assert "ticks" in streaming.STREAMED
    body = b"TICK a 1\nTICK b 2\n"
    assert ingestion.detect(body) == ["ticks"]
    assert ingestion.detect(gzip.compress(body)) == ["ticks"]
    assert ingestion.resolve(body, source="t", fmt="ticks") == ["ticks"]
    out = ingestion.ingest_bytes(store, body, source="ticks.txt", opts=Options(ts=T0))
    assert out.formats == ["ticks"] and out.result.written == {"metric_sample": 2}
    assert sorted(store.read("metric_sample")["series"].to_list()) == ["tick_a", "tick_b"]
    # a large file of it streams in pieces cut where its declaration says
    path = tmp_path / "many.ticks"
    path.write_bytes(b"".join(b"TICK s%d %d\n" % (i, i) for i in range(40)))
    streamed = streaming.ingest_file(store, path, opts=Options(ts=T0))
    assert streamed.error is None and streamed.notes["chunks"] > 1
    assert streamed.result.written == {"metric_sample": 40}
    # the existing formats and their detection are untouched by the addition
    assert ingestion.detect(b'{"job_id": "j1", "ts": "2026-03-01T12:00:00Z", "kind": "started"}\n') == ["job_events"]


def test_without_its_registration_the_module_is_not_a_format(monkeypatch):
    assert ingestion.detect(b"TICK a 1\n") == []
    with pytest.raises(ingestion.UnknownFormat):
        ingestion.resolve(b"TICK a 1\n", source="t", fmt="ticks")


def test_a_name_declared_twice_is_refused(tmp_path, monkeypatch):
    (tmp_path / "throwaway_dup_format.py").write_text(textwrap.dedent('''
        from ingest.format import FormatSpec
        FORMATS = (FormatSpec("dcgm", "a second dcgm", lambda d, s, o: None),)
    '''))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(ingestion, "FORMAT_MODULES", [*ingestion.FORMAT_MODULES, "throwaway_dup_format"])
    with pytest.raises(ValueError, match="'dcgm' of throwaway_dup_format is already registered"):
        ingestion.detect(b"x")

"""Inference servers' /metrics bodies from ../shared/realdata/serving, read in place; the figures asserted
are the servers' own (and the identities SOURCES.md derives from them), then malformed, truncated,
oversized and hostile bodies."""

from __future__ import annotations

import datetime as dt
import math
from pathlib import Path

import polars as pl
import pytest

from fleetscope.core.errors import ParseError
from ingest import serving_metrics as sm

from tests.ingest.conftest import REALDATA

T0 = dt.datetime(2026, 3, 1, 12, 0, tzinfo=dt.UTC)
VLLM_V0 = "vllm-v0_metrics_Llama-3.1-8B-FP8_kubeai-mock.prom"
VLLM_V1 = "vllm-v1_metrics_Qwen2.5-0.5B_idle_full_cncf-kops.prom"
SGLANG = "sglang_metrics_Llama-3.1-8B_overload_docs-example.prom"
TGI = "huggingface-tgi_metrics_datadog-fixture.prom"
NIM = "nvidia-nim_llama-3.1-8b-instruct_metrics_datadog-fixture.prom"
TRITON = "triton-server_metrics_T4_densenet_datadog-fixture.prom"
TRTLLM = "triton-trtllm-backend_nv_trt_llm_metrics_doc-example_README.prom"


@pytest.fixture(scope="module")
def serving() -> Path:
    d = REALDATA / "serving"
    if not d.is_dir():
        pytest.skip(f"real data folder {d} is absent (see shared/realdata/README.md)")
    return d


def _read(serving: Path, name: str, server: str, **kw):  # type: ignore[no-untyped-def]
    return sm.parse((serving / name).read_bytes(), server=server, source=name, ts=T0, **kw)


def _value(df: pl.DataFrame, metric: str, **where: str) -> float:
    q = df.filter(pl.col("metric") == metric)
    for k, v in where.items():
        q = q.filter(pl.col(k) == v)
    assert q.height == 1, (metric, where, q)
    return q["value"].item()


def _bucket(df: pl.DataFrame, metric: str, le: str, labels: str = "") -> float:
    q = df.filter((pl.col("metric") == metric) & (pl.col("le") == le) & (pl.col("labels") == labels))
    assert q.height == 1, (metric, le, q)
    return q["cumulative_count"].item()


def test_vllm_v0_under_load(serving):
    b = _read(serving, VLLM_V0, "vllm")
    llama = "neuralmagic/Meta-Llama-3.1-8B-Instruct-FP8"
    g, c, h = b.serving_gauge, b.serving_counter, b.serving_bucket
    assert _value(g, "requests_running", deployment=llama) == 3
    assert _value(g, "requests_waiting", deployment=llama) == 2
    assert _value(g, "requests_waiting", deployment="other/OTHER") == 3  # the mock's second model stays apart
    assert _value(g, "kv_cache_usage_ratio", deployment=llama) == pytest.approx(0.0026235242675994863)
    # cache_config_info: 4574 GPU blocks of 16 tokens; 0.0026235 of them is 12 blocks
    assert _value(g, "kv_cache_capacity_tokens") == 4574 * 16
    assert round(0.0026235242675994863 * 4574) == 12
    assert _value(c, "generation_tokens_total") == 2546 and _value(c, "prompt_tokens_total") == 90
    assert _value(c, "requests_finished_total", labels='finish_reason="length"') == 6
    ttft = h.filter(pl.col("metric") == "ttft_seconds")
    assert ttft["count"].unique().to_list() == [9.0] and ttft["sum"].unique().to_list() == [pytest.approx(0.5106480121612549)]
    assert _bucket(h, "ttft_seconds", "+Inf") == 9
    # V0's per-token histogram is V1's inter-token latency: 2546 tokens = 2537 gaps + 9 first tokens
    itl = h.filter(pl.col("metric") == "inter_token_latency_seconds")
    assert itl["count"].unique().to_list() == [2537.0] and 2537 + 9 == 2546
    assert h.filter(pl.col("metric") == "e2e_latency_seconds")["count"].unique().to_list() == [6.0]
    assert set(b.serving_replica["server"]) == {"vllm"}


def test_vllm_v1_idle_has_the_new_names_and_empty_histograms(serving):
    b = _read(serving, VLLM_V1, "vllm")
    h, g = b.serving_bucket, b.serving_gauge
    assert set(h["metric"]) >= {"ttft_seconds", "inter_token_latency_seconds", "request_tpot_seconds", "e2e_latency_seconds",
                                "queue_time_seconds", "prefill_time_seconds", "decode_time_seconds", "inference_time_seconds"}
    ttft = h.filter(pl.col("metric") == "ttft_seconds")
    assert ttft.height == 23 and ttft["le"].to_list()[-1] == "+Inf" and ttft["cumulative_count"].sum() == 0
    assert set(ttft["labels"]) == {'engine="0"'} and set(ttft["deployment"]) == {"Qwen/Qwen2.5-0.5B-Instruct"}
    assert _value(g, "kv_cache_capacity_tokens") == 101625 * 16 == 1_626_000
    assert _value(g, "kv_cache_usage_ratio") == 0.0
    assert b.serving_counter.filter(pl.col("metric") == "requests_finished_total")["value"].sum() == 0
    assert set(b.serving_counter.filter(pl.col("metric") == "requests_finished_total")["labels"]) == {
        f'engine="0",finish_reason="{r}"' for r in ("stop", "length", "abort", "error", "repetition")}
    assert "created" not in " ".join(set(b.serving_counter["metric"]) | set(g["metric"]))


def test_every_vllm_metric_the_grafana_dashboard_queries_is_mapped(serving):
    import json
    import re

    panels = json.loads((serving / "grafana-dashboard_vllm-model-metrics_production-stack.json").read_text())
    exprs = re.findall(r"vllm:[a-z0-9_:]+", json.dumps(panels))
    table = sm.TABLES["vllm"][1]
    unmapped = {e for e in exprs if e.removeprefix("vllm:") not in table and re.sub(r"_(bucket|sum|count)$", "", e.removeprefix("vllm:")) not in table}
    assert exprs and not unmapped


def test_sglang_overloaded(serving):
    b = _read(serving, SGLANG, "sglang")
    g, c, h = b.serving_gauge, b.serving_counter, b.serving_bucket
    assert _value(g, "requests_running") == 162 and _value(g, "requests_waiting") == 2826
    assert _value(g, "kv_cache_usage_ratio") == 0.28 and _value(g, "kv_cache_used_tokens") == 123859
    assert _value(g, "generation_throughput_tokens_per_s") == pytest.approx(86.508, abs=1e-3)
    assert _value(c, "prompt_tokens_total") == 8_128_902 and _value(c, "generation_tokens_total") == 7_557_572
    # 8495 of 11008 TTFT observations lie past the last finite bucket (30 s)
    assert _bucket(h, "ttft_seconds", "30.0") == 2513 and _bucket(h, "ttft_seconds", "+Inf") == 11008
    assert "func_latency_seconds" not in set(h["metric"])


def test_tgi(serving):
    b = _read(serving, TGI, "tgi")
    c, h = b.serving_counter, b.serving_bucket
    assert _value(c, "requests_total") == 111 == _value(c, "requests_succeeded_total") + 2
    assert _value(c, "requests_failed_total", labels='reason="validation"') == 2
    assert _value(c, "batch_inferences_succeeded_total", labels='method="decode"') == 1509
    assert _bucket(h, "batch_forward_seconds", "+Inf", 'method="decode"') == 1509
    e2e = h.filter(pl.col("metric") == "e2e_latency_seconds")
    assert e2e["count"].unique().to_list() == [109.0] and e2e["sum"].unique().to_list() == [pytest.approx(541.2140316159999)]
    gen = h.filter(pl.col("metric") == "request_generation_tokens")
    assert gen["sum"].unique().to_list() == [3423.0]
    # TGI writes integer bounds without ".0"; stored as the value's shortest form, like the others
    assert "512.0" in set(h.filter(pl.col("metric") == "request_generation_tokens")["le"])
    assert h.filter(pl.col("metric") == "batch_next_size").height == 1025
    assert "request_skipped_tokens" not in set(h["metric"])  # a summary: its quantiles are not read


def test_nim_without_final_newline(serving):
    data = (serving / NIM).read_bytes()
    assert not data.endswith(b"\n")
    b = _read(serving, NIM, "nim")
    g, c, h = b.serving_gauge, b.serving_counter, b.serving_bucket
    assert _value(c, "prompt_tokens_total") == 109 and _value(c, "generation_tokens_total") == 174
    assert _value(g, "requests_max") == 64
    assert _value(g, "kv_cache_usage_ratio") == pytest.approx(0.0002848191398461977)
    assert _value(c, "requests_finished_total", labels='finish_reason="length"') == 5
    assert _value(c, "requests_succeeded_total") == 5 and _value(c, "requests_failed_total") == 0
    # 169 gaps = 174 tokens - 5 first tokens
    assert h.filter(pl.col("metric") == "inter_token_latency_seconds")["count"].unique().to_list() == [169.0]
    assert set(b.serving_replica["deployment"]) == {"meta/llama-3.1-8b-instruct"}


def test_triton_counters_are_counters_in_seconds_and_energy_in_joules(serving):
    b = _read(serving, TRITON, "triton")
    c, g = b.serving_counter, b.serving_gauge
    assert b.serving_bucket is None  # Triton's *_duration_us are counters; its summaries are not read
    dn = c.filter(pl.col("deployment") == "densenet_onnx")
    assert _value(dn, "requests_succeeded_total") == 3
    assert _value(dn, "request_duration_seconds_total") == pytest.approx(1.327965)
    assert _value(dn, "request_duration_seconds_total") / 3 == pytest.approx(0.442655)
    assert _value(dn, "queue_duration_seconds_total") == pytest.approx(145e-6)
    assert _value(dn, "compute_infer_duration_seconds_total") == pytest.approx(1.326831)
    assert set(dn["version"]) == {"1"}
    assert _value(c, "gpu_energy_joules_total") == pytest.approx(4_879_631.328, abs=1e-3)
    assert _value(g, "gpu_power_watts") == 32.09 and _value(g, "gpu_power_limit_watts") == 70
    assert _value(g, "gpu_power_watts") / _value(g, "gpu_power_limit_watts") == pytest.approx(0.458, abs=1e-3)
    assert _value(g, "gpu_memory_used_bytes") == 266_338_304
    assert set(g.filter(pl.col("metric") == "gpu_power_watts")["labels"]) == {'gpu_uuid="GPU-951eeeeb-d284-d263-688e-d98a5306389b"'}


def test_tensorrt_llm_backend_gauges_by_label(serving):
    g = _read(serving, TRTLLM, "triton").serving_gauge
    assert _value(g, "kv_cache_used_blocks") == 1 and _value(g, "kv_cache_max_blocks") == 6239
    assert _value(g, "requests_max") == 512 and _value(g, "requests_waiting") == 1
    # the documentation's fraction (0.4875) contradicts used/max; it is stored as written, not derived
    assert _value(g, "kv_cache_usage_ratio") == 0.4875


def test_caller_names_deployment_and_replica_and_place_labels_go_to_the_replica():
    body = (b'vllm:num_requests_waiting{model_name="m",namespace="serve",pod="m-7f9",node="gpu-1",job="vllm"} 4\n'
            b'vllm:num_requests_running{model_name="m",namespace="serve",pod="m-7f9",node="gpu-1"} 8\n')
    b = sm.parse(body, server="vllm", source="s", ts=T0)
    assert set(b.serving_gauge["replica"]) == {"m-7f9"} and set(b.serving_gauge["labels"]) == {""}
    r = b.serving_replica.row(0, named=True)
    assert (r["deployment"], r["pod"], r["namespace"], r["host"], r["last_seen"]) == ("m", "m-7f9", "serve", "gpu-1", T0)
    b2 = sm.parse(body, server="vllm", source="s", ts=T0, deployment="chat", replica="r0")
    assert set(b2.serving_gauge["deployment"]) == {"chat"} and set(b2.serving_gauge["replica"]) == {"r0"}


def test_histogram_without_inf_bucket_gets_one_from_count_and_body_timestamps_win():
    body = (b'vllm:time_to_first_token_seconds_bucket{model_name="m",le="0.1"} 2 1767268800000\n'
            b'vllm:time_to_first_token_seconds_sum{model_name="m"} 0.3 1767268800000\n'
            b'vllm:time_to_first_token_seconds_count{model_name="m"} 5 1767268800000\n')
    h = sm.parse(body, server="vllm", source="s").serving_bucket
    assert h["le"].to_list() == ["0.1", "+Inf"] and h["cumulative_count"].to_list() == [2.0, 5.0]
    assert h["ts"].unique().to_list() == [dt.datetime(2026, 1, 1, 12, 0, tzinfo=dt.UTC)]


def test_nan_gauge_is_skipped_and_counted():
    b = sm.parse(b'vllm:spec_decode_efficiency{model_name="m"} NaN\nvllm:num_requests_running{model_name="m"} NaN\n'
                 b'vllm:num_requests_waiting{model_name="m"} 1\n', server="vllm", source="s", ts=T0)
    assert b.meta["nonfinite_gauges"] == 1 and b.serving_gauge.height == 1


@pytest.mark.parametrize(("body", "words"), [
    (b'vllm:num_requests_running{model_name="m"', "line 1"),  # cut mid-labels
    (b'vllm:num_requests_running{model_name="m} 3\n', "unterminated"),
    (b'vllm:prompt_tokens_total{model_name="m"} -1\n', "not negative"),
    (b'vllm:prompt_tokens_total{model_name="m"} +Inf\n', "finite"),
    (b'vllm:time_to_first_token_seconds_bucket{model_name="m",le="fast"} 1\n', "le"),
    (b'vllm:time_to_first_token_seconds_bucket{model_name="m"} 1\n', "no le"),
    (b'vllm:time_to_first_token_seconds_bucket{model_name="m",le="NaN"} 1\n', "NaN"),
    (b'vllm:prompt_tokens_total{model_name="m",model_name="n"} 1\n', "repeated"),
    (b'vllm:prompt_tokens_total{model_name="m"} 1\nvllm:prompt_tokens_total{model_name="m"} 2\n', "twice"),
    (b'vllm:prompt_tokens_total{model_name="m"} 0x10\n', "not a number"),
    (b"vllm:prompt_tokens_total 1\x00\n", "NUL"),
    (b"vllm:prompt_tokens_total \xff\n", "UTF-8"),
    (b"\n\n", "empty"),
])
def test_malformed_bodies_are_refused_naming_the_line(body, words):
    with pytest.raises(ParseError, match=words):
        sm.parse(body, server="vllm", source="bad.prom", ts=T0)


def test_no_timestamp_and_none_given_is_refused():
    with pytest.raises(ParseError, match="pass ts"):
        sm.parse(b'vllm:num_requests_running{model_name="m"} 1\n', server="vllm", source="s")
    with pytest.raises(ParseError, match="timezone"):
        sm.parse(b"x 1\n", server="vllm", source="s", ts=dt.datetime(2026, 1, 1))
    with pytest.raises(ParseError, match="unknown server"):
        sm.parse(b"x 1\n", server="ollama", source="s", ts=T0)


def test_truncated_real_body_fails_at_the_cut_or_keeps_whole_lines(serving):
    data = (serving / VLLM_V0).read_bytes()
    cut = data[: data.index(b'vllm:num_requests_waiting{model_name="neuralmagic') + 30]
    with pytest.raises(ParseError) as e:
        sm.parse(cut, server="vllm", source="cut", ts=T0)
    assert e.value.line == cut.count(b"\n") + 1


def test_oversized_and_hostile_bodies():
    with pytest.raises(ParseError, match="exceeds"):
        sm.parse(b"#" * (sm.MAX_INPUT_BYTES + 1), server="vllm", source="s", ts=T0)
    with pytest.raises(ParseError, match="longer than"):
        sm.parse(b'vllm:num_requests_running{model_name="' + b"a" * (sm.MAX_LINE_BYTES + 1) + b'"} 1\n', server="vllm", source="s", ts=T0)
    long_value = b'vllm:num_requests_running{model_name="' + b"a" * (sm.MAX_LABEL_VALUE + 1) + b'"} 1\n'
    with pytest.raises(ParseError, match="longer than 4096"):
        sm.parse(long_value, server="vllm", source="s", ts=T0)
    many = b"vllm:num_requests_running{" + b",".join(b'l%d="v"' % i for i in range(sm.MAX_LABELS + 1)) + b"} 1\n"
    with pytest.raises(ParseError, match="labels"):
        sm.parse(many, server="vllm", source="s", ts=T0)
    # label values with escapes, quotes and newlines survive into the labels text escaped as Prometheus has it
    odd = b'vllm:request_success_total{model_name="m",finished_reason="a\\"b\\\\c\\nd"} 1\n'
    c = sm.parse(odd, server="vllm", source="s", ts=T0).serving_counter
    assert c["labels"].to_list() == ['finish_reason="a\\"b\\\\c\\nd"']
    # a body of another server's names yields nothing, not a guess
    b = sm.parse(b'sglang:num_queue_reqs{model_name="m"} 3\n', server="vllm", source="s", ts=T0)
    assert b.serving_gauge is None and b.meta["skipped_series"] == 1
    assert math.isinf(float("+Inf"))

"""Serving analyses: Prometheus' histogram_quantile on the real bodies (the figures of
../shared/realdata/serving/SOURCES.md) and on its edge cases, counter resets, SLO burn-rate alerts in a
simulated incident, DistServe goodput exact and bounded, saturation and a slow replica."""

from __future__ import annotations

import datetime as dt
import math

import polars as pl
import pytest

from analyzers import serving_goodput as sg
from analyzers import serving_latency as sl
from analyzers import serving_replicas as sr
from analyzers import serving_saturation as ss
from analyzers import slo as S
from fleetscope.core import frames as F
from fleetscope.core import serving_frames as SF
from ingest import serving_metrics as sm

from tests.ingest.conftest import REALDATA

T0 = dt.datetime(2026, 3, 1, 0, 0, tzinfo=dt.UTC)
BOUNDS = (0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


@pytest.fixture(scope="module")
def serving():
    d = REALDATA / "serving"
    if not d.is_dir():
        pytest.skip(f"real data folder {d} is absent")
    return d


def _q(serving, name, server, metric, labels=""):  # type: ignore[no-untyped-def]
    b = sm.parse((serving / name).read_bytes(), server=server, source=name, ts=T0).serving_bucket
    out = sl.quantiles(b.filter((pl.col("metric") == metric) & (pl.col("labels") == labels)), (0.5, 0.9, 0.99))
    return out["value"].to_list(), out["capped"].to_list(), out["observations"][0]


# --- histogram_quantile on the real bodies ----------------------------------------------------------------

def test_quantiles_of_the_real_bodies_equal_the_published_figures(serving):
    v, capped, n = _q(serving, "sglang_metrics_Llama-3.1-8B_overload_docs-example.prom", "sglang", "inter_token_latency_seconds")
    assert n == 7_400_757 and [round(x * 1e3, 1) for x in v] == [93.1, 140.9, 632.3] and not any(capped)
    v, capped, n = _q(serving, "nvidia-nim_llama-3.1-8b-instruct_metrics_datadog-fixture.prom", "nim", "ttft_seconds")
    assert v == pytest.approx([0.025, 0.625, 0.7375])
    v, _, _ = _q(serving, "nvidia-nim_llama-3.1-8b-instruct_metrics_datadog-fixture.prom", "nim", "inter_token_latency_seconds")
    assert [round(x * 1e3, 2) for x in v] == [17.54, 23.58, 24.94]  # p50 17.5 ms while the mean is 11.0 ms: interpolation
    v, _, _ = _q(serving, "vllm-v0_metrics_Llama-3.1-8B-FP8_kubeai-mock.prom", "vllm", "ttft_seconds")
    assert v == pytest.approx([0.054, 0.074, 0.0794])
    v, _, _ = _q(serving, "vllm-v0_metrics_Llama-3.1-8B-FP8_kubeai-mock.prom", "vllm", "e2e_latency_seconds")
    assert v == pytest.approx([17.5, 19.5, 19.95])
    v, _, _ = _q(serving, "huggingface-tgi_metrics_datadog-fixture.prom", "tgi", "e2e_latency_seconds")
    assert v == pytest.approx([4.043, 7.902, 19.03], rel=1e-3)
    v, _, _ = _q(serving, "huggingface-tgi_metrics_datadog-fixture.prom", "tgi", "request_tpot_seconds")
    assert [round(x * 1e3, 2) for x in v] == [80.63, 94.95, 98.17]
    v, _, _ = _q(serving, "huggingface-tgi_metrics_datadog-fixture.prom", "tgi", "batch_forward_seconds", 'method="decode"')
    assert [round(x * 1e3, 2) for x in v] == [55.31, 64.53, 91.92]


def test_ttft_past_the_last_bucket_is_capped_at_its_bound(serving):
    v, capped, n = _q(serving, "sglang_metrics_Llama-3.1-8B_overload_docs-example.prom", "sglang", "ttft_seconds")
    assert v == [30.0, 30.0, 30.0] and all(capped) and n == 11008  # 8495 of 11008 took longer than 30 s


def test_an_idle_server_has_no_quantile_not_zero(serving):
    v, capped, n = _q(serving, "vllm-v1_metrics_Qwen2.5-0.5B_idle_full_cncf-kops.prom", "vllm", "ttft_seconds", 'engine="0"')
    assert n == 0 and all(math.isnan(x) for x in v) and not any(capped)


# --- histogram_quantile's semantics ---------------------------------------------------------------------

INF = math.inf


@pytest.mark.parametrize(("q", "buckets", "want"), [
    (0.5, [(1, 2), (2, 4), (INF, 4)], 1.0),  # rank 2 at the top of the first bucket
    (0.25, [(1, 2), (2, 4), (INF, 4)], 0.5),  # lowest bucket starts at 0
    (0.75, [(1, 2), (2, 4), (INF, 4)], 1.5),  # linear inside (1, 2]
    (0.99, [(1, 2), (2, 4), (INF, 10)], 2.0),  # in +Inf: the highest finite bound
    (0.5, [(-1, 2), (0, 2), (INF, 4)], -1.0),  # lowest bound not positive: returned as is
    (-0.1, [(1, 2), (INF, 4)], -INF),
    (1.1, [(1, 2), (INF, 4)], INF),
    (1.0, [(1, 4), (2, 4), (INF, 4)], 1.0),
    (0.5, [(INF, 4), (2, 3), (1, 1)], 1.5),  # order of the buckets does not matter
    (0.5, [(1, 1), (1, 1), (2, 4), (INF, 4)], 1.0),  # one bound written twice is coalesced
    (0.8, [(1, 3), (2, 2), (3, 4), (INF, 4)], pytest.approx(2.2)),  # non-monotonic: 2 raised to 3 (else 2.6)
])
def test_histogram_quantile_semantics(q, buckets, want):
    assert sl.histogram_quantile(q, buckets) == want


@pytest.mark.parametrize("buckets", [[(1, 2), (2, 4)], [(INF, 4)], [(1, 0), (INF, 0)], []])
def test_histogram_quantile_nan_cases(buckets):
    assert math.isnan(sl.histogram_quantile(0.5, buckets))


def test_nan_q_is_nan():
    assert math.isnan(sl.histogram_quantile(math.nan, [(1, 2), (INF, 4)]))


# --- counters and windows -------------------------------------------------------------------------------

def test_counter_increase_over_a_restart():
    assert sl.counter_increase([10, 20, 5, 8]) == 10 + 5 + 3
    assert sl.counter_increase([7]) == 0 and sl.counter_increase([]) == 0


def _counter_rows(metric: str, values: list[float], step_s: float = 60, replica: str = "r0", dep: str = "chat", labels: str = ""):
    return [{"ts": T0 + dt.timedelta(seconds=i * step_s), "deployment": dep, "replica": replica, "metric": metric, "labels": labels,
             "value": float(v)} for i, v in enumerate(values)]


def test_token_rate_over_a_window_with_a_restart():
    c = F.conform(SF.SERVING_COUNTER, pl.DataFrame(_counter_rows("generation_tokens_total", [0, 600, 1200, 300, 900])
                                                   + _counter_rows("generation_tokens_total", [0, 60, 120, 180, 240], replica="r1")))
    r = sl.rates(c, start=T0, end=T0 + dt.timedelta(minutes=4), by=("deployment", "metric"))
    assert r["increase"].item() == 600 + 600 + 300 + 600 + 240
    assert r["per_s"].item() == pytest.approx(2100 / 240 + 240 / 240)


def _hist_rows(metric: str, per_scrape: list[list[float]], *, replica: str = "r0", dep: str = "chat", step_s: float = 60,
               bounds: tuple[float, ...] = BOUNDS, start: dt.datetime = T0) -> list[dict]:
    """Cumulative bucket rows of scrapes every ``step_s``; ``per_scrape[i]`` are the observations made
    between scrape i-1 and scrape i."""
    rows: list[dict] = []
    les = (*bounds, INF)
    cum = dict.fromkeys(les, 0.0)
    total = n = 0.0
    for i, obs in enumerate(per_scrape):
        for x in obs:
            for le in les:
                cum[le] += x <= le
        total += sum(obs)
        n += len(obs)
        ts = start + dt.timedelta(seconds=i * step_s)
        for le in les:
            rows.append({"ts": ts, "deployment": dep, "replica": replica, "metric": metric, "le": "+Inf" if le == INF else repr(float(le)),
                         "cumulative_count": cum[le], "sum": total, "count": n})
    return rows


def _buckets(rows: list[dict]) -> pl.DataFrame:
    return F.conform(SF.SERVING_BUCKET, pl.DataFrame(rows))


def test_windowed_quantile_reads_the_increase_not_the_history():
    b = _buckets(_hist_rows("ttft_seconds", [[2.0] * 100, [0.04] * 10, [0.04] * 10]))
    whole = sl.quantiles(b, (0.5,))["value"].item()
    recent = sl.quantiles(b, (0.5,), start=T0 + dt.timedelta(seconds=60), end=T0 + dt.timedelta(seconds=120))["value"].item()
    assert whole == pytest.approx(1.0 + 1.5 * (60 - 20) / 100)  # since start: rank 60 of 120, in (1, 2.5]
    assert recent == pytest.approx(0.025 + 0.025 * 0.5)  # the last minute's ten, all in (0.025, 0.05]
    series = sl.quantiles_over_time(b, 0.5, window_s=60, step_s=60, start=T0 + dt.timedelta(seconds=60), end=T0 + dt.timedelta(seconds=120))
    assert series["value"].to_list() == pytest.approx([0.0375, 0.0375])


# --- SLOs and burn rates --------------------------------------------------------------------------------

def test_slo_objects_refuse_what_cannot_be_measured():
    with pytest.raises(ValueError, match="objective"):
        S.SLO("a", "chat", "availability", 1.0)
    with pytest.raises(ValueError, match="kind"):
        S.SLO("a", "chat", "throughput", 0.99)
    with pytest.raises(ValueError, match="threshold"):
        S.SLO("a", "chat", "latency", 0.99, metric="ttft_seconds")
    b = _buckets(_hist_rows("ttft_seconds", [[0.1], [0.1]]))
    with pytest.raises(ValueError, match="not a bucket bound.*between 0.25 and 0.5"):
        S.status(S.SLO("ttft", "chat", "latency", 0.99, "ttft_seconds", 0.3), now=T0 + dt.timedelta(minutes=1), buckets=b)


def test_burn_rate_alert_fires_within_one_evaluation_of_the_budget_crossing():
    """Simulated incident: 1000 requests a minute at TTFT 0.1 s; from 6 h on, 20 % take 1 s. With a 99 %
    objective the burn rate is 0.2 / 0.01 = 20x: the 5 m window crosses 14.4x within 5 minutes, the 1 h
    window when 20 · m / 60 > 14.4, i.e. after 43.2 minutes, so the fast page fires at minute 44 of the
    incident, evaluated every minute."""
    minutes = 6 * 60 + 60
    onset = 6 * 60
    per = [[0.1] * 1000 if i <= onset else [0.1] * 800 + [1.0] * 200 for i in range(minutes + 1)]
    b = _buckets(_hist_rows("ttft_seconds", per))
    slo = S.SLO("ttft-p99", "chat", "latency", 0.99, "ttft_seconds", 0.5)
    first = None
    for m in range(onset + 40, minutes + 1):
        st = S.status(slo, now=T0 + dt.timedelta(minutes=m), buckets=b)
        if "page_fast" in st.alerts:
            first = m - onset
            break
    assert first == math.ceil(14.4 * 60 / 20 + 1e-9) == 44
    assert st.burn_rates["5m"] == pytest.approx(20.0) and st.burn_rates["1h"] == pytest.approx(20 * 44 / 60)
    # 8,800 bad of 404,000 since the series began: over twice the 28-day budget such a short history allows
    assert (st.valid, st.valid - st.good) == (404_000, 8_800) and st.budget_left == pytest.approx(1 - 8800 / 4040)
    assert st.alerts == ("page_fast", "ticket")
    f = S.burn_findings([st], now=T0 + dt.timedelta(minutes=onset + first))
    assert f["kind"].to_list() == ["slo_burn", "slo_burn"] and f["severity"].to_list() == ["critical", "warning"]
    assert f["subject"].to_list() == ["deployment:chat/slo:ttft-p99/page_fast", "deployment:chat/slo:ttft-p99/ticket"]
    quiet = S.status(slo, now=T0 + dt.timedelta(minutes=onset), buckets=b)
    assert quiet.alerts == () and quiet.burn_rates["1h"] == 0 and quiet.sli == 1.0


def test_availability_from_finish_reasons_and_from_success_counters():
    vllm = (_counter_rows("requests_finished_total", [0, 990], labels='finish_reason="stop"')
            + _counter_rows("requests_finished_total", [0, 10], labels='finish_reason="abort"'))
    slo = S.SLO("avail", "chat", "availability", 0.999)
    st = S.status(slo, now=T0 + dt.timedelta(minutes=1), counters=F.conform(SF.SERVING_COUNTER, pl.DataFrame(vllm)))
    assert (st.good, st.valid, st.sli) == (990.0, 1000.0, 0.99)
    assert st.burn_rates["5m"] == pytest.approx(10.0) and st.budget_left == pytest.approx(-9.0)
    tgi = _counter_rows("requests_succeeded_total", [0, 109]) + _counter_rows("requests_failed_total", [0, 2], labels='reason="validation"')
    st = S.status(slo, now=T0 + dt.timedelta(minutes=1), counters=F.conform(SF.SERVING_COUNTER, pl.DataFrame(tgi)))
    assert (st.good, st.valid) == (109.0, 111.0)


# --- goodput --------------------------------------------------------------------------------------------

def _requests(specs: list[tuple[float, float, float, int, str]]) -> pl.DataFrame:
    rows = [{"deployment": "chat", "request_id": str(i), "arrival": T0 + dt.timedelta(seconds=a),
             "first_token": None if t is None else T0 + dt.timedelta(seconds=a + t),
             "finish": T0 + dt.timedelta(seconds=a + (t or 0) + d), "output_tokens": n, "status": st}
            for i, (a, t, d, n, st) in enumerate(specs)]
    return F.conform(SF.SERVING_REQUEST, pl.DataFrame(rows))


def test_exact_goodput_distserve_figure_1():
    """DistServe's Figure 1: throughput 10 requests/s, of which 3 meet both SLOs, so goodput is 3 requests/s."""
    ok = [(0.01 * i, 0.1, 0.6, 21, "ok") for i in range(3)]  # TTFT 100 ms, TPOT 30 ms
    slow_ttft = [(0.01 * i, 0.5, 0.2, 21, "ok") for i in range(4)]  # TTFT 500 ms
    slow_tpot = [(0.01 * i, 0.1, 0.8, 9, "ok") for i in range(3)]  # TPOT 100 ms
    r = _requests(ok + slow_ttft + slow_tpot + [(0.1, None, 0.0, 0, "error")])
    g = sg.exact(r, deployment="chat", ttft_slo_s=0.2, tpot_slo_s=0.05, start=T0, end=T0 + dt.timedelta(seconds=1))
    assert g.method == "exact" and g.completed == 10 and g.attainment == 0.3
    assert g.throughput_rps == 10 and g.goodput_rps == 3 == g.goodput_low_rps == g.goodput_high_rps


def test_one_token_request_is_judged_on_ttft():
    g = sg.exact(_requests([(0, 0.1, 0.0, 1, "ok")]), deployment="chat", ttft_slo_s=0.2, tpot_slo_s=0.01, start=T0, end=T0 + dt.timedelta(seconds=1))
    assert g.goodput_rps == 1


def test_bounded_goodput_from_histograms_brackets_the_exact_one():
    # 100 completed requests in a minute: 80 with TTFT <= 0.25 s, 70 with TPOT <= 0.05 s
    ttft = [0.1] * 80 + [1.0] * 20
    tpot = [0.04] * 70 + [0.2] * 30
    rows = (_hist_rows("ttft_seconds", [[], ttft]) + _hist_rows("request_tpot_seconds", [[], tpot])
            + _hist_rows("e2e_latency_seconds", [[], [2.0] * 100]))
    g = sg.bounded(_buckets(rows), deployment="chat", ttft_slo_s=0.25, tpot_slo_s=0.05, start=T0, end=T0 + dt.timedelta(seconds=60))
    assert g.method == "bounded" and g.completed == 100 and math.isnan(g.goodput_rps)
    assert g.goodput_low_rps == pytest.approx(50 / 60) and g.goodput_high_rps == pytest.approx(70 / 60) and g.note == ""
    inside = sg.bounded(_buckets(rows), deployment="chat", ttft_slo_s=0.3, tpot_slo_s=0.05, start=T0, end=T0 + dt.timedelta(seconds=60))
    assert "inside a bucket" in inside.note
    no_tpot = sg.bounded(_buckets([r for r in rows if r["metric"] != "request_tpot_seconds"]), deployment="chat",
                         ttft_slo_s=0.25, tpot_slo_s=0.05, start=T0, end=T0 + dt.timedelta(seconds=60))
    assert no_tpot.goodput_low_rps == 0 and no_tpot.goodput_high_rps == pytest.approx(80 / 60) and "TPOT unbounded" in no_tpot.note


# --- saturation and slow replicas -----------------------------------------------------------------------

def _gauges(replica: str, kv: float, waiting: float, n: int = 5) -> list[dict]:
    return [r for i in range(n) for r in (
        {"ts": T0 + dt.timedelta(seconds=10 * i), "deployment": "chat", "replica": replica, "metric": "kv_cache_usage_ratio", "value": kv},
        {"ts": T0 + dt.timedelta(seconds=10 * i), "deployment": "chat", "replica": replica, "metric": "requests_waiting", "value": waiting})]


def test_kv_cache_saturation_needs_a_full_cache_and_a_queue(serving):
    g = F.conform(SF.SERVING_GAUGE, pl.DataFrame(_gauges("r0", 0.97, 12) + _gauges("r1", 0.97, 0) + _gauges("r2", 0.3, 400)))
    f = ss.saturation_findings(g, None, start=T0, end=T0 + dt.timedelta(minutes=1))
    assert f["subject"].to_list() == ["deployment:chat/replica:r0"] and f["kind"].to_list() == ["kv_cache_saturated"]
    # the overloaded SGLang server queues 2826 requests with its KV pool 28 % used: a queue, not a full cache
    sgl = sm.parse((serving / "sglang_metrics_Llama-3.1-8B_overload_docs-example.prom").read_bytes(), server="sglang", source="s", ts=T0)
    assert ss.saturation_findings(sgl.serving_gauge, sgl.serving_counter, start=T0, end=T0).height == 0


def test_preemptions_climbing():
    c = F.conform(SF.SERVING_COUNTER, pl.DataFrame(_counter_rows("preemptions_total", [0, 0, 0, 1, 5, 20, 60], step_s=60)))
    f = ss.saturation_findings(F.conform(SF.SERVING_GAUGE, pl.DataFrame(_gauges("r0", 0.5, 0))), c,
                               start=T0 + dt.timedelta(minutes=3), end=T0 + dt.timedelta(minutes=6))
    assert f["kind"].to_list() == ["preemptions_climbing"] and f["score"].item() == pytest.approx(59 / 3)
    calm = ss.saturation_findings(F.conform(SF.SERVING_GAUGE, pl.DataFrame(_gauges("r0", 0.5, 0))), c,
                                  start=T0, end=T0 + dt.timedelta(minutes=3))
    assert calm.height == 0


def test_a_throttled_replica_stands_out_from_its_peers():
    rows = []
    for rep, tpot in (("r0", 0.03), ("r1", 0.032), ("r2", 0.031), ("r3", 0.08)):
        rows += _hist_rows("request_tpot_seconds", [[], [tpot] * 50], replica=rep, bounds=(0.01, 0.02, 0.04, 0.06, 0.1))
    f = sr.slow_replica_findings(_buckets(rows), start=T0, end=T0 + dt.timedelta(minutes=1))
    assert f["subject"].to_list() == ["deployment:chat/replica:r3"] and f["score"].item() > 1.5
    two = [r for r in rows if r["replica"] in ("r0", "r3")]
    assert sr.slow_replica_findings(_buckets(two), start=T0, end=T0 + dt.timedelta(minutes=1)).height == 0  # too few peers


# --- energy per token -----------------------------------------------------------------------------------

def test_energy_per_token_mlperf_h100_upper_bound():
    """MLPerf Inference v4.1 Llama-2-70B Server, 8x H100-SXM: 21,605.79 tokens/s; at the 700 W TDP (the
    figure SOURCES.md derives) 8 * 700 / 21,605.79 = 0.2592 J a token, 0.072 kWh per million."""
    from analyzers import serving_energy as se

    minute = T0
    held = pl.DataFrame({"minute": [minute] * 8, "gpu_uuid": [f"GPU-{i}" for i in range(8)]}).with_columns(pl.col("minute").cast(pl.Datetime("us", "UTC")))
    energy = held.with_columns(pl.lit(700.0 * 60).alias("energy_j"))
    e = se.energy_per_token("llama2-70b", output_tokens=21_605.79 * 60, gpu_minutes=energy, held=held, pue=1.2)
    assert e.basis == "gpu_energy_minute" and e.gpus == 8
    assert e.j_per_token == pytest.approx(0.2592, abs=1e-4) and e.gpu_kwh_per_million_tokens == pytest.approx(0.072, abs=1e-3)
    assert e.facility_kwh_per_million_tokens == pytest.approx(0.072 * 1.2, abs=1e-3)
    fallback = se.energy_per_token("triton", output_tokens=1000, server_energy_j=4_879_631.328)
    assert fallback.basis == "server_energy_counter" and fallback.j_per_token == pytest.approx(4879.631328)
    none = se.energy_per_token("x", output_tokens=0)
    assert none.basis == "none" and math.isnan(none.j_per_token)


def test_held_minutes_by_pod_attribution():
    from analyzers import serving_energy as se

    wl = pl.DataFrame({"ts": [T0, T0 + dt.timedelta(seconds=30), T0 + dt.timedelta(seconds=70), T0],
                       "gpu_uuid": ["g0", "g0", "g0", "g9"], "namespace": ["serve", "serve", "serve", "other"],
                       "pod": ["llama-0", "llama-0", "llama-0", "llama-0"]}).with_columns(pl.col("ts").cast(pl.Datetime("us", "UTC")))
    held = se.held_minutes(wl, pl.DataFrame({"namespace": ["serve"], "pod": ["llama-0"]}))
    assert held["gpu_uuid"].to_list() == ["g0", "g0"] and held["minute"].to_list() == [T0, T0 + dt.timedelta(minutes=1)]


def test_cost_per_token_prices_each_gpu_minute_by_model_and_refuses_mixed_currencies():
    from analyzers import serving_energy as se

    utc = pl.Datetime("us", "UTC")
    held = pl.DataFrame({"minute": [T0 + dt.timedelta(minutes=m) for m in range(60)] * 2,
                         "gpu_uuid": ["h100"] * 60 + ["b200"] * 60}).with_columns(pl.col("minute").cast(utc))
    prices = pl.DataFrame({"site_id": ["dc1", "dc1", "dc1"], "gpu_model": ["", "NVIDIA B200", ""],
                           "valid_from": [T0 - dt.timedelta(days=1), T0 - dt.timedelta(days=1), T0 + dt.timedelta(minutes=30)],
                           "currency": ["EUR"] * 3, "gpu_hour_price": [2.0, 6.0, 3.0], "energy_price_per_kwh": [0.2, None, 0.3]}
                          ).with_columns(pl.col("valid_from").cast(utc))
    c = se.cost_per_token("chat", held=held, gpu_models={"h100": "NVIDIA H100", "b200": "NVIDIA B200"}, site_id="dc1", prices=prices,
                          energy_kwh=10.0, output_tokens=1e6)
    # H100 at the site's any-GPU price, 2 then 3 EUR from minute 30; B200 at its own 6 EUR; energy at the newest tariff
    assert c.gpu_hours == 2 and c.gpu_cost == pytest.approx(0.5 * 2 + 0.5 * 3 + 6.0) and c.energy_cost == pytest.approx(3.0)
    assert c.cost_per_million_tokens == pytest.approx(11.5) and c.currency == "EUR" and c.unpriced_gpu_hours == 0
    other = se.cost_per_token("chat", held=held, gpu_models={}, site_id="dc2", prices=prices, energy_kwh=10.0, output_tokens=1e6)
    assert other.unpriced_gpu_hours == 2 and math.isnan(other.cost_per_million_tokens) and "no energy tariff" in other.note
    mixed = prices.with_columns(pl.when(pl.col("gpu_model") == "NVIDIA B200").then(pl.lit("USD")).otherwise(pl.col("currency")).alias("currency"))
    with pytest.raises(ValueError, match="several currencies"):
        se.cost_per_token("chat", held=held, gpu_models={"b200": "NVIDIA B200"}, site_id="dc1", prices=mixed, energy_kwh=0, output_tokens=1)

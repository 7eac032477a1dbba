"""Serving frames through the store: natural keys make a re-sent scrape one copy, the inventory row updates,
and a bucket keeps its '+Inf' bound and the histogram's sum and count."""

import datetime as dt

import polars as pl
import pytest

from fleetscope.core import frames as F
from fleetscope.core import serving_frames as SF
from fleetscope.core.errors import ValidationError

T0 = dt.datetime(2026, 3, 1, 12, 0, tzinfo=dt.UTC)


def _batch(ts: dt.datetime, count: float, host: str = "gpu-node-1") -> F.Batch:
    ident = {"ts": ts, "deployment": "llama", "replica": "llama-0", "model": "meta/llama", "metric": "ttft_seconds"}
    buckets = pl.DataFrame([{**ident, "le": le, "cumulative_count": c, "sum": 0.6, "count": count}
                            for le, c in (("0.1", 2.0), ("1.0", count), ("+Inf", count))])
    return F.Batch(
        source="test",
        serving_replica=F.conform(SF.SERVING_REPLICA, pl.DataFrame([{"deployment": "llama", "replica": "llama-0", "server": "vllm",
                                                                      "pod": "llama-0", "namespace": "serve", "host": host, "last_seen": ts}])),
        serving_bucket=F.conform(SF.SERVING_BUCKET, buckets),
        serving_counter=F.conform(SF.SERVING_COUNTER, pl.DataFrame([{**ident, "metric": "generation_tokens_total", "value": 174.0}])),
        serving_gauge=F.conform(SF.SERVING_GAUGE, pl.DataFrame([{**ident, "metric": "kv_cache_usage_ratio", "value": 0.5}])),
    )


def test_serving_frames_round_trip_once_and_inventory_updates(store):
    assert set(b.name for b in SF.SERVING_FRAMES) <= set(F.FRAMES)
    b = _batch(T0, 5.0)
    assert b.values() == 5
    store.write(b)
    store.write(b)
    store.write(_batch(T0, 5.0, host="gpu-node-2"))
    got = store.read("serving_bucket").sort("le")
    assert got.height == 3
    assert got["le"].to_list() == ["+Inf", "0.1", "1.0"]
    assert got.filter(pl.col("le") == "+Inf")["cumulative_count"].item() == 5.0
    assert got["version"].to_list() == ["", "", ""] and got["labels"].to_list() == ["", "", ""]
    assert store.read("serving_counter")["value"].to_list() == [174.0]
    assert store.read("serving_replica")["host"].to_list() == ["gpu-node-2"]


def test_a_bucket_without_its_bound_or_count_is_refused():
    with pytest.raises(ValidationError, match="le|cumulative_count"):
        F.conform(SF.SERVING_BUCKET, pl.DataFrame([{"ts": T0, "deployment": "d", "replica": "r", "metric": "ttft_seconds", "cumulative_count": 1.0}]))
    with pytest.raises(ValidationError, match="finite"):
        F.conform(SF.SERVING_GAUGE, pl.DataFrame([{"ts": T0, "deployment": "d", "replica": "r", "metric": "m", "value": float("nan")}]))


def test_api_ingests_real_serving_bodies_detected_and_idempotent(api, realdata):
    import httpx

    from fleetscope.services import auth

    h = {"Authorization": "Bearer " + auth.create_token(api.app.state.store.engine, "t", ["ingest"]), "Content-Type": "text/plain"}
    data = (realdata / "serving/sglang_metrics_Llama-3.1-8B_overload_docs-example.prom").read_bytes()
    r = httpx.post(api.url + "/api/v1/ingest/auto", params={"source": "sglang-0", "ts": "2026-03-01T12:00:00Z"}, content=data, headers=h, timeout=60)
    assert r.status_code == 200, r.text
    assert r.json()["formats"] == ["sglang"] and r.json()["written"]["serving_bucket"] == 56
    r2 = httpx.post(api.url + "/api/v1/ingest/sglang", params={"source": "sglang-0", "ts": "2026-03-01T12:00:00Z"}, content=data, headers=h, timeout=60)
    assert r2.status_code == 200 and not r2.json()["written"].get("serving_bucket")
    store = api.app.state.store
    g = store.read("serving_gauge")
    assert g.filter(pl.col("metric") == "requests_waiting")["value"].to_list() == [2826.0]
    nim = (realdata / "serving/nvidia-nim_llama-3.1-8b-instruct_metrics_datadog-fixture.prom").read_bytes()
    r3 = httpx.post(api.url + "/api/v1/ingest/auto", params={"source": "nim-0", "ts": "2026-03-01T12:00:10Z"}, content=nim, headers=h, timeout=60)
    assert r3.status_code == 200 and r3.json()["formats"] == ["nim"], r3.text
    bad = httpx.post(api.url + "/api/v1/ingest/vllm", params={"ts": "2026-03-01T12:00:00Z"},
                     content=b'vllm:prompt_tokens_total{model_name="m"} -3\n', headers=h, timeout=60)
    assert bad.status_code == 400 and "line 1" in bad.json()["detail"]

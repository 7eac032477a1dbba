"""The simulated serving deployment: its vLLM bodies ingest as real ones do, and each injected fault is
found where and when it was injected — KV-cache saturation (with preemptions climbing) on one replica, a
throttled replica against its peers, and an SLO burning its budget fast enough to page — and nothing before."""

from __future__ import annotations

import datetime as dt
from itertools import groupby

import polars as pl

from analyzers.slo import SLO
from fleetscope.core import frames as F
from fleetscope.door import ingestion
from fleetscope.services import serving as serving_service
from fleetscope.sim import serving as sim
from ingest import serving_metrics

SPEC = sim.ServingSpec()
MIN = dt.timedelta(minutes=1)


def _load(store) -> None:  # type: ignore[no-untyped-def]
    first = True
    for ts, group in groupby(sim.bodies(SPEC), key=lambda x: x[0]):
        batch = F.Batch(source="sim")
        for _, pod, body in group:
            if first:
                assert ingestion.detect(body) == ["vllm"]
                first = False
            batch = batch.merge(serving_metrics.parse(body, server="vllm", source=f"sim:{pod}", ts=ts))
        store.write(batch)


def test_each_injected_serving_fault_is_found_where_it_was_injected(store):
    _load(store)
    serving_service.put_slo(store, SLO("ttft", "meta-llama/Llama-3.1-8B-Instruct", "latency", 0.99, "ttft_seconds", 0.5),
                            actor="test", now=SPEC.start)
    dep = "meta-llama/Llama-3.1-8B-Instruct"
    faults = {f["fault"]: f for f in sim.injected(SPEC)}
    t0 = SPEC.start

    quiet = serving_service.window_findings(store, start=t0, end=t0 + 5 * MIN, write=False)
    assert quiet.height == 0, quiet

    found = serving_service.window_findings(store, start=t0 + 45 * MIN, end=t0 + 50 * MIN)
    by_kind = {k: sorted(g["subject"].to_list()) for (k,), g in found.group_by("kind")}
    assert by_kind["kv_cache_saturated"] == [f"deployment:{dep}/replica:{faults['kv_cache_saturated']['replica']}"]
    assert by_kind["preemptions_climbing"] == [f"deployment:{dep}/replica:{faults['kv_cache_saturated']['replica']}"]
    assert by_kind["slow_replica"] == [f"deployment:{dep}/replica:{faults['throttled_replica']['replica']}"]
    assert f"deployment:{dep}/slo:ttft/page_fast" in by_kind["slo_burn"]
    slow = found.filter(pl.col("kind") == "slow_replica")["score"].item()
    assert 2.0 < slow < 3.0  # the injected factor 2.5, read through the TPOT histogram's buckets

    # the burn ended at minute 55: five minutes on, the fast page's short window has cooled
    after = serving_service.slo_status(store, serving_service.stored_slos(store), now=t0 + 60 * MIN)[0]
    assert "page_fast" not in after["alerts"] and after["burn_rates"]["5m"] == 0
    assert faults["slo_burn"]["end"] == t0 + 55 * MIN

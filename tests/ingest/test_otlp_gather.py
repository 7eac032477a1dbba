"""ingest.otlp.gather: many OTLP requests built into one Batch equal their parses merged, as stored."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from polars.testing import assert_frame_equal

from fleetscope.core import frames as F
from fleetscope.core.frames import Batch
from ingest import otlp

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("_bench_otlp", REPO / "benchmarks" / "ingest_otlp.py")
_bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_bench)
T_NS = 1_800_000_000 * 10**9


def _stored(batch: Batch, name: str):  # type: ignore[no-untyped-def]
    df = getattr(batch, name)
    if df is None or not df.height:
        return None
    df = F.conform(F.FRAMES[name], df)
    return df.sort(df.columns)


def test_gathered_requests_equal_their_merged_parses():
    # 1 in 1,000 GPUs reports XID 13 and fault counts in the benchmark's bodies: GPU 0 is in the first.
    bodies = [_bench.build_request(8, T_NS + 10**9 * (h % 2), first=8 * h) for h in range(6)]
    merged = Batch(source="s")
    for b in bodies:
        merged = merged.merge(otlp.parse(b, encoding="protobuf", source="s"))
    walks = [otlp.read(b, encoding="protobuf", source="s") for b in bodies]
    group = otlp.gather(walks, source="s")
    for name in ("gpu", "gpu_sample", "gpu_workload", "health_event", "metric_sample"):
        a, b = _stored(merged, name), _stored(group, name)
        assert (a is None) == (b is None), name
        if a is not None:
            assert_frame_equal(a, b, check_column_order=True)
    assert group.gpu_sample.height == 48 and group.health_event.height > 0
    counted = [otlp.counts(w) for w in walks]
    assert [c[0]["gpu_sample"] for c in counted] == [8] * 6
    assert sum(c[1] for c in counted) == merged.values()


def test_requests_sharing_a_gpu_are_not_gathered():
    a = otlp.read(_bench.build_request(8, T_NS), encoding="protobuf")
    b = otlp.read(_bench.build_request(8, T_NS + 10**9), encoding="protobuf")
    with pytest.raises(ValueError, match="two of the requests"):
        otlp.gather([a, b])

"""The capacity model's arithmetic (benchmarks/capacity.py, README "Capacity model"): the pure parts only; the
benchmark itself measures."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location("_bench_capacity", Path(__file__).resolve().parents[1] / "benchmarks" / "capacity.py")
cap = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(cap)


def test_machines_are_cpu_seconds_over_a_machine_day_rounded_up() -> None:
    # 2 cores x 86,400 s x 0.7 = 120,960 CPU-s a machine-day
    out = cap.capacity_model({"api": 3.0, "database": 1.2096, "worker": 0.0}, 100_000)
    assert out["machine_cpu_s_per_day"] == 120_960
    assert out["api"] == {"cpu_s_per_day": 300_000, "cores": 3.47, "machines": 3}  # 300,000 / 120,960 = 2.48
    assert out["database"]["machines"] == 1  # 120,960 exactly fills one
    assert out["worker"]["machines"] == 1  # a role with no load still runs somewhere
    big = cap.capacity_model({"api": 3.0}, 1_000_000, cores=16, busy=0.5)
    assert big["api"]["machines"] == 5  # 3,000,000 / (16 x 86,400 x 0.5 = 691,200) = 4.34


def test_model_refuses_nonsense() -> None:
    with pytest.raises(ValueError, match="negative"):
        cap.capacity_model({"api": -1.0}, 10)
    with pytest.raises(ValueError, match="busy"):
        cap.capacity_model({"api": 1.0}, 10, busy=1.5)


def test_predicted_round_is_cpu_over_cores() -> None:
    assert cap.predicted_round_s(0.001, 16_384) == pytest.approx(8.192)
    assert cap.predicted_round_s(0.001, 16_384, cores=4) == pytest.approx(4.096)


def test_sweeps_scale_to_beats_schedule() -> None:
    sweeps = {"energy_5min": {"worker_cpu_s": 5.0, "pg_cpu_s": 1.0}, "tier_minute_4min": {"worker_cpu_s": 4.0, "pg_cpu_s": 0.0},
              "tier_hour_of_5min": {"worker_cpu_s": 0.5, "pg_cpu_s": 0.0}, "health_5min": {"worker_cpu_s": 10.0, "pg_cpu_s": 2.0}}
    out = cap.sweep_cpu_per_gpu_day(sweeps, 1440)
    # energy: 1 CPU-s a minute of data, re-rolled over 10 minutes every minute: 10 s a minute, 1,440 minutes, 1,440 GPUs
    assert out["energy_worker"] == pytest.approx(10.0)
    assert out["energy_pg"] == pytest.approx(2.0)
    assert out["tier_minute_worker"] == pytest.approx(1.0)
    assert out["tier_hour_worker"] == pytest.approx(0.1)
    # health: 2 CPU-s a minute of data, each sample read by three 15-minute windows
    assert out["health_worker"] == pytest.approx(6.0)
    assert out["health_pg"] == pytest.approx(1.2)


def test_topology_is_the_asked_fleet() -> None:
    topo = cap.fleet_topology(100_000)
    assert (topo.n_gpus, len(topo.hosts), len(topo.sites)) == (100_000, 12_500, 4)
    with pytest.raises(ValueError, match="multiple of 32"):
        cap.fleet_topology(100)


def _run(gpus: int, api_cpu_s: float, raw_bytes: float) -> list[dict]:
    return [{"bench": "capacity", "what": "start", "gpus": gpus},
            {"bench": "capacity", "what": "ingest", "api_cpu_s_per_round": api_cpu_s, "pg_cpu_s_per_round": 0.0},
            {"bench": "capacity", "what": "storage", **{t: {"bytes_per_gpu_day": raw_bytes} for t in ("raw", "minute", "hour", "energy_minute")}}]


def test_compare_scales_the_small_run_to_the_large_fleet() -> None:
    rows = {r["figure"]: r for r in cap.compare_runs(_run(1000, 2.0, 100.0), _run(4000, 10.0, 110.0))}
    # 2 CPU-s for 1,000 GPUs predicts 8 for 4,000; 10 were measured
    assert (rows["api_cpu_s_per_round"]["predicted"], rows["api_cpu_s_per_round"]["measured"]) == (8.0, 10.0)
    assert rows["api_cpu_s_per_round"]["measured_over_predicted"] == 1.25
    # bytes per GPU-day are per GPU already: compared as they are
    assert (rows["raw_bytes_per_gpu_day"]["predicted"], rows["raw_bytes_per_gpu_day"]["measured_over_predicted"]) == (100.0, 1.1)
    assert "energy_5min_cpu_s" not in rows  # a run without sweeps has no sweep figures to compare

"""``GET /api/v1/teams/usage/series`` and ``/idle``: the Teams & Cost page's reads over the API, on the
simulator's Slurm and Kubernetes clusters pushed through the ingest route; figures from the simulated jobs."""

from __future__ import annotations

import datetime as dt

import httpx
import pytest

from analyzers import idle_allocations
from fleetscope.core import frames as F
from fleetscope.services import auth
from fleetscope.sim import scheduler as sim_sched

START = dt.datetime(2026, 11, 2, 8, 0, tzinfo=dt.UTC)
HOSTS = ["gpu-n01", "gpu-n02", "gpu-n03"]


def test_series_and_idle_over_the_api(api) -> None:
    store = api.app.state.store
    ingest = {"Authorization": "Bearer " + auth.create_token(store.engine, "agent", ["ingest"])}
    read = {"Authorization": "Bearer " + auth.create_token(store.engine, "reader", ["read"])}
    admin = {"Authorization": "Bearer " + auth.create_token(store.engine, "admin", ["admin"])}
    training = [{"job_id": "900", "name": "pretrain", "hosts": HOSTS[:2], "world_size": 16, "start": (START + dt.timedelta(minutes=5)).isoformat(),
                 "end": (START + dt.timedelta(hours=3)).isoformat()}]
    world = sim_sched.scheduler_world(START, 4 * 3600, HOSTS, ["s1"] * 3, 8, training)
    for body, params in ((sim_sched.sacct_text(world), {}), (sim_sched.kube_state_text(world), {"ts": world.end.isoformat()})):
        r = httpx.post(api.url + "/api/v1/ingest/auto", content=body, params=params, headers=ingest, timeout=60)
        assert r.status_code == 200, r.text
    for kind, match, team in sim_sched.TEAMS:
        assert httpx.put(api.url + "/api/v1/teams/mappings", json={"kind": kind, "match": match, "team": team}, headers=admin, timeout=30).status_code == 200
    window = {"start": (START - dt.timedelta(hours=2)).isoformat(), "end": world.end.isoformat()}
    r = httpx.get(api.url + "/api/v1/teams/usage/series", params={**window, "step_s": 3600}, headers=read, timeout=60)
    assert r.status_code == 200, r.text
    series = r.json()
    # six hourly buckets from 06:00; nothing ran before the inference pods started at 07:00:10
    assert series["step_s"] == 3600 and sorted({b["bucket_start"][11:13] for b in series["buckets"]}) == ["07", "08", "09", "10", "11"]
    per_team: dict[str, float] = {}
    for b in series["buckets"]:
        per_team[b["team"]] = per_team.get(b["team"], 0.0) + b["gpu_hours"]
    assert per_team == pytest.approx(world.truth()["team_gpu_hours"], abs=1e-6)
    # the llm pretraining job: 16 GPUs from 08:05 to 11:00, so 16 × 55/60 GPU-hours in the 08:00 bucket
    first = next(b for b in series["buckets"] if b["team"] == "llm" and b["bucket_start"].startswith("2026-11-02T08:00"))
    assert first["gpu_hours"] == pytest.approx(16 * 55 / 60)
    month = {"start": (world.end - dt.timedelta(days=30)).isoformat(), "end": window["end"], "step_s": 3600}  # 720 buckets
    for bad in ({**window, "step_s": 59}, {**window, "step_s": "day"}, month):
        r = httpx.get(api.url + "/api/v1/teams/usage/series", params=bad, headers=read, timeout=30)
        assert r.status_code == 422, (bad, r.text)
    assert "more than 400 buckets" in r.text
    assert httpx.get(api.url + "/api/v1/teams/usage/series", params=window, timeout=30).status_code == 401

    # an idle-allocation finding as the health sweep writes it, read back with its evidence as columns
    samples = _idle_samples(world)
    found = idle_allocations.idle_findings(_job_gpus(world), samples, min_idle_s=600,
                                           prices={(sim_sched.SLURM_CLUSTER, world.idle_job.job_id): (2.0, "EUR")})
    store.write(F.Batch(source="test:idle", finding=found))
    idle = httpx.get(api.url + "/api/v1/teams/idle", params=window, headers=read, timeout=30).json()
    assert [(i["subject"], i["team"], i["gpus_idle"], i["currency"]) for i in idle] == [
        (f"job:{sim_sched.SLURM_CLUSTER}/{world.idle_job.job_id}", "vision", 8, "EUR")]
    held_h = 8 * (samples["ts"].max() - samples["ts"].min()).total_seconds() / 3600  # each GPU idle from its first sample to its last
    assert idle[0]["idle_gpu_hours"] == pytest.approx(held_h, abs=1e-4) and idle[0]["idle_cost"] == pytest.approx(round(held_h * 2.0, 2), abs=0.01)
    assert httpx.get(api.url + "/api/v1/teams/idle", params={"start": window["end"], "end": window["start"]}, headers=read, timeout=30).status_code == 400


def _job_gpus(world: sim_sched.SchedulerWorld):
    import polars as pl

    return pl.DataFrame({"cluster": sim_sched.SLURM_CLUSTER, "job_id": world.idle_job.job_id, "gpu_uuid": [f"G{i}" for i in range(8)],
                         "team": "vision", "account": "vision", "host": world.idle_job.hosts[0]})


def _idle_samples(world: sim_sched.SchedulerWorld):
    """A sample a minute of the vision node's eight GPUs, all idle, from the notebook job's start to a minute before the end."""
    import polars as pl

    assert world.idle_job.start is not None
    n = int((world.end - world.idle_job.start).total_seconds() // 60)
    ts = [world.idle_job.start + dt.timedelta(minutes=k) for k in range(n)]
    return pl.DataFrame({"ts": [t for t in ts for _ in range(8)], "gpu_uuid": [f"G{i}" for _ in ts for i in range(8)], "util_ratio": 0.0},
                        schema_overrides={"ts": pl.Datetime("us", "UTC")})

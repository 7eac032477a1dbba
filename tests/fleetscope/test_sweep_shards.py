"""Sweeps split by hosts (FLEETSCOPE_SWEEP_SHARDS): the energy roll-up's shards plus its sums, and the health
sweep's shards plus its fleet part, write and find exactly what one unsplit run does."""

import datetime as dt

import polars as pl
import pytest

from fleetscope.core import frames as F
from fleetscope.services import energy_rollup, health, shards
from fleetscope.sim import FleetSpec, gpu_fleet

T0 = dt.datetime(2026, 3, 1, 12, tzinfo=dt.UTC)
SHARDS = 3
ENERGY_TABLES = ("gpu_energy_minute", "site_energy_minute", "job_energy_minute")


def seed(store) -> F.Batch:
    """Two sites of four 4-GPU nodes, a job on six GPUs across two nodes, a GPU the inventory does not know,
    one sick GPU (XID 79, remap failure) and one whose clock sags under load."""
    b = gpu_fleet(FleetSpec(sites=2, nodes_per_site=4, gpus_per_node=4, interval_s=10), T0, 900)
    gpus = b.gpu["gpu_uuid"].to_list()
    sick, slow = gpus[5], gpus[13]
    stray = b.gpu_sample.filter(pl.col("gpu_uuid") == gpus[0]).with_columns(gpu_uuid=pl.lit("GPU-not-in-inventory"))
    # hosts hold different clocks under load (0.98 ... 0.84 of the first's), so a shard's own 90th percentile
    # would differ from the fleet's, which every GPU is held to
    host_of = dict(zip(gpus, b.gpu["host"].to_list()))
    hosts = sorted(set(host_of.values()))
    factor = pl.col("gpu_uuid").replace_strict({g: 1.0 - 0.02 * hosts.index(h) for g, h in host_of.items()}, default=1.0, return_dtype=pl.Float64)
    b.gpu_sample = pl.concat([b.gpu_sample, stray]).with_columns(pl.col("sm_clock_mhz") * factor).with_columns(
        pl.when(pl.col("gpu_uuid") == sick).then(1).otherwise(0).alias("remap_failure"),
        pl.when(pl.col("gpu_uuid") == slow).then(pl.col("sm_clock_mhz") * 0.6).otherwise(pl.col("sm_clock_mhz")).alias("sm_clock_mhz"),
    )
    b.health_event = pl.DataFrame({"ts": [T0 + dt.timedelta(minutes=3)], "host": [b.gpu["host"][5]], "gpu_uuid": [sick],
                                   "kind": ["xid"], "code": [79]})
    b.job_rank = pl.DataFrame({"job_id": "train-1", "rank": list(range(6)), "start": T0 + dt.timedelta(minutes=2),
                               "end": T0 + dt.timedelta(minutes=11), "gpu_uuid": gpus[2:8]})
    store.write(b)
    return b


def snapshot(store) -> dict[str, pl.DataFrame]:
    out = {}
    for t in ENERGY_TABLES:
        df = store.read(t)
        out[t] = df.sort(df.columns)
    return out


def clear(store) -> None:
    with store.engine.begin() as conn:
        for t in ENERGY_TABLES:
            conn.exec_driver_sql(f"DELETE FROM {t}")


def test_energy_rollup_shards_and_sums_write_what_one_rollup_writes(store):
    b = seed(store)
    start, end = T0 + dt.timedelta(minutes=1), T0 + dt.timedelta(minutes=14)
    energy_rollup.rollup_window(store, start, end)
    whole = snapshot(store)
    clear(store)
    rolled = [energy_rollup.rollup_shard(store, start, end, k, SHARDS) for k in range(SHARDS)]
    sums = energy_rollup.rollup_sums(store, start, end)
    split = snapshot(store)
    for t in ENERGY_TABLES:
        assert whole[t].height > 0, t
        assert split[t].equals(whole[t]), t
    # every shard did a share, and the GPU on no known host went to shard 0
    assert all(r["gpus"] > 0 for r in rolled) and sum(r["gpus"] for r in rolled) == b.gpu.height + 1
    assert "GPU-not-in-inventory" in energy_rollup.shards_mod.shard_gpu_samples(
        store, 0, SHARDS, start, end, ["ts", "gpu_uuid"], dict(F.GPU_SAMPLE.schema))["gpu_uuid"].to_list()
    assert sums["job_minutes"] == whole["job_energy_minute"].height


def test_health_shards_and_fleet_part_find_what_one_sweep_finds(store):
    seed(store)
    start, end = T0, T0 + dt.timedelta(minutes=15)
    whole = health.health_window(store, start, end, write=False)
    parts = [health.health_window(store, start, end, write=False, part=(k, SHARDS)) for k in range(SHARDS)]
    fleet = health.health_window(store, start, end, write=False, part="fleet")
    cols = whole["findings"].columns
    found = pl.concat([p["findings"].select(cols) for p in [*parts, fleet]], how="vertical_relaxed")
    assert found.sort(cols).equals(whole["findings"].sort(cols))
    gpus = pl.concat([p["gpus"] for p in parts], how="diagonal_relaxed").select(whole["gpus"].columns)
    assert gpus.sort("gpu_uuid").equals(whole["gpus"].sort("gpu_uuid"))
    # the split is real, and what it compares is not empty: the sick GPU and the sagging clock were found
    assert all(p["gpus"].height for p in parts)
    subjects = whole["findings"]["subject"].to_list()
    assert any("GPU" in s for s in subjects) and whole["findings"].filter(pl.col("severity") == "critical").height


def test_a_shard_outside_its_range_is_refused(store):
    with pytest.raises(ValueError, match="shard 3"):
        shards.shard_hosts(store, 3, 3)
    with pytest.raises(ValueError, match="part must be"):
        health.health_window(store, T0, T0 + dt.timedelta(minutes=5), part=(2, 2))


def test_beat_sends_one_task_per_shard_and_their_results_are_one_rollup_s(store, tmp_path, monkeypatch):
    """The beat tasks with FLEETSCOPE_SWEEP_SHARDS=3: each queues a task per shard (run here as it is queued),
    and the roll-up they make together is the unsplit one."""
    from fleetscope.worker import app as worker_app
    from fleetscope.worker import tasks
    from tests.conftest import make_settings

    seed(store)
    start, end = T0 + dt.timedelta(minutes=1), T0 + dt.timedelta(minutes=14)
    energy_rollup.rollup_window(store, start, end)
    whole = snapshot(store)
    clear(store)
    url = str(store.engine.url.render_as_string(hide_password=False))
    conf = worker_app.celery_app.conf
    monkeypatch.setitem(conf, "fleetscope_settings", make_settings(tmp_path, url, sweep_shards=SHARDS))
    monkeypatch.setattr(worker_app, "_store", store)
    sent: list[tuple] = []

    def run_now(task):
        return lambda **kw: (sent.append((task.name, kw["shard"], kw["shards"])), task.run(**kw))[1]

    rollup, rollup_shard = (tasks.SCHEDULED_TASKS[t] for t in ("fleetscope.energy_rollup", "fleetscope.energy_rollup_shard"))
    monkeypatch.setattr(rollup_shard, "delay", run_now(rollup_shard))
    monkeypatch.setattr(tasks.health_window_shard, "delay", run_now(tasks.health_window_shard))
    window = {"window_start": start.isoformat(), "window_end": end.isoformat()}
    assert rollup.run(**window)["shards"] == SHARDS
    # the sums ran before the shards' minutes existed (as they may on a busy beat); the next tick has them
    assert rollup.run(**window)["sums"]["window_start"] == start.isoformat()
    assert sent[:SHARDS] == [("fleetscope.energy_rollup_shard", k, SHARDS) for k in range(SHARDS)]
    split = snapshot(store)
    for t in ENERGY_TABLES:
        assert split[t].equals(whole[t]), t
    out = tasks.health_window.run(900)
    assert out["shards"] == SHARDS and [s for s in sent if s[0] == "fleetscope.health_window_shard"] == [
        ("fleetscope.health_window_shard", k, SHARDS) for k in range(SHARDS)]

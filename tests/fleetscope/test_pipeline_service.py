"""The pipeline watching itself (services/pipeline.py): a roll-up that never ran is late once data older than
its allowance has arrived, and catches up when the roll-ups run; beat's lease and the workers' task outcomes;
bytes per table from the database's catalogue; the same through the API (with its scope), its /metrics
gauges and `fleetscope db status`."""

from __future__ import annotations

import datetime as dt
import json

import httpx
import polars as pl
import pytest
from click.testing import CliRunner
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import text

from fleetscope.cli import main as cli_main
from fleetscope.core import frames as F
from fleetscope.services import auth, energy_rollup, job_usage, pipeline, tiers
from fleetscope.store import Store, partitions, schema

GPUS = ("GPU-p0", "GPU-p1", "GPU-p2")
MINUTES = 15


def _fleet(store: Store, t0: dt.datetime) -> int:
    """Three GPUs every 10 s for ``MINUTES`` from ``t0``, one push; the rows written."""
    rows = [{"ts": t0 + dt.timedelta(seconds=10 * i), "gpu_uuid": g, "power_w": 300.0 + i, "energy_j": 1e6 + 3000.0 * i}
            for g in GPUS for i in range(MINUTES * 6)]
    store.write_frames([(F.GPU_SAMPLE, F.conform(F.GPU_SAMPLE, pl.DataFrame(rows)))], source="pipeline-test")
    return len(rows)


def _stages(report: dict) -> dict[str, dict]:
    return {s["stage"]: s for s in report["stages"]}


def test_rollups_that_never_ran_are_late_and_catch_up_when_they_run(store: Store) -> None:
    pushed_at = dt.datetime.now(dt.UTC)
    t0 = (pushed_at - dt.timedelta(minutes=30)).replace(second=0, microsecond=0)
    n = _fleet(store, t0)

    fresh = pipeline.status(store, pushed_at + dt.timedelta(minutes=1))
    assert fresh["ingest"]["pushes_recent"] == 1
    assert fresh["ingest"]["last_push_at"] >= pushed_at - dt.timedelta(seconds=5)
    assert not any(s["late"] for s in fresh["stages"])  # the data is a minute old: no stage owes it yet

    # Ten minutes on and nothing rolled (no beat, no worker): the minute stages are late, the hour not yet.
    stale = _stages(pipeline.status(store, pushed_at + dt.timedelta(minutes=10)))
    assert {k: (v["late"], v["rolled_to"]) for k, v in stale.items()} == {"energy": (True, None), "minute": (True, None), "hour": (False, None),
                                                                      "job_hour": (False, None)}
    assert stale["minute"]["allowed_lag_s"] == (tiers.SETTLE + 2 * dt.timedelta(minutes=1)).total_seconds()

    end = t0 + dt.timedelta(minutes=MINUTES)
    energy_rollup.rollup_window(store, t0, end)
    tiers.advance(store, end + tiers.SETTLE)
    now = end + tiers.SETTLE + dt.timedelta(seconds=30)
    caught = _stages(pipeline.status(store, now))
    assert caught["minute"]["rolled_to"] == end and caught["minute"]["lag_s"] == (tiers.SETTLE + dt.timedelta(seconds=30)).total_seconds()
    assert caught["energy"]["rolled_to"] == end  # the roll-up's newest minute is the fleet's last full one
    assert not caught["minute"]["late"] and not caught["energy"]["late"]
    with store.engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM gpu_sample")).scalar_one() == n


def test_a_fleet_that_stopped_sending_leaves_no_stage_late(store: Store) -> None:
    # The roll-ups owe what has arrived: three hours after the last push they are not late (the ingest line
    # says the fleet went quiet, and the absence analysis finds the GPUs).
    pushed_at = dt.datetime.now(dt.UTC)
    end = pushed_at.replace(second=0, microsecond=0)
    _fleet(store, end - dt.timedelta(minutes=MINUTES))
    energy_rollup.rollup_window(store, end - dt.timedelta(minutes=MINUTES), end)
    tiers.advance(store, end + tiers.SETTLE)
    later = pushed_at + dt.timedelta(hours=3)
    tiers.advance(store, later)  # beat's ticks: every hour holding the data has closed by now
    job_usage.advance(store, later)
    report = pipeline.status(store, later)
    assert 3 * 3600 - 10 <= report["ingest"]["lag_s"] <= 3 * 3600 and report["ingest"]["pushes_recent"] == 0
    stages = _stages(report)
    assert not any(s["late"] for s in stages.values()), stages
    assert 0 <= stages["minute"]["lag_s"] <= (pushed_at - end).total_seconds() + 10  # the last minute rolled: behind by the push's seconds only
    assert "minute      " in pipeline.describe(report, []) and ": ok" in pipeline.describe(report, [])


def test_beat_leader_and_task_outcomes(store: Store) -> None:
    now = dt.datetime(2026, 12, 1, 12, 0, tzinfo=dt.UTC)
    with store.engine.begin() as conn:
        conn.execute(schema.beat_lease.insert().values(name="beat", holder="host-a:17:x", expires_at=now + dt.timedelta(seconds=20),
                                                       acquired_at=now - dt.timedelta(hours=1)))
        conn.execute(schema.task_run.insert(), [
            {"task": "fleetscope.tier_rollup", "task_id": "a", "state": "success", "at": now - dt.timedelta(minutes=3), "runtime_s": 1.5},
            {"task": "fleetscope.tier_rollup", "task_id": "b", "state": "failure", "at": now - dt.timedelta(minutes=2), "runtime_s": 0.25, "detail": "boom"},
            {"task": "fleetscope.tier_rollup", "task_id": "c", "state": "success", "at": now - dt.timedelta(days=2), "runtime_s": 9.0},
            {"task": "fleetscope.retention", "task_id": "d", "state": "success", "at": now - dt.timedelta(minutes=43), "runtime_s": 4.0},
        ])
    report = pipeline.status(store, now)
    assert report["beat"]["leading"] and report["beat"]["holder"] == "host-a:17:x"
    tasks = {t["task"]: t for t in report["tasks"]}
    roll = tasks["fleetscope.tier_rollup"]
    assert (roll["entry"], roll["runs_day"], roll["failures_day"], roll["last_runtime_s"]) == ("tier-rollup", 2, 1, 0.25)
    assert roll["last_success_at"] == now - dt.timedelta(minutes=3) and roll["last_failure_at"] == now - dt.timedelta(minutes=2)
    assert tasks["fleetscope.retention"]["entry"] is None and tasks["fleetscope.retention"]["failures_day"] == 0
    assert not pipeline.status(store, now + dt.timedelta(seconds=21))["beat"]["leading"]  # the lease ran out
    text_ = pipeline.describe(report, pipeline.storage(store))
    assert "beat        led by host-a:17:x" in text_ and "1 failed in a day (last 120 s ago)" in text_


def test_storage_per_table_from_the_catalogue(store: Store) -> None:
    n = _fleet(store, dt.datetime.now(dt.UTC).replace(second=0, microsecond=0) - dt.timedelta(minutes=30))
    if store.dialect == "postgresql":
        with store.engine.begin() as conn:
            conn.execute(text("ANALYZE gpu_sample, gpu_key"))
    sizes = {r["table"]: r for r in pipeline.storage(store)}
    pg_own = {"gpu_sample_packed", "gpu_energy_minute_packed", "gpu_key"}  # PostgreSQL's tables outside the models
    assert set(sizes) <= {t.name for t in schema.metadata.sorted_tables} | pg_own and "gpu_sample" in sizes and "ingest_log" in sizes
    # the three GPUs' ids (a packed table appears once it holds a day)
    assert ("gpu_key" in sizes) == (store.dialect == "postgresql") and (store.dialect != "postgresql" or sizes["gpu_key"]["rows_estimate"] == 3)
    sample = sizes["gpu_sample"]
    assert sample["bytes"] > 0
    listed = [r["bytes"] or 0 for r in pipeline.storage(store)]
    assert listed == sorted(listed, reverse=True)
    if store.dialect == "postgresql":
        # partitioned by UTC day: the rows live in the day's partition(s), counted under the parent
        assert sample["rows_estimate"] == n and sample["partitions"] == len(partitions.partitions(store.engine, "gpu_sample")) >= 1
    else:
        assert sample["rows_estimate"] is None and sample["partitions"] == 0


def test_api_metrics_and_cli(api, tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    store = api.app.state.store
    _fleet(store, (dt.datetime.now(dt.UTC) - dt.timedelta(minutes=40)).replace(second=0, microsecond=0))
    assert httpx.get(api.url + "/api/v1/fleet/pipeline").status_code == 401
    ingest_only = auth.create_token(store.engine, "agent", ["ingest"])
    assert httpx.get(api.url + "/api/v1/fleet/pipeline", headers={"Authorization": f"Bearer {ingest_only}"}).status_code == 403
    reader = {"Authorization": f"Bearer {auth.create_token(store.engine, 'ops', ['read'])}"}
    body = httpx.get(api.url + "/api/v1/fleet/pipeline", headers=reader).json()
    assert body["ingest"]["pushes_recent"] == 1 and body["beat"]["leading"] is False
    assert {s["stage"] for s in body["stages"]} == {"energy", "minute", "hour", "job_hour"}
    assert any(r["table"] == "gpu_sample" and r["bytes"] > 0 for r in body["storage"])

    families = {f.name: f for f in text_string_to_metric_families(httpx.get(api.url + "/metrics", headers=reader).text)}
    assert families["fleetscope_beat_leading"].samples[0].value == 0.0
    # the fleet's energy minutes are all of today: no closed day waits to be packed
    assert families["fleetscope_energy_packing_pending_days"].samples[0].value == 0.0 and body["energy_packing_pending_days"] == []
    # Pushed just now: nothing is owed yet by any stage.
    assert {s.labels["stage"]: s.value for s in families["fleetscope_pipeline_late"].samples} == {"energy": 0.0, "minute": 0.0, "hour": 0.0,
                                                                                                  "job_hour": 0.0}

    monkeypatch.setenv("FLEETSCOPE_DATABASE_URL", str(store.engine.url.render_as_string(hide_password=False)))
    monkeypatch.setenv("FLEETSCOPE_DATA_DIR", str(tmp_path))
    out = CliRunner().invoke(cli_main, ["db", "status", "--json"])
    assert out.exit_code == 0, out.output
    data = json.loads(out.output)
    assert data["ingest"]["pushes_recent"] == 1 and any(r["table"] == "gpu_sample" for r in data["storage"])
    late = CliRunner().invoke(cli_main, ["db", "status", "--fail-late"])
    assert late.exit_code == 3 and "beat        NO LEADER" in late.output  # no beat runs here


@pytest.mark.parametrize("bad", ["--fail-late=yes", "--bogus"])
def test_cli_refuses_unknown_options(bad: str) -> None:
    out = CliRunner().invoke(cli_main, ["db", "status", bad])
    assert out.exit_code == 2

"""The analyzer registry: job analysis, the health sweep, the API and the CLI all go through it."""

from __future__ import annotations

import datetime as dt
import importlib
import json

import httpx
import polars as pl
import pytest

from fleetscope.core import frames as F
from fleetscope.services import auth, catalog, health, jobs, scheduled
from fleetscope.services.analysis import Beat, Registry, Timetable
from fleetscope.store import schema
from tests import clirun

T0 = dt.datetime(2026, 3, 1, 12, tzinfo=dt.UTC)


def test_every_registered_analysis_names_real_modules_and_frames():
    rows = catalog.analyses()
    names = [(r["cadence"], r["name"]) for r in rows]
    assert names[:6] == [("job", n) for n in ("c3", "stragglers", "goodput", "sdc", "checkpoint", "whatif")]
    assert ("window", "absence") in names and ("window", "fabric_attribution") in names
    tables = set(schema.metadata.tables)
    for r in rows:
        for m in r["modules"]:
            importlib.import_module(m)  # an analysis names the pure module it calls
        assert set(r["reads"]) <= tables and set(r["writes"]) <= tables and set(r["needs"]) <= set(r["reads"]), r["name"]
        assert (r["writes"] or r["files"]) and r["summary"] and r["runs"] and r["beat"] in r["runs"]
    # what depends on an earlier analysis runs after it
    window = [n for c, n in names if c == "window"]
    assert window.index("ib_links") < window.index("alltoall") < window.index("fabric_attribution")
    assert window.index("slow_fabric") < window.index("fabric_attribution")


def test_beat_runs_every_analysis_from_its_registry_under_its_old_names():
    from celery.schedules import crontab

    from fleetscope.worker import celery_app, make_celery

    rows = catalog.analyses()
    assert [(r["cadence"], r["name"], r["beat"], r["task"]) for r in rows if r["cadence"] == "scheduled"] == [
        ("scheduled", "energy_rollup", "energy-rollup", "fleetscope.energy_rollup"),
        ("scheduled", "tier_rollup", "tier-rollup", "fleetscope.tier_rollup"),
        ("scheduled", "job_usage_rollup", "job-usage-rollup", "fleetscope.job_usage_rollup"),
        ("scheduled", "raw_packing", "raw-packing", "fleetscope.raw_packing"),
        ("scheduled", "model_monitoring", "model-monitoring", "fleetscope.model_monitoring"),
        ("scheduled", "serving_window", "serving-window", "fleetscope.serving_window"),
        ("scheduled", "teams_showback", "teams-showback", "fleetscope.teams_showback")]
    assert {(r["beat"], r["task"]) for r in rows if r["cadence"] in ("job", "window")} == {
        ("analyze-active-jobs", "fleetscope.analyze_active_jobs"), ("health-window", "fleetscope.health_window")}
    schedule = make_celery().conf.beat_schedule
    for b in scheduled.beats():
        assert schedule[b.entry]["task"] == b.task and b.task in celery_app.tasks, b.entry
    assert {k: schedule[k]["schedule"] for k in ("analyze-active-jobs", "energy-rollup", "tier-rollup", "job-usage-rollup", "health-window", "serving-window")} == {
        "analyze-active-jobs": 60.0, "energy-rollup": 60.0, "tier-rollup": 60.0, "job-usage-rollup": 300.0, "health-window": 300.0,
        "serving-window": 300.0}
    assert schedule["model-monitoring"]["schedule"] == crontab(minute=7)
    assert schedule["teams-showback"]["schedule"] == crontab(minute=30, hour=2, day_of_month=1)
    # the upkeep that is no analysis keeps its own entries
    assert {"retention", "partitions-ahead", "audit-report"} <= set(schedule)


def test_a_registered_scheduled_analysis_gets_its_beat_entry_and_is_listed():
    from fleetscope.worker import make_celery

    scheduled.SCHEDULED.register("nightly_test", beat=Beat("nightly-test", "fleetscope.nightly_test", crontab="0 3 * * *"),
                                 run="fleetscope.services.tiers:scheduled_advance",
                                 modules=("analyzers.energy",), reads=("gpu_sample",), writes=("finding",), summary="test")
    try:
        entry = make_celery().conf.beat_schedule["nightly-test"]
        assert entry["task"] == "fleetscope.nightly_test" and entry["schedule"].hour == {3} and entry["schedule"].minute == {0}
        row = [r for r in catalog.analyses() if r["name"] == "nightly_test"]
        assert row and row[0]["when"] == "at crontab '0 3 * * *' UTC" and row[0]["runs"] == "beat's nightly-test (at crontab '0 3 * * *' UTC)"
    finally:
        scheduled.SCHEDULED._items.pop("nightly_test")
    assert "nightly-test" not in make_celery().conf.beat_schedule


CALLS: list[tuple[str, object, int, dict]] = []


def scratch_run(store, settings, *, month: str | None = None) -> dict:
    CALLS.append(("run", store, settings.sweep_shards, {"month": month}))
    return {"month": month, "ran": True}


def scratch_args(*, window_start: str | None = None) -> dict:
    return {"window_start": window_start or "2026-03-01T12:00:00+00:00"}


def scratch_shard(store, settings, *, shard: int, shards: int, window_start: str) -> dict:
    CALLS.append(("shard", store, shard, {"shards": shards, "window_start": window_start}))
    return {"shard": shard}


def scratch_fleet(store, settings, *, window_start: str) -> dict:
    CALLS.append(("fleet", store, settings.sweep_shards, {"window_start": window_start}))
    return {"sums": window_start}


def test_a_timetable_entry_gets_its_celery_task_and_it_runs_with_its_args():
    """A new scheduled analysis is a service function and a registration: its task (and its shards') is made
    from the timetable and calls the function, with the operator's arguments, on the worker's store."""
    from types import SimpleNamespace

    from celery import Celery

    from fleetscope.services.analysis import Shards
    from fleetscope.worker.tasks import scheduled_tasks

    here = __name__
    table = Timetable()
    table.register("nightly", beat=Beat("nightly", "scratch.nightly", crontab="0 3 * * *"), run=f"{here}:scratch_run",
                   modules=(), reads=("gpu_sample",), writes=("finding",), summary="a test's")
    table.register("split", beat=Beat("split", "scratch.split", every_s=60.0), run=f"{here}:scratch_run",
                   shards=Shards("scratch.split_shard", args=f"{here}:scratch_args", run=f"{here}:scratch_shard", fleet=f"{here}:scratch_fleet"),
                   modules=(), reads=("gpu_sample",), writes=("finding",), summary="a sharded test's")
    app = Celery("scratch", set_as_current=False)
    app.conf.task_always_eager = True
    app.conf.fleetscope_settings = SimpleNamespace(sweep_shards=1)
    made = scheduled_tasks(app, table, lambda: "the-store", shared=False)
    assert sorted(made) == ["scratch.nightly", "scratch.split", "scratch.split_shard"]
    assert {n for n in app.tasks if n.startswith("scratch.")} == set(made)
    CALLS.clear()
    assert app.tasks["scratch.nightly"].delay(month="2026-02").get() == {"month": "2026-02", "ran": True}
    assert CALLS == [("run", "the-store", 1, {"month": "2026-02"})]
    # one shard: the entry's own function, as unsharded
    CALLS.clear()
    assert made["scratch.split"].delay().get() == {"month": None, "ran": True}
    # three shards: the arguments fixed once, a task per shard with them, then the fleet part
    app.conf.fleetscope_settings = SimpleNamespace(sweep_shards=3)
    CALLS.clear()
    assert made["scratch.split"].delay().get() == {"shards": 3, "sums": "2026-03-01T12:00:00+00:00"}
    w = "2026-03-01T12:00:00+00:00"
    assert CALLS == [("shard", "the-store", k, {"shards": 3, "window_start": w}) for k in range(3)] + [("fleet", "the-store", 3, {"window_start": w})]
    with pytest.raises(TypeError, match="unexpected keyword argument 'window_s'"):
        made["scratch.nightly"].delay(window_s=60).get()


def test_every_scheduled_analysis_has_its_celery_task_under_its_beat_entry_s_task_name():
    import inspect

    from fleetscope.services.analysis import load
    from fleetscope.worker import celery_app, make_celery, tasks

    schedule = make_celery().conf.beat_schedule
    names = []
    for a in scheduled.SCHEDULED:
        assert schedule[a.beat.entry]["task"] == a.beat.task and celery_app.tasks[a.beat.task].name == a.beat.task, a.name
        assert list(inspect.signature(load(a.run)).parameters)[:2] == ["store", "settings"], a.run
        names += [a.beat.task]
        if a.shards:
            assert celery_app.tasks[a.shards.task].name == a.shards.task
            names += [a.shards.task]
    assert sorted(tasks.SCHEDULED_TASKS) == sorted(names) and "fleetscope.energy_rollup_shard" in names
    with pytest.raises(ValueError, match="'package.module:function'"):
        Timetable().register("x", beat=Beat("x", "t.x", every_s=1.0), run="fleetscope.services.tiers.advance",
                             modules=(), reads=(), writes=("finding",), summary="x")


def test_a_beat_entry_says_when_once_and_is_registered_once():
    with pytest.raises(ValueError, match="one of the two"):
        Beat("x", "t")
    with pytest.raises(ValueError, match="one of the two"):
        Beat("x", "t", every_s=60.0, crontab="* * * * *")
    with pytest.raises(ValueError, match="positive"):
        Beat("x", "t", every_s=0.0)
    with pytest.raises(ValueError, match="five fields"):
        Beat("x", "t", crontab="7 * *")
    assert Beat("x", "t", every_s=300.0).when == "every 300 s"
    table = Timetable()
    table.register("a", beat=Beat("a-entry", "t.a", every_s=60.0), run="m:f", modules=(), reads=(), writes=("finding",), summary="a")
    with pytest.raises(ValueError, match="registered twice"):
        table.register("a", beat=Beat("other", "t.a", every_s=60.0), run="m:f", modules=(), reads=(), writes=("finding",), summary="a")
    with pytest.raises(ValueError, match="beat entry 'a-entry' is registered twice"):
        table.register("b", beat=Beat("a-entry", "t.b", every_s=60.0), run="m:f", modules=(), reads=(), writes=("finding",), summary="b")
    with pytest.raises(ValueError, match="task 't.a' is registered twice"):
        table.register("c", beat=Beat("c-entry", "t.a", every_s=60.0), run="m:f", modules=(), reads=(), writes=("finding",), summary="c")
    assert table.names() == ["a"]


def test_a_name_is_registered_once():
    reg: Registry[object] = Registry("job")
    reg.register("x", modules=(), reads=(), writes=("finding",), summary="s")(lambda run: None)
    with pytest.raises(ValueError, match="registered twice"):
        reg.register("x", modules=(), reads=(), writes=("finding",), summary="s")(lambda run: None)


def test_skipped_analyses_are_noted_once_per_missing_frame():
    reg: Registry[list] = Registry("job", skip_notes={"step": "no steps here"})
    for name, needs in (("a", ("step",)), ("b", ("step",)), ("c", ("job_event",)), ("d", ())):
        reg.register(name, modules=(), reads=needs, writes=("finding",), summary=name, needs=needs)(lambda run, n=name: run.append(n))
    ran: list[str] = []
    notes: list[str] = []
    assert reg.run_all(ran, lambda frame: False, notes.append) == ["d"]
    assert ran == ["d"] and notes == ["no steps here", "no job_event data: c skipped"]


@pytest.fixture
def extra_analyses():
    """Register one analysis of each cadence for a test, as a new module would, and take them away after."""
    added: list[tuple[Registry, str]] = []

    def add(reg: Registry, name: str, run) -> None:  # type: ignore[no-untyped-def]
        reg.register(name, modules=(), reads=(), writes=("finding",), summary="test")(run)
        added.append((reg, name))

    yield add
    for reg, name in added:
        reg._items.pop(name)


def _finding(subject: str, start: dt.datetime) -> pl.DataFrame:
    return F.findings_frame([{"analyzer": "test", "kind": "registered_analysis", "subject": subject, "window_start": start,
                              "window_end": start, "severity": "info", "score": 1.0, "summary": "ran", "evidence": "{}"}])


def test_a_registered_analysis_runs_in_job_analysis_and_the_health_sweep(store, extra_analyses):
    seen: list[str] = []

    def per_job(r: jobs.JobRun) -> None:
        seen.append(r.job_id)
        r.findings(_finding(f"job:{r.job_id}", T0))
        r.record("registered", T0, T0, {"ok": True})

    def per_window(w: health.WindowRun) -> None:
        w.found.append(_finding("fleet", w.start))

    extra_analyses(jobs.JOB, "registered_job", per_job)
    extra_analyses(health.WINDOW, "registered_window", per_window)
    out = jobs.analyze_job(store, "j-1", now=T0)
    assert seen == ["j-1"]
    assert "no step data: C3 and straggler analysis skipped" in out.notes  # the built-in ones skipped, noted
    assert jobs.stored_analysis(store, "j-1", "registered")["result"] == {"ok": True}
    swept = health.health_window(store, T0, T0 + dt.timedelta(minutes=5))
    assert "fleet" in swept["findings"]["subject"].to_list()
    stored = store.read("finding").filter(pl.col("kind") == "registered_analysis")
    assert sorted(stored["subject"].to_list()) == ["fleet", "job:j-1"]
    assert "registered_job" in [r["name"] for r in catalog.analyses()]


def test_the_api_lists_the_registry_to_a_reader(api):
    assert httpx.get(api.url + "/api/v1/fleet/analyzers").status_code == 401
    h = {"Authorization": "Bearer " + auth.create_token(api.app.state.store.engine, "t", ["read"])}
    got = httpx.get(api.url + "/api/v1/fleet/analyzers", headers=h)
    assert got.status_code == 200 and got.json() == json.loads(json.dumps(catalog.analyses()))


def test_the_cli_lists_the_registry(tmp_path):
    env = {"FLEETSCOPE_DATA_DIR": str(tmp_path), "PATH": "/usr/bin:/bin"}
    out = clirun.cli("fleet", "analyzers", "--json", env=env)
    assert out.returncode == 0, out.stderr
    assert [r["name"] for r in json.loads(out.stdout)] == [r["name"] for r in catalog.analyses()]
    text = clirun.cli("fleet", "analyzers", env=env).stdout
    assert text.splitlines()[0].split()[:3] == ["job", "c3", "analyzers.c3"]

"""The Teams & Cost page over the showcase world plus the simulator's Slurm and Kubernetes clusters, ingested
through the ingest door in their real formats (``sacct -P`` text, kube-state-metrics exposition): per-team
GPU-hours and cost, the idle allocation with its cost, queue waits and the preempted job's end state, the top
jobs; figures computed here from the simulated jobs and the stored telemetry."""

from __future__ import annotations

import dataclasses
import datetime as dt
import shutil
from collections.abc import Iterator
from pathlib import Path

import polars as pl
import pytest
import streamlit as st

from fleetscope.core import frames as F
from fleetscope.services import scheduler_capacity as capacity_svc
from fleetscope.services import team_costs as costs_svc
from fleetscope.services import teams as teams_svc
from fleetscope.services import telemetry
from fleetscope.sim import scheduler as sim_sched
from fleetscope.store import Store
from tests.dashboard.conftest import SCHED_GPU_HOUR_PRICE, SCHED_IDLE_NODE, SEED_START, data_dir_of, seed_schedulers
from tests.dashboard.test_pages import healthy, infos, metrics, open_page

IDLE_NODE = SCHED_IDLE_NODE  # the showcase's least busy node: at most 17 % utilisation
IDLE_THRESHOLD = 0.25
GPU_HOUR_PRICE = SCHED_GPU_HOUR_PRICE


@dataclasses.dataclass
class World:
    url: str
    world: sim_sched.SchedulerWorld
    end: dt.datetime  # the page's window end: one microsecond past the newest data


@pytest.fixture(scope="module")
def teams_world(seeded_sqlite_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    root = tmp_path_factory.mktemp("dash-teams")
    shutil.copytree(data_dir_of(seeded_sqlite_url), root / "data")
    url = f"sqlite:///{root / 'data' / 'fleetscope.store.db'}"
    store = Store.open(url)
    world = seed_schedulers(store)
    assert world.idle_job.hosts == (IDLE_NODE,)
    # the health sweep's idle-allocation analysis, with a threshold the showcase's quietest node stays under
    found = capacity_svc.idle_allocation_findings(store, end=world.end, threshold_ratio=IDLE_THRESHOLD, min_idle_s=600)
    store.write(F.Batch(source="test:idle", finding=found))
    end = telemetry.data_end(store) + dt.timedelta(microseconds=1)
    store.engine.dispose()
    yield World(url, world, end)


def _site_of(host: str) -> str:
    return "site-a" if host.startswith(("site-a", "k8s-")) else "site-b"


def test_teams_and_cost_page_shows_each_team_bill(teams_world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    w, end = teams_world.world, teams_world.end
    at = open_page(teams_world.url, "teams_cost", monkeypatch)
    healthy(at)
    # per team: GPUs × the time each job held them up to the window's end, at its first node's site price
    hours: dict[str, float] = {}
    cost: dict[str, float] = {}
    team_of = {(k, m): t for k, m, t in sim_sched.TEAMS}
    for j in w.slurm:
        t = team_of[("slurm_account", j.account)]
        h = j.gpu_hours(end)
        hours[t] = hours.get(t, 0.0) + h
        if j.hosts:
            cost[t] = cost.get(t, 0.0) + h * GPU_HOUR_PRICE[_site_of(j.hosts[0])]
    for p in w.pods:
        t = team_of[("k8s_namespace", p.namespace)]
        hours[t] = hours.get(t, 0.0) + p.gpu_hours(end)
        cost[t] = cost.get(t, 0.0) + p.gpu_hours(end) * GPU_HOUR_PRICE["site-a"]
    table = at.dataframe[0].value.set_index("team")
    assert sorted(table.index) == ["inference", "llm", "research", "vision"]
    for t in hours:
        assert table.loc[t, "gpu_hours"] == pytest.approx(hours[t], rel=1e-9), t
        assert table.loc[t, "cost"] == pytest.approx(cost[t], rel=1e-9), t
    assert table.loc["inference", "jobs"] == 4 and table.loc["vision", "jobs"] == 2 and table.loc["research", "jobs"] == 2
    # the vision team's single-node jobs are tied to their node's GPUs (it holds them all), whose utilisation
    # stays under 17 %: its busy share is measured and low. sacct gives a multi-node job's GPUs as a total
    # only, but the llm team's training jobs hold every GPU of their nodes, so theirs is measured too, and
    # busier; no dcgm-exporter attributes the pods' GPUs, so the Kubernetes teams have none
    assert 0 < table.loc["vision", "busy_share"] < 0.174
    assert table.loc["vision", "busy_share"] < table.loc["llm", "busy_share"] <= 1
    assert all(pd_isna(table.loc[t, "busy_share"]) for t in ("inference", "research"))
    m = metrics(at)
    assert m["Teams"] == "4" and m["GPU-hours allocated"] == f"{sum(hours.values()):,.1f}"
    assert m["Cost"] == f"{sum(cost.values()):,.2f} EUR"
    assert not [t for t in infos(at) if t.startswith("No data yet")]


def pd_isna(v: object) -> bool:
    return v is None or v != v


def test_the_idle_allocation_and_its_cost(teams_world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    store = Store.open(teams_world.url)
    gpus = store.read("gpu").filter(pl.col("host") == IDLE_NODE)["gpu_uuid"].to_list()
    started = teams_world.world.idle_job.start
    s = store.read("gpu_sample", gpu_uuid=gpus, columns=["ts", "gpu_uuid"]).filter(pl.col("ts") >= started)
    store.engine.dispose()
    per_gpu = s.group_by("gpu_uuid").agg(((pl.col("ts").max() - pl.col("ts").min()).dt.total_seconds()).alias("idle_s"))
    idle_h = per_gpu["idle_s"].sum() / 3600
    at = open_page(teams_world.url, "teams_cost", monkeypatch)
    healthy(at)
    idle = next(d.value for d in at.dataframe if "idle_gpu_hours" in d.value.columns)
    assert idle["subject"].tolist() == [f"job:{sim_sched.SLURM_CLUSTER}/{teams_world.world.idle_job.job_id}"]
    assert idle["team"].tolist() == ["vision"] and idle["gpus_idle"].tolist() == [8] and idle["hosts"].tolist() == [IDLE_NODE]
    assert idle["idle_gpu_hours"].tolist() == pytest.approx([round(idle_h, 4)], abs=1e-9)
    assert idle["idle_cost"].tolist() == pytest.approx([round(round(idle_h, 4) * GPU_HOUR_PRICE["site-b"], 2)], abs=1e-9)
    m = metrics(at)
    assert m["Idle GPU-hours"] == f"{round(idle_h, 4):,.2f}" and m["Their cost"].endswith(" EUR")


def test_queue_waits_end_states_and_top_jobs(teams_world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    w = teams_world.world
    at = open_page(teams_world.url, "teams_cost", monkeypatch)
    healthy(at)
    frames = [d.value for d in at.dataframe]
    waits = next(f for f in frames if "median_wait_s" in f.columns).set_index("partition")
    gpu_waits = sorted((j.start - j.submit).total_seconds() for j in w.slurm if j.start)  # eligible = submit in sacct here
    assert waits.loc["gpu", "started"] == len(gpu_waits) and waits.loc["gpu", "pending"] == 1
    assert waits.loc["gpu", "max_wait_s"] == max(gpu_waits) and waits.loc["gpu", "mean_wait_s"] == pytest.approx(sum(gpu_waits) / len(gpu_waits))
    # the pods: from creation to start, in no partition
    pod_waits = [(p.started - p.created).total_seconds() for p in w.pods]
    assert waits.loc["(no partition)", "started"] == len(pod_waits) and waits.loc["(no partition)", "max_wait_s"] == max(pod_waits)
    reasons = next(f for f in frames if "reason" in f.columns and "gpus_requested" in f.columns)
    assert reasons.to_dict("records") == [{"reason": "Resources", "jobs": 1, "gpus_requested": 16}]
    outcomes = next(f for f in frames if "outcome" in f.columns).set_index("state")
    assert outcomes.loc["PREEMPTED", "reliability"] == "planned" and outcomes.loc["PREEMPTED", "jobs"] == 1
    assert outcomes.loc["PREEMPTED", "gpu_hours"] == pytest.approx(w.preempted_job.gpu_hours(teams_world.end))
    top = next(f for f in frames if "job_id" in f.columns and "cost" in f.columns)
    end = teams_world.end
    want = {j.job_id: j.gpu_hours(end) * GPU_HOUR_PRICE[_site_of(j.hosts[0])] for j in w.slurm if j.start}
    want |= {f"{p.namespace}/{p.name}": p.gpu_hours(end) * GPU_HOUR_PRICE["site-a"] for p in w.pods}
    assert dict(zip(top["job_id"], top["cost"])) == pytest.approx(want, rel=1e-9)  # the pending job held nothing
    assert top["cost"].tolist() == pytest.approx(sorted(want.values(), reverse=True), rel=1e-9)


def test_teams_page_is_read_scope(teams_world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    at = open_page(teams_world.url, "teams_cost", monkeypatch, scopes=("read",))
    healthy(at)
    assert metrics(at)["Teams"] == "4"


def test_usage_over_time_adds_up_to_the_period(teams_world: World) -> None:
    """The chart's buckets: each team's GPU-hours per half hour sum to its GPU-hours over the whole range."""
    store = Store.open(teams_world.url)
    end = teams_world.end
    start = end - dt.timedelta(hours=24)
    try:
        over = costs_svc.usage_over_time(store, start=start, end=end, step_s=1800)
        total = costs_svc.usage(store, start=start, end=end)
        with pytest.raises(costs_svc.ValidationError, match="more than 400 buckets"):
            costs_svc.usage_over_time(store, start=start, end=end, step_s=60)
        with pytest.raises(costs_svc.ValidationError, match="end must be after start"):
            costs_svc.usage_over_time(store, start=end, end=start, step_s=1800)
    finally:
        store.engine.dispose()
    summed = dict(over.group_by("team").agg(pl.col("gpu_hours").sum()).iter_rows())
    assert summed == pytest.approx(dict(total.select("team", "gpu_hours").iter_rows()), rel=1e-9)
    # the inference pods started an hour before the showcase: their first bucket is the one holding 11:00:10
    first = over.filter(pl.col("team") == "inference")["bucket_start"].min()
    assert first <= SEED_START - dt.timedelta(seconds=3590) < first + dt.timedelta(seconds=1800)
    vision = over.filter(pl.col("team") == "vision")
    assert vision["gpu_cost"].sum() == pytest.approx(vision["gpu_hours"].sum() * GPU_HOUR_PRICE["site-b"], rel=1e-9)


def test_an_idle_finding_with_unreadable_evidence_still_shows(empty_sqlite_url: str) -> None:
    """Evidence that is not the analyzer's JSON (an older or hand-written finding) leaves its columns empty."""
    store = Store.open(empty_sqlite_url)
    t = SEED_START
    try:
        store.write(F.Batch(source="test", finding=F.findings_frame([
            {"analyzer": "idle_allocations", "kind": "idle_allocation", "subject": "job:x/1", "window_start": t, "window_end": t + dt.timedelta(hours=1),
             "severity": "warning", "score": 1.0, "summary": "job x/1 idle", "evidence": "{not json"},
            {"analyzer": "idle_allocations", "kind": "idle_allocation", "subject": "job:x/2", "window_start": t, "window_end": t + dt.timedelta(hours=1),
             "severity": "warning", "score": 1.0, "summary": "job x/2 idle", "evidence": '["a list"]'},
            {"analyzer": "idle_allocations", "kind": "idle_allocation", "subject": "job:x/3", "window_start": t, "window_end": t + dt.timedelta(hours=1),
             "severity": "warning", "score": 2.0, "summary": "job x/3 idle",
             "evidence": '{"gpus_idle": ["G0", "G1"], "idle_gpu_hours": true, "idle_cost": "12", "team": "a", "hosts": "n1", "currency": 5}'},
            {"analyzer": "idle_allocations", "kind": "idle_allocation", "subject": "job:x/4", "window_start": t, "window_end": t + dt.timedelta(hours=1),
             "severity": "warning", "score": 2.0, "summary": "job x/4 idle", "evidence": '{"gpus_idle": "GPU-0", "hosts": ["n1", 7, "n2"]}'}])))
        idle = capacity_svc.idle_allocations(store, start=t - dt.timedelta(hours=1), end=t + dt.timedelta(hours=2))
    finally:
        store.engine.dispose()
    rows = {r["subject"]: r for r in idle.iter_rows(named=True)}
    assert set(rows) == {"job:x/1", "job:x/2", "job:x/3", "job:x/4"}
    assert rows["job:x/1"]["gpus_idle"] == 0 and rows["job:x/1"]["idle_gpu_hours"] is None and rows["job:x/1"]["summary"] == "job x/1 idle"
    # numbers must be numbers: a boolean or a string is not taken for one
    assert (rows["job:x/3"]["gpus_idle"], rows["job:x/3"]["idle_gpu_hours"], rows["job:x/3"]["idle_cost"], rows["job:x/3"]["team"]) == (2, None, None, "a")
    assert (rows["job:x/3"]["hosts"], rows["job:x/3"]["currency"]) == (None, None)
    assert (rows["job:x/4"]["gpus_idle"], rows["job:x/4"]["hosts"]) == (0, "n1,n2")


def test_budgets_and_stranded_capacity_on_the_page(teams_world: World, monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    """A team over its GPU-hour quota shows as over, with the month-to-date GPU-hours of the usage read; a world
    without a budget or stranded GPUs says so in a caption rather than a gap (on its own copy of the world, so the
    other tests' pages keep no budget)."""
    shutil.copytree(Path(teams_world.url.removeprefix("sqlite:///")).parent, tmp_path / "data")
    url = f"sqlite:///{tmp_path / 'data' / 'fleetscope.store.db'}"
    at = open_page(url, "teams_cost", monkeypatch)
    healthy(at)
    assert not [d for d in at.dataframe if "quota_status" in d.value.columns]
    store = Store.open(url)
    end = teams_world.end
    month = f"{end.year:04d}-{end.month:02d}"
    start = dt.datetime(end.year, end.month, 1, tzinfo=dt.UTC)
    try:
        teams_svc.set_budget(store, team="vision", gpu_hour_quota=1.0, recorded_by="test")
        vision = costs_svc.usage(store, start=start, end=end, now=end).filter(pl.col("team") == "vision")["gpu_hours"].item()
    finally:
        store.engine.dispose()
    assert vision > 1.0
    st.cache_data.clear()  # the page's reads are cached per database for minutes; a user sees the budget after that
    at = open_page(url, "teams_cost", monkeypatch)
    healthy(at)
    table = next(d.value for d in at.dataframe if "quota_status" in d.value.columns).set_index("team")
    assert table.index.tolist() == ["vision"]
    assert table.loc["vision", "quota_status"] == "over" and table.loc["vision", "gpu_hour_quota"] == 1.0
    assert table.loc["vision", "gpu_hours"] == pytest.approx(vision, rel=1e-9)
    assert metrics(at)["Teams over budget or quota"] == "1 of 1"
    assert any(month in c.value for c in at.caption)

"""The simulator's schedulers: its sacct text and kube-state-metrics scrape read back through the real parsers
(detected by content) give the jobs, states and per-team GPU-hours the manifest says."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import polars as pl
import pytest

from analyzers import chargeback
from analyzers import scheduler as sched_analysis
from fleetscope.core.slurm import expand_hostlist
from fleetscope.door import ingestion
from fleetscope.sim import scheduler as S
from fleetscope.sim.simulate import simulate_small
from ingest.format import Options


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory):
    out = tmp_path_factory.mktemp("sim-sched")
    return simulate_small(out), out


def test_the_clusters_read_back_as_the_manifest_says(small) -> None:
    m, out = small
    sched = m.scheduler
    end = dt.datetime.fromisoformat(sched["end"])
    sacct = (out / sched["sacct"]).read_bytes()
    kube = (out / sched["kube_state_metrics"]).read_bytes()
    assert ingestion.resolve(sacct, source="sacct.txt", fmt="auto") == ["slurm_sacct"]
    assert ingestion.resolve(kube, source="ksm.prom", fmt="auto") == ["kube_state_metrics"]
    slurm = ingestion.to_push(sacct, source="sacct.txt", fmt="auto", opts=Options(), now=end).batch
    pods = ingestion.to_push(kube, source="ksm.prom", fmt="auto", opts=Options(ts=end), now=end).batch
    jobs = pl.concat([slurm.sched_job, pods.sched_job], how="diagonal_relaxed")
    # the simulator's training jobs under their own ids, the vision team's two jobs on one free node, one pending
    training = {j["job_id"] for j in m.jobs}
    assert set(slurm.sched_job["job_id"]) == training | {sched["idle"]["job_id"], sched["preempted"]["job_id"], *sched["pending"]}
    by_id = {r["job_id"]: r for r in slurm.sched_job.iter_rows(named=True)}
    assert by_id[sched["preempted"]["job_id"]]["state"] == "PREEMPTED" and by_id[sched["idle"]["job_id"]]["state"] == "RUNNING"
    assert by_id[sched["pending"][0]]["state_reason"] == "Resources"
    idle_host = sched["idle"]["host"]
    assert idle_host not in {h for j in m.jobs for h in j["hosts"]}
    assert [h for j in m.jobs if j["job_id"] in by_id for h in expand_hostlist(by_id[j["job_id"]]["nodes"])] == [h for j in m.jobs for h in j["hosts"]]
    # per team: GPUs × the time held up to the snapshot, from the parsed rows, as the manifest says
    teams = chargeback.assign_teams(jobs, pl.DataFrame([{**t, "cluster": ""} for t in sched["teams"]]))
    alloc = sched_analysis.allocated_gpu_seconds(teams, end - dt.timedelta(days=1), end)
    hours = {t: s / 3600 for t, s in alloc.group_by("team").agg(pl.col("gpu_s").sum()).iter_rows()}
    assert hours == pytest.approx(sched["team_gpu_hours"], abs=1e-6)
    outcomes = sched_analysis.outcome_summary(jobs).filter(pl.col("state") == "PREEMPTED")
    assert outcomes.select("reliability", "jobs").rows() == [("planned", 1)]
    # slurmctld's view: the jobs it still holds, each node's GPUs by device index
    squeue = (out / sched["squeue_json"]).read_bytes()
    assert ingestion.resolve(squeue, source="squeue.json", fmt="auto") == ["slurmrestd"]
    live = ingestion.to_push(squeue, source="squeue.json", fmt="auto", opts=Options(ts=end), now=end).batch
    assert set(live.sched_job["job_id"]) == {j["job_id"] for j in m.jobs} | {sched["idle"]["job_id"], *sched["pending"]}
    nodes = live.sched_job_node
    assert nodes.height == sum(len(j["hosts"]) for j in m.jobs) + 1 and set(nodes["gpu_indices"]) == {"0,1,2,3,4,5,6,7"}
    for r in live.sched_job.filter(pl.col("state") != "PENDING").iter_rows(named=True):
        s = by_id[r["job_id"]]
        assert (r["state"], r["start_at"], r["end_at"], r["gpus"]) == (s["state"], s["start_at"], s["end_at"], s["gpus"])
    # the PyTorchJob's two pods name their controller and are one fleet job of their GPUs together
    assert set(pods.sched_job.filter(pl.col("account") == "research")["controller"]) == {"PyTorchJob/bert-ft"}
    assert pods.job.select("job_id", "world_size", "status", "kind").rows() == [("research/PyTorchJob/bert-ft", 4, "completed", "training")]


def test_same_seed_same_bytes(small, tmp_path: Path) -> None:
    m, out = small
    again = simulate_small(tmp_path)
    for f in (m.scheduler["sacct"], m.scheduler["kube_state_metrics"]):
        assert (tmp_path / f).read_bytes() == (out / f).read_bytes()


@pytest.mark.parametrize("hosts", [["a-r01-n000", "a-r01-n001", "a-r01-n003"], ["gpu7"], ["x", "node09", "node10", "b-001"]])
def test_hostlist_expands_back(hosts: list[str]) -> None:
    assert sorted(expand_hostlist(S.hostlist(hosts))) == sorted(hosts)

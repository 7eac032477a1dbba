"""All-to-all utilisation, straggler attribution and watchdog-fed hangs in the health sweep, through the
store (SQLite and PostgreSQL), the API routes and the CLI, on the real OSC topology."""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess

import httpx
import polars as pl
import pytest

from fleetscope.services import auth
from fleetscope.services import health as health_service
from fleetscope.door import ingestion
from fleetscope.core import frames as F
from fleetscope.store import Store
from ingest.format import Options
from tests import clirun

T = dt.datetime(2026, 12, 1, 12, 0, tzinfo=dt.UTC)
OSC = "fabric/ibnetdiscover-ports_osc_edr.txt"
HOSTS = ["o0001", "o0002", "p0001"]


def a2a_rows(run: str, hosts: str, nranks: int, algbw: float, ts: dt.datetime) -> list[dict]:
    return [{"run_id": run, "op": "alltoall", "size_bytes": size, "in_place": False, "ts": ts, "nranks": nranks,
             "algbw_gbps": algbw * f, "busbw_gbps": algbw * f * (nranks - 1) / nranks, "hosts": hosts}
            for size, f in ((1 << 20, 0.2), (1 << 26, 0.9), (1 << 28, 1.0))]


def load_topology(store: Store, realdata) -> None:
    ingestion.ingest_bytes(store, (realdata / OSC).read_bytes(), source="topo", opts=Options(ts=T))


def test_the_sweep_measures_alltoall_runs_against_the_topology_and_flags_a_low_one(store, realdata):
    load_topology(store, realdata)
    # o0001 and o0002 share leaf ib-i1l1s01; one rank each: the 100 Gb/s HCAs bind, busbw bound 12.5 GB/s
    rows = a2a_rows("good", "o0001,o0002", 2, 22.0, T) + a2a_rows("slow", "o0001,o0002", 2, 8.0, T + dt.timedelta(minutes=1))
    store.write(F.Batch(nccl_test=pl.DataFrame(rows, schema_overrides={"ts": F.UTC_US})))
    util = health_service.alltoall_utilization(store, T + dt.timedelta(minutes=10))
    got = {r["run_id"]: r for r in util.to_dicts()}
    assert got["good"]["utilization_ratio"] == pytest.approx(11.0 / 12.5) and not got["good"]["low"]
    assert got["slow"]["utilization_ratio"] == pytest.approx(4.0 / 12.5) and got["slow"]["low"]
    assert got["slow"]["limit"] == "injection" and got["slow"]["bound_busbw_gbps"] == pytest.approx(12.5)
    health_service.health_window(store, T, T + dt.timedelta(minutes=10))
    f = store.read("finding").filter(pl.col("kind") == "alltoall_low_utilization")
    assert f["subject"].to_list() == ["nccl_test:slow"] and f["window_start"][0] == T + dt.timedelta(minutes=1)
    # a second sweep updates the run's finding, it does not add one
    health_service.health_window(store, T + dt.timedelta(minutes=5), T + dt.timedelta(minutes=15))
    assert store.read("finding").filter(pl.col("kind") == "alltoall_low_utilization").height == 1


def job_on_osc(store: Store, job: str = "jx", per_host: int = 4) -> None:
    ranks = [{"job_id": job, "rank": i * per_host + k, "start": T - dt.timedelta(hours=1), "end": None, "gpu_uuid": f"GPU-{h}-{k}", "host": h}
             for i, h in enumerate(HOSTS) for k in range(per_host)]
    store.write(F.Batch(job_rank=pl.DataFrame(ranks, schema_overrides={"start": F.UTC_US, "end": F.UTC_US})))


def comm_stragglers(store: Store, ranks: list[int], job: str = "jx") -> None:
    rows = [{"analyzer": "stragglers", "kind": "straggler_communication_slow", "subject": f"job:{job}/rank:{r}",
             "window_start": T - dt.timedelta(minutes=20), "window_end": T + dt.timedelta(minutes=2), "severity": "warning", "score": 0.7,
             "summary": "slow communication", "evidence": "{}"} for r in ranks]
    store.write(F.Batch(finding=F.findings_frame(rows)))


def flapping_port(store: Store, host: str, device: str) -> None:
    rows = [{"ts": T + dt.timedelta(minutes=m), "node": host, "device": device, "port": 1, "host": host, "state": "ACTIVE",
             "rate_gbps": 100.0, "link_downed_total": downs, "xmit_bytes_total": 10**9 * (m + 1)} for m, downs in ((0, 0), (5, 3))]
    store.write(F.Batch(fabric_port_sample=pl.DataFrame(rows, schema_overrides={"ts": F.UTC_US})))


def test_the_sweep_attributes_a_jobs_comm_stragglers_to_the_flapping_port_they_share(store, realdata):
    load_topology(store, realdata)
    job_on_osc(store)
    comm_stragglers(store, [0, 1, 2, 3])  # every rank on o0001
    flapping_port(store, "o0001", "HCA-1")
    out = health_service.health_window(store, T, T + dt.timedelta(minutes=10))
    f = out["findings"].filter(pl.col("kind") == "comm_straggler_fabric").row(0, named=True)
    assert f["subject"] == "job:jx/ib:o0001/HCA-1" and f["severity"] == "critical"
    ev = json.loads(f["evidence"])
    assert ev["slow_ranks"] == [0, 1, 2, 3] and ev["ranks"] == 4 and ev["unhealthy"] == ["host:o0001/ib:HCA-1:1"]
    assert ev["slow_from"] == ["straggler_communication_slow"]
    assert store.read("finding").filter(pl.col("kind") == "comm_straggler_fabric").height == 1


def test_stragglers_on_two_hosts_of_one_leaf_point_at_the_leaf(store, realdata):
    load_topology(store, realdata)
    job_on_osc(store)
    comm_stragglers(store, list(range(8)))  # o0001 and o0002, both under ib-i1l1s01; p0001 is elsewhere
    out = health_service.straggler_attribution(store, T, T + dt.timedelta(minutes=10))
    (f,) = out["findings"].to_dicts()
    assert f["subject"] == "job:jx/ib:0x7cfe9003009ce5b0" and f["severity"] == "warning" and "leaf switch" in f["summary"]
    leaf = out["attribution"].filter(pl.col("best")).row(0, named=True)
    assert (leaf["level"], leaf["slow"], leaf["ranks"], leaf["coverage_ratio"]) == ("leaf", 8, 8, 1.0)
    # another job: nothing to attribute
    assert health_service.straggler_attribution(store, T, T + dt.timedelta(minutes=10), job_id="other")["findings"].height == 0


def test_a_watchdog_timeout_in_a_jobs_log_is_in_its_hang_and_reports_it_sooner(store):
    steps = [{"job_id": "train-9", "rank": 0, "step": s, "start": T + dt.timedelta(seconds=10 * s), "end": T + dt.timedelta(seconds=10 * s + 9)}
             for s in range(60)]
    ranks = [{"job_id": "train-9", "rank": 0, "start": T - dt.timedelta(minutes=5), "end": None, "gpu_uuid": "GPU-a", "host": "node7"}]
    store.write(F.Batch(step=pl.DataFrame(steps, schema_overrides={"start": F.UTC_US, "end": F.UTC_US}),
                        job_rank=pl.DataFrame(ranks, schema_overrides={"start": F.UTC_US, "end": F.UTC_US})))
    last = T + dt.timedelta(seconds=599)
    # the watchdog's line, with no job id in the log: it is tied to the job through its host
    log = (b"2026-12-01T12:00:00Z node7:1234:1234 [0] NCCL INFO comm 0x55 rank 0 nranks 8 cudaDev 0 busId 1a000 commId 0xabc - Init COMPLETE\n"
           b"2026-12-01T12:12:00Z [rank0]:[E1201 12:12:00 ProcessGroupNCCL.cpp:616] [Rank 0] Watchdog caught collective operation timeout: "
           b"WorkNCCL(SeqNum=77, OpType=ALLREDUCE, Timeout(ms)=60000) ran for 60012 milliseconds before timing out.\n")
    ingestion.ingest_bytes(store, log, source="train.log", fmt="nccl_log")
    # 2 min after the last step: under the 5-minute floor, but the watchdog has spoken
    now = T + dt.timedelta(minutes=12, seconds=30)
    out = health_service.health_window(store, now - dt.timedelta(minutes=5), now)
    hang = out["findings"].filter(pl.col("kind") == "job_hang").row(0, named=True)
    assert hang["subject"] == "job:train-9" and hang["window_start"] == last
    ev = json.loads(hang["evidence"])
    assert ev["detected_by"] == "watchdog" and ev["watchdog_timeouts"] == 1 and ev["watchdog"][0]["host"] == "node7"
    assert "job unknown: rank 0 ALLREDUCE SeqNum=77" in ev["watchdog"][0]["message"]


def test_without_a_watchdog_the_hang_waits_for_the_floor(store):
    steps = [{"job_id": "j", "rank": 0, "step": s, "start": T + dt.timedelta(seconds=10 * s), "end": T + dt.timedelta(seconds=10 * s + 9)}
             for s in range(60)]
    store.write(F.Batch(step=pl.DataFrame(steps, schema_overrides={"start": F.UTC_US, "end": F.UTC_US})))
    now = T + dt.timedelta(minutes=12, seconds=30)
    assert health_service.health_window(store, now - dt.timedelta(minutes=5), now)["findings"].filter(pl.col("kind") == "job_hang").height == 0
    later = T + dt.timedelta(minutes=15)
    assert health_service.health_window(store, later - dt.timedelta(minutes=5), later)["findings"].filter(pl.col("kind") == "job_hang").height == 1


def test_api_alltoall_and_attribution_need_read_and_refuse_bad_windows(api, realdata):
    store = api.app.state.store
    load_topology(store, realdata)
    store.write(F.Batch(nccl_test=pl.DataFrame(a2a_rows("slow", "o0001,o0002", 2, 8.0, T), schema_overrides={"ts": F.UTC_US})))
    job_on_osc(store)
    comm_stragglers(store, [0, 1, 2, 3])
    read = {"Authorization": "Bearer " + auth.create_token(store.engine, "r", ["read"])}
    end = (T + dt.timedelta(minutes=10)).isoformat()
    assert httpx.get(api.url + "/api/v1/fabric/alltoall", params={"end": end}).status_code == 401
    r = httpx.get(api.url + "/api/v1/fabric/alltoall", params={"end": end, "low_only": "true"}, headers=read)
    assert r.status_code == 200, r.text
    (run,) = r.json()["runs"]
    assert run["run_id"] == "slow" and run["utilization_ratio"] == pytest.approx(0.32) and run["low"] is True
    r = httpx.get(api.url + "/api/v1/fabric/attribution", params={"end": end, "job_id": "jx"}, headers=read)
    assert r.status_code == 200, r.text
    body = r.json()
    assert [f["subject"] for f in body["findings"]] == ["job:jx/ib:o0001/HCA-1"] and len(body["slow_ranks"]) == 4
    for path, params in (("alltoall", {"end": "2026-12-01T12:00:00"}), ("attribution", {"start": end, "end": T.isoformat()}),
                         ("attribution", {"start": "2026-11-01T00:00:00Z", "end": end}), ("attribution", {"job_id": "x" * 300})):
        bad = httpx.get(api.url + f"/api/v1/fabric/{path}", params=params, headers=read)
        assert bad.status_code in (400, 422), (path, params, bad.text)


def test_cli_topology_alltoall_and_attribution(tmp_path, realdata):
    env = {**os.environ, "FLEETSCOPE_DATA_DIR": str(tmp_path)}
    env.pop("FLEETSCOPE_DATABASE_URL", None)

    def cli(*args: str) -> subprocess.CompletedProcess:
        return clirun.cli(*args, env=env)

    (tmp_path / "topo.txt").write_bytes((realdata / OSC).read_bytes())
    assert cli("ingest", str(tmp_path / "topo.txt"), "--ts", T.isoformat()).returncode == 0
    store = Store.open(f"sqlite:///{tmp_path / 'fleetscope.store.db'}")
    store.write(F.Batch(nccl_test=pl.DataFrame(a2a_rows("slow", "o0001,o0002", 2, 8.0, T), schema_overrides={"ts": F.UTC_US})))
    job_on_osc(store)
    comm_stragglers(store, [0, 1, 2, 3])
    end = (T + dt.timedelta(minutes=10)).isoformat()
    out = cli("topology", "alltoall", "--end", end, "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["runs"][0]["utilization_ratio"] == pytest.approx(0.32)
    assert "32% of 12.5 GB/s (injection)  LOW" in cli("topology", "alltoall", "--end", end).stdout
    out = cli("topology", "attribution", "--job", "jx", "--end", end)
    assert out.returncode == 0, out.stderr
    assert "job:jx/ib:o0001/HCA-1" in out.stdout and "4 slow rank(s) in 1 job(s)" in out.stdout
    assert cli("topology", "attribution", "--end", "noon").returncode != 0

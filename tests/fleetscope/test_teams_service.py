"""Teams and cost through the store: the real Hábrók sacct text, a mapping set through the service (audit
logged), GPU telemetry on one job's GPU, prices from the price book; figures checked by hand."""

import datetime as dt
import json

import polars as pl
import pytest

from fleetscope.core import frames as F
from fleetscope.core.errors import ValidationError
from analyzers import job_usage as usage_analysis
from fleetscope.services import job_usage, scheduler_capacity, serving, team_costs, teams
from ingest import slurm_sacct
from tests import clirun

APRIL = (dt.datetime(2024, 4, 1, tzinfo=dt.UTC), dt.datetime(2024, 5, 1, tzinfo=dt.UTC))
JOB_START = dt.datetime(2024, 4, 5, 0, 18, 37, tzinfo=dt.UTC)  # job 7946767 on v100gpu13, 1 GPU, 41003 s
JOB_END = dt.datetime(2024, 4, 5, 11, 42, 0, tzinfo=dt.UTC)


@pytest.fixture()
def loaded(store, realdata):
    store.write(slurm_sacct.parse((realdata / "scheduler/slurm_sacct-parsable-snowman-delim_habrok_gres-gpu.txt").read_bytes(), source="sacct"))
    store.write(F.Batch(site=F.conform(F.SITE, pl.DataFrame([{"site_id": "grn", "name": "Groningen", "country": "NLD"}])),
                        host=F.conform(F.HOST, pl.DataFrame([{"host": "v100gpu13", "site_id": "grn"}])),
                        gpu=F.conform(F.GPU, pl.DataFrame([{"gpu_uuid": "GPU-v100-13", "host": "v100gpu13", "gpu_index": 0, "model_name": "V100"}]))))
    ts = pl.datetime_range(JOB_START - dt.timedelta(minutes=30), JOB_END + dt.timedelta(minutes=30), "1m", eager=True, time_zone="UTC")
    inside = (ts >= JOB_START) & (ts < JOB_END)
    samples = pl.DataFrame({"ts": ts, "gpu_uuid": "GPU-v100-13",
                            "util_ratio": pl.Series(inside).cast(pl.Float64) * 0.5, "power_w": pl.Series(inside).cast(pl.Float64) * 150 + 50})
    store.write(F.Batch(gpu_sample=F.conform(F.GPU_SAMPLE, samples)))
    serving.record_price(store, {"site_id": "grn", "gpu_model": "", "valid_from": dt.datetime(2024, 1, 1, tzinfo=dt.UTC), "currency": "EUR",
                                 "gpu_hour_price": 2.0, "energy_price_per_kwh": 0.25}, recorded_by="finance")
    return store


def test_mapping_is_recorded_and_audited(loaded):
    out = teams.set_mapping(loaded, kind="slurm_user", match="user420", team="vision", recorded_by="alice", now=dt.datetime(2026, 11, 1, tzinfo=dt.UTC))
    assert out["team"] == "vision" and out["recorded_by"] == "alice"
    assert teams.mappings(loaded).select("kind", "match", "team").rows() == [("slurm_user", "user420", "vision")]
    log = loaded.read("audit_log").sort("seq").filter(pl.col("action") == "team_mapping")
    assert log.select("actor", "subject").rows() == [("alice", "slurm_user:user420")]
    for bad in ({"kind": "unix_group", "match": "x", "team": "t"}, {"kind": "k8s_label", "match": "nolabel", "team": "t"},
                {"kind": "slurm_account", "match": "", "team": "t"}, {"kind": "slurm_account", "match": "a\x00", "team": "t"},
                {"kind": "slurm_account", "match": "a", "team": "x" * 201}):
        with pytest.raises(ValidationError):
            teams.set_mapping(loaded, recorded_by="alice", **bad)


def test_team_usage_busy_energy_cost(loaded):
    teams.set_mapping(loaded, kind="slurm_user", match="user420", team="vision", recorded_by="alice")
    costs = team_costs.job_costs(loaded, start=APRIL[0], end=APRIL[1], now=APRIL[1])
    j = costs.filter(pl.col("job_id") == "7946767").row(0, named=True)
    assert j["team"] == "vision" and j["gpu_hours"] == pytest.approx(41003 / 3600)
    assert j["used_gpu_hours"] == pytest.approx(41003 / 3600 * 0.5)
    assert j["energy_kwh"] == pytest.approx(200 * 41003 / 3.6e6)  # 200 W while held
    assert j["cost"] == pytest.approx(41003 / 3600 * 2.0 + 200 * 41003 / 3.6e6 * 0.25) and j["currency"] == "EUR"
    u = {r["team"]: r for r in team_costs.usage(loaded, start=APRIL[0], end=APRIL[1], now=APRIL[1]).to_dicts()}
    # by hand from the sacct rows: GPU jobs of April 2024 clipped to the month
    raw = costs.filter(pl.col("team") == "vision")
    assert u["vision"]["gpu_hours"] == pytest.approx(raw["gpu_hours"].sum()) and u["vision"]["busy_share"] == pytest.approx(0.5)
    assert "unassigned" in u and u["unassigned"]["used_gpu_hours"] is None


def _nld_g_per_kwh(realdata=None):
    """The Netherlands' annual grid intensity, read from the shipped table (not from the code under test)."""
    import csv

    from analyzers.carbon import GRID_TABLE_PATH

    return next(float(r["g_per_kwh"]) for r in csv.DictReader(GRID_TABLE_PATH.open()) if r["country"] == "NLD" and not r["region"])


def test_team_co2e_location_and_market(loaded):
    from fleetscope.services import energy
    from fleetscope.services import energy_rollup

    teams.set_mapping(loaded, kind="slurm_user", match="user420", team="vision", recorded_by="alice")
    g, kwh = _nld_g_per_kwh(), 200 * 41003 / 3.6e6
    # no roll-up energy yet: the site's annual grid average for both, and the basis says so
    rep = team_costs.usage_report(loaded, start=APRIL[0], end=APRIL[1], now=APRIL[1])
    v = rep["teams"].filter(pl.col("team") == "vision").row(0, named=True)
    assert v["location_kgco2e"] == pytest.approx(kwh * g / 1000) and v["market_kgco2e"] == pytest.approx(kwh * g / 1000)
    assert "annual grid average 2023" in rep["carbon"]["carbon_basis"][0]
    # roll the site's energy up and hold a 1 kWh zero-carbon instrument over April: market drops by that kWh's share
    energy_rollup.rollup_window(loaded, JOB_START - dt.timedelta(minutes=30), JOB_END + dt.timedelta(minutes=30))
    site_kwh = float(loaded.read("site_energy_minute")["energy_j"].sum()) / 3.6e6
    assert site_kwh > 1
    energy.record_instrument(loaded, {"instrument_id": "ppa-1", "site_id": "grn", "kind": "ppa", "start": APRIL[0], "end": APRIL[1],
                                      "volume_mwh": 0.001, "g_per_kwh": 0.0}, recorded_by="finance")
    rep = team_costs.usage_report(loaded, start=APRIL[0], end=APRIL[1], now=APRIL[1])
    v = rep["teams"].filter(pl.col("team") == "vision").row(0, named=True)
    assert v["location_kgco2e"] == pytest.approx(kwh * g / 1000)
    assert v["market_kgco2e"] == pytest.approx(kwh * g / 1000 * (site_kwh - 1) / site_kwh)
    assert "ppa-1" not in rep["carbon"]["carbon_basis"][0] and "Scope 2" in rep["carbon"]["carbon_basis"][0]
    un = rep["teams"].filter(pl.col("team") == "unassigned").row(0, named=True)
    assert un["location_kgco2e"] == 0.0  # no telemetry reached its jobs: no energy, so no CO2e to charge


def test_budgets_recorded_audited_and_found(loaded):
    teams.set_mapping(loaded, kind="slurm_user", match="user420", team="vision", recorded_by="alice")
    out = teams.set_budget(loaded, team="vision", month="2024-04", gpu_hour_quota=5.0, budget=100.0, currency="EUR", recorded_by="finance",
                           now=dt.datetime(2024, 4, 2, tzinfo=dt.UTC))
    assert (out["recorded_by"], out["month"], out["gpu_hour_quota"]) == ("finance", "2024-04", 5.0)
    log = loaded.read("audit_log").filter(pl.col("action") == "team_budget")
    assert log.select("actor", "subject").rows() == [("finance", "team:vision")]
    for bad in ({"team": "", "gpu_hour_quota": 1.0}, {"team": "v", "month": "2024-4", "gpu_hour_quota": 1.0}, {"team": "v"},
                {"team": "v", "budget": 10.0}, {"team": "v", "budget": 10.0, "currency": "eur"}, {"team": "v", "gpu_hour_quota": -1.0},
                {"team": "v", "gpu_hour_quota": float("nan")}, {"team": "v", "gpu_hour_quota": 1.0, "currency": "EUR"}, {"team": "v\n", "gpu_hour_quota": 1.0}):
        with pytest.raises(ValidationError):
            teams.set_budget(loaded, recorded_by="finance", **bad)
    assert teams.budgets(loaded).height == 1  # a refused budget changes nothing
    # the job alone (41,003 s on 1 GPU: 11.39 GPU-h) is over the 5 GPU-h quota; 29 of April's 30 days have passed
    now = dt.datetime(2024, 4, 30, tzinfo=dt.UTC)
    st = team_costs.budget_status(loaded, month="2024-04", now=now).row(0, named=True)
    used = team_costs.usage(loaded, start=APRIL[0], end=APRIL[1], now=now).filter(pl.col("team") == "vision").row(0, named=True)
    assert st["gpu_hours"] == pytest.approx(used["gpu_hours"]) and st["gpu_hours"] >= 41003 / 3600 and st["quota_status"] == "over"
    assert st["projected_gpu_hours"] == pytest.approx(used["gpu_hours"] * 30 / 29)
    f = team_costs.budget_findings(loaded, now=now)
    assert f.select("kind", "subject", "severity").rows() == [("team_budget", "team_budget:vision", "critical")]
    # the health sweep runs it where a budget is set
    from fleetscope.services import health

    assert "team_budgets" in health.WINDOW.names()
    swept = health.health_window(loaded, now - dt.timedelta(minutes=15), now)["findings"]
    assert swept.filter(pl.col("kind") == "team_budget")["subject"].to_list() == ["team_budget:vision"]


def test_sweep_budget_check_reuses_month_to_date_usage(loaded, monkeypatch):
    """The health sweep's budget check recomputes the month's usage only when the hour turns or scheduler,
    team or price data was written (and USAGE_REFRESH passed); budgets are read each time."""
    from fleetscope.core import scheduler_frames as SCH
    from fleetscope.core.spec import conform

    calls = []
    real = team_costs.usage
    monkeypatch.setattr(team_costs, "usage", lambda store, **kw: calls.append(kw["now"]) or real(store, **kw))
    teams.set_mapping(loaded, kind="slurm_user", match="user420", team="vision", recorded_by="alice")
    teams.set_budget(loaded, team="vision", month="2024-04", gpu_hour_quota=20.0, recorded_by="finance")
    t0 = dt.datetime(2024, 4, 30, tzinfo=dt.UTC)
    job_h = 41003 / 3600  # the job alone: 11.39 GPU-h, projected 11.78 for April, under 20
    assert team_costs.budget_findings(loaded, now=t0).height == 0 and len(calls) == 1
    assert team_costs.budget_findings(loaded, now=t0 + dt.timedelta(minutes=5)).height == 0 and len(calls) == 1  # nothing written
    # a lowered quota pages at the next sweep, from the same usage
    teams.set_budget(loaded, team="vision", month="2024-04", gpu_hour_quota=5.0, recorded_by="finance")
    f = team_costs.budget_findings(loaded, now=t0 + dt.timedelta(minutes=10))
    assert f.select("subject", "severity").rows() == [("team_budget:vision", "critical")] and len(calls) == 1
    assert f["window_end"][0] == t0 + dt.timedelta(minutes=10)  # the finding is fresh, so the alert's lookback holds it
    # a new job of the team: counted once USAGE_REFRESH has passed since the last computation
    job = {"cluster": "", "job_id": "new-1", "scheduler": "slurm", "user": "user420", "state": "COMPLETED", "gpus": 4,
           "start_at": dt.datetime(2024, 4, 29, 12, tzinfo=dt.UTC), "end_at": dt.datetime(2024, 4, 29, 14, tzinfo=dt.UTC)}
    loaded.write_frames([(SCH.SCHED_JOB, conform(SCH.SCHED_JOB, pl.DataFrame([job])))], source="sacct")
    team_costs.budget_findings(loaded, now=t0 + dt.timedelta(minutes=12))
    assert len(calls) == 1
    f = team_costs.budget_findings(loaded, now=t0 + dt.timedelta(minutes=16))
    assert len(calls) == 2 and f.height == 1
    ev = json.loads(f["evidence"][0])
    assert ev["gpu_hours"] == pytest.approx(job_h + 8.0)  # the new job's 4 GPUs x 2 h
    team_costs.budget_findings(loaded, now=t0 + dt.timedelta(minutes=50))
    assert len(calls) == 2  # nothing written since
    team_costs.budget_findings(loaded, now=t0 + dt.timedelta(hours=1, minutes=1))
    assert calls[-1] == t0 + dt.timedelta(hours=1, minutes=1) and len(calls) == 3  # the hour turned
    # the service's own status is always fresh
    team_costs.budget_status(loaded, month="2024-04", now=t0 + dt.timedelta(hours=1, minutes=2))
    assert len(calls) == 4


def test_multi_node_sacct_job_holds_every_gpu_of_its_nodes(store):
    """sacct gives a multi-node job's GPUs as one total: where it is every GPU of its nodes, the job holds them
    all; where it is fewer, which ones is unknown and none are matched."""
    from fleetscope.core import scheduler_frames as SCH
    from fleetscope.core.spec import conform

    gpus = [{"gpu_uuid": f"GPU-{h}-{i}", "host": h, "gpu_index": i} for h in ("n1", "n2", "n3") for i in range(2)]
    store.write(F.Batch(gpu=F.conform(F.GPU, pl.DataFrame(gpus))))
    # n3 has 4 GPUs by the scheduler's count, though telemetry sees only 2 of them
    store.write_frames([(SCH.SCHED_NODE, conform(SCH.SCHED_NODE, pl.DataFrame([{"host": "n1", "gpus_total": 2}, {"host": "n3", "gpus_total": 4}])))],
                       source="sinfo")
    t = dt.datetime(2026, 11, 2, tzinfo=dt.UTC)
    jobs = pl.DataFrame([{"job_id": j, "scheduler": "slurm", "state": "RUNNING", "gpus": g, "start_at": t} for j, g in
                         (("all", 4), ("part", 2), ("big", 6), ("small", 4))])
    nodes = [{"job_id": j, "host": h} for j, hs in (("all", ("n1", "n2")), ("part", ("n1", "n2")), ("big", ("n2", "n3")), ("small", ("n2", "n3")))
             for h in hs]
    store.write_frames([(SCH.SCHED_JOB, conform(SCH.SCHED_JOB, jobs)), (SCH.SCHED_JOB_NODE, conform(SCH.SCHED_JOB_NODE, pl.DataFrame(nodes)))],
                       source="sacct")
    got = job_usage.job_gpus(store, job_usage.jobs_in(store, t, t + dt.timedelta(hours=1)))
    held = {j: sorted(g["gpu_uuid"]) for (j,), g in got.group_by("job_id")}
    # all: n1 (2 by sinfo) + n2 (2 seen) = 4; big: n2 (2) + n3 (4 by sinfo) = 6, the 2 of n3 telemetry sees; part, small: fewer than their nodes have
    assert held == {"all": ["GPU-n1-0", "GPU-n1-1", "GPU-n2-0", "GPU-n2-1"], "big": ["GPU-n2-0", "GPU-n2-1", "GPU-n3-0", "GPU-n3-1"]}


def test_stranded_capacity_in_the_service(store, realdata):
    from fleetscope.core import scheduler_frames as SCH
    from fleetscope.services import health
    from ingest import slurmrestd

    store.write(slurmrestd.parse((realdata / "scheduler/slurmrestd_v0.0.41_24.05.6_nodes_981x8gpu-fleet.json").read_bytes(), source="nodes"))
    hosts = store.read("sched_node")["host"].to_list()
    store.write(F.Batch(site=F.conform(F.SITE, pl.DataFrame([{"site_id": "mbz"}])),
                        host=F.conform(F.HOST, pl.DataFrame({"host": hosts, "site_id": ["mbz"] * len(hosts)}))))
    serving.record_price(store, {"site_id": "mbz", "gpu_model": "", "valid_from": dt.datetime(2024, 1, 1, tzinfo=dt.UTC), "currency": "USD",
                                 "gpu_hour_price": 2.5}, recorded_by="finance")
    now = dt.datetime(2026, 12, 5, tzinfo=dt.UTC)
    assert scheduler_capacity.stranded_capacity(store, now=now)["stranded_gpus"] == 0  # no queue: idle, not stranded
    seen = store.read("sched_node")["observed_at"].max()
    store.write(F.Batch(sched_job=SCH.frame(SCH.SCHED_JOB, [{"cluster": "", "job_id": "0", "state": "PENDING", "partition": "main", "gpus": 8,
                                                              "observed_at": seen - dt.timedelta(days=2)}])))
    assert scheduler_capacity.stranded_capacity(store, now=now)["stranded_gpus"] == 0  # a queue seen two days before the nodes is not compared with them
    store.write(F.Batch(sched_job=SCH.frame(SCH.SCHED_JOB, [{"cluster": "", "job_id": "1", "state": "PENDING", "partition": "main,lowprio",
                                                              "gpus": 8, "cpus": 16, "node_count": 1}])))
    out = scheduler_capacity.stranded_capacity(store, now=now)
    # 49 free GPUs on 8 nodes fit no 8-GPU job (tests/analyzers/test_stranded.py counts them from the JSON); a node once for the fleet
    assert (out["stranded_gpus"], out["cost_per_hour"], out["currency"]) == (49, 49 * 2.5, "USD")
    assert out["partitions"]["stranded_gpus"].to_list() == [49, 49]
    swept = health.health_window(store, now - dt.timedelta(minutes=15), now)["findings"]
    assert sorted(swept.filter(pl.col("kind") == "stranded_capacity")["subject"].to_list()) == ["partition:lowprio", "partition:main"]


def test_queue_and_month(loaded):
    q = scheduler_capacity.queue(loaded, start=dt.datetime(2023, 1, 1, tzinfo=dt.UTC), end=dt.datetime(2025, 1, 1, tzinfo=dt.UTC))
    assert sum(r["jobs"] for r in q["outcomes"]) == 90
    assert teams.month_bounds("2026-11") == (dt.datetime(2026, 11, 1, tzinfo=dt.UTC), dt.datetime(2026, 12, 1, tzinfo=dt.UTC))
    with pytest.raises(ValidationError):
        teams.month_bounds("Nov")


def test_api_routes(api, realdata):
    import httpx

    from fleetscope.services import auth

    store = api.app.state.store
    store.write(slurm_sacct.parse((realdata / "scheduler/slurm_sacct-parsable-snowman-delim_habrok_gres-gpu.txt").read_bytes(), source="sacct"))
    admin = {"Authorization": "Bearer " + auth.create_token(store.engine, "finance", ["admin"])}
    read = {"Authorization": "Bearer " + auth.create_token(store.engine, "r", ["read"])}
    body = {"kind": "slurm_user", "match": "user420", "team": "vision"}
    assert httpx.put(api.url + "/api/v1/teams/mappings", json=body, headers=read, timeout=30).status_code == 403
    r = httpx.put(api.url + "/api/v1/teams/mappings", json=body, headers=admin, timeout=30)
    assert r.status_code == 200 and r.json()["recorded_by"] == "finance"
    for bad in ({**body, "kind": "unix_group"}, {**body, "team": ""}, {**body, "extra": 1}, {**body, "match": "x" * 201},
                {"kind": "k8s_label", "match": "nolabel", "team": "t"}):
        assert httpx.put(api.url + "/api/v1/teams/mappings", json=bad, headers=admin, timeout=30).status_code == 422, bad
    assert [m["team"] for m in httpx.get(api.url + "/api/v1/teams/mappings", headers=read, timeout=30).json()] == ["vision"]
    u = httpx.get(api.url + "/api/v1/teams/usage", params={"month": "2024-04"}, headers=read, timeout=60).json()
    teams_ = {t["team"]: t for t in u["teams"]}
    assert u["start"].startswith("2024-04-01") and teams_["vision"]["gpu_hours"] > 41003 / 3600 - 1e-9
    assert "location_kgco2e" in teams_["vision"] and "market_kgco2e" in teams_["vision"] and u["carbon"] == []
    j = httpx.get(api.url + "/api/v1/teams/jobs", params={"month": "2024-04", "limit": 3}, headers=read, timeout=60).json()
    assert len(j) <= 3 and all("gpu_hours" in x for x in j)
    q = httpx.get(api.url + "/api/v1/teams/queue", params={"start": "2023-05-01T00:00:00Z", "end": "2024-05-01T00:00:00Z"}, headers=read, timeout=60).json()
    assert sum(o["jobs"] for o in q["outcomes"]) == 90
    b = {"team": "vision", "month": "2024-04", "gpu_hour_quota": 5.0}
    assert httpx.put(api.url + "/api/v1/teams/budgets", json=b, headers=read, timeout=30).status_code == 403
    r = httpx.put(api.url + "/api/v1/teams/budgets", json=b, headers=admin, timeout=30)
    assert r.status_code == 200 and r.json()["recorded_by"] == "finance"
    for bad in ({**b, "gpu_hour_quota": -1}, {**b, "month": "April"}, {**b, "extra": 1}, {**b, "budget": 5.0}, {**b, "budget": 5, "currency": "euro"},
                {**b, "team": "x" * 201}, {"team": "vision"}, {**b, "gpu_hour_quota": 1e300}):
        assert httpx.put(api.url + "/api/v1/teams/budgets", json=bad, headers=admin, timeout=30).status_code in (400, 422), bad
    assert [x["gpu_hour_quota"] for x in httpx.get(api.url + "/api/v1/teams/budgets", headers=read, timeout=30).json()] == [5.0]
    st = httpx.get(api.url + "/api/v1/teams/budgets/status", params={"month": "2024-04"}, headers=read, timeout=60).json()
    assert st["month"] == "2024-04" and st["teams"][0]["team"] == "vision" and st["teams"][0]["quota_status"] == "over"
    for month in ("2024-13", "24-04", "2024-04; drop"):
        assert httpx.get(api.url + "/api/v1/teams/budgets/status", params={"month": month}, headers=read, timeout=30).status_code in (400, 422), month
    s = httpx.get(api.url + "/api/v1/teams/stranded", headers=read, timeout=60).json()
    assert s["stranded_gpus"] == 0 and s["partitions"] == []  # no node records in this store
    for params in ({"month": "2024-4"}, {"month": "'; drop"}, {"start": "2024-01-01T00:00:00"}, {"start": "2020-01-01T00:00:00Z", "end": "2024-01-01T00:00:00Z"},
                   {"month": "2024-13"}):
        assert httpx.get(api.url + "/api/v1/teams/usage", params=params, headers=read, timeout=30).status_code in (400, 422), params


def test_cli(tmp_path, realdata):
    import json
    import os

    env = {**os.environ, "FLEETSCOPE_DATA_DIR": str(tmp_path)}
    env.pop("FLEETSCOPE_DATABASE_URL", None)

    def run(*args):
        return clirun.cli(*args, env=env)

    assert run("ingest", str(realdata / "scheduler/slurm_sacct-parsable-snowman-delim_habrok_gres-gpu.txt")).returncode == 0
    h = run("teams", "--help")
    assert "fleetscope teams usage --month 2026-11" in h.stdout
    m = run("teams", "map", "slurm_user", "user420", "--team", "vision", "--by", "alice", "--json")
    assert m.returncode == 0, m.stderr
    assert json.loads(m.stdout)["recorded_by"] == "alice"
    u = run("teams", "usage", "--month", "2024-04", "--json")
    got = {t["team"]: t for t in json.loads(u.stdout)["teams"]}
    assert got["vision"]["jobs"] >= 1
    assert "vision" in run("teams", "usage", "--month", "2024-04").stdout
    assert "kgCO2e loc" in run("teams", "usage", "--month", "2024-04").stdout
    assert run("teams", "usage", "--month", "April").returncode != 0
    b = run("teams", "budget", "vision", "--month", "2024-04", "--gpu-hours", "5", "--budget", "100", "--currency", "EUR", "--by", "finance")
    assert b.returncode == 0 and "recorded by finance" in b.stdout, b.stderr
    assert run("teams", "budget", "vision", "--budget", "100").returncode != 0  # no currency
    st = json.loads(run("teams", "budgets", "--month", "2024-04", "--json").stdout)
    assert st[0]["team"] == "vision" and st[0]["quota_status"] == "over"
    assert "vision" in run("teams", "budgets", "--month", "2024-04").stdout
    st = run("teams", "stranded")
    assert st.returncode == 0 and "nothing stranded" in st.stdout
    q = run("teams", "queue", "--start", "2023-01-01T00:00:00Z", "--end", "2025-01-01T00:00:00Z")
    assert q.returncode == 0 and "NODE_FAIL" in q.stdout
    r = run("teams", "report", "--month", "2024-04", "--out", str(tmp_path / "rep"), "--json")
    assert r.returncode == 0, r.stderr
    files = json.loads(r.stdout)["files"]
    assert files["csv"].endswith("showback-2024-04.csv") and "vision" in (tmp_path / "rep/showback-2024-04.csv").read_text()
    assert run("teams", "report", "--month", "24-4").returncode != 0


def test_showback_report_csv_pdf_and_beat(loaded, tmp_path):
    import csv
    import io

    from fleetscope.worker.app import make_celery

    entry = make_celery().conf.beat_schedule["teams-showback"]
    assert entry["task"] == "fleetscope.teams_showback"
    teams.set_mapping(loaded, kind="slurm_user", match="user420", team="vision", recorded_by="alice")
    out = team_costs.write_showback(loaded, "2024-04", tmp_path / "reports", now=dt.datetime(2026, 12, 1, tzinfo=dt.UTC))
    rows = list(csv.DictReader(io.StringIO((tmp_path / "reports/showback-2024-04.csv").read_text())))
    usage = {r["team"]: r for r in team_costs.usage(loaded, start=APRIL[0], end=APRIL[1], now=APRIL[1]).to_dicts()}
    assert {r["team"] for r in rows} == set(usage) and rows[0]["month"] == "2024-04"
    v = next(r for r in rows if r["team"] == "vision")
    assert float(v["gpu_hours"]) == pytest.approx(usage["vision"]["gpu_hours"]) and v["currency"] == "EUR"
    assert float(v["location_kgco2e"]) == pytest.approx(200 * 41003 / 3.6e6 * _nld_g_per_kwh() / 1000)
    assert float(v["market_kgco2e"]) == pytest.approx(float(v["location_kgco2e"]))
    assert out["report"]["carbon"][0]["site_id"] == "grn"
    html = (tmp_path / "reports/showback-2024-04.html") if "html" in out["files"] else None
    if html is not None:
        assert "kgCO2e" in html.read_text()
    if "pdf" in out["files"]:
        assert (tmp_path / "reports/showback-2024-04.pdf").read_bytes().startswith(b"%PDF")
    else:
        assert "WeasyPrint" in out["files"]["pdf_unavailable"]
    assert team_costs.previous_month(dt.datetime(2026, 12, 1, 2, 30, tzinfo=dt.UTC)) == "2026-11"
    assert team_costs.previous_month(dt.datetime(2027, 1, 1, tzinfo=dt.UTC)) == "2026-12"


def test_held_samples_is_the_join_filtered_to_each_span():
    import random

    rnd = random.Random(3)
    t0 = dt.datetime(2026, 11, 1, tzinfo=dt.UTC)
    samples = pl.DataFrame([{"ts": t0 + dt.timedelta(seconds=rnd.randrange(0, 86400 * 30)), "gpu_uuid": f"G{rnd.randrange(40)}",
                             "util_ratio": rnd.choice([None, rnd.random()]), "power_w": rnd.uniform(50, 700)} for _ in range(20000)],
                           schema_overrides={"ts": pl.Datetime("us", "UTC")}).unique(["ts", "gpu_uuid"])
    held = []
    for i in range(3000):
        s = t0 + dt.timedelta(seconds=rnd.randrange(-86400, 86400 * 31))
        held.append({"job_id": str(i), "gpu_uuid": f"G{rnd.randrange(45)}", "s": s, "e": s + dt.timedelta(seconds=rnd.choice([0, 1, 600, 86400 * 3]))})
    held += [{"job_id": "edge", "gpu_uuid": "G1", "s": samples.filter(pl.col("gpu_uuid") == "G1")["ts"].min(),
              "e": samples.filter(pl.col("gpu_uuid") == "G1")["ts"].max()}]  # the first sample in, the last out
    held = pl.DataFrame(held, schema_overrides={"s": pl.Datetime("us", "UTC"), "e": pl.Datetime("us", "UTC")})
    want = held.join(samples, on="gpu_uuid").filter((pl.col("ts") >= pl.col("s")) & (pl.col("ts") < pl.col("e")))
    got = usage_analysis.held_samples(held, samples)
    order = ["job_id", "gpu_uuid", "ts"]
    assert want.height > 1000 and got.select(want.columns).sort(order).equals(want.sort(order))


def test_a_months_busy_share_and_energy_come_from_the_hour_tier(loaded, monkeypatch):
    """Over a month the job's GPU is read from the hour tier, not raw samples (a month of a 16,384-GPU fleet is
    4 billion of them): each hour the hold touches counts whole, weighted by its samples. By hand from the minute
    samples: hours 01:00-10:00 wholly held (util 0.5, 200 W); 00:00 and 11:00 held for 42 of their 60 samples and
    idle for the rest (util 0.5 x 42/60, power (42 x 200 + 18 x 50)/60 W each)."""
    from fleetscope.services import tiers

    teams.set_mapping(loaded, kind="slurm_user", match="user420", team="vision", recorded_by="alice")
    tiers.advance(loaded, JOB_END + dt.timedelta(hours=3))
    assert job_usage.usage_tier(loaded, *APRIL) == "hour"
    assert job_usage.usage_tier(loaded, JOB_START, JOB_START + dt.timedelta(hours=2)) == "raw"
    read = loaded.read
    monkeypatch.setattr(loaded, "read", lambda table, *a, **k: pytest.fail("raw samples read") if table == "gpu_sample" else read(table, *a, **k))
    j = team_costs.job_costs(loaded, start=APRIL[0], end=APRIL[1], now=APRIL[1]).filter(pl.col("job_id") == "7946767").row(0, named=True)
    util = (10 * 0.5 + 2 * 0.5 * 42 / 60) / 12
    power = (10 * 200 + 2 * (42 * 200 + 18 * 50) / 60) / 12
    assert j["used_gpu_hours"] == pytest.approx(41003 / 3600 * util, rel=1e-9)
    assert j["energy_kwh"] == pytest.approx(power * 41003 / 3.6e6, rel=1e-9)
    assert abs(util - 0.5) < 0.03  # what the hours' edges cost against the raw samples' 0.5
    # a hold inside one hour (10:10-10:50) still has its hour, and the hours past the hour tier's watermark come
    # from the minute tier
    from analyzers import scheduler as sched_analysis

    job = team_costs.jobs_in(loaded, *APRIL).filter(pl.col("job_id") == "7946767").with_columns(
        pl.lit(JOB_START.replace(hour=10, minute=10, second=0)).cast(pl.Datetime("us", "UTC")).alias("start_at"),
        pl.lit(JOB_START.replace(hour=10, minute=50, second=0)).cast(pl.Datetime("us", "UTC")).alias("end_at"))
    short = job_usage.busy(loaded, sched_analysis.allocated_gpu_seconds(job, *APRIL, now=APRIL[1]), *APRIL)
    assert short["busy_ratio"].to_list() == [pytest.approx(0.5)] and short["energy_j"].to_list() == [pytest.approx(200 * 2400)]


def test_usage_and_top_jobs_together_are_each_alone(loaded):
    teams.set_mapping(loaded, kind="slurm_user", match="user420", team="vision", recorded_by="alice")
    usage, top = team_costs.usage_and_top_jobs(loaded, start=APRIL[0], end=APRIL[1], limit=5, now=APRIL[1])
    assert usage.equals(team_costs.usage(loaded, start=APRIL[0], end=APRIL[1], now=APRIL[1]))
    assert top.equals(team_costs.top_jobs(loaded, start=APRIL[0], end=APRIL[1], limit=5, now=APRIL[1])) and top.height == 5


def test_usage_over_time_is_each_bucket_costed_alone(loaded):
    """Every bucket equals the allocation of that bucket alone, priced at each job's start clipped to the bucket
    (``allocated_gpu_seconds`` and ``job_costs`` over the bucket as its period), across a price change, with
    running jobs cut at ``now``."""
    from analyzers import chargeback
    from analyzers import scheduler as sched_analysis

    teams.set_mapping(loaded, kind="slurm_user", match="user420", team="vision", recorded_by="alice")
    serving.record_price(loaded, {"site_id": "grn", "gpu_model": "", "valid_from": dt.datetime(2024, 4, 5, 6, tzinfo=dt.UTC), "currency": "EUR",
                                  "gpu_hour_price": 3.5, "energy_price_per_kwh": 0.25}, recorded_by="finance")
    start, end = APRIL[0] + dt.timedelta(days=2), APRIL[0] + dt.timedelta(days=12)
    now = end - dt.timedelta(hours=5, minutes=7)
    step = dt.timedelta(minutes=53)
    got = team_costs.usage_over_time(loaded, start=start, end=end, step_s=int(step.total_seconds()), now=now)
    jobs = chargeback.assign_teams(job_usage.jobs_in(loaded, start, end), loaded.read("team_mapping"), loaded.read("sched_account"))
    want = []
    b = start
    while b < end:
        e = min(b + step, end)
        alloc = sched_analysis.allocated_gpu_seconds(jobs, b, e, now=now)
        if alloc.height:
            c = chargeback.job_costs(alloc, busy=None, prices=serving.price_book(loaded), sites=team_costs.host_sites(loaded), start=b)
            for (team,), g in c.group_by("team"):
                priced = g["gpu_cost"].drop_nulls()
                want.append((b, team, g.height, g["gpu_hours"].sum(), priced.sum() if priced.len() else None))
        b = e
    rows = [(r["bucket_start"], r["team"], r["jobs"], r["gpu_hours"], r["gpu_cost"]) for r in got.to_dicts()]
    key = lambda r: (r[0], r[1] or "")  # noqa: E731
    assert len(want) > 20 and {round(r[4] / r[3], 9) for r in want if r[4]} == {2.0, 3.5}  # the job's hours at both prices
    assert [(b, t, n) for b, t, n, _, _ in sorted(rows, key=key)] == [(b, t, n) for b, t, n, _, _ in sorted(want, key=key)]
    for g, w in zip(sorted(rows, key=key), sorted(want, key=key)):
        assert g[3] == pytest.approx(w[3], rel=1e-12) and (g[4] == w[4] is None or g[4] == pytest.approx(w[4], rel=1e-12)), (g, w)


@pytest.mark.parametrize("control", ["\x00", "\x1b[2J", "\t", "\x7f"])
def test_every_name_an_operator_gives_refuses_control_characters_alike(store, control):
    """A push's source, a token's binding and a team's names share one rule (``textinput.has_control``): C0
    controls and DEL are refused, which none of them held apart."""
    from fastapi import HTTPException

    from fleetscope.api.routes_data import claimed_source
    from fleetscope.services import auth

    name = f"node{control}7"
    with pytest.raises(HTTPException) as refused:
        claimed_source(None, name)
    assert refused.value.status_code == 400
    with pytest.raises(ValueError, match="without control characters"):
        auth.check_binding(auth.Binding(host=name))
    with pytest.raises(ValidationError, match="printable"):
        teams.set_mapping(store, kind="slurm_user", match=name, team="vision", recorded_by="alice")
    with pytest.raises(ValidationError, match="printable"):
        teams.set_budget(store, team=name, gpu_hour_quota=10.0, recorded_by="alice")
    assert store.read("team_mapping").height == 0 and store.read("team_budget").height == 0
    assert claimed_source(None, "node-7 ü") == "node-7 ü" and auth.check_binding(auth.Binding(host="node-7")) == auth.Binding(host="node-7")

"""Fabric health through the store, the health sweep, the API route, the CLI verb and the agent."""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess

import httpx
import pytest

from fleetscope.services import auth
from fleetscope.services import health as health_service
from fleetscope.door import ingestion
from fleetscope.agent import Agent
from fleetscope.store import Store
from ingest.format import Options
from tests import clirun

T = dt.datetime(2026, 12, 1, 12, 0, tzinfo=dt.UTC)
BAD = "fabric/perfquery-x_osc_0x506b4b03005c2740.txt"


def bad_port_twice(realdata) -> tuple[bytes, bytes]:
    """The OSC leaf port with errors, read twice five minutes apart: one more link-down, 200 more discards."""
    first = (realdata / BAD).read_bytes()
    later = (first.replace(b"LinkDownedCounter:...............1", b"LinkDownedCounter:...............2")
             .replace(b"PortXmitDiscards:................20046", b"PortXmitDiscards:................20246"))
    return first, later


def load(store: Store, realdata) -> None:
    first, later = bad_port_twice(realdata)
    ingestion.ingest_bytes(store, first, source="pq-1", opts=Options(ts=T))
    ingestion.ingest_bytes(store, later, source="pq-2", opts=Options(ts=T + dt.timedelta(minutes=5)))
    ingestion.ingest_bytes(store, (realdata / "fabric/ibnetdiscover-ports_osc_edr.txt").read_bytes(), source="topo", opts=Options(ts=T))


def test_the_health_sweep_stores_fabric_findings(store, realdata):
    load(store, realdata)
    out = health_service.health_window(store, T, T + dt.timedelta(minutes=15))
    ib = out["findings"].filter(out["findings"]["kind"].str.starts_with("ib_"))
    assert sorted(ib["kind"].to_list()) == ["ib_congestion", "ib_link_flapping"]
    stored = store.read("finding")
    assert set(stored.filter(stored["kind"].str.starts_with("ib_"))["subject"]) == {"ib:lid:2052/1"}
    fh = health_service.fabric_health(store, T, T + dt.timedelta(minutes=15))
    assert fh["nic_rate_gbps"] == 100.0 and fh["links"] == 4
    with pytest.raises(ValueError, match="at most a day"):
        health_service.fabric_health(store, T, T + dt.timedelta(days=2))


def test_api_fabric_health_and_links_need_read(api, realdata):
    load(api.app.state.store, realdata)
    read = {"Authorization": "Bearer " + auth.create_token(api.app.state.store.engine, "r", ["read"])}
    params = {"start": T.isoformat(), "end": (T + dt.timedelta(minutes=15)).isoformat()}
    assert httpx.get(api.url + "/api/v1/fabric/health", params=params).status_code == 401
    r = httpx.get(api.url + "/api/v1/fabric/health", params=params, headers=read)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["nic_rate_gbps"] == 100.0 and body["ports_seen"] == 1
    assert body["ports"][0]["link_downed"] == 1 and body["ports"][0]["xmit_discards"] == 200
    assert {f["kind"] for f in body["findings"]} == {"ib_link_flapping", "ib_congestion"}
    assert httpx.get(api.url + "/api/v1/fabric/health", params={"start": "2026-12-01T12:00:00"}, headers=read).status_code == 400
    links = httpx.get(api.url + "/api/v1/fabric/links", params={"host": "o0001"}, headers=read).json()
    assert [(x["a_node"], x["b_desc"], x["b_port"]) for x in links] == [("0x7cfe9003003b4bde", "ib-i1l1s01", 10)]
    assert len(httpx.get(api.url + "/api/v1/fabric/links", params={"connected": "false"}, headers=read).json()) == 2


def test_an_ingest_token_may_push_port_samples_but_not_findings(api, realdata):
    from fleetscope.core.frames import batch_to_json
    from ingest import ib_sysfs

    batch = ib_sysfs.parse_ttar((realdata / "fabric/procfs_sys-class-infiniband_hfi1-mlx4-mlx5-hw_counters.ttar").read_bytes(), ts=T, host="n1")
    ingest = {"Authorization": "Bearer " + auth.create_token(api.app.state.store.engine, "i", ["ingest"])}
    r = httpx.post(api.url + "/api/v1/batches", content=json.dumps(batch_to_json(batch), default=str), headers=ingest)
    assert r.status_code == 200, r.text
    assert api.app.state.store.counts()["fabric_port_sample"] == 4
    forged = {"source": "x", "frames": {"finding": [{"analyzer": "fabric", "kind": "ib_link_flapping", "subject": "s",
                                                      "window_start": T.isoformat(), "severity": "critical"}]}}
    assert httpx.post(api.url + "/api/v1/batches", json=forged, headers=ingest).status_code == 403


def test_cli_fabric(tmp_path, realdata):
    env = {**os.environ, "FLEETSCOPE_DATA_DIR": str(tmp_path)}
    env.pop("FLEETSCOPE_DATABASE_URL", None)

    def cli(*args: str) -> subprocess.CompletedProcess:
        return clirun.cli(*args, env=env)

    first, later = bad_port_twice(realdata)
    (tmp_path / "a.txt").write_bytes(first)
    (tmp_path / "b.txt").write_bytes(later)
    assert cli("ingest", str(tmp_path / "a.txt"), "--ts", T.isoformat()).returncode == 0
    assert cli("ingest", str(tmp_path / "b.txt"), "--ts", (T + dt.timedelta(minutes=5)).isoformat()).returncode == 0
    end = (T + dt.timedelta(minutes=15)).isoformat()
    out = cli("health", "fabric", "--start", T.isoformat(), "--end", end, "--json")
    assert out.returncode == 0, out.stderr
    found = json.loads(out.stdout)["findings"]
    assert {f["kind"] for f in found} == {"ib_link_flapping", "ib_congestion"}
    text = cli("health", "fabric", "--start", T.isoformat(), "--end", end)
    assert "ib_link_flapping" in text.stdout and "went down 1 time(s)" in text.stdout
    assert cli("health", "fabric", "--start", "yesterday").returncode != 0


def test_the_agent_pushes_sysfs_port_samples_as_a_batch(realdata, tmp_path):
    from ingest import ib_sysfs

    files, _ = ib_sysfs.ttar_files((realdata / "fabric/procfs_sys-class-infiniband_hfi1-mlx4-mlx5-hw_counters.ttar").read_bytes())
    root = tmp_path / "infiniband"
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text + "\n")
    ag = Agent("http://127.0.0.1:9", "t", host="gpu-node-7", infiniband=root, push="otlp")
    try:
        from fleetscope.agent import TickReport

        readings = ag.collect(TickReport(ts=T))
    finally:
        ag.close()
    assert [r.path for r in readings] == ["/api/v1/batches"]
    doc = json.loads(readings[0].raw())
    rows = doc["frames"]["fabric_port_sample"]
    assert len(rows) == 4 and {r["host"] for r in rows} == {"gpu-node-7"}
    mlx5 = next(r for r in rows if r["device"] == "mlx5_0")
    assert mlx5["roce_adp_retrans_total"] == 99 and mlx5["width"] == "1X"


def test_the_readme_s_ibswinfo_post_lands_the_switch_vitals_the_rules_read(api, realdata):
    """ibswinfo's output posted as the README's cron recipe does (the body as printed, the read time as ``ts``):
    a real SB7790 EDR switch whose fan tray is in error gives ``ib_switch_fan_ok`` 0 at that time under its GUID.
    Without ``ts`` (ibswinfo prints no time) the arrival time stands."""
    text = (realdata / "fabric" / "ibswinfo_sb7790-edr-switch_fan-error.txt").read_bytes()
    h = {"Authorization": "Bearer " + auth.create_token(api.app.state.store.engine, "cron", ["ingest"])}
    url = api.url + "/api/v1/ingest/ibswinfo"
    r = httpx.post(url, params={"source": "sw-17", "ts": "2026-12-07T10:05:00Z"}, content=text, headers=h)
    assert r.status_code == 200, r.text
    sent = dt.datetime.now(dt.UTC)
    assert httpx.post(url, params={"source": "sw-17"}, content=text, headers=h).status_code == 200
    arrived = dt.datetime.now(dt.UTC)
    rows = api.app.state.store.read("metric_sample")
    fan = [s for s in rows["series"].unique().to_list() if s.startswith("ib_switch_fan_ok")]
    assert len(fan) == 1
    got = rows.filter(rows["series"] == fan[0]).sort("ts")
    assert got["value"].to_list() == [0.0, 0.0]
    assert got["ts"][0] == dt.datetime(2026, 12, 7, 10, 5, tzinfo=dt.UTC) and sent <= got["ts"][1] <= arrived

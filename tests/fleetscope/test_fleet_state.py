"""The fleet's live state outside the dashboard: ``GET /api/v1/fleet/state`` and ``fleetscope fleet state`` give
the Overview's counts, power and grid for a fleet whose every GPU's state was set by hand (busy, idle, hot,
unhealthy, silent), with the read scope, a site filter, and a refusal for a site the inventory lacks."""

from __future__ import annotations

import datetime as dt
import json

import httpx
import polars as pl
import pytest
from click.testing import CliRunner

from fleetscope.cli import main as cli_main
from fleetscope.core import frames as F
from fleetscope.services import auth, health_reads
from fleetscope.store import Store

# gpu -> (host, index, util_ratio, power_w, temp_c); None for a GPU that sends nothing
GPUS: dict[str, tuple[str, int, tuple[float, float, float] | None]] = {
    "GPU-a1-0": ("a-n1", 0, (0.9, 400.0, 60.0)),   # busy
    "GPU-a1-1": ("a-n1", 1, (0.05, 100.0, 90.0)),  # idle and hot
    "GPU-a2-0": ("a-n2", 0, (0.8, 350.0, 50.0)),   # busy, but an XID an hour ago makes it unhealthy
    "GPU-a2-1": ("a-n2", 1, None),                 # silent
    "GPU-b1-0": ("b-n1", 0, (0.5, 300.0, 55.0)),   # busy
    "GPU-b1-1": ("b-n1", 1, (0.0, 80.0, 40.0)),    # idle
}
SITES = {"a-n1": "site-a", "a-n2": "site-a", "b-n1": "site-b"}


def _fleet(store: Store, now: dt.datetime) -> None:
    samples = [{"ts": now - dt.timedelta(seconds=10 * k), "gpu_uuid": g, "util_ratio": r[0], "power_w": r[1], "temp_c": r[2]}
               for g, (_, _, r) in GPUS.items() if r is not None for k in (4, 3, 2, 1)]
    store.write_frames([
        (F.HOST, F.conform(F.HOST, pl.DataFrame([{"host": h, "site_id": s} for h, s in SITES.items()]))),
        (F.GPU, F.conform(F.GPU, pl.DataFrame([{"gpu_uuid": g, "host": h, "gpu_index": i} for g, (h, i, _) in GPUS.items()]))),
        (F.GPU_SAMPLE, F.conform(F.GPU_SAMPLE, pl.DataFrame(samples))),
        (F.HEALTH_EVENT, F.conform(F.HEALTH_EVENT, pl.DataFrame([{"ts": now - dt.timedelta(minutes=50), "host": "a-n2", "gpu_uuid": "GPU-a2-0",
                                                                  "kind": "xid", "code": 79, "message": "fell off the bus"}]))),
    ], source="fleet-state-test")


def _status(state: dict) -> dict[str, str]:
    return {g["gpu_uuid"]: g["status"] for g in state["grid"]}


def test_the_state_of_a_fleet_set_by_hand(store: Store) -> None:
    now = dt.datetime.now(dt.UTC).replace(microsecond=0)
    _fleet(store, now)
    state = health_reads.fleet_state(store, now)
    assert state["inventory"] == {"sites": 2, "hosts": 3, "gpus": 6}
    assert state["counts"] == {"gpus": 6, "reporting": 5, "busy": 2, "idle": 2, "unhealthy": 1, "silent": 1}
    # each reporting GPU's latest power, summed: 400 + 100 + 350 + 300 + 80
    assert state["power"]["gpus_reporting"] == 5 and state["power"]["power_w"] == pytest.approx(1230.0)
    assert state["power"]["as_of"] == now - dt.timedelta(seconds=10)
    assert _status(state) == {"GPU-a1-0": "ok", "GPU-a1-1": "hot", "GPU-a2-0": "unhealthy", "GPU-a2-1": "silent", "GPU-b1-0": "ok",
                              "GPU-b1-1": "ok"}
    # the worst host first, a GPU's own events counted
    assert [g["host"] for g in state["grid"]][:2] == ["a-n2", "a-n2"] and state["grid"][0]["events"] == 1
    assert state["grid"][0]["power_w"] == 350.0 and state["grid"][1]["power_w"] is None

    site_a = health_reads.fleet_state(store, now, "site-a", problems_only=True)
    assert site_a["counts"] == {"gpus": 4, "reporting": 3, "busy": 1, "idle": 1, "unhealthy": 1, "silent": 1}
    assert site_a["power"]["power_w"] == pytest.approx(850.0)
    assert _status(site_a) == {"GPU-a1-1": "hot", "GPU-a2-0": "unhealthy", "GPU-a2-1": "silent"}

    # an hour and ten minutes on, nothing has reported and the XID has aged out of the health window
    later = health_reads.fleet_state(store, now + dt.timedelta(minutes=70))
    assert later["counts"] == {"gpus": 6, "reporting": 0, "busy": 0, "idle": 0, "unhealthy": 0, "silent": 6}
    assert later["power"] == {"as_of": None, "gpus_reporting": 0, "power_w": None} and set(_status(later).values()) == {"silent"}


def test_an_unknown_site_is_refused_not_read_as_an_empty_fleet(store: Store) -> None:
    _fleet(store, dt.datetime.now(dt.UTC))
    with pytest.raises(health_reads.NotFound, match="no GPU at site 'site-z'"):
        health_reads.fleet_state(store, dt.datetime.now(dt.UTC), "site-z")


def test_api_and_cli(api, tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    store = api.app.state.store
    now = dt.datetime.now(dt.UTC).replace(microsecond=0)
    _fleet(store, now)
    url = api.url + "/api/v1/fleet/state"
    assert httpx.get(url).status_code == 401
    pusher = {"Authorization": f"Bearer {auth.create_token(store.engine, 'agent', ['ingest'])}"}
    assert httpx.get(url, headers=pusher).status_code == 403
    reader = {"Authorization": f"Bearer {auth.create_token(store.engine, 'ops', ['read'])}"}

    body = httpx.get(url, headers=reader).json()
    assert body["counts"] == {"gpus": 6, "reporting": 5, "busy": 2, "idle": 2, "unhealthy": 1, "silent": 1}
    assert body["power"]["power_w"] == pytest.approx(1230.0) and body["rules"]["unhealthy_kinds"][0] == "xid"
    assert dt.datetime.fromisoformat(body["as_of"]) >= now and len(body["grid"]) == 6
    b = httpx.get(url, headers=reader, params={"site": "site-b", "problems_only": "true"}).json()
    assert b["counts"]["gpus"] == 2 and b["grid"] == []

    # hostile and wrong input: a clear refusal, nothing read as an empty fleet, nothing changed
    missing = httpx.get(url, headers=reader, params={"site": "site-z' OR '1'='1"})
    assert missing.status_code == 404 and "no GPU at site" in missing.text
    assert httpx.get(url, headers=reader, params={"site": "x" * 300}).status_code == 422
    assert httpx.get(url, headers=reader, params={"problems_only": "maybe"}).status_code == 422
    assert httpx.get(url, headers=reader).json()["counts"] == body["counts"]

    monkeypatch.setenv("FLEETSCOPE_DATABASE_URL", str(store.engine.url.render_as_string(hide_password=False)))
    monkeypatch.setenv("FLEETSCOPE_DATA_DIR", str(tmp_path))
    out = CliRunner().invoke(cli_main, ["fleet", "state", "--site", "site-a", "--problems", "--json"])
    assert out.exit_code == 0, out.output
    assert {g["gpu_uuid"]: g["status"] for g in json.loads(out.output)["grid"]} == {"GPU-a1-1": "hot", "GPU-a2-0": "unhealthy",
                                                                                    "GPU-a2-1": "silent"}
    text = CliRunner().invoke(cli_main, ["fleet", "state"])
    assert text.exit_code == 0, text.output
    lines = text.output.splitlines()
    assert lines[0] == "6 GPUs on 3 hosts at 2 site(s): 2 busy, 2 idle, 1 unhealthy, 1 silent; 1.2 kW from 5 GPUs"
    assert lines[1].split()[:4] == ["unhealthy", "a-n2", "0", "GPU-a2-0"] and len(lines) == 7
    refused = CliRunner().invoke(cli_main, ["fleet", "state", "--site", "nowhere"])
    assert refused.exit_code == 1 and "no GPU at site 'nowhere'" in refused.output

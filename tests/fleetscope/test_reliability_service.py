"""Reliability report and the SDC rerun protocol through the store, the live API and the CLI, on SQLite and
PostgreSQL, with published check values: the Llama 3 405B interruption table (Meta, 2024, Table 5) and
its one-interruption-every-three-hours MTBF, Daly's 116.7 min at δ = 5 min and M = 24 h, and the
0.999^1000 ≈ 36.8 % reliability gap."""

from __future__ import annotations

import datetime as dt
import json
import math
import os
import subprocess

import httpx
import pytest

from analyzers import reliability as rel
from fleetscope.services import auth
from fleetscope.door.ingestion import ingest_bytes
from fleetscope.services.reliability import UnknownJob, reliability_report
from tests import clirun

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
HOUR = 3600.0

# A cause string for every category of the paper's Table 5, each checked against the categoriser below.
CAUSE = {
    "Faulty GPU": "xid_79", "GPU HBM3 Memory": "xid_48", "Software Bug": "oom", "Network Switch/Cable": "leaf switch port flapping",
    "Host Maintenance": "unplanned maintenance reboot", "GPU SRAM Memory": "sram parity error", "GPU System Processor": "xid_119",
    "NIC": "mlx5 nic down", "NCCL Watchdog Timeouts": "nccl_timeout", "Silent Data Corruption": "sdc",
    "GPU Thermal Interface + Sensor": "gpu thermal sensor", "SSD": "nvme ssd failed", "Power Supply": "psu failure",
    "Server Chassis": "chassis fan", "IO Expansion Board": "riser", "Dependency": "lustre unavailable", "CPU": "cpu mce",
    "System Memory": "dimm ce storm",
}
LLAMA_DAYS, LLAMA_GPUS, RECOVERY_S = 54, 16_384, 1800


def _line(job_id: str, t: dt.datetime, kind: str, **kw) -> str:
    return json.dumps({"job_id": job_id, "ts": t.isoformat(), "kind": kind, **kw})


def llama3_history() -> bytes:
    """The 54-day snapshot of Llama 3 405B pre-training: 16,384 GPUs, 419 unexpected interruptions with the
    paper's root-cause counts, spread evenly; each job restart 30 min after its failure."""
    causes = [CAUSE[c] for c, _, n in rel.LLAMA3_INTERRUPTIONS for _ in range(n)]
    span = dt.timedelta(days=LLAMA_DAYS)
    lines = [_line("llama3-405b", T0, "started", job={"world_size": LLAMA_GPUS, "kind": "training"})]
    for i, cause in enumerate(causes):
        t = T0 + span * (i + 0.5) / len(causes)
        lines.append(_line("llama3-405b", t, "failure", cause=cause, rank=i % LLAMA_GPUS))
        lines.append(_line("llama3-405b", t + dt.timedelta(seconds=RECOVERY_S), "restart"))
    lines.append(_line("llama3-405b", T0 + span, "finished"))
    return "\n".join(lines).encode()


def checkpointing_jobs() -> bytes:
    """'ckpt': 48 h on 8 GPUs, 5-minute saves every 60 min, 2 interruptions (its own MTBF: 24 h).
    'calm': 48 h on 8 GPUs, the same saves, never interrupted."""
    lines = []
    for job, fails in (("ckpt", (10.0, 30.0)), ("calm", ())):
        lines.append(_line(job, T0, "started", job={"world_size": 8}))
        for k in range(48):
            s = T0 + dt.timedelta(hours=k + 0.5)
            lines.append(_line(job, s, "checkpoint_save_start"))
            lines.append(_line(job, s + dt.timedelta(minutes=5), "checkpoint_save_end"))
        for h in fails:
            lines.append(_line(job, T0 + dt.timedelta(hours=h), "failure", cause="xid_79"))
            lines.append(_line(job, T0 + dt.timedelta(hours=h, minutes=20), "restart"))
        lines.append(_line(job, T0 + dt.timedelta(hours=48), "finished"))
    return "\n".join(lines).encode()


def test_causes_cover_every_category():
    assert {c: rel.categorize_cause(x) for c, x in CAUSE.items()} == {c: c for c in CAUSE}


def test_llama3_table_and_mtbf_through_the_store(store):
    ingest_bytes(store, llama3_history(), source="llama3.jsonl", fmt="job_events")
    r = reliability_report(store, T0, T0 + dt.timedelta(days=LLAMA_DAYS, hours=1))
    by = {row["category"]: row for row in r["interruptions"]["by_category"]}
    assert r["interruptions"]["total"] == 419
    assert {c: row["interruptions"] for c, row in by.items() if c != "Other"} == {c: n for c, _, n in rel.LLAMA3_INTERRUPTIONS}
    assert by["GPU HBM3 Memory"]["share"] == pytest.approx(0.172, abs=0.0005)  # printed 17.2 %
    assert by["Software Bug"]["share"] == pytest.approx(0.129, abs=0.0005)     # printed 12.9 %
    (job,) = r["mtbf"]["jobs"]
    assert job["gpus"] == LLAMA_GPUS and job["wall_hours"] == pytest.approx(LLAMA_DAYS * 24)
    assert job["job_mtbf_hours"] == pytest.approx(3.09, abs=0.01)  # "one interruption every three hours"
    assert r["mtbf"]["gpu_mtbf_hours"] == pytest.approx(LLAMA_DAYS * 24 * LLAMA_GPUS / 419)
    assert job["interruptions_by_category"]["GPU HBM3 Memory"] == 72
    assert r["mtbf"]["mttr_s"] == RECOVERY_S and r["mtbf"]["recoveries"] == 419
    # the job needs all 16,384 GPUs: A measured as MTBF/(MTBF+MTTR), all-up A^N
    a = r["availability"]
    gpu_mtbf = LLAMA_DAYS * 24 * LLAMA_GPUS / 419
    assert r["availability"]["parts"] is None and a["all_up"] is None
    r = reliability_report(store, T0, T0 + dt.timedelta(days=LLAMA_DAYS, hours=1), job_id="llama3-405b")
    a = r["availability"]
    assert a["parts"] == LLAMA_GPUS and a["part_availability"] == pytest.approx(gpu_mtbf / (gpu_mtbf + 0.5))
    assert a["all_up"] == pytest.approx(a["part_availability"] ** LLAMA_GPUS) and a["basis"].startswith("measured")
    assert a["job_mtbf_hours"] == pytest.approx(3.09, abs=0.01)


def test_checkpoint_advice_daly_check_value_and_fleet_basis(store):
    ingest_bytes(store, checkpointing_jobs(), source="ckpt.jsonl", fmt="job_events")
    r = reliability_report(store, T0, T0 + dt.timedelta(days=3))
    adv = {a["job_id"]: a for a in r["checkpoint"]}
    c = adv["ckpt"]
    assert c["save_cost_s"] == 300 and c["interval_s"] == 3300 and c["mtbf_s"] == 24 * HOUR
    assert c["daly_interval_s"] / 60 == pytest.approx(116.7, abs=0.05)  # the check value
    assert c["young_interval_s"] / 60 == pytest.approx(120.0)
    assert c["lost_fraction_actual"] > c["lost_fraction_advised"] and c["mtbf_basis"].startswith("the job's own")
    # 'calm' had no interruption: the fleet's GPU MTBF (2 failures in 768 GPU-hours) over its 8 GPUs
    k = adv["calm"]
    assert r["mtbf"]["gpu_mtbf_hours"] == pytest.approx(384.0)
    assert k["mtbf_s"] == pytest.approx(384.0 / 8 * HOUR) and "fleet" in k["mtbf_basis"]
    assert k["daly_interval_s"] == pytest.approx(rel.daly_interval_s(300, 48 * HOUR))
    # the reliability gap: 1,000 parts at 99.9 % are all up 36.8 % of the time
    g = reliability_report(store, T0, T0 + dt.timedelta(days=3), parts=1000, part_availability=0.999)["availability"]
    assert g["all_up"] == pytest.approx(0.368, abs=0.0005) and g["basis"] == "given" and g["expected_parts_down"] == pytest.approx(1.0)
    # one job only
    only = reliability_report(store, T0, T0 + dt.timedelta(days=3), job_id="calm")
    assert [j["job_id"] for j in only["mtbf"]["jobs"]] == ["calm"] and only["interruptions"]["total"] == 0
    assert only["availability"]["part_availability"] is None and "no interruptions" in only["availability"]["basis"]
    assert only["checkpoint"][0]["daly_interval_s"] is None  # nothing failed in its window: no MTBF to advise from


def test_bad_report_arguments_raise_and_name_the_problem(store):
    ingest_bytes(store, checkpointing_jobs(), source="ckpt.jsonl", fmt="job_events")
    end = T0 + dt.timedelta(days=1)
    with pytest.raises(ValueError, match="time zone"):
        reliability_report(store, T0.replace(tzinfo=None), end)
    with pytest.raises(ValueError, match="after start"):
        reliability_report(store, end, T0)
    with pytest.raises(ValueError, match="366 days"):
        reliability_report(store, T0, T0 + dt.timedelta(days=400))
    with pytest.raises(ValueError, match="parts"):
        reliability_report(store, T0, end, parts=0)
    with pytest.raises(ValueError, match="part_availability"):
        reliability_report(store, T0, end, part_availability=-0.5)
    with pytest.raises(UnknownJob, match="nope"):
        reliability_report(store, T0, end, job_id="nope")


# --- the live API -----------------------------------------------------------------------------------------


def _tokens(store):
    return ({"Authorization": "Bearer " + auth.create_token(store.engine, "r", ["read"])},
            {"Authorization": "Bearer " + auth.create_token(store.engine, "i", ["ingest"])})


def test_reliability_endpoint_values_and_hostile_queries(api):
    store = api.app.state.store
    read, ingest = _tokens(store)
    assert httpx.post(api.url + "/api/v1/ingest/job_events", content=checkpointing_jobs(), headers=ingest).status_code == 200
    url = api.url + "/api/v1/reliability"
    ok = {"start": T0.isoformat(), "end": (T0 + dt.timedelta(days=3)).isoformat()}
    r = httpx.get(url, params={**ok, "parts": 1000, "part_availability": 0.999}, headers=read)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["availability"]["all_up"] == pytest.approx(0.368, abs=0.0005)
    assert {a["job_id"]: round(a["daly_interval_s"] / 60, 1) for a in body["checkpoint"]}["ckpt"] == 116.7
    assert body["mtbf"]["jobs"][0]["gpu_mtbf_hours"] is None  # 'calm': infinite MTBF is null in JSON, never Infinity

    assert httpx.get(url, params=ok).status_code == 401
    assert httpx.get(url, params=ok, headers=ingest).status_code == 403
    assert httpx.get(url, params={**ok, "job_id": "nope"}, headers=read).status_code == 404
    assert httpx.get(url, params={**ok, "job_id": "x' OR '1'='1"}, headers=read).status_code == 404
    cases = [
        ({"start": "yesterday", "end": ok["end"]}, 422, "start"),
        ({"start": "2026-01-01T00:00:00", "end": "2026-01-02T00:00:00"}, 400, "time zone"),
        ({"start": ok["end"], "end": ok["start"]}, 400, "after start"),
        ({"start": ok["start"], "end": (T0 + dt.timedelta(days=500)).isoformat()}, 400, "366 days"),
        ({**ok, "parts": 0}, 422, "parts"),
        ({**ok, "parts": -5}, 422, "parts"),
        ({**ok, "parts": 10**30}, 422, "parts"),
        ({**ok, "parts": "many"}, 422, "parts"),
        ({**ok, "part_availability": -0.1}, 422, "part_availability"),
        ({**ok, "part_availability": 1.5}, 422, "part_availability"),
        ({**ok, "part_availability": "nan"}, 422, "part_availability"),
        ({**ok, "job_id": "j" * 300}, 422, "job_id"),
        ({"end": ok["end"]}, 422, "start"),
    ]
    for params, status, word in cases:
        resp = httpx.get(url, params=params, headers=read)
        assert resp.status_code == status, (params, resp.text)
        assert word in resp.text, (params, resp.text)


SDC_LINES = [
    # 4 data-parallel replicas; rank 2 (GPU-2) disagrees at step 40; then the step is replayed twice
    *[{"job_id": "sdc1", "ts": (T0 + dt.timedelta(seconds=10 * n)).isoformat(), "kind": "step", "rank": r, "step": n, "loss": 2.0,
       "param_checksum": ("sha:bad" if (r, n) == (2, 40) else f"sha:{n}")} for n in (10, 20, 30, 40) for r in range(4)],
    {"job_id": "sdc1", "ts": (T0 + dt.timedelta(days=1)).isoformat(), "kind": "sdc_rerun", "step": 40, "rank": 2,
     "suspect_gpu": "GPU-2", "gpu_uuid": "GPU-2", "result": "sha:bad"},
    {"job_id": "sdc1", "ts": (T0 + dt.timedelta(days=1, minutes=5)).isoformat(), "kind": "sdc_rerun", "step": 40, "rank": 2,
     "suspect_gpu": "GPU-2", "gpu_uuid": "GPU-7", "result": "sha:40"},
]


def test_sdc_reruns_ingested_judged_stored_and_served(api):
    store = api.app.state.store
    read, ingest = _tokens(store)
    body = "\n".join(json.dumps(x) for x in SDC_LINES).encode()
    bad = body + b"\n" + json.dumps({**SDC_LINES[-1], "ts": (T0 + dt.timedelta(days=2)).isoformat(), "result": 1.5}).encode()
    r = httpx.post(api.url + "/api/v1/ingest/job_events", content=bad, headers=ingest)
    assert r.status_code == 400 and r.json()["field"] == "result" and r.json()["line"] == 19
    assert store.read("job_event").height == 0  # the whole input or nothing
    assert httpx.post(api.url + "/api/v1/ingest/job_events", content=body, headers=ingest).status_code == 200
    assert store.read("job_event").filter(store.read("job_event")["kind"] == "sdc_rerun").height == 2

    url = api.url + "/api/v1/jobs/sdc1/sdc"
    assert httpx.get(url).status_code == 401 and httpx.get(url, headers=ingest).status_code == 403
    assert httpx.get(api.url + "/api/v1/jobs/nope/sdc", headers=read).status_code == 404
    out = httpx.get(url, headers=read).json()
    assert out["steps_screened"] == 16 and [(m["rank"], m["verdict"]) for m in out["checksum_mismatches"]] == [(2, "suspect")]
    (v,) = out["reruns"]["verdicts"]
    assert (v["case_id"], v["verdict"], v["severity"], v["expected"], v["gpus"]) == (
        "sdc1/step:40/rank:2", "persistent", "critical", "sha:40", ["GPU-2", "GPU-7"])
    assert [(x["gpu_uuid"], x["result"], x["same_gpu"]) for x in v["runs"]] == [
        ("GPU-2", "sha:bad", True), ("GPU-2", "sha:bad", True), ("GPU-7", "sha:40", False)]
    assert len(out["reruns"]["records"]) == 2 and out["reruns"]["problems"] == []
    (s,) = out["suspects"]
    assert s["subject"] == "gpu:GPU-2" and s["severity"] == "critical"
    assert [x["signal"] for x in s["evidence"]["signals"]] == ["checksum_mismatch", "rerun_persistent"]

    # analysis stores the verdict as a finding with its evidence chain (the GET above stored nothing)
    admin = {"Authorization": "Bearer " + auth.create_token(store.engine, "a", ["admin"])}
    assert httpx.get(api.url + "/api/v1/findings", params={"kind": "sdc_rerun"}, headers=read).json() == []
    done = httpx.post(api.url + "/api/v1/jobs/sdc1/analyze", headers=admin).json()
    assert done["sdc_reruns"] == [{"case_id": "sdc1/step:40/rank:2", "suspect_gpu": "GPU-2", "verdict": "persistent",
                                   "reason": v["reason"]}]
    (f,) = httpx.get(api.url + "/api/v1/findings", params={"kind": "sdc_rerun"}, headers=read).json()
    ev = json.loads(f["evidence"])
    assert f["subject"] == "gpu:GPU-2" and f["severity"] == "critical" and ev["gpus"] == ["GPU-2", "GPU-7"] and ev["step"] == 40
    # analysing again updates the same findings
    httpx.post(api.url + "/api/v1/jobs/sdc1/analyze", headers=admin)
    assert len(httpx.get(api.url + "/api/v1/findings", params={"kind": "sdc_rerun"}, headers=read).json()) == 1


# --- CLI ----------------------------------------------------------------------------------------------


def _cli(tmp_path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "FLEETSCOPE_DATA_DIR": str(tmp_path)}
    env.pop("FLEETSCOPE_DATABASE_URL", None)
    return clirun.cli(*args, env=env)


def test_cli_reliability_and_sdc(tmp_path):
    (tmp_path / "ckpt.jsonl").write_bytes(checkpointing_jobs())
    (tmp_path / "sdc.jsonl").write_text("\n".join(json.dumps(x) for x in SDC_LINES))
    assert _cli(tmp_path, "ingest", str(tmp_path / "ckpt.jsonl"), str(tmp_path / "sdc.jsonl")).returncode == 0
    window = ("--start", T0.isoformat(), "--end", (T0 + dt.timedelta(days=3)).isoformat())
    p = _cli(tmp_path, "health", "reliability", *window, "--parts", "1000", "--part-availability", "0.999", "--json")
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert out["availability"]["all_up"] == pytest.approx(0.368, abs=0.0005)
    text = _cli(tmp_path, "health", "reliability", *window, "--job-id", "ckpt")
    assert text.returncode == 0, text.stderr
    assert "Faulty GPU" in text.stdout and "Daly 116.7 min" in text.stdout
    assert _cli(tmp_path, "health", "reliability", *window, "--job-id", "nope").returncode == 1
    bad = _cli(tmp_path, "health", "reliability", "--start", "2026-01-02T00:00:00Z", "--end", "2026-01-01T00:00:00Z")
    assert bad.returncode != 0 and "after start" in bad.stderr
    assert _cli(tmp_path, "health", "reliability", *window, "--parts", "-3").returncode == 2  # click rejects it as a usage error

    sdc = _cli(tmp_path, "jobs", "sdc", "sdc1", "--json")
    assert sdc.returncode == 0, sdc.stderr
    assert json.loads(sdc.stdout)["reruns"]["verdicts"][0]["verdict"] == "persistent"
    text = _cli(tmp_path, "jobs", "sdc", "sdc1")
    assert "persistent" in text.stdout and "GPU-7" in text.stdout
    assert _cli(tmp_path, "jobs", "sdc", "nope").returncode == 1
    an = _cli(tmp_path, "jobs", "analyze", "sdc1")
    assert an.returncode == 0 and "rerun" in an.stdout and "persistent" in an.stdout


def test_infinite_mtbf_is_not_a_number_in_json(store):
    ingest_bytes(store, checkpointing_jobs(), source="ckpt.jsonl", fmt="job_events")
    r = reliability_report(store, T0, T0 + dt.timedelta(days=3), job_id="calm")
    assert r["mtbf"]["jobs"][0]["job_mtbf_hours"] is None and not any(
        isinstance(v, float) and not math.isfinite(v) for v in r["mtbf"]["jobs"][0].values())

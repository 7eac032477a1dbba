"""Rolling goodput and step-time deviation, computed by the goodput job analysis and reached from the service
(``services.job_reads.job_goodput``), the API (``GET /api/v1/jobs/{id}/goodput``) and the CLI (``fleetscope jobs
goodput``) alike, on ml-goodput-measurement's worked examples ingested as job events: the partial-restart run
(30.612 %) and the sample program (75.000 %), whose windows and step times are worked out by hand here."""

from __future__ import annotations

import datetime as dt
import json
import os

import httpx
import pytest
from fastapi import FastAPI

from analyzers import goodput_trend
from fleetscope.api import routes_jobs
from fleetscope.cli import jobs as cli_jobs
from fleetscope.door import ingestion
from fleetscope.services import auth, job_reads
from fleetscope.services import jobs as analysis
from tests import clirun

T0 = dt.datetime(2024, 1, 1, 1, tzinfo=dt.UTC)
BUCKETS = ("wasted_progress", "infrastructure_recovery", "initialization", "training_preparation", "program_startup", "data_loading",
           "checkpoint_save", "checkpoint_restore", "other")

# The library's GoodputDisruptionPartialRestartTest made deterministic (tests/analyzers/test_goodput.py): started at 0;
# steps 0-4 at 5, 13, 16, 19, 22 s (the first 5 s slow: compilation); restarted at 30 s from step 2's checkpoint,
# steps 2-4 at 35, 43, 46 s; finished at 49 s.
RESTART = [(0, "started", None), (5, "step", 0), (13, "step", 1), (16, "step", 2), (19, "step", 3), (22, "step", 4),
           (30, "started", None), (35, "step", 2), (43, "step", 3), (46, "step", 4), (49, "finished", None)]
# The library's sample program: started at 0, steps at 5, 8, 11, 14, 17 s, finished at 20 s.
SAMPLE = [(0, "started", None)] + [(5 + 3 * i, "step", i) for i in range(5)] + [(20, "finished", None)]


def jsonl(job_id: str, rows) -> bytes:  # type: ignore[no-untyped-def]
    lines = [{"job_id": job_id, "ts": (T0 + dt.timedelta(seconds=t)).isoformat(), "kind": k, **({"step": s} if s is not None else {})}
             for t, k, s in rows]
    return "\n".join(json.dumps(x) for x in lines).encode() + b"\n"


def seed(store) -> None:  # type: ignore[no-untyped-def]
    """``restart`` and ``sample`` analysed; ``fresh`` ingested but not analysed."""
    for job_id, rows in (("restart", RESTART), ("sample", SAMPLE), ("fresh", SAMPLE)):
        ingestion.ingest_bytes(store, jsonl(job_id, rows), source=f"{job_id}.jsonl")
    for job_id in ("restart", "sample"):
        analysis.analyze_job(store, job_id, now=T0 + dt.timedelta(minutes=5))


def iso(seconds: float) -> str:
    return (T0 + dt.timedelta(seconds=seconds)).isoformat()


def badput(**nonzero: float) -> dict[str, float]:
    return {b: nonzero.get(b, 0.0) for b in BUCKETS}


# By hand, from the restart run's timeline: other [0, 5), step 0 [5, 13) = 5 s program startup + 3 s productive,
# step 1 [13, 16) productive, steps 2 and 3 [16, 22) wasted (redone after the restart), infrastructure recovery
# [22, 30) (last sign of life: step 4's start); other [30, 35), step 2 [35, 43) = 5 s startup + 3 s, steps 3, 4 [43, 49).
# Step times 8, 3, 8, 3, 3 s: median 3, MAD 0, so the ideal is 3 s and steps 0 and 2 are anomalous. A window holds
# 10 ideal steps: 30 s, so two windows, [0, 30) and [30, 49).
RESTART_WINDOWS = [
    {"window_start": iso(0), "window_end": iso(30), "total_s": 30.0, "productive_s": 6.0, "goodput_ratio": 0.2,
     "badput_s": badput(wasted_progress=6.0, infrastructure_recovery=8.0, program_startup=5.0, other=5.0)},
    {"window_start": iso(30), "window_end": iso(49), "total_s": 19.0, "productive_s": 9.0, "goodput_ratio": 9 / 19,
     "badput_s": badput(program_startup=5.0, other=5.0)},
]
RESTART_STEPS = [{"step": 0, "step_time_s": 8.0, "deviation_s": 5.0}, {"step": 1, "step_time_s": 3.0, "deviation_s": 0.0},
                 {"step": 2, "step_time_s": 8.0, "deviation_s": 5.0}, {"step": 3, "step_time_s": 3.0, "deviation_s": 0.0},
                 {"step": 4, "step_time_s": 3.0, "deviation_s": 0.0}]
SAMPLE_WHY = ("too few steps for a rolling window: the run (20 s, 5 completed steps) fits in one window of 30 s, the shortest that "
              "holds 10 ideal steps of 3 s; rolling goodput needs two windows or more")


def check_restart(body: dict) -> None:
    """The service's read, the API's body or the CLI's --json against the figures worked out by hand."""
    assert body["job_id"] == "restart" and body["analyzer"] == "goodput"
    assert round(100 * body["result"]["goodput_ratio"], 3) == 30.612  # the published figure, beside its breakdown over time
    roll = body["rolling"]
    assert (roll["window_s"], roll["window_steps"], roll["ideal_step_time_s"], roll["windows_total"], roll["why"]) == (30.0, 10, 3.0, 2, None)
    assert roll["windows"] == RESTART_WINDOWS
    dev = body["step_time_deviation"]
    assert {k: v for k, v in dev.items() if k != "last"} == {
        "steps": 5, "ideal_step_time_s": 3.0, "anomaly_threshold_s": 3.0, "anomalous_steps": 2, "mean_deviation_s": 2.0,
        "max_deviation_s": 5.0, "max_deviation_step": 0, "why": None}
    assert dev["last"] == RESTART_STEPS


def check_sample(body: dict) -> None:
    assert round(100 * body["result"]["goodput_ratio"], 3) == 75.000
    roll = body["rolling"]
    assert roll["windows"] == [] and roll["windows_total"] == 0 and roll["why"] == SAMPLE_WHY
    dev = body["step_time_deviation"]
    assert (dev["steps"], dev["ideal_step_time_s"], dev["anomalous_steps"], dev["max_deviation_s"], dev["why"]) == (5, 3.0, 0, 0.0, None)
    assert [r["deviation_s"] for r in dev["last"]] == [0.0] * 5


def test_the_analysis_stores_what_the_service_reads(store) -> None:  # type: ignore[no-untyped-def]
    seed(store)
    out = job_reads.job_goodput(store, "restart")
    check_restart(out)
    check_sample(job_reads.job_goodput(store, "sample"))
    json.dumps(out, allow_nan=False)
    # the goodput part is the stored goodput analysis, unchanged
    assert {k: out[k] for k in ("job_id", "analyzer", "computed_at", "window_start", "window_end", "result")} == \
        analysis.stored_analysis(store, "restart", "goodput")
    # what the analysis returned is what was stored
    fresh = analysis.analyze_job(store, "restart", now=T0 + dt.timedelta(minutes=5)).to_dict()["goodput_trend"]
    assert fresh == {"rolling": {k: out["rolling"][k] for k in fresh["rolling"]}, "step_time_deviation": out["step_time_deviation"]}
    # fewer windows and steps: the newest
    few = job_reads.job_goodput(store, "restart", windows=1, steps=2)
    assert few["rolling"]["windows"] == RESTART_WINDOWS[1:] and few["rolling"]["windows_total"] == 2
    assert few["step_time_deviation"]["last"] == RESTART_STEPS[3:]
    none = job_reads.job_goodput(store, "restart", windows=0, steps=0)
    assert none["rolling"]["windows"] == [] and none["step_time_deviation"]["last"] == [] and none["step_time_deviation"]["steps"] == 5
    assert job_reads.job_goodput(store, "fresh") is None and job_reads.job_goodput(store, "nope") is None
    for kwargs, name in (({"windows": -1}, "windows"), ({"windows": 49}, "windows"), ({"steps": 101}, "steps"), ({"steps": 2.5}, "steps"),
                         ({"windows": True}, "windows")):
        with pytest.raises(ValueError, match=f"^{name} must be an integer from 0 to"):
            job_reads.job_goodput(store, "restart", **kwargs)


def test_a_goodput_analysed_before_the_trend_says_so(store) -> None:  # type: ignore[no-untyped-def]
    seed(store)
    with store.engine.begin() as conn:
        from sqlalchemy import text
        conn.execute(text("DELETE FROM job_analysis WHERE analyzer = 'goodput_trend'"))
    out = job_reads.job_goodput(store, "restart")
    assert round(100 * out["result"]["goodput_ratio"], 3) == 30.612
    assert out["rolling"]["windows"] == [] and out["rolling"]["why"].startswith("not computed yet")
    assert out["step_time_deviation"]["last"] == [] and out["step_time_deviation"]["why"] == out["rolling"]["why"]


def test_a_running_job_folded_minute_by_minute_gives_what_one_analysis_gives(store) -> None:  # type: ignore[no-untyped-def]
    # the restart run without its end, analysed every 10 s as its events arrive, and once whole at 47 s: step 4 is under way
    running = [r for r in RESTART if r[1] != "finished"]
    for t in range(10, 60, 10):
        ingestion.ingest_bytes(store, jsonl("inc", [r for r in running if t - 10 <= r[0] < t]), source=f"inc-{t}.jsonl")
        analysis.analyze_job(store, "inc", now=T0 + dt.timedelta(seconds=min(t, 47)), incremental=True)
    ingestion.ingest_bytes(store, jsonl("whole", running), source="whole.jsonl")
    analysis.analyze_job(store, "whole", now=T0 + dt.timedelta(seconds=47))
    inc, whole = job_reads.job_goodput(store, "inc"), job_reads.job_goodput(store, "whole")
    assert {k: inc[k] for k in ("rolling", "step_time_deviation")} == {k: whole[k] for k in ("rolling", "step_time_deviation")}
    # steps 0-3 measured (8, 3, 8, 3 s), step 4 (begun at 46 s) not: median 5.5, MAD 2.5, none above 13 s, so the
    # ideal is their mean, 5.5 s; 10 of them are 55 s, a window of 60 s, longer than the 47 s run
    dev = whole["step_time_deviation"]
    assert [(r["step"], r["deviation_s"]) for r in dev["last"]] == [(0, 2.5), (1, -2.5), (2, 2.5), (3, -2.5)]
    assert (dev["ideal_step_time_s"], dev["anomaly_threshold_s"], dev["anomalous_steps"], dev["max_deviation_step"]) == (5.5, 13.0, 0, 0)
    assert whole["rolling"]["windows"] == [] and whole["rolling"]["why"] == (
        "too few steps for a rolling window: the run (47 s, 4 completed steps) fits in one window of 60 s, the shortest that "
        "holds 10 ideal steps of 5.5 s; rolling goodput needs two windows or more")


def test_the_doors_offer_the_services_bounds() -> None:
    # The CLI keeps the services out of --help, so it names the bounds itself; the API takes them from the service.
    assert cli_jobs._GOODPUT_WINDOWS_MAX == job_reads.GOODPUT_WINDOWS_MAX == goodput_trend.MAX_WINDOWS == 48
    assert cli_jobs._GOODPUT_STEPS_MAX == job_reads.GOODPUT_STEPS_MAX == 100
    opts = {p.name: p for p in cli_jobs.goodput.params}
    assert (opts["windows"].type.min, opts["windows"].type.max, opts["windows"].default) == (0, 48, 48)
    assert (opts["steps"].type.min, opts["steps"].type.max, opts["steps"].default) == (0, 100, 100)
    app = FastAPI()
    app.include_router(routes_jobs.router)
    params = {p["name"]: p for p in app.openapi()["paths"]["/api/v1/jobs/{job_id}/goodput"]["get"]["parameters"]}
    assert {k: params["windows"]["schema"][k] for k in ("default", "minimum", "maximum")} == {"default": 48, "minimum": 0, "maximum": 48}
    assert {k: params["steps"]["schema"][k] for k in ("default", "minimum", "maximum")} == {"default": 100, "minimum": 0, "maximum": 100}


def test_api_cli_and_service_give_the_same_hand_computed_figures(api, db_url, tmp_path) -> None:  # type: ignore[no-untyped-def]
    store = api.app.state.store
    seed(store)
    read = {"Authorization": "Bearer " + auth.create_token(store.engine, "r", ["read"])}
    env = {**os.environ, "FLEETSCOPE_DATA_DIR": str(tmp_path), "FLEETSCOPE_DATABASE_URL": db_url}

    def get(job_id: str, **params):  # type: ignore[no-untyped-def]
        return httpx.get(api.url + f"/api/v1/jobs/{job_id}/goodput", params=params, headers=read, timeout=30)

    r = get("restart")
    assert r.status_code == 200, r.text
    body = r.json()
    check_restart(body)
    assert body == job_reads.job_goodput(store, "restart")
    out = clirun.cli("jobs", "goodput", "restart", "--json", env=env)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == body
    few = get("restart", windows=1, steps=2).json()
    assert few == job_reads.job_goodput(store, "restart", windows=1, steps=2)
    assert json.loads(clirun.cli("jobs", "goodput", "restart", "--windows", "1", "--steps", "2", "--json", env=env).stdout) == few
    assert few["rolling"]["windows"] == RESTART_WINDOWS[1:] and few["step_time_deviation"]["last"] == RESTART_STEPS[3:]
    sample = get("sample").json()
    check_sample(sample)
    assert json.loads(clirun.cli("jobs", "goodput", "sample", "--json", env=env).stdout) == sample

    # the text: the goodput line, then each window and each step
    lines = clirun.cli("jobs", "goodput", "restart", env=env).stdout.splitlines()
    assert lines[0].startswith("job restart (analysed 2024-01-01T01:05:00")
    assert lines[1] == "  goodput 30.6% of 49 s; badput: other 10 s, program_startup 10 s, infrastructure_recovery 8 s"
    assert lines[2] == "  rolling goodput over windows of 30 s (2 in all, the newest 2 shown): newest 47.4%, lowest 20.0%"
    assert [ln.split() for ln in lines[4:6]] == [["2024-01-01T01:00:00+00:00", "30", "s", "20.0%", "infrastructure_recovery", "8", "s"],
                                                 ["2024-01-01T01:00:30+00:00", "19", "s", "47.4%", "other", "5", "s"]]  # 5 s each: by name
    assert lines[6] == "  step time: ideal 3 s over 5 steps; 2 above 3 s (median + 3 MAD); largest deviation +5 s at step 0"
    assert [ln.split() for ln in lines[8:]] == [["0", "8", "s", "+5", "s"], ["1", "3", "s", "+0", "s"], ["2", "8", "s", "+5", "s"],
                                                ["3", "3", "s", "+0", "s"], ["4", "3", "s", "+0", "s"]]
    text = clirun.cli("jobs", "goodput", "sample", env=env).stdout
    assert f"  rolling goodput: none ({SAMPLE_WHY})" in text.splitlines()
    # jobs analyze prints the same figures, in one line each
    analyzed = clirun.cli("jobs", "analyze", "restart", env=env).stdout.splitlines()
    assert lines[2] in analyzed and lines[6] in analyzed


def test_api_and_cli_refuse_bad_input_naming_it(api, db_url, tmp_path) -> None:  # type: ignore[no-untyped-def]
    store = api.app.state.store
    seed(store)
    read = {"Authorization": "Bearer " + auth.create_token(store.engine, "r", ["read"])}
    ingest = {"Authorization": "Bearer " + auth.create_token(store.engine, "i", ["ingest"])}
    url = api.url + "/api/v1/jobs/restart/goodput"
    assert httpx.get(url, timeout=30).status_code == 401
    assert httpx.get(url, headers=ingest, timeout=30).status_code == 403

    def refused(params: dict, name: str) -> None:
        r = httpx.get(url, params=params, headers=read, timeout=30)
        assert r.status_code == 422, r.text
        assert [d["loc"] for d in r.json()["detail"]] == [["query", name]], r.text

    for bad in ("-1", "49", "abc", "2.5", ""):
        refused({"windows": bad}, "windows")
    for bad in ("-1", "101", "x", "1e2"):
        refused({"steps": bad}, "steps")
    assert httpx.get(url, params={"windows": "0", "steps": "100"}, headers=read, timeout=30).status_code == 200
    r = httpx.get(api.url + "/api/v1/jobs/nope/goodput", headers=read, timeout=30)
    assert r.status_code == 404 and r.json()["detail"] == "no job 'nope': nothing ingested under that id"
    r = httpx.get(api.url + "/api/v1/jobs/fresh/goodput", headers=read, timeout=30)
    assert r.status_code == 404 and "has no goodput analysis yet" in r.json()["detail"]

    env = {**os.environ, "FLEETSCOPE_DATA_DIR": str(tmp_path), "FLEETSCOPE_DATABASE_URL": db_url}
    run = lambda *a: clirun.cli("jobs", "goodput", *a, env=env)  # noqa: E731
    for args, option in ((("--windows", "49"), "--windows"), (("--windows", "-1"), "--windows"), (("--steps", "101"), "--steps"),
                         (("--steps", "x"), "--steps")):
        out = run("restart", *args)
        assert out.returncode == 2 and option in out.stderr and out.stdout == "", out.stderr
    out = run("nope")
    assert out.returncode == 1 and "no job 'nope': nothing ingested under that id" in out.stderr
    out = run("fresh")
    assert out.returncode == 1 and "has no goodput analysis yet: `fleetscope jobs analyze fresh`" in out.stderr
    help_ = clirun.cli("jobs", "--help", env=env)
    assert "fleetscope jobs goodput job-llm-a" in help_.stdout


def test_interval_goodput_from_every_door_on_the_hand_worked_timeline(api, db_url, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """ml-goodput-measurement's interval goodput (``get_job_goodput_interval``) of the restart run, through the
    service, ``GET /api/v1/jobs/{id}/goodput/interval`` and ``fleetscope jobs goodput --start --end``, against the
    timeline worked out by hand above; and what each door refuses."""
    store = api.app.state.store
    seed(store)
    read = {"Authorization": "Bearer " + auth.create_token(store.engine, "r", ["read"])}
    env = {**os.environ, "FLEETSCOPE_DATA_DIR": str(tmp_path), "FLEETSCOPE_DATABASE_URL": db_url}
    url = api.url + "/api/v1/jobs/restart/goodput/interval"
    now = T0 + dt.timedelta(hours=1)
    # [13, 43): step 1 productive 3 s, steps 2-3 wasted 6 s, recovery 8 s, other 5 s, step 2 again 5 s startup + 3 s
    mid = job_reads.interval_goodput(store, "restart", T0 + dt.timedelta(seconds=13), T0 + dt.timedelta(seconds=43), now=now)
    assert (mid["window_start"], mid["window_end"], mid["total_s"], mid["productive_s"]) == (iso(13), iso(43), 30.0, 6.0)
    assert mid["goodput_ratio"] == pytest.approx(0.2) and mid["finished"] and mid["disruptions"] == 1
    assert mid["badput_s"] == badput(wasted_progress=6.0, infrastructure_recovery=8.0, other=5.0, program_startup=5.0)
    # past the run's end: clipped to it, [43, 49) is steps 3 and 4 again, all productive
    tail = job_reads.interval_goodput(store, "restart", T0 + dt.timedelta(seconds=43), T0 + dt.timedelta(minutes=9), now=now)
    assert (tail["window_end"], tail["total_s"], tail["goodput_ratio"], tail["last_step"]) == (iso(49), 6.0, 1.0, 4)
    # the halves of the rolling windows, and the whole run's published 30.612 %
    assert [job_reads.interval_goodput(store, "restart", T0 + dt.timedelta(seconds=a), T0 + dt.timedelta(seconds=b), now=now)["goodput_ratio"]
            for a, b in ((0, 30), (30, 49), (0, 49))] == [pytest.approx(0.2), pytest.approx(9 / 19), pytest.approx(15 / 49)]
    r = httpx.get(url, params={"start": iso(13), "end": iso(43)}, headers=read, timeout=30)
    assert r.status_code == 200, r.text
    assert r.json() == mid
    # the same instants written with another offset: the same interval, given back in UTC
    plus2 = {"start": (T0 + dt.timedelta(seconds=13)).astimezone(dt.timezone(dt.timedelta(hours=2))).isoformat(),
             "end": (T0 + dt.timedelta(seconds=43)).astimezone(dt.timezone(dt.timedelta(hours=2))).isoformat()}
    assert "+02:00" in plus2["start"]
    r = httpx.get(url, params=plus2, headers=read, timeout=30)
    assert r.status_code == 200, r.text
    assert r.json() == mid
    out = clirun.cli("jobs", "goodput", "restart", "--start", plus2["start"], "--end", plus2["end"], "--json", env=env)
    assert out.returncode == 0 and json.loads(out.stdout) == mid, out.stderr
    # a job the analysis never folded is read from its events alone, to the same figures as one it folded
    fresh = job_reads.interval_goodput(store, "fresh", T0 + dt.timedelta(seconds=5), T0 + dt.timedelta(seconds=17), now=now)
    sample = job_reads.interval_goodput(store, "sample", T0 + dt.timedelta(seconds=5), T0 + dt.timedelta(seconds=17), now=now)
    assert {k: v for k, v in fresh.items() if k != "job_id"} == {k: v for k, v in sample.items() if k != "job_id"}
    assert fresh["productive_s"] == 12.0 and fresh["goodput_ratio"] == 1.0  # steps 0-3 at 5, 8, 11, 14 s: 3 s each
    out = clirun.cli("jobs", "goodput", "restart", "--start", iso(13), "--end", iso(43), "--json", env=env)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == mid
    text = clirun.cli("jobs", "goodput", "restart", "--start", iso(13), "--end", iso(43), env=env).stdout.splitlines()
    assert text == [f"job restart from {iso(13)} to {iso(43)}",
                    "  goodput 20.0% of 30 s; badput: infrastructure_recovery 8 s, wasted_progress 6 s, program_startup 5 s"]  # a tie: bucket order

    def refused(params: dict, status: int, words: str) -> None:
        r = httpx.get(url, params=params, headers=read, timeout=30)
        assert r.status_code == status and words in r.text, r.text

    refused({"start": iso(100), "end": iso(200)}, 400, "does not overlap")
    refused({"start": iso(20), "end": iso(10)}, 400, "end must be after start")
    refused({"start": "2024-01-01T01:00:00", "end": iso(10)}, 400, "start needs a time zone")
    refused({"start": "yesterday", "end": iso(10)}, 422, "start")
    refused({"end": iso(10)}, 422, "start")
    assert httpx.get(url, params={"start": iso(0), "end": iso(10)}, timeout=30).status_code == 401
    r = httpx.get(api.url + "/api/v1/jobs/nope/goodput/interval", params={"start": iso(0), "end": iso(10)}, headers=read, timeout=30)
    assert r.status_code == 404
    # events without a start give no timeline: not the caller's window's fault
    ingestion.ingest_bytes(store, jsonl("nostart", [(5, "step", 0), (8, "step", 1)]), source="nostart.jsonl")
    r = httpx.get(api.url + "/api/v1/jobs/nostart/goodput/interval", params={"start": iso(0), "end": iso(10)}, headers=read, timeout=30)
    assert r.status_code == 404 and "no goodput timeline" in r.text, r.text
    for args, words in ((("--start", iso(0)), "give --start and --end together"), (("--start", iso(20), "--end", iso(10)), "must be after --start"),
                        (("--start", iso(100), "--end", iso(200)), "does not overlap"), (("--start", "2024-01-01", "--end", iso(10)), "time zone")):
        out = clirun.cli("jobs", "goodput", "restart", *args, env=env)
        assert out.returncode != 0 and words in out.stderr, (args, out.stderr)

"""Scaling across the runs of one model and the Fleet Law fit, reached from the API
(``GET /api/v1/models/{name}/scaling``) and the CLI (``fleetscope jobs scaling``) as from the Jobs page: the same
service functions with the same defaults, on a store seeded with step records whose figures are worked out by
hand here (T_step(N) = a/N + b·2(N−1) + c, the ring Fleet Law of analyzers.c3.fit_fleet_law)."""

from __future__ import annotations

import datetime as dt
import json
import math
import os

import httpx
import numpy as np
import polars as pl
import pytest
from fastapi import FastAPI

from analyzers import c3
from fleetscope.api import routes_jobs
from fleetscope.cli import jobs as cli_jobs
from fleetscope.core import frames as F
from fleetscope.core.errors import NotFound
from fleetscope.services import auth
from fleetscope.services import job_reads
from tests import clirun

T0 = dt.datetime(2025, 5, 1, 8, tzinfo=dt.UTC)
MODEL = "toy-13b"
# The sweep's Fleet Law: a/N + b·2(N−1) + c with N* = sqrt(a / 2b) = 20 GPUs.
A_S, B_S, C_S = 8.0, 0.01, 0.5
SIZES = (2, 4, 8, 16)
# Mean step time per world size, by hand: 8/2 + 0.01·2 + 0.5, 8/4 + 0.01·6 + 0.5, 8/8 + 0.01·14 + 0.5, 8/16 + 0.01·30 + 0.5.
STEP_S = {2: 4.52, 4: 2.56, 8: 1.64, 16: 1.30}
# η = T1 / (N · T_N) with no 1-GPU run: T1 = 2 · 4.52 = 9.04 s, the smallest run's N·T.
ETA = {2: 1.0, 4: 9.04 / (4 * 2.56), 8: 9.04 / (8 * 1.64), 16: 9.04 / (16 * 1.30)}


def _steps(job_id: str, mean_s: float, ranks: int = 2) -> list[dict]:
    """Three steps per rank lasting mean − 0.1, mean and mean + 0.1 s: their mean is ``mean_s``."""
    rows, t = [], T0
    for step, d in enumerate((mean_s - 0.1, mean_s, mean_s + 0.1)):
        for rank in range(ranks):
            rows.append({"job_id": job_id, "rank": rank, "step": step, "start": t, "end": t + dt.timedelta(seconds=d),
                         "compute_s": d * 0.8, "comm_s": d * 0.1, "comm_overlap_s": 0.0, "idle_s": d * 0.1})
        t += dt.timedelta(seconds=d)
    return rows


def seed(store) -> None:  # type: ignore[no-untyped-def]
    """MODEL at world sizes 2, 4, 8, 16, plus what the read must leave out: a run of MODEL without a world size
    (100 s steps), one without step records, another model's run; ``pair`` at two world sizes, ``idle`` with no steps."""
    jobs = [{"job_id": f"toy-n{n}", "model_name": MODEL, "world_size": n} for n in SIZES]
    jobs += [{"job_id": "toy-nosize", "model_name": MODEL, "world_size": None},
             {"job_id": "toy-nosteps", "model_name": MODEL, "world_size": 32},
             {"job_id": "other-n4", "model_name": "other", "world_size": 4},
             {"job_id": "pair-n8", "model_name": "pair", "world_size": 8},
             {"job_id": "pair-n16", "model_name": "pair", "world_size": 16},
             {"job_id": "idle-n8", "model_name": "idle", "world_size": 8}]
    steps = [r for n in SIZES for r in _steps(f"toy-n{n}", STEP_S[n])]
    steps += _steps("toy-nosize", 100.0) + _steps("other-n4", 50.0) + _steps("pair-n8", 2.0) + _steps("pair-n16", 1.25)
    store.write(F.Batch(job=pl.DataFrame(jobs, schema={k: F.JOB.schema[k] for k in ("job_id", "model_name", "world_size")}),
                        step=pl.DataFrame(steps)))


def check_hand_computed(out: dict) -> None:
    """``out`` (the service's report, the API's body or the CLI's --json) against the figures worked out by hand."""
    assert out["model_name"] == MODEL and out["comm_term"] == "ring" and out["why"] is None
    runs = out["runs"]
    assert [r["job_id"] for r in runs] == [f"toy-n{n}" for n in SIZES]
    assert [r["world_size"] for r in runs] == list(SIZES)
    assert [r["step_time_mean_s"] for r in runs] == pytest.approx([STEP_S[n] for n in SIZES], abs=1e-9)
    assert [r["efficiency_ratio"] for r in runs] == pytest.approx([ETA[n] for n in SIZES], rel=1e-9)
    fit = out["fit"]
    assert (fit["a_s"], fit["b_s"], fit["c_s"]) == pytest.approx((A_S, B_S, C_S), rel=1e-6)
    assert fit["r2"] == pytest.approx(1.0, abs=1e-9) and fit["comm_term"] == "ring"
    assert fit["n_opt"] == pytest.approx(math.sqrt(A_S / (2 * B_S)), rel=1e-6) and fit["n_opt"] == pytest.approx(20.0, rel=1e-6)
    curve = out["curve"]
    # 64 points log-even from half the smallest run (1) to twice the largest (32; N* · 1.5 = 30 is inside), plus the runs' 4 sizes
    sizes = [p["world_size"] for p in curve]
    assert len(curve) == 68 and sizes == sorted(sizes) and sizes[0] == pytest.approx(1.0) and sizes[-1] == pytest.approx(32.0)
    at = {p["world_size"]: p for p in curve}
    for n in SIZES:  # the curve passes through each run, at its measured step time and η
        assert at[float(n)]["step_time_s"] == pytest.approx(STEP_S[n], rel=1e-6)
        assert at[float(n)]["efficiency_ratio"] == pytest.approx(ETA[n], rel=1e-6)
    best = min(curve, key=lambda p: p["step_time_s"])
    assert 19 < best["world_size"] < 21 and best["step_time_s"] >= A_S / 20 + B_S * 2 * 19 + C_S - 1e-9  # T(N*) = 1.28 s


def test_service_report_is_the_dashboards_fit_as_json(store) -> None:  # type: ignore[no-untyped-def]
    seed(store)
    out = job_reads.scaling_report(store, MODEL)
    check_hand_computed(out)
    # the Jobs page calls scaling_fit(store, model_name=...) with its defaults: the report is that, row for row
    sf = job_reads.scaling_fit(store, model_name=MODEL)
    assert out["runs"] == sf["runs"].to_dicts() and out["curve"] == sf["curve"].to_dicts() and out["fit"] == sf["fit"]
    assert job_reads.scaling(store, MODEL).to_dicts() == out["runs"]
    json.dumps(out, allow_nan=False)  # plain JSON: no NaN, no infinity
    pair = job_reads.scaling_report(store, "pair")
    assert [(r["job_id"], r["world_size"]) for r in pair["runs"]] == [("pair-n8", 8), ("pair-n16", 16)]
    assert [r["efficiency_ratio"] for r in pair["runs"]] == pytest.approx([1.0, 16.0 / (16 * 1.25)])
    assert pair["fit"] is None and pair["why"] == "2 distinct world sizes of pair; the fit needs three" and pair["curve"] == []
    idle = job_reads.scaling_report(store, "idle")
    assert idle["runs"] == [] and idle["fit"] is None and idle["why"] == "0 distinct world sizes of idle; the fit needs three"
    with pytest.raises(NotFound, match="no job of model 'nope' in the job inventory"):
        job_reads.scaling_report(store, "nope")
    with pytest.raises(ValueError, match="comm_term must be one of ring, tree, ring_bandwidth"):
        job_reads.scaling_report(store, MODEL, comm_term="star")
    with pytest.raises(ValueError, match="points must be from 2 to 1000"):
        job_reads.scaling_report(store, MODEL, points=1)


def test_the_doors_offer_the_services_choices() -> None:
    # The CLI keeps analyzers out of --help, so it names the comm terms and the points' bound itself; the API takes
    # them from the service. All must be analyzers.c3's and the service's.
    assert cli_jobs._COMM_TERMS == c3.COMM_TERMS == job_reads.FIT_COMM_TERMS == ("ring", "tree", "ring_bandwidth")
    opts = {p.name: p for p in cli_jobs.scaling.params}
    assert (opts["points"].type.min, opts["points"].type.max) == (2, job_reads.FIT_POINTS_MAX)
    assert f"default {job_reads.FIT_POINTS}," in opts["points"].help and f"{job_reads.FIT_COMM_TERM} 2(N-1) (default" in opts["comm_term"].help
    app = FastAPI()
    app.include_router(routes_jobs.models)
    params = {p["name"]: p for p in app.openapi()["paths"]["/api/v1/models/{name}/scaling"]["get"]["parameters"]}
    assert {k: params["points"]["schema"][k] for k in ("default", "minimum", "maximum")} == {
        "default": job_reads.FIT_POINTS, "minimum": 2, "maximum": job_reads.FIT_POINTS_MAX}
    assert params["comm_term"]["schema"]["default"] == job_reads.FIT_COMM_TERM
    assert params["comm_term"]["schema"]["pattern"] == "^(ring|tree|ring_bandwidth)$"
    assert params["name"]["schema"]["maxLength"] == 500


def test_api_cli_and_service_give_the_same_hand_computed_figures(api, db_url, tmp_path) -> None:  # type: ignore[no-untyped-def]
    store = api.app.state.store
    seed(store)
    read = {"Authorization": "Bearer " + auth.create_token(store.engine, "r", ["read"])}
    url = api.url + f"/api/v1/models/{MODEL}/scaling"
    r = httpx.get(url, headers=read, timeout=30)
    assert r.status_code == 200, r.text
    body = r.json()
    check_hand_computed(body)
    service = job_reads.scaling_report(store, MODEL)
    assert body == service
    env = {**os.environ, "FLEETSCOPE_DATA_DIR": str(tmp_path), "FLEETSCOPE_DATABASE_URL": db_url}
    out = clirun.cli("jobs", "scaling", MODEL, "--json", env=env)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == body
    # the table: each run with its N, mean step and η, then the fit and N*
    text = clirun.cli("jobs", "scaling", MODEL, env=env)
    assert text.returncode == 0, text.stderr
    lines = text.stdout.splitlines()
    assert lines[0] == f"model {MODEL}: 4 runs with step records"
    assert lines[1].split() == ["job", "N", "mean", "step", "η"]
    assert [ln.split() for ln in lines[2:6]] == [["toy-n2", "2", "4.52", "s", "1.000"], ["toy-n4", "4", "2.56", "s", "0.883"],
                                                 ["toy-n8", "8", "1.64", "s", "0.689"], ["toy-n16", "16", "1.3", "s", "0.435"]]
    assert lines[6] == "Fleet Law (ring): T_step(N) = a/N + b·2(N−1) + c"
    assert lines[7].split() == ["a", "8", "s", "b", "0.01", "s", "c", "0.5", "s", "R²", "1.0000"]
    assert lines[8] == "  N* 20.0 GPUs: past it, adding GPUs makes every step slower"
    # another comm term and fewer points: the same in all three, and the tree fit is least squares on [1/N, log2 N, 1]
    q = {"comm_term": "tree", "points": 8}
    tree = httpx.get(url, params=q, headers=read, timeout=30).json()
    assert tree == job_reads.scaling_report(store, MODEL, points=8, comm_term="tree")
    assert json.loads(clirun.cli("jobs", "scaling", MODEL, "--comm-term", "tree", "--points", "8", "--json", env=env).stdout) == tree
    n = np.array(SIZES, dtype=float)
    (a, b, c), *_ = np.linalg.lstsq(np.column_stack([1 / n, np.log2(n), np.ones_like(n)]), np.array([STEP_S[s] for s in SIZES]), rcond=None)
    assert tree["comm_term"] == tree["fit"]["comm_term"] == "tree" and len(tree["curve"]) == 8 + 4
    assert (tree["fit"]["a_s"], tree["fit"]["b_s"], tree["fit"]["c_s"]) == pytest.approx((a, b, c), rel=1e-6)
    assert tree["fit"]["n_opt"] == pytest.approx(a * math.log(2) / b, rel=1e-6) if b > 0 else tree["fit"]["n_opt"] is None
    # two world sizes: runs and η, no fit, and why
    pair = httpx.get(api.url + "/api/v1/models/pair/scaling", headers=read, timeout=30).json()
    assert pair["fit"] is None and pair["why"] == "2 distinct world sizes of pair; the fit needs three"
    assert [r["efficiency_ratio"] for r in pair["runs"]] == pytest.approx([1.0, 0.8])
    pair_text = clirun.cli("jobs", "scaling", "pair", env=env).stdout
    assert pair_text.splitlines()[-1] == "no Fleet Law fit: 2 distinct world sizes of pair; the fit needs three"


def test_api_refuses_bad_input_and_tokens_as_other_job_reads(api) -> None:  # type: ignore[no-untyped-def]
    store = api.app.state.store
    seed(store)
    read = {"Authorization": "Bearer " + auth.create_token(store.engine, "r", ["read"])}
    ingest = {"Authorization": "Bearer " + auth.create_token(store.engine, "i", ["ingest"])}
    admin = {"Authorization": "Bearer " + auth.create_token(store.engine, "a", ["admin"])}
    url = api.url + f"/api/v1/models/{MODEL}/scaling"

    def get(path: str, headers=read, **params):  # type: ignore[no-untyped-def]
        return httpx.get(api.url + path, params=params, headers=headers, timeout=30)

    # scope: read, as GET /api/v1/jobs/{id}/c3 and the other job reads; admin admits everything
    for u in (url, api.url + "/api/v1/jobs/toy-n2/sdc"):
        assert httpx.get(u, timeout=30).status_code == 401
        assert httpx.get(u, headers={"Authorization": "Bearer not-a-token"}, timeout=30).status_code == 401
        assert httpx.get(u, headers=ingest, timeout=30).status_code == 403
        assert httpx.get(u, headers=read, timeout=30).status_code == 200
        assert httpx.get(u, headers=admin, timeout=30).status_code == 200
    r = httpx.get(url, headers=ingest, timeout=30)
    assert r.json()["detail"] == "token 'i' lacks the 'read' scope"

    # unknown model: 404 naming it; a known model without step records: 200 with why
    r = get("/api/v1/models/nope/scaling")
    assert r.status_code == 404 and r.json() == {"detail": "no job of model 'nope' in the job inventory"}
    assert get("/api/v1/models/idle/scaling").json()["why"] == "0 distinct world sizes of idle; the fit needs three"

    def refused(r: httpx.Response, where: str, name: str) -> None:
        assert r.status_code == 422, r.text
        assert [d["loc"] for d in r.json()["detail"]] == [[where, name]], r.text

    for bad in ("abc", "1", "1001", "-5", "2.5", ""):
        refused(get(f"/api/v1/models/{MODEL}/scaling", points=bad), "query", "points")
    for bad in ("star", "RING", "ring ", "ring|tree", ""):
        refused(get(f"/api/v1/models/{MODEL}/scaling", comm_term=bad), "query", "comm_term")
    assert get(f"/api/v1/models/{MODEL}/scaling", points="2").status_code == 200
    assert get(f"/api/v1/models/{MODEL}/scaling", points="1000").status_code == 200
    assert len(get(f"/api/v1/models/{MODEL}/scaling", points="1000").json()["curve"]) == 1000 + 4

    # hostile names: over-long and control characters are 422 naming the name, before any read
    refused(get("/api/v1/models/" + "m" * 501 + "/scaling"), "path", "name")
    assert get("/api/v1/models/" + "m" * 500 + "/scaling").status_code == 404
    refused(get("/api/v1/models/a%00b/scaling"), "path", "name")
    refused(get("/api/v1/models/a%1b%5b31mred/scaling"), "path", "name")
    # path-traversal-like names: an encoded slash decodes into a path no route serves; a backslash or a quote is
    # text of a model no job names (the name is only ever a bound SQL parameter, never a file)
    for name in ("..%2F..%2Fetc%2Fpasswd", "%2E%2E%2F%2E%2E%2Fetc%2Fpasswd", "..%5C..%5Cwindows"):
        r = get(f"/api/v1/models/{name}/scaling")
        assert r.status_code == 404, (name, r.text)
        assert "root:" not in r.text
    r = get("/api/v1/models/x%27%20OR%20%271%27%3D%271/scaling")
    assert r.status_code == 404 and r.json()["detail"] == "no job of model \"x' OR '1'='1\" in the job inventory"
    r = get("/api/v1/models/" + "%C3%A9" * 300 + "/scaling")  # 300 characters, 600 bytes: within the name's limit
    assert r.status_code == 404 and len(r.json()["detail"]) < 300  # the name echoed cut at 200 characters


def test_cli_refuses_bad_input(store, db_url, tmp_path) -> None:  # type: ignore[no-untyped-def]
    seed(store)
    env = {**os.environ, "FLEETSCOPE_DATA_DIR": str(tmp_path), "FLEETSCOPE_DATABASE_URL": db_url}
    run = lambda *a: clirun.cli("jobs", "scaling", *a, env=env)  # noqa: E731
    out = run("nope")
    assert out.returncode == 1 and "no job of model 'nope' in the job inventory" in out.stderr and out.stdout == ""
    out = run("m" * 5000)
    assert out.returncode == 1 and "no job of model 'mmm" in out.stderr and len(out.stderr) < 400
    out = run("../../etc/passwd")
    assert out.returncode == 1 and "no job of model '../../etc/passwd'" in out.stderr
    for args, option in ((("--points", "1"), "--points"), (("--points", "abc"), "--points"), (("--points", "1001"), "--points"),
                         (("--comm-term", "star"), "--comm-term")):
        out = run(MODEL, *args)
        assert out.returncode == 2 and option in out.stderr, out.stderr
    out = run("a\x1b[31m")
    assert out.returncode == 2 and "MODEL" in out.stderr and "control characters" in out.stderr
    out = run("idle")
    assert out.returncode == 0 and out.stdout.splitlines() == ["model idle: 0 runs with step records",
                                                                "no Fleet Law fit: 0 distinct world sizes of idle; the fit needs three"]
    help_ = clirun.cli("jobs", "scaling", "--help", env=env)
    assert help_.returncode == 0 and "fleetscope jobs scaling llama-7b --json" in help_.stdout and "--comm-term" in help_.stdout
    assert "fleetscope jobs scaling llama-7b" in clirun.cli("jobs", "--help", env=env).stdout

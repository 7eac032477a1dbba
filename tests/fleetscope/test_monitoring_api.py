"""Post-market monitoring through the running API: predictions in through the ingest door, windows evaluated,
read back (windows, one window, drift, fairness with intervals, findings, the impossibility view), an
incident declared from a finding; and every refusal with its status."""

import datetime as dt

import httpx
import numpy as np
import pytest

from fleetscope.services import auth
from fleetscope.sim.predictions import credit_stream
from tests import clirun

NOW = dt.datetime.now(dt.UTC).replace(minute=0, second=0, microsecond=0)
T0 = NOW - dt.timedelta(hours=29)  # the last hour and its outcomes (30 min later) lie in the past


def headers(api, scope):
    return {"Authorization": "Bearer " + auth.create_token(api.app.state.store.engine, scope, [scope])}


@pytest.fixture
def fed(api):
    s = credit_stream("credit", "1", T0, hours=28, rate=100, rng=np.random.default_rng(5), drift_from_hour=26, bias=1.5)
    r = httpx.post(api.url + "/api/v1/ingest/model_monitoring", content=s.jsonl, headers=headers(api, "ingest"), timeout=60)
    assert r.status_code == 200, r.text
    return api, headers(api, "governance")


def test_evaluate_and_read_back(fed):
    api, h = fed
    base = api.url + "/api/v1/models/credit/1/monitoring"
    m = httpx.get(api.url + "/api/v1/monitoring/models", headers=h).json()
    assert m[0]["model_name"] == "credit" and m[0]["predictions"] == 2800
    r = httpx.post(base + "/evaluate", headers=h, timeout=120)
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["evaluated"] == 4 and out["reference"]["n"] == 2400 and out["findings"]["model_drift"] == 2
    w = httpx.get(base + "/windows", headers=h).json()
    assert [x["window_start"][:13] for x in w] == [(T0 + dt.timedelta(hours=h_)).isoformat()[:13] for h_ in range(24, 28)]
    assert ["drift" in x["status"] for x in w] == [False, False, True, True]
    one = httpx.get(base + f"/windows/{w[-1]['window_start']}", headers=h).json()
    assert one["n_predictions"] == 100 and {d["feature"] for d in one["drift"]} == {"income_keur", "debt_ratio", "age"}
    assert one["reference"]["n"] == 2400
    drift = httpx.get(base + "/drift", headers=h).json()
    assert len(drift) == 4 * 3 and all(d["psi"] is not None for d in drift)
    fair = httpx.get(base + "/fairness", headers=h).json()
    star = [x for x in fair if x["group"] == "*" and x["attribute"] == "sex"]
    assert len(star) == 4 and all(x["ci_low"] <= x["ci_high"] for x in star)
    f = httpx.get(base + "/findings", headers=h).json()
    assert {x["kind"] for x in f} >= {"model_drift"}
    view = httpx.get(base + "/impossibility", params={"attribute": "sex"}, headers=h).json()
    assert view["criteria"]["equalized_odds"]["holds"] is False and set(view["base_rates"]) == {"F", "M"}
    # an incident from the drift finding: the Art. 73 clock and its deadline
    drift_f = next(x for x in f if x["kind"] == "model_drift")
    r = httpx.post(api.url + "/api/v1/incidents", headers=h, json={"finding_kind": "model_drift", "subject": drift_f["subject"],
                                                                   "window_start": drift_f["window_start"], "kind": "widespread_infringement"})
    assert r.status_code == 201, r.text
    inc = r.json()
    assert inc["deadline_days"] == 2 and inc["paragraph"] == "Art. 73(3)" and inc["model"] == "credit" and inc["version"] == "1"
    aware = dt.datetime.fromisoformat(inc["value"]["aware_at"].replace("Z", "+00:00"))
    assert dt.datetime.fromisoformat(inc["report_due_at"].replace("Z", "+00:00")) == aware + dt.timedelta(days=2)


def test_refusals(fed):
    api, h = fed
    base = api.url + "/api/v1/models/credit/1/monitoring"
    assert httpx.get(base + "/windows").status_code == 401
    assert httpx.get(base + "/windows", headers=headers(api, "read")).status_code == 403
    assert httpx.post(api.url + "/api/v1/models/nope/1/monitoring/evaluate", headers=h).status_code == 404
    assert httpx.post(base + "/evaluate", params={"window_s": 5}, headers=h).status_code == 422
    r = httpx.post(base + "/evaluate", params={"start": "2026-11-02T00:00:00"}, headers=h)
    assert r.status_code == 400 and "zone" in r.json()["detail"]
    r = httpx.post(base + "/evaluate", params={"reference_start": T0.isoformat()}, headers=h)
    assert r.status_code == 400 and "both" in r.json()["detail"]
    r = httpx.post(base + "/evaluate", params={"reference_start": T0.isoformat(), "reference_end": (T0 + dt.timedelta(minutes=5)).isoformat()}, headers=h)
    assert r.status_code == 400 and "under 30" in r.json()["detail"]
    assert httpx.get(base + "/windows/2020-01-01T00:00:00Z", headers=h).status_code == 404
    assert httpx.get(base + "/impossibility", params={"attribute": "race"}, headers=h).status_code == 404
    assert httpx.get(base + "/impossibility", headers=h).status_code == 422
    assert httpx.get(base + "/windows", params={"limit": 0}, headers=h).status_code == 422
    inc = {"finding_kind": "model_drift", "subject": "model:credit:1", "window_start": T0.isoformat(), "kind": "death"}
    assert httpx.post(api.url + "/api/v1/incidents", headers=h, json=inc).status_code == 404  # no such finding
    assert httpx.post(api.url + "/api/v1/incidents", headers=h, json={**inc, "kind": "bad"}).status_code in (404, 422)
    assert httpx.post(api.url + "/api/v1/incidents", headers=h, json={**inc, "extra": 1}).status_code == 422
    assert httpx.post(api.url + "/api/v1/incidents", headers=h, json={**inc, "subject": "x" * 2000}).status_code == 422


def test_cli(tmp_path):
    import json
    import os

    env = {**os.environ, "FLEETSCOPE_DATA_DIR": str(tmp_path)}
    env.pop("FLEETSCOPE_DATABASE_URL", None)
    run = lambda *a: clirun.cli(*a, env=env)  # noqa: E731
    f = tmp_path / "credit.jsonl"
    f.write_bytes(credit_stream("credit", "1", T0, hours=28, rate=100, rng=np.random.default_rng(5), drift_from_hour=26, bias=1.5).jsonl)
    assert "no predictions stored" in run("monitoring", "models").stdout
    assert run("ingest", str(f)).returncode == 0
    assert "credit@1: 2800 predictions" in run("monitoring", "models").stdout
    assert "no evaluated window" in run("monitoring", "windows", "credit", "1").stdout
    out = run("monitoring", "evaluate", "credit", "1")
    assert out.returncode == 7, out.stderr  # findings were raised
    assert "4 window(s) of 3600 s" in out.stdout and "model_drift 2" in out.stdout
    w = json.loads(run("monitoring", "windows", "credit", "1", "--json").stdout)
    assert len(w) == 4 and "drift" in w[-1]["status"]
    found = json.loads(run("monitoring", "findings", "credit", "1", "--json").stdout)
    drift = next(x for x in found if x["kind"] == "model_drift")
    out = run("monitoring", "impossibility", "credit", "1", "--attribute", "sex")
    assert out.returncode == 0 and "equalized_odds" in out.stdout and "fails" in out.stdout
    out = run("monitoring", "incident", "model_drift", drift["subject"], str(drift["window_start"]).replace(" ", "T"), "--kind", "death", "--by", "qa")
    assert out.returncode == 0, out.stderr
    assert "(10 days, Art. 73(4))" in out.stdout
    bad = run("monitoring", "evaluate", "nope", "1")
    assert bad.returncode == 1 and "no predictions stored for nope@1" in bad.stderr
    assert run("monitoring", "evaluate", "credit", "1", "--start", "2026-01-01T00:00:00").returncode == 2  # no zone
    assert run("monitoring", "incident", "model_drift", "model:credit:1", "2020-01-01T00:00:00Z", "--kind", "death").returncode == 1

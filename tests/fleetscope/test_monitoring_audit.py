"""The AI Act audit reads post-market monitoring: Art. 72 passes on stored, recent windows and fails when
they stop; Art. 15 compares the declared accuracy with the accuracy measured in operation; an incident
declared from a monitoring finding starts the Art. 73 clock and the report shows its deadline."""

import datetime as dt
import json

import numpy as np
import polars as pl
import pytest

from fleetscope.door import ingestion
from fleetscope.services import audit as au
from fleetscope.services import governance as gs
from fleetscope.services import monitoring as MS
from fleetscope.sim.predictions import credit_stream
from governance.registry import ModelEntry
from tests.conftest import make_settings

T0 = dt.datetime(2026, 11, 2, tzinfo=dt.UTC)
NOW = T0 + dt.timedelta(hours=30)


def results(store, audit_id):
    return {r["rule_id"]: r for r in au.rule_results(store, audit_id).filter(pl.col("model") == "credit:1").iter_rows(named=True)}


@pytest.fixture
def deployed(store):
    gs.put_model(store, ModelEntry("credit", "1", intended_purpose="credit scoring of loan applicants"), actor="test")
    for kind, value in (("area", {"area": "essential_services", "point": "5(b)"}),
                        ("post_market_plan", {"active": True, "interval_days": 30, "last_review_at": (NOW - dt.timedelta(days=3)).isoformat()}),
                        ("accuracy_metrics", {"metrics": {"accuracy": 0.99}, "tolerance": 0.02})):
        au.declare(store, "credit", "1", kind, value, entered_by="compliance", now=T0)
    return store


def test_monitoring_is_the_evidence_of_art72_and_art15(deployed, tmp_path):
    store, settings = deployed, make_settings(tmp_path, str(deployed.engine.url))
    r = results(store, au.run_audit(store, settings, model="credit", version="1", now=NOW)["audit_id"])
    assert r["art72"]["status"] == "missing_evidence" and "POST /api/v1/ingest/model_monitoring" in r["art72"]["reason"]
    s = credit_stream("credit", "1", T0, hours=30, rate=120, rng=np.random.default_rng(7), drift_from_hour=27)
    ingestion.ingest_bytes(store, s.jsonl, source="credit.jsonl")
    MS.evaluate(store, "credit", "1", now=NOW)
    r = results(store, au.run_audit(store, settings, model="credit", version="1", now=NOW)["audit_id"])
    assert r["art72"]["status"] == "pass" and "6 windows" in r["art72"]["reason"] and "3 model_drift" in r["art72"]["reason"]
    acc = MS.evidence(store, "credit", "1", now=NOW)["recent_accuracy"]
    assert r["art15"]["status"] == "fail" and f"measured {acc:.3f} in operation" in r["art15"]["reason"]  # declared 0.99
    # the windows stop arriving: a week later Art. 72(2)'s active collection fails
    r = results(store, au.run_audit(store, settings, model="credit", version="1", now=NOW + dt.timedelta(days=7))["audit_id"])
    assert r["art72"]["status"] == "fail" and "not collecting" in r["art72"]["reason"]


def test_an_incident_from_a_finding_starts_the_art73_clock(deployed, tmp_path):
    store, settings = deployed, make_settings(tmp_path, str(deployed.engine.url))
    s = credit_stream("credit", "1", T0, hours=30, rate=120, rng=np.random.default_rng(7), drift_from_hour=27)
    ingestion.ingest_bytes(store, s.jsonl, source="credit.jsonl")
    MS.evaluate(store, "credit", "1", now=NOW)
    f = MS.findings(store, "credit", "1").filter(pl.col("kind") == "model_drift").row(0, named=True)
    d = au.declare_incident(store, "model_drift", f["subject"], f["window_start"], incident_kind="widespread_infringement",
                            entered_by="compliance", now=NOW)
    assert d.value["aware_at"] == "2026-11-03T06:00:00Z" and d.value["finding"].startswith("model_drift/model:credit:1/")
    out = au.run_audit(store, settings, model="credit", version="1", now=NOW + dt.timedelta(hours=1))
    r = results(store, out["audit_id"])["art73"]
    due = NOW + dt.timedelta(days=2)
    assert r["status"] == "pass" and r["due_at"] == due and "2 days, Art. 73(3)) due by 2026-11-05T06:00:00Z" in r["reason"]
    report = json.loads(au.report_file(store, settings, out["audit_id"], "json")[0])
    art73 = next(x for m in report["models"] for x in m["results"] if x["rule_id"] == "art73")
    assert art73["due_at"] == "2026-11-05T06:00:00Z"
    assert "2026-11-05 06:00" in au.report_file(store, settings, out["audit_id"], "html")[0].decode()
    # unreported past the deadline: Art. 73 fails
    r = results(store, au.run_audit(store, settings, model="credit", version="1", now=NOW + dt.timedelta(days=3))["audit_id"])["art73"]
    assert r["status"] == "fail" and "2-day deadline" in r["reason"]
    # the signed export carries the windows and findings the Art. 72 result rests on
    import io
    import zipfile

    bundle = zipfile.ZipFile(io.BytesIO(open(au.make_export(store, settings, audit_id=out["audit_id"], requested_by="t")["path"], "rb").read()))
    windows = pl.read_csv(bundle.read("evidence/monitoring_windows.csv"))
    assert windows.height == 6 and set(windows["model_name"]) == {"credit"}
    assert "model_drift" in set(pl.read_csv(bundle.read("evidence/monitoring_findings.csv"))["kind"])
    with pytest.raises(MS.NotFound):
        au.declare_incident(store, "model_drift", f["subject"], T0, incident_kind="death", entered_by="x", now=NOW)

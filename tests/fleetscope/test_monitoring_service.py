"""The post-market monitoring service: a deployed model's stored predictions and outcomes evaluated window by
window against its reference, stored as windows and findings, re-evaluated without duplicates (a finding no
longer raised is cleared), and read back the same way by every door."""

import datetime as dt

import numpy as np
import polars as pl
import pytest

from fleetscope.core.errors import NotFound
from fleetscope.door import ingestion
from fleetscope.services import monitoring as MS
from fleetscope.sim.predictions import credit_stream
from governance import monitoring as GM
from ingest.model_monitoring import parse

T0 = dt.datetime(2026, 11, 2, tzinfo=dt.UTC)
HOURS, RATE, DRIFT_HOUR = 30, 120, 27


@pytest.fixture(scope="module")
def stream():
    return credit_stream("credit", "1", T0, hours=HOURS, rate=RATE, rng=np.random.default_rng(7), drift_from_hour=DRIFT_HOUR)


@pytest.fixture
def fed(store, stream):
    ingestion.ingest_bytes(store, stream.jsonl, source="credit.jsonl")
    return store


def test_windows_after_the_reference_are_evaluated_and_drift_found_where_injected(fed, stream):
    now = T0 + dt.timedelta(hours=HOURS, minutes=5)
    out = MS.evaluate(fed, "credit", "1", now=now)
    assert out["reference"]["start"] == T0.isoformat() and out["reference"]["n"] == 24 * RATE
    assert out["evaluated"] == HOURS - 24
    w = MS.windows(fed, "credit", "1")
    assert w["window_start"].to_list() == [T0 + dt.timedelta(hours=h) for h in range(24, HOURS)]
    assert (w["n_predictions"] == RATE).all()
    drifted = {r["window_start"] for r in w.iter_rows(named=True) if "drift" in r["status"].split(",")}
    assert drifted == {T0 + dt.timedelta(hours=h) for h in range(DRIFT_HOUR, HOURS)}
    f = MS.findings(fed, "credit", "1").filter(pl.col("kind") == "model_drift")
    assert f.height == HOURS - DRIFT_HOUR and set(f["subject"]) == {"model:credit:1"}
    assert (f["severity"] == "critical").all() and "income_keur" in f["summary"][0]
    # the stored figures are the pure floor's on the same rows: the service adds storage, not meaning
    frames = parse(stream.jsonl)
    rows = frames["model_prediction"].join(frames["model_outcome"].select("prediction_id", "outcome"), on="prediction_id", how="left")
    ref_rows = rows.filter(pl.col("ts") < T0 + dt.timedelta(hours=24))
    ref = GM.reference(GM.window_data(ref_rows))
    s = T0 + dt.timedelta(hours=DRIFT_HOUR)
    win = rows.filter((pl.col("ts") >= s) & (pl.col("ts") < s + dt.timedelta(hours=1)))
    res = GM.evaluate_window(ref, GM.window_data(win), window_start=s, window_end=s + dt.timedelta(hours=1))
    got = w.filter(pl.col("window_start") == s).row(0, named=True)
    assert got["accuracy"] == pytest.approx(res.metrics["accuracy"]) and got["n_outcomes"] == res.metrics["n_outcomes"]
    assert got["feature_psi_max"] == pytest.approx(max(d.psi for d in res.drift))
    assert got["prediction_psi"] == pytest.approx(res.prediction_psi)
    d = MS.drift_over_time(fed, "credit", "1").filter((pl.col("window_start") == s) & (pl.col("feature") == "income_keur"))
    assert d["psi"][0] == pytest.approx(next(x.psi for x in res.drift if x.feature == "income_keur")) and d["drifted"][0]
    assert d["psi_pvalue"][0] == pytest.approx(next(x.psi_pvalue for x in res.drift if x.feature == "income_keur")) and d["psi_pvalue"][0] < 1e-4
    fair = MS.fairness_over_time(fed, "credit", "1").filter((pl.col("window_start") == s) & (pl.col("group") == "*"))
    # a percentile bootstrap of a largest difference need not straddle its point value (a 0 gap resamples above 0)
    assert set(fair["attribute"]) == {"sex", "age_band"} and (fair["ci_low"] <= fair["ci_high"]).all() and fair["ci_low"].is_not_null().all()


def test_re_evaluation_updates_and_clears(fed):
    now = T0 + dt.timedelta(hours=HOURS)
    MS.evaluate(fed, "credit", "1", now=now)
    before = fed.read("finding").height
    MS.evaluate(fed, "credit", "1", now=now)
    assert fed.read("finding").height == before and fed.read("monitoring_window").height == HOURS - 24
    # thresholds nothing reaches: the drift findings are rewritten as cleared, not left firing
    calm = GM.MonitoringConfig(psi_moderate=50, psi_significant=100, prediction_psi_max=100, fairness_max=None)
    MS.evaluate(fed, "credit", "1", now=now, config=calm)
    assert MS.findings(fed, "credit", "1").height == 0
    cleared = MS.findings(fed, "credit", "1", include_cleared=True)
    assert cleared.height == before and (cleared["severity"] == "info").all()
    assert cleared["summary"].str.starts_with("cleared on re-evaluation").all()


def test_only_closed_windows_and_the_lookback(fed):
    out = MS.evaluate(fed, "credit", "1", now=T0 + dt.timedelta(hours=26, minutes=59))
    assert [w["window_start"] for w in out["windows"]] == [(T0 + dt.timedelta(hours=h)).isoformat() for h in (24, 25)]
    out = MS.evaluate(fed, "credit", "1", now=T0 + dt.timedelta(hours=HOURS), lookback_s=2 * 3600)
    assert [w["window_start"] for w in out["windows"]] == [(T0 + dt.timedelta(hours=h)).isoformat() for h in (HOURS - 2, HOURS - 1)]


def test_evaluate_all_and_refusals(fed):
    small = credit_stream("tiny", "1", T0, hours=2, rate=10, rng=np.random.default_rng(1))
    ingestion.ingest_bytes(fed, small.jsonl, source="tiny.jsonl")
    out = MS.evaluate_all(fed, now=T0 + dt.timedelta(hours=HOURS), lookback_s=3 * 86400)
    assert [m["model"] for m in out["models"]] == ["credit"] and out["models"][0]["evaluated"] == HOURS - 24
    assert "holds 20 predictions" in out["skipped"]["tiny@1"]
    with pytest.raises(NotFound, match="no predictions stored for nope@1"):
        MS.evaluate(fed, "nope", "1")
    with pytest.raises(MS.MonitoringError, match="window_s"):
        MS.evaluate(fed, "credit", "1", window_s=5)
    with pytest.raises(MS.MonitoringError, match="at most"):
        MS.evaluate(fed, "credit", "1", window_s=60, now=T0 + dt.timedelta(days=30))
    with pytest.raises(NotFound):
        MS.window_detail(fed, "credit", "1", T0)


def test_impossibility_view_on_a_biased_version(store):
    biased = credit_stream("credit", "2", T0, hours=24, rate=100, rng=np.random.default_rng(3), bias=1.5)
    ingestion.ingest_bytes(store, biased.jsonl, source="credit-2.jsonl")
    view = MS.impossibility(store, "credit", "2", "sex")
    assert view["criteria"]["equalized_odds"]["holds"] is False
    assert view["groups"]["F"]["tpr"] < view["groups"]["M"]["tpr"] - 0.1
    with pytest.raises(NotFound, match="no group attribute"):
        MS.impossibility(store, "credit", "2", "race")


def test_evidence_for_the_audit(fed):
    now = T0 + dt.timedelta(hours=HOURS)
    assert MS.evidence(fed, "credit", "1", now=now) is None
    MS.evaluate(fed, "credit", "1", now=now)
    ev = MS.evidence(fed, "credit", "1", now=now)
    w = MS.windows(fed, "credit", "1")
    assert ev["windows"] == HOURS - 24 and ev["last_window_end"] == T0 + dt.timedelta(hours=HOURS)
    assert ev["recent_accuracy"] == pytest.approx(float((w["accuracy"] * w["n_outcomes"]).sum() / w["n_outcomes"].sum()))
    assert ev["findings"]["model_drift"] == HOURS - DRIFT_HOUR


def test_findings_of_a_name_with_like_wildcards_are_cleared_too(store):
    s = credit_stream("credit_%score", "1", T0, hours=26, rate=120, rng=np.random.default_rng(2), bias=2.0, drift_from_hour=25)
    ingestion.ingest_bytes(store, s.jsonl, source="odd.jsonl")
    now = T0 + dt.timedelta(hours=26)
    MS.evaluate(store, "credit_%score", "1", now=now)
    raised = MS.findings(store, "credit_%score", "1")
    assert raised.filter(pl.col("subject").str.contains("/attribute:")).height > 0
    calm = GM.MonitoringConfig(psi_moderate=50, psi_significant=100, prediction_psi_max=100, fairness_max=None, accuracy_drop=1.0)
    MS.evaluate(store, "credit_%score", "1", now=now, config=calm)
    assert MS.findings(store, "credit_%score", "1").height == 0
    assert MS.findings(store, "credit_%score", "1", include_cleared=True).height == raised.height

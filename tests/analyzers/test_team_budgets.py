"""Team budgets: over, projected over and within, by hand, with the month's own row winning over the standing
one and costs in another currency never compared."""

import datetime as dt
import json

import polars as pl
import pytest

from analyzers import team_budgets as B

NOV = (dt.datetime(2026, 11, 1, tzinfo=dt.UTC), dt.datetime(2026, 12, 1, tzinfo=dt.UTC))
NOW = dt.datetime(2026, 11, 11, tzinfo=dt.UTC)  # 10 of 30 days: a run rate × 3 by the month's end

USAGE = pl.DataFrame({"team": ["nlp", "vision", "infra", "bio"], "gpu_hours": [1200.0, 400.0, 50.0, 10.0],
                      "cost": [3000.0, 900.0, 100.0, 20.0], "currency": ["EUR", "EUR", "EUR", "USD"]})
BUDGETS = pl.DataFrame({"team": ["nlp", "vision", "vision", "infra", "bio", "idle"], "month": ["", "", "2026-11", "2026-10", "", ""],
                        "gpu_hour_quota": [1000.0, 100.0, 1500.0, 1.0, None, 5.0], "budget": [None, 2000.0, 2500.0, None, 30.0, None],
                        "currency": [None, "EUR", "EUR", None, "EUR", None]})


def test_status_by_hand():
    s = {r["team"]: r for r in B.budget_status(USAGE, BUDGETS, month="2026-11", start=NOV[0], end=NOV[1], now=NOW).to_dicts()}
    assert set(s) == {"nlp", "vision", "bio", "idle"}  # infra's budget is October's only
    assert (s["nlp"]["quota_status"], s["nlp"]["projected_gpu_hours"], s["nlp"]["budget_status"]) == ("over", pytest.approx(3600.0), None)
    # vision: November's own row (1,500 GPU-h, 2,500 EUR), not the standing 100 GPU-h: 400 → 1,200 within; 900 EUR → 2,700 projected over
    v = s["vision"]
    assert (v["gpu_hour_quota"], v["quota_status"], v["budget_status"], v["projected_cost"]) == (1500.0, "within", "projected_over", pytest.approx(2700.0))
    assert s["bio"]["budget_status"] is None and "USD" in s["bio"]["note"] and "EUR" in s["bio"]["note"]
    assert (s["idle"]["gpu_hours"], s["idle"]["quota_status"]) == (0.0, "within")


def test_findings_and_early_month():
    st = B.budget_status(USAGE, BUDGETS, month="2026-11", start=NOV[0], end=NOV[1], now=NOW)
    f = {r["subject"]: r for r in B.budget_findings(st, start=NOV[0], now=NOW).to_dicts()}
    assert set(f) == {"team_budget:nlp", "team_budget:vision"}
    assert (f["team_budget:nlp"]["severity"], f["team_budget:nlp"]["score"]) == ("critical", pytest.approx(3.6))
    assert (f["team_budget:vision"]["severity"], f["team_budget:vision"]["score"]) == ("warning", pytest.approx(2700 / 2500))
    assert f["team_budget:nlp"]["window_start"] == NOV[0] and f["team_budget:nlp"]["window_end"] == NOW
    assert json.loads(f["team_budget:vision"]["evidence"])["budget"] == 2500.0
    # twelve hours into the month a rate says little: only what is already over is found
    early = B.budget_status(USAGE, BUDGETS, month="2026-11", start=NOV[0], end=NOV[1], now=NOV[0] + dt.timedelta(hours=12))
    assert early["projected_gpu_hours"].null_count() == early.height
    assert [r["subject"] for r in B.budget_findings(early, start=NOV[0], now=NOW).to_dicts()] == ["team_budget:nlp"]

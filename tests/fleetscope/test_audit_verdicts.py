"""How long an audit's verdict stands: a failed rule pages from its audit until the next audit of its model,
the scheduled one a week on or any run before it (``services.audit``, rule ``AuditRuleFailed``), and when beat
sends the next audit (``services.scheduled.next_fire``, Celery's crontab semantics)."""

from __future__ import annotations

import datetime as dt

import polars as pl
import pytest

from fleetscope.services import audit as audit_service
from fleetscope.services import governance as gs
from fleetscope.services.alerting import state as ST
from fleetscope.services.alerting.rules import load_config
from fleetscope.services.scheduled import next_fire
from fleetscope.store import Store
from governance.registry import ModelEntry
from tests.conftest import fresh_sqlite, make_settings

UTC = dt.UTC
MONDAY_0600 = dt.datetime(2026, 11, 30, 6, 0, tzinfo=UTC)  # 2026-11-30 is a Monday


def _firing(store: Store, now: dt.datetime) -> set[str]:
    res = ST.evaluate_and_dispatch(store, load_config(), now=now)
    return {st.labels["subject"] for st in res.states.values() if st.state == "firing" and st.labels["alertname"] == "AuditRuleFailed"}


def test_a_failed_rule_pages_through_the_week_until_an_audit_finds_it_fixed(tmp_path, sqlite_migrated):
    store = Store.open(fresh_sqlite(sqlite_migrated, tmp_path / "fs.db"))
    settings = make_settings(tmp_path, str(store.engine.url))  # the default schedule: Mondays 06:00 UTC
    gs.put_model(store, ModelEntry("ranker", "1", intended_purpose="rank job applicants for interviews"), actor="test")
    # ranking applicants is Annex III point 4 (employment): declared outside Annex III, Art. 6 fails
    audit_service.declare(store, "ranker", "1", "area", {"area": "none"}, entered_by="test", now=MONDAY_0600 - dt.timedelta(minutes=1))
    audit_service.run_audit(store, settings, trigger="beat", requested_by="beat", now=MONDAY_0600)
    art6 = "model:ranker:1/rule:art6"
    verdicts = store.read("finding").filter(pl.col("kind") == "audit_rule")
    assert art6 in verdicts["subject"].to_list()
    # it stands until next Monday's audit
    assert set(verdicts["window_end"].to_list()) == {dt.datetime(2026, 12, 7, 6, 0, tzinfo=UTC)}
    assert art6 in _firing(store, MONDAY_0600 + dt.timedelta(minutes=5))
    assert art6 in _firing(store, MONDAY_0600 + dt.timedelta(days=6, hours=23))  # the week through, not 25 hours

    # Thursday: the area is declared right and an audit is asked for. Art. 6 passes; the standing verdict
    # ends at that audit and pages for the rule's lookback (2 h) more, never until Monday.
    thursday = MONDAY_0600 + dt.timedelta(days=3)
    audit_service.declare(store, "ranker", "1", "area", {"area": "employment"}, entered_by="test", now=thursday - dt.timedelta(minutes=1))
    second = audit_service.run_audit(store, settings, trigger="api", requested_by="test", now=thursday)
    ended = store.read("finding").filter((pl.col("kind") == "audit_rule") & (pl.col("subject") == art6))
    assert ended["window_end"].to_list() == [thursday]
    assert art6 in _firing(store, thursday + dt.timedelta(hours=1))
    assert art6 not in _firing(store, thursday + dt.timedelta(hours=2, minutes=1))
    # what the second audit failed stands on its own, from Thursday to Monday
    again = store.read("finding").filter((pl.col("kind") == "audit_rule") & (pl.col("window_start") == thursday))
    assert set(again["window_end"].to_list()) <= {dt.datetime(2026, 12, 7, 6, 0, tzinfo=UTC)}
    assert {s for s in again["subject"]} == _firing(store, thursday + dt.timedelta(hours=3))
    assert second["models"] == 1


def test_an_audit_of_one_model_leaves_the_other_models_verdicts_standing(tmp_path, sqlite_migrated):
    store = Store.open(fresh_sqlite(sqlite_migrated, tmp_path / "fs.db"))
    settings = make_settings(tmp_path, str(store.engine.url))
    for name in ("ranker", "screener"):
        gs.put_model(store, ModelEntry(name, "1", intended_purpose="rank job applicants for interviews"), actor="test")
        audit_service.declare(store, name, "1", "area", {"area": "none"}, entered_by="test", now=MONDAY_0600 - dt.timedelta(minutes=1))
    audit_service.run_audit(store, settings, trigger="beat", requested_by="beat", now=MONDAY_0600)
    tuesday = MONDAY_0600 + dt.timedelta(days=1)
    audit_service.declare(store, "ranker", "1", "area", {"area": "employment"}, entered_by="test", now=tuesday - dt.timedelta(minutes=1))
    audit_service.run_audit(store, settings, model="ranker", version="1", trigger="api", requested_by="test", now=tuesday)
    standing = _firing(store, tuesday + dt.timedelta(hours=3))
    assert "model:screener:1/rule:art6" in standing and "model:ranker:1/rule:art6" not in standing


@pytest.mark.parametrize("spec, after, want", [
    # beat's default: Mondays 06:00; strictly after, so an audit at 06:00 is followed by next week's
    ("0 6 * * 1", dt.datetime(2026, 11, 30, 6, 0), dt.datetime(2026, 12, 7, 6, 0)),
    ("0 6 * * 1", dt.datetime(2026, 11, 29, 23, 59, 59), dt.datetime(2026, 11, 30, 6, 0)),
    ("*/15 * * * *", dt.datetime(2026, 11, 30, 10, 7, 30), dt.datetime(2026, 11, 30, 10, 15)),
    ("30 23 31 12 *", dt.datetime(2026, 12, 31, 23, 30), dt.datetime(2027, 12, 31, 23, 30)),
    # 29 February: the next leap year
    ("0 0 29 2 *", dt.datetime(2026, 3, 1), dt.datetime(2028, 2, 29)),
])
def test_next_fire_of_a_crontab(spec, after, want):
    assert next_fire(spec, after.replace(tzinfo=UTC)) == want.replace(tzinfo=UTC)


def test_next_fire_asks_both_day_fields_as_celery_does():
    # Celery's crontab fires on the 1st of a month only when it is also a Monday (Vixie cron would take either):
    # the answer is the first such 1st after the date, found here by walking the calendar
    day = dt.date(2026, 1, 2)
    while not (day.day == 1 and day.weekday() == 0):
        day += dt.timedelta(days=1)
    assert next_fire("0 6 1 * 1", dt.datetime(2026, 1, 1, 7, 0, tzinfo=UTC)) == dt.datetime(day.year, day.month, 1, 6, 0, tzinfo=UTC)


def test_a_29_february_that_is_a_monday_is_found_years_on():
    day = dt.date(2026, 3, 1)
    while not (day.month == 2 and day.day == 29 and day.weekday() == 0):
        day += dt.timedelta(days=1)
    assert day.year == 2044
    assert next_fire("0 0 29 2 1", MONDAY_0600) == dt.datetime(2044, 2, 29, tzinfo=UTC)


def test_a_schedule_that_never_fires_or_is_malformed_is_refused():
    with pytest.raises(ValueError, match="never occurs"):
        next_fire("0 0 30 2 *", MONDAY_0600)  # Celery's own refusal
    with pytest.raises(ValueError, match="expected five crontab fields"):
        next_fire("0 6 * *", MONDAY_0600)

"""Matcher regexes are RE2: linear-time matching, Alertmanager's anchoring, refusal of what RE2 cannot
run (naming the matcher) wherever a matcher is made, and the pattern and value length limits."""

import datetime as dt
import json
import time

import httpx
import pytest
from sqlalchemy import insert

from fleetscope.services.alerting import dispatch as D
from fleetscope.store import alerting_schema as S
from fleetscope.services.alerting import state as ST
from fleetscope.services.alerting.labels import MAX_PATTERN_CHARS, MAX_VALUE_CHARS, Matcher
from fleetscope.services.alerting.rules import RuleError, load_config, parse_rule
from tests.alerting.test_api import live  # noqa: F401  (the live API fixture, shared)

NOW = dt.datetime(2027, 1, 1, tzinfo=dt.UTC)
EVIL = "a" * 100_000 + "!"


def test_catastrophic_pattern_is_answered_at_once():
    """``(a+)+$`` against 100,000 ``a`` and a ``!``: a backtracking engine tries ~2^100000 ways to split
    the run before failing. RE2 answers in one pass; the bound below is a limit (a backtracking run
    would not end in the test's lifetime), not a speed figure."""
    m = Matcher.parse('host=~"(a+)+$"')
    t0 = time.monotonic()
    assert m.matches({"host": EVIL}) is False
    assert Matcher("host", "!~", "(a+)+$").matches({"host": EVIL}) is True
    assert Matcher("host", "=~", "(a+)+").matches({"host": "a" * 100_000}) is True
    # through a silence at dispatch, where a worker would have hung
    sil = D.Silence("s1", (m,), NOW, NOW + dt.timedelta(hours=1))
    alert = D.Alert("f1", {"alertname": "X", "host": EVIL}, {}, NOW)
    assert D.silenced(alert, [sil], NOW) is False
    assert time.monotonic() - t0 < 2.0


@pytest.mark.parametrize("pattern, why", [
    (r"(a)\1", "invalid escape sequence"),
    (r"(?P<x>a)(?P=x)", "invalid"),
    ("(?=gpu)gpu-1", "invalid perl operator"),
    ("(?!gpu)x", "invalid perl operator"),
    ("(?<=n)1", "invalid perl operator"),
    ("a{1001}", "invalid repetition size"),
    ("a)|(b", "unexpected )"),  # would escape Alertmanager's ^(?:...)$ wrapping
])
def test_patterns_re2_cannot_run_are_refused_naming_the_matcher(pattern, why):
    with pytest.raises(ValueError) as exc:
        Matcher("gpu_uuid", "=~", pattern)
    msg = str(exc.value)
    assert msg.startswith("matcher 'gpu_uuid': ") and "not an RE2 regex" in msg and why in msg


def test_refusal_at_rule_route_and_inhibit_creation():
    with pytest.raises(RuleError) as exc:
        parse_rule({"alert": "Hot", "metric": {"name": "temp", "op": ">", "threshold": 90, "matchers": ['host=~"(n)\\\\1"']}}, source="api")
    assert exc.value.rule == "Hot" and exc.value.field == "metric.matchers" and "matcher 'host'" in str(exc.value)
    with pytest.raises(RuleError) as exc:
        parse_rule({"alert": "Slow", "findings": {"kind": "straggler", "subject": "(?=job)job:.*"}}, source="api")
    assert exc.value.field == "findings.subject" and "matcher 'subject'" in str(exc.value)
    with pytest.raises(RuleError) as exc:
        load_config(text='route: {receiver: a, routes: [{receiver: b, matchers: [\'team=~"(x)\\\\1"\']}]}')
    assert exc.value.field == "route.routes[0].matchers" and "matcher 'team'" in str(exc.value)
    with pytest.raises(RuleError) as exc:
        load_config(text='inhibit_rules: [{source_matchers: [\'a=~"(?<=b)c"\'], target_matchers: [b=c]}]')
    assert exc.value.field == "inhibit_rules[0].source_matchers" and "matcher 'a'" in str(exc.value)


def test_anchoring_and_semantics_are_alertmanagers():
    assert Matcher("host", "=~", "gpu").matches({"host": "gpu-1"}) is False
    assert Matcher("host", "=~", "gpu.*").matches({"host": "gpu-1"}) is True
    assert Matcher("host", "=~", "gpu-[0-9]+|cpu").matches({"host": "cpu"}) is True
    assert Matcher("host", "=~", "a|ab").matches({"host": "ab"}) is True  # the whole value, not the first branch
    assert Matcher("host", "=~", ".*").matches({}) is True  # a missing label reads as ""
    assert Matcher("host", "=~", "a.b").matches({"host": "a\nb"}) is True  # "." crosses newlines, as before
    assert Matcher("host", "=~", "(?i)GPU-1").matches({"host": "gpu-1"}) is True


def test_pattern_and_value_length_limits():
    Matcher("host", "=~", "a" * MAX_PATTERN_CHARS)
    with pytest.raises(ValueError, match=f"matcher 'host': the regex is {MAX_PATTERN_CHARS + 1} characters, over the {MAX_PATTERN_CHARS}"):
        Matcher("host", "=~", "a" * (MAX_PATTERN_CHARS + 1))
    # equality matchers have no pattern to compile: no limit
    assert Matcher("host", "=", "a" * (MAX_PATTERN_CHARS + 1)).matches({"host": "a" * (MAX_PATTERN_CHARS + 1)}) is True
    at_limit, over = "x" * MAX_VALUE_CHARS, "x" * (MAX_VALUE_CHARS + 1)
    assert Matcher("host", "=~", "x*").matches({"host": at_limit}) is True
    assert Matcher("host", "=~", "x*").matches({"host": over}) is False
    assert Matcher("host", "!~", "y").matches({"host": over}) is True


def test_api_refuses_with_the_matcher_named_and_writes_nothing(live):
    url, app, admin, _ = live
    r = httpx.post(url + "/api/v1/alerts/silences", headers=admin, json={
        "matchers": [{"name": "host", "value": "n1", "isRegex": False}, {"name": "gpu_uuid", "value": "(G)\\1", "isRegex": True}],
        "endsAt": "2099-01-01T00:00:00Z", "comment": "x"})
    assert r.status_code == 422 and "matcher 'gpu_uuid'" in r.json()["detail"] and "not an RE2 regex" in r.json()["detail"]
    assert httpx.get(url + "/api/v1/alerts/silences", headers=admin).json() == []
    r = httpx.put(url + "/api/v1/alerts/rules/Hot", headers=admin, json={"metric": {"name": "t", "op": ">", "threshold": 1, "matchers": ['host=~"(?=n)"']}})
    assert r.status_code == 422 and r.json()["field"] == "metric.matchers" and "matcher 'host'" in r.json()["detail"]
    assert "Hot" not in {x["name"] for x in httpx.get(url + "/api/v1/alerts/rules", headers=admin).json()}


def test_stored_rows_re2_refuses_are_skipped_not_fatal(store):
    """Rows saved when matchers were Python regexes: evaluation goes on without them."""
    now = dt.datetime.now(dt.UTC)
    ok = ST.create_silence(store.engine, ['host="n1"'], None, now + dt.timedelta(hours=1), "t", "kept")
    with store.engine.begin() as conn:
        conn.execute(insert(S.alert_silence).values(
            silence_id="old", matchers_json=json.dumps([{"name": "host", "value": "(n)\\1", "isRegex": True, "isEqual": True}]),
            starts_at=now - dt.timedelta(minutes=1), ends_at=now + dt.timedelta(hours=1), created_by="t", comment="old",
            created_at=now, updated_at=now))
        conn.execute(insert(S.alert_rule).values(
            name="Old", spec_json=json.dumps({"alert": "Old", "findings": {"kind": "x", "subject": "(?=a)a"}}), updated_at=now, updated_by="t"))
    assert [s.id for s in ST.list_silences(store.engine, now=now)] == [ok.id]
    assert "Old" not in ST.rule_overrides(store.engine)
    r = ST.evaluate_and_dispatch(store, ST.effective_config(store.engine, load_config()), now=now)
    assert r.firing == 0

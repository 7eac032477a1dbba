"""Pure alerting semantics: rules, for:/keep_firing_for, grouping timers, inhibition, silences, resolve."""

import datetime as dt
import re

import polars as pl
import pytest

from fleetscope.core import frames as F
from fleetscope.services.alerting import dispatch as D
from fleetscope.services.alerting import engine as E
from fleetscope.services.alerting.labels import Matcher, fingerprint, labelset_string
from fleetscope.services.alerting.rules import RuleError, load_config, parse_duration

T0 = dt.datetime(2027, 1, 1, tzinfo=dt.UTC)


def at(s: float) -> dt.datetime:
    return T0 + dt.timedelta(seconds=s)


def findings(*rows: dict) -> pl.DataFrame:
    base = {"analyzer": "health", "severity": "warning", "window_end": None, "score": None, "summary": None, "evidence": None}
    return F.conform(F.FINDING, pl.DataFrame([{**base, **r} for r in rows], infer_schema_length=None))


def cfg(rules: str, route: str = "route: {receiver: r, group_by: [alertname], group_wait: 10s, group_interval: 60s, repeat_interval: 1h}", extra: str = ""):
    return load_config(text=f"rules:\n{rules}\n{route}\n{extra}")


STRAGGLER = """
  - alert: Straggler
    findings: {kind: straggler}
    for: 60s
    keep_firing_for: 30s
    lookback: 1s
    labels: {severity: warning}
    annotations: {summary: "slow {{ $labels.subject }} score {{ $value }}"}
"""


def straggler_at(s: float, subject: str = "job:j1/rank:3") -> pl.DataFrame:
    return findings({"kind": "straggler", "subject": subject, "window_start": at(s), "score": 4.5})


def run(config, frames_by_t: dict[float, pl.DataFrame], times: list[float]):
    states: dict = {}
    history = []
    for t in times:
        df = frames_by_t.get(t, F.FINDING.empty())
        states = E.evaluate(config, E.EvalInput(finding=df), states, at(t))
        history.append({s.fingerprint: s.state for s in states.values()})
    return states, history


# --- rules and loader -------------------------------------------------------------------------------


def test_default_rules_load_and_cover_the_issue():
    c = load_config()
    names = {r.name for r in c.rules}
    for want in ("GpuFellOffBus", "GpuUncorrectableEcc", "GpuRowRemapFailure", "SdcSuspect", "Straggler", "GpuThermalThrottling",
                 "JobGoodputLow", "NcclBandwidthRegression", "PueOutOfRange", "AuditRuleFailed"):
        assert want in names
    assert c.rule("GpuFellOffBus").health[0].codes == (79,)
    assert set(c.rule("GpuUncorrectableEcc").health[0].codes) == {48, 94, 95}
    assert c.rule("JobGoodputLow").metric.op == "<"


@pytest.mark.parametrize("body, field", [
    ("  - alert: X\n    findings: {kind: a}\n    for: 5 minutes\n", "for"),
    ("  - alert: X\n    findings: {kind: a, severity: fatal}\n", "findings.severity"),
    ("  - alert: X\n    metric: {name: m, op: '=>', threshold: 1}\n", "metric.op"),
    ("  - alert: X\n    metric: {name: m, op: '<', threshold: high}\n", "metric.threshold"),
    ("  - alert: X\n    findings: {kind: a}\n    labels: {bad-name: 1}\n", "labels"),
    ("  - alert: X\n    findings: {kind: a}\n    colour: red\n", "colour"),
    ("  - alert: X\n    labels: {a: b}\n", "findings"),
    ("  - alert: X\n    findings: {kind: a, subject: '('}\n", "findings.subject"),
])
def test_rule_errors_name_the_rule_and_field(body, field):
    with pytest.raises(RuleError) as exc:
        load_config(text="rules:\n" + body)
    assert exc.value.rule == "X" and exc.value.field == field
    assert "'X'" in str(exc.value) and field in str(exc.value)


def test_route_errors_name_the_field():
    with pytest.raises(RuleError, match="route.routes\\[0\\].group_wait"):
        load_config(text="route: {receiver: a, routes: [{group_wait: soon}]}")


def test_durations():
    assert parse_duration("1h30m") == 5400 and parse_duration("90s") == 90 and parse_duration("0s") == 0 and parse_duration(2) == 2
    with pytest.raises(ValueError):
        parse_duration("5 m")


# --- fingerprints and matchers ------------------------------------------------------------------------


def test_fingerprint_is_stable_and_order_independent():
    a = {"alertname": "X", "host": "h1", "severity": "critical"}
    b = dict(reversed(list(a.items())))
    assert fingerprint(a) == fingerprint(b)
    assert re.fullmatch("[0-9a-f]{16}", fingerprint(a))
    assert fingerprint(a) != fingerprint({**a, "host": "h2"})
    # model.LabelSet{}.Fingerprint() is the FNV-1a offset basis; this value is fixed by the algorithm.
    assert fingerprint({}) == "cbf29ce484222325"
    # prometheus/common model/fingerprinting_test.go TestMetricToFingerprint: 5799056148416392346 in decimal
    assert fingerprint({"name": "garland, briggs", "fear": "love is not enough"}) == "507a62d79ee76c9a"
    # The separator keeps {a="bc"} apart from {ab="c"}.
    assert fingerprint({"a": "bc"}) != fingerprint({"ab": "c"})


def test_labelset_string_and_matchers():
    assert labelset_string({"b": 'x"y', "a": "1"}) == '{a="1", b="x\\"y"}'
    labels = {"alertname": "GpuFellOffBus", "host": "gpu-node-7"}
    assert Matcher.parse('host=~"gpu-node-.*"').matches(labels)
    assert not Matcher.parse('host=~"gpu-node"').matches(labels)  # anchored
    assert Matcher.parse('host!~"cpu-.*"').matches(labels)
    assert Matcher.parse("alertname=GpuFellOffBus").matches(labels)
    assert Matcher.parse('team!="x"').matches(labels)
    assert Matcher.parse('team=""').matches(labels)  # a missing label is ""
    assert Matcher.from_any({"name": "host", "value": "gpu-.*", "isRegex": True, "isEqual": False}).op == "!~"
    with pytest.raises(ValueError):
        Matcher.parse("host ~ x")


# --- for: and keep_firing_for ---------------------------------------------------------------------------


def test_for_pending_then_firing_then_keep_firing_then_resolved():
    c = cfg(STRAGGLER)
    data = {t: straggler_at(t) for t in (0, 20, 40, 60, 80)}
    states, hist = run(c, data, [0, 20, 40, 60, 80, 100, 120])
    (fp,) = states
    assert [h[fp] for h in hist] == ["pending", "pending", "pending", "firing", "firing", "firing", "inactive"]
    s = states[fp]
    assert s.active_at == at(0) and s.fired_at == at(60) and s.resolved_at == at(120)
    assert s.labels["job_id"] == "j1" and s.labels["rank"] == "3" and s.labels["alertname"] == "Straggler"
    assert s.annotations["summary"] == "slow job:j1/rank:3 score 4.5"


def test_pending_drops_when_one_evaluation_is_false():
    c = cfg(STRAGGLER)
    data = {t: straggler_at(t) for t in (0, 20, 60, 80, 100, 120)}  # missing at 40
    states, hist = run(c, data, [0, 20, 40, 60, 80, 100, 120])
    (fp,) = states
    assert [h.get(fp) for h in hist] == ["pending", "pending", None, "pending", "pending", "pending", "firing"]
    assert states[fp].active_at == at(60)


def test_keep_firing_for_rides_out_a_flap():
    c = cfg(STRAGGLER)
    data = {t: straggler_at(t) for t in (0, 60, 80, 120)}  # false at 100 only
    states, hist = run(c, data, [0, 60, 80, 100, 120])
    (fp,) = states
    assert [h[fp] for h in hist][1:] == ["firing", "firing", "firing", "firing"]
    assert states[fp].fired_at == at(60)


def test_resolved_alert_that_returns_is_a_new_alert():
    c = cfg(STRAGGLER.replace("for: 60s", "for: 0s").replace("keep_firing_for: 30s", "keep_firing_for: 0s"))
    states, hist = run(c, {0: straggler_at(0), 40: straggler_at(40)}, [0, 20, 40])
    (fp,) = states
    assert [h[fp] for h in hist] == ["firing", "inactive", "firing"]
    assert states[fp].active_at == at(40) and states[fp].resolved_at is None


def test_findings_windows_lookback_severity_and_evidence():
    c = cfg("""
  - alert: Xid79
    findings: {kind: xid, evidence: {code: [79]}}
    lookback: 5m
""")
    df = findings(
        {"kind": "xid", "subject": "gpu:G1", "window_start": at(-100), "window_end": at(-50), "severity": "critical", "evidence": '{"code": 79, "host": "n1"}'},
        {"kind": "xid", "subject": "gpu:G2", "window_start": at(-100), "severity": "critical", "evidence": '{"code": 13}'},
        {"kind": "xid", "subject": "gpu:G3", "window_start": at(-1000), "window_end": at(-400), "evidence": '{"code": 79}'},
        {"kind": "xid", "subject": "gpu:G4", "window_start": at(100), "evidence": '{"code": 79}'},  # in the future
    )
    active = E.active_alerts(c.rules[0], E.EvalInput(finding=df), at(0))
    (a,) = active.values()
    assert a.labels == {"alertname": "Xid79", "kind": "xid", "subject": "gpu:G1", "gpu_uuid": "G1", "host": "n1", "code": "79", "severity": "critical"}


def test_health_events_and_inventory_host():
    c = load_config()
    he = F.conform(F.HEALTH_EVENT, pl.DataFrame({"ts": [at(-5), at(-4), at(-3)], "gpu_uuid": ["G1", "G1", "G2"], "kind": ["xid", "xid", "xid"], "code": [79, 79, 13]}))
    active = E.active_alerts(c.rule("GpuFellOffBus"), E.EvalInput(health_event=he, gpu_host={"G1": "node-1"}), at(0))
    (a,) = active.values()
    assert a.labels["gpu_uuid"] == "G1" and a.labels["host"] == "node-1" and a.labels["severity"] == "critical" and a.value == 2
    assert "node-1" in a.annotations["summary"]


def test_metric_threshold_rule():
    c = load_config()
    ms = F.conform(F.METRIC_SAMPLE, pl.DataFrame({
        "ts": [at(-60), at(-30), at(-60), at(-30)],
        "series": ['job_goodput_ratio{job_id="a"}'] * 2 + ['job_goodput_ratio{job_id="b"}'] * 2,
        "value": [0.5, 0.6, 0.9, 0.95],
    }))
    active = E.active_alerts(c.rule("JobGoodputLow"), E.EvalInput(metric_sample=ms), at(0))
    (a,) = active.values()
    assert a.labels["job_id"] == "a" and a.value == pytest.approx(0.55)
    assert a.annotations["summary"] == "Job a goodput is 0.55 (below 0.8)"


def test_removed_rule_resolves_its_alerts():
    c = cfg(STRAGGLER.replace("for: 60s", "for: 0s"))
    states = E.evaluate(c, E.EvalInput(finding=straggler_at(0)), {}, at(0))
    empty = cfg("  - alert: Other\n    findings: {kind: none}\n")
    states = E.evaluate(empty, E.EvalInput(), states, at(10))
    (s,) = states.values()
    assert s.state == "inactive" and s.resolved_at == at(10)


def test_state_round_trips_through_dicts():
    c = cfg(STRAGGLER)
    states = E.evaluate(c, E.EvalInput(finding=straggler_at(0)), {}, at(0))
    s = next(iter(states.values()))
    assert E.AlertState.from_dict(s.to_dict()) == s


# --- dispatch: grouping timers, dedup, repeat, resolve --------------------------------------------------


def alert(name: str, starts: float, ends: float | None = None, **labels) -> D.Alert:
    ls = {"alertname": name, **labels}
    return D.Alert(fingerprint(ls), ls, {"summary": name}, at(starts), None if ends is None else at(ends))


class Sim:
    """Drives dispatch over time with a changing set of alerts; records notifications."""

    def __init__(self, config, silences=()):
        self.config, self.groups, self.sent, self.silences = config, {}, [], list(silences)

    def tick(self, t: float, alerts):
        self.groups, notes = D.dispatch(self.config, alerts, self.groups, self.silences, at(t))
        self.sent.extend((t, n) for n in notes)
        return notes


GROUPING = cfg("  - alert: A\n    findings: {kind: a}\n", "route: {receiver: r, group_by: [alertname], group_wait: 30s, group_interval: 5m, repeat_interval: 1h}")


def test_group_wait_batches_then_group_interval_then_repeat():
    sim = Sim(GROUPING)
    a1, a2, a3 = alert("X", 0, host="h1"), alert("X", 10, host="h2"), alert("X", 40, host="h3")
    assert sim.tick(0, [a1]) == []
    assert sim.tick(10, [a1, a2]) == []
    (n,) = sim.tick(30, [a1, a2])  # group_wait over: both in one notification
    assert n.status == "firing" and [a.labels["host"] for a in n.alerts] == ["h1", "h2"]
    assert n.group_key == '{}:{alertname="X"}' and n.group_labels == {"alertname": "X"}
    assert n.common_labels == {"alertname": "X"}
    assert sim.tick(40, [a1, a2, a3]) == []  # new alert waits for the next group_interval
    assert sim.tick(329, [a1, a2, a3]) == []
    (n,) = sim.tick(330, [a1, a2, a3])
    assert len(n.alerts) == 3
    assert sim.tick(630, [a1, a2, a3]) == []  # nothing new, repeat_interval not reached
    assert sim.tick(3630, [a1, a2, a3]) == []  # flushes land on 30 + k*300: 3630 is one, but 3300 s < 1 h since 330
    (n,) = sim.tick(3930, [a1, a2, a3])  # repeat_interval passed
    assert len(n.alerts) == 3


def test_group_by_splits_groups_and_old_alerts_flush_at_once():
    c = cfg("  - alert: A\n    findings: {kind: a}\n", "route: {receiver: r, group_by: [host], group_wait: 30s}")
    sim = Sim(c)
    notes = sim.tick(100, [alert("X", 0, host="h1"), alert("Y", 0, host="h2")])  # older than group_wait
    assert sorted(n.group_key for n in notes) == ['{}:{host="h1"}', '{}:{host="h2"}']


def test_resolve_notification_then_group_removed():
    sim = Sim(GROUPING)
    a1, a2 = alert("X", 0, host="h1"), alert("X", 0, host="h2")
    sim.tick(30, [a1, a2])
    a1r = D.Alert(a1.fingerprint, a1.labels, a1.annotations, a1.starts_at, at(100))
    (n,) = sim.tick(330, [a1r, a2])
    assert n.status == "firing"  # one still fires
    assert [(a.labels["host"], a.payload()["status"]) for a in n.alerts] == [("h1", "resolved"), ("h2", "firing")]
    assert n.alerts[0].payload()["endsAt"] == "2027-01-01T00:01:40Z"
    a2r = D.Alert(a2.fingerprint, a2.labels, a2.annotations, a2.starts_at, at(400))
    (n,) = sim.tick(630, [a1r, a2r])
    assert n.status == "resolved" and [a.labels["host"] for a in n.alerts] == ["h2"]
    assert sim.groups == {}
    assert sim.tick(930, [a1r, a2r]) == []  # resolved and told: no new group, nothing sent


def test_alert_resolving_before_first_flush_is_never_sent():
    sim = Sim(GROUPING)
    a = alert("X", 0, host="h1")
    sim.tick(0, [a])
    assert sim.tick(30, [D.Alert(a.fingerprint, a.labels, a.annotations, a.starts_at, at(20))]) == []


def test_send_resolved_false():
    c = cfg("  - alert: A\n    findings: {kind: a}\n", "route: {receiver: r, group_by: [alertname], group_wait: 0s, group_interval: 1m, send_resolved: false}")
    sim = Sim(c)
    a1, a2 = alert("X", 0, host="h1"), alert("X", 0, host="h2")
    assert len(sim.tick(0, [a1, a2])) == 1
    a1r = D.Alert(a1.fingerprint, a1.labels, a1.annotations, a1.starts_at, at(30))
    assert sim.tick(60, [a1r, a2]) == []  # a resolve alone does not notify


def test_child_routes_and_continue():
    c = cfg("  - alert: A\n    findings: {kind: a}\n", """route:
  receiver: default
  group_by: [alertname]
  group_wait: 0s
  routes:
    - matchers: ['severity="critical"']
      receiver: pager
      continue: true
    - matchers: ['team=~"fleet|net"']
      receiver: fleet
""")
    sim = Sim(c)
    notes = sim.tick(0, [alert("X", 0, severity="critical", team="fleet"), alert("Y", 0, severity="info")])
    got = sorted((n.receiver, n.group_key) for n in notes)
    assert got == [("default", '{}:{alertname="Y"}'), ("fleet", '{}/{team=~"fleet|net"}:{alertname="X"}'),
                   ("pager", '{}/{severity="critical"}:{alertname="X"}')]


# --- inhibition and silences ------------------------------------------------------------------------------


def test_host_down_inhibits_its_gpus_alerts_only():
    c = load_config(text="""
route: {receiver: r, group_by: [alertname, host], group_wait: 0s}
inhibit_rules:
  - source_matchers: ['alertname="HostDown"']
    target_matchers: ['alertname!="HostDown"']
    equal: [host]
""")
    sim = Sim(c)
    down = alert("HostDown", 0, host="n1")
    g1 = alert("GpuFellOffBus", 0, host="n1", gpu_uuid="G1")
    g2 = alert("GpuFellOffBus", 0, host="n2", gpu_uuid="G2")
    notes = sim.tick(0, [down, g1, g2])
    assert sorted(n.group_key for n in notes) == ['{}:{alertname="GpuFellOffBus", host="n2"}', '{}:{alertname="HostDown", host="n1"}']
    # The host comes back: its GPU alert is no longer inhibited and is sent at the next group_interval.
    down_r = D.Alert(down.fingerprint, down.labels, down.annotations, down.starts_at, at(100))
    notes = sim.tick(300, [down_r, g1, g2])
    assert sorted((n.group_key, n.status) for n in notes) == [('{}:{alertname="GpuFellOffBus", host="n1"}', "firing"), ('{}:{alertname="HostDown", host="n1"}', "resolved")]


def test_two_sided_inhibition_does_not_mute_both():
    rules = load_config(text="""
inhibit_rules:
  - source_matchers: ['severity="critical"']
    target_matchers: ['severity=~"critical|warning"']
    equal: [host]
""").inhibit_rules
    a, b, w = alert("A", 0, severity="critical", host="h"), alert("B", 0, severity="critical", host="h"), alert("W", 0, severity="warning", host="h")
    firing = [a, b, w]
    assert not D.inhibited(a, rules, firing) and not D.inhibited(b, rules, firing)
    assert D.inhibited(w, rules, firing)


def test_silences_with_matchers_and_window():
    sil = D.Silence("s1", (Matcher.parse('host=~"n[12]"'), Matcher.parse('alertname!="HostDown"')), at(0), at(600))
    sim = Sim(load_config(text="route: {receiver: r, group_by: [host], group_wait: 0s, group_interval: 1m}"), [sil])
    g1, g3, hd = alert("GpuFellOffBus", 0, host="n1"), alert("GpuFellOffBus", 0, host="n3"), alert("HostDown", 0, host="n2")
    notes = sim.tick(0, [g1, g3, hd])
    assert sorted(n.group_key for n in notes) == ['{}:{host="n2"}', '{}:{host="n3"}']
    assert sil.state(at(-1)) == "pending" and sil.state(at(0)) == "active" and sil.state(at(600)) == "expired"
    assert sim.tick(540, [g1, g3, hd]) == []
    (n,) = sim.tick(600, [g1, g3, hd])  # the silence ended: g1 is sent
    assert n.group_key == '{}:{host="n1"}'


def test_resolve_of_a_notified_alert_is_sent_even_if_silenced_later():
    sim = Sim(load_config(text="route: {receiver: r, group_by: [alertname], group_wait: 0s, group_interval: 1m}"))
    a = alert("X", 0, host="n1")
    sim.tick(0, [a])
    sim.silences.append(D.Silence("s", (Matcher.parse("alertname=X"),), at(10), at(1000)))
    assert sim.tick(60, [a]) == []
    (n,) = sim.tick(120, [D.Alert(a.fingerprint, a.labels, a.annotations, a.starts_at, at(100))])
    assert n.status == "resolved"


def test_group_state_round_trips():
    sim = Sim(GROUPING)
    sim.tick(0, [alert("X", 0, host="h1")])
    sim.tick(30, [alert("X", 0, host="h1")])
    (g,) = sim.groups.values()
    assert D.Group.from_dict(g.to_dict()) == g


def test_go_time():
    assert D.go_time(None) == "0001-01-01T00:00:00Z"
    assert D.go_time(dt.datetime(2027, 1, 1, 0, 0, 1, 500000, tzinfo=dt.UTC)) == "2027-01-01T00:00:01.5Z"


def test_absent_rule_fires_when_a_series_stops_and_carries_the_matchers_labels():
    c = cfg("  - alert: AgentSilent\n    metric: {name: fleetscope_agent_up, op: absent, matchers: ['node=\"n7\"', 'site=~\"dc.*\"']}\n"
            "    lookback: 5m\n")
    rule = c.rule("AgentSilent")
    assert rule.metric.op == "absent"

    def samples(*rows):
        return F.conform(F.METRIC_SAMPLE, pl.DataFrame({"ts": [r[0] for r in rows], "series": [r[1] for r in rows], "value": [1.0] * len(rows)},
                                                       schema={"ts": F.UTC_US, "series": pl.String, "value": pl.Float64}))

    here = 'fleetscope_agent_up{node="n7",site="dc1"}'
    assert E.active_alerts(rule, E.EvalInput(metric_sample=samples((at(-60), here))), at(0)) == {}
    # the last sample left the 5-minute lookback; another node's sample does not stand in for it
    quiet = samples((at(-400), here), (at(-10), 'fleetscope_agent_up{node="n8",site="dc1"}'))
    (a,) = E.active_alerts(rule, E.EvalInput(metric_sample=quiet), at(0)).values()
    assert a.labels == {"alertname": "AgentSilent", "node": "n7", "severity": "warning"}  # only the equality matcher's label
    assert a.value == 1.0
    (a,) = E.active_alerts(rule, E.EvalInput(metric_sample=samples()), at(0)).values()  # nothing at all
    assert a.labels["node"] == "n7"

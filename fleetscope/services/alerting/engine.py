"""Rule evaluation: which alerts are active now, and the pending → firing → resolved state machine.

Pure: frames and the previous state in, the next state out, with an explicit ``now``. The state machine is
Prometheus' (docs, "Alerting rules"; ``rules/alerting.go``):

- an alert whose condition becomes true is *pending* from that evaluation (``active_at``);
- it turns *firing* once it has been true at every evaluation for ``for`` (``now - active_at >= for``); an
  evaluation where it is false while pending drops it, so the clock starts again;
- a firing alert whose condition turns false stays firing for ``keep_firing_for`` after the last evaluation
  it was true (against flapping), then is *resolved* (``resolved_at = now``);
- resolved alerts are kept ``RESOLVED_RETENTION_S`` so the notifier can say so; an alert that comes back
  after resolving is a new alert (pending again, a new ``active_at``);
- what is sent on is Prometheus' notifier alert: ``startsAt`` = the time it fired, ``endsAt`` = the time it
  resolved.

Conditions read the canonical frames: ``finding`` (analyzer conclusions), ``health_event`` and
``metric_sample`` (roll-up series). Work is columnar (polars) up to the rows that match a rule, so a fleet
of 16,384 GPUs evaluates well under a second (``benchmarks/alerting.py``).
"""

from __future__ import annotations

import datetime as dt
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import polars as pl

from fleetscope.core import frames as F
from fleetscope.services.alerting.labels import fingerprint
from fleetscope.services.alerting.rules import ABSENT, AlertingConfig, FindingSelector, MetricCondition, Rule

RESOLVED_RETENTION_S = 15 * 60  # Prometheus' resolvedRetention
PENDING, FIRING, INACTIVE = "pending", "firing", "inactive"
_SEVERITY_RANK = {"info": 0, "warning": 1, "critical": 2}


@dataclass(frozen=True)
class AlertState:
    """One alert instance of one rule, keyed by the fingerprint of its label set."""

    rule: str
    fingerprint: str
    labels: dict[str, str]
    annotations: dict[str, str]
    state: str
    active_at: dt.datetime
    last_active_at: dt.datetime
    fired_at: dt.datetime | None = None
    resolved_at: dt.datetime | None = None
    value: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "rule": self.rule, "fingerprint": self.fingerprint, "labels": self.labels, "annotations": self.annotations,
            "state": self.state, "active_at": _iso(self.active_at), "last_active_at": _iso(self.last_active_at),
            "fired_at": _iso(self.fired_at), "resolved_at": _iso(self.resolved_at), "value": self.value,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> AlertState:
        return cls(
            rule=d["rule"], fingerprint=d["fingerprint"], labels=dict(d["labels"]), annotations=dict(d["annotations"]),
            state=d["state"], active_at=_parse(d["active_at"]), last_active_at=_parse(d["last_active_at"]),
            fired_at=_parse(d.get("fired_at")), resolved_at=_parse(d.get("resolved_at")), value=d.get("value"),
        )


def _iso(t: dt.datetime | None) -> str | None:
    return None if t is None else t.astimezone(dt.UTC).isoformat()


def _parse(s: Any) -> Any:
    if s is None or isinstance(s, dt.datetime):
        return s
    return dt.datetime.fromisoformat(s)


@dataclass
class EvalInput:
    """What rules read. Any frame may be absent; ``gpu_host`` (gpu_uuid, host) adds the host label to GPU
    alerts that lack it, so grouping and inhibition by host work for every source."""

    finding: pl.DataFrame | None = None
    health_event: pl.DataFrame | None = None
    metric_sample: pl.DataFrame | None = None
    gpu_host: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Active:
    labels: dict[str, str]
    annotations: dict[str, str]
    value: float | None


# --- labels from subjects and evidence ----------------------------------------------------------------

_SUBJECT_LABEL = {"gpu": "gpu_uuid", "host": "host", "job": "job_id", "rank": "rank", "site": "site", "node": "host", "model": "model"}
_LABEL_SAFE = re.compile(r"[^a-zA-Z0-9_]")


def subject_labels(subject: str) -> dict[str, str]:
    """``gpu:<uuid>`` → gpu_uuid, ``host:<h>`` → host, ``job:<id>/rank:<n>`` → job_id and rank, other
    ``name:value`` parts by their name (FINDING's subject convention in ``fleetscope.core.frames``)."""
    out: dict[str, str] = {}
    for part in subject.split("/"):
        name, sep, value = part.partition(":")
        if not sep or not name:
            continue
        key = _SUBJECT_LABEL.get(name, _LABEL_SAFE.sub("_", name))
        if key and not key[0].isdigit():
            out[key] = value
    return out


_TEMPLATE = re.compile(r"\{\{\s*\$(labels\.([a-zA-Z_][a-zA-Z0-9_]*)|value|summary)\s*\}\}")


def render(template: str, labels: Mapping[str, str], value: float | None, summary: str) -> str:
    """The subset of Prometheus' annotation templating rules need: ``{{ $labels.x }}``, ``{{ $value }}``,
    ``{{ $summary }}`` (the finding's own sentence)."""

    def sub(m: re.Match[str]) -> str:
        if m.group(2):
            return labels.get(m.group(2), "")
        if m.group(1) == "value":
            return "" if value is None else f"{value:.4g}"
        return summary

    return _TEMPLATE.sub(sub, template)


# --- which alerts are active -------------------------------------------------------------------------


def _in(col: str, values: Iterable[Any]) -> pl.Expr:
    return pl.col(col).is_in(list(values))


def _finding_mask(sel: FindingSelector) -> pl.Expr:
    e = pl.lit(True)
    if sel.kinds:
        e = e & _in("kind", sel.kinds)
    if sel.severities:
        e = e & _in("severity", sel.severities)
    if sel.analyzers:
        e = e & _in("analyzer", sel.analyzers)
    if sel.subject is not None:
        e = e & pl.col("subject").str.contains(f"^(?:{sel.subject})$")
    for key, values in sel.evidence:
        e = e & pl.col("evidence").str.json_path_match(f"$.{key}").is_in(list(values)).fill_null(False)
    if sel.min_score is not None:
        e = e & (pl.col("score") >= sel.min_score).fill_null(False)
    return e


def _finding_alerts(rule: Rule, df: pl.DataFrame, now: dt.datetime, gpu_host: Mapping[str, str]) -> Iterable[tuple[dict[str, str], float | None, str]]:
    since = now - dt.timedelta(seconds=rule.lookback_s)
    mask = pl.lit(False)
    for sel in rule.findings:
        mask = mask | _finding_mask(sel)
    cur = df.filter(mask & (pl.col("window_start") <= now) & (pl.coalesce("window_end", "window_start") >= since))
    if cur.height == 0:
        return
    ev = [pl.col("evidence").str.json_path_match(f"$.{k}").alias(f"__ev_{k}") for k in rule.evidence_labels]
    cur = cur.with_columns(ev) if ev else cur
    names = ["analyzer", "kind", "subject", "severity", "score", "summary", *[f"__ev_{k}" for k in rule.evidence_labels]]
    for row in cur.select(names).iter_rows():
        analyzer, kind, subject, severity, score, summary = row[:6]
        labels = {"kind": kind, "subject": subject, "finding_severity": severity}
        labels.update(subject_labels(subject))
        for k, v in zip(rule.evidence_labels, row[6:]):
            if v is not None and v != "":
                labels[k] = v
        if "gpu_uuid" in labels and "host" not in labels and labels["gpu_uuid"] in gpu_host:
            labels["host"] = gpu_host[labels["gpu_uuid"]]
        yield labels, score, summary or ""


def _health_mask(rule: Rule) -> pl.Expr:
    mask = pl.lit(False)
    for sel in rule.health:
        e = pl.lit(True)
        if sel.kinds:
            e = e & _in("kind", sel.kinds)
        if sel.codes:
            e = e & _in("code", sel.codes)
        mask = mask | e
    return mask


def rules_reading(config: AlertingConfig, health_event: pl.DataFrame) -> list[str]:
    """The enabled rules whose health selectors match some of these events: the rules that an evaluation
    run now could make fire on them."""
    if health_event.height == 0:
        return []
    return [r.name for r in config.rules if r.enabled and r.health and health_event.select(_health_mask(r).any()).item()]


def _health_alerts(rule: Rule, df: pl.DataFrame, now: dt.datetime, gpu_host: Mapping[str, str]) -> Iterable[tuple[dict[str, str], float | None, str]]:
    since = now - dt.timedelta(seconds=rule.lookback_s)
    cur = df.filter(_health_mask(rule) & (pl.col("ts") <= now) & (pl.col("ts") >= since))
    if cur.height == 0:
        return
    # One alert per GPU (or host) and code: many XID lines for one fault are one page.
    agg = cur.group_by("host", "gpu_uuid", "kind", "code").agg(pl.len().alias("n"), pl.col("message").drop_nulls().last().alias("message"))
    for host, gpu, kind, code, n, message in agg.iter_rows():
        labels = {"kind": kind, "code": str(code), "subject": f"gpu:{gpu}" if gpu else f"host:{host}"}
        if gpu:
            labels["gpu_uuid"] = gpu
        host = host or gpu_host.get(gpu or "", "")
        if host:
            labels["host"] = host
        yield labels, float(n), message or ""


_OPS = {">": lambda a, b: a > b, ">=": lambda a, b: a >= b, "<": lambda a, b: a < b, "<=": lambda a, b: a <= b, "==": lambda a, b: a == b, "!=": lambda a, b: a != b}


def _metric_alerts(rule: Rule, cond: MetricCondition, df: pl.DataFrame, now: dt.datetime) -> Iterable[tuple[dict[str, str], float | None, str]]:
    since = now - dt.timedelta(seconds=rule.lookback_s)
    prefix = cond.name + "{"
    cur = df.filter(((pl.col("series") == cond.name) | pl.col("series").str.starts_with(prefix)) & (pl.col("ts") <= now) & (pl.col("ts") >= since))
    if cond.op == ABSENT:
        seen = any(all(m.matches(F.parse_series_key(series)[1]) for m in cond.matchers) for series in cur["series"].unique().to_list())
        if not seen:
            yield {m.name: m.value for m in cond.matchers if m.op == "="}, 1.0, f"no sample of {cond.name} in the last {rule.lookback_s:g} s"
        return
    if cur.height == 0:
        return
    reducer = {"last": pl.col("value").sort_by("ts").last(), "mean": pl.col("value").mean(), "min": pl.col("value").min(), "max": pl.col("value").max()}[cond.reduce]
    for series, value in cur.group_by("series").agg(reducer.alias("v")).iter_rows():
        _, labels = F.parse_series_key(series)
        if not all(m.matches(labels) for m in cond.matchers):
            continue
        if value is not None and not math.isnan(value) and _OPS[cond.op](value, cond.threshold):
            yield labels, float(value), ""


def active_alerts(rule: Rule, data: EvalInput, now: dt.datetime) -> dict[str, Active]:
    """The alerts whose condition holds at ``now``, by fingerprint. Several rows with one label set are
    one alert; its value is the highest score / event count / metric value among them."""
    found: list[tuple[dict[str, str], float | None, str]] = []
    if rule.findings and data.finding is not None and data.finding.height:
        found.extend(_finding_alerts(rule, data.finding, now, data.gpu_host))
    if rule.health and data.health_event is not None and data.health_event.height:
        found.extend(_health_alerts(rule, data.health_event, now, data.gpu_host))
    if rule.metric is not None and data.metric_sample is not None and (data.metric_sample.height or rule.metric.op == ABSENT):
        found.extend(_metric_alerts(rule, rule.metric, data.metric_sample, now))
    out: dict[str, Active] = {}
    rule_labels = dict(rule.labels)
    for labels, value, summary in found:
        # Rule labels win over data labels (Prometheus: rule labels overwrite series labels); a rule
        # without a severity takes the finding's, so one rule can cover warnings and criticals.
        full = {**labels, **rule_labels, "alertname": rule.name}
        if "severity" not in full:
            full["severity"] = labels.get("finding_severity", "warning")
        full.pop("finding_severity", None)
        fp = fingerprint(full)
        prev = out.get(fp)
        if prev is not None and (value is None or (prev.value is not None and prev.value >= value)):
            continue
        ann = {k: render(v, full, value, summary) for k, v in rule.annotations}
        out[fp] = Active(full, ann, value)
    return out


# --- the state machine ------------------------------------------------------------------------------


def step_rule(rule: Rule, active: Mapping[str, Active], states: Mapping[str, AlertState], now: dt.datetime) -> dict[str, AlertState]:
    """One evaluation of one rule: the previous states of its alerts and what is active now → next states."""
    out: dict[str, AlertState] = {}
    for fp, a in active.items():
        prev = states.get(fp)
        if prev is None or prev.state == INACTIVE:
            # New, or back after resolving: a new alert, pending from now.
            prev = AlertState(rule.name, fp, a.labels, a.annotations, PENDING, active_at=now, last_active_at=now, value=a.value)
        nxt = replace(prev, labels=a.labels, annotations=a.annotations, last_active_at=now, value=a.value, resolved_at=None)
        if nxt.state == PENDING and (now - nxt.active_at).total_seconds() >= rule.for_s:
            nxt = replace(nxt, state=FIRING, fired_at=now)
        out[fp] = nxt
    for fp, prev in states.items():
        if fp in active or prev.rule != rule.name:
            continue
        if prev.state == PENDING:
            continue  # not true at this evaluation: the for: clock starts again next time
        if prev.state == FIRING:
            if (now - prev.last_active_at).total_seconds() < rule.keep_firing_for_s:
                out[fp] = prev
            else:
                out[fp] = replace(prev, state=INACTIVE, resolved_at=now)
        elif prev.state == INACTIVE and prev.resolved_at is not None and (now - prev.resolved_at).total_seconds() < RESOLVED_RETENTION_S:
            out[fp] = prev
    return out


def evaluate(config: AlertingConfig, data: EvalInput, states: Mapping[str, AlertState], now: dt.datetime) -> dict[str, AlertState]:
    """Evaluate every enabled rule at ``now``. Alerts of rules that were removed or disabled resolve
    (receivers are told, rather than left with an alert that never ends)."""
    by_rule: dict[str, dict[str, AlertState]] = {}
    for fp, s in states.items():
        by_rule.setdefault(s.rule, {})[fp] = s
    out: dict[str, AlertState] = {}
    live = set()
    for rule in config.rules:
        if not rule.enabled:
            continue
        live.add(rule.name)
        out.update(step_rule(rule, active_alerts(rule, data, now), by_rule.get(rule.name, {}), now))
    for name, old in by_rule.items():
        if name in live:
            continue
        for fp, s in old.items():
            if s.state == FIRING:
                out[fp] = replace(s, state=INACTIVE, resolved_at=now)
            elif s.state == INACTIVE and s.resolved_at and (now - s.resolved_at).total_seconds() < RESOLVED_RETENTION_S:
                out[fp] = s
    return out


def empty_input() -> EvalInput:
    return EvalInput(F.FINDING.empty(), F.HEALTH_EVENT.empty(), F.METRIC_SAMPLE.empty())

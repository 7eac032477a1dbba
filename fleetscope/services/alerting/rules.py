"""Alert rules, the notification route tree and inhibition rules, loaded from YAML with validation.

Pure: no I/O beyond reading the file a caller names. The shapes follow the tools on-call engineers know:

- a rule is a Prometheus alerting rule (``alert``/``name``, ``for``, ``keep_firing_for``, ``labels``,
  ``annotations``; Prometheus docs, "Alerting rules") whose condition is over Fleetscope's data instead of
  PromQL: ``findings`` (analyzer conclusions, by kind, severity, subject, evidence), ``health`` (raw
  health events such as XIDs, for the seconds-fast path) or ``metric`` (a roll-up series against a threshold);
- ``route`` and ``inhibit_rules`` are Alertmanager's (Alertmanager docs, "Configuration": ``<route>`` with
  ``receiver``, ``group_by``, ``group_wait``, ``group_interval``, ``repeat_interval``, ``matchers``,
  ``continue``, ``routes``; ``<inhibit_rule>`` with ``source_matchers``, ``target_matchers``, ``equal``).

Every error names the rule (or route) and the field, so a bad file is fixed without reading code.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from fleetscope.services.alerting.labels import Matcher, matchers_string

DEFAULT_RULES_PATH = Path(__file__).with_name("default_rules.yaml")
SEVERITIES = ("info", "warning", "critical")
COMPARISONS = (">", ">=", "<", "<=", "==", "!=")
ABSENT = "absent"
"""``op: absent``: PromQL's ``absent()``: true when no sample of the series (with its matchers) arrived within
the lookback; the alert carries the equality matchers' labels, as ``absent(up{job="x"})`` does."""
REDUCERS = ("last", "mean", "min", "max")
# Evidence keys that become labels when a finding carries them: they are what routing, grouping and
# inhibition ("a host down silences its GPUs") need to see.
DEFAULT_EVIDENCE_LABELS = ("host", "gpu_uuid", "job_id", "rank", "site", "code", "rule_id", "comm_id")
_LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w|y)")
_UNIT_S = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400, "y": 365 * 86400}


class RuleError(ValueError):
    """A rule file or rule document that does not validate; names the rule (or route) and the field."""

    def __init__(self, message: str, *, rule: str | None = None, field: str | None = None, source: str = ""):
        self.message, self.rule, self.field, self.source = message, rule, field, source
        where = ", ".join(p for p in (source or None, f"rule {rule!r}" if rule else None, f"field {field!r}" if field else None) if p)
        super().__init__(f"{where}: {message}" if where else message)


def parse_duration(value: Any) -> float:
    """Seconds from a Prometheus duration (``90s``, ``5m``, ``1h30m``, ``0s``) or a number of seconds."""
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a duration")
    if isinstance(value, (int, float)):
        if value < 0:
            raise ValueError(f"{value!r} is negative")
        return float(value)
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{value!r} is not a duration (expected e.g. 30s, 5m, 1h30m)")
    text = value.strip()
    pos, total = 0, 0.0
    for m in _DURATION.finditer(text):
        if m.start() != pos:
            break
        total += float(m.group(1)) * _UNIT_S[m.group(2)]
        pos = m.end()
    if pos != len(text) or pos == 0:
        raise ValueError(f"{value!r} is not a duration (expected e.g. 30s, 5m, 1h30m)")
    return total


# --- conditions ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class FindingSelector:
    """Which findings make the rule's condition true. Empty tuples match anything."""

    kinds: tuple[str, ...] = ()
    severities: tuple[str, ...] = ()
    analyzers: tuple[str, ...] = ()
    subject: str | None = None  # regex, anchored at both ends
    evidence: tuple[tuple[str, tuple[str, ...]], ...] = ()  # key -> accepted values, compared as text
    min_score: float | None = None


@dataclass(frozen=True)
class HealthSelector:
    """Which raw health events (XID, ECC, ...) make the condition true: no analyzer in the path."""

    kinds: tuple[str, ...] = ()
    codes: tuple[int, ...] = ()


@dataclass(frozen=True)
class MetricCondition:
    """A roll-up series (``metric_sample`` name) compared with a threshold, one alert per series; or, with
    ``op: absent``, one alert when no such series has a sample within the lookback."""

    name: str
    op: str
    threshold: float
    matchers: tuple[Matcher, ...] = ()
    reduce: str = "last"


@dataclass(frozen=True)
class Rule:
    name: str
    findings: tuple[FindingSelector, ...] = ()
    health: tuple[HealthSelector, ...] = ()
    metric: MetricCondition | None = None
    for_s: float = 0.0
    keep_firing_for_s: float = 0.0
    lookback_s: float = 600.0
    labels: tuple[tuple[str, str], ...] = ()
    annotations: tuple[tuple[str, str], ...] = ()
    evidence_labels: tuple[str, ...] = DEFAULT_EVIDENCE_LABELS
    enabled: bool = True
    spec: Mapping[str, Any] = field(default_factory=dict, compare=False, hash=False)



# --- routing and inhibition ------------------------------------------------------------------------


@dataclass(frozen=True)
class Route:
    """Alertmanager's ``<route>``: children inherit what they do not set."""

    receiver: str
    group_by: tuple[str, ...] | None  # None: all labels (Alertmanager's "...")
    group_wait_s: float
    group_interval_s: float
    repeat_interval_s: float
    matchers: tuple[Matcher, ...] = ()
    continue_: bool = False
    routes: tuple[Route, ...] = ()
    key: str = "{}"  # Alertmanager's Route.Key(): the groupKey prefix receivers see
    send_resolved: bool = True
    id: str = "{}"  # Alertmanager's Route.ID(): Key plus the position among siblings, unique

    def match(self, labels: Mapping[str, str]) -> list[Route]:
        """The routes an alert goes to: depth first, the first matching child unless it says ``continue``
        (Alertmanager's ``Route.Match``); the route itself where no child matches."""
        if not all(m.matches(labels) for m in self.matchers):
            return []
        out: list[Route] = []
        for child in self.routes:
            hit = child.match(labels)
            out.extend(hit)
            if hit and not child.continue_:
                break
        return out or [self]

    def group_labels(self, labels: Mapping[str, str]) -> dict[str, str]:
        if self.group_by is None:
            return dict(labels)
        return {k: labels[k] for k in self.group_by if k in labels}


@dataclass(frozen=True)
class InhibitRule:
    """Alertmanager's ``<inhibit_rule>``: a firing source alert mutes target alerts that agree on ``equal``."""

    source_matchers: tuple[Matcher, ...]
    target_matchers: tuple[Matcher, ...]
    equal: tuple[str, ...] = ()


@dataclass(frozen=True)
class AlertingConfig:
    rules: tuple[Rule, ...]
    route: Route
    inhibit_rules: tuple[InhibitRule, ...] = ()
    external_url: str = ""

    def rule(self, name: str) -> Rule:
        for r in self.rules:
            if r.name == name:
                return r
        raise KeyError(name)

    def with_rules(self, overrides: Mapping[str, Rule | None]) -> AlertingConfig:
        """The file's rules with API overrides applied: a Rule replaces or adds, ``None`` deletes."""
        merged = {r.name: r for r in self.rules}
        for name, rule in overrides.items():
            if rule is None:
                merged.pop(name, None)
            else:
                merged[name] = rule
        return AlertingConfig(tuple(merged.values()), self.route, self.inhibit_rules, self.external_url)


# --- parsing ----------------------------------------------------------------------------------------


def _strs(value: Any, what: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, (str, int)) and not isinstance(value, bool):
        return (str(value),)
    if isinstance(value, list) and all(isinstance(v, (str, int)) and not isinstance(v, bool) for v in value):
        return tuple(str(v) for v in value)
    raise ValueError(f"{what}: expected a string or a list of strings, got {value!r}")


def _str_map(value: Any, what: str, *, label_names: bool) -> tuple[tuple[str, str], ...]:
    if value is None:
        return ()
    if not isinstance(value, Mapping):
        raise ValueError(f"{what}: expected a mapping of names to text, got {type(value).__name__}")
    out = []
    for k, v in value.items():
        if not isinstance(k, str) or (label_names and not _LABEL_NAME.match(k)):
            raise ValueError(f"{what}: {k!r} is not a valid label name")
        if isinstance(v, (dict, list)) or v is None:
            raise ValueError(f"{what}.{k}: expected text, got {v!r}")
        out.append((k, str(v)))
    return tuple(out)


def _known_keys(doc: Mapping[str, Any], allowed: set[str], rule: str | None, source: str, prefix: str = "") -> None:
    for k in doc:
        if k not in allowed:
            raise RuleError(f"unknown field (expected some of {', '.join(sorted(allowed))})", rule=rule, field=prefix + str(k), source=source)


_FINDING_KEYS = {"kind", "severity", "analyzer", "subject", "evidence", "min_score"}


def _finding_selector(doc: Any, rule: str, source: str, where: str) -> FindingSelector:
    if not isinstance(doc, Mapping):
        raise RuleError("expected a mapping with kind, severity, subject, evidence", rule=rule, field=where, source=source)
    _known_keys(doc, _FINDING_KEYS, rule, source, where + ".")
    try:
        sev = _strs(doc.get("severity"), "severity")
        bad = [s for s in sev if s not in SEVERITIES]
        if bad:
            raise ValueError(f"severity {bad[0]!r} is not one of {', '.join(SEVERITIES)}")
    except ValueError as exc:
        raise RuleError(str(exc), rule=rule, field=f"{where}.severity", source=source) from None
    subject = doc.get("subject")
    if subject is not None:
        try:
            Matcher("subject", "=~", str(subject))
        except ValueError as exc:
            raise RuleError(str(exc), rule=rule, field=f"{where}.subject", source=source) from None
    evidence = doc.get("evidence") or {}
    if not isinstance(evidence, Mapping):
        raise RuleError("expected a mapping of evidence key to accepted values", rule=rule, field=f"{where}.evidence", source=source)
    ev = []
    for k, v in evidence.items():
        try:
            ev.append((str(k), _strs(v, str(k))))
        except ValueError as exc:
            raise RuleError(str(exc), rule=rule, field=f"{where}.evidence.{k}", source=source) from None
    min_score = doc.get("min_score")
    if min_score is not None and (isinstance(min_score, bool) or not isinstance(min_score, (int, float))):
        raise RuleError(f"{min_score!r} is not a number", rule=rule, field=f"{where}.min_score", source=source)
    try:
        return FindingSelector(
            kinds=_strs(doc.get("kind"), "kind"),
            severities=sev,
            analyzers=_strs(doc.get("analyzer"), "analyzer"),
            subject=None if subject is None else str(subject),
            evidence=tuple(ev),
            min_score=None if min_score is None else float(min_score),
        )
    except ValueError as exc:
        raise RuleError(str(exc), rule=rule, field=where, source=source) from None


def _health_selector(doc: Any, rule: str, source: str, where: str) -> HealthSelector:
    if not isinstance(doc, Mapping):
        raise RuleError("expected a mapping with kind and code", rule=rule, field=where, source=source)
    _known_keys(doc, {"kind", "code"}, rule, source, where + ".")
    codes = doc.get("code")
    codes = [] if codes is None else codes if isinstance(codes, list) else [codes]
    if any(isinstance(c, bool) or not isinstance(c, int) for c in codes):
        raise RuleError(f"expected integer codes, got {codes!r}", rule=rule, field=f"{where}.code", source=source)
    try:
        kinds = _strs(doc.get("kind"), "kind")
    except ValueError as exc:
        raise RuleError(str(exc), rule=rule, field=f"{where}.kind", source=source) from None
    return HealthSelector(kinds=kinds, codes=tuple(codes))


def _metric(doc: Any, rule: str, source: str) -> MetricCondition:
    if not isinstance(doc, Mapping):
        raise RuleError("expected a mapping with name, op, threshold", rule=rule, field="metric", source=source)
    _known_keys(doc, {"name", "op", "threshold", "matchers", "reduce"}, rule, source, "metric.")
    name = doc.get("name")
    if not isinstance(name, str) or not name:
        raise RuleError("missing series name", rule=rule, field="metric.name", source=source)
    op = doc.get("op")
    if op not in (*COMPARISONS, ABSENT):
        raise RuleError(f"{op!r} is not one of {' '.join(COMPARISONS)} {ABSENT}", rule=rule, field="metric.op", source=source)
    threshold = doc.get("threshold", 0.0 if op == ABSENT else None)
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)):
        raise RuleError(f"{threshold!r} is not a number", rule=rule, field="metric.threshold", source=source)
    reduce = doc.get("reduce", "last")
    if reduce not in REDUCERS:
        raise RuleError(f"{reduce!r} is not one of {', '.join(REDUCERS)}", rule=rule, field="metric.reduce", source=source)
    try:
        matchers = tuple(Matcher.from_any(m) for m in (doc.get("matchers") or []))
    except ValueError as exc:
        raise RuleError(str(exc), rule=rule, field="metric.matchers", source=source) from None
    return MetricCondition(name, op, float(threshold), matchers, reduce)


_RULE_KEYS = {"alert", "name", "findings", "health", "metric", "for", "keep_firing_for", "lookback", "labels", "annotations", "evidence_labels", "enabled"}


def parse_rule(doc: Any, *, source: str = "", index: int | None = None) -> Rule:
    """One rule from its YAML/JSON document; raises ``RuleError`` naming the rule and the field."""
    if not isinstance(doc, Mapping):
        raise RuleError(f"rule {index if index is not None else ''} is not a mapping".replace("  ", " "), source=source)
    name = doc.get("alert", doc.get("name"))
    if not isinstance(name, str) or not _LABEL_NAME.match(name):
        raise RuleError(f"missing or invalid rule name {name!r} (letters, digits, _)", rule=None if index is None else f"#{index}", field="alert", source=source)
    _known_keys(doc, _RULE_KEYS, name, source)
    # findings and health may be combined (either makes the condition true: an uncorrectable ECC is an
    # XID 48 event or a DBE finding); a metric condition stands alone, since its labels are the series'.
    conditions = [k for k in ("findings", "health", "metric") if doc.get(k) is not None]
    if not conditions or ("metric" in conditions and len(conditions) > 1):
        raise RuleError("a condition is required: findings and/or health, or metric alone", rule=name, field="findings", source=source)
    findings: tuple[FindingSelector, ...] = ()
    health: tuple[HealthSelector, ...] = ()
    metric = None
    if "findings" in conditions:
        raw = doc["findings"]
        items = raw if isinstance(raw, list) else [raw]
        findings = tuple(_finding_selector(d, name, source, f"findings[{i}]" if isinstance(raw, list) else "findings") for i, d in enumerate(items))
    if "health" in conditions:
        raw = doc["health"]
        items = raw if isinstance(raw, list) else [raw]
        health = tuple(_health_selector(d, name, source, f"health[{i}]" if isinstance(raw, list) else "health") for i, d in enumerate(items))
    if "metric" in conditions:
        metric = _metric(doc["metric"], name, source)
    durations = {}
    for key, default in (("for", 0.0), ("keep_firing_for", 0.0), ("lookback", 600.0)):
        try:
            durations[key] = parse_duration(doc[key]) if key in doc else default
        except ValueError as exc:
            raise RuleError(str(exc), rule=name, field=key, source=source) from None
    try:
        labels = _str_map(doc.get("labels"), "labels", label_names=True)
    except ValueError as exc:
        raise RuleError(str(exc), rule=name, field="labels", source=source) from None
    sev = dict(labels).get("severity")
    if sev is not None and sev not in SEVERITIES:
        raise RuleError(f"severity {sev!r} is not one of {', '.join(SEVERITIES)}", rule=name, field="labels.severity", source=source)
    try:
        annotations = _str_map(doc.get("annotations"), "annotations", label_names=False)
        evidence_labels = _strs(doc["evidence_labels"], "evidence_labels") if "evidence_labels" in doc else DEFAULT_EVIDENCE_LABELS
    except ValueError as exc:
        raise RuleError(str(exc), rule=name, field="annotations" if "annotations" in str(exc) else "evidence_labels", source=source) from None
    enabled = doc.get("enabled", True)
    if not isinstance(enabled, bool):
        raise RuleError(f"{enabled!r} is not true or false", rule=name, field="enabled", source=source)
    return Rule(
        name=name,
        findings=findings,
        health=health,
        metric=metric,
        for_s=durations["for"],
        keep_firing_for_s=durations["keep_firing_for"],
        lookback_s=durations["lookback"],
        labels=labels,
        annotations=annotations,
        evidence_labels=evidence_labels,
        enabled=enabled,
        spec=dict(doc),
    )


_ROUTE_KEYS = {"receiver", "group_by", "group_wait", "group_interval", "repeat_interval", "matchers", "continue", "routes", "send_resolved"}
# Alertmanager's defaults are 30s / 5m / 4h; Fleetscope waits less before the first notification because
# its target is an XID 79 page within seconds (issue 9), and findings already aggregate over windows.
ROUTE_DEFAULTS = {"group_wait": 5.0, "group_interval": 60.0, "repeat_interval": 4 * 3600.0}


def parse_route(doc: Any, *, parent: Route | None = None, source: str = "", where: str = "route", index: int = 0) -> Route:
    if not isinstance(doc, Mapping):
        raise RuleError("expected a mapping", field=where, source=source)
    _known_keys(doc, _ROUTE_KEYS, None, source, where + ".")
    receiver = doc.get("receiver", parent.receiver if parent else None)
    if not isinstance(receiver, str) or not receiver:
        raise RuleError("a route needs a receiver (the root route at least)", field=f"{where}.receiver", source=source)
    if "group_by" in doc:
        gb = doc["group_by"]
        try:
            names = _strs(gb, "group_by")
        except ValueError as exc:
            raise RuleError(str(exc), field=f"{where}.group_by", source=source) from None
        group_by: tuple[str, ...] | None = None if "..." in names else tuple(sorted(set(names)))
    else:
        group_by = parent.group_by if parent else ()
    timers = {}
    for key in ("group_wait", "group_interval", "repeat_interval"):
        try:
            timers[key] = parse_duration(doc[key]) if key in doc else (getattr(parent, f"{key}_s") if parent else ROUTE_DEFAULTS[key])
        except ValueError as exc:
            raise RuleError(str(exc), field=f"{where}.{key}", source=source) from None
    if timers["group_interval"] <= 0:
        raise RuleError("must be above zero", field=f"{where}.group_interval", source=source)
    try:
        matchers = tuple(Matcher.from_any(m) for m in (doc.get("matchers") or []))
    except ValueError as exc:
        raise RuleError(str(exc), field=f"{where}.matchers", source=source) from None
    key = "{}" if parent is None else f"{parent.key}/{matchers_string(matchers)}"
    rid = "{}" if parent is None else f"{parent.key}/{matchers_string(matchers)}/{index}"
    send_resolved = doc.get("send_resolved", parent.send_resolved if parent else True)
    if not isinstance(send_resolved, bool):
        raise RuleError(f"{send_resolved!r} is not true or false", field=f"{where}.send_resolved", source=source)
    route = Route(receiver, group_by, timers["group_wait"], timers["group_interval"], timers["repeat_interval"], matchers,
                  bool(doc.get("continue", False)), (), key, send_resolved, rid)
    children = doc.get("routes") or []
    if not isinstance(children, list):
        raise RuleError("expected a list of routes", field=f"{where}.routes", source=source)
    kids = tuple(parse_route(c, parent=route, source=source, where=f"{where}.routes[{i}]", index=i) for i, c in enumerate(children))
    return Route(route.receiver, route.group_by, route.group_wait_s, route.group_interval_s, route.repeat_interval_s,
                 route.matchers, route.continue_, kids, route.key, route.send_resolved, route.id)


def parse_inhibit_rule(doc: Any, *, source: str = "", where: str = "inhibit_rules") -> InhibitRule:
    if not isinstance(doc, Mapping):
        raise RuleError("expected a mapping", field=where, source=source)
    _known_keys(doc, {"source_matchers", "target_matchers", "equal"}, None, source, where + ".")
    out = {}
    for key in ("source_matchers", "target_matchers"):
        raw = doc.get(key) or []
        if not raw:
            raise RuleError("at least one matcher is required", field=f"{where}.{key}", source=source)
        try:
            out[key] = tuple(Matcher.from_any(m) for m in raw)
        except ValueError as exc:
            raise RuleError(str(exc), field=f"{where}.{key}", source=source) from None
    try:
        equal = _strs(doc.get("equal"), "equal")
    except ValueError as exc:
        raise RuleError(str(exc), field=f"{where}.equal", source=source) from None
    return InhibitRule(out["source_matchers"], out["target_matchers"], equal)


def parse_config(doc: Any, *, source: str = "") -> AlertingConfig:
    """The whole alerting document: ``rules`` (a list, or Prometheus' ``groups: [{rules: [...]}]``),
    ``route``, ``inhibit_rules``, ``external_url``."""
    if not isinstance(doc, Mapping):
        raise RuleError("expected a mapping with rules, route and inhibit_rules", source=source)
    _known_keys(doc, {"rules", "groups", "route", "inhibit_rules", "external_url"}, None, source)
    raw_rules: list[Any] = list(doc.get("rules") or [])
    for gi, group in enumerate(doc.get("groups") or []):
        if not isinstance(group, Mapping) or not isinstance(group.get("rules"), list):
            raise RuleError("a group needs a list of rules", field=f"groups[{gi}].rules", source=source)
        raw_rules.extend(group["rules"])
    rules = [parse_rule(r, source=source, index=i) for i, r in enumerate(raw_rules)]
    seen: set[str] = set()
    for r in rules:
        if r.name in seen:
            raise RuleError("duplicate rule name", rule=r.name, field="alert", source=source)
        seen.add(r.name)
    route = parse_route(doc.get("route") or {"receiver": "default"}, source=source)
    inhibit = tuple(parse_inhibit_rule(d, source=source, where=f"inhibit_rules[{i}]") for i, d in enumerate(doc.get("inhibit_rules") or []))
    ext = doc.get("external_url", "")
    return AlertingConfig(tuple(rules), route, inhibit, str(ext or ""))


def load_config(path: str | Path | None = None, *, text: str | None = None) -> AlertingConfig:
    """Read and validate an alerting file (the shipped defaults when neither path nor text is given)."""
    if text is None:
        p = Path(path) if path is not None else DEFAULT_RULES_PATH
        text, source = p.read_text(), str(p)
    else:
        source = str(path or "<text>")
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise RuleError(f"not valid YAML: {exc}", source=source) from None
    return parse_config(doc or {}, source=source)

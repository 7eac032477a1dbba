"""Core types of the AI Act rules: declarations, evidence, results, applicability.

Regulation (EU) 2024/1689 (the AI Act) asks for facts Fleetscope can measure (training compute, fairness
group counts, lineage, log retention, SDC and failure history) and facts only a person can state (the
intended purpose, the Annex III area, oversight measures, incidents). The second kind are
``Declaration`` records: who entered what, and when, so every rule result can say whose word it rests on.

Pure: no database, HTTP or clock. ``now`` is always passed in.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from typing import Any

from fleetscope.core.errors import FleetscopeError
from governance.lineage import Taint
from governance.registry import ModelEntry

# --- vocabulary -------------------------------------------------------------------------------------

PASS, FAIL, MISSING, NOT_APPLICABLE = "pass", "fail", "missing_evidence", "not_applicable"
STATUSES = (PASS, FAIL, MISSING, NOT_APPLICABLE)

PROVIDER, DEPLOYER = "provider", "deployer"
"""Art. 3(3) provider, Art. 3(4) deployer. The registry's ``provider_and_deployer`` holds both roles."""

PROHIBITED = "prohibited"  # Art. 5
HIGH_RISK = "high_risk"  # Art. 6(2) with Annex III
HIGH_RISK_ANNEX_I = "high_risk_annex_i"  # Art. 6(1): safety component of an Annex I product (later date)
LIMITED = "limited"  # Art. 50 transparency obligations only
MINIMAL = "minimal"
GPAI = "gpai"  # general-purpose AI model, Art. 3(63), Chapter V
GPAI_SYSTEMIC = "gpai_systemic"  # Art. 51
RISK_CLASSES = (PROHIBITED, HIGH_RISK, HIGH_RISK_ANNEX_I, LIMITED, MINIMAL, GPAI, GPAI_SYSTEMIC)
HIGH_RISK_CLASSES = frozenset({HIGH_RISK, HIGH_RISK_ANNEX_I})
GPAI_CLASSES = frozenset({GPAI, GPAI_SYSTEMIC})

ORG = "*"
"""``model_name`` of a declaration that holds for the whole organisation (the QMS of Art. 17), and
``model_version`` of one that holds for every version of a model."""

SIX_MONTHS_DAYS = 183
"""Art. 19(1) and 26(6): logs kept "for a period ... of at least six months". Six calendar months are at
most 184 days; 183 is the figure the README and settings already state, and the policy may raise it."""


class DeclarationError(FleetscopeError, ValueError):
    """A declaration whose value does not fit its kind: names the kind and the field."""


def utc(t: datetime) -> datetime:
    """Naive datetimes are read as UTC (the store's convention)."""
    return t.replace(tzinfo=UTC) if t.tzinfo is None else t.astimezone(UTC)


def parse_time(v: Any) -> datetime | None:
    """A declared date or datetime (RFC 3339 / ISO 8601 text, ``date`` or ``datetime``) as UTC."""
    if v is None or v == "":
        return None
    if isinstance(v, datetime):
        return utc(v)
    if isinstance(v, date):
        return datetime(v.year, v.month, v.day, tzinfo=UTC)
    if isinstance(v, str):
        try:
            return utc(datetime.fromisoformat(v.replace("Z", "+00:00")))
        except ValueError:
            return None
    return None


def iso(t: datetime | date | None) -> str | None:
    if t is None:
        return None
    if isinstance(t, datetime):
        return utc(t).isoformat().replace("+00:00", "Z")
    return t.isoformat()


def canonical_json(value: Any) -> str:
    """Sorted keys, no spaces, UTF-8 kept: equal values give equal text (ids and hashes rely on it)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=_json_default)


def _json_default(v: Any) -> Any:
    if isinstance(v, (datetime, date)):
        return iso(v)
    if isinstance(v, (set, frozenset, tuple)):
        return sorted(v) if isinstance(v, (set, frozenset)) else list(v)
    raise TypeError(f"{type(v).__name__} is not JSON serialisable")


# --- declarations -----------------------------------------------------------------------------------

# kind -> {field: (type, required)}. Types: str, bool, int, float, time (date or datetime text),
# list (of strings), dict. A declaration's ``key`` tells records of one kind apart (a QMS letter, an
# Annex IV point, an incident id); "" where a kind has one record per model.
DECLARATION_KINDS: dict[str, dict[str, tuple[str, bool]]] = {
    "purpose": {"text": ("str", True)},
    "area": {"area": ("str", True), "point": ("str", False), "note": ("str", False)},
    "classification": {
        "general_purpose": ("bool", False), "self_assessed_risk": ("str", False), "profiling": ("bool", False),
        "art6_3_condition": ("str", False), "art6_4_assessment": ("str", False), "annex_i_product": ("bool", False),
        "art50_transparency": ("bool", False), "designated_systemic": ("bool", False), "placed_on_market_at": ("time", False),
    },
    "art5_exception": {"justification": ("str", True), "legal_basis": ("str", False)},
    "risk_management": {"reviewed_at": ("time", True), "reference": ("str", True)},
    "mitigation": {"action": ("str", True), "reference": ("str", False)},
    "data_justification": {"justification": ("str", True), "deletion_plan": ("str", True), "safeguards": ("str", False)},
    "documentation": {"reference": ("str", True)},
    "logging": {"enabled": ("bool", True), "in_service_since": ("time", False), "location": ("str", False)},
    "instructions": {"reference": ("str", True), "accuracy": ("str", False), "per_group_performance": ("str", False)},
    "oversight": {"measures": ("list", True), "override": ("bool", True), "stop": ("bool", True), "assigned_to": ("str", False)},
    "accuracy_metrics": {"metrics": ("dict", True), "tolerance": ("float", False)},
    "qms": {"reference": ("str", True)},
    "notification": {"notified_at": ("time", True), "reference": ("str", False)},
    "planned_compute": {"training_flops": ("float", True), "known_at": ("time", True)},
    "model_evaluation": {"performed_at": ("time", True), "reference": ("str", True)},
    "adversarial_test": {"performed_at": ("time", True), "reference": ("str", True)},
    "post_market_plan": {"active": ("bool", True), "interval_days": ("int", True), "last_review_at": ("time", False), "reference": ("str", False)},
    "incident": {
        "kind": ("str", True), "occurred_at": ("time", False), "aware_at": ("time", False),
        "reported_at": ("time", False), "authority": ("str", False), "description": ("str", False),
        "finding": ("str", False),  # the monitoring finding it was declared from (kind/subject/window start)
    },
}

ANNEX_III: dict[str, tuple[str, str]] = {
    "biometrics": ("1", "Biometrics: remote biometric identification, biometric categorisation by sensitive attributes, emotion recognition"),
    "critical_infrastructure": ("2", "Critical infrastructure: safety components in critical digital infrastructure, road traffic, supply of water, gas, heating or electricity"),
    "education": ("3", "Education and vocational training: admission, evaluating learning outcomes, level of education, monitoring behaviour during tests"),
    "employment": ("4", "Employment and workers' management: recruitment and selection, decisions on terms, promotion, termination, task allocation, monitoring"),
    "essential_services": ("5", "Essential private and public services: public assistance, creditworthiness and credit scoring (5(b)), life and health insurance pricing, emergency triage"),
    "law_enforcement": ("6", "Law enforcement: victim risk, polygraphs, reliability of evidence, risk of offending, profiling in investigations"),
    "migration": ("7", "Migration, asylum and border control management"),
    "justice": ("8", "Administration of justice and democratic processes: assisting judicial authorities, influencing elections or referendums"),
}
"""Annex III areas (points 1-8) by the key a declaration uses, with the point and a summary."""

INCIDENT_KINDS = ("death", "serious_harm_health", "critical_infrastructure", "widespread_infringement",
                  "fundamental_rights", "property_environment")
"""Art. 3(49)(a)-(d) serious incidents, with (a) split into death and serious harm to health (Art. 73(4)
gives a death its own deadline) and Art. 3(61) widespread infringement (Art. 73(3))."""


def _type_ok(t: str, v: Any) -> bool:
    if t == "str":
        return isinstance(v, str) and bool(v.strip())
    if t == "bool":
        return isinstance(v, bool)
    if t == "int":
        return isinstance(v, int) and not isinstance(v, bool)
    if t == "float":
        return isinstance(v, (int, float)) and not isinstance(v, bool)
    if t == "time":
        return parse_time(v) is not None
    if t == "list":
        return isinstance(v, (list, tuple)) and all(isinstance(x, str) for x in v)
    if t == "dict":
        return isinstance(v, dict)
    raise AssertionError(t)


def validate_declaration_value(kind: str, value: Mapping[str, Any]) -> dict[str, Any]:
    """Check ``value`` against ``DECLARATION_KINDS[kind]``; dates come back as ISO text.

    Raises ``DeclarationError`` naming the kind and field: an unknown kind or field, a missing required
    field, a value of the wrong type. Unknown fields are refused so that a typo ("reviewd_at") is not
    stored as if it were evidence.
    """
    if kind not in DECLARATION_KINDS:
        raise DeclarationError(f"unknown declaration kind {kind!r} (known: {', '.join(sorted(DECLARATION_KINDS))})")
    if not isinstance(value, Mapping):
        raise DeclarationError(f"{kind}: the value must be a JSON object")
    schema = DECLARATION_KINDS[kind]
    out: dict[str, Any] = {}
    for k, v in value.items():
        if k not in schema:
            raise DeclarationError(f"{kind}: unknown field {k!r} (fields: {', '.join(schema)})")
        if v is None:
            continue
        t, _ = schema[k]
        if not _type_ok(t, v):
            raise DeclarationError(f"{kind}.{k}: {v!r} is not a valid {t}")
        out[k] = iso(parse_time(v)) if t == "time" else (list(v) if t == "list" else v)
    for k, (_, req) in schema.items():
        if req and k not in out:
            raise DeclarationError(f"{kind}: required field {k!r} is missing")
    if kind == "area" and out["area"] not in ANNEX_III and out["area"] != "none":
        raise DeclarationError(f"area.area: {out['area']!r} is not one of {', '.join(ANNEX_III)} or 'none' (Annex III points 1-8)")
    if kind == "incident" and out["kind"] not in INCIDENT_KINDS:
        raise DeclarationError(f"incident.kind: {out['kind']!r} is not one of {', '.join(INCIDENT_KINDS)}")
    return out


@dataclass(frozen=True)
class Declaration:
    """A fact a person stated: ``kind`` (see ``DECLARATION_KINDS``), ``key`` within the kind, ``value``
    (JSON object), who entered it and when. Later records of the same (model, version, kind, key)
    supersede earlier ones; a ``retracted`` record withdraws the fact. The store keeps every record."""

    model_name: str
    model_version: str
    kind: str
    key: str
    value: Mapping[str, Any]
    entered_by: str
    entered_at: datetime
    retracted: bool = False
    source: str = ""

    @property
    def declaration_id(self) -> str:
        """Content hash: the same statement re-sent is one record."""
        body = [self.model_name, self.model_version, self.kind, self.key, canonical_json(dict(self.value)),
                self.entered_by, iso(self.entered_at), self.retracted]
        return hashlib.sha256(canonical_json(body).encode()).hexdigest()

    def ref(self) -> EvidenceRef:
        return EvidenceRef("declaration", self.declaration_id, self.entered_at,
                           f"{self.kind}{'/' + self.key if self.key else ''} by {self.entered_by}")


def declare(model_name: str, model_version: str, kind: str, value: Mapping[str, Any], *, entered_by: str,
            entered_at: datetime, key: str = "", retracted: bool = False, source: str = "") -> Declaration:
    """A validated ``Declaration`` (what the API and CLI call before storing one)."""
    if not entered_by.strip():
        raise DeclarationError("a declaration needs the name of whoever entered it")
    if not model_name:
        raise DeclarationError(f"a declaration needs a model name ({ORG!r} for the whole organisation)")
    clean = {} if retracted else validate_declaration_value(kind, value)
    if retracted and kind not in DECLARATION_KINDS:
        raise DeclarationError(f"unknown declaration kind {kind!r}")
    return Declaration(model_name, model_version or ORG, kind, key, clean, entered_by, utc(entered_at), retracted, source)


def current(declarations: Iterable[Declaration], model: ModelEntry, *, as_of: datetime | None = None) -> dict[tuple[str, str], Declaration]:
    """(kind, key) -> the declaration in force for ``model`` as of ``as_of``: the newest record for the
    exact version beats one for all versions (``*``), which beats an organisation-wide one; retractions
    remove the fact. Records entered after ``as_of`` are ignored, so a report can be re-run for a past date."""
    best: dict[tuple[str, str], tuple[int, datetime, Declaration]] = {}
    for d in declarations:
        if as_of is not None and d.entered_at > as_of:
            continue
        if d.model_name == model.name and d.model_version == model.version:
            rank = 2
        elif d.model_name == model.name and d.model_version == ORG:
            rank = 1
        elif d.model_name == ORG:
            rank = 0
        else:
            continue
        k = (d.kind, d.key)
        cur = best.get(k)
        if cur is None or (rank, d.entered_at) >= (cur[0], cur[1]):
            best[k] = (rank, d.entered_at, d)
    return {k: v[2] for k, v in best.items() if not v[2].retracted}


# --- evidence ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class EvidenceRef:
    """What a result rests on: ``kind`` (declaration, fairness_evaluation, lineage_taint, model_footprint,
    logging, robustness, registry), an id within it, when it was observed or entered, a short text."""

    kind: str
    ref: str
    as_of: datetime | None = None
    detail: str = ""

    def to_dict(self, now: datetime | None = None) -> dict[str, Any]:
        d: dict[str, Any] = {"kind": self.kind, "ref": self.ref, "as_of": iso(self.as_of), "detail": self.detail}
        if now is not None:
            d["age_days"] = None if self.as_of is None else round((utc(now) - utc(self.as_of)) / timedelta(days=1), 1)
        return d


@dataclass(frozen=True)
class FairnessGroup:
    feature: str
    group: str
    count: int
    judged: bool
    accuracy: float | None = None
    tp: int = 0
    fp: int = 0
    tn: int = 0
    fn: int = 0


@dataclass(frozen=True)
class FairnessRecord:
    """One stored fairness evaluation (``fairness_evaluation`` + its ``fairness_group`` rows)."""

    evaluation_id: str
    evaluated_at: datetime | None
    passed: bool | None
    min_group_size: int
    n_rows: int
    groups: tuple[FairnessGroup, ...] = ()
    failed_checks: tuple[str, ...] = ()

    def ref(self) -> EvidenceRef:
        verdict = {True: "passed", False: "failed", None: "not judged"}[self.passed]
        return EvidenceRef("fairness_evaluation", self.evaluation_id, self.evaluated_at, f"{self.n_rows} rows, policy {verdict}")

    def overall_accuracy(self) -> float | None:
        """Accuracy over all rows, from the confusion counts of one single-column feature (any one
        partitions every row exactly once)."""
        feats = sorted({g.feature for g in self.groups if "&" not in g.feature})
        if not feats:
            return None
        gs = [g for g in self.groups if g.feature == feats[0]]
        n = sum(g.tp + g.fp + g.tn + g.fn for g in gs)
        return (sum(g.tp + g.tn for g in gs) / n) if n else None


@dataclass(frozen=True)
class LineageEvidence:
    """Taints reaching the model (``governance.lineage.propagate``) and whether its training runs were
    seen at all: no runs in lineage means the absence of taints proves nothing."""

    training_runs_seen: int
    taints: tuple[Taint, ...] = ()
    as_of: datetime | None = None


@dataclass(frozen=True)
class LoggingEvidence:
    """Art. 12 / 19(1) / 26(6): whether the system's events are logged, the store's retention setting and
    the oldest log record actually held. ``in_service_since``: when logging of this system began (the
    oldest record cannot be older than that)."""

    enabled: bool | None
    retention_days: int | None
    oldest_record_at: datetime | None
    in_service_since: datetime | None = None
    as_of: datetime | None = None
    source: str = ""


@dataclass(frozen=True)
class ComputeEvidence:
    """Training footprint (``analyzers.carbon.model_footprint``) and, for Art. 52, when cumulative
    measured compute crossed the threshold (``threshold_crossing``)."""

    training_flops: float | None
    flops_basis: str = "unknown"
    training_time_s: float | None = None
    time_basis: str = "unknown"
    energy_j: float | None = None
    energy_basis: str = "unknown"
    threshold_crossed_at: datetime | None = None
    training_ended_at: datetime | None = None
    as_of: datetime | None = None

    @classmethod
    def from_footprint(cls, fp: Any, *, threshold_crossed_at: datetime | None = None, training_ended_at: datetime | None = None,
                       as_of: datetime | None = None) -> ComputeEvidence:
        """From an ``analyzers.carbon.ModelFootprint``."""
        return cls(fp.training_flops, fp.flops_basis, fp.training_time_s, fp.time_basis, fp.energy_j, fp.energy_basis,
                   threshold_crossed_at, training_ended_at, as_of)

    def ref(self, model: str) -> EvidenceRef:
        return EvidenceRef("model_footprint", model, self.as_of,
                           f"FLOPs {self.training_flops!r} ({self.flops_basis}); time {self.training_time_s!r} s; energy {self.energy_j!r} J")


@dataclass(frozen=True)
class RobustnessEvidence:
    """Art. 15(4): SDC suspicions and failures on the hardware that ran the model's jobs, in a window."""

    window_start: datetime
    window_end: datetime
    jobs: int
    failures: int
    sdc_suspects: int
    sdc_unresolved: int
    as_of: datetime | None = None

    def ref(self) -> EvidenceRef:
        return EvidenceRef("robustness", f"{iso(self.window_start)}/{iso(self.window_end)}", self.as_of or self.window_end,
                           f"{self.jobs} jobs, {self.failures} failures, {self.sdc_suspects} SDC suspects ({self.sdc_unresolved} unresolved)")


@dataclass(frozen=True)
class MonitoringEvidence:
    """Art. 72 and Art. 15: the post-market monitoring windows stored for the version (``monitoring_window``,
    ``fleetscope.services.monitoring``): how many, the latest one's end, the accuracy over the recent
    windows' arrived outcomes, and the recent monitoring findings per kind."""

    windows: int
    first_window_start: datetime | None
    last_window_end: datetime | None
    recent_windows: int = 0
    recent_outcomes: int = 0
    recent_accuracy: float | None = None
    findings: Mapping[str, int] = field(default_factory=dict)
    as_of: datetime | None = None

    def ref(self) -> EvidenceRef:
        kinds = ", ".join(f"{k} {n}" for k, n in sorted(self.findings.items())) or "no findings"
        acc = f"accuracy {self.recent_accuracy:.3f} over {self.recent_outcomes} outcomes" if self.recent_accuracy is not None else "no outcomes yet"
        return EvidenceRef("monitoring", f"{iso(self.first_window_start)}/{iso(self.last_window_end)}", self.last_window_end or self.as_of,
                           f"{self.windows} windows; recent: {self.recent_windows}, {acc}; {kinds}")


@dataclass(frozen=True)
class AuditPolicy:
    """Organisation policy the Regulation leaves open ("regularly", "appropriate"): how old evidence may
    be, and the minimum group size that counts as represented."""

    risk_review_days: int = 365
    fairness_max_age_days: int = 180
    min_group_size: int | None = None  # None: the evaluation's own min_group_size
    representation_features: tuple[str, ...] | None = None  # None: every single-column feature
    min_log_retention_days: int = SIX_MONTHS_DAYS
    log_grace_days: int = 2
    evaluation_max_age_days: int = 365
    post_market_grace_days: int = 7
    monitoring_max_gap_days: int = 2  # Art. 72(2) "actively ... collect": the latest window no older than this
    monitoring_min_outcomes: int = 100  # outcomes the recent accuracy must rest on before it is compared
    accuracy_tolerance: float = 0.02
    systemic_flops_threshold: float = 1e25

    def to_dict(self) -> dict[str, Any]:
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in self.__dict__.items()}


@dataclass(frozen=True)
class Evidence:
    """Everything the rules read about one model version. ``None`` means "not collected", which the rules
    report as missing evidence, never as a pass."""

    model: ModelEntry
    declarations: tuple[Declaration, ...] = ()
    fairness: tuple[FairnessRecord, ...] = ()
    lineage: LineageEvidence | None = None
    logging: LoggingEvidence | None = None
    compute: ComputeEvidence | None = None
    robustness: RobustnessEvidence | None = None
    policy: AuditPolicy = field(default_factory=AuditPolicy)
    monitoring: MonitoringEvidence | None = None

    def current(self, now: datetime) -> dict[tuple[str, str], Declaration]:
        return current(self.declarations, self.model, as_of=now)


# --- results ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RuleResult:
    rule_id: str
    title: str
    citation: str
    status: str
    reason: str
    evidence: tuple[EvidenceRef, ...] = ()
    due_at: datetime | None = None

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"status {self.status!r} not in {STATUSES}")

    def to_dict(self, now: datetime | None = None) -> dict[str, Any]:
        return {"rule_id": self.rule_id, "title": self.title, "citation": self.citation, "status": self.status,
                "reason": self.reason, "due_at": iso(self.due_at), "evidence": [e.to_dict(now) for e in self.evidence]}

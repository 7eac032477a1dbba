"""EU AI Act obligations as code: the registry of rules, versioned rule sets, evaluation. The risk
classification is ``aiact.classify``, the check of each article ``aiact.checks``.

Each ``Rule`` cites the article and paragraph of Regulation (EU) 2024/1689 it checks, says to whom and from
when it applies (``Applicability``: role, risk class, date per Art. 113 and the transitional Art. 111(3)),
and checks an ``Evidence`` object, returning pass / fail / missing_evidence / not_applicable with one
sentence saying why and references to the evidence used.

Dates of application (Art. 113):
- Chapters I-II, so Art. 5 (prohibited practices): 2 February 2025 (Art. 113(a));
- Chapter V (general-purpose AI models, Art. 51-55): 2 August 2025 (Art. 113(b)); models placed on the
  market before that date have until 2 August 2027 (Art. 111(3));
- the rest, so high-risk obligations for Annex III systems (Art. 6(2), 9-17, 19, 26, 72, 73): 2 August 2026;
- Art. 6(1) (safety components of Annex I products) and its obligations: 2 August 2027 (Art. 113(c)).

Amendments are kept as versioned ``RuleSet`` objects: a result names the rule set it was computed under,
so a report re-run later under an amended set is told apart from the original.

Pure: ``now`` is passed in; nothing here reads the clock, the store or the network.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import date, datetime
from typing import Any

from governance.aiact.checks import (
    Outcome, check_art5, check_art6, check_art9, check_art10_bias, check_art10_representation, check_art10_special,
    check_art11, check_art12, check_art13, check_art14, check_art15, check_art17, check_art51_52, check_art53,
    check_art55, check_art72, check_art73, declare_hint, missing_evidence,
)
from governance.aiact.classify import Classification, classify
from governance.aiact.model import (
    DEPLOYER,
    FAIL,
    GPAI,
    GPAI_CLASSES,
    GPAI_SYSTEMIC,
    HIGH_RISK,
    HIGH_RISK_ANNEX_I,
    HIGH_RISK_CLASSES,
    MISSING,
    NOT_APPLICABLE,
    PASS,
    PROVIDER,
    RISK_CLASSES,
    Evidence,
    RuleResult,
    iso,
    parse_time,
    utc,
)

REGULATION = "Regulation (EU) 2024/1689"

D_PROHIBITED = date(2025, 2, 2)  # Art. 113(a)
D_GPAI = date(2025, 8, 2)  # Art. 113(b)
D_HIGH_RISK = date(2026, 8, 2)  # Art. 113, first subparagraph
D_ANNEX_I = date(2027, 8, 2)  # Art. 113(c)
D_GPAI_LEGACY = date(2027, 8, 2)  # Art. 111(3)


# --- rules ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Applicability:
    """To whom and from when a rule applies. ``applies_from`` per risk class (a rule for several classes
    may start on different dates, Art. 113); ``"*"`` is the date for any class. ``legacy_gpai``: models
    placed on the market before 2 August 2025 comply by 2 August 2027 (Art. 111(3))."""

    roles: frozenset[str]
    risk_classes: frozenset[str]
    applies_from: Mapping[str, date]
    legacy_gpai: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {"roles": sorted(self.roles), "risk_classes": sorted(self.risk_classes),
                "applies_from": {k: v.isoformat() for k, v in sorted(self.applies_from.items())}, "legacy_gpai": self.legacy_gpai}


Check = Callable[[Evidence, Classification, datetime], Outcome]


@dataclass(frozen=True)
class Rule:
    rule_id: str
    title: str
    citation: str
    applicability: Applicability
    check: Check = field(compare=False)

    def to_dict(self) -> dict[str, Any]:
        return {"rule_id": self.rule_id, "title": self.title, "citation": self.citation, "applicability": self.applicability.to_dict()}


def roles_of(role: str) -> frozenset[str]:
    return frozenset({PROVIDER, DEPLOYER}) if role == "provider_and_deployer" else frozenset({role})


def applies(rule: Rule, ev: Evidence, cls: Classification, now: datetime) -> Outcome | None:
    """``None`` when ``rule`` applies to this model on ``now``'s date; else the not-applicable (or, when
    the risk class is undecided, missing-evidence) outcome saying why."""
    a = rule.applicability
    roles = roles_of(ev.model.role)
    if not roles & a.roles:
        return Outcome(NOT_APPLICABLE, f"applies to {' and '.join(sorted(a.roles))}s; {ev.model.node_id} is registered as {ev.model.role}")
    # A rule for every class (Art. 5, Art. 6) runs even while the class is undecided: deciding it is its job.
    hit = (cls.classes or frozenset({"*"})) if a.risk_classes >= _ALL else cls.classes & a.risk_classes
    if not hit:
        undecided = ("high_risk" in cls.unknown and a.risk_classes & HIGH_RISK_CLASSES) or ("gpai" in cls.unknown and a.risk_classes & GPAI_CLASSES)
        if undecided:
            area = a.risk_classes & HIGH_RISK_CLASSES and "high_risk" in cls.unknown
            what = "no Annex III area (or 'none') is declared" if area else "whether the model is general-purpose is not declared"
            hint = declare_hint(ev, "area") if area else declare_hint(ev, "classification") + ' with "general_purpose"'
            return missing_evidence(f"cannot tell whether this applies: {what} (Art. 6, Art. 3(63))", hint, cls.evidence)
        have = ", ".join(sorted(cls.classes)) or "undecided"
        return Outcome(NOT_APPLICABLE, f"applies to {', '.join(sorted(a.risk_classes))} systems; this one is {have}", cls.evidence)
    start = min(a.applies_from.get(c, a.applies_from.get("*", date.min)) for c in hit)
    today = utc(now).date()
    if today < start:
        return Outcome(NOT_APPLICABLE, f"applies from {start.isoformat()} (Art. 113); audited as of {today.isoformat()}")
    if a.legacy_gpai and hit & GPAI_CLASSES:
        cd = ev.current(now).get(("classification", ""))
        placed = parse_time(cd.value.get("placed_on_market_at")) if cd else None
        if placed is not None and placed.date() < D_GPAI and today < D_GPAI_LEGACY:
            return Outcome(NOT_APPLICABLE, f"placed on the market {placed.date().isoformat()}, before {D_GPAI.isoformat()}: "
                           f"compliance due by {D_GPAI_LEGACY.isoformat()} (Art. 111(3))", (cd.ref(),))
    return None


# --- rule sets --------------------------------------------------------------------------------------

_BOTH = frozenset({PROVIDER, DEPLOYER})
_PROV = frozenset({PROVIDER})
_ALL = frozenset(RISK_CLASSES)
_HR = frozenset(HIGH_RISK_CLASSES)
_HR_FROM = {HIGH_RISK: D_HIGH_RISK, HIGH_RISK_ANNEX_I: D_ANNEX_I}


def _hr(roles: frozenset[str] = _PROV) -> Applicability:
    return Applicability(roles, _HR, _HR_FROM)


_RULES_2024: tuple[Rule, ...] = (
    Rule("art5", "Prohibited AI practices", "Art. 5(1)(a)-(h)", Applicability(_BOTH, _ALL, {"*": D_PROHIBITED}), check_art5),
    Rule("art6", "Risk classification (Annex III)", "Art. 6(2)-(4), Annex III", Applicability(_BOTH, _ALL, {"*": D_HIGH_RISK, HIGH_RISK_ANNEX_I: D_ANNEX_I}), check_art6),
    Rule("art9", "Risk management system", "Art. 9(1)-(2)", _hr(), check_art9),
    Rule("art10.2fg", "Bias examination and mitigation", "Art. 10(2)(f)-(g)", _hr(), check_art10_bias),
    Rule("art10.3", "Representative data", "Art. 10(3)", _hr(), check_art10_representation),
    Rule("art10.5", "Special categories of personal data", "Art. 10(5)(a)-(f)", _hr(), check_art10_special),
    Rule("art11", "Technical documentation", "Art. 11(1), Annex IV", _hr(), check_art11),
    Rule("art12", "Record-keeping and log retention", "Art. 12(1), Art. 19(1), Art. 26(6)", _hr(_BOTH), check_art12),
    Rule("art13", "Transparency: instructions for use", "Art. 13(3)(b)(ii), (v)", _hr(), check_art13),
    Rule("art14", "Human oversight", "Art. 14(1), (3), (4)(d)-(e)", _hr(_BOTH), check_art14),
    Rule("art15", "Accuracy and robustness", "Art. 15(1), (3), (4)", _hr(), check_art15),
    Rule("art17", "Quality management system", "Art. 17(1)(a)-(m)", _hr(), check_art17),
    Rule("art51-52", "Systemic risk threshold and notification", "Art. 51(2), Art. 52(1)",
         Applicability(_PROV, frozenset({GPAI, GPAI_SYSTEMIC}), {"*": D_GPAI}, legacy_gpai=True), check_art51_52),
    Rule("art53", "GPAI documentation: compute, time, energy", "Art. 53(1)(a), Annex XI Section 1 point 2(d)-(e)",
         Applicability(_PROV, frozenset({GPAI, GPAI_SYSTEMIC}), {"*": D_GPAI}, legacy_gpai=True), check_art53),
    Rule("art55", "Systemic-risk evaluation and adversarial testing", "Art. 55(1)(a)",
         Applicability(_PROV, frozenset({GPAI_SYSTEMIC}), {"*": D_GPAI}, legacy_gpai=True), check_art55),
    Rule("art72", "Post-market monitoring", "Art. 72(1)-(3)", _hr(), check_art72),
    Rule("art73", "Serious incident reporting", "Art. 73(2)-(4)", _hr(), check_art73),
)


@dataclass(frozen=True)
class RuleSet:
    """A version of the rules. ``in_force``: False for a proposal kept to see its effect (what-if); the
    default rule set is the newest one in force."""

    version: str
    title: str
    source: str
    published: date
    in_force: bool
    rules: tuple[Rule, ...]

    def rule(self, rule_id: str) -> Rule:
        for r in self.rules:
            if r.rule_id == rule_id:
                return r
        raise KeyError(rule_id)

    def amended(self, version: str, title: str, source: str, published: date, *, in_force: bool,
                applies_from: Mapping[str, Mapping[str, date]] | None = None, replace_rules: Iterable[Rule] = ()) -> RuleSet:
        """A new rule set: ``applies_from`` moves dates (rule id -> class -> date), ``replace_rules`` swaps
        whole rules by id (a rule with a new id is added). The original is left unchanged."""
        by_id = {r.rule_id: r for r in self.rules}
        for rid, dates in (applies_from or {}).items():
            r = by_id[rid]
            by_id[rid] = replace(r, applicability=replace(r.applicability, applies_from={**r.applicability.applies_from, **dates}))
        for r in replace_rules:
            by_id[r.rule_id] = r
        return RuleSet(version, title, source, published, in_force, tuple(by_id.values()))

    def to_dict(self) -> dict[str, Any]:
        return {"version": self.version, "title": self.title, "source": self.source, "published": self.published.isoformat(),
                "in_force": self.in_force, "rules": [r.to_dict() for r in self.rules]}


AI_ACT_2024 = RuleSet("2024-1689", "EU AI Act as published", f"{REGULATION}, OJ L, 12.7.2024", date(2024, 7, 12), True, _RULES_2024)

_HR_IDS = [r.rule_id for r in _RULES_2024 if r.applicability.risk_classes == _HR]
OMNIBUS_PROPOSAL_2025 = AI_ACT_2024.amended(
    "2025-omnibus-proposal",
    "Digital Omnibus on AI (proposal): later high-risk dates",
    "European Commission proposal of 19 November 2025 amending Regulation (EU) 2024/1689; not adopted law - check the adopted text before relying on it",
    date(2025, 11, 19),
    in_force=False,
    # The proposal ties high-risk obligations to the availability of standards with long-stop dates of
    # 2 December 2027 (Annex III) and 2 August 2028 (Annex I); the long-stop dates are modelled here.
    applies_from={rid: {HIGH_RISK: date(2027, 12, 2), HIGH_RISK_ANNEX_I: date(2028, 8, 2)} for rid in (*_HR_IDS, "art6")},
)

RULE_SETS: dict[str, RuleSet] = {s.version: s for s in (AI_ACT_2024, OMNIBUS_PROPOSAL_2025)}


def rule_set(version: str | None = None, *, as_of: date | None = None) -> RuleSet:
    """The rule set ``version``, or the newest one in force published on or before ``as_of``."""
    if version is not None:
        try:
            return RULE_SETS[version]
        except KeyError:
            raise KeyError(f"unknown rule set {version!r} (known: {', '.join(RULE_SETS)})") from None
    cands = [s for s in RULE_SETS.values() if s.in_force and (as_of is None or s.published <= as_of)]
    if not cands:
        raise KeyError(f"no rule set in force on {as_of}")
    return max(cands, key=lambda s: s.published)


# --- evaluation -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelAudit:
    """Every rule's result for one model version under one rule set, as of ``as_of``."""

    model_name: str
    model_version: str
    role: str
    as_of: datetime
    rule_set: str
    classification: Classification
    results: tuple[RuleResult, ...]

    def counts(self) -> dict[str, int]:
        out = {s: 0 for s in (PASS, FAIL, MISSING, NOT_APPLICABLE)}
        for r in self.results:
            out[r.status] += 1
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"model_name": self.model_name, "model_version": self.model_version, "role": self.role, "as_of": iso(self.as_of),
                "rule_set": self.rule_set, "classification": self.classification.to_dict(), "counts": self.counts(),
                "results": [r.to_dict(self.as_of) for r in self.results]}


def evaluate(ev: Evidence, now: datetime, rules: RuleSet | None = None) -> ModelAudit:
    """Run every rule of ``rules`` (default: the newest in force as of ``now``) over ``ev``."""
    now = utc(now)
    rs = rules or rule_set(as_of=now.date())
    cls = classify(ev, now)
    out = []
    for rule in rs.rules:
        o = applies(rule, ev, cls, now) or rule.check(ev, cls, now)
        out.append(RuleResult(rule.rule_id, rule.title, f"{REGULATION}, {rule.citation}", o.status, o.reason, o.evidence, o.due_at))
    return ModelAudit(ev.model.name, ev.model.version, ev.model.role, now, rs.version, cls, tuple(out))


def evaluate_all(evidence: Iterable[Evidence], now: datetime, rules: RuleSet | None = None) -> list[ModelAudit]:
    """Audit every model of the registry (one ``Evidence`` each), sorted by name and version."""
    return sorted((evaluate(e, now, rules) for e in evidence), key=lambda a: (a.model_name, a.model_version))

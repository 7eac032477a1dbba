"""EU AI Act obligations as code: classification, a registry of rules, versioned rule sets, evaluation.

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

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, date, datetime, timedelta
from typing import Any

from governance.aiact.model import (
    ANNEX_III,
    DECLARATION_KINDS,
    ORG,
    DEPLOYER,
    FAIL,
    GPAI,
    GPAI_CLASSES,
    GPAI_SYSTEMIC,
    HIGH_RISK,
    HIGH_RISK_ANNEX_I,
    HIGH_RISK_CLASSES,
    LIMITED,
    MINIMAL,
    MISSING,
    NOT_APPLICABLE,
    PASS,
    PROHIBITED,
    PROVIDER,
    RISK_CLASSES,
    Declaration,
    Evidence,
    EvidenceRef,
    FairnessRecord,
    RuleResult,
    iso,
    parse_time,
    utc,
)
import json

REGULATION = "Regulation (EU) 2024/1689"

D_PROHIBITED = date(2025, 2, 2)  # Art. 113(a)
D_GPAI = date(2025, 8, 2)  # Art. 113(b)
D_HIGH_RISK = date(2026, 8, 2)  # Art. 113, first subparagraph
D_ANNEX_I = date(2027, 8, 2)  # Art. 113(c)
D_GPAI_LEGACY = date(2027, 8, 2)  # Art. 111(3)


# --- classification ---------------------------------------------------------------------------------

# Art. 5(1)(a)-(h). Each practice is a list of term groups; the purpose matches when every group has a hit
# (e.g. (f) needs an emotion-recognition term AND a workplace/education term). Keyword matching is a
# screen, not a legal finding: a match fails the rule so a person looks, and the letters whose text has
# an exception ((d), (f), (h)) can be cleared with an ``art5_exception`` declaration that says why.
_W = r"(?:\w+\s+){0,4}"
ART5_PRACTICES: dict[str, tuple[str, tuple[tuple[str, ...], ...]]] = {
    "a": ("subliminal, purposefully manipulative or deceptive techniques distorting behaviour",
          ((r"subliminal", r"manipulative techniques?", r"behaviou?ral manipulation", r"deceptive techniques?",
            r"dark patterns?", r"distort\w*\s+" + _W + r"behaviou?r"),)),
    "b": ("exploiting vulnerabilities due to age, disability or a social or economic situation",
          ((r"exploit\w*\s+" + _W + r"(?:vulnerab\w*|age\b|disabilit\w*|poverty|economic situation|social situation)",),)),
    "c": ("social scoring leading to detrimental or unfavourable treatment",
          ((r"social scor\w*", r"social credit", r"citizen scor\w*", r"trustworthiness scor\w*"),)),
    "d": ("risk assessment predicting criminal offences solely from profiling or personality traits",
          ((r"predict\w*\s+(?:\w+\s+){0,6}(?:criminal|crimes?|offen[cs]\w*|recidivism|re-?offend\w*)", r"recidivism",
            r"crime prediction", r"predictive policing"),)),
    "e": ("untargeted scraping of facial images to build facial recognition databases",
          ((r"untargeted scrap\w*", r"scrap\w*\s+" + _W + r"fac(?:e|ial)\s+images?", r"facial recognition databases?"),)),
    "f": ("emotion recognition in the workplace or in education institutions",
          ((r"emotion (?:recognition|detection|analysis)", r"infer\w*\s+" + _W + r"emotions?", r"detect\w*\s+" + _W + r"emotions?",
            r"sentiment of (?:employees|workers|students|pupils)"),
           (r"workplace", r"employees?", r"workers?", r"staff", r"schools?", r"students?", r"pupils?", r"classroom",
            r"education\w*", r"exams?\b"))),
    "g": ("biometric categorisation inferring race, political opinions, trade union membership, religion, sex life or orientation",
          ((r"biometric", r"fac(?:e|ial)", r"voice ?prints?", r"gait"),
           (r"\brace\b", r"racial", r"ethnic\w*", r"political (?:opinion|affiliation|views?)", r"trade union", r"religio\w*",
            r"sex life", r"sexual orientation"))),
    "h": ("real-time remote biometric identification in publicly accessible spaces for law enforcement",
          ((r"real[- ]time", r"\blive\b"), (r"biometric identification", r"facial recognition", r"face recognition"),
           (r"public\w*", r"law enforcement", r"police", r"street"))),
}
ART5_EXCEPTIONS = frozenset({"d", "f", "h"})
"""Letters whose own text carves out uses: (d) support of a human assessment based on objective facts,
(f) medical or safety reasons, (h) the objectives of Art. 5(1)(h)(i)-(iii) with authorisation (Art. 5(2)-(3))."""

# Purpose keywords that suggest an Annex III area. Only a hint: the area itself is declared.
AREA_HINTS: dict[str, tuple[str, ...]] = {
    "biometrics": (r"biometric", r"fac(?:e|ial) recognition", r"emotion recognition"),
    "critical_infrastructure": (r"critical infrastructure", r"power grid", r"electricity", r"water supply", r"gas supply",
                                r"heating", r"road traffic"),
    "education": (r"admissions?", r"students?", r"learning outcomes", r"\bexams?\b", r"proctor\w*"),
    "employment": (r"recruit\w*", r"hiring", r"job applica\w*", r"candidates?", r"\bcvs?\b", r"r[ée]sum[ée]s?",
                   r"promotion", r"terminat\w* of employment", r"employee (?:monitoring|evaluation|performance)"),
    "essential_services": (r"credit ?scor\w*", r"creditworth\w*", r"\bloans?\b", r"public assistance", r"social benefits",
                           r"(?:life|health) insurance", r"emergency calls?"),
    "law_enforcement": (r"law enforcement", r"police", r"recidivism", r"criminal", r"offen[cs]es?"),
    "migration": (r"asylum", r"\bvisas?\b", r"border control", r"migration", r"residence permits?"),
    "justice": (r"judicial", r"\bcourts?\b", r"sentencing", r"elections?", r"referend\w*", r"voting"),
}


def _find(patterns: Iterable[str], text: str) -> str | None:
    for p in patterns:
        m = re.search(p, text, flags=re.IGNORECASE)
        if m:
            return m.group(0)
    return None


def art5_matches(purpose: str) -> list[tuple[str, tuple[str, ...]]]:
    """(letter, matched terms) for every Art. 5(1) practice the purpose text matches."""
    out = []
    for letter, (_, groups) in ART5_PRACTICES.items():
        hits = [_find(g, purpose) for g in groups]
        if all(hits):
            out.append((letter, tuple(h for h in hits if h)))
    return out


def area_hints(purpose: str) -> list[tuple[str, str]]:
    """(Annex III area, matched term) the purpose text suggests."""
    out = []
    for area, pats in AREA_HINTS.items():
        hit = _find(pats, purpose)
        if hit:
            out.append((area, hit))
    return out


@dataclass(frozen=True)
class Classification:
    """Risk classes of one model as of a date, why, and which dimensions could not be decided.

    ``unknown`` holds ``"high_risk"`` while no Annex III area (or "none") and no Annex I flag is declared,
    and ``"gpai"`` while neither ``general_purpose`` is declared nor compute says systemic risk: rules for
    those classes then report missing evidence rather than "not applicable"."""

    classes: frozenset[str]
    unknown: frozenset[str]
    reasons: tuple[str, ...]
    evidence: tuple[EvidenceRef, ...]
    purpose: str
    area: str | None
    art5: tuple[tuple[str, tuple[str, ...]], ...]
    art5_excepted: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"classes": sorted(self.classes), "unknown": sorted(self.unknown), "reasons": list(self.reasons), "purpose": self.purpose,
                "area": self.area, "art5": [{"letter": l, "terms": list(t)} for l, t in self.art5],
                "art5_excepted": list(self.art5_excepted)}


def _purpose(ev: Evidence, cur: Mapping[tuple[str, str], Declaration]) -> tuple[str, EvidenceRef | None]:
    d = cur.get(("purpose", ""))
    if d is not None:
        return str(d.value["text"]), d.ref()
    if ev.model.intended_purpose.strip():
        return ev.model.intended_purpose, EvidenceRef("registry", ev.model.node_id, None, "intended_purpose in the model registry")
    return "", None


def classify(ev: Evidence, now: datetime) -> Classification:
    """Risk classes from declared facts and measured compute (Art. 5, 6(1)-(3), 50, 51)."""
    cur = ev.current(now)
    classes: set[str] = set()
    unknown: set[str] = set()
    reasons: list[str] = []
    refs: list[EvidenceRef] = []
    purpose, pref = _purpose(ev, cur)
    if pref:
        refs.append(pref)
    matches = art5_matches(purpose)
    excepted = tuple(l for l, _ in matches if l in ART5_EXCEPTIONS and ("art5_exception", l) in cur)
    live = [(l, t) for l, t in matches if l not in excepted]
    if live:
        classes.add(PROHIBITED)
        reasons.append("purpose matches Art. 5(1)" + ", ".join(f"({l})" for l, _ in live))
    cd = cur.get(("classification", ""))
    cv: Mapping[str, Any] = cd.value if cd else {}
    if cd:
        refs.append(cd.ref())
    ad = cur.get(("area", ""))
    area = str(ad.value["area"]) if ad else None
    if ad:
        refs.append(ad.ref())
    if area in ANNEX_III:
        exempt = cv.get("art6_3_condition") and not cv.get("profiling")
        if exempt:
            reasons.append(f"Annex III point {ANNEX_III[area][0]} ({area}) but Art. 6(3) condition {cv['art6_3_condition']} declared")
        else:
            classes.add(HIGH_RISK)
            reasons.append(f"Annex III point {ANNEX_III[area][0]} ({area}): high-risk under Art. 6(2)")
    if cv.get("annex_i_product"):
        classes.add(HIGH_RISK_ANNEX_I)
        reasons.append("safety component of an Annex I product: high-risk under Art. 6(1)")
    if ad is None and "annex_i_product" not in cv:
        unknown.add("high_risk")
    flops = ev.compute.training_flops if ev.compute else None
    planned = cur.get(("planned_compute", ""))
    thr = ev.policy.systemic_flops_threshold
    over = (flops is not None and flops > thr) or (planned is not None and float(planned.value["training_flops"]) > thr)
    if cv.get("general_purpose") or over or cv.get("designated_systemic"):
        classes.add(GPAI)
        if over or cv.get("designated_systemic"):
            classes.add(GPAI_SYSTEMIC)
            reasons.append("systemic risk: " + ("training compute above 10^25 FLOPs (Art. 51(2))" if over else "designated by the Commission (Art. 51(1)(b))"))
        else:
            reasons.append("general-purpose AI model (Art. 3(63))")
    elif "general_purpose" not in cv:
        unknown.add("gpai")
    if cv.get("art50_transparency"):
        classes.add(LIMITED)
        reasons.append("transparency obligations of Art. 50")
    if not classes and not unknown:
        classes.add(MINIMAL)
        reasons.append("no prohibited practice, no Annex III area, not general-purpose: minimal risk")
    return Classification(frozenset(classes), frozenset(unknown), tuple(reasons), tuple(refs), purpose, area, tuple(live), excepted)


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


@dataclass(frozen=True)
class Outcome:
    """What a check returns; the engine adds the rule's id, title and citation."""

    status: str
    reason: str
    evidence: tuple[EvidenceRef, ...] = ()
    due_at: datetime | None = None


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
            return _missing(f"cannot tell whether this applies: {what} (Art. 6, Art. 3(63))", hint, cls.evidence)
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


def _days(n: float) -> timedelta:
    return timedelta(days=n)


def _age_days(now: datetime, t: datetime) -> float:
    return (utc(now) - utc(t)) / _days(1)


def _latest_fairness(ev: Evidence) -> FairnessRecord | None:
    recs = [r for r in ev.fairness]
    if not recs:
        return None
    return max(recs, key=lambda r: (r.evaluated_at or datetime.min.replace(tzinfo=UTC)))


def _of_kind(cur: Mapping[tuple[str, str], Declaration], kind: str) -> dict[str, Declaration]:
    return {k: d for (kk, k), d in cur.items() if kk == kind}


# --- what settles a missing_evidence result --------------------------------------------------------
# Every missing_evidence reason ends by naming the declaration or the data that would settle it, and the
# command and endpoint that record it, for this model version.

_EXAMPLE: dict[str, Any] = {"str": "...", "bool": True, "int": 30, "float": 0.9, "time": "2026-01-31", "list": ["..."],
                            "dict": {"accuracy": 0.9}}


def declare_hint(ev: Evidence, kind: str, key: str = "", *, org: bool = False) -> str:
    """The declaration of ``kind`` that would settle a result, as the CLI command and the endpoint that
    record it, with the kind's required fields."""

    value = {f: _EXAMPLE[t] for f, (t, req) in DECLARATION_KINDS[kind].items() if req}
    model, version = (ORG, ORG) if org else (ev.model.name, ev.model.version)
    body = {"model": model, "version": version, "kind": kind, **({"key": key} if key else {}), "value": value}
    keyed = f" --key {key}" if key else ""
    return (f"settled by a {kind!r} declaration{f' (key {key!r})' if key else ''}: fleetscope audit declare {model} {kind} --version {version}{keyed} "
            f"--value '{json.dumps(value)}' --by NAME, or POST /api/v1/declarations {json.dumps(body)}")


def fairness_hint(ev: Evidence) -> str:
    m = ev.model
    return (f"settled by a fairness evaluation of {m.name}@{m.version}: fleetscope governance fairness evaluate PREDICTIONS.csv --model {m.name} "
            f"--version {m.version} --sensitive COLUMN, or POST /api/v1/models/{m.name}/fairness?version={m.version}")


def lineage_hint(ev: Evidence) -> str:
    m = ev.model
    return ("settled by the training run's OpenLineage events (POST /api/v1/lineage) and the run named on the model's registry entry "
            f"(fleetscope governance registry model {m.name} {m.version} --run RUN_ID, or PUT /api/v1/models/{m.name}/{m.version})")


def jobs_hint(ev: Evidence) -> str:
    return (f"settled by the model's training jobs in the fleet's inventory: job events with model_name {ev.model.name!r} "
            "(fleetscope ingest EVENTS.jsonl, or POST /api/v1/ingest/job_events), with their steps and GPU telemetry")


def monitoring_hint(ev: Evidence) -> str:
    m = ev.model
    return (f"settled by post-market monitoring data of {m.name}@{m.version}: its predictions and outcomes (fleetscope ingest "
            "PREDICTIONS.jsonl, or POST /api/v1/ingest/model_monitoring) evaluated into windows (beat, hourly; or fleetscope "
            f"monitoring evaluate {m.name} {m.version}, or POST /api/v1/models/{m.name}/{m.version}/monitoring/evaluate)")


def _missing(reason: str, hint: str, evidence: tuple[EvidenceRef, ...] = (), due: datetime | None = None) -> Outcome:
    return Outcome(MISSING, f"{reason}; {hint}", evidence, due)


# Each check below reads only the Evidence and the classification; the rule's applicability has already
# been decided by ``applies``.


def check_art5(ev: Evidence, cls: Classification, now: datetime) -> Outcome:
    """Art. 5(1)(a)-(h): the declared purpose must not match a prohibited practice."""
    if not cls.purpose.strip():
        return _missing("no intended purpose is declared or registered, so prohibited practices cannot be screened", declare_hint(ev, "purpose"))
    refs = cls.evidence
    if cls.art5:
        parts = "; ".join(f"({l}) {ART5_PRACTICES[l][0]} [{', '.join(t)}]" for l, t in cls.art5)
        return Outcome(FAIL, f"the intended purpose matches Art. 5(1) {parts}", refs)
    extra = f"; exceptions declared for ({', '.join(cls.art5_excepted)})" if cls.art5_excepted else ""
    return Outcome(PASS, f"the intended purpose matches none of the practices of Art. 5(1)(a)-(h){extra}", refs)


def check_art6(ev: Evidence, cls: Classification, now: datetime) -> Outcome:
    """Art. 6(2)-(4) with Annex III: the risk class follows from the declared area, and an Art. 6(3)
    derogation needs no profiling and a documented assessment."""
    cur = ev.current(now)
    refs = cls.evidence
    hints = area_hints(cls.purpose)
    if cls.area is None:
        hint = f"; the purpose suggests {', '.join(f'{a} ({t!r})' for a, t in hints)}" if hints else ""
        return _missing(f"no Annex III area is declared (use 'none' if none applies){hint}", declare_hint(ev, "area"), refs)
    cd = cur.get(("classification", ""))
    cv: Mapping[str, Any] = cd.value if cd else {}
    ad = cur[("area", "")]
    if cls.area == "none":
        if hints and not ad.value.get("note"):
            return Outcome(FAIL, f"declared outside Annex III, but the purpose reads as {', '.join(f'{a} ({t!r})' for a, t in hints)}; "
                                 "correct the area or record a note explaining why it does not apply", refs)
    else:
        point = ANNEX_III[cls.area][0]
        if cv.get("art6_3_condition"):
            if cv.get("profiling"):
                return Outcome(FAIL, f"Art. 6(3) derogation claimed for an Annex III point {point} system that profiles natural persons, "
                                     "which is always high-risk (Art. 6(3), last subparagraph)", refs)
            if not cv.get("art6_4_assessment"):
                return Outcome(FAIL, "Art. 6(3) derogation claimed without a documented assessment (Art. 6(4))", refs)
    derived = next((c for c in (PROHIBITED, HIGH_RISK, HIGH_RISK_ANNEX_I, GPAI_SYSTEMIC, GPAI, LIMITED, MINIMAL) if c in cls.classes), None)
    claimed = cv.get("self_assessed_risk")
    if claimed and derived and claimed != derived and claimed not in cls.classes:
        return Outcome(FAIL, f"self-assessed as {claimed} but the declared facts make it {derived} ({'; '.join(cls.reasons)})", refs)
    outside = ["declared outside Annex III"] if cls.area == "none" else []
    return Outcome(PASS, "; ".join(outside + list(cls.reasons)) or "classified", refs)


def check_art9(ev: Evidence, cls: Classification, now: datetime) -> Outcome:
    """Art. 9(1)-(2): a risk management system, a continuous process regularly reviewed and updated."""
    d = ev.current(now).get(("risk_management", ""))
    if d is None:
        return _missing("no risk management record is declared", declare_hint(ev, "risk_management"))
    reviewed = parse_time(d.value["reviewed_at"])
    assert reviewed is not None
    limit = ev.policy.risk_review_days
    due = reviewed + _days(limit)
    if utc(now) > due:
        return Outcome(FAIL, f"the risk management record was last reviewed {iso(reviewed)}, more than the policy's {limit} days ago", (d.ref(),), due)
    return Outcome(PASS, f"risk management record {d.value['reference']!r} reviewed {iso(reviewed)}, within {limit} days", (d.ref(),), due)


def check_art10_bias(ev: Evidence, cls: Classification, now: datetime) -> Outcome:
    """Art. 10(2)(f)-(g): examination for possible biases and measures to detect, prevent and mitigate
    them: a recent fairness evaluation, and a recorded mitigation for each failure."""
    rec = _latest_fairness(ev)
    if rec is None:
        return _missing("no fairness evaluation of this model is recorded", fairness_hint(ev))
    refs: list[EvidenceRef] = [rec.ref()]
    if rec.evaluated_at is None:
        return _missing(f"fairness evaluation {rec.evaluation_id[:12]} has no evaluation date", fairness_hint(ev), tuple(refs))
    age = _age_days(now, rec.evaluated_at)
    limit = ev.policy.fairness_max_age_days
    due = rec.evaluated_at + _days(limit)
    if age > limit:
        return Outcome(FAIL, f"the latest fairness evaluation is {age:.0f} days old; the policy allows {limit}", tuple(refs), due)
    if rec.passed is None:
        return _missing("the latest fairness evaluation could judge no criterion (too few rows per group)",
                        fairness_hint(ev) + " over more rows (at least min_group_size per group)", tuple(refs), due)
    if rec.passed is False:
        m = ev.current(now).get(("mitigation", rec.evaluation_id))
        failed = f" ({', '.join(rec.failed_checks[:5])})" if rec.failed_checks else ""
        if m is None or m.entered_at < rec.evaluated_at:
            return Outcome(FAIL, f"the latest fairness evaluation failed its policy{failed} and no mitigation is recorded for it", tuple(refs), due)
        refs.append(m.ref())
        return Outcome(PASS, f"the latest fairness evaluation failed{failed}; mitigation recorded: {m.value['action']}", tuple(refs), due)
    return Outcome(PASS, f"fairness evaluation of {iso(rec.evaluated_at)} passed its policy ({age:.0f} days old)", tuple(refs), due)


def check_art10_representation(ev: Evidence, cls: Classification, now: datetime) -> Outcome:
    """Art. 10(3): data sets sufficiently representative: every group of the evaluated sensitive features
    holds at least the minimum group size."""
    rec = _latest_fairness(ev)
    if rec is None or not rec.groups:
        return _missing("no fairness evaluation with group counts is recorded", fairness_hint(ev))
    minimum = ev.policy.min_group_size or rec.min_group_size
    feats = ev.policy.representation_features
    groups = [g for g in rec.groups if (g.feature in feats if feats is not None else "&" not in g.feature)]
    if not groups:
        return _missing(f"the latest evaluation has none of the features {', '.join(feats or ())}",
                        fairness_hint(ev) + f" with --sensitive {' --sensitive '.join(feats or ('COLUMN',))}", (rec.ref(),))
    small = sorted((g for g in groups if g.count < minimum), key=lambda g: g.count)
    if small:
        listed = ", ".join(f"{g.feature}={g.group} ({g.count})" for g in small[:8])
        return Outcome(FAIL, f"{len(small)} group(s) below the minimum of {minimum} rows: {listed}", (rec.ref(),))
    least = min(groups, key=lambda g: g.count)
    return Outcome(PASS, f"all {len(groups)} groups hold at least {minimum} rows (smallest: {least.feature}={least.group}, {least.count})", (rec.ref(),))


def check_art10_special(ev: Evidence, cls: Classification, now: datetime) -> Outcome:
    """Art. 10(5)(a)-(f): special categories of personal data only where strictly necessary for bias
    detection, with the reasons recorded (f) and deletion once corrected or retention ends (e)."""
    lin = ev.lineage
    if lin is None or lin.training_runs_seen == 0:
        return _missing("none of the model's training runs appears in lineage, so the data it used is unknown", lineage_hint(ev))
    special = {}
    for t in lin.taints:
        if t.kind == "special_category":
            special.setdefault(t.source.node_id, t)
    refs = [EvidenceRef("lineage_taint", src, lin.as_of, f"special-category data from {src}") for src in sorted(special)]
    if not special:
        return Outcome(PASS, f"no special-category data upstream of the model ({lin.training_runs_seen} training run(s) in lineage)",
                       (EvidenceRef("lineage", ev.model.node_id, lin.as_of, f"{len(lin.taints)} taints"),))
    cur = ev.current(now)
    lacking = []
    for src in sorted(special):
        d = cur.get(("data_justification", src))
        if d is None:
            lacking.append(src)
        else:
            refs.append(d.ref())
    if lacking:
        return Outcome(FAIL, f"special-category data reaches the model from {', '.join(lacking)} without a recorded justification and deletion plan", tuple(refs))
    return Outcome(PASS, f"special-category data from {len(special)} dataset(s), each with a recorded justification and deletion plan", tuple(refs))


ANNEX_IV = {
    "1": "general description of the AI system",
    "2": "elements and development process",
    "3": "monitoring, functioning and control",
    "4": "appropriateness of the performance metrics",
    "5": "the risk management system (Art. 9)",
    "6": "relevant changes over the lifecycle",
    "7": "harmonised standards or other specifications applied",
    "8": "copy of the EU declaration of conformity",
    "9": "post-market monitoring evaluation system (Art. 72(3))",
}
"""Annex IV points 1-9: the technical documentation of Art. 11(1). Declarations of kind
``documentation`` use the point number as their key."""


def check_art11(ev: Evidence, cls: Classification, now: datetime) -> Outcome:
    """Art. 11(1) with Annex IV: technical documentation holding every Annex IV point."""
    docs = _of_kind(ev.current(now), "documentation")
    if not docs:
        return _missing("no technical documentation is declared", declare_hint(ev, "documentation", "1") + ", one per Annex IV point 1-9")
    refs = tuple(docs[k].ref() for k in sorted(docs))
    absent = [k for k in ANNEX_IV if k not in docs]
    if absent:
        return Outcome(FAIL, "technical documentation lacks Annex IV point(s) " + "; ".join(f"{k} ({ANNEX_IV[k]})" for k in absent), refs)
    return Outcome(PASS, "technical documentation covers Annex IV points 1-9", refs)


def check_art12(ev: Evidence, cls: Classification, now: datetime) -> Outcome:
    """Art. 12(1) automatic recording of events; Art. 19(1) (providers) and Art. 26(6) (deployers): logs
    kept at least six months. Both the retention setting and the oldest record actually held count: a
    setting of 400 days proves nothing if the records were purged last week."""
    lg = ev.logging
    if lg is None:
        return _missing("no logging evidence was collected", declare_hint(ev, "logging"))
    ref = EvidenceRef("logging", lg.source or "store", lg.as_of,
                      f"enabled={lg.enabled}, retention_days={lg.retention_days}, oldest={iso(lg.oldest_record_at)}")
    if lg.enabled is None:
        return _missing("whether automatic event logging is enabled is not known", declare_hint(ev, "logging"), (ref,))
    if not lg.enabled:
        return Outcome(FAIL, "automatic recording of events is not enabled (Art. 12(1))", (ref,))
    minimum = ev.policy.min_log_retention_days
    if lg.retention_days is None:
        return _missing("the log retention setting is not known", "settled by the store's retention setting (FLEETSCOPE_RETENTION_DAYS)", (ref,))
    if lg.retention_days < minimum:
        return Outcome(FAIL, f"logs are kept {lg.retention_days} days; at least {minimum} (six months) are required", (ref,))
    if lg.oldest_record_at is None:
        return Outcome(FAIL, "logging is enabled but no log record is held", (ref,))
    need = utc(now) - _days(minimum)
    if lg.in_service_since is not None and utc(lg.in_service_since) > need:
        need = utc(lg.in_service_since)
    if utc(lg.oldest_record_at) > need + _days(ev.policy.log_grace_days):
        since = "" if lg.in_service_since else " (declare in_service_since if the system is younger than that)"
        return Outcome(FAIL, f"the oldest log record held is from {iso(lg.oldest_record_at)}, but records must reach back to {iso(need)}{since}", (ref,))
    return Outcome(PASS, f"logging enabled, retention {lg.retention_days} days, records held since {iso(lg.oldest_record_at)}", (ref,))


def check_art13(ev: Evidence, cls: Classification, now: datetime) -> Outcome:
    """Art. 13(3)(b)(ii) and (v): instructions for use state the level of accuracy and the performance as
    regards specific persons or groups."""
    d = ev.current(now).get(("instructions", ""))
    if d is None:
        return _missing("no instructions for use are declared", declare_hint(ev, "instructions"))
    absent = [f for f, cite in (("accuracy", "13(3)(b)(ii)"), ("per_group_performance", "13(3)(b)(v)")) if not d.value.get(f)]
    if absent:
        return Outcome(FAIL, f"the instructions for use do not state {' or '.join(a.replace('_', ' ') for a in absent)}", (d.ref(),))
    rec = _latest_fairness(ev)
    note = ""
    if rec is not None and rec.evaluated_at is not None and rec.evaluated_at > d.entered_at:
        note = f"; they predate the fairness evaluation of {iso(rec.evaluated_at)}, review them"
    return Outcome(PASS, f"instructions {d.value['reference']!r} state accuracy and per-group performance{note}", (d.ref(),))


def check_art14(ev: Evidence, cls: Classification, now: datetime) -> Outcome:
    """Art. 14(1), (4)(d)-(e): human oversight measures, including the ability to override the output and
    to interrupt the system through a stop procedure."""
    d = ev.current(now).get(("oversight", ""))
    if d is None:
        return _missing("no human oversight measures are declared", declare_hint(ev, "oversight"))
    lacking = [t for f, t in (("override", "override or reverse the output (14(4)(d))"), ("stop", "interrupt through a stop procedure (14(4)(e))")) if not d.value.get(f)]
    if not d.value.get("measures"):
        lacking.insert(0, "a description of the measures (14(3))")
    if lacking:
        return Outcome(FAIL, "human oversight lacks " + " and ".join(lacking), (d.ref(),))
    return Outcome(PASS, f"{len(d.value['measures'])} oversight measure(s) declared, with override and stop", (d.ref(),))


def check_art15(ev: Evidence, cls: Classification, now: datetime) -> Outcome:
    """Art. 15(1), (3), (4): declared accuracy metrics, checked against the accuracy measured in operation
    (post-market monitoring's recent windows, Art. 15(1) "throughout their lifecycle"; else the latest
    fairness evaluation), and resilience to errors and faults (no unresolved silent data corruption on the
    hardware that ran it)."""
    d = ev.current(now).get(("accuracy_metrics", ""))
    if d is None:
        return _missing("no accuracy metrics are declared (Art. 15(3))", declare_hint(ev, "accuracy_metrics"))
    refs: list[EvidenceRef] = [d.ref()]
    declared = d.value["metrics"].get("accuracy")
    mon = ev.monitoring
    measured, where = None, ""
    if mon is not None and mon.recent_accuracy is not None and mon.recent_outcomes >= ev.policy.monitoring_min_outcomes:
        measured, where = mon.recent_accuracy, f"in operation (monitoring, {mon.recent_outcomes} outcomes)"
        refs.append(mon.ref())
    else:
        rec = _latest_fairness(ev)
        measured = rec.overall_accuracy() if rec else None
        if rec is not None and measured is not None:
            refs.append(rec.ref())
            where = "in the latest evaluation"
    tol = float(d.value.get("tolerance", ev.policy.accuracy_tolerance))
    if isinstance(declared, (int, float)) and measured is not None and measured < float(declared) - tol:
        return Outcome(FAIL, f"declared accuracy {float(declared):.3f} (tolerance {tol:g}) but measured {measured:.3f} {where}", tuple(refs))
    if ev.robustness is None:
        return _missing("no robustness evidence (SDC and failure history) was collected", jobs_hint(ev), tuple(refs))
    rb = ev.robustness
    refs.append(rb.ref())
    if rb.sdc_unresolved > 0:
        return Outcome(FAIL, f"{rb.sdc_unresolved} unresolved silent-data-corruption suspicion(s) on hardware that ran the model's jobs", tuple(refs))
    acc = f", measured accuracy {measured:.3f} {where}" if measured is not None else ""
    return Outcome(PASS, f"metrics {', '.join(sorted(d.value['metrics']))} declared{acc}; {rb.failures} failure(s), "
                         f"{rb.sdc_suspects} SDC suspicion(s) all resolved over {rb.jobs} job(s)", tuple(refs))


QMS_ITEMS = {
    "a": "strategy for regulatory compliance", "b": "design, design control and verification", "c": "development, quality control and assurance",
    "d": "examination, test and validation procedures", "e": "technical specifications and standards", "f": "systems and procedures for data management",
    "g": "risk management system (Art. 9)", "h": "post-market monitoring (Art. 72)", "i": "serious incident reporting (Art. 73)",
    "j": "communication with authorities", "k": "record-keeping", "l": "resource management", "m": "accountability framework",
}
"""Art. 17(1)(a)-(m); declarations of kind ``qms`` use the letter as key (usually organisation-wide, model ``*``)."""


def check_art17(ev: Evidence, cls: Classification, now: datetime) -> Outcome:
    """Art. 17(1)(a)-(m): a quality management system documented in written policies and procedures."""
    items = _of_kind(ev.current(now), "qms")
    if not items:
        return _missing("no quality management system items are declared", declare_hint(ev, "qms", "a", org=True) + ", one per Art. 17(1) letter a-m")
    refs = tuple(items[k].ref() for k in sorted(items))
    absent = [k for k in QMS_ITEMS if k not in items]
    if absent:
        return Outcome(FAIL, "the quality management system lacks Art. 17(1) " + ", ".join(f"({k}) {QMS_ITEMS[k]}" for k in absent), refs)
    return Outcome(PASS, "the quality management system documents Art. 17(1)(a)-(m)", refs)


def check_art51_52(ev: Evidence, cls: Classification, now: datetime) -> Outcome:
    """Art. 51(2): training compute above 10^25 FLOPs presumes high-impact capabilities (systemic risk);
    Art. 52(1): the provider notifies the Commission without delay and within two weeks of the threshold
    being met or it becoming known that it will be."""
    cur = ev.current(now)
    thr = ev.policy.systemic_flops_threshold
    comp = ev.compute
    flops = comp.training_flops if comp else None
    planned = cur.get(("planned_compute", ""))
    refs: list[EvidenceRef] = []
    if comp is not None:
        refs.append(comp.ref(ev.model.node_id))
    if planned is not None:
        refs.append(planned.ref())
    if flops is None and planned is None:
        return _missing("training compute is neither measured nor declared as planned", jobs_hint(ev) + "; or " + declare_hint(ev, "planned_compute"))
    triggers = []
    if flops is not None and flops > thr:
        t = comp.threshold_crossed_at or comp.training_ended_at  # type: ignore[union-attr]
        if t is not None:
            triggers.append(utc(t))
    if planned is not None and float(planned.value["training_flops"]) > thr:
        triggers.append(parse_time(planned.value["known_at"]))  # type: ignore[arg-type]
    over = (flops is not None and flops > thr) or (planned is not None and float(planned.value["training_flops"]) > thr)
    designated = GPAI_SYSTEMIC in cls.classes and not over
    if not over:
        shown = f"{flops:.3g}" if flops is not None else f"planned {float(planned.value['training_flops']):.3g}"  # type: ignore[union-attr]
        if designated:
            return Outcome(PASS, f"training compute {shown} FLOPs is below 10^25, but the model is designated as having systemic risk (Art. 51(1)(b))", tuple(refs))
        return Outcome(PASS, f"training compute {shown} FLOPs does not exceed 10^25: no presumption of systemic risk", tuple(refs))
    note = cur.get(("notification", "art52"))
    if note is not None:
        refs.append(note.ref())
    if not triggers:
        if note is not None:
            return Outcome(PASS, f"above 10^25 FLOPs; the Commission was notified {note.value['notified_at']}", tuple(refs))
        return _missing("training compute exceeds 10^25 FLOPs but when the threshold was met is unknown, so the two-week deadline cannot be computed",
                        "settled by per-step model_flops of the training jobs (job steps through POST /api/v1/ingest) or "
                        + declare_hint(ev, "notification", "art52"), tuple(refs))
    start = min(triggers)
    due = start + _days(14)
    if note is not None:
        at = parse_time(note.value["notified_at"])
        assert at is not None
        if at > due:
            return Outcome(FAIL, f"the threshold was met {iso(start)}; the Commission was notified {iso(at)}, after the two-week deadline {iso(due)}", tuple(refs), due)
        return Outcome(PASS, f"the threshold was met {iso(start)}; the Commission was notified {iso(at)}, within two weeks", tuple(refs), due)
    if utc(now) > due:
        return Outcome(FAIL, f"the threshold was met {iso(start)} and no notification to the Commission is recorded; it was due by {iso(due)}", tuple(refs), due)
    return Outcome(PASS, f"the threshold was met {iso(start)}; notification to the Commission is due by {iso(due)}", tuple(refs), due)


def check_art53(ev: Evidence, cls: Classification, now: datetime) -> Outcome:
    """Art. 53(1)(a) with Annex XI Section 1 point 2(d)-(e): documentation states training compute, training
    time and the known or estimated energy consumption."""
    comp = ev.compute
    if comp is None:
        return _missing("no training footprint (compute, time, energy) was computed for the model", jobs_hint(ev))
    refs = (comp.ref(ev.model.node_id),)
    absent = [n for n, v in (("training compute (FLOPs)", comp.training_flops), ("training time", comp.training_time_s),
                             ("energy consumption", comp.energy_j)) if v is None]
    if absent:
        return Outcome(FAIL, f"the Annex XI documentation lacks {', '.join(absent)}", refs)
    return Outcome(PASS, f"{comp.training_flops:.3g} FLOPs ({comp.flops_basis}); {comp.training_time_s / 3600:.1f} h ({comp.time_basis}); "
                         f"{comp.energy_j / 3.6e6:.4g} kWh ({comp.energy_basis})", refs)


def check_art55(ev: Evidence, cls: Classification, now: datetime) -> Outcome:
    """Art. 55(1)(a): model evaluation with standardised protocols, including documented adversarial testing."""
    cur = ev.current(now)
    evals = list(_of_kind(cur, "model_evaluation").values())
    adv = list(_of_kind(cur, "adversarial_test").values())
    if not evals and not adv:
        return _missing("no model evaluation or adversarial testing is recorded", declare_hint(ev, "model_evaluation") + "; and " + declare_hint(ev, "adversarial_test"))
    refs = tuple(d.ref() for d in evals + adv)
    limit = ev.policy.evaluation_max_age_days
    problems = []
    for name, ds in (("model evaluation", evals), ("adversarial testing", adv)):
        if not ds:
            problems.append(f"no {name} is recorded")
            continue
        last = max(parse_time(d.value["performed_at"]) for d in ds)  # type: ignore[type-var]
        if _age_days(now, last) > limit:
            problems.append(f"the latest {name} ({iso(last)}) is older than {limit} days")
    if problems:
        return Outcome(FAIL, "; ".join(problems), refs)
    return Outcome(PASS, f"{len(evals)} model evaluation(s) and {len(adv)} adversarial test(s) recorded within {limit} days", refs)


def check_art72(ev: Evidence, cls: Classification, now: datetime) -> Outcome:
    """Art. 72(1)-(3): a post-market monitoring system, based on a plan (72(3)), that actively and
    systematically collects, documents and analyses data on the system's performance throughout its
    lifetime (72(2)): the plan is declared, active and reviewed on time, and monitoring windows of the
    version are stored, the latest within ``policy.monitoring_max_gap_days``."""
    d = ev.current(now).get(("post_market_plan", ""))
    if d is None:
        return _missing("no post-market monitoring plan is declared", declare_hint(ev, "post_market_plan"))
    if not d.value["active"]:
        return Outcome(FAIL, "the post-market monitoring plan is declared but not active", (d.ref(),))
    interval = int(d.value["interval_days"])
    last = parse_time(d.value.get("last_review_at")) or d.entered_at
    due = last + _days(interval + ev.policy.post_market_grace_days)
    if utc(now) > due:
        return Outcome(FAIL, f"the post-market monitoring review every {interval} days is overdue: last {iso(last)}", (d.ref(),), due)
    mon = ev.monitoring
    if mon is None or mon.windows == 0 or mon.last_window_end is None:
        return _missing("a post-market monitoring plan is declared, but no monitoring data of this version is stored (Art. 72(2))",
                        monitoring_hint(ev), (d.ref(),), due)
    refs = (d.ref(), mon.ref())
    gap = ev.policy.monitoring_max_gap_days
    if _age_days(now, mon.last_window_end) > gap:
        return Outcome(FAIL, f"monitoring is not collecting: the latest window ended {iso(mon.last_window_end)}, more than {gap} days ago "
                             "(Art. 72(2))", refs, due)
    found = ", ".join(f"{n} {k}" for k, n in sorted(mon.findings.items()))
    return Outcome(PASS, f"post-market monitoring active, reviewed every {interval} days (last {iso(last)}); {mon.windows} windows, the "
                         f"latest ending {iso(mon.last_window_end)}" + (f"; recent findings: {found}" if found else "; no recent findings"), refs, due)


INCIDENT_DEADLINE_DAYS = {"death": 10, "critical_infrastructure": 2, "widespread_infringement": 2}
INCIDENT_PARAGRAPH = {"death": "Art. 73(4)", "critical_infrastructure": "Art. 73(3)", "widespread_infringement": "Art. 73(3)"}
"""Art. 73(4) a death: 10 days; Art. 73(3) widespread infringement or serious and irreversible disruption of
critical infrastructure (Art. 3(49)(b)): 2 days; any other serious incident, Art. 73(2): 15 days. Counted
from when the provider became aware."""


def incident_deadline(kind: str) -> int:
    return INCIDENT_DEADLINE_DAYS.get(kind, 15)


def incident_paragraph(kind: str) -> str:
    return INCIDENT_PARAGRAPH.get(kind, "Art. 73(2)")


def check_art73(ev: Evidence, cls: Classification, now: datetime) -> Outcome:
    """Art. 73(2)-(4): serious incidents reported to the market surveillance authority within 15 days of
    awareness, 10 days for a death, 2 days for a widespread infringement or critical-infrastructure disruption."""
    incidents = _of_kind(ev.current(now), "incident")
    if not incidents:
        return Outcome(PASS, "no serious incident is recorded")
    refs = tuple(incidents[k].ref() for k in sorted(incidents))
    late, undated, open_due = [], [], []
    for key in sorted(incidents):
        v = incidents[key].value
        # Awareness cannot precede the incident, so counting from occurrence when awareness is not recorded
        # gives the earliest possible deadline: conservative.
        start = parse_time(v.get("aware_at")) or parse_time(v.get("occurred_at"))
        if start is None:
            undated.append(key)
            continue
        days = incident_deadline(v["kind"])
        due = start + _days(days)
        rep = parse_time(v.get("reported_at"))
        if rep is not None and rep > due:
            late.append(f"{key} ({v['kind']}) reported {iso(rep)}, {days}-day deadline {iso(due)}")
        elif rep is None and utc(now) > due:
            late.append(f"{key} ({v['kind']}) unreported, {days}-day deadline {iso(due)} passed")
        elif rep is None:
            open_due.append((due, key, f"{key} ({v['kind']}, {days} days, {incident_paragraph(v['kind'])}) due by {iso(due)}"))
    nearest = min(open_due)[0] if open_due else None
    if late:
        return Outcome(FAIL, "serious incident(s) not reported in time: " + "; ".join(late), refs, nearest)
    if undated:
        return _missing(f"incident(s) {', '.join(undated)} have neither an awareness nor an occurrence date", declare_hint(ev, "incident", undated[0])
                        + ' with "aware_at" or "occurred_at"', refs, nearest)
    if open_due:
        listed = "; ".join(x[2] for x in sorted(open_due))
        return Outcome(PASS, f"{len(incidents)} incident(s); {len(open_due)} still to report to the market surveillance authority, "
                             f"the next due by {iso(nearest)}: {listed}", refs, nearest)
    return Outcome(PASS, f"{len(incidents)} serious incident(s), each reported within its deadline", refs)


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

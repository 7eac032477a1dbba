"""EU AI Act risk classification of one model as of a date: the prohibited practices of Art. 5 screened in
its declared purpose, the Annex III areas (Art. 6(2)), Annex I products (Art. 6(1)), transparency duties
(Art. 50) and general-purpose models with or without systemic risk (Art. 51), from declared facts and
measured compute. Regulation (EU) 2024/1689.

Pure: ``now`` is passed in; nothing here reads the clock, the store or the network.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from governance.aiact.model import (
    ANNEX_III, GPAI, GPAI_SYSTEMIC, HIGH_RISK, HIGH_RISK_ANNEX_I, LIMITED, MINIMAL, PROHIBITED, Declaration,
    Evidence, EvidenceRef
)

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

"""The checks of the EU AI Act rules, one per article (Regulation (EU) 2024/1689): each reads a model's
``Evidence`` and its ``Classification`` and returns an ``Outcome`` (pass / fail / missing_evidence with one
sentence saying why, the evidence used and, where a duty has a deadline, when it is due). Whether a rule
applies to the model at all is decided before, by ``rules.applies``.

Pure: ``now`` is passed in; nothing here reads the clock, the store or the network.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from governance.aiact.classify import ART5_PRACTICES, Classification, area_hints
from governance.aiact.model import (
    ANNEX_III,
    DECLARATION_KINDS,
    ORG,
    FAIL,
    GPAI,
    GPAI_SYSTEMIC,
    HIGH_RISK,
    HIGH_RISK_ANNEX_I,
    LIMITED,
    MINIMAL,
    MISSING,
    PASS,
    PROHIBITED,
    Declaration,
    Evidence,
    EvidenceRef,
    FairnessRecord,
    iso,
    parse_time,
    utc,
)

@dataclass(frozen=True)
class Outcome:
    """What a check returns; the engine adds the rule's id, title and citation."""

    status: str
    reason: str
    evidence: tuple[EvidenceRef, ...] = ()
    due_at: datetime | None = None


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


def missing_evidence(reason: str, hint: str, evidence: tuple[EvidenceRef, ...] = (), due: datetime | None = None) -> Outcome:
    return Outcome(MISSING, f"{reason}; {hint}", evidence, due)


# Each check below reads only the Evidence and the classification; the rule's applicability has already
# been decided by ``applies``.


def check_art5(ev: Evidence, cls: Classification, now: datetime) -> Outcome:
    """Art. 5(1)(a)-(h): the declared purpose must not match a prohibited practice."""
    if not cls.purpose.strip():
        return missing_evidence("no intended purpose is declared or registered, so prohibited practices cannot be screened", declare_hint(ev, "purpose"))
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
        return missing_evidence(f"no Annex III area is declared (use 'none' if none applies){hint}", declare_hint(ev, "area"), refs)
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
        return missing_evidence("no risk management record is declared", declare_hint(ev, "risk_management"))
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
        return missing_evidence("no fairness evaluation of this model is recorded", fairness_hint(ev))
    refs: list[EvidenceRef] = [rec.ref()]
    if rec.evaluated_at is None:
        return missing_evidence(f"fairness evaluation {rec.evaluation_id[:12]} has no evaluation date", fairness_hint(ev), tuple(refs))
    age = _age_days(now, rec.evaluated_at)
    limit = ev.policy.fairness_max_age_days
    due = rec.evaluated_at + _days(limit)
    if age > limit:
        return Outcome(FAIL, f"the latest fairness evaluation is {age:.0f} days old; the policy allows {limit}", tuple(refs), due)
    if rec.passed is None:
        return missing_evidence("the latest fairness evaluation could judge no criterion (too few rows per group)",
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
        return missing_evidence("no fairness evaluation with group counts is recorded", fairness_hint(ev))
    minimum = ev.policy.min_group_size or rec.min_group_size
    feats = ev.policy.representation_features
    groups = [g for g in rec.groups if (g.feature in feats if feats is not None else "&" not in g.feature)]
    if not groups:
        return missing_evidence(f"the latest evaluation has none of the features {', '.join(feats or ())}",
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
        return missing_evidence("none of the model's training runs appears in lineage, so the data it used is unknown", lineage_hint(ev))
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
        return missing_evidence("no technical documentation is declared", declare_hint(ev, "documentation", "1") + ", one per Annex IV point 1-9")
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
        return missing_evidence("no logging evidence was collected", declare_hint(ev, "logging"))
    ref = EvidenceRef("logging", lg.source or "store", lg.as_of,
                      f"enabled={lg.enabled}, retention_days={lg.retention_days}, oldest={iso(lg.oldest_record_at)}")
    if lg.enabled is None:
        return missing_evidence("whether automatic event logging is enabled is not known", declare_hint(ev, "logging"), (ref,))
    if not lg.enabled:
        return Outcome(FAIL, "automatic recording of events is not enabled (Art. 12(1))", (ref,))
    minimum = ev.policy.min_log_retention_days
    if lg.retention_days is None:
        return missing_evidence("the log retention setting is not known", "settled by the store's retention setting (FLEETSCOPE_RETENTION_DAYS)", (ref,))
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
        return missing_evidence("no instructions for use are declared", declare_hint(ev, "instructions"))
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
        return missing_evidence("no human oversight measures are declared", declare_hint(ev, "oversight"))
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
        return missing_evidence("no accuracy metrics are declared (Art. 15(3))", declare_hint(ev, "accuracy_metrics"))
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
        return missing_evidence("no robustness evidence (SDC and failure history) was collected", jobs_hint(ev), tuple(refs))
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
        return missing_evidence("no quality management system items are declared", declare_hint(ev, "qms", "a", org=True) + ", one per Art. 17(1) letter a-m")
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
        return missing_evidence("training compute is neither measured nor declared as planned", jobs_hint(ev) + "; or " + declare_hint(ev, "planned_compute"))
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
        return missing_evidence("training compute exceeds 10^25 FLOPs but when the threshold was met is unknown, so the two-week deadline cannot be computed",
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
        return missing_evidence("no training footprint (compute, time, energy) was computed for the model", jobs_hint(ev))
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
        return missing_evidence("no model evaluation or adversarial testing is recorded", declare_hint(ev, "model_evaluation") + "; and " + declare_hint(ev, "adversarial_test"))
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
        return missing_evidence("no post-market monitoring plan is declared", declare_hint(ev, "post_market_plan"))
    if not d.value["active"]:
        return Outcome(FAIL, "the post-market monitoring plan is declared but not active", (d.ref(),))
    interval = int(d.value["interval_days"])
    last = parse_time(d.value.get("last_review_at")) or d.entered_at
    due = last + _days(interval + ev.policy.post_market_grace_days)
    if utc(now) > due:
        return Outcome(FAIL, f"the post-market monitoring review every {interval} days is overdue: last {iso(last)}", (d.ref(),), due)
    mon = ev.monitoring
    if mon is None or mon.windows == 0 or mon.last_window_end is None:
        return missing_evidence("a post-market monitoring plan is declared, but no monitoring data of this version is stored (Art. 72(2))",
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
        return missing_evidence(f"incident(s) {', '.join(undated)} have neither an awareness nor an occurrence date", declare_hint(ev, "incident", undated[0])
                        + ' with "aware_at" or "occurred_at"', refs, nearest)
    if open_due:
        listed = "; ".join(x[2] for x in sorted(open_due))
        return Outcome(PASS, f"{len(incidents)} incident(s); {len(open_due)} still to report to the market surveillance authority, "
                             f"the next due by {iso(nearest)}: {listed}", refs, nearest)
    return Outcome(PASS, f"{len(incidents)} serious incident(s), each reported within its deadline", refs)

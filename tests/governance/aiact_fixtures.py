"""Evidence builders shared by the AI Act tests: a compliant high-risk system (CV screening, Annex III
point 4) and a compliant general-purpose model with systemic risk, which each test then breaks in one place."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta
from typing import Any

from governance.aiact import (
    ComputeEvidence,
    Declaration,
    Evidence,
    FairnessGroup,
    FairnessRecord,
    LineageEvidence,
    LoggingEvidence,
    MonitoringEvidence,
    RobustnessEvidence,
    declare,
)
from governance.lineage import DatasetRef, Taint
from governance.registry import ModelEntry

NOW = datetime(2026, 9, 1, 12, 0, tzinfo=UTC)
HR_MODEL = ModelEntry("cv-screener", "1", "rank job applicants' CVs for recruitment", "provider_and_deployer", ("run-1",))
GP_MODEL = ModelEntry("frontier", "2", "general-purpose language model", "provider", ("run-9",))
SPECIAL = DatasetRef("s3://hr", "applicant_health")


def days(n: float) -> timedelta:
    return timedelta(days=n)


def decl(model: ModelEntry | str, kind: str, value: dict[str, Any], key: str = "", *, at: datetime | None = None,
         by: str = "alice@example.com", retracted: bool = False) -> Declaration:
    name, version = (model, "*") if isinstance(model, str) else (model.name, model.version)
    return declare(name, version, kind, value, key=key, entered_by=by, entered_at=at or NOW - days(40), retracted=retracted)


def groups(counts: dict[str, int], acc: float = 0.86) -> tuple[FairnessGroup, ...]:
    out = []
    for g, n in counts.items():
        right = round(n * acc)
        out.append(FairnessGroup("sex", g, n, n >= 30, right / n, tp=right // 2, fp=(n - right) // 2, tn=right - right // 2,
                                 fn=(n - right) - (n - right) // 2))
    return tuple(out)


def fairness(passed: bool | None = True, age_days: float = 20, counts: dict[str, int] | None = None, eid: str = "e" * 64) -> FairnessRecord:
    return FairnessRecord(eid, NOW - days(age_days), passed, 30, 600, groups(counts or {"female": 280, "male": 320}),
                          () if passed else ("sex: demographic_parity_ratio 0.61 >= 0.8",))


def high_risk() -> Evidence:
    m = HR_MODEL
    ds = [
        decl(m, "area", {"area": "employment", "point": "4(a)"}),
        decl(m, "classification", {"general_purpose": False, "profiling": True}),
        decl(m, "risk_management", {"reviewed_at": (NOW - days(30)).isoformat(), "reference": "RMS-7"}),
        *[decl(m, "documentation", {"reference": f"doc://annex-iv/{k}"}, key=str(k)) for k in range(1, 10)],
        decl(m, "logging", {"enabled": True, "in_service_since": "2025-01-01"}),
        decl(m, "instructions", {"reference": "IFU-3", "accuracy": "0.86 overall", "per_group_performance": "female 0.85, male 0.87"}),
        decl(m, "oversight", {"measures": ["HR reviewer confirms each ranking"], "override": True, "stop": True}),
        decl(m, "accuracy_metrics", {"metrics": {"accuracy": 0.86, "auc": 0.91}}),
        *[decl("*", "qms", {"reference": f"QMS-{c}"}, key=c) for c in "abcdefghijklm"],
        decl(m, "post_market_plan", {"active": True, "interval_days": 30, "last_review_at": (NOW - days(10)).isoformat()}),
        decl(m, "data_justification", {"justification": "bias detection on disability status (Art. 10(5))",
                                       "deletion_plan": "deleted when the bias is corrected, at most 12 months"}, key=f"dataset:{SPECIAL.namespace}:{SPECIAL.name}"),
    ]
    return Evidence(
        m, tuple(ds), (fairness(),),
        LineageEvidence(1, (Taint("special_category", SPECIAL, "art9_2_g", ()), Taint("personal_data", SPECIAL, "consent", ())), NOW),
        LoggingEvidence(True, 400, NOW - days(200), None, NOW, "settings+job_event"),
        None,
        RobustnessEvidence(NOW - days(90), NOW, 12, 2, 1, 0, NOW),
        monitoring=monitoring(),
    )


def monitoring(*, last_age_days: float = 0.1, accuracy: float | None = 0.87, outcomes: int = 2400) -> MonitoringEvidence:
    """A week of hourly post-market monitoring windows ending ``last_age_days`` before NOW."""
    return MonitoringEvidence(168, NOW - days(7), NOW - days(last_age_days), 168, outcomes, accuracy, {"model_drift": 2}, NOW)


def gpai() -> Evidence:
    m = GP_MODEL
    ds = [
        decl(m, "classification", {"general_purpose": True}),
        decl(m, "area", {"area": "none"}),
        decl(m, "notification", {"notified_at": (NOW - days(55)).isoformat(), "reference": "AIO-2026-17"}, key="art52"),
        decl(m, "model_evaluation", {"performed_at": (NOW - days(30)).isoformat(), "reference": "EVAL-1"}, key="e1"),
        decl(m, "adversarial_test", {"performed_at": (NOW - days(25)).isoformat(), "reference": "RT-1"}, key="r1"),
    ]
    comp = ComputeEvidence(3.2e25, "measured", 8.0e6, "measured", 5.1e13, "measured", NOW - days(60), NOW - days(45), NOW)
    return Evidence(m, tuple(ds), (), LineageEvidence(1, (), NOW), None, comp, None)


def without(ev: Evidence, kind: str, key: str | None = None) -> Evidence:
    return dataclasses.replace(ev, declarations=tuple(d for d in ev.declarations if not (d.kind == kind and (key is None or d.key == key))))


def plus(ev: Evidence, *ds: Declaration) -> Evidence:
    return dataclasses.replace(ev, declarations=ev.declarations + ds)


def edit(ev: Evidence, **kw: Any) -> Evidence:
    return dataclasses.replace(ev, **kw)

"""EU AI Act (Regulation (EU) 2024/1689) obligations as code.

``model`` holds the types (declarations, evidence, results), ``rules`` the classification, the rules and
their versioned rule sets, ``evidence`` helpers computing evidence from stored frames, ``frames`` the
tables to store. Typical use::

    from governance.aiact import Evidence, evaluate
    audit = evaluate(Evidence(model, declarations=..., fairness=...), now)
"""

from governance.aiact.model import (
    DECLARATION_KINDS,
    FAIL,
    MISSING,
    NOT_APPLICABLE,
    PASS,
    AuditPolicy,
    ComputeEvidence,
    Declaration,
    DeclarationError,
    Evidence,
    EvidenceRef,
    FairnessGroup,
    FairnessRecord,
    LineageEvidence,
    LoggingEvidence,
    MonitoringEvidence,
    RobustnessEvidence,
    RuleResult,
    current,
    declare,
)
from governance.aiact.rules import (
    AI_ACT_2024,
    RULE_SETS,
    Classification,
    ModelAudit,
    Rule,
    RuleSet,
    classify,
    evaluate,
    evaluate_all,
    rule_set,
)

__all__ = [
    "AI_ACT_2024", "DECLARATION_KINDS", "FAIL", "MISSING", "NOT_APPLICABLE", "PASS", "RULE_SETS", "AuditPolicy", "Classification",
    "ComputeEvidence", "Declaration", "DeclarationError", "Evidence", "EvidenceRef", "FairnessGroup", "FairnessRecord", "LineageEvidence",
    "LoggingEvidence", "ModelAudit", "MonitoringEvidence", "RobustnessEvidence", "Rule", "RuleResult", "RuleSet", "classify", "current", "declare", "evaluate",
    "evaluate_all", "rule_set",
]

"""EU AI Act (Regulation (EU) 2024/1689) obligations as code.

``model`` holds the types (declarations, evidence, results), ``classify`` the risk classification,
``checks`` the check of each article, ``rules`` the rules, their versioned rule sets and evaluation,
``evidence`` helpers computing evidence from stored frames, ``frames`` the tables to store. Typical use::

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
from governance.aiact.classify import Classification, classify
from governance.aiact.rules import (
    AI_ACT_2024,
    RULE_SETS,
    ModelAudit,
    Rule,
    RuleSet,
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

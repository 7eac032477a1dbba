"""Governance: lineage, fairness, EU AI Act rules, evidence, reports, exports, audit log."""

"""AI Act tables, declared like the other governance frames (``fleetscope.core.frames.FrameSpec``) so the SQL
schema is generated from them, and the pure conversions between records and frames.

- ``aiact_declaration``: every declared fact with who entered it and when (append-only: a correction is a
  new row; ``governance.aiact.model.current`` picks the one in force);
- ``aiact_audit_run`` and ``aiact_rule_result``: one audit (a model or the whole registry under one rule
  set as of a date) and each rule's result with its evidence;
- ``aiact_report`` and ``aiact_export``: rendered reports and signed bundles, by content hash (the bytes
  live in ``FLEETSCOPE_DATA_DIR``);
- ``audit_log``: the hash-chained log of every governance write (``governance.auditlog``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from datetime import datetime

import polars as pl

from fleetscope.core.frames import UTC_US, FrameSpec
from governance.aiact.model import Declaration, FairnessGroup, FairnessRecord, canonical_json, utc
from governance.aiact.rules import ModelAudit
# The same column helpers as the other governance tables (text columns by default) and the same row builder.
from governance.frames import _f, _frame, _k, _r


AIACT_DECLARATION = FrameSpec(
    "aiact_declaration",
    (
        _k("declaration_id", pl.String, doc="sha256 of the record (Declaration.declaration_id): re-sending it is one row"),
        _r("model_name", pl.String, doc='"*" for the whole organisation (e.g. Art. 17 QMS items)'),
        _r("model_version", pl.String, doc='"*" for every version of the model'),
        _r("kind", pl.String, doc="one of governance.aiact.model.DECLARATION_KINDS"),
        _r("key", pl.String, doc='tells records of one kind apart (Annex IV point, QMS letter, incident id); "" if one per model'),
        _r("value", pl.String, doc="JSON object, validated against the kind"),
        _r("entered_by", pl.String, doc="the authenticated user or token name"),
        _r("entered_at", UTC_US, doc="set by the service"),
        _r("retracted", pl.Boolean),
        _f("source", doc="api, cli, import"),
    ),
    doc="A fact declared by a person for the AI Act rules, never updated in place.",
)

AIACT_AUDIT_RUN = FrameSpec(
    "aiact_audit_run",
    (
        _k("audit_id", pl.String),
        _r("scope", pl.String, doc='"registry" or "model:<name>:<version>"'),
        _r("rule_set", pl.String),
        _r("as_of", UTC_US, doc="the instant the rules were evaluated for"),
        _f("started_at", UTC_US),
        _f("finished_at", UTC_US),
        _f("trigger", doc="api, cli, beat"),
        _f("requested_by"),
        _f("counts", doc="JSON: results per status"),
    ),
    on_conflict="update",
    doc="One audit run.",
)

AIACT_RULE_RESULT = FrameSpec(
    "aiact_rule_result",
    (
        _k("audit_id", pl.String),
        _k("model_name", pl.String),
        _k("model_version", pl.String),
        _k("rule_id", pl.String),
        _r("rule_set", pl.String),
        _r("status", pl.String, doc="pass, fail, missing_evidence, not_applicable"),
        _r("citation", pl.String),
        _r("title", pl.String),
        _r("reason", pl.String),
        _f("evidence", doc="JSON array of evidence references"),
        _f("due_at", UTC_US, doc="the next deadline the rule tracks (Art. 52, 73, review periods)"),
        _r("as_of", UTC_US),
    ),
    doc="One rule's result for one model in one audit run.",
)

AIACT_REPORT = FrameSpec(
    "aiact_report",
    (
        _k("report_id", pl.String, doc="audit_id + format"),
        _r("audit_id", pl.String),
        _r("format", pl.String, doc="json, html, pdf"),
        _r("sha256", pl.String),
        _r("size_bytes", pl.Int64),
        _r("created_at", UTC_US),
        _f("location", doc="path under FLEETSCOPE_DATA_DIR"),
        _f("pdf_engine", doc="weasyprint, or the fallback used"),
    ),
    doc="A rendered audit report.",
)

AIACT_EXPORT = FrameSpec(
    "aiact_export",
    (
        _k("export_id", pl.String, doc="sha256 of the bundle"),
        _r("audit_id", pl.String),
        _r("created_at", UTC_US),
        _r("manifest_sha256", pl.String),
        _r("key_fingerprint", pl.String, doc="sha256 of the raw Ed25519 public key"),
        _r("size_bytes", pl.Int64),
        _f("location"),
        _f("requested_by"),
    ),
    doc="A signed compliance export bundle.",
)

AUDIT_LOG = FrameSpec(
    "audit_log",
    (
        _k("seq", pl.Int64, doc="0, 1, 2, ...: position in the chain"),
        _r("ts", UTC_US),
        _r("actor", pl.String),
        _r("action", pl.String, doc="declaration, fairness_evaluation, audit_run, report, export, ..."),
        _r("subject", pl.String),
        _r("payload", pl.String, doc="canonical JSON; hashed as stored text"),
        _r("prev_hash", pl.String, doc="hash of entry seq-1 (64 zeros for seq 0)"),
        _r("hash", pl.String, doc="sha256 over prev_hash and the canonical JSON of the entry"),
    ),
    doc="Append-only, hash-chained log of governance writes (governance.auditlog). Never updated: on_conflict ignore.",
)

AIACT_FRAMES: dict[str, FrameSpec] = {
    s.name: s for s in (AIACT_DECLARATION, AIACT_AUDIT_RUN, AIACT_RULE_RESULT, AIACT_REPORT, AIACT_EXPORT, AUDIT_LOG)
}


def declaration_frame(decls: Iterable[Declaration]) -> pl.DataFrame:
    rows = [{"declaration_id": d.declaration_id, "model_name": d.model_name, "model_version": d.model_version, "kind": d.kind,
             "key": d.key, "value": canonical_json(dict(d.value)), "entered_by": d.entered_by, "entered_at": d.entered_at,
             "retracted": d.retracted, "source": d.source} for d in decls]
    return _frame(AIACT_DECLARATION, rows)


def declarations_from_frame(df: pl.DataFrame) -> list[Declaration]:
    return [Declaration(r["model_name"], r["model_version"], r["kind"], r["key"], json.loads(r["value"]), r["entered_by"],
                        utc(r["entered_at"]), bool(r["retracted"]), r.get("source") or "")
            for r in df.iter_rows(named=True)]


def fairness_records(fairness_evaluation: pl.DataFrame, fairness_group: pl.DataFrame, model_name: str, model_version: str) -> list[FairnessRecord]:
    """The model's stored fairness evaluations (``governance.frames`` tables) as rule evidence."""
    ev = fairness_evaluation.filter((pl.col("model_name") == model_name) & (pl.col("model_version") == model_version))
    out = []
    for r in ev.iter_rows(named=True):
        gs = fairness_group.filter(pl.col("evaluation_id") == r["evaluation_id"])
        groups = tuple(FairnessGroup(g["feature"], g["group_value"], int(g["count"]), bool(g["judged"]), g["accuracy"],
                                     int(g["tp"]), int(g["fp"]), int(g["tn"]), int(g["fn"])) for g in gs.iter_rows(named=True))
        failed: list[str] = []
        if r.get("outcome"):
            for c in json.loads(r["outcome"]).get("checks", []):
                if c.get("passed") is False:
                    failed.append(f"{c['feature']}: {c['metric']} {c['value']:.3g} {c['comparison']} {c['threshold']}")
        out.append(FairnessRecord(r["evaluation_id"], utc(r["evaluated_at"]) if r["evaluated_at"] else None, r["passed"],
                                  int(r["min_group_size"]), int(r["n_rows"]), groups, tuple(failed)))
    return out


def audit_frames(audits: Sequence[ModelAudit], audit_id: str, *, scope: str, started_at: datetime | None = None,
                 finished_at: datetime | None = None, trigger: str = "", requested_by: str = "") -> dict[str, pl.DataFrame]:
    """Rows of one audit run: the run and every rule result."""
    counts: dict[str, int] = {}
    res = []
    for a in audits:
        for k, v in a.counts().items():
            counts[k] = counts.get(k, 0) + v
        for r in a.results:
            res.append({"audit_id": audit_id, "model_name": a.model_name, "model_version": a.model_version, "rule_id": r.rule_id,
                        "rule_set": a.rule_set, "status": r.status, "citation": r.citation, "title": r.title, "reason": r.reason,
                        "evidence": canonical_json([e.to_dict() for e in r.evidence]), "due_at": r.due_at, "as_of": a.as_of})
    as_of = audits[0].as_of if audits else started_at
    run = [{"audit_id": audit_id, "scope": scope, "rule_set": audits[0].rule_set if audits else "", "as_of": as_of,
            "started_at": started_at, "finished_at": finished_at, "trigger": trigger, "requested_by": requested_by,
            "counts": canonical_json(counts)}]
    return {"aiact_audit_run": _frame(AIACT_AUDIT_RUN, run), "aiact_rule_result": _frame(AIACT_RULE_RESULT, res)}

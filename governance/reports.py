"""Audit reports of AI Act rule results: one model or the whole registry, as JSON, HTML and PDF.

A report states, per model, each rule's result with its citation of Regulation (EU) 2024/1689, the reason,
the evidence it rests on and how old that evidence is, and a summary table across models and rules. The
JSON form is the source: HTML is rendered from it with the Jinja2 template shipped in
``governance/templates/`` and PDF from the HTML with WeasyPrint, so the three forms cannot disagree.

Pure apart from rendering: ``now`` is passed in, nothing is read from the store.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2

from fleetscope.core.errors import FleetscopeError
from governance.aiact.model import FAIL, MISSING, NOT_APPLICABLE, PASS, iso, utc
from governance.aiact.rules import REGULATION, ModelAudit, RuleSet, rule_set

TEMPLATES = Path(__file__).resolve().parent / "templates"
STATUSES = (PASS, FAIL, MISSING, NOT_APPLICABLE)
REPORT_FORMAT = 1

_INSTALL = ("pip install weasyprint; on Debian/Ubuntu also apt-get install -y libpango-1.0-0 libpangoft2-1.0-0 "
            "(WeasyPrint renders through Pango)")


class PdfUnavailable(FleetscopeError, RuntimeError):
    """WeasyPrint or its system libraries are missing; the message says what to install."""


def freshness(age_days: float | None, *, fresh_days: int = 30, stale_days: int = 180) -> str:
    """fresh / aging / stale / undated: how much an auditor should trust evidence of this age."""
    if age_days is None:
        return "undated"
    if age_days <= fresh_days:
        return "fresh"
    return "aging" if age_days <= stale_days else "stale"


def build_report(audits: Sequence[ModelAudit], *, now: datetime, scope: str = "registry", rules: RuleSet | None = None,
                 title: str | None = None, fresh_days: int = 30, stale_days: int = 180) -> dict[str, Any]:
    """The report as a JSON-ready dict. ``audits`` come from ``governance.aiact.evaluate`` (all under one
    rule set); ``scope`` is ``"registry"`` or ``"model:<name>:<version>"``."""
    now = utc(now)
    versions = {a.rule_set for a in audits}
    if len(versions) > 1:
        raise ValueError(f"audits were computed under different rule sets: {', '.join(sorted(versions))}")
    rs = rules or rule_set(next(iter(versions)) if versions else None)
    as_of = max((a.as_of for a in audits), default=now)
    counts = {s: 0 for s in STATUSES}
    by_rule: dict[str, dict[str, Any]] = {r.rule_id: {"rule_id": r.rule_id, "title": r.title, "citation": r.citation, "counts": {s: 0 for s in STATUSES}}
                                          for r in rs.rules}
    models = []
    for a in sorted(audits, key=lambda a: (a.model_name, a.model_version)):
        d = a.to_dict()
        for res in d["results"]:
            counts[res["status"]] += 1
            row = by_rule.setdefault(res["rule_id"], {"rule_id": res["rule_id"], "title": res["title"], "citation": res["citation"],
                                                      "counts": {s: 0 for s in STATUSES}})
            row["counts"][res["status"]] += 1
            for e in res["evidence"]:
                e["freshness"] = freshness(e.get("age_days"), fresh_days=fresh_days, stale_days=stale_days)
        models.append(d)
    return {
        "report_format": REPORT_FORMAT,
        "title": title or ("EU AI Act audit: " + ("whole registry" if scope == "registry" else scope)),
        "scope": scope,
        "as_of": iso(as_of),
        "generated_at": iso(now),
        "regulation": REGULATION,
        "rule_set": {"version": rs.version, "title": rs.title, "source": rs.source, "in_force": rs.in_force},
        "freshness_days": {"fresh": fresh_days, "stale": stale_days},
        "summary": {"models": len(models), "counts": counts, "by_rule": list(by_rule.values())},
        "models": models,
    }


def render_json(report: Mapping[str, Any]) -> bytes:
    """Sorted keys and fixed indentation: the same report gives the same bytes (the export hashes them)."""
    return (json.dumps(report, sort_keys=True, indent=2, ensure_ascii=False) + "\n").encode()


def _env() -> jinja2.Environment:
    # Autoescape: reasons and declarations carry user-entered text, which must not become markup.
    return jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATES)), autoescape=True, undefined=jinja2.StrictUndefined,
                              trim_blocks=True, lstrip_blocks=True)


def render_html(report: Mapping[str, Any], template: str = "audit_report.html.j2") -> str:
    return _env().get_template(template).render(r=report, statuses=STATUSES)


def pdf_engine() -> str | None:
    """``"weasyprint <version>"`` when PDF rendering works here, else None."""
    try:
        import weasyprint  # lazy: WeasyPrint (Pango), only to render a PDF
    except (ImportError, OSError):
        return None
    return f"weasyprint {weasyprint.__version__}"


def render_pdf(report: Mapping[str, Any] | None = None, *, html: str | None = None) -> bytes:
    """PDF of the report (or of ready ``html``) with WeasyPrint. Raises ``PdfUnavailable`` naming what to
    install where WeasyPrint or Pango is missing (``OSError`` is what a missing shared library raises)."""
    try:
        import weasyprint  # lazy: WeasyPrint (Pango), only to render a PDF
    except (ImportError, OSError) as exc:
        raise PdfUnavailable(f"PDF rendering needs WeasyPrint ({exc}); {_INSTALL}") from None
    if html is None:
        if report is None:
            raise ValueError("give a report or html")
        html = render_html(report)
    return weasyprint.HTML(string=html, base_url=str(TEMPLATES)).write_pdf()


def render_all(report: Mapping[str, Any]) -> dict[str, bytes]:
    """``report.json``, ``report.html`` and ``report.pdf`` (the export bundle's report files)."""
    html = render_html(report)
    return {"report.json": render_json(report), "report.html": html.encode(), "report.pdf": render_pdf(html=html)}

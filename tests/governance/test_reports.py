"""Audit reports: JSON, HTML and PDF from the same data; the PDF is read back with pdftotext."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest

from governance import reports as R
from governance.aiact import evaluate
from tests.governance.aiact_fixtures import HR_MODEL, NOW, days, decl, edit, fairness, gpai, high_risk, plus


def _report() -> dict:
    bad = plus(edit(high_risk(), fairness=(fairness(passed=False),)),
               decl(HR_MODEL, "purpose", {"text": "rank CVs <script>alert(1)</script> for recruitment"}, at=NOW - days(1)))
    return R.build_report([evaluate(bad, NOW), evaluate(gpai(), NOW)], now=NOW + days(1))


def test_json_report_has_results_citations_evidence_and_freshness() -> None:
    rep = _report()
    again = json.loads(R.render_json(rep))
    assert R.render_json(rep) == R.render_json(again)  # stable bytes for hashing
    assert again["summary"]["models"] == 2
    assert again["summary"]["counts"]["fail"] >= 1
    m = next(m for m in again["models"] if m["model_name"] == "cv-screener")
    bias = next(r for r in m["results"] if r["rule_id"] == "art10.2fg")
    assert bias["status"] == "fail" and bias["citation"].endswith("Art. 10(2)(f)-(g)")
    ev = bias["evidence"][0]
    assert ev["kind"] == "fairness_evaluation" and ev["age_days"] == 20.0  # age at the audit's as-of instant, not at rendering and ev["freshness"] == "fresh"
    row = next(r for r in again["summary"]["by_rule"] if r["rule_id"] == "art10.2fg")
    assert row["counts"]["fail"] == 1 and row["counts"]["not_applicable"] == 1


def test_report_refuses_mixed_rule_sets() -> None:
    from governance.aiact import RULE_SETS

    with pytest.raises(ValueError, match="different rule sets"):
        R.build_report([evaluate(high_risk(), NOW), evaluate(gpai(), NOW, RULE_SETS["2025-omnibus-proposal"])], now=NOW)


def test_freshness_buckets() -> None:
    assert [R.freshness(x) for x in (None, 3, 30, 31, 180, 181)] == ["undated", "fresh", "fresh", "aging", "aging", "stale"]


def test_html_escapes_declared_text_and_shows_the_rule_table() -> None:
    html = R.render_html(_report())
    assert "<script>alert" not in html and "&lt;script&gt;" in html
    assert "Art. 10(2)(f)-(g)" in html and 'class="fail"' in html


def test_pdf_read_back_shows_the_rule_table() -> None:
    if R.pdf_engine() is None:
        pytest.skip("WeasyPrint is not importable here: pip install weasyprint; apt-get install -y libpango-1.0-0 libpangoft2-1.0-0")
    if shutil.which("pdftotext") is None:
        pytest.skip("pdftotext is absent: apt-get install -y poppler-utils")
    rep = R.build_report([evaluate(edit(high_risk(), fairness=(fairness(passed=False),)), NOW)], now=NOW, scope="model:cv-screener:1")
    pdf = R.render_pdf(rep)
    assert pdf.startswith(b"%PDF-")
    text = subprocess.run(["pdftotext", "-layout", "-", "-"], input=pdf, capture_output=True, check=True, timeout=60).stdout.decode()
    assert "EU AI Act audit" in text and "Summary" in text
    for rule_id, citation in (("art5", "Art. 5(1)(a)-(h)"), ("art9", "Art. 9(1)-(2)"), ("art73", "Art. 73(2)-(4)")):
        assert rule_id in text and citation in text
    assert "missing_evidence" in text and "not_applicable" in text
    line = next(l for l in text.splitlines() if l.lstrip().startswith("art10.2fg") and "fail" in l)
    assert "fail" in line

"""EU AI Act audits through the running API and the CLI: declarations, rule results, reports (PDF read back),
signed exports verified offline (and caught when altered), and the hash-chained audit log."""

import io
import json
import os
import shutil
import subprocess
import zipfile

import httpx
import polars as pl
import pytest

from tests.fleetscope.test_governance_api import build_pipeline, gov
from tests import clirun


def declare(api, h, kind, value, model="ranker", version="1", key=""):
    r = httpx.post(api.url + "/api/v1/declarations", json={"model": model, "version": version, "kind": kind, "value": value, "key": key}, headers=h)
    assert r.status_code == 201, r.text
    return r.json()


def results(api, h, audit_id):
    rows = httpx.get(api.url + f"/api/v1/audits/{audit_id}/results", headers=h).json()
    return {r["rule_id"]: r for r in rows}


def test_audit_evidence_changes_the_verdicts(api):
    h = gov(api)
    assert httpx.post(api.url + "/api/v1/audits", headers=h).status_code == 409  # empty registry: says what to do
    build_pipeline(api, h)
    first = httpx.post(api.url + "/api/v1/audits", headers=h, timeout=120).json()
    r1 = results(api, h, first["audit_id"])
    assert r1["art5"]["status"] == "pass"  # the registered purpose, ranking applicants, is no Art. 5 practice
    assert r1["art6"]["status"] == "missing_evidence"  # no Annex III area declared yet
    d = declare(api, h, "purpose", {"text": "rank job applicants for interview shortlists"})
    assert d["entered_by"] == "gov"
    declare(api, h, "area", {"area": "employment"})
    second = httpx.post(api.url + "/api/v1/audits", params={"model": "ranker"}, headers=h, timeout=120).json()
    assert second["scope"] == "model:ranker:1"
    r2 = results(api, h, second["audit_id"])
    assert r2["art5"]["status"] == "pass"
    assert r2["art6"]["status"] != "missing_evidence" and "high-risk" in r2["art6"]["reason"].lower()
    # Art. 12: nobody has said whether the system logs its events, so the rule waits for that declaration
    assert r2["art12"]["status"] == "missing_evidence" and "Art. 12(1)" in r2["art12"]["citation"]
    assert r2["art12"]["reason"] == (
        "whether automatic event logging is enabled is not known; settled by a 'logging' declaration: "
        "fleetscope audit declare ranker logging --version 1 --value '{\"enabled\": true}' --by NAME, or POST /api/v1/declarations "
        '{"model": "ranker", "version": "1", "kind": "logging", "value": {"enabled": true}}')
    # Declared enabled, the retention of 400 days clears the six months of Art. 19(1), and the verdict then
    # rests on the logs actually held: this pipeline recorded no job events for the model at all.
    declare(api, h, "logging", {"enabled": True})
    third = httpx.post(api.url + "/api/v1/audits", params={"model": "ranker"}, headers=h, timeout=120).json()
    r3 = results(api, h, third["audit_id"])
    assert (r3["art12"]["status"], r3["art12"]["reason"]) == ("fail", "logging is enabled but no log record is held")
    assert {r["rule_id"] for r in r2.values()} >= {"art5", "art6", "art9", "art10.5", "art11", "art12", "art14", "art73"}
    listed = httpx.get(api.url + "/api/v1/audits", headers=h).json()
    assert [a["audit_id"] for a in listed] == [third["audit_id"], second["audit_id"], first["audit_id"]]
    bad = httpx.post(api.url + "/api/v1/declarations", json={"model": "ranker", "kind": "area", "value": {"area": "astrology"}}, headers=h)
    assert bad.status_code == 422 and "astrology" in bad.text
    assert httpx.post(api.url + "/api/v1/declarations", json={"model": "ranker", "kind": "purpose", "value": {"txt": "x"}}, headers=h).status_code == 422


def test_each_failed_rule_is_a_finding_the_alert_reads(api):
    h = gov(api)
    build_pipeline(api, h)
    # ranking job applicants is Annex III point 4 (employment): declaring it outside Annex III fails Art. 6
    declare(api, h, "area", {"area": "none"})
    run = httpx.post(api.url + "/api/v1/audits", headers=h, timeout=120).json()
    failed = {k: r for k, r in results(api, h, run["audit_id"]).items() if r["status"] == "fail"}
    assert "art6" in failed, failed
    found = api.app.state.store.read("finding").filter(pl.col("kind") == "audit_rule")
    assert sorted(found["subject"].to_list()) == sorted(f"model:ranker:1/rule:{k}" for k in failed)
    for f in found.iter_rows(named=True):
        rule = f["subject"].rsplit("rule:", 1)[1]
        assert f["summary"].startswith("ranker:1 fails ") and failed[rule]["citation"] in f["summary"]
        assert f["severity"] == ("critical" if rule in ("art5", "art73") else "warning")
        assert json.loads(f["evidence"])["audit_id"] == run["audit_id"]
    # rules only missing their evidence are not failures: no finding for them
    missing = {k for k, r in results(api, h, run["audit_id"]).items() if r["status"] == "missing_evidence"}
    assert not any(s.rsplit("rule:", 1)[1] in missing for s in found["subject"].to_list())


def test_reports_are_served_and_the_pdf_holds_the_rule_table(api):
    h = gov(api)
    build_pipeline(api, h)
    declare(api, h, "purpose", {"text": "rank job applicants"})
    audit = httpx.post(api.url + "/api/v1/audits", headers=h, timeout=120).json()
    js = httpx.get(api.url + f"/api/v1/audits/{audit['audit_id']}/report.json", headers=h)
    assert js.status_code == 200 and json.loads(js.content)["scope"] == "registry"
    html = httpx.get(api.url + f"/api/v1/audits/{audit['audit_id']}/report.html", headers=h)
    assert html.status_code == 200 and "Art. 5" in html.text and "ranker" in html.text
    pdf = httpx.get(api.url + f"/api/v1/audits/{audit['audit_id']}/report.pdf", headers=h)
    assert pdf.status_code == 200 and pdf.content.startswith(b"%PDF")
    if shutil.which("pdftotext") is None:
        pytest.skip("pdftotext (poppler-utils) not installed: the PDF was made but cannot be read back here")
    text = subprocess.run(["pdftotext", "-", "-"], input=pdf.content, capture_output=True, check=True).stdout.decode()
    assert "Art. 5" in text and "Art. 73" in text and "ranker" in text
    assert httpx.get(api.url + f"/api/v1/audits/{audit['audit_id']}/report.docx", headers=h).status_code == 404


def test_export_verifies_offline_and_tampering_is_named(api, tmp_path):
    h = gov(api)
    build_pipeline(api, h)
    httpx.post(api.url + "/api/v1/audits", headers=h, timeout=120)
    ex = httpx.post(api.url + "/api/v1/exports", headers=h, timeout=120)
    assert ex.status_code == 201, ex.text
    bundle = httpx.get(api.url + f"/api/v1/exports/{ex.json()['export_id']}", headers=h).content
    pub = httpx.get(api.url + "/api/v1/signing-key", headers=h).content
    (tmp_path / "b.zip").write_bytes(bundle)
    (tmp_path / "pub.pem").write_bytes(pub)
    env = {**os.environ, "FLEETSCOPE_DATA_DIR": str(tmp_path / "other")}
    verify = lambda p: clirun.cli("verify", str(p), "--key", str(tmp_path / "pub.pem"), "--json", env=env)  # noqa: E731
    ok = verify(tmp_path / "b.zip")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert json.loads(ok.stdout)["ok"] is True
    # one byte of the evidence changed -> that file is named
    src = zipfile.ZipFile(io.BytesIO(bundle))
    names = src.namelist()
    for part in ("report/report.json", "report/report.html", "report/report.pdf", "evidence/rule_results.csv", "evidence/lineage_edges.csv",
                 "evidence/fairness_groups.csv", "evidence/energy_and_compute.json", "evidence/incidents.csv"):
        assert part in names, part
    # no training job of "ranker" in the inventory: the footprint row says so rather than inventing figures
    assert "no training job" in json.loads(src.read("evidence/energy_and_compute.json"))[0]["note"]
    victim = next(n for n in names if n.startswith("evidence/") and n.endswith(".csv"))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as z:
        for n in names:
            data = src.read(n)
            if n == victim:
                data = data[:-2] + bytes([data[-2] ^ 1]) + data[-1:]
            z.writestr(n, data)
    (tmp_path / "t.zip").write_bytes(out.getvalue())
    bad = verify(tmp_path / "t.zip")
    assert bad.returncode == 7 and json.loads(bad.stdout)["altered"] == [victim]


def test_audit_log_chains_governance_writes_and_finds_an_edit(api):
    h = gov(api)
    build_pipeline(api, h)
    declare(api, h, "purpose", {"text": "rank job applicants"})
    v = httpx.get(api.url + "/api/v1/auditlog/verify", headers=h).json()
    assert v["ok"] is True and v["entries"] >= 3  # dataset, model, declaration
    store = api.app.state.store
    actions = store.read("audit_log").sort("seq")["action"].to_list()
    assert actions[:3] == ["registry_dataset", "registry_model", "declaration"]
    with store.engine.begin() as conn:
        conn.exec_driver_sql("UPDATE audit_log SET actor = 'mallory' WHERE seq = 1")
    broken = httpx.get(api.url + "/api/v1/auditlog/verify", headers=h).json()
    assert broken["ok"] is False and broken["first_break"]["seq"] == 1 and "edited" in broken["first_break"]["why"]


def test_cli_report_export_and_auditlog(tmp_path):
    env = {**os.environ, "FLEETSCOPE_DATA_DIR": str(tmp_path)}
    env.pop("FLEETSCOPE_DATABASE_URL", None)
    run = lambda *a: clirun.cli(*a, env=env)  # noqa: E731
    assert run("audit", "report").returncode == 1  # empty registry: a clear error
    assert run("governance", "registry", "model", "scorer", "3", "--purpose", "credit scoring of consumers", "--role", "provider").returncode == 0
    bad = run("audit", "declare", "scorer", "area", "--value", "{not json", "--by", "ana")
    assert bad.returncode == 2 and "not JSON" in bad.stderr
    assert run("audit", "declare", "scorer", "area", "--version", "3", "--value", '{"area": "essential_services"}', "--by", "ana").returncode == 0
    rep = run("audit", "report", "--json")
    assert rep.returncode in (0, 6), rep.stderr
    out = json.loads(rep.stdout)
    assert out["models"] == 1 and sum(out["counts"].values()) >= 17
    ex = run("audit", "export", "--out", str(tmp_path / "bundle.zip"), "--json")
    assert ex.returncode == 0, ex.stderr
    pub = json.loads(ex.stdout)["public_key"]
    assert run("verify", str(tmp_path / "bundle.zip"), "--key", pub).returncode == 0
    log = run("verify", "--auditlog", "--json")
    assert log.returncode == 0 and json.loads(log.stdout)["entries"] == 4  # model, declaration, audit run, export
    # one verb, told which thing to check: a bundle with its key, or the log; anything else is a usage error
    for args, why in (((), "not both or neither"), ((str(tmp_path / "bundle.zip"), "--auditlog"), "not both or neither"),
                      ((str(tmp_path / "bundle.zip"),), "add --key FILE")):
        bad = run("verify", *args)
        assert bad.returncode == 2 and why in bad.stderr, (args, bad.stderr)

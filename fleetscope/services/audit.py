"""EU AI Act audits against the store: declarations kept with who entered them, audit runs over every
registered model, reports rendered and filed, signed export bundles, and the hash-chained audit log
every governance write is appended to. Pure logic: ``governance/aiact``, ``reports``, ``exports``,
``auditlog``; this module adds the database, the files and the clock.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import io
import json
import uuid
import zipfile
from typing import Any

import polars as pl

from analyzers import carbon
from fleetscope.core import frames as F
from fleetscope.services import governance as gs
from fleetscope.services import monitoring as ms
from fleetscope.services import scheduled
from fleetscope import safefiles
from fleetscope.services.energy import job_energy, model_jobs
from fleetscope.settings import Settings
from fleetscope.store import Store
from fleetscope.services.auditlog import (  # noqa: F401  (the log is part of this domain's API)
    AuditError, _log, _public_key_path, anchor, audit_key, audit_key_path, bind, checkpoint_path, log, signing_key, verify_log,
)
from governance import exports, reports
from governance import lineage as L
from governance.aiact import evidence as E
from governance.aiact import frames as AF
from governance.aiact import model as M
from governance.aiact import rules as R
from fleetscope.store.reads import fetch
from fleetscope.services.energy import model_footprint


def _write(store: Store, frames: dict[str, pl.DataFrame], source: str) -> dict[str, int]:
    return store.write_frames([(AF.AIACT_FRAMES[k], v) for k, v in frames.items()], source=source).written



def declare(store: Store, model: str, version: str, kind: str, value: dict[str, Any], *, entered_by: str, key: str = "",
            retracted: bool = False, source: str = "api", now: dt.datetime | None = None) -> M.Declaration:
    """Record a declared fact (purpose, Annex III area, oversight, documentation, incident, ...), entered
    ``now`` (the wall clock unless a replay or a simulation says otherwise)."""
    d = M.declare(model, version, kind, value, entered_by=entered_by, entered_at=now or dt.datetime.now(dt.UTC), key=key,
                  retracted=retracted, source=source)
    _write(store, {"aiact_declaration": AF.declaration_frame([d])}, f"declaration:{model}")
    log(store, actor=entered_by, action="declaration", subject=f"model:{model}:{version}",
        payload={"kind": kind, "key": key, "value": dict(d.value), "retracted": retracted, "declaration_id": d.declaration_id})
    return d


def declare_incident(store: Store, kind: str, subject: str, window_start: dt.datetime, *, incident_kind: str, entered_by: str,
                     description: str | None = None, aware_at: dt.datetime | None = None, now: dt.datetime | None = None) -> M.Declaration:
    """Declare a serious incident (Art. 3(49)) from a post-market monitoring finding: the provider became
    aware of it now (or at ``aware_at``), which starts the Art. 73 clock: 15 days (Art. 73(2)), 2 days for a
    widespread infringement or a critical-infrastructure disruption (Art. 73(3)), 10 days for a death
    (Art. 73(4)). The incident's key names the finding, so declaring it twice updates one record."""
    f = ms.finding(store, kind, subject, window_start)
    parts = subject.split("/", 1)[0].split(":")
    if len(parts) != 3 or parts[0] != "model":
        raise M.DeclarationError(f"finding subject {subject[:200]!r} names no model version (model:NAME:VERSION)")
    _, name, version = parts
    now = now or dt.datetime.now(dt.UTC)
    ws = f["window_start"]
    ref = f"{kind}/{subject}/{M.iso(ws)}"
    value = {"kind": incident_kind, "aware_at": M.iso(aware_at or now), "occurred_at": M.iso(ws), "finding": ref,
             "description": description or f["summary"]}
    return declare(store, name, version, "incident", value, entered_by=entered_by, key=f"finding:{ref}"[:500], source="finding", now=now)


# --- audits ----------------------------------------------------------------------------------------


def _evidence(store: Store, settings: Settings, model: Any, now: dt.datetime, taints: dict[str, list[L.Taint]], graph: L.LineageGraph) -> M.Evidence:
    # the model's jobs as the footprint endpoint and the export find them: the scheduler's record, or a
    # lineage run that trained the model naming the fleet job
    job = model_jobs(store, model.name)
    job_ids = E.model_job_ids(job, model.name) if job.height else []
    events = store.read("job_event", job_id=job_ids) if job_ids else store.read("job_event", limit=0)
    oldest = events["ts"].min() if events.height else None
    steps = store.read("step", job_id=job_ids) if job_ids else None
    compute = None
    if job_ids:
        fp = carbon.model_footprint(model.name, job=job, job_energy=job_energy(store, job_ids), step=steps)
        ended = job.filter(pl.col("job_id").is_in(job_ids))["ended_at"].max()
        compute = M.ComputeEvidence.from_footprint(fp, threshold_crossed_at=E.threshold_crossing(steps, job_ids) if steps is not None and steps.height else None,
                                                   training_ended_at=ended, as_of=now)
    robust = None
    if job_ids:
        robust = E.robustness(store.read("health_event", start=now - dt.timedelta(days=90)), events, store.read("job_rank", job_id=job_ids),
                              job_ids, now - dt.timedelta(days=90), now, as_of=now)
    runs_seen = len(graph.run_closure(L.training_runs(graph, model))) if model.training_run_ids or graph.runs else 0
    mon = ms.evidence(store, model.name, model.version, now=now)
    return E.evidence_from_frames(
        model, declaration=store.read("aiact_declaration"), fairness_evaluation=store.read("fairness_evaluation"),
        fairness_group=store.read("fairness_group"), taints=taints.get(model.node_id, []), training_runs_seen=runs_seen,
        retention_days=settings.retention_days, oldest_log_record_at=oldest, compute=compute, robustness=robust, as_of=now,
        monitoring=None if mon is None else M.MonitoringEvidence(
            mon["windows"], mon["first_window_start"], mon["last_window_end"], mon["recent_windows"], mon["recent_outcomes"],
            mon["recent_accuracy"], mon["findings"], now),
    )


def run_audit(store: Store, settings: Settings, *, model: str | None = None, version: str | None = None, trigger: str = "api",
              requested_by: str = "", now: dt.datetime | None = None) -> dict[str, Any]:
    """Evaluate the rules for one model or the whole registry, store the results, render and file the report."""
    started = now or dt.datetime.now(dt.UTC)
    datasets, models = gs.registry(store)
    if model is not None:
        models = [gs.find_model(store, model, version)]
    if not models:
        raise AuditError("the model registry is empty: register a model (PUT /api/v1/models/{name}/{version}) before auditing")
    graph = gs.graph(store)
    taints = L.propagate(graph, datasets, models)
    audits = R.evaluate_all([_evidence(store, settings, m, started, taints, graph) for m in models], started)
    scope = "registry" if model is None else f"model:{models[0].name}:{models[0].version}"
    audit_id = f"{started:%Y%m%dT%H%M%SZ}-{uuid.uuid4().hex[:8]}"
    report = reports.build_report(audits, now=started, scope=scope)
    files = reports.render_all(report)
    folder = safefiles.private_dir(settings.data_dir / "reports" / audit_id)
    rows = []
    for name, data in files.items():
        safefiles.write_private(folder / name, data)
        fmt = name.rsplit(".", 1)[-1]
        rows.append({"report_id": f"{audit_id}.{fmt}", "audit_id": audit_id, "format": fmt, "sha256": hashlib.sha256(data).hexdigest(),
                     "size_bytes": len(data), "created_at": started, "location": str((folder / name).relative_to(settings.data_dir)),
                     "pdf_engine": reports.pdf_engine() if fmt == "pdf" else None})
    frames = AF.audit_frames(audits, audit_id, scope=scope, started_at=started, finished_at=dt.datetime.now(dt.UTC), trigger=trigger,
                             requested_by=requested_by)
    frames["aiact_report"] = pl.DataFrame(rows, schema=AF.AIACT_REPORT.schema)
    _write(store, frames, f"audit:{audit_id}")
    # A verdict stands until the next audit of its model: the scheduled one (so a failure pages through the week
    # between two weekly audits) or any run before it, which closes the standing verdicts of the models it audits.
    failed = rule_findings(frames["aiact_rule_result"], audit_id, started, scheduled.next_fire(settings.report_schedule, started))
    standing = _standing_failures(store, [(m.name, m.version) for m in models], started)
    both = pl.concat([standing, failed], how="vertical_relaxed") if standing.height else failed
    if both.height:
        store.write(F.Batch(source=f"audit:{audit_id}", finding=both))
    counts = json.loads(frames["aiact_audit_run"]["counts"][0])
    log(store, actor=requested_by or trigger, action="audit_run", subject=scope, payload={"audit_id": audit_id, "counts": counts,
        "reports": {r["format"]: r["sha256"] for r in rows}})
    return {"audit_id": audit_id, "scope": scope, "counts": counts, "models": len(audits), "reports": [r["location"] for r in rows]}


def rule_findings(results: pl.DataFrame, audit_id: str, at: dt.datetime, until: dt.datetime | None = None) -> pl.DataFrame:
    """One ``audit_rule`` finding per failed rule of a model (what the ``AuditRuleFailed`` alert pages on),
    from the audit (``at``) to the next one due (``until``; the audit's own time where None): a failure found
    again by the next audit is a new finding, and one that was fixed is not found again, its verdict closed by
    that audit (``_standing_failures``). A rule whose evidence is missing is not a failure and raises nothing
    here: the report lists what would settle it."""
    rows = []
    for r in results.filter(pl.col("status") == "fail").iter_rows(named=True):
        rows.append({"analyzer": "aiact", "kind": "audit_rule", "subject": f"model:{r['model_name']}:{r['model_version']}/rule:{r['rule_id']}",
                     "window_start": at, "window_end": until or at, "severity": "critical" if r["rule_id"] in _CRITICAL_RULES else "warning",
                     "score": None, "summary": f"{r['model_name']}:{r['model_version']} fails {r['citation']} ({r['title']}): {r['reason']}",
                     "evidence": json.dumps({"audit_id": audit_id, "rule_id": r["rule_id"], "rule_set": r["rule_set"], "citation": r["citation"],
                                             "due_at": r["due_at"].isoformat() if r["due_at"] else None}, sort_keys=True)})
    return F.findings_frame(rows)


_VERDICT_COLS = {"analyzer": pl.String, "kind": pl.String, "subject": pl.String, "window_start": F.UTC_US, "window_end": F.UTC_US,
                 "severity": pl.String, "score": pl.Float64, "summary": pl.String, "evidence": pl.String}


def _standing_failures(store: Store, models: list[tuple[str, str]], at: dt.datetime) -> pl.DataFrame:
    """The earlier audits' failure findings of ``models`` that still stand at ``at``, ended there: the audit at
    ``at`` gives those models' verdicts afresh."""
    got = fetch(store, f"SELECT {', '.join(_VERDICT_COLS)} FROM finding WHERE analyzer = 'aiact' AND kind = 'audit_rule'"
                " AND window_end > ? AND window_start < ?", [at, at], _VERDICT_COLS)
    # a rule id holds no "/" (governance.aiact.rules), so the model is the subject up to its last "/rule:"
    audited = [f"model:{name}:{version}" for name, version in models]
    return got.filter(pl.col("subject").str.replace(r"/rule:[^/]*$", "").is_in(audited)).with_columns(window_end=pl.lit(at, F.UTC_US))


# Prohibited practices (Art. 5) and a missed serious-incident deadline (Art. 73) cannot wait for the next
# working day; other failed obligations are warnings for the compliance team.
_CRITICAL_RULES = frozenset({"art5", "art73"})


def list_audits(store: Store) -> list[dict[str, Any]]:
    runs = store.read("aiact_audit_run").sort("as_of", descending=True)
    return [{"audit_id": r["audit_id"], "scope": r["scope"], "as_of": r["as_of"].isoformat(), "trigger": r["trigger"],
             "counts": json.loads(r["counts"] or "{}")} for r in runs.iter_rows(named=True)]


def report_file(store: Store, settings: Settings, audit_id: str, fmt: str) -> tuple[bytes, str]:
    rows = store.read("aiact_report").filter((pl.col("audit_id") == audit_id) & (pl.col("format") == fmt))
    if rows.height == 0:
        raise AuditError(f"no {fmt} report for audit {audit_id!r}")
    r = rows.row(0, named=True)
    data = safefiles.contained(settings.data_dir, r["location"], what="report location").read_bytes()
    if hashlib.sha256(data).hexdigest() != r["sha256"]:
        raise AuditError(f"report file {r['location']} no longer matches the hash recorded when it was made")
    return data, {"json": "application/json", "html": "text/html; charset=utf-8", "pdf": "application/pdf"}[fmt]


def export_file(store: Store, settings: Settings, export_id: str) -> tuple[bytes, str]:
    """A signed export bundle's bytes and its download name; ``AuditError`` when there is no such export
    or its file is gone."""
    rows = store.read("aiact_export").filter(pl.col("export_id") == export_id)
    if rows.height == 0:
        raise AuditError(f"no export {export_id[:100]!r}")
    try:
        data = safefiles.contained(settings.data_dir, rows["location"][0], what="export location").read_bytes()
    except OSError as exc:
        raise AuditError(f"export {export_id[:12]}: its file {rows['location'][0]} cannot be read ({exc.strerror})") from None
    return data, f"fleetscope-export-{export_id[:12]}.zip"


def latest_audit_id(store: Store) -> str:
    runs = list_audits(store)
    if not runs:
        raise AuditError("no audit has run yet: run one first (fleetscope audit report, or POST /api/v1/audits)")
    return runs[0]["audit_id"]


# --- exports ----------------------------------------------------------------------------------------


def make_export(store: Store, settings: Settings, *, audit_id: str | None = None, requested_by: str = "", now: dt.datetime | None = None) -> dict[str, Any]:
    """A signed bundle of one audit: its report in all forms and the evidence behind it."""
    now = now or dt.datetime.now(dt.UTC)
    audit_id = audit_id or latest_audit_id(store)
    report_files = {}
    for fmt in ("json", "html", "pdf"):
        try:
            report_files[f"report.{fmt}"] = report_file(store, settings, audit_id, fmt)[0]
        except AuditError:
            if fmt != "pdf":
                raise
    evidence = {
        "rule_results": store.read("aiact_rule_result").filter(pl.col("audit_id") == audit_id),
        "declarations": store.read("aiact_declaration"),
        "lineage_edges": store.read("lineage_io"),
        "lineage_runs": store.read("lineage_run_event"),
        "dataset_registry": store.read("dataset_registry"),
        "models": store.read("model"),
        "fairness_evaluations": store.read("fairness_evaluation"),
        "fairness_groups": store.read("fairness_group"),
        "incidents": store.read("aiact_declaration").filter(pl.col("kind") == "incident"),
        # Art. 72 evidence: every evaluated post-market monitoring window and the findings they raised
        "monitoring_windows": ms.windows(store, limit=100_000),
        "monitoring_findings": ms.findings(store, include_cleared=True, limit=10_000),
        "energy_and_compute": _footprints(store),
    }
    key = signing_key(settings)
    # The export's own entry goes first, so the head the bundle records (and the checkpoint it carries)
    # includes it. The entry cannot name the bundle's hash, which depends on that head; it names the
    # reports, and the bundle names the entry.
    entry, cp = _log(store, actor=requested_by or "fleetscope", action="export", subject=f"audit:{audit_id}",
                     payload={"key_fingerprint": exports.key_fingerprint(key),
                              "reports": {name: hashlib.sha256(data).hexdigest() for name, data in sorted(report_files.items())}})
    bundle = exports.build_bundle(report_files, evidence, key, now=now,
                                  meta={"audit_id": audit_id, "auditlog_head": entry.hash, "auditlog_seq": entry.seq},
                                  extra_files={exports.AUDITLOG_CHECKPOINT: (cp.line() + "\n").encode(),
                                               exports.AUDITLOG_ENTRY: (json.dumps(entry.to_dict(), ensure_ascii=False, indent=1) + "\n").encode()})
    export_id = hashlib.sha256(bundle).hexdigest()
    path = safefiles.write_private(safefiles.private_dir(settings.data_dir / "exports") / f"fleetscope-export-{audit_id}-{export_id[:12]}.zip", bundle)
    manifest = zipfile.ZipFile(io.BytesIO(bundle)).read(exports.MANIFEST)
    _write(store, {"aiact_export": pl.DataFrame([{"export_id": export_id, "audit_id": audit_id, "created_at": now,
                                                  "manifest_sha256": hashlib.sha256(manifest).hexdigest(),
                                                  "key_fingerprint": exports.key_fingerprint(key), "size_bytes": len(bundle),
                                                  "location": str(path.relative_to(settings.data_dir)), "requested_by": requested_by}],
                                                schema=AF.AIACT_EXPORT.schema)}, f"export:{audit_id}")
    return {"export_id": export_id, "audit_id": audit_id, "path": str(path), "size_bytes": len(bundle),
            "key_fingerprint": exports.key_fingerprint(key), "public_key": str(_public_key_path(settings))}


def _footprints(store: Store) -> pl.DataFrame:
    """Training compute, time, energy and emissions of every registered model, each with its basis
    (Annex XI 1.2(d)-(e)); models without a training job in the inventory get a row saying so."""

    rows = []
    for m in store.read("model")["model_name"].unique().sort().to_list():
        try:
            fp = model_footprint(store, m)
            rows.append({"model_name": m, **{k: (", ".join(v) if isinstance(v, list) else v) for k, v in fp.items()}, "note": None})
        except ValueError as exc:
            rows.append({"model_name": m, "note": str(exc)})
    return pl.DataFrame(rows, infer_schema_length=None) if rows else pl.DataFrame({"model_name": [], "note": []}, schema={"model_name": pl.String, "note": pl.String})


# --- reads (the dashboard's, the API's and the CLI's) ---------------------------------------


UTC = F.UTC_US


_STATUSES = ("pass", "fail", "missing_evidence", "not_applicable")


def audit_runs(store: Store, limit: int = 50) -> pl.DataFrame:
    """EU AI Act audit runs, newest first: ``audit_id, scope, as_of, trigger, requested_by``, the number of
    rule results per status (``pass, fail, missing_evidence, not_applicable``), ``formats`` (the reports
    filed: json, html, pdf) and ``exports`` (signed bundles made of it)."""
    runs = fetch(
        store,
        f"SELECT audit_id, scope, as_of, trigger, requested_by, counts FROM aiact_audit_run ORDER BY as_of DESC LIMIT {int(limit)}",
        [],
        {"audit_id": pl.String, "scope": pl.String, "as_of": UTC, "trigger": pl.String, "requested_by": pl.String, "counts": pl.String},
    )
    schema = {**{c: runs.schema[c] for c in ("audit_id", "scope", "as_of", "trigger", "requested_by")}, **{s: pl.Int64 for s in _STATUSES},
              "formats": pl.String, "exports": pl.Int64}
    if runs.is_empty():
        return pl.DataFrame(schema=schema)
    ids = runs["audit_id"].to_list()
    marks = ", ".join("?" for _ in ids)
    reports = fetch(store, f"SELECT audit_id, format FROM aiact_report WHERE audit_id IN ({marks})", ids, {"audit_id": pl.String, "format": pl.String})
    exports = fetch(store, f"SELECT audit_id, COUNT(*) AS exports FROM aiact_export WHERE audit_id IN ({marks}) GROUP BY audit_id", ids,
                     {"audit_id": pl.String, "exports": pl.Int64})
    order = {"json": 0, "html": 1, "pdf": 2}
    formats = reports.sort(pl.col("format").replace_strict(order, default=9, return_dtype=pl.Int64)).group_by("audit_id", maintain_order=True).agg(
        pl.col("format").str.join(", ").alias("formats"))

    def count(text: str | None, status: str) -> int:
        try:
            return int(json.loads(text or "{}").get(status, 0))
        except (ValueError, AttributeError, TypeError):
            return 0

    counts = {s: [count(c, s) for c in runs["counts"].to_list()] for s in _STATUSES}
    return (
        runs.drop("counts").with_columns(**{s: pl.Series(v, dtype=pl.Int64) for s, v in counts.items()})
        .join(formats, on="audit_id", how="left").join(exports, on="audit_id", how="left")
        .with_columns(pl.col("exports").fill_null(0))
        .select(list(schema))
    )


def audit_exports(store: Store, limit: int = 50) -> pl.DataFrame:
    """Signed export bundles, newest first: ``export_id, audit_id, created_at, size_bytes, key_fingerprint,
    manifest_sha256, requested_by``."""
    cols = {"export_id": pl.String, "audit_id": pl.String, "created_at": UTC, "size_bytes": pl.Int64, "key_fingerprint": pl.String,
            "manifest_sha256": pl.String, "requested_by": pl.String}
    return fetch(store, f"SELECT {', '.join(cols)} FROM aiact_export ORDER BY created_at DESC LIMIT {int(limit)}", [], cols)


def rule_results(store: Store, audit_id: str) -> pl.DataFrame:
    """One audit's rule results: ``model`` (name:version), ``rule_id, title, citation, status, reason,
    due_at, evidence`` (JSON), in rule order as the rules engine wrote them."""
    sql = (
        "SELECT model_name || ':' || model_version AS model, rule_id, title, citation, status, reason, due_at, evidence"
        " FROM aiact_rule_result WHERE audit_id = ? ORDER BY model_name, model_version"
    )
    schema = {"model": pl.String, "rule_id": pl.String, "title": pl.String, "citation": pl.String, "status": pl.String, "reason": pl.String,
              "due_at": UTC, "evidence": pl.String}
    return fetch(store, sql, [audit_id], schema)

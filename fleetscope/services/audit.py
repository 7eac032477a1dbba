"""EU AI Act audits against the store: declarations kept with who entered them, audit runs over every
registered model, reports rendered and filed, signed export bundles, and the hash-chained audit log
every governance write is appended to. Pure logic: ``governance/aiact``, ``reports``, ``exports``,
``auditlog``; this module adds the database, the files and the clock.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import fcntl
import hashlib
import io
import json
import os
import secrets
import threading
import uuid
import weakref
import zipfile
from pathlib import Path
from typing import Any

import polars as pl

from analyzers import carbon
from fleetscope.core import frames as F
from fleetscope.services import governance as gs
from fleetscope import safefiles
from fleetscope.services.energy import job_energy, model_jobs
from fleetscope.core.errors import FleetscopeError
from fleetscope import settings as settings_mod
from fleetscope.settings import Settings
from fleetscope.store import Store
from governance import auditlog, exports, reports
from governance import lineage as L
from governance.aiact import evidence as E
from governance.aiact import frames as AF
from governance.aiact import model as M
from governance.aiact import rules as R


class AuditError(FleetscopeError):
    pass


def _write(store: Store, frames: dict[str, pl.DataFrame], source: str) -> dict[str, int]:
    return store.write_frames([(AF.AIACT_FRAMES[k], v) for k, v in frames.items()], source=source).written


# --- audit log -------------------------------------------------------------------------------------
#
# The chain is keyed with a secret in a file (FLEETSCOPE_AUDIT_KEY_FILE, else <data dir>/audit.key) and
# every append writes a checkpoint signed with the export signing key to an append-only file
# (FLEETSCOPE_AUDIT_CHECKPOINT_FILE, else <data dir>/audit_checkpoints.jsonl); governance/auditlog.py says
# why both are needed. Every writer of one database must use the same two files: each process binds its
# store to its settings (``bind``), and an unbound store uses the environment's settings.

_BOUND: weakref.WeakKeyDictionary[Any, Settings] = weakref.WeakKeyDictionary()
_APPEND_LOCK = threading.Lock()


def bind(store: Store, settings: Settings) -> None:
    """Make ``store``'s audit log use ``settings``' key and checkpoint file, wherever it is written from
    (bound by engine, so every ``Store`` over the same engine shares it)."""
    _BOUND[store.engine] = settings


def _settings_of(store: Store) -> Settings:
    """The bound settings; else the environment's, which describe the CLI's and the dashboard's store.
    A SQLite file the environment does not name (a store opened by hand) keeps its key and checkpoints
    in its own folder, as the embedded layout does, rather than in another database's data directory."""
    bound = _BOUND.get(store.engine)
    if bound is not None:
        return bound
    env = settings_mod.load()
    path = store.engine.url.database if store.dialect == "sqlite" else None
    if path and path != ":memory:" and env.database_url.startswith("sqlite") and "///" in env.database_url:
        mine, named = Path(path).resolve(), Path(env.database_url.split("///", 1)[1]).resolve()
        if mine != named:
            return dataclasses.replace(env, data_dir=mine.parent, audit_key_file="", audit_checkpoint_file="")
    return env


def audit_key_path(settings: Settings) -> Path:
    return Path(settings.audit_key_file).expanduser() if settings.audit_key_file else settings.data_dir / "audit.key"


def checkpoint_path(settings: Settings) -> Path:
    return Path(settings.audit_checkpoint_file).expanduser() if settings.audit_checkpoint_file else settings.data_dir / "audit_checkpoints.jsonl"


def audit_key(settings: Settings, *, create: bool) -> bytes | None:
    """The audit log's HMAC key: hex text in ``FLEETSCOPE_AUDIT_KEY_FILE`` or, embedded, in
    ``<data dir>/audit.key``, generated there (0600) on first use when ``create``. None when absent and
    not to be created. ``AuditError`` for a named file that is missing, readable by others, or not a key."""
    path = audit_key_path(settings)
    if not path.exists():
        if settings.audit_key_file:
            raise AuditError(f"FLEETSCOPE_AUDIT_KEY_FILE={path}: no such file (restore the key from backup; a new key cannot verify the old entries)")
        if not create:
            return None
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            # O_EXCL: two processes starting together must not each write a different key.
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            pass
        else:
            with os.fdopen(fd, "w") as f:
                f.write(secrets.token_hex(auditlog.KEY_BYTES) + "\n")
    mode = path.stat().st_mode
    if mode & 0o077:
        raise AuditError(f"audit key file {path} can be read or written by others (mode {mode & 0o777:04o}): chmod 600 {path}")
    text = path.read_text(encoding="ascii", errors="replace").strip()
    try:
        key = bytes.fromhex(text)
    except ValueError:
        raise AuditError(f"audit key file {path}: expected hex text (e.g. from `openssl rand -hex 32`)") from None
    if len(key) < auditlog.KEY_BYTES:
        raise AuditError(f"audit key file {path}: {len(key)} bytes of key; at least {auditlog.KEY_BYTES} are needed")
    return key


class _Checkpoints:
    """The checkpoint file, opened for appending (0600) and locked (``flock``) for the caller's whole
    append: every process on this host that writes the log takes the same lock, so entries and their
    checkpoints go in the same order."""

    def __init__(self, path: Path):
        self.path = path

    def __enter__(self) -> _Checkpoints:
        _APPEND_LOCK.acquire()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o600)
            fcntl.flock(self.fd, fcntl.LOCK_EX)
        except BaseException:
            _APPEND_LOCK.release()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            os.close(self.fd)  # closing releases the flock
        finally:
            _APPEND_LOCK.release()

    def latest(self, log_id: str) -> auditlog.Checkpoint | None:
        """The newest checkpoint of log ``log_id`` (lines of other logs are skipped); the tail is read first."""
        size = os.fstat(self.fd).st_size
        for start in (max(0, size - 65536), 0):
            data = os.pread(self.fd, size - start, start)
            lines = data.split(b"\n")[1:] if start else data.split(b"\n")
            for raw in reversed(lines):
                if not raw.strip():
                    continue
                try:
                    cp = auditlog.parse_checkpoint(raw.decode("utf-8"))
                except (ValueError, UnicodeDecodeError):
                    continue  # verify names the bad line; an append needs only the newest good one
                if cp.log == log_id:
                    return cp
            if start == 0:
                break
        return None

    def write(self, cp: auditlog.Checkpoint) -> None:
        os.write(self.fd, (cp.line() + "\n").encode())
        os.fsync(self.fd)


def log(store: Store, *, actor: str, action: str, subject: str, payload: dict[str, Any], now: dt.datetime | None = None) -> auditlog.AuditEntry:
    """Append one keyed entry and its signed checkpoint (see the notes above ``bind``)."""
    return _log(store, actor=actor, action=action, subject=subject, payload=payload, now=now)[0]


def _log(store: Store, *, actor: str, action: str, subject: str, payload: dict[str, Any],
         now: dt.datetime | None = None) -> tuple[auditlog.AuditEntry, auditlog.Checkpoint]:
    settings = _settings_of(store)
    key, signer = _append_keys(settings)
    with _Checkpoints(checkpoint_path(settings)) as cps:
        log_id, keyed_from, _ = _keyed(store, cps, key, signer, actor, now)
        entry = _insert(store, key, actor=actor, action=action, subject=subject, payload=payload, now=now)
        cp = auditlog.checkpoint(entry, log=log_id or entry.hash, keyed_from=keyed_from, key=key, signing_key=signer, ts=dt.datetime.now(dt.UTC))
        cps.write(cp)
    return entry, cp


def _append_keys(settings: Settings) -> tuple[bytes, Any]:
    """The audit key (created on first use) and the checkpoint signing key."""
    key = audit_key(settings, create=True)
    if key is None:  # create=True makes one or raises
        raise AuditError(f"no audit key at {audit_key_path(settings)}")
    return key, signing_key(settings)


def _keyed(store: Store, cps: _Checkpoints, key: bytes, signer: Any, actor: str,
           now: dt.datetime | None) -> tuple[str | None, int, auditlog.AuditEntry | None]:
    """(log id, where keying began, the ``auditlog_keyed`` entry if this call wrote it). A log without a
    checkpoint of its own but with entries was written before keying: its keyed part starts here, with an
    entry that says so (logged as ``actor``, whose write started it), checkpointed like any other."""
    first, last = _edge_entries(store)
    log_id = first.hash if first is not None and first.seq == 0 else None
    latest = cps.latest(log_id) if log_id else None
    if latest is not None:
        return log_id, latest.keyed_from, None
    if last is None:
        return None, 0, None
    marker = _insert(store, key, actor=actor, action=auditlog.KEYED_ACTION, subject="auditlog",
                     payload={"unkeyed_entries": last.seq + 1, "unkeyed_head": last.hash}, now=now)
    log_id = log_id or marker.hash
    cps.write(auditlog.checkpoint(marker, log=log_id, keyed_from=marker.seq, key=key, signing_key=signer, ts=dt.datetime.now(dt.UTC)))
    return log_id, marker.seq, marker


def _insert(store: Store, key: bytes, *, actor: str, action: str, subject: str, payload: dict[str, Any],
            now: dt.datetime | None) -> auditlog.AuditEntry:
    """Append one entry. The checkpoint lock orders writers on this host; a writer elsewhere that took the
    same ``seq`` (natural key) first leaves this row unwritten, and this one retries on the new head."""
    for _ in range(20):
        last = _edge_entries(store)[1]
        entry = auditlog.append(last, key=key, ts=now or dt.datetime.now(dt.UTC), actor=actor, action=action, subject=subject, payload=payload)
        written = _write(store, {"audit_log": auditlog.entries_frame([entry])}, "auditlog")
        if written.get("audit_log") == 1:
            return entry
    raise AuditError("could not append to the audit log: 20 concurrent writers in a row took its head")


def _edge_entries(store: Store) -> tuple[auditlog.AuditEntry | None, auditlog.AuditEntry | None]:
    """The log's lowest and highest entries (None, None when it is empty)."""
    rows = store.query("SELECT * FROM audit_log WHERE seq = (SELECT MIN(seq) FROM audit_log) OR seq = (SELECT MAX(seq) FROM audit_log)",
                       schema_=AF.AUDIT_LOG.schema)
    if rows.height == 0:
        return None, None
    found = auditlog.entries_from_frame(rows)
    return found[0], found[-1]


def anchor(store: Store, *, actor: str) -> dict[str, Any]:
    """Key and checkpoint a log written before keying now (the ``auditlog_keyed`` entry, logged as
    ``actor``) rather than at the next governance write; an empty or already anchored log is left as it is."""
    settings = _settings_of(store)
    key, signer = _append_keys(settings)
    with _Checkpoints(checkpoint_path(settings)) as cps:
        _, keyed_from, marker = _keyed(store, cps, key, signer, actor, None)
    if marker is None:
        return {"anchored": False, "keyed_from": keyed_from, "why": "the log is empty or already anchored by signed checkpoints"}
    return {"anchored": True, "keyed_from": keyed_from, "seq": marker.seq, "head": marker.hash}


def verify_log(store: Store) -> dict[str, Any]:
    """Check the log under the audit key and against the signed checkpoints (``auditlog.verify``): the
    first problem is named by seq and why. Reads only: no key or file is created."""
    settings = _settings_of(store)
    path = checkpoint_path(settings)
    lines: list[str] = []
    fd = None
    try:
        if path.exists():
            # Shared lock: an append in progress finishes (entry and checkpoint) before the log is read.
            fd = os.open(path, os.O_RDONLY)
            fcntl.flock(fd, fcntl.LOCK_SH)
        entries = auditlog.entries_from_frame(store.read("audit_log"))
        if fd is not None:
            lines = _read_lines(fd)
    finally:
        if fd is not None:
            os.close(fd)
    try:
        key = audit_key(settings, create=False)
    except AuditError as exc:  # a key file that is named but gone, open to others, or not a key: the answer, not a crash
        return {"ok": False, "entries": len(entries), "head": entries[-1].hash if entries else auditlog.GENESIS,
                "head_seq": entries[-1].seq if entries else None, "keyed_from": None, "checkpoints": 0, "latest_checkpoint": None,
                "first_break": auditlog.Break(None, str(exc)).to_dict()}
    verdict = auditlog.verify(entries, key=key, checkpoint_lines=lines, public_key=_signing_public_key(settings))
    latest = verdict.latest
    return {"ok": verdict.ok, "entries": verdict.entries, "head": verdict.head, "head_seq": verdict.head_seq, "keyed_from": verdict.keyed_from,
            "checkpoints": verdict.checkpoints,
            "latest_checkpoint": None if latest is None else {"seq": latest.seq, "head": latest.head, "ts": auditlog.ts_text(latest.ts)},
            "first_break": None if verdict.problem is None else verdict.problem.to_dict()}


def _read_lines(fd: int) -> list[str]:
    data = b""
    while chunk := os.read(fd, 1 << 20):
        data += chunk
    text = data.decode("utf-8", errors="replace")
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()  # the newline that ends the last line
    return lines


def _signing_public_key(settings: Settings) -> Any:
    """The signing key's public half, or None when there is no usable key (verify then says so)."""
    path = _key_path(settings)
    try:
        return exports.load_private_key(path.read_bytes()).public_key()
    except (OSError, ValueError, TypeError):
        return None


# --- declarations ----------------------------------------------------------------------------------


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
    return E.evidence_from_frames(
        model, declaration=store.read("aiact_declaration"), fairness_evaluation=store.read("fairness_evaluation"),
        fairness_group=store.read("fairness_group"), taints=taints.get(model.node_id, []), training_runs_seen=runs_seen,
        retention_days=settings.retention_days, oldest_log_record_at=oldest, compute=compute, robustness=robust, as_of=now,
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
    failed = rule_findings(frames["aiact_rule_result"], audit_id, started)
    if failed.height:
        store.write(F.Batch(source=f"audit:{audit_id}", finding=failed))
    counts = json.loads(frames["aiact_audit_run"]["counts"][0])
    log(store, actor=requested_by or trigger, action="audit_run", subject=scope, payload={"audit_id": audit_id, "counts": counts,
        "reports": {r["format"]: r["sha256"] for r in rows}})
    return {"audit_id": audit_id, "scope": scope, "counts": counts, "models": len(audits), "reports": [r["location"] for r in rows]}


def rule_findings(results: pl.DataFrame, audit_id: str, at: dt.datetime) -> pl.DataFrame:
    """One ``audit_rule`` finding per failed rule of a model (what the ``AuditRuleFailed`` alert pages on),
    dated at the audit: a failure found again by the next audit is a new finding, and one that was fixed is
    simply not found again. A rule whose evidence is missing is not a failure and raises nothing here: the
    report lists what would settle it."""
    rows = []
    for r in results.filter(pl.col("status") == "fail").iter_rows(named=True):
        rows.append({"analyzer": "aiact", "kind": "audit_rule", "subject": f"model:{r['model_name']}:{r['model_version']}/rule:{r['rule_id']}",
                     "window_start": at, "window_end": at, "severity": "critical" if r["rule_id"] in _CRITICAL_RULES else "warning",
                     "score": None, "summary": f"{r['model_name']}:{r['model_version']} fails {r['citation']} ({r['title']}): {r['reason']}",
                     "evidence": json.dumps({"audit_id": audit_id, "rule_id": r["rule_id"], "rule_set": r["rule_set"], "citation": r["citation"],
                                             "due_at": r["due_at"].isoformat() if r["due_at"] else None}, sort_keys=True)})
    return F.findings_frame(rows)


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
        raise AuditError("no audit has run yet: run one first (fleetscope report, or POST /api/v1/audits)")
    return runs[0]["audit_id"]


# --- signing keys and exports ------------------------------------------------------------------------


def signing_key(settings: Settings) -> Any:
    """The Ed25519 key that signs export bundles: ``FLEETSCOPE_SIGNING_KEY`` (a PEM file) or, embedded, a key
    generated once into ``$FLEETSCOPE_DATA_DIR/signing_key.pem`` (0600) with its public half beside it."""
    path = _key_path(settings)
    if not path.exists():
        if settings.signing_key:
            raise AuditError(f"FLEETSCOPE_SIGNING_KEY={path}: no such file")
        private, public = exports.generate_keypair()
        safefiles.write_private(path, private, exclusive=True)
        safefiles.write_private(path.with_name("signing_key.pub.pem"), public)
    return exports.load_private_key(path.read_bytes())


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
    from fleetscope.services.energy import model_footprint

    rows = []
    for m in store.read("model")["model_name"].unique().sort().to_list():
        try:
            fp = model_footprint(store, m)
            rows.append({"model_name": m, **{k: (", ".join(v) if isinstance(v, list) else v) for k, v in fp.items()}, "note": None})
        except ValueError as exc:
            rows.append({"model_name": m, "note": str(exc)})
    return pl.DataFrame(rows, infer_schema_length=None) if rows else pl.DataFrame({"model_name": [], "note": []}, schema={"model_name": pl.String, "note": pl.String})


def _key_path(settings: Settings) -> Path:
    return Path(settings.signing_key) if settings.signing_key else settings.data_dir / "signing_key.pem"


def _public_key_path(settings: Settings) -> Path:
    return _key_path(settings).with_name("signing_key.pub.pem")

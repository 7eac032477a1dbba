"""``fleetscope audit`` (EU AI Act declarations, audit reports, signed exports, anchoring the audit log) and
``fleetscope verify``, the one check of what an auditor is handed."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from fleetscope import safefiles
from fleetscope.cli.common import _emit, _os_user, _settings, _store
from governance import exports
from governance.aiact.model import DeclarationError


@click.group()
def audit() -> None:
    """EU AI Act audits: declare facts, file reports, make signed exports, anchor the audit log.

    \b
    Examples:
      fleetscope audit declare cv-screener oversight --version 1 --value '{"measures": "human review"}' --by "A. Auditor"
      fleetscope audit report --model cv-screener
      fleetscope audit export --out bundle.zip && fleetscope verify bundle.zip --key signing_key.pub.pem
    """


@audit.command("declare")
@click.argument("model")
@click.argument("kind")
@click.option("--version", default="*", show_default=True, help='Model version, "*" for all.')
@click.option("--value", "value_json", default="{}", help="The declared fact as a JSON object.")
@click.option("--key", default="", help="Tells records of one kind apart (Annex IV point, incident id).")
@click.option("--by", "entered_by", required=True, help="Who is declaring this (kept with the record).")
@click.option("--retract", is_flag=True, help="Withdraw an earlier declaration of this kind and key.")
def declare(model: str, kind: str, version: str, value_json: str, key: str, entered_by: str, retract: bool) -> None:
    """Declare a fact about MODEL for the AI Act rules: KIND is purpose, area, oversight, documentation,
    incident, risk_management, notification, ... ("*" as MODEL for organisation-wide facts).

    \b
    Examples:
      fleetscope audit declare cv-screener oversight --version 1 --value '{"measures": "human review"}' --by "A. Auditor"
      fleetscope audit declare '*' risk_management --value '{"system": "ISO 31000"}' --by "A. Auditor"
      fleetscope audit declare cv-screener incident --key INC-7 --retract --by "A. Auditor"
    """
    from fleetscope.services import audit as au  # lazy: the rules, reports and their renderers

    try:
        value = json.loads(value_json)
    except json.JSONDecodeError as exc:
        raise click.BadParameter(f"not JSON: {exc}", param_hint="--value") from None
    try:
        d = au.declare(_store(), model, version, kind, value, entered_by=entered_by, key=key, retracted=retract, source="cli")
    except DeclarationError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"declared {kind} for {model}@{version} ({d.declaration_id[:12]})")


@audit.command("report")
@click.option("--model", default=None, help="Audit one model (default: the whole registry).")
@click.option("--version", default=None)
@click.option("--json", "as_json", is_flag=True)
def report(model: str | None, version: str | None, as_json: bool) -> None:
    """Evaluate the EU AI Act rules and file the audit report (JSON, HTML, PDF) under the data directory.
    Exits 0 when no rule failed, 6 when one did.

    \b
    Examples:
      fleetscope audit report
      fleetscope audit report --model cv-screener --version 2 --json
    """
    from fleetscope.services import audit as au  # lazy: the rules, reports and their renderers
    from fleetscope.services import governance as gs  # lazy: keeps --help light

    s = _settings()
    try:
        out = au.run_audit(_store(), s, model=model, version=version, trigger="cli", requested_by=_os_user())
    except (au.AuditError, gs.NotFound) as exc:
        raise click.ClickException(str(exc)) from None
    if as_json:
        click.echo(json.dumps(out))
    else:
        click.echo(f"audit {out['audit_id']} of {out['scope']} ({out['models']} model(s)): " + ", ".join(f"{k} {v}" for k, v in sorted(out["counts"].items())))
        for path in out["reports"]:
            click.echo(f"  {s.data_dir / path}")
    sys.exit(6 if out["counts"].get("fail") else 0)


@audit.command("export")
@click.option("--audit", "audit_id", default=None, help="Audit to export (default: the latest).")
@click.option("--out", "out_path", type=click.Path(dir_okay=False), default=None, help="Also copy the bundle here.")
@click.option("--json", "as_json", is_flag=True)
def export(audit_id: str | None, out_path: str | None, as_json: bool) -> None:
    """Make a signed compliance export bundle (zip: reports, evidence, SHA-256 manifest, Ed25519 signature).

    \b
    Examples:
      fleetscope audit export --out export-2026-12-03.zip
      fleetscope audit export --audit 3f9c2a... --json
    """
    from fleetscope.services import audit as au  # lazy: the rules, reports and their renderers

    try:
        out = au.make_export(_store(), _settings(), audit_id=audit_id, requested_by=_os_user())
    except au.AuditError as exc:
        raise click.ClickException(str(exc)) from None
    if out_path:
        safefiles.write_private(out_path, Path(out["path"]).read_bytes())
        out["path"] = out_path
    _emit(as_json, out, f"bundle {out['path']}\n  signed by key {out['key_fingerprint']} (public key: {out['public_key']})")


@click.command()
@click.argument("bundle", required=False, type=click.Path(exists=True, dir_okay=False))
@click.option("--key", "key_path", type=click.Path(exists=True, dir_okay=False), help="The bundle signer's public key (PEM).")
@click.option("--auditlog", "audit_log", is_flag=True, help="Check this service's audit log instead of a bundle.")
@click.option("--json", "as_json", is_flag=True)
def verify(bundle: str | None, key_path: str | None, audit_log: bool, as_json: bool) -> None:
    """Check what an auditor is handed: an export BUNDLE offline (its signature, and every file against the
    manifest; exit 0 intact, 7 when anything was altered, added or removed or the signature fails), or with
    --auditlog this service's keyed audit log against its signed checkpoints (exit 0 when it holds, 8
    naming the first bad entry).

    \b
    Examples:
      fleetscope verify export-2026-12-03.zip --key signing_key.pub.pem
      fleetscope verify --auditlog --json
    """
    if audit_log == (bundle is not None):
        raise click.UsageError("give a BUNDLE (with --key) or --auditlog, not both or neither")
    if audit_log:
        _verify_audit_log(as_json)
    if key_path is None:
        raise click.UsageError("a BUNDLE is checked against its signer's public key: add --key FILE")
    try:
        key = exports.load_public_key(Path(key_path).read_bytes())
    except Exception as exc:  # noqa: BLE001 - a bad key file is the user's input error
        raise click.ClickException(f"{key_path}: not an Ed25519 public key in PEM form ({exc})") from None
    result = exports.verify(Path(bundle).read_bytes(), key)  # type: ignore[arg-type]
    if as_json:
        click.echo(json.dumps({"ok": result.ok, "signature_valid": result.signature_valid, "altered": list(result.altered),
                               "added": list(result.added), "removed": list(result.removed), "errors": list(result.errors)}))
    else:
        click.echo(result.summary())
    sys.exit(0 if result.ok else 7)


def _verify_audit_log(as_json: bool) -> None:
    from fleetscope.services import audit as au  # lazy: the rules, reports and their renderers

    try:
        out = au.verify_log(_store())
    except au.AuditError as exc:
        raise click.ClickException(str(exc)) from None
    if as_json:
        click.echo(json.dumps(out))
    elif out["ok"]:
        click.echo(f"audit log intact: {out['entries']} entries, head {out['head'][:16]} (seq {out['head_seq']}), "
                   f"{out['checkpoints']} signed checkpoints" + (f", keyed from seq {out['keyed_from']}" if out["keyed_from"] else ""))
    else:
        brk = out["first_break"]
        click.echo(f"audit log BROKEN at seq {brk['seq']}: {brk['why']}" if brk["seq"] is not None else f"audit log BROKEN: {brk['why']}")
    sys.exit(0 if out["ok"] else 8)


@audit.command("anchor")
def audit_anchor() -> None:
    """Key and checkpoint an audit log written before keying now (otherwise the next governance write does).
    The audit log is the keyed, checkpointed log of governance writes; `fleetscope verify --auditlog` checks it.

    \b
    Example:
      fleetscope audit anchor && fleetscope verify --auditlog
    """
    from fleetscope.services import audit as au  # lazy: the rules, reports and their renderers

    try:
        out = au.anchor(_store(), actor=_os_user())
    except au.AuditError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"anchored: keyed from seq {out['keyed_from']}, head {out['head'][:16]}" if out["anchored"] else f"nothing to do: {out['why']}")

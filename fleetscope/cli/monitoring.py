"""``fleetscope monitoring``: post-market monitoring of deployed models (AI Act Art. 72) — evaluate a version's
windows against its reference, read windows, drift, fairness over time and findings, the impossibility
view, and declare a serious incident from a finding (Art. 73). Predictions and outcomes come in with
``fleetscope ingest FILE`` (format ``model_monitoring``)."""

from __future__ import annotations

import datetime as dt
import json

import click

from fleetscope.cli.common import _emit, _os_user, _store, _utc_option
from fleetscope.core.errors import FleetscopeError
from governance.aiact import checks
from governance.aiact.model import DeclarationError, iso, parse_time
from governance.fairness import FairnessInputError


def _fmt(v: float | None, spec: str = ".3f") -> str:
    return "-" if v is None else format(v, spec)


@click.group()
def monitoring() -> None:
    """Post-market monitoring of deployed models: drift, accuracy and fairness per window.

    \b
    Examples:
      fleetscope ingest predictions.jsonl
      fleetscope monitoring evaluate credit 1
      fleetscope monitoring windows credit 1
      fleetscope monitoring impossibility credit 1 --attribute sex
      fleetscope monitoring incident model_drift model:credit:1 2026-11-03T06:00:00Z --kind widespread_infringement --by compliance
    """


@monitoring.command("models")
@click.option("--json", "as_json", is_flag=True)
def models(as_json: bool) -> None:
    """Model versions with stored predictions.

    \b
    Examples:
      fleetscope monitoring models
      fleetscope monitoring models --json
    """
    from fleetscope.services import monitoring as ms  # lazy: keeps --help light

    df = ms.monitored(_store())
    lines = [f"{r['model_name']}@{r['model_version']}: {r['predictions']} predictions, {r['outcomes']} outcomes, "
             f"{r['first_ts']:%Y-%m-%d %H:%M} to {r['last_ts']:%Y-%m-%d %H:%M}" for r in df.iter_rows(named=True)]
    _emit(as_json, df.to_dicts(), "\n".join(lines) or "no predictions stored: push them with fleetscope ingest FILE (format model_monitoring)")


@monitoring.command("evaluate")
@click.argument("model")
@click.argument("version")
@click.option("--window-s", type=click.IntRange(60, 7 * 86400), default=3600, show_default=True, help="Window width in seconds.")
@click.option("--reference-s", type=click.IntRange(60), default=86400, show_default=True,
              help="Reference: the first this many seconds of the version's predictions.")
@click.option("--reference-start", default=None, help="RFC 3339: name the reference window instead (with --reference-end).")
@click.option("--reference-end", default=None)
@click.option("--start", "start_text", default=None, help="RFC 3339: first window to evaluate (default: after the reference).")
@click.option("--end", "end_text", default=None, help="RFC 3339, exclusive (default: now).")
@click.option("--json", "as_json", is_flag=True)
def evaluate(model: str, version: str, window_s: int, reference_s: int, reference_start: str | None, reference_end: str | None,
             start_text: str | None, end_text: str | None, as_json: bool) -> None:
    """Evaluate MODEL VERSION's closed windows against its reference and store windows and findings (beat
    does this hourly). Exits 0 when no window raised a finding, 7 when one did.

    \b
    Examples:
      fleetscope monitoring evaluate credit 1
      fleetscope monitoring evaluate credit 1 --window-s 86400 --reference-start 2026-10-01T00:00:00Z --reference-end 2026-11-01T00:00:00Z --json
    """
    from fleetscope.services import monitoring as ms  # lazy: keeps --help light

    r0, r1 = _utc_option(reference_start, "--reference-start"), _utc_option(reference_end, "--reference-end")
    if (r0 is None) != (r1 is None):
        raise click.UsageError("give both --reference-start and --reference-end, or neither")
    try:
        out = ms.evaluate(_store(), model, version, window_s=window_s, reference_s=reference_s, reference=(r0, r1) if r0 and r1 else None,
                          start=_utc_option(start_text, "--start"), end=_utc_option(end_text, "--end"))
    except FleetscopeError as exc:
        raise click.ClickException(str(exc)) from None
    ref = out["reference"]
    text = [f"{model}@{version}: {out['evaluated']} window(s) of {window_s} s against the reference {ref['start']} to {ref['end']} "
            f"({ref['n']} predictions, accuracy {_fmt(ref['accuracy'])})"]
    text += [f"  {w['window_start']}  {w['n_predictions']:>6} predictions  {w['status']}" for w in out["windows"]]
    text.append("findings: " + (", ".join(f"{k} {n}" for k, n in sorted(out["findings"].items())) or "none"))
    _emit(as_json, out, "\n".join(text))
    raise SystemExit(7 if out["findings"] else 0)


@monitoring.command("windows")
@click.argument("model")
@click.argument("version")
@click.option("--start", "start_text", default=None)
@click.option("--end", "end_text", default=None)
@click.option("--json", "as_json", is_flag=True)
def windows(model: str, version: str, start_text: str | None, end_text: str | None, as_json: bool) -> None:
    """Evaluated windows: accuracy, largest feature PSI and KS, prediction PSI, fairness gap, status.

    \b
    Examples:
      fleetscope monitoring windows credit 1
      fleetscope monitoring windows credit 1 --start 2026-11-01T00:00:00Z --json
    """
    from fleetscope.services import monitoring as ms  # lazy: keeps --help light

    df = ms.windows(_store(), model, version, start=_utc_option(start_text, "--start"), end=_utc_option(end_text, "--end"))
    lines = [f"{'window start':<25} {'n':>6} {'outcomes':>8} {'accuracy':>8} {'psi max':>8} {'ks max':>7} {'pred psi':>8} {'fair gap':>8}  status"]
    lines += [f"{r['window_start']:%Y-%m-%dT%H:%M:%SZ}     {r['n_predictions']:>6} {r['n_outcomes']:>8} {_fmt(r['accuracy']):>8} "
              f"{_fmt(r['feature_psi_max']):>8} {_fmt(r['feature_ks_max']):>7} {_fmt(r['prediction_psi']):>8} {_fmt(r['fairness_gap']):>8}  {r['status']}"
              for r in df.iter_rows(named=True)]
    _emit(as_json, df.to_dicts(), "\n".join(lines) if df.height else f"no evaluated window of {model}@{version}: run fleetscope monitoring evaluate {model} {version}")


@monitoring.command("findings")
@click.argument("model")
@click.argument("version")
@click.option("--all", "include_cleared", is_flag=True, help="Include findings cleared on re-evaluation.")
@click.option("--json", "as_json", is_flag=True)
def findings(model: str, version: str, include_cleared: bool, as_json: bool) -> None:
    """Monitoring findings of MODEL VERSION, newest first.

    \b
    Examples:
      fleetscope monitoring findings credit 1
      fleetscope monitoring findings credit 1 --all --json
    """
    from fleetscope.services import monitoring as ms  # lazy: keeps --help light

    df = ms.findings(_store(), model, version, include_cleared=include_cleared)
    lines = [f"{r['window_start']:%Y-%m-%dT%H:%M:%SZ}  {r['severity']:<8} {r['kind']:<24} {r['subject']}  {r['summary']}" for r in df.iter_rows(named=True)]
    _emit(as_json, df.to_dicts(), "\n".join(lines) or "no monitoring findings")


@monitoring.command("impossibility")
@click.argument("model")
@click.argument("version")
@click.option("--attribute", required=True, help="The group attribute (sensitive feature) to judge by.")
@click.option("--tolerance", type=click.FloatRange(0, 1, min_open=True, max_open=True), default=0.05, show_default=True)
@click.option("--json", "as_json", is_flag=True)
def impossibility(model: str, version: str, attribute: str, tolerance: float, as_json: bool) -> None:
    """Which of calibration, equalized odds and demographic parity hold on the stored predictions with
    outcomes, and the base rates per group that force the trade-off.

    \b
    Examples:
      fleetscope monitoring impossibility credit 1 --attribute sex
      fleetscope monitoring impossibility credit 1 --attribute age_band --tolerance 0.02 --json
    """
    from fleetscope.services import monitoring as ms  # lazy: keeps --help light

    try:
        out = ms.impossibility(_store(), model, version, attribute, tolerance=tolerance)
    except (FleetscopeError, FairnessInputError) as exc:
        raise click.ClickException(str(exc)) from None
    lines = [f"{model}@{version} by {attribute}: base rates " + ", ".join(f"{g} {v:.3f}" for g, v in sorted(out["base_rates"].items()))]
    for name, c in out["criteria"].items():
        lines.append(f"  {name:<20} {'holds' if c['holds'] else 'fails' if c['holds'] is False else 'unknown':<8} {_fmt(c['value'])}  ({c['measure']})")
    lines.append(out["explanation"])
    _emit(as_json, out, "\n".join(lines))


@monitoring.command("incident")
@click.argument("finding_kind")
@click.argument("subject")
@click.argument("window_start")
@click.option("--kind", "incident_kind", required=True,
              type=click.Choice(["death", "serious_harm_health", "critical_infrastructure", "widespread_infringement", "fundamental_rights",
                                 "property_environment"]), help="Serious incident kind (Art. 3(49)).")
@click.option("--by", "entered_by", default=None, help="Who declares it (default: the OS user).")
@click.option("--description", default=None)
@click.option("--aware-at", default=None, help="RFC 3339: when the provider became aware (default: now).")
@click.option("--json", "as_json", is_flag=True)
def incident(finding_kind: str, subject: str, window_start: str, incident_kind: str, entered_by: str | None, description: str | None,
             aware_at: str | None, as_json: bool) -> None:
    """Declare a serious incident from the monitoring finding FINDING_KIND SUBJECT WINDOW_START: starts the
    Art. 73 clock (15 days; 2 for a widespread infringement or critical infrastructure; 10 for a death).

    \b
    Example:
      fleetscope monitoring incident model_drift model:credit:1 2026-11-03T06:00:00Z --kind widespread_infringement --by compliance
    """
    from fleetscope.services import audit as au  # lazy: the rules, reports and their renderers

    ws = _utc_option(window_start, "WINDOW_START")
    assert ws is not None
    try:
        d = au.declare_incident(_store(), finding_kind, subject, ws, incident_kind=incident_kind, entered_by=entered_by or _os_user(),
                                description=description, aware_at=_utc_option(aware_at, "--aware-at"))
    except (FleetscopeError, DeclarationError) as exc:
        raise click.ClickException(str(exc)) from None
    days = checks.incident_deadline(incident_kind)
    due = parse_time(d.value["aware_at"]) + dt.timedelta(days=days)  # type: ignore[operator]
    out = {"declaration_id": d.declaration_id, "key": d.key, "value": dict(d.value), "deadline_days": days,
           "paragraph": checks.incident_paragraph(incident_kind), "report_due_at": iso(due)}
    _emit(as_json, json.loads(json.dumps(out, default=str)),
          f"incident {d.key} declared for {d.model_name}@{d.model_version}: report to the market surveillance authority by {iso(due)} "
          f"({days} days, {checks.incident_paragraph(incident_kind)})")

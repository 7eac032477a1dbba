"""``fleetscope alerts``: pending and firing alerts, and silences."""

from __future__ import annotations

import datetime as dt

import click

from fleetscope.cli.common import _emit, _engine, _os_user, _settings, _span_s, _store


@click.group()
def alerts() -> None:
    """Alerts and silences.

    \b
    Examples:
      fleetscope alerts list
      fleetscope alerts silence alertname=Straggler --for 2h --by oncall --comment "known slow node"
      fleetscope alerts silences --json
    """


@alerts.command("list")
@click.option("--json", "as_json", is_flag=True)
def alerts_list(as_json: bool) -> None:
    """Pending and firing alerts, with what mutes each.

    \b
    Examples:
      fleetscope alerts list
      fleetscope alerts list --json | jq '.[] | select(.state == "firing")'
    """
    from fleetscope.services.alerting import state as ST  # lazy: loads the rule engine

    rows = ST.list_alerts(_engine(_settings()))
    lines = [f"{a.get('state', '?'):<8} {a.get('labels', {}).get('alertname', '?'):<28} {a.get('labels', {}).get('subject') or a.get('labels', {}).get('gpu_uuid') or ''}" for a in rows]
    _emit(as_json, rows, "\n".join(lines) or "no alerts")


@alerts.command("silence")
@click.argument("matchers", nargs=-1, required=True)
@click.option("--for", "duration", default="2h", show_default=True, help="How long: 30m, 2h, 1d.")
@click.option("--by", "created_by", required=True, help="Who silences (kept with the silence).")
@click.option("--comment", required=True, help="Why.")
def alerts_silence(matchers: tuple[str, ...], duration: str, created_by: str, comment: str) -> None:
    """Silence alerts matching MATCHERS (Alertmanager syntax: alertname=Straggler host=~"site-a-.*").
    Audit-logged as the OS user, with the --by name in the entry.

    \b
    Examples:
      fleetscope alerts silence alertname=Straggler --for 2h --by oncall --comment "known slow node"
      fleetscope alerts silence alertname=GpuXidError 'host=~"site-a-.*"' --for 1d --by oncall --comment "maintenance"
    """
    from fleetscope.services.alerting import service as AS  # lazy: loads the rule engine

    ends = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=_span_s(duration, "--for"))
    try:
        sil = AS.create_silence(_store(), list(matchers), None, ends, created_by=created_by, comment=comment, actor=_os_user())
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"silence {sil.id} until {ends:%Y-%m-%d %H:%M} UTC")


@alerts.command("expire")
@click.argument("silence_id")
def alerts_expire(silence_id: str) -> None:
    """End a silence now (audit-logged with the OS user's name).

    \b
    Example:
      fleetscope alerts expire 7f3e9c1a-...
    """
    from fleetscope.services.alerting import service as AS  # lazy: loads the rule engine

    if not AS.expire_silence(_store(), silence_id, actor=_os_user()):
        raise click.ClickException(f"no active silence {silence_id!r}")
    click.echo(f"expired {silence_id}")


@alerts.command("silences")
@click.option("--json", "as_json", is_flag=True)
def alerts_silences(as_json: bool) -> None:
    """Silences, active and expired.

    \b
    Examples:
      fleetscope alerts silences
      fleetscope alerts silences --json
    """
    from fleetscope.services.alerting import state as ST  # lazy: loads the rule engine

    rows = [ST.silence_dict(x) for x in ST.list_silences(_engine(_settings()))]
    lines = [f"{r['id']}  {r['status']['state']:<8} until {r['endsAt']}  {' '.join(m['name'] + ('=' if m['isEqual'] else '!=') + ('~' if m['isRegex'] else '') + m['value'] for m in r['matchers'])}  ({r['createdBy']}: {r['comment']})" for r in rows]
    _emit(as_json, rows, "\n".join(lines) or "no silences")

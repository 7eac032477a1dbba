"""``fleetscope teams``: who uses the GPUs, how well, and what it costs — team rules (Slurm accounts,
organizations, users, Kubernetes namespaces and labels), per team GPU-hours allocated and used, energy and
cost, the top jobs by cost, queue waits and end states, idle allocations. The scheduler's records come in with
``fleetscope ingest`` (sacct, squeue, slurmrestd, kube-state-metrics files)."""

from __future__ import annotations

import datetime as dt
import getpass
import math
from typing import Any

import click

from fleetscope.cli.common import _emit, _settings, _store, _utc_option
from fleetscope.core.errors import FleetscopeError

_JSON = click.option("--json", "as_json", is_flag=True, help="Print JSON.")
_MONTH = click.option("--month", default=None, help="A calendar month, YYYY-MM (UTC); overrides --start/--end.")
_START = click.option("--start", "start_text", default=None, help="RFC 3339 (default: 30 days before --end).")
_END = click.option("--end", "end_text", default=None, help="RFC 3339, exclusive (default: now).")


def _window(month: str | None, start_text: str | None, end_text: str | None) -> tuple[dt.datetime, dt.datetime]:
    from fleetscope.services import teams as svc  # lazy: imports the chargeback analyzer

    if month:
        return _call(svc.month_bounds, month)
    end = _utc_option(end_text, "--end") or dt.datetime.now(dt.UTC)
    start = _utc_option(start_text, "--start") or end - dt.timedelta(days=30)
    if end <= start:  # the routes answer 400; an empty answer would hide the mistake
        raise click.BadParameter(f"must be after the start ({start.isoformat()})", param_hint="--end")
    return start, end


def _num(v: Any, spec: str = ",.2f") -> str:
    return "-" if v is None or (isinstance(v, float) and not math.isfinite(v)) else format(v, spec)


def _call(fn, *args, **kwargs):  # type: ignore[no-untyped-def]
    try:
        return fn(*args, **kwargs)
    except (FleetscopeError, ValueError) as exc:
        raise click.ClickException(str(exc)) from None


@click.group()
def teams() -> None:
    """Teams and cost: GPU-hours allocated and used per team, energy, money, queue waits.

    \b
    Examples:
      fleetscope teams map slurm_account ml-research --team nlp
      fleetscope teams map k8s_label team=vision --team vision
      fleetscope teams mappings
      fleetscope teams usage --month 2026-11
      fleetscope teams jobs --month 2026-11 --limit 10 --json
      fleetscope teams queue --start 2026-11-01T00:00:00Z
      fleetscope teams report --month 2026-11
      fleetscope teams budget nlp --gpu-hours 20000 --budget 50000 --currency EUR
      fleetscope teams budgets --month 2026-11
      fleetscope teams stranded
      fleetscope teams idle --month 2026-11
    """


@teams.command("map")
@click.argument("kind", type=click.Choice(["slurm_account", "slurm_organization", "slurm_user", "k8s_namespace", "k8s_label"]))
@click.argument("match")
@click.option("--team", required=True, help="The team it belongs to.")
@click.option("--cluster", default="", help="Only on this cluster (default: every cluster).")
@click.option("--by", "actor", default=None, help="Who sets it (default: $USER); recorded in the audit log.")
@_JSON
def map_(kind: str, match: str, team: str, cluster: str, actor: str | None, as_json: bool) -> None:
    """Map a Slurm account/organization/user, a Kubernetes namespace or a label (key=value) to a team."""

    from fleetscope.services import teams as svc  # lazy: imports the chargeback analyzer

    out = _call(svc.set_mapping, _store(), kind=kind, match=match, team=team, cluster=cluster, recorded_by=actor or getpass.getuser())
    _emit(as_json, out, f"{kind} {match} -> {team} (recorded by {out['recorded_by']} at {out['recorded_at']})")


@teams.command("mappings")
@_JSON
def mappings(as_json: bool) -> None:
    """Every team rule, newest first."""
    from fleetscope.services import teams as svc  # lazy: imports the chargeback analyzer

    rows = svc.mappings(_store()).to_dicts()
    _emit(as_json, rows, "\n".join(f"{r['kind']:<18} {r['match']:<28} {r['team']:<20} {r['recorded_by']} {r['recorded_at']}" for r in rows)
          or "no team rules: fleetscope teams map slurm_account ACCOUNT --team TEAM")


@teams.command("usage")
@_MONTH
@_START
@_END
@_JSON
def usage(month: str | None, start_text: str | None, end_text: str | None, as_json: bool) -> None:
    """Per team: jobs, GPU-hours allocated and used, busy share, energy, CO2e (location- and market-based) and
    cost over the period."""
    from fleetscope.services import team_costs as svc  # lazy: imports the chargeback, carbon and scheduler analyzers

    start, end = _window(month, start_text, end_text)
    rep = _call(svc.usage_report, _store(), start=start, end=end, now=dt.datetime.now(dt.UTC))
    rows, carbon = rep["teams"].to_dicts(), rep["carbon"].to_dicts()
    head = f"{'team':<20} {'jobs':>7} {'GPU-h':>12} {'used GPU-h':>12} {'busy':>6} {'kWh':>10} {'kgCO2e loc':>11} {'kgCO2e mkt':>11} {'cost':>12}"
    lines = [head] + [f"{r['team']:<20} {r['jobs']:>7} {_num(r['gpu_hours']):>12} {_num(r['used_gpu_hours']):>12} {_num(r['busy_share'], '.0%'):>6} "
                      f"{_num(r['energy_kwh']):>10} {_num(r['location_kgco2e']):>11} {_num(r['market_kgco2e']):>11} {_num(r['cost']):>12} "
                      f"{r.get('currency') or ''}" for r in rows]
    lines += [f"CO2e at {c['site_id']}: {_num(c['location_g_per_kwh'], ',.1f')} g/kWh location, {_num(c['market_g_per_kwh'], ',.1f')} g/kWh market "
              f"({c['carbon_basis']})" for c in carbon]
    _emit(as_json, {"start": start, "end": end, "teams": rows, "carbon": carbon},
          "\n".join(lines) if rows else f"no scheduler jobs between {start} and {end}")


@teams.command("jobs")
@_MONTH
@_START
@_END
@click.option("--limit", type=click.IntRange(1, 1000), default=20, show_default=True)
@_JSON
def jobs(month: str | None, start_text: str | None, end_text: str | None, limit: int, as_json: bool) -> None:
    """The jobs that cost the most over the period."""
    from fleetscope.services import team_costs as svc  # lazy: imports the chargeback, carbon and scheduler analyzers

    start, end = _window(month, start_text, end_text)
    rows = _call(svc.top_jobs, _store(), start=start, end=end, limit=limit, now=dt.datetime.now(dt.UTC)).to_dicts()
    _emit(as_json, rows, "\n".join(f"{r['job_id']:<16} {r['team']:<16} {r.get('state') or '-':<10} {_num(r['gpu_hours']):>10} GPU-h "
                                   f"{_num(r['cost']):>10} {r.get('currency') or ''}" for r in rows) or "no jobs")


@teams.command("queue")
@_MONTH
@_START
@_END
@_JSON
def queue(month: str | None, start_text: str | None, end_text: str | None, as_json: bool) -> None:
    """Queue wait per partition (from eligibility), pending reasons and end states."""
    from fleetscope.services import scheduler_capacity as svc  # lazy: imports the scheduler, stranded and idle-allocation analyzers

    start, end = _window(month, start_text, end_text)
    out = _call(svc.queue, _store(), start=start, end=end, now=dt.datetime.now(dt.UTC))
    lines = ["partition            started  pending  median wait s  p90 wait s"]
    lines += [f"{str(r['partition']):<20} {r['started']:>7} {r['pending']:>8} {_num(r['median_wait_s'], ',.0f'):>14} {_num(r['p90_wait_s'], ',.0f'):>11}"
              for r in out["queue_wait"]]
    lines += ["", "end state      jobs   GPU-h"] + [f"{r['state']:<14} {r['jobs']:>4} {_num(r['gpu_hours']):>7}" for r in out["outcomes"]]
    _emit(as_json, out, "\n".join(lines))


@teams.command("report")
@click.option("--month", required=True, help="The calendar month, YYYY-MM (UTC), e.g. 2026-11.")
@click.option("--out", "out_dir", default=None, help="Directory for showback-MONTH.csv and .pdf (default: the data directory's reports/).")
@_JSON
def report(month: str, out_dir: str | None, as_json: bool) -> None:
    """The month's showback report per team, as CSV and PDF (beat writes last month's on the 1st).

    \b
    Example:
      fleetscope teams report --month 2026-11 --out ./reports
    """
    from fleetscope.services import team_costs as svc  # lazy: imports the chargeback, carbon and scheduler analyzers

    target = out_dir or str(_settings().data_dir / "reports")
    out = _call(svc.write_showback, _store(), month, target)
    rows = out["report"]["teams"]
    text = "\n".join([f"{k:<5} {v}" for k, v in out["files"].items()] +
                     [f"{r['team']:<20} {_num(r['gpu_hours']):>12} GPU-h {_num(r['cost']):>12} {r.get('currency') or ''}" for r in rows])
    _emit(as_json, out, text)


@teams.command("budget")
@click.argument("team")
@click.option("--month", default="", help="YYYY-MM it holds for (default: every month without its own budget).")
@click.option("--gpu-hours", "gpu_hour_quota", type=float, default=None, help="GPU-hours allocated the team may use in the month.")
@click.option("--budget", type=float, default=None, help="Money the team may spend in the month.")
@click.option("--currency", default=None, help="ISO 4217 code of --budget, e.g. EUR.")
@click.option("--by", "actor", default=None, help="Who sets it (default: $USER); recorded in the audit log.")
@_JSON
def budget(team: str, month: str, gpu_hour_quota: float | None, budget: float | None, currency: str | None, actor: str | None, as_json: bool) -> None:
    """Set a team's monthly GPU-hour quota and/or money budget (the health sweep finds teams over, or on course
    to exceed, it; the shipped rule TeamOverBudget alerts)."""

    from fleetscope.services import teams as svc  # lazy: imports the chargeback analyzer

    out = _call(svc.set_budget, _store(), team=team, month=month, gpu_hour_quota=gpu_hour_quota, budget=budget, currency=currency,
                recorded_by=actor or getpass.getuser())
    limits = ", ".join(x for x in (f"{_num(out['gpu_hour_quota'])} GPU-h" if out["gpu_hour_quota"] is not None else "",
                                   f"{_num(out['budget'])} {out['currency']}" if out["budget"] is not None else "") if x)
    _emit(as_json, out, f"{team} {out['month'] or 'every month'}: {limits} (recorded by {out['recorded_by']} at {out['recorded_at']})")


@teams.command("budgets")
@click.option("--month", default=None, help="YYYY-MM (default: this month).")
@_JSON
def budgets(month: str | None, as_json: bool) -> None:
    """Per team with a budget: the month's usage so far against it, and the projection to the month's end."""
    from fleetscope.services import team_costs as svc  # lazy: imports the chargeback, carbon and scheduler analyzers

    rows = _call(svc.budget_status, _store(), month=month, now=dt.datetime.now(dt.UTC)).to_dicts()
    lines = [f"{'team':<20} {'GPU-h':>10} {'quota':>10} {'projected':>10} {'status':<15} {'cost':>12} {'budget':>12} {'projected':>12} status"]
    lines += [f"{r['team']:<20} {_num(r['gpu_hours']):>10} {_num(r['gpu_hour_quota']):>10} {_num(r['projected_gpu_hours']):>10} "
              f"{r['quota_status'] or '-':<15} {_num(r['cost']):>12} {_num(r['budget']):>12} {_num(r['projected_cost']):>12} "
              f"{r['budget_status'] or '-'} {r.get('currency') or ''}" + (f"  ({r['note']})" if r.get("note") else "") for r in rows]
    _emit(as_json, rows, "\n".join(lines) if rows else "no team budgets: fleetscope teams budget TEAM --gpu-hours N")


@teams.command("stranded")
@_JSON
def stranded(as_json: bool) -> None:
    """Free GPUs that no pending job can use (fragmentation), per partition, with their cost per hour."""
    from fleetscope.services import scheduler_capacity as svc  # lazy: imports the scheduler, stranded and idle-allocation analyzers

    out = _call(svc.stranded_capacity, _store(), now=dt.datetime.now(dt.UTC))
    parts = out["partitions"].to_dicts()
    cost = f", {_num(out['cost_per_hour'])} {out['currency']}/h" if out["cost_per_hour"] is not None else ""
    lines = [f"{out['stranded_gpus']} stranded GPUs in the fleet{cost}", f"{'partition':<24} {'pending':>7} {'min GPUs/node':>13} {'free':>6} {'stranded':>8} {'nodes':>6}"]
    lines += [f"{(p['cluster'] + '/' if p['cluster'] else '') + p['partition']:<24} {p['pending_jobs']:>7} {p['min_gpus_per_node']:>13} "
              f"{p['free_gpus']:>6} {p['stranded_gpus']:>8} {p['stranded_nodes']:>6}" for p in parts]
    _emit(as_json, {**out, "partitions": parts, "nodes": out["nodes"].to_dicts(), "findings": out["findings"].to_dicts()},
          "\n".join(lines) if parts else "no partition has a pending GPU job and free GPUs: nothing stranded")


@teams.command("idle")
@_MONTH
@_START
@_END
@_JSON
def idle(month: str | None, start_text: str | None, end_text: str | None, as_json: bool) -> None:
    """Idle allocations the health sweep found in the period: per job, the newest finding's team, the GPUs it
    holds near-idle, since when, the idle GPU-hours and what they cost (GET /api/v1/teams/idle).

    \b
    Examples:
      fleetscope teams idle
      fleetscope teams idle --month 2026-11 --json
      fleetscope teams idle --start 2026-11-02T00:00:00Z --end 2026-11-03T00:00:00Z
    """
    from fleetscope.services import scheduler_capacity as svc  # lazy: imports the scheduler, stranded and idle-allocation analyzers

    start, end = _window(month, start_text, end_text)
    rows = _call(svc.idle_allocations, _store(), start=start, end=end).to_dicts()
    lines = [f"{'job':<28} {'team':<16} {'GPUs':>4} {'idle since (UTC)':<17} {'idle GPU-h':>10} {'cost':>10}"]
    lines += [f"{r['subject'].removeprefix('job:'):<28} {r['team'] or 'unassigned':<16} {r['gpus_idle']:>4} {r['idle_since']:%Y-%m-%d %H:%M} "
              f"{_num(r['idle_gpu_hours'], ',.4f'):>10} {_num(r['idle_cost']):>10} {r['currency'] or ''}" for r in rows]
    _emit(as_json, rows, "\n".join(lines) if rows else f"no idle allocation found between {start.isoformat()} and {end.isoformat()}")

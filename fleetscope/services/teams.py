"""Team rules: which team a Slurm account, organization or user, a Kubernetes namespace or a label belongs
to, and each team's GPU-hour quota and money budget per month; set through the API and the CLI, recorded
with who and when, and appended to the audit log. Jobs are matched to teams by
``analyzers.chargeback.assign_teams`` where they are costed (``services/team_costs.py``).

Writes ``team_mapping`` and ``team_budget``.
"""

from __future__ import annotations

import datetime as dt
import re
from typing import Any

import polars as pl

from analyzers import chargeback
from fleetscope.core import scheduler_frames as SCH
from fleetscope.core.errors import ValidationError
from fleetscope.core.textinput import has_control
from fleetscope.core.units import as_utc
from fleetscope.services import auditlog
from fleetscope.store import Store

_NAME_MAX = 200


def set_mapping(store: Store, *, kind: str, match: str, team: str, cluster: str = "", recorded_by: str,
                now: dt.datetime | None = None) -> dict[str, Any]:
    """Map a Slurm account / organization / user, a Kubernetes namespace or a label (``key=value``) to a team;
    re-sending the same kind, match and cluster moves it. Appended to the audit log: who, when, what."""
    if kind not in chargeback.KINDS:
        raise ValidationError(f"kind must be one of {', '.join(chargeback.KINDS)}", frame="team_mapping", field="kind")
    for name, value in (("match", match), ("team", team), ("cluster", cluster)):
        if not isinstance(value, str) or len(value) > _NAME_MAX or has_control(value) or (name != "cluster" and not value.strip()):
            raise ValidationError(f"{name} must be 1-{_NAME_MAX} printable characters", frame="team_mapping", field=name)
    if kind == "k8s_label" and "=" not in match:
        raise ValidationError("a label rule matches key=value", frame="team_mapping", field="match")
    row = {"kind": kind, "match": match.strip(), "cluster": cluster.strip(), "team": team.strip(), "recorded_by": recorded_by,
           "recorded_at": as_utc(now or dt.datetime.now(dt.UTC))}
    store.write_frames([(SCH.TEAM_MAPPING, SCH.frame(SCH.TEAM_MAPPING, [row]))], source=f"team_mapping:{kind}")
    out = {k: (v.isoformat() if isinstance(v, dt.datetime) else v) for k, v in row.items()}
    auditlog.log(store, actor=recorded_by, action="team_mapping", subject=f"{kind}:{row['match']}", payload=out)
    return out


def mappings(store: Store) -> pl.DataFrame:
    """Every team rule, newest first."""
    df = store.read("team_mapping")
    return df.sort("recorded_at", descending=True) if df.height else df


def month_bounds(month: str) -> tuple[dt.datetime, dt.datetime]:
    """``2026-11`` as [2026-11-01, 2026-12-01) UTC; anything but YYYY-MM is refused (it names report files)."""
    if not isinstance(month, str) or not re.fullmatch(r"\d{4}-(0[1-9]|1[0-2])", month):
        raise ValidationError(f"month {str(month)[:20]!r} is not YYYY-MM", frame="report", field="month")
    try:
        y, m = (int(p) for p in month.split("-", 1))
        start = dt.datetime(y, m, 1, tzinfo=dt.UTC)
    except (ValueError, TypeError):
        raise ValidationError(f"month {month[:20]!r} is not YYYY-MM", frame="report", field="month") from None
    return start, (dt.datetime(y + 1, 1, 1, tzinfo=dt.UTC) if m == 12 else dt.datetime(y, m + 1, 1, tzinfo=dt.UTC))


# --- budgets ---------------------------------------------------------------------------------------

_CURRENCY = re.compile(r"[A-Z]{3}")
MAX_LIMIT = 1e12  # GPU-hours or money in a month beyond any fleet: a unit mistake


def set_budget(store: Store, *, team: str, month: str = "", gpu_hour_quota: float | None = None, budget: float | None = None,
               currency: str | None = None, recorded_by: str, now: dt.datetime | None = None) -> dict[str, Any]:
    """Set a team's GPU-hour quota and/or money budget for a month (``YYYY-MM``) or every month (empty);
    re-sending the same team and month replaces it. Appended to the audit log: who, when, what."""
    def bad(field: str, message: str) -> ValidationError:
        return ValidationError(message, frame="team_budget", field=field)

    if not isinstance(team, str) or not team.strip() or len(team) > _NAME_MAX or has_control(team):
        raise bad("team", f"team must be 1-{_NAME_MAX} printable characters")
    if month:
        month_bounds(month)
    for name, v in (("gpu_hour_quota", gpu_hour_quota), ("budget", budget)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, int | float) or not (0 <= v <= MAX_LIMIT)):
            raise bad(name, f"{name} must be a number from 0 to {MAX_LIMIT:g}")
    if gpu_hour_quota is None and budget is None:
        raise bad("budget", "give a gpu_hour_quota, a budget or both")
    if budget is not None and (not isinstance(currency, str) or not _CURRENCY.fullmatch(currency)):
        raise bad("currency", "a money budget needs its ISO 4217 currency code, e.g. EUR")
    if budget is None and currency is not None:
        raise bad("currency", "a currency belongs to a money budget")
    row = {"team": team.strip(), "month": month or "", "gpu_hour_quota": None if gpu_hour_quota is None else float(gpu_hour_quota),
           "budget": None if budget is None else float(budget), "currency": currency, "recorded_by": recorded_by,
           "recorded_at": as_utc(now or dt.datetime.now(dt.UTC))}
    store.write_frames([(SCH.TEAM_BUDGET, SCH.frame(SCH.TEAM_BUDGET, [row]))], source=f"team_budget:{row['team']}")
    out = {k: (v.isoformat() if isinstance(v, dt.datetime) else v) for k, v in row.items()}
    auditlog.log(store, actor=recorded_by, action="team_budget", subject=f"team:{row['team']}", payload=out)
    return out


def budgets(store: Store) -> pl.DataFrame:
    """Every team budget, by team and month."""
    df = store.read("team_budget")
    return df.sort("team", "month") if df.height else df

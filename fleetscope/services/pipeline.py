"""The service watching itself: how far each stage of the telemetry pipeline is behind, whether beat has a
leader and its scheduled work succeeds, and what the store holds per table.

Read by ``GET /api/v1/fleet/pipeline``, ``fleetscope db status``, the dashboard's Service page and the API's
``/metrics`` (``fleetscope_pipeline_lag_seconds``), so an operator sees a roll-up falling behind, a beat
without a leader or a packing backlog before a panel goes stale. Every figure comes from rows the stages
write as they go (watermarks, the ingest log, the lease, task outcomes) or from the database's own
catalogue, never from scanning telemetry: the read stays cheap at any fleet size.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from sqlalchemy import func, select, text

from fleetscope.core.units import as_utc
from fleetscope.services import energy_rollup, job_usage, packing, scheduled, tiers
from fleetscope.store import Store, gpu_keys, packed, packed_energy, schema

RECENT = dt.timedelta(minutes=5)
"""The window the ingest rate is read over."""
STAGE_EVERY = {"energy": dt.timedelta(minutes=1), "minute": dt.timedelta(minutes=1), "hour": dt.timedelta(hours=1),
               job_usage.TIER: dt.timedelta(hours=1)}
"""How far each roll-up's newest rolled instant may be behind now before it counts as late: the stage's own
step, on top of the time it waits for late scrapes (``tiers.SETTLE``) and the bucket still filling."""

PENDING_SHOWN = 30
"""Closed days of energy minutes waiting to be packed listed at most (a backlog after an upgrade is years long)."""
OVERDUE = dt.timedelta(hours=1)
"""An hour of the day under way is overdue once it has been packable this long: beat's hourly tick missed it."""


def _lag_s(now: dt.datetime, t: dt.datetime | None) -> float | None:
    return None if t is None else round((now - t).total_seconds(), 1)


def _ingest(store: Store, now: dt.datetime) -> dict[str, Any]:
    log = schema.ingest_log
    since = now - RECENT
    with store.reader.connect() as conn:
        first, last = (None if t is None else as_utc(t) for t in conn.execute(select(func.min(log.c.at), func.max(log.c.at))).one())
        pushes, values = conn.execute(select(func.count(), func.coalesce(func.sum(log.c["values"]), 0)).where(log.c.at >= since)).one()
    return {"first_push_at": first, "last_push_at": last, "lag_s": _lag_s(now, last),
            "pushes_recent": int(pushes), "values_recent": int(values), "recent_s": RECENT.total_seconds(),
            "values_per_s": round(int(values) / RECENT.total_seconds(), 1)}


def _stage(name: str, rolled_to: dt.datetime | None, now: dt.datetime, settle: dt.timedelta, ingest: dict[str, Any]) -> dict[str, Any]:
    """A stage owes what has arrived: its lag is how far its newest rolled instant is behind the newest push
    (or now, while pushes arrive), so a fleet that stopped sending does not make its roll-ups look late (the
    ingest line says that). It is late once the lag passes its allowance, or, never having rolled, once data
    older than the allowance has arrived (beat or the worker not running at all)."""
    allowed = (settle + 2 * STAGE_EVERY[name]).total_seconds()
    owed = now if ingest["last_push_at"] is None else min(now, ingest["last_push_at"])
    lag = None if rolled_to is None else max(0.0, round((owed - rolled_to).total_seconds(), 1))
    first = ingest["first_push_at"]
    late = lag > allowed if lag is not None else first is not None and (now - first).total_seconds() > allowed
    return {"stage": name, "rolled_to": rolled_to, "lag_s": lag, "allowed_lag_s": allowed, "late": late}


def _beat(store: Store, now: dt.datetime) -> dict[str, Any]:
    lease = schema.beat_lease
    with store.reader.connect() as conn:
        row = conn.execute(select(lease.c.holder, lease.c.expires_at, lease.c.acquired_at)).first()
    if row is None:
        return {"holder": None, "leading": False, "expires_at": None, "acquired_at": None}
    expires = as_utc(row.expires_at)
    return {"holder": row.holder, "leading": expires > now, "expires_at": expires, "acquired_at": as_utc(row.acquired_at)}


def _tasks(store: Store, now: dt.datetime) -> list[dict[str, Any]]:
    """Per task seen in ``task_run``: its last success and failure, the last run's time, failures in a day."""
    run = schema.task_run
    day = now - dt.timedelta(days=1)
    with store.reader.connect() as conn:
        rows = conn.execute(select(
            run.c.task,
            func.max(run.c.at).filter(run.c.state == "success"),
            func.max(run.c.at).filter(run.c.state != "success"),
            func.count().filter((run.c.state != "success") & (run.c.at >= day)),
            func.count().filter(run.c.at >= day),
        ).group_by(run.c.task)).all()
        # each task's newest run, found through the (task, at) index
        last = dict(conn.execute(text(
            "SELECT t.task, t.runtime_s FROM task_run t WHERE t.at = (SELECT max(u.at) FROM task_run u WHERE u.task = t.task)")).all())
    entries = {b.task: b for b in scheduled.beats()}
    out = []
    for task, ok_at, bad_at, bad_day, runs_day in sorted(rows):
        beat = entries.get(task)
        out.append({"task": task, "entry": beat.entry if beat else None, "when": beat.when if beat else None,
                    "last_success_at": None if ok_at is None else as_utc(ok_at),
                    "last_failure_at": None if bad_at is None else as_utc(bad_at),
                    "failures_day": int(bad_day), "runs_day": int(runs_day), "last_runtime_s": last.get(task)})
    return out


def status(store: Store, now: dt.datetime, *, tasks: bool = True) -> dict[str, Any]:
    """The pipeline at ``now``: ingest (first and last push, recent rate), each roll-up stage's newest rolled
    instant and its lag behind the newest push (``late`` past its allowance), days waiting to be packed (PostgreSQL; of energy
    minutes the oldest ``PENDING_SHOWN``) and hours of the day under way overdue, beat's leader, and each task's
    last outcomes (``tasks``; the /metrics gauges leave them out, ``fleetscope_task_runs`` counts them)."""
    ingest = _ingest(store, now)
    stages = [_stage("energy", energy_rollup.energy_rollup_end(store), now, energy_rollup.PAD, ingest),
              *(_stage(t, tiers.watermark(store, t), now, tiers.SETTLE, ingest) for t in ("minute", "hour")),
              _stage(job_usage.TIER, job_usage.watermark(store), now, tiers.SETTLE + job_usage.SETTLE, ingest)]
    return {"at": now, "ingest": ingest, "stages": stages,
            "packing_pending_days": [d.isoformat() for d in packing.packable_days(store, now)],
            # hours of the day under way that were packable an hour ago and are still rows: a tick missed or failed
            "packing_overdue_hours": [h.isoformat() for h in packing.packable_hours(store, now - OVERDUE)],
            "energy_packing_pending_days": [d.isoformat() for d in packing.packable_energy_days(store, now, max_days=PENDING_SHOWN)],
            "beat": _beat(store, now), "tasks": _tasks(store, now) if tasks else []}


def _pg_sizes(store: Store) -> list[dict[str, Any]]:
    # A partitioned table's own relation is empty: its partitions (pg_inherits) carry the rows and bytes.
    sql = """
        SELECT coalesce(parent.relname, c.relname) AS name, count(i.inhrelid) AS partitions,
               sum(pg_total_relation_size(c.oid)) AS bytes, sum(greatest(c.reltuples, 0)) AS rows
        FROM pg_class c
        JOIN pg_namespace n ON n.oid = c.relnamespace AND n.nspname = current_schema()
        LEFT JOIN pg_inherits i ON i.inhrelid = c.oid
        LEFT JOIN pg_class parent ON parent.oid = i.inhparent
        WHERE c.relkind = 'r'
        GROUP BY 1"""
    with store.reader.connect() as conn:
        return [{"table": r.name, "bytes": int(r.bytes), "rows_estimate": int(r.rows), "partitions": int(r.partitions)}
                for r in conn.execute(text(sql))]


def _sqlite_sizes(store: Store) -> list[dict[str, Any]]:
    # dbstat (compiled into CPython's usual SQLite) gives each table's pages with its indexes'; rows are
    # not estimated, as counting them would scan the telemetry tables.
    tables = {t.name for t in schema.metadata.sorted_tables}
    sql = "SELECT m.tbl_name AS name, sum(s.pgsize) AS bytes FROM dbstat s JOIN sqlite_master m ON m.name = s.name GROUP BY m.tbl_name"
    with store.reader.connect() as conn:
        try:
            rows = conn.execute(text(sql)).all()
        except Exception:  # noqa: BLE001 - an SQLite built without dbstat: sizes unknown, the rest still shown
            return [{"table": t, "bytes": None, "rows_estimate": None, "partitions": 0} for t in sorted(tables)]
    return [{"table": r.name, "bytes": int(r.bytes), "rows_estimate": None, "partitions": 0} for r in rows if r.name in tables]


def storage(store: Store) -> list[dict[str, Any]]:
    """Per table of the schema (and PostgreSQL's packed days and GPU ids): bytes with its indexes (and its
    partitions' on PostgreSQL), PostgreSQL's row estimate, and how many day partitions it has; largest first."""
    rows = _pg_sizes(store) if store.dialect == "postgresql" else _sqlite_sizes(store)
    # with PostgreSQL's own tables, not in the models: the packed days, most of what is kept, and the GPU ids
    known = {t.name for t in schema.metadata.sorted_tables} | {packed.TABLE, packed_energy.TABLE, gpu_keys.TABLE}
    rows = [r for r in rows if r["table"] in known]
    return sorted(rows, key=lambda r: (-(r["bytes"] or 0), r["table"]))


def describe(report: dict[str, Any], sizes: list[dict[str, Any]], top: int = 12) -> str:
    """``status`` and ``storage`` as lines for a terminal (``fleetscope db status``)."""

    def ago(t: dt.datetime | None) -> str:
        return "never" if t is None else f"{(report['at'] - t).total_seconds():,.0f} s ago"

    ing = report["ingest"]
    lines = [f"ingest      last push {ago(ing['last_push_at'])}; {ing['pushes_recent']:,} pushes, "
             f"{ing['values_per_s']:,.0f} values/s over the last {ing['recent_s']:g} s"]
    for st in report["stages"]:
        flag = "LATE" if st["late"] else "ok"
        behind = "never rolled" if st["lag_s"] is None else f"{st['lag_s']:,.0f} s behind the newest push"
        lines.append(f"{st['stage']:<11} {behind} (allowed {st['allowed_lag_s']:,.0f} s): {flag}")
    pending = report["packing_pending_days"]
    lines.append(f"packing     {len(pending)} closed day(s) waiting" + (f": {', '.join(pending)}" if pending else ""))
    overdue = report["packing_overdue_hours"]
    lines.append(f"hour pack   {len(overdue)} hour(s) of the day under way overdue" + (f": {', '.join(overdue)}" if overdue else ""))
    pending = report["energy_packing_pending_days"]
    more = "+" if len(pending) >= PENDING_SHOWN else ""
    lines.append(f"energy pack {len(pending)}{more} closed day(s) of energy minutes waiting" + (f": {', '.join(pending)}" if pending else ""))
    beat = report["beat"]
    lines.append(f"beat        {'led by ' + beat['holder'] if beat['leading'] else 'NO LEADER' + (' (last ' + beat['holder'] + ')' if beat['holder'] else '')}")
    for t in report["tasks"]:
        failed = f", {t['failures_day']} failed in a day (last {ago(t['last_failure_at'])})" if t["failures_day"] else ""
        lines.append(f"  {t['task']:<34} last ok {ago(t['last_success_at'])}, {t['runs_day']} runs in a day{failed}")
    lines.append("storage (bytes with indexes; rows estimated on PostgreSQL)")
    for r in sizes[:top]:
        rows = "" if r["rows_estimate"] is None else f" {r['rows_estimate']:>14,} rows"
        parts = f" in {r['partitions']} partitions" if r["partitions"] else ""
        lines.append(f"  {r['table']:<26} {(r['bytes'] or 0) / 2**20:>10,.1f} MiB{rows}{parts}")
    return "\n".join(lines)

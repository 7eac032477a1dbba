"""``fleetscope db``: schema migrations, the retention prune and packing, the pipeline's status."""

from __future__ import annotations

import datetime as dt
import sys

import click

from fleetscope.cli.common import _emit, _settings, _store, _utc_option
from fleetscope.store import db


@click.group("db")
def db_group() -> None:
    """The database: schema migrations (Alembic) and retention.

    \b
    Examples:
      fleetscope db upgrade
      fleetscope db current --json
      fleetscope db prune --dry-run
      fleetscope db pack
      fleetscope db replica
      fleetscope db status
    """


@db_group.command("upgrade")
@click.option("--revision", default="head", show_default=True, help="Target revision.")
def db_upgrade(revision: str) -> None:
    """Migrate the database to REVISION (the latest by default).

    \b
    Examples:
      fleetscope db upgrade
      FLEETSCOPE_DATABASE_URL=postgresql+psycopg://fleet@db/fleet fleetscope db upgrade --revision head
    """
    s = _settings()
    db.upgrade(s.database_url, revision)
    click.echo(f"database at {db.current_revision(db.make_engine(s.database_url))}")


@db_group.command("downgrade")
@click.option("--revision", required=True, help="Target revision ('base' drops everything).")
@click.confirmation_option(prompt="Downgrading can drop tables and their data. Continue?")
def db_downgrade(revision: str) -> None:
    """Migrate the database down to REVISION.

    \b
    Example:
      fleetscope db downgrade --revision base --yes
    """
    s = _settings()
    db.downgrade(s.database_url, revision)
    click.echo(f"database at {db.current_revision(db.make_engine(s.database_url)) or 'base'}")


@db_group.command("current")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def db_current(as_json: bool) -> None:
    """Show the database's schema revision and the code's.

    \b
    Examples:
      fleetscope db current
      fleetscope db current --json | jq -r .current
    """
    s = _settings()
    engine = db.make_engine(s.database_url)
    cur, head = db.current_revision(engine), db.head_revision(s.database_url)
    url = engine.url.render_as_string(hide_password=True)
    _emit(as_json, {"url": url, "current": cur, "head": head}, f"{url}: at {cur or 'base'}, code expects {head}")


@db_group.command("replica")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def db_replica(as_json: bool) -> None:
    """Show how far the read replica (FLEETSCOPE_READ_DATABASE_URL) is behind the primary: WAL bytes not yet
    replayed and seconds its reads are behind. Exits 1 where it does not answer or is no replica.

    \b
    Examples:
      fleetscope db replica
      fleetscope db replica --json | jq .lag_s
    """
    s = _settings()
    if not s.read_database_url:
        raise click.ClickException("no read replica configured: set FLEETSCOPE_READ_DATABASE_URL to a streaming replica of FLEETSCOPE_DATABASE_URL")
    replica = db.make_engine(s.read_database_url)
    lag = db.replica_lag(db.make_engine(s.database_url), replica)
    url = replica.url.render_as_string(hide_password=True)
    if not lag["reachable"]:
        text = f"{url}: does not answer"
    elif not lag["in_recovery"]:
        text = f"{url}: answers but is not in recovery, so it is no replica"
    else:
        text = f"{url}: {lag['lag_bytes']} bytes of WAL behind, reads {lag['lag_s']:g} s behind" + (" (replay paused)" if lag["replay_paused"] else "")
    _emit(as_json, {"url": url, **lag}, text)
    if not (lag["reachable"] and lag["in_recovery"]):
        raise SystemExit(1)


@db_group.command("prune")
@click.option("--now", "now_text", default=None, help="RFC 3339: prune as of this instant (default: now).")
@click.option("--dry-run", is_flag=True, help="Print each table's cutoff; delete nothing.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def db_prune(now_text: str | None, dry_run: bool, as_json: bool) -> None:
    """Delete what is past its retention now, as beat does every hour: raw telemetry after
    FLEETSCOPE_RETENTION_DAYS, what was derived from it after FLEETSCOPE_EVIDENCE_RETENTION_DAYS, the
    roll-up tiers after FLEETSCOPE_MINUTE_TIER_RETENTION_DAYS and FLEETSCOPE_HOUR_TIER_RETENTION_DAYS.

    \b
    Examples:
      fleetscope db prune --dry-run
      FLEETSCOPE_RETENTION_DAYS=200 fleetscope db prune --json
    """
    from fleetscope.services import retention  # lazy: keeps --help light

    s = _settings()
    now = _utc_option(now_text, "--now") or dt.datetime.now(dt.UTC)
    if dry_run:
        cut = {k: v.isoformat() for k, v in retention.cutoffs(now, s.retention_days, s.evidence_retention_days, retention.tier_days(s)).items()}
        _emit(as_json, cut, "\n".join(f"{k:<20} rows before {v}" for k, v in cut.items()))
        return
    deleted = retention.prune(_store(), now, s.retention_days, s.evidence_retention_days, retention.tier_days(s))
    _emit(as_json, deleted, "\n".join(f"{k:<20} {v:>10,} deleted" for k, v in deleted.items()))


@db_group.command("pack")
@click.option("--days", "max_days", type=click.IntRange(min=1), default=None,
              help="Pack at most this many days of each table, oldest first (default: every closed day).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def db_pack(max_days: int | None, as_json: bool) -> None:
    """Pack the closed days beat has not packed yet, now (PostgreSQL): raw GPU samples and per-GPU energy minutes,
    each day an hour per transaction as beat's hourly raw-packing does it, two days of each a tick. For a backlog
    after an outage, or after the upgrade that brought packing to a store holding years of energy minutes. Safe
    beside a running beat: one packer holds a day at a time.

    \b
    Examples:
      fleetscope db pack
      fleetscope db pack --days 30 --json
    """
    from fleetscope.services import packing  # lazy: keeps --help light

    store = _store()
    if store.dialect != "postgresql":
        _emit(as_json, {}, "nothing to pack: SQLite keeps every day as rows")
        return
    todo = packing.backlog(store, dt.datetime.now(dt.UTC), max_days)
    done: dict[str, dict[str, dict[str, int]]] = {}
    with click.progressbar(length=len(todo), label="packing closed days", file=sys.stderr,
                           item_show_func=lambda item: f"{item[0]} {item[1]}" if item else None) as bar:
        for table, day, packed_day in packing.pack_backlog(store, todo):
            done.setdefault(table, {})[day.isoformat()] = packed_day
            bar.update(1, (table, day))
    lines = [f"{table:<20} {day}  {n.get('samples', n.get('minutes', 0)):>12,} packed into {n['rows']:>8,} GPU-hour rows"
             for table, days_done in done.items() for day, n in days_done.items()]
    _emit(as_json, done, "\n".join(lines) or "nothing to pack: every closed day is packed")


@db_group.command("status")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option("--fail-late", is_flag=True, help="Exit 3 when a roll-up stage is late or beat has no leader (for a cron check).")
def db_status(as_json: bool, fail_late: bool) -> None:
    """How far each stage of the telemetry pipeline is behind (ingest, the energy roll-up, the minute and hour
    tiers, days waiting to be packed), whether beat has a leader, each scheduled task's last outcomes, and
    what the store holds per table. Read from watermarks and the database's catalogue: cheap at any size.

    \b
    Examples:
      fleetscope db status
      fleetscope db status --json | jq '.stages[] | select(.late)'
      fleetscope db status --fail-late || page-oncall "fleetscope pipeline behind"
    """
    from fleetscope.services import pipeline  # lazy: keeps --help light

    store = _store()
    report, sizes = pipeline.status(store, dt.datetime.now(dt.UTC)), pipeline.storage(store)
    _emit(as_json, {**report, "storage": sizes}, pipeline.describe(report, sizes))
    if fail_late and (any(st["late"] for st in report["stages"]) or not report["beat"]["leading"]):
        raise SystemExit(3)

"""Raw telemetry partitioned by day on PostgreSQL: which tables, partition names, creating them ahead, dropping old ones.

On PostgreSQL the high-volume raw tables are native declarative range partitions by their time column
(PostgreSQL 15 docs, ch. 5.11 "Table Partitioning"), one partition per UTC day named
``<table>_pYYYYMMDD``. Retention then drops whole partitions (``DROP TABLE`` is a catalog change; a
``DELETE`` of a day of a large fleet rewrites every page it touches and leaves the vacuum to do), and a
time-bounded read touches only the partitions of its range. Each table's primary key includes the
time column, as PostgreSQL requires of a unique index on a partitioned table, so the store's
``INSERT ... ON CONFLICT`` and ``COPY`` keep working unchanged (both route rows to partitions).
Partitions are made ahead by beat (``ensure_ahead``) and, for rows outside them (a backfill, a replay),
by the store before it opens a write's transaction (``ensure_days``), never inside it: creating a
partition locks its parent, and the writer must not wait on itself.

SQLite has no partitioning: its tables stay plain and retention deletes by time, with the same result.
"""

from __future__ import annotations

import datetime as dt
import re
import threading

from sqlalchemy import Engine, text

from fleetscope.store import packed

# table -> its time column
PARTITIONED: dict[str, str] = {"gpu_sample": "ts", "gpu_workload": "ts", "metric_sample": "ts", "fabric_port_sample": "ts"}
PARTITION_NAME = re.compile(r"^(?P<table>[a-z_]+)_p(?P<day>\d{8})$")
AHEAD_DAYS = 3
"""Beat keeps this many days of partitions ready after today."""

_known: set[tuple[str, str, dt.date]] = set()
_known_lock = threading.Lock()


def partition_name(table: str, day: dt.date) -> str:
    return f"{table}_p{day:%Y%m%d}"


def is_partition(name: str) -> bool:
    """Whether a table name is one of the day partitions (schema comparison leaves them out)."""
    m = PARTITION_NAME.match(name)
    return bool(m and (m.group("table") in PARTITIONED or m.group("table") == packed.TABLE))


def _bounds(day: dt.date) -> tuple[str, str]:
    lo = dt.datetime.combine(day, dt.time(), dt.UTC)
    return lo.isoformat(), (lo + dt.timedelta(days=1)).isoformat()


def create_sql(table: str, day: dt.date) -> str:
    lo, hi = _bounds(day)
    return f"CREATE TABLE IF NOT EXISTS \"{partition_name(table, day)}\" PARTITION OF \"{table}\" FOR VALUES FROM ('{lo}') TO ('{hi}')"


def is_partitioned(engine: Engine, table: str) -> bool:
    if engine.dialect.name != "postgresql":
        return False
    with engine.connect() as conn:
        return bool(conn.execute(text("SELECT EXISTS (SELECT 1 FROM pg_partitioned_table p JOIN pg_class c ON c.oid = p.partrelid"
                                      " WHERE c.relname = :t AND c.relnamespace = 'public'::regnamespace)"), {"t": table}).scalar())


def ensure_days(engine: Engine, table: str, days: set[dt.date]) -> list[str]:
    """Create the day partitions of ``table`` for ``days`` that do not exist yet (PostgreSQL; nothing elsewhere),
    each in a transaction of its own; the names created. Remembered per process, so a write's check is a set lookup."""
    if engine.dialect.name != "postgresql" or table not in PARTITIONED:
        return []
    url = str(engine.url)
    with _known_lock:
        missing = sorted(d for d in days if (url, table, d) not in _known)
    created = []
    for day in missing:
        with engine.begin() as conn:
            # Writers of several threads or processes may meet the same new day: IF NOT EXISTS alone races
            # (both see no table, one fails on the catalog's unique index), so creators of one partition
            # take turns under a transaction-scoped advisory lock and the later one finds it made.
            conn.execute(text("SELECT pg_advisory_xact_lock(hashtext(:n))"), {"n": partition_name(table, day)})
            existed = conn.execute(text("SELECT to_regclass(:n) IS NOT NULL"), {"n": f'public."{partition_name(table, day)}"'}).scalar()
            if not existed:
                conn.execute(text(create_sql(table, day)))
                created.append(partition_name(table, day))
        with _known_lock:
            _known.add((url, table, day))
    return created


def forget(engine: Engine, table: str, day: dt.date) -> None:
    with _known_lock:
        _known.discard((str(engine.url), table, day))


def forget_all(engine: Engine) -> None:
    """Forget every partition this process knew of ``engine``'s database (the next write checks again)."""
    url = str(engine.url)
    with _known_lock:
        for k in [k for k in _known if k[0] == url]:
            _known.discard(k)


def ensure_ahead(engine: Engine, today: dt.date, days_ahead: int = AHEAD_DAYS) -> dict[str, list[str]]:
    """Beat's tick: partitions for today and the next ``days_ahead`` days of every partitioned table."""
    want = {today + dt.timedelta(days=i) for i in range(days_ahead + 1)}
    return {t: ensure_days(engine, t, want) for t in PARTITIONED if is_partitioned(engine, t)}


# The children of the partitioned tables, with their parent as p.
_CHILDREN = ("SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid JOIN pg_class p ON p.oid = i.inhparent"
             " JOIN pg_partitioned_table pt ON pt.partrelid = p.oid")


def partitions(engine: Engine, table: str) -> list[tuple[str, dt.date]]:
    """The day partitions of ``table`` (name, day), oldest first."""
    with engine.connect() as conn:
        names = conn.execute(text(_CHILDREN + " WHERE p.relname = :t"), {"t": table}).scalars().all()
    out = []
    for name in names:
        m = PARTITION_NAME.match(name)
        if m and m.group("table") == table:
            out.append((name, dt.datetime.strptime(m.group("day"), "%Y%m%d").date()))
    return sorted(out, key=lambda p: p[1])


def all_partitions(engine: Engine) -> list[str]:
    """The day partitions of every partitioned table, by name (PostgreSQL; what emptying a database drops)."""
    with engine.connect() as conn:
        return sorted(n for n in conn.execute(text(_CHILDREN)).scalars() if is_partition(n))


def drop_before(engine: Engine, table: str, cutoff: dt.datetime) -> tuple[int, list[str]]:
    """Drop every day partition of ``table`` that ends at or before ``cutoff``: (rows they held, names). The rows
    are the planner's count where the partition was analysed (autovacuum analyses large ones), else counted."""
    rows, dropped = 0, []
    for name, day in partitions(engine, table):
        end = dt.datetime.combine(day + dt.timedelta(days=1), dt.time(), dt.UTC)
        if end > cutoff:
            break
        with engine.begin() as conn:
            est = conn.execute(text("SELECT reltuples::bigint FROM pg_class WHERE oid = to_regclass(:n)"), {"n": f'public."{name}"'}).scalar()
            if est is None or est < 0:
                est = conn.execute(text(f'SELECT count(*) FROM "{name}"')).scalar()
            conn.execute(text(f'DROP TABLE "{name}"'))
        forget(engine, table, day)
        rows += int(est or 0)
        dropped.append(name)
    return rows, dropped

"""Beat's packing of closed days of raw GPU telemetry (PostgreSQL; ``store.packed``).

A UTC day's ``gpu_sample`` partition is packed once the day ended ``GRACE`` ago and the minute tier's
watermark (``services.tiers``) has passed its end: the energy roll-up's ten-minute re-roll and the tiers are
done with it, and what reads it afterwards reads the packed rows through ``store.packed.source`` with the
same result. One transaction per hour of the day: the raw partition is locked against writers, the hour's
rows (with any packed earlier for it, when samples came late) packed and deleted from the raw partition, so
a reader sees an hour either raw or packed and a writer waits at most an hour's packing and then lands in
the raw partition for the next tick to fold in. A tick stopped half-way leaves whole hours packed and goes
on from the rest. SQLite does not pack.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from sqlalchemy import text

from fleetscope.observability import tracer
from fleetscope.services import tiers
from fleetscope.services.analysis import at
from fleetscope.settings import Settings
from fleetscope.store import Store, packed, partitions

GRACE = dt.timedelta(hours=1)
"""A day is packed no sooner than this after its end (late scrapes, the energy roll-up's re-roll)."""
MAX_DAYS_PER_TICK = 2
"""Days packed by one tick, oldest first (a backlog after an outage goes over several ticks)."""


def packable_days(store: Store, now: dt.datetime) -> list[dt.date]:
    """Days whose raw partition holds rows and may be packed at ``now``, oldest first."""
    if store.dialect != "postgresql" or not partitions.is_partitioned(store.engine, packed.RAW):
        return []
    rolled = tiers.watermark(store, "minute")
    if rolled is None:
        return []
    bound = min(now - GRACE, rolled)
    closed = [(name, day) for name, day in partitions.partitions(store.engine, packed.RAW)
              if dt.datetime.combine(day + dt.timedelta(days=1), dt.time(), dt.UTC) <= bound]
    # every closed day's partition asked on one connection: a year of them is read on each /metrics scrape
    with store.engine.connect() as conn:
        return [day for name, day in closed if conn.execute(text(f'SELECT EXISTS (SELECT 1 FROM "{name}")')).scalar()]


def _hold(conn: Any, packed_name: str, raw_name: str) -> None:
    """One packer per day at a time; the day's writers wait while an hour is packed (readers do not)."""
    conn.execute(text("SELECT pg_advisory_xact_lock(hashtext(:n))"), {"n": packed_name})
    conn.execute(text(f'LOCK TABLE "{raw_name}" IN EXCLUSIVE MODE'))


def pack_day(store: Store, day: dt.date) -> dict[str, int]:
    """Pack ``day``'s raw partition (with whatever was packed of the day before) into the day's packed
    partition, an hour per transaction, and empty the raw one: ``samples`` packed, ``rows`` (GPU-hours) held."""
    raw_name = partitions.partition_name(packed.RAW, day)
    packed_name = partitions.partition_name(packed.TABLE, day)
    with store.engine.begin() as conn:
        conn.execute(text(partitions.create_sql(packed.TABLE, day)))
    start = dt.datetime.combine(day, dt.time(), dt.UTC)
    for h in range(24):
        hour = start + dt.timedelta(hours=h)
        with store.engine.begin() as conn:
            _hold(conn, packed_name, raw_name)
            bounds = {"a": hour, "b": hour + dt.timedelta(hours=1)}
            if not conn.execute(text(f'SELECT EXISTS (SELECT 1 FROM "{raw_name}" WHERE ts >= :a AND ts < :b)'), bounds).scalar():
                continue
            merge = bool(conn.execute(text(f'SELECT EXISTS (SELECT 1 FROM "{packed_name}" WHERE hour = :a)'), bounds).scalar())
            for sql in packed.pack_sql(day, merge, hour):
                conn.execute(text(sql))
    with store.engine.begin() as conn:
        _hold(conn, packed_name, raw_name)
        # the deleted rows' space back at once, rather than at the next vacuum
        if not conn.execute(text(f'SELECT EXISTS (SELECT 1 FROM "{raw_name}")')).scalar():
            conn.execute(text(f'TRUNCATE "{raw_name}"'))
        rows, samples = conn.execute(text(f'SELECT count(*), COALESCE(sum(samples), 0) FROM "{packed_name}"')).one()
    return {"samples": int(samples), "rows": int(rows)}


def pack_closed(store: Store, now: dt.datetime, max_days: int = MAX_DAYS_PER_TICK) -> dict[str, Any]:
    """Beat's tick: pack the oldest ``max_days`` packable days; per day packed, its samples and rows."""
    done: dict[str, Any] = {}
    with tracer().start_as_current_span("packing.pack_closed"):
        for day in packable_days(store, now)[:max_days]:
            done[day.isoformat()] = pack_day(store, day)
    return done


def scheduled_pack(store: Store, settings: Settings, *, now_iso: str | None = None) -> dict[str, Any]:
    """Beat's ``raw-packing`` (``services.scheduled``): ``pack_closed`` at ``now_iso``, else now."""
    return pack_closed(store, at(now_iso))

"""Beat's packing of closed days of raw GPU telemetry (PostgreSQL; ``store.packed``).

A UTC day's ``gpu_sample`` partition is packed once the day ended ``GRACE`` ago and the minute tier's
watermark (``services.tiers``) has passed its end: the energy roll-up's ten-minute re-roll and the tiers are
done with it, and what reads it afterwards reads the packed rows through ``store.packed.source`` with the
same result. One transaction per day: the raw partition is locked against writers, its rows (with any
packed earlier for the day, when samples came late) packed, then the partition emptied, so a reader sees
either the raw rows or the packed ones and a writer waits and then lands in the emptied partition for the
next tick to fold in. SQLite does not pack.
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
    out = []
    for name, day in partitions.partitions(store.engine, packed.RAW):
        if dt.datetime.combine(day + dt.timedelta(days=1), dt.time(), dt.UTC) > bound:
            break
        with store.engine.connect() as conn:
            if conn.execute(text(f'SELECT EXISTS (SELECT 1 FROM "{name}")')).scalar():
                out.append(day)
    return out


def pack_day(store: Store, day: dt.date) -> dict[str, int]:
    """Pack ``day``'s raw partition (and whatever was packed of the day before) into the day's packed
    partition and empty the raw one: ``samples`` packed, ``rows`` (GPU-hours) written."""
    raw_name = partitions.partition_name(packed.RAW, day)
    packed_name = partitions.partition_name(packed.TABLE, day)
    with store.engine.begin() as conn:
        # one packer per day at a time; writers of the day wait until the raw partition is emptied
        conn.execute(text("SELECT pg_advisory_xact_lock(hashtext(:n))"), {"n": packed_name})
        conn.execute(text(f'LOCK TABLE "{raw_name}" IN EXCLUSIVE MODE'))
        conn.execute(text(partitions.create_sql(packed.TABLE, day)))
        merge = bool(conn.execute(text(f'SELECT EXISTS (SELECT 1 FROM "{packed_name}")')).scalar())
        for sql in packed.pack_sql(day, merge):
            conn.execute(text(sql))
        rows, samples = conn.execute(text(f'SELECT count(*), COALESCE(sum(samples), 0) FROM "{packed_name}"')).one()
        conn.execute(text(f'TRUNCATE "{raw_name}"'))
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

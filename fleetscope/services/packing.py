"""Beat's packing of closed days of raw GPU telemetry (PostgreSQL; ``store.packed``).

A UTC day's ``gpu_sample`` partition is packed once the day ended ``GRACE`` ago and the minute tier's
watermark (``services.tiers``) has passed its end: the energy roll-up's ten-minute re-roll and the tiers are
done with it, and what reads it afterwards reads the packed rows through ``store.packed.source`` with the
same result. One transaction per hour of the day: the raw partition is locked against writers, the hour's
rows (with any packed earlier for it, when samples came late) packed and deleted from the raw partition, so
a reader sees an hour either raw or packed and a writer waits at most an hour's packing and then lands in
the raw partition for the next tick to fold in. A tick stopped half-way leaves whole hours packed and goes
on from the rest. SQLite does not pack.

The per-GPU energy minutes (``gpu_energy_minute``, evidence kept for years) are packed the same way, a closed
day an hour at a time once the energy roll-up has passed it (``store.packed_energy``).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Iterator
from typing import Any

from sqlalchemy import text

from fleetscope.observability import tracer
from fleetscope.services import tiers
from fleetscope.services.analysis import at
from fleetscope.settings import Settings
from fleetscope.store import Store, packed, packed_energy, partitions

GRACE = dt.timedelta(hours=1)
"""A day is packed no sooner than this after its end (late scrapes, the energy roll-up's re-roll)."""
HOUR_GRACE = dt.timedelta(hours=1)
"""An hour of the day under way is packed no sooner than this after its end: the fleet-wide reads of recent
samples (the live panel, activity and state counts, the health sweeps' fifteen minutes, a job analysis a few
ticks behind, an agent's buffered readings sent after an API restart) stay on rows. Fleet panels' probes further
back read the minute tier wherever an hour is packed (``telemetry.minute_tier_serves``); one GPU's panel
unpacks only its own hours."""
PACK_LOCK_TIMEOUT = "5s"
"""How long an hour's pack of the day under way waits for a writer's row lock before it gives up until the next tick."""
MAX_DAYS_PER_TICK = 2
"""Days packed by one tick, oldest first (a backlog after an outage goes over several ticks)."""


def _day_end(day: dt.date) -> dt.datetime:
    return dt.datetime.combine(day + dt.timedelta(days=1), dt.time(), dt.UTC)


def _rolled(store: Store) -> dt.datetime | None:
    """How far the minute tier has rolled, where raw samples are packed at all (PostgreSQL, partitioned): nothing
    is packed before the tier has passed it."""
    if store.dialect != "postgresql" or not partitions.is_partitioned(store.engine, packed.RAW):
        return None
    return tiers.watermark(store, "minute")


def packable_days(store: Store, now: dt.datetime) -> list[dt.date]:
    """Days whose raw partition holds rows and may be packed at ``now``, oldest first."""
    rolled = _rolled(store)
    if rolled is None:
        return []
    bound = min(now - GRACE, rolled)
    closed = [(name, day) for name, day in partitions.partitions(store.engine, packed.RAW)
              if _day_end(day) <= bound]
    # every closed day's partition asked on one connection: a year of them is read on each /metrics scrape
    with store.engine.connect() as conn:
        return [day for name, day in closed if conn.execute(text(f'SELECT EXISTS (SELECT 1 FROM "{name}")')).scalar()]


def _hold(conn: Any, packed_name: str, raw_name: str) -> None:
    """One packer per day at a time; the day's writers wait while an hour is packed (readers do not)."""
    conn.execute(text("SELECT pg_advisory_xact_lock(hashtext(:n))"), {"n": packed_name})
    conn.execute(text(f'LOCK TABLE "{raw_name}" IN EXCLUSIVE MODE'))


def _pack_hour(conn: Any, day: dt.date, hour: dt.datetime) -> bool:
    """In ``conn``'s transaction, pack ``hour`` of ``day``'s raw partition (merged with what was packed of it
    before) and delete the rows it packed; whether the hour held raw rows."""
    raw_name, packed_name = partitions.partition_name(packed.RAW, day), partitions.partition_name(packed.TABLE, day)
    bounds = {"a": hour, "b": hour + dt.timedelta(hours=1)}
    if not conn.execute(text(f'SELECT EXISTS (SELECT 1 FROM "{raw_name}" WHERE ts >= :a AND ts < :b)'), bounds).scalar():
        return False
    merge = bool(conn.execute(text(f'SELECT EXISTS (SELECT 1 FROM "{packed_name}" WHERE hour = :a)'), bounds).scalar())
    for sql in packed.pack_sql(day, merge, hour):
        conn.execute(text(sql))
    return True


def pack_day(store: Store, day: dt.date) -> dict[str, int]:
    """Pack ``day``'s raw partition (with whatever was packed of the day before) into the day's packed
    partition, an hour per transaction, and empty the raw one: ``samples`` packed, ``rows`` (GPU-hours) held."""
    raw_name = partitions.partition_name(packed.RAW, day)
    packed_name = partitions.partition_name(packed.TABLE, day)
    with store.engine.begin() as conn:
        conn.execute(text(partitions.create_sql(packed.TABLE, day)))
    start = dt.datetime.combine(day, dt.time(), dt.UTC)
    for h in range(24):
        with store.engine.begin() as conn:
            _hold(conn, packed_name, raw_name)
            _pack_hour(conn, day, start + dt.timedelta(hours=h))
    with store.engine.begin() as conn:
        _hold(conn, packed_name, raw_name)
        # the deleted rows' space back at once, rather than at the next vacuum
        if not conn.execute(text(f'SELECT EXISTS (SELECT 1 FROM "{raw_name}")')).scalar():
            conn.execute(text(f'TRUNCATE "{raw_name}"'))
        rows, samples = conn.execute(text(f'SELECT count(*), COALESCE(sum(samples), 0) FROM "{packed_name}"')).one()
    store.packed_changed()
    return {"samples": int(samples), "rows": int(rows)}


def packable_hours(store: Store, now: dt.datetime) -> list[dt.datetime]:
    """Hours of days not yet closed (``packable_days`` takes those whole) that ended ``HOUR_GRACE`` ago, that the
    minute tier has passed, and that hold raw rows, oldest first: one indexed probe an hour."""
    rolled = _rolled(store)
    if rolled is None:
        return []
    bound = min(now - HOUR_GRACE, rolled)
    hours = []
    with store.engine.connect() as conn:
        for name, day in partitions.partitions(store.engine, packed.RAW):
            if _day_end(day) <= min(now - GRACE, rolled):
                continue  # closed: packed whole, its partition emptied (pack_day)
            start = dt.datetime.combine(day, dt.time(), dt.UTC)
            for h in range(24):
                hour = start + dt.timedelta(hours=h)
                if hour + dt.timedelta(hours=1) > bound:
                    break
                if conn.execute(text(f'SELECT EXISTS (SELECT 1 FROM "{name}" WHERE ts >= :a AND ts < :b)'),
                                {"a": hour, "b": hour + dt.timedelta(hours=1)}).scalar():
                    hours.append(hour)
    return hours


def pack_hours(store: Store, now: dt.datetime) -> dict[str, Any]:
    """Beat's tick for the day under way: pack each of ``packable_hours``, an hour a transaction, while agents
    keep writing the day's partition. An open day's raw rows were most of what a GPU-day cost while it lasted
    (3.06 MB of rows against 0.72 MB packed); packed an hour at a time, it keeps the last one to three hours as rows.

    The partition is not locked against writers, who write its newest minutes all the while: the transaction is
    REPEATABLE READ, so the delete after the pack removes exactly the rows the pack read, and a sample written to
    the hour meanwhile stays a row for the next tick to fold in (readers see it beside the packed hour until
    then, as after a closed day's pack). A writer that changed a row of the hour since the pack began (a re-sent
    sample filling a field) makes the delete fail to serialize; the hour is left for the next tick, as it is
    when a writer's row lock outlasts ``PACK_LOCK_TIMEOUT``. Per hour packed: GPU-hour rows written, or the
    reason it was left."""
    from sqlalchemy.exc import OperationalError  # lazy: only for the failures a busy day's pack may meet

    done: dict[str, Any] = {}
    packed_days: set[dt.date] = set()
    with tracer().start_as_current_span("packing.pack_hours"):
        hours = packable_hours(store, now)
        for day in sorted({h.date() for h in hours}):
            with store.engine.begin() as conn:
                conn.execute(text(partitions.create_sql(packed.TABLE, day)))
        for hour in hours:
            day = hour.date()
            lock = {"n": partitions.partition_name(packed.TABLE, day)}
            with store.engine.connect() as conn:
                # One packer of a day at a time, held from before the transaction: its snapshot, taken by its first
                # statement, must not predate another packer's commit of the same hour.
                conn.execution_options(isolation_level="AUTOCOMMIT")
                conn.execute(text("SELECT pg_advisory_lock(hashtext(:n))"), lock)
                conn.commit()
                try:
                    conn.execution_options(isolation_level="REPEATABLE READ")
                    with conn.begin():
                        conn.execute(text(f"SET LOCAL lock_timeout = '{PACK_LOCK_TIMEOUT}'"))
                        _pack_hour(conn, day, hour)
                    done[hour.isoformat()] = "packed"
                    packed_days.add(day)
                    store.packed_changed()
                except OperationalError as exc:  # serialization failure, deadlock or lock timeout: the next tick tries again
                    done[hour.isoformat()] = f"left for the next tick: {type(exc.orig).__name__}"
                finally:
                    conn.rollback()
                    conn.execution_options(isolation_level="AUTOCOMMIT")
                    conn.execute(text("SELECT pg_advisory_unlock(hashtext(:n))"), lock)
                    conn.commit()
        for day in sorted(packed_days):
            # The packed hours' rows are dead in the partition agents write: vacuumed now, their space takes the next
            # hours' rows and reads of the live hours step over none of them (autovacuum waits for a fifth of the
            # partition, hours of it). Over 1,024 GPUs at the end of a day the last six hours' fleet panel took
            # 0.42 s with 17 packed hours' rows dead in it, 0.28 s vacuumed, 0.22 s before any was packed.
            with store.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
                conn.execute(text(f'VACUUM (ANALYZE) "{partitions.partition_name(packed.RAW, day)}"'))
    return done


def pack_closed(store: Store, now: dt.datetime, max_days: int = MAX_DAYS_PER_TICK) -> dict[str, Any]:
    """Beat's tick: pack the oldest ``max_days`` packable days; per day packed, its samples and rows."""
    done: dict[str, Any] = {}
    with tracer().start_as_current_span("packing.pack_closed"):
        for day in packable_days(store, now)[:max_days]:
            done[day.isoformat()] = pack_day(store, day)
    return done


# --- the per-GPU energy minutes (store.packed_energy) ---------------------------------------------------


def packable_energy_days(store: Store, now: dt.datetime, max_days: int = MAX_DAYS_PER_TICK) -> list[dt.date]:
    """The oldest ``max_days`` days whose energy minutes, held as rows, may be packed at ``now``: ended ``GRACE``
    ago and passed by the energy roll-up (its ten-minute re-roll is done with them)."""
    if store.dialect != "postgresql":
        return []
    with store.engine.connect() as conn:
        rolled = conn.execute(text(f"SELECT {packed_energy.newest_minute_sql(store.dialect)}")).scalar()
        if rolled is None:
            return []
        bound = min(now - GRACE, rolled + dt.timedelta(minutes=1))  # the end of the newest minute rolled
        days: list[dt.date] = []
        after = None
        while len(days) < max_days:
            # the next day holding rows, by the (minute, gpu_uuid) key: a year of packed days is not walked
            first = conn.execute(text("SELECT MIN(minute) FROM gpu_energy_minute" + ("" if after is None else " WHERE minute >= :a")),
                                 {} if after is None else {"a": after}).scalar()
            day = first.astimezone(dt.UTC).date() if first is not None else None
            if day is None or _day_end(day) > bound:
                break
            days.append(day)
            after = _day_end(day)
    return days


def pack_energy_day(store: Store, day: dt.date) -> dict[str, int]:
    """Pack ``day``'s energy minutes (with whatever was packed of its hours before) into per-GPU hourly rows, an
    hour per transaction: ``minutes`` packed, ``rows`` (GPU-hours) written."""
    start = dt.datetime.combine(day, dt.time(), dt.UTC)
    minutes = rows = 0
    for h in range(24):
        lo, hi = start + dt.timedelta(hours=h), start + dt.timedelta(hours=h + 1)
        with store.engine.begin() as conn:
            # one packer at a time; the roll-up's writes wait for the hour's pack, so none lands between its
            # copy and its delete (readers do not wait)
            conn.execute(text("SELECT pg_advisory_xact_lock(hashtext(:n))"), {"n": packed_energy.TABLE})
            conn.execute(text(f"LOCK TABLE {packed_energy.RAW} IN EXCLUSIVE MODE"))
            n = conn.execute(text(f"SELECT count(*) FROM {packed_energy.RAW} WHERE minute >= :a AND minute < :b"), {"a": lo, "b": hi}).scalar()
            if not n:
                continue
            merge = bool(conn.execute(text(f"SELECT EXISTS (SELECT 1 FROM {packed_energy.TABLE} WHERE hour = :a)"), {"a": lo}).scalar())
            for sql in packed_energy.pack_sql(lo, merge):
                result = conn.execute(text(sql))
                if sql.startswith("INSERT"):
                    rows += result.rowcount
            minutes += int(n)
    return {"minutes": minutes, "rows": rows}


def vacuum_energy(store: Store) -> None:
    """VACUUM (ANALYZE) the energy minutes' table after days of it were packed."""
    # The table is not partitioned: the packed days' rows are deleted, not dropped. Vacuumed now, their space
    # and index entries are reused at once (an autovacuum would be cancelled by each pack's lock), and the
    # next walk to the oldest minute does not step over a day of dead entries.
    with store.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text(f"VACUUM (ANALYZE) {packed_energy.RAW}"))


def pack_energy_closed(store: Store, now: dt.datetime, max_days: int = MAX_DAYS_PER_TICK) -> dict[str, Any]:
    """Beat's tick for the energy minutes: pack the oldest ``max_days`` packable days; per day, its minutes and rows."""
    with tracer().start_as_current_span("packing.pack_energy_closed"):
        done = {day.isoformat(): pack_energy_day(store, day) for day in packable_energy_days(store, now, max_days)}
        if done:
            vacuum_energy(store)
        return done


def backlog(store: Store, now: dt.datetime, max_days: int | None = None) -> list[tuple[str, dt.date]]:
    """Every closed day beat has still to pack at ``now``, oldest first, as ``(table, day)``: the raw samples'
    days, then the energy minutes' (at most ``max_days`` of each where given). Beat packs ``MAX_DAYS_PER_TICK``
    of each an hour, so after an outage, or the upgrade that brought packing to a store holding years of
    energy minutes, an operator packs the rest at once (``fleetscope db pack``)."""
    raw = packable_days(store, now)
    energy = packable_energy_days(store, now, max_days if max_days is not None else 1_000_000)
    return [(packed.RAW, d) for d in raw[:max_days]] + [(packed_energy.RAW, d) for d in energy]


ENERGY_VACUUM_EVERY_DAYS = 7
"""Energy days packed between two vacuums of the (unpartitioned) energy table while a backlog is packed."""


def pack_backlog(store: Store, todo: Iterable[tuple[str, dt.date]]) -> Iterator[tuple[str, dt.date, dict[str, int]]]:
    """Pack each ``(table, day)`` of ``backlog``, yielding each as it is done with what was packed; the energy table
    is vacuumed every ``ENERGY_VACUUM_EVERY_DAYS`` of its days and after its last."""
    energy_days = 0
    for table, day in todo:
        if table == packed.RAW:
            yield table, day, pack_day(store, day)
            continue
        done = pack_energy_day(store, day)
        energy_days += 1
        if energy_days % ENERGY_VACUUM_EVERY_DAYS == 0:
            vacuum_energy(store)
        yield table, day, done
    if energy_days % ENERGY_VACUUM_EVERY_DAYS:
        vacuum_energy(store)


def fill_bounds(store: Store) -> int:
    """Give the oldest and the newest packed hour's rows packed before migration 0028 their first and last sample
    times (``first_ts``, ``last_ts``), which the oldest and newest sample reads take from the row instead of the
    timestamps' array (``packed.min_ts_sql``, ``max_ts_sql``): an upgraded database fills them an hour at a time
    as retention and packing move those ends, rather than rewriting every packed row at the upgrade. The rows
    filled; 0 on SQLite or with nothing packed."""
    if store.dialect != "postgresql" or not partitions.is_partitioned(store.engine, packed.RAW):
        return 0
    filled = 0
    with store.engine.begin() as conn:
        ends = conn.execute(text(f"SELECT MIN(hour), MAX(hour) FROM {packed.TABLE}")).one()
        for hour in dict.fromkeys(h for h in ends if h is not None):
            # the hour as a literal, so that only its day's partition is asked
            filled += conn.execute(text(f"UPDATE {packed.TABLE} SET first_ts = ts[1], last_ts = ts[array_upper(ts, 1)]"
                                        f" WHERE hour = {packed.time_literal(hour)} AND first_ts IS NULL")).rowcount
    return filled


def scheduled_pack(store: Store, settings: Settings, *, now_iso: str | None = None) -> dict[str, Any]:
    """Beat's ``raw-packing`` (``services.scheduled``): ``pack_closed``, ``pack_hours`` and ``pack_energy_closed`` at
    ``now_iso``, else now, then ``fill_bounds``."""
    now = at(now_iso)
    out = {packed.RAW: pack_closed(store, now), "gpu_sample_hours": pack_hours(store, now), packed_energy.RAW: pack_energy_closed(store, now)}
    out["bounds_filled"] = fill_bounds(store)
    return out

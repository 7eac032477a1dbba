"""Roll-up tiers of GPU telemetry against the store: advancing them from their watermarks, and choosing the tier
a read of a range goes to.

The minute tier (``gpu_sample_minute``) is rolled from raw ``gpu_sample`` rows, the hour tier
(``gpu_sample_hour``) from the minute tier, by ``analyzers.tiers``. Each advances from its watermark
(``rollup_watermark``) over closed buckets only, so a tick reads what arrived since the last one and
never a whole window again; a minute closes ``SETTLE`` after its end (the energy roll-up, whose exact
figures the tier carries, re-rolls the last ten minutes each minute, so by then it has the minute).
Samples arriving later than that for a rolled minute stay in the raw tier only.

A read of a range asks ``choose_tier``: raw up to ``RAW_MAX_RANGE``, the minute tier up to
``MINUTE_MAX_RANGE``, the hour tier beyond, and never a tier whose retention no longer reaches the
range's start (README "Scale out").
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from typing import Any

import polars as pl
from sqlalchemy import select

from analyzers import tiers as tier_rollup
from fleetscope.core import frames as F
from fleetscope.core.tier_frames import GPU_SAMPLE_HOUR, GPU_SAMPLE_MINUTE
from fleetscope.core.units import as_utc
from fleetscope.observability import tracer
from fleetscope.services.analysis import at
from fleetscope.settings import Settings
from fleetscope.store import Store, packed, schema

SETTLE = dt.timedelta(minutes=3)
"""A minute is rolled this long after it ends."""
MAX_CHUNK = dt.timedelta(hours=1)
"""The most raw time one roll reads at once (a catch-up after an outage goes in chunks of this)."""
ROLL_ROWS = {"minute": 1_000_000, "hour": 250_000}
"""The most rows one read of a roll takes: raw samples for the minute tier (≈ 340 MB at 42 fields), minute-tier
rows for the hour tier (≈ 340 MB at 170 columns). A chunk is cut to fit (down to one bucket), and an hour of a
fleet larger still is read in ranges of GPUs: a catch-up roll of a day's hours of 16,384 GPUs read 23 M minute
rows at once and ran out of 24 GB, and at 100,000 GPUs one hour is 6 M."""
RAW_MAX_RANGE = dt.timedelta(hours=6)
MINUTE_MAX_RANGE = dt.timedelta(days=7)
TIER_TABLE = {"raw": "gpu_sample", "minute": "gpu_sample_minute", "hour": "gpu_sample_hour"}


BUCKET = {"minute": dt.timedelta(minutes=1), "hour": dt.timedelta(hours=1)}
"""The span of one bucket of each roll-up tier."""


def floor_to(t: dt.datetime, tier: str) -> dt.datetime:
    t = as_utc(t)
    return t.replace(second=0, microsecond=0) if tier == "minute" else t.replace(minute=0, second=0, microsecond=0)


def bucket_from(t: dt.datetime, tier: str) -> dt.datetime:
    """The start of ``tier``'s first whole bucket that starts at or after ``t``."""
    first = floor_to(t, tier)
    return first + BUCKET[tier] if first < as_utc(t) else first


def bucket_before(t: dt.datetime, tier: str) -> tuple[dt.datetime, dt.datetime]:
    """``[start, end)`` of ``tier``'s last whole bucket that ends at or before ``t``."""
    end = floor_to(t, tier)
    return end - BUCKET[tier], end


def watermark(store: Store, tier: str) -> dt.datetime | None:
    """Every bucket of ``tier`` before this instant is rolled; None before the first roll."""
    wm = schema.rollup_watermark
    with store.reader.connect() as conn:
        value = conn.execute(select(wm.c.rolled_to).where(wm.c.tier == tier)).scalar_one_or_none()
    return None if value is None else as_utc(value)


def _set_watermark(store: Store, tier: str, old: dt.datetime | None, new: dt.datetime, now: dt.datetime) -> None:
    wm = schema.rollup_watermark
    with store.engine.begin() as conn:
        if old is None:
            # two first rolls at once: the second's insert conflicts; its rows were the same (idempotent writes)
            existing = conn.execute(select(wm.c.rolled_to).where(wm.c.tier == tier)).scalar_one_or_none()
            if existing is None:
                conn.execute(wm.insert().values(tier=tier, rolled_to=new, rolled_at=now))
                return
        # compare-and-set: a watermark only moves forward
        conn.execute(wm.update().where(wm.c.tier == tier, wm.c.rolled_to < new).values(rolled_to=new, rolled_at=now))


def _first_time(store: Store, table: str, column: str, at_or_after: dt.datetime | None) -> dt.datetime | None:
    where, params = "", []
    if at_or_after is not None:
        where, params = f" WHERE {column} >= ?", [at_or_after]
    df = store.query(f"SELECT MIN({column}) AS t FROM {table}{where}", params, {"t": F.UTC_US}, small=True)
    t = df["t"][0] if df.height else None
    return None if t is None else as_utc(t)


def _rows(store: Store, tier: str, lo: dt.datetime, hi: dt.datetime) -> int:
    """How many rows a roll of ``tier`` over ``[lo, hi)`` reads: raw samples (minute tier) or minute rows (hour tier)."""
    source = (packed.source(store.dialect, lo, hi, (), packed_until=store.packed_until()) if tier == "minute"
              else "gpu_sample_minute WHERE bucket >= ? AND bucket < ?")
    params = [] if tier == "minute" else [lo, hi]
    return int(store.query(f"SELECT COUNT(*) AS n FROM {source}", params, {"n": pl.Int64}, small=True)["n"][0] or 0)


def _minute_rows(store: Store, lo: dt.datetime, hi: dt.datetime, per_hour: int) -> Iterator[pl.DataFrame]:
    """The minute-tier rows of ``[lo, hi)`` (whole hours), in ranges of GPUs of at most ``ROLL_ROWS["hour"]`` rows
    where an hour holds more (``per_hour``): split at the GPUs of the first minute, every range bounded by UUID so
    a GPU that minute lacks still falls in one."""
    cols = ", ".join(f'"{c}"' for c in GPU_SAMPLE_MINUTE.names)
    bounds: list[str] = []
    if per_hour > ROLL_ROWS["hour"]:
        first = store.query("SELECT gpu_uuid FROM gpu_sample_minute WHERE bucket = (SELECT MIN(bucket) FROM gpu_sample_minute"
                            " WHERE bucket >= ?) ORDER BY gpu_uuid", [lo], {"gpu_uuid": pl.String})["gpu_uuid"].to_list()
        per_range = max(1, len(first) * ROLL_ROWS["hour"] // per_hour)
        bounds = first[per_range::per_range]
    for a, b in zip([None, *bounds], [*bounds, None], strict=True):
        conds, params = ["bucket >= ?", "bucket < ?"], [lo, hi]
        for cond, value in (("gpu_uuid >= ?", a), ("gpu_uuid < ?", b)):
            if value is not None:
                conds.append(cond)
                params.append(value)
        yield store.query(f"SELECT {cols} FROM gpu_sample_minute WHERE {' AND '.join(conds)}", params, dict(GPU_SAMPLE_MINUTE.schema))


def _advance(store: Store, tier: str, bound: dt.datetime, now: dt.datetime, max_chunks: int) -> dict[str, Any]:
    """Roll ``tier``'s buckets from its watermark up to ``bound``, in chunks; the hour tier reads the minute tier."""
    source, column, chunk = ("gpu_sample", "ts", MAX_CHUNK) if tier == "minute" else ("gpu_sample_minute", "bucket", dt.timedelta(hours=24))
    spec = GPU_SAMPLE_MINUTE if tier == "minute" else GPU_SAMPLE_HOUR
    wm = watermark(store, tier)
    buckets = rows = chunks = 0
    while chunks < max_chunks:
        # a gap with no data is skipped in one step rather than rolled as empty chunks
        nxt = _first_time(store, source, column, wm)
        if nxt is None or floor_to(nxt, tier) >= bound:
            if wm is not None and wm < bound:
                _set_watermark(store, tier, wm, bound, now)
                wm = bound
            break
        lo = floor_to(nxt, tier) if wm is None else max(wm, floor_to(nxt, tier))
        per_step = _rows(store, tier, lo, lo + BUCKET[tier])
        hi = min(bound, lo + min(chunk, BUCKET[tier] * max(1, ROLL_ROWS[tier] // max(per_step, 1))))
        if tier == "minute":
            samples = store.read("gpu_sample", start=lo, end=hi)
            energy = store.read("gpu_energy_minute", start=lo, end=hi, columns=["minute", "gpu_uuid", "energy_j", "covered_s"])
            out = tier_rollup.minute_rollup(samples, energy)
        else:
            # an hour's GPUs in ranges, each rolled alone: a GPU's rows are all in one range
            parts = [tier_rollup.hour_rollup(rows) for rows in _minute_rows(store, lo, hi, per_step)]
            out = pl.concat(parts) if parts else GPU_SAMPLE_HOUR.empty()
        if out.height:
            store.write_frames([(spec, out)], source=f"tier_rollup:{tier}:{lo.isoformat()}")
        _set_watermark(store, tier, wm, hi, now)
        buckets += int((hi - lo).total_seconds() // (60 if tier == "minute" else 3600))
        wm, rows, chunks = hi, rows + out.height, chunks + 1
    return {"watermark": wm.isoformat() if wm else None, "buckets": buckets, "rows": rows, "chunks": chunks}


def advance(store: Store, now: dt.datetime, max_chunks: int = 24) -> dict[str, Any]:
    """Roll every closed bucket since each tier's watermark (minutes from raw, then hours from minutes), at most
    ``max_chunks`` chunks per tier per call; what each tier did. Idempotent: a bucket rolled twice is the same row."""
    now = as_utc(now)
    with tracer().start_as_current_span("tiers.advance"):
        minute = _advance(store, "minute", floor_to(now - SETTLE, "minute"), now, max_chunks)
        minute_wm = watermark(store, "minute")
        hour = (_advance(store, "hour", floor_to(minute_wm, "hour"), now, max_chunks) if minute_wm is not None
                else {"watermark": None, "buckets": 0, "rows": 0, "chunks": 0})
        return {"minute": minute, "hour": hour}


def scheduled_advance(store: Store, settings: Settings, *, now_iso: str | None = None) -> dict[str, Any]:
    """Beat's ``tier-rollup`` (``services.scheduled``): ``advance`` at ``now_iso``, else now."""
    return advance(store, at(now_iso))


def rolled_tiers(store: Store) -> frozenset[str]:
    """The tiers that have been rolled at least once (one small-table read)."""
    wm = schema.rollup_watermark
    with store.reader.connect() as conn:
        return frozenset(r[0] for r in conn.execute(select(wm.c.tier)))


def choose_tier(start: dt.datetime, end: dt.datetime, *, now: dt.datetime | None = None,
                retention_days: dict[str, int] | None = None, rolled: frozenset[str] | None = None) -> str:
    """The tier a read of ``[start, end)`` goes to: ``raw``, ``minute`` or ``hour`` (module docstring). With
    ``now`` and ``retention_days`` (tier -> days: raw, minute), a tier whose retention no longer reaches
    ``start`` is passed over for the next coarser one. With ``rolled`` (``rolled_tiers``), a tier never
    rolled falls back to the finer one that has been (in the end raw): no beat has run yet."""
    span = as_utc(end) - as_utc(start)
    tier = "raw" if span <= RAW_MAX_RANGE else "minute" if span <= MINUTE_MAX_RANGE else "hour"
    if now is not None and retention_days:
        order = ("raw", "minute", "hour")
        for name in order[order.index(tier):-1]:
            days = retention_days.get(name)
            if days is not None and as_utc(start) < as_utc(now) - dt.timedelta(days=days):
                tier = order[order.index(name) + 1]
    if rolled is not None:
        while tier != "raw" and tier not in rolled:
            tier = "minute" if tier == "hour" else "raw"
    return tier


def oldest(store: Store, tier: str) -> dt.datetime | None:
    """The oldest instant ``tier`` still holds (raw: its oldest sample, packed days included; a roll-up tier: its
    oldest bucket), by one indexed MIN read: what retention has left, whatever the settings say."""
    sql = packed.min_ts_sql(store.dialect) if tier == "raw" else f"(SELECT MIN(bucket) FROM {TIER_TABLE[tier]})"
    df = store.query(f"SELECT {sql} AS t", [], {"t": F.UTC_US}, small=True)
    return df["t"][0] if df.height else None


def tier_for(store: Store, start: dt.datetime, end: dt.datetime) -> str:
    """The tier a panel's read of ``[start, end)`` goes to: by the range (``choose_tier``), raw while no tier has
    been rolled, and passed over to a coarser tier that still holds ``start`` where retention has pruned this
    one past it (``FLEETSCOPE_MINUTE_TIER_RETENTION_DAYS`` shorter than the range's age), so a day of last year
    reads the hour tier rather than a pruned minute tier's nothing. Asks each tier's oldest instant only as far
    as it must: a read whose tier holds its start costs one indexed MIN."""
    tier = choose_tier(start, end, rolled=rolled_tiers(store))
    start = as_utc(start)
    order = ("raw", "minute", "hour")
    for name in order[order.index(tier):]:
        first = oldest(store, name)
        if first is not None and first <= start:
            return name
    # no tier reaches back to ``start`` (a young install): the range's choice stays
    return tier

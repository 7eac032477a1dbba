"""Reading a job's events for goodput: the input checks, step events' starts and data loading read from
their payloads, and :func:`compact_events`, the fold that keeps only the rows goodput reads (incremental
job analysis keeps its output between runs instead of every step event).

Step semantics follow Google's ``ml-goodput-measurement`` library (github.com/AI-Hypercomputer/
ml-goodput-measurement, ``goodput.py``): a bare step event marks the step's start, as its
``record_step_start_time`` does.

Pure: polars/numpy in, frames and arrays out.
"""

from __future__ import annotations

import json
import math
from datetime import datetime, timedelta, timezone

import numpy as np
import polars as pl

from fleetscope.core.frames import JOB_EVENT_KINDS, JOB_RECORD_KINDS, UTC_US

__all__ = ["US", "check_events", "compact_events", "epoch_us", "from_epoch_us", "one_job", "steps_from_events"]

_EVENT_COLUMNS = ("job_id", "ts", "kind")
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
US = 1_000_000  # microseconds per second: goodput's times are integer µs


def check_events(job_event: pl.DataFrame) -> pl.DataFrame:
    """Validate a job_event frame and return it sorted by time, with rank/step/payload filled in."""
    if not isinstance(job_event, pl.DataFrame):
        raise TypeError(f"job_event must be a polars DataFrame, not {type(job_event).__name__}")
    missing = [c for c in _EVENT_COLUMNS if c not in job_event.columns]
    if missing:
        raise ValueError(f"job_event frame lacks column(s) {', '.join(missing)}")
    if job_event.height == 0:
        raise ValueError("job_event frame is empty: no lifecycle events to compute goodput from")
    ev = job_event
    if ev.schema["ts"] != UTC_US:
        if not isinstance(ev.schema["ts"], pl.Datetime):
            raise ValueError(f"job_event.ts must be a UTC datetime column, got {ev.schema['ts']}")
        ts = pl.col("ts")
        ev = ev.with_columns((ts.dt.replace_time_zone("UTC") if ev.schema["ts"].time_zone is None
                              else ts.dt.convert_time_zone("UTC")).dt.cast_time_unit("us"))
    if ev["ts"].null_count():
        raise ValueError(f"job_event row {int(ev['ts'].is_null().arg_true()[0])}: missing ts")
    unknown = ev.filter(~pl.col("kind").is_in(list(JOB_EVENT_KINDS)) | pl.col("kind").is_null())
    if unknown.height:
        raise ValueError(f"unknown job event kind {unknown['kind'][0]!r} (expected one of {', '.join(JOB_EVENT_KINDS)})")
    # Records such as SDC replays can be stamped long after the job ended; they are not part of its timeline.
    ev = ev.filter(~pl.col("kind").is_in(list(JOB_RECORD_KINDS)))
    if ev.height == 0:
        raise ValueError("job_event frame holds no lifecycle events to compute goodput from")
    for col, dtype in (("rank", pl.Int64), ("step", pl.Int64), ("payload", pl.String)):
        if col not in ev.columns:
            ev = ev.with_columns(pl.lit(None, dtype).alias(col))
    ev = ev.with_columns(pl.col("rank").fill_null(-1))
    if ev.filter((pl.col("kind") == "step") & pl.col("step").is_null()).height:
        raise ValueError("a step event has no step number")
    # Events arrive from many ranks and transports out of order; time order is the only meaningful one.
    return ev.sort("ts", "kind", maintain_order=True)


def one_job(ev: pl.DataFrame) -> str:
    jobs = ev["job_id"].unique().to_list()
    if len(jobs) != 1:
        raise ValueError(f"job_event frame holds {len(jobs)} jobs ({', '.join(map(str, jobs[:5]))}); filter to one")
    return str(jobs[0])


def epoch_us(t: datetime) -> int:
    return (t - _EPOCH) // timedelta(microseconds=1)


def from_epoch_us(us: int) -> datetime:
    return _EPOCH + timedelta(microseconds=int(us))


def _payload_number(p: dict, key: str, where: str) -> float | None:
    v = p.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(float(v)) or v < 0:
        raise ValueError(f"{where}: payload {key} must be a finite number ≥ 0, got {v!r}")
    return float(v)


def _payload_time(p: dict, key: str, where: str) -> int | None:
    v = p.get(key)
    if v is None:
        return None
    if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(float(v)):
        return round(float(v) * US)
    if isinstance(v, str):
        try:
            return epoch_us(datetime.fromisoformat(v.replace("Z", "+00:00").replace("z", "+00:00")).astimezone(timezone.utc))
        except ValueError:
            pass
    raise ValueError(f"{where}: payload {key} is not a timestamp: {v!r}")


def _payload(text: str | None, where: str) -> dict:
    if text is None:
        return {}
    try:
        p = json.loads(text)
    except json.JSONDecodeError:
        raise ValueError(f"{where}: payload is not JSON") from None
    if not isinstance(p, dict):
        raise ValueError(f"{where}: payload is not a JSON object")
    return p


# --- step events ---------------------------------------------------------------------------------


_STEP_KEYS = ("start", "end", "duration_s", "data_loading_s")


def _step_row(ts: datetime, step: int, text: str | None, rank: int) -> tuple[int, float]:
    """(start µs, data loading s) of one step event, read the slow, exact way (``json.loads``); it raises
    the error that names the row when its payload is bad."""
    where = f"step event (step {step}, rank {rank})"
    p = _payload(text, where)
    start = _payload_time(p, "start", where)
    if start is None:
        end = _payload_time(p, "end", where)
        end = epoch_us(ts) if end is None else end
        dur = _payload_number(p, "duration_s", where)
        start = end - round(dur * US) if dur is not None else end
    return start, _payload_number(p, "data_loading_s", where) or 0.0


def steps_from_events(ev: pl.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(step, start µs, data loading s)`` arrays, one entry per step event in ``ev``'s order. A step's
    start is its payload ``start``, else ``ts − duration_s`` (``ts`` is the step's end in our schema), else
    ``ts`` itself: a bare step event marks the step's start, as the library's ``record_step_start_time``
    does.

    Payloads are read column-wise (a job reporting every rank's step sends ~10⁵ events an hour). A row
    goes to the exact per-row reader when the columnar one could read it differently: a payload that is
    not a plain JSON object, a key whose value is not a plain number (a string, a bool, NaN, a number
    beyond float range, a negative), or a ``start``/``end`` given as text."""
    st = ev.filter(pl.col("kind") == "step").select("ts", "step", "payload", "rank")
    n = st.height
    step = st["step"].cast(pl.Int64).to_numpy()
    ts_us = st["ts"].dt.epoch("us").to_numpy()
    if n == 0:
        return step, ts_us, np.zeros(0)
    # One parse per payload checks that it is a JSON object; only payloads that name one of the keys (most
    # carry just loss and norms) are parsed again for them.
    st = st.with_columns(pl.col("payload").str.json_path_match("$").alias("_doc"),
                         pl.any_horizontal([pl.col("payload").str.contains(c, literal=True)
                                            for c in (*(f'"{k}"' for k in _STEP_KEYS), "\\")]).alias("_keyed"))
    keyed = st.filter(pl.col("_keyed").fill_null(False)).select(
        "_doc",
        *(pl.col("_doc").str.json_path_match(f"$.{k}").alias(f"_raw_{k}") for k in _STEP_KEYS),
    ).with_columns(pl.col(f"_raw_{k}").cast(pl.Float64, strict=False).alias(k) for k in _STEP_KEYS)
    # a key's value is read as a number only when it is one: a float, finite, ≥ 0, and not a JSON string
    odd = pl.any_horizontal([pl.col(f"_raw_{k}").is_not_null()
                             & (pl.col(k).is_null() | ~pl.col(k).is_finite() | (pl.col(k) < 0)
                                | pl.col("_doc").str.contains(f'"{k}":"', literal=True))
                             for k in _STEP_KEYS])
    keyed = keyed.with_columns(odd.alias("_odd"))
    slow = st.select(pl.col("payload").is_not_null()
                     & (pl.col("_doc").is_null() | ~pl.col("_doc").str.starts_with("{"))).to_series().to_numpy().copy()
    at = np.flatnonzero(st["_keyed"].fill_null(False).to_numpy())
    slow[at] |= keyed["_odd"].to_numpy()
    f = {k: np.full(n, np.nan) for k in _STEP_KEYS}
    for k in _STEP_KEYS:
        f[k][at] = keyed[k].to_numpy()
    with np.errstate(invalid="ignore"):
        end = np.where(np.isnan(f["end"]), ts_us, np.round(np.nan_to_num(f["end"]) * US).astype(np.int64))
        start = np.where(np.isnan(f["duration_s"]), end,
                         end - np.round(np.nan_to_num(f["duration_s"]) * US).astype(np.int64))
        start = np.where(np.isnan(f["start"]), start, np.round(np.nan_to_num(f["start"]) * US).astype(np.int64))
    dl = np.nan_to_num(f["data_loading_s"])
    if slow.any():
        rows = st.select("ts", "step", "payload", "rank").rows()
        for i in np.flatnonzero(slow):
            start[i], dl[i] = _step_row(*rows[i])
    return step, start.astype(np.int64), dl.astype(float)



# --- the fold --------------------------------------------------------------------------------------


def compact_events(job_event: pl.DataFrame) -> pl.DataFrame:
    """The rows of ``job_event`` that :func:`goodput_timeline`, :func:`runtime_goodput`, :func:`scheduling_goodput`
    and the checkpoint advice's inputs (``analyzers.reliability``: ``checkpoint_costs``, ``job_exposure``,
    ``interruptions``) read the same way as the whole frame: every event but ``step`` events, and of those,

    - per stretch between two ``started``/``restart`` events (by start) and step number, the event with the
      earliest start, the first in time order on a tie: the one the timeline keeps for that step;
    - per stretch between two of those events by time, the latest: an attempt's last sign of life;
    - per rank, its first: the ranks seen;
    - every step event without a step number, and every step event of a frame with a payload the fast reader
      cannot read, so the error goodput raises on them is raised on the compacted frame too.

    A job reporting every rank's step sends ~10⁵ step events an hour and keeps ~10³ here. Compacting is a
    fold: ``compact_events(concat([compact_events(a), b]))`` reads like ``concat([a, b])`` as long as no
    ``started``/``restart`` event of ``b`` is earlier than a step event of ``a`` (a boundary arriving after
    the steps it precedes would cut a stretch whose earliest step was already chosen)."""
    require = [c for c in ("job_id", "ts", "kind", "rank", "step", "payload") if c not in job_event.columns]
    if require:
        raise ValueError(f"job_event frame lacks column(s) {', '.join(require)}")
    is_step = pl.col("kind") == "step"
    life = job_event.filter(~is_step | pl.col("kind").is_null())
    # time order as goodput_timeline reads them: its tie-break is the position in this order
    st = job_event.filter(is_step).sort("ts", maintain_order=True)
    if st.height == 0:
        return job_event
    unnumbered = st.filter(pl.col("step").is_null() | pl.col("ts").is_null())
    st = st.filter(pl.col("step").is_not_null() & pl.col("ts").is_not_null())
    try:
        step_no, start, _ = steps_from_events(st.with_columns(pl.col("rank").fill_null(-1)))
    except ValueError:
        return job_event
    bounds = np.sort(life.filter(pl.col("kind").is_in(["started", "restart"]))["ts"].dt.epoch("us").to_numpy())
    ts_us = st["ts"].dt.epoch("us").to_numpy()
    pos = np.arange(st.height)
    keep = np.zeros(st.height, dtype=bool)
    by_start = np.searchsorted(bounds, start, side="right") - 1
    order = np.lexsort((pos, start, step_no, by_start))
    first = np.ones(order.size, dtype=bool)
    first[1:] = (by_start[order][1:] != by_start[order][:-1]) | (step_no[order][1:] != step_no[order][:-1])
    keep[order[first]] = True
    by_ts = np.searchsorted(bounds, ts_us, side="right") - 1
    order = np.lexsort((pos, ts_us, by_ts))
    last = np.ones(order.size, dtype=bool)
    last[:-1] = by_ts[order][1:] != by_ts[order][:-1]
    keep[order[last]] = True
    rank = st["rank"].fill_null(-1).to_numpy()
    order = np.lexsort((pos, ts_us, rank))
    first = np.ones(order.size, dtype=bool)
    first[1:] = rank[order][1:] != rank[order][:-1]
    keep[order[first]] = True
    return pl.concat([life, unnumbered, st.filter(pl.Series(keep))], how="vertical_relaxed")

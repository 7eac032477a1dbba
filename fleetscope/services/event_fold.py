"""Incremental job analysis of a job's events: goodput, SDC screening and checkpoint advice folded from a
watermark, so that the per-minute analysis of a job that reports a ``step`` event per rank and step reads the
events that arrived since the last run, not the job's whole history (``services.job_fold`` does the same for
the step frame).

The fold. Every run reads the *tail*, the job's events at or after the watermark ``commit_ts`` (the
(job_id, ts, ...) primary key), and cuts it in two: the *open* part, the events of the last step and of any
step that has an event at or after the first of those (its ranks may still be reporting) with every event
after that time, and the *committed* part, everything before. The committed part is folded into the stored
state (``job_analysis_state``, analyzer ``events``) and the watermark moves to the cut; the open part is
folded into this run's copy only, and read again next time. The state holds:

- ``kept``: ``analyzers.goodput_events.compact_events`` of the committed events: every lifecycle and record event,
  and of the step events the few that goodput's timeline and the checkpoint advice read (per step the
  earliest, per attempt the last, per rank the first), from which they give what the whole history gives;
- ``screen``: ``analyzers.sdc_fold.ScreenFold``, the SDC screen's conclusions over the committed steps and each
  rank's last losses, from which the next steps' spike scores go on.

Goodput and checkpoint advice run their pure analyzers over ``kept`` and the open events; SDC screening
merges the open steps' signals into a copy of ``screen``. Each is exact: minute by minute gives what one
analysis of the whole history gives (``analyze_job(incremental=False)`` is the same fold from an empty state).

What the watermark cannot see: an event older than the watermark that arrives after its step was folded (a
rank reporting a step after the next step's first report was folded) is counted at the next full analysis.
A step number that comes again (a re-run after a restart) refolds the job from its start, once.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime as dt
import io
import json
from dataclasses import dataclass, field

import polars as pl

from analyzers import goodput_events, sdc, sdc_fold
from fleetscope.core import frames as F
from fleetscope.services import job_fold
from fleetscope.store import Store

STATE = "events"
"""The ``job_analysis_state.analyzer`` of the event fold."""


def _dt(us: int | None) -> dt.datetime | None:
    return None if us is None else dt.datetime.fromtimestamp(0, dt.UTC) + dt.timedelta(microseconds=us)


def _frame_text(df: pl.DataFrame) -> str:
    buf = io.BytesIO()
    df.write_ipc(buf, compression="lz4")
    return base64.b64encode(buf.getvalue()).decode()


def _frame_of(text: str) -> pl.DataFrame:
    return pl.read_ipc(io.BytesIO(base64.b64decode(text)))


def _us(t: dt.datetime | None) -> int | None:
    return None if t is None else (t - dt.datetime.fromtimestamp(0, dt.UTC)) // dt.timedelta(microseconds=1)


@dataclass
class EventState:
    """The folded events of one job (see the module docstring)."""

    commit_ts_us: int | None = None  # the tail is the events at or after this
    last_step: int | None = None  # the highest step folded
    kept: pl.DataFrame = field(default_factory=F.JOB_EVENT.empty)
    screen: sdc_fold.ScreenFold = field(default_factory=sdc_fold.ScreenFold)

    def to_json(self) -> str:
        s = self.screen
        return json.dumps({
            "commit_ts_us": self.commit_ts_us, "last_step": self.last_step, "kept": _frame_text(self.kept),
            "screen": {"signals": s.signals, "first_ts": _us(s.first_ts), "last_ts": _us(s.last_ts), "last_step": s.last_step,
                       **{k: _frame_text(v) for k, v in s.frames().items()}},
        }, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> EventState:
        d = json.loads(text)
        s = d["screen"]
        screen = sdc_fold.ScreenFold(signals=s["signals"], first_ts=_dt(s["first_ts"]), last_ts=_dt(s["last_ts"]), last_step=s["last_step"],
                                **{k: _frame_of(s[k]) for k in sdc_fold.ScreenFold().frames()})
        return cls(commit_ts_us=d["commit_ts_us"], last_step=d["last_step"], kept=_frame_of(d["kept"]), screen=screen)


def _load(store: Store, job_id: str) -> EventState | None:
    text = job_fold.load_state(store, job_id, STATE)
    return None if text is None else EventState.from_json(text)


def save(store: Store, job_id: str, state: EventState, now: dt.datetime) -> None:
    """Store the job's folded events (replacing what was there)."""
    job_fold.save_state(store, job_id, STATE, state.to_json(), now)


@dataclass
class EventView:
    """One run's view of a job's events: ``committed`` (stored after the run), ``events`` (the kept events and
    the open ones: what goodput and checkpoint advice read), ``screen`` (the SDC screen's fold with the open
    steps merged in) and ``rows`` (how many events those are: none, no event analysis)."""

    committed: EventState
    events: pl.DataFrame
    screen: sdc_fold.ScreenFold
    refolded: bool

    @property
    def rows(self) -> int:
        return self.events.height


def cut_us(tail: pl.DataFrame) -> int | None:
    """Where a tail of events splits into committed (before) and open (from here on), µs: the first event of
    the open steps, which are the last step and every step that has an event at or after the first event of
    an open step, or of a later step (ranks report a step at slightly different times; a step is committed
    whole, and steps in order). None when the tail has no step event (everything is committed)."""
    st = tail.filter((pl.col("kind") == "step") & pl.col("step").is_not_null())
    if st.height == 0:
        return None
    per = st.group_by("step").agg(pl.col("ts").min().dt.epoch("us").alias("lo"), pl.col("ts").max().dt.epoch("us").alias("hi")).sort("step")
    steps, lo, hi = per["step"].to_list(), per["lo"].to_list(), per["hi"].to_list()
    first_open = len(steps) - 1
    cut = min(lo[first_open:])
    while True:
        moved = next((i for i in range(first_open) if hi[i] >= cut), None)
        if moved is None:
            return cut
        first_open = moved
        cut = min(lo[first_open:])


def _read_from(store: Store, job_id: str, start_us: int | None) -> pl.DataFrame:
    # a tail is about a minute of the job's events: small unless the job is very wide (Store.read falls back)
    return store.read("job_event", job_id=job_id, start=_dt(start_us), small=True) if start_us is not None else store.read("job_event", job_id=job_id)


def _cases(events: pl.DataFrame) -> pl.DataFrame:
    return events.filter(pl.col("kind") == "sdc_rerun").select("job_id", "step", "rank").unique()


def _read_back_cases(store: Store, job_id: str, screen: sdc_fold.ScreenFold, cases: pl.DataFrame) -> sdc_fold.ScreenFold:
    """Rerun records naming a step folded before they came: read that step's events back (its time span is in
    the state) for the suspect rank's own checksum, once."""
    if cases.height == 0 or screen.last_step is None:
        return screen
    have = screen.case_signals.select("job_id", "step", "rank").unique()
    missing = cases.filter(pl.col("step") <= screen.last_step).join(have, on=["job_id", "step", "rank"], how="anti")
    if missing.height == 0:
        return screen
    spans = screen.step_span.join(missing.select("step").unique(), on="step")
    found = []
    for _, first, last in spans.iter_rows():
        ev = store.read("job_event", job_id=job_id, start=first, end=last + dt.timedelta(microseconds=1))
        found.append(sdc.step_signals(ev).join(missing, on=["job_id", "step", "rank"], how="semi"))
    if not found:
        return screen
    return dataclasses.replace(screen, case_signals=pl.concat([screen.case_signals, *found]))


def timeline_events(store: Store, job_id: str) -> pl.DataFrame:
    """The events goodput's timeline reads, as ``advance`` gives them, without folding or storing anything: the
    stored ``kept`` events and the tail since the watermark (the whole history where the job was never folded, or
    a step number came again), compacted (``analyzers.goodput_events.compact_events``). What a read that computes
    goodput on request (``job_reads.interval_goodput``) takes instead of every step event of every rank."""
    state, tail, _ = _state_and_tail(store, job_id, incremental=True)
    return goodput_events.compact_events(pl.concat([state.kept, tail], how="vertical_relaxed"))


def _state_and_tail(store: Store, job_id: str, *, incremental: bool) -> tuple[EventState, pl.DataFrame, bool]:
    """The stored fold (an empty one when not ``incremental`` or never folded), the events from its watermark, and
    whether that is a fold from the job's start: also where a step number already folded came again (a re-run
    after a restart)."""
    state = _load(store, job_id) if incremental else None
    refolded = state is None
    state = state or EventState()
    tail = _read_from(store, job_id, state.commit_ts_us)
    if state.last_step is not None and tail.filter((pl.col("kind") == "step") & (pl.col("step") <= state.last_step)).height:
        state, refolded = EventState(), True
        tail = _read_from(store, job_id, None)
    return state, tail, refolded


def advance(store: Store, job_id: str, *, incremental: bool) -> EventView:
    """Read the job's events from its watermark (everything when not ``incremental`` or never folded) and fold
    them: the committed part into the state to store, the open part into this run's view only."""
    state, tail, refolded = _state_and_tail(store, job_id, incremental=incremental)
    if tail.height == 0 and state.kept.height == 0:
        return EventView(state, state.kept, state.screen, refolded)
    cut = cut_us(tail)
    at = pl.col("ts").dt.epoch("us")
    committed, open_ = (tail, tail.clear()) if cut is None else (tail.filter(at < cut), tail.filter(at >= cut))
    cases = _cases(pl.concat([state.kept, tail], how="vertical_relaxed"))
    screen, result = sdc_fold.fold_screen_open(state.screen, sdc.step_signals(committed), sdc.step_signals(open_), cases)
    if committed.height:
        steps = [s for s in (committed.filter(pl.col("kind") == "step")["step"].max(), state.last_step) if s is not None]
        state = dataclasses.replace(
            state, kept=goodput_events.compact_events(pl.concat([state.kept, committed], how="vertical_relaxed")), screen=screen,
            last_step=int(max(steps)) if steps else None,
            commit_ts_us=cut if cut is not None else int(committed.select(at.max()).item()) + 1)
    read_back = _read_back_cases(store, job_id, state.screen, cases)
    if read_back is not state.screen:
        # the original runs read back go into this run's result too
        state = dataclasses.replace(state, screen=read_back)
        result = dataclasses.replace(result, case_signals=pl.concat([result.case_signals, read_back.case_signals]).unique(maintain_order=True))
    events = pl.concat([state.kept, open_], how="vertical_relaxed") if open_.height else state.kept
    return EventView(state, events, result, refolded)

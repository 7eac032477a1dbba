"""SDC screening folded step by step: what ``analyzers.sdc.screen`` concludes from a job's step signals,
carried across chunks of steps (``fold_screen``) so incremental job analysis screens each step once, and
read back as ``screen``'s result (``folded_screen``). The signals and their thresholds are ``analyzers.sdc``'s
(cross-replica checksums, Hampel-style loss spikes, NaN/Inf onset; its docstring cites their sources).

Pure: polars in, dataclasses and frames out.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import polars as pl

from analyzers.sdc import checksum_mismatches, metric_spikes, nonfinite_onset, rerun_report, sdc_findings, spike_rows
from fleetscope.core.frames import FINDING, UTC_US, require_columns

__all__ = ["SPIKE_WINDOW_STEPS", "ScreenFold", "fold_screen", "fold_screen_open", "folded_screen", "spikes_after"]

SPIKE_WINDOW_STEPS = 50
"""``metric_spikes``' window as ``screen`` runs it: a rank's loss is scored against its previous 50 values."""
_MIN_HISTORY = 10
"""``metric_spikes``' ``min_history``: a rank's loss is scored once it has 10 before it."""
_SIGNAL_TS = {"job_id": pl.String, "step": pl.Int64, "ts": UTC_US}


def _empty_signals() -> pl.DataFrame:
    return pl.DataFrame(schema={"job_id": pl.String, "rank": pl.Int64, "step": pl.Int64, "ts": UTC_US, "loss": pl.Float64,
                                "grad_norm": pl.Float64, "loss_nonfinite": pl.Boolean, "grad_norm_nonfinite": pl.Boolean,
                                "param_checksum": pl.String, "replica_group": pl.String})


@dataclass(frozen=True)
class ScreenFold:
    """What ``screen`` concludes from a job's step signals, folded step by step (``fold_screen``): everything
    in it is final once a step's signals are all in, except each rank's last ``SPIKE_WINDOW_STEPS`` losses,
    which the next steps' spike scores look back at.

    ``signals``/``first_ts``/``last_ts``: the signals screened and their time span; ``checksums``: the
    ``checksum_mismatches`` rows; ``step_ts``: the first signal time of each step with such a row (a suspect's
    time); ``spikes``: the ``metric_spikes`` rows (loss); ``nonfinite``: the ``nonfinite_onset`` row, once
    found; ``carry``: each rank's last losses; ``step_span``: each step's first and last signal time, so
    that a rerun record naming a folded step can have its original run read back; ``case_signals``: the
    signals of the (step, rank) of rerun records, kept as they are folded or read back."""

    signals: int = 0
    first_ts: Any = None
    last_ts: Any = None
    last_step: int | None = None
    checksums: pl.DataFrame = field(default_factory=lambda: checksum_mismatches(_empty_signals()))
    step_ts: pl.DataFrame = field(default_factory=lambda: pl.DataFrame(schema=_SIGNAL_TS))
    spikes: pl.DataFrame = field(default_factory=lambda: metric_spikes(_empty_signals(), "loss"))
    nonfinite: pl.DataFrame = field(default_factory=lambda: nonfinite_onset(_empty_signals()))
    carry: pl.DataFrame = field(default_factory=lambda: _empty_signals().select("job_id", "rank", "step", "ts", "loss"))
    step_span: pl.DataFrame = field(default_factory=lambda: pl.DataFrame(schema={"step": pl.Int64, "first_ts": UTC_US, "last_ts": UTC_US}))
    case_signals: pl.DataFrame = field(default_factory=_empty_signals)

    def frames(self) -> dict[str, pl.DataFrame]:
        return {k: getattr(self, k) for k in ("checksums", "step_ts", "spikes", "nonfinite", "carry", "step_span", "case_signals")}


def _signals_after(state: ScreenFold, signals: pl.DataFrame, what: str = "signals") -> pl.DataFrame:
    require_columns(signals, what, tuple(_empty_signals().columns))
    if signals.height and state.last_step is not None and int(signals["step"].min()) <= state.last_step:
        raise ValueError(f"{what} of step {int(signals['step'].min())} folded after step {state.last_step}: fold steps in order")
    return signals.select(_empty_signals().columns).cast(_empty_signals().schema)


def _spikes_of(state: ScreenFold, sig: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    """The loss spikes of ``sig``'s rows, scored against the carried losses (which go first), and the carried
    losses followed by ``sig``'s, by rank and step (``_by_rank``), from which the next carry is taken."""
    s = _by_rank(pl.concat([state.carry, sig.select("job_id", "rank", "step", "ts", "loss")]))
    return _spikes_after(s, state.last_step, 6.0), s


def _by_rank(losses: pl.DataFrame) -> pl.DataFrame:
    """The non-null losses in ``metric_spikes``' order: by job, rank and step."""
    return losses.filter(pl.col("loss").is_not_null()).sort("job_id", "rank", "step")


def _places(s: pl.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Each row's place in its rank's losses, from the first and from the last (``s`` in ``_by_rank`` order)."""
    first = np.ones(s.height, dtype=bool)
    if s.height:
        rank = s["rank"].to_numpy()
        first[1:] = (rank[1:] != rank[:-1]) | s["job_id"].ne_missing(s["job_id"].shift(1)).to_numpy()[1:]
    starts = np.flatnonzero(first)
    ends = np.append(starts[1:], s.height)
    group = np.cumsum(first) - 1
    index = np.arange(s.height)
    return index - starts[group], ends[group] - 1 - index


def spikes_after(losses: pl.DataFrame, after_step: int | None, *, threshold: float = 6.0) -> pl.DataFrame:
    """``metric_spikes(losses, "loss", window_steps=SPIKE_WINDOW_STEPS)``'s rows of the steps after
    ``after_step`` (all of them for None), computed for those rows only: the earlier ones (a rank's carried
    losses, about 50 of every 57 rows a minute folds) are read as baselines and not scored themselves.

    The same numbers: each scored row's window is its rank's previous ``SPIKE_WINDOW_STEPS`` losses, sorted,
    and the median and quartiles are picked from it as polars' rolling quantiles pick them (median: linear
    interpolation, ``f·(v[⌈i⌉] − v[⌊i⌋]) + v[⌊i⌋]`` at ``i = (n − 1)/2``; quartiles: the nearest rank,
    ``v[⌊(n − 1)q + ½⌋]``), then scored by ``metric_spikes``' own expressions (``spike_rows``). A NaN loss
    (which polars orders apart) sends the whole frame through ``metric_spikes``."""
    return _spikes_after(_by_rank(losses), after_step, threshold)


def _spikes_after(s: pl.DataFrame, after_step: int | None, threshold: float) -> pl.DataFrame:
    loss = s["loss"].to_numpy()
    if s.height == 0 or np.isnan(loss).any():
        spikes = metric_spikes(s, "loss", window_steps=SPIKE_WINDOW_STEPS, min_history=_MIN_HISTORY, threshold=threshold)
        return spikes if after_step is None else spikes.filter(pl.col("step") > after_step)
    w = SPIKE_WINDOW_STEPS
    pos, _ = _places(s)
    new = np.flatnonzero(s["step"].to_numpy() > after_step) if after_step is not None else np.arange(s.height)
    n = np.minimum(pos[new], w)  # losses before the row, at most a window of them
    back = np.arange(-w, 0)
    window = np.where(back[None, :] >= -n[:, None], loss[np.maximum(new[:, None] + back[None, :], 0)], np.inf)
    window.sort(axis=1)  # the n losses first, the +inf padding after
    rows = np.arange(new.size)
    nf = np.maximum(n, 1).astype(np.float64) - 1.0
    mid = nf * 0.5
    lo, hi = np.floor(mid).astype(np.int64), np.ceil(mid).astype(np.int64)
    v_lo, v_hi = window[rows, lo], window[rows, hi]
    with np.errstate(invalid="ignore"):
        median = np.where(lo == hi, v_lo, (mid - lo) * (v_hi - v_lo) + v_lo)
        iqr = window[rows, np.floor(nf * 0.75 + 0.5).astype(np.int64)] - window[rows, np.floor(nf * 0.25 + 0.5).astype(np.int64)]
    enough = pl.Series(n >= _MIN_HISTORY)
    scored = s[new].with_columns(pl.when(enough).then(pl.Series(median)).alias("baseline"), pl.when(enough).then(pl.Series(iqr)).alias("_iqr"))
    return spike_rows(scored, "loss", threshold=threshold)


def _carry(s: pl.DataFrame) -> pl.DataFrame:
    """Each rank's last ``SPIKE_WINDOW_STEPS`` losses of ``s`` (in ``_by_rank`` order)."""
    # a carried loss is a baseline, never a spike of its own: its time is not needed, and not kept
    _, from_last = _places(s)
    return s.filter(pl.Series(from_last < SPIKE_WINDOW_STEPS)).with_columns(pl.lit(None, UTC_US).alias("ts"))


def _merge(state: ScreenFold, sig: pl.DataFrame, cases: pl.DataFrame | None, spikes: pl.DataFrame, carry: pl.DataFrame) -> ScreenFold:
    if sig.height == 0:
        return state
    checks = checksum_mismatches(sig)
    step_ts = sig.join(checks.select("job_id", "step").unique(), on=["job_id", "step"]).group_by("job_id", "step").agg(pl.col("ts").min())
    nonfinite = state.nonfinite if state.nonfinite.height else nonfinite_onset(sig)
    span = sig.group_by("step").agg(pl.col("ts").min().alias("first_ts"), pl.col("ts").max().alias("last_ts"))
    case_rows = state.case_signals
    if cases is not None and cases.height:
        keys = cases.select("job_id", "step", "rank").unique()
        case_rows = pl.concat([case_rows, sig.join(keys, on=["job_id", "step", "rank"], how="semi")])
    return replace(
        state, signals=state.signals + sig.height,
        first_ts=sig["ts"].min() if state.first_ts is None else min(state.first_ts, sig["ts"].min()),
        last_ts=sig["ts"].max() if state.last_ts is None else max(state.last_ts, sig["ts"].max()),
        last_step=int(sig["step"].max()),
        checksums=pl.concat([state.checksums, checks]).sort("job_id", "step", "rank", maintain_order=True),
        step_ts=pl.concat([state.step_ts, step_ts.cast(_SIGNAL_TS)]),
        spikes=pl.concat([state.spikes, spikes]).sort("job_id", "step", "rank", maintain_order=True),
        nonfinite=nonfinite, carry=carry, step_span=pl.concat([state.step_span, span.cast(state.step_span.schema)]).sort("step"),
        case_signals=case_rows,
    )


def fold_screen(state: ScreenFold, signals: pl.DataFrame, cases: pl.DataFrame | None = None) -> ScreenFold:
    """Fold ``signals`` (``step_signals`` output: whole steps, all later than ``state.last_step``) into
    ``state``. Folding a job's steps chunk by chunk gives what ``screen`` gives over all of them at once:
    mismatches and the NaN onset are per step, and a spike's baseline is the rank's previous
    ``SPIKE_WINDOW_STEPS`` losses, which ``carry`` holds across chunks. ``cases``: (job_id, step, rank) of the
    job's rerun records, whose signals are kept for the rerun protocol's original runs."""
    sig = _signals_after(state, signals)
    if sig.height == 0:
        return state
    spikes, s = _spikes_of(state, sig)
    return _merge(state, sig, cases, spikes, _carry(s))


def fold_screen_open(state: ScreenFold, signals: pl.DataFrame, open_signals: pl.DataFrame,
                     cases: pl.DataFrame | None = None) -> tuple[ScreenFold, ScreenFold]:
    """``fold_screen`` of ``signals`` (the steps to keep) and, on from that, of ``open_signals`` (later steps,
    whose signals may not all be in yet), scoring both chunks' spikes in one pass: (``signals`` folded,
    both folded). The second is a result to read, not to fold on: its ``carry`` is the first's."""
    sig = _signals_after(state, signals)
    opened = _signals_after(state, open_signals, "open signals")
    if sig.height and opened.height and int(opened["step"].min()) <= int(sig["step"].max()):
        raise ValueError(f"open signals of step {int(opened['step'].min())} are not after the folded step {int(sig['step'].max())}")
    if sig.height + opened.height == 0:
        return state, state
    spikes, s = _spikes_of(state, pl.concat([sig, opened]))
    if sig.height:
        cut = int(sig["step"].max())
        state = _merge(state, sig, cases, spikes.filter(pl.col("step") <= cut), _carry(s.filter(pl.col("step") <= cut)))
        spikes = spikes.filter(pl.col("step") > cut)
    return state, _merge(state, opened, cases, spikes, state.carry)


def folded_screen(state: ScreenFold, job_event: pl.DataFrame, job_rank: pl.DataFrame | None = None) -> dict[str, pl.DataFrame | int | Any]:
    """``screen``'s conclusions from a folded state and the job's rerun records (``sdc_rerun`` events, in
    ``job_event``; its step events are not read): ``checksums``, ``spikes``, ``nonfinite``, ``records``,
    ``runs``, ``problems``, ``verdicts`` and ``findings`` as ``screen`` returns them, with ``steps_screened``
    (the height of ``screen``'s ``signals``) and ``first_ts``/``last_ts`` (their time span) in place of the
    signals themselves. The original runs of rerun cases are read from ``state.case_signals``."""
    rr = rerun_report(job_event.filter(pl.col("kind") == "sdc_rerun"), state.case_signals, state.checksums)
    jr = job_rank if job_rank is not None and job_rank.height else None
    chains = sdc_findings(checksums=state.checksums, spikes=state.spikes, nonfinite=state.nonfinite, job_rank=jr,
                          signals=state.step_ts,
                          reruns=rr["verdicts"] if rr["verdicts"].height else None)
    found = [f for f in (chains, rr["findings"]) if f.height]
    findings = pl.concat(found, how="vertical_relaxed") if found else FINDING.empty()
    return {"steps_screened": state.signals, "first_ts": state.first_ts, "last_ts": state.last_ts, "checksums": state.checksums,
            "spikes": state.spikes, "nonfinite": state.nonfinite, **rr, "findings": findings}

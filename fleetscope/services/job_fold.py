"""Incremental job analysis: a job's step-based analyses (C3 summary, stragglers, program goodput and the
straggler cost's energy) folded from a watermark, so that the per-minute analysis of a running job reads
what arrived since the last one, not the job's whole history.

The fold. A job's ``step`` rows are cut by step number: every run reads the *tail*, the rows whose start is
at or after the watermark ``commit_start`` (the (job_id, start) index), analyses it, and folds the steps below
the tail's last step into the stored state (``job_analysis_state``); the last step stays open, since its
other ranks may still be arriving, and is read again next time. The result is the stored state merged with
the open step. The state holds only mergeable figures whose merge is exact (``fleetscope.core.exact``):

- C3: per column the exact sum and count (means, and the C1/C2/C3 shares as ratios of exact sums), a DDSketch
  of the values (p50, p99 within 0.5 %: exact order statistics would need every value), the ranks seen and
  the number of steps; the collectives' network bytes (communication intensity) by start time;
- stragglers: the rank-steps scored and flagged; per rank ever flagged, its flagged steps' figures as a
  finding's evidence gives them (count, first and last time, the first ``EVIDENCE_STEPS`` steps, attribution
  counts, exact sums of the GPU-seconds lost, excess and median busy time, a sketch of the relative score for
  its median), and each rank's last ``PERSIST_M − 1`` flags, which is all the persistence rule looks back at;
  a step's score compares the ranks of that step only, so a step is scored alone;
- program goodput: the exact sums of model FLOPs and of the spans of the rank-steps that carry them;
- the straggler cost's energy: the job's GPU-minutes (``gpu_energy_minute``, attributed to its ranks) folded
  up to ``ENERGY_SETTLE`` before the run, since the energy roll-up still revises the last minutes.

Because each piece merges without rounding and every step is scored with all its ranks, folding minute by
minute gives bit for bit what one pass over the whole history gives (``analyze_job(incremental=False)``,
which is the same fold from an empty state, for ``POST /api/v1/jobs/{id}/analyze`` and the CLI).

What the watermark cannot see: a row older than the watermark that arrives after its step was folded (a
rank's step rows arriving more than a step late) is counted at the next full analysis. A re-run step (the
same step number again after a restart) reaching the tail refolds the job from its start, once.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import polars as pl
from sqlalchemy import select

from analyzers import c3, energy, stragglers
from fleetscope.core import frames as F
from fleetscope.core.exact import ExactSum, Sketch
from fleetscope.store import Store, schema

STATE = "steps"
"""The ``job_analysis_state.analyzer`` of the step-based fold."""
PERSIST_K, PERSIST_M = 3, 5
"""Straggler persistence: flagged in ``PERSIST_K`` of a rank's last ``PERSIST_M`` steps (detect_stragglers' defaults)."""
ENERGY_SETTLE = dt.timedelta(minutes=15)
"""GPU-minutes younger than this are re-read every run: the energy roll-up re-rolls the last ten minutes."""
C3_COLUMNS = ("step_s", "c1_compute_s", "c2_comm_s", "c3_coord_s", "f_compute")
_ENERGY_COLUMNS = ("minute", "gpu_uuid", "energy_j", "counter_energy_j", "integrated_energy_j", "covered_s")
"""What ``analyzers.energy.attribute_to_jobs`` reads of a GPU-minute."""
_US = 1_000_000
_MINUTE_US = 60 * _US


def _us(t: Any) -> int:
    return int(t.timestamp() * _US) if isinstance(t, dt.datetime) else int(t)


def _dt(us: int | None) -> dt.datetime | None:
    return None if us is None else dt.datetime.fromtimestamp(0, dt.UTC) + dt.timedelta(microseconds=us)


@dataclass
class StepState:
    """The folded step-based figures of one job (see the module docstring)."""

    commit_start_us: int | None = None  # the tail is the rows starting at or after this
    last_step: int | None = None  # the highest step folded
    n: dict[str, int] = field(default_factory=lambda: dict.fromkeys(C3_COLUMNS, 0))
    sums: dict[str, ExactSum] = field(default_factory=lambda: {c: ExactSum() for c in C3_COLUMNS})
    sketches: dict[str, Sketch] = field(default_factory=lambda: {c: Sketch() for c in C3_COLUMNS})
    ranks: set[int] = field(default_factory=set)
    steps: int = 0
    rows: int = 0
    first_start_us: int | None = None
    last_end_us: int | None = None
    network_bytes: ExactSum = field(default_factory=ExactSum)
    flops: ExactSum = field(default_factory=ExactSum)
    flops_rows: int = 0
    flops_span_us: int = 0
    flops_problem: str | None = None
    rank_steps: int = 0
    flagged: int = 0
    recent: dict[int, list[bool]] = field(default_factory=dict)
    flagged_ranks: dict[int, dict[str, Any]] = field(default_factory=dict)  # per rank ever flagged: its flagged steps' figures
    energy_from_us: int | None = None  # the energy window's first minute
    energy_to_us: int | None = None  # GPU-minutes before this are folded
    energy_j: ExactSum = field(default_factory=ExactSum)
    held_s: ExactSum = field(default_factory=ExactSum)

    def copy(self) -> StepState:
        return StepState.from_json(self.to_json())

    def to_json(self) -> str:
        return json.dumps({
            "commit_start_us": self.commit_start_us, "last_step": self.last_step, "n": self.n,
            "sums": {k: v.to_json() for k, v in self.sums.items()}, "sketches": {k: v.to_json() for k, v in self.sketches.items()},
            "ranks": sorted(self.ranks), "steps": self.steps, "rows": self.rows, "first_start_us": self.first_start_us,
            "last_end_us": self.last_end_us, "network_bytes": self.network_bytes.to_json(), "flops": self.flops.to_json(),
            "flops_rows": self.flops_rows, "flops_span_us": self.flops_span_us, "flops_problem": self.flops_problem,
            "rank_steps": self.rank_steps, "flagged": self.flagged, "recent": {str(k): v for k, v in self.recent.items()},
            "flagged_ranks": {str(k): _ranks_json(v) for k, v in self.flagged_ranks.items()}, "energy_from_us": self.energy_from_us, "energy_to_us": self.energy_to_us,
            "energy_j": self.energy_j.to_json(), "held_s": self.held_s.to_json(),
        }, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> StepState:
        d = json.loads(text)
        return cls(
            commit_start_us=d["commit_start_us"], last_step=d["last_step"], n={k: int(v) for k, v in d["n"].items()},
            sums={k: ExactSum.from_json(v) for k, v in d["sums"].items()}, sketches={k: Sketch.from_json(v) for k, v in d["sketches"].items()},
            ranks=set(d["ranks"]), steps=d["steps"], rows=d["rows"], first_start_us=d["first_start_us"], last_end_us=d["last_end_us"],
            network_bytes=ExactSum.from_json(d["network_bytes"]), flops=ExactSum.from_json(d["flops"]), flops_rows=d["flops_rows"],
            flops_span_us=d["flops_span_us"], flops_problem=d["flops_problem"], rank_steps=d["rank_steps"], flagged=d["flagged"],
            recent={int(k): list(v) for k, v in d["recent"].items()},
            flagged_ranks={int(k): _ranks_from_json(v) for k, v in d["flagged_ranks"].items()},
            energy_from_us=d["energy_from_us"], energy_to_us=d["energy_to_us"], energy_j=ExactSum.from_json(d["energy_j"]),
            held_s=ExactSum.from_json(d["held_s"]),
        )

    # --- folding a chunk of whole steps ------------------------------------------------------------

    def fold(self, steps: pl.DataFrame, collective: pl.DataFrame | None) -> pl.DataFrame:
        """Fold ``steps`` (whole steps, later than everything folded) with their collectives; returns the chunk's
        C3 breakdown."""
        if steps.height == 0:
            return pl.DataFrame()
        bd = c3.c3_breakdown(steps, collective)
        for col in C3_COLUMNS:
            v = bd[col].drop_nulls().drop_nans() if bd[col].dtype.is_float() else bd[col].drop_nulls()
            self.n[col] += v.len()
            self.sums[col] = self.sums[col] + ExactSum.of(v.to_numpy())
            self.sketches[col] = self.sketches[col] + Sketch.of(v.to_numpy())
        self.ranks.update(bd["rank"].unique().to_list())
        self.steps += bd["step"].n_unique()
        self.rows += steps.height
        lo, hi = _us(steps["start"].min()), _us(steps["end"].max())
        self.first_start_us = lo if self.first_start_us is None else min(self.first_start_us, lo)
        self.last_end_us = hi if self.last_end_us is None else max(self.last_end_us, hi)
        self.last_step = int(steps["step"].max()) if self.last_step is None else max(self.last_step, int(steps["step"].max()))
        self._fold_flops(steps)
        self._fold_stragglers(steps, collective, bd)
        return bd

    def _fold_flops(self, steps: pl.DataFrame) -> None:
        st = steps.filter(pl.col("model_flops").is_not_null())
        if st.height == 0:
            return
        if self.flops_problem is None and st.filter(pl.col("model_flops").is_nan() | (pl.col("model_flops") < 0)).height:
            self.flops_problem = "model_flops must be finite and ≥ 0 (got NaN or a negative value)"
        ok = st.filter(pl.col("model_flops").is_finite() & (pl.col("model_flops") >= 0))
        self.flops = self.flops + ExactSum.of(ok["model_flops"].to_numpy())
        self.flops_rows += st.height
        self.flops_span_us += int(st.select((pl.col("end") - pl.col("start")).dt.total_microseconds().sum()).item() or 0)

    def _fold_stragglers(self, steps: pl.DataFrame, collective: pl.DataFrame | None, breakdown: pl.DataFrame) -> None:
        det = stragglers.detect_stragglers(steps, collective, persist_k=PERSIST_K, persist_m=PERSIST_M, breakdown=breakdown)
        # Persistence looks back over the rank's previous steps, some scored by earlier chunks: redo the
        # rolling count over those flags (kept in ``recent``) followed by this chunk's, in step order.
        det = det.sort("rank", "step", "start", maintain_order=True).with_columns(_o=pl.int_range(pl.len()).over("rank").cast(pl.Int64))
        prior = pl.DataFrame([(r, i - len(flags), f) for r, flags in self.recent.items() for i, f in enumerate(flags)],
                             schema={"rank": pl.Int64, "_o": pl.Int64, "flagged": pl.Boolean}, orient="row")
        seq = pl.concat([prior, det.select("rank", "_o", "flagged")]).sort("rank", "_o").with_columns(
            _recent=pl.col("flagged").cast(pl.Int64).rolling_sum(PERSIST_M, min_samples=1).over("rank"))
        det = det.join(seq.filter(pl.col("_o") >= 0).select("rank", "_o", "_recent"), on=["rank", "_o"]).with_columns(
            persistent=pl.col("_recent") >= PERSIST_K)
        self.rank_steps += det.height
        self.flagged += int(det["flagged"].sum())
        hit = det.filter(pl.col("flagged")).with_columns(pl.col("start").dt.epoch("us"), pl.col("end").dt.epoch("us"))
        for (rank,), g in hit.group_by("rank"):
            f = self.flagged_ranks.setdefault(int(rank), {
                "n": 0, "start": None, "end": None, "steps": [], "attr": {}, "lost": ExactSum(), "excess": ExactSum(),
                "busy": ExactSum(), "score": Sketch(), "persistent": False})
            f["n"] += g.height
            lo, hi = int(g["start"].min()), int(g["end"].max())
            f["start"] = lo if f["start"] is None else min(f["start"], lo)
            f["end"] = hi if f["end"] is None else max(f["end"], hi)
            # chunks come in step order, so the first steps of all are the first of each chunk in turn
            f["steps"] = (f["steps"] + g["step"].sort().to_list())[:stragglers.EVIDENCE_STEPS]
            for a, c in g.group_by("attribution").len().iter_rows():
                f["attr"][a] = f["attr"].get(a, 0) + int(c)
            f["lost"] = f["lost"] + ExactSum.of(g["gpu_s_lost"].to_numpy())
            f["excess"] = f["excess"] + ExactSum.of(g["excess_s"].to_numpy())
            f["busy"] = f["busy"] + ExactSum.of(g["median_busy_s"].to_numpy())
            f["score"] = f["score"] + Sketch.of(g["relative_score"].to_numpy())
            f["persistent"] = f["persistent"] or bool(g["persistent"].any())
        for rank, flags in seq.group_by("rank", maintain_order=True).agg(pl.col("flagged").tail(PERSIST_M - 1)).iter_rows():
            self.recent[int(rank)] = [bool(f) for f in flags]

    def fold_network(self, collective: pl.DataFrame | None, lo_us: int | None, hi_us: int | None) -> None:
        """Fold the network bytes of the collectives starting in [lo, hi) (None: unbounded)."""
        if collective is None or collective.height == 0:
            return
        mu = pl.col("start").dt.epoch("us")
        c = collective
        if lo_us is not None:
            c = c.filter(mu >= lo_us)
        if hi_us is not None:
            c = c.filter(mu < hi_us)
        if c.height:
            self.network_bytes = self.network_bytes + ExactSum.of(c3.network_bytes_per_row(c).drop_nulls().drop_nans().to_numpy())

    # --- reading results -------------------------------------------------------------------------

    def c3_summary(self, job_id: str) -> dict[str, Any] | None:
        """The job's C3 summary, as ``analyzers.c3.job_summary`` shapes it (its p50 and p99 from the sketch)."""
        if self.rows == 0:
            return None
        out: dict[str, Any] = {"job_id": job_id}
        for col in C3_COLUMNS:
            n = self.n[col]
            out[f"{col}_mean"] = self.sums[col].ratio(n) if n else None
            out[f"{col}_p50"] = self.sketches[col].quantile(0.5)
            out[f"{col}_p99"] = self.sketches[col].quantile(0.99)
        ratios = [self.sums[k].ratio(self.sums["step_s"]) for k in ("c1_compute_s", "c2_comm_s", "c3_coord_s")]
        out.update(c1_ratio=ratios[0], c2_ratio=ratios[1], c3_ratio=ratios[2], ranks=len(self.ranks), steps=self.steps)
        finite = [(r, i) for i, r in enumerate(ratios) if r is not None and np.isfinite(r)]
        # the first of equal shares, as job_summary's nanargmax takes it
        dominant = ("C1", "C2", "C3")[max(finite, key=lambda t: (t[0], -t[1]))[1]] if finite else None
        flops = float(self.flops) if self.flops_rows else None
        out.update(dominant=dominant, advice=c3.ADVICE.get(dominant) if dominant else None,
                   comm_intensity_bytes_per_flop=c3.communication_intensity(float(self.network_bytes), flops) if flops is not None else None)
        return out

    def straggler_findings(self, job_id: str) -> pl.DataFrame:
        """``analyzers.stragglers.straggler_findings`` from the folded per-rank figures: one finding per rank that
        was ever persistent, over all its flagged steps (its median relative score from the sketch)."""
        hit = [(r, f) for r, f in self.flagged_ranks.items() if f["persistent"]]
        if not hit:
            return F.FINDING.empty()
        return stragglers.findings_of_ranks([{
            "job_id": job_id, "rank": r, "window_start": _dt(f["start"]), "window_end": _dt(f["end"]), "score": f["score"].quantile(0.5),
            "steps": f["steps"], "step_count": f["n"], "attribution_counts": dict(f["attr"]), "gpu_hours_lost": float(f["lost"]) / 3600.0,
            "mean_excess_s": f["excess"].ratio(f["n"]), "mean_median_busy_s": f["busy"].ratio(f["n"]),
        } for r, f in hit])

    def window(self) -> tuple[dt.datetime | None, dt.datetime | None]:
        return _dt(self.first_start_us), _dt(self.last_end_us)


def _ranks_json(f: dict[str, Any]) -> dict[str, Any]:
    return {**f, "lost": f["lost"].to_json(), "excess": f["excess"].to_json(), "busy": f["busy"].to_json(), "score": f["score"].to_json()}


def _ranks_from_json(d: dict[str, Any]) -> dict[str, Any]:
    return {**d, "lost": ExactSum.from_json(d["lost"]), "excess": ExactSum.from_json(d["excess"]), "busy": ExactSum.from_json(d["busy"]),
            "score": Sketch.from_json(d["score"])}


def load_state(store: Store, job_id: str, analyzer: str) -> str | None:
    """The stored state text of one of a job's incremental analyses (``job_analysis_state``), if any."""
    t = schema.job_analysis_state
    with store.engine.connect() as conn:
        return conn.execute(select(t.c.state).where(t.c.job_id == job_id, t.c.analyzer == analyzer)).scalar_one_or_none()


def save_state(store: Store, job_id: str, analyzer: str, text: str, now: dt.datetime) -> None:
    """Store the state text of one of a job's incremental analyses (replacing what was there)."""
    save_states(store, job_id, {analyzer: text}, now)


def save_states(store: Store, job_id: str, texts: Mapping[str, str], now: dt.datetime) -> None:
    """Store the state texts of several of a job's incremental analyses (analyzer: text), replacing what was
    there, in one transaction."""
    t = schema.job_analysis_state
    with store.engine.begin() as conn:
        conn.execute(t.delete().where(t.c.job_id == job_id, t.c.analyzer.in_(sorted(texts))))
        conn.execute(t.insert(), [{"job_id": job_id, "analyzer": a, "state": text, "updated_at": now} for a, text in sorted(texts.items())])


def _load(store: Store, job_id: str) -> StepState | None:
    text = load_state(store, job_id, STATE)
    return None if text is None else StepState.from_json(text)


def save(store: Store, job_id: str, state: StepState, now: dt.datetime) -> None:
    """Store the job's folded state (replacing what was there)."""
    save_state(store, job_id, STATE, state.to_json(), now)


@dataclass
class StepView:
    """One run's view of a job's steps: ``committed`` (stored after the run), ``result`` (committed merged with
    the open step: what the run reports) and ``breakdown`` (the C3 rows of the steps the run read)."""

    committed: StepState
    result: StepState
    breakdown: pl.DataFrame
    refolded: bool


def _read_from(store: Store, frame: str, job_id: str, start_us: int | None) -> pl.DataFrame:
    # a tail is about a minute of the job's rows: small unless the job is very wide (Store.read falls back)
    return store.read(frame, job_id=job_id, start=_dt(start_us), small=True) if start_us is not None else store.read(frame, job_id=job_id)


def advance(store: Store, job_id: str, *, incremental: bool) -> StepView:
    """Read the job's step tail from its watermark (everything when not ``incremental`` or never folded) and
    fold it: the closed steps into the state to store, the open last step into the run's result only."""
    state = _load(store, job_id) if incremental else None
    refolded = state is None
    state = state or StepState()
    tail = _read_from(store, "step", job_id, state.commit_start_us)
    if state.last_step is not None and tail.filter(pl.col("step") <= state.last_step).height:
        # a step number already folded came again (a re-run after a restart): fold the job from its start
        state, refolded = StepState(), True
        tail = store.read("step", job_id=job_id)
    if tail.height == 0:
        return StepView(state, state.copy(), pl.DataFrame(), refolded)
    colls = _read_from(store, "collective", job_id, state.commit_start_us)
    colls = colls if colls.height else None
    last = int(tail["step"].max())
    closed, open_ = tail.filter(pl.col("step") < last), tail.filter(pl.col("step") == last)
    cut_us = _us(open_["start"].min())
    bd_closed = state.fold(closed, colls)
    state.fold_network(colls, state.commit_start_us, cut_us)
    state.commit_start_us = cut_us
    result = state.copy()
    bd_open = result.fold(open_, colls)
    result.fold_network(colls, cut_us, None)
    bd = pl.concat([b for b in (bd_closed, bd_open) if b.height], how="vertical_relaxed")
    return StepView(state, result, bd, refolded)


def job_energy(store: Store, job_id: str, ranks: pl.DataFrame, view: StepView, now: dt.datetime) -> tuple[ExactSum, ExactSum]:
    """The energy (J) the job's ranks drew over its step window, and the GPU-seconds they held their GPUs
    (``analyzers.energy.attribute_to_jobs`` over ``gpu_energy_minute``), exact; GPU-minutes settled
    ``ENERGY_SETTLE`` before ``now`` are folded into the committed state, younger ones read every run."""
    c, r = view.committed, view.result
    lo = (r.first_start_us // _MINUTE_US) * _MINUTE_US
    hi = r.last_end_us + _MINUTE_US
    if c.energy_from_us != lo or c.energy_to_us is None:
        c.energy_from_us, c.energy_to_us, c.energy_j, c.held_s = lo, lo, ExactSum(), ExactSum()
    settled = max(c.energy_to_us, min(((_us(now) - int(ENERGY_SETTLE.total_seconds() * _US)) // _MINUTE_US) * _MINUTE_US, hi))
    # One read of the minutes that settle now and the unsettled ones after them, attributed once and split at
    # ``settled``: a GPU-minute's share depends on that minute and the ranks' intervals only, not on the
    # window read, and the sums are exact, so the split gives what two reads would.
    minutes = store.read("gpu_energy_minute", gpu_uuid=ranks["gpu_uuid"].unique().to_list(), start=_dt(c.energy_to_us), end=_dt(hi),
                         columns=_ENERGY_COLUMNS, small=True) if hi > c.energy_to_us else None
    mine = (energy.attribute_to_jobs(minutes, ranks).filter(pl.col("job_id") == job_id).with_columns(pl.col("minute").dt.epoch("us"))
            if minutes is not None and minutes.height else pl.DataFrame(schema={"minute": pl.Int64, "energy_j": pl.Float64, "allocated_s": pl.Float64}))

    def sums(part: pl.DataFrame) -> tuple[ExactSum, ExactSum]:
        return ExactSum.of(part["energy_j"].to_numpy()), ExactSum.of(part["allocated_s"].to_numpy())

    e, h = sums(mine.filter(pl.col("minute") < settled))
    c.energy_j, c.held_s, c.energy_to_us = c.energy_j + e, c.held_s + h, settled
    e, h = sums(mine.filter(pl.col("minute") >= settled))
    return c.energy_j + e, c.held_s + h

"""Running the job analyzers against the store: read a job's frames, call the pure analyzers, write what
they conclude (per-step C3 breakdowns, per-job summaries, findings) as one Batch.

This is service layer: it touches the store and the clock; ``analyzers/`` stays pure.
"""

from __future__ import annotations

import datetime as dt
import json
import math
from dataclasses import dataclass, field
from typing import Any

import polars as pl

from analyzers import c3, carbon, energy, goodput, reliability, sdc, sdc_fold, stragglers
from fleetscope.core import frames as F
from fleetscope.services import event_fold, job_fold
from fleetscope.services.analysis import Registry
from fleetscope.services.energy_rollup import floor_minute
from fleetscope.observability import tracer
from fleetscope.store import Store
import numpy as np
from fleetscope.core.units import as_utc
from fleetscope.store.reads import duration_s_sql, fetch, json_number_sql
from analyzers.c3 import fit_fleet_law
from analyzers.c3 import scaling_efficiency


def json_safe(value: Any) -> Any:
    """JSON-safe: NaN and infinities become null (JSON has neither), datetimes ISO strings."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dt.datetime):
        return value.isoformat()
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


@dataclass
class JobAnalysis:
    job_id: str
    c3: dict[str, Any] | None = None
    goodput: dict[str, Any] | None = None
    stragglers: list[dict[str, Any]] = field(default_factory=list)
    sdc: list[dict[str, Any]] = field(default_factory=list)
    sdc_reruns: list[dict[str, Any]] = field(default_factory=list)
    checkpoint: dict[str, Any] | None = None
    whatif: dict[str, Any] | None = None
    notes: list[str] = field(default_factory=list)
    batch: F.Batch | None = None

    def to_dict(self) -> dict[str, Any]:
        return json_safe({"job_id": self.job_id, "c3": self.c3, "goodput": self.goodput, "stragglers": self.stragglers,
                          "sdc": self.sdc, "sdc_reruns": self.sdc_reruns, "checkpoint": self.checkpoint, "whatif": self.whatif,
                          "notes": self.notes})


@dataclass
class JobRun:
    """One job's analysis in progress: what each registered analysis reads (each frame once) and adds to."""

    store: Store
    job_id: str
    now: dt.datetime
    out: JobAnalysis
    batch: F.Batch
    rows: list[dict[str, Any]] = field(default_factory=list)  # job_analysis rows
    incremental: bool = False
    _frames: dict[str, pl.DataFrame] = field(default_factory=dict)
    _steps: job_fold.StepView | None = None
    _events: event_fold.EventView | None = None

    def steps(self) -> job_fold.StepView:
        """The job's steps folded (``services.job_fold``): from its watermark when ``incremental``, else from its
        start; the step-based analyses read this, never the step frame whole."""
        if self._steps is None:
            self._steps = job_fold.advance(self.store, self.job_id, incremental=self.incremental)
        return self._steps

    def events(self) -> event_fold.EventView:
        """The job's events folded (``services.event_fold``): from its watermark when ``incremental``, else from
        its start; goodput, SDC screening and checkpoint advice read this, never the job_event frame whole."""
        if self._events is None:
            self._events = event_fold.advance(self.store, self.job_id, incremental=self.incremental)
        return self._events

    def has_rows(self, frame: str) -> bool:
        if frame == "step":
            return self.steps().result.rows > 0
        if frame == "job_event":
            return self.events().rows > 0
        return self.read(frame).height > 0

    def read(self, frame: str) -> pl.DataFrame:
        """The job's rows of ``frame``, read once per run."""
        if frame not in self._frames:
            self._frames[frame] = self.store.read(frame, job_id=self.job_id)
        return self._frames[frame]

    def maybe(self, frame: str) -> pl.DataFrame | None:
        df = self.read(frame)
        return df if df.height else None

    def record(self, analyzer: str, start: Any, end: Any, result: Any) -> None:
        self.rows.append(_analysis_row(self.job_id, analyzer, self.now, start, end, result))

    def findings(self, found: pl.DataFrame) -> None:
        _add_findings(self.batch, found)


JOB: Registry[JobRun] = Registry("job", skip_notes={
    "step": "no step data: C3 and straggler analysis skipped",
    "job_event": "no job events: goodput, SDC screening and checkpoint advice skipped",
})
"""The per-job analyses, in the order they run (``services.analysis``)."""


@JOB.register("c3", modules=("analyzers.c3",), reads=("step", "collective"), writes=("step_breakdown", "job_analysis"), needs=("step",),
              summary="per-step compute / communication / coordination breakdown and the job's C3 summary")
def _c3(r: JobRun) -> None:
    view = r.steps()
    if view.breakdown.height:
        r.batch.step_breakdown = view.breakdown.select([c for c in F.STEP_BREAKDOWN.names if c in view.breakdown.columns])
    r.out.c3 = view.result.c3_summary(r.job_id)
    r.record("c3", *view.result.window(), r.out.c3)


@JOB.register("stragglers", modules=("analyzers.stragglers", "analyzers.energy", "analyzers.carbon"),
              reads=("step", "collective", "job_rank", "gpu_energy_minute", "host", "site"), writes=("finding", "job_analysis"),
              needs=("step",), summary="persistent slow ranks with their attribution (compute, communication, host), priced in energy and CO2e")
def _stragglers(r: JobRun) -> None:
    view = r.steps()
    res = view.result
    findings = res.straggler_findings(r.job_id)
    if findings.height:
        price, note = _folded_energy_price(r.store, r.job_id, view, r.now)
        if price is not None:
            findings = stragglers.price_findings(findings, price)
        else:
            r.out.notes.append(note)
        r.findings(findings)
    r.out.stragglers = findings.select("subject", "kind", "severity", "score", "summary").to_dicts()
    r.record("stragglers", *res.window(), {"findings": r.out.stragglers, "rank_steps": res.rank_steps, "flagged": res.flagged})


@JOB.register("goodput", modules=("analyzers.goodput",), reads=("job_event", "step", "job_rank", "gpu"),
              writes=("job_analysis", "metric_sample"), needs=("job_event",),
              summary="runtime, scheduling and program goodput (MFU) and their product, with badput by cause")
def _goodput(r: JobRun) -> None:
    events = r.events().events
    finished = events.filter(pl.col("kind") == "finished").height > 0
    until = None if finished else r.now
    try:
        rg = goodput.runtime_goodput(events, until=until)
    except ValueError as exc:
        r.out.notes.append(f"goodput not computed: {exc}")
        return
    try:
        sched = goodput.scheduling_goodput(events, until=until)
    except ValueError:
        sched = None
    r.out.goodput = {"goodput_ratio": rg.goodput_ratio, "scheduling_goodput_ratio": sched, "total_s": rg.total_s,
                     "productive_s": rg.productive_s, "badput_s": rg.badput_s, "badput_ratio": rg.badput_ratio,
                     "last_step": rg.last_step, "disruptions": rg.disruptions, "finished": finished}
    r.out.goodput.update(_program_goodput(r.store, r.job_id, r.steps().result, sched, rg.goodput_ratio, r.out.notes))
    r.record("goodput", rg.window_start, rg.window_end, r.out.goodput)
    r.batch.metric_sample = goodput_series(r.job_id, r.now, rg.goodput_ratio, r.out.goodput)


@JOB.register("sdc", modules=("analyzers.sdc",), reads=("job_event", "job_rank"), writes=("finding", "job_analysis"), needs=("job_event",),
              summary="silent-data-corruption screen of per-step checksums, loss and grad norm, and rerun verdicts")
def _sdc(r: JobRun) -> None:
    """Silent-data-corruption screening from the per-step payloads (checksums, loss, grad norm) and the
    rerun protocol's records; suspects and rerun verdicts become findings."""
    view = r.events()
    s = sdc_fold.folded_screen(view.screen, view.events, r.read("job_rank"))
    if s["steps_screened"] == 0 and s["records"].height == 0:
        return
    found = s["findings"]
    r.findings(found)
    out = r.out
    out.sdc = found.select("subject", "kind", "severity", "summary").to_dicts() if found.height else []
    out.sdc_reruns = [{k: v[k] for k in ("case_id", "suspect_gpu", "verdict", "reason")} for v in s["verdicts"].to_dicts()]
    out.notes.extend(f"SDC rerun case {p['case_id']} not judged: {p['problem']}" for p in s["problems"].to_dicts())
    times = pl.concat([s["records"].select("ts"), pl.DataFrame({"ts": [s["first_ts"], s["last_ts"]]}, schema={"ts": F.UTC_US})])["ts"]
    r.record("sdc", times.min(), times.max(), {"findings": out.sdc, "steps_screened": s["steps_screened"], "reruns": out.sdc_reruns,
                                               "rerun_problems": s["problems"].to_dicts()})


@JOB.register("checkpoint", modules=("analyzers.reliability",), reads=("job_event", "job"), writes=("finding", "job_analysis"),
              needs=("job_event",), summary="Young/Daly checkpoint interval from the job's measured save cost and its own MTBF")
def _checkpoint(r: JobRun) -> None:
    """Young/Daly checkpoint advice from the job's measured save cost and its own MTBF."""
    events = r.events().events.filter(~pl.col("kind").is_in(list(F.JOB_RECORD_KINDS)))
    if events.height == 0:
        return
    costs = reliability.checkpoint_costs(events).filter(pl.col("saves") > 0)
    if costs.height == 0:
        return
    advice = reliability.checkpoint_advice(costs, reliability.fleet_mtbf(events, r.maybe("job")))
    if advice.height == 0:
        return
    r.out.checkpoint = advice.row(0, named=True)
    start, end = events["ts"].min(), events["ts"].max()
    r.findings(reliability.checkpoint_findings(advice, window_start=start, window_end=end))
    r.record("checkpoint", start, end, r.out.checkpoint)


# No ``needs``: most jobs record no operations, and a job without them is not worth a note.
@JOB.register("whatif", modules=("analyzers.stragglers",), reads=("job_op", "job", "step"), writes=("finding", "job_analysis"),
              summary="straggler what-if: the job's step time with every operation at its ideal duration")
def _whatif(r: JobRun) -> None:
    """The straggler what-if over the job's recorded operations (``job_op``), where they were ingested."""
    ops = r.read("job_op")
    if ops.height == 0:
        return
    job = r.read("job")
    first, last = r.steps().result.window()
    world = job["world_size"][0] if job.height else None
    try:
        w = stragglers.whatif(ops, {"world_size": world} if world else None)
    except ValueError as exc:
        r.out.notes.append(f"what-if not computed: {exc}")
        return
    start = first if first is not None else ops["ts"].min()
    end = last
    r.out.whatif = whatif_summary(w)
    r.findings(stragglers.whatif_findings(w, job_id=r.job_id, window_start=start, window_end=end))
    r.record("whatif", start, end, r.out.whatif)


def analyze_job(store: Store, job_id: str, *, now: dt.datetime | None = None, incremental: bool = False) -> JobAnalysis:
    """Analyse one job from what the store holds: every analysis of the ``JOB`` registry in turn. Parts
    without data are skipped with a note, not an error.

    ``incremental`` (beat's per-minute analysis of active jobs): the step-based analyses read only the steps
    since the job's watermark and merge them with the stored partial results (``services.job_fold``), so the
    run's cost does not grow with the job's age; the results are the same as a full analysis's, which folds
    the job from its start."""
    now = now or dt.datetime.now(dt.UTC)
    out = JobAnalysis(job_id=job_id)
    run = JobRun(store, job_id, now, out, F.Batch(source=f"analysis:{job_id}"), incremental=incremental)
    with tracer().start_as_current_span("analysis.job") as span:
        span.set_attribute("fleetscope.job_id", job_id)
        span.set_attribute("fleetscope.incremental", incremental)
        JOB.run_all(run, run.has_rows, out.notes.append)
        if run.rows:
            run.batch.job_analysis = pl.DataFrame(run.rows, schema=F.JOB_ANALYSIS.schema)
            store.write(run.batch)
        if run._steps is not None:
            span.set_attribute("fleetscope.refolded", run._steps.refolded)
            if run._steps.committed.rows:
                job_fold.save(store, job_id, run._steps.committed, now)
        if run._events is not None and run._events.committed.kept.height:
            event_fold.save(store, job_id, run._events.committed, now)
        out.batch = run.batch
    return out


GOODPUT_SERIES = "job_goodput_ratio"
"""The series the ``JobGoodputLow`` rule reads and ``/metrics/fleet`` exposes: a job's runtime goodput
ratio as of each analysis (labels: job_id)."""
MFU_SERIES = "job_mfu_ratio"
"""A job's program goodput (model FLOPs utilisation) as of each analysis (labels: job_id)."""
GOODPUT_PRODUCT_SERIES = "job_goodput_product_ratio"
"""A job's ML Productivity Goodput, scheduling × runtime × program goodput (labels: job_id)."""


def goodput_series(job_id: str, ts: dt.datetime, goodput_ratio: float | None,
                   result: dict[str, Any] | None = None) -> pl.DataFrame | None:
    """``metric_sample`` rows at the analysis time: ``job_goodput_ratio{job_id}``, and from ``result`` (the
    stored goodput analysis) ``job_mfu_ratio`` and ``job_goodput_product_ratio`` where they were computed;
    none for a ratio that is undefined (a job with no elapsed time yet, no model FLOPs)."""
    result = result or {}
    values = {GOODPUT_SERIES: goodput_ratio, MFU_SERIES: result.get("mfu_ratio"),
              GOODPUT_PRODUCT_SERIES: result.get("goodput_product_ratio")}
    rows = [(F.series_key(name, {"job_id": job_id}), float(v)) for name, v in values.items()
            if isinstance(v, (int, float)) and math.isfinite(v)]
    if not rows:
        return None
    return pl.DataFrame({"ts": [ts] * len(rows), "series": [k for k, _ in rows], "value": [v for _, v in rows]},
                        schema=F.METRIC_SAMPLE.schema)


TRAINING_DTYPE = "bf16"
"""The data type MFU is measured against: the step frame carries model FLOPs but not the precision they
ran in, and mixed-precision training runs its matrix multiplies in bf16 (the convention of the PaLM
paper's MFU, Chowdhery et al. 2022, appendix B, and of Megatron-LM's reports)."""


def _program_goodput(store: Store, job_id: str, steps: job_fold.StepState, scheduling: float | None, runtime: float | None,
                     notes: list[str]) -> dict[str, Any]:
    """Program goodput (MFU) from the steps' model FLOPs and the peak of the GPU model the job's ranks ran
    on (``analyzers.goodput.program_goodput``'s formula over the folded sums), and the ML Productivity
    Goodput product where all three factors exist. Missing inputs leave the figures out with a note saying
    which."""
    out: dict[str, Any] = {"mfu_ratio": None, "goodput_product_ratio": None, "peak_flops": None, "gpu_model": None,
                           "mfu_dtype": TRAINING_DTYPE}
    if steps.flops_rows == 0:
        notes.append("no step carries model_flops: program goodput (MFU) not computed")
        return out
    ranks = store.read("job_rank", job_id=job_id)
    gpus = store.read("gpu", gpu_uuid=ranks["gpu_uuid"].unique().to_list()) if ranks.height else pl.DataFrame()
    models = sorted(set(gpus["model_name"].drop_nulls().to_list())) if gpus.height else []
    if not models:
        notes.append("the job's GPUs have no model name in the inventory: program goodput (MFU) not computed")
        return out
    peaks = {}
    for m in models:
        try:
            peaks[m] = goodput.gpu_peak_flops(goodput.peak_table_name(m), TRAINING_DTYPE)
        except ValueError as exc:
            notes.append(f"program goodput (MFU) not computed: {exc}")
            return out
    # a job on mixed models is held to the slowest one's peak: synchronous steps run at its pace
    model = min(peaks, key=peaks.get)
    try:
        mfu = goodput.program_goodput_of(float(steps.flops), steps.flops_span_us / 1e6, peak_flops=peaks[model], problem=steps.flops_problem)
    except ValueError as exc:
        notes.append(f"program goodput (MFU) not computed: {exc}")
        return out
    out.update(mfu_ratio=mfu, peak_flops=peaks[model], gpu_model=model)
    if scheduling is not None and runtime is not None and math.isfinite(runtime):
        try:
            out["goodput_product_ratio"] = goodput.ml_productivity_goodput(scheduling, runtime, min(mfu, 1.0))
        except ValueError as exc:
            notes.append(f"ML Productivity Goodput not computed: {exc}")
    else:
        notes.append("scheduling or runtime goodput undefined: ML Productivity Goodput not computed")
    return out




def whatif_summary(r: stragglers.WhatIfResult) -> dict[str, Any]:
    """A what-if result as stored and served: the job-level figures, the per-rank (worker) and per-stage
    and per-data-parallel-rank slowdowns, and the per-step replay."""
    return {
        "slowdown": r.slowdown, "m_w": r.m_w, "m_s": r.m_s, "verdict": r.verdict, "culprits": r.culprits,
        "top_workers": r.top_workers, "measured_step_s": r.measured_step_s, "simulated_step_s": r.simulated_step_s,
        "ideal_step_s": r.ideal_step_s, "world_size": r.world_size, "steps_analysed": r.steps_analysed,
        "steps_dropped": r.steps_dropped, "gpu_hours_lost": r.gpu_hours_lost,
        "by_worker": r.by_worker.rename({"score": "slowdown"}).to_dicts(),
        "by_stage": r.by_stage.to_dicts(), "by_dp_rank": r.by_dp_rank.to_dicts(), "per_step": r.per_step.to_dicts(),
    }


def _add_findings(batch: F.Batch, found: pl.DataFrame) -> None:
    if found.height:
        batch.finding = found if batch.finding is None else pl.concat([batch.finding, found], how="vertical_relaxed")






def energy_price(store: Store, job_id: str, start: dt.datetime, end: dt.datetime) -> tuple[stragglers.EnergyPrice | None, str]:
    """What one GPU-hour of ``job_id`` cost over [start, end]: its mean GPU power from the energy roll-ups of
    the GPUs its ranks held, the grid intensity of the site most of its ranks ran at (annual table; world
    average when the site is unknown), and that site's declared PUE. (None, why) when no roll-up covers it."""
    ranks = store.read("job_rank", job_id=job_id)
    if ranks.height == 0:
        return None, "no rank-to-GPU assignments: straggler cost left in GPU-hours"
    minutes = store.read("gpu_energy_minute", gpu_uuid=ranks["gpu_uuid"].unique().to_list(),
                         start=floor_minute(start), end=end + dt.timedelta(minutes=1))
    mine = energy.attribute_to_jobs(minutes, ranks).filter(pl.col("job_id") == job_id) if minutes.height else minutes
    held_s = float(mine["allocated_s"].sum()) if mine.height else 0.0
    return _price(store, ranks, float(mine["energy_j"].sum()) if mine.height else 0.0, held_s)


def _folded_energy_price(store: Store, job_id: str, view: job_fold.StepView, now: dt.datetime) -> tuple[stragglers.EnergyPrice | None, str]:
    """``energy_price`` over the job's step window, its energy folded from the job's watermark (``services.job_fold``)."""
    ranks = store.read("job_rank", job_id=job_id)
    if ranks.height == 0:
        return None, "no rank-to-GPU assignments: straggler cost left in GPU-hours"
    energy_j, held_s = job_fold.job_energy(store, job_id, ranks, view, now)
    return _price(store, ranks, float(energy_j), float(held_s), power_w=energy_j.ratio(held_s))


def _price(store: Store, ranks: pl.DataFrame, energy_j: float, held_s: float,
           power_w: float | None = None) -> tuple[stragglers.EnergyPrice | None, str]:
    if held_s <= 0:
        return None, "no energy roll-ups for the job's GPUs in its window: straggler cost left in GPU-hours"
    power_w = energy_j / held_s if power_w is None else power_w
    sites = (ranks.join(store.read("host", host=ranks["host"].drop_nulls().unique().to_list()), on="host", how="inner")
             .group_by("site_id").len().sort("len", "site_id", descending=[True, False]))
    site = store.read("site").filter(pl.col("site_id") == sites["site_id"][0]) if sites.height else pl.DataFrame()
    if site.height:
        hit = carbon.site_intensity(site).row(0, named=True)
        g, g_basis = hit["g_per_kwh"], f"annual {hit['year']} ({hit['intensity_match']} of site {hit['site_id']}): {hit['intensity_source']}"
        pue = site["declared_pue"][0]
    else:
        world = carbon.site_intensity(pl.DataFrame({"site_id": ["?"]})).row(0, named=True)
        g, g_basis, pue = world["g_per_kwh"], f"annual {world['year']} world average (job's site unknown): {world['intensity_source']}", None
    price = stragglers.EnergyPrice(
        power_w=power_w, power_basis=f"measured: the job's mean GPU power over {held_s / 3600:.3g} GPU-hours of energy roll-ups",
        g_per_kwh=g, intensity_basis=g_basis, pue=pue, pue_basis="declared by the site" if pue is not None else "",
    )
    return price, ""


def _analysis_row(job_id: str, analyzer: str, now: dt.datetime, start: Any, end: Any, result: Any) -> dict[str, Any]:
    return {"job_id": job_id, "analyzer": analyzer, "computed_at": now, "window_start": start, "window_end": end,
            "result": json.dumps(json_safe(result), sort_keys=True, default=str)}


def job_exists(store: Store, job_id: str) -> bool:
    """Whether anything (inventory, steps or events) was ingested under ``job_id``."""
    return any(store.read(frame, job_id=job_id, columns=["job_id"], limit=1).height for frame in ("job", "step", "job_event", "job_op"))


def active_jobs(store: Store, *, since: dt.datetime) -> list[str]:
    """Jobs with steps, events or what-if operations since ``since``: the ones whose analysis may have changed."""
    jobs: set[str] = set()
    for frame in ("step", "job_event", "job_op"):
        jobs.update(store.read(frame, start=since, columns=["job_id"])["job_id"].unique().to_list())
    return sorted(jobs)


def stored_analysis(store: Store, job_id: str, analyzer: str) -> dict[str, Any] | None:
    rows = store.read("job_analysis", job_id=job_id).filter(pl.col("analyzer") == analyzer)
    if rows.height == 0:
        return None
    r = rows.row(0, named=True)
    return {"job_id": job_id, "analyzer": analyzer, "computed_at": r["computed_at"].isoformat(),
            "window_start": r["window_start"].isoformat() if r["window_start"] else None,
            "window_end": r["window_end"].isoformat() if r["window_end"] else None, "result": json.loads(r["result"])}


def job_sdc(store: Store, job_id: str) -> dict[str, Any]:
    """A job's SDC screen as JSON-ready data, computed from what the store holds now: the suspects (one
    evidence chain each), checksum disagreements (ties included), single-rank spikes, the NaN/Inf onset, and
    the rerun protocol — records, per-case verdicts with every run, and cases that could not be judged."""
    s = sdc.screen(store.read("job_event", job_id=job_id), store.read("job_rank", job_id=job_id))
    suspects = s["findings"].filter(pl.col("kind") != "sdc_rerun").to_dicts()
    for f in suspects:
        f["evidence"] = json.loads(f["evidence"])
    # a verdict's evidence chain (every run, the expected answer, the reason) is what its finding stores
    verdicts = [{**json.loads(f["evidence"]), "severity": f["severity"]}
                for f in s["findings"].filter(pl.col("kind") == "sdc_rerun").sort("window_start").to_dicts()]
    return json_safe({
        "job_id": job_id, "steps_screened": s["signals"].height, "suspects": suspects,
        "checksum_mismatches": s["checksums"].to_dicts(), "spikes": s["spikes"].to_dicts(), "nonfinite": s["nonfinite"].to_dicts(),
        "reruns": {"records": s["records"].to_dicts(), "verdicts": verdicts, "problems": s["problems"].to_dicts()},
    })


# --- reads (the dashboard's, the API's and the CLI's) ---------------------------------------


UTC = F.UTC_US


_JOB_COLS = ("job_id", "name", "kind", "model_name", "world_size", "site_id", "owner", "status", "started_at", "ended_at")


def jobs(store: Store, start: dt.datetime, end: dt.datetime, site: str | None = None, limit: int = 500) -> pl.DataFrame:
    """Jobs whose run overlaps ``[start, end)`` (jobs with unknown times too), newest first, with
    ``goodput_ratio`` (runtime goodput) from the goodput analyzer's stored analysis, where it has run."""
    params: list[Any] = [as_utc(end), as_utc(start)]
    where = "(j.started_at IS NULL OR j.started_at < ?) AND (j.ended_at IS NULL OR j.ended_at >= ?)"
    if site is not None:
        where += " AND j.site_id = ?"
        params.append(site)
    cols = ", ".join(f"j.{c}" for c in _JOB_COLS)
    sql = (
        f"SELECT {cols}, (SELECT {json_number_sql(store, 'a.result', 'goodput_ratio')} FROM job_analysis a"
        " WHERE a.job_id = j.job_id AND a.analyzer = 'goodput') AS goodput_ratio"
        # (started_at IS NULL) first: both databases then put jobs of unknown start last.
        f" FROM job j WHERE {where} ORDER BY (j.started_at IS NULL), j.started_at DESC, j.job_id LIMIT {int(limit)}"
    )
    return fetch(store, sql, params, {**{c: F.JOB.schema[c] for c in _JOB_COLS}, "goodput_ratio": pl.Float64})


def running_jobs(store: Store, end: dt.datetime, site: str | None = None, limit: int = 200) -> pl.DataFrame:
    """Jobs running at ``end``: started, not ended (by time or by a terminal status)."""
    df = jobs(store, end - dt.timedelta(seconds=1), end, site, limit)
    done = ("finished", "failed", "cancelled", "canceled", "preempted", "completed")
    return df.filter(pl.col("started_at").is_not_null() & pl.col("ended_at").is_null() & ~pl.col("status").fill_null("").str.to_lowercase().is_in(done))


def job_step_summary(store: Store, job_id: str, max_steps: int = 2000) -> pl.DataFrame:
    """Per step of a job, averaged over its ranks (the last ``max_steps`` steps):

    ``step, ranks, start, step_mean_s, step_max_s, compute_mean_s, comm_exposed_mean_s, idle_mean_s,
    overlap_mean_s, tokens, model_flops``. compute + exposed communication + idle = step time (docs/ARCHITECTURE.md's
    C³ model, before a collective's wait is split from its transfer).
    """
    dur = duration_s_sql(store, '"start"', '"end"')
    sql = (
        f"SELECT step, COUNT(*) AS ranks, MIN(\"start\") AS start, AVG({dur}) AS step_mean_s, MAX({dur}) AS step_max_s,"
        " AVG(compute_s) AS compute_mean_s, AVG(comm_s - COALESCE(comm_overlap_s, 0)) AS comm_exposed_mean_s,"
        " AVG(idle_s) AS idle_mean_s, AVG(comm_overlap_s) AS overlap_mean_s, SUM(tokens) AS tokens, SUM(model_flops) AS model_flops"
        f" FROM step WHERE job_id = ? GROUP BY step ORDER BY step DESC LIMIT {int(max_steps)}"
    )
    schema = {
        "step": pl.Int64,
        "ranks": pl.Int64,
        "start": UTC,
        "step_mean_s": pl.Float64,
        "step_max_s": pl.Float64,
        "compute_mean_s": pl.Float64,
        "comm_exposed_mean_s": pl.Float64,
        "idle_mean_s": pl.Float64,
        "overlap_mean_s": pl.Float64,
        "tokens": pl.Int64,
        "model_flops": pl.Float64,
    }
    return fetch(store, sql, [job_id], schema).sort("step")


def job_rank_step_times(store: Store, job_id: str, last_steps: int = 50, max_ranks: int = 256) -> pl.DataFrame:
    """Per rank and step over a job's last ``last_steps`` steps: ``rank, ranks_in_cell, step, step_s,
    compute_s, idle_s``.

    In synchronous training every rank's step lasts as long as the slowest rank's, so a straggler shows
    in compute time (high) and in the others' idle time (they wait for it), not in step time. Above
    ``max_ranks`` ranks, neighbouring ranks share a cell (``rank`` is the first of them) holding the
    largest step and compute time and the smallest idle time, so a straggler still stands out and the
    heatmap stays drawable.
    """
    bounds = fetch(
        store, "SELECT MAX(step) AS last, MAX(rank) AS top FROM step WHERE job_id = ?", [job_id], {"last": pl.Int64, "top": pl.Int64}
    )
    schema = {"rank": pl.Int64, "ranks_in_cell": pl.Int64, "step": pl.Int64, "step_s": pl.Float64, "compute_s": pl.Float64, "idle_s": pl.Float64}
    if bounds.is_empty() or bounds["last"][0] is None:
        return pl.DataFrame(schema=schema)
    last, top = int(bounds["last"][0]), int(bounds["top"][0])
    per_cell = max(1, math.ceil((top + 1) / max(1, max_ranks)))
    dur = duration_s_sql(store, '"start"', '"end"')
    sql = (
        f"SELECT (rank / {per_cell}) * {per_cell} AS rank, COUNT(DISTINCT rank) AS ranks_in_cell, step,"
        f" MAX({dur}) AS step_s, MAX(compute_s) AS compute_s, MIN(idle_s) AS idle_s"
        " FROM step WHERE job_id = ? AND step > ? GROUP BY 1, 3 ORDER BY 1, 3"
    )
    return fetch(store, sql, [job_id, last - int(last_steps)], schema)


def job_rank_summary(store: Store, job_id: str, last_steps: int = 50) -> pl.DataFrame:
    """Per rank over a job's last steps, slowest first: ``rank, host, steps, step_mean_s, compute_mean_s,
    idle_mean_s, slowdown_ratio`` (the rank's mean compute time over the median rank's: a straggler
    computes longer while the others idle waiting for it). A raw view until the straggler analyzer lands."""
    bounds = fetch(store, "SELECT MAX(step) AS last FROM step WHERE job_id = ?", [job_id], {"last": pl.Int64})
    schema = {"rank": pl.Int64, "steps": pl.Int64, "step_mean_s": pl.Float64, "compute_mean_s": pl.Float64, "idle_mean_s": pl.Float64}
    out_schema = {"rank": pl.Int64, "host": pl.String, **{k: v for k, v in schema.items() if k != "rank"}, "slowdown_ratio": pl.Float64}
    if bounds.is_empty() or bounds["last"][0] is None:
        return pl.DataFrame(schema=out_schema)
    dur = duration_s_sql(store, '"start"', '"end"')
    df = fetch(
        store,
        f"SELECT rank, COUNT(*) AS steps, AVG({dur}) AS step_mean_s, AVG(compute_s) AS compute_mean_s, AVG(idle_s) AS idle_mean_s"
        " FROM step WHERE job_id = ? AND step > ? GROUP BY rank",
        [job_id, int(bounds["last"][0]) - int(last_steps)],
        schema,
    )
    hosts = fetch(
        store, "SELECT rank, MAX(host) AS host FROM job_rank WHERE job_id = ? GROUP BY rank", [job_id], {"rank": pl.Int64, "host": pl.String}
    )
    median = df["compute_mean_s"].median() if df.height else None
    return (
        df.join(hosts, on="rank", how="left")
        .with_columns(slowdown_ratio=pl.col("compute_mean_s") / median if median else pl.lit(None, pl.Float64))
        .select(list(out_schema))
        .sort(["slowdown_ratio", "rank"], descending=[True, False], nulls_last=True)
    )


def job_totals(store: Store, job_id: str) -> pl.DataFrame:
    """One row for a job: ``steps, ranks, step_mean_s, tokens, model_flops, collective_bytes,
    comm_intensity_bytes_per_flop`` (network bytes / model FLOPs, docs/ARCHITECTURE.md's CI)."""
    dur = duration_s_sql(store, '"start"', '"end"')
    s = fetch(
        store,
        f"SELECT COUNT(DISTINCT step) AS steps, COUNT(DISTINCT rank) AS ranks, AVG({dur}) AS step_mean_s,"
        " SUM(tokens) AS tokens, SUM(model_flops) AS model_flops FROM step WHERE job_id = ?",
        [job_id],
        {"steps": pl.Int64, "ranks": pl.Int64, "step_mean_s": pl.Float64, "tokens": pl.Int64, "model_flops": pl.Float64},
    )
    c = fetch(store, "SELECT SUM(bytes) AS collective_bytes FROM collective WHERE job_id = ?", [job_id], {"collective_bytes": pl.Int64})
    out = pl.concat([s, c], how="horizontal")
    return out.with_columns(
        comm_intensity_bytes_per_flop=pl.when(pl.col("model_flops") > 0)
        .then(pl.col("collective_bytes").cast(pl.Float64) / pl.col("model_flops"))
        .otherwise(None)
    )


def scaling(store: Store, model_name: str) -> pl.DataFrame:
    """Runs of one model at different world sizes: ``job_id, world_size, step_time_mean_s,
    efficiency_ratio`` (η = T1 / (N · T_N), relative to the smallest run when there is no 1-GPU run)."""

    dur = duration_s_sql(store, 's."start"', 's."end"')
    df = fetch(
        store,
        f"SELECT j.job_id, j.world_size, AVG({dur}) AS step_time_mean_s FROM job j JOIN step s ON s.job_id = j.job_id"
        " WHERE j.model_name = ? AND j.world_size IS NOT NULL GROUP BY j.job_id, j.world_size ORDER BY 2, 1",
        [model_name],
        {"job_id": pl.String, "world_size": pl.Int64, "step_time_mean_s": pl.Float64},
    ).filter(pl.col("step_time_mean_s") > 0)
    if df.is_empty():
        return df.with_columns(efficiency_ratio=pl.lit(None, pl.Float64))
    eff = scaling_efficiency(df["world_size"].to_list(), df["step_time_mean_s"].to_list())
    # scaling_efficiency sorts by world size (stably), as df already is.
    return df.with_columns(efficiency_ratio=eff["efficiency"])


def job_analyses(store: Store, job_id: str) -> dict[str, dict[str, Any]]:
    """The analyzers' stored summaries of a job (``fleetscope.services.jobs``: c3, goodput, stragglers, sdc,
    checkpoint), keyed by analyzer: each the parsed ``result`` plus ``computed_at``, ``window_start`` and
    ``window_end``. Empty before the job has been analysed."""
    df = fetch(
        store,
        "SELECT analyzer, computed_at, window_start, window_end, result FROM job_analysis WHERE job_id = ?",
        [job_id],
        {"analyzer": pl.String, "computed_at": UTC, "window_start": UTC, "window_end": UTC, "result": pl.String},
    )
    out: dict[str, dict[str, Any]] = {}
    for row in df.iter_rows(named=True):
        try:
            result = json.loads(row["result"]) if row["result"] else {}
        except ValueError:
            result = {}
        out[row["analyzer"]] = {**(result if isinstance(result, dict) else {"value": result}),
                                "computed_at": row["computed_at"], "window_start": row["window_start"], "window_end": row["window_end"]}
    return out


def job_c3_steps(store: Store, job_id: str, max_steps: int = 2000) -> pl.DataFrame:
    """Per step of a job, averaged over its ranks, from the C³ analyzer's stored breakdown
    (``step_breakdown``, analyzers.c3.c3_breakdown; the last ``max_steps`` steps): ``step, ranks,
    step_mean_s, c1_compute_s, c2_comm_s, c3_coord_s, f_compute``. C1 + C2 + C3 = step time; unlike the
    raw step records, a collective's wait for its last peer is in C3 (coordination), not in C2."""
    sql = (
        "SELECT step, COUNT(*) AS ranks, AVG(step_s) AS step_mean_s, AVG(c1_compute_s) AS c1_compute_s, AVG(c2_comm_s) AS c2_comm_s,"
        " AVG(c3_coord_s) AS c3_coord_s, AVG(f_compute) AS f_compute"
        f" FROM step_breakdown WHERE job_id = ? GROUP BY step ORDER BY step DESC LIMIT {int(max_steps)}"
    )
    schema = {k: pl.Float64 for k in ("step_mean_s", "c1_compute_s", "c2_comm_s", "c3_coord_s", "f_compute")}
    return fetch(store, sql, [job_id], {"step": pl.Int64, "ranks": pl.Int64, **schema}).sort("step")

# How far either side of the runs the fitted curve is drawn, in factors of the world size.
_FIT_SPAN = 2.0


def scaling_fit(store: Store, model_name: str, points: int = 64, comm_term: str = "ring") -> dict[str, Any]:
    """The Fleet Law fitted to the runs of one model (analyzers.c3.fit_fleet_law: T_step(N) = a/N +
    b·f(N) + c, ring all-reduce f(N) = 2(N−1) by default), for the Jobs page:

    - ``runs``: ``scaling(store, model_name)`` (measured step time and η per run);
    - ``fit``: ``a_s, b_s, c_s, r2, n_opt`` and ``comm_term``, or None with ``why`` when there are fewer than
      three distinct world sizes or the fit fails;
    - ``curve``: ``world_size, step_time_s, efficiency_ratio`` predicted at ``points`` world sizes spread
      log-evenly from half the smallest run to twice the largest (or past N*, where the curve turns up),
      η relative to the same baseline as the runs' η;
    - ``n_opt``: the world size with the shortest predicted step, past which adding GPUs makes every step
      slower (inf when the fitted curve has no minimum).
    """

    runs = scaling(store, model_name)
    out: dict[str, Any] = {"runs": runs, "fit": None, "why": None,
                           "curve": pl.DataFrame(schema={"world_size": pl.Float64, "step_time_s": pl.Float64, "efficiency_ratio": pl.Float64})}
    sizes = runs["world_size"].n_unique() if runs.height else 0
    if sizes < 3:
        out["why"] = f"{sizes} distinct world size{'s' if sizes != 1 else ''} of {model_name}; the fit needs three"
        return out
    try:
        fit = fit_fleet_law(runs["world_size"].to_list(), runs["step_time_mean_s"].to_list(), comm_term=comm_term)
    except ValueError as exc:
        out["why"] = str(exc)
        return out
    lo = max(1.0, float(runs["world_size"].min()) / _FIT_SPAN)
    hi = float(runs["world_size"].max()) * _FIT_SPAN
    if math.isfinite(fit.n_opt):
        hi = max(hi, fit.n_opt * 1.5)
    # The runs' own world sizes are points of the curve too, so it can be read off at each of them.
    n = np.unique(np.concatenate([np.geomspace(lo, hi, max(2, int(points))), runs["world_size"].to_numpy().astype(float)]))
    t = fit.predict(n)
    # η relative to the runs' baseline: the smallest run's N·T (scaling_efficiency's T1).
    base = runs.sort("world_size").row(0, named=True)
    t1 = base["world_size"] * base["step_time_mean_s"]
    curve = pl.DataFrame({"world_size": n, "step_time_s": t}).with_columns(efficiency_ratio=t1 / (pl.col("world_size") * pl.col("step_time_s")))
    out["curve"] = curve.filter(pl.col("step_time_s") > 0)
    out["fit"] = {"a_s": fit.a_s, "b_s": fit.b_s, "c_s": fit.c_s, "r2": fit.r2, "n_opt": fit.n_opt, "comm_term": fit.comm_term}
    return out

"""Running the job analyzers against the store: read a job's frames, call the pure analyzers, write what
they conclude (per-step C3 breakdowns, per-job summaries, findings) as one Batch.

This is service layer: it touches the store and the clock; ``analyzers/`` stays pure.
The reads of jobs and of what this writes, for the dashboard, the API and the CLI, are
``fleetscope.services.job_reads``.
"""

from __future__ import annotations

import datetime as dt
import json
import math
from dataclasses import dataclass, field
from typing import Any

import polars as pl

from analyzers import c3, carbon, energy, goodput, goodput_trend, reliability, sdc, sdc_fold, stragglers
from fleetscope.core import frames as F
from fleetscope.services import event_fold, job_fold, job_reads
from fleetscope.services.job_reads import json_safe
from fleetscope.services.analysis import Registry
from fleetscope.services.energy_rollup import floor_minute
from fleetscope.observability import tracer
from fleetscope.store import Store


@dataclass
class JobAnalysis:
    job_id: str
    c3: dict[str, Any] | None = None
    goodput: dict[str, Any] | None = None
    goodput_trend: dict[str, Any] | None = None
    stragglers: list[dict[str, Any]] = field(default_factory=list)
    sdc: list[dict[str, Any]] = field(default_factory=list)
    sdc_reruns: list[dict[str, Any]] = field(default_factory=list)
    checkpoint: dict[str, Any] | None = None
    whatif: dict[str, Any] | None = None
    temporal: dict[str, Any] | None = None
    notes: list[str] = field(default_factory=list)
    batch: F.Batch | None = None

    def to_dict(self) -> dict[str, Any]:
        return json_safe({"job_id": self.job_id, "c3": self.c3, "goodput": self.goodput, "goodput_trend": self.goodput_trend,
                          "stragglers": self.stragglers,
                          "sdc": self.sdc, "sdc_reruns": self.sdc_reruns, "checkpoint": self.checkpoint, "whatif": self.whatif,
                          "temporal": self.temporal, "notes": self.notes})


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
            if frame == "job_op" and not self.store.read(frame, job_id=self.job_id, columns=["job_id"], limit=1, small=True).height:
                # most jobs record no operations: a pooled look first, the bulk read only for those that do
                self._frames[frame] = F.FRAMES[frame].empty()
            else:
                self._frames[frame] = self.store.read(frame, job_id=self.job_id, small=frame in _SMALL)
        return self._frames[frame]

    def maybe(self, frame: str) -> pl.DataFrame | None:
        df = self.read(frame)
        return df if df.height else None

    def record(self, analyzer: str, start: Any, end: Any, result: Any) -> None:
        self.rows.append(_analysis_row(self.job_id, analyzer, self.now, start, end, result))

    def findings(self, found: pl.DataFrame) -> None:
        _add_findings(self.batch, found)


_SMALL = frozenset({"job", "job_rank"})
"""The frames a job has few rows of (one, one per rank), read over a pooled connection (``Store.read``'s ``small``)."""

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
        price, note = _folded_energy_price(r.store, r.job_id, r.read("job_rank"), view, r.now)
        if price is not None:
            findings = stragglers.price_findings(findings, price)
        else:
            r.out.notes.append(note)
        r.findings(findings)
    r.out.stragglers = findings.select("subject", "kind", "severity", "score", "summary").to_dicts()
    r.record("stragglers", *res.window(), {"findings": r.out.stragglers, "rank_steps": res.rank_steps, "flagged": res.flagged})


@JOB.register("goodput", modules=("analyzers.goodput", "analyzers.goodput_trend"), reads=("job_event", "step", "job_rank", "gpu"),
              writes=("job_analysis", "metric_sample"), needs=("job_event",),
              summary="runtime, scheduling and program goodput (MFU) and their product, with badput by cause; "
                      "rolling goodput and step-time deviation")
def _goodput(r: JobRun) -> None:
    events = r.events().events
    until = goodput.running_until(events, r.now)
    finished = until is None
    try:
        tl = goodput.goodput_timeline(events, until=until)
        rg = goodput.runtime_goodput_of(tl)
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
    r.out.goodput.update(_program_goodput(r.store, r.read("job_rank"), r.steps().result, sched, rg.goodput_ratio, r.out.notes))
    r.record("goodput", rg.window_start, rg.window_end, r.out.goodput)
    r.batch.metric_sample = goodput_series(r.job_id, r.now, rg.goodput_ratio, r.out.goodput)
    # The same timeline over time: a row of its own (TREND), so that the goodput row the job lists, the fleet
    # metrics and the alert rules read stays small.
    r.out.goodput_trend = goodput_trend.trend(tl, running=not finished, last_steps=job_reads.GOODPUT_STEPS_MAX)
    r.record(TREND, rg.window_start, rg.window_end, r.out.goodput_trend)


TREND = job_reads.GOODPUT_TREND
"""The ``job_analysis.analyzer`` of the goodput analysis's rolling goodput and step-time deviation."""


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


TEMPORAL = "temporal"
"""The ``job_analysis.analyzer`` of HTA's temporal breakdown and overlap."""


def device_union_count(store: Store, job_id: str) -> tuple[int, dt.datetime | None]:
    """How many ``device_union`` rows ``job_id`` has and its newest trace's start: one indexed aggregate, which tells
    the per-minute analysis whether the job's Kineto traces changed since its last result."""
    df = store.query("SELECT COUNT(*) AS n, MAX(start) AS newest FROM device_union WHERE job_id = ?", [job_id],
                     {"n": pl.Int64, "newest": F.UTC_US}, small=True)
    return int(df["n"][0] or 0), df["newest"][0]


# No ``needs``: most jobs come without profiler traces, and a job without them is not worth a note.
@JOB.register(TEMPORAL, modules=("analyzers.c3",), reads=("device_union",), writes=("job_analysis",),
              summary="HTA's temporal breakdown per rank (compute, non-compute and idle time and shares) and its "
                      "communication/computation overlap, from the job's Kineto traces")
def _temporal(r: JobRun) -> None:
    """Meta's Holistic Trace Analysis figures of the job's Kineto traces (``analyzers.c3.hta_report``) from the unions
    the reader stored (``device_union``). Incremental: a count of the job's rows and its newest trace, compared with
    the last result's, decides whether to read them again (a few rows per rank and trace)."""
    rows, newest = device_union_count(r.store, r.job_id)
    if rows == 0:
        return
    if r.incremental:
        last = stored_analysis(r.store, r.job_id, TEMPORAL)
        if last is not None and last["result"].get("rows") == rows and last["result"].get("newest_trace") == json_safe(newest):
            r.out.temporal = last["result"]
            return
    unions = r.store.read("device_union", job_id=r.job_id, small=True)
    report = c3.hta_report(unions)
    r.out.temporal = json_safe({**report, "rows": rows, "newest_trace": newest})
    if report["reason"]:
        r.out.notes.append(f"temporal breakdown: {report['reason']}")
    r.record(TEMPORAL, unions["start"].min(), unions["start"].max(), r.out.temporal)


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
        states = {}
        if run._steps is not None:
            span.set_attribute("fleetscope.refolded", run._steps.refolded)
            if run._steps.committed.rows:
                states[job_fold.STATE] = run._steps.committed.to_json()
        if run._events is not None and run._events.committed.kept.height:
            states[event_fold.STATE] = run._events.committed.to_json()
        if states:
            job_fold.save_states(store, job_id, states, now)
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


def _program_goodput(store: Store, ranks: pl.DataFrame, steps: job_fold.StepState, scheduling: float | None, runtime: float | None,
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
    gpus = store.read("gpu", gpu_uuid=ranks["gpu_uuid"].unique().to_list(), columns=["gpu_uuid", "model_name"], small=True) if ranks.height else pl.DataFrame()
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


def _folded_energy_price(store: Store, job_id: str, ranks: pl.DataFrame, view: job_fold.StepView,
                         now: dt.datetime) -> tuple[stragglers.EnergyPrice | None, str]:
    """``energy_price`` over the job's step window, its energy folded from the job's watermark (``services.job_fold``)."""
    if ranks.height == 0:
        return None, "no rank-to-GPU assignments: straggler cost left in GPU-hours"
    energy_j, held_s = job_fold.job_energy(store, job_id, ranks, view, now)
    return _price(store, ranks, float(energy_j), float(held_s), power_w=energy_j.ratio(held_s))


def _price(store: Store, ranks: pl.DataFrame, energy_j: float, held_s: float,
           power_w: float | None = None) -> tuple[stragglers.EnergyPrice | None, str]:
    if held_s <= 0:
        return None, "no energy roll-ups for the job's GPUs in its window: straggler cost left in GPU-hours"
    power_w = energy_j / held_s if power_w is None else power_w
    hosts = store.read("host", host=ranks["host"].drop_nulls().unique().to_list(), columns=["host", "site_id"], small=True)
    sites = ranks.join(hosts, on="host", how="inner").group_by("site_id").len().sort("len", "site_id", descending=[True, False])
    site = store.read("site", small=True).filter(pl.col("site_id") == sites["site_id"][0]) if sites.height else pl.DataFrame()
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
    """Jobs with steps, events, what-if operations or Kineto traces' unions since ``since``: the ones whose analysis
    may have changed."""
    jobs: set[str] = set()
    for frame in ("step", "job_event", "job_op", "device_union"):
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

"""Job reads against the store, for the dashboard, the API and the CLI: jobs over a window and those
running, a job's per-step, per-rank and total figures, the analyzers' stored summaries and C³ breakdown,
HTA's temporal breakdown and overlap per rank, and scaling across world sizes with the fitted Fleet Law.

The analysis that writes those summaries and breakdowns is ``fleetscope.services.jobs``.
"""

from __future__ import annotations

import datetime as dt
import json
import math
from typing import Any

import numpy as np
import polars as pl

from analyzers.c3 import COMM_TERMS, fit_fleet_law, hta_report, scaling_efficiency
from analyzers import goodput
from analyzers.goodput_trend import MAX_WINDOWS
from fleetscope.core import frames as F
from fleetscope.core.errors import NotFound
from fleetscope.core.units import as_utc, check_window
from fleetscope.store import Store
from fleetscope.store.reads import duration_s_sql, fetch, json_number_sql


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
    select = (
        f"step, COUNT(*) AS ranks, MIN(\"start\") AS start, AVG({dur}) AS step_mean_s, MAX({dur}) AS step_max_s,"
        " AVG(compute_s) AS compute_mean_s, AVG(comm_s - COALESCE(comm_overlap_s, 0)) AS comm_exposed_mean_s,"
        " AVG(idle_s) AS idle_mean_s, AVG(comm_overlap_s) AS overlap_mean_s, SUM(tokens) AS tokens, SUM(model_flops) AS model_flops"
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
    return _last_steps(store, "step", job_id, max_steps, select, schema)


def _window(store: Store, table: str, job_id: str, last_steps: int) -> tuple[int, str, list[Any]] | None:
    """Where a job's last ``last_steps`` steps begin in ``table`` (``step`` or ``step_breakdown``, both keyed (job_id,
    rank, step, start) and indexed by (job_id, start)): the step before the window and the SQL bound (with its
    parameters) that reads from when it began on the rank of the job's newest row (a full step of slack for ranks'
    clocks). The last step is the newest row's, found by the (job_id, start) index where ``MAX(step)`` would read
    every row of a month-long job; a job whose window start is not found is read whole. None: no rows."""
    newest = fetch(store, f'SELECT step, rank FROM {table} WHERE job_id = ? ORDER BY "start" DESC LIMIT 1', [job_id],
                   {"step": pl.Int64, "rank": pl.Int64})
    if newest.is_empty():
        return None
    first = int(newest["step"][0]) - int(last_steps)
    since = fetch(store, f'SELECT MIN("start") AS t FROM {table} WHERE job_id = ? AND rank = ? AND step = ?',
                  [job_id, int(newest["rank"][0]), first], {"t": UTC})
    if since.height and since["t"][0] is not None:
        return first, ' AND step > ? AND "start" >= ?', [first, store._time_param(since["t"][0])]
    return first, " AND step > ?", [first]


def _tail(store: Store, job_id: str, last_steps: int) -> pl.DataFrame:
    """A job's rank-steps of its last ``last_steps`` steps (:func:`_window`): ``rank, step, step_s, compute_s, idle_s``."""
    schema = {"rank": pl.Int64, "step": pl.Int64, "step_s": pl.Float64, "compute_s": pl.Float64, "idle_s": pl.Float64}
    w = _window(store, "step", job_id, last_steps)
    if w is None:
        return pl.DataFrame(schema=schema)
    _, bound, params = w
    dur = duration_s_sql(store, '"start"', '"end"')
    return fetch(store, f"SELECT rank, step, {dur} AS step_s, compute_s, idle_s FROM step WHERE job_id = ?{bound}", [job_id, *params], schema)


def _last_steps(store: Store, table: str, job_id: str, max_steps: int, select: str, schema: dict[str, Any]) -> pl.DataFrame:
    """``SELECT {select} FROM {table} WHERE job_id = ? ... GROUP BY step``, its last ``max_steps`` steps, read through
    :func:`_window`'s bound. Step numbers need not be dense (a job may record every tenth step): where the window by
    number holds fewer than ``max_steps`` steps and older ones exist, the job is read whole."""
    w = _window(store, table, job_id, max_steps)
    tail = f" GROUP BY step ORDER BY step DESC LIMIT {int(max_steps)}"
    sql = f"SELECT {select} FROM {table} WHERE job_id = ?"
    if w is None:
        return pl.DataFrame(schema=schema)
    out = fetch(store, sql + w[1] + tail, [job_id, *w[2]], schema)
    if out.height < max_steps and w[0] >= 0:
        out = fetch(store, sql + tail, [job_id], schema)
    return out.sort("step")


def job_rank_step_times(store: Store, job_id: str, last_steps: int = 50, max_ranks: int = 256) -> pl.DataFrame:
    """Per rank and step over a job's last ``last_steps`` steps: ``rank, ranks_in_cell, step, step_s,
    compute_s, idle_s``.

    In synchronous training every rank's step lasts as long as the slowest rank's, so a straggler shows
    in compute time (high) and in the others' idle time (they wait for it), not in step time. Above
    ``max_ranks`` ranks, neighbouring ranks share a cell (``rank`` is the first of them) holding the
    largest step and compute time and the smallest idle time, so a straggler still stands out and the
    heatmap stays drawable.
    """
    tail = _tail(store, job_id, last_steps)
    schema = {"rank": pl.Int64, "ranks_in_cell": pl.Int64, "step": pl.Int64, "step_s": pl.Float64, "compute_s": pl.Float64, "idle_s": pl.Float64}
    if tail.is_empty():
        return pl.DataFrame(schema=schema)
    per_cell = max(1, math.ceil((int(tail["rank"].max()) + 1) / max(1, max_ranks)))
    return (tail.with_columns(((pl.col("rank") // per_cell) * per_cell).alias("cell"))
            .group_by("cell", "step").agg(pl.col("rank").n_unique().cast(pl.Int64).alias("ranks_in_cell"), pl.col("step_s").max(),
                                          pl.col("compute_s").max(), pl.col("idle_s").min())
            .rename({"cell": "rank"}).select(list(schema)).sort("rank", "step"))


def job_rank_summary(store: Store, job_id: str, last_steps: int = 50) -> pl.DataFrame:
    """Per rank over a job's last steps, slowest first: ``rank, host, steps, step_mean_s, compute_mean_s,
    idle_mean_s, slowdown_ratio`` (the rank's mean compute time over the median rank's: a straggler
    computes longer while the others idle waiting for it). A raw view until the straggler analyzer lands."""
    schema = {"rank": pl.Int64, "steps": pl.Int64, "step_mean_s": pl.Float64, "compute_mean_s": pl.Float64, "idle_mean_s": pl.Float64}
    out_schema = {"rank": pl.Int64, "host": pl.String, **{k: v for k, v in schema.items() if k != "rank"}, "slowdown_ratio": pl.Float64}
    tail = _tail(store, job_id, last_steps)
    if tail.is_empty():
        return pl.DataFrame(schema=out_schema)
    df = tail.group_by("rank").agg(pl.len().cast(pl.Int64).alias("steps"), pl.col("step_s").mean().alias("step_mean_s"),
                                   pl.col("compute_s").mean().alias("compute_mean_s"), pl.col("idle_s").mean().alias("idle_mean_s"))
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
        # distinct counts as grouped subqueries (hashed): COUNT(DISTINCT) sorts every row of the job, twice
        "SELECT (SELECT COUNT(*) FROM (SELECT step FROM step WHERE job_id = ? GROUP BY step) a) AS steps,"
        " (SELECT COUNT(*) FROM (SELECT rank FROM step WHERE job_id = ? GROUP BY rank) b) AS ranks,"
        f" AVG({dur}) AS step_mean_s, SUM(tokens) AS tokens, SUM(model_flops) AS model_flops FROM step WHERE job_id = ?",
        [job_id, job_id, job_id],
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


GOODPUT_TREND = "goodput_trend"
"""The ``job_analysis.analyzer`` under which the goodput analysis stores its rolling goodput and step-time
deviation (``analyzers.goodput_trend.trend``), beside its ``goodput`` row."""
GOODPUT_WINDOWS_MAX = MAX_WINDOWS
"""The rolling windows the analysis keeps (the newest), and the most a read asks for."""
GOODPUT_STEPS_MAX = 100
"""The newest steps whose deviation the analysis keeps, and the most a read asks for."""
_NO_TREND = "not computed yet: the job's goodput was last analysed before rolling goodput and step-time deviation were; the next analysis adds them"


def job_goodput(store: Store, job_id: str, *, windows: int = GOODPUT_WINDOWS_MAX, steps: int = GOODPUT_STEPS_MAX) -> dict[str, Any] | None:
    """A job's stored goodput analysis as ``GET /api/v1/jobs/{id}/goodput`` serves it: ``job_id, analyzer,
    computed_at, window_start, window_end`` (ISO 8601) and ``result`` (runtime, scheduling and program goodput,
    badput by bucket), plus

    - ``rolling``: goodput of consecutive windows of the run (``window_s`` each, from its start), the newest
      ``windows`` of them (``windows_total`` in all), each ``window_start, window_end, total_s, productive_s,
      goodput_ratio, badput_s``;
    - ``step_time_deviation``: the ideal step time (mean of the steps not above median + 3 × MAD), the steps
      above that threshold, the mean and largest deviation, and the newest ``steps`` steps' ``step, step_time_s,
      deviation_s``.

    Each has ``why`` (else null) when it holds nothing: too few steps, or not computed yet. None when the job's
    goodput was never analysed. ``windows`` from 0 to :data:`GOODPUT_WINDOWS_MAX`, ``steps`` from 0 to
    :data:`GOODPUT_STEPS_MAX`, else ``ValueError`` naming it."""
    for name, value, top in (("windows", windows, GOODPUT_WINDOWS_MAX), ("steps", steps, GOODPUT_STEPS_MAX)):
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= top:
            raise ValueError(f"{name} must be an integer from 0 to {top}, got {value!r}")
    df = fetch(store, "SELECT analyzer, computed_at, window_start, window_end, result FROM job_analysis WHERE job_id = ? AND analyzer IN (?, ?)",
               [job_id, "goodput", GOODPUT_TREND],
               {"analyzer": pl.String, "computed_at": UTC, "window_start": UTC, "window_end": UTC, "result": pl.String})
    rows = {r["analyzer"]: r for r in df.iter_rows(named=True)}
    if "goodput" not in rows:
        return None
    g = rows["goodput"]
    iso = lambda t: t.isoformat() if t is not None else None  # noqa: E731
    out = {"job_id": job_id, "analyzer": "goodput", "computed_at": iso(g["computed_at"]), "window_start": iso(g["window_start"]),
           "window_end": iso(g["window_end"]), "result": json.loads(g["result"])}
    trend = json.loads(rows[GOODPUT_TREND]["result"]) if GOODPUT_TREND in rows else {}
    roll = trend.get("rolling") or {"window_s": None, "window_steps": None, "ideal_step_time_s": None, "windows_total": 0, "windows": [], "why": _NO_TREND}
    dev = trend.get("step_time_deviation") or {"steps": None, "ideal_step_time_s": None, "anomaly_threshold_s": None, "anomalous_steps": None,
                                               "mean_deviation_s": None, "max_deviation_s": None, "max_deviation_step": None, "last": [], "why": _NO_TREND}
    out["rolling"] = {**roll, "windows": roll["windows"][len(roll["windows"]) - windows:] if windows else []}
    out["step_time_deviation"] = {**dev, "last": dev["last"][len(dev["last"]) - steps:] if steps else []}
    return out


def interval_goodput(store: Store, job_id: str, start: dt.datetime, end: dt.datetime, *, now: dt.datetime) -> dict[str, Any]:
    """Runtime goodput of ``job_id`` within ``[start, end)``, computed now, as ml-goodput-measurement's
    ``get_job_goodput_interval(interval_start, interval_end)``: the run's timeline (up to ``now`` while it runs,
    as the analysis reads it) clipped to the interval, whose overlap with the run (``window_start``,
    ``window_end``) is the denominator; productive time, badput by bucket, the last productive step and the
    disruptions inside it. The events are the job analysis's folded ones and those since its watermark
    (``event_fold.timeline_events``), not every step event of every rank. What ``GET
    /api/v1/jobs/{id}/goodput/interval`` and ``fleetscope jobs goodput --start --end`` give.

    ``ValueError`` naming what is wrong with the window (no time zone, empty) or saying that it misses the
    run; ``NotFound`` for a job whose events give no timeline (none, or no start)."""
    from fleetscope.services import event_fold  # lazy: event_fold reads the fold state through job_fold

    check_window(start, end)
    start, end = as_utc(start), as_utc(end)  # the timeline is in UTC; a caller's +02:00 is the same instant
    events = event_fold.timeline_events(store, job_id)
    if events.height == 0:
        raise NotFound(f"job {job_id[:200]!r} has no job events: interval goodput is read from them")
    until = goodput.running_until(events, now)
    try:
        timeline = goodput.goodput_timeline(events, until=until)
    except ValueError as exc:
        raise NotFound(f"job {job_id[:200]!r} has no goodput timeline: {exc}") from None
    rg = goodput.runtime_goodput_of(timeline, window_start=start, window_end=end)  # ValueError: the interval misses the run
    return json_safe({
        "job_id": job_id, "interval_start": start.isoformat(), "interval_end": end.isoformat(),
        "window_start": rg.window_start.isoformat(), "window_end": rg.window_end.isoformat(), "finished": until is None,
        "total_s": rg.total_s, "productive_s": rg.productive_s, "goodput_ratio": rg.goodput_ratio, "badput_s": rg.badput_s,
        "badput_ratio": rg.badput_ratio, "last_step": rg.last_step, "disruptions": rg.disruptions,
    })


def job_c3_steps(store: Store, job_id: str, max_steps: int = 2000) -> pl.DataFrame:
    """Per step of a job, averaged over its ranks, from the C³ analyzer's stored breakdown
    (``step_breakdown``, analyzers.c3.c3_breakdown; the last ``max_steps`` steps): ``step, ranks,
    step_mean_s, c1_compute_s, c2_comm_s, c3_coord_s, f_compute``. C1 + C2 + C3 = step time; unlike the
    raw step records, a collective's wait for its last peer is in C3 (coordination), not in C2."""
    select = ("step, COUNT(*) AS ranks, AVG(step_s) AS step_mean_s, AVG(c1_compute_s) AS c1_compute_s, AVG(c2_comm_s) AS c2_comm_s,"
              " AVG(c3_coord_s) AS c3_coord_s, AVG(f_compute) AS f_compute")
    schema = {k: pl.Float64 for k in ("step_mean_s", "c1_compute_s", "c2_comm_s", "c3_coord_s", "f_compute")}
    return _last_steps(store, "step_breakdown", job_id, max_steps, select, {"step": pl.Int64, "ranks": pl.Int64, **schema})

TEMPORAL_NO_DATA = ("no Kineto kernel data for this job: ingest its PyTorch profiler traces "
                    "(fleetscope ingest TRACE.json --job-id JOB, or POST /api/v1/ingest/kineto?job_id=JOB)")
"""The ``reason`` of a job without ``device_union`` rows."""
_TEMPORAL_KEYS = ("window", "include_last_step", "ranks", "job", "reason")


def temporal(store: Store, job_id: str, *, include_last_step: bool = False, rank: int | None = None) -> dict[str, Any]:
    """A job's temporal breakdown and communication/computation overlap per rank, as Meta's Holistic Trace Analysis
    reports them (``analyzers.c3.hta_report`` over the unions its Kineto traces left, ``device_union``), for the
    Jobs page, ``GET /api/v1/jobs/{id}/temporal`` and ``fleetscope jobs temporal``:

    - the job's stored ``temporal`` analysis (``services.jobs``; beat's per-minute run, ``POST .../analyze``) in HTA's
      default window (the last profiler step left out), when it has run;
    - otherwise computed now from the stored unions, a few rows per rank and trace: with ``include_last_step``
      (which is not stored), or for a job not analysed yet.

    JSON-ready: ``job_id``, ``stored`` (whether it is the stored analysis), ``computed_at`` (its time; None when
    computed now), ``window_start``/``window_end`` (the first and last trace read), ``include_last_step``, ``window``
    (``all``, ``before_last_step`` or ``through_last_step``: HTA's rule), ``ranks`` (per rank: ``idle_time_us``,
    ``compute_time_us``, ``non_compute_time_us``, ``kernel_time_us``, their ``*_pctg`` shares of kernel time,
    ``comp_comm_overlap_ratio`` and ``_pctg``, ``trace_start``, ``traces``), ``job`` (the same over all ranks) and
    ``reason`` (why ``ranks`` is empty, else None). ``rank``: that rank's row only. ValueError for a negative rank."""
    if rank is not None and rank < 0:
        raise ValueError(f"rank must be 0 or more, got {rank}")
    found = None if include_last_step else job_analyses(store, job_id).get("temporal")
    if found is not None:
        body = {k: found.get(k) for k in _TEMPORAL_KEYS}
        when = {k: found[k] for k in ("computed_at", "window_start", "window_end")}
    else:
        unions = store.read("device_union", job_id=job_id, small=True)
        if unions.height == 0:
            body = {"window": None, "include_last_step": include_last_step, "ranks": [], "job": None, "reason": TEMPORAL_NO_DATA}
            when = {"computed_at": None, "window_start": None, "window_end": None}
        else:
            body = hta_report(unions, include_last_step=include_last_step)
            when = {"computed_at": None, "window_start": unions["start"].min(), "window_end": unions["start"].max()}
    out = {"job_id": job_id, "stored": found is not None, **when, **body}
    if rank is not None:
        out["ranks"] = [r for r in out["ranks"] if r["rank"] == rank]
        if not out["ranks"] and out["reason"] is None:
            out["reason"] = f"rank {rank} has no device events in the job's traces ({out['window']} window)"
    return json_safe(out)


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


# How far either side of the runs the fitted curve is drawn, in factors of the world size.
_FIT_SPAN = 2.0
# The fit's defaults, the Jobs page's: the API and the CLI offer the same, and bound the curve's points.
FIT_POINTS = 64
FIT_POINTS_MAX = 1000
FIT_COMM_TERM = "ring"
FIT_COMM_TERMS = COMM_TERMS


def scaling_fit(store: Store, model_name: str, points: int = FIT_POINTS, comm_term: str = FIT_COMM_TERM) -> dict[str, Any]:
    """The Fleet Law fitted to the runs of one model (analyzers.c3.fit_fleet_law: T_step(N) = a/N +
    b·f(N) + c, ring all-reduce f(N) = 2(N−1) by default), for the Jobs page (and, as JSON values through
    :func:`scaling_report`, for the API and the CLI):

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


def model_known(store: Store, model_name: str) -> bool:
    """Whether a job of the job inventory names ``model_name`` as its model."""
    return fetch(store, "SELECT job_id FROM job WHERE model_name = ? LIMIT 1", [model_name], {"job_id": pl.String}, small=True).height > 0


def scaling_report(store: Store, model_name: str, points: int = FIT_POINTS, comm_term: str = FIT_COMM_TERM) -> dict[str, Any]:
    """:func:`scaling_fit` as plain JSON values, for ``GET /api/v1/models/{name}/scaling`` and ``fleetscope jobs
    scaling``: ``model_name``, ``comm_term``, ``runs`` and ``curve`` as lists of rows, ``fit`` (``n_opt`` None
    where the fitted curve has no minimum: JSON has no infinity) or None, and ``why`` when it is None.

    ``NotFound`` for a model no job of the inventory names (a known model with no step records gives empty
    ``runs`` and ``why``); ``ValueError`` for ``points`` outside 2..FIT_POINTS_MAX or an unknown ``comm_term``.
    """
    if comm_term not in FIT_COMM_TERMS:
        raise ValueError(f"comm_term must be one of {', '.join(FIT_COMM_TERMS)}, not {comm_term[:50]!r}")
    if not 2 <= points <= FIT_POINTS_MAX:
        raise ValueError(f"points must be from 2 to {FIT_POINTS_MAX}, not {points}")
    if not model_known(store, model_name):
        raise NotFound(f"no job of model {model_name[:200]!r} in the job inventory")
    sf = scaling_fit(store, model_name, points=points, comm_term=comm_term)
    fit = sf["fit"]
    if fit is not None:
        fit = {**fit, "n_opt": fit["n_opt"] if math.isfinite(fit["n_opt"]) else None}
    return {"model_name": model_name, "comm_term": comm_term, "runs": sf["runs"].to_dicts(), "fit": fit, "why": sf["why"],
            "curve": sf["curve"].to_dicts()}

"""Post-market monitoring of deployed models (AI Act Art. 72) against the store: a model version's stored
predictions and outcomes cut into windows (hourly by default), each compared with a reference window
(``governance.monitoring``: accuracy and error rates, PSI and KS drift, fairness per group with bootstrap
intervals), stored as ``monitoring_window`` rows and ``finding`` rows (analyzer ``monitoring``, kinds
``governance.monitoring.FINDING_KINDS``); and the reads the API, the CLI, the dashboard and the AI Act
audit share.

Reference window: the first ``reference_s`` seconds (a day by default) of the version's predictions,
starting at the window boundary at or before its first prediction, unless the caller names one. Only
closed windows are evaluated. A window is evaluated again while its outcomes arrive (``lookback_s``): its
row is updated, and a finding it no longer raises is rewritten at severity ``info`` with a summary saying
it cleared, so the alert on it resolves and the record stays.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Sequence
from typing import Any

import polars as pl

from fleetscope.core import frames as F
from fleetscope.core.errors import FleetscopeError, NotFound
from fleetscope.core.monitoring_frames import MONITORING_WINDOW
from fleetscope.services.analysis import at
from fleetscope.settings import Settings
from fleetscope.store import Store
from fleetscope.store.reads import fetch
from governance import monitoring as GM
from governance import fairness_depth

UTC = F.UTC_US


class MonitoringError(FleetscopeError, ValueError):
    """A monitoring request that cannot be answered as asked (a window size, a reference too small): says which."""


DEFAULT_WINDOW_S = 3600
DEFAULT_REFERENCE_S = 86400
DEFAULT_LOOKBACK_S = 2 * 86400
"""Beat re-evaluates two days of windows each hour: outcomes (a loan repaid, a hire kept) arrive late."""
MAX_WINDOWS = 24 * 7 * 5
"""Most windows one call evaluates (five weeks of hours): a bound on a request's work, not on the data."""


def subject_of(model: str, version: str) -> str:
    """The finding subject of a model version (the AI Act audit's ``model:NAME:VERSION``)."""
    return f"model:{model}:{version}"


def _utc(t: dt.datetime) -> dt.datetime:
    return t.replace(tzinfo=dt.UTC) if t.tzinfo is None else t.astimezone(dt.UTC)


def _floor(t: dt.datetime, width_s: int) -> dt.datetime:
    t = _utc(t)
    epoch = int(t.timestamp())
    return dt.datetime.fromtimestamp(epoch - epoch % width_s, dt.UTC)


def _ceil(t: dt.datetime, width_s: int) -> dt.datetime:
    f = _floor(t, width_s)
    return f if f == _utc(t) else f + dt.timedelta(seconds=width_s)


_PRED_SCHEMA = {"prediction_id": pl.String, "ts": UTC, "score": pl.Float64, "prediction": pl.Float64, "features": pl.String,
                "groups": pl.String, "outcome": pl.Float64}


def _within(col: str, start: dt.datetime | None, end: dt.datetime | None, params: list[Any]) -> str:
    """The ``AND`` clauses bounding ``col`` to ``[start, end)`` (either open), their values added to ``params``."""
    sql = ""
    if start is not None:
        sql += f" AND {col} >= ?"
        params.append(_utc(start))
    if end is not None:
        sql += f" AND {col} < ?"
        params.append(_utc(end))
    return sql


def predictions(store: Store, model: str, version: str, start: dt.datetime | None = None, end: dt.datetime | None = None) -> pl.DataFrame:
    """A version's predictions in ``[start, end)`` with their outcome where it has arrived (null otherwise)."""
    sql = ("SELECT p.prediction_id, p.ts, p.score, p.prediction, p.features, p.groups, o.outcome FROM model_prediction p"
           " LEFT JOIN model_outcome o ON o.model_name = p.model_name AND o.model_version = p.model_version AND o.prediction_id = p.prediction_id"
           " WHERE p.model_name = ? AND p.model_version = ?")
    params: list[Any] = [model, version]
    sql += _within("p.ts", start, end, params)
    return fetch(store, sql + " ORDER BY p.ts", params, _PRED_SCHEMA)


def monitored(store: Store) -> pl.DataFrame:
    """Model versions with stored predictions: ``model_name, model_version, predictions, first_ts, last_ts, outcomes``."""
    sql = ("SELECT p.model_name, p.model_version, COUNT(*) AS predictions, MIN(p.ts) AS first_ts, MAX(p.ts) AS last_ts,"
           " COUNT(o.outcome) AS outcomes FROM model_prediction p LEFT JOIN model_outcome o ON o.model_name = p.model_name"
           " AND o.model_version = p.model_version AND o.prediction_id = p.prediction_id"
           " GROUP BY p.model_name, p.model_version ORDER BY p.model_name, p.model_version")
    return fetch(store, sql, [], {"model_name": pl.String, "model_version": pl.String, "predictions": pl.Int64, "first_ts": UTC,
                                  "last_ts": UTC, "outcomes": pl.Int64})


def _span(store: Store, model: str, version: str) -> tuple[dt.datetime, dt.datetime]:
    got = monitored(store).filter((pl.col("model_name") == model) & (pl.col("model_version") == version))
    if got.height == 0:
        raise NotFound(f"no predictions stored for {model}@{version}: push them (POST /api/v1/ingest/model_monitoring, or fleetscope ingest FILE)")
    return got["first_ts"][0], got["last_ts"][0]


def evaluate(store: Store, model: str, version: str, *, now: dt.datetime | None = None, window_s: int = DEFAULT_WINDOW_S,
             reference: tuple[dt.datetime, dt.datetime] | None = None, reference_s: int = DEFAULT_REFERENCE_S,
             start: dt.datetime | None = None, end: dt.datetime | None = None, lookback_s: int | None = None,
             config: GM.MonitoringConfig | None = None) -> dict[str, Any]:
    """Evaluate a version's closed windows of ``window_s`` seconds in ``[start, end)`` (default: from the
    reference's end, or ``now - lookback_s``, to ``now``) against the reference window; store the window rows
    and the findings. Returns what was done: windows, their statuses, findings per kind, the reference."""
    if not 60 <= window_s <= 7 * 86400:
        raise MonitoringError(f"window_s {window_s}: between 60 s and 7 days")
    if reference_s < window_s:
        raise MonitoringError(f"reference_s {reference_s}: at least one window ({window_s} s)")
    now = _utc(now or dt.datetime.now(dt.UTC))
    cfg = config or GM.MonitoringConfig()
    first, _ = _span(store, model, version)
    if reference is None:
        r0 = _floor(first, window_s)
        reference = (r0, r0 + dt.timedelta(seconds=reference_s))
    r0, r1 = _utc(reference[0]), _utc(reference[1])
    if r1 <= r0:
        raise MonitoringError("the reference window ends before it starts")
    ref_rows = predictions(store, model, version, r0, r1)
    if ref_rows.height < cfg.min_window_size:
        raise MonitoringError(f"the reference window {r0.isoformat()} to {r1.isoformat()} holds {ref_rows.height} predictions of "
                              f"{model}@{version}, under {cfg.min_window_size}: name a longer or later reference")
    closed = _floor(now, window_s)
    lo = r1  # the windows after the reference, on window boundaries
    if start is not None:
        lo = max(lo, _utc(start))
    elif lookback_s is not None:
        lo = max(lo, now - dt.timedelta(seconds=lookback_s))
    lo = _ceil(lo, window_s)
    hi = min(_utc(end), closed) if end is not None else closed
    n_windows = max(0, int((hi - lo).total_seconds()) // window_s)
    if n_windows > MAX_WINDOWS:
        raise MonitoringError(f"{n_windows} windows of {window_s} s asked for, at most {MAX_WINDOWS} per call: narrow start/end")
    ref_data = GM.window_data(ref_rows)
    feats, grps = list(ref_data.features), list(ref_data.groups)
    ref = GM.reference(ref_data, cfg)
    rows = predictions(store, model, version, lo, hi) if n_windows else ref_rows.clear()
    starts = [lo + dt.timedelta(seconds=window_s * i) for i in range(n_windows)]
    parts = [(s, e, d) for s, e, d in GM.split_window_data(rows, starts, window_s, features=feats, groups=grps, threshold=0.5) if d.n]
    subject = subject_of(model, version)
    results = GM.evaluate_windows(ref, parts, cfg, subject=subject) if parts else []
    ref_info = {"start": r0.isoformat(), "end": r1.isoformat(), "n": ref.n, "accuracy": ref.accuracy}
    window_rows = []
    finding_rows: list[dict[str, Any]] = []
    for res in results:
        row = res.row(model, version, now, detail={"reference": ref_info, "config": cfg.to_dict()})
        window_rows.append(row)
        finding_rows.extend({**f, "evidence": json.dumps(f["evidence"], default=str)} for f in res.findings)
    finding_rows.extend(_cleared(store, subject, [r.window_start for r in results], finding_rows))
    frames: list[tuple[F.FrameSpec, pl.DataFrame]] = []
    if window_rows:
        frames.append((MONITORING_WINDOW, pl.DataFrame(window_rows, schema=MONITORING_WINDOW.schema)))
    if finding_rows:
        frames.append((F.FINDING, F.findings_frame(finding_rows)))
    if frames:
        store.write_frames(frames, source=f"monitoring:{model}@{version}")
    kinds: dict[str, int] = {}
    for res in results:
        for f in res.findings:
            kinds[f["kind"]] = kinds.get(f["kind"], 0) + 1
    return {"model": model, "version": version, "reference": ref_info, "window_s": window_s, "evaluated": len(results),
            "windows": [{"window_start": r.window_start.isoformat(), "n_predictions": r.n_predictions, "status": r.status} for r in results],
            "findings": kinds}


def _cleared(store: Store, subject: str, starts: Sequence[dt.datetime], fresh: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Findings stored for these windows that this evaluation no longer raises, rewritten as cleared."""
    if not starts:
        return []
    sql = ("SELECT analyzer, kind, subject, window_start, window_end, summary, evidence FROM finding WHERE analyzer = ?"
           " AND (subject = ? OR subject LIKE ?) AND window_start >= ? AND window_start <= ? AND severity <> 'info'")
    # LIKE's wildcards in a model's name widen the match; the exact prefix is checked below
    old = fetch(store, sql, [GM.ANALYZER, subject, subject + "/%", min(starts), max(starts)],
                {"analyzer": pl.String, "kind": pl.String, "subject": pl.String, "window_start": UTC, "window_end": UTC,
                 "summary": pl.String, "evidence": pl.String})
    keep = {(f["kind"], f["subject"], _utc(f["window_start"])) for f in fresh}
    wanted = {_utc(s) for s in starts}
    out = []
    for r in old.iter_rows(named=True):
        if r["subject"] != subject and not r["subject"].startswith(subject + "/"):
            continue
        ws = _utc(r["window_start"])
        if ws in wanted and (r["kind"], r["subject"], ws) not in keep:
            out.append({**r, "window_start": ws, "severity": "info", "score": None,
                        "summary": f"cleared on re-evaluation: {(r['summary'] or '')[:400]}"})
    return out


def evaluate_all(store: Store, *, now: dt.datetime | None = None, window_s: int = DEFAULT_WINDOW_S,
                 lookback_s: int = DEFAULT_LOOKBACK_S) -> dict[str, Any]:
    """Beat's hourly tick: every monitored version's recent windows. A version whose reference is not yet
    complete, or too small, is reported and skipped."""
    now = _utc(now or dt.datetime.now(dt.UTC))
    done, skipped = [], {}
    for r in monitored(store).iter_rows(named=True):
        name, version = r["model_name"], r["model_version"]
        try:
            out = evaluate(store, name, version, now=now, window_s=window_s, lookback_s=lookback_s)
        except MonitoringError as exc:
            skipped[f"{name}@{version}"] = str(exc)
            continue
        done.append({"model": name, "version": version, "evaluated": out["evaluated"], "findings": out["findings"]})
    return {"models": done, "skipped": skipped}


def scheduled_evaluate(store: Store, settings: Settings, *, now_iso: str | None = None) -> dict[str, Any]:
    """Beat's hourly ``model-monitoring`` (``services.scheduled``): ``evaluate_all`` at ``now_iso``, else now, so
    outcomes that arrived late are counted."""
    return evaluate_all(store, now=at(now_iso))


# --- reads (the dashboard's, the API's, the CLI's and the audit's) -----------------------------------


_WINDOW_COLS = {c.name: c.dtype for c in MONITORING_WINDOW.columns if c.name != "detail"}


def windows(store: Store, model: str | None = None, version: str | None = None, *, start: dt.datetime | None = None,
            end: dt.datetime | None = None, limit: int = 2000) -> pl.DataFrame:
    """Evaluated windows, oldest first: the ``monitoring_window`` columns but ``detail``."""
    sql = f"SELECT {', '.join(_WINDOW_COLS)} FROM monitoring_window WHERE 1 = 1"
    params: list[Any] = []
    for col, v in (("model_name", model), ("model_version", version)):
        if v is not None:
            sql += f" AND {col} = ?"
            params.append(v)
    sql += _within("window_start", start, end, params)
    sql += f" ORDER BY model_name, model_version, window_start DESC LIMIT {max(1, min(int(limit), 100_000))}"
    return fetch(store, sql, params, _WINDOW_COLS).sort("model_name", "model_version", "window_start")


def window_detail(store: Store, model: str, version: str, window_start: dt.datetime) -> dict[str, Any]:
    """One window's stored result in full (per-feature drift, per-group rates with intervals, findings)."""
    got = fetch(store, "SELECT detail FROM monitoring_window WHERE model_name = ? AND model_version = ? AND window_start = ?",
                [model, version, _utc(window_start)], {"detail": pl.String})
    if got.height == 0:
        raise NotFound(f"no evaluated window of {model}@{version} starting {_utc(window_start).isoformat()}")
    return json.loads(got["detail"][0])


def _details(store: Store, model: str, version: str, start: dt.datetime | None, end: dt.datetime | None, limit: int) -> list[dict[str, Any]]:
    sql = "SELECT window_start, detail FROM monitoring_window WHERE model_name = ? AND model_version = ?"
    params: list[Any] = [model, version]
    sql += _within("window_start", start, end, params)
    got = fetch(store, sql + f" ORDER BY window_start DESC LIMIT {max(1, min(int(limit), 10_000))}", params,
                {"window_start": UTC, "detail": pl.String})
    return [json.loads(d) for d in reversed(got["detail"].to_list()) if d]


_DRIFT = {"window_start": UTC, "feature": pl.String, "psi": pl.Float64, "level": pl.String, "ks": pl.Float64, "ks_pvalue": pl.Float64,
          "n": pl.Int64, "drifted": pl.Boolean, "psi_pvalue": pl.Float64}


def drift_over_time(store: Store, model: str, version: str, *, start: dt.datetime | None = None, end: dt.datetime | None = None,
                    limit: int = 2000) -> pl.DataFrame:
    """Per window and feature: PSI, its level, the KS statistic and p-value, rows, whether it counted as drift, and
    PSI's chi-squared p-value (null for windows evaluated before it was kept)."""
    rows = [{"window_start": dt.datetime.fromisoformat(d["window_start"]), **{k: x.get(k) for k in _DRIFT if k != "window_start"}}
            for d in _details(store, model, version, start, end, limit) for x in d.get("drift") or []]
    return pl.DataFrame(rows, schema=_DRIFT)


_FAIR = {"window_start": UTC, "attribute": pl.String, "group": pl.String, "count": pl.Int64, "judged": pl.Boolean, "metric": pl.String,
         "value": pl.Float64, "ci_low": pl.Float64, "ci_high": pl.Float64}
_FAIR_METRICS = ("selection_rate", "tpr", "fpr", "accuracy")


def fairness_over_time(store: Store, model: str, version: str, *, start: dt.datetime | None = None, end: dt.datetime | None = None,
                       limit: int = 2000) -> pl.DataFrame:
    """Per window, group attribute, group and rate (selection rate, TPR, FPR, accuracy): the value and its
    bootstrap interval; group ``*`` carries the attribute's watched disparity and its interval."""
    rows = []
    for d in _details(store, model, version, start, end, limit):
        ws = dt.datetime.fromisoformat(d["window_start"])
        watched = (d.get("config") or {}).get("fairness_metric", "equalized_odds_difference")
        for a in d.get("fairness") or []:
            ci = (a.get("summary_ci") or {}).get(watched) or [None, None]
            rows.append({"window_start": ws, "attribute": a["attribute"], "group": "*", "count": sum(g["count"] for g in a["groups"]),
                         "judged": True, "metric": watched, "value": (a.get("summary") or {}).get(watched), "ci_low": ci[0], "ci_high": ci[1]})
            for g in a["groups"]:
                for m in _FAIR_METRICS:
                    gci = (g.get("ci") or {}).get(m) or [None, None]
                    rows.append({"window_start": ws, "attribute": a["attribute"], "group": g["group"], "count": g["count"], "judged": g["judged"],
                                 "metric": m, "value": g.get(m), "ci_low": gci[0], "ci_high": gci[1]})
    return pl.DataFrame(rows, schema=_FAIR)


_FINDING_COLS = {"kind": pl.String, "subject": pl.String, "severity": pl.String, "score": pl.Float64, "window_start": UTC, "window_end": UTC,
                 "summary": pl.String, "evidence": pl.String}


def findings(store: Store, model: str | None = None, version: str | None = None, *, start: dt.datetime | None = None,
             include_cleared: bool = False, limit: int = 500) -> pl.DataFrame:
    """Monitoring findings, newest first: ``kind, subject, severity, score, window_start, window_end, summary, evidence``."""
    sql = f"SELECT {', '.join(_FINDING_COLS)} FROM finding WHERE analyzer = ?"
    params: list[Any] = [GM.ANALYZER]
    if not include_cleared:
        sql += " AND severity <> 'info'"
    sql += _within("window_start", start, None, params)
    got = fetch(store, sql + " ORDER BY window_start DESC", params, _FINDING_COLS)
    if model is not None:
        prefix = f"model:{model}:" if version is None else subject_of(model, version)
        got = got.filter(pl.col("subject").str.starts_with(prefix))
    return got.head(max(1, min(int(limit), 10_000)))


def finding(store: Store, kind: str, subject: str, window_start: dt.datetime) -> dict[str, Any]:
    """One monitoring finding by its key."""
    got = fetch(store, f"SELECT {', '.join(_FINDING_COLS)} FROM finding WHERE analyzer = ? AND kind = ? AND subject = ? AND window_start = ?",
                [GM.ANALYZER, kind, subject, _utc(window_start)], _FINDING_COLS)
    if got.height == 0:
        raise NotFound(f"no monitoring finding {kind} on {subject[:200]} at {_utc(window_start).isoformat()}")
    return got.row(0, named=True)


def impossibility(store: Store, model: str, version: str, attribute: str, *, start: dt.datetime | None = None,
                  end: dt.datetime | None = None, min_group_size: int = 30, tolerance: float = 0.05) -> dict[str, Any]:
    """The impossibility view (``governance.fairness_depth.impossibility``) on a version's stored predictions
    with outcomes in ``[start, end)``: which of calibration, equalized odds and demographic parity hold, and
    the base rates that force the trade-off."""

    rows = predictions(store, model, version, start, end).filter(pl.col("outcome").is_not_null())
    if rows.height == 0:
        raise NotFound(f"no predictions of {model}@{version} with an outcome in that span")
    data = GM.window_data(rows, groups=[attribute], features=[])
    if attribute not in data.groups or not (data.groups[attribute] != "").any():
        raise NotFound(f"{model}@{version}'s predictions carry no group attribute {attribute!r}")
    frame = pl.DataFrame({"y_true": data.y_true, "y_pred": data.y_pred, "y_score": data.score, attribute: data.groups[attribute]})
    has_score = bool(frame["y_score"].is_not_nan().all())
    return fairness_depth.impossibility(frame.drop("y_score") if not has_score else frame, y_true="y_true", y_pred="y_pred",
                                        y_score="y_score" if has_score else None, sensitive=attribute, min_group_size=min_group_size,
                                        tolerance=tolerance)


def evidence(store: Store, model: str, version: str, *, now: dt.datetime, recent_s: int = 7 * 86400) -> dict[str, Any] | None:
    """What the AI Act audit reads (Art. 72, Art. 15): the number of windows, the latest window's end, the
    accuracy over the recent windows' outcomes, and the recent findings per kind; None without any window."""
    w = windows(store, model, version, limit=100_000)
    if w.height == 0:
        return None
    recent = w.filter(pl.col("window_end") > _utc(now) - dt.timedelta(seconds=recent_s))
    known = recent.filter(pl.col("accuracy").is_not_null() & (pl.col("n_outcomes") > 0))
    n_out = int(known["n_outcomes"].sum()) if known.height else 0
    acc = float((known["accuracy"] * known["n_outcomes"]).sum() / n_out) if n_out else None
    f = findings(store, model, version, start=_utc(now) - dt.timedelta(seconds=recent_s))
    return {"windows": w.height, "first_window_start": w["window_start"].min(), "last_window_end": w["window_end"].max(),
            "recent_windows": recent.height, "recent_outcomes": n_out, "recent_accuracy": acc, "recent_s": recent_s,
            "findings": {k: int(n) for k, n in f.group_by("kind").len().iter_rows()} if f.height else {}}

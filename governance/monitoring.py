"""Post-market monitoring of a deployed model (AI Act Art. 72): per time window, accuracy and error rates,
data drift and prediction drift against a reference window, fairness per group with confidence intervals,
and findings when a threshold is crossed.

Pure: frames or arrays in, results out. Windows and the reference are passed in; nothing reads the clock.

Drift: PSI and two-sample KS per feature (``governance.drift``, which cites their sources). With many rows
KS rejects for shifts too small to matter, so a feature counts as drifted on PSI (>= 0.25), and KS (p below
``ks_alpha`` Bonferroni-divided by the number of features) is reported beside it and raises a moderate PSI
(0.1-0.25) to a drift finding. With few rows PSI itself is noise (an hour of 30 predictions passes 0.25 by
chance in most features, ``governance.drift``), so a significant PSI counts only where a test says it is not
chance at that level: PSI's own chi-squared test on its bins (``psi_pvalues``) or KS, either at ``ks_alpha`` over the
features (so at most twice that by chance in a window; with 30 rows on 10 bins the chi-squared tail is itself
approximate, about three rows a bin).

Prediction drift: the PSI of the score (or of the prediction where there is no score) against the reference,
a finding where it reaches ``prediction_psi_max`` and its chi-squared p-value is below ``ks_alpha``.

Fairness over time: per group of each group attribute, the confusion counts of the window's predictions
whose outcome has arrived, the rates and disparities of ``governance.fairness`` and their percentile
bootstrap intervals (``governance.fairness.confusion_intervals``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from itertools import repeat
from typing import Any

import numpy as np
import polars as pl

from governance import fairness as FZ
from governance.drift import (PSI_BINS, PSI_EPSILON, PSI_MODERATE, PSI_SIGNIFICANT, bin_shares, drift_many, ks_asymp_pvalue,
                              ks_limit_pvalue, ks_test, psi_counts, psi_edges, psi_level, psi_pvalues)

FINDING_KINDS = ("model_drift", "model_prediction_drift", "model_fairness", "model_accuracy_drop")
ANALYZER = "monitoring"


# --- inputs -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class WindowData:
    """A window's predictions as arrays: ``y_true`` NaN where the outcome has not arrived; ``y_pred`` the
    decision (0/1 for a binary classifier); ``score`` NaN where absent; features NaN where missing;
    groups text ("" where missing)."""

    y_pred: np.ndarray
    y_true: np.ndarray
    score: np.ndarray
    features: Mapping[str, np.ndarray]
    groups: Mapping[str, np.ndarray]

    @property
    def n(self) -> int:
        return int(self.y_pred.size)

    def rows(self, start: int, stop: int) -> WindowData:
        """Rows ``start`` to ``stop`` (views, not copies)."""
        return WindowData(self.y_pred[start:stop], self.y_true[start:stop], self.score[start:stop],
                          {k: v[start:stop] for k, v in self.features.items()}, {k: v[start:stop] for k, v in self.groups.items()})

    def take(self, mask: np.ndarray) -> WindowData:
        return WindowData(self.y_pred[mask], self.y_true[mask], self.score[mask], {k: v[mask] for k, v in self.features.items()},
                          {k: v[mask] for k, v in self.groups.items()})


def window_data(frame: pl.DataFrame, *, features: Sequence[str] | None = None, groups: Sequence[str] | None = None,
                threshold: float = 0.5) -> WindowData:
    """From a frame of ``model_prediction`` rows left-joined with ``model_outcome`` (column ``outcome``).
    ``features``/``groups``: the keys to read from the JSON objects (default: those of the first row that
    has them). The decision is ``prediction``, or ``score >= threshold`` where it is null."""
    n = frame.height
    feats = list(features) if features is not None else _keys(frame, "features")
    grps = list(groups) if groups is not None else _keys(frame, "groups")
    pred = frame["prediction"].cast(pl.Float64)
    score = frame["score"].cast(pl.Float64)
    y_pred = pl.select(pl.coalesce(pred, (score >= threshold).cast(pl.Float64))).to_series().fill_null(np.nan).to_numpy()
    y_true = (frame["outcome"].cast(pl.Float64) if "outcome" in frame.columns else pl.Series([None] * n, dtype=pl.Float64)).fill_null(np.nan).to_numpy()
    fdict: dict[str, np.ndarray] = {}
    if feats and n:
        dec = frame["features"].str.json_decode(pl.Struct([pl.Field(f, pl.Float64) for f in feats]))
        for f in feats:
            fdict[f] = dec.struct.field(f).fill_null(np.nan).to_numpy()
    gdict: dict[str, np.ndarray] = {}
    if grps and n:
        dec = frame["groups"].str.json_decode(pl.Struct([pl.Field(g, pl.String) for g in grps]))
        for g in grps:
            gdict[g] = dec.struct.field(g).fill_null("").to_numpy().astype(str)
    return WindowData(y_pred.astype(float), y_true.astype(float), score.fill_null(np.nan).to_numpy().astype(float), fdict, gdict)


def _keys(frame: pl.DataFrame, col: str) -> list[str]:
    for v in frame[col].drop_nulls().head(1).to_list():
        return sorted(json.loads(v))
    return []


# --- configuration and results -------------------------------------------------------------------


@dataclass(frozen=True)
class MonitoringConfig:
    """Thresholds of a monitored model. ``fairness_metric``: the ``governance.fairness`` disparity watched
    over time, with ``fairness_max`` its largest acceptable value (0.1, as ``FairnessPolicy``'s equalized
    odds default); ``accuracy_drop``: largest acceptable fall of accuracy below the reference's."""

    bins: int = PSI_BINS
    epsilon: float = PSI_EPSILON
    psi_moderate: float = PSI_MODERATE
    psi_significant: float = PSI_SIGNIFICANT
    ks_alpha: float = 0.001
    ks_method: str = "limit"
    prediction_psi_max: float = PSI_SIGNIFICANT
    fairness_metric: str = "equalized_odds_difference"
    fairness_max: float | None = 0.1
    accuracy_drop: float = 0.05
    min_group_size: int = 30
    min_window_size: int = 30
    bootstrap: int = 100
    confidence: float = 0.95
    seed: int = 0

    def __post_init__(self) -> None:
        if self.fairness_metric not in FZ.SUMMARY:
            raise ValueError(f"fairness_metric {self.fairness_metric!r}: expected one of {', '.join(FZ.SUMMARY)}")
        if self.ks_method not in ("auto", "asymp", "exact", "limit"):
            raise ValueError("ks_method: auto, exact, asymp or limit")
        if self.bins < 2 or not 0 < self.epsilon < 1:
            raise ValueError("bins >= 2 and 0 < epsilon < 1")

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class Reference:
    """What every window is compared with, computed once: per feature the sorted values, bin edges and
    shares; the score's bins; the reference accuracy."""

    n: int
    features: Mapping[str, tuple[np.ndarray, np.ndarray, np.ndarray]]  # sorted values, edges, shares
    prediction: tuple[np.ndarray, np.ndarray] | None  # edges, shares of the score (or prediction)
    accuracy: float | None
    prediction_n: int  # the reference's scores (or predictions) in those shares: the chi-squared test's reference counts


def reference(data: WindowData, config: MonitoringConfig | None = None) -> Reference:
    cfg = config or MonitoringConfig()
    feats = {}
    for k, v in data.features.items():
        vals = v[~np.isnan(v)]
        if vals.size == 0:
            continue
        edges = psi_edges(vals, cfg.bins)
        feats[k] = (np.sort(vals), edges, bin_shares(vals, edges))
    pv = _prediction_values(data)
    pred = None
    pred_n = 0
    if pv is not None and (~np.isnan(pv)).any():
        edges = psi_edges(pv, cfg.bins)
        pred = (edges, bin_shares(pv, edges))
        pred_n = int((~np.isnan(pv)).sum())
    return Reference(data.n, feats, pred, _binary(data)["accuracy"], pred_n)


def _prediction_values(d: WindowData) -> np.ndarray | None:
    if d.n == 0:
        return None
    return d.score if (~np.isnan(d.score)).any() else d.y_pred


def _binary(d: WindowData) -> dict[str, Any]:
    known = ~np.isnan(d.y_true) & ~np.isnan(d.y_pred)
    yt, yp = d.y_true[known], d.y_pred[known]
    out: dict[str, Any] = {"n_outcomes": int(known.sum()), "accuracy": None, "tpr": None, "fpr": None, "fnr": None, "selection_rate": None}
    if not known.any():
        return out
    binary = bool(((yt == 0.0) | (yt == 1.0)).all() and ((yp == 0.0) | (yp == 1.0)).all())
    if not binary:  # multiclass or regression: accuracy is exact match; error rates undefined
        out["accuracy"] = float(np.mean(yt == yp))
        out["mae"] = float(np.mean(np.abs(yt - yp)))
        return out
    # One bincount over the cell index true * 2 + predicted (0/1 each): tn, fp, fn, tp.
    tn, fp, fn, tp = (float(c) for c in np.bincount((yt * 2 + yp).astype(np.int64), minlength=4).tolist())
    # The definitions of governance.fairness._rates, in scalars (numpy per window cost more than the rest).
    n, pos, neg = tp + fp + tn + fn, tp + fn, fp + tn
    out.update(accuracy=(tp + tn) / n, selection_rate=(tp + fp) / n, tpr=tp / pos if pos else None,
               fpr=fp / neg if neg else None, fnr=fn / pos if pos else None)
    return out


@dataclass(frozen=True)
class FeatureDrift:
    feature: str
    psi: float | None
    level: str
    ks: float | None
    ks_pvalue: float | None
    n: int
    drifted: bool = False
    psi_pvalue: float | None = None  # chi-squared test of PSI's bins against the reference's (drift.psi_pvalues)

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class GroupWindow:
    group: str
    count: int
    judged: bool
    rates: dict[str, float | None]
    ci: dict[str, tuple[float, float] | None]

    def to_dict(self) -> dict[str, Any]:
        return {"group": self.group, "count": self.count, "judged": self.judged, **self.rates,
                "ci": {k: list(v) if v else None for k, v in self.ci.items()}}


@dataclass(frozen=True)
class AttributeWindow:
    attribute: str
    groups: tuple[GroupWindow, ...]
    summary: dict[str, float | None]
    summary_ci: dict[str, tuple[float, float] | None]

    def to_dict(self) -> dict[str, Any]:
        return {"attribute": self.attribute, "groups": [g.to_dict() for g in self.groups], "summary": self.summary,
                "summary_ci": {k: list(v) if v else None for k, v in self.summary_ci.items()}}


@dataclass(frozen=True)
class WindowResult:
    window_start: datetime | None
    window_end: datetime | None
    n_predictions: int
    metrics: dict[str, Any]
    prediction_psi: float | None
    drift: tuple[FeatureDrift, ...]
    fairness: tuple[AttributeWindow, ...]
    findings: tuple[dict[str, Any], ...] = ()
    notes: tuple[str, ...] = ()
    prediction_psi_pvalue: float | None = None

    @property
    def status(self) -> str:
        kinds = sorted({f["kind"].removeprefix("model_") for f in self.findings})
        return ",".join(kinds) if kinds else "ok"

    @property
    def fairness_gap(self) -> float | None:
        vals = [a.summary.get("_watched") for a in self.fairness if a.summary.get("_watched") is not None]
        return max(vals) if vals else None  # type: ignore[type-var]

    def to_dict(self) -> dict[str, Any]:
        return {"window_start": self.window_start.isoformat() if self.window_start else None,
                "window_end": self.window_end.isoformat() if self.window_end else None, "n_predictions": self.n_predictions,
                "metrics": self.metrics, "prediction_psi": self.prediction_psi, "prediction_psi_pvalue": self.prediction_psi_pvalue,
                "drift": [d.to_dict() for d in self.drift],
                "fairness": [a.to_dict() for a in self.fairness], "findings": list(self.findings), "status": self.status,
                "notes": list(self.notes)}

    def row(self, model_name: str, model_version: str, evaluated_at: datetime | None = None,
            detail: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The ``monitoring_window`` row of this result; ``detail``: entries added to its ``detail`` JSON."""

        psis = [d.psi for d in self.drift if d.psi is not None]
        kss = [d.ks for d in self.drift if d.ks is not None]
        return {"model_name": model_name, "model_version": model_version, "window_start": self.window_start, "window_end": self.window_end,
                "evaluated_at": evaluated_at, "n_predictions": self.n_predictions, "n_outcomes": self.metrics["n_outcomes"],
                "accuracy": self.metrics["accuracy"], "tpr": self.metrics["tpr"], "fpr": self.metrics["fpr"], "fnr": self.metrics["fnr"],
                "selection_rate": self.metrics["selection_rate"], "prediction_psi": self.prediction_psi,
                "feature_psi_max": max(psis) if psis else None, "feature_ks_max": max(kss) if kss else None,
                "fairness_gap": self.fairness_gap, "status": self.status, "detail": json.dumps({**self.to_dict(), **(detail or {})}, default=str)}


# --- evaluation ---------------------------------------------------------------------------------
#
# Every statistic is computed for all windows of a model at once, over their rows laid end to end
# (``_Stack``): one bincount, sort or searchsorted per feature, attribute or metric, not one per window.
# Python objects are built once per window at the end, from lists read out of the arrays.


_EMPTY = np.empty(0)


@dataclass(frozen=True)
class _Stack:
    """The windows' rows end to end, in window order."""

    n: np.ndarray  # (W,) rows per window
    win: np.ndarray  # (rows,) each row's window
    y_true: np.ndarray
    y_pred: np.ndarray
    known: np.ndarray  # (rows,) decision and outcome both present
    binary: np.ndarray  # (W,) every known decision and outcome is 0 or 1 (a confusion table exists)
    counted: np.ndarray  # (rows,) known, in a binary window: the rows of the confusion tables


def _stack(datas: Sequence[WindowData]) -> _Stack:
    n = np.array([d.n for d in datas], dtype=np.int64)
    win = np.repeat(np.arange(len(datas)), n)
    yt = np.concatenate([d.y_true for d in datas]).astype(float, copy=False)
    yp = np.concatenate([d.y_pred for d in datas]).astype(float, copy=False)
    known = ~np.isnan(yt) & ~np.isnan(yp)
    odd = known & ~(((yt == 0.0) | (yt == 1.0)) & ((yp == 0.0) | (yp == 1.0)))
    binary = np.bincount(win[odd], minlength=len(datas)) == 0
    return _Stack(n, win, yt, yp, known, binary, known & binary[win])


def _metrics_many(datas: Sequence[WindowData], st: _Stack) -> list[dict[str, Any]]:
    """``_binary`` of every window: one bincount over (window, cell) for the confusion counts."""
    w_n = len(datas)
    n_out = np.bincount(st.win[st.known], minlength=w_n).tolist()
    c = st.counted
    cells = np.bincount(st.win[c] * 4 + (st.y_true[c] * 2 + st.y_pred[c]).astype(np.int64), minlength=w_n * 4).reshape(w_n, 4).astype(float)
    tn, fp, fn, tp = (cells[:, i] for i in range(4))
    n, pos, neg = tp + fp + tn + fn, tp + fn, fp + tn
    with np.errstate(divide="ignore", invalid="ignore"):
        acc, sel = ((tp + tn) / n).tolist(), ((tp + fp) / n).tolist()
        tpr, fpr, fnr = (tp / pos).tolist(), (fp / neg).tolist(), (fn / pos).tolist()
    binary = st.binary.tolist()
    out = []
    for w, d in enumerate(datas):
        k = n_out[w]
        if k and not binary[w]:
            out.append(_binary(d))  # multiclass or regression: exact-match accuracy and MAE, per window
        elif k:
            out.append({"n_outcomes": k, "accuracy": acc[w], "tpr": _none(tpr[w]), "fpr": _none(fpr[w]), "fnr": _none(fnr[w]),
                        "selection_rate": sel[w]})
        else:
            out.append({"n_outcomes": 0, "accuracy": None, "tpr": None, "fpr": None, "fnr": None, "selection_rate": None})
    return out


def _fairness_many(datas: Sequence[WindowData], st: _Stack, cfg: MonitoringConfig, rng: np.random.Generator) -> list[tuple[AttributeWindow, ...]]:
    """Fairness of every window, per group attribute, with one bootstrap draw for all windows
    (``governance.fairness.confusion_intervals_many``). Only binary decisions with known outcomes count."""
    w_n = len(datas)
    out: list[list[AttributeWindow]] = [[] for _ in datas]
    attrs = sorted({a for d in datas for a in d.groups})
    for attr in attrs:
        has = np.array([attr in d.groups for d in datas])
        rows = st.counted & has[st.win]
        # A window without the attribute lends placeholder labels (of the others' type) for its rows, never counted.
        like = next(d.groups[attr] for d in datas if attr in d.groups)
        labels = np.concatenate([d.groups[attr] if attr in d.groups else np.zeros(d.n, dtype=like.dtype) for d in datas])[rows]
        uniq = np.unique(labels)
        if len(uniq) < 2:
            continue
        g = len(uniq)
        code = np.searchsorted(uniq, labels)
        cell = (st.y_true[rows] * 2 + st.y_pred[rows]).astype(np.int64)
        counts = np.bincount((st.win[rows] * g + code) * 4 + cell, minlength=w_n * g * 4).reshape(w_n, g, 4)
        tn, fp, fn, tp = (counts[..., i].astype(float) for i in range(4))
        point = FZ._rates(tp, fp, tn, fn)  # (W, G)
        sizes = counts.sum(axis=2)
        judged = sizes >= cfg.min_group_size
        summary = FZ._summary({k: np.where(judged, v, np.nan) for k, v in point.items()})  # (W,)
        if cfg.bootstrap > 0:
            gci, sci = FZ.confusion_intervals_many(counts, judged, cfg.bootstrap, rng, cfg.confidence)
        else:
            gci, sci = {}, {}
        # Python objects once per attribute, from flat lists zipped in C: reading numpy scalars one by one,
        # or a comprehension per value, cost more than the bootstrap.
        rates = _dicts(FZ.RATES, [_values(point[k]) for k in FZ.RATES])  # window-major, group-minor
        cis = _dicts(FZ.RATES, [_pairs(gci[k]) for k in FZ.RATES]) if gci else [dict.fromkeys(FZ.RATES) for _ in range(w_n * g)]
        sums = _dicts(FZ.SUMMARY, [_values(summary[k]) for k in FZ.SUMMARY])
        scis = _dicts(FZ.SUMMARY, [_pairs(sci[k]) for k in FZ.SUMMARY]) if sci else [dict.fromkeys(FZ.SUMMARY) for _ in range(w_n)]
        size_l, judged_l, names = sizes.ravel().tolist(), judged.ravel().tolist(), [str(u) for u in uniq]
        for w in np.flatnonzero((sizes > 0).sum(axis=1) >= 2).tolist():
            at = w * g
            groups = tuple(GroupWindow(names[i], size_l[at + i], judged_l[at + i], rates[at + i], cis[at + i]) for i in range(g) if size_l[at + i])
            sm = sums[w]
            sm["_watched"] = sm[cfg.fairness_metric]  # the configured metric, so a stored window says which gap it watched
            out[w].append(AttributeWindow(attr, groups, sm, scis[w]))
    return [tuple(x) for x in out]


def _values(a: np.ndarray) -> list[float | None]:
    """``a``'s values in C order as Python floats, None where NaN."""
    out: list[float | None] = a.ravel().tolist()
    for j in np.flatnonzero(np.isnan(a.ravel())).tolist():
        out[j] = None
    return out


def _pairs(bounds: np.ndarray) -> list[tuple[float, float] | None]:
    """(lower, upper) pairs of a (2, ...) array of bounds in C order, None where either is NaN."""
    lo, hi = bounds[0].ravel(), bounds[1].ravel()
    out: list[tuple[float, float] | None] = list(zip(lo.tolist(), hi.tolist()))
    for j in np.flatnonzero(np.isnan(lo) | np.isnan(hi)).tolist():
        out[j] = None
    return out


def _dicts(keys: Sequence[str], columns: Sequence[list[Any]]) -> list[dict[str, Any]]:
    """One dict per position of the equally long ``columns``, keyed by ``keys`` in order."""
    return list(map(dict, map(zip, repeat(keys), zip(*columns))))


def _none(x: float) -> float | None:
    return None if x != x else x


def _drift_many(ref: Reference, datas: Sequence[WindowData], st: _Stack,
                cfg: MonitoringConfig) -> dict[str, tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
    """Per feature, for every window at once: (PSI, KS statistic, PSI's p-value, rows), NaN where a window has
    no value (``governance.drift.drift_many``)."""
    w_n = len(datas)
    out: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = {}
    for name, (ref_sorted, edges, shares) in ref.features.items():
        parts = [d.features.get(name, _EMPTY) for d in datas]
        vals = np.concatenate(parts).astype(float, copy=False)
        ok = ~np.isnan(vals)
        rows_win = st.win if vals.size == st.win.size and all(p.size == d.n for p, d in zip(parts, datas)) else \
            np.repeat(np.arange(w_n), [p.size for p in parts])
        n = np.bincount(rows_win[ok], minlength=w_n)
        ks_v = np.full(w_n, np.nan)
        if n.sum() == 0:
            out[name] = (np.full(w_n, np.nan), ks_v, np.full(w_n, np.nan), n)
            continue
        psi_v, ks_v, psi_p = drift_many(ref_sorted, edges, shares, vals[ok], n, cfg.epsilon)
        out[name] = (psi_v, ks_v, psi_p, n)
    return out


def _prediction_psi_many(ref: Reference, datas: Sequence[WindowData], st: _Stack,
                         cfg: MonitoringConfig) -> tuple[list[float | None], list[float | None]]:
    """Prediction drift of every window: the PSI of its scores (or, in a window without any score, its
    decisions) on the reference's score bins, and that PSI's p-value (``psi_pvalues``)."""
    if ref.prediction is None:
        return [None] * len(datas), [None] * len(datas)
    edges, shares = ref.prediction
    w_n = len(datas)
    score = np.concatenate([d.score for d in datas]).astype(float, copy=False)
    scored = np.bincount(st.win[~np.isnan(score)], minlength=w_n) > 0
    vals = np.where(scored[st.win], score, st.y_pred)
    ok = ~np.isnan(vals)
    w = st.win[ok]
    n = np.bincount(w, minlength=w_n)
    nb = len(edges) + 1
    counts = np.bincount(w * nb + np.searchsorted(edges, vals[ok], side="right"), minlength=w_n * nb).reshape(w_n, nb)
    return _values(psi_counts(counts, n, shares, cfg.epsilon)), _values(psi_pvalues(counts, n, shares, ref.prediction_n))


def _findings(window_start: datetime | None, window_end: datetime | None, metrics: dict[str, Any], prediction_psi: float | None,
              prediction_p: float | None, hits: list[FeatureDrift], fairness: tuple[AttributeWindow, ...], ref: Reference,
              cfg: MonitoringConfig, subject: str) -> tuple[dict[str, Any], ...]:
    """The findings (``FINDING_KINDS``) a judged window's figures raise; ``hits``: its drifted features."""
    findings: list[dict[str, Any]] = []
    ev_base = {"window_start": window_start, "window_end": window_end, "analyzer": ANALYZER, "subject": subject}
    if hits:
        worst = max(hits, key=lambda f: f.psi or 0)
        findings.append({**ev_base, "kind": "model_drift", "severity": "critical" if (worst.psi or 0) >= cfg.psi_significant else "warning",
                         "score": worst.psi, "summary": f"data drift on {', '.join(f.feature for f in hits)} (PSI {worst.feature} {worst.psi:.3f}, KS {worst.ks:.3f})",
                         "evidence": {"features": [f.to_dict() for f in hits], "psi_significant": cfg.psi_significant, "ks_alpha": cfg.ks_alpha}})
    if prediction_psi is not None and prediction_psi >= cfg.prediction_psi_max and prediction_p is not None and prediction_p < cfg.ks_alpha:
        findings.append({**ev_base, "kind": "model_prediction_drift", "severity": "warning", "score": prediction_psi,
                         "summary": f"prediction drift: PSI of the scores {prediction_psi:.3f} >= {cfg.prediction_psi_max} (p {prediction_p:.2g})",
                         "evidence": {"prediction_psi": prediction_psi, "prediction_psi_pvalue": prediction_p, "ks_alpha": cfg.ks_alpha}})
    acc = metrics.get("accuracy")
    if acc is not None and ref.accuracy is not None and metrics["n_outcomes"] >= cfg.min_window_size and acc < ref.accuracy - cfg.accuracy_drop:
        findings.append({**ev_base, "kind": "model_accuracy_drop", "severity": "warning", "score": acc,
                         "summary": f"accuracy {acc:.3f} below the reference {ref.accuracy:.3f} by more than {cfg.accuracy_drop}",
                         "evidence": {"accuracy": acc, "reference_accuracy": ref.accuracy, "n_outcomes": metrics["n_outcomes"]}})
    if cfg.fairness_max is not None:
        for a in fairness:
            v = a.summary.get(cfg.fairness_metric)
            ci = a.summary_ci.get(cfg.fairness_metric)
            if v is not None and v > cfg.fairness_max:
                sure = ci is not None and ci[0] > cfg.fairness_max
                findings.append({**ev_base, "kind": "model_fairness", "severity": "critical" if sure else "warning", "score": v,
                                 "subject": f"{subject}/attribute:{a.attribute}",
                                 "summary": f"{cfg.fairness_metric} by {a.attribute} {v:.3f} > {cfg.fairness_max}"
                                            + (f" (95% CI {ci[0]:.3f}-{ci[1]:.3f})" if ci else ""),
                                 "evidence": {"attribute": a.attribute, "metric": cfg.fairness_metric, "value": v, "ci": list(ci) if ci else None,
                                              "groups": {g.group: {"count": g.count, "fpr": g.rates["fpr"], "tpr": g.rates["tpr"],
                                                                   "selection_rate": g.rates["selection_rate"]} for g in a.groups}}})
    return tuple(findings)


def evaluate_window(ref: Reference, data: WindowData, config: MonitoringConfig | None = None, *, subject: str = "model",
                    window_start: datetime | None = None, window_end: datetime | None = None) -> WindowResult:
    """One window against the reference: metrics, drift, fairness with intervals, and findings."""
    return evaluate_windows(ref, [(window_start, window_end, data)], config, subject=subject)[0]


def evaluate_windows(ref: Reference, windows: Sequence[tuple[datetime | None, datetime | None, WindowData]],
                     config: MonitoringConfig | None = None, *, subject: str = "model") -> list[WindowResult]:
    """Many windows of one model, each statistic computed for all of them at once; under ``ks_method``
    ``asymp`` or ``limit`` their KS p-values come from one vectorised call."""
    cfg = config or MonitoringConfig()
    if not windows:
        return []
    rng = np.random.default_rng(cfg.seed)
    datas = [d for _, _, d in windows]
    w_n = len(datas)
    st = _stack(datas)
    metrics = _metrics_many(datas, st)
    many = _drift_many(ref, datas, st, cfg)
    pred, pred_p = _prediction_psi_many(ref, datas, st, cfg)
    fair = _fairness_many(datas, st, cfg, rng)
    names = list(ref.features)
    cols: list[list[Any]] = []  # per feature: (PSI, KS, p-value, rows, PSI's p-value) of every window
    for name in names:
        psi_v, ks_v, psi_p, n = many[name]
        pv: list[Any] = [None] * w_n
        if cfg.ks_method in ("asymp", "limit"):
            has = n > 0
            if has.any():
                f = ks_asymp_pvalue if cfg.ks_method == "asymp" else ks_limit_pvalue
                got = f(ks_v[has], np.full(int(has.sum()), ref.features[name][0].size), n[has]).tolist()
                for w, p in zip(np.flatnonzero(has).tolist(), got):
                    pv[w] = p
        cols.append([psi_v.tolist(), ks_v.tolist(), pv, n.tolist(), _values(psi_p)])
    k = max(len(names), 1)  # Bonferroni: KS is judged at ks_alpha / features
    out = []
    for w, (s, e, d) in enumerate(windows):
        judge = d.n >= cfg.min_window_size
        drift = []
        hits = []
        for name, (psi_l, ks_l, pv_l, n_l, pp_l) in zip(names, cols):
            cnt = n_l[w]
            if cnt == 0:
                drift.append(FeatureDrift(name, None, "unknown", None, None, 0))
                continue
            p, dstat, pv = psi_l[w], ks_l[w], pv_l[w]
            if cfg.ks_method not in ("asymp", "limit"):
                v = d.features[name]
                dstat, pv = ks_test(ref.features[name][0], v[~np.isnan(v)], method=cfg.ks_method)
            ks_hit = pv is not None and pv < cfg.ks_alpha / k
            chance = not ks_hit and not (pp_l[w] is not None and pp_l[w] < cfg.ks_alpha / k)  # neither test rules chance out
            hit = judge and ((p >= cfg.psi_significant and not chance) or (p >= cfg.psi_moderate and ks_hit))
            fd = FeatureDrift(name, p, psi_level(p), dstat, pv, cnt, hit, pp_l[w])
            drift.append(fd)
            if hit:
                hits.append(fd)
        if not judge:
            notes = (f"{d.n} predictions, under {cfg.min_window_size}: drift and fairness not judged",)
            out.append(WindowResult(s, e, d.n, metrics[w], pred[w], tuple(drift), fair[w], (), notes, pred_p[w]))
            continue
        out.append(WindowResult(s, e, d.n, metrics[w], pred[w], tuple(drift), fair[w],
                                _findings(s, e, metrics[w], pred[w], pred_p[w], hits, fair[w], ref, cfg, subject), (), pred_p[w]))
    return out


def _bounds(frame: pl.DataFrame, starts: Sequence[datetime], width_s: float) -> tuple[pl.DataFrame, list[int], list[int]]:
    """``frame`` sorted by ``ts`` and each window's first and past-the-end row, from one search for all windows."""
    w = timedelta(seconds=width_s)
    srt = frame.sort("ts")
    ts = srt["ts"]
    edges = pl.Series([*starts, *(s + w for s in starts)], dtype=ts.dtype) if starts else ts.clear()
    at = ts.search_sorted(edges, side="left").to_list()
    return srt, at[: len(starts)], at[len(starts) :]


def split_windows(frame: pl.DataFrame, starts: Sequence[datetime], width_s: float) -> list[tuple[datetime, datetime, pl.DataFrame]]:
    """Rows of ``frame`` (column ``ts``) in each window ``[start, start + width)``."""

    w = timedelta(seconds=width_s)
    srt, lo, hi = _bounds(frame, starts, width_s)
    return [(s, s + w, srt.slice(a, b - a)) for s, a, b in zip(starts, lo, hi)]


def split_window_data(frame: pl.DataFrame, starts: Sequence[datetime], width_s: float, *, features: Sequence[str] | None = None,
                      groups: Sequence[str] | None = None, threshold: float = 0.5) -> list[tuple[datetime, datetime, WindowData]]:
    """``window_data`` of each window of ``split_windows``, the rows' JSON decoded once for all windows (per
    window it cost more than evaluating them): the same arrays, in the same order, as views of one."""
    w = timedelta(seconds=width_s)
    srt, lo, hi = _bounds(frame, starts, width_s)
    data = window_data(srt, features=features, groups=groups, threshold=threshold)
    return [(s, s + w, data.rows(a, b)) for s, a, b in zip(starts, lo, hi)]

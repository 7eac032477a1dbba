"""Fairness evaluation of a binary classifier's predictions, per group of one or more sensitive features.

Pure: a polars frame (or CSV/Parquet bytes) in, aggregates out. The result holds per-group counts,
confusion counts and rates only, never a row of the input (privacy by design, GDPR Art. 25): the
service stores the result and discards the upload.

Metrics (per group, computed with fairlearn's ``MetricFrame``): count, selection rate P(ŷ=1), true
positive rate, false positive rate, false negative rate, accuracy, plus positive predictive value and
base rate P(y=1), which the impossibility results below are about. A rate whose denominator is zero in
a group (TPR of a group without positives) is ``None``, not fairlearn's 0.

Disparities between groups (fairlearn's ``between_groups`` definitions, over the groups large enough
to judge): demographic parity difference (max − min selection rate) and ratio (min / max); equalized
odds difference (the larger of the TPR and FPR differences) and ratio (the smaller of the two ratios);
equal opportunity difference (TPR difference); FPR, FNR, PPV, accuracy and base-rate differences.

Confidence intervals: percentile bootstrap (Efron & Tibshirani 1993, ch. 13). Every metric here is a
function of the per-group confusion counts, and resampling n rows with replacement draws those counts
from a multinomial over the (group × confusion cell) table, so replicates are drawn from that
multinomial directly: the same distribution as row resampling, in microseconds, without keeping rows.

Policies (``FairnessPolicy``) turn the numbers into pass/fail, e.g. the four-fifths rule on the
selection-rate ratio (US EEOC Uniform Guidelines, 29 CFR 1607.4(D)). When base rates differ between
groups, some criteria cannot all hold at once, and ``judge`` says which instead of hiding it:

- demographic parity with equalized odds: selection rate = FPR + p·(TPR − FPR), so equal TPR and FPR
  with different base rates p force different selection rates unless TPR = FPR (an uninformative
  classifier);
- equal error rates with predictive parity: FPR = p/(1−p) · (1−PPV)/PPV · (1−FNR) (Chouldechova 2017,
  "Fair prediction with disparate impact", Big Data 5(2)), so with different p, equal PPV and FNR force
  different FPR unless prediction is perfect;
- for risk scores, calibration within groups and balance for the positive and the negative class cannot
  hold together unless base rates are equal or prediction is perfect (Kleinberg, Mullainathan, Raghavan
  2016, "Inherent Trade-Offs in the Fair Determination of Risk Scores", arXiv:1609.05807).
"""

from __future__ import annotations

import io
import math
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import polars as pl

from fleetscope.core.errors import FleetscopeError

RATES = ("selection_rate", "tpr", "fpr", "fnr", "accuracy", "ppv", "base_rate")
SUMMARY = (
    "demographic_parity_difference",
    "demographic_parity_ratio",
    "equalized_odds_difference",
    "equalized_odds_ratio",
    "equal_opportunity_difference",
    "fpr_difference",
    "fnr_difference",
    "ppv_difference",
    "accuracy_difference",
    "base_rate_difference",
)


class FairnessInputError(FleetscopeError, ValueError):
    """A prediction table that cannot be evaluated; ``column`` names the culprit where there is one."""

    def __init__(self, message: str, *, column: str | None = None):
        self.message = message
        self.column = column
        super().__init__(f"column {column!r}: {message}" if column else message)


# --- input ---------------------------------------------------------------------------------------


def read_predictions(data: bytes, fmt: str | None = None) -> pl.DataFrame:
    """A prediction table from CSV or Parquet bytes (``fmt`` ``"csv"``/``"parquet"``; by default
    Parquet when the bytes start with its ``PAR1`` magic, CSV otherwise)."""
    if not data:
        raise FairnessInputError("the upload is empty")
    kind = fmt or ("parquet" if data[:4] == b"PAR1" else "csv")
    try:
        if kind == "parquet":
            return pl.read_parquet(io.BytesIO(data))
        if kind == "csv":
            return pl.read_csv(io.BytesIO(data), infer_schema_length=10000)
    except Exception as exc:  # noqa: BLE001 - polars raises many kinds; the user needs the message
        raise FairnessInputError(f"cannot read the upload as {kind}: {str(exc).splitlines()[0][:300]}") from None
    raise FairnessInputError(f"unknown format {fmt!r} (csv or parquet)")


def _labels(df: pl.DataFrame, col: str, positive_label: Any) -> np.ndarray:
    s = df.get_column(col)
    _no_missing(s, col)
    if positive_label is not None:
        values = set(s.unique().to_list())
        if len(values) > 2:
            raise FairnessInputError(f"non-binary labels: {_show(values)}", column=col)
        if len(values) == 2 and positive_label not in values:
            raise FairnessInputError(f"positive label {positive_label!r} is not among the values {_show(values)}", column=col)
        return (s == positive_label).to_numpy().astype(np.int8)
    if s.dtype == pl.Boolean:
        return s.to_numpy().astype(np.int8)
    if not s.dtype.is_numeric():
        raise FairnessInputError(f"labels of type {s.dtype} need positive_label; values: {_show(set(s.unique().to_list()))}", column=col)
    values = set(s.unique().to_list())
    if not values <= {0, 1}:
        raise FairnessInputError(f"non-binary labels: {_show(values)} (expected 0 and 1)", column=col)
    return s.cast(pl.Int8).to_numpy()


def _show(values: set[Any]) -> str:
    shown = sorted(map(repr, values))
    return ", ".join(shown[:8]) + (f", ... ({len(shown)} distinct)" if len(shown) > 8 else "")


def _no_missing(s: pl.Series, col: str) -> None:
    bad = s.is_null()
    if s.dtype.is_float():
        bad = bad | s.is_nan()
    n = int(bad.sum())
    if n:
        first = int(bad.arg_true()[0])
        raise FairnessInputError(f"{n} missing or NaN values (first at row {first})", column=col)


# --- results -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GroupStats:
    """One group of one feature set: confusion counts, rates and their confidence intervals."""

    group: str
    count: int
    tp: int
    fp: int
    tn: int
    fn: int
    judged: bool
    rates: dict[str, float | None]
    ci: dict[str, tuple[float, float] | None]
    auc: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"group": self.group, "count": self.count, "tp": self.tp, "fp": self.fp, "tn": self.tn, "fn": self.fn,
                "judged": self.judged, **self.rates, "auc": self.auc, "ci": {k: list(v) if v else None for k, v in self.ci.items()}}


@dataclass(frozen=True)
class FeatureResult:
    """Groups of one sensitive feature, or of the intersection of several (``columns``)."""

    feature: str
    columns: tuple[str, ...]
    groups: tuple[GroupStats, ...]
    summary: dict[str, float | None]
    summary_ci: dict[str, tuple[float, float] | None]
    notes: tuple[str, ...] = ()

    def group(self, name: str) -> GroupStats:
        for g in self.groups:
            if g.group == name:
                return g
        raise KeyError(name)

    def to_dict(self) -> dict[str, Any]:
        return {"feature": self.feature, "columns": list(self.columns), "groups": [g.to_dict() for g in self.groups],
                "summary": self.summary, "summary_ci": {k: list(v) if v else None for k, v in self.summary_ci.items()},
                "notes": list(self.notes)}


@dataclass(frozen=True)
class FairnessResult:
    """Aggregates only: nothing in here identifies a row of the input."""

    n: int
    min_group_size: int
    bootstrap: int
    seed: int
    confidence: float
    features: tuple[FeatureResult, ...]
    notes: tuple[str, ...] = ()

    def feature(self, name: str) -> FeatureResult:
        for f in self.features:
            if f.feature == name:
                return f
        raise KeyError(name)

    def to_dict(self) -> dict[str, Any]:
        return {"n": self.n, "min_group_size": self.min_group_size, "bootstrap": self.bootstrap, "seed": self.seed,
                "confidence": self.confidence, "features": [f.to_dict() for f in self.features], "notes": list(self.notes)}

    def group_rows(self) -> list[dict[str, Any]]:
        """One record per (feature, group) for the ``fairness_group`` table."""
        rows = []
        for f in self.features:
            for g in f.groups:
                rows.append({"feature": f.feature, "group": g.group, "count": g.count, "tp": g.tp, "fp": g.fp, "tn": g.tn,
                             "fn": g.fn, "judged": g.judged, **g.rates, "auc": g.auc})
        return rows


# --- evaluation ----------------------------------------------------------------------------------


def _rates(tp: np.ndarray, fp: np.ndarray, tn: np.ndarray, fn: np.ndarray) -> dict[str, np.ndarray]:
    """Rates from confusion counts, NaN where the denominator is zero. Works on any array shape."""
    with np.errstate(divide="ignore", invalid="ignore"):
        n = tp + fp + tn + fn
        pos = tp + fn
        neg = fp + tn
        return {
            "selection_rate": np.where(n > 0, (tp + fp) / n, np.nan),
            "tpr": np.where(pos > 0, tp / pos, np.nan),
            "fpr": np.where(neg > 0, fp / neg, np.nan),
            "fnr": np.where(pos > 0, fn / pos, np.nan),
            "accuracy": np.where(n > 0, (tp + tn) / n, np.nan),
            "ppv": np.where(tp + fp > 0, tp / (tp + fp), np.nan),
            "base_rate": np.where(n > 0, pos / n, np.nan),
        }


def _summary(r: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Between-group disparities over the last axis (groups); NaN where fewer than two groups have the rate."""

    def bounds(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(at least two groups have the rate, the largest, the smallest)."""
        # fmax/fmin skip NaN like nanmax/nanmin without their all-NaN warning (and its cost per call).
        # An elementwise pass per group rather than a reduction over the (short) last axis: numpy
        # reduces a 3-long axis element by element, which cost the monitoring bootstrap most of its time.
        cols = [x[..., i] for i in range(x.shape[-1])]
        finite = sum((c == c).astype(np.int64) for c in cols) if cols else np.zeros(x.shape[:-1], dtype=np.int64)
        hi, lo = (cols[0].copy(), cols[0].copy()) if cols else (np.full(x.shape[:-1], np.nan), np.full(x.shape[:-1], np.nan))
        for c in cols[1:]:
            np.fmax(hi, c, out=hi)
            np.fmin(lo, c, out=lo)
        return finite >= 2, hi, lo

    def difference(x: np.ndarray) -> np.ndarray:
        ok, hi, lo = bounds(x)
        with np.errstate(invalid="ignore"):
            return np.where(ok, hi - lo, np.nan)

    def spread(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        ok, hi, lo = bounds(x)
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(ok, hi - lo, np.nan), np.where(ok & (hi > 0), lo / np.where(hi > 0, hi, 1), np.where(ok, 1.0, np.nan))

    dp_d, dp_r = spread(r["selection_rate"])
    tpr_d, tpr_r = spread(r["tpr"])
    fpr_d, fpr_r = spread(r["fpr"])
    return {
        "demographic_parity_difference": dp_d,
        "demographic_parity_ratio": dp_r,
        "equalized_odds_difference": np.fmax(tpr_d, fpr_d),
        "equalized_odds_ratio": np.fmin(tpr_r, fpr_r),
        "equal_opportunity_difference": tpr_d,
        "fpr_difference": fpr_d,
        "fnr_difference": difference(r["fnr"]),
        "ppv_difference": difference(r["ppv"]),
        "accuracy_difference": difference(r["accuracy"]),
        "base_rate_difference": difference(r["base_rate"]),
    }


def _f(x: Any) -> float | None:
    x = float(x)
    return None if math.isnan(x) else x


def _metricframe_rates(y_true: np.ndarray, y_pred: np.ndarray, groups: np.ndarray) -> dict[str, dict[str, float]]:
    """fairlearn's per-group rates, the reference the numbers are reported from."""
    from fairlearn.metrics import (  # lazy: fairlearn/scikit-learn, only for fairness
        MetricFrame,
        count,
        false_negative_rate,
        false_positive_rate,
        selection_rate,
        true_positive_rate,
    )
    from sklearn.metrics import accuracy_score  # lazy: fairlearn/scikit-learn, only for fairness

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # sklearn warns on groups without positives; we report None there
        mf = MetricFrame(
            metrics={"count": count, "selection_rate": selection_rate, "tpr": true_positive_rate,
                     "fpr": false_positive_rate, "fnr": false_negative_rate, "accuracy": accuracy_score},
            y_true=y_true, y_pred=y_pred, sensitive_features=groups,
        )
    bg = mf.by_group
    return {str(g): {k: float(bg.loc[g, k]) for k in bg.columns} for g in bg.index}


def _auc_by_group(y_true: np.ndarray, y_score: np.ndarray, groups: np.ndarray) -> dict[str, float | None]:
    from fairlearn.metrics import MetricFrame  # lazy: fairlearn/scikit-learn, only for fairness
    from sklearn.metrics import roc_auc_score  # lazy: fairlearn/scikit-learn, only for fairness

    def auc(t: np.ndarray, s: np.ndarray) -> float:
        return float(roc_auc_score(t, s)) if len(np.unique(t)) == 2 else float("nan")

    mf = MetricFrame(metrics=auc, y_true=y_true, y_pred=y_score, sensitive_features=groups)
    return {str(g): _f(v) for g, v in mf.by_group.items()}


def evaluate(
    frame: pl.DataFrame,
    *,
    y_true: str = "y_true",
    y_pred: str = "y_pred",
    sensitive: Sequence[str],
    y_score: str | None = None,
    positive_label: Any = None,
    min_group_size: int = 30,
    intersections: bool = True,
    bootstrap: int = 500,
    seed: int = 0,
    confidence: float = 0.95,
) -> FairnessResult:
    """Evaluate predictions ``frame[y_pred]`` against ``frame[y_true]`` per group of each column in
    ``sensitive`` and, with ``intersections`` and more than one column, of their intersection.

    Labels are 0/1 (or booleans; other values with ``positive_label``). Groups with fewer than
    ``min_group_size`` rows are reported but excluded from disparities and policies: a rate over a
    handful of people says more about chance than about the model. ``bootstrap`` replicates (0: none)
    with ``seed`` give ``confidence`` percentile intervals.

    Raises ``FairnessInputError`` for a missing column, missing/NaN values, non-binary labels, a
    sensitive feature with a single group, or an empty table.
    """
    if isinstance(sensitive, str):
        sensitive = [sensitive]
    sensitive = list(sensitive)
    if not sensitive:
        raise FairnessInputError("at least one sensitive feature is needed")
    needed = [y_true, y_pred, *sensitive] + ([y_score] if y_score else [])
    missing = [c for c in needed if c not in frame.columns]
    if missing:
        raise FairnessInputError(f"missing column(s) {', '.join(map(repr, missing))}; the table has {', '.join(map(repr, frame.columns[:30]))}", column=missing[0])
    if len(set(needed)) != len(needed):
        raise FairnessInputError("a column is used twice among labels, predictions, scores and sensitive features")
    if frame.height == 0:
        raise FairnessInputError("the table has no rows")
    if min_group_size < 1:
        raise ValueError("min_group_size must be >= 1")
    if not 0 < confidence < 1:
        raise ValueError("confidence must be between 0 and 1")
    yt = _labels(frame, y_true, positive_label)
    yp = _labels(frame, y_pred, positive_label)
    score = None
    if y_score:
        s = frame.get_column(y_score)
        if not s.dtype.is_numeric():
            raise FairnessInputError(f"scores must be numeric, got {s.dtype}", column=y_score)
        _no_missing(s, y_score)
        score = s.cast(pl.Float64).to_numpy()
        if not np.isfinite(score).all():
            raise FairnessInputError("scores must be finite", column=y_score)
    labels: dict[str, np.ndarray] = {}
    for c in sensitive:
        s = frame.get_column(c)
        _no_missing(s, c)
        labels[c] = s.cast(pl.String).to_numpy().astype(str)
        if len(np.unique(labels[c])) < 2:
            raise FairnessInputError(f"a single group ({labels[c][0]!r}): fairness compares groups, so at least two are needed", column=c)
    feature_sets: list[tuple[str, tuple[str, ...], np.ndarray]] = [(c, (c,), labels[c]) for c in sensitive]
    if intersections and len(sensitive) > 1:
        combo = np.array([f"{sensitive[0]}={v}" for v in labels[sensitive[0]]], dtype=object)
        for c in sensitive[1:]:
            combo = combo + np.array([f"|{c}={v}" for v in labels[c]], dtype=object)
        feature_sets.append(("&".join(sensitive), tuple(sensitive), combo.astype(str)))
    rng = np.random.default_rng(seed)
    results = [_evaluate_feature(name, cols, g, yt, yp, score, min_group_size, bootstrap, rng, confidence) for name, cols, g in feature_sets]
    notes = []
    if positive_label is not None:
        notes.append(f"positive label: {positive_label!r}")
    return FairnessResult(frame.height, min_group_size, bootstrap, seed, confidence, tuple(results), tuple(notes))


def _evaluate_feature(
    name: str, cols: tuple[str, ...], groups: np.ndarray, yt: np.ndarray, yp: np.ndarray, score: np.ndarray | None,
    min_group_size: int, bootstrap: int, rng: np.random.Generator, confidence: float,
) -> FeatureResult:
    uniq, codes = np.unique(groups, return_inverse=True)
    cell = codes * 4 + yt * 2 + yp  # cells per group: 0 tn, 1 fp, 2 fn, 3 tp
    counts = np.bincount(cell, minlength=len(uniq) * 4).reshape(len(uniq), 4)
    tn, fp, fn, tp = (counts[:, i].astype(float) for i in range(4))
    point = _rates(tp, fp, tn, fn)
    mf = _metricframe_rates(yt, yp, groups)
    aucs = _auc_by_group(yt, score, groups) if score is not None else {}
    n_group = counts.sum(axis=1)
    judged = n_group >= min_group_size
    notes: list[str] = []
    small = [str(u) for u, j in zip(uniq, judged) if not j]
    if small:
        notes.append(f"{len(small)} group(s) under {min_group_size} rows reported but not judged: {', '.join(small[:10])}")
    if judged.sum() < 2:
        notes.append(f"fewer than two groups of at least {min_group_size} rows: disparities not computed")

    def judged_only(r: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {k: np.where(judged, v, np.nan) for k, v in r.items()}

    summary_point = _summary(judged_only(point))
    group_ci, summary_ci = confusion_intervals(counts, judged, bootstrap, rng, confidence)
    out_groups = []
    for i, u in enumerate(uniq):
        rates: dict[str, float | None] = {}
        for k in RATES:
            v = _f(point[k][i])
            # Report fairlearn's value where the rate is defined; where it is not (no positives, no
            # negatives) fairlearn returns 0, which would read as a measured rate, so report None.
            rates[k] = None if v is None else mf[str(u)].get(k, v)
        ci = {k: (None if k not in group_ci or np.isnan(group_ci[k][:, i]).any() else (float(group_ci[k][0, i]), float(group_ci[k][1, i])))
              for k in RATES}
        out_groups.append(GroupStats(str(u), int(n_group[i]), int(tp[i]), int(fp[i]), int(tn[i]), int(fn[i]), bool(judged[i]), rates, ci, aucs.get(str(u))))
    return FeatureResult(name, cols, tuple(out_groups), {k: _f(v) for k, v in summary_point.items()}, summary_ci, tuple(notes))


def confusion_intervals(
    counts: np.ndarray, judged: np.ndarray, bootstrap: int, rng: np.random.Generator, confidence: float,
) -> tuple[dict[str, np.ndarray], dict[str, tuple[float, float] | None]]:
    """Percentile-bootstrap intervals of every rate per group and of every between-group disparity, from
    a (groups x 4) table of confusion counts in the cell order tn, fp, fn, tp.

    Replicates are drawn from the multinomial over the (group x cell) table (see the module docstring):
    ``group_ci[rate]`` is a (2, groups) array of lower and upper bounds; ``summary_ci[metric]`` a (lo, hi)
    pair or None. ``judged`` (groups,) masks the groups the disparities are taken over."""
    summary_ci: dict[str, tuple[float, float] | None] = {k: None for k in SUMMARY}
    if bootstrap <= 0:
        return {}, summary_ci
    gci, sci = confusion_intervals_many(counts[None], judged[None], bootstrap, rng, confidence)
    for k in SUMMARY:
        lo, hi = sci[k][:, 0]
        if not np.isnan(lo):
            summary_ci[k] = (float(lo), float(hi))
    return {k: v[:, 0, :] for k, v in gci.items()}, summary_ci


def confusion_intervals_many(
    counts: np.ndarray, judged: np.ndarray, bootstrap: int, rng: np.random.Generator, confidence: float,
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """``confusion_intervals`` for W tables at once: ``counts`` (W, groups, 4), ``judged`` (W, groups);
    returns per rate a (2, W, groups) and per disparity a (2, W) array of bounds, NaN where undefined.
    One multinomial draw and one sort serve every table: what lets ``governance.monitoring`` bootstrap a
    week of hourly windows in one call per model and attribute."""
    w, g = counts.shape[0], counts.shape[1]
    alpha = (1 - confidence) / 2
    n = counts.reshape(w, -1).sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        p = np.where(n[:, None] > 0, counts.reshape(w, -1) / np.maximum(n, 1)[:, None], 1.0 / (g * 4))
    draws = rng.multinomial(n, p, size=(bootstrap, w))
    # Replicates on the last axis, cells first: (4, W, G, B). Each statistic below is then a contiguous
    # row of B replicates, sorted in place; transposing the counts once is cheaper than the statistics.
    cells = np.ascontiguousarray(draws.reshape(bootstrap, w, g, 4).transpose(3, 1, 2, 0), dtype=float)
    rb = _rates(cells[3], cells[1], cells[0], cells[2])  # (W, G, B)
    # _summary takes groups on the last axis: a view with them there, the judged mask applied first.
    sb = _summary({k: np.moveaxis(np.where(judged[:, :, None], v, np.nan), 1, -1) for k, v in rb.items()})  # (W, B)
    stats = np.concatenate([rb[k].reshape(-1, bootstrap) for k in RATES] + [sb[k] for k in SUMMARY])
    stats.sort(axis=1)
    q = _quantile_sorted_rows(stats, np.array([alpha, 1 - alpha]))
    gci = {k: q[:, i * w * g : (i + 1) * w * g].reshape(2, w, g) for i, k in enumerate(RATES)}
    base = len(RATES) * w * g
    sci = {k: q[:, base + j * w : base + (j + 1) * w] for j, k in enumerate(SUMMARY)}
    return gci, sci


def _quantile_sorted_rows(srt: np.ndarray, qs: np.ndarray) -> np.ndarray:
    """``np.nanquantile(v, qs, axis=1)`` (linear interpolation, Hyndman & Fan type 7) of rows already sorted
    with NaN last (``ndarray.sort`` puts them there), so row j's k_j finite values come first; (len(qs), rows).
    ``np.nanquantile`` applies a Python function per row, which cost the monitoring benchmark most of its time."""
    rows, b = srt.shape
    k = np.full(rows, b, dtype=np.int64)
    short = np.flatnonzero(np.isnan(srt[:, -1]))  # only rows ending in NaN hold any
    if short.size:
        k[short] = b - np.isnan(srt[short]).sum(axis=1)
    h = (np.maximum(k, 1) - 1)[None, :] * qs[:, None]
    lo = np.floor(h).astype(np.int64)
    hi = np.minimum(lo + 1, np.maximum(k - 1, 0)[None, :])
    r = np.arange(rows)[None, :]
    a, c = srt[r, lo], srt[r, hi]
    with np.errstate(invalid="ignore"):
        out = a + (h - lo) * (c - a)
    return np.where(k[None, :] > 0, out, np.nan)


# --- policy --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FairnessPolicy:
    """Thresholds a model's evaluation must meet; ``None`` switches a criterion off.

    The default is the four-fifths rule (selection-rate ratio at least 0.8, 29 CFR 1607.4(D)) and an
    equalized-odds difference of at most 0.1. ``features`` limits judging to some feature sets
    (default: all evaluated). ``base_rate_tolerance``: base rates further apart than this count as
    different for the impossibility notes.
    """

    min_selection_rate_ratio: float | None = 0.8
    max_demographic_parity_difference: float | None = None
    max_equalized_odds_difference: float | None = 0.1
    min_equalized_odds_ratio: float | None = None
    max_equal_opportunity_difference: float | None = None
    max_fpr_difference: float | None = None
    max_fnr_difference: float | None = None
    max_predictive_parity_difference: float | None = None
    features: tuple[str, ...] | None = None
    base_rate_tolerance: float = 0.02

    def criteria(self) -> list[tuple[str, str, str, float]]:
        """(criterion, summary metric, comparison, threshold) for each criterion switched on."""
        table = [
            ("min_selection_rate_ratio", "demographic_parity_ratio", ">=", self.min_selection_rate_ratio),
            ("max_demographic_parity_difference", "demographic_parity_difference", "<=", self.max_demographic_parity_difference),
            ("max_equalized_odds_difference", "equalized_odds_difference", "<=", self.max_equalized_odds_difference),
            ("min_equalized_odds_ratio", "equalized_odds_ratio", ">=", self.min_equalized_odds_ratio),
            ("max_equal_opportunity_difference", "equal_opportunity_difference", "<=", self.max_equal_opportunity_difference),
            ("max_fpr_difference", "fpr_difference", "<=", self.max_fpr_difference),
            ("max_fnr_difference", "fnr_difference", "<=", self.max_fnr_difference),
            ("max_predictive_parity_difference", "ppv_difference", "<=", self.max_predictive_parity_difference),
        ]
        return [(c, m, op, float(t)) for c, m, op, t in table if t is not None]

    def to_dict(self) -> dict[str, Any]:
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in self.__dict__.items()}


@dataclass(frozen=True)
class Check:
    feature: str
    criterion: str
    metric: str
    value: float | None
    comparison: str
    threshold: float
    passed: bool | None  # None: not judged (fewer than two large-enough groups)
    ci: tuple[float, float] | None
    uncertain: bool  # the confidence interval straddles the threshold

    def to_dict(self) -> dict[str, Any]:
        return {**self.__dict__, "ci": list(self.ci) if self.ci else None}


@dataclass(frozen=True)
class Conflict:
    """Criteria that cannot all hold for this feature because base rates differ."""

    feature: str
    criteria: tuple[str, ...]
    base_rates: dict[str, float]
    explanation: str
    reference: str

    def to_dict(self) -> dict[str, Any]:
        return {**self.__dict__, "criteria": list(self.criteria)}


@dataclass(frozen=True)
class PolicyOutcome:
    """``passed``: True when every judged check passes, False when one fails, None when nothing could
    be judged. ``conflicts`` are stated whether or not the checks pass."""

    passed: bool | None
    checks: tuple[Check, ...]
    conflicts: tuple[Conflict, ...]
    notes: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"passed": self.passed, "checks": [c.to_dict() for c in self.checks],
                "conflicts": [c.to_dict() for c in self.conflicts], "notes": list(self.notes)}


_EO = {"max_equalized_odds_difference", "min_equalized_odds_ratio"}
_DP = {"min_selection_rate_ratio", "max_demographic_parity_difference"}
_ERR = _EO | {"max_fpr_difference", "max_fnr_difference"}
_PP = {"max_predictive_parity_difference"}


def judge(result: FairnessResult, policy: FairnessPolicy) -> PolicyOutcome:
    """Apply ``policy`` to ``result``: one check per criterion and feature set, and the conflicts the
    impossibility results predict for the criteria the policy asks for together (see module docstring)."""
    checks: list[Check] = []
    conflicts: list[Conflict] = []
    notes: list[str] = []
    features = [f for f in result.features if policy.features is None or f.feature in policy.features]
    if policy.features is not None:
        unknown = set(policy.features) - {f.feature for f in result.features}
        if unknown:
            notes.append(f"policy names feature set(s) not evaluated: {', '.join(sorted(unknown))}")
    asked = {c for c, *_ in policy.criteria()}
    for f in features:
        for crit, metric, op, thr in policy.criteria():
            v = f.summary.get(metric)
            ci = f.summary_ci.get(metric)
            if v is None:
                checks.append(Check(f.feature, crit, metric, None, op, thr, None, ci, False))
                continue
            ok = v >= thr if op == ">=" else v <= thr
            uncertain = ci is not None and ci[0] <= thr <= ci[1]
            checks.append(Check(f.feature, crit, metric, v, op, thr, ok, ci, uncertain))
        rates = {g.group: g.rates["base_rate"] for g in f.groups if g.judged and g.rates["base_rate"] is not None}
        if len(rates) < 2 or max(rates.values()) - min(rates.values()) <= policy.base_rate_tolerance:
            continue
        br = ", ".join(f"{k} {v:.1%}" for k, v in sorted(rates.items()))
        if asked & _DP and asked & _EO:
            conflicts.append(Conflict(
                f.feature, tuple(sorted(asked & (_DP | _EO))), rates,
                "Demographic parity and equalized odds cannot both hold: selection rate = FPR + base rate x (TPR - FPR), "
                f"so equal TPR and FPR with different base rates ({br}) give different selection rates unless the "
                "classifier is uninformative (TPR = FPR).",
                "Barocas, Hardt, Narayanan, Fairness and Machine Learning (2023), ch. 3; Kleinberg et al. 2016",
            ))
        if asked & _PP and asked & _ERR:
            conflicts.append(Conflict(
                f.feature, tuple(sorted(asked & (_PP | _ERR))), rates,
                "Predictive parity (equal PPV) and equal error rates cannot both hold: FPR = p/(1-p) x (1-PPV)/PPV x (1-FNR), "
                f"so with different base rates p ({br}) equal PPV and FNR force different FPR unless prediction is perfect.",
                "Chouldechova 2017, Fair prediction with disparate impact, Big Data 5(2):153-163",
            ))
        notes.append(
            f"{f.feature}: base rates differ ({br}). For risk scores, calibration within groups and balance for the "
            "positive and negative classes cannot all hold unless prediction is perfect (Kleinberg, Mullainathan, "
            "Raghavan 2016, arXiv:1609.05807); a policy must choose which to enforce."
        )
    judged = [c.passed for c in checks if c.passed is not None]
    if not judged:
        notes.append("no criterion could be judged")
    passed = None if not judged else all(judged)
    return PolicyOutcome(passed, tuple(checks), tuple(conflicts), tuple(notes))

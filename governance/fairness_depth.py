"""Fairness beyond a binary classifier's rates: regression and multiclass metrics per group, calibration by
group, the impossibility view on the user's own data, and what a post-processing mitigation would change.

Pure: a polars frame in, aggregates out (no row of the input is returned). Per-group figures are computed
with fairlearn's ``MetricFrame`` (Weerts et al., "Fairlearn: Assessing and Improving Fairness of AI
Systems", JMLR 24(257), 2023) over scikit-learn's metrics, so they equal what a user of fairlearn gets.

- Regression: per group count, mean prediction, mean target, mean absolute error, root mean squared error
  and R^2; disparities are max - min over the groups large enough to judge.
- Multiclass: per group accuracy, macro-averaged recall and, per class, the selection rate P(y_hat = c).
- Calibration by group: observed positive rate against the mean score per score bin, for each group
  (``sklearn.calibration.calibration_curve`` with ``strategy="uniform"``, 10 bins by default), the expected
  calibration error sum_b (n_b / n) |observed_b - mean_score_b| (Naeini, Cooper, Hauskrecht 2015, AAAI) and
  the Brier score per group.
- The impossibility view: which of calibration within groups, equalized odds and demographic parity hold on
  this data (within tolerances), and the base rates P(y = 1) per group that force the trade-off. Kleinberg,
  Mullainathan, Raghavan 2016 ("Inherent Trade-Offs in the Fair Determination of Risk Scores",
  arXiv:1609.05807): calibration within groups and balance for the positive and negative classes cannot hold
  together unless base rates are equal or prediction is perfect. Chouldechova 2017 ("Fair prediction with
  disparate impact", Big Data 5(2):153-163): FPR = p/(1-p) (1-PPV)/PPV (1-FNR), so with different base rates
  p, equal PPV and FNR force different FPR. Demographic parity with equalized odds: selection rate = FPR +
  p (TPR - FPR), so equal error rates with different p give different selection rates unless TPR = FPR.
- Threshold-optimizer what-if: fairlearn's ``ThresholdOptimizer`` (Hardt, Price, Srebro 2016, "Equality of
  Opportunity in Supervised Learning", NeurIPS) fitted on the model's scores with group-specific
  (randomised) thresholds under a constraint; reported per group before and after (selection rate, TPR,
  FPR, error rate). Reported, never applied: the deployed model's decisions are not changed.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np
import polars as pl

from governance.fairness import FairnessInputError, _no_missing
from governance import fairness as FZ

CONSTRAINTS = ("demographic_parity", "equalized_odds", "true_positive_rate_parity", "false_positive_rate_parity")


def _col(frame: pl.DataFrame, name: str, *, numeric: bool = True) -> np.ndarray:
    if name not in frame.columns:
        raise FairnessInputError(f"missing column; the table has {', '.join(map(repr, frame.columns[:30]))}", column=name)
    s = frame.get_column(name)
    _no_missing(s, name)
    if numeric:
        if not s.dtype.is_numeric() and s.dtype != pl.Boolean:
            raise FairnessInputError(f"expected numbers, got {s.dtype}", column=name)
        x = s.cast(pl.Float64).to_numpy()
        if not np.isfinite(x).all():
            raise FairnessInputError("values must be finite", column=name)
        return x
    return s.cast(pl.String).to_numpy().astype(str)


def _groups(frame: pl.DataFrame, sensitive: str) -> np.ndarray:
    g = _col(frame, sensitive, numeric=False)
    if len(np.unique(g)) < 2:
        raise FairnessInputError("a single group: fairness compares groups, so at least two are needed", column=sensitive)
    return g


def _binary(x: np.ndarray, col: str) -> np.ndarray:
    if not np.isin(x, (0.0, 1.0)).all():
        raise FairnessInputError("expected 0/1 labels", column=col)
    return x.astype(np.int64)


def _mf(metrics: dict[str, Any], y_true: np.ndarray, y_pred: np.ndarray, groups: np.ndarray) -> dict[str, dict[str, float]]:
    from fairlearn.metrics import MetricFrame  # lazy: fairlearn/scikit-learn, only for fairness

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mf = MetricFrame(metrics=metrics, y_true=y_true, y_pred=y_pred, sensitive_features=groups)
    bg = mf.by_group
    return {str(g): {k: float(bg.loc[g, k]) for k in bg.columns} for g in bg.index}


def _spread(per: dict[str, dict[str, float]], keys: Sequence[str], judged: set[str]) -> dict[str, float | None]:
    out: dict[str, float | None] = {}
    for k in keys:
        vals = [v[k] for g, v in per.items() if g in judged and not np.isnan(v[k])]
        out[f"{k}_difference"] = float(max(vals) - min(vals)) if len(vals) >= 2 else None
    return out


# --- regression and multiclass ------------------------------------------------------------------


def regression_by_group(frame: pl.DataFrame, *, y_true: str = "y_true", y_pred: str = "y_pred", sensitive: str,
                        min_group_size: int = 30) -> dict[str, Any]:
    """Per-group error of a regression model (see the module docstring)."""
    from fairlearn.metrics import count  # lazy: fairlearn/scikit-learn, only for fairness
    from sklearn.metrics import mean_absolute_error, mean_squared_error, r2_score  # lazy: fairlearn/scikit-learn, only for fairness

    yt, yp, g = _col(frame, y_true), _col(frame, y_pred), _groups(frame, sensitive)

    def rmse(a: np.ndarray, b: np.ndarray) -> float:
        return float(np.sqrt(mean_squared_error(a, b)))

    def mean_pred(a: np.ndarray, b: np.ndarray) -> float:
        return float(np.mean(b))

    def mean_true(a: np.ndarray, b: np.ndarray) -> float:
        return float(np.mean(a))

    def r2(a: np.ndarray, b: np.ndarray) -> float:
        return float(r2_score(a, b)) if len(a) > 1 else float("nan")

    per = _mf({"count": count, "mean_prediction": mean_pred, "mean_target": mean_true, "mae": mean_absolute_error, "rmse": rmse, "r2": r2}, yt, yp, g)
    judged = {k for k, v in per.items() if v["count"] >= min_group_size}
    return {"kind": "regression", "feature": sensitive, "groups": per,
            "summary": _spread(per, ("mean_prediction", "mae", "rmse"), judged), "min_group_size": min_group_size}


def multiclass_by_group(frame: pl.DataFrame, *, y_true: str = "y_true", y_pred: str = "y_pred", sensitive: str,
                        min_group_size: int = 30) -> dict[str, Any]:
    """Per-group accuracy, macro recall and per-class selection rates of a multiclass classifier."""
    from fairlearn.metrics import count  # lazy: fairlearn/scikit-learn, only for fairness
    from sklearn.metrics import accuracy_score, recall_score  # lazy: fairlearn/scikit-learn, only for fairness

    yt = _col(frame, y_true, numeric=False)
    yp = _col(frame, y_pred, numeric=False)
    g = _groups(frame, sensitive)
    classes = sorted(set(yt) | set(yp))
    if len(classes) > 100:
        raise FairnessInputError(f"{len(classes)} classes: at most 100", column=y_true)

    def macro_recall(a: np.ndarray, b: np.ndarray) -> float:
        return float(recall_score(a, b, average="macro", labels=sorted(set(a)), zero_division=0))

    metrics: dict[str, Any] = {"count": count, "accuracy": accuracy_score, "macro_recall": macro_recall}
    for c in classes:
        metrics[f"selection_rate[{c}]"] = (lambda c: lambda a, b: float(np.mean(b == c)))(c)
    per = _mf(metrics, yt, yp, g)
    judged = {k for k, v in per.items() if v["count"] >= min_group_size}
    return {"kind": "multiclass", "feature": sensitive, "classes": classes, "groups": per,
            "summary": _spread(per, ["accuracy", "macro_recall"] + [f"selection_rate[{c}]" for c in classes], judged),
            "min_group_size": min_group_size}


# --- calibration and the impossibility view -----------------------------------------------------


def calibration_by_group(frame: pl.DataFrame, *, y_true: str = "y_true", y_score: str = "y_score", sensitive: str,
                         bins: int = 10) -> dict[str, Any]:
    """Per group: the reliability curve (``calibration_curve``, uniform bins over [0, 1]), the expected
    calibration error and the Brier score (fairlearn ``MetricFrame`` over ``brier_score_loss``)."""
    from sklearn.calibration import calibration_curve  # lazy: fairlearn/scikit-learn, only for fairness
    from sklearn.metrics import brier_score_loss  # lazy: fairlearn/scikit-learn, only for fairness

    yt = _binary(_col(frame, y_true), y_true)
    s = _col(frame, y_score)
    if ((s < 0) | (s > 1)).any():
        raise FairnessInputError("scores must be probabilities in [0, 1]", column=y_score)
    g = _groups(frame, sensitive)
    brier = _mf({"brier": brier_score_loss}, yt, s, g)
    edges = np.linspace(0, 1, bins + 1)
    out = {}
    for grp in sorted(set(g)):
        m = g == grp
        prob_true, prob_pred = calibration_curve(yt[m], s[m], n_bins=bins, strategy="uniform")
        # calibration_curve drops empty bins; the counts of the kept ones weight the ECE.
        idx = np.clip(np.searchsorted(edges[1:-1], s[m], side="right"), 0, bins - 1)
        n_b = np.bincount(idx, minlength=bins)
        n_b = n_b[n_b > 0]
        ece = float(np.sum(n_b / m.sum() * np.abs(prob_true - prob_pred)))
        out[grp] = {"count": int(m.sum()), "base_rate": float(yt[m].mean()), "mean_score": float(s[m].mean()),
                    "observed": prob_true.tolist(), "mean_predicted": prob_pred.tolist(), "bin_counts": n_b.tolist(),
                    "ece": ece, "brier": brier[grp]["brier"]}
    return {"feature": sensitive, "bins": bins, "strategy": "uniform", "groups": out}


def calibration_gap(frame: pl.DataFrame, *, y_true: str, y_score: str, sensitive: str, bins: int = 10,
                    groups: Sequence[str] | None = None, min_bin_count: int = 10) -> float | None:
    """Calibration within groups in the sense the impossibility results use (a score means the same risk in
    every group, "sufficiency": Barocas, Hardt, Narayanan, *Fairness and Machine Learning*, 2023, ch. 3):
    for each uniform score bin holding at least ``min_bin_count`` rows of two or more of ``groups``, the
    spread (max - min) of the groups' observed positive rates, averaged with the bin's row count as weight."""
    yt = _binary(_col(frame, y_true), y_true)
    s = _col(frame, y_score)
    g = _groups(frame, sensitive)
    keep = sorted(set(g)) if groups is None else list(groups)
    idx = np.clip(np.floor(s * bins).astype(np.int64), 0, bins - 1)
    total, weight = 0.0, 0
    for b in range(bins):
        rates, n_b = [], 0
        for grp in keep:
            m = (idx == b) & (g == grp)
            if m.sum() >= min_bin_count:
                rates.append(yt[m].mean())
                n_b += int(m.sum())
        if len(rates) >= 2:
            total += n_b * (max(rates) - min(rates))
            weight += n_b
    return float(total / weight) if weight else None


def impossibility(frame: pl.DataFrame, *, y_true: str = "y_true", y_pred: str = "y_pred", y_score: str | None = "y_score",
                  sensitive: str, min_group_size: int = 30, tolerance: float = 0.05, bins: int = 10) -> dict[str, Any]:
    """Which of calibration within groups, equalized odds and demographic parity hold here, within
    ``tolerance`` (largest between-group difference; for calibration the largest expected calibration error
    of a group, or, without scores, the PPV difference: predictive parity), and the base rates that force
    the trade-off (module docstring)."""

    res = FZ.evaluate(frame, y_true=y_true, y_pred=y_pred, sensitive=[sensitive], y_score=y_score, min_group_size=min_group_size, bootstrap=0)
    f = res.features[0]
    judged = [x for x in f.groups if x.judged]
    base = {x.group: x.rates["base_rate"] for x in judged}
    eo, dp = f.summary["equalized_odds_difference"], f.summary["demographic_parity_difference"]
    crit: dict[str, dict[str, Any]] = {
        "equalized_odds": {"value": eo, "measure": "equalized_odds_difference", "holds": None if eo is None else bool(eo <= tolerance)},
        "demographic_parity": {"value": dp, "measure": "demographic_parity_difference", "holds": None if dp is None else bool(dp <= tolerance)},
    }
    if y_score:
        cal = calibration_by_group(frame, y_true=y_true, y_score=y_score, sensitive=sensitive, bins=bins)
        gap = calibration_gap(frame, y_true=y_true, y_score=y_score, sensitive=sensitive, bins=bins, groups=list(base))
        eces = {k: v["ece"] for k, v in cal["groups"].items() if k in base}
        crit["calibration"] = {"value": gap, "measure": "between-group calibration gap: count-weighted mean over score bins of the "
                               "spread of observed positive rates (equal scores mean equal risk, whatever the group)",
                               "ece_per_group": eces, "holds": None if gap is None else bool(gap <= tolerance)}
    else:
        ppv = f.summary["ppv_difference"]
        crit["calibration"] = {"value": ppv, "measure": "ppv_difference (predictive parity; no scores given)",
                               "holds": None if ppv is None else bool(ppv <= tolerance)}
    spread = (max(base.values()) - min(base.values())) if len(base) >= 2 else None
    differ = spread is not None and spread > tolerance
    held = [k for k, v in crit.items() if v["holds"]]
    if differ:
        why = (f"Base rates differ by {spread:.3f} ({', '.join(f'{k} {v:.3f}' for k, v in sorted(base.items()))}). With unequal base rates "
               "a non-perfect predictor cannot be calibrated within groups and balanced for both classes (Kleinberg et al. 2016), "
               "equal PPV and FNR force different FPR (Chouldechova 2017), and equal TPR and FPR force different selection rates "
               f"unless TPR = FPR. Here {', '.join(held) if held else 'none'} of the three hold{'s' if len(held) == 1 else ''}: "
               "a policy has to choose which to enforce.")
    else:
        why = "Base rates are within the tolerance of each other, so the three criteria can hold together; any that fails is the model's, not arithmetic's."
    return {"feature": sensitive, "tolerance": tolerance, "base_rates": base, "base_rate_spread": spread, "base_rates_differ": differ,
            "criteria": crit, "all_hold": all(v["holds"] is True for v in crit.values()), "explanation": why,
            "references": ["Kleinberg, Mullainathan, Raghavan 2016, arXiv:1609.05807",
                           "Chouldechova 2017, Big Data 5(2):153-163"],
            "groups": {x.group: {"count": x.count, **{k: x.rates[k] for k in ("selection_rate", "tpr", "fpr", "ppv", "base_rate")}} for x in f.groups}}


# --- threshold optimizer what-if ----------------------------------------------------------------


@functools.cache
def _scores_estimator() -> type:
    """A prefit "estimator" class returning its single input column: lets ThresholdOptimizer threshold the
    deployed model's own scores without the model. Made on first use: scikit-learn takes about two seconds
    to import, which every API process and CLI verb that imports the monitoring service would otherwise pay."""
    from sklearn.base import BaseEstimator  # lazy: fairlearn/scikit-learn, only for fairness

    class _Scores(BaseEstimator):
        fitted_ = True  # nothing to fit: marks it fitted for check_is_fitted (prefit=True)

        def fit(self, X: Any, y: Any) -> _Scores:  # noqa: N803 - scikit-learn's names
            return self

        def predict(self, X: Any) -> np.ndarray:  # noqa: N803
            return np.asarray(X, dtype=float)[:, 0]

    return _Scores


def _rates(yt: np.ndarray, yp: np.ndarray, g: np.ndarray) -> dict[str, dict[str, float]]:
    from fairlearn.metrics import count, false_positive_rate, selection_rate, true_positive_rate  # lazy: fairlearn/scikit-learn, only for fairness

    def error_rate(a: np.ndarray, b: np.ndarray) -> float:
        return float(np.mean(a != b))

    return _mf({"count": count, "selection_rate": selection_rate, "tpr": true_positive_rate, "fpr": false_positive_rate,
                "error_rate": error_rate}, yt, yp, g)


def threshold_optimizer_whatif(frame: pl.DataFrame, *, y_true: str = "y_true", y_pred: str = "y_pred", y_score: str = "y_score",
                               sensitive: str, constraints: str = "equalized_odds", objective: str = "accuracy_score",
                               seed: int = 0, grid_size: int = 1000) -> dict[str, Any]:
    """Per group, the deployed decisions' rates and those ``ThresholdOptimizer(constraints=...)`` would give
    (its randomised prediction with ``random_state=seed``), with the thresholds it chose. Nothing is applied."""
    from fairlearn.postprocessing import ThresholdOptimizer  # lazy: fairlearn/scikit-learn, only for fairness

    if constraints not in CONSTRAINTS:
        raise FairnessInputError(f"constraints {constraints!r}: expected one of {', '.join(CONSTRAINTS)}")
    yt = _binary(_col(frame, y_true), y_true)
    yp = _binary(_col(frame, y_pred), y_pred)
    s = _col(frame, y_score)
    g = _groups(frame, sensitive)
    to = ThresholdOptimizer(estimator=_scores_estimator()(), constraints=constraints, objective=objective, prefit=True, predict_method="predict",
                            grid_size=grid_size)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        to.fit(s[:, None], yt, sensitive_features=g)
        after = np.asarray(to.predict(s[:, None], sensitive_features=g, random_state=seed)).astype(np.int64)
    before_r, after_r = _rates(yt, yp, g), _rates(yt, after, g)
    groups = {k: {"before": before_r[k], "after": after_r[k],
                  "change": {m: after_r[k][m] - before_r[k][m] for m in ("selection_rate", "tpr", "fpr", "error_rate")}} for k in before_r}
    return {"feature": sensitive, "constraints": constraints, "objective": objective, "seed": seed, "applied": False,
            "overall": {"error_rate_before": float(np.mean(yt != yp)), "error_rate_after": float(np.mean(yt != after)),
                        "selection_rate_before": float(np.mean(yp)), "selection_rate_after": float(np.mean(after))},
            "groups": groups,
            "note": "what-if only: fairlearn's ThresholdOptimizer (Hardt, Price, Srebro 2016) fitted on the stored scores; the deployed model is unchanged"}

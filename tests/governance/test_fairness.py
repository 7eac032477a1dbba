"""Fairness: ProPublica's COMPAS error rates reproduced, agreement with fairlearn's own disparity
functions, bootstrap, minimum group size, policies, impossibility notes, and bad input."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from governance import fairness as F
from governance import frames as GF
from governance.registry import ModelEntry


@pytest.fixture(scope="module")
def compas(compas_dir: Path) -> pl.DataFrame:
    df = pl.read_csv(compas_dir / "compas-7214-noPII.csv")
    # ProPublica: "high risk" = score_text Medium or High; truth = two_year_recid.
    return df.with_columns(high_risk=pl.col("score_text").is_in(["Medium", "High"]).cast(pl.Int8))


@pytest.fixture(scope="module")
def compas_result(compas: pl.DataFrame) -> F.FairnessResult:
    return F.evaluate(compas, y_true="two_year_recid", y_pred="high_risk", sensitive=["race"], bootstrap=300, seed=7)


def test_compas_reproduces_propublica_error_rates(compas: pl.DataFrame, compas_result: F.FairnessResult) -> None:
    assert compas.height == 7214 and compas_result.n == 7214
    race = compas_result.feature("race")
    black, white = race.group("African-American"), race.group("Caucasian")
    assert (black.count, white.count) == (3696, 2454)
    assert round(black.rates["fpr"] * 100, 2) == 44.85
    assert round(white.rates["fpr"] * 100, 2) == 23.45
    assert round(black.rates["fnr"] * 100, 2) == 27.99
    assert round(white.rates["fnr"] * 100, 2) == 47.72
    # confusion counts are consistent with the rates
    assert black.fp / (black.fp + black.tn) == pytest.approx(black.rates["fpr"])
    assert sum(g.count for g in race.groups) == 7214
    lo, hi = black.ci["fpr"]
    assert lo < black.rates["fpr"] < hi and hi - lo < 0.06


def test_compas_policy_fails_and_names_the_conflicts(compas_result: F.FairnessResult) -> None:
    out = F.judge(compas_result, F.FairnessPolicy(max_predictive_parity_difference=0.1))
    assert out.passed is False
    eo = next(c for c in out.checks if c.criterion == "max_equalized_odds_difference")
    assert eo.passed is False and eo.value > 0.3
    assert {c.criteria for c in out.conflicts} == {
        ("max_equalized_odds_difference", "min_selection_rate_ratio"),
        ("max_equalized_odds_difference", "max_predictive_parity_difference"),
    }
    assert any("Kleinberg" in n for n in out.notes)
    assert "African-American 51.4%" in out.conflicts[0].explanation


def _synthetic(n_per: int = 400, seed: int = 1, rates: dict[str, tuple[float, float]] | None = None) -> pl.DataFrame:
    """Groups with given (base rate, selection-rate skew); all groups large."""
    rng = np.random.default_rng(seed)
    rates = rates or {"a": (0.5, 0.0), "b": (0.3, -0.1), "c": (0.4, 0.1)}
    parts = []
    for g, (base, skew) in rates.items():
        y = rng.random(n_per) < base
        flip = rng.random(n_per) < 0.2
        pred = np.where(flip, ~y, y) | (rng.random(n_per) < max(skew, 0))
        pred &= ~(rng.random(n_per) < max(-skew, 0))
        parts.append(pl.DataFrame({"y_true": y.astype(int), "y_pred": pred.astype(int), "group": [g] * n_per,
                                   "sex": rng.choice(["f", "m"], n_per).tolist(), "score": rng.random(n_per)}))
    return pl.concat(parts)


def test_disparities_match_fairlearn_functions() -> None:
    from fairlearn import metrics as fm

    df = _synthetic()
    r = F.evaluate(df, sensitive=["group"], bootstrap=0, min_group_size=1)
    s = r.feature("group").summary
    yt, yp, sf = df["y_true"].to_numpy(), df["y_pred"].to_numpy(), df["group"].to_numpy()
    assert s["demographic_parity_difference"] == pytest.approx(fm.demographic_parity_difference(yt, yp, sensitive_features=sf))
    assert s["demographic_parity_ratio"] == pytest.approx(fm.demographic_parity_ratio(yt, yp, sensitive_features=sf))
    assert s["equalized_odds_difference"] == pytest.approx(fm.equalized_odds_difference(yt, yp, sensitive_features=sf))
    assert s["equalized_odds_ratio"] == pytest.approx(fm.equalized_odds_ratio(yt, yp, sensitive_features=sf))
    assert s["equal_opportunity_difference"] == pytest.approx(fm.equal_opportunity_difference(yt, yp, sensitive_features=sf))
    assert s["demographic_parity_difference"] > 0.05  # the data has a disparity to find


def test_intersections_and_auc() -> None:
    r = F.evaluate(_synthetic(), sensitive=["group", "sex"], y_score="score", bootstrap=0)
    assert [f.feature for f in r.features] == ["group", "sex", "group&sex"]
    inter = r.feature("group&sex")
    assert len(inter.groups) == 6 and inter.group("group=a|sex=f").count + inter.group("group=a|sex=m").count == 400
    assert all(g.auc is not None and 0.3 < g.auc < 0.7 for g in inter.groups)  # random scores


def test_bootstrap_is_seeded() -> None:
    df = _synthetic()
    a = F.evaluate(df, sensitive=["group"], bootstrap=200, seed=3).feature("group")
    b = F.evaluate(df, sensitive=["group"], bootstrap=200, seed=3).feature("group")
    c = F.evaluate(df, sensitive=["group"], bootstrap=200, seed=4).feature("group")
    assert a.summary_ci == b.summary_ci and a.summary_ci != c.summary_ci
    lo, hi = a.summary_ci["demographic_parity_difference"]
    assert lo < a.summary["demographic_parity_difference"] < hi


def test_small_groups_are_reported_not_judged() -> None:
    big = _synthetic(rates={"a": (0.5, 0.0), "b": (0.5, 0.0)})
    tiny = pl.DataFrame({"y_true": [1, 1, 1], "y_pred": [0, 0, 0], "group": ["z"] * 3, "sex": ["f"] * 3, "score": [0.1] * 3})
    with_tiny = F.evaluate(pl.concat([big, tiny]), sensitive=["group"], bootstrap=0, min_group_size=30).feature("group")
    without = F.evaluate(big, sensitive=["group"], bootstrap=0, min_group_size=30).feature("group")
    z = with_tiny.group("z")
    assert z.count == 3 and z.judged is False and z.rates["tpr"] == 0.0
    assert with_tiny.summary == without.summary  # z's TPR of 0 would otherwise dominate
    assert "not judged" in with_tiny.notes[0]
    only_tiny = F.evaluate(pl.concat([big.head(20), tiny]), sensitive=["group"], bootstrap=0, min_group_size=30)
    out = F.judge(only_tiny, F.FairnessPolicy())
    assert out.passed is None and all(c.passed is None for c in out.checks)


def test_undefined_rates_are_none_not_zero() -> None:
    df = pl.DataFrame({"y_true": [0, 0, 0, 1, 0, 1], "y_pred": [0, 1, 0, 1, 1, 0], "g": ["a", "a", "a", "b", "b", "b"]})
    a = F.evaluate(df, sensitive=["g"], bootstrap=0, min_group_size=1).feature("g").group("a")
    assert a.rates["tpr"] is None and a.rates["fnr"] is None and a.rates["fpr"] == pytest.approx(1 / 3)


def test_policy_passes_and_fails_on_thresholds() -> None:
    fair = _synthetic(rates={"a": (0.4, 0.0), "b": (0.4, 0.0)}, n_per=2000)
    out = F.judge(F.evaluate(fair, sensitive=["group"], bootstrap=100), F.FairnessPolicy())
    assert out.passed is True and out.conflicts == ()
    assert [c.criterion for c in out.checks] == ["min_selection_rate_ratio", "max_equalized_odds_difference"]
    strict = F.judge(F.evaluate(fair, sensitive=["group"], bootstrap=0), F.FairnessPolicy(max_demographic_parity_difference=0.0))
    assert strict.passed is False
    skewed = _synthetic(rates={"a": (0.4, 0.3), "b": (0.4, -0.3)})
    out = F.judge(F.evaluate(skewed, sensitive=["group"], bootstrap=0), F.FairnessPolicy())
    four_fifths = out.checks[0]
    assert four_fifths.passed is False and four_fifths.value < 0.8 and out.passed is False


def test_bad_input_gets_clear_errors() -> None:
    df = _synthetic(n_per=50)
    cases = [
        (dict(frame=df.drop("y_pred"), sensitive=["group"]), "y_pred", "missing column"),
        (dict(frame=df, sensitive=["race"]), "race", "missing column"),
        (dict(frame=df.with_columns(y_true=pl.col("y_true") * 2), sensitive=["group"]), "y_true", "non-binary"),
        (dict(frame=df.with_columns(group=pl.lit("a")), sensitive=["group"]), "group", "single group"),
        (dict(frame=df.with_columns(y_true=pl.when(pl.int_range(pl.len()) == 5).then(None).otherwise(pl.col("y_true"))), sensitive=["group"]), "y_true", "missing or NaN"),
        (dict(frame=df.with_columns(score=pl.when(pl.int_range(pl.len()) == 2).then(float("nan")).otherwise(pl.col("score"))), sensitive=["group"], y_score="score"), "score", "missing or NaN"),
        (dict(frame=df.with_columns(group=pl.when(pl.int_range(pl.len()) == 0).then(None).otherwise(pl.col("group"))), sensitive=["group"]), "group", "missing or NaN"),
        (dict(frame=df.with_columns(y_true=pl.col("y_true").cast(pl.String)), sensitive=["group"]), "y_true", "need positive_label"),
        (dict(frame=df.with_columns(score=pl.col("group")), sensitive=["group"], y_score="score"), "score", "numeric"),
        (dict(frame=df.head(0), sensitive=["group"]), None, "no rows"),
    ]
    for kwargs, column, text in cases:
        with pytest.raises(F.FairnessInputError) as err:
            F.evaluate(**kwargs, bootstrap=0)
        assert err.value.column == column and text in str(err.value), (column, text, str(err.value))


def test_string_labels_with_positive_label() -> None:
    df = pl.DataFrame({"y_true": ["yes", "no", "yes", "no"], "y_pred": ["yes", "yes", "no", "no"], "g": ["a", "a", "b", "b"]})
    r = F.evaluate(df, sensitive=["g"], positive_label="yes", bootstrap=0, min_group_size=1)
    assert r.feature("g").group("a").tp == 1 and r.feature("g").group("a").fp == 1
    with pytest.raises(F.FairnessInputError, match="not among"):
        F.evaluate(df, sensitive=["g"], positive_label="Yes", bootstrap=0)


def test_uploads_in_csv_and_parquet() -> None:
    df = _synthetic(n_per=60)
    buf = io.BytesIO()
    df.write_parquet(buf)
    assert F.read_predictions(buf.getvalue()).equals(df)
    assert F.read_predictions(df.write_csv().encode()).shape == df.shape
    for bad in (b"", b"PAR1 not really parquet"):
        with pytest.raises(F.FairnessInputError):
            F.read_predictions(bad)


def test_stored_result_holds_aggregates_only(compas: pl.DataFrame, compas_result: F.FairnessResult) -> None:
    policy = F.FairnessPolicy()
    out = GF.fairness_frames(ModelEntry("compas", "2013"), compas_result, policy, F.judge(compas_result, policy))
    groups = out["fairness_group"]
    assert groups.height == 6 and set(groups["group_value"]) == set(compas["race"].unique())
    ev = out["fairness_evaluation"]
    assert ev["passed"].to_list() == [False] and ev["n_rows"].to_list() == [7214]
    # Nothing row-level: the stored JSON is the same size whatever the number of rows evaluated.
    kw = dict(y_true="two_year_recid", y_pred="high_risk", sensitive=["race"], bootstrap=0, min_group_size=1)
    doubled = F.evaluate(pl.concat([compas, compas]), **kw)
    once = F.evaluate(compas, **kw)
    assert doubled.feature("race").group("Caucasian").rates == once.feature("race").group("Caucasian").rates
    assert abs(len(json.dumps(doubled.to_dict())) - len(json.dumps(once.to_dict()))) < 50


def test_multinomial_bootstrap_matches_row_resampling_within_monte_carlo_error():
    """The intervals drawn as one multinomial over the (group x cell) confusion table equal, within
    Monte-Carlo error, those of resampling the rows themselves (the textbook bootstrap, Efron & Tibshirani
    1993 ch. 13): a resample of n rows is a multinomial draw of the n rows' cells, so the two are the same
    distribution; seeded, the vectorised one is deterministic."""

    data = np.random.default_rng(7)
    n = 900
    group = data.choice(3, size=n, p=[0.5, 0.3, 0.2])
    y_true = (data.random(n) < np.array([0.3, 0.5, 0.6])[group]).astype(np.int64)
    y_pred = np.where(data.random(n) < 0.75, y_true, 1 - y_true)
    cell = group * 4 + y_true * 2 + y_pred
    counts = np.bincount(cell, minlength=12).reshape(3, 4)
    judged = counts.sum(axis=1) >= 30
    b = 4000
    gci, sci = F.confusion_intervals(counts, judged, b, np.random.default_rng(0), 0.95)
    again = F.confusion_intervals(counts, judged, b, np.random.default_rng(0), 0.95)
    assert sci == again[1] and all(np.array_equal(gci[k], again[0][k]) for k in gci)
    # the old way: resample row indices, recount each replicate
    rows = np.random.default_rng(1).integers(0, n, size=(b, n))
    rc = np.stack([np.bincount(cell[r], minlength=12) for r in rows]).reshape(b, 3, 4).astype(float)
    rb = F._rates(rc[..., 3], rc[..., 1], rc[..., 0], rc[..., 2])
    sb = F._summary({k: np.where(judged[None], v, np.nan) for k, v in rb.items()})
    for k in ("selection_rate", "tpr", "fpr", "accuracy"):
        want = np.nanquantile(rb[k], [0.025, 0.975], axis=0)
        # Monte-Carlo error of a 2.5 % quantile from 4,000 replicates: well under 0.02 for these rates
        assert np.abs(gci[k] - want).max() < 0.02, k
    for k in ("equalized_odds_difference", "demographic_parity_difference"):
        lo, hi = np.nanquantile(sb[k], [0.025, 0.975])
        assert abs(sci[k][0] - lo) < 0.02 and abs(sci[k][1] - hi) < 0.02, k

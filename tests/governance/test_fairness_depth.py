"""Fairness in depth on the real COMPAS rows: calibration by group and threshold-optimizer figures equal
fairlearn's and scikit-learn's own, the impossibility view, regression and multiclass metrics per group."""

from pathlib import Path

import polars as pl
import pytest
from fairlearn.metrics import MetricFrame, false_positive_rate, selection_rate, true_positive_rate
from fairlearn.postprocessing import ThresholdOptimizer
from sklearn.calibration import calibration_curve
from sklearn.metrics import brier_score_loss, mean_absolute_error

from governance import fairness_depth as FD
from governance.fairness import FairnessInputError

TWO = ["African-American", "Caucasian"]


@pytest.fixture(scope="module")
def compas(compas_dir: Path) -> pl.DataFrame:
    df = pl.read_csv(compas_dir / "compas-7214-noPII.csv")
    return df.filter(pl.col("race").is_in(TWO)).select(
        pl.col("two_year_recid").alias("y_true"), (pl.col("decile_score") >= 5).cast(pl.Int64).alias("y_pred"),
        ((pl.col("decile_score") - 0.5) / 10).alias("y_score"), "race", "sex", "priors_count", "decile_score", "score_text")


def test_calibration_by_group_equals_scikit_learn_and_fairlearn(compas):
    cal = FD.calibration_by_group(compas, sensitive="race")
    for race in TWO:
        sub = compas.filter(pl.col("race") == race)
        t, p = calibration_curve(sub["y_true"].to_numpy(), sub["y_score"].to_numpy(), n_bins=10, strategy="uniform")
        got = cal["groups"][race]
        assert got["observed"] == pytest.approx(t.tolist(), abs=1e-15) and got["mean_predicted"] == pytest.approx(p.tolist(), abs=1e-15)
        assert got["brier"] == pytest.approx(brier_score_loss(sub["y_true"].to_numpy(), sub["y_score"].to_numpy()), abs=1e-15)
        assert sum(got["bin_counts"]) == sub.height
    # Deciles are ranks, not probabilities, so their ECE is not small; but a decile means about the same
    # risk in both groups (Flores, Bechtel, Lowenkamp 2016, Federal Probation 80(2)): the gap is small.
    assert all(g["ece"] > 0.05 for g in cal["groups"].values())
    assert FD.calibration_gap(compas, y_true="y_true", y_score="y_score", sensitive="race") < 0.05


def test_threshold_optimizer_figures_equal_fairlearns_own(compas):
    w = FD.threshold_optimizer_whatif(compas, sensitive="race", constraints="equalized_odds", seed=3)
    s = compas["y_score"].to_numpy()
    to = ThresholdOptimizer(estimator=FD._scores_estimator()(), constraints="equalized_odds", prefit=True, predict_method="predict")
    to.fit(s[:, None], compas["y_true"].to_numpy(), sensitive_features=compas["race"].to_numpy())
    after = to.predict(s[:, None], sensitive_features=compas["race"].to_numpy(), random_state=3)
    mf = MetricFrame(metrics={"sr": selection_rate, "tpr": true_positive_rate, "fpr": false_positive_rate},
                     y_true=compas["y_true"].to_numpy(), y_pred=after, sensitive_features=compas["race"].to_numpy())
    for race in TWO:
        a = w["groups"][race]["after"]
        assert (a["selection_rate"], a["tpr"], a["fpr"]) == pytest.approx(tuple(mf.by_group.loc[race, ["sr", "tpr", "fpr"]]), abs=1e-15)
    before = {r: w["groups"][r]["before"] for r in TWO}
    # ProPublica's finding: African-American defendants' FPR far above Caucasians' ...
    assert before["African-American"]["fpr"] - before["Caucasian"]["fpr"] > 0.19
    after_gap = abs(w["groups"][TWO[0]]["after"]["fpr"] - w["groups"][TWO[1]]["after"]["fpr"])
    assert after_gap < 0.05  # ... which equalized-odds thresholds would close, at a reported cost
    assert w["applied"] is False and w["overall"]["error_rate_after"] >= w["overall"]["error_rate_before"] - 0.01


def test_the_impossibility_view_on_compas(compas):
    v = FD.impossibility(compas, sensitive="race")
    assert v["base_rates_differ"] and v["base_rates"]["African-American"] - v["base_rates"]["Caucasian"] > 0.1
    assert v["criteria"]["calibration"]["holds"] is True
    assert v["criteria"]["equalized_odds"]["holds"] is False and v["criteria"]["demographic_parity"]["holds"] is False
    assert "Kleinberg" in v["explanation"] and "calibration" in v["explanation"]
    no_scores = FD.impossibility(compas, sensitive="race", y_score=None)
    assert "ppv_difference" in no_scores["criteria"]["calibration"]["measure"]


def test_regression_and_multiclass_by_group(compas):
    reg = FD.regression_by_group(compas.with_columns(pl.col("priors_count").cast(pl.Float64).alias("y_true"),
                                                     (pl.col("decile_score") * 0.8).alias("y_pred")), sensitive="race")
    sub = compas.filter(pl.col("race") == "Caucasian")
    assert reg["groups"]["Caucasian"]["mae"] == pytest.approx(mean_absolute_error(sub["priors_count"], sub["decile_score"] * 0.8))
    assert reg["summary"]["mae_difference"] > 0
    mc = FD.multiclass_by_group(compas.with_columns(pl.col("score_text").alias("y_pred"),
                                                    pl.when(pl.col("y_true") == 1).then(pl.lit("High")).otherwise(pl.lit("Low")).alias("y_true")),
                                sensitive="race")
    assert set(mc["classes"]) == {"High", "Low", "Medium"}
    aa = compas.filter(pl.col("race") == "African-American")
    assert mc["groups"]["African-American"]["selection_rate[High]"] == pytest.approx(float((aa["score_text"] == "High").mean()))


@pytest.mark.parametrize(("frame", "kw", "match"), [
    (pl.DataFrame({"y_true": [0, 1], "y_score": [0.2, 1.4], "race": ["a", "b"]}), {}, r"\[0, 1\]"),
    (pl.DataFrame({"y_true": [0, 2], "y_score": [0.2, 0.4], "race": ["a", "b"]}), {}, "0/1"),
    (pl.DataFrame({"y_true": [0, 1], "y_score": [0.2, None], "race": ["a", "b"]}), {}, "missing"),
    (pl.DataFrame({"y_true": [0, 1], "y_score": [0.2, 0.3], "race": ["a", "a"]}), {}, "single group"),
    (pl.DataFrame({"y_true": [0, 1], "y_score": ["x", "y"], "race": ["a", "b"]}), {}, "expected numbers"),
    (pl.DataFrame({"y_true": [0, 1], "race": ["a", "b"]}), {}, "missing column"),
])
def test_bad_input_is_named(frame, kw, match):
    with pytest.raises(FairnessInputError, match=match):
        FD.calibration_by_group(frame, sensitive="race", **kw)


def test_unknown_constraint_is_refused(compas):
    with pytest.raises(FairnessInputError, match="constraints"):
        FD.threshold_optimizer_whatif(compas, sensitive="race", constraints="everything")

"""Post-market monitoring statistics on the real COMPAS rows (which carry no dates, so windows are subsets):
KS equal to scipy's, PSI equal to a hand computation, no drift between two random halves, drift on a
single age band, and fairness per group with intervals."""

import json
import math
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from scipy.stats import ks_2samp

from governance import drift as D
from governance import monitoring as M
from ingest.model_monitoring import parse, predictions_jsonl

FEATS = ["age", "priors_count", "juv_fel_count", "juv_misd_count", "juv_other_count"]


@pytest.fixture(scope="module")
def compas(compas_dir: Path) -> pl.DataFrame:
    return pl.read_csv(compas_dir / "compas-7214-noPII.csv")


def _data(d: pl.DataFrame) -> M.WindowData:
    # ProPublica's definitions (SOURCES.md): "high risk" = decile_score >= 5, truth = two_year_recid.
    return M.WindowData((d["decile_score"] >= 5).cast(pl.Float64).to_numpy(), d["two_year_recid"].cast(pl.Float64).to_numpy(),
                        (d["decile_score"] / 10).to_numpy(), {f: d[f].cast(pl.Float64).to_numpy() for f in FEATS},
                        {"race": d["race"].to_numpy().astype(str), "sex": d["sex"].to_numpy().astype(str)})


@pytest.fixture(scope="module")
def halves(compas: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    perm = np.random.default_rng(0).permutation(compas.height)
    return compas[perm[: compas.height // 2]], compas[perm[compas.height // 2 :]]


def _hand_psi(ref: list[float], cur: list[float], bins: int = 10, eps: float = 1e-4) -> float:
    """PSI the long way: deciles by linear interpolation between order statistics (numpy's default,
    Hyndman & Fan type 7), duplicates dropped, bins closed on the left, empty shares replaced by eps."""
    s = sorted(ref)
    edges: list[float] = []
    for k in range(1, bins):
        h = (len(s) - 1) * k / bins
        lo = math.floor(h)
        q = s[lo] + (h - lo) * (s[min(lo + 1, len(s) - 1)] - s[lo])
        if q not in edges:
            edges.append(q)

    def shares(xs: list[float]) -> list[float]:
        c = [0] * (len(edges) + 1)
        for x in xs:
            c[sum(1 for e in edges if e <= x)] += 1
        return [v / len(xs) for v in c]

    total = 0.0
    for e, a in zip(shares(ref), shares(cur)):
        e, a = e or eps, a or eps
        total += (a - e) * math.log(a / e)
    return total


@pytest.mark.parametrize("feature", ["age", "priors_count", "juv_other_count"])
def test_ks_equals_scipy_and_psi_equals_the_hand_computation(halves, compas, feature):
    ref, other = halves
    band = other.filter(pl.col("age_cat") == "Less than 25")
    r = ref[feature].cast(pl.Float64).to_numpy()
    for cur_df in (other, band):
        c = cur_df[feature].cast(pl.Float64).to_numpy()
        want = ks_2samp(r, c)
        assert D.ks_test(r, c) == (pytest.approx(want.statistic, abs=1e-15), pytest.approx(want.pvalue, rel=1e-12, abs=1e-300))
        asym = ks_2samp(r, c, method="asymp")
        d, p = D.ks_test(r, c, method="asymp")
        assert d == pytest.approx(asym.statistic, abs=1e-15) and p == pytest.approx(asym.pvalue, rel=1e-12, abs=1e-300)
        assert D.psi(r, c) == pytest.approx(_hand_psi(r.tolist(), c.tolist()), rel=1e-12, abs=1e-15)


def test_psi_of_age_on_a_single_band_is_significant_and_on_the_other_half_stable(halves):
    ref, other = halves
    r = ref["age"].to_numpy()
    assert D.psi(r, other["age"].to_numpy()) < 0.01
    young = other.filter(pl.col("age_cat") == "Less than 25")["age"].to_numpy()
    assert D.psi(r, young) > 5  # every young person sits in the reference's bottom one or two deciles
    assert D.psi_level(D.psi(r, young)) == "significant"


def test_the_other_half_has_no_drift_and_a_single_age_band_has(halves):
    ref_df, other = halves
    ref = M.reference(_data(ref_df))
    same = M.evaluate_window(ref, _data(other), subject="model:compas@1")
    assert [f["kind"] for f in same.findings if f["kind"] != "model_fairness"] == []
    assert all(not d.drifted and d.level == "stable" for d in same.drift)
    assert same.prediction_psi < 0.01
    for d in same.drift:  # the vectorised statistic of the windows' path is scipy's too, ties included
        want = ks_2samp(ref_df[d.feature].cast(pl.Float64).to_numpy(), other[d.feature].cast(pl.Float64).to_numpy())
        assert d.ks == pytest.approx(want.statistic, abs=1e-15)
        assert d.psi == pytest.approx(D.psi(ref_df[d.feature].cast(pl.Float64).to_numpy(), other[d.feature].cast(pl.Float64).to_numpy()), abs=1e-15)
    # The no-drift window still has the unfairness ProPublica reported: FPR differs by race.
    fair = next(a for a in same.fairness if a.attribute == "race")
    aa, cc = (next(g for g in fair.groups if g.group == n) for n in ("African-American", "Caucasian"))
    assert aa.rates["fpr"] - cc.rates["fpr"] > 0.15
    lo, hi = aa.ci["fpr"]
    assert lo < aa.rates["fpr"] < hi and hi - lo < 0.1
    young = M.evaluate_window(ref, _data(other.filter(pl.col("age_cat") == "Less than 25")), subject="model:compas@1")
    kinds = {f["kind"] for f in young.findings}
    assert {"model_drift", "model_prediction_drift"} <= kinds
    drift = next(f for f in young.findings if f["kind"] == "model_drift")
    assert drift["severity"] == "critical" and {d["feature"] for d in drift["evidence"]["features"]} == {"age", "priors_count"}
    assert "drift" in young.status.split(",")


def test_windows_from_the_ingest_format_with_late_outcomes(halves):
    ref_df, other = halves
    rows = other.head(400).with_columns(pl.col("id").alias("pid"), (pl.lit(1785751200) + pl.int_range(400) * 9).alias("ts"),
                                        (pl.col("decile_score") / 10).alias("score"))
    body = predictions_jsonl(rows, model="compas", version="1", prediction_id="pid", ts="ts", features=FEATS, groups=["race", "sex"], score="score")
    outcomes = "".join(json.dumps({"type": "outcome", "model": "compas", "version": "1", "prediction_id": str(r["id"]), "ts": 1790000000,
                                   "outcome": r["two_year_recid"]}) + "\n" for r in rows.head(300).iter_rows(named=True))
    frames = parse(body + outcomes.encode())
    joined = frames["model_prediction"].join(frames["model_outcome"].select("prediction_id", "outcome"), on="prediction_id", how="left")
    wins = M.split_windows(joined, [joined["ts"].min()], 3600)
    assert wins[0][2].height == 400
    d = M.window_data(wins[0][2], features=FEATS, groups=["race", "sex"])
    assert d.n == 400 and int((~np.isnan(d.y_true)).sum()) == 300
    res = M.evaluate_window(M.reference(_data(ref_df)), d)
    assert res.metrics["n_outcomes"] == 300
    # decile >= 5 is exactly score >= 0.5, so the accuracy equals the one computed from the CSV directly.
    sub = rows.head(300)
    want = float(((sub["decile_score"] >= 5).cast(pl.Int8) == sub["two_year_recid"]).mean())
    assert res.metrics["accuracy"] == pytest.approx(want)
    row = res.row("compas", "1")
    assert row["n_predictions"] == 400 and row["feature_psi_max"] == max(x.psi for x in res.drift)


def test_small_windows_are_not_judged(halves):
    ref_df, other = halves
    res = M.evaluate_window(M.reference(_data(ref_df)), _data(other.head(10)))
    assert res.findings == () and "not judged" in res.notes[0]


def test_small_windows_of_the_same_people_do_not_page_but_a_small_shifted_one_does(halves):
    """An hour of 30 or 100 predictions drawn from the reference's own population: PSI on 10 bins is mostly
    sampling noise there (an empty bin alone is 0.69), and it reaches 0.25 in many such windows, which a
    fixed threshold would call significant drift. Those windows must raise no drift finding; 100 of the
    youngest defendants still must."""
    ref_df, other = halves
    ref = M.reference(_data(ref_df))
    rng = np.random.default_rng(7)
    for size in (30, 100):
        wins = [(None, None, _data(other[rng.choice(other.height, size, replace=False)])) for _ in range(150)]
        got = M.evaluate_windows(ref, wins, subject="model:compas@1")
        over = sum(any((d.psi or 0) >= D.PSI_SIGNIFICANT for d in r.drift) or (r.prediction_psi or 0) >= D.PSI_SIGNIFICANT for r in got)
        # the case is exercised: a fixed 0.25 would page on most 30-row windows (133 of 150) and on a few of 100
        assert over >= (100 if size == 30 else 1), over
        paged = [f["summary"] for r in got for f in r.findings if f["kind"] in ("model_drift", "model_prediction_drift")]
        assert len(paged) <= 1, paged  # at most a chance one (each test is at 0.001)
        p = [d.psi_pvalue for r in got for d in r.drift if d.psi is not None and d.psi >= D.PSI_SIGNIFICANT]
        assert len(p) >= over - sum((r.prediction_psi or 0) >= D.PSI_SIGNIFICANT for r in got)
        assert sum(x < 1e-3 / len(FEATS) for x in p) <= 1, sorted(p)[:3]
    young = other.filter(pl.col("age_cat") == "Less than 25")
    res = M.evaluate_window(ref, _data(young[rng.choice(young.height, 100, replace=False)]), subject="model:compas@1")
    drift = next(f for f in res.findings if f["kind"] == "model_drift")
    age = next(d for d in drift["evidence"]["features"] if d["feature"] == "age")
    assert age["psi"] > 5 and age["psi_pvalue"] < 1e-20 and age["ks_pvalue"] < 1e-10

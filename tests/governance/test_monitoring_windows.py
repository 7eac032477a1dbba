"""``governance.monitoring.evaluate_windows`` computes every statistic for all windows at once; here each
window is computed again the straightforward way, one window and one group at a time (scipy's KS, the
module's per-window PSI, confusion counts by hand, the same seeded multinomial bootstrap read out with
``np.nanquantile``), on seeded windows chosen to be awkward: ties within windows and with the reference,
missing and all-NaN features, a missing group attribute, blank and single group labels, multiclass
outcomes, windows without outcomes, scores or rows, windows under the judging size and one window far
larger than the rest. And the service's windows, their rows' JSON decoded once, equal the windows decoded
one by one."""

import json
import warnings
from datetime import UTC, datetime, timedelta

import numpy as np
import polars as pl
import pytest
from scipy.special import kolmogorov
from scipy.stats import chi2_contingency, ks_2samp

from governance import fairness as FZ
from governance import drift as D
from governance import monitoring as M


def _window(rng: np.random.Generator, n: int, *, shift: float = 0.0, ties: bool = False, multiclass: bool = False,
            no_outcome: bool = False, nan_feature: bool = False, drop_feature: bool = False, drop_attribute: bool = False,
            one_group: bool = False, no_score: bool = False, blank: bool = False) -> M.WindowData:
    x = rng.normal(size=(4, n))
    x[0] += shift
    if ties:
        x[1] = np.round(x[1] * 2)
    x[3] = rng.poisson(3, size=n)  # a count: ties within the window and with the reference
    score = 1 / (1 + np.exp(-(x[0] * 0.8 + x[2] * 0.5)))
    y_true = (rng.random(n) < score).astype(float)
    y_true[rng.random(n) > 0.7] = np.nan
    y_pred = (score >= 0.5).astype(float)
    if multiclass:
        y_true, y_pred = rng.integers(0, 3, n).astype(float), rng.integers(0, 3, n).astype(float)
    if no_outcome:
        y_true[:] = np.nan
    if no_score:
        score = np.full(n, np.nan)
    region = rng.choice(np.array(["a", "b", "c"]), size=n, p=[0.5, 0.3, 0.2])
    if one_group:
        region[:] = "a"
    if blank:
        region[: n // 3] = ""
    features = {f"f{i}": x[i].copy() for i in range(4)}
    if nan_feature:
        features["f2"][:] = np.nan
    elif n:
        features["f2"][rng.random(n) < 0.1] = np.nan
    if drop_feature:
        del features["f1"]
    groups = {"region": region, "sex": rng.choice(np.array(["f", "m"]), size=n)}
    if drop_attribute:
        del groups["sex"]
    return M.WindowData(y_pred, y_true, score, features, groups)


@pytest.fixture(scope="module")
def windows() -> tuple[M.WindowData, list[tuple[datetime, datetime, M.WindowData]]]:
    rng = np.random.default_rng(7)
    ref = _window(rng, 1500)
    ref.features["f1"][:200] = np.round(ref.features["f1"][:200], 1)  # reference values the windows tie
    odd = [dict(shift=1.0)] * 4 + [dict(ties=True)] * 3 + [dict(multiclass=True), dict(no_outcome=True), dict(nan_feature=True),
           dict(drop_feature=True), dict(drop_attribute=True), dict(one_group=True), dict(no_score=True), dict(blank=True),
           dict(shift=0.5, ties=True)]
    specs: list[dict[str, object]] = [{}] * 20 + odd
    sizes = [200, 150, 20, 0, 35, 4000, 1, 60]  # 4,000: one window far larger than the rest
    t0 = datetime(2026, 11, 23, tzinfo=UTC)
    out = []
    for h, spec in enumerate(specs):
        n = sizes[(h // 4) % len(sizes)] if h % 4 == 0 else 200
        if spec.get("ties") and n:
            n = 200
        d = _window(rng, n, **spec)  # type: ignore[arg-type]
        if spec.get("ties"):
            d.features["f1"][:20] = ref.features["f1"][:20]  # equal to reference values
        out.append((t0 + timedelta(hours=h), t0 + timedelta(hours=h + 1), d))
    return ref, out


def _rates(tp: np.ndarray, fp: np.ndarray, tn: np.ndarray, fn: np.ndarray) -> dict[str, np.ndarray]:
    with np.errstate(divide="ignore", invalid="ignore"):
        n, pos, neg = tp + fp + tn + fn, tp + fn, fp + tn
        return {"selection_rate": np.where(n > 0, (tp + fp) / n, np.nan), "tpr": np.where(pos > 0, tp / pos, np.nan),
                "fpr": np.where(neg > 0, fp / neg, np.nan), "fnr": np.where(pos > 0, fn / pos, np.nan),
                "accuracy": np.where(n > 0, (tp + tn) / n, np.nan), "ppv": np.where(tp + fp > 0, tp / (tp + fp), np.nan),
                "base_rate": np.where(n > 0, pos / n, np.nan)}


def _spread(cols: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Between-group difference and ratio per replicate, over the groups where the rate is defined."""
    m = np.stack(cols)  # (groups, replicates)
    ok = (~np.isnan(m)).sum(axis=0) >= 2
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN columns: no two groups to compare
        hi, lo = np.nanmax(m, axis=0), np.nanmin(m, axis=0)
    diff = np.where(ok, hi - lo, np.nan)
    with np.errstate(all="ignore"):
        ratio = np.where(ok & (hi > 0), lo / np.where(hi > 0, hi, 1), np.where(ok, 1.0, np.nan))
    return diff, ratio


def _summary(rates: dict[str, list[np.ndarray]]) -> dict[str, np.ndarray]:
    dp = _spread(rates["selection_rate"])
    tpr, fpr = _spread(rates["tpr"]), _spread(rates["fpr"])
    return {"demographic_parity_difference": dp[0], "demographic_parity_ratio": dp[1],
            "equalized_odds_difference": np.fmax(tpr[0], fpr[0]), "equalized_odds_ratio": np.fmin(tpr[1], fpr[1]),
            "equal_opportunity_difference": tpr[0], "fpr_difference": fpr[0], "fnr_difference": _spread(rates["fnr"])[0],
            "ppv_difference": _spread(rates["ppv"])[0], "accuracy_difference": _spread(rates["accuracy"])[0],
            "base_rate_difference": _spread(rates["base_rate"])[0]}


def _interval(replicates: np.ndarray, cfg: M.MonitoringConfig) -> tuple[float, float] | None:
    if np.isnan(replicates).all():
        return None
    a = (1 - cfg.confidence) / 2
    lo, hi = np.nanquantile(replicates, [a, 1 - a])
    return float(lo), float(hi)


def _fairness_by_window(datas: list[M.WindowData], cfg: M.MonitoringConfig) -> list[dict[str, dict]]:
    """Per window and attribute: groups (count, judged, rates, intervals), disparities and their intervals,
    one window and one group at a time; the bootstrap draws the same multinomial, attribute by attribute."""
    rng = np.random.default_rng(cfg.seed)
    rows = []
    for d in datas:
        k = ~np.isnan(d.y_true) & ~np.isnan(d.y_pred)
        yt, yp = d.y_true[k], d.y_pred[k]
        if not (np.isin(yt, [0.0, 1.0]).all() and np.isin(yp, [0.0, 1.0]).all()):
            k[:] = False
        rows.append(k)
    out: list[dict[str, dict]] = [{} for _ in datas]
    for attr in sorted({a for d in datas for a in d.groups}):
        labels = [d.groups[attr][k].tolist() if attr in d.groups else [] for d, k in zip(datas, rows)]
        names = sorted({x for lab in labels for x in lab})
        if len(names) < 2:
            continue
        g = len(names)
        counts = np.zeros((len(datas), g, 4), dtype=np.int64)
        for w, (d, k, lab) in enumerate(zip(datas, rows, labels)):
            for label, t, p in zip(lab, d.y_true[k], d.y_pred[k]):
                counts[w, names.index(label), int(t) * 2 + int(p)] += 1
        n = counts.reshape(len(datas), -1).sum(axis=1)
        p = np.array([c.ravel() / t if t else np.full(g * 4, 1 / (g * 4)) for c, t in zip(counts, n)])
        draws = rng.multinomial(n, p, size=(cfg.bootstrap, len(datas))).reshape(cfg.bootstrap, len(datas), g, 4).astype(float)
        for w in range(len(datas)):
            present = [i for i in range(g) if counts[w, i].sum()]
            if len(present) < 2:
                continue
            judged = [counts[w, i].sum() >= cfg.min_group_size for i in range(g)]
            point = [_rates(*(np.array([float(counts[w, i, c])]) for c in (3, 1, 0, 2))) for i in range(g)]
            boot = [_rates(draws[:, w, i, 3], draws[:, w, i, 1], draws[:, w, i, 0], draws[:, w, i, 2]) for i in range(g)]
            nan = np.full(cfg.bootstrap, np.nan)
            sm_point = _summary({r: [point[i][r] if judged[i] else np.array([np.nan]) for i in range(g)] for r in FZ.RATES})
            sm_boot = _summary({r: [boot[i][r] if judged[i] else nan for i in range(g)] for r in FZ.RATES})
            out[w][attr] = {
                "groups": [(names[i], int(counts[w, i].sum()), judged[i], {r: float(point[i][r][0]) for r in FZ.RATES},
                            {r: _interval(boot[i][r], cfg) for r in FZ.RATES}) for i in present],
                "summary": {s: float(sm_point[s][0]) for s in FZ.SUMMARY},
                "summary_ci": {s: _interval(sm_boot[s], cfg) for s in FZ.SUMMARY},
            }
    return out


def _chi2_p(n_ref: int, shares: np.ndarray, values: np.ndarray, edges: np.ndarray) -> float:
    """scipy's chi-squared test of homogeneity (no continuity correction) of the reference's bin counts and
    ``values``' on ``edges``, bins empty in both dropped; 1 where one bin holds everything."""
    cur = np.bincount(np.searchsorted(edges, values, side="right"), minlength=len(edges) + 1)
    table = np.array([np.rint(shares * n_ref), cur])
    table = table[:, table.sum(axis=0) > 0]
    return 1.0 if table.shape[1] < 2 else float(chi2_contingency(table, correction=False).pvalue)


def _none_or(x: float | None) -> float | None:
    return None if x is None or x != x else x


def _same_interval(got: tuple[float, float] | None, want: tuple[float, float] | None) -> bool:
    # np.nanquantile interpolates the upper bound as b - (b - a)(1 - t), the module as a + t (b - a): last bits.
    return got == want if got is None or want is None else got == pytest.approx(want, rel=1e-12, abs=1e-15)


@pytest.mark.parametrize("cfg", [M.MonitoringConfig(), M.MonitoringConfig(ks_method="asymp", seed=3, min_group_size=10, bootstrap=60)],
                         ids=["limit", "asymp"])
def test_every_window_equals_the_one_window_computation(windows, cfg):
    ref_data, wins = windows
    ref = M.reference(ref_data, cfg)
    got = M.evaluate_windows(ref, wins, cfg, subject="model:x:1")
    datas = [d for _, _, d in wins]
    assert len(got) == len(wins)
    fair = _fairness_by_window(datas, cfg)
    judged_features = 0
    for res, (s, e, d), want_fair in zip(got, wins, fair):
        assert (res.window_start, res.window_end, res.n_predictions) == (s, e, d.n)
        # metrics: counts by hand
        k = ~np.isnan(d.y_true) & ~np.isnan(d.y_pred)
        yt, yp = d.y_true[k], d.y_pred[k]
        assert res.metrics["n_outcomes"] == int(k.sum())
        if k.any() and np.isin(yt, [0.0, 1.0]).all() and np.isin(yp, [0.0, 1.0]).all():
            tp, fp = float(((yt == 1) & (yp == 1)).sum()), float(((yt == 0) & (yp == 1)).sum())
            tn, fn = float(((yt == 0) & (yp == 0)).sum()), float(((yt == 1) & (yp == 0)).sum())
            assert res.metrics == {"n_outcomes": int(k.sum()), "accuracy": (tp + tn) / yt.size, "tpr": tp / (tp + fn) if tp + fn else None,
                                   "fpr": fp / (fp + tn) if fp + tn else None, "fnr": fn / (tp + fn) if tp + fn else None,
                                   "selection_rate": (tp + fp) / yt.size}
        elif k.any():
            assert res.metrics["accuracy"] == float(np.mean(yt == yp)) and res.metrics["mae"] == float(np.mean(np.abs(yt - yp)))
        else:
            assert res.metrics["accuracy"] is None and res.metrics["tpr"] is None
        # prediction drift: the PSI of the scores, or of the decisions in a window without a score
        values = d.score if (~np.isnan(d.score)).any() else d.y_pred
        edges, shares = ref.prediction
        want_pred = D.psi_from_shares(shares, D.bin_shares(values, edges), cfg.epsilon) if d.n else None
        assert res.prediction_psi == want_pred
        pv = values[~np.isnan(values)]
        want_pred_p = _chi2_p(ref.prediction_n, shares, pv, edges) if pv.size else None
        assert res.prediction_psi_pvalue == (want_pred_p if want_pred_p is None else pytest.approx(want_pred_p, rel=1e-9, abs=1e-300))
        pred_found = any(f["kind"] == "model_prediction_drift" for f in res.findings)
        assert pred_found == (d.n >= cfg.min_window_size and want_pred is not None and want_pred >= cfg.prediction_psi_max
                              and want_pred_p < cfg.ks_alpha)
        # drift per feature: PSI on the reference's deciles, scipy's KS statistic and the configured p-value
        assert [f.feature for f in res.drift] == list(ref.features)
        for fd in res.drift:
            v = d.features.get(fd.feature, np.empty(0))
            v = v[~np.isnan(v)]
            ref_sorted, f_edges, f_shares = ref.features[fd.feature]
            if v.size == 0:
                assert (fd.psi, fd.level, fd.ks, fd.ks_pvalue, fd.n, fd.drifted) == (None, "unknown", None, None, 0, False)
                continue
            assert fd.n == v.size
            assert fd.psi == D.psi_from_shares(f_shares, D.bin_shares(v, f_edges), cfg.epsilon)
            assert fd.level == D.psi_level(fd.psi)
            assert fd.ks == ks_2samp(ref_sorted, v, method="asymp").statistic
            m, n = ref_sorted.size, v.size
            if cfg.ks_method == "limit":
                assert fd.ks_pvalue == pytest.approx(float(kolmogorov(np.sqrt(m * n / (m + n)) * fd.ks)), rel=1e-12, abs=1e-300)
            else:
                assert fd.ks_pvalue == pytest.approx(ks_2samp(ref_sorted, v, method="asymp").pvalue, rel=1e-9, abs=1e-300)
            ks_hit = fd.ks_pvalue < cfg.ks_alpha / len(ref.features)
            # PSI's chi-squared test on its bins, as scipy's contingency test gives it
            want_p = _chi2_p(ref_sorted.size, f_shares, v, f_edges)
            assert fd.psi_pvalue == pytest.approx(want_p, rel=1e-9, abs=1e-300)
            not_chance = ks_hit or want_p < cfg.ks_alpha / len(ref.features)
            want = d.n >= cfg.min_window_size and ((fd.psi >= cfg.psi_significant and not_chance) or (fd.psi >= cfg.psi_moderate and ks_hit))
            assert fd.drifted == want
            judged_features += d.n >= cfg.min_window_size
        # fairness per attribute and group
        assert [a.attribute for a in res.fairness] == list(want_fair)
        for a in res.fairness:
            w = want_fair[a.attribute]
            assert [(g.group, g.count, g.judged) for g in a.groups] == [x[:3] for x in w["groups"]]
            for g, (_, _, _, rates, cis) in zip(a.groups, w["groups"]):
                assert g.rates == {r: _none_or(v) for r, v in rates.items()}
                assert all(_same_interval(g.ci[r], cis[r]) for r in FZ.RATES), (a.attribute, g.group, g.ci, cis)
            assert {s: a.summary[s] for s in FZ.SUMMARY} == {s: _none_or(v) for s, v in w["summary"].items()}
            assert a.summary["_watched"] == a.summary[cfg.fairness_metric]
            assert all(_same_interval(a.summary_ci[s], w["summary_ci"][s]) for s in FZ.SUMMARY)
        # findings: only judged windows raise any; drift ones name exactly the drifted features
        drifted = [f.feature for f in res.drift if f.drifted]
        kinds = [f["kind"] for f in res.findings]
        assert ("model_drift" in kinds) == bool(drifted)
        if d.n < cfg.min_window_size:
            assert res.findings == () and res.notes
    assert judged_features > 50
    assert any(f["kind"] == "model_drift" for r in got for f in r.findings)  # the shifted windows drift
    assert sum(bool(r.fairness) for r in got) > 20


@pytest.mark.parametrize("kind", ["normal", "ties", "tenths", "binary", "outlier", "infinite", "lognormal", "constant", "large"])
def test_reference_ranks_equal_a_binary_search(kind):
    rng = np.random.default_rng(1)
    ref, cur = {
        "normal": (rng.normal(size=2000), rng.normal(size=5000)),
        "ties": (rng.poisson(3, 3000).astype(float), rng.poisson(3, 5000).astype(float)),
        "tenths": (np.round(rng.normal(size=3000), 1), np.round(rng.normal(size=5000), 1)),
        "binary": (rng.integers(0, 2, 3000).astype(float), rng.integers(0, 2, 5000).astype(float)),
        "outlier": (np.append(rng.normal(size=3000), 1e9), np.append(rng.normal(size=5000), [-1e12, 1e12])),
        "infinite": (np.append(rng.normal(size=3000), [np.inf, -np.inf]), np.append(rng.normal(size=5000), [np.inf, -np.inf, 1e300])),
        "lognormal": (rng.lognormal(0, 3, 3000), rng.lognormal(0, 3, 5000)),
        "constant": (np.full(500, 2.5), np.array([2.0, 2.5, 3.0])),
        "large": (rng.normal(size=50_000), rng.normal(size=100)),  # a grid coarser than the reference
    }[kind]
    ref = np.sort(ref)
    for v in (cur, ref[:: max(1, ref.size // 5000)], np.sort(cur)):
        assert (D._ranks(ref, v) == np.searchsorted(ref, v, side="right")).all()


def test_windows_from_one_decoding_equal_the_windows_decoded_one_by_one():
    rng = np.random.default_rng(3)
    t0 = datetime(2026, 11, 23, tzinfo=UTC)
    n = 900
    ts = [t0 + timedelta(seconds=float(s)) for s in np.sort(rng.uniform(0, 4 * 3600, n))]
    ts[10:14] = [ts[10]] * 4  # equal timestamps
    frame = pl.DataFrame({
        "ts": ts,
        "score": [None if i % 17 == 0 else float(x) for i, x in enumerate(rng.random(n))],
        "prediction": [float(i % 2) if i % 5 == 0 else None for i in range(n)],
        "features": [None if i % 31 == 0 else json.dumps({"a": float(rng.normal()), **({"b": int(rng.poisson(2))} if i % 3 else {})})
                     for i in range(n)],
        "groups": [json.dumps({"region": ["north", "s", "east"][i % 3], **({"sex": "f"} if i % 4 else {})}) for i in range(n)],
        "outcome": [None if i % 7 == 0 else float(i % 3 == 0) for i in range(n)],
    }, schema_overrides={"ts": pl.Datetime("us", "UTC")}).sample(fraction=1.0, shuffle=True, seed=1)
    starts = [t0 + timedelta(hours=h) for h in (0, 1, 2, 3, 6)]  # the last holds no row
    one = M.split_window_data(frame, starts, 3600, features=["a", "b"], groups=["region", "sex"])
    each = [(s, e, M.window_data(f, features=["a", "b"], groups=["region", "sex"])) for s, e, f in M.split_windows(frame, starts, 3600)]
    assert [(s, e, d.n) for s, e, d in one] == [(s, e, d.n) for s, e, d in each]
    assert [d.n for _, _, d in one][-1] == 0 and sum(d.n for _, _, d in one) == n
    for (_, _, x), (_, _, y) in zip(one[:-1], each[:-1]):
        for col in ("y_pred", "y_true", "score"):
            assert np.array_equal(getattr(x, col), getattr(y, col), equal_nan=True)
        assert all(np.array_equal(x.features[k], y.features[k], equal_nan=True) for k in ("a", "b"))
        assert all(x.groups[k].tolist() == y.groups[k].tolist() for k in ("region", "sex"))
    ref = M.reference(M.window_data(frame))
    assert [r.to_dict() for r in M.evaluate_windows(ref, one[:-1])] == [r.to_dict() for r in M.evaluate_windows(ref, each[:-1])]

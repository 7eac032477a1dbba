"""Drift statistics of a model's inputs and scores against a reference window, one window at a time and
batched over all of a model's windows at once (``drift_many``); ``governance.monitoring`` evaluates
windows with them.

Pure: arrays in, numbers and arrays out.

Population stability index (PSI), Siddiqi, *Credit Risk Scorecards* (Wiley 2006), ch. 8; Yurdakul,
"Statistical properties of population stability index" (PhD thesis, Western Michigan University, 2018)::

    PSI = sum_i (a_i - e_i) * ln(a_i / e_i)

with ``e_i`` the reference share and ``a_i`` the window's share of bin ``i``. Binning: the reference
window's deciles (``numpy.quantile`` at 0.1, ..., 0.9, the default linear interpolation), duplicate edges
dropped (a feature with many ties, a count, has fewer bins), bins closed on the left: bin ``i`` holds
``edges[i-1] <= x < edges[i]``, the first bin everything below ``edges[0]``, the last everything from
``edges[-1]`` up. A share of 0 is replaced by ``epsilon = 1e-4`` (an empty bin would make the logarithm
infinite). Conventional reading (Siddiqi 2006): below 0.1 no significant change; 0.1 to 0.25 a moderate
shift, to watch; 0.25 and above a significant shift, to act on.

Those thresholds ignore sample size. Between two samples of one population PSI is, asymptotically,
``(1/m + 1/n)`` times a chi-squared variable with ``bins - 1`` degrees of freedom (Yurdakul 2018), which puts a
window of 100 predictions against 2,000 past 0.25 in 0.5 % of its features; simulated, with the epsilon of empty
bins, it is about 1 %, and a window of 30 passes it in most: an empty bin alone adds ``0.1 ln(0.1 / epsilon)``,
0.69. ``psi_pvalues`` gives, for the same bins,
Pearson's chi-squared test of homogeneity of the window's counts with the reference's (the 2 x bins table,
``scipy.stats.chi2_contingency(correction=False)``), so a caller can ask that a PSI also be unlikely by chance.

Two-sample Kolmogorov-Smirnov per feature: the statistic ``D = sup |F_ref(x) - F_win(x)|`` and its
p-value, equal to ``scipy.stats.ks_2samp`` (Hodges 1958, "The significance probability of the Smirnov
two-sample test", Arkiv för Matematik 3:469-486). ``ks_method="auto"`` calls scipy itself (exact p-value
up to 10 000 rows per sample); ``"asymp"`` computes the same statistic with numpy and the p-value as scipy's
``method="asymp"`` does, ``kstwo.sf(D, round(m n / (m + n)))``, for all windows of a model in one call;
``"limit"`` (the windows' default, for speed: ``kstwo.sf`` costs ~150 us a value) the Kolmogorov limiting
distribution ``scipy.special.kolmogorov(sqrt(m n / (m + n)) D)``, which ``asymp`` converges to (within 0.02 at
200 rows against 2,000). The statistic is the same in every method.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["PSI_MODERATE", "PSI_SIGNIFICANT", "PSI_BINS", "PSI_EPSILON", "psi_edges", "bin_shares", "psi_from_shares", "psi",
           "ks_statistic", "ks_asymp_pvalue", "ks_limit_pvalue", "ks_test", "psi_level", "psi_counts", "psi_pvalues", "drift_many"]

PSI_MODERATE = 0.1
PSI_SIGNIFICANT = 0.25
"""Siddiqi 2006, ch. 8: < 0.1 no significant change; 0.1-0.25 some change; >= 0.25 significant shift."""
PSI_BINS = 10
PSI_EPSILON = 1e-4


# --- one window ---------------------------------------------------------------------------------


def psi_edges(reference: np.ndarray, bins: int = PSI_BINS) -> np.ndarray:
    """Inner bin edges: the reference's quantiles at 1/bins, ..., (bins-1)/bins, duplicates dropped."""
    ref = np.asarray(reference, dtype=float)
    ref = ref[~np.isnan(ref)]
    if ref.size == 0:
        raise ValueError("the reference has no values")
    return np.unique(np.quantile(ref, np.arange(1, bins) / bins))


def bin_shares(values: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Share of ``values`` (NaN dropped) in each bin ``[edges[i-1], edges[i])``; len(edges)+1 bins."""
    v = np.asarray(values, dtype=float)
    v = v[~np.isnan(v)]
    counts = np.bincount(np.searchsorted(edges, v, side="right"), minlength=len(edges) + 1)
    return counts / max(v.size, 1)


def psi_from_shares(expected: np.ndarray, actual: np.ndarray, epsilon: float = PSI_EPSILON) -> float:
    e = np.where(expected > 0, expected, epsilon)
    a = np.where(actual > 0, actual, epsilon)
    return float(np.sum((a - e) * np.log(a / e)))


def psi(reference: np.ndarray, current: np.ndarray, *, bins: int = PSI_BINS, epsilon: float = PSI_EPSILON) -> float:
    """Population stability index of ``current`` against ``reference`` (binning in the module docstring)."""
    edges = psi_edges(reference, bins)
    return psi_from_shares(bin_shares(reference, edges), bin_shares(current, edges), epsilon)


def ks_statistic(reference_sorted: np.ndarray, current: np.ndarray) -> float:
    """Two-sample KS statistic, as ``scipy.stats.ks_2samp`` computes it (both CDFs at every pooled value)."""
    cur = np.sort(np.asarray(current, dtype=float))
    if reference_sorted.size == 0 or cur.size == 0:
        return math.nan
    pooled = np.concatenate([reference_sorted, cur])
    d = np.searchsorted(reference_sorted, pooled, side="right") / reference_sorted.size - np.searchsorted(cur, pooled, side="right") / cur.size
    return float(max(np.clip(-d.min(), 0, 1), d.max()))


def ks_asymp_pvalue(d: np.ndarray, n_ref: np.ndarray, n_cur: np.ndarray) -> np.ndarray:
    """scipy's ``ks_2samp(method="asymp")`` two-sided p-value, vectorised: ``kstwo.sf(D, round(mn/(m+n)))``."""
    from scipy.stats import kstwo  # lazy: scipy, only for the drift test

    m = np.asarray(n_ref, dtype=float)
    n = np.asarray(n_cur, dtype=float)
    with np.errstate(invalid="ignore", divide="ignore"):
        en = np.round(m * n / (m + n))
    out = np.full(np.shape(d), np.nan)
    ok = ~np.isnan(d) & (en > 0)
    if ok.any():
        out[ok] = np.clip(kstwo.sf(np.asarray(d)[ok], en[ok]), 0, 1)
    return out


def ks_limit_pvalue(d: np.ndarray, n_ref: np.ndarray, n_cur: np.ndarray) -> np.ndarray:
    """The Kolmogorov limiting distribution at ``sqrt(mn/(m+n)) D`` (Smirnov 1948, "Table for estimating the
    goodness of fit of empirical distributions", Ann. Math. Statist. 19(2):279-281), ``scipy.special.kolmogorov``:
    what ``asymp`` converges to as the samples grow, a C ufunc instead of ``kstwo.sf``'s ~150 us per value.
    At 200 rows per window against 2,000 it differs from ``asymp`` by at most 0.02."""
    from scipy.special import kolmogorov  # lazy: scipy, only for the drift test

    m = np.asarray(n_ref, dtype=float)
    n = np.asarray(n_cur, dtype=float)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.clip(kolmogorov(np.sqrt(m * n / (m + n)) * np.asarray(d, dtype=float)), 0, 1)


def ks_test(reference: np.ndarray, current: np.ndarray, *, method: str = "auto") -> tuple[float, float]:
    """(statistic, two-sided p-value) of the two-sample KS test, equal to ``scipy.stats.ks_2samp(..., method=method)``."""
    ref = np.asarray(reference, dtype=float)
    cur = np.asarray(current, dtype=float)
    ref, cur = ref[~np.isnan(ref)], cur[~np.isnan(cur)]
    if ref.size == 0 or cur.size == 0:
        return math.nan, math.nan
    if method in ("asymp", "limit"):
        d = ks_statistic(np.sort(ref), cur)
        f = ks_asymp_pvalue if method == "asymp" else ks_limit_pvalue
        return d, float(f(np.array([d]), np.array([ref.size]), np.array([cur.size]))[0])
    from scipy.stats import ks_2samp  # lazy: scipy, only for the drift test

    r = ks_2samp(ref, cur, method=method)
    return float(r.statistic), float(r.pvalue)


def psi_level(value: float | None) -> str:
    if value is None or math.isnan(value):
        return "unknown"
    return "significant" if value >= PSI_SIGNIFICANT else "moderate" if value >= PSI_MODERATE else "stable"


# --- every window at once -----------------------------------------------------------------------


def _sorted_within(vals: np.ndarray, n: np.ndarray) -> np.ndarray:
    """``vals`` (windows end to end, ``n`` rows each) with each window's values in ascending order."""
    w_n, widest = n.size, int(n.max())
    if w_n * widest <= 4 * vals.size + 4096:
        # Rows of a padded grid, each sorted on its own: far faster than one sort keyed by (window, value).
        grid = np.full((w_n, widest), np.inf)
        start = np.cumsum(n) - n
        win = np.repeat(np.arange(w_n), n)
        grid[win, np.arange(vals.size) - start[win]] = vals
        grid.sort(axis=1)
        return grid[np.arange(widest)[None, :] < n[:, None]]
    return vals[np.lexsort((vals, np.repeat(np.arange(w_n), n)))]  # one window far larger than the rest


def _ranks(ref_sorted: np.ndarray, v: np.ndarray) -> np.ndarray:
    """``np.searchsorted(ref_sorted, v, side="right")``, by interpolation: a uniform grid of up to 4 buckets per
    reference value gives each value a starting rank, one step or two from its own, checked and walked there;
    the few still off (ties in the reference) are looked up. The binary search's cache misses cost more."""
    m = ref_sorted.size
    lo, hi = float(ref_sorted[0]), float(ref_sorted[-1])
    if m < 64 or not (math.isfinite(lo) and math.isfinite(hi) and hi > lo):
        return np.searchsorted(ref_sorted, v, side="right")
    k = min(4 * m, 4 * v.size + 1024)  # the grid costs no more than the values it serves
    scale = k / (hi - lo)
    table = np.searchsorted(ref_sorted, lo + np.arange(k + 1) / scale, side="right")
    r = table[np.clip((v - lo) * scale, 0, k).astype(np.int64)]
    r[v < lo] = 0
    r[v >= hi] = m
    ext = np.concatenate([[-np.inf], ref_sorted, [np.inf]])  # ext[r] = ref[r - 1], ext[r + 1] = ref[r]
    # Right where ref[r - 1] <= v < ref[r]; v >= hi is settled, so ext[r + 1] <= v never reaches r = m.
    off = np.flatnonzero((ext[r] > v) | ((ext[r + 1] <= v) & (v < hi)))
    for _ in range(4):
        if not off.size:
            return r
        ro, vo = r[off], v[off]
        ro = ro + (ext[ro + 1] <= vo) - (ext[ro] > vo)
        r[off] = ro
        off = off[(ext[ro] > vo) | (ext[ro + 1] <= vo)]
    r[off] = np.searchsorted(ref_sorted, v[off], side="right")
    return r


def _rank_bins(ref_sorted: np.ndarray, edges: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The PSI bin of a value from its rank ``r`` in the reference (``searchsorted(ref_sorted, v, "right")``):
    a value of rank r lies in ``[ref[r-1], ref[r])``, so its bin (``searchsorted(edges, v, "right")``) is
    ``bins[r]`` unless an edge falls inside that interval (``split[r]``), where it is looked up."""
    left = np.concatenate([[-np.inf], ref_sorted])
    right = np.concatenate([ref_sorted, [np.inf]])
    lo = np.searchsorted(edges, left, side="right")
    return lo, lo != np.searchsorted(edges, right, side="left")


def psi_counts(counts: np.ndarray, n: np.ndarray, shares: np.ndarray, epsilon: float) -> np.ndarray:
    """PSI per window from its (W, bins) counts and rows: ``psi_from_shares`` row by row, NaN without rows."""
    out = np.full(n.size, np.nan)
    has = n > 0
    a = counts / np.maximum(n, 1)[:, None]
    e = np.where(shares > 0, shares, epsilon)[None, :]
    a = np.where(a > 0, a, epsilon)
    out[has] = np.sum((a - e) * np.log(a / e), axis=1)[has]
    return out


def psi_pvalues(counts: np.ndarray, n: np.ndarray, shares: np.ndarray, n_ref: int) -> np.ndarray:
    """Per window, the p-value of Pearson's chi-squared test of homogeneity between its (W, bins) ``counts``
    (``n`` rows each) and the reference's bins (``shares`` of ``n_ref`` rows): the 2 x bins contingency table
    as ``scipy.stats.chi2_contingency(correction=False)`` tests it, bins empty in both left out (their
    degrees of freedom with them); NaN for a window without rows, 1 where a single bin holds everything."""
    from scipy.special import chdtrc  # lazy: scipy, only for the drift test

    ref = np.rint(np.asarray(shares, dtype=float) * n_ref)[None, :]
    obs = np.asarray(counts, dtype=float)
    rows = np.asarray(n, dtype=float)[:, None]
    both = obs + ref
    total = rows + float(n_ref)
    with np.errstate(invalid="ignore", divide="ignore"):
        e_win = rows * both / total
        e_ref = float(n_ref) * both / total
        cells = np.where(both > 0, (obs - e_win) ** 2 / e_win + (ref - e_ref) ** 2 / e_ref, 0.0)
    df = (both > 0).sum(axis=1) - 1
    out = np.where(df > 0, chdtrc(np.maximum(df, 1), cells.sum(axis=1)), 1.0)
    out[np.asarray(n) == 0] = np.nan
    return out


def drift_many(ref_sorted: np.ndarray, edges: np.ndarray, shares: np.ndarray, vals: np.ndarray, n: np.ndarray,
               epsilon: float = PSI_EPSILON) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One feature's (PSI, KS statistic, PSI's p-value (``psi_pvalues``)) in every window at once, NaN where a
    window has no value: ``vals``
    holds the windows' values end to end, ``n[i]`` of window ``i`` (none NaN); ``ref_sorted``, ``edges`` and
    ``shares`` are the reference's sorted values, PSI bin edges and bin shares.

    The KS statistic is scipy's (``ks_2samp`` evaluates both CDFs at every pooled value, right-continuous)
    computed at the window's points only: between two consecutive window values the window's CDF is flat
    and the reference's rises, so the largest F_ref - F_win is just left of a window value and the
    smallest at one. Each window's values are sorted once; their ranks in the reference give both the
    reference CDF and (``_rank_bins``) the PSI bin."""
    w_n = n.size
    ks_v = np.full(w_n, np.nan)
    v = _sorted_within(vals, n)
    w = np.repeat(np.arange(w_n), n)
    r_right = _ranks(ref_sorted, v)
    ext = np.concatenate([[-np.inf], ref_sorted])  # ext[r] = ref[r - 1]
    tie = ext[r_right] == v  # only values equal to a reference value have a smaller left rank
    r_left = r_right
    if tie.any():
        r_left = r_right.copy()
        r_left[tie] = np.searchsorted(ref_sorted, v[tie], side="left")
    bins, split = _rank_bins(ref_sorted, edges)
    b = bins[r_right]
    amb = split[r_right]
    if amb.any():
        b[amb] = np.searchsorted(edges, v[amb], side="right")
    nb = len(edges) + 1
    counts = np.bincount(w * nb + b, minlength=w_n * nb).reshape(w_n, nb)
    psi_v = psi_counts(counts, n, shares, epsilon)
    psi_p = psi_pvalues(counts, n, shares, ref_sorted.size)
    has = n > 0
    start = np.cumsum(n) - n
    pos = np.arange(v.size) - start[w]  # rank within the window
    nw = n[w].astype(float)
    same = (v[1:] == v[:-1]) & (w[1:] == w[:-1])
    if same.any():  # ties within a window: both window CDFs at a run of equal values
        new = np.empty(v.size, dtype=bool)
        new[0] = True
        new[1:] = ~same
        run_start = np.flatnonzero(new)
        run_end = np.append(run_start[1:], v.size)
        rid = np.cumsum(new) - 1
        fc_right = (run_end[rid] - start[w]) / nw
        fc_left = (run_start[rid] - start[w]) / nw
    else:
        fc_right = (pos + 1) / nw
        fc_left = pos / nw
    m = float(ref_sorted.size)
    fr_right = r_right / m
    fr_left = r_left / m
    plus = np.maximum(fr_right - fc_right, fr_left - fc_left)
    minus = fc_right - fr_right
    idx = start[has]
    ks_v[has] = np.maximum(np.maximum.reduceat(plus, idx), np.clip(np.maximum.reduceat(minus, idx), 0, 1))
    return psi_v, ks_v, psi_p

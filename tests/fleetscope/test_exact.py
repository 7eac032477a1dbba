"""fleetscope.core.exact: float sums kept exactly and the DDSketch, both merging without rounding."""

import math
from fractions import Fraction

import numpy as np
import pytest

from fleetscope.core.exact import SKETCH_RELATIVE_ERROR, ExactSum, Sketch


def values(seed: int = 1) -> np.ndarray:
    rng = np.random.default_rng(seed)
    # magnitudes 1e-12 .. 1e12, both signs, a subnormal and ties that cancel: where float sums lose digits
    return np.concatenate([rng.random(5000) * 1e5, rng.random(500) * 1e-12, -rng.random(300) * 3, [5e-324, 1e12, -1e12, 0.1, 0.2, 0.3]])


def test_the_sum_is_exact_and_rounded_once():
    v = values()
    s = ExactSum.of(v)
    exact = sum(Fraction(x) for x in v.tolist())
    assert s.fraction() == exact
    assert float(s) == float(exact) == math.fsum(v)  # fsum is correctly rounded too
    assert ExactSum.of([0.1, 0.2]).fraction() == Fraction(0.1) + Fraction(0.2) and float(ExactSum.of([0.1, 0.2])) == 0.30000000000000004


@pytest.mark.parametrize("chunks", [1, 2, 7, 101])
def test_any_chunking_gives_the_same_sum_bit_for_bit(chunks):
    v = values(2)
    whole = ExactSum.of(v)
    total = ExactSum()
    for part in np.array_split(v, chunks):
        total = total + ExactSum.from_json(ExactSum.of(part).to_json())
    assert total == whole and float(total) == float(whole)


def test_ratio_and_empty_sums():
    assert ExactSum.of([]).to_json() == "0p0" and float(ExactSum()) == 0.0
    assert ExactSum.of([1.0, 2.0]).ratio(3) == 1.0 and ExactSum.of([1.0]).ratio(0) is None
    assert ExactSum.of([1.0]).ratio(ExactSum.of([3.0])) == 1 / 3


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_a_non_finite_value_is_refused_naming_where(bad):
    with pytest.raises(ValueError, match="value 2 is"):
        ExactSum.of([1.0, 2.0, bad])


def test_sketch_quantiles_within_the_relative_error_and_merge_exactly():
    rng = np.random.default_rng(3)
    x = np.concatenate([rng.lognormal(0, 1, 20000), -rng.lognormal(0, 1, 2000), np.zeros(100)])
    sk = Sketch.of(x)
    assert sk.count == x.size
    for q in (0.01, 0.25, 0.5, 0.9, 0.99):
        exact = float(np.quantile(x, q, method="lower"))
        got = sk.quantile(q)
        assert abs(got - exact) <= SKETCH_RELATIVE_ERROR * abs(exact) * 1.0001 + 1e-12, q
    parts = Sketch()
    for part in np.array_split(x, 9):
        parts = parts + Sketch.from_json(Sketch.of(part).to_json())
    assert parts == sk and parts.quantile(0.99) == sk.quantile(0.99)
    assert Sketch.of([np.nan]).quantile(0.5) is None and Sketch().count == 0

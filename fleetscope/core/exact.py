"""Mergeable summaries whose merge is exact: a sum of floats kept as an exact dyadic rational, and a quantile
sketch of bucket counts. An incremental analysis folds a job's history chunk by chunk into these; because
merging them involves no rounding, any chunking of the same rows gives bit-for-bit the same figures as one
pass over all of them (the property ``services.job_fold`` relies on).

- :class:`ExactSum`: every finite float64 is m·2^e with an integer m of at most 53 bits, so a sum of them is
  an integer times 2^(smallest e): Python integers hold it exactly, and the float read back is the exact
  sum correctly rounded once (Shewchuk's observation that a float sum can be carried exactly, here with
  arbitrary-precision integers rather than his expansions).
- :class:`Sketch`: DDSketch (Masson, Rim and Lee, "DDSketch: a fast and fully-mergeable quantile sketch with
  relative-error guarantees", VLDB 2019): a value x > 0 goes to bucket ⌈log_γ x⌉ with γ = (1 + α)/(1 − α);
  a quantile is read as the bucket's 2γ^i/(γ + 1), within relative error α of the exact order statistic.
  Counts are integers, so merging is exact and the sketch's size depends on the range of the values, not
  on how many there are.

Pure: numpy in, plain Python out; serialisable to JSON for storage between runs.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from fractions import Fraction
from typing import Any

import numpy as np

__all__ = ["ExactSum", "Sketch", "SKETCH_RELATIVE_ERROR"]

SKETCH_RELATIVE_ERROR = 0.005
"""The sketch's α: a quantile it reports is within 0.5 % of the exact order statistic."""


class ExactSum:
    """The exact sum of finite float64 values, as ``mantissa · 2**exponent``."""

    __slots__ = ("mantissa", "exponent")

    def __init__(self, mantissa: int = 0, exponent: int = 0):
        self.mantissa, self.exponent = int(mantissa), int(exponent)

    @classmethod
    def of(cls, values: Iterable[float] | np.ndarray) -> ExactSum:
        """The exact sum of ``values`` (all finite; raises ValueError naming the first that is not)."""
        v = np.asarray(values, dtype=np.float64).ravel()
        if v.size == 0:
            return cls()
        bad = ~np.isfinite(v)
        if bad.any():
            raise ValueError(f"value {int(np.argmax(bad))} is {v[bad][0]!r}: only finite values have an exact sum")
        m, e = np.frexp(v)
        # m in [0.5, 1) carries 53 significant bits: m·2^53 is an exact integer; split it in two halves so
        # that summing each over up to 2^36 values stays inside int64
        mi = (m * 2.0**53).astype(np.int64)
        ex = e.astype(np.int64) - 53
        hi, lo = mi >> 26, mi & ((1 << 26) - 1)
        order = np.argsort(ex, kind="stable")
        ex, hi, lo = ex[order], hi[order], lo[order]
        cuts = np.flatnonzero(np.diff(ex)) + 1
        starts = np.concatenate(([0], cuts))
        sums_hi, sums_lo = np.add.reduceat(hi, starts), np.add.reduceat(lo, starts)
        exps = ex[starts]
        base = int(exps[0])
        total = 0
        for h, lw, x in zip(sums_hi.tolist(), sums_lo.tolist(), exps.tolist()):
            total += ((h << 26) + lw) << (x - base)
        return cls(total, base)._normal()

    def _normal(self) -> ExactSum:
        if self.mantissa == 0:
            self.exponent = 0
            return self
        tz = (self.mantissa & -self.mantissa).bit_length() - 1
        if tz:
            self.mantissa >>= tz
            self.exponent += tz
        return self

    def __add__(self, other: ExactSum) -> ExactSum:
        if other.mantissa == 0:
            return ExactSum(self.mantissa, self.exponent)
        if self.mantissa == 0:
            return ExactSum(other.mantissa, other.exponent)
        e = min(self.exponent, other.exponent)
        return ExactSum((self.mantissa << (self.exponent - e)) + (other.mantissa << (other.exponent - e)), e)._normal()

    def fraction(self) -> Fraction:
        return Fraction(self.mantissa) * (Fraction(2) ** self.exponent)

    def __float__(self) -> float:
        """The sum correctly rounded to a float."""
        return float(self.fraction())

    def ratio(self, other: ExactSum | int) -> float | None:
        """self / other correctly rounded; None where other is zero."""
        den = other.fraction() if isinstance(other, ExactSum) else Fraction(other)
        return None if den == 0 else float(self.fraction() / den)

    def to_json(self) -> str:
        return f"{self.mantissa}p{self.exponent}"

    @classmethod
    def from_json(cls, text: str) -> ExactSum:
        m, e = str(text).split("p")
        return cls(int(m), int(e))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ExactSum) and (self.mantissa, self.exponent) == (other.mantissa, other.exponent)

    def __repr__(self) -> str:
        return f"ExactSum({float(self)!r})"


_GAMMA = (1 + SKETCH_RELATIVE_ERROR) / (1 - SKETCH_RELATIVE_ERROR)
_LOG_GAMMA = math.log(_GAMMA)


class Sketch:
    """DDSketch bucket counts: ``positive[i]``, ``negative[i]`` (by magnitude) and ``zero``."""

    __slots__ = ("positive", "negative", "zero")

    def __init__(self, positive: dict[int, int] | None = None, negative: dict[int, int] | None = None, zero: int = 0):
        self.positive, self.negative, self.zero = dict(positive or {}), dict(negative or {}), int(zero)

    @staticmethod
    def _buckets(x: np.ndarray) -> dict[int, int]:
        if x.size == 0:
            return {}
        keys, counts = np.unique(np.ceil(np.log(x) / _LOG_GAMMA).astype(np.int64), return_counts=True)
        return dict(zip(keys.tolist(), counts.tolist()))

    @classmethod
    def of(cls, values: Iterable[float] | np.ndarray) -> Sketch:
        """A sketch of the non-null, non-NaN ``values``."""
        v = np.asarray(values, dtype=np.float64).ravel()
        v = v[~np.isnan(v)]
        return cls(cls._buckets(v[v > 0]), cls._buckets(-v[v < 0]), int((v == 0).sum()))

    @property
    def count(self) -> int:
        return self.zero + sum(self.positive.values()) + sum(self.negative.values())

    def __add__(self, other: Sketch) -> Sketch:
        pos, neg = dict(self.positive), dict(self.negative)
        for k, c in other.positive.items():
            pos[k] = pos.get(k, 0) + c
        for k, c in other.negative.items():
            neg[k] = neg.get(k, 0) + c
        return Sketch(pos, neg, self.zero + other.zero)

    def quantile(self, q: float) -> float | None:
        """The q-quantile (0 ≤ q ≤ 1) within relative error α; None for an empty sketch."""
        n = self.count
        if n == 0:
            return None
        rank = q * (n - 1)
        seen = 0
        for k in sorted(self.negative, reverse=True):
            seen += self.negative[k]
            if seen > rank:
                return -2 * _GAMMA**k / (_GAMMA + 1)
        seen += self.zero
        if seen > rank:
            return 0.0
        for k in sorted(self.positive):
            seen += self.positive[k]
            if seen > rank:
                return 2 * _GAMMA**k / (_GAMMA + 1)
        return 2 * _GAMMA ** max(self.positive) / (_GAMMA + 1)

    def to_json(self) -> dict[str, Any]:
        return {"p": {str(k): v for k, v in self.positive.items()}, "n": {str(k): v for k, v in self.negative.items()}, "z": self.zero}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Sketch:
        return cls({int(k): int(v) for k, v in d.get("p", {}).items()}, {int(k): int(v) for k, v in d.get("n", {}).items()}, int(d.get("z", 0)))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sketch) and (self.positive, self.negative, self.zero) == (other.positive, other.negative, other.zero)

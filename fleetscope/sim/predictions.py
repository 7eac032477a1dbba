"""A prediction table for a binary classifier whose errors differ by group.

Scores come from a latent logit 2.2·(2y − 1) + noise; for women the positives' logit is shifted down
(the model misses more of them: a higher false-negative rate) and for the 65+ age band the negatives'
logit is shifted up (more false positives). Base rates differ a little by group too, as they do in
real data, so not every fairness criterion can hold at once (Chouldechova 2017).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl

AGE_BANDS = ("18-29", "30-44", "45-64", "65+")


@dataclass(frozen=True)
class PredictionTable:
    frame: pl.DataFrame
    sensitive: tuple[str, ...]
    disadvantaged: dict[str, str]  # feature -> group with the worse error rate
    metric: dict[str, str]  # feature -> the rate that differs ("fnr", "fpr")


def prediction_table(rows: int, rng: np.random.Generator) -> PredictionTable:
    sex = rng.choice(np.array(["F", "M"]), rows)
    age = rng.choice(np.array(AGE_BANDS), rows, p=[0.22, 0.3, 0.32, 0.16])
    base = 0.30 + 0.04 * (sex == "M") + 0.05 * (age == "45-64")
    y = (rng.random(rows) < base).astype(np.int8)
    logit = 2.2 * (2 * y - 1) + rng.normal(0, 1.3, rows)
    logit -= 1.6 * ((sex == "F") & (y == 1))
    logit += 1.2 * ((age == "65+") & (y == 0))
    score = 1 / (1 + np.exp(-logit))
    pred = (score >= 0.5).astype(np.int8)
    frame = pl.DataFrame({"y_true": y, "y_pred": pred, "y_score": np.round(score, 6), "sex": sex, "age_band": age})
    return PredictionTable(frame, ("sex", "age_band"), {"sex": "F", "age_band": "65+"}, {"sex": "fnr", "age_band": "fpr"})

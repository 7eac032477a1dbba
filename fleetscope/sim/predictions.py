"""A prediction table for a binary classifier whose errors differ by group.

Scores come from a latent logit 2.2·(2y − 1) + noise; for women the positives' logit is shifted down
(the model misses more of them: a higher false-negative rate) and for the 65+ age band the negatives'
logit is shifted up (more false positives). Base rates differ a little by group too, as they do in
real data, so not every fairness criterion can hold at once (Chouldechova 2017).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import numpy as np
import polars as pl
import json
from datetime import timedelta

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


# --- a deployed credit-scoring model over time (post-market monitoring) --------------------------------


@dataclass(frozen=True)
class MonitoringStream:
    """A deployed model version's predictions (and outcomes) as ``model_monitoring`` JSON Lines, with what
    was injected: ``drift_from`` (the first drifted hour's start), the drifted feature, and the biased group."""

    jsonl: bytes
    model: str
    version: str
    start: datetime
    hours: int
    rate: int
    drift_from: datetime | None
    drift_feature: str | None
    biased: dict[str, str]  # attribute -> group the model misses more positives of


def credit_stream(model: str, version: str, start: datetime, *, hours: int, rate: int, rng: np.random.Generator,
                  drift_from_hour: int | None = None, bias: float = 0.0, outcome_share: float = 0.8, income_fall: float = 0.4,
                  concept_drift: float = 0.0) -> MonitoringStream:
    """``rate`` applications an hour for ``hours`` hours to a credit-scoring model (Annex III 5(b)): features
    income (kEUR), debt_ratio, age, group attributes sex and age_band; the outcome (default within a year)
    is known for ``outcome_share`` of them. From ``drift_from_hour`` on, applicants' incomes fall by
    ``income_fall`` (40 %) and debt ratios rise (a downturn: data drift, and the model's scores move with it),
    and ``concept_drift`` of the outcomes turn against the model's score (what predicted repayment no longer
    does: its accuracy falls). ``bias`` shifts the logit of women who would repay towards refusal (a biased
    version: more false negatives for F)."""

    lines: list[str] = []
    n = hours * rate
    hour = np.repeat(np.arange(hours), rate)
    drifted = (hour >= drift_from_hour) if drift_from_hour is not None else np.zeros(n, dtype=bool)
    sex = rng.choice(np.array(["F", "M"]), n)
    age = np.clip(rng.normal(42, 12, n), 18, 90).round()
    band = np.select([age < 30, age < 45, age < 65], ["18-29", "30-44", "45-64"], "65+")
    income = rng.lognormal(np.log(38.0), 0.45, n) * np.where(drifted, 1.0 - income_fall, 1.0)
    debt = np.clip(rng.beta(2, 5, n) + np.where(drifted, 0.15, 0.0), 0, 1)
    risk = -1.2 + 1.6 * debt - 0.03 * (income - 38) + 0.01 * (age - 42) + rng.normal(0, 0.8, n)
    default = (rng.random(n) < 1 / (1 + np.exp(-risk))).astype(int)  # 1: defaulted
    y = 1 - default  # the positive class: repaid
    logit = 1.9 * (2 * y - 1) + rng.normal(0, 1.2, n) - 0.02 * (40 - np.minimum(income, 80)) - 1.0 * (debt - 0.3)
    logit -= bias * ((sex == "F") & (y == 1))
    score = 1 / (1 + np.exp(-logit))
    turned = drifted & (rng.random(n) < concept_drift)
    y = np.where(turned, (score < 0.5).astype(int), y)
    known = rng.random(n) < outcome_share
    offs = rng.integers(0, 3600, n)
    for i in range(n):
        ts = start + timedelta(hours=int(hour[i]), seconds=int(offs[i]))
        pid = f"{version}-{i:07d}"
        lines.append(json.dumps({"model": model, "version": version, "prediction_id": pid, "ts": ts.isoformat(),
                                 "score": round(float(score[i]), 6), "prediction": int(score[i] >= 0.5),
                                 "features": {"income_keur": round(float(income[i]), 2), "debt_ratio": round(float(debt[i]), 4), "age": float(age[i])},
                                 "groups": {"sex": str(sex[i]), "age_band": str(band[i])}}, separators=(",", ":")))
        if known[i]:
            lines.append(json.dumps({"type": "outcome", "model": model, "version": version, "prediction_id": pid,
                                     "ts": (ts + timedelta(minutes=30)).isoformat(), "outcome": int(y[i])}, separators=(",", ":")))
    drift_at = start + timedelta(hours=drift_from_hour) if drift_from_hour is not None else None
    return MonitoringStream(("\n".join(lines) + "\n").encode(), model, version, start, hours, rate, drift_at,
                            "income_keur" if drift_from_hour is not None else None, {"sex": "F"} if bias else {})

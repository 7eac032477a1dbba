"""Post-market monitoring tables (AI Act Art. 72): a deployed model's predictions, the outcomes that arrive
later (joined by ``prediction_id``), and the per-window evaluation the service computes from them.

Declared in the core floor so the ingest parser (``ingest/model_monitoring.py``) and the pure analyses
(``governance/monitoring.py``) can both use them; registered with the store by
``fleetscope/store/schema.py``. Keys are natural: a prediction re-sent is one row; an outcome corrected later
replaces the earlier one (``on_conflict="update"``); re-evaluating a window updates its row.

Features and group attributes are stored per prediction as JSON objects: the set of features differs by
model, and the outcome join needs the rows (a fairness upload, by contrast, keeps aggregates only). Like the
other governance records they are evidence (Art. 72(2) asks for data "throughout their lifetime"), so the
retention task, which deletes raw telemetry, leaves them.
"""

from __future__ import annotations

import polars as pl

from fleetscope.core.frames import UTC_US, Col, FrameSpec


def _k(name: str, dtype: pl.DataType, doc: str = "") -> Col:
    return Col(name, dtype, key=True, nullable=False, doc=doc)


def _f(name: str, dtype: pl.DataType = pl.String, doc: str = "") -> Col:
    return Col(name, dtype, doc=doc)


def _r(name: str, dtype: pl.DataType, doc: str = "") -> Col:
    return Col(name, dtype, nullable=False, doc=doc)


MODEL_PREDICTION = FrameSpec(
    "model_prediction",
    (
        _k("model_name", pl.String),
        _k("model_version", pl.String),
        _k("prediction_id", pl.String, doc="the deployer's id of one prediction: joins its outcome"),
        _r("ts", UTC_US, doc="when the prediction was made"),
        _f("score", pl.Float64, doc="a binary classifier's score for the positive class (probability), if any"),
        _f("prediction", pl.Float64, doc="the decision: 0/1, a class index, or a regression value"),
        _f("features", doc="JSON object of numeric input features (the drift analysis reads them)"),
        _f("groups", doc="JSON object of group attributes (sensitive features), text values"),
    ),
    doc="One prediction of a deployed model (post-market monitoring, Art. 72).",
)

MODEL_OUTCOME = FrameSpec(
    "model_outcome",
    (
        _k("model_name", pl.String),
        _k("model_version", pl.String),
        _k("prediction_id", pl.String),
        _r("ts", UTC_US, doc="when the outcome became known"),
        _r("outcome", pl.Float64, doc="the true value: 0/1, a class index, or a regression target"),
    ),
    on_conflict="update",
    doc="The observed outcome of one prediction, arriving after it (a correction replaces the earlier row).",
)

MONITORING_WINDOW = FrameSpec(
    "monitoring_window",
    (
        _k("model_name", pl.String),
        _k("model_version", pl.String),
        _k("window_start", UTC_US),
        _r("window_end", UTC_US),
        _f("evaluated_at", UTC_US, doc="set by the service"),
        _r("n_predictions", pl.Int64),
        _r("n_outcomes", pl.Int64, doc="predictions of the window whose outcome has arrived"),
        _f("accuracy", pl.Float64),
        _f("tpr", pl.Float64),
        _f("fpr", pl.Float64),
        _f("fnr", pl.Float64),
        _f("selection_rate", pl.Float64),
        _f("prediction_psi", pl.Float64, doc="PSI of the score (or prediction) against the reference window"),
        _f("feature_psi_max", pl.Float64, doc="largest PSI over the features"),
        _f("feature_ks_max", pl.Float64, doc="largest two-sample KS statistic over the features"),
        _f("fairness_gap", pl.Float64, doc="largest between-group difference of the watched fairness metric"),
        _r("status", pl.String, doc="ok, or the crossed thresholds joined by ',' (drift, prediction_drift, fairness, accuracy)"),
        _f("detail", doc="JSON: WindowResult.to_dict() (per-feature drift, per-group rates with intervals)"),
    ),
    on_conflict="update",
    doc="One evaluated monitoring window of a deployed model version.",
)

MONITORING_FRAMES: dict[str, FrameSpec] = {s.name: s for s in (MODEL_PREDICTION, MODEL_OUTCOME, MONITORING_WINDOW)}

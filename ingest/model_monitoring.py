"""Post-market monitoring records of a deployed model (JSON Lines, Fleetscope's own schema) →
``model_prediction`` and ``model_outcome`` rows (``fleetscope/core/monitoring_frames.py``).

There is no standard wire format for a deployed model's prediction log, so Fleetscope defines one. One JSON
object (RFC 8259) per line, UTF-8, ``\\n``-separated, of one of two types:

Predictions (``"type": "prediction"``, the default when ``type`` is absent)

* ``model`` — string, 1–256 characters; ``version`` — string, 1–256 characters (a registered model version);
* ``prediction_id`` — string or integer, 1–256 characters: the deployer's id, which the outcome repeats;
* ``ts`` — RFC 3339 with a zone, or epoch seconds (as in ``docs/job_events.md``);
* ``score`` — number in [0, 1], optional: a binary classifier's probability of the positive class;
* ``prediction`` — number, optional: the decision (0/1, a class index, a regression value). At least one
  of ``score`` and ``prediction`` is required;
* ``features`` — object of finite numbers (or null), at most 256 keys, optional: the inputs drift is
  measured on;
* ``groups`` — object of strings, numbers or booleans (kept as text), at most 16 keys, optional: group
  attributes (sensitive features) fairness over time is measured on.

Outcomes (``"type": "outcome"``)

* ``model``, ``version``, ``prediction_id``, ``ts`` (when the outcome became known) as above;
* ``outcome`` — finite number, required: the true value.

Anything else on a line is an error (a misspelt ``featurs`` would otherwise be dropped unseen). Malformed
input — not UTF-8, NUL bytes, a line over 1 MiB, invalid or truncated JSON, a missing or mistyped field, a
value out of range — raises ``ParseError`` naming the source, the 1-based line and the field, and nothing is
returned. A prediction id repeated within one input with different content is an error too: the natural key
would keep one silently.

Registered with the ingest door as ``model_monitoring`` (``POST /api/v1/ingest/model_monitoring``,
``fleetscope ingest``). It is never cut into pieces: a file is one write, so a bad line anywhere changes
nothing, and a prediction id repeated across the file is caught (256 MiB at most, ``MAX_INPUT_BYTES``).

Pure: bytes in, frames out.
"""

from __future__ import annotations

import json
import math
import re
from datetime import datetime, timedelta, timezone
from typing import Any

import polars as pl

from fleetscope.core.errors import ParseError
from fleetscope.core.frames import Batch, conform
from fleetscope.core.textinput import input_lines, json_object, unterminated_line
from fleetscope.core.monitoring_frames import MODEL_OUTCOME, MODEL_PREDICTION
from ingest.format import FormatSpec, Sniff, SniffView

MAX_LINE_BYTES = 1 << 20
MAX_INPUT_BYTES = 256 << 20
MAX_FEATURES = 256
MAX_GROUPS = 16
MAX_NAME_CHARS = 256
MAX_KEY_CHARS = 128
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_MAX_EPOCH_S = 4102444800.0  # 2100-01-01: larger values are milliseconds sent as seconds
_RFC3339 = re.compile(r"^\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})$")
_PREDICTION_FIELDS = {"type", "model", "version", "prediction_id", "ts", "score", "prediction", "features", "groups"}
_OUTCOME_FIELDS = {"type", "model", "version", "prediction_id", "ts", "outcome"}


class _Line:
    def __init__(self, source: str, line: int):
        self.source, self.line = source, line

    def err(self, message: str, field: str | None = None) -> ParseError:
        return ParseError(message, source=self.source, line=self.line, field=field)

    def text(self, v: Any, field: str, *, limit: int = MAX_NAME_CHARS, allow_int: bool = False) -> str:
        if allow_int and isinstance(v, int) and not isinstance(v, bool):
            v = str(v)
        if v is None:
            raise self.err("missing", field)
        if not isinstance(v, str):
            raise self.err(f"expected a string, got {type(v).__name__}", field)
        if not v or len(v) > limit:
            raise self.err(f"must be 1-{limit} characters, got {len(v)}", field)
        if "\x00" in v:
            raise self.err("contains a NUL character", field)
        return v

    def number(self, v: Any, field: str) -> float | None:
        if v is None:
            return None
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise self.err(f"expected a number, got {type(v).__name__}", field)
        x = float(v)
        if not math.isfinite(x):
            raise self.err("not a finite number", field)
        return x

    def timestamp(self, v: Any, field: str = "ts") -> datetime:
        if v is None:
            raise self.err("missing", field)
        if isinstance(v, bool):
            raise self.err("expected a timestamp, got a boolean", field)
        if isinstance(v, (int, float)):
            x = self.number(v, field)
            if x is None or x < 0 or x > _MAX_EPOCH_S:
                raise self.err(f"epoch seconds {v} outside 1970-2100 (milliseconds?)", field)
            return _EPOCH + timedelta(microseconds=round(x * 1e6))
        if isinstance(v, str) and _RFC3339.match(v):
            t = re.sub(r"[Zz]$", "+00:00", v)
            t = re.sub(r"(\.\d{6})\d+", r"\1", t)
            try:
                return datetime.fromisoformat(t).astimezone(timezone.utc)
            except ValueError:
                pass
        raise self.err(f"expected RFC 3339 with a zone or epoch seconds, got {str(v)[:40]!r}", field)


def _features(p: _Line, v: Any) -> str | None:
    if v is None:
        return None
    if not isinstance(v, dict):
        raise p.err(f"expected an object, got {type(v).__name__}", "features")
    if len(v) > MAX_FEATURES:
        raise p.err(f"{len(v)} features, at most {MAX_FEATURES}", "features")
    out: dict[str, float | None] = {}
    for k, x in v.items():
        p.text(k, "features", limit=MAX_KEY_CHARS)
        out[k] = p.number(x, f"features.{k}")
    return json.dumps(out, sort_keys=True, separators=(",", ":"))


def _groups(p: _Line, v: Any) -> str | None:
    if v is None:
        return None
    if not isinstance(v, dict):
        raise p.err(f"expected an object, got {type(v).__name__}", "groups")
    if len(v) > MAX_GROUPS:
        raise p.err(f"{len(v)} group attributes, at most {MAX_GROUPS}", "groups")
    out: dict[str, str] = {}
    for k, x in v.items():
        p.text(k, "groups", limit=MAX_KEY_CHARS)
        if isinstance(x, bool):
            x = "true" if x else "false"
        elif isinstance(x, (int, float)) and math.isfinite(x):
            x = str(x)
        out[k] = p.text(x, f"groups.{k}", limit=MAX_NAME_CHARS)
    return json.dumps(out, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def parse(data: bytes, *, source: str = "model_monitoring") -> dict[str, pl.DataFrame]:
    """Prediction and outcome rows of one input, as ``{"model_prediction": ..., "model_outcome": ...}``
    conformed frames (either may be empty). Raises ``ParseError`` on the first bad line."""
    lines = input_lines(data, source, max_input_bytes=MAX_INPUT_BYTES, max_line_bytes=MAX_LINE_BYTES)
    last_cut = unterminated_line(data)
    preds: dict[tuple[str, str, str], dict[str, Any]] = {}
    outs: dict[tuple[str, str, str], dict[str, Any]] = {}
    for lineno, text in lines:
        obj = json_object(text, source, lineno, unterminated=lineno == last_cut)
        p = _Line(source, lineno)
        kind = obj.get("type", "prediction")
        if kind not in ("prediction", "outcome"):
            raise p.err(f"unknown type {str(kind)[:40]!r} (prediction or outcome)", "type")
        allowed = _PREDICTION_FIELDS if kind == "prediction" else _OUTCOME_FIELDS
        extra = sorted(set(obj) - allowed)
        if extra:
            raise p.err(f"unknown field for a {kind} (expected some of {', '.join(sorted(allowed))})", extra[0][:64])
        row: dict[str, Any] = {
            "model_name": p.text(obj.get("model"), "model"),
            "model_version": p.text(obj.get("version"), "version"),
            "prediction_id": p.text(obj.get("prediction_id"), "prediction_id", allow_int=True),
            "ts": p.timestamp(obj.get("ts")),
        }
        key = (row["model_name"], row["model_version"], row["prediction_id"])
        if kind == "prediction":
            score = p.number(obj.get("score"), "score")
            if score is not None and not 0.0 <= score <= 1.0:
                raise p.err(f"a score is a probability in [0, 1], got {score}", "score")
            pred = p.number(obj.get("prediction"), "prediction")
            if score is None and pred is None:
                raise p.err("a prediction needs a score or a prediction value", "prediction")
            row.update(score=score, prediction=pred, features=_features(p, obj.get("features")), groups=_groups(p, obj.get("groups")))
            table = preds
        else:
            out = p.number(obj.get("outcome"), "outcome")
            if out is None:
                raise p.err("missing", "outcome")
            row["outcome"] = out
            table = outs
        if key in table and table[key] != row:
            raise p.err(f"{kind} {row['prediction_id']!r} of {row['model_name']}@{row['model_version']} repeated with different content", "prediction_id")
        table[key] = row
    return {"model_prediction": _frame(MODEL_PREDICTION, list(preds.values())), "model_outcome": _frame(MODEL_OUTCOME, list(outs.values()))}


def _frame(spec: Any, rows: list[dict[str, Any]]) -> pl.DataFrame:
    if not rows:
        return spec.empty()
    data = {c.name: pl.Series(c.name, [r.get(c.name) for r in rows], dtype=c.dtype) for c in spec.columns}
    return conform(spec, pl.DataFrame(data))


def predictions_jsonl(frame: pl.DataFrame, *, model: str, version: str, prediction_id: str, ts: str, features: list[str],
                      groups: list[str], score: str | None = None, prediction: str | None = None) -> bytes:
    """Rows of a table as prediction lines of this format: what the simulator and the CLI's
    ``monitoring push --csv`` send. ``ts`` names a column of epoch seconds or RFC 3339 text."""
    lines = []
    for r in frame.iter_rows(named=True):
        obj: dict[str, Any] = {"model": model, "version": version, "prediction_id": str(r[prediction_id]), "ts": r[ts],
                               "features": {f: r[f] for f in features}, "groups": {g: r[g] for g in groups}}
        if score:
            obj["score"] = r[score]
        if prediction:
            obj["prediction"] = r[prediction]
        lines.append(json.dumps(obj, separators=(",", ":")))
    return ("\n".join(lines) + "\n").encode()


def to_batch(data: bytes, *, source: str = "model_monitoring") -> Batch:
    """The input as a ``Batch`` whose ``extra`` frames are its prediction and outcome rows."""
    frames = parse(data, source=source)
    return Batch(source=source, extra=((MODEL_PREDICTION, frames["model_prediction"]), (MODEL_OUTCOME, frames["model_outcome"])))


# --- declaration (ingest.format) ---------------------------------------------------------------------


def _looks_like(view: SniffView) -> bool:
    obj = view.first_object if view.is_json else None
    return obj is not None and "prediction_id" in obj and "model" in obj and "version" in obj


FORMATS = (
    FormatSpec("model_monitoring", "a deployed model's predictions and outcomes, JSON Lines (post-market monitoring, AI Act Art. 72)",
               lambda d, s, o: to_batch(d, source=s), sniff=Sniff(14, _looks_like)),
)

"""The post-market monitoring JSON Lines format: predictions and outcomes in, canonical rows out, and every
kind of bad input refused with the line and field named."""

import gzip
import json

import pytest

from fleetscope.core.errors import ParseError
from ingest.model_monitoring import MAX_FEATURES, parse


def _line(**kw):
    base = {"model": "credit", "version": "1", "prediction_id": "p1", "ts": "2026-08-03T10:00:00Z", "score": 0.7,
            "prediction": 1, "features": {"income": 52000.0, "age": 41}, "groups": {"sex": "F", "young": False}}
    base.update(kw)
    return json.dumps({k: v for k, v in base.items() if v is not ...})


def test_predictions_and_outcomes_parse_to_rows():
    body = "\n".join([_line(), _line(prediction_id=7, ts=1785751200.5, score=None, prediction=0),
                      json.dumps({"type": "outcome", "model": "credit", "version": "1", "prediction_id": "p1",
                                  "ts": "2026-09-01T00:00:00+02:00", "outcome": 1})]) + "\n"
    out = parse(body.encode())
    p, o = out["model_prediction"], out["model_outcome"]
    assert p.height == 2 and o.height == 1
    first = p.filter(p["prediction_id"] == "p1").row(0, named=True)
    assert first["score"] == 0.7 and first["prediction"] == 1.0
    assert json.loads(first["features"]) == {"age": 41.0, "income": 52000.0}
    assert json.loads(first["groups"]) == {"sex": "F", "young": "false"}
    second = p.filter(p["prediction_id"] == "7").row(0, named=True)
    assert second["score"] is None and second["ts"].isoformat() == "2026-08-03T10:00:00.500000+00:00"
    assert o.row(0, named=True)["ts"].isoformat() == "2026-08-31T22:00:00+00:00"


def test_a_prediction_resent_verbatim_is_one_row():
    assert parse((_line() + "\n" + _line() + "\n").encode())["model_prediction"].height == 1


@pytest.mark.parametrize(("line", "field", "message"), [
    (_line(model=...), "model", "missing"),
    (_line(version=""), "version", "1-256"),
    (_line(ts="2026-08-03 10:00"), "ts", "RFC 3339"),
    (_line(ts=1785751200000), "ts", "milliseconds"),
    (_line(score=1.5), "score", "[0, 1]"),
    (_line(score=None, prediction=None), "prediction", "score or a prediction"),
    (_line(score="high"), "score", "expected a number"),
    (_line(features=[1, 2]), "features", "expected an object"),
    (_line(features={"x": "a"}), "features.x", "expected a number"),
    (_line(groups={"sex": None}), "groups.sex", "missing"),
    (_line(featurs={}), "featurs", "unknown field"),
    (_line(type="explanation"), "type", "unknown type"),
    (json.dumps({"type": "outcome", "model": "m", "version": "1", "prediction_id": "p", "ts": 1.0}), "outcome", "missing"),
    (_line(prediction_id=True), "prediction_id", "expected a string"),
    (_line(features={f"f{i}": 1 for i in range(MAX_FEATURES + 1)}), "features", "at most"),
])
def test_bad_fields_are_named(line, field, message):
    with pytest.raises(ParseError, match=message) as e:
        parse((_line(prediction_id="ok") + "\n" + line + "\n").encode(), source="upload")
    assert e.value.line == 2 and e.value.field == field and e.value.source == "upload"


@pytest.mark.parametrize(("body", "message"), [
    (b"", "empty input"),
    (b"\n\n", "empty input"),
    (_line().encode()[:-10], "truncated"),
    (b'{"model": "m"\x00}\n', "NUL"),
    (b"\xff\xfe\n", "UTF-8"),
    (b"[1, 2]\n", "not a JSON object"),
    (b'{"model": "m", "score": NaN}\n', "malformed JSON"),
    (gzip.compress(_line().encode()), "UTF-8|NUL"),
    (b"{" + b" " * (1 << 20) + b"}\n", "longer than"),
])
def test_malformed_truncated_oversized_hostile_input(body, message):
    with pytest.raises(ParseError, match=message):
        parse(body)


def test_a_repeated_id_with_other_content_is_refused():
    with pytest.raises(ParseError, match="repeated with different content") as e:
        parse((_line() + "\n" + _line(score=0.1) + "\n").encode())
    assert e.value.line == 2

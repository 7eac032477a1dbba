"""The per-request log: the documented schema, exact times, and refusals that name the line and field."""

from __future__ import annotations

import datetime as dt
import json

import pytest

from fleetscope.core.errors import ParseError
from fleetscope.door import ingestion
from ingest import serving_requests as sr

T0 = dt.datetime(2026, 3, 1, 12, 0, tzinfo=dt.UTC)


def _line(**kw) -> bytes:  # type: ignore[no-untyped-def]
    base = {"deployment": "chat", "replica": "r0", "request_id": "a", "arrival": "2026-03-01T12:00:00Z",
            "first_token": "2026-03-01T12:00:00.25Z", "finish": "2026-03-01T12:00:02.25Z", "prompt_tokens": 512, "output_tokens": 41}
    base.update(kw)
    return (json.dumps({k: v for k, v in base.items() if v is not ...}) + "\n").encode()


def test_reads_the_schema_exactly():
    data = _line() + _line(request_id=7, arrival=1772366400.5, first_token=None, finish=1772366401.0, status="error", output_tokens=0)
    b = sr.parse(data, source="log")
    df = b.serving_request.sort("request_id")
    seven, a = df.row(0, named=True), df.row(1, named=True)
    assert a["first_token"] - a["arrival"] == dt.timedelta(milliseconds=250)
    assert (a["finish"] - a["first_token"]) / (a["output_tokens"] - 1) == dt.timedelta(milliseconds=50)
    assert a["status"] == "ok" and a["prompt_tokens"] == 512
    assert seven["request_id"] == "7" and seven["first_token"] is None and seven["status"] == "error"
    assert seven["arrival"] == dt.datetime(2026, 3, 1, 12, 0, 0, 500000, tzinfo=dt.UTC)
    assert ingestion.detect(data) == ["serving_requests"]


def test_a_repeated_identical_line_is_one_row_and_a_last_line_without_newline_is_read():
    assert sr.parse(_line() + _line().rstrip(b"\n"), source="log").serving_request.height == 1


@pytest.mark.parametrize(("data", "field", "words"), [
    (_line(frist_token="2026-03-01T12:00:00Z"), "frist_token", "unknown field"),
    (_line(deployment=...), "deployment", "required"),
    (_line(arrival="2026-03-01 12:00:00"), "arrival", "RFC 3339"),
    (_line(arrival=1e13), "arrival", "epoch seconds"),
    (_line(first_token="2026-03-01T11:59:59Z"), "first_token", "before arrival"),
    (_line(finish="2026-03-01T12:00:00.1Z"), "finish", "before first_token"),
    (_line(output_tokens=-1), "output_tokens", ">= 0"),
    (_line(output_tokens=True), "output_tokens", ">= 0"),
    (_line(request_id="x" * 300), "request_id", "characters"),
    (_line() + _line(output_tokens=3), "request_id", "different content"),
])
def test_bad_records_are_refused_naming_line_and_field(data, field, words):
    with pytest.raises(ParseError, match=words) as e:
        sr.parse(data, source="log")
    assert e.value.field == field and e.value.line == data.count(b"\n")


def test_truncated_malformed_oversized_hostile():
    cut = _line()[:40]
    with pytest.raises(ParseError, match="truncated"):
        sr.parse(cut, source="log")
    with pytest.raises(ParseError, match="malformed"):
        sr.parse(b'{"deployment": "chat",, }\n', source="log")
    with pytest.raises(ParseError, match="NaN|malformed"):
        sr.parse(b'{"deployment": "c", "request_id": "a", "arrival": NaN}\n', source="log")
    with pytest.raises(ParseError, match="not a JSON object"):
        sr.parse(b"[1, 2]\n", source="log")
    with pytest.raises(ParseError, match="longer than"):
        sr.parse(b'{"deployment": "' + b"a" * sr.MAX_LINE_BYTES + b'"}\n', source="log")
    with pytest.raises(ParseError, match="exceeds"):
        sr.parse(b" " * (sr.MAX_INPUT_BYTES + 1), source="log")
    with pytest.raises(ParseError, match="NUL"):
        sr.parse(_line()[:-2] + b"\x00\n", source="log")

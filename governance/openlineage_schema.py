"""A faithful, dependency-free validator of the OpenLineage core event schema (spec 2-0-x).

Why hand-written rather than ``jsonschema`` over the published ``OpenLineage.json``: no PyPI package
ships that file (``openlineage-python`` 1.54, ``openlineage-integration-common`` and ``openlineage-sql``
were checked: the client carries generated attrs classes, not the schema), and Fleetscope must not read
``../shared`` at run time nor carry a copy of third-party files. So this module restates the *structure*
the schema requires, in code, and ``tests/governance/test_openlineage_schema.py`` checks it against
the real schema files (``jsonschema`` as a test-only dependency) on a corpus of valid and broken events.

What the schema (https://openlineage.io/spec/2-0-2/OpenLineage.json) requires, and this checks:

- the document is one of RunEvent, DatasetEvent, JobEvent (``oneOf``: exactly one must match);
- BaseEvent: ``eventTime``, ``producer``, ``schemaURL`` are required strings;
- RunEvent: ``run`` (``runId`` required, format uuid) and ``job`` (``namespace``, ``name``) required;
  ``eventType`` one of START, RUNNING, COMPLETE, ABORT, FAIL, OTHER; ``inputs``/``outputs`` arrays of
  datasets (``namespace``, ``name`` required) with ``facets`` and ``inputFacets``/``outputFacets``;
- DatasetEvent: ``dataset`` required and not both ``job`` and ``run``;
- JobEvent: ``job`` required and no ``run``;
- every facet is an object with string ``_producer`` and ``_schemaURL`` (BaseFacet); job and dataset
  facets may carry a boolean ``_deleted``. Additional properties are allowed everywhere.

Where this is stricter than the schema read by a validator with default format checking, and why:
``runId`` must be a canonical UUID (the schema says ``format: uuid``; a run we cannot key is useless)
and ``eventTime`` must be an ISO 8601 / RFC 3339 date-time (``format: date-time``; we order runs by it).
A date-time without a UTC offset is accepted and read as UTC, because the OpenLineage Python client's
own serialisation fixtures emit such times; the caller gets a note saying so.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

EVENT_TYPES = ("START", "RUNNING", "COMPLETE", "ABORT", "FAIL", "OTHER")
EVENT_KINDS = ("RunEvent", "DatasetEvent", "JobEvent")

_UUID = re.compile(r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$")
# RFC 3339 section 5.6, with the offset optional (see the module docstring) and a space allowed for "T"
# as RFC 3339 itself allows in its note.
_DATETIME = re.compile(
    r"^(\d{4})-(\d{2})-(\d{2})[Tt ](\d{2}):(\d{2}):(\d{2})(?:\.(\d+))?([Zz]|[+-]\d{2}:\d{2})?$"
)


@dataclass(frozen=True)
class SchemaIssue:
    """One violation: ``path`` is a JSON Pointer (RFC 6901) into the event, ``""`` for the whole event."""

    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path or '/'}: {self.message}"


def pointer(*parts: str | int) -> str:
    """JSON Pointer of ``parts`` (RFC 6901: ``~`` becomes ``~0``, ``/`` becomes ``~1``)."""
    return "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in parts)


def parse_datetime(value: str) -> tuple[datetime, bool] | None:
    """``(UTC datetime, had_offset)`` for an RFC 3339 date-time, ``None`` when it is not one.

    Fractions beyond microseconds (Java producers send nanoseconds) are truncated, not rounded, so
    two events of one run keep their order.
    """
    m = _DATETIME.match(value)
    if not m:
        return None
    year, month, day, hour, minute, second, frac, off = m.groups()
    try:
        micro = int((frac or "0")[:6].ljust(6, "0"))
        tz = timezone.utc
        if off and off not in ("Z", "z"):
            sign = 1 if off[0] == "+" else -1
            oh, om = int(off[1:3]), int(off[4:6])
            if oh > 23 or om > 59:
                return None
            tz = timezone(sign * timedelta(hours=oh, minutes=om))
        # RFC 3339 allows a leap second (":60"); Python does not, so it becomes the last microsecond.
        sec = int(second)
        if sec == 60:
            sec, micro = 59, 999999
        dt = datetime(int(year), int(month), int(day), int(hour), int(minute), sec, micro, tzinfo=tz)
    except ValueError:
        return None
    return dt.astimezone(timezone.utc), off is not None


def _type_name(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


def _want(value: Any, kind: str, path: str) -> Iterator[SchemaIssue]:
    ok = {
        "object": isinstance(value, dict),
        "array": isinstance(value, list),
        "string": isinstance(value, str),
        "boolean": isinstance(value, bool),
    }[kind]
    if not ok:
        yield SchemaIssue(path, f"expected {kind}, got {_type_name(value)}")


def _required(obj: dict[str, Any], keys: tuple[str, ...], path: str) -> Iterator[SchemaIssue]:
    for k in keys:
        if k not in obj:
            yield SchemaIssue(pointer_join(path, k), "required property is missing")


def pointer_join(base: str, *parts: str | int) -> str:
    return base + pointer(*parts)


def _facet(value: Any, path: str, *, deletable: bool) -> Iterator[SchemaIssue]:
    """BaseFacet (and JobFacet/DatasetFacet's optional ``_deleted``)."""
    if not isinstance(value, dict):
        yield SchemaIssue(path, f"expected object, got {_type_name(value)}")
        return
    yield from _required(value, ("_producer", "_schemaURL"), path)
    for k in ("_producer", "_schemaURL"):
        if k in value:
            yield from _want(value[k], "string", pointer_join(path, k))
    if deletable and "_deleted" in value:
        yield from _want(value["_deleted"], "boolean", pointer_join(path, "_deleted"))


def _facets(value: Any, path: str, *, deletable: bool) -> Iterator[SchemaIssue]:
    if not isinstance(value, dict):
        yield SchemaIssue(path, f"expected object, got {_type_name(value)}")
        return
    for name, facet in value.items():
        yield from _facet(facet, pointer_join(path, name), deletable=deletable)


def _named(value: Any, path: str) -> Iterator[SchemaIssue]:
    """A job or dataset: an object with string ``namespace`` and ``name`` and deletable facets."""
    yield from _required(value, ("namespace", "name"), path)
    for k in ("namespace", "name"):
        if k in value:
            yield from _want(value[k], "string", pointer_join(path, k))
    if "facets" in value:
        yield from _facets(value["facets"], pointer_join(path, "facets"), deletable=True)


def _job(value: Any, path: str) -> Iterator[SchemaIssue]:
    if not isinstance(value, dict):
        yield SchemaIssue(path, f"expected object, got {_type_name(value)}")
        return
    yield from _named(value, path)


def _run(value: Any, path: str) -> Iterator[SchemaIssue]:
    if not isinstance(value, dict):
        yield SchemaIssue(path, f"expected object, got {_type_name(value)}")
        return
    yield from _required(value, ("runId",), path)
    if "runId" in value:
        rid = value["runId"]
        p = pointer_join(path, "runId")
        if not isinstance(rid, str):
            yield SchemaIssue(p, f"expected string, got {_type_name(rid)}")
        elif not _UUID.match(rid):
            yield SchemaIssue(p, f"{rid[:60]!r} is not a UUID (format: uuid)")
    if "facets" in value:
        yield from _facets(value["facets"], pointer_join(path, "facets"), deletable=False)


def _dataset(value: Any, path: str, extra_facets: str | None) -> Iterator[SchemaIssue]:
    if not isinstance(value, dict):
        yield SchemaIssue(path, f"expected object, got {_type_name(value)}")
        return
    yield from _named(value, path)
    if extra_facets and extra_facets in value:
        yield from _facets(value[extra_facets], pointer_join(path, extra_facets), deletable=False)


def _datasets(event: dict[str, Any], key: str, facet_key: str) -> Iterator[SchemaIssue]:
    if key not in event:
        return
    value = event[key]
    if not isinstance(value, list):
        yield SchemaIssue(pointer(key), f"expected array, got {_type_name(value)}")
        return
    for i, ds in enumerate(value):
        yield from _dataset(ds, pointer(key, i), facet_key)


def _base(event: dict[str, Any]) -> Iterator[SchemaIssue]:
    yield from _required(event, ("eventTime", "producer", "schemaURL"), "")
    for k in ("eventTime", "producer", "schemaURL"):
        if k in event:
            yield from _want(event[k], "string", pointer(k))
    t = event.get("eventTime")
    if isinstance(t, str) and parse_datetime(t) is None:
        yield SchemaIssue("/eventTime", f"{t[:60]!r} is not an RFC 3339 date-time (format: date-time)")


def branch_issues(event: dict[str, Any], kind: str) -> list[SchemaIssue]:
    """Every violation of ``event`` against one branch of the schema's ``oneOf``."""
    issues = list(_base(event))
    if kind == "RunEvent":
        issues += _required(event, ("run", "job"), "")
        if "eventType" in event:
            et = event["eventType"]
            if not isinstance(et, str):
                issues.append(SchemaIssue("/eventType", f"expected string, got {_type_name(et)}"))
            elif et not in EVENT_TYPES:
                issues.append(SchemaIssue("/eventType", f"{et[:40]!r} is not one of {', '.join(EVENT_TYPES)}"))
        if "run" in event:
            issues += _run(event["run"], "/run")
        if "job" in event:
            issues += _job(event["job"], "/job")
        issues += _datasets(event, "inputs", "inputFacets")
        issues += _datasets(event, "outputs", "outputFacets")
    elif kind == "DatasetEvent":
        issues += _required(event, ("dataset",), "")
        if "job" in event and "run" in event:
            issues.append(SchemaIssue("", "a DatasetEvent must not carry both job and run"))
        if "dataset" in event:
            issues += _dataset(event["dataset"], "/dataset", None)
    elif kind == "JobEvent":
        issues += _required(event, ("job",), "")
        if "run" in event:
            issues.append(SchemaIssue("/run", "a JobEvent must not carry a run"))
        if "job" in event:
            issues += _job(event["job"], "/job")
        issues += _datasets(event, "inputs", "inputFacets")
        issues += _datasets(event, "outputs", "outputFacets")
    else:  # pragma: no cover - callers pass EVENT_KINDS
        raise ValueError(kind)
    return issues


def intended_kind(event: dict[str, Any]) -> str:
    """The branch a sender most likely meant, to report its errors when no branch matches."""
    if "run" in event:
        return "RunEvent"
    if "dataset" in event and "job" not in event:
        return "DatasetEvent"
    if "job" in event:
        return "JobEvent"
    return "RunEvent"


def classify(event: Any) -> tuple[str | None, list[SchemaIssue]]:
    """``(kind, [])`` when ``event`` matches exactly one of RunEvent, DatasetEvent, JobEvent, as the
    schema's top-level ``oneOf`` demands; else ``(None, issues)``."""
    if not isinstance(event, dict):
        return None, [SchemaIssue("", f"expected a JSON object (an OpenLineage event), got {_type_name(event)}")]
    results = {k: branch_issues(event, k) for k in EVENT_KINDS}
    matched = [k for k, v in results.items() if not v]
    if len(matched) == 1:
        return matched[0], []
    if len(matched) > 1:
        return None, [SchemaIssue("", f"ambiguous: the event matches {' and '.join(matched)}; the schema allows exactly one")]
    kind = intended_kind(event)
    if not any(k in event for k in ("run", "job", "dataset")):
        return None, [SchemaIssue("", "not a RunEvent (run and job), DatasetEvent (dataset) or JobEvent (job)")] + [
            i for i in results[kind] if i.path in ("/eventTime", "/producer", "/schemaURL")
        ]
    return None, results[kind]

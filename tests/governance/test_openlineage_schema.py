"""OpenLineage validation: real events accepted, broken ones refused with the path of the problem, and
the hand-written validator agreeing with the published JSON schema (read with jsonschema) case by case."""

from __future__ import annotations

import copy
import gzip
import json
from pathlib import Path
from typing import Any

import pytest

from governance import lineage
from governance import lineage_events as L

RUN_ID = "d46e465b-d358-4d32-83d4-df660ff614dd"


def _events(d: Path) -> dict[str, dict[str, Any]]:
    return {p.name: json.loads(p.read_text()) for p in sorted((d / "events").glob("*.json"))}


@pytest.fixture(scope="module")
def real_events(openlineage_dir: Path) -> dict[str, dict[str, Any]]:
    ev = _events(openlineage_dir)
    assert len(ev) == 5
    return ev


@pytest.fixture(scope="module")
def schema_validator(openlineage_dir: Path):  # type: ignore[no-untyped-def]
    jsonschema = pytest.importorskip("jsonschema", reason="jsonschema (dev dependency) reads the published schema")
    schema = json.loads((openlineage_dir / "schema" / "OpenLineage.json").read_text())
    # FormatChecker asserts "uuid" (and whatever format libraries are installed); without it, formats are
    # annotations only under draft 2020-12.
    return jsonschema.Draft202012Validator(schema, format_checker=jsonschema.FormatChecker())


def test_real_events_are_accepted_with_their_kind(real_events: dict[str, dict[str, Any]]) -> None:
    kinds = {name: L.validate_event(ev).kind for name, ev in real_events.items()}
    assert kinds == {
        "01_run_start_schema.json": "RunEvent",
        "02_run_complete_schema.json": "RunEvent",
        "03_run_complete_full_facets.json": "RunEvent",
        "04_dataset_event.json": "DatasetEvent",
        "05_job_event.json": "JobEvent",
    }


def test_real_events_parse_into_records(real_events: dict[str, dict[str, Any]]) -> None:
    start = L.parse_event(real_events["01_run_start_schema.json"])
    assert start.runs[0].run_id == RUN_ID and start.runs[0].event_type == "START"
    assert [(e.direction, e.dataset.name) for e in start.io] == [("input", "my-input"), ("output", "my-output")]
    assert [f["name"] for f in start.datasets[0].fields] == ["a", "b", "c", "d"]
    full = L.parse_event(real_events["03_run_complete_full_facets.json"])
    run = full.runs[0]
    assert run.parent_run_id == "3f5e83fa-3480-44ff-99c5-ff943904e5e8"
    assert run.parent_job == lineage.JobRef("my-scheduler-namespace", "myjob.mytask")
    assert run.nominal_start_time is not None and run.nominal_start_time.isoformat() == "2020-12-17T03:00:00.001000+00:00"
    assert full.io[0].facets["dataQualityAssertions"]["assertions"][1]["column"] == "id"
    job_event = L.parse_event(real_events["05_job_event.json"])
    assert {e.run_id for e in job_event.io} == {""}  # static lineage, no run
    assert any("no UTC offset" in n for n in job_event.notes)


def test_validator_agrees_with_the_published_schema_on_real_events(real_events: dict[str, dict[str, Any]], schema_validator) -> None:  # type: ignore[no-untyped-def]
    for name, ev in real_events.items():
        assert not list(schema_validator.iter_errors(ev)), name


def _mutations(base_run: dict[str, Any], base_ds: dict[str, Any], base_job: dict[str, Any]) -> list[tuple[str, Any, str | None]]:
    """(case, event, expected path of our first issue or None when valid)."""

    def m(base: dict[str, Any], fn) -> dict[str, Any]:  # type: ignore[no-untyped-def]
        ev = copy.deepcopy(base)
        fn(ev)
        return ev

    facet = {"_producer": "https://example.org/p", "_schemaURL": "https://example.org/s"}
    return [
        ("valid run", base_run, None),
        ("missing eventTime", m(base_run, lambda e: e.pop("eventTime")), "/eventTime"),
        ("missing producer", m(base_run, lambda e: e.pop("producer")), "/producer"),
        ("missing schemaURL", m(base_run, lambda e: e.pop("schemaURL")), "/schemaURL"),
        ("eventTime not a string", m(base_run, lambda e: e.update(eventTime=1557431364)), "/eventTime"),
        ("runId not a uuid", m(base_run, lambda e: e["run"].update(runId="run-42")), "/run/runId"),
        ("runId a number", m(base_run, lambda e: e["run"].update(runId=42)), "/run/runId"),
        ("missing runId", m(base_run, lambda e: e["run"].pop("runId")), "/run/runId"),
        ("run not an object", m(base_run, lambda e: e.update(run="x")), "/run"),
        ("bad eventType", m(base_run, lambda e: e.update(eventType="DONE")), "/eventType"),
        ("job name a number", m(base_run, lambda e: e["job"].update(name=7)), "/job/name"),
        ("job without namespace", m(base_run, lambda e: e["job"].pop("namespace")), "/job/namespace"),
        ("inputs not an array", m(base_run, lambda e: e.update(inputs={"a": 1})), "/inputs"),
        ("input without name", m(base_run, lambda e: e["inputs"][0].pop("name")), "/inputs/0/name"),
        ("input item not an object", m(base_run, lambda e: e["inputs"].append("ds")), "/inputs/1"),
        ("facet without _producer", m(base_run, lambda e: e["run"].update(facets={"x": {"_schemaURL": "https://e/s"}})), "/run/facets/x/_producer"),
        ("facet not an object", m(base_run, lambda e: e["outputs"][0]["facets"].update(bad=3)), "/outputs/0/facets/bad"),
        ("_deleted not boolean", m(base_run, lambda e: e["job"].update(facets={"d": {**facet, "_deleted": "yes"}})), "/job/facets/d/_deleted"),
        ("unknown facet is fine", m(base_run, lambda e: e["run"].update(facets={"acme_cost": {**facet, "usd": 3}})), None),
        ("extra top-level field is fine", m(base_run, lambda e: e.update(extra={"k": 1})), None),
        ("valid dataset event", base_ds, None),
        ("dataset event with job and run", m(base_ds, lambda e: e.update(job={"namespace": "n", "name": "j"}, run={"runId": RUN_ID})), None),
        ("dataset event ignores a junk run, job and inputs", m(base_ds, lambda e: e.update(run="x", inputs=3)), None),
        ("dataset event ignores a junk job", m(base_ds, lambda e: e.update(job=5)), None),
        ("dataset event without name", m(base_ds, lambda e: e["dataset"].pop("name")), "/dataset/name"),
        ("dataset and job, no run: ambiguous", m(base_ds, lambda e: e.update(job={"namespace": "n", "name": "j"})), ""),
        ("valid job event", base_job, None),
        ("job event with bad output", m(base_job, lambda e: e["outputs"][0].update(namespace=None)), "/outputs/0/namespace"),
        ("no run, job or dataset", {k: base_run[k] for k in ("eventTime", "producer", "schemaURL")}, ""),
        ("array", [base_run], ""),
        ("string", "event", ""),
        ("null", None, ""),
    ]


def _bases(real_events: dict[str, dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    return (real_events["01_run_start_schema.json"], real_events["04_dataset_event.json"], real_events["05_job_event.json"])


def test_broken_events_are_refused_with_the_schema_path(real_events: dict[str, dict[str, Any]]) -> None:
    for case, ev, path in _mutations(*_bases(real_events)):
        if path is None:
            L.validate_event(ev)
            continue
        with pytest.raises(L.LineageError) as err:
            L.validate_event(ev)
        assert err.value.path == path, case
        assert err.value.issues and err.value.to_dict()["issues"][0]["path"] == path, case


def test_verdicts_match_jsonschema_on_the_published_schema(real_events: dict[str, dict[str, Any]], schema_validator) -> None:  # type: ignore[no-untyped-def]
    """Differential test: the same corpus through jsonschema and the real OpenLineage.json."""
    for case, ev, _path in _mutations(*_bases(real_events)):
        ours = True
        try:
            L.validate_event(ev)
        except L.LineageError:
            ours = False
        theirs = schema_validator.is_valid(ev)
        assert ours == theirs, case


def test_stricter_than_jsonschema_on_eventtime_by_design(real_events: dict[str, dict[str, Any]], schema_validator) -> None:  # type: ignore[no-untyped-def]
    ev = dict(real_events["01_run_start_schema.json"], eventTime="yesterday at noon")
    with pytest.raises(L.LineageError) as err:
        L.validate_event(ev)
    assert err.value.path == "/eventTime" and "date-time" in err.value.message


def test_facet_fragments_validate_in_a_failed_run(openlineage_dir: Path, real_events: dict[str, dict[str, Any]]) -> None:
    """A FAIL event built from a real START plus the real ErrorMessage and ColumnLineage facets."""
    ev = copy.deepcopy(real_events["01_run_start_schema.json"])
    ev["eventType"] = "FAIL"
    ev["run"]["facets"] = json.loads((openlineage_dir / "facets" / "ErrorMessageRunFacet.1.json").read_text())
    ev["outputs"][0]["facets"].update(json.loads((openlineage_dir / "facets" / "ColumnLineageDatasetFacet.1.json").read_text()))
    parsed = L.parse_event(ev)
    assert parsed.runs[0].facets["errorMessage"]["message"] == "failed"
    # 4 output columns; NAME, AMOUNT_OFF, STARTS_AT, ENDS_AT each have 3 input fields with one transformation
    assert len(parsed.columns) == 12
    name_inputs = {(c.input.name, c.input_field, c.transformation_type) for c in parsed.columns if c.output_field == "NAME"}
    assert name_inputs == {("CUSTOMERS", "NAME", "DIRECT"), ("CUSTOMERS", "ID", "INDIRECT"), ("DISCOUNTS", "CUSTOMERS_ID", "INDIRECT")}


def test_unknown_facets_are_kept_and_named(real_events: dict[str, dict[str, Any]]) -> None:
    ev = copy.deepcopy(real_events["01_run_start_schema.json"])
    ev["run"]["facets"] = {"acme_cost": {"_producer": "https://acme", "_schemaURL": "https://acme/s", "usd": 12.5}}
    parsed = L.parse_event(ev)
    assert parsed.runs[0].facets["acme_cost"]["usd"] == 12.5
    assert parsed.notes == ("/run/facets/acme_cost: facet not known to Fleetscope; kept as sent",)


def test_fleetscope_job_facet_links_the_fleet_job(real_events: dict[str, dict[str, Any]]) -> None:
    ev = copy.deepcopy(real_events["01_run_start_schema.json"])
    base = {"_producer": "https://fleetscope", "_schemaURL": "https://fleetscope/spec/FleetscopeJobRunFacet.json"}
    ev["run"]["facets"] = {"fleetscope_job": {**base, "jobId": "slurm-881"}, "fleetscope_model": {**base, "name": "ranker", "version": "3"}}
    run = L.parse_event(ev).runs[0]
    assert (run.fleet_job_id, run.model_name, run.model_version) == ("slurm-881", "ranker", "3")
    ev["run"]["facets"]["fleetscope_job"].pop("jobId")
    with pytest.raises(L.LineageError) as err:
        L.validate_event(ev)
    assert err.value.path == "/run/facets/fleetscope_job/jobId"


def test_bodies_truncated_nested_compressed(real_events: dict[str, dict[str, Any]]) -> None:
    raw = json.dumps(real_events["02_run_complete_schema.json"]).encode()
    assert L.parse_body(raw).runs[0].event_type == "COMPLETE"
    assert L.parse_body(gzip.compress(raw), content_encoding="gzip").runs[0].event_type == "COMPLETE"
    with pytest.raises(L.LineageError) as err:
        L.parse_body(raw[: len(raw) // 2])
    assert err.value.malformed and "not valid JSON" in err.value.message
    deep = b'{"eventTime": ' + b"[" * 200 + b"]" * 200 + b"}"
    with pytest.raises(L.LineageError) as err:
        L.parse_body(deep)
    assert err.value.malformed and "nested" in err.value.message
    very_deep = b"[" * 100_000 + b"]" * 100_000
    with pytest.raises(L.LineageError) as err:
        L.parse_body(very_deep)
    assert err.value.malformed
    bomb = gzip.compress(b" " * (L.MAX_BODY_BYTES + 10))
    with pytest.raises(L.LineageError) as err:
        L.parse_body(bomb, content_encoding="gzip")
    assert "exceeds" in err.value.message
    with pytest.raises(L.LineageError):
        L.parse_body(b"\x1f\x8b garbage", content_encoding="gzip")
    with pytest.raises(L.LineageError) as err:
        L.parse_body(gzip.compress(raw)[:-20], content_encoding="gzip")
    assert "truncated" in err.value.message
    with pytest.raises(L.LineageError):
        L.parse_body(raw, content_encoding="br")
    with pytest.raises(L.LineageError) as err:
        L.parse_body(b'{"eventTime": NaN}')
    assert err.value.malformed


def test_same_event_twice_has_one_id(real_events: dict[str, dict[str, Any]]) -> None:
    a = real_events["01_run_start_schema.json"]
    b = json.loads(json.dumps(a, sort_keys=True))
    assert L.event_id(a) == L.event_id(b)
    assert L.event_id(a) != L.event_id(real_events["02_run_complete_schema.json"])


def test_junk_beside_a_dataset_event_is_not_parsed(real_events: dict[str, dict[str, Any]]) -> None:
    ev = dict(real_events["04_dataset_event.json"], run="x", inputs=3)  # both job and run would make it invalid
    parsed = L.parse_event(ev)
    assert parsed.kind == "DatasetEvent" and parsed.jobs == () and parsed.io == () and len(parsed.datasets) == 1

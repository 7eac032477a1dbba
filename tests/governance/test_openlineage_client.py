"""The official OpenLineage Python client, with its HTTP transport, talks to an endpoint built on
``governance.lineage``: a real uvicorn server on loopback, a FastAPI app with just
``POST /api/v1/lineage``, and events emitted by ``OpenLineageClient``.

Needs ``openlineage-python`` (dev dependency); skips with the reason where it is not installed.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Any

import pytest

pytest.importorskip("openlineage.client", reason="openlineage-python (dev dependency) is not installed")

import attr  # noqa: E402  (attrs comes with openlineage-python)
import httpx  # noqa: E402
from fastapi import FastAPI, Request  # noqa: E402
from fastapi.responses import JSONResponse  # noqa: E402
from openlineage.client import OpenLineageClient  # noqa: E402
from openlineage.client.event_v2 import InputDataset, Job, JobEvent, OutputDataset, Run, RunEvent, RunState  # noqa: E402
from openlineage.client.facet_v2 import RunFacet, schema_dataset  # noqa: E402
from openlineage.client.transport.http import ApiKeyTokenProvider, HttpCompression, HttpConfig, HttpTransport  # noqa: E402
from openlineage.client.uuid import generate_new_uuid  # noqa: E402

from governance import lineage as L  # noqa: E402
from governance import lineage_events  # noqa: E402
from tests.conftest import LiveServer  # noqa: E402

TOKEN = "test-token-governance"


@attr.define
class FleetscopeJobRunFacet(RunFacet):
    """Fleetscope's run facet linking a lineage run to the scheduler's job id."""

    jobId: str  # noqa: N815

    @staticmethod
    def _get_schema() -> str:
        return "https://fleetscope.dev/spec/facets/1-0-0/FleetscopeJobRunFacet.json"


def lineage_app(received: list[L.ParsedEvent]) -> FastAPI:
    """What the service's route does, minus the store: auth, decode, validate, parse."""
    app = FastAPI()

    @app.get("/healthz")
    def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.post("/api/v1/lineage")
    async def post_lineage(request: Request) -> JSONResponse:
        if request.headers.get("authorization") != f"Bearer {TOKEN}":
            return JSONResponse({"error": "missing or unknown token"}, status_code=401)
        try:
            parsed = lineage_events.parse_body(await request.body(), content_encoding=request.headers.get("content-encoding"))
        except lineage_events.LineageError as exc:
            return JSONResponse(exc.to_dict(), status_code=400 if exc.malformed else 422)
        received.append(parsed)
        return JSONResponse({"kind": parsed.kind, "notes": list(parsed.notes)}, status_code=201)

    return app


@pytest.fixture
def server() -> Any:
    received: list[L.ParsedEvent] = []
    with LiveServer(lineage_app(received)) as srv:
        srv.received = received
        yield srv


def _client(url: str, compression: HttpCompression | None = None, token: str = TOKEN) -> OpenLineageClient:
    config = HttpConfig(url=url, endpoint="api/v1/lineage", auth=ApiKeyTokenProvider({"apiKey": token}), compression=compression,
                        retry={"total": 0})
    return OpenLineageClient(transport=HttpTransport(config))


def test_client_http_transport_reaches_the_endpoint(server: Any) -> None:
    client = _client(server.url)
    run = Run(runId=str(generate_new_uuid()), facets={"fleetscope_job": FleetscopeJobRunFacet(jobId="slurm-4242")})
    job = Job(namespace="training", name="ranker.train")
    now = datetime.now(timezone.utc).isoformat()
    schema = schema_dataset.SchemaDatasetFacet(fields=[schema_dataset.SchemaDatasetFacetFields(name="email", type="STRING")])
    inputs = [InputDataset(namespace="lake", name="applicants", facets={"schema": schema})]
    outputs = [OutputDataset(namespace="models", name="ranker-weights")]
    client.emit(RunEvent(eventType=RunState.START, eventTime=now, run=run, job=job, inputs=inputs, outputs=outputs))
    client.emit(RunEvent(eventType=RunState.COMPLETE, eventTime=now, run=run, job=job, inputs=inputs, outputs=outputs))
    client.emit(JobEvent(eventTime=now, job=Job(namespace="etl", name="static"), inputs=inputs, outputs=[]))
    assert [p.kind for p in server.received] == ["RunEvent", "RunEvent", "JobEvent"]
    start = server.received[0]
    assert start.runs[0].run_id == run.runId and start.runs[0].fleet_job_id == "slurm-4242"
    assert [(e.direction, e.dataset.name) for e in start.io] == [("input", "applicants"), ("output", "ranker-weights")]
    assert start.datasets[0].fields[0]["name"] == "email"
    graph = L.LineageGraph.from_events(server.received)
    assert graph.runs[run.runId].state == "COMPLETED"


def test_client_gzip_compression_is_accepted(server: Any) -> None:
    client = _client(server.url, compression=HttpCompression.GZIP)
    client.emit(RunEvent(eventType=RunState.FAIL, eventTime=datetime.now(timezone.utc).isoformat(),
                         run=Run(runId=str(generate_new_uuid())), job=Job(namespace="n", name="j")))
    assert server.received[-1].runs[0].event_type == "FAIL"


def test_refusals_reach_the_client(server: Any) -> None:
    import requests

    with pytest.raises(requests.HTTPError) as err:
        _client(server.url, token="wrong").emit(
            RunEvent(eventType=RunState.START, eventTime=datetime.now(timezone.utc).isoformat(),
                     run=Run(runId=str(generate_new_uuid())), job=Job(namespace="n", name="j")))
    assert err.value.response.status_code == 401
    bad = {"eventTime": "2025-01-01T00:00:00Z", "producer": "p", "schemaURL": "s", "run": {"runId": "nope"}, "job": {"namespace": "n", "name": "j"}}
    r = httpx.post(server.url + "/api/v1/lineage", content=json.dumps(bad), headers={"Authorization": f"Bearer {TOKEN}"})
    assert r.status_code == 422 and r.json()["path"] == "/run/runId"
    r = httpx.post(server.url + "/api/v1/lineage", content=b'{"eventTime": ', headers={"Authorization": f"Bearer {TOKEN}"})
    assert r.status_code == 400
    assert len(server.received) == 0

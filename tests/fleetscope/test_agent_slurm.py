"""`fleetscope agent --slurm URL`: the agent polls slurmrestd's jobs and nodes endpoints (a loopback server
answering with real slurmrestd responses, read in place) and pushes them through the ingest door; the stored
rows are those the files parse to. Then what must not be pushed: a server down, a refused token, garbage,
an answer past the size limit."""

from __future__ import annotations

import contextlib
import datetime as dt
import http.server
import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import polars as pl
import pytest

from fleetscope.agent import Agent, TickReport
from fleetscope.services import auth
from ingest import slurmrestd

JOBS = "scheduler/slurmrestd_v0.0.40_23.11_slurm-jobs.json"
NODES = "scheduler/slurmrestd_v0.0.40_23.11_slurm-nodes.json"


@contextlib.contextmanager
def slurmrestd_server(answer: Callable[[str, dict[str, str]], tuple[int, bytes]]) -> Iterator[tuple[str, list[tuple[str, dict[str, str]]]]]:
    """A loopback HTTP server standing in for slurmrestd: ``answer(path, headers)`` gives (status, body);
    every request's path and headers are kept."""
    seen: list[tuple[str, dict[str, str]]] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            headers = {k.lower(): v for k, v in self.headers.items()}
            seen.append((self.path, headers))
            status, body = answer(self.path, headers)
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}", seen
    finally:
        srv.shutdown()
        srv.server_close()


@pytest.fixture
def real_files(realdata: Path) -> dict[str, bytes]:
    return {"/slurm/v0.0.40/jobs": (realdata / JOBS).read_bytes(), "/slurm/v0.0.40/nodes": (realdata / NODES).read_bytes()}


def _serve(files: dict[str, bytes], token: str | None = None) -> Callable[[str, dict[str, str]], tuple[int, bytes]]:
    def answer(path: str, headers: dict[str, str]) -> tuple[int, bytes]:
        if token is not None and headers.get("x-slurm-user-token") != token:
            return 401, b'{"errors": [{"error": "Authentication failure", "error_number": 1007}], "warnings": []}'
        return (200, files[path]) if path in files else (404, b'{"errors": [{"error": "Unknown path"}]}')
    return answer


def _no_source(df: pl.DataFrame) -> pl.DataFrame:
    return df.drop([c for c in ("source",) if c in df.columns]).sort(df.columns[:2])


def test_the_agent_pushes_slurmrestd_jobs_and_nodes(api, real_files: dict[str, bytes]) -> None:
    store = api.app.state.store
    token = auth.create_token(store.engine, "agent", ["ingest"])
    with slurmrestd_server(_serve(real_files, token="jwt-abc")) as (url, seen):
        agent = Agent(api.url, token, slurm_urls=[url + "/"], slurm_user="fleetscope", slurm_token="jwt-abc", push="batch")
        report = agent.tick()
        agent.close()
    assert report.errors == {}
    assert [p for p, _ in seen] == ["/slurm/v0.0.40/jobs", "/slurm/v0.0.40/nodes"]
    assert all(h["x-slurm-user-name"] == "fleetscope" and h["x-slurm-user-token"] == "jwt-abc" for _, h in seen)
    jobs_url, nodes_url = url + "/slurm/v0.0.40/jobs", url + "/slurm/v0.0.40/nodes"
    assert report.pushed[jobs_url]["sched_job"] == 14 and report.pushed[nodes_url]["sched_node"] == 6
    # what the server stored is what the file parses to (SOURCES.md: 14 jobs 776-789, 6 nodes)
    direct = slurmrestd.parse(real_files["/slurm/v0.0.40/jobs"])
    stored = store.read("sched_job")
    assert sorted(stored["job_id"].to_list()) == [str(n) for n in range(776, 790)]
    states = stored.group_by("state").len().sort("state")
    assert dict(states.iter_rows()) == {"COMPLETED": 5, "FAILED": 1, "PENDING": 2, "RUNNING": 5, "TIMEOUT": 1}
    cols = [c for c in direct.sched_job.columns if c not in ("source", "observed_at")]
    assert _no_source(stored.select(cols)).equals(_no_source(direct.sched_job.select(cols)))
    # job 789 waits for its --begin time: eligible an hour after submission, after the snapshot, so not yet a fact
    j789 = stored.filter(pl.col("job_id") == "789").row(0, named=True)
    assert (j789["state"], j789["state_reason"], j789["eligible_at"]) == ("PENDING", "BeginTime", None)
    assert j789["submit_at"] == dt.datetime.fromtimestamp(1747049194 - 3600, dt.UTC)
    nodes = store.read("sched_node")
    assert sorted(nodes["host"].to_list()) == ["cn1", "cn2", "cn3", "cn4", "ia1", "ia2"]
    assert nodes.sort("host").select("host", "gpus_total").rows() == slurmrestd.parse(real_files["/slurm/v0.0.40/nodes"]).sched_node.sort("host").select("host", "gpus_total").rows()


def test_a_newer_data_parser_version_is_asked_for_by_path(api, realdata: Path) -> None:
    token = auth.create_token(api.app.state.store.engine, "agent", ["ingest"])
    files = {"/slurm/v0.0.44/jobs": (realdata / "scheduler/slurmrestd_v0.0.44_25.11_slurm-jobs.json").read_bytes(),
             "/slurm/v0.0.44/nodes": (realdata / "scheduler/slurmrestd_v0.0.44_25.11_slurm-nodes.json").read_bytes()}
    with slurmrestd_server(_serve(files)) as (url, seen):
        report = Agent(api.url, token, slurm_urls=[url], slurm_api_version="v0.0.44").tick()  # OTLP push: slurm goes as is all the same
    assert report.errors == {} and [p for p, _ in seen] == ["/slurm/v0.0.44/jobs", "/slurm/v0.0.44/nodes"]
    stored = api.app.state.store.read("sched_job")
    assert stored.height == 15 and sorted(stored["job_id"].to_list())[0] == "5736"  # SOURCES.md: jobs 5736-5750
    assert api.app.state.store.read("sched_node").height == 8


def _bad(body: bytes, status: int = 200) -> Callable[[str, dict[str, str]], tuple[int, bytes]]:
    return lambda path, headers: (status, body)


@pytest.mark.parametrize("answer, why", [
    (_bad(b'{"errors": [{"error": "Authentication failure"}]}', 401), "slurmrestd refused the request (401)"),
    (_bad(b"<html>502 Bad Gateway</html>", 502), "502"),
    (_bad(b"{\"jobs\": [{\"job_id\": 1,"), "answer is not JSON"),
    (_bad(b"[1, 2, 3]"), "not a slurmrestd"),
    (_bad(b'{"meta": {}, "errors": [{"error": "Unable to query jobs", "error_number": 9000}], "jobs": null}'), "slurmrestd answered with errors"),
    (_bad(b'{"jobs": [], "nodes": []}' + b" " * 5000), "over the 4096-byte limit"),
])
def test_what_slurmrestd_must_not_push(api, answer, why: str) -> None:
    store = api.app.state.store
    token = auth.create_token(store.engine, "agent", ["ingest"])
    with slurmrestd_server(answer) as (url, _):
        agent = Agent(api.url, token, slurm_urls=[url], slurm_max_bytes=4096, push="batch")
        report = agent.tick()
        agent.close()
    assert set(report.errors) == {url + "/slurm/v0.0.40/jobs", url + "/slurm/v0.0.40/nodes"}
    assert all(why in e for e in report.errors.values()), report.errors
    assert report.pushed == {} and report.buffered == 0 and store.counts()["sched_job"] == 0


def test_a_slurmrestd_that_is_down_does_not_stop_the_other_sources(api, real_files: dict[str, bytes]) -> None:
    token = auth.create_token(api.app.state.store.engine, "agent", ["ingest"])
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    with slurmrestd_server(_serve(real_files)) as (url, _):
        report = Agent(api.url, token, slurm_urls=[dead, url], push="batch").tick()
    assert set(report.errors) == {dead + "/slurm/v0.0.40/jobs", dead + "/slurm/v0.0.40/nodes"}
    assert report.pushed[url + "/slurm/v0.0.40/jobs"]["sched_job"] == 14
    assert api.app.state.store.counts()["sched_job"] == 14


def test_a_bad_data_parser_version_is_refused() -> None:
    with pytest.raises(ValueError, match="looks like v0.0.40"):
        Agent("http://127.0.0.1:1", "t", slurm_urls=["http://x"], slurm_api_version="v0.0.40/../../admin")


def test_cli_agent_slurm_once(api, real_files: dict[str, bytes], tmp_path: Path) -> None:
    token = auth.create_token(api.app.state.store.engine, "agent", ["ingest"])
    env = {**os.environ, "FLEETSCOPE_DATA_DIR": str(tmp_path), "SLURM_JWT": "jwt-xyz"}
    with slurmrestd_server(_serve(real_files, token="jwt-xyz")) as (url, seen):
        proc = subprocess.run([sys.executable, "-m", "fleetscope.cli", "agent", "--slurm", url, "--slurm-user", "fleetscope", "--no-infiniband",
                               "--once", "--json", "--api", api.url, "--token", token], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["errors"] == {} and out["pushed"][url + "/slurm/v0.0.40/jobs"]["sched_job"] == 14
    assert seen[0][1]["x-slurm-user-token"] == "jwt-xyz"
    bad = subprocess.run([sys.executable, "-m", "fleetscope.cli", "agent", "--slurm", url, "--slurm-api", "0.0.40", "--once",
                          "--api", api.url, "--token", token], env=env, capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "looks like v0.0.40" in bad.stderr and "Traceback" not in bad.stderr


def test_partitions_accounting_and_accounts_on_request(api, realdata: Path) -> None:
    """Other endpoints: the 981-node fleet's partitions and accounts (v0.0.41) and slurmdbd's record of a job."""
    store = api.app.state.store
    token = auth.create_token(store.engine, "agent", ["ingest"])
    files = {"/slurm/v0.0.41/partitions": (realdata / "scheduler/slurmrestd_v0.0.41_24.05.6_partitions_981x8gpu-fleet.json").read_bytes(),
             "/slurmdb/v0.0.41/accounts": (realdata / "scheduler/slurmrestd_v0.0.41_24.05.6_slurmdb-accounts_981x8gpu-fleet.json").read_bytes(),
             "/slurmdb/v0.0.41/jobs": (realdata / "scheduler/slurmrestd_v0.0.41_24.05_slurmdb-job-completed.json").read_bytes()}
    with slurmrestd_server(_serve(files)) as (url, seen):
        agent = Agent(api.url, token, slurm_urls=[url], slurm_api_version="v0.0.41", slurm_endpoints=("partitions", "accounting", "accounts"), push="batch")
        report = agent.tick()
        agent.close()
    assert report.errors == {} and [p for p, _ in seen] == ["/slurm/v0.0.41/partitions", "/slurmdb/v0.0.41/jobs", "/slurmdb/v0.0.41/accounts"]
    parts = store.read("sched_partition")
    assert sorted(parts["partition"].to_list()) == ["cpuonly", "highprio", "lowprio", "main"]  # SOURCES.md
    want = {r["partition"]: r for r in slurmrestd.parse(files["/slurm/v0.0.41/partitions"]).sched_partition.iter_rows(named=True)}
    assert {r["partition"]: r["gpus_total"] for r in parts.iter_rows(named=True)} == {k: v["gpus_total"] for k, v in want.items()}
    assert store.read("sched_account").height == slurmrestd.parse(files["/slurmdb/v0.0.41/accounts"]).sched_account.height > 0
    job = store.read("sched_job").row(0, named=True)
    assert (job["job_id"], job["state"], job["partition"]) == ("649718", "COMPLETED", "batch")
    with pytest.raises(ValueError, match="endpoints are some of"):
        Agent(api.url, token, slurm_urls=[url], slurm_endpoints=("jobs", "../../etc"))


def test_answers_wait_in_the_backlog_while_the_api_is_down(api, real_files: dict[str, bytes], tmp_path: Path) -> None:
    """slurmrestd's answers go through the agent's backlog like its other readings: kept (and spooled) while the
    API is unreachable, delivered later with the time they were polled."""
    import socket

    store = api.app.state.store
    token = auth.create_token(store.engine, "agent", ["ingest"])
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    polled = dt.datetime(2026, 12, 1, 8, 0, tzinfo=dt.UTC)
    with slurmrestd_server(_serve(real_files)) as (url, _):
        agent = Agent(dead, token, slurm_urls=[url], push="batch", spool=tmp_path / "spool")
        report = agent.tick(polled)
    assert report.buffered == 2 and len(list((tmp_path / "spool").glob("*.reading"))) == 2 and store.counts()["sched_job"] == 0
    assert all("not delivered yet, kept to resend" in e for e in report.errors.values())
    agent.api_url, agent.retry_at = api.url, float("-inf")
    later = TickReport(ts=polled + dt.timedelta(minutes=5))
    agent.drain(later)
    agent.close()
    assert later.replayed == 2 and len(agent.backlog) == 0 and not list((tmp_path / "spool").glob("*.reading"))
    assert store.counts()["sched_job"] == 14 and store.read("sched_node").height == 6

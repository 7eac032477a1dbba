"""The agent's backlog: readings the API did not take are kept, bounded, and delivered later with the time
they were measured. A real dcgm-exporter scrape served on loopback, a real Fleetscope API over SQLite in a
tmp dir (in-process uvicorn, or a `fleetscope serve` process for the SIGKILL run), and an injected clock so
that backoff and Retry-After cost no wall time."""

from __future__ import annotations

import contextlib
import datetime as dt
import http.server
import json
import logging
import os
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.parse

import httpx
import pytest

from fleetscope.services import auth
from fleetscope.store import db
from fleetscope.agent import Agent, TickReport, _retry_after
from fleetscope.agent.backlog import Backlog, Reading
from fleetscope.store import Store
from tests.conftest import make_settings

SCRAPE = "telemetry/dcgm-exporter_metrics_8xH100_k8s-pod-labels_sampled_nvidia-aicr.prom"
T0 = dt.datetime(2026, 3, 1, 12, 0, tzinfo=dt.UTC)
INTERVAL = dt.timedelta(seconds=10)
_TEMP = re.compile(rb"^(DCGM_FI_DEV_GPU_TEMP\{[^}]*\}) \d+$", re.M)


class Clock:
    """The agent's monotonic clock and sleep, moved by hand."""

    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.t += max(0.0, s)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Exporter:
    """dcgm-exporter on loopback serving the real scrape, every GPU temperature set to ``temp`` so that
    each tick's readings can be told apart in the store."""

    def __init__(self, scrape: bytes) -> None:
        self.scrape, self.temp, self.body = scrape, 40, b""
        exporter = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                body = exporter.body or _TEMP.sub(rb"\g<1> " + str(exporter.temp).encode(), exporter.scrape)
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *_: object) -> None:
                pass

        self.srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.srv.server_address[1]}/metrics"
        threading.Thread(target=self.srv.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.srv.shutdown()
        self.srv.server_close()


@pytest.fixture
def exporter(realdata):
    ex = Exporter((realdata / SCRAPE).read_bytes())
    assert len(_TEMP.findall(ex.scrape)) == 8
    yield ex
    ex.close()


class Api:
    """A Fleetscope API over a SQLite file in a tmp dir, served in-process on a fixed loopback port so
    that it can be down (nothing listening) and come back on the same address."""

    def __init__(self, tmp_path) -> None:
        from fleetscope.api import create_app

        self.db_url = f"sqlite:///{tmp_path / 'fleetscope.store.db'}"
        db.upgrade(self.db_url)
        self.app = create_app(make_settings(tmp_path, self.db_url, max_body_bytes=2**20))
        self.store = self.app.state.store
        self.token = auth.create_token(self.store.engine, "agent", ["ingest"])
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._server = None

    def up(self) -> None:
        import uvicorn

        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", self.port))
        server = uvicorn.Server(uvicorn.Config(self.app, log_level="warning", lifespan="off"))
        thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
        thread.start()
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                httpx.get(self.url + "/healthz", timeout=1)
                break
            except httpx.HTTPError:
                time.sleep(0.02)
        self._server = (server, thread, sock)

    def down(self) -> None:
        if self._server is not None:
            server, thread, sock = self._server
            server.should_exit = True
            thread.join(timeout=10)
            sock.close()
            self._server = None


@pytest.fixture
def api(tmp_path):
    a = Api(tmp_path)
    yield a
    a.down()


class Front:
    """An HTTP front before the API that answers the next planned responses itself (status, headers)
    and forwards everything else: a server that is saturated, or that refuses a request."""

    def __init__(self, upstream: str) -> None:
        self.plan: list[tuple[int, dict[str, str]]] = []
        self.seen: list[tuple[str, int]] = []  # (path, status answered)
        front = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if front.plan:
                    status, headers = front.plan.pop(0)
                    content = b'{"detail": "planned"}'
                else:
                    keep = {k: v for k, v in self.headers.items() if k.lower() in ("authorization", "content-type", "content-encoding")}
                    try:
                        resp = httpx.post(upstream + self.path, content=body, headers=keep, timeout=30)
                        status, headers, content = resp.status_code, {"Content-Type": resp.headers.get("content-type", "")}, resp.content
                    except httpx.TransportError:  # the API behind is down: a gateway's answer
                        status, headers, content = 502, {}, b'{"detail": "bad gateway"}'
                front.seen.append((urllib.parse.urlsplit(self.path).path, status))
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(content)))
                self.end_headers()
                self.wfile.write(content)

            def log_message(self, *_: object) -> None:
                pass

        self.srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.srv.server_address[1]}"
        threading.Thread(target=self.srv.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.srv.shutdown()
        self.srv.server_close()


@pytest.fixture
def front(api):
    api.up()
    f = Front(api.url)
    yield f
    f.close()


def temps_by_ts(store: Store) -> dict[dt.datetime, list[float]]:
    """What the store holds: per timestamp, the temperatures of its GPU rows (sorted), one row per GPU."""
    df = store.read("gpu_sample")
    assert df.height == df.select("gpu_uuid", "ts").n_unique(), "a GPU stored twice at one time"
    out: dict[dt.datetime, list[float]] = {}
    for ts, temp in zip(df["ts"], df["temp_c"]):
        out.setdefault(ts, []).append(temp)
    return {k: sorted(v) for k, v in sorted(out.items())}


def tick(agent: Agent, clock: Clock, exporter: Exporter, i: int) -> TickReport:
    """Tick ``i``: the exporter reads 40 + i degrees, the agent's clock and wall time are at tick ``i``."""
    clock.t = 1000.0 + 10.0 * i
    exporter.temp = 40 + i
    return agent.tick(T0 + i * INTERVAL, deadline=clock.t + 10.0)


def make_agent(api_url: str, token: str, exporter: Exporter, clock: Clock, **kw) -> Agent:
    kw.setdefault("rng", random.Random(7))
    return Agent(api_url, token, [exporter.url], host="collector-1", clock=clock, sleep=clock.sleep, **kw)


# --- (a) the API is down for three ticks, then back --------------------------------------------------


@pytest.mark.parametrize("push", ["otlp", "batch"])
def test_api_down_for_three_ticks_then_back_stores_every_tick_at_its_time(api, exporter, push):
    clock = Clock()
    agent = make_agent(api.url, api.token, exporter, clock, push=push)
    for i in range(3):
        report = tick(agent, clock, exporter, i)
        assert report.pushed == {} and report.buffered == i + 1 and report.dropped == 0
        assert "not delivered yet, kept to resend (ConnectError" in report.errors[exporter.url]
    assert api.store.counts()["gpu_sample"] == 0

    api.up()
    report = tick(agent, clock, exporter, 3)
    assert report.errors == {} and report.replayed == 3 and report.buffered == 0 and report.buffered_bytes == 0
    assert report.pushed[exporter.url]["gpu_sample"] == 8
    # every tick's readings, at the time they were measured, with the values read then
    assert temps_by_ts(api.store) == {T0 + i * INTERVAL: [40.0 + i] * 8 for i in range(4)}
    # the pod that held a GPU at each tick, and the inventory, as if the API had never been away
    work = api.store.read("gpu_workload").sort("ts")
    assert work.select("ts", "gpu_uuid", "pod").rows() == [
        (T0 + i * INTERVAL, "GPU-c4529c8d-69c4-b61d-e0bc-7b2460096005", "vllm-agg-0-vllmdecodeworker-s65j5") for i in range(4)]
    assert api.store.read("gpu").height == 8
    agent.close()


def test_waiting_otlp_requests_go_back_to_back_oldest_first(api, exporter):
    """After an outage each tick's OTLP request goes on its own (the server takes a GPU's pod from its
    first point in a request: merged ticks would lose the later ticks' attribution), oldest first, all
    within the tick that finds the API back."""
    front = Front(api.url)
    try:
        clock = Clock()
        agent = make_agent(front.url, api.token, exporter, clock)
        for i in range(3):
            tick(agent, clock, exporter, i)  # the API itself is not up: the front answers 502
        assert [s for _, s in front.seen] == [502] * 3  # one try a tick (the oldest request), not one per waiting request
        api.up()
        front.seen.clear()
        report = tick(agent, clock, exporter, 3)
        assert report.replayed == 3 and front.seen == [("/v1/metrics", 200)] * 4
        assert temps_by_ts(api.store) == {T0 + i * INTERVAL: [40.0 + i] * 8 for i in range(4)}
    finally:
        front.close()


def test_a_long_backlog_is_sent_within_the_tick_budget_and_the_rest_next_tick(api, exporter):
    """Sending what waited stops when the next tick is due; the rest goes at the next tick, in order."""
    clock = Clock()
    agent = make_agent(api.url, api.token, exporter, clock, push="batch", backoff_cap_s=1.0)
    for i in range(6):
        tick(agent, clock, exporter, i)
    api.up()
    exporter.temp = 46

    class Slow(Clock):  # every look at the clock finds a send's worth of time gone
        def __call__(self) -> float:
            self.t += 3.0
            return self.t

    agent.clock = slow = Slow()
    slow.t = 1060.0
    report = agent.tick(T0 + 6 * INTERVAL, deadline=slow.t + 10.0)
    assert report.replayed == 3 and report.buffered == 4 and report.pushed == {}
    assert "older readings were still being sent" in report.errors[exporter.url]
    assert sorted(temps_by_ts(api.store)) == [T0 + i * INTERVAL for i in range(3)]  # the oldest first
    report = agent.tick(T0 + 7 * INTERVAL)  # no deadline: everything
    assert report.replayed == 4 and report.buffered == 0
    assert list(temps_by_ts(api.store).values()) == [[40.0 + i] * 8 for i in range(7)] + [[46.0] * 8]


# --- (b) a full backlog drops the oldest and counts --------------------------------------------------


@pytest.mark.parametrize("push", ["otlp", "batch"])
def test_a_full_backlog_drops_the_oldest_and_counts(api, exporter, push, caplog):
    clock = Clock()
    agent = make_agent(api.url, api.token, exporter, clock, push=push, buffer_ticks=2, backoff_cap_s=5.0)
    dropped = []
    with caplog.at_level(logging.WARNING, logger="fleetscope.agent"):
        for i in range(5):
            report = tick(agent, clock, exporter, i)
            dropped.append(report.dropped)
            assert report.buffered == min(i + 1, 2)
    assert dropped == [0, 0, 1, 1, 1] and agent.backlog.dropped == 3
    assert "backlog full" in caplog.text and f"dropped the 1 oldest, measured {T0.isoformat()}" in caplog.text

    api.up()
    report = tick(agent, clock, exporter, 5)
    assert report.dropped == 1 and report.replayed == 1  # tick 3 made room for tick 5; tick 4 resent
    assert temps_by_ts(api.store) == {T0 + i * INTERVAL: [40.0 + i] * 8 for i in (4, 5)}
    agent.close()


def test_the_backlog_is_bounded_by_bytes_oldest_out_first():
    def reading(i: int, size: int) -> Reading:
        return Reading(T0 + i * INTERVAL, "/v1/metrics", bytes(size), "application/x-protobuf", "otlp", sources={f"s{i}": {}})

    b = Backlog(max_bytes=1000, max_ticks=100)
    assert b.add(reading(0, 400)) == [] and b.add(reading(1, 400)) == []
    out = b.add(reading(2, 300))
    assert [r.ts for r in out] == [T0] and b.dropped == 1 and b.nbytes == 700 and len(b) == 2
    out = b.add(reading(3, 1000))  # makes room by dropping everything older
    assert len(out) == 2 and b.dropped == 3 and [r.ts for r in b.items] == [T0 + 3 * INTERVAL]
    out = b.add(reading(4, 1001))  # larger than the whole backlog: nothing older is worth keeping, nor it
    assert len(out) == 2 and len(b) == 0 and b.nbytes == 0 and b.ticks == 0


# --- (c) 503 with Retry-After ------------------------------------------------------------------------


def test_503_with_retry_after_is_honoured(api, front, exporter):
    clock = Clock()
    agent = make_agent(front.url, api.token, exporter, clock)
    front.plan = [(503, {"Retry-After": "25"})]
    report = tick(agent, clock, exporter, 0)
    assert front.seen == [("/v1/metrics", 503)] and report.buffered == 1
    assert agent.retry_at == clock.t + 25  # as the server asked: no jittered 0.5-1 s backoff

    for i in (1, 2):  # 10 and 20 s later: too early, nothing is sent, the readings wait
        report = tick(agent, clock, exporter, i)
        assert len(front.seen) == 1 and report.buffered == i + 1
    report = tick(agent, clock, exporter, 3)  # 30 s after the 503: due
    assert front.seen[1:] == [("/v1/metrics", 200)] * 4 and report.replayed == 3 and report.buffered == 0
    assert temps_by_ts(api.store) == {T0 + i * INTERVAL: [40.0 + i] * 8 for i in range(4)}


@pytest.mark.parametrize("status", [429, 500, 502, 503, 504, 408])
def test_retryable_statuses_keep_the_readings(api, front, exporter, status):
    clock = Clock()
    agent = make_agent(front.url, api.token, exporter, clock, push="batch")
    front.plan = [(status, {})]
    assert tick(agent, clock, exporter, 0).buffered == 1
    report = tick(agent, clock, exporter, 1)
    assert report.replayed == 1 and report.discarded == 0 and [s for _, s in front.seen] == [status, 200, 200]
    assert temps_by_ts(api.store) == {T0: [40.0] * 8, T0 + INTERVAL: [41.0] * 8}


def test_retry_after_header_forms():
    def after(value: str) -> float | None:
        return _retry_after(httpx.Response(503, headers={"Retry-After": value}))

    assert after("7") == 7.0 and after("0") == 0.0 and after("-3") == 0.0
    assert after("99999") == 300.0  # capped: a bad header must not silence the agent for a day
    assert after("soon") is None and after("nan") is None
    in_a_minute = (dt.datetime.now(dt.UTC) + dt.timedelta(seconds=60)).strftime("%a, %d %b %Y %H:%M:%S GMT")
    assert 55 <= after(in_a_minute) <= 60
    assert _retry_after(httpx.Response(503)) is None


def test_backoff_doubles_with_jitter_up_to_the_cap(api, exporter):
    clock = Clock()
    agent = make_agent(api.url, api.token, exporter, clock, backoff_cap_s=30.0)  # the API is not up
    delays = []
    for i in range(8):
        clock.t = 1000.0 + 100.0 * i  # always past the retry time: every tick tries once
        exporter.temp = 40 + i
        agent.tick(T0 + i * INTERVAL)
        delays.append(agent.retry_at - clock.t)
    for n, d in enumerate(delays):
        cap = min(30.0, 2.0**n)
        assert cap / 2 <= d <= cap, (n, d)
    assert len(set(delays)) == len(delays)  # jittered
    assert agent.failures == 8 and len(agent.backlog) == 8


# --- (d) bad data is dropped, not retried forever ----------------------------------------------------


def test_a_scrape_the_api_cannot_parse_is_dropped_not_retried(api, exporter, caplog):
    """Batch mode forwards the exporter's body: a body that is not Prometheus text gets a 4xx from the
    real API, is dropped and counted, and does not hold up the readings after it."""
    api.up()
    clock = Clock()
    agent = make_agent(api.url, api.token, exporter, clock, push="batch")
    exporter.body = b"DCGM_FI_DEV_GPU_TEMP{gpu=\"0\" 30 this is not the exposition format\n"
    with caplog.at_level(logging.ERROR, logger="fleetscope.agent"):
        report = agent.tick(T0)
    assert report.discarded == 1 and report.buffered == 0 and agent.discarded == 1
    assert "dropped, refused as bad data" in report.errors[exporter.url] and "API answered 400" in report.errors[exporter.url]
    assert "refused as bad data; it would be refused again" in caplog.text
    exporter.body = b""
    report = tick(agent, clock, exporter, 1)
    assert report.errors == {} and report.discarded == 0
    assert temps_by_ts(api.store) == {T0 + INTERVAL: [41.0] * 8}


@pytest.mark.parametrize("status", [400, 404, 409, 415, 422])
def test_a_4xx_is_dropped_once_and_the_next_readings_go_through(api, front, exporter, status):
    clock = Clock()
    agent = make_agent(front.url, api.token, exporter, clock)
    front.plan = [(status, {})]
    report = tick(agent, clock, exporter, 0)
    assert report.discarded == 1 and report.buffered == 0 and f"API answered {status}" in report.errors[exporter.url]
    report = tick(agent, clock, exporter, 1)
    assert report.errors == {} and report.replayed == 0
    assert [s for _, s in front.seen] == [status, 200]  # tried once, never again
    assert temps_by_ts(api.store) == {T0 + INTERVAL: [41.0] * 8}


def test_413_is_dropped_with_a_clear_log_line(api, front, exporter, caplog):
    clock = Clock()
    agent = make_agent(front.url, api.token, exporter, clock, push="batch")
    front.plan = [(413, {})]
    with caplog.at_level(logging.ERROR, logger="fleetscope.agent"):
        report = tick(agent, clock, exporter, 0)
    assert report.discarded == 1 and report.buffered == 0
    assert f"dropped the reading of {exporter.url} measured {T0.isoformat()}: too large for the API (413); not split" in caplog.text


def test_a_refused_token_stops_the_agent_and_keeps_the_readings(api, front, exporter):
    from fleetscope.agent import AgentStopped

    clock = Clock()
    agent = make_agent(front.url, api.token, exporter, clock)
    front.plan = [(401, {})]
    with pytest.raises(AgentStopped, match="401"):
        tick(agent, clock, exporter, 0)
    assert len(agent.backlog) == 1


# --- NVML rows keep their own ts; several waiting batches go as one ---------------------------------


@pytest.fixture
def nvml_gpu(monkeypatch):
    """NVML as the agent calls it, for one H100 whose power rises 50 W a reading, with XID 79 in the first."""
    from fleetscope.devices import nvml

    power = iter(range(250, 10_000, 50))
    monkeypatch.setattr(nvml, "read_devices", lambda: [{"index": 0, "uuid": "GPU-a", "name": "NVIDIA H100 80GB HBM3", "power_mw": next(power) * 1000,
                                                        "temp_c": 59}])
    xids = iter([[{"uuid": "GPU-a", "xid": 79}]])
    monkeypatch.setattr(nvml, "xid_events", lambda *_: next(xids, []))


def test_nvml_batches_keep_their_ts_and_go_together(api, front, nvml_gpu):
    clock = Clock()
    agent = Agent(front.url, api.token, nvml=True, host="gpu-node-9", push="batch", clock=clock, sleep=clock.sleep, rng=random.Random(1))
    front.plan = [(503, {"Retry-After": "1"})]
    agent.tick(T0)
    clock.t += 10
    front.plan = [(503, {"Retry-After": "1"})]
    agent.tick(T0 + INTERVAL)
    clock.t += 10
    report = agent.tick(T0 + 2 * INTERVAL)
    assert report.replayed == 2 and front.seen == [("/api/v1/batches", 503), ("/api/v1/batches", 503), ("/api/v1/batches", 200)]
    assert report.pushed["nvml"]["gpu_sample"] == 3
    got = api.store.read("gpu_sample").sort("ts")
    assert got.select("gpu_uuid", "ts", "power_w").rows() == [("GPU-a", T0 + i * INTERVAL, 250.0 + 50 * i) for i in range(3)]
    ev = api.store.read("health_event")
    assert ev.select("gpu_uuid", "ts", "kind", "code").rows() == [("GPU-a", T0, "xid", 79)]  # the XID of the first tick, at its time


def test_a_refused_merged_batch_is_resent_one_reading_at_a_time(api, front, nvml_gpu):
    """Three waiting NVML batches go as one; when the API refuses that one, each is sent on its own so
    that only a reading at fault would be dropped."""
    clock = Clock()
    agent = Agent(front.url, api.token, nvml=True, host="gpu-node-9", push="batch", clock=clock, sleep=clock.sleep, rng=random.Random(1))
    front.plan = [(503, {}), (503, {}), (400, {})]
    for i in range(3):  # 503, 503 (ticks 0+1 as one request), 400 (ticks 0+1+2); then 0, 1, 2 alone
        clock.t += 10
        report = agent.tick(T0 + i * INTERVAL)
    assert front.seen == [("/api/v1/batches", s) for s in (503, 503, 400, 200, 200, 200)]
    assert report.discarded == 0 and report.replayed == 2 and report.buffered == 0
    assert api.store.read("gpu_sample").sort("ts")["power_w"].to_list() == [250.0, 300.0, 350.0]
    clock.t += 10
    agent.tick(T0 + 3 * INTERVAL)
    assert front.seen[-1] == ("/api/v1/batches", 200)  # merged again once the refused ones are through


# --- the spool: an agent restart loses nothing either -------------------------------------------------


@pytest.mark.parametrize("push", ["otlp", "batch"])
def test_the_spool_keeps_readings_across_an_agent_restart(api, exporter, tmp_path, push):
    spool = tmp_path / "spool"
    clock = Clock()
    first = make_agent(api.url, api.token, exporter, clock, push=push, spool=spool)
    for i in range(3):
        tick(first, clock, exporter, i)
    first.close()
    assert len(list(spool.glob("*.reading"))) == 3

    api.up()
    second = make_agent(api.url, api.token, exporter, Clock(), push=push, spool=spool)
    assert len(second.backlog) == 3 and [r.ts for r in second.backlog.items] == [T0 + i * INTERVAL for i in range(3)]
    report = tick(second, second.clock, exporter, 3)
    assert report.replayed == 3 and report.buffered == 0 and list(spool.iterdir()) == []
    assert temps_by_ts(api.store) == {T0 + i * INTERVAL: [40.0 + i] * 8 for i in range(4)}
    second.close()


def test_cli_once_spools_while_the_api_is_down_and_sends_next_time(api, exporter, tmp_path):
    """`fleetscope agent --once --spool DIR` as cron runs it: the run that finds the API down exits 1 and
    leaves its readings in DIR; the next run delivers them before its own."""
    spool = tmp_path / "spool"
    env = {**os.environ, "FLEETSCOPE_DATA_DIR": str(tmp_path / "cli")}
    cmd = [sys.executable, "-m", "fleetscope.cli", "agent", "--dcgm", exporter.url, "--once", "--json", "--api", api.url, "--token", api.token,
           "--spool", str(spool), "--buffer-mb", "8", "--buffer-ticks", "10"]
    down = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert down.returncode == 1, down.stderr
    out = json.loads(down.stdout)
    assert out["buffered"] == 1 and out["dropped"] == 0 and "kept to resend" in out["errors"][exporter.url]
    assert len(list(spool.glob("*.reading"))) == 1

    api.up()
    exporter.temp = 41
    up = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert up.returncode == 0, up.stderr
    out = json.loads(up.stdout)
    assert out["replayed"] == 1 and out["buffered"] == 0 and out["pushed"][exporter.url]["gpu_sample"] == 8
    got = temps_by_ts(api.store)
    assert list(got.values()) == [[40.0] * 8, [41.0] * 8]  # the first run's readings at the first run's time
    assert list(spool.iterdir()) == []


def test_a_damaged_spool_file_is_skipped(tmp_path, caplog):
    spool = tmp_path / "spool"
    b = Backlog(2**20, 10, spool)
    b.add(Reading(T0, "/v1/metrics", b"abc", "application/x-protobuf", "otlp"))
    b.add(Reading(T0 + INTERVAL, "/v1/metrics", b"def", "application/x-protobuf", "otlp"))
    first = sorted(spool.glob("*.reading"))[0]
    first.write_bytes(b"{not json\nabc")
    (spool / "000000000099.tmp").write_bytes(b"half")
    with caplog.at_level(logging.WARNING, logger="fleetscope.agent"):
        again = Backlog(2**20, 10, spool)
    assert [(r.ts, r.body) for r in again.items] == [(T0 + INTERVAL, b"def")]
    assert "is unreadable" in caplog.text and sorted(p.suffix for p in spool.iterdir()) == [".reading"]
    again.add(Reading(T0 + 2 * INTERVAL, "/v1/metrics", b"ghi", "application/x-protobuf", "otlp"))
    assert len(list(spool.glob("*.reading"))) == 2  # numbering goes on after what was there


# --- run(): waiting readings go between ticks, never holding up the next tick ---------------------------


def test_run_resends_between_ticks_on_schedule(api, front, exporter):
    clock = Clock()
    agent = make_agent(front.url, api.token, exporter, clock, push="batch")
    front.plan = [(503, {"Retry-After": "3"})]
    starts: list[float] = []
    agent.run(10.0, ticks=3, on_tick=lambda r: starts.append(clock.t))
    # ticks on schedule; the 503'd reading went 3 s after it, between the first and second tick
    assert starts == [1000.0, 1010.0, 1020.0]
    assert [s for _, s in front.seen] == [503, 200, 200, 200]
    assert api.store.counts()["gpu_sample"] == 8 * 3


# --- (e) the API process is killed while the agent ticks ----------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("push", ["otlp", "batch"])
def test_sigkill_of_the_api_loses_and_duplicates_nothing(exporter, tmp_path, push):
    """`fleetscope serve` over SQLite is killed with SIGKILL while the agent ticks on (every 0.2 s, real
    clock), restarted on the same database and port; every reading the agent measured is then stored
    exactly once, at the time it was measured."""
    db_url = f"sqlite:///{tmp_path / 'fleetscope.store.db'}"
    db.upgrade(db_url)
    token = auth.create_token(db.make_engine(db_url), "agent", ["ingest"])
    port = free_port()
    env = {**os.environ, "FLEETSCOPE_DATA_DIR": str(tmp_path / "data"), "FLEETSCOPE_DATABASE_URL": db_url, "FLEETSCOPE_LOG_LEVEL": "WARNING"}
    base = f"http://127.0.0.1:{port}"

    def serve() -> subprocess.Popen:
        proc = subprocess.Popen([sys.executable, "-m", "fleetscope.cli", "serve", "--port", str(port)], env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(base + "/healthz", timeout=1).status_code == 200:
                    return proc
            except httpx.HTTPError:
                time.sleep(0.05)
        proc.kill()
        raise RuntimeError("fleetscope serve did not start")

    server = serve()
    agent = Agent(base, token, [exporter.url], host="collector-1", push=push, timeout_s=2.0, backoff_cap_s=0.5)
    reports: list[TickReport] = []
    stop = threading.Event()

    class Done(Exception):
        pass

    def on_tick(report: TickReport) -> None:
        reports.append(report)
        exporter.temp = 40 + len(reports) % 50  # the next tick reads another value
        if stop.is_set() and not agent.backlog:
            raise Done

    def run() -> None:
        with contextlib.suppress(Done):
            agent.run(0.2, on_tick=on_tick)

    worker = threading.Thread(target=run, daemon=True)
    try:
        worker.start()
        while len(reports) < 5:
            time.sleep(0.02)
        server.send_signal(signal.SIGKILL)  # mid-stream: a request may be cut, or written and never answered
        server.wait(timeout=10)
        down_at = len(reports)
        while len(reports) < down_at + 5:
            time.sleep(0.02)
        assert any(r.buffered for r in reports[down_at:])
        server = serve()
        time.sleep(1.0)
        stop.set()
        worker.join(timeout=60)
        assert not worker.is_alive()
    finally:
        stop.set()
        server.kill()
        server.wait(timeout=10)
        agent.close()

    assert not any(r.dropped or r.discarded for r in reports)
    measured = {r.ts: 40 + i % 50 for i, r in enumerate(reports)}
    store = Store.open(db_url)
    try:
        got = temps_by_ts(store)
    finally:
        store.engine.dispose()
    assert list(got) == sorted(measured)  # every tick, once (temps_by_ts checks one row per GPU and time)
    assert got == {ts: [float(t)] * 8 for ts, t in sorted(measured.items())}

"""`fleetscope agent`: the node-side collector. Polls dcgm-exporter endpoints and/or NVML on an interval
and pushes what it reads to the Fleetscope API, so GPU hosts need no database access.

A failed scrape or push is logged and counted, and the next tick goes on: one exporter down must not stop
the others. A refused token (401/403) stops the agent, since every later push would be refused too.
"""

from __future__ import annotations

import datetime as dt
import logging
import socket
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

log = logging.getLogger("fleetscope.agent")


class AgentStopped(RuntimeError):
    pass


@dataclass
class TickReport:
    ts: dt.datetime
    pushed: dict[str, dict[str, int]] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)


@dataclass
class Agent:
    api_url: str
    token: str
    dcgm_urls: list[str] = field(default_factory=list)
    nvml: bool = False
    host: str = field(default_factory=socket.gethostname)
    timeout_s: float = 10.0

    def __post_init__(self) -> None:
        self.client = httpx.Client(timeout=self.timeout_s, headers={"Authorization": f"Bearer {self.token}"})

    def _push(self, resp: httpx.Response, what: str) -> dict[str, int]:
        if resp.status_code in (401, 403):
            raise AgentStopped(f"the API refused the token ({resp.status_code}) while pushing {what}: {resp.text[:200]}")
        if resp.status_code != 200:
            raise RuntimeError(f"API answered {resp.status_code}: {resp.text[:300]}")
        return resp.json().get("written", {})

    def tick(self, now: dt.datetime | None = None) -> TickReport:
        now = now or dt.datetime.now(dt.UTC)
        report = TickReport(ts=now)
        for url in self.dcgm_urls:
            try:
                body = self.client.get(url).raise_for_status().content
                resp = self.client.post(f"{self.api_url}/api/v1/ingest/dcgm", content=body,
                                        params={"ts": now.isoformat(), "source": url}, headers={"Content-Type": "text/plain"})
                report.pushed[url] = self._push(resp, url)
            except AgentStopped:
                raise
            except Exception as exc:  # noqa: BLE001 - reported, and the other sources go on
                report.errors[url] = str(exc).splitlines()[0][:300]
                log.warning("dcgm %s: %s", url, report.errors[url])
        if self.nvml:
            from fleetscope.demo import batch_to_json
            from ingest import nvml

            try:
                batch = nvml.to_batch(nvml.read_devices(), ts=now, host=self.host, xids=nvml.xid_events(0), source=f"nvml:{self.host}")
                report.pushed["nvml"] = self._push(self.client.post(f"{self.api_url}/api/v1/batches", json=batch_to_json(batch)), "nvml")
            except AgentStopped:
                raise
            except Exception as exc:  # noqa: BLE001
                report.errors["nvml"] = str(exc).splitlines()[0][:300]
                log.warning("nvml: %s", report.errors["nvml"])
        return report

    def run(self, interval_s: float, *, ticks: int | None = None, on_tick: Any = None) -> None:
        """Tick every ``interval_s`` on a fixed schedule (a slow tick does not shift the next ones)."""
        n = 0
        next_at = time.monotonic()
        while ticks is None or n < ticks:
            report = self.tick()
            if on_tick:
                on_tick(report)
            n += 1
            next_at += interval_s
            time.sleep(max(0.0, next_at - time.monotonic()))

"""dashboard.ui.prefetch: a page's independent reads at once, each then found in the cache, and a failure left for
the page's own read to report."""

from __future__ import annotations

import threading
import time

import pytest
from sqlalchemy.exc import OperationalError

from dashboard import ui
from fleetscope.services import telemetry


def test_reads_run_at_once_and_all_finish_before_it_returns() -> None:
    barrier = threading.Barrier(3, timeout=10)  # passes only if the three reads are in flight together
    done: list[str] = []

    def read(name: str) -> None:
        barrier.wait()
        time.sleep(0.05)
        done.append(name)

    t = time.perf_counter()
    ui.prefetch(lambda: read("a"), lambda: read("b"), lambda: read("c"))
    assert sorted(done) == ["a", "b", "c"] and not barrier.broken
    assert time.perf_counter() - t < 5


def test_a_failing_read_is_left_to_the_page(monkeypatch: pytest.MonkeyPatch) -> None:
    told: list[str] = []
    monkeypatch.setattr(ui.st, "error", lambda msg, *a, **k: told.append(msg))
    monkeypatch.setattr(ui, "database_url", lambda: "postgresql+psycopg://nobody@127.0.0.1:1/none")

    def unreachable(*args: object) -> object:
        raise OperationalError("SELECT 1", {}, Exception("connection refused"))

    monkeypatch.setattr(ui, "_live", unreachable)
    ran: list[bool] = []
    ui.prefetch(lambda: ui.q(telemetry.fleet_size), lambda: ran.append(True))
    assert ran == [True] and told == []  # nothing said by the prefetch, the other read still ran
    ui.q(telemetry.fleet_size)  # the page's own read says it (and, in a running script, stops it)
    assert len(told) == 1 and "The database did not answer (OperationalError)" in told[0]

"""The API's event-driven evaluation: which ingested events ask for one, and how asks are throttled."""

import datetime as dt

import polars as pl
import pytest

from fleetscope.core import frames as F
from fleetscope.services.alerting.kick import Kicker, needs_evaluation
from fleetscope.services.alerting.rules import load_config


def events(*codes: int, kind: str = "xid") -> pl.DataFrame:
    now = dt.datetime(2027, 3, 1, tzinfo=dt.UTC)
    return F.conform(F.HEALTH_EVENT, pl.DataFrame({"ts": [now] * len(codes), "gpu_uuid": [f"G{i}" for i in range(len(codes))],
                                                    "host": "n1", "kind": kind, "code": list(codes)}))


def test_events_the_shipped_rules_read_ask_for_an_evaluation():
    config = load_config()
    # XID 79 (fallen off the bus), 48/95 (uncorrectable ECC), 64 (row remap failure) page; 13 and 31 are
    # application faults no shipped rule reads.
    for code in (79, 48, 95, 64):
        assert needs_evaluation(config, events(13, code)), code
    assert not needs_evaluation(config, events(13, 31, 43))
    assert needs_evaluation(config, events(0, kind="host_down"))
    assert not needs_evaluation(config, events())
    assert not needs_evaluation(config, None)


def test_a_disabled_or_edited_rule_no_longer_asks():
    config = load_config()
    off = config.with_rules({"GpuFellOffBus": None})
    assert needs_evaluation(config, events(79)) and not needs_evaluation(off, events(79))


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_kicks_are_throttled_trailing_so_every_commit_is_followed_by_an_evaluation():
    sent: list[float] = []
    clock = Clock()
    k = Kicker(sent.append, min_gap_s=1.0, clock=clock)
    assert k.kick() == 0.0  # the first: at once
    clock.t = 100.3
    assert k.kick() == pytest.approx(0.7)  # within the gap: at its end, after this commit
    clock.t = 100.6
    assert k.kick() is None  # the kick due at 101.0 has not started: it will see this commit too
    clock.t = 101.0
    assert k.kick() == 1.0  # the one due now may already be reading: another, a gap later
    clock.t = 105.0
    assert k.kick() == 0.0  # a quiet spell: at once again
    assert sent == pytest.approx([0.0, 0.7, 1.0, 0.0])

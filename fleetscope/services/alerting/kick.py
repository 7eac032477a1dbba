"""Event-driven evaluation: once the API has committed health events that a rule reads (in the shipped
rules XID 79, 48, 94, 95 and 64, and host_down), it asks the worker for an evaluation at once instead of
leaving them to beat's next tick. Beat's tick stays the safety net: a kick lost with the broker, or not
sent, costs only the wait for that tick (``FLEETSCOPE_ALERT_EVAL_INTERVAL_S``).

An earlier evaluation changes what is seen, never when it may be told: ``group_wait``, ``group_interval``
and ``repeat_interval`` are compared with the evaluation's ``now`` in ``dispatch``, so a kick flushes only
groups that are due. The shipped route's child for ``severity="critical", team="fleet"`` has
``group_wait: 0s``, so a dead GPU's page leaves from the kicked evaluation itself; an alert routed with a
``group_wait`` (the shipped default is 5s) goes out at the first evaluation after it, beat's at the latest.

The kick, beat's ticks and the deliveries they queue go to the ``alerting`` queue, which `fleetscope worker`
serves from a worker process of its own (``fleetscope.worker.ALERTING_QUEUE``): a kick waits neither behind
a minute's job analyses nor for a pool slot that a health window holds.

Kicks are throttled per API process to one per ``MIN_GAP_S``, trailing: asked again within the gap, the
kick is sent with a countdown to the gap's end, so an evaluation still starts after every commit that
asked, while a storm (dcgm-exporter's XID gauge repeats a GPU's last XID at every scrape) costs at most
one evaluation per gap.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable

import polars as pl

from fleetscope.services.alerting.engine import rules_reading
from fleetscope.services.alerting.rules import AlertingConfig

MIN_GAP_S = 1.0
EVALUATE = "fleetscope.alerting.evaluate"


class Kicker:
    """Sends ``send(countdown_s)`` for the kicks that are needed: not when a kick already scheduled has
    yet to start (it will see the new commit), else at once or at the end of the current gap."""

    def __init__(self, send: Callable[[float], None], min_gap_s: float = MIN_GAP_S, clock: Callable[[], float] = time.monotonic):
        self._send = send
        self.min_gap_s = min_gap_s
        self._clock = clock
        self._due_at = -math.inf  # when the last kick sent was to start
        self._lock = threading.Lock()

    def kick(self) -> float | None:
        """Ask for an evaluation after now; returns the countdown sent, or None when none was needed."""
        with self._lock:
            now = self._clock()
            if self._due_at > now:
                return None
            countdown = max(0.0, self._due_at + self.min_gap_s - now)
            self._due_at = now + countdown
        self._send(countdown)
        return countdown


def needs_evaluation(config: AlertingConfig, health_event: pl.DataFrame | None) -> bool:
    """Whether some of these events are ones an enabled rule reads (an evaluation now could fire on them)."""
    return health_event is not None and bool(rules_reading(config, health_event))

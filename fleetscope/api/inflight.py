"""A bound on requests being decoded at once, for the receivers whose bodies are inflated and parsed
before they reach the ingest door (OTLP, remote write): past it the sender is told to come back (503 +
``Retry-After``, retryable under both protocols) rather than queued behind work it would time out on."""

from __future__ import annotations


class InFlight:
    """Requests admitted and not yet finished. Used from the event loop only, where nothing runs between
    the check and the count, so no lock is needed."""

    def __init__(self, limit: int):
        self.limit = limit
        self.count = 0

    def enter(self) -> bool:
        """Admit one more request (True), or refuse it (False) when ``limit`` are in flight."""
        if self.count >= self.limit:
            return False
        self.count += 1
        return True

    def exit(self) -> None:
        self.count -= 1

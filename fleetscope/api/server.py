"""How `fleetscope serve` runs uvicorn: with a cap on the request head, enforced while it is read.

uvicorn's httptools protocol buffers every header a client sends, however many and however long;
its h11 protocol caps the head (``h11_max_incomplete_event_size``) but parses in Python, a large part of an
agent push's cost. ``CappedHttpTools`` keeps httptools and counts the request target and header bytes
as the parser hands them over: past the same ``h11_max_incomplete_event_size`` (set from
``FLEETSCOPE_MAX_HEADER_BYTES``) or ``gate.MAX_HEADERS`` fields the connection is answered 431
(RFC 6585 §5) and closed before anything more is buffered. The gate (``api.gate``) checks the same limit
again on the parsed head, for servers started otherwise.

uvicorn also sets no deadline on a request under way: its keep-alive timer runs only between requests, and
is cancelled by a client's first byte. A client that opens a connection and sends nothing, or sends a head or
a body a byte at a time, held its connection (a file descriptor, and a request's buffers) for as long as it
liked. ``CappedHttpTools`` gives the head ``FLEETSCOPE_READ_HEADER_TIMEOUT_S`` from a connection's opening or a
request's first byte, and the body ``FLEETSCOPE_READ_BODY_TIMEOUT_S`` from the end of its head, as Go's
``http.Server`` ReadHeaderTimeout and ReadTimeout do and the shipped Caddyfile's ``read_header`` and
``read_body``; past either the client is answered 408 (RFC 9110 §15.5.9) and the connection closed. A request
whose body was cut off is never stored: the route sees the client gone (``http.disconnect``). Only the client's
time counts: while the server holds the connection up (reading paused for backpressure, a pipelined request
waiting for the one before it, a response under way) an expired deadline waits and then starts again whole, and
no 408 is ever written into another request's response.
"""

from __future__ import annotations

import asyncio
import functools
import multiprocessing
import os
from typing import Any

from fleetscope.api.gate import MAX_HEADERS
from fleetscope.lifetime import die_with_parent
from fleetscope.settings import load

try:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
except ImportError:  # uvicorn without httptools: h11 applies the cap itself
    HttpToolsProtocol = None


class _HeadTooLarge(Exception):
    pass


@functools.cache
def _deadlines() -> tuple[float, float]:
    """(head, body) seconds from this process's settings; 0 is no deadline."""
    s = load()
    return s.read_header_timeout_s, s.read_body_timeout_s


_BUSY_POLL_S = 0.5
"""How often an expired deadline looks again while the server, not the client, is holding the connection up."""

_TIMED_OUT = {
    "head": b"the request head did not arrive within FLEETSCOPE_READ_HEADER_TIMEOUT_S",
    "body": b"the request body did not arrive within FLEETSCOPE_READ_BODY_TIMEOUT_S; nothing of it was stored",
}


if HttpToolsProtocol is not None:

    class CappedHttpTools(HttpToolsProtocol):  # type: ignore[misc,valid-type]
        """httptools with the request head capped and the head and body given deadlines (module level:
        uvicorn's workers import it by name). ``read_header_s``/``read_body_s``: None takes the settings'."""

        read_header_s: float | None = None
        read_body_s: float | None = None
        _deadline: asyncio.TimerHandle | None = None

        def _arm(self, phase: str) -> None:
            self._disarm()
            own = self.read_header_s if phase == "head" else self.read_body_s
            seconds = own if own is not None else _deadlines()[0 if phase == "head" else 1]
            if seconds > 0:
                self._deadline = self.loop.call_later(seconds, self._timed_out, phase)

        def _disarm(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None

        def _server_busy(self, phase: str) -> bool:
            """Whether the connection waits on the server, not the client: reading paused (backpressure, or a
            pipelined request waiting for the one before it), or a response under way that bytes written now
            would land inside."""
            cycle = self.cycle
            if self.flow.read_paused or self.pipeline:
                return True
            if phase == "head":
                return cycle is not None and not cycle.response_complete
            return cycle is not None and cycle.response_started and not cycle.response_complete

        def _held(self, phase: str) -> bool:
            """At a deadline: whether nothing is to be done now, the connection closing or the server holding it up.
            The latter is not the client's time: its clock starts again, whole, once the server waits on it."""
            self._deadline = None
            if self.transport.is_closing():
                return True
            if self._server_busy(phase):
                self._deadline = self.loop.call_later(_BUSY_POLL_S, self._rearm, phase)
                return True
            return False

        def _timed_out(self, phase: str) -> None:
            if self._held(phase):
                return
            cycle = self.cycle
            # a connection that began no request (idle, or blank lines between requests) is closed without a word,
            # as keep-alive's are; so is one whose request was answered before its body came
            began = self._head_bytes is not None if phase == "head" else cycle is not None and not cycle.response_started
            if began:
                body = _TIMED_OUT[phase]
                self.transport.write(b"HTTP/1.1 408 Request Timeout\r\ncontent-type: text/plain; charset=utf-8\r\ncontent-length: "
                                     + str(len(body)).encode("ascii") + b"\r\nconnection: close\r\n\r\n" + body)
            self.transport.close()

        def _rearm(self, phase: str) -> None:
            if not self._held(phase):
                self._arm(phase)

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._head_bytes: int | None = None
            self._arm("head")

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            # Bytes on an idle kept-alive connection cancel uvicorn's keep-alive timer, and blank lines between
            # requests begin no message: the head's clock starts at the first byte, whatever it is.
            if self._deadline is None and (self.cycle is None or self.cycle.response_complete):
                self._arm("head")
            super().data_received(data)

        def on_message_begin(self) -> None:
            self._head_bytes = 0
            self._head_fields = 0
            self._head_refused = ""
            super().on_message_begin()
            if self._deadline is None:  # a pipelined request's head: its clock starts now
                self._arm("head")

        def on_headers_complete(self) -> None:
            self._arm("body")
            super().on_headers_complete()

        def on_message_complete(self) -> None:
            self._disarm()
            self._head_bytes = None
            super().on_message_complete()

        def _count(self, n: int, fields: int = 0) -> None:
            self._head_bytes += n
            self._head_fields += fields
            limit = self.config.h11_max_incomplete_event_size or 16384
            if self._head_fields > MAX_HEADERS:
                self._head_refused = f"more than {MAX_HEADERS} request header fields"
            elif self._head_bytes > limit:
                self._head_refused = f"request line and headers over the limit of {limit} bytes (FLEETSCOPE_MAX_HEADER_BYTES)"
            if self._head_refused:
                raise _HeadTooLarge()  # httptools stops parsing; uvicorn answers through send_400_response

        def on_url(self, url: bytes) -> None:
            self._count(len(url))
            super().on_url(url)

        def on_header(self, name: bytes, value: bytes) -> None:
            self._count(len(name) + len(value) + 4, 1)
            super().on_header(name, value)

        def send_400_response(self, msg: str) -> None:
            if not getattr(self, "_head_refused", ""):
                return super().send_400_response(msg)
            body = self._head_refused.encode("ascii")
            self.transport.write(b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: text/plain; charset=utf-8\r\n"
                                 b"content-length: " + str(len(body)).encode("ascii") + b"\r\nconnection: close\r\n\r\n" + body)
            self.transport.close()


def uvicorn_options(max_header_bytes: int) -> dict[str, Any]:
    """Keyword arguments for ``uvicorn.run`` / ``uvicorn.Config`` that cap the request head."""
    http: Any = "fleetscope.api.server:CappedHttpTools" if HttpToolsProtocol is not None else "h11"
    return {"http": http, "h11_max_incomplete_event_size": max_header_bytes}


# One answer in this many of a worker process asks its client to reconnect (``app._closing``): a reconnect on
# loopback costs ~0.1 ms, a hundredth of that a push.
REBALANCE_EVERY_REQUESTS = 100


def create_worker_app() -> Any:
    """``create_app`` in one of ``serve --workers N``'s processes, which ends with the supervisor that spawned it.
    A supervisor killed alone (SIGKILL of its pid, an OOM kill) otherwise leaves its workers serving on the socket
    they inherited, unsupervised, and a ``serve`` started again cannot bind it. uvicorn spawns and respawns its
    workers from its main thread, whose end is the process's."""
    die_with_parent()
    parent = multiprocessing.parent_process()
    if parent is not None and os.getppid() != parent.pid:
        raise SystemExit("the API's supervisor ended before this worker started")
    from fleetscope.api import create_app  # lazy: this module is imported by the CLI before the app is needed

    app = create_app()
    app.rebalance_every = REBALANCE_EVERY_REQUESTS
    return app

"""How `fleetscope serve` runs uvicorn: with a cap on the request head, enforced while it is read.

uvicorn's httptools protocol buffers every header a client sends, however many and however long;
its h11 protocol caps the head (``h11_max_incomplete_event_size``) but parses in Python, a large part of an
agent push's cost. ``CappedHttpTools`` keeps httptools and counts the request target and header bytes
as the parser hands them over: past the same ``h11_max_incomplete_event_size`` (set from
``FLEETSCOPE_MAX_HEADER_BYTES``) or ``gate.MAX_HEADERS`` fields the connection is answered 431
(RFC 6585 §5) and closed before anything more is buffered. The gate (``api.gate``) checks the same limit
again on the parsed head, for servers started otherwise.
"""

from __future__ import annotations

from typing import Any

from fleetscope.api.gate import MAX_HEADERS

try:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
except ImportError:  # uvicorn without httptools: h11 applies the cap itself
    HttpToolsProtocol = None


class _HeadTooLarge(Exception):
    pass


if HttpToolsProtocol is not None:

    class CappedHttpTools(HttpToolsProtocol):  # type: ignore[misc,valid-type]
        """httptools with the request head capped (module level: uvicorn's workers import it by name)."""

        def on_message_begin(self) -> None:
            self._head_bytes = 0
            self._head_fields = 0
            self._head_refused = ""
            super().on_message_begin()

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

"""Kineto traces of any size in bounded memory: the streamed decoder behind ``kineto.parse_chunks`` and a
chunked ``kineto.parse_many``.

A trace is one JSON object whose ``traceEvents`` array holds nearly all of its bytes. The streamed path
reads the object's top level itself, keeps the other (small) top-level values to decode at the end, and
cuts the array into pieces of about PIECE_BYTES at event boundaries. Each piece is decoded by the same
msgspec schema as a whole file and reduced at once (_Scan, compact), so the results are the same.

Finding a boundary without tokenizing every byte in Python: the last ``}`` that is followed by ``,{``
or ``]`` is a candidate end of an event, and decoding ``[`` + piece + ``]`` validates it, because a JSON
parser's state at a position depends only on the bytes before it: if the prefix closed by ``]`` is a
valid array, the array's real parser is between two elements at that point too. A candidate inside a
string or a nested object fails to decode; after two misses an exact (slower) scanner of strings and
brackets finds the boundary, so adversarial strings cost time, never a wrong cut.
"""

from __future__ import annotations

import hashlib
import re
import zlib
from collections.abc import Iterable
from typing import Any

import msgspec
from isal import isal_zlib

from fleetscope.core.errors import ParseError
from fleetscope.core.textinput import MAX_GZIP_MEMBERS
from ingest.kineto_decode import _AT_BYTE, _AT_PATH, _DECODER, _GZIP_MAGIC, _Event, _Reduced, _Scan

PIECE_BYTES = 16 * 2**20
_MAX_EVENT_BYTES = 32 * 2**20  # one event (or the bytes of one piece) larger than this is refused: real ones are KBs
_MAX_TOP_BYTES = 64 * 2**20  # the top-level values other than traceEvents, together
_OUT_BLOCK = 8 * 2**20  # most decompressed bytes produced per inflate call: bounds a gzip bomb's buffer
_EVENTS_DECODER = msgspec.json.Decoder(list[_Event])
_RAW_LIST = msgspec.json.Decoder(list[msgspec.Raw])
_AFTER_EVENT = re.compile(rb"[ \t\r\n]*(?:,[ \t\r\n]*\{|\])")
_WS = b" \t\r\n"
# a complete JSON string (escapes included), else a lone quote (a string the buffer cuts), else a bracket
_TOKEN = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"|"|[\[\]{},]')
_AT_ITEM = re.compile(r" - at `\$\[(\d+)\](.*)`$")


class _Inflow:
    """Decompressed bytes of a trace given as raw chunks (gzip detected by its magic); with ``hashed``, the
    sha256 of the raw bytes (the default job id) as well."""

    def __init__(self, chunks: Iterable[bytes], source: str, block: int, *, hashed: bool) -> None:
        self.it = iter(chunks)
        self.source = source
        self.block = block
        self.sha = hashlib.sha256() if hashed else None
        self.raw_bytes = 0  # raw bytes taken so far
        self.members = 1
        self.gz: bool | None = None
        self.pending = b""  # raw bytes not yet inflated (or, before detection, not yet returned)
        self.inflater: Any = None
        self.raw_done = False

    def _raw(self) -> bytes:
        for chunk in self.it:
            if chunk:
                chunk = bytes(chunk)
                if self.sha is not None:
                    self.sha.update(chunk)
                self.raw_bytes += len(chunk)
                return chunk
        self.raw_done = True
        return b""

    def read(self) -> bytes:
        """The next decompressed block; b"" at the end."""
        if self.gz is None:
            head = self.pending
            while len(head) < 2 and not self.raw_done:
                head += self._raw()
            self.gz = head[:2] == _GZIP_MAGIC
            self.pending = head
            if self.gz:
                self.inflater = isal_zlib.decompressobj(31)
        if not self.gz:
            out, self.pending = self.pending, b""
            return out or self._raw()
        try:
            while True:
                if not self.pending and not self.raw_done:
                    self.pending = self._raw()
                if self.inflater.eof:
                    rest = self.inflater.unused_data + self.pending
                    if not rest and self.raw_done:
                        return b""
                    if len(rest) < 2 and not self.raw_done:
                        self.pending = rest + self._raw()
                        continue
                    if rest[:2] != _GZIP_MAGIC:  # as igzip.decompress: only another member may follow
                        raise isal_zlib.error("data after the end of the gzip stream is not another member")
                    self.members += 1
                    if self.members > MAX_GZIP_MEMBERS:
                        raise isal_zlib.error(f"more than {MAX_GZIP_MEMBERS} gzip members")
                    self.inflater = isal_zlib.decompressobj(31)
                    self.pending = rest
                if not self.pending and self.raw_done:
                    raise EOFError("compressed stream ended before its end marker")
                out = self.inflater.decompress(self.pending, self.block)
                self.pending = self.inflater.unconsumed_tail
                if out:
                    return out
        except (EOFError, OSError, zlib.error, isal_zlib.error) as e:
            raise ParseError(f"corrupt or truncated gzip stream near byte {self.raw_bytes - len(self.pending)} of the file: {e}",
                             source=self.source) from None


class _Cursor:
    """A window on the decompressed text: ``buf[pos:]`` is unread; ``base`` and ``line0`` place ``buf[0]``."""

    def __init__(self, inflow: _Inflow, source: str) -> None:
        self.inflow = inflow
        self.source = source
        self.buf = b""
        self.pos = 0
        self.base = 0  # decompressed offset of buf[0]
        self.line0 = 1  # line of buf[0]
        self.eof = False

    def fill(self) -> bool:
        """Append the next block, dropping what is read; False at the end of input."""
        if self.eof:
            return False
        block = self.inflow.read()
        if not block:
            self.eof = True
            return False
        if self.pos:
            self.line0 += self.buf.count(b"\n", 0, self.pos)
            self.base += self.pos
            self.buf = self.buf[self.pos:] + block
            self.pos = 0
        else:
            self.buf = self.buf + block if self.buf else block
        return True

    def error(self, message: str, at: int | None = None, field: str | None = None) -> ParseError:
        at = self.pos if at is None else at
        gz = " of the decompressed stream" if self.inflow.gz else ""
        line = self.line0 + self.buf.count(b"\n", 0, at)
        return ParseError(f"{message} (byte {self.base + at}{gz})", source=self.source, line=line, field=field)

    def peek(self) -> int | None:
        """The next non-blank byte (consumed blanks only), None at the end of input."""
        while True:
            n = len(self.buf)
            p = self.pos
            while p < n and self.buf[p] in _WS:
                p += 1
            self.pos = p
            if p < n:
                return self.buf[p]
            if not self.fill():
                return None

    def expect(self, char: bytes, what: str) -> None:
        c = self.peek()
        if c != char[0]:
            got = "the end of input" if c is None else repr(chr(c))
            raise self.error(f"expected {what}, got {got}")
        self.pos += 1

    def value_end(self, limit: int, what: str) -> int:
        """End (exclusive) of the JSON value at ``pos``, reading more as needed. The value's syntax is
        checked later by the decoder; this only finds where it stops (strings and nesting respected)."""
        start = self.pos
        while True:
            depth = 0
            for m in _TOKEN.finditer(self.buf, self.pos):
                t = self.buf[m.start()]
                if t == 0x22:  # "
                    if m.end() - m.start() == 1:
                        break  # a string the buffer cuts: read more
                    if depth == 0:
                        return m.end()
                elif t in b"[{":
                    depth += 1
                elif t in b"]}":
                    if depth == 0:
                        return m.start()
                    depth -= 1
                    if depth == 0:
                        return m.end()
                elif depth == 0:  # a comma ends a scalar
                    return m.start()
            if len(self.buf) - start > limit:
                raise self.error(f"{what} is longer than {limit >> 20} MiB", at=start)
            self.pos = start  # fill() keeps buf[pos:]
            if not self.fill():
                if depth == 0 and len(self.buf) > self.pos:
                    return len(self.buf)  # a scalar at the very end: the missing '}' is reported after
                raise self.error(f"input ends inside {what}", at=len(self.buf))
            start = self.pos

    def string(self) -> tuple[bytes, str]:
        """(raw, decoded) JSON string at ``pos``."""
        if self.peek() != 0x22:
            c = self.peek()
            raise self.error(f"expected a key string, got {'the end of input' if c is None else repr(chr(c))}")
        end = self.value_end(_MAX_TOP_BYTES, "a key")
        raw = self.buf[self.pos:end]
        try:
            key = msgspec.json.decode(raw)
        except msgspec.DecodeError as e:
            raise self.error(f"not a valid JSON string: {e}") from None
        if not isinstance(key, str):
            raise self.error("expected a key string")
        self.pos = end
        return raw, key


def _event_end(buf: bytes, start: int) -> tuple[int | None, bool]:
    """Exact scan from an event's start: (end of the last complete event in ``buf``, or None; whether the
    array's closing ``]`` was reached)."""
    depth = 0
    last = None
    for m in _TOKEN.finditer(buf, start):
        t = buf[m.start()]
        if t == 0x22:
            if m.end() - m.start() == 1:
                break
        elif t in b"[{":
            depth += 1
        elif t in b"]}":
            depth -= 1
            if depth == 0:
                last = m.end()
            elif depth < 0:
                return last, True
    return last, False


def _events_closed(buf: bytes, start: int, stop: int) -> int:
    """How many whole events ``buf[start:stop]`` holds (an error path: a Python-speed scan)."""
    depth = n = 0
    for m in _TOKEN.finditer(buf, start, stop):
        t = buf[m.start()]
        if t in b"[{":
            depth += 1
        elif t in b"]}":
            depth -= 1
            n += depth == 0
    return n


class _EventReader:
    """Decodes ``traceEvents`` piece by piece from a cursor just past its ``[``, feeding a scan."""

    def __init__(self, cur: _Cursor, scan: _Scan, piece_bytes: int) -> None:
        self.cur = cur
        self.scan = scan
        self.piece = max(1, piece_bytes)
        self.index = 0  # traceEvents index of the next event

    def run(self) -> None:
        cur = self.cur
        first = True
        while True:
            while len(cur.buf) - cur.pos < self.piece and cur.fill():
                pass
            c = cur.peek()
            if c is None:
                raise cur.error("input ends inside traceEvents (truncated file?)", field=f"traceEvents[{self.index}]")
            if c == 0x5D:  # ]
                cur.pos += 1
                return
            if not first:
                if c != 0x2C:
                    raise cur.error(f"expected ',' or ']' after an event, got {chr(c)!r}", field=f"traceEvents[{self.index}]")
                cur.pos += 1
                c = cur.peek()
            if c != 0x7B:  # {
                got = "the end of input" if c is None else repr(chr(c))
                raise cur.error(f"expected an event object, got {got}", field=f"traceEvents[{self.index}]")
            first = False
            self._piece()

    def _piece(self) -> None:
        """Decode and feed the complete events at ``pos`` (at least one), reading more if none is complete."""
        cur = self.cur
        tried = 0  # bytes from the event's start at the last attempt that found no whole event
        while True:
            buf, start = cur.buf, cur.pos
            size = len(buf) - start
            # Look again only once the text has doubled (or ends): each look scans from the event's start,
            # so one huge event would otherwise cost time quadratic in its size, fill after fill.
            if size >= 2 * tried or cur.eof:
                k = buf.rfind(b"}", start)
                misses = 0
                while k > start and misses < 2:
                    if _AFTER_EVENT.match(buf, k + 1):
                        events = self._decode(start, k + 1, final=False)
                        if events is not None:
                            return self._feed(events, k + 1)
                        misses += 1
                    k = buf.rfind(b"}", start, k)
                end, _ = _event_end(buf, start)
                if end is not None and (misses or end < len(buf) or cur.eof):
                    return self._feed(self._decode(start, end, final=True), end)
                if cur.eof:
                    raise cur.error("input ends inside an event (truncated file?)", at=len(cur.buf), field=f"traceEvents[{self.index}]")
                tried = max(size, 1)
            if size > _MAX_EVENT_BYTES:
                raise cur.error(f"no end of event within {_MAX_EVENT_BYTES >> 20} MiB", at=start, field=f"traceEvents[{self.index}]")
            cur.fill()

    def _decode(self, start: int, end: int, *, final: bool) -> list[_Event] | None:
        """The events in ``buf[start:end]``; None (unless ``final``) if that is not a run of whole events."""
        cur = self.cur
        text = b"[" + cur.buf[start:end] + b"]"
        field = f"traceEvents[{self.index}]"
        try:
            return _EVENTS_DECODER.decode(text)
        except msgspec.ValidationError as e:
            # The typed decoder stops at the first ill-typed event: only a syntax check of the whole text
            # tells a bad event at a real boundary from a cut inside an event.
            try:
                _RAW_LIST.decode(text)
            except (msgspec.DecodeError, RecursionError) as syntax:
                if not final:
                    return None
                if isinstance(syntax, RecursionError):
                    raise cur.error("JSON nested too deeply", at=start, field=field) from None
                raise self._syntax(syntax, start, end) from None
            msg = str(e)
            m = _AT_ITEM.search(msg)
            if m is None:
                raise cur.error(msg, at=start, field=field) from None
            raise cur.error(msg[: m.start()], at=start, field=f"traceEvents[{self.index + int(m.group(1))}]{m.group(2)}") from None
        except RecursionError:
            if not final:
                return None
            raise cur.error("JSON nested too deeply", at=start, field=field) from None
        except msgspec.DecodeError as e:
            if not final:
                return None
            raise self._syntax(e, start, end) from None

    def _syntax(self, e: Exception, start: int, end: int) -> ParseError:
        m = _AT_BYTE.search(str(e))
        at = min(max(start + int(m.group(1)) - 1 if m else end, start), end)
        # the bytes before the error are valid JSON, so counting the events they close is exact
        n = _events_closed(self.cur.buf, start, at)
        return self.cur.error(f"not valid JSON: {_AT_BYTE.sub('', str(e)).strip()}", at=at, field=f"traceEvents[{self.index + n}]")

    def _feed(self, events: list[_Event], end: int) -> None:
        self.scan.feed(events, self.index)
        self.index += len(events)
        self.cur.pos = end


def _load_chunks(chunks: Iterable[bytes], source: str, piece_bytes: int, *, hashed: bool = False) -> tuple[_Reduced, str | None]:
    """Stream one trace: (its reduction, sha256 hex of the raw bytes if ``hashed``)."""
    inflow = _Inflow(chunks, source, min(_OUT_BLOCK, max(1, piece_bytes)), hashed=hashed)
    cur = _Cursor(inflow, source)
    scan = _Scan(source, compact=True)
    c = cur.peek()
    if c is None:
        raise ParseError("empty input", source=source)
    if c != 0x7B:
        raise cur.error("top level must be a JSON object")
    cur.pos += 1
    others: list[bytes] = []
    kept = 0
    seen_events = False
    if cur.peek() == 0x7D:
        cur.pos += 1
    else:
        while True:
            raw_key, key = cur.string()
            cur.expect(b":", "':' after a key")
            c = cur.peek()
            if key == "traceEvents":
                if seen_events:
                    raise cur.error("'traceEvents' given twice", field="traceEvents")
                seen_events = True
                if c == 0x5B:
                    cur.pos += 1
                    _EventReader(cur, scan, piece_bytes).run()
                else:
                    end = cur.value_end(_MAX_TOP_BYTES, "'traceEvents'")
                    try:
                        value = msgspec.json.decode(cur.buf[cur.pos:end])
                    except (msgspec.DecodeError, RecursionError):
                        value = ...
                    if value is not None:
                        what = "invalid JSON" if value is ... else type(value).__name__
                        raise cur.error(f"'traceEvents' must be an array, got {what}", field="traceEvents")
                    seen_events = False  # null: as if absent
                    cur.pos = end
            else:
                end = cur.value_end(_MAX_TOP_BYTES, f"top-level value {key!r}")
                raw = cur.buf[cur.pos:end]
                try:
                    msgspec.json.decode(raw)
                except (msgspec.DecodeError, RecursionError) as e:
                    raise cur.error(f"not valid JSON: {e}", field=key) from None
                kept += len(raw)
                if kept > _MAX_TOP_BYTES:
                    raise cur.error(f"top-level values other than traceEvents exceed {_MAX_TOP_BYTES >> 20} MiB", field=key)
                others.append(raw_key + b":" + raw)
                cur.pos = end
            c = cur.peek()
            if c == 0x2C:
                cur.pos += 1
                continue
            if c == 0x7D:
                cur.pos += 1
                break
            got = "the end of input" if c is None else repr(chr(c))
            raise cur.error(f"expected ',' or '}}' in the top-level object, got {got}")
    if cur.peek() is not None:
        raise cur.error("data after the top-level object")
    while inflow.read():  # drain: a gzip member's trailer and the hash cover the whole file
        pass
    if not seen_events:
        raise ParseError("no 'traceEvents' list: not a Chrome/Kineto trace", source=source, field="traceEvents")
    try:
        doc = _DECODER.decode(b"{" + b",".join(others) + b"}")
    except msgspec.ValidationError as e:
        msg = str(e)
        m = _AT_PATH.search(msg)
        raise ParseError(msg[: m.start()] if m else msg, source=source, field=m.group(1) if m else None) from None
    return scan.reduced(doc), inflow.sha.hexdigest() if inflow.sha is not None else None

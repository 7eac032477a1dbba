"""Protocol Buffers wire format, the few generic pieces parsers share: varints, tags, a field walk that
skips unknown fields (groups included) and names what is malformed with its byte offset.

Wire format: https://protobuf.dev/programming-guides/encoding/. Pure (no I/O), so ``ingest`` modules
may import it (``ingest.otlp``, ``ingest.remote_write``).
"""

from __future__ import annotations

from collections.abc import Iterator

MAX_DEPTH = 100  # upb's default recursion limit for nested messages


class WireError(Exception):
    """Malformed protobuf wire data: what, the byte offset in the body, and the field path."""

    def __init__(self, what: str, offset: int, where: str = ""):
        super().__init__(what)
        self.what, self.offset, self.where = what, offset, where

    def __str__(self) -> str:
        return f"{self.what} at byte {self.offset}" + (f" (in {self.where})" if self.where else "")


def uvarint(data: bytes, pos: int, end: int) -> tuple[int, int]:
    """(value, position after it) of the base-128 varint at ``pos``."""
    result = shift = 0
    start = pos
    while True:
        if pos >= end:
            raise WireError("truncated varint", start)
        b = data[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, pos
        shift += 7
        if shift >= 70:
            raise WireError("varint longer than 10 bytes", start)


def tag(data: bytes, pos: int, end: int) -> tuple[int, int, int, int]:
    """The field tag at ``pos``: (field number, wire type, offset of the tag, position after it)."""
    key, after = uvarint(data, pos, end)
    num, wt = key >> 3, key & 7
    if num == 0 or key > 0xFFFFFFFF:
        raise WireError(f"invalid field number {num}", pos)
    return num, wt, pos, after


def fields(data: bytes, pos: int, end: int, depth: int = 0) -> Iterator[tuple[int, int, int, int, int]]:
    """The fields of the message in ``data[pos:end]``: (number, wire type, offset of the tag, start,
    end) where start/end bound a LEN payload or a fixed value, and start is the value of a varint."""
    while pos < end:
        num, wt, at, pos = tag(data, pos, end)
        if wt == 0:
            value, pos = uvarint(data, pos, end)
            yield num, wt, at, value, pos
        elif wt == 2:
            n, pos = uvarint(data, pos, end)
            if n > end - pos:
                raise WireError(f"field {num} claims {n} bytes but only {end - pos} remain in its message", at)
            yield num, wt, at, pos, pos + n
            pos += n
        elif wt in (1, 5):
            size = 8 if wt == 1 else 4
            if end - pos < size:
                raise WireError(f"field {num} is a truncated {size * 8}-bit value", at)
            yield num, wt, at, pos, pos + size
            pos += size
        elif wt == 3:
            start = pos
            pos = skip_group(data, pos, end, num, depth + 1)
            yield num, wt, at, start, pos
        elif wt == 4:
            raise WireError(f"end-group tag of field {num} without its start", at)
        else:
            raise WireError(f"invalid wire type {wt} for field {num}", at)


def skip_group(data: bytes, pos: int, end: int, group: int, depth: int) -> int:
    """Position after the end-group tag that closes ``group`` (deprecated proto2 groups: unknown fields
    a decoder must still skip)."""
    if depth > MAX_DEPTH:
        raise WireError(f"groups nested deeper than {MAX_DEPTH}", pos)
    start = pos
    while pos < end:
        num, wt, at, pos = tag(data, pos, end)
        if wt == 4:
            if num != group:
                raise WireError(f"end-group tag of field {num} closes group {group}", at)
            return pos
        pos += value_size(data, pos, end, wt, num, at, depth)
    raise WireError(f"group {group} has no end-group tag", start)


def value_size(data: bytes, pos: int, end: int, wt: int, num: int, at: int, depth: int) -> int:
    """Bytes taken by the value of a field of wire type ``wt`` at ``pos`` (inside a group)."""
    if wt == 0:
        return uvarint(data, pos, end)[1] - pos
    if wt == 1 or wt == 5:
        if end - pos < (8 if wt == 1 else 4):
            raise WireError(f"field {num} is a truncated {32 if wt == 5 else 64}-bit value", at)
        return 8 if wt == 1 else 4
    if wt == 2:
        n, after = uvarint(data, pos, end)
        if n > end - after:
            raise WireError(f"field {num} claims {n} bytes but only {end - after} remain in its message", at)
        return after + n - pos
    if wt == 3:
        return skip_group(data, pos, end, num, depth + 1) - pos
    raise WireError(f"invalid wire type {wt} for field {num}", at)

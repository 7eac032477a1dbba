"""Hashes of small inputs computed without letting go of the GIL.

hashlib releases the GIL for an update of 2,048 bytes or more (CPython's ``HASHLIB_GIL_MINSIZE``). For a large
input that lets another thread run while it hashes; for an agent's 50 KB push hashed on the API's event loop it
costs more than the hash: the ingest door's writer takes the GIL, and the event loop waits for it to come back,
up to the interpreter's switch interval (5 ms) while the writer runs Python. Profiled on 2 cores under 16
agents' connections, the SHA-256 of a 50 KB body (29 us of work) held the event loop about 0.2 ms a push, and
the SHA-1 that finds a dcgm body's template took 13 % of the event loop's time. Fed in pieces just under that
size, a small input is hashed with the GIL held throughout (about 22 us a push, measured the same way).
"""

from __future__ import annotations

import hashlib
from typing import Any

_PIECE = 2047  # one byte under HASHLIB_GIL_MINSIZE
HELD_MAX_BYTES = 1 << 20  # larger inputs are hashed with the GIL released: long enough to pay for the wait


def fed(h: Any, *parts: bytes | memoryview) -> Any:
    """``h`` (a ``hashlib`` object) updated with ``parts`` (bytes, or C-contiguous buffers such as a numpy
    array's ``data``) in order, without releasing the GIL where they come to ``HELD_MAX_BYTES`` or less."""
    views = [memoryview(p).cast("B") for p in parts]
    if sum(v.nbytes for v in views) > HELD_MAX_BYTES:
        for v in views:
            h.update(v)
        return h
    for v in views:
        for i in range(0, v.nbytes, _PIECE):
            h.update(v[i:i + _PIECE])
    return h


def sha256(*parts: bytes | memoryview) -> Any:
    """A ``hashlib.sha256`` object over ``parts`` (``fed``)."""
    return fed(hashlib.sha256(), *parts)

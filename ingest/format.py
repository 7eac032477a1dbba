"""How an input format declares itself: one ``FormatSpec`` per format, at the end of its module in ``ingest/``.

A declaration says everything the service needs to know about a format, in one place: its name and
description, how to parse bytes into a ``Batch`` (adapting ``Options`` to the parser's signature), how to
recognise it by content (``Sniff``), and where a large file of it may be cut into pieces (``Splitting``).
``fleetscope.door.ingestion`` collects the declarations from the modules it lists in ``FORMAT_MODULES``;
``fleetscope.door.streaming`` reads the cutting rules from the same declarations.

Pure, like the parsers: no database, network or clock. A format without timestamps of its own says
``needs_ts`` and the service stamps it with the time the input was received when the caller gives none.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from fleetscope.core.frames import Batch


@dataclass(frozen=True)
class Options:
    """What a caller may tell a parser that the bytes do not say."""

    job_id: str | None = None
    ts: dt.datetime | None = None  # stamps formats without their own timestamps (scrapes, textfiles)
    op: str | None = None


class SniffView:
    """The decoded head of an input (the first bytes, inflated if gzip), as the sniffers look at it."""

    def __init__(self, text: str) -> None:
        self.text = text

    @cached_property
    def stripped(self) -> str:
        return self.text.lstrip()

    @property
    def is_json(self) -> bool:
        """The head starts (after blanks) like a JSON object."""
        return self.stripped.startswith("{")

    @cached_property
    def first_object(self) -> dict[str, Any] | None:
        """The first line parsed as JSON, when it is a whole JSON object (JSON Lines)."""
        line = self.stripped.split("\n", 1)[0].strip()
        try:
            obj = json.loads(line)
        except ValueError:
            return None
        return obj if isinstance(obj, dict) else None


@dataclass(frozen=True)
class Sniff:
    """One content test for a format. Detection runs every registered test in ``priority`` order (lower
    first). The first match ends detection with that format alone, unless the test ``combines``: formats
    that can share one file (an NCCL debug log interleaved with nccl-tests output) are all kept, in order,
    and once one of them matched only other combining tests are tried."""

    priority: int
    test: Callable[[SniffView], bool]
    combines: bool = False


def cut_line(buf: bytes) -> int:
    """After the last newline of ``buf``; 0 when it holds none yet."""
    return buf.rfind(b"\n") + 1


@dataclass(frozen=True)
class Splitting:
    """How a large file of a line-oriented format is cut into pieces parsed and written one at a time."""

    cut: Callable[[bytes], int]  # where a piece may end in a buffer (after a newline); 0: not yet
    header: bool = False  # repeat the file's first line before every later piece
    wide: bool = False  # rows of one instant may span pieces: hold and merge them
    context: Callable[[bytes], list[bytes]] | None = None  # lines every later piece needs in front
    # Largest piece, whatever chunk size is asked for: what its parse costs. The dcgm parser is columnar
    # (~3.5x its text); the JSON Lines and log parsers build Python objects per line (~13x for job events,
    # measured by benchmarks/ingest_memory.py).
    max_piece: int = 16 * 2**20


Parse = Callable[[bytes, str, Options], Batch]


@dataclass(frozen=True)
class FormatSpec:
    """One input format, declared by its module (``FORMATS = (FormatSpec(...), ...)`` at its end).

    ``parse(data, source, opts)`` reads the whole input; ``sniff`` is one ``Sniff`` or several (none: only
    ever named, never detected); ``gzip_aware`` when ``parse`` inflates gzip itself (otherwise the service
    inflates first, within its limit); ``streaming`` when large files may be cut into pieces.
    """

    name: str
    description: str
    parse: Parse
    sniff: Sniff | tuple[Sniff, ...] = ()
    gzip_aware: bool = False
    needs_ts: bool = False  # no timestamps of its own: stamped with opts.ts or the time received
    streaming: Splitting | None = None
    # Every line, the last included, ends with a line feed (Prometheus text): the parser refuses a cut
    # last line, and a file streamed in pieces is checked for it before its first piece is written.
    final_newline: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.sniff, Sniff):
            object.__setattr__(self, "sniff", (self.sniff,))

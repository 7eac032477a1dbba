"""What a store write takes and gives back: ``Rows`` (a frame as checked tuples), ``WriteResult``, the
ingest-log rows a group commit makes of its result (``LogRows``), and ``AlreadyLogged``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import polars as pl

from fleetscope.core import frames as F


@dataclass
class WriteResult:
    """What one write did: rows offered per frame, rows new or changed per frame, values carried."""

    offered: dict[str, int] = field(default_factory=dict)
    written: dict[str, int] = field(default_factory=dict)
    values: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"offered": self.offered, "written": self.written, "values": self.values}


@dataclass
class Rows:
    """A frame as Python tuples, built and checked by its writer: canonical types (timestamps as epoch
    microseconds), one row per natural key, no column null in every row. A small write spends more on the
    frame machinery's fixed costs (~0.1-0.2 ms an operation here) than on its rows; the ingest door hands
    the store its groups of agents' pushes this way (``Store.write_rows``)."""

    columns: tuple[str, ...]
    rows: list[tuple[Any, ...]]

    def frame(self, spec: F.FrameSpec) -> pl.DataFrame:
        schema_ = {c: (pl.Int64 if spec.schema[c] == F.UTC_US else spec.schema[c]) for c in self.columns}
        df = pl.DataFrame(self.rows, schema=schema_, orient="row")
        return df.with_columns([pl.col(c).cast(F.UTC_US) for c in self.columns if spec.schema[c] == F.UTC_US])


# What an ingest-log row holds: source, content hash, rows written per frame, values.
LogRows = Callable[[WriteResult], list[tuple[str, str | None, dict[str, int], int]]]


class AlreadyLogged(Exception):
    """A write given ``unless_logged`` content hashes found some in the ingest log: nothing was written.
    ``shas`` are those found; the caller writes the rest again without them."""

    def __init__(self, shas: set[str]):
        super().__init__(f"{len(shas)} input(s) already in the ingest log")
        self.shas = shas

"""The label blocks of dcgm-exporter's sample lines, as ``ingest.dcgm_lines`` reads them: which GPU a block
names, its inventory and pod, and the series key of a field on it. Each distinct block is read once per
process (``block_of``): a node sends the same eight every interval."""

from __future__ import annotations

import re
from typing import Any

from fleetscope.core.dcgm_fields import EXPORTER_POD_MARK
from fleetscope.core.frames import series_key
from ingest.dcgm_blocks import _KNOWN_LABELS, _LABELS
from ingest.dcgm_lex import MAX_LABELS_CHARS

__all__ = ["Shape", "block_by_shape", "block_of", "host_of", "inventory_row", "plain", "series_of", "shape_of", "workload_of"]

_PAIR = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="([^"]*)"')
# ``promtext.BLOCK_OK`` for a block without a backslash (``plain`` checks that first), where a value is any run
# of characters but the quote and the line feed (written escaped): the same blocks, a fifth of the time (each
# value's characters are matched by a class, not by BLOCK_OK's escape alternation), and nothing after the last
# label, a newline included.
_LABEL_PLAIN = r'[a-zA-Z_][a-zA-Z0-9_]*="[^"\n]*"'
_BLOCK = re.compile(rf"(?:{_LABEL_PLAIN}(?:,{_LABEL_PLAIN})*,?)?\Z")
_INTEGER = re.compile(r"-?[0-9]{1,18}")
_OUT_INDEX = {out: i for i, (out, _) in enumerate(_LABELS)}
# label name -> (its output's index, its rank among that output's names: the first present wins)
_PICK = {name: (i, r) for i, (_, names) in enumerate(_LABELS) for r, name in enumerate(names)}
# Label blocks already read, across bodies. Bounded (a 100,000-GPU fleet's blocks fit); cleared whole when
# full rather than tracked by age.
_BLOCKS: dict[str, tuple[str, tuple[str | None, ...], str]] = {}
_MAX_BLOCKS = 200_000


def block_of(block: str) -> tuple[str, tuple[str | None, ...], str] | None:
    """``_block`` of ``block``, read once per process."""
    parsed = _BLOCKS.get(block)
    if parsed is None:
        parsed = _block(block)
        if parsed is not None:
            _remember(block, parsed)
    return parsed


def _remember(block: str, parsed: tuple[str, tuple[str | None, ...], str]) -> None:
    if len(_BLOCKS) >= _MAX_BLOCKS:
        _BLOCKS.clear()
    _BLOCKS[block] = parsed


class Shape:
    """The label names of a block, in order: a block of the same names is read by a split at its separators
    instead of label by label (``_block``). A node's eight GPUs print blocks that differ only in their values,
    so a new node's blocks are read by the shapes of known nodes' (``ingest.dcgm_lines``' new-node path).

    It reads exactly what ``_block`` reads. A block of this shape is its labels ``name="value"`` joined by
    commas (and the shape's trailing comma, or none), each name the shape's, each value free of quotes, line
    feeds, braces and backslashes (anything else is ``plain``'s to refuse, and ``_block`` decides). With twice
    as many quotes as labels, each label having its ``="``, a value holds none, so each ``",`` is a separator and
    each name ends at its ``="``. Which label of several naming one output wins depends on the names alone, so it
    is settled here. Nothing is compiled: a shape costs what its names do, whatever a hostile block holds."""

    __slots__ = ("_heads", "_end", "_quotes", "_winners", "_other")

    def __init__(self, names: list[str], trailing_comma: bool):
        self._heads = [name + '="' for name in names]
        self._end = '",' if trailing_comma else '"'
        self._quotes = 2 * len(names)
        best: dict[int, tuple[int, int]] = {}  # output index -> (rank, the label's place)
        for place, name in enumerate(names):
            at = _PICK.get(name)
            if at is not None and at[1] < best.get(at[0], (len(_LABELS), 0))[0]:
                best[at[0]] = (at[1], place)
        self._winners = tuple((out, place) for out, (_, place) in best.items())
        self._other = not _KNOWN_LABELS.issuperset(names)  # ``_block``'s rule for keeping the block as ``extra``

    def read(self, block: str) -> tuple[str, tuple[str | None, ...], str] | None:
        """``_block`` of ``block`` where it has this shape, else None (``_block`` then reads it)."""
        if (len(block) > MAX_LABELS_CHARS or not block.endswith(self._end) or block.count('"') != self._quotes
                or "\n" in block or "{" in block or "}" in block or "\\" in block):
            return None
        parts = [part.partition('="') for part in block[: -len(self._end)].split('",')]
        if [name + sep for name, sep, _ in parts] != self._heads:
            return None  # another name, or a label without its ="
        picked: list[str | None] = [None] * len(_LABELS)
        for out, place in self._winners:
            picked[out] = parts[place][2]
        return _checked(tuple(picked), block if self._other else "")


def shape_of(block: str) -> Shape | None:
    """The shape of a block ``_block`` reads, or None."""
    if _block(block) is None:
        return None
    names = [name for name, _ in _PAIR.findall(block)]
    return Shape(names, block.endswith(","))


def block_by_shape(block: str, shapes: list[Shape]) -> tuple[str, tuple[str | None, ...], str] | None:
    """``block_of`` where ``block`` was read before or fits one of ``shapes`` (it is then kept as read), else None."""
    parsed = _BLOCKS.get(block)
    if parsed is None:
        for shape in shapes:
            parsed = shape.read(block)
            if parsed is not None:
                _remember(block, parsed)
                break
    return parsed


def plain(block: str) -> bool:
    """A label block this reader vouches for: well formed, no escapes, no braces in values, within the columnar
    parser's length limit (over it, that parser refuses the line, and so it must read it)."""
    return (len(block) <= MAX_LABELS_CHARS and "{" not in block and "}" not in block and "\\" not in block
            and _BLOCK.match(block) is not None)


def _block(block: str) -> tuple[str, tuple[str | None, ...], str] | None:
    """(GPU key, wanted labels, the block where it has non-standard labels) of a label block; None where
    the block is not plain (bad syntax, a repeated label, no UUID, a non-numeric index)."""
    if not plain(block):
        return None  # the columnar parser decides (a value over its limit is refused there, by line)
    pairs = _PAIR.findall(block)
    picked: list[str | None] = [None] * len(_LABELS)
    rank = [len(_LABELS)] * len(_LABELS)
    other = False
    for name, value in pairs:
        at = _PICK.get(name)
        if at is None:
            other = True
        elif at[1] < rank[at[0]]:
            picked[at[0]], rank[at[0]] = value, at[1]
    names = [name for name, _ in pairs]
    if len(set(names)) != len(pairs):
        return None
    return _checked(tuple(picked), block if other and not _KNOWN_LABELS.issuperset(names) else "")


def _checked(wanted: tuple[str | None, ...], extra: str) -> tuple[str, tuple[str | None, ...], str] | None:
    """(GPU key, ``wanted``, ``extra``) of a block's wanted labels; None without a UUID or with a non-numeric index."""
    uuid = wanted[_OUT_INDEX["uuid"]]
    if not uuid:
        return None
    for out in ("gpu", "gpu_i_id"):
        v = wanted[_OUT_INDEX[out]]
        if v is not None and v != "" and not _INTEGER.fullmatch(v):
            return None
    mig = wanted[_OUT_INDEX["gpu_i_id"]]
    key = f"{uuid}/mig{mig}" if mig else uuid
    return key, wanted, extra


def series_of(key: str, extra: str, name: str) -> str:
    """The metric_sample series key of DCGM field ``name`` on GPU ``key`` whose block has the non-standard
    labels of ``extra`` (or none: "")."""
    if extra:
        labels = {n: v for n, v in _PAIR.findall(extra) if n not in _KNOWN_LABELS}
        return series_key(name, {**labels, "gpu_uuid": key})
    return name + '{gpu_uuid="' + key.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"') + '"}'


def _int_or_none(v: str | None) -> int | None:
    return int(v) if v else None


def inventory_row(key: str, labels: tuple[str | None, ...]) -> tuple[Any, ...]:
    """A GPU's inventory from its label block, in the order of ``dcgm_lines``' inventory schema (``err_msg`` last)."""
    L = _OUT_INDEX
    return (key, labels[L["host"]], _int_or_none(labels[L["gpu"]]), labels[L["pci_bus_id"]], labels[L["model"]],
            labels[L["gpu_i_profile"]], _int_or_none(labels[L["gpu_i_id"]]), labels[L["driver"]], labels[L["err_msg"]])


def host_of(labels: tuple[str | None, ...]) -> str | None:
    """The host a GPU's label block names (``Hostname``), or None."""
    return labels[_OUT_INDEX["host"]]


def workload_of(labels: tuple[str | None, ...]) -> tuple[str | None, str, str | None] | None:
    """(namespace, pod, container) of the pod a label block attributes its GPU to; None without a pod, or
    where the pod is dcgm-exporter's own (the columnar parser's ``_workload`` rule)."""
    L = _OUT_INDEX
    pod, container = labels[L["pod"]], labels[L["container"]]
    if not pod or EXPORTER_POD_MARK in pod or EXPORTER_POD_MARK in (container or ""):
        return None
    return labels[L["namespace"]], pod, container

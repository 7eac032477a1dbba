"""The dcgm-exporter body's lexer: Prometheus text to long rows (name, label block id, value, timestamp) in
polars, a piece of at most ``_PIECE_BYTES`` at a time; bodies polars cannot split cleanly (CRLF, escapes,
comments between samples) take the line path through ``fleetscope.core.promtext.lex_line``. The grammar is
the Prometheus text exposition format 0.0.4; ``ingest.dcgm`` turns the rows into frames.
"""

from __future__ import annotations

import io
from collections.abc import Iterator

import polars as pl

from fleetscope.core.promtext import BLOCK_OK as _BLOCK_OK
from fleetscope.core.promtext import NAME_OK as _NAME_OK
from fleetscope.core.promtext import NAME_PY as _NAME_PY
from fleetscope.core.promtext import escape as _escape
from fleetscope.core.promtext import lex_line
from fleetscope.core.errors import ParseError

MAX_LABELS_CHARS = 16384
"""Longest label set (``{...}``) of one sample read. dcgm-exporter's, with Kubernetes pod labels, is a few
hundred characters; one of many kilobytes is an attack on every table and index its GPU UUID, host or
series key would become a key of."""

_READ_SCHEMA = {"head": pl.String, "tail": pl.String, "extra": pl.String}
_PIECE_BYTES = 256 << 20  # read at most this much text at once (bounds peak memory on huge bodies)
_SLICE_ROWS = 262_144  # rows lexed at once (bounds the temporaries of the line path)


class _NeedLines(Exception):
    """The record-based fast path met something it does not vouch for: redo it line by line."""


_RECORD_SCHEMA = {"pre": pl.String, "labels": pl.String, "extra": pl.String}


def _lex_records(data: bytes) -> tuple[pl.DataFrame, pl.DataFrame, list[_Run] | None] | None:
    """Fast path for well-formed bodies: '}' ends a record and '{' separates its fields.

    A body ``A{a} 1\nB{b} 2\n`` read with record terminator ``}`` and field separator ``{`` gives records
    ``[A, a]``, ``[" 1\nB", b]``, ``[" 2\n", null]``: the label block of every sample is a column
    straight out of the (multi-threaded) reader, with no per-line string split; the value of record i is
    the first line of record i + 1 and its name is the last line of record i. Comment lines sit between
    a value and the next name. Anything else (labels without braces, braces inside comments or label
    values, timestamps, tabs, CRLF, a missing final newline, bad UTF-8) breaks one of the checks below,
    and the caller falls back to the exact line-by-line path. Returns None in that case.
    """
    if not data.endswith(b"\n"):
        return None
    try:
        raw = pl.read_csv(
            io.BytesIO(data),
            has_header=False,
            separator="{",
            eol_char="}",
            quote_char=None,
            schema=_RECORD_SCHEMA,
            missing_columns="insert",
            truncate_ragged_lines=True,
            encoding="utf8",
            raise_if_empty=False,
        )
    except pl.exceptions.PolarsError:
        return None
    n = raw.height - 1
    if n < 1:
        return None
    last = raw.row(n, named=True)
    if last["labels"] is not None or last["extra"] is not None:
        return None
    pre = raw["pre"]
    # Where the value line of each record ends (null: no line feed), a byte offset: the value line is ASCII
    # whenever its number parses, and only then is the record accepted, so it is the character offset too.
    # One search and two slices cost a third of splitting into a struct (0.06 s for a 16,384-GPU scrape).
    cut = pre.str.find("\n", literal=True).cast(pl.Int64)
    rest = pre.str.slice(cut + 1)
    # The value of record i is the first line of record i + 1: parse, then shift the numbers.
    value = pre.str.slice(1, (cut - 1).clip(lower_bound=0)).cast(pl.Float64, strict=False).shift(-1).head(n)
    blank_first = pre.str.starts_with(" ").shift(-1).head(n)
    ok = (
        raw["extra"].is_null().all()
        and raw["labels"].head(n).null_count() == 0
        and rest.slice(1, n - 1).null_count() == 0
        and bool(blank_first.all())
        and value.null_count() == 0
    )
    if not ok:
        return None
    # After the last value only comment lines may follow.
    if not _only_comments(last["pre"].split("\n", 1)[1] if "\n" in last["pre"] else ""):
        return None
    # Name text of record i: what follows its value line (record 0: all of "pre"). It only changes at
    # family boundaries, where comment lines (HELP, TYPE) precede the name: number the runs of equal
    # text, then read and clean the text once per run, never per row.
    run = pl.concat([pl.Series([0], dtype=pl.UInt32), rest.slice(1, n - 1).rle_id() + 1])
    firsts = (run != run.shift(1, fill_value=-1)).arg_true()
    texts = [raw["pre"][0], *rest.gather(firsts.slice(1)).to_list()]
    families: dict[str, int] = {}
    family_of_run = []
    for text in texts:
        *between, metric = text.split("\n")
        if not _only_comments("\n".join(between)) or not _NAME_PY.fullmatch(metric):
            return None
        family_of_run.append(families.setdefault(metric, len(families)))
    family = pl.Series(family_of_run, dtype=pl.UInt32).gather(run)
    name = pl.Series(list(families), dtype=pl.String).cast(pl.Categorical).gather(family)
    long = pl.DataFrame(
        {
            "line": pl.int_range(0, n, dtype=pl.UInt32, eager=True),
            "name": name,
            "labels": raw["labels"].head(n),
            "value": value,
            "ts_ms": pl.repeat(None, n, dtype=pl.Int64, eager=True),
        }
    )
    long, blocks, runs = _block_ids(long, family, list(families))
    if not blocks["text"].str.contains(_BLOCK_OK).all() or blocks["text"].str.len_chars().max() > MAX_LABELS_CHARS:
        return None  # the exact lexer names the line
    return long, blocks, runs


# One family as printed: (metric name, first row, rows, labels identical to the reference family's).
_Run = tuple[str, int, int, bool]


def _block_ids(
    long: pl.DataFrame, family: pl.Series, family_names: list[str]
) -> tuple[pl.DataFrame, pl.DataFrame, list[_Run] | None]:
    """Number the distinct label blocks: ``long`` gets ``bid``; a (bid, text) table and the runs come back.

    dcgm-exporter prints every family over the same devices in the same order, so a family whose
    label column equals the reference family's, position by position (one vectorised string compare),
    needs no hashing at all: its bids are 0..L-1. Families that differ (a field missing on some GPUs,
    extra labels on XID lines) are matched by text against the reference and any new blocks numbered
    after it. If the reference family repeats a block, blocks are hashed the ordinary way.
    """
    lab = long["labels"]
    runs = family.rle()
    lens = runs.struct.field("len").to_list()
    metrics = [family_names[i] for i in runs.struct.field("value").to_list()]
    starts = [0]
    for n in lens[:-1]:
        starts.append(starts[-1] + n)
    size = max(lens)
    ref_start = starts[lens.index(size)]
    ref = lab.slice(ref_start, size)
    if ref.n_unique() != size:
        cat = lab.cast(pl.Categorical)
        uniq = cat.unique()
        blocks = pl.DataFrame({"bid": uniq.to_physical(), "text": uniq.cast(pl.String)})
        return long.with_columns(bid=cat.to_physical()).drop("labels"), blocks, None
    positional = pl.int_range(0, size, dtype=pl.UInt32, eager=True)
    parts: list[pl.Series | None] = []
    other: list[pl.Series] = []
    for start, n in zip(starts, lens):
        if n == size and (start == ref_start or bool((lab.slice(start, size) == ref).all())):
            parts.append(positional)
        else:
            parts.append(None)
            other.append(lab.slice(start, n))
    blocks = pl.DataFrame({"bid": positional, "text": ref})
    if other:
        rows = pl.DataFrame({"text": pl.concat(other)}).join(blocks, on="text", how="left", maintain_order="left")
        new = rows.filter(pl.col("bid").is_null()).select(pl.col("text").unique(maintain_order=True))
        new = new.with_columns(bid=pl.int_range(size, size + new.height, dtype=pl.UInt32))
        blocks = pl.concat([blocks, new.select("bid", "text")])
        rows = rows.join(new, on="text", how="left", maintain_order="left", suffix="_new")
        found = rows.select(pl.coalesce("bid", "bid_new"))["bid"]
        it, k = iter(range(len(parts))), 0
        for i in it:
            if parts[i] is None:
                n = lens[i]
                parts[i] = found.slice(k, n)
                k += n
    same = [p is positional for p in parts]
    bid = pl.concat(parts)
    return long.with_columns(bid=bid).drop("labels"), blocks, list(zip(metrics, starts, lens, same))


def _only_comments(text: str) -> bool:
    return all(not ln.strip() or ln.lstrip().startswith("#") for ln in text.split("\n"))


def _piece_bounds(data: bytes) -> Iterator[tuple[int, int]]:
    """Byte ranges of at most _PIECE_BYTES, cut after a newline (one range, usually)."""
    start, n = 0, len(data)
    while start < n:
        end = min(start + _PIECE_BYTES, n)
        if end < n:
            nl = data.rfind(b"\n", start, end)
            end = n if nl < 0 else nl + 1
        yield start, end
        start = end


def _read(piece: bytes) -> pl.DataFrame | None:
    """One row per physical line (blank lines included, so row index = line number - 1), cut at '}'."""
    try:
        return pl.read_csv(
            piece,
            has_header=False,
            separator="}",
            quote_char=None,
            schema=_READ_SCHEMA,
            missing_columns="insert",
            truncate_ragged_lines=True,
            encoding="utf8",
            raise_if_empty=False,
        )
    except pl.exceptions.PolarsError:
        return None  # not UTF-8 text: the exact lexer finds and names the line


def _lex(data: bytes, source: str, meta: dict) -> pl.DataFrame:
    """Long frame (line, name, labels, value, ts_ms) of every sample line, in body order."""
    clean: list[pl.DataFrame] = []
    bad: list[int] = []
    first_line = 1
    pieces = list(_piece_bounds(data))
    for start, end in pieces:
        piece = data if len(pieces) == 1 else data[start:end]
        raw = _read(piece)
        if raw is None:
            rows, n_lines = _lex_slow(piece, first_line, source)
            clean.append(rows)
            first_line += n_lines
            continue
        for offset in range(0, raw.height, _SLICE_ROWS):
            rows, bad_lines = _lex_rows(raw.slice(offset, _SLICE_ROWS), first_line + offset)
            clean.append(rows)
            bad.extend(bad_lines)
        first_line += raw.height
    last_line = first_line - 1
    meta["lines"] = last_line
    long = pl.concat(clean) if clean else _rows_frame([])
    if long.height:
        blocks = long["labels"].cast(pl.String)
        over = blocks.str.len_chars() > MAX_LABELS_CHARS
        if over.any():
            i = int(over.arg_true()[0])
            raise ParseError(f"the labels of {long['name'][i]} are {len(blocks[i])} characters long, over the limit of {MAX_LABELS_CHARS}",
                             source=source, line=int(long["line"][i]), field="labels")
    # Names and label blocks repeat: check each distinct one against the grammar once.
    names = long.select(pl.col("name").unique())["name"]
    bad_names = names.filter(~names.cast(pl.String).str.contains(_NAME_OK))
    blocks = long.select(pl.col("labels").unique())["labels"]
    bad_blocks = blocks.filter(~blocks.cast(pl.String).str.contains(_BLOCK_OK))
    if bad_names.len() or bad_blocks.len():
        is_bad = pl.col("name").is_in(bad_names.implode()) | pl.col("labels").is_in(bad_blocks.implode())
        bad.extend(long.filter(is_bad)["line"].to_list())
        long = long.filter(~is_bad)
    if bad:
        fixed = _relex(data, sorted(bad), source)
        long = pl.concat([long, fixed]).sort("line")
    return long


def _lex_rows(raw: pl.DataFrame, first_line: int) -> tuple[pl.DataFrame, list[int]]:
    """Vectorised lexing of well-formed lines; returns them and the numbers of lines it cannot vouch for."""
    head, tail = raw["head"], raw["tail"]
    parts = head.str.splitn("{", 2)
    v = tail.str.slice(1)
    df = pl.DataFrame(
        {
            "line": pl.int_range(first_line, first_line + raw.height, dtype=pl.UInt32, eager=True),
            "name": parts.struct.field("field_0"),
            "labels": parts.struct.field("field_1"),
            "value": v.cast(pl.Float64, strict=False),
            "_v": v,
            # One '}' exactly, then a single blank before the value (text format 0.0.4).
            "_ok": tail.str.starts_with(" ") & raw["extra"].is_null(),
            # Comment lines (HELP, TYPE, others) start with '#'; blank lines are all-null rows.
            "_skip": head.str.starts_with("#").fill_null(tail.is_null() & raw["extra"].is_null()),
        }
    ).filter(~pl.col("_skip"))
    if df.select((pl.col("value").is_null() & pl.col("_v").str.contains(" ", literal=True)).any()).item():
        # Samples with a timestamp: "value ts" (integer milliseconds).
        ts_parts = pl.col("_v").str.splitn(" ", 2)
        df = df.with_columns(
            value=pl.when(pl.col("value").is_null())
            .then(ts_parts.struct.field("field_0").cast(pl.Float64, strict=False))
            .otherwise(pl.col("value")),
            ts_ms=ts_parts.struct.field("field_1").cast(pl.Int64, strict=False),
        ).with_columns(
            _ok=pl.col("_ok") & (pl.col("ts_ms").is_not_null() | ~pl.col("_v").str.contains(" ", literal=True))
        )
    else:
        df = df.with_columns(ts_ms=pl.lit(None, pl.Int64))
    ok = pl.col("_ok").fill_null(False) & pl.col("labels").is_not_null() & pl.col("value").is_not_null()
    df = df.with_columns(_ok=ok)
    bad_lines = df.filter(~pl.col("_ok"))["line"].to_list()
    clean = df.filter("_ok").select(
        "line", pl.col("name").cast(pl.Categorical), pl.col("labels").cast(pl.Categorical), "value", "ts_ms"
    )
    return clean, bad_lines


def _relex(data: bytes, line_nos: list[int], source: str) -> pl.DataFrame:
    """Exact lexing of the given lines, found by walking the body (never a list of all its lines)."""
    wanted, last_wanted = set(line_nos), max(line_nos)
    rows = []
    for n, raw in enumerate(io.BytesIO(data), start=1):
        if n in wanted:
            row = _lex_line_checked(raw.rstrip(b"\n"), n, source)
            if row is not None:
                rows.append(row)
        if n >= last_wanted:
            break
    return _rows_frame(rows)


def _lex_slow(piece: bytes, first_line: int, source: str) -> tuple[pl.DataFrame, int]:
    """Exact lexing of every line of a piece the reader refused (invalid UTF-8): finds the bad line."""
    rows = []
    n_lines = 0
    for i, raw in enumerate(io.BytesIO(piece)):
        n_lines += 1
        row = _lex_line_checked(raw.rstrip(b"\n"), first_line + i, source)
        if row is not None:
            rows.append(row)
    return _rows_frame(rows), n_lines


def _rows_frame(rows: list[tuple]) -> pl.DataFrame:
    return pl.DataFrame(
        rows,
        schema={"line": pl.UInt32, "name": pl.String, "labels": pl.String, "value": pl.Float64, "ts_ms": pl.Int64},
        orient="row",
    ).with_columns(pl.col("name").cast(pl.Categorical), pl.col("labels").cast(pl.Categorical))


def _lex_line_checked(raw: bytes, n: int, source: str) -> tuple | None:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ParseError(f"not UTF-8 text (byte {e.start})", source=source, line=n, field="line") from None
    row = lex_line(text, n, source)
    if row is None:
        return None
    n, name, labels, value, ts_ms = row
    block = ",".join(f'{k}="{_escape(v)}"' for k, v in labels)
    if len(block) > MAX_LABELS_CHARS:
        raise ParseError(f"the labels of {name} are {len(block)} characters long, over the limit of {MAX_LABELS_CHARS}",
                         source=source, line=n, field="labels")
    return (n, name, block, value, ts_ms)

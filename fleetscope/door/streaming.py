"""Ingest a file of any size in bounded memory: line-oriented formats are read, parsed and written in chunks.

A file up to the chunk size, or in a format that is one document (Kineto traces, nvidia-smi XML,
nccl-tests tables, OTLP/JSON), goes through ``ingestion.ingest_bytes``: one parse, one transaction, all or
nothing. A Kineto trace over the chunk size (gzip: over a sixteenth of it) is still one transaction, but
is decoded piece by piece (``ingest.kineto.parse_chunks``: 16 MiB of events at a time, reduced at once to
the columns the step and collective frames need), so its memory does not grow with its JSON. A larger file in a line-oriented format is cut into pieces of about the chunk size at record
boundaries safe for its format, and each piece is parsed and written as its own transaction. The chunk
size is ``chunk_bytes`` (``--chunk-mb``) capped per format by what a piece's parse costs in memory: 32 MiB
of dcgm-exporter text, 16 MiB of the others (JSON Lines and logs become Python objects per line):

- ``dcgm`` (dcgm-exporter text): cut at a line, preferably before a ``# HELP`` line (a new metric family,
  which keeps the parser on its fast path). The rows of one instant can span a cut (a scrape lists every
  family over all GPUs), so rows are held until no later piece can add to them: the GPU rows of an instant
  are complete once a piece goes by that holds no sample of that instant. A scrape's samples must
  therefore be contiguous, which is how exporters and ``curl >>`` logs write them. Rows split by a cut are
  merged column by column, the first copy of a value winning, as in a whole-file parse. A file without
  sample timestamps is one instant (the ``--ts``), so its rows are written at the end, in one transaction
  that holds one row per GPU.
- ``nvidia_smi_csv``: cut at a line; the header line is repeated in front of every piece.
- ``nccl_inspector`` (JSON Lines): cut only before a line that carries its own ``header`` (a v4.3 dump
  marker or a self-contained v4.0-v4.2 line), never inside a v4.3 dump whose records inherit the marker.
- ``job_events``: cut at a line (every line is one event; ``job`` rows merge in the store).
- ``nccl_log``: cut at a line; each piece is preceded by the communicator ``Init COMPLETE`` lines seen so
  far (and the ``NCCL version`` line), so that collective calls resolve their rank and communicator.

Failure semantics of a streamed file: pieces are written in order; a piece that fails to parse or validate
stops the file there, with an error naming the chunk, its byte range and the file's line. Chunks before it
stay written. Every write is logged under a content hash that chains all bytes read so far (and the
options), so re-running the same file skips every chunk already written and writes nothing new; after the
bad line is fixed, a re-run skips the chunks before it and continues from there. The natural keys of the
canonical frames make any overlap a no-op as well.

Memory: about two pieces of text, one piece's parse (~3.5x its text for dcgm) and, for dcgm, the held rows
of the current instant. Gzip-compressed files stream through the decompressor; progress is reported in
bytes of the file as stored.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import gzip
import hashlib
import importlib
import json
import os
import re
import zlib
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import IO, Any

import polars as pl

from fleetscope.core import frames as F
from fleetscope.core.errors import FleetscopeError, ParseError, ValidationError
from fleetscope import door, safefiles
from fleetscope.door import screen
from fleetscope.door.ingestion import FORMATS, GZIP_MAGIC, SNIFF_BYTES, LiveView, Options, Outcome, _notes, ingest_bytes, resolve
from fleetscope.store import Store, WriteResult
from fleetscope.core.textinput import require_final_newline
from ingest.format import Splitting

CHUNK_BYTES = 64 * 2**20
# Kineto traces: a file over the chunk size (or a gzip file over 1/16 of it, as profiler JSON compresses
# 10-20x, or whose trailer says it holds more than the chunk size) is decoded in pieces of at most this much
# JSON (ingest.kineto.parse_chunks).
KINETO_PIECE_BYTES = 16 * 2**20
KINETO_GZIP_RATIO = 16
KINETO_READ_BYTES = 4 * 2**20
# How much of a file's end is read to find its last line feed before streaming it.
TAIL_CHECK_BYTES = 64 * 2**10


# The cutting rules live with their formats (ingest.format.FormatSpec.streaming); the old name stays.
_Splitting = Splitting

# name -> Splitting, for every registered format that declares one: the formats a large file is streamed in.
STREAMED: Mapping[str, Splitting] = LiveView(lambda reg: {n: f.spec.streaming for n, f in reg.formats.items()
                                                          if f.spec is not None and f.spec.streaming is not None})


class _Reader:
    """A file, decompressed if gzip, read in pieces; ``pos`` is the offset in the file as stored."""

    def __init__(self, path: Path) -> None:
        self.raw: IO[bytes] = safefiles.open_regular(path)
        self.gz = self.raw.read(2) == GZIP_MAGIC
        self.raw.seek(0)
        self.f: IO[bytes] = gzip.GzipFile(fileobj=self.raw) if self.gz else self.raw

    @property
    def pos(self) -> int:
        return self.raw.tell()

    def read(self, n: int) -> bytes:
        try:
            return self.f.read(n)
        except (OSError, EOFError, zlib.error) as exc:
            raise ParseError(f"truncated or corrupt gzip near byte {self.pos}: {exc}") from None

    def close(self) -> None:
        self.f.close()
        self.raw.close()


def _pieces(reader: _Reader, cut: Callable[[bytes], int], size: int) -> Iterator[bytes]:
    """Pieces of about ``size`` bytes ending where ``cut`` allows; a record longer than that grows its piece."""
    buf = b""
    while True:
        data = reader.read(size)
        if not data:
            break
        buf = buf + data if buf else data
        if len(buf) < size:
            continue
        end = cut(buf)
        if end:
            yield buf[:end]
            buf = buf[end:]
    if buf:
        yield buf


def ingest_file(store: Store, path: Path, *, source: str | None = None, fmt: str = "auto", opts: Options = Options(),
                chunk_bytes: int = CHUNK_BYTES, progress: Callable[[int], None] | None = None,
                follow_symlinks: bool = False) -> Outcome:
    """Ingest one file: whole (small files, document formats) or streamed in chunks (see the module doc).

    ``progress`` is called with the number of bytes of the file consumed since its last call. Returns the
    Outcome; a streamed file that fails part-way has ``error`` set and ``result`` counting what was
    written before the failing chunk. A small file that fails raises, as ``ingest_bytes`` does.
    A symbolic link is refused unless ``follow_symlinks``, and anything but a regular file always is
    (``safefiles.NotRegularFileError``), before anything is read.
    """
    source = source or str(path)
    if follow_symlinks:
        path = Path(path).resolve()  # every later open refuses links: they are all behind us now
    with safefiles.open_regular(path) as f:
        size = os.fstat(f.fileno()).st_size
        head = f.read(SNIFF_BYTES)
    gz = head.startswith(GZIP_MAGIC)
    formats = resolve(head, source=source, fmt=fmt)
    if formats == ["kineto"] and (size > chunk_bytes or (gz and (size > chunk_bytes // KINETO_GZIP_RATIO or _gzip_isize(path) > chunk_bytes))):
        return _stream_kineto(store, path, source, fmt, opts, min(chunk_bytes, KINETO_PIECE_BYTES), progress)
    piece = min(chunk_bytes, STREAMED[formats[0]].max_piece) if formats[0] in STREAMED else chunk_bytes
    if len(formats) != 1 or formats[0] not in STREAMED or (size <= piece and not gz):
        with safefiles.open_regular(path) as f:
            data = f.read()
        out = ingest_bytes(store, data, source=source, fmt=fmt, opts=opts)
        if progress:
            progress(size)
        return out
    spec = FORMATS[formats[0]].spec
    if spec is not None and spec.final_newline and not gz:
        _require_final_newline(path, size, source)
    # One scrape time for the whole file, not one per piece.
    opts = dataclasses.replace(opts, ts=opts.ts or dt.datetime.now(dt.UTC))
    return _stream(store, path, formats[0], source, opts, piece, progress)


def _require_final_newline(path: Path, size: int, source: str) -> None:
    """A file of a format whose every line ends with a line feed, checked at its end before any piece of it
    is written (the parser would refuse the cut last line only in the last piece, after the others were
    written). A gzip file is checked by the parser of its last piece: its end is known only once inflated."""
    with safefiles.open_regular(path) as f:
        f.seek(max(0, size - TAIL_CHECK_BYTES))
        tail = f.read()
    try:
        require_final_newline(tail[tail.rfind(b"\n") + 1 :], source)
    except ParseError as exc:
        lines = 1
        with safefiles.open_regular(path) as f:
            while block := f.read(KINETO_READ_BYTES):
                lines += block.count(b"\n")
        raise ParseError(exc.message, source=source, line=lines, field=exc.field) from None


def _gzip_isize(path: Path) -> int:
    """The uncompressed size a gzip file's trailer records (RFC 1952 ISIZE: of its last member, mod 2^32)."""
    with safefiles.open_regular(path) as f:
        f.seek(-4, 2)
        return int.from_bytes(f.read(4), "little")


def _stream_kineto(store: Store, path: Path, source: str, fmt: str, opts: Options, piece_bytes: int,
                   progress: Callable[[int], None] | None) -> Outcome:
    """A large Kineto trace: decoded piece by piece (ingest.kineto.parse_chunks), written in one transaction.

    The trace is one document, so it stays all or nothing as in ``ingest_bytes``: a ParseError raises and
    nothing is written. The content hash is the one ``ingest_bytes`` would log for the same file and
    options, so a trace ingested whole is not written again when streamed, and the other way round.
    """
    spec = FORMATS["kineto"]
    module = importlib.import_module(spec.module)
    sha = hashlib.sha256()

    def chunks() -> Iterator[bytes]:
        with safefiles.open_regular(path) as f:
            while block := f.read(KINETO_READ_BYTES):
                sha.update(block)
                if progress:
                    progress(len(block))
                yield block

    batch = module.parse_chunks(chunks(), source=source, job_id=opts.job_id, piece_bytes=piece_bytes)
    batch.source = source
    sha.update(json.dumps([fmt, opts.job_id, opts.ts.isoformat() if opts.ts else None, opts.op]).encode())
    digest = sha.hexdigest()
    outcome = Outcome(source=source, formats=["kineto"], notes={**_notes(batch), "streamed": True})
    accepted = door.for_store(store).accept(screen.Push(source, digest, ["kineto"], batch=batch))
    outcome.skipped_duplicate = accepted.skipped_duplicate
    outcome.result = accepted.result
    return outcome


def _stream(store: Store, path: Path, name: str, source: str, opts: Options, chunk_bytes: int,
            progress: Callable[[int], None] | None) -> Outcome:
    spec = FORMATS[name]
    split = STREAMED[name]
    module = importlib.import_module(spec.module)
    outcome = Outcome(source=source, formats=[name], result=WriteResult(), notes={"streamed": True, "chunks": 0})
    chain = hashlib.sha256(json.dumps(["stream", name, opts.job_id, opts.ts.isoformat() if opts.ts else None, opts.op]).encode())
    held: F.Batch | None = None  # dcgm rows of instants a later piece may still add to
    header = b""
    context: list[bytes] = []
    seen_context: set[bytes] = set()
    sent_inventory: set[tuple] = set()  # gpu rows written by this stream: every piece repeats them
    line = 1  # file line of the current piece's first line
    offset = 0  # decompressed byte offset of the current piece
    done = 0  # bytes of the file as stored, reported so far
    reader = _Reader(path)
    k = 0
    try:
        for k, piece in enumerate(_pieces(reader, split.cut, chunk_bytes), start=1):
            n_lines = piece.count(b"\n")
            where = f"chunk {k} (bytes {offset}-{offset + len(piece)}{' decompressed' if reader.gz else ''}, from line {line})"
            chain.update(piece)
            if split.header and k == 1:
                header = piece[: piece.find(b"\n") + 1] if b"\n" in piece else piece
            prefix = (header if k > 1 else b"") + b"".join(c + b"\n" for c in context)
            try:
                batch = _parse_piece(module, spec, name, prefix, piece, source, opts, line, where, context=bool(context))
            except FleetscopeError as exc:
                outcome.error = str(exc)
                return outcome
            if split.context:
                for c in split.context(piece):
                    if c not in seen_context:
                        seen_context.add(c)
                        context.append(c)
            if batch is not None:
                _note(outcome.notes, batch)
                if split.wide:
                    held = batch if held is None else _merge_wide(held, batch)
                    ready, held = _split_instants(held, _instants(batch))
                else:
                    ready = batch
                ready.gpu = _unsent(ready.gpu, sent_inventory)
                if not _write(store, ready, chain.hexdigest(), outcome, where):
                    return outcome
            outcome.notes["chunks"] = k
            line += n_lines
            offset += len(piece)
            if progress:
                progress(reader.pos - done)
                done = reader.pos
        if held is not None:
            chain.update(b"\x00end")
            held.gpu = _unsent(held.gpu, sent_inventory)
            _write(store, held, chain.hexdigest(), outcome, f"the held rows at the end of {source}")
        if progress and reader.pos > done:
            progress(reader.pos - done)
    except ParseError as exc:  # from the reader: a corrupt gzip stream
        outcome.error = f"{source}: chunk {k + 1}: {exc.message}"
        return outcome
    finally:
        reader.close()
    if name == "nccl_log" and not outcome.notes.get("nccl_lines"):
        outcome.error = str(ParseError("no NCCL log lines (host:pid:tid [dev] NCCL ...) found", source=source))
    outcome.skipped_duplicate = bool(outcome.notes.get("chunks_already_ingested")) and not any(outcome.result.written.values())
    return outcome


def _parse_piece(module: Any, spec: Any, name: str, prefix: bytes, piece: bytes, source: str, opts: Options, line: int,
                 where: str, *, context: bool) -> F.Batch | None:
    """Parse one piece behind its prefix (CSV header, NCCL context lines); errors name the chunk and the
    file's line. None for a piece with nothing to read: blank, or log noise before the first NCCL line."""
    if not piece or piece.isspace() or (name == "nccl_log" and not context and b" NCCL " not in piece):
        return None
    prefix_lines = prefix.count(b"\n")

    def in_file(n: int) -> int:
        return n - prefix_lines + line - 1 if n > prefix_lines else n

    try:
        return spec.call(module, prefix + piece if prefix else piece, source, opts)
    except ParseError as exc:
        # Messages may point at other lines too ("the dump started on line 3"): those are piece lines as well.
        message = re.sub(r"\bline (\d+)\b", lambda m: f"line {in_file(int(m.group(1)))}", exc.message)
        at = in_file(exc.line) if exc.line is not None else None
        raise ParseError(f"{where}: {message}", source=source, line=at, field=exc.field) from None


def _write(store: Store, batch: F.Batch, sha: str, outcome: Outcome, where: str) -> bool:
    """Write one chunk's rows in one transaction unless this exact prefix was written before."""
    if not any(True for _ in batch.frames()):
        return True
    batch.source = outcome.source
    result = outcome.result
    try:
        accepted = door.for_store(store).accept(screen.Push(outcome.source, sha, outcome.formats, batch=batch))
    except ValidationError as exc:
        outcome.error = f"{outcome.source}: {where}: {exc}"
        return False
    wrote = accepted.result
    if accepted.skipped_duplicate:
        outcome.notes["chunks_already_ingested"] = outcome.notes.get("chunks_already_ingested", 0) + 1
    for k, v in wrote.offered.items():
        result.offered[k] = result.offered.get(k, 0) + v
    for k, v in wrote.written.items():
        result.written[k] = result.written.get(k, 0) + v
    result.values += wrote.values
    return True


def _unsent(gpu: pl.DataFrame | None, sent: set[tuple]) -> pl.DataFrame | None:
    """Inventory rows not yet written by this stream, remembered as written."""
    if gpu is None or not gpu.height:
        return gpu
    rows = gpu.rows()
    keep = [r not in sent for r in rows]
    sent.update(rows)
    return gpu.filter(pl.Series(keep, dtype=pl.Boolean))


def _note(notes: dict[str, Any], batch: F.Batch) -> None:
    """Sum the parsers' numeric notes over chunks; keep the latest of the others."""
    for k, v in batch.meta.items():
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            if isinstance(v, (str, bool)) or v is None:
                notes[k] = v
        else:
            notes[k] = notes.get(k, 0) + v


# --- dcgm: rows of one instant spanning pieces ----------------------------------------------------

_TS_FRAMES = ("gpu_sample", "gpu_workload", "health_event", "metric_sample")


def _merge_wide(a: F.Batch, b: F.Batch) -> F.Batch:
    """Concatenate two dcgm batches and fold rows of one key into one: per column the first value wins,
    which is what a whole-file parse keeps for a duplicated series."""
    out = a.merge(b)
    if out.gpu_sample is not None and out.gpu_sample.height:
        out.gpu_sample = _first_values(out.gpu_sample, ["ts", "gpu_uuid"])
    if out.gpu is not None and out.gpu.height:
        out.gpu = _first_values(out.gpu, ["gpu_uuid"])
    for name in ("gpu_workload", "health_event", "metric_sample"):
        df = getattr(out, name)
        if df is not None and df.height:
            setattr(out, name, df.unique(list(F.FRAMES[name].key), keep="first", maintain_order=True))
    return out


def _first_values(df: pl.DataFrame, key: list[str]) -> pl.DataFrame:
    if df.select(pl.struct(key).is_unique().all()).item():
        return df
    return df.group_by(key, maintain_order=True).agg(pl.all().drop_nulls().first()).select(df.columns)


def _instants(batch: F.Batch) -> pl.Series:
    parts = [getattr(batch, n)["ts"] for n in ("gpu_sample", "metric_sample") if getattr(batch, n) is not None and getattr(batch, n).height]
    return pl.concat(parts).unique() if parts else pl.Series("ts", [], dtype=F.UTC_US)


def _split_instants(held: F.Batch, open_ts: pl.Series) -> tuple[F.Batch, F.Batch | None]:
    """(rows of instants the latest piece did not touch: complete, ready to write; rows still open)."""
    ready = F.Batch(source=held.source)
    rest = F.Batch(source=held.source)
    for name in _TS_FRAMES:
        df = getattr(held, name)
        if df is None or not df.height:
            continue
        is_open = df["ts"].is_in(open_ts.implode())
        setattr(ready, name, df.filter(~is_open))
        setattr(rest, name, df.filter(is_open))
    # Inventory not yet written goes out with the next write that has rows (the store merges it by GPU).
    if any(True for _ in ready.frames()):
        ready.gpu = held.gpu
    else:
        rest.gpu = held.gpu
    return ready, rest if any(True for _ in rest.frames()) else None

"""``fleetscope ingest``: telemetry files (or directories of them) into the store, or to a running API."""

from __future__ import annotations

import datetime as dt
import json
import os
import stat
import sys
from pathlib import Path

import click
from tqdm import tqdm

from fleetscope import safefiles
from fleetscope.cli.common import _engine, _settings, _utc_option
from fleetscope.core.errors import FleetscopeError
from fleetscope.safefiles import kind_of
from fleetscope.store import Store


def _iter_paths(paths: tuple[str, ...], *, follow_symlinks: bool = False) -> tuple[list[Path], list[tuple[Path, str]]]:
    """(files to read, (path, why) of what a directory held that is not read).

    In a directory, symbolic links are skipped unless ``follow_symlinks`` (a link may lead anywhere:
    /etc/shadow, out of the tree, into a loop), and so is anything that is not a regular file (a FIFO
    would block the reader, a device never ends). A path named on the command line is always tried, and
    refused by the reader with the same reason if it is one of those.
    """
    files: list[Path] = []
    skipped: list[tuple[Path, str]] = []
    seen_dirs: set[tuple[int, int]] = set()

    def walk(top: Path) -> None:
        st = top.stat()
        if (st.st_dev, st.st_ino) in seen_dirs:
            skipped.append((top, "a directory already read (a loop, or a second link to it)"))
            return
        seen_dirs.add((st.st_dev, st.st_ino))
        try:
            with os.scandir(top) as it:
                entries = sorted(it, key=lambda e: e.name)
        except OSError as exc:
            skipped.append((top, f"a directory that cannot be listed ({exc.strerror})"))
            return
        for e in entries:
            p = Path(e.path)
            try:
                mode = os.stat(p, follow_symlinks=follow_symlinks).st_mode
            except FileNotFoundError:
                skipped.append((p, "a broken symbolic link" if os.path.islink(p) else "gone while the directory was read"))
                continue
            if stat.S_ISLNK(mode):
                skipped.append((p, "a symbolic link, not followed (--follow-symlinks reads what it points to)"))
            elif stat.S_ISDIR(mode):
                walk(p)
            elif stat.S_ISREG(mode):
                files.append(p)
            else:
                skipped.append((p, f"{kind_of(mode)}, not a regular file"))

    for p in map(Path, paths):
        try:
            st = os.lstat(p)
        except FileNotFoundError:
            raise click.ClickException(f"{p}: no such file or directory") from None
        is_dir = stat.S_ISDIR(st.st_mode) or (follow_symlinks and stat.S_ISLNK(st.st_mode) and p.is_dir())
        if is_dir:
            walk(p)
        else:
            files.append(p)
    return files, skipped


@click.command()
@click.argument("paths", nargs=-1, required=True)
@click.option("--format", "fmt", default="auto", show_default=True, help="Force a format instead of detecting it (see `fleetscope fleet formats`).")
@click.option("--job-id", default=None, help="Job id for formats that do not carry one (NCCL logs, Kineto traces).")
@click.option("--ts", "ts_text", default=None, help="Timestamp (RFC 3339) for formats without one; default: the file's modification time.")
@click.option("--chunk-mb", type=click.FloatRange(min=0, min_open=True), default=64.0, show_default=True,
              help="Chunk size for large line-oriented files, capped at 32 MiB of dcgm-exporter text and 16 MiB of JSON Lines, CSV or logs; smaller files are one transaction.")
@click.option("--api", "api_url", default=None, help="Send to a running API instead of writing the local database.")
@click.option("--token", envvar="FLEETSCOPE_TOKEN", default=None, help="API token with the ingest scope (or FLEETSCOPE_TOKEN).")
@click.option("--follow-symlinks", is_flag=True, help="Read the files symbolic links point to (default: links are skipped, and named ones refused).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object per input and a summary.")
def ingest(paths: tuple[str, ...], fmt: str, job_id: str | None, ts_text: str | None, chunk_mb: float, api_url: str | None,
           token: str | None, follow_symlinks: bool, as_json: bool) -> None:
    """Ingest telemetry files (or directories of them). The format is detected from content.

    A file up to the chunk size, or a one-document format (Kineto, nvidia-smi XML, nccl-tests), is written in
    one transaction: if it fails to parse it is reported and writes nothing, and the others still go in.
    A Kineto trace over the chunk size is decoded in pieces, in bounded memory, and still written at once.
    Larger line-oriented files (dcgm-exporter text, nvidia-smi CSV, NCCL Inspector and job-event JSON
    Lines, NCCL logs) are streamed: each chunk is its own transaction, a bad chunk stops that file with
    the chunk and line named, chunks before it stay written, and re-running the file writes nothing new.
    Symbolic links are not followed unless --follow-symlinks, and FIFOs, devices and sockets are never
    read: in a directory they are skipped with a note saying which and why; named, they are rejected.
    Exits 1 if any file was rejected.

    \b
    Examples:
      fleetscope ingest /var/log/dcgm/ nccl-inspector.jsonl
      fleetscope ingest trace.json --format kineto --job-id job-llm-a
      fleetscope ingest big-scrape.prom --chunk-mb 16 --api https://fleet.example:8000 --json
    """
    from fleetscope.door import streaming  # lazy: the format registry imports every parser

    files, skipped = _iter_paths(paths, follow_symlinks=follow_symlinks)
    for path, why in skipped:
        if as_json:
            click.echo(json.dumps({"source": str(path), "skipped": why}))
        else:
            click.echo(f"skipped   {path}: {why}", err=True)
    ts = _utc_option(ts_text, "--ts")
    store = None if api_url else Store(_engine(_settings()))
    chunk_bytes = max(1, int(chunk_mb * 2**20))
    totals: dict[str, int] = {}
    rejected = 0
    sizes = {p: _size(p, follow_symlinks) for p in files}
    bar = tqdm(total=sum(sizes.values()), unit="B", unit_scale=True, unit_divisor=1024, file=sys.stderr,
               disable=as_json or (len(files) < 2 and sum(sizes.values()) <= chunk_bytes))
    # Lines go through the bar while it is drawn, so they do not tear it.
    say = click.echo if bar.disable else (lambda text, err=False: bar.write(text, file=sys.stderr if err else sys.stdout))
    for path in files:
        bar.set_postfix_str(path.name[:40])
        try:
            file_ts = ts or dt.datetime.fromtimestamp((path.stat() if follow_symlinks else path.lstat()).st_mtime, dt.UTC)
            if api_url:
                with safefiles.open_regular(path, follow_symlinks=follow_symlinks) as f:
                    data = f.read()
                out = _ingest_via_api(api_url, token, data, str(path), fmt, job_id, file_ts)
                bar.update(sizes[path])
            else:
                out = streaming.ingest_file(store, path, fmt=fmt, opts=_ingest_options(job_id, file_ts), chunk_bytes=chunk_bytes,
                                            progress=bar.update, follow_symlinks=follow_symlinks).to_dict()
        except Exception as exc:  # noqa: BLE001 - one bad file must not stop the rest; it is reported
            if not isinstance(exc, (FleetscopeError, ValueError, click.ClickException, OSError)):
                raise
            why = f"{exc.strerror}" if isinstance(exc, OSError) and exc.strerror else str(exc)
            out = {"source": str(path), "error": why, "written": {}}
        if out.get("error"):
            rejected += 1
        for k, v in out.get("written", {}).items():
            totals[k] = totals.get(k, 0) + v
        if as_json:
            click.echo(json.dumps(out, default=str))
        elif out.get("error"):
            err = str(out["error"])
            kept = sum(out.get("written", {}).values())
            after = f" ({kept} rows of earlier chunks stay written)" if kept else ""
            say(f"rejected  {err if err.startswith(str(path)) else f'{path}: {err}'}{after}", err=True)
        else:
            dup = " (already ingested)" if out.get("skipped_duplicate") else ""
            chunks = out.get("notes", {}).get("chunks") if out.get("notes", {}).get("streamed") else None
            how = f" in {chunks} chunks" if chunks else ""
            say(f"ingested  {path} [{', '.join(out.get('formats', []))}]{how}: " + (", ".join(f"{k} {v}" for k, v in out["written"].items()) or "nothing new") + dup)
    bar.close()
    summary = {"files": len(files), "rejected": rejected, "skipped": len(skipped), "written": totals}
    if as_json:
        click.echo(json.dumps({"summary": summary}))
    else:
        not_read = f" ({len(skipped)} skipped)" if skipped else ""
        click.echo(f"{len(files) - rejected} of {len(files)} files ingested{not_read}; rows written: " + (", ".join(f"{k} {v}" for k, v in totals.items()) or "none"))
    if rejected:
        sys.exit(1)


def _size(path: Path, follow_symlinks: bool) -> int:
    """A file's size for the progress bar; 0 where it cannot be had (the reader then says why)."""
    try:
        return (path.stat() if follow_symlinks else path.lstat()).st_size
    except OSError:
        return 0


def _ingest_options(job_id: str | None, ts: dt.datetime):  # type: ignore[no-untyped-def]
    from fleetscope.door import ingestion  # lazy: the format registry imports every parser

    return ingestion.Options(job_id=job_id, ts=ts)


def _ingest_via_api(api_url: str, token: str | None, data: bytes, source: str, fmt: str, job_id: str | None, ts: dt.datetime) -> dict:
    import httpx  # lazy: only --api sends over HTTP

    if not token:
        raise click.ClickException("--api needs --token (or FLEETSCOPE_TOKEN) with the ingest scope")
    params = {"source": source, "ts": ts.isoformat()}
    if job_id:
        params["job_id"] = job_id
    r = httpx.post(f"{api_url.rstrip('/')}/api/v1/ingest/{fmt}", content=data, params=params,
                   headers={"Authorization": f"Bearer {token}", "Content-Type": "application/octet-stream"}, timeout=300)
    if r.status_code >= 500 or r.status_code in (401, 403):
        raise click.ClickException(f"{api_url}: {r.status_code} {r.text[:300]}")
    body = r.json()
    if r.status_code != 200:
        return {"source": source, "error": body.get("detail", r.text[:300]), "written": {}}
    return body

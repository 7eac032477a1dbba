"""The ``fleetscope`` command: few verbs, each with --help; --json where scripts read the output."""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import click

from fleetscope import __version__
from fleetscope import settings as settings_mod
from fleetscope.cli.common import _emit, _engine, _os_user, _settings, _store, _utc_option


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="fleetscope")
def main() -> None:
    """Fleetscope: observability, ops and governance for GPU training and serving fleets.

    Configuration comes from FLEETSCOPE_* environment variables (see the README); with none set,
    everything runs embedded in ./.fleetscope (SQLite, and a SQLite-backed Celery broker).
    """


# --- database ----------------------------------------------------------------------------------


@main.group("db")
def db_group() -> None:
    """Schema migrations (Alembic)."""


@db_group.command("upgrade")
@click.option("--revision", default="head", show_default=True, help="Target revision.")
def db_upgrade(revision: str) -> None:
    """Migrate the database to REVISION (the latest by default)."""
    from fleetscope.store import db

    s = _settings()
    db.upgrade(s.database_url, revision)
    click.echo(f"database at {db.current_revision(db.make_engine(s.database_url))}")


@db_group.command("downgrade")
@click.option("--revision", required=True, help="Target revision ('base' drops everything).")
@click.confirmation_option(prompt="Downgrading can drop tables and their data. Continue?")
def db_downgrade(revision: str) -> None:
    """Migrate the database down to REVISION."""
    from fleetscope.store import db

    s = _settings()
    db.downgrade(s.database_url, revision)
    click.echo(f"database at {db.current_revision(db.make_engine(s.database_url)) or 'base'}")


@db_group.command("current")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def db_current(as_json: bool) -> None:
    """Show the database's schema revision and the code's."""
    from fleetscope.store import db

    s = _settings()
    engine = db.make_engine(s.database_url)
    cur, head = db.current_revision(engine), db.head_revision(s.database_url)
    url = engine.url.render_as_string(hide_password=True)
    _emit(as_json, {"url": url, "current": cur, "head": head}, f"{url}: at {cur or 'base'}, code expects {head}")


@db_group.command("prune")
@click.option("--now", "now_text", default=None, help="RFC 3339: prune as of this instant (default: now).")
@click.option("--dry-run", is_flag=True, help="Print each table's cutoff; delete nothing.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def db_prune(now_text: str | None, dry_run: bool, as_json: bool) -> None:
    """Delete what is past its retention now, as beat does every hour: raw telemetry after
    FLEETSCOPE_RETENTION_DAYS, what was derived from it after FLEETSCOPE_EVIDENCE_RETENTION_DAYS, the
    roll-up tiers after FLEETSCOPE_MINUTE_TIER_RETENTION_DAYS and FLEETSCOPE_HOUR_TIER_RETENTION_DAYS.

    \b
    Examples:
      fleetscope db prune --dry-run
      FLEETSCOPE_RETENTION_DAYS=200 fleetscope db prune --json
    """
    from fleetscope.services import retention

    s = _settings()
    now = _utc_option(now_text, "--now") or dt.datetime.now(dt.UTC)
    if dry_run:
        cut = {k: v.isoformat() for k, v in retention.cutoffs(now, s.retention_days, s.evidence_retention_days, retention.tier_days(s)).items()}
        _emit(as_json, cut, "\n".join(f"{k:<20} rows before {v}" for k, v in cut.items()))
        return
    deleted = retention.prune(_store(), now, s.retention_days, s.evidence_retention_days, retention.tier_days(s))
    _emit(as_json, deleted, "\n".join(f"{k:<20} {v:>10,} deleted" for k, v in deleted.items()))


# --- tokens --------------------------------------------------------------------------------------


@main.group("token")
def token_group() -> None:
    """API tokens (bearer secrets with scopes ingest, read, governance, admin)."""


@token_group.command("create")
@click.option("--scope", "scopes", multiple=True, required=True, type=click.Choice(["ingest", "read", "governance", "admin"]), help="Repeat for several.")
@click.option("--name", default="cli", show_default=True, help="What the token is for.")
@click.option("--expires-days", type=int, default=None, help="Expire after this many days.")
@click.option("--site", default=None, help="Bind: rows the token pushes that name a site must name this one.")
@click.option("--host", default=None, help="Bind: rows the token pushes that name a host must name this one (a node agent's token).")
@click.option("--source", default=None, help="Bind: pushes must claim this source (the default source of its pushes).")
@click.option("--json", "as_json", is_flag=True)
def token_create(scopes: tuple[str, ...], name: str, expires_days: int | None, site: str | None, host: str | None, source: str | None,
                 as_json: bool) -> None:
    """Create a token and print its secret. It is shown only this once."""
    from fleetscope.services import auth

    s = _settings()
    expires = dt.datetime.now(dt.UTC) + dt.timedelta(days=expires_days) if expires_days else None
    try:
        binding = auth.check_binding(auth.Binding(site, host, source))
        secret = auth.create_token(_engine(s), name, list(scopes), expires_at=expires, binding=binding)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None
    bound = {"site": binding.site, "host": binding.host, "source": binding.source} if binding else None
    _emit(as_json, {"token": secret, "name": name, "scopes": sorted(scopes), "expires_at": expires, "binding": bound}, secret)


@token_group.command("list")
@click.option("--json", "as_json", is_flag=True)
def token_list(as_json: bool) -> None:
    """List tokens (never their secrets)."""
    from fleetscope.services import auth

    rows = auth.list_tokens(_engine(_settings()))
    def bound(r: dict) -> str:
        return " ".join(f"{k}={r['bound_' + k]}" for k in ("site", "host", "source") if r["bound_" + k] is not None)

    lines = [f"{r['token_id']:>4}  {r['name']:<20} {r['scopes']:<30} {'revoked' if r['revoked_at'] else 'active':<8} {bound(r)}".rstrip() for r in rows]
    _emit(as_json, rows, "\n".join(lines) or "no tokens")


@token_group.command("revoke")
@click.argument("token_id", type=int)
def token_revoke(token_id: int) -> None:
    """Revoke the token with TOKEN_ID (see `token list`)."""
    from fleetscope.services import auth

    if not auth.revoke_token(_engine(_settings()), token_id):
        raise click.ClickException(f"no active token with id {token_id}")
    click.echo(f"revoked token {token_id}")


# --- processes ---------------------------------------------------------------------------------


def _tls_options(f):  # type: ignore[no-untyped-def]
    f = click.option("--tls-key", type=click.Path(dir_okay=False), default=None, help="PEM private key of --tls-cert (or FLEETSCOPE_TLS_KEY).")(f)
    return click.option("--tls-cert", type=click.Path(dir_okay=False), default=None,
                        help="Serve HTTPS with this PEM certificate (chain) (or FLEETSCOPE_TLS_CERT); needs --tls-key.")(f)


def _tls(cert: str | None, key: str | None, s: settings_mod.Settings) -> tuple[str, str] | None:
    """The certificate and key to serve HTTPS with (options first, then settings), checked to load as a
    pair before the server starts; None for plain HTTP."""
    import ssl

    cert, key = cert or s.tls_cert, key or s.tls_key
    if not cert and not key:
        return None
    if not cert or not key:
        given, missing = (("--tls-cert (or FLEETSCOPE_TLS_CERT)", "--tls-key (or FLEETSCOPE_TLS_KEY)") if cert
                          else ("--tls-key (or FLEETSCOPE_TLS_KEY)", "--tls-cert (or FLEETSCOPE_TLS_CERT)"))
        raise click.ClickException(f"{given} was given without {missing}: HTTPS needs both the certificate and its private key")
    for name, path in (("--tls-cert", cert), ("--tls-key", key)):
        if not Path(path).is_file():
            raise click.ClickException(f"{name}: no file at {path}")
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(cert, key)
    except (ssl.SSLError, OSError) as exc:
        raise click.ClickException(f"--tls-cert {cert} and --tls-key {key} do not load as a PEM certificate and its private key: {exc}") from None
    return str(Path(cert).resolve()), str(Path(key).resolve())


def _warn_plain_http(host: str, what: str) -> None:
    if host not in ("127.0.0.1", "::1", "localhost"):
        click.echo(f"warning: {what} serves plain HTTP on {host}: tokens cross the network readable unless a TLS proxy is in front "
                   "(or give --tls-cert and --tls-key)", err=True)


@main.command()
@click.option("--host", default=None, help="Bind address (default FLEETSCOPE_API_HOST).")
@click.option("--port", type=int, default=None, help="Port (default FLEETSCOPE_API_PORT).")
@click.option("--workers", type=int, default=1, show_default=True, help="Uvicorn worker processes.")
@_tls_options
def serve(host: str | None, port: int | None, workers: int, tls_cert: str | None, tls_key: str | None) -> None:
    """Run the HTTP API (FastAPI under uvicorn), over HTTPS with --tls-cert and --tls-key."""
    import uvicorn

    s = _settings()
    tls = _tls(tls_cert, tls_key, s)
    host = host or s.api_host
    if tls is None:
        _warn_plain_http(host, "the API")
    _engine(s)  # migrate once here, not in every worker process
    from fleetscope.api.server import uvicorn_options

    uvicorn.run("fleetscope.api:create_app", factory=True, host=host, port=port or s.api_port, workers=workers, log_level=s.log_level.lower(),
                ssl_certfile=tls[0] if tls else None, ssl_keyfile=tls[1] if tls else None, **uvicorn_options(s.max_header_bytes))


ALERTING_WORKER_THREADS = 4  # evaluations take a lock and run one at a time; deliveries wait on receivers


@main.command(context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
@click.option("--concurrency", type=int, default=2, show_default=True)
@click.option("--pool", default="prefork", show_default=True, type=click.Choice(["prefork", "solo", "threads"]))
@click.option("--queues", "-Q", help="Comma-separated queues to serve, and nothing else (e.g. `alerting` for a host that only alerts). "
              "Default: the general queue here, and the alerting queue in a worker process of its own beside it.")
@click.pass_context
def worker(ctx: click.Context, concurrency: int, pool: str, queues: str | None) -> None:
    """Run a Celery worker (extra arguments go to `celery worker`)."""
    from fleetscope.worker import ALERTING_QUEUE, DEFAULT_QUEUE, celery_app

    _engine(_settings())
    argv = ["worker", f"--concurrency={concurrency}", f"--pool={pool}", "--loglevel=INFO", *ctx.args]
    if queues:
        celery_app.worker_main([*argv, f"--queues={queues}"])
        return
    alerting = subprocess.Popen([sys.executable, "-m", "fleetscope.cli", "worker", "--queues", ALERTING_QUEUE, "--pool", "threads",
                                 "--concurrency", str(ALERTING_WORKER_THREADS), "--hostname", f"{ALERTING_QUEUE}@%h"],
                                preexec_fn=_die_with_parent if sys.platform == "linux" else None)
    stopping = threading.Event()

    def watch() -> None:
        # One verb, one unit for the supervisor: without its alerting worker this one stops too, to be restarted whole.
        code = alerting.wait()
        if not stopping.is_set():
            click.echo(f"the alerting worker exited ({code}); stopping", err=True)
            os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, daemon=True).start()
    try:
        celery_app.worker_main([*argv, f"--queues={DEFAULT_QUEUE}"])
    finally:
        stopping.set()
        alerting.terminate()
        try:
            alerting.wait(timeout=60)
        except subprocess.TimeoutExpired:
            alerting.kill()


def _die_with_parent() -> None:
    """In a child, before exec: ask Linux for SIGTERM when the parent dies, so a killed `fleetscope worker`
    leaves no alerting worker behind."""
    import ctypes

    ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


@main.command("dashboard", context_settings={"ignore_unknown_options": True})
@click.option("--host", envvar="FLEETSCOPE_DASHBOARD_HOST", default="127.0.0.1", show_default=True, help="Bind address (or FLEETSCOPE_DASHBOARD_HOST).")
@click.option("--port", envvar="FLEETSCOPE_DASHBOARD_PORT", type=int, default=8501, show_default=True, help="Port (or FLEETSCOPE_DASHBOARD_PORT).")
@_tls_options
@click.argument("streamlit_args", nargs=-1, type=click.UNPROCESSED)
def dashboard_cmd(host: str, port: int, tls_cert: str | None, tls_key: str | None, streamlit_args: tuple[str, ...]) -> None:
    """Run the Streamlit dashboard (extra arguments go to `streamlit run`), over HTTPS with --tls-cert and --tls-key.

    Users sign in with an API token, or through an OIDC provider with FLEETSCOPE_DASHBOARD_AUTH=oidc."""
    import importlib.util

    s = _settings()
    tls = _tls(tls_cert, tls_key, s)
    if tls is None:
        _warn_plain_http(host, "the dashboard")
    if s.dashboard_auth == "oidc":
        from dashboard.access import MappingError, parse_mapping

        try:
            parse_mapping(s.dashboard_oidc_scopes)
        except MappingError as exc:
            raise click.ClickException(str(exc)) from None
    _engine(s)  # migrate the embedded database on first start, as `serve` does; the dashboard only reads
    spec = importlib.util.find_spec("dashboard")
    if spec is None or spec.origin is None:
        raise click.ClickException("the dashboard package is not installed")
    app = Path(spec.origin).resolve().parent / "app.py"
    # The dashboard reads its settings from the environment, like every other process.
    env = {**os.environ, "FLEETSCOPE_DATA_DIR": str(s.data_dir), "FLEETSCOPE_DATABASE_URL": s.database_url}
    cmd = [sys.executable, "-m", "streamlit", "run", str(app), "--server.headless", "true", "--server.port", str(port),
           "--server.address", host, "--browser.gatherUsageStats", "false", "--server.fileWatcherType", "none",
           "--client.toolbarMode", "viewer",
           *(["--server.sslCertFile", tls[0], "--server.sslKeyFile", tls[1]] if tls else []), *streamlit_args]
    if os.name == "posix":
        os.execve(sys.executable, cmd, env)  # streamlit takes this pid, so signals and supervisors reach it directly
    sys.exit(subprocess.call(cmd, env=env))


@main.command(context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
@click.pass_context
def beat(ctx: click.Context) -> None:
    """Run Celery beat, which schedules the analyzers, alerts, rollups, retention and audit reports."""
    from fleetscope.worker import celery_app

    # Beat's schedule (celerybeat-schedule in the data dir) is a shelve Celery creates with no mode of
    # ours: what this process creates is private to its account.
    os.umask(0o077)
    celery_app.start(["beat", "--loglevel=INFO", *ctx.args])


# --- ingest ------------------------------------------------------------------------------------


def _iter_paths(paths: tuple[str, ...], *, follow_symlinks: bool = False) -> tuple[list[Path], list[tuple[Path, str]]]:
    """(files to read, (path, why) of what a directory held that is not read).

    In a directory, symbolic links are skipped unless ``follow_symlinks`` (a link may lead anywhere:
    /etc/shadow, out of the tree, into a loop), and so is anything that is not a regular file (a FIFO
    would block the reader, a device never ends). A path named on the command line is always tried, and
    refused by the reader with the same reason if it is one of those.
    """
    import stat

    from fleetscope.safefiles import kind_of

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


@main.command()
@click.argument("paths", nargs=-1, required=True)
@click.option("--format", "fmt", default="auto", show_default=True, help="Force a format instead of detecting it (see `fleetscope formats`).")
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
    """
    from tqdm import tqdm

    from fleetscope import safefiles
    from fleetscope.door import streaming
    from fleetscope.store import Store

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
            from fleetscope.core.errors import FleetscopeError

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
    from fleetscope.door import ingestion

    return ingestion.Options(job_id=job_id, ts=ts)


def _ingest_via_api(api_url: str, token: str | None, data: bytes, source: str, fmt: str, job_id: str | None, ts: dt.datetime) -> dict:
    import httpx

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


@main.command()
@click.argument("job_id")
@click.option("--json", "as_json", is_flag=True)
def analyze(job_id: str, as_json: bool) -> None:
    """Analyse JOB_ID now: C3 breakdown, goodput (with MFU and the goodput product), stragglers and the
    what-if, stored and printed."""
    from fleetscope.services.jobs import analyze_job
    from fleetscope.store import Store

    result = analyze_job(Store(_engine(_settings())), job_id)
    if as_json:
        click.echo(json.dumps(result.to_dict(), default=str))
        return
    click.echo(f"job {job_id}")
    if result.c3:
        c = result.c3
        click.echo(f"  C3      step {c['step_s_mean']:.4g} s mean (p99 {c['step_s_p99']:.4g} s) over {c['ranks']} ranks x {c['steps']} steps")
        click.echo(f"          C1 compute {c['c1_ratio']:.1%}  C2 communication {c['c2_ratio']:.1%}  C3 coordination {c['c3_ratio']:.1%}  -> {c['dominant']} dominates")
        click.echo(f"          {c['advice']}")
    if result.goodput:
        g = result.goodput
        top = sorted(((k, v) for k, v in g["badput_s"].items() if v), key=lambda kv: -kv[1])[:3]
        click.echo(f"  goodput {g['goodput_ratio']:.1%} of {g['total_s']:.0f} s; badput: " + (", ".join(f"{k} {v:.0f} s" for k, v in top) or "none"))
        if g.get("mfu_ratio") is not None:
            product = g.get("goodput_product_ratio")
            click.echo(f"          MFU {g['mfu_ratio']:.1%} ({g['mfu_dtype']} peak of {g['gpu_model']})"
                       + (f"; ML Productivity Goodput {product:.1%} (scheduling x runtime x program)" if product is not None else ""))
    if result.whatif:
        _echo_whatif(result.whatif)
    for f in result.stragglers:
        click.echo(f"  straggler [{f['severity']}] {f['summary']}")
    for f in result.sdc:
        if f["kind"] != "sdc_rerun":
            click.echo(f"  sdc [{f['severity']}] {f['summary']}")
    for v in result.sdc_reruns:
        click.echo(f"  sdc rerun {v['case_id']} on {v['suspect_gpu']}: {v['verdict']} ({v['reason']})")
    for note in result.notes:
        click.echo(f"  note: {note}")


def _echo_whatif(w: dict) -> None:
    click.echo(f"  what-if slowdown S {w['slowdown']:.3f} (ideal step {w['ideal_step_s']:.4g} s, replayed {w['simulated_step_s']:.4g} s); "
               f"M_W {w['m_w']:.2f}, M_S {w['m_s']:.2f}: {w['verdict']}" + (f" ({', '.join(w['culprits'])})" if w["culprits"] else ""))
    stages = ", ".join(f"stage {r['stage']} {r['slowdown_only']:.3f}" for r in sorted(w["by_stage"], key=lambda r: r["stage"]))
    click.echo(f"          per stage: {stages}")
    worst = ", ".join(f"rank {r['rank']} {r['slowdown']:.3f}" for r in w["by_worker"][:5])
    click.echo(f"          slowest ranks: {worst}")


@main.command()
@click.argument("job_id")
@click.option("--json", "as_json", is_flag=True)
def whatif(job_id: str, as_json: bool) -> None:
    """Straggler what-if of JOB_ID as last analysed: slowdown against the ideal timeline, M_W, M_S, and the
    slowdown of each rank and pipeline stage (ingest the trace with --format bytedance_whatif --job-id)."""
    from fleetscope.services.jobs import job_exists, stored_analysis

    st = _store()
    if not job_exists(st, job_id):
        raise click.ClickException(f"no job {job_id!r}: nothing ingested under that id")
    found = stored_analysis(st, job_id, "whatif")
    if found is None:
        raise click.ClickException(f"job {job_id!r} has no what-if analysis: ingest its operations (format bytedance_whatif), "
                                   f"then `fleetscope analyze {job_id}`")
    if as_json:
        click.echo(json.dumps(found, default=str))
        return
    click.echo(f"job {job_id} (analysed {found['computed_at']})")
    _echo_whatif(found["result"])


@main.command()
@click.argument("job_id")
@click.option("--json", "as_json", is_flag=True)
def sdc(job_id: str, as_json: bool) -> None:
    """Silent-data-corruption screen of JOB_ID: suspects with their evidence, and the rerun protocol's
    records and verdicts (record replays as `sdc_rerun` job events, docs/job_events.md)."""
    from fleetscope.services.jobs import job_exists, job_sdc

    st = _store()
    if not job_exists(st, job_id):
        raise click.ClickException(f"no job {job_id!r}: nothing ingested under that id")
    out = job_sdc(st, job_id)
    if as_json:
        click.echo(json.dumps(out, default=str))
        return
    click.echo(f"job {job_id}: {out['steps_screened']} rank-steps screened, {len(out['suspects'])} suspect(s)")
    for f in out["suspects"]:
        click.echo(f"  [{f['severity']}] {f['summary']}")
    for m in out["checksum_mismatches"]:
        if m["verdict"] == "tie":
            click.echo(f"  tie at step {m['step']} (group {m['replica_group']}): rank {m['rank']} holds {m['param_checksum']}; no majority")
    for v in out["reruns"]["verdicts"]:
        click.echo(f"  rerun {v['case_id']} on {v['suspect_gpu']}: {v['verdict']} ({v['reason']})")
        for r in v["runs"]:
            what = "original" if r["attempt"] == 0 else f"replay {r['attempt']}"
            click.echo(f"      {what:<9} on {r['gpu_uuid']}: {r['result']}  ({r['source']}, {r['ts']})")
        if v["expected"] is not None:
            click.echo(f"      expected  {v['expected']} ({v['expected_source']})")
    for p in out["reruns"]["problems"]:
        click.echo(f"  rerun {p['case_id']} not judged: {p['problem']}")


@main.command()
@click.option("--start", "start_text", default=None, help="RFC 3339 start (default: 30 days before --end).")
@click.option("--end", "end_text", default=None, help="RFC 3339 end, exclusive (default: now).")
@click.option("--job-id", default=None, help="One job only.")
@click.option("--parts", type=click.IntRange(min=1), default=None, help="N for the all-up availability A^N (default: the job's GPUs).")
@click.option("--part-availability", type=click.FloatRange(0.0, 1.0), default=None, help="A per part (default: measured from the window).")
@click.option("--json", "as_json", is_flag=True)
def reliability(start_text: str | None, end_text: str | None, job_id: str | None, parts: int | None, part_availability: float | None,
                as_json: bool) -> None:
    """Interruptions by root cause (Llama 3 categories), MTBF per GPU-hour and per job, all-up availability
    A^N, and Young/Daly checkpoint advice per job, over a window of job events."""
    from fleetscope.services.reliability import UnknownJob, reliability_report

    end = _utc_option(end_text, "--end") or dt.datetime.now(dt.UTC)
    start = _utc_option(start_text, "--start") or end - dt.timedelta(days=30)
    try:
        out = reliability_report(_store(), start, end, job_id=job_id, parts=parts, part_availability=part_availability)
    except (UnknownJob, ValueError) as exc:
        raise click.ClickException(str(exc)) from None
    if as_json:
        click.echo(json.dumps(out, default=str))
        return

    def hours(h: float | None) -> str:
        return "no failures" if h is None else f"{h:.4g} h"

    m = out["mtbf"]
    click.echo(f"{start:%Y-%m-%d %H:%M} to {end:%Y-%m-%d %H:%M} UTC: {out['interruptions']['total']} unexpected interruption(s) "
               f"in {m['gpu_hours']:.6g} GPU-hours; GPU MTBF {hours(m['gpu_mtbf_hours'])}")
    for c in out["interruptions"]["by_category"]:
        if c["interruptions"]:
            click.echo(f"  {c['category']:<32} {c['component']:<22} {c['interruptions']:>6}  {c['share']:6.1%}")
    for j in m["jobs"]:
        click.echo(f"  job {j['job_id']}: {j['gpus']} GPUs x {j['wall_hours']:.4g} h, {j['interruptions']} interruption(s), "
                   f"job MTBF {hours(j['job_mtbf_hours'])}")
    a = out["availability"]
    if a["parts"] is not None:
        up = "unknown" if a["all_up"] is None else f"{a['all_up']:.1%}"
        click.echo(f"  all {a['parts']} parts up: {up} (A = {a['part_availability']}; {a['basis']})")
    for c in out["checkpoint"]:
        line = f"  checkpoint {c['job_id']}: save {c['save_cost_s']:.0f} s"
        if c["interval_s"] is not None:
            line += f" every {c['interval_s'] / 60:.1f} min"
        if c["daly_interval_s"] is not None:
            line += f"; advised: Young {c['young_interval_s'] / 60:.1f} min, Daly {c['daly_interval_s'] / 60:.1f} min"
        if c["lost_fraction_actual"] is not None and c["lost_fraction_advised"] is not None:
            line += f"; time lost {c['lost_fraction_actual']:.1%} now vs {c['lost_fraction_advised']:.1%} advised"
        click.echo(line + f" (MTBF: {c['mtbf_basis']})")


@main.command()
@click.option("--start", "start_text", default=None, help="RFC 3339 start (default: 15 minutes before --end).")
@click.option("--end", "end_text", default=None, help="RFC 3339 end, exclusive (default: now).")
@click.option("--json", "as_json", is_flag=True)
def fabric(start_text: str | None, end_text: str | None, as_json: bool) -> None:
    """InfiniBand/RoCE link health over a window: flapping, erroring, congested and degraded links from
    the stored port counters and topology, and the usual HCA link rate."""
    from fleetscope.services.health import fabric_health

    end = _utc_option(end_text, "--end") or dt.datetime.now(dt.UTC)
    start = _utc_option(start_text, "--start") or end - dt.timedelta(minutes=15)
    try:
        out = fabric_health(_store(), start, end)
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    found = out["findings"]
    if as_json:
        click.echo(json.dumps({"start": start, "end": end, "nic_rate_gbps": out["nic_rate_gbps"], "links": out["links"],
                               "ports_seen": out["ports"].height, "findings": found.to_dicts()}, default=str))
        return
    rate = f"{out['nic_rate_gbps']:g} Gb/s" if out["nic_rate_gbps"] else "unknown"
    click.echo(f"{start:%Y-%m-%d %H:%M} to {end:%Y-%m-%d %H:%M} UTC: {out['ports'].height} port(s) sampled, {out['links']} link(s) "
               f"in the topology, HCA link rate {rate}; {found.height} finding(s)")
    for r in found.sort("kind", "subject").to_dicts():
        click.echo(f"  {r['kind']:<17} {r['severity']:<8} {r['summary']}")


# --- governance ------------------------------------------------------------------------------


@main.group()
def lineage() -> None:
    """Data lineage: which data trained which model."""


@lineage.command("show")
@click.argument("model")
@click.option("--version", default=None, help="Model version (default: the latest registered).")
@click.option("--json", "as_json", is_flag=True)
def lineage_show(model: str, version: str | None, as_json: bool) -> None:
    """Datasets upstream of MODEL, each with the path that proves it, and the taints that reach it."""
    from fleetscope.services import governance as gs

    try:
        out = gs.model_lineage(_store(), model, version)
    except gs.NotFound as exc:
        raise click.ClickException(str(exc)) from None
    if as_json:
        click.echo(json.dumps(out, default=str))
        return
    m = out["model"]
    click.echo(f"model {m['name']}@{m['version']} ({m['role']}): {m['intended_purpose'] or 'no intended purpose recorded'}")
    for u in out["upstream"]:
        click.echo(f"  {u['dataset']}  ({u['hops']} run{'s' if u['hops'] != 1 else ''} away)\n      {u['text']}")
    if not out["upstream"]:
        click.echo("  no upstream datasets recorded")
    for t in out["taints"]:
        click.echo(f"  TAINT {t['kind']} from {t['source']}: {t.get('detail') or ''}")


@lineage.command("check")
@click.argument("model")
@click.option("--dataset", required=True, help="Dataset name.")
@click.option("--namespace", default=None, help="Dataset namespace, where the name alone is ambiguous.")
@click.option("--version", default=None)
@click.option("--json", "as_json", is_flag=True)
def lineage_check(model: str, dataset: str, namespace: str | None, version: str | None, as_json: bool) -> None:
    """Did MODEL ever ingest DATASET (or anything derived from it)? Exits 0 for no, 3 for yes."""
    from fleetscope.services import governance as gs

    try:
        out = gs.model_ingested(_store(), model, dataset, namespace=namespace, version=version)
    except gs.NotFound as exc:
        raise click.ClickException(str(exc)) from None
    if as_json:
        click.echo(json.dumps(out, default=str))
    elif out["answer"]:
        click.echo(f"YES: {out['model']} ingested {out['dataset']}\n  {out['text']}")
    else:
        click.echo(f"NO: {out['model']} did not ingest {out['dataset']}; searched {len(out['searched'])} upstream datasets: " + ", ".join(out["searched"]))
    for note in out["notes"]:
        click.echo(f"  note: {note}", err=True)
    sys.exit(3 if out["answer"] else 0)


@main.group()
def registry() -> None:
    """The dataset and model registry behind lineage and the audit rules."""


@registry.command("dataset")
@click.argument("namespace")
@click.argument("name")
@click.option("--license", "license_", default=None)
@click.option("--personal-data/--no-personal-data", default=False)
@click.option("--special-category/--no-special-category", default=False, help="GDPR Art. 9 special categories.")
@click.option("--legal-basis", type=click.Choice(["consent", "contract", "legal_obligation", "vital_interests", "public_task", "legitimate_interests"]), default=None)
@click.option("--art9-condition", default=None, help="art9_2_a .. art9_2_j")
@click.option("--consent-reference", default=None)
@click.option("--provenance", default=None)
@click.option("--quarantine", "quarantine_reason", default=None, help="Quarantine the dataset, with this reason.")
def registry_dataset(namespace: str, name: str, license_: str | None, personal_data: bool, special_category: bool, legal_basis: str | None,
                     art9_condition: str | None, consent_reference: str | None, provenance: str | None, quarantine_reason: str | None) -> None:
    """Record NAMESPACE/NAME's governance attributes."""
    from fleetscope.services import governance as gs
    from governance.registry import DatasetEntry

    try:
        entry = DatasetEntry(namespace, name, license_, personal_data, special_category, legal_basis, art9_condition, consent_reference,
                             provenance, quarantine_reason is not None, quarantine_reason)
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    gs.put_dataset(_store(), entry, actor=_os_user())
    click.echo(f"recorded {entry.node_id}" + "".join(f"\n  issue: {i}" for i in entry.issues()))


@registry.command("model")
@click.argument("name")
@click.argument("version")
@click.option("--purpose", default="", help="Intended purpose (AI Act Art. 3(12)).")
@click.option("--role", type=click.Choice(["provider", "deployer", "provider_and_deployer"]), default="provider", show_default=True)
@click.option("--run", "runs", multiple=True, help="OpenLineage run id that trained it; repeat for several.")
def registry_model(name: str, version: str, purpose: str, role: str, runs: tuple[str, ...]) -> None:
    """Register model NAME at VERSION."""
    from fleetscope.services import governance as gs
    from governance.registry import ModelEntry

    try:
        entry = ModelEntry(name, version, purpose, role, runs)
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    gs.put_model(_store(), entry, actor=_os_user())
    click.echo(f"registered {entry.node_id}")


@main.group("fairness")
def fairness_group() -> None:
    """Fairness evaluations of a model's predictions."""


@fairness_group.command("evaluate")
@click.argument("predictions", type=click.Path(exists=True, dir_okay=False))
@click.option("--model", required=True)
@click.option("--version", default=None)
@click.option("--sensitive", multiple=True, required=True, help="Sensitive feature column; repeat for several.")
@click.option("--y-true", default="y_true", show_default=True)
@click.option("--y-pred", default="y_pred", show_default=True)
@click.option("--y-score", default=None)
@click.option("--positive-label", default=None)
@click.option("--min-group-size", type=int, default=30, show_default=True)
@click.option("--json", "as_json", is_flag=True)
def fairness_evaluate(predictions: str, model: str, version: str | None, sensitive: tuple[str, ...], y_true: str, y_pred: str,
                      y_score: str | None, positive_label: str | None, min_group_size: int, as_json: bool) -> None:
    """Evaluate PREDICTIONS (CSV or Parquet) for MODEL and record per-group aggregates (never the rows).
    Exits 0 when the model's fairness policy passes, 4 when it fails."""
    from fleetscope.services import governance as gs
    from governance.fairness import FairnessInputError

    try:
        out = gs.evaluate_fairness(_store(), model, Path(predictions).read_bytes(), sensitive=list(sensitive), version=version,
                                   y_true=y_true, y_pred=y_pred, y_score=y_score, positive_label=positive_label, min_group_size=min_group_size,
                                   actor=_os_user())
    except (gs.NotFound, FairnessInputError) as exc:
        raise click.ClickException(str(exc)) from None
    if as_json:
        click.echo(json.dumps(out, default=str))
    else:
        click.echo(f"{model}@{out['version']}: fairness policy {'PASSED' if out['passed'] else 'FAILED'} (evaluation {out['evaluation_id'][:12]})")
        for c in out["outcome"]["checks"]:
            verdict = "not judged" if c["passed"] is None else "pass" if c["passed"] else "FAIL"
            value = "n/a" if c["value"] is None else f"{c['value']:.4f}"
            click.echo(f"  {c['feature']}: {c['metric']} = {value} {c['comparison']} {c['threshold']} -> {verdict}{' (uncertain)' if c['uncertain'] else ''}")
        for c in out["outcome"]["conflicts"]:
            click.echo(f"  note ({c['feature']}): {c['explanation']}")
    sys.exit(4 if out["passed"] is False else 0)


@main.command()
@click.option("--backend", type=click.Choice(["numpy", "torch", "cupy", "cuda"]), default="numpy", show_default=True,
              help="numpy runs on the CPU; torch and cupy on a CUDA device; cuda takes whichever of the two can.")
@click.option("--device-index", type=click.IntRange(min=0), default=0, show_default=True, help="CUDA device number.")
@click.option("--gpu-uuid", default=None, help="Record the result against this GPU.")
@click.option("--no-record", is_flag=True, help="Print only; do not write a health event.")
@click.option("--json", "as_json", is_flag=True)
def probe(backend: str, device_index: int, gpu_uuid: str | None, no_record: bool, as_json: bool) -> None:
    """Known-answer test for silent data corruption: a deterministic matrix multiply whose result must
    hash to the golden digest, the same for every device type. Exits 0 on pass, 5 on a mismatch (a
    confirmed SDC suspect), 1 when the backend cannot run here (the message names what is missing)."""
    from fleetscope.services.health import run_probe

    try:
        result = run_probe(None if no_record else _store(), backend, gpu_uuid=gpu_uuid, device_index=device_index)
    except RuntimeError as exc:
        raise click.ClickException(str(exc)) from None
    if as_json:
        click.echo(json.dumps(result.to_dict(), default=str))
    else:
        verdict = "PASS" if result.passed else "FAIL: result differs from the golden digest" if result.passed is False else "no golden digest"
        wrong = f", {result.mismatched_elements} of {result.n * result.n} elements wrong" if result.mismatched_elements else ""
        click.echo(f"{backend} on {result.device}: {verdict} ({result.n}x{result.n}, {result.rounds} rounds, {result.seconds:.2f} s{wrong})\n"
                   f"  digest {result.digest}\n  golden {result.golden or 'none for this probe shape'} (device type {result.device_type})")
    sys.exit(5 if result.passed is False else 0)


@main.command()
@click.option("--dcgm", "dcgm_urls", multiple=True, help="dcgm-exporter /metrics URL to poll; repeat for several.")
@click.option("--nvml", is_flag=True, help="Read the local GPUs through NVML (needs the NVIDIA driver).")
@click.option("--serving", "serving_urls", multiple=True,
              help="Inference server /metrics URL to poll (vLLM, SGLang, TGI, Triton, NIM; detected by content); repeat for several.")
@click.option("--interval", "interval_s", type=float, default=10.0, show_default=True, help="Seconds between polls.")
@click.option("--api", "api_url", envvar="FLEETSCOPE_API_URL", required=True, help="Fleetscope API base URL (or FLEETSCOPE_API_URL).")
@click.option("--token", envvar="FLEETSCOPE_TOKEN", required=True, help="Token with the ingest scope (or FLEETSCOPE_TOKEN).")
@click.option("--push", "push", type=click.Choice(["otlp", "batch"]), default="otlp", show_default=True,
              help="otlp: OpenTelemetry SDK metrics to /v1/metrics; batch: the exporter body to /api/v1/ingest/dcgm and NVML rows to /api/v1/batches.")
@click.option("--buffer-mb", "buffer_mb", type=click.FloatRange(min=0, min_open=True), envvar="FLEETSCOPE_AGENT_BUFFER_MB",
              default=64, show_default=True, help="Most MiB of undelivered readings kept while the API is unreachable; the oldest go first (or FLEETSCOPE_AGENT_BUFFER_MB).")
@click.option("--buffer-ticks", "buffer_ticks", type=click.IntRange(min=1), envvar="FLEETSCOPE_AGENT_BUFFER_TICKS",
              default=360, show_default=True, help="Most ticks of undelivered readings kept; the oldest go first (or FLEETSCOPE_AGENT_BUFFER_TICKS).")
@click.option("--spool", "spool", type=click.Path(file_okay=False), envvar="FLEETSCOPE_AGENT_SPOOL", default=None,
              help="Directory that also holds the undelivered readings, so an agent restart loses none; one agent per directory (or FLEETSCOPE_AGENT_SPOOL).")
@click.option("--infiniband/--no-infiniband", "infiniband", default=None,
              help="Read InfiniBand/RoCE port counters from sysfs each tick (default: on when the directory exists).")
@click.option("--infiniband-root", default="/sys/class/infiniband", show_default=True, help="The sysfs directory of the RDMA devices.")
@click.option("--once", is_flag=True, help="Poll once and exit (exit 1 if any source failed or its readings were not delivered).")
@click.option("--json", "as_json", is_flag=True, help="One JSON line per tick.")
def agent(dcgm_urls: tuple[str, ...], nvml: bool, serving_urls: tuple[str, ...], interval_s: float, api_url: str, token: str, push: str,
          buffer_mb: float, buffer_ticks: int, spool: str | None, infiniband: bool | None, infiniband_root: str, once: bool,
          as_json: bool) -> None:
    """Node-side collector: poll dcgm-exporter and/or NVML and push to the API (OTLP by default).
    Readings the API does not take (unreachable, 429, 5xx) are kept, bounded, and sent again later with
    the time they were measured."""
    from fleetscope.agent import Agent, AgentStopped

    if infiniband is None:
        infiniband = Path(infiniband_root).is_dir()
    if not dcgm_urls and not nvml and not infiniband and not serving_urls:
        raise click.UsageError("nothing to collect: give --dcgm URL, --serving URL and/or --nvml (or --infiniband on a host with RDMA devices)")
    if nvml:
        from fleetscope.devices import nvml as nvml_driver

        try:
            nvml_driver.read_devices()
        except nvml_driver.NvmlUnavailable as exc:
            raise click.ClickException(str(exc)) from None
    ag = Agent(api_url.rstrip("/"), token, list(dcgm_urls), nvml, push=push, buffer_bytes=max(1, int(buffer_mb * 2**20)),
               buffer_ticks=buffer_ticks, spool=spool, infiniband=infiniband_root if infiniband else None,
               serving_urls=list(serving_urls))
    failed = False

    def show(report) -> None:  # type: ignore[no-untyped-def]
        nonlocal failed
        failed = failed or bool(report.errors)
        if as_json:
            out = {"ts": report.ts.isoformat(), "pushed": report.pushed, "errors": report.errors}
            if push == "otlp":
                out |= {"points": report.points, "rejected_points": report.rejected_points}
            out |= {"replayed": report.replayed, "buffered": report.buffered, "buffered_bytes": report.buffered_bytes,
                    "dropped": report.dropped, "discarded": report.discarded}
            click.echo(json.dumps(out))
        else:
            rows = sum(n for w in report.pushed.values() for k, n in w.items() if k != "points")
            otlp = f" ({report.points} OTLP points, {report.rejected_points} rejected)" if push == "otlp" else ""
            backlog = "".join(f", {n} {what}" for n, what in ((report.replayed, "earlier readings resent"), (report.buffered, "readings waiting"),
                                                              (report.dropped, "oldest readings dropped (backlog full)"),
                                                              (report.discarded, "readings refused as bad data")) if n)
            click.echo(f"{report.ts:%H:%M:%S} pushed {rows} rows from {len(report.pushed)} source(s){otlp}{backlog}"
                       + "".join(f"; {k}: {v}" for k, v in report.errors.items()))

    try:
        ag.run(interval_s, ticks=1 if once else None, on_tick=show)
    except AgentStopped as exc:
        raise click.ClickException(str(exc)) from None
    except KeyboardInterrupt:
        pass
    finally:
        ag.close()
    if once and failed:
        sys.exit(1)


# --- AI Act: declarations, reports, exports, verification ------------------------------------------


@main.command()
@click.argument("model")
@click.argument("kind")
@click.option("--version", default="*", show_default=True, help='Model version, "*" for all.')
@click.option("--value", "value_json", default="{}", help="The declared fact as a JSON object.")
@click.option("--key", default="", help="Tells records of one kind apart (Annex IV point, incident id).")
@click.option("--by", "entered_by", required=True, help="Who is declaring this (kept with the record).")
@click.option("--retract", is_flag=True, help="Withdraw an earlier declaration of this kind and key.")
def declare(model: str, kind: str, version: str, value_json: str, key: str, entered_by: str, retract: bool) -> None:
    """Declare a fact about MODEL for the AI Act rules: KIND is purpose, area, oversight, documentation,
    incident, risk_management, notification, ... ("*" as MODEL for organisation-wide facts)."""
    from fleetscope.services import audit as au
    from governance.aiact.model import DeclarationError

    try:
        value = json.loads(value_json)
    except json.JSONDecodeError as exc:
        raise click.BadParameter(f"not JSON: {exc}", param_hint="--value") from None
    try:
        d = au.declare(_store(), model, version, kind, value, entered_by=entered_by, key=key, retracted=retract, source="cli")
    except DeclarationError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"declared {kind} for {model}@{version} ({d.declaration_id[:12]})")


@main.command()
@click.option("--model", default=None, help="Audit one model (default: the whole registry).")
@click.option("--version", default=None)
@click.option("--json", "as_json", is_flag=True)
def report(model: str | None, version: str | None, as_json: bool) -> None:
    """Evaluate the EU AI Act rules and file the audit report (JSON, HTML, PDF) under the data directory.
    Exits 0 when no rule failed, 6 when one did."""
    from fleetscope.services import audit as au
    from fleetscope.services import governance as gs

    s = _settings()
    try:
        out = au.run_audit(_store(), s, model=model, version=version, trigger="cli", requested_by=_os_user())
    except (au.AuditError, gs.NotFound) as exc:
        raise click.ClickException(str(exc)) from None
    if as_json:
        click.echo(json.dumps(out))
    else:
        click.echo(f"audit {out['audit_id']} of {out['scope']} ({out['models']} model(s)): " + ", ".join(f"{k} {v}" for k, v in sorted(out["counts"].items())))
        for path in out["reports"]:
            click.echo(f"  {s.data_dir / path}")
    sys.exit(6 if out["counts"].get("fail") else 0)


@main.command()
@click.option("--audit", "audit_id", default=None, help="Audit to export (default: the latest).")
@click.option("--out", "out_path", type=click.Path(dir_okay=False), default=None, help="Also copy the bundle here.")
@click.option("--json", "as_json", is_flag=True)
def export(audit_id: str | None, out_path: str | None, as_json: bool) -> None:
    """Make a signed compliance export bundle (zip: reports, evidence, SHA-256 manifest, Ed25519 signature)."""
    from fleetscope.services import audit as au
    from fleetscope import safefiles

    try:
        out = au.make_export(_store(), _settings(), audit_id=audit_id, requested_by=_os_user())
    except au.AuditError as exc:
        raise click.ClickException(str(exc)) from None
    if out_path:
        safefiles.write_private(out_path, Path(out["path"]).read_bytes())
        out["path"] = out_path
    _emit(as_json, out, f"bundle {out['path']}\n  signed by key {out['key_fingerprint']} (public key: {out['public_key']})")


@main.command()
@click.argument("bundle", required=False, type=click.Path(exists=True, dir_okay=False))
@click.option("--key", "key_path", type=click.Path(exists=True, dir_okay=False), help="The bundle signer's public key (PEM).")
@click.option("--auditlog", "audit_log", is_flag=True, help="Check this service's audit log instead of a bundle.")
@click.option("--json", "as_json", is_flag=True)
def verify(bundle: str | None, key_path: str | None, audit_log: bool, as_json: bool) -> None:
    """Check what an auditor is handed: an export BUNDLE offline (its signature, and every file against the
    manifest; exit 0 intact, 7 when anything was altered, added or removed or the signature fails), or with
    --auditlog this service's keyed audit log against its signed checkpoints (exit 0 when it holds, 8
    naming the first bad entry).

    \b
    Examples:
      fleetscope verify export-2026-12-03.zip --key signing_key.pub.pem
      fleetscope verify --auditlog --json
    """
    if audit_log == (bundle is not None):
        raise click.UsageError("give a BUNDLE (with --key) or --auditlog, not both or neither")
    if audit_log:
        _verify_audit_log(as_json)
    if key_path is None:
        raise click.UsageError("a BUNDLE is checked against its signer's public key: add --key FILE")
    from governance import exports

    try:
        key = exports.load_public_key(Path(key_path).read_bytes())
    except Exception as exc:  # noqa: BLE001 - a bad key file is the user's input error
        raise click.ClickException(f"{key_path}: not an Ed25519 public key in PEM form ({exc})") from None
    result = exports.verify(Path(bundle).read_bytes(), key)  # type: ignore[arg-type]
    if as_json:
        click.echo(json.dumps({"ok": result.ok, "signature_valid": result.signature_valid, "altered": list(result.altered),
                               "added": list(result.added), "removed": list(result.removed), "errors": list(result.errors)}))
    else:
        click.echo(result.summary())
    sys.exit(0 if result.ok else 7)


def _verify_audit_log(as_json: bool) -> None:
    from fleetscope.services import audit as au

    try:
        out = au.verify_log(_store())
    except au.AuditError as exc:
        raise click.ClickException(str(exc)) from None
    if as_json:
        click.echo(json.dumps(out))
    elif out["ok"]:
        click.echo(f"audit log intact: {out['entries']} entries, head {out['head'][:16]} (seq {out['head_seq']}), "
                   f"{out['checkpoints']} signed checkpoints" + (f", keyed from seq {out['keyed_from']}" if out["keyed_from"] else ""))
    else:
        brk = out["first_break"]
        click.echo(f"audit log BROKEN at seq {brk['seq']}: {brk['why']}" if brk["seq"] is not None else f"audit log BROKEN: {brk['why']}")
    sys.exit(0 if out["ok"] else 8)


@main.group("auditlog")
def auditlog_group() -> None:
    """The keyed, checkpointed log of governance writes (`fleetscope verify --auditlog` checks it)."""


@auditlog_group.command("anchor")
def auditlog_anchor() -> None:
    """Key and checkpoint a log written before keying now (otherwise the next governance write does)."""
    from fleetscope.services import audit as au

    try:
        out = au.anchor(_store(), actor=_os_user())
    except au.AuditError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"anchored: keyed from seq {out['keyed_from']}, head {out['head'][:16]}" if out["anchored"] else f"nothing to do: {out['why']}")


# --- energy and carbon -----------------------------------------------------------------------------


def _when(text: str, option: str) -> dt.datetime:
    t = _utc_option(text, option)
    assert t is not None
    return t


@main.group()
def energy() -> None:
    """Energy and carbon: contractual instruments for market-based Scope 2, a site's carbon, serving vs training."""


@energy.command("instrument")
@click.argument("instrument_id")
@click.option("--site", "site_id", required=True, help="Site that holds it.")
@click.option("--kind", required=True, help="ppa, virtual_ppa, rec, go, i_rec, green_tariff or supplier_specific.")
@click.option("--start", "start_text", required=True, help="Start of the consumption period it applies to (RFC 3339).")
@click.option("--end", "end_text", required=True, help="End of that period, exclusive (RFC 3339).")
@click.option("--mwh", "volume_mwh", type=float, required=True, help="Electricity it conveys over the period, MWh.")
@click.option("--g-per-kwh", "g_per_kwh", type=float, required=True, help="Its emission factor, gCO2e/kWh (0 for renewables).")
@click.option("--supplier", default=None, help="Supplier, generator or issuing registry.")
@click.option("--by", "recorded_by", required=True, help="Who records it (kept with the record and in the audit log).")
def energy_instrument(instrument_id: str, site_id: str, kind: str, start_text: str, end_text: str, volume_mwh: float, g_per_kwh: float,
                      supplier: str | None, recorded_by: str) -> None:
    """Record (or update) contractual instrument INSTRUMENT_ID: a PPA, certificate or supplier rate a site holds."""
    from fleetscope.services import energy as es
    from fleetscope.core.errors import ValidationError

    rec = {"instrument_id": instrument_id, "site_id": site_id, "kind": kind, "start": _when(start_text, "--start"),
           "end": _when(end_text, "--end"), "volume_mwh": volume_mwh, "g_per_kwh": g_per_kwh, "supplier": supplier}
    try:
        out = es.record_instrument(_store(), rec, recorded_by=recorded_by)
    except (ValidationError, es.NotFound, es.Conflict) as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"{'updated' if out['updated'] else 'recorded'} {kind} {instrument_id} for {site_id}: {volume_mwh:g} MWh at {g_per_kwh:g} g/kWh")


@energy.command("instruments")
@click.option("--site", "site_id", default=None, help="Only this site's.")
@click.option("--json", "as_json", is_flag=True)
def energy_instruments(site_id: str | None, as_json: bool) -> None:
    """Contractual instruments recorded, by start of period."""
    from fleetscope.services import energy as es

    rows = es.instruments(_store(), [site_id] if site_id else None).to_dicts()
    lines = [f"{r['site_id']:<12} {r['instrument_id']:<24} {r['kind']:<18} {r['start']:%Y-%m-%d} .. {r['end']:%Y-%m-%d}  "
             f"{r['volume_mwh']:g} MWh at {r['g_per_kwh']:g} g/kWh" for r in rows]
    _emit(as_json, rows, "\n".join(lines) or "no instruments recorded")


@energy.command("withdraw")
@click.argument("site_id")
@click.argument("instrument_id")
@click.option("--by", "actor", required=True, help="Who withdraws it (kept in the audit log).")
def energy_withdraw(site_id: str, instrument_id: str, actor: str) -> None:
    """Withdraw instrument INSTRUMENT_ID of SITE_ID, recorded in error."""
    from fleetscope.services import energy as es

    try:
        es.withdraw_instrument(_store(), site_id, instrument_id, actor=actor)
    except es.NotFound as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"withdrew {instrument_id} from {site_id}")


@energy.command("carbon")
@click.argument("site_id")
@click.option("--start", "start_text", required=True, help="RFC 3339.")
@click.option("--end", "end_text", required=True, help="RFC 3339, exclusive.")
@click.option("--json", "as_json", is_flag=True)
def energy_carbon(site_id: str, start_text: str, end_text: str, as_json: bool) -> None:
    """SITE_ID's Scope 2 over a period: location- and market-based kgCO2e side by side, with their basis."""
    from fleetscope.services import energy as es

    start, end = _when(start_text, "--start"), _when(end_text, "--end")
    if end <= start:
        raise click.BadParameter("must be after --start", param_hint="--end")
    try:
        out = es.site_carbon(_store(), site_id, start, end)
    except es.NotFound as exc:
        raise click.ClickException(str(exc)) from None
    text = (f"{site_id} {start:%Y-%m-%d %H:%M} .. {end:%Y-%m-%d %H:%M} UTC: {out['energy_kwh']:.3f} kWh ({out['energy_basis']})\n"
            f"  location-based {out['location_based_kgco2e']:.3f} kgCO2e\n  market-based   {out['market_based_kgco2e']:.3f} kgCO2e "
            f"({out['covered_energy_j'] / 3.6e6:.3f} kWh covered by {len(out['instruments'])} instrument(s); rest at {out['uncovered_basis']})")
    _emit(as_json, out, text)


@energy.command("job")
@click.argument("job_id")
@click.option("--start", "start_text", help="RFC 3339: keep the part of the run from here.")
@click.option("--end", "end_text", help="RFC 3339, exclusive.")
@click.option("--json", "as_json", is_flag=True)
def energy_job(job_id: str, start_text: str | None, end_text: str | None, as_json: bool) -> None:
    """JOB_ID's energy and emissions (location- and market-based), per step and per million tokens."""
    from fleetscope.services import energy as es

    start = _when(start_text, "--start") if start_text else None
    end = _when(end_text, "--end") if end_text else None
    if start and end and end <= start:
        raise click.BadParameter("must be after --start", param_hint="--end")
    try:
        out = es.job_report(_store(), job_id, start, end)
    except es.NotFound as exc:
        raise click.ClickException(str(exc)) from None
    num = lambda v, f: "-" if v is None else format(v, f)  # noqa: E731
    text = (f"{job_id} {out['start']} .. {out['end']}: GPU {out['gpu_energy_kwh']:.3f} kWh, facility "
            f"{num(out['facility_energy_j'] and out['facility_energy_j'] / 3.6e6, '.3f')} kWh{' (estimate)' if out['estimate'] else ''}\n"
            f"  location-based {num(out['location_based_kgco2e'], '.3f')} kgCO2e, market-based {num(out['market_based_kgco2e'], '.3f')} kgCO2e\n"
            f"  {num(out['energy_per_step_j'], '.1f')} J/step, {num(out['energy_per_mtok_j'], '.1f')} J per million tokens, "
            f"{num(out['flops_per_j'], '.3g')} useful FLOP/J")
    hint = out["carbon_shift_hint"]
    text += (f"\n  shifted to {hint['site_id']}'s cleanest hours within a day: {hint['saving_kgco2e']:.3f} kgCO2e less ({hint['saving_ratio']:.0%})"
             if hint.get("feasible") else f"\n  no carbon-shift hint: {hint['basis']}")
    _emit(as_json, out, text)


@energy.command("serving")
@click.argument("model")
@click.option("--projection-days", type=click.IntRange(1, 3650), default=28, show_default=True, help="Serving days the projection averages.")
@click.option("--json", "as_json", is_flag=True)
def energy_serving(model: str, projection_days: int, as_json: bool) -> None:
    """MODEL's training energy against its cumulative serving energy, and when serving passes training."""
    from fleetscope.services import energy as es

    try:
        out = es.serving_vs_training(_store(), model, projection_days=projection_days)
    except es.NotFound as exc:
        raise click.ClickException(str(exc)) from None
    kwh = lambda j: "unknown" if j is None else f"{j / 3.6e6:.3f} kWh"  # noqa: E731
    text = (f"{model}: training {kwh(out['training_energy_j'])}, serving {kwh(out['serving_energy_j'])} over {out['serving_days']} day(s)\n"
            f"  crossover {out['crossover_date'] or '-'} ({out['crossover_basis']}: {out['crossover_explanation']})")
    _emit(as_json, out, text)


# --- alerting --------------------------------------------------------------------------------------


@main.group()
def alerts() -> None:
    """Alerts and silences."""


@alerts.command("list")
@click.option("--json", "as_json", is_flag=True)
def alerts_list(as_json: bool) -> None:
    """Pending and firing alerts, with what mutes each."""
    from fleetscope.services.alerting import state as ST

    rows = ST.list_alerts(_engine(_settings()))
    lines = [f"{a.get('state', '?'):<8} {a.get('labels', {}).get('alertname', '?'):<28} {a.get('labels', {}).get('subject') or a.get('labels', {}).get('gpu_uuid') or ''}" for a in rows]
    _emit(as_json, rows, "\n".join(lines) or "no alerts")


@alerts.command("silence")
@click.argument("matchers", nargs=-1, required=True)
@click.option("--for", "duration", default="2h", show_default=True, help="How long: 30m, 2h, 1d.")
@click.option("--by", "created_by", required=True, help="Who silences (kept with the silence).")
@click.option("--comment", required=True, help="Why.")
def alerts_silence(matchers: tuple[str, ...], duration: str, created_by: str, comment: str) -> None:
    """Silence alerts matching MATCHERS (Alertmanager syntax: alertname=Straggler host=~"site-a-.*").
    Audit-logged as the OS user, with the --by name in the entry."""
    from fleetscope.services.alerting import service as AS

    ends = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=_span_s(duration, "--for"))
    try:
        sil = AS.create_silence(_store(), list(matchers), None, ends, created_by=created_by, comment=comment, actor=_os_user())
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"silence {sil.id} until {ends:%Y-%m-%d %H:%M} UTC")


@alerts.command("expire")
@click.argument("silence_id")
def alerts_expire(silence_id: str) -> None:
    """End a silence now (audit-logged with the OS user's name)."""
    from fleetscope.services.alerting import service as AS

    if not AS.expire_silence(_store(), silence_id, actor=_os_user()):
        raise click.ClickException(f"no active silence {silence_id!r}")
    click.echo(f"expired {silence_id}")


@alerts.command("silences")
@click.option("--json", "as_json", is_flag=True)
def alerts_silences(as_json: bool) -> None:
    """Silences, active and expired."""
    from fleetscope.services.alerting import state as ST

    rows = [ST.silence_dict(x) for x in ST.list_silences(_engine(_settings()))]
    lines = [f"{r['id']}  {r['status']['state']:<8} until {r['endsAt']}  {' '.join(m['name'] + ('=' if m['isEqual'] else '!=') + ('~' if m['isRegex'] else '') + m['value'] for m in r['matchers'])}  ({r['createdBy']}: {r['comment']})" for r in rows]
    _emit(as_json, rows, "\n".join(lines) or "no silences")


@main.command("formats")
@click.option("--json", "as_json", is_flag=True)
def formats_cmd(as_json: bool) -> None:
    """List the input formats `fleetscope ingest` understands."""
    from fleetscope.door.ingestion import FORMATS

    rows = [{"name": f.name, "description": f.description} for f in FORMATS.values()]
    _emit(as_json, rows, "\n".join(f"{r['name']:<22} {r['description']}" for r in rows))


_SPANS = {"m": 60, "h": 3600, "d": 86400}


def _span_s(text: str, option: str) -> int:
    """``30m``, ``2h``, ``7d`` as seconds."""
    if not text or text[-1] not in _SPANS or not text[:-1].isdigit() or int(text[:-1]) == 0:
        raise click.BadParameter("use a number and m, h or d, e.g. 30m", param_hint=option)
    return int(text[:-1]) * _SPANS[text[-1]]


@main.command("findings")
@click.option("--since", default="1h", show_default=True, help="How far back: 30m, 6h, 7d (findings whose window reaches into it).")
@click.option("--analyzer", default=None, help="Only this analyzer's (health, absence, hangs, fabric, stragglers, sdc, aiact, ...).")
@click.option("--kind", default=None, help="Only this kind; % matches any run of characters (e.g. 'straggler_%').")
@click.option("--limit", type=click.IntRange(1, 100_000), default=200, show_default=True)
@click.option("--json", "as_json", is_flag=True)
def findings_cmd(since: str, analyzer: str | None, kind: str | None, limit: int, as_json: bool) -> None:
    """What the analyzers concluded, newest first, most severe first within a window.

    \b
    Examples:
      fleetscope findings --analyzer absence          # GPUs, hosts and sites that went quiet
      fleetscope findings --kind job_hang --since 1d
      fleetscope findings --kind 'ib_%' --json
    """
    from fleetscope.services import health as health_svc

    end = dt.datetime.now(dt.UTC)
    rows = health_svc.findings(_store(), end - dt.timedelta(seconds=_span_s(since, "--since")), end, kind_like=kind, analyzer=analyzer, limit=limit)
    data = [{**r, "window_start": r["window_start"].isoformat(), "window_end": r["window_end"].isoformat() if r["window_end"] else None}
            for r in rows.drop("evidence").to_dicts()]
    _emit(as_json, data, "\n".join(f"{r['severity']:<8} {r['kind']:<24} {r['subject']:<40} {r['summary'] or ''}" for r in data) or "no findings")


@main.command("analyzers")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def analyzers_cmd(as_json: bool) -> None:
    """The analyses the service runs, per job and per fleet window, in the order they run: the pure modules
    each calls and the frames it reads and writes.

    \b
    Examples:
      fleetscope analyzers
      fleetscope analyzers --json | jq '.[] | select(.writes | index("finding")) | .name'
    """
    from fleetscope.services import catalog  # imports every analyzer: only for this verb

    rows = catalog.analyses()
    _emit(as_json, rows, "\n".join(f"{r['cadence']:<7} {r['name']:<19} {' '.join(r['modules']):<58} {r['summary']}" for r in rows))


@main.command("metrics")
@click.option("--out", "out_path", type=click.Path(dir_okay=False, writable=True), default=None,
              help="Write to this file (atomically, for node_exporter's textfile collector) instead of stdout.")
def metrics_cmd(out_path: str | None) -> None:
    """Print the derived fleet series (goodput, C3 shares, stragglers, hangs, GPU health and absence, site PUE
    and power) in the Prometheus text format: what GET /api/v1/fleet/metrics serves.

    \b
    Examples:
      fleetscope metrics | grep fleetscope_job_goodput_ratio
      fleetscope metrics --out /var/lib/node_exporter/textfile/fleetscope.prom
    """
    from fleetscope.services.fleet_metrics import exposition

    text = exposition(_store())
    if out_path is None:
        click.echo(text.decode(), nl=False)
        return
    tmp = Path(out_path).with_name(Path(out_path).name + ".tmp")
    tmp.write_bytes(text)
    tmp.replace(out_path)  # a scrape never reads half a file


# --- demo --------------------------------------------------------------------------------------


@main.command()
@click.option("--size", type=click.Choice(["demo", "small"]), default="demo", show_default=True,
              help="demo: 2 sites, 64 nodes of 8 GPUs, 4 jobs, 2 simulated hours; small: 64 GPUs, 2 jobs, 10 minutes.")
@click.option("--seed", type=int, default=7, show_default=True, help="Simulator seed (same seed, same fleet and faults).")
@click.option("--exit-after", type=float, default=None, help="Stop after this many seconds (for scripts and tests).")
@click.option("--port", type=int, default=None, help="API port (default FLEETSCOPE_API_PORT, or a free one).")
@click.option("--dashboard-port", type=int, default=None, help="Dashboard port (default 8501, or a free one).")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
def demo(size: str, seed: int, exit_after: float | None, port: int | None, dashboard_port: int | None, as_json: bool) -> None:
    """Run the whole product on embedded defaults with a simulated fleet.

    Simulates a fleet with injected faults, starts the API, a Celery worker, beat, the dashboard and a
    local webhook sink, ingests everything through the API, runs every analyzer, delivers the alerts,
    evaluates the EU AI Act rules, files a report and a signed export, checks each injected fault was
    found, prints the URLs and an API token, and keeps running until Ctrl-C.
    """
    from fleetscope.demo import run_demo

    run_demo(_settings(), size=size, exit_after=exit_after, port=port, dashboard_port=dashboard_port, as_json=as_json, seed=seed)



from fleetscope.cli.topology import topology  # noqa: E402

main.add_command(topology)

from fleetscope.cli.monitoring import monitoring  # noqa: E402

main.add_command(monitoring)

from fleetscope.cli.serving import serving  # noqa: E402

main.add_command(serving)

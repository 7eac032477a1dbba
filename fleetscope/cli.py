"""The ``fleetscope`` command: few verbs, each with --help; --json where scripts read the output."""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import click

from fleetscope import __version__
from fleetscope import settings as settings_mod


def _settings() -> settings_mod.Settings:
    try:
        return settings_mod.load()
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None


def _engine(settings: settings_mod.Settings, *, migrate: bool = True):  # type: ignore[no-untyped-def]
    from fleetscope import db

    engine = db.make_engine(settings.database_url)
    if migrate:
        try:
            db.ensure_schema(settings, engine)
        except RuntimeError as exc:
            raise click.ClickException(str(exc)) from None
    return engine


def _emit(as_json: bool, data: Any, text: str) -> None:
    click.echo(json.dumps(data, default=str, indent=2) if as_json else text)


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
    from fleetscope import db

    s = _settings()
    db.upgrade(s.database_url, revision)
    click.echo(f"database at {db.current_revision(db.make_engine(s.database_url))}")


@db_group.command("downgrade")
@click.option("--revision", required=True, help="Target revision ('base' drops everything).")
@click.confirmation_option(prompt="Downgrading can drop tables and their data. Continue?")
def db_downgrade(revision: str) -> None:
    """Migrate the database down to REVISION."""
    from fleetscope import db

    s = _settings()
    db.downgrade(s.database_url, revision)
    click.echo(f"database at {db.current_revision(db.make_engine(s.database_url)) or 'base'}")


@db_group.command("current")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def db_current(as_json: bool) -> None:
    """Show the database's schema revision and the code's."""
    from fleetscope import db

    s = _settings()
    engine = db.make_engine(s.database_url)
    cur, head = db.current_revision(engine), db.head_revision(s.database_url)
    url = engine.url.render_as_string(hide_password=True)
    _emit(as_json, {"url": url, "current": cur, "head": head}, f"{url}: at {cur or 'base'}, code expects {head}")


# --- tokens --------------------------------------------------------------------------------------


@main.group("token")
def token_group() -> None:
    """API tokens (bearer secrets with scopes ingest, read, governance, admin)."""


@token_group.command("create")
@click.option("--scope", "scopes", multiple=True, required=True, type=click.Choice(["ingest", "read", "governance", "admin"]), help="Repeat for several.")
@click.option("--name", default="cli", show_default=True, help="What the token is for.")
@click.option("--expires-days", type=int, default=None, help="Expire after this many days.")
@click.option("--json", "as_json", is_flag=True)
def token_create(scopes: tuple[str, ...], name: str, expires_days: int | None, as_json: bool) -> None:
    """Create a token and print its secret. It is shown only this once."""
    from fleetscope import auth

    s = _settings()
    expires = dt.datetime.now(dt.UTC) + dt.timedelta(days=expires_days) if expires_days else None
    secret = auth.create_token(_engine(s), name, list(scopes), expires_at=expires)
    _emit(as_json, {"token": secret, "name": name, "scopes": sorted(scopes), "expires_at": expires}, secret)


@token_group.command("list")
@click.option("--json", "as_json", is_flag=True)
def token_list(as_json: bool) -> None:
    """List tokens (never their secrets)."""
    from fleetscope import auth

    rows = auth.list_tokens(_engine(_settings()))
    lines = [f"{r['token_id']:>4}  {r['name']:<20} {r['scopes']:<30} {'revoked' if r['revoked_at'] else 'active'}" for r in rows]
    _emit(as_json, rows, "\n".join(lines) or "no tokens")


@token_group.command("revoke")
@click.argument("token_id", type=int)
def token_revoke(token_id: int) -> None:
    """Revoke the token with TOKEN_ID (see `token list`)."""
    from fleetscope import auth

    if not auth.revoke_token(_engine(_settings()), token_id):
        raise click.ClickException(f"no active token with id {token_id}")
    click.echo(f"revoked token {token_id}")


# --- processes ---------------------------------------------------------------------------------


@main.command()
@click.option("--host", default=None, help="Bind address (default FLEETSCOPE_API_HOST).")
@click.option("--port", type=int, default=None, help="Port (default FLEETSCOPE_API_PORT).")
@click.option("--workers", type=int, default=1, show_default=True, help="Uvicorn worker processes.")
def serve(host: str | None, port: int | None, workers: int) -> None:
    """Run the HTTP API (FastAPI under uvicorn)."""
    import uvicorn

    s = _settings()
    _engine(s)  # migrate once here, not in every worker process
    uvicorn.run("fleetscope.api:create_app", factory=True, host=host or s.api_host, port=port or s.api_port, workers=workers, log_level=s.log_level.lower())


@main.command(context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
@click.option("--concurrency", type=int, default=2, show_default=True)
@click.option("--pool", default="prefork", show_default=True, type=click.Choice(["prefork", "solo", "threads"]))
@click.pass_context
def worker(ctx: click.Context, concurrency: int, pool: str) -> None:
    """Run a Celery worker (extra arguments go to `celery worker`)."""
    from fleetscope.worker import celery_app

    _engine(_settings())
    celery_app.worker_main(["worker", f"--concurrency={concurrency}", f"--pool={pool}", "--loglevel=INFO", *ctx.args])


@main.command("dashboard", context_settings={"ignore_unknown_options": True})
@click.option("--host", envvar="FLEETSCOPE_DASHBOARD_HOST", default="127.0.0.1", show_default=True, help="Bind address (or FLEETSCOPE_DASHBOARD_HOST).")
@click.option("--port", envvar="FLEETSCOPE_DASHBOARD_PORT", type=int, default=8501, show_default=True, help="Port (or FLEETSCOPE_DASHBOARD_PORT).")
@click.argument("streamlit_args", nargs=-1, type=click.UNPROCESSED)
def dashboard_cmd(host: str, port: int, streamlit_args: tuple[str, ...]) -> None:
    """Run the Streamlit dashboard (extra arguments go to `streamlit run`)."""
    import importlib.util

    s = _settings()
    _engine(s)  # migrate the embedded database on first start, as `serve` does; the dashboard only reads
    spec = importlib.util.find_spec("dashboard")
    if spec is None or spec.origin is None:
        raise click.ClickException("the dashboard package is not installed")
    app = Path(spec.origin).resolve().parent / "app.py"
    # The dashboard reads its settings from the environment, like every other process.
    env = {**os.environ, "FLEETSCOPE_DATA_DIR": str(s.data_dir), "FLEETSCOPE_DATABASE_URL": s.database_url}
    cmd = [sys.executable, "-m", "streamlit", "run", str(app), "--server.headless", "true", "--server.port", str(port),
           "--server.address", host, "--browser.gatherUsageStats", "false", "--server.fileWatcherType", "none",
           "--client.toolbarMode", "viewer", *streamlit_args]
    if os.name == "posix":
        os.execve(sys.executable, cmd, env)  # streamlit takes this pid, so signals and supervisors reach it directly
    sys.exit(subprocess.call(cmd, env=env))


@main.command(context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
@click.pass_context
def beat(ctx: click.Context) -> None:
    """Run Celery beat, which schedules the analyzers, alerts, rollups, retention and audit reports."""
    from fleetscope.worker import celery_app

    celery_app.start(["beat", "--loglevel=INFO", *ctx.args])


# --- ingest ------------------------------------------------------------------------------------


def _iter_paths(paths: tuple[str, ...]) -> list[Path]:
    out: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            out.extend(sorted(q for q in p.rglob("*") if q.is_file()))
        elif p.exists():
            out.append(p)
        else:
            raise click.ClickException(f"{p}: no such file or directory")
    return out


@main.command()
@click.argument("paths", nargs=-1, required=True)
@click.option("--format", "fmt", default="auto", show_default=True, help="Force a format instead of detecting it (see `fleetscope formats`).")
@click.option("--job-id", default=None, help="Job id for formats that do not carry one (NCCL logs, Kineto traces).")
@click.option("--ts", "ts_text", default=None, help="Timestamp (RFC 3339) for formats without one; default: the file's modification time.")
@click.option("--api", "api_url", default=None, help="Send to a running API instead of writing the local database.")
@click.option("--token", envvar="FLEETSCOPE_TOKEN", default=None, help="API token with the ingest scope (or FLEETSCOPE_TOKEN).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object per input and a summary.")
def ingest(paths: tuple[str, ...], fmt: str, job_id: str | None, ts_text: str | None, api_url: str | None, token: str | None, as_json: bool) -> None:
    """Ingest telemetry files (or directories of them). The format is detected from content.

    Each file is written in one transaction: a file that fails to parse is reported and writes
    nothing, and the others still go in. Exits 1 if any file was rejected.
    """
    from tqdm import tqdm

    from fleetscope import ingestion
    from fleetscope.store import Store

    files = _iter_paths(paths)
    ts = dt.datetime.fromisoformat(ts_text.replace("Z", "+00:00")) if ts_text else None
    if ts is not None and ts.tzinfo is None:
        raise click.ClickException("--ts needs a time zone, e.g. 2026-03-01T12:00:00Z")
    store = None if api_url else Store(_engine(_settings()))
    totals: dict[str, int] = {}
    rejected = 0
    outcomes = []
    bar = tqdm(files, unit="file", disable=as_json or len(files) < 2, file=sys.stderr)
    # Lines go through the bar while it is drawn, so they do not tear it.
    say = click.echo if bar.disable else (lambda text, err=False: bar.write(text, file=sys.stderr if err else sys.stdout))
    for path in bar:
        bar.set_postfix_str(path.name[:40])
        data = path.read_bytes()
        file_ts = ts or dt.datetime.fromtimestamp(path.stat().st_mtime, dt.UTC)
        try:
            if api_url:
                out = _ingest_via_api(api_url, token, data, str(path), fmt, job_id, file_ts)
            else:
                out = ingestion.ingest_bytes(store, data, source=str(path), fmt=fmt, opts=ingestion.Options(job_id=job_id, ts=file_ts)).to_dict()
        except Exception as exc:  # noqa: BLE001 - one bad file must not stop the rest; it is reported
            from fleetscope.errors import FleetscopeError

            if not isinstance(exc, (FleetscopeError, ValueError, click.ClickException)):
                raise
            out = {"source": str(path), "error": str(exc), "written": {}}
        outcomes.append(out)
        if out.get("error"):
            rejected += 1
        for k, v in out.get("written", {}).items():
            totals[k] = totals.get(k, 0) + v
        if as_json:
            click.echo(json.dumps(out, default=str))
        elif out.get("error"):
            err = str(out["error"])
            say(f"rejected  {err if err.startswith(str(path)) else f'{path}: {err}'}", err=True)
        else:
            dup = " (already ingested)" if out.get("skipped_duplicate") else ""
            say(f"ingested  {path} [{', '.join(out.get('formats', []))}]: " + (", ".join(f"{k} {v}" for k, v in out["written"].items()) or "nothing new") + dup)
    summary = {"files": len(files), "rejected": rejected, "written": totals}
    if as_json:
        click.echo(json.dumps({"summary": summary}))
    else:
        click.echo(f"{len(files) - rejected} of {len(files)} files ingested; rows written: " + (", ".join(f"{k} {v}" for k, v in totals.items()) or "none"))
    if rejected:
        sys.exit(1)


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


@main.command("formats")
@click.option("--json", "as_json", is_flag=True)
def formats_cmd(as_json: bool) -> None:
    """List the input formats `fleetscope ingest` understands."""
    from fleetscope.ingestion import FORMATS

    rows = [{"name": f.name, "description": f.description} for f in FORMATS.values()]
    _emit(as_json, rows, "\n".join(f"{r['name']:<22} {r['description']}" for r in rows))


# --- demo --------------------------------------------------------------------------------------


@main.command()
@click.option("--minutes", type=int, default=30, show_default=True, help="Simulated telemetry to generate.")
@click.option("--exit-after", type=float, default=None, help="Stop after this many seconds (for scripts and tests).")
@click.option("--port", type=int, default=None, help="API port (default FLEETSCOPE_API_PORT).")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
def demo(minutes: int, exit_after: float | None, port: int | None, as_json: bool) -> None:
    """Run the whole service on embedded defaults with a simulated fleet.

    Creates the database, starts the API, a Celery worker and beat, pushes simulated telemetry through
    the API, checks the worker answers, prints the URLs and an API token, and keeps running until Ctrl-C.
    """
    from fleetscope.demo import run_demo

    run_demo(_settings(), minutes=minutes, exit_after=exit_after, port=port, as_json=as_json)


if __name__ == "__main__":
    main()

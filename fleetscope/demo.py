"""`fleetscope demo`: the whole service on embedded defaults, fed by the simulator, through the real API."""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import socket
import subprocess
import sys
import time
from typing import Any

import click
import httpx

from fleetscope import auth, db, frames as F
from fleetscope.settings import Settings
from fleetscope.sim import FleetSpec, gpu_fleet


def _free_port(host: str, preferred: int) -> int:
    for port in (preferred, 0):
        with socket.socket() as s:
            try:
                s.bind((host, port))
                return s.getsockname()[1]
            except OSError:
                continue
    raise click.ClickException("no free TCP port")


def _wait_healthy(url: str, procs: list[subprocess.Popen], timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for p in procs:
            if p.poll() is not None:
                raise click.ClickException(f"{' '.join(p.args[-2:])} exited with {p.returncode} during start-up")
        try:
            if httpx.get(url + "/healthz", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise click.ClickException(f"API at {url} not healthy after {timeout_s:.0f} s")


def batch_to_json(batch: F.Batch) -> dict[str, Any]:
    """The JSON body of POST /api/v1/batches for ``batch``."""
    return {"source": batch.source, "frames": {spec.name: json.loads(df.write_json()) for spec, df in batch.frames()}}


def _stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 15
    for p in procs:
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def run_demo(settings: Settings, *, minutes: int, exit_after: float | None, port: int | None, as_json: bool) -> None:
    started = time.monotonic()
    say = (lambda *_: None) if as_json else click.echo
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    engine = db.make_engine(settings.database_url)
    db.upgrade(settings.database_url)
    say(f"database   {engine.url.render_as_string(hide_password=True)} (schema {db.current_revision(engine)})")
    admin = auth.create_token(engine, "demo-admin", ["admin"])

    port = _free_port(settings.api_host, port or settings.api_port)
    url = f"http://{settings.api_host}:{port}"
    env = {**os.environ, "FLEETSCOPE_DATA_DIR": str(settings.data_dir), "FLEETSCOPE_DATABASE_URL": settings.database_url,
           "FLEETSCOPE_BROKER_URL": settings.broker_url, "FLEETSCOPE_RESULT_BACKEND": settings.result_backend,
           "FLEETSCOPE_API_URL": url}
    logs = settings.data_dir / "logs"
    logs.mkdir(exist_ok=True)
    cli = [sys.executable, "-m", "fleetscope.cli"]
    specs = {
        "api": [*cli, "serve", "--host", settings.api_host, "--port", str(port)],
        "worker": [*cli, "worker", "--pool", "solo"],
        "beat": [*cli, "beat"],
    }
    procs: list[subprocess.Popen] = []
    try:
        for name, args in specs.items():
            with open(logs / f"{name}.log", "ab") as out:
                procs.append(subprocess.Popen(args, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True))
        _wait_healthy(url, procs)
        say(f"api        {url}  (OpenAPI at {url}/docs)")

        now = dt.datetime.now(dt.UTC).replace(microsecond=0)
        batch = gpu_fleet(FleetSpec(), now - dt.timedelta(minutes=minutes), minutes * 60)
        headers = {"Authorization": f"Bearer {admin}"}
        resp = httpx.post(url + "/api/v1/batches", json=batch_to_json(batch), headers=headers, timeout=120)
        if resp.status_code != 200:
            raise click.ClickException(f"ingest failed: {resp.status_code} {resp.text[:500]}")
        written = resp.json()["written"]
        say(f"ingested   {sum(written.values())} rows through the API: " + ", ".join(f"{k} {v}" for k, v in written.items()))

        from fleetscope.worker import celery_app

        pong = celery_app.send_task("fleetscope.ping").get(timeout=60)
        say(f"worker     answered ping from {pong['hostname']} ({pong['database']})")
        summary = {
            "api_url": url,
            "docs_url": url + "/docs",
            "token": admin,
            "written": written,
            "worker": pong,
            "ready_s": round(time.monotonic() - started, 1),
            "logs": str(logs),
        }
        if as_json:
            click.echo(json.dumps(summary))
        else:
            say(f"token      {admin}   (scope admin; try: curl -H 'Authorization: Bearer {admin}' {url}/api/v1/counts)")
            say(f"logs       {logs}")
            say(f"ready in {summary['ready_s']} s. Ctrl-C stops everything.")
        deadline = None if exit_after is None else time.monotonic() + exit_after
        while deadline is None or time.monotonic() < deadline:
            for p in procs:
                if p.poll() is not None:
                    raise click.ClickException(f"{' '.join(p.args[3:5])} exited with {p.returncode}; see {logs}")
            time.sleep(0.5)
    except KeyboardInterrupt:
        say("\nstopping ...")
    finally:
        _stop(procs)

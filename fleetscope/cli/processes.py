"""The long-running processes: the API (``serve``), ``worker``, ``beat``, the ``dashboard``, the node
``agent`` and the whole-product ``demo``."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import ssl
import subprocess
import sys
import threading
from pathlib import Path

import click

from fleetscope import lifetime, settings as settings_mod
from fleetscope.cli import allocator
from fleetscope.cli.common import _engine, _settings
from fleetscope.devices import nvml as nvml_driver


def _tls_options(f):  # type: ignore[no-untyped-def]
    f = click.option("--tls-key", type=click.Path(dir_okay=False), default=None, help="PEM private key of --tls-cert (or FLEETSCOPE_TLS_KEY).")(f)
    return click.option("--tls-cert", type=click.Path(dir_okay=False), default=None,
                        help="Serve HTTPS with this PEM certificate (chain) (or FLEETSCOPE_TLS_CERT); needs --tls-key.")(f)


def _tls(cert: str | None, key: str | None, s: settings_mod.Settings) -> tuple[str, str] | None:
    """The certificate and key to serve HTTPS with (options first, then settings), checked to load as a
    pair before the server starts; None for plain HTTP."""
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


WORKER_HEALTHCHECK_S = 60


@click.command()
@click.option("--host", default=None, help="Bind address (default FLEETSCOPE_API_HOST).")
@click.option("--port", type=int, default=None, help="Port (default FLEETSCOPE_API_PORT).")
@click.option("--workers", type=click.IntRange(min=1), default=None,
              help="API processes (default FLEETSCOPE_API_WORKERS: 2 on PostgreSQL, 1 on SQLite).")
@_tls_options
def serve(host: str | None, port: int | None, workers: int | None, tls_cert: str | None, tls_key: str | None) -> None:
    """Run the HTTP API (FastAPI under uvicorn), over HTTPS with --tls-cert and --tls-key.

    \b
    Examples:
      fleetscope serve
      fleetscope serve --host 0.0.0.0 --port 8000 --workers 4 --tls-cert api.crt --tls-key api.key
    """
    s = _settings()
    workers = workers or s.api_workers
    given = [("--host", host), ("--port", port), ("--tls-cert", tls_cert), ("--tls-key", tls_key)]
    allocator.execute_tuned(["serve", "--workers", str(workers), *[x for name, value in given if value is not None for x in (name, str(value))]],
                            s.tune_allocator)
    import uvicorn  # lazy: the server stack loads only for this verb

    tls = _tls(tls_cert, tls_key, s)
    host = host or s.api_host
    if tls is None:
        _warn_plain_http(host, "the API")
    _engine(s)  # migrate once here, not in every worker process
    from fleetscope.api.server import uvicorn_options  # lazy: imports the whole API

    # With --workers > 1 uvicorn's supervisor kills a worker that does not answer its health ping within
    # timeout_worker_healthcheck (5 s by default), and a starting one that is not ready in that time. A
    # worker under full ingest load on a busy host, or importing the app there, can miss 5 s; killing it
    # drops every request it holds, so the limit is a minute: a worker hung that long is still replaced.
    factory = "fleetscope.api.server:create_worker_app" if workers > 1 else "fleetscope.api:create_app"
    uvicorn.run(factory, factory=True, host=host, port=port or s.api_port, workers=workers, log_level=s.log_level.lower(),
                ssl_certfile=tls[0] if tls else None, ssl_keyfile=tls[1] if tls else None,
                timeout_worker_healthcheck=WORKER_HEALTHCHECK_S, **uvicorn_options(s.max_header_bytes))


ALERTING_WORKER_THREADS = 4  # evaluations take a lock and run one at a time; deliveries wait on receivers


@click.command(context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
@click.option("--concurrency", type=int, default=2, show_default=True)
@click.option("--pool", default="prefork", show_default=True, type=click.Choice(["prefork", "solo", "threads"]))
@click.option("--queues", "-Q", help="Comma-separated queues to serve, and nothing else (e.g. `alerting` for a host that only alerts). "
              "Default: the general queue here, and the alerting queue in a worker process of its own beside it.")
@click.pass_context
def worker(ctx: click.Context, concurrency: int, pool: str, queues: str | None) -> None:
    """Run a Celery worker (extra arguments go to `celery worker`).

    \b
    Examples:
      fleetscope worker
      fleetscope worker --concurrency 8
      fleetscope worker --queues alerting --pool threads --concurrency 4
    """
    from fleetscope.worker import ALERTING_QUEUE, DEFAULT_QUEUE, celery_app  # lazy: Celery and every task

    _engine(_settings())
    argv = ["worker", f"--concurrency={concurrency}", f"--pool={pool}", "--loglevel=INFO", *ctx.args]
    if queues:
        celery_app.worker_main([*argv, f"--queues={queues}"])
        return
    alerting = subprocess.Popen([sys.executable, "-m", "fleetscope.cli", "worker", "--queues", ALERTING_QUEUE, "--pool", "threads",
                                 "--concurrency", str(ALERTING_WORKER_THREADS), "--hostname", f"{ALERTING_QUEUE}@%h"],
                                preexec_fn=lifetime.die_with_parent)
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


@click.command("dashboard", context_settings={"ignore_unknown_options": True})
@click.option("--host", envvar="FLEETSCOPE_DASHBOARD_HOST", default="127.0.0.1", show_default=True, help="Bind address (or FLEETSCOPE_DASHBOARD_HOST).")
@click.option("--port", envvar="FLEETSCOPE_DASHBOARD_PORT", type=int, default=8501, show_default=True, help="Port (or FLEETSCOPE_DASHBOARD_PORT).")
@_tls_options
@click.argument("streamlit_args", nargs=-1, type=click.UNPROCESSED)
def dashboard_cmd(host: str, port: int, tls_cert: str | None, tls_key: str | None, streamlit_args: tuple[str, ...]) -> None:
    """Run the Streamlit dashboard (extra arguments go to `streamlit run`), over HTTPS with --tls-cert and --tls-key.

    Users sign in with an API token, or through an OIDC provider with FLEETSCOPE_DASHBOARD_AUTH=oidc.

    \b
    Examples:
      fleetscope dashboard
      fleetscope dashboard --host 0.0.0.0 --port 8501 --tls-cert dash.crt --tls-key dash.key
      fleetscope dashboard -- --theme.base dark
    """
    s = _settings()
    tls = _tls(tls_cert, tls_key, s)
    if tls is None:
        _warn_plain_http(host, "the dashboard")
    if s.dashboard_auth == "oidc":
        from dashboard.access import MappingError, parse_mapping  # lazy: the dashboard package is optional (checked below)

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


@click.command(context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
@click.pass_context
def beat(ctx: click.Context) -> None:
    """Run Celery beat, which schedules the analyzers, alerts, rollups, retention and audit reports.

    Run it on two hosts for availability: the one holding the lease in the database (FLEETSCOPE_BEAT_LEASE_S)
    sends the schedule, and another takes over within the lease when it dies.

    \b
    Examples:
      fleetscope beat
    """
    from fleetscope.worker import celery_app  # lazy: Celery and every task

    _engine(_settings())  # the lease and the last sends are in the store: migrate (SQLite) or check its schema
    # What this process creates (its heartbeat file) is private to its account.
    os.umask(0o077)
    celery_app.start(["beat", "--loglevel=INFO", *ctx.args])


@click.command()
@click.option("--dcgm", "dcgm_urls", multiple=True, help="dcgm-exporter /metrics URL to poll; repeat for several.")
@click.option("--nvml", is_flag=True, help="Read the local GPUs through NVML (needs the NVIDIA driver).")
@click.option("--serving", "serving_urls", multiple=True,
              help="Inference server /metrics URL to poll (vLLM, SGLang, TGI, Triton, NIM; detected by content); repeat for several.")
@click.option("--slurm", "slurm_urls", multiple=True,
              help="slurmrestd base URL (http://slurmctld:6820) whose jobs and nodes to poll each tick; repeat for several clusters.")
@click.option("--slurm-api", "slurm_api", envvar="FLEETSCOPE_SLURM_API", default="v0.0.40", show_default=True,
              help="slurmrestd data_parser version in the path (/slurm/v0.0.40/jobs); v0.0.40 to v0.0.44 are read (or FLEETSCOPE_SLURM_API).")
@click.option("--slurm-user", "slurm_user", envvar="FLEETSCOPE_SLURM_USER", default=None, help="X-SLURM-USER-NAME sent to slurmrestd (or FLEETSCOPE_SLURM_USER).")
@click.option("--slurm-token", "slurm_token", envvar=["FLEETSCOPE_SLURM_TOKEN", "SLURM_JWT"], default=None,
              help="X-SLURM-USER-TOKEN sent to slurmrestd, e.g. from `scontrol token` (or FLEETSCOPE_SLURM_TOKEN, SLURM_JWT).")
@click.option("--slurm-endpoint", "slurm_endpoints", multiple=True, type=click.Choice(["jobs", "nodes", "partitions", "accounting", "accounts"]),
              help="slurmrestd endpoints to poll (default jobs and nodes): partitions, slurmdbd's accounting jobs, accounts (their organizations name teams); repeat.")
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
# the bound is fleetscope.agent.probing.MIN_PROBE_EVERY_S (not imported here: the collector loads only when the verb runs)
@click.option("--probe-every", "probe_every_s", type=click.FloatRange(min=60), default=None, metavar="SECONDS",
              help="Run the SDC known-answer probe on this node's GPUs every SECONDS (at least 60; 600 to 3600 is typical; off by default) "
                   "and push each result as an sdc_probe health event; the probe runs beside the ticks, never delaying them.")
@click.option("--probe-backend", type=click.Choice(["auto", "numpy", "torch", "cupy"]), default=None,
              help="auto (default): torch or cupy where one reaches a GPU, else the CPU with numpy (and a warning); "
                   "torch or cupy: that one or an error at start; numpy: the CPU only.")
@click.option("--once", is_flag=True, help="Poll (and probe) once and exit: exit 1 if any source failed or its readings were not delivered, "
              "else 5 if a probe result differs from the golden digest.")
@click.option("--json", "as_json", is_flag=True, help="One JSON line per tick.")
def agent(dcgm_urls: tuple[str, ...], nvml: bool, serving_urls: tuple[str, ...], slurm_urls: tuple[str, ...], slurm_api: str,
          slurm_user: str | None, slurm_token: str | None, slurm_endpoints: tuple[str, ...], interval_s: float, api_url: str, token: str, push: str,
          buffer_mb: float, buffer_ticks: int, spool: str | None, infiniband: bool | None, infiniband_root: str, probe_every_s: float | None,
          probe_backend: str | None, once: bool, as_json: bool) -> None:
    """Node-side collector: poll dcgm-exporter and/or NVML (and slurmrestd, inference servers) and push to the API
    (OTLP by default).
    Readings the API does not take (unreachable, 429, 5xx) are kept, bounded, and sent again later with
    the time they were measured.

    \b
    Examples:
      fleetscope agent --dcgm http://localhost:9400/metrics --api https://fleet.example:8000 --token "$TOKEN"
      fleetscope agent --nvml --serving http://localhost:8000/metrics --push batch --once --json
      SLURM_JWT=$(scontrol token | cut -d= -f2) fleetscope agent --slurm http://slurmctld:6820 --slurm-user fleetscope --interval 60
      fleetscope agent --dcgm http://localhost:9400/metrics --probe-every 900 --probe-backend torch --api https://fleet.example:8000 --token "$TOKEN"
    """
    from fleetscope.agent import Agent, AgentStopped  # lazy: the collector and its encoders load only for this verb
    from fleetscope.devices.probe import ProbeUnavailable  # lazy: with the collector

    if infiniband is None:
        infiniband = Path(infiniband_root).is_dir()
    if probe_backend is not None and probe_every_s is None:
        raise click.UsageError("--probe-backend needs --probe-every SECONDS")
    if not dcgm_urls and not nvml and not infiniband and not serving_urls and not slurm_urls and probe_every_s is None:
        raise click.UsageError("nothing to collect: give --dcgm URL, --serving URL, --slurm URL, --probe-every SECONDS and/or --nvml "
                               "(or --infiniband on a host with RDMA devices)")
    _check_slurm_api(slurm_api)
    if nvml:
        try:
            nvml_driver.read_devices()
        except nvml_driver.NvmlUnavailable as exc:
            raise click.ClickException(str(exc)) from None
    try:
        ag = Agent(api_url.rstrip("/"), token, list(dcgm_urls), nvml, push=push, buffer_bytes=max(1, int(buffer_mb * 2**20)),
                   buffer_ticks=buffer_ticks, spool=spool, infiniband=infiniband_root if infiniband else None,
                   serving_urls=list(serving_urls), slurm_urls=list(slurm_urls), slurm_api_version=slurm_api, slurm_user=slurm_user,
                   slurm_token=slurm_token, slurm_endpoints=tuple(slurm_endpoints) or ("jobs", "nodes"),
                   probe_every_s=probe_every_s, probe_backend=probe_backend or "auto", probe_wait_s=PROBE_ONCE_WAIT_S if once else None)
    except ProbeUnavailable as exc:  # torch or cupy asked for by name and cannot run here: the message names what is missing
        raise click.ClickException(f"--probe-backend {probe_backend}: {exc}") from None
    failed = probe_failed = False

    def show(report) -> None:  # type: ignore[no-untyped-def]
        nonlocal failed, probe_failed
        failed = failed or bool(report.errors)
        probe_failed = probe_failed or any(p.get("passed") is False for p in report.probes)
        if as_json:
            out = {"ts": report.ts.isoformat(), "pushed": report.pushed, "errors": report.errors}
            if push == "otlp":
                out |= {"points": report.points, "rejected_points": report.rejected_points}
            out |= {"replayed": report.replayed, "buffered": report.buffered, "buffered_bytes": report.buffered_bytes,
                    "dropped": report.dropped, "discarded": report.discarded}
            if probe_every_s is not None:
                out["probe"] = report.probes
            click.echo(json.dumps(out))
        else:
            rows = sum(n for w in report.pushed.values() for k, n in w.items() if k != "points")
            otlp = f" ({report.points} OTLP points, {report.rejected_points} rejected)" if push == "otlp" else ""
            backlog = "".join(f", {n} {what}" for n, what in ((report.replayed, "earlier readings resent"), (report.buffered, "readings waiting"),
                                                              (report.dropped, "oldest readings dropped (backlog full)"),
                                                              (report.discarded, "readings refused as bad data")) if n)
            probed = "".join(f", probe {p['gpu_uuid']}: {'pass' if p['passed'] else 'FAIL' if p['passed'] is False else 'no golden digest'}"
                             for p in report.probes if "gpu_uuid" in p)
            click.echo(f"{report.ts:%H:%M:%S} pushed {rows} rows from {len(report.pushed)} source(s){otlp}{backlog}{probed}"
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
    if once and probe_failed:
        sys.exit(5)  # as `fleetscope health probe`: a confirmed SDC suspect, delivered


PROBE_ONCE_WAIT_S = 600.0  # --once waits this long for its probe round (a CUDA backend's first round loads its library)


def _check_slurm_api(version: str) -> None:
    from fleetscope.agent import _SLURM_VERSION  # lazy: the collector loads only for the agent verb

    if not _SLURM_VERSION.match(version):
        raise click.BadParameter(f"a data_parser version looks like v0.0.40, not {version[:40]!r}", param_hint="--slurm-api")


@click.command()
@click.option("--size", type=click.Choice(["demo", "small"]), default="demo", show_default=True,
              help="demo: 2 sites, 64 nodes of 8 GPUs, 4 jobs, 2 simulated hours; small: 64 GPUs, 2 jobs, 10 minutes.")
@click.option("--seed", type=int, default=7, show_default=True, help="Simulator seed (same seed, same fleet and faults).")
@click.option("--exit-after", type=float, default=None, help="Stop after this many seconds (for scripts and tests).")
@click.option("--port", type=int, default=None, help="API port (default FLEETSCOPE_API_PORT, or a free one).")
@click.option("--dashboard-port", type=int, default=None, help="Dashboard port (default 8501, or a free one).")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
def demo(size: str, seed: int, exit_after: float | None, port: int | None, dashboard_port: int | None, as_json: bool) -> None:
    """Run the whole product on embedded defaults with a simulated fleet.

    Simulates a fleet with injected faults and its Slurm and Kubernetes schedulers, starts the API, a Celery
    worker, beat, the dashboard and a local webhook sink, ingests everything through the API, runs every
    analyzer, delivers the alerts, evaluates the EU AI Act rules, files a report and a signed export, checks
    each injected fault was found, prints the team bill, the URLs and an API token, and keeps running until Ctrl-C.

    \b
    Examples:
      fleetscope demo
      fleetscope demo --size small --exit-after 600 --json
    """
    from fleetscope.demo import run_demo  # lazy: the simulator and every service

    run_demo(_settings(), size=size, exit_after=exit_after, port=port, dashboard_port=dashboard_port, as_json=as_json, seed=seed)

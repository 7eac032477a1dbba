"""docker-compose.yml: the production-shaped stack is complete and consistent.

`docker compose config` validates it where the compose plugin exists (.ci/run runs it then); this test
checks what matters to an operator on every machine, and runs the proxy's own configuration
(deploy/Caddyfile) in a real Caddy, where one is installed, in front of a real API and dashboard.
"""

import os
import shutil
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
import yaml

from fleetscope import settings

ROOT = Path(__file__).resolve().parents[1]
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
CADDYFILE = ROOT / "deploy" / "Caddyfile"


def test_services_and_health_checks():
    services = COMPOSE["services"]
    assert {"postgres", "redis", "migrate", "api-1", "api-2", "worker", "beat", "dashboard", "proxy"} <= set(services)
    for name in ("postgres", "redis", "api-1", "api-2", "worker", "beat", "dashboard", "proxy"):
        assert "healthcheck" in services[name], name


def _published(service: dict) -> list[str]:
    """A service's published ports in compose's short syntax ("[IP:]HOST:CONTAINER") or long syntax."""
    out = []
    for p in service.get("ports", []):
        if isinstance(p, dict):
            out.append(f"{p.get('host_ip', '')}:{p.get('published', '')}:{p.get('target')}".lstrip(":"))
        else:
            out.append(str(p))
    return out


def test_only_the_tls_proxy_is_published():
    services = COMPOSE["services"]
    assert services["proxy"]["image"].startswith("caddy:")
    assert _published(services["proxy"]) == ["443:443"]
    for name, svc in services.items():
        if name == "proxy":
            continue
        # anything else reachable from outside the host would skip the proxy's TLS: loopback at most
        assert all(p.startswith("127.0.0.1:") for p in _published(svc)), (name, _published(svc))
    assert services["api-1"]["expose"] == services["api-2"]["expose"] == ["8000"]
    assert services["dashboard"]["expose"] == ["8501"]
    for name in ("api-1", "api-2", "dashboard"):
        assert services["proxy"]["depends_on"][name]["condition"] == "service_healthy"


def test_the_proxy_reads_the_repositorys_caddyfile_and_the_operators_certificate():
    volumes = COMPOSE["services"]["proxy"]["volumes"]
    assert "./deploy/Caddyfile:/etc/caddy/Caddyfile:ro" in volumes
    assert "${TLS_CERT_DIR:-./deploy/tls}:/etc/caddy/tls:ro" in volumes
    text = CADDYFILE.read_text()
    assert "tls {$PROXY_CERT:/etc/caddy/tls/fleetscope.crt} {$PROXY_KEY:/etc/caddy/tls/fleetscope.key}" in text
    assert "reverse_proxy {$PROXY_API:api-1:8000 api-2:8000} {" in text and "reverse_proxy {$PROXY_DASHBOARD:dashboard:8501}" in text
    # the certificate folder exists in a checkout and keeps keys out of git
    assert (ROOT / "deploy" / "tls" / ".gitignore").read_text().splitlines()[1:] == ["*", "!.gitignore"]


def test_migrations_run_once_before_the_service_processes():
    services = COMPOSE["services"]
    assert services["migrate"]["command"] == ["fleetscope", "db", "upgrade"]
    for name in ("api-1", "api-2", "worker", "beat", "dashboard"):
        assert services[name]["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
        env = services[name]["environment"]
        assert env["FLEETSCOPE_DATABASE_URL"].startswith("postgresql+psycopg://")
        assert env["FLEETSCOPE_BROKER_URL"].startswith("redis://")
        assert env["FLEETSCOPE_AUTO_MIGRATE"] == "false"


def test_environment_names_are_real_settings():
    known = {name for name, _, _ in settings.table()}
    env = COMPOSE["services"]["api-1"]["environment"]
    assert set(env) <= known, set(env) - known


def test_the_proxy_spreads_over_every_api_replica_and_the_workers_scale():
    services = COMPOSE["services"]
    replicas = sorted(name for name in services if name.startswith("api-"))
    assert services["proxy"]["environment"]["PROXY_API"].split() == [f"{name}:8000" for name in replicas]
    assert all(services[name]["command"] == services["api-1"]["command"] for name in replicas)
    assert services["worker"]["deploy"]["replicas"] == "${FLEETSCOPE_WORKER_REPLICAS:-2}"
    # beats for availability, one leader by the database lease (worker/beat.py); each checked by its own heartbeat
    assert services["beat"]["deploy"]["replicas"] == "${FLEETSCOPE_BEAT_REPLICAS:-2}"
    assert "beat-heartbeat-$$HOSTNAME" in services["beat"]["healthcheck"]["test"][1]
    assert "${FLEETSCOPE_API_WORKERS:-2}" in services["api-1"]["command"]


def test_database_has_a_volume():
    assert any(v.startswith("postgres-data:") for v in COMPOSE["services"]["postgres"]["volumes"])
    assert "postgres-data" in COMPOSE["volumes"]


def test_every_command_is_a_cli_verb():
    from click.testing import CliRunner

    from fleetscope.cli import main

    for name, svc in COMPOSE["services"].items():
        cmd = svc.get("command")
        if cmd and cmd[0] == "fleetscope":
            result = CliRunner().invoke(main, [*cmd[1:2], "--help"])
            assert result.exit_code == 0, f"{name}: fleetscope {cmd[1]} --help failed: {result.output}"


def _compose() -> list[str] | None:
    """`docker compose` (the v2 plugin) where present, else the standalone `docker-compose` (Debian's package)."""
    if shutil.which("docker") and subprocess.run(["docker", "compose", "version"], capture_output=True).returncode == 0:
        return ["docker", "compose"]
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    return None


@pytest.mark.skipif(_compose() is None, reason="neither the docker compose plugin nor docker-compose is installed")
def test_docker_compose_config_validates():
    proc = subprocess.run([*_compose(), "-f", str(ROOT / "docker-compose.yml"), "config", "-q"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def _caddy_env(tmp_path: Path, **proxy: str) -> dict[str, str]:
    # Caddy keeps its state under $HOME / XDG folders: keep them in the test's folder.
    return {**os.environ, "HOME": str(tmp_path), "XDG_DATA_HOME": str(tmp_path / "data"), "XDG_CONFIG_HOME": str(tmp_path / "config"), **proxy}


@pytest.mark.skipif(shutil.which("caddy") is None, reason="Caddy is not installed (apt-get install caddy)")
def test_the_caddyfile_validates(tmp_path):
    from tests.fleetscope.test_tls import self_signed

    cert, key = self_signed(tmp_path)
    env = _caddy_env(tmp_path, PROXY_CERT=str(cert), PROXY_KEY=str(key))
    proc = subprocess.run(["caddy", "validate", "--config", str(CADDYFILE), "--adapter", "caddyfile"], env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("caddy") is None, reason="Caddy is not installed (apt-get install caddy)")
def test_the_proxy_terminates_tls_for_the_api_and_the_dashboard(tmp_path):
    """deploy/Caddyfile in a real Caddy on a loopback port, in front of `fleetscope serve` and `fleetscope
    dashboard` on plain loopback HTTP, as the compose stack runs them: the API's paths reach the API, the
    rest (the dashboard's websocket included) the dashboard, and only over TLS."""
    from websockets.sync.client import connect

    from dashboard.browser import free_port
    from fleetscope.services import auth
    from fleetscope.store import db
    from tests.fleetscope.test_tls import env_for, running, self_signed, trusting

    cert, key = self_signed(tmp_path)
    ctx = trusting(cert)
    api_port, dash_port, proxy_port = free_port(), free_port(), free_port()
    env = env_for(tmp_path)
    proxy = _caddy_env(tmp_path, PROXY_LISTEN=f":{proxy_port}", PROXY_CERT=str(cert), PROXY_KEY=str(key),
                       PROXY_API=f"127.0.0.1:{api_port}", PROXY_DASHBOARD=f"127.0.0.1:{dash_port}", PROXY_READ_BODY="2s")
    base = f"https://127.0.0.1:{proxy_port}"
    with running(["serve", "--host", "127.0.0.1", "--port", str(api_port)], env, f"http://127.0.0.1:{api_port}/healthz", ctx, tmp_path / "api.log"), \
         running(["dashboard", "--host", "127.0.0.1", "--port", str(dash_port)], env, f"http://127.0.0.1:{dash_port}/_stcore/health", ctx, tmp_path / "dash.log"):
        caddy = subprocess.Popen(["caddy", "run", "--config", str(CADDYFILE), "--adapter", "caddyfile"], env=proxy,
                                 stdout=(tmp_path / "caddy.log").open("wb"), stderr=subprocess.STDOUT)
        try:
            health = None
            for _ in range(100):
                try:
                    health = httpx.get(base + "/healthz", verify=ctx, timeout=5)
                    break
                except httpx.ConnectError:
                    assert caddy.poll() is None, (tmp_path / "caddy.log").read_text()[-3000:]
                    time.sleep(0.2)
            assert health is not None and health.status_code == 200 and health.json()["status"] == "ok"  # the API's answer
            assert health.headers["strict-transport-security"] == "max-age=31536000"
            engine = db.make_engine(f"sqlite:///{tmp_path / 'data' / 'fleetscope.store.db'}")
            secret = auth.create_token(engine, "proxy-reader", ["read"])
            engine.dispose()
            jobs = httpx.get(base + "/api/v1/jobs", headers={"Authorization": f"Bearer {secret}"}, verify=ctx, timeout=10)
            assert jobs.status_code == 200 and jobs.json() == []
            assert httpx.get(base + "/api/v1/jobs", verify=ctx, timeout=10).status_code == 401
            page = httpx.get(base + "/", verify=ctx, timeout=10)
            assert page.status_code == 200 and "<title>Streamlit</title>" in page.text  # the dashboard's shell
            assert httpx.get(base + "/_stcore/health", verify=ctx, timeout=10).text == "ok"
            with connect(f"wss://127.0.0.1:{proxy_port}/_stcore/stream", ssl=ctx, open_timeout=10) as ws:
                assert ws.protocol.state.name == "OPEN"  # the upgrade went through to Streamlit
            # A sender that stops mid-body is cut off at the proxy's read deadline (PROXY_READ_BODY, 2 s here), not
            # held for good, and others are answered meanwhile.
            import socket
            import ssl

            raw = ctx.wrap_socket(socket.create_connection(("127.0.0.1", proxy_port)), server_hostname="127.0.0.1")
            raw.sendall(b"POST /api/v1/ingest/dcgm HTTP/1.1\r\nHost: x\r\nContent-Length: 50000\r\n\r\nDCGM_FI_DEV_GPU_TEMP{")
            raw.settimeout(15)
            stalled_at = time.monotonic()
            assert httpx.get(base + "/healthz", verify=ctx, timeout=5).status_code == 200
            try:
                answer = raw.recv(4096)
            except (ConnectionError, ssl.SSLError):
                answer = b""
            assert time.monotonic() - stalled_at < 12 and (answer == b"" or answer.startswith(b"HTTP/1.1 4")), answer[:200]
            raw.close()
            # Plain HTTP to the TLS port is refused by the TLS server itself, never forwarded.
            plain = httpx.get(f"http://127.0.0.1:{proxy_port}/healthz", timeout=5)
            assert plain.status_code == 400 and "HTTP request to an HTTPS server" in plain.text
        finally:
            caddy.terminate()
            caddy.wait(timeout=20)


def _requests_served(base: str, secret: str, path: str) -> float:
    """How many requests for ``path`` this one API process has answered, from its own /metrics."""
    text = httpx.get(base + "/metrics", headers={"Authorization": f"Bearer {secret}"}, timeout=10).text
    total = 0.0
    for line in text.splitlines():
        if line.startswith("fleetscope_http_request_duration_seconds_count{") and f'route="{path}"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("caddy") is None, reason="Caddy is not installed (apt-get install caddy)")
def test_the_proxy_spreads_requests_over_two_api_replicas_and_routes_round_a_dead_one(tmp_path):
    """deploy/Caddyfile in a real Caddy with two `fleetscope serve` replicas over one store, as the compose
    stack runs api-1 and api-2: both replicas answer a share of the requests, and after one is killed
    (SIGKILL) every request still gets its answer from the other."""
    from dashboard.browser import free_port
    from fleetscope.services import auth
    from fleetscope.store import db
    from tests.fleetscope.test_tls import env_for, running, self_signed, trusting

    cert, key = self_signed(tmp_path)
    ctx = trusting(cert)
    ports = [free_port(), free_port()]
    proxy_port = free_port()
    env = env_for(tmp_path)
    proxy = _caddy_env(tmp_path, PROXY_LISTEN=f":{proxy_port}", PROXY_CERT=str(cert), PROXY_KEY=str(key),
                       PROXY_API=" ".join(f"127.0.0.1:{p}" for p in ports), PROXY_DASHBOARD="127.0.0.1:9")
    base = f"https://127.0.0.1:{proxy_port}"
    direct = [f"http://127.0.0.1:{p}" for p in ports]
    with running(["serve", "--host", "127.0.0.1", "--port", str(ports[0])], env, direct[0] + "/healthz", ctx, tmp_path / "api1.log") as first, \
         running(["serve", "--host", "127.0.0.1", "--port", str(ports[1])], env, direct[1] + "/healthz", ctx, tmp_path / "api2.log"):
        engine = db.make_engine(f"sqlite:///{tmp_path / 'data' / 'fleetscope.store.db'}")
        secret = auth.create_token(engine, "proxy-reader", ["read"])
        engine.dispose()
        headers = {"Authorization": f"Bearer {secret}"}
        caddy = subprocess.Popen(["caddy", "run", "--config", str(CADDYFILE), "--adapter", "caddyfile"], env=proxy,
                                 stdout=(tmp_path / "caddy.log").open("wb"), stderr=subprocess.STDOUT)
        try:
            for _ in range(100):
                try:
                    httpx.get(base + "/healthz", verify=ctx, timeout=5)
                    break
                except httpx.ConnectError:
                    assert caddy.poll() is None, (tmp_path / "caddy.log").read_text()[-3000:]
                    time.sleep(0.2)
            before = [_requests_served(d, secret, "/api/v1/jobs") for d in direct]
            with httpx.Client(verify=ctx, timeout=10, headers=headers) as client:
                # 8 requests in flight at a time, so least_conn has ties to break and loads to compare
                with ThreadPoolExecutor(8) as pool:
                    statuses = list(pool.map(lambda _: client.get(base + "/api/v1/jobs").status_code, range(64)))
            assert statuses == [200] * 64
            served = [_requests_served(d, secret, "/api/v1/jobs") - b for d, b in zip(direct, before)]
            assert sum(served) == 64 and min(served) >= 4, served  # each replica took a share, none was skipped

            # Kill the first replica outright: the proxy's dial fails and it tries the other one.
            first.kill()
            first.wait(timeout=10)
            with httpx.Client(verify=ctx, timeout=10, headers=headers) as client:
                after = [client.get(base + "/api/v1/jobs").status_code for _ in range(20)]
            assert after == [200] * 20
        finally:
            caddy.terminate()
            caddy.wait(timeout=20)

"""docker-compose.yml: the production-shaped stack is complete and consistent.

`docker compose config` validates it where the compose plugin exists (.ci/run runs it then); this test
checks what matters to an operator on every machine.
"""

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from fleetscope import settings

ROOT = Path(__file__).resolve().parents[1]
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def test_services_and_health_checks():
    services = COMPOSE["services"]
    assert {"postgres", "redis", "migrate", "api", "worker", "beat", "dashboard"} <= set(services)
    for name in ("postgres", "redis", "api", "worker", "beat", "dashboard"):
        assert "healthcheck" in services[name], name


def test_migrations_run_once_before_the_service_processes():
    services = COMPOSE["services"]
    assert services["migrate"]["command"] == ["fleetscope", "db", "upgrade"]
    for name in ("api", "worker", "beat", "dashboard"):
        assert services[name]["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
        env = services[name]["environment"]
        assert env["FLEETSCOPE_DATABASE_URL"].startswith("postgresql+psycopg://")
        assert env["FLEETSCOPE_BROKER_URL"].startswith("redis://")
        assert env["FLEETSCOPE_AUTO_MIGRATE"] == "false"


def test_environment_names_are_real_settings():
    known = {name for name, _, _ in settings.table()}
    env = COMPOSE["services"]["api"]["environment"]
    assert set(env) <= known, set(env) - known


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

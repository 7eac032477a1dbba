"""`fleetscope serve` and `fleetscope dashboard` over HTTPS (--tls-cert/--tls-key, FLEETSCOPE_TLS_CERT/KEY):
real processes on loopback ports with a throwaway self-signed certificate made here, reached by a client that
trusts exactly that certificate; a bad pair is refused before anything starts."""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from dashboard.browser import free_port
from fleetscope.services import auth
from fleetscope.store import db
from fleetscope.cli import main

ROOT = Path(__file__).resolve().parents[2]


def self_signed(folder: Path, name: str = "server") -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 signed by its own key (P-256), valid for a day, and that key, as PEM files."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "fleetscope-test")])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = folder / f"{name}.crt", folder / f"{name}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    return cert_path, key_path


def trusting(cert: Path) -> ssl.SSLContext:
    """A client context that trusts only ``cert``."""
    return ssl.create_default_context(cafile=str(cert))


@contextmanager
def running(args: list[str], env: dict[str, str], ready_url: str, verify: ssl.SSLContext, log: Path, timeout_s: float = 120) -> Iterator[subprocess.Popen]:
    proc = subprocess.Popen([sys.executable, "-m", "fleetscope.cli", *args], env=env, cwd=ROOT, stdout=log.open("wb"), stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            if proc.poll() is not None:
                raise AssertionError(f"{args[0]} exited with {proc.returncode}: {log.read_text()[-3000:]}")
            try:
                if httpx.get(ready_url, verify=verify, timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, f"{args[0]} did not answer on {ready_url}: {log.read_text()[-3000:]}"
            time.sleep(0.2)
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def env_for(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEETSCOPE_")}
    env.update(FLEETSCOPE_DATA_DIR=str(tmp_path / "data"), PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])), **extra)
    return env


@pytest.mark.slow
def test_serve_over_https(tmp_path: Path) -> None:
    cert, key = self_signed(tmp_path)
    port = free_port()
    base = f"https://127.0.0.1:{port}"
    with running(["serve", "--host", "127.0.0.1", "--port", str(port), "--tls-cert", str(cert), "--tls-key", str(key)],
                 env_for(tmp_path), base + "/healthz", trusting(cert), tmp_path / "serve.log"):
        health = httpx.get(base + "/healthz", verify=trusting(cert), timeout=10)
        assert health.status_code == 200 and health.json()["status"] == "ok"
        assert health.extensions["http_version"] == b"HTTP/1.1"
        # A token travels inside TLS and works as over plain HTTP.
        engine = db.make_engine(f"sqlite:///{tmp_path / 'data' / 'fleetscope.store.db'}")
        secret = auth.create_token(engine, "tls-reader", ["read"])
        engine.dispose()
        jobs = httpx.get(base + "/api/v1/jobs", headers={"Authorization": f"Bearer {secret}"}, verify=trusting(cert), timeout=10)
        assert jobs.status_code == 200 and jobs.json() == []
        # A client that does not trust the certificate refuses the connection; plain HTTP gets no answer.
        with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
            httpx.get(base + "/healthz", verify=ssl.create_default_context(), timeout=10)
        with pytest.raises(httpx.HTTPError):
            httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=10)


@pytest.mark.slow
def test_serve_takes_the_pair_from_the_settings(tmp_path: Path) -> None:
    cert, key = self_signed(tmp_path)
    port = free_port()
    env = env_for(tmp_path, FLEETSCOPE_TLS_CERT=str(cert), FLEETSCOPE_TLS_KEY=str(key))
    with running(["serve", "--host", "127.0.0.1", "--port", str(port)], env, f"https://127.0.0.1:{port}/healthz", trusting(cert), tmp_path / "serve.log"):
        assert httpx.get(f"https://127.0.0.1:{port}/healthz", verify=trusting(cert), timeout=10).json()["status"] == "ok"


@pytest.mark.slow
def test_dashboard_over_https(tmp_path: Path) -> None:
    cert, key = self_signed(tmp_path)
    port = free_port()
    base = f"https://127.0.0.1:{port}"
    with running(["dashboard", "--host", "127.0.0.1", "--port", str(port), "--tls-cert", str(cert), "--tls-key", str(key)],
                 env_for(tmp_path), base + "/_stcore/health", trusting(cert), tmp_path / "dashboard.log"):
        assert httpx.get(base + "/_stcore/health", verify=trusting(cert), timeout=10).text == "ok"
        with pytest.raises(httpx.HTTPError):
            httpx.get(f"http://127.0.0.1:{port}/_stcore/health", timeout=10)


@pytest.mark.parametrize("verb", ["serve", "dashboard"])
def test_a_bad_pair_is_refused_before_anything_starts(verb: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLEETSCOPE_DATA_DIR", str(tmp_path / "data"))
    for name in ("FLEETSCOPE_TLS_CERT", "FLEETSCOPE_TLS_KEY", "FLEETSCOPE_DATABASE_URL"):
        monkeypatch.delenv(name, raising=False)
    cert, key = self_signed(tmp_path)
    _, other_key = self_signed(tmp_path, "other")
    cases = [
        (["--tls-cert", str(cert)], "--tls-cert (or FLEETSCOPE_TLS_CERT) was given without --tls-key (or FLEETSCOPE_TLS_KEY)"),
        (["--tls-key", str(key)], "--tls-key (or FLEETSCOPE_TLS_KEY) was given without --tls-cert (or FLEETSCOPE_TLS_CERT)"),
        (["--tls-cert", str(tmp_path / "nope.crt"), "--tls-key", str(key)], f"--tls-cert: no file at {tmp_path / 'nope.crt'}"),
        (["--tls-cert", str(cert), "--tls-key", str(other_key)], f"--tls-cert {cert} and --tls-key {other_key} do not load as a PEM certificate and its private key"),
        (["--tls-cert", str(key), "--tls-key", str(key)], "do not load as a PEM certificate and its private key"),
    ]
    for args, why in cases:
        result = CliRunner().invoke(main, [verb, "--port", "1", *args])
        assert result.exit_code == 1 and why in result.output, (args, result.output)
    assert not (tmp_path / "data").exists()  # refused before the database was touched


def test_plain_http_on_a_public_address_is_warned_about(monkeypatch: pytest.MonkeyPatch) -> None:
    from fleetscope.cli import processes as cli  # where `serve` lives

    def stop(*_a: object, **_k: object) -> None:
        raise SystemExit(3)  # stands in for migrating and serving: the warning comes before

    monkeypatch.setattr(cli, "_engine", stop)
    for name in ("FLEETSCOPE_TLS_CERT", "FLEETSCOPE_TLS_KEY"):
        monkeypatch.delenv(name, raising=False)
    loud = CliRunner().invoke(main, ["serve", "--host", "0.0.0.0", "--port", "1"])
    assert loud.exit_code == 3 and "warning: the API serves plain HTTP on 0.0.0.0" in loud.stderr
    quiet = CliRunner().invoke(main, ["serve", "--host", "127.0.0.1", "--port", "1"])
    assert quiet.exit_code == 3 and quiet.stderr == ""

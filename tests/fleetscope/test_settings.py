import pytest

from fleetscope import settings


def test_defaults_are_embedded(monkeypatch, tmp_path):
    for name, _, _ in settings.table():
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)
    s = settings.load()
    assert s.data_dir == tmp_path / ".fleetscope"
    assert s.database_url == f"sqlite:///{tmp_path / '.fleetscope' / 'fleetscope.store.db'}"
    assert s.broker_url.startswith("sqla+sqlite:///")
    assert s.result_backend.startswith("db+sqlite:///")
    assert s.otel_exporter == "none"
    assert s.retention_days >= 183  # EU AI Act Art. 19(1): logs kept at least six months
    assert (s.tls_cert, s.tls_key, s.dashboard_auth, s.dashboard_oidc_scopes) == ("", "", "token", "")  # plain HTTP, token sign-in


def test_redis_broker_brings_its_result_backend(monkeypatch):
    monkeypatch.setenv("FLEETSCOPE_BROKER_URL", "redis://cache:6379/0")
    monkeypatch.delenv("FLEETSCOPE_RESULT_BACKEND", raising=False)
    assert settings.load().result_backend == "redis://cache:6379/0"


@pytest.mark.parametrize(
    ("name", "value", "words"),
    [
        ("FLEETSCOPE_API_PORT", "eighty", "FLEETSCOPE_API_PORT='eighty': expected an integer"),
        ("FLEETSCOPE_AUTO_MIGRATE", "maybe", "FLEETSCOPE_AUTO_MIGRATE='maybe'"),
        ("FLEETSCOPE_OTEL_EXPORTER", "zipkin", "expected none, console or otlp"),
        ("FLEETSCOPE_DASHBOARD_AUTH", "saml", "FLEETSCOPE_DASHBOARD_AUTH='saml': expected token or oidc"),
    ],
)
def test_bad_values_name_the_variable(monkeypatch, name, value, words):
    monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=words.replace("(", r"\(").replace(")", r"\)")):
        settings.load()


def test_table_lists_every_setting():
    names = [row[0] for row in settings.table()]
    assert len(names) == len(set(names))
    assert {"FLEETSCOPE_DATABASE_URL", "FLEETSCOPE_BROKER_URL", "FLEETSCOPE_DATA_DIR"} <= set(names)


def test_evidence_must_outlive_raw_telemetry(monkeypatch):
    monkeypatch.setenv("FLEETSCOPE_RETENTION_DAYS", "400")
    monkeypatch.setenv("FLEETSCOPE_EVIDENCE_RETENTION_DAYS", "200")
    with pytest.raises(ValueError, match="EVIDENCE_RETENTION_DAYS=200 is shorter than FLEETSCOPE_RETENTION_DAYS=400"):
        settings.load()
    monkeypatch.setenv("FLEETSCOPE_EVIDENCE_RETENTION_DAYS", "0")
    with pytest.raises(ValueError, match="at least 1"):
        settings.load()


def test_api_processes_default_to_two_on_postgresql_and_one_on_sqlite(monkeypatch):
    assert settings.default_api_workers("postgresql+psycopg://db/fleet", 2) == 2
    assert settings.default_api_workers("postgresql+psycopg://db/fleet", 64) == 2
    assert settings.default_api_workers("postgresql+psycopg://db/fleet", 1) == 1  # no second CPU to run it
    assert settings.default_api_workers("postgresql+psycopg://db/fleet", None) == 1
    assert settings.default_api_workers("sqlite:///fleet.db", 64) == 1  # its writers take turns across processes
    monkeypatch.delenv("FLEETSCOPE_API_WORKERS", raising=False)
    monkeypatch.setenv("FLEETSCOPE_DATABASE_URL", "postgresql+psycopg://db/fleet")
    monkeypatch.setattr(settings.os, "cpu_count", lambda: 2)
    assert settings.load().api_workers == 2
    monkeypatch.setenv("FLEETSCOPE_API_WORKERS", "3")
    assert settings.load().api_workers == 3 == settings.api_workers("sqlite:///fleet.db")  # what a benchmark reports
    monkeypatch.setenv("FLEETSCOPE_API_WORKERS", "0")
    with pytest.raises(ValueError, match="FLEETSCOPE_API_WORKERS=0: expected an integer of at least 1"):
        settings.load()

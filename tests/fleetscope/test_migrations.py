"""Alembic: upgrade to head, downgrade to base, and no drift between models and migrations."""

import datetime as dt

import polars as pl
import pytest
from sqlalchemy import create_engine, inspect

from fleetscope.core import frames as F
from fleetscope.store import Store, db
from fleetscope.store import schema
from fleetscope.settings import load


def _empty_url(request: pytest.FixtureRequest, tmp_path, kind: str) -> str:
    if kind == "sqlite":
        return f"sqlite:///{tmp_path / 'm.db'}"
    url = request.getfixturevalue("pg_url")
    db.downgrade(url, "base") if db.current_revision(create_engine(url)) else None
    return url


@pytest.mark.parametrize("kind", ["sqlite", "postgresql"])
def test_upgrade_head_no_drift_downgrade_base(request, tmp_path, kind):
    url = _empty_url(request, tmp_path, kind)
    db.upgrade(url)
    engine = db.make_engine(url)
    assert db.current_revision(engine) == db.head_revision(url)
    assert set(schema.metadata.tables) <= set(db.table_names(engine))
    assert db.schema_drift(engine) == []
    db.downgrade(url, "base")
    assert db.table_names(engine) == ["alembic_version"]
    assert db.current_revision(engine) is None
    db.upgrade(url)  # and back up again: downgrade left nothing behind that blocks it
    assert db.schema_drift(engine) == []
    engine.dispose()


@pytest.mark.parametrize("kind", ["sqlite", "postgresql"])
def test_0022_drops_the_series_key_of_metric_samples_and_keeps_their_rows(request, tmp_path, kind):
    url = _empty_url(request, tmp_path, kind)
    db.upgrade(url, "0021")

    def foreign_keys() -> list[str]:
        engine = db.make_engine(url)
        try:
            return [fk["referred_table"] for fk in inspect(engine).get_foreign_keys("metric_sample")]
        finally:
            engine.dispose()

    assert foreign_keys() == ["series"]
    t0 = dt.datetime(2026, 6, 1, tzinfo=dt.UTC)
    samples = pl.DataFrame({"ts": [t0, t0 + dt.timedelta(seconds=1)], "series": ['DCGM_FI_X{gpu_uuid="GPU-1"}'] * 2, "value": [1.5, 2.5]})
    store = Store.open(url)
    store.write(F.Batch(source="t", metric_sample=samples))
    store.engine.dispose()
    for revision, keys in (("head", []), ("0021", ["series"]), ("head", [])):
        (db.upgrade if revision == "head" else db.downgrade)(url, revision)
        assert foreign_keys() == keys
        store = Store.open(url)
        got = store.read("metric_sample")
        store.engine.dispose()
        assert got["value"].to_list() == [1.5, 2.5] and got["series"].to_list() == ['DCGM_FI_X{gpu_uuid="GPU-1"}'] * 2


def test_drift_is_detected(tmp_path):
    url = f"sqlite:///{tmp_path / 'd.db'}"
    db.upgrade(url)
    engine = db.make_engine(url)
    with engine.begin() as conn:
        conn.exec_driver_sql("ALTER TABLE gpu ADD COLUMN rogue TEXT")
    assert any("rogue" in repr(d) for d in db.schema_drift(engine))


def test_embedded_default_upgrades_itself(tmp_path, monkeypatch):
    monkeypatch.setenv("FLEETSCOPE_DATA_DIR", str(tmp_path))
    monkeypatch.delenv("FLEETSCOPE_DATABASE_URL", raising=False)
    settings = load()
    assert settings.auto_migrate and settings.is_sqlite
    engine = db.make_engine(settings.database_url)
    db.ensure_schema(settings, engine)
    assert db.current_revision(engine) == db.head_revision(settings.database_url)
    assert (tmp_path / "fleetscope.store.db").exists()
    assert engine.connect().exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"


def test_without_auto_migrate_a_stale_database_is_refused_with_the_fix(tmp_path, monkeypatch):
    monkeypatch.setenv("FLEETSCOPE_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("FLEETSCOPE_AUTO_MIGRATE", "false")
    settings = load()
    engine = db.make_engine(settings.database_url)
    with pytest.raises(RuntimeError, match="fleetscope db upgrade"):
        db.ensure_schema(settings, engine)
    assert db.table_names(engine) == []

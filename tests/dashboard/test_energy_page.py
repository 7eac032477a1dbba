"""The Energy & Carbon page shows location- and market-based CO2e side by side, from the roll-ups and the
recorded contractual instruments (the hand-checked world of tests/fleetscope/test_scope2.py)."""

from __future__ import annotations

import datetime as dt

import polars as pl
import pytest
from streamlit.testing.v1 import AppTest

from fleetscope import energy_service as es
from fleetscope import frames as F
from fleetscope import queries as Q
from fleetscope.store import Store
from tests.dashboard.conftest import APP
from tests.fleetscope.test_scope2 import PPA, SUPPLIER, T0, world


def test_site_carbon_query_and_page(empty_sqlite_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    store = Store.open(empty_sqlite_url)
    world(store)
    es.record_instrument(store, PPA, recorded_by="ana")
    es.record_instrument(store, SUPPLIER, recorded_by="ana")
    # a last reading at 10:00 anchors the page's default 24 h window on the whole 10 hours of energy
    store.write(F.Batch(metric_sample=pl.DataFrame({"ts": [T0 + dt.timedelta(hours=10)], "series": ['grid_intensity_g_per_kwh{site="s1"}'], "value": [400.0]})))
    q = Q.site_carbon(store, T0, T0 + dt.timedelta(hours=10))
    assert q.select("site_id", "energy_kwh", "location_kgco2e", "market_kgco2e", "covered_kwh").rows() == [
        ("s1", pytest.approx(25.0), pytest.approx(10.0), pytest.approx(5.0), pytest.approx(15.0))]
    assert q["instruments"].to_list() == ["ppa-1,ssr-1"] and Q.site_carbon(store, T0, T0 + dt.timedelta(hours=10), site="s2").is_empty()
    store.engine.dispose()

    monkeypatch.setenv("FLEETSCOPE_DATABASE_URL", empty_sqlite_url)
    at = AppTest.from_file(str(APP), default_timeout=60)
    at.run()
    at.switch_page("pages/energy_carbon.py").run()
    assert not at.exception and not at.error
    m = {x.label: x.value for x in at.metric}
    assert (m["Location-based CO2e"], m["Market-based CO2e"], m["Covered by instruments"]) == ("10.0 kg", "5.0 kg", "60%")
    table = next(d.value for d in at.dataframe if "market_kgco2e" in d.value.columns)
    assert table["site_id"].tolist() == ["s1"] and table["market_kgco2e"].iloc[0] == pytest.approx(5.0, rel=1e-6)

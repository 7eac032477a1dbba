"""Market-based Scope 2 beside location-based, from recorded contractual instruments; serving vs training.

The world is small enough to check by hand (GHG Protocol Scope 2 Guidance, ch. 6: market-based = covered
energy × instrument factor + uncovered energy × residual factor). Site s1 has a declared PUE of 1.25, no
meters, and an hourly grid intensity of 400 gCO2e/kWh; two GPUs draw 1 kW each for 10 hours:
GPU energy 20 kWh, facility energy 25 kWh, location-based 25 × 0.400 = 10.0 kg.
"""

import datetime as dt
import json

import httpx
import polars as pl
import pytest

from fleetscope.services import auth
from fleetscope.services import energy as es
from fleetscope.core import frames as F
from fleetscope.core.errors import ValidationError

T0 = dt.datetime(2026, 3, 1, tzinfo=dt.UTC)
KWH = 3.6e6
H = dt.timedelta(hours=1)


def world(store, hours: int = 10) -> None:
    minutes = [T0 + dt.timedelta(minutes=m) for m in range(hours * 60)]
    store.write(F.Batch(
        site=pl.DataFrame({"site_id": ["s1", "s2"], "country": ["FRA", "POL"], "declared_pue": [1.25, None]}),
        host=pl.DataFrame({"host": ["h1", "h2"], "site_id": ["s1", "s2"]}),
        gpu=pl.DataFrame({"gpu_uuid": ["g1", "g2"], "host": ["h1", "h1"]}),
        gpu_energy_minute=pl.DataFrame({"minute": minutes * 2, "gpu_uuid": ["g1"] * len(minutes) + ["g2"] * len(minutes),
                                        "energy_j": [60_000.0] * (2 * len(minutes)), "covered_s": [60.0] * (2 * len(minutes)), "method": "counter"}),
        metric_sample=pl.DataFrame({"ts": [T0 + h * H for h in range(hours)], "series": ['grid_intensity_g_per_kwh{site="s1"}'] * hours,
                                    "value": [400.0] * hours}),
    ))


PPA = {"instrument_id": "ppa-1", "site_id": "s1", "kind": "ppa", "start": T0, "end": T0 + 20 * H, "volume_mwh": 0.010, "g_per_kwh": 0.0,
       "supplier": "Windpark Nord"}
SUPPLIER = {"instrument_id": "ssr-1", "site_id": "s1", "kind": "supplier_specific", "start": T0, "end": T0 + 10 * H, "volume_mwh": 0.010,
            "g_per_kwh": 100.0}


def test_market_based_beside_location_based_by_hand(store):
    world(store)
    es.record_instrument(store, PPA, recorded_by="ana")
    es.record_instrument(store, SUPPLIER, recorded_by="ana")
    out = es.site_carbon(store, "s1", T0, T0 + 10 * H)
    assert out["gpu_energy_j"] == pytest.approx(20 * KWH) and out["pue"] == 1.25 and out["estimate"] is True
    assert out["energy_j"] == pytest.approx(25 * KWH) and "declared PUE" in out["energy_basis"]
    assert out["location_based_kgco2e"] == pytest.approx(25 * 0.400)
    # PPA: 10 kWh over a 20 h term, pro-rated to the 10 h period -> 5 kWh at 0 g; supplier rate: 10 kWh at 100 g;
    # the other 10 kWh at the location-based 400 g (no residual mix ships): 0 + 1.0 + 4.0 kg
    assert out["covered_energy_j"] == pytest.approx(15 * KWH) and out["uncovered_energy_j"] == pytest.approx(10 * KWH)
    assert out["market_based_kgco2e"] == pytest.approx(5 * 0.0 + 10 * 0.100 + 10 * 0.400)
    assert "location-based grid average" in out["uncovered_basis"] and out["market_basis"].startswith("market-based, GHG Protocol")
    assert "hourly" in out["location_basis"]
    used = {i["instrument_id"]: i for i in out["instruments"]}
    assert used["ppa-1"]["covered_energy_j"] == pytest.approx(5 * KWH) and used["ppa-1"]["supplier"] == "Windpark Nord"
    assert used["ssr-1"]["kgco2e"] == pytest.approx(1.0) and used["ssr-1"]["recorded_by"] == "ana"
    # the first 5 hours: 12.5 kWh; PPA 2.5 kWh (5 h of its 20 h), supplier 5 kWh at 100 g, 5 kWh at 400 g
    half = es.site_carbon(store, "s1", T0, T0 + 5 * H)
    assert half["location_based_kgco2e"] == pytest.approx(5.0) and half["market_based_kgco2e"] == pytest.approx(0.5 + 2.0)


def test_without_instruments_or_energy_both_figures_are_still_there(store):
    world(store)
    out = es.site_carbon(store, "s1", T0, T0 + 10 * H)
    assert out["market_based_kgco2e"] == pytest.approx(out["location_based_kgco2e"]) == pytest.approx(10.0)
    assert out["instruments"] == []
    # s2: no GPUs, no PUE: zeros, and the basis says why
    empty = es.site_carbon(store, "s2", T0, T0 + 10 * H)
    assert (empty["energy_j"], empty["location_based_kgco2e"], empty["market_based_kgco2e"]) == (0.0, 0.0, 0.0)
    assert empty["pue"] is None and "no facility meter and no declared PUE" in empty["energy_basis"]
    with pytest.raises(es.NotFound, match="no site 'nowhere'"):
        es.site_carbon(store, "nowhere", T0, T0 + H)


@pytest.mark.parametrize(
    "change, field",
    [
        ({"kind": "carbon_offset"}, "kind"),  # offsets are not Scope 2 instruments
        ({"end": T0}, "end"),
        ({"start": T0.replace(tzinfo=None)}, "start"),
        ({"end": T0 + dt.timedelta(days=366 * 31)}, "end"),
        ({"volume_mwh": 0.0}, "volume_mwh"),
        ({"volume_mwh": float("nan")}, "volume_mwh"),
        ({"volume_mwh": 1e12}, "volume_mwh"),
        ({"volume_mwh": True}, "volume_mwh"),
        ({"g_per_kwh": -1.0}, "g_per_kwh"),
        ({"g_per_kwh": float("inf")}, "g_per_kwh"),
        ({"instrument_id": "ppa 1"}, "instrument_id"),
        ({"instrument_id": "x" * 201}, "instrument_id"),
        ({"supplier": "a\x00b"}, "supplier"),
    ],
)
def test_bad_instruments_name_the_field_and_store_nothing(store, change, field):
    world(store)
    with pytest.raises(ValidationError) as err:
        es.record_instrument(store, {**PPA, **change}, recorded_by="ana")
    assert err.value.field == field and err.value.frame == "energy_instrument"
    assert store.read("energy_instrument").height == 0


def test_an_instrument_counts_for_one_site_only(store):
    world(store)
    assert es.record_instrument(store, PPA, recorded_by="ana")["updated"] is False
    with pytest.raises(es.Conflict, match="already claimed by site 's1'"):
        es.record_instrument(store, {**PPA, "site_id": "s2"}, recorded_by="ana")
    with pytest.raises(es.NotFound, match="no site 'elsewhere'"):
        es.record_instrument(store, {**PPA, "instrument_id": "ppa-2", "site_id": "elsewhere"}, recorded_by="ana")
    assert es.record_instrument(store, {**PPA, "volume_mwh": 0.02}, recorded_by="bo")["updated"] is True
    held = es.instruments(store)
    assert held.select("instrument_id", "site_id", "volume_mwh", "recorded_by").rows() == [("ppa-1", "s1", 0.02, "bo")]
    actions = store.read("audit_log").sort("seq")["action"].to_list()
    assert actions == ["energy_instrument", "energy_instrument"]


# --- HTTP -------------------------------------------------------------------------------------------


def _body(rec: dict) -> dict:
    return {k: (v.isoformat() if isinstance(v, dt.datetime) else v) for k, v in rec.items() if k not in ("instrument_id", "site_id")}


def test_instrument_and_carbon_endpoints(api):
    store = api.app.state.store
    world(store)
    admin = {"Authorization": "Bearer " + auth.create_token(store.engine, "finance", ["admin"])}
    read = {"Authorization": "Bearer " + auth.create_token(store.engine, "r", ["read"])}
    url = api.url + "/api/v1/sites/s1/instruments/"
    r = httpx.put(url + "ppa-1", json=_body(PPA), headers=admin)
    assert r.status_code == 201 and r.json()["recorded_by"] == "finance"
    assert httpx.put(url + "ppa-1", json=_body(PPA), headers=admin).status_code == 200  # re-sent: same row
    assert httpx.put(url + "ssr-1", json=_body(SUPPLIER), headers=admin).status_code == 201
    listed = httpx.get(api.url + "/api/v1/sites/s1/instruments", headers=read).json()
    assert [i["instrument_id"] for i in listed] == ["ppa-1", "ssr-1"]
    window = {"start": T0.isoformat(), "end": (T0 + 10 * H).isoformat()}
    c = httpx.get(api.url + "/api/v1/sites/s1/carbon", params=window, headers=read).json()
    assert c["location_based_kgco2e"] == pytest.approx(10.0) and c["market_based_kgco2e"] == pytest.approx(5.0)
    assert [i["instrument_id"] for i in c["instruments"]] == ["ppa-1", "ssr-1"]
    assert httpx.delete(url + "ssr-1", headers=admin).json()["withdrawn"] is True
    assert httpx.delete(url + "ssr-1", headers=admin).status_code == 404
    c = httpx.get(api.url + "/api/v1/sites/s1/carbon", params=window, headers=read).json()
    assert c["market_based_kgco2e"] == pytest.approx(20 * 0.400)  # 5 kWh at 0 g, 20 kWh at 400 g
    assert [e["action"] for e in store.read("audit_log").sort("seq").to_dicts()] == ["energy_instrument"] * 3 + ["energy_instrument_withdrawn"]


def test_instrument_endpoint_refuses_hostile_input_and_changes_nothing(api):
    store = api.app.state.store
    world(store)
    admin = {"Authorization": "Bearer " + auth.create_token(store.engine, "finance", ["admin"])}
    read = {"Authorization": "Bearer " + auth.create_token(store.engine, "r", ["read"])}
    url = api.url + "/api/v1/sites/s1/instruments/ppa-1"
    good = _body(PPA)
    assert httpx.put(url, json=good).status_code == 401
    assert httpx.put(url, json=good, headers=read).status_code == 403
    assert httpx.delete(url, headers=read).status_code == 403
    cases = [
        ({**good, "kind": "offset"}, 422, "kind"),
        ({**good, "end": good["start"]}, 422, "end"),
        ({**good, "start": "2026-03-01T00:00:00"}, 422, "timezone"),  # naive: which zone is unknown
        ({**good, "start": "yesterday"}, 422, "datetime"),
        ({**good, "volume_mwh": "10"}, 422, "volume_mwh"),
        ({**good, "volume_mwh": True}, 422, "volume_mwh"),
        ({**good, "volume_mwh": 1e300}, 422, "volume_mwh"),
        ({**good, "g_per_kwh": -5}, 422, "g_per_kwh"),
        ({**good, "supplier": "x" * 100_000}, 422, "supplier"),
        ({**good, "site_id": "s2"}, 422, "extra"),  # the site comes from the path only
        ({k: v for k, v in good.items() if k != "g_per_kwh"}, 422, "g_per_kwh"),
        ([good], 422, ""),
    ]
    for body, status, word in cases:
        r = httpx.put(url, json=body, headers=admin)
        assert r.status_code == status, (body, r.text)
        assert word in r.text.lower() or word in r.text, (word, r.text)
    raw = [(b"", 400), (b"{", 400), (b"\xff\xfe", 400), (("[" * 100_000 + "]" * 100_000).encode(), 400),
           (b'{"kind": "ppa", "volume_mwh": NaN}', 422), (json.dumps({**good, "volume_mwh": None}).encode(), 422)]
    for content, status in raw:
        r = httpx.put(url, content=content, headers={**admin, "Content-Type": "application/json"})
        assert r.status_code == status, (content[:40], r.text[:200])
    nan = httpx.put(url, content=json.dumps({**good, "volume_mwh": float("nan")}).encode(), headers={**admin, "Content-Type": "application/json"})
    assert nan.status_code == 422 and "finite" in nan.text
    for bad_id in ("ppa%201", "%00", "x" * 300, "ppa-%C3%A9"):
        assert httpx.put(api.url + f"/api/v1/sites/s1/instruments/{bad_id}", json=good, headers=admin).status_code == 422, bad_id
    assert httpx.put(api.url + "/api/v1/sites/nowhere/instruments/ppa-1", json=good, headers=admin).status_code == 404
    assert store.read("energy_instrument").height == 0 and store.read("audit_log").height == 0
    # the id is taken by s1 now; s2 may not claim it too
    assert httpx.put(url, json=good, headers=admin).status_code == 201
    clash = httpx.put(api.url + "/api/v1/sites/s2/instruments/ppa-1", json=good, headers=admin)
    assert clash.status_code == 409 and "already claimed by site 's1'" in clash.json()["detail"]
    assert store.read("energy_instrument")["site_id"].to_list() == ["s1"]


def test_carbon_endpoint_refuses_bad_windows(api):
    store = api.app.state.store
    world(store, hours=1)
    read = {"Authorization": "Bearer " + auth.create_token(store.engine, "r", ["read"])}
    url = api.url + "/api/v1/sites/s1/carbon"
    start, end = T0.isoformat(), (T0 + H).isoformat()
    assert httpx.get(url, params={"start": start, "end": end}).status_code == 401
    assert httpx.get(url, params={"start": end, "end": start}, headers=read).status_code == 400
    naive = httpx.get(url, params={"start": "2026-03-01T00:00:00", "end": end}, headers=read)
    assert naive.status_code == 400 and "time zone" in naive.json()["detail"]
    assert httpx.get(url, params={"start": "soon", "end": end}, headers=read).status_code == 422
    assert httpx.get(url, params={"start": start}, headers=read).status_code == 422
    assert httpx.get(api.url + "/api/v1/sites/nowhere/carbon", params={"start": start, "end": end}, headers=read).status_code == 404
    assert httpx.get(api.url + "/api/v1/sites/" + "s" * 300 + "/carbon", params={"start": start, "end": end}, headers=read).status_code == 422
    pue = httpx.get(api.url + "/api/v1/sites/s1/pue", params={"start": "2026-03-01T00:00:00", "end": end}, headers=read)
    assert pue.status_code == 400 and "time zone" in pue.json()["detail"]  # was a 404 saying "window: ..."


# --- serving vs training, and the model footprint ---------------------------------------------------

D = dt.timedelta(days=1)


def serving_world(store) -> None:
    """Model m trains on g1 for 10 minutes of day 1 (1 kWh of GPU energy), then serves on g2 0.25 kWh a day on
    days 2-5; model n trains likewise on g3 and serves on g4 on days 2-3 only. Site s1: PUE 1.25 (declared),
    200 g/kWh in every hour that has energy. A GO covers 0.5 kWh of m's training period at 0 g."""
    d1 = T0
    train = [d1 + dt.timedelta(minutes=i) for i in range(10)]
    n_train = [d1 + dt.timedelta(minutes=20 + i) for i in range(10)]
    serve_m = [d1 + k * D for k in range(1, 5)]
    serve_n = [d1 + k * D for k in range(1, 3)]
    minute = pl.DataFrame({
        "minute": train + serve_m + n_train + serve_n,
        "gpu_uuid": ["g1"] * 10 + ["g2"] * 4 + ["g3"] * 10 + ["g4"] * 2,
        "energy_j": [360_000.0] * 10 + [900_000.0] * 4 + [360_000.0] * 10 + [900_000.0] * 2,
        "covered_s": 60.0, "method": "counter",
    })
    hours = sorted({m.replace(minute=0) for m in minute["minute"].to_list()})
    store.write(F.Batch(
        site=pl.DataFrame({"site_id": ["s1"], "country": ["FRA"], "declared_pue": [1.25]}),
        host=pl.DataFrame({"host": ["h1"], "site_id": ["s1"]}),
        gpu=pl.DataFrame({"gpu_uuid": ["g1", "g2", "g3", "g4"], "host": ["h1"] * 4}),
        job=pl.DataFrame({"job_id": ["train-m", "serve-m", "train-n", "serve-n"], "kind": ["training", "inference"] * 2,
                          "model_name": ["m", "m", "n", "n"]}),
        job_rank=pl.DataFrame({"job_id": ["train-m", "serve-m", "train-n", "serve-n"], "rank": [0] * 4,
                               "start": [d1, d1 + D, d1 + dt.timedelta(minutes=20), d1 + D],
                               "end": [d1 + dt.timedelta(minutes=10), None, d1 + dt.timedelta(minutes=30), None],
                               "gpu_uuid": ["g1", "g2", "g3", "g4"]}),
        gpu_energy_minute=minute,
        metric_sample=pl.DataFrame({"ts": hours, "series": ['grid_intensity_g_per_kwh{site="s1"}'] * len(hours), "value": [200.0] * len(hours)}),
    ))
    es.record_instrument(store, {"instrument_id": "go-1", "site_id": "s1", "kind": "go", "start": d1, "end": d1 + dt.timedelta(minutes=10),
                                 "volume_mwh": 0.0005, "g_per_kwh": 0.0}, recorded_by="ana")


def test_serving_crossover_observed_and_projected(store):
    serving_world(store)
    m = es.serving_vs_training(store, "m")
    # facility energy: training 1 kWh × 1.25; serving 0.25 kWh × 1.25 a day: the 4th serving day (day 5) reaches it
    assert m["training_energy_j"] == pytest.approx(1.25 * KWH) and m["serving_energy_j"] == pytest.approx(1.25 * KWH)
    assert (m["crossover_date"], m["crossover_basis"], m["serving_days"]) == ("2026-03-05", "observed", 4)
    assert m["training_kgco2e"] == pytest.approx(1.25 * 0.200) and m["serving_kgco2e"] == pytest.approx(1.25 * 0.200)
    assert m["training_jobs"] == ["train-m"] and m["inference_jobs"] == ["serve-m"] and "declared PUE" in m["energy_basis"]
    n = es.serving_vs_training(store, "n")
    # 0.625 kWh served on days 2-3 at 0.3125 kWh a day; 0.625 kWh to go: 2 more days after day 3
    assert (n["crossover_date"], n["crossover_basis"]) == ("2026-03-05", "projected")
    with pytest.raises(es.NotFound):
        es.serving_vs_training(store, "nobody")


def test_footprint_carries_market_based_beside_location_based(store):
    serving_world(store)
    fp = es.model_footprint(store, "m")
    assert fp["jobs"] == ["train-m"] and fp["energy_j"] == pytest.approx(1.25 * KWH) and fp["estimate"] is True
    assert fp["kgco2e"] == pytest.approx(1.25 * 0.200)
    # m's training period at s1: 1.25 kWh, 0.5 of it covered by the GO at 0 g, 0.75 kWh at 200 g
    assert fp["market_kgco2e"] == pytest.approx(0.75 * 0.200) and "market-based" in fp["market_basis"]
    fn = es.model_footprint(store, "n")
    assert fn["market_kgco2e"] == pytest.approx(fn["kgco2e"]) == pytest.approx(1.25 * 0.200)  # no instrument in n's period


def test_serving_endpoint(api):
    store = api.app.state.store
    serving_world(store)
    read = {"Authorization": "Bearer " + auth.create_token(store.engine, "r", ["read"])}
    r = httpx.get(api.url + "/api/v1/models/n/serving-vs-training", params={"projection_days": 1}, headers=read).json()
    assert (r["crossover_date"], r["crossover_basis"]) == ("2026-03-05", "projected")  # the last day's rate is the same
    assert httpx.get(api.url + "/api/v1/models/n/serving-vs-training").status_code == 401
    assert httpx.get(api.url + "/api/v1/models/nobody/serving-vs-training", headers=read).status_code == 404
    for bad in ({"projection_days": 0}, {"projection_days": "many"}, {"projection_days": 10**9}):
        assert httpx.get(api.url + "/api/v1/models/n/serving-vs-training", params=bad, headers=read).status_code == 422
    assert httpx.get(api.url + "/api/v1/models/" + "m" * 600 + "/serving-vs-training", headers=read).status_code == 422
    fp = httpx.get(api.url + "/api/v1/models/m/footprint", headers=read).json()
    assert fp["kgco2e"] == pytest.approx(0.25) and fp["market_kgco2e"] == pytest.approx(0.15)


def test_energy_verbs_of_the_cli(tmp_path):
    from fleetscope.store import Store
    from tests.fleetscope.test_cli import run

    run(tmp_path, "db", "upgrade")
    st = Store.open(f"sqlite:///{tmp_path / 'fleetscope.store.db'}")
    world(st)
    st.engine.dispose()
    span = ["--start", "2026-03-01T00:00:00Z", "--end", "2026-03-01T20:00:00Z"]
    out = run(tmp_path, "energy", "instrument", "ppa-1", "--site", "s1", "--kind", "ppa", *span, "--mwh", "0.01", "--g-per-kwh", "0", "--by", "ana")
    assert "recorded ppa ppa-1 for s1: 0.01 MWh at 0 g/kWh" in out.stdout
    run(tmp_path, "energy", "instrument", "ssr-1", "--site", "s1", "--kind", "supplier_specific", "--start", "2026-03-01T00:00:00Z",
        "--end", "2026-03-01T10:00:00Z", "--mwh", "0.01", "--g-per-kwh", "100", "--by", "ana")
    listed = json.loads(run(tmp_path, "energy", "instruments", "--site", "s1", "--json").stdout)
    assert [(i["instrument_id"], i["recorded_by"]) for i in listed] == [("ppa-1", "ana"), ("ssr-1", "ana")]
    c = json.loads(run(tmp_path, "energy", "carbon", "s1", "--start", "2026-03-01T00:00:00Z", "--end", "2026-03-01T10:00:00Z", "--json").stdout)
    assert c["location_based_kgco2e"] == pytest.approx(10.0) and c["market_based_kgco2e"] == pytest.approx(5.0)
    text = run(tmp_path, "energy", "carbon", "s1", "--start", "2026-03-01T00:00:00Z", "--end", "2026-03-01T10:00:00Z").stdout
    assert "location-based 10.000 kgCO2e" in text and "market-based   5.000 kgCO2e (15.000 kWh covered by 2 instrument(s)" in text
    bad = run(tmp_path, "energy", "instrument", "x-1", "--site", "s1", "--kind", "offset", *span, "--mwh", "1", "--g-per-kwh", "0", "--by", "a", check=False)
    assert bad.returncode == 1 and "field 'kind'" in bad.stderr and "Traceback" not in bad.stderr
    naive = run(tmp_path, "energy", "carbon", "s1", "--start", "2026-03-01T00:00:00", "--end", "2026-03-02T00:00:00Z", check=False)
    assert naive.returncode == 2 and "time zone" in naive.stderr
    assert run(tmp_path, "energy", "withdraw", "s1", "ssr-1", "--by", "ana").stdout.startswith("withdrew ssr-1")
    assert run(tmp_path, "energy", "withdraw", "s1", "ssr-1", "--by", "ana", check=False).returncode == 1
    assert "no training or inference job" in run(tmp_path, "energy", "serving", "m", check=False).stderr

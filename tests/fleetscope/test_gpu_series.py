"""One GPU's history (``telemetry.gpu_field_series`` / ``gpu_series``, ``GET /api/v1/gpus/{uuid}/series``,
``fleetscope fleet gpu``): two GPUs sampled three times a minute with values whose minimum, maximum, mean and last
per minute and per hour follow by hand; raw samples for a short window, the minute and hour tiers for long ones,
the buckets past a tier's watermark rolled from raw; the same answer from the service, the API and the CLI; and
hostile input refused by name, with nothing reaching SQL unchecked."""

from __future__ import annotations

import datetime as dt
import json
import os
import urllib.parse

import httpx
import polars as pl
import pytest

from fleetscope.core import frames as F
from fleetscope.core.errors import NotFound, ValidationError
from fleetscope.services import auth, telemetry, tiers
from tests.clirun import cli

T0 = dt.datetime(2026, 11, 2, 9, 0, tzinfo=dt.UTC)
M = dt.timedelta(minutes=1)
MINUTES = 130
A, B, IDLE = "GPU-aaaa", "GPU-bbbb", "GPU-idle"  # A and IDLE in the inventory; B only sampled; IDLE never sampled
END = T0 + MINUTES * M


def value(gpu: str, field: str, m: int, s: int) -> float | None:
    """The sample of ``gpu`` at minute ``m``, second ``20 * s`` (s = 0, 1, 2)."""
    if gpu == A:
        return {"temp_c": 40.0 + s, "power_w": 200.0 + m + 10 * s}[field]
    # B's temperature is missing from every third sample: a minute's last is its second sample's
    return {"temp_c": None if s == 2 else 60.0 + s, "power_w": 500.0 - m - 5 * s}[field]


def minute_want(gpu: str, field: str, m: int) -> tuple[float, float, float, float]:
    """(min, max, mean, last) of minute ``m``, by hand from ``value``: A's temperature 40, 41, 42 → (40, 42, 41, 42);
    A's power 200 + m + (0, 10, 20) → (200 + m, 220 + m, 210 + m, 220 + m); B's temperature 60, 61, - → (60, 61, 60.5, 61);
    B's power 500 - m - (0, 5, 10) → (490 - m, 500 - m, 495 - m, 490 - m)."""
    return {(A, "temp_c"): (40.0, 42.0, 41.0, 42.0), (A, "power_w"): (200.0 + m, 220.0 + m, 210.0 + m, 220.0 + m),
            (B, "temp_c"): (60.0, 61.0, 60.5, 61.0), (B, "power_w"): (490.0 - m, 500.0 - m, 495.0 - m, 490.0 - m)}[(gpu, field)]


def seed(store) -> None:  # type: ignore[no-untyped-def]
    rows = [{"ts": T0 + m * M + dt.timedelta(seconds=20 * s), "gpu_uuid": g, "temp_c": value(g, "temp_c", m, s),
             "power_w": value(g, "power_w", m, s), "util_ratio": 0.5}
            for m in range(MINUTES) for s in range(3) for g in (A, B)]
    store.write(F.Batch(host=F.conform(F.HOST, pl.DataFrame([{"host": "n1"}])),
                        gpu=F.conform(F.GPU, pl.DataFrame([{"gpu_uuid": A, "host": "n1", "gpu_index": 0}, {"gpu_uuid": IDLE, "host": "n1", "gpu_index": 1}])),
                        gpu_sample=F.conform(F.GPU_SAMPLE, pl.DataFrame(rows))))
    # beat rolled the minutes up to minute 125 and the hours up to 11:00; minutes 125-129 and the hour under way are not rolled
    tiers.advance(store, T0 + 125 * M + tiers.SETTLE)
    assert tiers.watermark(store, "minute") == T0 + 125 * M and tiers.watermark(store, "hour") == T0 + 120 * M


def rows_of(df: pl.DataFrame, field: str) -> list[dict]:
    return df.filter(pl.col("field") == field).to_dicts()


def test_a_short_window_reads_each_raw_sample(store) -> None:  # type: ignore[no-untyped-def]
    seed(store)
    df = telemetry.gpu_field_series(store, A, ["temp_c", "power_w"], T0 + 5 * M, T0 + 65 * M)
    assert df.columns == ["field", "ts", "samples", "min", "max", "mean", "last", "tier", "from_raw"]
    assert df["tier"].unique().to_list() == ["raw"] and df["from_raw"].all()
    assert df["field"].to_list() == ["temp_c"] * 180 + ["power_w"] * 180  # fields in the order asked, each by time
    first = rows_of(df, "power_w")[:3]
    assert [(r["ts"], r["min"], r["max"], r["mean"], r["last"], r["samples"]) for r in first] == [
        (T0 + 5 * M, 205.0, 205.0, 205.0, 205.0, 1), (T0 + 5 * M + dt.timedelta(seconds=20), 215.0, 215.0, 215.0, 215.0, 1),
        (T0 + 5 * M + dt.timedelta(seconds=40), 225.0, 225.0, 225.0, 225.0, 1)]
    for r in df.iter_rows(named=True):
        offset = int((r["ts"] - T0).total_seconds())
        assert r["mean"] == value(A, r["field"], offset // 60, offset % 60 // 20)
    # B's missing temperatures are null samples, not zeros
    b = telemetry.gpu_field_series(store, B, "temp_c", T0, T0 + M)
    assert b["mean"].to_list() == [60.0, 61.0, None]


def test_a_day_reads_the_minute_tier_and_rolls_the_minutes_past_its_watermark_from_raw(store) -> None:  # type: ignore[no-untyped-def]
    seed(store)
    for gpu in (A, B):
        df = telemetry.gpu_field_series(store, gpu, ("power_w", "temp_c"), END - dt.timedelta(days=1), END)
        assert df["tier"].unique().to_list() == ["minute"]
        for field in ("power_w", "temp_c"):
            got = rows_of(df, field)
            assert [r["ts"] for r in got] == [T0 + m * M for m in range(MINUTES)]
            assert [(r["min"], r["max"], r["mean"], r["last"]) for r in got] == [minute_want(gpu, field, m) for m in range(MINUTES)]
            assert [r["samples"] for r in got] == [3] * MINUTES
            # minutes 0-124 from the tier, 125-129 (past its watermark) rolled here from raw samples
            assert [r["from_raw"] for r in got] == [False] * 125 + [True] * 5


def test_a_month_reads_the_hour_tier_and_the_hour_under_way_from_raw(store) -> None:  # type: ignore[no-untyped-def]
    seed(store)
    df = telemetry.gpu_field_series(store, A, ["power_w", "temp_c"], END - dt.timedelta(days=30), END)
    assert df["tier"].unique().to_list() == ["hour"]
    power = rows_of(df, "power_w")
    # hour 0: minutes 0-59, power 200 + m + (0, 10, 20): min 200, max 279, mean 210 + 29.5, last 279;
    # hour 1: 260, 339, 299.5, 339; the hour under way (minutes 120-129, not rolled): 320, 349, 334.5, 349
    assert [(r["ts"], r["samples"], r["min"], r["max"], r["mean"], r["last"], r["from_raw"]) for r in power] == [
        (T0, 180, 200.0, 279.0, 239.5, 279.0, False), (T0 + 60 * M, 180, 260.0, 339.0, 299.5, 339.0, False),
        (T0 + 120 * M, 30, 320.0, 349.0, 334.5, 349.0, True)]
    assert [(r["min"], r["max"], r["mean"], r["last"]) for r in rows_of(df, "temp_c")] == [(40.0, 42.0, 41.0, 42.0)] * 3
    b = telemetry.gpu_field_series(store, B, "power_w", END - dt.timedelta(days=30), END)
    # B: 500 - m - (0, 5, 10): hour 0 min 431, max 500, mean 495 - 29.5, last 431
    assert [(r["min"], r["max"], r["mean"], r["last"]) for r in b.to_dicts()] == [
        (431.0, 500.0, 465.5, 431.0), (371.0, 440.0, 405.5, 371.0), (361.0, 380.0, 370.5, 361.0)]


def test_a_read_past_its_point_budget_is_refused_not_cut(store) -> None:  # type: ignore[no-untyped-def]
    seed(store)
    # 180 raw samples of each of two fields in the hour: 360 points
    assert telemetry.gpu_field_series(store, A, ["temp_c", "power_w"], T0, T0 + 60 * M, max_points=360).height == 360
    with pytest.raises(telemetry.TooManyPoints, match="shorter window or fewer fields"):
        telemetry.gpu_field_series(store, A, ["temp_c", "power_w"], T0, T0 + 60 * M, max_points=359)
    with pytest.raises(telemetry.TooManyPoints):
        telemetry.gpu_field_series(store, A, "temp_c", END - dt.timedelta(days=1), END, max_points=100)


@pytest.mark.parametrize("fields", [["temp_c; DROP TABLE gpu"], ["ts"], ["gpu_uuid"], ["temp_c", "power_w) FROM gpu --"], [],
                                    ["x" * 10_000], [f.name for f in F.GPU_FIELDS[:9]]])
def test_field_names_are_checked_before_any_sql(store, fields) -> None:  # type: ignore[no-untyped-def]
    seen: list[str] = []
    real = store.query
    store.query = lambda sql, *a, **k: (seen.append(sql), real(sql, *a, **k))[1]  # type: ignore[method-assign]
    with pytest.raises(ValidationError) as exc:
        telemetry.gpu_field_series(store, A, fields, T0, END)
    assert seen == [] and exc.value.frame == "gpu_sample" and len(str(exc.value)) < 1_000


def get(api, path: str, **params):  # type: ignore[no-untyped-def]
    h = {"Authorization": "Bearer " + auth.create_token(api.app.state.store.engine, "reader", ["read"])}
    return httpx.get(api.url + path, params=params, headers=h, timeout=60)


def run_cli(store, tmp_path, *args):  # type: ignore[no-untyped-def]
    env = {**os.environ, "FLEETSCOPE_DATABASE_URL": store.engine.url.render_as_string(hide_password=False), "FLEETSCOPE_DATA_DIR": str(tmp_path)}
    return cli("fleet", "gpu", *args, env=env)


@pytest.mark.parametrize("span", [dt.timedelta(hours=1), dt.timedelta(days=1), dt.timedelta(days=30)], ids=["raw", "minute", "hour"])
def test_service_api_and_cli_give_one_answer(api, tmp_path, span) -> None:  # type: ignore[no-untyped-def]
    store = api.app.state.store
    seed(store)
    start = END - span
    want = telemetry.gpu_series(store, A, ["temp_c", "power_w"], start, END, max_days=1095)
    assert want["tier"] == {dt.timedelta(hours=1): "raw", dt.timedelta(days=1): "minute", dt.timedelta(days=30): "hour"}[span]
    assert want["in_inventory"] and want["fields"] == ["temp_c", "power_w"] and want["points"] == len(want["series"]) > 0
    frame = telemetry.gpu_field_series(store, A, ["temp_c", "power_w"], start, END)
    assert [{**r, "ts": r["ts"].isoformat()} for r in frame.to_dicts()] == want["series"]
    want = json.loads(json.dumps(want))
    r = get(api, f"/api/v1/gpus/{A}/series", field=["temp_c", "power_w"], start=start.isoformat(), end=END.isoformat())
    assert r.status_code == 200, r.text
    assert r.json() == want and r.headers["X-Row-Count"] == str(want["points"])
    proc = run_cli(store, tmp_path, A, "--field", "temp_c", "--field", "power_w", "--start", start.isoformat(), "--end", END.isoformat(), "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == want
    text = run_cli(store, tmp_path, A, "--field", "temp_c", "--field", "power_w", "--start", start.isoformat(), "--end", END.isoformat()).stdout
    assert text.splitlines()[0].startswith(f"{A}: {start.isoformat()} to {END.isoformat()}, one row a")
    assert text.splitlines()[1].split() == ["field", "time", "(UTC)", "samples", "min", "max", "mean", "last", "from"]
    last = text.splitlines()[-1].split()
    tail = want["series"][-1]
    assert last[0] == "power_w" and [float(v) for v in last[4:8]] == [tail["min"], tail["max"], tail["mean"], tail["last"]]


def test_gpus_the_inventory_or_the_samples_know_and_unknown_ones(api, tmp_path) -> None:  # type: ignore[no-untyped-def]
    store = api.app.state.store
    seed(store)
    window = {"start": (END - dt.timedelta(hours=1)).isoformat(), "end": END.isoformat()}
    sampled_only = get(api, f"/api/v1/gpus/{B}/series", **window).json()
    assert sampled_only["in_inventory"] is False and sampled_only["fields"] == list(telemetry.DEFAULT_SERIES_FIELDS)
    assert sampled_only["points"] == 3 * 180  # three default fields, 180 samples of each in the hour
    idle = get(api, f"/api/v1/gpus/{IDLE}/series", **window).json()
    assert idle["in_inventory"] is True and idle["series"] == []  # in the inventory, silent: an empty history, not a 404
    assert "no samples in this window" in run_cli(store, tmp_path, IDLE, "--start", window["start"], "--end", window["end"]).stdout
    for uuid in ("GPU-nope", "GPU-aaaa' OR '1'='1", "GPU-aaaa%", "GPU-a;DROP TABLE gpu", "GPU-aaaa\\"):
        r = get(api, f"/api/v1/gpus/{urllib.parse.quote(uuid, safe='')}/series", **window)
        assert r.status_code == 404 and "no sample names it" in r.json()["detail"], r.text
        proc = run_cli(store, tmp_path, uuid, "--start", window["start"], "--end", window["end"])
        assert proc.returncode == 1 and "no sample names it" in proc.stderr and "Traceback" not in proc.stderr
    with pytest.raises(NotFound):
        telemetry.gpu_series(store, "GPU-nope", ["temp_c"], T0, END, max_days=1095)
    for uuid in ("G" * 129, "GPU-\x01", "GPU-\x00"):  # over-long, control characters (a NUL is no text to PostgreSQL)
        r = get(api, f"/api/v1/gpus/{urllib.parse.quote(uuid, safe='')}/series", **window)
        assert r.status_code == 422, r.text
        proc = run_cli(store, tmp_path, uuid, "--start", window["start"], "--end", window["end"])
        assert proc.returncode == 1 and "not a GPU UUID" in proc.stderr, proc.stderr
    assert store.read("gpu").height == 2 and store.read("gpu_sample").height == 2 * 3 * MINUTES  # nothing dropped


HOUR = {"start": (END - dt.timedelta(hours=1)).isoformat(), "end": END.isoformat()}


@pytest.mark.parametrize("params, status, words, cli_words", [
    ({"field": ["temp_c; DROP TABLE gpu"]}, 422, "field 'temp_c; DROP TABLE gpu': no such GPU field", "field 'temp_c; DROP TABLE gpu'"),
    ({"field": ["temp_c", "nope"]}, 422, "field 'nope'", "field 'nope'"),
    ({"field": [f.name for f in F.GPU_FIELDS[:9]]}, 422, "9 fields asked, at most 8", "at most 8"),
    ({"field": ["x" * 10_000]}, 422, "field '" + "x" * 64 + "': no such GPU field", "no such GPU field"),
    ({"end": HOUR["start"]}, 400, "end must be after start", "end must be after start"),
    ({"start": END.isoformat(), "end": (END - M).isoformat()}, 400, "end must be after start", "end must be after start"),
    ({"start": "2026-11-02T09:00:00"}, 400, "start needs a time zone", "needs a time zone"),
    ({"start": (END - dt.timedelta(days=1096)).isoformat()}, 400, "the longest the tiers serve is 1,095", "the longest the tiers serve is 1,095"),
    ({"start": "yesterday"}, 422, "datetime", "is not an RFC 3339 time"),
])
def test_bad_fields_and_windows_are_refused_by_name(api, tmp_path, params, status, words, cli_words) -> None:  # type: ignore[no-untyped-def]
    store = api.app.state.store
    seed(store)
    query = {**HOUR, **params}
    r = get(api, f"/api/v1/gpus/{A}/series", **query)
    assert r.status_code == status and words in r.text, r.text
    args = [A, "--start", query["start"], "--end", query["end"]]
    for f in params.get("field", []):
        args += ["--field", f]
    proc = run_cli(store, tmp_path, *args)
    assert proc.returncode != 0 and cli_words in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


def test_too_many_points_is_a_clear_refusal(api, tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    store = api.app.state.store
    seed(store)
    monkeypatch.setattr(telemetry, "MAX_SERIES_POINTS", 100)  # an hour of raw samples is 180 points of one field
    r = get(api, f"/api/v1/gpus/{A}/series", field="temp_c", **HOUR)
    assert r.status_code == 400 and "ask for a shorter window or fewer fields" in r.json()["detail"]
    proc = run_cli(store, tmp_path, A, "--field", "temp_c", "--start", HOUR["start"], "--end", HOUR["end"])
    assert proc.returncode == 1 and "ask for a shorter window or fewer fields" in proc.stderr


def test_the_verb_says_how_to_use_it(tmp_path) -> None:  # type: ignore[no-untyped-def]
    out = cli("fleet", "gpu", "--help", env={**os.environ, "FLEETSCOPE_DATA_DIR": str(tmp_path)}).stdout
    assert "Examples:" in out and "fleetscope fleet gpu GPU-" in out and "--field FIELD" in out and "--since" in out
    assert "fleetscope fleet gpu GPU-" in cli("fleet", "--help", env={**os.environ, "FLEETSCOPE_DATA_DIR": str(tmp_path)}).stdout

import datetime as dt

import polars as pl
import pytest

from fleetscope.core import frames as F
from fleetscope.core.errors import ValidationError

T0 = dt.datetime(2026, 3, 1, 12, tzinfo=dt.UTC)


def test_conform_casts_fills_defaults_and_dedupes_by_key():
    df = pl.DataFrame(
        {
            "ts": ["2026-03-01T12:00:00Z", "2026-03-01T13:00:00+01:00", "2026-03-01T12:00:00Z"],
            "gpu_uuid": ["GPU-a", "GPU-a", "GPU-b"],
            "kind": ["xid", "xid", "ecc"],
            "code": [79, 79, None],
        }
    )
    out = F.conform(F.HEALTH_EVENT, df)
    # 13:00+01:00 is 12:00Z: the same key as row 0, so telemetry keeps the first copy.
    assert out.height == 2
    assert out.schema["ts"] == F.UTC_US
    assert out["ts"].to_list() == [T0, T0]
    assert out["host"].to_list() == ["", ""]  # key default for "no host"
    assert out["code"].to_list() == [79, 0]
    assert out.columns == list(F.HEALTH_EVENT.names)


def test_conform_update_frames_keep_the_last_copy():
    df = pl.DataFrame({"gpu_uuid": ["g", "g"], "host": ["old", "new"]})
    assert F.conform(F.GPU, df)["host"].to_list() == ["new"]


def test_naive_and_foreign_datetimes_become_utc():
    naive = pl.DataFrame({"ts": [dt.datetime(2026, 3, 1, 12)], "gpu_uuid": ["g"]})
    tokyo = pl.DataFrame({"ts": [dt.datetime(2026, 3, 1, 21)], "gpu_uuid": ["g"]}).with_columns(
        pl.col("ts").dt.replace_time_zone("Asia/Tokyo")
    )
    assert F.conform(F.GPU_SAMPLE, naive)["ts"][0] == T0
    assert F.conform(F.GPU_SAMPLE, tokyo)["ts"][0] == T0


@pytest.mark.parametrize(
    ("frame", "data", "row", "field", "words"),
    [
        (F.GPU_SAMPLE, {"ts": ["2026-03-01T12:00:00Z", "yesterday"], "gpu_uuid": ["a", "b"]}, 1, "ts", "not a valid UTC timestamp"),
        (F.GPU_SAMPLE, {"ts": ["2026-03-01T12:00:00Z"], "gpu_uuid": [None]}, 0, "gpu_uuid", "missing value"),
        (F.GPU_SAMPLE, {"ts": ["2026-03-01T12:00:00Z"] * 3, "gpu_uuid": ["a", "b", "c"], "power_w": ["1", "2", "x"]}, 2, "power_w", "'x'"),
        (F.GPU_SAMPLE, {"ts": ["2026-03-01T12:00:00Z"], "gpu_uuid": ["a"], "power_w": [float("inf")]}, 0, "power_w", "finite"),
        (F.GPU_SAMPLE, {"ts": ["2026-03-01T12:00:00Z"], "gpu_uuid": ["a"], "xid_last": [79.5]}, 0, "xid_last", "not an integer"),
        (F.GPU_SAMPLE, {"ts": ["2026-03-01T12:00:00Z"], "gpu_uuid": [7]}, 0, "gpu_uuid", "expected text"),
        (F.GPU_SAMPLE, {"ts": ["2026-03-01T12:00:00Z"], "gpu_uuid": ["a\x00b"]}, 0, "gpu_uuid", "NUL"),
        (F.STEP, {"job_id": ["j"], "rank": [0], "step": [1], "start": ["2026-03-01T12:00:00Z"]}, 0, "end", "missing required column"),
        # an energy minute inside a minute: packing keeps a minute's offset in its hour, and would round it
        (F.GPU_ENERGY_MINUTE, {"minute": ["2026-03-01T12:00:00Z", "2026-03-01T12:01:30Z"], "gpu_uuid": ["a", "a"]}, 1, "minute",
         "2026-03-01 12:01:30+00:00 is not the start of a 60-second period"),
    ],
)
def test_conform_names_the_bad_row_and_field(frame, data, row, field, words):
    with pytest.raises(ValidationError) as err:
        F.conform(frame, pl.DataFrame(data))
    assert err.value.frame == frame.name
    assert err.value.row == row
    assert err.value.field == field
    assert words in str(err.value)


def test_conform_rejects_unknown_columns():
    with pytest.raises(ValidationError, match="unknown column") as err:
        F.conform(F.GPU_SAMPLE, pl.DataFrame({"ts": [T0], "gpu_uuid": ["a"], "powr_w": [1.0]}))
    assert err.value.field == "powr_w"


def test_from_records_checks_json_types():
    recs = [{"ts": "2026-03-01T12:00:00Z", "gpu_uuid": "a", "power_w": 300}, {"ts": "2026-03-01T12:00:01Z", "gpu_uuid": "a", "xid_last": 79.0}]
    out = F.conform(F.GPU_SAMPLE, F.from_records(F.GPU_SAMPLE, recs))
    assert out["power_w"].to_list() == [300.0, None]
    assert out["xid_last"].to_list() == [None, 79]
    for bad, row, field in (
        ([{"ts": "2026-03-01T12:00:00Z", "gpu_uuid": "a"}, "nope"], 1, None),
        ([{"ts": 1700000000, "gpu_uuid": "a"}], 0, "ts"),
        ([{"ts": "2026-03-01T12:00:00Z", "gpu_uuid": "a", "xid_last": True}], 0, "xid_last"),
        ([{"ts": "2026-03-01T12:00:00Z", "gpu_uuid": "a", "bogus": 1}], 0, "bogus"),
    ):
        with pytest.raises(ValidationError) as err:
            F.from_records(F.GPU_SAMPLE, bad)
        assert (err.value.row, err.value.field) == (row, field)


def test_series_key_is_canonical_and_escapes_like_prometheus():
    assert F.series_key("facility_power_w", {"site": "a", "meter": 'm"1\n'}) == 'facility_power_w{meter="m\\"1\\n",site="a"}'
    assert F.series_key("x", {}) == "x"


def test_batch_counts_values_and_merges():
    a = F.Batch(source="a", gpu_sample=pl.DataFrame({"ts": [T0, T0], "gpu_uuid": ["a", "b"], "power_w": [1.0, None], "temp_c": [30.0, 31.0]}))
    b = F.Batch(source="b", metric_sample=pl.DataFrame({"ts": [T0], "series": ["p"], "value": [1.0]}))
    assert a.values() == 3  # nulls are not values
    m = a.merge(b)
    assert m.rows() == {"gpu_sample": 2, "metric_sample": 1}
    assert m.values() == 4


def test_every_frame_key_is_declared_not_null():
    for spec in F.FRAMES.values():
        assert spec.key, spec.name
        for name in spec.key:
            assert not spec.col(name).nullable

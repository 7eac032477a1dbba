

def test_usage_over_time_adds_up_to_the_period(teams_world: World) -> None:
    """The chart's buckets: each team's GPU-hours per half hour sum to its GPU-hours over the whole range."""
    store = Store.open(teams_world.url)
    end = teams_world.end
    start = end - dt.timedelta(hours=24)
    try:
        over = teams_svc.usage_over_time(store, start=start, end=end, step_s=1800)
        total = teams_svc.usage(store, start=start, end=end)
        with pytest.raises(teams_svc.ValidationError, match="more than 400 buckets"):
            teams_svc.usage_over_time(store, start=start, end=end, step_s=60)
        with pytest.raises(teams_svc.ValidationError, match="end must be after start"):
            teams_svc.usage_over_time(store, start=end, end=start, step_s=1800)
    finally:
        store.engine.dispose()
    summed = dict(over.group_by("team").agg(pl.col("gpu_hours").sum()).iter_rows())
    assert summed == pytest.approx(dict(total.select("team", "gpu_hours").iter_rows()), rel=1e-9)
    # the inference pods started an hour before the showcase, so they fill the buckets from 11:00 on
    assert over.filter(pl.col("team") == "inference")["bucket_start"].min() == SEED_START - dt.timedelta(hours=1)
    vision = over.filter(pl.col("team") == "vision")
    assert vision["gpu_cost"].sum() == pytest.approx(vision["gpu_hours"].sum() * GPU_HOUR_PRICE["site-b"], rel=1e-9)

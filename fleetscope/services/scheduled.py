"""When the fleet's analyses run: the beat entry of each cadence and the scheduled analyses' registry.

Per job (``services.jobs.JOB``) and per fleet window (``services.health.WINDOW``) each have one beat entry,
``JOB_BEAT`` and ``WINDOW_BEAT``. The fleet analyses with a window and a clock of their own are registered in
``SCHEDULED``, each with its entry, the task that entry sends and when, and the service function the task
runs. Beat's schedule for all of them (``worker/app.py``), the worker's tasks for the scheduled ones
(``worker/tasks.py``) and the catalog (``services.catalog``) are built from here.

Adding a scheduled analysis: its pure module in ``analyzers/`` (or ``governance/``), the service function that
reads and writes the store, ``fn(store, settings, **args) -> dict`` with the JSON-able keyword arguments an
operator re-runs it with, and a ``SCHEDULED.register`` here naming it (and, for one split over shards of
hosts, its ``Shards``). The worker makes its Celery task, and its shards', from the registration.

Beat loads this module when it starts, so it names functions, modules and tables as text and imports no
analyzer: a task's service loads when the task runs. Entry and task names are kept in the database
(``beat_entry``, the last send of each, which a new leader resumes from), in ``task_run`` and in operators'
dashboards: they do not change.
"""

from __future__ import annotations

import datetime as dt

from celery.schedules import crontab

from fleetscope.services.analysis import Beat, Shards, Timetable

JOB_BEAT = Beat("analyze-active-jobs", "fleetscope.analyze_active_jobs", every_s=60.0)
"""Queues the per-job analyses of every job with new steps or events, each incremental from its watermark."""
WINDOW_BEAT = Beat("health-window", "fleetscope.health_window", every_s=300.0)
"""The health sweep: the per-window analyses over the last window (per shard of hosts when sharded)."""

SCHEDULED = Timetable("scheduled")

SCHEDULED.register(
    "energy_rollup", beat=Beat("energy-rollup", "fleetscope.energy_rollup", every_s=60.0),
    run="fleetscope.services.energy_rollup:scheduled_rollup",
    # One task per shard of hosts rolls its GPUs' minutes, on whichever workers are free; the per-site and
    # per-job sums then read those minutes back.
    shards=Shards("fleetscope.energy_rollup_shard", args="fleetscope.services.energy_rollup:rollup_args",
                  run="fleetscope.services.energy_rollup:scheduled_rollup_shard", fleet="fleetscope.services.energy_rollup:scheduled_rollup_sums"),
    modules=("analyzers.energy", "analyzers.facility"), reads=("gpu_sample", "gpu", "host", "site", "job_rank", "metric_sample"),
    writes=("gpu_energy_minute", "site_energy_minute", "job_energy_minute", "metric_sample"),
    summary="per-minute energy per GPU, site and job over the last ten closed minutes (late scrapes counted), "
            "the sites' measured PUE")
SCHEDULED.register(
    "tier_rollup", beat=Beat("tier-rollup", "fleetscope.tier_rollup", every_s=60.0),
    run="fleetscope.services.tiers:scheduled_advance",
    modules=("analyzers.tiers",), reads=("gpu_sample", "gpu_sample_minute", "rollup_watermark"),
    writes=("gpu_sample_minute", "gpu_sample_hour", "rollup_watermark"),
    summary="GPU telemetry's minute tier from raw and hour tier from minutes, from each tier's watermark")
# Every five minutes: an hour is rolled once the hour tier has it and SETTLE has passed; each tick also heals the
# last week's jobs whose scheduler record changed after their hours were rolled.
SCHEDULED.register(
    "job_usage_rollup", beat=Beat("job-usage-rollup", "fleetscope.job_usage_rollup", every_s=300.0),
    run="fleetscope.services.job_usage:scheduled_advance",
    modules=("analyzers.job_usage",), reads=("sched_job", "sched_job_node", "gpu", "gpu_sample_hour", "rollup_watermark"),
    writes=("job_usage_hour", "rollup_watermark"),
    summary="each scheduler job's GPU utilisation and power per hour from the hour tier, for team costs over long periods")
# Hourly: a day becomes packable an hour after it ends (services.packing.GRACE), and so does an hour of the day
# under way (HOUR_GRACE).
SCHEDULED.register(
    "raw_packing", beat=Beat("raw-packing", "fleetscope.raw_packing", crontab="40 * * * *"),
    run="fleetscope.services.packing:scheduled_pack",
    modules=(), reads=("gpu_sample", "rollup_watermark", "gpu_energy_minute"), writes=("gpu_sample", "gpu_energy_minute"),
    summary="PostgreSQL: raw GPU telemetry, an hour at a time once the tiers have passed it (the day under way too), and "
            "closed days of the per-GPU energy minutes, packed into per-GPU hourly rows of compressed column arrays, which every read unpacks")
# A few minutes past the hour, once the last hourly window has closed and its late pushes landed.
SCHEDULED.register(
    "model_monitoring", beat=Beat("model-monitoring", "fleetscope.model_monitoring", crontab="7 * * * *"),
    run="fleetscope.services.monitoring:scheduled_evaluate",
    modules=("governance.monitoring", "governance.fairness_depth"),
    reads=("model_prediction", "model_outcome", "monitoring_window", "finding"), writes=("monitoring_window", "finding"),
    summary="post-market monitoring (AI Act Art. 72): each deployed model version's hourly windows of the last two "
            "days against its reference: accuracy, drift, fairness")
SCHEDULED.register(
    "serving_window", beat=Beat("serving-window", "fleetscope.serving_window", every_s=300.0),
    run="fleetscope.services.serving:scheduled_window",
    modules=("analyzers.serving_saturation", "analyzers.serving_replicas", "analyzers.slo"),
    reads=("serving_gauge", "serving_counter", "serving_bucket", "serving_slo"), writes=("finding",),
    summary="serving saturation, slow replicas and SLO burn rates over the last window")
# The month just closed, once its last jobs' accounting has arrived.
SCHEDULED.register(
    "teams_showback", beat=Beat("teams-showback", "fleetscope.teams_showback", crontab="30 2 1 * *"),
    run="fleetscope.services.team_costs:scheduled_showback",
    modules=("analyzers.chargeback", "analyzers.carbon"),
    reads=("sched_job", "team_mapping", "price_book", "job_energy_minute", "site"), writes=(),
    files=("reports/showback-MONTH.csv", "reports/showback-MONTH.pdf"),
    summary="the month just closed per team: GPU-hours, energy, CO2e and cost, as CSV and PDF")


def beats() -> list[Beat]:
    """Every analysis beat entry: per job, per window, then the scheduled ones in registration order."""
    return [JOB_BEAT, WINDOW_BEAT, *(a.beat for a in SCHEDULED)]


def crontab_of(spec: str, what: str = "FLEETSCOPE_REPORT_SCHEDULE") -> crontab:
    """A five-field crontab string ("minute hour day-of-month month day-of-week", UTC) as Celery's schedule."""
    parts = spec.split()
    if len(parts) != 5:
        raise ValueError(f"{what}={spec!r}: expected five crontab fields, e.g. '0 6 * * 1'")
    m, h, dom, mon, dow = parts
    return crontab(minute=m, hour=h, day_of_month=dom, month_of_year=mon, day_of_week=dow)


def next_fire(spec: str, after: dt.datetime, what: str = "FLEETSCOPE_REPORT_SCHEDULE") -> dt.datetime:
    """The first minute after ``after`` (UTC) at which beat sends a ``spec`` entry. Celery's crontab asks
    for the month, the day of the month and the day of the week all to match (Vixie cron takes either day
    field), so this does too. ``ValueError`` for a malformed spec, or one matching no day of the next 28 years
    (the calendar's weekdays repeat within that, so it never fires: Celery refuses 30 February itself)."""
    c = crontab_of(spec, what)
    t = after.astimezone(dt.UTC).replace(second=0, microsecond=0) + dt.timedelta(minutes=1)
    hours, minutes = sorted(c.hour), sorted(c.minute)
    for _ in range(28 * 366):
        # isoweekday: Monday 1 .. Sunday 7; crontab's day of week: Sunday 0 .. Saturday 6
        if t.month in c.month_of_year and t.day in c.day_of_month and t.isoweekday() % 7 in c.day_of_week:
            for h in hours:
                for m in minutes:
                    at = t.replace(hour=h, minute=m)
                    if at >= t:
                        return at
        t = (t + dt.timedelta(days=1)).replace(hour=0, minute=0)
    raise ValueError(f"{what}={spec!r} never fires")

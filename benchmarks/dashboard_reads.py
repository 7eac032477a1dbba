"""Dashboard pages on PostgreSQL without a browser: each page run under Streamlit's AppTest, with the time of every
service read it makes (``dashboard.ui.read``, the cached path every ``ui.q`` takes) and of the whole run.

Seeds (once, into ``--db``, kept for later runs; or a scratch database dropped afterwards) a fleet of ``--gpus``
GPUs (``fleetscope.sim.gpu_fleet``: 8 a node, 2 sites) shaped as the capacity run leaves it (``--shape
capacity``: ``--minutes`` of raw samples at 10 s, the minute tier rolled up to a few minutes before the end, no
hour tier, no energy minutes) or as a steady site has it (``--shape steady``: the same raw minutes with the energy
roll-up and both tiers advanced over them, and before them ``--days`` of history: the hour tier for every GPU,
the per-site and per-job energy minutes and 6,000 Slurm jobs with their nodes and teams, written with COPY, and
the jobs' hours rolled as beat's ``job-usage-rollup`` leaves them). Then, per page and range (``--ranges``), one
first visit (caches cleared) and ``--rounds`` warm runs. Prints JSON lines:

- ``read``: one per service read of a first visit (``module.name``, its arguments, seconds, rows);
- ``page``: the page's first-visit and warm seconds, and the slowest read;
- ``warmup``: the process's first page (Alerts) beforehand, which imports Streamlit's and the pages' modules
  once, as a server does on its first page (``benchmarks/dashboard.py`` reports that as ``first_load``).

    python benchmarks/dashboard_reads.py [--gpus 16384] [--shape capacity|steady] [--ranges "24 h,30 d"]
                                         [--pages overview,energy_carbon] [--db NAME] [--postgres URL]
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
sys.path.insert(0, str(_HERE.parent))

import numpy as np  # noqa: E402
import polars as pl  # noqa: E402
from sqlalchemy import create_engine, text  # noqa: E402

from fleetscope.core import frames as F  # noqa: E402
from fleetscope.services import auth, energy_rollup, job_usage, tiers  # noqa: E402
from fleetscope.sim.fleet import FleetSpec, gpu_fleet  # noqa: E402
from fleetscope.store import Store, db  # noqa: E402

from benchmarks import _server  # noqa: E402

APP = _HERE.parent / "dashboard" / "app.py"
INTERVAL_S = 10
JOBS = 64
"""Jobs in the per-job energy history: a 16,384-GPU fleet runs tens of jobs at once."""
SCHED_JOBS = 6_000
"""Slurm jobs over the steady history (10 minutes to a day on 1-64 whole nodes of one site): about as many GPUs
held at once as the fleet has, for Teams & Cost."""
ACCOUNTS, TEAMS = 12, 6


def _emit(**row: object) -> None:
    print(json.dumps(row, default=str), flush=True)


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def fleet_spec(gpus: int) -> FleetSpec:
    nodes = max(2, gpus // 8)
    return FleetSpec(sites=2, nodes_per_site=nodes // 2, gpus_per_node=8, interval_s=INTERVAL_S)


def _copy(store: Store, table: str, df: pl.DataFrame) -> None:
    raw = store.engine.raw_connection()
    try:
        columns = ", ".join(f'"{c}"' for c in df.columns)  # quoted: sched_job has a column named user
        with raw.cursor() as cur, cur.copy(f"COPY {table} ({columns}) FROM STDIN WITH (FORMAT csv)") as cp:
            cp.write(df.write_csv(include_header=False, datetime_format="%Y-%m-%dT%H:%M:%S%z"))
        raw.commit()
    finally:
        raw.close()


def seed_raw(store: Store, spec: FleetSpec, start: dt.datetime, minutes: int, scrapes: int | None = None) -> list[str]:
    """The fleet's inventory and ``minutes`` of samples every 10 s (or only the first ``scrapes``), written a minute
    at a time; the GPUs' ids."""
    batch = gpu_fleet(spec, start, (scrapes or minutes * 6) * INTERVAL_S)
    store.write(F.Batch(source="bench:dashboard_reads", site=batch.site, host=batch.host, gpu=batch.gpu))
    samples = batch.gpu_sample
    for m in range(minutes):
        lo, hi = start + dt.timedelta(minutes=m), start + dt.timedelta(minutes=m + 1)
        store.write(F.Batch(source=f"bench:dashboard_reads:{m}", gpu_sample=samples.filter((pl.col("ts") >= lo) & (pl.col("ts") < hi))))
    return batch.gpu["gpu_uuid"].to_list()


def seed_history(store: Store, uuids: list[str], sites: dict[str, str], end: dt.datetime, days: int) -> dict[str, int]:
    """``days`` before ``end``: the hour tier of every GPU (the fields the pages read, and the exact energy), the
    per-site energy minutes and ``JOBS`` jobs' energy minutes, as beat would have left them."""
    rng = np.random.default_rng(22)
    first = end - dt.timedelta(days=days)
    n = len(uuids)
    rows = {"gpu_sample_hour": 0, "site_energy_minute": 0, "job_energy_minute": 0}
    site_of = [sites[u] for u in uuids]
    for day in range(days):
        hours = [first + dt.timedelta(days=day, hours=h) for h in range(24)]
        power = 100 + rng.random(n * 24) * 600
        _copy(store, "gpu_sample_hour", pl.DataFrame({
            "bucket": pl.Series(np.repeat(np.array(hours, dtype="datetime64[us]"), n)).dt.replace_time_zone("UTC"),
            "gpu_uuid": uuids * 24, "samples": pl.repeat(360, n * 24, eager=True),
            "util_ratio_mean": rng.random(n * 24).round(4), "power_w_mean": power.round(2),
            "temp_c_max": (30 + rng.random(n * 24) * 50).round(1), "gpu_energy_j": (power * 3600).round(1)}))
        rows["gpu_sample_hour"] += n * 24
    minutes = np.array([first + dt.timedelta(minutes=i) for i in range(days * 1440)], dtype="datetime64[us]")
    per_site = pl.DataFrame({"site_id": site_of}).group_by("site_id").len().sort("site_id")
    site_rows = pl.concat([pl.DataFrame({"minute": pl.Series(minutes).dt.replace_time_zone("UTC"), "site_id": s,
                                         "energy_j": (k * 400.0 * 60) + rng.random(len(minutes)), "gpus": k})
                           for s, k in per_site.iter_rows()])
    _copy(store, "site_energy_minute", site_rows)
    rows["site_energy_minute"] = site_rows.height
    for j in range(JOBS):
        # each job runs a random stretch of the history on 8-1,024 GPUs of one site
        length = int(rng.integers(60, days * 1440 // 2))
        at = int(rng.integers(0, days * 1440 - length))
        gpus = int(2 ** rng.integers(3, 11))
        site = per_site["site_id"][j % per_site.height]
        job = pl.DataFrame({"minute": pl.Series(minutes[at:at + length]).dt.replace_time_zone("UTC"), "job_id": f"job-{j:03d}", "site_id": site,
                            "energy_j": gpus * 400.0 * 60, "covered_s": gpus * 60.0, "allocated_s": gpus * 60.0, "gpus": gpus})
        _copy(store, "job_energy_minute", job)
        rows["job_energy_minute"] += job.height
    store.write(F.Batch(source="bench:dashboard_reads:jobs", job=pl.DataFrame(
        [{"job_id": f"job-{j:03d}", "kind": "training" if j % 4 else "inference", "model_name": f"model-{j % 8}", "world_size": 8}
         for j in range(JOBS)])))
    with store.engine.begin() as conn:
        for t in rows:
            conn.execute(text(f"ANALYZE {t}"))
    return rows


def seed(url: str, gpus: int, shape: str, minutes: int, days: int, scrapes: int | None = None) -> dict[str, Any]:
    store = Store.open(url)
    t = time.perf_counter()
    spec = fleet_spec(gpus)
    end = dt.datetime.now(dt.UTC).replace(second=0, microsecond=0) - dt.timedelta(minutes=1)
    start = end - dt.timedelta(minutes=minutes)
    uuids = seed_raw(store, spec, start, minutes, scrapes)
    out: dict[str, Any] = {"raw_rows": len(uuids) * (scrapes or minutes * 6)}
    if scrapes:
        pass  # the 100,000-GPU capacity run's two scrapes: nothing rolled yet
    elif shape == "capacity":
        # the minute tier as far as a worker got while the pushes went on: a few minutes behind the data
        out["tiers"] = tiers._advance(store, "minute", start + dt.timedelta(minutes=max(1, minutes - 3)), end, 24)
    else:
        out["energy"] = {k: v for k, v in energy_rollup.rollup_window(store, start, end).items() if k in ("minutes", "gpus")}
        out["tiers"] = tiers.advance(store, end + tiers.SETTLE)
        gpu = store.read("gpu", columns=["gpu_uuid", "host"]).join(store.read("host", columns=["host", "site_id"]), on="host")
        out["history"] = seed_history(store, uuids, dict(gpu.select("gpu_uuid", "site_id").iter_rows()), start.replace(minute=0), days)
        hosts = store.read("host", columns=["host", "site_id"]).sort("host")
        out["scheduler"] = seed_scheduler(store, {s: hosts.filter(pl.col("site_id") == s)["host"].to_list() for s in hosts["site_id"].unique()},
                                          end, days)
        if tiers.watermark(store, "hour") is None:
            # the raw minutes lie within one hour, which the hour tier has not closed: its history has
            tiers._set_watermark(store, "hour", None, start.replace(minute=0), end)
        # beat's job-usage roll-up over the history: the jobs' hours, as a steady site's tick has them
        out["job_usage"] = job_usage.advance(store, end, max_chunks=days + 2)
        out["training"] = seed_training(store, uuids, end, days)
    with store.engine.begin() as conn:
        conn.execute(text("ANALYZE"))
    store.engine.dispose()
    return {**out, "seconds": round(time.perf_counter() - t, 1), "end": end.isoformat()}


TRAIN_RANKS = 1024
TRAIN_STEP_S = 600.0
"""The running training job of the steady history: 1,024 ranks on the fleet's first GPUs, a step every 10 minutes
over the whole history (4,320 steps, 4.4 M rank-steps for 30 days), as the Stragglers page reads it."""


def seed_training(store: Store, uuids: list[str], end: dt.datetime, days: int) -> dict[str, Any]:
    """A 1,024-rank job that has run for ``days`` (``benchmarks/job_analysis.py``'s steps, with its straggler rank),
    its ranks on the fleet's first 1,024 GPUs, analysed a day at a time as beat's per-minute analysis leaves it:
    the Stragglers page's current suspects, rank × step grid and slowest ranks."""
    from fleetscope.services import jobs  # lazy: the analysis stack only where the seed needs it

    job_analysis = _server.sibling("job_analysis")
    rng = np.random.default_rng(7)
    job_id = "train-1024"
    started = end - dt.timedelta(days=days)
    gpus = store.read("gpu", columns=["gpu_uuid", "host"]).filter(pl.col("gpu_uuid").is_in(uuids[:TRAIN_RANKS])).sort("gpu_uuid")
    store.write(F.Batch(source="bench:dashboard_reads:training",
                        job=pl.DataFrame({"job_id": [job_id], "kind": ["training"], "world_size": [TRAIN_RANKS], "started_at": [started],
                                          "status": ["running"]}),
                        job_rank=pl.DataFrame({"job_id": job_id, "rank": list(range(gpus.height)), "start": started,
                                               "gpu_uuid": gpus["gpu_uuid"], "host": gpus["host"]})))
    n_steps = int((end - started).total_seconds() // TRAIN_STEP_S)
    per_day = int(86_400 // TRAIN_STEP_S)
    t = time.perf_counter()
    for s0 in range(0, n_steps, per_day):
        k = min(per_day, n_steps - s0)
        starts = int(started.timestamp() * 1e6) + np.arange(s0, s0 + k, dtype=np.int64) * int(TRAIN_STEP_S * 1e6)
        steps, colls = job_analysis._steps(job_id, gpus.height, s0, starts, TRAIN_STEP_S, rng)
        store.write(F.Batch(source="bench:dashboard_reads:training", step=steps, collective=colls))
        jobs.analyze_job(store, job_id, now=started + dt.timedelta(seconds=(s0 + k) * TRAIN_STEP_S), incremental=True)
    return {"job_id": job_id, "ranks": gpus.height, "steps": n_steps, "rank_steps": n_steps * gpus.height, "seconds": round(time.perf_counter() - t, 1)}


def seed_scheduler(store: Store, hosts_by_site: dict[str, list[str]], end: dt.datetime, days: int) -> dict[str, int]:
    """``SCHED_JOBS`` Slurm jobs over the ``days`` before ``end`` (``sched_job``, their nodes in ``sched_job_node``;
    the ones still running at ``end`` have no end), ``ACCOUNTS`` accounts mapped to ``TEAMS`` teams."""
    rng = np.random.default_rng(23)
    first = end - dt.timedelta(days=days)
    sites = sorted(hosts_by_site)
    jobs, nodes = [], []
    for j in range(SCHED_JOBS):
        hosts = hosts_by_site[sites[j % len(sites)]]
        n_nodes = int(2 ** rng.integers(0, 7))
        at = int(rng.integers(0, max(1, len(hosts) - n_nodes)))
        start = first + dt.timedelta(seconds=int(rng.integers(0, days * 86_400 - 600)))
        stop = start + dt.timedelta(seconds=int(rng.integers(600, 86_400)))
        job_id = str(100_000 + j)
        jobs.append({"cluster": "", "job_id": job_id, "scheduler": "slurm", "name": f"train-{j}", "user": f"user{j % 50}",
                     "account": f"acct-{j % ACCOUNTS}", "partition": "gpu", "state": "RUNNING" if stop >= end else "COMPLETED",
                     "submit_at": start - dt.timedelta(minutes=1), "start_at": start, "end_at": None if stop >= end else stop,
                     "gpus": 8 * n_nodes, "gpu_source": "tres_alloc", "node_count": n_nodes, "source": "bench"})
        nodes += [{"cluster": "", "job_id": job_id, "host": h, "gpus": 8, "gpu_indices": "0,1,2,3,4,5,6,7", "source": "bench"}
                  for h in hosts[at:at + n_nodes]]
    _copy(store, "sched_job", pl.DataFrame(jobs))
    _copy(store, "sched_job_node", pl.DataFrame(nodes))
    _copy(store, "team_mapping", pl.DataFrame([{"kind": "slurm_account", "match": f"acct-{a}", "cluster": "", "team": f"team-{a % TEAMS}",
                                                 "recorded_by": "bench", "recorded_at": end} for a in range(ACCOUNTS)]))
    with store.engine.begin() as conn:
        for t in ("sched_job", "sched_job_node", "team_mapping"):
            conn.execute(text(f"ANALYZE {t}"))
    return {"sched_job": len(jobs), "sched_job_node": len(nodes)}


@contextlib.contextmanager
def timed_reads(log: list[dict[str, Any]]) -> Iterator[None]:
    """Every cached page read (``dashboard.ui.read``) timed into ``log``."""
    from dashboard import ui  # lazy: Streamlit loads only once the seeding is done

    plain = ui.read

    def read(url: str, module: str, name: str, kwargs: tuple[tuple[str, Any], ...]) -> Any:
        # the reading thread's own CPU: a page's reads run at once (ui.prefetch), and the process's CPU over one
        # read would count the others' too
        t, c = time.perf_counter(), time.thread_time()
        out = plain(url, module, name, kwargs)
        log.append({"read": f"{module.rsplit('.', 1)[1]}.{name}", "args": {k: v for k, v in kwargs if k not in ("site",)},
                    "seconds": round(time.perf_counter() - t, 3), "cpu_s": round(time.thread_time() - c, 3),
                    "rows": getattr(out, "height", None)})
        return out

    ui.read = read
    try:
        yield
    finally:
        ui.read = plain


def run_page(url: str, token: str, page: str, range_label: str) -> tuple[float, Any]:
    from streamlit.testing.v1 import AppTest  # lazy: as above

    from dashboard import signin  # lazy: as above

    at = AppTest.from_file(str(APP), default_timeout=900)
    at.session_state[signin.TOKEN_KEY] = token
    at.query_params["range"] = range_label
    at.query_params["refresh"] = "off"
    if page != "overview":
        at.switch_page(f"views/{page}.py")
    t = time.perf_counter()
    at.run()
    return time.perf_counter() - t, at


def measure(url: str, pages: list[str], ranges: list[str], rounds: int, common: dict[str, Any]) -> None:
    import streamlit as st  # lazy: as above

    os.environ["FLEETSCOPE_DATABASE_URL"] = url
    engine = create_engine(url)
    token = auth.create_token(engine, "bench-dashboard-reads", ["admin"])
    engine.dispose()
    # A server imports Streamlit's and the pages' modules once, on its first page; every visit after finds them
    # loaded. That once is reported apart (as benchmarks/dashboard.py's first_load), so that a page's first visit
    # is its own: its reads against cold caches, in a process that has drawn a page before.
    warmup, _ = run_page(url, token, "alerts", ranges[0])
    _emit(bench="dashboard_reads", what="warmup", page="alerts", range=ranges[0], **common, seconds=round(warmup, 2), load=_load())
    for range_label in ranges:
        for page in pages:
            st.cache_data.clear()
            log: list[dict[str, Any]] = []
            with timed_reads(log):
                first, at = run_page(url, token, page, range_label)
            errors = [e.message for e in at.exception] + [e.value for e in at.error]
            by_read: dict[str, dict[str, Any]] = {}
            for r in log:
                d = by_read.setdefault(r["read"], {"calls": 0, "seconds": 0.0, "max_s": 0.0, "rows": 0})
                d["calls"] += 1
                d["seconds"] = round(d["seconds"] + r["seconds"], 3)
                d["max_s"] = max(d["max_s"], r["seconds"])
                d["rows"] += r["rows"] or 0
            _emit(bench="dashboard_reads", what="reads", page=page, range=range_label, **common,
                  reads=dict(sorted(by_read.items(), key=lambda kv: -kv[1]["seconds"])))
            warm = [run_page(url, token, page, range_label)[0] for _ in range(rounds)]
            _emit(bench="dashboard_reads", what="page", page=page, range=range_label, **common, first_visit_s=round(first, 2),
                  reads_s=round(sum(r["seconds"] for r in log), 2), reads_cpu_s=round(sum(r["cpu_s"] for r in log), 2), reads=len(log),
                  warm_s=[round(w, 2) for w in warm], errors=errors[:3], load=_load())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gpus", type=int, default=16384)
    ap.add_argument("--shape", choices=("capacity", "steady"), default="capacity")
    ap.add_argument("--minutes", type=int, default=6, help="minutes of raw samples at 10 s")
    ap.add_argument("--scrapes", type=int, default=None, help="only this many scrapes, nothing rolled (the 100,000-GPU capacity run's 2)")
    ap.add_argument("--days", type=int, default=30, help="steady: days of tier and energy history before the raw minutes")
    ap.add_argument("--ranges", default="24 h,30 d")
    ap.add_argument("--pages", default="overview,energy_carbon")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--db", default=None, help="database to seed once and keep (reused when it exists); default: a scratch one")
    ap.add_argument("--postgres", default=os.environ.get("FLEETSCOPE_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"))
    args = ap.parse_args()
    common = {"gpus": fleet_spec(args.gpus).nodes_per_site * 16, "shape": args.shape if args.scrapes is None else f"{args.scrapes} scrapes",
              "database": "postgresql"}

    def run(url: str, fresh: bool) -> None:
        if fresh:
            db.upgrade(url)
            _emit(bench="dashboard_reads", what="seed", **common, **seed(url, args.gpus, args.shape, args.minutes, args.days, args.scrapes), load=_load())
        measure(url, args.pages.split(","), args.ranges.split(","), args.rounds, common)

    if args.db is None:
        with db.scratch_database(args.postgres, "fleetscope_bench_dashreads") as url:
            run(url, True)
        return
    admin = create_engine(args.postgres, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        exists = conn.execute(text("SELECT 1 FROM pg_database WHERE datname = :n"), {"n": args.db}).first() is not None
        if not exists:
            conn.execute(text(f'CREATE DATABASE "{args.db}"'))
    url = admin.url.set(database=args.db).render_as_string(hide_password=False)
    admin.dispose()
    run(url, not exists)


if __name__ == "__main__":
    main()

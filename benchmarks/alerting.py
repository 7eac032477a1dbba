"""Alerting: time to alert end to end under a 16,384-GPU fleet's ingest load (target: p99 under 10 s), and
rule evaluation for that fleet (target: under 1 s).

Time to alert runs the service as shipped: `fleetscope serve`, `fleetscope worker` and `fleetscope beat` on
the default schedule and the embedded broker (or ``--broker redis://...``), over SQLite (or ``--database``, a
PostgreSQL server URL: a scratch database is made there), with the shipped rules and a webhook receiver on
loopback. A load process posts the fleet's dcgm-exporter scrapes (30 fields per GPU) every
``--scrape-interval-s`` (the agent's default, 10 s) in slices of ``--gpus-per-post``; each run then posts one
node's scrape carrying an XID 79 and times from the HTTP response to the receiver's having the webhook. The
achieved load, in values/s, is printed with the figures: on a small machine it is what the machine allows.

Rule evaluation: the fleet's last 30 minutes carry, per GPU, four findings (one of them matching a default
rule for ~6% of GPUs), two health events (XID 79 on 0.5% of GPUs, other XIDs elsewhere), and roll-up series
for 256 jobs' goodput and 8 sites' PUE, evaluated with the shipped default rules, in process and as the
worker's durable tick on SQLite. Prints one JSON line per measurement.

    python benchmarks/alerting.py [--gpus 16384] [--repeats 5] [--tta-runs 20] [--broker URL] [--database URL]
                                  [--no-eval] [--no-tta]
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import math
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import polars as pl

# The repository first (benchmarks/ingest.py would shadow the `ingest` package), then the sibling helpers.
_HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(_HERE.parent))
sys.path.append(str(_HERE))

from _server import served_api  # noqa: E402
from cryptography.fernet import Fernet  # noqa: E402
from ingest_dcgm import synth_scrape  # noqa: E402
from tests.alerting.receiver import Receiver  # noqa: E402

from fleetscope.store import db  # noqa: E402
from fleetscope.core import frames as F  # noqa: E402
from fleetscope.services.alerting import config as C  # noqa: E402
from fleetscope.services.alerting import dispatch as D  # noqa: E402
from fleetscope.services.alerting import engine as E  # noqa: E402
from fleetscope.services.alerting import notifiers as N  # noqa: E402
from fleetscope.services.alerting import state as ST  # noqa: E402
from fleetscope.services.alerting.rules import load_config  # noqa: E402
from fleetscope.store import Store  # noqa: E402

NOW = dt.datetime(2027, 3, 1, 12, 0, tzinfo=dt.UTC)


def fleet(gpus: int, seed: int = 7) -> E.EvalInput:
    rng = np.random.default_rng(seed)
    uuids = [f"GPU-{i:08x}" for i in range(gpus)]
    hosts = [f"node-{i // 8:05d}" for i in range(gpus)]
    n = gpus * 4
    idx = np.arange(n) % gpus
    kinds = np.array(["health_score", "util_low", "thermal_throttle", "straggler", "sdc_suspect", "ecc_uncorrectable"])
    k = rng.choice(len(kinds), n, p=[0.5, 0.44, 0.03, 0.02, 0.005, 0.005])
    start = [NOW - dt.timedelta(seconds=int(s)) for s in rng.integers(0, 1800, n)]
    finding = F.conform(F.FINDING, pl.DataFrame({
        "analyzer": "bench", "kind": kinds[k],
        "subject": [f"gpu:{uuids[i]}" for i in idx],
        "window_start": start, "window_end": [s + dt.timedelta(seconds=60) for s in start],
        "severity": rng.choice(["info", "warning", "critical"], n, p=[0.6, 0.3, 0.1]),
        "score": rng.random(n) * 5,
        "summary": "bench",
        "evidence": [json.dumps({"host": hosts[i]}) for i in idx],
    }))
    m = gpus * 2
    hidx = np.arange(m) % gpus
    health = F.conform(F.HEALTH_EVENT, pl.DataFrame({
        "ts": [NOW - dt.timedelta(seconds=int(s)) for s in rng.integers(0, 1800, m)],
        "host": [hosts[i] for i in hidx], "gpu_uuid": [uuids[i] for i in hidx], "kind": "xid",
        "code": rng.choice([13, 31, 43, 79, 48, 94], m, p=[0.5, 0.3, 0.185, 0.005, 0.005, 0.005]),
    }))
    series, ts, vals = [], [], []
    for j in range(256):
        for t in range(15):
            series.append(f'job_goodput_ratio{{job_id="job-{j}"}}')
            ts.append(NOW - dt.timedelta(minutes=t))
            vals.append(float(rng.uniform(0.6, 0.99)))
    for s in range(8):
        for t in range(30):
            series.append(f'site_pue_ratio{{site="site-{s}"}}')
            ts.append(NOW - dt.timedelta(minutes=t))
            vals.append(float(rng.uniform(1.1, 1.7)))
    metric = F.conform(F.METRIC_SAMPLE, pl.DataFrame({"ts": ts, "series": series, "value": vals}))
    return E.EvalInput(finding, health, metric, dict(zip(uuids, hosts)))


def bench_eval(gpus: int, repeats: int) -> None:
    config = load_config()
    data = fleet(gpus)
    states = E.evaluate(config, data, {}, NOW - dt.timedelta(seconds=5))  # warm: states exist, as in steady state
    times, dtimes = [], []
    groups: dict = {}
    for r in range(repeats):
        now = NOW + dt.timedelta(seconds=5 * r)
        t0 = time.perf_counter()
        states = E.evaluate(config, data, states, now)
        t1 = time.perf_counter()
        groups, notes = D.dispatch(config, D.alerts_from_states(states.values()), groups, [], now)
        t2 = time.perf_counter()
        times.append(t1 - t0)
        dtimes.append(t2 - t1)
    firing = sum(1 for s in states.values() if s.state == "firing")
    print(json.dumps({"benchmark": "alerting.evaluate", "gpus": gpus, "findings": data.finding.height, "health_events": data.health_event.height,
                      "rules": len(config.rules), "alerts": len(states), "firing": firing,
                      "eval_s_median": round(statistics.median(times), 4), "eval_s_max": round(max(times), 4),
                      "dispatch_s_median": round(statistics.median(dtimes), 4), "target_s": 1.0, "met": max(times) < 1.0}), flush=True)


def bench_durable(gpus: int, repeats: int) -> None:
    """The whole tick as the worker runs it on SQLite: read the windows, evaluate, dispatch, write."""
    config = load_config()
    data = fleet(gpus)
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{tmp}/fs.db"
        db.upgrade(url)
        store = Store.open(url)
        store.write(F.Batch(finding=data.finding, health_event=data.health_event, metric_sample=data.metric_sample,
                            gpu=pl.DataFrame({"gpu_uuid": list(data.gpu_host), "host": list(data.gpu_host.values())})))
        times, reads = [], []
        for r in range(repeats):
            now = NOW + dt.timedelta(seconds=5 * r)
            t0 = time.perf_counter()
            inp = ST.read_input(store, config, now)
            t1 = time.perf_counter()
            res = ST.evaluate_and_dispatch(store, config, now=now, data=inp)
            times.append(time.perf_counter() - t0)
            reads.append(t1 - t0)
        print(json.dumps({"benchmark": "alerting.tick_sqlite", "gpus": gpus, "firing": res.firing,
                          "tick_s_median": round(statistics.median(times), 4), "tick_s_first": round(times[0], 4),
                          "read_s_median": round(statistics.median(reads), 4)}), flush=True)
        store.engine.dispose()


# --- time to alert, end to end ----------------------------------------------------------------------------

# Settings that would make the measured schedule other than the shipped one.
_NOT_DEFAULT = ("FLEETSCOPE_BROKER_URL", "FLEETSCOPE_RESULT_BACKEND", "FLEETSCOPE_ALERT_RULES", "FLEETSCOPE_ALERT_EVAL_INTERVAL_S",
                "FLEETSCOPE_ALERT_DELIVER_INTERVAL_S", "FLEETSCOPE_ALERT_DELIVERY_TIMEOUT_S")
DCGM_FIELDS = 30  # per GPU in synth_scrape


def load_child(base: str, token: str, gpus: int, gpus_per_post: int, interval_s: float) -> None:
    """The fleet's agents: every ``interval_s``, the whole fleet's dcgm-exporter scrapes in slices of
    ``gpus_per_post`` GPUs (each its own hosts), stamped now. A round that takes longer than the interval
    is followed by the next at once: the machine's most, reported as such. One JSON line per post."""
    bodies = [synth_scrape(min(gpus_per_post, gpus - first), seed=first, first_gpu=first) for first in range(0, gpus, gpus_per_post)]
    print(json.dumps({"ready": True, "posts_per_round": len(bodies)}), flush=True)
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "text/plain"}
    with _client() as client:
        while True:
            round_start = time.monotonic()
            for k, body in enumerate(bodies):
                t0 = time.monotonic()
                try:
                    r = client.post(base + "/api/v1/ingest/dcgm", content=body, headers=headers,
                                    params={"ts": dt.datetime.now(dt.UTC).isoformat(), "source": f"load-{k}"})
                    status, values = r.status_code, r.json().get("values", 0) if r.status_code == 200 else 0
                except httpx.HTTPError as exc:
                    status, values = type(exc).__name__, 0
                print(json.dumps({"t": time.time(), "values": values, "s": round(time.monotonic() - t0, 3), "status": status}), flush=True)
            time.sleep(max(0.0, round_start + interval_s - time.monotonic()))


def _client() -> httpx.Client:
    """A connection per request, as agents make: a kept-alive one that sat idle past uvicorn's keep-alive
    timeout (5 s) may be closed by the server just as it is reused."""
    return httpx.Client(timeout=600, limits=httpx.Limits(max_keepalive_connections=0))


class _Lines:
    """A child's JSON lines, read as they come."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.items: list[dict] = []
        self._t = threading.Thread(target=self._read, args=(proc,), daemon=True)
        self._t.start()

    def _read(self, proc: subprocess.Popen) -> None:
        for line in proc.stdout:  # type: ignore[union-attr]
            with contextlib.suppress(ValueError):
                self.items.append(json.loads(line))


def _wait(pred, timeout_s: float, what: str):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = pred()
        if got:
            return got
        time.sleep(0.02)
    raise TimeoutError(f"timed out after {timeout_s:.0f} s waiting for {what}")


def _stop(proc: subprocess.Popen, timeout_s: float = 30) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _quantile(xs: list[float], q: float) -> float:
    """Nearest rank: with 20 runs, p99 is the slowest run."""
    xs = sorted(xs)
    return xs[max(0, math.ceil(q * len(xs)) - 1)]


def probe_scrape(gpus: int, run: int) -> tuple[bytes, str]:
    """One node's scrape (8 GPUs on a host of its own, outside the load's fleet) whose first GPU reports
    XID 79, and that host's name: a host per run puts each run's alert in a group of its own."""
    first = gpus + 8 * run
    return synth_scrape(8, seed=1_000_000 + run, first_gpu=first, xids={first: 79}), f"gpu-node-{first // 8 + 1}"


def bench_time_to_alert(args: argparse.Namespace) -> None:
    """Time to alert as an operator sees it: `fleetscope serve`, `fleetscope worker` and `fleetscope beat`
    on the shipped schedule, a webhook receiver on loopback, the fleet's load posted by another process,
    and runs that post one node's scrape carrying an XID 79 and wait for the webhook to receive it."""
    for k in _NOT_DEFAULT:
        os.environ.pop(k, None)
    data_dir = Path(tempfile.mkdtemp(prefix="fleetscope-bench-alerting-"))
    key = Fernet.generate_key()
    env = {"FLEETSCOPE_DATA_DIR": str(data_dir), "FLEETSCOPE_SECRET_KEY": key.decode(), "FLEETSCOPE_ALERT_ALLOW_LOOPBACK": "1",
           "FLEETSCOPE_LOG_LEVEL": "WARNING", **({"FLEETSCOPE_BROKER_URL": args.broker} if args.broker else {})}
    with contextlib.ExitStack() as stack:
        if args.database:
            url = stack.enter_context(db.scratch_database(args.database, "fleetscope_bench_alerting"))
        else:
            url = f"sqlite:///{data_dir / 'fleetscope.store.db'}"
        env["FLEETSCOPE_DATABASE_URL"] = url
        base, token = stack.enter_context(served_api(url, env=env))
        rx = stack.enter_context(Receiver())
        store = Store.open(url)
        stack.callback(store.engine.dispose)
        ST.put_receiver(store.engine, ST.SecretBox([key]), "default", "webhook", rx.url + "/hook", policy=N.OutboundPolicy(allow_loopback=True))
        child_env = {**os.environ, **env}
        procs = []
        for verb in ("worker", "beat"):
            log = (data_dir / f"{verb}.log").open("ab")
            stack.callback(log.close)
            procs.append(subprocess.Popen([sys.executable, "-m", "fleetscope.cli", verb], env=child_env, cwd=data_dir, stdout=log, stderr=subprocess.STDOUT))
        load = subprocess.Popen([sys.executable, __file__, "--load-child", base, token, "--gpus", str(args.gpus), "--gpus-per-post", str(args.gpus_per_post),
                                 "--scrape-interval-s", str(args.scrape_interval_s)], env=child_env, stdout=subprocess.PIPE, text=True)
        procs.append(load)
        for p in reversed(procs):
            stack.callback(_stop, p)
        posts = _Lines(load)
        # Ready: beat has ticked and a worker ran the evaluation; the load has posted the whole fleet once.
        _wait(lambda: store.query("SELECT COUNT(*) AS n FROM task_run WHERE task = 'fleetscope.alerting.evaluate'", [], {"n": pl.Int64})["n"][0],
              300, "the worker's first evaluation (see worker.log, beat.log in " + str(data_dir) + ")")
        per_round = _wait(lambda: next((x["posts_per_round"] for x in posts.items if "ready" in x), None), 300, "the load generator")
        _wait(lambda: len(posts.items) > per_round, 600, "the load's first round")
        eval_interval_s = C.load().eval_interval_s
        rng = random.Random(args.seed)
        lat: list[float] = []
        headers = {"Authorization": f"Bearer {token}", "Content-Type": "text/plain"}
        with _client() as client:
            window_start = time.time()
            for run in range(args.tta_runs + 1):  # the first warms the worker's caches and is reported apart
                # A random phase against beat's ticks, so the runs sample the schedule rather than one point of it.
                time.sleep(rng.uniform(0, eval_interval_s))
                body, host = probe_scrape(args.gpus, run)
                r = client.post(base + "/api/v1/ingest/dcgm", content=body, headers=headers,
                                params={"ts": dt.datetime.now(dt.UTC).isoformat(), "source": f"probe-{run}"})
                accepted = time.time()
                assert r.status_code == 200 and r.json()["written"].get("health_event") == 1, r.text[:300]

                def heard(host: str = host) -> dict | None:
                    return next((q for q in rx.accepted() if (q["json"] or {}).get("groupLabels", {}).get("host") == host
                                 and q["json"].get("status") == "firing"), None)

                got = _wait(heard, args.tta_timeout_s, f"run {run}'s webhook")
                assert got["json"]["alerts"][0]["labels"]["alertname"] == "GpuFellOffBus"
                lat.append(got["at"] - accepted)
            window_end = time.time()
        done = [x for x in posts.items if "t" in x and window_start <= x["t"] <= window_end]
        values = sum(x["values"] for x in done)
        runtimes = store.query("SELECT task, runtime_s FROM task_run", [], {"task": pl.String, "runtime_s": pl.Float64})
        tasks = {t: {"runs": g.height, "median_s": round(g["runtime_s"].median(), 3), "max_s": round(g["runtime_s"].max(), 3)}
                 for (t,), g in runtimes.group_by("task") if t.startswith(("fleetscope.services.alerting.", "fleetscope.energy", "fleetscope.health"))}
        runs = lat[1:]
        target_rate = args.gpus * DCGM_FIELDS / args.scrape_interval_s
        print(json.dumps({
            "benchmark": "alerting.time_to_alert", "runs": len(runs), "p50_s": round(_quantile(runs, 0.5), 3), "p99_s": round(_quantile(runs, 0.99), 3),
            "min_s": round(min(runs), 3), "slowest_s": [round(x, 3) for x in sorted(runs)[-3:]], "first_run_s": round(lat[0], 3), "target_p99_s": 10.0,
            "met": _quantile(runs, 0.99) < 10.0,
            "database": store.dialect, "broker": args.broker or "embedded (sqla+sqlite)", "eval_interval_s": eval_interval_s,
            "load": {"gpus": args.gpus, "gpus_per_post": args.gpus_per_post, "scrape_interval_s": args.scrape_interval_s,
                     "target_values_per_s": round(target_rate), "achieved_values_per_s": round(values / (window_end - window_start)),
                     "posts": len(done), "failed_posts": sum(1 for x in done if x["status"] != 200),
                     "post_s_median": round(statistics.median(x["s"] for x in done), 3) if done else None},
            "worker_tasks": tasks, "loadavg_1m": round(os.getloadavg()[0], 2), "cpus": os.cpu_count(),
        }), flush=True)

def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", type=int, default=16384)
    ap.add_argument("--repeats", type=int, default=5, help="rule evaluations timed")
    ap.add_argument("--tta-runs", type=int, default=20, help="time-to-alert runs (after one warm-up run)")
    ap.add_argument("--tta-timeout-s", type=float, default=300.0, help="give up on a run's webhook after this long")
    ap.add_argument("--broker", help="Celery broker URL, e.g. redis://127.0.0.1:6379/5 (default: the embedded one)")
    ap.add_argument("--database", help="PostgreSQL server URL to make a scratch database on (default: SQLite)")
    ap.add_argument("--scrape-interval-s", type=float, default=10.0, help="the fleet's scrape interval (the agent's default)")
    ap.add_argument("--gpus-per-post", type=int, default=1024, help="GPUs per posted scrape")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--no-eval", action="store_true", help="skip the rule-evaluation measurements")
    ap.add_argument("--no-tta", action="store_true", help="skip the time-to-alert measurement")
    ap.add_argument("--load-child", nargs=2, metavar=("BASE", "TOKEN"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.load_child:
        load_child(*args.load_child, args.gpus, args.gpus_per_post, args.scrape_interval_s)
        return
    if not args.no_eval:
        bench_eval(args.gpus, args.repeats)
        bench_durable(args.gpus, max(2, args.repeats // 2))
    if not args.no_tta:
        bench_time_to_alert(args)


if __name__ == "__main__":
    main()

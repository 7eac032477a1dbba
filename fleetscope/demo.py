"""`fleetscope demo`: the whole product on embedded defaults, fed by the simulator through the real API.

It simulates a fleet ending now (so beat's rolling windows see it), starts the API, a Celery worker, beat,
the dashboard and a local webhook sink, ingests every file the simulator wrote through the API with a
token, runs every analyzer, fires alerts into the sink, evaluates the AI Act rules, files a report and a
signed export, then checks that each injected fault was found and prints where everything is.
"""

from __future__ import annotations

import datetime as dt
import http.server
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import click
import httpx

from fleetscope import safefiles
from fleetscope.services import auth
from fleetscope.store import db
from fleetscope.core import frames as F
from fleetscope.settings import Settings
from fleetscope.sim.fleet import build_topology
from concurrent.futures import ThreadPoolExecutor
from fleetscope.sim import serving as serving_sim
from fleetscope.sim import simulate
from fleetscope.sim.spec import demo_spec, small_spec
from fleetscope.worker import make_celery


def _free_port(host: str, preferred: int) -> int:
    for port in (preferred, 0):
        with socket.socket() as s:
            try:
                s.bind((host, port))
                return s.getsockname()[1]
            except OSError:
                continue
    raise click.ClickException("no free TCP port")


class WebhookSink:
    """A local receiver for the demo's alerts: keeps every notification it is sent, and answers 200."""

    def __init__(self, host: str = "127.0.0.1") -> None:
        received: list[dict[str, Any]] = []
        self.received = received

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(min(length, 10 * 2**20))
                try:
                    received.append({"path": self.path, "headers": dict(self.headers), "json": json.loads(body)})
                except ValueError:
                    received.append({"path": self.path, "headers": dict(self.headers), "raw": body[:1000].decode(errors="replace")})
                self.send_response(200)
                self.end_headers()

            def log_message(self, *_: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer((host, 0), Handler)
        self.url = f"http://{host}:{self.server.server_address[1]}/alerts"

    def start(self) -> WebhookSink:
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        self.server.shutdown()


def _wait_healthy(url: str, procs: list[subprocess.Popen], timeout_s: float = 90) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for p in procs:
            if p.poll() is not None:
                raise click.ClickException(f"`{' '.join(p.args[3:5])}` exited with {p.returncode} during start-up")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise click.ClickException(f"{url} not healthy after {timeout_s:.0f} s")


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def _stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + 20
    for p in procs:
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()


class Api:
    """The demo's HTTP client: every call must succeed, or the demo stops saying which call failed."""

    def __init__(self, url: str, token: str) -> None:
        self.client = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=600)

    def call(self, method: str, path: str, ok: tuple[int, ...] = (200, 201), **kw: Any) -> Any:
        r = self.client.request(method, path, **kw)
        if r.status_code not in ok:
            raise click.ClickException(f"{method} {path} answered {r.status_code}: {r.text[:400]}")
        return r.json() if r.headers.get("content-type", "").startswith("application/json") else r.content


def _stamp_ts(ts: dt.datetime) -> str:
    return ts.strftime("%Y%m%dT%H%M%SZ")


def _job_rows(manifest: Any, topo: Any) -> dict[str, Any]:
    jobs = [{"job_id": j["job_id"], "name": j["name"], "kind": "training", "model_name": j.get("model_name"), "world_size": j["world_size"],
             "site_id": (j.get("sites") or [None])[0], "started_at": j["start"], "ended_at": j["end"], "status": j.get("status", "finished")} for j in manifest.jobs]
    ranks = []
    for j in manifest.jobs:
        for r, uuid in enumerate(j["gpu_uuids"]):
            host = topo.hosts[topo.gpu_uuid.index(uuid) // topo.gpus_per_node]
            ranks.append({"job_id": j["job_id"], "rank": r, "start": j["start"], "end": j["end"], "gpu_uuid": uuid, "host": host})
    return {"source": "demo:scheduler", "frames": {"job": jobs, "job_rank": ranks}}


def ingest_simulation(api: Api, manifest: Any, root: Path, say: Any) -> dict[str, int]:
    """Every file the simulator wrote, through the API, as collectors would send them."""

    written: dict[str, int] = {}

    def add(resp: Any) -> None:
        for k, v in (resp.get("written") or {}).items():
            written[k] = written.get(k, 0) + v

    spec = manifest.spec
    topo = build_topology(spec.sites, spec.racks_per_site, spec.nodes_per_rack, manifest.topology["gpus_per_node"], spec.gpu.name, spec.seed)
    add(api.call("POST", "/api/v1/batches", json=F.batch_to_json(topo.frames())))
    add(api.call("POST", "/api/v1/batches", json=_job_rows(manifest, topo)))
    scheduler_setup(api, manifest, root, add, say)
    # Collectors post concurrently; the API's worker processes parse in parallel and the store serialises
    # the writes. One dcgm request carries a whole scrape, as a central collector relaying every exporter does.
    posts: list[tuple[str, bytes, dict[str, str]]] = []
    for scrape in manifest.dcgm_scrapes:
        body = b"".join(p.read_bytes() for p in sorted((root / scrape["dir"]).glob("*.prom")))
        posts.append(("/api/v1/ingest/dcgm", body, {"ts": scrape["ts"], "source": scrape["dir"]}))
    for rel in manifest.files.get("job_events", []):
        posts.append(("/api/v1/ingest/job_events", (root / rel).read_bytes(), {"source": rel}))
    for rel in manifest.files.get("kineto", []):
        posts.append(("/api/v1/ingest/kineto", (root / rel).read_bytes(), {"source": rel, "job_id": Path(rel).parent.name}))
    for rel in manifest.files.get("nccl_inspector", []):
        # Inspector numbers ranks within each communicator, not in the job: kept under its own id so the
        # C3 and straggler analyses (which need global ranks) read the profiler's collectives only.
        job_id = Path(rel).parent.name.removeprefix("nccl-inspector-") + ":nccl-inspector"
        posts.append(("/api/v1/ingest/nccl_inspector", (root / rel).read_bytes(), {"source": rel, "job_id": job_id}))

    with ThreadPoolExecutor(max_workers=4) as pool:
        for resp in pool.map(lambda p: api.call("POST", p[0], content=p[1], params=p[2]), posts):
            add(resp)
    say(f"ingested   {len(manifest.dcgm_scrapes)} dcgm-exporter scrapes of {manifest.topology['gpus']} GPUs")
    # A vLLM deployment beside the training fleet, scraped by a collector that relays its replicas' bodies

    sspec = serving_sim.for_window(spec.start, spec.duration_s, interval_s=30.0 if spec.duration_s <= 900 else 60.0)
    for ts, body in serving_sim.scrape_bodies(sspec):
        add(api.call("POST", "/api/v1/ingest/vllm", content=body, params={"ts": ts.isoformat(), "source": f"serving:{_stamp_ts(ts)}"}))
    manifest.serving = sspec
    say(f"ingested   {sspec.replicas} vLLM replicas' scrapes every {sspec.interval_s:g} s")
    for scrape in manifest.ib_scrapes:
        api.call("POST", "/api/v1/ingest/ib_node_exporter", content=(root / scrape["file"]).read_bytes(),
                 params={"source": scrape["file"], "ts": scrape["ts"]})
    for run in manifest.nccl_tests:  # nccl-tests prints no time zone: the run's time goes with it
        add(api.call("POST", "/api/v1/ingest/nccl_tests", content=(root / run["file"]).read_bytes(), params={"source": run["file"], "ts": run["ts"]}))
    for rel in manifest.files.get("otlp_json", []):
        api.call("POST", "/v1/metrics", content=(root / rel).read_bytes(), headers={"Content-Type": "application/json"})
    say(f"ingested   job events, {len(manifest.files.get('kineto', []))} profiler traces, NCCL Inspector logs, InfiniBand counters, "
        f"{len(manifest.nccl_tests)} nccl-tests sweeps, facility meters")
    for rel in manifest.files.get("openlineage", []):
        api.call("POST", "/api/v1/lineage", content=(root / rel).read_bytes(), headers={"Content-Type": "application/json"})
    registry = json.loads((root / manifest.files["registry"][0]).read_text())
    for d in registry["datasets"]:
        api.call("PUT", "/api/v1/datasets", json=d)
    for m in registry["models"]:
        body = {k: m[k] for k in ("intended_purpose", "role", "training_run_ids") if k in m}
        api.call("PUT", f"/api/v1/models/{m['name']}/{m['version']}", json=body)
    say(f"governance {len(manifest.files.get('openlineage', []))} OpenLineage events, {len(registry['datasets'])} datasets, {len(registry['models'])} models")
    mon = manifest.monitoring
    if mon:
        for version, v in sorted(mon["versions"].items()):
            api.call("PUT", f"/api/v1/models/{mon['model']}/{version}", json={"intended_purpose": mon["purpose"], "role": "provider"})
            for d in mon["declarations"]:
                api.call("POST", "/api/v1/declarations", json={"model": mon["model"], "version": version, **d})
            add(api.call("POST", "/api/v1/ingest/model_monitoring", content=(root / v["file"]).read_bytes(), params={"source": v["file"]}))
        say(f"monitoring {mon['model']} (Annex III 5(b)) versions {', '.join(sorted(mon['versions']))}: {mon['hours']} h of predictions "
            f"with outcomes, {len(mon['declarations'])} declarations each")
    return written


GPU_HOUR_PRICE = 2.5  # USD per GPU-hour at both sites: a price book entry, so the team bill and idle GPUs have a cost
ENERGY_PRICE_PER_KWH = 0.12


def scheduler_setup(api: Api, manifest: Any, root: Path, add: Any, say: Any) -> None:
    """The schedulers' own records, as a site would feed them: the Slurm cluster's ``sacct -P`` text and the
    Kubernetes cluster's kube-state-metrics scrape, each format told by the ingest door's detection; the team
    rules for their accounts and namespaces, and the price book the bill is priced from."""
    sched = manifest.scheduler
    start = manifest.spec.start
    for site in manifest.topology["sites"]:
        api.call("PUT", "/api/v1/serving/prices", json={"site_id": site, "valid_from": (start - dt.timedelta(days=1)).isoformat(), "currency": "USD",
                                                         "gpu_hour_price": GPU_HOUR_PRICE, "energy_price_per_kwh": ENERGY_PRICE_PER_KWH})
    # the Kubernetes nodes are placed at a site, as the fleet's inventory would have them
    add(api.call("POST", "/api/v1/batches", json={"source": "demo:k8s-nodes", "frames": {"host": [{"host": h, "site_id": sched["k8s_site"]}
                                                                                                    for h in sched["k8s_nodes"]]}}))
    add(api.call("POST", "/api/v1/ingest/auto", content=(root / sched["sacct"]).read_bytes(), params={"source": sched["sacct"]}))
    # then slurmctld's view (squeue --json): each node's GPUs by device index, which ties multi-node jobs to the telemetry
    add(api.call("POST", "/api/v1/ingest/auto", content=(root / sched["squeue_json"]).read_bytes(), params={"source": sched["squeue_json"], "ts": sched["end"]}))
    add(api.call("POST", "/api/v1/ingest/auto", content=(root / sched["kube_state_metrics"]).read_bytes(),
                 params={"source": sched["kube_state_metrics"], "ts": sched["end"]}))
    for rule in sched["teams"]:
        api.call("PUT", "/api/v1/teams/mappings", json=rule)
    say(f"scheduler  Slurm accounting (sacct -P) and squeue --json of {sched['cluster']}, a kube-state-metrics scrape; {len(sched['teams'])} team rules, "
        f"a price of {GPU_HOUR_PRICE} USD per GPU-hour")


def team_bill(api: Api, manifest: Any) -> list[dict[str, Any]]:
    """Per team, the GPU-hours its jobs and pods held up to the end of the simulation and what they cost."""
    sched = manifest.scheduler
    start = manifest.spec.start - dt.timedelta(days=1)
    usage = api.call("GET", "/api/v1/teams/usage", params={"start": start.isoformat(), "end": sched["end"]})
    return [{k: t.get(k) for k in ("team", "jobs", "gpu_hours", "used_gpu_hours", "energy_kwh", "cost", "currency")} for t in usage["teams"]]


def scheduler_checks(api: Api, manifest: Any, findings: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The team holding idle GPUs (an idle-allocation finding with its cost) and the preempted job (its end
    state counted as a planned interruption)."""
    sched = manifest.scheduler
    idle = sched["idle"]
    subject = f"job:{sched['cluster']}/{idle['job_id']}"
    hits = [x for x in findings if x["kind"] == "idle_allocation" and x["subject"] == subject]
    rows = [{"fault": "idle_allocation", "where": f"{idle['team']} on {idle['host']}", "found": bool(hits),
             "evidence": hits[0]["summary"] if hits else f"no idle_allocation finding on {subject}"}]
    start = manifest.spec.start - dt.timedelta(days=1)
    q = api.call("GET", "/api/v1/teams/queue", params={"start": start.isoformat(), "end": sched["end"]})
    pre = [o for o in q["outcomes"] if o["state"] == "PREEMPTED"]
    rows.append({"fault": "preempted_job", "where": f"{sched['preempted']['team']} job {sched['preempted']['job_id']}",
                 "found": bool(pre) and pre[0]["reliability"] == "planned",
                 "evidence": (f"{pre[0]['jobs']} PREEMPTED job(s), {pre[0]['gpu_hours']:.2f} GPU-hours, counted as {pre[0]['reliability']} "
                              f"({pre[0]['outcome']})") if pre else "no PREEMPTED end state"})
    return rows


def analyse(api: Api, manifest: Any, celery_app: Any, say: Any) -> dict[str, Any]:
    """Every analyzer over the simulated window (beat keeps them going on new data afterwards)."""
    out: dict[str, Any] = {"jobs": {}}
    for j in manifest.jobs:
        out["jobs"][j["job_id"]] = api.call("POST", f"/api/v1/jobs/{j['job_id']}/analyze")
    window_s = int(manifest.spec.duration_s) + 300
    start = manifest.spec.start
    end = start + dt.timedelta(seconds=manifest.spec.duration_s)
    out["energy"] = celery_app.send_task("fleetscope.energy_rollup", kwargs={"window_start": start.isoformat(), "window_end": end.isoformat()}).get(timeout=300)
    # the roll-up tiers of the simulated window (beat advances them each minute afterwards), so long ranges read them
    out["tiers"] = celery_app.send_task("fleetscope.tier_rollup", kwargs={"now_iso": (end + dt.timedelta(minutes=5)).isoformat()}).get(timeout=300)
    out["health"] = celery_app.send_task("fleetscope.health_window", kwargs={"window_s": window_s}).get(timeout=300)
    sspec = manifest.serving
    api.call("PUT", "/api/v1/serving/slos", json={"deployment": sspec.model, "name": "ttft-p99", "kind": "latency",
                                                   "metric": "ttft_seconds", "threshold_s": 0.5, "objective": 0.99})
    out["serving"] = celery_app.send_task("fleetscope.serving_window", kwargs={"window_s": min(window_s, 900)}).get(timeout=300)
    say(f"analysed   {len(manifest.jobs)} jobs (C3, goodput, stragglers, SDC, checkpoints), energy {out['energy']['minutes']} GPU-minutes, "
        f"health of {out['health']['gpus']} GPUs")
    mon = manifest.monitoring
    out["monitoring"] = {v: api.call("POST", f"/api/v1/models/{mon['model']}/{v}/monitoring/evaluate", timeout=300)
                         for v in sorted(mon.get("versions") or {})}
    if out["monitoring"]:
        say("monitored  " + "; ".join(f"{mon['model']}@{v}: {r['evaluated']} hourly windows, findings "
                                      + (", ".join(f"{k} {n}" for k, n in sorted(r["findings"].items())) or "none")
                                      for v, r in out["monitoring"].items()))
    pred = manifest.predictions
    csv = (Path(manifest.out_dir) / pred["file"]).read_bytes()
    out["fairness"] = api.call("POST", f"/api/v1/models/{pred['model']}/fairness", content=csv,
                               params={"sensitive": pred["sensitive"], "version": "1"}, headers={"Content-Type": "text/csv"})
    return out


def check_faults(api: Api, manifest: Any, analysis: dict[str, Any]) -> list[dict[str, Any]]:
    """Did the matching analyzer find each injected fault? One row per fault, with the evidence."""
    findings = api.call("GET", "/api/v1/findings", params={"limit": 100000})
    rows = []
    for f in manifest.faults:
        found, evidence = False, ""
        if f.kind in ("thermal_straggler", "slow_link"):
            want = "straggler_compute_slow" if f.kind == "thermal_straggler" else "straggler_communication_slow"
            subjects = {f"job:{f.job_id}/rank:{r}" for r in f.ranks}
            hits = [x for x in findings if x["kind"] == want and x["subject"] in subjects]
            found, evidence = len(hits) > 0, f"{len(hits)} of {len(subjects)} ranks flagged {want}"
        elif f.kind == "sdc":
            subjects = {f"job:{f.job_id}/rank:{r}" for r in f.ranks} | {f"gpu:{g}" for g in f.gpu_uuids}
            hits = [x for x in findings if x["kind"].startswith("sdc") and x["subject"] in subjects]
            found, evidence = bool(hits), (hits[0]["summary"] if hits else "no SDC finding on the injected rank")
        elif f.kind == "row_remap_failure":
            subjects = {f"gpu:{g}" for g in f.gpu_uuids}
            hits = [x for x in findings if x["analyzer"] == "health" and x["subject"] in subjects]
            found, evidence = bool(hits), (hits[0]["kind"] if hits else "no health finding on the GPU")
        elif f.kind == "hung_job":
            hits = [x for x in findings if x["kind"] == "job_hang" and x["subject"] == f"job:{f.job_id}"]
            found, evidence = bool(hits), (hits[0]["summary"] if hits else "no job_hang finding")
        elif f.kind == "flapping_ib_link":
            hits = [x for x in findings if x["kind"] == "ib_link_flapping" and x["subject"].startswith(f"host:{f.hosts[0]}/")]
            found, evidence = bool(hits), (hits[0]["summary"] if hits else "no ib_link_flapping finding")
            # the same fault seen from the job: its slow-communicating ranks are blamed on that host's port
            blamed = [x for x in findings if x["kind"] == "comm_straggler_fabric"
                      and x["subject"].startswith(f"job:{f.job_id}/ib:{f.hosts[0]}")]
            rows.append({"fault": "comm_stragglers_on_flapping_port", "where": f"{f.job_id} on {f.hosts[0]}", "found": bool(blamed),
                         "evidence": blamed[0]["summary"] if blamed else "no comm_straggler_fabric finding on that host"})
            # and from the acceptance sweep run again over that node while its port flaps
            swept = [x for x in findings if x["kind"] == "nccl_test_regression" and f.hosts[0] in x["summary"]]
            if manifest.nccl_tests:
                rows.append({"fault": "nccl_tests_regression_on_flapping_port", "where": f.hosts[0], "found": bool(swept),
                             "evidence": swept[0]["summary"] if swept else "no nccl_test_regression finding naming that host"})
        elif f.kind == "silent_host":
            hits = [x for x in findings if x["kind"] == "host_down" and x["subject"] in {f"host:{h}" for h in f.hosts}]
            found, evidence = bool(hits), (hits[0]["summary"] if hits else "no host_down finding")
        elif f.kind in ("gpu_failure", "preemption"):
            g = (analysis["jobs"].get(f.job_id) or {}).get("goodput") or {}
            if f.kind == "gpu_failure":
                wasted = (g.get("badput_s") or {}).get("wasted_progress", 0) or 0
                found, evidence = bool(g.get("disruptions")) and wasted > 0, f"{g.get('disruptions')} disruption(s), {wasted:.0f} s of wasted progress"
            else:
                sched = g.get("scheduling_goodput_ratio")
                found, evidence = sched is not None and sched < 1, f"scheduling goodput {sched if sched is None else round(sched, 3)}"
        rows.append({"fault": f.kind, "where": f.job_id or ",".join(f.hosts), "found": found, "evidence": evidence})

    sspec = manifest.serving
    for sf in serving_sim.injected(sspec):
        kind = {"kv_cache_saturated": "kv_cache_saturated", "throttled_replica": "slow_replica", "slo_burn": "slo_burn"}[sf["fault"]]
        prefix = f"deployment:{sspec.model}/" + (f"replica:{sf['replica']}" if sf["replica"] else "slo:")
        hits = [x for x in findings if x["kind"] == kind and x["subject"].startswith(prefix)]
        rows.append({"fault": sf["fault"], "where": sf["replica"] or sspec.model, "found": bool(hits),
                     "evidence": hits[0]["summary"] if hits else f"no {kind} finding"})
    lin = manifest.lineage
    m = lin["tainted_model"]
    answer = api.call("GET", f"/api/v1/models/{m['name']}/ingested", params={"dataset": lin["quarantined_dataset"]["name"],
                      "namespace": lin["quarantined_dataset"]["namespace"], "version": m["version"]})
    rows.append({"fault": "quarantined_dataset_upstream", "where": f"{m['name']}@{m['version']}", "found": bool(answer["answer"]),
                 "evidence": answer.get("text") or "not upstream"})
    mon = manifest.monitoring
    for version, v in sorted((mon.get("versions") or {}).items()):
        subject = f"model:{mon['model']}:{version}"
        if v.get("drift_from"):
            drifted = [x for x in findings if x["kind"] == "model_drift" and x["subject"] == subject
                       and dt.datetime.fromisoformat(x["window_start"]) >= dt.datetime.fromisoformat(v["drift_from"]) and x["severity"] != "info"]
            rows.append({"fault": "model_data_drift", "where": f"{mon['model']}@{version}", "found": bool(drifted),
                         "evidence": drifted[0]["summary"] if drifted else f"no model_drift finding from {v['drift_from']}"})
        for attr, group in (v.get("biased") or {}).items():
            unfair = [x for x in findings if x["kind"] == "model_fairness" and x["subject"] == f"{subject}/attribute:{attr}" and x["severity"] == "critical"]
            rows.append({"fault": "biased_model_version", "where": f"{mon['model']}@{version} ({attr}={group})", "found": bool(unfair),
                         "evidence": unfair[0]["summary"] if unfair else f"no model_fairness finding on {attr}"})
    fair = analysis["fairness"]
    rows.append({"fault": "biased_model", "where": manifest.predictions["model"], "found": fair["passed"] is False,
                 "evidence": f"fairness policy {'failed' if fair['passed'] is False else 'passed'}"})
    rows += scheduler_checks(api, manifest, findings)
    return rows


def run_demo(settings: Settings, *, size: str = "demo", exit_after: float | None = None, port: int | None = None,
             dashboard_port: int | None = None, as_json: bool = False, seed: int = 7) -> None:
    started = time.monotonic()
    say = (lambda *_: None) if as_json else click.echo
    safefiles.private_dir(settings.data_dir)
    engine = db.make_engine(settings.database_url)
    db.upgrade(settings.database_url)
    say(f"database   {engine.url.render_as_string(hide_password=True)} (schema {db.current_revision(engine)})")
    admin = auth.create_token(engine, "demo-admin", ["admin"])

    # A fleet whose two simulated hours end now, so beat's rolling windows pick up where the demo stops. Not
    # rounded down to the minute: the live panel's latest samples are those of the last three scrape intervals
    # (90 s here), and a minute's rounding plus a slow machine's start put the last scrape past them.
    now = dt.datetime.now(dt.UTC).replace(microsecond=0)
    make = small_spec if size == "small" else demo_spec
    duration = make(seed).duration_s
    spec = make(seed, start=now - dt.timedelta(seconds=duration))
    sim_dir = settings.data_dir / "sim"
    shutil.rmtree(sim_dir, ignore_errors=True)
    t = time.monotonic()
    manifest = simulate(spec, sim_dir)
    manifest.spec = spec
    say(f"simulated  {manifest.topology['gpus']} GPUs on {manifest.topology['hosts']} nodes at {len(manifest.topology['sites'])} sites, "
        f"{len(manifest.jobs)} jobs, {duration / 60:g} simulated minutes, {len(manifest.faults)} injected faults ({time.monotonic() - t:.1f} s)")

    api_port = _free_port(settings.api_host, port or settings.api_port)
    dash_port = _free_port(settings.api_host, dashboard_port or 8501)
    url = f"http://{settings.api_host}:{api_port}"
    sink = WebhookSink(settings.api_host).start()
    env = {**os.environ, "FLEETSCOPE_DATA_DIR": str(settings.data_dir), "FLEETSCOPE_DATABASE_URL": settings.database_url,
           "FLEETSCOPE_BROKER_URL": settings.broker_url, "FLEETSCOPE_RESULT_BACKEND": settings.result_backend,
           "FLEETSCOPE_API_URL": url, "FLEETSCOPE_ALERT_ALLOW_LOOPBACK": "true", "FLEETSCOPE_ALERT_EXTERNAL_URL": url}
    if size == "small":
        # ten simulated minutes leave the hung job 2.5 minutes of stall by the end: under the 5-minute floor
        # a fleet would use, so the short demo checks with a shorter one (as an operator may configure)
        env.setdefault("FLEETSCOPE_HANG_MIN_STALL_S", "120")
        # and leave the team's idle GPUs 6.5 minutes idle: under the 30-minute threshold, so a 5-minute one here
        env.setdefault("FLEETSCOPE_IDLE_ALLOCATION_MIN_S", "300")
    logs = safefiles.private_dir(settings.data_dir / "logs")
    cli = [sys.executable, "-m", "fleetscope.cli"]
    specs = {
        "api": [*cli, "serve", "--host", settings.api_host, "--port", str(api_port), "--workers", "2"],
        "worker": [*cli, "worker", "--pool", "threads", "--concurrency", "4"],
        "beat": [*cli, "beat"],
        "dashboard": [*cli, "dashboard", "--host", settings.api_host, "--port", str(dash_port)],
    }
    procs: list[subprocess.Popen] = []
    # Stopped by a service manager, `timeout` or a closed terminal rather than Ctrl-C, the demo still
    # stops its servers: SIGTERM and SIGHUP take the Ctrl-C path (by default they end Python at once,
    # leaving the children, each in its own session, running).
    caught = (signal.SIGTERM, signal.SIGHUP)
    previous = {sig: signal.signal(sig, _interrupt) for sig in caught} if threading.current_thread() is threading.main_thread() else {}
    try:
        for name, args in specs.items():
            with safefiles.open_private_append(logs / f"{name}.log") as out:
                procs.append(subprocess.Popen(args, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True))
        _wait_healthy(url + "/healthz", procs)
        api = Api(url, admin)
        api.call("PUT", "/api/v1/alerts/receivers/default", json={"kind": "webhook", "url": sink.url})
        say(f"api        {url}  (OpenAPI at {url}/docs)")

        written = ingest_simulation(api, manifest, sim_dir, say)

        celery_app = make_celery(settings)
        analysis = analyse(api, manifest, celery_app, say)

        celery_app.send_task("fleetscope.alerting.evaluate").get(timeout=120)
        deadline = time.monotonic() + 30
        while not sink.received and time.monotonic() < deadline:
            time.sleep(0.5)
            celery_app.send_task("fleetscope.alerting.evaluate").get(timeout=120)
        alerts = sorted({a["labels"].get("alertname", "?") for n in sink.received for a in n.get("json", {}).get("alerts", [])})
        say(f"alerts     {len(sink.received)} notification(s) delivered to the webhook sink {sink.url}: {', '.join(alerts) or 'none yet'}")

        for m in json.loads((sim_dir / manifest.files["registry"][0]).read_text())["models"]:
            api.call("POST", "/api/v1/declarations", json={"model": m["name"], "version": m["version"], "kind": "purpose", "value": {"text": m["intended_purpose"]}})
            api.call("POST", "/api/v1/declarations", json={"model": m["name"], "version": m["version"], "kind": "classification", "value": {"general_purpose": True}})
        audit = api.call("POST", "/api/v1/audits")
        export = api.call("POST", "/api/v1/exports", params={"audit_id": audit["audit_id"]})
        say(f"ai act     audit {audit['audit_id']}: " + ", ".join(f"{k} {v}" for k, v in sorted(audit["counts"].items())))
        say(f"           report {settings.data_dir / audit['reports'][-1]}; signed export {export['export_id'][:16]}…")

        faults = check_faults(api, manifest, analysis)
        for row in faults:
            say(f"  {'FOUND ' if row['found'] else 'MISSED'} {row['fault']:<30} {row['where']:<22} {row['evidence']}")
        bill = team_bill(api, manifest)
        say("team bill  " + "; ".join(f"{b['team'] or '(unassigned)'} {b['jobs']} jobs {b['gpu_hours']:.2f} GPU-hours "
                                      + (f"{b['cost']:.2f} {b['currency']}" if b.get("cost") is not None else "unpriced") for b in bill))
        # Sustainability and finance: each site's energy, location-based emissions and PUE from its meters.
        window = {"start": spec.start.isoformat(), "end": (spec.start + dt.timedelta(seconds=duration)).isoformat()}
        energy = [{**e, **{k: v for k, v in api.call("GET", f"/api/v1/sites/{e['site_id']}/pue", params=window).items()
                           if k in ("pue", "basis", "category")}}
                  for e in api.call("GET", "/api/v1/energy", params={**window, "by": "site_id"})]
        say("energy     " + "; ".join(f"{e['site_id']} {e['energy_kwh']:.1f} kWh, " + (f"{e['kgco2e']:.2f} kgCO2e" if e.get("kgco2e") is not None else "no grid intensity")
                                      + (f", PUE {e['pue']:.3f} ({e['basis']})" if e.get("pue") is not None else "") for e in energy)
            + " (`fleetscope energy report`, `energy pue SITE`)")
        # Reliability: interruptions by root cause, the fleet's GPU MTBF and each job's checkpoint advice.
        rel = api.call("GET", "/api/v1/reliability", params=window)
        advice = [a for a in rel["checkpoint"] if a.get("daly_interval_s") is not None]
        say(f"reliable   {rel['interruptions']['total']} interruption(s) ("
            + (", ".join(f"{c['category']} {c['interruptions']}" for c in rel["interruptions"]["by_category"] if c["interruptions"]) or "none")
            + (f"); GPU MTBF {mtbf:.4g} h" if (mtbf := rel["mtbf"]["gpu_mtbf_hours"]) is not None else "); no GPU MTBF")
            + f" over {rel['mtbf']['gpu_hours']:.4g} GPU-hours"
            + "".join(f"; {a['job_id']} checkpoints every {a['interval_s']:.0f} s, Daly's optimum {a['daly_interval_s']:.0f} s" for a in advice[:2])
            + " (`fleetscope health reliability`)")
        # The fleet now, as on-call reads it first (the Overview's live panel).
        state = api.call("GET", "/api/v1/fleet/state", params={"problems_only": "true"})
        c, watts = state["counts"], state["power"]["power_w"]
        say(f"fleet now  {c['gpus']:,} GPUs: {c['busy']:,} busy, {c['idle']:,} idle, {c['unhealthy']:,} unhealthy, {c['silent']:,} silent; "
            + (f"{watts / 1e3:,.1f} kW" if watts is not None else "no power reading") + " (`fleetscope fleet state --problems`)")
        # The service's own pipeline, as an operator checks it: ingest arriving, roll-ups keeping up, beat leading.
        pipe = api.call("GET", "/api/v1/fleet/pipeline")
        late = [st["stage"] for st in pipe["stages"] if st["late"]]
        say(f"pipeline   {pipe['ingest']['pushes_recent']:,} pushes in the last {pipe['ingest']['recent_s']:g} s; roll-ups "
            + (f"LATE: {', '.join(late)}" if late else "keeping up") + "; beat " + ("leading" if pipe["beat"]["leading"] else "has NO LEADER")
            + f"; {sum(r['bytes'] or 0 for r in pipe['storage']) / 2**20:,.0f} MiB stored (`fleetscope db status`)")
        summary = {
            "fleet_state": {"counts": c, "power_w": watts, "problems": len(state["grid"])},
            "pipeline": {"late": late, "beat_leading": pipe["beat"]["leading"], "pushes_recent": pipe["ingest"]["pushes_recent"]},
            "api_url": url, "docs_url": url + "/docs", "dashboard_url": f"http://{settings.api_host}:{dash_port}", "webhook_sink": sink.url,
            "token": admin, "written": written, "alerts_delivered": len(sink.received), "alertnames": alerts, "audit": audit,
            "export_id": export["export_id"], "faults": faults, "team_bill": bill, "energy": energy,
            "reliability": {"interruptions": rel["interruptions"]["total"], "by_category": rel["interruptions"]["by_category"],
                            "gpu_mtbf_hours": rel["mtbf"]["gpu_mtbf_hours"], "checkpoint": advice},
            "ready_s": round(time.monotonic() - started, 1), "logs": str(logs),
        }
        if as_json:
            click.echo(json.dumps(summary, default=str))
        else:
            say(f"dashboard  {summary['dashboard_url']}  (sign in with the token below)")
            say(f"token      {admin}   (scope admin: paste it into the dashboard's sign-in; for the API, try: "
                f"curl -H 'Authorization: Bearer {admin}' {url}/api/v1/jobs)")
            say(f"logs       {logs}")
            say(f"ready in {summary['ready_s']} s. Ctrl-C stops everything.")
        deadline = None if exit_after is None else time.monotonic() + exit_after
        while deadline is None or time.monotonic() < deadline:
            for p in procs:
                if p.poll() is not None:
                    raise click.ClickException(f"`{' '.join(p.args[3:5])}` exited with {p.returncode}; see {logs}")
            time.sleep(0.5)
    except KeyboardInterrupt:
        say("\nstopping ...")
    finally:
        _stop(procs)
        sink.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)

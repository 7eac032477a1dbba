"""`fleetscope agent --probe-every`: the SDC known-answer probe run by the node agent beside its telemetry and
pushed through the API as the ``sdc_probe`` health event `fleetscope health probe` records, through the same
backlog as the other readings; a real API (in-process uvicorn over SQLite and PostgreSQL) takes it, the
health sweep's SDC screen finds a failed one and the shipped ``SdcSuspect`` rule fires.

There is no GPU here: the probe runs on numpy, and a GPU is a CUDA device list and an NVML listing
monkeypatched in; a corrupting GPU is the real probe's result with a wrong digest (the golden is untouched)."""

from __future__ import annotations

import dataclasses
import datetime as dt
import importlib.util
import json
import os
import random
import socket
import subprocess
import sys
import threading
import time
import types

import polars as pl
import pytest

from analyzers import sdc_probe
from fleetscope.agent import Agent, probing
from fleetscope.devices import nvml as nvml_driver
from fleetscope.devices import probe as probe_device
from fleetscope.services import auth
from fleetscope.services import health as health_service
from fleetscope.services.alerting import state as ST
from fleetscope.services.alerting.rules import load_config
from tests.clirun import cli
from tests.fleetscope.test_agent_backlog import Clock, Front

T0 = dt.datetime(2026, 3, 1, 12, 0, tzinfo=dt.UTC)
TEN_S = dt.timedelta(seconds=10)
H100 = "NVIDIA H100 80GB HBM3"
GPU = "GPU-5c1a0b6e-1f2d-4c3b-9a8e-7d6c5b4a3f21"  # NVML's name for the node's only GPU
NO_CUDA_LIBRARY = importlib.util.find_spec("torch") is None and importlib.util.find_spec("cupy") is None


def token(api) -> str:
    return auth.create_token(api.app.state.store.engine, "agent", ["ingest"])


def probe_events(api) -> pl.DataFrame:
    ev = api.app.state.store.read("health_event")
    return ev.filter(pl.col("kind") == "sdc_probe").sort("ts")


@pytest.fixture
def nvml_gpu(monkeypatch):
    """NVML as the agent calls it, for one H100 at PCI 0000:07:00 whose power rises 50 W a reading."""
    power = iter(range(250, 10_000, 50))
    monkeypatch.setattr(nvml_driver, "read_devices", lambda: [{"index": 0, "uuid": GPU, "name": H100, "pci_bus_id": "00000000:07:00.0",
                                                              "power_mw": next(power) * 1000, "temp_c": 59}])
    monkeypatch.setattr(nvml_driver, "xid_events", lambda *_: [])


@pytest.fixture
def cuda_gpu(monkeypatch, nvml_gpu):
    """torch sees one CUDA device at the NVML GPU's PCI address (no UUID from this torch: the address names it),
    and probes it with the real arithmetic (on numpy here)."""
    monkeypatch.setattr(probe_device, "cuda_devices", lambda backend: ("torch", [probe_device.CudaDevice(0, H100, None, (0, 0x07, 0))]))
    real = probe_device.run_probe

    def on_gpu(backend: str = "numpy", *, device_index: int = 0, **kw):
        assert (backend, device_index) == ("torch", 0)
        r = real("numpy", **kw)
        return dataclasses.replace(r, backend="torch", device=f"{H100} (cuda:0)", device_type=H100)

    monkeypatch.setattr(probe_device, "run_probe", on_gpu)
    return on_gpu


# --- the probe's result through the API --------------------------------------------------------------------


@pytest.mark.parametrize("push", ["otlp", "batch"])
def test_a_probe_result_is_stored_as_the_health_event_the_cli_records(api, push):
    """No GPU backend: the CPU with numpy, named numpy:HOST/cpu as `fleetscope health probe` names it (a device
    name alone is every node's); in OTLP mode too it goes to /api/v1/batches (OTLP has no form for it)."""
    agent = Agent(api.url, token(api), host="gpu-node-3", push=push, probe_every_s=600, probe_backend="numpy", probe_wait_s=60)
    report = agent.tick(T0)
    agent.close()
    assert report.errors == {} and report.pushed == {"probe": {"health_event": 1}}
    (p,) = report.probes
    golden = sdc_probe.PROBE_GOLDEN_SHA256[(sdc_probe.PROBE_N, sdc_probe.PROBE_ROUNDS, sdc_probe.PROBE_SEED)]
    assert p["passed"] is True and p["digest"] == p["golden"] == golden and p["gpu_uuid"] == "numpy:gpu-node-3/cpu" and p["ts"] == T0.isoformat()
    got = probe_events(api)
    result = sdc_probe.ProbeResult("numpy", "cpu", sdc_probe.PROBE_N, sdc_probe.PROBE_ROUNDS, sdc_probe.PROBE_SEED, golden, golden, True,
                                   p["seconds"], None, "cpu")
    want = sdc_probe.probe_event(result, ts=T0, host="gpu-node-3", gpu_uuid="numpy:gpu-node-3/cpu")
    assert got.select(want.columns).to_dicts() == want.to_dicts()
    assert health_service.probe_results(got)["passed"].to_list() == [True]


def test_a_probe_result_the_api_did_not_take_is_kept_and_resent_with_its_time(api):
    front = Front(api.url)
    try:
        front.plan = [(503, {"Retry-After": "1"})]
        clock = Clock()
        agent = Agent(front.url, token(api), host="gpu-node-3", probe_every_s=600, probe_backend="numpy", probe_wait_s=60,
                      clock=clock, sleep=clock.sleep, rng=random.Random(1))
        first = agent.tick(T0)
        assert first.buffered == 1 and first.pushed == {} and "not delivered yet, kept to resend (API answered 503" in first.errors["probe"]
        assert first.probes[0]["passed"] is True
        clock.t += 10
        later = agent.tick(T0 + TEN_S)  # no round due: only the kept one goes
        agent.close()
        assert later.replayed == 1 and later.buffered == 0 and later.errors == {} and later.probes == []
        assert front.seen == [("/api/v1/batches", 503), ("/api/v1/batches", 200)]
        assert probe_events(api).select("ts", "host", "gpu_uuid", "value").rows() == [(T0, "gpu-node-3", "numpy:gpu-node-3/cpu", 1.0)]
    finally:
        front.close()


def test_a_slow_probe_round_does_not_hold_up_the_ticks(api, nvml_gpu, monkeypatch):
    """A round that takes longer than the ticks (a CUDA library loading, a busy or wedged GPU) runs beside
    them: each tick pushes its telemetry on time, a round due while the last still runs is reported, and the
    result goes with the first tick after it finished, stamped with the tick that started it."""
    release, started = threading.Event(), threading.Event()
    real = probe_device.run_probe

    def slow(backend: str = "numpy", **kw):
        started.set()
        assert release.wait(60)
        return real(backend, **kw)

    monkeypatch.setattr(probe_device, "run_probe", slow)
    clock = Clock()
    agent = Agent(api.url, token(api), nvml=True, host="gpu-node-9", push="batch", probe_every_s=600, probe_backend="numpy",
                  clock=clock, sleep=clock.sleep, rng=random.Random(1))
    reports, took = [], []
    for i, advance in enumerate((0, 10, 600)):  # the third tick is when the next round is due
        clock.t += advance
        t = time.perf_counter()
        reports.append(agent.tick(T0 + i * TEN_S))
        took.append(time.perf_counter() - t)
        assert started.wait(10)
    assert all(s < 5 for s in took), took  # the probe is still blocked: no tick waited for it
    assert [r.pushed.get("nvml", {}).get("gpu_sample") for r in reports] == [1, 1, 1]
    assert [r.probes for r in reports] == [[], [], []]
    assert reports[0].errors == reports[1].errors == {}
    assert reports[2].errors == {"probe": f"the probe round started at {T0.isoformat()} is still running; the one due now is skipped"}
    release.set()
    agent.prober._thread.join(30)
    clock.t += 10
    done = agent.tick(T0 + 3 * TEN_S)
    agent.close()
    assert done.errors == {} and done.pushed["probe"] == {"health_event": 1} and [p["passed"] for p in done.probes] == [True]
    assert probe_events(api).select("ts", "gpu_uuid").rows() == [(T0, "numpy:gpu-node-9/cpu")]
    assert api.app.state.store.read("gpu_sample").height == 4


def test_a_probe_that_raises_is_the_ticks_error_and_telemetry_goes_on(api, cuda_gpu, monkeypatch):
    def broken(backend: str = "numpy", **kw):
        raise RuntimeError("CUDA error: an illegal memory access was encountered\nCUDA kernel errors might be asynchronously reported")

    monkeypatch.setattr(probe_device, "run_probe", broken)
    clock = Clock()
    agent = Agent(api.url, token(api), nvml=True, host="gpu-node-9", push="batch", probe_every_s=600, probe_backend="auto", probe_wait_s=60,
                  clock=clock, sleep=clock.sleep)
    report = agent.tick(T0)
    assert report.errors == {"probe": "torch cuda:0: CUDA error: an illegal memory access was encountered"}
    assert report.pushed["nvml"]["gpu_sample"] == 1 and report.probes == [{"ts": T0.isoformat(), "device": "torch cuda:0",
                                                                           "error": "CUDA error: an illegal memory access was encountered"}]
    monkeypatch.setattr(probe_device, "run_probe", cuda_gpu)  # the next round, the GPU answers
    clock.t += 600
    report = agent.tick(T0 + 60 * TEN_S)
    agent.close()
    assert report.errors == {} and report.pushed["probe"] == {"health_event": 1}
    assert probe_events(api).select("ts", "gpu_uuid", "value").rows() == [(T0 + 60 * TEN_S, GPU, 1.0)]


# --- end to end: a corrupting GPU becomes a finding and a page -------------------------------------------------


@pytest.fixture
def corrupting_gpu(monkeypatch, cuda_gpu):
    """The GPU's probe comes back with one element wrong: the real result, its digest taken of a wrong matrix."""
    def corrupting(backend: str = "numpy", **kw):
        r = cuda_gpu(backend, **kw)
        wrong = sdc_probe.probe_matmul()
        wrong[7, 9] += 1  # one element computed wrong, as a corrupting GPU would
        digest = sdc_probe.probe_digest(wrong)
        return dataclasses.replace(r, digest=digest, passed=sdc_probe.check_probe(digest), mismatched_elements=1)

    monkeypatch.setattr(probe_device, "run_probe", corrupting)


def test_a_wrong_digest_from_a_gpu_is_an_sdc_finding_and_fires_sdc_suspect(api, corrupting_gpu):
    now = dt.datetime.now(dt.UTC).replace(microsecond=0)
    agent = Agent(api.url, token(api), host="gpu-node-3", probe_every_s=900, probe_backend="auto", probe_wait_s=60)
    report = agent.tick(now)
    agent.close()
    assert report.errors == {} and report.pushed == {"probe": {"health_event": 1}}
    (p,) = report.probes
    assert p["gpu_uuid"] == GPU and p["passed"] is False and p["digest"] != p["golden"]

    store = api.app.state.store
    health_service.health_window(store, now - dt.timedelta(minutes=15), now + dt.timedelta(seconds=1))
    found = store.read("finding").filter(pl.col("analyzer") == "sdc")
    assert found.select("subject", "kind", "severity").rows() == [(f"gpu:{GPU}", "sdc_confirmed", "critical")]
    (signal,) = json.loads(found["evidence"][0])["signals"]
    assert signal == {"signal": "probe_failed", "digest": p["digest"], "golden": p["golden"], "mismatched_elements": 1, "device_type": H100}

    res = ST.evaluate_and_dispatch(store, load_config(), now=now + dt.timedelta(minutes=1))
    firing = [st.labels for st in res.states.values() if st.state == "firing"]
    assert [labels["subject"] for labels in firing if labels["alertname"] == "SdcSuspect"] == [f"gpu:{GPU}"]


# --- which devices, under which names --------------------------------------------------------------------------


def test_gpus_are_named_by_nvml_through_uuid_or_pci_address_never_by_cuda_ordinal():
    nvml = [{"uuid": "GPU-aaaaaaaa-0000-0000-0000-000000000000", "pci_bus_id": "00000000:07:00.0"},
            {"uuid": "GPU-bbbbbbbb-0000-0000-0000-000000000000", "pci_bus_id": b"00000000:0A:00.0"}]
    devs = [probe_device.CudaDevice(0, H100, None, (0, 0x0A, 0)),  # CUDA's 0 is NVML's second GPU
            probe_device.CudaDevice(1, H100, "GPU-AAAAAAAA-0000-0000-0000-000000000000", None),
            probe_device.CudaDevice(2, H100, "GPU-cccccccc-0000-0000-0000-000000000000", (0, 0x99, 0))]  # not NVML's
    assert probing.nvml_names(devs, nvml) == {0: "GPU-bbbbbbbb-0000-0000-0000-000000000000", 1: "GPU-aaaaaaaa-0000-0000-0000-000000000000"}
    result = sdc_probe.ProbeResult("torch", f"{H100} (cuda:2)", 256, 8, 1, "d", "g", True, 0.1, None, H100)
    # as `fleetscope health probe` names it, with the node: a device name alone is the same on every node
    assert probing.Target("torch", 2).subject(result, "n7") == f"torch:n7/{H100} (cuda:2)"
    assert probing.Target("torch", 2, "GPU-aaaaaaaa-0000-0000-0000-000000000000").subject(result, "n7") == "GPU-aaaaaaaa-0000-0000-0000-000000000000"


def test_cuda_devices_give_their_uuid_and_pci_address(monkeypatch):
    props = types.SimpleNamespace(name=H100, uuid="5c1a0b6e-1f2d-4c3b-9a8e-7d6c5b4a3f21", pci_domain_id=0, pci_bus_id=7, pci_device_id=0)
    cuda = types.SimpleNamespace(is_available=lambda: True, device_count=lambda: 1, get_device_name=lambda d: H100,
                                 get_device_properties=lambda i: props)
    fake = types.ModuleType("torch")
    fake.__dict__.update(version=types.SimpleNamespace(cuda="12.4"), cuda=cuda, device=lambda kind, i: (kind, i))
    monkeypatch.setitem(sys.modules, "torch", fake)
    assert probe_device.cuda_devices("cuda") == ("torch", [probe_device.CudaDevice(0, H100, GPU, (0, 7, 0))])
    assert probe_device._gpu_uuid(bytes.fromhex("5c1a0b6e1f2d4c3b9a8e7d6c5b4a3f21")) == GPU  # cupy's 16 bytes


@pytest.mark.skipif(not NO_CUDA_LIBRARY, reason="a CUDA library is installed here: its absence cannot be tested")
def test_without_a_gpu_backend_auto_says_so_and_probes_the_cpu_and_torch_is_refused():
    found, note = probing.targets("auto", read_nvml=lambda: [])
    assert found == [probing.Target("numpy", 0)] and note.startswith("no GPU probe backend here, so the SDC probe runs on the CPU with numpy")
    with pytest.raises(probe_device.ProbeUnavailable, match="probe backend torch: torch is not installed"):
        probing.targets("torch")
    with pytest.raises(ValueError, match="too often"):
        Agent("http://127.0.0.1:9", "t", probe_every_s=30, probe_backend="numpy")
    with pytest.raises(ValueError, match="probe backend must be one of"):
        Agent("http://127.0.0.1:9", "t", probe_every_s=600, probe_backend="opencl")


# --- the command line -----------------------------------------------------------------------------------------


def _agent(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fleetscope.cli", "agent", "--no-infiniband", *args], env=env, capture_output=True, text=True,
                          timeout=120)


@pytest.mark.skipif(not NO_CUDA_LIBRARY, reason="a CUDA library is installed here: auto would take it")
def test_cli_agent_once_probes_and_reports_it_and_refuses_what_cannot_run(api, tmp_path):
    env = {**os.environ, "FLEETSCOPE_DATA_DIR": str(tmp_path)}
    common = ("--api", api.url, "--token", token(api))
    once = _agent("--probe-every", "600", "--once", "--json", *common, env=env)
    assert once.returncode == 0, once.stderr
    assert once.stderr.count("no GPU probe backend here, so the SDC probe runs on the CPU with numpy") == 1  # the agent's log line
    out = json.loads(once.stdout)
    assert out["errors"] == {} and out["pushed"] == {"probe": {"health_event": 1}}
    (p,) = out["probe"]
    assert p["passed"] is True and p["backend"] == "numpy" and p["gpu_uuid"] == f"numpy:{socket.gethostname()}/cpu" and p["digest"] == p["golden"]
    assert probe_events(api)["value"].to_list() == [1.0]

    torch = _agent("--probe-every", "600", "--probe-backend", "torch", "--once", *common, env=env)
    assert torch.returncode == 1 and "Traceback" not in torch.stderr
    assert torch.stderr.strip().splitlines() == ["Error: --probe-backend torch: probe backend torch: torch is not installed "
                                                 "(install cupy-cuda12x (or a CUDA build of torch) on a host with an NVIDIA driver and GPU)"]
    often = _agent("--probe-every", "5", "--once", *common, env=env)
    assert often.returncode == 2 and "'--probe-every': 5.0 is not in the range x>=60" in often.stderr
    assert probing.MIN_PROBE_EVERY_S == 60  # the option's bound
    alone = _agent("--dcgm", "http://127.0.0.1:9/metrics", "--probe-backend", "numpy", "--once", *common, env=env)
    assert alone.returncode == 2 and "--probe-backend needs --probe-every SECONDS" in alone.stderr


def test_cli_agent_once_exits_5_on_a_wrong_digest_and_lists_it(api, corrupting_gpu, tmp_path):
    """In this process (the GPU is monkeypatched), where the agent's other tests run it as a process of its own."""
    done = cli("agent", "--no-infiniband", "--probe-every", "600", "--once", "--json", "--api", api.url, "--token", token(api),
               env={**os.environ, "FLEETSCOPE_DATA_DIR": str(tmp_path)})
    assert done.returncode == 5, done.stderr
    out = json.loads(done.stdout)
    assert out["errors"] == {} and out["pushed"] == {"probe": {"health_event": 1}}
    assert [(p["gpu_uuid"], p["backend"], p["passed"], p["mismatched_elements"]) for p in out["probe"]] == [(GPU, "torch", False, 1)]
    assert probe_events(api).select("gpu_uuid", "value").rows() == [(GPU, 0.0)]

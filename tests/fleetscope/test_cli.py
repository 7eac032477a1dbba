"""The `fleetscope` command with the environment as its configuration: its verbs run in the test process
(``tests/clirun.py`` says what a fresh process would have that it restores), and the installed script runs
once as a real process, as a user runs it."""

import datetime as dt
import json
import os
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

from fleetscope.services import auth
from fleetscope.store import db
from tests.clirun import cli


def run(tmp_path, *args, check=True, input=None):
    env = {**os.environ, "FLEETSCOPE_DATA_DIR": str(tmp_path)}
    env.pop("FLEETSCOPE_DATABASE_URL", None)
    proc = cli(*args, env=env, input=input)
    if check and proc.returncode != 0:
        raise AssertionError(proc.stdout + proc.stderr)
    return proc


def test_help_lists_the_verbs(tmp_path):
    from fleetscope import __version__

    out = run(tmp_path, "--help").stdout
    for verb in ("demo", "serve", "worker", "beat", "db", "token"):
        assert f"  {verb}" in out
    assert run(tmp_path, "--version").stdout.strip() == f"fleetscope, version {__version__}"


def test_db_upgrade_and_current(tmp_path):
    head = db.head_revision("sqlite://")
    assert f"database at {head}" in run(tmp_path, "db", "upgrade").stdout
    cur = json.loads(run(tmp_path, "db", "current", "--json").stdout)
    assert cur["current"] == cur["head"] == head


def test_db_prune_deletes_each_tier_after_its_own_retention(tmp_path):
    from fleetscope.core import frames as F
    from fleetscope.store import Store

    run(tmp_path, "db", "upgrade")
    url = json.loads(run(tmp_path, "db", "current", "--json").stdout)["url"]
    store = Store.open(url)
    now = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)
    store.write(F.Batch(gpu_sample=pl.DataFrame({"ts": [now - dt.timedelta(days=d) for d in (10, 500)], "gpu_uuid": ["g", "g"], "power_w": [1.0, 2.0]}),
                        health_event=pl.DataFrame({"ts": [now - dt.timedelta(days=d) for d in (500, 2000)], "gpu_uuid": ["g", "g"],
                                                   "kind": ["xid", "xid"], "code": [48, 79]})))
    plan = json.loads(run(tmp_path, "db", "prune", "--dry-run", "--now", now.isoformat(), "--json").stdout)
    assert plan["gpu_sample"] == (now - dt.timedelta(days=400)).isoformat() and plan["finding"] == (now - dt.timedelta(days=1095)).isoformat()
    assert store.read("gpu_sample").height == 2  # a dry run deletes nothing
    deleted = json.loads(run(tmp_path, "db", "prune", "--now", now.isoformat(), "--json").stdout)
    assert deleted["gpu_sample"] == 1 and deleted["health_event"] == 1
    assert store.read("gpu_sample")["power_w"].to_list() == [1.0] and store.read("health_event")["code"].to_list() == [48]


def test_token_create_list_revoke(tmp_path):
    created = json.loads(run(tmp_path, "token", "create", "--scope", "ingest", "--scope", "read", "--name", "collector", "--json").stdout)
    assert created["token"].startswith("fs_") and created["scopes"] == ["ingest", "read"]
    engine = db.make_engine(f"sqlite:///{tmp_path / 'fleetscope.store.db'}")
    assert auth.verify(engine, created["token"]).scopes == frozenset({"ingest", "read"})
    listed = json.loads(run(tmp_path, "token", "list", "--json").stdout)
    assert [(t["name"], t["scopes"]) for t in listed] == [("collector", "ingest read")]
    assert created["token"] not in run(tmp_path, "token", "list").stdout  # secrets are never shown again
    run(tmp_path, "token", "revoke", str(listed[0]["token_id"]))
    auth._cache.clear()
    assert auth.verify(engine, created["token"]) is None


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (("token", "create", "--scope", "root"), "Invalid value for '--scope'"),
        (("token", "revoke", "99"), "no active token with id 99"),
        (("token", "create"), "Missing option '--scope'"),
    ],
)
def test_bad_arguments_say_what_is_wrong(tmp_path, args, words):
    proc = run(tmp_path, *args, check=False)
    assert proc.returncode != 0
    assert words in proc.stderr


def test_bad_setting_is_a_clear_error_not_a_traceback(tmp_path):
    env = {**os.environ, "FLEETSCOPE_DATA_DIR": str(tmp_path), "FLEETSCOPE_API_PORT": "http"}
    proc = cli("token", "list", env=env)
    assert proc.returncode == 1
    assert "FLEETSCOPE_API_PORT='http': expected an integer" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_alert_silences_from_the_command_line(tmp_path):
    made = run(tmp_path, "alerts", "silence", "alertname=Straggler", 'host=~"site-a-.*"', "severity!=critical", "--for", "30m", "--by", "ana", "--comment", "rack work")
    sid = made.stdout.split()[1]
    listed = json.loads(run(tmp_path, "alerts", "silences", "--json").stdout)
    assert [(s["id"], s["status"]["state"], s["createdBy"]) for s in listed] == [(sid, "active", "ana")]
    assert {(m["name"], m["isRegex"], m["isEqual"]) for m in listed[0]["matchers"]} == {("alertname", False, True), ("host", True, True), ("severity", False, False)}
    assert "severity!=critical" in run(tmp_path, "alerts", "silences").stdout
    run(tmp_path, "alerts", "expire", sid)
    assert json.loads(run(tmp_path, "alerts", "silences", "--json").stdout)[0]["status"]["state"] == "expired"
    bad = run(tmp_path, "alerts", "silence", "alertname", "--by", "a", "--comment", "c", check=False)
    assert bad.returncode == 1 and "cannot parse matcher" in bad.stderr
    assert run(tmp_path, "alerts", "silence", "a=b", "--for", "soon", "--by", "a", "--comment", "c", check=False).returncode == 2


def test_findings_lists_what_went_quiet_and_metrics_prints_the_fleet_series(tmp_path):
    import datetime as dt

    import polars as pl
    from prometheus_client.parser import text_string_to_metric_families

    from analyzers import absence
    from fleetscope.core import frames as F
    from fleetscope.store import Store

    run(tmp_path, "db", "upgrade")
    store = Store.open(f"sqlite:///{tmp_path / 'fleetscope.store.db'}")
    now = dt.datetime.now(dt.UTC)
    seen = pl.DataFrame({"gpu_uuid": ["GPU-a", "GPU-b"], "host": ["n1", "n2"], "last_ts": [now - dt.timedelta(minutes=10), now],
                         "interval_s": [10.0, 10.0]}, schema=absence.SEEN_SCHEMA)
    store.write(F.Batch(gpu=pl.DataFrame({"gpu_uuid": ["GPU-a", "GPU-b"], "host": ["n1", "n2"]}),
                        finding=absence.absence_findings(seen, now=now)))
    got = json.loads(run(tmp_path, "fleet", "findings", "--analyzer", "absence", "--json").stdout)
    assert [(r["kind"], r["subject"], r["severity"]) for r in got] == [("host_down", "host:n1", "critical")]
    assert "host:n1" in run(tmp_path, "fleet", "findings", "--kind", "host_%").stdout
    assert run(tmp_path, "fleet", "findings", "--since", "soon", check=False).returncode == 2  # a usage error names --since
    fams = {f.name: f for f in text_string_to_metric_families(run(tmp_path, "fleet", "metrics").stdout)}
    assert [s.labels for s in fams["fleetscope_host_down"].samples] == [{"Hostname": "n1"}]
    out = tmp_path / "textfile" / "fleetscope.prom"
    out.parent.mkdir()
    run(tmp_path, "fleet", "metrics", "--out", str(out))
    assert "fleetscope_host_down" in out.read_text() and not list(out.parent.glob("*.tmp"))
    store.engine.dispose()


def test_the_installed_script_is_the_command(tmp_path):
    """The console script ``pip install`` puts next to the interpreter, as a process of its own: the entry point
    resolves, --help answers, a verb does its work and a usage error is exit status 2."""
    script = Path(sys.executable).with_name("fleetscope")
    assert script.is_file(), f"{script} is missing: install the project (pip install -e .)"
    env = {**os.environ, "FLEETSCOPE_DATA_DIR": str(tmp_path)}
    env.pop("FLEETSCOPE_DATABASE_URL", None)
    sh = lambda *a: subprocess.run([str(script), *a], env=env, capture_output=True, text=True, timeout=120)  # noqa: E731
    helped = sh("--help")
    assert helped.returncode == 0 and "Usage: fleetscope" in helped.stdout and "  token" in helped.stdout
    upgraded = sh("db", "upgrade")
    assert upgraded.returncode == 0, upgraded.stderr
    assert f"database at {db.head_revision('sqlite://')}" in upgraded.stdout and (tmp_path / "fleetscope.store.db").is_file()
    wrong = sh("token", "create")
    assert wrong.returncode == 2 and "Missing option '--scope'" in wrong.stderr

"""deploy/k8s: the Kubernetes manifests name real settings and CLI verbs, wire every Service, probe and
volume to something that exists, and route the same paths as the compose stack's proxy.

Rendered with `kubectl kustomize` where kubectl is installed (it is the renderer `kubectl apply -k` uses)."""

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from fleetscope import settings
from fleetscope.cli import main

ROOT = Path(__file__).resolve().parents[1]
BASE = ROOT / "deploy" / "k8s"
KUSTOMIZATION = yaml.safe_load((BASE / "kustomization.yaml").read_text())


def _objects() -> list[dict]:
    out = []
    for name in KUSTOMIZATION["resources"]:
        out.extend(doc for doc in yaml.safe_load_all((BASE / name).read_text()) if doc)
    return out


OBJECTS = _objects()


def _of(kind: str) -> dict[str, dict]:
    return {o["metadata"]["name"]: o for o in OBJECTS if o["kind"] == kind}


def _pod_specs() -> dict[str, dict]:
    specs = {name: d["spec"]["template"]["spec"] for name, d in _of("Deployment").items()}
    specs.update({name: j["spec"]["template"]["spec"] for name, j in _of("Job").items()})
    return specs


def test_every_file_in_the_folder_is_a_resource_of_the_kustomization():
    files = {p.name for p in BASE.glob("*.yaml")} - {"kustomization.yaml"}
    assert files == set(KUSTOMIZATION["resources"])
    assert KUSTOMIZATION["namespace"] == "fleetscope" and "fleetscope" in _of("Namespace")


def test_the_processes_are_the_compose_stacks_with_api_and_workers_replicated():
    deployments = _of("Deployment")
    assert set(deployments) == {"fleetscope-api", "fleetscope-worker", "fleetscope-beat", "fleetscope-dashboard"}
    assert deployments["fleetscope-api"]["spec"]["replicas"] >= 2
    assert deployments["fleetscope-worker"]["spec"]["replicas"] >= 2
    # beats for availability: the database lease (worker/beat.py), not one replica, keeps the schedule sent once
    assert deployments["fleetscope-beat"]["spec"]["replicas"] == 2
    assert _of("Job")["fleetscope-migrate"]["spec"]["template"]["spec"]["containers"][0]["command"] == ["fleetscope", "db", "upgrade"]


def test_every_command_is_a_cli_verb():
    for name, spec in _pod_specs().items():
        for container in spec["containers"]:
            cmd = container["command"]
            if cmd[0] == "fleetscope":
                result = CliRunner().invoke(main, [*cmd[1:2], "--help"])
                assert result.exit_code == 0, f"{name}: fleetscope {cmd[1]} --help failed: {result.output}"


def test_settings_are_real_and_the_secrets_named_in_the_comments_are_what_the_pods_read():
    known = {name for name, _, _ in settings.table()}
    config = _of("ConfigMap")["fleetscope-config"]["data"]
    assert set(config) <= known, set(config) - known
    assert config["FLEETSCOPE_AUTO_MIGRATE"] == "false"
    documented = set(re.findall(r"--from-literal=(FLEETSCOPE_[A-Z_]+)=", (BASE / "config.yaml").read_text()))
    assert documented == {"FLEETSCOPE_DATABASE_URL", "FLEETSCOPE_BROKER_URL", "FLEETSCOPE_RESULT_BACKEND", "FLEETSCOPE_READ_DATABASE_URL"}
    assert documented <= known
    for name, spec in _pod_specs().items():
        for container in spec["containers"]:
            sources = {(next(iter(s)), next(iter(s.values()))["name"]) for s in container["envFrom"]}
            assert sources == {("configMapRef", "fleetscope-config"), ("secretRef", "fleetscope-env")}, name


def test_the_shared_keys_and_the_checkpoint_folder_are_mounted_where_the_settings_point():
    config = _of("ConfigMap")["fleetscope-config"]["data"]
    claims = _of("PersistentVolumeClaim")
    assert claims["fleetscope-data"]["spec"]["accessModes"] == ["ReadWriteMany"]
    for name in ("fleetscope-api", "fleetscope-worker", "fleetscope-dashboard"):
        spec = _pod_specs()[name]
        volumes = {v["name"]: v for v in spec["volumes"]}
        mounts = {m["mountPath"]: m["name"] for m in spec["containers"][0]["volumeMounts"]}
        keys = str(Path(config["FLEETSCOPE_SIGNING_KEY"]).parent)
        assert keys == str(Path(config["FLEETSCOPE_AUDIT_KEY_FILE"]).parent)
        assert volumes[mounts[keys]]["secret"]["secretName"] == "fleetscope-keys", name
        data = str(Path(config["FLEETSCOPE_AUDIT_CHECKPOINT_FILE"]).parent)
        assert data == config["FLEETSCOPE_DATA_DIR"]
        assert volumes[mounts[data]]["persistentVolumeClaim"]["claimName"] in claims, name


def test_services_select_their_deployments_and_name_ports_that_exist():
    deployments = _of("Deployment")
    for name, svc in _of("Service").items():
        selected = [d for d in deployments.values() if svc["spec"]["selector"].items() <= d["spec"]["template"]["metadata"]["labels"].items()]
        assert len(selected) == 1, name
        d = selected[0]
        assert d["spec"]["selector"]["matchLabels"] == svc["spec"]["selector"]
        ports = {p["name"] for c in d["spec"]["template"]["spec"]["containers"] for p in c.get("ports", [])}
        assert {p["targetPort"] for p in svc["spec"]["ports"]} <= ports, name
    for name in ("fleetscope-api", "fleetscope-dashboard"):
        probe = deployments[name]["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["httpGet"]
        assert probe["path"] == {"fleetscope-api": "/healthz", "fleetscope-dashboard": "/_stcore/health"}[name]


def test_the_ingress_routes_the_api_paths_the_compose_proxy_routes():
    caddy = (ROOT / "deploy" / "Caddyfile").read_text()
    caddy_api = re.search(r"@api path (.+)", caddy).group(1).split()
    services = _of("Service")
    ingress = _of("Ingress")["fleetscope"]
    rules = [p for rule in ingress["spec"]["rules"] for p in rule["http"]["paths"]]
    assert all(p["backend"]["service"]["name"] in services for p in rules)

    def routed(path: str) -> str:
        """The Service the Ingress sends ``path`` to: an Exact match, else the longest Prefix (by element)."""
        for p in rules:
            if p["pathType"] == "Exact" and p["path"] == path:
                return p["backend"]["service"]["name"]
        prefixes = [p for p in rules if p["pathType"] == "Prefix"
                    and (path == p["path"].rstrip("/") or path.startswith(p["path"].rstrip("/") + "/") or p["path"] == "/")]
        return max(prefixes, key=lambda p: len(p["path"]))["backend"]["service"]["name"]

    for pattern in caddy_api:
        path = pattern.replace("*", "anything")
        assert routed(path) == "fleetscope-api", pattern
    for page in ("/", "/_stcore/stream", "/apix", "/static/app.js"):
        assert routed(page) == "fleetscope-dashboard", page
    assert ingress["spec"]["tls"][0]["secretName"] == "fleetscope-tls"


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed: the manifests are checked as files only")
def test_kubectl_kustomize_renders_every_object_into_the_namespace():
    proc = subprocess.run(["kubectl", "kustomize", str(BASE)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    rendered = [d for d in yaml.safe_load_all(proc.stdout) if d]
    assert sorted((d["kind"], d["metadata"]["name"]) for d in rendered) == sorted((o["kind"], o["metadata"]["name"]) for o in OBJECTS)
    for d in rendered:
        if d["kind"] != "Namespace":
            assert d["metadata"]["namespace"] == "fleetscope", d["metadata"]["name"]
        assert d["metadata"]["labels"]["app.kubernetes.io/part-of"] == "fleetscope"
        for c in (d.get("spec", {}).get("template", {}).get("spec", {}).get("containers", [])):
            assert c["image"] == "fleetscope:latest"

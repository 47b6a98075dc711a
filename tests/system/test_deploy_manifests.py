"""The container image and the Kubernetes manifests (deploy/Dockerfile, deploy/k8s), checked by the tools an
operator's CI would run, offline: hadolint and checkov on the Dockerfile; `kubectl kustomize deploy/k8s` fed
to kubernetes-validate --strict and checkov; yamllint on deploy/. The image cannot be built here (no
container engine), so every path and command the Dockerfile names is checked against the tree instead.

The linters live in their own venv (scripts/install-deploy-tools.sh, run by ./test through
scripts/test-deps.sh; checkov's pins would fight prewarm's). A test skips, saying so, only when that install
failed. kubernetes-validate bundles Kubernetes' own schemas, not the Prometheus operator's: it passes the
ServiceMonitor and PrometheusRule with a "Couldn't find schema" warning, so the test allows exactly those two
warnings and checks both resources itself (the rules are alerts.yml, which promtool checks in test_metrics).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from prewarm.programs.cli import build_parser

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
TOOLS = Path(os.environ.get("PREWARM_DEPLOY_TOOLS") or Path.home() / ".cache" / "prewarm" / "deploy-tools") / "bin"
CRDS = {"PrometheusRule", "ServiceMonitor"}  # kinds kubernetes-validate has no schema for
WORKLOADS = {"Deployment", "DaemonSet", "StatefulSet"}


def tool(name: str) -> str:
    path = TOOLS / name
    if not path.exists():
        pytest.skip(f"{name} is not installed in {TOOLS.parent}: scripts/install-deploy-tools.sh failed "
                    "(see /tmp/prewarm-deploy-tools.log) or was not run")
    return str(path)


def run(cmd: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=str(REPO), **kw)


@pytest.fixture(scope="module")
def rendered() -> str:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed (it renders deploy/k8s: kubectl kustomize)")
    out = run([kubectl, "kustomize", "deploy/k8s"])
    assert out.returncode == 0, out.stderr
    return out.stdout


@pytest.fixture(scope="module")
def docs(rendered: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(rendered) if d]


def one(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind}/{name}: {len(found)} found"
    return found[0]


def containers(docs: list[dict[str, Any]], image_prefix: str = "") -> list[tuple[str, dict[str, Any]]]:
    out = []
    for d in docs:
        if d["kind"] in WORKLOADS:
            spec = d["spec"]["template"]["spec"]
            for c in spec.get("initContainers", []) + spec["containers"]:
                if c["image"].startswith(image_prefix):
                    out.append((d["metadata"]["name"], c))
    return out


def prewarm_containers(docs: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    return [(n, c) for n, c in containers(docs) if "/prewarm:" in c["image"]]


def parses(argv: list[str]) -> bool:
    """Whether `prewarm ARGV` is a command this tree has (argparse exits on an unknown one)."""
    try:
        build_parser().parse_args(argv)
    except SystemExit:
        return False
    return True


# --- the image --------------------------------------------------------------------------------------------
def test_hadolint_passes_the_dockerfile() -> None:
    out = run([tool("hadolint"), "deploy/Dockerfile"])
    assert out.returncode == 0, out.stdout + out.stderr


def test_checkov_passes_the_dockerfile() -> None:
    _assert_clean(_checkov(["-f", "deploy/Dockerfile", "--framework", "dockerfile"]))


def test_every_path_and_command_the_dockerfile_names_exists() -> None:
    text = (DEPLOY / "Dockerfile").read_text()
    lines = re.sub(r"\\\n", " ", text).splitlines()
    copies = [shlex.split(line)[1:-1] for line in lines if line.startswith("COPY ")]
    sources = [s for args in copies for s in args if not s.startswith("--")]
    assert sources, "no COPY found"
    for src in sources:
        assert (REPO / src).exists(), f"the Dockerfile copies {src}, which is not in the tree"
    # .dockerignore lets through exactly what is copied (anything else copied would be missing in the build)
    allowed = {line[1:].rstrip("/") for line in (REPO / ".dockerignore").read_text().splitlines()
               if line.startswith("!")}
    assert {s.rstrip("/").removeprefix("./") for s in sources} == allowed
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    # the packages pyproject installs are all copied (a missing one would leave a `prewarm` command out)
    packages = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    assert {p.rstrip("*") for p in packages["include"]} <= {s.rstrip("/") for s in sources}
    assert f"/wheels/{project['name']}-*.whl" in text  # the wheel pip builds for this project
    entry = json.loads(next(line for line in lines if line.startswith("ENTRYPOINT "))[len("ENTRYPOINT "):])
    cmd = json.loads(next(line for line in lines if line.startswith("CMD "))[len("CMD "):])
    assert entry == ["prewarm"] and "prewarm" in project["scripts"]
    assert parses(cmd), f"CMD {cmd}: not a prewarm command"
    assert 'torch==' in (REPO / "pyproject.toml").read_text()  # the pin the build stage resolves
    assert not re.search(r"(?i)(token|password|secret)\s*=", text), "a secret in the Dockerfile"


# --- the manifests ----------------------------------------------------------------------------------------
def test_kubernetes_validate_strict(rendered: str) -> None:
    out = run([tool("kubernetes-validate"), "--strict", "--quiet", "-"], input=rendered)
    assert out.returncode == 0, out.stdout + out.stderr
    warnings = [line for line in (out.stdout + out.stderr).splitlines() if line.strip()]
    unknown = {m.group(1) for w in warnings if (m := re.search(r"Couldn't find schema for kind (\w+)", w))}
    assert unknown == CRDS, warnings  # nothing else was left unchecked
    assert len(warnings) == len(CRDS), warnings


def test_the_custom_resources_hold_what_they_should(docs: list[dict[str, Any]]) -> None:
    rule = one(docs, "PrometheusRule", "prewarm")
    assert rule["spec"] == yaml.safe_load((DEPLOY / "prometheus" / "alerts.yml").read_text())
    fresh = run([sys.executable, "scripts/render-prometheusrule.py", "--check"])
    assert fresh.returncode == 0, fresh.stderr
    monitor = one(docs, "ServiceMonitor", "prewarm")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    want = monitor["spec"]["selector"]["matchLabels"]
    ports = {e["port"] for e in monitor["spec"]["endpoints"]}
    for name, port in (("prewarm-web", "http"), ("prewarm-scheduler-metrics", "metrics")):
        svc = one(docs, "Service", name)
        assert want.items() <= svc["metadata"]["labels"].items(), f"the ServiceMonitor does not select {name}"
        assert port in ports and port in {p["name"] for p in svc["spec"]["ports"]}
    dashboard = one(docs, "ConfigMap", "prewarm-grafana-dashboard")
    assert dashboard["data"]["prewarm.json"] == (DEPLOY / "grafana" / "dashboard.json").read_text()
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"


def test_yamllint_passes_deploy() -> None:
    out = run([tool("yamllint"), "-s", "-c", "deploy/.yamllint.yaml", "deploy"])
    assert out.returncode == 0, out.stdout + out.stderr


def test_checkov_passes_the_rendered_manifests(rendered: str, tmp_path: Path) -> None:
    path = tmp_path / "prewarm.yaml"
    path.write_text(rendered)
    _assert_clean(_checkov(["-f", str(path), "--framework", "kubernetes"]))


def _checkov(args: list[str]) -> dict[str, Any]:
    out = run([tool("checkov"), "--skip-download", "-o", "json", *args])
    assert out.stdout.strip(), out.stderr
    report = json.loads(out.stdout)
    return report[0] if isinstance(report, list) else report


def _assert_clean(report: dict[str, Any]) -> None:
    results = report["results"]
    failed = [f"{c['check_id']} {c['resource']}: {c['check_name']}" for c in results["failed_checks"]]
    assert not failed, "\n".join(failed)
    for c in results["skipped_checks"]:  # every waiver says why, in the file
        assert len((c.get("check_result") or {}).get("suppress_comment") or "") > 20, c["check_id"]
    assert report["summary"]["passed"] > 0 and report["summary"]["parsing_errors"] == 0


def test_no_secret_value_is_committed(docs: list[dict[str, Any]]) -> None:
    assert not [d for d in docs if d["kind"] == "Secret"]  # the operator makes it (docs/deploy.md)
    for workload, c in containers(docs):
        for e in c.get("env", []):
            if re.search(r"TOKEN|PASSWORD|SECRET|AUTH", e["name"]):
                assert "secretKeyRef" in e.get("valueFrom", {}), f"{workload}/{c['name']}: {e['name']}"


def test_the_redis_url_is_one_sentinel_url_everywhere(docs: list[dict[str, Any]]) -> None:
    urls = {n: next(e["value"] for e in c["env"] if e["name"] == "PREWARM_REDIS_URL")
            for n, c in prewarm_containers(docs)}
    assert set(urls) == {"prewarm-web", "prewarm-scheduler", "prewarm-worker"}
    assert len(set(urls.values())) == 1, urls
    url = next(iter(urls.values()))
    assert re.fullmatch(r"sentinel://:\$\(PREWARM_REDIS_PASSWORD\)@([\w.-]+:26379,){2}[\w.-]+:26379/prewarm/0", url)
    try:
        from prewarm import sentinel  # the parser (issue 27, item 1), where this tree has it
    except ImportError:
        return
    parsed = sentinel.parse(url.replace("$(PREWARM_REDIS_PASSWORD)", "pw"))
    assert parsed.master == "prewarm" and len(parsed.hosts) == 3


def test_every_prewarm_command_the_manifests_run_exists(docs: list[dict[str, Any]]) -> None:
    seen = []
    for workload, c in prewarm_containers(docs):
        assert parses(c["args"]), f"{workload}: prewarm {c['args']}"
        seen.append(c["args"][0])
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            cmd = c.get(probe, {}).get("exec", {}).get("command")
            if cmd:
                assert cmd[0] == "prewarm" and parses(cmd[1:]), f"{workload} {probe}: {cmd}"
    assert sorted(seen) == ["scheduler", "web", "worker"]


def test_the_worker_prestop_starts_a_drain(docs: list[dict[str, Any]]) -> None:
    c = one(docs, "DaemonSet", "prewarm-worker")["spec"]["template"]["spec"]["containers"][0]
    cmd = c["lifecycle"]["preStop"]["exec"]["command"]
    assert cmd[:2] == ["/bin/sh", "-c"] and shlex.split(cmd[2]) == ["exec", "prewarm", "drain", "$NODE_NAME"]
    if not parses(["drain", "node-a"]):
        pytest.skip("`prewarm drain` is not in this tree yet (issue 27, item 5)")


def test_workloads_keep_the_rules(docs: list[dict[str, Any]]) -> None:
    assert one(docs, "Deployment", "prewarm-web")["spec"]["replicas"] == 2
    assert one(docs, "Deployment", "prewarm-scheduler")["spec"]["replicas"] == 2
    one(docs, "PodDisruptionBudget", "prewarm-web")
    web = one(docs, "Deployment", "prewarm-web")["spec"]["template"]["spec"]["containers"][0]
    assert web["readinessProbe"]["httpGet"]["path"] == "/healthz"
    ds = one(docs, "DaemonSet", "prewarm-worker")["spec"]["template"]["spec"]
    assert ds["nodeSelector"] and {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in \
        ds["tolerations"]
    assert ds["terminationGracePeriodSeconds"] >= 300  # a drain loads replicas elsewhere first
    worker = ds["containers"][0]
    assert worker["resources"]["limits"]["nvidia.com/gpu"] == worker["resources"]["requests"]["nvidia.com/gpu"]
    from_node = {e["name"] for e in worker["env"]
                 if e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == "spec.nodeName"}
    assert from_node == {"NODE_NAME", "PREWARM_NODE"}
    startup = worker["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 600  # an engine's cold start
    for d in docs:
        if d["kind"] in WORKLOADS:
            pod = d["spec"]["template"]["spec"]
            assert pod["securityContext"]["runAsNonRoot"] is True, d["metadata"]["name"]
            assert pod["automountServiceAccountToken"] is False
    for workload, c in containers(docs):
        sc = c["securityContext"]
        assert sc["readOnlyRootFilesystem"] and sc["capabilities"]["drop"] == ["ALL"], f"{workload}/{c['name']}"
        assert sc["allowPrivilegeEscalation"] is False
        assert c["resources"]["requests"] and c["resources"]["limits"], f"{workload}/{c['name']}"


def test_the_example_catalog_reads(docs: list[dict[str, Any]]) -> None:
    from prewarm.catalog import load_catalog

    cat = load_catalog(DEPLOY / "k8s" / "catalog.toml", check_files=False)  # the weights are on the volume
    assert cat.models and not cat.problems
    data = one(docs, "ConfigMap", next(d["metadata"]["name"] for d in docs if d["kind"] == "ConfigMap"
                                       and d["metadata"]["name"].startswith("prewarm-catalog-")))["data"]
    assert data["catalog.toml"] == (DEPLOY / "k8s" / "catalog.toml").read_text()
    env = one(docs, "ConfigMap", next(d["metadata"]["name"] for d in docs if d["kind"] == "ConfigMap"
                                      and d["metadata"]["name"].startswith("prewarm-config-")))["data"]
    assert env["PREWARM_CATALOG"] == "/etc/prewarm/catalog/catalog.toml"

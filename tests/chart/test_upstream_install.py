"""Switching by the image alone: under upstream's own chart (v1.14.1, kept under
tests/fixtures/upstream), the karpenter-rs binary starts with no arguments, in the
container environment that chart renders, as the ServiceAccount it creates (so with
upstream's RBAC and nothing more), against the local control plane and the AWS
emulator, and becomes ready.

The chart is installed with `replicas=0` (no image is pulled here), its Deployment's
environment is rendered with the same values and its `valueFrom` fields resolved as the
kubelet would, and the binary runs out of cluster with a token of the chart's
ServiceAccount. Two values differ from the pod's: the metrics and health ports are free
ports of this machine (the chart's 8080 and 8081 may be taken), and the AWS credentials
and endpoint are the emulator's (in EKS they come from IRSA or Pod Identity).

    eval "$(hack/cluster-up.sh)"
    "$(hack/moto-up.sh --venv)"/bin/python -m pytest -q tests/chart/test_upstream_install.py
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml

from chart_helpers import NAMESPACE, REPO_ROOT, helm, run, tool

UPSTREAM_CHART = REPO_ROOT / "tests" / "fixtures" / "upstream" / "chart-v1.14.1"
BINARY = REPO_ROOT / "target" / "debug" / "karpenter"
LOGS = REPO_ROOT / "target" / "e2e-logs"
READY_WITHIN_S = 120


def cluster_name() -> str:
    return os.environ.get("CLUSTER_NAME") or "karpenter-demo"


def values(release: str) -> list[str]:
    # The seed's resources, so that CPU_REQUESTS and MEMORY_LIMIT resolve to set figures.
    return [
        "--set", f"settings.clusterName={cluster_name()}",
        "--set", "replicas=0",
        "--set", "controller.resources.requests.cpu=1",
        "--set", "controller.resources.requests.memory=1Gi",
        "--set", "controller.resources.limits.memory=1Gi",
        "--set", f"fullnameOverride={release}",
    ]


def quantity(value: str) -> float:
    """A Kubernetes quantity as a number (the suffixes resource figures use)."""
    units = {"m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}
    match = re.fullmatch(r"([0-9.]+)([a-zA-Z]*)", str(value))
    assert match, f"quantity {value!r}"
    number, unit = match.groups()
    return float(number) * units.get(unit, 1)


def resolve(env: list[dict], container: dict, namespace: str) -> dict[str, str]:
    """The container's environment as the kubelet gives it (the fields the chart uses)."""
    out: dict[str, str] = {}
    for e in env:
        if "value" in e:
            out[e["name"]] = str(e["value"])
            continue
        source = e.get("valueFrom", {})
        if "fieldRef" in source:
            path = source["fieldRef"]["fieldPath"]
            assert path == "metadata.namespace", f"{e['name']}: field {path} not resolved here"
            out[e["name"]] = namespace
        elif "resourceFieldRef" in source:
            ref = source["resourceFieldRef"]
            kind, resource = ref["resource"].split(".")
            figure = quantity(container["resources"][kind][resource])
            divisor = quantity(ref.get("divisor", "1"))
            out[e["name"]] = str(int(-(-figure // (divisor or 1))))
        else:
            pytest.fail(f"{e['name']}: no way to resolve {source}")
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def service_account_kubeconfig(name: str, path: Path) -> Path:
    token = run(tool("kubectl"), "create", "token", name, "-n", NAMESPACE, "--duration", "1h").stdout.strip()
    current = json.loads(run(tool("kubectl"), "config", "view", "--raw", "--minify", "-o", "json").stdout)
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "local", "cluster": current["clusters"][0]["cluster"]}],
        "users": [{"name": name, "user": {"token": token}}],
        "contexts": [{"name": "sa", "context": {"cluster": "local", "user": name}}],
        "current-context": "sa",
    }
    path.write_text(json.dumps(config))
    return path


def get(port: int, path: str) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as answer:
            return answer.status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return 0


@pytest.fixture
def upstream_release():
    if not os.environ.get("KUBECONFIG") or not os.environ.get("AWS_ENDPOINT_URL"):
        pytest.fail("needs the local control plane and the AWS emulator: run through `make test` "
                    'or after `eval "$(hack/cluster-up.sh)"`', pytrace=False)
    if not BINARY.is_file():
        pytest.fail(f"{BINARY} is not built: `cargo build` (make test builds it first)", pytrace=False)
    release = f"upstream-{os.getpid()}"
    helm("install", release, str(UPSTREAM_CHART), "--namespace", NAMESPACE, "--skip-crds", *values(release))
    try:
        yield release
    finally:
        helm("uninstall", release, "--namespace", NAMESPACE, check=False)


def test_the_binary_starts_under_upstreams_chart(upstream_release, tmp_path) -> None:
    release = upstream_release
    rendered = helm("template", release, str(UPSTREAM_CHART), "--namespace", NAMESPACE, *values(release)).stdout
    docs = [d for d in yaml.safe_load_all(rendered) if d]
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert not container.get("args") and not container.get("command"), "upstream's chart passes no arguments"
    env = resolve(container["env"], container, NAMESPACE)
    assert "CapacityBuffer=false" in env["FEATURE_GATES"], env
    metrics_port, health_port = free_port(), free_port()
    env.update({"METRICS_PORT": str(metrics_port), "HEALTH_PROBE_PORT": str(health_port)})
    for name in ("AWS_ENDPOINT_URL", "AWS_REGION", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        env[name] = os.environ.get(name, "testing")
    env["KUBECONFIG"] = str(service_account_kubeconfig(pod["serviceAccountName"], tmp_path / "kubeconfig"))
    env["PATH"] = os.environ.get("PATH", "")
    LOGS.mkdir(parents=True, exist_ok=True)
    log_path = LOGS / f"controller-upstream-chart-{os.getpid()}.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen([str(BINARY)], env=env, stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path)
    try:
        deadline = time.monotonic() + READY_WITHIN_S
        while time.monotonic() < deadline and proc.poll() is None and get(health_port, "/readyz") != 200:
            time.sleep(1)
        text = log_path.read_text()
        assert proc.poll() is None, f"the binary exited ({proc.returncode}):\n{text[-4000:]}"
        assert get(health_port, "/readyz") == 200, f"not ready within {READY_WITHIN_S} s:\n{text[-4000:]}"
        # It leads (the chart's Lease) and its controllers run.
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and '"starting controller"' not in log_path.read_text():
            time.sleep(1)
        text = log_path.read_text()
        assert "starting controller" in text, text[-4000:]
        # Its controllers make their first calls.
        time.sleep(10)
        text = log_path.read_text()
        assert get(metrics_port, "/metrics") == 200
        # Every setting the chart sets is read or named as ignored; none is refused.
        assert "unrecognized" not in text, text[-4000:]
        # The one grant upstream's chart lacks (LimitRanges) is reported once, and nothing else
        # is refused.
        refusals = [line for line in text.splitlines() if "code: 403" in line or "orbidden" in line]
        assert all("limitranges" in line for line in refusals), "\n".join(refusals)
        assert sum("may not list the kind" in line for line in refusals) == 1, "\n".join(refusals)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()

"""Shared helpers of the chart tests: the real helm binary, rendering, lookups."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

REPO_ROOT = Path(__file__).resolve().parents[2]
CHART = REPO_ROOT / "charts" / "karpenter"
CRD_CHART = REPO_ROOT / "charts" / "karpenter-crd"
CRDS = REPO_ROOT / "crds"
USER_VALUES = Path(__file__).resolve().parent / "values-user.yaml"
RELEASE = "karpenter"
NAMESPACE = "kube-system"


def _resource(resource: str, divisor: str) -> dict:
    return {"resourceFieldRef": {"containerName": "controller", "divisor": divisor, "resource": resource}}


# The container environment upstream's chart (v1.14.1) renders from its default values with
# `settings.clusterName=demo`, in its order; false and empty settings are left out.
UPSTREAM_DEFAULT_ENV: dict[str, object] = {
    "KUBERNETES_MIN_VERSION": "1.19.0-0",
    "KARPENTER_SERVICE": RELEASE,
    "LOG_LEVEL": "info",
    "LOG_OUTPUT_PATHS": "stdout",
    "LOG_ERROR_OUTPUT_PATHS": "stderr",
    "METRICS_PORT": "8080",
    "HEALTH_PROBE_PORT": "8081",
    "SYSTEM_NAMESPACE": {"fieldRef": {"fieldPath": "metadata.namespace"}},
    "CPU_REQUESTS": _resource("requests.cpu", "1m"),
    "MEMORY_LIMIT": _resource("limits.memory", "0"),
    "FEATURE_GATES": "ReservedCapacity=true,SpotToSpotConsolidation=false,NodeRepair=false,"
    "NodeOverlay=false,StaticCapacity=false,CapacityBuffer=false",
    "BATCH_MAX_DURATION": "10s",
    "BATCH_IDLE_DURATION": "1s",
    "PREFERENCE_POLICY": "Respect",
    "MIN_VALUES_POLICY": "Strict",
    "CLUSTER_NAME": "demo",
    "VM_MEMORY_OVERHEAD_PERCENT": "0.075",
    "RESERVED_ENIS": "0",
    "IGNORE_DRA_REQUESTS": "true",
    "AMI_REFRESH_INTERVAL": "1m",
    "SUBNET_REFRESH_INTERVAL": "1m",
}


def tool(name: str) -> str:
    """Path of a pinned tool on PATH. Missing tools fail the test (never skip):
    `make test` puts the pinned binaries first on PATH."""
    path = shutil.which(name)
    if path is None:
        pytest.fail(
            f"{name} is not on PATH: run the chart tests through `make test` "
            f"(or `eval \"$(hack/cluster-up.sh)\"` first), which builds the pinned {name} "
            "and puts it on PATH",
            pytrace=False,
        )
    return path


def run(*args: str, check: bool = True, input: str | None = None) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(list(args), capture_output=True, text=True, input=input, cwd=REPO_ROOT)
    if check and proc.returncode != 0:
        pytest.fail(
            f"`{' '.join(args)}` exited {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}",
            pytrace=False,
        )
    return proc


def helm(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return run(tool("helm"), *args, check=check)


def template_args(*values_files: Path, sets: tuple[str, ...] = (), chart: Path = CHART) -> list[str]:
    args = ["template", RELEASE, str(chart), "--namespace", NAMESPACE]
    for f in values_files:
        args += ["--values", str(f)]
    for s in sets:
        args += ["--set", s]
    return args


def render(*values_files: Path, sets: tuple[str, ...] = (), chart: Path = CHART) -> list[dict]:
    """`helm template` of the chart, parsed into a list of objects."""
    out = helm(*template_args(*values_files, sets=sets, chart=chart)).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def find(docs: list[dict], kind: str, name: str | None = None) -> dict:
    matches = [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    assert len(matches) == 1, f"expected one {kind} {name or ''}, found {len(matches)}"
    return matches[0]


def controller(deployment: dict) -> dict:
    containers = deployment["spec"]["template"]["spec"]["containers"]
    named = [c for c in containers if c["name"] == "controller"]
    assert len(named) == 1, f"expected one container named controller, found {[c['name'] for c in containers]}"
    return named[0]


def env_of(container: dict) -> dict[str, object]:
    """The container's env as name -> value (or the valueFrom mapping)."""
    env: dict[str, object] = {}
    for e in container.get("env", []):
        assert e["name"] not in env, f"env var {e['name']} is set twice"
        env[e["name"]] = e["value"] if "value" in e else e.get("valueFrom")
    return env

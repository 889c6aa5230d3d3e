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

"""The charts' manifests are accepted by the real API server of the local
control plane ($KUBECONFIG, started by `make test` / hack/cluster-up.sh).

- `helm install --dry-run=server` into kube-system: Helm's own install path
  against the live cluster (capabilities, kubeVersion, schema checks);
- `kubectl apply --dry-run=server` of the same manifests: the API server runs
  its full validation and admission on every object without storing it
  (Helm's dry run does not send the objects to the server);
- a real `helm install` and `helm uninstall` in a throwaway namespace, with
  the CRDs skipped so that the shared cluster is left as it was found.
"""

from __future__ import annotations

import os
import uuid

import pytest
import yaml

from chart_helpers import CHART, CRD_CHART, NAMESPACE, RELEASE, USER_VALUES, helm, run, template_args, tool

VALUE_SETS = {
    "defaults": ["--set", "settings.clusterName=demo"],
    "user-values": ["--values", str(USER_VALUES)],
}


@pytest.fixture(scope="module")
def kubeconfig() -> str:
    path = os.environ.get("KUBECONFIG")
    if not path:
        pytest.fail(
            "KUBECONFIG is not set: these tests need the local control plane; run them through "
            '`make test` or after `eval "$(hack/cluster-up.sh)"`',
            pytrace=False,
        )
    if not os.path.isfile(path):
        pytest.fail(f"KUBECONFIG points to a missing file ({path}): start the control plane with hack/cluster-up.sh",
                    pytrace=False)
    proc = run(tool("kubectl"), "get", "--raw", "/readyz", check=False)
    if proc.returncode != 0 or proc.stdout.strip() != "ok":
        pytest.fail(f"the API server of $KUBECONFIG is not ready: {proc.stderr or proc.stdout}", pytrace=False)
    return path


def kubectl(*args: str, input: str | None = None, check: bool = True):
    return run(tool("kubectl"), *args, input=input, check=check)


@pytest.mark.parametrize("values", list(VALUE_SETS), ids=list(VALUE_SETS))
def test_helm_install_dry_run_server_in_kube_system(kubeconfig, values) -> None:
    proc = helm("install", RELEASE, str(CHART), "--namespace", NAMESPACE, "--dry-run=server", *VALUE_SETS[values])
    assert "STATUS: pending-install" in proc.stdout, proc.stdout
    kinds = {d["kind"] for d in yaml.safe_load_all(proc.stdout.split("MANIFEST:", 1)[1].split("NOTES:", 1)[0]) if d}
    assert {"Deployment", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "Service",
            "PodDisruptionBudget"} <= kinds


@pytest.mark.parametrize("values", list(VALUE_SETS), ids=list(VALUE_SETS))
def test_api_server_accepts_every_manifest(kubeconfig, values) -> None:
    args = template_args()
    manifests = helm(*args, "--include-crds", *VALUE_SETS[values]).stdout
    out = kubectl("apply", "--dry-run=server", "--namespace", NAMESPACE, "-f", "-", input=manifests).stdout
    applied = [line for line in out.splitlines() if line.strip()]
    expected = [d for d in yaml.safe_load_all(manifests) if d]
    assert len(applied) == len(expected), out
    assert all("(server dry run)" in line for line in applied), out


def test_api_server_rejects_an_invalid_manifest(kubeconfig) -> None:
    """The server-side dry run really validates: a bad toleration is refused."""
    manifests = helm(*template_args(), "--set", "settings.clusterName=demo",
                     "--set-json", 'tolerations=[{"key":"x","operator":"Sometimes"}]').stdout
    proc = kubectl("apply", "--dry-run=server", "--namespace", NAMESPACE, "-f", "-", input=manifests, check=False)
    assert proc.returncode != 0
    assert "tolerations[0].operator" in proc.stderr, proc.stderr


def test_crd_chart_dry_run_server(kubeconfig) -> None:
    # The CRDs may already be in the cluster, created without Helm (other
    # tests, or an install of the main chart): --take-ownership is how a user
    # moves them under this chart, and the dry run must accept that.
    proc = helm("install", "karpenter-crd", str(CRD_CHART), "--namespace", NAMESPACE, "--dry-run=server",
                "--take-ownership")
    assert "STATUS: pending-install" in proc.stdout, proc.stdout
    manifests = helm("template", "karpenter-crd", str(CRD_CHART), "--namespace", NAMESPACE).stdout
    out = kubectl("apply", "--dry-run=server", "-f", "-", input=manifests).stdout
    assert out.count("customresourcedefinition.apiextensions.k8s.io/") == 5, out


def test_real_install_and_uninstall(kubeconfig) -> None:
    suffix = uuid.uuid4().hex[:8]
    namespace = f"chart-test-{suffix}"
    release = f"karpenter-{suffix}"
    try:
        helm("install", release, str(CHART), "--namespace", namespace, "--create-namespace", "--skip-crds",
             "--values", str(USER_VALUES), "--set", "replicas=0")
        status = helm("status", release, "--namespace", namespace, "-o", "json").stdout
        assert '"status":"deployed"' in status.replace(" ", ""), status
        deployment = yaml.safe_load(kubectl("get", "deployment", release, "--namespace", namespace, "-o", "yaml").stdout)
        container = deployment["spec"]["template"]["spec"]["containers"][0]
        assert container["name"] == "controller"
        assert {"name": "CLUSTER_NAME", "value": "demo"} in container["env"]
        sa = yaml.safe_load(kubectl("get", "serviceaccount", release, "--namespace", namespace, "-o", "yaml").stdout)
        assert sa["metadata"]["annotations"]["eks.amazonaws.com/role-arn"].endswith("role/KarpenterControllerRole-demo")
        kubectl("get", "clusterrole", release)
        helm("uninstall", release, "--namespace", namespace, "--wait")
        leftover = kubectl("get", "clusterrole,clusterrolebinding", "-l", f"app.kubernetes.io/instance={release}",
                           "-o", "name").stdout
        assert leftover.strip() == "", f"uninstall left cluster-scoped objects: {leftover}"
    finally:
        helm("uninstall", release, "--namespace", namespace, check=False)
        kubectl("delete", "namespace", namespace, "--ignore-not-found", "--wait=false", check=False)

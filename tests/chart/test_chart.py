"""Renders the Helm charts with the real helm binary and checks the result.

    "$(hack/moto-up.sh --venv)/bin/python" -m pytest tests/chart

helm must be on PATH (`make test` arranges that).
"""

from __future__ import annotations

import json
import subprocess
import tomllib

import pytest
import yaml

from chart_helpers import (
    CHART,
    CRD_CHART,
    CRDS,
    UPSTREAM_DEFAULT_ENV,
    NAMESPACE,
    RELEASE,
    REPO_ROOT,
    USER_VALUES,
    controller,
    env_of,
    find,
    helm,
    render,
    template_args,
)

# The environment variables the chart may set on the controller: the names
# upstream's chart sets (v1.14.1, see test_upstream_chart.py), plus
# karpenter-rs's opt-in REBALANCE_REPLACEMENT (set only when enabled, so that
# default values render upstream's list).
KNOWN_ENV = {
    "REBALANCE_REPLACEMENT",
    "KUBERNETES_MIN_VERSION",
    "KARPENTER_SERVICE",
    "LOG_LEVEL",
    "LOG_OUTPUT_PATHS",
    "LOG_ERROR_OUTPUT_PATHS",
    "METRICS_PORT",
    "HEALTH_PROBE_PORT",
    "SYSTEM_NAMESPACE",
    "CPU_REQUESTS",
    "MEMORY_LIMIT",
    "FEATURE_GATES",
    "BATCH_MAX_DURATION",
    "BATCH_IDLE_DURATION",
    "PREFERENCE_POLICY",
    "MIN_VALUES_POLICY",
    "CLUSTER_CA_BUNDLE",
    "CLUSTER_NAME",
    "CLUSTER_ENDPOINT",
    "ISOLATED_VPC",
    "EKS_CONTROL_PLANE",
    "VM_MEMORY_OVERHEAD_PERCENT",
    "INTERRUPTION_QUEUE",
    "ENABLE_ZONAL_SHIFT",
    "RESERVED_ENIS",
    "IGNORE_DRA_REQUESTS",
    "DISABLE_CLUSTER_STATE_OBSERVABILITY",
    "DISABLE_DRY_RUN",
    "AMI_REFRESH_INTERVAL",
    "SUBNET_REFRESH_INTERVAL",
}
SELECTOR = {"app.kubernetes.io/name": "karpenter", "app.kubernetes.io/instance": RELEASE}
MINIMAL = ("settings.clusterName=demo",)
CLUSTER_NAME_MESSAGE = "settings.clusterName is required"


@pytest.fixture(scope="module")
def defaults() -> list[dict]:
    """The chart rendered with nothing but the required cluster name."""
    return render(sets=MINIMAL)


@pytest.fixture(scope="module")
def user() -> list[dict]:
    """The chart rendered with the user-style values file."""
    return render(USER_VALUES)


# --- chart metadata and CRDs ---------------------------------------------------------------


@pytest.mark.parametrize(
    "chart,extra",
    [(CHART, ["--set", "settings.clusterName=demo"]), (CRD_CHART, [])],
    ids=["karpenter", "karpenter-crd"],
)
def test_helm_lint_passes(chart, extra) -> None:
    out = helm("lint", "--strict", str(chart), *extra).stdout
    assert "0 chart(s) failed" in out, out


def test_app_version_matches_cargo() -> None:
    cargo = tomllib.loads((REPO_ROOT / "Cargo.toml").read_text())["package"]["version"]
    for chart in (CHART, CRD_CHART):
        meta = yaml.safe_load((chart / "Chart.yaml").read_text())
        assert str(meta["appVersion"]) == cargo, f"{chart.name} appVersion != Cargo.toml version {cargo}"
    assert yaml.safe_load((CHART / "Chart.yaml").read_text())["name"] == "karpenter"


@pytest.mark.parametrize(
    "dest", [CHART / "crds", CRD_CHART / "templates"], ids=["karpenter/crds", "karpenter-crd/templates"]
)
def test_chart_crds_are_byte_identical_to_crds_dir(dest) -> None:
    sources = sorted(p.name for p in CRDS.glob("*.yaml"))
    assert sources, "crds/ holds no CRDs"
    copies = sorted(p.name for p in dest.glob("*.yaml"))
    assert copies == sources, f"{dest.relative_to(REPO_ROOT)} differs from crds/; run hack/sync-chart-crds.sh"
    for name in sources:
        assert (dest / name).read_bytes() == (CRDS / name).read_bytes(), (
            f"{dest.relative_to(REPO_ROOT)}/{name} differs from crds/{name}; run hack/sync-chart-crds.sh"
        )


def test_crd_chart_renders_exactly_the_crds() -> None:
    docs = render(chart=CRD_CHART)
    expected = [yaml.safe_load((CRDS / p.name).read_text()) for p in sorted(CRDS.glob("*.yaml"))]
    key = lambda d: d["metadata"]["name"]  # noqa: E731
    assert sorted(docs, key=key) == sorted(expected, key=key)


def test_main_chart_installs_the_crds_with_include_crds() -> None:
    out = helm(*template_args(sets=MINIMAL), "--include-crds").stdout
    names = {d["metadata"]["name"] for d in yaml.safe_load_all(out) if d and d["kind"] == "CustomResourceDefinition"}
    assert names == {
        "nodepools.karpenter.sh",
        "nodeclaims.karpenter.sh",
        "ec2nodeclasses.karpenter.k8s.aws",
        "nodeoverlays.karpenter.sh",
        "capacitybuffers.autoscaling.x-k8s.io",
    }


# --- required values ---------------------------------------------------------------------------


@pytest.mark.parametrize("sets", [(), ("settings.clusterName=",)], ids=["unset", "empty"])
def test_missing_cluster_name_fails_with_a_clear_message(sets) -> None:
    proc = helm(*template_args(sets=sets), check=False)
    assert proc.returncode != 0, "rendering without settings.clusterName must fail"
    assert CLUSTER_NAME_MESSAGE in proc.stderr, proc.stderr


# --- the user-style values file ----------------------------------------------------------------


def test_user_values_render_into_the_deployment(user) -> None:
    wanted = yaml.safe_load(USER_VALUES.read_text())
    deployment = find(user, "Deployment", f"{RELEASE}")
    spec = deployment["spec"]
    pod = spec["template"]["spec"]
    container = controller(deployment)

    assert spec["replicas"] == 1
    assert container["resources"] == {
        "requests": {"cpu": "50m", "memory": "512Mi"},
        "limits": {"memory": "512Mi"},
    }
    assert container["resources"] == wanted["controller"]["resources"]

    # The node affinity is passed through exactly as written.
    assert pod["affinity"]["nodeAffinity"] == wanted["affinity"]["nodeAffinity"]
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert {"key": "eks.amazonaws.com/nodegroup", "operator": "In", "values": ["system"]} in terms[0][
        "matchExpressions"
    ]
    assert {"key": "karpenter.sh/nodepool", "operator": "DoesNotExist"} in terms[0]["matchExpressions"]
    # The anti-affinity term without a selector gets one for the release's own pods.
    assert pod["affinity"]["podAntiAffinity"] == {
        "requiredDuringSchedulingIgnoredDuringExecution": [
            {"topologyKey": "kubernetes.io/hostname", "labelSelector": {"matchLabels": SELECTOR}}
        ]
    }

    env = env_of(container)
    assert env["CLUSTER_NAME"] == "demo"
    assert env["INTERRUPTION_QUEUE"] == "demo"
    # The old `drift` gate is accepted and not passed on.
    assert "Drift" not in str(env["FEATURE_GATES"])

    sa = find(user, "ServiceAccount")
    assert pod["serviceAccountName"] == sa["metadata"]["name"]
    assert sa["metadata"]["annotations"] == {
        "eks.amazonaws.com/role-arn": "arn:aws:iam::111122223333:role/KarpenterControllerRole-demo"
    }


# --- upstream's defaults -----------------------------------------------------------------------


def test_defaults_match_upstream(defaults) -> None:
    deployment = find(defaults, "Deployment")
    spec = deployment["spec"]
    pod = spec["template"]["spec"]
    assert deployment["metadata"]["namespace"] == NAMESPACE
    assert spec["replicas"] == 2
    assert spec["revisionHistoryLimit"] == 10
    assert spec["strategy"] == {"rollingUpdate": {"maxUnavailable": 1}}
    assert spec["selector"] == {"matchLabels": SELECTOR}
    assert SELECTOR.items() <= spec["template"]["metadata"]["labels"].items()
    assert pod["priorityClassName"] == "system-cluster-critical"
    assert pod["securityContext"] == {"fsGroup": 65532}
    assert pod["nodeSelector"] == {"kubernetes.io/os": "linux"}
    assert pod["tolerations"] == [{"key": "CriticalAddonsOnly", "operator": "Exists"}]
    assert "terminationGracePeriodSeconds" not in pod
    assert pod["affinity"] == {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [{"key": "karpenter.sh/nodepool", "operator": "DoesNotExist"}]}]
            }
        },
        "podAntiAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {"topologyKey": "kubernetes.io/hostname", "labelSelector": {"matchLabels": SELECTOR}}
            ]
        },
    }
    assert pod["topologySpreadConstraints"] == [
        {
            "maxSkew": 1,
            "topologyKey": "topology.kubernetes.io/zone",
            "whenUnsatisfiable": "ScheduleAnyway",
            "labelSelector": {"matchLabels": SELECTOR},
        }
    ]

    pdb = find(defaults, "PodDisruptionBudget")
    assert pdb["metadata"]["name"] == "karpenter"
    assert pdb["spec"] == {"maxUnavailable": 1, "selector": {"matchLabels": SELECTOR}}


def test_default_env_vars_and_values(defaults) -> None:
    # Upstream's list and values (false and empty settings are left out, as
    # upstream's chart leaves them out).
    env = env_of(controller(find(defaults, "Deployment")))
    assert env == UPSTREAM_DEFAULT_ENV


def test_every_setting_maps_to_its_upstream_env_var() -> None:
    docs = render(
        sets=(
            "settings.clusterName=prod",
            "settings.clusterEndpoint=https://ABC.gr7.us-west-2.eks.amazonaws.com",
            "settings.clusterCABundle=LS0tLS1CRUdJTg==",
            "settings.interruptionQueue=prod-queue",
            "settings.rebalanceReplacement=true",
            "settings.burstableCPU=unlimited",
            "settings.fewerNodesMargin=0",
            "settings.defaultPodTopologySpread=false",
            "settings.learnExtendedResources=false",
            "settings.kubeSchedulerConfig=/etc/karpenter/scheduler.yaml",
            "settings.consolidationPreferencePolicy=Respect",
            "settings.batchMaxDuration=20s",
            "settings.batchIdleDuration=2s",
            "settings.vmMemoryOverheadPercent=0.1",
            "settings.reservedENIs=1",
            "settings.isolatedVPC=true",
            "settings.preferencePolicy=Ignore",
            "settings.minValuesPolicy=BestEffort",
            "settings.eksControlPlane=true",
            "settings.enableZonalShift=true",
            "settings.ignoreDRARequests=true",
            "settings.disableClusterStateObservability=true",
            "settings.disableDryRun=true",
            "settings.amiRefreshInterval=5m",
            "settings.subnetRefreshInterval=10m",
            "logOutputPaths={stdout,/tmp/karpenter.log}",
            "logErrorOutputPaths={stderr}",
            "settings.featureGates.spotToSpotConsolidation=true",
            "settings.featureGates.nodeRepair=true",
            "settings.featureGates.reservedCapacity=false",
            "settings.featureGates.nodeOverlay=true",
            "settings.featureGates.staticCapacity=true",
            "settings.featureGates.capacityBuffer=true",
            "logLevel=debug",
            "controller.metrics.port=9000",
            "controller.healthProbe.port=9001",
        )
    )
    deployment = find(docs, "Deployment")
    container = controller(deployment)
    env = env_of(container)
    assert env["CLUSTER_NAME"] == "prod"
    assert env["CLUSTER_ENDPOINT"] == "https://ABC.gr7.us-west-2.eks.amazonaws.com"
    assert env["CLUSTER_CA_BUNDLE"] == "LS0tLS1CRUdJTg=="
    assert env["INTERRUPTION_QUEUE"] == "prod-queue"
    assert env["REBALANCE_REPLACEMENT"] == "true"
    assert env["BURSTABLE_CPU"] == "unlimited"
    # Zero is a margin, not "unset".
    assert env["FEWER_NODES_MARGIN"] == "0"
    # False is a choice here (the controller's default is true), so it is set.
    assert env["DEFAULT_POD_TOPOLOGY_SPREAD"] == "false"
    assert env["LEARN_EXTENDED_RESOURCES"] == "false"
    assert env["KUBE_SCHEDULER_CONFIG"] == "/etc/karpenter/scheduler.yaml"
    assert env["CONSOLIDATION_PREFERENCE_POLICY"] == "Respect"
    assert env["BATCH_MAX_DURATION"] == "20s"
    assert env["BATCH_IDLE_DURATION"] == "2s"
    assert env["VM_MEMORY_OVERHEAD_PERCENT"] == "0.1"
    assert env["RESERVED_ENIS"] == "1"
    assert env["ISOLATED_VPC"] == "true"
    assert env["PREFERENCE_POLICY"] == "Ignore"
    assert env["MIN_VALUES_POLICY"] == "BestEffort"
    assert env["EKS_CONTROL_PLANE"] == "true"
    assert env["ENABLE_ZONAL_SHIFT"] == "true"
    assert env["IGNORE_DRA_REQUESTS"] == "true"
    assert env["DISABLE_CLUSTER_STATE_OBSERVABILITY"] == "true"
    assert env["DISABLE_DRY_RUN"] == "true"
    assert env["AMI_REFRESH_INTERVAL"] == "5m"
    assert env["SUBNET_REFRESH_INTERVAL"] == "10m"
    assert env["LOG_OUTPUT_PATHS"] == "stdout,/tmp/karpenter.log"
    assert env["LOG_ERROR_OUTPUT_PATHS"] == "stderr"
    assert env["FEATURE_GATES"] == (
        "ReservedCapacity=false,SpotToSpotConsolidation=true,NodeRepair=true,NodeOverlay=true,StaticCapacity=true,CapacityBuffer=true"
    )
    assert env["LOG_LEVEL"] == "debug"
    assert env["METRICS_PORT"] == "9000"
    assert env["HEALTH_PROBE_PORT"] == "9001"
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"http-metrics": 9000, "http": 9001}
    service = find(docs, "Service")
    assert service["spec"]["ports"] == [{"name": "http-metrics", "port": 9000, "targetPort": "http-metrics", "protocol": "TCP"}]


@pytest.mark.parametrize("source", ["defaults", "user"])
def test_chart_sets_only_upstream_env_var_names(source, request) -> None:
    docs = request.getfixturevalue(source)
    names = set(env_of(controller(find(docs, "Deployment"))))
    assert names <= KNOWN_ENV, f"unknown env vars: {sorted(names - KNOWN_ENV)}"


def test_user_env_is_appended() -> None:
    docs = render(sets=(*MINIMAL, "controller.env[0].name=AWS_REGION", "controller.env[0].value=eu-west-1"))
    env = env_of(controller(find(docs, "Deployment")))
    assert env["AWS_REGION"] == "eu-west-1"


def test_controller_container_shape(defaults) -> None:
    container = controller(find(defaults, "Deployment"))
    assert container["image"] == "karpenter-rs/controller:0.1.0"
    assert container["imagePullPolicy"] == "IfNotPresent"
    assert container["ports"] == [
        {"name": "http-metrics", "containerPort": 8080, "protocol": "TCP"},
        {"name": "http", "containerPort": 8081, "protocol": "TCP"},
    ]
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert container["securityContext"] == {
        "runAsNonRoot": True,
        "runAsUser": 65532,
        "runAsGroup": 65532,
        "readOnlyRootFilesystem": True,
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def test_image_digest_pins_the_image() -> None:
    digest = "sha256:" + "a" * 64
    docs = render(sets=(*MINIMAL, "controller.image.repository=example.com/k", "controller.image.tag=1.2.3",
                        f"controller.image.digest={digest}"))
    assert controller(find(docs, "Deployment"))["image"] == f"example.com/k:1.2.3@{digest}"


def test_metrics_service_and_service_monitor() -> None:
    docs = render(sets=(*MINIMAL, "serviceMonitor.enabled=true", "serviceMonitor.additionalLabels.release=prom",
                        "serviceMonitor.endpointConfig.interval=30s"))
    service = find(docs, "Service")
    assert service["spec"]["selector"] == SELECTOR
    assert service["spec"]["ports"][0]["name"] == "http-metrics"
    monitor = find(docs, "ServiceMonitor")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["metadata"]["labels"]["release"] == "prom"
    assert monitor["spec"]["selector"] == {"matchLabels": SELECTOR}
    assert monitor["spec"]["endpoints"] == [{"port": "http-metrics", "path": "/metrics", "interval": "30s"}]


def test_no_service_monitor_by_default(defaults) -> None:
    assert not [d for d in defaults if d["kind"] == "ServiceMonitor"]


def test_dashboards_render_as_sidecar_configmaps() -> None:
    docs = render(sets=(*MINIMAL, "dashboards.enabled=true", "dashboards.namespace=monitoring",
                        "dashboards.annotations.grafana_folder=Karpenter"))
    maps = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ConfigMap"}
    expected = {f"karpenter-dashboard-{n}" for n in ("capacity", "cost", "disruption", "performance")}
    assert set(maps) == expected
    files = {p.stem for p in (CHART / "dashboards").glob("*.json")}
    assert {n.removeprefix("karpenter-dashboard-") for n in maps} == files
    uids = set()
    for name, cm in maps.items():
        assert cm["metadata"]["namespace"] == "monitoring"
        assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
        assert cm["metadata"]["annotations"] == {"grafana_folder": "Karpenter"}
        (key, text), = cm["data"].items()
        dashboard = json.loads(text)
        assert key == f"karpenter-{name.removeprefix('karpenter-dashboard-')}.json"
        assert dashboard["title"].startswith("Karpenter / ")
        uids.add(dashboard["uid"])
        assert dashboard["panels"], name
        for panel in dashboard["panels"]:
            assert panel["targets"] and all(t["expr"] for t in panel["targets"]), panel["title"]
    assert len(uids) == len(maps), "dashboard uids are unique"


def test_no_dashboards_by_default(defaults) -> None:
    assert not [d for d in defaults if d["kind"] == "ConfigMap"]


def test_service_account_can_be_brought_by_the_user() -> None:
    docs = render(sets=(*MINIMAL, "serviceAccount.create=false", "serviceAccount.name=existing"))
    assert not [d for d in docs if d["kind"] == "ServiceAccount"]
    assert find(docs, "Deployment")["spec"]["template"]["spec"]["serviceAccountName"] == "existing"
    bindings = [d for d in docs if d["kind"] in ("ClusterRoleBinding", "RoleBinding")]
    assert len(bindings) == 3
    for binding in bindings:
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "existing", "namespace": NAMESPACE}]


def test_names_and_labels_follow_overrides() -> None:
    docs = render(sets=(*MINIMAL, "fullnameOverride=kr", "additionalLabels.team=platform",
                        "additionalAnnotations.owner=infra"))
    deployment = find(docs, "Deployment", "kr")
    assert deployment["metadata"]["labels"]["team"] == "platform"
    assert deployment["metadata"]["annotations"] == {"owner": "infra"}
    for doc in docs:
        assert doc["metadata"]["labels"]["team"] == "platform", doc["kind"]


# --- RBAC --------------------------------------------------------------------------------------


def rbac_rules(docs: list[dict]) -> list[tuple[str, dict]]:
    return [(d["kind"], rule) for d in docs if d["kind"] in ("ClusterRole", "Role") for rule in d["rules"]]


@pytest.mark.parametrize("source", ["defaults", "user"])
def test_rbac_has_no_wildcards_and_no_secrets(source, request) -> None:
    rules = rbac_rules(request.getfixturevalue(source))
    assert rules
    for kind, rule in rules:
        for field in ("apiGroups", "resources", "verbs", "resourceNames", "nonResourceURLs"):
            assert "*" not in rule.get(field, []), f"{kind} rule uses * in {field}: {rule}"
        assert not any(r.split("/")[0] == "secrets" for r in rule.get("resources", [])), f"{kind} touches secrets"


def test_rbac_grants_what_the_controller_needs(defaults) -> None:
    def grants(kind: str, name: str | None = None) -> dict[tuple[str, str], set[str]]:
        out: dict[tuple[str, str], set[str]] = {}
        for d in defaults:
            if d["kind"] != kind or (name is not None and d["metadata"]["name"] != name):
                continue
            for rule in d["rules"]:
                for group in rule["apiGroups"]:
                    for resource in rule["resources"]:
                        out.setdefault((group, resource), set()).update(rule["verbs"])
        return out

    cluster = grants("ClusterRole")
    need = {
        ("karpenter.sh", "nodepools"): {"get", "list", "watch"},
        ("karpenter.sh", "nodepools/status"): {"patch", "update"},
        ("karpenter.sh", "nodeoverlays"): {"get", "list", "watch"},
        ("karpenter.sh", "nodeoverlays/status"): {"patch", "update"},
        ("autoscaling.x-k8s.io", "capacitybuffers"): {"get", "list", "watch"},
        ("autoscaling.x-k8s.io", "capacitybuffers/status"): {"patch", "update"},
        ("", "podtemplates"): {"get", "list", "watch"},
        ("karpenter.sh", "nodeclaims"): {"get", "list", "watch", "create", "patch", "update", "delete"},
        ("karpenter.sh", "nodeclaims/status"): {"patch", "update"},
        ("karpenter.k8s.aws", "ec2nodeclasses"): {"get", "list", "watch", "patch"},
        ("karpenter.k8s.aws", "ec2nodeclasses/status"): {"patch", "update"},
        ("", "nodes"): {"get", "list", "watch", "create", "patch", "update", "delete"},
        ("", "pods"): {"get", "list", "watch"},
        ("", "pods/eviction"): {"create"},
        ("", "events"): {"create", "patch"},
        ("", "persistentvolumes"): {"get", "list", "watch"},
        ("", "persistentvolumeclaims"): {"get", "list", "watch"},
        ("", "namespaces"): {"get", "list", "watch"},
        ("", "replicationcontrollers"): {"get", "list", "watch"},
        ("", "limitranges"): {"list", "watch"},
        ("apps", "daemonsets"): {"list", "watch"},
        ("apps", "deployments"): {"list", "watch"},
        ("apps", "replicasets"): {"list", "watch"},
        ("apps", "statefulsets"): {"list", "watch"},
        ("policy", "poddisruptionbudgets"): {"list", "watch"},
        ("storage.k8s.io", "storageclasses"): {"list", "watch"},
        ("storage.k8s.io", "csinodes"): {"list", "watch"},
        ("storage.k8s.io", "volumeattachments"): {"list", "watch"},
    }
    for key, verbs in need.items():
        assert verbs <= cluster.get(key, set()), f"ClusterRole lacks {sorted(verbs - cluster.get(key, set()))} on {key}"
    # Nothing is granted that is not listed above (the list is the review point).
    assert set(cluster) == set(need), f"unexpected ClusterRole resources: {sorted(set(cluster) - set(need))}"

    # The leader-election Lease in the release's namespace; the kube-dns
    # Service in kube-system (test_upstream_chart.py checks the resourceNames).
    roles = {d["metadata"]["name"]: d for d in defaults if d["kind"] == "Role"}
    assert set(roles) == {RELEASE, f"{RELEASE}-dns"}
    assert roles[RELEASE]["metadata"]["namespace"] == NAMESPACE
    assert grants("Role", RELEASE) == {
        ("coordination.k8s.io", "leases"): {"get", "watch", "create", "update", "patch"}
    }
    assert roles[f"{RELEASE}-dns"]["metadata"]["namespace"] == "kube-system"
    assert grants("Role", f"{RELEASE}-dns") == {("", "services"): {"get"}}

    sa = find(defaults, "ServiceAccount")["metadata"]["name"]
    bindings = [d for d in defaults if d["kind"] in ("ClusterRoleBinding", "RoleBinding")]
    assert len(bindings) == 3
    for binding in bindings:
        role_kind = binding["kind"].removesuffix("Binding")
        assert binding["roleRef"] == {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": role_kind,
            "name": find(defaults, role_kind, binding["metadata"]["name"])["metadata"]["name"],
        }
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": sa, "namespace": NAMESPACE}]


def test_every_rbac_rule_has_a_comment() -> None:
    for name in ("clusterrole.yaml", "role.yaml"):
        lines = (CHART / "templates" / name).read_text().splitlines()
        for i, line in enumerate(lines):
            if line.strip().startswith("- apiGroups:"):
                assert lines[i - 1].strip().startswith("#"), f"{name}:{i + 1}: rule without a comment saying why"


# --- pod-level passthroughs --------------------------------------------------------------------


def test_volumes_sidecars_and_pod_fields_pass_through() -> None:
    docs = render(
        sets=(*MINIMAL, "terminationGracePeriodSeconds=60", "podLabels.team=platform", "podAnnotations.note=x",
              "imagePullSecrets[0].name=regcred", "hostNetwork=true", "dnsPolicy=ClusterFirstWithHostNet"),
    )
    pod = find(docs, "Deployment")["spec"]["template"]
    assert pod["metadata"]["labels"]["team"] == "platform"
    assert pod["metadata"]["annotations"] == {"note": "x"}
    spec = pod["spec"]
    assert spec["terminationGracePeriodSeconds"] == 60
    assert spec["imagePullSecrets"] == [{"name": "regcred"}]
    assert spec["hostNetwork"] is True
    assert spec["dnsPolicy"] == "ClusterFirstWithHostNet"

    out = helm(*template_args(sets=MINIMAL), "--set-json",
               'controller.sidecarContainer=[{"name":"side","image":"busybox:1.36"}]', "--set-json",
               'controller.extraVolumeMounts=[{"name":"token","mountPath":"/var/run/token","readOnly":true}]',
               "--set-json", 'extraVolumes=[{"name":"token","emptyDir":{}}]').stdout
    deployment = find([d for d in yaml.safe_load_all(out) if d], "Deployment")
    spec = deployment["spec"]["template"]["spec"]
    mount = {"name": "token", "mountPath": "/var/run/token", "readOnly": True}
    assert controller(deployment)["volumeMounts"] == [mount]
    assert spec["volumes"] == [{"name": "token", "emptyDir": {}}]
    assert spec["containers"][1] == {"name": "side", "image": "busybox:1.36", "volumeMounts": [mount]}


def test_sync_script_reports_no_drift() -> None:
    proc = subprocess.run([str(REPO_ROOT / "hack" / "sync-chart-crds.sh"), "--check"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr

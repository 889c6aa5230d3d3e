"""This chart against upstream Karpenter's (v1.14.1), both rendered with the real helm binary
from the same values: upstream's whole values.yaml, alone and with
values-upstream-keys.yaml over it (every value that reaches the controller's environment, the
Service or the ServiceMonitor, away from its default).

- the controller container gets the same environment (names, values and order), apart from
  the karpenter-rs-only names listed in ALLOWED_EXTRA_ENV;
- the same container name, ports, probes, envFrom, init containers, metrics Service and
  ServiceMonitor;
- the ServiceAccount's RBAC is never broader than upstream's: every (scope, API group,
  resource, resource name, verb) this chart grants is granted by upstream's too, except the
  few in RBAC_EXTRAS, each with the reason the controller needs it;
- a value of the wrong type fails `helm template`, naming the key (values.schema.json).

Upstream's chart is a copy under tests/fixtures/upstream/chart-v1.14.1 (see its SOURCE).
Pure rendering: no cluster.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from chart_helpers import CHART, NAMESPACE, RELEASE, REPO_ROOT, UPSTREAM_DEFAULT_ENV, helm, render, template_args

UPSTREAM_CHART = REPO_ROOT / "tests" / "fixtures" / "upstream" / "chart-v1.14.1"
UPSTREAM_VALUES = UPSTREAM_CHART / "values.yaml"
NEW_KEYS = Path(__file__).resolve().parent / "values-upstream-keys.yaml"

# Upstream's ServiceMonitor is rendered only when the cluster serves its API.
API_VERSIONS = ("--api-versions", "monitoring.coreos.com/v1")

# Environment variables this chart may set that upstream's does not: karpenter-rs's own
# settings, each set only when asked for (so neither value set here renders them).
ALLOWED_EXTRA_ENV = {
    "REBALANCE_REPLACEMENT",
    "BURSTABLE_CPU",
    "FEWER_NODES_MARGIN",
    "DEFAULT_POD_TOPOLOGY_SPREAD",
    "LEARN_EXTENDED_RESOURCES",
    "KUBE_SCHEDULER_CONFIG",
    "CONSOLIDATION_PREFERENCE_POLICY",
}

# Grants this chart gives the controller that upstream's does not, as (scope, API group,
# resource, resource name, verb); scope is "cluster" or a namespace, "*" any name.
RBAC_EXTRAS = {
    ("cluster", "", "nodes", "*", "create"): (
        "the kwok provider creates the Node objects of its simulated instances"
    ),
    ("cluster", "", "limitranges", "*", "list"): (
        "the LimitRange defaults of DaemonSet pods are counted on new nodes"
    ),
    ("cluster", "", "limitranges", "*", "watch"): (
        "the LimitRange defaults of DaemonSet pods are counted on new nodes"
    ),
    **{
        ("cluster", "apps", resource, "*", "patch"): (
            "opted-in workloads are surged past a budget that refuses the drain"
        )
        for resource in ("deployments", "replicasets")
    },
}

VALUE_SETS = {
    "upstream-defaults": ((UPSTREAM_VALUES,), ("settings.clusterName=demo",)),
    "new-keys": ((UPSTREAM_VALUES, NEW_KEYS), ()),
}


def render_both(name: str) -> tuple[list[dict], list[dict]]:
    files, sets = VALUE_SETS[name]
    out = []
    for chart in (UPSTREAM_CHART, CHART):
        text = helm(*template_args(*files, sets=sets, chart=chart), *API_VERSIONS).stdout
        out.append([d for d in yaml.safe_load_all(text) if d])
    return out[0], out[1]


@pytest.fixture(scope="module", params=list(VALUE_SETS))
def both(request) -> tuple[list[dict], list[dict]]:
    """(upstream's objects, this chart's objects), from the same values."""
    return render_both(request.param)


def one(docs: list[dict], kind: str, name: str | None = None) -> dict:
    matches = [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    assert len(matches) == 1, f"expected one {kind} {name or ''}, found {len(matches)}"
    return matches[0]


def controller_container(docs: list[dict]) -> dict:
    """The first container of the Deployment, the controller in both charts."""
    return one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]


def env_list(container: dict) -> list[tuple[str, object]]:
    """The env as (name, value or valueFrom) pairs, in order, each name once."""
    pairs = [(e["name"], e["value"] if "value" in e else e.get("valueFrom")) for e in container.get("env", [])]
    names = [n for n, _ in pairs]
    assert len(names) == len(set(names)), f"an env var is set twice: {names}"
    return pairs


# --- the controller container ---------------------------------------------------------------


def test_same_environment_names_values_and_order(both) -> None:
    upstream, ours = (env_list(controller_container(docs)) for docs in both)
    extra = {n for n, _ in ours} - {n for n, _ in upstream}
    assert extra <= ALLOWED_EXTRA_ENV, f"env vars upstream's chart does not set: {sorted(extra - ALLOWED_EXTRA_ENV)}"
    missing = {n for n, _ in upstream} - {n for n, _ in ours}
    assert not missing, f"env vars of upstream's chart missing here: {sorted(missing)}"
    assert dict(ours) == dict(upstream) | {n: v for n, v in ours if n in extra}
    # Same order too (a value may refer to an earlier variable as $(NAME)).
    assert [p for p in ours if p[0] not in extra] == upstream


def test_upstream_defaults_render_upstreams_list() -> None:
    """The names and values upstream's chart sets with its own defaults, written out: a change
    of the fixture (or of the comparison above) shows here."""
    upstream, ours = render_both("upstream-defaults")
    for docs in (upstream, ours):
        env = dict(env_list(controller_container(docs)))
        assert env == UPSTREAM_DEFAULT_ENV


def test_new_keys_reach_the_environment() -> None:
    """The values this chart learned from upstream's, with what they render (the same in both
    charts, checked above)."""
    _, ours = render_both("new-keys")
    container = controller_container(ours)
    assert container["name"] == "karpenter-controller"
    env = dict(env_list(container))
    assert env["CLUSTER_NAME"] == f"{RELEASE}-cluster"
    assert env["CLUSTER_ENDPOINT"] == f"https://{RELEASE}.eks.example.com"
    assert env["INTERRUPTION_QUEUE"] == f"{RELEASE}-queue"
    assert env["LOG_OUTPUT_PATHS"] == "stdout,/var/log/karpenter.log"
    assert env["LOG_ERROR_OUTPUT_PATHS"] == "stderr,/var/log/karpenter-errors.log"
    assert env["EKS_CONTROL_PLANE"] == "true"
    assert env["ENABLE_ZONAL_SHIFT"] == "true"
    assert "IGNORE_DRA_REQUESTS" not in env, "false is left out, as upstream's chart leaves it out"
    assert env["DISABLE_CLUSTER_STATE_OBSERVABILITY"] == "true"
    assert env["DISABLE_DRY_RUN"] == "true"
    assert env["AMI_REFRESH_INTERVAL"] == "5m"
    assert env["SUBNET_REFRESH_INTERVAL"] == "10m"
    assert env["FEATURE_GATES"].endswith(",CapacityBuffer=true")
    assert env["CPU_REQUESTS"]["resourceFieldRef"]["containerName"] == "karpenter-controller"
    assert env["AWS_REGION"] == "eu-west-1"


def test_same_container_name_ports_probes_and_env_sources(both) -> None:
    upstream, ours = (controller_container(docs) for docs in both)
    assert ours["name"] == upstream["name"]
    assert ours["ports"] == upstream["ports"]
    assert ours.get("envFrom") == upstream.get("envFrom")
    ports = {p["name"]: p["containerPort"] for p in ours["ports"]}
    for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
        assert ours[probe] == upstream[probe], probe
        get = ours[probe]["httpGet"]
        assert get["path"] == path
        # A named port must be one of the container's.
        port = ports[get["port"]] if isinstance(get["port"], str) else get["port"]
        assert port == ports["http"], f"{probe} does not probe the health port"


def test_same_init_containers(both) -> None:
    upstream, ours = (one(docs, "Deployment")["spec"]["template"]["spec"] for docs in both)
    assert ours.get("initContainers") == upstream.get("initContainers")


def test_same_metrics_service_and_service_monitor(both) -> None:
    upstream, ours = both
    up_svc, our_svc = one(upstream, "Service"), one(ours, "Service")
    assert our_svc["spec"] == up_svc["spec"]
    assert our_svc["metadata"].get("annotations") == up_svc["metadata"].get("annotations")
    up_monitors = [d for d in upstream if d["kind"] == "ServiceMonitor"]
    our_monitors = [d for d in ours if d["kind"] == "ServiceMonitor"]
    assert len(our_monitors) == len(up_monitors)
    for up, our in zip(up_monitors, our_monitors):
        assert our["spec"] == up["spec"]
        assert our["metadata"]["labels"]["release"] == up["metadata"]["labels"]["release"]


def test_new_keys_reach_service_and_service_monitor() -> None:
    _, ours = render_both("new-keys")
    assert one(ours, "Service")["metadata"]["annotations"] == {"owner": "platform", "prometheus.io/scrape": "true"}
    spec = one(ours, "ServiceMonitor")["spec"]
    assert spec["sampleLimit"] == 5000
    (endpoint,) = spec["endpoints"]
    assert endpoint["port"] == "http-metrics"
    assert endpoint["relabelings"][0]["targetLabel"] == "node"
    assert endpoint["metricRelabelings"][0]["action"] == "drop"
    assert endpoint["interval"] == "30s"
    pod = one(ours, "Deployment")["spec"]["template"]["spec"]
    assert [c["name"] for c in pod["initContainers"]] == ["wait"]


# --- RBAC ---------------------------------------------------------------------------------------


def service_account(docs: list[dict]) -> tuple[str, str]:
    deployment = one(docs, "Deployment")
    return deployment["metadata"]["namespace"], deployment["spec"]["template"]["spec"]["serviceAccountName"]


def grants(docs: list[dict]) -> set[tuple[str, str, str, str, str]]:
    """What the controller's ServiceAccount may do, through the bindings that name it, as
    (scope, API group, resource, resource name, verb)."""
    namespace, sa = service_account(docs)
    subject = {"kind": "ServiceAccount", "name": sa, "namespace": namespace}
    out = set()
    for binding in docs:
        if binding["kind"] not in ("ClusterRoleBinding", "RoleBinding") or subject not in binding["subjects"]:
            continue
        ref = binding["roleRef"]
        role_namespace = binding["metadata"].get("namespace") if ref["kind"] == "Role" else None
        role = [
            d
            for d in docs
            if d["kind"] == ref["kind"]
            and d["metadata"]["name"] == ref["name"]
            and d["metadata"].get("namespace") == role_namespace
        ]
        assert len(role) == 1, f"{binding['kind']} {binding['metadata']['name']} refers to a missing {ref}"
        scope = "cluster" if binding["kind"] == "ClusterRoleBinding" else binding["metadata"]["namespace"]
        for rule in role[0].get("rules") or []:
            assert not rule.get("nonResourceURLs"), rule
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    for name in rule.get("resourceNames") or ["*"]:
                        for verb in rule["verbs"]:
                            out.add((scope, group, resource, name, verb))
    return out


def covered(grant: tuple[str, str, str, str, str], by: set[tuple[str, str, str, str, str]]) -> bool:
    scope, group, resource, name, verb = grant
    return any(
        (s == "cluster" or s == scope) and g == group and r == resource and (n == "*" or n == name) and v == verb
        for s, g, r, n, v in by
    )


def test_rbac_is_never_broader_than_upstreams(both) -> None:
    upstream, ours = (grants(docs) for docs in both)
    assert upstream and ours
    broader = {g for g in ours if not covered(g, upstream)}
    unexplained = broader - set(RBAC_EXTRAS)
    assert not unexplained, "granted here but not by upstream's chart:\n  " + "\n  ".join(map(str, sorted(unexplained)))
    stale = set(RBAC_EXTRAS) - broader
    assert not stale, f"RBAC_EXTRAS lists grants this chart no longer gives beyond upstream's: {sorted(stale)}"


def test_rbac_comparison_sees_scopes_and_names() -> None:
    """The comparison itself: a narrower grant is covered, a wider one is not."""
    upstream = {
        ("cluster", "", "pods", "*", "get"),
        ("kube-system", "coordination.k8s.io", "leases", "karpenter-leader-election", "update"),
    }
    assert covered(("ns", "", "pods", "x", "get"), upstream)
    assert covered(("kube-system", "coordination.k8s.io", "leases", "karpenter-leader-election", "update"), upstream)
    assert not covered(("kube-system", "coordination.k8s.io", "leases", "*", "update"), upstream)
    assert not covered(("other", "coordination.k8s.io", "leases", "karpenter-leader-election", "update"), upstream)
    assert not covered(("cluster", "", "pods", "*", "list"), upstream)


# --- value types --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "flag,value,key",
    [
        ("--set-string", "settings.isolatedVPC=yes", "settings.isolatedVPC"),
        ("--set-string", "settings.featureGates.capacityBuffer=on", "settings.featureGates.capacityBuffer"),
        ("--set-string", "settings.ignoreDRARequests=false", "settings.ignoreDRARequests"),
        ("--set", "settings.amiRefreshInterval=5", "settings.amiRefreshInterval"),
        ("--set-json", 'settings.clusterEndpoint={"url":"x"}', "settings.clusterEndpoint"),
        ("--set", "settings.vmMemoryOverheadPercent=2", "settings.vmMemoryOverheadPercent"),
        ("--set-string", "controller.metrics.port=http", "controller.metrics.port"),
        ("--set-string", "replicas=two", "replicas"),
        ("--set-string", "serviceMonitor.sampleLimit=many", "serviceMonitor.sampleLimit"),
        ("--set-string", "logOutputPaths=stdout", "logOutputPaths"),
        ("--set-string", "service.annotations=x", "service.annotations"),
        ("--set-string", "initContainers=x", "initContainers"),
        ("--set-string", "terminationGracePeriodSeconds=soon", "terminationGracePeriodSeconds"),
    ],
)
def test_a_value_of_the_wrong_type_fails_naming_the_key(flag, value, key) -> None:
    proc = helm(*template_args(sets=("settings.clusterName=demo",)), flag, value, check=False)
    assert proc.returncode != 0, f"{value} rendered"
    # Helm names the key as a JSON pointer (/settings/isolatedVPC) or dotted, by version.
    assert "/" + key.replace(".", "/") in proc.stderr or key in proc.stderr, proc.stderr


def test_values_of_older_upstream_charts_still_pass_the_schema() -> None:
    docs = render(
        sets=(
            "settings.clusterName=demo",
            "webhook.enabled=false",
            "webhook.port=8443",
            "logConfig.enabled=true",
            "settings.assumeRoleARN=arn:aws:iam::111122223333:role/x",
            "settings.featureGates.drift=true",
            "settings.reservedENIs=1",
            "terminationGracePeriodSeconds=60",
        )
    )
    assert one(docs, "Deployment")["metadata"]["namespace"] == NAMESPACE

"""Tests of the kubelet stand-in (hack/kubelet-standin.py).

Unit tests of its user-data parsers, against the user data the Rust generator
(src/cloudprovider/aws/userdata.rs) writes, and an end-to-end test against the
AWS emulator and the local API server: instances launched with each kind of
user data get a Node, instances terminated lose it.

    eval "$(hack/cluster-up.sh)"
    "$(hack/moto-up.sh --venv)"/bin/python -m pytest -q tests/aws_emulator/test_kubelet_standin.py

The end-to-end test is skipped when KUBECONFIG is not set; it tags its
instances with a cluster name of its own, so a stand-in running for another
cluster does not see them (nor this one theirs).
"""

from __future__ import annotations

import base64
import gzip
import importlib.util
import os
import re
import sys
import uuid
from pathlib import Path
from types import ModuleType
from typing import Any, Iterator

import pytest

REPO = Path(__file__).resolve().parents[2]
USERDATA_RS = REPO / "src/cloudprovider/aws/userdata.rs"
SEEDED_CLUSTER = os.environ.get("CLUSTER_NAME") or "karpenter-demo"


def _load_standin() -> ModuleType:
    spec = importlib.util.spec_from_file_location("kubelet_standin", REPO / "hack/kubelet-standin.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    dont_write = sys.dont_write_bytecode
    sys.dont_write_bytecode = True  # no __pycache__ in hack/
    try:
        spec.loader.exec_module(module)
    finally:
        sys.dont_write_bytecode = dont_write
    return module


standin = _load_standin()

# The user data the Rust generator writes for labels {karpenter.sh/capacity-type: spot,
# karpenter.sh/nodepool: default}, taints [dedicated=gpu:NoSchedule,
# karpenter.sh/unregistered:NoExecute] and 29 pods (its golden tests; checked below).
AL2023 = """MIME-Version: 1.0
Content-Type: multipart/mixed; boundary="//"

--//
Content-Type: application/node.eks.aws

# Karpenter Generated NodeConfig
apiVersion: node.eks.aws/v1alpha1
kind: NodeConfig
spec:
  cluster:
    apiServerEndpoint: https://example.eks.amazonaws.com
    certificateAuthority: Q0E=
    cidr: 172.20.0.0/16
    name: demo
  kubelet:
    config:
      clusterDNS:
      - "172.20.0.10"
      maxPods: 29
      registerWithTaints:
      - effect: NoSchedule
        key: dedicated
        value: gpu
      - effect: NoExecute
        key: karpenter.sh/unregistered
    flags:
    - --node-labels="karpenter.sh/capacity-type=spot,karpenter.sh/nodepool=default"

--//--
"""

AL2 = """MIME-Version: 1.0
Content-Type: multipart/mixed; boundary="//"

--//
Content-Type: text/x-shellscript; charset="us-ascii"

#!/bin/bash -xe
exec > >(tee /var/log/user-data.log|logger -t user-data -s 2>/dev/console) 2>&1
/etc/eks/bootstrap.sh 'demo' --apiserver-endpoint 'https://example.eks.amazonaws.com' --b64-cluster-ca 'Q0E=' \\
--dns-cluster-ip '172.20.0.10' \\
--use-max-pods false \\
--kubelet-extra-args '--node-labels="karpenter.sh/capacity-type=spot,karpenter.sh/nodepool=default" --register-with-taints="dedicated=gpu:NoSchedule,karpenter.sh/unregistered:NoExecute" --max-pods=29'

--//--
"""

BOTTLEROCKET = """[settings.kubernetes]
cluster-name = "demo"
api-server = "https://example.eks.amazonaws.com"
cluster-certificate = "Q0E="
cluster-dns-ip = "172.20.0.10"
max-pods = 29

[settings.kubernetes.node-labels]
"karpenter.sh/capacity-type" = "spot"
"karpenter.sh/nodepool" = "default"

[settings.kubernetes.node-taints]
dedicated = ["gpu:NoSchedule"]
"karpenter.sh/unregistered" = [":NoExecute"]
"""

LABELS = {"karpenter.sh/capacity-type": "spot", "karpenter.sh/nodepool": "default"}
TAINTS = [
    standin.Taint(key="dedicated", value="gpu", effect="NoSchedule"),
    standin.Taint(key="karpenter.sh/unregistered", effect="NoExecute"),
]
K8S_TAINTS = [
    {"key": "dedicated", "value": "gpu", "effect": "NoSchedule"},
    {"key": "karpenter.sh/unregistered", "effect": "NoExecute"},
]


def _rust_golden(test_name: str) -> str:
    source = USERDATA_RS.read_text()
    match = re.search(rf"fn {test_name}\(\).*?let want = r#\"(.*?)\"#;", source, re.DOTALL)
    assert match, f"no golden string in fn {test_name} of {USERDATA_RS.relative_to(REPO)}"
    return match.group(1)


# --- user data -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "fixture,test_name",
    [(AL2023, "al2023_golden"), (AL2, "al2_golden"), (BOTTLEROCKET, "bottlerocket_golden_and_merge")],
)
def test_fixtures_are_the_generators_golden_output(fixture: str, test_name: str) -> None:
    assert fixture == _rust_golden(test_name)


@pytest.mark.parametrize(
    "text,family", [(AL2023, "AL2023"), (AL2, "AL2"), (BOTTLEROCKET, "Bottlerocket")]
)
def test_parses_each_family(text: str, family: str) -> None:
    boot = standin.parse_user_data(text)
    assert boot.family == family
    assert boot.labels == LABELS
    assert boot.taints == TAINTS
    assert boot.max_pods == 29


def test_al2023_with_the_classs_parts_first() -> None:
    # The generator keeps the class's own parts (here a shell script) before its NodeConfig.
    text = AL2023.replace(
        "--//\nContent-Type: application/node.eks.aws",
        "--//\nContent-Type: text/x-shellscript\n\n#!/bin/bash\necho hi\n\n"
        "--//\nContent-Type: application/node.eks.aws",
        1,
    )
    boot = standin.parse_user_data(text)
    assert (boot.family, boot.labels, boot.taints, boot.max_pods) == ("AL2023", LABELS, TAINTS, 29)


def test_later_node_configs_override_earlier_ones() -> None:
    custom = (
        "apiVersion: node.eks.aws/v1alpha1\nkind: NodeConfig\nspec:\n  kubelet:\n"
        "    config:\n      maxPods: 8\n    flags:\n    - --node-labels=team=a\n"
    )
    text = AL2023.replace(
        "--//\nContent-Type: application/node.eks.aws",
        f"--//\nContent-Type: application/node.eks.aws\n\n{custom}\n--//\nContent-Type: application/node.eks.aws",
        1,
    )
    boot = standin.parse_user_data(text)
    assert boot.labels == {"team": "a", **LABELS}
    assert boot.max_pods == 29


@pytest.mark.parametrize(
    "text,family,labels,pods",
    [
        ("", "Custom", {}, None),
        ("#!/bin/sh\necho x\n", "Custom", {}, None),
        (
            "#!/bin/bash\n/etc/eks/bootstrap.sh demo --kubelet-extra-args '--node-labels a=b --max-pods 7'\n",
            "AL2",
            {"a": "b"},
            7,
        ),
        (
            "apiVersion: node.eks.aws/v1alpha1\nkind: NodeConfig\nspec:\n  kubelet:\n    flags: [--node-labels=x=y]\n",
            "AL2023",
            {"x": "y"},
            None,
        ),
        ('[settings.host-containers.admin]\nenabled = true\n', "Bottlerocket", {}, None),
        ('[settings.kubernetes]\nnode-taints = { a = "b:NoSchedule" }\n', "Bottlerocket", {}, None),
        ("just some text\n", "Custom", {}, None),
    ],
)
def test_custom_user_data(text: str, family: str, labels: dict[str, str], pods: int | None) -> None:
    boot = standin.parse_user_data(text)
    assert (boot.family, boot.labels, boot.max_pods) == (family, labels, pods)


@pytest.mark.parametrize(
    "text",
    [
        "[settings.kubernetes\nmax-pods = 1\n",  # TOML that does not parse
        '[settings.kubernetes.node-taints]\na = ["b:Sometimes"]\n',
        "MIME-Version: 1.0\nContent-Type: multipart/mixed\n\n--x\n",  # no boundary
        # a NodeConfig part that is not YAML
        "MIME-Version: 1.0\nContent-Type: multipart/mixed; boundary=\"//\"\n\n"
        "--//\nContent-Type: application/node.eks.aws\n\nkind: NodeConfig\n  bad: [\n--//--\n",
        "#!/bin/bash\n/etc/eks/bootstrap.sh demo --kubelet-extra-args '--register-with-taints=novalue'\n",
        "#!/bin/bash\n/etc/eks/bootstrap.sh demo --kubelet-extra-args '--max-pods=many'\n",
        "#!/bin/bash\n/etc/eks/bootstrap.sh demo --kubelet-extra-args '--node-labels=\n",
    ],
)
def test_malformed_user_data_raises(text: str) -> None:
    with pytest.raises(standin.UserDataError):
        standin.parse_user_data(text)


def test_decode_user_data() -> None:
    assert standin.decode_user_data(base64.b64encode(AL2.encode()).decode()) == AL2
    assert standin.decode_user_data(base64.b64encode(gzip.compress(AL2.encode())).decode()) == AL2
    assert standin.decode_user_data(None) == ""
    for bad in ("not base64!", base64.b64encode(b"\x1f\x8bnot gzip").decode(), base64.b64encode(b"\xff\xfe").decode()):
        with pytest.raises(standin.UserDataError):
            standin.decode_user_data(bad)


@pytest.mark.parametrize(
    "text,taint",
    [
        ("a=b:NoSchedule", ("a", "b", "NoSchedule")),
        ("a=:NoExecute", ("a", None, "NoExecute")),
        ("a:PreferNoSchedule", ("a", None, "PreferNoSchedule")),
        ("example.com/a=b=c:NoSchedule", ("example.com/a", "b=c", "NoSchedule")),
    ],
)
def test_parse_taint(text: str, taint: tuple[str, str | None, str]) -> None:
    t = standin.parse_taint(text)
    assert (t.key, t.value, t.effect) == taint


# --- capacity and the Node -------------------------------------------------------------------

M5_LARGE = standin.TypeInfo(
    name="m5.large", vcpus=2, memory_mib=8192, architectures=("x86_64",), max_enis=3, ipv4_per_eni=10
)


def test_resources_follow_eks_defaults() -> None:
    capacity, allocatable = standin.node_resources(M5_LARGE, None)
    # 8192Mi less 7.5% (rounded up to MiB) = 7577Mi; ENI limit 3 × (10 − 1) + 2 = 29.
    assert capacity["cpu"] == "2"
    assert capacity["memory"] == f"{7577 * 1024}Ki"
    assert capacity["pods"] == "29"
    assert capacity["ephemeral-storage"] == str(20 * 1024**3)
    # kube-reserved cpu 60m + 10m; memory 11 × 29 + 255 Mi, plus the 100Mi eviction threshold.
    assert allocatable["cpu"] == "1930m"
    assert allocatable["memory"] == f"{(7577 - 574 - 100) * 1024}Ki"
    assert allocatable["ephemeral-storage"] == str(20 * 1024**3 - 1024**3 - 2147483648)
    assert allocatable["pods"] == "29"
    capacity, allocatable = standin.node_resources(M5_LARGE, 110)
    assert capacity["pods"] == "110"
    # kube-reserved memory stays sized for the 29 ENI-limited pods.
    assert allocatable["memory"] == f"{(7577 - 574 - 100) * 1024}Ki"


def test_graviton_memory_keeps_the_cma_reservation() -> None:
    c6g = standin.TypeInfo(
        name="c6g.xlarge", vcpus=4, memory_mib=8192, architectures=("arm64",), max_enis=4, ipv4_per_eni=15
    )
    capacity, _ = standin.node_resources(c6g, None)
    # 8192Mi less 64Mi, less 7.5% of the 8128Mi left (610Mi).
    assert capacity["memory"] == f"{7518 * 1024}Ki"


@pytest.mark.parametrize("millis,reserved", [(1000, 60), (2000, 70), (4000, 80), (8000, 90), (96000, 310)])
def test_kube_reserved_cpu(millis: int, reserved: int) -> None:
    assert standin.kube_reserved_cpu_millis(millis) == reserved


def test_build_node() -> None:
    instance = {
        "InstanceId": "i-0123456789abcdef0",
        "InstanceType": "m5.large",
        "Architecture": "x86_64",
        "Placement": {"AvailabilityZone": "us-west-2b"},
        "PrivateIpAddress": "10.0.32.7",
        "PrivateDnsName": "ip-10-0-32-7.us-west-2.compute.internal",
    }
    name = instance["PrivateDnsName"]
    boot = standin.parse_user_data(AL2023)
    node = standin.build_node(instance, boot, M5_LARGE, name, "demo", "us-west-2", "usw2-az1")
    assert node["metadata"]["name"] == name
    assert node["spec"]["providerID"] == "aws:///us-west-2b/i-0123456789abcdef0"
    assert node["spec"]["taints"] == K8S_TAINTS
    assert node["metadata"]["annotations"]["kwok.x-k8s.io/node"] == "fake"
    labels = node["metadata"]["labels"]
    assert labels == labels | LABELS | {
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "node.kubernetes.io/instance-type": "m5.large",
        "topology.kubernetes.io/zone": "us-west-2b",
        "topology.kubernetes.io/region": "us-west-2",
        "topology.k8s.aws/zone-id": "usw2-az1",
    }
    assert {"type": "InternalIP", "address": "10.0.32.7"} in node["status"]["addresses"]
    assert standin.instance_id_of(node["spec"]["providerID"]) == instance["InstanceId"]


def test_in_cluster() -> None:
    tagged = {"Tags": [{"Key": "kubernetes.io/cluster/demo", "Value": "owned"}]}
    eks = {"Tags": [{"Key": "eks:eks-cluster-name", "Value": "demo"}]}
    assert standin.in_cluster(tagged, "demo") and standin.in_cluster(eks, "demo")
    assert not standin.in_cluster(tagged, "other") and not standin.in_cluster(eks, "other")
    assert standin.in_cluster({}, "")


# --- end to end: the emulator and the API server ---------------------------------------------


@pytest.fixture(scope="module")
def kube() -> Any:
    if not os.environ.get("KUBECONFIG"):
        pytest.skip('KUBECONFIG is not set; start the local cluster: eval "$(hack/cluster-up.sh)"')
    return standin.Kube.from_kubeconfig()


@pytest.fixture(scope="module")
def ec2() -> Any:
    if not os.environ.get("AWS_ENDPOINT_URL"):
        pytest.fail('AWS_ENDPOINT_URL is not set; start the emulator: eval "$(hack/moto-up.sh)"', pytrace=False)
    return standin.ec2_client(os.environ.get("AWS_REGION") or "us-west-2")


@pytest.fixture
def launched(ec2: Any, kube: Any) -> Iterator[dict[str, Any]]:
    """Launches instances in the seeded cluster's subnets, tagged for a cluster of this test only.

    Yields {"cluster", "launch"(user_data, image, type, nodepool=True, nodeclaim=True) -> instance};
    terminates the instances and deletes their Nodes (finalizers included) afterwards.
    """
    cluster = f"krs-standin-{uuid.uuid4().hex[:8]}"
    subnets = ec2.describe_subnets(Filters=[{"Name": "tag:karpenter.sh/discovery", "Values": [SEEDED_CLUSTER]}])
    subnet_ids = sorted(s["SubnetId"] for s in subnets["Subnets"])
    assert subnet_ids, f"no subnets of the seeded cluster {SEEDED_CLUSTER}"
    ids: list[str] = []

    def launch(user_data: str, image: str, instance_type: str, nodepool: bool = True,
               nodeclaim: bool = True) -> dict[str, Any]:
        tags = {f"kubernetes.io/cluster/{cluster}": "owned", "eks:eks-cluster-name": cluster}
        if nodeclaim:
            tags["karpenter.sh/nodeclaim"] = f"default-{len(ids)}"
        if nodepool:
            tags["karpenter.sh/nodepool"] = "default"
        instance = ec2.run_instances(
            ImageId=image, InstanceType=instance_type, MinCount=1, MaxCount=1,
            SubnetId=subnet_ids[len(ids) % len(subnet_ids)], UserData=user_data,
            TagSpecifications=[{"ResourceType": "instance",
                                "Tags": [{"Key": k, "Value": v} for k, v in tags.items()]}],
        )["Instances"][0]
        ids.append(instance["InstanceId"])
        return instance

    yield {"cluster": cluster, "launch": launch}

    if ids:
        ec2.terminate_instances(InstanceIds=ids)
    for node in kube.list_nodes():
        if standin.instance_id_of(node["spec"].get("providerID", "")) in ids:
            name = node["metadata"]["name"]
            if node["metadata"].get("finalizers"):
                kube.request("PATCH", f"/api/v1/nodes/{name}", {"metadata": {"finalizers": None}},
                             "application/merge-patch+json")
            try:
                kube.delete_node(name)
            except standin.KubeError:
                pass


def _image(ec2: Any, parameter: str) -> str:
    import boto3

    ssm = boto3.session.Session(region_name=ec2.meta.region_name).client("ssm")
    return ssm.get_parameter(Name=parameter)["Parameter"]["Value"]


def _node_of(kube: Any, instance: dict[str, Any]) -> dict[str, Any] | None:
    want = f"aws:///{instance['Placement']['AvailabilityZone']}/{instance['InstanceId']}"
    nodes = [n for n in kube.list_nodes() if n["spec"].get("providerID") == want]
    assert len(nodes) <= 1, nodes
    return nodes[0] if nodes else None


def test_registers_and_deletes_nodes(ec2: Any, kube: Any, launched: dict[str, Any], capsys: Any) -> None:
    eks = "/aws/service/eks/optimized-ami/1.34"
    al2023 = _image(ec2, f"{eks}/amazon-linux-2023/x86_64/standard/recommended/image_id")
    al2_arm = _image(ec2, f"{eks}/amazon-linux-2-arm64/recommended/image_id")
    bottlerocket = _image(ec2, "/aws/service/bottlerocket/aws-k8s-1.34/x86_64/latest/image_id")
    launch = launched["launch"]
    cases = {
        "al2023": (launch(AL2023, al2023, "m5.large"), "amd64", "2", LABELS, K8S_TAINTS, "29"),
        "al2": (launch(AL2, al2_arm, "m6g.large"), "arm64", "2", LABELS, K8S_TAINTS, "29"),
        "bottlerocket": (launch(BOTTLEROCKET, bottlerocket, "m5.xlarge"), "amd64", "4", LABELS, K8S_TAINTS, "29"),
        # Custom user data without labels: the ENI limit of c5.xlarge, 4 × (15 − 1) + 2.
        "custom": (launch("#!/bin/sh\necho hello\n", al2023, "c5.xlarge"), "amd64", "4", {}, None, "58"),
        # A NodeClaim created on its own: tagged for its NodeClaim, with no NodePool.
        "standalone": (launch(AL2023, al2023, "m5.large", nodepool=False), "amd64", "2", LABELS, K8S_TAINTS, "29"),
    }
    broken = launch("[settings.kubernetes\n", bottlerocket, "m5.large")
    untagged = launch(AL2023, al2023, "m5.large", nodepool=False, nodeclaim=False)

    options = standin.Options(cluster=launched["cluster"], region=ec2.meta.region_name)
    result = standin.StandIn(ec2, kube, options).reconcile()

    assert result.errors == [broken["InstanceId"]]
    err = capsys.readouterr().err
    assert any(broken["InstanceId"] in line and '"level": "error"' in line for line in err.splitlines()), err
    assert len(result.created) == len(cases)
    assert _node_of(kube, broken) is None and _node_of(kube, untagged) is None
    for case, (instance, arch, cpu, labels, taints, pods) in cases.items():
        node = _node_of(kube, instance)
        assert node is not None, case
        meta, spec = node["metadata"], node["spec"]
        assert meta["name"] in (instance["PrivateDnsName"], instance["InstanceId"]), case
        assert meta["annotations"]["kwok.x-k8s.io/node"] == "fake"
        assert meta["labels"] == meta["labels"] | labels | {
            "kubernetes.io/arch": arch,
            "kubernetes.io/os": "linux",
            "kubernetes.io/hostname": meta["name"],
            "node.kubernetes.io/instance-type": instance["InstanceType"],
            "topology.kubernetes.io/zone": instance["Placement"]["AvailabilityZone"],
            "topology.kubernetes.io/region": ec2.meta.region_name,
        }, case
        # The node lifecycle controller may add node.kubernetes.io/not-ready until kwok reports Ready.
        own = [t for t in spec.get("taints") or [] if not t["key"].startswith("node.kubernetes.io/")]
        assert own == (taints or []), case
        assert (node["status"]["capacity"]["cpu"], node["status"]["capacity"]["pods"]) == (cpu, pods), case
        assert node["status"]["allocatable"]["pods"] == pods, case

    # A restarted stand-in recognises the Nodes by their providerID.
    again = standin.StandIn(ec2, kube, options).reconcile()
    assert (again.created, again.deleted, again.errors) == ([], [], [broken["InstanceId"]])

    # Terminated instances lose their Node; the API server honours finalizers.
    names = {case: _node_of(kube, c[0])["metadata"]["name"] for case, c in cases.items()}
    kept = _node_of(kube, cases["al2023"][0])
    assert kept is not None
    kube.request("PATCH", f"/api/v1/nodes/{kept['metadata']['name']}",
                 {"metadata": {"finalizers": ["karpenter.sh/termination"]}}, "application/merge-patch+json")
    ec2.terminate_instances(InstanceIds=[c[0]["InstanceId"] for c in cases.values()] + [broken["InstanceId"]])
    gone = standin.StandIn(ec2, kube, options).reconcile()
    assert sorted(gone.deleted) == sorted(names.values())
    assert gone.errors == []
    for case in ("al2", "bottlerocket", "custom"):
        assert _node_of(kube, cases[case][0]) is None, case
    terminating = _node_of(kube, cases["al2023"][0])
    assert terminating is not None and terminating["metadata"].get("deletionTimestamp")
    assert standin.StandIn(ec2, kube, options).reconcile().deleted == []
    kube.request("PATCH", f"/api/v1/nodes/{kept['metadata']['name']}", {"metadata": {"finalizers": None}},
                 "application/merge-patch+json")
    assert _node_of(kube, cases["al2023"][0]) is None

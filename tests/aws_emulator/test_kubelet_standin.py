"""Tests of the kubelet stand-in (hack/kubelet-standin.py).

Unit tests of its user-data parsers, against the user data the Rust generator
(src/cloudprovider/aws/userdata.rs) writes, and end-to-end tests against the
AWS emulator and the local API server: instances launched with each kind of
user data get a Node (a Windows Node for a Windows image), instances
terminated lose it.

    eval "$(hack/cluster-up.sh)"
    "$(hack/moto-up.sh --venv)"/bin/python -m pytest -q tests/aws_emulator/test_kubelet_standin.py

The end-to-end test is skipped when KUBECONFIG is not set; it tags its
instances with a cluster name of its own, so a stand-in running for another
cluster does not see them (nor this one theirs).
"""

from __future__ import annotations

import base64
import collections
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

# Windows (2019, 2022, 2025): the class's own PowerShell (here `Write-Host 'before'`), then the
# EKS bootstrap script's call, in one <powershell> block; the Rust golden string (checked below).
WINDOWS = r"""<powershell>
Write-Host 'before'
[string]$EKSBootstrapScriptFile = "$env:ProgramFiles\Amazon\EKS\Start-EKSBootstrap.ps1"
& $EKSBootstrapScriptFile -EKSClusterName 'demo' -APIServerEndpoint 'https://example.eks.amazonaws.com' -Base64ClusterCA 'Q0E=' -KubeletExtraArgs '--node-labels="karpenter.sh/capacity-type=spot,karpenter.sh/nodepool=default" --register-with-taints="dedicated=gpu:NoSchedule,karpenter.sh/unregistered:NoExecute" --max-pods=29' -DNSClusterIP '172.20.0.10'
</powershell>"""

# The same without the class's user data, the CA bundle and the DNS address (both optional).
WINDOWS_MINIMAL = r"""<powershell>
[string]$EKSBootstrapScriptFile = "$env:ProgramFiles\Amazon\EKS\Start-EKSBootstrap.ps1"
& $EKSBootstrapScriptFile -EKSClusterName 'demo' -APIServerEndpoint 'https://example.eks.amazonaws.com' -KubeletExtraArgs '--node-labels="karpenter.sh/capacity-type=on-demand,karpenter.sh/nodepool=default" --register-with-taints="karpenter.sh/unregistered:NoExecute" --max-pods=110'
</powershell>"""

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


def _rust_string(test_name: str) -> str:
    """The first `let want = "...";` (an ordinary Rust string literal) of a Rust test, unescaped."""
    source = USERDATA_RS.read_text()
    match = re.search(rf'fn {test_name}\(\).*?let want = "((?:[^"\\]|\\.)*)";', source, re.DOTALL)
    assert match, f"no golden string in fn {test_name} of {USERDATA_RS.relative_to(REPO)}"
    escapes = {"n": "\n", "r": "\r", "t": "\t", "0": "\0", "\\": "\\", "'": "'", '"': '"'}
    literal, out, i = match.group(1), [], 0
    while i < len(literal):
        if literal[i] != "\\":
            out.append(literal[i])
            i += 1
        elif literal[i + 1] == "\n":  # a line continuation drops the newline and the indentation
            i += 2
            while i < len(literal) and literal[i] in " \t\r\n":
                i += 1
        else:
            out.append(escapes[literal[i + 1]])
            i += 2
    return "".join(out)


# --- user data -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "fixture,test_name",
    [(AL2023, "al2023_golden"), (AL2, "al2_golden"), (BOTTLEROCKET, "bottlerocket_golden_and_merge")],
)
def test_fixtures_are_the_generators_golden_output(fixture: str, test_name: str) -> None:
    assert fixture == _rust_golden(test_name)


def test_windows_fixture_is_the_generators_golden_output() -> None:
    assert WINDOWS == _rust_string("windows_bootstraps_with_powershell_as_upstream")


@pytest.mark.parametrize(
    "text,family",
    [(AL2023, "AL2023"), (AL2, "AL2"), (BOTTLEROCKET, "Bottlerocket"), (WINDOWS, "Windows")],
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


def test_windows_without_custom_user_data_and_optional_arguments() -> None:
    boot = standin.parse_user_data(WINDOWS_MINIMAL)
    assert boot.family == "Windows"
    assert boot.labels == {"karpenter.sh/capacity-type": "on-demand", "karpenter.sh/nodepool": "default"}
    assert boot.taints == [standin.Taint(key="karpenter.sh/unregistered", effect="NoExecute")]
    assert boot.max_pods == 110
    # Windows line endings and upper-case tags change nothing.
    crlf = WINDOWS_MINIMAL.replace("\n", "\r\n").replace("<powershell>", "<PowerShell>")
    assert standin.parse_user_data(crlf) == boot


def test_windows_quotes_are_doubled() -> None:
    # A quote in a PowerShell single-quoted string is doubled ('o''brien' is o'brien), as the
    # generator writes label values (the API server would refuse this one on a Node).
    text = WINDOWS.replace("nodepool=default", "nodepool=default,team=o''brien").replace(
        "-EKSClusterName 'demo'", "-EKSClusterName 'de''mo'")
    boot = standin.parse_user_data(text)
    assert boot.labels == {**LABELS, "team": "o'brien"}
    assert (boot.taints, boot.max_pods) == (TAINTS, 29)
    words = standin.powershell_words("& $f -KubeletExtraArgs '--node-labels=\"a=it''s\"' 'x'''")
    assert [w.text for w in words] == ["&", "$f", "-KubeletExtraArgs", "--node-labels=\"a=it's\"", "x'"]
    assert [w.parameter for w in words] == [False, False, True, False, False]


def test_windows_custom_user_data_that_mentions_the_bootstrap_script() -> None:
    # Only a statement that calls the script counts: not a comment, an assignment, a string,
    # nor a multi-line string's lines.
    custom = "\n".join([
        "# & $EKSBootstrapScriptFile -EKSClusterName 'other' -KubeletExtraArgs '--max-pods=1'",
        r'$EKSBootstrapScriptFile = "C:\Program Files\Amazon\EKS\Start-EKSBootstrap.ps1"',
        "Write-Host '& $EKSBootstrapScriptFile -KubeletExtraArgs ''--max-pods=2'''",
        "$Env:Note = 'a multi-line",
        "string'; Write-Host \"done\"",
    ])
    boot = standin.parse_user_data(WINDOWS.replace("Write-Host 'before'", custom))
    assert (boot.family, boot.labels, boot.taints, boot.max_pods) == ("Windows", LABELS, TAINTS, 29)


@pytest.mark.parametrize(
    "call,labels,pods",
    [
        # the script's path called directly, a colon-bound value
        (r"& 'C:\Program Files\Amazon\EKS\Start-EKSBootstrap.ps1' -EKSClusterName demo "
         "-KubeletExtraArgs:'--max-pods=7'", {}, 7),
        # a backtick line continuation; a second statement after `;`
        ("& $EKSBootstrapScriptFile -EKSClusterName 'demo' `\n  -KubeletExtraArgs '--node-labels=a=b' "
         "; Write-Host ok", {"a": "b"}, None),
        # double-quoted PowerShell strings: "" and `" are quotes
        ('& $EKSBootstrapScriptFile -EKSClusterName "demo" -KubeletExtraArgs "--node-labels=""a=b"" '
         '--max-pods=`"3`""', {"a": "b"}, 3),
        # parameter names are case-insensitive; a switch takes no value; `-Name: value`
        ("& $EKSBootstrapScriptFile -eksclustername 'demo' -Verbose -kubeletextraargs '--max-pods=5'", {}, 5),
        ("& $EKSBootstrapScriptFile -EKSClusterName: 'demo' -KubeletExtraArgs: '--max-pods=6' -Verbose", {}, 6),
        # no -KubeletExtraArgs: no kubelet flags
        ("& $EKSBootstrapScriptFile -EKSClusterName 'demo'", {}, None),
    ],
)
def test_windows_bootstrap_call_forms(call: str, labels: dict[str, str], pods: int | None) -> None:
    boot = standin.parse_user_data(f"<powershell>\n{call}\n</powershell>\n")
    assert (boot.family, boot.labels, boot.max_pods) == ("Windows", labels, pods)


def test_windows_last_bootstrap_call_counts() -> None:
    first = "& $EKSBootstrapScriptFile -EKSClusterName 'demo' -KubeletExtraArgs '--node-labels=x=y --max-pods=3'"
    boot = standin.parse_user_data(WINDOWS.replace("Write-Host 'before'", first))
    assert (boot.labels, boot.taints, boot.max_pods) == (LABELS, TAINTS, 29)


@pytest.mark.parametrize(
    "text,family,labels,pods",
    [
        ("", "Custom", {}, None),
        # PowerShell that never calls the bootstrap script: Windows, without kubelet flags
        ("<powershell>\nWrite-Host 'hello'\n</powershell>\n<persist>true</persist>\n", "Windows", {}, None),
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


_CALL = "& $EKSBootstrapScriptFile -EKSClusterName 'demo'"


@pytest.mark.parametrize(
    "body,message",
    [
        (f"{_CALL} -KubeletExtraArgs '--max-pods=29", "unterminated single-quoted string"),
        (f'{_CALL} -KubeletExtraArgs "--max-pods=29', "unterminated double-quoted string"),
        (f"{_CALL} -KubeletExtraArgs", "-KubeletExtraArgs has no value"),
        (f"{_CALL} -KubeletExtraArgs -DNSClusterIP '10.0.0.10'", "-KubeletExtraArgs has no value"),
        (f"{_CALL} -KubeletExtraArgs '--max-pods=1' -KubeletExtraArgs '--max-pods=2'", "given twice"),
        ("& $EKSBootstrapScriptFile -KubeletExtraArgs '--max-pods=29'", "no -EKSClusterName"),
        (f"{_CALL} -KubeletExtraArgs '--max-pods=many'", "--max-pods is not an integer"),
        (f"{_CALL} -KubeletExtraArgs '--register-with-taints=novalue'", "bad taint"),
        (f"{_CALL} -KubeletExtraArgs '--node-labels=\"a=b'", "cannot split -KubeletExtraArgs"),
    ],
)
def test_malformed_windows_user_data_raises(body: str, message: str) -> None:
    with pytest.raises(standin.UserDataError, match=re.escape(message)):
        standin.parse_user_data(f"<powershell>\n{body}\n</powershell>\n")


def test_windows_user_data_without_closing_tag_raises() -> None:
    with pytest.raises(standin.UserDataError, match="without </powershell>"):
        standin.parse_user_data(WINDOWS.replace("</powershell>", ""))


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
    assert labels["beta.kubernetes.io/os"] == "linux"
    assert "node.kubernetes.io/windows-build" not in labels
    assert node["status"]["nodeInfo"] == {"architecture": "amd64", "operatingSystem": "linux"}
    assert {"type": "InternalIP", "address": "10.0.32.7"} in node["status"]["addresses"]
    assert standin.instance_id_of(node["spec"]["providerID"]) == instance["InstanceId"]


WINDOWS_INSTANCE = {
    "InstanceId": "i-0fedcba9876543210",
    "InstanceType": "m5.large",
    "Architecture": "x86_64",
    "ImageId": "ami-0123456789abcdef0",
    "Placement": {"AvailabilityZone": "us-west-2a"},
    "PrivateIpAddress": "10.0.1.9",
    "PrivateDnsName": "ip-10-0-1-9.us-west-2.compute.internal",
}


def _image_info(name: str, platform: str | None = "windows", description: str = "") -> Any:
    image = {"ImageId": "ami-0123456789abcdef0", "Name": name, "Description": description}
    if platform:
        image["Platform"] = platform
    return standin.ImageInfo.from_api(image)


WIN2022 = _image_info("Windows_Server-2022-English-Core-EKS_Optimized-1.34-2025.11.12")
AL2023_IMAGE = _image_info("amazon-eks-node-al2023-x86_64-standard-1.34-v20251112", platform=None)


@pytest.mark.parametrize(
    "name,build",
    [
        ("Windows_Server-2019-English-Core-EKS_Optimized-1.34-2025.11.12", "10.0.17763"),
        ("Windows_Server-2022-English-Core-EKS_Optimized-1.34-2025.11.12", "10.0.20348"),
        ("Windows_Server-2025-English-Core-EKS_Optimized-1.33-2025.10.15", "10.0.26100"),
        ("Windows_Server-2022-English-Full-Base-2025.11.12", "10.0.20348"),
        ("my-golden-windows-image", None),
    ],
)
def test_windows_build_of_the_image(name: str, build: str | None) -> None:
    info = _image_info(name)
    assert (info.windows, info.windows_build) == (True, build)
    # An image name that tells nothing: its description may.
    described = _image_info(name, description="Microsoft Windows Server 2019 Core optimized for EKS")
    assert described.windows_build == (build or "10.0.17763")
    assert (AL2023_IMAGE.windows, AL2023_IMAGE.windows_build) == (False, None)
    # DescribeImages' PlatformDetails tells Windows as well.
    details = standin.ImageInfo.from_api({"ImageId": "ami-1", "Name": name, "PlatformDetails": "Windows"})
    assert details.windows


@pytest.mark.parametrize(
    "user_data,image,platform,os_name,build,notes",
    [
        (WINDOWS, WIN2022, None, "windows", "10.0.20348", 0),
        (AL2023, AL2023_IMAGE, None, "linux", None, 0),
        ("", WIN2022, None, "windows", "10.0.20348", 0),  # custom user data tells nothing
        (AL2023, WIN2022, None, "windows", "10.0.20348", 1),  # the image wins, and it is logged
        (WINDOWS, AL2023_IMAGE, None, "linux", None, 1),
        (WINDOWS, None, None, "windows", None, 1),  # the image is gone: no build to report
        (AL2, None, "windows", "windows", None, 2),  # the instance's platform, over the user data
        (AL2, None, None, "linux", None, 0),
        ("", None, None, "linux", None, 0),
        (WINDOWS, _image_info("my-windows"), None, "windows", None, 1),
    ],
)
def test_decide_os(user_data: str, image: Any, platform: str | None, os_name: str, build: str | None,
                   notes: int) -> None:
    instance = dict(WINDOWS_INSTANCE, **({"Platform": platform} if platform else {}))
    node_os, got_notes = standin.decide_os(standin.parse_user_data(user_data), image, instance)
    assert (node_os.name, node_os.windows_build) == (os_name, build)
    assert len(got_notes) == notes, got_notes


def test_build_windows_node() -> None:
    name = WINDOWS_INSTANCE["PrivateDnsName"]
    boot = standin.parse_user_data(WINDOWS_MINIMAL)
    node_os, notes = standin.decide_os(boot, WIN2022, WINDOWS_INSTANCE)
    assert notes == []
    node = standin.build_node(WINDOWS_INSTANCE, boot, M5_LARGE, name, "demo", "us-west-2", "usw2-az2",
                              node_os=node_os)
    labels = node["metadata"]["labels"]
    assert labels == labels | {
        "kubernetes.io/os": "windows",
        "beta.kubernetes.io/os": "windows",
        "node.kubernetes.io/windows-build": "10.0.20348",
        "kubernetes.io/arch": "amd64",
        "kubernetes.io/hostname": name,
        "karpenter.sh/capacity-type": "on-demand",
        "karpenter.sh/nodepool": "default",
    }
    assert node["spec"]["taints"] == [{"key": "karpenter.sh/unregistered", "effect": "NoExecute"}]
    assert node["status"]["nodeInfo"] == {"architecture": "amd64", "operatingSystem": "windows"}
    # Capacity and allocatable as for Linux, max pods from the flag.
    linux = standin.build_node(WINDOWS_INSTANCE, boot, M5_LARGE, name, "demo", "us-west-2", "usw2-az2")
    assert node["status"]["capacity"] == linux["status"]["capacity"]
    assert node["status"]["allocatable"] == linux["status"]["allocatable"]
    assert node["status"]["capacity"]["pods"] == node["status"]["allocatable"]["pods"] == "110"
    # Only the OS labels differ from the Linux Node of the same instance.
    linux_labels = linux["metadata"]["labels"]
    assert {k: v for k, v in labels.items() if linux_labels.get(k) != v} == {
        "kubernetes.io/os": "windows",
        "beta.kubernetes.io/os": "windows",
        "node.kubernetes.io/windows-build": "10.0.20348",
    }
    assert set(linux_labels) <= set(labels)


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


class _CountingEC2:
    """An EC2 client that counts the calls made through it."""

    def __init__(self, client: Any):
        self.client = client
        self.meta = client.meta
        self.calls: collections.Counter[str] = collections.Counter()

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.client, name)
        if not callable(attr) or name.startswith("get_"):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            self.calls[name] += 1
            return attr(*args, **kwargs)

        return call


def test_registers_windows_nodes(ec2: Any, kube: Any, launched: dict[str, Any], capsys: Any) -> None:
    windows = "/aws/service/ami-windows-latest/Windows_Server-{}-English-Core-EKS_Optimized-1.34/image_id"
    win = {version: _image(ec2, windows.format(version)) for version in ("2019", "2022", "2025")}
    al2023 = _image(ec2, "/aws/service/eks/optimized-ami/1.34/amazon-linux-2023/x86_64/standard/recommended/image_id")
    image = ec2.describe_images(ImageIds=[win["2022"]])["Images"][0]
    assert (image["Name"], image.get("Platform")) == (
        "Windows_Server-2022-English-Core-EKS_Optimized-1.34-2025.11.12", "windows")
    launch = launched["launch"]
    minimal_labels = {"karpenter.sh/capacity-type": "on-demand", "karpenter.sh/nodepool": "default"}
    unregistered = [{"key": "karpenter.sh/unregistered", "effect": "NoExecute"}]
    # case: (instance, os, Windows build, labels, taints, pods)
    cases = {
        "2022": (launch(WINDOWS, win["2022"], "m5.large"), "windows", "10.0.20348", LABELS, K8S_TAINTS, "29"),
        "2022-minimal": (launch(WINDOWS_MINIMAL, win["2022"], "m5.xlarge"), "windows", "10.0.20348",
                         minimal_labels, unregistered, "110"),
        "2019": (launch(WINDOWS_MINIMAL, win["2019"], "m5.large"), "windows", "10.0.17763",
                 minimal_labels, unregistered, "110"),
        "2025": (launch(WINDOWS, win["2025"], "c5.xlarge"), "windows", "10.0.26100", LABELS, K8S_TAINTS, "29"),
        # The user data and the image disagree: the image wins (and the stand-in says so).
        "al2023-on-windows": (launch(AL2023, win["2022"], "m5.large"), "windows", "10.0.20348",
                              LABELS, K8S_TAINTS, "29"),
        "powershell-on-linux": (launch(WINDOWS, al2023, "m5.large"), "linux", None, LABELS, K8S_TAINTS, "29"),
        "linux": (launch(AL2023, al2023, "m5.large"), "linux", None, LABELS, K8S_TAINTS, "29"),
    }
    broken = launch(f"<powershell>\n{_CALL} -KubeletExtraArgs '--max-pods=many'\n</powershell>",
                    win["2022"], "m5.large")

    counting = _CountingEC2(ec2)
    options = standin.Options(cluster=launched["cluster"], region=ec2.meta.region_name)
    stand_in = standin.StandIn(counting, kube, options)
    result = stand_in.reconcile()

    assert result.errors == [broken["InstanceId"]]
    assert len(result.created) == len(cases)
    assert _node_of(kube, broken) is None
    # One DescribeImages per image, however many instances run it.
    assert counting.calls["describe_images"] == 4, counting.calls
    err = capsys.readouterr().err.splitlines()
    assert any(broken["InstanceId"] in line and "--max-pods is not an integer" in line for line in err), err
    for case, (instance, *_) in cases.items():
        warned = any(instance["InstanceId"] in line and '"level": "warning"' in line for line in err)
        assert warned == (case in ("al2023-on-windows", "powershell-on-linux")), (case, err)

    for case, (instance, os_name, build, labels, taints, pods) in cases.items():
        node = _node_of(kube, instance)
        assert node is not None, case
        meta, spec, status = node["metadata"], node["spec"], node["status"]
        assert meta["labels"] == meta["labels"] | labels | {
            "kubernetes.io/os": os_name,
            "beta.kubernetes.io/os": os_name,
            "kubernetes.io/arch": "amd64",
            "kubernetes.io/hostname": meta["name"],
            "node.kubernetes.io/instance-type": instance["InstanceType"],
        }, case
        assert meta["labels"].get("node.kubernetes.io/windows-build") == build, case
        assert status["nodeInfo"]["operatingSystem"] == os_name, case
        # The node lifecycle controller may add node.kubernetes.io/not-ready until kwok reports Ready.
        own = [t for t in spec.get("taints") or [] if not t["key"].startswith("node.kubernetes.io/")]
        assert own == taints, case
        assert status["capacity"]["pods"] == status["allocatable"]["pods"] == pods, case

    # Nothing new to register: the images are not described again.
    again = stand_in.reconcile()
    assert (again.created, again.deleted, again.errors) == ([], [], [broken["InstanceId"]])
    assert counting.calls["describe_images"] == 4, counting.calls

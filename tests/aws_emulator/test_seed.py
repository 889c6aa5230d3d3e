"""Checks that the local AWS emulator looks like an EKS account with Karpenter.

Runs against a running emulator (hack/moto-up.sh), through boto3 pointed at
$AWS_ENDPOINT_URL:

    eval "$(hack/moto-up.sh)"
    "$(hack/moto-up.sh --venv)"/bin/python -m pytest tests/aws_emulator

CLUSTER_NAME (default karpenter-demo) names the seeded cluster to check.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request

import boto3
import pytest
from botocore.config import Config

CLUSTER = os.environ.get("CLUSTER_NAME") or "karpenter-demo"
DISCOVERY_TAG = "karpenter.sh/discovery"
EKS_OWNER = "602401143452"
WINDOWS_OWNER = "801119661308"  # Amazon's Windows images, the EKS-optimized ones included
WINDOWS_VERSIONS = ["2019", "2022", "2025"]
WINDOWS_PREFIX = "/aws/service/ami-windows-latest"
K8S_MINORS = ["1.32", "1.33", "1.34"]
UP_HINT = 'start it with: eval "$(hack/moto-up.sh)"'
# The emulator is local: talk to it directly even when a proxy is configured.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


@pytest.fixture(scope="session")
def endpoint() -> str:
    url = os.environ.get("AWS_ENDPOINT_URL")
    if not url:
        pytest.fail(
            f"AWS_ENDPOINT_URL is not set; the AWS emulator is needed ({UP_HINT})",
            pytrace=False,
        )
    error = None
    try:
        with _OPENER.open(f"{url}/_karpenter-rs/ready", timeout=5) as resp:
            info = json.load(resp)
    except (urllib.error.URLError, OSError, ValueError) as exc:
        error = exc
    if error is not None:
        pytest.fail(
            f"AWS emulator not answering at AWS_ENDPOINT_URL={url}: {error} ({UP_HINT})",
            pytrace=False,
        )
    if info.get("service") != "karpenter-rs-moto":
        pytest.fail(
            f"AWS_ENDPOINT_URL={url} is not the karpenter-rs AWS emulator: {info}",
            pytrace=False,
        )
    return url


@pytest.fixture(scope="session")
def region() -> str:
    return os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-west-2"


@pytest.fixture(scope="session")
def client(endpoint, region):
    session = boto3.session.Session(
        aws_access_key_id=os.environ.get("AWS_ACCESS_KEY_ID") or "testing",
        aws_secret_access_key=os.environ.get("AWS_SECRET_ACCESS_KEY") or "testing",
        region_name=region,
    )
    cfg = Config(retries={"max_attempts": 2})
    return lambda name: session.client(name, endpoint_url=endpoint, config=cfg)


def discovery(cluster: str = CLUSTER) -> list[dict]:
    return [{"Name": f"tag:{DISCOVERY_TAG}", "Values": [cluster]}]


def image(client, image_id: str) -> dict:
    images = client("ec2").describe_images(ImageIds=[image_id])["Images"]
    assert len(images) == 1, f"DescribeImages({image_id}) returned {images}"
    return images[0]


def test_subnets_by_discovery_tag_span_three_zones(client, region):
    subnets = client("ec2").describe_subnets(Filters=discovery())["Subnets"]
    assert len(subnets) == 3, subnets
    zones = {s["AvailabilityZone"] for s in subnets}
    assert len(zones) == 3 and all(z.startswith(region) for z in zones), zones
    if region == "us-west-2":
        assert zones == {"us-west-2a", "us-west-2b", "us-west-2c"}
    assert len({s["VpcId"] for s in subnets}) == 1
    for s in subnets:
        tags = {t["Key"]: t["Value"] for t in s["Tags"]}
        assert tags[DISCOVERY_TAG] == CLUSTER
        assert tags["Name"]
        assert s["AvailableIpAddressCount"] > 1000


def test_security_group_by_discovery_tag(client):
    ec2 = client("ec2")
    sgs = ec2.describe_security_groups(Filters=discovery())["SecurityGroups"]
    assert len(sgs) == 1, sgs
    vpcs = ec2.describe_vpcs(Filters=discovery())["Vpcs"]
    assert [v["VpcId"] for v in vpcs] == [sgs[0]["VpcId"]]


@pytest.mark.parametrize("arch", ["x86_64", "arm64"])
@pytest.mark.parametrize("k8s", K8S_MINORS)
def test_al2023_parameter_points_at_registered_image(client, k8s, arch):
    name = f"/aws/service/eks/optimized-ami/{k8s}/amazon-linux-2023/{arch}/standard/recommended/image_id"
    image_id = client("ssm").get_parameter(Name=name)["Parameter"]["Value"]
    img = image(client, image_id)
    assert img["Architecture"] == arch
    assert img["OwnerId"] == EKS_OWNER
    assert img["State"] == "available"
    assert img["Name"].startswith(f"amazon-eks-node-al2023-{arch}-standard-{k8s}-v")
    assert img["CreationDate"]

    # The pinned form of the same release resolves to the same image.
    pinned = name.replace("/recommended/", f"/{img['Name']}/")
    assert client("ssm").get_parameter(Name=pinned)["Parameter"]["Value"] == image_id


@pytest.mark.parametrize(
    "path,arch",
    [
        ("amazon-linux-2023/x86_64/nvidia", "x86_64"),
        ("amazon-linux-2023/x86_64/neuron", "x86_64"),
        ("amazon-linux-2023/arm64/nvidia", "arm64"),
        ("amazon-linux-2", "x86_64"),
        ("amazon-linux-2-arm64", "arm64"),
        ("amazon-linux-2-gpu", "x86_64"),
    ],
)
def test_other_eks_optimized_parameters(client, path, arch):
    name = f"/aws/service/eks/optimized-ami/1.34/{path}/recommended/image_id"
    img = image(client, client("ssm").get_parameter(Name=name)["Parameter"]["Value"])
    assert (img["Architecture"], img["OwnerId"]) == (arch, EKS_OWNER)


@pytest.mark.parametrize("flavor", ["", "-nvidia"])
@pytest.mark.parametrize("arch", ["x86_64", "arm64"])
def test_bottlerocket_parameter_points_at_registered_image(client, arch, flavor):
    name = f"/aws/service/bottlerocket/aws-k8s-1.34{flavor}/{arch}/latest/image_id"
    img = image(client, client("ssm").get_parameter(Name=name)["Parameter"]["Value"])
    assert img["Architecture"] == arch
    assert img["OwnerId"] == EKS_OWNER
    assert img["Name"].startswith(f"bottlerocket-aws-k8s-1.34{flavor}-{arch}-v")


def windows_parameter(version: str, k8s: str) -> str:
    return f"{WINDOWS_PREFIX}/Windows_Server-{version}-English-Core-EKS_Optimized-{k8s}/image_id"


@pytest.mark.parametrize("version", WINDOWS_VERSIONS)
@pytest.mark.parametrize("k8s", K8S_MINORS)
def test_windows_parameter_points_at_registered_image(client, k8s, version):
    image_id = client("ssm").get_parameter(Name=windows_parameter(version, k8s))["Parameter"]["Value"]
    img = image(client, image_id)
    assert img["Name"].startswith(f"Windows_Server-{version}-English-Core-EKS_Optimized-{k8s}-")
    assert (img["Architecture"], img["OwnerId"], img["Platform"]) == ("x86_64", WINDOWS_OWNER, "windows")
    assert img["State"] == "available"


def test_windows2022_on_1_34_resolves_to_the_newest_release(client):
    image_id = client("ssm").get_parameter(Name=windows_parameter("2022", "1.34"))["Parameter"]["Value"]
    img = image(client, image_id)
    assert img["Name"] == "Windows_Server-2022-English-Core-EKS_Optimized-1.34-2025.11.12"
    assert img["Platform"] == "windows"
    assert img["PlatformDetails"] == "Windows"
    assert img["UsageOperation"] == "RunInstances:0002"
    assert img["Architecture"] == "x86_64"
    assert img["OwnerId"] == WINDOWS_OWNER
    assert img["ImageOwnerAlias"] == "amazon"
    assert img["BootMode"] == "legacy-bios"
    assert img["RootDeviceName"] == "/dev/sda1"
    assert img["Public"] is True
    assert img["CreationDate"].startswith("2025-11-12")
    assert "Windows Server 2022" in img["Description"]

    # The platform filter and the owner find it, as they do on EC2.
    windows = client("ec2").describe_images(
        Owners=[WINDOWS_OWNER], Filters=[{"Name": "platform", "Values": ["windows"]}]
    )["Images"]
    assert image_id in {i["ImageId"] for i in windows}
    assert len(windows) == len(K8S_MINORS) * len(WINDOWS_VERSIONS) * 2


def test_older_windows_release_is_describable_by_name(client):
    latest = client("ssm").get_parameter(Name=windows_parameter("2022", "1.34"))["Parameter"]["Value"]
    name = "Windows_Server-2022-English-Core-EKS_Optimized-1.34-2025.10.15"
    found = client("ec2").describe_images(
        Owners=[WINDOWS_OWNER], Filters=[{"Name": "name", "Values": [name]}]
    )["Images"]
    assert len(found) == 1, found
    older = found[0]
    assert older["ImageId"] != latest
    assert (older["Platform"], older["Architecture"]) == ("windows", "x86_64")
    assert older["CreationDate"] < image(client, latest)["CreationDate"]
    # Both releases match the family's name pattern, newest last by creation date.
    both = client("ec2").describe_images(
        Owners=[WINDOWS_OWNER],
        Filters=[{"Name": "name", "Values": ["Windows_Server-2022-English-Core-EKS_Optimized-1.34-*"]}],
    )["Images"]
    assert [i["ImageId"] for i in sorted(both, key=lambda i: i["CreationDate"])] == [older["ImageId"], latest]


@pytest.mark.parametrize(
    "parameter",
    [
        "/aws/service/eks/optimized-ami/1.34/amazon-linux-2023/x86_64/standard/recommended/image_id",
        "/aws/service/eks/optimized-ami/1.34/amazon-linux-2/recommended/image_id",
        "/aws/service/bottlerocket/aws-k8s-1.34/arm64/latest/image_id",
    ],
)
def test_linux_images_have_no_platform(client, parameter):
    img = image(client, client("ssm").get_parameter(Name=parameter)["Parameter"]["Value"])
    assert "Platform" not in img, img
    assert img["PlatformDetails"] == "Linux/UNIX"
    assert img["UsageOperation"] == "RunInstances"
    assert img["OwnerId"] == EKS_OWNER


def test_eks_images_listed_by_owner(client):
    images = client("ec2").describe_images(Owners=[EKS_OWNER])["Images"]
    names = {i["Name"] for i in images}
    assert len(images) >= 3 * 12
    assert any(n.startswith("amazon-eks-node-al2023-arm64-standard-1.34-") for n in names)
    assert any(n.startswith("bottlerocket-aws-k8s-1.34-x86_64-") for n in names)
    assert not any(n.startswith("Windows_Server-") for n in names), "Windows images are Amazon's, not EKS's"
    assert all("Platform" not in i for i in images)


def test_eks_cluster(client, region):
    cluster = client("eks").describe_cluster(name=CLUSTER)["cluster"]
    assert cluster["name"] == CLUSTER
    assert cluster["status"] == "ACTIVE"
    assert cluster["version"] == os.environ.get("EKS_CLUSTER_VERSION", "1.34")
    assert cluster["endpoint"]
    assert cluster["certificateAuthority"]["data"]
    subnets = client("ec2").describe_subnets(Filters=discovery())["Subnets"]
    assert sorted(cluster["resourcesVpcConfig"]["subnetIds"]) == sorted(s["SubnetId"] for s in subnets)


def test_interruption_queue(client):
    url = client("sqs").get_queue_url(QueueName=CLUSTER)["QueueUrl"]
    assert url.rstrip("/").endswith(f"/{CLUSTER}")


def test_node_role(client):
    role = client("iam").get_role(RoleName=f"KarpenterNodeRole-{CLUSTER}")["Role"]
    assert "ec2.amazonaws.com" in json.dumps(role["AssumeRolePolicyDocument"])
    attached = client("iam").list_attached_role_policies(RoleName=role["RoleName"])
    names = {p["PolicyName"] for p in attached["AttachedPolicies"]}
    assert "AmazonEKSWorkerNodePolicy" in names


def test_instance_types(client):
    ec2 = client("ec2")
    pages = ec2.get_paginator("describe_instance_types").paginate()
    types = {t["InstanceType"]: t for page in pages for t in page["InstanceTypes"]}
    assert len(types) > 300
    assert "x86_64" in types["m5.large"]["ProcessorInfo"]["SupportedArchitectures"]
    assert "arm64" in types["m6g.large"]["ProcessorInfo"]["SupportedArchitectures"]
    assert types["m5.large"]["VCpuInfo"]["DefaultVCpus"] == 2
    assert types["m5.large"]["MemoryInfo"]["SizeInMiB"] == 8192


def test_seed_endpoint_is_idempotent_and_takes_other_clusters(endpoint, client, region):
    def seed(name):
        req = urllib.request.Request(
            f"{endpoint}/_karpenter-rs/seed",
            data=json.dumps({"clusters": [name], "region": region}).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        with _OPENER.open(req, timeout=60) as resp:
            return json.load(resp)["seeded"][0]

    other = "krs-emulator-test"
    first = seed(other)
    again = seed(other)
    assert first == again
    subnets = client("ec2").describe_subnets(Filters=discovery(other))["Subnets"]
    assert sorted(s["SubnetId"] for s in subnets) == sorted(first["subnet_ids"])
    assert client("eks").describe_cluster(name=other)["cluster"]["name"] == other
    # Seeding the default cluster again does not duplicate anything either.
    seed(CLUSTER)
    assert len(client("ec2").describe_subnets(Filters=discovery())["Subnets"]) == 3


def test_publishing_a_newer_eks_release(endpoint, client, region):
    def publish(release):
        req = urllib.request.Request(
            f"{endpoint}/_karpenter-rs/publish-eks-release",
            data=json.dumps({"release": release, "region": region}).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        with _OPENER.open(req, timeout=60) as resp:
            return json.load(resp)

    def recommended(path):
        name = f"/aws/service/eks/optimized-ami/1.34/{path}/recommended/image_id"
        return client("ssm").get_parameter(Name=name)["Parameter"]["Value"]

    al2023 = "amazon-linux-2023/x86_64/standard"
    before = {p: recommended(p) for p in (al2023, "amazon-linux-2")}
    try:
        first = publish("v20251201")
        assert first["added"], "the release's images are new"
        img = image(client, recommended(al2023))
        assert img["Name"] == "amazon-eks-node-al2023-x86_64-standard-1.34-v20251201"
        assert img["OwnerId"] == EKS_OWNER
        assert img["CreationDate"].startswith("2025-12-01")
        assert image(client, recommended("amazon-linux-2"))["Name"] == "amazon-eks-node-1.34-v20251201"
        assert publish("v20251201")["added"] == [], "publishing again adds nothing"
    finally:
        restored = publish("v20251101")
    assert {p: recommended(p) for p in before} == before, "the catalog's release is recommended again"
    assert restored["withdrawn"], "the published release's images are withdrawn"
    newer = client("ec2").describe_images(
        Owners=[EKS_OWNER], Filters=[{"Name": "name", "Values": ["amazon-eks-*-v20251201"]}]
    )["Images"]
    assert newer == []

    req = urllib.request.Request(
        f"{endpoint}/_karpenter-rs/publish-eks-release",
        data=json.dumps({"release": "latest"}).encode(),
        method="POST",
    )
    with pytest.raises(urllib.error.HTTPError) as bad:
        _OPENER.open(req, timeout=10)
    assert bad.value.code == 400


@pytest.mark.parametrize("capacity", ["on-demand", "spot"])
def test_fleet_instances_get_the_launch_template_security_groups(client, capacity):
    ec2 = client("ec2")
    sg = ec2.describe_security_groups(Filters=discovery())["SecurityGroups"][0]["GroupId"]
    subnet = ec2.describe_subnets(Filters=discovery())["Subnets"][0]["SubnetId"]
    name = f"krs-emulator-fleet-sg-{capacity}"
    template = ec2.create_launch_template(
        LaunchTemplateName=name,
        LaunchTemplateData={"ImageId": "ami-d189e901b8c3538c9", "SecurityGroupIds": [sg]},
    )["LaunchTemplate"]["LaunchTemplateId"]
    try:
        fleet = ec2.create_fleet(
            Type="instant",
            TargetCapacitySpecification={"TotalTargetCapacity": 1, "DefaultTargetCapacityType": capacity},
            LaunchTemplateConfigs=[{
                "LaunchTemplateSpecification": {"LaunchTemplateId": template, "Version": "$Latest"},
                "Overrides": [{"InstanceType": "m5.large", "SubnetId": subnet}],
            }],
        )
        ids = [i for group in fleet["Instances"] for i in group["InstanceIds"]]
        assert len(ids) == 1, fleet
        described = ec2.describe_instances(InstanceIds=ids)["Reservations"][0]["Instances"][0]
        assert [g["GroupId"] for g in described["SecurityGroups"]] == [sg]
        ec2.terminate_instances(InstanceIds=ids)
    finally:
        ec2.delete_launch_template(LaunchTemplateId=template)


def test_instance_status_checks_can_be_set_impaired(endpoint, client):
    ec2 = client("ec2")
    subnet = ec2.describe_subnets(Filters=discovery())["Subnets"][0]["SubnetId"]
    instance = ec2.run_instances(
        ImageId="ami-d189e901b8c3538c9", MinCount=1, MaxCount=1, InstanceType="m5.large", SubnetId=subnet
    )["Instances"][0]["InstanceId"]

    def set_status(body):
        req = urllib.request.Request(
            f"{endpoint}/_karpenter-rs/instance-status",
            data=json.dumps({"instance_id": instance, **body}).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        with _OPENER.open(req, timeout=10) as resp:
            return json.load(resp)

    def status():
        return ec2.describe_instance_status(InstanceIds=[instance])["InstanceStatuses"][0]

    try:
        assert status()["SystemStatus"]["Status"] == "ok"
        set_status({"check": "system", "status": "impaired", "impaired_since": "2026-11-24T12:00:00Z"})
        got = status()
        assert got["SystemStatus"]["Status"] == "impaired"
        detail = got["SystemStatus"]["Details"][0]
        assert detail["Status"] == "failed"
        assert detail["ImpairedSince"].isoformat().startswith("2026-11-24T12:00:00")
        assert got["InstanceStatus"]["Status"] == "ok", "the other check is untouched"

        def filtered(name, values):
            answer = ec2.describe_instance_status(Filters=[{"Name": name, "Values": values}])
            return [s["InstanceId"] for s in answer["InstanceStatuses"]]

        assert filtered("system-status.status", ["impaired"]) == [instance]
        assert instance not in filtered("instance-status.status", ["impaired"])
        assert instance in filtered("instance-status.status", ["ok"])
        assert filtered("event.code", ["system-maintenance"]) == []
        set_status({"check": "system", "status": "ok"})
        assert status()["SystemStatus"]["Status"] == "ok"
        with pytest.raises(urllib.error.HTTPError) as bad:
            set_status({"check": "disk"})
        assert bad.value.code == 400
    finally:
        ec2.terminate_instances(InstanceIds=[instance])

"""EC2 placement groups in the AWS emulator (hack/moto/placement.py), which moto lacks.

Most tests run against the running emulator (hack/moto-up.sh), through boto3 pointed at
$AWS_ENDPOINT_URL, as the controller's calls reach it: the placement-group actions, and
instances launched by CreateFleet and RunInstances into a group. They name their groups and
launch templates uniquely and remove what they made. The call-log and reset tests run an
emulator of their own in this process (moto behind the call log and the placement-group
middleware, as hack/moto/server.py composes them), since they switch its call log and reset it.

    eval "$(hack/moto-up.sh)"
    "$(hack/moto-up.sh --venv)"/bin/python -m pytest tests/aws_emulator/test_placement_groups.py
"""

from __future__ import annotations

import json
import os
import re
import sys
import threading
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any, Iterator

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "hack" / "moto"))
sys.dont_write_bytecode = True

import call_log  # noqa: E402
import placement  # noqa: E402

CLUSTER = os.environ.get("CLUSTER_NAME") or "karpenter-demo"
REGION = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-west-2"
ACCOUNT = os.environ.get("MOTO_ACCOUNT_ID") or "123456789012"  # moto's default account
UP_HINT = 'start it with: eval "$(hack/moto-up.sh)"'
GROUP_ID = re.compile(r"^pg-[0-9a-f]{17}$")
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


# -- the running emulator --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def endpoint() -> str:
    url = os.environ.get("AWS_ENDPOINT_URL")
    if not url:
        pytest.fail(f"AWS_ENDPOINT_URL is not set; the AWS emulator is needed ({UP_HINT})", pytrace=False)
    try:
        with _OPENER.open(f"{url}/_karpenter-rs/ready", timeout=5) as answer:
            info = json.load(answer)
    except (urllib.error.URLError, OSError, ValueError) as exc:
        pytest.fail(f"AWS emulator not answering at AWS_ENDPOINT_URL={url}: {exc} ({UP_HINT})", pytrace=False)
    if info.get("service") != "karpenter-rs-moto":
        pytest.fail(f"AWS_ENDPOINT_URL={url} is not the karpenter-rs AWS emulator: {info}", pytrace=False)
    return url


def ec2_client(endpoint: str, controller: bool = False, region: str = REGION):
    session = boto3.session.Session(
        aws_access_key_id=os.environ.get("AWS_ACCESS_KEY_ID") or "testing",
        aws_secret_access_key=os.environ.get("AWS_SECRET_ACCESS_KEY") or "testing",
        region_name=region,
    )
    config = Config(retries={"mode": "standard", "total_max_attempts": 1}, proxies={},
                    user_agent_appid=call_log.CONTROLLER_APP if controller else None)
    return session.client("ec2", endpoint_url=endpoint, config=config)


@pytest.fixture(scope="module")
def ec2(endpoint):
    return ec2_client(endpoint)


class Made:
    """What a test made in the shared emulator, removed afterwards."""

    def __init__(self, ec2):
        self.ec2 = ec2
        self.groups: list[str] = []
        self.templates: list[str] = []
        self.instances: list[str] = []

    def group(self, strategy: str, **kwargs: Any) -> dict:
        name = kwargs.pop("GroupName", None) or f"pg-test-{strategy}-{uuid.uuid4().hex[:12]}"
        group = self.ec2.create_placement_group(GroupName=name, Strategy=strategy, **kwargs)["PlacementGroup"]
        self.groups.append(name)
        return group

    def template(self, image: str, placement: dict | None = None) -> dict:
        data: dict[str, Any] = {"ImageId": image}
        if placement is not None:
            data["Placement"] = placement
        template = self.ec2.create_launch_template(
            LaunchTemplateName=f"pg-test-{uuid.uuid4().hex[:16]}", LaunchTemplateData=data)["LaunchTemplate"]
        self.templates.append(template["LaunchTemplateId"])
        return template

    def fleet(self, template: dict, subnet: str, count: int = 1, capacity: str = "on-demand") -> dict:
        answer = self.ec2.create_fleet(
            Type="instant",
            TargetCapacitySpecification={"TotalTargetCapacity": count, "DefaultTargetCapacityType": capacity},
            LaunchTemplateConfigs=[{
                "LaunchTemplateSpecification": {"LaunchTemplateId": template["LaunchTemplateId"], "Version": "$Latest"},
                "Overrides": [{"InstanceType": "m5.large", "SubnetId": subnet}],
            }],
        )
        self.instances += [i for launched in answer.get("Instances", []) for i in launched["InstanceIds"]]
        return answer

    def run(self, **kwargs: Any) -> list[dict]:
        instances = self.ec2.run_instances(MinCount=kwargs.pop("MinCount", 1), MaxCount=kwargs.pop("MaxCount", 1),
                                           **kwargs)["Instances"]
        self.instances += [i["InstanceId"] for i in instances]
        return instances

    def placements(self, instance_ids: list[str]) -> dict[str, dict]:
        reservations = self.ec2.describe_instances(InstanceIds=instance_ids)["Reservations"]
        return {i["InstanceId"]: i["Placement"] for r in reservations for i in r["Instances"]}

    def remove(self) -> None:
        if self.instances:
            self.ec2.terminate_instances(InstanceIds=self.instances)
        for template in self.templates:
            self.ec2.delete_launch_template(LaunchTemplateId=template)
        for name in self.groups:
            try:
                self.ec2.delete_placement_group(GroupName=name)
            except ClientError as error:
                assert error.response["Error"]["Code"] == "InvalidPlacementGroup.Unknown", error


@pytest.fixture
def made(ec2) -> Iterator[Made]:
    made = Made(ec2)
    try:
        yield made
    finally:
        made.remove()


@pytest.fixture(scope="module")
def image(ec2) -> str:
    return ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]


@pytest.fixture(scope="module")
def subnet(ec2) -> str:
    subnets = ec2.describe_subnets(Filters=[{"Name": "tag:karpenter.sh/discovery", "Values": [CLUSTER]}])["Subnets"]
    assert subnets, f"no subnet of the seeded cluster {CLUSTER}"
    return sorted(subnets, key=lambda s: s["AvailabilityZone"])[0]["SubnetId"]


def error_of(call) -> tuple[int, str, str]:
    with pytest.raises(ClientError) as raised:
        call()
    response = raised.value.response
    return response["ResponseMetadata"]["HTTPStatusCode"], response["Error"]["Code"], response["Error"]["Message"]


# -- creating, describing, deleting -------------------------------------------------------------------


def test_each_strategy_creates_an_available_group(ec2, made) -> None:
    tags = [{"Key": "team", "Value": "data"}, {"Key": "karpenter.sh/discovery", "Value": CLUSTER}]
    cluster = made.group("cluster", TagSpecifications=[{"ResourceType": "placement-group", "Tags": tags}])
    partition = made.group("partition", PartitionCount=3)
    spread = made.group("spread")
    host_spread = made.group("spread", SpreadLevel="host")
    two = made.group("partition")

    for group, strategy in ((cluster, "cluster"), (partition, "partition"), (spread, "spread")):
        assert GROUP_ID.match(group["GroupId"]), group
        assert group["State"] == "available"
        assert group["Strategy"] == strategy
        assert group["GroupArn"] == f"arn:aws:ec2:{REGION}:{ACCOUNT}:placement-group/{group['GroupName']}"
    assert {t["Key"]: t["Value"] for t in cluster["Tags"]} == {"team": "data", "karpenter.sh/discovery": CLUSTER}
    assert partition["Tags"] == [] and spread["Tags"] == []
    # Only a partition group has partitions, only a spread group a spread level.
    assert partition["PartitionCount"] == 3 and two["PartitionCount"] == 2
    assert "PartitionCount" not in cluster and "PartitionCount" not in spread
    assert spread["SpreadLevel"] == "rack" and host_spread["SpreadLevel"] == "host"
    assert "SpreadLevel" not in cluster and "SpreadLevel" not in partition
    assert len({g["GroupId"] for g in (cluster, partition, spread, host_spread, two)}) == 5


def test_a_name_is_taken_once(ec2, made) -> None:
    group = made.group("cluster")
    status, code, message = error_of(lambda: ec2.create_placement_group(GroupName=group["GroupName"],
                                                                        Strategy="spread"))
    assert (status, code) == (400, "InvalidPlacementGroup.Duplicate")
    assert message == f"The Placement Group '{group['GroupName']}' already exists."
    described = ec2.describe_placement_groups(GroupNames=[group["GroupName"]])["PlacementGroups"]
    assert [g["Strategy"] for g in described] == ["cluster"]


@pytest.mark.parametrize("arguments,code", [
    ({"Strategy": "tight"}, "InvalidParameterValue"),
    ({"Strategy": "partition", "PartitionCount": 8}, "InvalidParameterValue"),
    ({"Strategy": "partition", "PartitionCount": 0}, "InvalidParameterValue"),
    ({"Strategy": "spread", "SpreadLevel": "row"}, "InvalidParameterValue"),
    ({"Strategy": "cluster", "PartitionCount": 2}, "InvalidParameterCombination"),
    ({"Strategy": "cluster", "TagSpecifications": [{"ResourceType": "instance", "Tags": [{"Key": "a", "Value": "b"}]}]},
     "InvalidParameterValue"),
])
def test_parameters_ec2_refuses(ec2, arguments: dict, code: str) -> None:
    name = f"pg-test-bad-{uuid.uuid4().hex[:12]}"
    status, got, _ = error_of(lambda: ec2.create_placement_group(GroupName=name, **arguments))
    assert (status, got) == (400, code)
    assert error_of(lambda: ec2.describe_placement_groups(GroupNames=[name]))[1] == "InvalidPlacementGroup.Unknown"


def test_describe_by_name_and_by_id_as_karpenter_does(ec2, made) -> None:
    group = made.group("partition", PartitionCount=4)
    other = made.group("cluster")
    available = [{"Name": "state", "Values": ["available"]}]

    by_name = ec2.describe_placement_groups(GroupNames=[group["GroupName"]], Filters=available)["PlacementGroups"]
    by_id = ec2.describe_placement_groups(GroupIds=[group["GroupId"]], Filters=available)["PlacementGroups"]
    assert by_name == by_id == [group]
    both = ec2.describe_placement_groups(GroupIds=[other["GroupId"], group["GroupId"]])["PlacementGroups"]
    assert {g["GroupName"] for g in both} == {group["GroupName"], other["GroupName"]}
    # A group that is not in the state asked for is not listed.
    pending = ec2.describe_placement_groups(GroupNames=[group["GroupName"]],
                                            Filters=[{"Name": "state", "Values": ["pending"]}])
    assert pending["PlacementGroups"] == []
    everything = {g["GroupName"] for g in ec2.describe_placement_groups()["PlacementGroups"]}
    assert {group["GroupName"], other["GroupName"]} <= everything


def test_describe_filters(ec2, made) -> None:
    marker = uuid.uuid4().hex[:12]
    tagged = made.group("spread", GroupName=f"pg-test-filters-{marker}-a", TagSpecifications=[
        {"ResourceType": "placement-group", "Tags": [{"Key": "marker", "Value": marker}]}])
    partition = made.group("partition", GroupName=f"pg-test-filters-{marker}-b", PartitionCount=5)
    ours = {tagged["GroupName"], partition["GroupName"]}

    def names(*filters: tuple[str, list[str]]) -> set[str]:
        found = ec2.describe_placement_groups(Filters=[{"Name": n, "Values": v} for n, v in filters])
        return {g["GroupName"] for g in found["PlacementGroups"]} & ours

    assert names(("group-name", [f"pg-test-filters-{marker}-*"])) == ours
    assert names(("group-name", [f"pg-test-filters-{marker}-?"]), ("strategy", ["partition"])) == {
        partition["GroupName"]}
    assert names(("group-id", [tagged["GroupId"]])) == {tagged["GroupName"]}
    assert names(("group-arn", [partition["GroupArn"]])) == {partition["GroupName"]}
    assert names(("strategy", ["spread", "cluster"])) == {tagged["GroupName"]}
    assert names(("spread-level", ["rack"])) == {tagged["GroupName"]}
    assert names(("partition-count", ["5"])) == {partition["GroupName"]}
    assert names(("tag:marker", [marker])) == {tagged["GroupName"]}
    assert names(("tag-key", ["marker"])) == {tagged["GroupName"]}
    assert names(("state", ["available"])) == ours
    assert names(("state", ["deleted"])) == set()
    status, code, _ = error_of(lambda: ec2.describe_placement_groups(
        Filters=[{"Name": "colour", "Values": ["blue"]}]))
    assert (status, code) == (400, "InvalidParameterValue")


def test_unknown_names_and_ids(ec2, made) -> None:
    group = made.group("cluster")
    missing_name = f"pg-test-missing-{uuid.uuid4().hex[:12]}"
    missing_id = "pg-0123456789abcdef0"
    for call, reference in (
        (lambda: ec2.describe_placement_groups(GroupNames=[missing_name]), missing_name),
        (lambda: ec2.describe_placement_groups(GroupIds=[missing_id]), missing_id),
        (lambda: ec2.describe_placement_groups(GroupNames=[group["GroupName"], missing_name]), missing_name),
        (lambda: ec2.describe_placement_groups(GroupNames=[missing_name],
                                               Filters=[{"Name": "state", "Values": ["available"]}]), missing_name),
        (lambda: ec2.delete_placement_group(GroupName=missing_name), missing_name),
    ):
        assert error_of(call) == (400, "InvalidPlacementGroup.Unknown",
                                  f"The Placement Group '{reference}' is unknown.")


def test_delete(ec2, made, image, subnet) -> None:
    group = made.group("spread")
    ec2.delete_placement_group(GroupName=group["GroupName"])
    assert error_of(lambda: ec2.describe_placement_groups(GroupIds=[group["GroupId"]]))[1] == \
        "InvalidPlacementGroup.Unknown"
    assert group["GroupName"] not in {g["GroupName"] for g in ec2.describe_placement_groups()["PlacementGroups"]}

    # A group with running instances is in use; once they are terminated it can go.
    busy = made.group("cluster")
    instances = made.run(ImageId=image, InstanceType="m5.large", SubnetId=subnet,
                         Placement={"GroupName": busy["GroupName"]})
    assert error_of(lambda: ec2.delete_placement_group(GroupName=busy["GroupName"])) == (
        400, "InvalidPlacementGroup.InUse", f"The placement group '{busy['GroupName']}' is in use and may not be deleted.")
    ec2.terminate_instances(InstanceIds=[i["InstanceId"] for i in instances])
    ec2.delete_placement_group(GroupName=busy["GroupName"])


def test_dry_runs(ec2, made) -> None:
    group = made.group("cluster")
    for call in (
        lambda: ec2.describe_placement_groups(DryRun=True),
        lambda: ec2.create_placement_group(DryRun=True, GroupName=f"pg-test-{uuid.uuid4().hex[:12]}", Strategy="spread"),
        lambda: ec2.delete_placement_group(DryRun=True, GroupName=group["GroupName"]),
    ):
        assert error_of(call)[:2] == (412, "DryRunOperation")
    assert ec2.describe_placement_groups(GroupNames=[group["GroupName"]])["PlacementGroups"]


# -- instances in a group ---------------------------------------------------------------------------


def test_create_fleet_from_a_template_with_a_partition_number(ec2, made, image, subnet) -> None:
    group = made.group("partition", PartitionCount=4)
    template = made.template(image, {"GroupId": group["GroupId"], "PartitionNumber": 3})
    answer = made.fleet(template, subnet, count=2)
    assert not answer.get("Errors")
    launched = [i for item in answer["Instances"] for i in item["InstanceIds"]]
    assert len(launched) == 2
    for found in made.placements(launched).values():
        assert found["GroupName"] == group["GroupName"]
        assert found["GroupId"] == group["GroupId"]
        assert found["PartitionNumber"] == 3


def test_create_fleet_takes_the_partitions_in_turn(ec2, made, image, subnet) -> None:
    group = made.group("partition", PartitionCount=2)
    template = made.template(image, {"GroupId": group["GroupId"]})
    first = made.fleet(template, subnet, count=3)
    second = made.fleet(template, subnet, count=1)
    launched = [i for answer in (first, second) for item in answer["Instances"] for i in item["InstanceIds"]]
    placements = made.placements(launched)
    assert [placements[i]["PartitionNumber"] for i in launched] == [1, 2, 1, 2]
    assert {placements[i]["GroupId"] for i in launched} == {group["GroupId"]}


def test_create_fleet_by_group_name_and_spot(ec2, made, image, subnet) -> None:
    group = made.group("cluster")
    template = made.template(image, {"GroupName": group["GroupName"]})
    on_demand = made.fleet(template, subnet)
    spot = made.fleet(template, subnet, capacity="spot")
    launched = [i for answer in (on_demand, spot) for item in answer["Instances"] for i in item["InstanceIds"]]
    assert len(launched) == 2
    for found in made.placements(launched).values():
        assert (found["GroupName"], found["GroupId"]) == (group["GroupName"], group["GroupId"])
        assert "PartitionNumber" not in found  # not a partition group


def test_run_instances_into_a_group(ec2, made, image, subnet) -> None:
    spread = made.group("spread")
    partition = made.group("partition", PartitionCount=3)

    # The request's own placement; its answer already shows the group.
    answer = made.run(ImageId=image, InstanceType="m5.large", SubnetId=subnet, Placement={"GroupName": spread["GroupName"]})
    assert answer[0]["Placement"]["GroupName"] == spread["GroupName"]
    assert made.placements([answer[0]["InstanceId"]])[answer[0]["InstanceId"]]["GroupId"] == spread["GroupId"]

    # The launch template's placement, partitions in turn.
    template = made.template(image, {"GroupId": partition["GroupId"]})
    spec = {"LaunchTemplateId": template["LaunchTemplateId"], "Version": "$Latest"}
    several = made.run(LaunchTemplate=spec, InstanceType="m5.large", SubnetId=subnet, MinCount=4, MaxCount=4)
    found = made.placements([i["InstanceId"] for i in several])
    assert [found[i["InstanceId"]]["PartitionNumber"] for i in several] == [1, 2, 3, 1]
    assert {found[i["InstanceId"]]["GroupName"] for i in several} == {partition["GroupName"]}

    # The request's partition number over the template's group.
    numbered = made.run(LaunchTemplate=spec, InstanceType="m5.large", SubnetId=subnet,
                        Placement={"PartitionNumber": 2})
    assert made.placements([numbered[0]["InstanceId"]])[numbered[0]["InstanceId"]]["PartitionNumber"] == 2
    status, code, _ = error_of(lambda: ec2.run_instances(LaunchTemplate=spec, InstanceType="m5.large",
                                                          SubnetId=subnet, MinCount=1, MaxCount=1,
                                                          Placement={"PartitionNumber": 4}))
    assert (status, code) == (400, "InvalidParameterValue")

    # Instances are found by their group's name.
    reservations = ec2.describe_instances(Filters=[{"Name": "placement-group-name", "Values": [spread["GroupName"]]}])
    assert [i["InstanceId"] for r in reservations["Reservations"] for i in r["Instances"]] == [answer[0]["InstanceId"]]


def test_an_instance_without_a_group_is_as_moto_has_it(ec2, made, image, subnet) -> None:
    template = made.template(image, {"Tenancy": "default"})
    answer = made.fleet(template, subnet)
    launched = [i for item in answer["Instances"] for i in item["InstanceIds"]]
    found = made.placements(launched)[launched[0]]
    assert found.get("GroupName", "") == "" and "GroupId" not in found and "PartitionNumber" not in found


def test_a_launch_into_an_unknown_group_fails_as_on_ec2(ec2, made, image, subnet) -> None:
    missing_id = "pg-0123456789abcdef0"
    template = made.template(image, {"GroupId": missing_id})

    answer = made.fleet(template, subnet)
    assert answer["FleetId"].startswith("fleet-")
    assert not answer.get("Instances")
    assert answer["Errors"] == [{
        "LaunchTemplateAndOverrides": {
            "LaunchTemplateSpecification": {"LaunchTemplateId": template["LaunchTemplateId"], "Version": "$Latest"},
            "Overrides": {"InstanceType": "m5.large", "SubnetId": subnet},
        },
        "Lifecycle": "on-demand",
        "ErrorCode": "InvalidPlacementGroup.Unknown",
        "ErrorMessage": f"The Placement Group '{missing_id}' is unknown.",
    }]

    missing_name = f"pg-test-missing-{uuid.uuid4().hex[:12]}"
    for kwargs, reference in (
        ({"LaunchTemplate": {"LaunchTemplateId": template["LaunchTemplateId"]}}, missing_id),
        ({"ImageId": image, "Placement": {"GroupName": missing_name}}, missing_name),
    ):
        assert error_of(lambda: ec2.run_instances(InstanceType="m5.large", SubnetId=subnet, MinCount=1, MaxCount=1,
                                                  **kwargs)) == (
            400, "InvalidPlacementGroup.Unknown", f"The Placement Group '{reference}' is unknown.")

    # A dry run is moto's: it would have succeeded.
    assert error_of(lambda: ec2.run_instances(DryRun=True, ImageId=image, InstanceType="m5.large", SubnetId=subnet,
                                              MinCount=1, MaxCount=1, Placement={"GroupName": missing_name}))[1] == \
        "DryRunOperation"


def test_a_fleet_launches_from_the_overrides_whose_group_exists(ec2, made, image, subnet) -> None:
    group = made.group("partition", PartitionCount=2)
    good = made.template(image, {"GroupId": group["GroupId"]})
    bad = made.template(image, {"GroupName": f"pg-test-missing-{uuid.uuid4().hex[:12]}"})
    answer = ec2.create_fleet(
        Type="instant",
        TargetCapacitySpecification={"TotalTargetCapacity": 1, "DefaultTargetCapacityType": "on-demand"},
        LaunchTemplateConfigs=[
            {"LaunchTemplateSpecification": {"LaunchTemplateId": bad["LaunchTemplateId"], "Version": "$Latest"},
             "Overrides": [{"InstanceType": "m5.large", "SubnetId": subnet}]},
            {"LaunchTemplateSpecification": {"LaunchTemplateId": good["LaunchTemplateId"], "Version": "$Latest"},
             "Overrides": [{"InstanceType": "c5.large", "SubnetId": subnet},
                           {"InstanceType": "m5.xlarge", "SubnetId": subnet,
                            "Placement": {"GroupName": f"pg-test-missing-{uuid.uuid4().hex[:12]}"}}]},
        ],
    )
    made.instances += [i for item in answer.get("Instances", []) for i in item["InstanceIds"]]
    errors = {(e["LaunchTemplateAndOverrides"]["LaunchTemplateSpecification"]["LaunchTemplateId"],
               e["LaunchTemplateAndOverrides"]["Overrides"]["InstanceType"], e["ErrorCode"]) for e in answer["Errors"]}
    assert errors == {(bad["LaunchTemplateId"], "m5.large", "InvalidPlacementGroup.Unknown"),
                      (good["LaunchTemplateId"], "m5.xlarge", "InvalidPlacementGroup.Unknown")}
    assert [(i["InstanceType"], i["LaunchTemplateAndOverrides"]["LaunchTemplateSpecification"]["LaunchTemplateId"])
            for i in answer["Instances"]] == [("c5.large", good["LaunchTemplateId"])]
    found = made.placements(answer["Instances"][0]["InstanceIds"])
    assert [(p["GroupId"], p["PartitionNumber"]) for p in found.values()] == [(group["GroupId"], 1)]


# -- the call log, and a reset (an emulator of this process) ----------------------------------------


@pytest.fixture(scope="module")
def own_emulator(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("NO_PROXY", "127.0.0.1,localhost")
        mp.setenv("no_proxy", "127.0.0.1,localhost")
        mp.delenv("MOTO_ACCOUNT_ID", raising=False)
        from moto.moto_server.werkzeug_app import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
        from werkzeug.serving import make_server

        recorder = call_log.CallRecorder(placement.PlacementGroups(DomainDispatcherApplication(create_backend_app)))
        server = make_server("127.0.0.1", 0, recorder, threaded=True, request_handler=MotoRequestHandler)
        server.daemon_threads = True
        thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        thread.start()
        try:
            yield f"http://127.0.0.1:{server.server_port}", recorder, tmp_path_factory.mktemp("calls") / "calls.jsonl"
        finally:
            server.shutdown()
            server.server_close()


def test_the_call_log_models_placement_groups(own_emulator) -> None:
    endpoint, recorder, log = own_emulator
    ec2 = ec2_client(endpoint)  # the test's own calls: not recorded
    controller = ec2_client(endpoint, controller=True)
    group = ec2.create_placement_group(GroupName="hpc", Strategy="partition", PartitionCount=2, TagSpecifications=[
        {"ResourceType": "placement-group", "Tags": [{"Key": "kubernetes.io/cluster/demo", "Value": "owned"}]}],
    )["PlacementGroup"]
    image = ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
    vpc = ec2.create_vpc(CidrBlock="10.0.0.0/16")["Vpc"]["VpcId"]
    subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="10.0.0.0/19", AvailabilityZone=f"{REGION}a")["Subnet"]["SubnetId"]
    template = ec2.create_launch_template(LaunchTemplateName="placed", LaunchTemplateData={
        "ImageId": image, "Placement": {"GroupId": group["GroupId"]}})["LaunchTemplate"]
    spec = {"LaunchTemplateId": template["LaunchTemplateId"], "Version": "$Latest"}
    recorder.set_path(str(log))
    try:
        # The controller resolves the class's selector, validates, launches.
        assert controller.describe_placement_groups(
            GroupNames=["hpc"], Filters=[{"Name": "state", "Values": ["available"]}])["PlacementGroups"]
        with pytest.raises(ClientError):
            controller.describe_placement_groups(GroupIds=["pg-0123456789abcdef0"])
        with pytest.raises(ClientError):
            controller.run_instances(DryRun=True, LaunchTemplate=spec, InstanceType="m5.large", SubnetId=subnet,
                                     MinCount=1, MaxCount=1)
        controller.create_fleet(
            Type="instant",
            TargetCapacitySpecification={"TotalTargetCapacity": 1, "DefaultTargetCapacityType": "on-demand"},
            LaunchTemplateConfigs=[{"LaunchTemplateSpecification": spec,
                                    "Overrides": [{"InstanceType": "m5.large", "SubnetId": subnet}]}],
        )
        controller.create_placement_group(GroupName="spread-me", Strategy="spread")
        controller.delete_placement_group(GroupName="spread-me")
    finally:
        recorder.set_path(None)
    records = [json.loads(line) for line in log.read_text().splitlines()]
    assert all(r["modelled"] and not r.get("error") for r in records), [r for r in records if not r["modelled"]]

    describes = [r for r in records if r["operation"] == "ec2:DescribePlacementGroups"]
    assert [(r["action"], r["resource"], r["status"]) for r in describes] == [
        ("ec2:DescribePlacementGroups", "*", 200), ("ec2:DescribePlacementGroups", "*", 400)]

    arn = f"arn:aws:ec2:{REGION}:{ACCOUNT}:placement-group/hpc"
    for operation, actions in (("ec2:RunInstances", {"ec2:RunInstances"}),
                               ("ec2:CreateFleet", {"ec2:RunInstances", "ec2:CreateFleet"})):
        on_group = [r for r in records if r["operation"] == operation and r["resource"] == arn]
        assert {r["action"] for r in on_group} == actions, operation
        assert all(r["resource_found"] and r["context"]["aws:ResourceTag/kubernetes.io/cluster/demo"] == "owned"
                   for r in on_group)
    assert all(r.get("dry_run") for r in records if r["operation"] == "ec2:RunInstances")

    create = [r for r in records if r["operation"] == "ec2:CreatePlacementGroup"]
    assert [(r["action"], r["resource"]) for r in create] == [
        ("ec2:CreatePlacementGroup", f"arn:aws:ec2:{REGION}:{ACCOUNT}:placement-group/spread-me")]
    delete = [r for r in records if r["operation"] == "ec2:DeletePlacementGroup"]
    assert [(r["resource"], r["resource_found"]) for r in delete] == [
        (f"arn:aws:ec2:{REGION}:{ACCOUNT}:placement-group/spread-me", True)]


def test_groups_belong_to_a_region_and_go_with_a_reset(own_emulator) -> None:
    endpoint, _, _ = own_emulator
    west, east = ec2_client(endpoint), ec2_client(endpoint, region="us-east-1")
    west.create_placement_group(GroupName="regional", Strategy="cluster")
    assert west.describe_placement_groups(GroupNames=["regional"])["PlacementGroups"]
    assert error_of(lambda: east.describe_placement_groups(GroupNames=["regional"]))[1] == \
        "InvalidPlacementGroup.Unknown"
    east.create_placement_group(GroupName="regional", Strategy="spread")  # another region: no duplicate

    request = urllib.request.Request(f"{endpoint}/moto-api/reset", data=b"", method="POST")
    with _OPENER.open(request, timeout=30) as answer:
        assert answer.status == 200
    assert west.describe_placement_groups()["PlacementGroups"] == []
    assert east.describe_placement_groups()["PlacementGroups"] == []

"""The emulator's call log (hack/moto/call_log.py), in this process: moto behind the recorder
on an ephemeral port, boto3 clients that present themselves as the controller (the SDK app
name `karpenter-rs`) or not, and the install guide's policy judging what was recorded.
Needs neither the running emulator nor the Rust tests.

`imitate_controller` makes the calls the controller makes, tagged as it tags (docs/install.md);
it also serves to try the recorder against the real emulator by hand (then run
test_controller_policy.py with the same KARPENTER_RS_MOTO_CALL_LOG):

    KARPENTER_RS_MOTO_CALL_LOG=target/calls.jsonl hack/moto-up.sh
    cd tests/aws_emulator && "$(../../hack/moto-up.sh --venv)/bin/python" -c \\
        'import test_call_log as t; t.imitate_controller("http://127.0.0.1:14566", "karpenter-demo")'
"""

from __future__ import annotations

import json
import sys
import threading
import uuid
from pathlib import Path

import pytest

from iam_policy import Context, controller_policy

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "hack" / "moto"))
sys.dont_write_bytecode = True

import call_log  # noqa: E402

REGION = "us-west-2"
ACCOUNT = "123456789012"


def clients(endpoint: str, controller: bool, region: str = REGION):
    import boto3
    from botocore.config import Config

    session = boto3.session.Session(aws_access_key_id="testing", aws_secret_access_key="testing",
                                    region_name=region)
    config = Config(retries={"max_attempts": 1}, user_agent_appid=call_log.CONTROLLER_APP if controller else None,
                    proxies={})
    return lambda name, **kw: session.client(name, endpoint_url=endpoint, config=config, **kw)


def seed(endpoint: str, cluster: str) -> dict:
    """What the emulator's seed provides, for an in-process moto: subnet, security group,
    node role, interruption queue (created as a test would: not recorded)."""
    client = clients(endpoint, controller=False)
    ec2, iam, sqs = client("ec2"), client("iam"), client("sqs")
    vpc = ec2.create_vpc(CidrBlock="10.0.0.0/16")["Vpc"]["VpcId"]
    subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="10.0.0.0/19", AvailabilityZone=f"{REGION}a")["Subnet"]["SubnetId"]
    group = ec2.create_security_group(GroupName=f"{cluster}-node", Description="nodes", VpcId=vpc)["GroupId"]
    trust = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "sts:AssumeRole",
                                                      "Principal": {"Service": "ec2.amazonaws.com"}}]}
    iam.create_role(RoleName=f"KarpenterNodeRole-{cluster}", AssumeRolePolicyDocument=json.dumps(trust))
    queue = sqs.create_queue(QueueName=cluster)["QueueUrl"]
    sqs.send_message(QueueUrl=queue, MessageBody="{}")
    return {"subnet": subnet, "group": group}


def imitate_controller(endpoint: str, cluster: str, pool: str = "default", subnet: str | None = None,
                       group: str | None = None) -> dict:
    """The controller's calls for one EC2NodeClass and an on-demand and a spot launch (of a NodeClaim
    of `pool`, or of no NodePool when `pool` is empty), then its cleanup, with its tags."""
    client = clients(endpoint, controller=True)
    ec2, iam, ssm, sqs, eks = client("ec2"), client("iam"), client("ssm"), client("sqs"), client("eks")
    disc = [{"Name": "tag:karpenter.sh/discovery", "Values": [cluster]}]
    subnet = subnet or ec2.describe_subnets(Filters=disc)["Subnets"][0]["SubnetId"]
    group = group or ec2.describe_security_groups(Filters=disc)["SecurityGroups"][0]["GroupId"]
    ec2.describe_subnets(SubnetIds=[subnet])
    ec2.describe_security_groups(GroupIds=[group])
    try:
        eks.describe_cluster(name=cluster)
    except Exception:
        pass
    try:
        ssm.get_parameter(Name="/aws/service/eks/optimized-ami/1.34/amazon-linux-2023/x86_64/standard/recommended/image_id")
    except Exception:
        pass
    image = ec2.describe_images(Owners=["amazon"], MaxResults=5)["Images"][0]["ImageId"]
    try:
        client("pricing", region_name="us-east-1").get_products(ServiceCode="AmazonEC2", MaxResults=1)
    except Exception:
        pass  # moto has no Pricing API; the call is recorded all the same

    # The class's instance profile.
    profile = f"{cluster}_{uuid.uuid4().hex[:16]}"
    role = f"KarpenterNodeRole-{cluster}"
    try:
        iam.get_instance_profile(InstanceProfileName=profile)
    except iam.exceptions.NoSuchEntityException:
        pass
    iam.create_instance_profile(InstanceProfileName=profile, Path="/", Tags=[
        {"Key": f"kubernetes.io/cluster/{cluster}", "Value": "owned"},
        {"Key": "eks:eks-cluster-name", "Value": cluster},
        {"Key": "karpenter.sh/managed-by", "Value": cluster},
        {"Key": "karpenter.k8s.aws/ec2nodeclass", "Value": "default"},
        {"Key": "topology.kubernetes.io/region", "Value": REGION},
    ])
    iam.add_role_to_instance_profile(InstanceProfileName=profile, RoleName=role)

    tags = {
        f"kubernetes.io/cluster/{cluster}": "owned",
        "eks:eks-cluster-name": cluster,
        "karpenter.k8s.aws/ec2nodeclass": "default",
        "karpenter.sh/nodepool": pool,
        "team": "platform",
    }
    as_list = lambda t: [{"Key": k, "Value": v} for k, v in t.items()]  # noqa: E731
    launched = []
    templates = []
    for capacity in ("on-demand", "spot"):
        name = f"karpenter.k8s.aws/{uuid.uuid4().hex[:20]}"
        try:
            ec2.describe_launch_templates(LaunchTemplateNames=[name])
        except Exception:
            pass
        data_specs = [{"ResourceType": "network-interface", "Tags": as_list(tags)}]
        if capacity == "spot":
            data_specs.append({"ResourceType": "spot-instances-request", "Tags": as_list(tags)})
        lt_tags = {**tags, "karpenter.k8s.aws/cluster": cluster}
        ec2.create_launch_template(
            LaunchTemplateName=name,
            LaunchTemplateData={"ImageId": image, "SecurityGroupIds": [group],
                                "IamInstanceProfile": {"Name": profile}, "TagSpecifications": data_specs},
            TagSpecifications=[{"ResourceType": "launch-template", "Tags": as_list(lt_tags)}],
        )
        templates.append(name)
        if capacity == "on-demand":
            validate_node_class(ec2, name, subnet, {**tags, "karpenter.sh/nodepool": ""})
        instance_tags = {**tags, "karpenter.sh/nodeclaim": f"{pool or 'solo'}-{capacity}"}
        fleet = ec2.create_fleet(
            Type="instant",
            TargetCapacitySpecification={"TotalTargetCapacity": 1, "DefaultTargetCapacityType": capacity},
            LaunchTemplateConfigs=[{
                "LaunchTemplateSpecification": {"LaunchTemplateName": name, "Version": "$Latest"},
                "Overrides": [{"InstanceType": "m5.large", "SubnetId": subnet}],
            }],
            TagSpecifications=[{"ResourceType": t, "Tags": as_list(instance_tags)}
                               for t in ("instance", "volume", "fleet")],
        )
        launched += [i for group_ in fleet.get("Instances", []) for i in group_["InstanceIds"]]
    ec2.describe_instances(InstanceIds=launched)
    ec2.describe_instance_status(IncludeAllInstances=True)
    # Registered: each instance is named after its Node (the tagging controller).
    for number, instance in enumerate(launched):
        ec2.create_tags(Resources=[instance], Tags=[{"Key": "Name", "Value": f"ip-10-0-0-{number}.ec2.internal"}])

    # Interruption queue.
    queue = sqs.get_queue_url(QueueName=cluster)["QueueUrl"]
    for message in sqs.receive_message(QueueUrl=queue, MaxNumberOfMessages=10).get("Messages", []):
        sqs.delete_message(QueueUrl=queue, ReceiptHandle=message["ReceiptHandle"])

    # Cleanup: the instances, the class's templates and instance profile.
    ec2.terminate_instances(InstanceIds=launched)
    for name in templates:
        ec2.delete_launch_template(LaunchTemplateName=name)
    iam.get_instance_profile(InstanceProfileName=profile)
    iam.remove_role_from_instance_profile(InstanceProfileName=profile, RoleName=role)
    iam.delete_instance_profile(InstanceProfileName=profile)
    return {"instances": launched, "templates": templates, "profile": profile, "image": image}


def validate_node_class(ec2, template: str, subnet: str, tags: dict[str, str]) -> None:
    """The controller's validation of an EC2NodeClass: CreateFleet and RunInstances dry runs
    from the class's template, tagged as a launch of no NodePool."""
    from botocore.exceptions import ClientError

    as_list = [{"Key": k, "Value": v} for k, v in tags.items()]
    spec = {"LaunchTemplateName": template, "Version": "$Latest"}
    calls = [
        lambda: ec2.create_fleet(
            DryRun=True, Type="instant",
            TargetCapacitySpecification={"TotalTargetCapacity": 1, "DefaultTargetCapacityType": "on-demand"},
            LaunchTemplateConfigs=[{"LaunchTemplateSpecification": spec,
                                    "Overrides": [{"InstanceType": "m5.large", "SubnetId": subnet}]}],
            TagSpecifications=[{"ResourceType": t, "Tags": as_list} for t in ("instance", "volume", "fleet")],
        ),
        lambda: ec2.run_instances(
            DryRun=True, MinCount=1, MaxCount=1, LaunchTemplate=spec, InstanceType="m5.large",
            NetworkInterfaces=[{"DeviceIndex": 0, "SubnetId": subnet}],
            TagSpecifications=[{"ResourceType": t, "Tags": as_list}
                               for t in ("instance", "volume", "network-interface")],
        ),
    ]
    for call in calls:
        with pytest.raises(ClientError) as answer:
            call()
        assert answer.value.response["Error"]["Code"] == "DryRunOperation"


# -- the in-process emulator ---------------------------------------------------


@pytest.fixture(scope="module")
def emulator(tmp_path_factory, monkeypatch_module):
    monkeypatch_module.setenv("NO_PROXY", "127.0.0.1,localhost")
    monkeypatch_module.setenv("no_proxy", "127.0.0.1,localhost")
    monkeypatch_module.delenv("MOTO_ACCOUNT_ID", raising=False)
    from moto.moto_server.werkzeug_app import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
    from werkzeug.serving import make_server

    recorder = call_log.CallRecorder(DomainDispatcherApplication(create_backend_app))
    server = make_server("127.0.0.1", 0, recorder, threaded=True, request_handler=MotoRequestHandler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    log = tmp_path_factory.mktemp("calls") / "calls.jsonl"
    try:
        yield f"http://127.0.0.1:{server.server_port}", recorder, log
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as mp:
        yield mp


@pytest.fixture(scope="module")
def journey(emulator):
    endpoint, recorder, log = emulator
    cluster = "demo"
    seeded = seed(endpoint, cluster)  # before recording, and not the controller's anyway
    recorder.set_path(str(log))
    try:
        # A NodePool's NodeClaims, then a standalone NodeClaim (empty karpenter.sh/nodepool tag).
        pooled = imitate_controller(endpoint, cluster, "default", seeded["subnet"], seeded["group"])
        standalone = imitate_controller(endpoint, cluster, "", seeded["subnet"], seeded["group"])
        # A boto3 client that is not the controller is not recorded.
        clients(endpoint, controller=False)("ec2").describe_vpcs()
    finally:
        recorder.set_path(None)
    records = [json.loads(line) for line in log.read_text().splitlines()]
    return {"cluster": cluster, "records": records, "pooled": pooled, "standalone": standalone, **seeded}


def policy_for(cluster: str):
    return controller_policy({"AWS_PARTITION": "aws", "AWS_REGION": REGION, "AWS_ACCOUNT_ID": ACCOUNT,
                              "CLUSTER_NAME": cluster})


def by_operation(records, operation):
    return [r for r in records if r["operation"] == operation]


# -- tests ---------------------------------------------------------------------


def test_parsing_of_query_parameters() -> None:
    params = call_log.query_params(
        {"QUERY_STRING": "Action=CreateFleet"},
        b"TagSpecification.2.ResourceType=volume&TagSpecification.2.Tag.1.Key=a&TagSpecification.2.Tag.1.Value="
        b"&TagSpecification.1.ResourceType=instance&TagSpecification.1.Tag.1.Key=k&TagSpecification.1.Tag.1.Value=v"
        b"&TagSpecification.1.Tag.2.Key=kubernetes.io%2Fcluster%2Fdemo&TagSpecification.1.Tag.2.Value=owned"
        b"&InstanceId.1=i-1&InstanceId.2=i-2",
    )
    assert params["Action"] == "CreateFleet"
    assert call_log.tag_specifications(params) == {
        "instance": {"k": "v", "kubernetes.io/cluster/demo": "owned"},
        "volume": {"a": ""},
    }
    assert [m[""] for m in call_log.indexed(params, "InstanceId")] == ["i-1", "i-2"]


def test_only_the_controller_is_recorded(journey) -> None:
    records = journey["records"]
    agents = {r["user_agent"] for r in records}
    assert agents and all("app/karpenter-rs" in a.split() for a in agents), agents
    operations = {r["operation"] for r in records}
    assert not operations & {"ec2:CreateVpc", "ec2:CreateSubnet", "iam:CreateRole", "sqs:SendMessage",
                             "ec2:DescribeVpcs"}, operations
    assert call_log.is_controller({"HTTP_X_AMZ_USER_AGENT": "aws-sdk-rust/1.3 api/ec2/1.2 app/karpenter-rs"})
    assert not call_log.is_controller({"HTTP_USER_AGENT": "aws-sdk-rust/1.3 os/linux lang/rust/1.90"})
    assert not call_log.is_controller({"HTTP_USER_AGENT": "Boto3/1.44.5 md/Botocore#1.44.5"})
    assert not call_log.is_controller({"HTTP_X_AMZ_USER_AGENT": "aws-sdk-rust/1.3 app/karpenter-rs-tests"})


def test_every_operation_is_recorded_and_modelled(journey) -> None:
    records = journey["records"]
    operations = {r["operation"] for r in records}
    for want in ["eks:DescribeCluster", "ssm:GetParameter", "pricing:GetProducts", "iam:CreateInstanceProfile",
                 "iam:AddRoleToInstanceProfile", "ec2:CreateLaunchTemplate", "ec2:CreateFleet",
                 "ec2:TerminateInstances", "ec2:DeleteLaunchTemplate", "sqs:GetQueueUrl", "sqs:ReceiveMessage",
                 "sqs:DeleteMessage", "iam:RemoveRoleFromInstanceProfile", "iam:DeleteInstanceProfile",
                 "ec2:DescribeInstanceStatus"]:
        assert want in operations, want
    assert all(r["modelled"] and not r.get("error") for r in records), [r for r in records if not r["modelled"]]
    assert {r["seq"] for r in records} == set(range(1, max(r["seq"] for r in records) + 1))
    assert all(r["context"]["aws:RequestedRegion"] in (REGION, "us-east-1") for r in records)


def test_create_fleet_authorises_what_the_launch_uses(journey) -> None:
    cluster = journey["cluster"]
    fleets = [r for r in by_operation(journey["records"], "ec2:CreateFleet") if not r.get("dry_run")]
    spot_seq = max(r["seq"] for r in fleets)
    spot = [r for r in fleets if r["seq"] == spot_seq]
    pairs = {(r["action"], r["resource"].split(":", 5)[5].split("/")[0]) for r in spot}
    # The resource types of each action, as the Service Authorization Reference lists them.
    expected = {
        "ec2:CreateFleet": {"fleet", "instance", "volume", "launch-template", "subnet", "image"},
        "ec2:RunInstances": {"instance", "volume", "network-interface", "spot-instances-request", "launch-template",
                             "subnet", "security-group", "image", "snapshot"},
    }
    for action, types in expected.items():
        assert {t for a, t in pairs if a == action} == types, action
    by = {(r["action"], r["resource"]): r for r in spot}
    eni = by[("ec2:RunInstances", f"arn:aws:ec2:{REGION}:{ACCOUNT}:network-interface/*")]["context"]
    assert eni[f"aws:RequestTag/kubernetes.io/cluster/{cluster}"] == "owned"  # from the launch template
    image = [r for r in spot if ":image/" in r["resource"]][0]
    assert image["resource"].startswith(f"arn:aws:ec2:{REGION}::image/ami-")
    template = [r for r in spot if ":launch-template/lt-" in r["resource"] and r["action"] == "ec2:RunInstances"][0]
    assert template["context"][f"aws:ResourceTag/kubernetes.io/cluster/{cluster}"] == "owned"
    assert template["resource_found"] is True
    tagging = {r["resource"].rsplit(":", 1)[1]: r["context"] for r in spot if r["action"] == "ec2:CreateTags"}
    assert set(tagging) == {"fleet/*", "instance/*", "volume/*", "network-interface/*", "spot-instances-request/*"}
    assert all(c["ec2:CreateAction"] == "CreateFleet" for c in tagging.values())
    passes = [r for r in spot if r["action"] == "iam:PassRole"]
    assert [p["resource"] for p in passes] == [f"arn:aws:iam::{ACCOUNT}:role/KarpenterNodeRole-{cluster}"]
    assert passes[0]["context"]["iam:PassedToService"] == "ec2.amazonaws.com"
    # Two journeys, each with an on-demand and a spot launch: only spot launches make spot requests.
    spot_requests = {r["seq"]: "spot-instances-request" in r["resource"] for r in fleets}
    for seq in {r["seq"] for r in fleets}:
        spot_requests[seq] = any("spot-instances-request" in r["resource"] for r in fleets if r["seq"] == seq)
    assert sorted(spot_requests.values()) == [False, False, True, True]


def test_dry_runs_authorise_what_the_launch_would_use(journey) -> None:
    cluster = journey["cluster"]
    records = journey["records"]
    dry = [r for r in records if r.get("dry_run")]
    assert {r["operation"] for r in dry} == {"ec2:CreateFleet", "ec2:RunInstances"}
    assert all(r["modelled"] for r in dry)
    run = by_operation(records, "ec2:RunInstances")
    assert run and all(r.get("dry_run") for r in run), "the controller runs instances only as dry runs"
    last = max(r["seq"] for r in run)
    one = [r for r in run if r["seq"] == last]
    types = {(r["action"], r["resource"].split(":", 5)[5].split("/")[0]) for r in one}
    assert {t for a, t in types if a == "ec2:RunInstances"} == {
        "instance", "volume", "network-interface", "launch-template", "subnet", "security-group", "image", "snapshot"}
    by = {(r["action"], r["resource"]): r for r in one}
    eni = by[("ec2:RunInstances", f"arn:aws:ec2:{REGION}:{ACCOUNT}:network-interface/*")]["context"]
    assert eni[f"aws:RequestTag/kubernetes.io/cluster/{cluster}"] == "owned"
    assert eni["aws:RequestTag/karpenter.sh/nodepool"] == ""
    subnet = [r for r in one if ":subnet/" in r["resource"]][0]
    assert subnet["resource"].endswith(journey["subnet"]) and subnet["resource_found"] is True
    tagging = {r["resource"].rsplit(":", 1)[1]: r["context"] for r in one if r["action"] == "ec2:CreateTags"}
    assert set(tagging) == {"instance/*", "volume/*", "network-interface/*"}
    assert all(c["ec2:CreateAction"] == "RunInstances" for c in tagging.values())
    assert [r["resource"] for r in one if r["action"] == "iam:PassRole"] == [
        f"arn:aws:iam::{ACCOUNT}:role/KarpenterNodeRole-{cluster}"]


def test_tags_added_after_registration_are_judged_on_the_instance(journey) -> None:
    tagging = [r for r in by_operation(journey["records"], "ec2:CreateTags")]
    assert tagging and all(r["resource"].split(":")[-1].startswith("instance/i-") for r in tagging)
    assert all(r["context"]["aws:TagKeys"] == ["Name"] for r in tagging)
    assert all(r["context"][f"aws:ResourceTag/kubernetes.io/cluster/{journey['cluster']}"] == "owned"
               for r in tagging)


def test_resource_tags_are_looked_up_when_the_request_arrives(journey) -> None:
    records = journey["records"]
    terminations = by_operation(records, "ec2:TerminateInstances")
    assert {r["resource"].rsplit("/", 1)[1] for r in terminations} >= set(journey["pooled"]["instances"])
    assert all(r["context"]["aws:ResourceTag/karpenter.sh/nodepool"] in ("default", "") for r in terminations)
    deletions = by_operation(records, "ec2:DeleteLaunchTemplate")
    assert deletions and all(r["resource_found"] for r in deletions)
    standalone = [r for r in deletions if r["context"].get("aws:ResourceTag/karpenter.sh/nodepool") == ""]
    assert len(standalone) == 2, "the empty nodepool tag of a standalone NodeClaim's template is kept"
    profile_ops = [r for r in records if r["action"] in ("iam:DeleteInstanceProfile", "iam:RemoveRoleFromInstanceProfile")]
    assert profile_ops and all(r["context"]["aws:ResourceTag/eks:eks-cluster-name"] == journey["cluster"]
                               for r in profile_ops)
    queue = by_operation(records, "sqs:ReceiveMessage")[0]
    assert queue["resource"] == f"arn:aws:sqs:{REGION}:{ACCOUNT}:{journey['cluster']}"
    parameter = by_operation(records, "ssm:GetParameter")[0]
    assert parameter["resource"].startswith(f"arn:aws:ssm:{REGION}::parameter/aws/service/eks/")
    add = by_operation(records, "iam:AddRoleToInstanceProfile")
    assert {r["action"] for r in add} == {"iam:AddRoleToInstanceProfile", "iam:PassRole"}


def test_the_install_guide_policy_allows_the_controllers_calls(journey) -> None:
    policy = policy_for(journey["cluster"])
    denied = []
    for r in journey["records"]:
        context = Context(r["context"])
        decision = policy.evaluate(r["action"], r["resource"], context)
        if not decision.allowed:
            denied.append(f"{r['operation']} {r['action']} {r['resource']}: {decision.explain(context)}")
    assert not denied, "\n".join(denied)


def test_the_policy_denies_a_template_without_the_nodepool_tag(emulator) -> None:
    """The tagging the controller had for standalone NodeClaims (no karpenter.sh/nodepool tag) is
    refused by the policy, and the explanation says why."""
    endpoint, recorder, log = emulator
    untagged = log.with_name("untagged.jsonl")
    recorder.set_path(str(untagged))
    try:
        clients(endpoint, controller=True)("ec2").create_launch_template(
            LaunchTemplateName=f"karpenter.k8s.aws/{uuid.uuid4().hex[:20]}",
            LaunchTemplateData={"ImageId": "ami-12c6146b"},
            TagSpecifications=[{"ResourceType": "launch-template", "Tags": [
                {"Key": "kubernetes.io/cluster/demo", "Value": "owned"},
                {"Key": "eks:eks-cluster-name", "Value": "demo"}]}],
        )
    finally:
        recorder.set_path(None)
    records = [json.loads(line) for line in untagged.read_text().splitlines()]
    create = [r for r in records if r["action"] == "ec2:CreateLaunchTemplate"][0]
    context = Context(create["context"])
    decision = policy_for("demo").evaluate(create["action"], create["resource"], context)
    assert not decision.allowed
    explanation = decision.explain(context)
    assert "CreateTaggedInstancesAndLaunchTemplates" in explanation
    assert "aws:RequestTag/karpenter.sh/nodepool" in explanation and "(missing)" in explanation

"""The emulator's EC2 faults (hack/moto/faults.py, armed through POST /_karpenter-rs/faults of
hack/moto/server.py), in this process: moto behind the fault injector and the emulator's own
endpoints on an ephemeral port, boto3 clients that present themselves as the controller (the SDK
app name `karpenter-rs`) or not. Needs neither the running emulator nor the Rust tests.
"""

from __future__ import annotations

import json
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "hack" / "moto"))
sys.dont_write_bytecode = True

import call_log  # noqa: E402
import faults  # noqa: E402
import server  # noqa: E402

REGION = "us-west-2"


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as mp:
        yield mp


@pytest.fixture(scope="module")
def emulator(monkeypatch_module):
    monkeypatch_module.setenv("NO_PROXY", "127.0.0.1,localhost")
    monkeypatch_module.setenv("no_proxy", "127.0.0.1,localhost")
    monkeypatch_module.delenv("MOTO_ACCOUNT_ID", raising=False)
    from moto.moto_server.werkzeug_app import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
    from werkzeug.serving import make_server

    injector = faults.FaultInjector(DomainDispatcherApplication(create_backend_app))
    app = server.App(injector, server.Seeder("1.34"), 0, REGION, None, injector)
    httpd = make_server("127.0.0.1", 0, app, threaded=True, request_handler=MotoRequestHandler)
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_port}"
    finally:
        httpd.shutdown()
        httpd.server_close()


def ec2(endpoint: str, controller: bool = True):
    import boto3
    from botocore.config import Config

    session = boto3.session.Session(aws_access_key_id="testing", aws_secret_access_key="testing",
                                    region_name=REGION)
    config = Config(retries={"mode": "standard", "total_max_attempts": 1}, proxies={},
                    user_agent_appid=call_log.CONTROLLER_APP if controller else None)
    return session.client("ec2", endpoint_url=endpoint, config=config)


def call(endpoint: str, method: str, body: dict | None = None) -> tuple[int, dict]:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(f"{endpoint}/_karpenter-rs/faults", data=data, method=method,
                                     headers={"Content-Type": "application/json"})
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(request, timeout=30) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def arm(endpoint: str, **fault) -> dict:
    status, body = call(endpoint, "POST", fault)
    assert status == 200, body
    return body


@pytest.fixture(autouse=True)
def disarmed(emulator):
    call(emulator, "DELETE")
    yield
    call(emulator, "DELETE")


@pytest.fixture(scope="module")
def launch(emulator):
    """A subnet and a launch template to launch from."""
    client = ec2(emulator, controller=False)
    vpc = client.create_vpc(CidrBlock="10.0.0.0/16")["Vpc"]["VpcId"]
    subnet = client.create_subnet(VpcId=vpc, CidrBlock="10.0.0.0/19", AvailabilityZone=f"{REGION}a")
    image = client.describe_images(Owners=["amazon"], MaxResults=5)["Images"][0]["ImageId"]
    template = client.create_launch_template(LaunchTemplateName="faults", LaunchTemplateData={"ImageId": image})
    return {"subnet": subnet["Subnet"]["SubnetId"], "template": template["LaunchTemplate"]["LaunchTemplateId"],
            "image": image}


def create_fleet(client, launch: dict, types=("m5.large", "c5.large")) -> dict:
    return client.create_fleet(
        Type="instant",
        LaunchTemplateConfigs=[{
            "LaunchTemplateSpecification": {"LaunchTemplateId": launch["template"], "Version": "$Latest"},
            "Overrides": [{"InstanceType": t, "SubnetId": launch["subnet"], "AvailabilityZone": f"{REGION}a"}
                          for t in types],
        }],
        TargetCapacitySpecification={"TotalTargetCapacity": 1, "DefaultTargetCapacityType": "on-demand"},
    )


def live_instances(client) -> set[str]:
    out = client.describe_instances(Filters=[{"Name": "instance-state-name", "Values": ["pending", "running"]}])
    return {i["InstanceId"] for r in out["Reservations"] for i in r["Instances"]}


def launch_one(client, launch: dict) -> str:
    out = client.run_instances(ImageId=launch["image"], InstanceType="m5.large", MinCount=1, MaxCount=1,
                               SubnetId=launch["subnet"])
    return out["Instances"][0]["InstanceId"]


def test_create_fleet_without_capacity_answers_like_ec2(emulator, launch) -> None:
    client = ec2(emulator)
    before = live_instances(client)
    arm(emulator, action="CreateFleet", error="InsufficientInstanceCapacity", count=2)
    for _ in range(2):
        answer = create_fleet(client, launch)
        assert answer["ResponseMetadata"]["HTTPStatusCode"] == 200
        assert answer["FleetId"].startswith("fleet-")
        assert answer.get("Instances", []) == []
        errors = answer["Errors"]
        assert [e["ErrorCode"] for e in errors] == ["InsufficientInstanceCapacity"] * 2
        overrides = [e["LaunchTemplateAndOverrides"]["Overrides"] for e in errors]
        assert [o["InstanceType"] for o in overrides] == ["m5.large", "c5.large"]
        assert all(o["SubnetId"] == launch["subnet"] for o in overrides)
        spec = errors[0]["LaunchTemplateAndOverrides"]["LaunchTemplateSpecification"]
        assert spec["LaunchTemplateId"] == launch["template"]
        assert errors[0]["Lifecycle"] == "on-demand"
        assert "do not have sufficient m5.large capacity" in errors[0]["ErrorMessage"]
    assert live_instances(client) == before, "nothing was launched"
    # The third call is moto's again.
    answer = create_fleet(client, launch)
    launched = [i for group in answer["Instances"] for i in group["InstanceIds"]]
    assert len(launched) == 1
    status, state = call(emulator, "GET")
    assert status == 200
    assert state["pending"] == []
    assert state["counts"] == {"CreateFleet InsufficientInstanceCapacity": 2}


def test_a_dry_run_is_never_out_of_capacity_but_is_throttled(emulator, launch) -> None:
    from botocore.exceptions import ClientError

    client = ec2(emulator)
    arm(emulator, action="CreateFleet", error="InsufficientInstanceCapacity", count=1)
    arm(emulator, action="RunInstances", error="RequestLimitExceeded", count=1)
    dry = dict(DryRun=True, Type="instant",
               LaunchTemplateConfigs=[{
                   "LaunchTemplateSpecification": {"LaunchTemplateId": launch["template"], "Version": "$Latest"},
                   "Overrides": [{"InstanceType": "m5.large", "SubnetId": launch["subnet"]}]}],
               TargetCapacitySpecification={"TotalTargetCapacity": 1, "DefaultTargetCapacityType": "on-demand"})
    with pytest.raises(ClientError) as answer:
        client.create_fleet(**dry)
    assert answer.value.response["Error"]["Code"] == "DryRunOperation"
    with pytest.raises(ClientError) as answer:
        client.run_instances(DryRun=True, ImageId=launch["image"], InstanceType="m5.large", MinCount=1,
                             MaxCount=1, SubnetId=launch["subnet"])
    assert answer.value.response["Error"]["Code"] == "RequestLimitExceeded"
    # The capacity fault waited for the launch.
    assert create_fleet(client, launch)["Errors"][0]["ErrorCode"] == "InsufficientInstanceCapacity"
    assert call(emulator, "GET")[1]["pending"] == []


def test_create_fleet_can_name_only_the_first_overrides(emulator, launch) -> None:
    client = ec2(emulator)
    arm(emulator, action="CreateFleet", error="InsufficientInstanceCapacity", overrides=1)
    answer = create_fleet(client, launch, types=("m5.large", "c5.large", "r5.large"))
    assert answer.get("Instances", []) == []
    named = [e["LaunchTemplateAndOverrides"]["Overrides"]["InstanceType"] for e in answer["Errors"]]
    assert named == ["m5.large"]


@pytest.mark.parametrize("code,status", [("RequestLimitExceeded", 503), ("InternalError", 500),
                                         ("InsufficientInstanceCapacity", 500), ("Unavailable", 503)])
def test_errors_have_ec2s_status_and_document(emulator, launch, code, status) -> None:
    from botocore.exceptions import ClientError

    client = ec2(emulator)
    arm(emulator, action="RunInstances", error=code)
    before = live_instances(client)
    with pytest.raises(ClientError) as raised:
        launch_one(client, launch)
    error = raised.value.response
    assert error["Error"]["Code"] == code
    assert error["ResponseMetadata"]["HTTPStatusCode"] == status
    assert error["ResponseMetadata"]["RequestId"]
    assert live_instances(client) == before, "the call never reached EC2"
    launch_one(client, launch)  # one call only


def test_terminate_and_describe_errors_leave_the_instance_alone(emulator, launch) -> None:
    from botocore.exceptions import ClientError

    client = ec2(emulator)
    instance = launch_one(client, launch)
    arm(emulator, action="TerminateInstances", error="InternalError", count=2)
    arm(emulator, action="DescribeInstances", error="RequestLimitExceeded")
    for _ in range(2):
        with pytest.raises(ClientError) as raised:
            client.terminate_instances(InstanceIds=[instance])
        assert raised.value.response["Error"]["Code"] == "InternalError"
    with pytest.raises(ClientError) as raised:
        client.describe_instances(InstanceIds=[instance])
    assert raised.value.response["Error"]["Code"] == "RequestLimitExceeded"
    assert instance in live_instances(client)
    client.terminate_instances(InstanceIds=[instance])
    assert instance not in live_instances(client)


def test_a_lost_answer_is_acted_on(emulator, launch) -> None:
    from botocore.exceptions import ClientError

    client = ec2(emulator)
    instance = launch_one(client, launch)
    arm(emulator, action="TerminateInstances", error="InternalError", after=True)
    with pytest.raises(ClientError):
        client.terminate_instances(InstanceIds=[instance])
    assert instance not in live_instances(client), "EC2 acted although the caller got an error"


def test_stall_holds_the_call_then_answers(emulator, launch) -> None:
    client = ec2(emulator)
    arm(emulator, action="DescribeInstances", error="stall", seconds=1.5)
    started = time.monotonic()
    client.describe_instances()
    assert time.monotonic() - started >= 1.4
    started = time.monotonic()
    client.describe_instances()
    assert time.monotonic() - started < 1.4, "one call only"


def test_only_the_controllers_calls_by_default(emulator, launch) -> None:
    from botocore.exceptions import ClientError

    arm(emulator, action="DescribeInstances", error="InternalError")
    ec2(emulator, controller=False).describe_instances()  # a test's or the stand-in's call
    status, state = call(emulator, "GET")
    assert [f["action"] for f in state["pending"]] == ["DescribeInstances"], "still armed"
    with pytest.raises(ClientError):
        ec2(emulator).describe_instances()
    arm(emulator, action="DescribeInstances", error="InternalError", any_client=True)
    with pytest.raises(ClientError):
        ec2(emulator, controller=False).describe_instances()


def test_faults_are_used_in_order_and_can_be_disarmed(emulator, launch) -> None:
    from botocore.exceptions import ClientError

    client = ec2(emulator)
    arm(emulator, action="DescribeInstances", error="RequestLimitExceeded")
    arm(emulator, action="DescribeInstances", error="InternalError")
    codes = []
    for _ in range(2):
        with pytest.raises(ClientError) as raised:
            client.describe_instances()
        codes.append(raised.value.response["Error"]["Code"])
    assert codes == ["RequestLimitExceeded", "InternalError"]
    arm(emulator, action="DescribeInstances", error="InternalError", count=5)
    status, cleared = call(emulator, "DELETE")
    assert status == 200 and [f["left"] for f in cleared["cleared"]] == [5]
    client.describe_instances()


@pytest.mark.parametrize("fault", [
    {"action": "CreateFleet", "error": "NoSuchCode"},  # no known status, none given
    {"action": "CreateFleet", "error": "stall", "seconds": -1},
    {"action": "createFleet", "error": "InternalError"},
    {"action": "CreateFleet", "error": "InternalError", "count": 0},
    {"action": "CreateFleet", "error": "InternalError", "status": 200},
    {"action": "ReceiveMessage", "error": "InternalError", "service": "sqs"},
    {"action": "CreateFleet", "error": "InternalError", "typo": 1},
    {"action": "CreateFleet", "error": "InternalError", "overrides": 1},
    {"action": "CreateFleet", "error": "InsufficientInstanceCapacity", "overrides": 0},
])
def test_faults_it_cannot_inject_are_refused(emulator, fault) -> None:
    status, body = call(emulator, "POST", fault)
    assert status == 400, body
    assert body["error"]


def test_an_error_code_of_ones_own_with_its_status(emulator, launch) -> None:
    from botocore.exceptions import ClientError

    arm(emulator, action="DescribeInstances", error="UnauthorizedOperation", status=403,
        message="You are not authorized to perform this operation.")
    with pytest.raises(ClientError) as raised:
        ec2(emulator).describe_instances()
    assert raised.value.response["Error"]["Code"] == "UnauthorizedOperation"
    assert raised.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403

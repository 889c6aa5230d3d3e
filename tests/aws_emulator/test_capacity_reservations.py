"""EC2 capacity reservations, capacity blocks and interruptible reservations in the AWS emulator
(hack/moto/reservations.py), which moto lacks.

Most tests run against the running emulator (hack/moto-up.sh), through boto3 pointed at
$AWS_ENDPOINT_URL, as the controller's calls reach it: the reservation actions, capacity blocks
made through POST /_karpenter-rs/capacity-block, interruptible allocations, instances launched by
CreateFleet and RunInstances into reservations, and the CPU options a launch template keeps and
its instances show (hack/moto/server.py). They tag their reservations with a tag of their own,
cancel them (an interruptible reservation ends with its source) and remove what they launched.
The call-log tests run an emulator of their own in this process (moto behind the call log, the
placement groups and the reservations, as hack/moto/server.py composes them), since they switch
its call log.

    eval "$(hack/moto-up.sh)"
    "$(hack/moto-up.sh --venv)"/bin/python -m pytest tests/aws_emulator/test_capacity_reservations.py
"""

from __future__ import annotations

import datetime
import json
import re
import sys
import threading
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any, Iterator

import pytest
from botocore.exceptions import ClientError

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "hack" / "moto"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.dont_write_bytecode = True

import call_log  # noqa: E402
import placement  # noqa: E402
import reservations  # noqa: E402
from test_placement_groups import (  # noqa: E402,F401  (fixtures shared with the placement-group tests)
    ACCOUNT, REGION, _OPENER, ec2, ec2_client, endpoint, error_of, image, subnet)

RESERVATION_ID = re.compile(r"^cr-[0-9a-f]{17}$")
# Instance types no other test launches: an open reservation of one takes only this file's instances.
OPEN_TYPE = "x2iedn.xlarge"
TYPE = "m5.large"
# The market type (and instance lifecycle) of a launch into an interruptible reservation.
INTERRUPTIBLE = "interruptible-capacity-reservation"
CAPACITY_BLOCK_TYPE = "capacity-block"


def post(endpoint: str, path: str, body: dict) -> tuple[int, dict]:
    request = urllib.request.Request(f"{endpoint}/_karpenter-rs/{path}", data=json.dumps(body).encode(),
                                     method="POST", headers={"Content-Type": "application/json"})
    try:
        with _OPENER.open(request, timeout=30) as answer:
            return answer.status, json.load(answer)
    except urllib.error.HTTPError as error:
        return error.code, json.load(error)


def iso(delta: datetime.timedelta) -> str:
    return (datetime.datetime.now(datetime.timezone.utc) + delta).strftime("%Y-%m-%dT%H:%M:%SZ")


class Made:
    """What a test made in the shared emulator, removed afterwards."""

    def __init__(self, ec2, endpoint: str):
        self.ec2 = ec2
        self.endpoint = endpoint
        self.run_tag = uuid.uuid4().hex
        self.reservations: list[str] = []
        self.templates: list[str] = []
        self.instances: list[str] = []

    @property
    def mine(self) -> dict:
        """The filter of this test's reservations."""
        return {"Name": "tag:test-run", "Values": [self.run_tag]}

    def reservation(self, zone: str, count: int = 1, instance_type: str = TYPE, **kwargs: Any) -> dict:
        tags = [{"Key": "test-run", "Value": self.run_tag}] + kwargs.pop("Tags", [])
        found = self.ec2.create_capacity_reservation(
            InstanceType=instance_type, InstancePlatform=kwargs.pop("InstancePlatform", "Linux/UNIX"),
            AvailabilityZone=zone, InstanceCount=count,
            TagSpecifications=[{"ResourceType": "capacity-reservation", "Tags": tags}], **kwargs,
        )["CapacityReservation"]
        self.reservations.append(found["CapacityReservationId"])
        return found

    def block(self, zone: str, count: int = 1, start: str | None = None, end: str | None = None,
              instance_type: str = TYPE) -> dict:
        body: dict[str, Any] = {"instance_type": instance_type, "zone": zone, "count": count, "region": REGION,
                                "tags": {"test-run": self.run_tag}}
        if start:
            body["start"] = start
        if end:
            body["end"] = end
        status, answer = post(self.endpoint, "capacity-block", body)
        assert status == 200, answer
        self.reservations.append(answer["id"])
        return answer

    def allocation(self, source: str, count: int, **kwargs: Any) -> str:
        """The id of an interruptible reservation allocated from `source` (it ends with its source,
        which remove() cancels)."""
        tags = [{"Key": "test-run", "Value": self.run_tag}] + kwargs.pop("Tags", [])
        self.ec2.create_interruptible_capacity_reservation_allocation(
            CapacityReservationId=source, InstanceCount=count,
            TagSpecifications=[{"ResourceType": "capacity-reservation", "Tags": tags}], **kwargs)
        return self.get(source)["InterruptibleCapacityAllocation"]["InterruptibleCapacityReservationId"]

    def get(self, rid: str) -> dict:
        return self.ec2.describe_capacity_reservations(CapacityReservationIds=[rid])["CapacityReservations"][0]

    def template(self, image: str, target: str | None = None, market: str | None = None, **data: Any) -> dict:
        data = {"ImageId": image, **data}
        if target:
            data["CapacityReservationSpecification"] = {
                "CapacityReservationPreference": "capacity-reservations-only",
                "CapacityReservationTarget": {"CapacityReservationId": target}}
        if market:
            data["InstanceMarketOptions"] = {"MarketType": market}
        template = self.ec2.create_launch_template(
            LaunchTemplateName=f"cr-test-{uuid.uuid4().hex[:16]}", LaunchTemplateData=data)["LaunchTemplate"]
        self.templates.append(template["LaunchTemplateId"])
        return template

    def fleet(self, template: dict, subnet: str, count: int = 1, capacity: str = "on-demand",
              instance_type: str = TYPE, **kwargs: Any) -> dict:
        answer = self.ec2.create_fleet(
            Type=kwargs.pop("Type", "instant"),
            TargetCapacitySpecification={"TotalTargetCapacity": count, "DefaultTargetCapacityType": capacity,
                                         **kwargs.pop("TargetCapacitySpecification", {})},
            LaunchTemplateConfigs=[{
                "LaunchTemplateSpecification": {"LaunchTemplateId": template["LaunchTemplateId"], "Version": "$Latest"},
                "Overrides": [{"InstanceType": instance_type, "SubnetId": subnet}],
            }],
            **kwargs,
        )
        self.instances += [i for launched in answer.get("Instances", []) for i in launched["InstanceIds"]]
        return answer

    def run(self, **kwargs: Any) -> list[dict]:
        instances = self.ec2.run_instances(MinCount=kwargs.pop("MinCount", 1), MaxCount=kwargs.pop("MaxCount", 1),
                                           **kwargs)["Instances"]
        self.instances += [i["InstanceId"] for i in instances]
        return instances

    def described(self, instance_ids: list[str]) -> dict[str, dict]:
        reservations_ = self.ec2.describe_instances(InstanceIds=instance_ids)["Reservations"]
        return {i["InstanceId"]: i for r in reservations_ for i in r["Instances"]}

    def terminate(self, instance_ids: list[str]) -> None:
        self.ec2.terminate_instances(InstanceIds=instance_ids)

    def remove(self) -> None:
        if self.instances:
            self.ec2.terminate_instances(InstanceIds=self.instances)
        for template in self.templates:
            self.ec2.delete_launch_template(LaunchTemplateId=template)
        for rid in self.reservations:
            try:
                self.ec2.cancel_capacity_reservation(CapacityReservationId=rid)
            except ClientError as error:
                assert error.response["Error"]["Code"] == "IncorrectState", error


@pytest.fixture
def made(ec2, endpoint) -> Iterator[Made]:
    made = Made(ec2, endpoint)
    try:
        yield made
    finally:
        made.remove()


@pytest.fixture(scope="module")
def zone(ec2, subnet) -> str:
    return ec2.describe_subnets(SubnetIds=[subnet])["Subnets"][0]["AvailabilityZone"]


def fleet_errors(answer: dict) -> list[tuple[str, str]]:
    return [(e["ErrorCode"], e["LaunchTemplateAndOverrides"]["Overrides"]["InstanceType"])
            for e in answer.get("Errors", [])]


def launched(answer: dict) -> list[str]:
    return [i for item in answer.get("Instances", []) for i in item["InstanceIds"]]


# -- creating, describing, cancelling -----------------------------------------------------------------


def test_create_answers_an_active_reservation_as_ec2(ec2, made, zone) -> None:
    created = made.reservation(zone, count=3, InstanceMatchCriteria="targeted",
                               Tags=[{"Key": "team", "Value": "ml"}])
    rid = created["CapacityReservationId"]
    assert RESERVATION_ID.match(rid)
    assert created["CapacityReservationArn"] == f"arn:aws:ec2:{REGION}:{ACCOUNT}:capacity-reservation/{rid}"
    assert (created["OwnerId"], created["State"], created["ReservationType"]) == (ACCOUNT, "active", "default")
    assert (created["TotalInstanceCount"], created["AvailableInstanceCount"]) == (3, 3)
    assert (created["InstanceType"], created["AvailabilityZone"], created["InstancePlatform"]) == \
        (TYPE, zone, "Linux/UNIX")
    assert (created["Tenancy"], created["InstanceMatchCriteria"], created["EndDateType"]) == \
        ("default", "targeted", "unlimited")
    assert created["AvailabilityZoneId"] and "EndDate" not in created
    assert created["CreateDate"] and created["StartDate"]
    assert {t["Key"]: t["Value"] for t in created["Tags"]} == {"test-run": made.run_tag, "team": "ml"}
    assert made.get(rid) == created


def test_the_default_match_criteria_and_a_limited_end(ec2, made, zone) -> None:
    end = datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0) + datetime.timedelta(days=2)
    created = made.reservation(zone, EndDateType="limited", EndDate=end)
    assert created["InstanceMatchCriteria"] == "open"
    assert (created["EndDateType"], created["EndDate"]) == ("limited", end)
    zone_id = created["AvailabilityZoneId"]
    by_zone_id = ec2.create_capacity_reservation(InstanceType=TYPE, InstancePlatform="Linux/UNIX",
                                                 AvailabilityZoneId=zone_id, InstanceCount=1)["CapacityReservation"]
    made.reservations.append(by_zone_id["CapacityReservationId"])
    assert by_zone_id["AvailabilityZone"] == zone


@pytest.mark.parametrize("arguments, code", [
    ({"InstanceCount": 0}, "InvalidParameterValue"),
    ({"InstanceMatchCriteria": "sometimes"}, "InvalidParameterValue"),
    ({"EndDateType": "limited"}, "InvalidParameterCombination"),
    ({"AvailabilityZone": "mars-1a"}, "InvalidParameterValue"),
])
def test_parameters_ec2_refuses(ec2, zone, arguments: dict, code: str) -> None:
    call = {"InstanceType": TYPE, "InstancePlatform": "Linux/UNIX", "AvailabilityZone": zone, "InstanceCount": 1,
            **arguments}
    assert error_of(lambda: ec2.create_capacity_reservation(**call))[:2] == (400, code)


def test_describe_filters(ec2, made, zone) -> None:
    other_zone = next(z["ZoneName"] for z in ec2.describe_availability_zones()["AvailabilityZones"]
                      if z["ZoneName"] != zone)
    first = made.reservation(zone, InstanceMatchCriteria="targeted", Tags=[{"Key": "team", "Value": "ml"}])
    second = made.reservation(other_zone, instance_type="c5.large", Tenancy="dedicated")
    a, b = first["CapacityReservationId"], second["CapacityReservationId"]

    def ids(*filters: dict) -> list[str]:
        found = ec2.describe_capacity_reservations(Filters=[made.mine, *filters])["CapacityReservations"]
        return [r["CapacityReservationId"] for r in found]

    assert ids() == [a, b]
    assert ids({"Name": "instance-type", "Values": ["c5.*"]}) == [b]
    assert ids({"Name": "availability-zone", "Values": [zone]}) == [a]
    assert ids({"Name": "owner-id", "Values": [ACCOUNT]}) == [a, b]
    assert ids({"Name": "owner-id", "Values": ["210987654321"]}) == []
    assert ids({"Name": "state", "Values": ["active"]}) == [a, b]
    assert ids({"Name": "instance-match-criteria", "Values": ["open"]}) == [b]
    assert ids({"Name": "tenancy", "Values": ["dedicated"]}) == [b]
    assert ids({"Name": "tag:team", "Values": ["ml"]}) == [a]
    assert ids({"Name": "tag-key", "Values": ["team"]}) == [a]
    assert ids({"Name": "capacity-reservation-id", "Values": [b]}) == [b]
    # As Karpenter resolves a selector term by id: the id and the state filter.
    assert [r["CapacityReservationId"] for r in ec2.describe_capacity_reservations(
        CapacityReservationIds=[b], Filters=[{"Name": "state", "Values": ["active"]}])["CapacityReservations"]] == [b]
    assert error_of(lambda: ec2.describe_capacity_reservations(Filters=[{"Name": "colour", "Values": ["x"]}]))[1] \
        == "InvalidParameterValue"

    page = ec2.describe_capacity_reservations(Filters=[made.mine], MaxResults=1)
    assert [r["CapacityReservationId"] for r in page["CapacityReservations"]] == [a] and page["NextToken"]
    rest = ec2.describe_capacity_reservations(Filters=[made.mine], MaxResults=1, NextToken=page["NextToken"])
    assert [r["CapacityReservationId"] for r in rest["CapacityReservations"]] == [b] and "NextToken" not in rest


def test_an_unknown_id(ec2) -> None:
    status, code, message = error_of(
        lambda: ec2.describe_capacity_reservations(CapacityReservationIds=["cr-0123456789abcdef0"]))
    assert (status, code) == (400, "InvalidCapacityReservationId.NotFound")
    assert "cr-0123456789abcdef0" in message


def test_cancel(ec2, made, zone) -> None:
    rid = made.reservation(zone, count=2)["CapacityReservationId"]
    assert ec2.cancel_capacity_reservation(CapacityReservationId=rid)["Return"] is True
    found = made.get(rid)
    assert (found["State"], found["AvailableInstanceCount"], found["TotalInstanceCount"]) == ("cancelled", 0, 2)
    assert ec2.describe_capacity_reservations(
        Filters=[made.mine, {"Name": "state", "Values": ["active"]}])["CapacityReservations"] == []
    assert error_of(lambda: ec2.cancel_capacity_reservation(CapacityReservationId=rid))[1] == "IncorrectState"
    assert error_of(lambda: ec2.cancel_capacity_reservation(
        CapacityReservationId="cr-0123456789abcdef0"))[1] == "InvalidCapacityReservationId.NotFound"


def test_capacity_blocks_follow_the_clock(ec2, made, endpoint, zone) -> None:
    later = made.block(zone, count=2, start=iso(datetime.timedelta(hours=1)), end=iso(datetime.timedelta(hours=3)))
    now = made.block(zone, count=2, start=iso(-datetime.timedelta(hours=1)), end=iso(datetime.timedelta(hours=3)))
    past = made.block(zone, start=iso(-datetime.timedelta(hours=3)), end=iso(-datetime.timedelta(hours=1)))
    assert (later["state"], now["state"], past["state"]) == ("scheduled", "active", "expired")
    found = {r["CapacityReservationId"]: r for r in ec2.describe_capacity_reservations(
        Filters=[made.mine])["CapacityReservations"]}
    for answer, state, available in ((later, "scheduled", 2), (now, "active", 2), (past, "expired", 0)):
        reservation = found[answer["id"]]
        assert (reservation["State"], reservation["AvailableInstanceCount"]) == (state, available)
        assert (reservation["ReservationType"], reservation["InstanceMatchCriteria"],
                reservation["EndDateType"]) == ("capacity-block", "targeted", "limited")
        assert reservation["EndDate"] > reservation["StartDate"]
    assert [r["CapacityReservationId"] for r in ec2.describe_capacity_reservations(
        Filters=[made.mine, {"Name": "state", "Values": ["active"]}])["CapacityReservations"]] == [now["id"]]

    # Its end moved into the past: expired; a state set, then given back to the clock.
    status, answer = post(endpoint, "capacity-reservation", {"id": now["id"], "end": iso(-datetime.timedelta(minutes=1))})
    assert (status, answer["state"], answer["available"]) == (200, "expired", 0)
    status, answer = post(endpoint, "capacity-reservation", {"id": later["id"], "state": "active"})
    assert (status, made.get(later["id"])["State"]) == (200, "active")
    post(endpoint, "capacity-reservation", {"id": later["id"], "state": None})
    assert made.get(later["id"])["State"] == "scheduled"
    assert post(endpoint, "capacity-reservation", {"id": "cr-0123456789abcdef0", "state": "expired"})[0] == 404
    assert post(endpoint, "capacity-reservation", {"id": later["id"], "state": "asleep"})[0] == 400
    assert post(endpoint, "capacity-block", {"zone": zone})[0] == 400


# -- launches ---------------------------------------------------------------------------------------------


def test_a_targeted_fleet_consumes_the_reservation_until_it_is_exhausted(ec2, made, image, subnet, zone) -> None:
    rid = made.reservation(zone, count=2, InstanceMatchCriteria="targeted")["CapacityReservationId"]
    template = made.template(image, target=rid)
    first, second = made.fleet(template, subnet), made.fleet(template, subnet)
    ids = launched(first) + launched(second)
    assert len(ids) == 2 and not first.get("Errors") and not second.get("Errors")
    assert made.get(rid)["AvailableInstanceCount"] == 0
    for instance in made.described(ids).values():
        assert instance["CapacityReservationId"] == rid
        assert instance["CapacityReservationSpecification"] == {
            "CapacityReservationPreference": "capacity-reservations-only",
            "CapacityReservationTarget": {"CapacityReservationId": rid}}
        assert "InstanceLifecycle" not in instance

    # Exhausted: no instance, the error Karpenter reads as the reservation being exhausted.
    third = made.fleet(template, subnet)
    assert launched(third) == [] and third["FleetId"]
    assert fleet_errors(third) == [("ReservationCapacityExceeded", TYPE)]

    # A terminated instance gives its slot back.
    made.terminate(ids[:1])
    assert made.get(rid)["AvailableInstanceCount"] == 1
    fourth = made.fleet(template, subnet, count=2)  # one slot: one instance and the error
    assert len(launched(fourth)) == 1
    assert fleet_errors(fourth) == [("ReservationCapacityExceeded", TYPE)]
    assert made.get(rid)["AvailableInstanceCount"] == 0


def test_a_targeted_launch_of_another_type_or_into_a_cancelled_reservation_fails(ec2, made, image, subnet,
                                                                                  zone) -> None:
    rid = made.reservation(zone, InstanceMatchCriteria="targeted")["CapacityReservationId"]
    template = made.template(image, target=rid)
    other = made.fleet(template, subnet, instance_type="c5.large")
    assert launched(other) == [] and fleet_errors(other) == [("InvalidParameterCombination", "c5.large")]
    ec2.cancel_capacity_reservation(CapacityReservationId=rid)
    cancelled = made.fleet(template, subnet)
    assert launched(cancelled) == [] and fleet_errors(cancelled) == [("ReservationCapacityExceeded", TYPE)]
    missing = made.fleet(made.template(image, target="cr-0123456789abcdef0"), subnet)
    assert fleet_errors(missing) == [("InvalidCapacityReservationId.NotFound", TYPE)]


def test_run_instances_into_a_reservation(ec2, made, image, subnet, zone) -> None:
    rid = made.reservation(zone, count=2, InstanceMatchCriteria="targeted")["CapacityReservationId"]
    target = {"CapacityReservationPreference": "capacity-reservations-only",
              "CapacityReservationTarget": {"CapacityReservationId": rid}}
    # More than is left: refused.
    assert error_of(lambda: made.run(ImageId=image, InstanceType=TYPE, SubnetId=subnet, MinCount=3, MaxCount=3,
                                     CapacityReservationSpecification=target))[:2] == (400, "ReservationCapacityExceeded")
    instances = made.run(ImageId=image, InstanceType=TYPE, SubnetId=subnet, CapacityReservationSpecification=target,
                         MinCount=2, MaxCount=2)
    assert [i["CapacityReservationId"] for i in instances] == [rid, rid]
    assert made.get(rid)["AvailableInstanceCount"] == 0
    status, code, message = error_of(lambda: made.run(ImageId=image, InstanceType=TYPE, SubnetId=subnet,
                                                      CapacityReservationSpecification=target))
    assert (status, code) == (400, "ReservationCapacityExceeded") and rid in message
    made.terminate([instances[0]["InstanceId"]])
    # From a launch template with the target.
    again = made.run(LaunchTemplate={"LaunchTemplateId": made.template(image, target=rid)["LaunchTemplateId"]},
                     InstanceType=TYPE, SubnetId=subnet)
    assert made.described([again[0]["InstanceId"]])[again[0]["InstanceId"]]["CapacityReservationId"] == rid


def test_capacity_block_fleets(ec2, made, image, subnet, zone) -> None:
    block = made.block(zone, count=1, start=iso(-datetime.timedelta(minutes=5)), end=iso(datetime.timedelta(hours=2)))
    template = made.template(image, target=block["id"], market="capacity-block")
    answer = made.fleet(template, subnet, capacity="capacity-block")
    ids = launched(answer)
    assert len(ids) == 1 and not answer.get("Errors")
    instance = made.described(ids)[ids[0]]
    assert (instance["CapacityReservationId"], instance["InstanceLifecycle"]) == (block["id"], "capacity-block")
    assert fleet_errors(made.fleet(template, subnet, capacity="capacity-block")) == [
        ("ReservationCapacityExceeded", TYPE)]

    # Not yet started, or launched without the capacity-block market type.
    later = made.block(zone, start=iso(datetime.timedelta(hours=1)), end=iso(datetime.timedelta(hours=2)))
    early = made.fleet(made.template(image, target=later["id"], market="capacity-block"), subnet,
                       capacity="capacity-block")
    assert launched(early) == [] and fleet_errors(early) == [("ReservationCapacityExceeded", TYPE)]
    post(made.endpoint, "capacity-reservation", {"id": later["id"], "state": "active"})
    plain = made.fleet(made.template(image, target=later["id"]), subnet)
    assert fleet_errors(plain) == [("InvalidParameterCombination", TYPE)]


def test_open_reservations_take_matching_instances(ec2, made, image, subnet, zone) -> None:
    rid = made.reservation(zone, count=1, instance_type=OPEN_TYPE)["CapacityReservationId"]
    try:
        none = made.run(ImageId=image, InstanceType=OPEN_TYPE, SubnetId=subnet,
                        CapacityReservationSpecification={"CapacityReservationPreference": "none"})[0]
        assert "CapacityReservationId" not in none
        assert none["CapacityReservationSpecification"] == {"CapacityReservationPreference": "none"}
        assert made.get(rid)["AvailableInstanceCount"] == 1

        first = made.run(ImageId=image, InstanceType=OPEN_TYPE, SubnetId=subnet)[0]
        assert first["CapacityReservationId"] == rid
        assert first["CapacityReservationSpecification"] == {"CapacityReservationPreference": "open"}
        # Full: the next one runs as plain On-Demand.
        second = made.run(ImageId=image, InstanceType=OPEN_TYPE, SubnetId=subnet)[0]
        assert "CapacityReservationId" not in second
        assert made.get(rid)["AvailableInstanceCount"] == 0

        made.terminate([first["InstanceId"]])
        from_fleet = made.fleet(made.template(image), subnet, instance_type=OPEN_TYPE)
        assert made.described(launched(from_fleet))[launched(from_fleet)[0]]["CapacityReservationId"] == rid
    finally:
        ec2.cancel_capacity_reservation(CapacityReservationId=rid)


# -- when a reservation ends ------------------------------------------------------------------------------


def reserved_in(made: Made, rid: str, image: str, subnet: str) -> str:
    """An instance launched by RunInstances into the targeted reservation `rid`; its id."""
    target = {"CapacityReservationPreference": "capacity-reservations-only",
              "CapacityReservationTarget": {"CapacityReservationId": rid}}
    instance = made.run(ImageId=image, InstanceType=TYPE, SubnetId=subnet, CapacityReservationSpecification=target)[0]
    assert instance["CapacityReservationId"] == rid
    shown = made.described([instance["InstanceId"]])[instance["InstanceId"]]
    assert (shown["CapacityReservationId"], shown["CapacityReservationSpecification"]) == (rid, target)
    return instance["InstanceId"]


def assert_on_demand(made: Made, instance_id: str) -> None:
    """The instance runs on, in no reservation: as EC2 leaves the instances of an ODCR that ended."""
    shown = made.described([instance_id])[instance_id]
    assert "CapacityReservationId" not in shown, shown
    assert shown["CapacityReservationSpecification"] == {"CapacityReservationPreference": "open"}
    assert shown["State"]["Name"] == "running" and "InstanceLifecycle" not in shown


def counted(made: Made, rid: str) -> list[str]:
    """The instances the emulator counts against the reservation (the extension endpoint's answer)."""
    status, answer = post(made.endpoint, "capacity-reservation", {"id": rid, "region": REGION})
    assert status == 200, answer
    return answer["instances"]


def test_a_cancelled_reservation_lets_its_instances_run_on_demand(ec2, made, image, subnet, zone) -> None:
    rid = made.reservation(zone, count=2, InstanceMatchCriteria="targeted")["CapacityReservationId"]
    other = made.reservation(zone, count=2, InstanceMatchCriteria="targeted")["CapacityReservationId"]
    leaving, staying = reserved_in(made, rid, image, subnet), reserved_in(made, other, image, subnet)
    assert counted(made, rid) == [leaving]

    ec2.cancel_capacity_reservation(CapacityReservationId=rid)
    assert_on_demand(made, leaving)
    assert_on_demand(made, leaving)  # once is enough: looking again changes nothing
    found = made.get(rid)
    assert (found["State"], found["AvailableInstanceCount"], found["TotalInstanceCount"]) == ("cancelled", 0, 2)
    assert counted(made, rid) == []
    # Given back to the clock (active again), it has both its instances: the one that left is not counted.
    status, answer = post(made.endpoint, "capacity-reservation", {"id": rid, "state": None, "region": REGION})
    assert (status, answer["state"], answer["available"], answer["instances"]) == (200, "active", 2, [])
    assert_on_demand(made, leaving)

    # The instance of a reservation still active is unaffected.
    shown = made.described([staying])[staying]
    assert shown["CapacityReservationId"] == other
    assert shown["CapacityReservationSpecification"]["CapacityReservationTarget"] == {"CapacityReservationId": other}
    assert (made.get(other)["AvailableInstanceCount"], counted(made, other)) == (1, [staying])


def test_an_open_reservation_that_ends_lets_its_instances_go(ec2, made, image, subnet, zone) -> None:
    rid = made.reservation(zone, count=1, instance_type=OPEN_TYPE)["CapacityReservationId"]
    instance = made.run(ImageId=image, InstanceType=OPEN_TYPE, SubnetId=subnet)[0]
    assert instance["CapacityReservationId"] == rid
    ec2.cancel_capacity_reservation(CapacityReservationId=rid)
    assert_on_demand(made, instance["InstanceId"])
    assert counted(made, rid) == []


@pytest.mark.parametrize("change", [{"state": "expired"}, {"end": "past"}], ids=["state", "end"])
def test_an_expired_reservation_lets_its_instances_run_on_demand(ec2, made, image, subnet, zone,
                                                                 change: dict) -> None:
    rid = made.reservation(zone, count=2, InstanceMatchCriteria="targeted")["CapacityReservationId"]
    other = made.reservation(zone, count=1, InstanceMatchCriteria="targeted")["CapacityReservationId"]
    # Launched as Karpenter launches: an instant fleet from a launch template with the target.
    ids = launched(made.fleet(made.template(image, target=rid), subnet))
    staying = launched(made.fleet(made.template(image, target=other), subnet))
    assert len(ids) == 1 and made.described(ids)[ids[0]]["CapacityReservationId"] == rid

    if change.get("end"):
        change = {"end": iso(-datetime.timedelta(minutes=1))}
    status, answer = post(made.endpoint, "capacity-reservation", {"id": rid, "region": REGION, **change})
    assert (status, answer["state"], answer["available"], answer["instances"]) == (200, "expired", 0, [])
    assert_on_demand(made, ids[0])
    found = made.get(rid)
    assert (found["State"], found["AvailableInstanceCount"]) == ("expired", 0)
    # Expired, it takes no launch; the instance that left it keeps running.
    assert fleet_errors(made.fleet(made.template(image, target=rid), subnet)) == [("ReservationCapacityExceeded", TYPE)]
    assert_on_demand(made, ids[0])
    assert made.described(staying)[staying[0]]["CapacityReservationId"] == other


def test_a_reservation_that_reaches_its_end_date_lets_its_instances_go(ec2, made, image, subnet, zone) -> None:
    end = datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0) + datetime.timedelta(seconds=4)
    rid = made.reservation(zone, count=1, InstanceMatchCriteria="targeted", EndDateType="limited",
                           EndDate=end)["CapacityReservationId"]
    instance_id = reserved_in(made, rid, image, subnet)
    left = (end - datetime.datetime.now(datetime.timezone.utc)).total_seconds()
    assert left > 0, "launched after the end: the test is too slow for its end date"
    time.sleep(left + 0.5)
    # Nothing else is asked first: DescribeInstances alone sees the reservation ended by the clock,
    # and every one of several at once sees the instance the same (it leaves the reservation once).
    shown: list[dict] = []

    def describe() -> None:
        shown.append(made.described([instance_id])[instance_id])

    threads = [threading.Thread(target=describe) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(shown) == 6
    assert all("CapacityReservationId" not in s and s["CapacityReservationSpecification"] ==
               {"CapacityReservationPreference": "open"} and s["State"]["Name"] == "running" for s in shown), shown
    assert_on_demand(made, instance_id)
    found = made.get(rid)
    assert (found["State"], found["AvailableInstanceCount"]) == ("expired", 0)
    assert counted(made, rid) == []


def test_a_capacity_block_that_ends_terminates_its_instances(ec2, made, image, subnet, zone) -> None:
    block = made.block(zone, count=1, start=iso(-datetime.timedelta(minutes=5)), end=iso(datetime.timedelta(hours=2)))
    ids = launched(made.fleet(made.template(image, target=block["id"], market="capacity-block"), subnet,
                              capacity="capacity-block"))
    assert len(ids) == 1 and made.described(ids)[ids[0]]["State"]["Name"] == "running"

    status, answer = post(made.endpoint, "capacity-reservation",
                          {"id": block["id"], "region": REGION, "end": iso(-datetime.timedelta(minutes=1))})
    assert (status, answer["state"], answer["available"], answer["instances"]) == (200, "expired", 0, [])
    shown = made.described(ids)[ids[0]]
    assert shown["State"]["Name"] == "terminated"
    assert shown["StateReason"]["Code"] == "Server.ScheduledStop"
    assert shown["StateTransitionReason"].startswith("Service initiated")
    # A terminated instance still shows where it ran.
    assert (shown["CapacityReservationId"], shown["InstanceLifecycle"]) == (block["id"], "capacity-block")
    assert made.get(block["id"])["AvailableInstanceCount"] == 0


# -- interruptible reservations ---------------------------------------------------------------------


def reserved_fleet(made: Made, template: dict, subnet: str, count: int = 1,
                   types: tuple[str, ...] = (INTERRUPTIBLE,), **kwargs: Any) -> dict:
    """An instant fleet into reservations, as the controller launches into interruptible ones."""
    return made.fleet(template, subnet, count=count, capacity="reserved-capacity",
                      ReservedCapacityOptions={"ReservationTypes": list(types)}, **kwargs)


def lent_by(made: Made, zone: str, count: int, lent: int, **kwargs: Any) -> tuple[str, str]:
    """A targeted source reservation of `count` instances lending `lent` to an interruptible
    reservation: (source id, interruptible id)."""
    source = made.reservation(zone, count=count, InstanceMatchCriteria="targeted")["CapacityReservationId"]
    return source, made.allocation(source, lent, **kwargs)


def test_an_interruptible_allocation_answers_as_ec2(ec2, made, zone) -> None:
    source = made.reservation(zone, count=4, InstanceMatchCriteria="targeted", Tenancy="default")
    sid = source["CapacityReservationId"]
    answer = ec2.create_interruptible_capacity_reservation_allocation(
        CapacityReservationId=sid, InstanceCount=3, TagSpecifications=[{
            "ResourceType": "capacity-reservation",
            "Tags": [{"Key": "test-run", "Value": made.run_tag}, {"Key": "team", "Value": "batch"}]}])
    answer.pop("ResponseMetadata")
    assert answer == {"SourceCapacityReservationId": sid, "TargetInstanceCount": 3, "Status": "active",
                      "InterruptionType": "adhoc"}

    # The source lends 3 of its 4 instances: its total stays, its available instances go down.
    lender = made.get(sid)
    allocation = lender["InterruptibleCapacityAllocation"]
    rid = allocation["InterruptibleCapacityReservationId"]
    assert RESERVATION_ID.match(rid) and rid != sid
    assert allocation == {"InstanceCount": 3, "TargetInstanceCount": 3, "Status": "active",
                          "InterruptibleCapacityReservationId": rid, "InterruptionType": "adhoc",
                          "ZeroSizePreference": "default"}
    assert (lender["TotalInstanceCount"], lender["AvailableInstanceCount"], lender["Interruptible"]) == (4, 1, False)
    assert "InterruptionInfo" not in lender

    interruptible = made.get(rid)
    assert interruptible["Interruptible"] is True
    assert interruptible["CapacityReservationArn"] == f"arn:aws:ec2:{REGION}:{ACCOUNT}:capacity-reservation/{rid}"
    assert (interruptible["TotalInstanceCount"], interruptible["AvailableInstanceCount"]) == (3, 3)
    assert (interruptible["InstanceType"], interruptible["AvailabilityZone"], interruptible["InstancePlatform"],
            interruptible["Tenancy"]) == (TYPE, zone, "Linux/UNIX", "default")
    assert (interruptible["InstanceMatchCriteria"], interruptible["ReservationType"], interruptible["State"],
            interruptible["OwnerId"]) == ("targeted", "default", "active", ACCOUNT)
    assert interruptible["InterruptionInfo"] == {"SourceCapacityReservationId": sid, "InterruptionType": "adhoc"}
    assert "InterruptibleCapacityAllocation" not in interruptible
    assert {t["Key"]: t["Value"] for t in interruptible["Tags"]} == {"test-run": made.run_tag, "team": "batch"}

    def ids(*filters: dict) -> list[str]:
        found = ec2.describe_capacity_reservations(Filters=[made.mine, *filters])["CapacityReservations"]
        return [r["CapacityReservationId"] for r in found]

    # Only the interruptible one has the test's tag here: the source was tagged by made.reservation too.
    assert ids({"Name": "interruptible", "Values": ["true"]}) == [rid]
    assert ids({"Name": "interruptible", "Values": ["false"]}) == [sid]


def test_allocations_ec2_refuses(ec2, made, image, subnet, zone) -> None:
    def refused(**call: Any) -> tuple[int, str]:
        status, code, _ = error_of(lambda: ec2.create_interruptible_capacity_reservation_allocation(**call))
        return status, code

    assert refused(CapacityReservationId="cr-0123456789abcdef0", InstanceCount=1) == \
        (400, "InvalidCapacityReservationId.NotFound")
    source = made.reservation(zone, count=2, InstanceMatchCriteria="targeted")["CapacityReservationId"]
    # Only unused instances can be lent: one of the two runs an instance.
    reserved_in(made, source, image, subnet)
    assert refused(CapacityReservationId=source, InstanceCount=2) == (400, "InvalidParameterValue")
    assert refused(CapacityReservationId=source, InstanceCount=0) == (400, "InvalidParameterValue")
    assert refused(CapacityReservationId=source, InstanceCount=1, TagSpecifications=[
        {"ResourceType": "instance", "Tags": [{"Key": "a", "Value": "b"}]}]) == (400, "InvalidParameterValue")
    interruptible = made.allocation(source, 1)
    # One allocation per source; none from an interruptible reservation.
    assert refused(CapacityReservationId=source, InstanceCount=1) == (400, "IncorrectState")
    assert refused(CapacityReservationId=interruptible, InstanceCount=1) == (400, "InvalidParameterValue")
    # Nor from a capacity block, a reservation with an end date, or one no longer active.
    block = made.block(zone, count=2, start=iso(-datetime.timedelta(minutes=5)), end=iso(datetime.timedelta(hours=2)))
    assert refused(CapacityReservationId=block["id"], InstanceCount=1) == (400, "InvalidParameterValue")
    ending = made.reservation(zone, count=2, EndDateType="limited",
                              EndDate=datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(days=1))
    assert refused(CapacityReservationId=ending["CapacityReservationId"], InstanceCount=1) == \
        (400, "InvalidParameterValue")
    cancelled = made.reservation(zone, count=2)["CapacityReservationId"]
    ec2.cancel_capacity_reservation(CapacityReservationId=cancelled)
    assert refused(CapacityReservationId=cancelled, InstanceCount=1) == (400, "IncorrectState")
    # An interruptible reservation is not cancelled directly, and its allocation is changed
    # through its source only.
    assert error_of(lambda: ec2.cancel_capacity_reservation(CapacityReservationId=interruptible))[:2] == \
        (400, "OperationNotPermitted")
    assert error_of(lambda: ec2.update_interruptible_capacity_reservation_allocation(
        CapacityReservationId=interruptible, TargetInstanceCount=0))[:2] == (400, "InvalidParameterValue")
    assert error_of(lambda: ec2.update_interruptible_capacity_reservation_allocation(
        CapacityReservationId=cancelled, TargetInstanceCount=1))[:2] == (400, "InvalidParameterValue")
    # More than the source has unused (none left: one runs an instance, one is lent).
    assert error_of(lambda: ec2.update_interruptible_capacity_reservation_allocation(
        CapacityReservationId=source, TargetInstanceCount=2))[:2] == (400, "InvalidParameterValue")
    assert made.get(interruptible)["TotalInstanceCount"] == 1


def test_a_targeted_launch_into_an_interruptible_reservation_needs_its_market_type(ec2, made, image, subnet,
                                                                                    zone) -> None:
    _, rid = lent_by(made, zone, count=3, lent=2)
    target = {"CapacityReservationPreference": "capacity-reservations-only",
              "CapacityReservationTarget": {"CapacityReservationId": rid}}
    market = {"MarketType": INTERRUPTIBLE}

    def refused(**call: Any) -> tuple[int, str]:
        status, code, _ = error_of(lambda: made.run(ImageId=image, InstanceType=TYPE, SubnetId=subnet, **call))
        return status, code

    # Without the market type; the market type without a target, or into a plain ODCR.
    assert refused(CapacityReservationSpecification=target) == (400, "InvalidParameterCombination")
    assert refused(InstanceMarketOptions=market) == (400, "InvalidParameterCombination")
    plain = made.reservation(zone, InstanceMatchCriteria="targeted")["CapacityReservationId"]
    assert refused(InstanceMarketOptions=market, CapacityReservationSpecification={
        "CapacityReservationTarget": {"CapacityReservationId": plain}}) == (400, "InvalidParameterCombination")
    assert fleet_errors(made.fleet(made.template(image, target=rid), subnet)) == [
        ("InvalidParameterCombination", TYPE)]
    assert made.get(rid)["AvailableInstanceCount"] == 2

    # With it: RunInstances' request, and a launch template's.
    instance = made.run(ImageId=image, InstanceType=TYPE, SubnetId=subnet, CapacityReservationSpecification=target,
                        InstanceMarketOptions=market)[0]
    assert (instance["CapacityReservationId"], instance["InstanceLifecycle"]) == (rid, INTERRUPTIBLE)
    template = made.template(image, target=rid, market=INTERRUPTIBLE)
    again = made.run(LaunchTemplate={"LaunchTemplateId": template["LaunchTemplateId"]}, InstanceType=TYPE,
                     SubnetId=subnet)[0]
    for shown in made.described([instance["InstanceId"], again["InstanceId"]]).values():
        assert (shown["CapacityReservationId"], shown["InstanceLifecycle"]) == (rid, INTERRUPTIBLE)
        assert shown["CapacityReservationSpecification"] == {
            "CapacityReservationPreference": "capacity-reservations-only",
            "CapacityReservationTarget": {"CapacityReservationId": rid}}
    assert made.get(rid)["AvailableInstanceCount"] == 0
    assert refused(CapacityReservationSpecification=target, InstanceMarketOptions=market) == \
        (400, "ReservationCapacityExceeded")


def test_reserved_capacity_fleets(ec2, made, image, subnet, zone) -> None:
    source, rid = lent_by(made, zone, count=3, lent=1)
    template = made.template(image, target=rid, market=INTERRUPTIBLE)
    # Two wanted, one lent: one instance, and the error of the capacity it could not find.
    answer = reserved_fleet(made, template, subnet, count=2)
    ids = launched(answer)
    assert len(ids) == 1
    assert [item["Lifecycle"] for item in answer["Instances"]] == [INTERRUPTIBLE]
    assert fleet_errors(answer) == [("ReservationCapacityExceeded", TYPE)]
    assert [e["Lifecycle"] for e in answer["Errors"]] == [INTERRUPTIBLE]
    shown = made.described(ids)[ids[0]]
    assert (shown["CapacityReservationId"], shown["InstanceLifecycle"]) == (rid, INTERRUPTIBLE)
    assert made.get(rid)["AvailableInstanceCount"] == 0
    assert made.get(source)["AvailableInstanceCount"] == 2
    assert fleet_errors(reserved_fleet(made, template, subnet)) == [("ReservationCapacityExceeded", TYPE)]

    # Each override must target a reservation of a kind the fleet lists.
    ec2.update_interruptible_capacity_reservation_allocation(CapacityReservationId=source, TargetInstanceCount=2)
    assert fleet_errors(reserved_fleet(made, made.template(image), subnet)) == [("InvalidParameterCombination", TYPE)]
    assert fleet_errors(reserved_fleet(made, template, subnet, types=(CAPACITY_BLOCK_TYPE,))) == [
        ("InvalidParameterCombination", TYPE)]
    assert launched(reserved_fleet(made, template, subnet, types=(CAPACITY_BLOCK_TYPE, INTERRUPTIBLE)))
    # An instant fleet only, its capacity all of the default type.
    assert error_of(lambda: reserved_fleet(made, template, subnet, Type="request"))[:2] == \
        (400, "InvalidParameterCombination")
    assert error_of(lambda: reserved_fleet(made, template, subnet, TargetCapacitySpecification={
        "OnDemandTargetCapacity": 1}))[:2] == (400, "InvalidParameterCombination")


def test_a_capacity_block_fleet_answers_its_lifecycle(ec2, made, image, subnet, zone) -> None:
    block = made.block(zone, count=1, start=iso(-datetime.timedelta(minutes=5)), end=iso(datetime.timedelta(hours=2)))
    answer = made.fleet(made.template(image, target=block["id"], market="capacity-block"), subnet,
                        capacity="capacity-block")
    assert [item["Lifecycle"] for item in answer["Instances"]] == ["capacity-block"]


def test_reducing_an_allocation_reclaims_unused_then_the_newest_instances(ec2, made, image, subnet, zone) -> None:
    source, rid = lent_by(made, zone, count=5, lent=4)
    target = {"CapacityReservationPreference": "capacity-reservations-only",
              "CapacityReservationTarget": {"CapacityReservationId": rid}}
    first, second, third = (made.run(ImageId=image, InstanceType=TYPE, SubnetId=subnet,
                                     CapacityReservationSpecification=target,
                                     InstanceMarketOptions={"MarketType": INTERRUPTIBLE})[0]["InstanceId"]
                            for _ in range(3))
    assert (made.get(rid)["AvailableInstanceCount"], made.get(source)["AvailableInstanceCount"]) == (1, 1)

    # 4 -> 3: the unused instance goes back first; nothing is terminated.
    answer = ec2.update_interruptible_capacity_reservation_allocation(CapacityReservationId=source,
                                                                     TargetInstanceCount=3)
    answer.pop("ResponseMetadata")
    assert answer == {"InterruptibleCapacityReservationId": rid, "SourceCapacityReservationId": source,
                      "InstanceCount": 3, "TargetInstanceCount": 3, "Status": "active", "InterruptionType": "adhoc"}
    assert {i: s["State"]["Name"] for i, s in made.described([first, second, third]).items()} == {
        first: "running", second: "running", third: "running"}

    # 3 -> 1: the two newest are terminated, as EC2 reclaims them; their capacity goes back.
    ec2.update_interruptible_capacity_reservation_allocation(CapacityReservationId=source, TargetInstanceCount=1)
    shown = made.described([first, second, third])
    assert shown[first]["State"]["Name"] == "running"
    for gone in (second, third):
        assert shown[gone]["State"]["Name"] == "terminated"
        assert shown[gone]["StateReason"]["Code"] == "Server.ScheduledStop"
        assert shown[gone]["StateTransitionReason"].startswith("Service initiated")
        assert (shown[gone]["CapacityReservationId"], shown[gone]["InstanceLifecycle"]) == (rid, INTERRUPTIBLE)
    lender, interruptible = made.get(source), made.get(rid)
    assert (lender["TotalInstanceCount"], lender["AvailableInstanceCount"]) == (5, 4)
    assert (lender["InterruptibleCapacityAllocation"]["InstanceCount"],
            lender["InterruptibleCapacityAllocation"]["TargetInstanceCount"]) == (1, 1)
    assert (interruptible["TotalInstanceCount"], interruptible["AvailableInstanceCount"]) == (1, 0)

    # 1 -> 2: lent again from the source's unused instances.
    ec2.update_interruptible_capacity_reservation_allocation(CapacityReservationId=source, TargetInstanceCount=2)
    assert (made.get(rid)["AvailableInstanceCount"], made.get(source)["AvailableInstanceCount"]) == (1, 3)

    # 0 with the default preference: the interruptible reservation is cancelled, its last
    # instance terminated, and all the capacity is the source's again.
    answer = ec2.update_interruptible_capacity_reservation_allocation(CapacityReservationId=source,
                                                                     TargetInstanceCount=0)
    assert (answer["InstanceCount"], answer["Status"]) == (0, "canceled")
    assert made.described([first])[first]["State"]["Name"] == "terminated"
    assert made.get(rid)["State"] == "cancelled"
    lender = made.get(source)
    assert (lender["AvailableInstanceCount"], lender["InterruptibleCapacityAllocation"]["Status"]) == (5, "canceled")
    # A canceled allocation makes room for a new one.
    assert made.allocation(source, 2) != rid


def test_an_allocation_that_retains_its_zero_size_stays_active(ec2, made, zone) -> None:
    source, rid = lent_by(made, zone, count=2, lent=1, ZeroSizePreference="retain")
    ec2.update_interruptible_capacity_reservation_allocation(CapacityReservationId=source, TargetInstanceCount=0)
    interruptible = made.get(rid)
    assert (interruptible["State"], interruptible["TotalInstanceCount"], interruptible["ZeroSizePreference"]) == \
        ("active", 0, "retain")
    assert made.get(source)["InterruptibleCapacityAllocation"]["Status"] == "active"
    ec2.update_interruptible_capacity_reservation_allocation(CapacityReservationId=source, TargetInstanceCount=2)
    assert (made.get(rid)["AvailableInstanceCount"], made.get(source)["AvailableInstanceCount"]) == (2, 0)


def test_a_cancelled_source_ends_its_interruptible_reservation(ec2, made, image, subnet, zone) -> None:
    source, rid = lent_by(made, zone, count=2, lent=1)
    ids = launched(reserved_fleet(made, made.template(image, target=rid, market=INTERRUPTIBLE), subnet))
    assert len(ids) == 1
    ec2.cancel_capacity_reservation(CapacityReservationId=source)
    assert made.get(rid)["State"] == "cancelled"
    assert made.get(source)["InterruptibleCapacityAllocation"]["Status"] == "canceled"
    shown = made.described(ids)[ids[0]]
    assert (shown["State"]["Name"], shown["InstanceLifecycle"]) == ("terminated", INTERRUPTIBLE)


# -- launch templates' CPU options ---------------------------------------------------------------------


def test_launch_templates_keep_cpu_options(ec2, made, image, subnet) -> None:
    template = made.template(image, CpuOptions={"CoreCount": 1, "ThreadsPerCore": 2,
                                                "NestedVirtualization": "enabled"})
    second = ec2.create_launch_template_version(
        LaunchTemplateId=template["LaunchTemplateId"],
        LaunchTemplateData={"ImageId": image, "CpuOptions": {"NestedVirtualization": "disabled"}},
    )["LaunchTemplateVersion"]
    versions = {v["VersionNumber"]: v["LaunchTemplateData"] for v in ec2.describe_launch_template_versions(
        LaunchTemplateId=template["LaunchTemplateId"])["LaunchTemplateVersions"]}
    assert versions[1]["CpuOptions"] == {"CoreCount": 1, "ThreadsPerCore": 2, "NestedVirtualization": "enabled"}
    assert versions[second["VersionNumber"]]["CpuOptions"]["NestedVirtualization"] == "disabled"

    # Its instances show them: from RunInstances ($Default, version 1) and from a fleet ($Latest).
    run = made.run(LaunchTemplate={"LaunchTemplateId": template["LaunchTemplateId"]}, InstanceType="m8i.large",
                   SubnetId=subnet)[0]
    assert run["CpuOptions"]["NestedVirtualization"] == "enabled"
    fleet = launched(made.fleet(template, subnet, instance_type="m8i.large"))
    shown = made.described([run["InstanceId"], *fleet])
    assert shown[run["InstanceId"]]["CpuOptions"] == {"CoreCount": 1, "ThreadsPerCore": 2,
                                                      "NestedVirtualization": "enabled"}
    assert shown[fleet[0]]["CpuOptions"]["NestedVirtualization"] == "disabled"
    own = made.run(ImageId=image, InstanceType="m8i.large", SubnetId=subnet,
                   CpuOptions={"NestedVirtualization": "enabled"})[0]
    assert made.described([own["InstanceId"]])[own["InstanceId"]]["CpuOptions"] == {"NestedVirtualization": "enabled"}


def test_dry_runs(ec2, zone) -> None:
    status, code, _ = error_of(lambda: ec2.create_capacity_reservation(
        DryRun=True, InstanceType=TYPE, InstancePlatform="Linux/UNIX", AvailabilityZone=zone, InstanceCount=1))
    assert (status, code) == (412, "DryRunOperation")
    assert error_of(lambda: ec2.describe_capacity_reservations(DryRun=True))[1] == "DryRunOperation"
    assert error_of(lambda: ec2.create_interruptible_capacity_reservation_allocation(
        DryRun=True, CapacityReservationId="cr-0123456789abcdef0", InstanceCount=1))[1] == "DryRunOperation"


# -- the call log (an emulator of this process) ----------------------------------------------------------


@pytest.fixture(scope="module")
def own_emulator(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("NO_PROXY", "127.0.0.1,localhost")
        mp.setenv("no_proxy", "127.0.0.1,localhost")
        mp.delenv("MOTO_ACCOUNT_ID", raising=False)
        from moto.moto_server.werkzeug_app import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
        from werkzeug.serving import make_server

        recorder = call_log.CallRecorder(placement.PlacementGroups(
            reservations.CapacityReservations(DomainDispatcherApplication(create_backend_app))))
        server = make_server("127.0.0.1", 0, recorder, threaded=True, request_handler=MotoRequestHandler)
        server.daemon_threads = True
        thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        thread.start()
        try:
            yield f"http://127.0.0.1:{server.server_port}", recorder, tmp_path_factory.mktemp("calls") / "calls.jsonl"
        finally:
            server.shutdown()
            server.server_close()


def test_the_call_log_models_capacity_reservations(own_emulator) -> None:
    endpoint, recorder, log = own_emulator
    ec2 = ec2_client(endpoint)  # the test's own calls: not recorded
    controller = ec2_client(endpoint, controller=True)
    zone = f"{REGION}a"
    rid = ec2.create_capacity_reservation(
        InstanceType=TYPE, InstancePlatform="Linux/UNIX", AvailabilityZone=zone, InstanceCount=1,
        InstanceMatchCriteria="targeted", TagSpecifications=[
            {"ResourceType": "capacity-reservation", "Tags": [{"Key": "team", "Value": "ml"}]}],
    )["CapacityReservation"]["CapacityReservationId"]
    image = ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
    vpc = ec2.create_vpc(CidrBlock="10.0.0.0/16")["Vpc"]["VpcId"]
    subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="10.0.0.0/19", AvailabilityZone=zone)["Subnet"]["SubnetId"]
    template = ec2.create_launch_template(LaunchTemplateName="reserved", LaunchTemplateData={
        "ImageId": image, "CapacityReservationSpecification": {
            "CapacityReservationPreference": "capacity-reservations-only",
            "CapacityReservationTarget": {"CapacityReservationId": rid}}})["LaunchTemplate"]
    spec = {"LaunchTemplateId": template["LaunchTemplateId"], "Version": "$Latest"}
    recorder.set_path(str(log))
    try:
        # The controller resolves the class's selector terms, launches, and (here) makes and cancels one.
        assert controller.describe_capacity_reservations(
            CapacityReservationIds=[rid], Filters=[{"Name": "state", "Values": ["active"]}])["CapacityReservations"]
        controller.create_fleet(
            Type="instant",
            TargetCapacitySpecification={"TotalTargetCapacity": 1, "DefaultTargetCapacityType": "on-demand"},
            LaunchTemplateConfigs=[{"LaunchTemplateSpecification": spec,
                                    "Overrides": [{"InstanceType": TYPE, "SubnetId": subnet}]}],
        )
        with pytest.raises(ClientError):
            controller.run_instances(DryRun=True, ImageId=image, InstanceType=TYPE, SubnetId=subnet,
                                     MinCount=1, MaxCount=1, CapacityReservationSpecification={
                                         "CapacityReservationTarget": {"CapacityReservationId": rid}})
        other = controller.create_capacity_reservation(
            InstanceType=TYPE, InstancePlatform="Linux/UNIX", AvailabilityZone=zone, InstanceCount=1,
            TagSpecifications=[{"ResourceType": "capacity-reservation", "Tags": [{"Key": "team", "Value": "ml"}]}],
        )["CapacityReservation"]["CapacityReservationId"]
        controller.cancel_capacity_reservation(CapacityReservationId=other)
    finally:
        recorder.set_path(None)
    records = [json.loads(line) for line in log.read_text().splitlines()]
    assert all(r["modelled"] and not r.get("error") for r in records), [r for r in records if not r["modelled"]]

    describes = [r for r in records if r["operation"] == "ec2:DescribeCapacityReservations"]
    assert [(r["action"], r["resource"], r["status"]) for r in describes] == [
        ("ec2:DescribeCapacityReservations", "*", 200)]

    arn = f"arn:aws:ec2:{REGION}:{ACCOUNT}:capacity-reservation/{rid}"
    for operation, actions in (("ec2:RunInstances", {"ec2:RunInstances"}),
                               ("ec2:CreateFleet", {"ec2:RunInstances", "ec2:CreateFleet"})):
        on_reservation = [r for r in records if r["operation"] == operation and r["resource"] == arn]
        assert {r["action"] for r in on_reservation} == actions, operation
        assert all(r["resource_found"] and r["context"]["aws:ResourceTag/team"] == "ml" for r in on_reservation)

    create = [r for r in records if r["operation"] == "ec2:CreateCapacityReservation"]
    assert [(r["action"], r["resource"], r["context"].get("ec2:CreateAction")) for r in create] == [
        ("ec2:CreateCapacityReservation", f"arn:aws:ec2:{REGION}:{ACCOUNT}:capacity-reservation/*", None),
        ("ec2:CreateTags", f"arn:aws:ec2:{REGION}:{ACCOUNT}:capacity-reservation/*", "CreateCapacityReservation")]
    cancel = [r for r in records if r["operation"] == "ec2:CancelCapacityReservation"]
    assert [(r["resource"], r["resource_found"], r["context"]["aws:ResourceTag/team"]) for r in cancel] == [
        (f"arn:aws:ec2:{REGION}:{ACCOUNT}:capacity-reservation/{other}", True, "ml")]


def test_the_call_log_models_interruptible_reservations(own_emulator, tmp_path) -> None:
    endpoint, recorder, _ = own_emulator
    log = tmp_path / "interruptible.jsonl"
    ec2 = ec2_client(endpoint)  # the test's own calls: not recorded
    controller = ec2_client(endpoint, controller=True)
    zone = f"{REGION}a"
    source = ec2.create_capacity_reservation(
        InstanceType=TYPE, InstancePlatform="Linux/UNIX", AvailabilityZone=zone, InstanceCount=3,
        InstanceMatchCriteria="targeted", TagSpecifications=[
            {"ResourceType": "capacity-reservation", "Tags": [{"Key": "team", "Value": "ml"}]}],
    )["CapacityReservation"]["CapacityReservationId"]
    image = ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
    vpc = ec2.create_vpc(CidrBlock="10.1.0.0/16")["Vpc"]["VpcId"]
    subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="10.1.0.0/19", AvailabilityZone=zone)["Subnet"]["SubnetId"]
    recorder.set_path(str(log))
    try:
        controller.create_interruptible_capacity_reservation_allocation(
            CapacityReservationId=source, InstanceCount=2, TagSpecifications=[
                {"ResourceType": "capacity-reservation", "Tags": [{"Key": "team", "Value": "batch"}]}])
        rid = ec2.describe_capacity_reservations(CapacityReservationIds=[source])["CapacityReservations"][0][
            "InterruptibleCapacityAllocation"]["InterruptibleCapacityReservationId"]
        template = ec2.create_launch_template(LaunchTemplateName="interruptible", LaunchTemplateData={
            "ImageId": image, "InstanceMarketOptions": {"MarketType": INTERRUPTIBLE},
            "CapacityReservationSpecification": {
                "CapacityReservationPreference": "capacity-reservations-only",
                "CapacityReservationTarget": {"CapacityReservationId": rid}}})["LaunchTemplate"]
        answer = controller.create_fleet(
            Type="instant",
            TargetCapacitySpecification={"TotalTargetCapacity": 1, "DefaultTargetCapacityType": "reserved-capacity"},
            ReservedCapacityOptions={"ReservationTypes": [INTERRUPTIBLE]},
            LaunchTemplateConfigs=[{
                "LaunchTemplateSpecification": {"LaunchTemplateId": template["LaunchTemplateId"], "Version": "$Latest"},
                "Overrides": [{"InstanceType": TYPE, "SubnetId": subnet}]}],
        )
        assert launched(answer) and not answer.get("Errors")
        with pytest.raises(ClientError):
            controller.run_instances(DryRun=True, ImageId=image, InstanceType=TYPE, SubnetId=subnet,
                                     MinCount=1, MaxCount=1, InstanceMarketOptions={"MarketType": INTERRUPTIBLE},
                                     CapacityReservationSpecification={
                                         "CapacityReservationTarget": {"CapacityReservationId": rid}})
        controller.update_interruptible_capacity_reservation_allocation(CapacityReservationId=source,
                                                                        TargetInstanceCount=0)
    finally:
        recorder.set_path(None)
    records = [json.loads(line) for line in log.read_text().splitlines()]
    assert all(r["modelled"] and not r.get("error") for r in records), [r for r in records if not r["modelled"]]

    # A launch into the interruptible reservation is judged on its ARN, as any targeted launch.
    arn = f"arn:aws:ec2:{REGION}:{ACCOUNT}:capacity-reservation/{rid}"
    for operation, actions in (("ec2:RunInstances", {"ec2:RunInstances"}),
                               ("ec2:CreateFleet", {"ec2:RunInstances", "ec2:CreateFleet"})):
        on_reservation = [r for r in records if r["operation"] == operation and r["resource"] == arn]
        assert {r["action"] for r in on_reservation} == actions, operation
        assert all(r["resource_found"] and r["context"]["aws:ResourceTag/team"] == "batch" for r in on_reservation)

    source_arn = f"arn:aws:ec2:{REGION}:{ACCOUNT}:capacity-reservation/{source}"
    new = f"arn:aws:ec2:{REGION}:{ACCOUNT}:capacity-reservation/*"
    create = [r for r in records if r["operation"] == "ec2:CreateInterruptibleCapacityReservationAllocation"]
    assert [(r["action"], r["resource"], r["context"].get("aws:ResourceTag/team"),
             r["context"].get("aws:RequestTag/team"), r["context"].get("ec2:CreateAction")) for r in create] == [
        ("ec2:CreateInterruptibleCapacityReservationAllocation", source_arn, "ml", None, None),
        ("ec2:CreateInterruptibleCapacityReservationAllocation", new, None, "batch", None),
        ("ec2:CreateTags", new, None, "batch", "CreateInterruptibleCapacityReservationAllocation")]
    update = [r for r in records if r["operation"] == "ec2:UpdateInterruptibleCapacityReservationAllocation"]
    assert [(r["action"], r["resource"], r["resource_found"]) for r in update] == [
        ("ec2:UpdateInterruptibleCapacityReservationAllocation", source_arn, True)]

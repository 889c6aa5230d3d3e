"""Call log of the AWS emulator: what IAM would authorise for each request of the controller.

A WSGI middleware in front of moto (hack/moto/server.py installs it). For every AWS
request of the controller it works out, before moto acts on the request, the
authorisations AWS IAM would make for it, and once moto has answered writes them, one
JSON line each, to the file named by
$KARPENTER_RS_MOTO_CALL_LOG (off when unset or empty; POST /_karpenter-rs/call-log
switches it while the emulator runs). tests/aws_emulator/test_controller_policy.py
evaluates those lines against the controller policy of docs/install.md.

Which requests are the controller's
-----------------------------------
The controller names itself in its AWS SDK user agent: `app/karpenter-rs` in the
x-amz-user-agent header (the SDK's app name, set by the `karpenter controller`
command). Everything else is left out: the emulator's own seeding and the tests
(boto3, `Boto3/...`), the kubelet stand-in (boto3), and the Rust tests' own SDK
clients (`aws-sdk-rust/...` without that app name).

One line
--------
    {"seq": 7, "time": "2026-01-01T00:00:00.000Z", "operation": "ec2:CreateFleet",
     "action": "ec2:RunInstances",
     "resource": "arn:aws:ec2:us-west-2:123456789012:launch-template/lt-0123",
     "context": {"aws:RequestedRegion": "us-west-2",
                 "aws:ResourceTag/kubernetes.io/cluster/demo": "owned", ...},
     "resource_found": true, "modelled": true, "status": 200,
     "user_agent": "aws-sdk-rust/... app/karpenter-rs"}

`seq` numbers the request (a request gives several lines), `operation` is the API called,
`action` and `resource` what IAM authorises, `context` the condition keys IAM would know:

* aws:RequestedRegion (the region the request is signed for; us-east-1 for IAM, the
  region of its global endpoint), always;
* aws:RequestTag/<key> and aws:TagKeys: the tags a request puts on the resource;
* aws:ResourceTag/<key>: the tags the resource has when the request arrives (looked up
  in moto's backends; `resource_found` is false when it does not exist);
* ec2:CreateAction on the ec2:CreateTags authorisation of tags set at creation;
* iam:PassedToService on iam:PassRole.

What each operation authorises (after the Service Authorization Reference)
----------------------------------------------------------------------------
* ec2:Describe*, pricing:*: `*`; sts:* too (identity policies do not govern them).
* ec2:CreateLaunchTemplate: the new launch template (launch-template/*) with its request
  tags; ec2:CreateTags on it with ec2:CreateAction=CreateLaunchTemplate when tagged.
* ec2:CreateFleet: ec2:RunInstances on what the launch uses: the new instance, volume,
  network interface (and spot request, for spot) (<type>/*, with the request tags for that
  type: those of the request's TagSpecifications, else those of the launch template's),
  the launch template, subnets, security groups, image and the image's snapshots, and the
  placement group (placement-group/<name>) the launch template or an override puts the
  instance in and the capacity reservation (capacity-reservation/<id>) the launch template
  targets (their ARNs and resource tags); ec2:CreateFleet on the new fleet (fleet/*) and
  on those of the types CreateFleet lists (instance, volume, launch template, subnet, image,
  placement group, capacity reservation);
  ec2:CreateTags with ec2:CreateAction=CreateFleet on each new resource that gets tags;
  iam:PassRole (iam:PassedToService=ec2.amazonaws.com) on the role of the launch
  template's instance profile.
* ec2:RunInstances: the same as CreateFleet's ec2:RunInstances, the placement group being
  the request's (Placement.GroupName or GroupId) or else its launch template's, and so is
  the capacity reservation target.
* ec2:TerminateInstances, ec2:DeleteLaunchTemplate, ec2:CreateTags/DeleteTags: the
  instances / template / tagged resources, with their resource tags.
* ec2:CreatePlacementGroup: the new group (placement-group/<name>) with its request tags, and
  ec2:CreateTags on it (ec2:CreateAction=CreatePlacementGroup) when tagged;
  ec2:DeletePlacementGroup: the group, with its resource tags. Placement groups are the
  emulator's own (hack/moto/placement.py): their tags are looked up there.
* Capacity reservations (the emulator's own, hack/moto/reservations.py): a launch whose launch
  template (or RunInstances request) targets one authorises ec2:RunInstances (and, for
  CreateFleet, ec2:CreateFleet) on its ARN (capacity-reservation/<id>), with its resource tags;
  ec2:CreateCapacityReservation: capacity-reservation/* with its request tags, and ec2:CreateTags
  on it (ec2:CreateAction=CreateCapacityReservation) when tagged; ec2:CancelCapacityReservation:
  the reservation, with its resource tags. DescribeCapacityReservations is a Describe call (`*`).
  A launch without a target that runs in an open reservation is not modelled on it. A launch
  into an interruptible reservation (market type interruptible-capacity-reservation, and for
  CreateFleet the target type reserved-capacity) or a capacity block is judged like any other
  targeted launch: on the ARN of the reservation it targets.
  ec2:CreateInterruptibleCapacityReservationAllocation: the source reservation (its resource
  tags) and the new one (capacity-reservation/*, its request tags; ec2:CreateTags on it with
  ec2:CreateAction=CreateInterruptibleCapacityReservationAllocation when tagged);
  ec2:UpdateInterruptibleCapacityReservationAllocation: the source reservation.
* iam instance-profile operations: the instance profile (its resource tags; request tags
  for CreateInstanceProfile and TagInstanceProfile); AddRoleToInstanceProfile also
  iam:PassRole on the role (iam:PassedToService=ec2.amazonaws.com).
* ssm:GetParameter(s): the parameter ARN (public parameters under /aws/ have no account).
* sqs: the queue ARN. eks:DescribeCluster: the cluster ARN.

Any other operation is logged as its action on `*` with `"modelled": false`, so that the
policy test notices an operation this module does not know the resources of.
"""

from __future__ import annotations

import datetime
import io
import json
import logging
import os
import re
import threading
import traceback
from typing import Any, Callable, Iterable
from urllib.parse import parse_qs, unquote, urlparse

ENV_VAR = "KARPENTER_RS_MOTO_CALL_LOG"
# The token the controller's SDK clients put in their user agent (`app/<name>`).
CONTROLLER_APP = "karpenter-rs"

log = logging.getLogger("krs-moto.call-log")

_CREDENTIAL = re.compile(r"Credential=([^/,\s]+)/(\d{8})/([^/]+)/([^/]+)/aws4_request")
_EKS_CLUSTER = re.compile(r"^/clusters/([^/]+)$")

# EC2 id prefix -> ARN resource type (and whether the ARN has the account).
_EC2_TYPES = {
    "i": ("instance", True),
    "vol": ("volume", True),
    "eni": ("network-interface", True),
    "lt": ("launch-template", True),
    "fleet": ("fleet", True),
    "sir": ("spot-instances-request", True),
    "sg": ("security-group", True),
    "subnet": ("subnet", True),
    "vpc": ("vpc", True),
    "ami": ("image", False),
    "snap": ("snapshot", False),
}
# The region of the global endpoint of IAM in each partition.
_GLOBAL_REGION = {"aws": "us-east-1", "aws-cn": "cn-north-1", "aws-us-gov": "us-gov-west-1"}
# The resource types ec2:CreateFleet itself is authorised on (Service Authorization
# Reference); the launch's other resources are ec2:RunInstances's.
_CREATE_FLEET_TYPES = {"fleet", "instance", "volume", "launch-template", "subnet", "image",
                       "capacity-reservation", "placement-group"}
# Resources a launch creates, as CreateFleet's TagSpecifications name them.
_LAUNCHED = ["instance", "volume", "network-interface"]


def is_controller(environ: dict) -> bool:
    """Whether the request carries the controller's app name in its user agent."""
    for header in ("HTTP_X_AMZ_USER_AGENT", "HTTP_USER_AGENT"):
        tokens = environ.get(header, "").split()
        if f"app/{CONTROLLER_APP}" in tokens:
            return True
    return False


def _now() -> str:
    now = datetime.datetime.now(datetime.timezone.utc)
    return now.strftime("%Y-%m-%dT%H:%M:%S.") + f"{now.microsecond // 1000:03d}Z"


# -- request parsing -----------------------------------------------------------


def query_params(environ: dict, body: bytes) -> dict[str, str]:
    """The parameters of a query-protocol request (URL query and form body), first values."""
    params: dict[str, str] = {}
    for source in (environ.get("QUERY_STRING", ""), body.decode("utf-8", "replace")):
        for key, values in parse_qs(source, keep_blank_values=True).items():
            params.setdefault(key, values[0])
    return params


def indexed(params: dict[str, str], prefix: str) -> list[dict[str, str]]:
    """The members of the list `prefix` of flattened query parameters (`Prefix.N.Rest`), in
    order of N, each as {Rest: value}; `Prefix.N` alone is kept under the key ''."""
    members: dict[int, dict[str, str]] = {}
    head = prefix + "."
    for key, value in params.items():
        if not key.startswith(head):
            continue
        index, _, rest = key[len(head):].partition(".")
        if index.isdigit():
            members.setdefault(int(index), {})[rest] = value
    return [members[i] for i in sorted(members)]


def tag_list(params: dict[str, str], prefix: str) -> dict[str, str]:
    """{key: value} of the tags `Prefix.N.Key` / `Prefix.N.Value`."""
    return {m["Key"]: m.get("Value", "") for m in indexed(params, prefix) if "Key" in m}


def tag_specifications(params: dict[str, str], prefix: str = "TagSpecification") -> dict[str, dict[str, str]]:
    """{resource type: {key: value}} of an EC2 TagSpecification list."""
    out: dict[str, dict[str, str]] = {}
    for spec in indexed(params, prefix):
        rtype = spec.get("ResourceType", "")
        out.setdefault(rtype, {}).update(tag_list(spec, "Tag"))
    return out


def _data_tag_specifications(data: dict) -> dict[str, dict[str, str]]:
    """{resource type: tags} of the TagSpecifications of launch template data in moto."""
    out: dict[str, dict[str, str]] = {}
    for spec in data.get("TagSpecifications") or data.get("TagSpecification") or []:
        rtype = spec.get("ResourceType", "")
        # moto files the template's own tags (CreateLaunchTemplate's top-level
        # TagSpecifications) among the data's: they tag the template, not a launch.
        if rtype == "launch-template":
            continue
        tags = spec.get("Tags") or spec.get("Tag") or []
        out.setdefault(rtype, {}).update({t["Key"]: t.get("Value", "") for t in tags})
    return out


def _placement(params: dict[str, str]) -> dict[str, str]:
    """The placement group members of the `Placement.` parameters of a request or override."""
    return {key: params[f"Placement.{key}"] for key in ("GroupName", "GroupId", "PartitionNumber")
            if params.get(f"Placement.{key}")}


def _over(base: dict | None, given: dict | None) -> dict:
    """Placement `given` over `base` (a launch template's): a group `given` names replaces the
    template's."""
    out = dict(base or {})
    given = given or {}
    if given.get("GroupName") or given.get("GroupId"):
        out.pop("GroupName", None)
        out.pop("GroupId", None)
    out.update(given)
    return out


def _list(value: Any) -> list:
    if value is None:
        return []
    return value if isinstance(value, list) else [value]


# -- the authorisations of one request -----------------------------------------


class Authorisations:
    """Collects the authorisations of one request."""

    def __init__(self, operation: str, region: str, base: dict[str, Any]):
        self.operation = operation
        self.region = region
        self.base = base
        self.items: list[dict[str, Any]] = []

    def add(
        self,
        action: str,
        resource: str,
        *,
        request_tags: dict[str, str] | None = None,
        resource_tags: dict[str, str] | None = None,
        resource_found: bool | None = None,
        modelled: bool = True,
        **extra: Any,
    ) -> None:
        context = dict(self.base)
        if request_tags:
            for key, value in request_tags.items():
                context[f"aws:RequestTag/{key}"] = value
            context["aws:TagKeys"] = sorted(request_tags)
        for key, value in (resource_tags or {}).items():
            context[f"aws:ResourceTag/{key}"] = value
        context.update({k: v for k, v in extra.items() if v is not None})
        self.items.append(
            {
                "operation": self.operation,
                "action": action,
                "resource": resource,
                "context": context,
                "resource_found": resource_found,
                "modelled": modelled,
            }
        )


class Model:
    """What IAM authorises for a request; looks resources up in moto's backends."""

    def __init__(self, account: str, region: str):
        from moto.utilities.utils import get_partition

        self.account = account
        self.region = region
        self.partition = get_partition(region)

    # backends
    def ec2(self):
        from moto.ec2.models import ec2_backends

        return ec2_backends[self.account][self.region]

    def iam(self):
        from moto.iam.models import iam_backends

        return iam_backends[self.account][self.partition]

    # ARNs
    def ec2_arn(self, rtype: str, rid: str, with_account: bool = True) -> str:
        account = self.account if with_account else ""
        return f"arn:{self.partition}:ec2:{self.region}:{account}:{rtype}/{rid}"

    def ec2_id_arn(self, rid: str) -> str:
        prefix = rid.split("-", 1)[0]
        rtype, with_account = _EC2_TYPES.get(prefix, (prefix, True))
        return self.ec2_arn(rtype, rid, with_account)

    def ec2_tags(self, rid: str) -> dict[str, str]:
        tags = self.ec2().tags
        return dict(tags[rid]) if rid in tags else {}

    def ec2_exists(self, rid: str) -> bool | None:
        backend = self.ec2()
        prefix = rid.split("-", 1)[0]
        try:
            if prefix == "i":
                backend.get_instance(rid)
            elif prefix == "lt":
                return rid in backend.launch_templates
            elif prefix == "ami":
                return rid in backend.amis
            elif prefix == "subnet":
                backend.get_subnet(rid)
            elif prefix == "sg":
                return backend.get_security_group_from_id(rid) is not None
            else:
                return None
        except Exception:
            return False
        return True

    def instance_profile(self, name: str):
        try:
            return self.iam().get_instance_profile(name)
        except Exception:
            return None

    def instance_profile_arn(self, name: str, path: str = "/") -> str:
        return f"arn:{self.partition}:iam::{self.account}:instance-profile{path}{name}"

    # -- EC2 -------------------------------------------------------------------

    def ec2_request(self, auth: Authorisations, action: str, params: dict[str, str]) -> None:
        name = action.split(":", 1)[1]
        handler = getattr(self, f"_ec2_{name}", None)
        if handler is not None:
            handler(auth, action, params)
        elif name.startswith("Describe"):
            auth.add(action, "*")
        else:
            auth.add(action, "*", modelled=False)

    def _ec2_CreateLaunchTemplate(self, auth, action, params) -> None:
        tags = tag_specifications(params).get("launch-template", {})
        resource = self.ec2_arn("launch-template", "*")
        auth.add(action, resource, request_tags=tags)
        if tags:
            auth.add("ec2:CreateTags", resource, request_tags=tags, **{"ec2:CreateAction": "CreateLaunchTemplate"})

    def _launch_uses(self, ref: dict[str, str], subnets: set[str], images: set[str],
                     used: dict[str, tuple[dict[str, str], bool | None]],
                     template_specs: dict[str, dict[str, str]], profiles: set[str],
                     placements: list[dict[str, str]] | None = None, target: str | None = None) -> None:
        """What a launch from the launch template `ref` (LaunchTemplateId or LaunchTemplateName,
        and Version), with the request's own `subnets`, `images` and `placements` (those of the
        request or of each override, over the template's), uses: into `used` (arn -> resource
        tags, found), the template's tag specifications into `template_specs`, its instance
        profile into `profiles`; the capacity reservation it targets (`target`, the request's own,
        else the template's) into `used` as well."""
        backend = self.ec2()

        def use(rid: str) -> None:
            arn = self.ec2_id_arn(rid)
            if arn not in used:
                used[arn] = (self.ec2_tags(rid), self.ec2_exists(rid))

        template = None
        try:
            if ref.get("LaunchTemplateId"):
                template = backend.get_launch_template(ref["LaunchTemplateId"])
            elif ref.get("LaunchTemplateName"):
                template = backend.get_launch_template_by_name(ref["LaunchTemplateName"])
        except Exception:
            template = None
        data: dict = {}
        if template is None:
            missing = ref.get("LaunchTemplateId") or ref.get("LaunchTemplateName") or "?"
            used[self.ec2_arn("launch-template", missing)] = ({}, False)
        else:
            use(template.id)
            try:
                data = template.get_version(ref.get("Version") or "$Default").data or {}
            except Exception:
                data = template.latest_version().data or {}
        for rtype, tags in _data_tag_specifications(data).items():
            template_specs.setdefault(rtype, {}).update(tags)
        groups = list(_list(data.get("SecurityGroupIds")))
        for nic in _list(data.get("NetworkInterfaces")):
            groups += _list(nic.get("Groups") or nic.get("SecurityGroupIds"))
        for group in groups:
            use(group)
        profile = data.get("IamInstanceProfile") or {}
        if profile.get("Name"):
            profiles.add(profile["Name"])
        elif profile.get("Arn"):
            profiles.add(profile["Arn"].rsplit("/", 1)[-1])
        images = set(images) | ({data["ImageId"]} if data.get("ImageId") else set())
        subnets = set(subnets)
        for nic in _list(data.get("NetworkInterfaces")):
            if nic.get("SubnetId"):
                subnets.add(nic["SubnetId"])
        for subnet in sorted(subnets):
            use(subnet)
        for image in sorted(images):
            use(image)
            ami = backend.amis.get(image)
            snapshot = getattr(getattr(ami, "ebs_snapshot", None), "id", None)
            if snapshot:
                used.setdefault(self.ec2_arn("snapshot", snapshot, False), (self.ec2_tags(snapshot), True))
        for mapping in _list(data.get("BlockDeviceMappings")):
            snapshot = (mapping.get("Ebs") or {}).get("SnapshotId")
            if snapshot:
                used.setdefault(self.ec2_arn("snapshot", snapshot, False), (self.ec2_tags(snapshot), None))
        for placement in placements or [{}]:
            self._placement_group_uses(_over(data.get("Placement"), placement), used)
        spec = data.get("CapacityReservationSpecification") or {}
        self._reservation_uses(target or (spec.get("CapacityReservationTarget") or {}).get("CapacityReservationId"),
                               used)

    def _reservation_uses(self, target: str | None, used: dict[str, tuple[dict[str, str], bool | None]]) -> None:
        """The capacity reservation (capacity-reservation/<id>) a launch targets."""
        if not target:
            return
        import reservations  # the emulator's own reservations

        reservation = reservations.find(self.ec2(), target)
        if reservation is None:
            used.setdefault(self.ec2_arn("capacity-reservation", target), ({}, False))
        else:
            used.setdefault(reservation.arn, (dict(reservation.tags), True))

    def _ec2_CreateCapacityReservation(self, auth, action, params) -> None:
        self._new_reservation(auth, action, params)

    def _new_reservation(self, auth: Authorisations, action: str, params: dict) -> None:
        """`action` creating a capacity reservation, with its request tags (the member is
        TagSpecifications.N; most actions': TagSpecification.N)."""
        specs = tag_specifications(params, "TagSpecifications") or tag_specifications(params)
        tags = specs.get("capacity-reservation", {})
        resource = self.ec2_arn("capacity-reservation", "*")
        auth.add(action, resource, request_tags=tags)
        if tags:
            auth.add("ec2:CreateTags", resource, request_tags=tags,
                     **{"ec2:CreateAction": action.split(":", 1)[-1]})

    def _ec2_CancelCapacityReservation(self, auth, action, params) -> None:
        self._on_reservation(auth, action, params.get("CapacityReservationId", ""))

    def _on_reservation(self, auth: Authorisations, action: str, rid: str) -> None:
        """`action` on the capacity reservation `rid`, with its resource tags."""
        import reservations  # the emulator's own reservations

        reservation = reservations.find(self.ec2(), rid) if rid else None
        if reservation is None:
            auth.add(action, self.ec2_arn("capacity-reservation", rid or "?"), resource_tags={},
                     resource_found=False)
        else:
            auth.add(action, reservation.arn, resource_tags=dict(reservation.tags), resource_found=True)

    def _ec2_CreateInterruptibleCapacityReservationAllocation(self, auth, action, params) -> None:
        # The source reservation, and the interruptible reservation it makes (with its request tags).
        self._on_reservation(auth, action, params.get("CapacityReservationId", ""))
        self._new_reservation(auth, action, params)

    def _ec2_UpdateInterruptibleCapacityReservationAllocation(self, auth, action, params) -> None:
        self._on_reservation(auth, action, params.get("CapacityReservationId", ""))

    def _placement_group_uses(self, placement: dict | None,
                              used: dict[str, tuple[dict[str, str], bool | None]]) -> None:
        """The placement group a launch with `placement` (GroupName or GroupId) goes into."""
        placement = placement or {}
        group_id, name = placement.get("GroupId"), placement.get("GroupName")
        if not (group_id or name):
            return
        import placement as placement_groups  # the emulator's own groups

        group = placement_groups.find(self.ec2(), name=name, group_id=group_id)
        if group is None:
            used.setdefault(self.ec2_arn("placement-group", name or group_id), ({}, False))
        else:
            used.setdefault(group.arn, (dict(group.tags), True))

    def _ec2_CreatePlacementGroup(self, auth, action, params) -> None:
        tags = tag_specifications(params).get("placement-group", {})
        resource = self.ec2_arn("placement-group", params.get("GroupName") or "*")
        auth.add(action, resource, request_tags=tags)
        if tags:
            auth.add("ec2:CreateTags", resource, request_tags=tags, **{"ec2:CreateAction": "CreatePlacementGroup"})

    def _ec2_DeletePlacementGroup(self, auth, action, params) -> None:
        import placement as placement_groups  # the emulator's own groups

        name = params.get("GroupName", "")
        group = placement_groups.find(self.ec2(), name=name) if name else None
        if group is None:
            auth.add(action, self.ec2_arn("placement-group", name or "?"), resource_tags={}, resource_found=False)
        else:
            auth.add(action, group.arn, resource_tags=dict(group.tags), resource_found=True)

    def _ec2_CreateFleet(self, auth, action, params) -> None:
        spot = params.get("TargetCapacitySpecification.DefaultTargetCapacityType", "").lower() == "spot"
        request_specs = tag_specifications(params)
        # What the launch uses: arn -> (resource tags, found).
        used: dict[str, tuple[dict[str, str], bool | None]] = {}
        template_specs: dict[str, dict[str, str]] = {}
        profiles: set[str] = set()
        for config in indexed(params, "LaunchTemplateConfigs"):
            ref = {k.split(".", 1)[1]: v for k, v in config.items() if k.startswith("LaunchTemplateSpecification.")}
            images, subnets, placements = set(), set(), []
            for override in indexed(config, "Overrides"):
                if override.get("ImageId"):
                    images.add(override["ImageId"])
                if override.get("SubnetId"):
                    subnets.add(override["SubnetId"])
                placements.append(_placement(override))
            self._launch_uses(ref, subnets, images, used, template_specs, profiles, placements)

        created = list(_LAUNCHED) + (["spot-instances-request"] if spot else [])
        tags_of: dict[str, dict[str, str] | None] = {}
        for rtype in ["fleet"] + created:
            if rtype in request_specs:
                tags_of[rtype] = request_specs[rtype]
            elif rtype in template_specs and rtype != "fleet":
                tags_of[rtype] = template_specs[rtype]
            else:
                tags_of[rtype] = None
        auth.add(action, self.ec2_arn("fleet", "*"), request_tags=tags_of["fleet"] or {})
        for launch_action, types in (("ec2:CreateFleet", _CREATE_FLEET_TYPES), ("ec2:RunInstances", None)):
            for rtype in created:
                if types is None or rtype in types:
                    auth.add(launch_action, self.ec2_arn(rtype, "*"), request_tags=tags_of[rtype] or {})
            for arn, (tags, found) in used.items():
                if types is None or arn.split(":", 5)[5].split("/", 1)[0] in types:
                    auth.add(launch_action, arn, resource_tags=tags, resource_found=found)
        for rtype in ["fleet"] + created:
            if tags_of[rtype]:
                auth.add(
                    "ec2:CreateTags",
                    self.ec2_arn(rtype, "*"),
                    request_tags=tags_of[rtype],
                    **{"ec2:CreateAction": "CreateFleet"},
                )
        for name in sorted(profiles):
            self._pass_role(auth, name)

    def _ec2_RunInstances(self, auth, action, params) -> None:
        """RunInstances (the controller's are dry runs validating an EC2NodeClass; IAM
        authorises a dry run as the call itself)."""
        request_specs = tag_specifications(params)
        used: dict[str, tuple[dict[str, str], bool | None]] = {}
        template_specs: dict[str, dict[str, str]] = {}
        profiles: set[str] = set()
        subnets = {params["SubnetId"]} if params.get("SubnetId") else set()
        for nic in indexed(params, "NetworkInterface"):
            if nic.get("SubnetId"):
                subnets.add(nic["SubnetId"])
            for group in indexed(nic, "SecurityGroupId"):
                if group.get(""):
                    used.setdefault(self.ec2_id_arn(group[""]), (self.ec2_tags(group[""]), self.ec2_exists(group[""])))
        for group in indexed(params, "SecurityGroupId"):
            if group.get(""):
                used.setdefault(self.ec2_id_arn(group[""]), (self.ec2_tags(group[""]), self.ec2_exists(group[""])))
        images = {params["ImageId"]} if params.get("ImageId") else set()
        ref = {k.split(".", 1)[1]: v for k, v in params.items() if k.startswith("LaunchTemplate.")}
        target = params.get("CapacityReservationSpecification.CapacityReservationTarget.CapacityReservationId")
        if ref:
            self._launch_uses(ref, subnets, images, used, template_specs, profiles, [_placement(params)], target)
        else:
            self._placement_group_uses(_placement(params), used)
            self._reservation_uses(target, used)
        if params.get("IamInstanceProfile.Name"):
            profiles.add(params["IamInstanceProfile.Name"])
        tags_of = {rtype: request_specs.get(rtype, template_specs.get(rtype)) for rtype in _LAUNCHED}
        for rtype in _LAUNCHED:
            auth.add(action, self.ec2_arn(rtype, "*"), request_tags=tags_of[rtype] or {})
        for arn, (tags, found) in used.items():
            auth.add(action, arn, resource_tags=tags, resource_found=found)
        for rtype in _LAUNCHED:
            if tags_of[rtype]:
                auth.add("ec2:CreateTags", self.ec2_arn(rtype, "*"), request_tags=tags_of[rtype],
                         **{"ec2:CreateAction": "RunInstances"})
        for name in sorted(profiles):
            self._pass_role(auth, name)

    def _pass_role(self, auth: Authorisations, profile_name: str, role_name: str | None = None) -> None:
        """iam:PassRole of the role `role_name`, or of the roles of the profile."""
        roles = []
        if role_name:
            try:
                roles = [self.iam().get_role(role_name).arn]
            except Exception:
                roles = [f"arn:{self.partition}:iam::{self.account}:role/{role_name}"]
        else:
            profile = self.instance_profile(profile_name)
            roles = [r.arn for r in profile.roles] if profile else []
        for arn in roles:
            auth.add("iam:PassRole", arn, **{"iam:PassedToService": "ec2.amazonaws.com"})

    def _ec2_TerminateInstances(self, auth, action, params) -> None:
        for member in indexed(params, "InstanceId"):
            rid = member.get("", "")
            auth.add(action, self.ec2_id_arn(rid), resource_tags=self.ec2_tags(rid),
                     resource_found=bool(self.ec2_exists(rid)))

    def _ec2_DeleteLaunchTemplate(self, auth, action, params) -> None:
        backend = self.ec2()
        rid = params.get("LaunchTemplateId")
        if not rid and params.get("LaunchTemplateName"):
            rid = backend.launch_template_name_to_ids.get(params["LaunchTemplateName"])
        if rid and rid in backend.launch_templates:
            auth.add(action, self.ec2_arn("launch-template", rid), resource_tags=self.ec2_tags(rid),
                     resource_found=True)
        else:
            missing = rid or params.get("LaunchTemplateName", "?")
            auth.add(action, self.ec2_arn("launch-template", missing), resource_tags={}, resource_found=False)

    def _ec2_CreateTags(self, auth, action, params) -> None:
        tags = tag_list(params, "Tag")
        for member in indexed(params, "ResourceId"):
            rid = member.get("", "")
            auth.add(action, self.ec2_id_arn(rid), request_tags=tags, resource_tags=self.ec2_tags(rid),
                     resource_found=self.ec2_exists(rid))

    def _ec2_DeleteTags(self, auth, action, params) -> None:
        keys = [m.get("Key", "") for m in indexed(params, "Tag")]
        for member in indexed(params, "ResourceId"):
            rid = member.get("", "")
            auth.add(action, self.ec2_id_arn(rid), resource_tags=self.ec2_tags(rid),
                     resource_found=self.ec2_exists(rid), **{"aws:TagKeys": sorted(keys)})

    # -- IAM -------------------------------------------------------------------

    def iam_request(self, auth: Authorisations, action: str, params: dict[str, str]) -> None:
        name = action.split(":", 1)[1]
        profile_name = params.get("InstanceProfileName")
        if name == "CreateInstanceProfile":
            path = params.get("Path") or "/"
            auth.add(action, self.instance_profile_arn(profile_name or "", path),
                     request_tags=tag_list(params, "Tags.member"))
            return
        if name == "ListInstanceProfiles":
            auth.add(action, self.instance_profile_arn("*", params.get("PathPrefix") or "/"))
            return
        if profile_name and name in (
            "GetInstanceProfile",
            "DeleteInstanceProfile",
            "AddRoleToInstanceProfile",
            "RemoveRoleFromInstanceProfile",
            "TagInstanceProfile",
            "UntagInstanceProfile",
            "ListInstanceProfileTags",
        ):
            profile = self.instance_profile(profile_name)
            arn = profile.arn if profile else self.instance_profile_arn(profile_name)
            tags = {t["Key"]: t.get("Value", "") for t in (profile.tags if profile else [])}
            extra: dict[str, Any] = {}
            request_tags = None
            if name == "TagInstanceProfile":
                request_tags = tag_list(params, "Tags.member")
            if name == "UntagInstanceProfile":
                extra["aws:TagKeys"] = sorted(m.get("", "") for m in indexed(params, "TagKeys.member"))
            auth.add(action, arn, request_tags=request_tags, resource_tags=tags,
                     resource_found=profile is not None, **extra)
            if name == "AddRoleToInstanceProfile" and params.get("RoleName"):
                self._pass_role(auth, profile_name, params["RoleName"])
            return
        if name.startswith(("Get", "List")) and params.get("RoleName"):
            auth.add(action, f"arn:{self.partition}:iam::{self.account}:role/{params['RoleName']}")
            return
        auth.add(action, "*", modelled=False)

    # -- JSON and REST services ------------------------------------------------

    def ssm_request(self, auth: Authorisations, action: str, body: dict) -> None:
        names = _list(body.get("Name")) + _list(body.get("Names"))
        if action not in ("ssm:GetParameter", "ssm:GetParameters") or not names:
            auth.add(action, "*", modelled=False)
            return
        for name in names:
            auth.add(action, self.ssm_arn(name))

    def ssm_arn(self, name: str) -> str:
        if name.startswith("arn:"):
            return name
        path = name.lstrip("/")
        # AWS's public parameters (/aws/service/...) belong to no account of the caller's.
        account = "" if name.startswith("/aws/") else self.account
        return f"arn:{self.partition}:ssm:{self.region}:{account}:parameter/{path}"

    def sqs_request(self, auth: Authorisations, action: str, body: dict) -> None:
        if "QueueName" in body:
            account = body.get("QueueOwnerAWSAccountId") or self.account
            queue = body["QueueName"]
        elif "QueueUrl" in body:
            parts = urlparse(body["QueueUrl"]).path.strip("/").split("/")
            account, queue = (parts[-2], parts[-1]) if len(parts) >= 2 else (self.account, parts[-1])
        else:
            auth.add(action, "*", modelled=action == "sqs:ListQueues")
            return
        auth.add(action, f"arn:{self.partition}:sqs:{self.region}:{account}:{queue}")

    def eks_request(self, auth: Authorisations, method: str, path: str) -> None:
        match = _EKS_CLUSTER.match(path)
        if match and method == "GET":
            name = unquote(match.group(1))
            auth.add("eks:DescribeCluster", f"arn:{self.partition}:eks:{self.region}:{self.account}:cluster/{name}")
        elif path == "/clusters" and method == "GET":
            auth.add("eks:ListClusters", "*")
        else:
            auth.add(f"eks:{method} {path}", "*", modelled=False)


def authorisations(environ: dict, body: bytes) -> list[dict[str, Any]]:
    """The authorisations the request `environ` + `body` needs (see the module's docstring)."""
    from moto.iam.models import get_account_id_from

    scope = _CREDENTIAL.search(environ.get("HTTP_AUTHORIZATION", ""))
    if not scope:
        return [{"operation": None, "action": None, "resource": None, "context": {},
                 "modelled": False, "error": "unsigned request (no SigV4 credential scope)"}]
    access_key, _, region, service = scope.groups()
    account = os.environ.get("MOTO_ACCOUNT_ID") or environ.get("HTTP_X_MOTO_ACCOUNT_ID") \
        or get_account_id_from(access_key)
    model = Model(account, region)
    target = environ.get("HTTP_X_AMZ_TARGET", "")
    method = environ.get("REQUEST_METHOD", "GET")
    path = environ.get("PATH_INFO", "/")

    if target:
        operation = f"{service}:{target.rsplit('.', 1)[-1]}"
        try:
            payload = json.loads(body or b"{}")
        except ValueError:
            payload = {}
    elif service == "eks":
        operation = None
        payload = {}
    else:
        params = query_params(environ, body)
        operation = f"{service}:{params.get('Action', '')}" if params.get("Action") else None
        payload = params

    # IAM is global: AWS serves it from one region per partition, whatever the client signs for.
    requested = _GLOBAL_REGION.get(model.partition, region) if service == "iam" else region
    auth = Authorisations(operation or f"{service}:{method} {path}", region, {"aws:RequestedRegion": requested})
    if service == "ec2" and operation:
        model.ec2_request(auth, operation, payload)
    elif service == "iam" and operation:
        model.iam_request(auth, operation, payload)
    elif service == "ssm" and operation:
        model.ssm_request(auth, operation, payload)
    elif service == "sqs" and operation:
        model.sqs_request(auth, operation, payload)
    elif service == "eks":
        model.eks_request(auth, method, path)
        auth.operation = auth.items[0]["action"] if auth.items else auth.operation
        for item in auth.items:
            item["operation"] = auth.operation
    elif service in ("pricing", "sts") and operation:
        auth.add(operation, "*")
    elif operation:
        auth.add(operation, "*", modelled=False)
    else:
        auth.add(f"{service}:?", "*", modelled=False)
    # A dry run is authorised as the call itself; the record says it was one.
    if str(payload.get("DryRun", "")).lower() == "true":
        for item in auth.items:
            item["dry_run"] = True
    return auth.items


class CallRecorder:
    """WSGI middleware writing the call log (see the module's docstring)."""

    def __init__(self, app: Callable, path: str | None = None):
        self.app = app
        self.lock = threading.Lock()
        self.seq = 0
        self.path = path or None

    def set_path(self, path: str | None) -> str | None:
        """Records to `path` from now on (None or '': off); returns the previous path."""
        with self.lock:
            previous, self.path = self.path, (path or None)
        if self.path:
            os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
            open(self.path, "a").close()
        log.info("call log: %s", self.path or "off")
        return previous

    def __call__(self, environ: dict, start_response: Callable) -> Iterable[bytes]:
        path = self.path
        if not path or not is_controller(environ):
            return self.app(environ, start_response)
        body = read_body(environ)
        with self.lock:
            self.seq += 1
            seq = self.seq
        try:
            items = authorisations(environ, body)
        except Exception as exc:  # never break the request; report it in the log
            log.error("call log: modelling failed:\n%s", traceback.format_exc())
            items = [{"operation": None, "action": None, "resource": None, "context": {}, "modelled": False,
                      "error": f"{type(exc).__name__}: {exc}"}]
        status_box: list[int] = []

        def recording_start_response(status, headers, exc_info=None):
            try:
                status_box.append(int(str(status).split()[0]))
            except ValueError:
                pass
            return start_response(status, headers, exc_info) if exc_info else start_response(status, headers)

        try:
            return self.app(environ, recording_start_response)
        finally:
            self._write(path, seq, items, status_box[0] if status_box else None, environ)

    def _write(self, path: str, seq: int, items: list[dict], status: int | None, environ: dict) -> None:
        agent = environ.get("HTTP_X_AMZ_USER_AGENT") or environ.get("HTTP_USER_AGENT", "")
        lines = []
        for item in items:
            line = {"seq": seq, "time": _now(), **item, "status": status, "user_agent": agent}
            lines.append(json.dumps(line, sort_keys=False) + "\n")
        try:
            with self.lock, open(path, "a", encoding="utf-8") as out:
                out.write("".join(lines))
        except OSError as exc:
            log.error("call log: cannot write %s: %s", path, exc)


def read_body(environ: dict) -> bytes:
    """The request's body; environ gets a fresh stream of it for the app behind."""
    try:
        length = int(environ.get("CONTENT_LENGTH") or 0)
    except ValueError:
        length = 0
    stream = environ.get("wsgi.input")
    if stream is None:
        return b""
    body = stream.read(length) if length > 0 else (
        stream.read() if environ.get("wsgi.input_terminated") else b"")
    environ["wsgi.input"] = io.BytesIO(body)
    environ["CONTENT_LENGTH"] = str(len(body))
    return body

"""EC2 placement groups in the AWS emulator, which moto 5.2.5 does not have.

moto answers CreatePlacementGroup, DescribePlacementGroups and DeletePlacementGroup with HTTP 500,
and its instances are in no placement group. This module closes that gap in two parts, both
installed by hack/moto/server.py:

* `PlacementGroups`, a WSGI middleware in front of moto (behind the fault injector and the call
  log, so that faults and the call log see these calls like any other), answers the three
  placement-group actions itself, and refuses a launch (RunInstances, an instant CreateFleet)
  into a placement group that does not exist, as EC2 refuses it;
* `install_instance_placement()` makes moto put the instances it launches in their group: those
  of RunInstances (the request's Placement, else its launch template's) and of CreateFleet (the
  launch template's Placement, or the override's).

Placement groups
----------------
CreatePlacementGroup takes GroupName, Strategy (cluster, partition or spread), PartitionCount
(partition only: 1 to 7, default 2), SpreadLevel (spread only: host or rack, default rack) and
TagSpecifications of resource type `placement-group`. A group gets an id `pg-` + 17 hex digits,
the ARN `arn:<partition>:ec2:<region>:<account>:placement-group/<name>` and the state
`available` at once. The groups live on moto's EC2 backend of the account and region, so that
POST /moto-api/reset removes them with everything else. Answers, as EC2's:

    <CreatePlacementGroupResponse xmlns="http://ec2.amazonaws.com/doc/2016-11-15/">
      <requestId>...</requestId>
      <placementGroup><groupName>db</groupName><state>available</state>
        <strategy>partition</strategy><partitionCount>3</partitionCount>
        <groupId>pg-0123456789abcdef0</groupId>
        <groupArn>arn:aws:ec2:us-west-2:123456789012:placement-group/db</groupArn>
        <tagSet><item><key>team</key><value>data</value></item></tagSet></placementGroup>
    </CreatePlacementGroupResponse>

(partitionCount for partition groups only, spreadLevel for spread groups only; an untagged
group has an empty tagSet.) DescribePlacementGroupsResponse lists the same elements as items of
<placementGroupSet>; DeletePlacementGroupResponse is <return>true</return>.

DescribePlacementGroups selects by GroupName.N and GroupId.N (either kind naming a group; none:
every group), then by Filter.N: group-name, group-id, group-arn, state, strategy, spread-level,
partition-count, tag:<key> and tag-key, whose values may have EC2's * and ? wildcards.

Errors (EC2's query-protocol error document, HTTP 400):

* InvalidPlacementGroup.Duplicate: "The Placement Group 'db' already exists.";
* InvalidPlacementGroup.Unknown: "The Placement Group 'db' is unknown." (Describe* of a name or
  id that does not exist, Delete* of a name, a launch into a group that does not exist);
* InvalidPlacementGroup.InUse: DeletePlacementGroup of a group that has instances not
  terminated;
* InvalidParameterValue: a strategy, spread level, partition count, filter or tagged resource
  type EC2 does not take, a launch's partition number outside the group's partitions (or into a
  group that is not a partition group); MissingParameter: no GroupName or Strategy;
* DryRunOperation (412) for a dry run.

Instances in a group
--------------------
DescribeInstances (and the RunInstances answer) shows an instance's group in its placement:
<groupName>, <groupId> and, in a partition group, <partitionNumber>: the launch's PartitionNumber
when it has one, else the group's partitions in turn (1, 2, ..., PartitionCount, 1, ...). The
DescribeInstances filter placement-group-name selects them.

A launch into a group that does not exist (or by a name or id of none) fails as on EC2:
RunInstances with the InvalidPlacementGroup.Unknown error document (400); an `instant` CreateFleet
with HTTP 200, a fleet id, and one InvalidPlacementGroup.Unknown item in its errorSet per override
that names such a group (the shape of hack/moto/faults.py's insufficient-capacity answer). When
some overrides of the fleet name an existing group (or none), moto launches from those only,
and the answer lists the others' errors next to the instances. Dry runs and fleets of type
`request` or `maintain` are left to moto.

Not emulated: a cluster group's single zone, a spread group's seven instances per zone, instance
types a strategy does not take, CreateTags on a pg- id (moto refuses the id), linked and
precision-time groups.
"""

from __future__ import annotations

import os
import re
import secrets
import threading
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence
from urllib.parse import urlencode
from xml.sax.saxutils import escape

import call_log
import faults

ACTIONS = ("CreatePlacementGroup", "DescribePlacementGroups", "DeletePlacementGroup")
LAUNCHES = ("RunInstances", "CreateFleet")
STRATEGIES = ("cluster", "partition", "spread")
SPREAD_LEVELS = ("host", "rack")
MAX_PARTITIONS = 7
DEFAULT_PARTITIONS = 2
DEFAULT_SPREAD_LEVEL = "rack"
MAX_NAME = 255
FILTERS = ("group-name", "group-id", "group-arn", "state", "strategy", "spread-level", "partition-count",
           "tag-key")  # and tag:<key>
EC2_NAMESPACE = faults.EC2_NAMESPACE
# Where a backend keeps its groups (an attribute moto's reset clears with the backend's state).
_STORE = "karpenter_rs_placement_groups"

_CREDENTIAL = re.compile(r"Credential=([^/,\s]+)/(\d{8})/([^/]+)/([^/]+)/aws4_request")
_lock = threading.RLock()


def unknown(reference: str) -> faults.Ec2Error:
    return faults.Ec2Error("InvalidPlacementGroup.Unknown", f"The Placement Group '{reference}' is unknown.")


@dataclass
class PlacementGroup:
    name: str
    id: str
    strategy: str
    arn: str
    partition_count: int | None = None
    spread_level: str | None = None
    state: str = "available"
    tags: dict[str, str] = field(default_factory=dict)
    # Instances launched into the group without a partition number so far.
    unnumbered: int = 0

    def next_partition(self) -> int | None:
        """The partition of the next instance launched without a partition number (in turn)."""
        if self.strategy != "partition":
            return None
        with _lock:
            self.unnumbered += 1
            return (self.unnumbered - 1) % (self.partition_count or 1) + 1

    def filter_values(self, name: str) -> list[str]:
        """The values of the group that the DescribePlacementGroups filter `name` compares."""
        if name.startswith("tag:"):
            key = name[4:]
            return [self.tags[key]] if key in self.tags else []
        values = {
            "group-name": [self.name],
            "group-id": [self.id],
            "group-arn": [self.arn],
            "state": [self.state],
            "strategy": [self.strategy],
            "spread-level": [self.spread_level] if self.spread_level else [],
            "partition-count": [str(self.partition_count)] if self.partition_count else [],
            "tag-key": list(self.tags),
        }
        return values.get(name, [])

    def xml(self) -> str:
        parts = [f"<groupName>{escape(self.name)}</groupName>", f"<state>{self.state}</state>",
                 f"<strategy>{self.strategy}</strategy>"]
        if self.partition_count is not None:
            parts.append(f"<partitionCount>{self.partition_count}</partitionCount>")
        parts.append(f"<groupId>{self.id}</groupId>")
        if self.spread_level:
            parts.append(f"<spreadLevel>{self.spread_level}</spreadLevel>")
        parts.append(f"<groupArn>{escape(self.arn)}</groupArn>")
        tags = "".join(f"<item><key>{escape(k)}</key><value>{escape(v)}</value></item>" for k, v in self.tags.items())
        parts.append(f"<tagSet>{tags}</tagSet>")
        return "".join(parts)


# -- the groups of an account's region ----------------------------------------------------------


def groups(backend: Any) -> dict[str, PlacementGroup]:
    """name -> group, of moto's EC2 backend `backend` (one account's region)."""
    store = backend.__dict__.get(_STORE)
    if store is None:
        with _lock:
            store = backend.__dict__.setdefault(_STORE, {})
    return store


def find(backend: Any, name: str | None = None, group_id: str | None = None) -> PlacementGroup | None:
    """The group named `name`, or of id `group_id`."""
    store = groups(backend)
    if group_id:
        return next((g for g in list(store.values()) if g.id == group_id), None)
    return store.get(name or "")


def backend_of(account: str, region: str) -> Any:
    from moto.ec2.models import ec2_backends

    return ec2_backends[account][region]


def create(backend: Any, name: str, strategy: str, partition_count: str | int | None = None,
           spread_level: str | None = None, tags: dict[str, str] | None = None) -> PlacementGroup:
    from moto.utilities.utils import get_partition

    if not name:
        raise faults.Ec2Error("MissingParameter", "The request must contain the parameter groupName")
    if len(name) > MAX_NAME:
        raise faults.Ec2Error("InvalidParameterValue",
                             f"Value ({name}) for parameter groupName is invalid. Length exceeds {MAX_NAME}.")
    if not strategy:
        raise faults.Ec2Error("MissingParameter", "The request must contain the parameter strategy")
    if strategy not in STRATEGIES:
        raise faults.Ec2Error("InvalidParameterValue",
                             f"Value ({strategy}) for parameter strategy is invalid. "
                             f"Valid values: {', '.join(STRATEGIES)}.")
    count = None
    if strategy == "partition":
        try:
            count = int(partition_count) if partition_count not in (None, "") else DEFAULT_PARTITIONS
        except ValueError:
            count = 0
        if not 1 <= count <= MAX_PARTITIONS:
            raise faults.Ec2Error("InvalidParameterValue",
                                 f"Value ({partition_count}) for parameter partitionCount is invalid. "
                                 f"The partition count must be between 1 and {MAX_PARTITIONS}.")
    elif partition_count not in (None, ""):
        raise faults.Ec2Error("InvalidParameterCombination",
                             "The parameter partitionCount is only valid with the partition strategy.")
    level = None
    if strategy == "spread":
        level = spread_level or DEFAULT_SPREAD_LEVEL
        if level not in SPREAD_LEVELS:
            raise faults.Ec2Error("InvalidParameterValue",
                                 f"Value ({level}) for parameter spreadLevel is invalid. "
                                 f"Valid values: {', '.join(SPREAD_LEVELS)}.")
    elif spread_level:
        raise faults.Ec2Error("InvalidParameterCombination",
                             "The parameter spreadLevel is only valid with the spread strategy.")
    region, account = backend.region_name, backend.account_id
    with _lock:
        store = groups(backend)
        if name in store:
            raise faults.Ec2Error("InvalidPlacementGroup.Duplicate", f"The Placement Group '{name}' already exists.")
        group = PlacementGroup(
            name=name,
            id="pg-" + secrets.token_hex(9)[:17],
            strategy=strategy,
            arn=f"arn:{get_partition(region)}:ec2:{region}:{account}:placement-group/{name}",
            partition_count=count,
            spread_level=level,
            tags=dict(tags or {}),
        )
        store[name] = group
    return group


def describe(backend: Any, names: Sequence[str] = (), ids: Sequence[str] = (),
             filters: Sequence[tuple[str, list[str]]] = ()) -> list[PlacementGroup]:
    """DescribePlacementGroups: the groups named (by name or id; none named: every group) that
    pass every filter."""
    store = groups(backend)
    if names or ids:
        selected: list[PlacementGroup] = []
        for name in names:
            group = store.get(name)
            if group is None:
                raise unknown(name)
            selected.append(group)
        for group_id in ids:
            group = find(backend, group_id=group_id)
            if group is None:
                raise unknown(group_id)
            selected.append(group)
        # In creation order, each once.
        chosen = {g.id for g in selected}
        candidates = [g for g in list(store.values()) if g.id in chosen]
    else:
        candidates = list(store.values())
    for name, _ in filters:
        if name not in FILTERS and not name.startswith("tag:"):
            raise faults.Ec2Error("InvalidParameterValue", f"The filter '{name}' is invalid")
    return [g for g in candidates
            if all(_matches(g.filter_values(name), values) for name, values in filters)]


def delete(backend: Any, name: str) -> None:
    if not name:
        raise faults.Ec2Error("MissingParameter", "The request must contain the parameter groupName")
    with _lock:
        group = groups(backend).get(name)
        if group is None:
            raise unknown(name)
        if any(_in_group(i, group) and i.state != "terminated" for i in backend.all_instances()):
            raise faults.Ec2Error("InvalidPlacementGroup.InUse",
                                 f"The placement group '{name}' is in use and may not be deleted.")
        del groups(backend)[name]


def _in_group(instance: Any, group: PlacementGroup) -> bool:
    return getattr(instance.placement, "group_id", None) == group.id


def _matches(actual: list[str], wanted: list[str]) -> bool:
    """Whether one of `actual` matches one of the filter values `wanted` (EC2's * and ?)."""
    return any(_wildcard(w).fullmatch(a) for w in wanted for a in actual)


def _wildcard(value: str) -> re.Pattern:
    out, escaped = [], False
    for char in value:
        if escaped:
            out.append(re.escape(char))
            escaped = False
        elif char == "\\":
            escaped = True
        elif char == "*":
            out.append(".*")
        elif char == "?":
            out.append(".")
        else:
            out.append(re.escape(char))
    return re.compile("".join(out), re.DOTALL)


# -- launches -------------------------------------------------------------------------------------


def template_data(backend: Any, ref: dict[str, Any]) -> dict | None:
    """The data of the launch template version `ref` names (LaunchTemplateId or
    LaunchTemplateName, Version), or None when there is no such template or version."""
    try:
        if ref.get("LaunchTemplateId"):
            template = backend.get_launch_template(ref["LaunchTemplateId"])
        elif ref.get("LaunchTemplateName"):
            template = backend.get_launch_template_by_name(ref["LaunchTemplateName"])
        else:
            return None
        return template.get_version(ref.get("Version") or template.default_version_number).data or {}
    except Exception:
        return None


def merged(*placements: dict | None) -> dict[str, Any]:
    """The placement of a launch: each later placement (the request's, an override's) overrides
    the earlier ones (the launch template's); a group named by the later one replaces the earlier
    one's group whole."""
    out: dict[str, Any] = {}
    for placement in placements:
        placement = {k: v for k, v in (placement or {}).items() if v not in (None, "")}
        if placement.get("GroupName") or placement.get("GroupId"):
            out.pop("GroupName", None)
            out.pop("GroupId", None)
        out.update(placement)
    return out


def resolve(backend: Any, placement: dict[str, Any]) -> tuple[PlacementGroup | None, int | None]:
    """The group and partition number a launch with `placement` asks for (None, None: no group);
    raises faults.Ec2Error as EC2 refuses the launch."""
    reference = placement.get("GroupId") or placement.get("GroupName")
    if not reference:
        return None, None
    group = find(backend, group_id=placement.get("GroupId")) if placement.get("GroupId") \
        else find(backend, name=placement.get("GroupName"))
    if group is None or group.state != "available":
        raise unknown(reference)
    number = placement.get("PartitionNumber")
    if number in (None, ""):
        return group, None
    try:
        number = int(number)
    except (TypeError, ValueError):
        number = 0
    if group.strategy != "partition" or not 1 <= number <= (group.partition_count or 0):
        raise faults.Ec2Error(
            "InvalidParameterValue",
            f"Value ({placement.get('PartitionNumber')}) for parameter partitionNumber is invalid. "
            + (f"The placement group '{group.name}' has partitions 1 to {group.partition_count}."
               if group.strategy == "partition" else f"The placement group '{group.name}' is not a partition group."),
        )
    return group, number


def place(instance: Any, group: PlacementGroup, number: int | None) -> None:
    """Put the moto instance `instance` in `group` (partition `number`, else the next in turn)."""
    placement = instance.placement
    placement.group_name = group.name
    placement.group_id = group.id
    if group.strategy == "partition":
        placement.partition_number = number if number is not None else group.next_partition()


def _placement_params(params: dict[str, str], prefix: str) -> dict[str, str]:
    return {key: params[f"{prefix}.{key}"] for key in ("GroupName", "GroupId", "PartitionNumber")
            if params.get(f"{prefix}.{key}")}


def _ref(params: dict[str, str], prefix: str) -> dict[str, str]:
    head = prefix + "."
    return {k[len(head):]: v for k, v in params.items() if k.startswith(head)}


def _launch_template_placement(backend: Any, ref: dict[str, str]) -> dict | None:
    data = template_data(backend, ref)
    return (data or {}).get("Placement") if data is not None else None


def install_instance_placement() -> None:
    """Make moto put the instances RunInstances and CreateFleet launch in their placement group
    (see the module's docstring); the middleware has refused launches into unknown groups."""
    from moto.ec2 import utils as ec2_utils
    from moto.ec2.models import fleets
    from moto.ec2.responses.instances import InstanceResponse

    if getattr(InstanceResponse.run_instances, "_places_in_groups", False):
        return  # installed already

    original_run = InstanceResponse.run_instances

    def run_instances(self, _original=original_run):
        result = _original(self)
        reservation = getattr(result, "result", None)
        template = _launch_template_placement(self.ec2_backend, self._get_param("LaunchTemplate", {}) or {})
        request = {k: self._get_param(f"Placement.{k}") for k in ("GroupName", "GroupId", "PartitionNumber")}
        try:
            group, number = resolve(self.ec2_backend, merged(template, request))
        except faults.Ec2Error:
            group, number = None, None
        for instance in getattr(reservation, "instances", None) or []:
            if group is not None:
                place(instance, group, number)
        return result

    run_instances._places_in_groups = True  # type: ignore[attr-defined]
    InstanceResponse.run_instances = run_instances

    def spec_placement(fleet, spec) -> tuple[PlacementGroup | None, int | None]:
        ref = getattr(spec, "launch_template_spec", None) or {}
        template = _launch_template_placement(fleet.ec2_backend, ref)
        override = (getattr(spec, "overrides", None) or {}).get("Placement")
        try:
            return resolve(fleet.ec2_backend, merged(template, override))
        except faults.Ec2Error:
            return None, None

    def place_launched(fleet, launched: list[tuple[Any, Any]]) -> None:
        for instance, spec in launched:
            group, number = spec_placement(fleet, spec)
            if group is not None and instance is not None:
                place(instance, group, number)

    original_on_demand = fleets.Fleet.create_on_demand_requests

    def create_on_demand_requests(self, weight, _original=original_on_demand):
        before = len(self.on_demand_instances)
        out = _original(self, weight)
        place_launched(self, [(i["instance"], i.get("launch_spec")) for i in self.on_demand_instances[before:]])
        return out

    original_spot = fleets.Fleet.create_spot_requests

    def create_spot_requests(self, weight, _original=original_spot):
        before = len(self.spot_requests)
        out = _original(self, weight)
        place_launched(self, [(getattr(r, "instance", None), r.launch_spec) for r in self.spot_requests[before:]])
        return out

    fleets.Fleet.create_on_demand_requests = create_on_demand_requests
    fleets.Fleet.create_spot_requests = create_spot_requests

    # DescribeInstances' filter of instances by their group's name.
    ec2_utils.filter_dict_attribute_mapping.setdefault("placement-group-name", "placement.group_name")


# -- the middleware --------------------------------------------------------------------------------


def request_scope(environ: dict) -> tuple[str, str, str] | None:
    """(service, region, account) of a SigV4-signed request, as moto works them out."""
    match = _CREDENTIAL.search(environ.get("HTTP_AUTHORIZATION", ""))
    if not match:
        return None
    access_key, _, region, service = match.groups()
    if os.environ.get("MOTO_ACCOUNT_ID"):
        account = os.environ["MOTO_ACCOUNT_ID"]
    elif environ.get("HTTP_X_MOTO_ACCOUNT_ID"):
        account = environ["HTTP_X_MOTO_ACCOUNT_ID"]
    else:
        from moto.iam.models import get_account_id_from

        account = get_account_id_from(access_key)
    return service, region, account


def _values(member: dict[str, str], prefix: str) -> list[str]:
    return [m[""] for m in call_log.indexed(member, prefix) if "" in m]


class PlacementGroups:
    """WSGI middleware answering the placement-group actions and refusing launches into unknown
    groups (see the module's docstring)."""

    def __init__(self, app: Callable):
        self.app = app

    def __call__(self, environ: dict, start_response: Callable) -> Iterable[bytes]:
        scope = request_scope(environ)
        if scope is None or scope[0] != "ec2":
            return self.app(environ, start_response)
        body = call_log.read_body(environ)
        params = call_log.query_params(environ, body)
        action = params.get("Action", "")
        if action not in ACTIONS and action not in LAUNCHES:
            return self.app(environ, start_response)
        _, region, account = scope
        dry_run = params.get("DryRun", "").lower() == "true"
        try:
            if action in ACTIONS:
                if dry_run:
                    raise faults.Ec2Error("DryRunOperation", "Request would have succeeded, but DryRun flag is set.", 412)
                return faults.answer(start_response, 200, self._placement_action(action, params, backend_of(account, region)))
            if dry_run:
                return self.app(environ, start_response)
            if action == "RunInstances":
                self._check_run_instances(params, backend_of(account, region))
                return self.app(environ, start_response)
            return self._create_fleet(environ, start_response, params, backend_of(account, region))
        except faults.Ec2Error as error:
            return faults.answer(start_response, error.status, faults.error_document(error.code, error.message))

    # -- the placement-group actions --------------------------------------------------------------

    def _placement_action(self, action: str, params: dict[str, str], backend: Any) -> bytes:
        if action == "CreatePlacementGroup":
            specs = call_log.tag_specifications(params)
            for rtype in specs:
                if rtype != "placement-group":
                    raise faults.Ec2Error("InvalidParameterValue",
                                         f"'{rtype}' is not a valid taggable resource type for this operation.")
            group = create(backend, params.get("GroupName", ""), params.get("Strategy", ""),
                           params.get("PartitionCount"), params.get("SpreadLevel"),
                           specs.get("placement-group"))
            return faults.ec2_response(action, f"<placementGroup>{group.xml()}</placementGroup>")
        if action == "DescribePlacementGroups":
            filters = [(f.get("Name", ""), _values(f, "Value")) for f in call_log.indexed(params, "Filter")]
            found = describe(backend, _values(params, "GroupName"), _values(params, "GroupId"), filters)
            items = "".join(f"<item>{g.xml()}</item>" for g in found)
            return faults.ec2_response(action, f"<placementGroupSet>{items}</placementGroupSet>")
        delete(backend, params.get("GroupName", ""))
        return faults.ec2_response(action, "<return>true</return>")

    # -- launches ---------------------------------------------------------------------------------

    @staticmethod
    def _check_run_instances(params: dict[str, str], backend: Any) -> None:
        ref = _ref(params, "LaunchTemplate")
        template = _launch_template_placement(backend, ref) if ref else None
        resolve(backend, merged(template, _placement_params(params, "Placement")))

    def _create_fleet(self, environ: dict, start_response: Callable, params: dict[str, str],
                      backend: Any) -> Iterable[bytes]:
        if (params.get("Type") or "maintain") != "instant":
            return self.app(environ, start_response)
        lifecycle = faults.fleet_lifecycle(params)
        errors: list[str] = []
        configs = []  # (config, kept overrides, had overrides)
        for config in call_log.indexed(params, "LaunchTemplateConfigs"):
            ref = _ref(config, "LaunchTemplateSpecification")
            template = _launch_template_placement(backend, ref)
            overrides = call_log.indexed(config, "Overrides")
            kept = []
            for override in overrides or [{}]:
                try:
                    resolve(backend, merged(template, _placement_params(override, "Placement")))
                    kept.append(override)
                except faults.Ec2Error as error:
                    errors.append(faults.fleet_error_item(faults.fleet_override(config, override), lifecycle,
                                                          error.code, error.message))
            configs.append((config, kept, bool(overrides)))
        if not errors:
            return self.app(environ, start_response)
        if not any(kept for _, kept, _ in configs):
            return faults.answer(start_response, 200, faults.unfilled_fleet(errors))
        # Launch from the other overrides; their answer gets the errors of those left out.
        _set_body(environ, _without_overrides(params, configs))
        captured, answer = faults.call_captured(self.app, environ)
        if captured and captured[0].startswith("200"):
            answer = _with_errors(answer, errors)
        headers = [(k, v) for k, v in captured[1] if k.lower() != "content-length"]
        start_response(captured[0], headers + [("Content-Length", str(len(answer)))])
        return [answer]


def _without_overrides(params: dict[str, str], configs: list[tuple[dict, list[dict], bool]]) -> dict[str, str]:
    """The CreateFleet parameters with only the kept overrides (configs and overrides renumbered)."""
    out = {k: v for k, v in params.items() if not k.startswith("LaunchTemplateConfigs.")}
    number = 0
    for config, kept, had_overrides in configs:
        if not kept:
            continue
        number += 1
        head = f"LaunchTemplateConfigs.{number}"
        for key, value in config.items():
            if not key.startswith("Overrides."):
                out[f"{head}.{key}"] = value
        if had_overrides:
            for index, override in enumerate(kept, 1):
                for key, value in override.items():
                    out[f"{head}.Overrides.{index}.{key}"] = value
    return out


def _set_body(environ: dict, params: dict[str, str]) -> None:
    import io

    body = urlencode(params).encode()
    environ["QUERY_STRING"] = ""
    environ["wsgi.input"] = io.BytesIO(body)
    environ["CONTENT_LENGTH"] = str(len(body))


def _with_errors(answer: bytes, errors: list[str]) -> bytes:
    """moto's CreateFleet answer with `errors` in its errorSet."""
    text = answer.decode("utf-8")
    items = "".join(errors)
    if "<errorSet>" in text:
        text = text.replace("<errorSet>", "<errorSet>" + items, 1)
    elif "<fleetInstanceSet" in text:
        text = text.replace("<fleetInstanceSet", f"<errorSet>{items}</errorSet><fleetInstanceSet", 1)
    else:
        text = text.replace("</CreateFleetResponse>", f"<errorSet>{items}</errorSet></CreateFleetResponse>", 1)
    return text.encode("utf-8")

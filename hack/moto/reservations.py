"""EC2 On-Demand Capacity Reservations, capacity blocks and interruptible reservations in the AWS
emulator (moto 5.2.5 has none).

moto answers CreateCapacityReservation, DescribeCapacityReservations and
CancelCapacityReservation with HTTP 500 (and knows neither
CreateInterruptibleCapacityReservationAllocation nor UpdateInterruptibleCapacityReservationAllocation),
and its instances run in no reservation. This module closes that gap in three parts, installed
by hack/moto/server.py:

* `CapacityReservations`, a WSGI middleware in front of moto (behind the placement groups, the
  call log and the fault injector), answers the five actions itself, refuses launches
  (RunInstances, an instant CreateFleet) that a targeted reservation cannot take, as EC2 does,
  and before any EC2 request lets the reservations that have ended release their instances;
* `install_instance_reservations()` makes moto's launches consume the reservations: an
  instance launched into a reservation takes one of its available instances, and gives it back
  when it is terminated (or leaves the reservation when the reservation ends);
* `create_capacity_block()` and `update()`, behind POST /_karpenter-rs/capacity-block and
  POST /_karpenter-rs/capacity-reservation, make capacity blocks (which EC2 sells through
  PurchaseCapacityBlock) and change a reservation's state or end date.

Reservations
------------
CreateCapacityReservation takes InstanceType, InstancePlatform (default Linux/UNIX),
AvailabilityZone or AvailabilityZoneId, InstanceCount, InstanceMatchCriteria (open or
targeted, default open), Tenancy (default or dedicated, default default), EndDateType
(unlimited, the default, or limited with EndDate) and TagSpecifications of resource type
`capacity-reservation`. A reservation gets an id `cr-` + 17 hex digits, the ARN
`arn:<partition>:ec2:<region>:<account>:capacity-reservation/<id>`, the account as OwnerId, the
reservation type `default` and the state `active`; TotalInstanceCount and
AvailableInstanceCount are InstanceCount. Reservations live on moto's EC2 backend of the account
and region, so that POST /moto-api/reset removes them. Answers, as EC2's:

    <CreateCapacityReservationResponse xmlns="http://ec2.amazonaws.com/doc/2016-11-15/">
      <requestId>...</requestId>
      <capacityReservation>
        <capacityReservationId>cr-0123456789abcdef0</capacityReservationId>
        <ownerId>123456789012</ownerId>
        <capacityReservationArn>arn:aws:ec2:us-west-2:123456789012:capacity-reservation/cr-0123456789abcdef0</capacityReservationArn>
        <availabilityZoneId>usw2-az2</availabilityZoneId><instanceType>m5.large</instanceType>
        <instancePlatform>Linux/UNIX</instancePlatform><availabilityZone>us-west-2a</availabilityZone>
        <tenancy>default</tenancy><totalInstanceCount>2</totalInstanceCount>
        <availableInstanceCount>1</availableInstanceCount><ebsOptimized>false</ebsOptimized>
        <ephemeralStorage>false</ephemeralStorage><state>active</state>
        <startDate>2026-01-01T00:00:00.000Z</startDate><endDate>2026-01-02T00:00:00.000Z</endDate>
        <endDateType>limited</endDateType><instanceMatchCriteria>targeted</instanceMatchCriteria>
        <createDate>2026-01-01T00:00:00.000Z</createDate>
        <tagSet><item><key>team</key><value>ml</value></item></tagSet>
        <reservationType>default</reservationType><interruptible>false</interruptible>
      </capacityReservation>
    </CreateCapacityReservationResponse>

(endDate only when the reservation has one; <interruptibleCapacityAllocation>, <interruptionInfo>
and <zeroSizePreference> as "Interruptible reservations" says.) DescribeCapacityReservationsResponse
lists the same elements as items of <capacityReservationSet> (and <nextToken> when there are
more); CancelCapacityReservationResponse is <return>true</return>.

DescribeCapacityReservations selects by CapacityReservationId.N (an id of no reservation:
InvalidCapacityReservationId.NotFound), then by Filter.N: instance-type, availability-zone,
availability-zone-id, owner-id, state, instance-match-criteria, tenancy, instance-platform,
end-date-type, reservation-type, capacity-reservation-id, interruptible (true or false),
tag:<key> and tag-key (EC2's * and ? wildcards), and pages with MaxResults (1-1000; not with ids)
and NextToken.

CancelCapacityReservation sets the state `cancelled` and AvailableInstanceCount 0 (a reservation
not active or scheduled: IncorrectState; an interruptible one: OperationNotPermitted, it is
cancelled through its source); its instances leave it (see "When a reservation ends").

Capacity blocks
---------------
POST /_karpenter-rs/capacity-block {"instance_type", "zone", "count", "start", "end", "region",
"account", "tags", "platform"} (start defaults to now, end to a day after start) makes a
reservation of type `capacity-block`, targeted, with EndDateType limited. Its state follows the
clock when it is described or launched into: `scheduled` before start, `active` from start to end,
`expired` after end (a capacity block is then left with no available instances, and its
instances are terminated: see "When a reservation ends"). A reservation of type `default` with a
limited end date expires at its end as well.
POST /_karpenter-rs/capacity-reservation {"id", "region", "account", "state", "end"} sets a
reservation's state (any of EC2's: active, expired, cancelled, pending, failed, scheduled,
payment-pending, payment-failed, assessing, delayed, unsupported; null goes back to the
computed one) or its end date (a capacity block's time line follows it).

Interruptible reservations
--------------------------
CreateInterruptibleCapacityReservationAllocation takes CapacityReservationId (the source: an
active reservation of type `default`, without an end date, with no interruptible allocation
that is not canceled), InstanceCount (1-1000, at most the source's available instances),
TagSpecification.N of `capacity-reservation` and ZeroSizePreference (default or retain, default
default). It makes a new reservation (a new cr- id and ARN) with the source's instance type,
platform, zone and tenancy, InstanceMatchCriteria targeted, type `default`, EndDateType
unlimited, the tags asked for, TotalInstanceCount and AvailableInstanceCount InstanceCount, and
<interruptible>true</interruptible>; the source keeps its TotalInstanceCount, but its
AvailableInstanceCount no longer counts the instances it lent. Answers, as EC2's (the new id is
not in the answer: DescribeCapacityReservations of the source shows it):

    <CreateInterruptibleCapacityReservationAllocationResponse xmlns="http://ec2.amazonaws.com/doc/2016-11-15/">
      <requestId>...</requestId>
      <sourceCapacityReservationId>cr-0123456789abcdef0</sourceCapacityReservationId>
      <targetInstanceCount>2</targetInstanceCount><status>active</status>
      <interruptionType>adhoc</interruptionType>
    </CreateInterruptibleCapacityReservationAllocationResponse>

Refused (HTTP 400): no source (InvalidCapacityReservationId.NotFound), a source not active or
that has an allocation already (IncorrectState), a source that is a capacity block, is
interruptible itself or has an end date, an InstanceCount above its available instances, or a
tagged resource type other than `capacity-reservation` (InvalidParameterValue), no
CapacityReservationId or InstanceCount (MissingParameter). DescribeCapacityReservations then
shows, after <interruptible>, on the source:

    <interruptibleCapacityAllocation><instanceCount>2</instanceCount>
      <targetInstanceCount>2</targetInstanceCount><status>active</status>
      <interruptibleCapacityReservationId>cr-0fedcba9876543210</interruptibleCapacityReservationId>
      <interruptionType>adhoc</interruptionType><zeroSizePreference>default</zeroSizePreference>
    </interruptibleCapacityAllocation>

and on the interruptible reservation:

    <interruptionInfo><sourceCapacityReservationId>cr-0123456789abcdef0</sourceCapacityReservationId>
      <interruptionType>adhoc</interruptionType></interruptionInfo><zeroSizePreference>default</zeroSizePreference>

UpdateInterruptibleCapacityReservationAllocation takes the source's CapacityReservationId,
TargetInstanceCount (0-1000, changing the allocation by at most 1000) and ZeroSizePreference. More
instances are taken from the source's available ones (InvalidParameterValue when it has not
that many; IncorrectState when it is not active); fewer are reclaimed at once: the interruptible
reservation's unused instances first, then those running in it, the newest launched first, which
are terminated as EC2 terminates them after its two-minute warning (moto: at once, no
shutting-down), keeping the reservation's <capacityReservationId> and lifecycle, with the state
transition reason `Service initiated (<time> GMT)` and the state reason Server.ScheduledStop (the
emulator's words, as for a capacity block). The capacity goes back to the source's available
instances. At 0 instances with the preference `default` the interruptible reservation is
cancelled and the allocation's status is `canceled` (a new allocation can then be made); with
`retain` it stays active, empty. Refused: the id of no reservation
(InvalidCapacityReservationId.NotFound), of an interruptible reservation or of a source without
an allocation (InvalidParameterValue). Answers:

    <UpdateInterruptibleCapacityReservationAllocationResponse xmlns="http://ec2.amazonaws.com/doc/2016-11-15/">
      <requestId>...</requestId>
      <interruptibleCapacityReservationId>cr-0fedcba9876543210</interruptibleCapacityReservationId>
      <sourceCapacityReservationId>cr-0123456789abcdef0</sourceCapacityReservationId>
      <instanceCount>1</instanceCount><targetInstanceCount>1</targetInstanceCount>
      <status>active</status><interruptionType>adhoc</interruptionType>
    </UpdateInterruptibleCapacityReservationAllocationResponse>

(status `canceled` once cancelled.) When the source ends (cancelled or expired), so does the
capacity it lent: the interruptible reservation is cancelled and its instances terminated. A
dry run of either action answers DryRunOperation.

Launches
--------
A launch's capacity reservation specification is the launch template's
CapacityReservationSpecification, or the RunInstances request's own (its preference and its
CapacityReservationTarget.CapacityReservationId); its market type is InstanceMarketOptions.MarketType
(the request's, else the template's).

* A target: each instance takes one available instance of that reservation. The reservation must
  exist (else InvalidCapacityReservationId.NotFound), have the instance type and zone of the launch
  (else InvalidParameterCombination), be a capacity block exactly when the market type is
  `capacity-block` and interruptible exactly when the market type is
  `interruptible-capacity-reservation` (else InvalidParameterCombination; so is that market type
  without a target) and be active with an available instance left;
  otherwise the launch fails with ReservationCapacityExceeded, the code Karpenter reads as the
  reservation being exhausted. RunInstances answers that with EC2's error document (HTTP 400; also
  for a MinCount above the available instances: moto launches MinCount instances); an
  `instant` CreateFleet answers 200 with an error item per override that cannot launch, and launches
  from the others (no instance when none can), at most as many instances as the reservations of its
  overrides have left.
* A fleet whose DefaultTargetCapacityType is `capacity-block` is launched as on-demand (its
  instances carry the capacity block). So is one whose DefaultTargetCapacityType is
  `reserved-capacity` (moto knows neither), whose ReservedCapacityOptions.ReservationType.N
  (on-demand-capacity-reservation, capacity-block, interruptible-capacity-reservation; none:
  any) name the kinds of reservation its overrides may target: an override whose launch template
  targets no reservation, or one of another kind, gets an InvalidParameterCombination error item
  (lifecycle interruptible-capacity-reservation when that kind is listed, else on-demand). Such a
  fleet must be `instant` and have no OnDemandTargetCapacity or SpotTargetCapacity (else 400,
  InvalidParameterCombination); as for any targeted fleet, it launches no more than its
  reservations have left and does not fall back to On-Demand. ReservedCapacityOptions'
  CapacityReservationTarget and fallback options are not emulated.
* No target, preference `open` (the default): an instance takes an available instance of an active
  `open` reservation of its instance type, zone, platform (Linux/UNIX or Windows) and tenancy when
  there is one (the oldest first), else it runs as plain On-Demand. Preference `none` never runs
  in a reservation; `capacity-reservations-only` without a target runs only in such an open one
  (else ReservationCapacityExceeded).

DescribeInstances (and the RunInstances answer) then shows the instance's <capacityReservationId>,
its <capacityReservationSpecification> (the preference, `capacity-reservations-only` and the target
for a targeted launch, else `open` or `none`) and, in a capacity block, the instance lifecycle
<instanceLifecycle>capacity-block</instanceLifecycle>, in an interruptible reservation
<instanceLifecycle>interruptible-capacity-reservation</instanceLifecycle>; an instant fleet's
answer shows the same as the <lifecycle> of its instances (moto: on-demand). An instance that
is shutting down or terminated no longer counts against the reservation. Dry runs and fleets of
type `request` or `maintain` are left to moto (but for the target type reserved-capacity, which
EC2 takes for `instant` fleets only).

When a reservation ends
-----------------------
A reservation has ended once its state is `cancelled` or `expired`, however it got there:
CancelCapacityReservation, a state set through POST /_karpenter-rs/capacity-reservation, or the
clock passing its end date (its own or one set through that endpoint). Its instances then go as
they do on EC2:

* a reservation of type `default` (an ODCR): its instances run on as ordinary On-Demand
  instances in no reservation. DescribeInstances (and whatever else shows the instance) drops
  their <capacityReservationId>, and their <capacityReservationSpecification> becomes
  <capacityReservationPreference>open</capacityReservationPreference> with no
  <capacityReservationTarget>, whatever the launch asked; their state, lifecycle and everything
  else are unchanged;
* an interruptible reservation (cancelled with its source, or through its allocation): its
  instances are terminated, as a capacity block's;
* a capacity block: its instances are terminated. EC2 begins that 30 minutes before the block's
  end; the emulator does it once the block has expired (at or after its end date, or when a state
  `expired` or `cancelled` is set). moto terminates at once (no shutting-down); the instance keeps
  its <capacityReservationId> and lifecycle `capacity-block`, as a terminated instance does, with the
  state transition reason `Service initiated (<time> GMT)` and the state reason
  Server.ScheduledStop (the emulator's words: EC2 documents no reason of its own for it).

Either way the reservation no longer counts those instances (its available instances are 0 while
it stays ended). This happens lazily, not on a timer: in front of every EC2 request of the
account and region (the middleware), and whenever the module looks at a reservation's instances
(DescribeCapacityReservations, CancelCapacityReservation, the extension endpoints, a launch); each
reservation lets go of its instances once, under the module's lock. An instance that has left a
reservation stays out of it, also when the reservation is made active again through the
extension endpoint (a state set back to null, an end date moved to the future), and does not move
into another open reservation that matches it.

Not emulated: capacity reservation fleets, groups (resource-group targets), splitting, moving,
modifying (ModifyCapacityReservation), PurchaseCapacityBlock and its offerings, billing owners,
sharing (an interruptible reservation's instances belong to its owner's account, as every
reservation's), the two-minute interruption warning and EventBridge events, ClientToken,
CreateTags on a cr- id, and stopping instances (a stopped instance keeps its slot).
"""

from __future__ import annotations

import datetime
import itertools
import re
import secrets
import threading
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence
from xml.sax.saxutils import escape

import call_log
import faults
import placement

ALLOCATION_ACTIONS = ("CreateInterruptibleCapacityReservationAllocation",
                      "UpdateInterruptibleCapacityReservationAllocation")
ACTIONS = ("CreateCapacityReservation", "DescribeCapacityReservations", "CancelCapacityReservation",
           *ALLOCATION_ACTIONS)
LAUNCHES = ("RunInstances", "CreateFleet")
STATES = ("active", "expired", "cancelled", "pending", "failed", "scheduled", "payment-pending",
          "payment-failed", "assessing", "delayed", "unsupported")
MATCH_CRITERIA = ("open", "targeted")
TENANCIES = ("default", "dedicated")
END_DATE_TYPES = ("unlimited", "limited")
PLATFORMS = ("Linux/UNIX", "Red Hat Enterprise Linux", "SUSE Linux", "Windows", "Windows with SQL Server",
             "Windows with SQL Server Enterprise", "Windows with SQL Server Standard",
             "Windows with SQL Server Web", "Linux with SQL Server Standard", "Linux with SQL Server Web",
             "Linux with SQL Server Enterprise", "RHEL with SQL Server Standard", "RHEL with SQL Server Enterprise",
             "RHEL with SQL Server Web", "RHEL with HA", "RHEL with HA and SQL Server Standard",
             "RHEL with HA and SQL Server Enterprise", "Ubuntu Pro")
DEFAULT_PLATFORM = "Linux/UNIX"
CAPACITY_BLOCK = "capacity-block"
# The market type, instance lifecycle and fleet reservation type of an interruptible reservation.
INTERRUPTIBLE = "interruptible-capacity-reservation"
# The fleet target capacity type of a launch into reservations (ReservedCapacityOptions).
RESERVED_CAPACITY = "reserved-capacity"
# ReservedCapacityOptions.ReservationType.N: the kinds of reservation a reserved-capacity fleet uses.
FLEET_RESERVATION_TYPES = ("on-demand-capacity-reservation", CAPACITY_BLOCK, INTERRUPTIBLE)
INTERRUPTION_TYPE = "adhoc"
ZERO_SIZE_PREFERENCES = ("default", "retain")
# The most instances an allocation takes, or changes by, at once.
MAX_ALLOCATION = 1000
# The states of a reservation that has ended: its instances leave it (see Reservation.release).
ENDED = ("cancelled", "expired")
# The states of an instance that no longer counts against its reservation.
GONE = ("terminated", "shutting-down")
EXHAUSTED = "ReservationCapacityExceeded"
MAX_RESULTS = 1000
FILTERS = ("instance-type", "availability-zone", "availability-zone-id", "owner-id", "state",
           "instance-match-criteria", "tenancy", "instance-platform", "end-date-type", "reservation-type",
           "capacity-reservation-id", "interruptible", "tag-key")  # and tag:<key>
# Where a backend keeps its reservations (an attribute moto's reset clears with the backend's state).
_STORE = "karpenter_rs_capacity_reservations"
_ID = re.compile(r"^cr-[0-9a-f]{17}$")
_lock = threading.RLock()
# Serialises the launches into reservations: their check and moto's launch.
_launch_lock = threading.RLock()
# Numbers the instances put in reservations, in launch order (the newest are reclaimed first).
_launch_order = itertools.count(1)


def not_found(rid: str) -> faults.Ec2Error:
    return faults.Ec2Error("InvalidCapacityReservationId.NotFound",
                            f"The capacity reservation ID '{rid}' does not exist")


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc)


def timestamp(value: datetime.datetime) -> str:
    value = value.astimezone(datetime.timezone.utc)
    return value.strftime("%Y-%m-%dT%H:%M:%S.") + f"{value.microsecond // 1000:03d}Z"


def parse_time(value: Any, name: str) -> datetime.datetime:
    """A date of a request (ISO 8601, or seconds since the epoch), in UTC."""
    try:
        if isinstance(value, (int, float)) or re.fullmatch(r"\d+(\.\d+)?", str(value)):
            return datetime.datetime.fromtimestamp(float(value), datetime.timezone.utc)
        parsed = datetime.datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    except (TypeError, ValueError):
        raise faults.Ec2Error("InvalidParameterValue", f"Value ({value}) for parameter {name} is invalid.") from None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=datetime.timezone.utc)


@dataclass
class Reservation:
    id: str
    arn: str
    owner_id: str
    instance_type: str
    platform: str
    zone: str
    zone_id: str
    count: int
    match_criteria: str = "open"
    tenancy: str = "default"
    end_date_type: str = "unlimited"
    end: datetime.datetime | None = None
    start: datetime.datetime = field(default_factory=_now)
    created: datetime.datetime = field(default_factory=_now)
    reservation_type: str = "default"
    tags: dict[str, str] = field(default_factory=dict)
    # A state set (CancelCapacityReservation, the extension endpoint) over the computed one.
    state_set: str | None = None
    # The instances running in it.
    instances: set[str] = field(default_factory=set)
    # instance id -> its number in launch order (_launch_order).
    launched: dict[str, int] = field(default_factory=dict)
    # An interruptible reservation (CreateInterruptibleCapacityReservationAllocation): its
    # TargetInstanceCount, its ZeroSizePreference, and the source reservation it was allocated from.
    interruptible: bool = False
    target: int = 0
    zero_size_preference: str = "default"
    source: Reservation | None = field(default=None, repr=False, compare=False)
    # A source reservation: its (latest) interruptible allocation, kept once canceled.
    allocation: Reservation | None = field(default=None, repr=False, compare=False)

    def state(self, now: datetime.datetime | None = None) -> str:
        if self.state_set:
            return self.state_set
        now = now or _now()
        if self.source is not None and self.source.state(now) in ENDED:
            # The source ended: so did the capacity it lent.
            return "cancelled"
        if self.reservation_type == CAPACITY_BLOCK and now < self.start:
            return "scheduled"
        if self.end is not None and now >= self.end:
            return "expired"
        return "active"

    def used(self, backend: Any) -> int:
        """The instances running in the reservation (those terminated given back, none once it ended)."""
        with _lock:
            self.release(backend)
            for iid in list(self.instances):
                instance = _instance(backend, iid)
                if instance is None or instance.state in GONE:
                    self.instances.discard(iid)
                    self.launched.pop(iid, None)
            return len(self.instances)

    def available(self, backend: Any) -> int:
        used = self.used(backend)
        if self.state() in ("cancelled", "expired", "failed"):
            return 0
        return max(self.count - self.allocated() - used, 0)

    def allocated(self) -> int:
        """The instances a source reservation has lent to its interruptible allocation."""
        allocation = self.allocation
        if allocation is None or allocation.state() in ENDED:
            return 0
        return allocation.count

    def live_allocation(self) -> Reservation | None:
        """A source reservation's interruptible allocation, unless it was canceled."""
        allocation = self.allocation
        return allocation if allocation is not None and allocation.state() not in ENDED else None

    def allocation_status(self) -> str:
        """The status of an interruptible reservation's allocation (InterruptibleCapacityAllocation)."""
        return "canceled" if self.state() in ENDED else "active"

    def release(self, backend: Any, now: datetime.datetime | None = None) -> None:
        """Once the reservation has ended (ENDED), do to its instances what EC2 does: those of a
        `default` reservation leave it and run on as On-Demand instances, those of a capacity block
        are terminated. Idempotent: the reservation keeps no instance afterwards."""
        with _lock:
            if self.allocation is not None:
                self.allocation.release(backend, now)
            if self.interruptible and self.state_set is None and self.state(now) in ENDED:
                # Ended with its source: it stays cancelled, whatever becomes of the source.
                self.state_set = "cancelled"
            if not self.instances or self.state(now) not in ENDED:
                return
            for iid in sorted(self.instances):
                instance = _instance(backend, iid)
                if instance is None or instance.state in GONE:
                    continue
                if self.reservation_type == CAPACITY_BLOCK:
                    _reclaim(instance, f"the capacity block {self.id} ended")
                elif self.interruptible:
                    _reclaim(instance, f"the interruptible capacity reservation {self.id} ended")
                else:
                    _detach(instance, self)
            # Whatever became of them (an instance moto could not terminate cleanly is left as it
            # is), they are no longer the reservation's: the next look does not try again.
            self.instances.clear()

    def filter_values(self, name: str) -> list[str]:
        if name.startswith("tag:"):
            key = name[4:]
            return [self.tags[key]] if key in self.tags else []
        values = {
            "instance-type": [self.instance_type],
            "availability-zone": [self.zone],
            "availability-zone-id": [self.zone_id],
            "owner-id": [self.owner_id],
            "state": [self.state()],
            "instance-match-criteria": [self.match_criteria],
            "tenancy": [self.tenancy],
            "instance-platform": [self.platform],
            "end-date-type": [self.end_date_type],
            "reservation-type": [self.reservation_type],
            "capacity-reservation-id": [self.id],
            "interruptible": ["true" if self.interruptible else "false"],
            "tag-key": list(self.tags),
        }
        return values.get(name, [])

    def xml(self, backend: Any) -> str:
        parts = [
            f"<capacityReservationId>{self.id}</capacityReservationId>",
            f"<ownerId>{self.owner_id}</ownerId>",
            f"<capacityReservationArn>{escape(self.arn)}</capacityReservationArn>",
            f"<availabilityZoneId>{escape(self.zone_id)}</availabilityZoneId>",
            f"<instanceType>{escape(self.instance_type)}</instanceType>",
            f"<instancePlatform>{escape(self.platform)}</instancePlatform>",
            f"<availabilityZone>{escape(self.zone)}</availabilityZone>",
            f"<tenancy>{self.tenancy}</tenancy>",
            f"<totalInstanceCount>{self.count}</totalInstanceCount>",
            f"<availableInstanceCount>{self.available(backend)}</availableInstanceCount>",
            "<ebsOptimized>false</ebsOptimized><ephemeralStorage>false</ephemeralStorage>",
            f"<state>{self.state()}</state>",
            f"<startDate>{timestamp(self.start)}</startDate>",
        ]
        if self.end is not None:
            parts.append(f"<endDate>{timestamp(self.end)}</endDate>")
        parts += [
            f"<endDateType>{self.end_date_type}</endDateType>",
            f"<instanceMatchCriteria>{self.match_criteria}</instanceMatchCriteria>",
            f"<createDate>{timestamp(self.created)}</createDate>",
            "<tagSet>" + "".join(f"<item><key>{escape(k)}</key><value>{escape(v)}</value></item>"
                                 for k, v in self.tags.items()) + "</tagSet>",
            f"<reservationType>{self.reservation_type}</reservationType>",
            f"<interruptible>{'true' if self.interruptible else 'false'}</interruptible>",
        ]
        if self.allocation is not None:
            parts.append(f"<interruptibleCapacityAllocation>{self.allocation.allocation_xml()}"
                         "</interruptibleCapacityAllocation>")
        if self.interruptible:
            parts.append(f"<interruptionInfo><sourceCapacityReservationId>{self.source.id if self.source else ''}"
                         f"</sourceCapacityReservationId><interruptionType>{INTERRUPTION_TYPE}</interruptionType>"
                         f"</interruptionInfo><zeroSizePreference>{self.zero_size_preference}</zeroSizePreference>")
        return "".join(parts)

    def allocation_xml(self) -> str:
        """An interruptible reservation as its source shows it (InterruptibleCapacityAllocation)."""
        status = self.allocation_status()
        return (f"<instanceCount>{self.count if status == 'active' else 0}</instanceCount>"
                f"<targetInstanceCount>{self.target}</targetInstanceCount><status>{status}</status>"
                f"<interruptibleCapacityReservationId>{self.id}</interruptibleCapacityReservationId>"
                f"<interruptionType>{INTERRUPTION_TYPE}</interruptionType>"
                f"<zeroSizePreference>{self.zero_size_preference}</zeroSizePreference>")


def _instance(backend: Any, iid: str) -> Any:
    try:
        return backend.get_instance(iid)
    except Exception:
        return None


def _detach(instance: Any, reservation: Reservation) -> None:
    """The moto instance `instance` leaves the ended `default` reservation `reservation`: it runs
    on in no reservation, its preference `open` and no target."""
    if getattr(instance, "capacity_reservation_id", None) not in (None, reservation.id):
        return
    instance.capacity_reservation_id = None
    instance.capacity_reservation_specification = {"CapacityReservationPreference": "open"}


def _reclaim(instance: Any, why: str) -> None:
    """EC2 terminates the instances of a capacity block that has ended, and those of an
    interruptible reservation whose capacity its owner reclaims (moto: at once, no shutting-down);
    the instance keeps showing the reservation, as a terminated one does."""
    from moto.ec2.models.instances import StateReason

    try:
        instance.terminate()
    except Exception:
        # moto's terminate() trips over a fleet it no longer has; the instance is terminated
        # all the same (release() runs in front of every EC2 request: it must not fail them).
        instance._state.name, instance._state.code = "terminated", 48
    when = _now().strftime("%Y-%m-%d %H:%M:%S GMT")
    instance._reason = f"Service initiated ({when})"
    instance.state_reason = StateReason(f"Server.ScheduledStop: {why}", "Server.ScheduledStop")


def _settle_scope(account: str, region: str) -> None:
    """settle() the backend of a request's account and region, when it has reservations."""
    from moto.ec2.models import ec2_backends

    # The backends made already (dict.get: moto's own lookups would make them).
    by_region = dict.get(ec2_backends, account)
    backend = dict.get(by_region, region) if by_region is not None else None
    if backend is not None:
        settle(backend)


def settle(backend: Any, now: datetime.datetime | None = None) -> None:
    """Release the instances of every reservation of `backend` that has ended (Reservation.release)."""
    store = backend.__dict__.get(_STORE)
    if not store:
        return
    now = now or _now()
    with _lock:
        for reservation in list(store.values()):
            reservation.release(backend, now)


# -- the reservations of an account's region ----------------------------------------------------


def reservations(backend: Any) -> dict[str, Reservation]:
    """id -> reservation, of moto's EC2 backend `backend` (one account's region), in creation order."""
    store = backend.__dict__.get(_STORE)
    if store is None:
        with _lock:
            store = backend.__dict__.setdefault(_STORE, {})
    return store


def find(backend: Any, rid: str) -> Reservation | None:
    return reservations(backend).get(rid or "")


def _zone(backend: Any, zone: str | None, zone_id: str | None) -> tuple[str, str]:
    zones = backend.describe_availability_zones()
    for z in zones:
        if (zone and z.name == zone) or (not zone and zone_id and z.zone_id == zone_id):
            return z.name, z.zone_id
    given = zone or zone_id
    if not given:
        raise faults.Ec2Error("MissingParameter",
                               "The request must contain the parameter AvailabilityZone or AvailabilityZoneId")
    raise faults.Ec2Error("InvalidParameterValue", f"Invalid availability zone: [{given}]")


def create(backend: Any, instance_type: str, count: Any, zone: str | None = None, zone_id: str | None = None,
           platform: str | None = None, match_criteria: str | None = None, tenancy: str | None = None,
           end_date_type: str | None = None, end: Any = None, tags: dict[str, str] | None = None,
           reservation_type: str = "default", start: Any = None) -> Reservation:
    """CreateCapacityReservation (and the capacity blocks of the extension endpoint)."""
    if not instance_type:
        raise faults.Ec2Error("MissingParameter", "The request must contain the parameter instanceType")
    if not platform and reservation_type != CAPACITY_BLOCK:
        raise faults.Ec2Error("MissingParameter", "The request must contain the parameter instancePlatform")
    platform = platform or DEFAULT_PLATFORM
    if platform not in PLATFORMS:
        raise faults.Ec2Error("InvalidParameterValue", f"Value ({platform}) for parameter instancePlatform is invalid.")
    try:
        number = int(count)
    except (TypeError, ValueError):
        number = 0
    if number < 1:
        raise faults.Ec2Error("InvalidParameterValue",
                               f"Value ({count}) for parameter instanceCount is invalid. It must be at least 1.")
    match_criteria = match_criteria or "open"
    if match_criteria not in MATCH_CRITERIA:
        raise faults.Ec2Error("InvalidParameterValue",
                               f"Value ({match_criteria}) for parameter instanceMatchCriteria is invalid.")
    tenancy = tenancy or "default"
    if tenancy not in TENANCIES:
        raise faults.Ec2Error("InvalidParameterValue", f"Value ({tenancy}) for parameter tenancy is invalid.")
    end_date_type = end_date_type or ("limited" if end not in (None, "") else "unlimited")
    if end_date_type not in END_DATE_TYPES:
        raise faults.Ec2Error("InvalidParameterValue", f"Value ({end_date_type}) for parameter endDateType is invalid.")
    now = _now()
    begin = parse_time(start, "startDate") if start not in (None, "") else now
    end_at = None
    if end_date_type == "limited":
        if end in (None, ""):
            raise faults.Ec2Error("InvalidParameterCombination",
                                   "The parameter endDate is required when endDateType is limited.")
        end_at = parse_time(end, "endDate")
        if end_at <= begin and reservation_type != CAPACITY_BLOCK:
            raise faults.Ec2Error("InvalidParameterValue",
                                   f"Value ({end}) for parameter endDate is invalid. It must be in the future.")
    elif end not in (None, ""):
        raise faults.Ec2Error("InvalidParameterCombination",
                               "The parameter endDate cannot be used when endDateType is unlimited.")
    zone_name, zone_ident = _zone(backend, zone, zone_id)
    rid, arn = _new_id(backend)
    reservation = Reservation(
        id=rid,
        arn=arn,
        owner_id=backend.account_id,
        instance_type=instance_type,
        platform=platform,
        zone=zone_name,
        zone_id=zone_ident,
        count=number,
        match_criteria=match_criteria,
        tenancy=tenancy,
        end_date_type=end_date_type,
        end=end_at,
        start=begin,
        created=now,
        reservation_type=reservation_type,
        tags=dict(tags or {}),
    )
    with _lock:
        reservations(backend)[rid] = reservation
    return reservation


def _new_id(backend: Any) -> tuple[str, str]:
    """A new reservation's id and ARN."""
    from moto.utilities.utils import get_partition

    region, account = backend.region_name, backend.account_id
    rid = "cr-" + secrets.token_hex(9)[:17]
    return rid, f"arn:{get_partition(region)}:ec2:{region}:{account}:capacity-reservation/{rid}"


def create_capacity_block(body: dict, default_region: str) -> tuple[str, dict]:
    """POST /_karpenter-rs/capacity-block: (status, JSON answer)."""
    try:
        region = body.get("region") or default_region
        backend = placement.backend_of(str(body.get("account") or _default_account()), region)
        start = parse_time(body["start"], "start") if body.get("start") else _now()
        end = parse_time(body["end"], "end") if body.get("end") else start + datetime.timedelta(days=1)
        if end <= start:
            raise faults.Ec2Error("InvalidParameterValue", "end is after start")
        tags = body.get("tags") or {}
        if isinstance(tags, list):
            tags = {t["Key"]: t["Value"] for t in tags}
        reservation = create(backend, body.get("instance_type") or "", body.get("count", 1),
                             zone=body.get("zone"), zone_id=body.get("zone_id"), platform=body.get("platform"),
                             match_criteria="targeted", end_date_type="limited", end=end, start=start,
                             tags={str(k): str(v) for k, v in tags.items()}, reservation_type=CAPACITY_BLOCK)
    except faults.Ec2Error as error:
        return "400 Bad Request", {"error": f"{error.code}: {error.message}"}
    return "200 OK", summary(reservation, backend)


def update(body: dict, default_region: str) -> tuple[str, dict]:
    """POST /_karpenter-rs/capacity-reservation: set a reservation's state and/or end date."""
    region = body.get("region") or default_region
    backend = placement.backend_of(str(body.get("account") or _default_account()), region)
    reservation = find(backend, body.get("id") or "")
    if reservation is None:
        return "404 Not Found", {"error": f"no capacity reservation {body.get('id')!r} in {region}"}
    state = body.get("state")
    if state is not None and state not in STATES:
        return "400 Bad Request", {"error": f"state {state!r} is none of {', '.join(STATES)}"}
    end = None
    if body.get("end"):
        try:
            end = parse_time(body["end"], "end")
        except faults.Ec2Error as error:
            return "400 Bad Request", {"error": error.message}
    with _lock:
        if "state" in body:
            reservation.state_set = state
        if end is not None:
            reservation.end = end
            reservation.end_date_type = "limited"
        # An end reached (or a state `cancelled`/`expired` set) releases the instances now.
        reservation.release(backend)
        return "200 OK", summary(reservation, backend)


def summary(reservation: Reservation, backend: Any) -> dict:
    reservation.release(backend)
    return {"id": reservation.id, "arn": reservation.arn, "state": reservation.state(),
            "reservation_type": reservation.reservation_type, "instance_type": reservation.instance_type,
            "zone": reservation.zone, "total": reservation.count, "available": reservation.available(backend),
            "start": timestamp(reservation.start), "end": timestamp(reservation.end) if reservation.end else None,
            "instances": sorted(reservation.instances), "interruptible": reservation.interruptible}


def _default_account() -> str:
    import os

    return os.environ.get("MOTO_ACCOUNT_ID") or "123456789012"


def describe(backend: Any, ids: Sequence[str] = (), filters: Sequence[tuple[str, list[str]]] = ()) -> list[Reservation]:
    settle(backend)
    store = reservations(backend)
    for rid in ids:
        if rid not in store:
            raise not_found(rid)
    for name, _ in filters:
        if name not in FILTERS and not name.startswith("tag:"):
            raise faults.Ec2Error("InvalidParameterValue", f"The filter '{name}' is invalid")
    chosen = set(ids)
    candidates = [r for r in list(store.values()) if not chosen or r.id in chosen]
    return [r for r in candidates
            if all(placement._matches(r.filter_values(name), values) for name, values in filters)]


def _existing(backend: Any, rid: str) -> Reservation:
    """The reservation `rid` a request names; EC2's error when it names none or an unknown one."""
    if not rid:
        raise faults.Ec2Error("MissingParameter", "The request must contain the parameter capacityReservationId")
    reservation = find(backend, rid)
    if reservation is None:
        raise not_found(rid)
    return reservation


def cancel(backend: Any, rid: str) -> None:
    reservation = _existing(backend, rid)
    if reservation.interruptible:
        raise faults.Ec2Error("OperationNotPermitted",
                               f"The capacity reservation {rid} is interruptible: reduce the interruptible "
                               f"allocation of its source {reservation.source.id if reservation.source else ''} "
                               "to 0 instances instead.")
    with _lock:
        if reservation.state() not in ("active", "scheduled", "pending", "assessing", "delayed"):
            raise faults.Ec2Error("IncorrectState",
                                   f"The capacity reservation '{rid}' is in the {reservation.state()} state "
                                   "and cannot be cancelled.")
        reservation.state_set = "cancelled"
        reservation.release(backend)


# -- interruptible reservations ---------------------------------------------------------------------


def _count(value: Any, name: str, least: int) -> int:
    if value in (None, ""):
        raise faults.Ec2Error("MissingParameter", f"The request must contain the parameter {name}")
    try:
        number = int(value)
    except (TypeError, ValueError):
        number = least - 1
    if not least <= number <= MAX_ALLOCATION:
        raise faults.Ec2Error("InvalidParameterValue", f"Value ({value}) for parameter {name} is invalid. "
                                                        f"It must be between {least} and {MAX_ALLOCATION}.")
    return number


def _zero_size_preference(value: str | None, default: str) -> str:
    value = value or default
    if value not in ZERO_SIZE_PREFERENCES:
        raise faults.Ec2Error("InvalidParameterValue", f"Value ({value}) for parameter zeroSizePreference is invalid.")
    return value


def _source(backend: Any, rid: str) -> Reservation:
    source = _existing(backend, rid)
    if source.interruptible:
        raise faults.Ec2Error("InvalidParameterValue",
                               f"The capacity reservation {rid} is interruptible: an interruptible allocation is "
                               f"made and changed through its source reservation "
                               f"{source.source.id if source.source else ''}.")
    return source


def create_allocation(backend: Any, rid: str, count: Any, tags: dict[str, str] | None = None,
                      zero_size_preference: str | None = None) -> Reservation:
    """CreateInterruptibleCapacityReservationAllocation: the interruptible reservation allocated
    from the source reservation `rid` (see the module's docstring)."""
    source = _source(backend, rid)
    with _lock:
        if source.reservation_type != "default":
            raise faults.Ec2Error("InvalidParameterValue",
                                   f"The capacity reservation {rid} is a {source.reservation_type}: only an On-Demand "
                                   "Capacity Reservation allocates interruptible capacity.")
        state = source.state()
        if state != "active":
            raise faults.Ec2Error("IncorrectState",
                                   f"The capacity reservation '{rid}' is in the {state} state: only an active "
                                   "capacity reservation allocates interruptible capacity.")
        if source.end is not None:
            raise faults.Ec2Error("InvalidParameterValue",
                                   f"The capacity reservation {rid} has an end date: only a capacity reservation "
                                   "without one allocates interruptible capacity.")
        existing = source.live_allocation()
        if existing is not None:
            raise faults.Ec2Error("IncorrectState",
                                   f"The capacity reservation {rid} already has the interruptible allocation "
                                   f"{existing.id}: update it instead.")
        number = _count(count, "instanceCount", 1)
        unused = source.available(backend)
        if number > unused:
            raise faults.Ec2Error("InvalidParameterValue",
                                   f"The capacity reservation {rid} has {unused} unused instances: it cannot "
                                   f"allocate {number}.")
        new_id, arn = _new_id(backend)
        allocation = Reservation(
            id=new_id, arn=arn, owner_id=source.owner_id, instance_type=source.instance_type,
            platform=source.platform, zone=source.zone, zone_id=source.zone_id, count=number,
            match_criteria="targeted", tenancy=source.tenancy, reservation_type="default",
            tags=dict(tags or {}), interruptible=True, target=number,
            zero_size_preference=_zero_size_preference(zero_size_preference, "default"), source=source)
        source.allocation = allocation
        reservations(backend)[new_id] = allocation
        return allocation


def update_allocation(backend: Any, rid: str, target: Any, zero_size_preference: str | None = None) -> Reservation:
    """UpdateInterruptibleCapacityReservationAllocation: the source reservation `rid` lends its
    interruptible reservation `target` instances; fewer reclaims the difference (terminating the
    newest instances running in it when it has not that many unused). The interruptible
    reservation."""
    source = _source(backend, rid)
    with _lock:
        allocation = source.live_allocation()
        if allocation is None:
            raise faults.Ec2Error("InvalidParameterValue",
                                   f"The capacity reservation {rid} has no interruptible allocation.")
        number = _count(target, "targetInstanceCount", 0)
        preference = _zero_size_preference(zero_size_preference, allocation.zero_size_preference)
        if abs(number - allocation.count) > MAX_ALLOCATION:
            raise faults.Ec2Error("InvalidParameterValue",
                                   f"An interruptible allocation changes by at most {MAX_ALLOCATION} instances "
                                   "at once.")
        if number > allocation.count:
            state = source.state()
            if state != "active":
                raise faults.Ec2Error("IncorrectState",
                                       f"The capacity reservation '{rid}' is in the {state} state: it allocates "
                                       "no more interruptible capacity.")
            unused = source.available(backend)
            if number - allocation.count > unused:
                raise faults.Ec2Error("InvalidParameterValue",
                                       f"The capacity reservation {rid} has {unused} unused instances: it cannot "
                                       f"allocate {number - allocation.count} more.")
        elif number < allocation.count:
            reclaim(backend, allocation, number)
        allocation.count = allocation.target = number
        allocation.zero_size_preference = preference
        if number == 0 and preference == "default":
            allocation.state_set = "cancelled"
        return allocation


def reclaim(backend: Any, allocation: Reservation, keep: int) -> list[str]:
    """The source takes back an interruptible reservation's instances beyond `keep`: its unused
    instances first, then those running in it, the newest first, which EC2 terminates. The ids
    of the terminated instances."""
    with _lock:
        excess = allocation.used(backend) - keep
        if excess <= 0:
            return []
        newest = sorted(allocation.instances, key=lambda iid: (allocation.launched.get(iid, 0), iid), reverse=True)
        gone = newest[:excess]
        for iid in gone:
            instance = _instance(backend, iid)
            if instance is not None:
                _reclaim(instance, f"the interruptible capacity reservation {allocation.id} was reclaimed")
            allocation.instances.discard(iid)
            allocation.launched.pop(iid, None)
        return gone


def allocation_answer(allocation: Reservation, with_id: bool = False) -> str:
    """The elements of CreateInterruptibleCapacityReservationAllocationResponse (and, `with_id`,
    of UpdateInterruptibleCapacityReservationAllocationResponse)."""
    source = allocation.source.id if allocation.source else ""
    head = count = ""
    if with_id:
        head = f"<interruptibleCapacityReservationId>{allocation.id}</interruptibleCapacityReservationId>"
        count = f"<instanceCount>{allocation.count}</instanceCount>"
    return (f"{head}<sourceCapacityReservationId>{source}</sourceCapacityReservationId>{count}"
            f"<targetInstanceCount>{allocation.target}</targetInstanceCount>"
            f"<status>{allocation.allocation_status()}</status>"
            f"<interruptionType>{INTERRUPTION_TYPE}</interruptionType>")


# -- launches -------------------------------------------------------------------------------------


@dataclass
class Launch:
    """What a launch asks of the reservations."""

    preference: str = "open"
    target: str | None = None
    market_type: str | None = None
    instance_type: str | None = None
    zone: str | None = None


def launch_of(backend: Any, data: dict | None, request: dict[str, Any] | None = None,
              instance_type: str | None = None, zone: str | None = None) -> Launch:
    """The launch of a launch template's `data` with the request's own members (`request`:
    CapacityReservationSpecification and InstanceMarketOptions as the template has them)."""
    data = data or {}
    request = request or {}
    spec = request.get("CapacityReservationSpecification") or data.get("CapacityReservationSpecification") or {}
    market = (request.get("InstanceMarketOptions") or data.get("InstanceMarketOptions") or {}).get("MarketType")
    target = (spec.get("CapacityReservationTarget") or {}).get("CapacityReservationId")
    preference = spec.get("CapacityReservationPreference") or ("capacity-reservations-only" if target else "open")
    return Launch(preference=preference, target=target or None, market_type=market,
                  instance_type=instance_type or data.get("InstanceType"),
                  zone=zone or (data.get("Placement") or {}).get("AvailabilityZone"))


def subnet_zone(backend: Any, subnet_id: str | None) -> str | None:
    if not subnet_id:
        return None
    try:
        return backend.get_subnet(subnet_id).availability_zone
    except Exception:
        return None


def check(backend: Any, launch: Launch, count: int = 1) -> Reservation | None:
    """The reservation a targeted launch of `count` instances goes into; raises faults.Ec2Error as
    EC2 refuses the launch. None: no target."""
    if not launch.target:
        if launch.market_type == INTERRUPTIBLE:
            raise faults.Ec2Error("InvalidParameterCombination",
                                   "The market type interruptible-capacity-reservation needs a capacity reservation "
                                   "target: an interruptible capacity reservation.")
        if launch.preference == "capacity-reservations-only":
            if _open_match(backend, launch.instance_type, launch.zone, None, None) is None:
                raise faults.Ec2Error(EXHAUSTED, "There is no open capacity reservation with available "
                                                  f"capacity for {launch.instance_type} in {launch.zone}.")
        return None
    reservation = find(backend, launch.target)
    if reservation is None:
        raise not_found(launch.target)
    if launch.instance_type and launch.instance_type != reservation.instance_type:
        raise faults.Ec2Error("InvalidParameterCombination",
                               f"The instance type {launch.instance_type} does not match the instance type "
                               f"{reservation.instance_type} of the capacity reservation {reservation.id}.")
    if launch.zone and launch.zone != reservation.zone:
        raise faults.Ec2Error("InvalidParameterCombination",
                               f"The Availability Zone {launch.zone} does not match the Availability Zone "
                               f"{reservation.zone} of the capacity reservation {reservation.id}.")
    # A capacity block takes the market type capacity-block, an interruptible reservation the market
    # type interruptible-capacity-reservation, and neither market type goes anywhere else.
    market = market_type_of(reservation)
    if launch.market_type != market and (market or launch.market_type in (CAPACITY_BLOCK, INTERRUPTIBLE)):
        if market == CAPACITY_BLOCK:
            message = (f"The capacity reservation {reservation.id} is a capacity block: launch with the market "
                       "type capacity-block.")
        elif market == INTERRUPTIBLE:
            message = (f"The capacity reservation {reservation.id} is interruptible: launch with the market type "
                       "interruptible-capacity-reservation.")
        elif launch.market_type == CAPACITY_BLOCK:
            message = f"The market type capacity-block needs a capacity block; {reservation.id} is not one."
        else:
            message = (f"The market type interruptible-capacity-reservation needs an interruptible capacity "
                       f"reservation; {reservation.id} is not one.")
        raise faults.Ec2Error("InvalidParameterCombination", message)
    state = reservation.state()
    if state != "active":
        raise faults.Ec2Error(EXHAUSTED, f"The capacity reservation {reservation.id} is {state}: "
                                          "it has no capacity available.")
    if reservation.available(backend) < count:
        raise faults.Ec2Error(EXHAUSTED, f"There is insufficient capacity in the capacity reservation "
                                          f"{reservation.id}.")
    return reservation


def market_type_of(reservation: Reservation) -> str | None:
    """The market type (and instance lifecycle) of a launch into `reservation`: a capacity block's
    and an interruptible reservation's own, None for an ODCR's (on-demand)."""
    if reservation.reservation_type == CAPACITY_BLOCK:
        return CAPACITY_BLOCK
    return INTERRUPTIBLE if reservation.interruptible else None


def fleet_reservation_type(reservation: Reservation) -> str:
    """The kind of `reservation` as ReservedCapacityOptions.ReservationType.N names it."""
    return market_type_of(reservation) or "on-demand-capacity-reservation"


def _platform(instance: Any) -> str:
    return "Windows" if (getattr(instance, "platform", None) or "").lower() == "windows" else DEFAULT_PLATFORM


def _open_match(backend: Any, instance_type: str | None, zone: str | None, platform: str | None,
                tenancy: str | None) -> Reservation | None:
    for reservation in list(reservations(backend).values()):
        if (reservation.match_criteria == "open" and reservation.reservation_type == "default"
                and reservation.instance_type == instance_type
                and (zone is None or reservation.zone == zone)
                and (platform is None or reservation.platform == platform)
                and (tenancy is None or reservation.tenancy == tenancy)
                and reservation.state() == "active" and reservation.available(backend) > 0):
            return reservation
    return None


def attach(backend: Any, instance: Any, launch: Launch) -> None:
    """Put the moto instance `instance`, just launched, in its reservation (see the docstring)."""
    zone = getattr(instance.placement, "zone", None) or None
    with _lock:
        reservation = None
        if launch.target:
            reservation = find(backend, launch.target)
            if reservation is not None and (reservation.state() != "active" or reservation.available(backend) < 1):
                reservation = None
        elif launch.preference in ("open", "capacity-reservations-only"):
            reservation = _open_match(backend, instance.instance_type, zone, _platform(instance),
                                      getattr(instance.placement, "tenancy", None) or "default")
        if reservation is not None:
            reservation.instances.add(instance.id)
            reservation.launched[instance.id] = next(_launch_order)
            instance.capacity_reservation_id = reservation.id
            if launch.target:
                instance.capacity_reservation_specification = {
                    "CapacityReservationPreference": "capacity-reservations-only",
                    "CapacityReservationTarget": {"CapacityReservationId": reservation.id},
                }
            else:
                instance.capacity_reservation_specification = {"CapacityReservationPreference": launch.preference}
            lifecycle = market_type_of(reservation)
            if lifecycle:
                instance.lifecycle = lifecycle
        else:
            instance.capacity_reservation_specification = {
                "CapacityReservationPreference": "none" if launch.preference == "none" else "open"}


def install_instance_reservations() -> None:
    """Make moto's RunInstances and CreateFleet put their instances in reservations."""
    from moto.ec2.models import fleets
    from moto.ec2.responses.instances import InstanceResponse

    if getattr(InstanceResponse.run_instances, "_in_reservations", False):
        return  # installed already

    original_run = InstanceResponse.run_instances

    def run_instances(self, _original=original_run):
        result = _original(self)
        reservation = getattr(result, "result", None)
        instances = getattr(reservation, "instances", None) or []
        if instances:
            data = placement.template_data(self.ec2_backend, self._get_param("LaunchTemplate", {}) or {})
            request = _request_members(lambda name: self._get_param(name))
            for instance in instances:
                launch = launch_of(self.ec2_backend, data, request, instance.instance_type)
                attach(self.ec2_backend, instance, launch)
        return result

    run_instances._in_reservations = True  # type: ignore[attr-defined]
    InstanceResponse.run_instances = run_instances

    original_on_demand = fleets.Fleet.create_on_demand_requests

    def create_on_demand_requests(self, weight, _original=original_on_demand):
        before = len(self.on_demand_instances)
        out = _original(self, weight)
        for item in self.on_demand_instances[before:]:
            spec = item.get("launch_spec")
            data = placement.template_data(self.ec2_backend, getattr(spec, "launch_template_spec", None) or {})
            attach(self.ec2_backend, item["instance"], launch_of(self.ec2_backend, data))
        return out

    fleets.Fleet.create_on_demand_requests = create_on_demand_requests

    # An instant fleet's answer shows the lifecycle of the instances it launched into a capacity
    # block or an interruptible reservation (moto: on-demand).
    original_build = fleets.Fleet._build_instance_data

    def build_instance_data(instance, lifecycle, launch_spec, _original=original_build):
        data = _original(instance, lifecycle, launch_spec)
        if getattr(instance, "lifecycle", None) in (CAPACITY_BLOCK, INTERRUPTIBLE):
            data["Lifecycle"] = instance.lifecycle
        return data

    fleets.Fleet._build_instance_data = staticmethod(build_instance_data)


def _request_members(get: Callable[[str], Any]) -> dict[str, Any]:
    """A RunInstances request's own CapacityReservationSpecification and InstanceMarketOptions."""
    out: dict[str, Any] = {}
    preference = get("CapacityReservationSpecification.CapacityReservationPreference")
    target = get("CapacityReservationSpecification.CapacityReservationTarget.CapacityReservationId")
    if preference or target:
        out["CapacityReservationSpecification"] = {"CapacityReservationPreference": preference}
        if target:
            out["CapacityReservationSpecification"]["CapacityReservationTarget"] = {"CapacityReservationId": target}
    market = get("InstanceMarketOptions.MarketType")
    if market:
        out["InstanceMarketOptions"] = {"MarketType": market}
    return out


# -- the middleware --------------------------------------------------------------------------------


class CapacityReservations:
    """WSGI middleware answering the capacity-reservation actions and refusing launches a targeted
    reservation cannot take (see the module's docstring)."""

    def __init__(self, app: Callable):
        self.app = app

    def __call__(self, environ: dict, start_response: Callable) -> Iterable[bytes]:
        scope = placement.request_scope(environ)
        if scope is None or scope[0] != "ec2":
            return self.app(environ, start_response)
        _, region, account = scope
        # Whatever the action shows (DescribeInstances, a launch's answer, ...), the reservations
        # that have ended by now have released their instances.
        _settle_scope(account, region)
        body = call_log.read_body(environ)
        params = call_log.query_params(environ, body)
        action = params.get("Action", "")
        if action not in ACTIONS and action not in LAUNCHES:
            return self.app(environ, start_response)
        dry_run = params.get("DryRun", "").lower() == "true"
        try:
            if action in ACTIONS:
                if dry_run:
                    raise faults.Ec2Error("DryRunOperation",
                                           "Request would have succeeded, but DryRun flag is set.", 412)
                return faults.answer(start_response, 200, self._action(action, params, placement.backend_of(account, region)))
            if dry_run:
                return self.app(environ, start_response)
            backend = placement.backend_of(account, region)
            with _launch_lock:
                if action == "RunInstances":
                    self._check_run_instances(environ, params, backend)
                    captured, answer = faults.call_captured(self.app, environ)
                    start_response(captured[0], captured[1])
                    return [answer]
                return self._create_fleet(environ, start_response, params, backend)
        except faults.Ec2Error as error:
            return faults.answer(start_response, error.status, faults.error_document(error.code, error.message))

    def _action(self, action: str, params: dict[str, str], backend: Any) -> bytes:
        if action in ("CreateCapacityReservation", "CreateInterruptibleCapacityReservationAllocation"):
            # CreateCapacityReservation's member is TagSpecifications.N (most actions': TagSpecification.N).
            specs = call_log.tag_specifications(params, "TagSpecifications") or call_log.tag_specifications(params)
            for rtype in specs:
                if rtype != "capacity-reservation":
                    raise faults.Ec2Error("InvalidParameterValue",
                                           f"'{rtype}' is not a valid taggable resource type for this operation.")
        if action == "CreateInterruptibleCapacityReservationAllocation":
            allocation = create_allocation(backend, params.get("CapacityReservationId", ""),
                                           params.get("InstanceCount"), tags=specs.get("capacity-reservation"),
                                           zero_size_preference=params.get("ZeroSizePreference"))
            return faults.ec2_response(action, allocation_answer(allocation))
        if action == "UpdateInterruptibleCapacityReservationAllocation":
            allocation = update_allocation(backend, params.get("CapacityReservationId", ""),
                                           params.get("TargetInstanceCount"),
                                           zero_size_preference=params.get("ZeroSizePreference"))
            return faults.ec2_response(action, allocation_answer(allocation, with_id=True))
        if action == "CreateCapacityReservation":
            reservation = create(
                backend, params.get("InstanceType", ""), params.get("InstanceCount"),
                zone=params.get("AvailabilityZone"), zone_id=params.get("AvailabilityZoneId"),
                platform=params.get("InstancePlatform"), match_criteria=params.get("InstanceMatchCriteria"),
                tenancy=params.get("Tenancy"), end_date_type=params.get("EndDateType"), end=params.get("EndDate"),
                tags=specs.get("capacity-reservation"))
            return faults.ec2_response(action, f"<capacityReservation>{reservation.xml(backend)}</capacityReservation>")
        if action == "DescribeCapacityReservations":
            ids = placement._values(params, "CapacityReservationId")
            filters = [(f.get("Name", ""), placement._values(f, "Value")) for f in call_log.indexed(params, "Filter")]
            found = describe(backend, ids, filters)
            limit = params.get("MaxResults")
            start = 0
            if params.get("NextToken"):
                try:
                    start = int(params["NextToken"])
                except ValueError:
                    raise faults.Ec2Error("InvalidParameterValue",
                                           f"Value ({params['NextToken']}) for parameter nextToken is invalid.") from None
            token = ""
            if limit:
                if ids:
                    raise faults.Ec2Error("InvalidParameterCombination",
                                           "The parameter capacityReservationIdSet cannot be used with maxResults.")
                try:
                    size = int(limit)
                except ValueError:
                    size = 0
                if not 1 <= size <= MAX_RESULTS:
                    raise faults.Ec2Error("InvalidParameterValue",
                                           f"Value ({limit}) for parameter maxResults is invalid. "
                                           f"It must be between 1 and {MAX_RESULTS}.")
                if start + size < len(found):
                    token = f"<nextToken>{start + size}</nextToken>"
                found = found[start:start + size]
            else:
                found = found[start:]
            items = "".join(f"<item>{r.xml(backend)}</item>" for r in found)
            return faults.ec2_response(action, f"<capacityReservationSet>{items}</capacityReservationSet>{token}")
        cancel(backend, params.get("CapacityReservationId", ""))
        return faults.ec2_response(action, "<return>true</return>")

    # -- launches ---------------------------------------------------------------------------------

    @staticmethod
    def _check_reserved_fleet(params: dict[str, str], kinds: list[str]) -> None:
        """What EC2 refuses of a fleet whose DefaultTargetCapacityType is reserved-capacity."""
        for kind in kinds:
            if kind not in FLEET_RESERVATION_TYPES:
                raise faults.Ec2Error("InvalidParameterValue",
                                       f"Value ({kind}) for parameter ReservedCapacityOptions.ReservationType is "
                                       "invalid.")
        if (params.get("Type") or "maintain") != "instant":
            raise faults.Ec2Error("InvalidParameterCombination",
                                   "The target capacity type reserved-capacity is supported only for fleets of type "
                                   "instant.")
        for name in ("OnDemandTargetCapacity", "SpotTargetCapacity"):
            if params.get(f"TargetCapacitySpecification.{name}") not in (None, "", "0"):
                raise faults.Ec2Error("InvalidParameterCombination",
                                       f"The parameter {name} cannot be used with the target capacity type "
                                       "reserved-capacity.")

    @staticmethod
    def _check_run_instances(environ: dict, params: dict[str, str], backend: Any) -> None:
        ref = placement._ref(params, "LaunchTemplate")
        data = placement.template_data(backend, ref) if ref else None
        request = _request_members(params.get)
        zone = (params.get("Placement.AvailabilityZone") or subnet_zone(backend, params.get("SubnetId"))
                or subnet_zone(backend, params.get("NetworkInterface.1.SubnetId")))
        launch = launch_of(backend, data, request, params.get("InstanceType"), zone)
        if not launch.target:
            check(backend, launch)
            return
        try:
            low = int(params.get("MinCount") or 1)
        except ValueError:
            return  # moto answers
        # moto launches MinCount instances (never more), which the reservation must have.
        check(backend, launch, low)

    def _create_fleet(self, environ: dict, start_response: Callable, params: dict[str, str],
                      backend: Any) -> Iterable[bytes]:
        target_type = params.get("TargetCapacitySpecification.DefaultTargetCapacityType")
        block = target_type == CAPACITY_BLOCK
        reserved = target_type == RESERVED_CAPACITY
        kinds = placement._values(params, "ReservedCapacityOptions.ReservationType")
        if reserved:
            self._check_reserved_fleet(params, kinds)
        if (params.get("Type") or "maintain") != "instant":
            return self.app(environ, start_response)
        lifecycle = faults.fleet_lifecycle(params)
        if reserved:
            lifecycle = INTERRUPTIBLE if INTERRUPTIBLE in (kinds or [INTERRUPTIBLE]) else "on-demand"
        errors: list[str] = []
        configs = []  # (config, kept overrides, had overrides)
        targeted: dict[str, int] = {}  # reservation id -> available
        untargeted = False
        for config in call_log.indexed(params, "LaunchTemplateConfigs"):
            data = placement.template_data(backend, placement._ref(config, "LaunchTemplateSpecification"))
            overrides = call_log.indexed(config, "Overrides")
            kept = []
            for override in overrides or [{}]:
                zone = override.get("AvailabilityZone") or subnet_zone(backend, override.get("SubnetId"))
                launch = launch_of(backend, data, None, override.get("InstanceType"), zone)
                try:
                    reservation = check(backend, launch)
                    if block and reservation is None:
                        raise faults.Ec2Error("InvalidParameterCombination",
                                               "A capacity-block fleet launches into a capacity block: its launch "
                                               "template targets none.")
                    if reserved and reservation is None:
                        raise faults.Ec2Error("InvalidParameterCombination",
                                               "A reserved-capacity fleet launches into capacity reservations: its "
                                               "launch template targets none.")
                    if reserved and kinds and fleet_reservation_type(reservation) not in kinds:
                        raise faults.Ec2Error("InvalidParameterCombination",
                                               f"The capacity reservation {reservation.id} is of the reservation type "
                                               f"{fleet_reservation_type(reservation)}, which the fleet's "
                                               "ReservedCapacityOptions do not list.")
                    kept.append(override)
                    if reservation is None:
                        untargeted = True
                    else:
                        targeted[reservation.id] = reservation.available(backend)
                except faults.Ec2Error as error:
                    errors.append(faults.fleet_error_item(faults.fleet_override(config, override), lifecycle,
                                                          error.code, error.message))
            configs.append((config, kept, bool(overrides)))
        if not errors and not targeted and not block and not reserved:
            return self.app(environ, start_response)
        if not any(kept for _, kept, _ in configs):
            return faults.answer(start_response, 200, faults.unfilled_fleet(errors))
        out = placement._without_overrides(params, configs) if errors else dict(params)
        if block or reserved:
            # moto knows neither target type: launched as on-demand, the instances carry their reservation.
            out["TargetCapacitySpecification.DefaultTargetCapacityType"] = "on-demand"
            out = {k: v for k, v in out.items() if not k.startswith("ReservedCapacityOptions.")}
        if targeted and not untargeted:
            try:
                wanted = int(params.get("TargetCapacitySpecification.TotalTargetCapacity") or 1)
            except ValueError:
                wanted = 1
            room = sum(targeted.values())
            if wanted > room:
                out["TargetCapacitySpecification.TotalTargetCapacity"] = str(room)
                errors += [faults.fleet_error_item(faults.fleet_override(config, o), lifecycle, EXHAUSTED,
                                                   "There is insufficient capacity in the targeted capacity "
                                                   "reservations for the fleet's target capacity.")
                           for config, kept, _ in configs for o in kept]
        placement._set_body(environ, out)
        captured, answer = faults.call_captured(self.app, environ)
        if errors and captured and captured[0].startswith("200"):
            answer = placement._with_errors(answer, errors)
        headers = [(k, v) for k, v in captured[1] if k.lower() != "content-length"]
        start_response(captured[0], headers + [("Content-Length", str(len(answer)))])
        return [answer]

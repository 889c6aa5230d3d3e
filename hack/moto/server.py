#!/usr/bin/env python3
"""Local AWS emulator (moto) that looks like an AWS account running EKS + Karpenter.

Start it through hack/moto-up.sh (which builds the venv from
hack/moto/requirements.txt, runs this file in the background and prints the
AWS_* exports); hack/moto-down.sh stops it. Running it by hand also works:

    python hack/moto/server.py [--port 14566] [--region us-west-2] [--cluster NAME ...]

What it serves
--------------
moto's own WSGI application (every service moto emulates, moto's /moto-api/
included), on 127.0.0.1:$MOTO_PORT (default 14566), with EC2 placement groups
and capacity reservations added (below), plus small endpoints of its own under /_karpenter-rs/ (no AWS API
uses that path: S3 bucket names cannot start with "_"):

    GET  /_karpenter-rs/ready   200 + JSON {"service": "karpenter-rs-moto", "pid", "port",
                                "region", "moto_version", "seeded": [...], "call_log"} once seeded
                                ("seeded": every cluster/region seeded since start;
                                /moto-api/reset does not clear that list)
    POST /_karpenter-rs/publish-eks-release
                                publish a newer EKS AMI release; JSON body
                                {"release": "v20251201", "region": "us-west-2"}: its AL2
                                and AL2023 images are registered (owner 602401143452) and
                                the "recommended" SSM parameters point at them; publishing
                                the catalog's newest release again (v20251101) restores the
                                catalog (the images of releases published since are withdrawn)
    POST /_karpenter-rs/instance-status
                                set what DescribeInstanceStatus reports for a running
                                instance's status checks; JSON body {"instance_id": "i-...",
                                "check": "instance"|"system", "status": "impaired"|"ok",
                                "impaired_since": "2026-11-24T12:00:00Z"} (impaired_since
                                defaults to now; "ok" gives the check back to moto, which
                                always reports it passed)
    POST /_karpenter-rs/capacity-block
                                make a capacity block (below); JSON body {"instance_type":
                                "p5.48xlarge", "zone": "us-west-2a", "count": 2, "start":
                                "2026-01-01T00:00:00Z", "end": "2026-01-02T00:00:00Z",
                                "region", "account", "tags": {"k": "v"}, "platform"} (start
                                defaults to now, end to a day after start); answers {"id",
                                "arn", "state", "available", ...}
    POST /_karpenter-rs/capacity-reservation
                                change a capacity reservation: JSON body {"id": "cr-...",
                                "region", "state": "expired"|"cancelled"|...|null, "end":
                                "2026-01-01T00:00:00Z"} (a state overrides the one the clock
                                gives, null gives it back; end sets the end date); answers as
                                capacity-block, 404 for no such reservation
    POST /_karpenter-rs/seed    seed more clusters; JSON body
                                {"clusters": ["name", ...], "region": "us-west-2"}
                                (or query ?cluster=a&cluster=b&region=...); answers
                                with what was seeded (ids, ARNs, URLs) as JSON
    POST /_karpenter-rs/call-log
                                switch the call log (below); JSON body {"path": "/abs/file.jsonl"}
                                records from now on to that file (appending), {"path": null} or
                                "" switches it off; answers {"call_log": ..., "previous": ...}
    POST /_karpenter-rs/faults  make the next calls of an EC2 action fail or hang as EC2's do
                                (below); JSON body {"action": "CreateFleet", "error":
                                "InsufficientInstanceCapacity"|"RequestLimitExceeded"|
                                "InternalError"|"stall", "count": N, "seconds": S}; answers
                                {"armed": ..., "pending": [...]} (400 with {"error"} when the
                                fault is not one it can inject)
    GET  /_karpenter-rs/faults  {"pending": [...], "injected": [...], "counts": {"<Action>
                                <error>": n}}: faults still armed and those injected so far
    DELETE /_karpenter-rs/faults
                                disarm every pending fault; answers {"cleared": [...]}

Call log of the controller's requests
-------------------------------------
With KARPENTER_RS_MOTO_CALL_LOG=/abs/path.jsonl in its environment (default: off; a
relative path is taken from the server's working directory), or once switched on through
POST /_karpenter-rs/call-log, the emulator appends one JSON line per IAM authorisation
that a request of the controller needs: action, resource ARN, and the condition keys IAM
would evaluate (request tags, the resource's tags as moto has them when the request
arrives, ec2:CreateAction, aws:RequestedRegion, iam:PassedToService). The controller's
requests are those whose user agent carries `app/karpenter-rs` (the app name the
`karpenter controller` command gives its AWS SDK clients); the seeding, the tests and the
kubelet stand-in (boto3) and the Rust tests' own SDK clients are not recorded.
hack/moto/call_log.py describes the lines and what each operation authorises;
tests/aws_emulator/test_controller_policy.py evaluates them against the controller policy
of docs/install.md. GET /_karpenter-rs/ready reports the file as "call_log".

EC2 faults
----------
hack/moto/faults.py, a WSGI middleware in front of moto (and of the call log), answers the
calls POST /_karpenter-rs/faults armed it for, by default only the controller's (user agent
`app/karpenter-rs`; "any_client": true for every caller), `count` calls (default 1) each:

* "InsufficientInstanceCapacity": CreateFleet answers 200 with no instances and one
  InsufficientInstanceCapacity error per override of the request (launch template, instance
  type, subnet, zone), or of its first "overrides": N, as EC2 answers an instant fleet it cannot
  fill; other actions answer 500 with EC2's error document;
* "RequestLimitExceeded" (throttling): 503; "InternalError": 500; "ServiceUnavailable" and
  "Unavailable": 503; any other code with "status": 400-599. The body is EC2's query-protocol
  <Response><Errors><Error><Code>..</Code><Message>..</Message></Error></Errors>
  <RequestID>..</RequestID></Response>;
* "stall": the call is held "seconds" (default 30) before moto executes it and answers;
* "after": true: moto executes the call first, then its answer is replaced by the error (or,
  with "stall", held back): EC2 acted, the caller never learns it.

Faults of one action are used in the order they were armed. Faulted calls (but those with
"after") never reach moto nor the call log.

EC2 placement groups
--------------------
moto 5.2.5 has none (its CreatePlacementGroup, DescribePlacementGroups and
DeletePlacementGroup answer 500). hack/moto/placement.py, a WSGI middleware between the
call log and moto, answers them as EC2 does:

* CreatePlacementGroup: GroupName, Strategy cluster|partition|spread, PartitionCount
  (partition: 1-7, default 2), SpreadLevel (spread: host|rack, default rack),
  TagSpecifications of `placement-group`; the group gets an id pg-<17 hex digits>, its
  ARN (placement-group/<name>) and the state `available`; a name taken answers
  InvalidPlacementGroup.Duplicate;
* DescribePlacementGroups: GroupName.N, GroupId.N, filters group-name, group-id,
  group-arn, state, strategy, spread-level, partition-count, tag:<key>, tag-key; a
  name or id of no group answers InvalidPlacementGroup.Unknown;
* DeletePlacementGroup: GroupName; InvalidPlacementGroup.Unknown for no such group,
  InvalidPlacementGroup.InUse while instances not terminated are in it.

Groups belong to the account and region, and /moto-api/reset removes them. An instance
launched by RunInstances (the request's Placement, else its launch template's) or by
CreateFleet (the launch template's Placement, or its override's) with a GroupName or GroupId
is in that group: DescribeInstances shows its placement's groupName, groupId and, in a
partition group, partitionNumber (the launch's PartitionNumber, else the partitions in
turn); the filter placement-group-name selects it. A launch into a group that does not
exist fails as on EC2: RunInstances with InvalidPlacementGroup.Unknown (400), an instant
CreateFleet with no instance from those overrides and an InvalidPlacementGroup.Unknown item
each in its errorSet (HTTP 200, as for insufficient capacity). A dry run of a launch is left
to moto (DryRunOperation, whatever the group); so are fleets of type request and maintain.

EC2 capacity reservations
-------------------------
moto 5.2.5 has none either (CreateCapacityReservation, DescribeCapacityReservations and
CancelCapacityReservation answer 500; the interruptible allocation actions are unknown to
it). hack/moto/reservations.py, a WSGI middleware
between the placement groups and moto, answers them as EC2 does (its docstring has the
XML and the details):

* CreateCapacityReservation: InstanceType, InstancePlatform, AvailabilityZone or
  AvailabilityZoneId, InstanceCount, InstanceMatchCriteria open|targeted (default open),
  Tenancy, EndDateType unlimited|limited with EndDate, TagSpecifications of
  `capacity-reservation`; the reservation gets an id cr-<17 hex digits>, its ARN
  (capacity-reservation/<id>), the account as owner, the type `default`, the state
  `active` and as many available instances as InstanceCount;
* DescribeCapacityReservations: CapacityReservationId.N (an unknown id answers
  InvalidCapacityReservationId.NotFound), filters instance-type, availability-zone,
  availability-zone-id, owner-id, state, instance-match-criteria, tenancy,
  instance-platform, end-date-type, reservation-type, capacity-reservation-id,
  interruptible, tag:<key>, tag-key; MaxResults and NextToken;
* CancelCapacityReservation: the state `cancelled`, no available instances;
* CreateInterruptibleCapacityReservationAllocation: CapacityReservationId (an active ODCR of
  type default without an end date, the source), InstanceCount (at most its available
  instances), TagSpecifications, ZeroSizePreference; makes an interruptible reservation (a new
  cr- id, <interruptible>true</interruptible>, targeted, the source's instance type, platform,
  zone and tenancy, InstanceCount instances) and takes them from the source's available ones;
  DescribeCapacityReservations shows <interruptibleCapacityAllocation> on the source and
  <interruptionInfo> on the new one;
* UpdateInterruptibleCapacityReservationAllocation: the source's CapacityReservationId and
  TargetInstanceCount; more takes instances from the source, fewer gives them back at once,
  terminating the newest instances running in the interruptible reservation beyond the target
  (0 with ZeroSizePreference default cancels it).

Capacity blocks (EC2 sells them through PurchaseCapacityBlock, which is not emulated) are
made through POST /_karpenter-rs/capacity-block: reservations of type `capacity-block`,
targeted, ending at "end", `scheduled` before "start", `active` until "end", `expired`
after. POST /_karpenter-rs/capacity-reservation changes a reservation's state or end date.

An instance launched by RunInstances or an instant CreateFleet whose launch template (or,
for RunInstances, request) has a CapacityReservationTarget takes an available instance of
that reservation; the instance type and zone must be the reservation's, a capacity block
needs the market type capacity-block and an interruptible reservation the market type
interruptible-capacity-reservation (InstanceMarketOptions.MarketType; that market type without
an interruptible target fails with InvalidParameterCombination). A fleet's
DefaultTargetCapacityType `capacity-block`, or `reserved-capacity` (with
ReservedCapacityOptions.ReservationType.N), is launched as on-demand. A reservation without
an available instance, or not active, fails the launch with ReservationCapacityExceeded:
RunInstances with a 400, an instant CreateFleet with an error item per such override (HTTP
200; the other overrides launch). Without a target, an instance (preference `open`, the
default) runs in an active `open` reservation of its type, zone, platform and tenancy while
one has room. DescribeInstances shows capacityReservationId,
capacityReservationSpecification and, in a capacity block, the instance lifecycle
`capacity-block`, in an interruptible reservation `interruptible-capacity-reservation` (so
does an instant fleet's answer); a terminated instance gives its instance back. Once a
reservation is cancelled or expired (CancelCapacityReservation, its end date passing, or a
state set through POST /_karpenter-rs/capacity-reservation), its instances go as on EC2:
those of an ODCR (type `default`) keep running as plain On-Demand instances, shown with no
capacityReservationId and the preference `open` without a target; those of a capacity block
or of an interruptible reservation are terminated. That is applied lazily, when a request
looks (any EC2 request of the account and region, the extension endpoints), not on a timer.
Reservations belong to the account and region; /moto-api/reset removes them.

An instance launched with CpuOptions (the RunInstances request's, else its launch
template's; a fleet's launch template's) shows them in its <cpuOptions>, e.g.
<nestedVirtualization>enabled</nestedVirtualization> (moto keeps a launch template's
CpuOptions but shows none on its instances).

Account seed (per cluster name and region)
------------------------------------------
* EC2: a VPC (10.0.0.0/16), three private subnets in the first three zones of
  the region (us-west-2a/b/c for us-west-2) and a node security group, all
  tagged karpenter.sh/discovery=<cluster> plus Name tags;
* IAM: KarpenterNodeRole-<cluster> (EC2 trust, the usual node managed
  policies) and <cluster>-eks-cluster-role (EKS trust);
* EKS: cluster <cluster>, Kubernetes $EKS_CLUSTER_VERSION (default 1.34), in
  those subnets / that security group (endpoint and CA are moto's fakes);
* SQS: the interruption queue <cluster>;
* SSM: the public EKS-optimized AMI parameters (/aws/service/eks/...,
  /aws/service/bottlerocket/... and /aws/service/ami-windows-latest/...) for
  the seeded region.

The AMIs themselves come from hack/moto/amis.json (MOTO_AMIS_PATH, generated
by hack/moto/eks_images.py, owner 602401143452; the Windows ones owner
801119661308, platform windows). moto loads them into every region when the
region's EC2 backend is created, so they exist in every region and survive
/moto-api/reset, like real public images. DescribeImages reports each image's
PlatformDetails and UsageOperation as EC2 does ("Windows" / "RunInstances:0002"
for Windows images, "Linux/UNIX" / "RunInstances" otherwise), which moto 5.2.5
leaves out.

Everything except the SSM parameters is created through the ordinary AWS APIs
(boto3 against this very server), so it is what any client could create. moto
rejects PutParameter under /aws/, so those parameters are written into moto's
SSM backend directly (an internal API: moto is pinned in requirements.txt).

The seed is idempotent: each resource is looked up (by discovery tag, name,
...) before it is created, so seeding the same cluster twice changes nothing.
Several clusters can be seeded (--cluster repeated, CLUSTER_NAMES, or the seed
endpoint); they get separate VPCs (same CIDR, as separate VPCs may).

Re-seeding design
-----------------
The initial seed happens before the port starts answering: the listening
socket is bound first (so a second instance fails fast), the seed runs through
a throwaway in-process server on an ephemeral port, and only then does the real
port start serving. A client that can connect therefore always sees the
seeded account.

POST /moto-api/reset wipes all state, the seed included (the AMIs come back by
themselves, see above). To seed again, POST /_karpenter-rs/seed, or simply run
hack/moto-up.sh again: on a running server it posts the seed for
$CLUSTER_NAMES / $AWS_REGION, which is a no-op when nothing is missing.
hack/moto-up.sh --restart gives a fresh server.
"""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import os
import re
import signal
import sys
import threading
import time
import traceback
from pathlib import Path
from urllib.parse import parse_qs

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.dont_write_bytecode = True  # no __pycache__ in the source tree

import call_log  # noqa: E402
import eks_images  # noqa: E402
import faults  # noqa: E402
import placement  # noqa: E402
import reservations  # noqa: E402

DISCOVERY_TAG = "karpenter.sh/discovery"
VPC_CIDR = "10.0.0.0/16"
SUBNET_CIDRS = ["10.0.0.0/19", "10.0.32.0/19", "10.0.64.0/19"]
SERVICE_CIDR = "172.20.0.0/16"
DUMMY_KEY = "testing"
INTERNAL_PREFIX = "/_karpenter-rs/"
SERVICE_ID = "karpenter-rs-moto"

NODE_POLICIES = [
    "AmazonEKSWorkerNodePolicy",
    "AmazonEKS_CNI_Policy",
    "AmazonEC2ContainerRegistryReadOnly",
    "AmazonSSMManagedInstanceCore",
]
CLUSTER_POLICIES = ["AmazonEKSClusterPolicy"]

log = logging.getLogger("krs-moto")


def _assume_role_policy(service: str) -> str:
    return json.dumps(
        {
            "Version": "2012-10-17",
            "Statement": [
                {
                    "Effect": "Allow",
                    "Principal": {"Service": service},
                    "Action": "sts:AssumeRole",
                }
            ],
        }
    )


def _tags(cluster: str, name: str, **extra: str) -> list[dict[str, str]]:
    tags = {DISCOVERY_TAG: cluster, "Name": name, **extra}
    return [{"Key": k, "Value": v} for k, v in tags.items()]


class Seeder:
    """Seeds clusters over the AWS APIs of a running moto server."""

    def __init__(self, eks_version: str):
        self.eks_version = eks_version
        self.lock = threading.Lock()
        self.seeded: list[dict[str, str]] = []
        self._client_cache: dict[tuple[str, str, str], object] = {}

    # -- helpers --------------------------------------------------------

    def _clients(self, endpoint: str, region: str):
        """client(service) for endpoint/region; clients are cached (creating one is slow)."""
        import boto3
        from botocore.config import Config

        session = boto3.session.Session(
            aws_access_key_id=DUMMY_KEY,
            aws_secret_access_key=DUMMY_KEY,
            region_name=region,
        )
        cfg = Config(retries={"max_attempts": 1}, connect_timeout=5, read_timeout=60)

        def client(name: str):
            key = (endpoint, region, name)
            if key not in self._client_cache:
                self._client_cache[key] = session.client(
                    name, endpoint_url=endpoint, config=cfg
                )
            return self._client_cache[key]

        return client

    # -- seeding --------------------------------------------------------

    def seed(self, endpoint: str, region: str, clusters: list[str]) -> list[dict]:
        with self.lock:
            client = self._clients(endpoint, region)
            account = client("sts").get_caller_identity()["Account"]
            n_params = self._seed_ssm(account, region)
            results = []
            for cluster in clusters:
                t0 = time.monotonic()
                res = self._seed_cluster(client, region, cluster)
                res["ssm_public_parameters"] = n_params
                log.info("seed of %s: %s", cluster, json.dumps(res))
                results.append(res)
                entry = {"cluster": cluster, "region": region}
                if entry not in self.seeded:
                    self.seeded.append(entry)
                log.info(
                    "seeded cluster %s in %s (%s, %.2fs)",
                    cluster, region, account, time.monotonic() - t0,
                )
            return results

    def _seed_cluster(self, client, region: str, cluster: str) -> dict:
        ec2 = client("ec2")
        iam = client("iam")
        eks = client("eks")
        sqs = client("sqs")
        disc = [{"Name": f"tag:{DISCOVERY_TAG}", "Values": [cluster]}]

        # Zones: the first three availability zones of the region.
        zones = sorted(
            z["ZoneName"]
            for z in ec2.describe_availability_zones(
                Filters=[{"Name": "zone-type", "Values": ["availability-zone"]}]
            )["AvailabilityZones"]
            if z.get("State", "available") == "available"
        )[:3]
        if len(zones) < 3:
            raise RuntimeError(f"region {region} has fewer than 3 zones: {zones}")

        # VPC
        vpcs = ec2.describe_vpcs(Filters=disc)["Vpcs"]
        if vpcs:
            vpc_id = vpcs[0]["VpcId"]
        else:
            vpc_id = ec2.create_vpc(
                CidrBlock=VPC_CIDR,
                TagSpecifications=[
                    {"ResourceType": "vpc", "Tags": _tags(cluster, f"{cluster}-vpc")}
                ],
            )["Vpc"]["VpcId"]
            ec2.modify_vpc_attribute(VpcId=vpc_id, EnableDnsSupport={"Value": True})
            ec2.modify_vpc_attribute(VpcId=vpc_id, EnableDnsHostnames={"Value": True})

        # Subnets, one per zone
        existing = ec2.describe_subnets(
            Filters=disc + [{"Name": "vpc-id", "Values": [vpc_id]}]
        )["Subnets"]
        by_zone = {s["AvailabilityZone"]: s["SubnetId"] for s in existing}
        subnet_ids = []
        for zone, cidr in zip(zones, SUBNET_CIDRS):
            if zone not in by_zone:
                by_zone[zone] = ec2.create_subnet(
                    VpcId=vpc_id,
                    CidrBlock=cidr,
                    AvailabilityZone=zone,
                    TagSpecifications=[
                        {
                            "ResourceType": "subnet",
                            "Tags": _tags(
                                cluster,
                                f"{cluster}-private-{zone}",
                                **{"kubernetes.io/role/internal-elb": "1"},
                            ),
                        }
                    ],
                )["Subnet"]["SubnetId"]
            subnet_ids.append(by_zone[zone])

        # Node security group
        sg_name = f"{cluster}-node"
        sgs = ec2.describe_security_groups(
            Filters=disc + [{"Name": "vpc-id", "Values": [vpc_id]}]
        )["SecurityGroups"]
        if sgs:
            sg_id = sgs[0]["GroupId"]
        else:
            sg_id = ec2.create_security_group(
                GroupName=sg_name,
                Description=f"EKS node security group of cluster {cluster}",
                VpcId=vpc_id,
                TagSpecifications=[
                    {"ResourceType": "security-group", "Tags": _tags(cluster, sg_name)}
                ],
            )["GroupId"]
            ec2.authorize_security_group_ingress(
                GroupId=sg_id,
                IpPermissions=[
                    {"IpProtocol": "-1", "UserIdGroupPairs": [{"GroupId": sg_id}]}
                ],
            )

        # IAM roles
        node_role = self._ensure_role(
            iam,
            f"KarpenterNodeRole-{cluster}",
            "ec2.amazonaws.com",
            NODE_POLICIES,
            f"Karpenter node role of cluster {cluster}",
        )
        cluster_role = self._ensure_role(
            iam,
            f"{cluster}-eks-cluster-role",
            "eks.amazonaws.com",
            CLUSTER_POLICIES,
            f"EKS cluster role of cluster {cluster}",
        )

        # EKS cluster
        try:
            eks_cluster = eks.describe_cluster(name=cluster)["cluster"]
        except eks.exceptions.ResourceNotFoundException:
            eks_cluster = eks.create_cluster(
                name=cluster,
                version=self.eks_version,
                roleArn=cluster_role,
                resourcesVpcConfig={
                    "subnetIds": subnet_ids,
                    "securityGroupIds": [sg_id],
                    "endpointPublicAccess": True,
                    "endpointPrivateAccess": True,
                },
                kubernetesNetworkConfig={
                    "serviceIpv4Cidr": SERVICE_CIDR,
                    "ipFamily": "ipv4",
                },
            )["cluster"]

        # Interruption queue (same attributes as Karpenter's getting-started template)
        queue_url = sqs.create_queue(
            QueueName=cluster,
            Attributes={"MessageRetentionPeriod": "300", "SqsManagedSseEnabled": "true"},
        )["QueueUrl"]

        return {
            "cluster": cluster,
            "region": region,
            "zones": zones,
            "vpc_id": vpc_id,
            "subnet_ids": subnet_ids,
            "security_group_id": sg_id,
            "node_role_arn": node_role,
            "cluster_role_arn": cluster_role,
            "cluster_arn": eks_cluster["arn"],
            "kubernetes_version": eks_cluster["version"],
            "queue_url": queue_url,
        }

    @staticmethod
    def _ensure_role(iam, name, service, policies, description) -> str:
        try:
            return iam.get_role(RoleName=name)["Role"]["Arn"]
        except iam.exceptions.NoSuchEntityException:
            pass
        arn = iam.create_role(
            RoleName=name,
            AssumeRolePolicyDocument=_assume_role_policy(service),
            Description=description,
        )["Role"]["Arn"]
        for policy in policies:
            iam.attach_role_policy(
                RoleName=name, PolicyArn=f"arn:aws:iam::aws:policy/{policy}"
            )
        return arn

    @staticmethod
    def _seed_ssm(account: str, region: str) -> int:
        """Write the public /aws/service/... parameters into moto's SSM backend.

        moto's PutParameter refuses names under /aws/, so this goes through the
        backend: ParameterDict (a dict of name -> list of versions) and
        Parameter, as in moto 5.2.5 (moto/ssm/models.py).
        """
        return Seeder._put_public_parameters(account, region, eks_images.ssm_parameters())

    @staticmethod
    def _put_public_parameters(account: str, region: str, values: dict[str, str]) -> int:
        """Write SSM parameters under /aws/ (a new version when the value changed)."""
        from moto.core.utils import utcnow
        from moto.ssm.models import Parameter, ssm_backends

        params = ssm_backends[account][region]._parameters
        for name, value in values.items():
            versions = params[name]
            if versions and versions[-1].value == value:
                continue
            versions.append(
                Parameter(
                    account_id=account,
                    name=name,
                    value=value,
                    parameter_type="String",
                    description=None,
                    allowed_pattern=None,
                    keyid=None,
                    last_modified_date=utcnow(),
                    version=(versions[-1].version + 1) if versions else 1,
                    data_type="text",
                    tier="Standard",
                )
            )
        return len(values)

    def publish_eks_release(self, endpoint: str, region: str, release: str, created: str) -> dict:
        """Publish EKS release `release` in `region` as AWS would: its AL2 and AL2023
        images exist (owner 602401143452) and the "recommended" SSM parameters
        point at them. Publishing one of the catalog's releases again points
        "recommended" back at it."""
        from moto.ec2.models import ec2_backends
        from moto.ec2.models.amis import Ami
        from moto.core.parse import default_timestamp_parser as parse_timestamp

        with self.lock:
            account = self._clients(endpoint, region)("sts").get_caller_identity()["Account"]
            backend = ec2_backends[account][region]
            images = eks_images.eks_release_images(release, created)
            added = []
            # A new dict swapped in whole: requests being served keep iterating the old one.
            amis = dict(backend.amis)
            for img in images:
                ami = eks_images.moto_ami(img)
                if ami["ami_id"] in amis:
                    continue
                ami["owner_alias"] = "amazon"
                ami["creation_date"] = parse_timestamp(ami["creation_date"])
                amis[ami["ami_id"]] = Ami(backend, **ami)
                added.append(ami["ami_id"])
            backend.amis = amis
            params = {k: v for img in images for k, v in img["ssm"].items()}
            self._put_public_parameters(account, region, params)
            withdrawn = []
            if release in dict(eks_images.EKS_RELEASES):
                withdrawn = self._withdraw_published_releases(account, region)
            log.info(
                "published EKS release %s in %s: %d images (%d new, %d withdrawn)",
                release, region, len(images), len(added), len(withdrawn),
            )
            return {"release": release, "region": region, "images": len(images), "added": added,
                    "withdrawn": withdrawn, "parameters": params}

    @staticmethod
    def _withdraw_published_releases(account: str, region: str) -> list[str]:
        """Remove the images (and their pinned SSM parameters) of EKS releases published
        since the start, so that the catalog is as it was: images are looked up by
        name too, and the newest matching one wins."""
        from moto.ec2.models import ec2_backends
        from moto.ssm.models import ssm_backends

        catalog = {release for release, _ in eks_images.EKS_RELEASES}
        backend = ec2_backends[account][region]
        withdrawn = []
        kept = {}
        for ami_id, ami in list(backend.amis.items()):
            match = re.fullmatch(r"amazon-eks-.*-(v\d{8})", ami.name or "")
            if ami.owner_id == eks_images.OWNER_ID and match and match.group(1) not in catalog:
                withdrawn.append(ami_id)
            else:
                kept[ami_id] = ami
        backend.amis = kept
        params = ssm_backends[account][region]._parameters
        for name in [n for n in list(params.keys()) if re.search(r"-v\d{8}/image_id$", n)]:
            release = re.search(r"-(v\d{8})/image_id$", name).group(1)
            if name.startswith(eks_images.EKS_PREFIX) and release not in catalog:
                del params[name]
        return withdrawn


class App:
    """moto's WSGI app plus the /_karpenter-rs/ endpoints."""

    def __init__(self, moto_app, seeder: Seeder, port: int, region: str,
                 recorder: call_log.CallRecorder | None = None,
                 injector: faults.FaultInjector | None = None):
        self.moto_app = moto_app
        self.seeder = seeder
        self.recorder = recorder
        self.injector = injector
        self.port = port
        self.region = region

    def __call__(self, environ, start_response):
        path = environ.get("PATH_INFO", "")
        if not path.startswith(INTERNAL_PREFIX):
            return self.moto_app(environ, start_response)
        try:
            status, body = self._internal(environ, path[len(INTERNAL_PREFIX):])
        except Exception as exc:  # report, don't kill the server
            log.error("%s failed:\n%s", path, traceback.format_exc())
            status, body = "500 Internal Server Error", {"error": f"{type(exc).__name__}: {exc}"}
        data = (json.dumps(body, indent=1) + "\n").encode()
        start_response(
            status,
            [("Content-Type", "application/json"), ("Content-Length", str(len(data)))],
        )
        return [data]

    def _internal(self, environ, name: str):
        method = environ.get("REQUEST_METHOD", "GET")
        if name == "ready" and method in ("GET", "HEAD"):
            import moto

            return "200 OK", {
                "service": SERVICE_ID,
                "pid": os.getpid(),
                "port": self.port,
                "region": self.region,
                "moto_version": moto.__version__,
                "seeded": self.seeder.seeded,
                "call_log": self.recorder.path if self.recorder else None,
            }
        if name == "seed" and method == "POST":
            query = parse_qs(environ.get("QUERY_STRING", ""))
            body = {}
            length = int(environ.get("CONTENT_LENGTH") or 0)
            if length:
                raw = environ["wsgi.input"].read(length)
                if raw.strip():
                    body = json.loads(raw)
            given = body.get("clusters", [])
            given = [given] if isinstance(given, str) else list(given)
            clusters = _split_names(given + query.get("cluster", []))
            region = body.get("region") or (query.get("region") or [self.region])[0]
            if not clusters:
                return "400 Bad Request", {"error": "no cluster given"}
            endpoint = f"http://127.0.0.1:{self.port}"
            return "200 OK", {"seeded": self.seeder.seed(endpoint, region, clusters)}
        if name == "publish-eks-release" and method == "POST":
            length = int(environ.get("CONTENT_LENGTH") or 0)
            body = json.loads(environ["wsgi.input"].read(length) or b"{}") if length else {}
            release = body.get("release", "")
            if not re.fullmatch(r"v\d{8}", release):
                return "400 Bad Request", {"error": f"release {release!r} is not vYYYYMMDD"}
            created = body.get("created") or (
                f"{release[1:5]}-{release[5:7]}-{release[7:9]}T00:00:00.000Z"
            )
            region = body.get("region") or self.region
            endpoint = f"http://127.0.0.1:{self.port}"
            return "200 OK", self.seeder.publish_eks_release(endpoint, region, release, created)
        if name == "call-log" and method == "POST" and self.recorder is not None:
            length = int(environ.get("CONTENT_LENGTH") or 0)
            body = json.loads(environ["wsgi.input"].read(length) or b"{}") if length else {}
            path = body.get("path") or None
            if path and not os.path.isabs(path):
                return "400 Bad Request", {"error": f"path {path!r} is not absolute"}
            previous = self.recorder.set_path(path)
            return "200 OK", {"call_log": self.recorder.path, "previous": previous}
        if name == "faults" and self.injector is not None:
            if method == "GET":
                return "200 OK", self.injector.status()
            if method == "DELETE":
                return "200 OK", self.injector.disarm()
            if method == "POST":
                length = int(environ.get("CONTENT_LENGTH") or 0)
                try:
                    body = json.loads(environ["wsgi.input"].read(length) or b"{}") if length else {}
                    return "200 OK", self.injector.arm(body)
                except (ValueError, faults.FaultError) as exc:
                    return "400 Bad Request", {"error": str(exc)}
        if name in ("capacity-block", "capacity-reservation") and method == "POST":
            length = int(environ.get("CONTENT_LENGTH") or 0)
            body = json.loads(environ["wsgi.input"].read(length) or b"{}") if length else {}
            if name == "capacity-block":
                return reservations.create_capacity_block(body, self.region)
            return reservations.update(body, self.region)
        if name == "instance-status" and method == "POST":
            length = int(environ.get("CONTENT_LENGTH") or 0)
            body = json.loads(environ["wsgi.input"].read(length) or b"{}") if length else {}
            return _set_instance_status(body)
        return "404 Not Found", {"error": f"unknown endpoint {method} {INTERNAL_PREFIX}{name}"}


def _fleets_use_launch_template_security_groups() -> None:
    """Make CreateFleet give its instances the launch template's security groups (and its
    tenancy, which moto ignores: every instance would be `default`).

    EC2 launches a fleet's instances with the SecurityGroupIds of their launch
    template; moto 5.2.5 (moto/ec2/models/fleets.py) only reads a "GroupSet" key
    the template data never has, so every fleet instance lands in the VPC's
    default group and looks security-group drifted. Before the fleet asks for
    instances, each launch spec without groups gets its template version's
    SecurityGroupIds (run_instances accepts ids where it takes group names).
    """
    from moto.ec2.models import fleets

    def template_data(fleet, spec) -> dict:
        ref = getattr(spec, "launch_template_spec", None) or {}
        if "LaunchTemplateId" not in ref:
            return {}
        template = fleet.ec2_backend.get_launch_template(ref["LaunchTemplateId"])
        version = template.get_version(ref.get("Version") or template.default_version_number)
        return version.data or {}

    def fill(fleet) -> None:
        for spec in fleet.launch_specs:
            if not spec.group_set:
                data = template_data(fleet, spec)
                groups = list(data.get("SecurityGroupIds") or [])
                # Or those of the primary interface, when the template spells it out.
                for nic in data.get("NetworkInterfaces") or data.get("NetworkInterface") or []:
                    if str(nic.get("DeviceIndex", "0")) == "0":
                        groups += list(nic.get("Groups") or nic.get("SecurityGroupId") or [])
                spec.group_set = groups

    def place(fleet, launched: list[dict]) -> None:
        """The template's Placement.Tenancy on the instances launched from it."""
        for item in launched:
            tenancy = (template_data(fleet, item["launch_spec"]).get("Placement") or {}).get("Tenancy")
            if tenancy:
                item["instance"].placement.tenancy = tenancy

    for name in ("create_on_demand_requests", "create_spot_requests"):
        original = getattr(fleets.Fleet, name)

        def patched(self, weight, _original=original):
            fill(self)
            before = len(self.on_demand_instances)
            out = _original(self, weight)
            place(self, self.on_demand_instances[before:])
            return out

        setattr(fleets.Fleet, name, patched)


# Status checks set through /_karpenter-rs/instance-status: instance id -> check -> summary.
_STATUS_CHECKS: dict[str, dict[str, dict]] = {}


def _set_instance_status(body: dict):
    instance_id = body.get("instance_id") or ""
    check = body.get("check") or "instance"
    status = body.get("status") or "impaired"
    if not instance_id.startswith("i-") or check not in ("instance", "system"):
        return "400 Bad Request", {"error": "give instance_id (i-...) and check (instance or system)"}
    if status == "ok":
        _STATUS_CHECKS.get(instance_id, {}).pop(check, None)
        return "200 OK", {"instance_id": instance_id, check: "ok"}
    if status != "impaired":
        return "400 Bad Request", {"error": f"status {status!r} is neither impaired nor ok"}
    since = body.get("impaired_since")
    since = (
        datetime.datetime.fromisoformat(since.replace("Z", "+00:00"))
        if since
        else datetime.datetime.now(datetime.timezone.utc)
    )
    _STATUS_CHECKS.setdefault(instance_id, {})[check] = {
        "Details": [{"Name": "reachability", "Status": "failed", "ImpairedSince": since}],
        "Status": "impaired",
    }
    return "200 OK", {"instance_id": instance_id, check: "impaired", "impaired_since": since.isoformat()}


def _status_checks_can_be_set() -> None:
    """Make DescribeInstanceStatus report the checks set through /_karpenter-rs/instance-status.

    moto 5.2.5 reports every running instance's instance and system checks as
    passed; a check set impaired is reported as EC2 reports a failed one (status
    impaired, a failed reachability detail with its ImpairedSince) while the
    instance runs. The status filters (instance-status.status,
    system-status.status, event.code) select instances as EC2's do.
    """
    from moto.ec2.models.instances import Instance

    # DescribeInstanceStatus's status filters, which moto 5.2.5 ignores (it returns every
    # instance): evaluated here on what the checks report. No instance has scheduled events, so
    # an event.code filter matches none.
    status_filters = {
        "instance-status.status": lambda i: i.instance_status.get("Status"),
        "system-status.status": lambda i: i.system_status.get("Status"),
        "event.code": lambda i: None,
    }
    original_applies = Instance.applies

    def applies(self, filters, _original=original_applies):
        for f in filters or []:
            value = status_filters.get(f.get("name"))
            if value is not None and value(self) not in f.get("values", []):
                return False
        return _original(self, filters)

    Instance.applies = applies

    for attr, check in (("instance_status", "instance"), ("system_status", "system")):
        original = getattr(Instance, attr)

        def patched(self, _original=original, _check=check):
            summary = _STATUS_CHECKS.get(self.id, {}).get(_check)
            if summary is None or self.state_code != 16:
                return _original.fget(self)
            return summary

        setattr(Instance, attr, property(patched))


def _images_report_platform_details() -> None:
    """Give moto's images the PlatformDetails and UsageOperation EC2 reports.

    moto 5.2.5's Ami has a `platform` ("windows" or none) but no platform details,
    so DescribeImages leaves both fields out. They follow from the platform here
    (an image made from an instance inherits the instance's platform in moto).
    """
    from moto.ec2.models.amis import Ami

    def windows(ami) -> bool:
        return (getattr(ami, "platform", None) or "").lower() == "windows"

    Ami.platform_details = property(lambda self: "Windows" if windows(self) else "Linux/UNIX")
    Ami.usage_operation = property(lambda self: "RunInstances:0002" if windows(self) else "RunInstances")


def _instances_show_cpu_options() -> None:
    """Make an instance show the CpuOptions it was launched with.

    moto 5.2.5 keeps a launch template's CpuOptions (CoreCount, ThreadsPerCore, AmdSevSnp,
    NestedVirtualization) as it keeps any LaunchTemplateData member, but its instances have
    none: DescribeInstances and the RunInstances answer show no <cpuOptions>. An instance
    launched by RunInstances (the request's CpuOptions, else its launch template's) or by
    CreateFleet (its launch template's) with CpuOptions shows them, as given.
    """
    from moto.ec2.models import fleets
    from moto.ec2.responses.instances import InstanceResponse

    def show(instance, options) -> None:
        if instance is not None and options:
            instance.cpu_options = {k: v for k, v in dict(options).items() if v not in (None, "")}

    original_run = InstanceResponse.run_instances

    def run_instances(self, _original=original_run):
        result = _original(self)
        options = self._get_param("CpuOptions") or (
            placement.template_data(self.ec2_backend, self._get_param("LaunchTemplate", {}) or {}) or {}
        ).get("CpuOptions")
        for instance in getattr(getattr(result, "result", None), "instances", None) or []:
            show(instance, options)
        return result

    InstanceResponse.run_instances = run_instances

    def template_options(fleet, spec) -> dict | None:
        ref = getattr(spec, "launch_template_spec", None) or {}
        return (placement.template_data(fleet.ec2_backend, ref) or {}).get("CpuOptions")

    original_on_demand = fleets.Fleet.create_on_demand_requests

    def create_on_demand_requests(self, weight, _original=original_on_demand):
        before = len(self.on_demand_instances)
        out = _original(self, weight)
        for item in self.on_demand_instances[before:]:
            show(item.get("instance"), template_options(self, item.get("launch_spec")))
        return out

    original_spot = fleets.Fleet.create_spot_requests

    def create_spot_requests(self, weight, _original=original_spot):
        before = len(self.spot_requests)
        out = _original(self, weight)
        for request in self.spot_requests[before:]:
            show(getattr(request, "instance", None), template_options(self, request.launch_spec))
        return out

    fleets.Fleet.create_on_demand_requests = create_on_demand_requests
    fleets.Fleet.create_spot_requests = create_spot_requests


def _split_names(values) -> list[str]:
    names: list[str] = []
    for value in values:
        for name in value.replace(",", " ").split():
            if name not in names:
                names.append(name)
    return names


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=int(os.environ.get("MOTO_PORT", "14566")))
    parser.add_argument("--region", default=os.environ.get("AWS_REGION") or "us-west-2")
    parser.add_argument(
        "--cluster",
        action="append",
        default=[],
        help="cluster to seed (repeatable; default: $CLUSTER_NAMES or $CLUSTER_NAME or karpenter-demo)",
    )
    parser.add_argument("--pid-file", help="written once the port answers, removed at exit")
    args = parser.parse_args(argv)

    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s"
    )
    clusters = _split_names(args.cluster) or _split_names(
        [os.environ.get("CLUSTER_NAMES") or os.environ.get("CLUSTER_NAME") or "karpenter-demo"]
    )
    eks_version = os.environ.get("EKS_CLUSTER_VERSION") or "1.34"

    if not eks_images.check():
        log.error("hack/moto/amis.json is stale: run hack/moto/eks_images.py --write")
        return 1

    # moto reads these when it is imported / when backends are created.
    os.environ["MOTO_AMIS_PATH"] = str(eks_images.AMIS_PATH)
    os.environ["MOTO_PORT"] = str(args.port)
    os.environ.setdefault("MOTO_IAM_LOAD_MANAGED_POLICIES", "true")
    # The seeding client talks to this process only: no user AWS config or proxy.
    for var in ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_ENDPOINT_URL"):
        os.environ.pop(var, None)
    os.environ["AWS_CONFIG_FILE"] = os.devnull
    os.environ["AWS_SHARED_CREDENTIALS_FILE"] = os.devnull
    os.environ["NO_PROXY"] = os.environ["no_proxy"] = "127.0.0.1,localhost"

    import moto
    from moto.moto_server.werkzeug_app import (
        DomainDispatcherApplication,
        MotoRequestHandler,
        create_backend_app,
    )
    from werkzeug.serving import make_server

    _fleets_use_launch_template_security_groups()
    _status_checks_can_be_set()
    _images_report_platform_details()
    _instances_show_cpu_options()
    placement.install_instance_placement()
    reservations.install_instance_reservations()
    seeder = Seeder(eks_version)
    # Placement groups and capacity reservations are answered behind the call log, which records
    # them like moto's calls.
    recorder = call_log.CallRecorder(placement.PlacementGroups(
        reservations.CapacityReservations(DomainDispatcherApplication(create_backend_app))))
    if os.environ.get(call_log.ENV_VAR):
        recorder.set_path(os.path.abspath(os.environ[call_log.ENV_VAR]))
    # Faults answer before the call log and moto see a call (see hack/moto/faults.py).
    injector = faults.FaultInjector(recorder)
    app = App(injector, seeder, args.port, args.region, recorder, injector)

    # Bind the real port now (fails fast if taken); it serves only after seeding.
    server = make_server(
        args.host, args.port, app, threaded=True, request_handler=MotoRequestHandler
    )
    # Don't wait for idle keep-alive connections when stopping.
    server.daemon_threads = True
    server.block_on_close = False
    log.info(
        "moto %s on %s:%d, region %s, seeding %s (EKS %s)",
        moto.__version__, args.host, args.port, args.region, ", ".join(clusters), eks_version,
    )

    t0 = time.monotonic()
    seed_server = make_server(
        "127.0.0.1", 0, app, threaded=True, request_handler=MotoRequestHandler
    )
    seed_server.daemon_threads = True
    seed_server.block_on_close = False
    seed_thread = threading.Thread(
        target=seed_server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
    )
    seed_thread.start()
    try:
        seeder.seed(f"http://127.0.0.1:{seed_server.server_port}", args.region, clusters)
    finally:
        seed_server.shutdown()
        seed_server.server_close()
    # Create the seeding clients for the real port now, so that the first
    # re-seed (hack/moto-up.sh on a running server) is fast.
    client = seeder._clients(f"http://127.0.0.1:{args.port}", args.region)
    for service in ("sts", "ec2", "iam", "eks", "sqs"):
        client(service)
    log.info("seed done in %.2fs", time.monotonic() - t0)

    def stop(signum, _frame):
        log.info("signal %d: shutting down", signum)
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)

    pid_file = Path(args.pid_file) if args.pid_file else None
    if pid_file:
        pid_file.parent.mkdir(parents=True, exist_ok=True)
        pid_file.write_text(f"{os.getpid()}\n")
    log.info("serving on http://%s:%d", args.host, args.port)
    try:
        server.serve_forever(poll_interval=0.2)
    finally:
        server.server_close()
        if pid_file and pid_file.exists() and pid_file.read_text().strip() == str(os.getpid()):
            pid_file.unlink()
        log.info("stopped")
    return 0


if __name__ == "__main__":
    rc = main()
    # Skip the interpreter's slow teardown of moto's many modules and objects.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(rc)

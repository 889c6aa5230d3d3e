//! Resolution of an `EC2NodeClass`: which subnets, security groups, AMIs and instance profile
//! its selectors select, and the status (with conditions) that records the outcome.

use std::collections::{BTreeMap, BTreeSet};

use aws_sdk_ec2::Client as Ec2Client;
use aws_sdk_ec2::types::Filter;
use aws_sdk_iam::Client as IamClient;
use aws_sdk_ssm::Client as SsmClient;
use k8s_openapi::api::core::v1::NodeSelectorRequirement;
use k8s_openapi::jiff::Timestamp;
use sha2::{Digest, Sha256};

use super::amifamily::{self, alias_queries, arch_requirements, parse_alias};
use super::sdk_error;
use super::validation::ValidationState;
use crate::apis::ec2nodeclass::{
    AmiSelectorTerm, AmiStatus, CapacityReservationSelectorTerm, CapacityReservationStatus, EC2NodeClass,
    EC2NodeClassStatus, PlacementGroupSelector, SecurityGroupSelectorTerm, SecurityGroupStatus,
    SubnetSelectorTerm, SubnetStatus,
};
use crate::apis::labels::{LABEL_EC2NODECLASS, TAG_EKS_CLUSTER_NAME};
use crate::apis::{Condition, ConditionStatus};
use crate::cloudprovider::{CloudProviderError, Result};

/// Condition types of an EC2NodeClass.
pub mod conditions {
    /// Subnets were found.
    pub const SUBNETS_READY: &str = "SubnetsReady";
    /// Security groups were found.
    pub const SECURITY_GROUPS_READY: &str = "SecurityGroupsReady";
    /// AMIs were found.
    pub const AMIS_READY: &str = "AMIsReady";
    /// The instance profile exists.
    pub const INSTANCE_PROFILE_READY: &str = "InstanceProfileReady";
    /// The class passed validation.
    pub const VALIDATION_SUCCEEDED: &str = "ValidationSucceeded";
    /// The placement group was found (or none is asked for).
    pub const PLACEMENT_GROUP_READY: &str = "PlacementGroupReady";
    /// The capacity reservations were listed (`ReservedCapacity` gate).
    pub const CAPACITY_RESERVATIONS_READY: &str = "CapacityReservationsReady";
    /// All of the above.
    pub const READY: &str = "Ready";
}

/// A subnet with the number of free IPv4 addresses it has.
#[derive(Clone, Debug, PartialEq)]
pub struct Subnet {
    /// Subnet id.
    pub id: String,
    /// Availability zone.
    pub zone: String,
    /// Availability zone id.
    pub zone_id: Option<String>,
    /// Free IPv4 addresses.
    pub available_ips: i64,
    /// Whether instances launched into it get a public IPv4 address (`MapPublicIpOnLaunch`).
    pub public_ipv4: bool,
}

/// Orders subnets by free addresses, most first (then by id), without duplicates.
pub fn sort_subnets(mut subnets: Vec<Subnet>) -> Vec<Subnet> {
    subnets.sort_by(|a, b| b.available_ips.cmp(&a.available_ips).then(a.id.cmp(&b.id)));
    let mut seen = BTreeSet::new();
    subnets.retain(|s| seen.insert(s.id.clone()));
    subnets
}

fn tag_filters(tags: &BTreeMap<String, String>) -> Vec<Filter> {
    tags.iter()
        .map(|(k, v)| {
            if v == "*" {
                Filter::builder().name("tag-key").values(k).build()
            } else {
                Filter::builder().name(format!("tag:{k}")).values(v).build()
            }
        })
        .collect()
}

/// The subnets the terms select, most free addresses first.
pub async fn resolve_subnets(ec2: &Ec2Client, terms: &[SubnetSelectorTerm]) -> Result<Vec<Subnet>> {
    let mut found = Vec::new();
    for term in terms {
        let mut filters = Vec::new();
        if let Some(id) = &term.id {
            filters.push(Filter::builder().name("subnet-id").values(id).build());
        }
        if let Some(tags) = &term.tags {
            filters.extend(tag_filters(tags));
        }
        if filters.is_empty() {
            continue;
        }
        let out = ec2
            .describe_subnets()
            .set_filters(Some(filters))
            .send()
            .await
            .map_err(|e| sdk_error("DescribeSubnets", e))?;
        for s in out.subnets() {
            let (Some(id), Some(zone)) = (s.subnet_id(), s.availability_zone()) else { continue };
            found.push(Subnet {
                id: id.to_string(),
                zone: zone.to_string(),
                zone_id: s.availability_zone_id().map(str::to_string),
                available_ips: i64::from(s.available_ip_address_count().unwrap_or(0)),
                public_ipv4: s.map_public_ip_on_launch().unwrap_or(false),
            });
        }
    }
    Ok(sort_subnets(found))
}

/// The security groups the terms select, by id.
pub async fn resolve_security_groups(
    ec2: &Ec2Client,
    terms: &[SecurityGroupSelectorTerm],
) -> Result<Vec<SecurityGroupStatus>> {
    let mut found: BTreeMap<String, Option<String>> = BTreeMap::new();
    for term in terms {
        let mut filters = Vec::new();
        if let Some(id) = &term.id {
            filters.push(Filter::builder().name("group-id").values(id).build());
        }
        if let Some(name) = &term.name {
            filters.push(Filter::builder().name("group-name").values(name).build());
        }
        if let Some(tags) = &term.tags {
            filters.extend(tag_filters(tags));
        }
        if filters.is_empty() {
            continue;
        }
        let out = ec2
            .describe_security_groups()
            .set_filters(Some(filters))
            .send()
            .await
            .map_err(|e| sdk_error("DescribeSecurityGroups", e))?;
        for g in out.security_groups() {
            if let Some(id) = g.group_id() {
                found.insert(id.to_string(), g.group_name().map(str::to_string));
            }
        }
    }
    Ok(found.into_iter().map(|(id, name)| SecurityGroupStatus { id, name }).collect())
}

/// A resolved placement group.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlacementGroup {
    /// Its id (`pg-...`): the `karpenter.k8s.aws/placement-group-id` label of its nodes.
    pub id: String,
    /// Its name.
    pub name: String,
    /// `cluster`, `partition` or `spread`.
    pub strategy: String,
    /// Partitions of a partition group (0 otherwise).
    pub partition_count: i32,
}

impl PlacementGroup {
    /// Whether nodes are placed in numbered partitions.
    pub fn is_partitioned(&self) -> bool {
        self.strategy == "partition" && self.partition_count > 0
    }
}

/// The available placement group `selector` names (by name or id); `None` when there is none.
pub async fn resolve_placement_group(
    ec2: &Ec2Client,
    selector: &PlacementGroupSelector,
) -> Result<Option<PlacementGroup>> {
    let request = ec2
        .describe_placement_groups()
        .filters(Filter::builder().name("state").values("available").build())
        .set_group_ids(selector.id.clone().map(|id| vec![id]))
        .set_group_names(selector.id.is_none().then(|| selector.name.clone()).flatten().map(|n| vec![n]));
    let out = match request.send().await {
        Ok(out) => out,
        // EC2 answers a name or id it does not know with an error, not an empty list.
        Err(e)
            if aws_sdk_ec2::error::ProvideErrorMetadata::code(&e)
                == Some("InvalidPlacementGroup.Unknown") =>
        {
            return Ok(None);
        }
        Err(e) => return Err(sdk_error("DescribePlacementGroups", e)),
    };
    Ok(out.placement_groups().iter().find_map(|g| {
        Some(PlacementGroup {
            id: g.group_id()?.to_string(),
            name: g.group_name().unwrap_or_default().to_string(),
            strategy: g.strategy().map(|s| s.as_str().to_string()).unwrap_or_default(),
            partition_count: g.partition_count().unwrap_or(0),
        })
    }))
}

/// How long before its end a capacity block is `expiring` (upstream's figure).
pub const CAPACITY_BLOCK_EXPIRATION: std::time::Duration = std::time::Duration::from_secs(40 * 60);

/// The status entry of the capacity reservation `r` at `now`, as upstream writes it; why not
/// when EC2 describes it with a match criteria or type this version does not know.
pub fn reservation_status(
    r: &aws_sdk_ec2::types::CapacityReservation,
    now: Timestamp,
) -> std::result::Result<CapacityReservationStatus, String> {
    let id = r.capacity_reservation_id().unwrap_or_default().to_string();
    let criteria = r.instance_match_criteria().map(|c| c.as_str().to_string()).unwrap_or_default();
    if !matches!(criteria.as_str(), "open" | "targeted") {
        return Err(format!(
            "capacity reservation {id} has an unsupported instance match criteria {criteria:?}"
        ));
    }
    let reservation_type = match r.reservation_type().map(|t| t.as_str()) {
        None | Some("default") => "default",
        Some("capacity-block") => "capacity-block",
        Some(other) => return Err(format!("capacity reservation {id} has an unsupported type {other:?}")),
    };
    let end = r.end_date().and_then(|d| Timestamp::from_second(d.secs()).ok());
    let expiring = reservation_type == "capacity-block"
        && end.is_some_and(|end| {
            now >= end
                - k8s_openapi::jiff::SignedDuration::try_from(CAPACITY_BLOCK_EXPIRATION).unwrap_or_default()
        });
    Ok(CapacityReservationStatus {
        id,
        availability_zone: r.availability_zone().unwrap_or_default().to_string(),
        instance_type: r.instance_type().unwrap_or_default().to_string(),
        owner_id: r.owner_id().unwrap_or_default().to_string(),
        instance_match_criteria: Some(criteria),
        reservation_type: Some(reservation_type.to_string()),
        state: Some(if expiring { "expiring" } else { "active" }.to_string()),
        end_time: end.map(|t| t.to_string()),
        interruptible: Some(r.interruptible().unwrap_or(false)),
    })
}

/// The active capacity reservations `terms` select (each term by id, or by tags, owner and
/// instance match criteria, as upstream queries them), by id, each with the instances it has
/// available.
pub async fn resolve_capacity_reservations(
    ec2: &Ec2Client,
    terms: &[CapacityReservationSelectorTerm],
    now: Timestamp,
) -> Result<Vec<(CapacityReservationStatus, i64)>> {
    let mut found: BTreeMap<String, (CapacityReservationStatus, i64)> = BTreeMap::new();
    for term in terms {
        let active = Filter::builder().name("state").values("active").build();
        let mut requests = Vec::new();
        if let Some(id) = &term.id {
            requests.push(
                ec2.describe_capacity_reservations().filters(active.clone()).capacity_reservation_ids(id),
            );
        }
        if term.tags.as_ref().is_some_and(|t| !t.is_empty()) || term.instance_match_criteria.is_some() {
            let mut filters = vec![active.clone()];
            if let Some(owner) = &term.owner_id {
                filters.push(Filter::builder().name("owner-id").values(owner).build());
            }
            filters.extend(tag_filters(term.tags.as_ref().unwrap_or(&BTreeMap::new())));
            if let Some(criteria) = &term.instance_match_criteria {
                filters.push(Filter::builder().name("instance-match-criteria").values(criteria).build());
            }
            requests.push(ec2.describe_capacity_reservations().set_filters(Some(filters)).max_results(1000));
        }
        for request in requests {
            let mut pages = request.into_paginator().send();
            while let Some(page) = pages.next().await {
                let page = match page {
                    Ok(page) => page,
                    Err(e)
                        if aws_sdk_ec2::error::ProvideErrorMetadata::code(&e)
                            == Some("InvalidCapacityReservationId.NotFound") =>
                    {
                        break;
                    }
                    Err(e) => return Err(sdk_error("DescribeCapacityReservations", e)),
                };
                for r in page.capacity_reservations() {
                    match reservation_status(r, now) {
                        Ok(status) => {
                            let available = i64::from(r.available_instance_count().unwrap_or(0));
                            found.insert(status.id.clone(), (status, available));
                        }
                        Err(why) => {
                            tracing::error!(error = %why, "failed to parse discovered capacity reservations")
                        }
                    }
                }
            }
        }
    }
    Ok(found.into_values().collect())
}

/// An image found by DescribeImages.
#[derive(Clone, Debug, PartialEq)]
pub struct Image {
    /// AMI id.
    pub id: String,
    /// AMI name.
    pub name: Option<String>,
    /// EC2 architecture.
    pub architecture: String,
    /// Creation date (RFC 3339), used to prefer newer images.
    pub creation_date: String,
    /// Whether the image is deprecated.
    pub deprecated: bool,
}

/// Whether an image whose deprecation time is `deprecation_time` (RFC 3339) is deprecated at
/// `now`: it is from that time on. Images without one (or with one that does not parse) are not.
pub fn is_deprecated(deprecation_time: Option<&str>, now: Timestamp) -> bool {
    deprecation_time
        .and_then(|t| t.parse::<Timestamp>().ok())
        .is_some_and(|t| t.as_second() <= now.as_second())
}

async fn describe_images(
    ec2: &Ec2Client,
    ids: Vec<String>,
    owners: Vec<String>,
    filters: Vec<Filter>,
) -> Result<Vec<Image>> {
    let mut req = ec2.describe_images().include_deprecated(true);
    if !ids.is_empty() {
        req = req.set_image_ids(Some(ids));
    }
    if !owners.is_empty() {
        req = req.set_owners(Some(owners));
    }
    if !filters.is_empty() {
        req = req.set_filters(Some(filters));
    }
    let out = req.send().await.map_err(|e| sdk_error("DescribeImages", e))?;
    let now = Timestamp::now();
    Ok(out
        .images()
        .iter()
        .filter_map(|i| {
            Some(Image {
                id: i.image_id()?.to_string(),
                name: i.name().map(str::to_string),
                architecture: i.architecture().map(|a| a.as_str().to_string()).unwrap_or_default(),
                creation_date: i.creation_date().unwrap_or_default().to_string(),
                deprecated: is_deprecated(i.deprecation_time(), now),
            })
        })
        .collect())
}

/// The AMIs the terms select: for each set of requirements (architecture, GPU or accelerator
/// variant) only the image [`newest_amis`] prefers, newest first. `k8s_version` (`1.34`) picks
/// the alias's SSM parameters.
pub async fn resolve_amis(
    ec2: &Ec2Client,
    ssm: &SsmClient,
    terms: &[AmiSelectorTerm],
    k8s_version: &str,
) -> Result<Vec<AmiStatus>> {
    let mut out: Vec<(AmiStatus, String)> = Vec::new();
    for term in terms {
        if let Some(alias) = &term.alias {
            let Some((family, version)) = parse_alias(alias) else { continue };
            let mut resolved = Vec::new();
            for q in alias_queries(family, &version, k8s_version) {
                match ssm.get_parameter().name(&q.parameter).send().await {
                    Ok(p) => {
                        if let Some(id) = p.parameter().and_then(|p| p.value()) {
                            resolved.push((id.to_string(), q.requirements));
                        }
                    }
                    Err(e) if e.as_service_error().is_some_and(|s| s.is_parameter_not_found()) => {}
                    Err(e) => return Err(sdk_error("GetParameter", e)),
                }
            }
            let ids: Vec<String> =
                resolved.iter().map(|(id, _)| id.clone()).collect::<BTreeSet<_>>().into_iter().collect();
            let images =
                if ids.is_empty() { vec![] } else { describe_images(ec2, ids, vec![], vec![]).await? };
            for (id, requirements) in resolved {
                let Some(image) = images.iter().find(|i| i.id == id) else { continue };
                out.push((
                    AmiStatus {
                        id,
                        name: image.name.clone(),
                        requirements,
                        deprecated: image.deprecated.then_some(true),
                    },
                    image.creation_date.clone(),
                ));
            }
            continue;
        }
        let mut ids = Vec::new();
        let mut filters = Vec::new();
        let mut owners = Vec::new();
        if let Some(id) = &term.id {
            ids.push(id.clone());
        }
        if let Some(name) = &term.name {
            filters.push(Filter::builder().name("name").values(name).build());
        }
        if let Some(owner) = &term.owner {
            owners.push(owner.clone());
        }
        if let Some(tags) = &term.tags {
            filters.extend(tag_filters(tags));
        }
        if let Some(param) = &term.ssm_parameter {
            match ssm.get_parameter().name(param).send().await {
                Ok(p) => ids.extend(p.parameter().and_then(|p| p.value()).map(str::to_string)),
                Err(e) if e.as_service_error().is_some_and(|s| s.is_parameter_not_found()) => continue,
                Err(e) => return Err(sdk_error("GetParameter", e)),
            }
        }
        if ids.is_empty() && filters.is_empty() {
            continue;
        }
        if ids.is_empty() && owners.is_empty() && term.tags.is_none() {
            // A name alone matches images of any account; restrict it as upstream does.
            owners = vec!["self".to_string(), "amazon".to_string()];
        }
        for image in describe_images(ec2, ids, owners, filters).await? {
            // Images of other architectures (i386, Mac) boot none of the instance types.
            let Some(requirements) = arch_requirements(&image.architecture) else { continue };
            out.push((
                AmiStatus {
                    requirements,
                    id: image.id,
                    name: image.name,
                    deprecated: image.deprecated.then_some(true),
                },
                image.creation_date,
            ));
        }
    }
    Ok(newest_amis(out))
}

/// A set of requirements in a comparable form: `(key, operator, values)`.
type RequirementsKey = Vec<(String, String, Vec<String>)>;

/// The requirements as a set: each requirement with its values sorted, in a fixed order.
fn requirements_key(requirements: &[NodeSelectorRequirement]) -> RequirementsKey {
    let mut key: RequirementsKey = requirements
        .iter()
        .map(|r| {
            let mut values = r.values.clone().unwrap_or_default();
            values.sort();
            values.dedup();
            (r.key.clone(), r.operator.clone(), values)
        })
        .collect();
    key.sort();
    key.dedup();
    key
}

/// Seconds since the epoch of an RFC 3339 creation date; images without a (valid) one sort as
/// the oldest.
fn created_at(creation_date: &str) -> i64 {
    creation_date.parse::<Timestamp>().map(|t| t.as_second()).unwrap_or(i64::MIN)
}

/// Keeps, of the AMIs `(status, creation date)` the terms matched, one per distinct set of
/// requirements, as upstream Karpenter does: a non-deprecated image over a deprecated one (so a
/// deprecated image is only used when nothing else serves those requirements), then the newest
/// by creation date (to the second), then the greatest name. The result is ordered newest first,
/// ties by id.
pub fn newest_amis(amis: Vec<(AmiStatus, String)>) -> Vec<AmiStatus> {
    let rank = |ami: &AmiStatus, created: i64| {
        (!ami.deprecated.unwrap_or(false), created, ami.name.clone().unwrap_or_default())
    };
    let mut best: BTreeMap<RequirementsKey, (AmiStatus, i64)> = BTreeMap::new();
    for (ami, creation_date) in amis {
        let created = created_at(&creation_date);
        let key = requirements_key(&ami.requirements);
        match best.get(&key) {
            Some((kept, kept_created)) if rank(&ami, created) <= rank(kept, *kept_created) => {}
            _ => {
                best.insert(key, (ami, created));
            }
        }
    }
    let mut out: Vec<(AmiStatus, i64)> = best.into_values().collect();
    out.sort_by(|(a, a_created), (b, b_created)| b_created.cmp(a_created).then(a.id.cmp(&b.id)));
    out.into_iter().map(|(ami, _)| ami).collect()
}

/// The name of the instance profile Karpenter manages for a class using `role`.
pub fn instance_profile_name(cluster: &str, region: &str, class_name: &str) -> String {
    let digest = Sha256::digest(format!("{region}/{class_name}").as_bytes());
    let hex: String = digest.iter().take(8).map(|b| format!("{b:02x}")).collect();
    format!("{cluster}_{hex}")
}

/// The role name of `role`, which may be a name or an ARN (`arn:aws:iam::1:role/path/name`).
pub fn role_name(role: &str) -> &str {
    role.rsplit('/').next().unwrap_or(role)
}

/// The instance profile of the class: the given one (checked to exist), or one Karpenter
/// creates for the role (and re-points at the role if needed). `Ok(None)` when it does not exist.
pub async fn resolve_instance_profile(
    iam: &IamClient,
    class: &EC2NodeClass,
    cluster: &str,
    region: &str,
) -> Result<Option<String>> {
    if let Some(profile) = &class.spec.instance_profile {
        return match iam.get_instance_profile().instance_profile_name(profile).send().await {
            Ok(_) => Ok(Some(profile.clone())),
            Err(e) if e.as_service_error().is_some_and(|s| s.is_no_such_entity_exception()) => Ok(None),
            Err(e) => Err(sdk_error("GetInstanceProfile", e)),
        };
    }
    let Some(role) = &class.spec.role else { return Ok(None) };
    let role = role_name(role);
    let class_name = class.metadata.name.clone().unwrap_or_default();
    let name = instance_profile_name(cluster, region, &class_name);
    let existing = match iam.get_instance_profile().instance_profile_name(&name).send().await {
        Ok(out) => {
            out.instance_profile().map(|p| p.roles().iter().map(|r| r.role_name().to_string()).collect())
        }
        Err(e) if e.as_service_error().is_some_and(|s| s.is_no_such_entity_exception()) => None,
        Err(e) => return Err(sdk_error("GetInstanceProfile", e)),
    };
    let roles: Vec<String> = match existing {
        Some(roles) => roles,
        None => {
            // As upstream tags them: the class's tags, then Karpenter's (which win), which the
            // IAM policy of docs/install.md requires on the profiles the controller manages.
            let mut wanted = class.spec.tags.clone();
            wanted.insert(format!("kubernetes.io/cluster/{cluster}"), "owned".to_string());
            wanted.insert(TAG_EKS_CLUSTER_NAME.to_string(), cluster.to_string());
            wanted.insert("karpenter.sh/managed-by".to_string(), cluster.to_string());
            wanted.insert(LABEL_EC2NODECLASS.to_string(), class_name.clone());
            wanted.insert("topology.kubernetes.io/region".to_string(), region.to_string());
            let tags = wanted
                .iter()
                .map(|(k, v)| aws_sdk_iam::types::Tag::builder().key(k).value(v).build())
                .collect::<std::result::Result<Vec<_>, _>>()
                .map_err(|e| CloudProviderError::Config(format!("invalid instance profile tag: {e}")))?;
            iam.create_instance_profile()
                .instance_profile_name(&name)
                .path("/")
                .set_tags(Some(tags))
                .send()
                .await
                .map_err(|e| sdk_error("CreateInstanceProfile", e))?;
            Vec::new()
        }
    };
    if roles.iter().any(|r| r == role) {
        return Ok(Some(name));
    }
    for other in &roles {
        iam.remove_role_from_instance_profile()
            .instance_profile_name(&name)
            .role_name(other)
            .send()
            .await
            .map_err(|e| sdk_error("RemoveRoleFromInstanceProfile", e))?;
    }
    match iam.add_role_to_instance_profile().instance_profile_name(&name).role_name(role).send().await {
        Ok(_) => Ok(Some(name)),
        Err(e) if e.as_service_error().is_some_and(|s| s.is_no_such_entity_exception()) => Ok(None),
        Err(e) => Err(sdk_error("AddRoleToInstanceProfile", e)),
    }
}

fn no_such_entity<E: aws_sdk_iam::error::ProvideErrorMetadata>(e: &E) -> bool {
    e.code() == Some("NoSuchEntity")
}

/// Deletes the instance profile `name`: detaches its roles, then deletes it. Returns whether it
/// existed; a profile (or role attachment) that is already gone is not an error.
pub async fn delete_instance_profile(iam: &IamClient, name: &str) -> Result<bool> {
    let roles: Vec<String> = match iam.get_instance_profile().instance_profile_name(name).send().await {
        Ok(out) => out
            .instance_profile()
            .map(|p| p.roles().iter().map(|r| r.role_name().to_string()).collect())
            .unwrap_or_default(),
        Err(e) if e.as_service_error().is_some_and(no_such_entity) => return Ok(false),
        Err(e) => return Err(sdk_error("GetInstanceProfile", e)),
    };
    for role in &roles {
        match iam.remove_role_from_instance_profile().instance_profile_name(name).role_name(role).send().await
        {
            Ok(_) => {}
            Err(e) if e.as_service_error().is_some_and(no_such_entity) => {}
            Err(e) => return Err(sdk_error("RemoveRoleFromInstanceProfile", e)),
        }
    }
    match iam.delete_instance_profile().instance_profile_name(name).send().await {
        Ok(_) => Ok(true),
        Err(e) if e.as_service_error().is_some_and(no_such_entity) => Ok(false),
        Err(e) => Err(sdk_error("DeleteInstanceProfile", e)),
    }
}

/// What resolving a class found.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Resolution {
    /// Selected subnets, most free addresses first.
    pub subnets: Vec<Subnet>,
    /// Selected security groups.
    pub security_groups: Vec<SecurityGroupStatus>,
    /// Selected AMIs.
    pub amis: Vec<AmiStatus>,
    /// The instance profile, when it exists.
    pub instance_profile: Option<String>,
    /// The placement group of the class's `placementGroupSelector`, when it was found.
    pub placement_group: Option<PlacementGroup>,
    /// The active capacity reservations the class selects; `None` without the
    /// `ReservedCapacity` gate.
    pub capacity_reservations: Option<Vec<CapacityReservationStatus>>,
    /// Why the class's alias cannot be used on this cluster's Kubernetes version, if it cannot.
    pub unsupported_alias: Option<String>,
}

impl Resolution {
    /// Whether subnets, security groups, AMIs and the instance profile were all found.
    pub fn is_complete(&self) -> bool {
        !self.subnets.is_empty()
            && !self.security_groups.is_empty()
            && !self.amis.is_empty()
            && self.instance_profile.is_some()
    }
}

fn condition(
    type_: &str,
    ok: bool,
    reason_if_not: &str,
    message_if_not: String,
    generation: Option<i64>,
) -> Condition {
    Condition {
        type_: type_.to_string(),
        status: if ok { ConditionStatus::True } else { ConditionStatus::False },
        observed_generation: generation,
        last_transition_time: String::new(),
        reason: if ok { type_.to_string() } else { reason_if_not.to_string() },
        message: if ok { String::new() } else { message_if_not },
    }
}

fn terms_json<T: serde::Serialize>(terms: &[T]) -> String {
    serde_json::to_string(terms).unwrap_or_default()
}

/// The status a class gets from `resolution` and the state of its validation. Transition times
/// of conditions whose status did not change are kept from `previous`; new ones get `now`.
pub fn status(
    class: &EC2NodeClass,
    resolution: &Resolution,
    validation: &ValidationState,
    previous: Option<&EC2NodeClassStatus>,
    now: &str,
) -> EC2NodeClassStatus {
    use conditions::*;
    let generation = class.metadata.generation;
    let spec = &class.spec;
    let profile_message = match (&spec.instance_profile, &spec.role) {
        (Some(p), _) => format!("instance profile {p} not found"),
        (None, Some(r)) => format!("role {r} not found; the instance profile cannot use it"),
        (None, None) => "neither role nor instanceProfile is set".to_string(),
    };
    let mut conds = vec![
        condition(
            SUBNETS_READY,
            !resolution.subnets.is_empty(),
            "SubnetsNotFound",
            format!("SubnetSelector did not match any Subnets: {}", terms_json(&spec.subnet_selector_terms)),
            generation,
        ),
        condition(
            SECURITY_GROUPS_READY,
            !resolution.security_groups.is_empty(),
            "SecurityGroupsNotFound",
            format!(
                "SecurityGroupSelector did not match any SecurityGroups: {}",
                terms_json(&spec.security_group_selector_terms)
            ),
            generation,
        ),
        match &resolution.unsupported_alias {
            Some(why) => condition(AMIS_READY, false, "UnsupportedAlias", why.clone(), generation),
            None => condition(
                AMIS_READY,
                !resolution.amis.is_empty(),
                "AMINotFound",
                format!("AMISelector did not match any AMIs: {}", terms_json(&spec.ami_selector_terms)),
                generation,
            ),
        },
        condition(
            INSTANCE_PROFILE_READY,
            resolution.instance_profile.is_some(),
            "InstanceProfileNotFound",
            profile_message,
            generation,
        ),
        validation.condition(
            previous.and_then(|p| p.conditions.iter().find(|c| c.type_ == VALIDATION_SUCCEEDED)),
            generation,
        ),
        condition(
            PLACEMENT_GROUP_READY,
            spec.placement_group_selector.is_none() || resolution.placement_group.is_some(),
            "PlacementGroupNotFound",
            format!(
                "Placement group {:?} not found",
                spec.placement_group_selector
                    .as_ref()
                    .and_then(|p| p.name.as_ref().or(p.id.as_ref()))
                    .cloned()
                    .unwrap_or_default()
            ),
            generation,
        ),
    ];
    if resolution.capacity_reservations.is_some() {
        // Listing them either worked (the resolution would have failed otherwise) or was not
        // needed: True, as upstream's.
        conds.push(condition(CAPACITY_RESERVATIONS_READY, true, "", String::new(), generation));
    }
    let unhealthy: Vec<String> = conds
        .iter()
        .filter(|c| c.status != ConditionStatus::True)
        .map(|c| format!("{}={:?}", c.type_, c.status))
        .collect();
    conds.push(condition(
        READY,
        unhealthy.is_empty(),
        "UnhealthyDependents",
        unhealthy.join(", "),
        generation,
    ));
    for c in &mut conds {
        let before = previous.and_then(|p| p.conditions.iter().find(|o| o.type_ == c.type_));
        c.last_transition_time = match before {
            Some(b) if b.status == c.status => b.last_transition_time.clone(),
            _ => now.to_string(),
        };
    }
    EC2NodeClassStatus {
        subnets: resolution
            .subnets
            .iter()
            .map(|s| SubnetStatus { id: s.id.clone(), zone: s.zone.clone(), zone_id: s.zone_id.clone() })
            .collect(),
        security_groups: resolution.security_groups.clone(),
        capacity_reservations: resolution.capacity_reservations.clone().unwrap_or_default(),
        amis: resolution.amis.clone(),
        instance_profile: resolution.instance_profile.clone(),
        conditions: conds,
    }
}

/// Whether a class's status says it is ready to launch from.
pub fn is_ready(status: Option<&EC2NodeClassStatus>) -> std::result::Result<&EC2NodeClassStatus, String> {
    let Some(status) = status else { return Err("the class has not been resolved yet".to_string()) };
    match status.conditions.iter().find(|c| c.type_ == conditions::READY) {
        Some(c) if c.status == ConditionStatus::True => Ok(status),
        Some(c) => Err(format!("{}: {}", c.reason, c.message)),
        None => Err("the class has no Ready condition yet".to_string()),
    }
}

/// The family a class's AMIs boot with (re-exported for callers of this module).
pub use amifamily::family_of;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cloudprovider::aws::validation::Verdict;

    fn subnet(id: &str, zone: &str, ips: i64) -> Subnet {
        Subnet { id: id.into(), zone: zone.into(), zone_id: None, available_ips: ips, public_ipv4: false }
    }

    #[test]
    fn capacity_reservations_are_written_as_upstream_writes_them() {
        use aws_sdk_ec2::types::{CapacityReservation, CapacityReservationType, InstanceMatchCriteria};
        let now: Timestamp = "2026-11-27T12:00:00Z".parse().unwrap();
        let end =
            |at: &str| aws_smithy_types::DateTime::from_secs(at.parse::<Timestamp>().unwrap().as_second());
        let base = || {
            CapacityReservation::builder()
                .capacity_reservation_id("cr-1")
                .availability_zone("us-west-2a")
                .instance_type("p5.48xlarge")
                .owner_id("123456789012")
                .instance_match_criteria(InstanceMatchCriteria::Targeted)
        };
        let odcr = reservation_status(&base().build(), now).unwrap();
        assert_eq!(
            (
                odcr.reservation_type.as_deref(),
                odcr.state.as_deref(),
                odcr.interruptible,
                odcr.end_time.as_deref()
            ),
            (Some("default"), Some("active"), Some(false), None)
        );
        assert_eq!((odcr.instance_type.as_str(), odcr.owner_id.as_str()), ("p5.48xlarge", "123456789012"));
        let block = |ends: &str| {
            reservation_status(
                &base().reservation_type(CapacityReservationType::CapacityBlock).end_date(end(ends)).build(),
                now,
            )
            .unwrap()
        };
        // A capacity block is expiring from 40 minutes before its end.
        assert_eq!(block("2026-11-27T12:41:00Z").state.as_deref(), Some("active"));
        let expiring = block("2026-11-27T12:40:00Z");
        assert_eq!(expiring.state.as_deref(), Some("expiring"));
        assert_eq!(expiring.end_time.as_deref(), Some("2026-11-27T12:40:00Z"));
        // A criteria this version does not know is refused, not guessed.
        let odd = base().instance_match_criteria(InstanceMatchCriteria::from("some-new-criteria")).build();
        assert!(reservation_status(&odd, now).is_err());
    }

    #[test]
    fn an_alias_the_cluster_cannot_run_says_why() {
        let class: EC2NodeClass = serde_json::from_value(serde_json::json!({
            "apiVersion": "karpenter.k8s.aws/v1", "kind": "EC2NodeClass", "metadata": {"name": "win", "generation": 1},
            "spec": {"subnetSelectorTerms": [{"id": "subnet-1"}], "securityGroupSelectorTerms": [{"id": "sg-1"}],
                "amiSelectorTerms": [{"alias": "windows2025@latest"}], "role": "r"}}))
        .unwrap();
        let why = crate::cloudprovider::aws::amifamily::alias_unsupported(
            crate::apis::ec2nodeclass::AmiFamily::Windows2025,
            "1.34",
        );
        let res = Resolution { unsupported_alias: why, ..Default::default() };
        let st = status(&class, &res, &ValidationState::DependenciesNotReady, None, "t1");
        let amis = st.conditions.iter().find(|c| c.type_ == conditions::AMIS_READY).unwrap();
        assert_eq!(
            (amis.reason.as_str(), amis.message.as_str()),
            (
                "UnsupportedAlias",
                "Windows Server 2025 requires EKS version 1.35 or higher, current version: 1.34"
            )
        );
    }

    #[test]
    fn subnets_sort_by_free_addresses() {
        let got = sort_subnets(vec![
            subnet("b", "z1", 10),
            subnet("a", "z2", 10),
            subnet("c", "z1", 99),
            subnet("a", "z2", 10),
        ]);
        assert_eq!(got.iter().map(|s| s.id.as_str()).collect::<Vec<_>>(), vec!["c", "a", "b"]);
    }

    #[test]
    fn names() {
        assert_eq!(role_name("arn:aws:iam::123456789012:role/path/KarpenterNodeRole"), "KarpenterNodeRole");
        assert_eq!(role_name("KarpenterNodeRole"), "KarpenterNodeRole");
        let a = instance_profile_name("demo", "us-west-2", "default");
        assert!(a.starts_with("demo_") && a.len() == 5 + 16);
        assert_ne!(a, instance_profile_name("demo", "us-west-2", "other"));
    }

    fn image(id: &str, name: &str, arch: &str, deprecated: bool, created: &str) -> (AmiStatus, String) {
        let ami = AmiStatus {
            id: id.into(),
            name: Some(name.into()),
            requirements: arch_requirements(arch).unwrap(),
            deprecated: deprecated.then_some(true),
        };
        (ami, created.into())
    }

    fn ids(amis: &[AmiStatus]) -> Vec<&str> {
        amis.iter().map(|a| a.id.as_str()).collect()
    }

    #[test]
    fn only_the_newest_image_of_each_architecture_is_kept() {
        let got = newest_amis(vec![
            image("ami-old", "node-1", "x86_64", false, "2025-10-15T04:21:37.000Z"),
            image("ami-new", "node-2", "x86_64", false, "2025-11-01T03:47:12.000Z"),
            image("ami-arm-old", "node-1", "arm64", false, "2025-10-15T04:21:37.000Z"),
            image("ami-arm", "node-2", "arm64", false, "2025-10-20T00:00:00.000Z"),
            image("ami-new", "node-2", "x86_64", false, "2025-11-01T03:47:12.000Z"),
        ]);
        assert_eq!(ids(&got), vec!["ami-new", "ami-arm"]);
    }

    #[test]
    fn deprecated_images_only_when_nothing_else_serves_their_requirements() {
        let got = newest_amis(vec![
            image("ami-dep", "node-3", "x86_64", true, "2026-01-01T00:00:00Z"),
            image("ami-live", "node-1", "x86_64", false, "2025-01-01T00:00:00Z"),
            image("ami-arm-dep-old", "node-1", "arm64", true, "2025-01-01T00:00:00Z"),
            image("ami-arm-dep", "node-2", "arm64", true, "2025-06-01T00:00:00Z"),
        ]);
        assert_eq!(ids(&got), vec!["ami-arm-dep", "ami-live"]);
        assert_eq!(got[0].deprecated, Some(true));
    }

    #[test]
    fn same_creation_time_prefers_the_greatest_name() {
        // Dates equal to the second tie, whatever their fraction.
        let got = newest_amis(vec![
            image("ami-b", "node-b", "x86_64", false, "2025-11-01T03:47:12.000Z"),
            image("ami-c", "node-c", "x86_64", false, "2025-11-01T03:47:12.900Z"),
            image("ami-a", "node-a", "x86_64", false, "2025-11-01T03:47:12.000Z"),
        ]);
        assert_eq!(ids(&got), vec!["ami-c"]);
        // Images without a creation date lose to dated ones.
        let got = newest_amis(vec![
            image("ami-undated", "z", "x86_64", false, ""),
            image("ami-dated", "a", "x86_64", false, "2020-01-01T00:00:00Z"),
        ]);
        assert_eq!(ids(&got), vec!["ami-dated"]);
    }

    #[test]
    fn requirements_compare_as_sets() {
        let req = |key: &str, op: &str, values: &[&str]| NodeSelectorRequirement {
            key: key.into(),
            operator: op.into(),
            values: (!values.is_empty()).then(|| values.iter().map(|v| v.to_string()).collect()),
        };
        let with = |id: &str, reqs: Vec<NodeSelectorRequirement>, created: &str| {
            (AmiStatus { id: id.into(), requirements: reqs, ..Default::default() }, created.to_string())
        };
        let gpu = "karpenter.k8s.aws/instance-gpu-count";
        let got = newest_amis(vec![
            with(
                "ami-1",
                vec![req("kubernetes.io/arch", "In", &["amd64"]), req(gpu, "Exists", &[])],
                "2025-01-01T00:00:00Z",
            ),
            with(
                "ami-2",
                vec![req(gpu, "Exists", &[]), req("kubernetes.io/arch", "In", &["amd64"])],
                "2025-02-01T00:00:00Z",
            ),
            with("ami-3", vec![req("kubernetes.io/arch", "In", &["amd64"])], "2024-01-01T00:00:00Z"),
        ]);
        assert_eq!(ids(&got), vec!["ami-2", "ami-3"]);
    }

    #[test]
    fn deprecation_starts_at_the_deprecation_time() {
        let now: Timestamp = "2026-03-01T12:00:00Z".parse().unwrap();
        assert!(!is_deprecated(None, now));
        assert!(!is_deprecated(Some("2026-03-01T12:00:01.000Z"), now));
        assert!(is_deprecated(Some("2026-03-01T12:00:00.000Z"), now));
        assert!(is_deprecated(Some("2024-01-01T00:00:00Z"), now));
        assert!(!is_deprecated(Some("not a time"), now));
    }

    #[test]
    fn status_conditions() {
        let class: EC2NodeClass = serde_json::from_value(serde_json::json!({
            "apiVersion": "karpenter.k8s.aws/v1", "kind": "EC2NodeClass",
            "metadata": {"name": "default", "generation": 3},
            "spec": {
                "subnetSelectorTerms": [{"tags": {"karpenter.sh/discovery": "nope"}}],
                "securityGroupSelectorTerms": [{"id": "sg-1"}],
                "amiSelectorTerms": [{"alias": "al2023@latest"}],
                "role": "r",
            }
        }))
        .unwrap();
        let res = Resolution {
            security_groups: vec![SecurityGroupStatus { id: "sg-1".into(), name: None }],
            amis: vec![AmiStatus { id: "ami-1".into(), ..Default::default() }],
            instance_profile: Some("p".into()),
            ..Default::default()
        };
        let st = status(&class, &res, &ValidationState::DependenciesNotReady, None, "t1");
        let get =
            |s: &EC2NodeClassStatus, t: &str| s.conditions.iter().find(|c| c.type_ == t).cloned().unwrap();
        let subnets = get(&st, conditions::SUBNETS_READY);
        assert_eq!(subnets.status, ConditionStatus::False);
        assert_eq!(subnets.reason, "SubnetsNotFound");
        assert!(subnets.message.contains("karpenter.sh/discovery"), "{}", subnets.message);
        assert_eq!(subnets.observed_generation, Some(3));
        let ready = get(&st, conditions::READY);
        assert_eq!((ready.status, ready.reason.as_str()), (ConditionStatus::False, "UnhealthyDependents"));
        assert_eq!(ready.message, "SubnetsReady=False, ValidationSucceeded=False");
        let validation = get(&st, conditions::VALIDATION_SUCCEEDED);
        assert_eq!(validation.reason, "DependenciesNotReady");
        assert_eq!(
            validation.message,
            "Awaiting AMI, Instance Profile, Security Group, and Subnet resolution"
        );
        assert!(is_ready(Some(&st)).is_err());
        assert_eq!(get(&st, conditions::AMIS_READY).reason, "AMIsReady");

        let fixed = Resolution { subnets: vec![subnet("s", "z", 1)], ..res };
        let st2 = status(&class, &fixed, &ValidationState::Decided(Verdict::Succeeded), Some(&st), "t2");
        assert_eq!(get(&st2, conditions::READY).status, ConditionStatus::True);
        assert_eq!(get(&st2, conditions::READY).last_transition_time, "t2");
        assert_eq!(get(&st2, conditions::AMIS_READY).last_transition_time, "t1");
        assert!(is_ready(Some(&st2)).is_ok());
        assert_eq!(st2.subnets[0].id, "s");

        // Nothing decided: the condition keeps its last value, and its transition time.
        let st3 = status(&class, &fixed, &ValidationState::Undecided, Some(&st2), "t3");
        assert_eq!(get(&st3, conditions::VALIDATION_SUCCEEDED), get(&st2, conditions::VALIDATION_SUCCEEDED));
        let fresh = status(&class, &fixed, &ValidationState::Undecided, None, "t3");
        let unknown = get(&fresh, conditions::VALIDATION_SUCCEEDED);
        assert_eq!(
            (unknown.status, unknown.reason.as_str()),
            (ConditionStatus::Unknown, "AwaitingReconciliation")
        );
        assert!(is_ready(Some(&fresh)).is_err());
        // A failed validation makes the class not ready.
        let denied = Verdict::Failed { reason: "CreateFleetAuthCheckFailed", message: "no".into() };
        let st4 = status(&class, &fixed, &ValidationState::Decided(denied), Some(&st2), "t4");
        assert_eq!(get(&st4, conditions::READY).message, "ValidationSucceeded=False");
        assert_eq!(get(&st4, conditions::VALIDATION_SUCCEEDED).last_transition_time, "t4");
    }
}

//! EC2 instances Karpenter launched: lookup by id, by NodeClaim tag or by cluster, and
//! termination.

use std::collections::BTreeMap;

use aws_sdk_ec2::Client as Ec2Client;
use aws_sdk_ec2::types as ec2;

use super::sdk_error;
use crate::apis::labels::{CAPACITY_TYPE_ON_DEMAND, CAPACITY_TYPE_SPOT, LABEL_NODEPOOL, TENANCY_DEFAULT};
use crate::cloudprovider::{CloudProviderError, Result};
use crate::scheduling::instancetypes::Reservation;

pub use crate::apis::labels::{TAG_EKS_CLUSTER_NAME, TAG_NODECLAIM};

/// The `kubernetes.io/cluster/<name>` tag key.
pub fn cluster_tag(cluster: &str) -> String {
    format!("kubernetes.io/cluster/{cluster}")
}

/// States of instances that still exist.
const LIVE_STATES: &[&str] = &["pending", "running", "stopping", "stopped", "shutting-down"];

/// What Karpenter needs to know about an EC2 instance.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Ec2Instance {
    /// Instance id.
    pub id: String,
    /// Zone.
    pub zone: String,
    /// Instance type.
    pub instance_type: String,
    /// AMI.
    pub image_id: String,
    /// Subnet.
    pub subnet_id: String,
    /// Security group ids, sorted.
    pub security_group_ids: Vec<String>,
    /// `spot` or `on-demand`.
    pub capacity_type: String,
    /// State name.
    pub state: String,
    /// Launch time (RFC 3339).
    pub launch_time: Option<String>,
    /// Tags.
    pub tags: BTreeMap<String, String>,
    /// Tenancy (`default`, `dedicated`, `host`).
    pub tenancy: String,
    /// The placement group it is in (its id), if any.
    pub placement_group_id: Option<String>,
    /// Its partition, in a partition placement group.
    pub partition: Option<i32>,
    /// The capacity reservation it was launched into (targeted: its preference is
    /// `capacity-reservations-only`, as upstream tells reserved instances from those that landed
    /// in an open reservation), of the kind its lifecycle shows.
    pub reservation: Option<Reservation>,
}

impl Ec2Instance {
    /// Converts the SDK's description; `None` without an id.
    pub fn from_sdk(i: &ec2::Instance) -> Option<Ec2Instance> {
        let mut sgs: Vec<String> =
            i.security_groups().iter().filter_map(|g| g.group_id().map(str::to_string)).collect();
        sgs.sort();
        Some(Ec2Instance {
            id: i.instance_id()?.to_string(),
            zone: i.placement().and_then(|p| p.availability_zone()).unwrap_or_default().to_string(),
            instance_type: i.instance_type().map(|t| t.as_str().to_string()).unwrap_or_default(),
            image_id: i.image_id().unwrap_or_default().to_string(),
            subnet_id: i.subnet_id().unwrap_or_default().to_string(),
            security_group_ids: sgs,
            capacity_type: if i.instance_lifecycle() == Some(&ec2::InstanceLifecycleType::Spot) {
                CAPACITY_TYPE_SPOT.to_string()
            } else {
                CAPACITY_TYPE_ON_DEMAND.to_string()
            },
            state: i.state().and_then(|s| s.name()).map(|n| n.as_str().to_string()).unwrap_or_default(),
            launch_time: i
                .launch_time()
                .and_then(|t| t.fmt(aws_smithy_types::date_time::Format::DateTime).ok()),
            tenancy: i
                .placement()
                .and_then(|p| p.tenancy())
                .map_or(TENANCY_DEFAULT, |t| t.as_str())
                .to_string(),
            placement_group_id: i
                .placement()
                .and_then(|p| p.group_id())
                .filter(|g| !g.is_empty())
                .map(str::to_string),
            partition: i.placement().and_then(|p| p.partition_number()),
            reservation: i
                .capacity_reservation_id()
                .filter(|_| {
                    i.capacity_reservation_specification()
                        .and_then(|s| s.capacity_reservation_preference())
                        .is_some_and(|p| p.as_str() == "capacity-reservations-only")
                })
                .map(|id| super::fleet::instance_reservation(id, i.instance_lifecycle().map(|l| l.as_str()))),
            tags: i
                .tags()
                .iter()
                .filter_map(|t| Some((t.key()?.to_string(), t.value().unwrap_or_default().to_string())))
                .collect(),
        })
    }

    /// Whether the instance is gone (terminated) or going.
    pub fn is_terminated(&self) -> bool {
        self.state == "terminated" || self.state == "shutting-down"
    }

    /// The NodePool named in the instance's tags (none for a standalone NodeClaim's instance,
    /// whose tag is empty).
    pub fn node_pool(&self) -> Option<&str> {
        self.tags.get(LABEL_NODEPOOL).map(String::as_str).filter(|pool| !pool.is_empty())
    }
}

async fn describe(ec2: &Ec2Client, ids: Vec<String>, filters: Vec<ec2::Filter>) -> Result<Vec<Ec2Instance>> {
    let mut out = Vec::new();
    let mut pages = ec2
        .describe_instances()
        .set_instance_ids((!ids.is_empty()).then_some(ids))
        .set_filters((!filters.is_empty()).then_some(filters))
        .into_paginator()
        .send();
    while let Some(page) = pages.next().await {
        let page = match page {
            Ok(p) => p,
            Err(e)
                if aws_sdk_ec2::error::ProvideErrorMetadata::code(&e)
                    == Some("InvalidInstanceID.NotFound") =>
            {
                return Ok(out);
            }
            Err(e) => return Err(sdk_error("DescribeInstances", e)),
        };
        for r in page.reservations() {
            out.extend(r.instances().iter().filter_map(Ec2Instance::from_sdk));
        }
    }
    Ok(out)
}

fn filter(name: impl Into<String>, values: &[&str]) -> ec2::Filter {
    let mut f = ec2::Filter::builder().name(name);
    for v in values {
        f = f.values(*v);
    }
    f.build()
}

/// The instance `id`, or [`CloudProviderError::NotFound`] when it does not exist or has
/// terminated.
pub async fn get(ec2: &Ec2Client, id: &str) -> Result<Ec2Instance> {
    describe(ec2, vec![id.to_string()], vec![])
        .await?
        .into_iter()
        .find(|i| i.id == id && !i.is_terminated())
        .ok_or_else(|| CloudProviderError::NotFound(id.to_string()))
}

/// The instances among `ids` (terminated ones included; a missing one is simply absent), with one
/// DescribeInstances call per 200 IDs.
pub async fn get_many(ec2: &Ec2Client, ids: &[String]) -> Result<Vec<Ec2Instance>> {
    let mut out = Vec::with_capacity(ids.len());
    for chunk in ids.chunks(200) {
        let values: Vec<&str> = chunk.iter().map(String::as_str).collect();
        out.extend(describe(ec2, vec![], vec![filter("instance-id", &values)]).await?);
    }
    Ok(out)
}

/// The live instance launched for NodeClaim `name` in `cluster`, if any.
pub async fn find_by_node_claim(ec2: &Ec2Client, cluster: &str, name: &str) -> Result<Option<Ec2Instance>> {
    let filters = vec![
        filter(format!("tag:{TAG_NODECLAIM}"), &[name]),
        filter(format!("tag:{}", cluster_tag(cluster)), &["owned"]),
        filter("instance-state-name", &["pending", "running", "stopping", "stopped"]),
    ];
    let mut found = describe(ec2, vec![], filters).await?;
    found.sort_by(|a, b| a.launch_time.cmp(&b.launch_time).then(a.id.cmp(&b.id)));
    Ok(found.into_iter().next())
}

/// Every live instance Karpenter launched in `cluster`.
pub async fn list(ec2: &Ec2Client, cluster: &str) -> Result<Vec<Ec2Instance>> {
    let filters = vec![
        filter("tag-key", &[LABEL_NODEPOOL, TAG_NODECLAIM]),
        filter(format!("tag:{}", cluster_tag(cluster)), &["owned"]),
        filter("instance-state-name", LIVE_STATES),
    ];
    let mut out: Vec<Ec2Instance> =
        describe(ec2, vec![], filters).await?.into_iter().filter(|i| !i.is_terminated()).collect();
    out.sort_by(|a, b| a.id.cmp(&b.id));
    Ok(out)
}

/// Terminates `id`; [`CloudProviderError::NotFound`] when it is already gone.
pub async fn terminate(ec2: &Ec2Client, id: &str) -> Result<()> {
    get(ec2, id).await?;
    match ec2.terminate_instances().instance_ids(id).send().await {
        Ok(_) => Ok(()),
        Err(e)
            if aws_sdk_ec2::error::ProvideErrorMetadata::code(&e) == Some("InvalidInstanceID.NotFound") =>
        {
            Err(CloudProviderError::NotFound(id.to_string()))
        }
        Err(e) => Err(sdk_error("TerminateInstances", e)),
    }
}

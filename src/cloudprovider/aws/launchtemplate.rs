//! Launch templates: their content is decided purely ([`LaunchTemplate`]), named by a hash of
//! it, created in EC2 only when no template of that name exists yet, and deleted once no launch
//! used them for [`LAUNCH_TEMPLATE_TTL`].

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use aws_sdk_ec2::Client as Ec2Client;
use aws_sdk_ec2::types as ec2;
use base64::Engine;
use serde::Serialize;
use sha2::{Digest, Sha256};

use super::cache::{Clock, TtlCache};
use super::sdk_error;
use crate::apis::ec2nodeclass::{
    BlockDeviceMapping, ConnectionTracking, InterfaceType, MetadataOptions, NetworkInterface,
};
use crate::apis::labels::LABEL_EC2NODECLASS;
use crate::cloudprovider::{CloudProviderError, Result};
use crate::scheduling::instancetypes::Reservation;
use crate::scheduling::resources::parse_quantity;

/// Prefix of the names of the launch templates Karpenter manages.
pub const NAME_PREFIX: &str = "karpenter.k8s.aws";
/// Tag naming the cluster a launch template belongs to.
pub const CLUSTER_TAG: &str = "karpenter.k8s.aws/cluster";

/// The content of a launch template.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LaunchTemplate {
    /// AMI.
    pub image_id: String,
    /// Instance profile name.
    pub instance_profile: String,
    /// Security group ids, sorted.
    pub security_group_ids: Vec<String>,
    /// Block devices.
    pub block_device_mappings: Vec<BlockDeviceMapping>,
    /// IMDS options.
    pub metadata_options: MetadataOptions,
    /// Detailed monitoring.
    pub detailed_monitoring: bool,
    /// Public IPv4 address on the primary interface (subnet default when unset).
    pub associate_public_ip_address: Option<bool>,
    /// Tags of the template itself, and of the network interfaces (and spot requests) launched
    /// from it.
    pub tags: BTreeMap<String, String>,
    /// Whether it launches spot instances: their spot requests are tagged too. Part of the
    /// name's hash, so that templates made before network interfaces and spot requests were
    /// tagged are not reused (they are deleted once unused for the TTL).
    pub spot: bool,
    /// User data (plain text; encoded when the template is created).
    pub user_data: String,
    /// `dedicated` for dedicated instances; default tenancy otherwise (left out of the name's
    /// hash then, so that the templates of earlier versions are still used).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tenancy: Option<String>,
    /// IPv4 prefixes of the primary network interface (left out of the hash when unset, as are
    /// the connection tracking timeouts).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ip_prefix_count: Option<i32>,
    /// Idle connection-tracking timeouts of the primary network interface.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub connection_tracking: Option<ConnectionTracking>,
    /// The network interfaces, when not only the primary one: the node class's, or one EFA
    /// interface per network card for a claim that requests EFA (left out of the hash when
    /// none, so the templates of earlier versions are still used).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub network_interfaces: Vec<Nic>,
    /// Whether the cluster is IPv6: interfaces get a primary IPv6 address, and `ip_prefix_count`
    /// IPv6 prefixes.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub ipv6: bool,
    /// The placement group (its id) instances are launched into.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub placement_group_id: Option<String>,
    /// The partition of that group, when the NodeClaim names one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub partition: Option<i32>,
    /// `cpuOptions.nestedVirtualization` of the class (`enabled` or `disabled`), when it sets it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nested_virtualization: Option<String>,
    /// How its instances use capacity reservations, with the `ReservedCapacity` gate; without
    /// it EC2's default (open reservations), left out of the hash.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub capacity_reservation: Option<ReservationUse>,
}

/// How a launch template's instances use capacity reservations (upstream's targeted launch
/// mode, with the `ReservedCapacity` gate on).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub enum ReservationUse {
    /// On-demand and spot instances: never in a reservation (not even an open one), so that
    /// reserved capacity is only used by the NodeClaims that plan for it.
    None,
    /// Only in the reservation `id`; a capacity block and an interruptible reservation launch
    /// with their own market types.
    Target {
        /// The reservation's id.
        id: String,
        /// The market type of its launches (see [`super::fleet::reserved_market_type`]).
        #[serde(skip_serializing_if = "Option::is_none")]
        market_type: Option<&'static str>,
    },
}

/// A network interface of a launch template.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Nic {
    /// Its network card.
    pub network_card_index: i32,
    /// Its device index on the card.
    pub device_index: i32,
    /// `interface`, `efa` or `efa-only`.
    pub interface_type: &'static str,
}

impl Nic {
    /// The interfaces of a class that configures `configured`, or, when it configures none,
    /// those of `efa_count` EFA interfaces (one per network card, the first the primary), as
    /// upstream's templates have them. Empty: the primary interface only.
    pub fn resolve(configured: &[NetworkInterface], efa_count: i64) -> Vec<Nic> {
        if !configured.is_empty() {
            return configured
                .iter()
                .map(|n| Nic {
                    network_card_index: n.network_card_index,
                    device_index: n.device_index,
                    interface_type: n.interface_type.as_str(),
                })
                .collect();
        }
        (0..i32::try_from(efa_count).unwrap_or(0))
            .map(|card| Nic {
                network_card_index: card,
                device_index: i32::from(card != 0),
                interface_type: EFA,
            })
            .collect()
    }

    /// Whether it is an EFA device without IP networking (no addresses, no public IP, no
    /// connection tracking).
    pub fn efa_only(&self) -> bool {
        self.interface_type == InterfaceType::EfaOnly.as_str()
    }
}

/// EC2's interface type of an EFA interface with IP networking.
const EFA: &str = "efa";

impl LaunchTemplate {
    /// This template as it uses capacity reservations: with the `ReservedCapacity` gate
    /// (`gate`), only in `reservation` when given, else never in one (upstream's targeted launch
    /// mode); without it, EC2's default.
    pub fn in_reservation(self, gate: bool, reservation: Option<&Reservation>) -> Self {
        let capacity_reservation = gate.then(|| match reservation {
            Some(r) => ReservationUse::Target {
                id: r.id.clone(),
                market_type: super::fleet::reserved_market_type(r),
            },
            None => ReservationUse::None,
        });
        LaunchTemplate { capacity_reservation, ..self }
    }

    /// The template's name: the prefix and a hash of the content, so that equal content shares
    /// one template and changed content gets a new one.
    pub fn name(&self) -> String {
        let json = serde_json::to_vec(self).unwrap_or_default();
        let digest = Sha256::digest(&json);
        let hex: String = digest.iter().take(10).map(|b| format!("{b:02x}")).collect();
        format!("{NAME_PREFIX}/{hex}")
    }

    /// The CreateLaunchTemplate data.
    pub fn request_data(&self) -> Result<ec2::RequestLaunchTemplateData> {
        let mut data = ec2::RequestLaunchTemplateData::builder()
            .image_id(&self.image_id)
            .iam_instance_profile(
                ec2::LaunchTemplateIamInstanceProfileSpecificationRequest::builder()
                    .name(&self.instance_profile)
                    .build(),
            )
            .monitoring(
                ec2::LaunchTemplatesMonitoringRequest::builder().enabled(self.detailed_monitoring).build(),
            )
            .metadata_options(
                ec2::LaunchTemplateInstanceMetadataOptionsRequest::builder()
                    .http_endpoint(ec2::LaunchTemplateInstanceMetadataEndpointState::from(
                        self.metadata_options.http_endpoint.as_str(),
                    ))
                    .http_protocol_ipv6(ec2::LaunchTemplateInstanceMetadataProtocolIpv6::from(
                        self.metadata_options.http_protocol_ipv6.as_str(),
                    ))
                    .http_put_response_hop_limit(
                        i32::try_from(self.metadata_options.http_put_response_hop_limit).unwrap_or(1),
                    )
                    .http_tokens(ec2::LaunchTemplateHttpTokensState::from(
                        self.metadata_options.http_tokens.as_str(),
                    ))
                    .build(),
            )
            .user_data(base64::engine::general_purpose::STANDARD.encode(&self.user_data));
        // What a launch creates besides the instance and its volumes (tagged by CreateFleet) gets
        // the template's tags, as upstream's templates give them: IAM policies that require the
        // cluster's tags on every resource a launch creates (docs/install.md) then allow it.
        let mut tagged = Vec::new();
        if !self.tags.is_empty() {
            tagged.push(ec2::ResourceType::NetworkInterface);
            if self.spot {
                tagged.push(ec2::ResourceType::SpotInstancesRequest);
            }
        }
        for resource in tagged {
            data = data.tag_specifications(
                ec2::LaunchTemplateTagSpecificationRequest::builder()
                    .resource_type(resource)
                    .set_tags(Some(ec2_tags(&self.tags)))
                    .build(),
            );
        }
        let tracking = self.connection_tracking.as_ref().map(|c| {
            ec2::ConnectionTrackingSpecificationRequest::builder()
                .set_tcp_established_timeout(c.tcp_established_timeout)
                .set_udp_stream_timeout(c.udp_stream_timeout)
                .set_udp_timeout(c.udp_timeout)
                .build()
        });
        // An interface with IP networking gets the public IP setting, the prefixes (IPv6 ones
        // and a primary IPv6 address in an IPv6 cluster) and the connection tracking; an
        // EFA-only one none of them. Each carries the security groups, as EC2 wants.
        let interface = |networked: bool| {
            let on = |networked_value: bool| networked && networked_value;
            ec2::LaunchTemplateInstanceNetworkInterfaceSpecificationRequest::builder()
                .set_associate_public_ip_address(self.associate_public_ip_address.filter(|_| networked))
                .set_ipv4_prefix_count(self.ip_prefix_count.filter(|_| on(!self.ipv6)))
                .set_ipv6_prefix_count(self.ip_prefix_count.filter(|_| on(self.ipv6)))
                .set_primary_ipv6(on(self.ipv6).then_some(true))
                .set_ipv6_address_count(on(self.ipv6).then_some(1))
                .set_connection_tracking_specification(tracking.clone().filter(|_| networked))
                .set_groups(Some(self.security_group_ids.clone()))
        };
        // Interfaces are spelled out one by one; without any, the primary interface is spelled
        // out when something of it is set, as upstream's templates do.
        if !self.network_interfaces.is_empty() {
            for nic in &self.network_interfaces {
                data = data.network_interfaces(
                    interface(!nic.efa_only())
                        .network_card_index(nic.network_card_index)
                        .device_index(nic.device_index)
                        .interface_type(nic.interface_type)
                        .build(),
                );
            }
        } else if self.ipv6
            || self.associate_public_ip_address.is_some()
            || self.ip_prefix_count.is_some()
            || self.connection_tracking.is_some()
        {
            data = data.network_interfaces(interface(true).device_index(0).build());
        } else {
            data = data.set_security_group_ids(Some(self.security_group_ids.clone()));
        }
        for m in &self.block_device_mappings {
            data = data.block_device_mappings(block_device(m)?);
        }
        match &self.capacity_reservation {
            None => {}
            Some(ReservationUse::None) => {
                data = data.capacity_reservation_specification(
                    ec2::LaunchTemplateCapacityReservationSpecificationRequest::builder()
                        .capacity_reservation_preference(ec2::CapacityReservationPreference::None)
                        .build(),
                );
            }
            Some(ReservationUse::Target { id, market_type }) => {
                data = data.capacity_reservation_specification(
                    ec2::LaunchTemplateCapacityReservationSpecificationRequest::builder()
                        .capacity_reservation_preference(ec2::CapacityReservationPreference::from(
                            "capacity-reservations-only",
                        ))
                        .capacity_reservation_target(
                            ec2::CapacityReservationTarget::builder().capacity_reservation_id(id).build(),
                        )
                        .build(),
                );
                if let Some(market_type) = market_type {
                    data = data.instance_market_options(
                        ec2::LaunchTemplateInstanceMarketOptionsRequest::builder()
                            .market_type(ec2::MarketType::from(*market_type))
                            .build(),
                    );
                }
            }
        }
        if let Some(nested) = &self.nested_virtualization {
            data = data.cpu_options(
                ec2::LaunchTemplateCpuOptionsRequest::builder()
                    .nested_virtualization(ec2::NestedVirtualizationSpecification::from(nested.as_str()))
                    .build(),
            );
        }
        if self.tenancy.is_some() || self.placement_group_id.is_some() {
            data = data.placement(
                ec2::LaunchTemplatePlacementRequest::builder()
                    .set_tenancy(self.tenancy.as_deref().map(ec2::Tenancy::from))
                    .set_group_id(self.placement_group_id.clone())
                    .set_partition_number(self.partition)
                    .build(),
            );
        }
        Ok(data.build())
    }
}

/// Size in GiB (rounded up) of a volume size such as `20Gi` or `100G`.
pub fn volume_size_gib(size: &str) -> Option<i32> {
    let bytes = parse_quantity(size, 1)?;
    i32::try_from((bytes + (1 << 30) - 1) >> 30).ok()
}

fn block_device(m: &BlockDeviceMapping) -> Result<ec2::LaunchTemplateBlockDeviceMappingRequest> {
    let mut b =
        ec2::LaunchTemplateBlockDeviceMappingRequest::builder().set_device_name(m.device_name.clone());
    if let Some(e) = &m.ebs {
        let size = match &e.volume_size {
            Some(s) => Some(
                volume_size_gib(s)
                    .ok_or_else(|| CloudProviderError::Config(format!("invalid volume size {s:?}")))?,
            ),
            None => None,
        };
        let volume_type = e.volume_type.map(|t| {
            let name =
                serde_json::to_value(t).ok().and_then(|v| v.as_str().map(str::to_string)).unwrap_or_default();
            ec2::VolumeType::from(name.as_str())
        });
        b = b.ebs(
            ec2::LaunchTemplateEbsBlockDeviceRequest::builder()
                .set_delete_on_termination(Some(e.delete_on_termination.unwrap_or(true)))
                .set_encrypted(e.encrypted)
                .set_iops(e.iops.and_then(|v| i32::try_from(v).ok()))
                .set_kms_key_id(e.kms_key_id.clone())
                .set_snapshot_id(e.snapshot_id.clone())
                .set_throughput(e.throughput.and_then(|v| i32::try_from(v).ok()))
                .set_volume_initialization_rate(e.volume_initialization_rate)
                .set_volume_size(size)
                .set_volume_type(volume_type)
                .build(),
        );
    }
    Ok(b.build())
}

pub(crate) fn ec2_tags(tags: &BTreeMap<String, String>) -> Vec<ec2::Tag> {
    tags.iter().map(|(k, v)| ec2::Tag::builder().key(k).value(v).build()).collect()
}

fn is_not_found<E: aws_sdk_ec2::error::ProvideErrorMetadata>(e: &E) -> bool {
    e.code().is_some_and(|c| c.contains("NotFound"))
}

/// The names of the launch templates tagged `tags` (all of them).
async fn names_tagged(ec2: &Ec2Client, tags: &[(&str, &str)]) -> Result<Vec<String>> {
    Ok(templates_tagged(ec2, tags).await?.into_iter().map(|(_, name)| name).collect())
}

/// The IDs and names of the launch templates tagged `tags` (all of them).
async fn templates_tagged(ec2: &Ec2Client, tags: &[(&str, &str)]) -> Result<Vec<(String, String)>> {
    let mut names = Vec::new();
    let mut token: Option<String> = None;
    loop {
        let filters =
            tags.iter().map(|(k, v)| ec2::Filter::builder().name(format!("tag:{k}")).values(*v).build());
        let out = ec2
            .describe_launch_templates()
            .set_filters(Some(filters.collect()))
            .set_next_token(token.take())
            .send()
            .await
            .map_err(|e| sdk_error("DescribeLaunchTemplates", e))?;
        names.extend(out.launch_templates().iter().filter_map(|t| {
            Some((t.launch_template_id()?.to_string(), t.launch_template_name()?.to_string()))
        }));
        match out.next_token() {
            Some(next) if !next.is_empty() => token = Some(next.to_string()),
            _ => break,
        }
    }
    Ok(names)
}

/// Deletes the launch template `name`; `Ok(false)` when it was already gone.
async fn delete(ec2: &Ec2Client, name: &str) -> Result<bool> {
    answer(ec2.delete_launch_template().launch_template_name(name).send().await)
}

/// Deletes the launch template with ID `id`; `Ok(false)` when it was already gone.
async fn delete_id(ec2: &Ec2Client, id: &str) -> Result<bool> {
    answer(ec2.delete_launch_template().launch_template_id(id).send().await)
}

fn answer<T, R>(
    out: std::result::Result<
        T,
        aws_sdk_ec2::error::SdkError<
            aws_sdk_ec2::operation::delete_launch_template::DeleteLaunchTemplateError,
            R,
        >,
    >,
) -> Result<bool>
where
    R: std::fmt::Debug + Send + Sync + 'static,
{
    match out {
        Ok(_) => Ok(true),
        Err(e) if e.as_service_error().is_some_and(is_not_found) => Ok(false),
        Err(e) => Err(sdk_error("DeleteLaunchTemplate", e)),
    }
}

/// Listings [`delete_for_class`] makes at most.
const MAX_DELETE_ROUNDS: usize = 100;

/// Deletes the launch templates Karpenter created for the class `class` of `cluster` (found by
/// their cluster and class tags) and returns their names. Templates that are already gone are
/// skipped.
pub async fn delete_for_class(ec2: &Ec2Client, cluster: &str, class: &str) -> Result<Vec<String>> {
    let mut deleted = Vec::new();
    // Listed again until none is left: a listing cut short without a continuation token (as
    // the AWS emulator answers past 15 templates) still ends with every template gone.
    for _ in 0..MAX_DELETE_ROUNDS {
        let found = templates_tagged(ec2, &[(CLUSTER_TAG, cluster), (LABEL_EC2NODECLASS, class)]).await?;
        let mut progress = false;
        // By ID: each template found is the one deleted, even if another had the same name.
        for (id, name) in found {
            if delete_id(ec2, &id).await? {
                deleted.push(name);
                progress = true;
            }
        }
        if !progress {
            break;
        }
    }
    Ok(deleted)
}

/// How long a launch template may go unused before Karpenter deletes it.
pub const LAUNCH_TEMPLATE_TTL: Duration = Duration::from_secs(3600);

/// Creates launch templates on demand, remembers which exist, and deletes those that went
/// unused for [`LAUNCH_TEMPLATE_TTL`] (see [`LaunchTemplates::delete_expired`]).
#[derive(Debug)]
pub struct LaunchTemplates {
    ec2: Ec2Client,
    cluster: String,
    /// The templates known to exist; an entry's life restarts whenever a launch uses it.
    known: TtlCache<String, ()>,
    /// Held for reading while a template is ensured and for writing while expired ones are
    /// deleted, so that no launch is handed a template that is being deleted.
    deleting: tokio::sync::RwLock<()>,
    /// Whether the templates an earlier run created have been taken in.
    hydrated: AtomicBool,
    /// Held while a template missing from the cache is looked up and created, so that launches
    /// of the same content create it once.
    creating: tokio::sync::Mutex<()>,
}

impl LaunchTemplates {
    /// The launch templates of `cluster`, whose use `clock` times.
    pub fn new(ec2: Ec2Client, cluster: impl Into<String>, clock: Arc<dyn Clock>) -> Self {
        LaunchTemplates {
            ec2,
            cluster: cluster.into(),
            known: TtlCache::new(LAUNCH_TEMPLATE_TTL, clock),
            deleting: tokio::sync::RwLock::new(()),
            hydrated: AtomicBool::new(false),
            creating: tokio::sync::Mutex::new(()),
        }
    }

    /// Makes sure the template exists and returns its name. Using a template keeps it from
    /// being deleted for another [`LAUNCH_TEMPLATE_TTL`].
    pub async fn ensure(&self, lt: &LaunchTemplate) -> Result<String> {
        let _using = self.deleting.read().await;
        let name = lt.name();
        if self.known.refresh(&name) {
            return Ok(name);
        }
        let _creating = self.creating.lock().await;
        if self.known.refresh(&name) {
            return Ok(name);
        }
        match self.ec2.describe_launch_templates().launch_template_names(&name).send().await {
            Ok(out) if !out.launch_templates().is_empty() => {
                self.known.insert(name.clone(), ());
                return Ok(name);
            }
            Ok(_) => {}
            Err(e)
                if e.as_service_error()
                    .and_then(|s| aws_sdk_ec2::error::ProvideErrorMetadata::code(s))
                    .is_some_and(|c| c.contains("NotFound")) => {}
            Err(e) => return Err(sdk_error("DescribeLaunchTemplates", e)),
        }
        let created = self
            .ec2
            .create_launch_template()
            .launch_template_name(&name)
            .launch_template_data(lt.request_data()?)
            .tag_specifications(
                ec2::TagSpecification::builder()
                    .resource_type(ec2::ResourceType::LaunchTemplate)
                    .set_tags(Some(ec2_tags(&lt.tags)))
                    .build(),
            )
            .send()
            .await;
        match created {
            Ok(_) => {}
            Err(e)
                if e.as_service_error()
                    .and_then(|s| aws_sdk_ec2::error::ProvideErrorMetadata::code(s))
                    .is_some_and(|c| c.contains("AlreadyExists")) => {}
            Err(e) => return Err(sdk_error("CreateLaunchTemplate", e)),
        }
        self.known.insert(name.clone(), ());
        Ok(name)
    }

    /// Forgets that `name` exists (after EC2 said it does not).
    pub fn invalidate(&self, name: &str) {
        self.known.remove(&name.to_string());
    }

    /// Deletes the templates no launch used for [`LAUNCH_TEMPLATE_TTL`] and returns their names;
    /// call it periodically. The first call also takes in the templates of the cluster that an
    /// earlier run created (found by their cluster tag), which are then deleted once they went
    /// unused for the TTL from that call on. A template whose deletion fails is kept and tried
    /// again by the next call; the first such failure is returned after the others were tried.
    pub async fn delete_expired(&self) -> Result<Vec<String>> {
        let _deleting = self.deleting.write().await;
        if !self.hydrated.load(Ordering::Acquire) {
            let names = names_tagged(&self.ec2, &[(CLUSTER_TAG, &self.cluster)]).await?;
            for name in names {
                self.known.insert(name, ());
            }
            self.hydrated.store(true, Ordering::Release);
        }
        let mut deleted = Vec::new();
        let mut failed = None;
        for name in self.known.expired_keys() {
            match delete(&self.ec2, &name).await {
                Ok(existed) => {
                    self.known.remove(&name);
                    if existed {
                        tracing::info!(launch_template = %name, "deleted an unused launch template");
                        deleted.push(name);
                    }
                }
                Err(e) => {
                    tracing::warn!(launch_template = %name, error = %e, "failed to delete an unused launch template");
                    failed.get_or_insert(e);
                }
            }
        }
        match failed {
            Some(e) => Err(e),
            None => Ok(deleted),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apis::ec2nodeclass::BlockDevice;

    pub(crate) fn template() -> LaunchTemplate {
        LaunchTemplate {
            image_id: "ami-1".into(),
            instance_profile: "profile".into(),
            security_group_ids: vec!["sg-1".into()],
            block_device_mappings: vec![BlockDeviceMapping {
                device_name: Some("/dev/xvda".into()),
                ebs: Some(BlockDevice { volume_size: Some("20Gi".into()), ..Default::default() }),
                root_volume: Some(true),
            }],
            metadata_options: MetadataOptions::default(),
            detailed_monitoring: false,
            associate_public_ip_address: None,
            tags: BTreeMap::new(),
            spot: false,
            user_data: "#!/bin/sh".into(),
            tenancy: None,
            ip_prefix_count: None,
            connection_tracking: None,
            network_interfaces: Vec::new(),
            placement_group_id: None,
            partition: None,
            ipv6: false,
            nested_virtualization: None,
            capacity_reservation: None,
        }
    }

    #[test]
    fn names_hash_the_content() {
        let a = template();
        assert!(a.name().starts_with("karpenter.k8s.aws/"));
        assert_eq!(a.name(), template().name());
        for changed in [
            LaunchTemplate { image_id: "ami-2".into(), ..template() },
            LaunchTemplate { user_data: "x".into(), ..template() },
            LaunchTemplate { security_group_ids: vec!["sg-2".into()], ..template() },
            LaunchTemplate { detailed_monitoring: true, ..template() },
            LaunchTemplate { tenancy: Some("dedicated".into()), ..template() },
            LaunchTemplate {
                metadata_options: MetadataOptions { http_tokens: "optional".into(), ..Default::default() },
                ..template()
            },
        ] {
            assert_ne!(changed.name(), a.name());
        }
        // Default tenancy is not part of the hash: templates made before tenancy keep their name.
        assert!(serde_json::to_value(&a).unwrap().get("tenancy").is_none());
    }

    #[test]
    fn volume_sizes() {
        assert_eq!(volume_size_gib("20Gi"), Some(20));
        assert_eq!(volume_size_gib("100G"), Some(94));
        assert_eq!(volume_size_gib("1Ti"), Some(1024));
        assert_eq!(volume_size_gib("x"), None);
    }

    #[test]
    fn capacity_reservations_as_upstream_targets_them() {
        let plain = template().request_data().unwrap();
        assert!(plain.capacity_reservation_specification().is_none(), "without the gate: EC2's default");
        assert_eq!(template().in_reservation(false, None).name(), template().name());
        let none = template().in_reservation(true, None);
        assert_ne!(none.name(), template().name());
        let spec = none.request_data().unwrap();
        let spec = spec.capacity_reservation_specification().unwrap();
        assert_eq!(spec.capacity_reservation_preference().map(|p| p.as_str()), Some("none"));
        assert!(spec.capacity_reservation_target().is_none());
        let odcr = Reservation {
            id: "cr-1".into(),
            reservation_type: "default".into(),
            interruptible: false,
            capacity: 1,
        };
        let block =
            Reservation { id: "cr-2".into(), reservation_type: "capacity-block".into(), ..odcr.clone() };
        let interruptible = Reservation { id: "cr-3".into(), interruptible: true, ..odcr.clone() };
        for (r, market) in [
            (&odcr, None),
            (&block, Some("capacity-block")),
            (&interruptible, Some("interruptible-capacity-reservation")),
        ] {
            let data = template().in_reservation(true, Some(r)).request_data().unwrap();
            let spec = data.capacity_reservation_specification().unwrap();
            assert_eq!(
                spec.capacity_reservation_preference().map(|p| p.as_str()),
                Some("capacity-reservations-only")
            );
            assert_eq!(
                spec.capacity_reservation_target().and_then(|t| t.capacity_reservation_id()),
                Some(r.id.as_str())
            );
            assert_eq!(
                data.instance_market_options().and_then(|m| m.market_type()).map(|m| m.as_str()),
                market
            );
        }
        assert_ne!(
            template().in_reservation(true, Some(&odcr)).name(),
            template().in_reservation(true, Some(&block)).name()
        );
    }

    #[test]
    fn request_data() {
        let data = template().request_data().unwrap();
        assert_eq!(data.image_id(), Some("ami-1"));
        assert_eq!(data.security_group_ids(), ["sg-1".to_string()]);
        assert_eq!(data.block_device_mappings()[0].ebs().and_then(|e| e.volume_size()), Some(20));
        assert_eq!(
            data.metadata_options().and_then(|m| m.http_tokens()).map(|t| t.as_str()),
            Some("required")
        );
        let public =
            LaunchTemplate { associate_public_ip_address: Some(false), ..template() }.request_data().unwrap();
        assert!(public.security_group_ids().is_empty());
        assert_eq!(public.network_interfaces()[0].groups(), ["sg-1".to_string()]);
        assert!(data.placement().is_none(), "default tenancy");
        assert!(data.network_interfaces().is_empty(), "nothing of the primary interface is set");
        let networking = LaunchTemplate {
            ip_prefix_count: Some(2),
            connection_tracking: Some(ConnectionTracking {
                tcp_established_timeout: Some(3600),
                udp_stream_timeout: None,
                udp_timeout: Some(45),
            }),
            ..template()
        };
        assert_ne!(networking.name(), template().name());
        let data = networking.request_data().unwrap();
        assert!(data.security_group_ids().is_empty());
        let nic = &data.network_interfaces()[0];
        assert_eq!(
            (nic.device_index(), nic.ipv4_prefix_count(), nic.groups()),
            (Some(0), Some(2), &["sg-1".to_string()][..])
        );
        assert_eq!(nic.associate_public_ip_address(), None);
        let tracking = nic.connection_tracking_specification().unwrap();
        assert_eq!(
            (tracking.tcp_established_timeout(), tracking.udp_stream_timeout(), tracking.udp_timeout()),
            (Some(3600), None, Some(45))
        );
        let mut restored = template();
        restored.block_device_mappings[0].ebs.as_mut().unwrap().snapshot_id = Some("snap-1".into());
        restored.block_device_mappings[0].ebs.as_mut().unwrap().volume_initialization_rate = Some(200);
        let data = restored.request_data().unwrap();
        assert_eq!(
            data.block_device_mappings()[0].ebs().and_then(|e| e.volume_initialization_rate()),
            Some(200)
        );
        let dedicated =
            LaunchTemplate { tenancy: Some("dedicated".into()), ..template() }.request_data().unwrap();
        assert_eq!(dedicated.placement().and_then(|p| p.tenancy()), Some(&ec2::Tenancy::Dedicated));
        assert!(data.cpu_options().is_none(), "nested virtualization left to EC2 unless the class sets it");
        let nested = LaunchTemplate { nested_virtualization: Some("enabled".into()), ..template() };
        assert_ne!(nested.name(), template().name());
        assert_eq!(
            nested.request_data().unwrap().cpu_options().and_then(|c| c.nested_virtualization()),
            Some(&ec2::NestedVirtualizationSpecification::Enabled)
        );
    }

    #[test]
    fn configured_and_efa_interfaces_are_spelled_out_as_upstreams() {
        let nic = |card: i32, device: i32, kind: InterfaceType| NetworkInterface {
            network_card_index: card,
            device_index: device,
            interface_type: kind,
        };
        let configured = [nic(0, 0, InterfaceType::Interface), nic(1, 0, InterfaceType::EfaOnly)];
        // Configured interfaces win over an EFA request.
        assert_eq!(Nic::resolve(&configured, 4).len(), 2);
        let efa = Nic::resolve(&[], 3);
        let shape: Vec<(i32, i32, &str)> =
            efa.iter().map(|n| (n.network_card_index, n.device_index, n.interface_type)).collect();
        assert_eq!(shape, [(0, 0, "efa"), (1, 1, "efa"), (2, 1, "efa")], "the first card's is the primary");
        assert!(Nic::resolve(&[], 0).is_empty());

        let lt = LaunchTemplate {
            network_interfaces: Nic::resolve(&configured, 0),
            associate_public_ip_address: Some(true),
            ip_prefix_count: Some(2),
            connection_tracking: Some(ConnectionTracking { udp_timeout: Some(45), ..Default::default() }),
            ..template()
        };
        assert_ne!(lt.name(), template().name());
        let data = lt.request_data().unwrap();
        assert!(data.security_group_ids().is_empty(), "the groups go with each interface");
        let nics = data.network_interfaces();
        assert_eq!(nics.len(), 2);
        let (primary, efa_only) = (&nics[0], &nics[1]);
        assert_eq!(
            (primary.network_card_index(), primary.device_index(), primary.interface_type()),
            (Some(0), Some(0), Some("interface"))
        );
        assert_eq!(
            (primary.associate_public_ip_address(), primary.ipv4_prefix_count()),
            (Some(true), Some(2))
        );
        assert!(primary.connection_tracking_specification().is_some());
        assert_eq!(
            (efa_only.network_card_index(), efa_only.interface_type(), efa_only.groups()),
            (Some(1), Some("efa-only"), &["sg-1".to_string()][..])
        );
        assert_eq!(
            (efa_only.associate_public_ip_address(), efa_only.ipv4_prefix_count()),
            (None, None),
            "an EFA-only interface has no IP networking"
        );
        assert!(efa_only.connection_tracking_specification().is_none());
        // Without interfaces, the template's name is as before they existed.
        assert!(!serde_json::to_string(&template()).unwrap().contains("network_interfaces"));
    }

    #[test]
    fn an_ipv6_cluster_gets_ipv6_addresses_and_prefixes() {
        let v6 = LaunchTemplate { ipv6: true, ip_prefix_count: Some(1), ..template() };
        assert_ne!(v6.name(), template().name());
        let data = v6.request_data().unwrap();
        let nic = &data.network_interfaces()[0];
        assert_eq!(
            (nic.device_index(), nic.primary_ipv6(), nic.ipv6_address_count(), nic.ipv6_prefix_count()),
            (Some(0), Some(true), Some(1), Some(1))
        );
        assert_eq!(nic.ipv4_prefix_count(), None);
        // Even with nothing else set, the primary interface is spelled out.
        let data = LaunchTemplate { ipv6: true, ..template() }.request_data().unwrap();
        assert_eq!(data.network_interfaces()[0].primary_ipv6(), Some(true));
        // An EFA-only interface has none of it.
        let configured = LaunchTemplate {
            ipv6: true,
            network_interfaces: vec![Nic {
                network_card_index: 1,
                device_index: 0,
                interface_type: "efa-only",
            }],
            ..template()
        };
        let data = configured.request_data().unwrap();
        let efa = &data.network_interfaces()[0];
        assert_eq!((efa.primary_ipv6(), efa.ipv6_address_count()), (None, None));
    }

    #[test]
    fn a_placement_group_and_partition_go_on_the_placement() {
        let placed =
            LaunchTemplate { placement_group_id: Some("pg-0abc".into()), partition: Some(2), ..template() };
        assert_ne!(placed.name(), template().name());
        let data = placed.request_data().unwrap();
        let placement = data.placement().unwrap();
        assert_eq!(
            (placement.group_id(), placement.partition_number(), placement.tenancy()),
            (Some("pg-0abc"), Some(2), None)
        );
        let dedicated = LaunchTemplate { tenancy: Some("dedicated".into()), ..template() };
        let placement = dedicated.request_data().unwrap().placement().cloned().unwrap();
        assert_eq!((placement.group_id(), placement.tenancy()), (None, Some(&ec2::Tenancy::Dedicated)));
    }

    #[test]
    fn launched_network_interfaces_and_spot_requests_get_the_tags() {
        let tags = BTreeMap::from([("kubernetes.io/cluster/demo".to_string(), "owned".to_string())]);
        let types = |lt: LaunchTemplate| -> Vec<String> {
            let data = lt.request_data().unwrap();
            for spec in data.tag_specifications() {
                assert_eq!(spec.tags().len(), 1);
                assert_eq!(spec.tags()[0].key(), Some("kubernetes.io/cluster/demo"));
            }
            data.tag_specifications()
                .iter()
                .filter_map(|s| s.resource_type().map(|t| t.as_str().to_string()))
                .collect()
        };
        assert_eq!(types(LaunchTemplate { tags: tags.clone(), ..template() }), ["network-interface"]);
        assert_eq!(
            types(LaunchTemplate { tags, spot: true, ..template() }),
            ["network-interface", "spot-instances-request"]
        );
        // Spot templates have names of their own.
        assert_ne!(LaunchTemplate { spot: true, ..template() }.name(), template().name());
    }
}

//! Launching a NodeClaim, in the stages of upstream's instance provider (`Create`): the node
//! class and the instance types and offerings the claim may launch on, their launch templates,
//! the CreateFleet request and its errors, and the instance it launched.

use std::collections::BTreeMap;
use std::sync::Arc;

use aws_sdk_ec2::operation::create_fleet::CreateFleetOutput;
use aws_sdk_ec2::operation::create_fleet::builders::CreateFleetFluentBuilder;
use aws_sdk_ec2::types as ec2;

use super::fleet::{self, FleetError, Override};
use super::instance::{self, TAG_EKS_CLUSTER_NAME, TAG_NODECLAIM, cluster_tag};
use super::launchtemplate::{CLUSTER_TAG, LaunchTemplate, Nic, ec2_tags};
use super::provider::AwsCloudProvider;
use super::unavailable::Scope;
use super::userdata::{self, Bootstrap};
use super::{amifamily, sdk_error};
use crate::apis::ec2nodeclass::{EC2NodeClass, EC2NodeClassStatus, InstanceStorePolicy};
use crate::apis::labels::{
    CAPACITY_TYPE_ON_DEMAND, CAPACITY_TYPE_RESERVED, CAPACITY_TYPE_SPOT, LABEL_CAPACITY_TYPE,
    LABEL_EC2NODECLASS, LABEL_INSTANCE_TENANCY, LABEL_NODEPOOL, LABEL_PLACEMENT_GROUP_PARTITION,
    RESOURCE_EFA, TAINT_UNREGISTERED, TENANCY_DEDICATED, TENANCY_DEFAULT,
};
use crate::apis::{NodeClaim, Taint, TaintEffect};
use crate::cloudprovider::{CloudProviderError, Instance, OfferingKey, Result};
use crate::scheduling::instancetypes::{self as sched, InstanceType};
use crate::scheduling::requirements::Requirements;
use crate::scheduling::resources::Resources;

/// A NodeClaim being launched, with its ready node class.
struct Claim<'a> {
    node_claim: &'a NodeClaim,
    /// The NodeClaim's name.
    name: String,
    class: Arc<EC2NodeClass>,
    status: EC2NodeClassStatus,
}

/// What a NodeClaim asks for, and the instance types of its node class.
struct Wanted {
    reqs: Requirements,
    requests: Resources,
    types: Vec<InstanceType>,
}

/// What a launch asks the fleet for.
struct Offerings<'a> {
    /// The node class's instance types that are compatible with the NodeClaim and fit it.
    candidates: Vec<&'a InstanceType>,
    capacity_type: &'static str,
    /// Cheapest first.
    overrides: Vec<Override>,
}

/// A launch template and the overrides launched from it.
struct TemplateGroup {
    template: LaunchTemplate,
    overrides: Vec<Override>,
}

/// The launch template configs of a CreateFleet request, and the offerings they try.
struct LaunchTemplateConfigs {
    configs: Vec<ec2::FleetLaunchTemplateConfigRequest>,
    tried: Vec<OfferingKey>,
}

/// What a launch template takes from the NodeClaim it launches: the node's labels and taints
/// (startup taints included), and its NodePool for the tags.
pub(super) struct NodeOfClaim {
    pub(super) labels: BTreeMap<String, String>,
    pub(super) taints: Vec<Taint>,
    pub(super) node_pool: String,
    /// Dedicated tenancy, rather than default.
    pub(super) dedicated: bool,
    /// The placement group partition the claim asks for, when it names exactly one.
    pub(super) partition: Option<i32>,
}

impl NodeOfClaim {
    /// The node `node_claim` asks for.
    fn of(node_claim: &NodeClaim) -> Self {
        let mut taints: Vec<Taint> = node_claim.spec.taints.clone();
        taints.extend(node_claim.spec.startup_taints.iter().cloned());
        // Default tenancy unless the claim does not allow it, as upstream.
        let reqs = Requirements::from_nodepool(&node_claim.spec.requirements).ok();
        let dedicated = reqs.as_ref().is_some_and(|r| !r.allows(LABEL_INSTANCE_TENANCY, TENANCY_DEFAULT));
        let partition = reqs
            .as_ref()
            .and_then(|r| r.single_valued_labels().remove(LABEL_PLACEMENT_GROUP_PARTITION))
            .and_then(|p| p.parse().ok());
        NodeOfClaim {
            labels: node_claim.metadata.labels.clone().unwrap_or_default(),
            taints,
            node_pool: node_pool_tag(node_claim),
            dedicated,
            partition,
        }
    }

    /// The node a validation launches from (see [`super::validation`]): of no NodePool, with
    /// no labels or taints of its own, as upstream's validation NodeClaim; dedicated when one of
    /// the class's NodePools may launch dedicated instances.
    pub(super) fn validation(dedicated: bool) -> Self {
        NodeOfClaim {
            labels: BTreeMap::new(),
            taints: Vec::new(),
            node_pool: String::new(),
            dedicated,
            partition: None,
        }
    }
}

/// The value of the `karpenter.sh/nodepool` tag of what is launched for `node_claim`: its NodePool,
/// or empty for a standalone NodeClaim (as upstream tags it), so that IAM policies requiring the
/// tag (`StringLike` `*`, docs/install.md) cover standalone NodeClaims too.
fn node_pool_tag(node_claim: &NodeClaim) -> String {
    node_claim.metadata.labels.as_ref().and_then(|l| l.get(LABEL_NODEPOOL)).cloned().unwrap_or_default()
}

impl AwsCloudProvider {
    /// Launches an instance for `node_claim`, or adopts the one an earlier attempt launched.
    pub(super) async fn create_impl(&self, node_claim: &NodeClaim) -> Result<Instance> {
        let claim = self.resolve_claim(node_claim)?;
        if let Some(existing) = self.previous_launch(&claim).await? {
            return Ok(existing);
        }
        let wanted = self.claim_instance_types(&claim).await?;
        let offerings = self.fleet_offerings(&claim, &wanted)?;
        let capacity_type = offerings.capacity_type;
        let groups = self.template_groups(&claim, offerings)?;
        let LaunchTemplateConfigs { configs, tried } =
            self.launch_template_configs(&groups, capacity_type).await?;
        let out = self.create_fleet(&claim, &groups, capacity_type, configs).await?;
        let id = self.launched_instance_id(&claim, &out, &groups, capacity_type, tried)?;
        self.launched_instance(&claim, &id, &wanted.types).await
    }

    /// `node_claim` with its node class, which must be ready.
    fn resolve_claim<'a>(&self, node_claim: &'a NodeClaim) -> Result<Claim<'a>> {
        let name = node_claim.metadata.name.clone().unwrap_or_default();
        let (class, status) = self.ready_class(&node_claim.spec.node_class_ref.name)?;
        Ok(Claim { node_claim, name, class, status })
    }

    /// The instance an earlier attempt launched for the claim, if any.
    async fn previous_launch(&self, claim: &Claim<'_>) -> Result<Option<Instance>> {
        let found = instance::find_by_node_claim(&self.clients.ec2, &self.cluster.name, &claim.name).await?;
        let Some(existing) = found else { return Ok(None) };
        tracing::info!(node_claim = %claim.name, instance = %existing.id, "found the instance of a previous launch");
        Ok(Some(self.with_annotations(self.to_instance(&existing).await, &claim.class.spec)))
    }

    /// The claim's requirements and requests, and the instance types of its node class.
    async fn claim_instance_types(&self, claim: &Claim<'_>) -> Result<Wanted> {
        let (reqs, requests) = crate::cloudprovider::claim_requirements(claim.node_claim, &claim.name)?;
        let mut types = self.instance_types_for_class(&claim.class).await?;
        if !self.options.adjustments.is_empty() {
            let pool = claim.node_claim.metadata.labels.as_ref().and_then(|l| l.get(LABEL_NODEPOOL));
            let shared: Vec<Arc<InstanceType>> = types.into_iter().map(Arc::new).collect();
            types = self
                .options
                .adjustments
                .for_launch(pool.map(String::as_str), &shared)
                .into_iter()
                .map(Arc::unwrap_or_clone)
                .collect();
        }
        Ok(Wanted { reqs, requests, types })
    }

    /// The capacity type and the overrides of the instance types that are compatible with the
    /// claim and fit it; insufficient capacity when none of their offerings can be launched.
    fn fleet_offerings<'a>(&self, claim: &Claim<'_>, wanted: &'a Wanted) -> Result<Offerings<'a>> {
        let Wanted { reqs, requests, types } = wanted;
        let candidates: Vec<&InstanceType> = sched::filter(types, reqs, requests).collect();
        if candidates.is_empty() {
            return Err(self.no_candidates(claim, wanted));
        }
        let capacity_type = fleet::capacity_type(&candidates, reqs)
            .ok_or(CloudProviderError::InsufficientCapacity { offerings: vec![] })?;
        let status = &claim.status;
        let subnets = fleet::subnets_by_zone(status.subnets.iter().map(|s| (s.zone.as_str(), s.id.as_str())));
        let overrides = fleet::overrides(&candidates, reqs, capacity_type, &subnets);
        if overrides.is_empty() {
            return Err(CloudProviderError::InsufficientCapacity { offerings: vec![] });
        }
        Ok(Offerings { candidates, capacity_type, overrides })
    }

    /// The error when no instance type is compatible with the claim and fits it: insufficient
    /// capacity when some that would do ran out of capacity recently.
    fn no_candidates(&self, claim: &Claim<'_>, wanted: &Wanted) -> CloudProviderError {
        let Wanted { reqs, requests, types } = wanted;
        let group = self.placement_group_of(&claim.class).ok().flatten().map(|g| g.id);
        // Types that would do but whose offerings all ran out of capacity recently.
        let exhausted: Vec<OfferingKey> = types
            .iter()
            .filter(|it| it.fits(requests) && it.requirements.intersects(reqs).is_ok())
            .flat_map(|it| {
                it.offerings.iter().filter(|o| o.is_compatible(reqs)).map(|o| OfferingKey {
                    instance_type: it.name.clone(),
                    zone: o.zone.clone(),
                    capacity_type: o.capacity_type.clone(),
                })
            })
            .filter(|key| self.unavailable.contains(key, group.as_deref()))
            .collect();
        if !exhausted.is_empty() {
            return CloudProviderError::InsufficientCapacity { offerings: exhausted };
        }
        CloudProviderError::NoCompatibleInstanceTypes {
            node_claim: claim.name.clone(),
            reason: format!("none of {} instance types is compatible and fits {requests}", types.len()),
        }
    }

    /// One launch template per (AMI, max pods, EFA interfaces, capacity reservation), in the
    /// order of their cheapest override. A claim that requests EFA gets every EFA interface of its type, as upstream.
    fn template_groups(&self, claim: &Claim<'_>, offerings: Offerings<'_>) -> Result<Vec<TemplateGroup>> {
        let Claim { node_claim, class, status, .. } = claim;
        let Offerings { candidates, capacity_type, overrides } = offerings;
        let wants_efa = node_claim
            .spec
            .resources
            .as_ref()
            .and_then(|r| r.requests.as_ref())
            .is_some_and(|r| r.contains_key(RESOURCE_EFA));
        let mut groups: Vec<TemplateGroup> = Vec::new();
        for o in overrides {
            let Some(it) = candidates.iter().find(|it| it.name == o.instance_type) else { continue };
            let Some(ami) = fleet::select_ami(&status.amis, it) else { continue };
            let template = self
                .launch_template(
                    &NodeOfClaim::of(node_claim),
                    class,
                    status,
                    &ami.id,
                    capacity_type,
                    it.capacity.pods,
                    if wants_efa { it.capacity.get(RESOURCE_EFA) } else { 0 },
                )?
                .in_reservation(self.options.reserved_capacity, o.reservation.as_deref());
            match groups.iter_mut().find(|g| g.template == template) {
                Some(group) => group.overrides.push(o),
                None => groups.push(TemplateGroup { template, overrides: vec![o] }),
            }
        }
        Ok(groups)
    }

    /// Makes sure the launch templates exist, in order, and returns the request's configs: each
    /// template with its overrides.
    async fn launch_template_configs(
        &self,
        groups: &[TemplateGroup],
        capacity_type: &str,
    ) -> Result<LaunchTemplateConfigs> {
        let mut configs = Vec::new();
        let mut tried = Vec::new();
        for group in groups {
            let name = self.launch_templates.ensure(&group.template).await?;
            let mut config = ec2::FleetLaunchTemplateConfigRequest::builder().launch_template_specification(
                ec2::FleetLaunchTemplateSpecificationRequest::builder()
                    .launch_template_name(&name)
                    .version("$Latest")
                    .build(),
            );
            for o in &group.overrides {
                tried.push(OfferingKey {
                    instance_type: o.instance_type.clone(),
                    zone: o.zone.clone(),
                    capacity_type: capacity_type.to_string(),
                });
                config = config.overrides(
                    ec2::FleetLaunchTemplateOverridesRequest::builder()
                        .instance_type(ec2::InstanceType::from(o.instance_type.as_str()))
                        .subnet_id(&o.subnet_id)
                        .build(),
                );
            }
            configs.push(config.build());
        }
        Ok(LaunchTemplateConfigs { configs, tried })
    }

    /// Sends the CreateFleet request; when EC2 says a launch template is gone, the request's
    /// templates are forgotten.
    async fn create_fleet(
        &self,
        claim: &Claim<'_>,
        groups: &[TemplateGroup],
        capacity_type: &str,
        configs: Vec<ec2::FleetLaunchTemplateConfigRequest>,
    ) -> Result<CreateFleetOutput> {
        let tags = self.instance_tags(claim.node_claim, &claim.class);
        // Reserved overrides are all of one kind (see `fleet::overrides`).
        let market = groups
            .iter()
            .flat_map(|g| &g.overrides)
            .find_map(|o| o.reservation.as_deref())
            .and_then(fleet::reserved_market_type);
        let target_type = fleet::fleet_target_type(capacity_type, market);
        let request =
            self.fleet_request(&tags, target_type, configs).set_context(claim.class.spec.context.clone());
        // Not retried by the SDK: when an answer is lost (a timeout, a dropped connection, a 5xx
        // after EC2 acted), a blind retry could launch a second instance. The error goes back to
        // the NodeClaim's lifecycle, whose next attempt first looks for an instance tagged for the
        // claim (see `previous_launch`) and adopts it.
        let sent = request
            .customize()
            .config_override(super::no_retries())
            .send()
            .await
            .map_err(|e| sdk_error("CreateFleet", e));
        // A template the cache vouched for is gone (deleted behind Karpenter's back): forget the
        // request's templates so that the lifecycle's next attempt creates them again. EC2
        // rejected the whole request, so nothing was launched.
        if let Err(e) = &sent
            && e.api_code().is_some_and(fleet::is_launch_template_not_found)
        {
            for group in groups {
                let lt = &group.template;
                tracing::info!(launch_template = %lt.name(), node_claim = %claim.name, "launch template not found; it will be created again");
                self.launch_templates.invalidate(&lt.name());
            }
        }
        sent
    }

    /// The CreateFleet request of an instant fleet of one instance of the target capacity type
    /// `target_type` (see [`fleet::fleet_target_type`]) from `configs`, whose instance, volumes
    /// and fleet get `tags`.
    pub(super) fn fleet_request(
        &self,
        tags: &BTreeMap<String, String>,
        target_type: &str,
        configs: Vec<ec2::FleetLaunchTemplateConfigRequest>,
    ) -> CreateFleetFluentBuilder {
        let target = ec2::TargetCapacitySpecificationRequest::builder()
            .total_target_capacity(1)
            .default_target_capacity_type(ec2::DefaultTargetCapacityType::from(target_type))
            .build();
        let mut request = self
            .clients
            .ec2
            .create_fleet()
            .r#type(ec2::FleetType::Instant)
            .target_capacity_specification(target)
            .set_launch_template_configs(Some(configs));
        // The instance, its volumes and the fleet itself carry the same tags.
        for resource in [ec2::ResourceType::Instance, ec2::ResourceType::Volume, ec2::ResourceType::Fleet] {
            request = request.tag_specifications(
                ec2::TagSpecification::builder()
                    .resource_type(resource)
                    .set_tags(Some(ec2_tags(tags)))
                    .build(),
            );
        }
        // A capacity block's launch has no options of its own.
        match target_type {
            CAPACITY_TYPE_SPOT => request.spot_options(
                ec2::SpotOptionsRequest::builder()
                    .allocation_strategy(ec2::SpotAllocationStrategy::PriceCapacityOptimized)
                    .build(),
            ),
            CAPACITY_TYPE_ON_DEMAND => request.on_demand_options(
                ec2::OnDemandOptionsRequest::builder()
                    .allocation_strategy(ec2::FleetOnDemandAllocationStrategy::LowestPrice)
                    .build(),
            ),
            fleet::RESERVED_CAPACITY => request.reserved_capacity_options(
                ec2::ReservedCapacityOptionsRequest::builder()
                    .reservation_types(ec2::FleetReservationType::InterruptibleCapacityReservation)
                    .build(),
            ),
            _ => request,
        }
    }

    /// The id of the instance the fleet launched. The offerings the fleet's errors show to be out
    /// of capacity are left out for a while. Without an instance: insufficient capacity (of the
    /// `tried` offerings) when every error says so, else the errors, forgetting the request's
    /// launch templates when one of the errors is about launch templates.
    fn launched_instance_id(
        &self,
        claim: &Claim<'_>,
        out: &CreateFleetOutput,
        groups: &[TemplateGroup],
        capacity_type: &str,
        tried: Vec<OfferingKey>,
    ) -> Result<String> {
        let errors = fleet_errors(out, &claim.status);
        if capacity_type == CAPACITY_TYPE_RESERVED {
            // As upstream: an exhausted reservation has nothing left until EC2 says otherwise;
            // the type's other offerings are untouched.
            let overrides: Vec<&Override> = groups.iter().flat_map(|g| &g.overrides).collect();
            for id in fleet::exhausted_reservations(&errors, &overrides) {
                tracing::info!(capacity_reservation_id = %id, node_claim = %claim.name, "marking capacity reservation unavailable");
                self.reservations.exhausted(&id);
            }
        } else {
            // A launch into a placement group ran out there (upstream's scope: the group, and the
            // partition the claim targets).
            let template = groups.first().map(|g| &g.template);
            let scope = Scope::of_launch(
                template.and_then(|t| t.placement_group_id.as_deref()),
                template.and_then(|t| t.partition),
            );
            let tried: Vec<&str> =
                groups.iter().flat_map(|g| &g.overrides).map(|o| o.instance_type.as_str()).collect();
            for (key, scope) in fleet::unavailable_offerings(&errors, capacity_type, &scope, &tried) {
                tracing::info!(offering = %key, scope = ?scope, "offering has insufficient capacity; leaving it out for a while");
                self.unavailable.mark(key, scope);
            }
        }
        if let Some(id) = out.instances().iter().flat_map(|i| i.instance_ids()).next() {
            return Ok(id.clone());
        }
        if errors.iter().all(|e| fleet::is_insufficient_capacity(&e.code)) {
            return Err(CloudProviderError::InsufficientCapacity { offerings: tried });
        }
        let message =
            errors.iter().map(|e| format!("{}: {}", e.code, e.message)).collect::<Vec<_>>().join("; ");
        if errors.iter().any(|e| e.code.contains("LaunchTemplate")) {
            for group in groups {
                self.launch_templates.invalidate(&group.template.name());
            }
        }
        Err(CloudProviderError::UnexpectedResponse { operation: "CreateFleet", message })
    }

    /// The launched instance `id`, with the capacity, allocatable and labels of its type among
    /// `types`, annotated with the hash of the claim's node class.
    async fn launched_instance(
        &self,
        claim: &Claim<'_>,
        id: &str,
        types: &[InstanceType],
    ) -> Result<Instance> {
        let launched = instance::get(&self.clients.ec2, id).await?;
        if let Some(reservation) = &launched.reservation {
            self.reservations.launched(&reservation.id);
        }
        let mut result = self.to_instance(&launched).await;
        if let Some(it) = types.iter().find(|t| t.name == launched.instance_type) {
            result.capacity = it.capacity.to_list();
            result.allocatable = it.allocatable().to_list();
            for (k, v) in it.requirements.single_valued_labels() {
                result.labels.entry(k).or_insert(v);
            }
        }
        Ok(self.with_annotations(result, &claim.class.spec))
    }

    /// The tags of the instance launched for `node_claim` (and of its volumes and fleet).
    fn instance_tags(&self, node_claim: &NodeClaim, class: &EC2NodeClass) -> BTreeMap<String, String> {
        let mut tags = self.launch_tags(class, &node_pool_tag(node_claim));
        tags.insert(TAG_NODECLAIM.to_string(), node_claim.metadata.name.clone().unwrap_or_default());
        tags
    }

    /// The tags of what is launched from `class` for the NodePool `node_pool` (empty for none):
    /// the class's own tags and the cluster's, class's and pool's, as upstream's `GetTags`.
    pub(super) fn launch_tags(&self, class: &EC2NodeClass, node_pool: &str) -> BTreeMap<String, String> {
        let mut tags = class.spec.tags.clone();
        tags.insert(cluster_tag(&self.cluster.name), "owned".to_string());
        tags.insert(TAG_EKS_CLUSTER_NAME.to_string(), self.cluster.name.clone());
        tags.insert(LABEL_EC2NODECLASS.to_string(), class.metadata.name.clone().unwrap_or_default());
        tags.insert(LABEL_NODEPOOL.to_string(), node_pool.to_string());
        tags
    }

    /// The launch template for instances of `node` booting `ami` with `max_pods` pods and
    /// `efa_count` EFA interfaces (0 unless the claim requests EFA).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn launch_template(
        &self,
        node: &NodeOfClaim,
        class: &EC2NodeClass,
        status: &EC2NodeClassStatus,
        ami: &str,
        capacity_type: &str,
        max_pods: i64,
        efa_count: i64,
    ) -> Result<LaunchTemplate> {
        let spec = &class.spec;
        let family = amifamily::family_of(spec);
        let mut labels = node.labels.clone();
        labels.insert(LABEL_CAPACITY_TYPE.to_string(), capacity_type.to_string());
        let mut taints = node.taints.clone();
        if !taints.iter().any(|t| t.key == TAINT_UNREGISTERED) {
            taints.push(Taint::new(TAINT_UNREGISTERED, TaintEffect::NoExecute));
        }
        let user_data = userdata::generate(&Bootstrap {
            cluster: &self.cluster,
            family,
            kubelet: spec.kubelet.as_ref(),
            max_pods: Some(max_pods),
            labels: &labels,
            taints: &taints,
            custom: spec.user_data.as_deref(),
            instance_store_raid0: spec.instance_store_policy == Some(InstanceStorePolicy::RAID0),
        })
        .map_err(|e| CloudProviderError::Config(format!("user data of EC2NodeClass: {e}")))?;
        // Tagged like the instances, so that IAM policies scoped to the cluster's and a
        // NodePool's resources let the controller launch from the template.
        let mut tags = self.launch_tags(class, &node.node_pool);
        tags.insert(CLUSTER_TAG.to_string(), self.cluster.name.clone());
        let mut sgs: Vec<String> = status.security_groups.iter().map(|g| g.id.clone()).collect();
        sgs.sort();
        let group = self.placement_group_of(class)?;
        Ok(LaunchTemplate {
            image_id: ami.to_string(),
            instance_profile: status.instance_profile.clone().unwrap_or_default(),
            security_group_ids: sgs,
            block_device_mappings: amifamily::block_device_mappings(spec, family),
            metadata_options: spec.metadata_options.clone(),
            detailed_monitoring: spec.detailed_monitoring.unwrap_or(false),
            associate_public_ip_address: spec.associate_public_ip_address,
            tags,
            spot: capacity_type == CAPACITY_TYPE_SPOT,
            user_data,
            tenancy: node.dedicated.then(|| TENANCY_DEDICATED.to_string()),
            ip_prefix_count: spec.ip_prefix_count,
            connection_tracking: spec.connection_tracking.clone(),
            network_interfaces: Nic::resolve(&spec.network_interfaces, efa_count),
            partition: group.as_ref().filter(|g| g.is_partitioned()).and(node.partition),
            placement_group_id: group.map(|g| g.id),
            ipv6: self.cluster.is_ipv6(),
            nested_virtualization: spec.cpu_options.as_ref().and_then(|c| c.nested_virtualization.clone()),
            capacity_reservation: None,
        })
    }
}

/// The errors CreateFleet reported, each with the zone of its override (or of its subnet).
fn fleet_errors(out: &CreateFleetOutput, status: &EC2NodeClassStatus) -> Vec<FleetError> {
    let zone_of_subnet: BTreeMap<&str, &str> =
        status.subnets.iter().map(|s| (s.id.as_str(), s.zone.as_str())).collect();
    out.errors()
        .iter()
        .map(|e| {
            let o = e.launch_template_and_overrides().and_then(|l| l.overrides());
            FleetError {
                code: e.error_code().unwrap_or_default().to_string(),
                message: e.error_message().unwrap_or_default().to_string(),
                instance_type: o.and_then(|o| o.instance_type()).map(|t| t.as_str().to_string()),
                zone: o.and_then(|o| {
                    o.availability_zone()
                        .map(str::to_string)
                        .or_else(|| o.subnet_id().and_then(|s| zone_of_subnet.get(s)).map(|z| z.to_string()))
                }),
            }
        })
        .collect()
}

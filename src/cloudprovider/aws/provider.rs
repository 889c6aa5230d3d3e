//! [`AwsCloudProvider`]: the [`CloudProvider`] for EC2, wiring the catalog, prices, node-class
//! resolution, launch templates and fleets together.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use super::cache::{Clock, SystemClock, TtlCache};
use super::catalog::{Catalog, CatalogData};
use super::instance::{self, Ec2Instance, TAG_NODECLAIM};
use super::instancetype::{self, OfferingInputs, Settings, TypeInfo};
use super::launchtemplate::{self, LaunchTemplates};
use super::nodeclass::{self, PlacementGroup, Resolution};
use super::nodecost::{self, BurstableCpu, NodeCost};
use super::pricing::Pricing;
use super::reservations;
use super::sdk_error;
use super::unavailable::UnavailableOfferings;
use super::userdata::ClusterInfo;
use super::validation::{Outcome, VALIDATION_TTL, ValidationState, Verdict};
use super::{amifamily, fleet};
use crate::apis::ec2nodeclass::NODE_CLASS_HASH_VERSION;
use crate::apis::ec2nodeclass::{
    AmiFamily, EC2NodeClass, EC2NodeClassSpec, EC2NodeClassStatus, PlacementGroupSelector,
};
use crate::apis::labels::*;
use crate::apis::{NodeClaim, NodePool};
use crate::cloudprovider::{
    BoxFuture, CloudProvider, CloudProviderError, DriftReason, Instance, OfferingKey, Result, provider_id,
};
use crate::scheduling::instancetypes::InstanceType;
use crate::scheduling::requirements::Requirements;
use crate::scheduling::resources::Resources;
use kube::ResourceExt;

/// How long an offering that ran out of capacity is left out.
pub const UNAVAILABLE_OFFERING_TTL: Duration = Duration::from_secs(180);

/// How often a node class is resolved again when nothing changes, by default.
pub const NODE_CLASS_REFRESH: Duration = Duration::from_secs(60);

/// The AWS service clients the provider uses.
#[derive(Clone, Debug)]
pub struct AwsClients {
    /// EC2.
    pub ec2: aws_sdk_ec2::Client,
    /// SSM (AMI aliases).
    pub ssm: aws_sdk_ssm::Client,
    /// IAM (instance profiles).
    pub iam: aws_sdk_iam::Client,
    /// EKS (cluster endpoint and CA).
    pub eks: aws_sdk_eks::Client,
    /// SQS (the interruption queue).
    pub sqs: aws_sdk_sqs::Client,
    /// The Pricing API (on-demand prices), in the region that serves the clients' region.
    pub pricing: aws_sdk_pricing::Client,
    /// Region of the clients.
    pub region: String,
}

/// The app name in the user agent of the controller's AWS requests (`app/karpenter-rs`), as
/// upstream's carry `karpenter.sh-<version>`: CloudTrail tells the controller's calls apart, and
/// so does the AWS emulator's call log (hack/moto/call_log.py), which the IAM policy test of
/// docs/install.md reads.
pub const USER_AGENT_APP_NAME: &str = "karpenter-rs";

impl AwsClients {
    /// Clients configured from the environment (credentials chain, `AWS_REGION`,
    /// `AWS_ENDPOINT_URL`, ...).
    pub async fn from_env() -> Result<Self> {
        let config = super::config_loader().load().await;
        Self::from_config(&config)
    }

    /// The controller's clients: as [`AwsClients::from_env`], with [`USER_AGENT_APP_NAME`] in
    /// the user agent of every request.
    pub async fn for_controller() -> Result<Self> {
        let app = aws_config::AppName::new(USER_AGENT_APP_NAME)
            .map_err(|e| CloudProviderError::Config(format!("user agent app name: {e}")))?;
        let config = super::config_loader().app_name(app).load().await;
        Self::from_config(&config)
    }

    /// Clients for an SDK configuration.
    pub fn from_config(config: &aws_config::SdkConfig) -> Result<Self> {
        let region = config.region().map(|r| r.as_ref().to_string()).ok_or_else(|| {
            CloudProviderError::Config("no AWS region configured (set AWS_REGION)".to_string())
        })?;
        Ok(AwsClients {
            ec2: aws_sdk_ec2::Client::new(config),
            ssm: aws_sdk_ssm::Client::new(config),
            iam: aws_sdk_iam::Client::new(config),
            eks: aws_sdk_eks::Client::new(config),
            sqs: aws_sdk_sqs::Client::new(config),
            pricing: aws_sdk_pricing::Client::from_conf(
                aws_sdk_pricing::config::Builder::from(config)
                    .region(aws_config::Region::new(super::pricing::pricing_api_region(&region)))
                    .build(),
            ),
            region,
        })
    }
}

/// Operator settings of the provider.
#[derive(Clone, Debug)]
pub struct Options {
    /// Cluster name.
    pub cluster_name: String,
    /// API server endpoint; discovered through EKS when unset.
    pub cluster_endpoint: Option<String>,
    /// Base64 PEM bundle of the cluster's CA; discovered through EKS when unset.
    pub cluster_ca_bundle: Option<String>,
    /// Kubernetes version of the cluster (`1.34`), as its API server reports it; EKS's when
    /// unset.
    pub kubernetes_version: Option<String>,
    /// Network interfaces kept out of the pod-density computation.
    pub reserved_enis: i64,
    /// Share of memory the hypervisor keeps.
    pub vm_memory_overhead_percent: f64,
    /// How often the instance-type catalog is refreshed.
    pub catalog_refresh: Duration,
    /// How often each EC2NodeClass is resolved again (AMIs, subnets, security groups) when
    /// nothing changes.
    pub node_class_refresh: Duration,
    /// Cluster IP of the `kube-system/kube-dns` Service (see [`kube_dns_ip`]).
    pub kube_dns_ip: Option<String>,
    /// No dry-run validation of EC2NodeClasses (`DISABLE_DRY_RUN`): their `ValidationSucceeded`
    /// is True without a call (see [`super::validation`]).
    pub disable_dry_run: bool,
    /// The NodeOverlays (`NodeOverlay` gate) and the learned extended resources: a launch sees
    /// its claim's instance types as its NodePool's adjustments leave them, as the decision that
    /// planned it did.
    pub adjustments: crate::cloudprovider::overlay::Adjustments,
    /// The `ReservedCapacity` gate: EC2NodeClasses resolve their capacity reservations into
    /// `status.capacityReservations`, which the scheduler sees as `reserved` offerings and
    /// launches into.
    pub reserved_capacity: bool,
    /// How plans treat burstable types' CPU (`BURSTABLE_CPU`, see [`super::nodecost`]).
    pub burstable_cpu: BurstableCpu,
}

impl Options {
    /// Defaults for `cluster_name`.
    pub fn new(cluster_name: impl Into<String>) -> Self {
        Options {
            cluster_name: cluster_name.into(),
            cluster_endpoint: None,
            cluster_ca_bundle: None,
            kubernetes_version: None,
            reserved_enis: 0,
            vm_memory_overhead_percent: instancetype::DEFAULT_VM_MEMORY_OVERHEAD_PERCENT,
            catalog_refresh: super::catalog::REFRESH_INTERVAL,
            node_class_refresh: NODE_CLASS_REFRESH,
            kube_dns_ip: None,
            disable_dry_run: false,
            adjustments: Default::default(),
            reserved_capacity: true,
            burstable_cpu: BurstableCpu::default(),
        }
    }
}

/// The cluster nodes join: endpoint, CA and version from `options` where set, the rest from EKS
/// DescribeCluster. When the settings give the endpoint and the CA, a failing DescribeCluster is
/// only logged (nodes then get the cluster DNS address of the kube-dns Service, if any).
async fn cluster_info(eks: &aws_sdk_eks::Client, options: &Options) -> Result<ClusterInfo> {
    let described = match eks.describe_cluster().name(&options.cluster_name).send().await {
        Ok(out) => out.cluster,
        Err(e) => {
            let e = sdk_error("DescribeCluster", e);
            if options.cluster_endpoint.is_none() || options.cluster_ca_bundle.is_none() {
                return Err(e);
            }
            tracing::warn!(cluster = %options.cluster_name, error = %e, "describing the EKS cluster; using the configured endpoint and CA");
            None
        }
    };
    let c = described.as_ref();
    let endpoint =
        options.cluster_endpoint.clone().or_else(|| c.and_then(|c| c.endpoint()).map(str::to_string));
    let ca_bundle = options
        .cluster_ca_bundle
        .clone()
        .or_else(|| c.and_then(|c| c.certificate_authority()).and_then(|a| a.data()).map(str::to_string));
    let (Some(endpoint), Some(ca_bundle)) = (endpoint, ca_bundle) else {
        return Err(CloudProviderError::UnexpectedResponse {
            operation: "DescribeCluster",
            message: format!(
                "cluster {} has no endpoint or CA; set CLUSTER_ENDPOINT and CLUSTER_CA_BUNDLE",
                options.cluster_name
            ),
        });
    };
    Ok(ClusterInfo {
        name: options.cluster_name.clone(),
        endpoint,
        ca_bundle,
        service_cidr: c
            .and_then(|c| c.kubernetes_network_config())
            .and_then(|n| n.service_ipv4_cidr())
            .map(str::to_string),
        version: options
            .kubernetes_version
            .clone()
            .or_else(|| c.and_then(|c| c.version()).map(str::to_string))
            .unwrap_or_default(),
        kube_dns_ip: options.kube_dns_ip.clone(),
    })
}

/// `1.34` from the API server's `major` and `minor` (`"1"`, `"34+"`, as some distributions
/// report it).
pub fn minor_version(major: &str, minor: &str) -> String {
    let digits = |s: &str| s.chars().take_while(char::is_ascii_digit).collect::<String>();
    format!("{}.{}", digits(major), digits(minor))
}

/// The cluster IP of the `kube-system/kube-dns` Service, which nodes get as their cluster DNS.
/// `None` (logged) when there is no such Service or it has no usable address: custom DNS setups
/// do without it, and nodes then use the tenth address of the service CIDR.
pub async fn kube_dns_ip(client: &kube::Client) -> Option<String> {
    let services: kube::Api<k8s_openapi::api::core::v1::Service> =
        kube::Api::namespaced(client.clone(), "kube-system");
    let found = match services.get_opt("kube-dns").await {
        Ok(Some(service)) => service.spec.and_then(|s| s.cluster_ip),
        Ok(None) => None,
        Err(error) => {
            tracing::debug!(error = %error, "unable to detect the IP of the kube-dns service");
            return None;
        }
    };
    match found.filter(|ip| ip.parse::<std::net::IpAddr>().is_ok()) {
        Some(ip) => Some(ip),
        None => {
            tracing::debug!(
                "unable to detect the IP of the kube-dns service, it does not exist or has no cluster IP"
            );
            None
        }
    }
}

/// The EC2NodeClasses the provider knows, fed by the node-class controller (or a watch).
#[derive(Debug, Default)]
pub struct NodeClassStore(RwLock<HashMap<String, Arc<EC2NodeClass>>>);

impl NodeClassStore {
    /// Adds or replaces a class.
    pub fn upsert(&self, class: EC2NodeClass) {
        let name = class.metadata.name.clone().unwrap_or_default();
        self.0.write().unwrap_or_else(PoisonError::into_inner).insert(name, Arc::new(class));
    }

    /// Adds the classes it does not know yet, as stored in the API (with the status resolved
    /// before), leaving the ones it knows alone; returns how many were added. At start, before
    /// the node-class controller has resolved anything, this lets launches use the status
    /// resolved by a previous run, as upstream does.
    pub fn seed(&self, classes: impl IntoIterator<Item = EC2NodeClass>) -> usize {
        let mut known = self.0.write().unwrap_or_else(PoisonError::into_inner);
        let mut added = 0;
        for class in classes {
            let Some(name) = class.metadata.name.clone() else { continue };
            if class.metadata.deletion_timestamp.is_some() || known.contains_key(&name) {
                continue;
            }
            known.insert(name, Arc::new(class));
            added += 1;
        }
        added
    }

    /// Removes a class.
    pub fn remove(&self, name: &str) {
        self.0.write().unwrap_or_else(PoisonError::into_inner).remove(name);
    }

    /// The class named `name`.
    pub fn get(&self, name: &str) -> Option<Arc<EC2NodeClass>> {
        self.0.read().unwrap_or_else(PoisonError::into_inner).get(name).cloned()
    }
}

/// A class resolved: the status it should get, and why its validation decided nothing this
/// time (the error, and whether it is transient), if it did not.
#[derive(Debug)]
pub struct Resolved {
    /// The class's status.
    pub status: EC2NodeClassStatus,
    /// Why `ValidationSucceeded` kept its last value, if it did.
    pub undecided: Option<(CloudProviderError, bool)>,
}

/// The EC2 cloud provider.
#[derive(Debug)]
pub struct AwsCloudProvider {
    pub(super) clients: AwsClients,
    pub(super) options: Options,
    pub(super) cluster: ClusterInfo,
    node_classes: NodeClassStore,
    catalog: Catalog,
    pricing: Pricing,
    pub(super) unavailable: UnavailableOfferings,
    pub(super) launch_templates: LaunchTemplates,
    /// Each class's last validation verdict, with the key of what it was made from.
    pub(super) validations: TtlCache<String, (String, Verdict)>,
    /// Each class's placement group as last resolved, with the selector it was resolved for.
    placement_groups: std::sync::RwLock<HashMap<String, (PlacementGroupSelector, Option<PlacementGroup>)>>,
    /// The subnets of the resolved classes that give their instances a public IPv4 address.
    public_subnets: RwLock<BTreeSet<String>>,
    /// Instances left in the capacity reservations the classes select.
    pub(super) reservations: reservations::Availability,
}

impl AwsCloudProvider {
    /// A provider for the cluster of `options`, whose endpoint, CA, service CIDR and version
    /// come from EKS DescribeCluster.
    pub async fn new(clients: AwsClients, options: Options) -> Result<Self> {
        Self::with_clock(clients, options, Arc::new(SystemClock)).await
    }

    /// As [`AwsCloudProvider::new`], with the clock that times the caches.
    pub async fn with_clock(clients: AwsClients, options: Options, clock: Arc<dyn Clock>) -> Result<Self> {
        let cluster = cluster_info(&clients.eks, &options).await?;
        Ok(AwsCloudProvider {
            catalog: Catalog::new(clients.ec2.clone(), options.catalog_refresh, clock.clone()),
            launch_templates: LaunchTemplates::new(clients.ec2.clone(), &options.cluster_name, clock.clone()),
            unavailable: UnavailableOfferings::new(UNAVAILABLE_OFFERING_TTL, clock.clone()),
            validations: TtlCache::new(VALIDATION_TTL, clock),
            pricing: Pricing::default(),
            node_classes: NodeClassStore::default(),
            placement_groups: Default::default(),
            public_subnets: Default::default(),
            reservations: Default::default(),
            clients,
            options,
            cluster,
        })
    }

    /// The cluster nodes join.
    pub fn cluster(&self) -> &ClusterInfo {
        &self.cluster
    }

    /// The `karpenter.k8s.aws/ec2nodeclass-hash` of a class with `spec`, with the CA bundle this
    /// controller trusts for the API server (`CLUSTER_CA_BUNDLE`, else its client's), as upstream
    /// hashes it.
    pub fn class_hash(&self, spec: &EC2NodeClassSpec) -> String {
        node_class_hash(spec, self.options.cluster_ca_bundle.as_deref().unwrap_or_default())
    }

    /// How often each EC2NodeClass is resolved again when nothing changes.
    pub fn node_class_refresh(&self) -> Duration {
        self.options.node_class_refresh
    }

    /// The known node classes.
    pub fn node_classes(&self) -> &NodeClassStore {
        &self.node_classes
    }

    /// Known prices.
    pub fn pricing(&self) -> &Pricing {
        &self.pricing
    }

    /// Offerings that recently ran out of capacity.
    pub fn unavailable_offerings(&self) -> &UnavailableOfferings {
        &self.unavailable
    }

    /// Whether the `ReservedCapacity` gate is on.
    pub fn reserved_capacity(&self) -> bool {
        self.options.reserved_capacity
    }

    /// Instances left in the capacity reservations the classes select.
    pub fn reservations(&self) -> &reservations::Availability {
        &self.reservations
    }

    /// The clients.
    pub fn clients(&self) -> &AwsClients {
        &self.clients
    }

    /// Resolves a class's selectors and validates that the controller may launch from it (for
    /// the NodePools `pools` that use it), and returns the status it should get: the node-class
    /// controller writes it and then [`NodeClassStore::upsert`]s the class.
    pub async fn resolve_node_class(&self, class: &EC2NodeClass, pools: &[&NodePool]) -> Result<Resolved> {
        let spec = &class.spec;
        let ec2 = &self.clients.ec2;
        let resolution = Resolution {
            subnets: nodeclass::resolve_subnets(ec2, &spec.subnet_selector_terms).await?,
            security_groups: nodeclass::resolve_security_groups(ec2, &spec.security_group_selector_terms)
                .await?,
            amis: nodeclass::resolve_amis(
                ec2,
                &self.clients.ssm,
                &spec.ami_selector_terms,
                &self.cluster.version,
            )
            .await?,
            instance_profile: nodeclass::resolve_instance_profile(
                &self.clients.iam,
                class,
                &self.cluster.name,
                &self.clients.region,
            )
            .await?,
            placement_group: match &spec.placement_group_selector {
                Some(selector) => nodeclass::resolve_placement_group(ec2, selector).await?,
                None => None,
            },
            capacity_reservations: match self.options.reserved_capacity {
                true => {
                    let found = nodeclass::resolve_capacity_reservations(
                        ec2,
                        &spec.capacity_reservation_selector_terms,
                        k8s_openapi::jiff::Timestamp::now(),
                    )
                    .await?;
                    self.reservations.sync(found.iter().map(|(r, available)| (r.id.as_str(), *available)));
                    Some(found.into_iter().map(|(r, _)| r).collect())
                }
                false => None,
            },
            unsupported_alias: spec
                .ami_selector_terms
                .iter()
                .filter_map(|t| amifamily::parse_alias(t.alias.as_deref()?))
                .find_map(|(family, _)| amifamily::alias_unsupported(family, &self.cluster.version)),
        };
        self.remember_placement_group(class, resolution.placement_group.clone());
        {
            let mut public = self.public_subnets.write().unwrap_or_else(PoisonError::into_inner);
            for subnet in &resolution.subnets {
                if subnet.public_ipv4 {
                    public.insert(subnet.id.clone());
                } else {
                    public.remove(&subnet.id);
                }
            }
        }
        let previous = class.status.as_ref();
        let now = k8s_openapi::jiff::Timestamp::now().to_string();
        if !resolution.is_complete() {
            let status =
                nodeclass::status(class, &resolution, &ValidationState::DependenciesNotReady, previous, &now);
            return Ok(Resolved { status, undecided: None });
        }
        let resolved = nodeclass::status(class, &resolution, &ValidationState::Undecided, previous, &now);
        let (state, undecided) = match self.validate_node_class(class, &resolved, pools).await {
            Outcome::Decided(verdict) => (ValidationState::Decided(verdict), None),
            Outcome::Undecided { error, transient } => (ValidationState::Undecided, Some((error, transient))),
        };
        let status = nodeclass::status(class, &resolution, &state, previous, &now);
        Ok(Resolved { status, undecided })
    }

    /// Deletes the launch templates created for the class named `class_name` (and forgets them),
    /// returning their names. The node-class controller calls this when the class is deleted.
    pub async fn delete_launch_templates(&self, class_name: &str) -> Result<Vec<String>> {
        let deleted =
            launchtemplate::delete_for_class(&self.clients.ec2, &self.cluster.name, class_name).await?;
        for name in &deleted {
            self.launch_templates.invalidate(name);
        }
        Ok(deleted)
    }

    /// Deletes the launch templates no launch used for
    /// [`LAUNCH_TEMPLATE_TTL`](launchtemplate::LAUNCH_TEMPLATE_TTL) and returns their names. Call
    /// it periodically (from the leader); the first call also takes in the templates an earlier
    /// run left, to be deleted once they stay unused for the TTL.
    pub async fn delete_unused_launch_templates(&self) -> Result<Vec<String>> {
        self.launch_templates.delete_expired().await
    }

    /// Deletes the instance profile Karpenter manages for `class` (only for a class that names a
    /// `role`; a profile given by `instanceProfile` belongs to the user). Returns the profile's
    /// name when it existed.
    pub async fn delete_instance_profile(&self, class: &EC2NodeClass) -> Result<Option<String>> {
        if class.spec.role.is_none() {
            return Ok(None);
        }
        let name = self.managed_instance_profile_name(class);
        let existed = nodeclass::delete_instance_profile(&self.clients.iam, &name).await?;
        Ok(existed.then_some(name))
    }

    /// The name of the instance profile Karpenter manages for `class` when it names a `role`.
    pub fn managed_instance_profile_name(&self, class: &EC2NodeClass) -> String {
        let class_name = class.metadata.name.clone().unwrap_or_default();
        nodeclass::instance_profile_name(&self.cluster.name, &self.clients.region, &class_name)
    }

    fn remember_placement_group(&self, class: &EC2NodeClass, found: Option<PlacementGroup>) {
        let name = class.metadata.name.clone().unwrap_or_default();
        let mut groups = self.placement_groups.write().unwrap_or_else(std::sync::PoisonError::into_inner);
        match &class.spec.placement_group_selector {
            Some(selector) => {
                if let Some(g) =
                    found.as_ref().filter(|g| groups.get(&name).and_then(|(_, o)| o.as_ref()) != Some(*g))
                {
                    tracing::debug!(ec2nodeclass = %name, id = %g.id, name = %g.name, strategy = %g.strategy, "discovered placement group");
                }
                groups.insert(name, (selector.clone(), found))
            }
            None => groups.remove(&name),
        };
    }

    /// The placement group `class` launches into: none when it names none; an error until the
    /// group its selector names has been resolved (a launch never goes outside the group).
    pub(super) fn placement_group_of(&self, class: &EC2NodeClass) -> Result<Option<PlacementGroup>> {
        let Some(selector) = &class.spec.placement_group_selector else { return Ok(None) };
        let name = class.metadata.name.clone().unwrap_or_default();
        let groups = self.placement_groups.read().unwrap_or_else(std::sync::PoisonError::into_inner);
        match groups.get(&name) {
            Some((resolved_for, Some(group))) if resolved_for == selector => Ok(Some(group.clone())),
            _ => Err(CloudProviderError::NodeClassNotReady {
                name,
                reason: "its placement group is not resolved yet".to_string(),
            }),
        }
    }

    /// The node class named `name`, which must be ready, with its status.
    pub(super) fn ready_class(&self, name: &str) -> Result<(Arc<EC2NodeClass>, EC2NodeClassStatus)> {
        let class = self.node_classes.get(name).ok_or_else(|| CloudProviderError::NodeClassNotReady {
            name: name.to_string(),
            reason: "the EC2NodeClass does not exist".to_string(),
        })?;
        let status = nodeclass::is_ready(class.status.as_ref())
            .map_err(|reason| CloudProviderError::NodeClassNotReady { name: name.to_string(), reason })?
            .clone();
        Ok((class, status))
    }

    /// The instance types of a ready class: the catalog's types that one of its AMIs can boot,
    /// with offerings in the zones of its subnets.
    pub async fn instance_types_for_class(&self, class: &EC2NodeClass) -> Result<Vec<InstanceType>> {
        let name = class.metadata.name.clone().unwrap_or_default();
        let status = nodeclass::is_ready(class.status.as_ref())
            .map_err(|reason| CloudProviderError::NodeClassNotReady { name, reason })?;
        let group = self.placement_group_of(class)?;
        self.instance_types_for_status(&class.spec, status, group.as_ref()).await
    }

    /// The instance types of a class with `spec` whose resources are resolved in `status`, in
    /// the placement group `group`.
    pub(super) async fn instance_types_for_status(
        &self,
        spec: &EC2NodeClassSpec,
        status: &EC2NodeClassStatus,
        group: Option<&PlacementGroup>,
    ) -> Result<Vec<InstanceType>> {
        let catalog = self.catalog.get().await?;
        let settings = Settings { placement_group: group, ..self.settings(spec) };
        let subnet_zones: BTreeSet<String> = status.subnets.iter().map(|s| s.zone.clone()).collect();
        let ami_reqs: Vec<Requirements> = status
            .amis
            .iter()
            .filter_map(|a| Requirements::from_node_selector(&a.requirements).ok())
            .collect();
        let price = |it: &str, zone: &str, ct: &str| self.pricing.price(it, zone, ct);
        // What comes with every node: its volumes, and a public IPv4 address when the class or
        // its subnets give one.
        let subnets_public = {
            let public = self.public_subnets.read().unwrap_or_else(PoisonError::into_inner);
            status.subnets.iter().any(|s| public.contains(&s.id))
        };
        let node_cost = NodeCost::of_class(spec, subnets_public);
        let empty = BTreeSet::new();
        let mut out = Vec::new();
        for info in catalog.types.iter().filter(|info| instancetype::compatible(info, spec, group)) {
            let offered = catalog.zones.get(&info.name).unwrap_or(&empty);
            let name = info.name.clone();
            let price_of = |zone: &str, ct: &str| price(&name, zone, ct);
            let unavailable_of = |zone: &str, ct: &str| {
                let key = OfferingKey {
                    instance_type: name.clone(),
                    zone: zone.to_string(),
                    capacity_type: ct.to_string(),
                };
                self.unavailable.contains(&key, group.map(|g| g.id.as_str()))
            };
            let inputs = OfferingInputs {
                offered_zones: offered,
                subnet_zones: &subnet_zones,
                price: &price_of,
                unavailable: &unavailable_of,
            };
            let mut offerings = instancetype::offerings(info, &inputs);
            if self.options.reserved_capacity {
                offerings.extend(reservations::offerings(
                    &info.name,
                    &status.capacity_reservations,
                    &subnet_zones,
                    self.pricing.on_demand_price(&info.name),
                    &|id| self.reservations.left(id),
                ));
            }
            if offerings.is_empty() {
                continue;
            }
            let it = match instancetype::instance_type(info, &settings, offerings) {
                Ok(it) => it,
                Err(e) => {
                    return Err(CloudProviderError::Config(format!(
                        "kubelet settings of the node class: {e}"
                    )));
                }
            };
            if ami_reqs.iter().any(|r| it.requirements.intersects(r).is_ok()) {
                out.push(nodecost::priced(&it, &node_cost, self.options.burstable_cpu));
            }
        }
        Ok(out)
    }

    fn settings<'a>(&'a self, spec: &'a EC2NodeClassSpec) -> Settings<'a> {
        Settings {
            reserved_enis: self.options.reserved_enis,
            vm_memory_overhead_percent: self.options.vm_memory_overhead_percent,
            ..Settings::for_node_class(&self.clients.region, spec)
        }
    }

    /// Capacity, allocatable and labels of an instance of type `info` for `class`.
    fn describe_type(
        &self,
        info: &TypeInfo,
        spec: &EC2NodeClassSpec,
    ) -> Option<(Resources, Resources, Requirements)> {
        let it = instancetype::instance_type(info, &self.settings(spec), vec![]).ok()?;
        Some((it.capacity.clone(), it.allocatable().clone(), it.requirements))
    }

    /// The [`Instance`] of an EC2 instance, described by its node class where it is known.
    pub(super) async fn to_instance(&self, i: &Ec2Instance) -> Instance {
        let mut out = Instance {
            provider_id: provider_id(&i.zone, &i.id),
            instance_type: i.instance_type.clone(),
            zone: i.zone.clone(),
            capacity_type: i.capacity_type.clone(),
            image_id: i.image_id.clone(),
            node_claim: i.tags.get(TAG_NODECLAIM).cloned(),
            node_pool: i.node_pool().map(str::to_string),
            state: i.state.clone(),
            launch_time: i.launch_time.clone(),
            ..Default::default()
        };
        let class = i.tags.get(LABEL_EC2NODECLASS).and_then(|n| self.node_classes.get(n));
        if let (Some(class), Ok(catalog)) = (class, self.catalog.get().await)
            && let Some(info) = catalog.get(&i.instance_type)
            && let Some((capacity, allocatable, reqs)) = self.describe_type(info, &class.spec)
        {
            out.capacity = capacity.to_list();
            out.allocatable = allocatable.to_list();
            out.labels = reqs.single_valued_labels();
            if let Some(zone_id) = class
                .status
                .as_ref()
                .and_then(|s| s.subnets.iter().find(|s| s.id == i.subnet_id))
                .and_then(|s| s.zone_id.clone())
            {
                out.labels.insert(LABEL_TOPOLOGY_ZONE_ID.to_string(), zone_id);
            }
        }
        out.labels.insert(LABEL_INSTANCE_TYPE.to_string(), i.instance_type.clone());
        out.labels.insert(LABEL_TOPOLOGY_ZONE.to_string(), i.zone.clone());
        out.labels.insert(LABEL_CAPACITY_TYPE.to_string(), i.capacity_type.clone());
        out.labels.insert(LABEL_TOPOLOGY_REGION.to_string(), self.clients.region.clone());
        out.labels.insert(LABEL_INSTANCE_TENANCY.to_string(), i.tenancy.clone());
        if let Some(group) = &i.placement_group_id {
            out.labels.insert(LABEL_PLACEMENT_GROUP_ID.to_string(), group.clone());
        }
        if let Some(partition) = i.partition {
            out.labels.insert(LABEL_PLACEMENT_GROUP_PARTITION.to_string(), partition.to_string());
        }
        // As upstream, an instance is reserved only with the gate: one in an open reservation
        // stays on-demand.
        if let Some(reservation) = i.reservation.as_ref().filter(|_| self.options.reserved_capacity) {
            out.capacity_type = CAPACITY_TYPE_RESERVED.to_string();
            out.labels.insert(LABEL_CAPACITY_TYPE.to_string(), CAPACITY_TYPE_RESERVED.to_string());
            for (k, v) in reservation.labels() {
                out.labels.insert(k.to_string(), v);
            }
        }
        out
    }

    /// `i` annotated with the hash of the node class of `spec` and the hash's version.
    pub(super) fn with_annotations(&self, mut i: Instance, spec: &EC2NodeClassSpec) -> Instance {
        i.annotations.insert(ANNOTATION_EC2NODECLASS_HASH.to_string(), self.class_hash(spec));
        i.annotations
            .insert(ANNOTATION_EC2NODECLASS_HASH_VERSION.to_string(), NODE_CLASS_HASH_VERSION.to_string());
        i
    }

    /// The prefix of the names of the launch templates the provider creates.
    pub fn launch_template_name_prefix(&self) -> &'static str {
        launchtemplate::NAME_PREFIX
    }

    /// Fetches current spot prices (call periodically; failures keep the last known prices).
    pub async fn refresh_spot_prices(&self) -> Result<usize> {
        self.pricing.refresh_spot_prices(&self.clients.ec2).await
    }

    /// Fetches current on-demand prices of the clients' region from the Pricing API (call
    /// periodically; failures keep the last known prices, at first the static table).
    pub async fn refresh_on_demand_prices(&self) -> Result<usize> {
        self.pricing.refresh_on_demand_prices(&self.clients.pricing, &self.clients.region).await
    }

    /// Fetches the instance types and their zones again; a failure keeps the previous catalog.
    pub async fn refresh_catalog(&self) -> Result<usize> {
        Ok(self.catalog.refresh().await?.types.len())
    }

    /// The region's instance types as last fetched (vCPUs, memory, ...), without asking EC2;
    /// `None` before the first fetch.
    pub async fn known_instance_types(&self) -> Option<Arc<CatalogData>> {
        self.catalog.current().await
    }

    async fn is_drifted_impl(&self, node_claim: &NodeClaim) -> Result<Option<DriftReason>> {
        let mut answers = self.are_drifted_impl(&[node_claim]).await;
        answers.pop().unwrap_or(Ok(None))
    }

    /// Drift of many claims: one DescribeInstances per 200 of them.
    async fn are_drifted_impl(&self, node_claims: &[&NodeClaim]) -> Vec<Result<Option<DriftReason>>> {
        let ids: Vec<Result<Option<String>>> = node_claims
            .iter()
            .map(|c| match c.status.as_ref().and_then(|s| s.provider_id.as_deref()) {
                None => Ok(None),
                Some(pid) => crate::cloudprovider::parse_provider_id(pid).map(|(_, id)| Some(id)),
            })
            .collect();
        let wanted: Vec<String> = ids.iter().filter_map(|r| r.as_ref().ok().cloned().flatten()).collect();
        let found = match instance::get_many(&self.clients.ec2, &wanted).await {
            Ok(found) => found,
            Err(error) => {
                let message = crate::util::error_chain(&error);
                return node_claims
                    .iter()
                    .map(|_| {
                        Err(CloudProviderError::Api {
                            operation: "DescribeInstances",
                            code: String::new(),
                            message: message.clone(),
                            source: Box::new(std::io::Error::other(message.clone())),
                        })
                    })
                    .collect();
            }
        };
        let by_id: std::collections::HashMap<&str, &Ec2Instance> =
            found.iter().filter(|i| !i.is_terminated()).map(|i| (i.id.as_str(), i)).collect();
        // Which AMI each instance type would get is judged from the catalog's types; without a
        // catalog, any AMI of the class is taken as current.
        let catalog = self.catalog.get().await.ok();
        let mut type_requirements: HashMap<(&str, AmiFamily), Option<Requirements>> = HashMap::new();
        node_claims
            .iter()
            .zip(ids)
            .map(|(claim, id)| {
                let Some(id) = id? else { return Ok(None) };
                let (class, _) = self.ready_class(&claim.spec.node_class_ref.name)?;
                let inst = by_id.get(id.as_str()).ok_or_else(|| CloudProviderError::NotFound(id.clone()))?;
                let family = amifamily::family_of(&class.spec);
                let requirements =
                    type_requirements.entry((inst.instance_type.as_str(), family)).or_insert_with(|| {
                        let info = catalog.as_ref()?.types.iter().find(|t| t.name == inst.instance_type)?;
                        let mut r = instancetype::requirements(info, &self.clients.region);
                        instancetype::family_requirements(&mut r, info, family);
                        Some(r)
                    });
                self.drift_of(claim, inst, requirements.as_ref())
            })
            .collect()
    }

    /// Why `node_claim`, whose instance is `inst` (of an instance type with `type_requirements`,
    /// when known), drifted from its class, if it did.
    fn drift_of(
        &self,
        node_claim: &NodeClaim,
        inst: &Ec2Instance,
        type_requirements: Option<&Requirements>,
    ) -> Result<Option<DriftReason>> {
        let (class, status) = self.ready_class(&node_claim.spec.node_class_ref.name)?;
        // A hash of another scheme (an older one of upstream's, or this controller's former
        // `rs-v2`) cannot be compared with ours: the node-class controller re-stamps it.
        let annotations = node_claim.metadata.annotations.as_ref();
        let same_scheme =
            annotations.and_then(|a| a.get(ANNOTATION_EC2NODECLASS_HASH_VERSION)).map(String::as_str)
                == Some(NODE_CLASS_HASH_VERSION);
        let hash = annotations.and_then(|a| a.get(ANNOTATION_EC2NODECLASS_HASH)).filter(|_| same_scheme);
        let drifted =
            drift(inst, type_requirements, &status, hash.map(String::as_str), &self.class_hash(&class.spec));
        if drifted.is_some() {
            return Ok(drifted);
        }
        // In a reservation the class no longer selects (as upstream, with the gate).
        if let Some(reservation) = inst.reservation.as_ref().filter(|_| self.options.reserved_capacity)
            && !status.capacity_reservations.iter().any(|r| r.id == reservation.id)
        {
            return Ok(Some(DriftReason::CapacityReservation));
        }
        let claim_group = node_claim.metadata.labels.as_ref().and_then(|l| l.get(LABEL_PLACEMENT_GROUP_ID));
        let class_group = self.placement_group_of(&class)?.map(|g| g.id);
        Ok((claim_group != class_group.as_ref()).then_some(DriftReason::PlacementGroup))
    }
}

/// Why `inst` drifted from its class's resolved `status`, if it did. `claim_hash` is the class
/// hash recorded on the NodeClaim at launch. With the `type_requirements` of its instance type,
/// the instance must run the AMI that type would be launched with now (the newest one the type
/// can boot); without them, any AMI of the class will do.
pub fn drift(
    inst: &Ec2Instance,
    type_requirements: Option<&Requirements>,
    status: &EC2NodeClassStatus,
    claim_hash: Option<&str>,
    class_hash: &str,
) -> Option<DriftReason> {
    if claim_hash.is_some_and(|h| h != class_hash) {
        return Some(DriftReason::NodeClass);
    }
    let current_ami = match type_requirements {
        Some(requirements) => {
            fleet::ami_for(&status.amis, requirements).is_some_and(|a| a.id == inst.image_id)
        }
        None => status.amis.iter().any(|a| a.id == inst.image_id),
    };
    if !current_ami {
        return Some(DriftReason::Ami);
    }
    if !status.subnets.iter().any(|s| s.id == inst.subnet_id) {
        return Some(DriftReason::Subnet);
    }
    let want: BTreeSet<&str> = status.security_groups.iter().map(|g| g.id.as_str()).collect();
    let have: BTreeSet<&str> = inst.security_group_ids.iter().map(String::as_str).collect();
    if want != have {
        return Some(DriftReason::SecurityGroup);
    }
    None
}

/// Hash of the parts of a class spec whose change makes its nodes drift, for a controller
/// trusting `ca_bundle` (base64 PEM, empty when none): upstream's `EC2NodeClass.Hash(caBundle)`
/// ([`crate::apis::hash::ec2nodeclass_hash`]): everything but the selector terms (whose effect
/// is checked through the resolved subnets, groups and AMIs), with the AMI family as resolved
/// rather than as written (so writing `amiFamily: AL2023` next to an `al2023@latest` alias
/// drifts nothing), and the CA bundle.
pub fn node_class_hash(spec: &EC2NodeClassSpec, ca_bundle: &str) -> String {
    crate::apis::hash::ec2nodeclass_hash(spec, ca_bundle)
}

impl CloudProvider for AwsCloudProvider {
    fn create<'a>(&'a self, node_claim: &'a NodeClaim) -> BoxFuture<'a, Result<Instance>> {
        Box::pin(self.create_impl(node_claim))
    }

    fn delete<'a>(&'a self, node_claim: &'a NodeClaim) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move {
            let claim = node_claim.metadata.name.clone().unwrap_or_default();
            let id = match node_claim.status.as_ref().and_then(|s| s.provider_id.as_deref()) {
                Some(pid) => crate::cloudprovider::parse_provider_id(pid)?.1,
                // Launched but not recorded yet: find the instance by its tag.
                None => {
                    match instance::find_by_node_claim(&self.clients.ec2, &self.cluster.name, &claim).await? {
                        Some(i) => i.id,
                        None => return Err(CloudProviderError::NotFound(claim)),
                    }
                }
            };
            let result = instance::terminate(&self.clients.ec2, &id).await;
            // Gone: its slot in its reservation is free again (as upstream, counted once the
            // instance is found gone, which ends the NodeClaim's termination).
            if let Err(CloudProviderError::NotFound(_)) = &result
                && let Some(reservation) = node_claim.labels().get(LABEL_CAPACITY_RESERVATION_ID)
            {
                self.reservations.terminated(reservation);
            }
            result
        })
    }

    fn get<'a>(&'a self, provider_id: &'a str) -> BoxFuture<'a, Result<Instance>> {
        Box::pin(async move {
            let (_, id) = crate::cloudprovider::parse_provider_id(provider_id)?;
            let inst = instance::get(&self.clients.ec2, &id).await?;
            Ok(self.to_instance(&inst).await)
        })
    }

    fn list(&self) -> BoxFuture<'_, Result<Vec<Instance>>> {
        Box::pin(async move {
            let mut out = Vec::new();
            for inst in instance::list(&self.clients.ec2, &self.cluster.name).await? {
                out.push(self.to_instance(&inst).await);
            }
            Ok(out)
        })
    }

    fn instance_types<'a>(
        &'a self,
        node_pool: &'a NodePool,
    ) -> BoxFuture<'a, Result<Vec<Arc<InstanceType>>>> {
        Box::pin(async move {
            let (class, _) = self.ready_class(&node_pool.spec.template.spec.node_class_ref.name)?;
            let types: Vec<Arc<InstanceType>> =
                self.instance_types_for_class(&class).await?.into_iter().map(Arc::new).collect();
            let pool = Requirements::from_nodepool(&node_pool.spec.template.spec.requirements)
                .map_err(|e| CloudProviderError::Config(format!("requirements of the nodepool: {e}")))?;
            Ok(nodecost::for_pool(&types, &pool, self.options.burstable_cpu))
        })
    }

    fn is_drifted<'a>(&'a self, node_claim: &'a NodeClaim) -> BoxFuture<'a, Result<Option<DriftReason>>> {
        Box::pin(self.is_drifted_impl(node_claim))
    }

    fn are_drifted<'a>(
        &'a self,
        node_claims: &'a [&'a NodeClaim],
    ) -> BoxFuture<'a, Vec<Result<Option<DriftReason>>>> {
        Box::pin(self.are_drifted_impl(node_claims))
    }

    fn repair_policies(&self) -> Vec<crate::disruption::repair::RepairPolicy> {
        repair_policies()
    }

    fn name(&self) -> &'static str {
        "aws"
    }
}

/// The conditions node repair acts on for EC2 nodes: the kubelet's `Ready`, and those the EKS
/// node monitoring agent reports (accelerated hardware after 10 minutes, the rest after 30).
pub fn repair_policies() -> Vec<crate::disruption::repair::RepairPolicy> {
    use crate::disruption::repair::{KUBELET_REPAIR_POLICIES, RepairPolicy};
    let agent = |condition_type, minutes: u64| RepairPolicy {
        condition_type,
        status: "False",
        toleration: Duration::from_secs(minutes * 60),
    };
    let mut policies = KUBELET_REPAIR_POLICIES.to_vec();
    policies.extend([
        agent("AcceleratedHardwareReady", 10),
        agent("StorageReady", 30),
        agent("NetworkingReady", 30),
        agent("KernelReady", 30),
        agent("ContainerRuntimeReady", 30),
    ]);
    policies
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apis::ec2nodeclass::{AmiStatus, SecurityGroupStatus, SubnetStatus};

    #[test]
    fn seeding_the_store_keeps_what_the_controller_resolved() {
        let class = |name: &str, subnet: &str, deleted: bool| {
            let mut c: EC2NodeClass = serde_json::from_value(serde_json::json!({
                "apiVersion": "karpenter.k8s.aws/v1", "kind": "EC2NodeClass",
                "metadata": {"name": name},
                "spec": {
                    "amiSelectorTerms": [{"alias": "al2023@latest"}],
                    "subnetSelectorTerms": [{"id": "subnet-x"}],
                    "securityGroupSelectorTerms": [{"id": "sg-x"}],
                    "role": "node-role"
                }
            }))
            .unwrap();
            c.status = Some(EC2NodeClassStatus {
                subnets: vec![SubnetStatus { id: subnet.into(), zone: "us-west-2a".into(), zone_id: None }],
                ..Default::default()
            });
            if deleted {
                c.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                    "2026-01-01T00:00:00Z".parse().unwrap(),
                ));
            }
            c
        };
        let subnet = |store: &NodeClassStore, name: &str| {
            store.get(name).and_then(|c| c.status.as_ref()?.subnets.first().map(|s| s.id.clone()))
        };
        let store = NodeClassStore::default();
        store.upsert(class("resolved", "subnet-new", false));
        let added = store.seed([
            class("resolved", "subnet-old", false),
            class("persisted", "subnet-p", false),
            class("going", "subnet-g", true),
        ]);
        assert_eq!(added, 1);
        assert_eq!(subnet(&store, "resolved").as_deref(), Some("subnet-new"), "the controller's copy wins");
        assert_eq!(subnet(&store, "persisted").as_deref(), Some("subnet-p"), "the API's status is used");
        assert!(store.get("going").is_none(), "a class being deleted launches nothing");
    }

    #[test]
    fn versions_from_the_api_server() {
        assert_eq!(minor_version("1", "34"), "1.34");
        assert_eq!(minor_version("1", "33+"), "1.33");
    }

    #[test]
    fn drift_reasons() {
        let status = EC2NodeClassStatus {
            subnets: vec![SubnetStatus { id: "subnet-1".into(), zone: "a".into(), zone_id: None }],
            security_groups: vec![SecurityGroupStatus { id: "sg-1".into(), name: None }],
            amis: vec![AmiStatus { id: "ami-1".into(), ..Default::default() }],
            ..Default::default()
        };
        let inst = Ec2Instance {
            image_id: "ami-1".into(),
            subnet_id: "subnet-1".into(),
            security_group_ids: vec!["sg-1".into()],
            ..Default::default()
        };
        assert_eq!(drift(&inst, None, &status, Some("h"), "h"), None);
        assert_eq!(drift(&inst, None, &status, Some("old"), "h"), Some(DriftReason::NodeClass));
        assert_eq!(
            drift(&Ec2Instance { image_id: "ami-0".into(), ..inst.clone() }, None, &status, None, "h"),
            Some(DriftReason::Ami)
        );
        assert_eq!(
            drift(&Ec2Instance { subnet_id: "subnet-0".into(), ..inst.clone() }, None, &status, None, "h"),
            Some(DriftReason::Subnet)
        );
        assert_eq!(
            drift(
                &Ec2Instance { security_group_ids: vec!["sg-1".into(), "sg-2".into()], ..inst.clone() },
                None,
                &status,
                None,
                "h"
            ),
            Some(DriftReason::SecurityGroup)
        );

        // With the instance type known, the node must run the AMI that type gets now: a node
        // without GPUs on the class's GPU image has drifted, though the image is the class's.
        let requirement = |key: &str, operator: &str| k8s_openapi::api::core::v1::NodeSelectorRequirement {
            key: key.into(),
            operator: operator.into(),
            values: None,
        };
        let status = EC2NodeClassStatus {
            amis: vec![
                AmiStatus {
                    id: "ami-gpu".into(),
                    requirements: vec![requirement(LABEL_INSTANCE_GPU_COUNT, "Exists")],
                    ..Default::default()
                },
                AmiStatus {
                    id: "ami-std".into(),
                    requirements: vec![requirement(LABEL_INSTANCE_GPU_COUNT, "DoesNotExist")],
                    ..Default::default()
                },
            ],
            ..status
        };
        let mut no_gpu = Requirements::new();
        no_gpu.add(LABEL_INSTANCE_GPU_COUNT, crate::scheduling::Requirement::does_not_exist());
        let mut gpu = Requirements::new();
        gpu.add(LABEL_INSTANCE_GPU_COUNT, crate::scheduling::Requirement::in_values(["1"]));
        let on = |ami: &str| Ec2Instance { image_id: ami.into(), ..inst.clone() };
        assert_eq!(drift(&on("ami-std"), Some(&no_gpu), &status, None, "h"), None);
        assert_eq!(drift(&on("ami-gpu"), Some(&gpu), &status, None, "h"), None);
        assert_eq!(drift(&on("ami-gpu"), Some(&no_gpu), &status, None, "h"), Some(DriftReason::Ami));
        assert_eq!(drift(&on("ami-std"), Some(&gpu), &status, None, "h"), Some(DriftReason::Ami));
        assert_eq!(
            drift(&on("ami-gpu"), None, &status, None, "h"),
            None,
            "type unknown: any image of the class"
        );
    }
}

#[cfg(test)]
mod kube_dns_tests {
    use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
    use kube::api::{DeleteParams, ObjectMeta, PostParams};

    #[tokio::test]
    #[ignore = "needs the local control plane"]
    async fn nodes_get_the_kube_dns_service_address() {
        let client = kube::Client::try_default().await.unwrap();
        let services: kube::Api<Service> = kube::Api::namespaced(client.clone(), "kube-system");
        let created = match services.get_opt("kube-dns").await.unwrap() {
            Some(_) => false,
            None => {
                let service = Service {
                    metadata: ObjectMeta { name: Some("kube-dns".into()), ..Default::default() },
                    spec: Some(ServiceSpec {
                        ports: Some(vec![ServicePort {
                            port: 53,
                            name: Some("dns".into()),
                            ..Default::default()
                        }]),
                        ..Default::default()
                    }),
                    ..Default::default()
                };
                services.create(&PostParams::default(), &service).await.unwrap();
                true
            }
        };
        let want = services.get("kube-dns").await.unwrap().spec.unwrap().cluster_ip.unwrap();
        let got = super::kube_dns_ip(&client).await;
        if created {
            services.delete("kube-dns", &DeleteParams::default()).await.unwrap();
            // Without the Service there is nothing to find.
            tokio::time::sleep(std::time::Duration::from_millis(500)).await;
            assert_eq!(super::kube_dns_ip(&client).await, None);
        }
        assert_eq!(got, Some(want));
    }
}

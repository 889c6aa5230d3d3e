//! `EC2NodeClass` (karpenter.k8s.aws/v1): the AWS side of a node: subnets, security groups, AMIs,
//! IAM, user data, kubelet settings, block devices and instance metadata options.

use std::collections::BTreeMap;

use kube::{CustomResource, KubeSchema};
use schemars::{JsonSchema, Schema};
use serde::{Deserialize, Serialize};

use super::common::*;
use super::labels;

/// Version of the node-class hash written to NodeClaims: upstream's `EC2NodeClassHashVersion`,
/// as the hash is upstream's (`cloudprovider::aws::provider::node_class_hash`). A NodeClaim
/// stamped with another version (such as `rs-v2`, this controller's former scheme) is
/// re-stamped rather than compared.
pub const NODE_CLASS_HASH_VERSION: &str = "v5";

/// AMI families whose alias `family@version` resolves through SSM.
pub const ALIAS_FAMILIES: &[&str] =
    &["al2", "al2023", "bottlerocket", "windows2019", "windows2022", "windows2025"];

/// Tag keys Karpenter sets itself on everything it launches; users may not set them.
pub const RESTRICTED_TAG_KEYS: &[&str] = &[
    labels::TAG_EKS_CLUSTER_NAME,
    labels::LABEL_NODEPOOL,
    labels::TAG_NODECLAIM,
    labels::LABEL_EC2NODECLASS,
];

/// Specification of an EC2NodeClass.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    doc = "EC2NodeClass is the Schema for the EC2NodeClass API: the AWS configuration of the nodes Karpenter launches.",
    group = "karpenter.k8s.aws",
    version = "v1",
    kind = "EC2NodeClass",
    plural = "ec2nodeclasses",
    singular = "ec2nodeclass",
    shortname = "ec2nc",
    shortname = "ec2ncs",
    category = "karpenter",
    status = "EC2NodeClassStatus",
    derive = "PartialEq",
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status"
    ),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp"),
    printcolumn(name = "Role", type_ = "string", json_path = ".spec.role", priority = "1")
)]
#[x_kube(validation = Rule::new("(has(self.role) && !has(self.instanceProfile)) || (!has(self.role) && has(self.instanceProfile))").message("must specify exactly one of ['role', 'instanceProfile']"))]
#[x_kube(validation = Rule::new("self.amiSelectorTerms.exists(x, has(x.alias)) ? true : has(self.amiFamily)").message("must specify amiFamily if amiSelectorTerms does not contain an alias"))]
#[schemars(transform = add_alias_family_rules)]
#[serde(rename_all = "camelCase")]
pub struct EC2NodeClassSpec {
    /// Which subnets nodes may be launched into.
    #[schemars(length(max = 30))]
    #[x_kube(validation = Rule::new("self.size() != 0").message("subnetSelectorTerms cannot be empty"))]
    #[x_kube(validation = Rule::new("self.all(x, has(x.tags) || has(x.id))").message("expected at least one, got none, ['tags', 'id']"))]
    #[x_kube(validation = Rule::new("!self.all(x, has(x.id) && has(x.tags))").message("'id' is mutually exclusive, cannot be set with a combination of other fields in a subnet selector term"))]
    pub subnet_selector_terms: Vec<SubnetSelectorTerm>,
    /// Which security groups nodes get.
    #[schemars(length(max = 30))]
    #[x_kube(validation = Rule::new("self.size() != 0").message("securityGroupSelectorTerms cannot be empty"))]
    #[x_kube(validation = Rule::new("self.all(x, has(x.tags) || has(x.id) || has(x.name))").message("expected at least one, got none, ['tags', 'id', 'name']"))]
    #[x_kube(validation = Rule::new("!self.all(x, has(x.id) && (has(x.tags) || has(x.name)))").message("'id' is mutually exclusive, cannot be set with a combination of other fields in a security group selector term"))]
    #[x_kube(validation = Rule::new("!self.all(x, has(x.name) && (has(x.tags) || has(x.id)))").message("'name' is mutually exclusive, cannot be set with a combination of other fields in a security group selector term"))]
    pub security_group_selector_terms: Vec<SecurityGroupSelectorTerm>,
    /// Which capacity reservations nodes may be launched into.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 30))]
    #[x_kube(validation = Rule::new("self.all(x, has(x.tags) || has(x.id) || has(x.instanceMatchCriteria))").message("expected at least one, got none, ['tags', 'id', 'instanceMatchCriteria']"))]
    #[x_kube(validation = Rule::new("!self.all(x, has(x.id) && (has(x.tags) || has(x.ownerID) || has(x.instanceMatchCriteria)))").message("'id' is mutually exclusive, cannot be set along with other fields in a capacity reservation selector term"))]
    pub capacity_reservation_selector_terms: Vec<CapacityReservationSelectorTerm>,
    /// Which AMIs nodes boot: an alias, or AMIs selected by id, name, owner, tags or SSM parameter.
    #[schemars(length(min = 1, max = 30))]
    #[x_kube(validation = Rule::new("self.size() != 0").message("amiSelectorTerms cannot be empty"))]
    #[x_kube(validation = Rule::new("self.all(x, has(x.tags) || has(x.id) || has(x.name) || has(x.alias) || has(x.ssmParameter))").message("expected at least one, got none, ['tags', 'id', 'name', 'alias', 'ssmParameter']"))]
    #[x_kube(validation = Rule::new("!self.exists(x, has(x.id) && (has(x.alias) || has(x.tags) || has(x.name) || has(x.owner)))").message("'id' is mutually exclusive, cannot be set with a combination of other fields in amiSelectorTerms"))]
    #[x_kube(validation = Rule::new("!self.exists(x, has(x.alias) && (has(x.id) || has(x.tags) || has(x.name) || has(x.owner)))").message("'alias' is mutually exclusive, cannot be set with a combination of other fields in amiSelectorTerms"))]
    #[x_kube(validation = Rule::new("!(self.exists(x, has(x.alias)) && self.size() != 1)").message("'alias' is mutually exclusive, cannot be set with a combination of other amiSelectorTerms"))]
    pub ami_selector_terms: Vec<AmiSelectorTerm>,
    /// AMI family, selecting the bootstrap format; implied by an alias.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ami_family: Option<AmiFamily>,
    /// IAM role for the nodes; Karpenter creates and manages an instance profile for it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self != ''").message("role cannot be empty"))]
    pub role: Option<String>,
    /// Existing IAM instance profile for the nodes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self != ''").message("instanceProfile cannot be empty"))]
    pub instance_profile: Option<String>,
    /// User data merged with (or, for Custom, replacing) the bootstrap Karpenter generates.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_data: Option<String>,
    /// Tags for instances, volumes, launch templates and fleets.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(transform = add_tag_rules)]
    pub tags: BTreeMap<String, String>,
    /// Kubelet settings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubelet: Option<KubeletConfiguration>,
    /// Block device mappings of the instances.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 50))]
    #[x_kube(validation = Rule::new("self.filter(x, has(x.rootVolume) ? x.rootVolume == true : false).size() <= 1").message("must have only one blockDeviceMappings with rootVolume"))]
    pub block_device_mappings: Vec<BlockDeviceMapping>,
    /// What to do with instance-store volumes (`RAID0`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance_store_policy: Option<InstanceStorePolicy>,
    /// Whether detailed CloudWatch monitoring is enabled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detailed_monitoring: Option<bool>,
    /// Whether instances get a public IPv4 address (subnet default when unset).
    #[serde(default, rename = "associatePublicIPAddress", skip_serializing_if = "Option::is_none")]
    pub associate_public_ip_address: Option<bool>,
    /// IPv4 prefixes assigned to the primary network interface of each instance.
    #[serde(default, rename = "ipPrefixCount", skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub ip_prefix_count: Option<i32>,
    /// Idle connection-tracking timeouts of the network interfaces of the launch template.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connection_tracking: Option<ConnectionTracking>,
    /// EC2's reserved `Context` field, passed on CreateFleet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context: Option<String>,
    /// The network interfaces of each instance, replacing the single primary interface (and
    /// the EFA interfaces an EFA request would get).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 150))]
    #[x_kube(validation = Rule::new("self.size() == 0 || self.exists(x, x.deviceIndex == 0 && x.networkCardIndex == 0 && x.interfaceType == 'interface')").message("networkInterfaces must include a primary interface with interfaceType='interface'"))]
    #[x_kube(validation = Rule::new("self.all(x, self.filter(y, x.networkCardIndex == y.networkCardIndex && x.deviceIndex == y.deviceIndex).size() == 1 && (x.interfaceType != 'efa-only' || self.filter(y, x.networkCardIndex == y.networkCardIndex && y.interfaceType == 'efa-only').size() == 1))").message("networkInterfaces must not have duplicate networkCardIndex and deviceIndex pairs, and can have at most one efa device per network card"))]
    pub network_interfaces: Vec<NetworkInterface>,
    /// The placement group instances are launched into, by name or id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub placement_group_selector: Option<PlacementGroupSelector>,
    /// CPU options of the instances.
    #[serde(default, rename = "cpuOptions", skip_serializing_if = "Option::is_none")]
    pub cpu_options: Option<CpuOptions>,
    /// Instance metadata service options.
    #[serde(default = "default_metadata_options")]
    #[schemars(extend("default" = {"httpEndpoint": "enabled", "httpProtocolIPv6": "disabled", "httpPutResponseHopLimit": 1, "httpTokens": "required"}))]
    pub metadata_options: MetadataOptions,
}

/// A network interface of each instance.
#[derive(Serialize, Deserialize, KubeSchema, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct NetworkInterface {
    /// The network card it is attached to.
    #[schemars(range(min = 0))]
    pub network_card_index: i32,
    /// Its device index on that card.
    #[schemars(range(min = 0))]
    pub device_index: i32,
    /// `interface` (ENA) or `efa-only`.
    pub interface_type: InterfaceType,
}

/// The kind of a [`NetworkInterface`].
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum InterfaceType {
    /// An ENA interface, with IP addresses.
    #[serde(rename = "interface")]
    Interface,
    /// An EFA device without IP addresses.
    #[serde(rename = "efa-only")]
    EfaOnly,
}

impl InterfaceType {
    /// As EC2 and the CRD spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            InterfaceType::Interface => "interface",
            InterfaceType::EfaOnly => "efa-only",
        }
    }
}

/// Selects a placement group by name or by id.
#[derive(Serialize, Deserialize, KubeSchema, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.name) || has(self.id)").message("expected at least one, got none, ['name', 'id']"))]
#[x_kube(validation = Rule::new("!(has(self.name) && has(self.id))").message("'name' and 'id' are mutually exclusive"))]
pub struct PlacementGroupSelector {
    /// The placement group's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1))]
    pub name: Option<String>,
    /// The placement group's id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^pg-[0-9a-z]+$"))]
    pub id: Option<String>,
}

/// CPU options of the instances.
#[derive(Serialize, Deserialize, KubeSchema, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct CpuOptions {
    /// `enabled` limits the instance types to those that support nested virtualization and
    /// turns it on; `disabled` turns it off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("enum" = ["enabled", "disabled"]))]
    pub nested_virtualization: Option<String>,
}

/// Idle connection-tracking timeouts, in seconds, of the network interfaces a launch template
/// defines (EC2's defaults when unset).
#[derive(Serialize, Deserialize, KubeSchema, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.tcpEstablishedTimeout) || has(self.udpStreamTimeout) || has(self.udpTimeout)").message("at least one of tcpEstablishedTimeout, udpStreamTimeout, or udpTimeout must be set"))]
pub struct ConnectionTracking {
    /// Idle established TCP connections (60 to 432,000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 60, max = 432000))]
    pub tcp_established_timeout: Option<i32>,
    /// Idle UDP flows that saw more than one request-response transaction (60 to 180).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 60, max = 180))]
    pub udp_stream_timeout: Option<i32>,
    /// Other idle UDP flows (30 to 60).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 30, max = 60))]
    pub udp_timeout: Option<i32>,
}

/// Selects subnets by tags or id.
#[derive(Serialize, Deserialize, KubeSchema, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct SubnetSelectorTerm {
    /// Tags a subnet must all have (`*` matches any value).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("maxProperties" = 20))]
    #[x_kube(validation = Rule::new("self.all(k, k != '' && self[k] != '')").message("empty tag keys or values aren't supported"))]
    pub tags: Option<BTreeMap<String, String>>,
    /// Subnet id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^subnet-[0-9a-z]+$"))]
    pub id: Option<String>,
}

/// Selects security groups by tags, id or name.
#[derive(Serialize, Deserialize, KubeSchema, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct SecurityGroupSelectorTerm {
    /// Tags a security group must all have.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("maxProperties" = 20))]
    #[x_kube(validation = Rule::new("self.all(k, k != '' && self[k] != '')").message("empty tag keys or values aren't supported"))]
    pub tags: Option<BTreeMap<String, String>>,
    /// Security group id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^sg-[0-9a-z]+$"))]
    pub id: Option<String>,
    /// Security group name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

/// Selects capacity reservations by tags, id or owner.
#[derive(Serialize, Deserialize, KubeSchema, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct CapacityReservationSelectorTerm {
    /// Tags a reservation must all have.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("maxProperties" = 20))]
    #[x_kube(validation = Rule::new("self.all(k, k != '' && self[k] != '')").message("empty tag keys or values aren't supported"))]
    pub tags: Option<BTreeMap<String, String>>,
    /// Reservation id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^cr-[0-9a-z]+$"))]
    pub id: Option<String>,
    /// Owning AWS account id.
    #[serde(default, rename = "ownerID", skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^[0-9]{12}$"))]
    pub owner_id: Option<String>,
    /// `open` or `targeted` reservations.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("enum" = ["open", "targeted"]))]
    pub instance_match_criteria: Option<String>,
}

/// Selects AMIs.
#[derive(Serialize, Deserialize, KubeSchema, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct AmiSelectorTerm {
    /// `family@version`, e.g. `al2023@latest` or `bottlerocket@v1.20.0`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 30))]
    #[schemars(transform = add_alias_rules)]
    pub alias: Option<String>,
    /// Tags an AMI must all have.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("maxProperties" = 20))]
    #[x_kube(validation = Rule::new("self.all(k, k != '' && self[k] != '')").message("empty tag keys or values aren't supported"))]
    pub tags: Option<BTreeMap<String, String>>,
    /// AMI id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^ami-[0-9a-z]+$"))]
    pub id: Option<String>,
    /// AMI name (wildcards allowed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// AMI owner: an account id or `self`/`amazon`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    /// SSM parameter holding an AMI id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ssm_parameter: Option<String>,
}

/// AMI family: decides the bootstrap format of the user data.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AmiFamily {
    /// Amazon Linux 2 (bootstrap.sh).
    AL2,
    /// Amazon Linux 2023 (nodeadm NodeConfig).
    AL2023,
    /// Bottlerocket (TOML settings).
    Bottlerocket,
    /// User data passed through verbatim.
    Custom,
    /// Windows Server 2019.
    Windows2019,
    /// Windows Server 2022.
    Windows2022,
    /// Windows Server 2025.
    Windows2025,
}

/// Instance-store handling.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, PartialEq, Eq)]
pub enum InstanceStorePolicy {
    /// Combine instance-store volumes into a RAID0 array used for ephemeral storage.
    RAID0,
}

/// Kubelet settings for the nodes of this class.
#[derive(Serialize, Deserialize, KubeSchema, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.imageGCHighThresholdPercent) && has(self.imageGCLowThresholdPercent) ? self.imageGCHighThresholdPercent > self.imageGCLowThresholdPercent : true").message("imageGCHighThresholdPercent must be greater than imageGCLowThresholdPercent"))]
#[x_kube(validation = Rule::new("has(self.evictionSoft) ? self.evictionSoft.all(e, (e in self.evictionSoftGracePeriod)) : true").message("evictionSoft OwnerKey does not have a matching evictionSoftGracePeriod"))]
#[x_kube(validation = Rule::new("has(self.evictionSoftGracePeriod) ? self.evictionSoftGracePeriod.all(e, (e in self.evictionSoft)) : true").message("evictionSoftGracePeriod OwnerKey does not have a matching evictionSoft"))]
pub struct KubeletConfiguration {
    /// Cluster DNS server addresses.
    #[serde(rename = "clusterDNS", default, skip_serializing_if = "Option::is_none")]
    pub cluster_dns: Option<Vec<String>>,
    /// Maximum number of pods per node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub max_pods: Option<i32>,
    /// Maximum number of pods per vCPU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub pods_per_core: Option<i32>,
    /// Resources reserved for the operating system.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(transform = add_system_reserved_rules)]
    pub system_reserved: Option<BTreeMap<String, String>>,
    /// Resources reserved for Kubernetes system daemons.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(transform = add_kube_reserved_rules)]
    pub kube_reserved: Option<BTreeMap<String, String>>,
    /// Hard eviction thresholds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(transform = add_eviction_hard_rules)]
    pub eviction_hard: Option<BTreeMap<String, String>>,
    /// Soft eviction thresholds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(transform = add_eviction_soft_rules)]
    pub eviction_soft: Option<BTreeMap<String, String>>,
    /// Grace periods of the soft eviction thresholds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(transform = add_eviction_soft_grace_rules)]
    pub eviction_soft_grace_period: Option<BTreeMap<String, String>>,
    /// Maximum pod termination grace period for soft evictions, in seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eviction_max_pod_grace_period: Option<i32>,
    /// Disk usage percentage that always triggers image garbage collection.
    #[serde(rename = "imageGCHighThresholdPercent", default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 100))]
    pub image_gc_high_threshold_percent: Option<i32>,
    /// Disk usage percentage that image garbage collection frees down to.
    #[serde(rename = "imageGCLowThresholdPercent", default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 100))]
    pub image_gc_low_threshold_percent: Option<i32>,
    /// Whether CPU CFS quota is enforced for containers with CPU limits.
    #[serde(rename = "cpuCFSQuota", default, skip_serializing_if = "Option::is_none")]
    pub cpu_cfs_quota: Option<bool>,
}

/// Signals kubelet accepts as eviction thresholds.
pub const EVICTION_SIGNALS: &[&str] = &[
    "memory.available",
    "nodefs.available",
    "nodefs.inodesFree",
    "imagefs.available",
    "imagefs.inodesFree",
    "pid.available",
];

/// A percentage or a quantity, as eviction thresholds are written.
pub const EVICTION_THRESHOLD_PATTERN: &str = r"^((\d{1,2}(\.\d{1,2})?|100(\.0{1,2})?)%||(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?)$";

/// Resources that may be reserved for the system or for Kubernetes.
pub const RESERVABLE_RESOURCES: &[&str] = &["cpu", "memory", "ephemeral-storage", "pid"];

fn quoted_list(items: &[&str]) -> String {
    items.iter().map(|s| format!("'{s}'")).collect::<Vec<_>>().join(",")
}

fn add_reserved_rules(schema: &mut Schema, field: &str) {
    let list = quoted_list(RESERVABLE_RESOURCES);
    let any_of = RESERVABLE_RESOURCES.iter().map(|r| format!("x=='{r}'")).collect::<Vec<_>>().join(" || ");
    push_rule(schema, &format!("self.all(x, {any_of})"), &format!("valid keys for {field} are [{list}]"));
    push_rule(
        schema,
        "self.all(x, !self[x].startsWith('-'))",
        &format!("{field} value cannot be a negative resource quantity"),
    );
}

fn add_system_reserved_rules(schema: &mut Schema) {
    add_reserved_rules(schema, "systemReserved");
}

fn add_kube_reserved_rules(schema: &mut Schema) {
    add_reserved_rules(schema, "kubeReserved");
}

fn add_eviction_rules(schema: &mut Schema, field: &str) {
    let list = quoted_list(EVICTION_SIGNALS);
    if field != "evictionSoftGracePeriod" {
        schema.ensure_object().insert(
            "additionalProperties".to_string(),
            serde_json::json!({"type": "string", "pattern": EVICTION_THRESHOLD_PATTERN}),
        );
    }
    push_rule(
        schema,
        &format!("self.all(x, x in [{list}])"),
        &format!("valid keys for {field} are [{list}]"),
    );
}

fn add_eviction_hard_rules(schema: &mut Schema) {
    add_eviction_rules(schema, "evictionHard");
}

fn add_eviction_soft_rules(schema: &mut Schema) {
    add_eviction_rules(schema, "evictionSoft");
}

fn add_eviction_soft_grace_rules(schema: &mut Schema) {
    add_eviction_rules(schema, "evictionSoftGracePeriod");
}

fn add_alias_rules(schema: &mut Schema) {
    push_rule(
        schema,
        "self.matches('^[a-zA-Z0-9]+@.+$')",
        "'alias' is improperly formatted, must match the format 'family@version'",
    );
    let families = quoted_list(ALIAS_FAMILIES);
    push_rule(
        schema,
        &format!("self.split('@')[0] in [{families}]"),
        &format!("family is not supported, must be one of the following: {}", families.replace(',', ", ")),
    );
    push_rule(
        schema,
        "self.split('@')[0] in ['windows2019','windows2022','windows2025'] ? self.split('@')[1] == 'latest' : true",
        "windows families may only specify version 'latest'",
    );
}

/// When both an alias and `amiFamily` are given, the family must match the alias (or be Custom).
fn add_alias_family_rules(schema: &mut Schema) {
    for (alias, family) in [
        ("al2", "AL2"),
        ("al2023", "AL2023"),
        ("bottlerocket", "Bottlerocket"),
        ("windows2019", "Windows2019"),
        ("windows2022", "Windows2022"),
        ("windows2025", "Windows2025"),
    ] {
        let article = if alias == "al2" || alias == "al2023" { "an" } else { "a" };
        push_rule(
            schema,
            &format!(
                "!has(self.amiFamily) || (self.amiSelectorTerms.exists(x, has(x.alias) && x.alias.find('^[^@]+') == '{alias}') ? (self.amiFamily == 'Custom' || self.amiFamily == '{family}') : true)"
            ),
            &format!("if set, amiFamily must be '{family}' or 'Custom' when using {article} {family} alias"),
        );
    }
}

fn add_tag_rules(schema: &mut Schema) {
    push_rule(schema, "self.all(k, k != '')", "empty tag keys aren't supported");
    for key in RESTRICTED_TAG_KEYS {
        push_rule(
            schema,
            &format!("self.all(k, k != '{key}')"),
            &format!("tag contains a restricted tag matching {key}"),
        );
    }
    push_rule(
        schema,
        "self.all(k, !k.startsWith('kubernetes.io/cluster'))",
        "tag contains a restricted tag matching kubernetes.io/cluster/",
    );
}

/// A block device of the instances.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct BlockDeviceMapping {
    /// Device name (`/dev/xvda`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_name: Option<String>,
    /// EBS volume settings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ebs: Option<BlockDevice>,
    /// Whether this is the root volume, whose size sets the node's ephemeral storage.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub root_volume: Option<bool>,
}

/// EBS volume settings.
#[derive(Serialize, Deserialize, KubeSchema, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.snapshotID) || has(self.volumeSize)").message("snapshotID or volumeSize must be defined"))]
#[x_kube(validation = Rule::new("!has(self.volumeInitializationRate) || (has(self.snapshotID) && self.snapshotID != '')").message("snapshotID must be set when volumeInitializationRate is set"))]
pub struct BlockDevice {
    /// Delete the volume when the instance terminates.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delete_on_termination: Option<bool>,
    /// Encrypt the volume.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encrypted: Option<bool>,
    /// Provisioned IOPS (io1, io2, gp3).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub iops: Option<i64>,
    /// KMS key for encryption.
    #[serde(default, rename = "kmsKeyID", skip_serializing_if = "Option::is_none")]
    pub kms_key_id: Option<String>,
    /// Snapshot to create the volume from.
    #[serde(default, rename = "snapshotID", skip_serializing_if = "Option::is_none")]
    pub snapshot_id: Option<String>,
    /// Throughput in MiB/s (gp3).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub throughput: Option<i64>,
    /// Rate in MiB/s at which the snapshot's blocks are loaded into the new volume (100 to 300;
    /// only with `snapshotID`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 100, max = 300))]
    pub volume_initialization_rate: Option<i32>,
    /// Volume size, e.g. `20Gi`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(
        pattern = r"^((?:[1-9][0-9]{0,3}|[1-4][0-9]{4}|[5][0-8][0-9]{3}|59000)Gi|(?:[1-9][0-9]{0,3}|[1-5][0-9]{4}|[6][0-3][0-9]{3}|64000)G|([1-9]||[1-5][0-7]|58)Ti|([1-9]||[1-5][0-9]|6[0-3]|64)T)$"
    ))]
    pub volume_size: Option<String>,
    /// Volume type.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume_type: Option<VolumeType>,
}

/// EBS volume type.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum VolumeType {
    /// Magnetic.
    Standard,
    /// Provisioned IOPS SSD.
    Io1,
    /// Provisioned IOPS SSD, second generation.
    Io2,
    /// General purpose SSD.
    Gp2,
    /// Cold HDD.
    Sc1,
    /// Throughput-optimized HDD.
    St1,
    /// General purpose SSD, third generation.
    Gp3,
}

/// Instance metadata service options.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct MetadataOptions {
    /// `enabled` or `disabled`.
    #[serde(default = "enabled")]
    #[schemars(extend("enum" = ["enabled", "disabled"]))]
    pub http_endpoint: String,
    /// IPv6 endpoint of IMDS: `enabled` or `disabled`.
    #[serde(default = "disabled", rename = "httpProtocolIPv6")]
    #[schemars(extend("enum" = ["enabled", "disabled"]))]
    pub http_protocol_ipv6: String,
    /// Hop limit of IMDS responses.
    #[serde(default = "one")]
    #[schemars(range(min = 1, max = 64))]
    pub http_put_response_hop_limit: i64,
    /// `required` (IMDSv2) or `optional`.
    #[serde(default = "required")]
    #[schemars(extend("enum" = ["required", "optional"]))]
    pub http_tokens: String,
}

fn enabled() -> String {
    "enabled".to_string()
}
fn disabled() -> String {
    "disabled".to_string()
}
fn required() -> String {
    "required".to_string()
}
fn one() -> i64 {
    1
}

fn default_metadata_options() -> MetadataOptions {
    MetadataOptions {
        http_endpoint: enabled(),
        http_protocol_ipv6: disabled(),
        http_put_response_hop_limit: one(),
        http_tokens: required(),
    }
}

impl Default for MetadataOptions {
    fn default() -> Self {
        default_metadata_options()
    }
}

/// Observed state of an EC2NodeClass.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct EC2NodeClassStatus {
    /// Resolved subnets.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub subnets: Vec<SubnetStatus>,
    /// Resolved security groups.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub security_groups: Vec<SecurityGroupStatus>,
    /// Resolved capacity reservations.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub capacity_reservations: Vec<CapacityReservationStatus>,
    /// Resolved AMIs with the requirements an instance type must meet to use each.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub amis: Vec<AmiStatus>,
    /// Instance profile used by the nodes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance_profile: Option<String>,
    /// Conditions: SubnetsReady, SecurityGroupsReady, AMIsReady, InstanceProfileReady,
    /// ValidationSucceeded, Ready.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

/// A resolved subnet.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct SubnetStatus {
    /// Subnet id.
    pub id: String,
    /// Availability zone.
    pub zone: String,
    /// Availability zone id.
    #[serde(default, rename = "zoneID", skip_serializing_if = "Option::is_none")]
    pub zone_id: Option<String>,
}

/// A resolved security group.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct SecurityGroupStatus {
    /// Security group id.
    pub id: String,
    /// Security group name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

/// A resolved capacity reservation.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct CapacityReservationStatus {
    /// Reservation id.
    pub id: String,
    /// Availability zone.
    pub availability_zone: String,
    /// Instance type reserved.
    pub instance_type: String,
    /// Owning account.
    #[serde(rename = "ownerID")]
    pub owner_id: String,
    /// `open` or `targeted`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance_match_criteria: Option<String>,
    /// `default` or `capacity-block`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reservation_type: Option<String>,
    /// `active` or `expiring`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<String>,
    /// When the reservation ends.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("format" = "date-time"))]
    pub end_time: Option<String>,
    /// Whether the reservation may be interrupted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interruptible: Option<bool>,
}

/// A resolved AMI.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct AmiStatus {
    /// AMI id.
    pub id: String,
    /// AMI name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Requirements an instance type must satisfy to boot this AMI (architecture, GPUs, ...).
    pub requirements: Vec<k8s_openapi::api::core::v1::NodeSelectorRequirement>,
    /// When the AMI was deprecated, if it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deprecated: Option<bool>,
}

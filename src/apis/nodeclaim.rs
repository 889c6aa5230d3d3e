//! `NodeClaim` (karpenter.sh/v1): Karpenter's request for one node, from launch through
//! registration and initialization to termination.

use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::common::*;
use super::nodepool::add_requirements_rules;

/// Specification of a NodeClaim. Immutable once created.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    doc = "NodeClaim is the Schema for the NodeClaims API: one node Karpenter launches and manages.",
    group = "karpenter.sh",
    version = "v1",
    kind = "NodeClaim",
    plural = "nodeclaims",
    singular = "nodeclaim",
    category = "karpenter",
    status = "NodeClaimStatus",
    derive = "PartialEq",
    printcolumn(
        name = "Type",
        type_ = "string",
        json_path = ".metadata.labels.node\\.kubernetes\\.io/instance-type"
    ),
    printcolumn(
        name = "Capacity",
        type_ = "string",
        json_path = ".metadata.labels.karpenter\\.sh/capacity-type"
    ),
    printcolumn(
        name = "Zone",
        type_ = "string",
        json_path = ".metadata.labels.topology\\.kubernetes\\.io/zone"
    ),
    printcolumn(name = "Node", type_ = "string", json_path = ".status.nodeName"),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status"
    ),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp"),
    printcolumn(name = "ImageID", type_ = "string", json_path = ".status.imageID", priority = "1"),
    printcolumn(name = "ID", type_ = "string", json_path = ".status.providerID", priority = "1"),
    printcolumn(
        name = "NodePool",
        type_ = "string",
        json_path = ".metadata.labels.karpenter\\.sh/nodepool",
        priority = "1"
    ),
    printcolumn(name = "NodeClass", type_ = "string", json_path = ".spec.nodeClassRef.name", priority = "1"),
    printcolumn(
        name = "Drifted",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Drifted\")].status",
        priority = "1"
    )
)]
#[x_kube(validation = Rule::new("self == oldSelf").message("spec is immutable"))]
#[serde(rename_all = "camelCase")]
pub struct NodeClaimSpec {
    /// Taints for the node.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub taints: Vec<Taint>,
    /// Taints expected at start-up and removed by another agent.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub startup_taints: Vec<Taint>,
    /// Requirements the launched instance must satisfy.
    #[schemars(length(max = 100))]
    #[schemars(transform = add_requirements_rules)]
    pub requirements: Vec<NodeSelectorRequirementWithMinValues>,
    /// Resources the pods nominated for this node need.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,
    /// The node class with the cloud-specific configuration.
    pub node_class_ref: NodeClassReference,
    /// How long a node may live before it is replaced, or `Never`.
    #[serde(default = "default_expire_after")]
    #[schemars(regex(pattern = NILLABLE_DURATION_PATTERN))]
    pub expire_after: String,
    /// How long draining the node may take before its pods are deleted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = DURATION_PATTERN))]
    pub termination_grace_period: Option<String>,
}

/// Resource requests of a NodeClaim.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct ResourceRequirements {
    /// Requested resources.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "deserialize_resource_list"
    )]
    #[schemars(schema_with = "resource_list_schema")]
    pub requests: Option<ResourceList>,
}

/// Observed state of a NodeClaim.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct NodeClaimStatus {
    /// Name of the Node that registered for this claim.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_name: Option<String>,
    /// Cloud provider ID of the instance (`aws:///<zone>/<instance-id>`).
    #[serde(default, rename = "providerID", skip_serializing_if = "Option::is_none")]
    pub provider_id: Option<String>,
    /// Image the instance was launched with.
    #[serde(default, rename = "imageID", skip_serializing_if = "Option::is_none")]
    pub image_id: Option<String>,
    /// Capacity of the instance.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "deserialize_resource_list"
    )]
    #[schemars(schema_with = "resource_list_schema")]
    pub capacity: Option<ResourceList>,
    /// Capacity minus system overhead: what pods can use.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "deserialize_resource_list"
    )]
    #[schemars(schema_with = "resource_list_schema")]
    pub allocatable: Option<ResourceList>,
    /// Conditions: Launched, Registered, Initialized, Ready, Consolidatable, Drifted, Drained,
    /// VolumesDetached, InstanceTerminating, ConsistentStateFound, DisruptionReason.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// Last time a pod was scheduled to or removed from the node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("format" = "date-time"))]
    pub last_pod_event_time: Option<String>,
}

/// Condition types of a NodeClaim.
impl NodeClaim {
    /// The NodeClaim's status conditions (none before its first status write).
    pub fn conditions(&self) -> &[Condition] {
        self.status.as_ref().map(|s| s.conditions.as_slice()).unwrap_or_default()
    }

    /// Its condition of type `type_`.
    pub fn condition(&self, type_: &str) -> Option<&Condition> {
        condition(self.conditions(), type_)
    }

    /// Whether its condition of type `type_` is True.
    pub fn is_true(&self, type_: &str) -> bool {
        is_true(self.conditions(), type_)
    }
}

pub mod conditions {
    /// The instance was created by the cloud provider.
    pub const LAUNCHED: &str = "Launched";
    /// A Node registered for the instance.
    pub const REGISTERED: &str = "Registered";
    /// The Node is ready, without startup taints, with its resources.
    pub const INITIALIZED: &str = "Initialized";
    /// All of the above.
    pub const READY: &str = "Ready";
    /// The node may be consolidated.
    pub const CONSOLIDATABLE: &str = "Consolidatable";
    /// The node no longer matches its NodePool or node class.
    pub const DRIFTED: &str = "Drifted";
    /// The node has been drained.
    pub const DRAINED: &str = "Drained";
    /// The node's volumes have been detached.
    pub const VOLUMES_DETACHED: &str = "VolumesDetached";
    /// The instance is being terminated.
    pub const INSTANCE_TERMINATING: &str = "InstanceTerminating";
    /// Node and instance agree with the claim.
    pub const CONSISTENT_STATE_FOUND: &str = "ConsistentStateFound";
    /// Why the node is being disrupted.
    pub const DISRUPTION_REASON: &str = "DisruptionReason";
    /// EC2 recommended moving off this spot instance and `REBALANCE_REPLACEMENT` is on: the node
    /// is replaced as a drifted one is, its replacement Initialized before it drains
    /// (karpenter-rs only).
    pub const REBALANCE_RECOMMENDED: &str = "RebalanceRecommended";
}

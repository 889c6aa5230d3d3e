//! `CapacityBuffer` (autoscaling.x-k8s.io/v1beta1, behind the `CapacityBuffer` feature gate): spare
//! capacity kept ready for a workload, as placeholder ("virtual") pods that Karpenter provisions
//! for and keeps room for, and that never exist as pods. The schema is the Kubernetes
//! autoscaling SIG's, as upstream Karpenter v1.14 ships it.

use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::common::*;

/// The only provisioning strategy: placeholder pods that make the autoscaler scale up.
pub const ACTIVE_CAPACITY: &str = "buffer.x-k8s.io/active-capacity";

/// Specification of a CapacityBuffer.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    doc = "CapacityBuffer is the configuration that an autoscaler can use to provision buffer capacity within a cluster.",
    group = "autoscaling.x-k8s.io",
    version = "v1beta1",
    kind = "CapacityBuffer",
    plural = "capacitybuffers",
    singular = "capacitybuffer",
    shortname = "cb",
    category = "autoscaling",
    namespaced,
    status = "CapacityBufferStatus",
    derive = "PartialEq",
    printcolumn(name = "Strategy", type_ = "string", json_path = ".spec.provisioningStrategy"),
    printcolumn(name = "PodTemplate", type_ = "string", json_path = ".status.podTemplateRef.name"),
    printcolumn(name = "Replicas", type_ = "integer", json_path = ".status.replicas"),
    printcolumn(name = "ConditionsType", type_ = "string", json_path = ".status.conditions[*].type"),
    printcolumn(name = "ConditionsStatus", type_ = "string", json_path = ".status.conditions[*].status"),
    printcolumn(name = "ConditionsReason", type_ = "string", json_path = ".status.conditions[*].reason"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[x_kube(validation = Rule::new("!has(self.podTemplateRef) || has(self.replicas) || has(self.limits)").message("If podTemplateRef is set, replicas or limits must also be set"))]
#[x_kube(validation = Rule::new("!(has(self.podTemplateRef) && has(self.scalableRef))").message("You must define either PodTemplateRef or ScalableRef, but not both"))]
#[serde(rename_all = "camelCase")]
pub struct CapacityBufferSpec {
    /// How the buffer is used; `buffer.x-k8s.io/active-capacity` (the default) provisions for it.
    #[serde(default = "default_strategy", skip_serializing_if = "Option::is_none")]
    pub provisioning_strategy: Option<String>,
    /// A PodTemplate of the buffer's namespace: the shape of one chunk of the buffer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_template_ref: Option<LocalObjectRef>,
    /// A Deployment, StatefulSet or ReplicaSet of the buffer's namespace whose pods the buffer
    /// makes room for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scalable_ref: Option<ScalableRef>,
    /// How many chunks; with `percentage`, the larger; with `limits`, no more than fit them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub replicas: Option<i32>,
    /// Chunks as a percentage of the `scalableRef`'s replicas, rounded up (at least one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub percentage: Option<i32>,
    /// Total requests the chunks may add up to.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "deserialize_resource_list"
    )]
    #[schemars(schema_with = "resource_list_schema")]
    pub limits: Option<ResourceList>,
}

fn default_strategy() -> Option<String> {
    Some(ACTIVE_CAPACITY.to_string())
}

/// A reference to an object of the same namespace.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Eq)]
pub struct LocalObjectRef {
    /// Name of the referent.
    #[schemars(length(min = 1))]
    pub name: String,
}

/// A reference to an object with a scale subresource.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ScalableRef {
    /// API group of the referent (`apps`; empty means `apps` here).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub api_group: String,
    /// Kind of the referent.
    #[schemars(length(min = 1))]
    pub kind: String,
    /// Name of the referent.
    #[schemars(length(min = 1))]
    pub name: String,
}

/// Observed state of a CapacityBuffer.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct CapacityBufferStatus {
    /// The PodTemplate the chunks were made from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_template_ref: Option<LocalObjectRef>,
    /// How many chunks the buffer holds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<i32>,
    /// The PodTemplate's generation when the chunks were made from it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_template_generation: Option<i64>,
    /// Conditions: `ReadyForProvisioning`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
    /// The strategy the buffer is used with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provisioning_strategy: Option<String>,
}

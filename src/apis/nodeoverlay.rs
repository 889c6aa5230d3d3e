//! `NodeOverlay` (karpenter.sh/v1alpha1, behind the `NodeOverlay` feature gate): changes the
//! price of the instance types it selects, or adds extended resources to them, in every decision
//! that prices or sizes a node. It changes no bill and no node; only what Karpenter believes.

use kube::{CustomResource, KubeSchema};
use schemars::{JsonSchema, Schema};
use serde::{Deserialize, Serialize};

use super::common::*;

/// The part of a price adjustment's grammar upstream accepts: `+0.5`, `-1.2`, `+10%`, `-15%`,
/// `-100%` (a decrease of more than 100 % is refused).
pub const PRICE_ADJUSTMENT_PATTERN: &str =
    r"^(([+-]{1}(\d*\.?\d+))|(\+{1}\d*\.?\d+%)|(^(-\d{1,2}(\.\d+)?%)$)|(-100%))$";

/// An absolute price.
pub const PRICE_PATTERN: &str = r"^\d+(\.\d+)?$";

/// Specification of a NodeOverlay.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    doc = "NodeOverlay changes the price or adds extended resources to the instance types it selects, in Karpenter's decisions.",
    group = "karpenter.sh",
    version = "v1alpha1",
    kind = "NodeOverlay",
    plural = "nodeoverlays",
    singular = "nodeoverlay",
    shortname = "overlays",
    category = "karpenter",
    status = "NodeOverlayStatus",
    derive = "PartialEq",
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status"
    ),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp"),
    printcolumn(name = "Weight", type_ = "integer", json_path = ".spec.weight", priority = "1")
)]
#[x_kube(validation = Rule::new("!has(self.price) || !has(self.priceAdjustment)").message("cannot set both 'price' and 'priceAdjustment'"))]
#[serde(rename_all = "camelCase")]
pub struct NodeOverlaySpec {
    /// Which instance types (and offerings) of which NodePools the overlay applies to: well-known
    /// labels such as `node.kubernetes.io/instance-type` or `karpenter.sh/capacity-type`,
    /// `karpenter.sh/nodepool`, and the labels of a NodePool's template. Empty: every type.
    #[schemars(length(max = 100))]
    #[schemars(transform = add_overlay_requirements_rules)]
    #[schemars(extend("x-kubernetes-list-type" = "atomic"))]
    pub requirements: Vec<OverlayRequirement>,
    /// A change of the selected offerings' price: `+0.5`/`-0.5` (absolute) or `+10%`/`-15%`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = PRICE_ADJUSTMENT_PATTERN))]
    pub price_adjustment: Option<String>,
    /// The selected offerings' price, replacing the cloud provider's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = PRICE_PATTERN))]
    pub price: Option<String>,
    /// Extended resources the selected instance types have on top of their own; cpu, memory,
    /// ephemeral-storage and pods cannot be changed.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "deserialize_resource_list"
    )]
    #[schemars(schema_with = "overlay_capacity_schema")]
    pub capacity: Option<ResourceList>,
    /// Precedence over the other overlays that select the same types: higher wins; unset is 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 10000))]
    pub weight: Option<i32>,
}

/// A requirement of a NodeOverlay: a node selector requirement without `minValues`.
#[derive(Serialize, Deserialize, KubeSchema, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct OverlayRequirement {
    /// The label key that the selector applies to.
    #[schemars(length(max = 316), regex(pattern = LABEL_KEY_PATTERN))]
    #[schemars(transform = add_requirement_key_rules)]
    pub key: String,
    /// How the key relates to the values.
    pub operator: Operator,
    /// The values the operator applies to.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "atomic"))]
    #[schemars(inner(length(max = 63), regex(pattern = LABEL_VALUE_PATTERN)))]
    pub values: Vec<String>,
}

impl OverlayRequirement {
    /// As a NodePool requirement (no `minValues`), to be read by the same parser.
    pub fn as_nodepool_requirement(&self) -> NodeSelectorRequirementWithMinValues {
        NodeSelectorRequirementWithMinValues {
            key: self.key.clone(),
            operator: self.operator,
            values: self.values.clone().into(),
            min_values: None,
        }
    }
}

/// Observed state of a NodeOverlay.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct NodeOverlayStatus {
    /// Conditions: ValidationSucceeded, Ready.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

impl NodeOverlay {
    /// The overlay's weight, 0 when unset.
    pub fn weight(&self) -> i32 {
        self.spec.weight.unwrap_or(0)
    }
}

/// The resources an overlay may not add: those every node reports itself.
pub const RESTRICTED_CAPACITY: [&str; 4] = ["cpu", "memory", "ephemeral-storage", "pods"];

fn overlay_capacity_schema(generator: &mut schemars::SchemaGenerator) -> Schema {
    let mut schema = resource_list_schema(generator);
    let list = RESTRICTED_CAPACITY.iter().map(|r| format!("'{r}'")).collect::<Vec<_>>().join(", ");
    push_rule(&mut schema, &format!("self.all(x, !(x in [{list}]))"), "invalid resource restricted");
    schema
}

fn add_overlay_requirements_rules(schema: &mut Schema) {
    push_rule(
        schema,
        "self.all(x, x.operator == 'NotIn' ? x.values.size() != 0 : true)",
        "requirements with operator 'NotIn' must have a value defined",
    );
    push_rule(
        schema,
        "self.all(x, x.operator == 'In' ? x.values.size() != 0 : true)",
        "requirements with operator 'In' must have a value defined",
    );
    push_rule(
        schema,
        "self.all(x, (x.operator == 'Gt' || x.operator == 'Lt' || x.operator == 'Gte' || x.operator == 'Lte') ? (x.values.size() == 1 && int(x.values[0]) >= 0) : true)",
        "requirements operator 'Gt', 'Lt', 'Gte' or 'Lte' must have a single positive integer value",
    );
}

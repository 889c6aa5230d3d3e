//! `NodePool` (karpenter.sh/v1): the template and constraints for the nodes Karpenter launches,
//! how they may be disrupted, and how much capacity the pool may hold.

use std::collections::BTreeMap;

use kube::{CustomResource, KubeSchema};
use schemars::{JsonSchema, Schema};
use serde::{Deserialize, Serialize};

use super::common::*;

/// Specification of a NodePool.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    doc = "NodePool is the Schema for the NodePools API: the nodes Karpenter may launch and how it may disrupt them.",
    group = "karpenter.sh",
    version = "v1",
    kind = "NodePool",
    plural = "nodepools",
    singular = "nodepool",
    category = "karpenter",
    status = "NodePoolStatus",
    derive = "PartialEq",
    printcolumn(name = "NodeClass", type_ = "string", json_path = ".spec.template.spec.nodeClassRef.name"),
    printcolumn(name = "Nodes", type_ = "string", json_path = ".status.nodes"),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status"
    ),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp"),
    printcolumn(name = "Weight", type_ = "integer", json_path = ".spec.weight", priority = "1"),
    printcolumn(name = "CPU", type_ = "string", json_path = ".status.resources.cpu", priority = "1"),
    printcolumn(name = "Memory", type_ = "string", json_path = ".status.resources.memory", priority = "1"),
    scale(spec_replicas_path = ".spec.replicas", status_replicas_path = ".status.nodes")
)]
#[x_kube(validation = Rule::new("has(self.replicas) == has(oldSelf.replicas)").message("Cannot transition NodePool between static (replicas set) and dynamic (replicas unset) provisioning modes"))]
#[x_kube(validation = Rule::new("!has(self.replicas) || (!has(self.limits) || size(self.limits) == 0 || (size(self.limits) == 1 && 'nodes' in self.limits))").message("only 'limits.nodes' is supported on static NodePools"))]
#[x_kube(validation = Rule::new("!has(self.replicas) || !has(self.weight)").message("'weight' is not supported on static NodePools"))]
#[serde(rename_all = "camelCase")]
pub struct NodePoolSpec {
    /// Template for the NodeClaims this pool creates.
    pub template: NodeClaimTemplate,
    /// How nodes of this pool may be disrupted.
    #[serde(default)]
    #[schemars(extend("default" = {"consolidateAfter": "0s"}))]
    pub disruption: Disruption,
    /// Upper bounds on the resources (and `nodes`) of all nodes of this pool together.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "deserialize_resource_list"
    )]
    #[schemars(schema_with = "resource_list_schema")]
    pub limits: Option<ResourceList>,
    /// Priority of this pool over others; higher weights are tried first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 100))]
    pub weight: Option<i32>,
    /// A static NodePool (`StaticCapacity` gate): this many nodes, whatever the pods. Its nodes
    /// are neither consolidated nor emptied, only `limits.nodes` applies, and weight is not
    /// supported; a drifted node is replaced one for one within the budgets.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub replicas: Option<i64>,
}

/// Template for NodeClaims: metadata and spec.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct NodeClaimTemplate {
    /// Labels and annotations for the nodes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<TemplateMetadata>,
    /// NodeClaim spec for the nodes.
    pub spec: NodeClaimTemplateSpec,
}

/// Labels and annotations applied to every node of the pool.
#[derive(Serialize, Deserialize, KubeSchema, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct TemplateMetadata {
    /// Labels for the nodes.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(transform = add_template_label_rules)]
    pub labels: BTreeMap<String, String>,
    /// Annotations for the nodes.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

/// The NodeClaim spec in a NodePool template.
#[derive(Serialize, Deserialize, KubeSchema, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct NodeClaimTemplateSpec {
    /// Taints for the nodes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub taints: Vec<Taint>,
    /// Taints expected on the nodes at start-up and removed by another agent (e.g. a CNI);
    /// pods need not tolerate them to be provisioned for.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub startup_taints: Vec<Taint>,
    /// Requirements on the nodes' labels, constraining instance types, zones, capacity types, ...
    #[schemars(length(max = 100))]
    #[schemars(transform = add_requirements_rules)]
    #[x_kube(validation = Rule::new("self.all(x, x.key != \"karpenter.sh/nodepool\")").message("label \"karpenter.sh/nodepool\" is restricted"))]
    pub requirements: Vec<NodeSelectorRequirementWithMinValues>,
    /// The node class (an EC2NodeClass) with the cloud-specific configuration.
    #[x_kube(validation = Rule::new("self.group == oldSelf.group").message("nodeClassRef.group is immutable"))]
    #[x_kube(validation = Rule::new("self.kind == oldSelf.kind").message("nodeClassRef.kind is immutable"))]
    pub node_class_ref: NodeClassReference,
    /// How long a node may live before it is replaced, or `Never`.
    #[serde(default = "default_expire_after")]
    #[schemars(regex(pattern = NILLABLE_DURATION_PATTERN))]
    pub expire_after: String,
    /// How long draining a node may take before its pods are deleted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = DURATION_PATTERN))]
    pub termination_grace_period: Option<String>,
}

/// Consolidation policy of a NodePool.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum ConsolidationPolicy {
    /// Only remove nodes that have no workload pods.
    WhenEmpty,
    /// Remove or replace nodes that are empty or underutilized.
    #[default]
    WhenEmptyOrUnderutilized,
    /// Like `WhenEmptyOrUnderutilized`, but a move of non-empty nodes is made only when its share
    /// of the pool's savings is at least half its share of the pool's disruption.
    Balanced,
}

/// Disruption settings of a NodePool.
#[derive(Serialize, Deserialize, KubeSchema, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Disruption {
    /// Which nodes consolidation may act on.
    #[serde(default)]
    pub consolidation_policy: ConsolidationPolicy,
    /// How long a node must have been consolidatable before it is consolidated, or `Never`.
    #[serde(default = "default_consolidate_after")]
    #[schemars(regex(pattern = NILLABLE_DURATION_PATTERN))]
    pub consolidate_after: String,
    /// How many nodes may be disrupted at once, optionally on a schedule and per reason.
    #[serde(default = "default_budgets")]
    #[schemars(length(max = 50))]
    #[x_kube(validation = Rule::new("self.all(x, has(x.schedule) == has(x.duration))").message("'schedule' must be set with 'duration'"))]
    pub budgets: Vec<Budget>,
}

impl Default for Disruption {
    fn default() -> Self {
        Disruption {
            consolidation_policy: ConsolidationPolicy::default(),
            consolidate_after: default_consolidate_after(),
            budgets: default_budgets(),
        }
    }
}

fn default_consolidate_after() -> String {
    "0s".to_string()
}

fn default_budgets() -> Vec<Budget> {
    vec![Budget { nodes: default_budget_nodes(), schedule: None, duration: None, reasons: None }]
}

fn default_budget_nodes() -> String {
    "10%".to_string()
}

/// A disruption reason that a budget can be limited to.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum DisruptionReason {
    /// The node's pods fit elsewhere or on a cheaper node.
    Underutilized,
    /// The node has no workload pods.
    Empty,
    /// The node no longer matches its NodePool or node class.
    Drifted,
}

impl DisruptionReason {
    /// As conditions, events and the budget metrics spell it (`Underutilized`).
    pub fn as_str(self) -> &'static str {
        match self {
            DisruptionReason::Underutilized => "Underutilized",
            DisruptionReason::Empty => "Empty",
            DisruptionReason::Drifted => "Drifted",
        }
    }

    /// As the other metrics' `reason` label spells it (`underutilized`).
    pub fn metric_label(self) -> &'static str {
        match self {
            DisruptionReason::Underutilized => "underutilized",
            DisruptionReason::Empty => "empty",
            DisruptionReason::Drifted => "drifted",
        }
    }
}

/// A disruption budget: at most `nodes` nodes disrupted at once, while the schedule is active.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Budget {
    /// Disruption reasons the budget applies to; all of them when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 50))]
    pub reasons: Option<Vec<DisruptionReason>>,
    /// A node count or a percentage of the pool's nodes.
    #[serde(default = "default_budget_nodes")]
    #[schemars(regex(pattern = r"^((100|[0-9]{1,2})%|[0-9]+)$"))]
    pub nodes: String,
    /// Cron schedule (UTC) at which the budget becomes active; `@daily` style macros allowed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(
        pattern = r"^(@(annually|yearly|monthly|weekly|daily|midnight|hourly))|((.+)\s(.+)\s(.+)\s(.+)\s(.+))$"
    ))]
    pub schedule: Option<String>,
    /// How long the budget stays active after each scheduled start, in hours and minutes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^((([0-9]+(h|m))|([0-9]+h[0-9]+m))(0s)?)$"))]
    pub duration: Option<String>,
}

/// Observed state of a NodePool.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct NodePoolStatus {
    /// Resources (and `nodes`) of all the pool's nodes together.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "deserialize_resource_list"
    )]
    #[schemars(schema_with = "resource_list_schema")]
    pub resources: Option<ResourceList>,
    /// Number of nodes of the pool.
    #[serde(default)]
    pub nodes: i64,
    /// Generation of the node class last observed by the NodePool status controller.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_class_observed_generation: Option<i64>,
    /// Conditions: NodeClassReady, ValidationSucceeded, Ready.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

/// Rules on the requirement list shared by NodePool templates and NodeClaims.
pub fn add_requirements_rules(schema: &mut Schema) {
    push_rule(
        schema,
        "self.all(x, x.operator == 'In' ? x.values.size() != 0 : true)",
        "requirements with operator 'In' must have a value defined",
    );
    push_rule(
        schema,
        "self.all(x, (x.operator == 'Gt' || x.operator == 'Lt' || x.operator == 'Gte' || x.operator == 'Lte') ? (x.values.size() == 1 && x.values[0].matches('^[0-9]+$')) : true)",
        "requirements operator 'Gt', 'Lt', 'Gte', or 'Lte' must have a single positive integer value",
    );
    push_rule(
        schema,
        "self.all(x, (x.operator == 'In' && has(x.minValues)) ? x.values.size() >= x.minValues : true)",
        "requirements with 'minValues' must have at least that many values specified in the 'values' field",
    );
}

/// Rules on template labels: the same restricted domains as requirement keys, and the labels
/// Karpenter sets itself.
fn add_template_label_rules(schema: &mut Schema) {
    schema.ensure_object().insert(
        "additionalProperties".to_string(),
        serde_json::json!({"type": "string", "maxLength": 63, "pattern": LABEL_VALUE_PATTERN}),
    );
    schema.ensure_object().insert("maxProperties".to_string(), serde_json::json!(100));
    push_rule(
        schema,
        "self.all(x, x != \"karpenter.sh/nodepool\")",
        "label \"karpenter.sh/nodepool\" is restricted",
    );
    // Over a map, `self.all(x, ...)` iterates the keys.
    for (rule, message) in requirement_key_rules("x") {
        push_rule(schema, &format!("self.all(x, {rule})"), &message);
    }
}

/// Version of the NodePool hash scheme, written next to the hash so that a change of scheme is
/// not mistaken for drift: upstream's `NodePoolHashVersion`, as the hash is upstream's
/// ([`super::hash::nodepool_hash`]). A NodeClaim stamped with another version (such as `rs-v2`,
/// this controller's former scheme) is re-stamped rather than compared.
pub const NODEPOOL_HASH_VERSION: &str = "v3";

impl NodePool {
    /// The pool's weight, 0 when unset.
    pub fn weight(&self) -> i32 {
        self.spec.weight.unwrap_or(0)
    }

    /// Whether the pool keeps a fixed number of nodes (`spec.replicas`) rather than following
    /// the pods.
    pub fn is_static(&self) -> bool {
        self.spec.replicas.is_some()
    }
}

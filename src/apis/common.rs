//! Types shared by the Karpenter kinds: requirements, taints, node class references, conditions,
//! durations and resource lists, with the OpenAPI schema upstream's CRDs publish for them.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::KubeSchema;
use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Deserializer, Serialize};

use super::values::Values;

/// The resource-quantity grammar of Kubernetes, as a JSON-schema pattern.
pub const QUANTITY_PATTERN: &str = r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$";

/// Pattern of a duration that may also be `Never` (e.g. `expireAfter`, `consolidateAfter`).
pub const NILLABLE_DURATION_PATTERN: &str = r"^(([0-9]+(s|m|h))+|Never)$";

/// Pattern of a plain duration in seconds, minutes and hours (e.g. `terminationGracePeriod`).
pub const DURATION_PATTERN: &str = r"^([0-9]+(s|m|h))+$";

/// Pattern of a qualified label key (optional DNS prefix, then a name of up to 63 characters).
pub const LABEL_KEY_PATTERN: &str = r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*(\/))?([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$";

/// Pattern of a label value.
pub const LABEL_VALUE_PATTERN: &str = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$";

/// Schema of a resource list (`cpu: 4`, `memory: 16Gi`): integer or quantity string per resource.
pub fn resource_list_schema(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "object",
        "additionalProperties": quantity_value_schema(),
    })
}

/// Schema of a single quantity: an integer or a string in the quantity grammar.
pub fn quantity_schema(_: &mut SchemaGenerator) -> Schema {
    Schema::try_from(quantity_value_schema()).unwrap_or_default()
}

fn quantity_value_schema() -> serde_json::Value {
    // No `anyOf` here: kube's structural rewrite would empty its branches, and
    // `x-kubernetes-int-or-string` alone already admits both forms.
    serde_json::json!({
        "pattern": QUANTITY_PATTERN,
        "x-kubernetes-int-or-string": true,
    })
}

/// A resource list as Kubernetes writes it: resource name to quantity.
pub type ResourceList = BTreeMap<String, Quantity>;

/// Deserializes a resource list whose values may be JSON numbers (`cpu: 1000`) or strings.
///
/// The API server keeps integers as integers in int-or-string fields, and `Quantity` on its own
/// only accepts strings; one NodePool with `limits: {cpu: 1000}` must not break a watch.
pub fn deserialize_resource_list<'de, D>(d: D) -> Result<Option<ResourceList>, D::Error>
where
    D: Deserializer<'de>,
{
    let raw: Option<BTreeMap<String, IntOrString>> = Option::deserialize(d)?;
    Ok(raw.map(|m| m.into_iter().map(|(k, v)| (k, Quantity(v.into_string()))).collect()))
}

/// Deserializes one quantity that may be a JSON number or a string.
pub fn deserialize_quantity<'de, D>(d: D) -> Result<Option<Quantity>, D::Error>
where
    D: Deserializer<'de>,
{
    let raw: Option<IntOrString> = Option::deserialize(d)?;
    Ok(raw.map(|v| Quantity(v.into_string())))
}

/// A value that Kubernetes stores as either an integer or a string.
#[derive(Deserialize)]
#[serde(untagged)]
enum IntOrString {
    Int(i64),
    Float(f64),
    Str(String),
}

impl IntOrString {
    fn into_string(self) -> String {
        match self {
            IntOrString::Int(i) => i.to_string(),
            IntOrString::Float(f) => f.to_string(),
            IntOrString::Str(s) => s,
        }
    }
}

/// Operator of a node selector requirement.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Operator {
    /// The label's value is one of `values`.
    In,
    /// The label's value is none of `values` (or the label is absent).
    NotIn,
    /// The label is present.
    Exists,
    /// The label is absent.
    DoesNotExist,
    /// The label's value, an integer, is greater than the single value.
    Gt,
    /// The label's value, an integer, is less than the single value.
    Lt,
    /// The label's value, an integer, is greater than or equal to the single value.
    Gte,
    /// The label's value, an integer, is less than or equal to the single value.
    Lte,
}

/// A node selector requirement with an optional minimum number of distinct values.
#[derive(Serialize, Deserialize, KubeSchema, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct NodeSelectorRequirementWithMinValues {
    /// The label key that the selector applies to.
    #[schemars(length(max = 316), regex(pattern = LABEL_KEY_PATTERN))]
    #[schemars(transform = add_requirement_key_rules)]
    pub key: String,
    /// How the key relates to the values.
    pub operator: Operator,
    /// The values the operator applies to.
    #[serde(default, skip_serializing_if = "<[String]>::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "atomic"))]
    #[schemars(inner(length(max = 63), regex(pattern = LABEL_VALUE_PATTERN)))]
    pub values: Values,
    /// The minimum number of distinct values of this key the launch must be able to choose from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 50))]
    pub min_values: Option<i32>,
}

/// Effect of a taint.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TaintEffect {
    /// Do not schedule new pods that do not tolerate the taint.
    NoSchedule,
    /// Avoid scheduling pods that do not tolerate the taint.
    PreferNoSchedule,
    /// Evict running pods that do not tolerate the taint.
    NoExecute,
}

impl TaintEffect {
    /// The effect's name as Kubernetes writes it.
    pub fn as_str(self) -> &'static str {
        match self {
            TaintEffect::NoSchedule => "NoSchedule",
            TaintEffect::PreferNoSchedule => "PreferNoSchedule",
            TaintEffect::NoExecute => "NoExecute",
        }
    }
}

/// A taint to place on nodes.
#[derive(Serialize, Deserialize, KubeSchema, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Taint {
    /// The taint key.
    #[schemars(length(min = 1), regex(pattern = LABEL_KEY_PATTERN))]
    pub key: String,
    /// The taint value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = LABEL_VALUE_PATTERN))]
    pub value: Option<String>,
    /// The taint effect.
    pub effect: TaintEffect,
    /// When the taint was added (only for NoExecute taints).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("format" = "date-time"))]
    pub time_added: Option<String>,
}

impl Taint {
    /// A taint with the given key and effect and no value.
    pub fn new(key: impl Into<String>, effect: TaintEffect) -> Self {
        Taint { key: key.into(), value: None, effect, time_added: None }
    }

    /// Converts from the Kubernetes core type; `None` for an effect Kubernetes does not define.
    pub fn from_k8s(t: &k8s_openapi::api::core::v1::Taint) -> Option<Self> {
        let effect = match t.effect.as_str() {
            "NoSchedule" => TaintEffect::NoSchedule,
            "PreferNoSchedule" => TaintEffect::PreferNoSchedule,
            "NoExecute" => TaintEffect::NoExecute,
            _ => return None,
        };
        Some(Taint { key: t.key.clone(), value: t.value.clone(), effect, time_added: None })
    }

    /// Converts to the Kubernetes core type.
    pub fn to_k8s(&self) -> k8s_openapi::api::core::v1::Taint {
        k8s_openapi::api::core::v1::Taint {
            key: self.key.clone(),
            value: self.value.clone(),
            effect: self.effect.as_str().to_string(),
            time_added: None,
        }
    }
}

/// Reference to the cloud-provider node class (for AWS an `EC2NodeClass`).
#[derive(Serialize, Deserialize, KubeSchema, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct NodeClassReference {
    /// API group of the node class (`karpenter.k8s.aws`).
    #[schemars(length(max = 253), regex(pattern = r"^[^/]*$"))]
    #[x_kube(validation = Rule::new("self != ''").message("group may not be empty"))]
    pub group: String,
    /// Kind of the node class (`EC2NodeClass`).
    #[schemars(length(max = 63), regex(pattern = r"^[A-Za-z0-9-]+$"))]
    #[x_kube(validation = Rule::new("self != ''").message("kind may not be empty"))]
    pub kind: String,
    /// Name of the node class.
    #[schemars(length(max = 253), regex(pattern = r"^[A-Za-z0-9-]+$"))]
    #[x_kube(validation = Rule::new("self != ''").message("name may not be empty"))]
    pub name: String,
}

/// Status of a condition.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConditionStatus {
    /// The condition holds.
    True,
    /// The condition does not hold.
    False,
    /// It is not known yet.
    Unknown,
}

/// A status condition, in the shape of `metav1.Condition`.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    /// Type of the condition, in CamelCase.
    #[schemars(
        length(max = 316),
        regex(
            pattern = r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$"
        )
    )]
    #[serde(rename = "type")]
    pub type_: String,
    /// True, False or Unknown.
    pub status: ConditionStatus,
    /// The object generation the condition was computed for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub observed_generation: Option<i64>,
    /// When the status last changed.
    #[schemars(extend("format" = "date-time"))]
    pub last_transition_time: String,
    /// A CamelCase reason for the last transition.
    #[schemars(length(min = 1, max = 1024), regex(pattern = r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$"))]
    pub reason: String,
    /// A human-readable message about the transition.
    #[serde(default)]
    #[schemars(length(max = 32768))]
    pub message: String,
}

/// The CEL rules on a label key that keep users out of the restricted label domains, as
/// `(rule, message)` pairs, with the key bound to the CEL variable `var`. The allowed lists come
/// from [`crate::apis::labels`].
pub fn requirement_key_rules(var: &str) -> Vec<(String, String)> {
    use crate::apis::labels::*;
    let list = |items: &[&str]| items.iter().map(|s| format!("\"{s}\"")).collect::<Vec<_>>().join(", ");
    let karpenter_sh = list(&[LABEL_CAPACITY_TYPE, LABEL_NODEPOOL]);
    let aws: Vec<&str> = WELL_KNOWN_LABELS.iter().copied().filter(|l| label_domain(l) == AWS_GROUP).collect();
    let aws = list(&aws);
    let domain = format!(r#"{var}.find("^([^/]+)")"#);
    vec![
        (
            format!(r#"{var} in [{karpenter_sh}] || !{domain}.endsWith("karpenter.sh")"#),
            r#"label domain "karpenter.sh" is restricted"#.to_string(),
        ),
        (format!(r#"{var} != "{LABEL_HOSTNAME}""#), format!(r#"label "{LABEL_HOSTNAME}" is restricted"#)),
        (
            format!(r#"{var} in [{aws}] || !{domain}.endsWith("karpenter.k8s.aws")"#),
            r#"label domain "karpenter.k8s.aws" is restricted"#.to_string(),
        ),
    ]
}

/// Schema transform adding [`requirement_key_rules`] to a requirement's `key` property.
pub fn add_requirement_key_rules(schema: &mut Schema) {
    for (rule, message) in requirement_key_rules("self") {
        push_rule(schema, &rule, &message);
    }
}

/// Appends one `x-kubernetes-validations` rule to a schema.
pub fn push_rule(schema: &mut Schema, rule: &str, message: &str) {
    let entry = serde_json::json!({"rule": rule, "message": message});
    let obj = schema.ensure_object();
    match obj.get_mut("x-kubernetes-validations") {
        Some(serde_json::Value::Array(rules)) => rules.push(entry),
        _ => {
            obj.insert("x-kubernetes-validations".to_string(), serde_json::Value::Array(vec![entry]));
        }
    }
}

/// Default of `expireAfter`: 30 days.
pub fn default_expire_after() -> String {
    "720h".to_string()
}

/// A condition's status, reason and message, as a controller sets it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConditionUpdate {
    /// True, False or Unknown.
    pub status: ConditionStatus,
    /// CamelCase reason.
    pub reason: String,
    /// Human-readable message.
    pub message: String,
}

impl ConditionUpdate {
    /// A True condition.
    pub fn true_(reason: &str) -> Self {
        ConditionUpdate { status: ConditionStatus::True, reason: reason.into(), message: String::new() }
    }

    /// A False condition.
    pub fn false_(reason: &str, message: impl Into<String>) -> Self {
        ConditionUpdate { status: ConditionStatus::False, reason: reason.into(), message: message.into() }
    }

    /// An Unknown condition.
    pub fn unknown(reason: &str, message: impl Into<String>) -> Self {
        ConditionUpdate { status: ConditionStatus::Unknown, reason: reason.into(), message: message.into() }
    }
}

/// The condition of type `type_`.
pub fn condition<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

/// Whether the condition of type `type_` is True.
pub fn is_true(conditions: &[Condition], type_: &str) -> bool {
    condition(conditions, type_).is_some_and(|c| c.status == ConditionStatus::True)
}

/// `now` as a condition's `lastTransitionTime`: RFC 3339 in whole seconds, as Kubernetes writes it.
pub fn transition_time(now: k8s_openapi::jiff::Timestamp) -> String {
    k8s_openapi::jiff::Timestamp::from_second(now.as_second()).unwrap_or(now).to_string()
}

/// Longest message the CRDs accept.
const MAX_MESSAGE: usize = 32768;

/// Sets the condition `type_` in `conditions` to `update`, for the object's `observed_generation`,
/// keeping its `lastTransitionTime` unless the status changes (a message longer than the CRDs
/// allow is cut). Returns whether anything changed.
pub fn set_condition(
    conditions: &mut Vec<Condition>,
    type_: &str,
    update: ConditionUpdate,
    observed_generation: Option<i64>,
    now: k8s_openapi::jiff::Timestamp,
) -> bool {
    let ConditionUpdate { status, reason, mut message } = update;
    if message.len() > MAX_MESSAGE {
        let mut end = MAX_MESSAGE;
        while !message.is_char_boundary(end) {
            end -= 1;
        }
        message.truncate(end);
    }
    match conditions.iter_mut().find(|c| c.type_ == type_) {
        Some(c) => {
            let changed = c.status != status
                || c.reason != reason
                || c.message != message
                || c.observed_generation != observed_generation;
            if c.status != status {
                c.last_transition_time = transition_time(now);
            }
            c.status = status;
            c.reason = reason;
            c.message = message;
            c.observed_generation = observed_generation;
            changed
        }
        None => {
            conditions.push(Condition {
                type_: type_.to_string(),
                status,
                observed_generation,
                last_transition_time: transition_time(now),
                reason,
                message,
            });
            true
        }
    }
}

/// Removes the condition `type_` from `conditions`; returns whether it was there.
pub fn remove_condition(conditions: &mut Vec<Condition>, type_: &str) -> bool {
    let before = conditions.len();
    conditions.retain(|c| c.type_ != type_);
    conditions.len() != before
}

#[cfg(test)]
mod condition_tests {
    use super::*;

    #[test]
    fn transitions_keep_their_time_until_the_status_changes() {
        let t = |s: i64| k8s_openapi::jiff::Timestamp::from_second(1_700_000_000 + s).unwrap();
        let not_ready = |reason: &str| ConditionUpdate::false_(reason, "m");
        let mut cs = vec![];
        assert!(set_condition(&mut cs, "Ready", not_ready("NotReady"), Some(1), t(1)));
        assert!(!set_condition(&mut cs, "Ready", not_ready("NotReady"), Some(1), t(2)));
        assert_eq!(cs[0].last_transition_time, transition_time(t(1)));
        assert!(set_condition(&mut cs, "Ready", not_ready("Other"), Some(1), t(3)));
        assert_eq!(cs[0].last_transition_time, transition_time(t(1)));
        assert!(set_condition(&mut cs, "Ready", ConditionUpdate::true_("Ready"), Some(1), t(4)));
        assert_eq!(cs[0].last_transition_time, "2023-11-14T22:13:24Z");
        assert_eq!(cs.len(), 1);
        assert!(is_true(&cs, "Ready") && !is_true(&cs, "Other"));
        // Messages are cut to what the CRDs accept, on a character boundary.
        let long = "é".repeat(MAX_MESSAGE);
        assert!(set_condition(&mut cs, "Long", ConditionUpdate::false_("Long", long), None, t(5)));
        let kept = &condition(&cs, "Long").unwrap().message;
        assert!(kept.len() <= MAX_MESSAGE && kept.chars().all(|c| c == 'é'));
        assert!(remove_condition(&mut cs, "Long") && !remove_condition(&mut cs, "Long"));
    }
}

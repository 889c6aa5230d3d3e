//! The label-requirements algebra.
//!
//! A [`Requirement`] is the set of values one label key may take: either a finite set (`In`, and
//! `DoesNotExist` as the empty set) or the complement of a finite set (`NotIn`, and `Exists` as
//! the complement of nothing), optionally narrowed by integer bounds (`Gt`, `Lt`, `Gte`, `Lte`).
//! [`Requirements`] maps keys to requirements; adding a requirement intersects it with the one
//! already present, so the map always describes the values every added constraint allows.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt;
use std::hash::Hash;

use crate::apis::pod::Pod;
use k8s_openapi::api::core::v1::{NodeSelectorRequirement, NodeSelectorTerm, PreferredSchedulingTerm};
use thiserror::Error;

use crate::apis::labels::{LABEL_HOSTNAME, WELL_KNOWN_LABELS, normalized_label};
use crate::apis::{NodeSelectorRequirementWithMinValues, Operator};

use super::values::ValueSet;

/// A requirement that cannot be built from its operator and values.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum RequirementError {
    /// The operator is not one of the node selector operators.
    #[error("key {key}: unknown operator {operator:?}")]
    UnknownOperator {
        /// The label key.
        key: String,
        /// The operator as written.
        operator: String,
    },
    /// A numeric operator needs exactly one integer value.
    #[error("key {key}: operator {operator:?} needs a single integer value, got {values:?}")]
    NotAnInteger {
        /// The label key.
        key: String,
        /// The operator.
        operator: String,
        /// The values as written.
        values: Vec<String>,
    },
}

/// Why two sets of requirements cannot both hold.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
#[error("{0}")]
pub struct Incompatible(pub String);

/// The values one label key may take.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Requirement {
    /// When true, `values` lists the excluded values; otherwise the allowed ones.
    complement: bool,
    values: ValueSet,
    /// Bounds and `minValues`, which few requirements have; `None` when none is set.
    limits: Option<Box<Limits>>,
}

/// The rarely set parts of a [`Requirement`].
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash)]
struct Limits {
    /// Exclusive lower bound on the integer value.
    greater_than: Option<i64>,
    /// Exclusive upper bound on the integer value.
    less_than: Option<i64>,
    /// Minimum number of distinct values the launch must keep (NodePool `minValues`).
    min_values: Option<usize>,
}

impl fmt::Debug for Requirement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Requirement")
            .field("complement", &self.complement)
            .field("values", &self.values)
            .field("greater_than", &self.greater_than())
            .field("less_than", &self.less_than())
            .field("min_values", &self.min_values())
            .finish()
    }
}

impl Requirement {
    /// `In values`.
    pub fn in_values<S: Into<String>>(values: impl IntoIterator<Item = S>) -> Self {
        Requirement {
            complement: false,
            values: ValueSet::from_values(values.into_iter().map(|v| v.into().into_boxed_str())),
            limits: None,
        }
    }

    /// `NotIn values`.
    pub fn not_in<S: Into<String>>(values: impl IntoIterator<Item = S>) -> Self {
        Requirement { complement: true, ..Requirement::in_values(values) }
    }

    /// `Exists`: any value.
    pub fn exists() -> Self {
        Requirement::not_in(Vec::<String>::new())
    }

    /// `DoesNotExist`: no value.
    pub fn does_not_exist() -> Self {
        Requirement::in_values(Vec::<String>::new())
    }

    /// Builds a requirement from a node-selector operator and its values.
    pub fn new(key: &str, operator: Operator, values: &[String]) -> Result<Self, RequirementError> {
        let bound = |op: &str| -> Result<i64, RequirementError> {
            match values {
                [v] => v.trim().parse::<i64>().ok(),
                _ => None,
            }
            .ok_or_else(|| RequirementError::NotAnInteger {
                key: key.to_string(),
                operator: op.to_string(),
                values: values.to_vec(),
            })
        };
        Ok(match operator {
            Operator::In => Requirement::in_values(values.iter().cloned()),
            Operator::NotIn => Requirement::not_in(values.iter().cloned()),
            Operator::Exists => Requirement::exists(),
            Operator::DoesNotExist => Requirement::does_not_exist(),
            Operator::Gt => Requirement::exists()
                .with_limits(Limits { greater_than: Some(bound("Gt")?), ..Limits::default() }),
            Operator::Lt => Requirement::exists()
                .with_limits(Limits { less_than: Some(bound("Lt")?), ..Limits::default() }),
            Operator::Gte => Requirement::exists().with_limits(Limits {
                greater_than: Some(bound("Gte")?.saturating_sub(1)),
                ..Limits::default()
            }),
            Operator::Lte => Requirement::exists().with_limits(Limits {
                less_than: Some(bound("Lte")?.saturating_add(1)),
                ..Limits::default()
            }),
        })
    }

    /// Builds a requirement from an operator written as Kubernetes does (`"In"`, `"Gt"`, ...).
    pub fn from_str_operator(key: &str, operator: &str, values: &[String]) -> Result<Self, RequirementError> {
        let op = match operator {
            "In" => Operator::In,
            "NotIn" => Operator::NotIn,
            "Exists" => Operator::Exists,
            "DoesNotExist" => Operator::DoesNotExist,
            "Gt" => Operator::Gt,
            "Lt" => Operator::Lt,
            "Gte" => Operator::Gte,
            "Lte" => Operator::Lte,
            other => {
                return Err(RequirementError::UnknownOperator {
                    key: key.to_string(),
                    operator: other.to_string(),
                });
            }
        };
        Requirement::new(key, op, values)
    }

    /// Sets the minimum number of distinct values.
    pub fn with_min_values(self, min_values: Option<usize>) -> Self {
        let limits = Limits { min_values, ..self.limits() };
        self.with_limits(limits)
    }

    /// Sets the bounds and `minValues`, keeping none in line when none is set.
    fn with_limits(mut self, limits: Limits) -> Self {
        self.limits = (limits != Limits::default()).then(|| Box::new(limits));
        self
    }

    fn limits(&self) -> Limits {
        self.limits.as_deref().copied().unwrap_or_default()
    }

    fn greater_than(&self) -> Option<i64> {
        self.limits.as_ref().and_then(|l| l.greater_than)
    }

    fn less_than(&self) -> Option<i64> {
        self.limits.as_ref().and_then(|l| l.less_than)
    }

    /// The minimum number of distinct values, if any.
    pub fn min_values(&self) -> Option<usize> {
        self.limits.as_ref().and_then(|l| l.min_values)
    }

    /// Whether this is a complement (`NotIn`/`Exists`/bounds) set.
    pub fn is_complement(&self) -> bool {
        self.complement
    }

    /// The listed values: the allowed ones of a finite set, the excluded ones of a complement.
    pub fn values(&self) -> &ValueSet {
        &self.values
    }

    /// Whether the integer bounds admit `value`.
    fn within_bounds(&self, value: &str) -> bool {
        within(self.greater_than(), self.less_than(), value)
    }

    /// Whether `value` is allowed.
    pub fn has(&self, value: &str) -> bool {
        self.within_bounds(value) && (self.complement != self.values.contains(value))
    }

    /// Whether no value at all is allowed.
    pub fn is_empty(&self) -> bool {
        !self.complement && self.values.is_empty()
    }

    /// Number of allowed values (`usize::MAX` minus the excluded ones for complements).
    pub fn len(&self) -> usize {
        if self.complement { usize::MAX - self.values.len() } else { self.values.len() }
    }

    /// The single allowed value, if exactly one.
    pub fn single(&self) -> Option<&str> {
        if !self.complement && self.values.len() == 1 { self.values.first() } else { None }
    }

    /// Some allowed value: the smallest listed one of a finite set, or for a complement a value
    /// satisfying the bounds that is not excluded.
    pub fn any(&self) -> Option<String> {
        if !self.complement {
            return self.values.first().map(str::to_string);
        }
        if self.greater_than().is_none() && self.less_than().is_none() {
            return None;
        }
        let mut v = self.greater_than().map_or(0, |g| g.saturating_add(1));
        while self.less_than().is_none_or(|l| v < l) {
            let s = v.to_string();
            if !self.values.contains(&s) {
                return Some(s);
            }
            v = v.saturating_add(1);
        }
        None
    }

    /// The operator this set is equivalent to.
    pub fn operator(&self) -> Operator {
        if self.complement {
            if !self.values.is_empty() {
                Operator::NotIn
            } else if self.greater_than().is_some() {
                Operator::Gt
            } else if self.less_than().is_some() {
                Operator::Lt
            } else {
                Operator::Exists
            }
        } else if self.values.is_empty() {
            Operator::DoesNotExist
        } else {
            Operator::In
        }
    }

    /// The values both requirements allow.
    pub fn intersection(&self, other: &Requirement) -> Requirement {
        let greater_than = match (self.greater_than(), other.greater_than()) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
        let less_than = match (self.less_than(), other.less_than()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let min_values = self.min_values().max(other.min_values());
        let (complement, values) = match (self.complement, other.complement) {
            (true, true) => (true, self.values.union(&other.values)),
            (true, false) => (false, other.values.difference(&self.values)),
            (false, true) => (false, self.values.difference(&other.values)),
            (false, false) => (false, self.values.intersection(&other.values)),
        };
        let mut r = Requirement { complement, values, limits: None }.with_limits(Limits {
            greater_than,
            less_than,
            min_values,
        });
        if let (Some(g), Some(l)) = (greater_than, less_than)
            && g.saturating_add(1) >= l
        {
            r.complement = false;
            r.values = ValueSet::new();
        }
        if !r.complement && (greater_than.is_some() || less_than.is_some()) {
            let (g, l) = (greater_than, less_than);
            r.values.retain(|v| within(g, l, v));
        }
        r
    }

    /// Whether the two requirements have a value in common, without building the intersection.
    pub fn intersects(&self, other: &Requirement) -> bool {
        match (self.complement, other.complement) {
            (false, false) => {
                let (small, large) =
                    if self.values.len() <= other.values.len() { (self, other) } else { (other, self) };
                small.values.iter().any(|v| large.has(v) && small.within_bounds(v))
            }
            (false, true) => self.values.iter().any(|v| other.has(v) && self.within_bounds(v)),
            (true, false) => other.values.iter().any(|v| self.has(v) && other.within_bounds(v)),
            (true, true) => !self.intersection(other).is_empty(),
        }
    }

    /// Whether a node without the label satisfies it (`NotIn`, `DoesNotExist`).
    pub fn allows_absent(&self) -> bool {
        matches!(self.operator(), Operator::NotIn | Operator::DoesNotExist)
    }

    /// A short description of the allowed values, for messages: `spot`, `[a, b]`, `not [a]`,
    /// `any value`, `no value`, `> 4`.
    pub fn describe(&self) -> String {
        let mut bounds = String::new();
        if let Some(g) = self.greater_than() {
            bounds.push_str(&format!(" > {g}"));
        }
        if let Some(l) = self.less_than() {
            bounds.push_str(&format!(" < {l}"));
        }
        let list = |vals: &ValueSet| {
            let shown: Vec<&str> = vals.iter().take(5).collect();
            let more = vals.len().saturating_sub(5);
            if more > 0 {
                format!("[{} and {more} others]", shown.join(", "))
            } else {
                format!("[{}]", shown.join(", "))
            }
        };
        match self.operator() {
            Operator::DoesNotExist => "no value".to_string(),
            Operator::Exists => "any value".to_string(),
            Operator::Gt | Operator::Lt | Operator::Gte | Operator::Lte => format!("value{bounds}"),
            Operator::NotIn => format!("not {}{bounds}", list(&self.values)),
            Operator::In => list(&self.values),
        }
    }

    /// Converts back to a node selector requirement on `key`.
    pub fn to_node_selector(&self, key: &str) -> Vec<NodeSelectorRequirementWithMinValues> {
        let min_values = self.min_values().and_then(|m| i32::try_from(m).ok());
        let mk = |operator, values: Vec<String>| NodeSelectorRequirementWithMinValues {
            key: key.to_string(),
            operator,
            values: values.into(),
            min_values,
        };
        let mut out = Vec::new();
        match self.operator() {
            Operator::In => out.push(mk(Operator::In, self.values.iter().map(str::to_string).collect())),
            Operator::DoesNotExist => out.push(mk(Operator::DoesNotExist, vec![])),
            Operator::NotIn => {
                out.push(mk(Operator::NotIn, self.values.iter().map(str::to_string).collect()))
            }
            _ => {
                if self.greater_than().is_none() && self.less_than().is_none() {
                    out.push(mk(Operator::Exists, vec![]));
                }
            }
        }
        if self.complement {
            if let Some(g) = self.greater_than() {
                out.push(mk(Operator::Gt, vec![g.to_string()]));
            }
            if let Some(l) = self.less_than() {
                out.push(mk(Operator::Lt, vec![l.to_string()]));
            }
        }
        out
    }
}

impl fmt::Display for Requirement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.describe())
    }
}

/// A label key: one of the well-known keys, shared by every set of requirements that uses it,
/// or an owned copy of any other key. Compared and hashed by its text.
type LabelKey = Cow<'static, str>;

/// The key `key` as stored: the `'static` copy of a well-known label key, else an owned copy.
fn label_key(key: &str) -> LabelKey {
    if key == LABEL_HOSTNAME {
        return Cow::Borrowed(LABEL_HOSTNAME);
    }
    match WELL_KNOWN_LABELS.iter().copied().find(|k| *k == key) {
        Some(k) => Cow::Borrowed(k),
        None => Cow::Owned(key.to_string()),
    }
}

/// Requirements on several label keys; a missing key is unconstrained.
///
/// Kept as a vector sorted by key: an instance type has about 30 keys, for which a vector is
/// several times smaller than a map.
#[derive(Clone, Default, PartialEq, Eq, Hash)]
pub struct Requirements(Vec<(LabelKey, Requirement)>);

impl fmt::Debug for Requirements {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

impl Requirements {
    /// No requirement.
    pub fn new() -> Self {
        Requirements::default()
    }

    /// The position of `key`, or where it would go.
    fn find(&self, key: &str) -> Result<usize, usize> {
        self.0.binary_search_by(|(k, _)| k.as_ref().cmp(key))
    }

    /// One `key In [value]` per label.
    pub fn from_labels<'a>(labels: impl IntoIterator<Item = (&'a String, &'a String)>) -> Self {
        let mut out = Requirements::new();
        for (k, v) in labels {
            let k = normalized_label(k);
            let r = Requirement::in_values([v.clone()]);
            match out.find(k) {
                Ok(i) => out.0[i].1 = r,
                Err(i) => out.0.insert(i, (label_key(k), r)),
            }
        }
        out
    }

    /// From Kubernetes node selector requirements (a pod's node-affinity term).
    pub fn from_node_selector(reqs: &[NodeSelectorRequirement]) -> Result<Self, RequirementError> {
        let mut out = Requirements::new();
        for r in reqs {
            let values = r.values.clone().unwrap_or_default();
            out.add(&r.key, Requirement::from_str_operator(&r.key, &r.operator, &values)?);
        }
        Ok(out)
    }

    /// From NodePool or NodeClaim requirements, keeping `minValues`.
    pub fn from_nodepool(reqs: &[NodeSelectorRequirementWithMinValues]) -> Result<Self, RequirementError> {
        let mut out = Requirements::new();
        for r in reqs {
            let min = r.min_values.and_then(|m| usize::try_from(m).ok());
            out.add(&r.key, Requirement::new(&r.key, r.operator, &r.values)?.with_min_values(min));
        }
        Ok(out)
    }

    /// Intersects `req` into the requirement on `key` (a deprecated key counts as the current one).
    pub fn add(&mut self, key: &str, req: Requirement) {
        let key = normalized_label(key);
        match self.find(key) {
            Ok(i) => self.0[i].1 = self.0[i].1.intersection(&req),
            Err(i) => self.0.insert(i, (label_key(key), req)),
        }
    }

    /// Intersects every requirement of `other` into `self`.
    pub fn add_all(&mut self, other: &Requirements) {
        for (k, r) in &other.0 {
            match self.find(k.as_ref()) {
                Ok(i) => self.0[i].1 = self.0[i].1.intersection(r),
                Err(i) => self.0.insert(i, (k.clone(), r.clone())),
            }
        }
    }

    /// Frees the room kept for more keys (for requirements kept for long, such as an instance
    /// type's).
    pub fn shrink_to_fit(&mut self) {
        self.0.shrink_to_fit();
    }

    /// The requirement on `key`, if constrained.
    pub fn get(&self, key: &str) -> Option<&Requirement> {
        self.find(key).ok().and_then(|i| self.0.get(i)).map(|(_, r)| r)
    }

    /// Whether `key` is constrained.
    pub fn has(&self, key: &str) -> bool {
        self.find(key).is_ok()
    }

    /// Whether there is no requirement.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The constrained keys, sorted.
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.0.iter().map(|(k, _)| k.as_ref())
    }

    /// The requirements in key order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Requirement)> {
        self.0.iter().map(|(k, v)| (k.as_ref(), v))
    }

    /// Whether `key` may take `value` (an unconstrained key may take any).
    pub fn allows(&self, key: &str, value: &str) -> bool {
        self.get(key).is_none_or(|r| r.has(value))
    }

    /// Checks that every key both sides constrain has a common value.
    ///
    /// As upstream, two requirements that both exclude values (`NotIn`/`DoesNotExist`) are never
    /// in conflict. `self` is the existing (node) side, `incoming` the new one.
    pub fn intersects(&self, incoming: &Requirements) -> Result<(), Incompatible> {
        match self.first_conflict(incoming) {
            Some((key, existing, incoming)) => check_key(key, existing, incoming),
            None => Ok(()),
        }
    }

    fn first_conflict<'s>(
        &'s self,
        incoming: &'s Requirements,
    ) -> Option<(&'s str, &'s Requirement, &'s Requirement)> {
        let (small, large, incoming_is_small) =
            if incoming.0.len() <= self.0.len() { (incoming, self, true) } else { (self, incoming, false) };
        for (key, a) in small.iter() {
            let Some(b) = large.get(key) else { continue };
            let (existing, incoming) = if incoming_is_small { (b, a) } else { (a, b) };
            if !keys_compatible(existing, incoming) {
                return Some((key, existing, incoming));
            }
        }
        None
    }

    fn first_undefined<'s>(
        &'s self,
        incoming: &'s Requirements,
        allow_undefined_well_known: bool,
    ) -> Option<&'s str> {
        for (key, r) in incoming.iter() {
            if self.has(key) {
                continue;
            }
            if matches!(r.operator(), Operator::NotIn | Operator::DoesNotExist) {
                continue;
            }
            if allow_undefined_well_known && is_well_known(key) {
                continue;
            }
            return Some(key);
        }
        None
    }

    /// Checks that a pod's requirements (`incoming`) can be met on a node described by `self`.
    ///
    /// Keys the pod requires with `In`/`Exists`/bounds must be defined on the node side, except
    /// well-known labels when `allow_undefined_well_known` (a NodePool need not list every value
    /// of, say, the zone); every key both sides constrain must intersect.
    pub fn compatible(
        &self,
        incoming: &Requirements,
        allow_undefined_well_known: bool,
    ) -> Result<(), Incompatible> {
        if let Some(key) = self.first_undefined(incoming, allow_undefined_well_known) {
            return Err(Incompatible(format!("label {key} does not have known values")));
        }
        self.intersects(incoming)
    }

    /// [`Requirements::compatible`] without building a reason.
    pub fn is_compatible(&self, incoming: &Requirements, allow_undefined_well_known: bool) -> bool {
        self.first_undefined(incoming, allow_undefined_well_known).is_none()
            && self.first_conflict(incoming).is_none()
    }

    /// The labels the requirements pin to a single value.
    pub fn single_valued_labels(&self) -> BTreeMap<String, String> {
        self.iter().filter_map(|(k, r)| r.single().map(|v| (k.to_string(), v.to_string()))).collect()
    }

    /// As NodeClaim requirements.
    pub fn to_node_selector(&self) -> Vec<NodeSelectorRequirementWithMinValues> {
        self.iter().flat_map(|(k, r)| r.to_node_selector(k)).collect()
    }

    /// Removes the requirement on `key`.
    pub fn remove(&mut self, key: &str) -> Option<Requirement> {
        self.find(key).ok().map(|i| self.0.remove(i).1)
    }
}

/// Whether the exclusive integer bounds `greater_than` and `less_than` admit `value`.
fn within(greater_than: Option<i64>, less_than: Option<i64>, value: &str) -> bool {
    if greater_than.is_none() && less_than.is_none() {
        return true;
    }
    let Ok(v) = value.parse::<i64>() else { return false };
    greater_than.is_none_or(|g| v > g) && less_than.is_none_or(|l| v < l)
}

/// Whether two requirements on one key can both hold: they share a value, or both only exclude
/// values.
pub fn keys_compatible(existing: &Requirement, incoming: &Requirement) -> bool {
    if existing.intersects(incoming) {
        return true;
    }
    existing.allows_absent() && incoming.allows_absent()
}

/// Checks one key shared by both sides.
pub fn check_key(key: &str, existing: &Requirement, incoming: &Requirement) -> Result<(), Incompatible> {
    if keys_compatible(existing, incoming) {
        return Ok(());
    }
    let incoming_desc = match incoming.single() {
        Some(v) => v.to_string(),
        None => incoming.describe(),
    };
    Err(Incompatible(format!("key {key}, {incoming_desc} not in {}", existing.describe())))
}

/// Whether Karpenter knows the label's values without the NodePool listing them.
pub fn is_well_known(key: &str) -> bool {
    key == LABEL_HOSTNAME || WELL_KNOWN_LABELS.contains(&key)
}

fn term_requirements(t: &NodeSelectorTerm) -> Result<Requirements, RequirementError> {
    Requirements::from_node_selector(t.match_expressions.as_deref().unwrap_or(&[]))
}

/// The pod's strict node requirements: node selector and required node-affinity terms.
pub fn pod_node_requirements(
    pod: &Pod,
) -> Result<(Requirements, Vec<Requirements>, Vec<Requirements>), RequirementError> {
    let Some(spec) = &pod.spec else { return Ok((Requirements::new(), vec![], vec![])) };
    let base = spec.node_selector.as_ref().map(Requirements::from_labels).unwrap_or_default();
    let na = spec.affinity.as_ref().and_then(|a| a.node_affinity.as_ref());
    let required = na
        .and_then(|n| n.required_during_scheduling_ignored_during_execution.as_ref())
        .map(|s| s.node_selector_terms.iter().map(term_requirements).collect::<Result<Vec<_>, _>>())
        .transpose()?
        .unwrap_or_default();
    let mut preferred: Vec<&PreferredSchedulingTerm> = na
        .and_then(|n| n.preferred_during_scheduling_ignored_during_execution.as_ref())
        .into_iter()
        .flatten()
        .collect();
    preferred.sort_by_key(|p| std::cmp::Reverse(p.weight));
    let preferred =
        preferred.into_iter().map(|p| term_requirements(&p.preference)).collect::<Result<Vec<_>, _>>()?;
    Ok((base, required, preferred))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apis::labels::{LABEL_CAPACITY_TYPE, LABEL_TOPOLOGY_ZONE};
    use rstest::rstest;

    #[test]
    fn deprecated_keys_read_as_the_current_ones() {
        let term = |key: &str, values: &[&str]| NodeSelectorRequirement {
            key: key.into(),
            operator: "In".into(),
            values: Some(values.iter().map(|v| v.to_string()).collect()),
        };
        let pod = Requirements::from_node_selector(&[
            term("failure-domain.beta.kubernetes.io/zone", &["us-west-2a", "us-west-2b"]),
            term("topology.ebs.csi.aws.com/zone", &["us-west-2b", "us-west-2c"]),
            term("beta.kubernetes.io/arch", &["arm64"]),
        ])
        .unwrap();
        assert_eq!(pod.keys().collect::<Vec<_>>(), ["kubernetes.io/arch", LABEL_TOPOLOGY_ZONE]);
        assert!(pod.allows(LABEL_TOPOLOGY_ZONE, "us-west-2b"));
        assert!(!pod.allows(LABEL_TOPOLOGY_ZONE, "us-west-2a"), "both zone terms apply");
        let labels = [("beta.kubernetes.io/os".to_string(), "linux".to_string())];
        let node = Requirements::from_labels(labels.iter().map(|(k, v)| (k, v)));
        assert!(node.allows("kubernetes.io/os", "linux"));
        assert!(!node.has("beta.kubernetes.io/os"));
    }

    fn req(op: Operator, values: &[&str]) -> Requirement {
        let values: Vec<String> = values.iter().map(|s| s.to_string()).collect();
        Requirement::new("k", op, &values).unwrap()
    }

    #[rstest]
    #[case(req(Operator::In, &["a", "b"]), req(Operator::In, &["b", "c"]), &["b"], &["a", "c"])]
    #[case(req(Operator::In, &["a", "b"]), req(Operator::NotIn, &["b"]), &["a"], &["b", "c"])]
    #[case(req(Operator::NotIn, &["a"]), req(Operator::NotIn, &["b"]), &["c"], &["a", "b"])]
    #[case(req(Operator::Exists, &[]), req(Operator::In, &["x"]), &["x"], &["y"])]
    #[case(req(Operator::DoesNotExist, &[]), req(Operator::Exists, &[]), &[], &["x"])]
    #[case(req(Operator::Gt, &["3"]), req(Operator::In, &["2", "4", "x"]), &["4"], &["2", "x", "5"])]
    #[case(req(Operator::Gte, &["3"]), req(Operator::Lte, &["5"]), &["3", "4", "5"], &["2", "6", "x"])]
    #[case(req(Operator::Gt, &["3"]), req(Operator::Lt, &["4"]), &[], &["3", "4"])]
    fn intersection_table(
        #[case] a: Requirement,
        #[case] b: Requirement,
        #[case] allowed: &[&str],
        #[case] denied: &[&str],
    ) {
        let i = a.intersection(&b);
        assert_eq!(i, b.intersection(&a));
        for v in allowed {
            assert!(i.has(v), "{v} should be allowed by {i}");
        }
        for v in denied {
            assert!(!i.has(v), "{v} should be denied by {i}");
        }
        assert_eq!(a.intersects(&b), !i.is_empty());
    }

    fn reqs(items: &[(&str, Operator, &[&str])]) -> Requirements {
        let mut r = Requirements::new();
        for (k, op, vals) in items {
            let vals: Vec<String> = vals.iter().map(|s| s.to_string()).collect();
            r.add(k, Requirement::new(k, *op, &vals).unwrap());
        }
        r
    }

    #[rstest]
    // pool on-demand only, pod wants spot
    #[case(
        reqs(&[(LABEL_CAPACITY_TYPE, Operator::In, &["on-demand"])]),
        reqs(&[(LABEL_CAPACITY_TYPE, Operator::In, &["spot"])]),
        true,
        Some("key karpenter.sh/capacity-type, spot not in [on-demand]")
    )]
    // pool NotIn vs pod In on the same value
    #[case(
        reqs(&[(LABEL_TOPOLOGY_ZONE, Operator::NotIn, &["z1"])]),
        reqs(&[(LABEL_TOPOLOGY_ZONE, Operator::In, &["z1"])]),
        true,
        Some("key topology.kubernetes.io/zone, z1 not in not [z1]")
    )]
    // pool DoesNotExist vs pod In
    #[case(
        reqs(&[("team", Operator::DoesNotExist, &[])]),
        reqs(&[("team", Operator::In, &["a"])]),
        true,
        Some("key team, a not in no value")
    )]
    // both exclude: compatible
    #[case(
        reqs(&[("team", Operator::DoesNotExist, &[])]),
        reqs(&[("team", Operator::NotIn, &["a"])]),
        true,
        None
    )]
    // undefined custom key: In denied, NotIn/DoesNotExist allowed
    #[case(reqs(&[]), reqs(&[("team", Operator::In, &["a"])]), true, Some("label team does not have known values"))]
    #[case(reqs(&[]), reqs(&[("team", Operator::Exists, &[])]), true, Some("label team does not have known values"))]
    #[case(reqs(&[]), reqs(&[("team", Operator::NotIn, &["a"])]), true, None)]
    #[case(reqs(&[]), reqs(&[("team", Operator::DoesNotExist, &[])]), false, None)]
    // undefined well-known key: allowed only for templates
    #[case(reqs(&[]), reqs(&[(LABEL_TOPOLOGY_ZONE, Operator::In, &["z1"])]), true, None)]
    #[case(
        reqs(&[]),
        reqs(&[(LABEL_TOPOLOGY_ZONE, Operator::In, &["z1"])]),
        false,
        Some("label topology.kubernetes.io/zone does not have known values")
    )]
    // numeric bounds
    #[case(
        reqs(&[("karpenter.k8s.aws/instance-cpu", Operator::In, &["4", "8"])]),
        reqs(&[("karpenter.k8s.aws/instance-cpu", Operator::Gt, &["4"])]),
        true,
        None
    )]
    #[case(
        reqs(&[("karpenter.k8s.aws/instance-cpu", Operator::In, &["4"])]),
        reqs(&[("karpenter.k8s.aws/instance-cpu", Operator::Gt, &["4"])]),
        true,
        Some("key karpenter.k8s.aws/instance-cpu, value > 4 not in [4]")
    )]
    fn compatibility_table(
        #[case] node: Requirements,
        #[case] pod: Requirements,
        #[case] allow_undefined: bool,
        #[case] err: Option<&str>,
    ) {
        let got = node.compatible(&pod, allow_undefined).err().map(|e| e.0);
        assert_eq!(got.as_deref(), err);
    }

    #[test]
    fn builds_from_apis_and_back() {
        let r = Requirements::from_nodepool(&[NodeSelectorRequirementWithMinValues {
            key: "karpenter.k8s.aws/instance-family".into(),
            operator: Operator::In,
            values: ["m5", "c5"].into(),
            min_values: Some(2),
        }])
        .unwrap();
        assert_eq!(r.get("karpenter.k8s.aws/instance-family").unwrap().min_values(), Some(2));
        let back = r.to_node_selector();
        assert_eq!(back[0].values, vec!["c5".to_string(), "m5".to_string()]);
        assert_eq!(back[0].min_values, Some(2));
        let ns = Requirements::from_node_selector(&[NodeSelectorRequirement {
            key: "a".into(),
            operator: "Bogus".into(),
            values: None,
        }]);
        assert!(matches!(ns, Err(RequirementError::UnknownOperator { .. })));
        assert!(Requirement::new("a", Operator::Gt, &["x".to_string()]).is_err());
        let labels: BTreeMap<String, String> = [("a".to_string(), "1".to_string())].into();
        let l = Requirements::from_labels(&labels);
        assert_eq!(l.single_valued_labels(), labels);
        assert_eq!(req(Operator::Gt, &["3"]).any().as_deref(), Some("4"));
        assert_eq!(req(Operator::Exists, &[]).any(), None);
    }
}

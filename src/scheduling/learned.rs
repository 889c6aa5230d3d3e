//! Extended resources learned from nodes (pure).
//!
//! A device plugin (GPUs, FUSE devices, vendor hardware) or a kubelet setting (huge pages) gives a
//! node resources that no catalog knows, and pods that request them would otherwise wait forever.
//! When a registered node of a NodePool reports such a resource and its instance type (as the
//! NodeOverlays leave it) lacks it, the type learns it for that NodePool:
//!
//! - [`taught`] is what one node teaches its type;
//! - [`Learned::desired`] folds what every node of a NodePool teaches into what the NodePool
//!   already learned: per type and resource, the smallest amount a node of the type reports now
//!   (a plan never counts on more than every node has), and what was learned before for the
//!   others;
//! - [`Learned::apply`] adds what was learned to the NodePool's instance types, only where a type
//!   lacks the resource, so that the catalog and the NodeOverlays always win. Huge pages come out
//!   of the memory pods can use, as the kubelet takes them.
//!
//! What a NodePool learned is kept in its [`ANNOTATION_LEARNED_RESOURCES`] annotation, a JSON
//! object of instance type to resource to quantity, so that it outlives the controller and can be
//! read (and forgotten) with kubectl.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use crate::apis::NodePool;

use super::instancetypes::InstanceType;
use super::resources::{MEMORY, Resources, format_quantity, parse_quantity_for};

/// The NodePool annotation that keeps what its instance types learned.
pub const ANNOTATION_LEARNED_RESOURCES: &str = "karpenter-rs.dev/learned-resources";

/// Why a NodePool's learned resources cannot be read.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LearnedError {
    /// The annotation is not a JSON object of instance type to resource to quantity.
    #[error(
        "annotation {ANNOTATION_LEARNED_RESOURCES} is not an object of instance type to resource to quantity: {0}"
    )]
    Malformed(String),
    /// A quantity cannot be read, or names a resource that is never learned.
    #[error("annotation {ANNOTATION_LEARNED_RESOURCES}: {instance_type} {resource}: {problem}")]
    Invalid {
        /// The instance type.
        instance_type: String,
        /// The resource.
        resource: String,
        /// What is wrong with it.
        problem: String,
    },
}

/// Per instance type, the extended resources a NodePool learned and their amounts.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Learned(BTreeMap<String, BTreeMap<String, i64>>);

/// Whether nodes can teach `resource`: huge pages and extended resources (a domain outside
/// `kubernetes.io`, as `nvidia.com/gpu`); never CPU, memory, storage, pods or volume limits.
pub fn is_learnable(resource: &str) -> bool {
    if resource.starts_with("hugepages-") {
        return true;
    }
    match resource.split_once('/') {
        Some((domain, name)) => {
            !name.is_empty()
                && domain != "kubernetes.io"
                && !domain.ends_with(".kubernetes.io")
                && !resource.starts_with("requests.")
        }
        None => false,
    }
}

/// What a node of `it` teaches: the learnable resources it reports in `capacity` (and has
/// allocatable: a device plugin that went away leaves its capacity behind) that `it` lacks.
pub fn taught(capacity: &Resources, allocatable: &Resources, it: &InstanceType) -> BTreeMap<String, i64> {
    capacity
        .iter()
        .filter(|(name, amount)| {
            *amount > 0 && is_learnable(name) && allocatable.get(name) > 0 && it.capacity.get(name) <= 0
        })
        .map(|(name, amount)| (name.to_string(), amount))
        .collect()
}

impl Learned {
    /// Nothing learned.
    pub fn new() -> Self {
        Learned::default()
    }

    /// What `np` learned, from its annotation (nothing when it has none).
    pub fn of_nodepool(np: &NodePool) -> Result<Self, LearnedError> {
        match np.metadata.annotations.as_ref().and_then(|a| a.get(ANNOTATION_LEARNED_RESOURCES)) {
            Some(text) => Learned::parse(text),
            None => Ok(Learned::new()),
        }
    }

    /// Reads the annotation's text.
    pub fn parse(text: &str) -> Result<Self, LearnedError> {
        let raw: BTreeMap<String, BTreeMap<String, String>> =
            serde_json::from_str(text).map_err(|e| LearnedError::Malformed(e.to_string()))?;
        let mut learned = BTreeMap::new();
        for (instance_type, resources) in raw {
            let mut amounts = BTreeMap::new();
            for (resource, quantity) in resources {
                let invalid = |problem: String| LearnedError::Invalid {
                    instance_type: instance_type.clone(),
                    resource: resource.clone(),
                    problem,
                };
                if !is_learnable(&resource) {
                    return Err(invalid("not an extended resource".to_string()));
                }
                let amount =
                    parse_quantity_for(&resource, &Quantity(quantity)).map_err(|e| invalid(e.to_string()))?;
                if amount > 0 {
                    amounts.insert(resource, amount);
                }
            }
            if !amounts.is_empty() {
                learned.insert(instance_type, amounts);
            }
        }
        Ok(Learned(learned))
    }

    /// The annotation's text.
    pub fn to_annotation(&self) -> String {
        let raw: BTreeMap<&str, BTreeMap<&str, String>> = self
            .0
            .iter()
            .map(|(it, resources)| {
                (it.as_str(), resources.iter().map(|(r, v)| (r.as_str(), format_quantity(r, *v))).collect())
            })
            .collect();
        serde_json::to_string(&raw).unwrap_or_default()
    }

    /// Whether nothing was learned.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// What `instance_type` learned.
    pub fn of_type(&self, instance_type: &str) -> Option<&BTreeMap<String, i64>> {
        self.0.get(instance_type)
    }

    /// Every instance type that learned something, with what it learned.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &BTreeMap<String, i64>)> {
        self.0.iter().map(|(it, r)| (it.as_str(), r))
    }

    /// What the NodePool should keep: what it learned, with each resource that nodes teach now
    /// (`now`: instance type to the smallest amount of each resource its nodes report) at the
    /// amount they teach. What no node teaches now is kept as it was learned.
    pub fn desired(&self, now: &BTreeMap<String, BTreeMap<String, i64>>) -> Learned {
        let mut learned = self.0.clone();
        for (it, resources) in now {
            if resources.is_empty() {
                continue;
            }
            let entry = learned.entry(it.clone()).or_default();
            for (resource, amount) in resources {
                entry.insert(resource.clone(), *amount);
            }
        }
        Learned(learned)
    }

    /// `types` with what was learned added: to each type, the resources it lacks (a type that
    /// has a resource, from the catalog or a NodeOverlay, keeps its own amount). Types that learn
    /// nothing are shared, not copied.
    pub fn apply(&self, types: Vec<Arc<InstanceType>>) -> Vec<Arc<InstanceType>> {
        if self.0.is_empty() {
            return types;
        }
        types
            .into_iter()
            .map(|it| {
                let Some(resources) = self.0.get(&it.name) else { return it };
                let mut lacking: BTreeMap<String, i64> = resources
                    .iter()
                    .filter(|(r, _)| it.capacity.get(r) <= 0)
                    .map(|(r, v)| (r.clone(), *v))
                    .collect();
                let huge_pages: i64 =
                    lacking.iter().filter(|(r, _)| r.starts_with("hugepages-")).map(|(_, v)| *v).sum();
                if huge_pages > 0 {
                    lacking.insert(MEMORY.to_string(), (it.capacity.get(MEMORY) - huge_pages).max(0));
                }
                if lacking.is_empty() { it } else { Arc::new(it.with_capacity(&lacking)) }
            })
            .collect()
    }
}

/// Folds what one node teaches into `now` (instance type to resource to the smallest amount a
/// node teaching it reports).
pub fn fold_taught(
    now: &mut BTreeMap<String, BTreeMap<String, i64>>,
    instance_type: &str,
    taught: BTreeMap<String, i64>,
) {
    if taught.is_empty() {
        return;
    }
    let entry = now.entry(instance_type.to_string()).or_default();
    for (resource, amount) in taught {
        entry.entry(resource).and_modify(|v| *v = (*v).min(amount)).or_insert(amount);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduling::instancetypes::{Offering, Overhead};
    use crate::scheduling::requirements::Requirements;

    fn it(name: &str, extra: &[(&str, i64)]) -> Arc<InstanceType> {
        let mut pairs = vec![("cpu", 4000), ("memory", 16 << 30), ("pods", 58)];
        pairs.extend_from_slice(extra);
        Arc::new(InstanceType::new(
            name,
            Requirements::new(),
            Resources::from_pairs(pairs),
            Overhead::default(),
            vec![Offering::new("us-east-1a", "on-demand", 0.2, true)],
        ))
    }

    fn resources(pairs: &[(&str, i64)]) -> Resources {
        Resources::from_pairs(pairs.iter().copied())
    }

    #[rstest::rstest]
    #[case::a_vendor_device("smarter-devices/fuse", true)]
    #[case::a_gpu("nvidia.com/gpu", true)]
    #[case::huge_pages("hugepages-2Mi", true)]
    #[case::cpu("cpu", false)]
    #[case::memory("memory", false)]
    #[case::pods("pods", false)]
    #[case::ephemeral_storage("ephemeral-storage", false)]
    #[case::volume_limits("attachable-volumes-aws-ebs", false)]
    #[case::kubernetes_io("kubernetes.io/something", false)]
    #[case::a_kubernetes_io_subdomain("node.kubernetes.io/thing", false)]
    #[case::no_name("example.com/", false)]
    fn which_resources_nodes_teach(#[case] resource: &str, #[case] learnable: bool) {
        assert_eq!(is_learnable(resource), learnable);
    }

    #[test]
    fn a_node_teaches_what_its_type_lacks_and_has_allocatable() {
        let m5 = it("m5.xlarge", &[("nvidia.com/gpu", 1)]);
        let capacity = resources(&[
            ("cpu", 4000),
            ("smarter-devices/fuse", 20),
            ("nvidia.com/gpu", 2),
            ("hugepages-2Mi", 0),
            ("example.com/gone", 3),
        ]);
        let allocatable = resources(&[("cpu", 3920), ("smarter-devices/fuse", 20), ("nvidia.com/gpu", 2)]);
        let taught = taught(&capacity, &allocatable, &m5);
        // The GPU is the type's own (the catalog wins); huge pages of zero teach nothing; a
        // device plugin that went away left capacity but nothing allocatable.
        assert_eq!(taught, BTreeMap::from([("smarter-devices/fuse".to_string(), 20)]));
    }

    #[test]
    fn the_annotation_round_trips_and_bad_ones_are_refused_with_the_reason() {
        let text = r#"{"m5.xlarge":{"hugepages-2Mi":"1Gi","smarter-devices/fuse":"20"}}"#;
        let learned = Learned::parse(text).unwrap();
        assert_eq!(learned.of_type("m5.xlarge").unwrap()["hugepages-2Mi"], 1 << 30);
        assert_eq!(Learned::parse(&learned.to_annotation()).unwrap(), learned);

        let not_json = Learned::parse("fuse").unwrap_err();
        assert!(matches!(not_json, LearnedError::Malformed(_)), "{not_json}");
        let cpu = Learned::parse(r#"{"m5.xlarge":{"cpu":"4"}}"#).unwrap_err().to_string();
        assert!(cpu.contains("m5.xlarge cpu: not an extended resource"), "{cpu}");
        let bad = Learned::parse(r#"{"m5.xlarge":{"example.com/x":"lots"}}"#).unwrap_err().to_string();
        assert!(bad.contains("m5.xlarge example.com/x"), "{bad}");
        assert_eq!(Learned::parse("{}").unwrap(), Learned::new());
    }

    #[test]
    fn types_lacking_a_resource_learn_it_and_the_catalog_and_overlays_win() {
        let learned = Learned::parse(
            r#"{"m5.xlarge":{"example.com/fuse":"20","nvidia.com/gpu":"8"},"c5.large":{"example.com/fuse":"4"}}"#,
        )
        .unwrap();
        // g-type: the catalog (or a NodeOverlay, applied before) says one GPU.
        let m5 = it("m5.xlarge", &[("nvidia.com/gpu", 1)]);
        let r5 = it("r5.large", &[]);
        let types = learned.apply(vec![m5.clone(), r5.clone()]);
        assert_eq!(types[0].capacity.get("example.com/fuse"), 20);
        assert_eq!(types[0].allocatable().get("example.com/fuse"), 20);
        assert_eq!(types[0].capacity.get("nvidia.com/gpu"), 1, "the type's own amount wins");
        assert!(Arc::ptr_eq(&types[1], &r5), "a type that learned nothing is shared");

        // Huge pages come out of the memory pods can use.
        let huge = Learned::parse(r#"{"r5.large":{"hugepages-2Mi":"1Gi"}}"#).unwrap();
        let r5 = &huge.apply(vec![r5])[0];
        assert_eq!(r5.allocatable().get("hugepages-2Mi"), 1 << 30);
        assert_eq!(r5.allocatable().get("memory"), 15 << 30);
    }

    #[test]
    fn what_nodes_teach_now_replaces_what_their_type_learned_and_other_types_keep_theirs() {
        let before =
            Learned::parse(r#"{"m5.xlarge":{"example.com/fuse":"20"},"c5.large":{"example.com/fuse":"4"}}"#)
                .unwrap();
        let mut now = BTreeMap::new();
        fold_taught(&mut now, "m5.xlarge", BTreeMap::from([("example.com/fuse".to_string(), 10)]));
        fold_taught(&mut now, "m5.xlarge", BTreeMap::from([("example.com/fuse".to_string(), 12)]));
        fold_taught(&mut now, "m5.xlarge", BTreeMap::from([("hugepages-2Mi".to_string(), 1 << 30)]));
        fold_taught(&mut now, "r5.large", BTreeMap::new());
        let desired = before.desired(&now);
        let m5 = desired.of_type("m5.xlarge").unwrap();
        assert_eq!(m5["example.com/fuse"], 10, "the smallest amount a node reports now");
        assert_eq!(m5["hugepages-2Mi"], 1 << 30);
        assert_eq!(desired.of_type("c5.large").unwrap()["example.com/fuse"], 4);
        assert!(desired.of_type("r5.large").is_none());
        assert_eq!(before.desired(&BTreeMap::new()), before, "nothing taught, nothing changes");
    }
}

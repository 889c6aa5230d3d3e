//! A copy of the caches at one moment, and the pure functions that turn it into the
//! scheduler's input: which pods are provisionable, what existing and in-flight capacity there
//! is, and how much of each NodePool's limits is used.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Namespace, Node, PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::{CSINode, StorageClass};

use crate::apis::labels::{LABEL_INITIALIZED, LABEL_INSTANCE_TYPE, LABEL_NODEPOOL};
use crate::apis::{EC2NodeClass, NodeClaim, NodePool, Operator, Taint};
use crate::scheduling::resources::{NODES, pod_requests};
use crate::scheduling::{ExistingNode, InstanceType, Requirements, Resources, VolumeInput};

/// The objects a decision looks at.
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    /// Pods.
    pub pods: Vec<Arc<Pod>>,
    /// Nodes.
    pub nodes: Vec<Arc<Node>>,
    /// NodeClaims.
    pub nodeclaims: Vec<Arc<NodeClaim>>,
    /// NodePools.
    pub nodepools: Vec<Arc<NodePool>>,
    /// EC2NodeClasses.
    pub nodeclasses: Vec<Arc<EC2NodeClass>>,
    /// DaemonSets.
    pub daemonsets: Vec<Arc<DaemonSet>>,
    /// Namespaces.
    pub namespaces: Vec<Arc<Namespace>>,
    /// PersistentVolumes.
    pub persistent_volumes: Vec<Arc<PersistentVolume>>,
    /// PersistentVolumeClaims.
    pub persistent_volume_claims: Vec<Arc<PersistentVolumeClaim>>,
    /// StorageClasses.
    pub storage_classes: Vec<Arc<StorageClass>>,
    /// CSINodes.
    pub csi_nodes: Vec<Arc<CSINode>>,
}

fn name_of(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> String {
    meta.name.clone().unwrap_or_default()
}

/// `namespace/name` of a pod.
pub fn pod_key(pod: &Pod) -> String {
    format!(
        "{}/{}",
        pod.metadata.namespace.as_deref().unwrap_or_default(),
        pod.metadata.name.as_deref().unwrap_or_default()
    )
}

/// Whether a pod is one Karpenter should provision capacity for: the kube-scheduler marked it
/// unschedulable, it is not bound, not terminating, not finished, and no DaemonSet or Node
/// (static pods) owns it.
pub fn is_provisionable(pod: &Pod) -> bool {
    if pod.metadata.deletion_timestamp.is_some() {
        return false;
    }
    let Some(spec) = &pod.spec else { return false };
    if spec.node_name.as_deref().is_some_and(|n| !n.is_empty()) {
        return false;
    }
    if is_finished(pod) || is_owned_by_daemonset_or_node(pod) {
        return false;
    }
    pod.status.as_ref().and_then(|s| s.conditions.as_ref()).into_iter().flatten().any(|c| {
        c.type_ == "PodScheduled" && c.status == "False" && c.reason.as_deref() == Some("Unschedulable")
    })
}

/// Whether the pod has terminated for good.
pub fn is_finished(pod: &Pod) -> bool {
    matches!(pod.status.as_ref().and_then(|s| s.phase.as_deref()), Some("Succeeded" | "Failed"))
}

/// Whether a DaemonSet or a Node (a mirror pod) owns the pod.
pub fn is_owned_by_daemonset_or_node(pod: &Pod) -> bool {
    pod.metadata.owner_references.iter().flatten().any(|o| o.kind == "DaemonSet" || o.kind == "Node")
}

/// Whether a NodeClaim is being launched or runs a node that has not registered yet.
fn node_of_claim<'a>(claim: &NodeClaim, nodes_by_provider: &HashMap<&str, &'a Node>) -> Option<&'a Node> {
    let pid = claim.status.as_ref().and_then(|s| s.provider_id.as_deref())?;
    nodes_by_provider.get(pid).copied()
}

fn taints_of(taints: Option<&Vec<k8s_openapi::api::core::v1::Taint>>) -> Vec<Taint> {
    taints.into_iter().flatten().filter_map(Taint::from_k8s).collect()
}

/// The usage of every NodePool: the capacity of its nodes and NodeClaims (`nodes` counts them).
/// A NodeClaim that has not launched yet counts the largest instance type it may still become
/// (from `catalog`, by name), so that limits hold whichever type the cloud picks.
pub fn nodepool_usage(
    snapshot: &Snapshot,
    catalog: &HashMap<String, Arc<InstanceType>>,
) -> BTreeMap<String, Resources> {
    let mut usage: BTreeMap<String, Resources> = BTreeMap::new();
    let mut counted_providers: BTreeSet<&str> = BTreeSet::new();
    for claim in &snapshot.nodeclaims {
        let Some(np) = claim.metadata.labels.as_ref().and_then(|l| l.get(LABEL_NODEPOOL)) else { continue };
        let capacity = claim_capacity(claim, catalog);
        let used = usage.entry(np.clone()).or_default();
        used.add_assign(&capacity);
        used.set(NODES, used.get(NODES) + 1);
        if let Some(pid) = claim.status.as_ref().and_then(|s| s.provider_id.as_deref()) {
            counted_providers.insert(pid);
        }
    }
    // Nodes of a NodePool without a NodeClaim (e.g. created before the claim was cached).
    for node in &snapshot.nodes {
        let Some(np) = node.metadata.labels.as_ref().and_then(|l| l.get(LABEL_NODEPOOL)) else { continue };
        let pid = node.spec.as_ref().and_then(|s| s.provider_id.as_deref()).unwrap_or_default();
        if counted_providers.contains(pid) {
            continue;
        }
        let capacity = node.status.as_ref().and_then(|s| s.capacity.as_ref());
        let used = usage.entry(np.clone()).or_default();
        if let Some(Ok(r)) = capacity.map(Resources::from_list) {
            used.add_assign(&r);
        }
        used.set(NODES, used.get(NODES) + 1);
    }
    usage
}

/// What a NodeClaim counts against its NodePool's limits.
pub fn claim_capacity(claim: &NodeClaim, catalog: &HashMap<String, Arc<InstanceType>>) -> Resources {
    if let Some(cap) = claim.status.as_ref().and_then(|s| s.capacity.as_ref())
        && let Ok(r) = Resources::from_list(cap)
        && !r.is_zero()
    {
        return r;
    }
    let mut max = Resources::default();
    let types =
        claim.spec.requirements.iter().find(|r| r.key == LABEL_INSTANCE_TYPE && r.operator == Operator::In);
    if let Some(req) = types {
        for name in &req.values {
            if let Some(it) = catalog.get(name) {
                max = max.max(&it.capacity);
            }
        }
    }
    if max.is_zero()
        && let Some(requests) = claim.spec.resources.as_ref().and_then(|r| r.requests.as_ref())
        && let Ok(r) = Resources::from_list(requests)
    {
        max = r;
    }
    max
}

/// Nodes and in-flight NodeClaims as the scheduler sees them, with the pods bound to each.
///
/// Nodes being deleted are left out (their pods will need a place too). A NodeClaim whose node
/// has not registered is in-flight capacity: its labels are its own labels plus its
/// single-valued requirements, its allocatable what the cloud reported at launch or, before
/// that, the requests it was created for, so the pods it was created for fit on it again and a
/// later batch does not launch a second node for them.
pub fn existing_nodes(snapshot: &Snapshot) -> Vec<ExistingNode> {
    let mut bound: HashMap<&str, Vec<Arc<Pod>>> = HashMap::new();
    for pod in &snapshot.pods {
        if is_finished(pod) {
            continue;
        }
        if let Some(node) = pod.spec.as_ref().and_then(|s| s.node_name.as_deref()).filter(|n| !n.is_empty()) {
            bound.entry(node).or_default().push(Arc::clone(pod));
        }
    }
    let nodes_by_provider: HashMap<&str, &Node> = snapshot
        .nodes
        .iter()
        .filter_map(|n| n.spec.as_ref().and_then(|s| s.provider_id.as_deref()).map(|p| (p, n.as_ref())))
        .collect();
    let mut out = Vec::new();
    for node in &snapshot.nodes {
        if node.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let name = name_of(&node.metadata);
        let labels = node.metadata.labels.clone().unwrap_or_default();
        let managed = labels.contains_key(LABEL_NODEPOOL);
        let initialized = !managed || labels.get(LABEL_INITIALIZED).is_some_and(|v| v == "true");
        let status = node.status.as_ref();
        let alloc_list = status.and_then(|s| s.allocatable.as_ref().or(s.capacity.as_ref()));
        let allocatable = alloc_list.and_then(|l| Resources::from_list(l).ok()).unwrap_or_default();
        let pods = bound.remove(name.as_str()).unwrap_or_default();
        let mut requested = Resources::default();
        for p in &pods {
            requested.add_assign(&pod_requests(p));
        }
        // Startup taints of the claim are ignored while the node initializes.
        let claim = snapshot.nodeclaims.iter().find(|c| {
            let pid = node.spec.as_ref().and_then(|s| s.provider_id.as_deref());
            pid.is_some() && c.status.as_ref().and_then(|s| s.provider_id.as_deref()) == pid
        });
        out.push(ExistingNode {
            name,
            labels,
            taints: taints_of(node.spec.as_ref().and_then(|s| s.taints.as_ref())),
            startup_taints: claim.map(|c| c.spec.startup_taints.clone()).unwrap_or_default(),
            initialized,
            allocatable,
            requested,
            pods,
        });
    }
    for claim in &snapshot.nodeclaims {
        if claim.metadata.deletion_timestamp.is_some() || node_of_claim(claim, &nodes_by_provider).is_some() {
            continue;
        }
        let mut labels = claim.metadata.labels.clone().unwrap_or_default();
        if let Ok(reqs) = Requirements::from_nodepool(&claim.spec.requirements) {
            for (k, v) in reqs.single_valued_labels() {
                labels.entry(k).or_insert(v);
            }
        }
        let launched = claim.status.as_ref().and_then(|s| s.allocatable.as_ref());
        let requests = claim.spec.resources.as_ref().and_then(|r| r.requests.as_ref());
        let allocatable =
            launched.or(requests).and_then(|l| Resources::from_list(l).ok()).unwrap_or_default();
        out.push(ExistingNode {
            name: name_of(&claim.metadata),
            labels,
            taints: claim.spec.taints.clone(),
            startup_taints: claim.spec.startup_taints.clone(),
            initialized: false,
            allocatable,
            requested: Resources::default(),
            pods: vec![],
        });
    }
    out
}

/// One pod per DaemonSet, from its template: what each new node will run besides the workload.
pub fn daemonset_pods(snapshot: &Snapshot) -> Vec<Pod> {
    snapshot
        .daemonsets
        .iter()
        .filter(|ds| ds.metadata.deletion_timestamp.is_none())
        .filter_map(|ds| {
            let template = ds.spec.as_ref()?.template.clone();
            let mut meta = template.metadata.unwrap_or_default();
            meta.namespace = ds.metadata.namespace.clone();
            meta.name = ds.metadata.name.clone();
            Some(Pod { metadata: meta, spec: template.spec, status: None })
        })
        .collect()
}

/// Labels of every namespace.
pub fn namespace_labels(snapshot: &Snapshot) -> BTreeMap<String, BTreeMap<String, String>> {
    snapshot
        .namespaces
        .iter()
        .map(|ns| (name_of(&ns.metadata), ns.metadata.labels.clone().unwrap_or_default()))
        .collect()
}

/// Claims, volumes, storage classes and attach limits, for the pods' volumes.
pub fn volume_input(snapshot: &Snapshot) -> VolumeInput {
    let mut out = VolumeInput::default();
    for pvc in &snapshot.persistent_volume_claims {
        out.add_claim(pvc);
    }
    for pv in &snapshot.persistent_volumes {
        out.add_volume(pv);
    }
    for sc in &snapshot.storage_classes {
        out.add_class(sc);
    }
    for node in &snapshot.csi_nodes {
        out.add_csi_node(node);
    }
    out
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{Container, PodCondition, PodSpec, PodStatus, ResourceRequirements};
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};

    use super::*;
    use crate::apis::{
        NodeClaimSpec, NodeClaimStatus, NodeClassReference, NodeSelectorRequirementWithMinValues,
    };

    fn pending(name: &str, cpu: &str) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("default".into()),
                ..Default::default()
            },
            spec: Some(PodSpec {
                containers: vec![Container {
                    name: "c".into(),
                    resources: Some(ResourceRequirements {
                        requests: Some([("cpu".to_string(), Quantity(cpu.into()))].into()),
                        ..Default::default()
                    }),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            status: Some(PodStatus {
                phase: Some("Pending".into()),
                conditions: Some(vec![PodCondition {
                    type_: "PodScheduled".into(),
                    status: "False".into(),
                    reason: Some("Unschedulable".into()),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
        }
    }

    #[test]
    fn provisionable_pods() {
        assert!(is_provisionable(&pending("a", "1")));
        let mut bound = pending("b", "1");
        bound.spec.as_mut().unwrap().node_name = Some("n".into());
        assert!(!is_provisionable(&bound));
        let mut ds = pending("c", "1");
        ds.metadata.owner_references =
            Some(vec![OwnerReference { kind: "DaemonSet".into(), name: "d".into(), ..Default::default() }]);
        assert!(!is_provisionable(&ds));
        let mut gated = pending("d", "1");
        gated.status.as_mut().unwrap().conditions.as_mut().unwrap()[0].reason =
            Some("SchedulingGated".into());
        assert!(!is_provisionable(&gated));
        let mut deleting = pending("e", "1");
        deleting.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
        assert!(!is_provisionable(&deleting));
        let mut fresh = pending("f", "1");
        fresh.status = None;
        assert!(!is_provisionable(&fresh), "not yet seen by the kube-scheduler");
    }

    fn claim(name: &str, pool: &str, types: &[&str], provider_id: Option<&str>) -> NodeClaim {
        let mut c = NodeClaim::new(
            name,
            NodeClaimSpec {
                taints: vec![],
                startup_taints: vec![],
                requirements: vec![NodeSelectorRequirementWithMinValues {
                    key: LABEL_INSTANCE_TYPE.into(),
                    operator: Operator::In,
                    values: types.iter().map(|s| s.to_string()).collect(),
                    min_values: None,
                }],
                resources: Some(crate::apis::nodeclaim::ResourceRequirements {
                    requests: Some([("cpu".to_string(), Quantity("1500m".into()))].into()),
                }),
                node_class_ref: NodeClassReference::default(),
                expire_after: "720h".into(),
                termination_grace_period: None,
            },
        );
        c.metadata.labels = Some([(LABEL_NODEPOOL.to_string(), pool.to_string())].into());
        c.status = provider_id.map(|p| NodeClaimStatus { provider_id: Some(p.into()), ..Default::default() });
        c
    }

    fn it(name: &str, cpu: i64) -> Arc<InstanceType> {
        Arc::new(InstanceType::new(
            name,
            Requirements::new(),
            Resources::from_pairs([("cpu", cpu * 1000)]),
            Default::default(),
            vec![],
        ))
    }

    #[test]
    fn unlaunched_claims_count_their_largest_type_against_limits() {
        let catalog: HashMap<String, Arc<InstanceType>> =
            [("small".to_string(), it("small", 2)), ("big".to_string(), it("big", 8))].into();
        let snapshot = Snapshot {
            nodeclaims: vec![
                Arc::new(claim("a", "p", &["small", "big"], None)),
                Arc::new(claim("b", "p", &["small"], None)),
            ],
            ..Default::default()
        };
        let usage = nodepool_usage(&snapshot, &catalog);
        assert_eq!(usage["p"].get("cpu"), 10_000);
        assert_eq!(usage["p"].get(NODES), 2);
    }

    #[test]
    fn in_flight_claims_are_capacity_for_the_pods_they_were_made_for() {
        let snapshot =
            Snapshot { nodeclaims: vec![Arc::new(claim("a", "p", &["small"], None))], ..Default::default() };
        let nodes = existing_nodes(&snapshot);
        assert_eq!(nodes.len(), 1);
        assert_eq!(nodes[0].name, "a");
        assert!(!nodes[0].initialized);
        assert_eq!(nodes[0].allocatable.get("cpu"), 1500);
        assert_eq!(nodes[0].labels.get(LABEL_INSTANCE_TYPE).map(String::as_str), Some("small"));
    }

    #[test]
    fn volume_input_holds_claims_volumes_classes_and_limits() {
        fn obj<T: serde::de::DeserializeOwned>(v: serde_json::Value) -> Arc<T> {
            Arc::new(serde_json::from_value(v).unwrap())
        }
        let snapshot = Snapshot {
            persistent_volume_claims: vec![obj(
                serde_json::json!({"metadata": {"name": "data", "namespace": "shop"},
                "spec": {"volumeName": "pv-1", "storageClassName": "gp3"}}),
            )],
            persistent_volumes: vec![obj(serde_json::json!({"metadata": {"name": "pv-1"},
                "spec": {"csi": {"driver": "ebs.csi.aws.com", "volumeHandle": "vol-1"}}}))],
            storage_classes: vec![obj(
                serde_json::json!({"metadata": {"name": "gp3"}, "provisioner": "ebs.csi.aws.com"}),
            )],
            csi_nodes: vec![obj(serde_json::json!({"metadata": {"name": "n1"}, "spec": {"drivers": [
                {"name": "ebs.csi.aws.com", "nodeID": "i-1", "allocatable": {"count": 25}}]}}))],
            ..Default::default()
        };
        let v = volume_input(&snapshot);
        assert_eq!(v.claims["shop"]["data"].volume_name.as_deref(), Some("pv-1"));
        assert_eq!(v.volumes["pv-1"].driver.as_deref(), Some("ebs.csi.aws.com"));
        assert_eq!(v.classes["gp3"].provisioner, "ebs.csi.aws.com");
        assert_eq!(v.attach_limits["n1"]["ebs.csi.aws.com"], 25);
    }

    #[test]
    fn registered_claims_are_represented_by_their_node_with_its_pods() {
        let mut node = Node::default();
        node.metadata.name = Some("n1".into());
        node.metadata.labels = Some([(LABEL_NODEPOOL.to_string(), "p".to_string())].into());
        node.spec = Some(k8s_openapi::api::core::v1::NodeSpec {
            provider_id: Some("kwok://n1".into()),
            ..Default::default()
        });
        let mut pod = pending("x", "250m");
        pod.spec.as_mut().unwrap().node_name = Some("n1".into());
        let snapshot = Snapshot {
            nodes: vec![Arc::new(node)],
            nodeclaims: vec![Arc::new(claim("a", "p", &["small"], Some("kwok://n1")))],
            pods: vec![Arc::new(pod)],
            ..Default::default()
        };
        let nodes = existing_nodes(&snapshot);
        assert_eq!(nodes.len(), 1);
        assert_eq!(nodes[0].name, "n1");
        assert!(!nodes[0].initialized);
        assert_eq!(nodes[0].requested.get("cpu"), 250);
        assert_eq!(nodes[0].pods.len(), 1);
    }
}

//! A copy of the caches at one moment, with what this process knew then (nominations, deletion
//! marks) and, when a decision needs them, the instance types of each NodePool: the only input
//! the pure parts see. [`super::statenode`] joins it into nodes, [`super::input`] turns it into
//! the scheduler's input, [`super::usage`] into NodePool usage.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use crate::apis::pod::{Pod, PodSpec};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{LimitRange, Namespace, Node, PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::storage::v1::{CSINode, StorageClass};

use crate::apis::{EC2NodeClass, NodeClaim, NodePool};
use crate::scheduling::{InstanceType, VolumeInput};

use super::{limitranges, pods};

/// Instance types by name, for prices and the capacity of NodeClaims not launched yet.
pub type TypesByName = std::collections::HashMap<String, Arc<InstanceType>>;

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
    /// PodDisruptionBudgets.
    pub pdbs: Vec<Arc<PodDisruptionBudget>>,
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
    /// LimitRanges.
    pub limit_ranges: Vec<Arc<LimitRange>>,
    /// Names of the nodes and NodeClaims pods were nominated to within the nomination window.
    pub nominated: HashSet<String>,
    /// Names of the NodeClaims a decision of this process is deleting.
    pub marked_for_deletion: HashSet<String>,
    /// The instance types each NodePool may launch (by NodePool name), when resolved; a NodePool
    /// missing here launches nothing.
    pub pool_types: BTreeMap<String, Vec<Arc<InstanceType>>>,
    /// Every instance type of `pool_types`, by name, as the cloud provider offers it (a type a
    /// NodeOverlay changed in one NodePool is in `pool_overlaid`).
    pub types_by_name: TypesByName,
    /// Per NodePool, the instance types a NodeOverlay changed there, by name.
    pub pool_overlaid: BTreeMap<String, TypesByName>,
    /// Why a live NodePool has no entry in `pool_types`, when that is known (its node class is
    /// not ready, say).
    pub pool_errors: BTreeMap<String, String>,
    /// Placeholder pods of CapacityBuffers: capacity is kept for them as for pending pods, and
    /// they never exist in the cluster.
    pub virtual_pods: Vec<Arc<Pod>>,
    /// Where the provisioner's last pass placed the placeholder pods: emptiness leaves the
    /// nodes and NodeClaims that hold any, as upstream.
    pub buffers_placed: super::BuffersPlaced,
}

impl Snapshot {
    /// With the instance types of each NodePool.
    pub fn with_instance_types(mut self, pool_types: BTreeMap<String, Vec<Arc<InstanceType>>>) -> Self {
        self.types_by_name.clear();
        self.pool_overlaid.clear();
        for (pool, types) in &pool_types {
            for t in types {
                if t.overlays.is_some() {
                    self.pool_overlaid.entry(pool.clone()).or_default().insert(t.name.clone(), Arc::clone(t));
                } else {
                    self.types_by_name.entry(t.name.clone()).or_insert_with(|| Arc::clone(t));
                }
            }
        }
        // A type every NodePool has overlaid still needs a name entry (its capacity is its own).
        for t in self.pool_overlaid.values().flat_map(|m| m.values()) {
            self.types_by_name.entry(t.name.clone()).or_insert_with(|| Arc::clone(t));
        }
        self.pool_types = pool_types;
        self
    }

    /// The instance type `name` as NodePool `pool` sees it: with its NodeOverlays there, if any.
    pub fn instance_type(&self, pool: Option<&str>, name: &str) -> Option<&Arc<InstanceType>> {
        pool.and_then(|p| self.pool_overlaid.get(p))
            .and_then(|types| types.get(name))
            .or_else(|| self.types_by_name.get(name))
    }

    /// The node class `np` references, when the snapshot has it.
    pub fn node_class_of(&self, np: &NodePool) -> Option<&EC2NodeClass> {
        let r = &np.spec.template.spec.node_class_ref;
        self.nodeclasses.iter().map(AsRef::as_ref).find(|c| c.metadata.name.as_deref() == Some(&r.name))
    }

    /// Whether the node class `np` references can launch nodes, and why not, by the judgement
    /// every provider uses unless it says otherwise ([`super::nodeclass::readiness`]): for the
    /// commands, which run no provider's controllers.
    pub fn node_class_ready(&self, np: &NodePool) -> Result<(), super::nodeclass::NodeClassProblem> {
        super::nodeclass::readiness(&np.spec.template.spec.node_class_ref, self.node_class_of(np))
    }

    /// The pods the provisioner should find capacity for, in name order.
    pub fn provisionable_pods(&self) -> Vec<Arc<Pod>> {
        let mut out: Vec<Arc<Pod>> =
            self.pods.iter().filter(|p| pods::is_provisionable(p)).cloned().collect();
        out.sort_by_cached_key(|p| pods::key(p));
        out
    }

    /// The NodePools that are not being deleted.
    pub fn live_nodepools(&self) -> impl Iterator<Item = &Arc<NodePool>> {
        self.nodepools.iter().filter(|np| np.metadata.deletion_timestamp.is_none())
    }
}

fn name_of(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> String {
    meta.name.clone().unwrap_or_default()
}

/// One pod per DaemonSet, from its template, with its namespace's LimitRange defaults (see
/// [`super::limitranges`]): what each new node will run besides the workload.
pub fn daemonset_pods(snapshot: &Snapshot) -> Vec<Pod> {
    let defaults = limitranges::defaults_by_namespace(snapshot.limit_ranges.iter().map(AsRef::as_ref));
    snapshot
        .daemonsets
        .iter()
        .filter(|ds| ds.metadata.deletion_timestamp.is_none())
        .filter_map(|ds| {
            let template = ds.spec.as_ref()?.template.clone();
            let mut meta = template.metadata.unwrap_or_default();
            meta.namespace = ds.metadata.namespace.clone();
            meta.name = ds.metadata.name.clone();
            let mut pod = Pod { metadata: meta, spec: template.spec.map(PodSpec::from), status: None };
            limitranges::apply(&mut pod, &defaults);
            Some(pod)
        })
        .collect()
}

/// `pods` with their namespace's LimitRange defaults, for the few that lack them.
pub fn with_limit_range_defaults(snapshot: &Snapshot, pods: Vec<Arc<Pod>>) -> Vec<Arc<Pod>> {
    if snapshot.limit_ranges.is_empty() {
        return pods;
    }
    let defaults = limitranges::defaults_by_namespace(snapshot.limit_ranges.iter().map(AsRef::as_ref));
    pods.iter().map(|p| limitranges::with_defaults(p, &defaults)).collect()
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
    use super::*;

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
}

//! Cluster state: in-memory caches of the objects the decisions look at, fed by watches
//! (kube-runtime reflectors), and the snapshot the pure parts are given.
//!
//! One watch per kind, shared by every controller that reads through [`ClusterState`]. The
//! Karpenter custom resources are watched untyped and converted object by object, so a single
//! object that does not parse is logged (with its name) and skipped instead of stalling its
//! watch. Managed fields and the `kubectl.kubernetes.io/last-applied-configuration` annotation
//! are dropped before caching, and so are the parts of a pod no decision reads (see
//! [`trim_pod`]), which keeps memory proportional to what the decisions use.

pub mod feed;
pub mod index;
pub mod marks;
pub mod snapshot;

use std::fmt::Debug;

use futures::{Stream, StreamExt, TryStreamExt};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Namespace, Node, PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::storage::v1::{CSINode, StorageClass};
use kube::api::{Api, DynamicObject};
use kube::core::{ApiResource, ObjectMeta};
use kube::runtime::reflector::{self, Store};
use kube::runtime::watcher::{self, Event};
use kube::runtime::{WatchStreamExt, watcher::Config};
use kube::{Client, Resource};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::sync::{mpsc, watch};

use crate::apis::{EC2NodeClass, NodeClaim, NodePool};

pub use snapshot::Snapshot;

/// What changed, for the controllers that react to changes (the provisioner).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    /// A provisionable pod was added or updated.
    Pod,
    /// A NodeClaim was deleted.
    NodeClaimDeleted,
    /// A NodeClaim was created or changed.
    NodeClaimUpdated,
    /// A NodePool was added, updated or deleted.
    NodePool,
    /// A node was deleted.
    NodeDeleted,
}

/// The caches.
#[derive(Clone)]
pub struct ClusterState {
    /// Pods of every namespace.
    pub pods: Store<Pod>,
    /// Nodes.
    pub nodes: Store<Node>,
    /// NodeClaims.
    pub nodeclaims: Store<NodeClaim>,
    /// NodePools.
    pub nodepools: Store<NodePool>,
    /// EC2NodeClasses.
    pub nodeclasses: Store<EC2NodeClass>,
    /// DaemonSets.
    pub daemonsets: Store<DaemonSet>,
    /// PodDisruptionBudgets.
    pub pdbs: Store<PodDisruptionBudget>,
    /// Namespaces (their labels, for affinity namespace selectors).
    pub namespaces: Store<Namespace>,
    /// PersistentVolumes (zones and CSI drivers of bound claims).
    pub persistent_volumes: Store<PersistentVolume>,
    /// PersistentVolumeClaims of every namespace.
    pub persistent_volume_claims: Store<PersistentVolumeClaim>,
    /// StorageClasses (allowed topologies and provisioners of unbound claims).
    pub storage_classes: Store<StorageClass>,
    /// CSINodes (volume attach limits per node).
    pub csi_nodes: Store<CSINode>,
    /// Turns true once every cache has listed its kind.
    synced: watch::Receiver<bool>,
}

impl Debug for ClusterState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterState")
            .field("pods", &self.pods.len())
            .field("nodes", &self.nodes.len())
            .field("nodeclaims", &self.nodeclaims.len())
            .finish_non_exhaustive()
    }
}

/// Drops what no decision reads, before an object is cached.
fn trim<K: Resource>(obj: &mut K) {
    let meta: &mut ObjectMeta = obj.meta_mut();
    meta.managed_fields = None;
    if let Some(a) = meta.annotations.as_mut() {
        a.remove("kubectl.kubernetes.io/last-applied-configuration");
    }
}

/// Drops the parts of a pod that neither scheduling nor draining reads: container environments,
/// commands, probes, mounts and security contexts; ephemeral (debug) containers; volumes other
/// than persistent volume claims and generic ephemeral volumes; container statuses and
/// addresses. Kept: metadata, every scheduling field of the spec, container names, resources,
/// ports and restart policies, and the pod's phase and conditions.
pub fn trim_pod(pod: &mut Pod) {
    trim(pod);
    if let Some(spec) = pod.spec.as_mut() {
        for c in spec.containers.iter_mut().chain(spec.init_containers.iter_mut().flatten()) {
            *c = k8s_openapi::api::core::v1::Container {
                name: std::mem::take(&mut c.name),
                resources: c.resources.take(),
                resize_policy: c.resize_policy.take(),
                ports: c.ports.take(),
                restart_policy: c.restart_policy.take(),
                ..Default::default()
            };
        }
        spec.ephemeral_containers = None;
        if let Some(volumes) = spec.volumes.as_mut() {
            volumes.retain(|v| v.persistent_volume_claim.is_some() || v.ephemeral.is_some());
        }
    }
    if let Some(status) = pod.status.as_mut() {
        status.container_statuses = None;
        status.init_container_statuses = None;
        status.ephemeral_container_statuses = None;
        status.resource_claim_statuses = None;
        status.host_ips = None;
        status.pod_ips = None;
    }
}

impl ClusterState {
    /// Starts one watch per kind. Returns the caches, and the future that drives the watches
    /// (spawn it; it runs until dropped). Changes are reported on `changes`.
    pub fn start(
        client: Client,
        changes: mpsc::UnboundedSender<Change>,
    ) -> (ClusterState, impl Future<Output = ()> + Send + 'static) {
        let (pods, pods_w) = reflector::store();
        let (nodes, nodes_w) = reflector::store();
        let (nodeclaims, nodeclaims_w) = reflector::store();
        let (nodepools, nodepools_w) = reflector::store();
        let (nodeclasses, nodeclasses_w) = reflector::store();
        let (daemonsets, daemonsets_w) = reflector::store();
        let (pdbs, pdbs_w) = reflector::store();
        let (namespaces, namespaces_w) = reflector::store();
        let (persistent_volumes, pvs_w) = reflector::store();
        let (persistent_volume_claims, pvcs_w) = reflector::store();
        let (storage_classes, storage_classes_w) = reflector::store();
        let (csi_nodes, csi_nodes_w) = reflector::store();

        let pod_changes = changes.clone();
        let pods_f = drive(
            "pods",
            reflector::reflector(pods_w, watch_modified(Api::<Pod>::all(client.clone()), trim_pod)),
            move |ev: &Event<Pod>| {
                if let Event::Apply(pod) = ev
                    && snapshot::is_provisionable(pod)
                {
                    let _ = pod_changes.send(Change::Pod);
                }
            },
        );
        let node_changes = changes.clone();
        let nodes_f = drive(
            "nodes",
            reflector::reflector(nodes_w, watch_typed(Api::<Node>::all(client.clone()))),
            move |ev: &Event<Node>| {
                if matches!(ev, Event::Delete(_)) {
                    let _ = node_changes.send(Change::NodeDeleted);
                }
            },
        );
        let nc_changes = changes.clone();
        let nodeclaims_f = drive(
            "nodeclaims",
            reflector::reflector(nodeclaims_w, watch_lenient::<NodeClaim>(client.clone())),
            move |ev: &Event<NodeClaim>| match ev {
                Event::Delete(_) => {
                    let _ = nc_changes.send(Change::NodeClaimDeleted);
                }
                // A launch turns a claim's reserved capacity into its real one, which may free
                // room under a NodePool limit.
                Event::Apply(_) => {
                    let _ = nc_changes.send(Change::NodeClaimUpdated);
                }
                _ => {}
            },
        );
        let np_changes = changes;
        let nodepools_f = drive(
            "nodepools",
            reflector::reflector(nodepools_w, watch_lenient::<NodePool>(client.clone())),
            move |ev: &Event<NodePool>| {
                if matches!(ev, Event::Apply(_) | Event::Delete(_)) {
                    let _ = np_changes.send(Change::NodePool);
                }
            },
        );
        let nodeclasses_f = drive(
            "ec2nodeclasses",
            reflector::reflector(nodeclasses_w, watch_lenient::<EC2NodeClass>(client.clone())),
            |_: &Event<EC2NodeClass>| {},
        );
        // Kinds that are only cached: no controller reacts to their changes.
        let daemonsets_f = drive_cached::<DaemonSet>("daemonsets", daemonsets_w, &client);
        let pdbs_f = drive_cached::<PodDisruptionBudget>("poddisruptionbudgets", pdbs_w, &client);
        let namespaces_f = drive_cached::<Namespace>("namespaces", namespaces_w, &client);
        let pvs_f = drive_cached::<PersistentVolume>("persistentvolumes", pvs_w, &client);
        let pvcs_f = drive_cached::<PersistentVolumeClaim>("persistentvolumeclaims", pvcs_w, &client);
        let storage_classes_f = drive_cached::<StorageClass>("storageclasses", storage_classes_w, &client);
        let csi_nodes_f = drive_cached::<CSINode>("csinodes", csi_nodes_w, &client);
        let (synced_tx, synced) = watch::channel(false);
        let state = ClusterState {
            pods,
            nodes,
            nodeclaims,
            nodepools,
            nodeclasses,
            daemonsets,
            pdbs,
            namespaces,
            persistent_volumes,
            persistent_volume_claims,
            storage_classes,
            csi_nodes,
            synced,
        };
        // A store wakes only one task waiting for it to be ready, so one task waits for all of
        // them and announces it to everyone else.
        let sync = {
            let state = state.clone();
            async move {
                state.wait_stores_ready().await;
                synced_tx.send_replace(true);
            }
        };
        let fut = async move {
            tokio::join!(
                sync,
                pods_f,
                nodes_f,
                nodeclaims_f,
                nodepools_f,
                nodeclasses_f,
                daemonsets_f,
                pdbs_f,
                namespaces_f,
                pvs_f,
                pvcs_f,
                storage_classes_f,
                csi_nodes_f
            );
        };
        (state, fut)
    }

    /// Waits until every cache has listed its kind once. Any number of tasks may wait.
    pub async fn wait_synced(&self) {
        let mut synced = self.synced.clone();
        // An error means the watches were dropped: shutting down.
        let _ = synced.wait_for(|s| *s).await;
    }

    /// Whether every cache has listed its kind once.
    pub fn is_synced(&self) -> bool {
        *self.synced.borrow()
    }

    async fn wait_stores_ready(&self) {
        async fn ready<K>(kind: &'static str, store: &Store<K>)
        where
            K: Resource + Clone + 'static,
            K::DynamicType: Eq + std::hash::Hash + Clone,
        {
            // A store only fails to become ready when its writer is dropped, i.e. on shutdown.
            if store.wait_until_ready().await.is_ok() {
                tracing::debug!(kind, objects = store.len(), "cache synced");
            }
        }
        tokio::join!(
            ready("pods", &self.pods),
            ready("nodes", &self.nodes),
            ready("nodeclaims", &self.nodeclaims),
            ready("nodepools", &self.nodepools),
            ready("ec2nodeclasses", &self.nodeclasses),
            ready("daemonsets", &self.daemonsets),
            ready("poddisruptionbudgets", &self.pdbs),
            ready("namespaces", &self.namespaces),
            ready("persistentvolumes", &self.persistent_volumes),
            ready("persistentvolumeclaims", &self.persistent_volume_claims),
            ready("storageclasses", &self.storage_classes),
            ready("csinodes", &self.csi_nodes),
        );
    }

    /// A consistent-enough copy of the caches for one decision.
    pub fn snapshot(&self) -> Snapshot {
        Snapshot {
            pods: self.pods.state(),
            nodes: self.nodes.state(),
            nodeclaims: self.nodeclaims.state(),
            nodepools: self.nodepools.state(),
            nodeclasses: self.nodeclasses.state(),
            daemonsets: self.daemonsets.state(),
            namespaces: self.namespaces.state(),
            persistent_volumes: self.persistent_volumes.state(),
            persistent_volume_claims: self.persistent_volume_claims.state(),
            storage_classes: self.storage_classes.state(),
            csi_nodes: self.csi_nodes.state(),
        }
    }
}

/// A watch of a built-in kind (validated by the API server, so always parsable).
fn watch_typed<K>(api: Api<K>) -> impl Stream<Item = watcher::Result<Event<K>>> + Send + 'static
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
{
    watch_modified(api, trim)
}

/// A watch of a built-in kind whose objects `modify` trims before they are cached.
fn watch_modified<K>(
    api: Api<K>,
    modify: fn(&mut K),
) -> impl Stream<Item = watcher::Result<Event<K>>> + Send + 'static
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
{
    watcher::watcher(api, Config::default()).default_backoff().modify(modify)
}

/// A watch of a custom resource that converts each object on its own: an object that does not
/// parse as `K` is logged and left out instead of failing the whole list.
fn watch_lenient<K>(client: Client) -> impl Stream<Item = watcher::Result<Event<K>>> + Send + 'static
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Serialize + Debug + Send + 'static,
{
    let ar = ApiResource::erase::<K>(&());
    let api: Api<DynamicObject> = Api::all_with(client, &ar);
    watcher::watcher(api, Config::default()).default_backoff().filter_map(move |ev| {
        let kind = ar.kind.clone();
        async move {
            match ev {
                Err(e) => Some(Err(e)),
                Ok(ev) => convert_event::<K>(ev, &kind).map(Ok),
            }
        }
    })
}

fn convert<K: DeserializeOwned + Resource>(obj: DynamicObject, kind: &str) -> Option<K> {
    let name = obj.metadata.name.clone().unwrap_or_default();
    let value = match serde_json::to_value(&obj) {
        Ok(v) => v,
        Err(e) => {
            tracing::error!(kind, name, error = %e, "skipping object that cannot be encoded");
            return None;
        }
    };
    match serde_json::from_value::<K>(value) {
        Ok(mut k) => {
            trim(&mut k);
            Some(k)
        }
        Err(e) => {
            tracing::error!(kind, name, error = %e, "skipping malformed object");
            None
        }
    }
}

fn convert_event<K: DeserializeOwned + Resource>(ev: Event<DynamicObject>, kind: &str) -> Option<Event<K>> {
    Some(match ev {
        Event::Apply(o) => Event::Apply(convert(o, kind)?),
        Event::Delete(o) => Event::Delete(convert(o, kind)?),
        Event::InitApply(o) => Event::InitApply(convert(o, kind)?),
        Event::Init => Event::Init,
        Event::InitDone => Event::InitDone,
    })
}

/// Drives the watch of a built-in kind into its cache, reacting to nothing.
fn drive_cached<K>(
    kind: &'static str,
    writer: reflector::store::Writer<K>,
    client: &Client,
) -> impl Future<Output = ()> + Send + use<K>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    let stream = reflector::reflector(writer, watch_typed(Api::<K>::all(client.clone())));
    drive(kind, stream, |_: &Event<K>| {})
}

/// Drives a reflector stream forever, reporting each event to `on_event` and logging errors
/// (the watcher retries with backoff on its own).
async fn drive<K, S, F>(kind: &'static str, stream: S, on_event: F)
where
    S: Stream<Item = watcher::Result<Event<K>>> + Send,
    F: Fn(&Event<K>) + Send,
{
    let stream = stream.inspect_ok(|ev| on_event(ev));
    futures::pin_mut!(stream);
    while let Some(item) = stream.next().await {
        if let Err(error) = item {
            tracing::warn!(kind, error = %error, "watch failed, retrying");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduling::resources::pod_requests;

    #[test]
    fn a_trimmed_pod_keeps_what_scheduling_and_draining_read() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web", "namespace": "shop", "uid": "u1", "labels": {"app": "web"},
                "annotations": {"karpenter.sh/do-not-disrupt": "true",
                    "kubectl.kubernetes.io/last-applied-configuration": "{}"},
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-1", "uid": "r1"}],
                "managedFields": [{"manager": "kubectl"}]},
            "spec": {
                "nodeSelector": {"karpenter.sh/capacity-type": "spot"},
                "affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
                    {"topologyKey": "kubernetes.io/hostname", "labelSelector": {"matchLabels": {"app": "web"}}}]}},
                "tolerations": [{"key": "dedicated", "operator": "Exists"}],
                "topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone",
                    "whenUnsatisfiable": "DoNotSchedule", "labelSelector": {"matchLabels": {"app": "web"}}}],
                "priorityClassName": "high", "priority": 1000, "terminationGracePeriodSeconds": 30,
                "overhead": {"cpu": "10m"},
                "initContainers": [{"name": "proxy", "image": "proxy", "restartPolicy": "Always",
                    "env": [{"name": "A", "value": "b"}], "resources": {"requests": {"cpu": "100m"}}}],
                "containers": [{"name": "app", "image": "app:1", "command": ["/app"], "args": ["--port", "80"],
                    "env": [{"name": "A", "value": "b"}],
                    "volumeMounts": [{"name": "data", "mountPath": "/data"}],
                    "livenessProbe": {"httpGet": {"path": "/", "port": 80}},
                    "ports": [{"containerPort": 80, "hostPort": 8080, "protocol": "TCP"}],
                    "resources": {"requests": {"cpu": "1", "memory": "1Gi"}}}],
                "ephemeralContainers": [{"name": "debug", "image": "busybox"}],
                "volumes": [
                    {"name": "data", "persistentVolumeClaim": {"claimName": "data-web"}},
                    {"name": "scratch", "ephemeral": {"volumeClaimTemplate": {"spec": {"accessModes": ["ReadWriteOnce"]}}}},
                    {"name": "config", "configMap": {"name": "web"}},
                    {"name": "token", "projected": {"sources": [{"serviceAccountToken": {"path": "token"}}]}}]
            },
            "status": {"phase": "Pending", "nominatedNodeName": "n1",
                "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}],
                "containerStatuses": [{"name": "app", "image": "app:1", "imageID": "", "ready": false, "restartCount": 0}],
                "podIPs": [{"ip": "10.0.0.1"}]}
        }))
        .unwrap();
        let requests = pod_requests(&pod);
        let mut trimmed = pod.clone();
        trim_pod(&mut trimmed);

        // What decisions read is untouched.
        assert_eq!(pod_requests(&trimmed), requests);
        let (spec, full) = (trimmed.spec.as_ref().unwrap(), pod.spec.as_ref().unwrap());
        assert_eq!(spec.node_selector, full.node_selector);
        assert_eq!(spec.affinity, full.affinity);
        assert_eq!(spec.tolerations, full.tolerations);
        assert_eq!(spec.topology_spread_constraints, full.topology_spread_constraints);
        assert_eq!(spec.priority_class_name, full.priority_class_name);
        assert_eq!(spec.termination_grace_period_seconds, full.termination_grace_period_seconds);
        assert_eq!(spec.containers[0].ports, full.containers[0].ports);
        assert_eq!(spec.init_containers.as_ref().unwrap()[0].restart_policy.as_deref(), Some("Always"));
        let volumes: Vec<&str> = spec.volumes.iter().flatten().map(|v| v.name.as_str()).collect();
        assert_eq!(volumes, ["data", "scratch"]);
        assert_eq!(trimmed.metadata.labels, pod.metadata.labels);
        assert_eq!(trimmed.metadata.owner_references, pod.metadata.owner_references);
        assert!(trimmed.metadata.annotations.as_ref().unwrap().contains_key("karpenter.sh/do-not-disrupt"));
        let status = trimmed.status.as_ref().unwrap();
        assert_eq!(status.phase.as_deref(), Some("Pending"));
        assert_eq!(status.conditions, pod.status.as_ref().unwrap().conditions);
        assert_eq!(status.nominated_node_name.as_deref(), Some("n1"));
        assert!(snapshot::is_provisionable(&trimmed));

        // The rest is gone.
        let c = &spec.containers[0];
        assert!(c.env.is_none() && c.command.is_none() && c.args.is_none() && c.image.is_none());
        assert!(c.volume_mounts.is_none() && c.liveness_probe.is_none());
        assert!(spec.ephemeral_containers.is_none());
        assert!(status.container_statuses.is_none() && status.pod_ips.is_none());
        assert!(trimmed.metadata.managed_fields.is_none());
        assert!(
            !trimmed
                .metadata
                .annotations
                .as_ref()
                .unwrap()
                .contains_key("kubectl.kubernetes.io/last-applied-configuration")
        );
    }
}

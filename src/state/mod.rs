//! Cluster state: the one in-memory model of the cluster that every controller reads.
//!
//! - **Caches**: one watch per kind ([`watches`]), shared by every controller, objects trimmed of
//!   what no decision reads; a Karpenter custom resource that does not parse is logged with its
//!   name and skipped. A Node update that only renews heartbeats is cached and wakes nobody
//!   ([`renewals`]).
//! - **Indexes** ([`index`]): Node ↔ NodeClaim by provider ID, pods by node, kept current by the
//!   watches.
//! - **Marks** ([`marks`]): nominations and deletion decisions this process made.
//! - **The change feed** ([`feed`]): what changed, for the controllers that react to the cluster as
//!   a whole; any number of them follow it at their own pace.
//! - **Notices** to the keyed controllers that run ([`ClusterState::on_nodeclaim`] and friends):
//!   each maps an object that changed to the keys it reconciles.
//! - **Snapshots** ([`snapshot`]) and what the pure parts make of them: the [`statenode`] join,
//!   the scheduler's input ([`input`]), NodePool usage ([`usage`]).

pub mod buffers;
pub mod feed;
pub mod index;
pub mod input;
pub mod limitranges;
pub mod marks;
pub mod nodeclass;
pub mod pods;
pub mod podtimes;
pub mod renewals;
pub mod snapshot;
pub mod statenode;
pub mod usage;
pub mod watches;

use std::collections::{BTreeMap, HashSet};
use std::fmt::Debug;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, PoisonError, RwLock};

use crate::apis::pod::Pod;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{LimitRange, Namespace, Node, PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::storage::v1::{CSINode, StorageClass, VolumeAttachment};
use kube::api::Api;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher::Event;
use kube::{Client, Resource};
use tokio::sync::watch;

use crate::apis::{EC2NodeClass, NodeClaim, NodePool};

pub use buffers::BuffersPlaced;
pub use feed::{Changes, Feed, Interest, Subscription};
pub use index::{Joined, PodKey};
pub use marks::Marks;
pub use snapshot::Snapshot;
pub use statenode::StateNode;
use watches::Source;

/// What a keyed controller is told about an object of a kind it follows.
#[derive(Debug)]
pub enum Notice<'a, K> {
    /// The object was added or changed (or listed again after the watch restarted).
    Applied(&'a K),
    /// The object was deleted.
    Deleted(&'a K),
    /// The object was found missing when the watch listed its kind again: it was deleted while
    /// the watch was down. Only its namespace and name are known.
    Gone {
        /// Its namespace.
        namespace: Option<&'a str>,
        /// Its name.
        name: &'a str,
    },
}

impl<K> Clone for Notice<'_, K> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<K> Copy for Notice<'_, K> {}

impl<K: Resource> Notice<'_, K> {
    /// The object's name.
    pub fn name(&self) -> String {
        match self {
            Notice::Applied(o) | Notice::Deleted(o) => o.meta().name.clone().unwrap_or_default(),
            Notice::Gone { name, .. } => name.to_string(),
        }
    }

    /// Whether the object is gone (deleted, or found missing).
    pub fn is_gone(&self) -> bool {
        !matches!(self, Notice::Applied(_))
    }
}

type Handler<K> = Arc<dyn for<'a> Fn(Notice<'a, K>) + Send + Sync>;

/// The keyed controllers following one kind.
pub struct Subscribers<K> {
    next: AtomicU64,
    list: RwLock<Vec<(u64, Handler<K>)>>,
}

impl<K> Default for Subscribers<K> {
    fn default() -> Self {
        Subscribers { next: AtomicU64::new(0), list: RwLock::new(Vec::new()) }
    }
}

impl<K: 'static> Subscribers<K> {
    fn notify(&self, notice: Notice<'_, K>) {
        let list = self.list.read().unwrap_or_else(PoisonError::into_inner);
        for (_, handler) in list.iter() {
            handler(notice);
        }
    }

    fn add(self: &Arc<Self>, handler: Handler<K>) -> Registration {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        self.list.write().unwrap_or_else(PoisonError::into_inner).push((id, handler));
        let me = Arc::downgrade(self);
        Registration {
            remove: Some(Box::new(move || {
                if let Some(me) = me.upgrade() {
                    me.list.write().unwrap_or_else(PoisonError::into_inner).retain(|(i, _)| *i != id);
                }
            })),
        }
    }

    /// How many controllers follow the kind.
    pub fn len(&self) -> usize {
        self.list.read().unwrap_or_else(PoisonError::into_inner).len()
    }

    /// Whether no controller follows the kind.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A keyed controller's subscription to a kind; dropping it unsubscribes.
pub struct Registration {
    remove: Option<Box<dyn FnOnce() + Send + Sync>>,
}

impl Drop for Registration {
    fn drop(&mut self) {
        if let Some(remove) = self.remove.take() {
            remove();
        }
    }
}

impl Debug for Registration {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registration").finish_non_exhaustive()
    }
}

#[derive(Default)]
struct AllSubscribers {
    nodeclaims: Arc<Subscribers<NodeClaim>>,
    nodes: Arc<Subscribers<Node>>,
    pods: Arc<Subscribers<Pod>>,
    nodeclasses: Arc<Subscribers<EC2NodeClass>>,
    nodepools: Arc<Subscribers<NodePool>>,
}

/// The caches and everything kept with them. Cheap to clone: clones share everything.
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
    /// VolumeAttachments (termination waits for a drained node's to be gone).
    pub volume_attachments: Store<VolumeAttachment>,
    /// LimitRanges (the container defaults of pods not created yet, DaemonSet pods among them).
    pub limit_ranges: Store<LimitRange>,
    /// Provider-ID joins and pods by node.
    pub index: Arc<index::Index>,
    /// Nominations and deletion decisions of this process.
    pub marks: Arc<Marks>,
    /// When the provisioner first saw, decided about and placed each pending pod.
    pub pod_times: Arc<podtimes::PodTimes>,
    /// The placeholder pods of each CapacityBuffer (`namespace/name`), kept by their controller.
    virtual_pods: Arc<std::sync::RwLock<BTreeMap<String, Vec<Arc<Pod>>>>>,
    /// Where the provisioner's last pass placed the placeholder pods.
    buffers_placed: Arc<std::sync::RwLock<BuffersPlaced>>,
    feed: Arc<Feed>,
    subscribers: Arc<AllSubscribers>,
    synced: watch::Receiver<bool>,
    /// Whether this client may not list LimitRanges (upstream's chart does not grant it): their
    /// cache then counts as synced, empty.
    limit_ranges_refused: watch::Receiver<bool>,
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

/// Names (with namespaces) of the objects of one kind the watch has seen, to tell which ones a
/// new list no longer has.
#[derive(Default)]
struct Known {
    names: HashSet<(Option<String>, String)>,
    relisting: Option<HashSet<(Option<String>, String)>>,
}

fn key_of<K: Resource>(obj: &K) -> (Option<String>, String) {
    (obj.meta().namespace.clone(), obj.meta().name.clone().unwrap_or_default())
}

impl Known {
    /// Follows `event`; at the end of a new list, returns the objects it no longer has.
    fn follow<K: Resource>(&mut self, event: &Event<K>) -> Vec<(Option<String>, String)> {
        match event {
            Event::Apply(o) => {
                self.names.insert(key_of(o));
            }
            Event::Delete(o) => {
                self.names.remove(&key_of(o));
            }
            Event::Init => self.relisting = Some(HashSet::new()),
            Event::InitApply(o) => {
                self.relisting.get_or_insert_with(HashSet::new).insert(key_of(o));
            }
            Event::InitDone => {
                let fresh = self.relisting.take().unwrap_or_default();
                let gone = self.names.difference(&fresh).cloned().collect();
                self.names = fresh;
                return gone;
            }
        }
        Vec::new()
    }
}

/// Keeps the indexes, the feed and the subscribers of one kind current with its watch events.
struct Follower<K: 'static> {
    known: Known,
    subscribers: Arc<Subscribers<K>>,
}

impl<K: Resource + 'static> Follower<K> {
    fn new(subscribers: Arc<Subscribers<K>>) -> Self {
        Follower { known: Known::default(), subscribers }
    }

    /// Tells the subscribers; returns the objects gone at the end of a list.
    fn notify(&mut self, event: &Event<K>) -> Vec<(Option<String>, String)> {
        let gone = self.known.follow(event);
        if self.subscribers.is_empty() {
            return gone;
        }
        match event {
            Event::Apply(o) | Event::InitApply(o) => self.subscribers.notify(Notice::Applied(o)),
            Event::Delete(o) => self.subscribers.notify(Notice::Deleted(o)),
            Event::InitDone => {
                for (namespace, name) in &gone {
                    self.subscribers.notify(Notice::Gone { namespace: namespace.as_deref(), name });
                }
            }
            Event::Init => {}
        }
        gone
    }
}

/// Index entries collected while a kind is listed again.
#[derive(Default)]
struct Relist<T> {
    entries: Option<Vec<T>>,
}

impl<T> Relist<T> {
    /// Follows `event` with `entry` (the index entry of an `InitApply` object); returns every
    /// entry at the end of the list.
    fn follow<K>(&mut self, event: &Event<K>, entry: impl FnOnce(&K) -> T) -> Option<Vec<T>> {
        match event {
            Event::Init => self.entries = Some(Vec::new()),
            Event::InitApply(o) => self.entries.get_or_insert_with(Vec::new).push(entry(o)),
            Event::InitDone => return Some(self.entries.take().unwrap_or_default()),
            _ => {}
        }
        None
    }
}

fn pod_key_of(pod: &Pod) -> PodKey {
    (pod.metadata.namespace.clone().unwrap_or_default(), pod.metadata.name.clone().unwrap_or_default())
}

fn bound_node(pod: &Pod) -> Option<String> {
    if pods::is_terminal(pod) { None } else { pods::node_name(pod).map(str::to_string) }
}

fn node_provider_id(node: &Node) -> Option<String> {
    node.spec.as_ref().and_then(|s| s.provider_id.clone()).filter(|p| !p.is_empty())
}

fn claim_provider_id(claim: &NodeClaim) -> Option<String> {
    claim.status.as_ref().and_then(|s| s.provider_id.clone()).filter(|p| !p.is_empty())
}

/// What the watch of pods does with each event: keep the pods-by-node index, the feed and the
/// subscribers current.
fn follow_pods(
    index: &Arc<index::Index>,
    feed: &Arc<Feed>,
    subscribers: Arc<Subscribers<Pod>>,
) -> impl FnMut(&Event<Pod>) + Send + use<> {
    let (index, feed) = (index.clone(), feed.clone());
    let mut follower = Follower::new(subscribers);
    let mut relist = Relist::default();
    move |ev: &Event<Pod>| {
        match ev {
            Event::Apply(p) => index.set_pod(
                pod_key_of(p),
                bound_node(p).as_deref(),
                !pods::is_owned_by_daemonset(p),
                pods::is_terminating(p),
            ),
            Event::Delete(p) => index.remove_pod(&pod_key_of(p), !pods::is_owned_by_daemonset(p)),
            _ => {}
        }
        for (namespace, name) in follower.notify(ev) {
            index.remove_pod(&(namespace.unwrap_or_default(), name), true);
        }
        if let Some(entries) = relist.follow(ev, |p| (pod_key_of(p), bound_node(p))) {
            index.replace_pods(entries);
            feed.bump(|c| {
                c.pods += 1;
                c.provisionable_pods += 1;
            });
        }
        match ev {
            Event::Apply(p) => feed.bump(|c| {
                c.pods += 1;
                if pods::is_provisionable(p) {
                    c.provisionable_pods += 1;
                }
            }),
            Event::Delete(_) => feed.bump(|c| c.pods += 1),
            _ => {}
        }
    }
}

/// What the watch of a kind only read does with each event: count an object added, changed or
/// deleted, or the kind listed again, in the feed with `count`.
fn count_changes<K>(feed: &Arc<Feed>, count: fn(&mut Changes)) -> impl FnMut(&Event<K>) + Send + use<K> {
    let feed = feed.clone();
    move |ev: &Event<K>| {
        if matches!(ev, Event::Apply(_) | Event::Delete(_) | Event::InitDone) {
            feed.bump(count);
        }
    }
}

/// What the watch of NodePools or EC2NodeClasses does with each event: tell the subscribers, then
/// count the change in the feed with `count` (as [`count_changes`]).
fn follow_counted<K: Resource + 'static>(
    subscribers: Arc<Subscribers<K>>,
    feed: &Arc<Feed>,
    count: fn(&mut Changes),
) -> impl FnMut(&Event<K>) + Send + use<K> {
    let mut follower = Follower::new(subscribers);
    let mut counted = count_changes(feed, count);
    move |ev: &Event<K>| {
        follower.notify(ev);
        counted(ev);
    }
}

/// Counts a change of a Node or NodeClaim in the feed.
fn bump_joined(kind: Joined, deleted: bool) -> impl FnOnce(&mut Changes) {
    move |c| match kind {
        Joined::Nodes => {
            c.nodes += 1;
            c.node_deletions += u64::from(deleted);
        }
        Joined::NodeClaims => {
            c.nodeclaims += 1;
            c.nodeclaim_deletions += u64::from(deleted);
        }
    }
}

/// What the watch of Nodes or NodeClaims does with each event: keep the provider-ID index, the
/// feed and the subscribers current. An update that only renews (as `fingerprint` tells, see
/// [`renewals`]) is cached and told to nobody.
fn follow_joined<K: Resource + 'static>(
    kind: Joined,
    provider_id: fn(&K) -> Option<String>,
    fingerprint: renewals::Fingerprint<K>,
    index: &Arc<index::Index>,
    feed: &Arc<Feed>,
    subscribers: Arc<Subscribers<K>>,
) -> impl FnMut(&Event<K>) + Send + use<K> {
    let (index, feed) = (index.clone(), feed.clone());
    let mut follower = Follower::new(subscribers);
    let mut relist = Relist::default();
    let mut renewals = renewals::Renewals::new(fingerprint);
    move |ev: &Event<K>| {
        if renewals.only_renews(ev) {
            return;
        }
        let name = |o: &K| o.meta().name.clone().unwrap_or_default();
        match ev {
            Event::Apply(o) => index.set(kind, &name(o), provider_id(o).as_deref()),
            Event::Delete(o) => index.remove(kind, &name(o)),
            _ => {}
        }
        let gone = follower.notify(ev);
        if let Some(entries) = relist.follow(ev, |o| (name(o), provider_id(o))) {
            index.replace(kind, entries);
            feed.bump(bump_joined(kind, !gone.is_empty()));
        }
        match ev {
            Event::Apply(_) => feed.bump(bump_joined(kind, false)),
            Event::Delete(_) => feed.bump(bump_joined(kind, true)),
            _ => {}
        }
    }
}

impl ClusterState {
    /// Starts one watch per kind. Returns the state, and the future that drives the watches
    /// (spawn it; it runs until dropped).
    pub fn start(client: Client) -> (ClusterState, impl Future<Output = ()> + Send + 'static) {
        let index = Arc::new(index::Index::default());
        let feed = Arc::new(Feed::default());
        let subscribers = Arc::new(AllSubscribers::default());
        let (synced_tx, synced) = watch::channel(false);

        let (pods, pods_f) = watches::cache(
            "pods",
            watches::pods(client.clone()),
            follow_pods(&index, &feed, subscribers.pods.clone()),
        );
        let (nodes, nodes_f) = watches::cache(
            "nodes",
            Source::Typed(Api::all(client.clone()), watches::trim_node),
            follow_joined(
                Joined::Nodes,
                node_provider_id,
                renewals::node_fingerprint,
                &index,
                &feed,
                subscribers.nodes.clone(),
            ),
        );
        let (nodeclaims, nodeclaims_f) = watches::cache(
            "nodeclaims",
            Source::Lenient(client.clone()),
            follow_joined(
                Joined::NodeClaims,
                claim_provider_id,
                renewals::every_update,
                &index,
                &feed,
                subscribers.nodeclaims.clone(),
            ),
        );
        let (nodepools, nodepools_f) = watches::cache(
            "nodepools",
            Source::Lenient(client.clone()),
            follow_counted(subscribers.nodepools.clone(), &feed, |c| c.nodepools += 1),
        );
        let (nodeclasses, nodeclasses_f) = watches::cache(
            "ec2nodeclasses",
            Source::Lenient(client.clone()),
            follow_counted(subscribers.nodeclasses.clone(), &feed, |c| c.nodeclasses += 1),
        );
        // Kinds only read: a change bumps the feed's `others`.
        let (daemonsets, daemonsets_f) = watches::cache(
            "daemonsets",
            Source::Typed(Api::all(client.clone()), watches::trim::<DaemonSet>),
            count_changes(&feed, |c| c.others += 1),
        );
        let (pdbs, pdbs_f) = watches::cache(
            "poddisruptionbudgets",
            Source::Typed(Api::all(client.clone()), watches::trim::<PodDisruptionBudget>),
            count_changes(&feed, |c| c.others += 1),
        );
        let (namespaces, namespaces_f) = watches::cache(
            "namespaces",
            Source::Typed(Api::all(client.clone()), watches::trim::<Namespace>),
            count_changes(&feed, |c| c.others += 1),
        );
        let (persistent_volumes, pvs_f) = watches::cache(
            "persistentvolumes",
            Source::Typed(Api::all(client.clone()), watches::trim::<PersistentVolume>),
            count_changes(&feed, |c| c.others += 1),
        );
        let (persistent_volume_claims, pvcs_f) = watches::cache(
            "persistentvolumeclaims",
            Source::Typed(Api::all(client.clone()), watches::trim::<PersistentVolumeClaim>),
            count_changes(&feed, |c| c.others += 1),
        );
        let (storage_classes, storage_classes_f) = watches::cache(
            "storageclasses",
            Source::Typed(Api::all(client.clone()), watches::trim::<StorageClass>),
            count_changes(&feed, |c| c.others += 1),
        );
        let (csi_nodes, csi_nodes_f) = watches::cache(
            "csinodes",
            Source::Typed(Api::all(client.clone()), watches::trim::<CSINode>),
            count_changes(&feed, |c| c.others += 1),
        );
        // Read by termination only, which polls: a change wakes no decision.
        let (volume_attachments, volume_attachments_f) = watches::cache(
            "volumeattachments",
            Source::Typed(Api::all(client.clone()), watches::trim::<VolumeAttachment>),
            |_: &Event<VolumeAttachment>| {},
        );
        let (limit_ranges, limit_ranges_f, limit_ranges_refused) = watches::optional_cache(
            "limitranges",
            Source::Typed(Api::all(client.clone()), watches::trim::<LimitRange>),
            count_changes(&feed, |c| c.others += 1),
        );
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
            volume_attachments,
            limit_ranges,
            index,
            marks: Arc::new(Marks::default()),
            pod_times: Arc::default(),
            virtual_pods: Arc::default(),
            buffers_placed: Arc::default(),
            feed,
            subscribers,
            synced,
            limit_ranges_refused,
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
                csi_nodes_f,
                volume_attachments_f,
                limit_ranges_f
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
            ready("volumeattachments", &self.volume_attachments),
            async {
                let mut refused = self.limit_ranges_refused.clone();
                tokio::select! {
                    () = ready("limitranges", &self.limit_ranges) => {}
                    _ = refused.wait_for(|r| *r) => {}
                }
            },
        );
    }

    /// The change feed.
    pub fn feed(&self) -> &Feed {
        &self.feed
    }

    /// Calls `handler` for every change of a NodeClaim, until the registration is dropped.
    pub fn on_nodeclaim(
        &self,
        handler: impl for<'a> Fn(Notice<'a, NodeClaim>) + Send + Sync + 'static,
    ) -> Registration {
        self.subscribers.nodeclaims.add(Arc::new(handler))
    }

    /// Calls `handler` for every change of a Node, until the registration is dropped.
    pub fn on_node(
        &self,
        handler: impl for<'a> Fn(Notice<'a, Node>) + Send + Sync + 'static,
    ) -> Registration {
        self.subscribers.nodes.add(Arc::new(handler))
    }

    /// Calls `handler` for every change of a pod, until the registration is dropped.
    pub fn on_pod(&self, handler: impl for<'a> Fn(Notice<'a, Pod>) + Send + Sync + 'static) -> Registration {
        self.subscribers.pods.add(Arc::new(handler))
    }

    /// Calls `handler` for every change of an EC2NodeClass, until the registration is dropped.
    pub fn on_nodeclass(
        &self,
        handler: impl for<'a> Fn(Notice<'a, EC2NodeClass>) + Send + Sync + 'static,
    ) -> Registration {
        self.subscribers.nodeclasses.add(Arc::new(handler))
    }

    /// Calls `handler` for every change of a NodePool, until the registration is dropped.
    pub fn on_nodepool(
        &self,
        handler: impl for<'a> Fn(Notice<'a, NodePool>) + Send + Sync + 'static,
    ) -> Registration {
        self.subscribers.nodepools.add(Arc::new(handler))
    }

    /// How many keyed controllers follow NodeClaims, Nodes, pods, EC2NodeClasses and NodePools.
    pub fn subscriber_counts(&self) -> [usize; 5] {
        let s = &self.subscribers;
        [s.nodeclaims.len(), s.nodes.len(), s.pods.len(), s.nodeclasses.len(), s.nodepools.len()]
    }

    /// The cached NodeClaim `name`.
    pub fn nodeclaim(&self, name: &str) -> Option<Arc<NodeClaim>> {
        self.nodeclaims.get(&ObjectRef::new(name))
    }

    /// The cached Node `name`.
    pub fn node(&self, name: &str) -> Option<Arc<Node>> {
        self.nodes.get(&ObjectRef::new(name))
    }

    /// The cached EC2NodeClass `name`.
    pub fn nodeclass(&self, name: &str) -> Option<Arc<EC2NodeClass>> {
        self.nodeclasses.get(&ObjectRef::new(name))
    }

    /// The cached NodePool `name`.
    pub fn nodepool(&self, name: &str) -> Option<Arc<NodePool>> {
        self.nodepools.get(&ObjectRef::new(name))
    }

    /// The cached Nodes carrying `provider_id` (normally at most one).
    pub fn nodes_with_provider_id(&self, provider_id: &str) -> Vec<Arc<Node>> {
        self.index
            .with_provider_id(Joined::Nodes, provider_id)
            .iter()
            .filter_map(|name| self.node(name))
            .filter(|n| node_provider_id(n).as_deref() == Some(provider_id))
            .collect()
    }

    /// The cached NodeClaim whose instance has `provider_id`.
    pub fn nodeclaim_with_provider_id(&self, provider_id: &str) -> Option<Arc<NodeClaim>> {
        self.index
            .with_provider_id(Joined::NodeClaims, provider_id)
            .iter()
            .filter_map(|name| self.nodeclaim(name))
            .find(|c| claim_provider_id(c).as_deref() == Some(provider_id))
    }

    /// The cached NodeClaims and Nodes of the instance whose cloud ID is `instance_id` (the last
    /// segment of their provider ID), each checked to still carry it.
    pub fn with_instance_id(&self, instance_id: &str) -> (Vec<Arc<NodeClaim>>, Vec<Arc<Node>>) {
        let carries =
            |pid: Option<String>| pid.as_deref().is_some_and(|p| index::instance_id(p) == instance_id);
        let claims = self
            .index
            .with_instance_id(Joined::NodeClaims, instance_id)
            .iter()
            .filter_map(|name| self.nodeclaim(name))
            .filter(|c| carries(claim_provider_id(c)))
            .collect();
        let nodes = self
            .index
            .with_instance_id(Joined::Nodes, instance_id)
            .iter()
            .filter_map(|name| self.node(name))
            .filter(|n| carries(node_provider_id(n)))
            .collect();
        (claims, nodes)
    }

    /// The cached VolumeAttachments of Node `node`.
    pub fn volume_attachments_of(&self, node: &str) -> Vec<Arc<VolumeAttachment>> {
        self.volume_attachments.state().into_iter().filter(|va| va.spec.node_name == node).collect()
    }

    /// The cached PersistentVolumeClaim `namespace/name`.
    pub fn persistent_volume_claim(&self, namespace: &str, name: &str) -> Option<Arc<PersistentVolumeClaim>> {
        self.persistent_volume_claims.get(&ObjectRef::new(name).within(namespace))
    }

    /// The cached pods bound to Node `node`, finished ones excluded.
    pub fn pods_on(&self, node: &str) -> Vec<Arc<Pod>> {
        self.index
            .pods_on(node)
            .into_iter()
            .filter_map(|(namespace, name)| self.pods.get(&ObjectRef::new(&name).within(&namespace)))
            .filter(|p| pods::node_name(p) == Some(node) && !pods::is_terminal(p))
            .collect()
    }

    /// This state with caches of pods and NodeClaims that never saw any, for tests of what a
    /// lagging cache must not break.
    #[cfg(test)]
    pub(crate) fn forgetting_pods_and_nodeclaims(&self) -> ClusterState {
        let mut stale = self.clone();
        stale.pods = kube::runtime::reflector::store().0;
        stale.nodeclaims = kube::runtime::reflector::store().0;
        stale.index = Arc::new(index::Index::default());
        stale
    }

    /// Every Node, for a controller that needs no more of the cluster.
    pub fn all_nodes(&self) -> Vec<Arc<Node>> {
        self.nodes.state()
    }

    /// Every NodePool, for a controller that needs no more of the cluster.
    pub fn all_nodepools(&self) -> Vec<Arc<NodePool>> {
        self.nodepools.state()
    }

    /// A consistent-enough copy of the caches and marks for one decision, without instance types.
    pub fn snapshot(&self) -> Snapshot {
        let nodeclaims = self.nodeclaims.state();
        let live: HashSet<&str> = nodeclaims.iter().filter_map(|c| c.metadata.uid.as_deref()).collect();
        let marked_for_deletion = self.marks.marked_for_deletion(&live);
        Snapshot {
            pods: self.pods.state(),
            nodes: self.nodes.state(),
            nodeclaims,
            nodepools: self.nodepools.state(),
            nodeclasses: self.nodeclasses.state(),
            daemonsets: self.daemonsets.state(),
            pdbs: self.pdbs.state(),
            namespaces: self.namespaces.state(),
            persistent_volumes: self.persistent_volumes.state(),
            persistent_volume_claims: self.persistent_volume_claims.state(),
            storage_classes: self.storage_classes.state(),
            csi_nodes: self.csi_nodes.state(),
            limit_ranges: self.limit_ranges.state(),
            nominated: self.marks.nominated(),
            marked_for_deletion,
            virtual_pods: self
                .virtual_pods
                .read()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .values()
                .flatten()
                .cloned()
                .collect(),
            buffers_placed: self.buffers_placed(),
            ..Default::default()
        }
    }

    /// Records where the provisioner's pass placed the placeholder pods: by buffer, and the
    /// nodes and NodeClaims (by name) that hold any. A change wakes the decisions that leave
    /// those nodes alone (or no longer do) and the buffers' status.
    pub fn set_buffers_placed(&self, placed: BuffersPlaced) {
        let changed = {
            let mut current = self.buffers_placed.write().unwrap_or_else(std::sync::PoisonError::into_inner);
            let changed = *current != placed;
            *current = placed;
            changed
        };
        if changed {
            self.feed.bump(|c| c.buffers += 1);
        }
    }

    /// Where the provisioner's last pass placed the placeholder pods.
    pub fn buffers_placed(&self) -> BuffersPlaced {
        self.buffers_placed.read().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }

    /// Sets the placeholder pods of the CapacityBuffer `key` (`namespace/name`; none removes
    /// it) and, when they changed, tells the decisions that keep room for them.
    pub fn set_virtual_pods(&self, key: &str, pods: Vec<Arc<Pod>>) {
        let changed = {
            let mut all = self.virtual_pods.write().unwrap_or_else(std::sync::PoisonError::into_inner);
            let before = all.get(key).map(|p| p.iter().map(|p| p.metadata.uid.clone()).collect::<Vec<_>>());
            let after =
                (!pods.is_empty()).then(|| pods.iter().map(|p| p.metadata.uid.clone()).collect::<Vec<_>>());
            if pods.is_empty() {
                all.remove(key);
            } else {
                all.insert(key.to_string(), pods);
            }
            before != after
        };
        if changed {
            self.feed.bump(|c| c.buffers += 1);
        }
    }

    /// Drops the placeholder pods of every CapacityBuffer not in `live` (`namespace/name`).
    pub fn retain_virtual_pods(&self, live: &std::collections::BTreeSet<String>) {
        let changed = {
            let mut all = self.virtual_pods.write().unwrap_or_else(std::sync::PoisonError::into_inner);
            let before = all.len();
            all.retain(|key, _| live.contains(key));
            all.len() != before
        };
        if changed {
            self.feed.bump(|c| c.buffers += 1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str) -> Pod {
        let mut p = Pod::default();
        p.metadata.name = Some(name.into());
        p.metadata.namespace = Some("ns".into());
        p
    }

    #[test]
    fn a_new_list_reports_what_went_missing() {
        let mut known = Known::default();
        known.follow(&Event::Apply(pod("a")));
        known.follow(&Event::Apply(pod("b")));
        known.follow(&Event::Delete(pod("b")));
        known.follow(&Event::Apply(pod("c")));
        assert!(known.follow(&Event::<Pod>::Init).is_empty());
        known.follow(&Event::InitApply(pod("c")));
        known.follow(&Event::InitApply(pod("d")));
        let gone = known.follow(&Event::<Pod>::InitDone);
        assert_eq!(gone, [(Some("ns".to_string()), "a".to_string())]);
    }

    #[test]
    fn subscribers_hear_until_they_unsubscribe() {
        let subs: Arc<Subscribers<Pod>> = Arc::default();
        let heard = Arc::new(std::sync::Mutex::new(Vec::new()));
        let h = heard.clone();
        let registration = subs.add(Arc::new(move |n: Notice<'_, Pod>| {
            h.lock().unwrap().push((n.name(), n.is_gone()));
        }));
        let mut follower = Follower::new(subs.clone());
        follower.notify(&Event::Apply(pod("a")));
        follower.notify(&Event::Delete(pod("a")));
        follower.notify(&Event::Apply(pod("b")));
        follower.notify(&Event::<Pod>::Init);
        follower.notify(&Event::<Pod>::InitDone);
        assert_eq!(
            *heard.lock().unwrap(),
            [
                ("a".to_string(), false),
                ("a".to_string(), true),
                ("b".to_string(), false),
                ("b".to_string(), true)
            ]
        );
        drop(registration);
        assert!(subs.is_empty());
        follower.notify(&Event::Apply(pod("c")));
        assert_eq!(heard.lock().unwrap().len(), 4);
    }
}

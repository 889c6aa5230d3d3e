//! Indexes over the caches, kept current by the watches: which Node and which NodeClaim carry a
//! provider ID, and which pods are bound to a node. Lookups are hash-map lookups, so joining a
//! Node with its NodeClaim, or finding a node's pods, costs the same with ten nodes or ten
//! thousand.
//!
//! The caches and the indexes are updated one after the other by the same watch task, so a
//! reader may see one a moment ahead of the other: callers check what they fetch through an index
//! (the NodeClaim found for a provider ID still carries it) rather than trust it blindly.

use std::collections::{BTreeSet, HashMap};
use std::sync::{PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

use k8s_openapi::jiff::{SignedDuration, Timestamp};

/// `(namespace, name)` of a pod.
pub type PodKey = (String, String);

#[derive(Debug, Default)]
struct Joins {
    /// Name → provider ID.
    provider_of: HashMap<String, String>,
    /// Provider ID → names.
    by_provider: HashMap<String, BTreeSet<String>>,
    /// Instance ID (the provider ID's last path segment) → names.
    by_instance: HashMap<String, BTreeSet<String>>,
}

/// The cloud's own ID of an instance: the last path segment of its provider ID
/// (`aws:///us-west-2a/i-0123` → `i-0123`).
pub fn instance_id(provider_id: &str) -> &str {
    provider_id.rsplit('/').next().unwrap_or(provider_id)
}

impl Joins {
    fn set(&mut self, name: &str, provider_id: Option<&str>) {
        let provider_id = provider_id.filter(|p| !p.is_empty());
        if self.provider_of.get(name).map(String::as_str) == provider_id {
            return;
        }
        self.remove(name);
        if let Some(pid) = provider_id {
            self.provider_of.insert(name.to_string(), pid.to_string());
            self.by_provider.entry(pid.to_string()).or_default().insert(name.to_string());
            self.by_instance.entry(instance_id(pid).to_string()).or_default().insert(name.to_string());
        }
    }

    fn remove(&mut self, name: &str) {
        let Some(old) = self.provider_of.remove(name) else { return };
        for (map, key) in [(&mut self.by_provider, old.as_str()), (&mut self.by_instance, instance_id(&old))]
        {
            if let Some(names) = map.get_mut(key) {
                names.remove(name);
                if names.is_empty() {
                    map.remove(key);
                }
            }
        }
    }

    fn replace(&mut self, entries: Vec<(String, Option<String>)>) {
        *self = Joins::default();
        for (name, pid) in entries {
            self.set(&name, pid.as_deref());
        }
    }

    fn names(&self, provider_id: &str) -> Vec<String> {
        self.by_provider.get(provider_id).map(|s| s.iter().cloned().collect()).unwrap_or_default()
    }

    fn names_of_instance(&self, instance_id: &str) -> Vec<String> {
        self.by_instance.get(instance_id).map(|s| s.iter().cloned().collect()).unwrap_or_default()
    }
}

#[derive(Debug, Default)]
struct Bindings {
    node_of: HashMap<PodKey, String>,
    pods_of: HashMap<String, BTreeSet<PodKey>>,
}

impl Bindings {
    /// Binds `pod` to `node`; returns the nodes whose pods changed (the old and the new one).
    fn set(&mut self, pod: PodKey, node: Option<&str>) -> Vec<String> {
        let node = node.filter(|n| !n.is_empty());
        if self.node_of.get(&pod).map(String::as_str) == node {
            return Vec::new();
        }
        let mut changed = self.remove(&pod);
        if let Some(node) = node {
            self.node_of.insert(pod.clone(), node.to_string());
            self.pods_of.entry(node.to_string()).or_default().insert(pod);
            changed.push(node.to_string());
        }
        changed
    }

    /// Unbinds `pod`; returns the node it was bound to.
    fn remove(&mut self, pod: &PodKey) -> Vec<String> {
        let Some(old) = self.node_of.remove(pod) else { return Vec::new() };
        if let Some(pods) = self.pods_of.get_mut(&old) {
            pods.remove(pod);
            if pods.is_empty() {
                self.pods_of.remove(&old);
            }
        }
        vec![old]
    }
}

/// Pod events per node (a pod bound to it, or finished, terminating or deleted on it) not taken
/// yet; bounded by the number of nodes, old entries pruned once there are many.
#[derive(Debug, Default)]
struct PodEvents(HashMap<String, Timestamp>);

/// Pod-event entries kept before those older than [`POD_EVENTS_KEPT`] are dropped.
const POD_EVENTS_PRUNE_AT: usize = 10_000;
/// How long an untaken pod event is kept once there are many.
const POD_EVENTS_KEPT: SignedDuration = SignedDuration::from_mins(10);

impl PodEvents {
    fn record(&mut self, nodes: impl IntoIterator<Item = String>, now: Timestamp) {
        for node in nodes {
            self.0.insert(node, now);
        }
        if self.0.len() > POD_EVENTS_PRUNE_AT {
            self.0.retain(|_, t| now.duration_since(*t) < POD_EVENTS_KEPT);
        }
    }
}

/// The kinds joined by provider ID.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Joined {
    /// Nodes (`spec.providerID`).
    Nodes,
    /// NodeClaims (`status.providerID`).
    NodeClaims,
}

/// The indexes.
#[derive(Debug, Default)]
pub struct Index {
    nodes: RwLock<Joins>,
    claims: RwLock<Joins>,
    pods: RwLock<Bindings>,
    pod_events: RwLock<PodEvents>,
}

fn write<T>(lock: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    lock.write().unwrap_or_else(PoisonError::into_inner)
}

fn read<T>(lock: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    lock.read().unwrap_or_else(PoisonError::into_inner)
}

impl Index {
    fn joins(&self, kind: Joined) -> &RwLock<Joins> {
        match kind {
            Joined::Nodes => &self.nodes,
            Joined::NodeClaims => &self.claims,
        }
    }

    /// Records the provider ID of the Node or NodeClaim `name` (none yet: `None`).
    pub fn set(&self, kind: Joined, name: &str, provider_id: Option<&str>) {
        write(self.joins(kind)).set(name, provider_id);
    }

    /// Forgets the Node or NodeClaim `name`.
    pub fn remove(&self, kind: Joined, name: &str) {
        write(self.joins(kind)).remove(name);
    }

    /// Replaces every entry of `kind` (after the watch listed the kind again).
    pub fn replace(&self, kind: Joined, entries: Vec<(String, Option<String>)>) {
        write(self.joins(kind)).replace(entries);
    }

    /// Records the node a pod is bound to (`None`: not bound, or finished). A pod that
    /// `counts` for consolidation (not a DaemonSet pod) binding, leaving or (`terminating`)
    /// going away is a pod event on its node (see [`Index::take_pod_events`]).
    pub fn set_pod(&self, pod: PodKey, node: Option<&str>, counts: bool, terminating: bool) {
        let mut changed = write(&self.pods).set(pod, node);
        if terminating && let Some(node) = node {
            changed.push(node.to_string());
        }
        if counts && !changed.is_empty() {
            write(&self.pod_events).record(changed, Timestamp::now());
        }
    }

    /// Forgets a pod (deleted): a pod event on its node if it `counts`.
    pub fn remove_pod(&self, pod: &PodKey, counts: bool) {
        let changed = write(&self.pods).remove(pod);
        if counts && !changed.is_empty() {
            write(&self.pod_events).record(changed, Timestamp::now());
        }
    }

    /// The nodes with pod events since the last call, with the time of the latest.
    pub fn take_pod_events(&self) -> HashMap<String, Timestamp> {
        std::mem::take(&mut write(&self.pod_events).0)
    }

    /// Replaces every pod entry.
    pub fn replace_pods(&self, entries: Vec<(PodKey, Option<String>)>) {
        let mut bindings = Bindings::default();
        for (pod, node) in entries {
            bindings.set(pod, node.as_deref());
        }
        *write(&self.pods) = bindings;
    }

    /// Names of the Nodes or NodeClaims with `provider_id` (normally one).
    pub fn with_provider_id(&self, kind: Joined, provider_id: &str) -> Vec<String> {
        read(self.joins(kind)).names(provider_id)
    }

    /// Names of the objects of `kind` whose provider ID ends with instance ID `instance_id`.
    pub fn with_instance_id(&self, kind: Joined, instance_id: &str) -> Vec<String> {
        read(self.joins(kind)).names_of_instance(instance_id)
    }

    /// The pods bound to Node `node`.
    pub fn pods_on(&self, node: &str) -> Vec<PodKey> {
        read(&self.pods).pods_of.get(node).map(|s| s.iter().cloned().collect()).unwrap_or_default()
    }

    /// How many entries the indexes hold: Nodes, NodeClaims, bound pods.
    pub fn sizes(&self) -> (usize, usize, usize) {
        (
            read(&self.nodes).provider_of.len(),
            read(&self.claims).provider_of.len(),
            read(&self.pods).node_of.len(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(name: &str) -> PodKey {
        ("ns".to_string(), name.to_string())
    }

    #[test]
    fn provider_ids_join_nodes_and_claims() {
        let index = Index::default();
        index.set(Joined::NodeClaims, "claim-a", None);
        assert!(index.with_provider_id(Joined::NodeClaims, "kwok://a").is_empty());
        index.set(Joined::NodeClaims, "claim-a", Some("kwok://a"));
        index.set(Joined::Nodes, "node-a", Some("kwok://a"));
        assert_eq!(index.with_provider_id(Joined::NodeClaims, "kwok://a"), ["claim-a"]);
        assert_eq!(index.with_provider_id(Joined::Nodes, "kwok://a"), ["node-a"]);
        // A second node with the same provider ID is visible as such.
        index.set(Joined::Nodes, "node-b", Some("kwok://a"));
        assert_eq!(index.with_provider_id(Joined::Nodes, "kwok://a"), ["node-a", "node-b"]);
        index.set(Joined::Nodes, "node-b", Some("kwok://b"));
        assert_eq!(index.with_provider_id(Joined::Nodes, "kwok://a"), ["node-a"]);
        index.remove(Joined::Nodes, "node-a");
        index.remove(Joined::NodeClaims, "claim-a");
        assert!(index.with_provider_id(Joined::Nodes, "kwok://a").is_empty());
        assert!(index.with_provider_id(Joined::NodeClaims, "kwok://a").is_empty());
        assert_eq!(index.sizes(), (1, 0, 0));
    }

    #[test]
    fn instance_ids_find_claims_and_nodes() {
        let index = Index::default();
        assert_eq!(instance_id("aws:///us-west-2a/i-0123"), "i-0123");
        assert_eq!(instance_id("i-0123"), "i-0123");
        index.set(Joined::NodeClaims, "claim-a", Some("aws:///us-west-2a/i-0123"));
        index.set(Joined::Nodes, "node-a", Some("aws:///us-west-2a/i-0123"));
        assert_eq!(index.with_instance_id(Joined::NodeClaims, "i-0123"), ["claim-a"]);
        assert_eq!(index.with_instance_id(Joined::Nodes, "i-0123"), ["node-a"]);
        index.set(Joined::NodeClaims, "claim-a", Some("aws:///us-west-2b/i-0456"));
        assert!(index.with_instance_id(Joined::NodeClaims, "i-0123").is_empty());
        assert_eq!(index.with_instance_id(Joined::NodeClaims, "i-0456"), ["claim-a"]);
        index.remove(Joined::NodeClaims, "claim-a");
        assert!(index.with_instance_id(Joined::NodeClaims, "i-0456").is_empty());
        index.replace(Joined::Nodes, vec![]);
        assert!(index.with_instance_id(Joined::Nodes, "i-0123").is_empty());
    }

    #[test]
    fn pods_follow_their_binding() {
        let index = Index::default();
        index.set_pod(key("p"), None, true, false);
        assert!(index.pods_on("n1").is_empty());
        index.set_pod(key("p"), Some("n1"), true, false);
        index.set_pod(key("q"), Some("n1"), true, false);
        assert_eq!(index.pods_on("n1"), [key("p"), key("q")]);
        index.set_pod(key("p"), None, true, false);
        assert_eq!(index.pods_on("n1"), [key("q")]);
        index.remove_pod(&key("q"), true);
        assert!(index.pods_on("n1").is_empty());
        assert_eq!(index.sizes(), (0, 0, 0));
    }

    #[test]
    fn pod_events_are_kept_per_node_until_taken() {
        let index = Index::default();
        index.set_pod(key("ds"), Some("n1"), false, false);
        assert!(index.take_pod_events().is_empty(), "DaemonSet pods do not count");
        index.set_pod(key("p"), Some("n1"), true, false);
        index.set_pod(key("p"), Some("n1"), true, false);
        let events = index.take_pod_events();
        assert_eq!(events.keys().collect::<Vec<_>>(), ["n1"]);
        assert!(index.take_pod_events().is_empty(), "an unchanged binding is no event");
        index.set_pod(key("p"), Some("n1"), true, true);
        assert!(index.take_pod_events().contains_key("n1"), "terminating");
        index.set_pod(key("p"), Some("n2"), true, false);
        let mut nodes: Vec<String> = index.take_pod_events().into_keys().collect();
        nodes.sort();
        assert_eq!(nodes, ["n1", "n2"], "moved: both nodes");
        index.remove_pod(&key("p"), true);
        assert!(index.take_pod_events().contains_key("n2"));
    }

    #[test]
    fn a_relist_replaces_everything() {
        let index = Index::default();
        index.set(Joined::Nodes, "stale", Some("kwok://stale"));
        index.set_pod(key("stale"), Some("stale"), true, false);
        index.replace(
            Joined::Nodes,
            vec![("fresh".into(), Some("kwok://fresh".into())), ("bare".into(), None)],
        );
        index.replace_pods(vec![(key("fresh"), Some("fresh".into()))]);
        assert!(index.with_provider_id(Joined::Nodes, "kwok://stale").is_empty());
        assert_eq!(index.with_provider_id(Joined::Nodes, "kwok://fresh"), ["fresh"]);
        assert!(index.pods_on("stale").is_empty());
        assert_eq!(index.pods_on("fresh"), [key("fresh")]);
    }
}

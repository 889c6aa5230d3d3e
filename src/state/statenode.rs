//! [`StateNode`]: a node as the decisions see it, joining the Node and the NodeClaim that share a
//! provider ID, with the pods bound to it and what this process knows about it.
//!
//! A NodeClaim that has not launched or registered yet is a StateNode without a Node (in-flight
//! capacity); a Node no NodeClaim accounts for (one Karpenter does not manage) is a StateNode
//! without a NodeClaim. The join is by provider ID through hash maps: building the StateNodes of a
//! snapshot costs one pass over its Nodes, NodeClaims and pods.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use crate::apis::pod::Pod;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::jiff::Timestamp;

use crate::apis::labels::{
    LABEL_CAPACITY_TYPE, LABEL_INITIALIZED, LABEL_INSTANCE_TYPE, LABEL_NODEPOOL, LABEL_TOPOLOGY_ZONE,
};
use crate::apis::nodeclaim::conditions::{INITIALIZED, INSTANCE_TERMINATING, LAUNCHED};
use crate::apis::nodelabels::NodeLabels;
use crate::apis::{NodeClaim, Operator, Taint};
use crate::scheduling::resources::{pod_limits, pod_requests};
use crate::scheduling::{Requirements, Resources};

use super::pods;
use super::snapshot::Snapshot;

/// A node, launched or coming.
#[derive(Clone, Debug, Default)]
pub struct StateNode {
    /// The Node's name once registered, else the NodeClaim's.
    pub name: String,
    /// The Node, once registered.
    pub node: Option<Arc<Node>>,
    /// The NodeClaim, when Karpenter manages the node.
    pub claim: Option<Arc<NodeClaim>>,
    /// The provider ID, once launched.
    pub provider_id: Option<String>,
    /// The Node's labels; before registration, the NodeClaim's labels and its single-valued
    /// requirements (what the Node will carry).
    pub labels: NodeLabels,
    /// Taints: the Node's, or the NodeClaim's before registration.
    pub taints: Vec<Taint>,
    /// The NodeClaim's startup taints (ignored until the node is initialized).
    pub startup_taints: Vec<Taint>,
    /// Capacity: the Node's; before registration, the launched instance's; before launch, the
    /// largest instance type the NodeClaim may still become (what counts against limits).
    pub capacity: Resources,
    /// What pods can use: the Node's allocatable once initialized; before, what the launched
    /// instance reported; before launch, the requests the NodeClaim was made for.
    pub allocatable: Resources,
    /// Pods bound to the node that have not finished.
    pub pods: Vec<Arc<Pod>>,
    /// Requests of [`StateNode::pods`].
    pub pod_requests: Resources,
    /// Requests of the DaemonSet pods among [`StateNode::pods`].
    pub daemonset_requests: Resources,
    /// Limits of [`StateNode::pods`] (see [`pod_limits`]).
    pub pod_limits: Resources,
    /// Limits of the DaemonSet pods among [`StateNode::pods`].
    pub daemonset_limits: Resources,
    /// Whether Karpenter manages the node (it has a NodeClaim or a NodePool label).
    pub managed: bool,
    /// Whether the node is ready for pods as Karpenter sees it: unmanaged nodes always; managed
    /// ones once the NodeClaim is Initialized and the Node carries `karpenter.sh/initialized`.
    pub initialized: bool,
    /// Whether the node is going away: marked by a decision of this process, being deleted (Node
    /// or NodeClaim), or its instance terminating.
    pub marked_for_deletion: bool,
    /// Whether pods were nominated to it within the nomination window.
    pub nominated: bool,
    /// When a pod last bound to or left the node (`status.lastPodEventTime` of the NodeClaim).
    pub last_pod_event_time: Option<Timestamp>,
    /// Hourly price of its offering (instance type, zone, capacity type), when known: the full
    /// cost of the node where the cloud provider prices what comes with it.
    pub price: Option<f64>,
    /// Hourly list price of its offering, without what comes with the node.
    pub list_price: Option<f64>,
}

impl StateNode {
    fn label(&self, key: &str) -> Option<&str> {
        self.labels.get(key).map(String::as_str)
    }

    /// Its NodePool.
    pub fn nodepool(&self) -> Option<&str> {
        self.label(LABEL_NODEPOOL)
    }

    /// Its instance type.
    pub fn instance_type(&self) -> Option<&str> {
        self.label(LABEL_INSTANCE_TYPE)
    }

    /// Its capacity type (`spot`, `on-demand`, `reserved`).
    pub fn capacity_type(&self) -> Option<&str> {
        self.label(LABEL_CAPACITY_TYPE)
    }

    /// Its zone.
    pub fn zone(&self) -> Option<&str> {
        self.label(LABEL_TOPOLOGY_ZONE)
    }

    /// The NodeClaim's name.
    pub fn claim_name(&self) -> Option<&str> {
        self.claim.as_ref().and_then(|c| c.metadata.name.as_deref())
    }

    /// The Node's name, once registered.
    pub fn node_name(&self) -> Option<&str> {
        self.node.as_ref().and_then(|n| n.metadata.name.as_deref())
    }

    /// Whether the instance exists (a provider ID is known).
    pub fn launched(&self) -> bool {
        self.provider_id.is_some()
    }

    /// Whether the Node registered.
    pub fn registered(&self) -> bool {
        self.node.is_some()
    }

    /// Whether the Node reports `Ready=True`.
    pub fn is_ready(&self) -> bool {
        self.node
            .as_ref()
            .and_then(|n| n.status.as_ref()?.conditions.as_ref())
            .is_some_and(|conditions| conditions.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
    }

    /// Whether the NodeClaim says its instance is terminating.
    pub fn instance_terminating(&self) -> bool {
        self.claim.as_deref().is_some_and(|c| c.is_true(INSTANCE_TERMINATING))
    }

    /// The pods that need a place elsewhere if the node goes (see [`pods::is_reschedulable`]).
    pub fn reschedulable_pods(&self) -> impl Iterator<Item = &Arc<Pod>> {
        self.pods.iter().filter(|p| pods::is_reschedulable(p))
    }

    /// The pods a drain would evict at `now`, whose PodDisruptionBudgets therefore matter (see
    /// [`pods::is_evictable`]).
    pub fn pdb_relevant_pods(&self, now: Timestamp) -> impl Iterator<Item = &Arc<Pod>> {
        self.pods.iter().filter(move |p| pods::is_evictable(p, now))
    }

    /// The taints pods must tolerate now: a managed node that is not initialized yet does not hold
    /// its startup taints or the known ephemeral taints against pods.
    pub fn effective_taints(&self) -> Vec<Taint> {
        if self.initialized || !self.managed {
            return self.taints.clone();
        }
        self.taints
            .iter()
            .filter(|t| !crate::scheduling::taints::is_ephemeral(t))
            .filter(|t| !self.startup_taints.iter().any(|s| s.key == t.key && s.effect == t.effect))
            .cloned()
            .collect()
    }
}

fn provider_id_of_claim(claim: &NodeClaim) -> Option<&str> {
    claim.status.as_ref().and_then(|s| s.provider_id.as_deref()).filter(|p| !p.is_empty())
}

fn provider_id_of_node(node: &Node) -> Option<&str> {
    node.spec.as_ref().and_then(|s| s.provider_id.as_deref()).filter(|p| !p.is_empty())
}

fn taints_of(taints: Option<&Vec<k8s_openapi::api::core::v1::Taint>>) -> Vec<Taint> {
    taints.into_iter().flatten().filter_map(Taint::from_k8s).collect()
}

fn resources(list: Option<&crate::apis::ResourceList>) -> Option<Resources> {
    list.and_then(|l| Resources::from_list(l).ok()).filter(|r| !r.is_zero())
}

/// The largest capacity among the instance types a NodeClaim's requirements name, or `None`.
fn largest_allowed(claim: &NodeClaim, snapshot: &Snapshot) -> Option<Resources> {
    let pool = claim.metadata.labels.as_ref().and_then(|l| l.get(LABEL_NODEPOOL)).map(String::as_str);
    let req = claim
        .spec
        .requirements
        .iter()
        .find(|r| r.key == LABEL_INSTANCE_TYPE && r.operator == Operator::In)?;
    let mut max: Option<Resources> = None;
    for it in req.values.iter().filter_map(|name| snapshot.instance_type(pool, name)) {
        max = Some(match max {
            Some(m) => m.max(&it.capacity),
            None => it.capacity.clone(),
        });
    }
    max
}

fn claim_requests(claim: &NodeClaim) -> Option<Resources> {
    resources(claim.spec.resources.as_ref().and_then(|r| r.requests.as_ref()))
}

/// The hourly price and list price of the offering `labels` describe (in the NodePool they
/// name, with its NodeOverlays), from `snapshot`'s instance types.
pub fn offering_price(labels: &BTreeMap<String, String>, snapshot: &Snapshot) -> (Option<f64>, Option<f64>) {
    let find = || {
        let pool = labels.get(LABEL_NODEPOOL).map(String::as_str);
        let it = snapshot.instance_type(pool, labels.get(LABEL_INSTANCE_TYPE)?)?;
        let zone = labels.get(LABEL_TOPOLOGY_ZONE)?;
        let capacity_type = labels.get(LABEL_CAPACITY_TYPE)?;
        it.offerings
            .iter()
            .find(|o| &o.zone == zone && &o.capacity_type == capacity_type)
            .map(|o| (o.price, o.list_price))
    };
    find().unzip()
}

struct Built {
    pods: Vec<Arc<Pod>>,
    requests: Resources,
    daemonsets: Resources,
    limits: Resources,
    daemonset_limits: Resources,
}

fn bound(pods: Vec<Arc<Pod>>) -> Built {
    let mut requests = Resources::default();
    let mut daemonsets = Resources::default();
    let mut limits = Resources::default();
    let mut daemonset_limits = Resources::default();
    for p in &pods {
        let r = pod_requests(p);
        let l = pod_limits(p);
        if pods::is_owned_by_daemonset(p) {
            daemonsets.add_assign(&r);
            daemonset_limits.add_assign(&l);
        }
        requests.add_assign(&r);
        limits.add_assign(&l);
    }
    Built { pods, requests, daemonsets, limits, daemonset_limits }
}

/// Every StateNode of `snapshot`, by name: one per registered Node (with its NodeClaim, if any)
/// and one per NodeClaim without a Node. Prices and the capacity of unlaunched NodeClaims come from
/// `snapshot.instance_types`.
pub fn state_nodes(snapshot: &Snapshot) -> Vec<StateNode> {
    let mut claims_by_pid: HashMap<&str, &Arc<NodeClaim>> = HashMap::new();
    for claim in &snapshot.nodeclaims {
        if let Some(pid) = provider_id_of_claim(claim) {
            claims_by_pid.insert(pid, claim);
        }
    }
    let mut pods_by_node: HashMap<&str, Vec<Arc<Pod>>> = HashMap::new();
    for pod in &snapshot.pods {
        if pods::is_terminal(pod) {
            continue;
        }
        if let Some(node) = pods::node_name(pod) {
            pods_by_node.entry(node).or_default().push(Arc::clone(pod));
        }
    }
    let mut out = Vec::with_capacity(snapshot.nodes.len() + snapshot.nodeclaims.len());
    let mut joined: std::collections::HashSet<&str> = std::collections::HashSet::new();
    for node in &snapshot.nodes {
        let name = node.metadata.name.clone().unwrap_or_default();
        let pid = provider_id_of_node(node);
        let matched: Option<&Arc<NodeClaim>> = pid.and_then(|p| claims_by_pid.get(p).copied());
        if let Some(n) = matched.and_then(|c| c.metadata.name.as_deref()) {
            joined.insert(n);
        }
        let claim = matched.cloned();
        let labels = NodeLabels::from(Arc::clone(node));
        let managed = claim.is_some() || labels.contains_key(LABEL_NODEPOOL);
        let initialized = !managed
            || (labels.get(LABEL_INITIALIZED).is_some_and(|v| v == "true")
                && claim.as_ref().is_some_and(|c| c.is_true(INITIALIZED)));
        let status = node.status.as_ref();
        let node_capacity = resources(status.and_then(|s| s.capacity.as_ref()));
        let node_allocatable = resources(status.and_then(|s| s.allocatable.as_ref()));
        let claim_allocatable =
            claim.as_ref().and_then(|c| resources(c.status.as_ref().and_then(|s| s.allocatable.as_ref())));
        // Before initialization a node may not report everything yet (device plugins): the
        // instance's figures stand in.
        let allocatable = if managed && !initialized {
            claim_allocatable.clone().or(node_allocatable.clone())
        } else {
            node_allocatable.clone().or(claim_allocatable.clone())
        }
        .or(node_capacity.clone())
        .unwrap_or_default();
        let b = bound(pods_by_node.remove(name.as_str()).unwrap_or_default());
        let deleting = node.metadata.deletion_timestamp.is_some()
            || claim.as_ref().is_some_and(|c| claim_deleting(c, snapshot));
        let nominated = snapshot.nominated.contains(&name)
            || claim
                .as_ref()
                .and_then(|c| c.metadata.name.as_ref())
                .is_some_and(|n| snapshot.nominated.contains(n));
        let (price, list_price) = offering_price(&labels, snapshot);
        out.push(StateNode {
            price,
            list_price,
            name,
            provider_id: pid.map(str::to_string),
            taints: taints_of(node.spec.as_ref().and_then(|s| s.taints.as_ref())),
            startup_taints: claim.as_ref().map(|c| c.spec.startup_taints.clone()).unwrap_or_default(),
            capacity: node_capacity.unwrap_or_default(),
            allocatable,
            pods: b.pods,
            pod_requests: b.requests,
            daemonset_requests: b.daemonsets,
            pod_limits: b.limits,
            daemonset_limits: b.daemonset_limits,
            managed,
            initialized,
            marked_for_deletion: deleting,
            nominated,
            last_pod_event_time: claim.as_ref().and_then(|c| last_pod_event_time(c)),
            labels,
            node: Some(Arc::clone(node)),
            claim,
        });
    }
    for claim in &snapshot.nodeclaims {
        let name = claim.metadata.name.clone().unwrap_or_default();
        if joined.contains(name.as_str()) {
            continue;
        }
        let mut labels = claim.metadata.labels.clone().unwrap_or_default();
        if let Ok(reqs) = Requirements::from_nodepool(&claim.spec.requirements) {
            for (k, v) in reqs.single_valued_labels() {
                labels.entry(k).or_insert(v);
            }
        }
        let status = claim.status.as_ref();
        let launched = provider_id_of_claim(claim).is_some() || claim.is_true(LAUNCHED);
        let capacity = if launched { resources(status.and_then(|s| s.capacity.as_ref())) } else { None }
            .or_else(|| largest_allowed(claim, snapshot))
            .or_else(|| claim_requests(claim))
            .unwrap_or_default();
        let allocatable = resources(status.and_then(|s| s.allocatable.as_ref()))
            .or_else(|| claim_requests(claim))
            .unwrap_or_default();
        let (price, list_price) = offering_price(&labels, snapshot);
        out.push(StateNode {
            price,
            list_price,
            nominated: snapshot.nominated.contains(&name),
            marked_for_deletion: claim_deleting(claim, snapshot),
            name,
            node: None,
            provider_id: provider_id_of_claim(claim).map(str::to_string),
            taints: claim.spec.taints.clone(),
            startup_taints: claim.spec.startup_taints.clone(),
            capacity,
            allocatable,
            pods: vec![],
            pod_requests: Resources::default(),
            daemonset_requests: Resources::default(),
            pod_limits: Resources::default(),
            daemonset_limits: Resources::default(),
            managed: true,
            initialized: false,
            last_pod_event_time: last_pod_event_time(claim),
            labels: labels.into(),
            claim: Some(Arc::clone(claim)),
        });
    }
    // In name order, whatever order the caches list in: the same snapshot always makes the same
    // decision (ties among equal candidates go to the first name).
    out.sort_unstable_by(|a, b| a.name.cmp(&b.name));
    out
}

/// Whether a node or NodeClaim of `snapshot` may be going away, without building the node
/// views: `false` means no [`StateNode`] of [`state_nodes`] is marked for deletion (`true` may
/// still find none), the cheap check before the views are built to ask which.
pub fn any_marked_for_deletion(snapshot: &Snapshot) -> bool {
    !snapshot.marked_for_deletion.is_empty()
        || snapshot.nodes.iter().any(|n| n.metadata.deletion_timestamp.is_some())
        || snapshot.nodeclaims.iter().any(|c| claim_deleting(c, snapshot))
}

fn claim_deleting(claim: &NodeClaim, snapshot: &Snapshot) -> bool {
    claim.metadata.deletion_timestamp.is_some()
        || claim.is_true(INSTANCE_TERMINATING)
        || claim.metadata.name.as_ref().is_some_and(|n| snapshot.marked_for_deletion.contains(n))
}

fn last_pod_event_time(claim: &NodeClaim) -> Option<Timestamp> {
    claim.status.as_ref()?.last_pod_event_time.as_deref()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use serde_json::json;

    use super::*;
    use crate::scheduling::{InstanceType, Offering};

    fn node(name: &str, pid: &str, labels: serde_json::Value) -> Arc<Node> {
        Arc::new(
            serde_json::from_value(json!({
                "metadata": {"name": name, "labels": labels},
                "spec": {"providerID": pid},
                "status": {"capacity": {"cpu": "4", "memory": "8Gi", "pods": "110"},
                    "allocatable": {"cpu": "3900m", "memory": "7Gi", "pods": "110"}},
            }))
            .unwrap(),
        )
    }

    fn claim(name: &str, pid: Option<&str>, conditions: &[&str]) -> Arc<NodeClaim> {
        let conditions: Vec<serde_json::Value> = conditions
            .iter()
            .map(|c| json!({"type": c, "status": "True", "reason": c, "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"}))
            .collect();
        let mut status = json!({"conditions": conditions, "lastPodEventTime": "2026-01-01T00:05:00Z"});
        if let Some(pid) = pid {
            status["providerID"] = json!(pid);
            status["capacity"] = json!({"cpu": "4", "memory": "8Gi", "pods": "110"});
            status["allocatable"] = json!({"cpu": "3500m", "memory": "6Gi", "pods": "110"});
        }
        Arc::new(
            serde_json::from_value(json!({
                "apiVersion": "karpenter.sh/v1", "kind": "NodeClaim",
                "metadata": {"name": name, "labels": {"karpenter.sh/nodepool": "default"}},
                "spec": {
                    "nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "default"},
                    "requirements": [
                        {"key": "node.kubernetes.io/instance-type", "operator": "In", "values": ["small", "big"]},
                        {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["spot"]}],
                    "resources": {"requests": {"cpu": "1500m"}},
                    "startupTaints": [{"key": "agent-not-ready", "effect": "NoSchedule"}],
                },
                "status": status,
            }))
            .unwrap(),
        )
    }

    fn pod(name: &str, node: &str, cpu: &str, ds: bool) -> Arc<Pod> {
        let owners = if ds {
            json!([{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "d", "uid": "d"}])
        } else {
            json!([])
        };
        Arc::new(
            serde_json::from_value(json!({
                "metadata": {"name": name, "namespace": "ns", "ownerReferences": owners},
                "spec": {"nodeName": node, "containers": [{"name": "c",
                    "resources": {"requests": {"cpu": cpu}, "limits": {"cpu": "1"}}}]},
                "status": {"phase": "Running"},
            }))
            .unwrap(),
        )
    }

    fn types() -> crate::state::snapshot::TypesByName {
        let t = |name: &str, cpu: i64, price: f64| {
            Arc::new(InstanceType::new(
                name,
                Requirements::new(),
                Resources::from_pairs([("cpu", cpu * 1000)]),
                Default::default(),
                vec![Offering::new("z1", "spot", price, true)],
            ))
        };
        [("small".to_string(), t("small", 2, 0.05)), ("big".to_string(), t("big", 8, 0.2))].into()
    }

    #[test]
    fn a_node_is_priced_as_its_own_nodepool_overlays_price_its_type() {
        let base = types();
        let big = &base["big"];
        let mut cheap = big.offerings.clone();
        cheap[0].price = 0.01;
        let marks = crate::scheduling::OverlayMarks { price: vec!["discount".into()], capacity: vec![] };
        let overlaid = Arc::new(big.overlaid(cheap, &Default::default(), marks));
        let pool_types = [
            ("discounted".to_string(), vec![overlaid, base["small"].clone()]),
            ("plain".to_string(), vec![big.clone(), base["small"].clone()]),
        ]
        .into();
        let labels = |pool: &str| {
            json!({"karpenter.sh/nodepool": pool, "karpenter.sh/initialized": "true",
                "node.kubernetes.io/instance-type": "big", "topology.kubernetes.io/zone": "z1",
                "karpenter.sh/capacity-type": "spot"})
        };
        let snapshot = Snapshot {
            nodes: vec![node("d", "kwok://d", labels("discounted")), node("p", "kwok://p", labels("plain"))],
            ..Default::default()
        }
        .with_instance_types(pool_types);
        let nodes = state_nodes(&snapshot);
        assert_eq!(
            nodes.iter().map(|n| (n.name.as_str(), n.price)).collect::<Vec<_>>(),
            [("d", Some(0.01)), ("p", Some(0.2))]
        );
        assert!(snapshot.types_by_name["big"].overlays.is_none(), "by name: the provider's own figures");
    }

    #[test]
    fn nodes_and_claims_join_by_provider_id() {
        let labels = json!({"karpenter.sh/nodepool": "default", "karpenter.sh/initialized": "true",
            "node.kubernetes.io/instance-type": "big", "topology.kubernetes.io/zone": "z1",
            "karpenter.sh/capacity-type": "spot"});
        let snapshot = Snapshot {
            nodes: vec![node("n1", "kwok://n1", labels), node("unmanaged", "kwok://u", json!({}))],
            nodeclaims: vec![
                claim("c1", Some("kwok://n1"), &["Launched", "Registered", "Initialized"]),
                claim("c2", None, &[]),
            ],
            pods: vec![
                pod("a", "n1", "250m", false),
                pod("d", "n1", "100m", true),
                pod("x", "unmanaged", "1", false),
            ],
            types_by_name: types(),
            nominated: ["c2".to_string()].into(),
            ..Default::default()
        };
        let nodes = state_nodes(&snapshot);
        assert_eq!(nodes.len(), 3);
        let names: Vec<&str> = nodes.iter().map(|n| n.name.as_str()).collect();
        assert_eq!(names, ["c2", "n1", "unmanaged"], "in name order");
        let n1 = &nodes[1];
        assert_eq!((n1.name.as_str(), n1.claim_name()), ("n1", Some("c1")));
        assert!(n1.managed && n1.initialized && n1.launched() && n1.registered());
        assert_eq!(
            (n1.nodepool(), n1.instance_type(), n1.zone(), n1.capacity_type()),
            (Some("default"), Some("big"), Some("z1"), Some("spot"))
        );
        assert_eq!(n1.price, Some(0.2));
        assert_eq!(n1.pod_requests.get("cpu"), 350);
        assert_eq!(n1.daemonset_requests.get("cpu"), 100);
        assert_eq!(n1.pod_limits.get("cpu"), 2000, "limits, not requests");
        assert_eq!(n1.daemonset_limits.get("cpu"), 1000);
        assert_eq!(n1.reschedulable_pods().count(), 1);
        assert_eq!(n1.allocatable.get("cpu"), 3900, "initialized: the node's own figure");
        assert!(n1.last_pod_event_time.is_some());
        let unmanaged = &nodes[2];
        assert!(!unmanaged.managed && unmanaged.initialized && unmanaged.claim.is_none());
        let c2 = &nodes[0];
        assert_eq!(c2.name, "c2");
        assert!(!c2.launched() && !c2.registered() && !c2.initialized);
        assert!(c2.nominated);
        assert_eq!(c2.capacity.get("cpu"), 8000, "not launched: the largest type it may become");
        assert_eq!(c2.allocatable.get("cpu"), 1500, "what it was made for");
        assert_eq!(c2.labels.get(LABEL_CAPACITY_TYPE).map(String::as_str), Some("spot"));
    }

    #[test]
    fn deletion_marks_and_deleting_objects_count_as_going() {
        let mut deleting = (*claim("c3", Some("kwok://n3"), &["Launched"])).clone();
        deleting.metadata.deletion_timestamp = Some(Time(Timestamp::UNIX_EPOCH));
        let snapshot = Snapshot {
            nodeclaims: vec![
                claim("c1", Some("kwok://n1"), &["Launched"]),
                claim("c2", Some("kwok://n2"), &["Launched", "InstanceTerminating"]),
                Arc::new(deleting),
                claim("c4", None, &[]),
            ],
            marked_for_deletion: ["c1".to_string()].into(),
            ..Default::default()
        };
        let going: Vec<bool> = state_nodes(&snapshot).iter().map(|n| n.marked_for_deletion).collect();
        assert_eq!(going, [true, true, true, false]);
        assert!(any_marked_for_deletion(&snapshot));
    }

    #[test]
    fn the_cheap_check_finds_every_kind_of_going_and_nothing_else() {
        let mut claims = vec![claim("c1", Some("kwok://n1"), &["Launched"]), claim("c2", None, &[])];
        let nodes = vec![node("n1", "kwok://n1", json!({"karpenter.sh/nodepool": "default"}))];
        let mut snapshot =
            Snapshot { nodeclaims: claims.clone(), nodes: nodes.clone(), ..Default::default() };
        assert!(!any_marked_for_deletion(&snapshot));
        assert!(!state_nodes(&snapshot).iter().any(|n| n.marked_for_deletion));
        let mut marked = snapshot.clone();
        marked.marked_for_deletion.insert("c2".to_string());
        let terminating = claim("c2", None, &["InstanceTerminating"]);
        claims[1] = terminating;
        let terminating = Snapshot { nodeclaims: claims, ..snapshot.clone() };
        let mut deleted = (*nodes[0]).clone();
        deleted.metadata.deletion_timestamp = Some(Time(Timestamp::UNIX_EPOCH));
        snapshot.nodes = vec![Arc::new(deleted)];
        for going in [marked, terminating, snapshot] {
            assert!(any_marked_for_deletion(&going));
            assert!(state_nodes(&going).iter().any(|n| n.marked_for_deletion));
        }
    }

    #[test]
    fn an_uninitialized_managed_node_uses_the_instance_figures_and_ignores_startup_taints() {
        let mut n = (*node("n1", "kwok://n1", json!({"karpenter.sh/nodepool": "default"}))).clone();
        n.spec.as_mut().unwrap().taints = Some(vec![
            k8s_openapi::api::core::v1::Taint {
                key: "agent-not-ready".into(),
                effect: "NoSchedule".into(),
                ..Default::default()
            },
            k8s_openapi::api::core::v1::Taint {
                key: "node.kubernetes.io/not-ready".into(),
                effect: "NoSchedule".into(),
                ..Default::default()
            },
            k8s_openapi::api::core::v1::Taint {
                key: "dedicated".into(),
                effect: "NoSchedule".into(),
                ..Default::default()
            },
        ]);
        let snapshot = Snapshot {
            nodes: vec![Arc::new(n)],
            nodeclaims: vec![claim("c1", Some("kwok://n1"), &["Launched", "Registered"])],
            ..Default::default()
        };
        let nodes = state_nodes(&snapshot);
        assert!(!nodes[0].initialized);
        assert_eq!(nodes[0].allocatable.get("cpu"), 3500);
        let keys: Vec<String> = nodes[0].effective_taints().into_iter().map(|t| t.key).collect();
        assert_eq!(keys, ["dedicated"]);
    }
}

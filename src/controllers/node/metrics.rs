//! Node, utilisation and cost metrics, from the cluster state every few seconds (upstream's
//! `metrics.node` controller, plus cost).
//!
//! - Per node, labelled as upstream labels them: `node_name`, `phase`, `managed`, one label per
//!   well-known node label (`nodepool`, `zone`, `region`, `instance_type`, `arch`, `os`,
//!   `capacity_type`, `instance_category`, `instance_cpu`, ...: the key's name after the `/`,
//!   `-` as `_`; empty when the node lacks it) and `resource_type`:
//!   `karpenter_nodes_allocatable`, `karpenter_nodes_total_pod_requests` and
//!   `karpenter_nodes_total_pod_limits` (every pod bound to the node, DaemonSet pods included),
//!   `karpenter_nodes_total_daemon_requests`, `karpenter_nodes_total_daemon_limits`,
//!   `karpenter_nodes_system_overhead` (capacity minus allocatable); without `resource_type`,
//!   `karpenter_nodes_current_lifetime_seconds`. CPU in cores, other resources as plain numbers
//!   (bytes, counts); `resource_type` is the resource name lowercased with `-` as `_`.
//! - `karpenter_cluster_utilization_percent{resource_type}`: the requests of every pod bound to a
//!   Node over the Nodes' allocatable, in percent.
//! - Cost, in dollars per hour at each node's offering list price: `karpenter_nodepools_cost_total
//!   {nodepool}` (upstream's name; the NodeClaims of the NodePool, launched or coming) and, beyond
//!   upstream, `karpenter_nodes_price_per_hour` with the node labels above (without
//!   `resource_type`), so that a dashboard can sum cost by any of them; beside it
//!   `karpenter_nodes_cost_per_hour`, the node's full cost (with its volumes, public IPv4 address
//!   and burstable surplus, where the cloud provider prices them).
//!
//! Series of nodes and NodePools that went away go with the next pass; the others are updated in
//! place, so that a scrape never finds a family half rebuilt.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::hash::Hash;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use tokio::sync::watch;

use crate::apis::labels::{LABEL_CAPACITY_TYPE, LABEL_INSTANCE_TYPE, LABEL_TOPOLOGY_ZONE, WELL_KNOWN_LABELS};
use crate::controllers::Context;
use crate::controllers::kit::{Next, Options, Timer, run_singleton};
use crate::metrics::{Labels, NodeSeries};
use crate::scheduling::Resources;
use crate::state::statenode::state_nodes;
use crate::state::{ClusterState, StateNode};

/// Name of the controller, in logs and metrics.
pub const CONTROLLER: &str = "metrics.node";
/// How often the metrics are recomputed (upstream's period).
const PERIOD: Duration = Duration::from_secs(5);

/// One node's readings.
#[derive(Clone, Debug, PartialEq)]
pub struct NodeReading {
    /// Its labels (without `resource_type`).
    pub labels: Arc<Labels>,
    /// `karpenter_nodes_allocatable`, by resource type.
    pub allocatable: Vec<(String, f64)>,
    /// `karpenter_nodes_total_pod_requests`.
    pub pod_requests: Vec<(String, f64)>,
    /// `karpenter_nodes_total_daemon_requests`.
    pub daemon_requests: Vec<(String, f64)>,
    /// `karpenter_nodes_total_pod_limits`.
    pub pod_limits: Vec<(String, f64)>,
    /// `karpenter_nodes_total_daemon_limits`.
    pub daemon_limits: Vec<(String, f64)>,
    /// `karpenter_nodes_system_overhead`.
    pub system_overhead: Vec<(String, f64)>,
    /// `karpenter_nodes_current_lifetime_seconds`.
    pub lifetime_seconds: Option<f64>,
    /// `karpenter_nodes_price_per_hour`: the list price.
    pub price_per_hour: Option<f64>,
    /// `karpenter_nodes_cost_per_hour`: the full cost, with what comes with the node.
    pub cost_per_hour: Option<f64>,
}

/// Every reading of one pass.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Readings {
    /// Per node with a Node object.
    pub nodes: Vec<NodeReading>,
    /// `karpenter_cluster_utilization_percent`, by resource type.
    pub utilization: BTreeMap<String, f64>,
    /// `karpenter_nodepools_cost_total`, by NodePool.
    pub nodepool_cost: BTreeMap<String, f64>,
    /// NodeClaims (name, NodePool) with an offering (instance type, zone and capacity type) whose
    /// price is unknown, so left out of their NodePool's cost: no NodePool's instance types have
    /// that offering.
    pub uncosted: Vec<(String, String)>,
}

/// `resource_type` as upstream spells it.
pub fn resource_type(name: &str) -> String {
    name.to_lowercase().replace('-', "_")
}

/// The metric label of each well-known node label, as upstream names them: the part after the
/// `/`, lowercased, `-` as `_` (`node.kubernetes.io/instance-type` is `instance_type`).
fn metric_labels() -> &'static [(&'static str, &'static str)] {
    static NAMES: std::sync::LazyLock<Vec<(&'static str, &'static str)>> = std::sync::LazyLock::new(|| {
        WELL_KNOWN_LABELS
            .iter()
            .filter_map(|key| {
                let (_, name) = key.split_once('/')?;
                // Made once per process: the label names live as long as the metrics.
                let name: &'static str = Box::leak(name.to_lowercase().replace('-', "_").into_boxed_str());
                Some((*key, name))
            })
            .collect()
    });
    &NAMES
}

/// A quantity as the metrics report it: cores for CPU, the plain number otherwise.
pub fn metric_value(resource: &str, v: i64) -> f64 {
    if resource == "cpu" { v as f64 / 1000.0 } else { v as f64 }
}

fn by_type(r: &Resources) -> Vec<(String, f64)> {
    r.iter().map(|(k, v)| (resource_type(k), metric_value(k, v))).collect()
}

/// The labels of the per-node series last published, by node name.
pub type KnownLabels = HashMap<String, Arc<Labels>>;

/// The readings of `nodes` at `now` (pure). A node whose labels are those `known` has for it
/// gets that allocation again, as its series already hold it, instead of another copy.
pub fn readings(nodes: &[StateNode], now: Timestamp, known: &KnownLabels) -> Readings {
    let mut out = Readings::default();
    let mut used = Resources::default();
    let mut allocatable = Resources::default();
    for node in nodes {
        if let (Some(pool), Some(claim)) = (node.nodepool(), node.claim.as_deref()) {
            match node.list_price {
                Some(price) => *out.nodepool_cost.entry(pool.to_string()).or_default() += price,
                None if [LABEL_INSTANCE_TYPE, LABEL_TOPOLOGY_ZONE, LABEL_CAPACITY_TYPE]
                    .iter()
                    .all(|k| node.labels.contains_key(*k)) =>
                {
                    out.uncosted.push((claim.metadata.name.clone().unwrap_or_default(), pool.to_string()));
                }
                None => {}
            }
        }
        let Some(object) = node.node.as_deref() else { continue };
        used.add_assign(&node.pod_requests);
        allocatable.add_assign(&node.allocatable);
        let label = |k: &str| node.labels.get(k).cloned().unwrap_or_default();
        let phase = object.status.as_ref().and_then(|s| s.phase.clone()).unwrap_or_default();
        let mut labels: Labels =
            vec![("node_name", node.name.clone()), ("phase", phase), ("managed", node.managed.to_string())];
        labels.extend(metric_labels().iter().map(|(key, name)| (*name, label(key))));
        let labels = match known.get(&node.name) {
            Some(same) if **same == labels => same.clone(),
            _ => Arc::new(labels),
        };
        let lifetime = object
            .metadata
            .creation_timestamp
            .as_ref()
            .map(|t| now.duration_since(t.0).as_secs_f64().max(0.0));
        out.nodes.push(NodeReading {
            labels,
            allocatable: by_type(&node.allocatable),
            pod_requests: by_type(&node.pod_requests),
            daemon_requests: by_type(&node.daemonset_requests),
            pod_limits: by_type(&node.pod_limits),
            daemon_limits: by_type(&node.daemonset_limits),
            system_overhead: by_type(&node.capacity.sub_floored(&node.allocatable)),
            lifetime_seconds: lifetime,
            price_per_hour: node.list_price,
            cost_per_hour: node.price,
        });
    }
    for (resource, total) in allocatable.iter() {
        if total > 0 {
            out.utilization.insert(resource_type(resource), 100.0 * used.get(resource) as f64 / total as f64);
        }
    }
    out
}

/// The series one pass published, so that the next removes only those gone: a scrape between
/// two passes always sees every series (the families are never emptied).
#[derive(Debug, Default)]
pub struct Published {
    /// Per per-node family.
    nodes: Vec<HashSet<NodeSeries>>,
    /// Utilisation, then NodePool cost.
    cluster: Vec<HashSet<Labels>>,
    /// NodeClaims counted in `karpenter_nodepools_cost_tracker_errors_total` while their cost is
    /// unknown.
    uncosted: HashSet<String>,
    /// The labels of each node's series.
    labels: KnownLabels,
}

impl Published {
    /// The labels of the per-node series, by node name.
    pub fn labels(&self) -> &KnownLabels {
        &self.labels
    }
}

/// One pass over some gauge families: sets series, then retires those of the pass before that
/// were not set again.
pub(crate) struct Pass<'a, L> {
    families: Vec<&'a Family<L, Gauge<f64, AtomicU64>>>,
    set: Vec<HashSet<L>>,
}

impl<'a, L: Clone + Eq + Hash> Pass<'a, L> {
    /// A pass over `families`, which the `published` sets of [`Pass::retire`] follow in order.
    pub(crate) fn new(families: Vec<&'a Family<L, Gauge<f64, AtomicU64>>>) -> Self {
        let set = vec![HashSet::new(); families.len()];
        Pass { families, set }
    }

    /// Sets the series `labels` of the `family`-th family to `value`.
    pub(crate) fn set(&mut self, family: usize, labels: L, value: f64) {
        self.families[family].get_or_create(&labels).set(value);
        self.set[family].insert(labels);
    }

    /// Removes the series `published` (the last pass's) has and this pass did not set, and makes
    /// this pass's the published ones.
    pub(crate) fn retire(self, published: &mut Vec<HashSet<L>>) {
        for (i, before) in published.iter().enumerate() {
            for gone in before.difference(&self.set[i]) {
                self.families[i].remove(gone);
            }
        }
        *published = self.set;
    }
}

/// Sets the metrics to `readings`, then drops the series of nodes and NodePools no longer there.
pub fn record(m: &crate::metrics::Metrics, readings: &Readings, published: &mut Published) {
    let mut pass = Pass::new(vec![
        &m.nodes_allocatable,
        &m.nodes_total_pod_requests,
        &m.nodes_total_daemon_requests,
        &m.nodes_system_overhead,
        &m.nodes_total_pod_limits,
        &m.nodes_total_daemon_limits,
        &m.nodes_current_lifetime_seconds,
        &m.nodes_price_per_hour,
        &m.nodes_cost_per_hour,
    ]);
    for node in &readings.nodes {
        let series = |resource_type: Option<&String>| NodeSeries {
            node: node.labels.clone(),
            resource_type: resource_type.cloned(),
        };
        for (i, values) in [
            &node.allocatable,
            &node.pod_requests,
            &node.daemon_requests,
            &node.system_overhead,
            &node.pod_limits,
            &node.daemon_limits,
        ]
        .into_iter()
        .enumerate()
        {
            for (resource, value) in values {
                pass.set(i, series(Some(resource)), *value);
            }
        }
        if let Some(seconds) = node.lifetime_seconds {
            pass.set(6, series(None), seconds);
        }
        if let Some(price) = node.price_per_hour {
            pass.set(7, series(None), price);
        }
        if let Some(cost) = node.cost_per_hour {
            pass.set(8, series(None), cost);
        }
    }
    pass.retire(&mut published.nodes);
    published.labels = readings
        .nodes
        .iter()
        .filter_map(|n| {
            let name = n.labels.iter().find(|(k, _)| *k == "node_name")?.1.clone();
            Some((name, n.labels.clone()))
        })
        .collect();

    let mut pass = Pass::new(vec![&m.cluster_utilization_percent, &m.nodepools_cost_total]);
    for (resource, percent) in &readings.utilization {
        pass.set(0, vec![("resource_type", resource.clone())], *percent);
    }
    for (pool, cost) in &readings.nodepool_cost {
        pass.set(1, vec![("nodepool", pool.clone())], *cost);
    }
    pass.retire(&mut published.cluster);

    // A NodeClaim whose cost cannot be counted is one error, however many passes it lasts.
    let mut uncosted = HashSet::new();
    for (claim, pool) in &readings.uncosted {
        if !published.uncosted.contains(claim) {
            tracing::error!(controller = CONTROLLER, NodeClaim = %claim, NodePool = %pool, "failed to track the cost of the nodeclaim: its offering has no known price");
            m.nodepools_cost_tracker_errors.get_or_create(&vec![("nodepool", pool.clone())]).inc();
        }
        uncosted.insert(claim.clone());
    }
    published.uncosted = uncosted;
}

/// Runs until `stop` turns true: a pass every [`PERIOD`].
pub async fn run(ctx: Context, state: ClusterState, stop: watch::Receiver<bool>) {
    let published = std::sync::Mutex::new(Published::default());
    run_singleton(Options::new(CONTROLLER), Some(ctx.metrics.clone()), Timer, stop, || async {
        if state.is_synced() {
            let snapshot = crate::controllers::snapshot::with_instance_types_of_pools(
                state.snapshot(),
                ctx.cloud.as_ref(),
                CONTROLLER,
            )
            .await;
            let mut published = published.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            let mut readings = readings(&state_nodes(&snapshot), Timestamp::now(), published.labels());
            // The nodes of a NodePool whose types this pass did not resolve (a new one the
            // overlays have not been evaluated for yet, or one being deleted) are priced from
            // another pool's types, if at all: that is no error of the cost tracker.
            readings.uncosted.retain(|(_, pool)| snapshot.pool_types.contains_key(pool));
            record(&ctx.metrics, &readings, &mut published);
        }
        Ok::<_, std::convert::Infallible>(Next::After(PERIOD))
    })
    .await;
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::disruption::tests::{Cluster, NOW, consolidating, pool};

    #[test]
    fn nodes_utilisation_and_cost_are_read_off_the_state() -> Result<(), Box<dyn std::error::Error>> {
        let mut c = Cluster::new(vec![pool("p", consolidating("100%"), &["on-demand"])]);
        c.node("a", "p", "large", "on-demand", json!({}))
            .pod("w", "a", "1", json!({}))
            .node("b", "p", "small", "on-demand", json!({}))
            .pod("v", "b", "1", json!({}));
        let r = readings(&state_nodes(&c.snapshot()), NOW.parse()?, &KnownLabels::new());
        assert_eq!(r.nodes.len(), 2);
        let a = &r.nodes[0];
        assert!(a.labels.contains(&("node_name", "a".to_string())));
        assert!(a.labels.contains(&("instance_type", "large".to_string())));
        assert!(a.labels.contains(&("managed", "true".to_string())));
        // Upstream's label set: one per well-known label, empty when the node lacks it.
        assert_eq!(a.labels.len(), 3 + WELL_KNOWN_LABELS.len());
        assert!(a.labels.contains(&("zone", "z1".to_string())));
        assert!(a.labels.contains(&("instance_category", String::new())));
        assert!(a.labels.iter().any(|(k, _)| *k == "capacity_reservation_interruptible"));
        assert!(a.allocatable.contains(&("cpu".to_string(), 4.0)), "{:?}", a.allocatable);
        assert!(a.pod_requests.contains(&("cpu".to_string(), 1.0)), "{:?}", a.pod_requests);
        assert_eq!(a.price_per_hour, Some(0.40));
        // 2 of 6 vCPU requested.
        assert!((r.utilization["cpu"] - 100.0 / 3.0).abs() < 1e-9, "{:?}", r.utilization);
        assert!((r.nodepool_cost["p"] - 0.50).abs() < 1e-9, "{:?}", r.nodepool_cost);
        Ok(())
    }

    #[test]
    fn a_claim_without_a_price_is_one_cost_tracking_error() -> Result<(), Box<dyn std::error::Error>> {
        let m = crate::metrics::Metrics::unregistered();
        let mut c = Cluster::new(vec![pool("p", consolidating("100%"), &["on-demand"])]);
        // No instance type has the offering of "b" (a capacity type the catalog lacks).
        c.node("a", "p", "large", "on-demand", json!({})).node("b", "p", "large", "reserved", json!({}));
        let r = readings(&state_nodes(&c.snapshot()), NOW.parse()?, &KnownLabels::new());
        assert_eq!(r.uncosted.len(), 1, "{:?}", r.uncosted);
        assert_eq!(r.uncosted[0], ("b".to_string(), "p".to_string()));
        let errors =
            || m.nodepools_cost_tracker_errors.get_or_create(&vec![("nodepool", "p".to_string())]).get();
        let mut published = Published::default();
        record(&m, &r, &mut published);
        record(&m, &r, &mut published);
        assert_eq!(errors(), 1, "counted once while it lasts");
        record(&m, &Readings::default(), &mut published);
        record(&m, &r, &mut published);
        assert_eq!(errors(), 2, "and again when it comes back");
        Ok(())
    }

    #[test]
    fn series_of_nodes_gone_are_removed_and_the_rest_kept() -> Result<(), Box<dyn std::error::Error>> {
        let ctx_metrics = crate::metrics::Metrics::unregistered();
        let mut c = Cluster::new(vec![pool("p", consolidating("100%"), &["on-demand"])]);
        c.node("a", "p", "large", "on-demand", json!({})).node("b", "p", "small", "on-demand", json!({}));
        let both = readings(&state_nodes(&c.snapshot()), NOW.parse()?, &KnownLabels::new());
        let mut only_a = both.clone();
        only_a.nodes.retain(|n| n.labels.contains(&("node_name", "a".to_string())));
        let mut published = Published::default();
        record(&ctx_metrics, &both, &mut published);
        let labels_of = |name: &str| {
            let labels = both
                .nodes
                .iter()
                .find(|n| n.labels.contains(&("node_name", name.to_string())))
                .unwrap()
                .labels
                .clone();
            NodeSeries { node: labels, resource_type: None }
        };
        assert!(ctx_metrics.nodes_price_per_hour.remove(&labels_of("b")), "b published");
        ctx_metrics.nodes_price_per_hour.get_or_create(&labels_of("b")).set(0.1);
        record(&ctx_metrics, &only_a, &mut published);
        assert!(!ctx_metrics.nodes_price_per_hour.remove(&labels_of("b")), "b's series gone");
        assert!(ctx_metrics.nodes_price_per_hour.remove(&labels_of("a")), "a's series kept");
        Ok(())
    }

    #[test]
    fn a_pass_reuses_the_published_labels_of_a_node_that_kept_them() -> Result<(), Box<dyn std::error::Error>>
    {
        let m = crate::metrics::Metrics::unregistered();
        let mut c = Cluster::new(vec![pool("p", consolidating("100%"), &["on-demand"])]);
        c.node("a", "p", "large", "on-demand", json!({})).node("b", "p", "small", "on-demand", json!({}));
        let mut published = Published::default();
        let first = readings(&state_nodes(&c.snapshot()), NOW.parse()?, published.labels());
        record(&m, &first, &mut published);
        assert_eq!(published.labels().len(), 2);
        // "b" changes zone: it gets labels of its own; "a" shares the published ones.
        c.in_zone("b", "z2");
        let second = readings(&state_nodes(&c.snapshot()), NOW.parse()?, published.labels());
        let of = |r: &Readings, name: &str| {
            r.nodes
                .iter()
                .find(|n| n.labels.contains(&("node_name", name.to_string())))
                .map(|n| n.labels.clone())
        };
        let (a1, a2) = (of(&first, "a").ok_or("a first")?, of(&second, "a").ok_or("a then")?);
        let (b1, b2) = (of(&first, "b").ok_or("b first")?, of(&second, "b").ok_or("b then")?);
        assert!(Arc::ptr_eq(&a1, &a2), "a's labels are shared");
        assert!(!Arc::ptr_eq(&b1, &b2) && b1 != b2, "b's changed: {b2:?}");
        assert!(b2.contains(&("zone", "z2".to_string())));
        record(&m, &second, &mut published);
        assert!(Arc::ptr_eq(&published.labels()["b"], &b2), "the newly published labels are kept");
        Ok(())
    }

    #[test]
    fn limits_are_published_beside_requests() -> Result<(), Box<dyn std::error::Error>> {
        let object = serde_json::from_value(
            json!({"metadata": {"name": "n", "creationTimestamp": "2026-11-24T11:00:00Z"}}),
        )
        .unwrap();
        let node = StateNode {
            name: "n".into(),
            node: Some(Arc::new(object)),
            pod_requests: Resources::from_pairs([("cpu", 1000)]),
            pod_limits: Resources::from_pairs([("cpu", 2500), ("memory", 1 << 30)]),
            daemonset_limits: Resources::from_pairs([("cpu", 500)]),
            ..StateNode::default()
        };
        let r = readings(&[node], NOW.parse()?, &KnownLabels::new());
        let n = &r.nodes[0];
        assert_eq!(n.pod_limits, [("cpu".to_string(), 2.5), ("memory".to_string(), (1u64 << 30) as f64)]);
        assert_eq!(n.daemon_limits, [("cpu".to_string(), 0.5)]);
        assert_eq!(n.pod_requests, [("cpu".to_string(), 1.0)], "requests stay apart");
        let m = crate::metrics::Metrics::unregistered();
        let mut published = Published::default();
        record(&m, &r, &mut published);
        let cpu = NodeSeries { node: n.labels.clone(), resource_type: Some("cpu".into()) };
        assert_eq!(m.nodes_total_pod_limits.get(&cpu).map(|g| g.get()), Some(2.5));
        assert_eq!(m.nodes_total_daemon_limits.get(&cpu).map(|g| g.get()), Some(0.5));
        assert_eq!(m.nodes_total_pod_requests.get(&cpu).map(|g| g.get()), Some(1.0));
        record(&m, &Readings::default(), &mut published);
        assert!(m.nodes_total_pod_limits.get(&cpu).is_none(), "gone with the node");
        assert!(m.nodes_total_daemon_limits.get(&cpu).is_none());
        Ok(())
    }

    #[test]
    fn resource_types_are_spelled_as_upstream() {
        assert_eq!(resource_type("ephemeral-storage"), "ephemeral_storage");
        assert_eq!(resource_type("nvidia.com/gpu"), "nvidia.com/gpu");
        assert_eq!(resource_type("hugepages-2Mi"), "hugepages_2mi");
        assert_eq!(metric_value("cpu", 1500), 1.5);
        assert_eq!(metric_value("memory", 1 << 30), (1u64 << 30) as f64);
    }
}

//! The `karpenter` commands besides `controller`: offline, `karpenter simulate` over manifests
//! ([`simulate`]) and `karpenter convert` of v1beta1 manifests ([`convert`]); over a live cluster,
//! `karpenter explain` ([`explain`]), `karpenter simulate --from-cluster` ([`live`]) and
//! `karpenter top` ([`top`]).
//!
//! The live commands each take one snapshot of the cluster with the controller's own caches ([`ClusterState`]:
//! the same lists, the same trimming, a malformed Karpenter object skipped), adds the instance
//! types of a catalog (see [`Catalog`]) and runs the controller's pure decisions over it. What
//! only a running controller knows (the pods it nominated in the last seconds, the commands it
//! is carrying out) is not in such a snapshot.

pub mod cli;
pub mod convert;
pub mod explain;
pub mod live;
pub mod simulate;
pub mod top;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::reflector::Store;
use kube::{Client, ResourceExt};
use thiserror::Error;

use crate::apis::labels::LABEL_TOPOLOGY_ZONE;
use crate::apis::{CapacityBuffer, NodeOverlay};
use crate::cloudprovider::aws::nodecost::BurstableCpu;
use crate::cloudprovider::catalog::{Catalog, CatalogError};
use crate::scheduling::{InstanceType, Offering};
use crate::state::buffers::placements;
use crate::state::input::{Scenario, scheduling_input};
use crate::state::watches::{self, Source};
use crate::state::{BuffersPlaced, ClusterState, Snapshot};

/// How long the caches may take to list every kind once.
pub const SYNC_TIMEOUT: Duration = Duration::from_secs(60);
/// How long the first list of NodeOverlays and CapacityBuffers is waited for, once the rest is
/// listed.
const OVERLAYS_WAIT: Duration = Duration::from_secs(5);
/// How often the CapacityBuffers' chunks are resolved again when no buffer changed (a workload
/// scaled).
const BUFFERS_PERIOD: Duration = Duration::from_secs(10);

/// Errors of the live commands.
#[derive(Debug, Error)]
pub enum ToolError {
    /// No usable kubeconfig or in-cluster configuration.
    #[error("loading the kubeconfig")]
    Config(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// The API server did not answer.
    #[error("cannot reach the cluster at {server}")]
    Unreachable {
        /// The server's URL.
        server: String,
        /// What went wrong.
        source: kube::Error,
    },
    /// The caches did not list every kind in time (a Karpenter CRD missing, or no permission).
    #[error(
        "the cluster's objects could not all be listed within {0:?} (are the karpenter.sh and karpenter.k8s.aws CRDs installed, and may this user list nodes, pods and NodeClaims?)"
    )]
    NotSynced(Duration),
    /// The object asked about does not exist.
    #[error("{kind} {name:?} not found")]
    NotFound {
        /// Its kind.
        kind: &'static str,
        /// Its name (`namespace/name` for pods).
        name: String,
    },
    /// A bad argument.
    #[error("{0}")]
    Usage(String),
    /// The instance-type catalog cannot be loaded.
    #[error(transparent)]
    Catalog(#[from] CatalogError),
    /// A file given with `-f` cannot be used.
    #[error(transparent)]
    Simulate(#[from] crate::tools::simulate::SimulateError),
    /// The report could not be rendered.
    #[error("rendering the report: {0}")]
    Render(String),
}

/// Which cluster to look at: the kubeconfig as kubectl finds it (`KUBECONFIG`, then
/// `~/.kube/config`, then the in-cluster service account), optionally another context of it.
#[derive(Clone, Debug, Default, clap::Args)]
pub struct Target {
    /// The kubeconfig context to use (default: its current context).
    #[arg(long, global = true, value_name = "NAME")]
    pub context: Option<String>,
}

impl Target {
    /// A client for the target cluster, once the API server has answered.
    pub async fn client(&self) -> Result<Client, ToolError> {
        let config = match &self.context {
            None => kube::Config::infer().await.map_err(|e| ToolError::Config(Box::new(e)))?,
            Some(context) => {
                let options = KubeConfigOptions { context: Some(context.clone()), ..Default::default() };
                let kubeconfig = Kubeconfig::read().map_err(|e| ToolError::Config(Box::new(e)))?;
                kube::Config::from_custom_kubeconfig(kubeconfig, &options)
                    .await
                    .map_err(|e| ToolError::Config(Box::new(e)))?
            }
        };
        let server = config.cluster_url.to_string();
        let client = Client::try_from(config).map_err(|e| ToolError::Config(Box::new(e)))?;
        // Fail fast on a cluster that is not there, rather than waiting for the watches' retries.
        tokio::time::timeout(Duration::from_secs(10), client.apiserver_version())
            .await
            .map_err(|_| ToolError::Unreachable {
                server: server.clone(),
                source: kube::Error::Service(Box::new(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "no answer within 10s",
                ))),
            })?
            .map_err(|source| ToolError::Unreachable { server, source })?;
        Ok(client)
    }
}

/// One snapshot of the live cluster, listed by the controller's caches, with `catalog`'s
/// instance types for every NodePool.
pub async fn live_snapshot(
    client: Client,
    catalog: &Catalog,
    mode: BurstableCpu,
) -> Result<Snapshot, ToolError> {
    Ok(Live::start(client, catalog.load()?, mode).await?.snapshot())
}

/// The live cluster: the controller's caches, kept current by their watches (until dropped),
/// and the catalog's types for prices and launches.
pub struct Live {
    state: ClusterState,
    watches: tokio::task::JoinHandle<()>,
    types: Vec<Arc<InstanceType>>,
    overlays: Store<NodeOverlay>,
    /// The NodeOverlays' and CapacityBuffers' watches, and the buffers' resolution.
    extras: Vec<tokio::task::JoinHandle<()>>,
    /// How the NodePools plan burstable types (`BURSTABLE_CPU`).
    burstable_cpu: BurstableCpu,
}

impl Live {
    /// Starts the watches and waits until every kind is listed; the NodePools will plan
    /// burstable types as `burstable_cpu` says.
    pub async fn start(
        client: Client,
        types: Vec<Arc<InstanceType>>,
        burstable_cpu: BurstableCpu,
    ) -> Result<Self, ToolError> {
        // NodeOverlays and CapacityBuffers when the cluster has them (the CRD installed, the tool
        // allowed to list them); without, the catalog's figures and no headroom.
        let (overlays, overlay_driver, _) =
            watches::optional_cache("nodeoverlays", Source::Lenient(client.clone()), |_: &_| {});
        let changed = Arc::new(tokio::sync::Notify::new());
        let on_buffer = {
            let changed = changed.clone();
            move |_: &_| changed.notify_one()
        };
        let (buffers, buffer_driver, _) = watches::optional_cache::<CapacityBuffer, _>(
            "capacitybuffers",
            Source::Lenient(client.clone()),
            on_buffer,
        );
        let mut extras = vec![tokio::spawn(overlay_driver), tokio::spawn(buffer_driver)];
        let (state, driver) = ClusterState::start(client.clone());
        let watches = tokio::spawn(driver);
        if tokio::time::timeout(SYNC_TIMEOUT, state.wait_synced()).await.is_err() {
            watches.abort();
            extras.iter().for_each(|t| t.abort());
            return Err(ToolError::NotSynced(SYNC_TIMEOUT));
        }
        // A moment for their first lists; a cluster without them answers at once.
        let _ = tokio::time::timeout(OVERLAYS_WAIT, async {
            let _ = overlays.wait_until_ready().await;
            let _ = buffers.wait_until_ready().await;
        })
        .await;
        // The placeholders the controller keeps, resolved before the first snapshot and again
        // when a buffer changes or the period is up.
        place_holders(&client, &buffers, &state).await;
        let resolver = {
            let state = state.clone();
            async move {
                loop {
                    tokio::select! {
                        _ = changed.notified() => {}
                        _ = tokio::time::sleep(BUFFERS_PERIOD) => {}
                    }
                    place_holders(&client, &buffers, &state).await;
                }
            }
        };
        extras.push(tokio::spawn(resolver));
        Ok(Live { state, watches, types, overlays, extras, burstable_cpu })
    }

    /// The cluster now, with the catalog's types (in the cluster's zones) for every NodePool, as
    /// the cluster's NodeOverlays change them, and its CapacityBuffers' placeholders placed as
    /// the provisioner places them.
    pub fn snapshot(&self) -> Snapshot {
        let snapshot = self.state.snapshot();
        let zones = cluster_zones(&snapshot);
        let snapshot = with_catalog(snapshot, &in_zones(&self.types, &zones), self.burstable_cpu);
        with_buffers_placed(with_learned(with_overlays(snapshot, &self.overlays.state())))
    }
}

/// Hands `state` the placeholder pods of the CapacityBuffers the controller applies.
async fn place_holders(client: &Client, buffers: &Store<CapacityBuffer>, state: &ClusterState) {
    let mut live = BTreeSet::new();
    for buffer in buffers.state() {
        let key =
            format!("{}/{}", buffer.metadata.namespace.as_deref().unwrap_or_default(), buffer.name_any());
        let pods = crate::controllers::capacitybuffer::applied_placeholders(client, &buffer).await;
        live.insert(key.clone());
        state.set_virtual_pods(&key, pods);
    }
    state.retain_virtual_pods(&live);
}

/// The scheduler options the commands plan with: the controller's with its default settings
/// (kube-scheduler's built-in default spreads among them).
pub fn scheduler_options() -> crate::scheduling::SchedulerOptions {
    crate::controllers::Settings::default().scheduler_options()
}

/// The options the commands' disruption simulations use: the controller's with its default
/// settings (preferences yield to the remaining nodes).
pub fn disruption_options() -> crate::scheduling::SchedulerOptions {
    crate::controllers::Settings::default().disruption_options()
}

/// `snapshot` with its CapacityBuffers' placeholders placed as a provisioning pass places them
/// (after the pending pods): on which nodes they keep headroom, which need new capacity.
pub fn with_buffers_placed(mut snapshot: Snapshot) -> Snapshot {
    if snapshot.virtual_pods.is_empty() {
        return snapshot;
    }
    let nodes = crate::state::statenode::state_nodes(&snapshot);
    let scenario = Scenario {
        stand_ins: snapshot.virtual_pods.clone(),
        options: scheduler_options(),
        ..Scenario::default()
    };
    let built = scheduling_input(&snapshot, &nodes, snapshot.provisionable_pods(), &scenario);
    let results = crate::scheduling::schedule(&built.input);
    snapshot.buffers_placed = BuffersPlaced::new(placements(&built.input.pods, &results));
    snapshot
}

impl Drop for Live {
    fn drop(&mut self) {
        self.watches.abort();
        self.extras.iter().for_each(|t| t.abort());
    }
}

/// The zones the cluster uses: its nodes', its EC2NodeClasses' subnets', those its NodePools
/// require.
pub fn cluster_zones(snapshot: &Snapshot) -> BTreeSet<String> {
    let mut zones = BTreeSet::new();
    for node in &snapshot.nodes {
        if let Some(zone) = node.metadata.labels.as_ref().and_then(|l| l.get(LABEL_TOPOLOGY_ZONE)) {
            zones.insert(zone.clone());
        }
    }
    for class in &snapshot.nodeclasses {
        for subnet in class.status.iter().flat_map(|s| s.subnets.iter()) {
            zones.insert(subnet.zone.clone());
        }
    }
    for pool in &snapshot.nodepools {
        for r in pool.spec.template.spec.requirements.iter() {
            if r.key == LABEL_TOPOLOGY_ZONE && r.operator == crate::apis::Operator::In {
                zones.extend(r.values.iter().cloned());
            }
        }
    }
    zones
}

/// The catalog's types as offered in `zones`, when the catalog is of another region (the
/// built-in catalog is us-east-1's): each capacity type at its lowest price in the catalog.
/// Unchanged when `zones` is empty or the catalog offers them all already.
pub fn in_zones(types: &[Arc<InstanceType>], zones: &BTreeSet<String>) -> Vec<Arc<InstanceType>> {
    let offered: BTreeSet<&str> =
        types.iter().flat_map(|t| t.offerings.iter().map(|o| o.zone.as_str())).collect();
    if zones.is_empty() || zones.iter().all(|z| offered.contains(z.as_str())) {
        return types.to_vec();
    }
    types
        .iter()
        .map(|t| {
            let mut by_capacity: BTreeMap<&str, (f64, bool)> = BTreeMap::new();
            for o in &t.offerings {
                let entry = by_capacity.entry(o.capacity_type.as_str()).or_insert((f64::INFINITY, false));
                entry.0 = entry.0.min(o.price);
                entry.1 |= o.available;
            }
            let offerings = zones
                .iter()
                .flat_map(|zone| {
                    by_capacity.iter().map(move |(ct, (price, available))| {
                        Offering::new(zone.clone(), *ct, *price, *available)
                    })
                })
                .collect();
            Arc::new(t.with_offerings(offerings))
        })
        .collect()
}

/// `snapshot` with `types` as the instance types of every live NodePool whose node class can
/// launch nodes (the scheduler keeps those the NodePool's requirements allow), and all of them
/// known for prices, burstable types planned as `mode` says. A NodePool whose node class is
/// missing or not ready launches nothing, as in the controller, and says why.
pub fn with_catalog(snapshot: Snapshot, types: &[Arc<InstanceType>], mode: BurstableCpu) -> Snapshot {
    let mut pool_types = BTreeMap::new();
    let mut pool_errors = BTreeMap::new();
    for np in snapshot.live_nodepools() {
        let name = np.metadata.name.clone().unwrap_or_default();
        match snapshot.node_class_ready(np) {
            Ok(()) => {
                let class = snapshot.node_class_of(np);
                let reserved = with_reservations(types, class.and_then(|c| c.status.as_ref()));
                pool_types.insert(name, planned_for(&reserved, np, class, mode));
            }
            Err(problem) => {
                pool_errors.insert(name, problem.to_string());
            }
        }
    }
    let mut snapshot = snapshot.with_instance_types(pool_types);
    snapshot.pool_errors = pool_errors;
    // Prices of every node, whatever NodePools exist (one being deleted, or none).
    for t in types {
        snapshot.types_by_name.entry(t.name.clone()).or_insert_with(|| Arc::clone(t));
    }
    snapshot
}

/// The types the NodePool `np` plans with, as the aws provider gives them for its EC2NodeClass
/// `class`: priced with what comes with every node (its volumes; a public IPv4 address when the
/// class asks for one, since the commands do not see what its subnets give) and burstable types
/// planned as `mode` says (`BURSTABLE_CPU`). Without a class, `types` as they are.
pub fn planned_for(
    types: &[Arc<InstanceType>],
    np: &crate::apis::NodePool,
    class: Option<&crate::apis::EC2NodeClass>,
    mode: BurstableCpu,
) -> Vec<Arc<InstanceType>> {
    use crate::cloudprovider::aws::nodecost::{self, NodeCost};
    let Some(class) = class else { return types.to_vec() };
    let cost = NodeCost::of_class(&class.spec, false);
    let priced: Vec<Arc<InstanceType>> =
        types.iter().map(|t| Arc::new(nodecost::priced(t, &cost, mode))).collect();
    match crate::scheduling::Requirements::from_nodepool(&np.spec.template.spec.requirements) {
        Ok(pool) => nodecost::for_pool(&priced, &pool, mode),
        // The scheduler input refuses the pool with its own message.
        Err(_) => priced,
    }
}

/// `types` with the `reserved` offerings of the capacity reservations a class's `status` lists,
/// so that reserved nodes are priced as the controller prices them. How many instances each
/// reservation has left is not in the status: the tools plan no new reserved node.
pub fn with_reservations(
    types: &[Arc<InstanceType>],
    status: Option<&crate::apis::ec2nodeclass::EC2NodeClassStatus>,
) -> Vec<Arc<InstanceType>> {
    let Some(status) = status.filter(|s| !s.capacity_reservations.is_empty()) else { return types.to_vec() };
    let subnet_zones: BTreeSet<String> = status.subnets.iter().map(|s| s.zone.clone()).collect();
    types
        .iter()
        .map(|t| {
            let on_demand = t
                .offerings
                .iter()
                .filter(|o| o.capacity_type == crate::apis::labels::CAPACITY_TYPE_ON_DEMAND)
                .map(|o| o.price)
                .min_by(f64::total_cmp);
            let reserved = crate::cloudprovider::aws::reservations::offerings(
                &t.name,
                &status.capacity_reservations,
                &subnet_zones,
                on_demand,
                &|_| 0,
            );
            if reserved.is_empty() {
                return Arc::clone(t);
            }
            let mut offerings = t.offerings.clone();
            offerings.extend(reserved);
            Arc::new(t.with_offerings(offerings))
        })
        .collect()
}

/// `snapshot` with what each NodePool learned from its nodes (its
/// `karpenter-rs.dev/learned-resources` annotation) added to its instance types, as the
/// controller adds it.
pub fn with_learned(snapshot: Snapshot) -> Snapshot {
    let learned: BTreeMap<String, crate::scheduling::learned::Learned> = snapshot
        .nodepools
        .iter()
        .filter_map(|np| {
            let learned = crate::scheduling::learned::Learned::of_nodepool(np).ok()?;
            (!learned.is_empty()).then(|| (np.metadata.name.clone().unwrap_or_default(), learned))
        })
        .collect();
    if learned.is_empty() {
        return snapshot;
    }
    map_pool_types(snapshot, |pool, types| match learned.get(pool) {
        Some(l) => l.apply(types.clone()),
        None => types.clone(),
    })
}

/// `snapshot` with each NodePool's instance types replaced by `change` (pool, types); the types
/// of nodes keep their prices whatever NodePools exist, as `with_catalog` keeps them.
fn map_pool_types(
    snapshot: Snapshot,
    change: impl Fn(&str, &Vec<Arc<InstanceType>>) -> Vec<Arc<InstanceType>>,
) -> Snapshot {
    let pool_types: BTreeMap<String, Vec<Arc<InstanceType>>> =
        snapshot.pool_types.iter().map(|(pool, types)| (pool.clone(), change(pool, types))).collect();
    let by_name = snapshot.types_by_name.clone();
    let mut snapshot = snapshot.with_instance_types(pool_types);
    for (name, t) in by_name {
        snapshot.types_by_name.entry(name).or_insert(t);
    }
    snapshot
}

/// `snapshot` with its NodePools' instance types changed by `overlays`: those the controller has
/// evaluated and applies (`Ready=True`; the controller writes no condition without its
/// `NodeOverlay` gate, so a cluster that does not use them is priced with the catalog).
pub fn with_overlays(snapshot: Snapshot, overlays: &[Arc<NodeOverlay>]) -> Snapshot {
    let applied: Vec<&NodeOverlay> = overlays
        .iter()
        .map(AsRef::as_ref)
        .filter(|o| {
            o.status.as_ref().is_some_and(|s| {
                crate::apis::common::is_true(&s.conditions, crate::controllers::nodeoverlay::READY)
            })
        })
        .collect();
    if applied.is_empty() {
        return snapshot;
    }
    let evaluation = crate::scheduling::overlay::evaluate_nodepools(
        applied,
        snapshot.nodepools.iter().filter_map(|np| {
            let types = snapshot.pool_types.get(np.metadata.name.as_deref().unwrap_or_default())?;
            Some((np.as_ref(), types.as_slice()))
        }),
    );
    map_pool_types(snapshot, |pool, types| {
        evaluation.store.apply(pool, types.clone()).unwrap_or_else(|_| types.clone())
    })
}

/// Renders `value` as JSON or YAML.
pub fn render_data<T: serde::Serialize>(
    value: &T,
    format: crate::tools::simulate::OutputFormat,
) -> Result<String, ToolError> {
    match format {
        crate::tools::simulate::OutputFormat::Json => serde_json::to_string_pretty(value)
            .map(|s| s + "\n")
            .map_err(|e| ToolError::Render(e.to_string())),
        _ => serde_saphyr::to_string(value).map_err(|e| ToolError::Render(e.to_string())),
    }
}

/// `$0.0416/h` style.
pub fn price(p: Option<f64>) -> String {
    p.map(|p| format!("${p:.4}/h")).unwrap_or_else(|| "price unknown".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apis::labels::{LABEL_CAPACITY_TYPE, LABEL_INSTANCE_TYPE};
    use crate::disruption::tests::catalog;

    #[test]
    fn a_catalog_of_another_region_is_offered_in_the_clusters_zones_at_its_prices() {
        let types = catalog();
        assert_eq!(in_zones(&types, &["z1".to_string()].into()), types, "its own zone: unchanged");
        assert_eq!(in_zones(&types, &BTreeSet::new()), types, "no zone known: unchanged");
        let zones: BTreeSet<String> = ["us-west-2a".to_string(), "us-west-2b".to_string()].into();
        let moved = in_zones(&types, &zones);
        let small = moved.iter().find(|t| t.name == "small").unwrap();
        assert_eq!(small.offerings.len(), 4, "{:?}", small.offerings);
        for o in &small.offerings {
            assert!(zones.contains(&o.zone));
            let price = if o.capacity_type == "spot" { 0.05 } else { 0.10 };
            assert_eq!(o.price, price);
        }
        let zone_req = small.requirements.get(LABEL_TOPOLOGY_ZONE).unwrap();
        assert!(zone_req.has("us-west-2a") && !zone_req.has("z1"));
        assert!(small.requirements.get(LABEL_INSTANCE_TYPE).unwrap().has("small"));
    }

    #[test]
    fn the_tools_price_with_the_overlays_the_controller_applies() {
        let pool: crate::apis::NodePool = serde_json::from_value(serde_json::json!({
            "apiVersion": "karpenter.sh/v1", "kind": "NodePool", "metadata": {"name": "default"},
            "spec": {"template": {"spec": {"requirements": [],
                "nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "c"}}}}}))
        .unwrap();
        let overlay = |name: &str, ready: &str| -> Arc<NodeOverlay> {
            Arc::new(
                serde_json::from_value(serde_json::json!({
                    "apiVersion": "karpenter.sh/v1alpha1", "kind": "NodeOverlay", "metadata": {"name": name},
                    "spec": {"requirements": [{"key": "node.kubernetes.io/instance-type", "operator": "In", "values": ["small"]}],
                        "price": if ready == "True" { "0.01" } else { "9" }},
                    "status": {"conditions": [{"type": "Ready", "status": ready, "reason": "R", "message": "",
                        "lastTransitionTime": "2026-11-27T00:00:00Z"}]}}))
                .unwrap(),
            )
        };
        let snapshot = Snapshot { nodepools: vec![Arc::new(pool)], ..Snapshot::default() }
            .with_instance_types([("default".to_string(), catalog())].into());
        let priced = |s: &Snapshot| {
            s.pool_types["default"].iter().find(|t| t.name == "small").unwrap().offerings[0].price
        };
        let before = priced(&snapshot);
        let ignored = with_overlays(snapshot.clone(), &[overlay("pending", "False")]);
        assert_eq!(priced(&ignored), before, "an overlay the controller does not apply is left out");
        let applied = with_overlays(snapshot, &[overlay("applied", "True"), overlay("pending", "False")]);
        assert_eq!(priced(&applied), 0.01);
        assert!(applied.types_by_name.contains_key("small"));
    }

    #[test]
    fn the_tools_plan_with_what_the_nodepools_learned() {
        let pool: crate::apis::NodePool = serde_json::from_value(serde_json::json!({
            "apiVersion": "karpenter.sh/v1", "kind": "NodePool",
            "metadata": {"name": "default", "annotations": {
                "karpenter-rs.dev/learned-resources": r#"{"small":{"example.com/fuse":"20"}}"#}},
            "spec": {"template": {"spec": {"requirements": [],
                "nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "c"}}}}}))
        .unwrap();
        let snapshot = Snapshot { nodepools: vec![Arc::new(pool)], ..Snapshot::default() }
            .with_instance_types([("default".to_string(), catalog())].into());
        let fuse = |s: &Snapshot, name: &str| {
            s.pool_types["default"]
                .iter()
                .find(|t| t.name == name)
                .unwrap()
                .allocatable()
                .get("example.com/fuse")
        };
        assert_eq!(fuse(&snapshot, "small"), 0);
        let learned = with_learned(snapshot);
        assert_eq!(fuse(&learned, "small"), 20);
        assert_eq!(fuse(&learned, "large"), 0, "only the type that learned it");
    }

    #[test]
    fn reserved_nodes_are_priced_with_their_reservation_and_none_is_planned() {
        let status: crate::apis::ec2nodeclass::EC2NodeClassStatus =
            serde_json::from_value(serde_json::json!({
            "subnets": [{"id": "subnet-1", "zone": "z1"}],
            "capacityReservations": [{"id": "cr-1", "availabilityZone": "z1", "instanceType": "small",
                "ownerID": "123456789012", "instanceMatchCriteria": "targeted", "reservationType": "default",
                "state": "active"}]}))
            .unwrap();
        let types = with_reservations(&catalog(), Some(&status));
        let small = types.iter().find(|t| t.name == "small").unwrap();
        let reserved = small.offerings.iter().find(|o| o.capacity_type == "reserved").unwrap();
        assert_eq!(reserved.reservation_id(), Some("cr-1"));
        assert!(!reserved.available, "what is left of it is not known here");
        assert!(reserved.price > 0.0 && reserved.price < 0.0001, "{}", reserved.price);
        assert!(small.requirements.get(LABEL_CAPACITY_TYPE).unwrap().has("reserved"));
        let others = types.iter().filter(|t| t.name != "small");
        assert!(others.flat_map(|t| &t.offerings).all(|o| o.reservation.is_none()));
        assert_eq!(with_reservations(&catalog(), None), catalog());
    }
}

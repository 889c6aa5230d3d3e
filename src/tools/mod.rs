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

use kube::Client;
use kube::config::{KubeConfigOptions, Kubeconfig};
use thiserror::Error;

use crate::apis::labels::{LABEL_CAPACITY_TYPE, LABEL_INSTANCE_TYPE, LABEL_TOPOLOGY_ZONE};
use crate::cloudprovider::catalog::{Catalog, CatalogError};
use crate::scheduling::{InstanceType, Offering};
use crate::state::{ClusterState, Snapshot};

/// How long the caches may take to list every kind once.
pub const SYNC_TIMEOUT: Duration = Duration::from_secs(60);

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
pub async fn live_snapshot(client: Client, catalog: &Catalog) -> Result<Snapshot, ToolError> {
    Ok(Live::start(client, catalog.load()?).await?.snapshot())
}

/// The live cluster: the controller's caches, kept current by their watches (until dropped),
/// and the catalog's types for prices and launches.
pub struct Live {
    state: ClusterState,
    watches: tokio::task::JoinHandle<()>,
    types: Vec<Arc<InstanceType>>,
}

impl Live {
    /// Starts the watches and waits until every kind is listed.
    pub async fn start(client: Client, types: Vec<Arc<InstanceType>>) -> Result<Self, ToolError> {
        let (state, driver) = ClusterState::start(client);
        let watches = tokio::spawn(driver);
        if tokio::time::timeout(SYNC_TIMEOUT, state.wait_synced()).await.is_err() {
            watches.abort();
            return Err(ToolError::NotSynced(SYNC_TIMEOUT));
        }
        Ok(Live { state, watches, types })
    }

    /// The cluster now, with the catalog's types (in the cluster's zones) for every NodePool.
    pub fn snapshot(&self) -> Snapshot {
        let snapshot = self.state.snapshot();
        let zones = cluster_zones(&snapshot);
        with_catalog(snapshot, &in_zones(&self.types, &zones))
    }
}

impl Drop for Live {
    fn drop(&mut self) {
        self.watches.abort();
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
                    by_capacity.iter().map(move |(ct, (price, available))| Offering {
                        zone: zone.clone(),
                        capacity_type: (*ct).to_string(),
                        price: *price,
                        available: *available,
                    })
                })
                .collect();
            let mut requirements = t.requirements.clone();
            requirements.remove(LABEL_TOPOLOGY_ZONE);
            requirements.remove(LABEL_CAPACITY_TYPE);
            requirements.remove(LABEL_INSTANCE_TYPE);
            Arc::new(InstanceType::new(
                t.name.clone(),
                requirements,
                t.capacity.clone(),
                t.overhead.clone(),
                offerings,
            ))
        })
        .collect()
}

/// `snapshot` with `types` as the instance types of every live NodePool whose node class can
/// launch nodes (the scheduler keeps those the NodePool's requirements allow), and all of them
/// known for prices. A NodePool whose node class is missing or not ready launches nothing, as
/// in the controller, and says why.
pub fn with_catalog(snapshot: Snapshot, types: &[Arc<InstanceType>]) -> Snapshot {
    let mut pool_types = BTreeMap::new();
    let mut pool_errors = BTreeMap::new();
    for np in snapshot.live_nodepools() {
        let name = np.metadata.name.clone().unwrap_or_default();
        match snapshot.node_class_ready(np) {
            Ok(()) => {
                pool_types.insert(name, types.to_vec());
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
}

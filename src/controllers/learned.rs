//! Learned-resources controller (`learnedresources.controller`, on unless
//! `LEARN_EXTENDED_RESOURCES=false`): teaches each NodePool's instance types the extended
//! resources their registered nodes report and the types lack, as
//! [`crate::scheduling::learned`] decides, keeps what each NodePool learned in its
//! `karpenter-rs.dev/learned-resources` annotation, and hands it to the launches through the
//! [`LearnedStore`]. Decisions read the annotation from the NodePool they plan with, so a pod
//! that requests a learned resource is provisioned for once the NodePool's watch brings it.
//!
//! It runs when a Node, a NodePool or the NodeOverlays' evaluation changes. A node counts once it
//! is registered; its type is compared with the NodePool's instance types as the NodeOverlays
//! leave them, so that an overlay that gives a type the resource wins over what nodes report.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use kube::api::{Patch, PatchParams};
use kube::{Api, ResourceExt};
use tokio::sync::watch;

use crate::apis::NodePool;
use crate::apis::labels::{LABEL_INSTANCE_TYPE, LABEL_NODEPOOL, LABEL_REGISTERED};
use crate::cloudprovider::overlay::LearnedStore;
use crate::cloudprovider::{CloudProvider, CloudProviderError};
use crate::controllers::Context;
use crate::controllers::kit::{Coalesced, Next, Options, run_singleton};
use crate::scheduling::InstanceType;
use crate::scheduling::learned::{ANNOTATION_LEARNED_RESOURCES, Learned, fold_taught, is_learnable, taught};
use crate::scheduling::resources::Resources;
use crate::state::{ClusterState, Interest};
use crate::util::error_chain;

/// Name of the controller, in logs and metrics.
pub const CONTROLLER: &str = "learnedresources.controller";
/// Changes within this time of each other are handled in one pass.
const SETTLE: Duration = Duration::from_secs(1);
/// The event on a NodePool whose instance types learned a resource.
pub const REASON_LEARNED: &str = "LearnedExtendedResources";
/// The event on a NodePool whose annotation cannot be read.
pub const REASON_UNREADABLE: &str = "LearnedExtendedResourcesUnreadable";

/// Why a pass failed (retried with backoff).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A NodePool's instance types could not be resolved.
    #[error("listing instance types for nodepool {pool}")]
    InstanceTypes {
        /// The NodePool.
        pool: String,
        /// Why.
        #[source]
        source: CloudProviderError,
    },
    /// A NodePool's annotation could not be written.
    #[error("writing the learned resources of nodepool {pool}")]
    Write {
        /// The NodePool.
        pool: String,
        /// Why.
        #[source]
        source: kube::Error,
    },
}

/// Runs until `stop` turns true. `cloud` is the provider with the NodeOverlays but without what
/// was learned.
pub async fn run(
    ctx: Context,
    cloud: Arc<dyn CloudProvider>,
    learned: Arc<LearnedStore>,
    state: ClusterState,
    stop: watch::Receiver<bool>,
) {
    let interest = Interest { nodes: true, nodepools: true, overlays: true, ..Interest::default() };
    let wake = Coalesced { changes: state.feed().subscribe(interest), settle: SETTLE };
    let reported = std::sync::Mutex::new(BTreeSet::new());
    // What the NodePools learned before, for the launches, before the provisioner's first batch.
    let before: BTreeMap<String, Learned> = state
        .all_nodepools()
        .iter()
        .filter_map(|np| Some((np.name_any(), Learned::of_nodepool(np).ok().filter(|l| !l.is_empty())?)))
        .collect();
    learned.replace(before);
    run_singleton(Options::new(CONTROLLER), Some(ctx.metrics.clone()), wake, stop, || {
        pass(&ctx, cloud.as_ref(), &learned, &state, &reported)
    })
    .await;
}

async fn pass(
    ctx: &Context,
    cloud: &dyn CloudProvider,
    store: &LearnedStore,
    state: &ClusterState,
    reported: &std::sync::Mutex<BTreeSet<(String, String)>>,
) -> Result<Next, Error> {
    // Only the Nodes and NodePools: no snapshot of the whole cluster at every node change.
    let nodepools = state.all_nodepools();
    let pools: BTreeMap<String, &Arc<NodePool>> = nodepools
        .iter()
        .filter(|np| np.metadata.deletion_timestamp.is_none())
        .map(|np| (np.name_any(), np))
        .collect();
    let mut types: BTreeMap<String, HashMap<String, Arc<InstanceType>>> = BTreeMap::new();
    let mut now: BTreeMap<String, BTreeMap<String, BTreeMap<String, i64>>> = BTreeMap::new();
    let mut failed = None;
    for node in &state.all_nodes() {
        let labels = node.labels();
        let (Some(pool), Some(type_name)) = (labels.get(LABEL_NODEPOOL), labels.get(LABEL_INSTANCE_TYPE))
        else {
            continue;
        };
        if labels.get(LABEL_REGISTERED).map(String::as_str) != Some("true") {
            continue;
        }
        let Some(status) = &node.status else { continue };
        // Most nodes report nothing to learn: their quantities are not even read.
        if !status.capacity.as_ref().is_some_and(|c| c.keys().any(|name| is_learnable(name))) {
            continue;
        }
        let list = |l: &Option<_>| l.as_ref().map(Resources::from_list).transpose().ok().flatten();
        let (Some(capacity), Some(allocatable)) = (list(&status.capacity), list(&status.allocatable)) else {
            continue;
        };
        if !capacity.iter().any(|(name, amount)| amount > 0 && is_learnable(name)) {
            continue;
        }
        let Some(np) = pools.get(pool) else { continue };
        if !types.contains_key(pool) {
            match cloud.instance_types(np).await {
                Ok(resolved) => {
                    types.insert(pool.clone(), resolved.into_iter().map(|t| (t.name.clone(), t)).collect());
                }
                Err(source) => {
                    tracing::error!(controller = CONTROLLER, NodePool = %pool, error = %error_chain(&source), "listing instance types for nodepool");
                    failed.get_or_insert(Error::InstanceTypes { pool: pool.clone(), source });
                    types.insert(pool.clone(), HashMap::new());
                    continue;
                }
            }
        }
        let Some(it) = types.get(pool).and_then(|ts| ts.get(type_name)) else {
            continue;
        };
        fold_taught(now.entry(pool.clone()).or_default(), type_name, taught(&capacity, &allocatable, it));
    }

    let nothing = BTreeMap::new();
    let mut learned = BTreeMap::new();
    for (name, np) in &pools {
        let current = match Learned::of_nodepool(np) {
            Ok(current) => Some(current),
            Err(problem) => {
                report_unreadable(ctx, np, &problem.to_string(), reported).await;
                None
            }
        };
        let desired = current.clone().unwrap_or_default().desired(now.get(name).unwrap_or(&nothing));
        if current.as_ref() != Some(&desired) && !desired.is_empty() {
            if let Err(source) = write(ctx, np, &desired).await {
                failed.get_or_insert(Error::Write { pool: name.clone(), source });
            } else {
                let what = describe_change(current.as_ref(), &desired);
                tracing::info!(controller = CONTROLLER, NodePool = %name, learned = %what, "learned extended resources from nodes");
                ctx.events
                    .normal(np.as_ref(), REASON_LEARNED, format!("Learned from its nodes: {what}"))
                    .await;
            }
        }
        if !desired.is_empty() {
            learned.insert(name.clone(), desired);
        }
    }
    // Launches see what the decisions see (and, before the NodePool's watch brings the
    // annotation back, what was just written).
    store.replace(learned);
    match failed {
        Some(error) => Err(error),
        None => Ok(Next::Wait),
    }
}

/// Writes `learned` to `np`'s annotation, conditional on the version the pass read.
async fn write(ctx: &Context, np: &NodePool, learned: &Learned) -> Result<(), kube::Error> {
    let api: Api<NodePool> = Api::all(ctx.client.clone());
    let patch = serde_json::json!({
        "metadata": {
            "resourceVersion": np.metadata.resource_version,
            "annotations": { ANNOTATION_LEARNED_RESOURCES: learned.to_annotation() },
        }
    });
    api.patch(&np.name_any(), &PatchParams::default(), &Patch::Merge(&patch)).await.map(|_| ())
}

/// Tells once per NodePool and text that its annotation cannot be read (it is then replaced by
/// what its nodes teach, if they teach anything).
async fn report_unreadable(
    ctx: &Context,
    np: &NodePool,
    problem: &str,
    reported: &std::sync::Mutex<BTreeSet<(String, String)>>,
) {
    let text = np
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ANNOTATION_LEARNED_RESOURCES))
        .cloned()
        .unwrap_or_default();
    let first =
        reported.lock().unwrap_or_else(std::sync::PoisonError::into_inner).insert((np.name_any(), text));
    if first {
        tracing::warn!(controller = CONTROLLER, NodePool = %np.name_any(), error = %problem, "ignoring unreadable learned extended resources");
        ctx.events.warning(np, REASON_UNREADABLE, problem.to_string()).await;
    }
}

/// `type: resource=amount, ...` for what `desired` adds to or changes in `current`.
fn describe_change(current: Option<&Learned>, desired: &Learned) -> String {
    let mut parts = Vec::new();
    for (it, resources) in desired.iter() {
        let before = current.and_then(|c| c.of_type(it));
        let changed: Vec<String> = resources
            .iter()
            .filter(|(r, v)| before.and_then(|b| b.get(*r)) != Some(*v))
            .map(|(r, v)| format!("{r}={}", crate::scheduling::resources::format_quantity(r, *v)))
            .collect();
        if !changed.is_empty() {
            parts.push(format!("{it}: {}", changed.join(", ")));
        }
    }
    parts.join("; ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_change_names_each_type_and_what_it_learned() {
        let before = Learned::parse(r#"{"m5.large":{"example.com/fuse":"4"}}"#).unwrap();
        let after = Learned::parse(
            r#"{"m5.large":{"example.com/fuse":"4","hugepages-2Mi":"1Gi"},"c5.large":{"example.com/fuse":"8"}}"#,
        )
        .unwrap();
        assert_eq!(
            describe_change(Some(&before), &after),
            "c5.large: example.com/fuse=8; m5.large: hugepages-2Mi=1Gi"
        );
        assert_eq!(describe_change(None, &before), "m5.large: example.com/fuse=4");
    }
}

//! Static NodePools (`StaticCapacity` gate): keeps each NodePool with `spec.replicas` at exactly
//! that many NodeClaims, whatever the pods (`static.provisioning` makes them, `static.deprovisioning`
//! removes them, as upstream's two controllers; [`crate::disruption::static_capacity`] decides).
//! A drifted node of such a pool is replaced one for one by the disruption controller.
//!
//! The cache may lag behind this controller's own writes: the claims it created or deleted count
//! as what they will be until the cache shows them (or [`UNSEEN_FOR`] passes), so a pass right
//! after another never makes or removes the same claims twice.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, PostParams};
use kube::{Api, ResourceExt};
use tokio::sync::watch;

use crate::apis::common::is_true;
use crate::apis::{NodeClaim, NodePool};
use crate::controllers::Context;
use crate::controllers::events::EventType;
use crate::controllers::kit::{Coalesced, Next, Options, run_singleton};
use crate::controllers::provisioning::template;
use crate::disruption::static_capacity::{Action, Unseen, counts, plan};
use crate::scheduling::NodePoolInput;
use crate::state::statenode::state_nodes;
use crate::state::{ClusterState, Interest};
use crate::util::error_chain;

/// Name of the controller that makes NodeClaims, in logs and metrics.
pub const CONTROLLER: &str = "static.provisioning";
/// Name under which removals are logged, as upstream's controller that makes them.
pub const DEPROVISIONING: &str = "static.deprovisioning";
/// How often the pools are looked at when nothing changes.
const PERIOD: Duration = Duration::from_secs(60);
/// Changes within this time of each other are handled in one pass.
const SETTLE: Duration = Duration::from_millis(500);
/// How long a claim this controller wrote is counted as it will be, if the cache never shows it.
const UNSEEN_FOR: Duration = Duration::from_secs(120);
/// How often a static NodePool whose replicas exceed its node limit is told so.
const LIMIT_EVENT_EVERY: k8s_openapi::jiff::SignedDuration = k8s_openapi::jiff::SignedDuration::from_hours(1);

/// Claims written by this controller that the cache may not show yet.
#[derive(Default)]
struct Written {
    created: BTreeMap<String, Instant>,
    deleted: BTreeMap<String, Instant>,
}

impl Written {
    /// Forgets what the cache now shows (created claims it has, deleted claims it marks or lost)
    /// and what is older than [`UNSEEN_FOR`].
    fn settle(&mut self, claims: &[std::sync::Arc<NodeClaim>]) {
        let by_name: BTreeMap<String, &NodeClaim> =
            claims.iter().map(|c| (c.name_any(), c.as_ref())).collect();
        let now = Instant::now();
        self.created.retain(|name, at| !by_name.contains_key(name) && now.duration_since(*at) < UNSEEN_FOR);
        self.deleted.retain(|name, at| {
            by_name.get(name).is_some_and(|c| c.metadata.deletion_timestamp.is_none())
                && now.duration_since(*at) < UNSEEN_FOR
        });
    }
}

/// Runs until `stop` turns true: a pass at start, after changes of NodePools, NodeClaims and
/// Nodes (a burst makes one pass), and every [`PERIOD`].
pub async fn run(ctx: Context, state: ClusterState, stop: watch::Receiver<bool>) {
    let interest = Interest {
        nodepools: true,
        nodeclaims: true,
        nodeclaim_deletions: true,
        nodes: true,
        node_deletions: true,
        ..Interest::default()
    };
    let changes = Coalesced { changes: state.feed().subscribe(interest), settle: SETTLE };
    let written = tokio::sync::Mutex::new(Written::default());
    run_singleton(Options::new(CONTROLLER), Some(ctx.metrics.clone()), changes, stop, || async {
        let mut written = written.lock().await;
        reconcile(&ctx, &state, &mut written).await;
        Ok::<_, std::convert::Infallible>(Next::After(PERIOD))
    })
    .await;
}

async fn reconcile(ctx: &Context, state: &ClusterState, written: &mut Written) {
    if !state.is_synced() {
        return;
    }
    let snapshot = state.snapshot();
    written.settle(&snapshot.nodeclaims);
    let nodes = state_nodes(&snapshot);
    let now = Timestamp::now();
    for pool in snapshot.live_nodepools().filter(|p| p.is_static()) {
        let created: BTreeSet<String> = written.created.keys().cloned().collect();
        let deleted: BTreeSet<String> = written.deleted.keys().cloned().collect();
        let unseen = Unseen { created: &created, deleted: &deleted };
        let name = pool.name_any();
        let desired = pool.spec.replicas.unwrap_or(0);
        let current = counts(&name, &nodes, &unseen).running;
        match plan(pool, &nodes, &unseen, now) {
            Action::Hold => {}
            // As upstream: a pool that is not Ready makes nothing (its class may not launch).
            Action::Create(_) | Action::LimitReached if !is_ready(pool) => {}
            Action::LimitReached => {
                tracing::info!(controller = CONTROLLER, NodePool = %name, "nodepool node limit reached");
                let message =
                    format!("replicas ({desired}) is above what limits.nodes allows; {current} running");
                ctx.events
                    .deduped(
                        pool.as_ref(),
                        EventType::Warning,
                        "NodeLimitReached",
                        "",
                        LIMIT_EVENT_EVERY,
                        message,
                    )
                    .await;
            }
            Action::Create(count) => {
                tracing::info!(controller = CONTROLLER, NodePool = %name, current, desired, "provision-count" = count, "provisioning nodeclaims to satisfy replica count");
                for made in create(ctx, pool, count).await {
                    written.created.insert(made, Instant::now());
                }
            }
            Action::Delete(claims) => {
                tracing::info!(controller = DEPROVISIONING, NodePool = %name, current, desired, "deprovision-count" = claims.len(), "deprovisioning nodeclaims to satisfy replica count");
                for claim in claims {
                    if delete(ctx, &claim).await {
                        written.deleted.insert(claim, Instant::now());
                    }
                }
            }
        }
    }
}

fn is_ready(pool: &NodePool) -> bool {
    pool.status.as_ref().is_some_and(|s| is_true(&s.conditions, super::status::READY))
}

/// Creates `count` NodeClaims of `pool`'s template; the names of those created.
async fn create(ctx: &Context, pool: &NodePool, count: i64) -> Vec<String> {
    let name = pool.name_any();
    let input = match NodePoolInput::from_nodepool(pool, Vec::new(), &Default::default()) {
        Ok(input) => input,
        Err(error) => {
            tracing::error!(controller = CONTROLLER, NodePool = %name, error = %error_chain(&error), "building the nodeclaim of a static nodepool");
            return Vec::new();
        }
    };
    let new = input.static_claim();
    let api: Api<NodeClaim> = Api::all(ctx.client.clone());
    let mut made = Vec::new();
    for _ in 0..count {
        match api.create(&PostParams::default(), &template::build(&new, pool)).await {
            Ok(claim) => {
                let claim_name = claim.name_any();
                tracing::info!(controller = CONTROLLER, NodePool = %name, NodeClaim = %claim_name, "created nodeclaim");
                ctx.metrics
                    .nodeclaims_created
                    .get_or_create(&vec![
                        ("reason", "provisioned".to_string()),
                        ("nodepool", name.clone()),
                        ("min_values_relaxed", "false".to_string()),
                    ])
                    .inc();
                made.push(claim_name);
            }
            Err(error) => {
                tracing::error!(controller = CONTROLLER, NodePool = %name, error = %error_chain(&error), "creating nodeclaim");
                break;
            }
        }
    }
    made
}

/// Deletes the NodeClaim `name` (its termination drains the node); whether it is going.
async fn delete(ctx: &Context, name: &str) -> bool {
    let api: Api<NodeClaim> = Api::all(ctx.client.clone());
    match api.delete(name, &DeleteParams::default()).await {
        Ok(_) => {
            tracing::debug!(controller = DEPROVISIONING, NodeClaim = %name, "deleting nodeclaim");
            true
        }
        Err(error) if crate::util::api::is_not_found(&error) => true,
        Err(error) => {
            tracing::error!(controller = DEPROVISIONING, NodeClaim = %name, error = %error_chain(&error), "deleting nodeclaim");
            false
        }
    }
}

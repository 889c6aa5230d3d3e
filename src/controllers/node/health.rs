//! Node repair (`node.health`, behind the `NodeRepair` feature gate, off by default as upstream):
//! a node whose unhealthy condition (the cloud provider's repair policies, e.g. `Ready=False` for
//! 30 minutes) has outlasted its toleration has its NodeClaim deleted, forcefully: the claim's
//! termination deadline is set to now, so its pods go without waiting for PodDisruptionBudgets
//! or `karpenter.sh/do-not-disrupt`, and no budget is asked. The provisioner replaces the pods on
//! new capacity. Refused, with a `NodeRepairBlocked` warning, while more than 20 % of the
//! NodePool's nodes (or the cluster's, for a NodeClaim without a NodePool) are unhealthy.
//!
//! The decision is [`crate::disruption::repair::decide`]; this controller is a singleton pass over
//! the cached Nodes and their NodeClaims, woken by their changes and when the next unhealthy node
//! becomes due.

use std::time::Duration;

use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::ResourceExt;
use tokio::sync::watch;

use crate::apis::labels::{LABEL_CAPACITY_TYPE, LABEL_NODEPOOL};
use crate::controllers::events::{EventType, reasons};
use crate::controllers::kit::count_disrupted;
use crate::controllers::kit::{Coalesced, Next, Options, run_singleton};
use crate::controllers::{Context, nodeclaim};
use crate::disruption::repair::RepairPolicy;
use crate::disruption::repair::{self, Blocked, Repair, Scope, Subject};
use crate::state::{ClusterState, Interest};
use crate::util::error_chain;

/// Name of the controller, in logs and metrics.
pub const CONTROLLER: &str = "node.health";
/// The `reason` of `karpenter_nodeclaims_disrupted_total` for a repaired claim.
pub const REASON: &str = "unhealthy";
/// Changes within this time of each other are handled in one pass.
const COALESCE: Duration = Duration::from_secs(2);
/// Longest wait between passes.
const PERIOD: Duration = Duration::from_secs(300);
/// How soon a refused repair is looked at again (nodes may have recovered meanwhile).
const BLOCKED_RECHECK: Duration = Duration::from_secs(60);
/// A blocked node is told about at most once in this window, as upstream.
const BLOCKED_EVENT_WINDOW: SignedDuration = SignedDuration::from_mins(15);

/// Whether node repair runs: the gate is on and the provider has repair policies.
pub fn enabled(ctx: &Context) -> bool {
    ctx.settings.feature_gates.node_repair && !ctx.cloud.repair_policies().is_empty()
}

/// Runs until `stop` turns true.
pub async fn run(ctx: Context, state: ClusterState, stop: watch::Receiver<bool>) {
    let policies = ctx.cloud.repair_policies();
    tracing::info!(
        controller = CONTROLLER,
        policies = %policies.iter().map(|p| format!("{}={} for {:?}", p.condition_type, p.status, p.toleration)).collect::<Vec<_>>().join(", "),
        "node repair enabled"
    );
    let interest = Interest { nodes: true, node_deletions: true, nodeclaims: true, ..Interest::default() };
    let wake = Coalesced { changes: state.feed().subscribe(interest), settle: COALESCE };
    run_singleton(Options::new(CONTROLLER), Some(ctx.metrics.clone()), wake, stop, || {
        let (ctx, state, policies) = (ctx.clone(), state.clone(), policies.clone());
        async move { Ok::<_, std::convert::Infallible>(pass(&ctx, &state, &policies).await) }
    })
    .await;
}

async fn pass(ctx: &Context, state: &ClusterState, policies: &[RepairPolicy]) -> Next {
    let now = Timestamp::now();
    let subjects: Vec<Subject> = state
        .nodes
        .state()
        .into_iter()
        .map(|node| {
            let claim = node
                .spec
                .as_ref()
                .and_then(|s| s.provider_id.as_deref())
                .and_then(|p| state.nodeclaim_with_provider_id(p));
            Subject { node, claim }
        })
        .collect();
    let decision = repair::decide(&subjects, policies, now);
    for (node, condition) in &decision.untimed {
        tracing::debug!(controller = CONTROLLER, Node = %node, condition = %condition, "unhealthy condition has no lastTransitionTime; not repaired");
    }
    for blocked in &decision.blocked {
        tell_blocked(ctx, state, blocked).await;
    }
    let mut next = Next::After(if decision.blocked.is_empty() { PERIOD } else { BLOCKED_RECHECK });
    for repair in &decision.repairs {
        if let Err(error) = apply(ctx, repair, now).await {
            tracing::error!(controller = CONTROLLER, NodeClaim = %repair.claim.name_any(), Node = %repair.node.name_any(), error = %error_chain(&error), "repairing unhealthy node");
            next = next.min(Next::After(Duration::from_secs(10)));
        }
    }
    if let Some(due) = decision.next {
        let wait = Duration::try_from(due.duration_since(now)).unwrap_or_default();
        next = next.min(Next::After(wait.max(Duration::from_secs(1))));
    }
    next
}

/// Deletes the claim, then sets its termination deadline to now (unless it has an earlier one).
/// In that order: a deadline written first would stay on a claim whose deletion then failed, and
/// a later ordinary disruption of it would skip its PodDisruptionBudgets. A crash in between is
/// healed by the next pass (a deleting claim whose deadline has not passed is given it).
async fn apply(ctx: &Context, repair: &Repair, now: Timestamp) -> Result<(), kube::Error> {
    if repair.claim.metadata.deletion_timestamp.is_none() {
        // Gone, or a claim of the same name made since: not this one to repair.
        if !nodeclaim::delete(&ctx.client, &repair.claim).await? {
            return Ok(());
        }
        tracing::info!(
            controller = CONTROLLER,
            NodeClaim = %repair.claim.name_any(),
            Node = %repair.node.name_any(),
            condition = %repair.condition,
            status = %repair.status,
            "deleting unhealthy node"
        );
        count_disrupted(&ctx.metrics, &repair.claim, REASON);
        let label = |key: &str| repair.node.labels().get(key).cloned().unwrap_or_default();
        let labels = vec![
            ("condition", snake_case(&repair.condition)),
            ("nodepool", label(LABEL_NODEPOOL)),
            ("capacity_type", label(LABEL_CAPACITY_TYPE)),
            ("image_id", repair.claim.status.as_ref().and_then(|s| s.image_id.clone()).unwrap_or_default()),
        ];
        ctx.metrics.nodeclaims_unhealthy_disrupted.get_or_create(&labels).inc();
    }
    if repair.set_deadline {
        nodeclaim::set_termination_deadline(&ctx.client, CONTROLLER, &repair.claim, now).await?;
    }
    Ok(())
}

/// `NodeRepairBlocked` on the node, its NodeClaim and (for a NodePool's node) the NodePool.
async fn tell_blocked(ctx: &Context, state: &ClusterState, blocked: &Blocked) {
    let message = blocked.message();
    // Every pass while blocked: the event (once per window) is what operators see.
    tracing::debug!(
        controller = CONTROLLER,
        NodeClaim = %blocked.claim.name_any(),
        Node = %blocked.node.name_any(),
        unhealthy = blocked.unhealthy,
        nodes = blocked.total,
        message = %message,
        "node repair blocked"
    );
    let events = &ctx.events;
    let (reason, window) = (reasons::NODE_REPAIR_BLOCKED, BLOCKED_EVENT_WINDOW);
    events.deduped(blocked.node.as_ref(), EventType::Warning, reason, "", window, message.clone()).await;
    events.deduped(blocked.claim.as_ref(), EventType::Warning, reason, "", window, message.clone()).await;
    if let Scope::NodePool(pool) = &blocked.scope
        && let Some(pool) = state.nodepool(pool)
    {
        events.deduped(pool.as_ref(), EventType::Warning, reason, "", window, message).await;
    }
}

/// `AcceleratedHardwareReady` → `accelerated_hardware_ready`, as upstream labels conditions.
pub fn snake_case(name: &str) -> String {
    let mut out = String::with_capacity(name.len() + 4);
    for (i, c) in name.chars().enumerate() {
        if c.is_uppercase() {
            if i > 0 {
                out.push('_');
            }
            out.extend(c.to_lowercase());
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conditions_are_labelled_in_snake_case() {
        assert_eq!(snake_case("Ready"), "ready");
        assert_eq!(snake_case("AcceleratedHardwareReady"), "accelerated_hardware_ready");
        assert_eq!(snake_case("KernelReady"), "kernel_ready");
    }
}

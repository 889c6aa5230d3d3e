//! Static NodePools (`spec.replicas`): how many NodeClaims a pool should make or remove now, and
//! which go first when it shrinks (pure), as upstream's static provisioning and deprovisioning
//! controllers decide.
//!
//! A pool's **running** claims are those not being deleted and not being replaced by a
//! disruption command (their Node carries `karpenter.sh/disrupted`); claims this process has
//! just created or deleted and the cache does not show yet count as what they will be. When
//! running plus pending-disruption claims fall short of `replicas`, the pool makes
//! `replicas - running`, no more than `limits.nodes` allows over every claim it has; when
//! running exceeds `replicas`, it removes the difference: claims not launched yet first, then
//! empty nodes (DaemonSet pods only, none under `karpenter.sh/do-not-disrupt`), then the others,
//! those with a pod under `do-not-disrupt` last and otherwise cheapest to move first (rescheduling
//! cost times the share of `expireAfter` left).

use std::collections::BTreeSet;

use k8s_openapi::jiff::Timestamp;

use crate::apis::NodePool;
use crate::apis::labels::TAINT_DISRUPTED;
use crate::scheduling::resources::NODES;
use crate::state::StateNode;
use crate::state::pods::{do_not_disrupt, is_owned_by_daemonset};
use crate::util::parse_duration;

use super::emptiness::reschedule_cost;

/// What a static pool's NodeClaims are now.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    /// Running: neither being deleted nor being replaced.
    pub running: i64,
    /// Being replaced by a disruption command.
    pub pending_disruption: i64,
    /// Every claim not being deleted (what `limits.nodes` counts).
    pub active: i64,
}

/// What a static pool should do now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Nothing: it has its replicas.
    Hold,
    /// Make this many NodeClaims.
    Create(i64),
    /// Below its replicas, but `limits.nodes` allows no more.
    LimitReached,
    /// Delete these NodeClaims, in order.
    Delete(Vec<String>),
}

/// The claims created (`created`) and deleted (`deleted`) by this process that the cache may not
/// show yet.
#[derive(Clone, Copy, Debug)]
pub struct Unseen<'a> {
    /// Created, possibly not in the cache yet.
    pub created: &'a BTreeSet<String>,
    /// Deleted, possibly not marked in the cache yet.
    pub deleted: &'a BTreeSet<String>,
}

fn of_pool<'n>(nodes: &'n [StateNode], pool: &str) -> impl Iterator<Item = &'n StateNode> {
    nodes.iter().filter(move |n| n.claim.is_some() && n.nodepool() == Some(pool))
}

fn deleting(node: &StateNode, unseen: &Unseen<'_>) -> bool {
    node.claim.as_ref().is_some_and(|c| c.metadata.deletion_timestamp.is_some())
        || node.claim_name().is_some_and(|c| unseen.deleted.contains(c))
}

fn being_replaced(node: &StateNode) -> bool {
    node.taints.iter().any(|t| t.key == TAINT_DISRUPTED)
}

/// The pool's counts over `nodes`, with what the cache does not show yet.
pub fn counts(pool: &str, nodes: &[StateNode], unseen: &Unseen<'_>) -> Counts {
    let mut counts = Counts::default();
    let mut seen = BTreeSet::new();
    for node in of_pool(nodes, pool) {
        if let Some(name) = node.claim_name() {
            seen.insert(name);
        }
        if deleting(node, unseen) {
            continue;
        }
        counts.active += 1;
        if being_replaced(node) {
            counts.pending_disruption += 1;
        } else {
            counts.running += 1;
        }
    }
    let not_yet_seen = unseen.created.iter().filter(|c| !seen.contains(c.as_str())).count();
    let not_yet_seen = i64::try_from(not_yet_seen).unwrap_or(i64::MAX);
    counts.running += not_yet_seen;
    counts.active += not_yet_seen;
    counts
}

/// The pool's `limits.nodes`, if set.
pub fn node_limit(pool: &NodePool) -> Option<i64> {
    let quantity = pool.spec.limits.as_ref()?.get(NODES)?;
    crate::scheduling::resources::parse_quantity_for(NODES, quantity).ok()
}

/// What `pool` should do now, over `nodes` (all StateNodes of the snapshot).
pub fn plan(pool: &NodePool, nodes: &[StateNode], unseen: &Unseen<'_>, now: Timestamp) -> Action {
    let Some(replicas) = pool.spec.replicas else { return Action::Hold };
    let name = pool.metadata.name.as_deref().unwrap_or_default();
    let counts = counts(name, nodes, unseen);
    if counts.running > replicas {
        let excess = usize::try_from(counts.running - replicas).unwrap_or(0);
        return Action::Delete(scale_down_order(pool, nodes, unseen, now).into_iter().take(excess).collect());
    }
    if counts.running + counts.pending_disruption >= replicas {
        return Action::Hold;
    }
    let wanted = replicas - counts.running;
    let allowed = node_limit(pool).map_or(wanted, |limit| wanted.min((limit - counts.active).max(0)));
    if allowed <= 0 { Action::LimitReached } else { Action::Create(allowed) }
}

/// The pool's running claims in the order a scale-down removes them (see the module docs).
pub fn scale_down_order(
    pool: &NodePool,
    nodes: &[StateNode],
    unseen: &Unseen<'_>,
    now: Timestamp,
) -> Vec<String> {
    let name = pool.metadata.name.as_deref().unwrap_or_default();
    let running: Vec<&StateNode> =
        of_pool(nodes, name).filter(|n| !deleting(n, unseen) && !being_replaced(n)).collect();
    let mut ranked: Vec<(u8, f64, &str)> = running
        .iter()
        .filter_map(|n| {
            let claim = n.claim_name()?;
            let protected = n.pods.iter().any(|p| do_not_disrupt(p, now).is_active());
            let rank = if !n.launched() {
                0
            } else if !protected && n.pods.iter().all(|p| is_owned_by_daemonset(p)) {
                1
            } else if !protected {
                2
            } else {
                3
            };
            let cost = if rank >= 2 { reschedule_cost(n) * lifetime_remaining(n, now) } else { 0.0 };
            Some((rank, cost, claim))
        })
        .collect();
    ranked.sort_by(|a, b| a.0.cmp(&b.0).then(a.1.total_cmp(&b.1)).then_with(|| a.2.cmp(b.2)));
    ranked.into_iter().map(|(_, _, claim)| claim.to_string()).collect()
}

/// The share of the node's `expireAfter` still ahead of it (1 without expiry), as upstream
/// weighs how much a node's remaining life is worth.
fn lifetime_remaining(node: &StateNode, now: Timestamp) -> f64 {
    let Some(claim) = node.claim.as_deref() else { return 1.0 };
    let expire_after = &claim.spec.expire_after;
    if expire_after == "Never" {
        return 1.0;
    }
    let (Ok(lifetime), Some(created)) =
        (parse_duration(expire_after), claim.metadata.creation_timestamp.as_ref())
    else {
        return 1.0;
    };
    let total = lifetime.as_secs_f64();
    if total <= 0.0 {
        return 1.0;
    }
    let age = now.duration_since(created.0).as_secs_f64();
    ((total - age) / total).clamp(0.0, 1.0)
}

#[cfg(test)]
mod tests;

//! Which nodes emptiness would remove now, as upstream decides it: every candidate that is empty,
//! consolidatable, and whose NodePool's budget for `Empty` still allows one more, in one command.
//!
//! A node is empty when its pods would cost nothing to move: the disruption cost of its
//! reschedulable pods, each `clamp(1 + pod-deletion-cost / 2^27 + priority / 2^25, -10, 10)`
//! counted only when positive, adds up to nothing. A node is consolidatable once its NodePool's
//! `consolidateAfter` has passed since the last pod event on it (or since it was initialized);
//! `Never` turns consolidation off.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::apis::pod::Pod;
use k8s_openapi::jiff::{SignedDuration, Timestamp};

use crate::apis::nodeclaim::conditions::INITIALIZED;
use crate::apis::{ConditionStatus, NodeClaim, NodePool};
use crate::state::StateNode;
use crate::util::parse_duration;

/// The annotation that ranks pods for deletion within a ReplicaSet.
pub const ANNOTATION_POD_DELETION_COST: &str = "controller.kubernetes.io/pod-deletion-cost";

/// What evicting `pod` costs, as upstream weighs it: 1, plus its deletion cost over 2^27 and its
/// priority over 2^25, between -10 and 10.
pub fn eviction_cost(pod: &Pod) -> f64 {
    let deletion_cost = pod
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ANNOTATION_POD_DELETION_COST))
        .and_then(|v| v.trim().parse::<i32>().ok())
        .unwrap_or(0);
    let priority = pod.spec.as_ref().and_then(|s| s.priority).unwrap_or(0);
    (1.0 + f64::from(deletion_cost) / 2f64.powi(27) + f64::from(priority) / 2f64.powi(25)).clamp(-10.0, 10.0)
}

/// What moving the node's pods costs: 1 plus the positive eviction costs of its reschedulable pods.
pub fn reschedule_cost(node: &StateNode) -> f64 {
    1.0 + node.reschedulable_pods().map(|p| eviction_cost(p).max(0.0)).sum::<f64>()
}

/// Whether the node's pods would cost nothing to move.
pub fn is_empty(node: &StateNode) -> bool {
    reschedule_cost(node) <= 1.0
}

/// When the node becomes consolidatable: `consolidateAfter` after its last pod event (or its
/// initialization); `None` when consolidation is off (`Never`), the value does not parse, or the
/// node is not initialized.
pub fn consolidatable_at(node: &StateNode, pool: &NodePool) -> Option<Timestamp> {
    claim_consolidatable_at(node.claim.as_ref()?, pool)
}

/// When `claim` becomes consolidatable under `pool` (see [`consolidatable_at`]): the time its
/// `Consolidatable` condition turns true.
pub fn claim_consolidatable_at(claim: &NodeClaim, pool: &NodePool) -> Option<Timestamp> {
    let after = pool.spec.disruption.consolidate_after.trim();
    if after == "Never" {
        return None;
    }
    let after = SignedDuration::try_from(parse_duration(after).ok()?).ok()?;
    let status = claim.status.as_ref()?;
    let initialized =
        status.conditions.iter().find(|c| c.type_ == INITIALIZED && c.status == ConditionStatus::True)?;
    let since = match status.last_pod_event_time.as_deref().and_then(|t| t.parse::<Timestamp>().ok()) {
        Some(t) => t,
        None => initialized.last_transition_time.parse().ok()?,
    };
    since.checked_add(after).ok()
}

/// The nodes emptiness removes now, in one command: of `candidates` (nodes that passed the
/// candidate checks), those that are empty and consolidatable at `now`, as long as their
/// NodePool's remaining `Empty` budget (`budgets`, decremented here) allows.
pub fn empty_nodes(
    candidates: &[&StateNode],
    pools: &BTreeMap<String, Arc<NodePool>>,
    budgets: &mut BTreeMap<String, usize>,
    now: Timestamp,
) -> Vec<String> {
    let mut chosen = Vec::new();
    for node in candidates {
        let Some(pool_name) = node.nodepool() else { continue };
        let Some(pool) = pools.get(pool_name) else { continue };
        if !is_empty(node) || consolidatable_at(node, pool).is_none_or(|at| at > now) {
            continue;
        }
        let Some(budget) = budgets.get_mut(pool_name).filter(|b| **b > 0) else { continue };
        *budget -= 1;
        chosen.push(node.name.clone());
    }
    chosen
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::apis::labels::LABEL_NODEPOOL;

    fn pod(name: &str, priority: i32, deletion_cost: Option<&str>) -> Arc<Pod> {
        let annotations =
            deletion_cost.map(|c| json!({ANNOTATION_POD_DELETION_COST: c})).unwrap_or(json!({}));
        Arc::new(
            serde_json::from_value(json!({
                "metadata": {"name": name, "namespace": "ns", "uid": name, "annotations": annotations},
                "spec": {"nodeName": "n", "priority": priority, "containers": [{"name": "c"}]},
                "status": {"phase": "Running"}
            }))
            .unwrap(),
        )
    }

    fn pool(name: &str, consolidate_after: &str) -> Arc<NodePool> {
        Arc::new(
            serde_json::from_value(json!({
                "metadata": {"name": name},
                "spec": {"template": {"spec": {"nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "c"}, "requirements": []}},
                    "disruption": {"consolidateAfter": consolidate_after}}
            }))
            .unwrap(),
        )
    }

    fn node(name: &str, pool: &str, pods: Vec<Arc<Pod>>, last_pod_event: Option<&str>) -> StateNode {
        let claim = serde_json::from_value(json!({"metadata": {"name": name}, "spec": {"nodeClassRef":
            {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "c"}, "requirements": []},
            "status": {"conditions": [{"type": "Initialized", "status": "True", "reason": "Initialized", "message": "",
                "lastTransitionTime": "2026-11-24T11:00:00Z"}], "lastPodEventTime": last_pod_event}}))
        .unwrap();
        StateNode {
            name: name.into(),
            claim: Some(Arc::new(claim)),
            labels: [(LABEL_NODEPOOL.to_string(), pool.to_string())].into(),
            managed: true,
            initialized: true,
            pods,
            last_pod_event_time: last_pod_event.map(|t| t.parse().unwrap()),
            ..StateNode::default()
        }
    }

    #[test]
    fn eviction_costs_weigh_deletion_cost_and_priority() {
        assert_eq!(eviction_cost(&pod("a", 0, None)), 1.0);
        assert_eq!(eviction_cost(&pod("a", 1 << 25, None)), 2.0);
        assert_eq!(eviction_cost(&pod("a", 0, Some("134217728"))), 2.0);
        assert_eq!(eviction_cost(&pod("a", 0, Some("-2147483648"))), -10.0, "clamped");
        assert_eq!(eviction_cost(&pod("a", 2_000_000_000, None)), 10.0, "clamped");
        assert_eq!(eviction_cost(&pod("a", 0, Some("not a number"))), 1.0);
    }

    #[test]
    fn a_node_is_empty_when_its_pods_cost_nothing_to_move() {
        assert!(is_empty(&node("n", "p", vec![], None)));
        assert!(!is_empty(&node("n", "p", vec![pod("a", 0, None)], None)));
        // A pod whose deletion cost makes it free to move does not keep the node.
        assert!(is_empty(&node("n", "p", vec![pod("a", 0, Some("-1000000000"))], None)));
    }

    #[test]
    fn consolidatable_after_the_last_pod_event_or_initialization() {
        let quiet = node("n", "p", vec![], None);
        let busy = node("n", "p", vec![], Some("2026-11-24T11:50:00Z"));
        let at = |n: &StateNode, after: &str| consolidatable_at(n, &pool("p", after)).map(|t| t.to_string());
        assert_eq!(at(&quiet, "0s").as_deref(), Some("2026-11-24T11:00:00Z"));
        assert_eq!(at(&quiet, "30m").as_deref(), Some("2026-11-24T11:30:00Z"));
        assert_eq!(at(&busy, "30m").as_deref(), Some("2026-11-24T12:20:00Z"));
        assert_eq!(at(&busy, "Never"), None);
    }

    #[test]
    fn empty_consolidatable_nodes_within_the_budget_in_one_command() {
        let now: Timestamp = "2026-11-24T12:00:00Z".parse().unwrap();
        let pools =
            BTreeMap::from([("p".to_string(), pool("p", "5m")), ("q".to_string(), pool("q", "Never"))]);
        let nodes = [
            node("empty-1", "p", vec![], None),
            node("busy", "p", vec![pod("a", 0, None)], None),
            node("recent", "p", vec![], Some("2026-11-24T11:58:00Z")),
            node("empty-2", "p", vec![], None),
            node("empty-3", "p", vec![], None),
            node("never", "q", vec![], None),
        ];
        let candidates: Vec<&StateNode> = nodes.iter().collect();
        let mut budgets = BTreeMap::from([("p".to_string(), 2), ("q".to_string(), 10)]);
        assert_eq!(empty_nodes(&candidates, &pools, &mut budgets, now), ["empty-1", "empty-2"]);
        assert_eq!(budgets["p"], 0, "the budget is used up");
        assert_eq!(budgets["q"], 10);
    }
}

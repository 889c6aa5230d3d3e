//! What each NodePool uses: the capacity of its nodes and their count. The one computation behind
//! NodePool limits (the provisioner) and the NodePool status (`kubectl get nodepools`).

use std::collections::BTreeMap;

use crate::scheduling::Resources;
use crate::scheduling::resources::NODES;

use super::statenode::StateNode;

/// Which nodes count.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Counted {
    /// Nodes whose instance exists (launched NodeClaims and registered Nodes): what the NodePool
    /// status reports.
    Launched,
    /// Every node, NodeClaims not launched yet included at the largest instance type they may
    /// become: what limits are checked against, so that they hold whichever type the cloud picks.
    All,
}

/// The capacity of each NodePool's nodes, with `nodes` counting them, by NodePool name.
pub fn nodepool_usage(nodes: &[StateNode], counted: Counted) -> BTreeMap<String, Resources> {
    let mut usage: BTreeMap<String, Resources> = BTreeMap::new();
    for node in nodes {
        let Some(pool) = node.nodepool() else { continue };
        if counted == Counted::Launched && !node.launched() && !node.registered() {
            continue;
        }
        let used = usage.entry(pool.to_string()).or_default();
        used.add_assign(&node.capacity);
        used.set(NODES, used.get(NODES) + 1);
    }
    usage
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(pool: &str, cpu: i64, launched: bool) -> StateNode {
        StateNode {
            labels: [("karpenter.sh/nodepool".to_string(), pool.to_string())].into(),
            capacity: Resources::from_pairs([("cpu", cpu)]),
            provider_id: launched.then(|| format!("kwok://{cpu}")),
            ..Default::default()
        }
    }

    #[test]
    fn limits_count_every_node_the_status_only_launched_ones() {
        let nodes =
            [node("a", 2000, true), node("a", 8000, false), node("b", 4000, true), StateNode::default()];
        let all = nodepool_usage(&nodes, Counted::All);
        assert_eq!((all["a"].get("cpu"), all["a"].get(NODES)), (10_000, 2));
        assert_eq!((all["b"].get("cpu"), all["b"].get(NODES)), (4000, 1));
        let launched = nodepool_usage(&nodes, Counted::Launched);
        assert_eq!((launched["a"].get("cpu"), launched["a"].get(NODES)), (2000, 1));
        assert_eq!(all.len(), 2, "nodes of no NodePool are not counted");
    }
}

//! Node repair: which nodes have been unhealthy for longer than their provider tolerates, and
//! which of those may be replaced now.
//!
//! A node is unhealthy when one of its conditions has a status a [`RepairPolicy`] names (e.g.
//! `Ready=False`); it is due for repair once that condition has held for the policy's toleration,
//! counted from the condition's `lastTransitionTime`. When several conditions match, the one due
//! first decides. Repair is refused while more than 20 % (rounded up) of the nodes of the node's
//! NodePool are unhealthy, or of the whole cluster for a NodeClaim without a NodePool: a fault
//! that hits many nodes at once (a bad AMI, a broken CNI) is not fixed by replacing them all.
//!
//! Repair is forceful, as upstream's: no disruption budget, no replacement launched first, and
//! the NodeClaim's termination deadline is set to the moment of repair so that pods blocked by
//! PodDisruptionBudgets or `karpenter.sh/do-not-disrupt` do not hold a broken node.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Node, NodeCondition};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::ResourceExt;

use crate::apis::NodeClaim;
use crate::apis::labels::{ANNOTATION_NODECLAIM_TERMINATION_TIMESTAMP, LABEL_NODEPOOL};

/// A node condition that node repair acts on: a node whose condition `condition_type` has had
/// the status `status` for `toleration` is replaced.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RepairPolicy {
    /// The node condition's type, e.g. `Ready`.
    pub condition_type: &'static str,
    /// The status that is unhealthy: `False`, `True` or `Unknown`.
    pub status: &'static str,
    /// How long the condition may hold before the node is replaced.
    pub toleration: std::time::Duration,
}

/// The policies every node has: a kubelet that reports `Ready=False` or stops reporting
/// (`Ready=Unknown`) for 30 minutes.
pub const KUBELET_REPAIR_POLICIES: [RepairPolicy; 2] = [
    RepairPolicy {
        condition_type: "Ready",
        status: "False",
        toleration: std::time::Duration::from_secs(30 * 60),
    },
    RepairPolicy {
        condition_type: "Ready",
        status: "Unknown",
        toleration: std::time::Duration::from_secs(30 * 60),
    },
];

/// Share of a NodePool's (or the cluster's) nodes that may be unhealthy for repair to go on.
pub const ALLOWED_UNHEALTHY_PERCENT: u64 = 20;

/// A node as repair sees it: the Node and, when Karpenter launched it, its NodeClaim.
#[derive(Clone, Debug)]
pub struct Subject {
    /// The Node.
    pub node: Arc<Node>,
    /// Its NodeClaim (joined by provider ID), `None` for nodes Karpenter does not manage.
    pub claim: Option<Arc<NodeClaim>>,
}

/// A node whose unhealthy condition has outlasted its toleration.
#[derive(Clone, Debug)]
pub struct Repair {
    /// The node.
    pub node: Arc<Node>,
    /// Its NodeClaim, to delete.
    pub claim: Arc<NodeClaim>,
    /// The condition that made it due (`Ready`, `AcceleratedHardwareReady`, ...).
    pub condition: String,
    /// The condition's status (`False`, `Unknown`).
    pub status: String,
    /// Whether the NodeClaim still needs its termination deadline set to now (it has none, or a
    /// later one).
    pub set_deadline: bool,
}

/// Where a refused repair counted too many unhealthy nodes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Scope {
    /// The nodes of this NodePool.
    NodePool(String),
    /// Every node of the cluster (the NodeClaim has no NodePool).
    Cluster,
}

/// A node due for repair that may not be repaired now.
#[derive(Clone, Debug)]
pub struct Blocked {
    /// The node.
    pub node: Arc<Node>,
    /// Its NodeClaim.
    pub claim: Arc<NodeClaim>,
    /// Whose nodes are too unhealthy.
    pub scope: Scope,
    /// Unhealthy nodes in the scope.
    pub unhealthy: usize,
    /// Nodes in the scope.
    pub total: usize,
}

impl Blocked {
    /// The `NodeRepairBlocked` event's message, as upstream words it (the cluster variant's
    /// spelling included, so that alerts matching it keep working).
    pub fn message(&self) -> String {
        match self.scope {
            Scope::NodePool(_) => {
                format!("more than {ALLOWED_UNHEALTHY_PERCENT}% nodes are unhealthy in the nodepool")
            }
            Scope::Cluster => {
                format!("more then {ALLOWED_UNHEALTHY_PERCENT}% nodes are unhealthy in the cluster")
            }
        }
    }
}

/// What one pass of node repair does.
#[derive(Clone, Debug, Default)]
pub struct Decision {
    /// NodeClaims to delete, forcefully.
    pub repairs: Vec<Repair>,
    /// Nodes due for repair but refused.
    pub blocked: Vec<Blocked>,
    /// When the next unhealthy node becomes due, if any is waiting.
    pub next: Option<Timestamp>,
    /// Unhealthy conditions that cannot be timed (no `lastTransitionTime`): node and condition.
    pub untimed: Vec<(String, String)>,
}

/// The first of `node`'s conditions that `policies` call unhealthy, by the time it becomes due:
/// the condition and its due time (`None` when the condition has no transition time).
fn due_condition<'a>(
    node: &'a Node,
    policies: &[RepairPolicy],
) -> Option<(&'a NodeCondition, Option<Timestamp>)> {
    let conditions = node.status.as_ref()?.conditions.as_deref()?;
    let mut first: Option<(&NodeCondition, Option<Timestamp>)> = None;
    for policy in policies {
        let Some(condition) =
            conditions.iter().find(|c| c.type_ == policy.condition_type && c.status == policy.status)
        else {
            continue;
        };
        let toleration = SignedDuration::try_from(policy.toleration).unwrap_or(SignedDuration::MAX);
        let due = condition.last_transition_time.as_ref().and_then(|t| t.0.checked_add(toleration).ok());
        let earlier = match (&first, due) {
            (None, _) => true,
            (Some((_, None)), Some(_)) => true,
            (Some((_, Some(current))), Some(due)) => due < *current,
            (Some(_), None) => false,
        };
        if earlier {
            first = Some((condition, due));
        }
    }
    first
}

/// Whether any of `node`'s conditions is one `policies` call unhealthy, however briefly.
pub fn is_unhealthy(node: &Node, policies: &[RepairPolicy]) -> bool {
    due_condition(node, policies).is_some()
}

/// Unhealthy nodes a share of `total` may hold: 20 %, rounded up, as a PodDisruptionBudget
/// rounds `maxUnavailable` (three nodes may have one unhealthy).
pub fn allowed_unhealthy(total: usize) -> usize {
    (total * ALLOWED_UNHEALTHY_PERCENT as usize).div_ceil(100)
}

/// Whether `claim` already has a termination deadline at or before `now`.
fn deadline_passed(claim: &NodeClaim, now: Timestamp) -> bool {
    claim
        .annotations()
        .get(ANNOTATION_NODECLAIM_TERMINATION_TIMESTAMP)
        .and_then(|v| v.parse::<Timestamp>().ok())
        .is_some_and(|at| at <= now)
}

/// One pass of node repair over every node of the cluster at `now`.
pub fn decide(subjects: &[Subject], policies: &[RepairPolicy], now: Timestamp) -> Decision {
    let mut decision = Decision::default();
    if policies.is_empty() {
        return decision;
    }
    // Unhealthy and total nodes, per NodePool and in the whole cluster.
    let mut pools: BTreeMap<&str, (usize, usize)> = BTreeMap::new();
    let mut cluster = (0usize, 0usize);
    for subject in subjects {
        let unhealthy = usize::from(is_unhealthy(&subject.node, policies));
        cluster.0 += unhealthy;
        cluster.1 += 1;
        // The claim's NodePool (the one a repair is judged against), else the node's label.
        let pool = subject.claim.as_ref().and_then(|c| c.labels().get(LABEL_NODEPOOL));
        if let Some(pool) = pool.or_else(|| subject.node.labels().get(LABEL_NODEPOOL)) {
            let counts = pools.entry(pool.as_str()).or_default();
            counts.0 += unhealthy;
            counts.1 += 1;
        }
    }
    for subject in subjects {
        let Some(claim) = subject.claim.as_ref() else { continue };
        let Some((condition, due)) = due_condition(&subject.node, policies) else { continue };
        let Some(due) = due else {
            decision.untimed.push((subject.node.name_any(), condition.type_.clone()));
            continue;
        };
        if due > now {
            decision.next = Some(decision.next.map_or(due, |n| n.min(due)));
            continue;
        }
        let set_deadline = !deadline_passed(claim, now);
        if claim.metadata.deletion_timestamp.is_some() && !set_deadline {
            // Already going, with nothing left to hurry.
            continue;
        }
        let (scope, (unhealthy, total)) = match claim.labels().get(LABEL_NODEPOOL) {
            Some(pool) => {
                (Scope::NodePool(pool.clone()), pools.get(pool.as_str()).copied().unwrap_or((0, 0)))
            }
            None => (Scope::Cluster, cluster),
        };
        if unhealthy > allowed_unhealthy(total) {
            decision.blocked.push(Blocked {
                node: subject.node.clone(),
                claim: claim.clone(),
                scope,
                unhealthy,
                total,
            });
            continue;
        }
        decision.repairs.push(Repair {
            node: subject.node.clone(),
            claim: claim.clone(),
            condition: condition.type_.clone(),
            status: condition.status.clone(),
            set_deadline,
        });
    }
    decision
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use serde_json::json;

    use super::*;

    const NOW: &str = "2026-11-24T12:00:00Z";

    fn now() -> Timestamp {
        NOW.parse().unwrap()
    }

    /// A node of `pool` whose `Ready` condition has had `ready` since `minutes_ago`.
    fn subject(name: &str, pool: Option<&str>, ready: &str, minutes_ago: i64) -> Subject {
        let since = now() - SignedDuration::from_mins(minutes_ago);
        let mut labels = serde_json::Map::new();
        if let Some(pool) = pool {
            labels.insert(LABEL_NODEPOOL.into(), json!(pool));
        }
        let node: Node = serde_json::from_value(json!({
            "metadata": {"name": name, "labels": labels},
            "status": {"conditions": [
                {"type": "Ready", "status": ready, "lastTransitionTime": since.to_string()},
                {"type": "MemoryPressure", "status": "False", "lastTransitionTime": since.to_string()},
            ]},
        }))
        .unwrap();
        let claim: NodeClaim = serde_json::from_value(json!({
            "apiVersion": "karpenter.sh/v1", "kind": "NodeClaim",
            "metadata": {"name": format!("{name}-claim"), "labels": labels},
            "spec": {"nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "default"},
                "requirements": []},
        }))
        .unwrap();
        Subject { node: Arc::new(node), claim: Some(Arc::new(claim)) }
    }

    fn names(repairs: &[Repair]) -> Vec<String> {
        repairs.iter().map(|r| r.node.name_any()).collect()
    }

    #[test]
    fn twenty_percent_rounded_up_may_be_unhealthy() {
        assert_eq!(allowed_unhealthy(0), 0);
        assert_eq!(allowed_unhealthy(1), 1);
        assert_eq!(allowed_unhealthy(3), 1);
        assert_eq!(allowed_unhealthy(5), 1);
        assert_eq!(allowed_unhealthy(6), 2);
        assert_eq!(allowed_unhealthy(10), 2);
        assert_eq!(allowed_unhealthy(11), 3);
    }

    #[test]
    fn a_node_is_repaired_once_its_condition_outlasts_the_toleration() {
        let subjects = [
            subject("long-down", Some("a"), "False", 31),
            subject("lost", Some("a"), "Unknown", 30),
            subject("just-down", Some("a"), "False", 5),
            subject("fine", Some("a"), "True", 120),
            subject("b1", Some("b"), "True", 120),
            subject("b2", Some("b"), "True", 120),
            subject("b3", Some("b"), "True", 120),
            subject("b4", Some("b"), "True", 120),
            subject("b5", Some("b"), "True", 120),
            subject("b6", Some("b"), "True", 120),
            subject("b7", Some("b"), "True", 120),
            subject("b8", Some("b"), "True", 120),
            subject("b9", Some("b"), "True", 120),
            subject("b10", Some("b"), "True", 120),
            subject("b11", Some("b"), "True", 120),
        ];
        // Pool a: 3 of 4 unhealthy (just-down counts), 1 allowed: blocked.
        let blocked = decide(&subjects, &KUBELET_REPAIR_POLICIES, now());
        assert!(blocked.repairs.is_empty(), "3 of 4 unhealthy in the pool: {:?}", names(&blocked.repairs));
        assert_eq!(blocked.blocked.len(), 2, "the two due nodes are blocked");
        assert_eq!(blocked.blocked[0].scope, Scope::NodePool("a".into()));
        assert_eq!((blocked.blocked[0].unhealthy, blocked.blocked[0].total), (3, 4));
        assert_eq!(blocked.blocked[0].message(), "more than 20% nodes are unhealthy in the nodepool");

        // One pool of 15 nodes with 3 unhealthy: 3 allowed, the two due ones repaired.
        let relabel = |s: &Subject| {
            let mut node = (*s.node).clone();
            node.labels_mut().insert(LABEL_NODEPOOL.into(), "a".into());
            let mut claim = (**s.claim.as_ref().unwrap()).clone();
            claim.labels_mut().insert(LABEL_NODEPOOL.into(), "a".into());
            Subject { node: Arc::new(node), claim: Some(Arc::new(claim)) }
        };
        let one_pool: Vec<Subject> = subjects.iter().map(relabel).collect();
        let decision = decide(&one_pool, &KUBELET_REPAIR_POLICIES, now());
        assert_eq!(names(&decision.repairs), ["long-down", "lost"]);
        assert_eq!(decision.repairs[1].status, "Unknown");
        assert!(decision.repairs.iter().all(|r| r.set_deadline && r.condition == "Ready"));
        assert!(decision.blocked.is_empty());
        assert_eq!(decision.next, Some(now() + SignedDuration::from_mins(25)), "just-down is due in 25 min");
    }

    #[test]
    fn without_a_nodepool_the_whole_cluster_counts() {
        let mut subjects: Vec<Subject> =
            (0..4).map(|i| subject(&format!("n{i}"), Some("a"), "True", 60)).collect();
        subjects.push(subject("standalone", None, "False", 40));
        let decision = decide(&subjects, &KUBELET_REPAIR_POLICIES, now());
        assert_eq!(names(&decision.repairs), ["standalone"], "1 of 5 unhealthy in the cluster");

        subjects[0] = subject("n0", Some("a"), "Unknown", 1);
        let decision = decide(&subjects, &KUBELET_REPAIR_POLICIES, now());
        assert!(decision.repairs.is_empty());
        assert_eq!(decision.blocked[0].scope, Scope::Cluster);
        assert_eq!(decision.blocked[0].message(), "more then 20% nodes are unhealthy in the cluster");
    }

    #[test]
    fn the_condition_due_first_decides_and_unmanaged_nodes_only_count() {
        let policies = [
            RepairPolicy { condition_type: "Ready", status: "False", toleration: Duration::from_secs(1800) },
            RepairPolicy {
                condition_type: "AcceleratedHardwareReady",
                status: "False",
                toleration: Duration::from_secs(600),
            },
        ];
        let mut gpu = subject("gpu", Some("a"), "False", 15);
        let mut node = (*gpu.node).clone();
        let since = (now() - SignedDuration::from_mins(12)).to_string();
        node.status.as_mut().unwrap().conditions.as_mut().unwrap().push(
            serde_json::from_value(
                json!({"type": "AcceleratedHardwareReady", "status": "False", "lastTransitionTime": since}),
            )
            .unwrap(),
        );
        gpu.node = Arc::new(node);
        let mut unmanaged = subject("unmanaged", Some("a"), "False", 60);
        unmanaged.claim = None;
        let mut subjects = vec![gpu, unmanaged];
        subjects.extend((0..8).map(|i| subject(&format!("n{i}"), Some("a"), "True", 60)));
        let decision = decide(&subjects, &policies, now());
        assert_eq!(names(&decision.repairs), ["gpu"], "the unmanaged node is counted, never repaired");
        assert_eq!(decision.repairs[0].condition, "AcceleratedHardwareReady");
        assert!(decide(&subjects, &[], now()).repairs.is_empty(), "no policies, no repair");
    }

    #[test]
    fn a_claim_already_going_is_only_hurried() {
        let mut subjects: Vec<Subject> =
            (0..5).map(|i| subject(&format!("n{i}"), Some("a"), "True", 60)).collect();
        let going = subject("going", Some("a"), "False", 40);
        let mut claim = (**going.claim.as_ref().unwrap()).clone();
        claim.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(now()));
        claim.annotations_mut().insert(
            ANNOTATION_NODECLAIM_TERMINATION_TIMESTAMP.into(),
            (now() + SignedDuration::from_hours(1)).to_string(),
        );
        subjects.push(Subject { node: going.node.clone(), claim: Some(Arc::new(claim.clone())) });
        let decision = decide(&subjects, &KUBELET_REPAIR_POLICIES, now());
        assert_eq!(names(&decision.repairs), ["going"], "a deadline an hour away is brought forward");
        assert!(decision.repairs[0].set_deadline);

        claim.annotations_mut().insert(
            ANNOTATION_NODECLAIM_TERMINATION_TIMESTAMP.into(),
            (now() - SignedDuration::from_mins(1)).to_string(),
        );
        let last = subjects.len() - 1;
        subjects[last].claim = Some(Arc::new(claim));
        let decision = decide(&subjects, &KUBELET_REPAIR_POLICIES, now());
        assert!(decision.repairs.is_empty(), "deleting, deadline passed: nothing left to do");
    }

    #[test]
    fn a_condition_without_a_transition_time_is_reported_not_acted_on() {
        let mut s = subject("odd", Some("a"), "False", 60);
        let mut node = (*s.node).clone();
        node.status.as_mut().unwrap().conditions.as_mut().unwrap()[0].last_transition_time = None;
        s.node = Arc::new(node);
        let subjects = [s, subject("ok", Some("a"), "True", 60)];
        let decision = decide(&subjects, &KUBELET_REPAIR_POLICIES, now());
        assert!(decision.repairs.is_empty() && decision.blocked.is_empty());
        assert_eq!(decision.untimed, [("odd".to_string(), "Ready".to_string())]);
    }
}

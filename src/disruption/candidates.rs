//! Whether a node may be disrupted voluntarily now, and if not, why: the checks upstream makes
//! before a node becomes a consolidation or drift candidate, with its messages (which become
//! `DisruptionBlocked` events).
//!
//! In order: the node must have a NodeClaim and a Node, be initialized, not be going away, not be
//! nominated for pending pods, not carry `karpenter.sh/do-not-disrupt: "true"`, and belong to a
//! NodePool that exists; then none of its pods may block: an active pod whose
//! `karpenter.sh/do-not-disrupt` is `"true"` or a duration not elapsed yet, or an evictable pod
//! that more than one PodDisruptionBudget selects, or whose one budget allows no disruption (a pod
//! that is not Ready under `unhealthyPodEvictionPolicy: AlwaysAllow` does not block). Drift of a
//! NodeClaim with a `terminationGracePeriod` skips the pod checks: the grace period bounds the wait.

use std::collections::BTreeSet;

use crate::apis::pod::Pod;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::jiff::Timestamp;

use crate::apis::labels::{ANNOTATION_DO_NOT_DISRUPT, LABEL_NODEPOOL};
use crate::scheduling::topology::Selector;
use crate::state::StateNode;
use crate::state::pods::{self, DoNotDisrupt};

use super::record::{Code, Why};
use super::surge;

/// Why a node is not a disruption candidate; its message is the text of its `DisruptionBlocked`
/// event.
pub type Blocked = Why;

/// A pod whose `karpenter.sh/do-not-disrupt` value is ignored, and why (an
/// `InvalidDoNotDisruptAnnotation` warning on the pod).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InvalidAnnotation {
    /// namespace/name of the pod.
    pub pod: String,
    /// What is wrong with the value.
    pub error: String,
}

/// What the checks found about one node.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Verdict {
    /// Why it may not be disrupted now; `None`: it is a candidate.
    pub blocked: Option<Blocked>,
    /// Pods whose do-not-disrupt annotation was ignored.
    pub invalid: Vec<InvalidAnnotation>,
    /// Whether the block lifts by itself with time (a nomination, a node still initializing, a
    /// do-not-disrupt duration), without any object changing.
    pub transient: bool,
}

/// Checks `node` at `now`. `pools` names the NodePools that exist; `pdbs` are the cluster's
/// PodDisruptionBudgets; `ignore_pods` skips the pod checks (drift of a NodeClaim with a
/// `terminationGracePeriod`).
pub fn check(
    node: &StateNode,
    pools: &BTreeSet<String>,
    pdbs: &[std::sync::Arc<PodDisruptionBudget>],
    ignore_pods: bool,
    now: Timestamp,
) -> Verdict {
    let mut verdict = Verdict::default();
    let blocked = |code: Code, s: String| Some(Why::new(code, s));
    verdict.blocked = if node.claim.is_none() {
        blocked(Code::NotManaged, "Node isn't managed by karpenter".into())
    } else if node.node.is_none() {
        blocked(Code::NoNode, "Nodeclaim does not have an associated node".into())
    } else if !node.initialized {
        blocked(Code::NotInitialized, "Node isn't initialized".into())
    } else if node.marked_for_deletion {
        blocked(Code::Deleting, "Node is deleting or marked for deletion".into())
    } else if node.nominated {
        blocked(Code::Nominated, "Node is nominated for a pending pod".into())
    } else if node_annotation(node, ANNOTATION_DO_NOT_DISRUPT) == Some("true") {
        blocked(
            Code::DoNotDisruptNode,
            format!("Disruption is blocked through the {ANNOTATION_DO_NOT_DISRUPT:?} annotation"),
        )
    } else if let Some(pool) = node.nodepool() {
        if pools.contains(pool) {
            None
        } else {
            blocked(Code::NodePoolNotFound, format!("NodePool not found (NodePool={pool})"))
        }
    } else {
        blocked(Code::NoNodePoolLabel, format!("Node doesn't have required label {LABEL_NODEPOOL:?}"))
    };
    verdict.transient = !node.initialized || node.nominated;
    if verdict.blocked.is_some() || ignore_pods {
        return verdict;
    }
    for pod in node.pods.iter().filter(|p| pods::is_active(p)) {
        match pods::do_not_disrupt(pod, now) {
            DoNotDisrupt::Active { until } => {
                verdict.transient = until.is_some();
                verdict.blocked = blocked(
                    Code::DoNotDisruptPod,
                    format!("Pod has {ANNOTATION_DO_NOT_DISRUPT:?} annotation (Pod={})", pods::key(pod)),
                );
                return verdict;
            }
            DoNotDisrupt::Invalid(error) => {
                verdict.invalid.push(InvalidAnnotation { pod: pods::key(pod), error })
            }
            DoNotDisrupt::No => {}
        }
    }
    for pod in node.pdb_relevant_pods(now) {
        if let Some(budgets) = blocking_pdbs(pod, pdbs) {
            // An opted-in workload is surged past its one budget when the drain gets to it.
            if surge_gets_past(pod, pdbs) {
                continue;
            }
            verdict.blocked = blocked(
                Code::PodDisruptionBudget,
                format!("Pdb prevents pod evictions (PodDisruptionBudget=[{}])", budgets.join(" ")),
            );
            return verdict;
        }
    }
    verdict
}

fn node_annotation<'a>(node: &'a StateNode, key: &str) -> Option<&'a str> {
    node.node.as_ref()?.metadata.annotations.as_ref()?.get(key).map(String::as_str)
}

/// Whether `pod` moves when its node is disrupted: not while its `karpenter.sh/do-not-disrupt`
/// holds, nor under a PodDisruptionBudget that never allows an eviction (`maxUnavailable: 0` or
/// `"0%"`, `minAvailable: "100%"`). Simulations make no room for pods that stay.
pub fn moves(pod: &Pod, pdbs: &[std::sync::Arc<PodDisruptionBudget>], now: Timestamp) -> bool {
    if matches!(pods::do_not_disrupt(pod, now), DoNotDisrupt::Active { .. }) {
        return false;
    }
    let namespace = pod.metadata.namespace.as_deref().unwrap_or_default();
    let labels = pod.metadata.labels.clone().unwrap_or_default();
    !pdbs.iter().filter(|b| b.metadata.namespace.as_deref().unwrap_or_default() == namespace).any(|b| {
        let Some(spec) = b.spec.as_ref() else { return false };
        let selects = Selector::new(spec.selector.as_ref(), &Default::default(), &[], &[]).matches(&labels);
        selects && is_fully_blocking(spec)
    })
}

fn is_fully_blocking(spec: &k8s_openapi::api::policy::v1::PodDisruptionBudgetSpec) -> bool {
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
    let zero = |v: &IntOrString| {
        matches!(v, IntOrString::Int(0))
            || matches!(v, IntOrString::String(s) if s.trim() == "0%" || s.trim() == "0")
    };
    let all = |v: &IntOrString| matches!(v, IntOrString::String(s) if s.trim() == "100%");
    spec.max_unavailable.as_ref().is_some_and(zero) || spec.min_available.as_ref().is_some_and(all)
}

/// The PodDisruptionBudgets that keep `pod` from being evicted now (namespace/name), if any:
/// all those that select it when there is more than one (the Eviction API refuses such pods), or
/// the one that allows no disruption.
pub fn blocking_pdbs(pod: &Pod, pdbs: &[std::sync::Arc<PodDisruptionBudget>]) -> Option<Vec<String>> {
    let namespace = pod.metadata.namespace.as_deref().unwrap_or_default();
    let selecting = selecting_pdbs(pod, pdbs);
    let name =
        |b: &PodDisruptionBudget| format!("{namespace}/{}", b.metadata.name.as_deref().unwrap_or_default());
    match selecting[..] {
        [] => None,
        [budget] => {
            let allowed = budget.status.as_ref().map(|s| s.disruptions_allowed).unwrap_or(0);
            let always_allow_unhealthy =
                budget.spec.as_ref().and_then(|s| s.unhealthy_pod_eviction_policy.as_deref())
                    == Some("AlwaysAllow");
            // An unhealthy pod may always be evicted under AlwaysAllow.
            let unhealthy_allowed = always_allow_unhealthy && !is_ready(pod);
            (allowed <= 0 && !unhealthy_allowed).then(|| vec![name(budget)])
        }
        _ => Some(selecting.iter().map(|b| name(b)).collect()),
    }
}

/// The PodDisruptionBudgets that select `pod`.
fn selecting_pdbs<'a>(
    pod: &Pod,
    pdbs: &'a [std::sync::Arc<PodDisruptionBudget>],
) -> Vec<&'a PodDisruptionBudget> {
    let namespace = pod.metadata.namespace.as_deref().unwrap_or_default();
    let labels = pod.metadata.labels.clone().unwrap_or_default();
    pdbs.iter()
        .filter(|b| b.metadata.namespace.as_deref().unwrap_or_default() == namespace)
        .filter(|b| {
            let selector = b.spec.as_ref().and_then(|s| s.selector.as_ref());
            Selector::new(selector, &Default::default(), &[], &[]).matches(&labels)
        })
        .map(|b| b.as_ref())
        .collect()
}

/// Whether a surge gets `pod` past its budget: it opted in ([`surge::surgeable`]), and one
/// budget selects it, which allows an eviction once there is one more healthy pod
/// ([`surge::surge_unblocks`]).
pub fn surge_gets_past(pod: &Pod, pdbs: &[std::sync::Arc<PodDisruptionBudget>]) -> bool {
    if !surge::surgeable(pod) {
        return false;
    }
    match selecting_pdbs(pod, pdbs)[..] {
        [budget] => surge::surge_unblocks(budget),
        _ => false,
    }
}

fn is_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use serde_json::json;

    use super::*;

    const NOW: &str = "2026-11-24T12:00:00Z";

    fn pod(name: &str, labels: serde_json::Value, annotations: serde_json::Value) -> Arc<Pod> {
        Arc::new(
            serde_json::from_value(json!({
                "metadata": {"name": name, "namespace": "ns", "labels": labels, "annotations": annotations, "uid": name},
                "spec": {"nodeName": "n", "containers": [{"name": "c"}]},
                "status": {"phase": "Running", "startTime": "2026-11-24T11:00:00Z",
                    "conditions": [{"type": "Ready", "status": "True"}]}
            }))
            .unwrap(),
        )
    }

    fn pdb(name: &str, app: &str, allowed: i32, policy: Option<&str>) -> Arc<PodDisruptionBudget> {
        Arc::new(
            serde_json::from_value(json!({
                "metadata": {"name": name, "namespace": "ns"},
                "spec": {"selector": {"matchLabels": {"app": app}}, "unhealthyPodEvictionPolicy": policy},
                "status": {"disruptionsAllowed": allowed, "currentHealthy": 1, "desiredHealthy": 1, "expectedPods": 1}
            }))
            .unwrap(),
        )
    }

    fn node(pods: Vec<Arc<Pod>>) -> StateNode {
        let claim = serde_json::from_value(json!({"metadata": {"name": "n"}, "spec": {"nodeClassRef":
            {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "c"}, "requirements": []}}))
        .unwrap();
        let k8s_node = serde_json::from_value(json!({"metadata": {"name": "n"}})).unwrap();
        StateNode {
            name: "n".into(),
            node: Some(Arc::new(k8s_node)),
            claim: Some(Arc::new(claim)),
            labels: [(LABEL_NODEPOOL.to_string(), "default".to_string())].into(),
            managed: true,
            initialized: true,
            pods,
            ..StateNode::default()
        }
    }

    fn check_now(node: &StateNode, pdbs: &[Arc<PodDisruptionBudget>], ignore_pods: bool) -> Verdict {
        check(node, &BTreeSet::from(["default".to_string()]), pdbs, ignore_pods, NOW.parse().unwrap())
    }

    fn blocked(node: &StateNode, pdbs: &[Arc<PodDisruptionBudget>]) -> Option<String> {
        check_now(node, pdbs, false).blocked.map(|b| b.message)
    }

    #[test]
    fn node_checks_in_upstream_order_with_its_messages() {
        let mut n = node(vec![]);
        assert_eq!(blocked(&n, &[]), None);
        n.nominated = true;
        n.marked_for_deletion = true;
        assert_eq!(blocked(&n, &[]).as_deref(), Some("Node is deleting or marked for deletion"));
        n.marked_for_deletion = false;
        assert_eq!(blocked(&n, &[]).as_deref(), Some("Node is nominated for a pending pod"));
        n.nominated = false;
        n.initialized = false;
        assert_eq!(blocked(&n, &[]).as_deref(), Some("Node isn't initialized"));
        n.initialized = true;
        let mut annotated = (**n.node.as_ref().unwrap()).clone();
        annotated.metadata.annotations =
            Some([(ANNOTATION_DO_NOT_DISRUPT.to_string(), "true".to_string())].into());
        n.node = Some(Arc::new(annotated));
        assert_eq!(
            blocked(&n, &[]).as_deref(),
            Some("Disruption is blocked through the \"karpenter.sh/do-not-disrupt\" annotation")
        );
        n.node = None;
        assert_eq!(blocked(&n, &[]).as_deref(), Some("Nodeclaim does not have an associated node"));
        let mut orphan = node(vec![]);
        orphan.labels.to_mut().insert(LABEL_NODEPOOL.into(), "gone".into());
        assert_eq!(blocked(&orphan, &[]).as_deref(), Some("NodePool not found (NodePool=gone)"));
    }

    #[test]
    fn do_not_disrupt_pods_block_and_invalid_values_are_reported() {
        let forever = pod("a", json!({}), json!({ANNOTATION_DO_NOT_DISRUPT: "true"}));
        assert_eq!(
            blocked(&node(vec![forever]), &[]).as_deref(),
            Some("Pod has \"karpenter.sh/do-not-disrupt\" annotation (Pod=ns/a)")
        );
        // Started an hour ago: 30m has elapsed, 2h has not.
        let elapsed = pod("b", json!({}), json!({ANNOTATION_DO_NOT_DISRUPT: "30m"}));
        assert_eq!(blocked(&node(vec![elapsed]), &[]), None);
        let within = pod("c", json!({}), json!({ANNOTATION_DO_NOT_DISRUPT: "2h"}));
        assert!(blocked(&node(vec![within]), &[]).is_some());
        let invalid = pod("d", json!({}), json!({ANNOTATION_DO_NOT_DISRUPT: "soon"}));
        let verdict = check_now(&node(vec![invalid]), &[], false);
        assert_eq!(verdict.blocked, None);
        assert_eq!(verdict.invalid.len(), 1);
        assert_eq!(verdict.invalid[0].pod, "ns/d");
        // Drift of a claim with a grace period ignores them.
        let forever = pod("a", json!({}), json!({ANNOTATION_DO_NOT_DISRUPT: "true"}));
        assert_eq!(check_now(&node(vec![forever]), &[], true).blocked, None);
    }

    #[test]
    fn an_opted_in_replica_set_under_one_budget_does_not_block() {
        let solo = |annotations: serde_json::Value, kind: &str| {
            let mut p = (*pod("solo-1", json!({"app": "solo"}), annotations)).clone();
            p.metadata.owner_references = Some(vec![
                serde_json::from_value(json!({"apiVersion": "apps/v1",
                "kind": kind, "name": "solo", "uid": "rs", "controller": true}))
                .unwrap(),
            ]);
            Arc::new(p)
        };
        let opted = json!({surge::ANNOTATION_SURGE_ON_DISRUPTION: "true"});
        let budget = |spec: serde_json::Value| -> Arc<PodDisruptionBudget> {
            let mut b = (*pdb("solo", "solo", 0, None)).clone();
            let extra: k8s_openapi::api::policy::v1::PodDisruptionBudgetSpec =
                serde_json::from_value(spec).unwrap();
            let spec = b.spec.get_or_insert_default();
            spec.min_available = extra.min_available;
            spec.max_unavailable = extra.max_unavailable;
            Arc::new(b)
        };
        let min_one = budget(json!({"minAvailable": 1}));
        assert_eq!(
            blocked(&node(vec![solo(opted.clone(), "ReplicaSet")]), std::slice::from_ref(&min_one)),
            None
        );
        // Without the opt-in, for a StatefulSet, under a budget that never allows an eviction,
        // or under two budgets, it blocks as upstream.
        let blocks = |p: Arc<Pod>, pdbs: &[Arc<PodDisruptionBudget>]| blocked(&node(vec![p]), pdbs).is_some();
        assert!(blocks(solo(json!({}), "ReplicaSet"), std::slice::from_ref(&min_one)));
        assert!(blocks(solo(opted.clone(), "StatefulSet"), std::slice::from_ref(&min_one)));
        assert!(blocks(solo(opted.clone(), "ReplicaSet"), &[budget(json!({"maxUnavailable": 0}))]));
        let second = Arc::new(PodDisruptionBudget {
            metadata: kube::api::ObjectMeta { name: Some("other".into()), ..min_one.metadata.clone() },
            ..(*min_one).clone()
        });
        assert!(blocks(solo(opted, "ReplicaSet"), &[min_one, second]));
    }

    #[rstest::rstest]
    #[case::free(json!({"maxUnavailable": 1}), true)]
    #[case::max_unavailable_zero(json!({"maxUnavailable": 0}), false)]
    #[case::max_unavailable_zero_percent(json!({"maxUnavailable": "0%"}), false)]
    #[case::min_available_all(json!({"minAvailable": "100%"}), false)]
    #[case::min_available_some(json!({"minAvailable": "50%"}), true)]
    fn pods_under_fully_blocking_pdbs_do_not_move(#[case] spec: serde_json::Value, #[case] moves_: bool) {
        let web = pod("web-1", json!({"app": "web"}), json!({}));
        let mut v = json!({"metadata": {"name": "web", "namespace": "ns"},
            "spec": {"selector": {"matchLabels": {"app": "web"}}}});
        for (k, val) in spec.as_object().unwrap() {
            v["spec"][k] = val.clone();
        }
        let budget: Arc<PodDisruptionBudget> = Arc::new(serde_json::from_value(v).unwrap());
        let now = NOW.parse().unwrap();
        assert_eq!(moves(&web, std::slice::from_ref(&budget), now), moves_);
        // Another namespace's budget does not hold it.
        let mut elsewhere = (*budget).clone();
        elsewhere.metadata.namespace = Some("other".into());
        assert!(moves(&web, &[Arc::new(elsewhere)], now));
        // A pod whose do-not-disrupt holds stays without any budget.
        let pinned = pod("pinned", json!({}), json!({"karpenter.sh/do-not-disrupt": "true"}));
        assert!(!moves(&pinned, &[], now));
    }

    #[test]
    fn pdbs_that_allow_nothing_or_overlap_block() {
        let web = pod("web-1", json!({"app": "web"}), json!({}));
        assert_eq!(blocked(&node(vec![web.clone()]), &[pdb("web", "web", 1, None)]), None);
        assert_eq!(
            blocked(&node(vec![web.clone()]), &[pdb("web", "web", 0, None)]).as_deref(),
            Some("Pdb prevents pod evictions (PodDisruptionBudget=[ns/web])")
        );
        assert_eq!(
            blocked(&node(vec![web.clone()]), &[pdb("a", "web", 1, None), pdb("b", "web", 1, None)])
                .as_deref(),
            Some("Pdb prevents pod evictions (PodDisruptionBudget=[ns/a ns/b])")
        );
        assert_eq!(blocked(&node(vec![web.clone()]), &[pdb("other", "db", 0, None)]), None);
        // A pod that is not Ready does not block under AlwaysAllow.
        let mut sick = (*web).clone();
        sick.status.as_mut().unwrap().conditions =
            Some(vec![serde_json::from_value(json!({"type": "Ready", "status": "False"})).unwrap()]);
        let sick = Arc::new(sick);
        assert_eq!(blocked(&node(vec![sick.clone()]), &[pdb("web", "web", 0, Some("AlwaysAllow"))]), None);
        assert!(blocked(&node(vec![sick]), &[pdb("web", "web", 0, None)]).is_some());
    }
}

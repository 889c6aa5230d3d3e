//! Pods that left a node going away before their successor shows: each keeps its place in the
//! provisioner's and the disruption controller's passes as a *stand-in* until it does.
//!
//! When a node is drained, an evicted pod is in neither place for a moment: deleted from the
//! node, and its controller's new pod not created yet (or not seen yet). A pass that looks then
//! sizes the capacity for the node's pods one short; if the cloud launches a type that holds
//! exactly what was asked, the successor needs a second node, and the node that expired is
//! replaced twice; and a disruption pass that looks then sees the room the pod is about to take
//! on a replacement as free, and deletes another node whose pods then need a new one. So a
//! deleted pod that:
//! - was bound to a node that was already going away when the pod was deleted (the node or its
//!   NodeClaim being deleted, or the node tainted `karpenter.sh/disrupted`, as every drain does
//!   first; or the node gone), and still is,
//! - has a controller (ReplicaSet, Job, StatefulSet...) that will make another one, and
//! - was neither finished nor a DaemonSet or mirror pod,
//!
//! is placed again, as an unbound copy, until a pod of the same controller created after it is
//! seen (each successor answers for one departure; one created in the same second must be
//! unbound; one on a node going away must have been created once the pod's deletion was asked
//! for), or for at most [`TTL`] (a workload scaled down during the drain has no successor).
//! A pod deleted from a node that was staying (a workload scaled down, a pod deleted by hand) is
//! no departure, even if its node goes away a moment later: its room is not needed again.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};

use crate::apis::pod::Pod;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::jiff::{SignedDuration, Timestamp};

use crate::apis::NodeClaim;
use crate::apis::labels::TAINT_DISRUPTED;
use crate::apis::nodeclaim::conditions::INSTANCE_TERMINATING;
use crate::state::pods;
use crate::state::{ClusterState, Notice, Registration, StateNode};

/// How long a departed pod stands in at most; its controller makes the successor within a
/// second or two.
pub const TTL: SignedDuration = SignedDuration::from_secs(30);

/// Prefix of a stand-in's uid (the pod's own uid follows).
pub const STAND_IN_UID_PREFIX: &str = "stand-in-";

#[derive(Debug)]
struct Departure {
    pod: Arc<Pod>,
    /// Uid of the pod's controller.
    owner: String,
    /// The node it was bound to.
    node: String,
    /// When the pod was created: its successor is created after it. (Not its deletion time: a
    /// graceful deletion ends with a second, immediate one that moves the deletion timestamp past
    /// the successor's creation.) A sibling created later may answer for it too; that errs towards
    /// no stand-in, as before stand-ins existed, never towards two places for one pod.
    since: Timestamp,
    /// When the watch reported it deleted.
    noted: Timestamp,
    /// When its deletion was asked for, as far as the deleted object tells (its deletion timestamp
    /// less its grace period), at most `noted`: a pod of the same controller created since is its
    /// successor even where it sits on a node going away itself (see [`Departures::stand_ins`]).
    deletion_asked: Timestamp,
}

/// The departed pods not answered by a successor yet, and the successors already taken.
#[derive(Debug, Default)]
pub struct Departures {
    /// By the departed pod's uid.
    gone: HashMap<String, Departure>,
    /// Uids of pods taken as a successor (never taken twice).
    successors: HashSet<String>,
}

/// The uid of `pod`'s controller, if it has one.
fn controller_uid(pod: &Pod) -> Option<&str> {
    pod.metadata
        .owner_references
        .as_ref()?
        .iter()
        .find(|o| o.controller == Some(true))
        .map(|o| o.uid.as_str())
}

/// Whether the node `name` is going away, as the cache shows it (see [`going_away`]).
pub fn node_going_away(state: &ClusterState, name: &str) -> bool {
    let node = state.node(name);
    let claim = node
        .as_ref()
        .and_then(|n| n.spec.as_ref()?.provider_id.as_deref())
        .and_then(|id| state.nodeclaim_with_provider_id(id));
    going_away(node.as_deref(), claim.as_deref())
}

/// Whether a node (`None`: gone) with its NodeClaim is going away: the node gone or being
/// deleted, or its NodeClaim being deleted or its instance terminating (as a snapshot's
/// `marked_for_deletion` has it), or the node tainted `karpenter.sh/disrupted` (a decision of
/// this process to delete it, which the cache shows as the taint every drain starts with).
pub fn going_away(node: Option<&Node>, claim: Option<&NodeClaim>) -> bool {
    let Some(node) = node else { return true };
    let tainted = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|t| t.iter().any(|t| t.key == TAINT_DISRUPTED));
    node.metadata.deletion_timestamp.is_some()
        || tainted
        || claim.is_some_and(|c| c.metadata.deletion_timestamp.is_some() || c.is_true(INSTANCE_TERMINATING))
}

/// The departures the pod watch of `state` reports into: each deleted pod is noted with whether
/// its node is going away in the cache then. Reporting stops when the registration is dropped.
pub fn follow(state: &ClusterState) -> (Arc<Mutex<Departures>>, Registration) {
    let departures = Arc::new(Mutex::new(Departures::default()));
    let registration = {
        let (departures, cache) = (departures.clone(), state.clone());
        state.on_pod(move |notice| {
            if let Notice::Deleted(pod) = notice {
                let going = pods::node_name(pod).is_some_and(|node| node_going_away(&cache, node));
                departures.lock().unwrap_or_else(PoisonError::into_inner).deleted(
                    pod,
                    going,
                    Timestamp::now(),
                );
            }
        })
    };
    (departures, registration)
}

impl Departures {
    /// Notes that the watch saw `pod` deleted at `now`, its node `going_away` or not then; kept
    /// only if it may have a successor (see the module's documentation).
    pub fn deleted(&mut self, pod: &Pod, going_away: bool, now: Timestamp) {
        let (Some(uid), Some(node), Some(owner)) =
            (pod.metadata.uid.as_deref(), pods::node_name(pod), controller_uid(pod))
        else {
            return;
        };
        if !going_away || pods::is_terminal(pod) || pods::is_owned_by_daemonset(pod) || pods::is_mirror(pod) {
            return;
        }
        let since = pod.metadata.creation_timestamp.as_ref().map_or(now, |t| t.0).min(now);
        let grace = SignedDuration::from_secs(pod.metadata.deletion_grace_period_seconds.unwrap_or(0));
        let deletion_asked = pod
            .metadata
            .deletion_timestamp
            .as_ref()
            .and_then(|t| t.0.checked_sub(grace).ok())
            .map_or(now, |asked| asked.min(now));
        self.gone.entry(uid.to_string()).or_insert_with(|| Departure {
            pod: Arc::new(pod.clone()),
            owner: owner.to_string(),
            node: node.to_string(),
            since,
            noted: now,
            deletion_asked,
        });
    }

    /// How many departures wait for a successor.
    pub fn len(&self) -> usize {
        self.gone.len()
    }

    /// Whether no departure waits for a successor.
    pub fn is_empty(&self) -> bool {
        self.gone.is_empty()
    }

    /// The stand-ins of a pass over `nodes` and `pods` (every pod of the snapshot) at `now`:
    /// departures from nodes that are not going away are dropped, as are those older than [`TTL`]
    /// and those whose successor `pods` show.
    pub fn stand_ins(&mut self, nodes: &[StateNode], pods: &[Arc<Pod>], now: Timestamp) -> Vec<Arc<Pod>> {
        let live: HashSet<&str> = pods.iter().filter_map(|p| p.metadata.uid.as_deref()).collect();
        self.successors.retain(|uid| live.contains(uid.as_str()));
        if self.gone.is_empty() {
            return Vec::new();
        }
        let staying: HashSet<&str> =
            nodes.iter().filter(|n| !n.marked_for_deletion).map(|n| n.name.as_str()).collect();
        self.gone.retain(|_, d| now.duration_since(d.noted) <= TTL && !staying.contains(d.node.as_str()));

        let going: HashSet<&str> =
            nodes.iter().filter(|n| n.marked_for_deletion).map(|n| n.name.as_str()).collect();
        let owners: HashSet<&str> = self.gone.values().map(|d| d.owner.as_str()).collect();
        let mut candidates: HashMap<&str, Vec<(&Pod, bool)>> = HashMap::new();
        for pod in pods {
            let Some(owner) = controller_uid(pod).filter(|o| owners.contains(o)) else { continue };
            let on_going = pods::node_name(pod).is_some_and(|n| going.contains(n));
            let taken = pod.metadata.uid.as_ref().is_none_or(|uid| self.successors.contains(uid));
            if pods::is_active(pod) && !taken {
                candidates.entry(owner).or_default().push((pod, on_going));
            }
        }
        let mut order: Vec<(Timestamp, String)> =
            self.gone.iter().map(|(uid, d)| (d.since, uid.clone())).collect();
        order.sort();
        for (since, uid) in order {
            let Some((owner, asked)) = self.gone.get(&uid).map(|d| (d.owner.clone(), d.deletion_asked))
            else {
                continue;
            };
            let Some(pool) = candidates.get_mut(owner.as_str()) else { continue };
            // Creation times are whole seconds: a pod created in the same second as the departed
            // one answers for it only while it has no node, as a successor does (a sibling made
            // with it and running elsewhere does not), so that a pod replaced within the second
            // it was created in is not placed twice, its successor and a stand-in. A pod on a node
            // going away answers only if it was created once the departed pod's deletion was asked
            // for: then it is the successor, landed before its own node started going (it is
            // placed as that node's pod; a stand-in beside it would place the one pod twice);
            // otherwise it is a sibling still to be evicted, whose place is counted already.
            let asked_second = asked.as_second();
            let answers = |(p, on_going): &(&Pod, bool)| {
                p.metadata.creation_timestamp.as_ref().is_some_and(|c| match on_going {
                    true => c.0.as_second() >= asked_second,
                    false => c.0 > since || (c.0 == since && pods::node_name(p).is_none()),
                })
            };
            if let Some(at) = pool.iter().position(answers) {
                let (successor, _) = pool.swap_remove(at);
                if let Some(s) = successor.metadata.uid.clone() {
                    self.successors.insert(s);
                }
                self.gone.remove(&uid);
            }
        }
        let mut stand_ins: Vec<(Timestamp, Arc<Pod>)> =
            self.gone.iter().map(|(uid, d)| (d.since, Arc::new(stand_in(&d.pod, uid)))).collect();
        stand_ins.sort_by_key(|(since, _)| *since);
        stand_ins.into_iter().map(|(_, pod)| pod).collect()
    }
}

/// An unbound, live copy of the departed `pod`, under its own uid.
fn stand_in(pod: &Pod, uid: &str) -> Pod {
    let mut copy = pod.clone();
    copy.metadata.uid = Some(format!("{STAND_IN_UID_PREFIX}{uid}"));
    copy.metadata.deletion_timestamp = None;
    copy.metadata.deletion_grace_period_seconds = None;
    copy.metadata.resource_version = None;
    if let Some(spec) = copy.spec.as_mut() {
        spec.node_name = None;
    }
    copy.status = None;
    copy
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use serde_json::json;

    use super::*;
    use crate::scheduling::{InstanceType, Offering, Requirements, Resources, schedule};
    use crate::state::Snapshot;
    use crate::state::input::{Scenario, scheduling_input};
    use crate::state::statenode::state_nodes;

    fn at(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    fn pod(name: &str, node: Option<&str>, owner: Option<&str>, created: &str) -> Pod {
        let mut v = json!({"metadata": {"name": name, "namespace": "ns", "uid": name, "creationTimestamp": created},
            "spec": {"containers": [{"name": "c"}], "terminationGracePeriodSeconds": 0},
            "status": {"phase": "Running"}});
        if let Some(n) = node {
            v["spec"]["nodeName"] = json!(n);
        } else {
            v["status"] = json!({"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]});
        }
        if let Some(o) = owner {
            v["metadata"]["ownerReferences"] = json!([{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": o, "uid": o, "controller": true}]);
        }
        serde_json::from_value(v).unwrap()
    }

    /// `pod` as the watch reports it deleted: evicted with no grace period at `when`.
    fn evicted(mut pod: Pod, when: &str) -> Pod {
        pod.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(at(when)));
        pod.metadata.deletion_grace_period_seconds = Some(0);
        pod
    }

    fn node(
        name: &str,
        instance_type: &str,
        pods: i64,
        deleting: bool,
    ) -> Arc<k8s_openapi::api::core::v1::Node> {
        let mut v = json!({"metadata": {"name": name, "labels": {"karpenter.sh/nodepool": "default",
                "karpenter.sh/initialized": "true", "node.kubernetes.io/instance-type": instance_type}},
            "spec": {"providerID": format!("kwok://{name}")},
            "status": {"allocatable": {"cpu": "2", "pods": pods.to_string()}, "capacity": {"cpu": "2", "pods": pods.to_string()}}});
        if deleting {
            v["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
        }
        Arc::new(serde_json::from_value(v).unwrap())
    }

    fn it(name: &str, pods: i64, price: f64) -> Arc<InstanceType> {
        Arc::new(InstanceType::new(
            name,
            Requirements::from_labels(&BTreeMap::from([(
                "node.kubernetes.io/instance-type".to_string(),
                name.to_string(),
            )])),
            Resources::from_pairs([("cpu", 2000), ("pods", pods)]),
            Default::default(),
            vec![Offering::new("z", "on-demand", price, true)],
        ))
    }

    fn snapshot(nodes: Vec<Arc<k8s_openapi::api::core::v1::Node>>, pods: Vec<Pod>) -> Snapshot {
        let pool: crate::apis::NodePool = serde_json::from_value(json!({"apiVersion": "karpenter.sh/v1", "kind": "NodePool",
            "metadata": {"name": "default"},
            "spec": {"template": {"spec": {"nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "default"},
                "requirements": []}}}}))
        .unwrap();
        // "nano" holds 4 pods and is the cheapest; "small" holds 11.
        Snapshot {
            nodes,
            pods: pods.into_iter().map(Arc::new).collect(),
            nodepools: vec![Arc::new(pool)],
            ..Default::default()
        }
        .with_instance_types(
            [("default".to_string(), vec![it("nano", 4, 0.0042), it("small", 11, 0.0168)])].into(),
        )
    }

    const CREATED: &str = "2026-01-01T00:00:00Z";

    #[test]
    fn an_evicted_pod_keeps_its_place_on_the_replacement_until_its_successor_shows() {
        let on_a = |n: &str| pod(n, Some("a"), Some("rs-1"), CREATED);
        let mut departures = Departures::default();
        // Node `a` expired and is being drained; p1 was evicted, its successor is not there yet.
        departures.deleted(&evicted(on_a("p1"), "2026-01-01T00:10:00Z"), true, at("2026-01-01T00:10:00Z"));
        let s = snapshot(
            vec![node("a", "small", 11, true)],
            vec![on_a("p2"), on_a("p3"), on_a("p4"), on_a("p5")],
        );
        let nodes = state_nodes(&s);
        let stand_ins = departures.stand_ins(&nodes, &s.pods, at("2026-01-01T00:10:01Z"));
        assert_eq!(stand_ins.len(), 1);
        let plan = |stand_ins: Vec<Arc<Pod>>, s: &Snapshot| {
            let nodes = state_nodes(s);
            let scenario = Scenario { stand_ins, ..Scenario::default() };
            schedule(&scheduling_input(s, &nodes, s.provisionable_pods(), &scenario).input)
        };
        let results = plan(stand_ins, &s);
        assert_eq!(results.new_node_claims.len(), 1);
        let replacement = &results.new_node_claims[0];
        assert_eq!(
            replacement.requests.get("pods"),
            5,
            "sized for every pod the node had, not the four left on it"
        );
        assert_eq!(replacement.instance_type_names, ["small"], "no type that holds only four");
        // Without the stand-in the replacement is a 4-pod type, and the successor needs another.
        let undersized = plan(vec![], &s);
        assert_eq!(undersized.new_node_claims[0].requests.get("pods"), 4);
        assert_eq!(undersized.new_node_claims[0].instance_type_names[0], "nano", "launched as the cheapest");

        // The successor is pending: the stand-in is released, and once the replacement `b` is up
        // every pod fits on it.
        let successor = pod("p1x", None, Some("rs-1"), "2026-01-01T00:10:01Z");
        let s = snapshot(
            vec![node("a", "small", 11, true), node("b", "small", 11, false)],
            vec![on_a("p2"), on_a("p3"), on_a("p4"), on_a("p5"), successor],
        );
        let stand_ins = departures.stand_ins(&state_nodes(&s), &s.pods, at("2026-01-01T00:10:02Z"));
        assert!(stand_ins.is_empty());
        assert!(departures.is_empty());
        let results = plan(stand_ins, &s);
        assert!(results.new_node_claims.is_empty(), "one replacement, not two");
        assert!(results.errors.is_empty());
    }

    #[test]
    fn only_pods_that_will_come_back_from_nodes_going_away_stand_in() {
        let mut departures = Departures::default();
        let now = at("2026-01-01T00:10:00Z");
        // A bare pod has no successor; a finished Job pod none either; a pod of a node that stays
        // was deleted for another reason (a scale-down).
        departures.deleted(
            &evicted(pod("bare", Some("a"), None, CREATED), "2026-01-01T00:10:00Z"),
            true,
            now,
        );
        let mut done = pod("done", Some("a"), Some("job"), CREATED);
        done.status = Some(serde_json::from_value(json!({"phase": "Succeeded"})).unwrap());
        departures.deleted(&evicted(done, "2026-01-01T00:10:00Z"), true, now);
        assert!(departures.is_empty());
        departures.deleted(
            &evicted(pod("scaled", Some("c"), Some("rs-1"), CREATED), "2026-01-01T00:10:00Z"),
            true,
            now,
        );
        departures.deleted(
            &evicted(pod("p1", Some("a"), Some("rs-1"), CREATED), "2026-01-01T00:10:00Z"),
            true,
            now,
        );
        let s = snapshot(vec![node("a", "small", 11, true), node("c", "small", 11, false)], vec![]);
        let stand_ins = departures.stand_ins(&state_nodes(&s), &s.pods, now);
        assert_eq!(stand_ins.len(), 1);
        let copy = &stand_ins[0];
        assert_eq!(copy.metadata.uid.as_deref(), Some("stand-in-p1"));
        assert!(pods::node_name(copy).is_none() && pods::is_active(copy));
        // A node gone from the cluster is gone away too; a departure is forgotten after the TTL.
        let s = snapshot(vec![], vec![]);
        assert_eq!(departures.stand_ins(&state_nodes(&s), &s.pods, now + TTL).len(), 1);
        let later = now + TTL + SignedDuration::from_secs(1);
        assert!(departures.stand_ins(&state_nodes(&s), &s.pods, later).is_empty());
    }

    #[test]
    fn a_pod_deleted_from_a_node_that_was_staying_never_stands_in() {
        // A Deployment scaled to zero: its pods are deleted while their nodes stay; a moment
        // later the nodes are deleted (by hand, or as empty). Nothing is to come back.
        let mut departures = Departures::default();
        let now = at("2026-01-01T00:10:00Z");
        for name in ["s1", "s2"] {
            departures.deleted(
                &evicted(pod(name, Some("a"), Some("rs-1"), CREATED), "2026-01-01T00:10:00Z"),
                false,
                now,
            );
        }
        assert!(departures.is_empty());
        let s = snapshot(vec![node("a", "small", 11, true)], vec![]);
        assert!(
            departures.stand_ins(&state_nodes(&s), &s.pods, now + SignedDuration::from_secs(1)).is_empty()
        );
    }

    #[test]
    fn a_node_is_going_away_once_tainted_or_deleted_or_gone() {
        let node = |v: serde_json::Value| -> Node { serde_json::from_value(v).unwrap() };
        let claim = |v: serde_json::Value| -> NodeClaim { serde_json::from_value(v).unwrap() };
        let plain = node(json!({"metadata": {"name": "a"}, "spec": {"providerID": "kwok://a",
            "taints": [{"key": "karpenter.sh/unregistered", "effect": "NoExecute"}]}}));
        let live_claim = claim(json!({"metadata": {"name": "a"}, "spec": {"nodeClassRef":
            {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "c"}, "requirements": []}}));
        assert!(!going_away(Some(&plain), Some(&live_claim)), "a node that stays");
        assert!(!going_away(Some(&plain), None), "a node of no NodeClaim that stays");
        assert!(going_away(None, None), "gone");
        let mut tainted = plain.clone();
        tainted.spec.as_mut().unwrap().taints.as_mut().unwrap().push(
            serde_json::from_value(json!({"key": "karpenter.sh/disrupted", "effect": "NoSchedule"})).unwrap(),
        );
        assert!(going_away(Some(&tainted), Some(&live_claim)), "tainted, as every drain starts");
        let mut deleting = plain.clone();
        deleting.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(at(CREATED)));
        assert!(going_away(Some(&deleting), None));
        let mut claim_deleting = live_claim.clone();
        claim_deleting.metadata.deletion_timestamp = deleting.metadata.deletion_timestamp.clone();
        assert!(going_away(Some(&plain), Some(&claim_deleting)), "its NodeClaim deleted");
    }

    #[test]
    fn each_successor_answers_for_one_departure_and_older_pods_for_none() {
        let mut departures = Departures::default();
        let on_a = |n: &str| pod(n, Some("a"), Some("rs-1"), CREATED);
        departures.deleted(&evicted(on_a("p1"), "2026-01-01T00:10:00Z"), true, at("2026-01-01T00:10:00Z"));
        departures.deleted(&evicted(on_a("p2"), "2026-01-01T00:10:05Z"), true, at("2026-01-01T00:10:05Z"));
        // One successor, created after both; a sibling on another node created long before.
        let s = snapshot(
            vec![node("a", "small", 11, true), node("b", "small", 11, false)],
            vec![
                pod("p1x", None, Some("rs-1"), "2026-01-01T00:10:05Z"),
                pod("old", Some("b"), Some("rs-1"), CREATED),
            ],
        );
        let now = at("2026-01-01T00:10:06Z");
        let stand_ins = departures.stand_ins(&state_nodes(&s), &s.pods, now);
        assert_eq!(stand_ins.iter().map(|p| p.metadata.name.clone().unwrap()).collect::<Vec<_>>(), ["p2"]);
        // The next pass does not take the same successor for the other departure.
        assert_eq!(departures.stand_ins(&state_nodes(&s), &s.pods, now).len(), 1);
        // A pod evicted with a grace period of 30 s: its successor came at the eviction (00:10:00);
        // the kubelet's final deletion, 30 s later, moved the deletion timestamp to 00:10:30 with
        // a grace period of 0, past the successor's creation.
        let graceful = evicted(pod("g", Some("a"), Some("rs-2"), CREATED), "2026-01-01T00:10:30Z");
        departures.deleted(&graceful, true, at("2026-01-01T00:10:30Z"));
        let s = snapshot(
            vec![node("a", "small", 11, true)],
            vec![pod("gx", None, Some("rs-2"), "2026-01-01T00:10:00Z")],
        );
        let names: Vec<String> = departures
            .stand_ins(&state_nodes(&s), &s.pods, at("2026-01-01T00:10:30Z"))
            .iter()
            .map(|p| p.metadata.name.clone().unwrap())
            .collect();
        assert_eq!(names, ["p2"], "gx answers for g");
    }

    #[test]
    fn a_successor_on_a_node_that_went_away_since_answers_and_an_older_sibling_there_does_not() {
        let mut departures = Departures::default();
        // p1 was evicted from `a` at 00:10:00; its successor landed on `b` at once. Before any
        // pass looked, `b` started going away too (its own drift, say): the successor is one of
        // b's pods to place now, and a stand-in beside it would place p1 twice.
        departures.deleted(
            &evicted(pod("p1", Some("a"), Some("rs-1"), CREATED), "2026-01-01T00:10:00Z"),
            true,
            at("2026-01-01T00:10:00Z"),
        );
        // A sibling created after p1 but before the eviction, on `c`, also going away: it is
        // still to be evicted, no successor.
        let sibling = pod("sibling", Some("c"), Some("rs-1"), "2026-01-01T00:05:00Z");
        let nodes = || vec![node("b", "small", 11, true), node("c", "small", 11, true)];
        let now = at("2026-01-01T00:10:03Z");
        let s = snapshot(nodes(), vec![sibling.clone()]);
        assert_eq!(
            departures.stand_ins(&state_nodes(&s), &s.pods, now).len(),
            1,
            "the sibling answers for none"
        );
        let successor = pod("p1x", Some("b"), Some("rs-1"), "2026-01-01T00:10:00Z");
        let s = snapshot(nodes(), vec![sibling, successor]);
        assert!(departures.stand_ins(&state_nodes(&s), &s.pods, now).is_empty(), "p1x answers for p1");
        assert!(departures.is_empty());
    }

    #[test]
    fn a_pod_replaced_within_the_second_it_was_created_in_is_answered_by_its_unbound_successor() {
        const SECOND: &str = "2026-01-01T00:10:00Z";
        let mut departures = Departures::default();
        // p1 was created, interrupted and evicted within one second; its successor shows in the
        // same second, pending. A sibling made with p1 runs on a node that stays.
        departures.deleted(&evicted(pod("p1", Some("a"), Some("rs-1"), SECOND), SECOND), true, at(SECOND));
        let sibling = pod("sibling", Some("b"), Some("rs-1"), SECOND);
        let nodes = || vec![node("a", "small", 11, true), node("b", "small", 11, false)];
        let s = snapshot(nodes(), vec![sibling.clone()]);
        let now = at("2026-01-01T00:10:00.5Z");
        let stand_ins = departures.stand_ins(&state_nodes(&s), &s.pods, now);
        assert_eq!(stand_ins.len(), 1, "a running sibling made in the same second answers for none");
        let s = snapshot(nodes(), vec![sibling, pod("p1x", None, Some("rs-1"), SECOND)]);
        assert!(departures.stand_ins(&state_nodes(&s), &s.pods, now).is_empty(), "p1x answers for p1");
        assert!(departures.is_empty());
    }
}

//! The one function that turns a snapshot into the scheduler's input: the provisioner, `karpenter
//! simulate` and disruption all call [`scheduling_input`], so they all see the same cluster.
//!
//! What it decides:
//! - **Pods to place**: the given pending pods, plus the reschedulable pods of every node that
//!   is going away (marked for deletion, being deleted) or that the scenario leaves out (a
//!   disruption's candidates), so that their capacity is found before they are evicted.
//! - **Existing capacity**: every other node, in-flight NodeClaims included, with the requests of
//!   its pods plus the DaemonSet pods that will still come to it (a node not initialized yet, or
//!   a NodeClaim not registered, runs none of them yet but will).
//! - **NodePools**: those not being deleted whose instance types are known, with their limits
//!   minus the capacity of all their nodes (see [`super::usage`]).

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use crate::apis::pod::Pod;

use crate::apis::common::Operator;
use crate::apis::labels::LABEL_CAPACITY_RESERVATION_ID;
use crate::scheduling::{
    ExistingNode, NodePoolInput, Requirements, SchedulerOptions, SchedulingInput, daemonsets,
};
use crate::util::error_chain;

use super::snapshot::{self, Snapshot};
use super::statenode::StateNode;
use super::usage::{Counted, nodepool_usage};

/// How a simulation departs from the cluster as it is.
#[derive(Clone, Debug, Default)]
pub struct Scenario {
    /// Names of StateNodes to simulate without (a disruption's candidates): their reschedulable
    /// pods need a place.
    pub without: HashSet<String>,
    /// Pods to place as well, after all the others: the provisioner's stand-ins for pods that
    /// left a node going away and whose successor is not seen yet.
    pub stand_ins: Vec<Arc<Pod>>,
    /// Scheduler tunables.
    pub options: SchedulerOptions,
}

/// The scheduler's input, and the NodePools left out of it with the reason.
#[derive(Clone, Debug, Default)]
pub struct Built {
    /// The input.
    pub input: SchedulingInput,
    /// NodePools that could not be used: `(name, why)`.
    pub skipped_pools: Vec<(String, String)>,
    /// How many of the input's pods come from nodes going away or left out, or stand in for
    /// pods that left a node going away (they follow the pending pods in
    /// [`SchedulingInput::pods`]).
    pub displaced_pods: usize,
}

/// An existing node as the scheduler sees it: the requests of its pods, plus what the DaemonSet
/// pods that will run there and are not running yet will take.
pub fn existing_node(node: &StateNode, daemonset_pods: &[Pod]) -> ExistingNode {
    let requirements = Requirements::from_labels(&node.labels);
    let expected = daemonsets::overhead(daemonset_pods, &requirements, &node.effective_taints());
    let mut requested = node.pod_requests.clone();
    requested.add_assign(&expected.sub_floored(&node.daemonset_requests));
    ExistingNode {
        name: node.name.clone(),
        labels: node.labels.clone(),
        taints: node.taints.clone(),
        startup_taints: node.startup_taints.clone(),
        initialized: node.initialized,
        allocatable: node.allocatable.clone(),
        requested,
        pods: node.pods.clone(),
        ..ExistingNode::default()
    }
}

/// The cluster as every simulation of one pass starts from, built once: the provisioner makes
/// one simulation of it, a disruption pass one per set of candidates it weighs, each a cheap
/// [`Base::scenario`] (the nodes are shared, not rebuilt).
pub struct Base<'a> {
    /// Every node not going away, in `nodes` order, with its index there.
    existing: Vec<(usize, Arc<ExistingNode>)>,
    /// The StateNodes.
    nodes: &'a [StateNode],
    /// The input without any node left out: pending pods, then the pods of nodes going away.
    input: SchedulingInput,
    /// NodePools that could not be used: `(name, why)`.
    skipped_pools: Vec<(String, String)>,
    /// How many of `input.pods` were pending.
    pending_count: usize,
}

/// Why a static NodePool launches nothing for pending pods.
pub const STATIC_POOL: &str = "it is a static NodePool: its node count is spec.replicas, whatever the pods";

impl<'a> Base<'a> {
    /// Builds the base of `snapshot`, its `nodes` ([`super::statenode::state_nodes`] of it) and
    /// the `pending` pods.
    pub fn new(
        snapshot: &Snapshot,
        nodes: &'a [StateNode],
        pending: Vec<Arc<Pod>>,
        options: SchedulerOptions,
    ) -> Self {
        let usage = nodepool_usage(nodes, Counted::All);
        let mut skipped_pools = Vec::new();
        let mut nodepools = Vec::new();
        for np in snapshot.live_nodepools() {
            let name = np.metadata.name.clone().unwrap_or_default();
            if np.is_static() {
                // Its nodes follow `replicas`, not pods (as upstream, whatever the gate).
                skipped_pools.push((name, STATIC_POOL.to_string()));
                continue;
            }
            let Some(types) = snapshot.pool_types.get(&name) else {
                let why = snapshot.pool_errors.get(&name).cloned();
                skipped_pools
                    .push((name, why.unwrap_or_else(|| "its instance types are not known".to_string())));
                continue;
            };
            let used = usage.get(&name).cloned().unwrap_or_default();
            match NodePoolInput::from_nodepool(np, types.clone(), &used) {
                Ok(input) => nodepools.push(input),
                Err(error) => skipped_pools.push((name, error_chain(&error))),
            }
        }

        let daemonset_pods = snapshot::daemonset_pods(snapshot);
        let pods = snapshot::with_limit_range_defaults(snapshot, pending);
        let pending_count = pods.len();
        let mut existing = Vec::with_capacity(nodes.len());
        let mut going = Vec::new();
        for (i, node) in nodes.iter().enumerate() {
            if node.marked_for_deletion {
                going.push(node);
            } else {
                existing.push((i, Arc::new(existing_node(node, &daemonset_pods))));
            }
        }
        let mut base = Base {
            existing,
            nodes,
            input: SchedulingInput {
                pods,
                nodepools,
                existing_nodes: Vec::new(),
                daemonsets: daemonset_pods,
                namespace_labels: snapshot::namespace_labels(snapshot),
                volumes: snapshot::volume_input(snapshot),
                options,
                reservations_held: reservations_held(nodes),
            },
            skipped_pools,
            pending_count,
        };
        let mut seen = base.pod_uids();
        let displaced = displaced_pods(going.into_iter(), &mut seen);
        base.input.pods.extend(displaced);
        base
    }

    fn pod_uids(&self) -> HashSet<String> {
        self.input.pods.iter().filter_map(|p| p.metadata.uid.clone()).collect()
    }

    /// The input of the cluster without the StateNodes named in `without`: their reschedulable
    /// pods join the pods to place, after the others.
    pub fn scenario(&self, without: &HashSet<String>) -> Built {
        self.scenario_keeping(without, &|_| true)
    }

    /// [`Base::scenario`], placing only the pods of the left-out nodes that `keep` accepts (a
    /// disruption makes no room for pods that will not move: those it may not evict).
    pub fn scenario_keeping(&self, without: &HashSet<String>, keep: &dyn Fn(&Pod) -> bool) -> Built {
        let mut input = SchedulingInput {
            pods: self.input.pods.clone(),
            nodepools: self.input.nodepools.clone(),
            existing_nodes: Vec::with_capacity(self.existing.len()),
            daemonsets: self.input.daemonsets.clone(),
            namespace_labels: self.input.namespace_labels.clone(),
            volumes: self.input.volumes.clone(),
            options: self.input.options.clone(),
            reservations_held: self.input.reservations_held.clone(),
        };
        let mut left_out = Vec::new();
        for (i, node) in &self.existing {
            match self.nodes.get(*i) {
                Some(state) if without.contains(&state.name) => left_out.push(state),
                _ => input.existing_nodes.push(Arc::clone(node)),
            }
        }
        if !left_out.is_empty() {
            let mut seen = self.pod_uids();
            let displaced = displaced_pods(left_out.into_iter(), &mut seen);
            input.pods.extend(displaced.into_iter().filter(|p| keep(p)));
        }
        let displaced_pods = input.pods.len() - self.pending_count;
        Built { input, skipped_pools: self.skipped_pools.clone(), displaced_pods }
    }

    /// How many of the scenarios' pods were pending (the displaced ones follow).
    pub fn pending_count(&self) -> usize {
        self.pending_count
    }

    /// Where the pods of nodes already going away stand in every scenario's pods: after the
    /// pending ones, before those of the nodes a scenario leaves out.
    pub fn going_pods(&self) -> std::ops::Range<usize> {
        self.pending_count..self.input.pods.len()
    }
}

/// The reschedulable pods of `nodes` not in `seen` (each once).
fn displaced_pods<'n>(
    nodes: impl Iterator<Item = &'n StateNode>,
    seen: &mut HashSet<String>,
) -> Vec<Arc<Pod>> {
    let mut pods = Vec::new();
    for node in nodes {
        for pod in node.reschedulable_pods() {
            if pod.metadata.uid.as_ref().is_none_or(|uid| seen.insert(uid.clone())) {
                pods.push(Arc::clone(pod));
            }
        }
    }
    pods
}

/// Builds the scheduler's input from `snapshot`, its `nodes` ([`super::statenode::state_nodes`]
/// of it) and the `pending` pods, for `scenario`.
pub fn scheduling_input(
    snapshot: &Snapshot,
    nodes: &[StateNode],
    pending: Vec<Arc<Pod>>,
    scenario: &Scenario,
) -> Built {
    let mut base = Base::new(snapshot, nodes, pending, scenario.options.clone());
    base.input.pods.extend(scenario.stand_ins.iter().cloned());
    base.scenario(&scenario.without)
}

/// The capacity reservations the NodeClaims that are not launched yet may launch into (those
/// their `karpenter.k8s.aws/capacity-reservation-id` requirement lists), once per NodeClaim.
fn reservations_held(nodes: &[StateNode]) -> Vec<String> {
    nodes
        .iter()
        .filter(|n| n.provider_id.is_none())
        .filter_map(|n| n.claim.as_deref())
        .flat_map(|c| &c.spec.requirements)
        .filter(|r| r.key == LABEL_CAPACITY_RESERVATION_ID && r.operator == Operator::In)
        .flat_map(|r| r.values.iter().cloned())
        .collect()
}

/// Names of the NodePools of `snapshot`, by name, for lookups.
pub fn nodepools_by_name(snapshot: &Snapshot) -> BTreeMap<String, Arc<crate::apis::NodePool>> {
    snapshot
        .nodepools
        .iter()
        .map(|np| (np.metadata.name.clone().unwrap_or_default(), Arc::clone(np)))
        .collect()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::scheduling::{InstanceType, Resources, schedule};
    use crate::state::statenode::state_nodes;

    fn obj<T: serde::de::DeserializeOwned>(v: serde_json::Value) -> Arc<T> {
        Arc::new(serde_json::from_value(v).unwrap())
    }

    fn pending(name: &str, cpu: &str) -> Arc<Pod> {
        obj(json!({"metadata": {"name": name, "namespace": "ns", "uid": name},
            "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": cpu}}}]},
            "status": {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]}}))
    }

    fn bound(name: &str, node: &str, cpu: &str) -> Arc<Pod> {
        obj(json!({"metadata": {"name": name, "namespace": "ns", "uid": name},
            "spec": {"nodeName": node, "containers": [{"name": "c", "resources": {"requests": {"cpu": cpu}}}]},
            "status": {"phase": "Running"}}))
    }

    fn claim(name: &str, pid: Option<&str>, cpu: &str) -> Arc<crate::apis::NodeClaim> {
        let status = match pid {
            Some(p) => {
                json!({"providerID": p, "allocatable": {"cpu": cpu, "pods": "110"}, "capacity": {"cpu": cpu, "pods": "110"}})
            }
            None => json!({}),
        };
        obj(json!({"apiVersion": "karpenter.sh/v1", "kind": "NodeClaim",
            "metadata": {"name": name, "labels": {"karpenter.sh/nodepool": "default"}},
            "spec": {"nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "default"},
                "requirements": [{"key": "node.kubernetes.io/instance-type", "operator": "In", "values": ["four"]}],
                "resources": {"requests": {"cpu": cpu, "pods": "1"}}},
            "status": status}))
    }

    fn node(name: &str, cpu: &str, extra: serde_json::Value) -> Arc<k8s_openapi::api::core::v1::Node> {
        let mut v = json!({"metadata": {"name": name, "labels": {"karpenter.sh/nodepool": "default",
                "karpenter.sh/initialized": "true", "node.kubernetes.io/instance-type": "four"}},
            "spec": {"providerID": format!("kwok://{name}")},
            "status": {"allocatable": {"cpu": cpu, "pods": "110"}, "capacity": {"cpu": cpu, "pods": "110"}}});
        if let Some(m) = extra.as_object() {
            for (k, val) in m {
                v["metadata"][k] = val.clone();
            }
        }
        obj(v)
    }

    fn daemonset(cpu: &str) -> Arc<k8s_openapi::api::apps::v1::DaemonSet> {
        obj(json!({"metadata": {"name": "agent", "namespace": "kube-system"},
            "spec": {"selector": {"matchLabels": {"app": "agent"}}, "template": {
                "metadata": {"labels": {"app": "agent"}},
                "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": cpu}}}]}}}}))
    }

    fn pool(limit_cpu: Option<&str>) -> Arc<crate::apis::NodePool> {
        let mut v = json!({"apiVersion": "karpenter.sh/v1", "kind": "NodePool", "metadata": {"name": "default"},
            "spec": {"template": {"spec": {"nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "default"},
                "requirements": []}}}});
        if let Some(l) = limit_cpu {
            v["spec"]["limits"] = json!({"cpu": l});
        }
        obj(v)
    }

    fn four() -> Arc<InstanceType> {
        Arc::new(InstanceType::new(
            "four",
            Requirements::from_labels(&BTreeMap::from([(
                "node.kubernetes.io/instance-type".to_string(),
                "four".to_string(),
            )])),
            Resources::from_pairs([("cpu", 4000), ("pods", 110)]),
            Default::default(),
            vec![crate::scheduling::Offering::new("z", "on-demand", 0.1, true)],
        ))
    }

    fn snapshot(
        nodes: Vec<Arc<k8s_openapi::api::core::v1::Node>>,
        claims: Vec<Arc<crate::apis::NodeClaim>>,
        pods: Vec<Arc<Pod>>,
    ) -> Snapshot {
        Snapshot { nodes, nodeclaims: claims, pods, nodepools: vec![pool(None)], ..Default::default() }
            .with_instance_types([("default".to_string(), vec![four()])].into())
    }

    #[test]
    fn in_flight_claims_keep_room_for_the_daemonsets_they_will_run() {
        // A claim made for 1500m of pods plus a 500m DaemonSet: only the pods' share is free.
        let mut s = snapshot(vec![], vec![claim("c1", None, "2")], vec![]);
        s.daemonsets = vec![daemonset("500m")];
        let nodes = state_nodes(&s);
        let built = scheduling_input(&s, &nodes, vec![], &Scenario::default());
        let c1 = &built.input.existing_nodes[0];
        assert_eq!((c1.allocatable.get("cpu"), c1.requested.get("cpu")), (2000, 500));
        // A registered, initialized node already runs its DaemonSet pod: nothing more is reserved.
        let mut ds_pod = (*bound("agent-x", "n1", "500m")).clone();
        ds_pod.metadata.owner_references =
            Some(vec![k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
                api_version: "apps/v1".into(),
                kind: "DaemonSet".into(),
                name: "agent".into(),
                uid: "d".into(),
                ..Default::default()
            }]);
        let mut s = snapshot(vec![node("n1", "4", json!({}))], vec![], vec![Arc::new(ds_pod)]);
        s.daemonsets = vec![daemonset("500m")];
        let nodes = state_nodes(&s);
        let built = scheduling_input(&s, &nodes, vec![], &Scenario::default());
        assert_eq!(built.input.existing_nodes[0].requested.get("cpu"), 500, "counted once");
    }

    #[test]
    fn pods_of_nodes_going_away_need_a_place_too() {
        let s = snapshot(
            vec![
                node("n1", "4", json!({})),
                node("n2", "4", json!({"deletionTimestamp": "2026-01-01T00:00:00Z"})),
            ],
            vec![],
            vec![bound("a", "n1", "1"), bound("b", "n2", "1"), pending("p", "1")],
        );
        let nodes = state_nodes(&s);
        let pending = s.provisionable_pods();
        let built = scheduling_input(&s, &nodes, pending, &Scenario::default());
        let names: Vec<&str> = built.input.pods.iter().map(|p| p.metadata.name.as_deref().unwrap()).collect();
        assert_eq!(names, ["p", "b"]);
        assert_eq!(built.displaced_pods, 1);
        assert_eq!(built.input.existing_nodes.len(), 1);
        // Leaving n1 out as well: its pod needs a place, and a new node is the only one.
        let scenario = Scenario { without: ["n1".to_string()].into(), ..Default::default() };
        let built = scheduling_input(&s, &nodes, vec![], &scenario);
        assert_eq!(built.displaced_pods, 2);
        assert!(built.input.existing_nodes.is_empty());
        let results = schedule(&built.input);
        assert_eq!(results.new_node_claims.len(), 1);
        assert!(results.errors.is_empty());
    }

    #[test]
    fn scenarios_of_one_base_share_its_nodes_and_leave_out_only_theirs() {
        let s = snapshot(
            vec![node("n1", "4", json!({})), node("n2", "4", json!({})), node("n3", "4", json!({}))],
            vec![],
            vec![bound("a", "n1", "1"), bound("b", "n2", "1"), bound("c", "n2", "1"), pending("p", "1")],
        );
        let nodes = state_nodes(&s);
        let base = Base::new(&s, &nodes, s.provisionable_pods(), SchedulerOptions::default());
        let without_n2 = base.scenario(&["n2".to_string()].into());
        let without_n1 = base.scenario(&["n1".to_string()].into());
        let names = |b: &Built| -> Vec<String> {
            b.input.existing_nodes.iter().map(|n| n.name.clone()).collect::<Vec<_>>()
        };
        assert_eq!(names(&without_n2), ["n1", "n3"]);
        assert_eq!(names(&without_n1), ["n2", "n3"]);
        let pods = |b: &Built| -> Vec<String> {
            b.input.pods.iter().map(|p| p.metadata.name.clone().unwrap()).collect::<Vec<_>>()
        };
        assert_eq!(pods(&without_n2), ["p", "b", "c"]);
        assert_eq!((without_n2.displaced_pods, without_n1.displaced_pods), (2, 1));
        // The same node, not a copy, in both scenarios.
        assert!(Arc::ptr_eq(&without_n2.input.existing_nodes[1], &without_n1.input.existing_nodes[1]));
        // The one-shot builder is the same thing.
        let scenario = Scenario { without: ["n2".to_string()].into(), ..Default::default() };
        let built = scheduling_input(&s, &nodes, s.provisionable_pods(), &scenario);
        assert_eq!((names(&built), pods(&built)), (names(&without_n2), pods(&without_n2)));
    }

    #[test]
    fn limits_count_launched_and_unlaunched_claims() {
        let mut s = snapshot(vec![node("n1", "4", json!({}))], vec![claim("c2", None, "1")], vec![]);
        s.nodepools = vec![pool(Some("10"))];
        let nodes = state_nodes(&s);
        let built = scheduling_input(&s, &nodes, vec![], &Scenario::default());
        let remaining = built.input.nodepools[0].remaining_limits.as_ref().unwrap();
        assert_eq!(remaining["cpu"], 10_000 - 4000 - 4000, "the unlaunched claim counts as its largest type");
    }

    #[test]
    fn pools_without_instance_types_are_skipped_with_the_reason() {
        let s = Snapshot { nodepools: vec![pool(None)], ..Default::default() };
        let built = scheduling_input(&s, &[], vec![], &Scenario::default());
        assert!(built.input.nodepools.is_empty());
        assert_eq!(built.skipped_pools[0].0, "default");
    }
}

//! Table tests of a whole disruption pass ([`super::decide`]) over small snapshots: which method
//! acts, on which nodes, with which replacement, and why the others stay.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use crate::apis::pod::Pod;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::jiff::Timestamp;
use serde_json::{Value, json};

use super::consolidation::{Decision, Setting, World};
use super::decide::{Method, Pass, Rejection, decide, decide_drift, validate};
use super::record::{Code, Outcome, Record};
use crate::apis::labels::LABEL_CAPACITY_TYPE;
use crate::apis::{NodeClaim, NodePool};
use crate::scheduling::{InstanceType, Offering, Requirements, Resources, SchedulerOptions};
use crate::state::input::nodepools_by_name;
use crate::state::snapshot::Snapshot;
use crate::state::statenode::state_nodes;

pub(crate) const NOW: &str = "2026-11-24T12:00:00Z";

pub(crate) fn obj<T: serde::de::DeserializeOwned>(v: Value) -> Arc<T> {
    Arc::new(serde_json::from_value(v).unwrap())
}

/// An instance type with `cpu` vCPUs, on-demand at `od` and spot at `spot` (if any).
fn itype(name: &str, cpu: i64, od: f64, spot: Option<f64>) -> Arc<InstanceType> {
    let mut offerings = vec![Offering::new("z1", "on-demand", od, true)];
    if let Some(p) = spot {
        offerings.push(Offering::new("z1", "spot", p, true));
    }
    Arc::new(InstanceType::new(
        name,
        Requirements::new(),
        Resources::from_pairs([("cpu", cpu * 1000), ("pods", 110)]),
        Default::default(),
        offerings,
    ))
}

pub(crate) fn catalog() -> Vec<Arc<InstanceType>> {
    vec![itype("large", 4, 0.40, Some(0.20)), itype("small", 2, 0.10, Some(0.05))]
}

/// A many-typed catalog for the spot-to-spot rule: `cheaper` spot types below 0.20.
fn spot_catalog(cheaper: usize) -> Vec<Arc<InstanceType>> {
    let mut types = vec![itype("large", 4, 0.40, Some(0.20))];
    for i in 0..cheaper {
        types.push(itype(&format!("small-{i:02}"), 2, 0.10, Some(0.05 + i as f64 * 0.001)));
    }
    types
}

pub(crate) fn pool(name: &str, disruption: Value, capacity_types: &[&str]) -> Arc<NodePool> {
    obj(json!({"apiVersion": "karpenter.sh/v1", "kind": "NodePool", "metadata": {"name": name},
        "spec": {"template": {"spec": {"nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "c"},
            "requirements": [{"key": LABEL_CAPACITY_TYPE, "operator": "In", "values": capacity_types}]}},
            "disruption": disruption}}))
}

pub(crate) struct Cluster {
    nodes: Vec<Arc<Node>>,
    claims: Vec<Arc<NodeClaim>>,
    pods: Vec<Arc<Pod>>,
    pools: Vec<Arc<NodePool>>,
    types: Vec<Arc<InstanceType>>,
    spot_to_spot: bool,
    young: HashSet<String>,
    pdbs: Vec<Arc<k8s_openapi::api::policy::v1::PodDisruptionBudget>>,
    options: SchedulerOptions,
}

impl Cluster {
    pub(crate) fn new(pools: Vec<Arc<NodePool>>) -> Self {
        Cluster {
            nodes: vec![],
            claims: vec![],
            pods: vec![],
            pools,
            types: catalog(),
            spot_to_spot: false,
            young: HashSet::new(),
            pdbs: vec![],
            options: SchedulerOptions::default(),
        }
    }

    /// A Ready, initialized node of `pool` on `itype` (`capacity` type), its claim initialized an
    /// hour ago.
    pub(crate) fn node(
        &mut self,
        name: &str,
        pool: &str,
        it: &str,
        capacity: &str,
        annotations: Value,
    ) -> &mut Self {
        let cpu = self.types.iter().find(|t| t.name == it).unwrap().capacity.get("cpu");
        let labels = json!({"karpenter.sh/nodepool": pool, "karpenter.sh/initialized": "true",
            "node.kubernetes.io/instance-type": it, "karpenter.sh/capacity-type": capacity,
            "topology.kubernetes.io/zone": "z1", "kubernetes.io/hostname": name});
        self.nodes.push(obj(json!({"metadata": {"name": name, "labels": labels, "annotations": annotations},
            "spec": {"providerID": format!("kwok://{name}")},
            "status": {"allocatable": {"cpu": format!("{cpu}m"), "pods": "110"}, "capacity": {"cpu": format!("{cpu}m"), "pods": "110"},
                "conditions": [{"type": "Ready", "status": "True"}]}})));
        self.claims.push(obj(json!({"apiVersion": "karpenter.sh/v1", "kind": "NodeClaim",
            "metadata": {"name": name, "labels": labels},
            "spec": {"nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "c"}, "requirements": []},
            "status": {"providerID": format!("kwok://{name}"), "nodeName": name,
                "conditions": [{"type": "Initialized", "status": "True", "reason": "Initialized", "message": "",
                    "lastTransitionTime": "2026-11-24T11:00:00Z"}]}})));
        self
    }

    /// Moves `node` (and its claim) to `zone`.
    pub(crate) fn in_zone(&mut self, node: &str, zone: &str) -> &mut Self {
        let zone_of = |labels: &mut Option<BTreeMap<String, String>>| {
            labels
                .get_or_insert_with(Default::default)
                .insert("topology.kubernetes.io/zone".into(), zone.into());
        };
        for n in self.nodes.iter_mut().filter(|n| n.metadata.name.as_deref() == Some(node)) {
            zone_of(&mut Arc::make_mut(n).metadata.labels);
        }
        for c in self.claims.iter_mut().filter(|c| c.metadata.name.as_deref() == Some(node)) {
            zone_of(&mut Arc::make_mut(c).metadata.labels);
        }
        self
    }

    /// Marks the claim of `node` `Drifted=True` since `since`, with a `terminationGracePeriod` if
    /// given.
    pub(crate) fn drifted(&mut self, node: &str, since: &str, grace: Option<&str>) -> &mut Self {
        self.condition(node, "Drifted", "NodePoolDrifted", since, grace)
    }

    fn condition(
        &mut self,
        node: &str,
        type_: &str,
        reason: &str,
        since: &str,
        grace: Option<&str>,
    ) -> &mut Self {
        let i = self.claims.iter().position(|c| c.metadata.name.as_deref() == Some(node)).unwrap();
        let mut claim = (*self.claims[i]).clone();
        let mut status = claim.status.clone().unwrap();
        status.conditions.push(
            serde_json::from_value(json!({"type": type_, "status": "True", "reason": reason,
                "message": "", "lastTransitionTime": since}))
            .unwrap(),
        );
        claim.status = Some(status);
        claim.spec.termination_grace_period = grace.map(str::to_string);
        self.claims[i] = Arc::new(claim);
        self
    }

    pub(crate) fn pod(&mut self, name: &str, node: &str, cpu: &str, annotations: Value) -> &mut Self {
        self.pods.push(obj(json!({"metadata": {"name": name, "namespace": "ns", "uid": name, "annotations": annotations,
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs", "uid": "rs", "controller": true}]},
            "spec": {"nodeName": node, "containers": [{"name": "c", "resources": {"requests": {"cpu": cpu}}}]},
            "status": {"phase": "Running", "startTime": "2026-11-24T11:00:00Z", "conditions": [{"type": "Ready", "status": "True"}]}})));
        self
    }

    /// Merges `spec` into the spec of the pod `name`.
    pub(crate) fn pod_spec(&mut self, name: &str, spec: Value) -> &mut Self {
        for pod in self.pods.iter_mut().filter(|p| p.metadata.name.as_deref() == Some(name)) {
            let mut value = serde_json::to_value(pod.as_ref()).unwrap();
            if let (Some(target), Value::Object(extra)) = (value["spec"].as_object_mut(), spec.clone()) {
                target.extend(extra);
            }
            *pod = obj(value);
        }
        self
    }

    /// Sets the labels of the pod `name`.
    pub(crate) fn pod_labels(&mut self, name: &str, labels: &[(&str, &str)]) -> &mut Self {
        for pod in self.pods.iter_mut().filter(|p| p.metadata.name.as_deref() == Some(name)) {
            Arc::make_mut(pod).metadata.labels =
                Some(labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect());
        }
        self
    }

    pub(crate) fn snapshot(&self) -> Snapshot {
        let types: BTreeMap<String, Vec<Arc<InstanceType>>> =
            self.pools.iter().map(|p| (p.metadata.name.clone().unwrap(), self.types.clone())).collect();
        Snapshot {
            nodes: self.nodes.clone(),
            nodeclaims: self.claims.clone(),
            pods: self.pods.clone(),
            nodepools: self.pools.clone(),
            pdbs: self.pdbs.clone(),
            ..Default::default()
        }
        .with_instance_types(types)
    }

    fn run<T>(&self, f: impl FnOnce(&World<'_>) -> T) -> T {
        let snapshot = self.snapshot();
        let nodes = state_nodes(&snapshot);
        let pools = nodepools_by_name(&snapshot);
        let world = World::new(
            &snapshot,
            Setting {
                nodes: &nodes,
                pending: snapshot.provisionable_pods(),
                options: self.options.clone(),
                spot_to_spot: self.spot_to_spot,
                pools: &pools,
                now: NOW.parse::<Timestamp>().unwrap(),
                young: self.young.clone(),
            },
        );
        f(&world)
    }

    fn decide(&self) -> Pass {
        self.run(|w| decide(w, &HashSet::new()))
    }
}

pub(crate) fn consolidating(budget: &str) -> Value {
    json!({"consolidationPolicy": "WhenEmptyOrUnderutilized", "consolidateAfter": "30s", "budgets": [{"nodes": budget}]})
}

fn candidates(pass: &Pass) -> Vec<String> {
    pass.command.as_ref().map(|c| c.plan.candidates.clone()).unwrap_or_default()
}

#[test]
fn empty_nodes_go_first_in_one_command_within_the_budget() {
    let mut c = Cluster::new(vec![pool("p", consolidating("2"), &["on-demand"])]);
    c.node("a", "p", "small", "on-demand", json!({}))
        .node("b", "p", "small", "on-demand", json!({}))
        .node("c", "p", "small", "on-demand", json!({}))
        .node("busy", "p", "large", "on-demand", json!({}))
        .pod("w", "busy", "500m", json!({}));
    let pass = c.decide();
    let command = pass.command.as_ref().unwrap();
    assert_eq!(command.method, Method::Emptiness);
    assert_eq!(command.plan.decision, Decision::Delete);
    assert_eq!(candidates(&pass), ["a", "b"], "two of three empty nodes: the budget allows two");
}

/// A pool whose budgets name only other reasons has no limit on emptiness (`usize::MAX`), next to
/// another pool with one: budgets are never added up (that overflowed and failed the pass).
#[test]
fn an_unlimited_budget_next_to_a_limited_one_is_not_added_up() {
    let only_drift_limited = json!({"consolidationPolicy": "WhenEmptyOrUnderutilized", "consolidateAfter": "30s",
        "budgets": [{"nodes": "0", "reasons": ["Drifted"]}]});
    let mut c = Cluster::new(vec![
        pool("unlimited", only_drift_limited, &["on-demand"]),
        pool("p", consolidating("1"), &["on-demand"]),
    ]);
    c.node("a", "unlimited", "small", "on-demand", json!({})).node("b", "p", "small", "on-demand", json!({}));
    let pass = c.decide();
    assert_eq!(pass.command.as_ref().map(|c| c.method), Some(Method::Emptiness));
    assert_eq!(candidates(&pass), ["a", "b"]);
}

#[test]
fn a_zero_budget_holds_everything_and_names_the_pool() {
    let mut c = Cluster::new(vec![pool("p", consolidating("0"), &["on-demand"])]);
    c.node("a", "p", "small", "on-demand", json!({}));
    let pass = c.decide();
    assert!(pass.command.is_none());
    assert!(pass.budget_blocked.contains(&("p".to_string(), crate::apis::nodepool::DisruptionReason::Empty)));
}

#[test]
fn underused_nodes_are_consolidated_together_onto_one_cheaper_node() {
    let mut c = Cluster::new(vec![pool("p", consolidating("100%"), &["on-demand"])]);
    for n in ["n1", "n2", "n3"] {
        c.node(n, "p", "large", "on-demand", json!({})).pod(&format!("w-{n}"), n, "500m", json!({}));
    }
    let pass = c.decide();
    let command = pass.command.as_ref().unwrap();
    assert_eq!(command.method, Method::MultiNode);
    assert_eq!(command.plan.candidates.len(), 3, "every candidate considered: {:?}", command.plan.candidates);
    assert_eq!(command.plan.decision, Decision::Replace);
    assert_eq!(command.plan.replacement_types(), ["small"], "only cheaper types");
    assert!((command.plan.savings - (1.2 - 0.10)).abs() < 1e-9, "{}", command.plan.savings);
}

/// With kube-scheduler's default spreads, consolidation keeps a workload's zones, even with the
/// pods' own preferences yielding: three nodes in three zones, one pod of a Deployment each, are
/// replaced one by one with cheaper nodes in their zones, not merged onto one node.
#[test]
fn a_workload_spread_over_zones_stays_spread() {
    use crate::scheduling::defaultspread::DefaultSpread;
    let zonal = |name: &str, cpu: i64, price: f64| {
        Arc::new(InstanceType::new(
            name,
            Requirements::new(),
            Resources::from_pairs([("cpu", cpu * 1000), ("pods", 110)]),
            Default::default(),
            ["z1", "z2", "z3"].iter().map(|z| Offering::new(*z, "on-demand", price, true)).collect(),
        ))
    };
    let run = |spread: DefaultSpread| {
        let mut c = Cluster::new(vec![pool("p", consolidating("100%"), &["on-demand"])]);
        c.types = vec![zonal("large", 4, 0.40), zonal("small", 2, 0.10)];
        c.options.default_spread = Arc::new(spread);
        // As the controller runs: preferences yield to the remaining nodes, the defaults do not.
        c.options.preferences_yield_to_existing = true;
        for (n, zone) in [("n1", "z1"), ("n2", "z2"), ("n3", "z3")] {
            let pod = format!("w-{n}");
            c.node(n, "p", "large", "on-demand", json!({})).in_zone(n, zone).pod(&pod, n, "500m", json!({}));
            c.pod_labels(&pod, &[("app", "web")]);
        }
        c.decide()
    };
    let merged = run(DefaultSpread::none());
    let command = merged.command.as_ref().unwrap();
    assert_eq!((command.method, command.plan.candidates.len()), (Method::MultiNode, 3), "upstream's plan");
    let spread = run(DefaultSpread::builtin());
    let command = spread.command.as_ref().unwrap();
    assert_eq!(command.method, Method::SingleNode, "{command:?}");
    assert_eq!(command.plan.decision, Decision::Replace);
    assert_eq!(command.plan.candidates.len(), 1);
    assert_eq!(command.plan.replacement_types(), ["small"]);
}

/// A `ScheduleAnyway` hostname spread of two pods on two nodes: upstream keeps one pod a node and
/// replaces one node with a smaller one; as kube-scheduler would, the soft policy moves the pod
/// onto the other node, deletes its node, and says whose preference it leaves unmet.
#[test]
fn preferences_yield_to_the_remaining_nodes_and_the_plan_says_whose() {
    let run = |soft: bool| {
        let mut c = Cluster::new(vec![pool("p", consolidating("100%"), &["on-demand"])]);
        c.options.preferences_yield_to_existing = soft;
        let spread = json!({"topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "kubernetes.io/hostname",
            "whenUnsatisfiable": "ScheduleAnyway", "labelSelector": {"matchLabels": {"app": "web"}}}]});
        for n in ["n1", "n2"] {
            let pod = format!("w-{n}");
            c.node(n, "p", "large", "on-demand", json!({})).pod(&pod, n, "500m", json!({}));
            c.pod_labels(&pod, &[("app", "web")]).pod_spec(&pod, spread.clone());
        }
        c.decide()
    };
    let respected = run(false);
    let plan = &respected.command.as_ref().unwrap().plan;
    assert_eq!(plan.decision, Decision::Replace);
    assert_eq!(plan.replacement_types(), ["small"]);
    assert!(plan.preferences_broken.is_empty());
    let soft = run(true);
    let plan = &soft.command.as_ref().unwrap().plan;
    assert_eq!(plan.decision, Decision::Delete, "{plan:?}");
    assert_eq!(plan.candidates.len(), 1);
    let moved = format!("ns/w-{}", plan.candidates[0]);
    assert_eq!(plan.preferences_broken, [moved]);
}

#[test]
fn a_node_whose_pods_fit_elsewhere_is_deleted() {
    let mut c = Cluster::new(vec![pool("p", consolidating("100%"), &["on-demand"])]);
    c.node("big", "p", "large", "on-demand", json!({}))
        .pod("a", "big", "3", json!({}))
        .node("spare", "p", "small", "on-demand", json!({}))
        .pod("b", "spare", "500m", json!({}));
    let pass = c.decide();
    let command = pass.command.as_ref().unwrap();
    assert_eq!(command.plan.decision, Decision::Delete);
    assert_eq!(command.plan.candidates, ["spare"], "its pod fits on the big node");
}

#[test]
fn on_demand_replaced_by_spot_is_pinned_to_spot() {
    let mut c = Cluster::new(vec![pool("p", consolidating("100%"), &["on-demand", "spot"])]);
    c.node("n1", "p", "large", "on-demand", json!({})).pod("w", "n1", "500m", json!({}));
    let pass = c.decide();
    let command = pass.command.as_ref().unwrap();
    assert_eq!(command.method, Method::SingleNode);
    let replacement = command.plan.replacements.first().unwrap();
    let ct = replacement.requirements.get(LABEL_CAPACITY_TYPE).unwrap();
    assert!(ct.has("spot") && !ct.has("on-demand"), "never a dearer on-demand fallback");
}

#[test]
fn nothing_cheaper_means_no_replacement_and_a_reason() {
    let mut c = Cluster::new(vec![pool("p", consolidating("100%"), &["on-demand"])]);
    c.node("n1", "p", "small", "on-demand", json!({})).pod("w", "n1", "1500m", json!({}));
    let pass = c.decide();
    assert!(pass.command.is_none());
    assert_eq!(pass.unconsolidatable["n1"].message, "Can't replace with a cheaper node");
    assert_eq!(pass.unconsolidatable["n1"].code, Code::NoCheaperReplacement);
}

#[test]
fn a_replacement_cheaper_at_list_price_but_dearer_in_full_cost_is_refused() {
    use crate::cloudprovider::aws::nodecost::{BurstableCpu, NodeCost, priced};
    // A t3a.medium lists at less than half an m5.large, but its pod's 1.5 vCPU are far above the
    // 0.4 it sustains: in unlimited mode the surplus credits make it the dearer node.
    let catalog = |mode| -> Vec<Arc<InstanceType>> {
        [itype("m5.large", 2, 0.096, None), itype("t3a.medium", 2, 0.0376, None)]
            .iter()
            .map(|t| Arc::new(priced(t, &NodeCost::default(), mode)))
            .collect()
    };
    let run = |mode| {
        let mut c = Cluster::new(vec![pool("p", consolidating("100%"), &["on-demand"])]);
        c.types = catalog(mode);
        c.node("n1", "p", "m5.large", "on-demand", json!({})).pod("w", "n1", "1500m", json!({}));
        c.decide()
    };
    let pass = run(BurstableCpu::Unlimited);
    assert!(pass.command.is_none(), "{:?}", pass.command);
    assert_eq!(pass.unconsolidatable["n1"].code, Code::NoCheaperReplacement);
    // At list price alone (upstream's rule), the burstable type wins.
    let pass = run(BurstableCpu::Ignore);
    let command = pass.command.as_ref().unwrap();
    assert_eq!(command.plan.replacement_types(), ["t3a.medium"]);
}

#[test]
fn spot_to_spot_needs_the_gate_and_fifteen_cheaper_types() {
    let mut c = Cluster::new(vec![pool("p", consolidating("100%"), &["spot"])]);
    c.types = spot_catalog(14);
    c.node("n1", "p", "large", "spot", json!({})).pod("w", "n1", "500m", json!({}));
    assert_eq!(
        c.decide().unconsolidatable["n1"].message,
        "SpotToSpotConsolidation is disabled, can't replace a spot node with a spot node"
    );
    c.spot_to_spot = true;
    assert_eq!(
        c.decide().unconsolidatable["n1"].message,
        "SpotToSpotConsolidation requires 15 cheaper instance type options than the current candidate to consolidate, got 14"
    );
    c.types = spot_catalog(20);
    c.nodes.clear();
    c.claims.clear();
    c.pods.clear();
    c.node("n1", "p", "large", "spot", json!({})).pod("w", "n1", "500m", json!({}));
    let pass = c.decide();
    let replacement = pass.command.as_ref().unwrap().plan.replacements[0].clone();
    assert_eq!(replacement.instance_type_names.len(), 15, "the 15 cheapest are launched");
    assert_eq!(replacement.instance_type_names[0], "small-00");
}

#[test]
fn when_empty_pools_leave_busy_nodes_alone() {
    let disruption = json!({"consolidationPolicy": "WhenEmpty", "consolidateAfter": "30s"});
    let mut c = Cluster::new(vec![pool("p", disruption, &["on-demand"])]);
    c.node("n1", "p", "large", "on-demand", json!({})).pod("w", "n1", "500m", json!({}));
    let pass = c.decide();
    assert!(pass.command.is_none());
    assert_eq!(
        pass.unconsolidatable["n1"].message,
        "NodePool \"p\" has consolidation policy WhenEmpty, but node is not empty"
    );
}

#[test]
fn do_not_disrupt_pods_and_nodes_are_not_candidates() {
    let mut c = Cluster::new(vec![pool("p", consolidating("100%"), &["on-demand"])]);
    c.node("held", "p", "small", "on-demand", json!({"karpenter.sh/do-not-disrupt": "true"}))
        .node("pinned", "p", "large", "on-demand", json!({}))
        .pod("precious", "pinned", "500m", json!({"karpenter.sh/do-not-disrupt": "true"}));
    let pass = c.decide();
    assert!(pass.command.is_none(), "{:?}", candidates(&pass));
    assert_eq!(
        pass.blocked["held"].message,
        "Disruption is blocked through the \"karpenter.sh/do-not-disrupt\" annotation"
    );
    assert_eq!(
        pass.blocked["pinned"].message,
        "Pod has \"karpenter.sh/do-not-disrupt\" annotation (Pod=ns/precious)"
    );
}

#[test]
fn every_managed_node_has_one_recorded_decision() {
    let mut c = Cluster::new(vec![pool("p", consolidating("100%"), &["on-demand"])]);
    c.types = vec![itype("large", 4, 0.40, None)];
    c.node("held", "p", "large", "on-demand", json!({"karpenter.sh/do-not-disrupt": "true"}))
        .pod("h", "held", "3", json!({}))
        .node("busy", "p", "large", "on-demand", json!({}))
        .pod("w", "busy", "3", json!({}))
        .node("idle", "p", "large", "on-demand", json!({}));
    let record = c.run(|w| {
        let pass = decide(w, &HashSet::new());
        Record::of(&pass, w.nodes, &HashSet::new(), w.now, None)
    });
    let seen: Vec<(&str, Outcome, Code)> =
        record.nodes.iter().map(|(n, d)| (n.as_str(), d.outcome, d.code)).collect();
    assert_eq!(
        seen,
        [
            ("busy", Outcome::Candidate, Code::NotReached),
            ("held", Outcome::Blocked, Code::DoNotDisruptNode),
            ("idle", Outcome::Disrupting, Code::Disrupting),
        ]
    );
    assert_eq!(record.nodes["held"].nodepool.as_deref(), Some("p"));
    // With a command under way on the held node, the busy one is weighed and kept.
    let mut c = Cluster::new(vec![pool("p", consolidating("100%"), &["on-demand"])]);
    c.types = vec![itype("large", 4, 0.40, None)];
    c.node("held", "p", "large", "on-demand", json!({}))
        .pod("h", "held", "3", json!({}))
        .node("busy", "p", "large", "on-demand", json!({}))
        .pod("w", "busy", "3", json!({}));
    let in_flight: HashSet<String> = ["held".to_string()].into();
    let record = c.run(|w| {
        let pass = decide(w, &in_flight);
        Record::of(&pass, w.nodes, &in_flight, w.now, None)
    });
    assert_eq!(
        (record.nodes["held"].outcome, record.nodes["held"].code),
        (Outcome::Disrupting, Code::InProgress)
    );
    assert_eq!(
        (record.nodes["busy"].outcome, record.nodes["busy"].code),
        (Outcome::Unconsolidatable, Code::NoCheaperReplacement),
        "{:?}",
        record.nodes["busy"]
    );
}

#[test]
fn pods_that_fit_nowhere_keep_their_node() {
    let mut c = Cluster::new(vec![pool("p", consolidating("100%"), &["on-demand"])]);
    c.types = vec![itype("large", 4, 0.40, None)];
    c.node("n1", "p", "large", "on-demand", json!({})).pod("w", "n1", "3", json!({}));
    c.node("n2", "p", "large", "on-demand", json!({})).pod("v", "n2", "3", json!({}));
    let pass = c.decide();
    assert!(pass.command.is_none());
    assert_eq!(pass.unconsolidatable["n1"].message, "Can't replace with a cheaper node");
}

#[test]
fn balanced_pools_skip_moves_that_save_too_little_for_their_disruption() {
    let disruption =
        json!({"consolidationPolicy": "Balanced", "consolidateAfter": "30s", "budgets": [{"nodes": "100%"}]});
    let mut c = Cluster::new(vec![pool("p", disruption, &["on-demand"])]);
    // Deleting n1 saves 0.11 of a 9.90/h pool (1 %) for 2 of its 5 units of disruption (40 %).
    c.types =
        vec![itype("large", 4, 0.11, None), itype("small", 2, 0.10, None), itype("huge", 64, 9.79, None)];
    c.node("n1", "p", "large", "on-demand", json!({})).pod("a", "n1", "500m", json!({}));
    c.node("h1", "p", "huge", "on-demand", json!({})).pod("b", "h1", "60", json!({})).pod(
        "c",
        "h1",
        "60m",
        json!({}),
    );
    let pass = c.decide();
    assert!(pass.command.is_none(), "{:?}", candidates(&pass));
    // The same move under WhenEmptyOrUnderutilized is made.
    c.pools = vec![pool("p", consolidating("100%"), &["on-demand"])];
    assert_eq!(candidates(&c.decide()), ["n1"]);
}

#[test]
fn validation_rejects_a_command_whose_node_changed() {
    let mut c = Cluster::new(vec![pool("p", consolidating("100%"), &["on-demand"])]);
    c.node("a", "p", "small", "on-demand", json!({}));
    let command = c.decide().command.unwrap();
    assert!(c.run(|w| validate(w, &command, &HashSet::new())).is_ok());
    c.pod("late", "a", "100m", json!({"karpenter.sh/do-not-disrupt": "true"}));
    let rejected = c.run(|w| validate(w, &command, &HashSet::new())).unwrap_err();
    assert!(matches!(rejected, Rejection::Churn(_)), "{rejected:?}");
    c.pods.clear();
    c.pods.push(obj(json!({"metadata": {"name": "x", "namespace": "ns", "uid": "x"},
        "spec": {"nodeName": "a", "containers": [{"name": "c"}]}, "status": {"phase": "Running"}})));
    let rejected = c.run(|w| validate(w, &command, &HashSet::new())).unwrap_err();
    assert!(matches!(rejected, Rejection::Churn(ref why) if why.contains("no longer empty")), "{rejected:?}");
    c.pods.clear();
    c.pools = vec![pool("p", consolidating("0"), &["on-demand"])];
    let rejected = c.run(|w| validate(w, &command, &HashSet::new())).unwrap_err();
    assert!(matches!(rejected, Rejection::Budget(_)), "{rejected:?}");
}

fn names(validated: &super::decide::Validated) -> (Vec<String>, Vec<String>) {
    let dropped = validated.dropped.iter().map(|(n, r)| format!("{n}: {}", r.label())).collect();
    (validated.command.plan.candidates.clone(), dropped)
}

#[test]
fn emptiness_goes_ahead_with_the_nodes_still_empty_within_the_budget() {
    let mut c = Cluster::new(vec![pool("p", consolidating("100%"), &["on-demand"])]);
    for n in ["a", "b", "c", "d"] {
        c.node(n, "p", "small", "on-demand", json!({}));
    }
    let command = c.decide().command.unwrap();
    assert_eq!(command.method, Method::Emptiness);
    assert_eq!(command.plan.candidates, ["a", "b", "c", "d"]);
    // b took a pod meanwhile: the others go, b stays and is counted.
    c.pod("late", "b", "100m", json!({}));
    let validated = c.run(|w| validate(w, &command, &HashSet::new())).unwrap();
    assert_eq!(names(&validated), (vec!["a".into(), "c".into(), "d".into()], vec!["b: churn".into()]));
    assert!((validated.command.plan.savings - 0.30).abs() < 1e-9, "{}", validated.command.plan.savings);
    // A budget of two now: the first two still valid go, in the command's order.
    c.pools = vec![pool("p", consolidating("2"), &["on-demand"])];
    let validated = c.run(|w| validate(w, &command, &HashSet::new())).unwrap();
    assert_eq!(
        names(&validated),
        (vec!["a".into(), "c".into()], vec!["b: churn".into(), "d: budget".into()])
    );
}

/// Deleting nodes by multi-node consolidation goes ahead with the part still valid when the
/// pods of that part still fit on the nodes that stay; a replacement is all or nothing.
#[test]
fn a_multi_node_deletion_goes_ahead_without_a_node_that_changed() {
    let mut c = Cluster::new(vec![pool("p", consolidating("100%"), &["on-demand"])]);
    c.node("keeper", "p", "large", "on-demand", json!({})).pod(
        "held",
        "keeper",
        "2",
        json!({"karpenter.sh/do-not-disrupt": "true"}),
    );
    for n in ["n1", "n2", "n3"] {
        c.node(n, "p", "small", "on-demand", json!({})).pod(&format!("w-{n}"), n, "500m", json!({}));
    }
    let command = c.decide().command.unwrap();
    assert_eq!(command.method, Method::MultiNode);
    assert_eq!(command.plan.decision, Decision::Delete);
    assert_eq!(command.plan.candidates, ["n1", "n2", "n3"]);
    // n2 took a pod that may not be disrupted, and is full.
    c.pod("late", "n2", "1400m", json!({"karpenter.sh/do-not-disrupt": "true"}));
    let validated = c.run(|w| validate(w, &command, &HashSet::new())).unwrap();
    assert_eq!(names(&validated), (vec!["n1".into(), "n3".into()], vec!["n2: churn".into()]));
    assert_eq!(validated.command.plan.decision, Decision::Delete);
    // The keeper filled up meanwhile: what is left would need a new node, so nothing goes.
    c.pod("more", "keeper", "1800m", json!({"karpenter.sh/do-not-disrupt": "true"}));
    let rejected = c.run(|w| validate(w, &command, &HashSet::new())).unwrap_err();
    assert!(matches!(rejected, Rejection::Scheduling(_)), "{rejected:?}");
}

#[test]
fn a_node_consolidation_just_launched_is_not_consolidated_again_at_once() {
    let mut c = Cluster::new(vec![pool("p", consolidating("100%"), &["on-demand"])]);
    c.node("n1", "p", "large", "on-demand", json!({})).pod("w", "n1", "500m", json!({}));
    assert_eq!(candidates(&c.decide()), ["n1"]);
    c.young.insert("n1".into());
    let pass = c.decide();
    assert!(pass.command.is_none());
    assert_eq!(pass.unconsolidatable["n1"].message, super::consolidation::YOUNG);
    assert!(pass.transient, "looked at again once the minute is over");
    // Emptiness is not held back.
    c.pods.clear();
    assert_eq!(candidates(&c.decide()), ["n1"]);
}

/// A drifted node whose pod fits on a node with room to spare is deleted, not replaced; unless a
/// pod that just left a node going away (a stand-in, its successor not seen yet) is about to take
/// that room: then the drifted node is replaced, and the evicted pod does not need a new node.
#[test]
fn a_stand_in_keeps_the_room_its_successor_will_take() {
    let only_drift = json!({"consolidationPolicy": "WhenEmpty", "consolidateAfter": "Never", "budgets": [{"nodes": "100%"}]});
    let mut c = Cluster::new(vec![pool("p", only_drift, &["on-demand"])]);
    c.types = vec![itype("large", 4, 0.40, None)];
    c.node("drifted", "p", "large", "on-demand", json!({}))
        .pod("a", "drifted", "3", json!({}))
        .node("spare", "p", "large", "on-demand", json!({}))
        .pod("b", "spare", "500m", json!({}));
    c.drifted("drifted", "2026-11-24T11:30:00Z", None);
    let decide_with = |stand_ins: Vec<Arc<Pod>>| {
        let inputs = super::decide::Inputs::of(
            c.snapshot(),
            SchedulerOptions::default(),
            false,
            NOW.parse().unwrap(),
            HashSet::new(),
        )
        .with_stand_ins(stand_ins);
        decide(&inputs.world(), &HashSet::new())
    };
    let alone = decide_with(vec![]);
    assert_eq!(alone.command.as_ref().map(|c| &c.plan.decision), Some(&Decision::Delete));
    let stand_in: Arc<Pod> = Arc::new(
        serde_json::from_value(
            json!({"metadata": {"name": "gone", "namespace": "ns", "uid": "stand-in-gone"},
            "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "3"}}}]}}),
        )
        .unwrap(),
    );
    let held = decide_with(vec![stand_in]);
    let command = held.command.as_ref().unwrap();
    assert_eq!(candidates(&held), ["drifted"]);
    assert_eq!(command.plan.decision, Decision::Replace);
}

#[test]
fn drift_replaces_one_node_at_a_time_empties_first_then_the_longest_drifted() {
    // No emptiness or consolidation here: drift alone.
    let only_drift = json!({"consolidationPolicy": "WhenEmpty", "consolidateAfter": "Never", "budgets": [{"nodes": "100%"}]});
    let mut c = Cluster::new(vec![pool("p", only_drift, &["on-demand"])]);
    c.types = vec![itype("large", 4, 0.40, None)];
    c.node("old", "p", "large", "on-demand", json!({}))
        .pod("a", "old", "3", json!({}))
        .node("older", "p", "large", "on-demand", json!({}))
        .pod("b", "older", "3", json!({}))
        .node("fresh", "p", "large", "on-demand", json!({}))
        .pod("c", "fresh", "3", json!({}));
    c.drifted("old", "2026-11-24T11:30:00Z", None).drifted("older", "2026-11-24T11:00:00Z", None);
    let pass = c.decide();
    let command = pass.command.as_ref().unwrap();
    assert_eq!(command.method, Method::Drift);
    // The longest drifted first; its pod fits nowhere else: one new node, no price check.
    assert_eq!(command.plan.candidates, ["older"]);
    assert_eq!(command.plan.decision, Decision::Replace);
    assert_eq!(command.plan.replacements.len(), 1);
    // An empty drifted node goes first, deleted without a replacement.
    c.node("idle", "p", "large", "on-demand", json!({})).drifted("idle", "2026-11-24T11:50:00Z", None);
    let pass = c.decide();
    let command = pass.command.as_ref().unwrap();
    assert_eq!((command.method, command.plan.candidates.clone()), (Method::Drift, vec!["idle".to_string()]));
    assert!(command.plan.replacements.is_empty());
}

#[test]
fn a_rebalance_recommended_node_is_replaced_as_a_drifted_one() {
    let only_drift = json!({"consolidationPolicy": "WhenEmpty", "consolidateAfter": "Never", "budgets": [{"nodes": "100%"}]});
    let mut c = Cluster::new(vec![pool("p", only_drift, &["spot"])]);
    c.types = vec![itype("large", 4, 0.40, Some(0.12)), itype("xlarge", 8, 0.80, Some(0.30))];
    c.node("warned", "p", "large", "spot", json!({}))
        .pod("a", "warned", "3", json!({}))
        .node("calm", "p", "large", "spot", json!({}))
        .pod("b", "calm", "3", json!({}));
    assert!(c.decide().command.is_none(), "nothing to do yet");
    c.condition("warned", "RebalanceRecommended", "RebalanceRecommendation", "2026-11-24T11:59:00Z", None);
    let pass = c.decide();
    let command = pass.command.as_ref().unwrap();
    assert_eq!(command.method, Method::Drift);
    assert_eq!(command.plan.candidates, ["warned"]);
    // Its pod fits nowhere else: the replacement is launched first.
    assert_eq!(command.plan.decision, Decision::Replace);
    assert_eq!(command.plan.replacements.len(), 1);
}

#[test]
fn drift_waits_for_its_budget_and_takes_as_many_replacements_as_the_pods_need() {
    let mut c = Cluster::new(vec![pool("p", consolidating("100%"), &["on-demand"])]);
    c.types = vec![itype("large", 4, 0.40, None), itype("small", 2, 0.10, None)];
    c.pools = vec![pool(
        "p",
        json!({"consolidationPolicy": "WhenEmptyOrUnderutilized", "consolidateAfter": "0s",
            "budgets": [{"nodes": "0", "reasons": ["Drifted"]}]}),
        &["on-demand"],
    )];
    c.node("old", "p", "large", "on-demand", json!({}))
        .pod("a", "old", "1500m", json!({}))
        .pod("b", "old", "1500m", json!({}))
        .drifted("old", "2026-11-24T11:00:00Z", None);
    c.pools[0] = {
        // Only small nodes now: the two pods need two of them.
        let mut p = (*c.pools[0]).clone();
        p.spec.template.spec.requirements.push(
            serde_json::from_value(
                json!({"key": "node.kubernetes.io/instance-type", "operator": "In", "values": ["small"]}),
            )
            .unwrap(),
        );
        Arc::new(p)
    };
    let pass = c.decide();
    assert!(pass.command.as_ref().is_none_or(|cmd| cmd.method != Method::Drift), "the Drifted budget is 0");
    assert!(
        pass.budget_blocked.contains(&("p".to_string(), crate::apis::nodepool::DisruptionReason::Drifted))
    );
    let mut p = (*c.pools[0]).clone();
    p.spec.disruption.budgets = serde_json::from_value(json!([{"nodes": "1"}])).unwrap();
    c.pools[0] = Arc::new(p);
    let pass = c.decide();
    let command = pass.command.as_ref().unwrap();
    assert_eq!(command.method, Method::Drift);
    assert_eq!(command.plan.replacements.len(), 2, "no cap of one replacement for drift");
}

#[test]
fn a_grace_period_lets_drift_past_blocking_pods_and_unfit_pods_block() {
    let mut c = Cluster::new(vec![pool("p", consolidating("100%"), &["on-demand"])]);
    c.types = vec![itype("large", 4, 0.40, None)];
    c.node("pinned", "p", "large", "on-demand", json!({}))
        .pod("precious", "pinned", "1", json!({"karpenter.sh/do-not-disrupt": "true"}))
        .drifted("pinned", "2026-11-24T11:00:00Z", None);
    let pass = c.decide();
    assert!(pass.command.is_none());
    assert_eq!(pass.blocked["pinned"].code, Code::DoNotDisruptPod);
    c.drifted("pinned", "2026-11-24T11:00:00Z", Some("1h"));
    let pass = c.decide();
    let command = pass.command.as_ref().unwrap();
    assert_eq!(
        (command.method, command.plan.candidates.clone()),
        (Method::Drift, vec!["pinned".to_string()])
    );
    // A pod that fits nowhere, even on a new node, blocks its drifted node.
    let mut c = Cluster::new(vec![pool("p", consolidating("100%"), &["on-demand"])]);
    c.types = vec![itype("large", 4, 0.40, None)];
    c.node("old", "p", "large", "on-demand", json!({})).pod("huge", "old", "3", json!({})).drifted(
        "old",
        "2026-11-24T11:00:00Z",
        None,
    );
    c.pools[0] = {
        let mut p = (*c.pools[0]).clone();
        p.spec.template.spec.requirements.push(
            serde_json::from_value(
                json!({"key": "node.kubernetes.io/instance-type", "operator": "In", "values": ["none"]}),
            )
            .unwrap(),
        );
        Arc::new(p)
    };
    let pass = c.decide();
    assert!(pass.command.is_none());
    assert_eq!(pass.blocked["old"].code, Code::PodsWouldNotSchedule);
}

#[test]
fn a_blocking_drift_budget_is_told_only_when_nodes_drifted() {
    use crate::apis::nodepool::DisruptionReason;
    let held =
        json!({"consolidationPolicy": "WhenEmpty", "consolidateAfter": "Never", "budgets": [{"nodes": "0"}]});
    let mut c = Cluster::new(vec![pool("p", held, &["on-demand"])]);
    c.node("n1", "p", "large", "on-demand", json!({})).pod("w", "n1", "1", json!({}));
    let pass = c.decide();
    assert!(!pass.budget_blocked.iter().any(|(_, r)| *r == DisruptionReason::Drifted), "nothing drifted");
    c.drifted("n1", "2026-11-24T11:00:00Z", None);
    let pass = c.decide();
    assert!(pass.budget_blocked.contains(&("p".to_string(), DisruptionReason::Drifted)));
    assert!(pass.command.is_none());
}

#[test]
fn a_node_tainted_for_disruption_counts_against_the_budget() {
    // A command replacing `a` has tainted it, but its replacement is not in the cache yet, so it
    // is not marked for deletion: it still holds the budget's only slot.
    let mut c = Cluster::new(vec![pool("p", consolidating("1"), &["on-demand"])]);
    c.node("a", "p", "small", "on-demand", json!({})).node("b", "p", "small", "on-demand", json!({}));
    assert_eq!(candidates(&c.decide()).len(), 1, "one empty node may go");
    let mut a = (*c.nodes[0]).clone();
    a.spec.get_or_insert_with(Default::default).taints = Some(vec![
        serde_json::from_value(json!({"key": "karpenter.sh/disrupted", "effect": "NoSchedule"})).unwrap(),
    ]);
    c.nodes[0] = Arc::new(a);
    let pass = c.run(|w| decide(w, &HashSet::from(["a".to_string()])));
    assert!(
        pass.command.is_none(),
        "the budget of 1 is taken by the node being replaced: {:?}",
        candidates(&pass)
    );
}

/// While a decision waits for its validation, drift goes on beside it. The waiting decision's
/// node (in flight, tainted as being replaced, as the controller's snapshot shows it) is neither
/// replaced nor a place for the drifted node's pods, and it holds its slot of the budget.
#[test]
fn drift_beside_a_waiting_decision_leaves_its_nodes_and_their_budget_alone() {
    let budget = |nodes: &str| json!({"consolidationPolicy": "WhenEmpty", "consolidateAfter": "Never", "budgets": [{"nodes": nodes}]});
    let mut c = Cluster::new(vec![pool("p", budget("2"), &["on-demand"])]);
    // The waiting node is the longest drifted, and empty: drift alone would take it first.
    c.node("waiting", "p", "large", "on-demand", json!({})).drifted("waiting", "2026-11-24T10:00:00Z", None);
    c.node("old", "p", "large", "on-demand", json!({})).pod("a", "old", "3", json!({})).drifted(
        "old",
        "2026-11-24T11:00:00Z",
        None,
    );
    let mut waiting = (*c.nodes[0]).clone();
    waiting.spec.get_or_insert_with(Default::default).taints = Some(vec![
        serde_json::from_value(json!({"key": "karpenter.sh/disrupted", "effect": "NoSchedule"})).unwrap(),
    ]);
    c.nodes[0] = Arc::new(waiting);
    let in_flight = HashSet::from(["waiting".to_string()]);

    let pass = c.run(|w| decide_drift(w, &in_flight));
    let command = pass.command.as_ref().expect("the other drifted node is replaced");
    assert_eq!((command.method, command.plan.candidates.clone()), (Method::Drift, vec!["old".to_string()]));
    assert_eq!(command.plan.replacements.len(), 1, "its pod is not planned onto the waiting node");

    c.pools = vec![pool("p", budget("1"), &["on-demand"])];
    let pass = c.run(|w| decide_drift(w, &in_flight));
    assert!(pass.command.is_none(), "the budget's one slot is the waiting node's");
    assert!(pass.budget_constrained);
}

#[test]
fn six_lightly_used_nodes_under_a_one_at_a_time_pdb_go_in_one_multi_node_command() {
    let mut c = Cluster::new(vec![pool("p", consolidating("100%"), &["on-demand"])]);
    for n in ["n1", "n2", "n3", "n4", "n5", "n6"] {
        c.node(n, "p", "small", "on-demand", json!({})).pod(&format!("w-{n}"), n, "100m", json!({}));
    }
    c.pdbs.push(obj(json!({"metadata": {"name": "small", "namespace": "ns"},
        "spec": {"maxUnavailable": 1, "selector": {}},
        "status": {"disruptionsAllowed": 1, "currentHealthy": 6, "desiredHealthy": 5, "expectedPods": 6}})));
    let pass = c.decide();
    let command = pass.command.as_ref().expect("a command");
    assert_eq!(command.method, Method::MultiNode, "{:?}", command.plan.candidates);
}

#[test]
fn a_drifted_node_that_cannot_be_replaced_spends_no_budget_and_the_next_one_goes() {
    // Four drifted nodes under a budget of one; the longest drifted runs a pod that can only run
    // on it. It is blocked with its reason, and the next drifted node is replaced.
    let held =
        json!({"consolidationPolicy": "WhenEmpty", "consolidateAfter": "Never", "budgets": [{"nodes": "1"}]});
    let mut c = Cluster::new(vec![pool("p", held, &["on-demand"])]);
    for (n, since) in [
        ("stuck", "2026-11-24T10:00:00Z"),
        ("a", "2026-11-24T10:10:00Z"),
        ("b", "2026-11-24T10:20:00Z"),
        ("c", "2026-11-24T10:30:00Z"),
    ] {
        c.node(n, "p", "large", "on-demand", json!({}))
            .pod(&format!("w-{n}"), n, "3", json!({}))
            .drifted(n, since, None);
    }
    for pod in c.pods.iter_mut().filter(|p| p.metadata.name.as_deref() == Some("w-stuck")) {
        Arc::make_mut(pod).spec.as_mut().unwrap().node_selector =
            Some([("kubernetes.io/hostname".to_string(), "stuck".to_string())].into());
    }
    let pass = c.decide();
    let command = pass.command.as_ref().expect("a drift command");
    assert_eq!((command.method, command.plan.candidates.clone()), (Method::Drift, vec!["a".to_string()]));
    assert_eq!(pass.blocked["stuck"].code, Code::PodsWouldNotSchedule, "the stuck node says why");
}

#[test]
fn pods_of_a_node_going_away_may_count_on_an_uninitialized_node() {
    // `going` is being deleted; its pod will land on `fresh`, the replacement launched for it,
    // which is not initialized yet. That must not keep `c` (whose pod fits on `d`) from being
    // consolidated: only a candidate's own pods may not count on an uninitialized node.
    let mut c = Cluster::new(vec![pool("p", consolidating("100%"), &["on-demand"])]);
    c.node("c", "p", "small", "on-demand", json!({}))
        .pod("w-c", "c", "1", json!({}))
        .node("d", "p", "large", "on-demand", json!({}))
        .pod("w-d", "d", "2", json!({}))
        .node("going", "p", "large", "on-demand", json!({}))
        .pod("w-going", "going", "3500m", json!({}))
        .node("fresh", "p", "large", "on-demand", json!({}));
    for pod in c.pods.iter_mut().filter(|p| p.metadata.name.as_deref() == Some("w-c")) {
        Arc::make_mut(pod).spec.as_mut().unwrap().node_selector =
            Some([("kubernetes.io/hostname".to_string(), "d".to_string())].into());
    }
    let deleted: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time =
        serde_json::from_value(json!("2026-11-24T11:59:00Z")).unwrap();
    for claim in c.claims.iter_mut() {
        let claim = Arc::make_mut(claim);
        match claim.metadata.name.as_deref() {
            Some("going") => claim.metadata.deletion_timestamp = Some(deleted.clone()),
            Some("fresh") => claim.status.as_mut().unwrap().conditions.clear(),
            _ => {}
        }
    }
    for node in c.nodes.iter_mut().filter(|n| n.metadata.name.as_deref() == Some("fresh")) {
        Arc::make_mut(node).metadata.labels.as_mut().unwrap().remove("karpenter.sh/initialized");
    }
    let outcome = c.run(|w| {
        let candidate = w.nodes.iter().find(|n| n.name == "c").unwrap();
        super::consolidation::simulate_all(w, &[candidate])
            .map(|r| r.replacements.len())
            .map_err(|why| why.message)
    });
    assert_eq!(outcome, Ok(0), "c's pod fits on d; going's pod may land on the fresh node");
}

#[test]
fn a_rebalance_replacement_never_goes_back_to_the_recommended_spot_offering() {
    let only_drift = json!({"consolidationPolicy": "WhenEmpty", "consolidateAfter": "Never", "budgets": [{"nodes": "100%"}]});
    let mut c = Cluster::new(vec![pool("p", only_drift, &["spot"])]);
    c.types = vec![itype("large", 4, 0.40, Some(0.12)), itype("xlarge", 8, 0.80, Some(0.30))];
    c.node("warned", "p", "large", "spot", json!({})).pod("a", "warned", "3", json!({}));
    c.condition("warned", "RebalanceRecommended", "RebalanceRecommendation", "2026-11-24T11:59:00Z", None);
    let pass = c.decide();
    let command = pass.command.as_ref().expect("a replacement");
    assert_eq!(command.plan.replacement_types(), ["xlarge"], "the cheaper large is the recommended offering");
    // With no other type, the node stays and says why.
    c.types = vec![itype("large", 4, 0.40, Some(0.12))];
    let pass = c.decide();
    assert!(pass.command.is_none());
    assert_eq!(pass.blocked["warned"].code, Code::NoOtherOffering);
    // A drifted node is replaced as usual, on its own type if it is the best.
    c.drifted("warned", "2026-11-24T11:59:30Z", None);
    assert_eq!(c.decide().command.expect("drift").plan.replacement_types(), ["large"]);
}

/// A static NodePool's nodes are neither emptied nor consolidated; its drifted node is replaced by
/// one NodeClaim of its template, even when its pods would fit elsewhere, unless the pool is
/// above its replicas.
#[test]
fn static_pools_are_left_to_replicas_and_their_drift_is_replaced_one_for_one() {
    let static_pool = |replicas: i64| {
        let p = pool("fixed", consolidating("100%"), &["on-demand"]);
        let mut p = (*p).clone();
        p.spec.replicas = Some(replicas);
        Arc::new(p)
    };
    let mut c = Cluster::new(vec![static_pool(2), pool("dyn", consolidating("100%"), &["on-demand"])]);
    c.node("empty", "fixed", "small", "on-demand", json!({}))
        .node("busy", "fixed", "large", "on-demand", json!({}))
        .pod("w", "busy", "100m", json!({}))
        .node("room", "dyn", "large", "on-demand", json!({}))
        .pod("x", "room", "100m", json!({}));
    let pass = c.decide();
    assert!(
        !candidates(&pass).iter().any(|n| n == "empty" || n == "busy"),
        "static nodes are not consolidated: {:?}",
        pass.command.as_ref().map(|c| &c.plan)
    );

    assert_eq!(pass.unconsolidatable["empty"].code, Code::StaticNodePool, "the record says why");
    c.drifted("busy", "2026-11-24T11:30:00Z", None);
    let pass = c.decide();
    let command = pass.command.as_ref().unwrap();
    assert_eq!((command.method, candidates(&pass)), (Method::Drift, vec!["busy".to_string()]));
    assert_eq!(command.plan.decision, Decision::Replace, "replaced, though its pod would fit on `room`");
    let replacement = &command.plan.replacements[0];
    assert_eq!(replacement.nodepool, "fixed");
    assert!(replacement.pods.is_empty() && replacement.instance_type_names.is_empty());

    // Above its replicas (a scale-down is under way): the drifted node waits.
    c.pools[0] = static_pool(1);
    let pass = c.decide();
    assert!(!candidates(&pass).contains(&"busy".to_string()), "{:?}", pass.command.as_ref().map(|c| &c.plan));
    assert!(pass.blocked["busy"].message.contains("scaling down"), "{:?}", pass.blocked);
}

//! `karpenter simulate --from-cluster`: what the provisioner and consolidation would do on the
//! live cluster, with some changes applied first, and the cluster's $/h before and after.
//!
//! The changes ([`Changes`]): manifests added (`-f`: NodePools replace those of the same name,
//! workloads' pods are pending, nodes exist), Deployments scaled (`--scale`: pods from the
//! template are added as pending, or the Deployment's pods removed, pending ones first, then the
//! newest), NodePools removed (`--remove-nodepool`: as deleting it does, its nodes go and their
//! pods need a place elsewhere).
//!
//! Then one provisioning simulation (the provisioner's plan for every pending pod), and one
//! disruption pass (the command the controller's next pass would choose, pending pods keeping
//! the room they need, the nodes the provisioner puts pods on nominated). The price after is the price before, minus the nodes the changes remove,
//! plus the new NodeClaims, minus what the command saves: consolidation may go on from there.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use crate::apis::pod::{Pod, PodStatus};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::PodCondition;
use k8s_openapi::jiff::Timestamp;
use serde::Serialize;

use crate::disruption::decide::{self, Inputs};
use crate::scheduling::topology::Selector;
use crate::scheduling::{SchedulerOptions, schedule};
use crate::state::input::{Scenario, scheduling_input};
use crate::state::snapshot::Snapshot;
use crate::state::statenode::state_nodes;
use crate::state::{BuffersPlaced, buffers, pods};
use crate::tools::simulate::Manifests;
use crate::tools::simulate::input::pod_from_template;
use crate::tools::simulate::report::{NodeClaimReport, Report, claim_report, push_table, round_price};

use super::{ToolError, price};

/// `deployment/NAME=N` (or `deployment/NAMESPACE/NAME=N`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Scale {
    /// The namespace (`None`: the command's namespace).
    pub namespace: Option<String>,
    /// The Deployment.
    pub name: String,
    /// Replicas wanted.
    pub replicas: usize,
}

impl std::str::FromStr for Scale {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let usage = || format!("{s:?}: expected deployment/NAME=REPLICAS");
        let (target, replicas) = s.split_once('=').ok_or_else(usage)?;
        let replicas = replicas.trim().parse::<usize>().map_err(|_| usage())?;
        let rest = target
            .strip_prefix("deployment/")
            .or_else(|| target.strip_prefix("deployments/"))
            .or_else(|| target.strip_prefix("deploy/"))
            .ok_or_else(usage)?;
        let (namespace, name) = match rest.split_once('/') {
            Some((ns, name)) => (Some(ns.to_string()), name.to_string()),
            None => (None, rest.to_string()),
        };
        if name.is_empty() || namespace.as_deref() == Some("") {
            return Err(usage());
        }
        Ok(Scale { namespace, name, replicas })
    }
}

/// What to change before simulating.
#[derive(Clone, Debug, Default)]
pub struct Changes {
    /// Manifests to add.
    pub manifests: Manifests,
    /// Deployments to scale, with the Deployment read from the cluster.
    pub scale: Vec<(Scale, Deployment)>,
    /// NodePools to remove.
    pub remove_nodepools: Vec<String>,
}

/// A pod as kube-scheduler leaves one it cannot place: what the provisioner looks for.
fn unschedulable(mut pod: Pod) -> Arc<Pod> {
    if let Some(spec) = pod.spec.as_mut() {
        spec.node_name = None;
    }
    let status = pod.status.get_or_insert_with(PodStatus::default);
    status.phase = Some("Pending".into());
    status.conditions = Some(vec![PodCondition {
        type_: "PodScheduled".into(),
        status: "False".into(),
        reason: Some("Unschedulable".into()),
        ..PodCondition::default()
    }]);
    Arc::new(pod)
}

/// `snapshot` with `changes` applied; returns the names of the nodes the changes remove, and
/// warnings.
pub fn apply(
    mut snapshot: Snapshot,
    changes: &Changes,
    namespace: &str,
) -> Result<(Snapshot, Vec<String>), ToolError> {
    let mut warnings = Vec::new();
    // NodePools removed: their nodes go, as when the NodePool is deleted.
    for name in &changes.remove_nodepools {
        if !snapshot.nodepools.iter().any(|np| np.metadata.name.as_deref() == Some(name)) {
            return Err(ToolError::NotFound { kind: "nodepool", name: name.clone() });
        }
        snapshot.nodepools.retain(|np| np.metadata.name.as_deref() != Some(name));
        for node in state_nodes(&snapshot).iter().filter(|n| n.nodepool() == Some(name)) {
            snapshot.marked_for_deletion.insert(node.name.clone());
            if let Some(claim) = node.claim_name() {
                snapshot.marked_for_deletion.insert(claim.to_string());
            }
        }
    }
    // Manifests added.
    let added = &changes.manifests;
    for np in &added.nodepools {
        snapshot.nodepools.retain(|p| p.metadata.name != np.metadata.name);
        snapshot.nodepools.push(Arc::new(np.clone()));
    }
    for node in &added.nodes {
        snapshot.nodes.retain(|n| n.metadata.name != node.metadata.name);
        snapshot.nodes.push(Arc::new(node.clone()));
    }
    for pod in &added.pods {
        if pods::node_name(pod).is_some() {
            snapshot.pods.push(Arc::clone(pod));
        } else {
            snapshot.pods.push(unschedulable((**pod).clone()));
        }
    }
    snapshot.daemonsets.extend(added.daemonsets.iter().cloned().map(Arc::new));
    snapshot.namespaces.extend(added.namespaces.iter().cloned().map(Arc::new));
    snapshot.persistent_volumes.extend(added.persistent_volumes.iter().cloned().map(Arc::new));
    snapshot.persistent_volume_claims.extend(added.persistent_volume_claims.iter().cloned().map(Arc::new));
    snapshot.storage_classes.extend(added.storage_classes.iter().cloned().map(Arc::new));
    snapshot.csi_nodes.extend(added.csi_nodes.iter().cloned().map(Arc::new));
    warnings.extend(added.warnings.iter().cloned());
    // Deployments scaled.
    for (scale, deployment) in &changes.scale {
        let ns = scale.namespace.as_deref().unwrap_or(namespace);
        let Some(spec) = deployment.spec.as_ref() else {
            return Err(ToolError::Usage(format!("deployment {ns}/{} has no spec", scale.name)));
        };
        let selector = Selector::new(Some(&spec.selector), &BTreeMap::new(), &[], &[]);
        let mut current: Vec<Arc<Pod>> = snapshot
            .pods
            .iter()
            .filter(|p| p.metadata.namespace.as_deref() == Some(ns) && pods::is_active(p))
            .filter(|p| selector.matches(p.metadata.labels.as_ref().unwrap_or(&BTreeMap::new())))
            .cloned()
            .collect();
        if current.len() < scale.replicas {
            for i in current.len()..scale.replicas {
                let pod = pod_from_template(
                    &deployment.metadata,
                    &spec.template,
                    format!("{}-simulated-{i}", scale.name),
                    "ReplicaSet",
                );
                snapshot.pods.push(unschedulable(pod));
            }
        } else {
            // Pending pods go first, then the newest.
            current.sort_by(|a, b| {
                pods::node_name(a)
                    .is_some()
                    .cmp(&pods::node_name(b).is_some())
                    .then_with(|| b.metadata.creation_timestamp.cmp(&a.metadata.creation_timestamp))
                    .then_with(|| pods::key(b).cmp(&pods::key(a)))
            });
            let gone: HashSet<String> =
                current.iter().take(current.len() - scale.replicas).map(|p| pods::key(p)).collect();
            snapshot.pods.retain(|p| !gone.contains(&pods::key(p)));
        }
    }
    Ok((snapshot, warnings))
}

/// The consolidation command of the next disruption pass.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CommandReport {
    /// `emptiness`, `drift`, `multi`, `single`: the method.
    pub reason: String,
    /// `delete` or `replace`.
    pub decision: String,
    /// The nodes.
    pub nodes: Vec<String>,
    /// Their price per hour.
    pub price_per_hour: f64,
    /// The replacements.
    pub replacements: Vec<NodeClaimReport>,
}

/// Where one CapacityBuffer's placeholders go.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct BufferReport {
    /// The buffer, `namespace/name`.
    pub buffer: String,
    /// Existing nodes and NodeClaims keeping room for them, with how many each.
    pub on_existing: BTreeMap<String, usize>,
    /// Placeholders the plan launches new NodeClaims for, by NodePool.
    pub new_capacity: BTreeMap<String, usize>,
    /// Placeholders no NodePool can hold.
    pub fitting_nowhere: usize,
    /// Why the first of those fits nowhere.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// What `simulate --from-cluster` prints.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LiveReport {
    /// The cluster's managed nodes' $/h now.
    pub price_before_per_hour: f64,
    /// Nodes whose price is not known (not managed by Karpenter, or of a type not in the catalog).
    pub nodes_without_price: Vec<String>,
    /// Nodes the changes remove.
    pub removed_nodes: Vec<String>,
    /// The provisioner's plan.
    pub provisioning: Report,
    /// Where the CapacityBuffers' placeholders go in that plan.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub buffers: Vec<BufferReport>,
    /// The next disruption pass's command.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub disruption: Option<CommandReport>,
    /// The $/h after the plan and the command.
    pub price_after_per_hour: f64,
    /// When.
    pub at: Timestamp,
}

/// Simulates on `before` (the live snapshot with instance types) changed by `changes`, with
/// `options` the provisioner's and the disruption simulations' scheduler options.
pub fn simulate(
    before: Snapshot,
    changes: &Changes,
    namespace: &str,
    options: &(SchedulerOptions, SchedulerOptions),
    spot_to_spot: bool,
    now: Timestamp,
) -> Result<(LiveReport, Vec<String>), ToolError> {
    let nodes_before = state_nodes(&before);
    let live = |n: &&crate::state::StateNode| !n.marked_for_deletion;
    let price_before: f64 = nodes_before.iter().filter(live).filter_map(|n| n.price).sum();
    let nodes_without_price: Vec<String> =
        nodes_before.iter().filter(live).filter(|n| n.price.is_none()).map(|n| n.name.clone()).collect();
    let types: BTreeMap<String, Vec<Arc<crate::scheduling::InstanceType>>> = before.pool_types.clone();
    let any_types: Vec<Arc<crate::scheduling::InstanceType>> =
        before.types_by_name.values().cloned().collect();
    let (mut after, warnings) = apply(before, changes, namespace)?;
    // NodePools added by the changes launch from the same catalog.
    let mut pool_types = types;
    for np in after.live_nodepools() {
        let name = np.metadata.name.clone().unwrap_or_default();
        pool_types.entry(name).or_insert_with(|| any_types.clone());
    }
    pool_types.retain(|name, _| after.nodepools.iter().any(|np| np.metadata.name.as_deref() == Some(name)));
    after = after.with_instance_types(pool_types);
    // Prices stay known for nodes whose NodePool is gone.
    for t in &any_types {
        after.types_by_name.entry(t.name.clone()).or_insert_with(|| Arc::clone(t));
    }

    let nodes_after = state_nodes(&after);
    let removed: Vec<&crate::state::StateNode> = nodes_after
        .iter()
        .filter(|n| {
            n.marked_for_deletion && nodes_before.iter().any(|b| b.name == n.name && !b.marked_for_deletion)
        })
        .collect();
    let price_of = |name: &str| nodes_before.iter().find(|b| b.name == name).and_then(|b| b.price);
    let removed_price: f64 = removed.iter().filter_map(|n| price_of(&n.name)).sum();

    // As the provisioner: the pending pods, then the CapacityBuffers' placeholders.
    let scenario =
        Scenario { stand_ins: after.virtual_pods.clone(), options: options.0.clone(), ..Scenario::default() };
    let built = scheduling_input(&after, &nodes_after, after.provisionable_pods(), &scenario);
    let results = schedule(&built.input);
    let provisioning = Report::from_results(&built.input, &results);
    after.buffers_placed = BuffersPlaced::new(buffers::placements(&built.input.pods, &results));
    let buffer_reports = after
        .buffers_placed
        .placements
        .iter()
        .map(|(buffer, p)| BufferReport {
            buffer: buffer.clone(),
            on_existing: p.existing.clone(),
            new_capacity: p.new_capacity.clone(),
            fitting_nowhere: p.failed,
            reason: p.error.clone(),
        })
        .collect();

    // As the provisioner does, the nodes it puts pending pods on are nominated: no disruption
    // takes them while the pods bind (placeholders bind nowhere).
    for placement in &results.existing_placements {
        if placement
            .pods
            .iter()
            .any(|p| built.input.pods.get(p.index).is_some_and(|pod| !buffers::is_virtual(pod)))
        {
            after.nominated.insert(placement.node.clone());
        }
    }
    let inputs = Inputs::of(after, options.1.clone(), spot_to_spot, now, HashSet::new());
    let pass = decide::decide(&inputs.world(), &HashSet::new());
    let disruption = pass.command.as_ref().map(|c| CommandReport {
        reason: c.reason().metric_label().to_string(),
        decision: c.plan.decision.as_str().to_string(),
        nodes: c.plan.candidates.clone(),
        price_per_hour: round_price(c.plan.candidate_price),
        replacements: c.plan.replacements.iter().map(claim_report).collect(),
    });
    let command_delta = disruption
        .as_ref()
        .map(|c| c.replacements.iter().map(|r| r.price_per_hour).sum::<f64>() - c.price_per_hour)
        .unwrap_or(0.0);
    let after_price = price_before - removed_price + provisioning.total_price_per_hour + command_delta;
    let report = LiveReport {
        price_before_per_hour: round_price(price_before),
        nodes_without_price,
        removed_nodes: removed.iter().map(|n| n.name.clone()).collect(),
        provisioning,
        buffers: buffer_reports,
        disruption,
        price_after_per_hour: round_price(after_price.max(0.0)),
        at: now,
    };
    Ok((report, warnings))
}

impl LiveReport {
    /// As text.
    pub fn to_table(&self) -> String {
        let mut out = String::new();
        if !self.removed_nodes.is_empty() {
            out.push_str(&format!("Removed by the changes: {}\n\n", self.removed_nodes.join(", ")));
        }
        out.push_str("Provisioning:\n");
        out.push_str(&self.provisioning.to_table());
        if !self.buffers.is_empty() {
            out.push_str("\nCapacityBuffers:\n");
            let mut rows =
                vec![["BUFFER", "KEPT ON", "NEW CAPACITY", "FITS NOWHERE"].map(String::from).to_vec()];
            let counts = |m: &BTreeMap<String, usize>| {
                let parts: Vec<String> = m.iter().map(|(k, n)| format!("{k} ({n})")).collect();
                if parts.is_empty() { "-".to_string() } else { parts.join(", ") }
            };
            for b in &self.buffers {
                let nowhere = match (&b.reason, b.fitting_nowhere) {
                    (_, 0) => "-".to_string(),
                    (Some(why), n) => format!("{n}: {why}"),
                    (None, n) => n.to_string(),
                };
                rows.push(vec![b.buffer.clone(), counts(&b.on_existing), counts(&b.new_capacity), nowhere]);
            }
            push_table(&mut out, &rows);
        }
        out.push_str("\nDisruption (next pass):\n");
        match &self.disruption {
            None => out.push_str("Nothing to disrupt.\n"),
            Some(c) => {
                let mut rows =
                    vec![["REASON", "DECISION", "NODES", "$/H", "REPLACEMENTS"].map(String::from).to_vec()];
                let replacements: Vec<String> = c
                    .replacements
                    .iter()
                    .map(|r| {
                        format!(
                            "{} ({}, {}) {:.4}",
                            r.instance_type, r.capacity_type, r.zone, r.price_per_hour
                        )
                    })
                    .collect();
                rows.push(vec![
                    c.reason.clone(),
                    c.decision.clone(),
                    c.nodes.join(", "),
                    format!("{:.4}", c.price_per_hour),
                    if replacements.is_empty() { "-".into() } else { replacements.join(", ") },
                ]);
                push_table(&mut out, &rows);
            }
        }
        out.push_str(&format!(
            "\nCLUSTER $/h: {} now, {} after\n",
            price(Some(self.price_before_per_hour)),
            price(Some(self.price_after_per_hour))
        ));
        if !self.nodes_without_price.is_empty() {
            out.push_str(&format!(
                "({} node(s) without a known price not counted: {})\n",
                self.nodes_without_price.len(),
                self.nodes_without_price.join(", ")
            ));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::disruption::tests::{Cluster, NOW, consolidating, pool};

    fn deployment(replicas: i32) -> Deployment {
        serde_json::from_value(json!({"metadata": {"name": "web", "namespace": "ns"},
            "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": "web"}},
                "template": {"metadata": {"labels": {"app": "web"}},
                    "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "1500m"}}}]}}}}))
        .unwrap()
    }

    fn run(c: &Cluster, changes: &Changes) -> LiveReport {
        simulate(c.snapshot(), changes, "ns", &Default::default(), false, NOW.parse().unwrap()).unwrap().0
    }

    #[test]
    fn buffers_keep_their_node_and_say_where_their_placeholders_go() {
        let mut c = Cluster::new(vec![pool("p", consolidating("100%"), &["on-demand"])]);
        c.node("n1", "p", "large", "on-demand", json!({}));
        let empty = run(&c, &Changes::default());
        assert_eq!(empty.disruption.as_ref().map(|d| d.nodes.clone()), Some(vec!["n1".to_string()]));

        let mut snapshot = c.snapshot();
        let buffer = |name: &str, replicas: i32| -> crate::apis::CapacityBuffer {
            serde_json::from_value(json!({"metadata": {"name": name, "namespace": "ns", "uid": name},
                "spec": {"replicas": replicas}}))
            .unwrap()
        };
        let template = |cpu: &str| -> k8s_openapi::api::core::v1::PodTemplateSpec {
            serde_json::from_value(
                json!({"spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": cpu}}}]}}),
            )
            .unwrap()
        };
        snapshot.virtual_pods = buffers::virtual_pods(&buffer("spare", 1), &template("1"), 1);
        snapshot.virtual_pods.extend(buffers::virtual_pods(&buffer("huge", 1), &template("640"), 1));
        let report =
            simulate(snapshot, &Changes::default(), "ns", &Default::default(), false, NOW.parse().unwrap())
                .unwrap()
                .0;
        assert_eq!(report.disruption, None, "the empty node keeps the buffer's room");
        assert_eq!(report.buffers.len(), 2);
        let spare = report.buffers.iter().find(|b| b.buffer == "ns/spare").unwrap();
        assert_eq!(spare.on_existing, [("n1".to_string(), 1)].into());
        let huge = report.buffers.iter().find(|b| b.buffer == "ns/huge").unwrap();
        assert_eq!(huge.fitting_nowhere, 1);
        let table = report.to_table();
        assert!(table.contains("CapacityBuffers:") && table.contains("n1 (1)"), "{table}");
    }

    #[test]
    fn scaling_up_adds_pending_pods_from_the_template_and_prices_them() {
        let mut c = Cluster::new(vec![pool("p", consolidating("100%"), &["on-demand"])]);
        c.node("n1", "p", "small", "on-demand", json!({}));
        let scale = Scale { namespace: None, name: "web".into(), replicas: 2 };
        let changes = Changes { scale: vec![(scale, deployment(0))], ..Changes::default() };
        let report = run(&c, &changes);
        assert!((report.price_before_per_hour - 0.10).abs() < 1e-9);
        let placed: usize = report.provisioning.node_claims.iter().map(|c| c.pods.len()).sum::<usize>()
            + report.provisioning.existing_placements.iter().map(|p| p.pods.len()).sum::<usize>();
        assert_eq!(placed, 2, "{report:?}");
        assert!(
            (report.price_after_per_hour - (0.10 + report.provisioning.total_price_per_hour)).abs() < 1e-9,
            "{report:?}"
        );
    }

    #[test]
    fn scaling_down_removes_pending_pods_first_and_the_empty_node_goes() {
        let mut c = Cluster::new(vec![pool("p", consolidating("100%"), &["on-demand"])]);
        c.node("n1", "p", "small", "on-demand", json!({}))
            .pod("web-1", "n1", "1500m", json!({}))
            .pod_labels("web-1", &[("app", "web")]);
        let snapshot = c.snapshot();
        let scale = Scale { namespace: None, name: "web".into(), replicas: 0 };
        let changes = Changes { scale: vec![(scale, deployment(1))], ..Changes::default() };
        let (report, _) =
            simulate(snapshot, &changes, "ns", &Default::default(), false, NOW.parse().unwrap()).unwrap();
        let command = report.disruption.as_ref().expect("the emptied node goes");
        assert_eq!((command.reason.as_str(), command.decision.as_str()), ("empty", "delete"));
        assert_eq!(command.nodes, ["n1"]);
        assert!(report.price_after_per_hour.abs() < 1e-9, "{report:?}");
    }

    #[test]
    fn removing_a_nodepool_moves_its_pods_to_another() {
        let mut c = Cluster::new(vec![
            pool("old", consolidating("100%"), &["on-demand"]),
            pool("new", consolidating("100%"), &["spot"]),
        ]);
        c.node("n1", "old", "small", "on-demand", json!({})).pod("w", "n1", "1500m", json!({}));
        let changes = Changes { remove_nodepools: vec!["old".into()], ..Changes::default() };
        let report = run(&c, &changes);
        assert_eq!(report.removed_nodes, ["n1"]);
        let claim = &report.provisioning.node_claims[0];
        assert_eq!((claim.node_pool.as_str(), claim.capacity_type.as_str()), ("new", "spot"));
        assert!((report.price_after_per_hour - claim.price_per_hour).abs() < 1e-9, "{report:?}");
        let missing = Changes { remove_nodepools: vec!["ghost".into()], ..Changes::default() };
        let error = simulate(c.snapshot(), &missing, "ns", &Default::default(), false, NOW.parse().unwrap())
            .unwrap_err();
        assert_eq!(error.to_string(), "nodepool \"ghost\" not found");
    }

    #[test]
    fn removing_the_last_nodepool_takes_its_nodes_price_off() {
        let mut c = Cluster::new(vec![pool("only", consolidating("100%"), &["on-demand"])]);
        c.node("n1", "only", "small", "on-demand", json!({})).pod("w", "n1", "1500m", json!({}));
        let changes = Changes { remove_nodepools: vec!["only".into()], ..Changes::default() };
        let report = run(&c, &changes);
        assert_eq!(report.removed_nodes, ["n1"]);
        assert!((report.price_before_per_hour - 0.10).abs() < 1e-9);
        assert!(report.price_after_per_hour.abs() < 1e-9, "{report:?}");
        assert_eq!(report.provisioning.unschedulable.len(), 1, "no NodePool left for its pod");
    }

    #[test]
    fn added_manifests_join_the_cluster() {
        let c = Cluster::new(vec![]);
        let mut manifests = Manifests::default();
        crate::tools::simulate::parse_str(
            "apiVersion: karpenter.sh/v1\nkind: NodePool\nmetadata: {name: extra}\nspec:\n  template:\n    spec:\n      nodeClassRef: {group: karpenter.k8s.aws, kind: EC2NodeClass, name: c}\n      requirements: []\n---\napiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec: {containers: [{name: c, resources: {requests: {cpu: 1}}}]}\n",
            "extra.yaml",
            &mut manifests,
        )
        .unwrap();
        let mut snapshot = c.snapshot();
        snapshot =
            snapshot.with_instance_types([("any".to_string(), crate::disruption::tests::catalog())].into());
        let changes = Changes { manifests, ..Changes::default() };
        let (report, _) =
            simulate(snapshot, &changes, "ns", &Default::default(), false, NOW.parse().unwrap()).unwrap();
        assert_eq!(report.provisioning.node_claims.len(), 1, "{report:?}");
        assert_eq!(report.provisioning.node_claims[0].node_pool, "extra");
    }

    #[test]
    fn scale_targets_parse() {
        assert_eq!(
            "deployment/web=3".parse::<Scale>(),
            Ok(Scale { namespace: None, name: "web".into(), replicas: 3 })
        );
        assert_eq!(
            "deploy/shop/web=0".parse::<Scale>(),
            Ok(Scale { namespace: Some("shop".into()), name: "web".into(), replicas: 0 })
        );
        for bad in ["web=3", "deployment/web", "deployment/web=-1", "statefulset/db=2", "deployment/=1"] {
            assert!(bad.parse::<Scale>().is_err(), "{bad}");
        }
    }
}

//! NodePool status: the resources and node count of each pool (what `kubectl get nodepools`
//! shows), the conditions NodeClassReady, ValidationSucceeded and Ready, the
//! `karpenter.sh/nodepool-hash` annotation, the `karpenter_nodepools_usage` / `_limit` metrics,
//! and `karpenter_pods_state`.
//!
//! It runs on a short period over the cluster state rather than per event: the numbers change
//! with every node, and a pass over a few pools is cheap.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::{Patch, PatchParams};
use tokio::sync::watch;

use crate::apis::common::{ConditionUpdate, set_condition};
use crate::apis::labels::{
    ANNOTATION_NODEPOOL_HASH, ANNOTATION_NODEPOOL_HASH_VERSION, LABEL_ARCH, LABEL_CAPACITY_TYPE,
    LABEL_INSTANCE_TYPE, LABEL_NODEPOOL, LABEL_TOPOLOGY_ZONE,
};
use crate::apis::nodepool::NODEPOOL_HASH_VERSION;
use crate::apis::{NodePool, NodePoolStatus};
use crate::controllers::Context;
use crate::controllers::kit::{Coalesced, Next, Options, run_singleton};
use crate::controllers::node::metrics::metric_value;
use crate::disruption::budgets;
use crate::metrics::{LabelParts, Labels, ObjectGaugeFamily, SharedLabels};
use crate::scheduling::resources::{NODES, parse_quantity_for};
use crate::scheduling::{Requirements, Resources};
use crate::state::statenode::state_nodes;
use crate::state::usage::{Counted, nodepool_usage};
use crate::state::{Changes, ClusterState, Interest, Snapshot};

/// How often the statuses are recomputed when nothing changes.
const PERIOD: Duration = Duration::from_secs(60);
/// Changes within this time of each other are handled in one pass (Nodes report their status
/// all the time: at a thousand Nodes a shorter wait would mean a pass every half second).
const COALESCE: Duration = Duration::from_secs(2);

/// Condition: the pool's node class exists and is ready.
pub const NODE_CLASS_READY: &str = "NodeClassReady";
/// Condition: the pool passed the checks the API server cannot make.
pub const VALIDATION_SUCCEEDED: &str = "ValidationSucceeded";
/// Condition: the pool can launch nodes.
pub const READY: &str = "Ready";

/// Name of the controller, in logs and metrics.
pub const CONTROLLER: &str = "nodepool.status";

/// What the statuses are worked out from: Nodes, NodeClaims, NodePools and node classes (pods
/// wake the controller only for `karpenter_pods_state`).
fn status_inputs() -> Interest {
    Interest {
        nodes: true,
        node_deletions: true,
        nodeclaims: true,
        nodeclaim_deletions: true,
        nodepools: true,
        nodeclasses: true,
        ..Interest::default()
    }
}

/// What the passes keep: the pod series, and the feed's counters when the statuses were last
/// worked out and written without a failure.
#[derive(Default)]
struct Passes {
    pod_states: PodStates,
    statuses: Option<(Changes, Instant)>,
}

/// Runs until `stop` turns true: a pass at start, after every change of Nodes, NodeClaims,
/// NodePools, node classes or pods (a burst of changes makes one pass), and every [`PERIOD`]. A
/// pass that follows changes of pods alone records `karpenter_pods_state` and leaves the
/// statuses, which do not depend on pods: at twenty thousand pods starting, the pods change
/// all the time.
pub async fn run(ctx: Context, state: ClusterState, stop: watch::Receiver<bool>) {
    let interest = Interest { pods: true, ..status_inputs() };
    let changes = Coalesced { changes: state.feed().subscribe(interest), settle: COALESCE };
    let passes = Mutex::new(Passes::default());
    run_singleton(Options::new(CONTROLLER), Some(ctx.metrics.clone()), changes, stop, || async {
        reconcile(&ctx, &state, &passes).await;
        Ok::<_, std::convert::Infallible>(Next::After(PERIOD))
    })
    .await;
}

async fn reconcile(ctx: &Context, state: &ClusterState, passes: &Mutex<Passes>) {
    // Read before the snapshot: a change made after it is seen by the next pass.
    let counters = state.feed().current();
    // The writes are worked out first and the snapshot let go before any is sent: a snapshot held
    // across requests keeps the versions its objects were replaced by meanwhile alive too.
    let writes = {
        let snapshot = state.snapshot();
        let mut passes = passes.lock().unwrap_or_else(PoisonError::into_inner);
        passes.pod_states.record(&ctx.metrics.pods_state, &snapshot);
        if !statuses_due(passes.statuses, &counters) {
            return;
        }
        drop(passes);
        let now = Timestamp::now();
        let nodes = state_nodes(&snapshot);
        let usage = nodepool_usage(&nodes, Counted::Launched);
        ctx.metrics.cluster_state_node_count.get_or_create(&vec![]).set(snapshot.nodes.len() as f64);
        record_budgets(ctx, &snapshot, &nodes);
        let mut writes = Vec::new();
        for np in &snapshot.nodepools {
            if np.metadata.deletion_timestamp.is_some() {
                continue;
            }
            let name = np.metadata.name.clone().unwrap_or_default();
            let class_ready = ctx
                .cloud
                .node_class_readiness(&np.spec.template.spec.node_class_ref, snapshot.node_class_of(np))
                .map_err(|problem| problem.to_string());
            let status = desired_status(np, usage.get(&name), class_ready, now);
            record_metrics(ctx, np, &status);
            let status =
                (np.status.as_ref() != Some(&status)).then(|| serde_json::json!({ "status": status }));
            let hash = np.hash();
            let annotations = np.metadata.annotations.as_ref();
            let hash = (annotations.and_then(|a| a.get(ANNOTATION_NODEPOOL_HASH)) != Some(&hash)
                || annotations.and_then(|a| a.get(ANNOTATION_NODEPOOL_HASH_VERSION)).map(String::as_str)
                    != Some(NODEPOOL_HASH_VERSION))
            .then(|| {
                serde_json::json!({ "metadata": { "annotations": {
                    ANNOTATION_NODEPOOL_HASH: hash,
                    ANNOTATION_NODEPOOL_HASH_VERSION: NODEPOOL_HASH_VERSION,
                }}})
            });
            writes.push((name, status, hash));
        }
        writes
    };
    let api: Api<NodePool> = Api::all(ctx.client.clone());
    let mut failed = false;
    for (name, status, hash) in writes {
        if let Some(patch) = status
            && let Err(error) = api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch)).await
        {
            failed = true;
            tracing::warn!(controller = CONTROLLER, NodePool = %name, error = %error, "updating nodepool status");
        }
        if let Some(patch) = hash
            && let Err(error) = api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await
        {
            failed = true;
            tracing::warn!(controller = "nodepool.hash", NodePool = %name, error = %error, "updating nodepool hash");
        }
    }
    // A failed write is tried again at the next pass, whatever wakes it.
    passes.lock().unwrap_or_else(PoisonError::into_inner).statuses =
        (!failed).then(|| (counters, Instant::now()));
}

/// Whether a pass at the feed's `counters` works out the statuses: always when the last statuses
/// (`last`, the counters then and when) failed or are older than [`PERIOD`], else when a status
/// input changed since.
fn statuses_due(last: Option<(Changes, Instant)>, counters: &Changes) -> bool {
    last.is_none_or(|(seen, at)| status_inputs().differs(&seen, counters) || at.elapsed() >= PERIOD)
}

/// `karpenter_nodepools_allowed_disruptions` and `karpenter_nodepools_nodes_consuming_budgets`, by
/// NodePool and reason, as the disruption budgets give them now (unlimited shows as 2147483647,
/// as upstream's); a budget that cannot be evaluated is logged with its NodePool.
fn record_budgets(ctx: &Context, snapshot: &Snapshot, nodes: &[crate::state::StateNode]) {
    let counts = budgets::pool_nodes(nodes);
    let now = Timestamp::now();
    for reason in budgets::REASONS {
        let reason_label = reason.as_str().to_string();
        for (pool, budget) in budgets::budgets(snapshot.live_nodepools(), &counts, reason, now) {
            if let Some(error) = &budget.error
                && reason == budgets::REASONS[0]
            {
                tracing::error!(controller = CONTROLLER, NodePool = %pool, error = %error, "invalid disruption budget, allowing no disruption");
            }
            let labels = vec![("nodepool", pool), ("reason", reason_label.clone())];
            let allowed = budget.allowed.min(i32::MAX as usize) as f64;
            ctx.metrics.nodepools_allowed_disruptions.get_or_create(&labels).set(allowed);
            ctx.metrics
                .nodepools_nodes_consuming_budgets
                .get_or_create(&labels)
                .set(budget.disrupting as f64);
        }
    }
}

fn record_metrics(ctx: &Context, np: &NodePool, status: &NodePoolStatus) {
    let name = np.metadata.name.clone().unwrap_or_default();
    for (resource, q) in status.resources.iter().flatten() {
        if let Ok(v) = parse_quantity_for(resource, q) {
            ctx.metrics
                .nodepools_usage
                .get_or_create(&vec![("nodepool", name.clone()), ("resource_type", resource.clone())])
                .set(metric_value(resource, v));
        }
    }
    for (resource, q) in np.spec.limits.iter().flatten() {
        if let Ok(v) = parse_quantity_for(resource, q) {
            ctx.metrics
                .nodepools_limit
                .get_or_create(&vec![("nodepool", name.clone()), ("resource_type", resource.clone())])
                .set(metric_value(resource, v));
        }
    }
}

/// `karpenter_pods_state`: one series per pod with where it runs and its phase. The series of a
/// pod are kept between passes while its labels stay the same; a pod gone or changed has its old
/// series removed. A series' labels are three parts: the pod's own (`name`, `namespace`,
/// `owner`), and its node's and its phase's, shared by every pod of the node or the phase.
///
/// A pass looks again only at what changed: a pod (or Node) whose resource version is the one
/// its series (or node part) was made from keeps them without their labels being built, so that
/// at twenty thousand pods a pass costs a lookup per pod.
#[derive(Debug, Default)]
pub struct PodStates {
    /// The series set now, by namespace and then name (looked up without building a key).
    series: HashMap<String, HashMap<String, Seen<SharedLabels>>>,
    /// The label part of each Node, by name.
    nodes: HashMap<String, Seen<Arc<Labels>>>,
    /// The node and phase parts the series hold.
    parts: LabelParts,
    /// The number of the current pass: an entry not marked with it was not seen in the pass.
    pass: u64,
}

/// What a pass made of one pod (its series' labels) or one Node (its label part), with the
/// resource version of the object it was made from and the last pass that saw the object.
#[derive(Debug)]
struct Seen<T> {
    value: T,
    version: String,
    pass: u64,
}

impl PodStates {
    /// Sets the series of the pods of `snapshot` in `family` and removes the others.
    pub fn record(&mut self, family: &ObjectGaugeFamily, snapshot: &Snapshot) {
        self.pass += 1;
        let pass = self.pass;
        let PodStates { series, nodes, parts, .. } = self;
        for n in &snapshot.nodes {
            let Some(name) = n.metadata.name.as_deref() else { continue };
            let version = n.metadata.resource_version.as_deref().unwrap_or_default();
            match nodes.get_mut(name) {
                Some(known) if !version.is_empty() && known.version == version => known.pass = pass,
                known => {
                    let part = parts.get(node_part(name, n.metadata.labels.as_ref()));
                    let fresh = Seen { value: part, version: version.to_string(), pass };
                    match known {
                        Some(known) => *known = fresh,
                        None => {
                            nodes.insert(name.to_string(), fresh);
                        }
                    }
                }
            }
        }
        nodes.retain(|_, n| n.pass == pass);
        let unbound = parts.get(node_part("", None));
        for pod in &snapshot.pods {
            let node = crate::state::pods::node_name(pod).unwrap_or_default();
            let node = nodes.get(node).map_or(&unbound, |n| &n.value);
            let version = pod.metadata.resource_version.as_deref().unwrap_or_default();
            let namespace = pod.metadata.namespace.as_deref().unwrap_or_default();
            let name = pod.metadata.name.as_deref().unwrap_or_default();
            let mut known = series.get_mut(namespace).and_then(|pods| pods.get_mut(name));
            if let Some(same) = known.as_deref_mut()
                && !version.is_empty()
                && same.version == version
                && Arc::ptr_eq(&same.value.0[1], node)
            {
                same.pass = pass;
                continue;
            }
            let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref()).unwrap_or_default();
            let phase = parts.get(vec![("phase", phase.to_string())]);
            let own = pod_part(pod);
            match known {
                Some(known) => {
                    let before = &known.value;
                    if *before.0[0] != own
                        || !Arc::ptr_eq(&before.0[1], node)
                        || !Arc::ptr_eq(&before.0[2], &phase)
                    {
                        family.remove(before);
                        let own = if *before.0[0] == own { Arc::clone(&before.0[0]) } else { Arc::new(own) };
                        known.value = SharedLabels([own, Arc::clone(node), phase]);
                        family.get_or_create(&known.value).set(1.0);
                    }
                    known.version = version.to_string();
                    known.pass = pass;
                }
                None => {
                    let labels = SharedLabels([Arc::new(own), Arc::clone(node), phase]);
                    family.get_or_create(&labels).set(1.0);
                    let entry = Seen { value: labels, version: version.to_string(), pass };
                    series.entry(namespace.to_string()).or_default().insert(name.to_string(), entry);
                }
            }
        }
        series.retain(|_, pods| {
            pods.retain(|_, p| {
                let seen = p.pass == pass;
                if !seen {
                    family.remove(&p.value);
                }
                seen
            });
            !pods.is_empty()
        });
        drop(unbound);
        parts.prune();
    }
}

/// The pod's own labels of `karpenter_pods_state`.
fn pod_part(pod: &crate::apis::pod::Pod) -> Labels {
    let owner = pod
        .metadata
        .owner_references
        .as_ref()
        .and_then(|o| o.first())
        .map(|o| format!("{}/{}", o.kind, o.name))
        .unwrap_or_default();
    vec![
        ("name", pod.metadata.name.clone().unwrap_or_default()),
        ("namespace", pod.metadata.namespace.clone().unwrap_or_default()),
        ("owner", owner),
    ]
}

/// The node's labels of `karpenter_pods_state` (empty values for a pod not bound, or bound to a
/// node not seen).
fn node_part(node: &str, labels: Option<&BTreeMap<String, String>>) -> Labels {
    let label = |k: &str| labels.and_then(|l| l.get(k)).cloned().unwrap_or_default();
    vec![
        ("node", node.to_string()),
        ("nodepool", label(LABEL_NODEPOOL)),
        ("zone", label(LABEL_TOPOLOGY_ZONE)),
        ("arch", label(LABEL_ARCH)),
        ("capacity_type", label(LABEL_CAPACITY_TYPE)),
        ("instance_type", label(LABEL_INSTANCE_TYPE)),
    ]
}

/// The status a pool should have.
pub fn desired_status(
    np: &NodePool,
    usage: Option<&Resources>,
    class_ready: Result<(), String>,
    now: Timestamp,
) -> NodePoolStatus {
    let mut status = np.status.clone().unwrap_or_default();
    let generation = np.metadata.generation;
    let used = usage.cloned().unwrap_or_default();
    status.nodes = used.get(NODES);
    let mut resources = used.to_list();
    resources.remove(NODES);
    resources.insert(
        NODES.to_string(),
        k8s_openapi::apimachinery::pkg::api::resource::Quantity(used.get(NODES).to_string()),
    );
    status.resources = Some(resources);

    let class_ok = class_ready.is_ok();
    match &class_ready {
        Ok(()) => set_condition(
            &mut status.conditions,
            NODE_CLASS_READY,
            ConditionUpdate::true_(NODE_CLASS_READY),
            generation,
            now,
        ),
        Err(message) => set_condition(
            &mut status.conditions,
            NODE_CLASS_READY,
            ConditionUpdate::false_("NodeClassNotReady", message.as_str()),
            generation,
            now,
        ),
    };
    let validation = Requirements::from_nodepool(&np.spec.template.spec.requirements);
    let valid = validation.is_ok();
    match validation {
        Ok(_) => set_condition(
            &mut status.conditions,
            VALIDATION_SUCCEEDED,
            ConditionUpdate::true_(VALIDATION_SUCCEEDED),
            generation,
            now,
        ),
        Err(e) => set_condition(
            &mut status.conditions,
            VALIDATION_SUCCEEDED,
            ConditionUpdate::false_("NodePoolValidationFailed", e.to_string()),
            generation,
            now,
        ),
    };
    if class_ok && valid {
        set_condition(&mut status.conditions, READY, ConditionUpdate::true_(READY), generation, now);
    } else {
        let missing: Vec<&str> =
            [(!class_ok).then_some(NODE_CLASS_READY), (!valid).then_some(VALIDATION_SUCCEEDED)]
                .into_iter()
                .flatten()
                .collect();
        // As upstream's condition sets word it: `Type=Status` of each unhealthy dependent.
        let message = missing.iter().map(|t| format!("{t}=False")).collect::<Vec<_>>().join(", ");
        set_condition(
            &mut status.conditions,
            READY,
            ConditionUpdate::false_("UnhealthyDependents", message),
            generation,
            now,
        );
    }
    status
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use k8s_openapi::api::core::v1::{Node, NodeStatus};
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

    use super::*;
    use crate::apis::ConditionStatus;

    fn nodepool(requirement_op: &str) -> NodePool {
        serde_saphyr::from_str(&format!(
            r#"
apiVersion: karpenter.sh/v1
kind: NodePool
metadata: {{name: general, generation: 3}}
spec:
  template:
    spec:
      nodeClassRef: {{group: karpenter.k8s.aws, kind: EC2NodeClass, name: default}}
      requirements:
        - {{key: karpenter.k8s.aws/instance-generation, operator: {requirement_op}, values: ["5"]}}
"#
        ))
        .unwrap()
    }

    fn node(name: &str, pool: &str, cpu: &str) -> Arc<Node> {
        let mut n = Node::default();
        n.metadata.name = Some(name.into());
        n.metadata.labels = Some([(LABEL_NODEPOOL.to_string(), pool.to_string())].into());
        n.status = Some(NodeStatus {
            capacity: Some([("cpu".to_string(), Quantity(cpu.into()))].into()),
            ..Default::default()
        });
        Arc::new(n)
    }

    #[test]
    fn counts_nodes_and_resources() {
        let snapshot = Snapshot {
            nodes: vec![node("a", "general", "2"), node("b", "general", "4"), node("c", "other", "8")],
            ..Default::default()
        };
        let u = nodepool_usage(&state_nodes(&snapshot), Counted::Launched);
        assert_eq!(u["general"].get("cpu"), 6000);
        assert_eq!(u["general"].get(NODES), 2);
        let np = nodepool("Gt");
        let status = desired_status(&np, u.get("general"), Ok(()), Timestamp::now());
        assert_eq!(status.nodes, 2);
        let resources = status.resources.unwrap();
        assert_eq!(resources["cpu"].0, "6");
        assert_eq!(resources["nodes"].0, "2");
        let ready = status.conditions.iter().find(|c| c.type_ == READY).unwrap();
        assert_eq!(ready.status, ConditionStatus::True);
        assert_eq!(ready.observed_generation, Some(3));
    }

    #[test]
    fn a_missing_class_makes_the_pool_not_ready() {
        let np = nodepool("Gt");
        let snapshot = Snapshot::default();
        let class = snapshot.node_class_ready(&np).map_err(|problem| problem.to_string());
        assert_eq!(class.clone().unwrap_err(), "EC2NodeClass \"default\" not found");
        let status = desired_status(&np, None, class, Timestamp::now());
        let get = |t: &str| status.conditions.iter().find(|c| c.type_ == t).unwrap().clone();
        assert_eq!(get(NODE_CLASS_READY).status, ConditionStatus::False);
        assert_eq!(get(READY).status, ConditionStatus::False);
        assert_eq!(get(READY).message, "NodeClassReady=False");
        assert_eq!(status.nodes, 0);
    }

    fn pod(name: &str, node: &str, phase: &str) -> Arc<crate::apis::pod::Pod> {
        Arc::new(
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": name, "namespace": "ns",
                    "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs", "uid": "u"}]},
                "spec": {"nodeName": node, "containers": []},
                "status": {"phase": phase}
            }))
            .unwrap(),
        )
    }

    fn encoded(family: &ObjectGaugeFamily) -> String {
        let mut registry = prometheus_client::registry::Registry::default();
        registry.register("karpenter_pods_state", "", family.clone());
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        let mut lines: Vec<&str> = text.lines().filter(|l| !l.starts_with('#')).collect();
        lines.sort();
        lines.join("\n")
    }

    #[test]
    fn pod_states_name_where_each_pod_runs_and_follow_the_pods() {
        let mut n = (*node("n1", "general", "2")).clone();
        n.metadata.labels.as_mut().unwrap().insert(LABEL_TOPOLOGY_ZONE.into(), "us-east-1a".into());
        let mut snapshot = Snapshot {
            nodes: vec![Arc::new(n)],
            pods: vec![pod("p", "n1", "Running"), pod("q", "n1", "Running"), pod("r", "", "Pending")],
            ..Default::default()
        };
        let family = ObjectGaugeFamily::default();
        let mut states = PodStates::default();
        states.record(&family, &snapshot);
        let text = encoded(&family);
        assert!(
            text.contains(r#"karpenter_pods_state{name="p",namespace="ns",owner="ReplicaSet/rs",node="n1",nodepool="general",zone="us-east-1a",arch="",capacity_type="",instance_type="",phase="Running"} 1"#),
            "{text}"
        );
        assert!(text.contains(r#"{name="r",namespace="ns",owner="ReplicaSet/rs",node="",nodepool="",zone="",arch="",capacity_type="",instance_type="",phase="Pending"} 1"#), "{text}");
        // The pods of a node share its labels, and the pods of a phase theirs.
        let (p, q) = (&states.series["ns"]["p"].value, &states.series["ns"]["q"].value);
        assert!(Arc::ptr_eq(&p.0[1], &q.0[1]) && Arc::ptr_eq(&p.0[2], &q.0[2]));
        // q is gone and r is bound: one series each, q's removed, p's kept as it was.
        let kept = Arc::clone(&p.0[0]);
        snapshot.pods = vec![pod("p", "n1", "Running"), pod("r", "n1", "Running")];
        states.record(&family, &snapshot);
        let text = encoded(&family);
        assert_eq!(text.lines().count(), 2, "{text}");
        assert!(!text.contains(r#"name="q""#) && !text.contains(r#"phase="Pending""#), "{text}");
        assert!(
            text.contains(r#"{name="r",namespace="ns",owner="ReplicaSet/rs",node="n1",nodepool="general""#),
            "{text}"
        );
        assert!(Arc::ptr_eq(&kept, &states.series["ns"]["p"].value.0[0]));
        // p's series, kept from the first pass, and r's, made in the second, share n1's labels.
        assert!(Arc::ptr_eq(&states.series["ns"]["p"].value.0[1], &states.series["ns"]["r"].value.0[1]));
        // With no pods left only n1's part is kept, for the pods it may get.
        snapshot.pods.clear();
        states.record(&family, &snapshot);
        assert_eq!(encoded(&family), "");
        assert_eq!(states.parts.0.len(), 1, "{:?}", states.parts);
    }

    #[test]
    fn pod_states_look_again_only_at_pods_and_nodes_of_a_new_version()
    -> Result<(), Box<dyn std::error::Error>> {
        let versioned = |pod: Arc<crate::apis::pod::Pod>, version: &str| {
            let mut pod = (*pod).clone();
            pod.metadata.resource_version = Some(version.to_string());
            Arc::new(pod)
        };
        let zoned = |zone: &str, version: &str| {
            let mut n = (*node("n1", "general", "2")).clone();
            n.metadata.labels.get_or_insert_default().insert(LABEL_TOPOLOGY_ZONE.into(), zone.into());
            n.metadata.resource_version = Some(version.to_string());
            Arc::new(n)
        };
        let mut snapshot = Snapshot {
            nodes: vec![zoned("us-east-1a", "1")],
            pods: vec![versioned(pod("p", "n1", "Running"), "1")],
            ..Default::default()
        };
        let family = ObjectGaugeFamily::default();
        let mut states = PodStates::default();
        states.record(&family, &snapshot);
        // The same version of the pod is not read again, whatever it says.
        snapshot.pods = vec![versioned(pod("p", "n1", "Succeeded"), "1")];
        states.record(&family, &snapshot);
        assert!(encoded(&family).contains(r#"phase="Running""#), "{}", encoded(&family));
        // A new version of the pod is.
        snapshot.pods = vec![versioned(pod("p", "n1", "Succeeded"), "2")];
        states.record(&family, &snapshot);
        let text = encoded(&family);
        assert!(text.contains(r#"phase="Succeeded""#) && text.lines().count() == 1, "{text}");
        // A new version of its Node with other labels moves the series of its unchanged pods.
        snapshot.nodes = vec![zoned("us-east-1b", "2")];
        states.record(&family, &snapshot);
        let text = encoded(&family);
        assert!(text.contains(r#"zone="us-east-1b""#) && text.lines().count() == 1, "{text}");
        let p = states.series.get("ns").and_then(|pods| pods.get("p")).ok_or("p's series")?;
        assert_eq!(p.version, "2");
        // A Node gone takes its part with it once no series holds it.
        snapshot.nodes.clear();
        snapshot.pods.clear();
        states.record(&family, &snapshot);
        assert!(states.nodes.is_empty() && states.series.is_empty() && states.parts.0.is_empty());
        assert_eq!(encoded(&family), "");
        Ok(())
    }

    #[test]
    fn statuses_are_worked_out_again_when_their_inputs_change_not_for_pods_alone() {
        let seen = Changes::default();
        let mut pods = seen;
        pods.pods += 10;
        pods.provisionable_pods += 3;
        let just_now = Some((seen, Instant::now()));
        assert!(statuses_due(None, &seen), "the first pass, or after a failed write");
        assert!(!statuses_due(just_now, &seen));
        assert!(!statuses_due(just_now, &pods));
        let mut node = pods;
        node.nodes += 1;
        assert!(statuses_due(just_now, &node));
        let mut claim = pods;
        claim.nodeclaim_deletions += 1;
        assert!(statuses_due(just_now, &claim));
        if let Some(long_ago) = Instant::now().checked_sub(PERIOD) {
            assert!(statuses_due(Some((seen, long_ago)), &pods), "refreshed every period");
        }
    }

    #[test]
    fn an_unchanged_pool_keeps_its_status() {
        let mut np = nodepool("Gt");
        let first = desired_status(&np, None, Ok(()), "2026-01-01T00:00:00Z".parse().unwrap());
        np.status = Some(first.clone());
        assert_eq!(desired_status(&np, None, Ok(()), "2026-01-01T00:01:00Z".parse().unwrap()), first);
    }
}

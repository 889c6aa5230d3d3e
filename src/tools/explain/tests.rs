use std::collections::HashSet;

use serde_json::json;

use super::*;
use crate::disruption::tests::{Cluster, NOW, consolidating, obj, pool};

fn inputs(snapshot: Snapshot) -> Inputs {
    Inputs::of(snapshot, SchedulerOptions::default(), false, NOW.parse().unwrap(), HashSet::new())
}

fn explain(c: &Cluster, node: &str, extra: impl FnOnce(&mut Snapshot)) -> NodeExplanation {
    let mut snapshot = c.snapshot();
    extra(&mut snapshot);
    let inputs = inputs(snapshot);
    let target = find_node(&inputs.nodes, node, false).unwrap();
    explain_node(&inputs, target)
}

#[test]
fn a_do_not_disrupt_pod_blocks_its_node_and_is_named() {
    let mut c = Cluster::new(vec![pool("p", consolidating("100%"), &["on-demand"])]);
    c.node("n1", "p", "large", "on-demand", json!({})).pod(
        "keep",
        "n1",
        "500m",
        json!({"karpenter.sh/do-not-disrupt": "true"}),
    );
    let e = explain(&c, "n1", |_| {});
    assert!(!e.candidate);
    assert_eq!(e.code, Code::DoNotDisruptPod);
    assert!(e.message.contains("ns/keep"), "{}", e.message);
    assert!(e.plan.is_none());
}

#[test]
fn a_pdb_that_allows_nothing_blocks_and_is_named() {
    let mut c = Cluster::new(vec![pool("p", consolidating("100%"), &["on-demand"])]);
    c.node("n1", "p", "large", "on-demand", json!({})).pod("web", "n1", "500m", json!({}));
    let e = explain(&c, "n1", |s| {
        s.pdbs.push(obj(json!({"metadata": {"name": "web-pdb", "namespace": "ns"},
            "spec": {"maxUnavailable": 0, "selector": {}},
            "status": {"disruptionsAllowed": 0, "currentHealthy": 1, "desiredHealthy": 1, "expectedPods": 1}})));
    });
    assert_eq!(e.code, Code::PodDisruptionBudget, "{}", e.message);
    assert!(e.message.contains("ns/web-pdb"), "{}", e.message);
}

#[test]
fn an_underused_node_shows_its_cheaper_replacement_and_a_zero_budget_holds_it() {
    let mut c = Cluster::new(vec![pool("p", consolidating("100%"), &["on-demand"])]);
    c.node("n1", "p", "large", "on-demand", json!({})).pod("w", "n1", "500m", json!({}));
    let e = explain(&c, "n1", |_| {});
    assert!(e.candidate);
    assert_eq!(e.code, Code::Disrupting, "{}", e.message);
    let plan = e.plan.as_ref().expect("a plan");
    assert_eq!(plan.decision, "replace");
    assert_eq!(plan.replacements[0].instance_type, "small");
    assert!(
        (plan.price_per_hour - 0.40).abs() < 1e-9 && (plan.replacement_price_per_hour - 0.10).abs() < 1e-9
    );
    assert!(e.next_pass.starts_with("replace 1 node(s) (underutilized): n1"), "{}", e.next_pass);
    assert!(e.to_table().contains("replace it ($0.4000/h) by small ($0.1000/h)"), "{}", e.to_table());

    let mut held = Cluster::new(vec![pool("p", consolidating("0"), &["on-demand"])]);
    held.node("n1", "p", "large", "on-demand", json!({})).pod("w", "n1", "500m", json!({}));
    let e = explain(&held, "n1", |_| {});
    assert!(e.candidate, "a candidate, held by the budget");
    assert_eq!(e.code, Code::Budget);
    assert!(e.message.contains("Underutilized"), "{}", e.message);
    let underutilized = e.budgets.iter().find(|b| b.reason == "Underutilized").unwrap();
    assert_eq!(underutilized.allowed, Some(0));
}

#[test]
fn drift_and_expiry_are_reported() {
    let mut c = Cluster::new(vec![pool("p", consolidating("100%"), &["on-demand"])]);
    c.node("n1", "p", "large", "on-demand", json!({})).drifted("n1", "2026-11-24T11:30:00Z", Some("1h"));
    let mut snapshot = c.snapshot();
    let claim = Arc::make_mut(&mut snapshot.nodeclaims[0]);
    claim.metadata.creation_timestamp =
        Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time("2026-11-24T10:00:00Z".parse().unwrap()));
    claim.spec.expire_after = "24h".into();
    let inputs = inputs(snapshot);
    let e = explain_node(&inputs, &inputs.nodes[0]);
    assert!(e.drift.drifted);
    assert_eq!(e.drift.reason.as_deref(), Some("NodePoolDrifted"));
    assert_eq!(e.expiry.expires_at, Some("2026-11-25T10:00:00Z".parse().unwrap()));
    assert_eq!(e.expiry.gone_by, Some("2026-11-25T11:00:00Z".parse().unwrap()));
    assert_eq!(e.code, Code::Disrupting, "drifted and empty: deleted by drift ({})", e.message);
    assert!(e.message.contains("drifted"), "{}", e.message);
}

#[test]
fn unknown_nodes_are_an_error() {
    let c = Cluster::new(vec![pool("p", consolidating("100%"), &["on-demand"])]);
    let inputs = inputs(c.snapshot());
    let error = find_node(&inputs.nodes, "ghost", true).unwrap_err();
    assert_eq!(error.to_string(), "nodeclaim \"ghost\" not found");
}

fn pending(name: &str, cpu: &str, selector: serde_json::Value) -> Arc<Pod> {
    obj(json!({"metadata": {"name": name, "namespace": "ns", "uid": name},
        "spec": {"nodeSelector": selector, "containers": [{"name": "c", "resources": {"requests": {"cpu": cpu}}}]},
        "status": {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
            "message": "0/1 nodes are available"}]}}))
}

#[test]
fn each_nodepool_says_why_a_pending_pod_does_not_fit() {
    let mut tainted = (*pool("tainted", consolidating("100%"), &["on-demand"])).clone();
    tainted.spec.template.spec.taints = vec![
        serde_json::from_value(json!({"key": "dedicated", "value": "gpu", "effect": "NoSchedule"})).unwrap(),
    ];
    let mut limited = (*pool("limited", consolidating("100%"), &["on-demand"])).clone();
    limited.spec.limits = Some(serde_json::from_value(json!({"cpu": "1"})).unwrap());
    let spot = pool("spot", consolidating("100%"), &["spot"]);
    let open = pool("open", consolidating("100%"), &["on-demand"]);
    let mut c = Cluster::new(vec![Arc::new(tainted), Arc::new(limited), spot, open]);
    // A full node: the pod goes to a new NodeClaim.
    c.node("full", "open", "small", "on-demand", json!({})).pod("w", "full", "2", json!({}));
    let mut snapshot = c.snapshot();
    let pod = pending("p", "1500m", json!({"karpenter.sh/capacity-type": "on-demand"}));
    snapshot.pods.push(Arc::clone(&pod));
    let e = explain_pod(&snapshot, &pod, &SchedulerOptions::default());
    assert_eq!(e.scheduler_message.as_deref(), Some("0/1 nodes are available"));
    let fit = |name: &str| e.nodepools.iter().find(|f| f.nodepool == name).unwrap().clone();
    let open = fit("open");
    assert!(open.fits);
    assert_eq!(open.node_claim.as_ref().unwrap().instance_type, "small");
    let reason = |name: &str| fit(name).reason.unwrap_or_default();
    assert!(
        !fit("tainted").fits && reason("tainted").contains("dedicated=gpu:NoSchedule"),
        "{}",
        reason("tainted")
    );
    assert!(
        !fit("limited").fits && reason("limited").contains("would exceed nodepool limits cpu"),
        "{}",
        reason("limited")
    );
    assert!(!fit("spot").fits && reason("spot").contains("karpenter.sh/capacity-type"), "{}", reason("spot"));
    match &e.placement {
        Placement::NewNodeClaim { node_claim } => {
            assert_eq!(node_claim.instance_type, "small");
            assert!((node_claim.price_per_hour - 0.10).abs() < 1e-9);
        }
        other => panic!("{other:?}"),
    }
    let table = e.to_table();
    assert!(table.contains("Placement:  a new NodeClaim of NodePool"), "{table}");

    // Room on an existing node: the pod goes there.
    let small = pending("tiny", "100m", json!({}));
    let mut c2 = Cluster::new(vec![pool("open", consolidating("100%"), &["on-demand"])]);
    c2.node("roomy", "open", "large", "on-demand", json!({}));
    let mut snapshot = c2.snapshot();
    snapshot.pods.push(Arc::clone(&small));
    let e = explain_pod(&snapshot, &small, &SchedulerOptions::default());
    assert_eq!(e.placement, Placement::ExistingNode { node: "roomy".into() });
    assert!(e.nodepools[0].fits, "the NodePool could launch for it too");
}

#[test]
fn a_bound_pod_says_where_it_runs() {
    let mut c = Cluster::new(vec![pool("open", consolidating("100%"), &["on-demand"])]);
    c.node("n1", "open", "large", "on-demand", json!({})).pod("w", "n1", "1", json!({}));
    let snapshot = c.snapshot();
    let pod = find_pod(&snapshot, "ns", "w").unwrap();
    let e = explain_pod(&snapshot, &pod, &SchedulerOptions::default());
    assert_eq!(e.placement, Placement::Bound { node: "n1".into() });
    assert_eq!(find_pod(&snapshot, "ns", "nope").unwrap_err().to_string(), "pod \"ns/nope\" not found");
}

#[test]
fn no_cheaper_replacement_shows_the_cheapest_option_found() {
    let mut c = Cluster::new(vec![pool("p", consolidating("100%"), &["on-demand"])]);
    c.node("n1", "p", "small", "on-demand", json!({})).pod("w", "n1", "1500m", json!({}));
    let e = explain(&c, "n1", |_| {});
    assert_eq!(e.code, Code::NoCheaperReplacement, "{}", e.message);
    let alternative = e.cheapest_alternative.as_ref().expect("the option found");
    assert_eq!(alternative.instance_type, "small");
    assert!(e.to_table().contains("Cheapest option"), "{}", e.to_table());
}

#[test]
fn a_running_pod_does_not_count_against_itself() {
    // One per zone, and the only zone is the one the pod runs in: as if pending, it fits again.
    let mut c = Cluster::new(vec![pool("open", consolidating("100%"), &["on-demand"])]);
    c.node("n1", "open", "large", "on-demand", json!({}))
        .pod("w", "n1", "1", json!({}))
        .pod_labels("w", &[("app", "web")]);
    let mut snapshot = c.snapshot();
    let mut pod = (*snapshot.pods[0]).clone();
    pod.spec.as_mut().unwrap().affinity = Some(
        serde_json::from_value(json!({"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
            {"labelSelector": {"matchLabels": {"app": "web"}}, "topologyKey": "topology.kubernetes.io/zone"}]}}))
        .unwrap(),
    );
    snapshot.pods[0] = Arc::new(pod);
    let pod = find_pod(&snapshot, "ns", "w").unwrap();
    let e = explain_pod(&snapshot, &pod, &SchedulerOptions::default());
    assert!(e.nodepools[0].fits, "{:?}", e.nodepools[0]);
}

#[test]
fn overlays_that_price_a_replacement_are_named_and_static_nodes_say_why_they_stay() {
    let mut c = Cluster::new(vec![pool("p", consolidating("100%"), &["on-demand"])]);
    c.node("n1", "p", "large", "on-demand", json!({})).pod("w", "n1", "500m", json!({}));
    let overlay: Arc<crate::apis::NodeOverlay> = obj(json!({
        "apiVersion": "karpenter.sh/v1alpha1", "kind": "NodeOverlay", "metadata": {"name": "discount"},
        "spec": {"requirements": [{"key": "node.kubernetes.io/instance-type", "operator": "In", "values": ["small"]}],
            "price": "0.01"},
        "status": {"conditions": [{"type": "Ready", "status": "True", "reason": "Ready", "message": "",
            "lastTransitionTime": "2026-11-27T00:00:00Z"}]}}));
    let e =
        explain(&c, "n1", |s| *s = crate::tools::with_overlays(s.clone(), std::slice::from_ref(&overlay)));
    let plan = e.plan.as_ref().expect("a plan");
    assert_eq!(plan.replacements[0].instance_type, "small");
    assert_eq!(plan.replacements[0].price_overlays, ["discount"]);
    assert!((plan.replacement_price_per_hour - 0.01).abs() < 1e-9);

    let mut fixed = (*pool("f", consolidating("100%"), &["on-demand"])).clone();
    fixed.spec.replicas = Some(1);
    let mut c = Cluster::new(vec![Arc::new(fixed)]);
    c.node("n1", "f", "large", "on-demand", json!({})).pod("w", "n1", "500m", json!({}));
    let e = explain(&c, "n1", |_| {});
    assert_eq!(e.code, Code::StaticNodePool, "{}", e.message);
    assert!(!e.candidate);
}

#[test]
fn an_empty_node_kept_for_a_buffer_names_the_buffer() {
    let mut c = Cluster::new(vec![pool("p", consolidating("100%"), &["on-demand"])]);
    c.node("n1", "p", "large", "on-demand", json!({}));
    let empty = explain(&c, "n1", |_| {});
    assert_eq!(empty.code, Code::Disrupting, "{}", empty.message);
    assert!(empty.buffers.is_empty());

    let e = explain(&c, "n1", |s| {
        let buffer: crate::apis::CapacityBuffer = serde_json::from_value(json!({
            "metadata": {"name": "spare", "namespace": "ns", "uid": "u"}, "spec": {"replicas": 2}}))
        .unwrap();
        let template = serde_json::from_value(
            json!({"spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}]}}),
        )
        .unwrap();
        s.virtual_pods = crate::state::buffers::virtual_pods(&buffer, &template, 2);
        *s = crate::tools::with_buffers_placed(std::mem::take(s));
    });
    assert!(!e.candidate);
    assert_eq!((e.code, e.message.as_str()), (Code::BufferPods, "Node \"n1\" has buffer pods"));
    assert_eq!(e.buffers, [("ns/spare".to_string(), 2)]);
    assert!(
        e.to_table().contains("CapacityBuffer ns/spare keeps room for 2 placeholders here"),
        "{}",
        e.to_table()
    );
    assert!(e.next_pass.starts_with("nothing to disrupt"), "{}", e.next_pass);
}

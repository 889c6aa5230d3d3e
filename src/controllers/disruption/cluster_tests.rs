//! A disruption command against a real API server: what it does when the cluster moved between
//! the decision and the command.
//!
//! Needs the local control plane (`eval "$(make -s cluster-up)"`, CRDs installed); ignored by a
//! plain `cargo test`.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::api::ListParams;
use kube::{Api, ResourceExt};

use super::command::Run;
use super::{InFlight, Launched};
use crate::apis::labels::{LABEL_INSTANCE_TYPE, LABEL_NODEPOOL, TAINT_DISRUPTED};
use crate::apis::nodeclaim::conditions::DISRUPTION_REASON;
use crate::apis::{NodeClaim, NodePool};
use crate::controllers::node::termination::tests::{Harness, eventually, with_harness};
use crate::controllers::{Context, Events};
use crate::disruption::consolidation::Moves;
use crate::disruption::decide::{Command, Method};
use crate::metrics::Metrics;
use crate::scheduling::{NewNodeClaim, Requirement, Requirements};
use crate::state::ClusterState;
use crate::state::statenode::state_nodes;

/// A command deleting the harness's node, as a pass decided it before `arrive` ran; runs it and
/// returns the metrics it counted into.
async fn command_after(h: &Harness, arrive: impl std::future::Future<Output = ()>) -> Arc<Metrics> {
    run_command(h, arrive, None, None).await
}

/// How the command's cluster state and time limit are set.
struct Setup {
    /// The command's cluster state never sees a NodeClaim (a cache lagging behind).
    stale_claims: bool,
    /// How long the replacement has to initialize.
    timeout: Duration,
}

/// A replacement of one m5.large from NodePool `pool` (whose template names no node class that
/// exists: it never launches).
fn replacement(pool: &str) -> NewNodeClaim {
    let mut requirements = Requirements::new();
    requirements.add(LABEL_INSTANCE_TYPE, Requirement::in_values(["m5.large"]));
    NewNodeClaim {
        nodepool: pool.to_string(),
        requirements,
        instance_type_names: ["m5.large"].into(),
        labels: Default::default(),
        taints: vec![],
        startup_taints: vec![],
        requests: Default::default(),
        daemonset_requests: Default::default(),
        pods: vec![],
        instance_type_options: Arc::from([]),
        min_values_relaxed: false,
    }
}

fn nodepool(name: &str) -> Arc<NodePool> {
    Arc::new(
        serde_json::from_value(serde_json::json!({
            "apiVersion": "karpenter.sh/v1", "kind": "NodePool", "metadata": {"name": name},
            "spec": {"template": {"spec": {"requirements": [],
                "nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": name}}}}
        }))
        .unwrap(),
    )
}

/// [`command_after`], replacing the node by `replacement` from `pool` (`None`: deleted since the
/// decision) if given; the replacement has 3 s to initialize.
async fn run_command(
    h: &Harness,
    arrive: impl std::future::Future<Output = ()>,
    replacement: Option<NewNodeClaim>,
    pool: Option<Arc<NodePool>>,
) -> Arc<Metrics> {
    let setup = Setup { stale_claims: false, timeout: Duration::from_secs(3) };
    run_command_with(h, arrive, replacement, pool, setup).await
}

async fn run_command_with(
    h: &Harness,
    arrive: impl std::future::Future<Output = ()>,
    replacement: Option<NewNodeClaim>,
    pool: Option<Arc<NodePool>>,
    setup: Setup,
) -> Arc<Metrics> {
    let (state, watches) = ClusterState::start(h.client.clone());
    let watches = tokio::spawn(watches);
    state.wait_synced().await;
    eventually("the node and its NodeClaim in the cache", Duration::from_secs(30), || async {
        state_nodes(&state.snapshot())
            .iter()
            .any(|n| n.name == h.name && n.claim.is_some() && n.node.is_some())
    })
    .await;
    let node = state_nodes(&state.snapshot()).into_iter().find(|n| n.name == h.name).unwrap();
    arrive.await;

    let metrics = Arc::new(Metrics::unregistered());
    let ctx = Context {
        client: h.client.clone(),
        cloud: h.cloud.clone(),
        settings: Default::default(),
        metrics: metrics.clone(),
        events: Events::new(h.client.clone(), Some(h.name.clone())),
        decisions: Default::default(),
        surges: Default::default(),
    };
    let in_flight = InFlight::default();
    in_flight.lock().unwrap().insert(h.name.clone(), true);
    let state = if setup.stale_claims { state.forgetting_pods_and_nodeclaims() } else { state };
    let run = Run {
        ctx,
        state,
        in_flight: in_flight.clone(),
        launched: Launched::default(),
        command: Command {
            method: Method::SingleNode,
            plan: Moves { replacements: replacement.into_iter().collect(), ..Default::default() }.plan(
                vec![h.name.clone()],
                0.1,
                0.1,
            ),
            scores: vec![],
        },
        nodes: vec![node],
        pools: pool.into_iter().map(|p| (p.metadata.name.clone().unwrap_or_default(), p)).collect(),
        timeout: setup.timeout,
    };
    tokio::time::timeout(Duration::from_secs(60), run.execute()).await.expect("the command ends");
    assert!(in_flight.lock().unwrap().is_empty(), "the node left the in-flight set");
    watches.abort();
    metrics
}

/// The node and its NodeClaim are as before the command: not deleted, no taint, no condition.
async fn assert_untouched(h: &Harness) {
    let claims: Api<NodeClaim> = Api::all(h.client.clone());
    let claim = claims.get(&h.name).await.unwrap();
    assert!(claim.metadata.deletion_timestamp.is_none(), "the NodeClaim was not deleted");
    let conditions = claim.status.map(|s| s.conditions).unwrap_or_default();
    assert!(conditions.iter().all(|c| c.type_ != DISRUPTION_REASON), "{conditions:?}");
    let node: Node = h.node().await.expect("the node is still there");
    assert!(node.metadata.deletion_timestamp.is_none());
    let taints = node.spec.and_then(|s| s.taints).unwrap_or_default();
    assert!(taints.iter().all(|t| t.key != TAINT_DISRUPTED), "the taint was removed: {taints:?}");
}

fn failures(metrics: &Metrics, decision: &str) -> u64 {
    metrics
        .disruption_queue_failures
        .get_or_create(&vec![
            ("decision", decision.to_string()),
            ("reason", "underutilized".to_string()),
            ("consolidation_type", "single".to_string()),
        ])
        .get()
}

#[tokio::test]
#[ignore = "needs the local control plane"]
async fn a_do_not_disrupt_pod_that_arrives_after_the_decision_keeps_its_node() {
    with_harness("disrupt-pinned", |h| async move {
        h.create_node().await;
        h.create_claim(None).await;
        let metrics = command_after(&h, h.create_pinned_pod("pinned", 0)).await;
        assert_untouched(&h).await;
        assert_eq!(failures(&metrics, "delete"), 1);
    })
    .await;
}

#[tokio::test]
#[ignore = "needs the local control plane"]
async fn a_pod_that_arrives_after_the_decision_keeps_its_node() {
    with_harness("disrupt-late", |h| async move {
        h.create_node().await;
        h.create_claim(None).await;
        let metrics = command_after(&h, h.create_pod("late", "late", 0)).await;
        assert_untouched(&h).await;
        assert_eq!(failures(&metrics, "delete"), 1);
    })
    .await;
}

#[tokio::test]
#[ignore = "needs the local control plane"]
async fn a_nodepool_deleted_since_the_decision_abandons_the_replacement() {
    with_harness("disrupt-nopool", |h| async move {
        h.create_node().await;
        h.create_claim(None).await;
        let pool = format!("{}-pool", h.name);
        let metrics = run_command(&h, async {}, Some(replacement(&pool)), None).await;
        assert_untouched(&h).await;
        assert_eq!(failures(&metrics, "replace"), 1);
        let claims: Api<NodeClaim> = Api::all(h.client.clone());
        let made =
            claims.list(&ListParams::default().labels(&format!("{LABEL_NODEPOOL}={pool}"))).await.unwrap();
        assert!(made.items.is_empty(), "no replacement was created");
    })
    .await;
}

#[tokio::test]
#[ignore = "needs the local control plane"]
async fn a_replacement_that_never_initializes_keeps_the_node() {
    with_harness("disrupt-noinit", |h| async move {
        h.create_node().await;
        h.create_claim(None).await;
        let pool = format!("{}-pool", h.name);
        let metrics = run_command(&h, async {}, Some(replacement(&pool)), Some(nodepool(&pool))).await;
        assert_untouched(&h).await;
        assert_eq!(failures(&metrics, "replace"), 1);
        // The replacement that was created stays (it goes as an empty node if it ever comes up).
        let claims: Api<NodeClaim> = Api::all(h.client.clone());
        let made =
            claims.list(&ListParams::default().labels(&format!("{LABEL_NODEPOOL}={pool}"))).await.unwrap();
        assert_eq!(made.items.len(), 1);
        for claim in made.items {
            let _ = claims.delete(&claim.name_any(), &Default::default()).await;
        }
    })
    .await;
}

/// Heal and undo never untaint a node that is draining: neither one being deleted (though the
/// copy they hold predates its deletion) nor one whose NodeClaim is being deleted.
#[tokio::test]
#[ignore = "needs the local control plane"]
async fn the_disrupted_taint_stays_on_a_node_or_nodeclaim_being_deleted() {
    use crate::controllers::node::remove_disrupted_taint;
    use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
    use serde_json::json;
    const HOLD: &str = "karpenter-rs.test/hold";
    let client = kube::Client::try_default().await.unwrap();
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
    let name = format!("untaint-{}-{}", std::process::id(), nanos % 1_000_000_000);
    let nodes: Api<Node> = Api::all(client.clone());
    let claims: Api<NodeClaim> = Api::all(client.clone());
    let taint = json!([{"key": TAINT_DISRUPTED, "effect": "NoSchedule"}]);
    let new_node = |n: &str| -> Node {
        serde_json::from_value(json!({"metadata": {"name": n, "finalizers": [HOLD]},
            "spec": {"taints": taint}}))
        .unwrap()
    };
    let tainted = |node: Node| {
        node.spec.and_then(|s| s.taints).unwrap_or_default().iter().any(|t| t.key == TAINT_DISRUPTED)
    };

    // A node being deleted, seen through a copy from before its deletion.
    let going = format!("{name}-node");
    let before = nodes.create(&PostParams::default(), &new_node(&going)).await.unwrap();
    nodes.delete(&going, &DeleteParams::default()).await.unwrap();
    let kept = remove_disrupted_taint(&client, &before, None).await.unwrap();
    assert!(kept.is_none());
    assert!(tainted(nodes.get(&going).await.unwrap()), "the draining node kept its taint");

    // A node whose NodeClaim is being deleted.
    let stays = format!("{name}-claimed");
    let node = nodes.create(&PostParams::default(), &new_node(&stays)).await.unwrap();
    let claim: NodeClaim = serde_json::from_value(json!({"apiVersion": "karpenter.sh/v1", "kind": "NodeClaim",
        "metadata": {"name": stays, "finalizers": [HOLD]},
        "spec": {"requirements": [], "nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "default"}}}))
    .unwrap();
    claims.create(&PostParams::default(), &claim).await.unwrap();
    claims.delete(&stays, &DeleteParams::default()).await.unwrap();
    assert!(remove_disrupted_taint(&client, &node, Some(&stays)).await.unwrap().is_none());
    assert!(tainted(nodes.get(&stays).await.unwrap()), "the node of a deleting NodeClaim kept its taint");

    // Once nothing is going away, the taint goes.
    let release = json!({"metadata": {"finalizers": null}});
    claims.patch(&stays, &PatchParams::default(), &Patch::Merge(&release)).await.unwrap();
    let node = nodes.get(&stays).await.unwrap();
    assert!(remove_disrupted_taint(&client, &node, Some(&stays)).await.unwrap().is_some());
    assert!(!tainted(nodes.get(&stays).await.unwrap()));

    for n in [&going, &stays] {
        let _ = nodes.patch(n, &PatchParams::default(), &Patch::Merge(&release)).await;
        let _ = nodes.delete(n, &DeleteParams::default()).await;
    }
}

/// A replacement the cluster state has not seen yet is not taken for gone: the API server is
/// asked, and the command goes on once the replacement initializes.
#[tokio::test]
#[ignore = "needs the local control plane"]
async fn a_replacement_the_cache_does_not_show_is_waited_for() {
    use kube::api::{Patch, PatchParams};
    use serde_json::json;
    with_harness("disrupt-lag", |h| async move {
        h.create_node().await;
        h.create_claim(None).await;
        let pool = format!("{}-pool", h.name);
        let claims: Api<NodeClaim> = Api::all(h.client.clone());
        // Stands in for the lifecycle: initializes the replacement as soon as it exists.
        let initializer = {
            let (claims, pool) = (claims.clone(), pool.clone());
            tokio::spawn(async move {
                loop {
                    let made = claims
                        .list(&ListParams::default().labels(&format!("{LABEL_NODEPOOL}={pool}")))
                        .await
                        .unwrap();
                    if let Some(claim) = made.items.first() {
                        let status = json!({"status": {"conditions": [{"type": "Initialized", "status": "True",
                            "reason": "Initialized", "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"}]}});
                        claims
                            .patch_status(&claim.name_any(), &PatchParams::default(), &Patch::Merge(&status))
                            .await
                            .unwrap();
                        return claim.name_any();
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            })
        };
        let setup = Setup { stale_claims: true, timeout: Duration::from_secs(30) };
        let metrics = run_command_with(&h, async {}, Some(replacement(&pool)), Some(nodepool(&pool)), setup).await;
        let made = initializer.await.unwrap();
        assert_eq!(failures(&metrics, "replace"), 0, "the command did not give up");
        let old = claims.get_opt(&h.name).await.unwrap();
        assert!(old.is_none_or(|c| c.metadata.deletion_timestamp.is_some()), "the old NodeClaim was deleted");
        let _ = claims.delete(&made, &Default::default()).await;
    })
    .await;
}

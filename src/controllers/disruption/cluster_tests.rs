//! A disruption command against a real API server: what it does when the cluster moved between
//! the decision and the command.
//!
//! Needs the local control plane (`eval "$(make -s cluster-up)"`, CRDs installed); ignored by a
//! plain `cargo test`.

use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use k8s_openapi::api::core::v1::Node;
use kube::Api;

use super::command::Run;
use super::{InFlight, Launched};
use crate::apis::NodeClaim;
use crate::apis::labels::TAINT_DISRUPTED;
use crate::apis::nodeclaim::conditions::DISRUPTION_REASON;
use crate::controllers::node::termination::tests::{Cli, Harness, eventually, with_harness};
use crate::controllers::{Context, Events};
use crate::disruption::consolidation::{Decision, Plan};
use crate::disruption::decide::{Command, Method};
use crate::operator::metrics::Metrics;
use crate::state::ClusterState;
use crate::state::statenode::state_nodes;

/// A command deleting the harness's node, as a pass decided it before `arrive` ran; runs it and
/// returns the metrics it counted into.
async fn command_after(h: &Harness, arrive: impl std::future::Future<Output = ()>) -> Arc<Metrics> {
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
        settings: Arc::new(Cli::parse_from(["karpenter", "--cluster-name", "test"]).settings),
        metrics: metrics.clone(),
        events: Events::new(h.client.clone(), Some(h.name.clone())),
        decisions: Default::default(),
    };
    let in_flight = InFlight::default();
    in_flight.lock().unwrap().insert(h.name.clone());
    let run = Run {
        ctx,
        state,
        in_flight: in_flight.clone(),
        launched: Launched::default(),
        command: Command {
            method: Method::SingleNode,
            plan: Plan {
                candidates: vec![h.name.clone()],
                decision: Decision::Delete,
                replacement: None,
                candidate_price: 0.1,
                savings: 0.1,
            },
            scores: vec![],
        },
        nodes: vec![node],
        pool: None,
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

fn failures(metrics: &Metrics) -> u64 {
    metrics
        .disruption_queue_failures
        .get_or_create(&vec![
            ("decision", "delete".to_string()),
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
        assert_eq!(failures(&metrics), 1);
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
        assert_eq!(failures(&metrics), 1);
    })
    .await;
}

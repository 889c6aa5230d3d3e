//! Leader election against a real API server: one leader at a time, takeover after the leader
//! dies, immediate handover when it releases the Lease on shutdown.
//!
//! Needs the local control plane (`make test`); ignored by a plain `cargo test`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use karpenter::operator::leader::{LeaderElector, Timing};
use kube::Client;
use kube::api::{Api, DeleteParams};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep, timeout};

const NAMESPACE: &str = "default";

fn fast() -> Timing {
    Timing {
        lease_duration: Duration::from_secs(3),
        renew_deadline: Duration::from_secs(2),
        retry_period: Duration::from_millis(300),
    }
}

struct Candidate {
    leading: watch::Receiver<bool>,
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

fn campaign(client: &Client, lease: &str, identity: &str) -> Candidate {
    let elector = LeaderElector::new(client.clone(), NAMESPACE, lease, identity, fast());
    let (leading_tx, leading) = watch::channel(false);
    let (stop, stop_rx) = watch::channel(false);
    let task = tokio::spawn(elector.run(leading_tx, stop_rx));
    Candidate { leading, stop, task }
}

async fn until(what: &str, limit: Duration, mut check: impl FnMut() -> bool) -> Duration {
    let start = Instant::now();
    timeout(limit, async {
        while !check() {
            sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("{what} did not happen within {limit:?}"));
    start.elapsed()
}

async fn holder(client: &Client, lease: &str) -> Option<String> {
    let api: Api<Lease> = Api::namespaced(client.clone(), NAMESPACE);
    api.get(lease).await.unwrap().spec.and_then(|s| s.holder_identity)
}

#[tokio::test]
#[ignore = "needs the local control plane: make test"]
async fn one_leader_takeover_on_death_and_handover_on_release() {
    let client = Client::try_default().await.expect("a kubeconfig for the local control plane (make test)");
    let lease = format!("leader-test-{}", std::process::id());
    let api: Api<Lease> = Api::namespaced(client.clone(), NAMESPACE);
    let _ = api.delete(&lease, &DeleteParams::default()).await;

    let a = campaign(&client, &lease, "replica-a");
    let b = campaign(&client, &lease, "replica-b");
    until("a leader elected", Duration::from_secs(10), || *a.leading.borrow() || *b.leading.borrow()).await;

    // Exactly one leads, and keeps leading, for several lease durations.
    let end = Instant::now() + Duration::from_secs(4);
    while Instant::now() < end {
        let (la, lb) = (*a.leading.borrow(), *b.leading.borrow());
        assert!(la ^ lb, "exactly one leader at all times (a={la}, b={lb})");
        sleep(Duration::from_millis(50)).await;
    }
    let (leader, standby, leader_name, standby_name) =
        if *a.leading.borrow() { (a, b, "replica-a", "replica-b") } else { (b, a, "replica-b", "replica-a") };
    assert_eq!(holder(&client, &lease).await.as_deref(), Some(leader_name));

    // The leader dies without releasing: the standby takes over once the Lease expires.
    leader.task.abort();
    let took =
        until("takeover after the leader died", Duration::from_secs(15), || *standby.leading.borrow()).await;
    assert!(took >= Duration::from_secs(1), "a live Lease must not be stolen (took {took:?})");
    assert_eq!(holder(&client, &lease).await.as_deref(), Some(standby_name));

    // A third replica waits while the Lease is held, then gets it at once when it is released.
    let c = campaign(&client, &lease, "replica-c");
    sleep(Duration::from_secs(4)).await;
    assert!(!*c.leading.borrow(), "no takeover of a renewed Lease");
    standby.stop.send_replace(true);
    standby.task.await.unwrap();
    assert_eq!(holder(&client, &lease).await, None, "released on stop");
    let handover = until("handover after release", Duration::from_secs(5), || *c.leading.borrow()).await;
    assert!(
        handover < Duration::from_secs(2),
        "released Lease is taken within a retry period ({handover:?})"
    );
    assert_eq!(holder(&client, &lease).await.as_deref(), Some("replica-c"));

    c.stop.send_replace(true);
    c.task.await.unwrap();
    api.delete(&lease, &DeleteParams::default()).await.unwrap();
}

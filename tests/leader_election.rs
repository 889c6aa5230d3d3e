//! Leader election against a real API server: one leader at a time, takeover after the leader
//! dies, immediate handover when it releases the Lease on shutdown; renewals that a burst of
//! requests on the controllers' throttled client does not delay; and a leader cut off from the
//! API server that steps down before its Lease can expire.
//!
//! Needs the local control plane (`make test`); ignored by a plain `cargo test`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use karpenter::operator::apiclient;
use karpenter::operator::leader::{LeaderElector, Timing};
use kube::api::{Api, DeleteParams, EvictParams, PostParams};
use kube::{Client, Config};
use serde_json::json;
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

fn campaign(config: &Config, lease: &str, identity: &str) -> Candidate {
    let elector = LeaderElector::new(config, NAMESPACE, lease, identity, fast()).unwrap();
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

async fn config() -> Config {
    Config::infer().await.expect("a kubeconfig for the local control plane (make test)")
}

async fn holder(client: &Client, lease: &str) -> Option<String> {
    let api: Api<Lease> = Api::namespaced(client.clone(), NAMESPACE);
    api.get(lease).await.unwrap().spec.and_then(|s| s.holder_identity)
}

#[tokio::test]
#[ignore = "needs the local control plane: make test"]
async fn one_leader_takeover_on_death_and_handover_on_release() {
    let config = config().await;
    let client = Client::try_from(config.clone()).unwrap();
    let lease = format!("leader-test-{}", std::process::id());
    let api: Api<Lease> = Api::namespaced(client.clone(), NAMESPACE);
    let _ = api.delete(&lease, &DeleteParams::default()).await;

    let a = campaign(&config, &lease, "replica-a");
    let b = campaign(&config, &lease, "replica-b");
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
    let c = campaign(&config, &lease, "replica-c");
    sleep(Duration::from_secs(4)).await;
    assert!(!*c.leading.borrow(), "no takeover of a renewed Lease");
    standby.stop.send_replace(true);
    standby.task.await.unwrap();
    // Released: the Lease names no holder, or already the waiting replica, which polls every
    // retry period and may take it before this read. Never the replica that stopped.
    let after_stop = holder(&client, &lease).await;
    assert!(
        after_stop.is_none() || after_stop.as_deref() == Some("replica-c"),
        "released on stop (holder {after_stop:?})"
    );
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

/// While the controllers' client is saturated by evictions a PodDisruptionBudget refuses (the
/// drain of many nodes at once), the leader keeps renewing its Lease: the elector has a client of
/// its own.
#[tokio::test]
#[ignore = "needs the local control plane: make test"]
async fn renewals_are_not_held_up_by_an_eviction_burst() {
    let config = config().await;
    let client = Client::try_from(config.clone()).unwrap();
    let ns = format!("leader-burst-{}", std::process::id());
    let namespaces: Api<Namespace> = Api::all(client.clone());
    namespaces
        .create(&PostParams::default(), &serde_json::from_value(json!({"metadata": {"name": ns}})).unwrap())
        .await
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    for i in 0..100 {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": format!("p{i}"), "labels": {"app": "burst"}},
            "spec": {"nodeSelector": {"leader-test/nowhere": "true"},
                "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]}
        }))
        .unwrap();
        pods.create(&PostParams::default(), &pod).await.unwrap();
    }
    let pdb: PodDisruptionBudget = serde_json::from_value(json!({
        "metadata": {"name": "none"},
        "spec": {"maxUnavailable": 0, "selector": {"matchLabels": {"app": "burst"}}}
    }))
    .unwrap();
    Api::<PodDisruptionBudget>::namespaced(client.clone(), &ns)
        .create(&PostParams::default(), &pdb)
        .await
        .unwrap();

    // The controllers' client, throttled hard, flooded with evictions that the budget refuses.
    let throttled = apiclient::limited(config.clone(), 5, 5).unwrap();
    let burst_pods: Api<Pod> = Api::namespaced(throttled.clone(), &ns);
    let burst = tokio::spawn(async move {
        let evictions = (0..100).map(|i| {
            let api = burst_pods.clone();
            async move {
                let _ = api.evict(&format!("p{i}"), &EvictParams::default()).await;
            }
        });
        futures::future::join_all(evictions).await;
    });
    sleep(Duration::from_millis(500)).await;
    // The flood is real: a request on that client waits behind it.
    let probe = Instant::now();
    let _ = Api::<Lease>::namespaced(throttled.clone(), NAMESPACE).list(&Default::default()).await;
    let waited = probe.elapsed();
    assert!(waited > fast().renew_deadline, "the throttled client is congested ({waited:?})");

    let lease = format!("leader-burst-{}", std::process::id());
    let leader = campaign(&config, &lease, "busy-leader");
    until("the lease acquired", Duration::from_secs(10), || *leader.leading.borrow()).await;
    let end = Instant::now() + Duration::from_secs(8);
    while Instant::now() < end {
        assert!(*leader.leading.borrow(), "the leader never steps down while the burst lasts");
        sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(holder(&client, &lease).await.as_deref(), Some("busy-leader"));

    burst.abort();
    leader.stop.send_replace(true);
    leader.task.await.unwrap();
    let _ =
        Api::<Lease>::namespaced(client.clone(), NAMESPACE).delete(&lease, &DeleteParams::default()).await;
    let _ = namespaces.delete(&ns, &DeleteParams::default()).await;
}

/// A TCP relay to the API server that can stop relaying: connections stay open, nothing passes.
struct Relay {
    addr: std::net::SocketAddr,
    frozen: Arc<AtomicBool>,
    task: JoinHandle<()>,
}

impl Relay {
    async fn to(upstream: String) -> Relay {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let frozen = Arc::new(AtomicBool::new(false));
        let f = frozen.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else { break };
                let (f, upstream) = (f.clone(), upstream.clone());
                tokio::spawn(async move {
                    let Ok(server) = tokio::net::TcpStream::connect(&upstream).await else { return };
                    let (cr, cw) = client.into_split();
                    let (sr, sw) = server.into_split();
                    tokio::join!(pipe(cr, sw, f.clone()), pipe(sr, cw, f));
                });
            }
        });
        Relay { addr, frozen, task }
    }
}

async fn pipe(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    frozen: Arc<AtomicBool>,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        while frozen.load(Ordering::SeqCst) {
            sleep(Duration::from_millis(20)).await;
        }
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        while frozen.load(Ordering::SeqCst) {
            sleep(Duration::from_millis(20)).await;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            break;
        }
    }
}

/// A leader whose API server stops answering (the calls hang, nothing fails) steps down within
/// its renew deadline, before the Lease expires for the other replicas.
#[tokio::test]
#[ignore = "needs the local control plane: make test"]
async fn a_leader_cut_off_from_the_api_server_steps_down_before_its_lease_expires() {
    let config = config().await;
    let upstream =
        format!("{}:{}", config.cluster_url.host().unwrap(), config.cluster_url.port_u16().unwrap_or(443));
    let relay = Relay::to(upstream).await;
    let mut relayed = config.clone();
    relayed.cluster_url = format!("https://{}", relay.addr).parse().unwrap();
    let lease = format!("leader-cutoff-{}", std::process::id());
    let leader = campaign(&relayed, &lease, "cut-off-leader");
    until("the lease acquired", Duration::from_secs(10), || *leader.leading.borrow()).await;
    sleep(Duration::from_secs(1)).await;

    relay.frozen.store(true, Ordering::SeqCst);
    let frozen_at = Instant::now();
    until("the leader to step down", Duration::from_secs(10), || !*leader.leading.borrow()).await;
    let after = frozen_at.elapsed();
    let timing = fast();
    assert!(
        after < timing.lease_duration,
        "stepped down {after:?} after losing the API server, before the {:?} lease could expire",
        timing.lease_duration
    );
    relay.task.abort();
    leader.stop.send_replace(true);
    let _ = timeout(Duration::from_secs(5), leader.task).await;
    let client = Client::try_from(config).unwrap();
    let _ = Api::<Lease>::namespaced(client, NAMESPACE).delete(&lease, &DeleteParams::default()).await;
}

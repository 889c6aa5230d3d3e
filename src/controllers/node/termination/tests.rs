//! Tests of the controller's small helpers, and of the whole controller against the local control
//! plane.

use std::sync::atomic::{AtomicUsize, Ordering};

use k8s_openapi::api::core::v1::{
    Container, Event, Namespace, NodeSpec, Pod, PodSpec, Taint as K8sTaint, Toleration,
};
use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::Client;
use kube::api::PostParams;

use super::*;
use crate::apis::NodePool;
use crate::apis::labels::{ANNOTATION_NODECLAIM_TERMINATION_TIMESTAMP, TAINT_DISRUPTED};
use crate::cloudprovider::{BoxFuture, CloudProvider, DriftReason, Instance};
use crate::controllers::Events;
use crate::controllers::node::with_disrupted_taint;
use crate::metrics::Metrics;
use crate::scheduling::instancetypes::InstanceType;

fn k8s_taint(key: &str, effect: &str) -> K8sTaint {
    K8sTaint { key: key.into(), effect: effect.into(), value: None, time_added: None }
}

#[test]
fn the_disrupted_taint_is_added_once() {
    let added = with_disrupted_taint(&[k8s_taint("other", "NoExecute")]).unwrap();
    assert_eq!(added, [k8s_taint("other", "NoExecute"), k8s_taint(TAINT_DISRUPTED, "NoSchedule")]);
    assert_eq!(with_disrupted_taint(&added), None);
    assert_eq!(with_disrupted_taint(&[]).unwrap(), [k8s_taint(TAINT_DISRUPTED, "NoSchedule")]);
    // Another effect of the same key is not ours.
    let other_effect = [k8s_taint(TAINT_DISRUPTED, "NoExecute")];
    assert_eq!(with_disrupted_taint(&other_effect).unwrap().len(), 2);
}

#[test]
fn only_our_finalizer_is_removed() {
    let ours = FINALIZER_TERMINATION.to_string();
    assert_eq!(without_finalizer(&[]), None);
    assert_eq!(without_finalizer(&["other".into()]), None);
    assert_eq!(without_finalizer(std::slice::from_ref(&ours)), Some(vec![]));
    assert_eq!(
        without_finalizer(&["a".into(), ours.clone(), "b".into()]),
        Some(vec!["a".into(), "b".into()])
    );
}

#[test]
fn the_nodepool_of_a_node() {
    let mut node = Node::default();
    assert_eq!(node_pool(&node, None), "");
    let mut claim = test_claim("c");
    claim.metadata.labels = Some([(LABEL_NODEPOOL.to_string(), "from-claim".to_string())].into());
    assert_eq!(node_pool(&node, Some(&claim)), "from-claim");
    node.metadata.labels = Some([(LABEL_NODEPOOL.to_string(), "from-node".to_string())].into());
    assert_eq!(node_pool(&node, Some(&claim)), "from-node");
}

#[test]
fn drained_pods_are_counted_with_the_disruption_reason() {
    assert_eq!(drained_reason(None), "", "no NodeClaim: upstream's failed lookup");
    let mut claim = test_claim("c");
    assert_eq!(drained_reason(Some(&claim)), FORCEFUL_TERMINATION);
    let condition = |status: &str| {
        json!({"type": DISRUPTION_REASON, "status": status, "reason": "Underutilized", "message": "",
            "lastTransitionTime": "2026-11-24T11:00:00Z"})
    };
    claim.status = Some(serde_json::from_value(json!({"conditions": [condition("True")]})).unwrap());
    assert_eq!(drained_reason(Some(&claim)), "Underutilized");
    claim.status = Some(serde_json::from_value(json!({"conditions": [condition("False")]})).unwrap());
    assert_eq!(drained_reason(Some(&claim)), FORCEFUL_TERMINATION);
}

#[test]
fn a_node_lives_from_its_creation() {
    let mut node = Node::default();
    let now: Timestamp = "2026-11-24T12:00:00Z".parse().unwrap();
    assert_eq!(lifetime(&node, now), None);
    node.metadata.creation_timestamp =
        Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time("2026-11-24T10:30:00Z".parse().unwrap()));
    assert_eq!(lifetime(&node, now), Some(Duration::from_secs(90 * 60)));
    // A clock behind the API server's counts as no time at all.
    let before: Timestamp = "2026-11-24T10:00:00Z".parse().unwrap();
    assert_eq!(lifetime(&node, before), Some(Duration::ZERO));
}

#[test]
fn errors_name_what_failed() {
    let error = Error::Cloud { node_claim: "c".into(), source: CloudProviderError::Config("bad".into()) };
    assert_eq!(
        error_chain(&error),
        "failed to terminate the instance of nodeclaim c: invalid configuration: bad"
    );
}

fn test_claim(name: &str) -> NodeClaim {
    let value = json!({
        "apiVersion": "karpenter.sh/v1",
        "kind": "NodeClaim",
        "metadata": {"name": name},
        "spec": {
            "requirements": [],
            "nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "default"},
        },
    });
    serde_json::from_value(value).unwrap()
}

// --- against the local control plane --------------------------------------------------------------

/// A cloud whose instances are gone on the second termination request.
#[derive(Default)]
pub(crate) struct FakeCloud {
    deletes: AtomicUsize,
}

impl CloudProvider for FakeCloud {
    fn create<'a>(&'a self, _: &'a NodeClaim) -> BoxFuture<'a, crate::cloudprovider::Result<Instance>> {
        Box::pin(async { Err(CloudProviderError::Config("not supported".into())) })
    }

    fn delete<'a>(&'a self, node_claim: &'a NodeClaim) -> BoxFuture<'a, crate::cloudprovider::Result<()>> {
        Box::pin(async move {
            if self.deletes.fetch_add(1, Ordering::SeqCst) == 0 {
                Ok(())
            } else {
                Err(CloudProviderError::NotFound(node_claim.name_any()))
            }
        })
    }

    fn get<'a>(&'a self, id: &'a str) -> BoxFuture<'a, crate::cloudprovider::Result<Instance>> {
        Box::pin(async move { Err(CloudProviderError::NotFound(id.into())) })
    }

    fn list(&self) -> BoxFuture<'_, crate::cloudprovider::Result<Vec<Instance>>> {
        Box::pin(async { Ok(Vec::new()) })
    }

    fn instance_types<'a>(
        &'a self,
        _: &'a NodePool,
    ) -> BoxFuture<'a, crate::cloudprovider::Result<Vec<std::sync::Arc<InstanceType>>>> {
        Box::pin(async { Ok(Vec::new()) })
    }

    fn is_drifted<'a>(
        &'a self,
        _: &'a NodeClaim,
    ) -> BoxFuture<'a, crate::cloudprovider::Result<Option<DriftReason>>> {
        Box::pin(async { Ok(None) })
    }

    fn name(&self) -> &'static str {
        "fake"
    }
}

/// Label that scopes a test's controller to the test's own nodes.
const TEST_LABEL: &str = "karpenter-rs.test/termination";

pub(crate) struct Harness {
    pub(crate) client: Client,
    pub(crate) name: String,
    pub(crate) cloud: Arc<FakeCloud>,
    /// The paths of the requests the controller made (not its caches' watches).
    requests: Arc<std::sync::Mutex<Vec<String>>>,
    metrics: Arc<Metrics>,
    stop: watch::Sender<bool>,
    controller: tokio::task::JoinHandle<()>,
    watches: tokio::task::JoinHandle<()>,
}

impl Harness {
    /// Starts a controller that terminates only the nodes labelled for this test; with `stale`, it
    /// reads pods and NodeClaims from caches that never saw any.
    pub(crate) async fn start(prefix: &str, stale: bool) -> Harness {
        let _ = tracing_subscriber::fmt()
            .with_test_writer()
            .with_env_filter(tracing_subscriber::EnvFilter::new("karpenter=debug,kube=warn"))
            .try_init();
        let client = Client::try_default().await.unwrap();
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
        let name = format!("{prefix}-{}-{}", std::process::id(), nanos % 1_000_000_000);
        let cloud = Arc::new(FakeCloud::default());
        let metrics = Arc::new(Metrics::unregistered());
        let requests = Arc::new(std::sync::Mutex::new(Vec::new()));
        let recording = {
            let requests = requests.clone();
            let record = tower::util::MapRequestLayer::new(move |req: http::Request<kube::client::Body>| {
                requests.lock().unwrap().push(req.uri().path().to_string());
                req
            });
            let config = kube::Config::infer().await.unwrap();
            kube::client::ClientBuilder::try_from(config).unwrap().with_layer(&record).build()
        };
        let ctx = Context {
            client: recording,
            cloud: cloud.clone(),
            settings: Default::default(),
            metrics: metrics.clone(),
            events: Events::new(client.clone(), Some(name.clone())),
            decisions: Default::default(),
            surges: Default::default(),
        };
        let (stop, stop_rx) = watch::channel(false);
        let (cluster, watches) = ClusterState::start(client.clone());
        let watches = tokio::spawn(watches);
        cluster.wait_synced().await;
        let cluster = if stale { cluster.forgetting_pods_and_nodeclaims() } else { cluster };
        let selected = name.clone();
        let select = move |n: &Node| n.labels().get(TEST_LABEL) == Some(&selected);
        let controller = tokio::spawn(run_selected(ctx, cluster, Arc::new(Queue::new()), stop_rx, select));
        let namespaces: Api<Namespace> = Api::all(client.clone());
        let namespace = Namespace {
            metadata: ObjectMeta { name: Some(name.clone()), ..Default::default() },
            ..Default::default()
        };
        namespaces.create(&PostParams::default(), &namespace).await.unwrap();
        Harness { client, name, cloud, requests, metrics, stop, controller, watches }
    }

    /// A fake node managed by kwok, with our finalizer and provider ID `kwok://<name>`.
    pub(crate) async fn create_node(&self) {
        let nodes: Api<Node> = Api::all(self.client.clone());
        let node = Node {
            metadata: ObjectMeta {
                name: Some(self.name.clone()),
                labels: Some([(TEST_LABEL.to_string(), self.name.clone())].into()),
                annotations: Some([("kwok.x-k8s.io/node".to_string(), "fake".to_string())].into()),
                finalizers: Some(vec![FINALIZER_TERMINATION.into()]),
                ..Default::default()
            },
            spec: Some(NodeSpec { provider_id: Some(format!("kwok://{}", self.name)), ..Default::default() }),
            status: None,
        };
        nodes.create(&PostParams::default(), &node).await.unwrap();
    }

    /// A NodeClaim for the node, with `termination_grace_period`.
    pub(crate) async fn create_claim(&self, termination_grace_period: Option<&str>) {
        let claims: Api<NodeClaim> = Api::all(self.client.clone());
        let mut claim = test_claim(&self.name);
        claim.metadata.labels = Some([(TEST_LABEL.to_string(), self.name.clone())].into());
        claim.spec.termination_grace_period = termination_grace_period.map(Into::into);
        claims.create(&PostParams::default(), &claim).await.unwrap();
        let status =
            json!({"status": {"providerID": format!("kwok://{}", self.name), "nodeName": self.name}});
        claims.patch_status(&self.name, &PatchParams::default(), &Patch::Merge(&status)).await.unwrap();
    }

    pub(crate) async fn create_pod(&self, name: &str, app: &str, grace: i64) {
        self.create_pod_tolerating(name, app, grace, None).await;
    }

    async fn create_pod_tolerating(&self, name: &str, app: &str, grace: i64, toleration: Option<Toleration>) {
        self.create_pod_with(name, app, grace, toleration, None).await;
    }

    /// A pod annotated `karpenter.sh/do-not-disrupt: "true"`.
    pub(crate) async fn create_pinned_pod(&self, name: &str, grace: i64) {
        let annotations = [(crate::apis::labels::ANNOTATION_DO_NOT_DISRUPT.to_string(), "true".to_string())];
        self.create_pod_with(name, name, grace, None, Some(annotations.into())).await;
    }

    /// A free pod and a `do-not-disrupt` one on the node; the node is deleted, and the free pod is
    /// evicted.
    async fn drain_beside_a_pinned_pod(&self) {
        self.create_pod("free", "free", 1).await;
        self.create_pinned_pod("pinned", 1).await;
        self.wait_for_running(2).await;

        Api::<Node>::all(self.client.clone()).delete(&self.name, &DeleteParams::default()).await.unwrap();

        eventually("the free pod to be evicted", Duration::from_secs(60), || async {
            self.pod_names().await == ["pinned"]
        })
        .await;
    }

    async fn create_pod_with(
        &self,
        name: &str,
        app: &str,
        grace: i64,
        toleration: Option<Toleration>,
        annotations: Option<std::collections::BTreeMap<String, String>>,
    ) {
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), &self.name);
        let pod = Pod {
            metadata: ObjectMeta {
                name: Some(name.into()),
                labels: Some([("app".to_string(), app.to_string())].into()),
                annotations,
                ..Default::default()
            },
            spec: Some(PodSpec {
                node_name: Some(self.name.clone()),
                termination_grace_period_seconds: Some(grace),
                tolerations: toleration.map(|t| vec![t]),
                containers: vec![Container {
                    name: "c".into(),
                    image: Some("fake".into()),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            status: None,
        };
        pods.create(&PostParams::default(), &pod).await.unwrap();
    }

    async fn create_pdb(&self, app: &str) {
        let pdbs: Api<PodDisruptionBudget> = Api::namespaced(self.client.clone(), &self.name);
        let pdb = PodDisruptionBudget {
            metadata: ObjectMeta { name: Some(app.into()), ..Default::default() },
            spec: Some(PodDisruptionBudgetSpec {
                max_unavailable: Some(IntOrString::Int(0)),
                selector: Some(LabelSelector {
                    match_labels: Some([("app".to_string(), app.to_string())].into()),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            status: None,
        };
        pdbs.create(&PostParams::default(), &pdb).await.unwrap();
    }

    async fn pod_names(&self) -> Vec<String> {
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), &self.name);
        let mut names: Vec<String> =
            pods.list(&ListParams::default()).await.unwrap().items.iter().map(|p| p.name_any()).collect();
        names.sort();
        names
    }

    pub(crate) async fn node(&self) -> Option<Node> {
        Api::<Node>::all(self.client.clone()).get_opt(&self.name).await.unwrap()
    }

    /// Waits for the node to be gone, checking that it never went while a pod was left.
    async fn wait_gone_after_its_pods(&self) {
        eventually("the node to be gone", Duration::from_secs(60), || async {
            let gone = self.node().await.is_none();
            assert!(!gone || self.pod_names().await.is_empty(), "the node went before its pod");
            gone
        })
        .await;
    }

    async fn wait_for_running(&self, count: usize) {
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), &self.name);
        eventually("pods running", Duration::from_secs(60), || async {
            let list = pods.list(&ListParams::default()).await.unwrap();
            list.items
                .iter()
                .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
                .count()
                == count
        })
        .await;
    }

    async fn has_event(&self, object: &str, reason: &str) -> bool {
        let events: Api<Event> = Api::all(self.client.clone());
        let params = ListParams::default().fields(&format!("involvedObject.name={object},reason={reason}"));
        // Tests run side by side with pods of the same names: only this test's node and namespace.
        events.list(&params).await.unwrap().items.iter().any(|e| {
            let o = &e.involved_object;
            o.kind.as_deref() == Some("Node") || o.namespace.as_deref() == Some(self.name.as_str())
        })
    }

    /// Stops the controller and removes what the test left behind.
    async fn cleanup(self) {
        let _ = self.stop.send(true);
        let _ = tokio::time::timeout(Duration::from_secs(10), self.controller).await;
        self.watches.abort();
        let nodes: Api<Node> = Api::all(self.client.clone());
        let release = json!({"metadata": {"finalizers": null}});
        let _ = nodes.patch(&self.name, &PatchParams::default(), &Patch::Merge(&release)).await;
        let _ = nodes.delete(&self.name, &DeleteParams::default()).await;
        let claims: Api<NodeClaim> = Api::all(self.client.clone());
        let _ = claims.patch(&self.name, &PatchParams::default(), &Patch::Merge(&release)).await;
        let _ = claims.delete(&self.name, &DeleteParams::default()).await;
        let namespaces: Api<Namespace> = Api::all(self.client.clone());
        let _ = namespaces.delete(&self.name, &DeleteParams::default()).await;
    }
}

pub(crate) async fn eventually<F, Fut>(what: &str, timeout: Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = Instant::now();
    while !check().await {
        assert!(start.elapsed() < timeout, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Runs `body` with a harness, cleaning up even when it fails.
pub(crate) async fn with_harness<F, Fut>(prefix: &str, body: F)
where
    F: FnOnce(Arc<Harness>) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    with_harness_cached(prefix, false, body).await;
}

/// Runs `body` with a harness whose controller reads stale caches or not.
async fn with_harness_cached<F, Fut>(prefix: &str, stale: bool, body: F)
where
    F: FnOnce(Arc<Harness>) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let harness = Arc::new(Harness::start(prefix, stale).await);
    let result = tokio::spawn(body(harness.clone())).await;
    if let Ok(harness) = Arc::try_unwrap(harness) {
        harness.cleanup().await;
    }
    if let Err(error) = result {
        std::panic::resume_unwind(error.into_panic());
    }
}

#[tokio::test]
#[ignore = "needs the local control plane"]
async fn drains_through_evictions_and_waits_for_disruption_budgets() {
    with_harness("term-pdb", |h| async move {
        h.create_node().await;
        h.create_claim(None).await;
        h.create_pod("free-1", "free", 1).await;
        h.create_pod("free-2", "free", 1).await;
        h.create_pod("protected", "protected", 1).await;
        h.create_pdb("protected").await;
        h.wait_for_running(3).await;

        Api::<Node>::all(h.client.clone()).delete(&h.name, &DeleteParams::default()).await.unwrap();

        eventually("the disrupted taint", Duration::from_secs(30), || async {
            h.node().await.and_then(|n| n.spec).and_then(|s| s.taints).is_some_and(|taints| {
                taints.iter().any(|t| t.key == TAINT_DISRUPTED && t.effect == "NoSchedule")
            })
        })
        .await;
        eventually("the unprotected pods to be evicted", Duration::from_secs(60), || async {
            h.pod_names().await == ["protected"]
        })
        .await;
        eventually("a FailedDraining event", Duration::from_secs(30), || async {
            h.has_event(&h.name, reasons::FAILED_DRAINING).await
        })
        .await;
        // The budget keeps the pod, and the pod keeps the node.
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert_eq!(h.pod_names().await, ["protected"]);
        let node = h.node().await.expect("the node is still there");
        assert!(has_finalizer(&node));
        assert_eq!(h.cloud.deletes.load(Ordering::SeqCst), 0, "no instance termination before the drain");
        assert!(h.has_event("free-1", reasons::EVICTED).await);

        Api::<PodDisruptionBudget>::namespaced(h.client.clone(), &h.name)
            .delete("protected", &DeleteParams::default())
            .await
            .unwrap();
        eventually("the protected pod to be evicted", Duration::from_secs(60), || async {
            h.pod_names().await.is_empty()
        })
        .await;
        eventually("the node to be gone", Duration::from_secs(60), || async { h.node().await.is_none() })
            .await;
        assert_eq!(h.cloud.deletes.load(Ordering::SeqCst), 2, "terminated until the instance was gone");
        let claim = Api::<NodeClaim>::all(h.client.clone()).get_opt(&h.name).await.unwrap();
        assert!(claim.is_none_or(|c| c.metadata.deletion_timestamp.is_some()), "the nodeclaim is deleted");
        let terminated = h.metrics.nodes_terminated.get_or_create(&vec![("nodepool", String::new())]).get();
        assert_eq!(terminated, 1);
    })
    .await;
}

#[tokio::test]
#[ignore = "needs the local control plane"]
async fn the_termination_grace_period_overrides_disruption_budgets() {
    with_harness("term-tgp", |h| async move {
        h.create_node().await;
        h.create_claim(Some("5s")).await;
        h.create_pod("protected", "protected", 30).await;
        h.create_pdb("protected").await;
        h.wait_for_running(1).await;

        Api::<Node>::all(h.client.clone()).delete(&h.name, &DeleteParams::default()).await.unwrap();

        eventually("the protected pod to be deleted", Duration::from_secs(60), || async {
            h.pod_names().await.is_empty()
        })
        .await;
        eventually("the node to be gone", Duration::from_secs(60), || async { h.node().await.is_none() })
            .await;
        assert_eq!(h.cloud.deletes.load(Ordering::SeqCst), 2);
        // The node said by when its pods would go; the pod was deleted past its budget.
        assert!(h.has_event(&h.name, reasons::TERMINATION_GRACE_PERIOD_EXPIRING).await);
        assert!(h.has_event("protected", reasons::DISRUPTED).await);
    })
    .await;
}

#[tokio::test]
#[ignore = "needs the local control plane"]
async fn a_node_without_nodeclaim_is_drained_and_released() {
    with_harness("term-orphan", |h| async move {
        h.create_node().await;
        h.create_pod("free", "free", 1).await;
        h.wait_for_running(1).await;

        Api::<Node>::all(h.client.clone()).delete(&h.name, &DeleteParams::default()).await.unwrap();

        h.wait_gone_after_its_pods().await;
        assert_eq!(h.cloud.deletes.load(Ordering::SeqCst), 0, "no instance to terminate");
    })
    .await;
}

#[tokio::test]
#[ignore = "needs the local control plane"]
async fn pods_tolerating_the_disrupted_taint_do_not_hold_the_node() {
    with_harness("term-tolerating", |h| async move {
        h.create_node().await;
        h.create_claim(None).await;
        let toleration = Toleration {
            key: Some(TAINT_DISRUPTED.into()),
            operator: Some("Exists".into()),
            ..Default::default()
        };
        h.create_pod_tolerating("stays", "stays", 1, Some(toleration)).await;
        h.wait_for_running(1).await;

        Api::<Node>::all(h.client.clone()).delete(&h.name, &DeleteParams::default()).await.unwrap();

        eventually("the node to be gone", Duration::from_secs(60), || async { h.node().await.is_none() })
            .await;
        assert_eq!(h.cloud.deletes.load(Ordering::SeqCst), 2);
        assert!(!h.has_event("stays", reasons::EVICTED).await, "the tolerating pod was not evicted");
    })
    .await;
}

#[tokio::test]
#[ignore = "needs the local control plane"]
async fn a_cache_that_lags_behind_never_ends_a_drain_early() {
    // Caches that never saw anything: no pods on the node, no NodeClaim for it.
    with_harness_cached("term-stale", true, |h| async move {
        h.create_node().await;
        h.create_claim(None).await;
        h.create_pod("free", "free", 1).await;
        h.wait_for_running(1).await;

        Api::<Node>::all(h.client.clone()).delete(&h.name, &DeleteParams::default()).await.unwrap();

        h.wait_gone_after_its_pods().await;
        assert!(h.has_event("free", reasons::EVICTED).await, "the pod the cache missed was evicted");
        assert_eq!(h.cloud.deletes.load(Ordering::SeqCst), 2, "the NodeClaim the cache missed was found");
    })
    .await;
}

#[tokio::test]
#[ignore = "needs the local control plane"]
async fn a_do_not_disrupt_pod_holds_a_node_without_a_termination_grace_period() {
    with_harness("term-dnd", |h| async move {
        h.create_node().await;
        h.create_claim(None).await;
        h.drain_beside_a_pinned_pod().await;
        eventually("a FailedDraining event", Duration::from_secs(30), || async {
            h.has_event(&h.name, reasons::FAILED_DRAINING).await
        })
        .await;
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert_eq!(h.pod_names().await, ["pinned"], "never evicted");
        assert!(!h.has_event("pinned", reasons::EVICTED).await);
        assert!(h.node().await.is_some_and(|n| has_finalizer(&n)), "the pod keeps the node");

        // Without the annotation, it is drained like any other.
        let pods: Api<Pod> = Api::namespaced(h.client.clone(), &h.name);
        let unpin =
            json!({"metadata": {"annotations": {crate::apis::labels::ANNOTATION_DO_NOT_DISRUPT: null}}});
        pods.patch("pinned", &PatchParams::default(), &Patch::Merge(&unpin)).await.unwrap();
        h.wait_gone_after_its_pods().await;
        assert!(h.has_event("pinned", reasons::EVICTED).await);
    })
    .await;
}

#[tokio::test]
#[ignore = "needs the local control plane"]
async fn a_do_not_disrupt_pod_is_deleted_at_the_termination_grace_period() {
    with_harness("term-dnd-tgp", |h| async move {
        h.create_node().await;
        h.create_claim(Some("8s")).await;
        h.drain_beside_a_pinned_pod().await;
        // Deleted, not evicted, once the deadline minus its own grace period is reached.
        h.wait_gone_after_its_pods().await;
        assert!(h.has_event("pinned", reasons::DISRUPTED).await);
        assert!(!h.has_event("pinned", reasons::EVICTED).await);
    })
    .await;
}

#[tokio::test]
#[ignore = "needs the local control plane"]
async fn a_forceful_termination_deletes_pods_with_a_grace_period_before_the_instance_goes() {
    use futures::StreamExt;
    use kube::runtime::watcher;
    with_harness("term-forceful", |h| async move {
        h.create_node().await;
        h.create_claim(None).await;
        // As repair and failed status checks do: the deadline is now.
        let now = Timestamp::now().to_string();
        let annotate =
            json!({"metadata": {"annotations": {ANNOTATION_NODECLAIM_TERMINATION_TIMESTAMP: now}}});
        Api::<NodeClaim>::all(h.client.clone())
            .patch(&h.name, &PatchParams::default(), &Patch::Merge(&annotate))
            .await
            .unwrap();
        h.create_pinned_pod("stateful-0", 30).await;
        h.wait_for_running(1).await;
        // Every grace period the pod is deleted with, and how many termination requests the
        // instance had by then.
        let seen = Arc::new(std::sync::Mutex::new(Vec::<(i64, usize)>::new()));
        let (ready_tx, ready) = tokio::sync::oneshot::channel();
        let recorder = {
            let (seen, cloud) = (seen.clone(), h.cloud.clone());
            let pods: Api<Pod> = Api::namespaced(h.client.clone(), &h.name);
            tokio::spawn(async move {
                let mut ready_tx = Some(ready_tx);
                let mut events = watcher(pods, watcher::Config::default()).boxed();
                while let Some(Ok(event)) = events.next().await {
                    match event {
                        watcher::Event::InitDone => {
                            if let Some(tx) = ready_tx.take() {
                                let _ = tx.send(());
                            }
                        }
                        watcher::Event::Apply(pod) | watcher::Event::Delete(pod) => {
                            if let Some(grace) = pod.metadata.deletion_grace_period_seconds {
                                seen.lock().unwrap().push((grace, cloud.deletes.load(Ordering::SeqCst)));
                            }
                        }
                        _ => {}
                    }
                }
            })
        };
        ready.await.unwrap();

        Api::<Node>::all(h.client.clone()).delete(&h.name, &DeleteParams::default()).await.unwrap();
        h.wait_gone_after_its_pods().await;
        recorder.abort();
        let seen = seen.lock().unwrap().clone();
        assert!(!seen.is_empty(), "the pod was deleted gracefully, not removed at once");
        // Karpenter's deletion comes first, with a grace period; the kubelet's (kwok's) confirmation
        // of the stopped pod follows with 0, as a kubelet's does.
        assert!(seen[0].0 >= 1, "deleted with a grace period, never 0: {seen:?}");
        assert_eq!(seen[0].1, 0, "the instance was terminated only after the pod's deletion: {seen:?}");
        assert!(h.has_event("stateful-0", reasons::DISRUPTED).await);
    })
    .await;
}

#[tokio::test]
#[ignore = "needs the local control plane"]
async fn a_drained_node_waits_for_its_volume_attachments_read_from_the_cache() {
    use k8s_openapi::api::storage::v1::VolumeAttachment;
    with_harness("term-volumes", |h| async move {
        h.create_node().await;
        h.create_claim(None).await;
        let attachments: Api<VolumeAttachment> = Api::all(h.client.clone());
        let attachment: VolumeAttachment = serde_json::from_value(json!({
            "metadata": {"name": h.name},
            "spec": {"attacher": "ebs.csi.aws.com", "nodeName": h.name, "source": {"persistentVolumeName": h.name}}
        }))
        .unwrap();
        attachments.create(&PostParams::default(), &attachment).await.unwrap();

        Api::<Node>::all(h.client.clone()).delete(&h.name, &DeleteParams::default()).await.unwrap();
        tokio::time::sleep(Duration::from_secs(4)).await;
        assert!(h.node().await.is_some(), "the node waits for its volume attachment");
        assert_eq!(h.cloud.deletes.load(Ordering::SeqCst), 0, "the instance waits too");
        attachments.delete(&h.name, &DeleteParams::default()).await.unwrap();
        eventually("the node to be gone", Duration::from_secs(60), || async { h.node().await.is_none() })
            .await;
        let listed: Vec<String> =
            h.requests.lock().unwrap().iter().filter(|p| p.contains("volumeattachments")).cloned().collect();
        assert!(listed.is_empty(), "volume attachments come from the watch, not a list per reconcile: {listed:?}");
    })
    .await;
}

//! The lifecycle against a real API server, with a cloud provider that creates the Node itself.
//!
//! Needs the local control plane (`eval "$(make -s cluster-up)"`, CRDs installed); ignored by a
//! plain `cargo test`.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use k8s_openapi::api::core::v1::{Event, Node};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::apis::labels::*;
use crate::apis::nodeclaim::conditions::{INITIALIZED, LAUNCHED, READY, REGISTERED};
use crate::apis::{NodeClaim, NodePool};
use crate::cloudprovider::{
    BoxFuture, CloudProvider, CloudProviderError, DriftReason, Instance, OfferingKey, Result as CloudResult,
};
use crate::controllers::events::reasons as event_reasons;
use crate::controllers::kit::Queue;
use crate::controllers::{Context, Events};
use crate::metrics::Metrics;
use crate::scheduling::instancetypes::InstanceType;
use crate::state::ClusterState;

use super::logic::reasons;

const RUN_LABEL: &str = "lifecycle-test.karpenter.sh/run";

/// Instance states of the fake cloud.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Running,
    ShuttingDown,
}

/// How the fake cloud answers `create`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// Launch an instance and create its Node.
    Normal,
    /// Fail with insufficient capacity.
    InsufficientCapacity,
    /// Launch an instance (whose Node never comes) but fail every call, as if the answers were lost.
    LostResponse,
}

/// A cloud whose instances are Nodes it creates itself (kwok keeps them Ready).
struct FakeCloud {
    client: Client,
    run: String,
    mode: Mode,
    instances: Mutex<HashMap<String, (Instance, Phase)>>,
    deletes: Mutex<Vec<String>>,
    creates: std::sync::atomic::AtomicUsize,
}

impl FakeCloud {
    fn new(client: Client, run: &str, mode: Mode) -> Self {
        FakeCloud {
            client,
            run: run.to_string(),
            mode,
            instances: Mutex::new(HashMap::new()),
            deletes: Mutex::new(Vec::new()),
            creates: std::sync::atomic::AtomicUsize::new(0),
        }
    }

    async fn launch(&self, claim: &NodeClaim) -> CloudResult<Instance> {
        if self.mode == Mode::InsufficientCapacity {
            return Err(CloudProviderError::InsufficientCapacity {
                offerings: vec![OfferingKey {
                    instance_type: "m5.large".into(),
                    zone: "us-west-2a".into(),
                    capacity_type: "spot".into(),
                }],
            });
        }
        let name = claim.name_any();
        let provider_id = format!("aws:///us-west-2a/i-{}", name.replace('-', ""));
        if self.mode == Mode::LostResponse {
            let instance = Instance {
                provider_id,
                node_claim: Some(name.clone()),
                state: "pending".into(),
                ..Instance::default()
            };
            self.instances.lock().unwrap().entry(name).or_insert((instance, Phase::Running));
            return Err(CloudProviderError::UnexpectedResponse {
                operation: "CreateFleet",
                message: "connection reset".into(),
            });
        }
        if let Some((instance, _)) = self.instances.lock().unwrap().get(&name) {
            return Ok(instance.clone());
        }
        let node: Node = serde_json::from_value(json!({
            "metadata": {
                "name": name,
                "labels": { RUN_LABEL: self.run, LABEL_HOSTNAME: name },
            },
            "spec": {
                "providerID": provider_id,
                "taints": [{ "key": TAINT_UNREGISTERED, "effect": "NoExecute" }],
            },
        }))
        .map_err(|e| CloudProviderError::Config(e.to_string()))?;
        let nodes: Api<Node> = Api::all(self.client.clone());
        match nodes.create(&PostParams::default(), &node).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 409 => {}
            Err(e) => return Err(CloudProviderError::Config(e.to_string())),
        }
        let quantity = |s: &str| k8s_openapi::apimachinery::pkg::api::resource::Quantity(s.into());
        let instance = Instance {
            provider_id,
            instance_type: "m5.large".into(),
            zone: "us-west-2a".into(),
            capacity_type: CAPACITY_TYPE_SPOT.into(),
            image_id: "ami-0123".into(),
            node_claim: Some(name.clone()),
            state: "running".into(),
            capacity: BTreeMap::from([("cpu".into(), quantity("2")), ("memory".into(), quantity("8Gi"))]),
            allocatable: BTreeMap::from([("cpu".into(), quantity("1930m"))]),
            labels: BTreeMap::from([(LABEL_ARCH.into(), ARCH_AMD64.into())]),
            annotations: BTreeMap::from([(ANNOTATION_EC2NODECLASS_HASH.into(), "42".into())]),
            ..Instance::default()
        };
        self.instances.lock().unwrap().insert(name, (instance.clone(), Phase::Running));
        Ok(instance)
    }
}

impl CloudProvider for FakeCloud {
    fn create<'a>(&'a self, node_claim: &'a NodeClaim) -> BoxFuture<'a, CloudResult<Instance>> {
        self.creates.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Box::pin(self.launch(node_claim))
    }

    fn delete<'a>(&'a self, node_claim: &'a NodeClaim) -> BoxFuture<'a, CloudResult<()>> {
        Box::pin(async move {
            let provider_id =
                node_claim.status.as_ref().and_then(|s| s.provider_id.clone()).unwrap_or_default();
            self.deletes.lock().unwrap().push(provider_id.clone());
            if !provider_id.starts_with("aws:///") {
                return Err(CloudProviderError::InvalidProviderId(provider_id));
            }
            let mut instances = self.instances.lock().unwrap();
            let entry = instances.iter_mut().find(|(_, (i, _))| i.provider_id == provider_id);
            match entry {
                Some((_, (_, phase))) if *phase == Phase::Running => {
                    *phase = Phase::ShuttingDown;
                    Ok(())
                }
                Some((name, _)) => {
                    let name = name.clone();
                    instances.remove(&name);
                    Err(CloudProviderError::NotFound(provider_id))
                }
                None => Err(CloudProviderError::NotFound(provider_id)),
            }
        })
    }

    fn get<'a>(&'a self, provider_id: &'a str) -> BoxFuture<'a, CloudResult<Instance>> {
        Box::pin(async move {
            let instances = self.instances.lock().unwrap();
            instances
                .values()
                .find(|(i, _)| i.provider_id == provider_id)
                .map(|(i, _)| i.clone())
                .ok_or_else(|| CloudProviderError::NotFound(provider_id.to_string()))
        })
    }

    fn list(&self) -> BoxFuture<'_, CloudResult<Vec<Instance>>> {
        Box::pin(async move { Ok(self.instances.lock().unwrap().values().map(|(i, _)| i.clone()).collect()) })
    }

    fn instance_types<'a>(
        &'a self,
        _: &'a NodePool,
    ) -> BoxFuture<'a, CloudResult<Vec<std::sync::Arc<InstanceType>>>> {
        Box::pin(async { Ok(Vec::new()) })
    }

    fn is_drifted<'a>(&'a self, _: &'a NodeClaim) -> BoxFuture<'a, CloudResult<Option<DriftReason>>> {
        Box::pin(async { Ok(None) })
    }

    fn name(&self) -> &'static str {
        "fake"
    }
}

/// A unique lower-case id for this test's objects.
fn unique(prefix: &str) -> String {
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_nanos();
    format!("{prefix}-{:x}{:x}", std::process::id(), nanos % 0xffff_ffff)
}

async fn client() -> Client {
    let _ = tracing_subscriber::fmt().json().with_test_writer().with_env_filter("karpenter=debug").try_init();
    Client::try_default().await.expect("a kubeconfig for the local control plane")
}

/// The EC2NodeClass of a run's claims.
fn class_name(run: &str) -> String {
    format!("{run}-class")
}

/// Creates the run's EC2NodeClass with a Ready status (no provider resolves it here).
async fn ready_class(client: &Client, run: &str) {
    let classes: Api<crate::apis::EC2NodeClass> = Api::all(client.clone());
    let class: crate::apis::EC2NodeClass = serde_json::from_value(json!({
        "apiVersion": "karpenter.k8s.aws/v1", "kind": "EC2NodeClass",
        "metadata": {"name": class_name(run), "labels": {RUN_LABEL: run}},
        "spec": {"amiSelectorTerms": [{"alias": "al2023@latest"}], "role": "test",
            "subnetSelectorTerms": [{"tags": {"test": run}}], "securityGroupSelectorTerms": [{"tags": {"test": run}}]}
    }))
    .unwrap();
    match classes.create(&PostParams::default(), &class).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 409 => {}
        Err(e) => panic!("creating the test's EC2NodeClass: {e}"),
    }
    let status = json!({"status": {"conditions": [{"type": "Ready", "status": "True", "reason": "Ready", "message": "",
        "lastTransitionTime": "2026-01-01T00:00:00Z"}]}});
    classes.patch_status(&class_name(run), &PatchParams::default(), &Patch::Merge(&status)).await.unwrap();
}

/// Starts the controller, restricted to this run's claims, with its own cluster state.
fn start(client: &Client, cloud: Arc<FakeCloud>, run: &str) -> (watch::Sender<bool>, JoinHandle<()>) {
    start_with(client, cloud, run, Arc::new(Queue::new()), Arc::new(Metrics::unregistered()))
}

/// [`start`] with the controller's queue and metrics.
fn start_with(
    client: &Client,
    cloud: Arc<FakeCloud>,
    run: &str,
    queue: Arc<Queue<String>>,
    metrics: Arc<Metrics>,
) -> (watch::Sender<bool>, JoinHandle<()>) {
    let ctx = Context {
        client: client.clone(),
        cloud,
        settings: Default::default(),
        metrics,
        events: Events::new(client.clone(), Some("lifecycle-test".into())),
        decisions: Default::default(),
        surges: Default::default(),
    };
    let (stop, stop_rx) = watch::channel(false);
    let (cluster, watches) = ClusterState::start(client.clone());
    let run = run.to_string();
    let run_name = run.clone();
    let class_client = client.clone();
    let task = tokio::spawn(async move {
        ready_class(&class_client, &run).await;
        let watches = tokio::spawn(watches);
        cluster.wait_synced().await;
        let select = move |c: &NodeClaim| c.labels().get(RUN_LABEL) == Some(&run);
        super::run_selected(ctx, cluster, queue, stop_rx, select).await;
        watches.abort();
        let classes: Api<crate::apis::EC2NodeClass> = Api::all(class_client);
        let _ = classes.delete(&class_name(&run_name), &Default::default()).await;
    });
    (stop, task)
}

fn claim(name: &str, run: &str) -> NodeClaim {
    serde_json::from_value(json!({
        "apiVersion": "karpenter.sh/v1",
        "kind": "NodeClaim",
        "metadata": {
            "name": name,
            "labels": { RUN_LABEL: run, LABEL_NODEPOOL: format!("{run}-pool"), "team": "blue" },
        },
        "spec": {
            "nodeClassRef": { "group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": class_name(run) },
            "requirements": [
                { "key": LABEL_INSTANCE_TYPE, "operator": "In", "values": ["m5.large"] },
            ],
            "taints": [{ "key": "dedicated", "value": "blue", "effect": "NoSchedule" }],
            "startupTaints": [{ "key": "example.com/agent-not-ready", "effect": "NoSchedule" }],
            "terminationGracePeriod": "1h",
        },
    }))
    .unwrap()
}

/// Polls `check` until it returns `Some`, for at most `limit`.
async fn eventually<T, F, Fut>(what: &str, limit: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(tokio::time::Instant::now() < deadline, "{what} did not happen within {limit:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn condition_is(claim: &NodeClaim, type_: &str, status: &str) -> bool {
    claim.condition(type_).is_some_and(|c| format!("{:?}", c.status) == status)
}

/// The warning with `reason` about object `name`, waiting for it up to ten seconds.
async fn warning_about(client: &Client, name: &str, reason: &str) -> Event {
    let events: Api<Event> = Api::all(client.clone());
    let params = ListParams::default().fields(&format!("involvedObject.name={name}"));
    eventually(reason, Duration::from_secs(10), || async {
        let list = events.list(&params).await.ok()?;
        list.items
            .into_iter()
            .find(|e| e.reason.as_deref() == Some(reason) && e.type_.as_deref() == Some("Warning"))
    })
    .await
}

fn taint_keys(node: &Node) -> Vec<String> {
    node.spec.as_ref().and_then(|s| s.taints.clone()).unwrap_or_default().into_iter().map(|t| t.key).collect()
}

#[tokio::test]
#[ignore = "needs the local control plane"]
async fn a_claim_launches_registers_initializes_and_terminates() {
    let client = client().await;
    let run = unique("lc");
    let name = format!("{run}-a");
    let cloud = Arc::new(FakeCloud::new(client.clone(), &run, Mode::Normal));
    let (stop, task) = start(&client, cloud.clone(), &run);
    let claims: Api<NodeClaim> = Api::all(client.clone());
    let nodes: Api<Node> = Api::all(client.clone());
    claims.create(&PostParams::default(), &claim(&name, &run)).await.unwrap();
    let limit = Duration::from_secs(30);

    // Finalizer, launch and the instance's labels on the claim.
    let launched = eventually("launch", limit, || async {
        let c = claims.get(&name).await.ok()?;
        condition_is(&c, LAUNCHED, "True").then_some(c)
    })
    .await;
    assert!(launched.finalizers().contains(&FINALIZER_TERMINATION.to_string()));
    let labels = launched.labels();
    assert_eq!(labels.get(LABEL_INSTANCE_TYPE).map(String::as_str), Some("m5.large"));
    assert_eq!(labels.get(LABEL_CAPACITY_TYPE).map(String::as_str), Some("spot"));
    assert_eq!(labels.get(LABEL_TOPOLOGY_ZONE).map(String::as_str), Some("us-west-2a"));
    assert_eq!(labels.get(LABEL_ARCH).map(String::as_str), Some("amd64"));
    assert_eq!(launched.annotations().get(ANNOTATION_EC2NODECLASS_HASH).map(String::as_str), Some("42"));
    // Applied without it, the claim is labelled with its node class.
    assert_eq!(labels.get(LABEL_EC2NODECLASS), Some(&class_name(&run)));
    let status = launched.status.clone().unwrap();
    assert_eq!(status.image_id.as_deref(), Some("ami-0123"));
    assert!(status.provider_id.as_deref().is_some_and(|p| p.starts_with("aws:///us-west-2a/i-")));
    assert!(status.capacity.is_some_and(|c| c.contains_key("memory")));

    // Registration syncs the claim onto the Node.
    let registered = eventually("registration", limit, || async {
        let c = claims.get(&name).await.ok()?;
        condition_is(&c, REGISTERED, "True").then_some(c)
    })
    .await;
    assert_eq!(registered.status.as_ref().and_then(|s| s.node_name.as_deref()), Some(name.as_str()));
    let node = nodes.get(&name).await.unwrap();
    assert_eq!(node.labels().get(LABEL_REGISTERED).map(String::as_str), Some("true"));
    assert_eq!(node.labels().get("team").map(String::as_str), Some("blue"));
    assert_eq!(node.labels().get(LABEL_INSTANCE_TYPE).map(String::as_str), Some("m5.large"));
    assert_eq!(node.annotations().get(ANNOTATION_EC2NODECLASS_HASH).map(String::as_str), Some("42"));
    assert!(node.finalizers().contains(&FINALIZER_TERMINATION.to_string()));
    let owner = &node.owner_references()[0];
    assert_eq!((owner.kind.as_str(), owner.name.as_str()), ("NodeClaim", name.as_str()));
    assert_eq!(owner.uid, registered.uid().unwrap());
    let taints = taint_keys(&node);
    assert!(!taints.contains(&TAINT_UNREGISTERED.to_string()), "{taints:?}");
    assert!(taints.contains(&"dedicated".to_string()), "{taints:?}");
    assert!(taints.contains(&"example.com/agent-not-ready".to_string()), "{taints:?}");

    // The startup taint holds initialization back until its agent removes it.
    eventually("the startup taint to block initialization", limit, || async {
        let c = claims.get(&name).await.ok()?;
        let initialized = c.condition(INITIALIZED)?;
        (initialized.reason == reasons::STARTUP_TAINTS_EXIST).then_some(())
    })
    .await;
    // The agent removes its taint; the controller may be writing the Node meanwhile, so a
    // conflict is retried as any client would.
    eventually("the startup taint removed", limit, || async {
        let node = nodes.get(&name).await.ok()?;
        let kept: Vec<_> = node
            .spec
            .and_then(|s| s.taints)
            .unwrap_or_default()
            .into_iter()
            .filter(|t| t.key != "example.com/agent-not-ready")
            .collect();
        let patch = json!({ "metadata": { "resourceVersion": node.metadata.resource_version }, "spec": { "taints": kept } });
        nodes.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await.ok().map(|_| ())
    })
    .await;

    let ready = eventually("initialization", limit, || async {
        let c = claims.get(&name).await.ok()?;
        (condition_is(&c, INITIALIZED, "True") && condition_is(&c, READY, "True")).then_some(c)
    })
    .await;
    assert!(condition_is(&ready, LAUNCHED, "True") && condition_is(&ready, REGISTERED, "True"));
    let node = nodes.get(&name).await.unwrap();
    assert_eq!(node.labels().get(LABEL_INITIALIZED).map(String::as_str), Some("true"));
    assert_eq!(node.labels().get(LABEL_EC2NODECLASS), Some(&class_name(&run)));

    // A claim and Node that lack the node class's label (made by an older version) get it.
    let unlabel = json!({ "metadata": { "labels": { LABEL_EC2NODECLASS: null } } });
    nodes.patch(&name, &PatchParams::default(), &Patch::Merge(&unlabel)).await.unwrap();
    claims.patch(&name, &PatchParams::default(), &Patch::Merge(&unlabel)).await.unwrap();
    eventually("the node class's label back on the claim and its Node", limit, || async {
        let c = claims.get(&name).await.ok()?;
        let n = nodes.get(&name).await.ok()?;
        let class = class_name(&run);
        (c.labels().get(LABEL_EC2NODECLASS) == Some(&class)
            && n.labels().get(LABEL_EC2NODECLASS) == Some(&class))
        .then_some(())
    })
    .await;

    // Deletion: the Node goes first (we stand in for the node termination controller), then the
    // instance, then the claim's finalizer.
    claims.delete(&name, &Default::default()).await.unwrap();
    eventually("node deletion", limit, || async {
        let n = nodes.get(&name).await.ok()?;
        n.metadata.deletion_timestamp.is_some().then_some(())
    })
    .await;
    assert!(cloud.deletes.lock().unwrap().is_empty(), "the instance outlived its node");
    let node = nodes.get(&name).await.unwrap();
    assert!(taint_keys(&node).contains(&TAINT_DISRUPTED.to_string()), "nothing new lands on it: {node:?}");
    let deleting = claims.get(&name).await.unwrap();
    let deleted_at = deleting.metadata.deletion_timestamp.clone().unwrap().0;
    let deadline = deleting.annotations().get(ANNOTATION_NODECLAIM_TERMINATION_TIMESTAMP).cloned();
    let expected =
        crate::apis::common::transition_time(deleted_at.checked_add(Duration::from_secs(3600)).unwrap());
    assert_eq!(deadline, Some(expected));
    let patch = json!({ "metadata": { "finalizers": null } });
    nodes.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
    eventually("the claim to go", Duration::from_secs(60), || async {
        claims.get_opt(&name).await.ok()?.is_none().then_some(())
    })
    .await;
    assert!(nodes.get_opt(&name).await.unwrap().is_none());
    let deletes = cloud.deletes.lock().unwrap().clone();
    assert!(deletes.len() >= 2, "terminated, then confirmed gone: {deletes:?}");
    assert!(cloud.instances.lock().unwrap().is_empty());

    stop.send(true).unwrap();
    tokio::time::timeout(Duration::from_secs(10), task).await.unwrap().unwrap();
}

#[tokio::test]
#[ignore = "needs the local control plane"]
async fn insufficient_capacity_deletes_the_claim_with_an_event() {
    let client = client().await;
    let run = unique("lc-ice");
    let name = format!("{run}-a");
    let cloud = Arc::new(FakeCloud::new(client.clone(), &run, Mode::InsufficientCapacity));
    let (stop, task) = start(&client, cloud.clone(), &run);
    let claims: Api<NodeClaim> = Api::all(client.clone());
    let created = claims.create(&PostParams::default(), &claim(&name, &run)).await.unwrap();

    eventually("the claim to go", Duration::from_secs(30), || async {
        claims.get_opt(&name).await.ok()?.is_none().then_some(())
    })
    .await;
    let events: Api<Event> = Api::all(client.clone());
    let params = ListParams::default().fields(&format!("involvedObject.name={name}"));
    let event = eventually("the event", Duration::from_secs(10), || async {
        let list = events.list(&params).await.ok()?;
        list.items
            .into_iter()
            .find(|e| e.reason.as_deref() == Some(event_reasons::INSUFFICIENT_CAPACITY_ERROR))
    })
    .await;
    assert_eq!(event.type_.as_deref(), Some("Warning"));
    assert!(event.message.unwrap_or_default().contains("insufficient capacity"));
    assert_eq!(event.involved_object.uid, created.uid());

    stop.send(true).unwrap();
    tokio::time::timeout(Duration::from_secs(10), task).await.unwrap().unwrap();
}

#[tokio::test]
#[ignore = "needs the local control plane"]
async fn an_instance_whose_launch_answer_was_lost_is_terminated_with_its_claim() {
    let client = client().await;
    let run = unique("lc-lost");
    let name = format!("{run}-a");
    let cloud = Arc::new(FakeCloud::new(client.clone(), &run, Mode::LostResponse));
    let (stop, task) = start(&client, cloud.clone(), &run);
    let claims: Api<NodeClaim> = Api::all(client.clone());
    claims.create(&PostParams::default(), &claim(&name, &run)).await.unwrap();

    let failed = eventually("the launch failure", Duration::from_secs(30), || async {
        let c = claims.get(&name).await.ok()?;
        let launched = c.condition(LAUNCHED)?;
        (launched.reason == reasons::LAUNCH_FAILED).then_some(c)
    })
    .await;
    // Unknown, as upstream: the next attempt may still launch it.
    let launched = failed.condition(LAUNCHED).unwrap();
    assert!(condition_is(&failed, LAUNCHED, "Unknown"));
    assert!(launched.message.contains("connection reset"), "{}", launched.message);
    assert!(condition_is(&failed, READY, "Unknown"));
    assert_eq!(failed.condition(READY).unwrap().reason, reasons::RECONCILING_DEPENDENTS);
    assert_eq!(cloud.instances.lock().unwrap().len(), 1);

    claims.delete(&name, &Default::default()).await.unwrap();
    eventually("the claim to go", Duration::from_secs(30), || async {
        claims.get_opt(&name).await.ok()?.is_none().then_some(())
    })
    .await;
    assert!(cloud.instances.lock().unwrap().is_empty(), "the instance was found by the claim's name");

    stop.send(true).unwrap();
    tokio::time::timeout(Duration::from_secs(10), task).await.unwrap().unwrap();
}

/// Blocks every status write of NodeClaims labelled `BLOCK_LABEL`, through a
/// ValidatingAdmissionPolicy of the API server; dropped (best effort) with the guard.
const BLOCK_LABEL: &str = "lifecycle-test.karpenter.sh/block-status";

async fn block_status_writes(client: &Client, run: &str) {
    use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
    let gvk = |kind: &str| GroupVersionKind::gvk("admissionregistration.k8s.io", "v1", kind);
    let policies: Api<DynamicObject> =
        Api::all_with(client.clone(), &ApiResource::from_gvk(&gvk("ValidatingAdmissionPolicy")));
    let bindings: Api<DynamicObject> =
        Api::all_with(client.clone(), &ApiResource::from_gvk(&gvk("ValidatingAdmissionPolicyBinding")));
    let name = format!("block-status-{run}");
    let policy: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": name},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {"resourceRules": [{"apiGroups": ["karpenter.sh"], "apiVersions": ["v1"],
                "operations": ["UPDATE"], "resources": ["nodeclaims/status"]}]},
            "validations": [{
                "expression": format!("!has(object.metadata.labels) || !('{BLOCK_LABEL}' in object.metadata.labels)"),
                "message": "status writes are blocked by the test"}]
        }
    }))
    .unwrap();
    let binding: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": name},
        "spec": {"policyName": name, "validationActions": ["Deny"]}
    }))
    .unwrap();
    policies.create(&PostParams::default(), &policy).await.unwrap();
    bindings.create(&PostParams::default(), &binding).await.unwrap();
    // The API server takes a moment to enforce a new policy: wait until a probe is refused.
    let claims: Api<NodeClaim> = Api::all(client.clone());
    let probe_name = format!("{run}-probe");
    let mut probe = claim(&probe_name, &format!("{run}-probe"));
    probe.metadata.labels.get_or_insert_default().insert(BLOCK_LABEL.into(), "true".into());
    claims.create(&PostParams::default(), &probe).await.unwrap();
    let status = json!({"status": {"imageID": "probe"}});
    eventually("the policy enforced", Duration::from_secs(30), || async {
        claims
            .patch_status(&probe_name, &PatchParams::default(), &Patch::Merge(&status))
            .await
            .is_err()
            .then_some(())
    })
    .await;
    claims.delete(&probe_name, &Default::default()).await.unwrap();
}

async fn unblock_status_writes(client: &Client, run: &str) {
    use kube::api::{ApiResource, DeleteParams, DynamicObject, GroupVersionKind};
    let name = format!("block-status-{run}");
    for kind in ["ValidatingAdmissionPolicyBinding", "ValidatingAdmissionPolicy"] {
        let gvk = GroupVersionKind::gvk("admissionregistration.k8s.io", "v1", kind);
        let api: Api<DynamicObject> = Api::all_with(client.clone(), &ApiResource::from_gvk(&gvk));
        let _ = api.delete(&name, &DeleteParams::default()).await;
    }
}

/// A launch whose status write fails (here the API server refuses it) is remembered: the retries
/// write the same instance instead of launching another one.
#[tokio::test]
#[ignore = "needs the local control plane"]
async fn a_failed_status_write_after_a_launch_never_launches_again() {
    let client = client().await;
    let run = unique("lcw");
    block_status_writes(&client, &run).await;
    let name = format!("{run}-a");
    let cloud = Arc::new(FakeCloud::new(client.clone(), &run, Mode::Normal));
    let metrics = Arc::new(Metrics::unregistered());
    let (stop, task) = start_with(&client, cloud.clone(), &run, Arc::new(Queue::new()), metrics.clone());
    let claims: Api<NodeClaim> = Api::all(client.clone());
    let mut blocked = claim(&name, &run);
    blocked.metadata.labels.get_or_insert_default().insert(BLOCK_LABEL.into(), "true".into());
    claims.create(&PostParams::default(), &blocked).await.unwrap();

    // The launch happened and its status write keeps failing, retried with backoff.
    let errors = || {
        metrics
            .controller_reconcile_errors
            .get_or_create(&vec![("controller", super::CONTROLLER.to_string())])
            .get()
    };
    eventually("three failed status writes", Duration::from_secs(60), || async {
        (errors() >= 3).then_some(())
    })
    .await;
    assert_eq!(
        cloud.creates.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "one launch, however many retries"
    );
    let c = claims.get(&name).await.unwrap();
    assert!(!condition_is(&c, LAUNCHED, "True"), "the status write was refused");

    // Once the API server takes status writes again, the remembered launch is recorded.
    let unlabel = json!({"metadata": {"labels": {BLOCK_LABEL: null}}});
    claims.patch(&name, &PatchParams::default(), &Patch::Merge(&unlabel)).await.unwrap();
    let launched = eventually("the launch recorded", Duration::from_secs(60), || async {
        let c = claims.get(&name).await.ok()?;
        condition_is(&c, LAUNCHED, "True").then_some(c)
    })
    .await;
    assert_eq!(cloud.creates.load(std::sync::atomic::Ordering::SeqCst), 1);
    let provider_id = launched.status.as_ref().and_then(|s| s.provider_id.clone()).unwrap_or_default();
    assert!(provider_id.ends_with(&name.replace('-', "")), "{provider_id}");

    unblock_status_writes(&client, &run).await;
    claims.delete(&name, &Default::default()).await.unwrap();
    // We stand in for the node termination controller.
    let nodes: Api<Node> = Api::all(client.clone());
    let release = json!({ "metadata": { "finalizers": null } });
    eventually("the node released", Duration::from_secs(30), || async {
        nodes.patch(&name, &PatchParams::default(), &Patch::Merge(&release)).await.ok().map(|_| ())
    })
    .await;
    eventually("the claim gone", Duration::from_secs(60), || async {
        claims.get_opt(&name).await.unwrap().is_none().then_some(())
    })
    .await;
    stop.send_replace(true);
    task.await.unwrap();
}

/// What the controller keeps about a failing claim (its retry timer and failure count) goes
/// when the claim does.
#[tokio::test]
#[ignore = "needs the local control plane"]
async fn the_bookkeeping_of_a_failing_claim_goes_with_it() {
    let client = client().await;
    let run = unique("lcq");
    let cloud = Arc::new(FakeCloud::new(client.clone(), &run, Mode::LostResponse));
    let queue: Arc<Queue<String>> = Arc::new(Queue::new());
    let (stop, task) =
        start_with(&client, cloud.clone(), &run, queue.clone(), Arc::new(Metrics::unregistered()));
    let claims: Api<NodeClaim> = Api::all(client.clone());
    let names: Vec<String> = (0..3).map(|i| format!("{run}-{i}")).collect();
    for name in &names {
        claims.create(&PostParams::default(), &claim(name, &run)).await.unwrap();
    }
    eventually("every claim failing", Duration::from_secs(30), || async {
        names.iter().all(|n| queue.failures(n) >= 1).then_some(())
    })
    .await;
    assert_eq!(queue.tracked(), 3);
    for name in &names {
        claims.delete(name, &Default::default()).await.unwrap();
    }
    eventually("the claims gone", Duration::from_secs(60), || async {
        let left = claims.list(&ListParams::default().labels(&format!("{RUN_LABEL}={run}"))).await.ok()?;
        left.items.is_empty().then_some(())
    })
    .await;
    eventually("nothing kept about them", Duration::from_secs(10), || async {
        (queue.tracked() == 0).then_some(())
    })
    .await;
    stop.send_replace(true);
    task.await.unwrap();
}

#[tokio::test]
#[ignore = "needs the local control plane"]
async fn a_claim_whose_node_class_does_not_exist_is_deleted_with_an_event() {
    let client = client().await;
    let run = unique("lc-nc");
    let name = format!("{run}-a");
    let cloud = Arc::new(FakeCloud::new(client.clone(), &run, Mode::Normal));
    let (stop, task) = start(&client, cloud.clone(), &run);
    let claims: Api<NodeClaim> = Api::all(client.clone());
    let mut c = claim(&name, &run);
    c.spec.node_class_ref.name = format!("{run}-missing");
    claims.create(&PostParams::default(), &c).await.unwrap();

    eventually("the claim to go", Duration::from_secs(30), || async {
        claims.get_opt(&name).await.ok()?.is_none().then_some(())
    })
    .await;
    let event = warning_about(&client, &name, event_reasons::NODE_CLASS_NOT_FOUND).await;
    assert!(event.message.as_deref().is_some_and(|m| m.contains(&format!("{run}-missing"))), "{event:?}");
    assert_eq!(cloud.creates.load(std::sync::atomic::Ordering::SeqCst), 0, "nothing was launched");

    stop.send(true).unwrap();
    tokio::time::timeout(Duration::from_secs(10), task).await.unwrap().unwrap();
}

#[tokio::test]
#[ignore = "needs the local control plane"]
async fn a_claim_waits_for_its_node_class_to_be_ready() {
    let client = client().await;
    let run = unique("lc-nr");
    let name = format!("{run}-a");
    let cloud = Arc::new(FakeCloud::new(client.clone(), &run, Mode::Normal));
    let (stop, task) = start(&client, cloud.clone(), &run);
    // A class with no status yet, as a provider that has not resolved it leaves it.
    let classes: Api<crate::apis::EC2NodeClass> = Api::all(client.clone());
    let later = format!("{run}-later");
    let class: crate::apis::EC2NodeClass = serde_json::from_value(json!({
        "apiVersion": "karpenter.k8s.aws/v1", "kind": "EC2NodeClass",
        "metadata": {"name": later, "labels": {RUN_LABEL: run}},
        "spec": {"amiSelectorTerms": [{"alias": "al2023@latest"}], "role": "test",
            "subnetSelectorTerms": [{"tags": {"test": run}}], "securityGroupSelectorTerms": [{"tags": {"test": run}}]}
    }))
    .unwrap();
    classes.create(&PostParams::default(), &class).await.unwrap();
    let claims: Api<NodeClaim> = Api::all(client.clone());
    let mut c = claim(&name, &run);
    c.spec.node_class_ref.name = later.clone();
    claims.create(&PostParams::default(), &c).await.unwrap();

    let waiting = eventually("the claim to wait", Duration::from_secs(30), || async {
        let c = claims.get(&name).await.ok()?;
        let launched = c.condition(LAUNCHED)?;
        (launched.reason == reasons::NODE_CLASS_NOT_READY).then_some(c)
    })
    .await;
    assert!(condition_is(&waiting, LAUNCHED, "False"));
    warning_about(&client, &name, event_reasons::NODE_CLASS_NOT_READY).await;
    assert_eq!(cloud.creates.load(std::sync::atomic::Ordering::SeqCst), 0, "nothing was launched");

    // Once the class is Ready, the claim launches.
    let status = json!({"status": {"conditions": [{"type": "Ready", "status": "True", "reason": "Ready", "message": "",
        "lastTransitionTime": "2026-01-01T00:00:00Z"}]}});
    classes.patch_status(&later, &PatchParams::default(), &Patch::Merge(&status)).await.unwrap();
    eventually("the launch", Duration::from_secs(60), || async {
        let c = claims.get(&name).await.ok()?;
        condition_is(&c, LAUNCHED, "True").then_some(())
    })
    .await;

    claims.delete(&name, &Default::default()).await.unwrap();
    let nodes: Api<Node> = Api::all(client.clone());
    eventually("the claim to go", Duration::from_secs(60), || async {
        // We stand in for the node termination controller.
        if let Ok(Some(n)) = nodes.get_opt(&name).await
            && n.metadata.deletion_timestamp.is_some()
        {
            let patch = json!({ "metadata": { "finalizers": null } });
            let _ = nodes.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await;
        }
        claims.get_opt(&name).await.ok()?.is_none().then_some(())
    })
    .await;
    classes.delete(&later, &Default::default()).await.unwrap();
    stop.send(true).unwrap();
    tokio::time::timeout(Duration::from_secs(10), task).await.unwrap().unwrap();
}

#[tokio::test]
#[ignore = "needs the local control plane"]
async fn a_claim_whose_provider_id_the_provider_cannot_use_is_finalized() {
    let client = client().await;
    let run = unique("lc-pid");
    let name = format!("{run}-a");
    let claims: Api<NodeClaim> = Api::all(client.clone());
    // A claim another provider launched: it has our finalizer and a provider ID we cannot parse,
    // and it is being deleted before the controller starts.
    let mut c = claim(&name, &run);
    c.metadata.finalizers = Some(vec![FINALIZER_TERMINATION.to_string()]);
    claims.create(&PostParams::default(), &c).await.unwrap();
    let status = json!({"status": {"providerID": "gce://project/zone/instance-1", "conditions": [
        {"type": LAUNCHED, "status": "True", "reason": "Launched", "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"}]}});
    claims.patch_status(&name, &PatchParams::default(), &Patch::Merge(&status)).await.unwrap();
    claims.delete(&name, &Default::default()).await.unwrap();

    let cloud = Arc::new(FakeCloud::new(client.clone(), &run, Mode::Normal));
    let (stop, task) = start(&client, cloud.clone(), &run);
    eventually("the claim to go", Duration::from_secs(30), || async {
        claims.get_opt(&name).await.ok()?.is_none().then_some(())
    })
    .await;
    let event = warning_about(&client, &name, event_reasons::INVALID_PROVIDER_ID).await;
    assert!(
        event.message.as_deref().is_some_and(|m| m.contains("gce://project/zone/instance-1")),
        "{event:?}"
    );
    // Asked about that instance only (a reconcile of a copy the cache has not updated yet may ask
    // twice).
    let deletes = cloud.deletes.lock().unwrap().clone();
    assert!(
        !deletes.is_empty() && deletes.iter().all(|d| d == "gce://project/zone/instance-1"),
        "{deletes:?}"
    );

    stop.send(true).unwrap();
    tokio::time::timeout(Duration::from_secs(10), task).await.unwrap().unwrap();
}

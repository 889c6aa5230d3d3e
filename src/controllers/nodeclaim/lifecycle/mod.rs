//! The NodeClaim lifecycle controller: takes every NodeClaim from launch through registration and
//! initialization to Ready, deletes claims that do not launch or register in time, and on
//! deletion removes the claim's Node and instance before letting the claim go.
//!
//! The steps of one reconcile, in order:
//! 1. the `karpenter.sh/termination` finalizer on every claim that is not being deleted;
//! 2. liveness: a claim not launched [`logic::LAUNCH_TTL`] after its creation, or not registered
//!    [`logic::REGISTRATION_TTL`] after its launch, is deleted;
//! 3. launch through the cloud provider (idempotent: a retried create returns the same instance);
//!    insufficient capacity deletes the claim so that the provisioner retries elsewhere;
//! 4. registration: the Node with the claim's provider ID gets the claim's labels, annotations,
//!    taints, an owner reference and the termination finalizer, and loses the unregistered taint;
//! 5. initialization: the Node is Ready, its start-up and ephemeral taints are gone and the
//!    requested extended resources are allocatable;
//! 6. Ready = Launched and Registered and Initialized.
//!
//! Deletion (finalization) deletes the Node and waits for it to go (the node termination
//! controller drains it), then terminates the instance until the cloud provider reports it gone,
//! then removes the finalizer.
//!
//! The decisions live in [`logic`] as pure functions; this module only reads and writes.

pub mod logic;

#[cfg(test)]
mod cluster_tests;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, Patch, PatchParams, Preconditions};
use kube::{Resource, ResourceExt};
use serde_json::json;
use thiserror::Error;
use tokio::sync::watch;

use crate::apis::labels::{
    ANNOTATION_NODECLAIM_TERMINATION_TIMESTAMP, FINALIZER_TERMINATION, LABEL_INITIALIZED,
};
use crate::apis::nodeclaim::conditions::{INITIALIZED, INSTANCE_TERMINATING, LAUNCHED, REGISTERED};
use crate::apis::{EC2NodeClass, NodeClaim};
use crate::cloudprovider::{CloudProviderError, Instance};
use crate::controllers::Context;
use crate::controllers::events::reasons as event_reasons;
use crate::controllers::kit::{Backoff, Next, Options, Queue, Reconcile, run_keyed};
use crate::metrics::observe;
use crate::state::nodeclass::{self, NodeClassProblem};
use crate::state::{ClusterState, Notice};
use crate::util::error_chain;
use logic::{ConditionUpdate, Liveness, is_true, reasons, set_condition};

/// Name of the controller, in logs.
pub const CONTROLLER: &str = "nodeclaim.lifecycle";

/// How often a claim waiting on its Node's deletion or its instance's termination is checked.
const TERMINATION_POLL: Duration = Duration::from_secs(5);
/// How often a launched claim checks for its Node while it is not initialized.
const NODE_POLL: Duration = Duration::from_secs(30);
/// How often a claim whose node class is not ready retries its launch.
const NODE_CLASS_RETRY: Duration = Duration::from_secs(15);
/// Retry delays of a failing claim: doubling from one second up to two minutes.
const BACKOFF: Backoff = Backoff::new(Duration::from_secs(1), Duration::from_secs(120));
/// NodeClaims reconciled at once: as many as the API client sends requests at once.
const WORKERS: usize = crate::util::MAX_IN_FLIGHT;

/// Why a reconcile failed; the claim is retried with backoff.
#[derive(Debug, Error)]
pub enum Error {
    /// An API server call failed.
    #[error("{action} failed")]
    Kube {
        /// What was attempted.
        action: String,
        /// The client's error.
        #[source]
        source: kube::Error,
    },
    /// A cloud provider call failed.
    #[error("cloud provider {method} failed")]
    Cloud {
        /// The method (`create`, `delete`, `list`).
        method: &'static str,
        /// The provider's error.
        #[source]
        source: CloudProviderError,
    },
    /// The Node cache did not fill in time.
    #[error("the Node cache is not synced yet")]
    CacheNotSynced,
}

impl Error {
    fn kube(action: impl Into<String>) -> impl FnOnce(kube::Error) -> Error {
        let action = action.into();
        move |source| Error::Kube { action, source }
    }

    /// Whether the error is an optimistic-concurrency conflict (another writer was first).
    pub fn is_conflict(&self) -> bool {
        matches!(self, Error::Kube { source: kube::Error::Api(s), .. } if s.code == 409)
    }
}

fn is_not_found(error: &kube::Error) -> bool {
    matches!(error, kube::Error::Api(s) if s.code == 404)
}

/// What the reconciler shares between claims.
struct State {
    ctx: Context,
    cluster: ClusterState,
    claims: Api<NodeClaim>,
    nodes: Api<Node>,
    /// Instances launched for NodeClaims whose status does not record them yet, by NodeClaim UID:
    /// a reconcile after a failed status write finds its launch here instead of launching again.
    launched: Mutex<HashMap<String, Instance>>,
}

impl State {
    fn launched(&self) -> std::sync::MutexGuard<'_, HashMap<String, Instance>> {
        self.launched.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The lifecycle controller as a keyed reconciler of NodeClaims, by name.
struct Lifecycle(Arc<State>);

impl Reconcile for Lifecycle {
    type Key = String;
    type Error = Error;

    async fn reconcile(&self, name: &String) -> Result<Next, Error> {
        let state = &self.0;
        let Some(claim) = state.cluster.nodeclaim(name) else {
            return Ok(Next::Wait);
        };
        let result = reconcile_claim(&claim, state).await;
        if claim.metadata.deletion_timestamp.is_some() || logic::is_true(logic::conditions(&claim), LAUNCHED)
        {
            // The launch is in the status (or no longer matters): nothing to remember.
            if let Some(uid) = claim.metadata.uid.as_deref()
                && result.is_ok()
            {
                state.launched().remove(uid);
            }
        }
        result
    }
}

/// Runs the lifecycle controller for every NodeClaim until `stop` turns true.
pub async fn run(ctx: Context, cluster: ClusterState, stop: watch::Receiver<bool>) {
    run_selected(ctx, cluster, Arc::new(Queue::new()), stop, |_| true).await;
}

/// [`run`] for the NodeClaims `select` accepts (tests keep to their own), taking work from
/// `queue`.
pub(crate) async fn run_selected(
    ctx: Context,
    cluster: ClusterState,
    queue: Arc<Queue<String>>,
    stop: watch::Receiver<bool>,
    select: impl Fn(&NodeClaim) -> bool + Send + Sync + 'static,
) {
    let state = Arc::new(State {
        claims: Api::all(ctx.client.clone()),
        nodes: Api::all(ctx.client.clone()),
        ctx,
        cluster: cluster.clone(),
        launched: Mutex::new(HashMap::new()),
    });
    let select = Arc::new(select);
    let _claims = {
        let (queue, state, select, cluster) = (queue.clone(), state.clone(), select.clone(), cluster.clone());
        cluster.clone().on_nodeclaim(move |notice| match notice {
            Notice::Applied(claim) if select(claim) => queue.add(claim.name_any()),
            Notice::Applied(_) => {}
            Notice::Deleted(claim) => {
                queue.forget(&claim.name_any());
                if let Some(uid) = claim.metadata.uid.as_deref() {
                    state.launched().remove(uid);
                }
            }
            Notice::Gone { name, .. } => {
                queue.forget(&name.to_string());
                // Only the name of a claim found missing is known: keep the launches of the
                // claims the cache still has.
                let live: std::collections::HashSet<String> =
                    cluster.nodeclaims.state().iter().filter_map(|c| c.metadata.uid.clone()).collect();
                state.launched().retain(|uid, _| live.contains(uid));
            }
        })
    };
    let _nodes = {
        let (queue, cluster, select) = (queue.clone(), cluster.clone(), select.clone());
        cluster.clone().on_node(move |notice| {
            let (Notice::Applied(node) | Notice::Deleted(node)) = notice else { return };
            let Some(pid) =
                node.spec.as_ref().and_then(|s| s.provider_id.as_deref()).filter(|p| !p.is_empty())
            else {
                return;
            };
            if let Some(claim) = cluster.nodeclaim_with_provider_id(pid)
                && select(&claim)
            {
                queue.add(claim.name_any());
            }
        })
    };
    // A claim waiting for its node class launches as soon as the class is Ready.
    let _classes = {
        let (queue, cluster, select) = (queue.clone(), cluster.clone(), select.clone());
        cluster.clone().on_nodeclass(move |notice| {
            let Notice::Applied(class) = notice else { return };
            let name = class.name_any();
            for claim in cluster.nodeclaims.state() {
                if claim.spec.node_class_ref.name == name
                    && !logic::is_true(logic::conditions(&claim), LAUNCHED)
                    && select(&claim)
                {
                    queue.add(claim.name_any());
                }
            }
        })
    };
    for claim in cluster.nodeclaims.state() {
        if select(&claim) {
            queue.add(claim.name_any());
        }
    }
    let options = Options::new(CONTROLLER).workers(WORKERS).backoff(BACKOFF);
    let metrics = Some(state.ctx.metrics.clone());
    run_keyed(Arc::new(Lifecycle(state)), queue, options, metrics, stop).await;
}

/// Delay before retry number `attempts` (from 1) of a failing claim: doubling from one second up
/// to two minutes.
pub fn backoff(attempts: u32) -> Duration {
    BACKOFF.delay(attempts)
}

/// The steps' futures are boxed: inline, they add up to more stack than a debug build's test
/// thread has.
async fn reconcile_claim(claim: &NodeClaim, state: &State) -> Result<Next, Error> {
    let now = Timestamp::now();
    if claim.metadata.deletion_timestamp.is_some() {
        return Box::pin(finalize(claim, state, now)).await;
    }
    let claim = ensure_finalizer(claim, state).await?;

    if let Liveness::Expired { reason, metric_reason, message } = logic::liveness(&claim, now) {
        expire(&claim, state, reason, metric_reason, message).await?;
        return Ok(Next::Wait);
    }

    let stored = claim.clone();
    let mut claim = claim;
    let generation = claim.metadata.generation;
    logic::initialize_conditions(
        &mut claim.status.get_or_insert_with(Default::default).conditions,
        generation,
        now,
    );

    let mut failure = None;
    let mut retry = None;
    let mut transitions = Vec::new();
    if !is_true(logic::conditions(&claim), LAUNCHED) {
        match Box::pin(launch(&mut claim, state, now)).await {
            Launch::Launched(instance) => transitions.push(Transition::Launched(instance)),
            Launch::Deleted => return Ok(Next::Wait),
            Launch::Retry(after) => retry = Some(after),
            Launch::Failed(error) => failure = Some(error),
        }
    }
    // A failure to sync the Node must not lose the launch: the status is written regardless.
    if is_true(logic::conditions(&claim), LAUNCHED) {
        match Box::pin(register(&mut claim, state, now)).await {
            Ok(None) => {}
            Ok(Some((node, registered))) => {
                if registered {
                    transitions.push(Transition::Registered(node.clone()));
                }
                match Box::pin(initialize(&mut claim, &node, state, now)).await {
                    Ok(true) => transitions.push(Transition::Initialized(node)),
                    Ok(false) => {}
                    Err(error) => failure = failure.or(Some(error)),
                }
            }
            Err(error) => failure = failure.or(Some(error)),
        }
    }
    let status = claim.status.get_or_insert_with(Default::default);
    logic::update_ready(&mut status.conditions, generation, now);

    let claim = write(&stored, &claim, state).await?;
    // Only now, with the status written (and conditional on the version read), is each transition
    // reported: a reconcile of a stale copy fails its write instead of reporting twice.
    for transition in transitions {
        report(&claim, &transition, state);
    }
    if let Some(error) = failure {
        return Err(error);
    }
    let deadline = match logic::liveness(&claim, now) {
        Liveness::Alive(after) => after,
        Liveness::Expired { .. } => Some(Duration::from_secs(1)),
    };
    // Node events trigger reconciles, but one that arrives before the claim's provider ID is in the
    // cache maps to no claim: poll as a safety net while waiting for the Node.
    let conditions = logic::conditions(&claim);
    let waiting = (is_true(conditions, LAUNCHED) && !is_true(conditions, INITIALIZED)).then_some(NODE_POLL);
    Ok(match [retry, deadline, waiting].into_iter().flatten().min() {
        Some(after) => Next::After(after),
        None => Next::Wait,
    })
}

fn has_finalizer<K: Resource>(object: &K) -> bool {
    object.finalizers().iter().any(|f| f == FINALIZER_TERMINATION)
}

async fn ensure_finalizer(claim: &NodeClaim, state: &State) -> Result<NodeClaim, Error> {
    if has_finalizer(claim) {
        return Ok(claim.clone());
    }
    let mut finalizers = claim.finalizers().to_vec();
    finalizers.push(FINALIZER_TERMINATION.to_string());
    let patch = json!({
        "metadata": { "finalizers": finalizers, "resourceVersion": claim.resource_version() }
    });
    state
        .claims
        .patch(&claim.name_any(), &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(Error::kube("adding the termination finalizer"))
}

/// Deletes `claim` (only that incarnation of it: the delete is conditional on its uid).
async fn delete_claim(claim: &NodeClaim, state: &State) -> Result<(), Error> {
    super::delete(&state.ctx.client, claim)
        .await
        .map(|_| ())
        .map_err(|source| Error::Kube { action: "deleting the nodeclaim".into(), source })
}

async fn expire(
    claim: &NodeClaim,
    state: &State,
    reason: &'static str,
    metric_reason: &'static str,
    message: String,
) -> Result<(), Error> {
    tracing::info!(
        controller = CONTROLLER,
        nodeclaim = %claim.name_any(),
        nodepool = %logic::nodepool(claim),
        reason,
        message = %message,
        "deleting nodeclaim, liveness check failed"
    );
    state.ctx.events.warning(claim, reason, message).await;
    delete_claim(claim, state).await?;
    count_disruption(claim, state, metric_reason);
    Ok(())
}

fn count_disruption(claim: &NodeClaim, state: &State, reason: &str) {
    crate::controllers::kit::count_disrupted(&state.ctx.metrics, claim, reason);
}

/// A lifecycle step a reconcile completed, reported once the claim's status is written.
enum Transition {
    Launched(Box<Instance>),
    Registered(Node),
    Initialized(Node),
}

/// Logs and counts `transition` of `claim`, with upstream's messages and metrics.
fn report(claim: &NodeClaim, transition: &Transition, state: &State) {
    let name = claim.name_any();
    let nodepool = logic::nodepool(claim);
    let by_nodepool = vec![("nodepool", nodepool.clone())];
    let metrics = &state.ctx.metrics;
    let provider_id =
        |node: &Node| node.spec.as_ref().and_then(|s| s.provider_id.clone()).unwrap_or_default();
    match transition {
        Transition::Launched(instance) => {
            tracing::info!(
                controller = CONTROLLER,
                nodeclaim = %name,
                nodepool = %nodepool,
                "provider-id" = %instance.provider_id,
                "instance-type" = %instance.instance_type,
                zone = %instance.zone,
                "capacity-type" = %instance.capacity_type,
                allocatable = %describe_resources(&instance.allocatable),
                "launched nodeclaim"
            );
            metrics.nodeclaims_launched.get_or_create(&by_nodepool).inc();
        }
        Transition::Registered(node) => {
            tracing::info!(
                controller = CONTROLLER,
                nodeclaim = %name,
                nodepool = %nodepool,
                "provider-id" = %provider_id(node),
                node = %node.name_any(),
                "registered nodeclaim"
            );
            metrics.nodeclaims_registered.get_or_create(&by_nodepool).inc();
            metrics.nodes_created.get_or_create(&by_nodepool).inc();
        }
        Transition::Initialized(node) => {
            let allocatable = node.status.as_ref().and_then(|s| s.allocatable.clone()).unwrap_or_default();
            tracing::info!(
                controller = CONTROLLER,
                nodeclaim = %name,
                nodepool = %nodepool,
                "provider-id" = %provider_id(node),
                node = %node.name_any(),
                allocatable = %describe_resources(&allocatable),
                "initialized nodeclaim"
            );
            metrics.nodeclaims_initialized.get_or_create(&by_nodepool).inc();
        }
    }
}

/// Outcome of the launch step.
enum Launch {
    Launched(Box<Instance>),
    Deleted,
    Retry(Duration),
    Failed(Error),
}

async fn launch(claim: &mut NodeClaim, state: &State, now: Timestamp) -> Launch {
    let name = claim.name_any();
    let generation = claim.metadata.generation;
    let uid = claim.metadata.uid.clone().unwrap_or_default();
    let remembered = state.launched().get(&uid).cloned();
    let result = match remembered {
        Some(instance) => {
            tracing::info!(
                controller = CONTROLLER,
                nodeclaim = %name,
                "provider-id" = %instance.provider_id,
                "using the instance of an earlier launch whose status was not written"
            );
            Ok(instance)
        }
        None => match check_node_class(claim, state).await {
            Ok(()) => state.ctx.cloud.create(claim).await,
            Err(error) => Err(error),
        },
    };
    match result {
        Ok(instance) => {
            if !uid.is_empty() {
                state.launched().insert(uid, instance.clone());
            }
            logic::apply_instance(claim, &instance);
            let update = ConditionUpdate::true_(reasons::LAUNCHED);
            set_condition(conditions_mut(claim), LAUNCHED, update, generation, now);
            Launch::Launched(Box::new(instance))
        }
        // Upstream treats a missing node class like insufficient capacity: the claim goes, and the
        // provisioner decides again.
        Err(
            error @ (CloudProviderError::InsufficientCapacity { .. }
            | CloudProviderError::NodeClassNotFound { .. }),
        ) => {
            let (reason, metric_reason) = match error {
                CloudProviderError::NodeClassNotFound { .. } => {
                    (event_reasons::NODE_CLASS_NOT_FOUND, "nodeclass_not_found")
                }
                _ => (event_reasons::INSUFFICIENT_CAPACITY_ERROR, "insufficient_capacity"),
            };
            let message = error.to_string();
            tracing::error!(
                controller = CONTROLLER,
                nodeclaim = %name,
                error = %message,
                "failed launching nodeclaim"
            );
            state.ctx.events.warning(&*claim, reason, message).await;
            match delete_claim(claim, state).await {
                Ok(()) => {
                    count_disruption(claim, state, metric_reason);
                    Launch::Deleted
                }
                Err(error) => Launch::Failed(error),
            }
        }
        Err(error @ CloudProviderError::NodeClassNotReady { .. }) => {
            let message = error.to_string();
            tracing::info!(controller = CONTROLLER, nodeclaim = %name, reason = %message, "waiting for the node class");
            let update = ConditionUpdate::false_(reasons::NODE_CLASS_NOT_READY, message.clone());
            set_condition(conditions_mut(claim), LAUNCHED, update, generation, now);
            state.ctx.events.warning(&*claim, event_reasons::NODE_CLASS_NOT_READY, message).await;
            Launch::Retry(NODE_CLASS_RETRY)
        }
        Err(error) => {
            let message = logic::launch_failure_message(&error_chain(&error));
            let update = ConditionUpdate::false_(reasons::LAUNCH_FAILED, message);
            set_condition(conditions_mut(claim), LAUNCHED, update, generation, now);
            Launch::Failed(Error::Cloud { method: "create", source: error })
        }
    }
}

/// Whether the claim's node class exists and is Ready, for either provider. A class the cache does
/// not have is looked up on the API server before the claim is given up on, so a class created a
/// moment ago is never taken for a missing one.
async fn check_node_class(claim: &NodeClaim, state: &State) -> Result<(), CloudProviderError> {
    let reference = &claim.spec.node_class_ref;
    let cached = state.cluster.nodeclass(&reference.name).filter(|_| nodeclass::is_served(reference));
    let class = match cached {
        Some(class) => Some(class),
        None if nodeclass::is_served(reference) => {
            let api: Api<EC2NodeClass> = Api::all(state.ctx.client.clone());
            api.get_opt(&reference.name)
                .await
                .map_err(|e| CloudProviderError::UnexpectedResponse {
                    operation: "GetEC2NodeClass",
                    message: error_chain(&e),
                })?
                .map(Arc::new)
        }
        None => None,
    };
    nodeclass::readiness(reference, class.as_deref()).map_err(|problem| match problem {
        NodeClassProblem::NotFound(reason) => {
            CloudProviderError::NodeClassNotFound { name: reference.name.clone(), reason }
        }
        NodeClassProblem::NotReady(reason) => {
            CloudProviderError::NodeClassNotReady { name: reference.name.clone(), reason }
        }
    })
}

fn conditions_mut(claim: &mut NodeClaim) -> &mut Vec<crate::apis::Condition> {
    &mut claim.status.get_or_insert_with(Default::default).conditions
}

fn describe_resources(resources: &crate::apis::ResourceList) -> String {
    resources.iter().map(|(k, v)| format!("{k}={}", v.0)).collect::<Vec<_>>().join(",")
}

/// Finds the claim's Node and, on first registration, syncs the claim onto it. Returns the Node.
async fn register(
    claim: &mut NodeClaim,
    state: &State,
    now: Timestamp,
) -> Result<Option<(Node, bool)>, Error> {
    let generation = claim.metadata.generation;
    let found = claims_nodes(claim, state);
    let registered = is_true(logic::conditions(claim), REGISTERED);
    let status = claim.status.get_or_insert_with(Default::default);
    let node = match found.as_slice() {
        [] => {
            if !registered {
                let update =
                    ConditionUpdate::unknown(reasons::NODE_NOT_FOUND, reasons::NODE_NOT_FOUND_MESSAGE);
                set_condition(&mut status.conditions, REGISTERED, update, generation, now);
            }
            if !is_true(&status.conditions, INITIALIZED) {
                let update =
                    ConditionUpdate::unknown(reasons::NODE_NOT_FOUND, reasons::NODE_NOT_FOUND_MESSAGE);
                set_condition(&mut status.conditions, INITIALIZED, update, generation, now);
            }
            return Ok(None);
        }
        [node] => node.clone(),
        many => {
            let names: Vec<String> = many.iter().map(|n| n.name_any()).collect();
            let update = ConditionUpdate::false_(
                reasons::MULTIPLE_NODES_FOUND,
                format!("invariant violated, matched multiple nodes [{}]", names.join(", ")),
            );
            set_condition(&mut status.conditions, REGISTERED, update, generation, now);
            return Ok(None);
        }
    };
    if registered {
        return Ok(Some(((*node).clone(), false)));
    }
    let mut desired = logic::registered_node(claim, &node);
    // A node that is initialized as soon as it registers (ready, no startup taint) gets both in
    // one write.
    if logic::initialization(claim, &desired).is_ok() {
        desired.labels_mut().insert(LABEL_INITIALIZED.to_string(), "true".to_string());
    }
    let node = if desired == *node { desired } else { patch_node(&node, &desired, state).await? };
    let status = claim.status.get_or_insert_with(Default::default);
    status.node_name = Some(node.name_any());
    set_condition(
        &mut status.conditions,
        REGISTERED,
        ConditionUpdate::true_(reasons::REGISTERED),
        generation,
        now,
    );
    Ok(Some((node, true)))
}

/// The cached Nodes with the claim's provider ID.
fn claims_nodes(claim: &NodeClaim, state: &State) -> Vec<Arc<Node>> {
    match claim.status.as_ref().and_then(|s| s.provider_id.as_deref()).filter(|p| !p.is_empty()) {
        Some(pid) => state.cluster.nodes_with_provider_id(pid),
        None => Vec::new(),
    }
}

/// Writes the metadata and taints `after` adds to `before`, conditional on `before`'s resource
/// version so that lists (finalizers, owners, taints) written whole replace nothing unseen.
async fn patch_node(before: &Node, after: &Node, state: &State) -> Result<Node, Error> {
    let mut metadata = serde_json::Map::new();
    metadata.insert("resourceVersion".into(), json!(before.resource_version()));
    let m = &after.metadata;
    for (key, value) in [
        ("labels", m.labels.as_ref().map(|v| json!(v))),
        ("annotations", m.annotations.as_ref().map(|v| json!(v))),
        ("finalizers", m.finalizers.as_ref().map(|v| json!(v))),
        ("ownerReferences", m.owner_references.as_ref().map(|v| json!(v))),
    ] {
        if let Some(value) = value {
            metadata.insert(key.into(), value);
        }
    }
    let mut patch = json!({ "metadata": metadata });
    if let Some(taints) = after.spec.as_ref().and_then(|s| s.taints.as_ref()) {
        patch["spec"] = json!({ "taints": taints });
    }
    let name = before.name_any();
    state
        .nodes
        .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(Error::kube(format!("syncing node {name}")))
}

/// Checks the claim's Node and marks both initialized once it is; true when that happened now.
async fn initialize(
    claim: &mut NodeClaim,
    node: &Node,
    state: &State,
    now: Timestamp,
) -> Result<bool, Error> {
    let generation = claim.metadata.generation;
    if is_true(logic::conditions(claim), INITIALIZED) {
        return Ok(false);
    }
    if let Err(update) = logic::initialization(claim, node) {
        let status = claim.status.get_or_insert_with(Default::default);
        set_condition(&mut status.conditions, INITIALIZED, update, generation, now);
        return Ok(false);
    }
    if node.labels().get(LABEL_INITIALIZED).map(String::as_str) != Some("true") {
        let patch = json!({ "metadata": { "labels": { LABEL_INITIALIZED: "true" } } });
        let name = node.name_any();
        state
            .nodes
            .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(Error::kube(format!("labelling node {name} initialized")))?;
    }
    let status = claim.status.get_or_insert_with(Default::default);
    set_condition(
        &mut status.conditions,
        INITIALIZED,
        ConditionUpdate::true_(reasons::INITIALIZED),
        generation,
        now,
    );
    Ok(true)
}

/// Writes what changed from `stored` to `claim`: labels and annotations first (so that a launch
/// is never recorded without its labels), then the status, conditional on the resource version.
async fn write(stored: &NodeClaim, claim: &NodeClaim, state: &State) -> Result<NodeClaim, Error> {
    let name = claim.name_any();
    let mut current = stored.clone();
    if claim.labels() != stored.labels() || claim.annotations() != stored.annotations() {
        let patch = json!({
            "metadata": { "labels": claim.labels(), "annotations": claim.annotations() }
        });
        current = state
            .claims
            .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(Error::kube("writing the nodeclaim's labels"))?;
    }
    if claim.status != stored.status {
        let patch = json!({
            "metadata": { "resourceVersion": current.resource_version() },
            "status": claim.status,
        });
        current = state
            .claims
            .patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(Error::kube("writing the nodeclaim's status"))?;
    }
    Ok(current)
}

async fn finalize(claim: &NodeClaim, state: &State, now: Timestamp) -> Result<Next, Error> {
    if !has_finalizer(claim) {
        return Ok(Next::Wait);
    }
    // Nothing new lands on a node whose claim is going: the taint comes first.
    for node in claims_nodes(claim, state).iter().filter(|n| n.metadata.deletion_timestamp.is_none()) {
        crate::controllers::node::taint_disrupted(&state.ctx.client, node)
            .await
            .map_err(Error::kube(format!("tainting node {}", node.name_any())))?;
    }
    let claim = &annotate_termination_deadline(claim, state).await?;
    let name = claim.name_any();
    let nodes = claims_nodes(claim, state);
    if !nodes.is_empty() {
        for node in nodes.iter().filter(|n| n.metadata.deletion_timestamp.is_none()) {
            let node_name = node.name_any();
            let params = DeleteParams {
                preconditions: Some(Preconditions { uid: node.uid(), resource_version: None }),
                ..DeleteParams::default()
            };
            match state.nodes.delete(&node_name, &params).await {
                Ok(_) => {
                    tracing::info!(controller = CONTROLLER, nodeclaim = %name, node = %node_name, "deleting node")
                }
                Err(error) if is_not_found(&error) => {}
                Err(source) => {
                    return Err(Error::Kube { action: format!("deleting node {node_name}"), source });
                }
            }
        }
        return Ok(Next::After(TERMINATION_POLL));
    }

    if !instances_terminated(claim, state).await? {
        let mut updated = claim.clone();
        let status = updated.status.get_or_insert_with(Default::default);
        let update = ConditionUpdate::true_(reasons::INSTANCE_TERMINATING);
        if set_condition(&mut status.conditions, INSTANCE_TERMINATING, update, claim.metadata.generation, now)
        {
            write(claim, &updated, state).await?;
        }
        return Ok(Next::After(TERMINATION_POLL));
    }
    let labels = logic::terminated_labels(claim);
    let nodepool = logic::nodepool(claim);
    if let Some(since) = logic::condition(logic::conditions(claim), INSTANCE_TERMINATING)
        .and_then(|c| c.last_transition_time.parse::<Timestamp>().ok())
    {
        let elapsed = logic::elapsed(since, now);
        observe(
            &state.ctx.metrics.nodeclaims_instance_termination_duration,
            vec![("nodepool", nodepool.clone())],
            elapsed,
        );
    }

    let finalizers: Vec<&String> =
        claim.finalizers().iter().filter(|f| *f != FINALIZER_TERMINATION).collect();
    let patch = json!({
        "metadata": { "finalizers": finalizers, "resourceVersion": claim.resource_version() }
    });
    match state.claims.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await {
        Ok(_) => {}
        Err(error) if is_not_found(&error) => return Ok(Next::Wait),
        Err(source) => {
            return Err(Error::Kube { action: "removing the termination finalizer".into(), source });
        }
    }
    tracing::info!(
        controller = CONTROLLER,
        nodeclaim = %name,
        nodepool = %nodepool,
        "provider-id" = %claim.status.as_ref().and_then(|s| s.provider_id.as_deref()).unwrap_or_default(),
        "deleted nodeclaim"
    );
    state.ctx.metrics.nodeclaims_terminated.get_or_create(&labels).inc();
    if let Some(deleted) = &claim.metadata.deletion_timestamp {
        let elapsed = logic::elapsed(deleted.0, now);
        observe(&state.ctx.metrics.nodeclaims_termination_duration, vec![("nodepool", nodepool)], elapsed);
    }
    Ok(Next::Wait)
}

/// Records by when the claim's node must be gone, for the node termination controller.
async fn annotate_termination_deadline(claim: &NodeClaim, state: &State) -> Result<NodeClaim, Error> {
    let Some(deadline) = logic::termination_deadline(claim) else {
        return Ok(claim.clone());
    };
    let patch = json!({
        "metadata": {
            "resourceVersion": claim.resource_version(),
            "annotations": { ANNOTATION_NODECLAIM_TERMINATION_TIMESTAMP: deadline },
        }
    });
    let name = claim.name_any();
    let updated = state
        .claims
        .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(Error::kube("annotating the termination deadline"))?;
    tracing::info!(
        controller = CONTROLLER,
        nodeclaim = %name,
        "karpenter.sh/nodeclaim-termination-timestamp" = %deadline,
        "annotated nodeclaim"
    );
    let message = format!("All pods will be deleted by {deadline}");
    state.ctx.events.warning(claim, event_reasons::TERMINATION_GRACE_PERIOD_EXPIRING, message).await;
    Ok(updated)
}

/// Asks the cloud provider to terminate the claim's instance; true once it reports the instance
/// gone. A claim without a provider ID may still have an instance (a launch whose answer was lost):
/// it is looked up by the claim's name.
async fn instances_terminated(claim: &NodeClaim, state: &State) -> Result<bool, Error> {
    let has_provider_id =
        claim.status.as_ref().and_then(|s| s.provider_id.as_deref()).is_some_and(|p| !p.is_empty());
    let targets = if has_provider_id {
        vec![claim.clone()]
    } else {
        let name = claim.name_any();
        let instances =
            state.ctx.cloud.list().await.map_err(|source| Error::Cloud { method: "list", source })?;
        instances
            .into_iter()
            .filter(|i| i.node_claim.as_deref() == Some(name.as_str()))
            .map(|i| {
                let mut target = claim.clone();
                target.status.get_or_insert_with(Default::default).provider_id = Some(i.provider_id);
                target
            })
            .collect()
    };
    let mut terminated = true;
    for target in &targets {
        match state.ctx.cloud.delete(target).await {
            Err(error) if error.is_not_found() => {}
            // An instance this provider cannot name (another provider's, or a provider ID that does
            // not parse) can never be terminated here: it counts as gone, so the claim can go.
            Err(CloudProviderError::InvalidProviderId(pid)) => {
                let message = format!(
                    "The {} cloud provider cannot act on provider ID {pid:?}: the instance is treated as gone",
                    state.ctx.cloud.name()
                );
                tracing::warn!(controller = CONTROLLER, nodeclaim = %claim.name_any(), "provider-id" = %pid, "{message}");
                state.ctx.events.warning(claim, event_reasons::INVALID_PROVIDER_ID, message).await;
            }
            Ok(()) => terminated = false,
            Err(source) => return Err(Error::Cloud { method: "delete", source }),
        }
    }
    Ok(terminated)
}

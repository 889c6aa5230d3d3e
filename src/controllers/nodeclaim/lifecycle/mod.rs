//! The NodeClaim lifecycle controller: takes every NodeClaim from launch through registration and
//! initialization to Ready, deletes claims that do not launch or register in time, and on
//! deletion removes the claim's Node and instance before letting the claim go.
//!
//! The steps of one reconcile, in order:
//! 1. the `karpenter.sh/termination` finalizer and the node class's label on every claim that is
//!    not being deleted (and the label on its Node once registered: `hydration`);
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
//! The decisions live in [`logic`] as pure functions. This module runs the controller and
//! dispatches each reconcile to the phases in order; each phase reads and writes in its own file:
//! `finalization` (the finalizer and deletion), `hydration`, `liveness`, `launch`, `registration` and
//! `initialization`.

mod finalization;
mod hydration;
mod initialization;
mod launch;
mod liveness;
pub mod logic;
mod registration;

#[cfg(test)]
mod cluster_tests;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;
use thiserror::Error;
use tokio::sync::watch;

use crate::apis::NodeClaim;
use crate::apis::common::is_true;
use crate::apis::nodeclaim::conditions::{INITIALIZED, LAUNCHED};
use crate::cloudprovider::{CloudProviderError, Instance};
use crate::controllers::Context;
use crate::controllers::kit::{Backoff, Next, Options, Queue, Reconcile, run_keyed};
use crate::state::{ClusterState, Notice};
use finalization::{ensure_finalizer, finalize};
use hydration::hydrate_claim;
use initialization::initialize;
use launch::{Launch, launch};
use liveness::expire;
use logic::Liveness;
use registration::register;

/// Name of the controller, in logs.
pub const CONTROLLER: &str = "nodeclaim.lifecycle";

/// How often a launched claim checks for its Node while it is not initialized.
const NODE_POLL: Duration = Duration::from_secs(30);
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
        matches!(self, Error::Kube { source, .. } if crate::util::api::is_conflict(source))
    }
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
    /// Versions of NodeClaims this controller wrote over, by NodeClaim UID (see
    /// [`State::is_written_over`]).
    written_over: Mutex<WrittenOver>,
}

/// Versions of NodeClaims a writer replaced, by NodeClaim UID. A reconcile of one of them (the
/// cache not showing the write yet; the watch brings the newer version, and another reconcile,
/// soon) would act again on what is done already (a launch found in [`State::launched`]) and fail
/// its conditional write: about one wasted request per new claim.
#[derive(Default)]
struct WrittenOver(HashMap<String, Vec<String>>);

impl WrittenOver {
    /// At most this many versions are kept per NodeClaim (a reconcile writes at most four).
    const KEPT: usize = 8;

    /// Remembers that a write replaced `version` of the claim of `uid`.
    fn add(&mut self, uid: &str, version: &str) {
        let versions = self.0.entry(uid.to_string()).or_default();
        if versions.len() >= Self::KEPT {
            versions.remove(0);
        }
        versions.push(version.to_string());
    }

    /// Whether `version` of the claim of `uid` was written over. A version that was not means the
    /// cache has caught up with the writes (it only moves forward): those remembered go.
    fn holds(&mut self, uid: &str, version: &str) -> bool {
        let Some(versions) = self.0.get(uid) else { return false };
        if versions.iter().any(|v| v == version) {
            return true;
        }
        self.0.remove(uid);
        false
    }
}

impl State {
    fn launched(&self) -> std::sync::MutexGuard<'_, HashMap<String, Instance>> {
        self.launched.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn written_over_guard(&self) -> std::sync::MutexGuard<'_, WrittenOver> {
        self.written_over.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Remembers that a write of this controller replaced version `base` of a claim.
    fn wrote_over(&self, base: &NodeClaim) {
        if let (Some(uid), Some(version)) = (&base.metadata.uid, &base.metadata.resource_version) {
            self.written_over_guard().add(uid, version);
        }
    }

    /// Whether `claim` is a version this controller has written over (see [`WrittenOver`]).
    fn is_written_over(&self, claim: &NodeClaim) -> bool {
        match (&claim.metadata.uid, &claim.metadata.resource_version) {
            (Some(uid), Some(version)) => self.written_over_guard().holds(uid, version),
            _ => false,
        }
    }

    /// Forgets what is remembered about the claim of `uid`.
    fn forget(&self, uid: &str) {
        self.launched().remove(uid);
        self.written_over_guard().0.remove(uid);
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
        if state.is_written_over(&claim) {
            return Ok(Next::Wait);
        }
        let result = reconcile_claim(&claim, state).await;
        if claim.metadata.deletion_timestamp.is_some() || claim.is_true(LAUNCHED) {
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
        written_over: Mutex::new(WrittenOver::default()),
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
                    state.forget(uid);
                }
            }
            Notice::Gone { name, .. } => {
                queue.forget(&name.to_string());
                // Only the name of a claim found missing is known: keep the launches of the
                // claims the cache still has.
                let live: std::collections::HashSet<String> =
                    cluster.nodeclaims.state().iter().filter_map(|c| c.metadata.uid.clone()).collect();
                state.launched().retain(|uid, _| live.contains(uid));
                state.written_over_guard().0.retain(|uid, _| live.contains(uid));
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
                if claim.spec.node_class_ref.name == name && !claim.is_true(LAUNCHED) && select(&claim) {
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
    let claim = hydrate_claim(claim, state).await?;

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
    if !claim.is_true(LAUNCHED) {
        match Box::pin(launch(&mut claim, state, now)).await {
            Launch::Launched(instance) => transitions.push(Transition::Launched(instance)),
            Launch::Deleted => return Ok(Next::Wait),
            Launch::Retry(after) => retry = Some(after),
            Launch::Failed(error) => failure = Some(error),
        }
    }
    // A failure to sync the Node must not lose the launch: the status is written regardless.
    if claim.is_true(LAUNCHED) {
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
    let conditions = claim.conditions();
    let waiting = (is_true(conditions, LAUNCHED) && !is_true(conditions, INITIALIZED)).then_some(NODE_POLL);
    Ok(match [retry, deadline, waiting].into_iter().flatten().min() {
        Some(after) => Next::After(after),
        None => Next::Wait,
    })
}

/// Deletes `claim` (only that incarnation of it: the delete is conditional on its uid).
async fn delete_claim(claim: &NodeClaim, state: &State) -> Result<(), Error> {
    super::delete(&state.ctx.client, claim)
        .await
        .map(|_| ())
        .map_err(|source| Error::Kube { action: "deleting the nodeclaim".into(), source })
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

fn describe_resources(resources: &crate::apis::ResourceList) -> String {
    resources.iter().map(|(k, v)| format!("{k}={}", v.0)).collect::<Vec<_>>().join(",")
}

/// The cached Nodes with the claim's provider ID.
fn claims_nodes(claim: &NodeClaim, state: &State) -> Vec<Arc<Node>> {
    match claim.status.as_ref().and_then(|s| s.provider_id.as_deref()).filter(|p| !p.is_empty()) {
        Some(pid) => state.cluster.nodes_with_provider_id(pid),
        None => Vec::new(),
    }
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
        let written = state
            .claims
            .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(Error::kube("writing the nodeclaim's labels"))?;
        state.wrote_over(&current);
        current = written;
    }
    if claim.status != stored.status {
        let patch = json!({
            "metadata": { "resourceVersion": current.resource_version() },
            "status": claim.status,
        });
        let written = state
            .claims
            .patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(Error::kube("writing the nodeclaim's status"))?;
        state.wrote_over(&current);
        current = written;
    }
    Ok(current)
}

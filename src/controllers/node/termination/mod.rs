//! Node termination: the controller that holds the `karpenter.sh/termination` finalizer of the
//! nodes Karpenter launched, and releases it only once the node has been drained and its
//! instance terminated.
//!
//! When such a node is being deleted, each reconcile moves it forward one step at a time:
//!
//! 1. find its NodeClaim (the one whose `status.providerID` is the node's `spec.providerID`);
//! 2. taint it `karpenter.sh/disrupted:NoSchedule` so that nothing new lands on it;
//! 3. drain it through the Eviction API, honouring PodDisruptionBudgets, in the order of
//!    [`drain::DrainGroup`]; pods that would outlive the NodeClaim's termination grace period are
//!    deleted with a grace period that ends at the deadline (see [`drain`]);
//! 4. wait for its VolumeAttachments to be gone (except those of pods that stay on the node);
//! 5. terminate its instance through the cloud provider, until the provider reports it gone;
//! 6. delete the NodeClaim if nobody has yet, and remove the finalizer.
//!
//! The pods of the node and its NodeClaim are read from the shared cluster-state caches when the
//! controller has them; a node the cache shows drained is checked against the API server before
//! the instance goes, and a NodeClaim the cache does not have yet is looked up there too.
//!
//! Once the termination deadline has passed, nothing is evicted any more: the pods left are
//! deleted with a grace period of one second (never 0, so that no pod object disappears while its
//! containers still run), the instance goes once that second is over, and step 4 is skipped.
//! A node without NodeClaim is
//! still drained before its finalizer goes. Errors are logged with the node's name and retried
//! with backoff; they never stop the controller.

pub mod drain;
mod instance;
#[cfg(test)]
pub(crate) mod tests;
mod volumes;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::apis::pod::Pod;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, EvictParams, ListParams, Patch, PatchParams, Preconditions};
use kube::{Api, ResourceExt};
use serde_json::json;
use thiserror::Error;
use tokio::sync::watch;

use crate::apis::common::condition;
use crate::apis::labels::{ANNOTATION_DO_NOT_DISRUPT, FINALIZER_TERMINATION, LABEL_NODEPOOL};
use crate::apis::nodeclaim::conditions::DISRUPTION_REASON;
use crate::apis::{ConditionStatus, NodeClaim};
use crate::cloudprovider::CloudProviderError;
use crate::controllers::Context;
use crate::controllers::events::{EventType, reasons};
use crate::controllers::kit::{Backoff, Next, Options, Queue, Reconcile, run_keyed};
use crate::state::{ClusterState, Notice};
use crate::util::api::{is_not_found, is_stale};
use crate::util::error_chain;

/// Name of the controller, in logs and metrics.
pub const CONTROLLER: &str = "node.termination";
/// Nodes terminated at once.
const WORKERS: usize = 10;
/// First delay before looking at a node again while its drain or volume detachment is pending.
const WAIT_BASE: Duration = Duration::from_secs(1);
/// Longest delay between two looks at a node whose drain is pending.
const WAIT_CAP: Duration = Duration::from_secs(10);
/// Longest delay before retrying a node whose reconcile failed.
const ERROR_CAP: Duration = Duration::from_secs(300);
/// How long one eviction request may take. The client retries `429 Too Many Requests` by itself,
/// with a backoff that can run for minutes, and a disruption budget answers every eviction it
/// refuses with a 429: past this time the pod counts as blocked and the node is looked at again
/// later, like after any refused eviction.
const EVICTION_WAIT: Duration = Duration::from_secs(5);
/// Evictions or deletions of one node's pods under way at once (the API client queues what goes
/// beyond its own limit, but every pending request holds memory until it is sent).
const DRAIN_CONCURRENCY: usize = 32;
/// How soon a node past its termination deadline is looked at again (its pods were deleted with
/// a second of grace).
const EXPIRED_POLL: Duration = Duration::from_secs(1);
/// The `reason` of `karpenter_pods_drained_total` when the NodeClaim gives none (upstream's).
pub const FORCEFUL_TERMINATION: &str = "Forceful Termination";

/// Errors of one reconcile of a node.
#[derive(Debug, Error)]
pub enum Error {
    /// A Kubernetes API call failed.
    #[error("failed to {action}")]
    Kube {
        /// What was being done.
        action: String,
        /// The API error.
        #[source]
        source: kube::Error,
    },
    /// The cloud provider could not terminate the instance.
    #[error("failed to terminate the instance of nodeclaim {node_claim}")]
    Cloud {
        /// Name of the NodeClaim.
        node_claim: String,
        /// The provider's error.
        #[source]
        source: CloudProviderError,
    },
}

fn kube_error(action: impl Into<String>) -> impl FnOnce(kube::Error) -> Error {
    let action = action.into();
    move |source| Error::Kube { action, source }
}

/// What the controller remembers about a node between reconciles. Losing it (a restart) only
/// costs a metric sample or a shorter backoff.
#[derive(Debug, Default)]
struct Progress {
    /// Consecutive reconciles that ended waiting or failing.
    attempts: u32,
    /// The drain has been counted in `nodes_drained`.
    drained: bool,
    /// When the controller first asked the cloud provider to terminate the instance.
    instance_termination_started: Option<Instant>,
}

/// The controller's state: the shared context, the cluster state it reads and the per-node
/// progress.
struct Terminator {
    ctx: Context,
    cluster: ClusterState,
    progress: Mutex<HashMap<String, Progress>>,
}

impl Terminator {
    fn with_progress<T>(&self, node: &str, f: impl FnOnce(&mut Progress) -> T) -> T {
        let mut progress = self.progress.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        f(progress.entry(node.to_string()).or_default())
    }

    fn forget(&self, node: &str) {
        self.progress.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).remove(node);
    }

    /// The delay before the next look at a node that is waiting, with one more attempt counted.
    fn wait(&self, node: &str, cap: Duration) -> Duration {
        self.with_progress(node, |p| {
            p.attempts = p.attempts.saturating_add(1);
            Backoff::new(WAIT_BASE, cap).delay(p.attempts)
        })
    }
}

impl Reconcile for Terminator {
    type Key = String;
    type Error = Error;

    async fn reconcile(&self, name: &String) -> Result<Next, Error> {
        match self.cluster.node(name) {
            Some(node) => reconcile(node, self).await,
            None => {
                self.forget(name);
                Ok(Next::Wait)
            }
        }
    }
}

fn is_terminating(node: &Node) -> bool {
    node.metadata.deletion_timestamp.is_some() && has_finalizer(node)
}

/// Runs the node termination controller until `stop` turns `true` (or its sender goes away).
pub async fn run(ctx: Context, cluster: ClusterState, stop: watch::Receiver<bool>) {
    run_selected(ctx, cluster, Arc::new(Queue::new()), stop, |_| true).await;
}

/// [`run`] for the Nodes `select` accepts (tests keep to their own), taking work from `queue`.
pub(crate) async fn run_selected(
    ctx: Context,
    cluster: ClusterState,
    queue: Arc<Queue<String>>,
    stop: watch::Receiver<bool>,
    select: impl Fn(&Node) -> bool + Send + Sync + 'static,
) {
    let terminator =
        Arc::new(Terminator { ctx, cluster: cluster.clone(), progress: Mutex::new(HashMap::new()) });
    let select = Arc::new(select);
    let _nodes = {
        let (queue, terminator, select) = (queue.clone(), terminator.clone(), select.clone());
        cluster.on_node(move |notice| match notice {
            Notice::Applied(node) if is_terminating(node) && select(node) => queue.add(node.name_any()),
            Notice::Applied(_) => {}
            gone => {
                let name = gone.name();
                queue.forget(&name);
                terminator.forget(&name);
            }
        })
    };
    // A pod leaving a draining node lets the drain go on at once.
    let _pods = {
        let (queue, cluster, select) = (queue.clone(), cluster.clone(), select.clone());
        cluster.clone().on_pod(move |notice| {
            let (Notice::Applied(pod) | Notice::Deleted(pod)) = notice else { return };
            let Some(node) = crate::state::pods::node_name(pod) else { return };
            if let Some(node) = cluster.node(node)
                && is_terminating(&node)
                && select(&node)
            {
                queue.add(node.name_any());
            }
        })
    };
    for node in cluster.nodes.state() {
        if is_terminating(&node) && select(&node) {
            queue.add(node.name_any());
        }
    }
    let metrics = Some(terminator.ctx.metrics.clone());
    let options = Options::new(CONTROLLER).workers(WORKERS).backoff(Backoff::new(WAIT_BASE, ERROR_CAP));
    run_keyed(terminator, queue, options, metrics, stop).await;
}

fn has_finalizer(node: &Node) -> bool {
    node.finalizers().iter().any(|f| f == FINALIZER_TERMINATION)
}

/// How a step of a node's termination ends.
enum Step<T = ()> {
    /// The step is done: go on with the next one, with what this one found.
    Continue(T),
    /// The reconcile ends here: the node is looked at again later, or its termination is over.
    Stop(Next),
}

/// The node being terminated, and what every step of its reconcile reports it with.
struct Termination {
    /// The node (tainted once [`taint`] has run: later patches are guarded by its resource
    /// version).
    node: Arc<Node>,
    /// Name of the node.
    name: String,
    /// Its NodeClaim, if it has one.
    node_claim: Option<NodeClaim>,
    /// Name of the NodeClaim, empty without one.
    claim_name: String,
    /// The NodePool label value for metrics (see [`node_pool`]).
    nodepool: String,
    /// The `reason` of `karpenter_pods_drained_total` (see [`drained_reason`]).
    reason: String,
    /// When the node was deleted.
    deleted_at: Timestamp,
}

/// What the drain step leaves to the steps after it.
struct Drained {
    /// The pods bound to the node when it was found drained.
    pods: Vec<Arc<Pod>>,
    /// When the drain was planned.
    now: Timestamp,
    /// Whether the termination deadline had passed.
    expired: bool,
}

/// One look at a node being deleted: its termination goes as far as it can, one step after the
/// other, as upstream's: taint and drain, wait for the volumes to be detached, terminate the
/// instance, remove the finalizer.
async fn reconcile(node: Arc<Node>, t: &Terminator) -> Result<Next, Error> {
    let Some(mut term) = begin(node, t).await? else { return Ok(Next::Wait) };
    taint(&t.ctx, &mut term).await?;
    let drained = match drain_node(t, &term).await? {
        Step::Continue(drained) => drained,
        Step::Stop(next) => return Ok(next),
    };
    if let Step::Stop(next) = volumes::wait_for_detachment(t, &term, &drained) {
        return Ok(next);
    }
    if let Step::Stop(next) = instance::terminate(t, &term).await? {
        return Ok(next);
    }
    instance::release(t, &term, drained.now).await
}

/// The termination of `node` when it is being deleted and holds our finalizer, with its NodeClaim
/// found; `None` when there is nothing to do.
async fn begin(node: Arc<Node>, t: &Terminator) -> Result<Option<Termination>, Error> {
    let name = node.name_any();
    if !has_finalizer(&node) {
        t.forget(&name);
        return Ok(None);
    }
    let Some(deleted_at) = node.metadata.deletion_timestamp.as_ref().map(|time| time.0) else {
        return Ok(None);
    };
    let node_claim = find_node_claim(&t.ctx, &t.cluster, &node).await?;
    let claim_name = node_claim.as_ref().map(|c| c.name_any()).unwrap_or_default();
    let nodepool = node_pool(&node, node_claim.as_ref());
    let reason = drained_reason(node_claim.as_ref());
    Ok(Some(Termination { node, name, node_claim, claim_name, nodepool, reason, deleted_at }))
}

/// Taints the node `karpenter.sh/disrupted:NoSchedule`, so that nothing new lands on it.
async fn taint(ctx: &Context, term: &mut Termination) -> Result<(), Error> {
    // Later patches are guarded by the resource version: go on with the tainted node.
    let tainted = super::taint_disrupted(&ctx.client, &term.node)
        .await
        .map_err(kube_error(format!("taint node {}", term.name)))?;
    if let Some(tainted) = tainted {
        term.node = Arc::new(tainted);
    }
    Ok(())
}

/// Drains the node: deletes and evicts its pods as [`drain::plan`] says, and stops the reconcile
/// until they are gone; once they are, goes on with the pods left on the node.
async fn drain_node(t: &Terminator, term: &Termination) -> Result<Step<Drained>, Error> {
    let deadline = announce_deadline(&t.ctx, term).await;
    let now = Timestamp::now();
    let pods = pods_to_drain(t, &term.name, now, deadline).await?;
    let plan = drain::plan(&pods, now, deadline);
    if !plan.is_drained() {
        return Ok(Step::Stop(drain_more(t, term, &plan, deadline).await));
    }
    let expired = plan.expired;
    count_drained(t, term, &plan);
    Ok(Step::Continue(Drained { pods, now, expired }))
}

/// The node's termination deadline (see [`drain::termination_deadline`]), ignored with a warning
/// when unreadable. When there is one, the node says by when its pods will be gone.
async fn announce_deadline(ctx: &Context, term: &Termination) -> Option<Timestamp> {
    let (name, claim_name) = (&term.name, &term.claim_name);
    let deadline = match drain::termination_deadline(Some(term.deleted_at), term.node_claim.as_ref()) {
        Ok(deadline) => deadline,
        Err(error) => {
            tracing::warn!(node = %name, nodeclaim = %claim_name, error = %error, "ignoring termination deadline");
            None
        }
    };
    if let Some(deadline) = deadline {
        // As upstream, the node says by when its pods go too (the NodeClaim said it when deleted).
        let message = format!("All pods will be deleted by {deadline}");
        let window = k8s_openapi::jiff::SignedDuration::from_mins(2);
        ctx.events
            .deduped(
                &*term.node,
                EventType::Warning,
                reasons::TERMINATION_GRACE_PERIOD_EXPIRING,
                "",
                window,
                message,
            )
            .await;
    }
    deadline
}

/// The pods on the node, from the cache; as the cache may lag behind, a node it shows drained is
/// confirmed with the API server.
async fn pods_to_drain(
    t: &Terminator,
    node: &str,
    now: Timestamp,
    deadline: Option<Timestamp>,
) -> Result<Vec<Arc<Pod>>, Error> {
    let cached = t.cluster.pods_on(node);
    if drain::plan(&cached, now, deadline).is_drained() { node_pods(&t.ctx, node).await } else { Ok(cached) }
}

/// Deletes and evicts what `plan` says, reports it, and tells when to look at the node again.
async fn drain_more(
    t: &Terminator,
    term: &Termination,
    plan: &drain::DrainPlan<'_>,
    deadline: Option<Timestamp>,
) -> Next {
    let (ctx, name, claim_name) = (&t.ctx, &term.name, &term.claim_name);
    let outcome = execute(ctx, &term.node, plan, deadline, &term.reason).await;
    let waiting = plan.remaining.len();
    if outcome.evicted + outcome.deleted > 0 {
        tracing::info!(
            node = %name,
            nodeclaim = %claim_name,
            pods = waiting,
            evicted = outcome.evicted,
            deleted = outcome.deleted,
            "draining node"
        );
    } else {
        tracing::debug!(
            node = %name,
            nodeclaim = %claim_name,
            pods = waiting,
            blocked = outcome.blocked,
            "waiting for pods to leave the node"
        );
    }
    ctx.events.warning(&*term.node, reasons::FAILED_DRAINING, failed_draining_message(plan, deadline)).await;
    if outcome.evicted + outcome.deleted > 0 {
        t.with_progress(name, |p| p.attempts = 0);
    }
    if plan.expired {
        // Past the deadline the pods were deleted with a second of grace: look again then.
        return Next::After(EXPIRED_POLL);
    }
    Next::After(t.wait(name, WAIT_CAP))
}

/// Logs the drain of the node and counts it in `nodes_drained`, the first time it is found
/// drained.
fn count_drained(t: &Terminator, term: &Termination, plan: &drain::DrainPlan<'_>) {
    let (name, claim_name) = (&term.name, &term.claim_name);
    let first_drain = t.with_progress(name, |p| !std::mem::replace(&mut p.drained, true));
    if !first_drain {
        return;
    }
    if plan.expired && !plan.remaining.is_empty() {
        tracing::info!(node = %name, nodeclaim = %claim_name, pods = plan.remaining.len(),
            "termination grace period expired, leaving the remaining pods");
    } else {
        tracing::info!(node = %name, nodeclaim = %claim_name, pods = 0, "drained node");
    }
    t.ctx.metrics.nodes_drained.get_or_create(&vec![("nodepool", term.nodepool.clone())]).inc();
    t.with_progress(name, |p| p.attempts = 0);
}

/// The NodeClaim whose `status.providerID` is the node's `spec.providerID`: the cached one, else
/// the API server's (a NodeClaim missed here would leave its instance running).
async fn find_node_claim(
    ctx: &Context,
    cluster: &ClusterState,
    node: &Node,
) -> Result<Option<NodeClaim>, Error> {
    let Some(provider_id) =
        node.spec.as_ref().and_then(|s| s.provider_id.as_deref()).filter(|p| !p.is_empty())
    else {
        return Ok(None);
    };
    if let Some(claim) = cluster.nodeclaim_with_provider_id(provider_id) {
        return Ok(Some((*claim).clone()));
    }
    let claims: Api<NodeClaim> = Api::all(ctx.client.clone());
    let list = claims.list(&ListParams::default()).await.map_err(kube_error("list nodeclaims"))?;
    Ok(list
        .items
        .into_iter()
        .find(|c| c.status.as_ref().and_then(|s| s.provider_id.as_deref()) == Some(provider_id)))
}

/// The NodePool label value for metrics: the node's, else its NodeClaim's.
fn node_pool(node: &Node, node_claim: Option<&NodeClaim>) -> String {
    node.labels()
        .get(LABEL_NODEPOOL)
        .or_else(|| node_claim.and_then(|c| c.labels().get(LABEL_NODEPOOL)))
        .cloned()
        .unwrap_or_default()
}

/// The `reason` label of `karpenter_pods_drained_total` for the pods evicted from the node of
/// `claim`, as upstream: the reason of the NodeClaim's `DisruptionReason` condition when it is
/// True (`Underutilized`, `Empty`, `Drifted`, ...), else [`FORCEFUL_TERMINATION`]; empty for a
/// node without NodeClaim.
pub fn drained_reason(claim: Option<&NodeClaim>) -> String {
    let Some(claim) = claim else { return String::new() };
    let conditions = claim.status.as_ref().map(|s| s.conditions.as_slice()).unwrap_or_default();
    condition(conditions, DISRUPTION_REASON)
        .filter(|c| c.status == ConditionStatus::True)
        .map(|c| c.reason.clone())
        .unwrap_or_else(|| FORCEFUL_TERMINATION.to_string())
}

/// How long `node` lived, from its creation to `now` (zero if the clocks disagree), for
/// `karpenter_nodes_lifetime_duration_seconds`; `None` without creation timestamp.
pub fn lifetime(node: &Node, now: Timestamp) -> Option<Duration> {
    let created = node.metadata.creation_timestamp.as_ref()?.0;
    Some(Duration::try_from(now.duration_since(created)).unwrap_or_default())
}

/// Finalizers without ours, or `None` when ours is not among them.
fn without_finalizer(finalizers: &[String]) -> Option<Vec<String>> {
    finalizers
        .iter()
        .any(|f| f == FINALIZER_TERMINATION)
        .then(|| finalizers.iter().filter(|f| *f != FINALIZER_TERMINATION).cloned().collect())
}

/// The `FailedDraining` event of a node whose drain goes on: how many pods are waiting, as
/// upstream says it, and, when pods protected by `karpenter.sh/do-not-disrupt` keep the node, why.
pub fn failed_draining_message(plan: &drain::DrainPlan<'_>, deadline: Option<Timestamp>) -> String {
    let mut message =
        format!("Failed to drain node, {} pods are waiting to be evicted", plan.remaining.len());
    if !plan.protected.is_empty() {
        let names: Vec<String> = plan.protected.iter().take(5).map(|p| crate::state::pods::key(p)).collect();
        let more = plan.protected.len().saturating_sub(names.len());
        let who =
            if more > 0 { format!("{} and {more} other(s)", names.join(", ")) } else { names.join(", ") };
        match deadline {
            Some(d) => message.push_str(&format!(
                "; {who} have the {ANNOTATION_DO_NOT_DISRUPT} annotation and will be deleted by the termination grace period ending {d}"
            )),
            None => message.push_str(&format!(
                "; {who} have the {ANNOTATION_DO_NOT_DISRUPT} annotation and the NodeClaim sets no terminationGracePeriod: the node waits for them to leave"
            )),
        }
    }
    message
}

/// Removes our finalizer, guarded by the resource version the finalizers were read at.
async fn remove_finalizer(ctx: &Context, node: &Node) -> Result<(), Error> {
    let Some(finalizers) = without_finalizer(node.finalizers()) else { return Ok(()) };
    let nodes: Api<Node> = Api::all(ctx.client.clone());
    let patch = json!({
        "metadata": { "resourceVersion": node.resource_version(), "finalizers": finalizers },
    });
    match nodes.patch(&node.name_any(), &PatchParams::default(), &Patch::Merge(&patch)).await {
        Ok(_) => Ok(()),
        Err(e) if is_not_found(&e) => Ok(()),
        Err(source) => {
            Err(Error::Kube { action: format!("remove finalizer of node {}", node.name_any()), source })
        }
    }
}

/// The pods bound to `node`.
async fn node_pods(ctx: &Context, node: &str) -> Result<Vec<Arc<Pod>>, Error> {
    let pods: Api<Pod> = Api::all(ctx.client.clone());
    let params = ListParams::default().fields(&format!("spec.nodeName={node}"));
    let list = pods.list(&params).await.map_err(kube_error(format!("list pods of node {node}")))?;
    Ok(list.items.into_iter().map(Arc::new).collect())
}

fn uid_precondition(uid: Option<String>) -> Option<Preconditions> {
    uid.map(|uid| Preconditions { uid: Some(uid), resource_version: None })
}

/// What one drain step did.
#[derive(Debug, Default)]
struct Outcome {
    evicted: usize,
    blocked: usize,
    deleted: usize,
}

/// Deletes the expiring pods and evicts the current group of `plan`; the evicted pods count in
/// `karpenter_pods_drained_total` with `reason` (see [`drained_reason`]).
async fn execute(
    ctx: &Context,
    node: &Node,
    plan: &drain::DrainPlan<'_>,
    deadline: Option<Timestamp>,
    reason: &str,
) -> Outcome {
    let node_name = node.name_any();
    // Collected first: a stream over a borrowing closure is not `Send` to the compiler.
    let deletions: Vec<_> =
        plan.delete.iter().map(|(pod, grace)| delete_pod(ctx, &node_name, pod, *grace, deadline)).collect();
    let deleted: Vec<bool> =
        futures::stream::iter(deletions).buffer_unordered(DRAIN_CONCURRENCY).collect().await;
    let evictions: Vec<_> = plan.evict.iter().map(|pod| evict(ctx, &node_name, pod, reason)).collect();
    let evicted: Vec<Eviction> =
        futures::stream::iter(evictions).buffer_unordered(DRAIN_CONCURRENCY).collect().await;
    let mut outcome = Outcome { deleted: deleted.into_iter().filter(|ok| *ok).count(), ..Outcome::default() };
    for result in evicted {
        match result {
            Eviction::Evicted => outcome.evicted += 1,
            Eviction::Gone => {}
            Eviction::Blocked => outcome.blocked += 1,
        }
    }
    outcome
}

enum Eviction {
    Evicted,
    Gone,
    Blocked,
}

/// Evicts `pod`, counting the request in `karpenter_pods_eviction_requests_total` by the API
/// server's answer (`200`, or the error's status code; a request that got no answer in time, or
/// failed without a status, is not counted, as upstream) and, once evicted, the pod in
/// `karpenter_pods_drained_total{reason}`.
async fn evict(ctx: &Context, node: &str, pod: &Pod, reason: &str) -> Eviction {
    let (namespace, name) = (pod.namespace().unwrap_or_default(), pod.name_any());
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(ctx.client.clone(), &namespace);
    let params = EvictParams {
        delete_options: Some(DeleteParams {
            preconditions: uid_precondition(pod.uid()),
            ..Default::default()
        }),
        ..Default::default()
    };
    let Ok(result) = tokio::time::timeout(EVICTION_WAIT, pods.evict(&name, &params)).await else {
        tracing::debug!(node, pod = %format!("{namespace}/{name}"), "eviction still refused, retrying later");
        surge_if_opted_in(ctx, node, pod).await;
        return Eviction::Blocked;
    };
    let code = match &result {
        Ok(_) => Some("200".to_string()),
        Err(kube::Error::Api(status)) => Some(status.code.to_string()),
        Err(_) => None,
    };
    if let Some(code) = code {
        ctx.metrics.pods_eviction_requests.get_or_create(&vec![("code", code)]).inc();
    }
    match result {
        Ok(_) => {
            ctx.metrics.pods_drained.get_or_create(&vec![("reason", reason.to_string())]).inc();
            tracing::info!(node, pod = %format!("{namespace}/{name}"), "evicted pod");
            ctx.events.normal(pod, reasons::EVICTED, format!("Evicted pod to drain node {node}")).await;
            Eviction::Evicted
        }
        // Gone already, or replaced by a pod of the same name.
        Err(e) if is_stale(&e) => Eviction::Gone,
        Err(kube::Error::Api(status)) if status.code == 429 => {
            tracing::debug!(
                node,
                pod = %format!("{namespace}/{name}"),
                message = %status.message,
                "eviction blocked by a disruption budget"
            );
            surge_if_opted_in(ctx, node, pod).await;
            Eviction::Blocked
        }
        Err(error) => {
            tracing::warn!(
                node,
                pod = %format!("{namespace}/{name}"),
                error = %error_chain(&error),
                "failed to evict pod"
            );
            Eviction::Blocked
        }
    }
}

/// Surges the workload of `pod`, whose eviction its budget refuses, when it opted in
/// (see [`crate::disruption::surge`]).
async fn surge_if_opted_in(ctx: &Context, node: &str, pod: &Pod) {
    if crate::disruption::surge::surgeable(pod) {
        crate::controllers::surge::begin(ctx, node, pod).await;
    }
}

/// Deletes a pod that would outlive the node's termination deadline. Returns whether it was
/// deleted.
async fn delete_pod(ctx: &Context, node: &str, pod: &Pod, grace: i64, deadline: Option<Timestamp>) -> bool {
    let (namespace, name) = (pod.namespace().unwrap_or_default(), pod.name_any());
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &namespace);
    let params = DeleteParams {
        grace_period_seconds: Some(
            u32::try_from(grace.max(drain::MIN_DELETE_GRACE_SECONDS)).unwrap_or(u32::MAX),
        ),
        preconditions: uid_precondition(pod.uid()),
        ..Default::default()
    };
    let deadline = deadline.map(|d| d.to_string()).unwrap_or_default();
    match pods.delete(&name, &params).await {
        Ok(_) => {
            tracing::info!(
                node,
                pod = %format!("{namespace}/{name}"),
                grace_period_seconds = grace,
                deadline = %deadline,
                "deleting pod before the node's termination grace period expires"
            );
            let own = pod.spec.as_ref().and_then(|s| s.termination_grace_period_seconds).unwrap_or(30);
            let message = format!(
                "Deleting the pod to accommodate the terminationTime {deadline} of the node. The pod was granted {grace} seconds of grace-period of its {own} terminationGracePeriodSeconds. This bypasses the PDB of the pod and the do-not-disrupt annotation."
            );
            ctx.events.normal(pod, reasons::DISRUPTED, message).await;
            true
        }
        Err(e) if is_stale(&e) => false,
        Err(error) => {
            tracing::warn!(
                node,
                pod = %format!("{namespace}/{name}"),
                error = %error_chain(&error),
                "failed to delete pod"
            );
            false
        }
    }
}

//! The EC2NodeClass controller: keeps each class's `status` (subnets, security groups, AMIs,
//! instance profile, conditions) resolved against AWS, hands the class to the provider's
//! [`NodeClassStore`](crate::cloudprovider::aws::NodeClassStore), and cleans up on deletion.
//!
//! * A class that is not being deleted gets the `karpenter.k8s.aws/termination` finalizer, is
//!   resolved and validated (see [`validation`]) with [`AwsCloudProvider::resolve_node_class`],
//!   and its status is written through
//!   the status subresource only when it changed (so the controller's own write does not start a
//!   loop). It is resolved again every [`crate::cloudprovider::aws::provider::NODE_CLASS_REFRESH`] (the shorter of `AMI_REFRESH_INTERVAL` and
//!   `SUBNET_REFRESH_INTERVAL`),
//!   so an AMI published under an alias's SSM parameter is picked up by then. A failed resolution keeps the last status,
//!   publishes a Warning event and is retried with backoff.
//! * A class being deleted waits while NodeClaims still reference it (requeued every
//!   [`WAIT_ON_NODECLAIMS`], with a `WaitingOnNodeClaimTermination` event), then its launch
//!   templates and the instance profile Karpenter created for it are deleted, it leaves the
//!   provider's store, and the finalizer is removed.
//!
//! Each resolution also re-stamps the class hash of the class's NodeClaims whose hash is of
//! another scheme (see [`restamp`]).
//!
//! NodeClaims are watched too: a NodeClaim change wakes the class it references while that class
//! is being deleted.

#[cfg(test)]
mod tests;

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};
use tokio::sync::watch;

use crate::apis::ec2nodeclass::NODE_CLASS_HASH_VERSION;
use crate::apis::labels::{
    ANNOTATION_EC2NODECLASS_HASH, ANNOTATION_EC2NODECLASS_HASH_VERSION, FINALIZER_EC2NODECLASS_TERMINATION,
};
use crate::apis::nodeclaim::conditions::DRIFTED;
use crate::apis::{EC2NodeClass, EC2NodeClassStatus, NodeClaim, NodePool};
use crate::cloudprovider::CloudProviderError;
use crate::cloudprovider::aws::provider::Resolved;
use crate::cloudprovider::aws::{AwsCloudProvider, validation};
use crate::controllers::Events;
use crate::controllers::kit::{Backoff, Next, Options, Queue, Reconcile, run_keyed};
use crate::state::{ClusterState, Notice};
use crate::util::error_chain;

/// How often a class being deleted checks whether its NodeClaims are gone.
pub const WAIT_ON_NODECLAIMS: Duration = Duration::from_secs(10);
/// First retry delay after a failed reconciliation; it doubles with each further failure.
pub const BACKOFF_BASE: Duration = Duration::from_secs(1);
/// Longest retry delay after failed reconciliations.
pub const BACKOFF_MAX: Duration = Duration::from_secs(300);
/// API group of `EC2NodeClass`, as NodeClaims reference it.
pub const NODE_CLASS_GROUP: &str = "karpenter.k8s.aws";
/// Field manager of the controller's writes.
const FIELD_MANAGER: &str = "karpenter";

/// Event reasons of this controller.
pub mod reasons {
    /// A class being deleted waits for the NodeClaims that use it.
    pub const WAITING_ON_NODECLAIM_TERMINATION: &str = "WaitingOnNodeClaimTermination";
    /// Resolving a class against AWS failed.
    pub const FAILED_RESOLVING_NODE_CLASS: &str = "FailedResolvingNodeClass";
    /// Cleaning up after a deleted class failed.
    pub const FAILED_DELETING_NODE_CLASS: &str = "FailedDeletingNodeClass";
}

/// Why a reconciliation failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Resolving the class's selectors against AWS failed.
    #[error("failed to resolve ec2nodeclass {name}")]
    Resolve {
        /// The class.
        name: String,
        /// The provider's error.
        #[source]
        source: CloudProviderError,
    },
    /// Validating the class against EC2 failed in a way that says nothing about the class.
    #[error("failed to validate ec2nodeclass {name}")]
    Validate {
        /// The class.
        name: String,
        /// The provider's error.
        #[source]
        source: CloudProviderError,
    },
    /// Deleting what Karpenter created for the class failed.
    #[error("failed to delete the {what} of ec2nodeclass {name}")]
    Cleanup {
        /// The class.
        name: String,
        /// What was being deleted.
        what: &'static str,
        /// The provider's error.
        #[source]
        source: CloudProviderError,
    },
    /// A request to the API server failed.
    #[error("failed to {action} for ec2nodeclass {name}")]
    Kube {
        /// The class.
        name: String,
        /// What was attempted.
        action: &'static str,
        /// The client's error.
        #[source]
        source: kube::Error,
    },
}

/// What a reconciliation of a class does first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// The class is live but lacks the finalizer: add it.
    AddFinalizer,
    /// The class is live and has the finalizer: resolve it.
    Resolve,
    /// The class is being deleted and still has the finalizer: clean up.
    Finalize,
    /// The class is being deleted and the finalizer is already gone: nothing to do.
    Done,
}

/// Decides what to do with `class`.
pub fn step(class: &EC2NodeClass) -> Step {
    let has_finalizer = class.finalizers().iter().any(|f| f == FINALIZER_EC2NODECLASS_TERMINATION);
    match (class.metadata.deletion_timestamp.is_some(), has_finalizer) {
        (false, false) => Step::AddFinalizer,
        (false, true) => Step::Resolve,
        (true, true) => Step::Finalize,
        (true, false) => Step::Done,
    }
}

/// `finalizers` without ours, or `None` when ours is not among them.
pub fn without_finalizer(finalizers: &[String]) -> Option<Vec<String>> {
    if !finalizers.iter().any(|f| f == FINALIZER_EC2NODECLASS_TERMINATION) {
        return None;
    }
    Some(finalizers.iter().filter(|f| *f != FINALIZER_EC2NODECLASS_TERMINATION).cloned().collect())
}

/// `finalizers` with ours added, or `None` when it is already there.
pub fn with_finalizer(finalizers: &[String]) -> Option<Vec<String>> {
    if finalizers.iter().any(|f| f == FINALIZER_EC2NODECLASS_TERMINATION) {
        return None;
    }
    let mut out = finalizers.to_vec();
    out.push(FINALIZER_EC2NODECLASS_TERMINATION.to_string());
    Some(out)
}

/// The merge patch that turns `previous` into `next`, or `None` when they are equal (so an
/// unchanged resolution writes nothing). Fields `next` no longer has are set to `null`.
pub fn status_patch(previous: Option<&EC2NodeClassStatus>, next: &EC2NodeClassStatus) -> Option<Value> {
    if previous == Some(next) {
        return None;
    }
    let mut status = serde_json::to_value(next).unwrap_or_else(|_| json!({}));
    if let (Some(old), Value::Object(new)) =
        (previous.and_then(|p| serde_json::to_value(p).ok()), &mut status)
        && let Value::Object(old) = old
    {
        for key in old.keys() {
            new.entry(key.clone()).or_insert(Value::Null);
        }
    }
    Some(json!({ "status": status }))
}

/// The names of the NodeClaims that reference the class `class`, sorted.
pub fn claims_of_class<'a>(claims: impl IntoIterator<Item = &'a NodeClaim>, class: &str) -> Vec<String> {
    let names: BTreeSet<String> =
        claims.into_iter().filter(|c| references(c, class)).map(|c| c.name_any()).collect();
    names.into_iter().collect()
}

fn references(claim: &NodeClaim, class: &str) -> bool {
    let r = &claim.spec.node_class_ref;
    r.group == NODE_CLASS_GROUP && r.name == class
}

/// Names joined for a message, at most `max` of them and a count of the rest.
pub fn pretty_names(names: &[String], max: usize) -> String {
    if names.len() <= max {
        return names.join(", ");
    }
    format!("{} and {} other(s)", names[..max].join(", "), names.len() - max)
}

fn resolved_ids(status: &EC2NodeClassStatus, what: &str) -> BTreeSet<String> {
    match what {
        "subnets" => status.subnets.iter().map(|x| x.id.clone()).collect(),
        "security groups" => status.security_groups.iter().map(|x| x.id.clone()).collect(),
        _ => status.amis.iter().map(|x| x.id.clone()).collect(),
    }
}

/// The kinds of resolved resources (`subnets`, `security groups`, `amis`) whose set of ids
/// differs between `previous` and a non-empty `next`, with the new ids.
pub fn discoveries(
    previous: Option<&EC2NodeClassStatus>,
    next: &EC2NodeClassStatus,
) -> Vec<(&'static str, Vec<String>)> {
    let mut out = Vec::new();
    for what in ["subnets", "security groups", "amis"] {
        let now = resolved_ids(next, what);
        let before = previous.map(|p| resolved_ids(p, what)).unwrap_or_default();
        if !now.is_empty() && now != before {
            out.push((what, now.into_iter().collect()));
        }
    }
    out
}

/// The delay before retrying after the `failures`-th consecutive failure (1-based).
pub fn backoff(failures: u32) -> Duration {
    Backoff::new(BACKOFF_BASE, BACKOFF_MAX).delay(failures)
}

/// What the reconciler shares.
struct Reconciler {
    client: Client,
    cluster: ClusterState,
    provider: Arc<AwsCloudProvider>,
    events: Events,
    /// The NodeClaims last announced as blocking each class's deletion.
    waiting: Mutex<HashMap<String, Vec<String>>>,
}

impl Reconciler {
    fn classes(&self) -> Api<EC2NodeClass> {
        Api::all(self.client.clone())
    }
}

impl Reconcile for Reconciler {
    type Key = String;
    type Error = Error;

    async fn reconcile(&self, name: &String) -> Result<Next, Error> {
        let Some(class) = self.cluster.nodeclass(name) else {
            self.waiting.lock().unwrap_or_else(PoisonError::into_inner).remove(name);
            return Ok(Next::Wait);
        };
        match step(&class) {
            Step::AddFinalizer => add_finalizer(&class, self).await,
            Step::Resolve => resolve(&class, self).await,
            Step::Finalize => finalize(&class, self).await,
            Step::Done => Ok(Next::Wait),
        }
    }
}

/// Name of the controller, in logs and metrics.
pub const CONTROLLER: &str = "nodeclass";

/// Runs the EC2NodeClass controller until `stop` turns true.
pub async fn run(
    client: Client,
    cluster: ClusterState,
    provider: Arc<AwsCloudProvider>,
    events: Events,
    stop: watch::Receiver<bool>,
) {
    run_selected(client, cluster, provider, events, stop, |_| true).await;
}

/// As [`run`], for the classes `select` accepts (tests keep to their own classes).
pub(crate) async fn run_selected(
    client: Client,
    cluster: ClusterState,
    provider: Arc<AwsCloudProvider>,
    events: Events,
    stop: watch::Receiver<bool>,
    select: impl Fn(&EC2NodeClass) -> bool + Send + Sync + 'static,
) {
    let reconciler = Arc::new(Reconciler {
        client,
        cluster: cluster.clone(),
        provider,
        events,
        waiting: Mutex::new(HashMap::new()),
    });
    let queue: Arc<Queue<String>> = Arc::new(Queue::new());
    let select = Arc::new(select);
    let _classes = {
        let (queue, select) = (queue.clone(), select.clone());
        cluster.on_nodeclass(move |notice| match notice {
            Notice::Applied(class) if select(class) => queue.add(class.name_any()),
            Notice::Applied(_) => {}
            gone => queue.forget(&gone.name()),
        })
    };
    // A NodeClaim going away may be the last one a class being deleted waits for.
    let _claims = {
        let (queue, cluster, select) = (queue.clone(), cluster.clone(), select.clone());
        cluster.clone().on_nodeclaim(move |notice| {
            let (Notice::Applied(claim) | Notice::Deleted(claim)) = notice else { return };
            if let Some(class) = class_to_wake(&cluster, claim)
                && select(&class)
            {
                queue.add(class.name_any());
            }
        })
    };
    for class in cluster.nodeclasses.state() {
        if select(&class) {
            queue.add(class.name_any());
        }
    }
    let options = Options::new(CONTROLLER).workers(2).backoff(Backoff::new(BACKOFF_BASE, BACKOFF_MAX));
    run_keyed(reconciler, queue, options, None, stop).await;
    tracing::info!("ec2nodeclass controller stopped");
}

/// The class a NodeClaim change should wake: the one it references, while it is being deleted.
fn class_to_wake(cluster: &ClusterState, claim: &NodeClaim) -> Option<Arc<EC2NodeClass>> {
    let r = &claim.spec.node_class_ref;
    if r.group != NODE_CLASS_GROUP {
        return None;
    }
    cluster.nodeclass(&r.name).filter(|c| c.metadata.deletion_timestamp.is_some())
}

/// Patches the class's finalizers (guarded by its resourceVersion, so a concurrent change of the
/// list fails the patch instead of being overwritten). Returns whether the patch was applied.
async fn patch_finalizers(
    class: &EC2NodeClass,
    finalizers: Vec<String>,
    reconciler: &Reconciler,
    action: &'static str,
) -> Result<bool, Error> {
    let name = class.name_any();
    let patch = json!({
        "metadata": { "finalizers": finalizers, "resourceVersion": class.resource_version() }
    });
    match reconciler.classes().patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await {
        Ok(_) => Ok(true),
        // Gone, or changed since it was read: the watch delivers the newer state.
        Err(e) if is_status(&e, 404) || is_status(&e, 409) => {
            tracing::debug!(ec2nodeclass = %name, action, "the class changed meanwhile");
            Ok(false)
        }
        Err(source) => Err(Error::Kube { name, action, source }),
    }
}

fn is_status(error: &kube::Error, code: u16) -> bool {
    matches!(error, kube::Error::Api(status) if status.code == code)
}

async fn add_finalizer(class: &EC2NodeClass, reconciler: &Reconciler) -> Result<Next, Error> {
    let Some(finalizers) = with_finalizer(class.finalizers()) else {
        return Ok(Next::Wait);
    };
    // The patch wakes the class again, and that reconciliation resolves it.
    patch_finalizers(class, finalizers, reconciler, "add the finalizer").await?;
    Ok(Next::Wait)
}

async fn resolve(class: &EC2NodeClass, reconciler: &Reconciler) -> Result<Next, Error> {
    let name = class.name_any();
    let provider = &reconciler.provider;
    let pools = reconciler.cluster.nodepools.state();
    let pools: Vec<&NodePool> = pools.iter().map(AsRef::as_ref).filter(|np| uses_class(np, &name)).collect();
    let Resolved { status, undecided } = match provider.resolve_node_class(class, &pools).await {
        Ok(resolved) => resolved,
        Err(source) => {
            // Keep launching from what was resolved last.
            provider.node_classes().upsert(class.clone());
            let error = Error::Resolve { name: name.clone(), source };
            reconciler.events.warning(class, reasons::FAILED_RESOLVING_NODE_CLASS, error_chain(&error)).await;
            return Err(error);
        }
    };
    let previous = class.status.as_ref();
    for (what, ids) in discoveries(previous, &status) {
        tracing::info!(ec2nodeclass = %name, ids = ?ids, "discovered {what}");
    }
    if let Some(patch) = status_patch(previous, &status) {
        let params = PatchParams { field_manager: Some(FIELD_MANAGER.to_string()), ..Default::default() };
        match reconciler.classes().patch_status(&name, &params, &Patch::Merge(&patch)).await {
            Ok(_) => {}
            Err(e) if is_status(&e, 404) => return Ok(Next::Wait),
            Err(source) => return Err(Error::Kube { name, action: "update the status", source }),
        }
        let ready = crate::cloudprovider::aws::nodeclass::is_ready(Some(&status));
        match ready {
            Ok(_) => tracing::debug!(ec2nodeclass = %name, "updated the status; the class is ready"),
            Err(reason) => tracing::info!(ec2nodeclass = %name, reason, "the class is not ready"),
        }
    }
    let mut resolved = class.clone();
    resolved.status = Some(status);
    provider.node_classes().upsert(resolved);
    restamp_claims(class, reconciler).await;
    match undecided {
        None => Ok(Next::After(reconciler.provider.node_class_refresh())),
        Some((error, true)) => {
            tracing::debug!(ec2nodeclass = %name, error = %error_chain(&error), "validation asked again shortly");
            Ok(Next::After(validation::RETRY_AFTER))
        }
        Some((source, false)) => Err(Error::Validate { name, source }),
    }
}

/// Whether the NodePool `np` launches from the EC2NodeClass `class`.
fn uses_class(np: &NodePool, class: &str) -> bool {
    let r = &np.spec.template.spec.node_class_ref;
    r.group == NODE_CLASS_GROUP && r.name == class
}

/// The annotations that bring a launched `claim` of a class whose current hash is `class_hash`
/// to the current hash scheme, or `None` when it is already on it. As upstream, a claim already
/// drifted keeps its old hash (only the version changes), so it stays drifted.
pub fn restamp(claim: &NodeClaim, class_hash: &str) -> Option<serde_json::Map<String, Value>> {
    let launched = claim.status.as_ref().is_some_and(|s| s.provider_id.is_some());
    let version = claim.annotations().get(ANNOTATION_EC2NODECLASS_HASH_VERSION);
    if !launched
        || claim.metadata.deletion_timestamp.is_some()
        || version.map(String::as_str) == Some(NODE_CLASS_HASH_VERSION)
    {
        return None;
    }
    let mut annotations = serde_json::Map::new();
    annotations.insert(ANNOTATION_EC2NODECLASS_HASH_VERSION.into(), NODE_CLASS_HASH_VERSION.into());
    if !claim.is_true(DRIFTED) {
        annotations.insert(ANNOTATION_EC2NODECLASS_HASH.into(), class_hash.into());
    }
    Some(annotations)
}

/// Re-stamps the class hash of its launched NodeClaims whose hash is of another scheme (an older
/// one of upstream's, or `rs-v2`, this controller's former one), so that they are compared from
/// now on rather than all marked drifted.
async fn restamp_claims(class: &EC2NodeClass, reconciler: &Reconciler) {
    let api: Api<NodeClaim> = Api::all(reconciler.client.clone());
    let class_hash = reconciler.provider.class_hash(&class.spec);
    for claim in reconciler.cluster.nodeclaims.state() {
        if !references(&claim, &class.name_any()) {
            continue;
        }
        let Some(annotations) = restamp(&claim, &class_hash) else { continue };
        let patch = json!({
            "metadata": { "resourceVersion": claim.resource_version(), "annotations": annotations },
        });
        match api.patch(&claim.name_any(), &PatchParams::default(), &Patch::Merge(&patch)).await {
            Ok(_) => {
                tracing::debug!(NodeClaim = %claim.name_any(), "re-stamped the nodeclaim's ec2nodeclass hash")
            }
            // Changed or gone meanwhile: the next resolution looks again.
            Err(e) if is_status(&e, 404) || is_status(&e, 409) => {}
            Err(e) => {
                tracing::warn!(NodeClaim = %claim.name_any(), error = %error_chain(&e), "re-stamping the nodeclaim's ec2nodeclass hash")
            }
        }
    }
}

async fn finalize(class: &EC2NodeClass, reconciler: &Reconciler) -> Result<Next, Error> {
    let name = class.name_any();
    let claims = Api::<NodeClaim>::all(reconciler.client.clone())
        .list(&ListParams::default())
        .await
        .map_err(|source| Error::Kube { name: name.clone(), action: "list the nodeclaims", source })?;
    let waiting = claims_of_class(&claims.items, &name);
    if !waiting.is_empty() {
        let changed = {
            let mut told = reconciler.waiting.lock().unwrap_or_else(PoisonError::into_inner);
            told.insert(name.clone(), waiting.clone()).as_ref() != Some(&waiting)
        };
        if changed {
            let message = format!("Waiting on NodeClaim termination for {}", pretty_names(&waiting, 5));
            tracing::info!(ec2nodeclass = %name, nodeclaims = ?waiting, "waiting on nodeclaim termination");
            reconciler.events.normal(class, reasons::WAITING_ON_NODECLAIM_TERMINATION, message).await;
        }
        return Ok(Next::After(WAIT_ON_NODECLAIMS));
    }
    reconciler.waiting.lock().unwrap_or_else(PoisonError::into_inner).remove(&name);
    let provider = &reconciler.provider;
    let cleanup = async {
        let templates = provider.delete_launch_templates(&name).await.map_err(|source| Error::Cleanup {
            name: name.clone(),
            what: "launch templates",
            source,
        })?;
        if !templates.is_empty() {
            tracing::info!(ec2nodeclass = %name, launch_templates = ?templates, "deleted launch templates");
        }
        let profile = provider.delete_instance_profile(class).await.map_err(|source| Error::Cleanup {
            name: name.clone(),
            what: "instance profile",
            source,
        })?;
        if let Some(profile) = profile {
            tracing::info!(ec2nodeclass = %name, instance_profile = %profile, "deleted instance profile");
        }
        Ok::<_, Error>(())
    };
    if let Err(error) = cleanup.await {
        reconciler.events.warning(class, reasons::FAILED_DELETING_NODE_CLASS, error_chain(&error)).await;
        return Err(error);
    }
    provider.node_classes().remove(&name);
    provider.forget_validation(&name);
    if let Some(finalizers) = without_finalizer(class.finalizers())
        && patch_finalizers(class, finalizers, reconciler, "remove the finalizer").await?
    {
        tracing::info!(ec2nodeclass = %name, "deleted ec2nodeclass");
    }
    Ok(Next::Wait)
}

//! The EC2NodeClass controller: keeps each class's `status` (subnets, security groups, AMIs,
//! instance profile, conditions) resolved against AWS, hands the class to the provider's
//! [`NodeClassStore`](crate::cloudprovider::aws::NodeClassStore), and cleans up on deletion.
//!
//! * A class that is not being deleted gets the `karpenter.k8s.aws/termination` finalizer, is
//!   resolved with [`AwsCloudProvider::resolve_node_class`], and its status is written through
//!   the status subresource only when it changed (so the controller's own write does not start a
//!   loop). It is resolved again every [`RESYNC`]. A failed resolution keeps the last status,
//!   publishes a Warning event and is retried with backoff.
//! * A class being deleted waits while NodeClaims still reference it (requeued every
//!   [`WAIT_ON_NODECLAIMS`], with a `WaitingOnNodeClaimTermination` event), then its launch
//!   templates and the instance profile Karpenter created for it are deleted, it leaves the
//!   provider's store, and the finalizer is removed.
//!
//! NodeClaims are watched too: a NodeClaim change wakes the class it references while that class
//! is being deleted.

#[cfg(test)]
mod tests;

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures::StreamExt;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use serde_json::{Value, json};
use tokio::sync::watch;

use crate::apis::labels::FINALIZER_EC2NODECLASS_TERMINATION;
use crate::apis::{EC2NodeClass, EC2NodeClassStatus, NodeClaim};
use crate::cloudprovider::CloudProviderError;
use crate::cloudprovider::aws::AwsCloudProvider;
use crate::controllers::Events;
use crate::operator::error_chain;

/// How often a class is resolved again when nothing changes.
pub const RESYNC: Duration = Duration::from_secs(300);
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
    crate::controllers::kit::Backoff::new(BACKOFF_BASE, BACKOFF_MAX).delay(failures)
}

/// What the reconciler shares.
struct Reconciler {
    client: Client,
    provider: Arc<AwsCloudProvider>,
    events: Events,
    /// Consecutive failures per class, for the backoff.
    failures: Mutex<HashMap<String, u32>>,
    /// The NodeClaims last announced as blocking each class's deletion.
    waiting: Mutex<HashMap<String, Vec<String>>>,
}

impl Reconciler {
    fn classes(&self) -> Api<EC2NodeClass> {
        Api::all(self.client.clone())
    }

    fn succeeded(&self, name: &str) {
        self.failures.lock().unwrap_or_else(PoisonError::into_inner).remove(name);
    }

    fn failed(&self, name: &str) -> u32 {
        let mut failures = self.failures.lock().unwrap_or_else(PoisonError::into_inner);
        let n = failures.entry(name.to_string()).or_insert(0);
        *n = n.saturating_add(1);
        *n
    }
}

/// Runs the EC2NodeClass controller until `stop` turns true.
pub async fn run(
    client: Client,
    provider: Arc<AwsCloudProvider>,
    events: Events,
    stop: watch::Receiver<bool>,
) {
    run_watching(client, provider, events, stop, watcher::Config::default()).await;
}

/// As [`run`], for the classes `config` selects (tests restrict it to their own classes).
pub(crate) async fn run_watching(
    client: Client,
    provider: Arc<AwsCloudProvider>,
    events: Events,
    mut stop: watch::Receiver<bool>,
    config: watcher::Config,
) {
    let reconciler = Arc::new(Reconciler {
        client: client.clone(),
        provider,
        events,
        failures: Mutex::new(HashMap::new()),
        waiting: Mutex::new(HashMap::new()),
    });
    let controller = Controller::new(Api::<EC2NodeClass>::all(client.clone()), config);
    let store = controller.store();
    controller
        .watches(Api::<NodeClaim>::all(client), watcher::Config::default(), move |claim| {
            class_to_wake(&store, &claim)
        })
        .graceful_shutdown_on(async move {
            while !*stop.borrow_and_update() {
                if stop.changed().await.is_err() {
                    break;
                }
            }
        })
        .run(reconcile, error_policy, reconciler)
        .for_each(|result| async move {
            if let Err(error) = result {
                tracing::debug!(error = %error_chain(&error), "ec2nodeclass controller");
            }
        })
        .await;
    tracing::info!("ec2nodeclass controller stopped");
}

/// The class a NodeClaim change should wake: the one it references, while it is being deleted.
fn class_to_wake(store: &Store<EC2NodeClass>, claim: &NodeClaim) -> Option<ObjectRef<EC2NodeClass>> {
    let r = &claim.spec.node_class_ref;
    if r.group != NODE_CLASS_GROUP {
        return None;
    }
    let key = ObjectRef::new(&r.name);
    store.get(&key).filter(|c| c.metadata.deletion_timestamp.is_some()).map(|_| key)
}

fn error_policy(class: Arc<EC2NodeClass>, error: &Error, reconciler: Arc<Reconciler>) -> Action {
    let name = class.name_any();
    let delay = backoff(reconciler.failed(&name));
    tracing::error!(ec2nodeclass = %name, error = %error_chain(error), retry_in = ?delay, "reconciling ec2nodeclass failed");
    Action::requeue(delay)
}

async fn reconcile(class: Arc<EC2NodeClass>, reconciler: Arc<Reconciler>) -> Result<Action, Error> {
    let action = match step(&class) {
        Step::AddFinalizer => add_finalizer(&class, &reconciler).await?,
        Step::Resolve => resolve(&class, &reconciler).await?,
        Step::Finalize => finalize(&class, &reconciler).await?,
        Step::Done => Action::await_change(),
    };
    reconciler.succeeded(&class.name_any());
    Ok(action)
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

async fn add_finalizer(class: &EC2NodeClass, reconciler: &Reconciler) -> Result<Action, Error> {
    let Some(finalizers) = with_finalizer(class.finalizers()) else {
        return Ok(Action::await_change());
    };
    // The patch wakes the class again, and that reconciliation resolves it.
    patch_finalizers(class, finalizers, reconciler, "add the finalizer").await?;
    Ok(Action::await_change())
}

async fn resolve(class: &EC2NodeClass, reconciler: &Reconciler) -> Result<Action, Error> {
    let name = class.name_any();
    let provider = &reconciler.provider;
    let status = match provider.resolve_node_class(class).await {
        Ok(status) => status,
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
            Err(e) if is_status(&e, 404) => return Ok(Action::await_change()),
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
    Ok(Action::requeue(RESYNC))
}

async fn finalize(class: &EC2NodeClass, reconciler: &Reconciler) -> Result<Action, Error> {
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
        return Ok(Action::requeue(WAIT_ON_NODECLAIMS));
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
    if let Some(finalizers) = without_finalizer(class.finalizers())
        && patch_finalizers(class, finalizers, reconciler, "remove the finalizer").await?
    {
        tracing::info!(ec2nodeclass = %name, "deleted ec2nodeclass");
    }
    Ok(Action::await_change())
}

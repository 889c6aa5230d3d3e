//! Surges of opted-in workloads whose PodDisruptionBudget refuses the drain
//! ([`crate::disruption::surge`] decides): [`begin`] raises a workload's replicas when the
//! termination controller's eviction of its pod is refused, recording the change on the workload
//! in the same write; the surge controller (`surge.controller`) finishes each surge when the old
//! pod has left (or after [`SURGE_TIMEOUT`]), restoring the replicas in one write that also
//! removes the record. A controller that restarts in the middle lists the workloads labelled
//! [`LABEL_SURGING`] and finishes what it finds.
//!
//! It asks the API server nothing while no surge is under way: it lists once at start, and
//! again only after [`begin`] started one, until none is left.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::apis::pod::Pod;
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::jiff::Timestamp;
use kube::api::{ListParams, Patch, PatchParams};
use kube::{Api, Resource, ResourceExt};
use serde_json::json;
use tokio::sync::watch;

use crate::controllers::Context;
use crate::controllers::kit::{Next, Options, Timer, run_singleton};
use crate::disruption::candidates::surge_gets_past;
use crate::disruption::surge::{
    ANNOTATION_SURGE, ANNOTATION_SURGE_GAVE_UP, FinishReason, LABEL_SURGING, PodState, SURGE_TIMEOUT, Step,
    SurgeRecord, next_step, replica_set_of,
};
use crate::util::api::{is_forbidden, is_not_found};
use crate::util::error_chain;

/// Name of the controller, in logs and metrics.
pub const CONTROLLER: &str = "surge.controller";
/// How often the surges under way are looked at.
const PERIOD: Duration = Duration::from_secs(2);
/// The event on a workload whose replicas were raised.
pub const REASON_STARTED: &str = "SurgeStarted";
/// The event on a workload whose replicas were restored.
pub const REASON_FINISHED: &str = "SurgeFinished";
/// The event on a workload whose surge was given up.
pub const REASON_TIMED_OUT: &str = "SurgeTimedOut";

/// Whether surges may be under way: set by [`begin`], cleared by a pass that finds none.
#[derive(Debug)]
pub struct Surges {
    active: AtomicBool,
}

impl Default for Surges {
    /// At start, a surge a previous leader began may be under way.
    fn default() -> Self {
        Surges { active: AtomicBool::new(true) }
    }
}

/// Why a surge could not begin or end.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A request to the API server failed.
    #[error("{action}")]
    Kube {
        /// What was attempted.
        action: String,
        /// Why it failed.
        #[source]
        source: kube::Error,
    },
}

fn kube_error(action: impl Into<String>) -> impl FnOnce(kube::Error) -> Error {
    let action = action.into();
    move |source| Error::Kube { action, source }
}

/// A workload a surge raises: a Deployment, or a ReplicaSet no Deployment controls.
enum Workload {
    Deployment(Deployment),
    ReplicaSet(ReplicaSet),
}

impl Workload {
    fn kind(&self) -> &'static str {
        match self {
            Workload::Deployment(_) => "Deployment",
            Workload::ReplicaSet(_) => "ReplicaSet",
        }
    }

    fn meta(&self) -> &kube::api::ObjectMeta {
        match self {
            Workload::Deployment(d) => &d.metadata,
            Workload::ReplicaSet(r) => &r.metadata,
        }
    }

    fn key(&self) -> String {
        let meta = self.meta();
        format!(
            "{}/{}/{}",
            self.kind(),
            meta.namespace.as_deref().unwrap_or_default(),
            meta.name.as_deref().unwrap_or_default()
        )
    }

    fn replicas(&self) -> i32 {
        let replicas = match self {
            Workload::Deployment(d) => d.spec.as_ref().and_then(|s| s.replicas),
            Workload::ReplicaSet(r) => r.spec.as_ref().and_then(|s| s.replicas),
        };
        replicas.unwrap_or(1)
    }

    fn ready(&self) -> i32 {
        let ready = match self {
            Workload::Deployment(d) => d.status.as_ref().and_then(|s| s.ready_replicas),
            Workload::ReplicaSet(r) => r.status.as_ref().and_then(|s| s.ready_replicas),
        };
        ready.unwrap_or(0)
    }

    fn annotation(&self, key: &str) -> Option<&String> {
        self.meta().annotations.as_ref()?.get(key)
    }

    fn record(&self) -> Option<&String> {
        self.annotation(ANNOTATION_SURGE)
    }

    async fn patch(&self, ctx: &Context, patch: &serde_json::Value) -> Result<(), kube::Error> {
        let meta = self.meta();
        let (ns, name) =
            (meta.namespace.as_deref().unwrap_or_default(), meta.name.as_deref().unwrap_or_default());
        let params = PatchParams::default();
        match self {
            Workload::Deployment(_) => {
                Api::<Deployment>::namespaced(ctx.client.clone(), ns)
                    .patch(name, &params, &Patch::Merge(patch))
                    .await?;
            }
            Workload::ReplicaSet(_) => {
                Api::<ReplicaSet>::namespaced(ctx.client.clone(), ns)
                    .patch(name, &params, &Patch::Merge(patch))
                    .await?;
            }
        }
        Ok(())
    }

    async fn event(&self, ctx: &Context, warning: bool, reason: &str, message: String) {
        match (self, warning) {
            (Workload::Deployment(d), false) => ctx.events.normal(d, reason, message).await,
            (Workload::Deployment(d), true) => ctx.events.warning(d, reason, message).await,
            (Workload::ReplicaSet(r), false) => ctx.events.normal(r, reason, message).await,
            (Workload::ReplicaSet(r), true) => ctx.events.warning(r, reason, message).await,
        }
    }
}

/// The controller owner of an object, as (apiVersion, kind).
fn controller_of(meta: &kube::api::ObjectMeta) -> Option<(&str, &str)> {
    meta.owner_references
        .iter()
        .flatten()
        .find(|o| o.controller == Some(true))
        .map(|o| (o.api_version.as_str(), o.kind.as_str()))
}

/// The workload that controls `pod`: its ReplicaSet's Deployment, or the ReplicaSet when nothing
/// controls it. A ReplicaSet or Deployment that another controller owns (a rollout controller,
/// an operator) is not surged: its owner would undo the change.
async fn workload_of(ctx: &Context, pod: &Pod) -> Result<Option<Workload>, Error> {
    let Some(rs_name) = replica_set_of(pod) else { return Ok(None) };
    let ns = pod.namespace().unwrap_or_default();
    let rs = Api::<ReplicaSet>::namespaced(ctx.client.clone(), &ns)
        .get_opt(rs_name)
        .await
        .map_err(kube_error(format!("get replicaset {ns}/{rs_name}")))?;
    let Some(rs) = rs else { return Ok(None) };
    match controller_of(&rs.metadata) {
        None => Ok(Some(Workload::ReplicaSet(rs))),
        Some(("apps/v1", "Deployment")) => {
            let Some(name) =
                rs.owner_references().iter().find(|o| o.controller == Some(true)).map(|o| o.name.clone())
            else {
                return Ok(None);
            };
            let deployment = Api::<Deployment>::namespaced(ctx.client.clone(), &ns)
                .get_opt(&name)
                .await
                .map_err(kube_error(format!("get deployment {ns}/{name}")))?;
            Ok(deployment.filter(|d| controller_of(&d.metadata).is_none()).map(Workload::Deployment))
        }
        Some(_) => Ok(None),
    }
}

/// Surges the workload of `pod`, whose eviction from `node` its budget refused, unless a surge
/// of it is under way: one write raises its replicas by one and records the surge, conditional
/// on the version read. Failures are logged with the workload's name; the drain asks again.
pub async fn begin(ctx: &Context, node: &str, pod: &Pod) {
    static FORBIDDEN_LOGGED: AtomicBool = AtomicBool::new(false);
    let Err(error) = try_begin(ctx, node, pod).await else { return };
    let Error::Kube { source, .. } = &error;
    if is_forbidden(source) {
        // Upstream's chart grants no patch on workloads: said once, the node waits as upstream's.
        if !FORBIDDEN_LOGGED.swap(true, Ordering::SeqCst) {
            tracing::warn!(controller = CONTROLLER, pod = %crate::state::pods::key(pod), node, error = %error_chain(&error), "surging workload: forbidden; grant get and patch on deployments and replicasets to surge");
        }
        return;
    }
    tracing::error!(controller = CONTROLLER, pod = %crate::state::pods::key(pod), node, error = %error_chain(&error), "surging workload");
}

async fn try_begin(ctx: &Context, node: &str, pod: &Pod) -> Result<(), Error> {
    let ns = pod.namespace().unwrap_or_default();
    // Only where one more healthy pod gets the eviction through (the drain of an expiring or
    // deleted node reaches pods the candidate checks never looked at).
    let pdbs = Api::<PodDisruptionBudget>::namespaced(ctx.client.clone(), &ns)
        .list(&ListParams::default())
        .await
        .map_err(kube_error(format!("list poddisruptionbudgets of {ns}")))?;
    let pdbs: Vec<Arc<PodDisruptionBudget>> = pdbs.items.into_iter().map(Arc::new).collect();
    if !surge_gets_past(pod, &pdbs) {
        return Ok(());
    }
    let Some(workload) = workload_of(ctx, pod).await? else { return Ok(()) };
    if workload.record().is_some() || workload.annotation(ANNOTATION_SURGE_GAVE_UP) == pod.uid().as_ref() {
        return Ok(());
    }
    let replicas = workload.replicas();
    let record = SurgeRecord {
        replicas,
        pod: pod.name_any(),
        pod_uid: pod.uid().unwrap_or_default(),
        node: node.to_string(),
        started: Timestamp::now().to_string(),
    };
    let patch = json!({
        "metadata": {
            "resourceVersion": workload.meta().resource_version,
            "labels": { LABEL_SURGING: "true" },
            "annotations": { ANNOTATION_SURGE: record.to_annotation() },
        },
        "spec": { "replicas": replicas + 1 },
    });
    workload
        .patch(ctx, &patch)
        .await
        .map_err(kube_error(format!("raise the replicas of {}", workload.key())))?;
    ctx.surges.active.store(true, Ordering::SeqCst);
    let pod_key = crate::state::pods::key(pod);
    tracing::info!(controller = CONTROLLER, workload = %workload.key(), pod = %pod_key, node, from = replicas, to = replicas + 1, "surging workload past its disruption budget");
    let message = format!(
        "Raised replicas from {replicas} to {} so that pod {pod_key} can leave node {node}: its PodDisruptionBudget allows no eviction",
        replicas + 1
    );
    workload.event(ctx, false, REASON_STARTED, message).await;
    Ok(())
}

/// Runs until `stop` turns true.
pub async fn run(ctx: Context, stop: watch::Receiver<bool>) {
    run_singleton(Options::new(CONTROLLER), Some(ctx.metrics.clone()), Timer, stop, || pass(&ctx)).await;
}

async fn pass(ctx: &Context) -> Result<Next, Error> {
    if !ctx.surges.active.load(Ordering::SeqCst) {
        return Ok(Next::After(PERIOD));
    }
    // Cleared first: a surge begun while this pass lists is looked at by the next one.
    ctx.surges.active.store(false, Ordering::SeqCst);
    let params = ListParams::default().labels(LABEL_SURGING);
    let deployments = Api::<Deployment>::all(ctx.client.clone())
        .list(&params)
        .await
        .map_err(kube_error("list surging deployments"));
    let replica_sets = Api::<ReplicaSet>::all(ctx.client.clone())
        .list(&params)
        .await
        .map_err(kube_error("list surging replicasets"));
    let (deployments, replica_sets) = match (deployments, replica_sets) {
        (Ok(d), Ok(r)) => (d, r),
        (Err(e), _) | (_, Err(e)) => {
            ctx.surges.active.store(true, Ordering::SeqCst);
            return Err(e);
        }
    };
    let workloads: Vec<Workload> = deployments
        .items
        .into_iter()
        .map(Workload::Deployment)
        .chain(replica_sets.items.into_iter().map(Workload::ReplicaSet))
        .collect();
    let mut first_error = None;
    for workload in &workloads {
        match finish_if_done(ctx, workload).await {
            Ok(true) => {}
            Ok(false) => ctx.surges.active.store(true, Ordering::SeqCst),
            Err(error) => {
                ctx.surges.active.store(true, Ordering::SeqCst);
                tracing::error!(controller = CONTROLLER, workload = %workload.key(), error = %error_chain(&error), "finishing surge");
                first_error.get_or_insert(error);
            }
        }
    }
    match first_error {
        Some(error) => Err(error),
        None => Ok(Next::After(PERIOD)),
    }
}

/// Ends `workload`'s surge when its old pod has left or time is up; whether it ended.
async fn finish_if_done(ctx: &Context, workload: &Workload) -> Result<bool, Error> {
    let remove = json!({ LABEL_SURGING: null });
    let record = match workload.record().map(|text| SurgeRecord::parse(text)) {
        Some(Ok(record)) => record,
        unreadable => {
            // Nothing says what the replicas were: they are left as they are.
            let problem = match unreadable {
                Some(Err(problem)) => problem,
                _ => "no record".to_string(),
            };
            tracing::warn!(controller = CONTROLLER, workload = %workload.key(), error = %problem, "ignoring unreadable surge record; replicas left as they are");
            let patch =
                json!({ "metadata": { "labels": remove, "annotations": { ANNOTATION_SURGE: null } } });
            workload
                .patch(ctx, &patch)
                .await
                .map_err(kube_error(format!("remove the surge of {}", workload.key())))?;
            return Ok(true);
        }
    };
    let ns = workload.meta().namespace.clone().unwrap_or_default();
    let pod = Api::<Pod>::namespaced(ctx.client.clone(), &ns)
        .get_opt(&record.pod)
        .await
        .map_err(kube_error(format!("get pod {ns}/{}", record.pod)))?;
    let state = match pod {
        Some(p)
            if p.uid().as_deref() == Some(record.pod_uid.as_str())
                && p.meta().deletion_timestamp.is_none() =>
        {
            PodState::Present
        }
        _ => PodState::Left,
    };
    let Step::Finish { replicas, reason } =
        next_step(&record, workload.replicas(), workload.ready(), state, Timestamp::now())
    else {
        return Ok(false);
    };
    let mut patch = json!({
        "metadata": {
            "resourceVersion": workload.meta().resource_version,
            "labels": remove,
            "annotations": { ANNOTATION_SURGE: null },
        },
    });
    if let Some(replicas) = replicas {
        patch["spec"] = json!({ "replicas": replicas });
    }
    if reason == FinishReason::TimedOut {
        // Not surged again for this pod: the drain would start the same surge at once.
        patch["metadata"]["annotations"][ANNOTATION_SURGE_GAVE_UP] = json!(record.pod_uid);
    }
    match workload.patch(ctx, &patch).await {
        Ok(()) => {}
        Err(e) if is_not_found(&e) => return Ok(true),
        Err(e) => return Err(kube_error(format!("restore the replicas of {}", workload.key()))(e)),
    }
    let pod_key = format!("{ns}/{}", record.pod);
    let restored = match replicas {
        Some(r) => format!("Restored replicas to {r}"),
        None => format!(
            "Left replicas at {}: they changed during the surge (it raised them from {})",
            workload.replicas(),
            record.replicas
        ),
    };
    match reason {
        FinishReason::Done => {
            tracing::info!(controller = CONTROLLER, workload = %workload.key(), pod = %pod_key, node = %record.node, replicas = ?replicas, "finished surge");
            workload
                .event(
                    ctx,
                    false,
                    REASON_FINISHED,
                    format!("{restored}: pod {pod_key} left node {}", record.node),
                )
                .await;
        }
        FinishReason::TimedOut => {
            let minutes = SURGE_TIMEOUT.as_secs() / 60;
            tracing::warn!(controller = CONTROLLER, workload = %workload.key(), pod = %pod_key, node = %record.node, replicas = ?replicas, "surge timed out");
            let message = format!(
                "{restored}: pod {pod_key} was still on node {} after {minutes} minutes (the new pod never became Ready, or the budget still refused); it is not surged again",
                record.node
            );
            workload.event(ctx, true, REASON_TIMED_OUT, message).await;
        }
    }
    Ok(true)
}

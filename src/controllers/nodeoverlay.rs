//! NodeOverlay controller (`nodeoverlay.controller`, `NodeOverlay` gate): evaluates every
//! NodeOverlay against the instance types of every NodePool ([`evaluate`]), writes each overlay's
//! `ValidationSucceeded` and `Ready` conditions, and publishes the result to the [`Overlays`] the
//! decorated cloud provider applies. It runs when an overlay, a NodePool or a node class changes,
//! and every [`PERIOD`] (new instance types, prices).
//!
//! Until its first pass, NodePools await evaluation and launch nothing, as upstream; a NodePool
//! whose instance types cannot be resolved stays unevaluated and the pass is retried with backoff.
//! If the overlays cannot be listed (the CRD not installed, no right to list it), the NodePools are
//! evaluated without them after [`FIRST_LIST_WAIT`], and again once they can be.

use std::sync::Arc;
use std::time::Duration;

use crate::controllers::events::EventType;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Patch, PatchParams};
use kube::runtime::reflector::Store;
use kube::{Api, ResourceExt};
use tokio::sync::{Notify, watch};

use crate::apis::common::{ConditionUpdate, set_condition};
use crate::apis::{NodeOverlay, NodeOverlayStatus};
use crate::cloudprovider::CloudProvider;
use crate::cloudprovider::overlay::Overlays;
use crate::controllers::Context;
use crate::controllers::kit::{Next, Options, WatchedOrFed, run_singleton};
use crate::scheduling::overlay::{
    CONFLICT_MESSAGE, REASON_CONFLICT, REASON_RUNTIME_VALIDATION, Verdict, evaluate_nodepools,
};
use crate::state::watches::{self, Source};
use crate::state::{ClusterState, Interest};
use crate::util::error_chain;

/// Name of the controller, in logs and metrics.
pub const CONTROLLER: &str = "nodeoverlay.controller";
/// How often the overlays are evaluated when nothing changes.
const PERIOD: Duration = Duration::from_secs(300);
/// Changes within this time of each other are handled in one pass.
const SETTLE: Duration = Duration::from_millis(200);
/// How long the first list of NodeOverlays is waited for before NodePools are evaluated without.
const FIRST_LIST_WAIT: Duration = Duration::from_secs(30);
/// How often an overlay that selects no instance type is told so.
const NOTHING_SELECTED_EVERY: SignedDuration = SignedDuration::from_hours(1);

/// Condition: the overlay can be applied (valid, in conflict with no other).
pub const VALIDATION_SUCCEEDED: &str = "ValidationSucceeded";
/// Condition: the overlay is applied.
pub const READY: &str = "Ready";

/// Why a pass failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The instance types of some NodePools could not be resolved: they stay unevaluated.
    #[error("listing instance types for nodepools {pools}")]
    InstanceTypes {
        /// The NodePools, comma-separated.
        pools: String,
    },
}

/// Runs until `stop` turns true. `cloud` is the provider without overlays.
pub async fn run(
    ctx: Context,
    cloud: Arc<dyn CloudProvider>,
    overlays: Arc<Overlays>,
    state: ClusterState,
    stop: watch::Receiver<bool>,
) {
    let notify = Arc::new(Notify::new());
    let on_event = {
        let notify = notify.clone();
        move |_: &_| notify.notify_one()
    };
    let (cache, driver) =
        watches::cache::<NodeOverlay, _>("nodeoverlays", Source::Lenient(ctx.client.clone()), on_event);
    let driver = tokio::spawn(driver);
    let interest = Interest { nodepools: true, nodeclasses: true, ..Interest::default() };
    // A NodeOverlay, NodePool or node class changed.
    let wake = WatchedOrFed { watched: notify, fed: state.feed().subscribe(interest), settle: SETTLE };
    let mut ready = stop.clone();
    tokio::select! {
        r = cache.wait_until_ready() => if r.is_err() { driver.abort(); return },
        _ = ready.wait_for(|s| *s) => { driver.abort(); return }
        // Without the CRD (or the right to list it), NodePools would wait for an evaluation
        // forever: they are evaluated without overlays until the overlays can be listed.
        _ = tokio::time::sleep(FIRST_LIST_WAIT) => {
            tracing::error!(controller = CONTROLLER, "nodeoverlays could not be listed; evaluating nodepools without them until they can be");
        }
    }
    run_singleton(Options::new(CONTROLLER), Some(ctx.metrics.clone()), wake, stop, || {
        reconcile(&ctx, cloud.as_ref(), &overlays, &state, &cache)
    })
    .await;
    driver.abort();
}

async fn reconcile(
    ctx: &Context,
    cloud: &dyn CloudProvider,
    overlays: &Overlays,
    state: &ClusterState,
    cache: &Store<NodeOverlay>,
) -> Result<Next, Error> {
    let snapshot = state.snapshot();
    let mut resolved = Vec::new();
    let mut failed = Vec::new();
    for np in snapshot.live_nodepools() {
        let name = np.name_any();
        // A NodePool whose class is not ready launches nothing; it is evaluated once it is.
        if cloud
            .node_class_readiness(&np.spec.template.spec.node_class_ref, snapshot.node_class_of(np))
            .is_err()
        {
            continue;
        }
        match cloud.instance_types(np).await {
            Ok(types) => resolved.push((np, types)),
            Err(error) => {
                tracing::error!(controller = CONTROLLER, NodePool = %name, error = %error_chain(&error), "listing instance types for nodepool");
                failed.push(name);
            }
        }
    }
    let all = cache.state();
    let evaluation = evaluate_nodepools(
        all.iter().map(AsRef::as_ref),
        resolved.iter().map(|(np, types)| (np.as_ref(), types.as_slice())),
    );
    if *overlays.current() != evaluation.store {
        overlays.replace(evaluation.store);
        // Decisions priced with the old figures are out of date.
        state.feed().bump(|c| c.overlays += 1);
        tracing::info!(
            controller = CONTROLLER,
            nodeoverlays = all.len(),
            nodepools = resolved.len(),
            "applied nodeoverlays"
        );
    }
    let api: Api<NodeOverlay> = Api::all(ctx.client.clone());
    let now = Timestamp::now();
    for overlay in &all {
        let name = overlay.name_any();
        let Some(verdict) = evaluation.verdicts.get(&name) else { continue };
        let status = desired_status(overlay, verdict, now);
        if overlay.status.as_ref() != Some(&status) {
            let patch = serde_json::json!({ "status": status });
            match api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch)).await {
                Ok(_) => {}
                Err(error) if crate::util::api::is_not_found(&error) => {}
                Err(error) => {
                    tracing::warn!(controller = CONTROLLER, NodeOverlay = %name, error = %error, "updating nodeoverlay status")
                }
            }
            if let Some(message) = problem(verdict) {
                ctx.events.warning(overlay.as_ref(), "FailedValidation", message).await;
            }
        }
        if *verdict == (Verdict::Applied { types: 0 }) {
            let message = "NodeOverlay selects no instance type of any NodePool".to_string();
            ctx.events
                .deduped(
                    overlay.as_ref(),
                    EventType::Warning,
                    "NoInstanceTypesSelected",
                    "",
                    NOTHING_SELECTED_EVERY,
                    message,
                )
                .await;
        }
    }
    if failed.is_empty() {
        Ok(Next::After(PERIOD))
    } else {
        Err(Error::InstanceTypes { pools: failed.join(", ") })
    }
}

/// Why `verdict` keeps an overlay from applying, if it does.
fn problem(verdict: &Verdict) -> Option<String> {
    match verdict {
        Verdict::Applied { .. } => None,
        Verdict::Invalid(message) => Some(message.clone()),
        Verdict::Conflict => Some(CONFLICT_MESSAGE.to_string()),
    }
}

/// The status `overlay` should have after `verdict`: `ValidationSucceeded` and the `Ready` it
/// decides, as upstream's condition set writes them.
pub fn desired_status(overlay: &NodeOverlay, verdict: &Verdict, now: Timestamp) -> NodeOverlayStatus {
    let mut status = overlay.status.clone().unwrap_or_default();
    let generation = overlay.metadata.generation;
    let validation = match verdict {
        Verdict::Applied { .. } => ConditionUpdate::true_(VALIDATION_SUCCEEDED),
        Verdict::Invalid(message) => ConditionUpdate::false_(REASON_RUNTIME_VALIDATION, message.as_str()),
        Verdict::Conflict => ConditionUpdate::false_(REASON_CONFLICT, CONFLICT_MESSAGE),
    };
    let valid = matches!(verdict, Verdict::Applied { .. });
    set_condition(&mut status.conditions, VALIDATION_SUCCEEDED, validation, generation, now);
    let ready = if valid {
        ConditionUpdate::true_(READY)
    } else {
        ConditionUpdate::false_("UnhealthyDependents", format!("{VALIDATION_SUCCEEDED}=False"))
    };
    set_condition(&mut status.conditions, READY, ready, generation, now);
    status
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apis::ConditionStatus;

    #[test]
    fn conditions_follow_the_verdict_as_upstream_writes_them() {
        let overlay: NodeOverlay = serde_saphyr::from_str(
            "apiVersion: karpenter.sh/v1alpha1\nkind: NodeOverlay\nmetadata: {name: o, generation: 2}\nspec: {requirements: []}",
        )
        .unwrap();
        let now = Timestamp::UNIX_EPOCH;
        let cond =
            |s: &NodeOverlayStatus, t: &str| s.conditions.iter().find(|c| c.type_ == t).cloned().unwrap();
        let ok = desired_status(&overlay, &Verdict::Applied { types: 3 }, now);
        assert_eq!(cond(&ok, READY).status, ConditionStatus::True);
        assert_eq!(cond(&ok, VALIDATION_SUCCEEDED).reason, VALIDATION_SUCCEEDED);
        assert_eq!(cond(&ok, READY).observed_generation, Some(2));

        let conflict = desired_status(&overlay, &Verdict::Conflict, now);
        let v = cond(&conflict, VALIDATION_SUCCEEDED);
        assert_eq!(
            (v.status, v.reason.as_str(), v.message.as_str()),
            (ConditionStatus::False, "Conflict", "conflict with another overlay")
        );
        let r = cond(&conflict, READY);
        assert_eq!(
            (r.status, r.reason.as_str(), r.message.as_str()),
            (ConditionStatus::False, "UnhealthyDependents", "ValidationSucceeded=False")
        );

        let invalid = desired_status(
            &overlay,
            &Verdict::Invalid("invalid capacity: cpu in resource, restricted".into()),
            now,
        );
        assert_eq!(cond(&invalid, VALIDATION_SUCCEEDED).reason, "RuntimeValidation");
        assert!(cond(&invalid, VALIDATION_SUCCEEDED).message.contains("restricted"));
        assert_eq!(problem(&Verdict::Conflict).as_deref(), Some(CONFLICT_MESSAGE));
        assert_eq!(problem(&Verdict::Applied { types: 0 }), None);
    }
}

//! Two things disruption reads on every NodeClaim, written here:
//! - `status.lastPodEventTime`: the last time a pod (not a DaemonSet's) was bound to its node,
//!   finished, started terminating or was deleted there, written at most every 10 s per claim;
//! - the `Consolidatable` condition: True once the NodePool's `consolidateAfter` has passed since
//!   that time (or since the claim was initialized); absent before that, when `consolidateAfter`
//!   is `Never`, or when the claim is not initialized.
//!
//! The pod watch records pod events per node in the cluster state's index; each pass takes them.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::ResourceExt;
use serde_json::json;
use tokio::sync::watch;

use super::{Written, merge_status, write_status};
use crate::apis::common::{ConditionUpdate, is_true, remove_condition, set_condition};
use crate::apis::labels::LABEL_NODEPOOL;
use crate::apis::nodeclaim::NodeClaimStatus;
use crate::apis::nodeclaim::conditions::CONSOLIDATABLE;
use crate::apis::{Condition, NodeClaim};
use crate::controllers::Context;
use crate::controllers::kit::{Coalesced, Next, Options, run_singleton};
use crate::disruption::emptiness::claim_consolidatable_at;
use crate::state::{ClusterState, Interest};
use crate::util::error_chain;

/// Name of the controller, in logs and metrics.
pub const CONTROLLER: &str = "nodeclaim.consolidatable";
/// Pod events closer than this to the recorded one are not written again.
pub const POD_EVENT_DEDUPE: SignedDuration = SignedDuration::from_secs(10);
/// Longest wait between passes.
const PERIOD: Duration = Duration::from_secs(60);
/// Changes within this time of each other are handled in one pass.
const COALESCE: Duration = Duration::from_secs(1);

/// Runs until `stop` turns true.
pub async fn run(ctx: Context, state: ClusterState, stop: watch::Receiver<bool>) {
    let interest = Interest { pods: true, nodeclaims: true, nodepools: true, ..Interest::default() };
    let wake = Coalesced { changes: state.feed().subscribe(interest), settle: COALESCE };
    let pending: Arc<Mutex<HashMap<String, Timestamp>>> = Arc::default();
    run_singleton(Options::new(CONTROLLER), Some(ctx.metrics.clone()), wake, stop, || {
        let (ctx, state, pending) = (ctx.clone(), state.clone(), pending.clone());
        async move { Ok::<_, std::convert::Infallible>(pass(&ctx, &state, &pending).await) }
    })
    .await;
}

/// The `lastPodEventTime` to write on `claim` for a pod event at `at`, if any.
pub fn pod_event_update(claim: &NodeClaim, at: Timestamp) -> Option<Timestamp> {
    let last =
        claim.status.as_ref().and_then(|s| s.last_pod_event_time.as_deref()).and_then(|t| t.parse().ok());
    match last {
        Some(last) if at.duration_since(last) < POD_EVENT_DEDUPE => None,
        _ => Some(at),
    }
}

/// Whether a claim that becomes consolidatable `at` should carry `Consolidatable=True` at `now`,
/// and when to look again if not.
pub fn consolidatable(at: Option<Timestamp>, now: Timestamp) -> (bool, Option<Timestamp>) {
    match at {
        Some(at) if at <= now => (true, None),
        Some(at) => (false, Some(at)),
        None => (false, None),
    }
}

/// What a status write must find unchanged on the claim.
#[derive(Debug, PartialEq, Eq)]
enum Guard {
    /// The version that was read: the write replaces the conditions whole.
    Version,
    /// Nothing: the write sets `lastPodEventTime` alone, which no other writer sets, so a write
    /// of another controller meanwhile (the lifecycle's, as pods land on a node that has just
    /// initialized) does not refuse it, as upstream's writes of it are not refused.
    Nothing,
}

/// The status fields to write, from the conditions the claim had (`before`) to `status`, and what
/// the write must find unchanged.
fn status_write(before: &[Condition], status: &NodeClaimStatus) -> (serde_json::Value, Guard) {
    let mut written = json!({});
    if let Some(t) = &status.last_pod_event_time {
        written["lastPodEventTime"] = json!(t);
    }
    if status.conditions.as_slice() == before {
        return (written, Guard::Nothing);
    }
    written["conditions"] = json!(status.conditions);
    (written, Guard::Version)
}

async fn pass(ctx: &Context, state: &ClusterState, pending: &Mutex<HashMap<String, Timestamp>>) -> Next {
    // Pod events by NodeClaim name.
    let mut events: HashMap<String, Timestamp> = HashMap::new();
    {
        let mut pending = pending.lock().unwrap_or_else(PoisonError::into_inner);
        for (node, at) in state.index.take_pod_events() {
            let entry = pending.entry(node).or_insert(at);
            *entry = (*entry).max(at);
        }
        for (node, at) in pending.drain() {
            let claim = state
                .node(&node)
                .and_then(|n| n.spec.as_ref()?.provider_id.clone())
                .and_then(|pid| state.nodeclaim_with_provider_id(&pid));
            if let Some(name) = claim.and_then(|c| c.metadata.name.clone()) {
                events.insert(name, at);
            }
        }
    }
    let now = Timestamp::now();
    let mut next = PERIOD;
    // One claim at a time, each as the cache has it when its turn comes: a pass writes to many
    // claims one after the other, and holding them all meanwhile would keep alive the versions
    // the watch replaced them with.
    let names: Vec<String> =
        state.nodeclaims.state().iter().filter_map(|c| c.metadata.name.clone()).collect();
    for name in names {
        let Some(claim) = state.nodeclaim(&name) else { continue };
        if claim.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let mut status = claim.status.clone().unwrap_or_default();
        let mut changed = false;
        if let Some(at) = events.get(&name).and_then(|at| pod_event_update(&claim, *at)) {
            status.last_pod_event_time = Some(at.to_string());
            changed = true;
        }
        let pool = claim.labels().get(LABEL_NODEPOOL).and_then(|p| state.nodepool(p));
        // The claim as it will be, copied only when this pass changes it.
        let with_status = changed.then(|| NodeClaim { status: Some(status.clone()), ..(*claim).clone() });
        let at =
            pool.as_deref().and_then(|p| claim_consolidatable_at(with_status.as_ref().unwrap_or(&claim), p));
        let (want, recheck) = consolidatable(at, now);
        if let Some(recheck) = recheck {
            let wait = Duration::try_from(recheck.duration_since(now)).unwrap_or_default();
            next = next.min(wait.max(Duration::from_secs(1)));
        }
        if want != is_true(&status.conditions, CONSOLIDATABLE) {
            if want {
                set_condition(
                    &mut status.conditions,
                    CONSOLIDATABLE,
                    ConditionUpdate::true_(CONSOLIDATABLE),
                    claim.metadata.generation,
                    now,
                );
            } else {
                remove_condition(&mut status.conditions, CONSOLIDATABLE);
            }
            changed = true;
        }
        if !changed {
            continue;
        }
        let before = claim.status.as_ref().map(|s| s.conditions.as_slice()).unwrap_or_default();
        let result = match status_write(before, &status) {
            (written, Guard::Version) => write_status(&ctx.client, &claim, written).await,
            (written, Guard::Nothing) => merge_status(&ctx.client, &claim, written).await,
        };
        match result {
            Ok(Written::Done) => {}
            // Gone or changed meanwhile: the watch brings the new version and another pass.
            Ok(Written::Gone | Written::Changed) => {
                if let Some(at) = events.get(&name) {
                    let node = claim.status.as_ref().and_then(|s| s.node_name.clone()).unwrap_or_default();
                    if !node.is_empty() {
                        pending.lock().unwrap_or_else(PoisonError::into_inner).insert(node, *at);
                    }
                }
                next = next.min(COALESCE);
            }
            Err(e) => {
                tracing::warn!(controller = CONTROLLER, NodeClaim = %name, error = %error_chain(&e), "updating the nodeclaim's consolidatable state");
            }
        }
    }
    Next::After(next)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim(last: Option<&str>) -> NodeClaim {
        serde_json::from_value(json!({
            "metadata": {"name": "c"},
            "spec": {"nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "c"}, "requirements": []},
            "status": {"lastPodEventTime": last}
        }))
        .unwrap()
    }

    #[test]
    fn a_pod_event_alone_is_written_whatever_the_version_and_conditions_only_on_it()
    -> Result<(), Box<dyn std::error::Error>> {
        let now = "2026-11-24T12:00:00Z".parse::<Timestamp>()?;
        let mut status = claim(Some("2026-11-24T12:00:00Z")).status.ok_or("the claim has a status")?;
        let before = status.conditions.clone();
        let (written, guard) = status_write(&before, &status);
        assert_eq!(guard, Guard::Nothing);
        assert_eq!(written, json!({"lastPodEventTime": "2026-11-24T12:00:00Z"}));
        set_condition(
            &mut status.conditions,
            CONSOLIDATABLE,
            ConditionUpdate::true_(CONSOLIDATABLE),
            None,
            now,
        );
        let (written, guard) = status_write(&before, &status);
        assert_eq!(guard, Guard::Version);
        assert_eq!(written["lastPodEventTime"], "2026-11-24T12:00:00Z");
        assert_eq!(written["conditions"][0]["type"], CONSOLIDATABLE);
        Ok(())
    }

    #[test]
    fn pod_events_are_written_at_most_every_ten_seconds() {
        let t = |s: &str| s.parse::<Timestamp>().unwrap();
        assert_eq!(
            pod_event_update(&claim(None), t("2026-11-24T12:00:00Z")),
            Some(t("2026-11-24T12:00:00Z"))
        );
        let c = claim(Some("2026-11-24T12:00:00Z"));
        assert_eq!(pod_event_update(&c, t("2026-11-24T12:00:09Z")), None);
        assert_eq!(pod_event_update(&c, t("2026-11-24T12:00:10Z")), Some(t("2026-11-24T12:00:10Z")));
    }

    #[test]
    fn consolidatable_once_the_time_has_come() {
        let t = |s: &str| s.parse::<Timestamp>().unwrap();
        let now = t("2026-11-24T12:00:00Z");
        assert_eq!(consolidatable(Some(t("2026-11-24T11:59:00Z")), now), (true, None));
        assert_eq!(
            consolidatable(Some(t("2026-11-24T12:01:00Z")), now),
            (false, Some(t("2026-11-24T12:01:00Z")))
        );
        assert_eq!(consolidatable(None, now), (false, None));
    }
}

//! Expiration: a NodeClaim lives at most its `spec.expireAfter` (copied from its NodePool's
//! template; default `720h`, `Never` for no limit). At `creationTimestamp + expireAfter` it is
//! deleted, as upstream does: forcefully, with no disruption budget and no replacement launched
//! first (the provisioner replaces its pods as they become pending). The drain that follows
//! honours PodDisruptionBudgets and do-not-disrupt pods until the claim's
//! `terminationGracePeriod`, if it has one, runs out; a node's longest life is therefore
//! `expireAfter + terminationGracePeriod`.
//!
//! One singleton pass over the cached NodeClaims, woken by NodeClaim changes and at the next
//! expiry. A claim whose `expireAfter` does not parse is left alone and logged with its name.

use std::time::Duration;

use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::ResourceExt;
use tokio::sync::watch;

use crate::apis::NodeClaim;
use crate::controllers::Context;
use crate::controllers::kit::count_disrupted;
use crate::controllers::kit::{Coalesced, Next, Options, run_singleton};
use crate::state::{ClusterState, Interest};
use crate::util::error_chain;
use crate::util::parse_duration;

/// Name of the controller, in logs and metrics.
pub const CONTROLLER: &str = "nodeclaim.expiration";
/// Longest wait between passes.
const PERIOD: Duration = Duration::from_secs(300);
/// Changes within this time of each other are handled in one pass.
const COALESCE: Duration = Duration::from_secs(1);
/// The `reason` of `karpenter_nodeclaims_disrupted_total` for an expired claim.
pub const REASON: &str = "expired";

/// Runs until `stop` turns true.
pub async fn run(ctx: Context, state: ClusterState, stop: watch::Receiver<bool>) {
    let interest = Interest { nodeclaims: true, ..Interest::default() };
    let wake = Coalesced { changes: state.feed().subscribe(interest), settle: COALESCE };
    run_singleton(Options::new(CONTROLLER), Some(ctx.metrics.clone()), wake, stop, || {
        let (ctx, state) = (ctx.clone(), state.clone());
        async move { Ok::<_, std::convert::Infallible>(pass(&ctx, &state).await) }
    })
    .await;
}

/// When `claim` expires: `None` for `expireAfter: Never` or a claim without a creation time; an
/// error naming the value when it does not parse.
pub fn expires_at(claim: &NodeClaim) -> Result<Option<Timestamp>, String> {
    let value = claim.spec.expire_after.trim();
    if value == "Never" {
        return Ok(None);
    }
    let after = parse_duration(value).map_err(|e| format!("spec.expireAfter: {e}"))?;
    let after = SignedDuration::try_from(after).map_err(|e| format!("spec.expireAfter {value:?}: {e}"))?;
    let Some(created) = claim.metadata.creation_timestamp.as_ref() else { return Ok(None) };
    created.0.checked_add(after).map(Some).map_err(|e| format!("spec.expireAfter {value:?}: {e}"))
}

/// The claims of `claims` to delete at `now` (expired and not being deleted), and how long until
/// the next one expires.
pub fn due<'a>(
    claims: impl IntoIterator<Item = &'a NodeClaim>,
    now: Timestamp,
) -> (Vec<&'a NodeClaim>, Option<Duration>) {
    let mut expired = Vec::new();
    let mut next: Option<Duration> = None;
    for claim in claims {
        if claim.metadata.deletion_timestamp.is_some() {
            continue;
        }
        match expires_at(claim) {
            Ok(Some(at)) if at <= now => expired.push(claim),
            Ok(Some(at)) => {
                let wait = Duration::try_from(at.duration_since(now)).unwrap_or_default();
                next = Some(next.map_or(wait, |n| n.min(wait)));
            }
            Ok(None) => {}
            Err(error) => {
                tracing::error!(controller = CONTROLLER, NodeClaim = %claim.name_any(), error = %error, "ignoring an invalid expireAfter");
            }
        }
    }
    (expired, next)
}

async fn pass(ctx: &Context, state: &ClusterState) -> Next {
    let claims = state.nodeclaims.state();
    let (expired, next) = due(claims.iter().map(|c| c.as_ref()), Timestamp::now());
    for claim in expired {
        let name = claim.name_any();
        // Only this version: a claim replaced by another of the same name is not expired.
        match super::delete(&ctx.client, claim).await {
            Ok(true) => {
                tracing::info!(controller = CONTROLLER, NodeClaim = %name, expire_after = %claim.spec.expire_after, "deleting expired nodeclaim");
                count_disrupted(&ctx.metrics, claim, REASON);
            }
            Ok(false) => {}
            Err(error) => {
                tracing::error!(controller = CONTROLLER, NodeClaim = %name, error = %error_chain(&error), "deleting expired nodeclaim");
                return Next::After(Duration::from_secs(10));
            }
        }
    }
    Next::After(next.map_or(PERIOD, |n| n.min(PERIOD)).max(Duration::from_secs(1)))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn claim(name: &str, created: &str, expire_after: Option<&str>, deleting: bool) -> NodeClaim {
        let mut v = json!({"apiVersion": "karpenter.sh/v1", "kind": "NodeClaim",
            "metadata": {"name": name, "creationTimestamp": created},
            "spec": {"nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "default"},
                "requirements": []}});
        if let Some(e) = expire_after {
            v["spec"]["expireAfter"] = json!(e);
        }
        if deleting {
            v["metadata"]["deletionTimestamp"] = json!("2026-11-24T12:00:00Z");
        }
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn claims_expire_at_creation_plus_expire_after() {
        let c = claim("a", "2026-11-24T10:00:00Z", Some("2h"), false);
        assert_eq!(expires_at(&c).unwrap(), Some("2026-11-24T12:00:00Z".parse().unwrap()));
        // The default is 720h (30 days).
        let d = claim("d", "2026-11-01T00:00:00Z", None, false);
        assert_eq!(expires_at(&d).unwrap(), Some("2026-12-01T00:00:00Z".parse().unwrap()));
        assert_eq!(expires_at(&claim("n", "2026-11-01T00:00:00Z", Some("Never"), false)).unwrap(), None);
        assert!(
            expires_at(&claim("x", "2026-11-01T00:00:00Z", Some("soon"), false))
                .unwrap_err()
                .contains("soon")
        );
    }

    #[test]
    fn only_expired_claims_not_being_deleted_are_due() {
        let now: Timestamp = "2026-11-24T12:00:00Z".parse().unwrap();
        let claims = [
            claim("old", "2026-11-24T10:00:00Z", Some("1h"), false),
            claim("going", "2026-11-24T10:00:00Z", Some("1h"), true),
            claim("young", "2026-11-24T11:50:00Z", Some("15m"), false),
            claim("later", "2026-11-24T11:00:00Z", Some("2h"), false),
            claim("bad", "2026-11-24T10:00:00Z", Some("1d"), false),
            claim("never", "2026-01-01T00:00:00Z", Some("Never"), false),
        ];
        let (expired, next) = due(claims.iter(), now);
        let names: Vec<String> = expired.iter().map(|c| c.name_any()).collect();
        assert_eq!(names, ["old"]);
        assert_eq!(next, Some(Duration::from_secs(5 * 60)), "the young one, in five minutes");
    }
}

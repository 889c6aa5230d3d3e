//! Controllers of NodeClaims: their lifecycle from launch to finalization, drift marking, the
//! consolidatable state disruption reads, expiration, and the garbage collection of instances no
//! NodeClaim accounts for.
//!
//! This module also holds the writes every controller makes to a NodeClaim it did not just read
//! from the API server: deleting this very claim ([`delete`]), its termination deadline, and its
//! status ([`write_status`], [`write_conditions`], [`merge_status`]). Each carries what it was
//! computed from (the uid or the resourceVersion), so a claim gone or changed meanwhile is told
//! apart from a failure; [`merge_status`] alone writes whatever the version, the fields that no
//! other writer sets.
//! Conditions are read and computed with [`crate::apis::common`]'s helpers and
//! [`NodeClaim::condition`].

pub mod consolidatable;
pub mod drift;
pub mod expiration;
pub mod garbagecollection;
pub mod lifecycle;

use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, Patch, PatchParams, Preconditions};
use kube::{Api, Client, ResourceExt};
use serde_json::json;

use crate::apis::labels::ANNOTATION_NODECLAIM_TERMINATION_TIMESTAMP;
use crate::apis::{Condition, NodeClaim};
use crate::util::api::{is_conflict, is_not_found, is_stale};

/// Deletes this very NodeClaim: the uid precondition makes the call fail rather than delete a
/// claim of the same name made since. `Ok(true)` when the API server took the deletion,
/// `Ok(false)` when the claim is gone or its name now belongs to another claim. The expiration,
/// repair and interruption controllers delete through here.
pub async fn delete(client: &Client, claim: &NodeClaim) -> Result<bool, kube::Error> {
    let params = DeleteParams {
        preconditions: claim.uid().map(|uid| Preconditions { uid: Some(uid), resource_version: None }),
        ..DeleteParams::default()
    };
    match Api::<NodeClaim>::all(client.clone()).delete(&claim.name_any(), &params).await {
        Ok(_) => Ok(true),
        Err(e) if is_stale(&e) => Ok(false),
        Err(error) => Err(error),
    }
}

/// Sets the claim's `karpenter.sh/nodeclaim-termination-timestamp` to `at` (whole seconds), so
/// that its drain stops waiting for PodDisruptionBudgets and do-not-disrupt pods at that time.
/// Call it after [`delete`]: a deadline written on a claim whose deletion then failed would let a
/// later ordinary disruption of it skip its budgets. `Ok(false)` when the claim is gone or is
/// another claim now.
pub async fn set_termination_deadline(
    client: &Client,
    controller: &'static str,
    claim: &NodeClaim,
    at: Timestamp,
) -> Result<bool, kube::Error> {
    let deadline = crate::apis::common::transition_time(at);
    // The uid makes the write fail rather than annotate a claim of the same name made since.
    let patch = json!({"metadata": {"uid": claim.uid(), "annotations": {ANNOTATION_NODECLAIM_TERMINATION_TIMESTAMP: deadline}}});
    let api = Api::<NodeClaim>::all(client.clone());
    match api.patch(&claim.name_any(), &PatchParams::default(), &Patch::Merge(&patch)).await {
        Ok(_) => {
            tracing::info!(controller, NodeClaim = %claim.name_any(), "karpenter.sh/nodeclaim-termination-timestamp" = %deadline, "annotated nodeclaim");
            Ok(true)
        }
        Err(e) if is_stale(&e) || matches!(&e, kube::Error::Api(s) if s.code == 422) => Ok(false),
        Err(error) => Err(error),
    }
}

/// What became of a status write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Written {
    /// The API server took it.
    Done,
    /// The NodeClaim is gone.
    Gone,
    /// The NodeClaim changed since it was read (another writer): the write was refused, and the
    /// next look at the new version decides again.
    Changed,
}

/// Merges `status` (a JSON object of NodeClaim status fields) into `claim`'s status, on the
/// condition that the claim is still the version that was read.
pub async fn write_status(
    client: &Client,
    claim: &NodeClaim,
    status: serde_json::Value,
) -> Result<Written, kube::Error> {
    patch_status(client, claim, json!({"resourceVersion": claim.resource_version()}), status).await
}

/// Merges `status` fields that no writer replaces whole (scalars such as `lastPodEventTime`,
/// never the conditions) into the status of the claim of `claim`'s name, whatever its version: a
/// write of another controller since `claim` was read does not refuse it, as it would
/// [`write_status`], and neither write undoes the other. (The API server takes no uid
/// precondition on a status write: a claim made again under the same name meanwhile gets it too.)
pub async fn merge_status(
    client: &Client,
    claim: &NodeClaim,
    status: serde_json::Value,
) -> Result<Written, kube::Error> {
    patch_status(client, claim, json!({}), status).await
}

/// A merge patch of `status` on `claim`, with `guard` (metadata fields the claim must still have).
async fn patch_status(
    client: &Client,
    claim: &NodeClaim,
    guard: serde_json::Value,
    status: serde_json::Value,
) -> Result<Written, kube::Error> {
    let patch = json!({"metadata": guard, "status": status});
    let api = Api::<NodeClaim>::all(client.clone());
    match api.patch_status(&claim.name_any(), &PatchParams::default(), &Patch::Merge(&patch)).await {
        Ok(_) => Ok(Written::Done),
        Err(e) if is_not_found(&e) => Ok(Written::Gone),
        Err(e) if is_conflict(&e) => Ok(Written::Changed),
        Err(error) => Err(error),
    }
}

/// Writes `conditions` as `claim`'s status conditions (see [`write_status`]).
pub async fn write_conditions(
    client: &Client,
    claim: &NodeClaim,
    conditions: &[Condition],
) -> Result<Written, kube::Error> {
    write_status(client, claim, json!({"conditions": conditions})).await
}
